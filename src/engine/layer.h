/*
 * layer.h - the quality-of-service layers' one interface (private to
 * src/engine/).
 *
 * A mode is a table of layers (mode.c), from the handler outwards. Each
 * layer owns its state and implements the hooks it needs; the engine runs
 * a hook over the mode's table, in table order, at one place each:
 *
 *   open      before the consumer starts (the subscribing thread)
 *   hold      a new event, before its key's queue: 1 when the layer holds
 *             it elsewhere (defer: behind the key's deferred events of its
 *             kind); it then never enters the key's queue, and the walk
 *             and the intake hooks do not run for it
 *   intake    a message was taken into its key's queue
 *   admit     at the head of its key, before it starts: run it, skip it
 *             (committed past), make it wait (the layer schedules it
 *             again), or the layer took it (refused, retried later)
 *   claimable may `f`, queued behind `head` on its key, run on head's
 *             worker right after head succeeds (a run, dispatch.c)? 0 when
 *             not (keyed state: the next must read what head wrote; dedup:
 *             a duplicate of one in the run); the first 0 ends the walk
 *   completed an attempt's result was given (the thread that gave it: a
 *             worker, or the host's loop for an asynchronous handler;
 *             before it is posted to the engine). Reads and writes only
 *             the event and the layer's own locked state
 *   ran       an attempt completed (engine thread, before decide)
 *   decide    on the way out: pass (V_NEXT) or decide the attempt's fate;
 *             a layer that decides V_DEAD or V_DEFER carries it out in
 *             `take`
 *   settle    the attempt succeeded and is to be committed: 1 when the
 *             layer stores its effects first (it calls
 *             pr__outcome_committed once they are stored; the walk ends),
 *             0 to go on
 *   drop      the attempt is over and its effects are not stored (it
 *             failed, is retried, deferred or dead-lettered, or a settle
 *             found nothing to store)
 *   done      the event is committed past after its handler ran
 *   commit    the event is to be committed: 1 when the layer carries the
 *             commit out itself (the timers layer deletes a fired timer
 *             from the store first) and calls pr__outcome_finish once it
 *             has; the first 1 ends the walk
 *   end       the event ends (pr__outcome_finish, committed or not): 1
 *             when the event is the layer's (a deferred event's entry, a
 *             timer's store row); the first 1 ends the walk, and an event
 *             no layer claims is a message whose offset is completed
 *   forget    the event is freed: let go of what the layer keeps of it
 *   on_assign a partition was assigned (after its timers were loaded)
 *   on_free   a partition is freed (released, or the engine stops)
 *   timer_loaded
 *             a slab load found a timer of a type other than the
 *             application's (type, as stored): 1 when the layer took it
 *             (it pins its slab), 0 to leave it alone; the first layer
 *             that takes it ends the walk
 *   unscheduled
 *             a handler deleted the key's application timer at `time_s`
 *             (-1: all of the key's timers)
 *   on_tick   every poll_interval
 *   close     at shutdown (`final` 0) and when the engine is freed (1)
 *
 * A layer's engine-wide state is a struct its own file defines, behind one
 * pointer of struct pr__engine (eng->dd, eng->kst, eng->mono, eng->df):
 * made by its `open` (left NULL when its settings turn it off), freed by
 * its `close` with `final` 1; other files ask the layer's functions.
 *
 * Hooks left NULL are skipped. A layer that its settings turn off stays in
 * the table and passes (its hooks check its own state). Which layers
 * exist: success, terminal and the result layers of each mode (mode.c),
 * dedup (dedup.c), monopolization (monopoly.c), defer (defer.c,
 * defer_retry.c, defer_layer.c), keyed state (state.c) and durable timers
 * (firing.c: in every mode).
 *
 * Threads: every hook runs on the engine thread (open: on the thread that
 * owns the engine before it starts; completed: on the thread that gives
 * the attempt's result).
 */
#ifndef PR_ENGINE_LAYER_H
#define PR_ENGINE_LAYER_H

#include <stddef.h>

#include "engine.h"
#include "prosody.h"

typedef struct part part_t;
typedef struct inv inv_t;

/* What the mode's layers decide about a finished attempt. */
typedef enum pr__verdict {
  V_NEXT,   /* no decision: the next layer out decides */
  V_COMMIT, /* done: complete the offset */
  V_ABORT,  /* done without commit: redelivered later */
  V_RETRY,  /* run the handler again after a backoff */
  V_DEAD,   /* the deciding layer takes it: send it to failure_topic
               (deadletter.c), commit once written */
  V_DEFER   /* the deciding layer takes it (defer.c: commit once its
               offset is stored) */
} pr__verdict_t;

/* What admission says about an event at the head of its key. */
enum pr__admit {
  PR_ADMIT_RUN,  /* start it */
  PR_ADMIT_SKIP, /* commit past it without running it (a duplicate) */
  PR_ADMIT_WAIT, /* not yet: the layer schedules it again */
  PR_ADMIT_TAKEN /* the layer refused it and owns what happens next */
};

typedef struct pr__layer {
  const char *name;
  prosody_err_t (*open)(pr__engine_t *eng, const char *bootstrap, char *errstr,
                        size_t errstr_size);
  int (*hold)(inv_t *inv);
  void (*intake)(inv_t *inv);
  int (*admit)(inv_t *inv);
  int (*claimable)(inv_t *head, inv_t *f);
  void (*completed)(inv_t *inv, prosody_result_t result);
  void (*ran)(inv_t *inv);
  pr__verdict_t (*decide)(inv_t *inv);
  void (*take)(inv_t *inv);
  int (*settle)(inv_t *inv);
  void (*drop)(inv_t *inv);
  void (*done)(inv_t *inv);
  int (*commit)(inv_t *inv);
  int (*end)(inv_t *inv, int commit);
  void (*forget)(inv_t *inv);
  void (*on_assign)(pr__engine_t *eng, part_t *part);
  void (*on_free)(part_t *part);
  int (*timer_loaded)(part_t *part, const char *key, int type, int64_t time_s);
  void (*unscheduled)(part_t *part, const char *key, int64_t time_s);
  void (*on_tick)(pr__engine_t *eng);
  void (*close)(pr__engine_t *eng, int final);
} pr__layer_t;

/* The layers (each defined by the file that owns its state). */
extern const pr__layer_t pr__layer_dedup;    /* dedup.c */
extern const pr__layer_t pr__layer_monopoly; /* monopoly.c */
extern const pr__layer_t pr__layer_defer;    /* defer.c */
extern const pr__layer_t pr__layer_state;    /* state.c */
extern const pr__layer_t pr__layer_timers;   /* firing.c */

/* --- mode.c: the modes' tables and running a hook over one ------------ */

/* The table of `mode` (PR_MODE_*), NULL-terminated. */
const pr__layer_t *const *pr__mode_layers(int mode);
prosody_err_t pr__layers_open(pr__engine_t *eng, const char *bootstrap,
                              char *errstr, size_t errstr_size);
int pr__layers_hold(inv_t *inv);
void pr__layers_intake(inv_t *inv);
int pr__layers_admit(inv_t *inv);
int pr__layers_claimable(inv_t *head, inv_t *f);
/* Any thread (the `completed` hook's). */
void pr__layers_completed(inv_t *inv, prosody_result_t result);
void pr__layers_ran(inv_t *inv);
/* What the layers decide (V_COMMIT when none does); `*by` the layer that
 * decided (may be NULL). Changes nothing but a layer's logs. */
pr__verdict_t pr__layers_decide(inv_t *inv, const pr__layer_t **by);
/* 1 when a layer took the commit (pr__outcome_committed follows). */
int pr__layers_settle(inv_t *inv);
void pr__layers_drop(inv_t *inv);
void pr__layers_done(inv_t *inv);
int pr__layers_commit(inv_t *inv);
int pr__layers_end(inv_t *inv, int commit);
/* Also for an event of no engine (inv->eng NULL): nothing to forget. */
void pr__layers_forget(inv_t *inv);
void pr__layers_assign(pr__engine_t *eng, part_t *part);
void pr__layers_part_free(part_t *part);
int pr__layers_timer_loaded(part_t *part, const char *key, int type,
                            int64_t time_s);
void pr__layers_unscheduled(part_t *part, const char *key, int64_t time_s);
void pr__layers_tick(pr__engine_t *eng);
void pr__layers_close(pr__engine_t *eng, int final);

#endif /* PR_ENGINE_LAYER_H */
