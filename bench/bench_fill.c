/*
 * bench_fill.c - fills an existing topic on a real broker with the
 * benchmarks' kind of record, for bench/python/bench_python.py: N keyed
 * JSON records, keys key-0000..key-0999 (uniform: record i gets key
 * (i * 7919) mod 1000, as in bench_consume), ~110-byte JSON object
 * payloads with a unique `id` and `type`, sent with prosody_send_async()
 * and waited for until every record is acknowledged.
 *
 *   bench_fill BOOTSTRAP TOPIC N [ID_PREFIX]
 *
 * ID_PREFIX (default: TOPIC) starts every payload's `id`, so records of
 * different runs never share an id (the original Python package
 * deduplicates by key and `id`, in memory and in Cassandra).
 * Prints "filled N records in S s (R records/s)" on stderr.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "prosody.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static atomic_long acked;
static void on_sent(prosody_err_t err, const char *errstr,
                    const prosody_delivery_t *d, void *op) {
  if (err) {
    fprintf(stderr, "bench_fill: delivery failed: %s\n", errstr);
    exit(1);
  }
  atomic_fetch_add(&acked, 1);
}

int main(int argc, char **argv) {
  char err[1024], key[32], buf[256];
  prosody_config_t *conf;
  prosody_client_t *c;
  const char *prefix;
  long n;
  double t0, t;
  if (argc < 4 || (n = atol(argv[3])) < 1) {
    fprintf(stderr, "usage: bench_fill BOOTSTRAP TOPIC N [ID_PREFIX]\n");
    return 2;
  }
  prefix = argc > 4 ? argv[4] : argv[2];
  conf = prosody_config_new();
  bench_set(conf, "bootstrap_servers", argv[1]);
  bench_set(conf, "log", "warn");
  c = bench_producer(conf);
  t0 = now_s();
  for (long i = 0; i < n; i++) {
    snprintf(key, sizeof(key), "key-%04ld", (i * 7919) % 1000);
    snprintf(buf, sizeof(buf),
             "{\"id\":\"%s-%010ld\",\"type\":\"order.created\",\"amount\":"
             "%ld.%02ld,\"customer\":\"%s\"}",
             prefix, i, (i * 31) % 1000, i % 100, key);
    if (prosody_send_async(c, argv[2], key, buf, NULL, on_sent, NULL, err,
                           sizeof(err))) {
      fprintf(stderr, "bench_fill: send: %s\n", err);
      return 1;
    }
  }
  while (atomic_load(&acked) < n)
    usleep(1000);
  t = now_s() - t0;
  prosody_client_destroy(c);
  fprintf(stderr, "filled %ld records in %.1f s (%.0f records/s)\n", n, t,
          (double)n / t);
  return 0;
}
