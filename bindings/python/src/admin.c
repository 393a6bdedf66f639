/*
 * admin.c - AdminClient: topic creation and deletion. Each call runs
 * prosody_admin_* on the loop's default executor with the GIL released
 * (it blocks on the broker) and returns that future.
 */
#include "prosody_py.h"

#include <math.h>

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
  if (!(conf = pp_config_from(kwargs)))
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
  return pp_check_fork(a->pid, "AdminClient");
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
    return pp_raise_error(rc, err);
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
    return pp_raise_error(rc, err);
  Py_RETURN_NONE;
}

static PyMethodDef admin_create_def = {
    "_create_blocking", admin_create_blocking, METH_VARARGS, NULL};
static PyMethodDef admin_delete_def = {
    "_delete_blocking", admin_delete_blocking, METH_VARARGS, NULL};

/* Runs a blocking admin call on the loop's default executor. */
static PyObject *admin_run(PyObject *self, PyMethodDef *def, PyObject *args) {
  PyObject *loop = pp_running_loop("AdminClient"), *fn, *call, *fut;
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
    if (pp_delta_seconds(retention, &s)) {
      /* a timedelta */
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

PyTypeObject AdminType = {
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

int pp_admin_init(void) { return PyType_Ready(&AdminType); }
