/*
 * trace.c - the spans of events: `receive` (a message's attempt), `trigger`
 * (a timer's attempt), `message.filtered` (a record skipped before its
 * handler), and the trace context a handler runs in (what
 * prosody_message_traceparent() returns, what its sends and timers carry).
 *
 * Threads: pr__trace_start() and pr__trace_filtered() run on the thread
 * about to run the handler (a worker, or the engine thread for an
 * asynchronous handler); pr__trace_end() on the thread that gives the
 * attempt's result, under the attempt's context lock; pr__trace_of() under
 * that lock too (any thread). An inv's `tr` is written only before its
 * handler starts and read while it runs: the attempt's hand-offs (the pool
 * submit, the result's post) order them.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* The record's traceparent and tracestate headers, parsed (the headers are
 * the inv's own while its attempt runs). `ts` gets the tracestate,
 * NUL-terminated, or "" (at most `ts_size` - 1 bytes are kept). */
static void record_ctx(const inv_t *inv, pr_span_ctx_t *from, char *ts,
                       size_t ts_size) {
  const void *v;
  size_t len;
  from->valid = false;
  ts[0] = '\0';
  if (!inv->msg.headers)
    return;
  if (!rd_kafka_header_get_last(inv->msg.headers, "traceparent", &v, &len) && v)
    (void)pr__span_ctx_parse(v, len, from);
  if (from->valid &&
      !rd_kafka_header_get_last(inv->msg.headers, "tracestate", &v, &len) &&
      v && len < ts_size) {
    memcpy(ts, v, len);
    ts[len] = '\0';
  }
}

/* The inv's trace record, made on first use; NULL when out of memory. */
static pr__itrace_t *tr_of(inv_t *inv) {
  if (!inv->tr)
    inv->tr = calloc(1, sizeof(*inv->tr));
  return inv->tr;
}

static void common_attrs(pr_span_t *s, const inv_t *inv) {
  char part[16];
  snprintf(part, sizeof(part), "%d", (int)inv->msg.partition);
  pr__span_attr_str(s, "messaging.system", "kafka", SIZE_MAX);
  pr__span_attr_str(s, "messaging.operation.type", "process", SIZE_MAX);
  pr__span_attr_str(s, "messaging.destination.name", inv->msg.topic, SIZE_MAX);
  pr__span_attr_str(s, "messaging.destination.partition.id", part, SIZE_MAX);
  pr__span_attr_str(s, "messaging.consumer.group.name", inv->eng->group_id,
                    SIZE_MAX);
  pr__span_attr_str(s, "messaging.kafka.message.key", inv->msg.key, SIZE_MAX);
}

void pr__trace_start(inv_t *inv) {
  pr__engine_t *eng = inv->eng;
  pr__itrace_t *tr = inv->tr;
  pr_span_ctx_t from = {0};
  char ts[512] = "";
  pr_span_t *s;

  if (!eng->otel) {
    /* No export: a timer's handler runs in the context it was scheduled
     * in; a message's is its traceparent header (read where asked). */
    if (tr && !tr->ctx.valid && tr->from.valid) {
      tr->ctx = tr->from;
      pr__span_ctx_format(&tr->ctx, tr->tp);
    }
    return;
  }
  if (inv->is_timer)
    from = tr ? tr->from : from;
  else
    record_ctx(inv, &from, ts, sizeof(ts));
  if (!(tr = tr_of(inv)))
    return;
  s = pr__span_start(eng->otel, inv->is_timer ? "trigger" : "receive",
                     PR_SPAN_CONSUMER, &from,
                     eng->span_rel[inv->is_timer ? 1 : 0], ts[0] ? ts : NULL);
  if (!s)
    return;
  common_attrs(s, inv);
  if (inv->is_timer) {
    pr__span_attr_int(s, "prosody.timer.time", inv->time_s);
  } else {
    pr__span_attr_int(s, "messaging.kafka.offset", inv->msg.offset);
    pr__span_attr_int(s, "messaging.message.body.size",
                      (int64_t)inv->msg.payload_len);
  }
  pr__span_attr_int(s, "prosody.attempt", inv->attempt);
  tr->span = s;
  tr->ctx = *pr__span_ctx(s);
  tr->spanned = 1;
  pr__span_ctx_format(&tr->ctx, tr->tp);
}

void pr__trace_end(inv_t *inv, prosody_result_t result, const char *error) {
  pr__itrace_t *tr = inv->tr;
  pr_span_t *s = tr ? tr->span : NULL;
  if (!s)
    return;
  tr->span = NULL;
  if (result != PROSODY_SUCCESS) {
    pr__span_attr_str(s, "error.type",
                      result == PROSODY_PERMANENT ? "permanent" : "transient",
                      SIZE_MAX);
    pr__span_set_error(s, error ? error : "the handler failed");
  }
  pr__span_end(s);
}

void pr__trace_filtered(inv_t *inv) {
  pr__engine_t *eng = inv->eng;
  pr_span_ctx_t from;
  char ts[512];
  pr_span_t *s;
  if (!eng->otel)
    return;
  record_ctx(inv, &from, ts, sizeof(ts));
  s = pr__span_start(eng->otel, "message.filtered", PR_SPAN_CONSUMER, &from,
                     eng->span_rel[0], ts[0] ? ts : NULL);
  common_attrs(s, inv);
  pr__span_attr_int(s, "messaging.kafka.offset", inv->msg.offset);
  pr__span_attr_str(s, "prosody.filter.reason", inv->skip, SIZE_MAX);
  pr__span_end(s);
}

int pr__trace_of(const inv_t *inv, pr_span_ctx_t *out) {
  char ts[1];
  if (inv->tr && inv->tr->ctx.valid) {
    *out = inv->tr->ctx;
    return 0;
  }
  if (!inv->is_timer) {
    record_ctx(inv, out, ts, sizeof(ts));
    return out->valid ? 0 : -1;
  }
  out->valid = false;
  return -1;
}

void pr__trace_free(inv_t *inv) {
  if (!inv->tr)
    return;
  pr__span_discard(inv->tr->span); /* an attempt that never gave a result */
  free(inv->tr);
  inv->tr = NULL;
}

/* --- the public accessors (the handler's thread, while it runs) -------- */

PROSODY_EXPORT const char *
prosody_message_traceparent(const prosody_message_t *m, int *spanned) {
  const inv_t *inv = PR_CONTAINER_OF(m, inv_t, msg);
  if (spanned)
    *spanned = 0;
  if (inv->tr && inv->tr->ctx.valid) {
    if (spanned)
      *spanned = inv->tr->spanned;
    return inv->tr->tp;
  }
  return prosody_message_header(m, "traceparent");
}

PROSODY_EXPORT const char *prosody_timer_traceparent(const prosody_timer_t *t,
                                                     int *spanned) {
  const inv_t *inv = PR_CONTAINER_OF(t, inv_t, tmr);
  if (spanned)
    *spanned = 0;
  if (!inv->tr || !inv->tr->ctx.valid)
    return NULL;
  if (spanned)
    *spanned = inv->tr->spanned;
  return inv->tr->tp;
}
