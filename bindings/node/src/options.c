/*
 * options.c - JavaScript strings and the options object to libprosody's
 * C strings and configuration (index.js has converted every value to the
 * option table's text form; the table validates it). JS thread.
 */
#include "prosody_node.h"

/* A NUL-terminated UTF-8 copy of a JS string (malloc'd) and, into *len, its
 * length in bytes, which is more than strlen() when the string holds a NUL;
 * or NULL with an exception pending. */
char *pn_string_copy(napi_env env, napi_value v, const char *what,
                     size_t *len) {
  size_t n;
  char *s;
  napi_valuetype t;
  napi_typeof(env, v, &t);
  if (t != napi_string) {
    char msg[128];
    snprintf(msg, sizeof(msg), "%s must be a string", what);
    napi_throw_type_error(env, NULL, msg);
    return NULL;
  }
  napi_get_value_string_utf8(env, v, NULL, 0, &n);
  if (!(s = malloc(n + 1))) {
    napi_throw_error(env, NULL, "out of memory");
    return NULL;
  }
  napi_get_value_string_utf8(env, v, s, n + 1, &n);
  *len = n;
  return s;
}

/* A string argument for libprosody, which takes C strings: one holding a
 * NUL is refused (a RangeError naming `what`), as it would be cut there
 * ('user\0alice' and 'user\0bob' would both be the key "user"). */
char *pn_string_arg(napi_env env, napi_value v, const char *what) {
  size_t n;
  char *s = pn_string_copy(env, v, what, &n);
  if (s && strlen(s) != n) {
    char msg[160];
    snprintf(msg, sizeof(msg),
             "%s must not contain a NUL character (\\0 at byte %zu)", what,
             strlen(s));
    free(s);
    napi_throw_range_error(env, NULL, msg);
    return NULL;
  }
  return s;
}

/* A configuration from an object of option name -> string (index.js has
 * converted the values to libprosody's text form). */
prosody_config_t *pn_config_from(napi_env env, napi_value obj) {
  prosody_config_t *conf = prosody_config_new();
  napi_value names;
  uint32_t n;
  char err[1024];
  if (!conf) {
    napi_throw_error(env, NULL, "out of memory");
    return NULL;
  }
  if (napi_get_property_names(env, obj, &names) != napi_ok ||
      napi_get_array_length(env, names, &n) != napi_ok) {
    prosody_config_destroy(conf);
    pn_throw_last(env);
    return NULL;
  }
  for (uint32_t i = 0; i < n; i++) {
    napi_value k, v;
    char *name, *value;
    prosody_err_t rc;
    napi_get_element(env, names, i, &k);
    napi_get_property(env, obj, k, &v);
    if (!(name = pn_string_arg(env, k, "option name"))) {
      prosody_config_destroy(conf);
      return NULL;
    }
    if (!(value = pn_string_arg(env, v, name))) {
      free(name);
      prosody_config_destroy(conf);
      return NULL;
    }
    rc = prosody_config_set(conf, name, value, err, sizeof(err));
    free(name);
    free(value);
    if (rc) {
      prosody_config_destroy(conf);
      pn_throw_error(env, rc, err);
      return NULL;
    }
  }
  return conf;
}

/* The JavaScript names of prosody_config_add_state's fields, as its
 * errors name them. */
static const struct {
  const char *c, *js;
} STATE_FIELDS[] = {{"ttl:", "ttlSeconds:"}, {"keyset_limit:", "keysetLimit:"}};

/* `defs`: index.js's flat array, STATE_STRIDE slots a collection: [name,
 * kind, payload, ttlSeconds, readUncommitted, published, keysetLimit,
 * capacity], numbers as prosody_state_def_t has them (index.js has
 * checked their types and ranges). */
#define STATE_STRIDE 8

int pn_config_add_states(napi_env env, prosody_config_t *conf,
                         napi_value defs) {
  uint32_t n;
  if (napi_get_array_length(env, defs, &n) != napi_ok) {
    pn_throw_last(env);
    return -1;
  }
  for (uint32_t i = 0; i + STATE_STRIDE <= n; i += STATE_STRIDE) {
    prosody_state_def_t d = PROSODY_STATE_DEF_INIT;
    napi_value v[STATE_STRIDE];
    double num[STATE_STRIDE] = {0};
    bool flag[STATE_STRIDE] = {0};
    char err[512], msg[700];
    const char *text = err;
    prosody_err_t rc;
    for (uint32_t j = 0; j < STATE_STRIDE; j++) {
      napi_get_element(env, defs, i + j, &v[j]);
      if (j == 4 || j == 5)
        napi_get_value_bool(env, v[j], &flag[j]);
      else if (j)
        napi_get_value_double(env, v[j], &num[j]);
    }
    if (!(d.name = pn_string_arg(env, v[0], "stateCollections[].name")))
      return -1;
    d.kind = (int)num[1];
    d.payload = (int)num[2];
    d.ttl_s = (int64_t)num[3];
    d.read_uncommitted = flag[4];
    d.published = flag[5];
    d.keyset_limit = (int64_t)num[6];
    d.capacity = (int64_t)num[7];
    rc = prosody_config_add_state(conf, &d, err, sizeof(err));
    free((char *)d.name);
    if (!rc)
      continue;
    const char *field = "";
    for (size_t k = 0; k < sizeof(STATE_FIELDS) / sizeof(STATE_FIELDS[0]); k++)
      if (!strncmp(err, STATE_FIELDS[k].c, strlen(STATE_FIELDS[k].c))) {
        field = STATE_FIELDS[k].js;
        text = err + strlen(STATE_FIELDS[k].c);
      }
    snprintf(msg, sizeof(msg), "stateCollections[%u].%s%s", i / STATE_STRIDE,
             field, text);
    pn_throw_error(env, rc, msg);
    return -1;
  }
  return 0;
}
