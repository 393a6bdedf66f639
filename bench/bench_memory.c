/*
 * bench_memory.c - resident memory per in-flight key, against a raw
 * librdkafka consumer holding the same records, in the same run.
 *
 *   bench_memory [keys] [prosody|raw]
 *
 * `keys` records (one per key, ~100 bytes of JSON) are produced to the
 * embedded mock cluster. Prosody consumes them with an asynchronous
 * handler that keeps every event pending, so all keys are in flight at
 * once (max_concurrency and max_uncommitted raised to allow it); the
 * resident set is read from /proc/self/status before the consumer starts
 * and once every key is in flight. The baseline is a plain consumer that
 * polls the same records and keeps every rd_kafka_message_t alive. Each
 * side runs in its own process (a freed heap would flatter the second);
 * bench/run.sh computes ratio = prosody / raw. Reported: MiB per 10 000
 * in-flight keys.
 */
#include <librdkafka/rdkafka.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "prosody.h"

static void produce(const char *topic, long n) {
  char err[512], key[32], buf[200];
  prosody_config_t *conf = prosody_config_new();
  prosody_client_t *c;
  bench_set(conf, "mock", "true");
  c = bench_producer(conf);
  for (long i = 0; i < n; i++) {
    snprintf(key, sizeof(key), "key-%06ld", i);
    bench_order_json(buf, sizeof(buf), i, key);
    if (prosody_send(c, topic, key, buf, NULL, err, sizeof(err))) {
      fprintf(stderr, "bench_memory: send: %s\n", err);
      exit(1);
    }
  }
  prosody_client_destroy(c);
}

static double raw_mib(const char *bootstrap, const char *topic, long n) {
  rd_kafka_message_t **held = calloc((size_t)n, sizeof(*held));
  rd_kafka_t *rk = bench_raw_consumer(bootstrap, "bench-memory-raw", topic);
  long got = 0, before = bench_rss_kib(), after;
  while (got < n) {
    rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
    if (!m)
      continue;
    if (m->err) {
      rd_kafka_message_destroy(m);
      continue;
    }
    held[got++] = m;
  }
  after = bench_rss_kib();
  for (long i = 0; i < n; i++)
    rd_kafka_message_destroy(held[i]);
  free(held);
  rd_kafka_consumer_close(rk);
  rd_kafka_destroy(rk);
  return (double)(after - before) / 1024.0;
}

/* The asynchronous handler keeps every context; the main thread completes
 * them all once it has measured. Called on the engine thread only. */
static prosody_context_t **pending;
static atomic_long npending;
static prosody_result_t hold(prosody_context_t *ctx, const prosody_message_t *m,
                             void *op) {
  (void)m;
  (void)op;
  pending[atomic_load(&npending)] = ctx;
  atomic_fetch_add(&npending, 1);
  return PROSODY_PENDING;
}

static double prosody_mib(const char *topic, long n) {
  char err[512], num[32];
  prosody_config_t *conf = prosody_config_new();
  prosody_handler_t h = {hold, NULL, NULL, PROSODY_HANDLER_ASYNC};
  prosody_client_t *c;
  long before, after;
  pending = calloc((size_t)n, sizeof(*pending));
  bench_set(conf, "mock", "true");
  bench_set(conf, "group_id", "bench-memory-prosody");
  bench_set(conf, "subscribed_topics", topic);
  bench_set(conf, "log", "warn");
  snprintf(num, sizeof(num), "%ld", n);
  bench_set(conf, "max_concurrency", num);
  snprintf(num, sizeof(num), "%ld", n + 1);
  bench_set(conf, "max_uncommitted", num);
  before = bench_rss_kib();
  c = prosody_client_new(conf, err, sizeof(err));
  if (!c || prosody_subscribe(c, &h, err, sizeof(err))) {
    fprintf(stderr, "bench_memory: %s\n", err);
    exit(1);
  }
  while (atomic_load(&npending) < n)
    usleep(1000);
  after = bench_rss_kib();
  for (long i = 0; i < n; i++)
    prosody_complete(pending[i], PROSODY_SUCCESS, NULL);
  prosody_client_destroy(c);
  free(pending);
  return (double)(after - before) / 1024.0;
}

int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 10000;
  const char *who = argc > 2 ? argv[2] : "prosody";
  char bootstrap[256], err[512];
  const char *topic = "bench-memory";
  double mib;
  if (n < 1)
    return 2;
  prosody_mock_bootstrap_servers(bootstrap, sizeof(bootstrap), err,
                                 sizeof(err));
  produce(topic, n);
  if (!strcmp(who, "raw")) {
    mib = raw_mib(bootstrap, topic, n) * 10000.0 / (double)n;
    printf("bench memory-raw-per-10k-keys %.2f MiB ratio=1.000\n", mib);
  } else {
    mib = prosody_mib(topic, n) * 10000.0 / (double)n;
    printf("bench memory-per-10k-inflight-keys %.2f MiB\n", mib);
  }
  fprintf(stderr, "memory (%s): %ld keys in flight, %.2f MiB per 10 000\n", who,
          n, mib);
  return 0;
}
