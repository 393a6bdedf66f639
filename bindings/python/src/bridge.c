/*
 * bridge.c - from libprosody's threads to the event loop. libprosody's
 * callbacks (the asynchronous handler's, on the engine thread; log lines,
 * on any of the client's threads) never take the GIL: they push an item to
 * a libprosody event queue (prosody_queue_t) and return. The loop watches
 * each queue's descriptor (add_reader) and, on the loop thread, takes the
 * batch: log lines go to `logging`, events become Message/Timer objects
 * whose handler coroutine starts as a task, results and cancellations
 * settle their futures (context.c).
 */
#include "prosody_py.h"

#include <string.h>

/* ------------------------------------------------------------------------ */
/* Log lines (libprosody's threads -> the loop -> `logging`)                */
/* ------------------------------------------------------------------------ */

/* The lines a client may have queued for `logging`; more are dropped (and
 * counted) rather than waited for. */
#define LOG_QUEUE_LINES 1024

void pp_log_cb(prosody_log_level_t level, const char *subsystem,
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

/* Forwards the queued lines to `logging` (GIL held, any Python thread; the
 * caller's exception, if any, is kept). Without a usable interpreter (it
 * is finalizing) they go to standard error. */
void pp_log_drain(log_sink_t *s) {
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
  pp_log_drain(s);
  prosody_queue_destroy(s->box);
  Py_XDECREF(s->source);
  free(s);
}

/* A capsule owning a new sink, or NULL with an exception set. */
PyObject *pp_log_sink_new(void) {
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

log_sink_t *pp_log_sink_of(PyObject *capsule) {
  return capsule ? PyCapsule_GetPointer(capsule, "prosody.log_sink") : NULL;
}

/* The loop's reader callback for a sink's queue. */
static PyObject *log_reader(PyObject *capsule, PyObject *unused) {
  log_sink_t *s = pp_log_sink_of(capsule);
  if (!s)
    return NULL;
  pp_log_drain(s);
  Py_RETURN_NONE;
}

PyMethodDef pp_log_reader_def = {"_forward_logs", log_reader, METH_NOARGS,
                                 NULL};

/* ------------------------------------------------------------------------ */
/* Handler hand-over (engine thread -> loop)                                */
/* ------------------------------------------------------------------------ */
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

prosody_result_t pp_c_on_message(prosody_context_t *ctx,
                                 const prosody_message_t *msg, void *opaque) {
  /* Parse the payload here, on the engine thread, which has time to
   * spare: the event loop thread, where build_message() reads the tree,
   * is the binding's bottleneck. */
  (void)prosody_message_json(msg);
  return push_event(opaque, IT_MESSAGE, ctx, msg);
}

prosody_result_t pp_c_on_timer(prosody_context_t *ctx,
                               const prosody_timer_t *timer, void *opaque) {
  return push_event(opaque, IT_TIMER, ctx, timer);
}

PyObject *pp_message_new(const char *topic, int32_t partition, int64_t offset,
                         int64_t ts, const char *key, PyObject *payload) {
  PyObject *t = NULL, *part = NULL, *off = NULL, *time = NULL, *k = NULL,
           *r = NULL;
  if (!payload)
    return NULL;
  if (!(t = PyUnicode_FromString(topic)) ||
      !(part = PyLong_FromLong(partition)) ||
      !(off = PyLong_FromLongLong(offset)) ||
      !(time = ts >= 0 ? pp_from_ms(ts) : Py_NewRef(Py_None)) ||
      !(k = key ? PyUnicode_FromString(key) : Py_NewRef(Py_None)))
    goto out;
  r = PyObject_CallFunctionObjArgs(ClsMessage, t, part, off, time, k, payload,
                                   NULL);
  /* Past the frozen dataclass's __setattr__: a Message made in Python has
   * no `_core`, so a MESSAGE collection refuses it. */
  if (r && PyObject_GenericSetAttr(r, S__core, Py_True))
    Py_CLEAR(r);
out:
  Py_XDECREF(t);
  Py_XDECREF(part);
  Py_XDECREF(off);
  Py_XDECREF(time);
  Py_XDECREF(k);
  Py_DECREF(payload);
  return r;
}

static PyObject *build_message(const prosody_message_t *m) {
  const json_t *j = prosody_message_json(m);
  PyObject *payload =
      j ? json_to_py(j)
        : PyObject_CallFunction(FnJsonLoads, "s#", prosody_message_payload(m),
                                (Py_ssize_t)prosody_message_payload_len(m));
  return pp_message_new(prosody_message_topic(m), prosody_message_partition(m),
                        prosody_message_offset(m), prosody_message_timestamp(m),
                        prosody_message_key(m), payload);
}

/* An excise record (no payload) as prosody.message.ExciseMessage. */
static PyObject *build_excise(const prosody_message_t *m) {
  int64_t t = prosody_message_timestamp(m);
  PyObject *ts = t >= 0 ? pp_from_ms(t) : Py_NewRef(Py_None), *r;
  if (!ts)
    return NULL;
  r = PyObject_CallFunction(ClsExciseMessage, "siLOs", prosody_message_topic(m),
                            (int)prosody_message_partition(m),
                            (long long)prosody_message_offset(m), ts,
                            prosody_message_key(m));
  Py_DECREF(ts);
  return r;
}

static PyObject *build_timer(const prosody_timer_t *t) {
  PyObject *key = PyUnicode_FromString(prosody_timer_key(t)), *time, *r;
  if (!key)
    return NULL;
  if (!(time = pp_from_ms(prosody_timer_time(t)))) {
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
static void finish_lazy(ClientObject *c, ContextObject *cx, const char *method,
                        PyObject *v, const char *kind) {
  PyObject *text = PyUnicode_FromFormat(
      "TypeError: %s.%s returned %s (%.100s), not a coroutine or a value, so "
      "its body never ran (is there a `yield` in it?); the event failed",
      Py_TYPE(c->handler)->tp_name, method, kind, Py_TYPE(v)->tp_name);
  const char *msg = text ? PyUnicode_AsUTF8(text) : NULL;
  PyErr_Clear();
  pp_end_span(cx, NULL);
  pp_context_finish(cx, PROSODY_TRANSIENT,
                    msg ? msg : "the handler returned a generator");
  Py_XDECREF(text);
}

/* A handler raised SystemExit or KeyboardInterrupt (the exception pending):
 * the application asks to stop. Its event fails (transient: it is not
 * committed), and the exception is kept to be re-raised on the loop thread
 * once the drain is over, as asyncio does for a task (see pp_client_drain). */
static int stop_requested(ClientObject *c, ContextObject *cx) {
  PyObject *type, *value, *tb;
  if (!PyErr_ExceptionMatches(PyExc_SystemExit) &&
      !PyErr_ExceptionMatches(PyExc_KeyboardInterrupt))
    return 0;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  if (value && tb)
    PyException_SetTraceback(value, tb);
  pp_end_span(cx, value);
  pp_context_finish(cx, PROSODY_TRANSIENT,
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
  ContextObject *cx = pp_context_new(c, it->ctx);
  PyObject *event = NULL, *coro = NULL, *task = NULL, *cb = NULL, *r, *run_in;
  int excise = it->q.kind == IT_MESSAGE && prosody_message_is_excise(it->event);
  PyObject *method = excise                     ? c->on_excise
                     : it->q.kind == IT_MESSAGE ? c->on_message
                                                : c->on_timer;
  const char *method_name = excise                     ? "on_excise"
                            : it->q.kind == IT_MESSAGE ? "on_message"
                                                       : "on_timer";
  if (!cx) {
    PyErr_Clear();
    prosody_complete(it->ctx, PROSODY_TRANSIENT, "out of memory");
    return;
  }
  event = excise                     ? build_excise(it->event)
          : it->q.kind == IT_MESSAGE ? build_message(it->event)
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
      finish_lazy(c, cx, method_name, coro, lazy);
      goto out;
    }
    /* A plain function: its return is the success. */
    pp_end_span(cx, NULL);
    pp_context_finish(cx, PROSODY_SUCCESS, NULL);
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
  if (!(cb = PyCFunction_New(&pp_task_done_def, (PyObject *)cx)))
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
    pp_finish_with_exception(cx, value);
  } else {
    pp_context_finish(cx, PROSODY_TRANSIENT, "handler could not be started");
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
PyObject *pp_client_drain(PyObject *self, PyObject *unused) {
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
        pp_op_free(it->obj);
      } else {
        pp_op_resolve(it->obj);
      }
      break;
    case IT_CANCEL: {
      ContextObject *cx = it->obj;
      pp_resolve_cancel(cx);
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

PyMethodDef pp_drain_def = {"_drain", pp_client_drain, METH_NOARGS, NULL};
