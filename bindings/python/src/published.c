/*
 * published.c - published keyed state (include/prosody.h, "Published keyed
 * state"): the native half of ProsodyClient.state() (prosody/__init__.py).
 * The native client's _published_value/_map/_deque(subsystem, name,
 * read_cache=...) open a reader (prosody_published_open: it may block, so
 * on the loop's executor) and give a PublishedHandle; prosody.published
 * puts it under a PublishedValue, PublishedMap or PublishedDeque. A
 * handle's methods start
 * prosody_published_async and return a future of (items, number), as a
 * StateHandle's call() does.
 *
 * DESIGN. Results come back through a read box, a prosody_queue_t per
 * client and event loop: a reader needs no subscription (so not the
 * subscription's mailbox), and reads may come from any loop, each future
 * belonging to the loop that made it. The callback (the client's reader
 * thread, or the calling thread before prosody_published_async returns when
 * the answer was cached) copies the result into the op and pushes it to
 * the box of the op's loop (pp_state_done_cb): no Python object is touched
 * there. That loop watches its box (add_reader) and settles the futures
 * when it drains, on its own thread.
 *
 * Lifetimes. The client keeps {loop: capsule of the loop's box}; the loop's
 * reader holds the capsule too, so the box outlives neither's use of it.
 * The entry of a loop found closed is dropped at the next read (its ops
 * are freed: nobody can await them). A reader (prosody_published_t)
 * belongs to the client: a handle holds a reference to its client object.
 * prosody_client_destroy ends the reads still running (PROSODY_ERR_STATE,
 * pushed to their boxes); pp_reads_close then has each open loop settle
 * them and stop watching.
 *
 * Threads: the loop thread with the GIL, except open_blocking (an executor
 * thread; the GIL released around prosody_published_open) and
 * pp_state_done_cb.
 */
#include "prosody_py.h"

#include <math.h>
#include <string.h>

/* A reader: one prosody_published_t of its client. Loop thread. */
typedef struct {
  PyObject_HEAD
  prosody_published_t *p; /* owned by the client */
  ClientObject *client;   /* strong reference: keeps `p` alive */
  int kind;               /* prosody_state_kind_t */
} PublishedObject;

static const char *const KIND_NAMES[] = {"value", "map", "deque"};

/* ------------------------------------------------------------------------ */
/* The read box                                                             */
/* ------------------------------------------------------------------------ */

static prosody_queue_t *box_of(PyObject *capsule) {
  return PyCapsule_GetPointer(capsule, "prosody.reads");
}

/* 1 if `loop` is closed (or unusable), else 0. */
static int closed(PyObject *loop) {
  PyObject *r = PyObject_CallMethodObjArgs(loop, S_is_closed, NULL);
  int yes = !r || PyObject_IsTrue(r) != 0;
  Py_XDECREF(r);
  PyErr_Clear();
  return yes;
}

/* The box's loop's reader (self: the capsule; its loop's thread): settles
 * every op taken. */
static PyObject *box_ready(PyObject *capsule, PyObject *unused) {
  item_t *it = (item_t *)prosody_queue_take(box_of(capsule), NULL);
  while (it) {
    item_t *next = ITEM_NEXT(it);
    pp_op_resolve(it->obj);
    it = next;
  }
  Py_RETURN_NONE;
}

/* Settles what is left and stops the loop watching the box (self: the
 * capsule; the loop's thread). */
static PyObject *box_stop(PyObject *capsule, PyObject *loop) {
  PyObject *fd, *r = box_ready(capsule, NULL);
  Py_XDECREF(r);
  fd = PyLong_FromLong(prosody_queue_fd(box_of(capsule)));
  r = fd ? PyObject_CallMethodObjArgs(loop, S_remove_reader, fd, NULL) : NULL;
  Py_XDECREF(fd);
  Py_XDECREF(r);
  PyErr_Clear(); /* closed meanwhile: it watches nothing */
  Py_RETURN_NONE;
}

static PyMethodDef box_ready_def = {"_reads_ready", box_ready, METH_NOARGS,
                                    NULL};
static PyMethodDef box_stop_def = {"_reads_stop", box_stop, METH_O, NULL};

/* The last reference is gone: the loop is closed or stopped watching, so
 * what is left can be awaited by nobody. */
static void box_destroy(PyObject *capsule) {
  prosody_queue_t *box = box_of(capsule);
  item_t *it = (item_t *)prosody_queue_take(box, NULL);
  while (it) {
    item_t *next = ITEM_NEXT(it);
    pp_op_free(it->obj);
    it = next;
  }
  prosody_queue_destroy(box);
}

/* Drops the entries of closed loops (GIL). */
static void prune(ClientObject *c) {
  PyObject *loop, *cap, *gone = PyList_New(0);
  Py_ssize_t pos = 0;
  while (gone && PyDict_Next(c->reads, &pos, &loop, &cap))
    if (closed(loop) && PyList_Append(gone, loop))
      break;
  for (Py_ssize_t i = 0; gone && i < PyList_GET_SIZE(gone); i++)
    PyDict_DelItem(c->reads, PyList_GET_ITEM(gone, i));
  Py_XDECREF(gone);
  PyErr_Clear();
}

/* The box of `loop`, the running one, made and watched at its first read
 * (NULL with an exception set). */
static prosody_queue_t *box_for(ClientObject *c, PyObject *loop) {
  PyObject *cap, *reader, *fd, *r = NULL;
  prosody_queue_t *box;
  char err[256];
  if (!c->reads && !(c->reads = PyDict_New()))
    return NULL;
  if ((cap = PyDict_GetItemWithError(c->reads, loop)))
    return box_of(cap);
  if (PyErr_Occurred())
    return NULL;
  prune(c);
  if (!(box = prosody_queue_new(0, err, sizeof(err)))) {
    PyErr_SetString(PyExc_OSError, err);
    return NULL;
  }
  if (!(cap = PyCapsule_New(box, "prosody.reads", box_destroy))) {
    prosody_queue_destroy(box);
    return NULL;
  }
  reader = PyCFunction_New(&box_ready_def, cap);
  fd = PyLong_FromLong(prosody_queue_fd(box));
  if (reader && fd)
    r = PyObject_CallMethodObjArgs(loop, S_add_reader, fd, reader, NULL);
  Py_XDECREF(reader);
  Py_XDECREF(fd);
  if (!r || PyDict_SetItem(c->reads, loop, cap)) {
    Py_XDECREF(r);
    Py_DECREF(cap);
    return NULL;
  }
  Py_DECREF(r);
  Py_DECREF(cap);
  return box;
}

void pp_reads_close(ClientObject *c) {
  PyObject *running, *loop, *cap, *stop, *r, *type, *value, *tb;
  Py_ssize_t pos = 0;
  if (!c->reads)
    return;
  PyErr_Fetch(&type, &value, &tb);
  running = PyObject_CallNoArgs(FnGetRunningLoop);
  PyErr_Clear();
  while (PyDict_Next(c->reads, &pos, &loop, &cap)) {
    if (closed(loop))
      continue;
    if (!(stop = PyCFunction_New(&box_stop_def, cap)))
      continue;
    r = loop == running ? PyObject_CallFunctionObjArgs(stop, loop, NULL)
                        : PyObject_CallMethodObjArgs(
                              loop, S_call_soon_threadsafe, stop, loop, NULL);
    Py_XDECREF(r);
    Py_DECREF(stop);
    PyErr_Clear();
  }
  Py_XDECREF(running);
  Py_CLEAR(c->reads);
  PyErr_Restore(type, value, tb);
}

/* ------------------------------------------------------------------------ */
/* Opening a reader                                                         */
/* ------------------------------------------------------------------------ */

/* A definition's read_cache as read_cache_ms: None -1 (the client's
 * state_read_cache), False 0 (read the store every time), a timedelta or
 * seconds >= 0 (rounded up to a whole millisecond). -2 with ValueError
 * set otherwise. */
static int64_t read_cache_ms(PyObject *v) {
  double s;
  if (v == Py_None)
    return -1;
  if (v == Py_False)
    return 0;
  if (v == Py_True) {
    PyErr_SetString(PyExc_ValueError,
                    "read_cache=True is ambiguous; pass a duration, False, or "
                    "None");
    return -2;
  }
  if (!pp_delta_seconds(v, &s)) {
    if (!PyLong_Check(v) && !PyFloat_Check(v)) {
      PyErr_Format(PyExc_TypeError,
                   "read_cache: expected a timedelta, seconds, False or None, "
                   "got %.100s",
                   Py_TYPE(v)->tp_name);
      return -2;
    }
    s = PyFloat_AsDouble(v);
    if (s == -1.0 && PyErr_Occurred())
      return -2;
  }
  if (!isfinite(s) || s < 0 || s > 9e15 / 1000) {
    PyErr_Format(PyExc_ValueError,
                 "read_cache: expected a duration >= 0 (a timedelta or "
                 "seconds), False or None, got %R",
                 v);
    return -2;
  }
  return (int64_t)ceil(s * 1000);
}

/* Runs prosody_published_open on an executor thread (self: the client;
 * args: subsystem, name, kind, read_cache_ms) and makes the handle. */
static PyObject *open_blocking(PyObject *self, PyObject *args) {
  ClientObject *c = (ClientObject *)self;
  const char *subsystem, *name;
  int kind;
  long long ms;
  prosody_published_t *p = NULL;
  PublishedObject *h;
  char err[512];
  prosody_err_t rc;
  if (!PyArg_ParseTuple(args, "ssiL", &subsystem, &name, &kind, &ms))
    return NULL;
  if (!c->client) {
    PyErr_SetString(PyExc_RuntimeError, "ProsodyClient is not initialised");
    return NULL;
  }
  Py_BEGIN_ALLOW_THREADS
  rc = prosody_published_open(c->client, subsystem, name, kind, ms, &p, err,
                              sizeof(err));
  Py_END_ALLOW_THREADS
  if (rc == PROSODY_ERR_CONFIG) {
    /* A client that cannot read published state at all (no
     * cassandra_nodes outside mock mode): a configuration error. */
    PyErr_SetString(PyExc_ValueError, err);
    return NULL;
  }
  if (rc)
    return pp_state_raise(rc, err);
  if (!(h = PyObject_New(PublishedObject, &PublishedType)))
    return NULL;
  h->p = p;
  h->client = (ClientObject *)Py_NewRef(self);
  h->kind = kind;
  return (PyObject *)h;
}

static PyMethodDef open_blocking_def = {"_published_open", open_blocking,
                                        METH_VARARGS, NULL};

/* _published_<kind>(subsystem, name, read_cache=None) -> future of a
 * PublishedHandle. */
static PyObject *published_open(PyObject *self, PyObject *args, PyObject *kw,
                                int kind) {
  static char *names[] = {"subsystem", "name", "read_cache", NULL};
  ClientObject *c = (ClientObject *)self;
  PyObject *subsystem, *name, *rc = Py_None, *loop, *fn, *fut;
  int64_t ms;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "UU|O", names, &subsystem, &name,
                                   &rc))
    return NULL;
  if ((ms = read_cache_ms(rc)) < -1)
    return NULL;
  if (!c->client) {
    PyErr_SetString(PyExc_RuntimeError, "ProsodyClient is not initialised");
    return NULL;
  }
  if (pp_check_fork(c->pid, "ProsodyClient"))
    return NULL;
  if (!(loop = pp_running_loop("state()")))
    return NULL;
  if (!(fn = PyCFunction_New(&open_blocking_def, self))) {
    Py_DECREF(loop);
    return NULL;
  }
  fut = PyObject_CallMethod(loop, "run_in_executor", "OOOOiL", Py_None, fn,
                            subsystem, name, kind, (long long)ms);
  Py_DECREF(fn);
  Py_DECREF(loop);
  return fut;
}

PyObject *pp_published_value(PyObject *self, PyObject *args, PyObject *kw) {
  return published_open(self, args, kw, PROSODY_STATE_VALUE);
}
PyObject *pp_published_map(PyObject *self, PyObject *args, PyObject *kw) {
  return published_open(self, args, kw, PROSODY_STATE_MAP);
}
PyObject *pp_published_deque(PyObject *self, PyObject *args, PyObject *kw) {
  return published_open(self, args, kw, PROSODY_STATE_DEQUE);
}

/* ------------------------------------------------------------------------ */
/* Reads                                                                    */
/* ------------------------------------------------------------------------ */

/* A UTF-8 string without NUL from `v` (a str), for `what`; NULL with a
 * TransientStateError (a caller mistake, as for handler-side state). */
static const char *text_of(PyObject *v, const char *what, Py_ssize_t *len) {
  const char *s;
  if (!PyUnicode_Check(v)) {
    PyErr_Format(ErrTransientState, "%s: expected a str, got %.100s", what,
                 Py_TYPE(v)->tp_name);
    return NULL;
  }
  if (!(s = PyUnicode_AsUTF8AndSize(v, len)))
    return NULL;
  if (strlen(s) != (size_t)*len) {
    PyErr_Format(ErrTransientState, "%s: cannot contain NUL (\\x00)", what);
    return NULL;
  }
  return s;
}

/* Starts `op` for Kafka key `key` with arguments `a`: a future of (items,
 * number). */
static PyObject *start(PublishedObject *h, PyObject *key,
                       prosody_state_op_t kind_op,
                       const prosody_state_args_t *a) {
  ClientObject *c = h->client;
  PyObject *loop, *fut;
  prosody_queue_t *box;
  Py_ssize_t len;
  const char *k;
  pyop_t *op;
  char err[512];
  prosody_err_t rc;
  if (pp_check_fork(c->pid, "ProsodyClient"))
    return NULL;
  if (!c->client) {
    PyErr_SetString(PyExc_RuntimeError, "ProsodyClient is not initialised");
    return NULL;
  }
  if (!(k = text_of(key, "key", &len)))
    return NULL;
  if (!(loop = pp_running_loop("published state")))
    return NULL;
  if (!(box = box_for(c, loop)) || !(op = pp_op_on(box, loop, (int)kind_op))) {
    Py_DECREF(loop);
    return NULL;
  }
  Py_DECREF(loop);
  op->state = 1;
  /* Ours before the call: the callback may push the op at once. */
  fut = Py_NewRef(op->fut);
  rc = prosody_published_async(h->p, k, kind_op, a, pp_state_done_cb, op, err,
                               sizeof(err));
  if (rc) {
    pp_op_free(op);
    Py_DECREF(fut);
    return pp_state_raise(rc, err);
  }
  return fut;
}

/* direction "forward" or "backward" (Direction's values) into *backward. */
static int direction_of(PyObject *v, int *backward) {
  if (PyUnicode_Check(v) && !PyUnicode_CompareWithASCIIString(v, "forward")) {
    *backward = 0;
    return 0;
  }
  if (PyUnicode_Check(v) && !PyUnicode_CompareWithASCIIString(v, "backward")) {
    *backward = 1;
    return 0;
  }
  PyErr_Format(ErrTransientState,
               "direction: expected \"forward\" or \"backward\", got %R", v);
  return -1;
}

/* get(key) (value), get(key, map_key) (map), get(key, index) (deque). */
static PyObject *pub_get(PyObject *self, PyObject *args) {
  PublishedObject *h = (PublishedObject *)self;
  prosody_state_args_t a = PROSODY_STATE_ARGS_INIT;
  PyObject *key, *at = Py_None;
  Py_ssize_t len = 0;
  if (!PyArg_ParseTuple(args, "O|O:get", &key, &at))
    return NULL;
  if (h->kind == PROSODY_STATE_MAP) {
    if (!(a.key = text_of(at, "map_key", &len)))
      return NULL;
    a.key_len = (size_t)len;
  } else if (h->kind == PROSODY_STATE_DEQUE) {
    if (!PyLong_Check(at) || PyBool_Check(at)) {
      PyErr_Format(PyExc_TypeError, "index: expected an int, got %.100s",
                   Py_TYPE(at)->tp_name);
      return NULL;
    }
    a.index = PyLong_AsLongLong(at);
    if (a.index == -1 && PyErr_Occurred())
      return NULL;
  } else if (at != Py_None) {
    PyErr_SetString(PyExc_TypeError, "get: a value reader takes the key only");
    return NULL;
  }
  return start(h, key, PROSODY_STATE_GET, &a);
}

static PyObject *pub_get_many(PyObject *self, PyObject *args) {
  prosody_state_args_t a = PROSODY_STATE_ARGS_INIT;
  PyObject *key, *keys, *fast = NULL, *r = NULL;
  const char **cks = NULL;
  if (!PyArg_ParseTuple(args, "OO:get_many", &key, &keys))
    return NULL;
  if (!pp_state_keys(keys, &fast, &cks, &a.nkeys)) {
    a.keys = cks;
    r = start((PublishedObject *)self, key, PROSODY_STATE_GET_MANY, &a);
  }
  PyMem_Free(cks);
  Py_XDECREF(fast);
  return r;
}

static PyObject *pub_contains_key(PyObject *self, PyObject *args) {
  prosody_state_args_t a = PROSODY_STATE_ARGS_INIT;
  PyObject *key, *map_key;
  Py_ssize_t len;
  if (!PyArg_ParseTuple(args, "OO:contains_key", &key, &map_key))
    return NULL;
  if (!(a.key = text_of(map_key, "map_key", &len)))
    return NULL;
  a.key_len = (size_t)len;
  return start((PublishedObject *)self, key, PROSODY_STATE_CONTAINS, &a);
}

/* scan(key, direction, after=None, limit=0) and keys(...): one page. */
static PyObject *scan_page(PyObject *self, PyObject *args, PyObject *kw,
                           int keys_only) {
  static char *names[] = {"key", "direction", "after", "limit", NULL};
  prosody_state_args_t a = PROSODY_STATE_ARGS_INIT;
  PyObject *key, *direction;
  Py_ssize_t after_len = 0, limit = 0;
  int backward;
  if (!PyArg_ParseTupleAndKeywords(args, kw, "OO|z#n", names, &key, &direction,
                                   &a.after, &after_len, &limit))
    return NULL;
  if (direction_of(direction, &backward))
    return NULL;
  a.after_len = (size_t)after_len;
  a.limit = limit > 0 ? (size_t)limit : 0;
  a.backward = backward;
  a.keys_only = keys_only;
  return start((PublishedObject *)self, key, PROSODY_STATE_SCAN, &a);
}

static PyObject *pub_scan(PyObject *self, PyObject *args, PyObject *kw) {
  return scan_page(self, args, kw, 0);
}
static PyObject *pub_keys(PyObject *self, PyObject *args, PyObject *kw) {
  return scan_page(self, args, kw, 1);
}

/* len(key), is_empty(key) (LEN: the caller compares with 0),
 * peek_front(key), peek_back(key). */
static PyObject *plain(PyObject *self, PyObject *key, prosody_state_op_t op) {
  prosody_state_args_t a = PROSODY_STATE_ARGS_INIT;
  return start((PublishedObject *)self, key, op, &a);
}
static PyObject *pub_len(PyObject *self, PyObject *key) {
  return plain(self, key, PROSODY_STATE_LEN);
}
static PyObject *pub_peek_front(PyObject *self, PyObject *key) {
  return plain(self, key, PROSODY_STATE_PEEK_FRONT);
}
static PyObject *pub_peek_back(PyObject *self, PyObject *key) {
  return plain(self, key, PROSODY_STATE_PEEK_BACK);
}

static PyObject *pub_kind(PyObject *self, void *unused) {
  int kind = ((PublishedObject *)self)->kind;
  return PyUnicode_FromString(kind >= 0 && kind <= 2 ? KIND_NAMES[kind] : "?");
}

static void pub_dealloc(PublishedObject *h) {
  Py_XDECREF(h->client);
  PyObject_Free(h);
}

static PyMethodDef pub_methods[] = {
    {"get", pub_get, METH_VARARGS,
     "get(key[, map_key | index]) -> future of (items, number): GET."},
    {"get_many", pub_get_many, METH_VARARGS,
     "get_many(key, map_keys) -> future of (items, number): GET_MANY."},
    {"contains_key", pub_contains_key, METH_VARARGS,
     "contains_key(key, map_key) -> future of (items, number): CONTAINS."},
    {"scan", (PyCFunction)(void (*)(void))pub_scan,
     METH_VARARGS | METH_KEYWORDS,
     "scan(key, direction, after=None, limit=0) -> future of (items, end): "
     "one page of a SCAN."},
    {"keys", (PyCFunction)(void (*)(void))pub_keys,
     METH_VARARGS | METH_KEYWORDS,
     "keys(key, direction, after=None, limit=0): as scan, keys only."},
    {"len", pub_len, METH_O, "len(key) -> future of (items, number): LEN."},
    {"is_empty", pub_len, METH_O,
     "is_empty(key) -> future of (items, number): LEN (empty when 0)."},
    {"peek_front", pub_peek_front, METH_O,
     "peek_front(key) -> future of (items, number): PEEK_FRONT."},
    {"peek_back", pub_peek_back, METH_O,
     "peek_back(key) -> future of (items, number): PEEK_BACK."},
    {NULL}};

static PyGetSetDef pub_getset[] = {
    {"kind", pub_kind, NULL, "\"value\", \"map\" or \"deque\".", NULL}, {NULL}};

PyTypeObject PublishedType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "prosody.prosody.PublishedHandle",
    .tp_basicsize = sizeof(PublishedObject),
    .tp_dealloc = (destructor)pub_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc =
        "A reader of a published collection (native; use "
        "prosody.published's PublishedValue/PublishedMap/PublishedDeque).",
    .tp_methods = pub_methods,
    .tp_getset = pub_getset,
};
