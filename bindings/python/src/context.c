/*
 * context.c - Context: the context of one handler invocation. Its result
 * goes to libprosody once (prosody_complete); timer calls go out with
 * prosody_timer_async and come back through the mailbox (ops: pp_op_new,
 * pp_op_post, pp_op_resolve, shared with keyed state's calls); on_cancel()
 * registers with prosody_context_on_cancel, whose callback also only
 * pushes to the mailbox. Loop thread, except the two callbacks (engine
 * thread).
 */
#include "prosody_py.h"

#include <string.h>

ContextObject *pp_context_new(ClientObject *c, prosody_context_t *ctx) {
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
void pp_end_span(ContextObject *cx, PyObject *exc) {
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
void pp_resolve_cancel(ContextObject *cx) {
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
void pp_context_finish(ContextObject *cx, prosody_result_t r, const char *msg) {
  if (cx->finished)
    return;
  cx->finished = 1;
  prosody_complete(cx->ctx, r, msg);
  pp_resolve_cancel(cx);
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

void pp_finish_with_exception(ContextObject *cx, PyObject *exc) {
  PyObject *text = NULL;
  prosody_result_t r = classify(exc, &text);
  const char *msg = text ? PyUnicode_AsUTF8(text) : NULL;
  if (!msg)
    PyErr_Clear();
  pp_end_span(cx, exc);
  pp_context_finish(cx, r, msg ? msg : "handler raised an exception");
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
    pp_end_span(cx, NULL);
    pp_context_finish(cx, PROSODY_TRANSIENT,
                      "the handler's task was cancelled");
    Py_RETURN_NONE;
  }
  Py_DECREF(c);
  if (!(exc = PyObject_CallMethodObjArgs(task, S_exception, NULL)))
    return NULL;
  if (exc == Py_None) {
    pp_end_span(cx, NULL);
    pp_context_finish(cx, PROSODY_SUCCESS, NULL);
  } else {
    /* asyncio re-raised it on the loop thread already: the application
     * is stopping, so no further handler runs (see pp_client_drain). */
    if (PyErr_GivenExceptionMatches(exc, PyExc_SystemExit) ||
        PyErr_GivenExceptionMatches(exc, PyExc_KeyboardInterrupt))
      cx->client->halted = 1;
    pp_finish_with_exception(cx, exc);
  }
  Py_DECREF(exc);
  Py_RETURN_NONE;
}

PyMethodDef pp_task_done_def = {"_task_done", context_task_done, METH_O, NULL};

pyop_t *pp_op_new(ClientObject *c, int kind) {
  if (!c->bridge || !c->loop) {
    PyErr_SetString(ErrProsody, "the client is not subscribed");
    return NULL;
  }
  return pp_op_on(c->bridge, c->loop, kind);
}

pyop_t *pp_op_on(prosody_queue_t *box, PyObject *loop, int kind) {
  pyop_t *op;
  if (!(op = calloc(1, sizeof(*op))))
    return (pyop_t *)PyErr_NoMemory();
  if (!(op->fut = PyObject_CallMethodObjArgs(loop, S_create_future, NULL))) {
    free(op);
    return NULL;
  }
  op->op = kind;
  op->item.q.kind = IT_OP;
  op->item.obj = op;
  op->bridge = box;
  return op;
}

void pp_op_post(pyop_t *op, prosody_err_t err, const char *errstr) {
  op->err = err;
  op->errstr = err && errstr ? strdup(errstr) : NULL;
  prosody_queue_push(op->bridge, &op->item.q);
}

static void op_done_cb(prosody_err_t err, const char *errstr,
                       const int64_t *times, size_t n, void *opaque) {
  pyop_t *op = opaque;
  if (!err && n && (op->times = malloc(n * sizeof(int64_t)))) {
    memcpy(op->times, times, n * sizeof(int64_t));
    op->n = n;
  }
  pp_op_post(op, err, errstr);
}

/* A timer call's result. */
static PyObject *timer_result(const pyop_t *op) {
  PyObject *v;
  if (op->op != PROSODY_TIMER_SCHEDULED)
    return Py_NewRef(Py_None);
  v = PyList_New((Py_ssize_t)op->n);
  for (size_t i = 0; v && i < op->n; i++) {
    PyObject *t = pp_from_ms(op->times[i]);
    if (!t) {
      Py_CLEAR(v);
      break;
    }
    PyList_SET_ITEM(v, (Py_ssize_t)i, t);
  }
  return v;
}

void pp_op_resolve(pyop_t *op) {
  PyObject *r = NULL, *done = PyObject_CallMethodObjArgs(op->fut, S_done, NULL);
  if (done == Py_False) {
    if (op->err) {
      PyObject *exc = op->state ? pp_state_error_object(op->err, op->errstr)
                                : pp_error_object(op->err, op->errstr);
      if (exc) {
        r = PyObject_CallMethodObjArgs(op->fut, S_set_exception, exc, NULL);
        Py_DECREF(exc);
      }
    } else {
      PyObject *v = op->state ? pp_state_result(op) : timer_result(op);
      if (v) {
        r = PyObject_CallMethodObjArgs(op->fut, S_set_result, v, NULL);
        Py_DECREF(v);
      } else {
        /* E.g. a record's payload json.loads refuses: the awaiting
         * handler gets the error rather than waiting for ever. */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        if (value)
          r = PyObject_CallMethodObjArgs(op->fut, S_set_exception, value, NULL);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
      }
    }
  }
  if (!done || (done == Py_False && !r))
    PyErr_WriteUnraisable(op->fut);
  Py_XDECREF(done);
  Py_XDECREF(r);
  pp_op_free(op);
}

static PyObject *context_op(ContextObject *cx, int kind, PyObject *time) {
  ClientObject *c = cx->client;
  pyop_t *op;
  int64_t ms = 0;
  char err[512];
  prosody_err_t rc;
  if (pp_check_fork(c->pid, "Context"))
    return NULL;
  if (time && pp_to_ms(time, "time", &ms))
    return NULL;
  if (!(op = pp_op_new(c, kind)))
    return NULL;
  rc = prosody_timer_async(cx->ctx, (prosody_timer_op_t)kind, ms, op_done_cb,
                           op, err, sizeof(err));
  if (rc) {
    pp_op_free(op);
    return pp_raise_error(rc, err);
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
  if (pp_check_fork(cx->client->pid, "Context"))
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

static PyObject *context_on_cancel(PyObject *self, PyObject *unused) {
  ContextObject *cx = (ContextObject *)self;
  ClientObject *c = cx->client;
  if (pp_check_fork(c->pid, "Context"))
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
      return pp_ready(Py_NewRef(Py_None));
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
    {"state", pp_context_state, METH_O,
     "state(definition) -> ValueState | MapState | DequeState: the keyed "
     "state collection `definition` (prosody.state) for this event's key, "
     "valid until the handler returns."},
    {"_state_open", pp_context_state_open, METH_O, NULL},
    {NULL}};

PyTypeObject ContextType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "prosody.prosody.Context",
    .tp_basicsize = sizeof(ContextObject),
    .tp_dealloc = (destructor)context_dealloc,
    .tp_repr = context_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The context of one handler invocation: timers for the event's "
              "key and cancellation. Valid until the handler returns.",
    .tp_methods = context_methods,
};

void pp_op_free(pyop_t *op) {
  Py_DECREF(op->fut);
  free(op->errstr);
  free(op->times);
  free(op->items);
  free(op);
}
