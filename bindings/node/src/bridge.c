/*
 * bridge.c - from libprosody's threads to the JavaScript thread. The
 * callbacks on libprosody's threads (the asynchronous handler's, timer
 * and keyed-state results and cancellations on the engine thread, send results
 * on the producer's, log lines on any) push an item to the client's mailbox, a
 * libprosody event queue, and return; the queue wakes the JavaScript
 * thread through the client's threadsafe function once per batch, and
 * call_js hands index.js the batch.
 */
#include "prosody_node.h"

/* The queue's wake-up: any thread. */
void pn_mailbox_wake(void *arg) {
  mailbox_t *mb = arg;
  pthread_mutex_lock(&mb->wake_lock);
  if (!mb->gone)
    napi_call_threadsafe_function(mb->tsfn, NULL, napi_tsfn_nonblocking);
  pthread_mutex_unlock(&mb->wake_lock);
}

/* Keeps the loop and the JS client alive while something is pending (JS
 * thread): a client dropped with a send in flight must not be finalised
 * (its promise would never settle). */
void pn_hold(client_t *c, int delta) {
  int before = c->pending;
  c->pending += delta;
  if (before == 0 && c->pending > 0) {
    napi_ref_threadsafe_function(c->env, c->mb.tsfn);
    if (c->self)
      napi_reference_ref(c->env, c->self, NULL);
  } else if (before > 0 && c->pending == 0) {
    napi_unref_threadsafe_function(c->env, c->mb.tsfn);
    if (c->self)
      napi_reference_unref(c->env, c->self, NULL);
  }
}

/* libprosody's log callback: any of the client's threads. */
void pn_log_cb(prosody_log_level_t level, const char *subsystem,
               const char *message, void *opaque) {
  client_t *c = opaque;
  size_t n = strlen(message);
  log_line_t *l = malloc(sizeof(*l) + n + 1);
  if (l) {
    l->item.kind = IT_LOG;
    l->level = (int)level;
    snprintf(l->subsystem, sizeof(l->subsystem), "%s", subsystem);
    memcpy(l->message, message, n + 1);
  }
  if (atomic_load(&c->mb.closed)) {
    /* The lines of a client destroyed by its finalizer (garbage
     * collection, or the environment's teardown at exit, when the
     * threadsafe function may already be freed: calling it aborted the
     * process once librdkafka 2.14 logged during destroy). */
    free(l);
    return;
  }
  /* Refused beyond LOG_QUEUE_LINES (counted, said with the next batch). */
  if (prosody_queue_offer(c->mb.q, l ? &l->item : NULL))
    free(l);
}

static prosody_result_t push_event(client_t *c, prosody_context_t *ctx,
                                   const prosody_message_t *msg,
                                   const prosody_timer_t *timer) {
  event_t *ev = calloc(1, sizeof(*ev));
  if (!ev) {
    prosody_context_set_error(ctx, "out of memory handing the event over");
    return PROSODY_TRANSIENT;
  }
  ev->item.kind = IT_EVENT;
  ev->c = c;
  ev->ctx = ctx;
  ev->msg = msg;
  ev->timer = timer;
  ev->id = ++c->next_id;
  atomic_init(&ev->cancel_fired, 0);
  /* Registered before the hand-over (ev is not touched after the push):
   * a cancellation that already happened arrives as an item at once,
   * ahead of the event; call_js puts cancellations after the events. */
  prosody_context_on_cancel(ctx, pn_cancel_cb, ev);
  prosody_queue_push(c->mb.q, &ev->item);
  return PROSODY_PENDING;
}

prosody_result_t pn_c_on_message(prosody_context_t *ctx,
                                 const prosody_message_t *msg, void *opaque) {
  return push_event(opaque, ctx, msg, NULL);
}

prosody_result_t pn_c_on_timer(prosody_context_t *ctx,
                               const prosody_timer_t *timer, void *opaque) {
  return push_event(opaque, ctx, NULL, timer);
}

/* The handler has no onMessage (a timer-only handler): each message is
 * done at once, on the engine thread, and committed. */
prosody_result_t pn_c_skip_message(prosody_context_t *ctx,
                                   const prosody_message_t *msg, void *opaque) {
  return PROSODY_SUCCESS;
}

/* Each event takes STRIDE slots of the batch array handed to JavaScript:
 * [kind, id, ev, topic, partition, offset, timestamp, key, payload,
 *  traceparent, tracestate, baggage, spanned] for a message (kind 0),
 * [kind, id, ev, key, time, -, -, -, -, traceparent, -, -, spanned] for a
 * timer (kind 1), [kind, id, ev] for a cancellation (kind 2). `spanned`
 * is 1 when the traceparent is libprosody's own span (the handler's span
 * is then its child), else a hole. `ev` is an external handle for complete()
 * and the context calls. The payload is the record's JSON text: V8's JSON.parse
 * builds the objects several times faster than property-by-property N-API calls
 * would from libprosody's parsed tree (measured: docs/BENCHMARKS.md). */
#define STRIDE 13

typedef struct batch {
  napi_value array;
  uint32_t n;        /* slots used */
  const char *topic; /* the last topic, to reuse its JS string */
  napi_value topic_value;
} batch_t;

static void put(napi_env env, batch_t *b, uint32_t slot, napi_value v) {
  napi_set_element(env, b->array, b->n + slot, v);
}

static void put_str(napi_env env, batch_t *b, uint32_t slot, const char *s,
                    size_t len) {
  napi_value v;
  if (!s)
    return; /* a hole reads as undefined */
  napi_create_string_utf8(env, s, len, &v);
  put(env, b, slot, v);
}

static void put_num(napi_env env, batch_t *b, uint32_t slot, double d) {
  napi_value v;
  napi_create_double(env, d, &v);
  put(env, b, slot, v);
}

static void put_head(napi_env env, batch_t *b, int kind, event_t *ev) {
  napi_value ext;
  put_num(env, b, 0, kind);
  put_num(env, b, 1, ev->id);
  napi_create_external(env, ev, NULL, NULL, &ext);
  put(env, b, 2, ext);
}

static void put_event(napi_env env, batch_t *b, event_t *ev) {
  int spanned = 0;
  if (ev->msg) {
    const prosody_message_t *m = ev->msg;
    const char *topic = prosody_message_topic(m);
    put_head(env, b, 0, ev);
    if (topic != b->topic) {
      napi_create_string_utf8(env, topic, NAPI_AUTO_LENGTH, &b->topic_value);
      b->topic = topic;
    }
    put(env, b, 3, b->topic_value);
    put_num(env, b, 4, prosody_message_partition(m));
    put_num(env, b, 5, (double)prosody_message_offset(m));
    put_num(env, b, 6, (double)prosody_message_timestamp(m));
    put_str(env, b, 7, prosody_message_key(m), NAPI_AUTO_LENGTH);
    put_str(env, b, 8, prosody_message_payload(m),
            prosody_message_payload_len(m));
    put_str(env, b, 9, prosody_message_traceparent(m, &spanned),
            NAPI_AUTO_LENGTH);
    if (spanned)
      put_num(env, b, 12, 1);
    put_str(env, b, 10, prosody_message_header(m, "tracestate"),
            NAPI_AUTO_LENGTH);
    put_str(env, b, 11, prosody_message_header(m, "baggage"), NAPI_AUTO_LENGTH);
  } else {
    put_head(env, b, 1, ev);
    put_str(env, b, 3, prosody_timer_key(ev->timer), NAPI_AUTO_LENGTH);
    put_num(env, b, 4, (double)prosody_timer_time(ev->timer));
    put_str(env, b, 9, prosody_timer_traceparent(ev->timer, &spanned),
            NAPI_AUTO_LENGTH);
    if (spanned)
      put_num(env, b, 12, 1);
  }
  b->n += STRIDE;
}

static void op_settle(napi_env env, op_t *op) {
  if (op->err) {
    napi_reject_deferred(env, op->deferred,
                         pn_make_error(env, op->err, op->errstr));
  } else {
    napi_value v;
    if (op->item.kind == IT_STATE) {
      v = pn_state_result(env, op);
    } else if (op->item.kind == IT_OP && op->op == PROSODY_TIMER_SCHEDULED) {
      napi_create_array_with_length(env, op->n, &v);
      for (size_t i = 0; i < op->n; i++) {
        napi_value t;
        napi_create_double(env, (double)op->times[i], &t);
        napi_set_element(env, v, (uint32_t)i, t);
      }
    } else {
      napi_get_undefined(env, &v);
    }
    napi_resolve_deferred(env, op->deferred, v);
  }
  pn_op_free(op);
}

/* Calls a JS function the client holds (logger or dispatcher) with `argc`
 * arguments; it must not throw: if it does, the exception is surfaced as
 * uncaught. */
static void call_client_fn(napi_env env, napi_ref ref, size_t argc,
                           napi_value *argv) {
  napi_value fn, undef, result;
  napi_get_reference_value(env, ref, &fn);
  napi_get_undefined(env, &undef);
  if (napi_call_function(env, undef, fn, argc, argv, &result) != napi_ok) {
    napi_value exc;
    bool pending = false;
    napi_is_exception_pending(env, &pending);
    if (pending) {
      napi_get_and_clear_last_exception(env, &exc);
      napi_fatal_exception(env, exc);
    }
  }
}

/* The threadsafe function's JS-thread callback: one per batch. Events and
 * cancellations go to the JS dispatcher as one array; results settle their
 * promises here. */
void pn_call_js(napi_env env, napi_value js_cb, void *context, void *data) {
  client_t *c = context;
  item_t *it;
  event_t *cancels = NULL, **ctail = &cancels;
  batch_t b = {0};
  napi_value logs[2]; /* [level, subsystem, message, ...], dropped */
  uint32_t nlogs = 0;
  unsigned long dropped;
  if (!env)
    return; /* the environment is going away */
  /* Once the client is finalised only its last log lines are listed (see
   * client_finalize). */
  it = prosody_queue_take(c->mb.q, &dropped);
  dropped += c->mb.carried;
  c->mb.carried = 0;
  napi_create_array(env, &b.array);
  while (it) {
    item_t *next = it->next;
    switch (it->kind) {
    case IT_LOG: {
      log_line_t *l = (log_line_t *)it;
      napi_value v;
      if (!nlogs) /* made only for batches with lines: not per event */
        napi_create_array(env, &logs[0]);
      napi_create_int32(env, l->level, &v);
      napi_set_element(env, logs[0], nlogs++, v);
      napi_create_string_utf8(env, l->subsystem, NAPI_AUTO_LENGTH, &v);
      napi_set_element(env, logs[0], nlogs++, v);
      napi_create_string_utf8(env, l->message, NAPI_AUTO_LENGTH, &v);
      napi_set_element(env, logs[0], nlogs++, v);
      free(l);
      break;
    }
    case IT_EVENT:
      put_event(env, &b, (event_t *)it);
      break;
    case IT_CANCEL: {
      /* Listed after the events (a cancellation may overtake its event
       * in the mailbox). */
      event_t *ev = (event_t *)((char *)it - offsetof(event_t, cancel_item));
      ev->cancel_drained = 1;
      ev->cancel_next = NULL;
      *ctail = ev;
      ctail = &ev->cancel_next;
      break;
    }
    case IT_OP:
    case IT_SEND:
    case IT_STATE:
      if (c->wrap_gone) { /* a result nobody can await any more */
        pn_op_free((op_t *)it);
        break;
      }
      op_settle(env, (op_t *)it);
      pn_hold(c, -1);
      break;
    }
    it = next;
  }
  if ((nlogs || dropped) && c->logger) {
    if (!nlogs)
      napi_create_array(env, &logs[0]);
    napi_create_double(env, (double)dropped, &logs[1]);
    call_client_fn(env, c->logger, 2, logs);
  }
  while (cancels) {
    event_t *ev = cancels, *nextc = ev->cancel_next;
    if (!ev->completed) {
      put_head(env, &b, 2, ev);
      b.n += STRIDE;
    }
    pn_event_free_maybe(ev);
    cancels = nextc;
  }
  if (b.n && c->dispatch)
    call_client_fn(env, c->dispatch, 1, &b.array);
}

/* What arrived after the last batch: results nobody can await now are
 * freed; log lines (those of the client's closing) are listed again for
 * the threadsafe function's last call, which gives them to the logger. */
void pn_mailbox_close(client_t *c) {
  unsigned long dropped;
  item_t *it = prosody_queue_take(c->mb.q, &dropped);
  int keep = c->logger && !c->tsfn_gone && !c->env_closing, relisted = 0;
  while (it) {
    item_t *next = it->next;
    if (it->kind == IT_LOG && keep && !prosody_queue_offer(c->mb.q, it)) {
      relisted = 1; /* the first one wakes the threadsafe function */
    } else if (it->kind == IT_LOG) {
      free(it);
    } else if (it->kind == IT_OP || it->kind == IT_SEND ||
               it->kind == IT_STATE) {
      pn_op_free((op_t *)it);
    }
    it = next;
  }
  if (dropped && keep) {
    c->mb.carried += dropped;
    if (!relisted)
      pn_mailbox_wake(&c->mb);
  }
}
