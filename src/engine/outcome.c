/*
 * outcome.c - what happens after an attempt: the mode's result layers
 * (retry with backoff, failure topic, log and skip), the retry timer, and
 * finishing an event (commit its offset, free it, start the key's next).
 *
 * Threads: the engine thread only.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* The event is done: commit its offset when `commit`, free it; returns the
 * key's next event if it may start now (pr__outcome_finish() starts it). */
inv_t *pr__outcome_finish_detach(inv_t *inv, int commit) {
  PR_ENGINE_THREAD(inv->eng);
  pr__engine_t *eng = inv->eng;
  part_t *part = inv->part;
  inv_t *next;
  /* A deferred event's entry (defer), a timer's store row (timers): the
   * layer's; else a message, whose offset is complete. */
  if (!pr__layers_end(inv, commit) && !inv->is_timer && commit &&
      pr__tracker_complete(&part->tracker, inv->msg.offset) > 0)
    part->dirty = 1;
  next = pr__kq_detach(inv);
  pr__inv_free(inv);
  if (part->zombie) {
    if (part->invs == 0)
      pr__part_zombie_done(eng, part);
    return NULL;
  }
  pr__bp_check(eng, part);
  return next && !part->revoking && !part->held && eng->phase == PH_RUNNING
             ? next
             : NULL;
}

void pr__outcome_count_duplicate(inv_t *inv) {
  PR_ENGINE_THREAD(inv->eng);
  char ev[160];
  PR_BUMP(inv->eng->metrics.skipped_duplicate, 1);
  PR_DEBUG("engine", "%s: a duplicate of one already handled; skipping it",
           pr__inv_describe(inv, ev, sizeof(ev)));
}

void pr__outcome_finish(inv_t *inv, int commit) {
  PR_ENGINE_THREAD(inv->eng);
  inv_t *next = pr__outcome_finish_detach(inv, commit);
  if (!next)
    return;
  if (next->state == INV_QUEUED)
    pr__dispatch_schedule(next);
  else if (next->state == INV_RUNNING && next->eng->timeout_ms > 0)
    pr__dispatch_time(next); /* claimed by the run: it runs now */
}

/* Full jitter: uniform in [0, min(2^n * base, max)). */
uint64_t pr__outcome_backoff_ms(pr__engine_t *eng, int n) {
  int64_t base = PR_CFG_MS(eng->st, RETRY_BASE);
  int64_t cap = PR_CFG_MS(eng->st, MAX_RETRY_DELAY);
  int64_t ceil = base;
  if (base <= 0)
    return 0;
  for (int i = 0; i < n && ceil < cap; i++)
    ceil *= 2;
  if (ceil > cap)
    ceil = cap;
  if (ceil <= 0)
    return 0;
  return (uint64_t)(((uint64_t)rand_r(&eng->seed) << 16 ^
                     (uint64_t)rand_r(&eng->seed)) %
                    (uint64_t)ceil);
}

static void on_retry(uv_timer_t *t);

void pr__outcome_arm_retry(inv_t *inv, uint64_t ms) {
  PR_ENGINE_THREAD(inv->eng);
  if (pr__inv_timer_start(inv, ms, on_retry))
    pr__dispatch_schedule(inv); /* no timer: try again at once */
}

int pr__outcome_retry_fired(inv_t *inv) {
  PR_ENGINE_THREAD(inv->eng);
  pr__inv_timer_close(&inv->timer);
  if (inv->eng->phase == PH_RUNNING && !inv->part->revoking)
    return 0;
  pr__outcome_finish(inv, 0);
  return 1;
}

static void on_retry(uv_timer_t *t) {
  inv_t *inv = t->data;
  if (!pr__outcome_retry_fired(inv))
    pr__dispatch_schedule(inv);
}

static void decided(inv_t *inv, pr__verdict_t v, const pr__layer_t *by);

/* The mode's layers decide; then that is carried out. */
static void decide(inv_t *inv) {
  const pr__layer_t *by = NULL;
  pr__verdict_t v = pr__layers_decide(inv, &by);
  decided(inv, v, by);
}

void pr__outcome_fail(inv_t *inv, prosody_result_t result, const char *why) {
  PR_ENGINE_THREAD(inv->eng);
  char *copy = why ? strdup(why) : NULL;
  inv->result = result;
  if (copy) {
    free(inv->result_error);
    inv->result_error = copy;
  }
  decide(inv);
}

void pr__outcome_reject(inv_t *inv, const char *why) {
  PR_ENGINE_THREAD(inv->eng);
  pr__inv_release_rkm(inv); /* its headers: the failure topic's, a defer's */
  inv->attempt++;
  inv->result = PROSODY_TRANSIENT;
  free(inv->result_error);
  inv->result_error = strdup(why);
  decide(inv);
}

/* A handler attempt finished (engine thread): free its slot, then let the
 * mode's layers decide. */
void pr__outcome_mail(pr__mail_t *mail, void *owner) {
  (void)owner;
  pr__outcome_handler_done(PR_CONTAINER_OF(mail, inv_t, mail));
}

void pr__outcome_handler_done(inv_t *inv) {
  PR_ENGINE_THREAD(inv->eng);
  pr__engine_t *eng = inv->eng;

  inv->part->active--;
  pr__inv_untime(inv);
  if (inv->kq) { /* its handler time counts against its key and class */
    int64_t now = pr__now_ns();
    pr__sched_charge(&eng->sched, inv->kq->sk,
                     inv->attempt > 1 ? PR_SCHED_FAILURE : PR_SCHED_NORMAL,
                     inv->run_ns, now);
    pr__sched_busy(&eng->sched, inv->kq->sk, now - inv->run_ns, now);
  }
  if (inv->cslot) { /* the attempt is over: its context goes stale */
    pr__ctx_release(&eng->ctx_stash, inv->cslot);
    inv->cslot = NULL;
  }
  if (inv->run_end) { /* its worker is free: one run, one limiter slot */
    eng->running--;
    pr__dispatch_run_ended(inv);
    pr__dispatch_start_ready(eng);
  }

  if (inv->skip_dup) {
    pr__outcome_count_duplicate(inv);
    pr__outcome_finish(inv, 1);
    return;
  }
  if (inv->skip) {
    char what[160];
    if (inv->skip_warn)
      PR_BUMP(eng->metrics.skipped_undecodable, 1);
    else
      PR_BUMP(eng->metrics.skipped_filtered, 1);
    if (inv->skip_warn)
      PR_WARN("engine",
              "skipping undecodable record %s: %s; committing past it",
              pr__inv_describe(inv, what, sizeof(what)), inv->skip);
    else
      PR_DEBUG("engine", "skipping %s: %s",
               pr__inv_describe(inv, what, sizeof(what)), inv->skip);
    pr__outcome_finish(inv, 1);
    return;
  }
  PR_BUMP(eng->metrics.calls[inv->is_timer != 0]
                            [inv->result == PROSODY_SUCCESS     ? 0
                             : inv->result == PROSODY_PERMANENT ? 2
                                                                : 1],
          1);
  pr__hist_observe(&eng->metrics.handler_time, inv->run_ns);
  if (!inv->emitted) /* else its worker did (complete_attempt) */
    pr__inv_emit_ran(inv);
  pr__layers_ran(inv);
  decide(inv);
}

/* Carries out the layers' verdict on an attempt's result. */
static void decided(inv_t *inv, pr__verdict_t v, const pr__layer_t *by) {
  pr__engine_t *eng = inv->eng;
  if (v != V_COMMIT)
    pr__layers_drop(inv); /* a failed attempt's writes vanish */
  switch (v) {
  case V_RETRY:
    PR_BUMP(eng->metrics.retries, 1);
    inv->state = INV_RETRY_WAIT;
    pr__outcome_arm_retry(inv, pr__outcome_backoff_ms(eng, inv->attempt));
    return;
  case V_DEAD:
  case V_DEFER:
    by->take(inv); /* the failure topic's send, the deferral */
    return;
  case V_ABORT:
    pr__outcome_finish(inv, 0);
    return;
  default:
    if (inv->result == PROSODY_SUCCESS && pr__layers_settle(inv))
      return; /* pr__outcome_committed once its keyed state is stored */
    pr__layers_drop(inv);
    pr__outcome_committed(inv);
    return;
  }
}

void pr__outcome_committed(inv_t *inv) {
  PR_ENGINE_THREAD(inv->eng);
  if (inv->result == PROSODY_SUCCESS || inv->result == PROSODY_PERMANENT)
    pr__layers_done(inv); /* handled (dedup: a duplicate is skipped from
                             now on) */
  if (pr__layers_commit(inv))
    return; /* a fired timer: finishes once the store has deleted it */
  pr__outcome_finish(inv, 1);
}
