/*
 * otel.c - span contexts (W3C traceparent), spans, and their exporter over
 * OTLP: protobuf or JSON over HTTP/1.1, or gRPC over HTTP/2 (issue 16; the
 * contract is otel.h). gRPC is one unary call per batch, made by libcurl:
 * h2c with prior knowledge for an http:// endpoint, h2 through ALPN for
 * https://; the request is one length-prefixed message, and the answer's
 * grpc-status (a trailer, or a header in a trailers-only answer) says
 * whether the collector took it.
 *
 * Threads:
 * - span functions: the thread that owns the span (otel.h); ids come from
 *   a per-thread PRNG (xoshiro256**) seeded from getrandom(), no lock;
 * - pr__span_end(): any thread; takes `o->lock` only to append to the
 *   queue (or to count a drop), never waits for room or for the network;
 * - the exporter thread (one per pr_otel_t, exporter_main): takes batches
 *   off the queue under `o->lock`, encodes and POSTs them with its own
 *   libcurl easy handle without the lock (the reply's gRPC status lands in
 *   `o->grpc_*`, the exporter thread's own), then updates the counters and
 *   wakes flushers (`o->done`) under the lock;
 * - pr__otel_flush/close/stats: any thread (close: the owner, once).
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <pthread.h>

#include "../util/util.h"
#include "otel_int.h"

/* ------------------------------------------------------------ span context */

static int hexnib(char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  return -1;
}

/* Lower-case hex into bytes; -1 on another character. *zero: all zero. */
static int unhex(const char *s, uint8_t *out, size_t n, bool *zero) {
  *zero = true;
  for (size_t i = 0; i < n; i++) {
    int h = hexnib(s[2 * i]), l = hexnib(s[2 * i + 1]);
    if (h < 0 || l < 0)
      return -1;
    out[i] = (uint8_t)(h << 4 | l);
    if (out[i])
      *zero = false;
  }
  return 0;
}

int pr__span_ctx_parse(const char *s, size_t len, pr_span_ctx_t *out) {
  uint8_t ver, flags;
  bool zero;
  memset(out, 0, sizeof *out);
  if (!s)
    return -1;
  if (len == SIZE_MAX)
    len = strlen(s);
  /* version "-" trace-id(32) "-" parent-id(16) "-" flags(2); a future
   * version (not 00, not ff) may carry more after a '-'. */
  if (len < PR_TRACEPARENT_LEN || s[2] != '-' || s[35] != '-' || s[52] != '-' ||
      unhex(s, &ver, 1, &zero) || ver == 0xff ||
      (len > PR_TRACEPARENT_LEN && (ver == 0 || s[55] != '-')))
    return -1;
  if (unhex(s + 3, out->trace_id, PR_TRACE_ID_LEN, &zero) || zero)
    goto bad;
  if (unhex(s + 36, out->span_id, PR_SPAN_ID_LEN, &zero) || zero)
    goto bad;
  if (unhex(s + 53, &flags, 1, &zero))
    goto bad;
  out->flags = flags;
  out->valid = true;
  return 0;
bad:
  memset(out, 0, sizeof *out);
  return -1;
}

static void hex(const uint8_t *p, size_t n, char *out) {
  static const char dig[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = dig[p[i] >> 4];
    out[2 * i + 1] = dig[p[i] & 15];
  }
}

void pr__span_ctx_format(const pr_span_ctx_t *c,
                         char out[PR_TRACEPARENT_LEN + 1]) {
  memcpy(out, "00-", 3);
  hex(c->trace_id, PR_TRACE_ID_LEN, out + 3);
  out[35] = '-';
  hex(c->span_id, PR_SPAN_ID_LEN, out + 36);
  out[52] = '-';
  hex(&c->flags, 1, out + 53);
  out[55] = 0;
}

/* --------------------------------------------------------------------- ids */

/* xoshiro256** per thread, seeded from getrandom() (splitmix64 of the clock
 * and the thread's address if getrandom fails). A fork() child reseeds:
 * its thread would otherwise repeat the parent's ids (rng_gen, bumped by a
 * pthread_atfork child handler). */
static _Thread_local uint64_t rng_s[4];
static _Thread_local bool rng_seeded;
static _Thread_local unsigned rng_seen_gen;
static atomic_uint rng_gen;
static pthread_once_t rng_once = PTHREAD_ONCE_INIT;

static void rng_forked(void) {
  atomic_fetch_add_explicit(&rng_gen, 1, memory_order_relaxed);
}
static void rng_atfork(void) { pthread_atfork(NULL, NULL, rng_forked); }

static uint64_t splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t rng_next(void) {
  uint64_t r, t;
  unsigned gen = atomic_load_explicit(&rng_gen, memory_order_relaxed);
  if (!rng_seeded || rng_seen_gen != gen) {
    pthread_once(&rng_once, rng_atfork);
    rng_seen_gen = gen;
    if (getrandom(rng_s, sizeof rng_s, 0) != (ssize_t)sizeof rng_s) {
      uint64_t x = (uint64_t)pr__now_ns() ^ (uint64_t)(uintptr_t)&rng_s;
      for (int i = 0; i < 4; i++)
        rng_s[i] = splitmix64(&x);
    }
    if (!(rng_s[0] | rng_s[1] | rng_s[2] | rng_s[3]))
      rng_s[0] = 1;
    rng_seeded = true;
  }
  r = rotl(rng_s[1] * 5, 7) * 9;
  t = rng_s[1] << 17;
  rng_s[2] ^= rng_s[0];
  rng_s[3] ^= rng_s[1];
  rng_s[1] ^= rng_s[2];
  rng_s[0] ^= rng_s[3];
  rng_s[2] ^= t;
  rng_s[3] = rotl(rng_s[3], 45);
  return r;
}

static void rand_id(uint8_t *p, size_t n) {
  bool zero;
  do {
    zero = true;
    for (size_t i = 0; i < n; i += 8) {
      uint64_t v = rng_next();
      for (size_t j = 0; j < 8 && i + j < n; j++) {
        p[i + j] = (uint8_t)(v >> (8 * j));
        if (p[i + j])
          zero = false;
      }
    }
  } while (zero);
}

/* A NUL-terminated copy of `len` bytes, valid UTF-8 (OTLP strings must be:
 * a receiver rejects the whole request otherwise): each byte that starts
 * no valid sequence becomes U+FFFD. NULL when out of memory. */
static char *utf8_copy(const char *v, size_t len, size_t *out_len) {
  char *out;
  size_t o = 0;
  if (pr__utf8_valid(v, len)) {
    *out_len = len;
    return pr__strndup(v, len);
  }
  if (!(out = malloc(3 * len + 1)))
    return NULL;
  for (size_t i = 0; i < len;) {
    size_t k = 1;
    while (k <= 4 && i + k <= len && !pr__utf8_valid(v + i, k))
      k++;
    if (k <= 4 && i + k <= len) {
      memcpy(out + o, v + i, k);
      o += k;
      i += k;
    } else {
      memcpy(out + o, "\xef\xbf\xbd", 3);
      o += 3;
      i++;
    }
  }
  out[o] = 0;
  *out_len = o;
  return out;
}

static char *utf8_dup(const char *s) {
  size_t n;
  return utf8_copy(s, strlen(s), &n);
}

static uint64_t wall_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

/* ---------------------------------------------------------------- exporter */

struct pr_otel {
  /* Immutable after pr__otel_open. */
  char *url;
  pr_otlp_protocol_t proto; /* the one spoken (pr__otel_target) */
  pr__otel_resource_t res;
  size_t queue_max, batch_max;
  int64_t delay_ns;
  long timeout_ms;
  pthread_t thread;
  pr__logger_t *logger; /* the opening thread's (its client's) */
  atomic_bool abort;    /* close gave up flushing: cut the request short */

  /* The exporter thread's own: the last gRPC answer (-1: no grpc-status). */
  int grpc_status;
  char grpc_message[160];

  /* Everything below: `lock`. `wake` wakes the exporter thread (a span
   * queued, a flush asked, stop); `done` wakes flushers (a batch done). */
  pthread_mutex_t lock;
  pthread_cond_t wake, done;
  pr_span_t *head, *tail; /* FIFO by seq */
  size_t queued;
  uint64_t seq;          /* last seq given by pr__span_end */
  uint64_t flush_upto;   /* send spans up to this seq without delay */
  size_t inflight;       /* spans taken by the thread, not yet resolved */
  uint64_t inflight_seq; /* seq of the first of them */
  bool stop;
  pr_otel_stats_t stats;

  struct pr_otel *reg_next; /* the open exporters' list (reg_lock) */
};

/* Every open exporter, for the process-wide flush and shutdown
 * (prosody_telemetry_flush/_shutdown). reg_lock guards reg_head and each
 * exporter's reg_next; an exporter is on the list from its open until its
 * close, which takes it off before freeing it. `otel_down`: set once by
 * pr__otel_shutdown_all(); from then on no span starts. */
static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static pr_otel_t *reg_head;
static atomic_bool otel_down;

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;
static void curl_init(void) {
  curl_init_rc = curl_global_init(CURL_GLOBAL_ALL);
}

static void span_free(pr_span_t *s) {
  for (int i = 0; i < s->nattrs; i++)
    free(s->attrs[i].s);
  free(s->tracestate);
  free(s->status_msg);
  free(s);
}

static size_t discard_body(char *p, size_t size, size_t n, void *ud) {
  (void)p;
  (void)ud;
  return size * n;
}

static int progress(void *ud, curl_off_t a, curl_off_t b, curl_off_t c,
                    curl_off_t d) {
  pr_otel_t *o = ud;
  (void)a;
  (void)b;
  (void)c;
  (void)d;
  return atomic_load(&o->abort) ? 1 : 0;
}

/* libcurl's header callback (gRPC only): each header line of the answer,
 * its trailers included; keeps grpc-status and grpc-message. */
static size_t on_header(char *p, size_t size, size_t n, void *ud) {
  pr_otel_t *o = ud;
  size_t len = size * n;
  if (len > 12 && !strncasecmp(p, "grpc-status:", 12)) {
    o->grpc_status = atoi(p + 12);
  } else if (len > 13 && !strncasecmp(p, "grpc-message:", 13)) {
    size_t b = 13, e = len;
    while (b < e && p[b] == ' ')
      b++;
    while (e > b && (p[e - 1] == '\r' || p[e - 1] == '\n' || p[e - 1] == ' '))
      e--;
    snprintf(o->grpc_message, sizeof o->grpc_message, "%.*s", (int)(e - b),
             p + b);
  }
  return len;
}

typedef enum sent { SENT_OK, SENT_RETRY, SENT_FAILED } sent_t;

/* An HTTP status: 2xx is taken; 429, 502, 503 and 504 (the receiver is busy
 * or restarting) are worth one retry. */
static sent_t http_sent(long code) {
  if (code >= 200 && code <= 299)
    return SENT_OK;
  return code == 429 || code == 502 || code == 503 || code == 504 ? SENT_RETRY
                                                                  : SENT_FAILED;
}

/* A gRPC status: OK is taken; those OTLP calls retryable (CANCELLED,
 * DEADLINE_EXCEEDED, ABORTED, OUT_OF_RANGE, UNAVAILABLE, DATA_LOSS) are
 * worth one retry. */
static sent_t grpc_sent(int status) {
  switch (status) {
  case 0:
    return SENT_OK;
  case 1:
  case 4:
  case 10:
  case 11:
  case 14:
  case 15:
    return SENT_RETRY;
  default:
    return SENT_FAILED;
  }
}

/* POSTs one encoded batch once. */
static sent_t post_once(pr_otel_t *o, CURL *h, const void *body, size_t len) {
  long code = 0;
  CURLcode rc;
  curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
  curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
  o->grpc_status = -1;
  o->grpc_message[0] = 0;
  rc = curl_easy_perform(h);
  if (rc != CURLE_OK) {
    pr__log(PR_LOG_WARN, "otel", "span export to %s failed: %s", o->url,
            curl_easy_strerror(rc));
    return SENT_FAILED;
  }
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
  if (o->proto == PR_OTLP_GRPC && code == 200) {
    sent_t r = o->grpc_status < 0 ? SENT_FAILED : grpc_sent(o->grpc_status);
    if (o->grpc_status < 0)
      pr__log(PR_LOG_WARN, "otel",
              "span export to %s: the answer has no grpc-status", o->url);
    else if (r != SENT_OK)
      pr__log(PR_LOG_WARN, "otel",
              "span export to %s answered grpc-status %d%s%s", o->url,
              o->grpc_status, *o->grpc_message ? ": " : "", o->grpc_message);
    return r;
  }
  if (code < 200 || code > 299)
    pr__log(PR_LOG_WARN, "otel", "span export to %s answered HTTP %ld", o->url,
            code);
  return http_sent(code);
}

/* True when the receiver accepted the batch. An answer worth a retry is
 * retried once after PR_OTEL_RETRY_MS, unless the exporter is closing. */
#define PR_OTEL_RETRY_MS 200
static bool post(pr_otel_t *o, CURL *h, const void *body, size_t len) {
  sent_t r = post_once(o, h, body, len);
  if (r == SENT_RETRY) {
    for (int i = 0; i < PR_OTEL_RETRY_MS / 10 && !atomic_load(&o->abort); i++)
      usleep(10000);
    if (!atomic_load(&o->abort))
      r = post_once(o, h, body, len);
  }
  return r == SENT_OK;
}

/* Encodes and sends `n` spans; true when accepted. */
static bool send_batch(pr_otel_t *o, CURL *h, pr_span_t **batch, size_t n) {
  bool ok = false;
  if (!h)
    return false;
  if (o->proto == PR_OTLP_HTTP_JSON) {
    char *text = pr__otel_encode_json(&o->res, batch, n);
    if (text)
      ok = post(o, h, text, strlen(text));
    free(text);
  } else {
    pr__otel_buf_t b = {0};
    if (!(o->proto == PR_OTLP_GRPC ? pr__otel_encode_grpc(&o->res, batch, n, &b)
                                   : pr__otel_encode_pb(&o->res, batch, n, &b)))
      ok = post(o, h, b.p, b.len);
    free(b.p);
  }
  return ok;
}

static CURL *make_handle(pr_otel_t *o, struct curl_slist **hdrs) {
  static const char *const types[] = {
      [PR_OTLP_HTTP_PROTOBUF] = "Content-Type: application/x-protobuf",
      [PR_OTLP_HTTP_JSON] = "Content-Type: application/json",
      [PR_OTLP_GRPC] = "Content-Type: application/grpc"};
  bool grpc = o->proto == PR_OTLP_GRPC;
  CURL *h = curl_easy_init();
  if (!h)
    return NULL;
  struct curl_slist *l = curl_slist_append(NULL, types[o->proto]);
  /* No "Expect: 100-continue" round trip before a large batch. */
  struct curl_slist *l2 = l ? curl_slist_append(l, "Expect:") : NULL;
  /* gRPC: the server must know the client reads trailers. */
  struct curl_slist *l3 =
      l2 && grpc ? curl_slist_append(l2, "TE: trailers") : l2;
  if (!l3) {
    curl_slist_free_all(l);
    curl_easy_cleanup(h);
    return NULL;
  }
  *hdrs = l3;
  if (grpc) {
    bool h2c = strncasecmp(o->url, "https://", 8) != 0;
    curl_easy_setopt(h, CURLOPT_HTTP_VERSION,
                     h2c ? (long)CURL_HTTP_VERSION_2_PRIOR_KNOWLEDGE
                         : (long)CURL_HTTP_VERSION_2TLS);
    /* libcurl before 8.0.0 (Debian 12's 7.88) fails the second request on
     * a reused prior-knowledge connection ("Error in the HTTP2 framing
     * layer", curl issue 10634): there, one connection per batch. */
    if (h2c && curl_version_info(CURLVERSION_NOW)->version_num < 0x080000)
      curl_easy_setopt(h, CURLOPT_FORBID_REUSE, 1L);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, o);
  }
  curl_easy_setopt(h, CURLOPT_URL, o->url);
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, *hdrs);
  curl_easy_setopt(h, CURLOPT_POST, 1L);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, o->timeout_ms);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, discard_body);
  curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, progress);
  curl_easy_setopt(h, CURLOPT_XFERINFODATA, o);
  curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
  return h;
}

static void *exporter_main(void *arg) {
  pr_otel_t *o = arg;
  struct curl_slist *hdrs = NULL;
  CURL *h;
  pr__log_adopt(o->logger); /* its client's log */
  h = make_handle(o, &hdrs);
  pr_span_t **batch = calloc(o->batch_max, sizeof *batch);
  pthread_mutex_lock(&o->lock);
  for (;;) {
    size_t n = 0;
    bool ok;
    if (o->stop)
      break;
    if (!o->head) {
      pthread_cond_wait(&o->wake, &o->lock);
      continue;
    }
    if (o->queued < o->batch_max && o->head->seq > o->flush_upto) {
      int64_t due = o->head->enqueued_ns + o->delay_ns;
      if (pr__now_ns() < due) {
        struct timespec ts;
        pr__deadline_after(CLOCK_MONOTONIC, due - pr__now_ns(), &ts);
        pthread_cond_timedwait(&o->wake, &o->lock, &ts);
        continue;
      }
    }
    o->inflight_seq = o->head->seq;
    while (o->head && n < o->batch_max && batch) {
      batch[n++] = o->head;
      o->head = o->head->next;
    }
    if (!o->head)
      o->tail = NULL;
    o->queued -= n;
    o->inflight = n;
    pthread_mutex_unlock(&o->lock);

    ok = batch && send_batch(o, h, batch, n);
    for (size_t i = 0; i < n; i++)
      span_free(batch[i]);

    pthread_mutex_lock(&o->lock);
    if (ok) {
      o->stats.exported += n;
    } else {
      o->stats.failed_requests++;
      o->stats.dropped += n;
    }
    o->inflight = 0;
    pthread_cond_broadcast(&o->done);
    if (!batch) { /* no memory for a batch: drop everything from now on */
      o->stop = true;
      break;
    }
  }
  /* Stopped: what is still queued is dropped. */
  while (o->head) {
    pr_span_t *s = o->head;
    o->head = s->next;
    o->stats.dropped++;
    span_free(s);
  }
  o->tail = NULL;
  o->queued = 0;
  pthread_cond_broadcast(&o->done);
  pthread_mutex_unlock(&o->lock);
  free(batch);
  if (h)
    curl_easy_cleanup(h);
  curl_slist_free_all(hdrs);
  return NULL;
}

/* Frees an exporter whose thread is not running (never started, or
 * joined). */
static void exporter_free(pr_otel_t *o) {
  pthread_cond_destroy(&o->wake);
  pthread_cond_destroy(&o->done);
  pthread_mutex_destroy(&o->lock);
  pr__otel_resource_free(&o->res);
  free(o->url);
  free(o);
}

/* Whether a span with seq <= target is queued or in flight (lock held). */
static bool pending_upto(const pr_otel_t *o, uint64_t target) {
  return (o->head && o->head->seq <= target) ||
         (o->inflight && o->inflight_seq <= target);
}

/* The first `len` bytes of `s` with the `cut` bytes at `at` replaced by
 * `with`, then `tail` (malloc'd), or NULL. */
static char *splice(const char *s, size_t len, size_t at, size_t cut,
                    const char *with, const char *tail) {
  size_t wl = strlen(with), tl = strlen(tail);
  char *out = malloc(len - cut + wl + tl + 1);
  if (!out)
    return NULL;
  memcpy(out, s, at);
  memcpy(out + at, with, wl);
  memcpy(out + at + wl, s + at + cut, len - at - cut);
  memcpy(out + len - cut + wl, tail, tl + 1);
  return out;
}

int pr__otel_target(const char *endpoint, pr_otlp_protocol_t protocol,
                    bool http2, char **url, pr_otlp_protocol_t *used,
                    char *warn, size_t warn_size) {
  const char *sep = strstr(endpoint, "://");
  size_t auth = sep ? (size_t)(sep - endpoint) + 3 : 0;
  size_t path = auth + strcspn(endpoint + auth, "/?#"); /* authority's end */
  size_t n = strlen(endpoint);
  bool port;
  if (warn_size)
    *warn = 0;
  *used = protocol;
  if (protocol == PR_OTLP_GRPC && http2) {
    *url = splice(endpoint, path, path, 0, "", PR_OTLP_GRPC_PATH);
    return *url ? 0 : -1;
  }
  if (n && endpoint[n - 1] == '/')
    n--;
  if (protocol != PR_OTLP_GRPC) {
    *url = splice(endpoint, n, n, 0, "", "/v1/traces");
    return *url ? 0 : -1;
  }
  /* No HTTP/2: http/protobuf, on OTLP/HTTP's port when the endpoint names
   * OTLP/gRPC's. */
  *used = PR_OTLP_HTTP_PROTOBUF;
  port = path - auth > 5 && !memcmp(endpoint + path - 5, ":4317", 5);
  *url = port ? splice(endpoint, n, path - 5, 5, ":4318", "/v1/traces")
              : splice(endpoint, n, n, 0, "", "/v1/traces");
  if (!*url)
    return -1;
  pr__errf(warn, warn_size,
           "otel_exporter_otlp_protocol (OTEL_EXPORTER_OTLP_PROTOCOL) is grpc, "
           "but this libcurl (%s) has no HTTP/2: spans go over http/protobuf "
           "to %s instead",
           curl_version(), *url);
  return 0;
}

pr_otel_t *pr__otel_open(const pr_otel_config_t *cfg, char *err,
                         size_t err_size) {
  pr_otel_t *o;
  char warn[512];
  bool http2;
  pthread_condattr_t ca;
  if (!cfg->endpoint || (strncmp(cfg->endpoint, "http://", 7) &&
                         strncmp(cfg->endpoint, "https://", 8))) {
    pr__errf(err, err_size,
             "otel_exporter_otlp_endpoint: \"%.200s\" is not an http:// or "
             "https:// URL",
             cfg->endpoint ? cfg->endpoint : "");
    return NULL;
  }
  pthread_once(&curl_once, curl_init);
  if (curl_init_rc != CURLE_OK) {
    pr__errf(err, err_size, "otel: curl_global_init failed: %s",
             curl_easy_strerror(curl_init_rc));
    return NULL;
  }
  o = calloc(1, sizeof *o);
  if (!o)
    goto oom;
  if (pr__otel_resource_parse(cfg->service_name, cfg->resource_attributes,
                              &o->res, err, err_size)) {
    free(o);
    return NULL;
  }
  http2 = !cfg->test_no_http2 &&
          (curl_version_info(CURLVERSION_NOW)->features & CURL_VERSION_HTTP2);
  if (pr__otel_target(cfg->endpoint, cfg->protocol, http2, &o->url, &o->proto,
                      warn, sizeof warn)) {
    pr__otel_resource_free(&o->res);
    free(o);
    goto oom;
  }
  if (*warn)
    pr__log(PR_LOG_WARN, "otel", "%s", warn);
  o->queue_max = cfg->queue_max ? cfg->queue_max : 2048;
  o->batch_max = cfg->batch_max ? cfg->batch_max : 512;
  o->delay_ns = (int64_t)(cfg->delay_ms ? cfg->delay_ms : 1000) * 1000000;
  o->timeout_ms = cfg->timeout_ms ? (long)cfg->timeout_ms : 10000;
  atomic_init(&o->abort, false);
  pthread_mutex_init(&o->lock, NULL);
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&o->wake, &ca);
  pthread_cond_init(&o->done, &ca);
  pthread_condattr_destroy(&ca);
  o->logger = pr__log_current();
  if (pthread_create(&o->thread, NULL, exporter_main, o)) {
    exporter_free(o);
    pr__errf(err, err_size, "otel: cannot start the exporter thread");
    return NULL;
  }
  pthread_mutex_lock(&reg_lock);
  o->reg_next = reg_head;
  reg_head = o;
  pthread_mutex_unlock(&reg_lock);
  return o;
oom:
  pr__errf(err, err_size, "out of memory");
  return NULL;
}

int pr__otel_flush(pr_otel_t *o, uint32_t timeout_ms) {
  struct timespec ts;
  uint64_t target;
  int rc = 0;
  if (!o)
    return 0;
  pr__deadline_after(CLOCK_MONOTONIC, (int64_t)timeout_ms * 1000000, &ts);
  pthread_mutex_lock(&o->lock);
  target = o->seq;
  if (o->flush_upto < target)
    o->flush_upto = target;
  pthread_cond_signal(&o->wake);
  /* Done when no queued or in-flight span has seq <= target (the queue is
   * in seq order, and the batch in flight was its head). */
  while (pending_upto(o, target)) {
    if (o->stop && !o->head && !o->inflight)
      break;
    if (pthread_cond_timedwait(&o->done, &o->lock, &ts) == ETIMEDOUT) {
      rc = pending_upto(o, target) ? -1 : 0;
      break;
    }
  }
  pthread_mutex_unlock(&o->lock);
  return rc;
}

int pr__otel_flush_all(uint32_t timeout_ms) {
  int64_t deadline = pr__now_ns() + (int64_t)timeout_ms * 1000000;
  int rc = 0;
  /* Held throughout: a close waits (at most timeout_ms) rather than
   * freeing an exporter being flushed. */
  pthread_mutex_lock(&reg_lock);
  for (pr_otel_t *o = reg_head; o; o = o->reg_next) {
    int64_t left = (deadline - pr__now_ns()) / 1000000;
    if (pr__otel_flush(o, left > 0 ? (uint32_t)left : 0))
      rc = -1;
  }
  pthread_mutex_unlock(&reg_lock);
  return rc;
}

int pr__otel_shutdown_all(uint32_t timeout_ms) {
  atomic_store(&otel_down, true);
  return pr__otel_flush_all(timeout_ms);
}

void pr__otel_close(pr_otel_t *o, uint32_t flush_ms) {
  if (!o)
    return;
  pthread_mutex_lock(&reg_lock);
  for (pr_otel_t **pp = &reg_head; *pp; pp = &(*pp)->reg_next)
    if (*pp == o) {
      *pp = o->reg_next;
      break;
    }
  pthread_mutex_unlock(&reg_lock);
  pr__otel_flush(o, flush_ms);
  atomic_store(&o->abort, true); /* a request still running ends now */
  pthread_mutex_lock(&o->lock);
  o->stop = true;
  pthread_cond_signal(&o->wake);
  pthread_mutex_unlock(&o->lock);
  pthread_join(o->thread, NULL);
  while (o->head) { /* ended after the thread stopped (no memory) */
    pr_span_t *s = o->head;
    o->head = s->next;
    span_free(s);
  }
  exporter_free(o);
}

void pr__otel_stats(pr_otel_t *o, pr_otel_stats_t *out) {
  if (!o) {
    memset(out, 0, sizeof *out);
    return;
  }
  pthread_mutex_lock(&o->lock);
  *out = o->stats;
  pthread_mutex_unlock(&o->lock);
}

/* ------------------------------------------------------------------- spans */

pr_span_t *pr__span_start(pr_otel_t *exp, const char *name, pr_span_kind_t kind,
                          const pr_span_ctx_t *from, pr_span_relation_t rel,
                          const char *tracestate) {
  pr_span_t *s;
  if (!exp || atomic_load_explicit(&otel_down, memory_order_relaxed))
    return NULL;
  s = calloc(1, sizeof *s);
  if (!s)
    return NULL;
  if (tracestate && *tracestate && !(s->tracestate = utf8_dup(tracestate))) {
    free(s);
    return NULL;
  }
  s->exp = exp;
  s->name = name;
  s->kind = kind;
  if (from && from->valid) {
    s->ctx.flags = from->flags;
    if (rel == PR_SPAN_CHILD) {
      memcpy(s->ctx.trace_id, from->trace_id, PR_TRACE_ID_LEN);
      memcpy(s->parent_id, from->span_id, PR_SPAN_ID_LEN);
      s->has_parent = true;
    } else {
      rand_id(s->ctx.trace_id, PR_TRACE_ID_LEN);
      s->link = *from;
    }
  } else {
    s->ctx.flags = 1; /* sampled */
    rand_id(s->ctx.trace_id, PR_TRACE_ID_LEN);
  }
  rand_id(s->ctx.span_id, PR_SPAN_ID_LEN);
  s->ctx.valid = true;
  s->start_ns = wall_ns();
  return s;
}

const pr_span_ctx_t *pr__span_ctx(const pr_span_t *s) {
  return s ? &s->ctx : NULL;
}

/* The span's next free attribute slot with its key set (counted only once
 * the caller commits it), or NULL when the span is NULL or full. */
static pr_span_attr_t *attr_slot(pr_span_t *s, const char *key) {
  pr_span_attr_t *a;
  if (!s || s->nattrs >= PR_SPAN_ATTR_MAX)
    return NULL;
  a = &s->attrs[s->nattrs];
  a->key = key;
  return a;
}

void pr__span_attr_str(pr_span_t *s, const char *key, const char *v,
                       size_t len) {
  pr_span_attr_t *a = v ? attr_slot(s, key) : NULL;
  if (!a)
    return;
  if (len == SIZE_MAX)
    len = strlen(v);
  if (!(a->s = utf8_copy(v, len, &a->slen)))
    return;
  a->is_str = true;
  s->nattrs++;
}

void pr__span_attr_int(pr_span_t *s, const char *key, int64_t v) {
  pr_span_attr_t *a = attr_slot(s, key);
  if (!a)
    return;
  a->is_str = false;
  a->i = v;
  s->nattrs++;
}

void pr__span_set_error(pr_span_t *s, const char *message) {
  if (!s)
    return;
  s->error = true;
  free(s->status_msg);
  s->status_msg = message ? utf8_dup(message) : NULL;
}

void pr__span_end(pr_span_t *s) {
  pr_otel_t *o;
  bool dropped = false;
  if (!s)
    return;
  o = s->exp;
  s->end_ns = wall_ns();
  s->enqueued_ns = pr__now_ns();
  s->next = NULL;
  pthread_mutex_lock(&o->lock);
  s->seq = ++o->seq;
  if (o->stop || o->queued >= o->queue_max) {
    o->stats.dropped++;
    dropped = true;
  } else {
    if (o->tail)
      o->tail->next = s;
    else
      o->head = s;
    o->tail = s;
    if (++o->queued == 1 || o->queued >= o->batch_max)
      pthread_cond_signal(&o->wake);
  }
  pthread_mutex_unlock(&o->lock);
  if (dropped)
    span_free(s);
}

void pr__span_discard(pr_span_t *s) {
  if (s)
    span_free(s);
}
