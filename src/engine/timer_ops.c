/*
 * timer_ops.c - the handler's timer calls (prosody_schedule & co., and
 * prosody_timer_async): submitted from the handler's thread, run on the
 * engine thread against the timer store, answered to the caller.
 *
 * Threads: the public functions on any thread; run_op() and the store's
 * callbacks on the engine thread.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* The public operations' values (prosody_timer_async). */
enum top_kind {
  TOP_SCHEDULE = PROSODY_TIMER_SCHEDULE,
  TOP_UNSCHEDULE = PROSODY_TIMER_UNSCHEDULE,
  TOP_CLEAR_AND_SCHEDULE = PROSODY_TIMER_CLEAR_AND_SCHEDULE,
  TOP_CLEAR = PROSODY_TIMER_CLEAR,
  TOP_SCHEDULED = PROSODY_TIMER_SCHEDULED
};

#define TOP_NAMES 96 /* key and topic bytes kept in the operation itself */

/* One timer operation. A blocking call's is on the caller's stack: the
 * engine fills the result and signals `cond`, then never touches it. An
 * asynchronous one (`cb` set) is malloc'd: top_done() calls `cb` with the
 * result and frees it. Posted, it belongs to the engine (it refuses
 * what arrives while it stops); started, to the store, which completes every
 * operation before it is destroyed. */
typedef struct top {
  pr__mail_t mail; /* op_mail, while posted */
  int kind;
  prosody_context_t *ctx;
  int64_t time_s;
  pr_span_ctx_t trace;  /* the calling handler's context, kept with the timer
                           (set at submission, under the attempt's lock) */
  char tracestate[512]; /* its record's tracestate ("" for none), for the
                           operation's telemetry event (set with `trace`) */
  /* Engine thread, while it runs the operation: copies of the key and
   * topic (in `names` when they fit, else malloc'd). */
  pr__engine_t *eng;
  char *key, *topic;
  int32_t partition;
  uint64_t gen; /* the partition's assignment */
  char names[TOP_NAMES];
  /* The result, published under `lock`. */
  pthread_mutex_t lock;
  pthread_cond_t cond;
  int done;
  prosody_err_t err;
  char errstr[512];
  int64_t *times; /* TOP_SCHEDULED: ms, malloc'd; NULL when n is 0 */
  size_t n;
  /* Asynchronous (prosody_timer_async): called once, then `op` is freed. */
  prosody_timer_cb cb;
  void *opaque;
} top_t;

/* Copies the key and topic into the operation (0, or -1 out of memory). */
static int top_names(top_t *op, const char *key, const char *topic) {
  size_t klen = strlen(key) + 1, tlen = strlen(topic) + 1;
  if (klen + tlen <= sizeof(op->names)) {
    op->key = memcpy(op->names, key, klen);
    op->topic = memcpy(op->names + klen, topic, tlen);
    return 0;
  }
  op->key = strdup(key);
  op->topic = strdup(topic);
  return op->key && op->topic ? 0 : -1;
}

static void top_done(top_t *op, prosody_err_t err, const char *errstr) {
  if (op->key != op->names) {
    free(op->key);
    free(op->topic);
  }
  op->key = op->topic = NULL;
  if (op->cb) {
    if (err)
      op->cb(err, errstr ? errstr : prosody_err_message(err), NULL, 0,
             op->opaque);
    else
      op->cb(PROSODY_OK, NULL, op->times, op->n, op->opaque);
    free(op->times);
    free(op);
    return;
  }
  pthread_mutex_lock(&op->lock);
  op->err = err;
  snprintf(op->errstr, sizeof(op->errstr), "%s", err && errstr ? errstr : "");
  op->done = 1;
  pthread_cond_signal(&op->cond);
  pthread_mutex_unlock(&op->lock);
}

/* The operation's partition, if it is still assigned with its timers. */
static part_t *top_part(top_t *op) {
  part_t *part = pr__part_find(op->eng, op->topic, op->partition);
  return part && part->tq && !part->revoking ? part : NULL;
}

static void top_cleared(void *arg, prosody_err_t err, const char *errstr) {
  top_t *op = arg;
  part_t *part = top_part(op);
  if (!err && part)
    pr__firing_deleted(part, op->key, -1,
                       op->kind == TOP_CLEAR_AND_SCHEDULE ? op->time_s : -1);
  top_done(op, err, errstr);
}

static void top_written(void *arg, prosody_err_t err, const char *errstr) {
  top_t *op = arg;
  part_t *part = top_part(op);
  pr__tseg_t seg = pr__firing_seg(op->topic, op->partition);
  pr__slabs_put_done(part, op->gen, op->time_s);
  if (err) {
    top_done(op, err, errstr);
    return;
  }
  PR_BUMP(op->eng->metrics.timers_scheduled, 1);
  pr__emit_timer_op(op->eng, PR_TM_TIMER_SCHEDULED, op->topic, op->partition,
                    op->key, op->time_s, &op->trace, op->tracestate);
  if (part) {
    pr__firing_written(op->eng, part, op->key, op->time_s, &op->trace);
    pr__firing_arm(op->eng);
  }
  if (op->kind == TOP_CLEAR_AND_SCHEDULE) /* the new timer is written */
    op->eng->store->ops->del_key(op->eng->store, &seg, op->key,
                                 PR_TIMER_APPLICATION, op->time_s, top_cleared,
                                 op);
  else
    top_done(op, PROSODY_OK, NULL);
}

static void top_deleted(void *arg, prosody_err_t err, const char *errstr) {
  top_t *op = arg;
  part_t *part = top_part(op);
  if (!err && part)
    pr__firing_deleted(part, op->key, op->time_s, -1);
  if (!err)
    pr__emit_timer_op(op->eng, PR_TM_TIMER_CANCELLED, op->topic, op->partition,
                      op->key, op->time_s, &op->trace, op->tracestate);
  top_done(op, err, errstr);
}

static void top_listed(void *arg, prosody_err_t err, const char *errstr,
                       const int64_t *times, size_t n) {
  top_t *op = arg;
  part_t *part = top_part(op);
  if (!err && n > 0) {
    if (!(op->times = malloc(n * sizeof(int64_t)))) {
      top_done(op, PROSODY_ERR_NOMEM, "out of memory listing timers");
      return;
    }
    for (size_t i = 0; i < n; i++) {
      inv_t *f = part ? pr__firing_find(part, op->key, times[i]) : NULL;
      if (!f || f->rearmed) /* a firing timer is not "scheduled" */
        op->times[op->n++] = times[i] * 1000;
    }
    if (!op->n) { /* only the firing one */
      free(op->times);
      op->times = NULL;
    }
  }
  top_done(op, err, errstr);
}

/* Runs a handler's timer operation (engine thread). */
static void run_op(pr__engine_t *eng, top_t *op) {
  pr__ctx_t *slot = pr__ctx_lock_live(op->ctx);
  char why[256];
  inv_t *inv;
  part_t *part;
  pr__tseg_t seg;
  pr__tstore_t *st = eng->store;

  if (!slot) {
    top_done(op, PROSODY_ERR_STATE,
             "the context is stale: its handler has already finished");
    return;
  }
  inv = slot->owner;
  pthread_mutex_unlock(&slot->lock);
  part = inv->part;
  if (eng->stopping || eng->phase != PH_RUNNING) {
    top_done(op, PROSODY_ERR_STATE, "the consumer is shutting down");
    return;
  }
  if (part->revoking || part->zombie || !part->tq) {
    snprintf(why, sizeof(why), "partition %s[%d] is being revoked", part->topic,
             part->partition);
    top_done(op, PROSODY_ERR_STATE, why);
    return;
  }
  if (!eng->handler.on_timer) {
    top_done(op, PROSODY_ERR_STATE,
             "the handler has no on_timer: its timers could never fire");
    return;
  }
  op->eng = eng;
  op->partition = part->partition;
  if (top_names(op, inv->msg.key, part->topic)) {
    top_done(op, PROSODY_ERR_NOMEM, "out of memory");
    return;
  }
  seg = pr__firing_seg(op->topic, op->partition);
  switch (op->kind) {
  case TOP_SCHEDULE:
  case TOP_CLEAR_AND_SCHEDULE:
    op->gen = part->gen;
    pr__slabs_put(part, op->time_s);
    st->ops->put(st, &seg, op->key, op->time_s, PR_TIMER_APPLICATION,
                 &op->trace, top_written, op);
    break;
  case TOP_UNSCHEDULE:
    st->ops->del(st, &seg, op->key, op->time_s, PR_TIMER_APPLICATION,
                 top_deleted, op);
    break;
  case TOP_CLEAR:
    st->ops->del_key(st, &seg, op->key, PR_TIMER_APPLICATION, -1, top_cleared,
                     op);
    break;
  default:
    st->ops->key_times(st, &seg, op->key, PR_TIMER_APPLICATION, top_listed, op);
    break;
  }
}

/* A posted operation reaches the engine thread. */
static void op_mail(pr__mail_t *mail, void *owner) {
  run_op(owner, PR_CONTAINER_OF(mail, top_t, mail));
}

/* Hands an operation to the engine (any thread): an asynchronous handler
 * on the engine thread runs it at once, any other thread queues it; either
 * way top_done() reports it, possibly before this returns. A stale context
 * is refused here (PROSODY_ERR_STATE, `op` untouched). */
static prosody_err_t top_submit(top_t *op, char *errstr, size_t errstr_size) {
  pr__ctx_t *slot = pr__ctx_lock_live(op->ctx);
  pr__engine_t *eng;

  if (!slot) {
    pr__errf(errstr, errstr_size,
             "the context is stale: its handler has already finished");
    return PROSODY_ERR_STATE;
  }
  eng = ((inv_t *)slot->owner)->eng;
  /* A new timer keeps it; telemetry reports every operation in it. */
  if (pr__trace_of(slot->owner, &op->trace))
    op->trace.valid = false;
  if (!op->trace.valid ||
      !pr__header_str(((inv_t *)slot->owner)->msg.headers, "tracestate",
                      op->tracestate, sizeof(op->tracestate)))
    op->tracestate[0] = '\0';
  if (pr__engine_current() == eng) {
    /* A blocking call cannot wait for a store that answers through this
     * very thread; a callback can: the store completes it later here. */
    pthread_mutex_unlock(&slot->lock);
    if (!op->cb && !eng->store->sync)
      top_done(op, PROSODY_ERR_STATE,
               "timer calls from the engine thread need a store that answers "
               "at once; call from another thread");
    else
      run_op(eng, op);
    return PROSODY_OK;
  }
  /* The live attempt keeps the engine alive; `pushers` keeps it alive
   * until this thread has finished touching it. */
  pr__mailbox_hold(&eng->mb);
  pthread_mutex_unlock(&slot->lock);
  if (pr__mailbox_try_post(&eng->mb, &op->mail, op_mail))
    top_done(op, PROSODY_ERR_STATE, "the consumer has stopped");
  pr__mailbox_unhold(&eng->mb);
  return PROSODY_OK;
}

/* Submits an operation and waits for its result (any thread). */
static prosody_err_t timer_call(prosody_context_t *ctx, int kind,
                                int64_t time_s, int64_t **times, size_t *n,
                                char *errstr, size_t errstr_size) {
  top_t op;
  prosody_err_t err;

  memset(&op, 0, sizeof(op));
  op.kind = kind;
  op.ctx = ctx;
  op.time_s = time_s;
  pthread_mutex_init(&op.lock, NULL);
  pthread_cond_init(&op.cond, NULL);
  if (!(err = top_submit(&op, errstr, errstr_size))) {
    pthread_mutex_lock(&op.lock);
    while (!op.done)
      pthread_cond_wait(&op.cond, &op.lock);
    pthread_mutex_unlock(&op.lock);
  }
  pthread_mutex_destroy(&op.lock);
  pthread_cond_destroy(&op.cond);
  if (err)
    return err;
  if (op.err) {
    pr__errf(errstr, errstr_size, "%s", op.errstr);
    free(op.times);
    return op.err;
  }
  if (times) {
    *times = op.times;
    *n = op.n;
  } else {
    free(op.times);
  }
  return PROSODY_OK;
}

/* Submits an operation whose result goes to `cb` (any thread). */
static prosody_err_t timer_async(prosody_context_t *ctx, int kind,
                                 int64_t time_s, prosody_timer_cb cb,
                                 void *opaque, char *errstr,
                                 size_t errstr_size) {
  top_t *op = calloc(1, sizeof(*op));
  prosody_err_t err;
  if (!op) { /* known at once: reported like any failure of the operation */
    cb(PROSODY_ERR_NOMEM, "out of memory", NULL, 0, opaque);
    return PROSODY_OK;
  }
  op->kind = kind;
  op->ctx = ctx;
  op->time_s = time_s;
  op->cb = cb;
  op->opaque = opaque;
  if ((err = top_submit(op, errstr, errstr_size)))
    free(op);
  return err;
}

static prosody_err_t timer_call_at(prosody_context_t *ctx, int kind,
                                   int64_t time_ms, char *errstr,
                                   size_t errstr_size) {
  int64_t time_s;
  prosody_err_t err;
  if (!ctx) {
    pr__errf(errstr, errstr_size, "context is NULL");
    return PROSODY_ERR_INVALID_ARG;
  }
  err = pr__timer_round(time_ms, &time_s, errstr, errstr_size);
  if (err)
    return err;
  return timer_call(ctx, kind, time_s, NULL, NULL, errstr, errstr_size);
}

PROSODY_EXPORT prosody_err_t prosody_schedule(prosody_context_t *ctx,
                                              int64_t time_ms, char *errstr,
                                              size_t errstr_size) {
  return timer_call_at(ctx, TOP_SCHEDULE, time_ms, errstr, errstr_size);
}

PROSODY_EXPORT prosody_err_t prosody_unschedule(prosody_context_t *ctx,
                                                int64_t time_ms, char *errstr,
                                                size_t errstr_size) {
  return timer_call_at(ctx, TOP_UNSCHEDULE, time_ms, errstr, errstr_size);
}

PROSODY_EXPORT prosody_err_t prosody_clear_and_schedule(prosody_context_t *ctx,
                                                        int64_t time_ms,
                                                        char *errstr,
                                                        size_t errstr_size) {
  return timer_call_at(ctx, TOP_CLEAR_AND_SCHEDULE, time_ms, errstr,
                       errstr_size);
}

PROSODY_EXPORT prosody_err_t prosody_clear_scheduled(prosody_context_t *ctx,
                                                     char *errstr,
                                                     size_t errstr_size) {
  if (!ctx) {
    pr__errf(errstr, errstr_size, "context is NULL");
    return PROSODY_ERR_INVALID_ARG;
  }
  return timer_call(ctx, TOP_CLEAR, -1, NULL, NULL, errstr, errstr_size);
}

PROSODY_EXPORT prosody_err_t prosody_scheduled(prosody_context_t *ctx,
                                               int64_t **times, size_t *n,
                                               char *errstr,
                                               size_t errstr_size) {
  if (!ctx || !times || !n) {
    pr__errf(errstr, errstr_size, "context, times and n must not be NULL");
    return PROSODY_ERR_INVALID_ARG;
  }
  *times = NULL;
  *n = 0;
  return timer_call(ctx, TOP_SCHEDULED, -1, times, n, errstr, errstr_size);
}

PROSODY_EXPORT void prosody_times_free(int64_t *times) { free(times); }

PROSODY_EXPORT prosody_err_t prosody_timer_async(
    prosody_context_t *ctx, prosody_timer_op_t op, int64_t time_ms,
    prosody_timer_cb cb, void *opaque, char *errstr, size_t errstr_size) {
  int64_t time_s = -1;
  prosody_err_t err;
  if (!ctx || !cb) {
    pr__errf(errstr, errstr_size, "%s is NULL", ctx ? "callback" : "context");
    return PROSODY_ERR_INVALID_ARG;
  }
  switch ((int)op) {
  case PROSODY_TIMER_SCHEDULE:
  case PROSODY_TIMER_UNSCHEDULE:
  case PROSODY_TIMER_CLEAR_AND_SCHEDULE:
    if ((err = pr__timer_round(time_ms, &time_s, errstr, errstr_size)))
      return err;
    break;
  case PROSODY_TIMER_CLEAR:
  case PROSODY_TIMER_SCHEDULED:
    break; /* time_ms is ignored */
  default:
    pr__errf(errstr, errstr_size,
             "unknown timer operation %d: want PROSODY_TIMER_SCHEDULE (0) .. "
             "PROSODY_TIMER_SCHEDULED (4)",
             (int)op);
    return PROSODY_ERR_INVALID_ARG;
  }
  return timer_async(ctx, (int)op, time_s, cb, opaque, errstr, errstr_size);
}
