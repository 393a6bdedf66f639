/*
 * bench.h - helpers shared by the benchmark programs (header-only).
 */
#ifndef PR_BENCH_H
#define PR_BENCH_H

#include <librdkafka/rdkafka.h>
#include <stdio.h>
#include <stdlib.h>

#include "prosody.h"

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

/* The baseline consumer: a plain librdkafka high-level consumer of `topic`
 * in `group` from the earliest offset, storing offsets itself, with the
 * mock cluster's short session. */
static inline rd_kafka_t *bench_raw_consumer(const char *bootstrap,
                                             const char *group,
                                             const char *topic) {
  char err[512];
  rd_kafka_conf_t *kc = rd_kafka_conf_new();
  rd_kafka_topic_partition_list_t *subs;
  rd_kafka_t *rk;
  rd_kafka_conf_set(kc, "bootstrap.servers", bootstrap, err, sizeof(err));
  rd_kafka_conf_set(kc, "group.id", group, err, sizeof(err));
  rd_kafka_conf_set(kc, "auto.offset.reset", "earliest", err, sizeof(err));
  rd_kafka_conf_set(kc, "enable.auto.offset.store", "false", err, sizeof(err));
  rd_kafka_conf_set(kc, "broker.address.family", "v4", err, sizeof(err));
  rd_kafka_conf_set(kc, "session.timeout.ms", "6000", err, sizeof(err));
  rd_kafka_conf_set(kc, "heartbeat.interval.ms", "500", err, sizeof(err));
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

#endif /* PR_BENCH_H */
