/*
 * test_otel.c - spans and their OTLP encodings (src/otel/): traceparent
 * parsing and formatting, a span's protobuf bytes against a hand-assembled
 * sequence, its OTLP/JSON field by field, OTEL_RESOURCE_ATTRIBUTES parsing,
 * the ids a span gets (never zero, all different, child and follows-from
 * relations), where each protocol sends (pr__otel_target: the gRPC path,
 * the http/protobuf fallback without HTTP/2) and the gRPC message framing.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "otel/otel_int.h"

static const char *TP =
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

static void test_traceparent(void **state) {
  pr_span_ctx_t c;
  char out[PR_TRACEPARENT_LEN + 1];
  char buf[80];
  (void)state;
  assert_int_equal(pr__span_ctx_parse(TP, SIZE_MAX, &c), 0);
  assert_true(c.valid);
  assert_int_equal(c.trace_id[0], 0x4b);
  assert_int_equal(c.trace_id[15], 0x36);
  assert_int_equal(c.span_id[0], 0x00);
  assert_int_equal(c.span_id[7], 0xb7);
  assert_int_equal(c.flags, 1);
  pr__span_ctx_format(&c, out);
  assert_string_equal(out, TP);

  /* `len` bounds the text: the first 55 bytes of a longer buffer. */
  snprintf(buf, sizeof buf, "%sXYZ", TP);
  assert_int_equal(pr__span_ctx_parse(buf, 55, &c), 0);
  assert_int_equal(pr__span_ctx_parse(buf, 54, &c), -1);
  assert_false(c.valid);
  /* A future version may carry more after a '-'; version 00 may not. */
  assert_int_equal(
      pr__span_ctx_parse(
          "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-x", SIZE_MAX,
          &c),
      0);
  assert_int_equal(c.flags, 0);

  static const char *bad[] = {
      "",
      "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",
      "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
      "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
      "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
      "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
      "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
      "00-4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7-01",
      "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
      "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
      "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
      "0x-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    c.valid = true;
    assert_int_equal(pr__span_ctx_parse(bad[i], SIZE_MAX, &c), -1);
    assert_false(c.valid);
  }
  assert_int_equal(pr__span_ctx_parse(NULL, SIZE_MAX, &c), -1);
}

/* A small span with fixed ids and times, filled by hand. */
static pr_span_t *fixed_span(void) {
  pr_span_t *s = calloc(1, sizeof *s);
  for (int i = 0; i < 16; i++) {
    s->ctx.trace_id[i] = (uint8_t)(i + 1);
    s->link.trace_id[i] = 0x11;
  }
  for (int i = 0; i < 8; i++) {
    s->ctx.span_id[i] = (uint8_t)(0xa1 + i);
    s->parent_id[i] = 0x33;
    s->link.span_id[i] = 0x22;
  }
  s->ctx.flags = 1;
  s->ctx.valid = true;
  s->has_parent = true;
  s->link.valid = true;
  s->name = "op";
  s->kind = PR_SPAN_PRODUCER;
  s->start_ns = 0x0102030405060708ULL;
  s->end_ns = 0x1112131415161718ULL;
  s->attrs[0].key = "k";
  s->attrs[0].is_str = true;
  s->attrs[0].s = strdup("v");
  s->attrs[0].slen = 1;
  s->attrs[1].key = "n";
  s->attrs[1].i = 300;
  s->nattrs = 2;
  s->error = true;
  s->status_msg = strdup("bad");
  return s;
}

static void free_fixed(pr_span_t *s) {
  free(s->attrs[0].s);
  free(s->status_msg);
  free(s);
}

static void test_span_protobuf(void **state) {
  static const uint8_t want[] = {
      /* trace_id (1, bytes) */
      0x0a, 0x10, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,
      /* span_id (2, bytes) */
      0x12, 0x08, 0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7, 0xa8,
      /* parent_span_id (4, bytes) */
      0x22, 0x08, 0x33, 0x33, 0x33, 0x33, 0x33, 0x33, 0x33, 0x33,
      /* name (5, string) "op" */
      0x2a, 0x02, 'o', 'p',
      /* kind (6, varint) PRODUCER */
      0x30, 0x04,
      /* start_time_unix_nano (7, fixed64, little-endian) */
      0x39, 0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01,
      /* end_time_unix_nano (8, fixed64) */
      0x41, 0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11,
      /* attributes (9): KeyValue{key "k", value AnyValue{string_value "v"}} */
      0x4a, 0x08, 0x0a, 0x01, 'k', 0x12, 0x03, 0x0a, 0x01, 'v',
      /* attributes (9): KeyValue{key "n", value AnyValue{int_value 300}} */
      0x4a, 0x08, 0x0a, 0x01, 'n', 0x12, 0x03, 0x18, 0xac, 0x02,
      /* links (13): Link{trace_id, span_id} */
      0x6a, 0x1c, 0x0a, 0x10, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11,
      0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x12, 0x08, 0x22, 0x22,
      0x22, 0x22, 0x22, 0x22, 0x22, 0x22,
      /* status (15): Status{message "bad" (2), code ERROR (3) = 2} */
      0x7a, 0x07, 0x12, 0x03, 'b', 'a', 'd', 0x18, 0x02,
      /* flags (16, fixed32) = 1: tag (16 << 3 | 5) = 0x85 0x01 */
      0x85, 0x01, 0x01, 0x00, 0x00, 0x00};
  pr_span_t *s = fixed_span();
  pr__otel_buf_t b = {0};
  pr__otel_resource_t res;
  char err[200];
  (void)state;
  pr__otel_pb_span(&b, s);
  assert_false(b.oom);
  assert_int_equal(b.len, sizeof want);
  assert_memory_equal(b.p, want, sizeof want);

  /* The whole request holds the span, after the resource and scope. */
  {
    pr__otel_buf_t r = {0};
    pr_span_t *arr[1] = {s};
    const uint8_t *hit = NULL;
    assert_int_equal(
        pr__otel_resource_parse("svc", NULL, &res, err, sizeof err), 0);
    assert_int_equal(pr__otel_encode_pb(&res, arr, 1, &r), 0);
    assert_int_equal(r.p[0], 0x0a); /* resource_spans (1) */
    for (size_t i = 0; i + sizeof want <= r.len; i++)
      if (!memcmp(r.p + i, want, sizeof want))
        hit = r.p + i;
    assert_non_null(hit);
    /* ...preceded by ScopeSpans.spans (2) and its length. */
    assert_int_equal(hit[-2], 0x12);
    assert_int_equal(hit[-1], sizeof want);
    assert_non_null(memmem(r.p, r.len, "prosody-c", 9));
    assert_non_null(memmem(r.p, r.len, "svc", 3));
    free(r.p);
    pr__otel_resource_free(&res);
  }
  free(b.p);
  free_fixed(s);
}

static const char *jstr(json_t *o, const char *k) {
  json_t *v = json_object_get(o, k);
  assert_non_null(v);
  assert_true(json_is_string(v));
  return json_string_value(v);
}

static void test_span_json(void **state) {
  pr_span_t *s = fixed_span();
  pr_span_t *arr[1] = {s};
  pr__otel_resource_t res;
  char err[200], *text;
  json_t *root, *rs, *sp, *a, *st, *l;
  json_error_t je;
  (void)state;
  assert_int_equal(pr__otel_resource_parse(NULL, "deployment.environment=test",
                                           &res, err, sizeof err),
                   0);
  text = pr__otel_encode_json(&res, arr, 1);
  assert_non_null(text);
  root = json_loads(text, 0, &je);
  assert_non_null(root);
  rs = json_array_get(json_object_get(root, "resourceSpans"), 0);
  assert_non_null(rs);
  a = json_object_get(json_object_get(rs, "resource"), "attributes");
  assert_int_equal(json_array_size(a), 4);
  assert_string_equal(jstr(json_array_get(a, 0), "key"), "service.name");
  assert_string_equal(
      jstr(json_object_get(json_array_get(a, 0), "value"), "stringValue"),
      "prosody");
  assert_string_equal(jstr(json_array_get(a, 3), "key"),
                      "deployment.environment");
  assert_string_equal(
      jstr(json_object_get(json_array_get(a, 3), "value"), "stringValue"),
      "test");
  {
    json_t *ss = json_array_get(json_object_get(rs, "scopeSpans"), 0);
    assert_string_equal(jstr(json_object_get(ss, "scope"), "name"), "prosody");
    sp = json_array_get(json_object_get(ss, "spans"), 0);
  }
  assert_non_null(sp);
  assert_string_equal(jstr(sp, "traceId"), "0102030405060708090a0b0c0d0e0f10");
  assert_string_equal(jstr(sp, "spanId"), "a1a2a3a4a5a6a7a8");
  assert_string_equal(jstr(sp, "parentSpanId"), "3333333333333333");
  assert_null(json_object_get(sp, "traceState"));
  assert_string_equal(jstr(sp, "name"), "op");
  assert_int_equal(json_integer_value(json_object_get(sp, "kind")), 4);
  assert_int_equal(json_integer_value(json_object_get(sp, "flags")), 1);
  assert_string_equal(jstr(sp, "startTimeUnixNano"), "72623859790382856");
  assert_string_equal(jstr(sp, "endTimeUnixNano"), "1230066625199609624");
  a = json_object_get(sp, "attributes");
  assert_int_equal(json_array_size(a), 2);
  assert_string_equal(jstr(json_array_get(a, 0), "key"), "k");
  assert_string_equal(
      jstr(json_object_get(json_array_get(a, 0), "value"), "stringValue"), "v");
  assert_string_equal(jstr(json_array_get(a, 1), "key"), "n");
  assert_string_equal(
      jstr(json_object_get(json_array_get(a, 1), "value"), "intValue"), "300");
  l = json_array_get(json_object_get(sp, "links"), 0);
  assert_string_equal(jstr(l, "traceId"), "11111111111111111111111111111111");
  assert_string_equal(jstr(l, "spanId"), "2222222222222222");
  st = json_object_get(sp, "status");
  assert_string_equal(jstr(st, "message"), "bad");
  assert_int_equal(json_integer_value(json_object_get(st, "code")), 2);
  json_decref(root);
  free(text);

  /* A negative int64 stays signed; no status when not failed. */
  s->attrs[1].i = -5;
  s->error = false;
  text = pr__otel_encode_json(&res, arr, 1);
  root = json_loads(text, 0, &je);
  sp = json_array_get(
      json_object_get(
          json_array_get(
              json_object_get(
                  json_array_get(json_object_get(root, "resourceSpans"), 0),
                  "scopeSpans"),
              0),
          "spans"),
      0);
  a = json_object_get(sp, "attributes");
  assert_string_equal(
      jstr(json_object_get(json_array_get(a, 1), "value"), "intValue"), "-5");
  assert_null(json_object_get(sp, "status"));
  json_decref(root);
  free(text);
  pr__otel_resource_free(&res);
  free_fixed(s);
}

static const char *res_get(const pr__otel_resource_t *r, const char *k) {
  for (size_t i = 0; i < r->n; i++)
    if (!strcmp(r->kv[i].key, k))
      return r->kv[i].value;
  return NULL;
}

static void test_resource_attributes(void **state) {
  pr__otel_resource_t r;
  char err[200];
  (void)state;
  assert_int_equal(
      pr__otel_resource_parse("svc",
                              " a=b ,, c = d%2Ce%20f ,service.name=x,a=z,"
                              "k%3D=%e2%82%ac",
                              &r, err, sizeof err),
      0);
  assert_string_equal(r.kv[0].key, "service.name");
  assert_string_equal(res_get(&r, "service.name"), "svc");
  assert_string_equal(res_get(&r, "telemetry.sdk.name"), "prosody-c");
  assert_string_equal(res_get(&r, "telemetry.sdk.language"), "c");
  assert_string_equal(res_get(&r, "a"), "z");
  assert_string_equal(res_get(&r, "c"), "d,e f");
  assert_string_equal(res_get(&r, "k="), "\xe2\x82\xac");
  assert_int_equal(r.n, 6);
  pr__otel_resource_free(&r);

  assert_int_equal(pr__otel_resource_parse(NULL, "", &r, err, sizeof err), 0);
  assert_string_equal(res_get(&r, "service.name"), "prosody");
  assert_int_equal(r.n, 3);
  pr__otel_resource_free(&r);

  static const char *bad[] = {"novalue", "a=b,=x", "a=%zz", "a=%4", "a=b, c"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    err[0] = 0;
    assert_int_equal(pr__otel_resource_parse(NULL, bad[i], &r, err, sizeof err),
                     -1);
    assert_non_null(strstr(err, "OTEL_RESOURCE_ATTRIBUTES"));
  }
}

static int nonzero(const uint8_t *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (p[i])
      return 1;
  return 0;
}

static void test_ids_and_relations(void **state) {
  enum { N = 2000 };
  pr_otel_config_t cfg = {.endpoint = "http://127.0.0.1:9/"};
  char err[200];
  pr_otel_t *o = pr__otel_open(&cfg, err, sizeof err);
  static uint8_t traces[N][16], spans[N][8];
  pr_span_ctx_t from;
  pr_span_t *s;
  (void)state;
  assert_non_null(o);
  for (int i = 0; i < N; i++) {
    s = pr__span_start(o, "x", PR_SPAN_INTERNAL, NULL, PR_SPAN_CHILD, NULL);
    assert_non_null(s);
    assert_true(pr__span_ctx(s)->valid);
    assert_int_equal(pr__span_ctx(s)->flags, 1); /* a root: sampled */
    memcpy(traces[i], pr__span_ctx(s)->trace_id, 16);
    memcpy(spans[i], pr__span_ctx(s)->span_id, 8);
    assert_true(nonzero(traces[i], 16));
    assert_true(nonzero(spans[i], 8));
    assert_true(s->start_ns > 1700000000ULL * 1000000000ULL); /* epoch ns */
    pr__span_discard(s);
  }
  for (int i = 0; i < N; i++)
    for (int j = i + 1; j < N; j++) {
      assert_memory_not_equal(traces[i], traces[j], 16);
      assert_memory_not_equal(spans[i], spans[j], 8);
    }

  assert_int_equal(pr__span_ctx_parse(TP, SIZE_MAX, &from), 0);
  from.flags = 0; /* not sampled: kept by both relations */
  s = pr__span_start(o, "child", PR_SPAN_CONSUMER, &from, PR_SPAN_CHILD, "a=b");
  assert_memory_equal(s->ctx.trace_id, from.trace_id, 16);
  assert_memory_not_equal(s->ctx.span_id, from.span_id, 8);
  assert_true(s->has_parent);
  assert_memory_equal(s->parent_id, from.span_id, 8);
  assert_false(s->link.valid);
  assert_int_equal(s->ctx.flags, 0);
  assert_string_equal(s->tracestate, "a=b");
  pr__span_discard(s);
  s = pr__span_start(o, "ff", PR_SPAN_CONSUMER, &from, PR_SPAN_FOLLOWS_FROM,
                     NULL);
  assert_memory_not_equal(s->ctx.trace_id, from.trace_id, 16);
  assert_false(s->has_parent);
  assert_true(s->link.valid);
  assert_memory_equal(s->link.trace_id, from.trace_id, 16);
  assert_memory_equal(s->link.span_id, from.span_id, 8);
  assert_int_equal(s->ctx.flags, 0);
  /* Strings are kept valid UTF-8 (a receiver rejects a whole request
   * otherwise): a stray byte becomes U+FFFD, a valid sequence stays. */
  pr__span_attr_str(s, "bin", "a\xff\xc3\xa9\xe2\x82", 6);
  assert_string_equal(s->attrs[0].s,
                      "a\xef\xbf\xbd\xc3\xa9\xef\xbf\xbd\xef\xbf\xbd");
  assert_int_equal(s->attrs[0].slen, 12);
  pr__span_set_error(s, "bad \x80");
  assert_string_equal(s->status_msg, "bad \xef\xbf\xbd");
  /* Attributes beyond 16 are ignored. */
  for (int i = 0; i < 20; i++)
    pr__span_attr_int(s, "i", i);
  pr__span_attr_str(s, "s", "x", SIZE_MAX);
  assert_int_equal(s->nattrs, 16);
  pr__span_discard(s);

  /* A fork() child does not repeat its parent's ids. */
  {
    int fds[2];
    uint8_t mine[8], childs[8];
    pid_t pid;
    s = pr__span_start(o, "seed", PR_SPAN_INTERNAL, NULL, PR_SPAN_CHILD, NULL);
    pr__span_discard(s);
    assert_int_equal(pipe(fds), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
      s = pr__span_start(o, "c", PR_SPAN_INTERNAL, NULL, PR_SPAN_CHILD, NULL);
      _exit(write(fds[1], s->ctx.span_id, 8) == 8 ? 0 : 1);
    }
    s = pr__span_start(o, "p", PR_SPAN_INTERNAL, NULL, PR_SPAN_CHILD, NULL);
    memcpy(mine, s->ctx.span_id, 8);
    pr__span_discard(s);
    assert_int_equal(read(fds[0], childs, 8), 8);
    waitpid(pid, NULL, 0);
    close(fds[0]);
    close(fds[1]);
    assert_memory_not_equal(mine, childs, 8);
  }

  /* NULL everywhere does nothing. */
  assert_null(
      pr__span_start(NULL, "x", PR_SPAN_INTERNAL, NULL, PR_SPAN_CHILD, NULL));
  assert_null(pr__span_ctx(NULL));
  pr__span_attr_str(NULL, "k", "v", SIZE_MAX);
  pr__span_attr_int(NULL, "k", 1);
  pr__span_set_error(NULL, "x");
  pr__span_end(NULL);
  pr__span_discard(NULL);
  pr__otel_close(NULL, 0);
  pr__otel_close(o, 100);

  /* Bad settings name the option. */
  cfg.endpoint = "localhost:4318";
  assert_null(pr__otel_open(&cfg, err, sizeof err));
  assert_non_null(strstr(err, "otel_exporter_otlp_endpoint"));
  cfg.endpoint = "http://127.0.0.1:9";
  cfg.resource_attributes = "broken";
  assert_null(pr__otel_open(&cfg, err, sizeof err));
  assert_non_null(strstr(err, "OTEL_RESOURCE_ATTRIBUTES"));
}

/* One case of pr__otel_target. */
static void target(const char *endpoint, pr_otlp_protocol_t proto, bool http2,
                   const char *want_url, pr_otlp_protocol_t want_used,
                   bool want_warn) {
  char *url = NULL, warn[512] = "x";
  pr_otlp_protocol_t used;
  assert_int_equal(
      pr__otel_target(endpoint, proto, http2, &url, &used, warn, sizeof warn),
      0);
  assert_string_equal(url, want_url);
  assert_int_equal(used, want_used);
  if (want_warn) {
    /* Names the setting and where the spans go instead. */
    assert_non_null(strstr(warn, "OTEL_EXPORTER_OTLP_PROTOCOL"));
    assert_non_null(strstr(warn, "no HTTP/2"));
    assert_non_null(strstr(warn, want_url));
  } else {
    assert_string_equal(warn, "");
  }
  free(url);
}

static void test_target(void **state) {
  const pr_otlp_protocol_t P = PR_OTLP_HTTP_PROTOBUF, J = PR_OTLP_HTTP_JSON,
                           G = PR_OTLP_GRPC;
  (void)state;
  /* OTLP/HTTP: <base>/v1/traces, one trailing slash dropped. */
  target("http://c:4318", P, true, "http://c:4318/v1/traces", P, false);
  target("http://c:4318/", J, true, "http://c:4318/v1/traces", J, false);
  target("https://c/otlp", P, false, "https://c/otlp/v1/traces", P, false);
  /* gRPC: scheme and authority, then the service's method; a path, query
   * or trailing slash of the endpoint is not part of it. */
  target("http://localhost:4317", G, true,
         "http://localhost:4317" PR_OTLP_GRPC_PATH, G, false);
  target("https://c.example:443/ignored/", G, true,
         "https://c.example:443" PR_OTLP_GRPC_PATH, G, false);
  target("http://[::1]:4317?x=1", G, true,
         "http://[::1]:4317" PR_OTLP_GRPC_PATH, G, false);
  /* Without HTTP/2: http/protobuf, on 4318 when the endpoint said 4317. */
  target("http://localhost:4317", G, false, "http://localhost:4318/v1/traces",
         P, true);
  target("http://localhost:4317/", G, false, "http://localhost:4318/v1/traces",
         P, true);
  target("http://[::1]:4317", G, false, "http://[::1]:4318/v1/traces", P, true);
  target("http://c:14317", G, false, "http://c:14317/v1/traces", P, true);
  target("http://c:9000/base", G, false, "http://c:9000/base/v1/traces", P,
         true);
  target("http://c", G, false, "http://c/v1/traces", P, true);
}

/* A gRPC message: 0 (no compression), the length big-endian, then the very
 * protobuf of pr__otel_encode_pb. */
static void test_grpc_framing(void **state) {
  pr_otel_t *o;
  pr_span_t *spans[40];
  pr__otel_resource_t res;
  pr__otel_buf_t pb = {0}, g = {0};
  char err[256];
  pr_otel_config_t cfg = {.endpoint = "http://127.0.0.1:9"};
  (void)state;
  assert_int_equal(pr__otel_resource_parse("svc", NULL, &res, err, sizeof err),
                   0);
  o = pr__otel_open(&cfg, err, sizeof err);
  assert_non_null(o);
  for (int i = 0; i < 40; i++) { /* > 256 bytes: a length over one byte */
    spans[i] =
        pr__span_start(o, "s", PR_SPAN_INTERNAL, NULL, PR_SPAN_CHILD, NULL);
    pr__span_attr_int(spans[i], "i", i);
  }
  assert_int_equal(pr__otel_encode_pb(&res, spans, 40, &pb), 0);
  assert_int_equal(pr__otel_encode_grpc(&res, spans, 40, &g), 0);
  assert_true(pb.len > 256);
  assert_int_equal(g.len, pb.len + 5);
  assert_int_equal(g.p[0], 0);
  assert_int_equal(((size_t)g.p[1] << 24 | (size_t)g.p[2] << 16 |
                    (size_t)g.p[3] << 8 | g.p[4]),
                   pb.len);
  /* The same spans encoded twice: the bytes agree. */
  assert_memory_equal(g.p + 5, pb.p, pb.len);
  for (int i = 0; i < 40; i++)
    pr__span_discard(spans[i]);
  free(pb.p);
  free(g.p);
  pr__otel_resource_free(&res);
  pr__otel_close(o, 100);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_target),
      cmocka_unit_test(test_grpc_framing),
      cmocka_unit_test(test_traceparent),
      cmocka_unit_test(test_span_protobuf),
      cmocka_unit_test(test_span_json),
      cmocka_unit_test(test_resource_attributes),
      cmocka_unit_test(test_ids_and_relations),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
