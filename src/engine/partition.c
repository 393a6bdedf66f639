/*
 * partition.c - assigned partitions, their key queues, offsets and
 * commits, zombies and the stall check.
 *
 * Threads: the engine thread only.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

part_t *pr__part_find(pr__engine_t *eng, const char *topic, int32_t p) {
  PR_ENGINE_THREAD(eng);
  for (part_t *part = eng->parts; part; part = part->next)
    if (part->partition == p && !strcmp(part->topic, topic))
      return part;
  return NULL;
}

kq_t *pr__kq_get(part_t *part, const char *key, int create) {
  PR_ENGINE_THREAD(part->eng);
  uint64_t h = pr__fnv1a_str(key);
  kq_t *kq;
  if (!part->buckets) {
    if (!create)
      return NULL;
    part->nbuckets = 64;
    part->buckets = calloc(part->nbuckets, sizeof(kq_t *));
    if (!part->buckets)
      return NULL;
  }
  for (kq = part->buckets[h % part->nbuckets]; kq; kq = kq->next)
    if (!strcmp(kq->key, key)) {
      kq->idle = 0;
      return kq;
    }
  if (!create)
    return NULL;
  if (part->nkeys >= part->nbuckets * 2) { /* grow the table */
    size_t n = part->nbuckets * 4;
    kq_t **b = calloc(n, sizeof(kq_t *));
    if (b) {
      for (size_t i = 0; i < part->nbuckets; i++) {
        kq_t *k = part->buckets[i], *next;
        for (; k; k = next) {
          next = k->next;
          k->next = b[pr__fnv1a_str(k->key) % n];
          b[pr__fnv1a_str(k->key) % n] = k;
        }
      }
      free(part->buckets);
      part->buckets = b;
      part->nbuckets = n;
    }
  }
  {
    size_t len = strlen(key);
    if (!(kq = calloc(1, sizeof(*kq) + len + 1)))
      return NULL;
    kq->key = (char *)(kq + 1);
    memcpy(kq->key, key, len + 1);
  }
  if (!(kq->sk = pr__sched_pin(&part->eng->sched, part->topic, part->partition,
                               key))) {
    free(kq);
    return NULL;
  }
  kq->next = part->buckets[h % part->nbuckets];
  part->buckets[h % part->nbuckets] = kq;
  part->nkeys++;
  return kq;
}

void pr__kq_remove(part_t *part, kq_t *kq) {
  PR_ENGINE_THREAD(part->eng);
  kq_t **pp = &part->buckets[pr__fnv1a_str(kq->key) % part->nbuckets];
  while (*pp && *pp != kq)
    pp = &(*pp)->next;
  if (*pp)
    *pp = kq->next;
  part->nkeys--;
  pr__sched_unpin(&part->eng->sched, kq->sk);
  free(kq);
}

/* The tick's pass over the live partitions' key queues (engine thread,
 * every poll_interval): every waiting event lets go of its librdkafka
 * message (pr__inv_release_rkm; a running one, started or claimed by a
 * run, is its worker's: not touched), and a queue that has stayed empty
 * since the last tick is removed (pr__kq_detach keeps emptied ones for
 * reuse). */
void pr__part_tick_keys(pr__engine_t *eng) {
  PR_ENGINE_THREAD(eng);
  for (part_t *part = eng->parts; part; part = part->next) {
    for (size_t b = 0; part->buckets && b < part->nbuckets; b++) {
      kq_t **pp = &part->buckets[b], *kq;
      while ((kq = *pp)) {
        if (kq->head || kq->dk[0] || kq->dk[1]) {
          kq->idle = 0;
          /* The state first: a running event's rkm is its worker's. */
          for (inv_t *inv = kq->head; inv; inv = inv->next)
            if (inv->state != INV_RUNNING && inv->rkm)
              pr__inv_release_rkm(inv);
        } else if (kq->idle) {
          *pp = kq->next; /* pr__kq_remove, without the hash */
          part->nkeys--;
          pr__sched_unpin(&eng->sched, kq->sk);
          free(kq);
          continue;
        } else {
          kq->idle = 1;
        }
        pp = &kq->next;
      }
    }
  }
}

void pr__kq_trim(part_t *part, kq_t *kq) {
  PR_ENGINE_THREAD(part->eng);
  if (!kq->head && !kq->dk[0] && !kq->dk[1])
    pr__kq_remove(part, kq);
}

void pr__kq_unlink(inv_t *inv) {
  PR_ENGINE_THREAD(inv->eng);
  kq_t *kq = inv->kq;
  inv_t **pp, *prev = NULL;
  if (!kq)
    return;
  for (pp = &kq->head; *pp && *pp != inv; pp = &(*pp)->next)
    prev = *pp;
  if (*pp) {
    *pp = inv->next;
    if (kq->tail == inv)
      kq->tail = prev;
  }
  inv->next = NULL;
  inv->kq = NULL;
}

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
inv_t *pr__kq_detach(inv_t *inv) {
  PR_ENGINE_THREAD(inv->eng);
  part_t *part = inv->part;
  kq_t *kq = inv->kq;
  inv_t *next = NULL;
  if (kq && kq->head == inv) {
    kq->head = inv->next;
    if (!kq->head)
      kq->tail = NULL;
    next = kq->head;
    /* An emptied queue stays for the key's next event until the tick
     * trims it (pr__part_tick_keys): most keys come back within a tick,
     * and a queue costs an allocation and a scheduler pin. Released
     * partitions and a draining engine trim at once. */
    if (part->revoking || part->zombie || part->eng->phase != PH_RUNNING)
      pr__kq_trim(part, kq);
  }
  part->invs--;
  return next;
}

part_t *pr__part_zombie_find(pr__engine_t *eng, const char *topic, int32_t p) {
  PR_ENGINE_THREAD(eng);
  for (part_t *z = eng->zombies; z; z = z->next)
    if (z->partition == p && !strcmp(z->topic, topic))
      return z;
  return NULL;
}

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
          pr__dispatch_untime(kq->head);
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
