/*
 * otel_int.h - the inside of otel.c shared with encode.c and the unit
 * tests: the span structure, the resource, and the two OTLP encoders.
 *
 * Threads: the encoders and the resource parser are pure functions of
 * their arguments; the exporter thread calls them on spans it owns.
 */
#ifndef PR_OTEL_INT_H
#define PR_OTEL_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "otel.h"

#define PR_SPAN_ATTR_MAX 16

typedef struct pr_span_attr {
  const char *key; /* a literal, outlives the span */
  bool is_str;
  char *s; /* copied string value (is_str) */
  size_t slen;
  int64_t i; /* integer value (!is_str) */
} pr_span_attr_t;

/* One span. Owned by one thread at a time (see otel.h); once ended, by the
 * exporter (queue under pr_otel_t.lock, then the exporter thread). */
struct pr_span {
  pr_otel_t *exp;
  pr_span_ctx_t ctx; /* own trace id, span id, flags */
  bool has_parent;
  uint8_t parent_id[PR_SPAN_ID_LEN];
  pr_span_ctx_t link; /* valid: one link (FOLLOWS_FROM) */
  const char *name;
  pr_span_kind_t kind;
  char *tracestate;          /* NULL: none */
  uint64_t start_ns, end_ns; /* Unix epoch nanoseconds */
  pr_span_attr_t attrs[PR_SPAN_ATTR_MAX];
  int nattrs;
  bool error;
  char *status_msg; /* NULL: none */
  /* Queue bookkeeping (the exporter's lock). */
  struct pr_span *next;
  uint64_t seq;        /* order of pr__span_end() calls, from 1 */
  int64_t enqueued_ns; /* monotonic */
};

/* A resource attribute (both strings owned). */
typedef struct pr__otel_kv {
  char *key;
  char *value;
} pr__otel_kv_t;

typedef struct pr__otel_resource {
  pr__otel_kv_t *kv; /* service.name first, then telemetry.sdk.*, then the
                        resource_attributes in their order */
  size_t n;
} pr__otel_resource_t;

/* Builds the resource from the service name (NULL: "prosody") and an
 * OTEL_RESOURCE_ATTRIBUTES string (NULL or empty: none): comma-separated
 * key=value entries, each trimmed of spaces and tabs, values
 * percent-decoded; empty entries are skipped; an entry without '=', with
 * an empty key or a bad percent escape is an error (named after
 * OTEL_RESOURCE_ATTRIBUTES in `err`). A key given twice keeps the last
 * value; service.name in the attributes is overridden by the service name.
 * 0, or -1 (nothing to free). */
int pr__otel_resource_parse(const char *service_name, const char *attrs,
                            pr__otel_resource_t *out, char *err,
                            size_t err_size);
void pr__otel_resource_free(pr__otel_resource_t *r);

/* A growable byte buffer; `oom` is set (and stays) when memory ran out. */
typedef struct pr__otel_buf {
  uint8_t *p;
  size_t len, cap;
  bool oom;
} pr__otel_buf_t;

/* Appends one Span message (its fields, without an outer tag) to `b`. */
void pr__otel_pb_span(pr__otel_buf_t *b, const pr_span_t *s);
/* A whole ExportTraceServiceRequest for `n` spans, protobuf; 0, or -1 when
 * out of memory. */
int pr__otel_encode_pb(const pr__otel_resource_t *res, pr_span_t *const *spans,
                       size_t n, pr__otel_buf_t *out);
/* The same as one gRPC message: a 5-byte prefix (0: not compressed, then
 * the length, big-endian) and the protobuf. */
int pr__otel_encode_grpc(const pr__otel_resource_t *res,
                         pr_span_t *const *spans, size_t n,
                         pr__otel_buf_t *out);
/* The same as OTLP/JSON (NUL-terminated, malloc'd), or NULL when out of
 * memory. */
char *pr__otel_encode_json(const pr__otel_resource_t *res,
                           pr_span_t *const *spans, size_t n);

/* Where and how an exporter sends, from its settings: `*url` (malloc'd) and
 * `*used`, the protocol it will speak. http/protobuf and http/json:
 * <endpoint>/v1/traces (one
 * trailing '/' of the endpoint dropped). grpc: the endpoint's scheme and
 * authority, then PR_OTLP_GRPC_PATH; when `http2` is false (libcurl was
 * built without it), http/protobuf instead, to the endpoint with port 4317
 * changed to 4318 (OTLP/HTTP's), and `warn` says so (otherwise it is
 * empty). 0, or -1 when out of memory. */
#define PR_OTLP_GRPC_PATH                                                      \
  "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
int pr__otel_target(const char *endpoint, pr_otlp_protocol_t protocol,
                    bool http2, char **url, pr_otlp_protocol_t *used,
                    char *warn, size_t warn_size);

#endif
