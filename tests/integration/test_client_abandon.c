/*
 * A consumer whose handler outlives shutdown_timeout and the stop's grace
 * is abandoned by prosody_client_destroy(); its threads may still log
 * (here the worker, once the handler is released, logs through the
 * library's logger as any of its code would), but never to the
 * application's log callback after destroy has returned (the callback's
 * opaque may be freed by then): those lines go to standard error.
 *
 * The client keeps what the abandoned engine still reads (its settings,
 * the mock cluster), and its telemetry starts no Kafka handle after
 * destroy has returned.
 *
 * The abandoned engine is leaked by design, and its thread is never
 * joined: not run under the sanitizers (label nosan).
 */
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>

#include "config/config.h"
#include "harness.h"
#include "util/util.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int started, released; /* guarded by mu */
static atomic_int destroyed, late_calls, calls;

static prosody_result_t on_message(prosody_context_t *ctx,
                                   const prosody_message_t *m, void *opaque) {
  (void)ctx;
  (void)m;
  (void)opaque;
  pthread_mutex_lock(&mu);
  started = 1;
  while (!released) /* ignores cancellation: outlives the shutdown */
    pthread_cond_wait(&cv, &mu);
  pthread_mutex_unlock(&mu);
  /* The worker thread logs to the client's logger, as the library does. */
  PR_WARN("engine", "a line from the abandoned engine's worker");
  return PROSODY_SUCCESS;
}

static void on_log(prosody_log_level_t level, const char *subsystem,
                   const char *message, void *opaque) {
  (void)level;
  (void)subsystem;
  (void)message;
  (void)opaque;
  atomic_fetch_add(&calls, 1);
  if (atomic_load(&destroyed))
    atomic_fetch_add(&late_calls, 1);
}

T_SCENARIO(abandoned_engine_logs_to_stderr_not_callback, T_MOCK, 60) {
  char err[1024], group[64], buf[4096];
  const char *topic = t_topic("abandon");
  prosody_handler_t h = {on_message, NULL, NULL, 0};
  pr__test_opts_t test = {.stop_grace_ms = 300};
  prosody_config_t *conf;
  prosody_client_t *c;
  int fds[2], saved;
  size_t got = 0;
  double deadline;

  /* Freed memory is overwritten (glibc), so the abandoned engine's use of
   * what prosody_client_destroy() freed (the settings, read by its
   * telemetry) crashes every run, not once in a while. */
  mallopt(M_PERTURB, 0xa5);
  snprintf(group, sizeof(group), "abandon-%d", (int)getpid());
  t_create_topic(topic, 1);
  t_produce(topic, 0, 1, 1);
  conf = t_consumer_config(group, topic);
  t_set(conf, "shutdown_timeout", "200ms");
  t_set(conf, "log", "info");
  pr__config_set_test(conf, &test);
  prosody_config_set_log_cb(conf, on_log, NULL);
  CHECK(c = prosody_client_new(conf, err, sizeof(err)), "client: %s", err);
  CHECK_OK(prosody_subscribe(c, &h, err, sizeof(err)), err);
  CHECK(t_wait_locked(&mu, &started, 1, 60), "the handler did not start");

  /* Standard error into a pipe, to see the abandoned engine's last line. */
  CHECK(!pipe(fds) && fcntl(fds[0], F_SETFL, O_NONBLOCK) == 0, "pipe");
  saved = dup(2);
  CHECK(dup2(fds[1], 2) == 2, "dup2");

  prosody_client_destroy(c); /* abandons the engine after 200 + 300 ms */
  atomic_store(&destroyed, 1);
  CHECK(atomic_load(&calls) > 0, "no line reached the callback at all");
  pthread_mutex_lock(&mu);
  released = 1;
  pthread_cond_broadcast(&cv);
  pthread_mutex_unlock(&mu);

  /* The worker's line, on standard error. */
  deadline = t_now() + 60;
  buf[0] = '\0';
  while (!strstr(buf, "abandoned engine's worker") && t_now() < deadline) {
    ssize_t r = read(fds[0], buf + got, sizeof(buf) - 1 - got);
    if (r > 0) {
      got += (size_t)r;
      buf[got] = '\0';
      if (got > sizeof(buf) / 2) { /* keep the tail */
        memmove(buf, buf + got / 2, got - got / 2 + 1);
        got -= got / 2;
      }
    } else {
      usleep(10000);
    }
  }
  dup2(saved, 2);
  fprintf(stderr, "%s", buf);
  CHECK(strstr(buf, "abandoned engine's worker"),
        "the abandoned engine's line did not reach standard error");
  CHECK(atomic_load(&late_calls) == 0,
        "%d line(s) reached the callback after prosody_client_destroy "
        "returned",
        atomic_load(&late_calls));
  printf("ok: an abandoned engine's later lines go to standard error, not "
         "to the destroyed client's callback\n");
  return 0;
}
