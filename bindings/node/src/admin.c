/*
 * admin.c - NativeAdmin over prosody_admin_t: topic creation and deletion,
 * each a blocking call run as napi_async_work on libuv's pool (client.c's
 * queue_work). JS thread.
 */
#include "prosody_node.h"

static void admin_finalize(napi_env env, void *data, void *hint) {
  prosody_admin_destroy(data);
}

static napi_value admin_new(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1], self;
  prosody_config_t *conf;
  prosody_admin_t *a;
  char err[1024];
  CHECK(env, napi_get_cb_info(env, info, &argc, argv, &self, NULL));
  if (argc < 1) {
    napi_throw_type_error(env, NULL, "options object required");
    return NULL;
  }
  if (!(conf = pn_config_from(env, argv[0])))
    return NULL;
  if (!(a = prosody_admin_new(conf, err, sizeof(err)))) {
    prosody_config_destroy(conf);
    return pn_throw_error(env, PROSODY_ERR_CONFIG, err);
  }
  if (napi_wrap(env, self, a, admin_finalize, NULL, NULL) != napi_ok) {
    prosody_admin_destroy(a);
    pn_throw_last(env);
    return NULL;
  }
  return self;
}

/* createTopic(name, partitions, replication, policy|null, retentionMs) */
static napi_value admin_create(napi_env env, napi_callback_info info) {
  size_t argc = 5;
  napi_value argv[5], self;
  prosody_admin_t *a;
  work_t *w;
  int32_t p = 0, r = 0;
  double ret = 0;
  napi_valuetype t;
  CHECK(env, napi_get_cb_info(env, info, &argc, argv, &self, NULL));
  CHECK(env, napi_unwrap(env, self, (void **)&a));
  if (!(w = calloc(1, sizeof(*w)))) {
    napi_throw_error(env, NULL, "out of memory");
    return NULL;
  }
  if (!(w->name = pn_string_arg(env, argv[0], "name"))) {
    free(w);
    return NULL;
  }
  napi_get_value_int32(env, argv[1], &p);
  napi_get_value_int32(env, argv[2], &r);
  napi_typeof(env, argv[3], &t);
  if (t == napi_string &&
      !(w->policy = pn_string_arg(env, argv[3], "policy"))) {
    free(w->name);
    free(w);
    return NULL;
  }
  napi_get_value_double(env, argv[4], &ret);
  w->admin = a;
  w->kind = 2;
  w->topts.partitions = p;
  w->topts.replication_factor = (int16_t)r;
  w->topts.retention_ms = (int64_t)ret;
  return pn_queue_work(env, w, self);
}

static napi_value admin_delete(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1], self;
  prosody_admin_t *a;
  work_t *w;
  CHECK(env, napi_get_cb_info(env, info, &argc, argv, &self, NULL));
  CHECK(env, napi_unwrap(env, self, (void **)&a));
  if (!(w = calloc(1, sizeof(*w)))) {
    napi_throw_error(env, NULL, "out of memory");
    return NULL;
  }
  if (!(w->name = pn_string_arg(env, argv[0], "name"))) {
    free(w);
    return NULL;
  }
  w->admin = a;
  w->kind = 3;
  return pn_queue_work(env, w, self);
}

napi_value pn_admin_class(napi_env env) {
  napi_property_descriptor admin_props[] = {
      {"createTopic", NULL, admin_create, NULL, NULL, NULL, napi_default, NULL},
      {"deleteTopic", NULL, admin_delete, NULL, NULL, NULL, napi_default, NULL},
  };
  napi_value cls;
  napi_define_class(env, "NativeAdmin", NAPI_AUTO_LENGTH, admin_new, NULL,
                    sizeof(admin_props) / sizeof(admin_props[0]), admin_props,
                    &cls);
  return cls;
}
