/*
 * intake.c - from librdkafka's queues to a key queue: polls the consumer
 * queue and each partition's own queue, checks the key, takes the offset
 * and copies the record into a new invocation.
 *
 * Threads: the engine thread only.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "defer.h"
#include "internal.h"

/* Takes the offset and finishes it at once (filtered or undecodable). */
static void skip_record(part_t *part, int64_t offset) {
  PR_BUMP(part->eng->metrics.skipped_undecodable, 1);
  if (pr__tracker_take(&part->tracker, offset) == 0 &&
      pr__tracker_complete(&part->tracker, offset) > 0)
    part->dirty = 1;
}

static void intake(pr__engine_t *eng, rd_kafka_message_t *rkm) {
  const char *topic = rd_kafka_topic_name(rkm->rkt);
  part_t *part = pr__part_find(eng, topic, rkm->partition);
  const char *why;
  inv_t *inv;
  int rc;

  if (!part || part->revoking) {
    rd_kafka_message_destroy(rkm);
    return;
  }
  /* Key present and UTF-8 text, payload present; the payload's JSON and
   * the filters are checked by pr__decode_prepare(). */
  if ((why = pr__record_check(rkm->key, rkm->key_len, rkm->payload,
                              (eng->handler.flags & PROSODY_HANDLER_EXCISE) !=
                                  0))) {
    PR_WARN("engine",
            "skipping undecodable record %s[%d] offset %lld: %s; committing "
            "past it",
            topic, rkm->partition, (long long)rkm->offset, why);
    skip_record(part, rkm->offset);
    pr__bp_check(eng, part); /* behind a stuck record it widens the
                                      offset window */
    rd_kafka_message_destroy(rkm);
    return;
  }

  rc = pr__tracker_take(&part->tracker, rkm->offset);
  inv = rc == 0 ? pr__intake_inv(part, rkm) : NULL;
  if (!inv) {
    if (rc == 0)
      PR_ERROR("engine", "out of memory taking %s[%d] offset %lld", topic,
               rkm->partition, (long long)rkm->offset);
    rd_kafka_message_destroy(rkm);
    return;
  }
  PR_BUMP(eng->metrics.consumed, 1);
  pr__dispatch_enqueue(inv);
}

inv_t *pr__intake_inv(part_t *part, rd_kafka_message_t *rkm) {
  PR_ENGINE_THREAD(part->eng);
  inv_t *inv =
      pr__inv_message(part, rkm->key, rkm->key_len, rkm->payload, rkm->len,
                      rkm->offset, rd_kafka_message_timestamp(rkm, NULL));
  if (inv)
    inv->rkm = rkm;
  return inv;
}

/* Handles one record or error from a queue. */
static void take(pr__engine_t *eng, rd_kafka_message_t *rkm) {
  if (rkm->err) {
    if (rkm->err == RD_KAFKA_RESP_ERR_INCONSISTENT_GROUP_PROTOCOL)
      pr__rebalance_mismatch(eng); /* an error naming both sides, soon */
    else if (rkm->err != RD_KAFKA_RESP_ERR__PARTITION_EOF)
      PR_WARN("engine", "consumer: %s", rd_kafka_message_errstr(rkm));
    rd_kafka_message_destroy(rkm);
    return;
  }
  intake(eng, rkm);
}

/* Serves the consumer queue (rebalances, errors: always, whatever the
 * backpressure) and then every partition's own queue that is not stopped,
 * each until it is empty or its partition reaches max_uncommitted. Every
 * wake-up reads every queue to empty (the pipe is written only when a
 * queue turns non-empty: librdkafka rule 4, docs/ARCHITECTURE.md), except
 * a stopped one, which pr__bp_check() has read again once released. */
void pr__intake_poll(pr__engine_t *eng) {
  PR_ENGINE_THREAD(eng);
  char buf[256];
  rd_kafka_message_t *rkm;
  while (read(eng->pipefd[0], buf, sizeof(buf)) > 0)
    ;
  eng->resumed = 0;
  if (eng->st->test.hold_rebalances) { /* served by the close (tests) */
    if (!eng->held && rd_kafka_queue_length(eng->cq) > 0) {
      eng->held = 1;
      PR_INFO("engine", "test option: holding the consumer queue's events");
    }
  } else {
    while ((rkm = rd_kafka_consumer_poll(eng->rk, 0)))
      take(eng, rkm);
  }
  for (part_t *part = eng->parts; part; part = part->next) {
    if (!part->rkq || part->revoking || pr__df_listing(part))
      continue;
    while (!part->stopped && (rkm = rd_kafka_consume_queue(part->rkq, 0)))
      take(eng, rkm);
  }
  pr__mailbox_deliver(&eng->mb);
  pr__part_store_offsets(eng, NULL);
  pr__firing_due(eng);
}
