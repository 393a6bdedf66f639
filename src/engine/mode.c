/*
 * mode.c - the modes as tables of layers (layer.h), the result layers that
 * only decide, and running a hook over the mode's table.
 *
 * From the handler outwards, on the way out each layer sees the attempt's
 * result and either passes it on (V_NEXT) or decides (docs/ARCHITECTURE.md
 * section 3e); on the way in, before an event starts, the layers with an
 * admit hook decide whether it runs. The invocation side (limiter,
 * timeout, handler) is dispatch.c's.
 *
 *   pipeline     success, terminal, dedup, monopolization, defer,
 *                retry without limit (permanent: log and skip)
 *   low-latency  success, terminal, retry up to max_retries, failure topic
 *   best-effort  success, terminal, log and skip
 *
 * Keyed state comes first in each (its settle stores the attempt's
 * writes), and durable timers last (they decide nothing; a fired timer is
 * committed by its delete).
 *
 * Threads: the engine thread only.
 */
#include "internal.h"

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

static const pr__layer_t layer_success = {.name = "success",
                                          .decide = l_success};
static const pr__layer_t layer_terminal = {.name = "terminal",
                                           .decide = l_terminal};
static const pr__layer_t layer_retry_capped = {.name = "retry",
                                               .decide = l_retry_capped};
static const pr__layer_t layer_failure_topic = {
    .name = "failure topic", .decide = l_failure_topic, .take = pr__dlq_send};
static const pr__layer_t layer_retry_unbounded = {.name = "retry",
                                                  .decide = l_retry_unbounded};
static const pr__layer_t layer_log_skip = {.name = "log and skip",
                                           .decide = l_log_skip};

/* The timers layer comes last: it decides nothing, and a deferred timer
 * is defer's (its `end` and `commit` come first). */
static const pr__layer_t *const pipeline[] = {
    &pr__layer_state,       &layer_success,      &layer_terminal,
    &pr__layer_dedup,       &pr__layer_monopoly, &pr__layer_defer,
    &layer_retry_unbounded, &pr__layer_timers,   NULL};
static const pr__layer_t *const low_latency[] = {&pr__layer_state,
                                                 &layer_success,
                                                 &layer_terminal,
                                                 &layer_retry_capped,
                                                 &layer_failure_topic,
                                                 &pr__layer_timers,
                                                 NULL};
static const pr__layer_t *const best_effort[] = {
    &pr__layer_state, &layer_success,    &layer_terminal,
    &layer_log_skip,  &pr__layer_timers, NULL};

const pr__layer_t *const *pr__mode_layers(int mode) {
  return mode == PR_MODE_LOW_LATENCY   ? low_latency
         : mode == PR_MODE_BEST_EFFORT ? best_effort
                                       : pipeline;
}

#define EACH(eng, l) for (const pr__layer_t *const *l = (eng)->layers; *l; l++)

prosody_err_t pr__layers_open(pr__engine_t *eng, const char *bootstrap,
                              char *errstr, size_t errstr_size) {
  prosody_err_t err;
  PR_ENGINE_THREAD(eng);
  EACH(eng, l)
  if ((*l)->open && (err = (*l)->open(eng, bootstrap, errstr, errstr_size)))
    return err;
  return PROSODY_OK;
}

int pr__layers_hold(inv_t *inv) {
  PR_ENGINE_THREAD(inv->eng);
  EACH(inv->eng, l)
  if ((*l)->hold && (*l)->hold(inv))
    return 1;
  return 0;
}

void pr__layers_intake(inv_t *inv) {
  PR_ENGINE_THREAD(inv->eng);
  EACH(inv->eng, l)
  if ((*l)->intake)
    (*l)->intake(inv);
}

int pr__layers_admit(inv_t *inv) {
  int a;
  PR_ENGINE_THREAD(inv->eng);
  EACH(inv->eng, l)
  if ((*l)->admit && (a = (*l)->admit(inv)) != PR_ADMIT_RUN)
    return a;
  return PR_ADMIT_RUN;
}

int pr__layers_claimable(inv_t *head, inv_t *f) {
  PR_ENGINE_THREAD(head->eng);
  EACH(head->eng, l)
  if ((*l)->claimable && !(*l)->claimable(head, f))
    return 0;
  return 1;
}

void pr__layers_completed(inv_t *inv, prosody_result_t result) {
  /* Any thread: the table is immutable while the engine runs. */
  EACH(inv->eng, l)
  if ((*l)->completed)
    (*l)->completed(inv, result);
}

void pr__layers_ran(inv_t *inv) {
  PR_ENGINE_THREAD(inv->eng);
  EACH(inv->eng, l)
  if ((*l)->ran)
    (*l)->ran(inv);
}

pr__verdict_t pr__layers_decide(inv_t *inv, const pr__layer_t **by) {
  pr__verdict_t v;
  PR_ENGINE_THREAD(inv->eng);
  EACH(inv->eng, l)
  if ((*l)->decide && (v = (*l)->decide(inv)) != V_NEXT) {
    if (by)
      *by = *l;
    return v;
  }
  return V_COMMIT;
}

int pr__layers_settle(inv_t *inv) {
  PR_ENGINE_THREAD(inv->eng);
  EACH(inv->eng, l)
  if ((*l)->settle && (*l)->settle(inv))
    return 1;
  return 0;
}

void pr__layers_drop(inv_t *inv) {
  PR_ENGINE_THREAD(inv->eng);
  EACH(inv->eng, l)
  if ((*l)->drop)
    (*l)->drop(inv);
}

void pr__layers_done(inv_t *inv) {
  PR_ENGINE_THREAD(inv->eng);
  EACH(inv->eng, l)
  if ((*l)->done)
    (*l)->done(inv);
}

int pr__layers_commit(inv_t *inv) {
  PR_ENGINE_THREAD(inv->eng);
  EACH(inv->eng, l)
  if ((*l)->commit && (*l)->commit(inv))
    return 1;
  return 0;
}

int pr__layers_end(inv_t *inv, int commit) {
  PR_ENGINE_THREAD(inv->eng);
  EACH(inv->eng, l)
  if ((*l)->end && (*l)->end(inv, commit))
    return 1;
  return 0;
}

void pr__layers_forget(inv_t *inv) {
  if (!inv->eng || !inv->eng->layers)
    return;
  PR_ENGINE_THREAD(inv->eng);
  EACH(inv->eng, l)
  if ((*l)->forget)
    (*l)->forget(inv);
}

void pr__layers_part_free(part_t *part) {
  PR_ENGINE_THREAD(part->eng);
  if (!part->eng->layers)
    return;
  EACH(part->eng, l)
  if ((*l)->on_free)
    (*l)->on_free(part);
}

int pr__layers_timer_loaded(part_t *part, const char *key, int type,
                            int64_t time_s) {
  PR_ENGINE_THREAD(part->eng);
  EACH(part->eng, l)
  if ((*l)->timer_loaded && (*l)->timer_loaded(part, key, type, time_s))
    return 1;
  return 0;
}

void pr__layers_unscheduled(part_t *part, const char *key, int64_t time_s) {
  PR_ENGINE_THREAD(part->eng);
  EACH(part->eng, l)
  if ((*l)->unscheduled)
    (*l)->unscheduled(part, key, time_s);
}

void pr__layers_assign(pr__engine_t *eng, part_t *part) {
  PR_ENGINE_THREAD(eng);
  EACH(eng, l)
  if ((*l)->on_assign)
    (*l)->on_assign(eng, part);
}

void pr__layers_tick(pr__engine_t *eng) {
  PR_ENGINE_THREAD(eng);
  EACH(eng, l)
  if ((*l)->on_tick)
    (*l)->on_tick(eng);
}

void pr__layers_close(pr__engine_t *eng, int final) {
  PR_ENGINE_THREAD(eng);
  if (!eng->layers)
    return;
  EACH(eng, l)
  if ((*l)->close)
    (*l)->close(eng, final);
}
