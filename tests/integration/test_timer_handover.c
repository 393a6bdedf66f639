/*
 * test_timer_handover.c - durable timers (real Kafka + real Cassandra):
 *  - handover: a consumer in a child process schedules a timer per key;
 *    before they are due a second member joins in this process, so part of
 *    the partitions move to it; every timer fires exactly once, in one
 *    process or the other, close to its time, and the joining member fires
 *    some (it loaded them from Cassandra);
 *  - restart: a consumer schedules timers and stops before they are due; a
 *    new consumer of the group fires each exactly once;
 *  - a member without on_timer owning the partitions while the timers come
 *    due leaves them stored: the next member with on_timer fires each once.
 */
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>

#include "harness.h"

#define KEYS 24

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int fired_here[KEYS], fired_child[KEYS]; /* guarded by lock */
static int64_t late_ms[KEYS];                   /* guarded by lock */
static int scheduled_here;                      /* guarded by lock */

/* Payload "<k> <time ms>": schedule a timer for key k at that time. */
static prosody_result_t on_message(prosody_context_t *ctx,
                                   const prosody_message_t *msg, void *op) {
  char err[512];
  int k;
  long long at;
  if (sscanf(prosody_message_payload(msg), "\"%d %lld\"", &k, &at) != 2)
    return PROSODY_PERMANENT;
  if (prosody_schedule(ctx, at, err, sizeof(err))) {
    prosody_context_set_error(ctx, err);
    return PROSODY_TRANSIENT;
  }
  if (op) { /* the child reports each schedule */
    char line[32];
    int n = snprintf(line, sizeof(line), "s %d\n", k);
    if (write(STDOUT_FILENO, line, (size_t)n) != n)
      return PROSODY_TRANSIENT;
  } else {
    pthread_mutex_lock(&lock);
    scheduled_here++;
    pthread_mutex_unlock(&lock);
  }
  return PROSODY_SUCCESS;
}

static prosody_result_t on_timer(prosody_context_t *ctx,
                                 const prosody_timer_t *t, void *op) {
  int k = atoi(prosody_timer_key(t) + 1); /* "k<n>" */
  (void)ctx;
  if (k < 0 || k >= KEYS)
    return PROSODY_PERMANENT;
  if (op) {
    char line[32];
    int n = snprintf(line, sizeof(line), "f %d\n", k);
    if (write(STDOUT_FILENO, line, (size_t)n) != n)
      return PROSODY_TRANSIENT;
    return PROSODY_SUCCESS;
  }
  pthread_mutex_lock(&lock);
  fired_here[k]++;
  late_ms[k] = t_wall_ms() - prosody_timer_time(t);
  pthread_mutex_unlock(&lock);
  return PROSODY_SUCCESS;
}

static prosody_client_t *member(const char *topic, const char *group,
                                void *opaque) {
  char err[1024];
  prosody_config_t *conf = t_consumer_config(group, topic);
  prosody_handler_t h = {on_message, on_timer, opaque, 0};
  prosody_client_t *c;
  c = prosody_client_new(conf, err, sizeof(err));
  CHECK(c, "%s", err);
  CHECK_OK(prosody_subscribe(c, &h, err, sizeof(err)), err);
  return c;
}

/* The child member: works until SIGTERM, then leaves the group cleanly
 * (a killed member would hold its partitions for the session timeout). */
static int child_main(const char *topic, const char *group) {
  static int mark = 1;
  sigset_t set;
  int sig;
  prosody_client_t *c;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, NULL); /* before any thread starts */
  c = member(topic, group, &mark);
  sigwait(&set, &sig);
  prosody_unsubscribe(c);
  prosody_client_destroy(c);
  return 0;
}

static void produce_keys(const char *topic, int from, int to, int64_t at) {
  char err[1024], key[16], payload[64];
  prosody_config_t *conf = t_config();
  prosody_client_t *p;
  t_set(conf, "source_system", "handover-test");
  p = prosody_client_new(conf, err, sizeof(err));
  CHECK(p, "%s", err);
  for (int k = from; k < to; k++) {
    snprintf(key, sizeof(key), "k%d", k);
    snprintf(payload, sizeof(payload), "\"%d %lld\"", k, (long long)at);
    CHECK_OK(prosody_send(p, topic, key, payload, NULL, err, sizeof(err)), err);
  }
  prosody_client_destroy(p);
}

/* Reads "s k" / "f k" lines from the child until `want` schedules were
 * seen (want_fired: fired lines) or the time is up. */
static int child_scheduled;
static void read_child(int fd, int want_sched, int want_fired, double secs) {
  static char line[32];
  static size_t len;
  double deadline = t_now() + secs;
  for (;;) {
    int total_fired = 0;
    pthread_mutex_lock(&lock);
    for (int k = 0; k < KEYS; k++)
      total_fired += fired_here[k] + fired_child[k];
    pthread_mutex_unlock(&lock);
    if ((child_scheduled >= want_sched && total_fired >= want_fired) ||
        t_now() >= deadline)
      return;
    if (t_read_line(fd, line, sizeof(line), &len) != 1)
      continue;
    if (line[0] == 's')
      child_scheduled++;
    else if (line[0] == 'f') {
      int k = atoi(line + 2);
      pthread_mutex_lock(&lock);
      if (k >= 0 && k < KEYS)
        fired_child[k]++;
      pthread_mutex_unlock(&lock);
    }
  }
}

/* `--child TOPIC GROUP`: the member that schedules, then hands over. */
static int child(int argc, char **argv) {
  CHECK(argc == 4, "usage: %s --child TOPIC GROUP", argv[0]);
  return child_main(argv[2], argv[3]);
}
T_CHILD(child)

/* Handover: the child schedules every timer ~20 s out, then a member joins
 * and takes partitions: each timer fires once, on time, wherever its
 * partition went. */
T_SCENARIO(timers_fire_once_after_partitions_move, T_REAL, 180) {
  char topic[128], group[160];
  prosody_client_t *parent;
  pid_t child;
  int pipefd[2], here = 0;
  int64_t at;
  double t0;

  CHECK(t_real_bootstrap(), "needs the real tier (Kafka and Cassandra)");

  snprintf(topic, sizeof(topic), "%s", t_topic("handover"));
  snprintf(group, sizeof(group), "%s-g", topic);
  t_create_topic(topic, 6);

  /* Handover: the child schedules every timer ~20 s out. */
  {
    const char *args[] = {topic, group, NULL};
    child = t_spawn_child(args, &pipefd[0]);
  }
  t0 = t_now();
  at = t_wall_ms() + 20000;
  produce_keys(topic, 0, KEYS, at);
  read_child(pipefd[0], KEYS, 0, 60);
  CHECK(child_scheduled == KEYS, "the child scheduled %d of %d timers",
        child_scheduled, KEYS);
  CHECK(t_wall_ms() < at - 5000, "scheduling took too long to test a handover");
  parent = member(topic, group, NULL); /* rebalance: partitions move here */
  read_child(pipefd[0], KEYS, KEYS, (double)(at - t_wall_ms()) / 1000 + 30);
  kill(child, SIGTERM);
  waitpid(child, NULL, 0);
  close(pipefd[0]);
  pthread_mutex_lock(&lock);
  for (int k = 0; k < KEYS; k++) {
    CHECK(fired_here[k] + fired_child[k] == 1,
          "k%d fired %d times here and %d in the child", k, fired_here[k],
          fired_child[k]);
    if (fired_here[k]) {
      here++;
      CHECK(late_ms[k] >= 0 && late_ms[k] < 3000,
            "k%d fired %lld ms after its time", k, (long long)late_ms[k]);
    }
  }
  pthread_mutex_unlock(&lock);
  CHECK(here > 0, "no timer moved to the joining member");
  printf("handover: %d timers, %d fired by the member that joined, %d by the "
         "child, %.1f s\n",
         KEYS, here, KEYS - here, t_now() - t0);
  CHECK_OK(prosody_unsubscribe(parent), "unsubscribe");
  prosody_client_destroy(parent);
  return 0;
}

/* Restart: schedule, stop before they are due, start again. */
T_SCENARIO(timers_fire_once_after_consumer_restart, T_REAL, 120) {
  char topic[128], group[160];
  prosody_client_t *parent;
  int64_t at;
  double t0;

  CHECK(t_real_bootstrap(), "needs the real tier (Kafka and Cassandra)");
  snprintf(topic, sizeof(topic), "%s", t_topic("restart"));
  snprintf(group, sizeof(group), "%s-g", topic);
  t_create_topic(topic, 6);
  t0 = t_now();
  at = t_wall_ms() + 8000;
  produce_keys(topic, 0, KEYS, at);
  parent = member(topic, group, NULL);
  {
    double deadline = t_now() + 60;
    for (;;) {
      int s;
      pthread_mutex_lock(&lock);
      s = scheduled_here;
      pthread_mutex_unlock(&lock);
      if (s >= KEYS || t_now() > deadline)
        break;
      usleep(20000); /* polling a counter the handlers raise */
    }
  }
  CHECK(t_wall_ms() < at, "scheduling took too long to test a restart");
  CHECK_OK(prosody_unsubscribe(parent), "unsubscribe");
  prosody_client_destroy(parent);
  pthread_mutex_lock(&lock);
  for (int k = 0; k < KEYS; k++)
    CHECK(fired_here[k] == 0, "k%d fired before the restart", k);
  pthread_mutex_unlock(&lock);
  parent = member(topic, group, NULL);
  {
    double deadline = t_now() + (double)(at - t_wall_ms()) / 1000 + 30;
    int total = 0;
    while (total < KEYS && t_now() < deadline) {
      usleep(20000);
      pthread_mutex_lock(&lock);
      total = 0;
      for (int k = 0; k < KEYS; k++)
        total += fired_here[k];
      pthread_mutex_unlock(&lock);
    }
  }
  pthread_mutex_lock(&lock);
  for (int k = 0; k < KEYS; k++) {
    CHECK(fired_here[k] == 1, "k%d fired %d times after the restart", k,
          fired_here[k]);
    CHECK(late_ms[k] >= 0 && late_ms[k] < 3000,
          "k%d fired %lld ms after its time", k, (long long)late_ms[k]);
  }
  pthread_mutex_unlock(&lock);
  printf("restart: %d timers fired once each after the restart, %.1f s\n", KEYS,
         t_now() - t0);
  CHECK_OK(prosody_unsubscribe(parent), "unsubscribe");
  prosody_client_destroy(parent);
  printf("ok: timers survive a handover and a restart\n");
  return 0;
}

static prosody_result_t no_timer_message(prosody_context_t *ctx,
                                         const prosody_message_t *msg,
                                         void *op) {
  (void)ctx, (void)msg, (void)op;
  return PROSODY_SUCCESS;
}

/* A member without on_timer (its timer store open for deferral's retry
 * times) owns the partitions while the group's timers come due: it must
 * leave them in the store, so that the next member with on_timer fires
 * each once (before, it fired them into no handler and deleted them). */
T_SCENARIO(timers_outlive_a_member_without_on_timer, T_REAL, 150) {
  char topic[128], group[160], err[1024];
  prosody_client_t *c;
  prosody_handler_t bare = {no_timer_message, NULL, NULL, 0};
  int64_t at;

  CHECK(t_real_bootstrap(), "needs the real tier (Kafka and Cassandra)");
  snprintf(topic, sizeof(topic), "%s", t_topic("no-on-timer"));
  snprintf(group, sizeof(group), "%s-g", topic);
  t_create_topic(topic, 4);
  at = t_wall_ms() + 6000;
  produce_keys(topic, 0, KEYS, at);
  c = member(topic, group, NULL);
  {
    double deadline = t_now() + 60;
    int s = 0;
    while (s < KEYS && t_now() < deadline) {
      usleep(20000); /* polling a counter the handlers raise */
      pthread_mutex_lock(&lock);
      s = scheduled_here;
      pthread_mutex_unlock(&lock);
    }
  }
  CHECK(t_wall_ms() < at, "scheduling took too long for the test");
  CHECK_OK(prosody_unsubscribe(c), "unsubscribe");
  prosody_client_destroy(c);

  /* The bare member owns every partition past the timers' time. */
  c = prosody_client_new(t_consumer_config(group, topic), err, sizeof(err));
  CHECK(c, "%s", err);
  CHECK_OK(prosody_subscribe(c, &bare, err, sizeof(err)), err);
  {
    double deadline = t_now() + 60;
    while (
        (prosody_assigned_partition_count(c) < 4 || t_wall_ms() < at + 3000) &&
        t_now() < deadline)
      usleep(50000); /* the time must pass: nothing to await */
  }
  CHECK(prosody_assigned_partition_count(c) == 4,
        "the member without on_timer got %d of 4 partitions",
        prosody_assigned_partition_count(c));
  CHECK_OK(prosody_unsubscribe(c), "unsubscribe");
  prosody_client_destroy(c);

  c = member(topic, group, NULL);
  {
    double deadline = t_now() + 60;
    int total = 0;
    while (total < KEYS && t_now() < deadline) {
      usleep(20000);
      pthread_mutex_lock(&lock);
      total = 0;
      for (int k = 0; k < KEYS; k++)
        total += fired_here[k];
      pthread_mutex_unlock(&lock);
    }
  }
  pthread_mutex_lock(&lock);
  for (int k = 0; k < KEYS; k++)
    CHECK(fired_here[k] == 1,
          "k%d fired %d times after a member without on_timer owned it", k,
          fired_here[k]);
  pthread_mutex_unlock(&lock);
  CHECK_OK(prosody_unsubscribe(c), "unsubscribe");
  prosody_client_destroy(c);
  printf("ok: %d overdue timers fired once each after a member without "
         "on_timer owned their partitions\n",
         KEYS);
  return 0;
}
