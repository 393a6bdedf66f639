/*
 * rebalance.c - librdkafka's rebalance callback: partitions assigned
 * (queues opened, timers loaded) and revoked (drained, offsets stored,
 * released).
 *
 * Threads: the engine thread (librdkafka calls it from our poll).
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"

/* Takes the partitions of `list` that are new: all or none. Returns -1
 * (nothing taken) when one of them cannot be allocated. */
static int take_partitions(pr__engine_t *eng,
                           rd_kafka_topic_partition_list_t *list) {
  part_t *fresh = NULL, *part;
  for (int i = 0; i < list->cnt; i++) {
    rd_kafka_topic_partition_t *tp = &list->elems[i];
    if (pr__part_find(eng, tp->topic, tp->partition))
      continue;
    if (!(part = pr__part_new(eng, tp->topic, tp->partition))) {
      while ((part = fresh)) {
        fresh = part->next;
        pr__part_free(part);
      }
      return -1;
    }
    part->next = fresh;
    fresh = part;
  }
  while ((part = fresh)) {
    fresh = part->next;
    part->held =
        pr__part_zombie_find(eng, part->topic, part->partition) != NULL;
    part->next = eng->parts;
    eng->parts = part;
    pr__part_queue_open(eng, part);
    pr__firing_assigned(eng, part);
    pr__layers_assign(eng, part);
  }
  return 0;
}

/* Remembers `list` for pr__rebalance_retry(). */
static void retry_later(pr__engine_t *eng,
                        rd_kafka_topic_partition_list_t *list, int coop) {
  rd_kafka_topic_partition_list_t *copy;
  if (eng->assign_retry) { /* a cooperative increment on top of one */
    for (int i = 0; i < list->cnt; i++)
      if (!rd_kafka_topic_partition_list_find(eng->assign_retry,
                                              list->elems[i].topic,
                                              list->elems[i].partition))
        rd_kafka_topic_partition_list_add(
            eng->assign_retry, list->elems[i].topic, list->elems[i].partition)
            ->offset = list->elems[i].offset;
    return;
  }
  /* Without memory the engine can do nothing useful: wait for it rather
   * than lose the assignment. */
  while (!(copy = rd_kafka_topic_partition_list_copy(list)))
    usleep(100000);
  eng->assign_retry = copy;
  eng->assign_coop = coop;
}

/* Partitions assigned: taken in full, then handed to librdkafka. When one
 * cannot be allocated none is taken nor assigned (so no record of them is
 * read, let alone dropped): the assignment is retried every poll_interval
 * until it fits. */
static void on_assign(pr__engine_t *eng, rd_kafka_topic_partition_list_t *list,
                      int coop) {
  rd_kafka_error_t *error = NULL;

  if (take_partitions(eng, list)) {
    PR_ERROR("engine",
             "out of memory taking %d assigned partition(s): not assigned "
             "yet; retrying every poll_interval",
             list->cnt);
    retry_later(eng, list, coop);
    return;
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
  eng->close_answered |= eng->stopping;
  pr__part_count(eng);
  pr__firing_arm(eng);
  PR_INFO("engine", "assigned %d partition(s); %d in total", list->cnt,
          atomic_load(&eng->assigned));
}

void pr__rebalance_retry(pr__engine_t *eng) {
  PR_ENGINE_THREAD(eng);
  rd_kafka_topic_partition_list_t *list = eng->assign_retry;
  if (!list || eng->stopping)
    return;
  eng->assign_retry = NULL;
  on_assign(eng, list, eng->assign_coop);
  rd_kafka_topic_partition_list_destroy(list);
}

/* Revoked partitions are no longer waiting for a retried assignment. */
static void forget_retry(pr__engine_t *eng,
                         rd_kafka_topic_partition_list_t *list, int coop) {
  if (!eng->assign_retry)
    return;
  if (coop)
    for (int i = 0; i < list->cnt; i++)
      rd_kafka_topic_partition_list_del(eng->assign_retry, list->elems[i].topic,
                                        list->elems[i].partition);
  if (!coop || eng->assign_retry->cnt == 0) {
    rd_kafka_topic_partition_list_destroy(eng->assign_retry);
    eng->assign_retry = NULL;
  }
}

/* Partitions revoked: drained, stored and released; then handed back to
 * librdkafka unless `stale` (pr__rebalance_cb). */
static void on_revoke(pr__engine_t *eng, rd_kafka_topic_partition_list_t *list,
                      int coop, int stale) {
  rd_kafka_error_t *error = NULL;
  forget_retry(eng, list, coop);
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
  /* Stale: the group has left, there is nothing to hand back. */
  if (!stale && coop)
    error = rd_kafka_incremental_unassign(eng->rk, list);
  else if (!stale)
    rd_kafka_assign(eng->rk, NULL);
  eng->close_answered |= eng->stopping;
  if (error) {
    PR_ERROR("engine", "incremental unassign failed: %s",
             rd_kafka_error_string(error));
    rd_kafka_error_destroy(error);
  }
  pr__part_count(eng);
  PR_INFO("engine", "revoked %d partition(s); %d remain", list->cnt,
          atomic_load(&eng->assigned));
}

/*
 * Stale events. Once the consumer's close has begun, librdkafka (2.14.2)
 * takes the engine's first assign or unassign call, whatever it asks, as
 * the full unassign it waits for, then leaves the group and ends its group
 * handling. An event still queued behind that call is stale: typically an
 * assignment that arrived as the close began was served first (inside
 * rd_kafka_consumer_close), then the revoke librdkafka queued for it. Asking
 * the group anything then races its end: rd_kafka_rebalance_protocol()
 * returns NULL once it has ended, and an (un)assign call whose request it
 * drops unanswered waits for ever. So a stale revoke releases our
 * partitions without calling librdkafka, and a stale assignment is not
 * taken.
 */
void pr__rebalance_cb(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                      rd_kafka_topic_partition_list_t *list, void *opaque) {
  pr__engine_t *eng = opaque;
  const char *protocol = NULL;
  int stale, coop;
  if (eng->stopping && eng->st->test.hold_rebalances)
    usleep(50000); /* tests: the group's leave has gone through */
  stale = eng->stopping && eng->close_answered;
  if (!stale && !(protocol = rd_kafka_rebalance_protocol(rk)))
    stale = 1; /* NULL: the group has ended */
  coop = protocol && !strcmp(protocol, "COOPERATIVE");
  if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
    if (stale)
      PR_DEBUG("engine",
               "ignoring an assignment of %d partition(s): the group has "
               "left",
               list->cnt);
    else
      on_assign(eng, list, coop);
  } else if (err == RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS) {
    on_revoke(eng, list, coop, stale);
  } else {
    PR_ERROR("engine", "rebalance error: %s", rd_kafka_err2str(err));
    on_revoke(eng, list, coop, stale);
  }
}

void pr__rebalance_mismatch(pr__engine_t *eng) {
  PR_ENGINE_THREAD(eng);
  const char *group = PR_CFG_STR(eng->st, GROUP_ID);
  int64_t now = pr__now_ns();
  if (eng->mismatch_q ||
      (eng->mismatch_ns && now - eng->mismatch_ns < 30000000000LL))
    return;
  eng->mismatch_ns = now;
  if (!(eng->mismatch_q = rd_kafka_queue_new(eng->rk)))
    return;
  rd_kafka_DescribeConsumerGroups(eng->rk, &group, 1, NULL, eng->mismatch_q);
}

void pr__rebalance_mismatch_poll(pr__engine_t *eng) {
  PR_ENGINE_THREAD(eng);
  const rd_kafka_DescribeConsumerGroups_result_t *res;
  const rd_kafka_ConsumerGroupDescription_t **groups;
  const char *theirs = NULL, *kind = "";
  rd_kafka_event_t *ev;
  size_t n = 0;
  if (!eng->mismatch_q || !(ev = rd_kafka_queue_poll(eng->mismatch_q, 0)))
    return;
  if ((res = rd_kafka_event_DescribeConsumerGroups_result(ev)) &&
      (groups = rd_kafka_DescribeConsumerGroups_result_groups(res, &n)) &&
      n == 1 && !rd_kafka_ConsumerGroupDescription_error(groups[0])) {
    theirs = rd_kafka_ConsumerGroupDescription_partition_assignor(groups[0]);
    kind = rd_kafka_ConsumerGroupDescription_type(groups[0]) ==
                   RD_KAFKA_CONSUMER_GROUP_TYPE_CONSUMER
               ? " (group protocol consumer)"
               : " (group protocol classic)";
  }
  PR_ERROR("engine",
           "consumer group \"%s\": the broker refused this member's join "
           "(inconsistent group protocol): this consumer offers %s, the "
           "group's members use %s%s. It gets no partition until every "
           "member uses the same partition_assignment_strategy and "
           "group_protocol",
           PR_CFG_STR(eng->st, GROUP_ID), pr__kafka_consumer_strategy(eng->st),
           theirs && *theirs ? theirs
                             : "another strategy (the broker did not "
                               "name it)",
           theirs && *theirs ? kind : "");
  rd_kafka_event_destroy(ev);
  pr__rebalance_mismatch_free(eng);
}

void pr__rebalance_mismatch_free(pr__engine_t *eng) {
  PR_ENGINE_THREAD(eng);
  if (eng->mismatch_q)
    rd_kafka_queue_destroy(eng->mismatch_q);
  eng->mismatch_q = NULL;
}
