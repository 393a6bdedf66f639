/*
 * encode.c - OTLP encodings of a batch of spans: protobuf (a small
 * hand-written writer: varints, length-delimited fields, fixed32/fixed64)
 * and OTLP/JSON (jansson); and the resource (service.name, the SDK's
 * attributes, OTEL_RESOURCE_ATTRIBUTES).
 *
 * Field numbers are those of opentelemetry-proto (collector/trace/v1,
 * trace/v1, common/v1, resource/v1).
 *
 * Threads: pure functions; the exporter thread calls them on spans it owns
 * (and the unit tests on their own).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "../util/util.h"
#include "otel_int.h"

/* ---------------------------------------------------------------- resource */

static int hexval(char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

/* Percent-decodes `n` bytes at `s` into a new string; NULL on a bad escape
 * (*bad set) or no memory. */
static char *pct_decode(const char *s, size_t n, bool *bad) {
  char *out = malloc(n + 1);
  size_t o = 0;
  if (!out)
    return NULL;
  for (size_t i = 0; i < n; i++) {
    if (s[i] == '%') {
      int h, l;
      if (i + 2 >= n) {
        free(out);
        *bad = true;
        return NULL;
      }
      h = hexval(s[i + 1]);
      l = hexval(s[i + 2]);
      if (h < 0 || l < 0) {
        free(out);
        *bad = true;
        return NULL;
      }
      out[o++] = (char)(h * 16 + l);
      i += 2;
    } else {
      out[o++] = s[i];
    }
  }
  out[o] = 0;
  return out;
}

static void trim(const char **b, const char **e) {
  while (*b < *e && (**b == ' ' || **b == '\t'))
    (*b)++;
  while (*e > *b && ((*e)[-1] == ' ' || (*e)[-1] == '\t'))
    (*e)--;
}

/* Sets key to value (both taken over), replacing an earlier value. */
static int res_set(pr__otel_resource_t *r, size_t *cap, char *key,
                   char *value) {
  for (size_t i = 0; i < r->n; i++) {
    if (!strcmp(r->kv[i].key, key)) {
      free(r->kv[i].value);
      r->kv[i].value = value;
      free(key);
      return 0;
    }
  }
  if (pr__grow(&r->kv, cap, r->n, sizeof *r->kv, 8)) {
    free(key);
    free(value);
    return -1;
  }
  r->kv[r->n].key = key;
  r->kv[r->n].value = value;
  r->n++;
  return 0;
}

static int res_set_dup(pr__otel_resource_t *r, size_t *cap, const char *key,
                       const char *value) {
  char *k = pr__strdup(key), *v = pr__strdup(value);
  if (!k || !v) {
    free(k);
    free(v);
    return -1;
  }
  return res_set(r, cap, k, v);
}

int pr__otel_resource_parse(const char *service_name, const char *attrs,
                            pr__otel_resource_t *out, char *err,
                            size_t err_size) {
  size_t cap = 0;
  const char *p = attrs;
  memset(out, 0, sizeof *out);
  if (res_set_dup(out, &cap, "service.name",
                  service_name && *service_name ? service_name : "prosody") ||
      res_set_dup(out, &cap, "telemetry.sdk.name", "prosody-c") ||
      res_set_dup(out, &cap, "telemetry.sdk.language", "c"))
    goto oom;
  while (p && *p) {
    const char *end = strchr(p, ','), *eq, *kb, *ke, *vb, *ve;
    char *key, *value;
    bool bad = false;
    if (!end)
      end = p + strlen(p);
    kb = p;
    ve = end;
    trim(&kb, &ve);
    if (kb == ve) { /* an empty entry */
      p = *end ? end + 1 : end;
      continue;
    }
    eq = memchr(kb, '=', (size_t)(ve - kb));
    if (!eq) {
      pr__errf(err, err_size,
               "OTEL_RESOURCE_ATTRIBUTES: entry \"%.*s\" is not key=value",
               (int)(ve - kb), kb);
      goto fail;
    }
    ke = eq;
    vb = eq + 1;
    trim(&kb, &ke);
    trim(&vb, &ve);
    if (kb == ke) {
      pr__errf(err, err_size,
               "OTEL_RESOURCE_ATTRIBUTES: entry \"%.*s\" has an empty key",
               (int)(ve - kb), kb);
      goto fail;
    }
    key = pct_decode(kb, (size_t)(ke - kb), &bad);
    value = key ? pct_decode(vb, (size_t)(ve - vb), &bad) : NULL;
    if (!key || !value) {
      free(key);
      if (bad) {
        pr__errf(err, err_size,
                 "OTEL_RESOURCE_ATTRIBUTES: entry \"%.*s\" has a bad "
                 "percent escape",
                 (int)(ve - kb), kb);
        goto fail;
      }
      goto oom;
    }
    if (!strcmp(key, "service.name")) { /* the configured name wins */
      free(key);
      free(value);
    } else if (res_set(out, &cap, key, value)) {
      goto oom;
    }
    p = *end ? end + 1 : end;
  }
  return 0;
oom:
  pr__errf(err, err_size, "out of memory");
fail:
  pr__otel_resource_free(out);
  return -1;
}

void pr__otel_resource_free(pr__otel_resource_t *r) {
  for (size_t i = 0; i < r->n; i++) {
    free(r->kv[i].key);
    free(r->kv[i].value);
  }
  free(r->kv);
  memset(r, 0, sizeof *r);
}

/* ---------------------------------------------------------------- protobuf */

enum { PB_VARINT = 0, PB_I64 = 1, PB_LEN = 2, PB_I32 = 5 };

static void buf_put(pr__otel_buf_t *b, const void *p, size_t n) {
  if (b->oom)
    return;
  if (b->len + n > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    uint8_t *np;
    while (cap < b->len + n)
      cap *= 2;
    np = realloc(b->p, cap);
    if (!np) {
      b->oom = true;
      return;
    }
    b->p = np;
    b->cap = cap;
  }
  memcpy(b->p + b->len, p, n);
  b->len += n;
}

static size_t varint_enc(uint64_t v, uint8_t out[10]) {
  size_t n = 0;
  while (v >= 0x80) {
    out[n++] = (uint8_t)(v | 0x80);
    v >>= 7;
  }
  out[n++] = (uint8_t)v;
  return n;
}

static void pb_varint(pr__otel_buf_t *b, uint64_t v) {
  uint8_t tmp[10];
  buf_put(b, tmp, varint_enc(v, tmp));
}

static void pb_tag(pr__otel_buf_t *b, uint32_t field, int wire) {
  pb_varint(b, ((uint64_t)field << 3) | (uint64_t)wire);
}

static void pb_bytes(pr__otel_buf_t *b, uint32_t field, const void *p,
                     size_t n) {
  pb_tag(b, field, PB_LEN);
  pb_varint(b, n);
  buf_put(b, p, n);
}

static void pb_str(pr__otel_buf_t *b, uint32_t field, const char *s) {
  pb_bytes(b, field, s, strlen(s));
}

static void pb_fixed64(pr__otel_buf_t *b, uint32_t field, uint64_t v) {
  uint8_t le[8];
  for (int i = 0; i < 8; i++)
    le[i] = (uint8_t)(v >> (8 * i));
  pb_tag(b, field, PB_I64);
  buf_put(b, le, 8);
}

static void pb_fixed32(pr__otel_buf_t *b, uint32_t field, uint32_t v) {
  uint8_t le[4];
  for (int i = 0; i < 4; i++)
    le[i] = (uint8_t)(v >> (8 * i));
  pb_tag(b, field, PB_I32);
  buf_put(b, le, 4);
}

/* A length-delimited sub-message: pb_begin writes the tag and returns where
 * the body starts; pb_end prefixes the body with its length. */
static size_t pb_begin(pr__otel_buf_t *b, uint32_t field) {
  pb_tag(b, field, PB_LEN);
  return b->len;
}

static void pb_end(pr__otel_buf_t *b, size_t start) {
  uint8_t tmp[10];
  size_t body, n;
  if (b->oom)
    return;
  body = b->len - start;
  n = varint_enc(body, tmp);
  buf_put(b, tmp, n); /* room for the prefix */
  if (b->oom)
    return;
  memmove(b->p + start + n, b->p + start, body);
  memcpy(b->p + start, tmp, n);
}

/* KeyValue { key = 1; AnyValue value = 2 }, AnyValue { string_value = 1;
 * int_value = 3 }. */
static void pb_kv_str(pr__otel_buf_t *b, uint32_t field, const char *key,
                      const char *v, size_t vlen) {
  size_t kv = pb_begin(b, field), av;
  pb_str(b, 1, key);
  av = pb_begin(b, 2);
  pb_bytes(b, 1, v, vlen);
  pb_end(b, av);
  pb_end(b, kv);
}

static void pb_kv_int(pr__otel_buf_t *b, uint32_t field, const char *key,
                      int64_t v) {
  size_t kv = pb_begin(b, field), av;
  pb_str(b, 1, key);
  av = pb_begin(b, 2);
  pb_tag(b, 3, PB_VARINT);
  pb_varint(b, (uint64_t)v);
  pb_end(b, av);
  pb_end(b, kv);
}

void pr__otel_pb_span(pr__otel_buf_t *b, const pr_span_t *s) {
  /* Span: trace_id 1, span_id 2, trace_state 3, parent_span_id 4, name 5,
   * kind 6, start_time_unix_nano 7, end_time_unix_nano 8, attributes 9,
   * links 13, status 15, flags 16 (fixed32). */
  pb_bytes(b, 1, s->ctx.trace_id, PR_TRACE_ID_LEN);
  pb_bytes(b, 2, s->ctx.span_id, PR_SPAN_ID_LEN);
  if (s->tracestate && *s->tracestate)
    pb_str(b, 3, s->tracestate);
  if (s->has_parent)
    pb_bytes(b, 4, s->parent_id, PR_SPAN_ID_LEN);
  pb_str(b, 5, s->name);
  pb_tag(b, 6, PB_VARINT);
  pb_varint(b, (uint64_t)s->kind);
  pb_fixed64(b, 7, s->start_ns);
  pb_fixed64(b, 8, s->end_ns);
  for (int i = 0; i < s->nattrs; i++) {
    const pr_span_attr_t *a = &s->attrs[i];
    if (a->is_str)
      pb_kv_str(b, 9, a->key, a->s, a->slen);
    else
      pb_kv_int(b, 9, a->key, a->i);
  }
  if (s->link.valid) { /* Link: trace_id 1, span_id 2 */
    size_t l = pb_begin(b, 13);
    pb_bytes(b, 1, s->link.trace_id, PR_TRACE_ID_LEN);
    pb_bytes(b, 2, s->link.span_id, PR_SPAN_ID_LEN);
    pb_end(b, l);
  }
  if (s->error) { /* Status: message 2, code 3 (2: ERROR) */
    size_t st = pb_begin(b, 15);
    if (s->status_msg && *s->status_msg)
      pb_str(b, 2, s->status_msg);
    pb_tag(b, 3, PB_VARINT);
    pb_varint(b, 2);
    pb_end(b, st);
  }
  if (s->ctx.flags)
    pb_fixed32(b, 16, s->ctx.flags);
}

int pr__otel_encode_pb(const pr__otel_resource_t *res, pr_span_t *const *spans,
                       size_t n, pr__otel_buf_t *out) {
  /* ExportTraceServiceRequest { resource_spans 1 }; ResourceSpans
   * { resource 1, scope_spans 2 }; Resource { attributes 1 }; ScopeSpans
   * { scope 1, spans 2 }; InstrumentationScope { name 1 }. */
  size_t rs = pb_begin(out, 1), r, ss, sc;
  r = pb_begin(out, 1);
  for (size_t i = 0; i < res->n; i++)
    pb_kv_str(out, 1, res->kv[i].key, res->kv[i].value,
              strlen(res->kv[i].value));
  pb_end(out, r);
  ss = pb_begin(out, 2);
  sc = pb_begin(out, 1);
  pb_str(out, 1, "prosody");
  pb_end(out, sc);
  for (size_t i = 0; i < n; i++) {
    size_t sp = pb_begin(out, 2);
    pr__otel_pb_span(out, spans[i]);
    pb_end(out, sp);
  }
  pb_end(out, ss);
  pb_end(out, rs);
  return out->oom ? -1 : 0;
}

int pr__otel_encode_grpc(const pr__otel_resource_t *res,
                         pr_span_t *const *spans, size_t n,
                         pr__otel_buf_t *out) {
  static const uint8_t prefix[5] = {0};
  size_t at = out->len, len;
  buf_put(out, prefix, sizeof prefix);
  if (pr__otel_encode_pb(res, spans, n, out))
    return -1;
  len = out->len - at - sizeof prefix;
  if (len > UINT32_MAX)
    return -1;
  for (int i = 0; i < 4; i++)
    out->p[at + 1 + i] = (uint8_t)(len >> (8 * (3 - i)));
  return 0;
}

/* -------------------------------------------------------------------- JSON */

static json_t *hex_str(const uint8_t *p, size_t n) {
  static const char dig[] = "0123456789abcdef";
  char buf[2 * PR_TRACE_ID_LEN + 1];
  for (size_t i = 0; i < n; i++) {
    buf[2 * i] = dig[p[i] >> 4];
    buf[2 * i + 1] = dig[p[i] & 15];
  }
  buf[2 * n] = 0;
  return json_string(buf);
}

static json_t *u64_str(uint64_t v) {
  char buf[24];
  snprintf(buf, sizeof buf, "%" PRIu64, v);
  return json_string(buf);
}

static json_t *kv_json(const char *key, json_t *value) {
  return json_pack("{s:s, s:o}", "key", key, "value", value);
}

static json_t *span_json(const pr_span_t *s) {
  json_t *o = json_object(), *attrs = json_array();
  int bad = !o || !attrs;
  if (bad)
    goto out;
  bad |= json_object_set_new(o, "traceId",
                             hex_str(s->ctx.trace_id, PR_TRACE_ID_LEN));
  bad |=
      json_object_set_new(o, "spanId", hex_str(s->ctx.span_id, PR_SPAN_ID_LEN));
  if (s->tracestate && *s->tracestate)
    bad |= json_object_set_new(o, "traceState", json_string(s->tracestate));
  if (s->has_parent)
    bad |= json_object_set_new(o, "parentSpanId",
                               hex_str(s->parent_id, PR_SPAN_ID_LEN));
  if (s->ctx.flags)
    bad |= json_object_set_new(o, "flags", json_integer(s->ctx.flags));
  bad |= json_object_set_new(o, "name", json_string(s->name));
  bad |= json_object_set_new(o, "kind", json_integer(s->kind));
  bad |= json_object_set_new(o, "startTimeUnixNano", u64_str(s->start_ns));
  bad |= json_object_set_new(o, "endTimeUnixNano", u64_str(s->end_ns));
  for (int i = 0; i < s->nattrs; i++) {
    const pr_span_attr_t *a = &s->attrs[i];
    char ibuf[24]; /* int64 as a signed decimal string */
    json_t *v;
    snprintf(ibuf, sizeof ibuf, "%" PRId64, a->i);
    v = a->is_str ? json_pack("{s:s%}", "stringValue", a->s, a->slen)
                  : json_pack("{s:s}", "intValue", ibuf);
    bad |= !v || json_array_append_new(attrs, kv_json(a->key, v));
  }
  bad |= json_object_set(o, "attributes", attrs);
  if (s->link.valid) {
    json_t *l = json_pack("[{s:o, s:o}]", "traceId",
                          hex_str(s->link.trace_id, PR_TRACE_ID_LEN), "spanId",
                          hex_str(s->link.span_id, PR_SPAN_ID_LEN));
    bad |= json_object_set_new(o, "links", l);
  }
  if (s->error) {
    json_t *st = json_pack("{s:i}", "code", 2);
    if (st && s->status_msg && *s->status_msg)
      bad |= json_object_set_new(st, "message", json_string(s->status_msg));
    bad |= json_object_set_new(o, "status", st);
  }
out:
  json_decref(attrs);
  if (bad) {
    json_decref(o);
    return NULL;
  }
  return o;
}

char *pr__otel_encode_json(const pr__otel_resource_t *res,
                           pr_span_t *const *spans, size_t n) {
  json_t *rattrs = json_array(), *jspans = json_array(), *root;
  char *text = NULL;
  int bad = !rattrs || !jspans;
  for (size_t i = 0; !bad && i < res->n; i++)
    bad |= json_array_append_new(
        rattrs, kv_json(res->kv[i].key,
                        json_pack("{s:s}", "stringValue", res->kv[i].value)));
  for (size_t i = 0; !bad && i < n; i++)
    bad |= json_array_append_new(jspans, span_json(spans[i]));
  if (bad) {
    json_decref(rattrs);
    json_decref(jspans);
    return NULL;
  }
  root = json_pack("{s:[{s:{s:o}, s:[{s:{s:s}, s:o}]}]}", "resourceSpans",
                   "resource", "attributes", rattrs, "scopeSpans", "scope",
                   "name", "prosody", "spans", jspans);
  if (!root)
    return NULL;
  text = json_dumps(root, JSON_COMPACT);
  json_decref(root);
  return text;
}
