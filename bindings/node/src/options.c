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
