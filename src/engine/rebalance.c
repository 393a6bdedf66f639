/*
 * rebalance.c - librdkafka's rebalance callback: partitions assigned
 * (queues opened, timers loaded) and revoked (drained, offsets stored,
 * released).
 *
 * Threads: the engine thread (librdkafka calls it from our poll).
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static void on_assign(pr__engine_t *eng, rd_kafka_topic_partition_list_t *list,
                      int coop) {
  rd_kafka_error_t *error = NULL;

  for (int i = 0; i < list->cnt; i++) {
    rd_kafka_topic_partition_t *tp = &list->elems[i];
    part_t *part;
    if (pr__part_find(eng, tp->topic, tp->partition))
      continue;
    part = calloc(1, sizeof(*part));
    if (!part || !(part->topic = strdup(tp->topic))) {
      free(part);
      continue;
    }
    part->partition = tp->partition;
    pr__tracker_init(&part->tracker);
    part->head_off = -1;
    part->held = pr__part_zombie_find(eng, tp->topic, tp->partition) != NULL;
    part->next = eng->parts;
    eng->parts = part;
    pr__part_queue_open(eng, part);
    pr__firing_assigned(eng, part);
  }
  if (coop)
    error = rd_kafka_incremental_assign(eng->rk, list);
  else
    rd_kafka_assign(eng->rk, list);
  if (error) {
    PR_ERROR("engine", "incremental assign failed: %s",
             rd_kafka_error_string(error));
    rd_kafka_error_destroy(error);
  }
  pr__part_count(eng);
  pr__firing_arm(eng);
  PR_INFO("engine", "assigned %d partition(s); %d in total", list->cnt,
          atomic_load(&eng->assigned));
}

static void on_revoke(pr__engine_t *eng, rd_kafka_topic_partition_list_t *list,
                      int coop) {
  rd_kafka_error_t *error = NULL;
  for (int i = 0; i < list->cnt; i++) {
    part_t *part =
        pr__part_find(eng, list->elems[i].topic, list->elems[i].partition);
    if (part) {
      part->revoking = 1;
      pr__drain_release_idle(eng, part);
    }
  }
  if (!eng->stopping) /* shutdown has drained already */
    pr__drain_wait(eng, 1);
  /* Store the final watermark before giving the partitions up. */
  pr__part_store_offsets(eng, NULL);
  for (int i = 0; i < list->cnt; i++) {
    part_t *part =
        pr__part_find(eng, list->elems[i].topic, list->elems[i].partition);
    if (part)
      pr__part_release(eng, part);
  }
  if (coop)
    error = rd_kafka_incremental_unassign(eng->rk, list);
  else
    rd_kafka_assign(eng->rk, NULL);
  if (error) {
    PR_ERROR("engine", "incremental unassign failed: %s",
             rd_kafka_error_string(error));
    rd_kafka_error_destroy(error);
  }
  pr__part_count(eng);
  PR_INFO("engine", "revoked %d partition(s); %d remain", list->cnt,
          atomic_load(&eng->assigned));
}

void pr__rebalance_cb(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                      rd_kafka_topic_partition_list_t *list, void *opaque) {
  pr__engine_t *eng = opaque;
  int coop = !strcmp(rd_kafka_rebalance_protocol(rk), "COOPERATIVE");
  if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
    on_assign(eng, list, coop);
  } else if (err == RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS) {
    on_revoke(eng, list, coop);
  } else {
    PR_ERROR("engine", "rebalance error: %s", rd_kafka_err2str(err));
    on_revoke(eng, list, coop);
  }
}
