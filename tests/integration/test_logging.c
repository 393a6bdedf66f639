/*
 * test_logging.c - each client logs through its own callback at its own
 * level: two clients in one process, one at debug, one at warn. Each
 * sees its own engine's lines (assignment at info, a handler failure at
 * warn) and none of the other's; the warn client sees nothing below warn.
 */
#include <pthread.h>
#include <stdatomic.h>

#include "harness.h"

typedef struct sink {
  pthread_mutex_t lock;
  char lines[256][256]; /* guarded by lock */
  int n, below_warn;    /* guarded by lock */
} sink_t;

static sink_t quiet, verbose; /* their locks: initialised in main */

static void on_log(prosody_log_level_t level, const char *subsystem,
                   const char *message, void *opaque) {
  sink_t *s = opaque;
  pthread_mutex_lock(&s->lock);
  if (s->n < 256)
    snprintf(s->lines[s->n++], sizeof(s->lines[0]), "%d %s %s", (int)level,
             subsystem, message);
  if (level > PROSODY_LOG_WARN)
    s->below_warn++;
  pthread_mutex_unlock(&s->lock);
}

/* How many of the sink's lines contain `what` (and `also`, if given). */
static int count(sink_t *s, const char *what, const char *also) {
  int n = 0;
  pthread_mutex_lock(&s->lock);
  for (int i = 0; i < s->n; i++)
    if (strstr(s->lines[i], what) && (!also || strstr(s->lines[i], also)))
      n++;
  pthread_mutex_unlock(&s->lock);
  return n;
}

static atomic_int handled;

/* Fails each key's first record once (a warning), then succeeds. */
static prosody_result_t on_message(prosody_context_t *ctx,
                                   const prosody_message_t *m, void *op) {
  static atomic_int failed;
  (void)ctx;
  (void)op;
  if (!strcmp(prosody_message_key(m), "key-0") &&
      atomic_exchange(&failed, 1) == 0)
    return PROSODY_TRANSIENT;
  atomic_fetch_add(&handled, 1);
  return PROSODY_SUCCESS;
}

static prosody_client_t *client(const char *topic, const char *group,
                                const char *level, sink_t *s) {
  char err[1024];
  prosody_config_t *conf = t_consumer_config(group, topic);
  prosody_client_t *c;
  t_set(conf, "log", level);
  t_set(conf, "retry_base", "10ms");
  prosody_config_set_log_cb(conf, on_log, s);
  c = prosody_client_new(conf, err, sizeof(err));
  CHECK(c, "client: %s", err);
  return c;
}

T_SCENARIO(each_client_logs_through_own_callback_at_own_level, T_MOCK, 60) {
  char err[1024], t1[128], t2[128], g1[160], g2[160];
  prosody_client_t *v, *q;
  prosody_handler_t h = {on_message, NULL, NULL, 0};

  pthread_mutex_init(&quiet.lock, NULL);
  pthread_mutex_init(&verbose.lock, NULL);
  snprintf(t1, sizeof(t1), "%s", t_topic("log-verbose"));
  snprintf(t2, sizeof(t2), "%s", t_topic("log-quiet"));
  snprintf(g1, sizeof(g1), "%s-g", t1);
  snprintf(g2, sizeof(g2), "%s-g", t2);
  t_create_topic(t1, 1);
  t_create_topic(t2, 1);
  v = client(t1, g1, "debug", &verbose);
  q = client(t2, g2, "warn", &quiet);
  CHECK_OK(prosody_subscribe(v, &h, err, sizeof(err)), err);
  CHECK_OK(prosody_subscribe(q, &h, err, sizeof(err)), err);
  t_produce(t2, 0, 10, 5); /* the quiet client's key-0 fails once */
  CHECK(t_wait_at_least(&handled, 10, 60), "handled %d of 10",
        atomic_load(&handled));
  t_produce(t1, 0, 10, 5);
  CHECK(t_wait_at_least(&handled, 20, 60), "handled %d of 20",
        atomic_load(&handled));
  CHECK_OK(prosody_unsubscribe(v), "unsubscribe");
  CHECK_OK(prosody_unsubscribe(q), "unsubscribe");
  prosody_client_destroy(v);
  prosody_client_destroy(q);

  /* The verbose client: its engine's info lines (assignment, stop), with
   * the subsystem apart from the message, and no line of the other's. */
  CHECK(count(&verbose, "3 engine assigned 1 partition", NULL) >= 1,
        "the debug client's callback got no assignment line (%d lines)",
        verbose.n);
  CHECK(count(&verbose, "consumer stopped", NULL) == 1,
        "the debug client's callback got no stop line");
  CHECK(count(&verbose, t2, NULL) == 0,
        "the debug client's callback got a line about the other's topic");
  CHECK(count(&verbose, "handler failure", NULL) == 0,
        "the other client's warning reached the debug client");
  /* The quiet client: its warning (from the retry layer, or the defer
   * layer when the failure is deferred: which depends on whether a
   * success was counted first), nothing below warn. */
  CHECK(count(&quiet, "transient handler failure", NULL) == 1,
        "the warn client's callback did not get its handler's failure");
  CHECK(quiet.below_warn == 0, "the warn client got %d lines below warn",
        quiet.below_warn);
  CHECK(count(&quiet, t1, NULL) == 0,
        "the warn client's callback got a line about the other's topic");
  printf("ok: %d lines at debug, %d at warn, each client its own\n", verbose.n,
         quiet.n);
  return 0;
}
