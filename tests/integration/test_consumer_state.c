/*
 * test_consumer_state.c - what a consumer that could not start, or whose
 * probe server could not, tells its host:
 *  - a subscribe that fails (timers outside mock mode without
 *    cassandra_nodes) is logged at ERROR (subsystem "consumer") and
 *    prosody_consumer_state() says "configuration-failed" until a later
 *    subscribe starts the consumer ("running", then "configured" after
 *    unsubscribe);
 *  - a probe_port already taken does not stop the consumer: subscribe
 *    succeeds, the state is "running", prosody_probe_port() is -1 and the
 *    failure is logged at ERROR (subsystem "probe").
 * Mock tier only: the first client points at a closed port, the second
 * uses the embedded mock.
 */
#include <errno.h>

#include "harness.h"

/* ERROR lines of the client under test, by subsystem (the log callback
 * runs on the client's threads; read after the calls that log them). */
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static char error_line[2][512]; /* [0] "consumer", [1] "probe" */

static void log_cb(prosody_log_level_t level, const char *subsystem,
                   const char *message, void *opaque) {
  int i = !strcmp(subsystem, "consumer") ? 0
          : !strcmp(subsystem, "probe")  ? 1
                                         : -1;
  (void)opaque;
  if (level != PROSODY_LOG_ERROR || i < 0)
    return;
  pthread_mutex_lock(&log_lock);
  snprintf(error_line[i], sizeof(error_line[i]), "%s", message);
  pthread_mutex_unlock(&log_lock);
}

static void error_logged(int i, char *out, size_t n) {
  pthread_mutex_lock(&log_lock);
  snprintf(out, n, "%s", error_line[i]);
  error_line[i][0] = '\0';
  pthread_mutex_unlock(&log_lock);
}

static prosody_result_t on_message(prosody_context_t *ctx,
                                   const prosody_message_t *m, void *op) {
  (void)ctx, (void)m, (void)op;
  return PROSODY_SUCCESS;
}

static prosody_result_t on_timer(prosody_context_t *ctx,
                                 const prosody_timer_t *t, void *op) {
  (void)ctx, (void)t, (void)op;
  return PROSODY_SUCCESS;
}

/* A failed start is reported, and a later successful one clears it. */
T_SCENARIO(failed_start_logged_and_reported_until_a_start, T_MOCK, 30) {
  char err[1024], line[512];
  prosody_config_t *conf = prosody_config_new();
  prosody_client_t *c;
  prosody_handler_t timers = {on_message, on_timer, NULL, 0};
  prosody_handler_t plain = {on_message, NULL, NULL, 0};
  prosody_err_t e;

  t_set(conf, "bootstrap_servers", "127.0.0.1:1");
  t_set(conf, "group_id", "state-failed");
  t_set(conf, "subscribed_topics", "orders");
  t_set(conf, "probe_port", "none");
  t_set(conf, "shutdown_timeout", "1s");
  prosody_config_set_log_cb(conf, log_cb, NULL);
  c = prosody_client_new(conf, err, sizeof(err));
  CHECK(c, "%s", err);
  CHECK(!strcmp(prosody_consumer_state(c), "configured"), "state: %s",
        prosody_consumer_state(c));

  e = prosody_subscribe(c, &timers, err, sizeof(err));
  CHECK(e == PROSODY_ERR_CONFIG && strstr(err, "cassandra_nodes"),
        "subscribe without cassandra_nodes: %s (%s)", prosody_err_name(e), err);
  CHECK(!strcmp(prosody_consumer_state(c), "configuration-failed"),
        "state after a failed subscribe: %s", prosody_consumer_state(c));
  error_logged(0, line, sizeof(line));
  CHECK(strstr(line, "did not start") && strstr(line, "cassandra_nodes"),
        "no ERROR line of the consumer naming the cause: \"%s\"", line);

  /* Without timers no Cassandra is needed: the consumer starts (librdkafka
   * needs no broker for that) and the failure is forgotten. */
  CHECK_OK(prosody_subscribe(c, &plain, err, sizeof(err)), err);
  CHECK(!strcmp(prosody_consumer_state(c), "running"), "state: %s",
        prosody_consumer_state(c));
  CHECK_OK(prosody_unsubscribe(c), "unsubscribe");
  CHECK(!strcmp(prosody_consumer_state(c), "configured"),
        "state after unsubscribe: %s", prosody_consumer_state(c));
  prosody_client_destroy(c);
  return 0;
}

/* A probe port in use: the consumer runs without its probe server. */
T_SCENARIO(taken_probe_port_leaves_the_consumer_running, T_MOCK, 60) {
  char err[1024], line[512], port_text[16];
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_addr.s_addr = htonl(INADDR_ANY)};
  socklen_t len = sizeof(a);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  prosody_config_t *conf;
  prosody_client_t *c;
  prosody_handler_t h = {on_message, NULL, NULL, 0};

  CHECK(fd >= 0 && !bind(fd, (struct sockaddr *)&a, sizeof(a)) &&
            !listen(fd, 1) && !getsockname(fd, (struct sockaddr *)&a, &len),
        "could not listen on a port of our own: %s", strerror(errno));
  snprintf(port_text, sizeof(port_text), "%d", ntohs(a.sin_port));

  conf = t_consumer_config("state-probe", t_topic("state-probe"));
  t_set(conf, "probe_port", port_text);
  prosody_config_set_log_cb(conf, log_cb, NULL);
  c = prosody_client_new(conf, err, sizeof(err));
  CHECK(c, "%s", err);
  CHECK_OK(prosody_subscribe(c, &h, err, sizeof(err)), err);
  CHECK(!strcmp(prosody_consumer_state(c), "running"), "state: %s",
        prosody_consumer_state(c));
  CHECK(prosody_probe_port(c) == -1, "probe port %d, though %s is taken",
        prosody_probe_port(c), port_text);
  error_logged(1, line, sizeof(line));
  CHECK(strstr(line, port_text) && strstr(line, "without /readyz"),
        "no ERROR line of the probe naming port %s: \"%s\"", port_text, line);
  CHECK_OK(prosody_unsubscribe(c), "unsubscribe");
  prosody_client_destroy(c);
  close(fd);
  return 0;
}
