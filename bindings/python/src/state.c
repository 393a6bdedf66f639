/*
 * state.c - keyed state (include/prosody.h, "Keyed state"): the native
 * half of prosody.state. Context.state(definition) calls prosody.state's
 * _bind, which opens the collection here (Context._state_open ->
 * prosody_state_open) and wraps the native handle (StateHandle) in a
 * ValueState, MapState or DequeState (in a MESSAGE collection their items
 * are Messages, pp_message_new's). A handle's call() starts
 * prosody_state_async and returns a future; the result comes back as a
 * timer call's does (context.c): the callback, on the engine thread, copies
 * the result into the op and pushes it to the mailbox (never touching a
 * Python object), and the loop thread settles the future when it drains.
 * Also state_collections: definitions to prosody_config_add_state.
 *
 * Threads: everything here runs on the loop thread with the GIL, except
 * pp_state_done_cb (engine thread, or the calling thread before
 * prosody_state_async returns; no GIL).
 */
#include "prosody_py.h"

#include <string.h>

/* A native handle: one prosody_state_t, owned, and its Context. Loop
 * thread only. */
typedef struct {
  PyObject_HEAD
  prosody_state_t *st;
  ContextObject *cx; /* strong reference: its client, loop and mailbox */
} StateObject;

/* ------------------------------------------------------------------------ */
/* Errors                                                                   */
/* ------------------------------------------------------------------------ */

/* PROSODY_ERR_PERMANENT (an unregistered name) is permanent; every other
 * failure (a stale handle, a caller mistake, the store) is transient. */
PyObject *pp_state_error_object(prosody_err_t err, const char *msg) {
  if (!msg || !*msg)
    msg = prosody_err_message(err);
  if (err == PROSODY_ERR_NOMEM)
    return PyObject_CallFunction(PyExc_MemoryError, "s", msg);
  return PyObject_CallFunction(err == PROSODY_ERR_PERMANENT ? ErrPermanentState
                                                            : ErrTransientState,
                               "s", msg);
}

PyObject *pp_state_raise(prosody_err_t err, const char *msg) {
  PyObject *exc = pp_state_error_object(err, msg);
  if (exc) {
    PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
    Py_DECREF(exc);
  }
  return NULL;
}

/* A context whose invocation is over refuses here, before libprosody
 * would: the attempt's handles must not outlive it. */
static int context_usable(ContextObject *cx) {
  if (pp_check_fork(cx->client->pid, "Context"))
    return -1;
  if (cx->finished) {
    pp_state_raise(PROSODY_ERR_STATE,
                   "keyed state: the handler invocation of this handle has "
                   "ended; a handle is valid only during the invocation that "
                   "opened it");
    return -1;
  }
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Context.state and Context._state_open                                    */
/* ------------------------------------------------------------------------ */

PyObject *pp_context_state(PyObject *self, PyObject *definition) {
  return PyObject_CallFunctionObjArgs(FnStateBind, self, definition, NULL);
}

/* _state_open(name) -> (handle, kind, payload): payload is the
 * registration's (the client's message_states), which prosody_state_open
 * does not say. */
PyObject *pp_context_state_open(PyObject *self, PyObject *name) {
  ContextObject *cx = (ContextObject *)self;
  StateObject *h;
  const char *s;
  char err[512];
  int kind = 0;
  prosody_err_t rc;
  if (context_usable(cx))
    return NULL;
  if (!(s = PyUnicode_AsUTF8(name)))
    return NULL;
  if (!(h = PyObject_New(StateObject, &StateType)))
    return NULL;
  h->st = NULL;
  h->cx = (ContextObject *)Py_NewRef(self);
  if ((rc = prosody_state_open(cx->ctx, s, &h->st, &kind, err, sizeof(err)))) {
    Py_DECREF(h);
    return pp_state_raise(rc, err);
  }
  return Py_BuildValue("(Nii)", (PyObject *)h, kind,
                       PySet_Contains(cx->client->message_states, name) > 0
                           ? PROSODY_STATE_MESSAGE
                           : PROSODY_STATE_JSON);
}

/* ------------------------------------------------------------------------ */
/* Calls                                                                    */
/* ------------------------------------------------------------------------ */

/* Bytes to copy `s` (`len` of them) and a NUL; 0 for NULL. */
static size_t span(const char *s, size_t len) { return s ? len + 1 : 0; }

/* Copies `len` bytes of `s` and a NUL to *p, advancing it; NULL stays
 * NULL. */
static const char *copy_at(char **p, const char *s, size_t len) {
  char *to = *p;
  if (!s)
    return NULL;
  memcpy(to, s, len);
  to[len] = 0;
  *p += len + 1;
  return to;
}

/* Bytes a record's copy takes: its topic, key and payload with NULs. */
static size_t record_size(const prosody_message_t *m) {
  const char *key = prosody_message_key(m);
  return strlen(prosody_message_topic(m)) + 1 +
         span(key, key ? strlen(key) : 0) +
         span(prosody_message_payload(m), prosody_message_payload_len(m));
}

/* Copies record `m` (NULL: none, topic NULL) into *x, its strings at *p. */
static void record_copy(pp_state_msg_t *x, const prosody_message_t *m,
                        char **p) {
  const char *key;
  memset(x, 0, sizeof(*x));
  if (!m)
    return;
  key = prosody_message_key(m);
  x->topic =
      copy_at(p, prosody_message_topic(m), strlen(prosody_message_topic(m)));
  x->key = copy_at(p, key, key ? strlen(key) : 0);
  x->payload_len = prosody_message_payload_len(m);
  x->payload = copy_at(p, prosody_message_payload(m), x->payload_len);
  x->partition = prosody_message_partition(m);
  x->offset = prosody_message_offset(m);
  x->timestamp = prosody_message_timestamp(m);
}

/* Engine thread, the client's reader thread (published state), or the
 * caller's before prosody_state_async / prosody_published_async returns: the
 * result is valid during this call only (a MESSAGE collection's records
 * too: they are freed with it), so it is copied into one block: the items,
 * the records (when there are any), then their strings. No Python object
 * is touched here. */
void pp_state_done_cb(prosody_err_t err, const char *errstr,
                      const prosody_state_result_t *r, void *opaque) {
  pyop_t *op = opaque;
  size_t size, nmsgs = 0, n = !err && r ? r->n : 0;
  char *p;
  if (!err && r)
    op->number = r->number;
  if (n) {
    size = n * sizeof(prosody_state_item_t);
    for (size_t i = 0; i < n; i++) {
      const prosody_state_item_t *it = &r->items[i];
      size += span(it->key, it->key_len) + span(it->json, it->json_len);
      if (it->message) {
        nmsgs++;
        size += record_size(it->message);
      }
    }
    if (nmsgs)
      size += n * sizeof(pp_state_msg_t);
    if (!(op->items = malloc(size))) {
      pp_op_post(op, PROSODY_ERR_NOMEM,
                 "keyed state: out of memory copying a result");
      return;
    }
    p = (char *)(op->items + n);
    if (nmsgs) {
      op->msgs = (pp_state_msg_t *)p;
      p = (char *)(op->msgs + n);
    }
    for (size_t i = 0; i < n; i++) {
      const prosody_state_item_t *from = &r->items[i];
      prosody_state_item_t *to = &op->items[i];
      *to = *from;
      to->message = NULL; /* freed with the result: copied into msgs */
      to->key = copy_at(&p, from->key, from->key_len);
      to->json = copy_at(&p, from->json, from->json_len);
      if (nmsgs)
        record_copy(&op->msgs[i], from->message, &p);
    }
    op->n = n;
  }
  pp_op_post(op, err, errstr);
}

static PyObject *text_or_none(const char *s, size_t n) {
  return s ? PyUnicode_DecodeUTF8(s, (Py_ssize_t)n, "surrogateescape")
           : Py_NewRef(Py_None);
}

/* An item's document: its JSON text, or in a MESSAGE collection its
 * record as a delivered Message (the payload parsed as on_message's is),
 * or None. */
static PyObject *item_doc(const pyop_t *op, size_t i) {
  const prosody_state_item_t *it = &op->items[i];
  const pp_state_msg_t *x = op->msgs ? &op->msgs[i] : NULL;
  if (!x || !x->topic)
    return text_or_none(it->json, it->json_len);
  return pp_message_new(
      x->topic, x->partition, x->offset, x->timestamp, x->key,
      x->payload ? PyObject_CallFunction(FnJsonLoads, "s#", x->payload,
                                         (Py_ssize_t)x->payload_len)
                 : Py_NewRef(Py_None));
}

PyObject *pp_state_result(const pyop_t *op) {
  PyObject *items = PyList_New((Py_ssize_t)op->n);
  for (size_t i = 0; items && i < op->n; i++) {
    const prosody_state_item_t *it = &op->items[i];
    PyObject *k = text_or_none(it->key, it->key_len);
    PyObject *j = k ? item_doc(op, i) : NULL;
    PyObject *t = j ? PyTuple_Pack(2, k, j) : NULL;
    Py_XDECREF(k);
    Py_XDECREF(j);
    if (!t) {
      Py_CLEAR(items);
      break;
    }
    PyList_SET_ITEM(items, (Py_ssize_t)i, t);
  }
  return items ? Py_BuildValue("(NL)", items, (long long)op->number) : NULL;
}

int pp_state_keys(PyObject *seq, PyObject **fast, const char ***cks,
                  size_t *n) {
  Py_ssize_t len;
  if (!(*fast = PySequence_Fast(seq, "keys: expected a sequence of str")))
    return -1;
  len = PySequence_Fast_GET_SIZE(*fast);
  if (!(*cks = PyMem_Calloc(len ? (size_t)len : 1, sizeof(char *)))) {
    PyErr_NoMemory();
    return -1;
  }
  for (Py_ssize_t i = 0; i < len; i++)
    if (!((*cks)[i] = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(*fast, i))))
      return -1;
  *n = (size_t)len;
  return 0;
}

/* handle.call(op, key=None, json=None, keys=None, index=0, after=None,
 * limit=0, backward=False, keys_only=False, ref_topic=None,
 * ref_partition=0, ref_offset=0) -> future of (items, number). The
 * arguments are prosody_state_args_t's; ref_* name the record a MESSAGE
 * collection's write keeps (prosody.state passes only a delivered
 * Message's). */
static PyObject *state_call(PyObject *self, PyObject *args, PyObject *kw) {
  static char *names[] = {"op",        "key",           "json",
                          "keys",      "index",         "after",
                          "limit",     "backward",      "keys_only",
                          "ref_topic", "ref_partition", "ref_offset",
                          NULL};
  StateObject *h = (StateObject *)self;
  prosody_state_args_t a = PROSODY_STATE_ARGS_INIT;
  Py_ssize_t key_len = 0, json_len = 0, after_len = 0;
  PyObject *keys = Py_None, *fast = NULL;
  const char **cks = NULL;
  long long index = 0;
  Py_ssize_t limit = 0;
  int op_kind, backward = 0, keys_only = 0, ref_partition = 0;
  long long ref_offset = 0;
  pyop_t *op = NULL;
  char err[512];
  prosody_err_t rc;
  if (!PyArg_ParseTupleAndKeywords(
          args, kw, "i|z#z#OLz#nppziL", names, &op_kind, &a.key, &key_len,
          &a.json, &json_len, &keys, &index, &a.after, &after_len, &limit,
          &backward, &keys_only, &a.ref_topic, &ref_partition, &ref_offset))
    return NULL;
  a.ref_partition = ref_partition;
  a.ref_offset = ref_offset;
  if (context_usable(h->cx))
    return NULL;
  a.key_len = (size_t)key_len;
  a.json_len = (size_t)json_len;
  a.after_len = (size_t)after_len;
  a.index = index;
  a.limit = limit > 0 ? (size_t)limit : 0;
  a.backward = backward;
  a.keys_only = keys_only;
  if (keys != Py_None) {
    size_t n;
    if (pp_state_keys(keys, &fast, &cks, &n))
      goto out;
    a.keys = cks;
    a.nkeys = n;
  }
  if (!h->cx->client->bridge || !h->cx->client->loop) {
    pp_state_raise(PROSODY_ERR_STATE, "keyed state: the client is not "
                                      "subscribed (the handle's attempt is "
                                      "over)");
    goto out;
  }
  if (!(op = pp_op_new(h->cx->client, op_kind)))
    goto out;
  op->state = 1;
  rc = prosody_state_async(h->st, (prosody_state_op_t)op_kind, &a,
                           pp_state_done_cb, op, err, sizeof(err));
  if (rc) {
    pp_op_free(op);
    op = NULL;
    pp_state_raise(rc, err);
    goto out;
  }
out:
  PyMem_Free(cks);
  Py_XDECREF(fast);
  return op ? Py_NewRef(op->fut) : NULL;
}

static void state_dealloc(StateObject *h) {
  prosody_state_free(h->st);
  Py_XDECREF(h->cx);
  PyObject_Free(h);
}

static PyMethodDef state_methods[] = {
    {"call", (PyCFunction)(void (*)(void))state_call,
     METH_VARARGS | METH_KEYWORDS,
     "call(op, key=None, json=None, keys=None, index=0, after=None, limit=0, "
     "backward=False, keys_only=False, ref_topic=None, ref_partition=0, "
     "ref_offset=0) -> future of (items, number): one prosody_state_async "
     "call (prosody.state wraps it)."},
    {NULL}};

PyTypeObject StateType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "prosody.prosody.StateHandle",
    .tp_basicsize = sizeof(StateObject),
    .tp_dealloc = (destructor)state_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A keyed-state collection opened for one handler invocation "
              "(native; use prosody.state's ValueState/MapState/DequeState).",
    .tp_methods = state_methods,
};

/* ------------------------------------------------------------------------ */
/* state_collections                                                        */
/* ------------------------------------------------------------------------ */

int pp_state_add_collections(prosody_config_t *conf, PyObject *seq) {
  PyObject *defs = PyObject_CallFunctionObjArgs(FnStateConfigs, seq, NULL);
  char err[512];
  if (!defs)
    return -1;
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(defs); i++) {
    prosody_state_def_t d = PROSODY_STATE_DEF_INIT;
    long long ttl, keyset, capacity;
    prosody_err_t rc;
    if (!PyArg_ParseTuple(PyList_GET_ITEM(defs, i), "siiLiiLL", &d.name,
                          &d.kind, &d.payload, &ttl, &d.read_uncommitted,
                          &d.published, &keyset, &capacity))
      goto fail;
    d.ttl_s = ttl;
    d.keyset_limit = keyset;
    d.capacity = capacity;
    if ((rc = prosody_config_add_state(conf, &d, err, sizeof(err)))) {
      if (rc == PROSODY_ERR_NOMEM)
        PyErr_NoMemory();
      else
        PyErr_Format(PyExc_ValueError, "state_collections[%zd].%s", i, err);
      goto fail;
    }
  }
  Py_DECREF(defs);
  return 0;
fail:
  Py_DECREF(defs);
  return -1;
}
