/*
 * message.c - invocations (the engine's unit of work: one record or one
 * fired timer) and the public timer accessors (the message accessors are
 * in record.c).
 *
 * Threads: pr__inv_* run on the engine thread; the public accessors on the
 * handler's thread while its event runs.
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

void pr__inv_free(inv_t *inv) {
  pr__dispatch_untime(inv);
  pr__dd_forget(inv);
  pr__inv_timer_close(&inv->timer);
  if (!inv->inline_strings) {
    free(inv->msg.key);
    free(inv->msg.payload);
  }
  if (inv->rkm)
    rd_kafka_message_destroy(inv->rkm);
  pr__inv_shed(inv);
  pthread_mutex_destroy(&inv->msg.hdr_lock);
  if (inv->cslot)
    pr__ctx_release(inv->cslot);
  free(inv->result_error);
  free(inv->dlq_errstr);
  free(inv);
}

/* "topic[p] offset N key "k"" or "topic[p] timer T key "k"", for logs. */
const char *pr__inv_describe(const inv_t *inv, char *buf, size_t n) {
  snprintf(buf, n, "%s[%d] %s %lld key \"%.64s\"", inv->msg.topic,
           inv->msg.partition, inv->is_timer ? "timer" : "offset",
           (long long)(inv->is_timer ? inv->time_s : inv->msg.offset),
           inv->msg.key ? inv->msg.key : "");
  return buf;
}

/* Detaches a message's headers and frees its librdkafka message. A
 * message from librdkafka pins the fetch buffer it came in (a whole fetch
 * response), so a record that waits (behind its key, or for the limiter)
 * lets go of it at once, on the engine thread; one that starts at once is
 * released by pr__decode_prepare() on the handler's thread. Either way the
 * memory of waiting records is their own copies, bounded by max_uncommitted per
 * partition. */
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
