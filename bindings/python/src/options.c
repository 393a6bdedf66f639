/*
 * options.c - keyword options to libprosody's text form (validated by its
 * option table, so messages name the option and the accepted form as the C
 * API does), and the conversions between datetimes and milliseconds.
 * Loop thread or any thread holding the GIL.
 */
#include "prosody_py.h"

#include <datetime.h>
#include <math.h>
#include <string.h>

static PyObject *Utc, *Epoch;  /* datetime.timezone.utc, its 1970-01-01 */
static PyObject *option_types; /* dict: option name -> type string */

int pp_options_init(void) {
  PyObject *tz;
  PyDateTime_IMPORT; /* per file: datetime.h's API pointer is static */
  if (!PyDateTimeAPI || !(tz = pp_attr_of("datetime", "timezone")))
    return -1;
  Utc = PyObject_GetAttrString(tz, "utc");
  Py_DECREF(tz);
  if (!Utc)
    return -1;
  if (!(Epoch = PyDateTimeAPI->DateTime_FromDateAndTime(
            1970, 1, 1, 0, 0, 0, 0, Utc, PyDateTimeAPI->DateTimeType)))
    return -1;
  if (!(option_types = PyDict_New()))
    return -1;
  for (size_t i = 0; i < prosody_option_count(); i++) {
    const prosody_option_info_t *o = prosody_option_info(i);
    PyObject *t = PyUnicode_FromString(o->type);
    if (!t || PyDict_SetItemString(option_types, o->name, t) ||
        (o->alias && PyDict_SetItemString(option_types, o->alias, t)))
      return -1;
    Py_DECREF(t);
  }
  return 0;
}

PyObject *pp_options_types(void) { return option_types; }

int pp_delta_seconds(PyObject *v, double *out) {
  if (!PyDelta_Check(v))
    return 0;
  *out = PyDateTime_DELTA_GET_DAYS(v) * 86400.0 +
         PyDateTime_DELTA_GET_SECONDS(v) +
         PyDateTime_DELTA_GET_MICROSECONDS(v) / 1e6;
  return 1;
}

/* ------------------------------------------------------------------------ */
/* Conversions                                                              */
/* ------------------------------------------------------------------------ */

/* Times before the epoch are refused by the core anyway. */
int pp_to_ms(PyObject *dt, const char *what, int64_t *out) {
  PyObject *off, *delta;
  if (!PyDateTime_Check(dt)) {
    PyErr_Format(PyExc_TypeError,
                 "%s: expected an aware datetime.datetime, got %.100s", what,
                 Py_TYPE(dt)->tp_name);
    return -1;
  }
  off = PyObject_CallMethod(dt, "utcoffset", NULL);
  if (!off)
    return -1;
  if (off == Py_None) {
    Py_DECREF(off);
    PyErr_Format(PyExc_ValueError,
                 "%s: naive datetime refused (its time zone is unknown); pass "
                 "an aware one, e.g. datetime.now(timezone.utc)",
                 what);
    return -1;
  }
  Py_DECREF(off);
  if (!(delta = PyNumber_Subtract(dt, Epoch)))
    return -1;
  if (!PyDelta_Check(delta)) { /* a subclass's __sub__ */
    PyErr_Format(PyExc_TypeError, "%s: %.100s - datetime is not a timedelta",
                 what, Py_TYPE(dt)->tp_name);
    Py_DECREF(delta);
    return -1;
  }
  *out = (int64_t)PyDateTime_DELTA_GET_DAYS(delta) * 86400000 +
         (int64_t)PyDateTime_DELTA_GET_SECONDS(delta) * 1000 +
         PyDateTime_DELTA_GET_MICROSECONDS(delta) / 1000;
  Py_DECREF(delta);
  return 0;
}

/* An aware UTC datetime for milliseconds since the epoch. */
PyObject *pp_from_ms(int64_t ms) {
  PyObject *delta, *dt;
  int64_t s = ms / 1000, rem = ms % 1000;
  if (rem < 0) {
    rem += 1000;
    s -= 1;
  }
  delta = PyDelta_FromDSU((int)(s / 86400), (int)(s % 86400), (int)rem * 1000);
  if (!delta)
    return NULL;
  dt = PyNumber_Add(Epoch, delta);
  Py_DECREF(delta);
  return dt;
}

/* ------------------------------------------------------------------------ */
/* Options                                                                  */
/* ------------------------------------------------------------------------ */

static const prosody_option_info_t *option_named(const char *name) {
  for (size_t i = 0; i < prosody_option_count(); i++) {
    const prosody_option_info_t *o = prosody_option_info(i);
    if (!strcmp(o->name, name) || (o->alias && !strcmp(o->alias, name)))
      return o;
  }
  return NULL;
}

static int type_error(const prosody_option_info_t *o, PyObject *v) {
  PyErr_Format(PyExc_TypeError, "option %s: expected %s, got %.100s", o->name,
               o->accepted, Py_TYPE(v)->tp_name);
  return -1;
}

/* The option's value as libprosody's text form, in a new bytes-like str
 * (UTF-8 via PyUnicode_AsUTF8). NULL with an exception on error; *skip is
 * set when the value is None (unset). */
static PyObject *option_text(const prosody_option_info_t *o, PyObject *v,
                             int *skip) {
  const char *t = o->type;
  *skip = 0;
  if (v == Py_None) {
    if (!strcmp(o->name, "probe_port"))
      return PyUnicode_FromString("none");
    *skip = 1;
    return NULL;
  }
  if (PyUnicode_Check(v)) /* the text form, as in the environment */
    return Py_NewRef(v);
  /* The read cache of published state: False turns it off (the table's
   * "none"); True says nothing about how long. */
  if (PyBool_Check(v) && !strcmp(o->name, "state_read_cache")) {
    if (v == Py_False)
      return PyUnicode_FromString("none");
    PyErr_SetString(PyExc_ValueError,
                    "state_read_cache: True is ambiguous; use a duration or "
                    "False");
    return NULL;
  }
  if (!strcmp(t, "duration")) {
    if (PyDelta_Check(v)) {
      long long us, d = PyDateTime_DELTA_GET_DAYS(v);
      if (d > 100000000 || d < -100000000) /* too many us for long long */
        return PyUnicode_FromFormat(
            "%llds", d * 86400 + PyDateTime_DELTA_GET_SECONDS(v));
      us = d * 86400000000LL +
           (long long)PyDateTime_DELTA_GET_SECONDS(v) * 1000000LL +
           PyDateTime_DELTA_GET_MICROSECONDS(v);
      return PyUnicode_FromFormat("%lldus", us);
    }
    if (PyBool_Check(v))
      return type_error(o, v), NULL;
    if (PyLong_Check(v)) {
      PyObject *s = PyObject_Str(v), *r;
      if (!s)
        return NULL;
      r = PyUnicode_FromFormat("%Us", s);
      Py_DECREF(s);
      return r;
    }
    if (PyFloat_Check(v)) {
      double f = PyFloat_AS_DOUBLE(v);
      char buf[64];
      if (!isfinite(f)) {
        PyErr_Format(PyExc_ValueError, "option %s: %R is not a duration (%s)",
                     o->name, v, o->accepted);
        return NULL;
      }
      if (fabs(f) < 9e9)
        snprintf(buf, sizeof(buf), "%lldns", (long long)llround(f * 1e9));
      else
        snprintf(buf, sizeof(buf), "%.0fs", f);
      return PyUnicode_FromString(buf);
    }
    return type_error(o, v), NULL;
  }
  if (!strcmp(t, "integer") || !strcmp(t, "size")) { /* a size: bytes */
    if (PyLong_Check(v) && !PyBool_Check(v))
      return PyObject_Str(v);
    return type_error(o, v), NULL;
  }
  if (!strcmp(t, "number")) {
    if ((PyLong_Check(v) && !PyBool_Check(v)) || PyFloat_Check(v)) {
      PyObject *f = PyNumber_Float(v), *r;
      if (!f)
        return NULL;
      r = PyObject_Repr(f);
      Py_DECREF(f);
      return r;
    }
    return type_error(o, v), NULL;
  }
  if (!strcmp(t, "boolean")) {
    if (PyBool_Check(v))
      return PyUnicode_FromString(v == Py_True ? "true" : "false");
    return type_error(o, v), NULL;
  }
  if (strstr(t, "list")) {
    if (PyList_Check(v) || PyTuple_Check(v)) {
      PyObject *sep, *r;
      Py_ssize_t n = PySequence_Size(v);
      for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *e = PySequence_Fast_GET_ITEM(v, i);
        if (!PyUnicode_Check(e)) {
          PyErr_Format(PyExc_TypeError,
                       "option %s: expected %s (a str or a list of str), got "
                       "a list holding %.100s",
                       o->name, o->accepted, Py_TYPE(e)->tp_name);
          return NULL;
        }
      }
      if (!(sep = PyUnicode_FromString(",")))
        return NULL;
      r = PyUnicode_Join(sep, v);
      Py_DECREF(sep);
      return r;
    }
    return type_error(o, v), NULL;
  }
  return type_error(o, v), NULL;
}

/* A configuration from keyword arguments (None values unset).
 * state_collections is not an option of the table: its definitions go to
 * prosody_config_add_state (state.c). */
prosody_config_t *pp_config_from(PyObject *kwargs) {
  prosody_config_t *conf = prosody_config_new();
  PyObject *k, *v, *states = NULL;
  Py_ssize_t pos = 0;
  char err[1024];
  if (!conf)
    return (prosody_config_t *)PyErr_NoMemory();
  while (kwargs && PyDict_Next(kwargs, &pos, &k, &v)) {
    Py_ssize_t name_len, len;
    const char *name = PyUnicode_AsUTF8AndSize(k, &name_len), *text;
    const prosody_option_info_t *o;
    PyObject *s;
    int skip;
    prosody_err_t rc;
    if (!name)
      goto fail;
    if (!strcmp(name, "state_collections")) {
      states = v == Py_None ? NULL : v;
      continue;
    }
    if (strlen(name) != (size_t)name_len || !(o = option_named(name))) {
      PyErr_Format(PyExc_ValueError,
                   "unknown option %R (the options are listed in "
                   "docs/CONFIGURATION.md; names are snake_case)",
                   k);
      goto fail;
    }
    s = option_text(o, v, &skip);
    if (skip)
      continue;
    if (!s || !(text = PyUnicode_AsUTF8AndSize(s, &len))) {
      Py_XDECREF(s);
      goto fail;
    }
    /* libprosody's options are C strings: a NUL would cut the value short
     * ("app\0-other-team" would be the group "app"). */
    if (strlen(text) != (size_t)len) {
      PyErr_Format(PyExc_ValueError,
                   "option %s: the value contains a NUL character (\\x00) "
                   "at index %zd; an option cannot hold one",
                   name,
                   PyUnicode_FindChar(s, 0, 0, PyUnicode_GET_LENGTH(s), 1));
      Py_DECREF(s);
      goto fail;
    }
    rc = prosody_config_set(conf, name, text, err, sizeof(err));
    Py_DECREF(s);
    if (rc) {
      pp_raise_error(rc, err);
      goto fail;
    }
  }
  if (states && pp_state_add_collections(conf, states))
    goto fail;
  return conf;
fail:
  prosody_config_destroy(conf);
  return NULL;
}
