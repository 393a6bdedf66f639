/*
 * monopoly.c - the monopolization layer (pipeline mode): a key that used
 * more than monopolization_threshold of the handlers' time over the last
 * monopolization_window is refused with a transient error, so its
 * partition's other keys get their turn. Its per-key handler time lives in
 * the scheduler's key states (scheduler.c), which the engine sizes for it.
 *
 * Threads: the engine thread only (open: the engine's owner before it
 * starts).
 */
#include <stdio.h>
#include <stdlib.h>

#include "internal.h"

/* The layer's state (eng->mono): made by its open hook when the layer is on,
 * freed by its close(final 1); eng->mono NULL: the layer is off. Immutable
 * once open. */
struct pr__mono_state {
  double threshold; /* monopolization_threshold: the share of the window's
                       handler time above which a key is refused (> 0) */
};

size_t pr__mono_keys(const pr__settings_t *st, int mode) {
  if (mode != PR_MODE_PIPELINE || !PR_CFG_BOOL(st, MONOPOLIZATION_ENABLED))
    return 0;
  return (size_t)PR_CFG_INT(st, MONOPOLIZATION_CACHE_SIZE);
}

/* Is the event's key over its share? Then it is refused (pr__outcome_reject:
 * the mode's layers decide, as for a handler's transient failure). */
static int monopolized(inv_t *inv) {
  pr__engine_t *eng = inv->eng;
  double share;
  char why[256], window[32];
  double threshold = eng->mono->threshold;
  if (!pr__sched_may_exceed(&eng->sched, inv->kq->sk, threshold))
    return 0; /* the common case, without the window's sum nor the clock */
  share = pr__sched_share(&eng->sched, inv->kq->sk, pr__now_ns());
  if (share <= threshold)
    return 0;
  PR_BUMP(eng->metrics.rejected_monopoly, 1);
  pr__duration_format(PR_CFG_NS(eng->st, MONOPOLIZATION_WINDOW), window,
                      sizeof(window));
  snprintf(why, sizeof(why),
           "key \"%.64s\" monopolizes its handlers: it used %.1f%% of the "
           "last %s, above monopolization_threshold %.1f%%",
           inv->msg.key, share * 100, window, threshold * 100);
  pr__outcome_reject(inv, why);
  return 1;
}

static int admit(inv_t *inv) {
  if (inv->eng->mono && monopolized(inv))
    return PR_ADMIT_TAKEN; /* rejected: retried later */
  return PR_ADMIT_RUN;
}

/* On in pipeline mode with monopolization_enabled: keeps the threshold,
 * and the scheduler keeps each key's handler time over the window. */
static prosody_err_t open_layer(pr__engine_t *eng, const char *bootstrap,
                                char *errstr, size_t errstr_size) {
  const pr__settings_t *st = eng->st;
  double threshold = PR_CFG_FLOAT(st, MONOPOLIZATION_THRESHOLD);
  (void)bootstrap;
  if (eng->mode != PR_MODE_PIPELINE ||
      !PR_CFG_BOOL(st, MONOPOLIZATION_ENABLED) || !(threshold > 0))
    return PROSODY_OK;
  if (!(eng->mono = calloc(1, sizeof(*eng->mono)))) {
    pr__errf(errstr, errstr_size, "out of memory");
    return PROSODY_ERR_NOMEM;
  }
  eng->mono->threshold = threshold;
  eng->sched.window_ns = PR_CFG_NS(st, MONOPOLIZATION_WINDOW);
  return PROSODY_OK;
}

static void close_layer(pr__engine_t *eng, int final) {
  if (!final)
    return;
  free(eng->mono);
  eng->mono = NULL;
}

const pr__layer_t pr__layer_monopoly = {.name = "monopolization",
                                        .open = open_layer,
                                        .admit = admit,
                                        .close = close_layer};
