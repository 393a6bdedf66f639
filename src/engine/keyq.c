/*
 * keyq.c - finding partitions, and the key queues of a partition: the
 * per-partition hash of kq_t, each key's FIFO of events, and the tick's
 * trim of queues left empty. Lookups and list surgery only: it calls no
 * other engine file but the scheduler's pins and message.c's
 * pr__inv_release_rkm, so every layer may call it (partition.c keeps a
 * partition's lifecycle: assignment, commits, release, zombies).
 *
 * Threads: the engine thread only.
 */
#include <stdlib.h>
#include <string.h>

#include "defer.h"
#include "internal.h"

/* `topic`[p] in a list of partitions (the live ones, or the zombies). */
static part_t *find_in(part_t *list, const char *topic, int32_t p) {
  for (part_t *part = list; part; part = part->next)
    if (part->partition == p && !strcmp(part->topic, topic))
      return part;
  return NULL;
}

part_t *pr__part_find(pr__engine_t *eng, const char *topic, int32_t p) {
  PR_ENGINE_THREAD(eng);
  return find_in(eng->parts, topic, p);
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
        if (kq->head || pr__df_holds(kq)) {
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
  if (!kq->head && !pr__df_holds(kq))
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
  return find_in(eng->zombies, topic, p);
}
