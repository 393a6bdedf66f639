/*
 * otel.h - spans and their export over OTLP: protobuf or JSON over HTTP,
 * or gRPC over HTTP/2 (private; issue 16).
 *
 * Threads: a span is started, filled and ended by one thread at a time (the
 * thread that owns the event it describes: the engine thread, a handler
 * thread or the producer's delivery thread; it may be handed from one to the
 * next with the event). pr__span_end() hands it to its client's exporter,
 * which owns it from then on. The exporter is one background thread per
 * client (otel.c) with a bounded queue under one mutex: pr__span_end() never
 * blocks on the network and never waits for room; a full queue drops the
 * span and counts it. Export is off when the client has no OTLP endpoint:
 * pr__otel_open() is then not called, pr__span_start(NULL, ...) returns NULL,
 * and every span function accepts a NULL span and does nothing, so the hot
 * path pays one branch.
 */
#ifndef PR_OTEL_H
#define PR_OTEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PR_TRACE_ID_LEN 16
#define PR_SPAN_ID_LEN 8
/* "00-" + 32 hex + "-" + 16 hex + "-" + 2 hex */
#define PR_TRACEPARENT_LEN 55

/* A W3C trace context (the parts of a traceparent). */
typedef struct pr_span_ctx {
  uint8_t trace_id[PR_TRACE_ID_LEN];
  uint8_t span_id[PR_SPAN_ID_LEN];
  uint8_t flags; /* W3C trace flags; bit 0: sampled */
  bool valid;    /* false: no context (parse failed, or none given) */
} pr_span_ctx_t;

/* Parses a traceparent ("00-<32 hex>-<16 hex>-<2 hex>", lower case; an
 * all-zero trace or span id is invalid). `len` SIZE_MAX: NUL-terminated.
 * 0 and `out` valid, or -1 and `out->valid` false. */
int pr__span_ctx_parse(const char *s, size_t len, pr_span_ctx_t *out);
/* Formats a valid context as a traceparent, NUL-terminated. */
void pr__span_ctx_format(const pr_span_ctx_t *c,
                         char out[PR_TRACEPARENT_LEN + 1]);

/* OTLP's SpanKind values. */
typedef enum pr_span_kind {
  PR_SPAN_INTERNAL = 1,
  PR_SPAN_SERVER = 2,
  PR_SPAN_CLIENT = 3,
  PR_SPAN_PRODUCER = 4,
  PR_SPAN_CONSUMER = 5,
} pr_span_kind_t;

/* How a span relates to the context it was started from (`message_spans`,
 * `timer_spans`). */
typedef enum pr_span_relation {
  PR_SPAN_CHILD,        /* same trace; the context's span is the parent */
  PR_SPAN_FOLLOWS_FROM, /* a new trace, with a link to the context's span */
} pr_span_relation_t;

typedef struct pr_otel pr_otel_t;
typedef struct pr_span pr_span_t;

/* Starts a span named `name` (a string that outlives the span: a literal)
 * at the current time, to be exported by `exp`. With a valid `from`, as
 * `rel` says (and the new span keeps `from`'s flags); without one, the root
 * of a new trace (sampled). `tracestate` (may be NULL) is copied and
 * exported with the span. NULL when `exp` is NULL or memory ran out. */
pr_span_t *pr__span_start(pr_otel_t *exp, const char *name, pr_span_kind_t kind,
                          const pr_span_ctx_t *from, pr_span_relation_t rel,
                          const char *tracestate);
/* The span's own context (to propagate: headers, timer rows, handlers);
 * NULL for a NULL span. */
const pr_span_ctx_t *pr__span_ctx(const pr_span_t *s);
/* Attributes. `key` outlives the span (a literal); a string value is
 * copied (`len` SIZE_MAX: NUL-terminated). A span holds up to 16; more are
 * ignored. */
void pr__span_attr_str(pr_span_t *s, const char *key, const char *v,
                       size_t len);
void pr__span_attr_int(pr_span_t *s, const char *key, int64_t v);
/* Marks the span failed (OTLP status ERROR) with `message` (copied). */
void pr__span_set_error(pr_span_t *s, const char *message);
/* Ends the span now and hands it to its exporter (or drops and counts it
 * when the queue is full). `s` is gone afterwards. */
void pr__span_end(pr_span_t *s);
/* Frees a span without exporting it. */
void pr__span_discard(pr_span_t *s);

/* OTLP's transports, in the order of otel_exporter_otlp_protocol's
 * values. */
typedef enum pr_otlp_protocol {
  PR_OTLP_HTTP_PROTOBUF = 0,
  PR_OTLP_HTTP_JSON = 1,
  PR_OTLP_GRPC = 2,
} pr_otlp_protocol_t;

/* An exporter's settings (from the client's options). */
typedef struct pr_otel_config {
  /* http/protobuf, http/json: a base URL, spans go to
   * <endpoint>/v1/traces; grpc: the
   * collector's scheme, host and port (a path is ignored): h2c with prior
   * knowledge for http://, h2 through ALPN for https://. */
  const char *endpoint;
  pr_otlp_protocol_t protocol; /* grpc without HTTP/2 in libcurl: http/protobuf
                                  (pr__otel_target), with one warning */
  const char *service_name;    /* NULL: "prosody" */
  const char *resource_attributes; /* "k=v,k2=v2" (OTEL_RESOURCE_ATTRIBUTES;
                                      values percent-decoded), or NULL */
  size_t queue_max;                /* spans waiting at most; 0: 2048 */
  size_t batch_max;                /* spans in one request at most; 0: 512 */
  uint32_t delay_ms;   /* a waiting span is sent within this; 0: 1000 */
  uint32_t timeout_ms; /* one request's bound; 0: 10000 */
  bool test_no_http2;  /* tests: act as if libcurl had no HTTP/2 */
} pr_otel_config_t;

/* Starts an exporter and its thread. NULL with the reason in `err` on bad
 * settings (naming the option) or no memory. */
pr_otel_t *pr__otel_open(const pr_otel_config_t *cfg, char *err,
                         size_t err_size);
/* Waits until every span ended before the call has been sent (or dropped),
 * at most `timeout_ms`. 0 if all were, -1 on timeout. For tests and
 * shutdown. */
int pr__otel_flush(pr_otel_t *o, uint32_t timeout_ms);
/* pr__otel_flush() of every open exporter, within `timeout_ms` in all.
 * 0 if all were flushed, -1 on timeout. Any thread. */
int pr__otel_flush_all(uint32_t timeout_ms);
/* Stops tracing for the process: no span starts afterwards (in any
 * exporter, open or opened later), then pr__otel_flush_all(). Any thread;
 * cannot be undone. */
int pr__otel_shutdown_all(uint32_t timeout_ms);
/* Flushes for at most `flush_ms`, stops the thread and frees the exporter;
 * spans still queued then are dropped (and counted). No span of this
 * exporter may be live or ended afterwards. NULL: nothing. */
void pr__otel_close(pr_otel_t *o, uint32_t flush_ms);

typedef struct pr_otel_stats {
  uint64_t exported; /* spans the receiver accepted (HTTP 2xx; gRPC: OK) */
  uint64_t dropped;  /* spans dropped: queue full, request failed, closed */
  uint64_t failed_requests; /* requests that failed (no answer, non-2xx,
                               a grpc-status other than OK) */
} pr_otel_stats_t;
/* A snapshot of the counters; any thread. */
void pr__otel_stats(pr_otel_t *o, pr_otel_stats_t *out);

#endif
