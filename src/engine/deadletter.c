/*
 * deadletter.c - sending a failed record to failure_topic with its
 * source-* headers (low-latency mode), and what its delivery report does.
 * The record is the original Prosody's: the failed record's key and value,
 * its source-* headers in the original's order and wording, then the
 * producer's source-system and trace headers (docs/OBSERVABILITY.md).
 *
 * Threads: the engine thread, except dlq_cb() (librdkafka's producer
 * thread: it posts to the mailbox).
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

/* What the original writes before the handler's error in source-error. */
#define PR_DLQ_ERROR_PREFIX "handler error: "

static void dlq_mail(pr__mail_t *mail, void *owner) {
  (void)owner;
  pr__dlq_done(PR_CONTAINER_OF(mail, inv_t, mail));
}

static void dlq_cb(prosody_err_t err, const char *errstr,
                   const prosody_delivery_t *d, void *opaque) {
  inv_t *inv = opaque;
  (void)d;
  inv->dlq_err = err;
  free(inv->dlq_errstr);
  inv->dlq_errstr = errstr ? strdup(errstr) : NULL;
  pr__mailbox_post(&inv->eng->mb, &inv->mail, dlq_mail);
}

/* Sends the record to failure_topic with the source-* headers. */
void pr__dlq_send(inv_t *inv) {
  PR_ENGINE_THREAD(inv->eng);
  pr__engine_t *eng = inv->eng;
  rd_kafka_headers_t *h = rd_kafka_headers_new(8);
  prosody_trace_t trace = {NULL, NULL, NULL};
  char num[32], stamp[40], err[512], *cause;
  const char *why;
  const void *v;
  size_t len;
  char *tp = NULL, *ts = NULL, *bg = NULL;
  prosody_err_t e;

  pr__inv_release_rkm(inv); /* never ran: its headers are still in it */
  inv->state = INV_DLQ;
  inv->part->active++;
  eng->dlq_inflight++;
  rd_kafka_header_add(h, "source-kind", -1, "message", -1);
  rd_kafka_header_add(h, "source-topic", -1, inv->msg.topic, -1);
  snprintf(num, sizeof(num), "%d", inv->msg.partition);
  rd_kafka_header_add(h, "source-partition", -1, num, -1);
  snprintf(num, sizeof(num), "%lld", (long long)inv->msg.offset);
  rd_kafka_header_add(h, "source-offset", -1, num, -1);
  pr__rfc3339_ms(inv->msg.timestamp >= 0 ? inv->msg.timestamp : pr__wall_ms(),
                 stamp, sizeof(stamp));
  rd_kafka_header_add(h, "source-timestamp", -1, stamp, -1);
  rd_kafka_header_add(h, "source-group-id", -1, eng->group_id, -1);
  /* As the original words it: its handler middleware's "handler error: "
   * before the handler's own text. */
  why = inv->result_error ? inv->result_error : "(no message)";
  if ((cause = malloc(sizeof(PR_DLQ_ERROR_PREFIX) + strlen(why)))) {
    memcpy(cause, PR_DLQ_ERROR_PREFIX, sizeof(PR_DLQ_ERROR_PREFIX) - 1);
    strcpy(cause + sizeof(PR_DLQ_ERROR_PREFIX) - 1, why);
  }
  rd_kafka_header_add(h, "source-error", -1, cause ? cause : why, -1);
  free(cause);
  if (inv->msg.headers) {
    if (!rd_kafka_header_get_last(inv->msg.headers, "traceparent", &v, &len))
      trace.traceparent = tp = pr__strndup(v, len);
    if (!rd_kafka_header_get_last(inv->msg.headers, "tracestate", &v, &len))
      trace.tracestate = ts = pr__strndup(v, len);
    if (!rd_kafka_header_get_last(inv->msg.headers, "baggage", &v, &len))
      trace.baggage = bg = pr__strndup(v, len);
    if (tp && pr__traceparent_check(tp, err, sizeof(err)))
      trace.traceparent = NULL; /* never fail a dead letter on a bad header */
  }
  if (eng->dlq_refuse > 0) { /* test option: as if the broker refused */
    eng->dlq_refuse--;
    e = PROSODY_ERR_TRANSIENT;
    snprintf(err, sizeof(err), "refused (test option)");
  } else
    e = pr__producer_send_async_ex(
        eng->producer, PR_CFG_STR(eng->st, FAILURE_TOPIC), inv->msg.key,
        inv->msg.payload, &trace, h, dlq_cb, inv, err, sizeof(err));
  rd_kafka_headers_destroy(h);
  free(tp);
  free(ts);
  free(bg);
  if (e) /* not queued: report like a failed delivery */
    dlq_cb(e, err, NULL, inv);
}

static void send_again(uv_timer_t *t);

void pr__dlq_done(inv_t *inv) {
  PR_ENGINE_THREAD(inv->eng);
  pr__engine_t *eng = inv->eng;
  inv->part->active--;
  eng->dlq_inflight--;
  if (!inv->dlq_err) {
    PR_BUMP(eng->metrics.dead_lettered, 1);
    pr__outcome_finish(inv,
                       1); /* committed only once the dead letter is written */
    return;
  }
  if (eng->phase != PH_RUNNING || inv->part->revoking || inv->part->zombie) {
    pr__outcome_finish(inv, 0);
    return;
  }
  PR_ERROR("engine",
           "%s[%d] offset %lld: could not write to failure topic %s: %s; "
           "retrying",
           inv->msg.topic, inv->msg.partition, (long long)inv->msg.offset,
           PR_CFG_STR(eng->st, FAILURE_TOPIC),
           inv->dlq_errstr ? inv->dlq_errstr : "");
  /* Stay in the DLQ state: send_again sends again. */
  inv->state = INV_DLQ;
  if (pr__inv_timer_start(inv, pr__outcome_backoff_ms(eng, ++inv->attempt),
                          send_again))
    pr__dlq_send(inv); /* no timer: at once */
}

static void send_again(uv_timer_t *t) {
  inv_t *inv = t->data;
  if (!pr__outcome_retry_fired(inv))
    pr__dlq_send(inv);
}
