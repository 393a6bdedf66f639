/*
 * prosody_node.h - what the files of the N-API addon of
 * @prosody-events/prosody share (private to bindings/node/src; never
 * installed). index.js builds the user-facing API on the addon, which is
 * split by type, as node-rdkafka's is:
 *
 *   module.c   registers NativeClient and NativeAdmin, the module's
 *              functions (options, libraryVersion) and errors
 *   options.c  string arguments and the options object to a configuration
 *   bridge.c   from libprosody's threads to the JavaScript thread: the
 *              mailbox (a libprosody event queue), log lines, each batch of
 *              events handed to index.js
 *   context.c  results (completeMany), timer calls, keyed state (and
 *              published state's reads), cancellation
 *   client.c   NativeClient: lifetime, send, subscribe, unsubscribe, state,
 *              opening published state's readers
 *   admin.c    NativeAdmin: topic creation and deletion
 *
 * Names shared between the files start with pn_ and have hidden
 * visibility: the addon exports its module registration alone.
 *
 * Threads. JavaScript runs only on the JS thread. libprosody calls back on:
 *  - the engine thread: on_message / on_timer of the asynchronous handler
 *    (return PROSODY_PENDING at once), timer-call and keyed-state results,
 *    cancellations;
 *  - the client's published-state reader thread: published reads' results
 *    (or the JS thread itself, inside prosody_published_async, when the
 *    answer is cached: the item then waits in the mailbox like any other);
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
#ifndef PROSODY_NODE_H
#define PROSODY_NODE_H

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
      pn_throw_last(env);                                                      \
      return NULL;                                                             \
    }                                                                          \
  } while (0)

#pragma GCC visibility push(hidden)

/* ------------------------------------------------------------------------ */
/* Types                                                                    */
/* ------------------------------------------------------------------------ */

/* A client's mailbox is libprosody's event queue (prosody_queue_t): the
 * callbacks on libprosody's threads push items, and the queue's wake-up,
 * once per batch, is a call of the client's threadsafe function, whose
 * JS-thread callback (pn_call_js) takes the batch. */
enum { IT_EVENT, IT_CANCEL, IT_OP, IT_SEND, IT_LOG, IT_STATE };

typedef prosody_queue_item_t item_t;

typedef struct mailbox {
  prosody_queue_t *q; /* freed with the client struct (client_release) */
  atomic_int closed;  /* the JS object is finalized: log_cb drops lines */
  unsigned long
      carried; /* log lines dropped before the last batch was
                  re-listed, said by the next pn_call_js (JS thread) */
  napi_threadsafe_function tsfn;
  pthread_mutex_t wake_lock; /* guards gone, and each call of tsfn from
                                another thread against its finalizer */
  int gone; /* the threadsafe function was finalized (env teardown can
               free it before the client's threads stop logging) */
} mailbox_t;

typedef struct client {
  prosody_client_t *client;
  uint32_t next_id; /* event ids (engine thread) */
  mailbox_t mb;
  napi_ref dispatch;          /* the JS function receiving each batch */
  int subscribed;             /* subscribe started and not yet unsubscribed */
  int has_timer, has_message; /* the handler's methods (JS thread) */
  int has_excise;             /* it takes excise records (JS thread) */
  /* NativeClient(options, logger, true): the configuration open() makes
   * the client from (its work owns it meanwhile), else NULL. */
  prosody_config_t *pending_conf;
  int pending; /* work that keeps the loop alive (JS thread) */
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

/* A record of a MESSAGE collection's result, copied out of the
 * prosody_message_t on the engine thread (that message is freed with the
 * result); its strings are in the op's items allocation. */
typedef struct state_msg {
  const char *topic;
  const char *key; /* or NULL */
  const char *payload;
  size_t payload_len;
  int64_t offset;
  int64_t timestamp;
  int32_t partition;
} state_msg_t;

/* A timer call, a send or a keyed-state operation in flight: made on the
 * JS thread, filled by its callback on libprosody's thread, then pushed to
 * the mailbox; settled and freed on the JS thread. */
typedef struct op {
  item_t item; /* IT_OP, IT_SEND or IT_STATE */
  client_t *c; /* whose mailbox the result goes to */
  napi_deferred deferred;
  int op;
  prosody_err_t err;
  char *errstr;
  int64_t *times;              /* IT_OP: PROSODY_TIMER_SCHEDULED's times */
  prosody_state_item_t *items; /* IT_STATE: the result's items, their
                                  strings in the same allocation */
  state_msg_t *msgs; /* IT_STATE: one per item (its record, or topic NULL)
                        when the result has records; in items' allocation */
  int64_t number;    /* IT_STATE: the result's number */
  size_t n;          /* times or items */
} op_t;

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

/* Blocking calls on libuv's pool. */
typedef struct work {
  napi_async_work work;
  napi_deferred deferred;
  client_t *c;
  prosody_admin_t *admin;
  napi_ref keep; /* the JS object, alive while the work runs */
  /* 0 subscribe, 1 unsubscribe, 2 create, 3 delete, 4 open (the client),
   * 5 shutdown, 6 open a published collection's reader */
  int kind;
  char *name;               /* the topic, or the published collection */
  char *policy;             /* the cleanup policy, or the subsystem (kind 6) */
  int state_kind;           /* kind 6: prosody_state_kind_t */
  int64_t read_cache_ms;    /* kind 6 */
  prosody_published_t *pub; /* kind 6: the reader opened */
  prosody_topic_options_t topts;
  prosody_err_t err;
  char errstr[1024];
} work_t;

/* ------------------------------------------------------------------------ */
/* Functions                                                                */
/* ------------------------------------------------------------------------ */

/* module.c: errors */
/* Throws the last N-API error, unless an exception is pending. */
void pn_throw_last(napi_env env);
/* An Error with `code` (the C error's name) and `transient`; a RangeError
 * for argument, configuration and payload errors. */
napi_value pn_make_error(napi_env env, prosody_err_t err, const char *msg);
/* Throws pn_make_error(); returns NULL. */
napi_value pn_throw_error(napi_env env, prosody_err_t err, const char *msg);

/* options.c */
/* A NUL-terminated UTF-8 copy (malloc'd) of a JS string and, into *len, its
 * length in bytes; or NULL with a TypeError pending. */
char *pn_string_copy(napi_env env, napi_value v, const char *what, size_t *len);
/* A NUL-free C copy (malloc'd) of a JS string argument named `what`, or
 * NULL with a TypeError or RangeError pending. */
char *pn_string_arg(napi_env env, napi_value v, const char *what);
/* A configuration from an object of option name -> text, or NULL with an
 * exception pending. */
prosody_config_t *pn_config_from(napi_env env, napi_value obj);

/* bridge.c: libprosody's threads to the JavaScript thread */
/* The queue's wake-up (any thread): calls the threadsafe function. */
void pn_mailbox_wake(void *mailbox);
/* Counts work that keeps the loop and the JS client alive (JS thread). */
void pn_hold(client_t *c, int delta);
/* libprosody's log callback (any of the client's threads). */
void pn_log_cb(prosody_log_level_t level, const char *subsystem,
               const char *message, void *opaque);
/* The asynchronous handler's callbacks (engine thread). */
prosody_result_t pn_c_on_message(prosody_context_t *ctx,
                                 const prosody_message_t *msg, void *opaque);
prosody_result_t pn_c_on_timer(prosody_context_t *ctx,
                               const prosody_timer_t *timer, void *opaque);
prosody_result_t pn_c_skip_message(prosody_context_t *ctx,
                                   const prosody_message_t *msg, void *opaque);
/* The threadsafe function's JS-thread callback: one call per batch. */
void pn_call_js(napi_env env, napi_value js_cb, void *context, void *data);
/* After the client is destroyed: frees what nobody can await, re-lists
 * its last log lines for the threadsafe function's last call. */
void pn_mailbox_close(client_t *c);

/* context.c: results, timer calls, cancellation */
void pn_op_free(op_t *op);
/* Frees `ev` once its result was given and its cancellation drained. */
void pn_event_free_maybe(event_t *ev);
/* prosody_context_on_cancel's callback (engine thread, context lock). */
void pn_cancel_cb(prosody_context_t *ctx, void *opaque);
napi_value pn_client_complete_many(napi_env env, napi_callback_info info);
napi_value pn_client_timer_op(napi_env env, napi_callback_info info);
napi_value pn_client_should_cancel(napi_env env, napi_callback_info info);
napi_value pn_client_state_open(napi_env env, napi_callback_info info);
napi_value pn_client_state_op(napi_env env, napi_callback_info info);
napi_value pn_client_published_op(napi_env env, napi_callback_info info);
/* The result of an IT_STATE op for its promise: [number, key, json, ...]
 * (null for an absent key or document); in a MESSAGE collection each
 * record is [topic, partition, offset, timestamp, key, payload] in place
 * of json (key a hole when the record has none). */
napi_value pn_state_result(napi_env env, const op_t *op);
/* Registers the collections of `defs` (index.js's flat array, see
 * client.c) with `conf`; -1 with an exception pending. */
int pn_config_add_states(napi_env env, prosody_config_t *conf, napi_value defs);

/* client.c */
/* The client wrapped in `this`, or NULL with an exception pending (also
 * once it is closed). */
client_t *pn_unwrap_client(napi_env env, napi_callback_info info, size_t *argc,
                           napi_value *argv);
/* Queues a blocking call on libuv's pool; its promise. */
napi_value pn_queue_work(napi_env env, work_t *w, napi_value self);
/* The NativeClient class. */
napi_value pn_client_class(napi_env env);

/* admin.c */
/* The NativeAdmin class. */
napi_value pn_admin_class(napi_env env);

#pragma GCC visibility pop

#endif /* PROSODY_NODE_H */
