/*
 * drain.c - shutdown and revoke: release events that are not running,
 * cancel running handlers at 80% of shutdown_timeout, give up at 100%.
 *
 * Threads: the engine thread (outside the loop, e.g. inside a rebalance
 * callback).
 */
#include <time.h>

#include "defer.h"
#include "internal.h"

/* Releases every event of `part` (NULL: all partitions) that is not
 * running: not started, ready, waiting for a retry, or deferred and
 * waiting to be written again. */
void pr__drain_release_idle(pr__engine_t *eng, part_t *only) {
  PR_ENGINE_THREAD(eng);
  pr__dispatch_ready_remove(eng, only);
  for (part_t *part = eng->parts; part; part = part->next) {
    if (only && part != only)
      continue;
    pr__df_release_waiting(part);
    for (size_t b = 0; part->buckets && b < part->nbuckets; b++) {
      kq_t *kq = part->buckets[b];
      while (kq) {
        kq_t *knext = kq->next;
        inv_t *inv = kq->head, *keep = NULL;
        /* The head may be running (or in a failure-topic send or a fired
         * timer's store delete, with no retry timer pending), and the
         * events its run claimed behind it belong to the run's worker;
         * everything else is released without commit. */
        if (inv && (inv->state == INV_RUNNING ||
                    (inv->state == INV_DLQ && !inv->timer))) {
          keep = inv;
          while (keep->next && keep->next->state == INV_RUNNING) {
            keep = keep->next; /* the run does not start it any more */
            atomic_store(&keep->released, 1);
          }
          inv = keep->next;
          keep->next = NULL;
          kq->tail = keep;
        } else {
          kq->head = kq->tail = NULL;
        }
        while (inv) {
          inv_t *n = inv->next;
          part->invs--;
          pr__inv_free(inv);
          inv = n;
        }
        pr__kq_trim(part, kq);
        kq = knext;
      }
    }
  }
}

static void cancel_running(pr__engine_t *eng, int revoking_only) {
  for (part_t *part = eng->parts; part; part = part->next) {
    if (revoking_only && !part->revoking)
      continue;
    for (size_t b = 0; part->buckets && b < part->nbuckets; b++)
      for (kq_t *kq = part->buckets[b]; kq; kq = kq->next)
        for (inv_t *inv = kq->head; inv && inv->state == INV_RUNNING;
             inv = inv->next) /* the head and what its run claimed */
          pr__dispatch_cancel(inv);
  }
}

/* Waits for running handlers (of revoking partitions, or all), cancelling
 * them at 80% of shutdown_timeout and giving up at 100%. Runs on the
 * engine thread outside the loop (e.g. inside a rebalance callback). */
void pr__drain_wait(pr__engine_t *eng, int revoking_only) {
  PR_ENGINE_THREAD(eng);
  int64_t start = pr__now_ns();
  int64_t cancel_at = start + eng->shutdown_ms * 800000;
  int64_t end = start + eng->shutdown_ms * 1000000;
  int cancelled = 0;

  /* Outside the loop: its prepare/check handles do not run here. */
  eng->may_wake = 1;
  if (eng->pool)
    pr__pool_kick(eng->pool);
  for (;;) {
    int64_t now = pr__now_ns(), wake_at;
    struct timespec ts;
    int pending = 0;
    for (part_t *part = eng->parts; part; part = part->next)
      if (part->active > 0 && (!revoking_only || part->revoking))
        pending = 1;
    if (!pending)
      return;
    if (!cancelled && now >= cancel_at) {
      PR_INFO("engine", "cancelling running handlers (%s)",
              revoking_only ? "partitions revoked" : "shutting down");
      cancel_running(eng, revoking_only);
      cancelled = 1;
    }
    if (now >= end) {
      PR_ERROR("engine",
               "handlers still running after shutdown_timeout; giving up on "
               "them (their events are redelivered later)");
      return;
    }
    wake_at = cancelled ? end : cancel_at;
    if (wake_at - now > 50000000)
      wake_at = now + 50000000;
    pr__deadline_after(CLOCK_REALTIME, wake_at - now, &ts);
    pr__mailbox_wait(&eng->mb, &ts);
    /* Completions, store results (e.g. fired timers' deletes) and timer
     * operations: refused for what drains, served for the rest. */
    pr__mailbox_deliver(&eng->mb);
    eng->may_wake = 1; /* outside the loop: no check handle runs */
    if (eng->pool)
      pr__pool_kick(eng->pool);
  }
}
