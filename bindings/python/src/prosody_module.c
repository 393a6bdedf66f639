/*
 * prosody_module.c - the native module `prosody.prosody`: ProsodyClient,
 * AdminClient and Context over libprosody's public header.
 *
 * Threads. Python objects are touched only by a thread holding the GIL.
 * libprosody calls back on three kinds of threads:
 *  - the engine thread (on_message / on_timer of the asynchronous handler,
 *    timer-call results, cancellations): it never takes the GIL. It pushes
 *    an item to the subscription's mailbox, a libprosody event queue
 *    (prosody_queue_t), whose descriptor the event loop watches
 *    (loop.add_reader). The loop thread takes every item per wake-up:
 *    one wake-up per batch, not per event.
 *  - the producer's delivery thread (send results): it takes the GIL and
 *    resolves the future with loop.call_soon_threadsafe.
 *  - executor threads (subscribe, unsubscribe, admin calls, which block in
 *    C): they run with the GIL released while in C.
 *  - any of the client's threads (its log lines): like the engine thread,
 *    the callback copies the line into the client's bounded log mailbox
 *    (`log_sink_t`, a bounded event queue) and the queue wakes the loop; it
 * hands the batch to `logging` (_support.forward_logs).
 *
 * Ownership. A mailbox belongs to its client object and lives until the
 * client is deallocated (the queue's own lock guards its list).
 * A mailbox item holds what the loop needs: a context handle and the
 * record (valid until prosody_complete), a timer-call result, or a
 * cancellation (holding a reference to its Context object, taken on the
 * loop thread when it registered).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <datetime.h>
#include <structmember.h>

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
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

/* ------------------------------------------------------------------------ */
/* Module-level references (set once at import, GIL held)                    */
/* ------------------------------------------------------------------------ */

static PyObject *ErrProsody, *ErrTransient, *ErrPermanent; /* prosody.errors */
static PyObject *ClsEventHandlerError;
static PyObject *ClsMessage, *ClsTimer;      /* prosody.message/.timer */
static PyObject *ClsConsumerState, *FnReady; /* prosody._support */
static PyObject *FnTraceHeaders, *FnHandlerContext, *FnRunAfter;
static int otel_enabled;
static PyObject *FnGetRunningLoop, *FnJsonDumps, *FnJsonLoads;
static PyObject *Utc, *Epoch;
static PyObject *S_create_future, *S_create_task, *S_add_done_callback,
    *S_set_result, *S_set_exception, *S_cancelled, *S_exception, *S_done,
    *S_call_soon_threadsafe, *S_add_reader, *S_remove_reader,
    *S_run_in_executor, *S_run, *S_end, *S_record_exception, *S_is_permanent,
    *S_await, *S_anext, *S_is_closed;

static PyObject *option_types; /* dict: option name -> type string */

/* ------------------------------------------------------------------------ */
/* Errors                                                                    */
/* ------------------------------------------------------------------------ */

static PyObject *error_class(prosody_err_t err) {
  switch (err) {
  case PROSODY_ERR_INVALID_ARG:
  case PROSODY_ERR_CONFIG:
  case PROSODY_ERR_INVALID_PAYLOAD:
    return PyExc_ValueError;
  case PROSODY_ERR_NOMEM:
    return PyExc_MemoryError;
  case PROSODY_ERR_STATE:
  case PROSODY_ERR_UNSUPPORTED:
    return ErrProsody;
  default:
    return prosody_err_is_transient(err) ? ErrTransient : ErrPermanent;
  }
}

/* A new exception object for a libprosody error. */
static PyObject *error_object(prosody_err_t err, const char *msg) {
  PyObject *cls = error_class(err);
  if (!msg || !*msg)
    msg = prosody_err_message(err);
  if (cls == PyExc_ValueError || cls == PyExc_MemoryError)
    return PyObject_CallFunction(cls, "s", msg);
  return PyObject_CallFunction(cls, "ss", msg, prosody_err_name(err));
}

/* Sets the Python error for a libprosody error; returns NULL. */
static PyObject *raise_error(prosody_err_t err, const char *msg) {
  PyObject *exc = error_object(err, msg);
  if (exc) {
    PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
    Py_DECREF(exc);
  }
  return NULL;
}

static int check_fork(pid_t pid, const char *what) {
  if (getpid() != pid) {
    PyErr_Format(PyExc_RuntimeError,
                 "%s used after fork(): librdkafka's threads do not survive "
                 "fork, so a client cannot be used in a forked child; create "
                 "a new one there",
                 what);
    return -1;
  }
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Conversions                                                               */
/* ------------------------------------------------------------------------ */

/* Milliseconds since the epoch of an aware datetime; -1 with an exception
 * set on error (times before the epoch are refused by the core anyway). */
static int to_ms(PyObject *dt, const char *what, int64_t *out) {
  PyObject *off, *delta;
  if (!PyDateTime_Check(dt)) {
    PyErr_Format(PyExc_TypeError,
                 "%s: expected an aware datetime.datetime, got %.100s", what,
                 Py_TYPE(dt)->tp_name);
    return -1;
  }
  off = PyObject_CallMethod(dt, "utcoffset", NULL);
  if (!off)
    return -1;
  if (off == Py_None) {
    Py_DECREF(off);
    PyErr_Format(PyExc_ValueError,
                 "%s: naive datetime refused (its time zone is unknown); pass "
                 "an aware one, e.g. datetime.now(timezone.utc)",
                 what);
    return -1;
  }
  Py_DECREF(off);
  if (!(delta = PyNumber_Subtract(dt, Epoch)))
    return -1;
  if (!PyDelta_Check(delta)) { /* a subclass's __sub__ */
    PyErr_Format(PyExc_TypeError, "%s: %.100s - datetime is not a timedelta",
                 what, Py_TYPE(dt)->tp_name);
    Py_DECREF(delta);
    return -1;
  }
  *out = (int64_t)PyDateTime_DELTA_GET_DAYS(delta) * 86400000 +
         (int64_t)PyDateTime_DELTA_GET_SECONDS(delta) * 1000 +
         PyDateTime_DELTA_GET_MICROSECONDS(delta) / 1000;
  Py_DECREF(delta);
  return 0;
}

/* An aware UTC datetime for milliseconds since the epoch. */
static PyObject *from_ms(int64_t ms) {
  PyObject *delta, *dt;
  int64_t s = ms / 1000, rem = ms % 1000;
  if (rem < 0) {
    rem += 1000;
    s -= 1;
  }
  delta = PyDelta_FromDSU((int)(s / 86400), (int)(s % 86400), (int)rem * 1000);
  if (!delta)
    return NULL;
  dt = PyNumber_Add(Epoch, delta);
  Py_DECREF(delta);
  return dt;
}

/* The payload's jansson tree as Python objects. */
static PyObject *json_to_py(const json_t *j) {
  switch (json_typeof(j)) {
  case JSON_OBJECT: {
    PyObject *d = PyDict_New();
    const char *k;
    json_t *v;
    if (!d)
      return NULL;
    json_object_foreach((json_t *)j, k, v) {
      PyObject *pk = PyUnicode_FromString(k), *pv = pk ? json_to_py(v) : NULL;
      if (!pv || PyDict_SetItem(d, pk, pv)) {
        Py_XDECREF(pk);
        Py_XDECREF(pv);
        Py_DECREF(d);
        return NULL;
      }
      Py_DECREF(pk);
      Py_DECREF(pv);
    }
    return d;
  }
  case JSON_ARRAY: {
    size_t n = json_array_size(j);
    PyObject *l = PyList_New((Py_ssize_t)n);
    if (!l)
      return NULL;
    for (size_t i = 0; i < n; i++) {
      PyObject *v = json_to_py(json_array_get(j, i));
      if (!v) {
        Py_DECREF(l);
        return NULL;
      }
      PyList_SET_ITEM(l, (Py_ssize_t)i, v);
    }
    return l;
  }
  case JSON_STRING:
    return PyUnicode_FromStringAndSize(json_string_value(j),
                                       (Py_ssize_t)json_string_length(j));
  case JSON_INTEGER:
    return PyLong_FromLongLong(json_integer_value(j));
  case JSON_REAL:
    return PyFloat_FromDouble(json_real_value(j));
  case JSON_TRUE:
    Py_RETURN_TRUE;
  case JSON_FALSE:
    Py_RETURN_FALSE;
  default:
    Py_RETURN_NONE;
  }
}

/* ------------------------------------------------------------------------ */
/* Options                                                                   */
/* ------------------------------------------------------------------------ */

static const prosody_option_info_t *option_named(const char *name) {
  for (size_t i = 0; i < prosody_option_count(); i++) {
    const prosody_option_info_t *o = prosody_option_info(i);
    if (!strcmp(o->name, name))
      return o;
  }
  return NULL;
}

static int type_error(const prosody_option_info_t *o, PyObject *v) {
  PyErr_Format(PyExc_TypeError, "option %s: expected %s, got %.100s", o->name,
               o->accepted, Py_TYPE(v)->tp_name);
  return -1;
}

/* The option's value as libprosody's text form, in a new bytes-like str
 * (UTF-8 via PyUnicode_AsUTF8). NULL with an exception on error; *skip is
 * set when the value is None (unset). */
static PyObject *option_text(const prosody_option_info_t *o, PyObject *v,
                             int *skip) {
  const char *t = o->type;
  *skip = 0;
  if (v == Py_None) {
    if (!strcmp(o->name, "probe_port"))
      return PyUnicode_FromString("none");
    *skip = 1;
    return NULL;
  }
  if (PyUnicode_Check(v)) /* the text form, as in the environment */
    return Py_NewRef(v);
  if (!strcmp(t, "duration")) {
    if (PyDelta_Check(v)) {
      long long us, d = PyDateTime_DELTA_GET_DAYS(v);
      if (d > 100000000 || d < -100000000) /* too many us for long long */
        return PyUnicode_FromFormat(
            "%llds", d * 86400 + PyDateTime_DELTA_GET_SECONDS(v));
      us = d * 86400000000LL +
           (long long)PyDateTime_DELTA_GET_SECONDS(v) * 1000000LL +
           PyDateTime_DELTA_GET_MICROSECONDS(v);
      return PyUnicode_FromFormat("%lldus", us);
    }
    if (PyBool_Check(v))
      return type_error(o, v), NULL;
    if (PyLong_Check(v)) {
      PyObject *s = PyObject_Str(v), *r;
      if (!s)
        return NULL;
      r = PyUnicode_FromFormat("%Us", s);
      Py_DECREF(s);
      return r;
    }
    if (PyFloat_Check(v)) {
      double f = PyFloat_AS_DOUBLE(v);
      char buf[64];
      if (!isfinite(f)) {
        PyErr_Format(PyExc_ValueError, "option %s: %R is not a duration (%s)",
                     o->name, v, o->accepted);
        return NULL;
      }
      if (fabs(f) < 9e9)
        snprintf(buf, sizeof(buf), "%lldns", (long long)llround(f * 1e9));
      else
        snprintf(buf, sizeof(buf), "%.0fs", f);
      return PyUnicode_FromString(buf);
    }
    return type_error(o, v), NULL;
  }
  if (!strcmp(t, "integer")) {
    if (PyLong_Check(v) && !PyBool_Check(v))
      return PyObject_Str(v);
    return type_error(o, v), NULL;
  }
  if (!strcmp(t, "number")) {
    if ((PyLong_Check(v) && !PyBool_Check(v)) || PyFloat_Check(v)) {
      PyObject *f = PyNumber_Float(v), *r;
      if (!f)
        return NULL;
      r = PyObject_Repr(f);
      Py_DECREF(f);
      return r;
    }
    return type_error(o, v), NULL;
  }
  if (!strcmp(t, "boolean")) {
    if (PyBool_Check(v))
      return PyUnicode_FromString(v == Py_True ? "true" : "false");
    return type_error(o, v), NULL;
  }
  if (strstr(t, "list")) {
    if (PyList_Check(v) || PyTuple_Check(v)) {
      PyObject *sep, *r;
      Py_ssize_t n = PySequence_Size(v);
      for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *e = PySequence_Fast_GET_ITEM(v, i);
        if (!PyUnicode_Check(e)) {
          PyErr_Format(PyExc_TypeError,
                       "option %s: expected %s (a str or a list of str), got "
                       "a list holding %.100s",
                       o->name, o->accepted, Py_TYPE(e)->tp_name);
          return NULL;
        }
      }
      if (!(sep = PyUnicode_FromString(",")))
        return NULL;
      r = PyUnicode_Join(sep, v);
      Py_DECREF(sep);
      return r;
    }
    return type_error(o, v), NULL;
  }
  return type_error(o, v), NULL;
}

/* A configuration from keyword arguments (None values unset). */
static prosody_config_t *config_from(PyObject *kwargs) {
  prosody_config_t *conf = prosody_config_new();
  PyObject *k, *v;
  Py_ssize_t pos = 0;
  char err[1024];
  if (!conf)
    return (prosody_config_t *)PyErr_NoMemory();
  while (kwargs && PyDict_Next(kwargs, &pos, &k, &v)) {
    Py_ssize_t name_len, len;
    const char *name = PyUnicode_AsUTF8AndSize(k, &name_len), *text;
    const prosody_option_info_t *o;
    PyObject *s;
    int skip;
    prosody_err_t rc;
    if (!name)
      goto fail;
    if (strlen(name) != (size_t)name_len || !(o = option_named(name))) {
      PyErr_Format(PyExc_ValueError,
                   "unknown option %R (the options are listed in "
                   "docs/CONFIGURATION.md; names are snake_case)",
                   k);
      goto fail;
    }
    s = option_text(o, v, &skip);
    if (skip)
      continue;
    if (!s || !(text = PyUnicode_AsUTF8AndSize(s, &len))) {
      Py_XDECREF(s);
      goto fail;
    }
    /* libprosody's options are C strings: a NUL would cut the value short
     * ("app\0-other-team" would be the group "app"). */
    if (strlen(text) != (size_t)len) {
      PyErr_Format(PyExc_ValueError,
                   "option %s: the value contains a NUL character (\\x00) "
                   "at index %zd; an option cannot hold one",
                   name,
                   PyUnicode_FindChar(s, 0, 0, PyUnicode_GET_LENGTH(s), 1));
      Py_DECREF(s);
      goto fail;
    }
    rc = prosody_config_set(conf, name, text, err, sizeof(err));
    Py_DECREF(s);
    if (rc) {
      raise_error(rc, err);
      goto fail;
    }
  }
  return conf;
fail:
  prosody_config_destroy(conf);
  return NULL;
}

/* ------------------------------------------------------------------------ */
/* The mailbox between libprosody's threads and the event loop               */
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

/* ------------------------------------------------------------------------ */
/* Log lines (libprosody's threads -> the loop -> `logging`)                 */
/* ------------------------------------------------------------------------ */

/* The lines a client may have queued for `logging`; more are dropped (and
 * counted) rather than waited for. */
#define LOG_QUEUE_LINES 1024

typedef struct log_line {
  item_t item;
  int level; /* prosody_log_level_t */
  char subsystem[32];
  char message[]; /* as logged (libprosody bounds it) */
} log_line_t;

/* A client's log lines. libprosody's log callback (any of the client's
 * threads, GIL not held) copies each line into `box`, a bounded event
 * queue whose descriptor the loop watches; the loop thread forwards them to
 * `logging`
 * (_support.forward_logs). Owned by a capsule: the client holds it, and so
 * does the reader registered on a loop, so neither outlives the other's
 * use of it. */
typedef struct log_sink {
  prosody_queue_t *box;
  PyObject *source; /* the client's source_system (GIL), once known */
} log_sink_t;

static void log_cb(prosody_log_level_t level, const char *subsystem,
                   const char *message, void *opaque) {
  log_sink_t *s = opaque;
  size_t n = strlen(message);
  log_line_t *l = malloc(sizeof(*l) + n + 1);
  if (l) {
    l->level = (int)level;
    snprintf(l->subsystem, sizeof(l->subsystem), "%s", subsystem);
    memcpy(l->message, message, n + 1);
  }
  if (prosody_queue_offer(s->box, l ? &l->item.q : NULL))
    free(l);
}

static PyObject *FnForwardLogs; /* prosody._support.forward_logs */

/* Forwards the queued lines to `logging` (GIL held, any Python thread; the
 * caller's exception, if any, is kept). Without a usable interpreter (it
 * is finalizing) they go to standard error. */
static void log_drain(log_sink_t *s) {
  static const char *const names[] = {"OFF",  "ERROR", "WARN",
                                      "INFO", "DEBUG", "TRACE"};
  PyObject *type, *value, *tb, *lines = NULL, *r = NULL;
  unsigned long dropped;
  item_t *it;
  if (!s)
    return;
  it = (item_t *)prosody_queue_take(s->box, &dropped);
  if (!it && !dropped)
    return;
  PyErr_Fetch(&type, &value, &tb);
  if (!PR_FINALIZING() && (lines = PyList_New(0))) {
    for (item_t *i = it; i && lines; i = ITEM_NEXT(i)) {
      log_line_t *l = (log_line_t *)i;
      PyObject *t = Py_BuildValue("(iss)", l->level, l->subsystem, l->message);
      if (!t || PyList_Append(lines, t))
        Py_CLEAR(lines);
      Py_XDECREF(t);
    }
    if (lines)
      r = PyObject_CallFunction(FnForwardLogs, "OkO", lines, dropped,
                                s->source ? s->source : Py_None);
    if (!r && PyErr_Occurred())
      PyErr_WriteUnraisable(FnForwardLogs);
  }
  while (it) {
    item_t *next = ITEM_NEXT(it);
    log_line_t *l = (log_line_t *)it;
    if (!r) {
      int lv = l->level >= 0 && l->level <= 5 ? l->level : 0;
      fprintf(stderr, "%-5s prosody::%s: %s\n", names[lv], l->subsystem,
              l->message);
    }
    free(l);
    it = next;
  }
  if (!r && dropped)
    fprintf(stderr, "WARN  prosody: %lu log lines dropped\n", dropped);
  Py_XDECREF(lines);
  Py_XDECREF(r);
  PyErr_Restore(type, value, tb);
}

static void log_sink_free(PyObject *capsule) {
  log_sink_t *s = PyCapsule_GetPointer(capsule, "prosody.log_sink");
  if (!s)
    return;
  log_drain(s);
  prosody_queue_destroy(s->box);
  Py_XDECREF(s->source);
  free(s);
}

/* A capsule owning a new sink, or NULL with an exception set. */
static PyObject *log_sink_new(void) {
  log_sink_t *s = calloc(1, sizeof(*s));
  PyObject *cap;
  if (!s || !(s->box = prosody_queue_new(LOG_QUEUE_LINES, NULL, 0))) {
    free(s);
    return PyErr_NoMemory();
  }
  if (!(cap = PyCapsule_New(s, "prosody.log_sink", log_sink_free))) {
    prosody_queue_destroy(s->box);
    free(s);
  }
  return cap;
}

static log_sink_t *log_sink_of(PyObject *capsule) {
  return capsule ? PyCapsule_GetPointer(capsule, "prosody.log_sink") : NULL;
}

/* The loop's reader callback for a sink's queue. */
static PyObject *log_reader(PyObject *capsule, PyObject *unused) {
  log_sink_t *s = log_sink_of(capsule);
  if (!s)
    return NULL;
  log_drain(s);
  Py_RETURN_NONE;
}

static PyMethodDef log_reader_def = {"_forward_logs", log_reader, METH_NOARGS,
                                     NULL};

/* ------------------------------------------------------------------------ */
/* Types                                                                     */
/* ------------------------------------------------------------------------ */

typedef struct {
  PyObject_HEAD
  prosody_client_t *client;
  pid_t pid;
  prosody_queue_t *bridge; /* the mailbox, made at the first subscribe */
  int subscribed;          /* subscribing, running or unsubscribing */
  int sub_failed;          /* the executor's prosody_subscribe failed */
  int has_timer;           /* the handler implements on_timer */
  int orphaned; /* unsubscribing from another loop: subscribe()'s closed */
  int halted;   /* a handler raised SystemExit or KeyboardInterrupt: no
                   handler runs until unsubscribe() */
  int spans_follow[2]; /* message_spans / timer_spans are follows_from */
  char sub_err[1024];
  PyObject *loop, *handler, *on_message, *on_timer, *create_task;
  PyObject *sub_fut;   /* the subscribe call's future while subscribed */
  PyObject *unsub_fut; /* the unsubscribe task while one runs: shared */
  PyObject *stop_exc;  /* SystemExit or KeyboardInterrupt a synchronous
                          handler raised in this drain, re-raised after it */
  PyObject *log_sink;  /* capsule of its log_sink_t */
  PyObject *log_loop;  /* the loop watching the sink's queue, or NULL */
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

static PyTypeObject ClientType, ContextType, AdminType;

/* ------------------------------------------------------------------------ */
/* Context                                                                   */
/* ------------------------------------------------------------------------ */

static ContextObject *context_new(ClientObject *c, prosody_context_t *ctx) {
  ContextObject *cx = PyObject_New(ContextObject, &ContextType);
  if (!cx)
    return NULL;
  cx->ctx = ctx;
  cx->client = c;
  Py_INCREF(c);
  cx->cancel_fut = NULL;
  cx->span = NULL;
  cx->finished = 0;
  cx->cancel_registered = 0;
  atomic_init(&cx->cancel_fired, 0);
  return cx;
}

static void context_dealloc(ContextObject *cx) {
  /* Dropped unfinished (e.g. its task's done callback was discarded by a
   * closed loop): nobody else can complete it; libprosody would wait. */
  if (!cx->finished && cx->client && cx->client->pid == getpid())
    prosody_complete(cx->ctx, PROSODY_TRANSIENT,
                     "the handler's context was dropped before it finished");
  Py_XDECREF(cx->cancel_fut);
  Py_XDECREF(cx->span);
  Py_XDECREF(cx->client);
  PyObject_Free(cx);
}

/* Ends the handler's span, recording the failure if any. */
static void end_span(ContextObject *cx, PyObject *exc) {
  PyObject *span = cx->span, *r;
  if (!span)
    return;
  cx->span = NULL;
  if (exc) {
    r = PyObject_CallMethodObjArgs(span, S_record_exception, exc, NULL);
    if (!r)
      PyErr_WriteUnraisable(span);
    Py_XDECREF(r);
  }
  r = PyObject_CallMethodObjArgs(span, S_end, NULL);
  Py_XDECREF(r);
  if (PyErr_Occurred())
    PyErr_WriteUnraisable(span);
  Py_DECREF(span);
}

/* Completes on_cancel()'s future, if any and not done (loop thread; the
 * caller's exception, if any, is kept). Its loop may be closed (see
 * ClientObject.orphaned): then nobody awaits it, and the error is dropped. */
static void resolve_cancel(ContextObject *cx) {
  PyObject *type, *value, *tb, *done, *r = NULL;
  if (!cx->cancel_fut)
    return;
  PyErr_Fetch(&type, &value, &tb);
  done = PyObject_CallMethodObjArgs(cx->cancel_fut, S_done, NULL);
  if (done == Py_False)
    r = PyObject_CallMethodObjArgs(cx->cancel_fut, S_set_result, Py_None, NULL);
  Py_XDECREF(done);
  Py_XDECREF(r);
  PyErr_Clear();
  PyErr_Restore(type, value, tb);
}

/* Reports the invocation's result to libprosody, once (loop thread). As in
 * the Node package, on_cancel() completes then too: an invocation that is
 * over has nothing left to wait for. */
static void context_finish(ContextObject *cx, prosody_result_t r,
                           const char *msg) {
  if (cx->finished)
    return;
  cx->finished = 1;
  prosody_complete(cx->ctx, r, msg);
  resolve_cancel(cx);
  /* From here the cancel callback cannot fire: if it has not fired, its
   * reference is ours to drop; if it has, the mailbox item drops it. */
  if (cx->cancel_registered && !atomic_load(&cx->cancel_fired)) {
    cx->cancel_registered = 0;
    Py_DECREF(cx);
  }
}

/* The result and message for an exception raised by a handler. */
static prosody_result_t classify(PyObject *exc, PyObject **text) {
  prosody_result_t r = PROSODY_TRANSIENT;
  PyObject *shown = exc, *cause = NULL;
  if (PyObject_IsInstance(exc, ClsEventHandlerError) > 0) {
    PyObject *p = PyObject_GetAttr(exc, S_is_permanent);
    if (p && PyObject_IsTrue(p) > 0)
      r = PROSODY_PERMANENT;
    Py_XDECREF(p);
    cause = PyException_GetCause(exc);
    if (cause)
      shown = cause;
  }
  PyErr_Clear();
  if (shown == exc || PyObject_IsInstance(exc, ErrProsody) > 0)
    *text = PyUnicode_FromFormat("%s: %S", Py_TYPE(exc)->tp_name, exc);
  else
    *text = PyUnicode_FromFormat("%s: %S", Py_TYPE(shown)->tp_name, shown);
  Py_XDECREF(cause);
  if (!*text)
    PyErr_Clear();
  return r;
}

static void finish_with_exception(ContextObject *cx, PyObject *exc) {
  PyObject *text = NULL;
  prosody_result_t r = classify(exc, &text);
  const char *msg = text ? PyUnicode_AsUTF8(text) : NULL;
  if (!msg)
    PyErr_Clear();
  end_span(cx, exc);
  context_finish(cx, r, msg ? msg : "handler raised an exception");
  Py_XDECREF(text);
}

/* The task's done callback: `self` is the Context. */
static PyObject *context_task_done(PyObject *self, PyObject *task) {
  ContextObject *cx = (ContextObject *)self;
  PyObject *c = PyObject_CallMethodObjArgs(task, S_cancelled, NULL), *exc;
  if (!c)
    return NULL;
  if (c == Py_True) {
    Py_DECREF(c);
    end_span(cx, NULL);
    context_finish(cx, PROSODY_TRANSIENT, "the handler's task was cancelled");
    Py_RETURN_NONE;
  }
  Py_DECREF(c);
  if (!(exc = PyObject_CallMethodObjArgs(task, S_exception, NULL)))
    return NULL;
  if (exc == Py_None) {
    end_span(cx, NULL);
    context_finish(cx, PROSODY_SUCCESS, NULL);
  } else {
    /* asyncio re-raised it on the loop thread already: the application
     * is stopping, so no further handler runs (see client_drain). */
    if (PyErr_GivenExceptionMatches(exc, PyExc_SystemExit) ||
        PyErr_GivenExceptionMatches(exc, PyExc_KeyboardInterrupt))
      cx->client->halted = 1;
    finish_with_exception(cx, exc);
  }
  Py_DECREF(exc);
  Py_RETURN_NONE;
}

static PyMethodDef task_done_def = {"_task_done", context_task_done, METH_O,
                                    NULL};

/* Timer calls: the op travels to libprosody and back through the mailbox. */
typedef struct pyop {
  item_t item;
  prosody_queue_t *bridge; /* the subscription's mailbox */
  PyObject *fut;           /* strong reference, dropped on the loop thread */
  int op;
  prosody_err_t err;
  char *errstr;
  int64_t *times;
  size_t n;
} pyop_t;

static void op_done_cb(prosody_err_t err, const char *errstr,
                       const int64_t *times, size_t n, void *opaque) {
  pyop_t *op = opaque;
  op->err = err;
  op->errstr = err && errstr ? strdup(errstr) : NULL;
  if (!err && n && (op->times = malloc(n * sizeof(int64_t)))) {
    memcpy(op->times, times, n * sizeof(int64_t));
    op->n = n;
  }
  prosody_queue_push(op->bridge, &op->item.q);
}

static void op_resolve(pyop_t *op) {
  PyObject *r = NULL, *done = PyObject_CallMethodObjArgs(op->fut, S_done, NULL);
  if (done == Py_False) {
    if (op->err) {
      PyObject *exc = error_object(op->err, op->errstr);
      if (exc) {
        r = PyObject_CallMethodObjArgs(op->fut, S_set_exception, exc, NULL);
        Py_DECREF(exc);
      }
    } else {
      PyObject *v;
      if (op->op == PROSODY_TIMER_SCHEDULED) {
        v = PyList_New((Py_ssize_t)op->n);
        for (size_t i = 0; v && i < op->n; i++) {
          PyObject *t = from_ms(op->times[i]);
          if (!t) {
            Py_CLEAR(v);
            break;
          }
          PyList_SET_ITEM(v, (Py_ssize_t)i, t);
        }
      } else {
        v = Py_NewRef(Py_None);
      }
      if (v) {
        r = PyObject_CallMethodObjArgs(op->fut, S_set_result, v, NULL);
        Py_DECREF(v);
      }
    }
  }
  if (!done || (done == Py_False && !r))
    PyErr_WriteUnraisable(op->fut);
  Py_XDECREF(done);
  Py_XDECREF(r);
  Py_DECREF(op->fut);
  free(op->errstr);
  free(op->times);
  free(op);
}

static PyObject *context_op(ContextObject *cx, int kind, PyObject *time) {
  ClientObject *c = cx->client;
  pyop_t *op;
  int64_t ms = 0;
  char err[512];
  prosody_err_t rc;
  if (check_fork(c->pid, "Context"))
    return NULL;
  if (time && to_ms(time, "time", &ms))
    return NULL;
  if (!c->bridge || !c->loop) {
    PyErr_SetString(ErrProsody, "the client is not subscribed");
    return NULL;
  }
  if (!(op = calloc(1, sizeof(*op))))
    return PyErr_NoMemory();
  if (!(op->fut = PyObject_CallMethodObjArgs(c->loop, S_create_future, NULL))) {
    free(op);
    return NULL;
  }
  op->op = kind;
  op->item.q.kind = IT_OP;
  op->item.obj = op;
  op->bridge = c->bridge;
  rc = prosody_timer_async(cx->ctx, (prosody_timer_op_t)kind, ms, op_done_cb,
                           op, err, sizeof(err));
  if (rc) {
    Py_DECREF(op->fut);
    free(op);
    return raise_error(rc, err);
  }
  return Py_NewRef(op->fut);
}

static PyObject *context_schedule(PyObject *self, PyObject *time) {
  return context_op((ContextObject *)self, PROSODY_TIMER_SCHEDULE, time);
}
static PyObject *context_unschedule(PyObject *self, PyObject *time) {
  return context_op((ContextObject *)self, PROSODY_TIMER_UNSCHEDULE, time);
}
static PyObject *context_clear_and_schedule(PyObject *self, PyObject *time) {
  return context_op((ContextObject *)self, PROSODY_TIMER_CLEAR_AND_SCHEDULE,
                    time);
}
static PyObject *context_clear_scheduled(PyObject *self, PyObject *unused) {
  return context_op((ContextObject *)self, PROSODY_TIMER_CLEAR, NULL);
}
static PyObject *context_scheduled(PyObject *self, PyObject *unused) {
  return context_op((ContextObject *)self, PROSODY_TIMER_SCHEDULED, NULL);
}

static PyObject *context_should_cancel(PyObject *self, PyObject *unused) {
  ContextObject *cx = (ContextObject *)self;
  if (check_fork(cx->client->pid, "Context"))
    return NULL;
  /* A finished invocation is over, as a stale one is for libprosody. */
  return PyBool_FromLong(cx->finished || prosody_should_cancel(cx->ctx));
}

/* Engine (or cancelling) thread, with the context's lock held. */
static void cancel_cb(prosody_context_t *ctx, void *opaque) {
  ContextObject *cx = opaque;
  atomic_store(&cx->cancel_fired, 1);
  cx->cancel_item.q.kind = IT_CANCEL;
  cx->cancel_item.obj = cx;
  prosody_queue_push(cx->client->bridge, &cx->cancel_item.q);
}

static PyObject *ready(PyObject *value);

static PyObject *context_on_cancel(PyObject *self, PyObject *unused) {
  ContextObject *cx = (ContextObject *)self;
  ClientObject *c = cx->client;
  if (check_fork(c->pid, "Context"))
    return NULL;
  /* Made by an earlier call: completed when the invocation finished. */
  if (cx->cancel_fut)
    return Py_NewRef(cx->cancel_fut);
  if (cx->finished) {
    /* Its invocation is over (should_cancel() says so): complete at once,
     * even with no loop (e.g. after unsubscribe). */
    PyObject *loop = PyObject_CallNoArgs(FnGetRunningLoop), *fut, *r;
    if (!loop) {
      PyErr_Clear();
      return ready(Py_NewRef(Py_None));
    }
    fut = PyObject_CallMethodObjArgs(loop, S_create_future, NULL);
    Py_DECREF(loop);
    if (!fut)
      return NULL;
    if (!(r = PyObject_CallMethodObjArgs(fut, S_set_result, Py_None, NULL))) {
      Py_DECREF(fut);
      return NULL;
    }
    Py_DECREF(r);
    return fut;
  }
  if (!c->loop) {
    PyErr_SetString(ErrProsody, "the client is not subscribed");
    return NULL;
  }
  if (!(cx->cancel_fut =
            PyObject_CallMethodObjArgs(c->loop, S_create_future, NULL)))
    return NULL;
  Py_INCREF(cx); /* the registration's reference */
  cx->cancel_registered = 1;
  if (prosody_context_on_cancel(cx->ctx, cancel_cb, cx)) {
    /* Stale: the invocation ended (e.g. timed out); that is a
     * cancellation from the handler's point of view. */
    PyObject *r;
    cx->cancel_registered = 0;
    Py_DECREF(cx);
    r = PyObject_CallMethodObjArgs(cx->cancel_fut, S_set_result, Py_None, NULL);
    if (!r)
      return NULL;
    Py_DECREF(r);
  }
  return Py_NewRef(cx->cancel_fut);
}

static PyObject *context_repr(PyObject *self) {
  ContextObject *cx = (ContextObject *)self;
  return PyUnicode_FromFormat("<prosody.Context %s>",
                              cx->finished ? "finished" : "active");
}

static PyMethodDef context_methods[] = {
    {"schedule", context_schedule, METH_O,
     "schedule(time) -> awaitable: schedules a timer for this event's key at "
     "`time` (aware datetime, rounded to the second)."},
    {"clear_and_schedule", context_clear_and_schedule, METH_O,
     "clear_and_schedule(time) -> awaitable: schedules `time` and removes "
     "every other timer of the key."},
    {"unschedule", context_unschedule, METH_O,
     "unschedule(time) -> awaitable: removes the key's timer at `time`."},
    {"clear_scheduled", context_clear_scheduled, METH_NOARGS,
     "clear_scheduled() -> awaitable: removes every timer of the key."},
    {"scheduled", context_scheduled, METH_NOARGS,
     "scheduled() -> awaitable of list[datetime]: the key's timers."},
    {"should_cancel", context_should_cancel, METH_NOARGS,
     "should_cancel() -> bool: True once the handler should stop (timeout, "
     "shutdown, partition revoked)."},
    {"on_cancel", context_on_cancel, METH_NOARGS,
     "on_cancel() -> awaitable that completes when cancellation is "
     "signalled or the handler has finished."},
    {NULL}};

static PyTypeObject ContextType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "prosody.prosody.Context",
    .tp_basicsize = sizeof(ContextObject),
    .tp_dealloc = (destructor)context_dealloc,
    .tp_repr = context_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The context of one handler invocation: timers for the event's "
              "key and cancellation. Valid until the handler returns.",
    .tp_methods = context_methods,
};

/* ------------------------------------------------------------------------ */
/* Handler hand-over (engine thread -> loop)                                 */
/* ------------------------------------------------------------------------ */

static prosody_result_t push_event(prosody_queue_t *b, int kind,
                                   prosody_context_t *ctx, const void *ev) {
  item_t *it = malloc(sizeof(*it));
  if (!it) {
    prosody_context_set_error(ctx, "out of memory handing the event over");
    return PROSODY_TRANSIENT;
  }
  it->q.kind = kind;
  it->ctx = ctx;
  it->event = ev;
  it->obj = NULL;
  prosody_queue_push(b, &it->q);
  return PROSODY_PENDING;
}

static prosody_result_t c_on_message(prosody_context_t *ctx,
                                     const prosody_message_t *msg,
                                     void *opaque) {
  /* Parse the payload here, on the engine thread, which has time to
   * spare: the event loop thread, where build_message() reads the tree,
   * is the binding's bottleneck. */
  (void)prosody_message_json(msg);
  return push_event(opaque, IT_MESSAGE, ctx, msg);
}

static prosody_result_t c_on_timer(prosody_context_t *ctx,
                                   const prosody_timer_t *timer, void *opaque) {
  return push_event(opaque, IT_TIMER, ctx, timer);
}

static PyObject *build_message(const prosody_message_t *m) {
  PyObject *topic = NULL, *part = NULL, *off = NULL, *ts = NULL, *key = NULL,
           *payload = NULL, *r = NULL;
  const json_t *j = prosody_message_json(m);
  int64_t t = prosody_message_timestamp(m);
  if (!(topic = PyUnicode_FromString(prosody_message_topic(m))) ||
      !(part = PyLong_FromLong(prosody_message_partition(m))) ||
      !(off = PyLong_FromLongLong(prosody_message_offset(m))) ||
      !(ts = t >= 0 ? from_ms(t) : Py_NewRef(Py_None)) ||
      !(key = PyUnicode_FromString(prosody_message_key(m))))
    goto out;
  if (j)
    payload = json_to_py(j);
  else
    payload =
        PyObject_CallFunction(FnJsonLoads, "s#", prosody_message_payload(m),
                              (Py_ssize_t)prosody_message_payload_len(m));
  if (payload)
    r = PyObject_CallFunctionObjArgs(ClsMessage, topic, part, off, ts, key,
                                     payload, NULL);
out:
  Py_XDECREF(topic);
  Py_XDECREF(part);
  Py_XDECREF(off);
  Py_XDECREF(ts);
  Py_XDECREF(key);
  Py_XDECREF(payload);
  return r;
}

static PyObject *build_timer(const prosody_timer_t *t) {
  PyObject *key = PyUnicode_FromString(prosody_timer_key(t)), *time, *r;
  if (!key)
    return NULL;
  if (!(time = from_ms(prosody_timer_time(t)))) {
    Py_DECREF(key);
    return NULL;
  }
  r = PyObject_CallFunctionObjArgs(ClsTimer, key, time, NULL);
  Py_DECREF(key);
  Py_DECREF(time);
  return r;
}

/* The contextvars.Context the handler runs in, with its span, when
 * OpenTelemetry is installed; NULL (no error) otherwise. */
static PyObject *trace_context(ClientObject *c, ContextObject *cx,
                               const item_t *it) {
  PyObject *res, *attrs, *run_in = NULL;
  const char *tp = NULL, *ts = NULL, *bg = NULL, *name;
  int follows, spanned = 0;
  if (!otel_enabled)
    return NULL;
  if (it->q.kind == IT_MESSAGE) {
    const prosody_message_t *m = it->event;
    tp = prosody_message_traceparent(m, &spanned);
    ts = prosody_message_header(m, "tracestate");
    bg = prosody_message_header(m, "baggage");
    name = "prosody.receive";
    /* A span of libprosody's own already applied message_spans. */
    follows = !spanned && c->spans_follow[0];
    attrs = Py_BuildValue(
        "{s:s,s:s,s:i,s:L,s:s}", "messaging.system", "kafka",
        "messaging.destination.name", prosody_message_topic(m),
        "messaging.destination.partition.id", prosody_message_partition(m),
        "messaging.kafka.message.offset", (long long)prosody_message_offset(m),
        "messaging.kafka.message.key", prosody_message_key(m));
  } else {
    const prosody_timer_t *t = it->event;
    tp = prosody_timer_traceparent(t, &spanned);
    name = "prosody.trigger";
    follows = !spanned && c->spans_follow[1];
    attrs = Py_BuildValue("{s:s,s:s}", "messaging.system", "kafka",
                          "prosody.timer.key", prosody_timer_key(t));
  }
  if (!attrs) {
    PyErr_WriteUnraisable(FnHandlerContext);
    return NULL;
  }
  res = PyObject_CallFunction(FnHandlerContext, "zzzOsO", tp, ts, bg,
                              follows ? Py_True : Py_False, name, attrs);
  Py_DECREF(attrs);
  if (res && PyTuple_Check(res) && PyTuple_GET_SIZE(res) == 2) {
    run_in = Py_NewRef(PyTuple_GET_ITEM(res, 0));
    cx->span = Py_NewRef(PyTuple_GET_ITEM(res, 1));
  }
  Py_XDECREF(res);
  if (PyErr_Occurred()) { /* tracing never stops a handler */
    PyErr_WriteUnraisable(FnHandlerContext);
  }
  return run_in;
}

/* What a handler returned that is neither awaitable nor a plain value: an
 * object whose body runs only when iterated, which prosody never does (a
 * handler with a `yield`); NULL when the value is fine. */
static const char *lazy_kind(PyObject *v) {
  int anext;
  if (PyAsyncGen_CheckExact(v))
    return "an async generator";
  if (PyGen_Check(v))
    return "a generator";
  anext = PyObject_HasAttr(v, S_anext);
  PyErr_Clear();
  return anext ? "an asynchronous iterator" : NULL;
}

/* Fails the event whose handler returned `v`, a lazy object (`kind`),
 * naming the handler and what it returned. */
static void finish_lazy(ClientObject *c, ContextObject *cx, int timer,
                        PyObject *v, const char *kind) {
  PyObject *text = PyUnicode_FromFormat(
      "TypeError: %s.%s returned %s (%.100s), not a coroutine or a value, so "
      "its body never ran (is there a `yield` in it?); the event failed",
      Py_TYPE(c->handler)->tp_name, timer ? "on_timer" : "on_message", kind,
      Py_TYPE(v)->tp_name);
  const char *msg = text ? PyUnicode_AsUTF8(text) : NULL;
  PyErr_Clear();
  end_span(cx, NULL);
  context_finish(cx, PROSODY_TRANSIENT,
                 msg ? msg : "the handler returned a generator");
  Py_XDECREF(text);
}

/* A handler raised SystemExit or KeyboardInterrupt (the exception pending):
 * the application asks to stop. Its event fails (transient: it is not
 * committed), and the exception is kept to be re-raised on the loop thread
 * once the drain is over, as asyncio does for a task (see client_drain). */
static int stop_requested(ClientObject *c, ContextObject *cx) {
  PyObject *type, *value, *tb;
  if (!PyErr_ExceptionMatches(PyExc_SystemExit) &&
      !PyErr_ExceptionMatches(PyExc_KeyboardInterrupt))
    return 0;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  if (value && tb)
    PyException_SetTraceback(value, tb);
  end_span(cx, value);
  context_finish(cx, PROSODY_TRANSIENT,
                 PyErr_GivenExceptionMatches(type, PyExc_SystemExit)
                     ? "the handler raised SystemExit: the application is "
                       "stopping"
                     : "the handler raised KeyboardInterrupt: the "
                       "application is stopping");
  if (!c->stop_exc && value)
    c->stop_exc = Py_NewRef(value);
  c->halted = 1;
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(tb);
  return 1;
}

/* Starts the user's coroutine for one event (loop thread). */
static void dispatch(ClientObject *c, item_t *it) {
  ContextObject *cx = context_new(c, it->ctx);
  PyObject *event = NULL, *coro = NULL, *task = NULL, *cb = NULL, *r, *run_in;
  PyObject *method = it->q.kind == IT_MESSAGE ? c->on_message : c->on_timer;
  if (!cx) {
    PyErr_Clear();
    prosody_complete(it->ctx, PROSODY_TRANSIENT, "out of memory");
    return;
  }
  event = it->q.kind == IT_MESSAGE ? build_message(it->event)
                                   : build_timer(it->event);
  if (!event)
    goto failed;
  run_in = trace_context(c, cx, it);
  if (run_in) {
    coro = PyObject_CallMethodObjArgs(run_in, S_run, method, (PyObject *)cx,
                                      event, NULL);
  } else {
    coro = PyObject_CallFunctionObjArgs(method, (PyObject *)cx, event, NULL);
  }
  if (!coro) {
    Py_XDECREF(run_in);
    if (stop_requested(c, cx))
      goto out;
    goto failed;
  }
  if (!PyCoro_CheckExact(coro) && !PyObject_HasAttr(coro, S_await)) {
    const char *lazy = lazy_kind(coro);
    Py_XDECREF(run_in);
    if (lazy) {
      finish_lazy(c, cx, it->q.kind == IT_TIMER, coro, lazy);
      goto out;
    }
    /* A plain function: its return is the success. */
    end_span(cx, NULL);
    context_finish(cx, PROSODY_SUCCESS, NULL);
    goto out;
  }
  if (run_in) {
    task =
        PyObject_CallMethodObjArgs(run_in, S_run, c->create_task, coro, NULL);
    Py_DECREF(run_in);
  } else {
    task = PyObject_CallFunctionObjArgs(c->create_task, coro, NULL);
  }
  if (!task)
    goto failed;
  if (!(cb = PyCFunction_New(&task_done_def, (PyObject *)cx)))
    goto failed;
  if (!(r = PyObject_CallMethodObjArgs(task, S_add_done_callback, cb, NULL)))
    goto failed;
  Py_DECREF(r);
  goto out;
failed : {
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  if (value) {
    if (tb)
      PyException_SetTraceback(value, tb);
    finish_with_exception(cx, value);
  } else {
    context_finish(cx, PROSODY_TRANSIENT, "handler could not be started");
  }
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(tb);
}
out:
  Py_XDECREF(event);
  Py_XDECREF(coro);
  Py_XDECREF(task);
  Py_XDECREF(cb);
  Py_DECREF(cx);
}

/* The loop's reader callback: handles every item queued since the last
 * wake-up. */
static PyObject *client_drain(PyObject *self, PyObject *unused) {
  ClientObject *c = (ClientObject *)self;
  PyObject *stop;
  item_t *it;
  if (!c->bridge)
    Py_RETURN_NONE;
  it = (item_t *)prosody_queue_take(c->bridge, NULL);
  while (it) {
    item_t *next = ITEM_NEXT(it);
    switch (it->q.kind) {
    case IT_MESSAGE:
    case IT_TIMER:
      /* Not run, and not committed: redelivered to a later consumer. */
      if (c->orphaned)
        prosody_complete(it->ctx, PROSODY_TRANSIENT,
                         "not handled: the event loop of subscribe() was "
                         "closed (an asyncio.run() that ended?)");
      else if (c->halted)
        prosody_complete(it->ctx, PROSODY_TRANSIENT,
                         "not handled: the application is stopping (a "
                         "handler raised SystemExit or KeyboardInterrupt)");
      else
        dispatch(c, it);
      free(it);
      break;
    case IT_OP:
      if (c->orphaned) { /* its future's loop is closed: nobody awaits it */
        pyop_t *op = it->obj;
        Py_DECREF(op->fut);
        free(op->errstr);
        free(op->times);
        free(op);
      } else {
        op_resolve(it->obj);
      }
      break;
    case IT_CANCEL: {
      ContextObject *cx = it->obj;
      resolve_cancel(cx);
      cx->cancel_registered = 0;
      Py_DECREF(cx);
      break;
    }
    }
    if (PyErr_Occurred())
      PyErr_WriteUnraisable(self);
    it = next;
  }
  if ((stop = c->stop_exc)) { /* the loop stops, as for a task's */
    c->stop_exc = NULL;
    PyErr_SetObject((PyObject *)Py_TYPE(stop), stop);
    Py_DECREF(stop);
    return NULL;
  }
  Py_RETURN_NONE;
}

/* ------------------------------------------------------------------------ */
/* ProsodyClient                                                             */
/* ------------------------------------------------------------------------ */

static PyObject *running_loop(const char *what) {
  PyObject *loop = PyObject_CallNoArgs(FnGetRunningLoop);
  if (!loop && PyErr_ExceptionMatches(PyExc_RuntimeError)) {
    PyErr_Clear();
    PyErr_Format(PyExc_RuntimeError,
                 "%s needs a running asyncio event loop: call it from a "
                 "coroutine (e.g. inside asyncio.run)",
                 what);
  }
  return loop;
}

/* Stops the loop watching the client's log queue (the caller's exception,
 * if any, is kept). */
static void log_unwatch(ClientObject *c) {
  PyObject *type, *value, *tb, *fd, *r;
  log_sink_t *s = log_sink_of(c->log_sink);
  if (!c->log_loop || !s)
    return;
  PyErr_Fetch(&type, &value, &tb);
  fd = PyLong_FromLong(prosody_queue_fd(s->box));
  r = fd ? PyObject_CallMethodObjArgs(c->log_loop, S_remove_reader, fd, NULL)
         : NULL;
  Py_XDECREF(fd);
  Py_XDECREF(r);
  PyErr_Clear(); /* the loop may be closed: it watches nothing then */
  Py_CLEAR(c->log_loop);
  PyErr_Restore(type, value, tb);
}

/* Has `loop`, the running one, forward the client's log lines as they
 * come, instead of the loop that did (a loop of an earlier asyncio.run).
 * Where it cannot, lines wait for the next drain (see client_init). */
static void log_watch(ClientObject *c, PyObject *loop) {
  PyObject *reader, *fd, *r = NULL;
  log_sink_t *s = log_sink_of(c->log_sink);
  if (!s || !loop || loop == c->log_loop)
    return;
  log_unwatch(c);
  reader = PyCFunction_New(&log_reader_def, c->log_sink);
  fd = PyLong_FromLong(prosody_queue_fd(s->box));
  if (reader && fd)
    r = PyObject_CallMethodObjArgs(loop, S_add_reader, fd, reader, NULL);
  Py_XDECREF(reader);
  Py_XDECREF(fd);
  if (r)
    c->log_loop = Py_NewRef(loop);
  Py_XDECREF(r);
  PyErr_Clear();
}

static int client_init(PyObject *self, PyObject *args, PyObject *kwargs) {
  ClientObject *c = (ClientObject *)self;
  prosody_config_t *conf;
  prosody_client_t *client;
  char err[1024], val[32];
  if (PyTuple_GET_SIZE(args)) {
    PyErr_SetString(PyExc_TypeError,
                    "ProsodyClient takes keyword arguments only (e.g. "
                    "ProsodyClient(group_id=\"app\", mock=True))");
    return -1;
  }
  if (c->client) {
    PyErr_SetString(PyExc_RuntimeError, "ProsodyClient is already initialised");
    return -1;
  }
  if (!(conf = config_from(kwargs)))
    return -1;
  for (int i = 0; i < 2; i++) {
    const char *opt = i ? "timer_spans" : "message_spans";
    if (!prosody_config_get(conf, opt, val, sizeof(val), NULL, err,
                            sizeof(err)))
      c->spans_follow[i] = !strcmp(val, "follows_from");
  }
  /* The client's lines go to `logging` (its `log` option is the level). */
  Py_XSETREF(c->log_sink, log_sink_new());
  if (!c->log_sink) {
    prosody_config_destroy(conf);
    return -1;
  }
  prosody_config_set_log_cb(conf, log_cb, log_sink_of(c->log_sink));
  Py_BEGIN_ALLOW_THREADS
  client = prosody_client_new(conf, err, sizeof(err));
  Py_END_ALLOW_THREADS
  if (!client) {
    log_drain(log_sink_of(c->log_sink));
    prosody_config_destroy(conf);
    PyErr_SetString(PyExc_ValueError, err);
    return -1;
  }
  c->client = client;
  c->pid = getpid();
  /* Lines are forwarded on the thread that drains them: at once those of
   * the creation, then by the running loop (this one, or the one of a
   * later call), on unsubscribe and when the client is deallocated. */
  log_sink_of(c->log_sink)->source =
      PyUnicode_FromString(prosody_client_source_system(client));
  PyErr_Clear();
  log_drain(log_sink_of(c->log_sink));
  {
    PyObject *loop = PyObject_CallNoArgs(FnGetRunningLoop);
    if (loop)
      log_watch(c, loop);
    Py_XDECREF(loop);
    PyErr_Clear(); /* no running loop: the first call's will do */
  }
  return 0;
}

static void client_clear_handler(ClientObject *c) {
  Py_CLEAR(c->handler);
  Py_CLEAR(c->on_message);
  Py_CLEAR(c->on_timer);
  Py_CLEAR(c->create_task);
}

static void client_dealloc(ClientObject *c) {
  if (c->client && getpid() == c->pid) { /* a forked child leaks it */
    Py_BEGIN_ALLOW_THREADS
    prosody_client_destroy(c->client);
    Py_END_ALLOW_THREADS
  }
  c->client = NULL;
  if (c->log_sink) { /* the lines of its closing, before the sink goes */
    log_drain(log_sink_of(c->log_sink));
    log_unwatch(c);
    Py_CLEAR(c->log_sink);
  }
  if (c->bridge) {
    item_t *it = (item_t *)prosody_queue_take(c->bridge, NULL);
    while (it) { /* left when the loop stopped before draining */
      item_t *next = ITEM_NEXT(it);
      if (it->q.kind == IT_MESSAGE || it->q.kind == IT_TIMER) {
        free(it);
      } else if (it->q.kind == IT_OP) { /* a result nobody will await now */
        pyop_t *op = it->obj;
        Py_DECREF(op->fut);
        free(op->errstr);
        free(op->times);
        free(op);
      }
      it = next;
    }
    prosody_queue_destroy(c->bridge);
  }
  client_clear_handler(c);
  Py_CLEAR(c->loop);
  Py_CLEAR(c->sub_fut);
  Py_CLEAR(c->unsub_fut);
  Py_CLEAR(c->stop_exc);
  Py_TYPE(c)->tp_free((PyObject *)c);
}

static int client_ready(ClientObject *c) {
  if (!c->client) {
    PyErr_SetString(PyExc_RuntimeError, "ProsodyClient is not initialised");
    return -1;
  }
  return check_fork(c->pid, "ProsodyClient");
}

/* Send results: the producer's delivery thread. */
typedef struct send_op {
  PyObject *fut, *loop;
} send_op_t;

static PyObject *resolve_future(PyObject *unused, PyObject *args) {
  PyObject *fut, *exc, *done, *r;
  if (!PyArg_ParseTuple(args, "OO", &fut, &exc))
    return NULL;
  if (!(done = PyObject_CallMethodObjArgs(fut, S_done, NULL)))
    return NULL;
  if (done == Py_True) { /* cancelled by the caller */
    Py_DECREF(done);
    Py_RETURN_NONE;
  }
  Py_DECREF(done);
  if (exc == Py_None)
    r = PyObject_CallMethodObjArgs(fut, S_set_result, Py_None, NULL);
  else
    r = PyObject_CallMethodObjArgs(fut, S_set_exception, exc, NULL);
  Py_XDECREF(r);
  return r ? Py_NewRef(Py_None) : NULL;
}

static PyMethodDef resolve_def = {"_resolve", resolve_future, METH_VARARGS,
                                  NULL};
static PyObject *FnResolve;

static void send_done(prosody_err_t err, const char *errstr,
                      const prosody_delivery_t *d, void *opaque) {
  send_op_t *op = opaque;
  PyGILState_STATE g;
  PyObject *exc, *r;
  if (PR_FINALIZING())
    return; /* the interpreter is going away: nothing can be resolved */
  g = PyGILState_Ensure();
  exc = err ? error_object(err, errstr) : Py_NewRef(Py_None);
  if (exc) {
    r = PyObject_CallMethodObjArgs(op->loop, S_call_soon_threadsafe, FnResolve,
                                   op->fut, exc, NULL);
    Py_XDECREF(r);
    Py_DECREF(exc);
  }
  PyErr_Clear(); /* e.g. the loop was closed: nobody awaits the result */
  Py_DECREF(op->fut);
  Py_DECREF(op->loop);
  free(op);
  PyGILState_Release(g);
}

static PyObject *client_send(PyObject *self, PyObject *args) {
  ClientObject *c = (ClientObject *)self;
  PyObject *payload, *json = NULL, *loop = NULL, *fut = NULL, *th = NULL;
  const char *topic, *key, *text;
  prosody_trace_t trace = {NULL, NULL, NULL}, *tp = NULL;
  send_op_t *op;
  char err[1024];
  prosody_err_t rc;
  if (!PyArg_ParseTuple(args, "ssO:send", &topic, &key, &payload))
    return NULL;
  if (client_ready(c))
    return NULL;
  if (!(json = PyObject_CallFunctionObjArgs(FnJsonDumps, payload, NULL)))
    return NULL;
  if (!(text = PyUnicode_AsUTF8(json)) || !(loop = running_loop("send()")) ||
      !(fut = PyObject_CallMethodObjArgs(loop, S_create_future, NULL)))
    goto fail;
  log_watch(c, loop);
  if (otel_enabled) {
    if (!(th = PyObject_CallNoArgs(FnTraceHeaders)))
      goto fail;
    if (th != Py_None && !PyArg_ParseTuple(th, "zzz", &trace.traceparent,
                                           &trace.tracestate, &trace.baggage))
      goto fail;
    if (th != Py_None)
      tp = &trace;
  }
  if (!(op = malloc(sizeof(*op)))) {
    PyErr_NoMemory();
    goto fail;
  }
  op->fut = Py_NewRef(fut);
  op->loop = Py_NewRef(loop);
  rc = prosody_send_async(c->client, topic, key, text, tp, send_done, op, err,
                          sizeof(err));
  if (rc) {
    PyObject *exc = error_object(rc, err), *r = NULL;
    Py_DECREF(op->fut);
    Py_DECREF(op->loop);
    free(op);
    if (exc)
      r = PyObject_CallMethodObjArgs(fut, S_set_exception, exc, NULL);
    Py_XDECREF(exc);
    if (!r)
      goto fail;
    Py_DECREF(r);
  }
  Py_XDECREF(th);
  Py_DECREF(json);
  Py_DECREF(loop);
  return fut;
fail:
  Py_XDECREF(th);
  Py_XDECREF(json);
  Py_XDECREF(loop);
  Py_XDECREF(fut);
  return NULL;
}

/* Runs prosody_subscribe on an executor thread. */
static PyObject *client_subscribe_blocking(PyObject *self, PyObject *unused) {
  ClientObject *c = (ClientObject *)self;
  prosody_handler_t h = {c_on_message, c->has_timer ? c_on_timer : NULL,
                         c->bridge, PROSODY_HANDLER_ASYNC};
  prosody_err_t rc;
  Py_BEGIN_ALLOW_THREADS
  rc = prosody_subscribe(c->client, &h, c->sub_err, sizeof(c->sub_err));
  Py_END_ALLOW_THREADS
  if (rc) {
    c->sub_failed = 1;
    return raise_error(rc, c->sub_err);
  }
  Py_RETURN_NONE;
}

/* Stops watching the mailbox (loop thread), after a last drain. */
static void client_detach(ClientObject *c) {
  PyObject *r, *fd;
  if (!c->loop)
    return;
  r = client_drain((PyObject *)c, NULL);
  Py_XDECREF(r);
  log_drain(log_sink_of(c->log_sink)); /* e.g. the consumer's stop */
  fd = PyLong_FromLong(prosody_queue_fd(c->bridge));
  r = fd ? PyObject_CallMethodObjArgs(c->loop, S_remove_reader, fd, NULL)
         : NULL;
  Py_XDECREF(fd);
  Py_XDECREF(r);
  if (PyErr_Occurred())
    PyErr_Clear(); /* the loop may already be closed */
  client_clear_handler(c);
  Py_CLEAR(c->loop);
  Py_CLEAR(c->sub_fut);
  Py_CLEAR(c->unsub_fut);
  c->subscribed = 0;
  c->orphaned = 0;
  c->halted = 0;
}

static PyObject *client_subscribe_done(PyObject *self, PyObject *fut) {
  ClientObject *c = (ClientObject *)self;
  if (c->sub_failed) {
    /* libprosody logged the failure at ERROR (prosody.consumer) and
     * consumer_state() says "configuration-failed": the future's
     * exception counts as seen, so that a subscribe() nobody awaited
     * does not add asyncio's "exception was never retrieved" when it is
     * collected. Awaiting it still raises. */
    PyObject *r = PyObject_CallMethodObjArgs(fut, S_exception, NULL);
    Py_XDECREF(r);
    PyErr_Clear();
    c->sub_failed = 0;
    client_detach(c);
  }
  Py_RETURN_NONE;
}

static PyMethodDef subscribe_done_def = {"_subscribe_done",
                                         client_subscribe_done, METH_O, NULL};
static PyMethodDef subscribe_blocking_def = {
    "_subscribe_blocking", client_subscribe_blocking, METH_NOARGS, NULL};
static PyMethodDef drain_def = {"_drain", client_drain, METH_NOARGS, NULL};

/* True when `handler`'s class overrides EventHandler.on_timer. */
static int implements_on_timer(PyObject *handler) {
  PyObject *m = PyObject_GetAttrString(handler, "on_timer"), *f, *base, *mod,
           *bf;
  int r = 0;
  if (!m) {
    PyErr_Clear();
    return 0;
  }
  f = PyObject_GetAttrString(m, "__func__");
  mod = PyImport_ImportModule("prosody.handler");
  base = mod ? PyObject_GetAttrString(mod, "EventHandler") : NULL;
  bf = base ? PyObject_GetAttrString(base, "on_timer") : NULL;
  r = !f || !bf || f != bf;
  PyErr_Clear();
  Py_XDECREF(m);
  Py_XDECREF(f);
  Py_XDECREF(mod);
  Py_XDECREF(base);
  Py_XDECREF(bf);
  return r;
}

static int loop_closed(PyObject *loop);

static PyObject *client_subscribe(PyObject *self, PyObject *handler) {
  ClientObject *c = (ClientObject *)self;
  PyObject *loop = NULL, *om = NULL, *reader = NULL, *r, *fd, *fn, *fut;
  if (client_ready(c))
    return NULL;
  if (c->subscribed) {
    int closed = c->loop ? loop_closed(c->loop) : 0;
    PyErr_Clear();
    PyErr_SetString(ErrProsody,
                    closed > 0 ? "already subscribed, on an event loop that "
                                 "is now closed: await unsubscribe() first"
                               : "already subscribed: call unsubscribe() "
                                 "first");
    return NULL;
  }
  if (!strcmp(prosody_consumer_state(c->client), "unconfigured")) {
    PyErr_SetString(PyExc_ValueError,
                    "subscribe() needs the group_id and subscribed_topics "
                    "options (or PROSODY_GROUP_ID and "
                    "PROSODY_SUBSCRIBED_TOPICS)");
    return NULL;
  }
  if (!(om = PyObject_GetAttrString(handler, "on_message")) ||
      !PyCallable_Check(om)) {
    Py_XDECREF(om);
    PyErr_Format(PyExc_TypeError,
                 "subscribe() needs a handler with an on_message coroutine "
                 "method (an EventHandler), got %.100s",
                 Py_TYPE(handler)->tp_name);
    return NULL;
  }
  if (!(loop = running_loop("subscribe()")))
    goto fail;
  log_watch(c, loop);
  if (!c->bridge && !(c->bridge = prosody_queue_new(0, NULL, 0))) {
    PyErr_SetFromErrno(PyExc_OSError);
    goto fail;
  }
  c->has_timer = implements_on_timer(handler);
  c->handler = Py_NewRef(handler);
  c->on_message = om;
  om = NULL;
  if (c->has_timer &&
      !(c->on_timer = PyObject_GetAttrString(handler, "on_timer")))
    goto fail_reset;
  if (!(c->create_task = PyObject_GetAttr(loop, S_create_task)))
    goto fail_reset;
  if (!(reader = PyCFunction_New(&drain_def, self)))
    goto fail_reset;
  fd = PyLong_FromLong(prosody_queue_fd(c->bridge));
  r = fd ? PyObject_CallMethodObjArgs(loop, S_add_reader, fd, reader, NULL)
         : NULL;
  Py_XDECREF(fd);
  Py_DECREF(reader);
  if (!r)
    goto fail_reset;
  Py_DECREF(r);
  c->loop = loop;
  c->subscribed = 1;
  c->sub_failed = 0;
  /* prosody_subscribe may wait for Cassandra: run it off the loop. */
  if (!(fn = PyCFunction_New(&subscribe_blocking_def, self)))
    goto fail_detach;
  fut = PyObject_CallMethodObjArgs(loop, S_run_in_executor, Py_None, fn, NULL);
  Py_DECREF(fn);
  if (!fut)
    goto fail_detach;
  if (!(fn = PyCFunction_New(&subscribe_done_def, self)) ||
      !(r = PyObject_CallMethodObjArgs(fut, S_add_done_callback, fn, NULL))) {
    Py_XDECREF(fn);
    Py_DECREF(fut);
    return NULL;
  }
  Py_DECREF(fn);
  Py_DECREF(r);
  c->sub_fut = Py_NewRef(fut);
  return fut;
fail_detach:
  client_detach(c);
  return NULL;
fail_reset:
  client_clear_handler(c);
fail:
  Py_XDECREF(om);
  Py_XDECREF(loop);
  return NULL;
}

static PyObject *client_unsubscribe_blocking(PyObject *self, PyObject *unused) {
  ClientObject *c = (ClientObject *)self;
  Py_BEGIN_ALLOW_THREADS
  prosody_unsubscribe(c->client);
  Py_END_ALLOW_THREADS
  Py_RETURN_NONE;
}

static PyObject *client_unsubscribe_done(PyObject *self, PyObject *fut) {
  client_detach((ClientObject *)self);
  Py_RETURN_NONE;
}

static PyMethodDef unsubscribe_blocking_def = {
    "_unsubscribe_blocking", client_unsubscribe_blocking, METH_NOARGS, NULL};
static PyMethodDef unsubscribe_done_def = {
    "_unsubscribe_done", client_unsubscribe_done, METH_O, NULL};

static PyObject *ready(PyObject *value) {
  PyObject *r;
  if (!value)
    return NULL;
  r = PyObject_CallFunctionObjArgs(FnReady, value, NULL);
  Py_DECREF(value);
  return r;
}

/* 1 if `loop` is closed, 0 if not, -1 with an exception set. */
static int loop_closed(PyObject *loop) {
  PyObject *r = PyObject_CallMethodObjArgs(loop, S_is_closed, NULL);
  int closed;
  if (!r)
    return -1;
  closed = PyObject_IsTrue(r);
  Py_DECREF(r);
  return closed;
}

/* unsubscribe() on `running`, a loop other than subscribe()'s. When that
 * one is closed (its asyncio.run() ended), no handler can run any more and
 * nothing watches the mailbox: the running loop adopts the subscription to
 * stop it, and fails what is still queued (not committed: redelivered);
 * see client_drain. Otherwise the call is refused: the subscription's
 * handlers and futures belong to its own loop. 0, or -1 with an exception
 * set. */
static int adopt_orphan(ClientObject *c, PyObject *running) {
  PyObject *reader, *fd, *r;
  int closed = loop_closed(c->loop);
  if (closed < 0)
    return -1;
  if (!closed) {
    PyErr_SetString(PyExc_RuntimeError,
                    "unsubscribe() must be awaited on the event loop that "
                    "called subscribe() (it is still open, in another "
                    "thread?)");
    return -1;
  }
  if (PyErr_WarnEx(PyExc_RuntimeWarning,
                   "unsubscribe(): this client subscribed on an event loop "
                   "that is now closed (an asyncio.run() that ended?), so no "
                   "handler has run since; the consumer is stopped from this "
                   "loop, and the events still queued fail without running "
                   "(not committed). Unsubscribe before the loop of "
                   "subscribe() ends.",
                   1))
    return -1;
  if (!(reader = PyCFunction_New(&drain_def, (PyObject *)c)))
    return -1;
  fd = PyLong_FromLong(prosody_queue_fd(c->bridge));
  r = fd ? PyObject_CallMethodObjArgs(running, S_add_reader, fd, reader, NULL)
         : NULL;
  Py_XDECREF(fd);
  Py_DECREF(reader);
  if (!r)
    return -1;
  Py_DECREF(r);
  c->orphaned = 1;
  Py_SETREF(c->loop, Py_NewRef(running));
  Py_CLEAR(c->sub_fut); /* done: the executor of its loop was shut down */
  return 0;
}

static PyObject *client_unsubscribe(PyObject *self, PyObject *unused) {
  ClientObject *c = (ClientObject *)self;
  PyObject *fn, *fut, *r, *loop, *coro, *running;
  if (client_ready(c))
    return NULL;
  if (!c->subscribed)
    return ready(Py_NewRef(Py_None)); /* nothing to stop */
  /* Concurrent calls share the one in flight: a second native unsubscribe
   * would return at once and detach the mailbox while the first still
   * waits for the running handlers, whose cancellations would then never
   * reach them. */
  if (c->unsub_fut)
    return Py_NewRef(c->unsub_fut);
  if ((running = PyObject_CallNoArgs(FnGetRunningLoop))) {
    int r2 = running != c->loop ? adopt_orphan(c, running) : 0;
    Py_DECREF(running);
    if (r2)
      return NULL;
  } else {
    PyErr_Clear(); /* called outside a coroutine: the task goes to c->loop */
  }
  loop = c->loop;
  log_watch(c, loop);
  /* The engine waits for running handlers, which complete on this loop:
   * block an executor thread, not the loop; and only once the subscribe
   * call (also on the executor) has finished. */
  if (!(fn = PyCFunction_New(&unsubscribe_blocking_def, self)))
    return NULL;
  coro = PyObject_CallFunctionObjArgs(
      FnRunAfter, loop, c->sub_fut ? c->sub_fut : Py_None, fn, NULL);
  Py_DECREF(fn);
  if (!coro)
    return NULL;
  fut = PyObject_CallMethodObjArgs(loop, S_create_task, coro, NULL);
  Py_DECREF(coro);
  if (!fut)
    return NULL;
  if (!(fn = PyCFunction_New(&unsubscribe_done_def, self)) ||
      !(r = PyObject_CallMethodObjArgs(fut, S_add_done_callback, fn, NULL))) {
    Py_XDECREF(fn);
    Py_DECREF(fut);
    return NULL;
  }
  Py_DECREF(fn);
  Py_DECREF(r);
  c->unsub_fut = Py_NewRef(fut);
  return fut;
}

static PyObject *client_consumer_state(PyObject *self, PyObject *unused) {
  ClientObject *c = (ClientObject *)self;
  if (client_ready(c))
    return NULL;
  return PyObject_CallFunction(ClsConsumerState, "s",
                               prosody_consumer_state(c->client));
}

static PyObject *client_assigned_partition_count(PyObject *self,
                                                 PyObject *unused) {
  ClientObject *c = (ClientObject *)self;
  if (client_ready(c))
    return NULL;
  return ready(PyLong_FromLong(prosody_assigned_partition_count(c->client)));
}

static PyObject *client_is_stalled(PyObject *self, PyObject *unused) {
  ClientObject *c = (ClientObject *)self;
  if (client_ready(c))
    return NULL;
  return ready(PyBool_FromLong(prosody_is_stalled(c->client)));
}

static PyObject *client_source_system(PyObject *self, void *unused) {
  ClientObject *c = (ClientObject *)self;
  if (client_ready(c))
    return NULL;
  return PyUnicode_FromString(prosody_client_source_system(c->client));
}

static PyObject *client_probe_port(PyObject *self, void *unused) {
  ClientObject *c = (ClientObject *)self;
  int port;
  if (client_ready(c))
    return NULL;
  port = prosody_probe_port(c->client);
  if (port < 0)
    Py_RETURN_NONE;
  return PyLong_FromLong(port);
}

static PyMethodDef client_methods[] = {
    {"send", client_send, METH_VARARGS,
     "send(topic, key, payload) -> awaitable: sends `payload` (any "
     "JSON-serialisable value) and resolves when the broker acknowledged."},
    {"subscribe", client_subscribe, METH_O,
     "subscribe(handler) -> awaitable: starts consuming with `handler` on "
     "the running event loop; awaiting it reports a failure to start."},
    {"unsubscribe", client_unsubscribe, METH_NOARGS,
     "unsubscribe() -> awaitable: stops consuming gracefully (in-flight work "
     "finishes and is committed)."},
    {"consumer_state", client_consumer_state, METH_NOARGS,
     "consumer_state() -> 'unconfigured' | 'configured' | 'running' | "
     "'configuration-failed' (a str that may also be awaited)."},
    {"assigned_partition_count", client_assigned_partition_count, METH_NOARGS,
     "assigned_partition_count() -> awaitable of int."},
    {"is_stalled", client_is_stalled, METH_NOARGS,
     "is_stalled() -> awaitable of bool: a partition made no progress for "
     "stall_threshold."},
    {NULL}};

static PyGetSetDef client_getset[] = {
    {"source_system", client_source_system, NULL,
     "The source-system header this client writes.", NULL},
    {"probe_port", client_probe_port, NULL,
     "The probe server's port while subscribed, else None.", NULL},
    {NULL}};

static PyTypeObject ClientType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "prosody.prosody.ProsodyClient",
    .tp_basicsize = sizeof(ClientObject),
    .tp_dealloc = (destructor)client_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "ProsodyClient(**options): a Kafka producer and consumer. "
              "Options are those of docs/CONFIGURATION.md, as keywords; "
              "None leaves one unset (falls back to PROSODY_* variables).",
    .tp_methods = client_methods,
    .tp_getset = client_getset,
    .tp_init = client_init,
    .tp_new = PyType_GenericNew,
};

/* ------------------------------------------------------------------------ */
/* AdminClient                                                               */
/* ------------------------------------------------------------------------ */

static int admin_init(PyObject *self, PyObject *args, PyObject *kwargs) {
  AdminObject *a = (AdminObject *)self;
  prosody_config_t *conf;
  prosody_admin_t *admin;
  char err[1024];
  if (PyTuple_GET_SIZE(args)) {
    PyErr_SetString(PyExc_TypeError,
                    "AdminClient takes keyword arguments only (e.g. "
                    "AdminClient(bootstrap_servers=\"localhost:9094\"))");
    return -1;
  }
  if (a->admin) {
    PyErr_SetString(PyExc_RuntimeError, "AdminClient is already initialised");
    return -1;
  }
  if (!(conf = config_from(kwargs)))
    return -1;
  Py_BEGIN_ALLOW_THREADS
  admin = prosody_admin_new(conf, err, sizeof(err));
  Py_END_ALLOW_THREADS
  if (!admin) {
    prosody_config_destroy(conf);
    PyErr_SetString(PyExc_ValueError, err);
    return -1;
  }
  a->admin = admin;
  a->pid = getpid();
  return 0;
}

static void admin_dealloc(AdminObject *a) {
  if (a->admin && getpid() == a->pid) {
    Py_BEGIN_ALLOW_THREADS
    prosody_admin_destroy(a->admin);
    Py_END_ALLOW_THREADS
  }
  Py_TYPE(a)->tp_free((PyObject *)a);
}

static int admin_ready(AdminObject *a) {
  if (!a->admin) {
    PyErr_SetString(PyExc_RuntimeError, "AdminClient is not initialised");
    return -1;
  }
  return check_fork(a->pid, "AdminClient");
}

/* _create_blocking(name, partitions, replication, policy|None, retention_ms)
 * on an executor thread. */
static PyObject *admin_create_blocking(PyObject *self, PyObject *args) {
  AdminObject *a = (AdminObject *)self;
  prosody_topic_options_t o = PROSODY_TOPIC_OPTIONS_INIT;
  const char *name, *policy;
  int parts, rf;
  long long retention;
  char err[1024];
  prosody_err_t rc;
  if (!PyArg_ParseTuple(args, "siizL", &name, &parts, &rf, &policy, &retention))
    return NULL;
  o.partitions = parts;
  o.replication_factor = (int16_t)rf;
  o.cleanup_policy = policy;
  o.retention_ms = retention;
  Py_BEGIN_ALLOW_THREADS
  rc = prosody_admin_create_topic(a->admin, name, &o, err, sizeof(err));
  Py_END_ALLOW_THREADS
  if (rc)
    return raise_error(rc, err);
  Py_RETURN_NONE;
}

static PyObject *admin_delete_blocking(PyObject *self, PyObject *args) {
  AdminObject *a = (AdminObject *)self;
  const char *name;
  char err[1024];
  prosody_err_t rc;
  if (!PyArg_ParseTuple(args, "s", &name))
    return NULL;
  Py_BEGIN_ALLOW_THREADS
  rc = prosody_admin_delete_topic(a->admin, name, err, sizeof(err));
  Py_END_ALLOW_THREADS
  if (rc)
    return raise_error(rc, err);
  Py_RETURN_NONE;
}

static PyMethodDef admin_create_def = {
    "_create_blocking", admin_create_blocking, METH_VARARGS, NULL};
static PyMethodDef admin_delete_def = {
    "_delete_blocking", admin_delete_blocking, METH_VARARGS, NULL};

/* Runs a blocking admin call on the loop's default executor. */
static PyObject *admin_run(PyObject *self, PyMethodDef *def, PyObject *args) {
  PyObject *loop = running_loop("AdminClient"), *fn, *call, *fut;
  if (!loop)
    return NULL;
  if (!(fn = PyCFunction_New(def, self))) {
    Py_DECREF(loop);
    return NULL;
  }
  /* run_in_executor(None, fn, *args) */
  call = PyTuple_New(2 + PyTuple_GET_SIZE(args));
  if (!call) {
    Py_DECREF(fn);
    Py_DECREF(loop);
    return NULL;
  }
  PyTuple_SET_ITEM(call, 0, Py_NewRef(Py_None));
  PyTuple_SET_ITEM(call, 1, fn);
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(args); i++)
    PyTuple_SET_ITEM(call, 2 + i, Py_NewRef(PyTuple_GET_ITEM(args, i)));
  {
    PyObject *m = PyObject_GetAttr(loop, S_run_in_executor);
    fut = m ? PyObject_Call(m, call, NULL) : NULL;
    Py_XDECREF(m);
  }
  Py_DECREF(call);
  Py_DECREF(loop);
  return fut;
}

static PyObject *admin_create_topic(PyObject *self, PyObject *args,
                                    PyObject *kwargs) {
  static char *kw[] = {
      "name",           "partition_count", "replication_factor",
      "cleanup_policy", "retention",       NULL};
  AdminObject *a = (AdminObject *)self;
  const char *name, *policy = NULL;
  PyObject *parts = Py_None, *rf = Py_None, *retention = Py_None, *call, *fut;
  long p = 0, r = 0;
  long long ret_ms = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "s|OOzO:create_topic", kw,
                                   &name, &parts, &rf, &policy, &retention))
    return NULL;
  if (admin_ready(a))
    return NULL;
  if (parts != Py_None) {
    if (!PyLong_Check(parts) || PyBool_Check(parts)) {
      PyErr_SetString(PyExc_TypeError, "partition_count: expected an int");
      return NULL;
    }
    p = PyLong_AsLong(parts);
    if (p < 1 || p > 1000000) {
      PyErr_Format(PyExc_ValueError,
                   "partition_count: expected 1..1000000, got %ld", p);
      return NULL;
    }
  }
  if (rf != Py_None) {
    if (!PyLong_Check(rf) || PyBool_Check(rf)) {
      PyErr_SetString(PyExc_TypeError, "replication_factor: expected an int");
      return NULL;
    }
    r = PyLong_AsLong(rf);
    if (r < 1 || r > 32767) {
      PyErr_Format(PyExc_ValueError,
                   "replication_factor: expected 1..32767, got %ld", r);
      return NULL;
    }
  }
  if (retention != Py_None) {
    double s;
    if (PyDelta_Check(retention)) {
      s = PyDateTime_DELTA_GET_DAYS(retention) * 86400.0 +
          PyDateTime_DELTA_GET_SECONDS(retention) +
          PyDateTime_DELTA_GET_MICROSECONDS(retention) / 1e6;
    } else if ((PyLong_Check(retention) && !PyBool_Check(retention)) ||
               PyFloat_Check(retention)) {
      s = PyFloat_AsDouble(retention);
    } else {
      PyErr_SetString(PyExc_TypeError,
                      "retention: expected a timedelta or seconds (float)");
      return NULL;
    }
    if (!isfinite(s) || s < 0.001 || s > 9e15) {
      PyErr_SetString(PyExc_ValueError,
                      "retention: expected a positive duration of at least "
                      "1 ms");
      return NULL;
    }
    ret_ms = (long long)llround(s * 1000);
  }
  call = Py_BuildValue("(siizL)", name, (int)p, (int)r, policy, ret_ms);
  if (!call)
    return NULL;
  fut = admin_run(self, &admin_create_def, call);
  Py_DECREF(call);
  return fut;
}

static PyObject *admin_delete_topic(PyObject *self, PyObject *args) {
  AdminObject *a = (AdminObject *)self;
  const char *name;
  if (!PyArg_ParseTuple(args, "s:delete_topic", &name))
    return NULL;
  if (admin_ready(a))
    return NULL;
  return admin_run(self, &admin_delete_def, args);
}

static PyMethodDef admin_methods[] = {
    {"create_topic", (PyCFunction)(void (*)(void))admin_create_topic,
     METH_VARARGS | METH_KEYWORDS,
     "create_topic(name, partition_count=None, replication_factor=None, "
     "cleanup_policy=None, retention=None) -> awaitable: creates the topic "
     "and waits until the cluster shows all its partitions."},
    {"delete_topic", admin_delete_topic, METH_VARARGS,
     "delete_topic(name) -> awaitable: deletes the topic."},
    {NULL}};

static PyTypeObject AdminType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "prosody.prosody.AdminClient",
    .tp_basicsize = sizeof(AdminObject),
    .tp_dealloc = (destructor)admin_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "AdminClient(**options): topic management (bootstrap_servers, "
              "mock).",
    .tp_methods = admin_methods,
    .tp_init = admin_init,
    .tp_new = PyType_GenericNew,
};

/* ------------------------------------------------------------------------ */
/* Module                                                                    */
/* ------------------------------------------------------------------------ */

static PyObject *mod_version(PyObject *self, PyObject *unused) {
  return PyUnicode_FromString(prosody_version_str());
}

static PyObject *mod_mock_bootstrap(PyObject *self, PyObject *unused) {
  char buf[128], err[512];
  prosody_err_t rc =
      prosody_mock_bootstrap_servers(buf, sizeof(buf), err, sizeof(err));
  if (rc)
    return raise_error(rc, err);
  return PyUnicode_FromString(buf);
}

static PyObject *mod_options(PyObject *self, PyObject *unused) {
  return Py_NewRef(option_types);
}

static PyMethodDef module_methods[] = {
    {"library_version", mod_version, METH_NOARGS,
     "The libprosody version this module was built with."},
    {"mock_bootstrap_servers", mod_mock_bootstrap, METH_NOARGS,
     "The embedded mock cluster's bootstrap address (started on first use)."},
    {"options", mod_options, METH_NOARGS,
     "Every option name mapped to its type, from libprosody's table."},
    {NULL}};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "prosody.prosody",
                                       "The native part of the prosody "
                                       "package (libprosody).",
                                       -1, module_methods};

static PyObject *attr_of(const char *module, const char *name) {
  PyObject *m = PyImport_ImportModule(module), *a;
  if (!m)
    return NULL;
  a = PyObject_GetAttrString(m, name);
  Py_DECREF(m);
  return a;
}

static int intern_all(void) {
  struct {
    PyObject **p;
    const char *s;
  } names[] = {{&S_create_future, "create_future"},
               {&S_create_task, "create_task"},
               {&S_add_done_callback, "add_done_callback"},
               {&S_set_result, "set_result"},
               {&S_set_exception, "set_exception"},
               {&S_cancelled, "cancelled"},
               {&S_exception, "exception"},
               {&S_done, "done"},
               {&S_call_soon_threadsafe, "call_soon_threadsafe"},
               {&S_add_reader, "add_reader"},
               {&S_remove_reader, "remove_reader"},
               {&S_run_in_executor, "run_in_executor"},
               {&S_run, "run"},
               {&S_end, "end"},
               {&S_record_exception, "record_exception"},
               {&S_is_permanent, "is_permanent"},
               {&S_await, "__await__"},
               {&S_anext, "__anext__"},
               {&S_is_closed, "is_closed"}};
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
    if (!(*names[i].p = PyUnicode_InternFromString(names[i].s)))
      return -1;
  return 0;
}

PyMODINIT_FUNC PyInit_prosody(void) {
  PyObject *m, *otel;
  PyDateTime_IMPORT;
  if (!PyDateTimeAPI || intern_all())
    return NULL;
  if (!(ErrProsody = attr_of("prosody.errors", "ProsodyError")) ||
      !(ErrTransient = attr_of("prosody.errors", "ProsodyTransientError")) ||
      !(ErrPermanent = attr_of("prosody.errors", "ProsodyPermanentError")) ||
      !(ClsEventHandlerError =
            attr_of("prosody.errors", "EventHandlerError")) ||
      !(ClsMessage = attr_of("prosody.message", "Message")) ||
      !(ClsTimer = attr_of("prosody.timer", "Timer")) ||
      !(ClsConsumerState = attr_of("prosody._support", "ConsumerState")) ||
      !(FnReady = attr_of("prosody._support", "Ready")) ||
      !(FnTraceHeaders = attr_of("prosody._support", "trace_headers")) ||
      !(FnHandlerContext = attr_of("prosody._support", "handler_context")) ||
      !(FnRunAfter = attr_of("prosody._support", "run_after")) ||
      !(FnForwardLogs = attr_of("prosody._support", "forward_logs")) ||
      !(otel = attr_of("prosody._support", "OTEL")) ||
      !(FnGetRunningLoop = attr_of("asyncio", "get_running_loop")) ||
      !(FnJsonDumps = attr_of("json", "dumps")) ||
      !(FnJsonLoads = attr_of("json", "loads")) ||
      !(Utc = attr_of("datetime", "timezone")))
    return NULL;
  otel_enabled = PyObject_IsTrue(otel) > 0;
  Py_DECREF(otel);
  {
    PyObject *tz = PyObject_GetAttrString(Utc, "utc");
    Py_DECREF(Utc);
    if (!(Utc = tz))
      return NULL;
  }
  if (!(Epoch = PyDateTimeAPI->DateTime_FromDateAndTime(
            1970, 1, 1, 0, 0, 0, 0, Utc, PyDateTimeAPI->DateTimeType)))
    return NULL;
  if (!(FnResolve = PyCFunction_New(&resolve_def, NULL)))
    return NULL;
  if (!(option_types = PyDict_New()))
    return NULL;
  for (size_t i = 0; i < prosody_option_count(); i++) {
    const prosody_option_info_t *o = prosody_option_info(i);
    PyObject *t = PyUnicode_FromString(o->type);
    if (!t || PyDict_SetItemString(option_types, o->name, t))
      return NULL;
    Py_DECREF(t);
  }
  if (PyType_Ready(&ClientType) || PyType_Ready(&ContextType) ||
      PyType_Ready(&AdminType))
    return NULL;
  if (!(m = PyModule_Create(&moduledef)))
    return NULL;
  Py_INCREF(&ClientType);
  Py_INCREF(&ContextType);
  Py_INCREF(&AdminType);
  if (PyModule_AddObject(m, "ProsodyClient", (PyObject *)&ClientType) ||
      PyModule_AddObject(m, "Context", (PyObject *)&ContextType) ||
      PyModule_AddObject(m, "AdminClient", (PyObject *)&AdminType)) {
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
