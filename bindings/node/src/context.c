/*
 * context.c - what index.js's Context and results call: completeMany
 * (prosody_complete for a turn's results), timerOp (prosody_timer_async,
 * its result back through the mailbox), stateOpen and stateOp (keyed
 * state: prosody_state_async, its result back the same way), publishedOp
 * (a published collection's reads: prosody_published_async, the same
 * way), shouldCancel,
 * and the cancellation callback (engine thread) that only pushes to the
 * mailbox.
 */
#include "prosody_node.h"

void pn_op_free(op_t *op) {
  free(op->errstr);
  free(op->times);
  free(op->items);
  free(op);
}

void pn_event_free_maybe(event_t *ev) {
  if (!ev->completed)
    return;
  if (atomic_load(&ev->cancel_fired) && !ev->cancel_drained)
    return; /* its cancellation item is still in the mailbox */
  free(ev);
}

/* Engine thread, context lock held. */
void pn_cancel_cb(prosody_context_t *ctx, void *opaque) {
  event_t *ev = opaque;
  atomic_store(&ev->cancel_fired, 1);
  ev->cancel_item.kind = IT_CANCEL;
  prosody_queue_push(ev->c->mb.q, &ev->cancel_item);
}

/* Completes one event (JS thread). */
static int complete_one(napi_env env, napi_value evv, napi_value rv,
                        napi_value mv) {
  event_t *ev;
  int32_t r;
  char *msg = NULL;
  size_t len;
  napi_valuetype t;
  if (napi_get_value_external(env, evv, (void **)&ev) != napi_ok ||
      napi_get_value_int32(env, rv, &r) != napi_ok)
    return -1;
  if (ev->completed)
    return 0;
  napi_typeof(env, mv, &t);
  /* A description: one with a NUL (a user's error message) is cut there,
   * never refused, so that the result always reaches libprosody. */
  if (t == napi_string && !(msg = pn_string_copy(env, mv, "msg", &len)))
    return -1;
  prosody_complete(ev->ctx, (prosody_result_t)r, msg);
  free(msg);
  ev->completed = 1;
  pn_event_free_maybe(ev);
  return 0;
}

/* completeMany([ev, result, message, ...]): the results of one JavaScript
 * turn in one call, so libprosody's engine wakes once for them. */
napi_value pn_client_complete_many(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1];
  uint32_t n;
  CHECK(env, napi_get_cb_info(env, info, &argc, argv, NULL, NULL));
  CHECK(env, napi_get_array_length(env, argv[0], &n));
  for (uint32_t i = 0; i + 2 < n; i += 3) {
    napi_value e, r, m;
    napi_get_element(env, argv[0], i, &e);
    napi_get_element(env, argv[0], i + 1, &r);
    napi_get_element(env, argv[0], i + 2, &m);
    if (complete_one(env, e, r, m)) {
      pn_throw_last(env);
      return NULL;
    }
  }
  return NULL;
}

static void op_cb(prosody_err_t err, const char *errstr, const int64_t *times,
                  size_t n, void *opaque) {
  op_t *op = opaque;
  op->errstr = err && errstr ? strdup(errstr) : NULL;
  op->err = err;
  if (!err && n && (op->times = malloc(n * sizeof(int64_t)))) {
    memcpy(op->times, times, n * sizeof(int64_t));
    op->n = n;
  }
  prosody_queue_push(op->c->mb.q, &op->item);
}

/* timerOp(ev, op, timeMs) -> Promise */
napi_value pn_client_timer_op(napi_env env, napi_callback_info info) {
  size_t argc = 3;
  napi_value argv[3], promise;
  client_t *c;
  event_t *ev;
  int32_t kind;
  double t = 0;
  op_t *op;
  char err[512];
  prosody_err_t rc;
  if (!(c = pn_unwrap_client(env, info, &argc, argv)))
    return NULL;
  CHECK(env, napi_get_value_external(env, argv[0], (void **)&ev));
  CHECK(env, napi_get_value_int32(env, argv[1], &kind));
  if (argc > 2)
    napi_get_value_double(env, argv[2], &t);
  if (ev->completed)
    return pn_throw_error(
        env, PROSODY_ERR_STATE,
        "the context is stale: its handler has already finished");
  if (!(op = calloc(1, sizeof(*op)))) {
    napi_throw_error(env, NULL, "out of memory");
    return NULL;
  }
  op->item.kind = IT_OP;
  op->op = kind;
  op->c = c;
  napi_create_promise(env, &op->deferred, &promise);
  rc = prosody_timer_async(ev->ctx, (prosody_timer_op_t)kind, (int64_t)t, op_cb,
                           op, err, sizeof(err));
  if (rc) {
    napi_reject_deferred(env, op->deferred, pn_make_error(env, rc, err));
    free(op);
  } else {
    pn_hold(c, 1);
  }
  return promise;
}

/* shouldCancel(ev) -> bool */
napi_value pn_client_should_cancel(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1], r;
  event_t *ev;
  CHECK(env, napi_get_cb_info(env, info, &argc, argv, NULL, NULL));
  CHECK(env, napi_get_value_external(env, argv[0], (void **)&ev));
  napi_get_boolean(env, ev->completed || prosody_should_cancel(ev->ctx), &r);
  return r;
}

/* ------------------------------------------------------------------------ */
/* Keyed state                                                              */
/* ------------------------------------------------------------------------ */

static void state_finalize(napi_env env, void *data, void *hint) {
  prosody_state_free(data);
}

/* stateOpen(ev, name) -> [handle, kind]: the collection `name` for the
 * event's key; the handle (an external) frees itself when collected. */
napi_value pn_client_state_open(napi_env env, napi_callback_info info) {
  size_t argc = 2;
  napi_value argv[2], r, ext, k;
  client_t *c;
  event_t *ev;
  char *name, err[512];
  prosody_state_t *st;
  int kind = 0;
  prosody_err_t rc;
  if (!(c = pn_unwrap_client(env, info, &argc, argv)))
    return NULL;
  CHECK(env, napi_get_value_external(env, argv[0], (void **)&ev));
  if (ev->completed)
    return pn_throw_error(
        env, PROSODY_ERR_STATE,
        "the context is stale: its handler has already finished");
  if (!(name = pn_string_arg(env, argv[1], "state: the collection's name")))
    return NULL;
  rc = prosody_state_open(ev->ctx, name, &st, &kind, err, sizeof(err));
  free(name);
  if (rc)
    return pn_throw_error(env, rc, err);
  if (napi_create_external(env, st, state_finalize, NULL, &ext) != napi_ok) {
    prosody_state_free(st);
    pn_throw_last(env);
    return NULL;
  }
  napi_create_array_with_length(env, 2, &r);
  napi_create_int32(env, kind, &k);
  napi_set_element(env, r, 0, ext);
  napi_set_element(env, r, 1, k);
  return r;
}

/* Bytes to copy `s` (and its NUL), or 0 for NULL. */
static size_t span(const char *s, size_t len) { return s ? len + 1 : 0; }

/* Copies `len` bytes of `s` and a NUL to *p, advancing it; NULL stays
 * NULL. */
static const char *copy_at(char **p, const char *s, size_t len) {
  char *to = *p;
  if (!s)
    return NULL;
  memcpy(to, s, len);
  to[len] = '\0';
  *p += len + 1;
  return to;
}

/* Engine thread (or the calling one, before prosody_state_async returns;
 * for a published collection the client's reader thread, or the calling
 * one when the answer is cached):
 * copies the result, which is valid during the call only (a MESSAGE
 * collection's records too: they are freed with it), and hands it to the
 * JS thread. One allocation: the items, the records (when there are any),
 * then their strings. */
static void state_cb(prosody_err_t err, const char *errstr,
                     const prosody_state_result_t *r, void *opaque) {
  op_t *op = opaque;
  op->err = err;
  op->errstr = err && errstr ? strdup(errstr) : NULL;
  if (!err && r) {
    size_t total = r->n * sizeof(prosody_state_item_t), nmsgs = 0;
    char *p;
    op->number = r->number;
    for (size_t i = 0; i < r->n; i++) {
      const prosody_state_item_t *it = &r->items[i];
      const prosody_message_t *m = it->message;
      total += span(it->key, it->key_len) + span(it->json, it->json_len);
      if (m) {
        const char *key = prosody_message_key(m);
        nmsgs++;
        total +=
            strlen(prosody_message_topic(m)) + 1 +
            span(key, key ? strlen(key) : 0) +
            span(prosody_message_payload(m), prosody_message_payload_len(m));
      }
    }
    if (nmsgs)
      total += r->n * sizeof(state_msg_t);
    if (r->n && !(op->items = malloc(total))) {
      op->err = PROSODY_ERR_NOMEM;
      op->errstr = strdup("out of memory copying a keyed-state result");
    } else if (r->n) {
      p = (char *)(op->items + r->n);
      if (nmsgs) {
        op->msgs = (state_msg_t *)p;
        p = (char *)(op->msgs + r->n);
      }
      for (size_t i = 0; i < r->n; i++) {
        const prosody_state_item_t *from = &r->items[i];
        const prosody_message_t *m = from->message;
        prosody_state_item_t *to = &op->items[i];
        *to = *from;
        to->message = NULL;
        to->key = copy_at(&p, from->key, from->key_len);
        to->json = copy_at(&p, from->json, from->json_len);
        if (nmsgs) {
          state_msg_t *x = &op->msgs[i];
          const char *topic = m ? prosody_message_topic(m) : NULL;
          const char *key = m ? prosody_message_key(m) : NULL;
          memset(x, 0, sizeof(*x));
          if (!m)
            continue;
          x->topic = copy_at(&p, topic, strlen(topic));
          x->key = copy_at(&p, key, key ? strlen(key) : 0);
          x->payload_len = prosody_message_payload_len(m);
          x->payload = copy_at(&p, prosody_message_payload(m), x->payload_len);
          x->partition = prosody_message_partition(m);
          x->offset = prosody_message_offset(m);
          x->timestamp = prosody_message_timestamp(m);
        }
      }
      op->n = r->n;
    }
  }
  prosody_queue_push(op->c->mb.q, &op->item);
}

/* A record of a result as [topic, partition, offset, timestamp, key,
 * payload], what bridge.c gives for a delivered message (JS thread). */
static napi_value state_msg_value(napi_env env, const state_msg_t *x) {
  napi_value v, e;
  napi_create_array_with_length(env, 6, &v);
  napi_create_string_utf8(env, x->topic, NAPI_AUTO_LENGTH, &e);
  napi_set_element(env, v, 0, e);
  napi_create_int32(env, x->partition, &e);
  napi_set_element(env, v, 1, e);
  napi_create_double(env, (double)x->offset, &e);
  napi_set_element(env, v, 2, e);
  napi_create_double(env, (double)x->timestamp, &e);
  napi_set_element(env, v, 3, e);
  if (x->key) {
    napi_create_string_utf8(env, x->key, NAPI_AUTO_LENGTH, &e);
    napi_set_element(env, v, 4, e);
  }
  if (x->payload) {
    napi_create_string_utf8(env, x->payload, x->payload_len, &e);
    napi_set_element(env, v, 5, e);
  }
  return v;
}

napi_value pn_state_result(napi_env env, const op_t *op) {
  napi_value v, x, null;
  napi_get_null(env, &null);
  napi_create_array_with_length(env, 1 + 2 * op->n, &v);
  napi_create_double(env, (double)op->number, &x);
  napi_set_element(env, v, 0, x);
  for (size_t i = 0; i < op->n; i++) {
    const prosody_state_item_t *it = &op->items[i];
    x = null;
    if (it->key)
      napi_create_string_utf8(env, it->key, it->key_len, &x);
    napi_set_element(env, v, (uint32_t)(1 + 2 * i), x);
    x = null;
    if (it->json)
      napi_create_string_utf8(env, it->json, it->json_len, &x);
    else if (op->msgs && op->msgs[i].topic)
      x = state_msg_value(env, &op->msgs[i]);
    napi_set_element(env, v, (uint32_t)(2 + 2 * i), x);
  }
  return v;
}

static int is_nullish(napi_env env, napi_value v) {
  napi_valuetype t;
  napi_typeof(env, v, &t);
  return t == napi_undefined || t == napi_null;
}

/* stateOp(handle, op, key, json, keys, index, after, limit, backward,
 * keysOnly, refTopic, refPartition, refOffset) -> Promise of [number, key,
 * json, ...]. key, json, keys, after and refTopic may be null; refTopic
 * with its partition and offset names the record a MESSAGE collection's
 * write keeps (one this client delivered); index.js has checked the
 * arguments' types. publishedOp(reader, ..., kafkaKey): the same with a
 * published collection's reader (from publishedOpen) and the Kafka key
 * whose collection it reads (prosody_published_async). */
static napi_value state_op(napi_env env, napi_callback_info info,
                           int published) {
  size_t argc = 14, klen = 0, jlen = 0, alen = 0, tlen = 0;
  uint32_t nkeys = 0;
  napi_value argv[14], promise;
  client_t *c;
  void *handle; /* prosody_state_t, or prosody_published_t */
  char *kafka_key = NULL;
  int32_t kind;
  int32_t ref_partition = 0;
  double index = 0, limit = 0, ref_offset = 0;
  bool backward = false, keys_only = false;
  char *key = NULL, *json = NULL, *after = NULL, *ref_topic = NULL;
  char **keys = NULL, err[512];
  prosody_state_args_t a = PROSODY_STATE_ARGS_INIT;
  op_t *op = NULL;
  prosody_err_t rc;
  if (!(c = pn_unwrap_client(env, info, &argc, argv)))
    return NULL;
  if (argc < 13u + published) {
    napi_throw_type_error(env, NULL,
                          published ? "publishedOp: 14 arguments expected"
                                    : "stateOp: 13 arguments expected");
    return NULL;
  }
  CHECK(env, napi_get_value_external(env, argv[0], &handle));
  CHECK(env, napi_get_value_int32(env, argv[1], &kind));
  napi_get_value_double(env, argv[5], &index);
  napi_get_value_double(env, argv[7], &limit);
  napi_get_value_bool(env, argv[8], &backward);
  napi_get_value_bool(env, argv[9], &keys_only);
  napi_get_value_int32(env, argv[11], &ref_partition);
  napi_get_value_double(env, argv[12], &ref_offset);
  if ((!is_nullish(env, argv[2]) &&
       !(key = pn_string_copy(env, argv[2], "key", &klen))) ||
      (!is_nullish(env, argv[3]) &&
       !(json = pn_string_copy(env, argv[3], "value", &jlen))) ||
      (!is_nullish(env, argv[6]) &&
       !(after = pn_string_copy(env, argv[6], "after", &alen))) ||
      (!is_nullish(env, argv[10]) &&
       !(ref_topic = pn_string_copy(env, argv[10], "topic", &tlen))) ||
      (published &&
       !(kafka_key = pn_string_arg(env, argv[13], "the Kafka key"))))
    goto fail;
  if (!is_nullish(env, argv[4])) {
    if (napi_get_array_length(env, argv[4], &nkeys) != napi_ok) {
      pn_throw_last(env);
      goto fail;
    }
    if (nkeys && !(keys = calloc(nkeys, sizeof(char *)))) {
      napi_throw_error(env, NULL, "out of memory");
      goto fail;
    }
    for (uint32_t i = 0; i < nkeys; i++) {
      napi_value k;
      napi_get_element(env, argv[4], i, &k);
      if (!(keys[i] = pn_string_arg(env, k, "getMany: a key")))
        goto fail;
    }
  }
  if (!(op = calloc(1, sizeof(*op)))) {
    napi_throw_error(env, NULL, "out of memory");
    goto fail;
  }
  a.key = key;
  a.key_len = klen;
  a.keys = (const char *const *)keys;
  a.nkeys = nkeys;
  a.json = json;
  a.json_len = jlen;
  a.index = (int64_t)index;
  a.after = after;
  a.after_len = alen;
  a.limit = limit > 0 ? (size_t)limit : 0;
  a.backward = backward;
  a.keys_only = keys_only;
  a.ref_topic = ref_topic;
  a.ref_partition = ref_partition;
  a.ref_offset = (int64_t)ref_offset;
  op->item.kind = IT_STATE;
  op->op = kind;
  op->c = c;
  napi_create_promise(env, &op->deferred, &promise);
  /* The arguments are copied by the call; the callback may run before it
   * returns (then its item waits in the mailbox like any other). */
  rc = published ? prosody_published_async(handle, kafka_key,
                                           (prosody_state_op_t)kind, &a,
                                           state_cb, op, err, sizeof(err))
                 : prosody_state_async(handle, (prosody_state_op_t)kind, &a,
                                       state_cb, op, err, sizeof(err));
  if (rc) {
    napi_reject_deferred(env, op->deferred, pn_make_error(env, rc, err));
    free(op);
  } else {
    pn_hold(c, 1);
  }
  op = NULL;
  goto done;
fail:
  promise = NULL;
done:
  free(op);
  free(kafka_key);
  free(key);
  free(json);
  free(after);
  free(ref_topic);
  for (uint32_t i = 0; keys && i < nkeys; i++)
    free(keys[i]);
  free(keys);
  return promise;
}

napi_value pn_client_state_op(napi_env env, napi_callback_info info) {
  return state_op(env, info, 0);
}

napi_value pn_client_published_op(napi_env env, napi_callback_info info) {
  return state_op(env, info, 1);
}
