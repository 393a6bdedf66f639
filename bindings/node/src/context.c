/*
 * context.c - what index.js's Context and results call: completeMany
 * (prosody_complete for a turn's results), timerOp (prosody_timer_async,
 * its result back through the mailbox), shouldCancel, and the
 * cancellation callback (engine thread) that only pushes to the mailbox.
 */
#include "prosody_node.h"

void pn_op_free(op_t *op) {
  free(op->errstr);
  free(op->times);
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
