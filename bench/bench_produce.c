/*
 * bench_produce.c - producer throughput of prosody_send_async() against a
 * raw librdkafka producer with the same settings (idempotent, lz4, linger
 * 5 ms, same header), both sending the same ~100-byte JSON records to the
 * same embedded mock cluster in the same run. Reports the median of the
 * repetitions and ratio = prosody / raw.
 *
 *   bench_produce [messages] [repetitions]
 */
#include <librdkafka/rdkafka.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "prosody.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void payload(long i, char *key, size_t kn, char *buf, size_t n) {
  snprintf(key, kn, "key-%04ld", i % 1000);
  snprintf(buf, n,
           "{\"id\":\"evt-%010ld\",\"type\":\"order.created\",\"customer\":"
           "\"%s\",\"amount\":%ld.%02ld}",
           i, key, (i * 7919) % 100000, i % 100);
}

static atomic_long raw_done;
static void raw_dr(rd_kafka_t *rk, const rd_kafka_message_t *m, void *op) {
  if (m->err) {
    fprintf(stderr, "raw delivery failed: %s\n", rd_kafka_err2str(m->err));
    exit(1);
  }
  atomic_fetch_add(&raw_done, 1);
}

static double run_raw(const char *bootstrap, const char *topic, long n) {
  char err[512], key[32], buf[256];
  rd_kafka_conf_t *kc = rd_kafka_conf_new();
  rd_kafka_t *rk;
  double t0, t;
  rd_kafka_conf_set(kc, "bootstrap.servers", bootstrap, err, sizeof(err));
  rd_kafka_conf_set(kc, "enable.idempotence", "true", err, sizeof(err));
  rd_kafka_conf_set(kc, "compression.type", "lz4", err, sizeof(err));
  rd_kafka_conf_set(kc, "linger.ms", "5", err, sizeof(err));
  rd_kafka_conf_set(kc, "socket.nagle.disable", "true", err, sizeof(err));
  rd_kafka_conf_set_dr_msg_cb(kc, raw_dr);
  rk = rd_kafka_new(RD_KAFKA_PRODUCER, kc, err, sizeof(err));
  atomic_store(&raw_done, 0);
  t0 = now_s();
  for (long i = 0; i < n; i++) {
    rd_kafka_resp_err_t e;
    payload(i, key, sizeof(key), buf, sizeof(buf));
    for (;;) {
      rd_kafka_headers_t *h = rd_kafka_headers_new(1);
      rd_kafka_header_add(h, "source-system", -1, "bench", -1);
      e = rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(topic),
                            RD_KAFKA_V_KEY(key, strlen(key)),
                            RD_KAFKA_V_VALUE(buf, strlen(buf)),
                            RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                            RD_KAFKA_V_HEADERS(h), RD_KAFKA_V_END);
      if (!e)
        break;
      rd_kafka_headers_destroy(h);
      rd_kafka_poll(rk, 1);
    }
    rd_kafka_poll(rk, 0);
  }
  while (atomic_load(&raw_done) < n)
    rd_kafka_poll(rk, 10);
  t = now_s() - t0;
  rd_kafka_destroy(rk);
  return (double)n / t;
}

static atomic_long pr_done;
static void pr_dr(prosody_err_t err, const char *errstr,
                  const prosody_delivery_t *d, void *op) {
  if (err) {
    fprintf(stderr, "prosody delivery failed: %s\n", errstr);
    exit(1);
  }
  atomic_fetch_add(&pr_done, 1);
}

static double run_prosody(const char *topic, long n) {
  char err[1024], key[32], buf[256];
  prosody_config_t *conf = prosody_config_new();
  prosody_client_t *client;
  double t0, t;
  prosody_config_set(conf, "mock", "true", err, sizeof(err));
  prosody_config_set(conf, "source_system", "bench", err, sizeof(err));
  prosody_config_set(conf, "send_timeout", "60s", err, sizeof(err));
  client = prosody_client_new(conf, err, sizeof(err));
  if (!client) {
    fprintf(stderr, "client: %s\n", err);
    exit(1);
  }
  atomic_store(&pr_done, 0);
  t0 = now_s();
  for (long i = 0; i < n; i++) {
    payload(i, key, sizeof(key), buf, sizeof(buf));
    if (prosody_send_async(client, topic, key, buf, NULL, pr_dr, NULL, err,
                           sizeof(err))) {
      fprintf(stderr, "send: %s\n", err);
      exit(1);
    }
  }
  while (atomic_load(&pr_done) < n)
    usleep(200);
  t = now_s() - t0;
  prosody_client_destroy(client);
  return (double)n / t;
}

int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 200000;
  int reps = argc > 2 ? atoi(argv[2]) : 5;
  char bootstrap[256], err[512];
  double raw[32], pr[32], raw_med, pr_med;

  if (reps < 1 || reps > 32 || n < 1) {
    fprintf(stderr, "usage: bench_produce [messages] [repetitions<=32]\n");
    return 2;
  }
  if (prosody_mock_bootstrap_servers(bootstrap, sizeof(bootstrap), err,
                                     sizeof(err))) {
    fprintf(stderr, "mock: %s\n", err);
    return 1;
  }
  /* Warm-up, then alternate which side goes first. */
  run_raw(bootstrap, "bench-warmup", n / 10 + 1);
  run_prosody("bench-warmup", n / 10 + 1);
  for (int r = 0; r < reps; r++) {
    char t1[64], t2[64];
    snprintf(t1, sizeof(t1), "bench-raw-%d", r);
    snprintf(t2, sizeof(t2), "bench-prosody-%d", r);
    if (r % 2) {
      pr[r] = run_prosody(t2, n);
      raw[r] = run_raw(bootstrap, t1, n);
    } else {
      raw[r] = run_raw(bootstrap, t1, n);
      pr[r] = run_prosody(t2, n);
    }
  }
  qsort(raw, (size_t)reps, sizeof(double), bench_cmp_double);
  qsort(pr, (size_t)reps, sizeof(double), bench_cmp_double);
  raw_med = raw[reps / 2];
  pr_med = pr[reps / 2];
  printf("bench produce-raw %.0f msg/s ratio=1.000\n", raw_med);
  printf("bench produce-async %.0f msg/s ratio=%.3f\n", pr_med,
         pr_med / raw_med);
  fprintf(stderr,
          "produce: %ld records x %d runs (median); prosody_send_async %.0f "
          "msg/s vs raw librdkafka %.0f msg/s = %.2fx\n",
          n, reps, pr_med, raw_med, pr_med / raw_med);
  return 0;
}
