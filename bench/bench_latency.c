/*
 * bench_latency.c - end-to-end latency under a steady stream: a producer
 * thread sends RATE records/s for SECONDS to the embedded mock cluster
 * (1 000 keys); each record carries its intended send time (start + i /
 * RATE), and the consumer's no-op handler records handler start minus that
 * intended time, so a stalled producer or consumer shows up as latency
 * instead of being hidden (no coordinated omission). The consumer joins
 * before the stream starts. Reports p50, p99 and p99.9.
 *
 *   bench_latency RATE [SECONDS] [raw]
 *
 * With "raw", a plain librdkafka consumer (poll loop, no handler) replaces
 * the prosody consumer: the baseline of the same stream.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>

#include "bench.h"
#include "prosody.h"

static long total, rate;
static double *lat_ms;
static atomic_long got;
static bench_sends_t sends;

/* Latency of a record handled now (0 for one without an intended time). */
static double latency_ms(const char *payload) {
  double now = bench_wall_s(), intended = bench_intended(payload);
  return intended > 0 ? (now - intended) * 1e3 : 0;
}

static prosody_result_t on_message(prosody_context_t *ctx,
                                   const prosody_message_t *m, void *op) {
  double ms = latency_ms(prosody_message_payload(m));
  long n = atomic_fetch_add(&got, 1);
  (void)ctx;
  (void)op;
  if (n < total)
    lat_ms[n] = ms;
  return PROSODY_SUCCESS;
}

/* The baseline: a raw high-level consumer's poll loop, recording the same
 * latency at the moment a record is returned. */
static atomic_int raw_stop, raw_assigned;
static void *raw_main(void *arg) {
  rd_kafka_t *rk = arg;
  while (!atomic_load(&raw_stop)) {
    rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
    rd_kafka_topic_partition_list_t *a = NULL;
    if (!atomic_load(&raw_assigned) && !rd_kafka_assignment(rk, &a)) {
      if (a->cnt > 0)
        atomic_store(&raw_assigned, 1);
      rd_kafka_topic_partition_list_destroy(a);
    }
    if (!m)
      continue;
    if (!m->err && m->payload) {
      char buf[200];
      size_t n = m->len < sizeof(buf) - 1 ? m->len : sizeof(buf) - 1;
      double ms;
      long k;
      memcpy(buf, m->payload, n);
      buf[n] = '\0';
      ms = latency_ms(buf);
      k = atomic_fetch_add(&got, 1);
      if (k < total)
        lat_ms[k] = ms;
    }
    rd_kafka_message_destroy(m);
  }
  return NULL;
}

static rd_kafka_t *raw_consumer(const char *topic) {
  char err[512], boot[256];
  prosody_mock_bootstrap_servers(boot, sizeof(boot), err, sizeof(err));
  return bench_raw_consumer(boot, topic, topic);
}

int main(int argc, char **argv) {
  long secs = argc > 2 ? atol(argv[2]) : 10;
  char err[1024], topic[64];
  prosody_config_t *conf;
  prosody_client_t *prod, *cons = NULL;
  int raw = argc > 3 && !strcmp(argv[3], "raw");
  rd_kafka_t *rk = NULL;
  pthread_t raw_thread;
  prosody_handler_t h = {on_message, NULL, NULL, 0};
  double start, deadline;
  rate = argc > 1 ? atol(argv[1]) : 10000;
  if (rate < 1 || secs < 1)
    return 2;
  total = rate * secs;
  lat_ms = calloc((size_t)total, sizeof(double));
  snprintf(topic, sizeof(topic), "bench-latency-%d", (int)getpid());

  conf = prosody_config_new();
  bench_set(conf, "mock", "true");
  prod = bench_producer(conf);
  /* Create the topic before anyone subscribes to it. */
  if (prosody_send(prod, topic, "warm-up", "{\"intended\":0}", NULL, err,
                   sizeof(err))) {
    fprintf(stderr, "bench_latency: %s\n", err);
    return 1;
  }
  deadline = bench_wall_s() + 60;
  if (raw) {
    rk = raw_consumer(topic);
    pthread_create(&raw_thread, NULL, raw_main, rk);
    while (!atomic_load(&raw_assigned) && bench_wall_s() < deadline)
      usleep(10000);
  } else {
    conf = prosody_config_new();
    bench_set(conf, "log", "warn");
    cons = bench_mock_consumer(conf, topic, &h);
  }
  /* The warm-up record arrives first: let it, then count from zero. */
  while (atomic_load(&got) < 1 && bench_wall_s() < deadline)
    usleep(1000);
  atomic_store(&got, 0);

  start = bench_wall_s() + 0.1;
  bench_stream(prod, topic, total, rate, start, &sends);
  deadline = bench_wall_s() + 60;
  while (atomic_load(&got) < total && bench_wall_s() < deadline)
    usleep(10000);
  if (raw) {
    atomic_store(&raw_stop, 1);
    pthread_join(raw_thread, NULL);
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
  } else {
    prosody_client_destroy(cons);
  }
  prosody_client_destroy(prod);
  if (atomic_load(&got) < total || atomic_load(&sends.failed)) {
    fprintf(stderr, "bench_latency: %ld of %ld consumed, %ld sends failed\n",
            atomic_load(&got), total, atomic_load(&sends.failed));
    return 1;
  }
  qsort(lat_ms, (size_t)total, sizeof(double), bench_cmp_double);
  {
    const char *who = raw ? "latency-raw" : "latency";
    printf("bench %s_p50 %.1f ms rate=%ld/s\n", who,
           lat_ms[(size_t)(0.50 * (double)(total - 1))], rate);
    printf("bench %s_p99 %.1f ms rate=%ld/s\n", who,
           lat_ms[(size_t)(0.99 * (double)(total - 1))], rate);
    printf("bench %s_p99.9 %.1f ms rate=%ld/s\n", who,
           lat_ms[(size_t)(0.999 * (double)(total - 1))], rate);
  }
  free(lat_ms);
  return 0;
}
