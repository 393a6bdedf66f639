/*
 * test_producer_fatal.c - an idempotent producer's fatal error does not
 * lose records: the client replaces its librdkafka handle, re-sends what
 * was not acknowledged, and every accepted record's callback still fires
 * exactly once with success (librdkafka rule 7, docs/ARCHITECTURE.md).
 * Sends made while the handle is being replaced succeed too. Uses librdkafka's
 * rd_kafka_test_fatal_error() on the client's handle.
 */
#include <stdatomic.h>

#include "harness.h"
#include "kafka/kafka.h"

#define N 3000

static atomic_int calls[N];
static atomic_int ok, failed;

static void on_delivery(prosody_err_t err, const char *errstr,
                        const prosody_delivery_t *d, void *opaque) {
  int i = (int)(intptr_t)opaque;
  if (err) {
    atomic_fetch_add(&failed, 1);
    fprintf(stderr, "record %d failed: %s\n", i, errstr);
  } else {
    atomic_fetch_add(&ok, 1);
  }
  atomic_fetch_add(&calls[i], 1);
}

static void send_range(prosody_client_t *client, const char *topic, int from,
                       int to) {
  char err[1024], key[16], payload[64];
  for (int i = from; i < to; i++) {
    snprintf(key, sizeof(key), "k%d", i % 50);
    snprintf(payload, sizeof(payload), "{\"i\":%d}", i);
    CHECK_OK(prosody_send_async(client, topic, key, payload, NULL, on_delivery,
                                (void *)(intptr_t)i, err, sizeof(err)),
             err);
  }
}

T_SCENARIO(fatal_error_replaces_handle_and_loses_nothing, T_BOTH, 90) {
  char err[1024];
  const char *topic = t_topic("producer-fatal");
  prosody_config_t *conf = t_config();
  prosody_client_t *client;
  pr__producer_t *prod;
  t_record_t *recs = calloc(2 * N, sizeof(*recs));
  char *seen = calloc(N, 1);
  int got, distinct = 0;
  rd_kafka_resp_err_t kerr;

  t_create_topic(topic, 2);
  t_set(conf, "source_system", "fatal-test");
  client = prosody_client_new(conf, err, sizeof(err));
  CHECK(client, "client: %s", err);
  prod = pr__client_producer(client);

  send_range(client, topic, 0, N / 2);
  kerr = rd_kafka_test_fatal_error(
      pr__producer_handle(prod), RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER,
      "injected by test_producer_fatal");
  CHECK(!kerr, "could not inject a fatal error: %s", rd_kafka_err2str(kerr));
  send_range(client, topic, N / 2, N);
  /* A blocking send after the fatal error succeeds on the new handle. */
  CHECK_OK(prosody_send(client, topic, "after", "{\"after\":true}", NULL, err,
                        sizeof(err)),
           err);
  CHECK(pr__producer_recoveries(prod) == 1,
        "producer replaced %d times, want 1", pr__producer_recoveries(prod));
  prosody_client_destroy(client);

  CHECK(atomic_load(&failed) == 0, "%d records failed", atomic_load(&failed));
  CHECK(atomic_load(&ok) == N, "%d successes for %d records", atomic_load(&ok),
        N);
  for (int i = 0; i < N; i++)
    CHECK(atomic_load(&calls[i]) == 1, "record %d: %d callbacks", i,
          atomic_load(&calls[i]));

  /* Every record is on the topic (a re-sent one may be there twice, so
   * read again, longer, if the first N + 1 records were not all distinct). */
  got = t_read_back(topic, N + 1, 30, recs);
  for (int r = 0; r < got; r++) {
    int i;
    if (sscanf(recs[r].value, "{\"i\":%d}", &i) == 1 && i >= 0 && i < N &&
        !seen[i]) {
      seen[i] = 1;
      distinct++;
    }
  }
  if (distinct < N) {
    t_records_free(recs, got);
    got = t_read_back(topic, 2 * N, 10, recs);
    for (int r = 0; r < got; r++) {
      int i;
      if (sscanf(recs[r].value, "{\"i\":%d}", &i) == 1 && i >= 0 && i < N)
        seen[i] = 1;
    }
  }
  for (int i = 0; i < N; i++)
    CHECK(seen[i], "record %d is missing from the topic", i);
  /* Per key, first deliveries keep the send order (a re-sent record's
   * duplicate may follow later). */
  {
    int last[50];
    char *first = calloc(N, 1);
    for (int k = 0; k < 50; k++)
      last[k] = -1;
    for (int r = 0; r < got; r++) {
      int i;
      if (sscanf(recs[r].value, "{\"i\":%d}", &i) != 1 || i < 0 || i >= N ||
          first[i])
        continue;
      first[i] = 1;
      CHECK(i > last[i % 50], "key k%d: record %d stored after %d", i % 50, i,
            last[i % 50]);
      last[i % 50] = i;
    }
    free(first);
  }
  t_records_free(recs, got);
  free(recs);
  free(seen);
  printf("ok: %d records survived a fatal producer error\n", N);
  return 0;
}
