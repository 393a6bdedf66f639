/*
 * message.c - invocations (the engine's unit of work: one record or one
 * fired timer) and the public timer accessors (the message accessors are
 * in record.c).
 *
 * Threads: pr__inv_* run on the engine thread (pr__inv_emit_ran also on
 * the worker completing an attempt, see dispatch.c); the public accessors on
 * the handler's thread while its event runs.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static void timer_free_cb(uv_handle_t *h) { free(h); }

void pr__inv_timer_close(uv_timer_t **t) {
  if (*t) {
    uv_timer_stop(*t);
    uv_close((uv_handle_t *)*t, timer_free_cb);
    *t = NULL;
  }
}

int pr__inv_timer_start(inv_t *inv, uint64_t ms, uv_timer_cb cb) {
  PR_ENGINE_THREAD(inv->eng);
  pr__inv_timer_close(&inv->timer);
  if (!(inv->timer = malloc(sizeof(uv_timer_t))))
    return -1;
  uv_timer_init(&inv->eng->loop, inv->timer);
  inv->timer->data = inv;
  uv_timer_start(inv->timer, cb, ms, 0);
  return 0;
}

/* Leaves the running events' deadline list (eng->tmo_head, which dispatch.c
 * joins and times out; engine thread). The loop timer stays armed for the
 * old head: dispatch.c's on_timeout re-arms it for the new one. */
void pr__inv_untime(inv_t *inv) {
  PR_ENGINE_THREAD(inv->eng);
  pr__engine_t *eng = inv->eng;
  if (!inv->timed)
    return;
  if (inv->tprev)
    inv->tprev->tnext = inv->tnext;
  else
    eng->tmo_head = inv->tnext;
  if (inv->tnext)
    inv->tnext->tprev = inv->tprev;
  else
    eng->tmo_tail = inv->tprev;
  inv->tprev = inv->tnext = NULL;
  inv->timed = 0;
}

void pr__inv_free(inv_t *inv) {
  pr__inv_untime(inv);
  pr__layers_forget(inv); /* dedup's lookup, keyed state's transaction */
  pr__inv_timer_close(&inv->timer);
  if (!inv->inline_strings) {
    free(inv->msg.key);
    free(inv->msg.payload);
  }
  if (inv->rkm)
    rd_kafka_message_destroy(inv->rkm);
  pr__inv_shed(inv, 0);
  if (inv->cslot)
    pr__ctx_release(inv->eng ? &inv->eng->ctx_stash : NULL, inv->cslot);
  pr__trace_free(inv);
  free(inv->result_error);
  free(inv->dlq_errstr);
  if (inv->room && inv->eng && inv->eng->inv_pool_n < PR_INV_POOL_MAX) {
    inv->next = inv->eng->inv_pool;
    inv->eng->inv_pool = inv;
    inv->eng->inv_pool_n++;
    return;
  }
  free(inv);
}

/* Detaches a message's headers and frees its librdkafka message. A
 * message from librdkafka pins the fetch buffer it came in (a whole fetch
 * response). An event that starts is released by pr__decode_prepare() on
 * the handler's thread, off the engine thread; one that waits (behind its
 * key, for the limiter, for a dedup lookup or a retry) keeps its message
 * until the engine's next tick, which lets go of every waiting event's
 * (pr__part_tick_keys): most events wait far less than a
 * poll_interval, and parsing their headers on the engine thread (the
 * pipeline's serial stage) cost a fifth of its time. So the memory of
 * waiting records is their own copies, bounded by max_uncommitted per
 * partition, plus the fetch buffers of at most one poll_interval's events.
 * Engine thread, or the thread about to run the event's handler. */
void pr__inv_release_rkm(inv_t *inv) {
  rd_kafka_headers_t *hdrs = NULL;
  if (!inv->rkm)
    return;
  rd_kafka_message_detach_headers(inv->rkm, &hdrs);
  rd_kafka_message_destroy(inv->rkm);
  inv->rkm = NULL;
  inv->msg.headers = hdrs;
}

PROSODY_EXPORT const char *prosody_timer_key(const prosody_timer_t *timer) {
  return timer ? timer->key : NULL;
}

PROSODY_EXPORT int64_t prosody_timer_time(const prosody_timer_t *timer) {
  return timer ? timer->time_ms : -1;
}

static void emit(inv_t *inv, int phase, int64_t at_ms) {
  pr__engine_t *eng = inv->eng;
  char tp[PR_TRACEPARENT_LEN + 1], ts[512];
  pr_span_ctx_t trace;
  pr__tm_event_t ev = {
      .type = (pr__tm_type_t)((inv->is_timer ? PR_TM_TIMER_DISPATCHED
                                             : PR_TM_MESSAGE_DISPATCHED) +
                              phase),
      .topic = inv->msg.topic,
      .partition = inv->msg.partition,
      .offset = inv->is_timer ? -1 : inv->msg.offset,
      .time_ms = inv->time_s * 1000,
      .timer_type = !inv->is_timer   ? NULL
                    : inv->df_loaded ? "deferredTimer"
                                     : "application",
      .key = inv->msg.key ? inv->msg.key : "",
      .source = eng->group_id,
      .failure_demand = inv->attempt > 1 || inv->df_loaded,
      .at_ms = at_ms};
  if (phase == 2) {
    ev.error_category =
        inv->result == PROSODY_PERMANENT ? "permanent" : "transient";
    ev.exception = inv->result_error ? inv->result_error : "";
  }
  /* The context the handler ran in, as the original reports it: its span
   * when spans are exported, else the record's own traceparent, or the
   * context a timer was scheduled in. The inv is this thread's until its
   * result is posted, and its context is fixed once the handler started. */
  if (!pr__trace_of(inv, &trace)) {
    pr__span_ctx_format(&trace, tp);
    ev.traceparent = tp;
    if (!inv->is_timer)
      ev.tracestate =
          pr__header_str(inv->msg.headers, "tracestate", ts, sizeof(ts));
  }
  pr__tm_emit(eng->tm, &ev);
}

void pr__inv_emit_ran(inv_t *inv) {
  int64_t now_ms, now_ns;
  if (!inv->eng->tm)
    return;
  now_ms = pr__wall_ms();
  now_ns = pr__now_ns();
  /* Its start, in wall-clock time (started_ns is monotonic). */
  emit(inv, 0,
       inv->started_ns > 0 ? now_ms - (now_ns - inv->started_ns) / 1000000
                           : now_ms);
  emit(inv, inv->result == PROSODY_SUCCESS ? 1 : 2, now_ms);
}

void pr__emit_timer_op(pr__engine_t *eng, pr__tm_type_t type, const char *topic,
                       int32_t partition, const char *key, int64_t time_s,
                       const pr_span_ctx_t *trace, const char *tracestate) {
  char tp[PR_TRACEPARENT_LEN + 1];
  pr__tm_event_t ev = {.type = type,
                       .topic = topic,
                       .partition = partition,
                       .offset = -1,
                       .time_ms = time_s * 1000,
                       .timer_type = "application",
                       .key = key,
                       .source = eng->group_id};
  if (!eng->tm)
    return;
  if (trace && trace->valid) {
    pr__span_ctx_format(trace, tp);
    ev.traceparent = tp;
    ev.tracestate = tracestate;
  }
  pr__tm_emit(eng->tm, &ev);
}
