/*
 * A deferred timer's retries keep the trace context it was scheduled in.
 *
 * A record sent under a trace of the test's own (T0) schedules a timer
 * from its handler; timer_spans=child, so the timer's span is a child in
 * T0. The timer fails once and is deferred (written to its key's defer
 * queue, the event freed); its retry, made again from (key, time), must
 * still run in a span of T0, not in a new trace. Export goes to a closed
 * port: the spans exist and are dropped.
 */
#include <stdio.h>
#include <string.h>

#include "harness.h"

#define P0 "00f067aa0ba902b7"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
/* guarded by mu: the handlers' traceparents and whether they were spanned */
static char tp_msg[64], tp_timer[2][64];
static int got_msg, timer_runs, spanned[2];

static prosody_result_t on_message(prosody_context_t *ctx,
                                   const prosody_message_t *m, void *opaque) {
  char err[512];
  const char *tp = prosody_message_traceparent(m, NULL);
  (void)opaque;
  CHECK_OK(
      prosody_schedule(ctx, (int64_t)(t_now() * 1000) + 500, err, sizeof(err)),
      err);
  pthread_mutex_lock(&mu);
  snprintf(tp_msg, sizeof(tp_msg), "%s", tp ? tp : "");
  got_msg = 1;
  pthread_mutex_unlock(&mu);
  return PROSODY_SUCCESS;
}

static prosody_result_t on_timer(prosody_context_t *ctx,
                                 const prosody_timer_t *t, void *opaque) {
  int s = 0, run;
  const char *tp = prosody_timer_traceparent(t, &s);
  (void)ctx;
  (void)opaque;
  pthread_mutex_lock(&mu);
  run = timer_runs < 2 ? timer_runs : 1;
  snprintf(tp_timer[run], sizeof(tp_timer[run]), "%s", tp ? tp : "");
  spanned[run] = s;
  timer_runs++;
  pthread_mutex_unlock(&mu);
  return run == 0 ? PROSODY_TRANSIENT : PROSODY_SUCCESS;
}

T_SCENARIO(deferred_timer_retry_keeps_scheduling_trace, T_BOTH, 60) {
  char err[1024], group[64], root_tp[64], t0[33];
  const char *topic = t_topic("trace-defer");
  prosody_trace_t root = {.traceparent = root_tp};
  prosody_handler_t h = {on_message, on_timer, NULL, 0};
  prosody_config_t *conf;
  prosody_client_t *c;
  int port;

  srand((unsigned)(getpid() ^ (int)(t_now() * 1000)));
  for (int i = 0; i < 32; i++)
    t0[i] = "0123456789abcdef"[rand() % 16];
  t0[0] = '1';
  t0[32] = '\0';
  snprintf(root_tp, sizeof(root_tp), "00-%s-%s-01", t0, P0);
  snprintf(group, sizeof(group), "trace-defer-%d", (int)getpid());
  t_create_topic(topic, 1);
  conf = t_consumer_config(group, topic);
  t_set(conf, "otel_exporter_otlp_endpoint", "http://127.0.0.1:1");
  t_set(conf, "timer_spans", "child");
  t_set(conf, "source_system", "trace-defer-sender"); /* its records are read */
  t_set(conf, "probe_port", "0");
  CHECK(c = prosody_client_new(conf, err, sizeof(err)), "client: %s", err);
  CHECK_OK(prosody_subscribe(c, &h, err, sizeof(err)), err);
  port = prosody_probe_port(c);
  CHECK_OK(prosody_send(c, topic, "k1", "{\"n\":1}", &root, err, sizeof(err)),
           err);
  CHECK(t_wait_locked(&mu, &timer_runs, 2, 60) >= 2,
        "the timer was not retried (%d runs)", timer_runs);
  /* Deferred, not retried in place: its event was made again. */
  CHECK(t_metric(port, "prosody_deferred_total") >= 1,
        "the failing timer was not deferred");
  prosody_client_destroy(c);

  CHECK(!strncmp(tp_msg + 3, t0, 32), "the record left the caller's trace: %s",
        tp_msg);
  CHECK(spanned[0] && spanned[1], "timer handlers without spans (%d %d)",
        spanned[0], spanned[1]);
  CHECK(!strncmp(tp_timer[0] + 3, t0, 32),
        "first timer run not in the scheduling trace: %s", tp_timer[0]);
  CHECK(!strncmp(tp_timer[1] + 3, t0, 32),
        "the deferred timer's retry lost its trace: %s (want trace %s)",
        tp_timer[1], t0);
  CHECK(strcmp(tp_timer[0], tp_timer[1]), "the retry reused the first span");
  printf("ok: a deferred timer's retry runs in the trace it was scheduled "
         "in\n");
  return 0;
}
