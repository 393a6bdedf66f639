/*
 * telemetry.c - the telemetry topic (telemetry_enabled, telemetry_topic):
 * each lifecycle event (a message dispatched, succeeded or failed; a record
 * sent; a timer scheduled, cancelled, dispatched, succeeded or failed) as
 * one JSON record keyed by the event's key, through a producer of its own.
 *
 * Fire and forget, at low priority: the producer is made on the first
 * event (a client that never emits has none), batches for up to 100 ms,
 * asks for one acknowledgement and never retries for long; an event that
 * does not fit its queue (PR_TM_QUEUE records) is dropped and counted
 * rather than waited for, so telemetry never slows a handler or a send.
 * Delivery failures are counted too and logged once per minute at most.
 *
 * Threads: any. librdkafka's producer is thread-safe; `lock` guards its
 * creation; the counters are atomic.
 */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <pthread.h>

#include "../util/util.h"
#include "kafka.h"

#define PR_TM_QUEUE 100000 /* records waiting in the producer, at most */
#define PR_TM_STACK 4096   /* an event longer than this is built on the heap */
#define PR_TM_EXC_MAX 4096 /* bytes of an exception's text kept */

struct pr__tm {
  char *bootstrap, *topic;
  int mock;
  const pr__settings_t *st; /* the client's; outlives this emitter (an
                               abandoned engine's client keeps both) */
  char hostname[256];
  pthread_mutex_t lock; /* guards rk's creation */
  _Atomic(rd_kafka_t *) rk;
  atomic_int failed_new; /* none is made: it could not be, or sealed */
  atomic_uint_fast64_t emitted, dropped, undelivered;
  atomic_llong warned_ms; /* last delivery failure logged */
};

static const char *type_name(pr__tm_type_t t) {
  static const char *names[] = {
      "prosody.message.dispatched", "prosody.message.succeeded",
      "prosody.message.failed",     "prosody.message.sent",
      "prosody.timer.scheduled",    "prosody.timer.cancelled",
      "prosody.timer.dispatched",   "prosody.timer.succeeded",
      "prosody.timer.failed"};
  return names[t];
}

static void dr_cb(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque) {
  pr__tm_t *t = opaque;
  int64_t now, last;
  (void)rk;
  if (!m->err)
    return;
  atomic_fetch_add(&t->undelivered, 1);
  now = pr__wall_ms();
  last = atomic_load(&t->warned_ms);
  if (now - last >= 60000 &&
      atomic_compare_exchange_strong(&t->warned_ms, &last, now))
    PR_WARN(
        "telemetry",
        "an event for telemetry topic \"%s\" was not delivered: %s (%" PRIu64
        " so far; such failures are logged once a minute)",
        t->topic, rd_kafka_err2str(m->err),
        (uint64_t)atomic_load(&t->undelivered));
}

pr__tm_t *pr__tm_new(const pr__settings_t *st, const char *bootstrap) {
  pr__tm_t *t;
  const char *topic = PR_CFG_STR(st, TELEMETRY_TOPIC);
  if (!PR_CFG_BOOL(st, TELEMETRY_ENABLED) || !topic)
    return NULL;
  if (!(t = calloc(1, sizeof(*t))) || !(t->bootstrap = strdup(bootstrap)) ||
      !(t->topic = strdup(topic))) {
    if (t)
      free(t->bootstrap);
    free(t);
    PR_ERROR("telemetry", "out of memory: telemetry is off for this client");
    return NULL;
  }
  t->mock = PR_CFG_BOOL(st, MOCK);
  t->st = st;
  if (gethostname(t->hostname, sizeof(t->hostname) - 1))
    snprintf(t->hostname, sizeof(t->hostname), "unknown");
  pthread_mutex_init(&t->lock, NULL);
  return t;
}

/* The producer, made on first use; NULL when it could not be made. */
static rd_kafka_t *producer(pr__tm_t *t) {
  rd_kafka_t *rk = atomic_load(&t->rk);
  rd_kafka_conf_t *kc;
  char errstr[512], queue[32];
  if (rk || atomic_load(&t->failed_new))
    return rk;
  pthread_mutex_lock(&t->lock);
  if ((rk = atomic_load(&t->rk)) || atomic_load(&t->failed_new)) {
    pthread_mutex_unlock(&t->lock);
    return rk;
  }
  snprintf(queue, sizeof(queue), "%d", PR_TM_QUEUE);
  kc = pr__kafka_conf_new(t->st, t->bootstrap, t->mock, errstr, sizeof(errstr));
  if (kc &&
      !pr__kafka_conf_set(kc, "linger.ms", "100", errstr, sizeof(errstr)) &&
      !pr__kafka_conf_set(kc, "acks", "1", errstr, sizeof(errstr)) &&
      !pr__kafka_conf_set(kc, "enable.idempotence", "false", errstr,
                          sizeof(errstr)) &&
      !pr__kafka_conf_set(kc, "message.timeout.ms", "30000", errstr,
                          sizeof(errstr)) &&
      /* Only failures are counted: a report per delivered event would
       * cost a queue operation and a wake-up each. */
      !pr__kafka_conf_set(kc, "delivery.report.only.error", "true", errstr,
                          sizeof(errstr)) &&
      !pr__kafka_conf_set(kc, "queue.buffering.max.messages", queue, errstr,
                          sizeof(errstr))) {
    rd_kafka_conf_set_dr_msg_cb(kc, dr_cb);
    rd_kafka_conf_set_opaque(kc, t);
    if ((rk = pr__kafka_new(RD_KAFKA_PRODUCER, kc, errstr, sizeof(errstr))))
      kc = NULL;
  }
  if (kc)
    rd_kafka_conf_destroy(kc);
  if (rk) {
    atomic_store(&t->rk, rk);
  } else {
    atomic_store(&t->failed_new, 1);
    PR_ERROR("telemetry",
             "could not start the telemetry producer: %s; telemetry is off "
             "for this client",
             errstr);
  }
  pthread_mutex_unlock(&t->lock);
  return rk;
}

/* ---- JSON ------------------------------------------------------------- */

typedef struct buf {
  char *p;
  size_t n, cap; /* cap leaves room for the closing brace */
} buf_t;

static void put(buf_t *b, const char *s, size_t n) {
  if (b->n + n > b->cap)
    n = b->cap - b->n;
  memcpy(b->p + b->n, s, n);
  b->n += n;
}

/* The length of the valid UTF-8 sequence at s (0: invalid). */
static size_t utf8_len(const unsigned char *s, size_t left) {
  size_t n = s[0] < 0xC2   ? 0
             : s[0] < 0xE0 ? 2
             : s[0] < 0xF0 ? 3
             : s[0] < 0xF5 ? 4
                           : 0;
  if (!n || n > left)
    return 0;
  for (size_t i = 1; i < n; i++)
    if ((s[i] & 0xC0) != 0x80)
      return 0;
  if ((s[0] == 0xE0 && s[1] < 0xA0) || (s[0] == 0xED && s[1] > 0x9F) ||
      (s[0] == 0xF0 && s[1] < 0x90) || (s[0] == 0xF4 && s[1] > 0x8F))
    return 0; /* overlong, surrogate, or past U+10FFFF */
  return n;
}

/* A JSON string: escaped; invalid UTF-8 bytes become U+FFFD. */
/* A JSON string of at most `max` bytes of s (a cut inside a character
 * ends in U+FFFD). */
static void put_str_n(buf_t *b, const char *s, size_t max) {
  const unsigned char *u = (const unsigned char *)s;
  size_t len = strnlen(s, max);
  put(b, "\"", 1);
  for (size_t i = 0; i < len;) {
    char esc[8];
    size_t n, run = i;
    while (run < len && u[run] >= 0x20 && u[run] < 0x80 && u[run] != '"' &&
           u[run] != '\\')
      run++; /* plain ASCII: copied at once */
    if (run > i) {
      put(b, s + i, run - i);
      i = run;
      continue;
    }
    if (u[i] == '"' || u[i] == '\\') {
      esc[0] = '\\';
      esc[1] = (char)u[i++];
      put(b, esc, 2);
    } else if (u[i] < 0x20) {
      snprintf(esc, sizeof(esc), "\\u%04x", u[i++]);
      put(b, esc, 6);
    } else if (u[i] < 0x80) {
      put(b, s + i++, 1);
    } else if ((n = utf8_len(u + i, len - i))) {
      put(b, s + i, n);
      i += n;
    } else {
      put(b, "\xEF\xBF\xBD", 3);
      i++;
    }
  }
  put(b, "\"", 1);
}

static void put_str(buf_t *b, const char *s) { put_str_n(b, s, SIZE_MAX); }

/* ,"name":"v" with at most `max` bytes of v. */
static void put_field_str_n(buf_t *b, const char *name, const char *v,
                            size_t max) {
  put(b, ",\"", 2);
  put(b, name, strlen(name));
  put(b, "\":", 2);
  put_str_n(b, v, max);
}

static void put_field_str(buf_t *b, const char *name, const char *v) {
  put_field_str_n(b, name, v, SIZE_MAX);
}

static void put_field_int(buf_t *b, const char *name, int64_t v) {
  char num[24], *p = num + sizeof(num);
  uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
  do
    *--p = (char)('0' + u % 10);
  while (u /= 10);
  if (v < 0)
    *--p = '-';
  put(b, ",\"", 2);
  put(b, name, strlen(name));
  put(b, "\":", 2);
  put(b, p, (size_t)(num + sizeof(num) - p));
}

/* The original's timestamps: RFC 3339 in UTC with a "Z", to the
 * millisecond for when an event happened, to the second for when a timer
 * fires (a timer's time has no finer unit). */
static void stamp_s(int64_t ms, char *out, size_t n) {
  char *dot;
  pr__rfc3339_ms(ms, out, n);
  if ((dot = strrchr(out, '.')))
    memcpy(dot, "Z", 2);
}

/* The fields and their order are the original Prosody's, per kind of event
 * (docs/OBSERVABILITY.md has the table): a consumer built for its
 * telemetry reads ours unchanged. */
size_t pr__tm_json(const pr__tm_t *t, const pr__tm_event_t *ev, int64_t now_ms,
                   char *out, size_t n) {
  buf_t b = {out, 0, n > 2 ? n - 2 : 0};
  char stamp[40];
  int sent = ev->type == PR_TM_MESSAGE_SENT;
  pr__rfc3339_ms(now_ms, stamp, sizeof(stamp));
  put(&b, "{\"type\":", 8);
  put_str(&b, type_name(ev->type));
  put_field_str(&b, "eventTime", stamp);
  if (ev->timer_type) {
    stamp_s(ev->time_ms, stamp, sizeof(stamp));
    put_field_str(&b, "scheduledTime", stamp);
    put_field_str(&b, "timerType", ev->timer_type);
  } else if (!sent) {
    put_field_int(&b, "offset", ev->offset);
  }
  put_field_str(&b, "topic", ev->topic);
  put_field_int(&b, "partition", ev->partition);
  if (sent)
    put_field_int(&b, "offset", ev->offset);
  put_field_str(&b, "key", ev->key);
  put_field_str(&b, "source", ev->source);
  put_field_str(&b, "hostname", t->hostname);
  if (!sent && ev->type != PR_TM_TIMER_SCHEDULED &&
      ev->type != PR_TM_TIMER_CANCELLED)
    put_field_str(&b, "demandType", ev->failure_demand ? "failure" : "normal");
  if (ev->error_category)
    put_field_str(&b, "errorCategory", ev->error_category);
  if (ev->exception)
    put_field_str_n(&b, "exception", ev->exception, PR_TM_EXC_MAX);
  /* As the original's W3C propagator: both or neither, an empty
   * traceState when the context has none. */
  if (ev->traceparent) {
    put_field_str(&b, "traceParent", ev->traceparent);
    put_field_str(&b, "traceState", ev->tracestate ? ev->tracestate : "");
  }
  b.cap = n; /* the closing brace always fits */
  put(&b, "}", 1);
  out[b.n] = '\0';
  return b.n;
}

/* Room for the event's JSON at worst (every byte escaped as \uXXXX). */
static size_t json_room(const pr__tm_t *t, const pr__tm_event_t *ev) {
  size_t text = strlen(ev->topic) + strlen(ev->key) + strlen(ev->source) +
                strlen(t->hostname) +
                (ev->exception ? strnlen(ev->exception, PR_TM_EXC_MAX) : 0) +
                (ev->traceparent ? strlen(ev->traceparent) : 0) +
                (ev->tracestate ? strlen(ev->tracestate) : 0);
  return 512 + 6 * text;
}

void pr__tm_emit(pr__tm_t *t, const pr__tm_event_t *ev) {
  rd_kafka_t *rk;
  char stack[PR_TM_STACK], *json = stack;
  size_t len, room;
  rd_kafka_resp_err_t err;
  if (!t || !(rk = producer(t)))
    return;
  if ((room = json_room(t, ev)) > sizeof(stack) && !(json = malloc(room))) {
    atomic_fetch_add(&t->dropped, 1);
    return;
  }
  len = pr__tm_json(t, ev, ev->at_ms ? ev->at_ms : pr__wall_ms(), json,
                    json == stack ? sizeof(stack) : room);
  err = rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(t->topic),
                          RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                          RD_KAFKA_V_KEY(ev->key, strlen(ev->key)),
                          RD_KAFKA_V_VALUE(json, len), RD_KAFKA_V_END);
  if (json != stack)
    free(json);
  if (err)
    atomic_fetch_add(&t->dropped, 1);
  else
    atomic_fetch_add(&t->emitted, 1);
  /* Serves delivery reports now and then (no thread of ours polls it). */
  if ((atomic_load(&t->emitted) & 1023) == 0 || err)
    rd_kafka_poll(rk, 0);
}

uint64_t pr__tm_dropped(const pr__tm_t *t) {
  return t ? (uint64_t)atomic_load(&((pr__tm_t *)t)->dropped) +
                 (uint64_t)atomic_load(&((pr__tm_t *)t)->undelivered)
           : 0;
}

void pr__tm_seal(pr__tm_t *t) {
  if (!t)
    return;
  pthread_mutex_lock(&t->lock); /* after a creation under way */
  atomic_store(&t->failed_new, 1);
  pthread_mutex_unlock(&t->lock);
}

void pr__tm_free(pr__tm_t *t) {
  rd_kafka_t *rk;
  if (!t)
    return;
  if ((rk = atomic_load(&t->rk))) {
    /* What is queued gets a short while to go out; telemetry never holds
     * a client's close for long. */
    if (rd_kafka_flush(rk, 2000)) {
      rd_kafka_purge(rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
      rd_kafka_poll(rk, 0); /* their reports: counted as not delivered */
    }
    pr__kafka_destroy_bounded(rk, 5000, "telemetry producer");
  }
  pthread_mutex_destroy(&t->lock);
  free(t->bootstrap);
  free(t->topic);
  free(t);
}
