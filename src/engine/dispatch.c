/*
 * dispatch.c - from a key's queue to a handler and back: the limiter
 * (max_concurrency), the hand-off to the worker pool (or the async
 * handler), handler timeouts, cancellation and completion.
 *
 * Threads: the engine thread, except run_handler() (a worker, or the
 * engine thread for an asynchronous handler) and complete_attempt() /
 * prosody_complete() (any thread: they post to the mailbox).
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* The most events of one key a run takes, and how long it may go on. */
#define RUN_MAX 32
#define RUN_MAX_NS 2000000 /* 2 ms */

/* Cancels the running attempt's context (engine thread), and calls its
 * prosody_context_on_cancel() callback once, with the slot's lock held. */
void pr__dispatch_cancel(inv_t *inv) {
  PR_ENGINE_THREAD(inv->eng);
  pr__ctx_t *slot = inv->cslot;
  prosody_cancel_cb cb;
  if (!slot)
    return;
  pthread_mutex_lock(&slot->lock);
  slot->cancelled = 1;
  cb = slot->cancel_cb; /* NULL once the attempt has finished */
  slot->cancel_cb = NULL;
  if (cb)
    cb(inv->ctx, slot->cancel_opaque);
  pthread_cond_broadcast(&slot->cond);
  pthread_mutex_unlock(&slot->lock);
}

/* Records the attempt's result exactly once (any thread) and posts it.
 * `next`: the run's next claimed event the worker would go on with (see
 * run_handler()), or NULL. Returns 1 when the run goes on with `next`, 0
 * when the result ends the run (posted with run_end), -1 for a stale
 * context or a second result (nothing posted). `next` is read only here,
 * under this attempt's slot lock and after it is known unfinished: until
 * this attempt's result is posted nothing can free it. */
static int complete_attempt(prosody_context_t *ctx, prosody_result_t result,
                            const char *message, inv_t *next, int64_t end_ns) {
  int go_on;
  pr__ctx_t *slot = pr__ctx_lock_live(ctx);
  inv_t *inv;
  if (!slot)
    return -1;
  slot->finished = 1;
  slot->cancel_cb = NULL; /* finished: a later cancel is not reported */
  pthread_cond_broadcast(&slot->cond); /* prosody_wait_cancel: it is over */
  inv = slot->owner;
  if (result != PROSODY_SUCCESS && result != PROSODY_PERMANENT)
    result = PROSODY_TRANSIENT; /* a failure without a class */
  if (inv->tr)
    pr__trace_end(inv, result, message ? message : slot->error);
  if (result == PROSODY_SUCCESS &&
      !(inv->eng->handler.flags & PROSODY_HANDLER_ASYNC)) {
    /* What only the handler needed (a failure keeps it for the retry or
     * the failure topic's trace headers): a worker frees it here rather
     * than the engine thread, the pipeline's serial stage. An
     * asynchronous handler's completing thread is the host's event loop:
     * the engine frees it there instead (freeing on the loop cost the
     * Python binding a quarter of its loop thread, mostly waiting on
     * malloc's lock). */
    pr__inv_shed(inv, 1);
  }
  inv->result = result;
  inv->run_ns =
      inv->started_ns ? (end_ns ? end_ns : pr__now_ns()) - inv->started_ns : 0;
  go_on = next && result == PROSODY_SUCCESS && !atomic_load(&next->released);
  inv->run_end = !go_on;
  free(inv->result_error);
  inv->result_error = message       ? strdup(message)
                      : slot->error ? strdup(slot->error)
                                    : NULL;
  /* Its telemetry events are built and queued here, by the worker, not by
   * the engine thread (the pipeline's serial stage); an asynchronous
   * handler's completing thread is the host's loop: the engine emits them
   * instead. */
  inv->emitted = inv->eng->tm && !inv->skip &&
                 !(inv->eng->handler.flags & PROSODY_HANDLER_ASYNC);
  pthread_mutex_unlock(&slot->lock);
  /* Both use the inv only: it lives until the post. */
  pr__layers_completed(inv, result); /* before the post: dedup records a
                                       success the key's next looks up */
  if (inv->emitted)
    pr__inv_emit_ran(inv);
  pr__mailbox_post(&inv->eng->mb, &inv->mail, pr__outcome_mail);
  return go_on;
}

/* The context a send from a running handler continues (its thread). */
static int send_parent(const void *arg, pr_span_ctx_t *out) {
  return pr__trace_of(arg, out);
}

/* Runs the handler for `inv` (a worker, or the engine thread for an
 * asynchronous handler), then, while each result is a success, the key's
 * next events the engine claimed for this run (chain_next): a hot key's
 * events run back to back without a round trip through the engine. The
 * run ends at the first failure, a result given later (PENDING), or a
 * claimed event that is cancelled or released; that result is posted
 * with run_end set and the engine puts the unrun events back. An inv may
 * be freed as soon as its result is posted: everything needed afterwards
 * is read before. */
static void run_handler(void *arg) {
  inv_t *inv = arg;
  prosody_handler_t *h = &inv->eng->handler;
  int64_t run_start = 0, end;
  for (;;) {
    prosody_context_t *ctx = inv->ctx;
    inv_t *next = inv->chain_next;
    prosody_context_t *next_ctx = next ? next->ctx : NULL;
    prosody_result_t r;
    int go_on;
    inv->started_ns = pr__now_ns();
    if (!run_start)
      run_start = inv->started_ns;
    if (inv->unprepared)
      pr__decode_prepare(inv);
    if (inv->skip) {
      if (!inv->skip_dup) /* a duplicate has no span, as at its head */
        pr__trace_filtered(inv);
      r = PROSODY_SUCCESS; /* pr__outcome_handler_done commits past it */
    } else if (!inv->is_timer) {
      pr__trace_start(inv);
      pr__send_parent_set(send_parent, inv);
      r = h->on_message(ctx, &inv->msg, h->opaque);
      pr__send_parent_set(NULL, NULL);
    } else if (h->on_timer) {
      pr__trace_start(inv);
      pr__send_parent_set(send_parent, inv);
      r = h->on_timer(ctx, &inv->tmr, h->opaque);
      pr__send_parent_set(NULL, NULL);
    } else {
      PR_WARN("engine",
              "timer of key \"%.64s\" at %lld fired but the handler has no "
              "on_timer; dropping it",
              inv->msg.key, (long long)inv->time_s);
      r = PROSODY_SUCCESS;
    }
    if (r == PROSODY_PENDING) /* completed later, with run_end set */
      return;
    /* next->ctx is a handle: safe to ask even if next were gone. next
     * itself is read only by complete_attempt(), under this attempt's
     * lock; refused (-1) when the handler completed the context itself,
     * whose result then ended the run. */
    end = pr__now_ns();
    /* A run is for short handlers, and only for a while: the scheduler and
     * monopolization see a key between runs. */
    go_on = r == PROSODY_SUCCESS && next && end - run_start < RUN_MAX_NS &&
            !prosody_should_cancel(next_ctx);
    if (complete_attempt(ctx, r, NULL, go_on ? next : NULL, end) != 1)
      return;
    inv = next;
  }
}

static void on_timeout(uv_timer_t *t) {
  pr__engine_t *eng = t->data;
  int64_t now = pr__now_ns();
  inv_t *inv;
  char what[160];
  while ((inv = eng->tmo_head) && inv->deadline_ns <= now) {
    pr__inv_untime(inv);
    PR_WARN("engine", "handler for %s exceeded its timeout; cancelling it",
            pr__inv_describe(inv, what, sizeof(what)));
    pr__dispatch_cancel(inv);
  }
  if (inv) /* ms, rounded up so the head has expired when it fires */
    uv_timer_start(&eng->tmo, on_timeout,
                   (uint64_t)((inv->deadline_ns - now + 999999) / 1000000), 0);
}

/* Joins the deadline list (engine thread). */
void pr__dispatch_time(inv_t *inv) {
  PR_ENGINE_THREAD(inv->eng);
  pr__engine_t *eng = inv->eng;
  inv->deadline_ns = pr__now_ns() + eng->timeout_ms * 1000000;
  inv->tnext = NULL;
  inv->tprev = eng->tmo_tail;
  if (eng->tmo_tail)
    eng->tmo_tail->tnext = inv;
  else
    eng->tmo_head = inv;
  eng->tmo_tail = inv;
  inv->timed = 1;
  if (!uv_is_active((uv_handle_t *)&eng->tmo))
    uv_timer_start(&eng->tmo, on_timeout, (uint64_t)eng->timeout_ms, 0);
}

/* Claims the key's queued messages behind `head` for the same run: each
 * is started (context, attempt, active) but runs on head's worker after
 * head succeeds. Only with a worker pool, only messages (a timer's event
 * must be deleted from the store before the key's next event starts), only
 * those the mode's layers let follow (their `claimable` hook: keyed state
 * lets none, as the key's next event must read what this one wrote, which
 * the engine stores only once it has this one's result; dedup stops at a
 * duplicate of one in the run), and only while no other event waits for
 * a slot: under contention the scheduler, not the run, decides what runs
 * next. */
static void claim_followers(inv_t *head) {
  inv_t *prev = head, *f;
  int n = 1;
  head->chain_next = NULL;
  if (!head->eng->pool || head->is_timer ||
      pr__sched_waiting(&head->eng->sched))
    return;
  for (f = head->next; f && n < RUN_MAX; f = f->next, n++) {
    if (f->is_timer || f->state != INV_QUEUED || !pr__layers_claimable(head, f))
      break;
    if (!(f->ctx = pr__ctx_acquire(&f->eng->ctx_stash, f, &f->cslot))) {
      f->cslot = NULL;
      break;
    }
    f->state = INV_RUNNING;
    f->attempt++;
    f->part->active++;
    PR_BUMP(f->eng->metrics.sched_wait.count[0], 1); /* no wait */
    f->chain_next = NULL;
    prev->chain_next = f;
    prev = f;
  }
}

void pr__dispatch_run_ended(inv_t *inv) {
  PR_ENGINE_THREAD(inv->eng);
  part_t *part = inv->part;
  inv_t *f = inv->chain_next, *g;
  kq_t *kq = inv->kq;
  inv->chain_next = NULL;
  for (; f; f = g) { /* claimed, never started: queued again */
    g = f->chain_next;
    f->chain_next = NULL;
    f->state = INV_QUEUED;
    f->attempt--;
    part->active--;
    pr__ctx_release(&inv->eng->ctx_stash, f->cslot);
    f->cslot = NULL;
    f->ctx = NULL;
  }
  if (part->revoking || part->zombie || inv->eng->phase != PH_RUNNING) {
    /* Released meanwhile: what waits behind inv goes, as release_idle()
     * would have let it go had it not been claimed. */
    while (kq && (f = inv->next)) {
      inv->next = f->next;
      part->invs--;
      pr__inv_free(f);
    }
    if (kq)
      kq->tail = inv;
  }
}

static void start(inv_t *inv) {
  pr__engine_t *eng = inv->eng;
  inv->state = INV_RUNNING;
  inv->attempt++;
  inv->part->active++;
  inv->started_ns = 0; /* set when the handler starts */
  eng->running++;
  /* Each attempt gets a fresh context: one kept from an earlier attempt
   * is stale. */
  if (inv->cslot)
    pr__ctx_release(&eng->ctx_stash, inv->cslot);
  inv->ctx = pr__ctx_acquire(&eng->ctx_stash, inv, &inv->cslot);
  if (!inv->ctx) {
    inv->cslot = NULL;
    inv->chain_next = NULL;
    inv->run_end = 1;
    inv->result = PROSODY_TRANSIENT;
    free(inv->result_error);
    inv->result_error = strdup("out of memory (no handler context)");
    pr__mailbox_post(&eng->mb, &inv->mail, pr__outcome_mail);
    return;
  }
  if (eng->timeout_ms > 0)
    pr__dispatch_time(inv);
  claim_followers(inv);
  if (eng->pool) {
    /* At most one wake-up per burst (engine.c's prepare and check
     * handles end each burst). */
    if (pr__pool_submit_burst(eng->pool, run_handler, inv, &eng->may_wake))
      complete_attempt(inv->ctx, PROSODY_TRANSIENT, "out of memory", NULL, 0);
  } else {
    run_handler(inv); /* async: must hand over and return quickly */
  }
}

/* The scheduler's urgent events: one whose partition's offset window is
 * half way to its limit, and a message that holds its partition's commit
 * position (the oldest offset not finished): holding either back holds
 * the whole partition back. */
int pr__dispatch_urgent(const pr__sched_task_t *t) {
  const inv_t *inv = PR_CONTAINER_OF(t, inv_t, sched);
  return inv->part->pressed ||
         (!inv->is_timer &&
          inv->msg.offset == pr__tracker_oldest(&inv->part->tracker));
}

/* Starts the event when a slot is free, else it waits in the scheduler
 * (normal class for a first attempt, failure class for a retry). A timer
 * unscheduled while it waited is skipped. */
void pr__dispatch_schedule(inv_t *inv) {
  PR_ENGINE_THREAD(inv->eng);
  pr__engine_t *eng = inv->eng;
  /* Iteratively: a key may have many dropped timers or duplicates
   * queued. */
  for (;;) {
    int admit =
        inv->is_timer && inv->dropped ? PR_ADMIT_SKIP : pr__layers_admit(inv);
    if (admit == PR_ADMIT_RUN)
      break;
    if (admit != PR_ADMIT_SKIP)
      return; /* waits, or refused: scheduled again later */
    /* A duplicate message is committed past; a dropped timer is deleted
     * already, and a deferred one's entry goes from its queue. */
    if (!(inv =
              pr__outcome_finish_detach(inv, !inv->is_timer || inv->df_loaded)))
      return;
    if (inv->state != INV_QUEUED) /* claimed by a run meanwhile: not ours */
      return;
  }
  if (eng->running < eng->max_concurrency) {
    PR_BUMP(eng->metrics.sched_wait.count[0], 1); /* no wait */
    start(inv);
    return;
  }
  /* Waiting: its librdkafka message goes on the next tick
   * (pr__part_tick_keys), if no worker has let go of it by then. */
  inv->sched.key = inv->kq->sk;
  inv->sched.cls = inv->attempt > 0 ? PR_SCHED_FAILURE : PR_SCHED_NORMAL;
  if (pr__sched_push(&eng->sched, &inv->sched, pr__now_ns())) {
    start(inv); /* no room to wait: over the limit rather than stuck */
    return;
  }
  inv->state = INV_READY;
}

void pr__dispatch_start_ready(pr__engine_t *eng) {
  PR_ENGINE_THREAD(eng);
  pr__sched_task_t *t;
  int64_t now = 0;
  while (eng->running < eng->max_concurrency &&
         pr__sched_waiting(&eng->sched) &&
         (t = pr__sched_pop(&eng->sched, now ? now : (now = pr__now_ns())))) {
    inv_t *inv = PR_CONTAINER_OF(t, inv_t, sched);
    pr__hist_observe(&eng->metrics.sched_wait, now - t->ready_ns);
    if (inv->is_timer && inv->dropped)
      pr__outcome_finish(inv, inv->df_loaded); /* as in the above */
    else
      start(inv);
  }
}

static int ready_of(pr__sched_task_t *t, void *arg) {
  inv_t *inv = PR_CONTAINER_OF(t, inv_t, sched);
  if (arg && inv->part != arg)
    return 0;
  inv->state = INV_QUEUED;
  return 1;
}

/* Takes every waiting event of `part` (NULL: all) out of the scheduler. */
void pr__dispatch_ready_remove(pr__engine_t *eng, part_t *part) {
  PR_ENGINE_THREAD(eng);
  pr__sched_remove_if(&eng->sched, ready_of, part);
}

/* Appends a new event (message or timer) to its key's FIFO, counting it
 * against max_uncommitted (its partition stops at the limit), and starts
 * it if it is the key's head. */
void pr__dispatch_enqueue(inv_t *inv) {
  PR_ENGINE_THREAD(inv->eng);
  pr__engine_t *eng = inv->eng;
  part_t *part = inv->part;
  kq_t *kq;
  char ev[160];
  part->invs++;
  kq = inv->msg.key && (inv->is_timer || inv->msg.payload)
           ? pr__kq_get(part, inv->msg.key, 1)
           : NULL;
  if (!kq) {
    PR_ERROR("engine", "out of memory queueing %s",
             pr__inv_describe(inv, ev, sizeof(ev)));
    pr__outcome_finish(inv, 0);
    return;
  }
  inv->kq = kq;
  inv->state = INV_QUEUED;
  if (pr__layers_hold(inv)) { /* defer: behind the key's deferred events */
    pr__bp_check(eng, part);
    return;
  }
  pr__layers_intake(inv);
  if (kq->tail) {
    kq->tail->next = inv; /* its message: as in pr__dispatch_schedule() */
    kq->tail = inv;
  } else {
    kq->head = kq->tail = inv;
    if (eng->phase == PH_RUNNING && !part->held)
      pr__dispatch_schedule(inv);
  }
  pr__bp_check(eng, part);
}

PROSODY_EXPORT prosody_err_t prosody_complete(prosody_context_t *ctx,
                                              prosody_result_t result,
                                              const char *message) {
  if (!ctx || result == PROSODY_PENDING)
    return PROSODY_ERR_INVALID_ARG;
  return complete_attempt(ctx, result, message, NULL, 0) < 0 ? PROSODY_ERR_STATE
                                                             : PROSODY_OK;
}
