/*
 * partition.c - assigned partitions: creation and release, offsets
 * stored for commit, pausing, zombies and the stall check (finding a
 * partition and its key queues: keyq.c).
 *
 * Threads: the engine thread only.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

part_t *pr__part_new(pr__engine_t *eng, const char *topic, int32_t p) {
  PR_ENGINE_THREAD(eng);
  part_t *part;
  if (eng->fail_part_new > 0) { /* test option: as if out of memory */
    eng->fail_part_new--;
    return NULL;
  }
  if (!(part = calloc(1, sizeof(*part))))
    return NULL;
  if (!(part->topic = strdup(topic)) || !(part->tq = pr__tq_new())) {
    free(part->topic);
    free(part);
    return NULL;
  }
  part->partition = p;
  part->eng = eng;
  pr__tracker_init(&part->tracker);
  part->head_off = -1;
  part->horizon = -1;
  return part;
}

void pr__part_free(part_t *part) {
  PR_ENGINE_THREAD(part->eng);
  pr__layers_part_free(part); /* defer's keys */
  for (size_t i = 0; part->buckets && i < part->nbuckets; i++) {
    kq_t *k = part->buckets[i], *next;
    for (; k; k = next) {
      next = k->next;
      pr__sched_unpin(&part->eng->sched, k->sk);
      free(k);
    }
  }
  free(part->buckets);
  pr__tq_free(part->tq);
  pr__slabs_free(part);
  pr__tq_free(part->tombs);
  pr__tq_free(part->clears);
  pr__tracker_fini(&part->tracker);
  free(part->topic);
  free(part);
}

/* Detaches a finished or released event from its key and partition. */
/* The last handler of a released partition finished: free it, and let a
 * live assignment of the same partition start its keys. */
void pr__part_zombie_done(pr__engine_t *eng, part_t *zombie) {
  PR_ENGINE_THREAD(eng);
  part_t **pp = &eng->zombies, *live;
  while (*pp && *pp != zombie)
    pp = &(*pp)->next;
  if (*pp)
    *pp = zombie->next;
  live = pr__part_find(eng, zombie->topic, zombie->partition);
  pr__part_free(zombie);
  if (!live || !live->held ||
      pr__part_zombie_find(eng, live->topic, live->partition))
    return;
  live->held = 0;
  if (live->revoking || eng->phase != PH_RUNNING)
    return;
  for (size_t b = 0; live->buckets && b < live->nbuckets; b++) {
    kq_t *kq = live->buckets[b], *knext;
    for (; kq; kq = knext) {
      /* scheduling may finish (and free) a dropped head */
      knext = kq->next;
      if (kq->head && kq->head->state == INV_QUEUED)
        pr__dispatch_schedule(kq->head);
    }
  }
}

/* Stores watermark + 1 of every partition that advanced (or `only`). */
void pr__part_store_offsets(pr__engine_t *eng, part_t *only) {
  PR_ENGINE_THREAD(eng);
  rd_kafka_topic_partition_list_t *list = NULL;
  for (part_t *part = eng->parts; part; part = part->next) {
    if (!part->dirty || (only && part != only))
      continue;
    if (!list)
      list = rd_kafka_topic_partition_list_new(8);
    rd_kafka_topic_partition_list_add(list, part->topic, part->partition)
        ->offset = part->tracker.commit;
    part->dirty = 0;
  }
  if (!list)
    return; /* never an empty list (librdkafka rule 3) */
  rd_kafka_offsets_store(eng->rk, list);
  for (int i = 0; i < list->cnt; i++)
    if (list->elems[i].err)
      PR_WARN("engine", "could not store offset %lld for %s[%d]: %s",
              (long long)list->elems[i].offset, list->elems[i].topic,
              list->elems[i].partition, rd_kafka_err2str(list->elems[i].err));
  rd_kafka_topic_partition_list_destroy(list);
}

/* Gives the partition its own queue: librdkafka forwards a partition's
 * fetch queue to the consumer queue unless the application set the
 * forwarding itself, which it keeps across fetch restarts. Done before
 * assign(), so that no record of the partition reaches the consumer queue.
 * The queue shares the consumer queue's wake-up pipe. */
void pr__part_queue_open(pr__engine_t *eng, part_t *part) {
  PR_ENGINE_THREAD(eng);
  part->rkq =
      rd_kafka_queue_get_partition(eng->rk, part->topic, part->partition);
  if (!part->rkq) {
    PR_WARN("engine",
            "%s[%d]: no partition queue; its records share the "
            "consumer queue (backpressure stops no other partition)",
            part->topic, part->partition);
    return;
  }
  rd_kafka_queue_forward(part->rkq, NULL);
  rd_kafka_queue_io_event_enable(part->rkq, eng->pipefd[1], "1", 1);
}

void pr__part_queue_close(part_t *part) {
  PR_ENGINE_THREAD(part->eng);
  if (!part->rkq)
    return;
  rd_kafka_queue_io_event_enable(part->rkq, -1, NULL, 0);
  rd_kafka_queue_destroy(part->rkq);
  part->rkq = NULL;
}

void pr__part_pause(pr__engine_t *eng, part_t *part, int pause) {
  PR_ENGINE_THREAD(eng);
  rd_kafka_topic_partition_list_t *list;
  rd_kafka_resp_err_t err;
  if (part->paused == pause || part->zombie || !eng->rk)
    return;
  if (!(list = rd_kafka_topic_partition_list_new(1)))
    return; /* no memory: it stays stopped (or paused) a while longer */
  rd_kafka_topic_partition_list_add(list, part->topic, part->partition);
  err = pause ? rd_kafka_pause_partitions(eng->rk, list)
              : rd_kafka_resume_partitions(eng->rk, list);
  if (!err)
    err = list->elems[0].err;
  rd_kafka_topic_partition_list_destroy(list); /* rule 9: never leaked */
  if (err) {
    PR_WARN("engine", "%s %s[%d]: %s", pause ? "pausing" : "resuming",
            part->topic, part->partition, rd_kafka_err2str(err));
    return;
  }
  part->paused = pause;
}

/* Unlinks `part`; frees it, or keeps it as a zombie while a handler of it
 * still runs. */
void pr__part_release(pr__engine_t *eng, part_t *part) {
  PR_ENGINE_THREAD(eng);
  part_t **pp = &eng->parts;
  while (*pp && *pp != part)
    pp = &(*pp)->next;
  if (*pp)
    *pp = part->next;
  /* Not left paused in librdkafka: the partition may come back to this
   * handle, as a part that knows nothing of it. */
  pr__part_pause(eng, part, 0);
  pr__part_queue_close(part);
  pr__firing_released(eng, part);
  if (part->invs > 0) {
    part->zombie = 1;
    part->next = eng->zombies;
    eng->zombies = part;
    /* Already cancelled: their timeouts have nothing left to do. */
    for (size_t b = 0; part->buckets && b < part->nbuckets; b++)
      for (kq_t *kq = part->buckets[b]; kq; kq = kq->next)
        if (kq->head)
          pr__inv_untime(kq->head);
    PR_WARN("engine", "%s[%d] released with %d handler(s) still running",
            part->topic, part->partition, part->invs);
  } else {
    pr__part_free(part);
  }
}

void pr__part_count(pr__engine_t *eng) {
  PR_ENGINE_THREAD(eng);
  int n = 0;
  for (part_t *part = eng->parts; part; part = part->next)
    n++;
  atomic_store(&eng->assigned, n);
}

void pr__part_check_stalls(pr__engine_t *eng) {
  PR_ENGINE_THREAD(eng);
  int64_t now = pr__now_ns();
  int stalled = 0;
  for (part_t *part = eng->parts; part; part = part->next) {
    int64_t oldest = pr__tracker_oldest(&part->tracker);
    if (oldest < 0) {
      part->head_off = -1;
      continue;
    }
    if (oldest != part->head_off) {
      part->head_off = oldest;
      part->head_since_ns = now;
    } else if (now - part->head_since_ns > eng->stall_ns) {
      stalled = 1;
    }
  }
  atomic_store(&eng->stalled, stalled);
}
