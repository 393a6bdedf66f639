/*
 * test_qos_stores.c - the deduplication and deferral stores against real
 * Cassandra (real tier): every operation, through each store's worker
 * thread, with callbacks delivered on this thread by poll(): dedup ids are
 * seen once recorded and expire with their TTL; deferred messages and
 * timers form a FIFO per key (head, advance, retry counts), separate per
 * key and per segment.
 */
#include <pthread.h>

#include "cql/cql.h"
#include "harness.h"
#include "stores/stores.h"

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static int woken; /* guarded by lock */

static void wake(void *arg) {
  (void)arg;
  pthread_mutex_lock(&lock);
  woken = 1;
  pthread_cond_signal(&cond);
  pthread_mutex_unlock(&lock);
}

/* One answer, filled by the callbacks (this thread). */
typedef struct ans {
  int done, seen, found;
  prosody_err_t err;
  char errstr[512];
  int64_t position;
  int32_t retries;
} ans_t;

static void on_done(void *arg, prosody_err_t err, const char *errstr) {
  ans_t *a = arg;
  a->done = 1;
  a->err = err;
  snprintf(a->errstr, sizeof(a->errstr), "%s", errstr ? errstr : "");
}

static void on_seen(void *arg, prosody_err_t err, const char *errstr,
                    int seen) {
  on_done(arg, err, errstr);
  ((ans_t *)arg)->seen = seen;
}

static void on_head(void *arg, prosody_err_t err, const char *errstr, int found,
                    int64_t position, int32_t retries) {
  ans_t *a = arg;
  on_done(arg, err, errstr);
  a->found = found;
  a->position = position;
  a->retries = retries;
}

/* Waits for the wake-ups and polls until `a` is answered. */
static void await_ans(ans_t *a, void (*poll)(void *), void *store) {
  double deadline = t_now() + 30;
  while (!a->done && t_now() < deadline) {
    struct timespec ts;
    pthread_mutex_lock(&lock);
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 1;
    while (!woken)
      if (pthread_cond_timedwait(&cond, &lock, &ts))
        break;
    woken = 0;
    pthread_mutex_unlock(&lock);
    poll(store);
  }
  CHECK(a->done, "no answer within 30 s");
  CHECK(a->err == PROSODY_OK, "%s: %s", prosody_err_name(a->err), a->errstr);
}

static void dpoll(void *s) { pr__dedup_poll(s); }
static void fpoll(void *s) { pr__defer_poll(s); }

#define DEDUP(call)                                                            \
  do {                                                                         \
    memset(&a, 0, sizeof(a));                                                  \
    call;                                                                      \
    await_ans(&a, dpoll, d);                                                   \
  } while (0)
#define DEFER(call)                                                            \
  do {                                                                         \
    memset(&a, 0, sizeof(a));                                                  \
    call;                                                                      \
    await_ans(&a, fpoll, f);                                                   \
  } while (0)

static const char *keyspace = T_KEYSPACE;

static void test_dedup(const pr__cql_conf_t *conf) {
  char err[1024], scope[64];
  const pr__did_t evt1 = {0x1111, 1}, evt2 = {0x2222, 2};
  ans_t a;
  pr__dedup_t *d = pr__dedup_new(conf, keyspace, wake, NULL, err, sizeof(err));
  CHECK(d, "dedup: %s", err);
  snprintf(scope, sizeof(scope), "group-%d", (int)getpid());
  DEDUP(pr__dedup_seen(d, scope, evt1, on_seen, &a));
  CHECK(!a.seen, "evt-1 seen before it was recorded");
  DEDUP(pr__dedup_record(d, scope, evt1, 3600, on_done, &a));
  DEDUP(pr__dedup_seen(d, scope, evt1, on_seen, &a));
  CHECK(a.seen, "evt-1 not seen after it was recorded");
  DEDUP(pr__dedup_seen(d, "another-group", evt1, on_seen, &a));
  CHECK(!a.seen, "evt-1 seen in another scope");
  /* A short TTL expires (5 s: a busy node may take a second or two
   * between the write and the read). */
  DEDUP(pr__dedup_record(d, scope, evt2, 5, on_done, &a));
  DEDUP(pr__dedup_seen(d, scope, evt2, on_seen, &a));
  CHECK(a.seen, "evt-2 not seen right after it was recorded");
  {
    double deadline = t_now() + 15;
    do {
      usleep(200 * 1000); /* the TTL is the server's clock: poll it */
      DEDUP(pr__dedup_seen(d, scope, evt2, on_seen, &a));
    } while (a.seen && t_now() < deadline);
    CHECK(!a.seen, "evt-2 still seen 15 s after its 5 s TTL");
  }
  pr__dedup_free(d);
}

static void test_defer(const pr__cql_conf_t *conf, pr__defer_kind_t kind) {
  char err[1024], seg[64];
  ans_t a;
  pr__defer_t *f =
      pr__defer_new(conf, keyspace, kind, 86400, wake, NULL, err, sizeof(err));
  CHECK(f, "defer: %s", err);
  snprintf(seg, sizeof(seg), "g-%d/topic/3", (int)getpid());
  DEFER(pr__defer_head(f, seg, "k", on_head, &a));
  CHECK(!a.found, "an empty key has a head");
  DEFER(pr__defer_append(f, seg, "k", 20, 0, on_done, &a));
  DEFER(pr__defer_append(f, seg, "k", 10, 0, on_done, &a));
  DEFER(pr__defer_append(f, seg, "k", 30, 0, on_done, &a));
  DEFER(pr__defer_append(f, seg, "other", 5, 7, on_done, &a));
  DEFER(pr__defer_head(f, seg, "k", on_head, &a));
  CHECK(a.found && a.position == 10 && a.retries == 0, "head %lld/%d",
        (long long)a.position, a.retries);
  DEFER(pr__defer_set_retries(f, seg, "k", 10, 3, on_done, &a));
  DEFER(pr__defer_head(f, seg, "k", on_head, &a));
  CHECK(a.found && a.position == 10 && a.retries == 3, "retries %d", a.retries);
  DEFER(pr__defer_advance(f, seg, "k", 10, on_done, &a));
  DEFER(pr__defer_head(f, seg, "k", on_head, &a));
  CHECK(a.found && a.position == 20, "head after advance %lld",
        (long long)a.position);
  DEFER(pr__defer_head(f, seg, "other", on_head, &a));
  CHECK(a.found && a.position == 5 && a.retries == 7, "other key %lld/%d",
        (long long)a.position, a.retries);
  DEFER(pr__defer_head(f, "g-other/topic/3", "k", on_head, &a));
  CHECK(!a.found, "another segment shares the key's FIFO");
  DEFER(pr__defer_advance(f, seg, "k", 20, on_done, &a));
  DEFER(pr__defer_advance(f, seg, "k", 30, on_done, &a));
  DEFER(pr__defer_head(f, seg, "k", on_head, &a));
  CHECK(!a.found, "the key still has a head after its last advance");
  pr__defer_free(f);
}

/* The store tests' CQL configuration, T_KEYSPACE's tables migrated. */
static void store_conf(pr__cql_conf_t *conf, char **node) {
  t_cql_conf(conf, node);
  t_cql_migrate(conf);
}

T_SCENARIO(dedup_ids_seen_once_recorded_and_expire_with_ttl, T_REAL, 90) {
  char *node;
  pr__cql_conf_t conf;
  store_conf(&conf, &node);
  test_dedup(&conf);
  return 0;
}

T_SCENARIO(deferred_messages_fifo_per_key_and_segment, T_REAL, 90) {
  char *node;
  pr__cql_conf_t conf;
  store_conf(&conf, &node);
  test_defer(&conf, PR_DEFER_MESSAGES);
  return 0;
}

T_SCENARIO(deferred_timers_fifo_per_key_and_segment, T_REAL, 90) {
  char *node;
  pr__cql_conf_t conf;
  store_conf(&conf, &node);
  test_defer(&conf, PR_DEFER_TIMERS);
  return 0;
}
