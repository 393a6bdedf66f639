/*
 * producer.c - the client's Kafka producer.
 *
 * DESIGN: one idempotent, lz4-compressing librdkafka producer per client.
 * Callers on any thread validate and queue records (librdkafka's produce
 * path is thread-safe). One poller thread per producer serves librdkafka's
 * callbacks: delivery reports complete each record's request exactly once,
 * and error reports update `last_error`, which failure messages quote so a
 * user sees why a record timed out (for example, a refused connection).
 * A blocking send is an async send plus a refcounted waiter, so a waiter
 * that gives up can never be freed under a late delivery report.
 *
 * Honouring send_timeout: librdkafka's own delivery timeout
 * (message.timeout.ms) is send_timeout, but its timeout scan runs once a
 * second, so its report of a 1 s timeout could come after 2 s. Every queued
 * record is therefore on a pending list in send (so deadline) order, and
 * the poller reports each one still there at its deadline as timed out;
 * librdkafka's later report only frees it (and is logged if it says the
 * record was written after all: at-least-once, as any retry). A blocking
 * send waits for its report, and no more than send_timeout.
 *
 * Saying what was seen: broker errors quote librdkafka's report, explained
 * when it shows the address is not Kafka at all (pr__kafka_explain). A
 * listener that accepts connections and stays silent makes librdkafka
 * report nothing for 30 s, so when the oldest pending record has used half
 * its budget with no broker error, the poller probes the bootstrap
 * addresses (pr__kafka_probe) and failure messages quote what it saw.
 *
 * Fatal errors (librdkafka rule 7, docs/ARCHITECTURE.md): an idempotent
 * producer can hit a fatal error (e.g. after in-flight requests time out on
 * 2.0.2), after which its handle accepts nothing. The error callback flags
 * it; from then on the delivery reports of failed records are kept instead
 * of reported; the poller purges the old handle, creates a new one from the
 * same configuration, swaps it in under `rk_lock`, and re-sends what was
 * kept, so each record's callback still fires exactly once. Senders that
 * meet the dead handle wait for the swap within their send budget. A re-sent
 * record is still reported by its first deadline; one that was in flight may
 * be written twice (at-least-once, as any producer retry).
 *
 * Topic warm-up: librdkafka 2.0.2 does not always ask for a new topic's
 * metadata when the first record for it is queued (when the bootstrap
 * connection came up just before, its next look is the 1 s topic scan), so
 * a first send could wait a second, beyond a 1 s send_timeout. The first
 * send to each topic therefore queues the topic for the poller, which asks
 * for its metadata at once.
 */
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../util/util.h"
#include "kafka.h"

/* 1 on a thread that runs delivery callbacks (the poller, or _destroy while
 * it serves the last reports): sends made from a callback must not wait
 * for what only that thread can make happen. */
static __thread int in_callback_thread;

/* A failed record kept for re-sending after a fatal error. */
typedef struct resend {
  struct send_req *req; /* the record's request (callback) */
  char *key, *value;    /* copies */
  size_t key_len, value_len;
  rd_kafka_headers_t *headers; /* copy, or NULL */
} resend_t;

struct pr__producer {
  pr_otel_t *otel; /* the client's span exporter (borrowed), or NULL; set
                      before the first send */
  pr__tm_t *tm;    /* the client's telemetry (borrowed), or NULL; set before
                      the first send */
  pthread_rwlock_t rk_lock; /* guards the rk pointer: users of the handle
                               hold it shared, the poller swaps it */
  rd_kafka_t *rk;           /* thread-safe handle; replaced on fatal error */
  rd_kafka_conf_t *conf;    /* template for replacements; poller only */
  char *source_system;      /* immutable after _new */
  char *bootstrap;          /* immutable after _new; NULL in mock mode */
  int send_timeout_ms;      /* immutable after _new */
  int mock;                 /* immutable after _new: ensure topics first */
  pthread_t poller;         /* the only thread calling rd_kafka_poll() */
  pr__logger_t *logger;     /* its creator's: the poller logs there */
  atomic_int stop;          /* set by _destroy to end the poller */
  atomic_int fatal;         /* set by error_cb, cleared after recovery */
  atomic_int recoveries;    /* handles replaced so far */
  atomic_int destroying;    /* set by _destroy: fail, don't re-send */
  atomic_uint_fast64_t seq; /* next send_req.seq */
  resend_t *resend;         /* kept records; poller (then destroyer) only */
  size_t resend_n, resend_cap;
  pthread_mutex_t topics_lock; /* guards topics and warm */
  pr__strset_t topics;         /* topics sent to (mock: created) */
  pr__strset_t warm;           /* topics awaiting a metadata request */
  pthread_mutex_t err_lock;    /* guards last_error and seen */
  char last_error[512];        /* last error-callback text (explained), ""
                                  if none */
  char seen[512];              /* what the bootstrap addresses showed when
                                  last probed, "" if not since a delivery */
  atomic_int seen_set;         /* seen is not "" */
  int64_t probed_ns;           /* poller only: when it last probed */
  pthread_mutex_t pend_lock;   /* guards the pending list */
  struct send_req *pend_head, *pend_tail; /* records not reported yet, in
                                             send (deadline) order */
};

/* One queued record; freed by librdkafka's delivery report. */
typedef struct send_req {
  pr__producer_t *prod;
  prosody_send_cb cb;
  void *opaque;
  int64_t deadline_ns; /* send time + send_timeout (monotonic) */
  uint64_t seq;        /* send order, to re-send kept records in order */
  struct send_req *prev, *next; /* the pending list (pend_lock) */
  int linked;                   /* on it (pend_lock) */
  int reported;                 /* cb called (pend_lock) */
  char *key;                    /* its first 64 bytes, for messages */
  pr_span_t *span; /* its `send` span (ended with its report), or NULL */
  char topic[];    /* NUL-terminated copy, then the key's */
} send_req_t;

/* Ends a record's `send` span with its report. */
static void send_span_end(send_req_t *req, const rd_kafka_message_t *m,
                          rd_kafka_resp_err_t err) {
  char part[16];
  if (!req->span)
    return;
  if (err) {
    pr__span_attr_str(req->span, "error.type", rd_kafka_err2name(err),
                      SIZE_MAX);
    pr__span_set_error(req->span, rd_kafka_err2str(err));
  } else if (m) {
    snprintf(part, sizeof(part), "%d", (int)m->partition);
    pr__span_attr_str(req->span, "messaging.destination.partition.id", part,
                      SIZE_MAX);
    pr__span_attr_int(req->span, "messaging.kafka.offset", m->offset);
  }
  pr__span_end(req->span);
  req->span = NULL;
}

/* Takes `req` off the pending list (pend_lock held). */
static void pend_unlink(pr__producer_t *prod, send_req_t *req) {
  if (!req->linked)
    return;
  *(req->prev ? &req->prev->next : &prod->pend_head) = req->next;
  *(req->next ? &req->next->prev : &prod->pend_tail) = req->prev;
  req->prev = req->next = NULL;
  req->linked = 0;
}

/* 1 if the caller is to report `req` (call its cb): it was not reported
 * yet. Either way it is off the pending list. */
static int pend_take(pr__producer_t *prod, send_req_t *req) {
  int first;
  pthread_mutex_lock(&prod->pend_lock);
  pend_unlink(prod, req);
  first = !req->reported;
  req->reported = 1;
  pthread_mutex_unlock(&prod->pend_lock);
  return first;
}

/* "; last broker error: ..." or "; <what the probe saw>" or "". */
static void broker_seen(pr__producer_t *prod, char *out, size_t n) {
  pthread_mutex_lock(&prod->err_lock);
  if (prod->last_error[0])
    snprintf(out, n, "; last broker error: %s", prod->last_error);
  else if (prod->seen[0])
    snprintf(out, n, "; %s", prod->seen);
  else
    out[0] = '\0';
  pthread_mutex_unlock(&prod->err_lock);
}

/* Reports `req` as not delivered with librdkafka's error `kerr`. */
static void report_failure(pr__producer_t *prod, send_req_t *req,
                           rd_kafka_resp_err_t kerr) {
  prosody_err_t err = pr__kafka_classify(kerr);
  char seen[800], msg[1200], budget[32];
  broker_seen(prod, seen, sizeof(seen));
  pr__duration_format((int64_t)prod->send_timeout_ms * 1000000, budget,
                      sizeof(budget));
  snprintf(msg, sizeof(msg),
           "record for topic \"%s\" (key \"%s\") was not delivered: %s%s%s%s",
           req->topic, req->key, rd_kafka_err2str(kerr),
           err == PROSODY_ERR_TIMEOUT ? " within send_timeout " : "",
           err == PROSODY_ERR_TIMEOUT ? budget : "", seen);
  req->cb(err, msg, NULL, req->opaque);
}

/* Keeps a failed record for re-sending; 0 on success. */
static int keep_for_resend(pr__producer_t *prod, const rd_kafka_message_t *m,
                           send_req_t *req) {
  resend_t *r;
  rd_kafka_headers_t *h = NULL;
  if (pr__grow(&prod->resend, &prod->resend_cap, prod->resend_n,
               sizeof(*prod->resend), 64))
    return -1;
  r = &prod->resend[prod->resend_n];
  r->req = req;
  r->key_len = m->key_len;
  r->value_len = m->len;
  r->key = malloc(m->key_len + 1);
  r->value = malloc(m->len + 1);
  if (!r->key || !r->value) {
    free(r->key);
    free(r->value);
    return -1;
  }
  memcpy(r->key, m->key, m->key_len);
  memcpy(r->value, m->payload, m->len);
  r->headers = rd_kafka_message_headers(m, &h) == RD_KAFKA_RESP_ERR_NO_ERROR
                   ? rd_kafka_headers_copy(h)
                   : NULL;
  prod->resend_n++;
  return 0;
}

/* ------------------------------------------------------------------------ */
/* librdkafka callbacks (poller thread, or the destroying thread)            */
/* ------------------------------------------------------------------------ */

static void dr_cb(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque) {
  send_req_t *req = m->_private;
  pr__producer_t *prod = opaque;
  (void)rk;
  if (!req)
    return;
  /* The handle's fatal state is set before it fails its records, which
   * may be reported before the error event that sets prod->fatal. */
  if (m->err && !atomic_load(&prod->fatal) && rk &&
      rd_kafka_fatal_error(rk, NULL, 0))
    atomic_store(&prod->fatal, 1);
  if (m->err && atomic_load(&prod->fatal) && !atomic_load(&prod->destroying) &&
      pr__now_ns() < req->deadline_ns && keep_for_resend(prod, m, req) == 0)
    return; /* re-sent on the replacement handle */
  if (!m->err && atomic_load(&prod->seen_set)) {
    pthread_mutex_lock(&prod->err_lock); /* a broker answers: stale */
    prod->seen[0] = '\0';
    atomic_store(&prod->seen_set, 0);
    pthread_mutex_unlock(&prod->err_lock);
  }
  if (!pend_take(prod, req)) {
    /* one line per topic, so repeats fold into a count */
    if (!m->err)
      PR_WARN("producer",
              "a record for topic \"%s\" reported as not delivered within "
              "send_timeout was written after all (at-least-once)",
              req->topic);
  } else if (!m->err) {
    prosody_delivery_t d = {req->topic, m->partition, m->offset};
    if (prod->tm) {
      char key[1024], tp[PR_TRACEPARENT_LEN + 1], ts[512];
      size_t kl = m->key_len < sizeof(key) ? m->key_len : sizeof(key) - 1;
      pr__tm_event_t ev = {.type = PR_TM_MESSAGE_SENT,
                           .topic = req->topic,
                           .partition = m->partition,
                           .offset = m->offset,
                           .key = key,
                           .source = prod->source_system};
      rd_kafka_headers_t *h = NULL;
      memcpy(key, m->key ? m->key : "", m->key ? kl : 0);
      key[m->key ? kl : 0] = '\0';
      /* The record's trace context, as it was written (make_headers). */
      if (!rd_kafka_message_headers(m, &h)) {
        ev.traceparent = pr__header_str(h, "traceparent", tp, sizeof(tp));
        ev.tracestate = pr__header_str(h, "tracestate", ts, sizeof(ts));
      }
      pr__tm_emit(prod->tm, &ev);
    }
    req->cb(PROSODY_OK, NULL, &d, req->opaque);
  } else
    report_failure(prod, req, m->err);
  send_span_end(req, m, m->err);
  free(req);
}

static void error_cb(rd_kafka_t *rk, int err, const char *reason,
                     void *opaque) {
  pr__producer_t *prod = opaque;
  char text[512];
  pr__kafka_explain(rk, reason, text, sizeof(text));
  /* "1/1 brokers are down": the error before it said why */
  if (err != RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN) {
    pthread_mutex_lock(&prod->err_lock);
    snprintf(prod->last_error, sizeof(prod->last_error), "%s", text);
    pthread_mutex_unlock(&prod->err_lock);
  }
  if (err == RD_KAFKA_RESP_ERR__FATAL) {
    atomic_store(&prod->fatal, 1);
    PR_ERROR("producer", "fatal producer error: %s", text);
  } else
    PR_WARN("producer", "%s (%s)", text,
            rd_kafka_err2name((rd_kafka_resp_err_t)err));
}

/* Produces a kept record on the current handle (poller thread). */
static void resend_one(rd_kafka_t *rk, resend_t *r) {
  rd_kafka_resp_err_t kerr = rd_kafka_producev(
      rk, RD_KAFKA_V_TOPIC(r->req->topic), RD_KAFKA_V_KEY(r->key, r->key_len),
      RD_KAFKA_V_VALUE(r->value, r->value_len),
      RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_HEADERS(r->headers),
      RD_KAFKA_V_OPAQUE(r->req), RD_KAFKA_V_END);
  if (kerr) {
    char msg[512];
    if (r->headers)
      rd_kafka_headers_destroy(r->headers);
    snprintf(msg, sizeof(msg),
             "record for topic \"%s\" was not delivered: re-sending after a "
             "fatal producer error failed: %s",
             r->req->topic, rd_kafka_err2str(kerr));
    if (pend_take(r->req->prod, r->req))
      r->req->cb(pr__kafka_classify(kerr) == PROSODY_ERR_PERMANENT
                     ? PROSODY_ERR_PERMANENT
                     : PROSODY_ERR_TRANSIENT,
                 msg, NULL, r->req->opaque);
    send_span_end(r->req, NULL, kerr);
    free(r->req);
  }
  free(r->key);
  free(r->value);
}

/* Fails every kept record (no replacement handle could be made). */
static void fail_kept(pr__producer_t *prod, const char *why) {
  for (size_t i = 0; i < prod->resend_n; i++) {
    resend_t *r = &prod->resend[i];
    char msg[512];
    snprintf(msg, sizeof(msg), "record for topic \"%s\" was not delivered: %s",
             r->req->topic, why);
    if (pend_take(prod, r->req))
      r->req->cb(PROSODY_ERR_TRANSIENT, msg, NULL, r->req->opaque);
    send_span_end(r->req, NULL, RD_KAFKA_RESP_ERR__FATAL);
    free(r->req);
    free(r->key);
    free(r->value);
    if (r->headers)
      rd_kafka_headers_destroy(r->headers);
  }
  prod->resend_n = 0;
}

static int by_seq(const void *a, const void *b) {
  uint64_t x = ((const resend_t *)a)->req->seq;
  uint64_t y = ((const resend_t *)b)->req->seq;
  return x < y ? -1 : x > y;
}

/* Replaces a handle that raised a fatal error (poller thread). */
static void recover(pr__producer_t *prod) {
  rd_kafka_t *old = prod->rk, *fresh;
  rd_kafka_conf_t *kconf;
  char why[512] = "", err[512];
  int64_t deadline;

  rd_kafka_fatal_error(old, why, sizeof(why));
  /* Collect every record the dead handle still holds: their reports are
   * kept (fatal is set) for re-sending. */
  rd_kafka_purge(old, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
  deadline = pr__now_ns() + INT64_C(5000000000);
  while (rd_kafka_outq_len(old) > 0 && pr__now_ns() < deadline)
    rd_kafka_poll(old, 20);
  rd_kafka_poll(old, 0);

  kconf = rd_kafka_conf_dup(prod->conf);
  fresh =
      kconf ? pr__kafka_new(RD_KAFKA_PRODUCER, kconf, err, sizeof(err)) : NULL;
  if (!fresh) {
    if (kconf)
      rd_kafka_conf_destroy(kconf);
    PR_ERROR("producer",
             "could not replace the producer after a fatal error (%s): %s; "
             "retrying in 1 s",
             why, kconf ? err : "out of memory");
    fail_kept(prod, "the producer hit a fatal error and could not be "
                    "replaced");
    usleep(1000000);
    return;
  }
  /* Re-send in the original order on the new handle before any sender
   * can reach it, so per-key order holds; then publish it. */
  qsort(prod->resend, prod->resend_n, sizeof(resend_t), by_seq);
  for (size_t i = 0; i < prod->resend_n; i++)
    resend_one(fresh, &prod->resend[i]);
  PR_WARN("producer",
          "replaced the producer after a fatal error (%s); re-sent %zu "
          "unacknowledged record(s)",
          why, prod->resend_n);
  prod->resend_n = 0;
  atomic_store(&prod->fatal, 0);
  pthread_rwlock_wrlock(&prod->rk_lock);
  prod->rk = fresh;
  pthread_rwlock_unlock(&prod->rk_lock);
  /* The fresh handle knows no topic yet: warm them all. */
  pthread_mutex_lock(&prod->topics_lock);
  for (size_t i = 0; i < prod->topics.n; i++)
    if (pr__strset_find(&prod->warm, prod->topics.v[i]) < 0)
      (void)pr__strset_add(&prod->warm, prod->topics.v[i]);
  pthread_mutex_unlock(&prod->topics_lock);
  atomic_fetch_add(&prod->recoveries, 1);
  pr__kafka_destroy_bounded(old, 30000, "failed producer");
}

/* Asks for the metadata of one topic queued by a first send (poller
 * thread). A short wait: if the broker does not answer at once, librdkafka's
 * own topic scan takes over. */
static void warm_one(pr__producer_t *prod) {
  const struct rd_kafka_metadata *md = NULL;
  rd_kafka_topic_t *rkt = NULL;
  char *topic = NULL;

  pthread_mutex_lock(&prod->topics_lock);
  if (prod->warm.n > 0) {
    topic = prod->warm.v[prod->warm.n - 1];
    prod->warm.n--; /* the string is ours now */
  }
  pthread_mutex_unlock(&prod->topics_lock);
  if (!topic)
    return;
  rkt = rd_kafka_topic_new(prod->rk, topic, NULL);
  if (rkt && rd_kafka_metadata(prod->rk, 0, rkt, &md, 250) ==
                 RD_KAFKA_RESP_ERR_NO_ERROR)
    rd_kafka_metadata_destroy(md);
  if (rkt)
    rd_kafka_topic_destroy(rkt);
  free(topic);
}

/* Reports every pending record whose deadline has passed as timed out
 * (poller thread); librdkafka's own report of it only frees it. Returns
 * the next deadline, or 0 if none is pending. */
static int64_t expire_due(pr__producer_t *prod) {
  for (;;) {
    send_req_t *req;
    int64_t next;
    pthread_mutex_lock(&prod->pend_lock);
    req = prod->pend_head;
    next = req ? req->deadline_ns : 0;
    if (req && next <= pr__now_ns()) {
      pend_unlink(prod, req);
      req->reported = 1;
    } else
      req = NULL;
    pthread_mutex_unlock(&prod->pend_lock);
    if (!req)
      return next;
    report_failure(prod, req, RD_KAFKA_RESP_ERR__MSG_TIMED_OUT);
  }
}

/* Once the oldest pending record has used half its send_timeout while no
 * broker error explains the wait, probes the bootstrap addresses (at most
 * once a send_timeout, and a second) so reports can say what is there
 * (poller thread). */
static void look(pr__producer_t *prod, int64_t next_deadline) {
  int64_t now = pr__now_ns();
  int64_t budget_ns = prod->send_timeout_ms * INT64_C(1000000);
  int64_t every =
      budget_ns > INT64_C(1000000000) ? budget_ns : INT64_C(1000000000);
  int quiet, probe_ms = prod->send_timeout_ms / 4;
  char seen[sizeof(prod->seen)];
  if (!prod->bootstrap || !next_deadline ||
      next_deadline - now > budget_ns / 2 ||
      (prod->probed_ns && now - prod->probed_ns < every))
    return;
  pthread_mutex_lock(&prod->err_lock);
  quiet = !prod->last_error[0];
  pthread_mutex_unlock(&prod->err_lock);
  if (!quiet)
    return;
  prod->probed_ns = now;
  if (probe_ms > 200)
    probe_ms = 200;
  pr__kafka_probe(prod->bootstrap, probe_ms < 10 ? 10 : probe_ms, seen,
                  sizeof(seen));
  pthread_mutex_lock(&prod->err_lock);
  memcpy(prod->seen, seen, sizeof(seen));
  atomic_store(&prod->seen_set, 1);
  pthread_mutex_unlock(&prod->err_lock);
}

static void *poller_main(void *arg) {
  pr__producer_t *prod = arg;
  pthread_setname_np(pthread_self(), "prosody-send");
  pr__log_adopt(prod->logger);
  in_callback_thread = 1;
  while (!atomic_load(&prod->stop)) {
    int64_t next = expire_due(prod), ms = 50;
    if (next)
      ms = (next - pr__now_ns()) / 1000000 + 1;
    /* only this thread replaces prod->rk */
    rd_kafka_poll(prod->rk, ms < 0 ? 0 : ms > 50 ? 50 : (int)ms);
    if (atomic_load(&prod->fatal) && !atomic_load(&prod->destroying))
      recover(prod);
    warm_one(prod);
    look(prod, expire_due(prod)); /* after the reports just served */
  }
  return NULL;
}

/* ------------------------------------------------------------------------ */
/* Lifecycle                                                                 */
/* ------------------------------------------------------------------------ */

pr__producer_t *pr__producer_new(const pr__settings_t *st,
                                 const char *bootstrap,
                                 const char *source_system, char *errstr,
                                 size_t errstr_size) {
  pr__producer_t *prod;
  rd_kafka_conf_t *kconf;
  char buf[32], why[512];

  prod = calloc(1, sizeof(*prod));
  if (!prod || !(prod->source_system = strdup(source_system))) {
    free(prod);
    pr__errf(errstr, errstr_size, "out of memory");
    return NULL;
  }
  pthread_mutex_init(&prod->err_lock, NULL);
  pthread_mutex_init(&prod->topics_lock, NULL);
  pthread_mutex_init(&prod->pend_lock, NULL);
  pthread_rwlock_init(&prod->rk_lock, NULL);
  prod->send_timeout_ms = (int)PR_CFG_MS(st, SEND_TIMEOUT);
  if (prod->send_timeout_ms < 1)
    prod->send_timeout_ms = 1;
  prod->mock = PR_CFG_BOOL(st, MOCK);
  if (!prod->mock && bootstrap && !(prod->bootstrap = strdup(bootstrap))) {
    pr__errf(errstr, errstr_size, "out of memory");
    goto fail;
  }

  kconf = pr__kafka_conf_new(st, bootstrap, prod->mock, errstr, errstr_size);
  if (!kconf)
    goto fail;
  snprintf(buf, sizeof(buf), "%d", prod->send_timeout_ms);
  if (pr__kafka_conf_set(kconf, "enable.idempotence", "true", errstr,
                         errstr_size) ||
      pr__kafka_conf_set(kconf, "compression.type", "lz4", errstr,
                         errstr_size) ||
      pr__kafka_conf_set(kconf, "message.timeout.ms", buf, errstr,
                         errstr_size) ||
      pr__kafka_conf_set(kconf, "linger.ms",
                         prod->send_timeout_ms > 10 ? "5" : "0", errstr,
                         errstr_size)) {
    rd_kafka_conf_destroy(kconf);
    goto fail;
  }
  rd_kafka_conf_set_dr_msg_cb(kconf, dr_cb);
  rd_kafka_conf_set_error_cb(kconf, error_cb);
  rd_kafka_conf_set_opaque(kconf, prod);
  prod->conf = rd_kafka_conf_dup(kconf);

  prod->rk = pr__kafka_new(RD_KAFKA_PRODUCER, kconf, why, sizeof(why));
  if (!prod->rk || !prod->conf) {
    if (!prod->rk)
      rd_kafka_conf_destroy(kconf);
    else
      pr__kafka_destroy_bounded(prod->rk, 10000, "producer");
    if (!prod->rk)
      pr__errf(errstr, errstr_size, "could not create the Kafka producer: %s",
               why);
    else
      pr__errf(errstr, errstr_size, "out of memory");
    goto fail;
  }
  prod->logger = pr__log_current();
  if (pthread_create(&prod->poller, NULL, poller_main, prod) != 0) {
    pr__kafka_destroy_bounded(prod->rk, 10000, "producer");
    pr__errf(errstr, errstr_size, "could not start the producer thread");
    goto fail;
  }
  return prod;

fail:
  if (prod->conf)
    rd_kafka_conf_destroy(prod->conf);
  pthread_rwlock_destroy(&prod->rk_lock);
  pthread_mutex_destroy(&prod->err_lock);
  pthread_mutex_destroy(&prod->topics_lock);
  pthread_mutex_destroy(&prod->pend_lock);
  pr__strset_clear(&prod->topics);
  pr__strset_clear(&prod->warm);
  free(prod->bootstrap);
  free(prod->source_system);
  free(prod);
  return NULL;
}

/* Waits (bounded) until every record is reported (delivered, failed, or
 * past its deadline); the poller keeps serving callbacks meanwhile. */
static void await_reported(pr__producer_t *prod, int64_t budget_ns) {
  int64_t deadline = pr__now_ns() + budget_ns;
  for (;;) {
    int pending;
    pthread_mutex_lock(&prod->pend_lock);
    pending = prod->pend_head != NULL;
    pthread_mutex_unlock(&prod->pend_lock);
    if (!pending || pr__now_ns() >= deadline)
      return;
    usleep(1000);
  }
}

/* Waits (bounded) until librdkafka holds no record and no unserved
 * delivery report; the poller keeps serving callbacks meanwhile. */
static void await_empty(pr__producer_t *prod, int64_t budget_ns) {
  int64_t deadline = pr__now_ns() + budget_ns;
  for (;;) {
    int n;
    pthread_rwlock_rdlock(&prod->rk_lock);
    n = rd_kafka_outq_len(prod->rk);
    pthread_rwlock_unlock(&prod->rk_lock);
    if (n == 0 || pr__now_ns() >= deadline)
      return;
    usleep(1000);
  }
}

void pr__producer_flush(pr__producer_t *prod) {
  await_reported(prod, (int64_t)prod->send_timeout_ms * 1000000 + 50000000);
}

void pr__producer_destroy(pr__producer_t *prod) {
  if (!prod)
    return;
  /* Callbacks run on the poller thread, not the caller's: let outstanding
   * records finish within their send_timeout (those past it are reported
   * already, though librdkafka still holds them), fail the rest (purged
   * records report an error; kept ones are no longer re-sent), then stop
   * it. */
  atomic_store(&prod->destroying, 1);
  await_reported(prod,
                 (int64_t)prod->send_timeout_ms * 1000000 + INT64_C(100000000));
  pthread_rwlock_rdlock(&prod->rk_lock);
  rd_kafka_purge(prod->rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
  pthread_rwlock_unlock(&prod->rk_lock);
  await_empty(prod, INT64_C(5000000000));
  atomic_store(&prod->stop, 1);
  pthread_join(prod->poller, NULL);
  /* Only stragglers are left, if anything: serve them here. */
  in_callback_thread = 1;
  rd_kafka_poll(prod->rk, 0);
  fail_kept(prod, "the client was destroyed before the record could be "
                  "re-sent");
  in_callback_thread = 0;
  if (rd_kafka_outq_len(prod->rk) > 0)
    PR_ERROR("producer",
             "%d record(s) still unreported at destroy; their callbacks will "
             "not fire",
             rd_kafka_outq_len(prod->rk));
  free(prod->resend);
  pr__kafka_destroy_bounded(prod->rk, 30000, "producer");
  rd_kafka_conf_destroy(prod->conf);
  pthread_rwlock_destroy(&prod->rk_lock);
  pthread_mutex_destroy(&prod->err_lock);
  pthread_mutex_destroy(&prod->topics_lock);
  pthread_mutex_destroy(&prod->pend_lock);
  pr__strset_clear(&prod->topics);
  pr__strset_clear(&prod->warm);
  free(prod->bootstrap);
  free(prod->source_system);
  free(prod);
}

void pr__producer_set_otel(pr__producer_t *prod, pr_otel_t *otel) {
  prod->otel = otel;
}

pr_otel_t *pr__producer_otel(pr__producer_t *prod) { return prod->otel; }

/* The engine's hook for the running handler's context (this thread). */
static _Thread_local pr__send_parent_fn parent_fn;
static _Thread_local const void *parent_arg;

void pr__send_parent_set(pr__send_parent_fn fn, const void *arg) {
  parent_fn = fn;
  parent_arg = arg;
}

void pr__producer_set_telemetry(pr__producer_t *prod, pr__tm_t *tm) {
  prod->tm = tm;
}

pr__tm_t *pr__producer_telemetry(pr__producer_t *prod) { return prod->tm; }

rd_kafka_t *pr__producer_handle(pr__producer_t *prod) {
  rd_kafka_t *rk;
  pthread_rwlock_rdlock(&prod->rk_lock);
  rk = prod->rk;
  pthread_rwlock_unlock(&prod->rk_lock);
  return rk;
}

int pr__producer_recoveries(pr__producer_t *prod) {
  return atomic_load(&prod->recoveries);
}

/* ------------------------------------------------------------------------ */
/* Sending                                                                   */
/* ------------------------------------------------------------------------ */

static int is_lower_hex(const char *s, size_t n, int *all_zero) {
  *all_zero = 1;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
      return 0;
    if (c != '0')
      *all_zero = 0;
  }
  return 1;
}

int pr__traceparent_check(const char *tp, char *why, size_t why_size) {
  /* version "-" trace-id(32) "-" parent-id(16) "-" flags(2) */
  size_t len = strlen(tp);
  int zero;
  if (len < 55 || tp[2] != '-' || tp[35] != '-' || tp[52] != '-' ||
      !is_lower_hex(tp, 2, &zero) || !strncmp(tp, "ff", 2) ||
      (len > 55 && (!strncmp(tp, "00", 2) || tp[55] != '-'))) {
    pr__errf(why, why_size,
             "traceparent \"%.80s\" is not \"00-<32 hex>-<16 hex>-<2 hex>\"",
             tp);
    return -1;
  }
  if (!is_lower_hex(tp + 3, 32, &zero) || zero) {
    pr__errf(why, why_size,
             "traceparent \"%.80s\" has an invalid trace id (32 lower-case "
             "hex digits, not all zero)",
             tp);
    return -1;
  }
  if (!is_lower_hex(tp + 36, 16, &zero) || zero) {
    pr__errf(why, why_size,
             "traceparent \"%.80s\" has an invalid parent id (16 lower-case "
             "hex digits, not all zero)",
             tp);
    return -1;
  }
  if (!is_lower_hex(tp + 53, 2, &zero)) {
    pr__errf(why, why_size, "traceparent \"%.80s\" has invalid flags", tp);
    return -1;
  }
  return 0;
}

static prosody_err_t check_record(const char *topic, const char *key,
                                  const char *json,
                                  const prosody_trace_t *trace, char *errstr,
                                  size_t errstr_size) {
  char why[256];
  json_t *doc;
  json_error_t jerr;

  if (!topic || pr__topic_name_check(topic, why, sizeof(why))) {
    pr__errf(errstr, errstr_size, "invalid topic: %s",
             topic ? why : "topic is NULL");
    return PROSODY_ERR_INVALID_ARG;
  }
  if (!key) {
    pr__errf(errstr, errstr_size, "key is NULL (every record needs a key)");
    return PROSODY_ERR_INVALID_ARG;
  }
  if (!pr__utf8_valid(key, strlen(key))) {
    pr__errf(errstr, errstr_size, "key for topic \"%s\" is not valid UTF-8",
             topic);
    return PROSODY_ERR_INVALID_ARG;
  }
  if (!json) {
    pr__errf(errstr, errstr_size, "payload for topic \"%s\" is NULL", topic);
    return PROSODY_ERR_INVALID_PAYLOAD;
  }
  /* Validated without building a tree; jansson says where it is wrong.
   * pr__no_value: a record without a value (an excise record). */
  if (json != pr__no_value && !pr__json_valid(json, strlen(json))) {
    doc = json_loads(json, JSON_DECODE_ANY, &jerr);
    json_decref(doc);
    pr__errf(errstr, errstr_size,
             "payload for topic \"%s\" (key \"%.64s\") is not valid JSON: %s "
             "at line %d, column %d",
             topic, key, doc ? "not accepted" : jerr.text, doc ? 1 : jerr.line,
             doc ? 1 : jerr.column);
    return PROSODY_ERR_INVALID_PAYLOAD;
  }
  if (trace && trace->traceparent &&
      pr__traceparent_check(trace->traceparent, why, sizeof(why))) {
    pr__errf(errstr, errstr_size, "%s", why);
    return PROSODY_ERR_INVALID_ARG;
  }
  return PROSODY_OK;
}

static rd_kafka_headers_t *make_headers(pr__producer_t *prod,
                                        const prosody_trace_t *trace,
                                        const rd_kafka_headers_t *extra) {
  rd_kafka_headers_t *h = rd_kafka_headers_new(4);
  const char *name;
  const void *value;
  size_t size;
  for (size_t i = 0;
       extra && !rd_kafka_header_get_all(extra, i, &name, &value, &size); i++)
    rd_kafka_header_add(h, name, -1, value, (ssize_t)size);
  /* In the original's order: its W3C propagators write baggage, then
   * traceparent with tracestate (empty when the context has none). */
  rd_kafka_header_add(h, "source-system", -1, prod->source_system, -1);
  if (trace) {
    if (trace->baggage)
      rd_kafka_header_add(h, "baggage", -1, trace->baggage, -1);
    if (trace->traceparent) {
      rd_kafka_header_add(h, "traceparent", -1, trace->traceparent, -1);
      rd_kafka_header_add(h, "tracestate", -1,
                          trace->tracestate ? trace->tracestate : "", -1);
    }
  }
  return h;
}

prosody_err_t pr__producer_send_async(pr__producer_t *prod, const char *topic,
                                      const char *key, const char *json,
                                      const prosody_trace_t *trace,
                                      prosody_send_cb cb, void *opaque,
                                      char *errstr, size_t errstr_size) {
  return pr__producer_send_async_ex(prod, topic, key, json, trace, NULL, cb,
                                    opaque, errstr, errstr_size);
}

/* On the first send to `topic`: create it on the mock cluster (mock mode)
 * and queue it for the poller's metadata warm-up. */
static prosody_err_t first_use(pr__producer_t *prod, const char *topic,
                               char *errstr, size_t errstr_size) {
  prosody_err_t err = PROSODY_OK;
  int known;

  pthread_mutex_lock(&prod->topics_lock);
  known = pr__strset_find(&prod->topics, topic) >= 0;
  pthread_mutex_unlock(&prod->topics_lock);
  if (known)
    return PROSODY_OK;
  if (prod->mock) {
    err = pr__mock_ensure_topic(topic, errstr, errstr_size);
    if (err)
      return err;
  }
  pthread_mutex_lock(&prod->topics_lock);
  if (pr__strset_find(&prod->topics, topic) < 0 &&
      pr__strset_add(&prod->topics, topic) == 0)
    (void)pr__strset_add(&prod->warm, topic); /* best effort */
  pthread_mutex_unlock(&prod->topics_lock);
  return err;
}

/* The trace context a record carries: its `send` span's when the client
 * exports spans (a child of `trace`'s traceparent, or of the running
 * handler's context), else `trace` as given, or the running handler's
 * context. Returns the trace to write (`*eff`, with its traceparent in
 * `tp`, or `trace` itself). */
static const prosody_trace_t *send_trace(pr__producer_t *prod, send_req_t *req,
                                         const char *topic, const char *key,
                                         const prosody_trace_t *trace,
                                         prosody_trace_t *eff, char *tp) {
  pr_span_ctx_t parent = {0};
  pr_span_t *s;
  if (trace && trace->traceparent)
    (void)pr__span_ctx_parse(trace->traceparent, SIZE_MAX, &parent);
  else if (parent_fn && parent_fn(parent_arg, &parent))
    parent.valid = false;
  if (prod->otel &&
      (s = pr__span_start(prod->otel, "send", PR_SPAN_PRODUCER, &parent,
                          PR_SPAN_CHILD, trace ? trace->tracestate : NULL))) {
    pr__span_attr_str(s, "messaging.system", "kafka", SIZE_MAX);
    pr__span_attr_str(s, "messaging.operation.type", "send", SIZE_MAX);
    pr__span_attr_str(s, "messaging.destination.name", topic, SIZE_MAX);
    pr__span_attr_str(s, "messaging.kafka.message.key", key, SIZE_MAX);
    req->span = s;
    parent = *pr__span_ctx(s);
  } else if (trace && trace->traceparent) {
    return trace;
  }
  if (!parent.valid)
    return trace;
  *eff = trace ? *trace : (prosody_trace_t){0};
  pr__span_ctx_format(&parent, tp);
  eff->traceparent = tp;
  return eff;
}

prosody_err_t pr__producer_send_async_ex(
    pr__producer_t *prod, const char *topic, const char *key, const char *json,
    const prosody_trace_t *trace, const rd_kafka_headers_t *extra,
    prosody_send_cb cb, void *opaque, char *errstr, size_t errstr_size) {
  prosody_err_t err;
  rd_kafka_resp_err_t kerr;
  rd_kafka_headers_t *hdrs;
  send_req_t *req;
  size_t tlen, klen;
  int64_t deadline;
  prosody_trace_t eff;
  char tp[PR_TRACEPARENT_LEN + 1];

  if (!cb) {
    pr__errf(errstr, errstr_size, "callback is NULL");
    return PROSODY_ERR_INVALID_ARG;
  }
  err = check_record(topic, key, json, trace, errstr, errstr_size);
  if (err)
    return err;
  err = first_use(prod, topic, errstr, errstr_size);
  if (err)
    return err;
  tlen = strlen(topic);
  klen = strnlen(key, 64);
  req = calloc(1, sizeof(*req) + tlen + klen + 2);
  if (!req) {
    pr__errf(errstr, errstr_size, "out of memory");
    return PROSODY_ERR_NOMEM;
  }
  req->prod = prod;
  req->cb = cb;
  req->opaque = opaque;
  memcpy(req->topic, topic, tlen + 1);
  req->key = req->topic + tlen + 1;
  memcpy(req->key, key, klen);
  trace = send_trace(prod, req, topic, key, trace, &eff, tp);

  deadline = pr__now_ns() + (int64_t)prod->send_timeout_ms * 1000000;
  req->deadline_ns = deadline;
  req->seq = atomic_fetch_add(&prod->seq, 1);
  for (;;) {
    hdrs = make_headers(prod, trace, extra);
    /* Queued and on the pending list at once: neither its report nor its
     * expiry can come first. */
    pthread_mutex_lock(&prod->pend_lock);
    pthread_rwlock_rdlock(&prod->rk_lock);
    kerr = rd_kafka_producev(
        prod->rk, RD_KAFKA_V_TOPIC(topic),
        RD_KAFKA_V_KEY((void *)key, strlen(key)),
        RD_KAFKA_V_VALUE(json == pr__no_value ? NULL : (void *)json,
                         strlen(json)),
        RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_HEADERS(hdrs),
        RD_KAFKA_V_OPAQUE(req), RD_KAFKA_V_END);
    pthread_rwlock_unlock(&prod->rk_lock);
    if (!kerr) {
      req->prev = prod->pend_tail;
      *(req->prev ? &req->prev->next : &prod->pend_head) = req;
      prod->pend_tail = req;
      req->linked = 1;
    }
    pthread_mutex_unlock(&prod->pend_lock);
    if (!kerr)
      return PROSODY_OK; /* headers and req now belong to librdkafka */
    rd_kafka_headers_destroy(hdrs);
    /* A full local queue drains as the poller serves delivery reports; a
     * handle with a fatal error is being replaced by the poller. Either
     * way, wait within the send budget. */
    if ((kerr != RD_KAFKA_RESP_ERR__QUEUE_FULL &&
         kerr != RD_KAFKA_RESP_ERR__FATAL) ||
        pr__now_ns() >= deadline || in_callback_thread)
      break;
    usleep(1000);
  }
  send_span_end(req, NULL, kerr);
  free(req);
  err =
      kerr == RD_KAFKA_RESP_ERR__QUEUE_FULL || kerr == RD_KAFKA_RESP_ERR__FATAL
          ? PROSODY_ERR_TIMEOUT
          : pr__kafka_classify(kerr);
  pr__errf(errstr, errstr_size, "could not queue a record for topic \"%s\": %s",
           topic, rd_kafka_err2str(kerr));
  return err;
}

/* A blocking send's rendezvous with its delivery report. */
typedef struct waiter {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  int done;          /* guarded by lock */
  int refs;          /* guarded by lock: the sender and the report */
  prosody_err_t err; /* guarded by lock */
  char errstr[1200]; /* guarded by lock */
} waiter_t;

static void waiter_unref_locked(waiter_t *w) {
  if (--w->refs == 0) {
    pthread_mutex_unlock(&w->lock);
    pthread_mutex_destroy(&w->lock);
    pthread_cond_destroy(&w->cond);
    free(w);
    return;
  }
  pthread_mutex_unlock(&w->lock);
}

static void waiter_cb(prosody_err_t err, const char *errstr,
                      const prosody_delivery_t *d, void *opaque) {
  waiter_t *w = opaque;
  (void)d;
  pthread_mutex_lock(&w->lock);
  w->err = err;
  snprintf(w->errstr, sizeof(w->errstr), "%s", errstr ? errstr : "");
  w->done = 1;
  pthread_cond_signal(&w->cond);
  waiter_unref_locked(w);
}

prosody_err_t pr__producer_send(pr__producer_t *prod, const char *topic,
                                const char *key, const char *json,
                                const prosody_trace_t *trace, char *errstr,
                                size_t errstr_size) {
  pthread_condattr_t attr;
  struct timespec deadline;
  prosody_err_t err;
  waiter_t *w;
  /* The poller reports a record at its deadline: the caller waits
   * send_timeout (plus the poller's latency) and no longer; a report after
   * that is dropped with the waiter's last reference. */
  int wait_ms = prod->send_timeout_ms + 50;

  if (in_callback_thread) {
    pr__errf(errstr, errstr_size,
             "prosody_send cannot wait inside a delivery callback (the thread "
             "that would deliver the report is this one); use "
             "prosody_send_async");
    return PROSODY_ERR_STATE;
  }
  w = calloc(1, sizeof(*w));

  if (!w) {
    pr__errf(errstr, errstr_size, "out of memory");
    return PROSODY_ERR_NOMEM;
  }
  pthread_mutex_init(&w->lock, NULL);
  pthread_condattr_init(&attr);
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  pthread_cond_init(&w->cond, &attr);
  pthread_condattr_destroy(&attr);
  w->refs = 2;

  err = pr__producer_send_async(prod, topic, key, json, trace, waiter_cb, w,
                                errstr, errstr_size);
  if (err) {
    pthread_mutex_destroy(&w->lock);
    pthread_cond_destroy(&w->cond);
    free(w);
    return err;
  }
  pr__deadline_after(CLOCK_MONOTONIC, (int64_t)wait_ms * 1000000, &deadline);
  pthread_mutex_lock(&w->lock);
  while (!w->done && pthread_cond_timedwait(&w->cond, &w->lock, &deadline) == 0)
    ;
  if (w->done) {
    err = w->err;
    if (err)
      pr__errf(errstr, errstr_size, "%s", w->errstr);
  } else {
    char seen[800], budget[32];
    err = PROSODY_ERR_TIMEOUT;
    broker_seen(prod, seen, sizeof(seen));
    pr__duration_format((int64_t)prod->send_timeout_ms * 1000000, budget,
                        sizeof(budget));
    pr__errf(errstr, errstr_size,
             "record for topic \"%s\" (key \"%.64s\") was not acknowledged "
             "within send_timeout %s%s",
             topic, key, budget, seen);
  }
  waiter_unref_locked(w);
  return err;
}
