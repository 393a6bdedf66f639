/*
 * consumer.c - the consumer's librdkafka configuration: what the engine
 * relies on (offsets stored by the engine, committed by librdkafka's
 * auto-commit; rebalances through our callback; no partition EOF events).
 *
 * Threads: the subscribing thread.
 */
#include <stdio.h>

#include "../config/config.h"
#include "kafka.h"

static const char *const strategies[] = {"cooperative-sticky", "range",
                                         "roundrobin"};

const char *pr__kafka_consumer_strategy(const pr__settings_t *st) {
  return PR_CFG_ENUM(st, GROUP_PROTOCOL) == 1
             ? "the consumer group protocol (KIP-848)"
             : strategies[PR_CFG_ENUM(st, PARTITION_ASSIGNMENT_STRATEGY)];
}

rd_kafka_conf_t *pr__kafka_consumer_conf(const pr__settings_t *st,
                                         const char *bootstrap, char *errstr,
                                         size_t errstr_size) {
  rd_kafka_conf_t *kconf;
  char commit_ms[32], session_ms[32];
  int mock = PR_CFG_BOOL(st, MOCK);
  /* KIP-848: the broker assigns, and owns the session and heartbeat
   * settings (librdkafka refuses them on the client). */
  int kip848 = PR_CFG_ENUM(st, GROUP_PROTOCOL) == 1;
  int64_t session = kip848 ? 0 : mock ? 6000 : st->test.session_timeout_ms;

  if (!(kconf = pr__kafka_conf_new(st, bootstrap, mock, errstr, errstr_size)))
    return NULL;
  snprintf(commit_ms, sizeof(commit_ms), "%lld",
           (long long)PR_CFG_MS(st, COMMIT_INTERVAL));
  snprintf(session_ms, sizeof(session_ms), "%lld", (long long)session);
  if (pr__kafka_conf_set(kconf, "group.id", PR_CFG_STR(st, GROUP_ID), errstr,
                         errstr_size) ||
      /* The engine stores watermark + 1 of each partition as its events
       * finish; librdkafka commits what is stored every commit_interval. */
      pr__kafka_conf_set(kconf, "enable.auto.commit", "true", errstr,
                         errstr_size) ||
      pr__kafka_conf_set(kconf, "auto.commit.interval.ms", commit_ms, errstr,
                         errstr_size) ||
      pr__kafka_conf_set(kconf, "enable.auto.offset.store", "false", errstr,
                         errstr_size) ||
      pr__kafka_conf_set(kconf, "auto.offset.reset", "earliest", errstr,
                         errstr_size) ||
      pr__kafka_conf_set(kconf, "enable.partition.eof", "false", errstr,
                         errstr_size) ||
      pr__kafka_conf_fetch_wait(kconf, st, mock, errstr, errstr_size) ||
      /* Rule 1: cooperative-sticky by default (librdkafka >= 2.10.0 is
       * linked: its cooperative bugs are fixed); the engine is correct under
       * eager and incremental rebalancing alike (rebalance.c). */
      (kip848 ? pr__kafka_conf_set(kconf, "group.protocol", "consumer", errstr,
                                   errstr_size)
              : pr__kafka_conf_set(
                    kconf, "partition.assignment.strategy",
                    strategies[PR_CFG_ENUM(st, PARTITION_ASSIGNMENT_STRATEGY)],
                    errstr, errstr_size)) ||
      /* The mock cluster's short session (a test joining it from another
       * process asks for the same): a member that died leaves the group in
       * seconds, not Kafka's default 45 s. */
      (session > 0 && (pr__kafka_conf_set(kconf, "session.timeout.ms",
                                          session_ms, errstr, errstr_size) ||
                       pr__kafka_conf_set(kconf, "heartbeat.interval.ms", "500",
                                          errstr, errstr_size)))) {
    rd_kafka_conf_destroy(kconf);
    return NULL;
  }
  return kconf;
}
