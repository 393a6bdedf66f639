/*
 * Span export to a receiver that is down never holds the consumer up: a
 * consumer and its producer whose OTLP endpoint is a closed loopback port
 * (and a second pair whose receiver accepts connections and never
 * answers) handle and send everything as they would without export, the
 * spans are counted as dropped in /metrics, none as exported, and the
 * clients close within their flush bound.
 */
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "harness.h"

#define N 400

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int handled;

static prosody_result_t on_message(prosody_context_t *ctx,
                                   const prosody_message_t *m, void *opaque) {
  int spanned = 0;
  (void)ctx;
  (void)opaque;
  /* The spans exist (export is on), whatever becomes of them. */
  CHECK(prosody_message_traceparent(m, &spanned) && spanned,
        "no receive span while export is on");
  pthread_mutex_lock(&mu);
  handled++;
  pthread_mutex_unlock(&mu);
  return PROSODY_SUCCESS;
}

static void run(const char *endpoint, const char *what, int all_dropped) {
  char err[1024], group[64];
  const char *topic = t_topic("trace-down");
  prosody_handler_t h = {on_message, NULL, NULL, 0};
  prosody_config_t *conf;
  prosody_client_t *c;
  double t0, t_send, t_close;
  long long dropped, exported;
  int port;

  handled = 0;
  snprintf(group, sizeof(group), "trace-down-%d-%s", (int)getpid(), what);
  t_create_topic(topic, 2);
  conf = t_consumer_config(group, topic);
  t_set(conf, "otel_exporter_otlp_endpoint", endpoint);
  t_set(conf, "source_system", "trace-down-sender"); /* its records are read */
  t_set(conf, "probe_port", "0");
  CHECK(c = prosody_client_new(conf, err, sizeof(err)), "client: %s", err);
  CHECK_OK(prosody_subscribe(c, &h, err, sizeof(err)), err);
  port = prosody_probe_port(c);
  CHECK(port > 0, "probe port");
  t0 = t_now();
  for (int i = 0; i < N; i++) {
    char key[16];
    snprintf(key, sizeof(key), "k%d", i % 20);
    CHECK_OK(prosody_send_async(c, topic, key, "{\"n\":1}", NULL, t_ignore_cb,
                                NULL, err, sizeof(err)),
             err);
  }
  t_send = t_now() - t0;
  CHECK(t_wait_locked(&mu, &handled, N, 60), "%s: %d of %d handled", what,
        t_locked_int(&mu, &handled), N);
  CHECK(!t_send_failures, "%s: sends failed", what);
  /* A refused connection fails at once: every span of the run (a send and
   * a receive per record) ends up dropped. A silent receiver holds each
   * request for the exporter's timeout: its spans wait in the queue. */
  {
    double deadline = t_now() + 30;
    while ((dropped = t_metric(port, "prosody_spans_dropped_total")) < 2 * N &&
           all_dropped && t_now() < deadline)
      usleep(100000);
  }
  exported = t_metric(port, "prosody_spans_exported_total");
  CHECK(dropped >= (all_dropped ? 2 * N : 0),
        "%s: %lld spans counted as dropped, want >= %d", what, dropped,
        all_dropped ? 2 * N : 0);
  CHECK(exported == 0, "%s: %lld spans exported to a dead receiver", what,
        exported);
  t0 = t_now();
  prosody_client_destroy(c);
  t_close = t_now() - t0;
  /* 2 s of flush at most, on top of the consumer's own shutdown. */
  CHECK(t_close < 10, "%s: closing took %.1f s", what, t_close);
  printf("%s: %d handled, %lld spans dropped, queueing %d sends took %.3f s, "
         "close %.2f s\n",
         what, N, dropped, N, t_send, t_close);
}

T_SCENARIO(closed_port_receiver_holds_nothing_up, T_BOTH, 60) {
  run("http://127.0.0.1:1", "closed-port", 1);
  return 0;
}

/* A receiver that accepts connections (the kernel's backlog) and never
 * answers: each request waits out the exporter's timeout. */
T_SCENARIO(silent_receiver_holds_nothing_up, T_BOTH, 60) {
  struct sockaddr_in a = {0};
  socklen_t alen = sizeof(a);
  char url[64];
  int fd;

  fd = socket(AF_INET, SOCK_STREAM, 0);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  CHECK(!bind(fd, (struct sockaddr *)&a, sizeof(a)) && !listen(fd, 64) &&
            !getsockname(fd, (struct sockaddr *)&a, &alen),
        "listener");
  snprintf(url, sizeof(url), "http://127.0.0.1:%d", ntohs(a.sin_port));
  run(url, "silent-receiver", 0);
  close(fd);
  return 0;
}
