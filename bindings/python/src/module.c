/*
 * module.c - the native module `prosody.prosody` (the native part of the
 * `prosody` package): it registers ProsodyClient (client.c), Context
 * (context.c) and AdminClient (admin.c), takes at import the classes and
 * functions of the pure-Python modules that the other files call, and
 * holds the helpers they share (errors, the running loop, awaitables of
 * known values). The files and their threads: prosody_py.h.
 */
#include "prosody_py.h"

/* ------------------------------------------------------------------------ */
/* Module-level references (set once at import, GIL held)                   */
/* ------------------------------------------------------------------------ */

PyObject *ErrProsody, *ErrTransient, *ErrPermanent; /* prosody.errors */
PyObject *ClsEventHandlerError;
PyObject *ClsMessage, *ClsTimer;             /* prosody.message/.timer */
PyObject *ClsExciseMessage;                  /* prosody.message */
PyObject *FnCreateClient, *FnShutdownClient; /* prosody._support */
PyObject *ClsConsumerState, *FnReady;        /* prosody._support */
PyObject *FnTraceHeaders, *FnHandlerContext, *FnRunAfter;
int otel_enabled;
PyObject *FnGetRunningLoop, *FnJsonDumps, *FnJsonLoads;
PyObject *S_create_future, *S_create_task, *S_add_done_callback, *S_set_result,
    *S_set_exception, *S_cancelled, *S_exception, *S_done,
    *S_call_soon_threadsafe, *S_add_reader, *S_remove_reader,
    *S_run_in_executor, *S_run, *S_end, *S_record_exception, *S_is_permanent,
    *S_await, *S_anext, *S_is_closed, *S__core;

PyObject *FnForwardLogs;
PyObject *ErrTransientState, *ErrPermanentState;
PyObject *FnStateBind, *FnStateConfigs, *FnStateMessageNames;

/* ------------------------------------------------------------------------ */
/* Errors                                                                   */
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
PyObject *pp_error_object(prosody_err_t err, const char *msg) {
  PyObject *cls = error_class(err);
  if (!msg || !*msg)
    msg = prosody_err_message(err);
  if (cls == PyExc_ValueError || cls == PyExc_MemoryError)
    return PyObject_CallFunction(cls, "s", msg);
  return PyObject_CallFunction(cls, "ss", msg, prosody_err_name(err));
}

/* Sets the Python error for a libprosody error; returns NULL. */
PyObject *pp_raise_error(prosody_err_t err, const char *msg) {
  PyObject *exc = pp_error_object(err, msg);
  if (exc) {
    PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
    Py_DECREF(exc);
  }
  return NULL;
}

int pp_check_fork(pid_t pid, const char *what) {
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
/* Shared helpers                                                           */
/* ------------------------------------------------------------------------ */

PyObject *pp_running_loop(const char *what) {
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

PyObject *pp_ready(PyObject *value) {
  PyObject *r;
  if (!value)
    return NULL;
  r = PyObject_CallFunctionObjArgs(FnReady, value, NULL);
  Py_DECREF(value);
  return r;
}

/* ------------------------------------------------------------------------ */
/* Module                                                                   */
/* ------------------------------------------------------------------------ */

static PyObject *mod_version(PyObject *self, PyObject *unused) {
  return PyUnicode_FromString(prosody_version_str());
}

static PyObject *mod_mock_bootstrap(PyObject *self, PyObject *unused) {
  char buf[128], err[512];
  prosody_err_t rc =
      prosody_mock_bootstrap_servers(buf, sizeof(buf), err, sizeof(err));
  if (rc)
    return pp_raise_error(rc, err);
  return PyUnicode_FromString(buf);
}

/* mock_set_group_initial_rebalance_delay(seconds) -> the previous seconds
 * (prosody_mock_set_group_initial_rebalance_delay(), in whole ms). */
static PyObject *mod_mock_group_delay(PyObject *self, PyObject *arg) {
  char err[512];
  double s = PyFloat_AsDouble(arg);
  int previous = 0;
  prosody_err_t rc;
  if (s == -1.0 && PyErr_Occurred())
    return NULL;
  if (PyBool_Check(arg) || !(s >= 0 && s <= 300))
    return PyErr_Format(PyExc_ValueError,
                        "mock_set_group_initial_rebalance_delay: expected "
                        "seconds in 0..=300, got %R",
                        arg);
  rc = prosody_mock_set_group_initial_rebalance_delay(
      (int)(s * 1000 + 0.5), &previous, err, sizeof(err));
  if (rc)
    return pp_raise_error(rc, err);
  return PyFloat_FromDouble(previous / 1000.0);
}

static PyObject *mod_options(PyObject *self, PyObject *unused) {
  return Py_NewRef(pp_options_types());
}

/* flush_telemetry() / shutdown_telemetry(): blocking, as the original's
 * (its docs: call them from synchronous code, at exit or between clients);
 * the GIL is released meanwhile. */
#define TELEMETRY_TIMEOUT_MS 30000

static PyObject *telemetry_call(int shutdown) {
  prosody_err_t rc;
  Py_BEGIN_ALLOW_THREADS
  rc = shutdown ? prosody_telemetry_shutdown(TELEMETRY_TIMEOUT_MS)
                : prosody_telemetry_flush(TELEMETRY_TIMEOUT_MS);
  Py_END_ALLOW_THREADS
  if (rc)
    return PyErr_Format(PyExc_RuntimeError,
                        "Failed to %s telemetry: spans still unexported "
                        "after %d s",
                        shutdown ? "shut down" : "flush",
                        TELEMETRY_TIMEOUT_MS / 1000);
  Py_RETURN_NONE;
}

static PyObject *mod_flush_telemetry(PyObject *self, PyObject *unused) {
  return telemetry_call(0);
}

static PyObject *mod_shutdown_telemetry(PyObject *self, PyObject *unused) {
  return telemetry_call(1);
}

static PyMethodDef module_methods[] = {
    {"flush_telemetry", mod_flush_telemetry, METH_NOARGS,
     "flush_telemetry() -> None: exports every span ended so far, in every "
     "client, and waits until done (at most 30 s; RuntimeError after)."},
    {"shutdown_telemetry", mod_shutdown_telemetry, METH_NOARGS,
     "shutdown_telemetry() -> None: stops tracing for the process (no span "
     "starts afterwards), then flushes as flush_telemetry()."},
    {"library_version", mod_version, METH_NOARGS,
     "The libprosody version this module was built with."},
    {"mock_bootstrap_servers", mod_mock_bootstrap, METH_NOARGS,
     "The embedded mock cluster's bootstrap address (started on first use)."},
    {"mock_set_group_initial_rebalance_delay", mod_mock_group_delay, METH_O,
     "mock_set_group_initial_rebalance_delay(seconds) -> float: how long the "
     "mock cluster waits for more members before it assigns an empty group's "
     "partitions (3.0 by default; 0 assigns a group of one at once), for "
     "every join from now on, in the whole process. Returns the previous "
     "value, to restore it."},
    {"options", mod_options, METH_NOARGS,
     "Every option name mapped to its type, from libprosody's table."},
    {NULL}};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "prosody.prosody",
                                       "The native part of the prosody "
                                       "package (libprosody).",
                                       -1, module_methods};

PyObject *pp_attr_of(const char *module, const char *name) {
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
               {&S_is_closed, "is_closed"},
               {&S__core, "_core"}};
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
    if (!(*names[i].p = PyUnicode_InternFromString(names[i].s)))
      return -1;
  return 0;
}

PyMODINIT_FUNC PyInit_prosody(void) {
  PyObject *m, *otel;
  if (intern_all())
    return NULL;
  if (!(ErrProsody = pp_attr_of("prosody.errors", "ProsodyError")) ||
      !(ErrTransient = pp_attr_of("prosody.errors", "ProsodyTransientError")) ||
      !(ErrPermanent = pp_attr_of("prosody.errors", "ProsodyPermanentError")) ||
      !(ClsEventHandlerError =
            pp_attr_of("prosody.errors", "EventHandlerError")) ||
      !(ClsMessage = pp_attr_of("prosody.message", "Message")) ||
      !(ClsTimer = pp_attr_of("prosody.timer", "Timer")) ||
      !(ClsExciseMessage = pp_attr_of("prosody.message", "ExciseMessage")) ||
      !(FnCreateClient = pp_attr_of("prosody._support", "create_client")) ||
      !(FnShutdownClient = pp_attr_of("prosody._support", "shutdown_client")) ||
      !(ClsConsumerState = pp_attr_of("prosody._support", "ConsumerState")) ||
      !(FnReady = pp_attr_of("prosody._support", "Ready")) ||
      !(FnTraceHeaders = pp_attr_of("prosody._support", "trace_headers")) ||
      !(FnHandlerContext = pp_attr_of("prosody._support", "handler_context")) ||
      !(FnRunAfter = pp_attr_of("prosody._support", "run_after")) ||
      !(FnForwardLogs = pp_attr_of("prosody._support", "forward_logs")) ||
      !(ErrTransientState =
            pp_attr_of("prosody.errors", "TransientStateError")) ||
      !(ErrPermanentState =
            pp_attr_of("prosody.errors", "PermanentStateError")) ||
      !(FnStateBind = pp_attr_of("prosody.state", "_bind")) ||
      !(FnStateConfigs = pp_attr_of("prosody.state", "_collection_configs")) ||
      !(FnStateMessageNames = pp_attr_of("prosody.state", "_message_names")) ||
      !(otel = pp_attr_of("prosody._support", "OTEL")) ||
      !(FnGetRunningLoop = pp_attr_of("asyncio", "get_running_loop")) ||
      !(FnJsonDumps = pp_attr_of("json", "dumps")) ||
      !(FnJsonLoads = pp_attr_of("json", "loads")))
    return NULL;
  otel_enabled = PyObject_IsTrue(otel) > 0;
  Py_DECREF(otel);
  if (pp_options_init() || pp_client_init() || pp_admin_init() ||
      PyType_Ready(&ContextType) || PyType_Ready(&StateType) ||
      PyType_Ready(&PublishedType))
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
