/*
 * prosody_py.h - what the files of the native module `prosody.prosody`
 * share (private to bindings/python/src; never installed). The module is
 * split by type, as confluent-kafka-python's is:
 *
 *   module.c   the module: its functions, the references it takes from
 *              the pure-Python modules at import, errors, shared helpers
 *   options.c  keyword options to libprosody's text form; datetime and
 *              millisecond conversions
 *   bridge.c   from libprosody's threads to the event loop: the mailbox
 *              (a libprosody event queue), log lines, each event's handler
 *              started on the loop
 *   context.c  Context: results, timer calls, cancellation
 *   state.c    keyed state: Context.state()'s native handles, their calls
 *              (prosody_state_async, back through the mailbox as timer
 *              calls are) and state_collections
 *   published.c  published keyed state: ProsodyClient.state()'s readers
 *              (PublishedHandle, prosody_published_async) and the read
 *              boxes (one per client and loop) their results come back
 *              through
 *   client.c   ProsodyClient: send, subscribe, unsubscribe, state
 *   admin.c    AdminClient: topic creation and deletion
 *
 * Threads. Python objects are touched only by a thread holding the GIL.
 * libprosody calls back on these threads:
 *  - the engine thread (on_message / on_timer of the asynchronous handler,
 *    timer-call results, cancellations): it never takes the GIL. It pushes
 *    an item to the subscription's mailbox, a libprosody event queue
 *    (prosody_queue_t), whose descriptor the event loop watches
 *    (loop.add_reader). The loop thread takes every item per wake-up:
 *    one wake-up per batch, not per event.
 *  - the client's reader thread (published-state results; or the calling
 *    thread, when the answer was cached): as the engine thread, it pushes
 *    to a queue the loop watches: a read box of the client (published.c).
 *  - the producer's delivery thread (send results): it takes the GIL and
 *    resolves the future with loop.call_soon_threadsafe.
 *  - executor threads (subscribe, unsubscribe, admin calls, which block in
 *    C): they run with the GIL released while in C.
 *  - any of the client's threads (its log lines): like the engine thread,
 *    the callback copies the line into the client's bounded log queue
 *    (`log_sink_t`), which wakes the loop; the loop hands the batch to
 *    `logging` (_support.forward_logs).
 *
 * Ownership. A mailbox belongs to its client object and lives until the
 * client is deallocated (the queue's own lock guards its list). A mailbox
 * item holds what the loop needs: a context handle and the record (valid
 * until prosody_complete), a timer-call result, or a cancellation (holding
 * a reference to its Context object, taken on the loop thread when it
 * registered).
 *
 * Names shared between the files start with pp_ and have hidden
 * visibility: the extension exports PyInit_prosody alone.
 */
#ifndef PROSODY_PY_H
#define PROSODY_PY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <jansson.h>
#include <stdatomic.h>
#include <stdint.h>
#include <unistd.h>

#include "prosody.h"

/* Python 3.8 has neither of these. */
#if PY_VERSION_HEX < 0x030A0000
static inline PyObject *Py_NewRef(PyObject *o) {
  Py_INCREF(o);
  return o;
}
#endif
#if PY_VERSION_HEX < 0x03090000
#define PyObject_CallNoArgs(f) PyObject_CallFunctionObjArgs((f), NULL)
#endif

#if PY_VERSION_HEX >= 0x030D0000
#define PR_FINALIZING() Py_IsFinalizing()
#else
#define PR_FINALIZING() _Py_IsFinalizing()
#endif

#pragma GCC visibility push(hidden)

/* ------------------------------------------------------------------------ */
/* Module-level references (set once at import, GIL held; module.c)         */
/* ------------------------------------------------------------------------ */

extern PyObject *ErrProsody, *ErrTransient, *ErrPermanent; /* prosody.errors */
extern PyObject *ClsEventHandlerError;
extern PyObject *ClsMessage, *ClsTimer;             /* prosody.message/.timer */
extern PyObject *ClsExciseMessage;                  /* prosody.message */
extern PyObject *FnCreateClient, *FnShutdownClient; /* prosody._support */
extern PyObject *ClsConsumerState, *FnReady;        /* prosody._support */
extern PyObject *FnTraceHeaders, *FnHandlerContext, *FnRunAfter;
extern int otel_enabled;
extern PyObject *FnGetRunningLoop, *FnJsonDumps, *FnJsonLoads;
extern PyObject *S_create_future, *S_create_task, *S_add_done_callback,
    *S_set_result, *S_set_exception, *S_cancelled, *S_exception, *S_done,
    *S_call_soon_threadsafe, *S_add_reader, *S_remove_reader,
    *S_run_in_executor, *S_run, *S_end, *S_record_exception, *S_is_permanent,
    *S_await, *S_anext, *S_is_closed, *S__core;

extern PyObject *FnForwardLogs; /* prosody._support.forward_logs */
extern PyObject *ErrTransientState, *ErrPermanentState; /* prosody.errors */
extern PyObject *FnStateBind, *FnStateConfigs;          /* prosody.state */
extern PyObject *FnStateMessageNames;                   /* prosody.state */

/* ------------------------------------------------------------------------ */
/* The mailbox (bridge.c)                                                   */
/* ------------------------------------------------------------------------ */

/* A mailbox is libprosody's event queue (prosody_queue_t): callbacks on
 * libprosody's threads push items, its descriptor wakes the loop
 * (add_reader) once per batch, and the loop thread takes the batch. */
enum item_kind { IT_MESSAGE, IT_TIMER, IT_OP, IT_CANCEL };

typedef struct item {
  prosody_queue_item_t q; /* first: the queue's link and the kind */
  prosody_context_t *ctx; /* IT_MESSAGE, IT_TIMER */
  const void *event;      /* the message or timer */
  void *obj;              /* IT_OP: the op; IT_CANCEL: the Context */
} item_t;

/* The item after `it` in a taken list. */
#define ITEM_NEXT(it) ((item_t *)(it)->q.next)

typedef struct log_line {
  item_t item;
  int level; /* prosody_log_level_t */
  char subsystem[32];
  char message[]; /* as logged (libprosody bounds it) */
} log_line_t;

/* A client's log lines. libprosody's log callback (any of the client's
 * threads, GIL not held) copies each line into `box`, a bounded event
 * queue whose descriptor the loop watches; the loop thread forwards them to
 * `logging` (_support.forward_logs). Owned by a capsule: the client holds
 * it, and so does the reader registered on a loop, so neither outlives the
 * other's use of it. */
typedef struct log_sink {
  prosody_queue_t *box;
  PyObject *source; /* the client's source_system (GIL), once known */
} log_sink_t;

/* ------------------------------------------------------------------------ */
/* Types                                                                    */
/* ------------------------------------------------------------------------ */

typedef struct {
  PyObject_HEAD
  prosody_client_t *client;
  pid_t pid;
  prosody_queue_t *bridge; /* the mailbox, made at the first subscribe */
  int subscribed;          /* subscribing, running or unsubscribing */
  int sub_failed;          /* the executor's prosody_subscribe failed */
  int has_timer;           /* the handler implements on_timer */
  int has_excise;          /* the handler takes excise records */
  int current;  /* made by create(): the current API's contract (README) */
  int orphaned; /* unsubscribing from another loop: subscribe()'s closed */
  int halted;   /* a handler raised SystemExit or KeyboardInterrupt: no
                   handler runs until unsubscribe() */
  int spans_follow[2]; /* message_spans / timer_spans are follows_from */
  char sub_err[1024];
  PyObject *loop, *handler, *on_message, *on_timer, *on_excise, *create_task;
  PyObject *shutdown_fut; /* the shutdown() task, once called: shared */
  PyObject *sub_fut;      /* the subscribe call's future while subscribed */
  PyObject *unsub_fut;    /* the unsubscribe task while one runs: shared */
  PyObject *stop_exc;     /* SystemExit or KeyboardInterrupt a synchronous
                             handler raised in this drain, re-raised after it */
  PyObject *log_sink;     /* capsule of its log_sink_t */
  PyObject *log_loop;     /* the loop watching the sink's queue, or NULL */
  /* frozenset: the names of its MESSAGE collections (set by init, then
   * read only; GIL) */
  PyObject *message_states;
  PyObject *reads; /* published.c: {loop: capsule of that loop's read
                      box}, once it opened a reader; NULL before */
} ClientObject;

typedef struct {
  PyObject_HEAD
  prosody_context_t *ctx;
  ClientObject *client; /* strong reference */
  PyObject *cancel_fut; /* on_cancel()'s future, created on first call */
  PyObject *span;       /* the handler's OpenTelemetry span, if any */
  int finished;         /* prosody_complete has been called */
  int cancel_registered;
  atomic_int cancel_fired; /* written by the cancelling thread */
  item_t cancel_item;
} ContextObject;

typedef struct {
  PyObject_HEAD
  prosody_admin_t *admin;
  pid_t pid;
} AdminObject;

/* A record of a MESSAGE collection's result, copied out of its
 * prosody_message_t on the engine thread (that message is freed with the
 * result); its strings are in the op's items block. topic NULL: the item
 * has no record (absent, or a keys-only scan). */
typedef struct pp_state_msg {
  const char *topic;
  const char *key; /* or NULL */
  const char *payload;
  size_t payload_len;
  int64_t offset;
  int64_t timestamp; /* ms, or -1 */
  int32_t partition;
} pp_state_msg_t;

/* Timer and keyed-state calls: the op travels to libprosody and back
 * through the mailbox. Filled by its callback (a libprosody thread) before
 * the push, read on the loop thread after the take. */
typedef struct pyop {
  item_t item;
  prosody_queue_t *bridge; /* where the result goes: the subscription's
                              mailbox, or the client's read box */
  PyObject *fut;           /* strong reference, dropped on the loop thread */
  int op;                  /* prosody_timer_op_t or prosody_state_op_t */
  int state;               /* a keyed-state op (state.c) */
  prosody_err_t err;
  char *errstr;
  int64_t *times;              /* timer SCHEDULED: the times */
  size_t n;                    /* of times, or of items */
  prosody_state_item_t *items; /* state: the result's items, copied into
                                  one block with their strings */
  pp_state_msg_t *msgs;        /* state: one per item when the result has
                                  records (MESSAGE collections), in the
                                  items block; else NULL */
  int64_t number;              /* state: the result's number */
} pyop_t;

extern PyTypeObject ClientType, ContextType, AdminType, StateType,
    PublishedType;

/* ------------------------------------------------------------------------ */
/* module.c: errors and loop helpers                                        */
/* ------------------------------------------------------------------------ */

/* A new exception object for a libprosody error. */
PyObject *pp_error_object(prosody_err_t err, const char *msg);
/* Sets the Python error for a libprosody error; returns NULL. */
PyObject *pp_raise_error(prosody_err_t err, const char *msg);
/* -1 with RuntimeError set when called in a child forked after `pid`
 * made the object (`what` names it). */
int pp_check_fork(pid_t pid, const char *what);
/* _support.Ready(value): an awaitable of a value already known; takes
 * `value` (NULL passes an error through). */
PyObject *pp_ready(PyObject *value);
/* The running asyncio loop, or NULL with a RuntimeError naming `what`. */
PyObject *pp_running_loop(const char *what);
/* getattr(import(module), name), or NULL with an exception set. */
PyObject *pp_attr_of(const char *module, const char *name);

/* ------------------------------------------------------------------------ */
/* options.c: options and conversions                                       */
/* ------------------------------------------------------------------------ */

/* Imports datetime's C API for this file and builds what conversions
 * need (UTC, the epoch, the option table's types); 0 or -1. */
int pp_options_init(void);
/* Every option name mapped to its type (borrowed). */
PyObject *pp_options_types(void);
/* A configuration from keyword arguments (None values unset), or NULL
 * with an exception set. */
prosody_config_t *pp_config_from(PyObject *kwargs);
/* Milliseconds since the epoch of an aware datetime; -1 with an exception
 * set on error. */
int pp_to_ms(PyObject *dt, const char *what, int64_t *out);
/* An aware UTC datetime for milliseconds since the epoch. */
PyObject *pp_from_ms(int64_t ms);
/* Seconds of a timedelta into *out: 1, or 0 when `v` is not one. */
int pp_delta_seconds(PyObject *v, double *out);

/* ------------------------------------------------------------------------ */
/* bridge.c: libprosody's threads to the loop                               */
/* ------------------------------------------------------------------------ */

/* libprosody's log callback (any of the client's threads). */
void pp_log_cb(prosody_log_level_t level, const char *subsystem,
               const char *message, void *opaque);
/* Forwards the sink's queued lines to `logging` (GIL held). */
void pp_log_drain(log_sink_t *s);
/* A capsule owning a new log sink, or NULL with an exception set. */
PyObject *pp_log_sink_new(void);
log_sink_t *pp_log_sink_of(PyObject *capsule);
/* The loop's reader for a sink's queue (self: the capsule). */
extern PyMethodDef pp_log_reader_def;
/* The asynchronous handler's callbacks (engine thread). */
prosody_result_t pp_c_on_message(prosody_context_t *ctx,
                                 const prosody_message_t *msg, void *opaque);
prosody_result_t pp_c_on_timer(prosody_context_t *ctx,
                               const prosody_timer_t *timer, void *opaque);
/* A prosody.message.Message this package delivers (to on_message, or read
 * back from a MESSAGE collection): marked as such (its `_core`), which is
 * what a MESSAGE collection's write accepts. `key` may be NULL (None);
 * `ts` in ms, or negative for none; `payload` is taken (NULL passes an
 * error through). Loop thread. */
PyObject *pp_message_new(const char *topic, int32_t partition, int64_t offset,
                         int64_t ts, const char *key, PyObject *payload);
/* The loop's reader for the mailbox: handles every item queued since the
 * last wake-up (self: the client). */
PyObject *pp_client_drain(PyObject *self, PyObject *unused);
extern PyMethodDef pp_drain_def;

/* ------------------------------------------------------------------------ */
/* context.c: Context                                                       */
/* ------------------------------------------------------------------------ */

ContextObject *pp_context_new(ClientObject *c, prosody_context_t *ctx);
/* Ends the handler's span, recording the failure if any. */
void pp_end_span(ContextObject *cx, PyObject *exc);
/* Completes on_cancel()'s future, if any and not done (loop thread). */
void pp_resolve_cancel(ContextObject *cx);
/* Reports the invocation's result to libprosody, once (loop thread). */
void pp_context_finish(ContextObject *cx, prosody_result_t r, const char *msg);
/* Finishes with the result and message an exception calls for. */
void pp_finish_with_exception(ContextObject *cx, PyObject *exc);
/* The handler task's done callback (self: the Context). */
extern PyMethodDef pp_task_done_def;
/* A new op of `c`'s mailbox with its future (loop thread), or NULL with
 * an exception set (also when the client is not subscribed). */
pyop_t *pp_op_new(ClientObject *c, int kind);
/* A new op whose result goes to `box`, its future on `loop`. */
pyop_t *pp_op_on(prosody_queue_t *box, PyObject *loop, int kind);
/* Records the op's outcome and pushes it to its mailbox (any thread; the
 * result fields are filled by the caller first). */
void pp_op_post(pyop_t *op, prosody_err_t err, const char *errstr);
/* Settles a timer or state call's future and frees the op (loop thread). */
void pp_op_resolve(pyop_t *op);
/* Frees an op whose future nobody can await any more. */
void pp_op_free(pyop_t *op);

/* ------------------------------------------------------------------------ */
/* state.c: keyed state                                                     */
/* ------------------------------------------------------------------------ */

/* Context.state(definition) and Context._state_open(name). */
PyObject *pp_context_state(PyObject *self, PyObject *definition);
PyObject *pp_context_state_open(PyObject *self, PyObject *name);
/* A state call's exception object (a StateError), for its error. */
PyObject *pp_state_error_object(prosody_err_t err, const char *msg);
/* Sets that exception; returns NULL. */
PyObject *pp_state_raise(prosody_err_t err, const char *msg);
/* A prosody_state_cb (any thread, no GIL): copies the result into the op
 * (`opaque`) and posts it. */
void pp_state_done_cb(prosody_err_t err, const char *errstr,
                      const prosody_state_result_t *r, void *opaque);
/* `seq`, a sequence of str, as C strings for prosody_state_args_t.keys:
 * *cks (PyMem_Free it) borrows from *fast (release it). 0, or -1 with an
 * exception set. */
int pp_state_keys(PyObject *seq, PyObject **fast, const char ***cks, size_t *n);
/* A state call's result, (items, number): items a list of (key, json)
 * (each str or None; in a MESSAGE collection a Message in place of json). */
PyObject *pp_state_result(const pyop_t *op);
/* Registers state_collections (a sequence of definitions) with `conf`:
 * 0, or -1 with ValueError set naming the entry. */
int pp_state_add_collections(prosody_config_t *conf, PyObject *seq);

/* ------------------------------------------------------------------------ */
/* client.c and admin.c                                                     */
/* ------------------------------------------------------------------------ */

/* What the types need once at import (0, or -1 with an exception). */
int pp_client_init(void);

/* ------------------------------------------------------------------------ */
/* published.c: published keyed state                                      */
/* ------------------------------------------------------------------------ */

/* The native client's _published_value/_map/_deque(subsystem, name,
 * read_cache=None). */
PyObject *pp_published_value(PyObject *self, PyObject *args, PyObject *kw);
PyObject *pp_published_map(PyObject *self, PyObject *args, PyObject *kw);
PyObject *pp_published_deque(PyObject *self, PyObject *args, PyObject *kw);
/* At the client's deallocation, after prosody_client_destroy (whose
 * readers' last results are in the boxes): has each loop settle what is
 * left in its box and stop watching it. */
void pp_reads_close(ClientObject *c);
int pp_admin_init(void);

#pragma GCC visibility pop

#endif /* PROSODY_PY_H */
