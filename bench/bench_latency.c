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
static atomic_long got, sent_failed;

static double wall_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static prosody_result_t on_message(prosody_context_t *ctx,
                                   const prosody_message_t *m, void *op) {
  const char *p = strstr(prosody_message_payload(m), "\"intended\":");
  double now = wall_s(), intended = p ? atof(p + 11) : now;
  long n = atomic_fetch_add(&got, 1);
  (void)ctx;
  (void)op;
  if (n < total)
    lat_ms[n] = (now - intended) * 1e3;
  return PROSODY_SUCCESS;
}

static void on_sent(prosody_err_t err, const char *errstr,
                    const prosody_delivery_t *d, void *op) {
  (void)errstr;
  (void)d;
  (void)op;
  if (err)
    atomic_fetch_add(&sent_failed, 1);
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
      const char *p;
      double now = wall_s();
      long k;
      memcpy(buf, m->payload, n);
      buf[n] = '\0';
      p = strstr(buf, "\"intended\":");
      k = atomic_fetch_add(&got, 1);
      if (k < total)
        lat_ms[k] = (now - (p ? atof(p + 11) : now)) * 1e3;
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
  char err[1024], topic[64], key[32], payload[160];
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
  bench_set(conf, "source_system", "bench");
  bench_set(conf, "send_timeout", "30s");
  prod = prosody_client_new(conf, err, sizeof(err));
  if (!prod) {
    fprintf(stderr, "bench_latency: %s\n", err);
    return 1;
  }
  /* Create the topic before anyone subscribes to it. */
  if (prosody_send(prod, topic, "warm-up", "{\"intended\":0}", NULL, err,
                   sizeof(err))) {
    fprintf(stderr, "bench_latency: %s\n", err);
    return 1;
  }
  deadline = wall_s() + 60;
  if (raw) {
    rk = raw_consumer(topic);
    pthread_create(&raw_thread, NULL, raw_main, rk);
    while (!atomic_load(&raw_assigned) && wall_s() < deadline)
      usleep(10000);
  } else {
    conf = prosody_config_new();
    bench_set(conf, "mock", "true");
    bench_set(conf, "group_id", topic);
    bench_set(conf, "subscribed_topics", topic);
    bench_set(conf, "log", "warn");
    cons = prosody_client_new(conf, err, sizeof(err));
    if (!cons || prosody_subscribe(cons, &h, err, sizeof(err))) {
      fprintf(stderr, "bench_latency: %s\n", err);
      return 1;
    }
    while (prosody_assigned_partition_count(cons) == 0 && wall_s() < deadline)
      usleep(10000); /* the group join (3 s on the mock) */
  }
  /* The warm-up record arrives first: let it, then count from zero. */
  while (atomic_load(&got) < 1 && wall_s() < deadline)
    usleep(1000);
  atomic_store(&got, 0);

  start = wall_s() + 0.1;
  for (long i = 0; i < total; i++) {
    double intended = start + (double)i / (double)rate, now = wall_s();
    if (intended > now) /* on schedule: wait for the slot */
      usleep((useconds_t)((intended - now) * 1e6));
    snprintf(key, sizeof(key), "key-%04ld", (i * 7919) % 1000);
    snprintf(payload, sizeof(payload),
             "{\"id\":\"evt-%010ld\",\"type\":\"order.created\","
             "\"intended\":%.6f}",
             i, intended);
    if (prosody_send_async(prod, topic, key, payload, NULL, on_sent, NULL, err,
                           sizeof(err)))
      atomic_fetch_add(&sent_failed, 1);
  }
  deadline = wall_s() + 60;
  while (atomic_load(&got) < total && wall_s() < deadline)
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
  if (atomic_load(&got) < total || atomic_load(&sent_failed)) {
    fprintf(stderr, "bench_latency: %ld of %ld consumed, %ld sends failed\n",
            atomic_load(&got), total, atomic_load(&sent_failed));
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
