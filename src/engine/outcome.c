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
  if (inv->df_loaded) /* committed (or deleted) when it was deferred */
    pr__df_finished(inv, commit);
  else if (inv->is_timer)
    pr__firing_finished(inv, commit);
  else if (commit && pr__tracker_complete(&part->tracker, inv->msg.offset) > 0)
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
  pr__inv_timer_close(&inv->timer);
  inv->timer = malloc(sizeof(uv_timer_t));
  if (!inv->timer) { /* no timer: try again at once */
    if (inv->state == INV_DLQ && inv->is_timer)
      pr__firing_delete(inv);
    else if (inv->state == INV_DLQ)
      pr__dlq_send(inv);
    else if (inv->state == INV_DEFERRING)
      pr__df_write(inv);
    else
      pr__dispatch_schedule(inv);
    return;
  }
  uv_timer_init(&inv->eng->loop, inv->timer);
  inv->timer->data = inv;
  uv_timer_start(inv->timer, on_retry, ms, 0);
}

static void on_retry(uv_timer_t *t) {
  inv_t *inv = t->data;
  /* It fired: from now on a timer means a retry is pending (the drain keeps
   * a failure-topic send or timer delete in flight, and releases one that
   * waits for its retry). */
  pr__inv_timer_close(&inv->timer);
  if (inv->state == INV_DEFERRING) {
    pr__df_write(inv); /* gives up itself when released */
    return;
  }
  if (inv->eng->phase != PH_RUNNING || inv->part->revoking) {
    pr__outcome_finish(inv, 0); /* released: redelivered later */
    return;
  }
  if (inv->state == INV_DLQ && inv->is_timer)
    pr__firing_delete(inv); /* a fired timer's delete failed */
  else if (inv->state == INV_DLQ)
    pr__dlq_send(inv);
  else
    pr__dispatch_schedule(inv);
}

static const char *mode_name(int mode) {
  return mode == PR_MODE_LOW_LATENCY   ? "low-latency"
         : mode == PR_MODE_BEST_EFFORT ? "best-effort"
                                       : "pipeline";
}

static void log_failure(inv_t *inv, const char *what) {
  char ev[160];
  PR_WARN("engine", "%s: %s handler failure (attempt %d, %s mode): %s; %s",
          pr__inv_describe(inv, ev, sizeof(ev)),
          inv->result == PROSODY_PERMANENT ? "permanent" : "transient",
          inv->attempt, mode_name(inv->eng->mode),
          inv->result_error ? inv->result_error : "(no message)", what);
}

/*
 * Result layers (docs/ARCHITECTURE.md section 3e). A mode is a list of
 * small layers, from the handler outwards; on the way out each layer sees
 * the attempt's result and either passes it on (V_NEXT) or decides. The
 * invocation side (limiter, timeout, handler) is dispatch.c's; dedup,
 * defer, monopolization and telemetry join these lists as further layers.
 */
typedef struct layer {
  const char *name;
  pr__verdict_t (*complete)(inv_t *inv);
} layer_t;

/* Success is final in every mode. */
static pr__verdict_t l_success(inv_t *inv) {
  return inv->result == PROSODY_SUCCESS ? V_COMMIT : V_NEXT;
}

/* Shutdown, revoke or a released partition make any failure terminal. */
static pr__verdict_t l_terminal(inv_t *inv) {
  char ev[160];
  if (inv->eng->phase == PH_RUNNING && !inv->part->revoking &&
      !inv->part->zombie)
    return V_NEXT;
  PR_DEBUG("engine", "%s aborted by shutdown/revoke",
           pr__inv_describe(inv, ev, sizeof(ev)));
  return V_ABORT;
}

/* low-latency: transient failures retried up to max_retries. */
static pr__verdict_t l_retry_capped(inv_t *inv) {
  if (inv->result == PROSODY_TRANSIENT &&
      inv->attempt <= PR_CFG_INT(inv->eng->st, MAX_RETRIES))
    return V_RETRY;
  return V_NEXT;
}

/* low-latency: what is still failing goes to the failure topic; a timer
 * never does: it is dropped. */
static pr__verdict_t l_failure_topic(inv_t *inv) {
  if (inv->is_timer) {
    log_failure(inv, "dropping the timer");
    return V_COMMIT;
  }
  log_failure(inv, "sending it to the failure topic");
  return V_DEAD;
}

/* pipeline: a transient failure (message or timer) is deferred (defer.c)
 * while the failure rate allows; a deferred event loaded again always is. Else
 * it falls through to the retry layer, which retries it in place. */
static pr__verdict_t l_defer(inv_t *inv) {
  pr__engine_t *eng = inv->eng;
  int64_t now;
  if (inv->result != PROSODY_TRANSIENT || !eng->df_store[PR_DF_KIND(inv)])
    return V_NEXT;
  if (inv->df_loaded || pr__df_gate(eng, now = pr__now_ns()))
    return V_DEFER;
  if (now - eng->df_warned_ns > INT64_C(10000000000)) {
    eng->df_warned_ns = now;
    PR_WARN("defer",
            "more than defer_failure_threshold of recent results are "
            "failures: deferral pauses and failures are retried in place "
            "(their partitions wait)");
  }
  return V_NEXT;
}

/* pipeline: transient failures retried without limit; permanent ones are
 * logged and committed past. */
static pr__verdict_t l_retry_unbounded(inv_t *inv) {
  if (inv->result == PROSODY_PERMANENT) {
    log_failure(inv, "skipping it");
    return V_COMMIT;
  }
  if (inv->attempt == 1 || inv->attempt % 10 == 0)
    log_failure(inv, "retrying");
  return V_RETRY;
}

/* best-effort: any failure is logged and committed past. */
static pr__verdict_t l_log_skip(inv_t *inv) {
  log_failure(inv, "skipping it");
  return V_COMMIT;
}

#define LAYER(fn)                                                              \
  { #fn, fn }
static const layer_t pipeline_layers[] = {LAYER(l_success),
                                          LAYER(l_terminal),
                                          LAYER(l_defer),
                                          LAYER(l_retry_unbounded),
                                          {0, 0}};
static const layer_t low_latency_layers[] = {LAYER(l_success),
                                             LAYER(l_terminal),
                                             LAYER(l_retry_capped),
                                             LAYER(l_failure_topic),
                                             {0, 0}};
static const layer_t best_effort_layers[] = {
    LAYER(l_success), LAYER(l_terminal), LAYER(l_log_skip), {0, 0}};

static const layer_t *mode_layers(int mode) {
  return mode == PR_MODE_LOW_LATENCY   ? low_latency_layers
         : mode == PR_MODE_BEST_EFFORT ? best_effort_layers
                                       : pipeline_layers;
}

/* What the mode's layers decide about the attempt's result (V_COMMIT when
 * none decides). Logs, but changes nothing. */
pr__verdict_t pr__outcome_decide(inv_t *inv) {
  PR_ENGINE_THREAD(inv->eng);
  pr__verdict_t v = V_COMMIT;
  for (const layer_t *l = mode_layers(inv->eng->mode); l->complete; l++)
    if ((v = l->complete(inv)) != V_NEXT)
      break;
  return v == V_NEXT ? V_COMMIT : v;
}

static void decided(inv_t *inv, pr__verdict_t v);

void pr__outcome_reject(inv_t *inv, const char *why) {
  PR_ENGINE_THREAD(inv->eng);
  pr__inv_release_rkm(inv); /* its headers: the failure topic's, a defer's */
  inv->attempt++;
  inv->result = PROSODY_TRANSIENT;
  free(inv->result_error);
  inv->result_error = strdup(why);
  decided(inv, pr__outcome_decide(inv));
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
  pr__dispatch_untime(inv);
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
    pr__dd_skipped(inv);
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
  pr__df_count(eng, inv->result, pr__now_ns());
  decided(inv, pr__outcome_decide(inv));
}

/* Carries out the layers' verdict on an attempt's result. */
static void decided(inv_t *inv, pr__verdict_t v) {
  pr__engine_t *eng = inv->eng;
  switch (v) {
  case V_RETRY:
    PR_BUMP(eng->metrics.retries, 1);
    inv->state = INV_RETRY_WAIT;
    pr__outcome_arm_retry(inv, pr__outcome_backoff_ms(eng, inv->attempt));
    return;
  case V_DEAD:
    pr__dlq_send(inv);
    return;
  case V_DEFER:
    pr__df_defer(inv);
    return;
  case V_ABORT:
    pr__outcome_finish(inv, 0);
    return;
  default:
    if (inv->dd == DD_UNSEEN &&
        (inv->result == PROSODY_SUCCESS || inv->result == PROSODY_PERMANENT))
      pr__dd_record(inv); /* handled: a duplicate is skipped from now on
                             (DD_RECORDED: by its worker already) */
    if (inv->is_timer && !inv->rearmed && eng->store && !inv->df_loaded) {
      pr__firing_delete(inv); /* finishes once the store has deleted it */
      return;
    }
    pr__outcome_finish(inv, 1);
    return;
  }
}
