/*
 * test_send_receive.c - records sent with prosody_send() arrive intact:
 * key, JSON payload, source-system header (explicit, and defaulting to the
 * group id), W3C trace headers, per-key order; on the mock cluster a topic
 * is created on first use; a fresh client's first send fits the default
 * 1 s send_timeout (librdkafka 2.0.2 can otherwise wait for its 1 s topic
 * scan before asking for the topic's metadata).
 */
#include "harness.h"

#define N 60
#define FRESH 15

T_SCENARIO(records_arrive_intact_with_headers_in_key_order, T_BOTH, 60) {
  char err[1024], hdr[256];
  const char *topic = t_topic("send-receive");
  prosody_config_t *conf = t_config();
  prosody_client_t *client;
  t_record_t recs[N + 2];
  int got, per_key_seen[6] = {0};
  int32_t key_part[6];
  int64_t key_off[6];

  t_create_topic(topic, 3);
  t_set(conf, "source_system", "test-source");
  t_set(conf, "group_id", "test-group");
  client = prosody_client_new(conf, err, sizeof(err));
  CHECK(client, "client: %s", err);
  CHECK(!strcmp(prosody_client_source_system(client), "test-source"),
        "source system is %s", prosody_client_source_system(client));

  for (int i = 0; i < N; i++) {
    char key[16], payload[128];
    snprintf(key, sizeof(key), "key-%d", i % 6);
    snprintf(payload, sizeof(payload),
             "{\"id\":\"m%d\",\"type\":\"test.sent\",\"seq\":%d,\"k\":%d}", i,
             i, i % 6);
    CHECK_OK(prosody_send(client, topic, key, payload, NULL, err, sizeof(err)),
             err);
  }
  {
    prosody_trace_t tr = {
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "vendor=abc",
        "user=42"};
    CHECK_OK(
        prosody_send(client, topic, "traced", "[1,2,3]", &tr, err, sizeof(err)),
        err);
  }
  prosody_client_destroy(client);

  /* A client without source_system tags records with its group id. */
  conf = t_config();
  t_set(conf, "group_id", "only-group");
  client = prosody_client_new(conf, err, sizeof(err));
  CHECK(client, "client: %s", err);
  CHECK_OK(prosody_send(client, topic, "grouped", "\"just a string\"", NULL,
                        err, sizeof(err)),
           err);
  prosody_client_destroy(client);

  got = t_read_back(topic, N + 2, 30, recs);
  CHECK(got == N + 2, "read %d of %d records", got, N + 2);

  for (int i = 0; i < 6; i++)
    key_part[i] = -1, key_off[i] = -1;
  for (int i = 0; i < got; i++) {
    t_record_t *r = &recs[i];
    if (!strcmp(r->key, "traced")) {
      CHECK(!strcmp(r->value, "[1,2,3]"), "payload %s", r->value);
      CHECK(t_header(r, "traceparent", hdr, sizeof(hdr)) &&
                !strcmp(
                    hdr,
                    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            "traceparent missing or wrong");
      CHECK(t_header(r, "tracestate", hdr, sizeof(hdr)) &&
                !strcmp(hdr, "vendor=abc"),
            "tracestate missing");
      CHECK(t_header(r, "baggage", hdr, sizeof(hdr)) && !strcmp(hdr, "user=42"),
            "baggage missing");
      CHECK(t_header(r, "source-system", hdr, sizeof(hdr)) &&
                !strcmp(hdr, "test-source"),
            "source-system on traced record");
      /* In the original Prosody's order: its propagators write baggage,
       * then traceparent and tracestate, after source-system. */
      {
        static const char *const names[] = {"source-system", "baggage",
                                            "traceparent", "tracestate"};
        const char *name;
        const void *v;
        size_t len, n = 0;
        while (!rd_kafka_header_get_all(r->headers, n, &name, &v, &len)) {
          CHECK(n < 4 && !strcmp(name, names[n]), "header %zu is %s", n, name);
          n++;
        }
        CHECK(n == 4, "%zu headers on the traced record, want 4", n);
      }
      continue;
    }
    if (!strcmp(r->key, "grouped")) {
      CHECK(t_header(r, "source-system", hdr, sizeof(hdr)) &&
                !strcmp(hdr, "only-group"),
            "source-system should default to the group id, got %s",
            t_header(r, "source-system", hdr, sizeof(hdr)));
      CHECK(!t_header(r, "traceparent", hdr, sizeof(hdr)),
            "no traceparent expected");
      continue;
    }
    {
      int seq, k;
      char want[128];
      CHECK(sscanf(r->value,
                   "{\"id\":\"m%*d\",\"type\":\"test.sent\","
                   "\"seq\":%d,\"k\":%d}",
                   &seq, &k) == 2,
            "payload %s", r->value);
      snprintf(want, sizeof(want), "key-%d", k);
      CHECK(!strcmp(r->key, want), "key %s for payload %s", r->key, r->value);
      CHECK(t_header(r, "source-system", hdr, sizeof(hdr)) &&
                !strcmp(hdr, "test-source"),
            "source-system header");
      /* Per key: one partition, offsets rising with the sequence. */
      CHECK(key_part[k] == -1 || key_part[k] == r->partition,
            "key %s in partitions %d and %d", r->key, key_part[k],
            r->partition);
      key_part[k] = r->partition;
      (void)key_off;
      per_key_seen[k]++;
    }
  }
  /* Within one partition the reader returns offsets in order, so checking
   * the sequence order per key checks the stored order. */
  {
    int last_seq[6] = {-1, -1, -1, -1, -1, -1};
    for (int i = 0; i < got; i++) {
      int seq, k;
      if (sscanf(recs[i].value,
                 "{\"id\":\"m%*d\",\"type\":\"test.sent\","
                 "\"seq\":%d,\"k\":%d}",
                 &seq, &k) != 2)
        continue;
      CHECK(seq > last_seq[k], "key-%d: seq %d stored after %d", k, seq,
            last_seq[k]);
      last_seq[k] = seq;
    }
  }
  for (int k = 0; k < 6; k++)
    CHECK(per_key_seen[k] == N / 6, "key-%d: %d records", k, per_key_seen[k]);
  t_records_free(recs, got);

  printf("ok: %d records round-tripped\n", got);
  return 0;
}

T_SCENARIO(fresh_client_first_send_within_default_timeout, T_BOTH, 60) {
  char err[1024];
  const char *topic = t_topic("send-fresh");
  prosody_config_t *conf;
  prosody_client_t *client;
  t_record_t recs[FRESH + 1];
  int64_t total_ms = 0;

  t_create_topic(topic, 3);
  /* A broker that has just started answers the first idempotent producer's
   * InitProducerId with "coordinator load in progress" and makes it retry:
   * that is the broker warming up, not the send path measured below. One
   * untimed send takes the broker past it. */
  conf = t_config();
  t_set(conf, "source_system", "fresh");
  client = prosody_client_new(conf, err, sizeof(err));
  CHECK(client, "client: %s", err);
  CHECK_OK(prosody_send(client, topic, "warm", "{\"id\":\"w\"}", NULL, err,
                        sizeof(err)),
           err);
  prosody_client_destroy(client);
  /* Fresh clients: every first send is delivered, also when the client
   * sat idle (connected, no topic known) first. Such a send used to wait
   * for librdkafka's 1 s topic scan, up to a second each: FRESH of them
   * then took about FRESH / 2 s together, against tens of milliseconds
   * now. The bound is on their sum, with room for a loaded machine (a
   * single slow send does not fail it; the old wait would, nearly
   * always). */
  for (int i = 0; i < FRESH; i++) {
    struct timespec t0, t1;
    int64_t ms;
    conf = t_config();
    t_set(conf, "source_system", "fresh");
    t_set(conf, "send_timeout", "10s");
    client = prosody_client_new(conf, err, sizeof(err));
    CHECK(client, "client: %s", err);
    if (i % 2)
      usleep(100 * 1000); /* a client created at start-up, used later */
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CHECK_OK(prosody_send(client, topic, "fresh", "{\"id\":\"f\"}", NULL, err,
                          sizeof(err)),
             err);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    ms = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
    total_ms += ms;
    prosody_client_destroy(client);
  }
  CHECK(total_ms < FRESH * 1000 / 3,
        "%d fresh clients' first sends took %lld ms together", FRESH,
        (long long)total_ms);

  CHECK(t_read_back(topic, FRESH + 1, 30, recs) == FRESH + 1,
        "fresh clients' records missing");
  t_records_free(recs, FRESH + 1);
  return 0;
}

/* Mock only: sending to a topic nobody created creates it. */
T_SCENARIO(first_send_creates_topic, T_MOCK, 60) {
  char err[1024];
  const char *fresh = t_topic("first-use");
  t_record_t one[1];
  prosody_config_t *conf = t_config();
  prosody_client_t *client;
  t_set(conf, "source_system", "s");
  client = prosody_client_new(conf, err, sizeof(err));
  CHECK(client, "client: %s", err);
  CHECK_OK(prosody_send(client, fresh, "k", "{}", NULL, err, sizeof(err)), err);
  prosody_client_destroy(client);
  CHECK(t_read_back(fresh, 1, 20, one) == 1, "first-use topic record");
  t_records_free(one, 1);
  return 0;
}
