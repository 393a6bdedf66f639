/*
 * client.c - ProsodyClient: a Kafka producer and consumer over
 * prosody_client_t. send() resolves its future from the producer's
 * delivery thread (call_soon_threadsafe); subscribe() and unsubscribe()
 * run the blocking C calls on the loop's executor and attach or detach the
 * mailbox (bridge.c) on the loop of subscribe(). Loop thread, except the
 * send callback and the executor calls.
 */
#include "prosody_py.h"

#include <string.h>

/* Stops the loop watching the client's log queue (the caller's exception,
 * if any, is kept). */
static void log_unwatch(ClientObject *c) {
  PyObject *type, *value, *tb, *fd, *r;
  log_sink_t *s = pp_log_sink_of(c->log_sink);
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
  log_sink_t *s = pp_log_sink_of(c->log_sink);
  if (!s || !loop || loop == c->log_loop)
    return;
  log_unwatch(c);
  reader = PyCFunction_New(&pp_log_reader_def, c->log_sink);
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
  if (!(conf = pp_config_from(kwargs)))
    return -1;
  {
    /* Which collections keep messages: Context.state() gives them
     * handles that store and give back Messages. */
    PyObject *states =
        kwargs ? PyDict_GetItemString(kwargs, "state_collections") : NULL;
    Py_XSETREF(c->message_states,
               PyObject_CallFunctionObjArgs(FnStateMessageNames,
                                            states ? states : Py_None, NULL));
    if (!c->message_states) {
      prosody_config_destroy(conf);
      return -1;
    }
  }
  for (int i = 0; i < 2; i++) {
    const char *opt = i ? "timer_spans" : "message_spans";
    if (!prosody_config_get(conf, opt, val, sizeof(val), NULL, err,
                            sizeof(err)))
      c->spans_follow[i] = !strcmp(val, "follows_from");
  }
  /* The client's lines go to `logging` (its `log` option is the level). */
  Py_XSETREF(c->log_sink, pp_log_sink_new());
  if (!c->log_sink) {
    prosody_config_destroy(conf);
    return -1;
  }
  prosody_config_set_log_cb(conf, pp_log_cb, pp_log_sink_of(c->log_sink));
  Py_BEGIN_ALLOW_THREADS
  client = prosody_client_new(conf, err, sizeof(err));
  Py_END_ALLOW_THREADS
  if (!client) {
    pp_log_drain(pp_log_sink_of(c->log_sink));
    prosody_config_destroy(conf);
    PyErr_SetString(PyExc_ValueError, err);
    return -1;
  }
  c->client = client;
  c->pid = getpid();
  /* Lines are forwarded on the thread that drains them: at once those of
   * the creation, then by the running loop (this one, or the one of a
   * later call), on unsubscribe and when the client is deallocated. */
  pp_log_sink_of(c->log_sink)->source =
      PyUnicode_FromString(prosody_client_source_system(client));
  PyErr_Clear();
  pp_log_drain(pp_log_sink_of(c->log_sink));
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
  Py_CLEAR(c->on_excise);
  Py_CLEAR(c->create_task);
}

static void client_dealloc(ClientObject *c) {
  if (c->client && getpid() == c->pid) { /* a forked child leaks it */
    Py_BEGIN_ALLOW_THREADS
    prosody_client_destroy(c->client);
    Py_END_ALLOW_THREADS
  }
  c->client = NULL;
  pp_reads_close(c); /* the readers' last results, if any */
  if (c->log_sink) { /* the lines of its closing, before the sink goes */
    pp_log_drain(pp_log_sink_of(c->log_sink));
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
        pp_op_free(it->obj);
      }
      it = next;
    }
    prosody_queue_destroy(c->bridge);
  }
  client_clear_handler(c);
  Py_CLEAR(c->loop);
  Py_CLEAR(c->sub_fut);
  Py_CLEAR(c->unsub_fut);
  Py_CLEAR(c->shutdown_fut);
  Py_CLEAR(c->stop_exc);
  Py_CLEAR(c->message_states);
  Py_TYPE(c)->tp_free((PyObject *)c);
}

static int client_ready(ClientObject *c) {
  if (!c->client) {
    PyErr_SetString(PyExc_RuntimeError, "ProsodyClient is not initialised");
    return -1;
  }
  return pp_check_fork(c->pid, "ProsodyClient");
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

static PyObject *FnResolve; /* resolve_def's function (pp_client_init) */

static PyMethodDef resolve_def = {"_resolve", resolve_future, METH_VARARGS,
                                  NULL};

static void send_done(prosody_err_t err, const char *errstr,
                      const prosody_delivery_t *d, void *opaque) {
  send_op_t *op = opaque;
  PyGILState_STATE g;
  PyObject *exc, *r;
  if (PR_FINALIZING())
    return; /* the interpreter is going away: nothing can be resolved */
  g = PyGILState_Ensure();
  exc = err ? pp_error_object(err, errstr) : Py_NewRef(Py_None);
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

/* send() and excise(): `payload` NULL sends an excise record. */
static PyObject *send_record(ClientObject *c, const char *topic,
                             const char *key, PyObject *payload) {
  PyObject *json = NULL, *loop = NULL, *fut = NULL, *th = NULL;
  const char *text = NULL;
  prosody_trace_t trace = {NULL, NULL, NULL}, *tp = NULL;
  send_op_t *op;
  char err[1024];
  prosody_err_t rc;
  if (client_ready(c))
    return NULL;
  if (payload &&
      !(json = PyObject_CallFunctionObjArgs(FnJsonDumps, payload, NULL)))
    return NULL;
  if ((json && !(text = PyUnicode_AsUTF8(json))) ||
      !(loop = pp_running_loop(payload ? "send()" : "excise()")) ||
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
  rc = payload ? prosody_send_async(c->client, topic, key, text, tp, send_done,
                                    op, err, sizeof(err))
               : prosody_excise_async(c->client, topic, key, tp, send_done, op,
                                      err, sizeof(err));
  if (rc) {
    PyObject *exc = pp_error_object(rc, err), *r = NULL;
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
  Py_XDECREF(json);
  Py_DECREF(loop);
  return fut;
fail:
  Py_XDECREF(th);
  Py_XDECREF(json);
  Py_XDECREF(loop);
  Py_XDECREF(fut);
  return NULL;
}

static PyObject *client_send(PyObject *self, PyObject *args) {
  PyObject *payload;
  const char *topic, *key;
  if (!PyArg_ParseTuple(args, "ssO:send", &topic, &key, &payload))
    return NULL;
  return send_record((ClientObject *)self, topic, key, payload);
}

static PyObject *client_excise(PyObject *self, PyObject *args) {
  const char *topic, *key;
  if (!PyArg_ParseTuple(args, "ss:excise", &topic, &key))
    return NULL;
  return send_record((ClientObject *)self, topic, key, NULL);
}

/* request() and request_excise(): the original's signatures, so that its
 * programs fail on a call this package cannot serve yet with a message
 * saying so, not with AttributeError. Nothing is sent. NotImplementedError
 * is a RuntimeError, which the original raises when a request cannot
 * start. The result types are in prosody/request.py. */
static PyObject *requests_not_implemented(const char *call) {
  PyErr_Format(PyExc_NotImplementedError,
               "ProsodyClient.%s(): subsystem requests are not implemented "
               "in Prosody-C yet; nothing was sent",
               call);
  return NULL;
}

static PyObject *client_request(PyObject *self, PyObject *args,
                                PyObject *kwargs) {
  static char *kw[] = {"topic",      "key",     "payload",
                       "subsystems", "timeout", NULL};
  PyObject *topic, *key, *payload, *subsystems = NULL, *timeout = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOO|$OO:request", kw, &topic,
                                   &key, &payload, &subsystems, &timeout))
    return NULL;
  return requests_not_implemented("request");
}

static PyObject *client_request_excise(PyObject *self, PyObject *args,
                                       PyObject *kwargs) {
  static char *kw[] = {"topic", "key", "subsystems", "timeout", NULL};
  PyObject *topic, *key, *subsystems = NULL, *timeout = NULL;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OO|$OO:request_excise", kw,
                                   &topic, &key, &subsystems, &timeout))
    return NULL;
  return requests_not_implemented("request_excise");
}

/* Runs prosody_subscribe on an executor thread. */
static PyObject *client_subscribe_blocking(PyObject *self, PyObject *unused) {
  ClientObject *c = (ClientObject *)self;
  prosody_handler_t h = {
      pp_c_on_message, c->has_timer ? pp_c_on_timer : NULL, c->bridge,
      PROSODY_HANDLER_ASYNC | (c->has_excise ? PROSODY_HANDLER_EXCISE : 0)};
  prosody_err_t rc;
  Py_BEGIN_ALLOW_THREADS
  rc = prosody_subscribe(c->client, &h, c->sub_err, sizeof(c->sub_err));
  Py_END_ALLOW_THREADS
  if (rc) {
    c->sub_failed = 1;
    return pp_raise_error(rc, c->sub_err);
  }
  Py_RETURN_NONE;
}

/* Stops watching the mailbox (loop thread), after a last drain. */
static void client_detach(ClientObject *c) {
  PyObject *r, *fd;
  if (!c->loop)
    return;
  r = pp_client_drain((PyObject *)c, NULL);
  Py_XDECREF(r);
  pp_log_drain(pp_log_sink_of(c->log_sink)); /* e.g. the consumer's stop */
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

/* prosody.handler.EventHandler (borrowed), taken at first use: that module
 * imports this one, so it cannot be taken at import. NULL with an
 * exception set on failure. */
static PyObject *ClsEventHandler;

static PyObject *event_handler_class(void) {
  if (!ClsEventHandler)
    ClsEventHandler = pp_attr_of("prosody.handler", "EventHandler");
  return ClsEventHandler;
}

/* True when `handler` has its own `name` method: not EventHandler's
 * default (an object that is no EventHandler: when it has one). */
static int implements(PyObject *handler, const char *name) {
  PyObject *m = PyObject_GetAttrString(handler, name), *f, *bf;
  int r = 0;
  if (!m || m == Py_None) {
    PyErr_Clear();
    Py_XDECREF(m);
    return 0;
  }
  f = PyObject_GetAttrString(m, "__func__");
  bf = event_handler_class() ? PyObject_GetAttrString(ClsEventHandler, name)
                             : NULL;
  r = !f || !bf || f != bf;
  PyErr_Clear();
  Py_DECREF(m);
  Py_XDECREF(f);
  Py_XDECREF(bf);
  return r;
}

/* The current API's checks of a handler (a client made by create()):
 * an EventHandler whose three methods are callable, with an on_excise of
 * its own. 0, or -1 with TypeError set. */
static int check_current_handler(PyObject *handler) {
  static const char *const names[] = {"on_message", "on_excise", "on_timer"};
  int is = event_handler_class() ? PyObject_IsInstance(handler, ClsEventHandler)
                                 : -1;
  if (is <= 0) {
    if (!is)
      PyErr_SetString(PyExc_TypeError,
                      "handler must be a subclass of EventHandler");
    return -1;
  }
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
    PyObject *m = PyObject_GetAttrString(handler, names[i]);
    int ok = m && PyCallable_Check(m);
    Py_XDECREF(m);
    PyErr_Clear();
    if (!ok) {
      PyErr_Format(PyExc_TypeError, "handler.%s must be callable", names[i]);
      return -1;
    }
  }
  if (!implements(handler, "on_excise")) {
    PyErr_Format(PyExc_TypeError,
                 "handler.on_excise must be implemented: %.100s does not "
                 "override EventHandler.on_excise, and a client made by "
                 "ProsodyClient.create() delivers every record without a "
                 "value (an excise record) to it",
                 Py_TYPE(handler)->tp_name);
    return -1;
  }
  return 0;
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
  if (c->current && check_current_handler(handler))
    return NULL;
  if (!(om = PyObject_GetAttrString(handler, "on_message")) ||
      !PyCallable_Check(om)) {
    Py_XDECREF(om);
    PyErr_Format(PyExc_TypeError,
                 "subscribe() needs a handler with an on_message coroutine "
                 "method (an EventHandler), got %.100s",
                 Py_TYPE(handler)->tp_name);
    return NULL;
  }
  if (!(loop = pp_running_loop("subscribe()")))
    goto fail;
  log_watch(c, loop);
  if (!c->bridge && !(c->bridge = prosody_queue_new(0, NULL, 0))) {
    PyErr_SetFromErrno(PyExc_OSError);
    goto fail;
  }
  c->has_timer = implements(handler, "on_timer");
  /* The 0.2 contract: excise records only for a handler that takes them;
   * the current one: always (checked above). */
  c->has_excise = implements(handler, "on_excise");
  c->handler = Py_NewRef(handler);
  c->on_message = om;
  om = NULL;
  if (c->has_timer &&
      !(c->on_timer = PyObject_GetAttrString(handler, "on_timer")))
    goto fail_reset;
  if (c->has_excise &&
      !(c->on_excise = PyObject_GetAttrString(handler, "on_excise")))
    goto fail_reset;
  if (!(c->create_task = PyObject_GetAttr(loop, S_create_task)))
    goto fail_reset;
  if (!(reader = PyCFunction_New(&pp_drain_def, self)))
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
 * see pp_client_drain. Otherwise the call is refused: the subscription's
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
  if (!(reader = PyCFunction_New(&pp_drain_def, (PyObject *)c)))
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
    return pp_ready(Py_NewRef(Py_None)); /* nothing to stop */
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
  const char *state;
  if (client_ready(c))
    return NULL;
  state = prosody_consumer_state(c->client);
  if (!strcmp(state, "shut-down"))
    state = "shut_down"; /* the original's spelling */
  else if (c->current && !strcmp(state, "configuration-failed"))
    return PyErr_Format(PyExc_RuntimeError, "consumer configuration failed: %s",
                        c->sub_err);
  return PyObject_CallFunction(ClsConsumerState, "s", state);
}

static PyObject *client_shutdown_blocking(PyObject *self, PyObject *unused) {
  ClientObject *c = (ClientObject *)self;
  prosody_err_t rc;
  Py_BEGIN_ALLOW_THREADS
  rc = prosody_client_shutdown(c->client);
  Py_END_ALLOW_THREADS
  if (rc)
    return pp_raise_error(rc, NULL);
  Py_RETURN_NONE;
}

static PyMethodDef shutdown_blocking_def = {
    "_shutdown_blocking", client_shutdown_blocking, METH_NOARGS, NULL};

/* One task for every call: concurrent and later calls await it. */
static PyObject *client_shutdown(PyObject *self, PyObject *unused) {
  ClientObject *c = (ClientObject *)self;
  PyObject *fn, *coro, *loop;
  if (client_ready(c))
    return NULL;
  if (c->shutdown_fut)
    return Py_NewRef(c->shutdown_fut);
  if (!(loop = pp_running_loop("shutdown()")))
    return NULL;
  log_watch(c, loop);
  if (!(fn = PyCFunction_New(&shutdown_blocking_def, self))) {
    Py_DECREF(loop);
    return NULL;
  }
  coro = PyObject_CallFunctionObjArgs(FnShutdownClient, self, fn, NULL);
  Py_DECREF(fn);
  if (coro)
    c->shutdown_fut =
        PyObject_CallMethodObjArgs(loop, S_create_task, coro, NULL);
  Py_XDECREF(coro);
  Py_DECREF(loop);
  return c->shutdown_fut ? Py_NewRef(c->shutdown_fut) : NULL;
}

/* ProsodyClient.create(**options): an awaitable that builds the client
 * off the loop, with the current API's contract (see the README). */
static PyObject *client_create(PyObject *cls, PyObject *args,
                               PyObject *kwargs) {
  PyObject *obj, *coro;
  if (PyTuple_GET_SIZE(args)) {
    PyErr_SetString(PyExc_TypeError,
                    "ProsodyClient.create takes keyword arguments only (e.g. "
                    "await ProsodyClient.create(group_id=\"app\", mock=True))");
    return NULL;
  }
  if (!(obj = ((PyTypeObject *)cls)->tp_alloc((PyTypeObject *)cls, 0)))
    return NULL;
  ((ClientObject *)obj)->current = 1;
  coro = PyObject_CallFunctionObjArgs(FnCreateClient, obj,
                                      kwargs ? kwargs : Py_None, NULL);
  Py_DECREF(obj);
  return coro;
}

static PyObject *client_assigned_partition_count(PyObject *self,
                                                 PyObject *unused) {
  ClientObject *c = (ClientObject *)self;
  if (client_ready(c))
    return NULL;
  return pp_ready(PyLong_FromLong(prosody_assigned_partition_count(c->client)));
}

static PyObject *client_is_stalled(PyObject *self, PyObject *unused) {
  ClientObject *c = (ClientObject *)self;
  if (client_ready(c))
    return NULL;
  return pp_ready(PyBool_FromLong(prosody_is_stalled(c->client)));
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
    {"create", (PyCFunction)(void (*)(void))client_create,
     METH_CLASS | METH_VARARGS | METH_KEYWORDS,
     "create(**options) -> awaitable of ProsodyClient: builds the client off "
     "the event loop, with the current API's contract (README)."},
    {"send", client_send, METH_VARARGS,
     "send(topic, key, payload) -> awaitable: sends `payload` (any "
     "JSON-serialisable value) and resolves when the broker acknowledged."},
    {"excise", client_excise, METH_VARARGS,
     "excise(topic, key) -> awaitable: sends an excise record (the key with "
     "no value, a tombstone) and resolves when the broker acknowledged."},
    {"request", (PyCFunction)(void (*)(void))client_request,
     METH_VARARGS | METH_KEYWORDS,
     "request(topic, key, payload, *, subsystems, timeout): not implemented "
     "yet; raises NotImplementedError and sends nothing."},
    {"request_excise", (PyCFunction)(void (*)(void))client_request_excise,
     METH_VARARGS | METH_KEYWORDS,
     "request_excise(topic, key, *, subsystems, timeout): not implemented "
     "yet; raises NotImplementedError and sends nothing."},
    {"shutdown", client_shutdown, METH_NOARGS,
     "shutdown() -> awaitable: stops consuming (if subscribed), waits for "
     "the records being sent, and refuses every later operation; repeated "
     "calls share one."},
    {"subscribe", client_subscribe, METH_O,
     "subscribe(handler) -> awaitable: starts consuming with `handler` on "
     "the running event loop; awaiting it reports a failure to start."},
    {"unsubscribe", client_unsubscribe, METH_NOARGS,
     "unsubscribe() -> awaitable: stops consuming gracefully (in-flight work "
     "finishes and is committed)."},
    {"consumer_state", client_consumer_state, METH_NOARGS,
     "consumer_state() -> 'unconfigured' | 'configured' | 'running' | "
     "'configuration-failed' | 'shut_down' (a str that may also be "
     "awaited; a client made by create() raises RuntimeError instead of "
     "'configuration-failed')."},
    {"assigned_partition_count", client_assigned_partition_count, METH_NOARGS,
     "assigned_partition_count() -> awaitable of int."},
    {"_published_value", (PyCFunction)(void (*)(void))pp_published_value,
     METH_VARARGS | METH_KEYWORDS,
     "_published_value(subsystem, name, read_cache=None) -> awaitable of a "
     "native reader (prosody.state wraps it)."},
    {"_published_map", (PyCFunction)(void (*)(void))pp_published_map,
     METH_VARARGS | METH_KEYWORDS,
     "_published_map(subsystem, name, read_cache=None): as "
     "_published_value."},
    {"_published_deque", (PyCFunction)(void (*)(void))pp_published_deque,
     METH_VARARGS | METH_KEYWORDS,
     "_published_deque(subsystem, name, read_cache=None): as "
     "_published_value."},
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

PyTypeObject ClientType = {
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

int pp_client_init(void) {
  if (!(FnResolve = PyCFunction_New(&resolve_def, NULL)))
    return -1;
  return PyType_Ready(&ClientType);
}
