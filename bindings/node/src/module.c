/*
 * module.c - the addon's registration: NativeClient (client.c),
 * NativeAdmin (admin.c) and the module's functions, plus the errors every
 * file throws. The files and their threads: prosody_node.h.
 */
#include "prosody_node.h"

/* ------------------------------------------------------------------------ */
/* Errors                                                                   */
/* ------------------------------------------------------------------------ */

void pn_throw_last(napi_env env) {
  const napi_extended_error_info *info = NULL;
  bool pending = false;
  napi_is_exception_pending(env, &pending);
  if (pending)
    return;
  napi_get_last_error_info(env, &info);
  napi_throw_error(env, NULL,
                   info && info->error_message ? info->error_message
                                               : "N-API call failed");
}

/* An Error with `code` (the C error's name) and `transient`. */
napi_value pn_make_error(napi_env env, prosody_err_t err, const char *msg) {
  napi_value m, e, code, tr;
  if (!msg || !*msg)
    msg = prosody_err_message(err);
  napi_create_string_utf8(env, msg, NAPI_AUTO_LENGTH, &m);
  if (err == PROSODY_ERR_INVALID_ARG || err == PROSODY_ERR_CONFIG ||
      err == PROSODY_ERR_INVALID_PAYLOAD)
    napi_create_range_error(env, NULL, m, &e);
  else
    napi_create_error(env, NULL, m, &e);
  napi_create_string_utf8(env, prosody_err_name(err), NAPI_AUTO_LENGTH, &code);
  napi_get_boolean(env, prosody_err_is_transient(err), &tr);
  napi_set_named_property(env, e, "code", code);
  napi_set_named_property(env, e, "transient", tr);
  return e;
}

napi_value pn_throw_error(napi_env env, prosody_err_t err, const char *msg) {
  napi_throw(env, pn_make_error(env, err, msg));
  return NULL;
}

/* ------------------------------------------------------------------------ */
/* Module                                                                   */
/* ------------------------------------------------------------------------ */

static void set_str(napi_env env, napi_value o, const char *name,
                    const char *s) {
  napi_value v;
  if (!s)
    return;
  napi_create_string_utf8(env, s, NAPI_AUTO_LENGTH, &v);
  napi_set_named_property(env, o, name, v);
}

/* options() -> {name: {type, accepted, env}} from libprosody's table. */
static napi_value mod_options(napi_env env, napi_callback_info info) {
  napi_value o, d;
  napi_create_object(env, &o);
  for (size_t i = 0; i < prosody_option_count(); i++) {
    const prosody_option_info_t *oi = prosody_option_info(i);
    napi_create_object(env, &d);
    set_str(env, d, "type", oi->type);
    set_str(env, d, "accepted", oi->accepted);
    set_str(env, d, "env", oi->env);
    set_str(env, d, "alias", oi->alias);
    napi_set_named_property(env, o, oi->name, d);
  }
  return o;
}

/* flushTelemetry() / shutdownTelemetry(): blocking, as the original's
 * (call them when a client stops, or once at exit). Throw on a timeout. */
#define TELEMETRY_TIMEOUT_MS 30000

static napi_value telemetry_call(napi_env env, int shutdown) {
  prosody_err_t rc = shutdown ? prosody_telemetry_shutdown(TELEMETRY_TIMEOUT_MS)
                              : prosody_telemetry_flush(TELEMETRY_TIMEOUT_MS);
  napi_value u;
  if (rc) {
    char msg[128];
    snprintf(msg, sizeof(msg),
             "Failed to %s telemetry: spans still unexported after %d s",
             shutdown ? "shut down" : "flush", TELEMETRY_TIMEOUT_MS / 1000);
    return pn_throw_error(env, rc, msg);
  }
  napi_get_undefined(env, &u);
  return u;
}

static napi_value mod_flush_telemetry(napi_env env, napi_callback_info info) {
  return telemetry_call(env, 0);
}

static napi_value mod_shutdown_telemetry(napi_env env,
                                         napi_callback_info info) {
  return telemetry_call(env, 1);
}

static napi_value mod_version(napi_env env, napi_callback_info info) {
  napi_value v;
  napi_create_string_utf8(env, prosody_version_str(), NAPI_AUTO_LENGTH, &v);
  return v;
}

/* mockSetGroupInitialRebalanceDelay(ms) -> the previous ms
 * (prosody_mock_set_group_initial_rebalance_delay(); a test helper, on the
 * addon only). */
static napi_value mod_mock_group_delay(napi_env env, napi_callback_info info) {
  size_t argc = 1;
  napi_value argv[1], v;
  napi_valuetype type = napi_undefined;
  double ms = -1;
  int previous = 0;
  char err[512];
  prosody_err_t rc;
  napi_get_cb_info(env, info, &argc, argv, NULL, NULL);
  if (argc >= 1)
    napi_typeof(env, argv[0], &type);
  if (type != napi_number) {
    napi_throw_type_error(env, NULL,
                          "mockSetGroupInitialRebalanceDelay: expected a "
                          "number of milliseconds");
    return NULL;
  }
  napi_get_value_double(env, argv[0], &ms);
  if (!(ms >= 0 && ms <= 300000) || ms != (double)(int)ms)
    return pn_throw_error(env, PROSODY_ERR_INVALID_ARG,
                          "mockSetGroupInitialRebalanceDelay: expected whole "
                          "milliseconds in 0..=300000");
  rc = prosody_mock_set_group_initial_rebalance_delay((int)ms, &previous, err,
                                                      sizeof(err));
  if (rc)
    return pn_throw_error(env, rc, err);
  napi_create_int32(env, previous, &v);
  return v;
}

static napi_value init(napi_env env, napi_value exports) {
  napi_property_descriptor fns[] = {
      {"options", NULL, mod_options, NULL, NULL, NULL, napi_default, NULL},
      {"flushTelemetry", NULL, mod_flush_telemetry, NULL, NULL, NULL,
       napi_default, NULL},
      {"shutdownTelemetry", NULL, mod_shutdown_telemetry, NULL, NULL, NULL,
       napi_default, NULL},
      {"libraryVersion", NULL, mod_version, NULL, NULL, NULL, napi_default,
       NULL},
      {"mockSetGroupInitialRebalanceDelay", NULL, mod_mock_group_delay, NULL,
       NULL, NULL, napi_default, NULL},
  };
  napi_set_named_property(env, exports, "NativeClient", pn_client_class(env));
  napi_set_named_property(env, exports, "NativeAdmin", pn_admin_class(env));
  napi_define_properties(env, exports, sizeof(fns) / sizeof(fns[0]), fns);
  return exports;
}

NAPI_MODULE(NODE_GYP_MODULE_NAME, init)
