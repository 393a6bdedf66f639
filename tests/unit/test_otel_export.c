/*
 * test_otel_export.c - the OTLP exporter (src/otel/otel.c) never blocks the
 * thread that ends spans, and counts what it drops: against a closed
 * loopback port (every request fails at once) and against a loopback
 * listener that accepts and never answers (every request times out).
 * Both: 10 000 spans ended in well under the bound only a blocking
 * implementation would exceed; the counters reach the expected values
 * (awaited with a bounded poll, never a fixed sleep); close returns within
 * its flush bound.
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
                          .json = true,
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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_closed_port),
      cmocka_unit_test(test_slow_receiver),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
