/*
 * bench.h - helpers shared by the benchmark programs (header-only).
 */
#ifndef PR_BENCH_H
#define PR_BENCH_H

#include <librdkafka/rdkafka.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "prosody.h"

/* Monotonic seconds. */
static inline double bench_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* CPU time (user + system) of the whole process so far, in seconds: the
 * client, librdkafka and the in-process mock cluster alike. */
static inline double bench_cpu_s(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

/* qsort comparator for doubles, ascending. */
static inline int bench_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Sets an option or exits with the error. */
static inline void bench_set(prosody_config_t *c, const char *k,
                             const char *v) {
  char err[512];
  if (prosody_config_set(c, k, v, err, sizeof(err))) {
    fprintf(stderr, "bench: %s\n", err);
    exit(1);
  }
}

/* A producer for the benchmark's records: `conf` already points at a
 * cluster; exits with the error if the client cannot be created. */
static inline prosody_client_t *bench_producer(prosody_config_t *conf) {
  char err[512];
  prosody_client_t *c;
  bench_set(conf, "source_system", "bench");
  bench_set(conf, "send_timeout", "60s");
  if (!(c = prosody_client_new(conf, err, sizeof(err)))) {
    fprintf(stderr, "bench: %s\n", err);
    exit(1);
  }
  return c;
}

/* Record i's JSON payload (~100 bytes, with `id` and `type`) for `key`. */
static inline void bench_order_json(char *buf, size_t n, long i,
                                    const char *key) {
  snprintf(buf, n,
           "{\"id\":\"evt-%010ld\",\"type\":\"order.created\",\"amount\":"
           "%ld.%02ld,\"customer\":\"%s\"}",
           i, (i * 31) % 1000, i % 100, key);
}

/* A consumer of `topic` on the embedded mock cluster, in group `topic`,
 * with `conf`'s other options (`conf` is taken), subscribed with `h`;
 * returns once it has partitions (the mock's group join takes ~3 s, at
 * most 60 s), or exits with the error. */
static inline prosody_client_t *
bench_mock_consumer(prosody_config_t *conf, const char *topic,
                    const prosody_handler_t *h) {
  char err[512];
  prosody_client_t *c;
  int waited_ms = 0;
  bench_set(conf, "mock", "true");
  bench_set(conf, "group_id", topic);
  bench_set(conf, "subscribed_topics", topic);
  if (!(c = prosody_client_new(conf, err, sizeof(err))) ||
      prosody_subscribe(c, h, err, sizeof(err))) {
    fprintf(stderr, "bench: %s\n", err);
    exit(1);
  }
  while (prosody_assigned_partition_count(c) == 0 && waited_ms < 60000) {
    usleep(10000);
    waited_ms += 10;
  }
  return c;
}

/* Wall-clock seconds: the intended send times in a stream's records are
 * wall times, read by the producer and the handlers alike. */
static inline double bench_wall_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A stream's keys: record i has key key-NNNN, NNNN = bench_key_of(i),
 * each of the 1 000 keys in turn. */
#define BENCH_KEYS 1000
static inline long bench_key_of(long i) { return (i * 7919) % BENCH_KEYS; }

/* The acknowledgements of a stream's records. */
typedef struct bench_sends {
  atomic_long ok, failed;
} bench_sends_t;

static inline void bench_on_sent(prosody_err_t err, const char *errstr,
                                 const prosody_delivery_t *d, void *op) {
  bench_sends_t *s = op;
  (void)errstr;
  (void)d;
  atomic_fetch_add(err ? &s->failed : &s->ok, 1);
}

/* Sends records 0..total-1 of a stream to `topic`: record i at its
 * intended send time start + i / rate (waiting for it when ahead; behind,
 * it goes at once and its lateness shows up as latency: no coordinated
 * omission), or, with rate 0, as fast as it can, intended = when sent. The
 * payload (~100 bytes) carries `id` evt-<i> and `intended` (bench_index(),
 * bench_intended()). Acknowledgements are counted in `sends`. */
static inline void bench_stream(prosody_client_t *prod, const char *topic,
                                long total, long rate, double start,
                                bench_sends_t *sends) {
  char err[512], key[32], payload[160];
  for (long i = 0; i < total; i++) {
    double now = bench_wall_s(),
           intended = rate > 0 ? start + (double)i / (double)rate : now;
    if (intended > now) /* on schedule: wait for the slot */
      usleep((useconds_t)((intended - now) * 1e6));
    snprintf(key, sizeof(key), "key-%04ld", bench_key_of(i));
    snprintf(payload, sizeof(payload),
             "{\"id\":\"evt-%010ld\",\"type\":\"order.created\","
             "\"intended\":%.6f}",
             i, intended);
    if (prosody_send_async(prod, topic, key, payload, NULL, bench_on_sent,
                           sends, err, sizeof(err)))
      atomic_fetch_add(&sends->failed, 1);
  }
}

/* This process's resident set size in KiB (VmRSS), or -1. */
static inline long bench_rss_kib(void) {
  char line[256];
  long kib = -1;
  FILE *f = fopen("/proc/self/status", "r");
  if (!f)
    return -1;
  while (fgets(line, sizeof(line), f))
    if (!strncmp(line, "VmRSS:", 6))
      kib = atol(line + 6);
  fclose(f);
  return kib;
}

/* A stream record's intended send time (0 when absent) and index (-1). */
static inline double bench_intended(const char *payload) {
  const char *p = payload ? strstr(payload, "\"intended\":") : NULL;
  return p ? atof(p + 11) : 0;
}
static inline long bench_index(const char *payload) {
  const char *p = payload ? strstr(payload, "\"id\":\"evt-") : NULL;
  return p ? atol(p + 10) : -1;
}

/* Points `conf` at the real broker `bootstrap`, or at the embedded mock
 * cluster when it is NULL. */
static inline void bench_target(prosody_config_t *conf, const char *bootstrap) {
  if (bootstrap)
    bench_set(conf, "bootstrap_servers", bootstrap);
  else
    bench_set(conf, "mock", "true");
}

/* Creates (create) or deletes `topic` with 4 partitions on the real broker
 * at `bootstrap`, as the mock cluster's topics have (the broker's default
 * is 1), or exits with the error. */
static inline void bench_real_topic(const char *bootstrap, const char *topic,
                                    int create) {
  char err[512];
  prosody_config_t *conf = prosody_config_new();
  prosody_topic_options_t o = PROSODY_TOPIC_OPTIONS_INIT;
  prosody_admin_t *a;
  o.partitions = 4;
  bench_target(conf, bootstrap);
  if (!(a = prosody_admin_new(conf, err, sizeof(err))) ||
      (create ? prosody_admin_create_topic(a, topic, &o, err, sizeof(err))
              : prosody_admin_delete_topic(a, topic, err, sizeof(err)))) {
    fprintf(stderr, "bench: topic %s: %s\n", topic, err);
    exit(1);
  }
  prosody_admin_destroy(a); /* it owns conf */
}

/* The baseline consumer's configuration: a plain librdkafka high-level
 * consumer in `group` from the earliest offset, storing offsets itself,
 * with the mock cluster's short session. */
static inline rd_kafka_conf_t *bench_raw_conf(const char *bootstrap,
                                              const char *group) {
  char err[512];
  rd_kafka_conf_t *kc = rd_kafka_conf_new();
  rd_kafka_conf_set(kc, "bootstrap.servers", bootstrap, err, sizeof(err));
  rd_kafka_conf_set(kc, "group.id", group, err, sizeof(err));
  rd_kafka_conf_set(kc, "auto.offset.reset", "earliest", err, sizeof(err));
  rd_kafka_conf_set(kc, "enable.auto.offset.store", "false", err, sizeof(err));
  rd_kafka_conf_set(kc, "broker.address.family", "v4", err, sizeof(err));
  rd_kafka_conf_set(kc, "session.timeout.ms", "6000", err, sizeof(err));
  rd_kafka_conf_set(kc, "heartbeat.interval.ms", "500", err, sizeof(err));
  return kc;
}

/* Starts a consumer of `topic` with `kc` (taken), or exits. */
static inline rd_kafka_t *bench_raw_start(rd_kafka_conf_t *kc,
                                          const char *topic) {
  char err[512];
  rd_kafka_topic_partition_list_t *subs;
  rd_kafka_t *rk;
  if (!(rk = rd_kafka_new(RD_KAFKA_CONSUMER, kc, err, sizeof(err)))) {
    fprintf(stderr, "bench: %s\n", err);
    exit(1);
  }
  rd_kafka_poll_set_consumer(rk);
  subs = rd_kafka_topic_partition_list_new(1);
  rd_kafka_topic_partition_list_add(subs, topic, RD_KAFKA_PARTITION_UA);
  rd_kafka_subscribe(rk, subs);
  rd_kafka_topic_partition_list_destroy(subs);
  return rk;
}

/* The baseline consumer of `topic` (bench_raw_conf()). */
static inline rd_kafka_t *bench_raw_consumer(const char *bootstrap,
                                             const char *group,
                                             const char *topic) {
  return bench_raw_start(bench_raw_conf(bootstrap, group), topic);
}

/* Reads n records with `rk` (which it closes and destroys), calling
 * `each` (if any) on each before storing its offset; returns records/s
 * from the first record to the last, and *cpu_us the process's CPU per
 * record over the same span. */
static inline double bench_raw_read(rd_kafka_t *rk, long n,
                                    void (*each)(rd_kafka_message_t *m,
                                                 void *arg),
                                    void *arg, double *cpu_us) {
  long got = 0;
  double first = 0, last = 0, cpu0 = 0;
  while (got < n) {
    rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
    if (!m)
      continue;
    if (!m->err) {
      if (!got) {
        first = bench_now_s();
        cpu0 = bench_cpu_s();
      }
      if (each)
        each(m, arg);
      got++;
      last = bench_now_s();
      rd_kafka_offset_store(m->rkt, m->partition, m->offset);
    }
    rd_kafka_message_destroy(m);
  }
  *cpu_us = (bench_cpu_s() - cpu0) * 1e6 / (double)n;
  rd_kafka_consumer_close(rk);
  rd_kafka_destroy(rk);
  return (double)n / (last - first);
}

#endif /* PR_BENCH_H */
