/*
 * test_timers_cassandra_kill.c - durable timers across a Cassandra SIGKILL
 * (real tier, run alone: it kills and restarts the Cassandra that
 * scripts/services started):
 *  - a consumer (pipeline mode) schedules one timer for each of KEYS keys,
 *    due over the next ~12-37 s; once a quarter of them were handled,
 *    Cassandra is killed with SIGKILL and, once three quarters were handled
 *    (or 15 s passed), started again (commit log replay) while the consumer
 *    keeps running;
 *  - every timer is handled (none lost) and none is handled again after a
 *    handling that succeeded; the store ends up holding none of them (their
 *    deletes reached Cassandra, also those of timers handled while it was
 *    down);
 *  - a new consumer of the group (after the first stopped cleanly) handles
 *    no old timer again: each key gets a sentinel timer, due after the new
 *    consumer loaded the stored timers, which its key's old timer would
 *    have preceded.
 * Prints the figures docs/RELIABILITY.md quotes. Cassandra is started again
 * on the way out, also when a check fails. Skipped (77) when
 * PROSODY_TEST_CASSANDRA says Cassandra is not ours to kill.
 */
#include <pthread.h>

#include "cql/cql.h"
#include "harness.h"
#include "timers/timers.h"

#define KEYS 200
#define PARTITIONS 4
#define SPACING_MS 125   /* between consecutive keys' timers */
#define SENTINEL_MS 3000 /* a sentinel's delay after its message */
#define SLAB_S 3600      /* slab_size, as configured below */
/* Cassandra's periodic commit log (the default) keeps what it acknowledged
 * through a SIGKILL only once its next sync marker is written, every 100
 * ms: the kill waits this long after the last handling, whose delete was
 * acknowledged within milliseconds (docs/RELIABILITY.md). */
#define QUIET_MS 400
#define KEYSPACE "prosody_test"
#define SERVICE "/scripts/services/cassandra"

static const char *root = PROSODY_SOURCE_DIR;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
/* Guarded by lock. */
static struct {
  int64_t time_ms;     /* the timer's time (a whole second) */
  int handled;         /* handlings of it */
  int again;           /* ... after one that succeeded */
  int64_t late_ms;     /* the first handling's start minus its time */
  int64_t sentinel_ms; /* the sentinel's time, once scheduled */
  int sentinel_fired;
} keys[KEYS];
static int scheduled, handled_keys, sentinels_fired, unknown_fired;
static int64_t last_handling_ms; /* wall clock */

/* Set while this test has Cassandra down: restored on any exit. */
static volatile int cassandra_down;

static int service(const char *verb) {
  char cmd[1024];
  snprintf(cmd, sizeof(cmd), "%s%s %s >&2", root, SERVICE, verb);
  return system(cmd);
}

static void restore_cassandra(void) {
  if (cassandra_down && service("start") == 0)
    cassandra_down = 0;
}

/* Payload "<t|s> <k> <ms>": t schedules key k's timer at <ms>, s its
 * sentinel <ms> after now. */
static prosody_result_t on_message(prosody_context_t *ctx,
                                   const prosody_message_t *msg, void *op) {
  char err[512], what;
  int k;
  long long ms;
  int64_t at;
  (void)op;
  if (sscanf(prosody_message_payload(msg), "\"%c %d %lld\"", &what, &k, &ms) !=
          3 ||
      k < 0 || k >= KEYS)
    return PROSODY_PERMANENT;
  at = what == 's' ? (t_wall_ms() + ms + 999) / 1000 * 1000 : ms;
  if (prosody_schedule(ctx, at, err, sizeof(err))) {
    prosody_context_set_error(ctx, err);
    return PROSODY_TRANSIENT;
  }
  pthread_mutex_lock(&lock);
  if (what == 's')
    keys[k].sentinel_ms = at;
  else
    scheduled++;
  pthread_mutex_unlock(&lock);
  return PROSODY_SUCCESS;
}

/* Records every handling; always succeeds. */
static prosody_result_t on_timer(prosody_context_t *ctx,
                                 const prosody_timer_t *t, void *op) {
  int k = atoi(prosody_timer_key(t) + 1); /* "k<n>" */
  int64_t time = prosody_timer_time(t), now = t_wall_ms();
  (void)ctx;
  (void)op;
  pthread_mutex_lock(&lock);
  last_handling_ms = now;
  if (k < 0 || k >= KEYS)
    unknown_fired++;
  else if (time == keys[k].time_ms) {
    if (keys[k].handled++ == 0) {
      keys[k].late_ms = now - time;
      handled_keys++;
    } else
      keys[k].again++; /* every handling succeeds */
  } else if (time == keys[k].sentinel_ms) {
    if (keys[k].sentinel_fired++ == 0)
      sentinels_fired++;
  } else
    unknown_fired++;
  pthread_mutex_unlock(&lock);
  return PROSODY_SUCCESS;
}

/* Waits up to `seconds` until no timer was handled for QUIET_MS; returns
 * how long ago the last one was. */
static int64_t wait_quiet(double seconds) {
  double deadline = t_now() + seconds;
  int64_t ago;
  for (;;) {
    pthread_mutex_lock(&lock);
    ago = t_wall_ms() - last_handling_ms;
    pthread_mutex_unlock(&lock);
    if (ago >= QUIET_MS || t_now() >= deadline)
      return ago;
    usleep(5000);
  }
}

static prosody_client_t *consumer(const char *topic, const char *group) {
  char err[1024];
  prosody_config_t *conf = t_consumer_config(group, topic);
  prosody_handler_t h = {on_message, on_timer, NULL, 0};
  prosody_client_t *c;
  t_set(conf, "mode", "pipeline");
  t_set(conf, "max_concurrency", "8");
  t_set(conf, "slab_size", "1h"); /* SLAB_S */
  t_set(conf, "retry_base", "50ms");
  t_set(conf, "max_retry_delay", "1s");
  c = prosody_client_new(conf, err, sizeof(err));
  CHECK(c, "client: %s", err);
  CHECK_OK(prosody_subscribe(c, &h, err, sizeof(err)), err);
  return c;
}

static void produce(const char *topic, char what, int64_t ms_of_key0,
                    int64_t step_ms) {
  char err[1024], key[16], payload[64];
  prosody_config_t *conf = t_config();
  prosody_client_t *p;
  t_set(conf, "source_system", "cassandra-kill-test");
  p = prosody_client_new(conf, err, sizeof(err));
  CHECK(p, "producer: %s", err);
  for (int k = 0; k < KEYS; k++) {
    snprintf(key, sizeof(key), "k%d", k);
    snprintf(payload, sizeof(payload), "\"%c %d %lld\"", what, k,
             (long long)(ms_of_key0 + k * step_ms));
    CHECK_OK(prosody_send_async(p, topic, key, payload, NULL, t_ignore_cb, NULL,
                                err, sizeof(err)),
             err);
  }
  prosody_client_destroy(p);
  CHECK(t_send_failures == 0, "%d sends failed", t_send_failures);
}

/* The application timers of `group` on `topic` still stored in slabs
 * [from, to], or -1 when Cassandra did not answer; `show` prints them. */
static int stored_timers(pr__cql_sync_t *y, const char *group,
                         const char *topic, int64_t from, int64_t to,
                         int show) {
  char err[1024], segment[512];
  int n = 0;
  for (int p = 0; p < PARTITIONS; p++) {
    uint8_t id[16];
    snprintf(segment, sizeof(segment), "%s:%s/%d", group, topic, p);
    CHECK(!pr__timer_segment_id(segment, id), "segment id of %s", segment);
    for (int64_t slab = from; slab <= to; slab++) {
      pr__cql_result_t r;
      pr__cql_val_t v[3] = {pr__cv_uuid(id), pr__cv_int(SLAB_S),
                            pr__cv_int((int32_t)slab)};
      if (pr__cql_sync_run(y,
                           "SELECT time, key FROM " KEYSPACE
                           ".timer_typed_slabs WHERE segment_id = ? AND "
                           "slab_size = ? AND id = ? AND timer_type = 0",
                           v, 3, NULL, 1, &r, err, sizeof(err)))
        return -1;
      n += r.nrows;
      for (int32_t i = 0; show && i < r.nrows; i++) {
        int32_t time_s = -1;
        char key[32] = "?";
        pr__cql_get_int(pr__cql_cell(&r, i, 0), &time_s);
        pr__cql_get_text(pr__cql_cell(&r, i, 1), key, sizeof(key));
        fprintf(stderr, "still stored: %s at %u (partition %d)\n", key,
                (unsigned)time_s, p);
      }
      pr__cql_result_free(&r);
    }
  }
  return n;
}

T_SCENARIO(timers_survive_cassandra_sigkill_none_lost_none_twice, T_REAL, 600) {
  char topic[128], group[160], err[1024];
  char *nodes[1] = {(char *)t_cassandra_nodes()};
  pr__cql_conf_t cql = {
      .nodes = nodes, .nnodes = 1, .request_timeout_ms = 5000};
  pr__cql_sync_t *y;
  prosody_client_t *c;
  int64_t base, kill_ms, quiet_ms, up_ms, max_late = 0, max_late_down = 0,
                                          slab_from, slab_to;
  double t_kill, t_up, t_all, t0;
  int at_kill, at_up, lost = 0, again = 0, due_down = 0, left = -1;

  if (getenv("PROSODY_TEST_CASSANDRA") && *getenv("PROSODY_TEST_CASSANDRA")) {
    printf("skipped: Cassandra is external (PROSODY_TEST_CASSANDRA)\n");
    return T_SKIP;
  }
  CHECK(t_real_bootstrap(), "needs the real tier (Kafka and Cassandra)");
  atexit(restore_cassandra);

  snprintf(topic, sizeof(topic), "%s", t_topic("ckill"));
  snprintf(group, sizeof(group), "%s-g", topic);
  t_create_topic(topic, PARTITIONS);

  /* Timers due from 12 s on, one every SPACING_MS. */
  base = t_wall_ms() + 12000;
  for (int k = 0; k < KEYS; k++)
    keys[k].time_ms = (base + k * SPACING_MS + 500) / 1000 * 1000;
  slab_from = keys[0].time_ms / 1000 / SLAB_S;
  c = consumer(topic, group);
  produce(topic, 't', base, SPACING_MS);
  CHECK(t_wait_locked(&lock, &scheduled, KEYS, 60) == KEYS,
        "%d of %d timers scheduled", t_locked_int(&lock, &scheduled), KEYS);
  CHECK(t_wall_ms() < keys[0].time_ms,
        "scheduling took too long: timers were due before it ended");

  /* SIGKILL once a quarter were handled, QUIET_MS after the last handling
   * (its delete was acknowledged by then), and start again at three
   * quarters (or 15 s): down longer than a CQL request's timeout (12 s),
   * so that deletes fail and are retried. */
  CHECK(t_wait_locked(&lock, &handled_keys, KEYS / 4, 60) >= KEYS / 4,
        "only %d timers handled", t_locked_int(&lock, &handled_keys));
  quiet_ms = wait_quiet(5);
  CHECK(quiet_ms >= QUIET_MS, "timers kept firing: no %d ms without one",
        QUIET_MS);
  t_kill = t_now();
  kill_ms = t_wall_ms();
  cassandra_down = 1;
  CHECK(service("kill") == 0, "cassandra kill failed");
  at_kill = t_locked_int(&lock, &handled_keys);
  t_wait_locked(&lock, &handled_keys, KEYS * 3 / 4, 15);
  CHECK(service("start") == 0, "cassandra start failed");
  cassandra_down = 0;
  t_up = t_now();
  up_ms = t_wall_ms();
  at_up = t_locked_int(&lock, &handled_keys);

  /* None lost, none handled again. */
  t_wait_locked(&lock, &handled_keys, KEYS,
                (double)(keys[KEYS - 1].time_ms - t_wall_ms()) / 1000 + 60);
  t_all = t_now();
  pthread_mutex_lock(&lock);
  for (int k = 0; k < KEYS; k++) {
    lost += keys[k].handled == 0;
    again += keys[k].again;
    if (!keys[k].handled)
      continue;
    if (keys[k].late_ms > max_late)
      max_late = keys[k].late_ms;
    if (keys[k].time_ms >= kill_ms && keys[k].time_ms <= up_ms) {
      due_down++;
      if (keys[k].late_ms > max_late_down)
        max_late_down = keys[k].late_ms;
    }
  }
  pthread_mutex_unlock(&lock);
  printf("cassandra: SIGKILL with %d of %d timers handled (the last %lld ms "
         "before); down %.1f s (kill until CQL answered again); %d handled "
         "meanwhile (%d were due then)\n",
         at_kill, KEYS, (long long)quiet_ms, t_up - t_kill, at_up - at_kill,
         due_down);
  printf("timers: %d scheduled, lost %d, handled again %d; first handling "
         "late by at most %lld ms (%lld ms for those due while Cassandra was "
         "down)\n",
         KEYS, lost, again, (long long)max_late, (long long)max_late_down);
  CHECK(lost == 0, "%d timers never handled", lost);
  CHECK(again == 0, "%d handlings of timers that had already succeeded", again);
  CHECK(at_up > at_kill, "no timer was handled while Cassandra was down");

  /* The store holds none of them any more: their deletes reached it. */
  slab_to = keys[KEYS - 1].time_ms / 1000 / SLAB_S;
  y = pr__cql_sync_new(&cql, err, sizeof(err));
  CHECK(y, "cql: %s", err);
  {
    double deadline = t_now() + 60;
    while ((left = stored_timers(y, group, topic, slab_from, slab_to, 0)) !=
               0 &&
           t_now() < deadline)
      usleep(200000);
  }
  if (left > 0) {
    fprintf(stderr, "Cassandra was killed at %lld ms, answered at %lld ms\n",
            (long long)kill_ms, (long long)up_ms);
    stored_timers(y, group, topic, slab_from, slab_to, 1);
  }
  printf("store: %s %.1f s after the last timer was handled\n",
         left == 0 ? "no fired timer left" : "fired timers still stored",
         t_now() - t_all);
  CHECK(left == 0,
        "%d handled timers still stored 60 s later (they would "
        "fire again)",
        left);
  CHECK_OK(prosody_unsubscribe(c), "unsubscribe");
  prosody_client_destroy(c);

  /* A new consumer of the group: no old timer again. A key's old timer
   * would be due before its sentinel, and fire before it. */
  t0 = t_now();
  c = consumer(topic, group);
  produce(topic, 's', SENTINEL_MS, 0);
  t_wait_locked(&lock, &sentinels_fired, KEYS, 90);
  pthread_mutex_lock(&lock);
  again = 0;
  for (int k = 0; k < KEYS; k++)
    again += keys[k].again;
  printf("restart: a new consumer handled %d of %d sentinel timers and %d old "
         "timer(s) again, %.1f s\n",
         sentinels_fired, KEYS, again, t_now() - t0);
  CHECK(sentinels_fired == KEYS, "%d of %d sentinel timers fired",
        sentinels_fired, KEYS);
  CHECK(again == 0, "%d old timers fired again after the restart", again);
  CHECK(unknown_fired == 0, "%d unknown timers fired", unknown_fired);
  CHECK(scheduled == KEYS,
        "%d schedulings for %d keys: a record was handled "
        "again",
        scheduled, KEYS);
  for (int k = 0; k < KEYS; k++)
    CHECK(keys[k].sentinel_fired == 1, "k%d's sentinel fired %d times", k,
          keys[k].sentinel_fired);
  pthread_mutex_unlock(&lock);
  CHECK_OK(prosody_unsubscribe(c), "unsubscribe");
  prosody_client_destroy(c);
  pr__cql_sync_free(y);
  printf("ok: durable timers across a Cassandra SIGKILL\n");
  return 0;
}
