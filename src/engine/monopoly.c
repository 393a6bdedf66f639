/*
 * monopoly.c - the monopolization layer (pipeline mode): a key that used
 * more than monopolization_threshold of the handlers' time over the last
 * monopolization_window is refused with a transient error, so its
 * partition's other keys get their turn. Its per-key handler time lives in
 * the scheduler's key states (scheduler.c), which the engine sizes for it.
 *
 * Threads: the engine thread only.
 */
#include <stdio.h>

#include "internal.h"

/* Is the event's key over its share? Then it is refused (pr__outcome_reject:
 * the mode's layers decide, as for a handler's transient failure). */
static int monopolized(inv_t *inv) {
  pr__engine_t *eng = inv->eng;
  double share;
  char why[256], window[32];
  if (!pr__sched_may_exceed(&eng->sched, inv->kq->sk, eng->mono_threshold))
    return 0; /* the common case, without the window's sum nor the clock */
  share = pr__sched_share(&eng->sched, inv->kq->sk, pr__now_ns());
  if (share <= eng->mono_threshold)
    return 0;
  PR_BUMP(eng->metrics.rejected_monopoly, 1);
  pr__duration_format(PR_CFG_NS(eng->st, MONOPOLIZATION_WINDOW), window,
                      sizeof(window));
  snprintf(why, sizeof(why),
           "key \"%.64s\" monopolizes its handlers: it used %.1f%% of the "
           "last %s, above monopolization_threshold %.1f%%",
           inv->msg.key, share * 100, window, eng->mono_threshold * 100);
  pr__outcome_reject(inv, why);
  return 1;
}

static int admit(inv_t *inv) {
  if (inv->eng->mono_threshold > 0 && monopolized(inv))
    return PR_ADMIT_TAKEN; /* rejected: retried later */
  return PR_ADMIT_RUN;
}

const pr__layer_t pr__layer_monopoly = {.name = "monopolization",
                                        .admit = admit};
