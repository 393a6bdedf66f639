/*
 * test_otel_export.c - the OTLP exporter (src/otel/otel.c) never blocks the
 * thread that ends spans, and counts what it drops: against a closed
 * loopback port (every request fails at once) and against a loopback
 * listener that accepts and never answers (every request times out).
 * Both: 10 000 spans ended in well under the bound only a blocking
 * implementation would exceed; the counters reach the expected values
 * (awaited with a bounded poll, never a fixed sleep); close returns within
 * its flush bound. And against a loopback HTTP receiver of its own: the
 * path and content type, a 503 retried once, a 400 counted and not
 * retried, batches of at most batch_max, flush; and grpc where libcurl has
 * no HTTP/2: http/protobuf to the same receiver, with one warning.
 */
#include <inttypes.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "otel/otel.h"
#include "util/util.h"

#define N_SPANS 10000
/* Ending 10 000 spans takes milliseconds; a thread that waited for the
 * network even once per batch would take seconds. Generous for sanitizers
 * on a shared 2-core machine. */
#define END_BOUND_MS 3000

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int listen_loopback(int *port) {
  struct sockaddr_in a = {.sin_family = AF_INET};
  socklen_t len = sizeof a;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  assert_true(fd >= 0);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
  assert_int_equal(listen(fd, 64), 0);
  assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
  *port = ntohs(a.sin_port);
  return fd;
}

/* Ends N_SPANS spans with a few attributes; returns the milliseconds. */
static int64_t end_spans(pr_otel_t *o) {
  int64_t t0 = now_ms();
  for (int i = 0; i < N_SPANS; i++) {
    pr_span_t *s = pr__span_start(o, "message", PR_SPAN_CONSUMER, NULL,
                                  PR_SPAN_CHILD, NULL);
    assert_non_null(s);
    pr__span_attr_str(s, "messaging.destination.name", "orders", SIZE_MAX);
    pr__span_attr_int(s, "messaging.kafka.offset", i);
    if (i % 100 == 0)
      pr__span_set_error(s, "failed");
    pr__span_end(s);
  }
  return now_ms() - t0;
}

/* Polls the stats until `done` holds, at most `ms`; the last snapshot. */
static pr_otel_stats_t
await_stats(pr_otel_t *o, int (*done)(const pr_otel_stats_t *), int ms) {
  pr_otel_stats_t st;
  int64_t deadline = now_ms() + ms;
  for (;;) {
    pr__otel_stats(o, &st);
    if (done(&st) || now_ms() > deadline)
      return st;
    usleep(10000);
  }
}

static int all_dropped(const pr_otel_stats_t *st) {
  return st->dropped == N_SPANS;
}

static int some_failed(const pr_otel_stats_t *st) {
  return st->failed_requests >= 2;
}

static void test_closed_port(void **state) {
  char url[64], err[256];
  int port, fd = listen_loopback(&port);
  pr_otel_t *o;
  pr_otel_stats_t st;
  int64_t ms, t0;
  (void)state;
  close(fd); /* nothing listens there any more */
  snprintf(url, sizeof url, "http://127.0.0.1:%d/", port);
  pr_otel_config_t cfg = {.endpoint = url, .delay_ms = 20, .timeout_ms = 2000};
  o = pr__otel_open(&cfg, err, sizeof err);
  assert_non_null(o);
  ms = end_spans(o);
  printf("closed port: %d spans ended in %" PRId64 " ms\n", N_SPANS, ms);
  assert_true(ms < END_BOUND_MS);
  /* Every span is eventually dropped: queue full, or its request failed. */
  st = await_stats(o, all_dropped, 30000);
  printf("closed port: exported %" PRIu64 " dropped %" PRIu64
         " failed_requests %" PRIu64 "\n",
         st.exported, st.dropped, st.failed_requests);
  assert_int_equal(st.dropped, N_SPANS);
  assert_true(st.failed_requests > 0);
  assert_int_equal(st.exported, 0);
  /* Nothing waits: flush returns at once. */
  assert_int_equal(pr__otel_flush(o, 1000), 0);
  t0 = now_ms();
  pr__otel_close(o, 500);
  assert_true(now_ms() - t0 < 1500);
}

static void *acceptor(void *arg) {
  int lfd = *(int *)arg, fds[64], n = 0;
  for (;;) {
    int c = accept(lfd, NULL, NULL);
    if (c < 0)
      break; /* the listener was shut down */
    if (n < 64)
      fds[n++] = c; /* kept open, never answered */
    else
      close(c);
  }
  for (int i = 0; i < n; i++)
    close(fds[i]);
  return NULL;
}

static void test_slow_receiver(void **state) {
  char url[64], err[256];
  int port, fd = listen_loopback(&port);
  pthread_t th;
  pr_otel_t *o;
  pr_otel_stats_t st;
  int64_t ms, t0;
  (void)state;
  assert_int_equal(pthread_create(&th, NULL, acceptor, &fd), 0);
  snprintf(url, sizeof url, "http://127.0.0.1:%d", port);
  pr_otel_config_t cfg = {.endpoint = url,
                          .protocol = PR_OTLP_HTTP_JSON,
                          .queue_max = 1000,
                          .batch_max = 100,
                          .delay_ms = 20,
                          .timeout_ms = 200};
  o = pr__otel_open(&cfg, err, sizeof err);
  assert_non_null(o);
  ms = end_spans(o);
  printf("slow receiver: %d spans ended in %" PRId64 " ms\n", N_SPANS, ms);
  assert_true(ms < END_BOUND_MS);
  /* The queue (1000) filled while the first request hung: drops at once. */
  pr__otel_stats(o, &st);
  assert_true(st.dropped >= N_SPANS - 1000 - 100);
  /* Requests time out (200 ms each) and count. */
  st = await_stats(o, some_failed, 20000);
  printf("slow receiver: exported %" PRIu64 " dropped %" PRIu64
         " failed_requests %" PRIu64 "\n",
         st.exported, st.dropped, st.failed_requests);
  assert_true(st.failed_requests >= 2);
  assert_int_equal(st.exported, 0);
  /* A flush that cannot finish in time says so, within its bound. */
  t0 = now_ms();
  assert_int_equal(pr__otel_flush(o, 100), -1);
  assert_true(now_ms() - t0 < 1000);
  /* So does the process-wide flush, which covers this exporter. */
  t0 = now_ms();
  assert_int_equal(pr__otel_flush_all(100), -1);
  assert_true(now_ms() - t0 < 1000);
  /* close: flush bound 300 ms, then the request in flight is cut short. */
  t0 = now_ms();
  pr__otel_close(o, 300);
  ms = now_ms() - t0;
  printf("slow receiver: close took %" PRId64 " ms\n", ms);
  assert_true(ms < 1500);
  shutdown(fd, SHUT_RDWR);
  pthread_join(th, NULL);
  close(fd);
}

/* A loopback HTTP/1.1 receiver (keep-alive, one connection at a time):
 * answers each request with the next status of `script` (the last one
 * repeating) and records what it was sent. */
typedef struct receiver {
  int fd, port;
  const int *script;
  size_t nscript;
  pthread_t th;
  pthread_mutex_t lock; /* guards the fields below */
  int requests;
  char path[64], content_type[64];
  size_t body_bytes;
} receiver_t;

static const char *header(const char *head, const char *name, char *out,
                          size_t n) {
  const char *p = strcasestr(head, name);
  size_t i = 0;
  if (!p)
    return NULL;
  p += strlen(name);
  while (*p == ' ')
    p++;
  while (*p && *p != '\r' && i + 1 < n)
    out[i++] = *p++;
  out[i] = 0;
  return out;
}

static void *receiver_main(void *arg) {
  receiver_t *r = arg;
  static char buf[1 << 20];
  for (;;) {
    int c = accept(r->fd, NULL, NULL);
    size_t have = 0;
    if (c < 0)
      return NULL;
    for (;;) { /* one request after another on this connection */
      char *end, cl[32] = "0", path[64] = "", ct[64] = "", reply[128];
      size_t head_len, body;
      int status;
      ssize_t got;
      while (!(end = memmem(buf, have, "\r\n\r\n", 4))) {
        if (have == sizeof buf ||
            (got = read(c, buf + have, sizeof buf - have)) <= 0)
          goto next;
        have += (size_t)got;
      }
      head_len = (size_t)(end - buf) + 4;
      end[2] = 0; /* the headers as a string */
      header(buf, "Content-Length:", cl, sizeof cl);
      header(buf, "Content-Type:", ct, sizeof ct);
      sscanf(buf, "POST %63s", path);
      body = (size_t)atol(cl);
      while (have < head_len + body) {
        if (head_len + body > sizeof buf ||
            (got = read(c, buf + have, sizeof buf - have)) <= 0)
          goto next;
        have += (size_t)got;
      }
      pthread_mutex_lock(&r->lock);
      status = r->script[(size_t)r->requests < r->nscript ? (size_t)r->requests
                                                          : r->nscript - 1];
      r->requests++;
      snprintf(r->path, sizeof r->path, "%s", path);
      snprintf(r->content_type, sizeof r->content_type, "%s", ct);
      r->body_bytes += body;
      pthread_mutex_unlock(&r->lock);
      snprintf(reply, sizeof reply,
               "HTTP/1.1 %d X\r\nContent-Length: 0\r\n\r\n", status);
      if (write(c, reply, strlen(reply)) < 0)
        goto next;
      memmove(buf, buf + head_len + body, have - head_len - body);
      have -= head_len + body;
    }
  next:
    close(c);
  }
}

static void receiver_start(receiver_t *r, const int *script, size_t n) {
  memset(r, 0, sizeof *r);
  r->script = script;
  r->nscript = n;
  pthread_mutex_init(&r->lock, NULL);
  r->fd = listen_loopback(&r->port);
  assert_int_equal(pthread_create(&r->th, NULL, receiver_main, r), 0);
}

static void receiver_stop(receiver_t *r) {
  shutdown(r->fd, SHUT_RDWR);
  pthread_join(r->th, NULL);
  close(r->fd);
  pthread_mutex_destroy(&r->lock);
}

static int one_exported(const pr_otel_stats_t *st) { return st->exported >= 1; }

/* A receiver that answers: 503 once (retried), then 200; what it was
 * sent; the delay sends a lone span without a flush. */
static void test_answering_receiver(void **state) {
  static const int script[] = {503, 200};
  receiver_t r;
  char url[64], err[256];
  pr_otel_t *o;
  pr_otel_stats_t st;
  (void)state;
  receiver_start(&r, script, 2);
  snprintf(url, sizeof url, "http://127.0.0.1:%d/", r.port);
  pr_otel_config_t cfg = {.endpoint = url, .delay_ms = 50, .timeout_ms = 2000};
  o = pr__otel_open(&cfg, err, sizeof err);
  assert_non_null(o);
  pr__span_end(
      pr__span_start(o, "one", PR_SPAN_INTERNAL, NULL, PR_SPAN_CHILD, NULL));
  st = await_stats(o, one_exported, 5000);
  assert_int_equal(st.exported, 1);
  assert_int_equal(st.failed_requests, 0);
  assert_int_equal(st.dropped, 0);
  pthread_mutex_lock(&r.lock);
  assert_int_equal(r.requests, 2); /* 503, then the retry */
  assert_string_equal(r.path, "/v1/traces");
  assert_string_equal(r.content_type, "application/x-protobuf");
  pthread_mutex_unlock(&r.lock);
  /* 1200 more, in requests of at most 512, all accepted by the flush. */
  for (int i = 0; i < 1200; i++)
    pr__span_end(
        pr__span_start(o, "many", PR_SPAN_INTERNAL, NULL, PR_SPAN_CHILD, NULL));
  assert_int_equal(pr__otel_flush(o, 5000), 0);
  pr__otel_stats(o, &st);
  assert_int_equal(st.exported, 1201);
  assert_int_equal(st.dropped, 0);
  pthread_mutex_lock(&r.lock);
  /* At least three more: 512 + 512 + 176 (more when ending them took
   * longer than the delay, on a slow machine). */
  assert_true(r.requests >= 5);
  pthread_mutex_unlock(&r.lock);
  pr__otel_close(o, 1000);
  receiver_stop(&r);

  /* JSON, and a receiver that refuses (400): counted, never retried. */
  static const int refuse[] = {400};
  receiver_start(&r, refuse, 1);
  snprintf(url, sizeof url, "http://127.0.0.1:%d", r.port);
  cfg.endpoint = url;
  cfg.protocol = PR_OTLP_HTTP_JSON;
  o = pr__otel_open(&cfg, err, sizeof err);
  assert_non_null(o);
  for (int i = 0; i < 10; i++)
    pr__span_end(
        pr__span_start(o, "x", PR_SPAN_INTERNAL, NULL, PR_SPAN_CHILD, NULL));
  assert_int_equal(pr__otel_flush(o, 5000), 0);
  pr__otel_stats(o, &st);
  assert_int_equal(st.exported, 0);
  assert_int_equal(st.dropped, 10);
  assert_int_equal(st.failed_requests, 1);
  pthread_mutex_lock(&r.lock);
  assert_int_equal(r.requests, 1);
  assert_string_equal(r.content_type, "application/json");
  assert_string_equal(r.path, "/v1/traces");
  pthread_mutex_unlock(&r.lock);
  pr__otel_close(o, 1000);
  receiver_stop(&r);
}

static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static int no_http2_warnings; /* log_mu */

static void on_log(prosody_log_level_t level, const char *subsystem,
                   const char *message, void *opaque) {
  (void)opaque;
  if (level == PROSODY_LOG_WARN && !strcmp(subsystem, "otel") &&
      strstr(message, "no HTTP/2")) {
    pthread_mutex_lock(&log_mu);
    no_http2_warnings++;
    pthread_mutex_unlock(&log_mu);
  }
}

/* grpc with a libcurl that has no HTTP/2 (the test switch): the spans go
 * as http/protobuf to <endpoint>/v1/traces, and the exporter says so once,
 * not once per batch. */
static void test_grpc_fallback(void **state) {
  static const int ok[] = {200};
  receiver_t r;
  char url[64], err[256];
  pr_otel_t *o;
  pr_otel_stats_t st;
  pr__logger_t lg, *prev;
  (void)state;
  pr__logger_init(&lg, PR_LOG_INFO, on_log, NULL);
  prev = pr__log_adopt(&lg); /* the exporter's thread inherits it */
  receiver_start(&r, ok, 1);
  snprintf(url, sizeof url, "http://127.0.0.1:%d", r.port);
  pr_otel_config_t cfg = {.endpoint = url,
                          .protocol = PR_OTLP_GRPC,
                          .test_no_http2 = true,
                          .batch_max = 10,
                          .delay_ms = 50,
                          .timeout_ms = 2000};
  o = pr__otel_open(&cfg, err, sizeof err);
  assert_non_null(o);
  for (int i = 0; i < 30; i++)
    pr__span_end(
        pr__span_start(o, "x", PR_SPAN_INTERNAL, NULL, PR_SPAN_CHILD, NULL));
  assert_int_equal(pr__otel_flush(o, 5000), 0);
  pr__otel_stats(o, &st);
  assert_int_equal(st.exported, 30);
  assert_int_equal(st.failed_requests, 0);
  pthread_mutex_lock(&r.lock);
  assert_true(r.requests >= 3); /* batches of at most 10 */
  assert_string_equal(r.path, "/v1/traces");
  assert_string_equal(r.content_type, "application/x-protobuf");
  pthread_mutex_unlock(&r.lock);
  pr__otel_close(o, 1000);
  receiver_stop(&r);
  pr__log_adopt(prev);
  pr__logger_fini(&lg);
  pthread_mutex_lock(&log_mu);
  assert_int_equal(no_http2_warnings, 1);
  pthread_mutex_unlock(&log_mu);
}

/* The process-wide shutdown (prosody_telemetry_shutdown): nothing left to
 * export here, so it finishes at once; from then on no span starts, in an
 * exporter opened before or after. Last: it cannot be undone. */
static void test_shutdown_all(void **state) {
  char url[64], err[256];
  int port, fd = listen_loopback(&port);
  pr_otel_t *before, *after;
  (void)state;
  close(fd);
  snprintf(url, sizeof url, "http://127.0.0.1:%d/", port);
  pr_otel_config_t cfg = {.endpoint = url, .delay_ms = 20, .timeout_ms = 500};
  before = pr__otel_open(&cfg, err, sizeof err);
  assert_non_null(before);
  assert_int_equal(pr__otel_flush_all(1000), 0);
  assert_int_equal(pr__otel_shutdown_all(1000), 0);
  assert_null(pr__span_start(before, "message", PR_SPAN_CONSUMER, NULL,
                             PR_SPAN_CHILD, NULL));
  after = pr__otel_open(&cfg, err, sizeof err);
  assert_non_null(after);
  assert_null(pr__span_start(after, "message", PR_SPAN_CONSUMER, NULL,
                             PR_SPAN_CHILD, NULL));
  pr__otel_close(before, 100);
  pr__otel_close(after, 100);
  /* Closed exporters are off the list: nothing left to flush. */
  assert_int_equal(pr__otel_flush_all(100), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_grpc_fallback),
      cmocka_unit_test(test_closed_port),
      cmocka_unit_test(test_slow_receiver),
      cmocka_unit_test(test_answering_receiver),
      cmocka_unit_test(test_shutdown_all),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
