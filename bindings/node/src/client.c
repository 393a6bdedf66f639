/*
 * client.c - NativeClient over prosody_client_t: its lifetime (freed by
 * the later of its JS object's and its threadsafe function's finalizers),
 * send, subscribe, unsubscribe and publishedOpen (blocking calls as
 * napi_async_work on libuv's pool), and the consumer's state. JS thread,
 * except the work's execute step and the send callback.
 */
#include "prosody_node.h"

static void client_free(client_t *c) {
  prosody_config_destroy(c->pending_conf); /* never opened */
  c->pending_conf = NULL;
  if (c->client && !c->destroyed) {
    prosody_client_destroy(c->client);
    c->destroyed = 1;
  }
}

/* The client's environment cleanup hook: the environment then closes every
 * threadsafe function itself, and releasing one would abort. Per client,
 * not per process: a worker thread's teardown must not stop the main
 * thread's clients from releasing theirs. */
static void mark_closing(void *arg) { ((client_t *)arg)->env_closing = 1; }

/* Frees c once both its JS object and its threadsafe function are gone. */
static void client_release(napi_env env, client_t *c) {
  if (!c->wrap_gone || !c->tsfn_gone)
    return;
  if (c->logger)
    napi_delete_reference(env, c->logger);
  prosody_queue_destroy(c->mb.q);
  pthread_mutex_destroy(&c->mb.wake_lock);
  free(c);
}

static void tsfn_finalize(napi_env env, void *data, void *hint) {
  client_t *c = data;
  /* From here no thread calls it (the environment's teardown finalizes it
   * while the client's threads may still log). */
  pthread_mutex_lock(&c->mb.wake_lock);
  c->mb.gone = 1;
  pthread_mutex_unlock(&c->mb.wake_lock);
  c->tsfn_gone = 1;
  client_release(env, c);
}

static void client_finalize(napi_env env, void *data, void *hint) {
  client_t *c = data;
  atomic_store(&c->mb.closed, 1);
  client_free(c);
  pn_mailbox_close(c);
  if (c->dispatch)
    napi_delete_reference(env, c->dispatch);
  c->dispatch = NULL;
  if (c->self)
    napi_delete_reference(env, c->self);
  c->self = NULL;
  if (!c->env_closing)
    napi_remove_env_cleanup_hook(env, mark_closing, c);
  c->wrap_gone = 1;
  if (c->tsfn_gone)
    client_release(env, c);
  else if (!c->env_closing) /* its queued calls are still made */
    napi_release_threadsafe_function(c->mb.tsfn, napi_tsfn_release);
}

client_t *pn_unwrap_client(napi_env env, napi_callback_info info, size_t *argc,
                           napi_value *argv) {
  napi_value self;
  client_t *c = NULL;
  if (napi_get_cb_info(env, info, argc, argv, &self, NULL) != napi_ok ||
      napi_unwrap(env, self, (void **)&c) != napi_ok || !c) {
    napi_throw_error(env, NULL, "not a ProsodyClient");
    return NULL;
  }
  if (c->destroyed) {
    napi_throw_error(env, NULL, "the client has been closed");
    return NULL;
  }
  if (!c->client) {
    napi_throw_error(env, NULL, "the client is not open yet");
    return NULL;
  }
  return c;
}

/* NativeClient(options, logger?, deferred?, states?): `logger`, a function, is
 * given each batch of the client's log lines ([level, subsystem, message, ...]
 * and how many were dropped); without it libprosody writes them to stderr.
 * With `deferred` true the client itself is made by open(), off the JS
 * thread (ProsodyClient.create()); until then no other method works.
 * `states` registers keyed-state collections (pn_config_add_states). */
static napi_value client_new(napi_env env, napi_callback_info info) {
  size_t argc = 4;
  napi_value argv[4], self, name;
  napi_valuetype t = napi_undefined;
  bool deferred = false;
  client_t *c;
  prosody_config_t *conf;
  char err[1024];
  CHECK(env, napi_get_cb_info(env, info, &argc, argv, &self, NULL));
  if (argc < 1) {
    napi_throw_type_error(env, NULL, "options object required");
    return NULL;
  }
  if (argc > 2)
    napi_get_value_bool(env, argv[2], &deferred);
  if (!(conf = pn_config_from(env, argv[0])))
    return NULL;
  if (argc > 3 && napi_typeof(env, argv[3], &t) == napi_ok &&
      t == napi_object && pn_config_add_states(env, conf, argv[3])) {
    prosody_config_destroy(conf);
    return NULL;
  }
  t = napi_undefined;
  if (argc > 1)
    napi_typeof(env, argv[1], &t);
  if (!(c = calloc(1, sizeof(*c)))) {
    prosody_config_destroy(conf);
    napi_throw_error(env, NULL, "out of memory");
    return NULL;
  }
  /* Resolved by the option table (set value, environment, default) before
   * the client takes the configuration. */
  for (int i = 0; i < 2; i++) {
    char val[32];
    if (!prosody_config_get(conf, i ? "timer_spans" : "message_spans", val,
                            sizeof(val), NULL, NULL, 0))
      c->follows_from[i] = !strcmp(val, "follows_from");
  }
  c->env = env;
  atomic_init(&c->mb.closed, 0);
  pthread_mutex_init(&c->mb.wake_lock, NULL);
  /* The mailbox first: the client logs while it is being created. */
  if (!(c->mb.q = prosody_queue_new(LOG_QUEUE_LINES, err, sizeof(err)))) {
    prosody_config_destroy(conf);
    free(c);
    napi_throw_error(env, NULL, err);
    return NULL;
  }
  napi_create_string_utf8(env, "prosody", NAPI_AUTO_LENGTH, &name);
  if (napi_create_threadsafe_function(env, NULL, NULL, name, 0, 1, c,
                                      tsfn_finalize, c, pn_call_js,
                                      &c->mb.tsfn) != napi_ok) {
    prosody_config_destroy(conf);
    prosody_queue_destroy(c->mb.q);
    free(c);
    pn_throw_last(env);
    return NULL;
  }
  prosody_queue_set_wake_cb(c->mb.q, pn_mailbox_wake, &c->mb);
  /* Nothing pending yet: the client alone never keeps the process up. */
  napi_unref_threadsafe_function(env, c->mb.tsfn);
  if (t == napi_function &&
      napi_create_reference(env, argv[1], 1, &c->logger) == napi_ok)
    prosody_config_set_log_cb(conf, pn_log_cb, c);
  if (deferred)
    c->pending_conf = conf;
  else if (!(c->client = prosody_client_new(conf, err, sizeof(err)))) {
    prosody_config_destroy(conf);
    pn_call_js(env, NULL, c, NULL); /* the lines of the failed creation */
    c->wrap_gone = 1;               /* tsfn_finalize frees c */
    napi_release_threadsafe_function(c->mb.tsfn, napi_tsfn_release);
    return pn_throw_error(env, PROSODY_ERR_CONFIG, err);
  }
  napi_add_env_cleanup_hook(env, mark_closing, c);
  if (napi_wrap(env, self, c, client_finalize, NULL, NULL) != napi_ok) {
    client_finalize(env, c, NULL);
    pn_throw_last(env);
    return NULL;
  }
  napi_create_reference(env, self, 0, &c->self);
  pn_call_js(env, NULL, c, NULL); /* the creation's lines, before it returns */
  return self;
}

/* The client's work of `kind` (work_t) on libuv's pool: its promise. */
static napi_value queue_kind(napi_env env, client_t *c, int kind,
                             napi_value self) {
  work_t *w = calloc(1, sizeof(*w));
  if (!w) {
    napi_throw_error(env, NULL, "out of memory");
    return NULL;
  }
  w->c = c;
  w->kind = kind;
  return pn_queue_work(env, w, self);
}

/* open() -> Promise: makes a deferred client (see client_new) on libuv's
 * pool. */
static napi_value client_open(napi_env env, napi_callback_info info) {
  size_t argc = 0;
  napi_value self;
  client_t *c = NULL;
  CHECK(env, napi_get_cb_info(env, info, &argc, NULL, &self, NULL));
  if (napi_unwrap(env, self, (void **)&c) != napi_ok || !c ||
      !c->pending_conf) {
    napi_throw_error(env, NULL, "open(): not a client waiting to be opened");
    return NULL;
  }
  return queue_kind(env, c, 4, self);
}

/* shutdown() -> Promise: prosody_client_shutdown() on libuv's pool. */
static napi_value client_shutdown(napi_env env, napi_callback_info info) {
  size_t argc = 0;
  napi_value self;
  client_t *c;
  CHECK(env, napi_get_cb_info(env, info, &argc, NULL, &self, NULL));
  if (!(c = pn_unwrap_client(env, info, &argc, NULL)))
    return NULL;
  return queue_kind(env, c, 5, self);
}

/* publishedOpen(subsystem, name, kind, readCacheMs) -> Promise of a
 * reader (an external) for publishedOp: prosody_published_open() on
 * libuv's pool (outside mock mode the client's first reader connects to
 * Cassandra). index.js has checked the types. */
static napi_value client_published_open(napi_env env, napi_callback_info info) {
  size_t argc = 4;
  napi_value argv[4], self;
  client_t *c;
  work_t *w;
  int32_t kind = 0;
  double cache_ms = -1;
  CHECK(env, napi_get_cb_info(env, info, &argc, argv, &self, NULL));
  if (!(c = pn_unwrap_client(env, info, &argc, argv)))
    return NULL;
  if (argc < 4) {
    napi_throw_type_error(env, NULL,
                          "publishedOpen(subsystem, name, kind, readCacheMs)");
    return NULL;
  }
  CHECK(env, napi_get_value_int32(env, argv[2], &kind));
  CHECK(env, napi_get_value_double(env, argv[3], &cache_ms));
  if (!(w = calloc(1, sizeof(*w)))) {
    napi_throw_error(env, NULL, "out of memory");
    return NULL;
  }
  if (!(w->policy = pn_string_arg(env, argv[0], "state: the subsystem")) ||
      !(w->name =
            pn_string_arg(env, argv[1], "state: the collection's name"))) {
    free(w->policy);
    free(w);
    return NULL;
  }
  w->c = c;
  w->kind = 6;
  w->state_kind = kind;
  w->read_cache_ms = (int64_t)cache_ms;
  return pn_queue_work(env, w, self);
}

/* Send: results come back through the mailbox. */
static void send_cb(prosody_err_t err, const char *errstr,
                    const prosody_delivery_t *d, void *opaque) {
  op_t *op = opaque;
  op->err = err;
  op->errstr = err && errstr ? strdup(errstr) : NULL;
  prosody_queue_push(op->c->mb.q, &op->item);
}

/* send(topic, key, json, traceparent?, tracestate?, baggage?) -> Promise;
 * a null `json` sends an excise record (the key without a value). */
static napi_value client_send(napi_env env, napi_callback_info info) {
  size_t argc = 6;
  napi_value argv[6], promise;
  client_t *c = pn_unwrap_client(env, info, &argc, argv);
  char *s[6] = {0}, err[1024];
  prosody_trace_t trace = {0};
  op_t *op;
  prosody_err_t rc;
  if (!c)
    return NULL;
  if (argc < 3) {
    napi_throw_type_error(env, NULL, "send(topic, key, json)");
    return NULL;
  }
  for (size_t i = 0; i < argc && i < 6; i++) {
    napi_valuetype t;
    napi_typeof(env, argv[i], &t);
    if ((i >= 3 || i == 2) && (t == napi_undefined || t == napi_null))
      continue;
    if (!(s[i] = pn_string_arg(env, argv[i],
                               i == 0   ? "topic"
                               : i == 1 ? "key"
                               : i == 2 ? "payload"
                                        : "trace header")))
      goto fail;
  }
  trace.traceparent = s[3];
  trace.tracestate = s[4];
  trace.baggage = s[5];
  if (!(op = calloc(1, sizeof(*op)))) {
    napi_throw_error(env, NULL, "out of memory");
    goto fail;
  }
  op->item.kind = IT_SEND;
  op->c = c;
  napi_create_promise(env, &op->deferred, &promise);
  rc = s[2] ? prosody_send_async(c->client, s[0], s[1], s[2],
                                 s[3] || s[4] || s[5] ? &trace : NULL, send_cb,
                                 op, err, sizeof(err))
            : prosody_excise_async(c->client, s[0], s[1],
                                   s[3] || s[4] || s[5] ? &trace : NULL,
                                   send_cb, op, err, sizeof(err));
  if (rc) {
    napi_reject_deferred(env, op->deferred, pn_make_error(env, rc, err));
    free(op);
  } else {
    pn_hold(c, 1);
  }
  for (int i = 0; i < 6; i++)
    free(s[i]);
  return promise;
fail:
  for (int i = 0; i < 6; i++)
    free(s[i]);
  return NULL;
}

static void work_execute(napi_env env, void *data) {
  work_t *w = data;
  switch (w->kind) {
  case 0: {
    prosody_handler_t h = {w->c->has_message ? pn_c_on_message
                                             : pn_c_skip_message,
                           w->c->has_timer ? pn_c_on_timer : NULL, w->c,
                           PROSODY_HANDLER_ASYNC |
                               (w->c->has_excise ? PROSODY_HANDLER_EXCISE : 0)};
    w->err = prosody_subscribe(w->c->client, &h, w->errstr, sizeof(w->errstr));
    break;
  }
  case 1:
    w->err = prosody_unsubscribe(w->c->client);
    if (w->err == PROSODY_ERR_STATE) /* was not subscribed: nothing to do */
      w->err = PROSODY_OK;
    break;
  case 4:
    if (!(w->c->client = prosody_client_new(w->c->pending_conf, w->errstr,
                                            sizeof(w->errstr))))
      w->err = PROSODY_ERR_CONFIG;
    else
      w->c->pending_conf = NULL; /* the client's now */
    break;
  case 5:
    w->err = prosody_client_shutdown(w->c->client);
    break;
  case 6:
    w->err = prosody_published_open(w->c->client, w->policy, w->name,
                                    w->state_kind, w->read_cache_ms, &w->pub,
                                    w->errstr, sizeof(w->errstr));
    break;
  case 2:
    w->topts.cleanup_policy = w->policy;
    w->err = prosody_admin_create_topic(w->admin, w->name, &w->topts, w->errstr,
                                        sizeof(w->errstr));
    break;
  default:
    w->err = prosody_admin_delete_topic(w->admin, w->name, w->errstr,
                                        sizeof(w->errstr));
  }
}

static void work_complete(napi_env env, napi_status status, void *data) {
  work_t *w = data;
  if (w->kind == 4) {
    if (w->c->pending_conf) { /* failed: the configuration is still ours */
      prosody_config_destroy(w->c->pending_conf);
      w->c->pending_conf = NULL;
    }
    pn_call_js(env, NULL, w->c, NULL); /* the creation's lines */
  }
  if (w->c && (w->kind == 0 || w->kind == 1)) {
    if (w->kind == 1 || w->err) {
      /* The subscription no longer keeps the loop up; once only, though
       * two unsubscribe() calls may both have been queued. */
      if (w->c->subscribed)
        pn_hold(w->c, -1);
      w->c->subscribed = 0;
      /* The dispatcher closes over the JS client: keeping it would keep
       * the client (and this struct) alive for ever. */
      if (w->c->dispatch) {
        napi_delete_reference(env, w->c->dispatch);
        w->c->dispatch = NULL;
      }
      /* What the stop logged reaches the logger before the promise
       * settles (the process may end right after it). */
      pn_call_js(env, NULL, w->c, NULL);
    }
  }
  if (w->err) {
    napi_reject_deferred(env, w->deferred,
                         pn_make_error(env, w->err, w->errstr));
  } else {
    napi_value u;
    /* A published reader: freed with the client, which the JS reader
     * objects keep alive (they hold the ProsodyClient). */
    if (w->kind != 6 ||
        napi_create_external(env, w->pub, NULL, NULL, &u) != napi_ok)
      napi_get_undefined(env, &u);
    napi_resolve_deferred(env, w->deferred, u);
  }
  napi_delete_async_work(env, w->work);
  napi_delete_reference(env, w->keep);
  free(w->name);
  free(w->policy);
  free(w);
}

napi_value pn_queue_work(napi_env env, work_t *w, napi_value self) {
  napi_value promise, name;
  napi_create_promise(env, &w->deferred, &promise);
  napi_create_reference(env, self, 1, &w->keep);
  napi_create_string_utf8(env, "prosody", NAPI_AUTO_LENGTH, &name);
  napi_create_async_work(env, NULL, name, work_execute, work_complete, w,
                         &w->work);
  napi_queue_async_work(env, w->work);
  return promise;
}

/* subscribe(dispatch, hasTimer, hasMessage, hasExcise) -> Promise */
static napi_value client_subscribe(napi_env env, napi_callback_info info) {
  size_t argc = 4;
  napi_value argv[4], self;
  client_t *c;
  work_t *w;
  bool has_timer = false, has_message = true, has_excise = false;
  CHECK(env, napi_get_cb_info(env, info, &argc, argv, &self, NULL));
  if (!(c = pn_unwrap_client(env, info, &argc, argv)))
    return NULL;
  if (c->subscribed) {
    napi_throw_error(env, NULL, "already subscribed: call unsubscribe() first");
    return NULL;
  }
  if (!strcmp(prosody_consumer_state(c->client), "unconfigured")) {
    napi_throw_error(env, NULL,
                     "subscribe() needs the groupId and subscribedTopics "
                     "options (or PROSODY_GROUP_ID and "
                     "PROSODY_SUBSCRIBED_TOPICS)");
    return NULL;
  }
  napi_get_value_bool(env, argv[1], &has_timer);
  if (argc > 2)
    napi_get_value_bool(env, argv[2], &has_message);
  if (argc > 3)
    napi_get_value_bool(env, argv[3], &has_excise);
  if (c->dispatch)
    napi_delete_reference(env, c->dispatch);
  CHECK(env, napi_create_reference(env, argv[0], 1, &c->dispatch));
  c->has_timer = has_timer;
  c->has_message = has_message;
  c->has_excise = has_excise;
  if (!(w = calloc(1, sizeof(*w)))) {
    napi_throw_error(env, NULL, "out of memory");
    return NULL;
  }
  w->c = c;
  w->kind = 0;
  c->subscribed = 1;
  pn_hold(c, 1); /* a subscription keeps the loop up until unsubscribe */
  return pn_queue_work(env, w, self);
}

static napi_value client_unsubscribe(napi_env env, napi_callback_info info) {
  size_t argc = 0;
  napi_value self;
  client_t *c;
  work_t *w;
  CHECK(env, napi_get_cb_info(env, info, &argc, NULL, &self, NULL));
  if (!(c = pn_unwrap_client(env, info, &argc, NULL)))
    return NULL;
  if (!(w = calloc(1, sizeof(*w)))) {
    napi_throw_error(env, NULL, "out of memory");
    return NULL;
  }
  w->c = c;
  w->kind = 1;
  if (!c->subscribed) { /* nothing to stop: a resolved promise */
    napi_value promise, u;
    napi_deferred d;
    free(w);
    napi_create_promise(env, &d, &promise);
    napi_get_undefined(env, &u);
    napi_resolve_deferred(env, d, u);
    return promise;
  }
  return pn_queue_work(env, w, self);
}

/* followsFrom() -> [message_spans, timer_spans] are follows_from */
static napi_value client_follows_from(napi_env env, napi_callback_info info) {
  size_t argc = 0;
  napi_value r, b, self;
  client_t *c = NULL;
  /* Known from the configuration: also before open(). */
  CHECK(env, napi_get_cb_info(env, info, &argc, NULL, &self, NULL));
  if (napi_unwrap(env, self, (void **)&c) != napi_ok || !c) {
    napi_throw_error(env, NULL, "not a ProsodyClient");
    return NULL;
  }
  napi_create_array_with_length(env, 2, &r);
  for (uint32_t i = 0; i < 2; i++) {
    napi_get_boolean(env, c->follows_from[i], &b);
    napi_set_element(env, r, i, b);
  }
  return r;
}

static napi_value client_state(napi_env env, napi_callback_info info) {
  size_t argc = 0;
  napi_value r;
  client_t *c = pn_unwrap_client(env, info, &argc, NULL);
  if (!c)
    return NULL;
  napi_create_string_utf8(env, prosody_consumer_state(c->client),
                          NAPI_AUTO_LENGTH, &r);
  return r;
}

static napi_value client_assigned(napi_env env, napi_callback_info info) {
  size_t argc = 0;
  napi_value r;
  client_t *c = pn_unwrap_client(env, info, &argc, NULL);
  if (!c)
    return NULL;
  napi_create_int32(env, prosody_assigned_partition_count(c->client), &r);
  return r;
}

static napi_value client_stalled(napi_env env, napi_callback_info info) {
  size_t argc = 0;
  napi_value r;
  client_t *c = pn_unwrap_client(env, info, &argc, NULL);
  if (!c)
    return NULL;
  napi_get_boolean(env, prosody_is_stalled(c->client), &r);
  return r;
}

static napi_value client_source_system(napi_env env, napi_callback_info info) {
  size_t argc = 0;
  napi_value r;
  client_t *c = pn_unwrap_client(env, info, &argc, NULL);
  if (!c)
    return NULL;
  napi_create_string_utf8(env, prosody_client_source_system(c->client),
                          NAPI_AUTO_LENGTH, &r);
  return r;
}

static napi_value client_probe_port(napi_env env, napi_callback_info info) {
  size_t argc = 0;
  napi_value r;
  client_t *c = pn_unwrap_client(env, info, &argc, NULL);
  if (!c)
    return NULL;
  napi_create_int32(env, prosody_probe_port(c->client), &r);
  return r;
}

napi_value pn_client_class(napi_env env) {
  napi_property_descriptor client_props[] = {
      {"send", NULL, client_send, NULL, NULL, NULL, napi_default, NULL},
      {"open", NULL, client_open, NULL, NULL, NULL, napi_default, NULL},
      {"shutdown", NULL, client_shutdown, NULL, NULL, NULL, napi_default, NULL},
      {"subscribe", NULL, client_subscribe, NULL, NULL, NULL, napi_default,
       NULL},
      {"unsubscribe", NULL, client_unsubscribe, NULL, NULL, NULL, napi_default,
       NULL},
      {"completeMany", NULL, pn_client_complete_many, NULL, NULL, NULL,
       napi_default, NULL},
      {"timerOp", NULL, pn_client_timer_op, NULL, NULL, NULL, napi_default,
       NULL},
      {"shouldCancel", NULL, pn_client_should_cancel, NULL, NULL, NULL,
       napi_default, NULL},
      {"stateOpen", NULL, pn_client_state_open, NULL, NULL, NULL, napi_default,
       NULL},
      {"stateOp", NULL, pn_client_state_op, NULL, NULL, NULL, napi_default,
       NULL},
      {"publishedOpen", NULL, client_published_open, NULL, NULL, NULL,
       napi_default, NULL},
      {"publishedOp", NULL, pn_client_published_op, NULL, NULL, NULL,
       napi_default, NULL},
      {"consumerState", NULL, client_state, NULL, NULL, NULL, napi_default,
       NULL},
      {"assignedPartitionCount", NULL, client_assigned, NULL, NULL, NULL,
       napi_default, NULL},
      {"isStalled", NULL, client_stalled, NULL, NULL, NULL, napi_default, NULL},
      {"sourceSystem", NULL, client_source_system, NULL, NULL, NULL,
       napi_default, NULL},
      {"probePort", NULL, client_probe_port, NULL, NULL, NULL, napi_default,
       NULL},
      {"followsFrom", NULL, client_follows_from, NULL, NULL, NULL, napi_default,
       NULL},
  };
  napi_value cls;
  napi_define_class(env, "NativeClient", NAPI_AUTO_LENGTH, client_new, NULL,
                    sizeof(client_props) / sizeof(client_props[0]),
                    client_props, &cls);
  return cls;
}
