/*
 * addon.c - the native part of @prosody-events/prosody: an N-API addon over
 * libprosody's public header. index.js builds the user-facing API on it.
 *
 * Threads. JavaScript runs only on the JS thread. libprosody calls back on:
 *  - the engine thread: on_message / on_timer of the asynchronous handler
 *    (return PROSODY_PENDING at once), timer-call results, cancellations;
 *  - the producer's delivery thread: send results;
 *  - any of the client's threads: its log lines (with a JS logger; bounded,
 *    LOG_QUEUE_LINES, the rest dropped and counted).
 * None touches N-API. Each pushes an item to the client's mailbox, a
 * libprosody event queue (prosody_queue_t) whose wake-up, when it turns
 * non-empty, calls the client's one threadsafe function; its JS-thread
 * callback takes the whole batch: one call per batch, not per event. Blocking C
 * calls (subscribe, unsubscribe, admin) run as napi_async_work on libuv's pool.
 *
 * Ownership. The mailbox and the threadsafe function belong to the client
 * and live until it is finalised (after unsubscribe); the threadsafe
 * function's last call, after that, gives the logger the lines the client
 * logged as it was destroyed (client_release frees it). An in-flight event is
 * an `event_t`: created by the engine thread, freed on the JS thread once
 * its result was given (prosody_complete returned) and its cancellation
 * item, if the cancel callback fired, was drained.
 */
#define NAPI_VERSION 8
#include <node_api.h>

#ifndef NODE_GYP_MODULE_NAME
#define NODE_GYP_MODULE_NAME prosody
#endif

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "prosody.h"

#define CHECK(env, call)                                                       \
  do {                                                                         \
    if ((call) != napi_ok) {                                                   \
      throw_last(env);                                                         \
      return NULL;                                                             \
    }                                                                          \
  } while (0)

static void throw_last(napi_env env) {
  const napi_extended_error_info *info = NULL;
  bool pending = false;
  napi_is_exception_pending(env, &pending);
  if (pending)
    return;
  napi_get_last_error_info(env, &info);
  napi_throw_error(env, NULL,
                   info && info->error_message ? info->error_message
                                               : "N-API call failed");
}

/* An Error with `code` (the C error's name) and `transient`. */
static napi_value make_error(napi_env env, prosody_err_t err, const char *msg) {
  napi_value m, e, code, tr;
  if (!msg || !*msg)
    msg = prosody_err_message(err);
  napi_create_string_utf8(env, msg, NAPI_AUTO_LENGTH, &m);
  if (err == PROSODY_ERR_INVALID_ARG || err == PROSODY_ERR_CONFIG ||
      err == PROSODY_ERR_INVALID_PAYLOAD)
    napi_create_range_error(env, NULL, m, &e);
  else
    napi_create_error(env, NULL, m, &e);
  napi_create_string_utf8(env, prosody_err_name(err), NAPI_AUTO_LENGTH, &code);
  napi_get_boolean(env, prosody_err_is_transient(err), &tr);
  napi_set_named_property(env, e, "code", code);
  napi_set_named_property(env, e, "transient", tr);
  return e;
}

static napi_value throw_error(napi_env env, prosody_err_t err,
                              const char *msg) {
  napi_throw(env, make_error(env, err, msg));
  return NULL;
}

/* A NUL-terminated UTF-8 copy of a JS string (malloc'd) and, into *len, its
 * length in bytes, which is more than strlen() when the string holds a NUL;
 * or NULL with an exception pending. */
static char *string_copy(napi_env env, napi_value v, const char *what,
                         size_t *len) {
  size_t n;
  char *s;
  napi_valuetype t;
  napi_typeof(env, v, &t);
  if (t != napi_string) {
    char msg[128];
    snprintf(msg, sizeof(msg), "%s must be a string", what);
    napi_throw_type_error(env, NULL, msg);
    return NULL;
  }
  napi_get_value_string_utf8(env, v, NULL, 0, &n);
  if (!(s = malloc(n + 1))) {
    napi_throw_error(env, NULL, "out of memory");
    return NULL;
  }
  napi_get_value_string_utf8(env, v, s, n + 1, &n);
  *len = n;
  return s;
}

/* A string argument for libprosody, which takes C strings: one holding a
 * NUL is refused (a RangeError naming `what`), as it would be cut there
 * ('user\0alice' and 'user\0bob' would both be the key "user"). */
static char *string_arg(napi_env env, napi_value v, const char *what) {
  size_t n;
  char *s = string_copy(env, v, what, &n);
  if (s && strlen(s) != n) {
    char msg[160];
    snprintf(msg, sizeof(msg),
             "%s must not contain a NUL character (\\0 at byte %zu)", what,
             strlen(s));
    free(s);
    napi_throw_range_error(env, NULL, msg);
    return NULL;
  }
  return s;
}

/* ------------------------------------------------------------------------ */
/* The mailbox                                                               */
/* ------------------------------------------------------------------------ */

/* A client's mailbox is libprosody's event queue (prosody_queue_t): the
 * callbacks on libprosody's threads push items, and the queue's wake-up,
 * once per batch, is a call of the client's threadsafe function, whose
 * JS-thread callback (call_js) takes the batch. */
enum { IT_EVENT, IT_CANCEL, IT_OP, IT_SEND, IT_LOG };

typedef prosody_queue_item_t item_t;

typedef struct mailbox {
  prosody_queue_t *q;    /* freed with the client struct (client_release) */
  atomic_int closed;     /* the JS object is finalized: log_cb drops lines */
  unsigned long carried; /* log lines dropped before the last batch was
                            re-listed, said by the next call_js (JS thread) */
  napi_threadsafe_function tsfn;
} mailbox_t;

/* The queue's wake-up: any thread. */
static void mailbox_wake(void *arg) {
  mailbox_t *mb = arg;
  napi_call_threadsafe_function(mb->tsfn, NULL, napi_tsfn_nonblocking);
}

/* ------------------------------------------------------------------------ */
/* Client                                                                    */
/* ------------------------------------------------------------------------ */

typedef struct client {
  prosody_client_t *client;
  uint32_t next_id; /* event ids (engine thread) */
  mailbox_t mb;
  napi_ref dispatch;          /* the JS function receiving each batch */
  int subscribed;             /* subscribe started and not yet unsubscribed */
  int has_timer, has_message; /* the handler's methods (JS thread) */
  int pending;                /* work that keeps the loop alive (JS thread) */
  int destroyed;
  int wrap_gone, tsfn_gone; /* c is freed by the later of the two */
  int env_closing;          /* set by this client's env cleanup hook */
  int follows_from[2];      /* message_spans / timer_spans, resolved */
  napi_ref self;   /* the JS object: strong while pending, so an unsettled
                      send keeps its client (weak otherwise) */
  napi_ref logger; /* the JS function given each batch of log lines, or
                      NULL (libprosody writes them to stderr); freed with
                      the threadsafe function, which outlives the client */
  napi_env env;
} client_t;

typedef struct event {
  item_t item;        /* IT_EVENT */
  item_t cancel_item; /* IT_CANCEL, pushed by the cancel callback */
  client_t *c;
  prosody_context_t *ctx;
  uint32_t id;                  /* names the event in the JS layer */
  const prosody_message_t *msg; /* or NULL for a timer */
  const prosody_timer_t *timer;
  atomic_int cancel_fired;   /* written under the context's lock */
  int completed;             /* JS thread */
  int cancel_drained;        /* JS thread */
  struct event *cancel_next; /* call_js's list of drained cancellations */
} event_t;

typedef struct op {
  item_t item; /* IT_OP or IT_SEND */
  client_t *c; /* whose mailbox the result goes to */
  napi_deferred deferred;
  int op;
  prosody_err_t err;
  char *errstr;
  int64_t *times;
  size_t n;
} op_t;

/* Keeps the loop and the JS client alive while something is pending (JS
 * thread): a client dropped with a send in flight must not be finalised
 * (its promise would never settle). */
static void hold(client_t *c, int delta) {
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

/* A log line of the client's, copied on the thread that logged it. At most
 * LOG_QUEUE_LINES wait for the JS thread; more are dropped and counted,
 * never waited for. */
#define LOG_QUEUE_LINES 1024

typedef struct log_line {
  item_t item; /* IT_LOG */
  int level;   /* prosody_log_level_t */
  char subsystem[32];
  char message[]; /* as logged (libprosody bounds it) */
} log_line_t;

/* libprosody's log callback: any of the client's threads. */
static void log_cb(prosody_log_level_t level, const char *subsystem,
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

static void op_free(op_t *op) {
  free(op->errstr);
  free(op->times);
  free(op);
}

static void event_free_maybe(event_t *ev) {
  if (!ev->completed)
    return;
  if (atomic_load(&ev->cancel_fired) && !ev->cancel_drained)
    return; /* its cancellation item is still in the mailbox */
  free(ev);
}

/* Engine thread, context lock held. */
static void cancel_cb(prosody_context_t *ctx, void *opaque) {
  event_t *ev = opaque;
  atomic_store(&ev->cancel_fired, 1);
  ev->cancel_item.kind = IT_CANCEL;
  prosody_queue_push(ev->c->mb.q, &ev->cancel_item);
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
  prosody_context_on_cancel(ctx, cancel_cb, ev);
  prosody_queue_push(c->mb.q, &ev->item);
  return PROSODY_PENDING;
}

static prosody_result_t c_on_message(prosody_context_t *ctx,
                                     const prosody_message_t *msg,
                                     void *opaque) {
  return push_event(opaque, ctx, msg, NULL);
}

static prosody_result_t c_on_timer(prosody_context_t *ctx,
                                   const prosody_timer_t *timer, void *opaque) {
  return push_event(opaque, ctx, NULL, timer);
}

/* The handler has no onMessage (a timer-only handler): each message is
 * done at once, on the engine thread, and committed. */
static prosody_result_t c_skip_message(prosody_context_t *ctx,
                                       const prosody_message_t *msg,
                                       void *opaque) {
  return PROSODY_SUCCESS;
}

static void set_str(napi_env env, napi_value o, const char *name,
                    const char *s) {
  napi_value v;
  if (!s)
    return;
  napi_create_string_utf8(env, s, NAPI_AUTO_LENGTH, &v);
  napi_set_named_property(env, o, name, v);
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
                         make_error(env, op->err, op->errstr));
  } else {
    napi_value v;
    if (op->item.kind == IT_OP && op->op == PROSODY_TIMER_SCHEDULED) {
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
  op_free(op);
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
static void call_js(napi_env env, napi_value js_cb, void *context, void *data) {
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
      if (c->wrap_gone) { /* a result nobody can await any more */
        op_free((op_t *)it);
        break;
      }
      op_settle(env, (op_t *)it);
      hold(c, -1);
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
    event_free_maybe(ev);
    cancels = nextc;
  }
  if (b.n && c->dispatch)
    call_client_fn(env, c->dispatch, 1, &b.array);
}

static void client_free(client_t *c) {
  if (c->client && !c->destroyed) {
    prosody_client_destroy(c->client);
    c->destroyed = 1;
  }
}

/* The client's environment cleanup hook: the environment then closes every
 * threadsafe function itself, and releasing one would abort. Per client,
 * not per process: a worker thread's teardown must not stop the main
 * thread's clients from releasing theirs. */
static void mark_closing(void *arg) { ((client_t *)arg)->env_closing = 1; }

/* Frees c once both its JS object and its threadsafe function are gone. */
static void client_release(napi_env env, client_t *c) {
  if (!c->wrap_gone || !c->tsfn_gone)
    return;
  if (c->logger)
    napi_delete_reference(env, c->logger);
  prosody_queue_destroy(c->mb.q);
  free(c);
}

static void tsfn_finalize(napi_env env, void *data, void *hint) {
  client_t *c = data;
  c->tsfn_gone = 1;
  client_release(env, c);
}

/* What arrived after the last batch: results nobody can await now are
 * freed; log lines (those of the client's closing) are listed again for
 * the threadsafe function's last call, which gives them to the logger. */
static void mailbox_close(client_t *c) {
  unsigned long dropped;
  item_t *it = prosody_queue_take(c->mb.q, &dropped);
  int keep = c->logger && !c->tsfn_gone && !c->env_closing, relisted = 0;
  while (it) {
    item_t *next = it->next;
    if (it->kind == IT_LOG && keep && !prosody_queue_offer(c->mb.q, it)) {
      relisted = 1; /* the first one wakes the threadsafe function */
    } else if (it->kind == IT_LOG) {
      free(it);
    } else if (it->kind == IT_OP || it->kind == IT_SEND) {
      op_free((op_t *)it);
    }
    it = next;
  }
  if (dropped && keep) {
    c->mb.carried += dropped;
    if (!relisted)
      mailbox_wake(&c->mb);
  }
}

static void client_finalize(napi_env env, void *data, void *hint) {
  client_t *c = data;
  atomic_store(&c->mb.closed, 1);
  client_free(c);
  mailbox_close(c);
  if (c->dispatch)
    napi_delete_reference(env, c->dispatch);
  c->dispatch = NULL;
  if (c->self)
    napi_delete_reference(env, c->self);
  c->self = NULL;
  if (!c->env_closing)
    napi_remove_env_cleanup_hook(env, mark_closing, c);
  c->wrap_gone = 1;
  if (c->tsfn_gone)
    client_release(env, c);
  else if (!c->env_closing) /* its queued calls are still made */
    napi_release_threadsafe_function(c->mb.tsfn, napi_tsfn_release);
}

static client_t *unwrap_client(napi_env env, napi_callback_info info,
                               size_t *argc, napi_value *argv) {
  napi_value self;
  client_t *c = NULL;
  if (napi_get_cb_info(env, info, argc, argv, &self, NULL) != napi_ok ||
      napi_unwrap(env, self, (void **)&c) != napi_ok || !c) {
    napi_throw_error(env, NULL, "not a ProsodyClient");
    return NULL;
  }
  if (c->destroyed) {
    napi_throw_error(env, NULL, "the client has been closed");
    return NULL;
  }
  return c;
}

/* A configuration from an object of option name -> string (index.js has
 * converted the values to libprosody's text form). */
static prosody_config_t *config_from(napi_env env, napi_value obj) {
  prosody_config_t *conf = prosody_config_new();
  napi_value names;
  uint32_t n;
  char err[1024];
  if (!conf) {
    napi_throw_error(env, NULL, "out of memory");
    return NULL;
  }
  if (napi_get_property_names(env, obj, &names) != napi_ok ||
      napi_get_array_length(env, names, &n) != napi_ok) {
    prosody_config_destroy(conf);
    throw_last(env);
    return NULL;
  }
  for (uint32_t i = 0; i < n; i++) {
    napi_value k, v;
    char *name, *value;
    prosody_err_t rc;
    napi_get_element(env, names, i, &k);
    napi_get_property(env, obj, k, &v);
    if (!(name = string_arg(env, k, "option name"))) {
      prosody_config_destroy(conf);
      return NULL;
    }
    if (!(value = string_arg(env, v, name))) {
      free(name);
      prosody_config_destroy(conf);
      return NULL;
    }
    rc = prosody_config_set(conf, name, value, err, sizeof(err));
    free(name);
    free(value);
    if (rc) {
      prosody_config_destroy(conf);
      throw_error(env, rc, err);
      return NULL;
    }
  }
  return conf;
}

/* NativeClient(options, logger?): `logger`, a function, is given each
 * batch of the client's log lines ([level, subsystem, message, ...] and how
 * many were dropped); without it libprosody writes them to stderr. */
static napi_value client_new(napi_env env, napi_callback_info info) {
  size_t argc = 2;
  napi_value argv[2], self, name;
  napi_valuetype t = napi_undefined;
  client_t *c;
  prosody_config_t *conf;
  char err[1024];
  CHECK(env, napi_get_cb_info(env, info, &argc, argv, &self, NULL));
  if (argc < 1) {
    napi_throw_type_error(env, NULL, "options object required");
    return NULL;
  }
  if (argc > 1)
    napi_typeof(env, argv[1], &t);
  if (!(conf = config_from(env, argv[0])))
    return NULL;
  if (!(c = calloc(1, sizeof(*c)))) {
    prosody_config_destroy(conf);
    napi_throw_error(env, NULL, "out of memory");
    return NULL;
  }
  /* Resolved by the option table (set value, environment, default) before
   * the client takes the configuration. */
  for (int i = 0; i < 2; i++) {
    char val[32];
    if (!prosody_config_get(conf, i ? "timer_spans" : "message_spans", val,
                            sizeof(val), NULL, NULL, 0))
      c->follows_from[i] = !strcmp(val, "follows_from");
  }
  c->env = env;
  atomic_init(&c->mb.closed, 0);
  /* The mailbox first: the client logs while it is being created. */
  if (!(c->mb.q = prosody_queue_new(LOG_QUEUE_LINES, err, sizeof(err)))) {
    prosody_config_destroy(conf);
    free(c);
    napi_throw_error(env, NULL, err);
    return NULL;
  }
  napi_create_string_utf8(env, "prosody", NAPI_AUTO_LENGTH, &name);
  if (napi_create_threadsafe_function(env, NULL, NULL, name, 0, 1, c,
                                      tsfn_finalize, c, call_js,
                                      &c->mb.tsfn) != napi_ok) {
    prosody_config_destroy(conf);
    prosody_queue_destroy(c->mb.q);
    free(c);
    throw_last(env);
    return NULL;
  }
  prosody_queue_set_wake_cb(c->mb.q, mailbox_wake, &c->mb);
  /* Nothing pending yet: the client alone never keeps the process up. */
  napi_unref_threadsafe_function(env, c->mb.tsfn);
  if (t == napi_function &&
      napi_create_reference(env, argv[1], 1, &c->logger) == napi_ok)
    prosody_config_set_log_cb(conf, log_cb, c);
  if (!(c->client = prosody_client_new(conf, err, sizeof(err)))) {
    prosody_config_destroy(conf);
    call_js(env, NULL, c, NULL); /* the lines of the failed creation */
    c->wrap_gone = 1;            /* tsfn_finalize frees c */
    napi_release_threadsafe_function(c->mb.tsfn, napi_tsfn_release);
    return throw_error(env, PROSODY_ERR_CONFIG, err);
  }
  napi_add_env_cleanup_hook(env, mark_closing, c);
  if (napi_wrap(env, self, c, client_finalize, NULL, NULL) != napi_ok) {
    client_finalize(env, c, NULL);
    throw_last(env);
    return NULL;
  }
  napi_create_reference(env, self, 0, &c->self);
  call_js(env, NULL, c, NULL); /* the creation's lines, before it returns */
  return self;
}

/* Send: results come back through the mailbox. */
static void send_cb(prosody_err_t err, const char *errstr,
                    const prosody_delivery_t *d, void *opaque) {
  op_t *op = opaque;
  op->err = err;
  op->errstr = err && errstr ? strdup(errstr) : NULL;
  prosody_queue_push(op->c->mb.q, &op->item);
}

/* send(topic, key, json, traceparent?, tracestate?, baggage?) -> Promise */
static napi_value client_send(napi_env env, napi_callback_info info) {
  size_t argc = 6;
  napi_value argv[6], promise;
  client_t *c = unwrap_client(env, info, &argc, argv);
  char *s[6] = {0}, err[1024];
  prosody_trace_t trace = {0};
  op_t *op;
  prosody_err_t rc;
  if (!c)
    return NULL;
  if (argc < 3) {
    napi_throw_type_error(env, NULL, "send(topic, key, json)");
    return NULL;
  }
  for (size_t i = 0; i < argc && i < 6; i++) {
    napi_valuetype t;
    napi_typeof(env, argv[i], &t);
    if (i >= 3 && (t == napi_undefined || t == napi_null))
      continue;
    if (!(s[i] = string_arg(env, argv[i],
                            i == 0   ? "topic"
                            : i == 1 ? "key"
                            : i == 2 ? "payload"
                                     : "trace header")))
      goto fail;
  }
  trace.traceparent = s[3];
  trace.tracestate = s[4];
  trace.baggage = s[5];
  if (!(op = calloc(1, sizeof(*op)))) {
    napi_throw_error(env, NULL, "out of memory");
    goto fail;
  }
  op->item.kind = IT_SEND;
  op->c = c;
  napi_create_promise(env, &op->deferred, &promise);
  rc = prosody_send_async(c->client, s[0], s[1], s[2],
                          s[3] || s[4] || s[5] ? &trace : NULL, send_cb, op,
                          err, sizeof(err));
  if (rc) {
    napi_reject_deferred(env, op->deferred, make_error(env, rc, err));
    free(op);
  } else {
    hold(c, 1);
  }
  for (int i = 0; i < 6; i++)
    free(s[i]);
  return promise;
fail:
  for (int i = 0; i < 6; i++)
    free(s[i]);
  return NULL;
}

/* Blocking calls on libuv's pool. */
typedef struct work {
  napi_async_work work;
  napi_deferred deferred;
  client_t *c;
  prosody_admin_t *admin;
  napi_ref keep; /* the JS object, alive while the work runs */
  int kind;      /* 0 subscribe, 1 unsubscribe, 2 create, 3 delete */
  char *name, *policy;
  prosody_topic_options_t topts;
  prosody_err_t err;
  char errstr[1024];
} work_t;

static void work_execute(napi_env env, void *data) {
  work_t *w = data;
  switch (w->kind) {
  case 0: {
    prosody_handler_t h = {w->c->has_message ? c_on_message : c_skip_message,
                           w->c->has_timer ? c_on_timer : NULL, w->c,
                           PROSODY_HANDLER_ASYNC};
    w->err = prosody_subscribe(w->c->client, &h, w->errstr, sizeof(w->errstr));
    break;
  }
  case 1:
    w->err = prosody_unsubscribe(w->c->client);
    if (w->err == PROSODY_ERR_STATE) /* was not subscribed: nothing to do */
      w->err = PROSODY_OK;
    break;
  case 2:
    w->topts.cleanup_policy = w->policy;
    w->err = prosody_admin_create_topic(w->admin, w->name, &w->topts, w->errstr,
                                        sizeof(w->errstr));
    break;
  default:
    w->err = prosody_admin_delete_topic(w->admin, w->name, w->errstr,
                                        sizeof(w->errstr));
  }
}

static void work_complete(napi_env env, napi_status status, void *data) {
  work_t *w = data;
  if (w->c && (w->kind == 0 || w->kind == 1)) {
    if (w->kind == 1 || w->err) {
      /* The subscription no longer keeps the loop up; once only, though
       * two unsubscribe() calls may both have been queued. */
      if (w->c->subscribed)
        hold(w->c, -1);
      w->c->subscribed = 0;
      /* The dispatcher closes over the JS client: keeping it would keep
       * the client (and this struct) alive for ever. */
      if (w->c->dispatch) {
        napi_delete_reference(env, w->c->dispatch);
        w->c->dispatch = NULL;
      }
      /* What the stop logged reaches the logger before the promise
       * settles (the process may end right after it). */
      call_js(env, NULL, w->c, NULL);
    }
  }
  if (w->err) {
    napi_reject_deferred(env, w->deferred, make_error(env, w->err, w->errstr));
  } else {
    napi_value u;
    napi_get_undefined(env, &u);
    napi_resolve_deferred(env, w->deferred, u);
  }
  napi_delete_async_work(env, w->work);
  napi_delete_reference(env, w->keep);
  free(w->name);
  free(w->policy);
  free(w);
}

static napi_value queue_work(napi_env env, work_t *w, napi_value self) {
  napi_value promise, name;
  napi_create_promise(env, &w->deferred, &promise);
  napi_create_reference(env, self, 1, &w->keep);
  napi_create_string_utf8(env, "prosody", NAPI_AUTO_LENGTH, &name);
  napi_create_async_work(env, NULL, name, work_execute, work_complete, w,
                         &w->work);
  napi_queue_async_work(env, w->work);
  return promise;
}

/* subscribe(dispatch, hasTimer, hasMessage) -> Promise */
static napi_value client_subscribe(napi_env env, napi_callback_info info) {
  size_t argc = 3;
  napi_value argv[3], self;
  client_t *c;
  work_t *w;
  bool has_timer = false, has_message = true;
  CHECK(env, napi_get_cb_info(env, info, &argc, argv, &self, NULL));
  if (!(c = unwrap_client(env, info, &argc, argv)))
    return NULL;
  if (c->subscribed) {
    napi_throw_error(env, NULL, "already subscribed: call unsubscribe() first");
    return NULL;
  }
  if (!strcmp(prosody_consumer_state(c->client), "unconfigured")) {
    napi_throw_error(env, NULL,
                     "subscribe() needs the groupId and subscribedTopics "
                     "options (or PROSODY_GROUP_ID and "
                     "PROSODY_SUBSCRIBED_TOPICS)");
    return NULL;
  }
  napi_get_value_bool(env, argv[1], &has_timer);
  if (argc > 2)
    napi_get_value_bool(env, argv[2], &has_message);
  if (c->dispatch)
    napi_delete_reference(env, c->dispatch);
  CHECK(env, napi_create_reference(env, argv[0], 1, &c->dispatch));
  c->has_timer = has_timer;
  c->has_message = has_message;
  if (!(w = calloc(1, sizeof(*w)))) {
    napi_throw_error(env, NULL, "out of memory");
    return NULL;
  }
  w->c = c;
  w->kind = 0;
  c->subscribed = 1;
  hold(c, 1); /* a subscription keeps the loop up until unsubscribe */
  return queue_work(env, w, self);
}

static napi_value client_unsubscribe(napi_env env, napi_callback_info info) {
  size_t argc = 0;
  napi_value self;
  client_t *c;
  work_t *w;
  CHECK(env, napi_get_cb_info(env, info, &argc, NULL, &self, NULL));
  if (!(c = unwrap_client(env, info, &argc, NULL)))
    return NULL;
  if (!(w = calloc(1, sizeof(*w)))) {
    napi_throw_error(env, NULL, "out of memory");
    return NULL;
  }
  w->c = c;
  w->kind = 1;
  if (!c->subscribed) { /* nothing to stop: a resolved promise */
    napi_value promise, u;
    napi_deferred d;
    free(w);
    napi_create_promise(env, &d, &promise);
    napi_get_undefined(env, &u);
    napi_resolve_deferred(env, d, u);
    return promise;
  }
  return queue_work(env, w, self);
}

/* Completes one event (JS thread). */
static int complete_one(napi_env env, napi_value evv, napi_value rv,
                        napi_value mv) {
  event_t *ev;
  int32_t r;
  char *msg = NULL;
  size_t len;
  napi_valuetype t;
  if (napi_get_value_external(env, evv, (void **)&ev) != napi_ok ||
      napi_get_value_int32(env, rv, &r) != napi_ok)
    return -1;
  if (ev->completed)
    return 0;
  napi_typeof(env, mv, &t);
  /* A description: one with a NUL (a user's error message) is cut there,
   * never refused, so that the result always reaches libprosody. */
  if (t == napi_string && !(msg = string_copy(env, mv, "msg", &len)))
    return -1;
  prosody_complete(ev->ctx, (prosody_result_t)r, msg);
  free(msg);
  ev->completed = 1;
  event_free_maybe(ev);
  return 0;
}

/* completeMany([ev, result, message, ...]): the results of one JavaScript
 * turn in one call, so libprosody's engine wakes once for them. */
static napi_value client_complete_many(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1];
  uint32_t n;
  CHECK(env, napi_get_cb_info(env, info, &argc, argv, NULL, NULL));
  CHECK(env, napi_get_array_length(env, argv[0], &n));
  for (uint32_t i = 0; i + 2 < n; i += 3) {
    napi_value e, r, m;
    napi_get_element(env, argv[0], i, &e);
    napi_get_element(env, argv[0], i + 1, &r);
    napi_get_element(env, argv[0], i + 2, &m);
    if (complete_one(env, e, r, m)) {
      throw_last(env);
      return NULL;
    }
  }
  return NULL;
}

static void op_cb(prosody_err_t err, const char *errstr, const int64_t *times,
                  size_t n, void *opaque) {
  op_t *op = opaque;
  op->errstr = err && errstr ? strdup(errstr) : NULL;
  op->err = err;
  if (!err && n && (op->times = malloc(n * sizeof(int64_t)))) {
    memcpy(op->times, times, n * sizeof(int64_t));
    op->n = n;
  }
  prosody_queue_push(op->c->mb.q, &op->item);
}

/* timerOp(ev, op, timeMs) -> Promise */
static napi_value client_timer_op(napi_env env, napi_callback_info info) {
  size_t argc = 3;
  napi_value argv[3], promise;
  client_t *c;
  event_t *ev;
  int32_t kind;
  double t = 0;
  op_t *op;
  char err[512];
  prosody_err_t rc;
  if (!(c = unwrap_client(env, info, &argc, argv)))
    return NULL;
  CHECK(env, napi_get_value_external(env, argv[0], (void **)&ev));
  CHECK(env, napi_get_value_int32(env, argv[1], &kind));
  if (argc > 2)
    napi_get_value_double(env, argv[2], &t);
  if (ev->completed)
    return throw_error(
        env, PROSODY_ERR_STATE,
        "the context is stale: its handler has already finished");
  if (!(op = calloc(1, sizeof(*op)))) {
    napi_throw_error(env, NULL, "out of memory");
    return NULL;
  }
  op->item.kind = IT_OP;
  op->op = kind;
  op->c = c;
  napi_create_promise(env, &op->deferred, &promise);
  rc = prosody_timer_async(ev->ctx, (prosody_timer_op_t)kind, (int64_t)t, op_cb,
                           op, err, sizeof(err));
  if (rc) {
    napi_reject_deferred(env, op->deferred, make_error(env, rc, err));
    free(op);
  } else {
    hold(c, 1);
  }
  return promise;
}

/* shouldCancel(ev) -> bool */
static napi_value client_should_cancel(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1], r;
  event_t *ev;
  CHECK(env, napi_get_cb_info(env, info, &argc, argv, NULL, NULL));
  CHECK(env, napi_get_value_external(env, argv[0], (void **)&ev));
  napi_get_boolean(env, ev->completed || prosody_should_cancel(ev->ctx), &r);
  return r;
}

/* followsFrom() -> [message_spans, timer_spans] are follows_from */
static napi_value client_follows_from(napi_env env, napi_callback_info info) {
  size_t argc = 0;
  napi_value r, b;
  client_t *c = unwrap_client(env, info, &argc, NULL);
  if (!c)
    return NULL;
  napi_create_array_with_length(env, 2, &r);
  for (uint32_t i = 0; i < 2; i++) {
    napi_get_boolean(env, c->follows_from[i], &b);
    napi_set_element(env, r, i, b);
  }
  return r;
}

static napi_value client_state(napi_env env, napi_callback_info info) {
  size_t argc = 0;
  napi_value r;
  client_t *c = unwrap_client(env, info, &argc, NULL);
  if (!c)
    return NULL;
  napi_create_string_utf8(env, prosody_consumer_state(c->client),
                          NAPI_AUTO_LENGTH, &r);
  return r;
}

static napi_value client_assigned(napi_env env, napi_callback_info info) {
  size_t argc = 0;
  napi_value r;
  client_t *c = unwrap_client(env, info, &argc, NULL);
  if (!c)
    return NULL;
  napi_create_int32(env, prosody_assigned_partition_count(c->client), &r);
  return r;
}

static napi_value client_stalled(napi_env env, napi_callback_info info) {
  size_t argc = 0;
  napi_value r;
  client_t *c = unwrap_client(env, info, &argc, NULL);
  if (!c)
    return NULL;
  napi_get_boolean(env, prosody_is_stalled(c->client), &r);
  return r;
}

static napi_value client_source_system(napi_env env, napi_callback_info info) {
  size_t argc = 0;
  napi_value r;
  client_t *c = unwrap_client(env, info, &argc, NULL);
  if (!c)
    return NULL;
  napi_create_string_utf8(env, prosody_client_source_system(c->client),
                          NAPI_AUTO_LENGTH, &r);
  return r;
}

static napi_value client_probe_port(napi_env env, napi_callback_info info) {
  size_t argc = 0;
  napi_value r;
  client_t *c = unwrap_client(env, info, &argc, NULL);
  if (!c)
    return NULL;
  napi_create_int32(env, prosody_probe_port(c->client), &r);
  return r;
}

/* ------------------------------------------------------------------------ */
/* Admin                                                                     */
/* ------------------------------------------------------------------------ */

static void admin_finalize(napi_env env, void *data, void *hint) {
  prosody_admin_destroy(data);
}

static napi_value admin_new(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1], self;
  prosody_config_t *conf;
  prosody_admin_t *a;
  char err[1024];
  CHECK(env, napi_get_cb_info(env, info, &argc, argv, &self, NULL));
  if (argc < 1) {
    napi_throw_type_error(env, NULL, "options object required");
    return NULL;
  }
  if (!(conf = config_from(env, argv[0])))
    return NULL;
  if (!(a = prosody_admin_new(conf, err, sizeof(err)))) {
    prosody_config_destroy(conf);
    return throw_error(env, PROSODY_ERR_CONFIG, err);
  }
  if (napi_wrap(env, self, a, admin_finalize, NULL, NULL) != napi_ok) {
    prosody_admin_destroy(a);
    throw_last(env);
    return NULL;
  }
  return self;
}

/* createTopic(name, partitions, replication, policy|null, retentionMs) */
static napi_value admin_create(napi_env env, napi_callback_info info) {
  size_t argc = 5;
  napi_value argv[5], self;
  prosody_admin_t *a;
  work_t *w;
  int32_t p = 0, r = 0;
  double ret = 0;
  napi_valuetype t;
  CHECK(env, napi_get_cb_info(env, info, &argc, argv, &self, NULL));
  CHECK(env, napi_unwrap(env, self, (void **)&a));
  if (!(w = calloc(1, sizeof(*w)))) {
    napi_throw_error(env, NULL, "out of memory");
    return NULL;
  }
  if (!(w->name = string_arg(env, argv[0], "name"))) {
    free(w);
    return NULL;
  }
  napi_get_value_int32(env, argv[1], &p);
  napi_get_value_int32(env, argv[2], &r);
  napi_typeof(env, argv[3], &t);
  if (t == napi_string && !(w->policy = string_arg(env, argv[3], "policy"))) {
    free(w->name);
    free(w);
    return NULL;
  }
  napi_get_value_double(env, argv[4], &ret);
  w->admin = a;
  w->kind = 2;
  w->topts.partitions = p;
  w->topts.replication_factor = (int16_t)r;
  w->topts.retention_ms = (int64_t)ret;
  return queue_work(env, w, self);
}

static napi_value admin_delete(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1], self;
  prosody_admin_t *a;
  work_t *w;
  CHECK(env, napi_get_cb_info(env, info, &argc, argv, &self, NULL));
  CHECK(env, napi_unwrap(env, self, (void **)&a));
  if (!(w = calloc(1, sizeof(*w)))) {
    napi_throw_error(env, NULL, "out of memory");
    return NULL;
  }
  if (!(w->name = string_arg(env, argv[0], "name"))) {
    free(w);
    return NULL;
  }
  w->admin = a;
  w->kind = 3;
  return queue_work(env, w, self);
}

/* ------------------------------------------------------------------------ */
/* Module                                                                    */
/* ------------------------------------------------------------------------ */

/* options() -> {name: {type, accepted, env}} from libprosody's table. */
static napi_value mod_options(napi_env env, napi_callback_info info) {
  napi_value o, d;
  napi_create_object(env, &o);
  for (size_t i = 0; i < prosody_option_count(); i++) {
    const prosody_option_info_t *oi = prosody_option_info(i);
    napi_create_object(env, &d);
    set_str(env, d, "type", oi->type);
    set_str(env, d, "accepted", oi->accepted);
    set_str(env, d, "env", oi->env);
    napi_set_named_property(env, o, oi->name, d);
  }
  return o;
}

static napi_value mod_version(napi_env env, napi_callback_info info) {
  napi_value v;
  napi_create_string_utf8(env, prosody_version_str(), NAPI_AUTO_LENGTH, &v);
  return v;
}

static napi_value init(napi_env env, napi_value exports) {
  napi_property_descriptor client_props[] = {
      {"send", NULL, client_send, NULL, NULL, NULL, napi_default, NULL},
      {"subscribe", NULL, client_subscribe, NULL, NULL, NULL, napi_default,
       NULL},
      {"unsubscribe", NULL, client_unsubscribe, NULL, NULL, NULL, napi_default,
       NULL},
      {"completeMany", NULL, client_complete_many, NULL, NULL, NULL,
       napi_default, NULL},
      {"timerOp", NULL, client_timer_op, NULL, NULL, NULL, napi_default, NULL},
      {"shouldCancel", NULL, client_should_cancel, NULL, NULL, NULL,
       napi_default, NULL},
      {"consumerState", NULL, client_state, NULL, NULL, NULL, napi_default,
       NULL},
      {"assignedPartitionCount", NULL, client_assigned, NULL, NULL, NULL,
       napi_default, NULL},
      {"isStalled", NULL, client_stalled, NULL, NULL, NULL, napi_default, NULL},
      {"sourceSystem", NULL, client_source_system, NULL, NULL, NULL,
       napi_default, NULL},
      {"probePort", NULL, client_probe_port, NULL, NULL, NULL, napi_default,
       NULL},
      {"followsFrom", NULL, client_follows_from, NULL, NULL, NULL, napi_default,
       NULL},
  };
  napi_property_descriptor admin_props[] = {
      {"createTopic", NULL, admin_create, NULL, NULL, NULL, napi_default, NULL},
      {"deleteTopic", NULL, admin_delete, NULL, NULL, NULL, napi_default, NULL},
  };
  napi_property_descriptor fns[] = {
      {"options", NULL, mod_options, NULL, NULL, NULL, napi_default, NULL},
      {"libraryVersion", NULL, mod_version, NULL, NULL, NULL, napi_default,
       NULL},
  };
  napi_value cls;
  napi_define_class(env, "NativeClient", NAPI_AUTO_LENGTH, client_new, NULL,
                    sizeof(client_props) / sizeof(client_props[0]),
                    client_props, &cls);
  napi_set_named_property(env, exports, "NativeClient", cls);
  napi_define_class(env, "NativeAdmin", NAPI_AUTO_LENGTH, admin_new, NULL,
                    sizeof(admin_props) / sizeof(admin_props[0]), admin_props,
                    &cls);
  napi_set_named_property(env, exports, "NativeAdmin", cls);
  napi_define_properties(env, exports, sizeof(fns) / sizeof(fns[0]), fns);
  return exports;
}

NAPI_MODULE(NODE_GYP_MODULE_NAME, init)
