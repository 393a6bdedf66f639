/*
 * test_otel_jaeger.c - the OTLP exporter (src/otel/) against a real Jaeger
 * (scripts/services/jaeger; the real tier starts it): OTLP/HTTP on
 * 127.0.0.1:4318, OTLP/gRPC on 127.0.0.1:4317, Jaeger's v1 HTTP query API
 * on 127.0.0.1:16686 (PROSODY_TEST_JAEGER_OTLP, PROSODY_TEST_JAEGER_GRPC and
 * PROSODY_TEST_JAEGER_QUERY override them; PROSODY_TEST_JAEGER_QUERY_GRPC
 * the query API's gRPC port).
 *
 * Once over http/protobuf, once over http/json and once over grpc (h2c;
 * each with a service name of its own): a root PRODUCER span, a CONSUMER child
 * of it (failed, with a tracestate), and a span that FOLLOWS_FROM the child (a
 * new trace with a link). Then each trace is read back from Jaeger (polled,
 * bounded) and checked: span names, the CHILD_OF reference, the FOLLOWS_FROM
 * reference of the linked span, tags with their types and values (span.kind,
 * the error status), the process's service name and the resource attributes as
 * process tags. And a gRPC server that is no OTLP collector (Jaeger's own query
 * API on 127.0.0.1:16685 answers UNIMPLEMENTED): the batch is counted as a
 * failed request, not as exported.
 *
 * Threads: the main thread only (the exporter has its own).
 */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <jansson.h>

#include "harness.h"
#include "jaeger.h"
#include "otel/otel.h"

static void hex(const uint8_t *p, size_t n, char *out) {
  for (size_t i = 0; i < n; i++)
    sprintf(out + 2 * i, "%02x", p[i]);
  out[2 * n] = 0;
}

/* GET <query>/api/traces/<id> until the trace holds `want` spans (at most
 * 20 s); the trace (data[0]), owned by the caller. */
static json_t *get_trace(const char *query, const char *trace_hex,
                         size_t want) {
  char url[256];
  double deadline = t_now() + 20;
  snprintf(url, sizeof url, "%s/api/traces/%s", query, trace_hex);
  for (;;) {
    long code = 0;
    json_t *root = t_get_json(url, &code);
    json_t *t = json_array_get(json_object_get(root, "data"), 0);
    if (t && json_array_size(json_object_get(t, "spans")) >= want) {
      json_incref(t);
      json_decref(root);
      return t;
    }
    json_decref(root);
    CHECK(t_now() < deadline,
          "trace %s did not reach %zu spans in Jaeger within 20 s (last HTTP "
          "%ld)",
          trace_hex, want, code);
    usleep(200000);
  }
}

static json_t *span_named(json_t *trace, const char *name) {
  size_t i;
  json_t *s;
  json_array_foreach(json_object_get(trace, "spans"), i, s) {
    if (!strcmp(json_string_value(json_object_get(s, "operationName")), name))
      return s;
  }
  CHECK(0, "no span named \"%s\" in the trace", name);
  return NULL;
}

/* The tag `key` of a tag list: its value, and its type in *type. */
static json_t *tag(json_t *tags, const char *key, const char **type) {
  size_t i;
  json_t *t;
  json_array_foreach(tags, i, t) {
    if (!strcmp(json_string_value(json_object_get(t, "key")), key)) {
      if (type)
        *type = json_string_value(json_object_get(t, "type"));
      return json_object_get(t, "value");
    }
  }
  return NULL;
}

static void check_str_tag(json_t *tags, const char *key, const char *want) {
  const char *type = NULL;
  json_t *v = tag(tags, key, &type);
  CHECK(v, "no tag %s", key);
  CHECK(!strcmp(type, "string"), "tag %s has type %s", key, type);
  CHECK(!strcmp(json_string_value(v), want), "tag %s = \"%s\", want \"%s\"",
        key, json_string_value(v), want);
}

static void check_int_tag(json_t *tags, const char *key, int64_t want) {
  const char *type = NULL;
  json_t *v = tag(tags, key, &type);
  CHECK(v, "no tag %s", key);
  CHECK(!strcmp(type, "int64"), "tag %s has type %s", key, type);
  CHECK(json_integer_value(v) == want, "tag %s = %" JSON_INTEGER_FORMAT, key,
        json_integer_value(v));
}

/* The one reference of span `s` of type `ref` (CHILD_OF, FOLLOWS_FROM). */
static void check_ref(json_t *s, const char *ref, const char *trace_hex,
                      const char *span_hex) {
  size_t i;
  json_t *r;
  json_array_foreach(json_object_get(s, "references"), i, r) {
    if (!strcmp(json_string_value(json_object_get(r, "refType")), ref) &&
        !strcmp(json_string_value(json_object_get(r, "traceID")), trace_hex) &&
        !strcmp(json_string_value(json_object_get(r, "spanID")), span_hex))
      return;
  }
  CHECK(0, "span %s has no %s reference to %s/%s",
        json_string_value(json_object_get(s, "operationName")), ref, trace_hex,
        span_hex);
}

static json_t *process_of(json_t *trace, json_t *span) {
  const char *pid = json_string_value(json_object_get(span, "processID"));
  return json_object_get(json_object_get(trace, "processes"), pid);
}

static const char *const proto_names[] = {"protobuf", "json", "grpc"};

static void run(const char *otlp, const char *query, pr_otlp_protocol_t proto) {
  char service[64], err[256];
  char root_trace[33], root_span[17], child_span[17], ff_trace[33];
  pr_otel_stats_t st;
  pr_otel_t *o;
  pr_span_t *root, *child, *ff;
  json_t *trace, *s, *proc, *v;
  const char *type;
  snprintf(service, sizeof service, "prosody-otel-test-%s-%d",
           proto_names[proto], (int)getpid());
  pr_otel_config_t cfg = {
      .endpoint = otlp,
      .protocol = proto,
      .service_name = service,
      .resource_attributes =
          "deployment.environment=otel%20test, team = core%2Cplatform",
      .delay_ms = 50,
      .timeout_ms = 5000};
  o = pr__otel_open(&cfg, err, sizeof err);
  CHECK(o, "%s", err);

  root = pr__span_start(o, "orders send", PR_SPAN_PRODUCER, NULL, PR_SPAN_CHILD,
                        NULL);
  pr__span_attr_str(root, "messaging.destination.name", "orders", SIZE_MAX);
  pr__span_attr_int(root, "messaging.kafka.partition", 3);
  child = pr__span_start(o, "orders process", PR_SPAN_CONSUMER,
                         pr__span_ctx(root), PR_SPAN_CHILD, "vendor=x");
  pr__span_attr_str(child, "messaging.kafka.message.key", "key-1", SIZE_MAX);
  pr__span_attr_int(child, "messaging.kafka.offset", -42);
  pr__span_set_error(child, "handler failed");
  ff = pr__span_start(o, "timer fire", PR_SPAN_INTERNAL, pr__span_ctx(child),
                      PR_SPAN_FOLLOWS_FROM, NULL);
  pr__span_attr_int(ff, "prosody.timer.time", 1700000000000);
  hex(pr__span_ctx(root)->trace_id, 16, root_trace);
  hex(pr__span_ctx(root)->span_id, 8, root_span);
  hex(pr__span_ctx(child)->span_id, 8, child_span);
  hex(pr__span_ctx(ff)->trace_id, 16, ff_trace);
  CHECK(strcmp(root_trace, ff_trace), "follows-from kept the trace id");
  pr__span_end(ff);
  pr__span_end(child);
  pr__span_end(root);
  CHECK(pr__otel_flush(o, 10000) == 0, "flush timed out");
  pr__otel_stats(o, &st);
  CHECK(st.exported == 3 && st.dropped == 0 && st.failed_requests == 0,
        "exported %" PRIu64 " dropped %" PRIu64 " failed %" PRIu64, st.exported,
        st.dropped, st.failed_requests);
  /* Many more, in several batches (512 spans per request at most). */
  for (int i = 0; i < 1500; i++) {
    pr_span_t *b =
        pr__span_start(o, "bulk", PR_SPAN_INTERNAL, NULL, PR_SPAN_CHILD, NULL);
    pr__span_attr_int(b, "i", i);
    pr__span_attr_str(b, "padding", "0123456789abcdefghijklmnopqrstuvwxyz",
                      SIZE_MAX);
    pr__span_end(b);
  }
  CHECK(pr__otel_flush(o, 20000) == 0, "flush of 1500 spans timed out");
  pr__otel_stats(o, &st);
  CHECK(st.exported == 1503 && st.dropped == 0 && st.failed_requests == 0,
        "exported %" PRIu64 " dropped %" PRIu64 " failed %" PRIu64, st.exported,
        st.dropped, st.failed_requests);
  pr__otel_close(o, 1000);
  printf("%s: exported 1503 spans (traces %s, %s)\n", service, root_trace,
         ff_trace);

  /* The first trace: the root and its child. */
  trace = get_trace(query, root_trace, 2);
  CHECK(json_array_size(json_object_get(trace, "spans")) == 2, "%zu spans",
        json_array_size(json_object_get(trace, "spans")));
  s = span_named(trace, "orders send");
  CHECK(!strcmp(json_string_value(json_object_get(s, "spanID")), root_span),
        "root span id");
  CHECK(json_array_size(json_object_get(s, "references")) == 0,
        "the root has references");
  check_str_tag(json_object_get(s, "tags"), "span.kind", "producer");
  check_str_tag(json_object_get(s, "tags"), "messaging.destination.name",
                "orders");
  check_int_tag(json_object_get(s, "tags"), "messaging.kafka.partition", 3);
  CHECK(!tag(json_object_get(s, "tags"), "error", NULL), "root has error");
  proc = process_of(trace, s);
  CHECK(proc, "no process");
  CHECK(
      !strcmp(json_string_value(json_object_get(proc, "serviceName")), service),
      "serviceName %s",
      json_string_value(json_object_get(proc, "serviceName")));
  check_str_tag(json_object_get(proc, "tags"), "deployment.environment",
                "otel test");
  check_str_tag(json_object_get(proc, "tags"), "team", "core,platform");
  check_str_tag(json_object_get(proc, "tags"), "telemetry.sdk.name",
                "prosody-c");
  check_str_tag(json_object_get(proc, "tags"), "telemetry.sdk.language", "c");

  s = span_named(trace, "orders process");
  CHECK(!strcmp(json_string_value(json_object_get(s, "spanID")), child_span),
        "child span id");
  check_ref(s, "CHILD_OF", root_trace, root_span);
  check_str_tag(json_object_get(s, "tags"), "span.kind", "consumer");
  check_str_tag(json_object_get(s, "tags"), "messaging.kafka.message.key",
                "key-1");
  check_int_tag(json_object_get(s, "tags"), "messaging.kafka.offset", -42);
  check_str_tag(json_object_get(s, "tags"), "otel.status_code", "ERROR");
  check_str_tag(json_object_get(s, "tags"), "otel.status_description",
                "handler failed");
  check_str_tag(json_object_get(s, "tags"), "w3c.tracestate", "vendor=x");
  v = tag(json_object_get(s, "tags"), "error", &type);
  CHECK(v && !strcmp(type, "bool") && json_is_true(v), "error tag");
  CHECK(json_integer_value(json_object_get(s, "duration")) >= 0, "duration");
  /* Epoch nanoseconds arrive as Jaeger's epoch microseconds. */
  {
    int64_t us = json_integer_value(json_object_get(s, "startTime"));
    int64_t wall = (int64_t)time(NULL) * 1000000;
    CHECK(us > wall - 600000000LL && us <= wall + 1000000,
          "startTime %" PRId64 " us is not about now (%" PRId64 ")", us, wall);
  }
  check_str_tag(json_object_get(s, "tags"), "otel.scope.name", "prosody");
  json_decref(trace);

  /* The second: the follows-from span, alone, linked to the child. */
  trace = get_trace(query, ff_trace, 1);
  CHECK(json_array_size(json_object_get(trace, "spans")) == 1, "%zu spans",
        json_array_size(json_object_get(trace, "spans")));
  s = span_named(trace, "timer fire");
  check_ref(s, "FOLLOWS_FROM", root_trace, child_span);
  CHECK(json_array_size(json_object_get(s, "references")) == 1,
        "%zu references", json_array_size(json_object_get(s, "references")));
  check_str_tag(json_object_get(s, "tags"), "span.kind", "internal");
  check_int_tag(json_object_get(s, "tags"), "prosody.timer.time",
                1700000000000);
  proc = process_of(trace, s);
  CHECK(
      !strcmp(json_string_value(json_object_get(proc, "serviceName")), service),
      "serviceName");
  json_decref(trace);
  printf("%s: Jaeger shows both traces as expected\n", service);
}

/* A gRPC server without the OTLP trace service: grpc-status UNIMPLEMENTED
 * (12) in an HTTP 200 answer must count as a failure. */
static void run_not_otlp(const char *grpc_other) {
  char err[256];
  pr_otel_stats_t st;
  pr_otel_config_t cfg = {.endpoint = grpc_other,
                          .protocol = PR_OTLP_GRPC,
                          .delay_ms = 50,
                          .timeout_ms = 5000};
  pr_otel_t *o = pr__otel_open(&cfg, err, sizeof err);
  CHECK(o, "%s", err);
  pr__span_end(
      pr__span_start(o, "lost", PR_SPAN_INTERNAL, NULL, PR_SPAN_CHILD, NULL));
  CHECK(pr__otel_flush(o, 10000) == 0, "flush timed out");
  pr__otel_stats(o, &st);
  CHECK(st.exported == 0 && st.dropped == 1 && st.failed_requests == 1,
        "a server without TraceService: exported %" PRIu64 " dropped %" PRIu64
        " failed %" PRIu64,
        st.exported, st.dropped, st.failed_requests);
  pr__otel_close(o, 1000);
  printf("grpc to %s (no TraceService): counted as a failed request\n",
         grpc_other);
}

/* Exports over `proto` and reads back (not_otlp: to a gRPC server without
 * the trace service instead). */
static void export_and_read_back(pr_otlp_protocol_t proto, int not_otlp) {
  const char *otlp = getenv("PROSODY_TEST_JAEGER_OTLP");
  const char *grpc = getenv("PROSODY_TEST_JAEGER_GRPC");
  const char *grpc_other = getenv("PROSODY_TEST_JAEGER_QUERY_GRPC");
  const char *query = getenv("PROSODY_TEST_JAEGER_QUERY");
  if (!otlp)
    otlp = "http://127.0.0.1:4318/";
  if (!grpc)
    grpc = "http://127.0.0.1:4317";
  if (!grpc_other)
    grpc_other = "http://127.0.0.1:16685";
  if (!query)
    query = "http://127.0.0.1:16686";
  curl_global_init(CURL_GLOBAL_ALL);
  if (proto == PR_OTLP_GRPC)
    CHECK(curl_version_info(CURLVERSION_NOW)->features & CURL_VERSION_HTTP2,
          "this libcurl (%s) has no HTTP/2: OTLP/gRPC cannot be tested",
          curl_version());
  if (not_otlp)
    run_not_otlp(grpc_other);
  else
    run(proto == PR_OTLP_GRPC ? grpc : otlp, query, proto);
  curl_global_cleanup();
}

T_SCENARIO(protobuf_spans_links_and_tags_read_back_from_jaeger, T_REAL, 90) {
  export_and_read_back(PR_OTLP_HTTP_PROTOBUF, 0);
  return 0;
}

T_SCENARIO(json_spans_links_and_tags_read_back_from_jaeger, T_REAL, 90) {
  export_and_read_back(PR_OTLP_HTTP_JSON, 0);
  return 0;
}

T_SCENARIO(grpc_spans_links_and_tags_read_back_from_jaeger, T_REAL, 90) {
  export_and_read_back(PR_OTLP_GRPC, 0);
  return 0;
}

T_SCENARIO(grpc_server_without_trace_service_counts_as_failed, T_REAL, 60) {
  export_and_read_back(PR_OTLP_GRPC, 1);
  return 0;
}
