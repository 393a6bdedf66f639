/*
 * test_send_async.c - prosody_send_async() calls its callback exactly once
 * per accepted record (never for a rejected one), from another thread, with
 * the record's partition and offset; destroying the client delivers what
 * is outstanding before it returns.
 */
#include <pthread.h>
#include <stdatomic.h>

#include "harness.h"

#define N 2000

static atomic_int calls[N];
static int32_t partition_of[N];
static int64_t offset_of[N];
static atomic_int total, failures;
static pthread_t main_thread;
static atomic_int on_main_thread;

static void on_delivery(prosody_err_t err, const char *errstr,
                        const prosody_delivery_t *d, void *opaque) {
  int i = (int)(intptr_t)opaque;
  if (pthread_equal(pthread_self(), main_thread))
    atomic_store(&on_main_thread, 1);
  if (err || !d) {
    atomic_fetch_add(&failures, 1);
  } else {
    partition_of[i] = d->partition;
    offset_of[i] = d->offset;
  }
  atomic_fetch_add(&calls[i], 1);
  atomic_fetch_add(&total, 1);
}

static void never_called(prosody_err_t err, const char *errstr,
                         const prosody_delivery_t *d, void *opaque) {
  atomic_fetch_add(&total, 1000000);
}

T_SCENARIO(callback_once_per_record_off_caller_thread_with_offset, T_BOTH, 60) {
  char err[1024];
  const char *topic = t_topic("send-async");
  prosody_config_t *conf = t_config();
  prosody_client_t *client;
  t_record_t *recs = calloc(N, sizeof(*recs));
  int got;

  main_thread = pthread_self();
  t_create_topic(topic, 4);
  t_set(conf, "group_id", "async-group");
  client = prosody_client_new(conf, err, sizeof(err));
  CHECK(client, "client: %s", err);

  for (int i = 0; i < N; i++) {
    char key[16], payload[64];
    snprintf(key, sizeof(key), "k%d", i % 97);
    snprintf(payload, sizeof(payload), "{\"i\":%d}", i);
    CHECK_OK(prosody_send_async(client, topic, key, payload, NULL, on_delivery,
                                (void *)(intptr_t)i, err, sizeof(err)),
             err);
  }
  /* Rejected records never reach the callback. */
  CHECK(prosody_send_async(client, topic, "k", "{not json", NULL, never_called,
                           NULL, err,
                           sizeof(err)) == PROSODY_ERR_INVALID_PAYLOAD,
        "invalid JSON accepted");
  CHECK(prosody_send_async(client, topic, "k", "{}", NULL, NULL, NULL, err,
                           sizeof(err)) == PROSODY_ERR_INVALID_ARG,
        "NULL callback accepted");

  /* Destroy waits for every outstanding report. */
  prosody_client_destroy(client);
  CHECK(atomic_load(&total) == N, "%d callbacks for %d records",
        atomic_load(&total), N);
  CHECK(atomic_load(&failures) == 0, "%d failed deliveries",
        atomic_load(&failures));
  CHECK(!atomic_load(&on_main_thread), "callback ran on the caller's thread");
  for (int i = 0; i < N; i++)
    CHECK(atomic_load(&calls[i]) == 1, "record %d: %d callbacks", i,
          atomic_load(&calls[i]));

  /* The offsets reported are where the records are. */
  got = t_read_back(topic, N, 30, recs);
  CHECK(got == N, "read back %d of %d", got, N);
  for (int r = 0; r < got; r++) {
    int i;
    CHECK(sscanf(recs[r].value, "{\"i\":%d}", &i) == 1 && i >= 0 && i < N,
          "payload %s", recs[r].value);
    CHECK(
        partition_of[i] == recs[r].partition && offset_of[i] == recs[r].offset,
        "record %d reported at %d/%lld, stored at %d/%lld", i, partition_of[i],
        (long long)offset_of[i], recs[r].partition, (long long)recs[r].offset);
  }
  t_records_free(recs, got);
  free(recs);
  printf("ok: %d callbacks, each exactly once\n", N);
  return 0;
}
