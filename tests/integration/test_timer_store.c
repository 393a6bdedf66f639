/*
 * test_timer_store.c - the Cassandra timer store (src/stores/cqltimers.c)
 * directly, against real Cassandra (real tier): thousands of puts issued
 * at once (coalesced into groups) are all acknowledged and all seen by
 * slabs(), load_slab() and key_times(); a put and a delete of the same
 * timer issued back to back resolve in the order they were issued (either
 * way round); many deletes at once; del_key keeps the one asked for; a
 * store with no model of the keys (another process: the partition's next
 * owner) reads what one wrote, as the original Prosody's tables hold it; a
 * segment of another slab size is refused; finished slabs are retired (their
 * rows deleted, the watermark raised) and a put into one lists it again; puts
 * against an unreachable node report their error, and a store destroyed
 * with operations queued or in flight answers every one of them.
 */
#include <pthread.h>

#include "cql/cql.h"
#include "harness.h"
#include "timers/timers.h"
#include "util/util.h"

#define SLAB_S 60
#define KEYS 300
#define PER_KEY 10 /* timers per key, one per slab third: 3 slabs */

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

/* Answers, filled by the callbacks (this thread, inside poll()). */
static int answered, failed;
static prosody_err_t last_err;
static char last_errstr[512];

static void on_done(void *arg, prosody_err_t err, const char *errstr) {
  (void)arg;
  answered++;
  if (err) {
    failed++;
    last_err = err;
    snprintf(last_errstr, sizeof(last_errstr), "%s", errstr ? errstr : "");
  }
}

typedef struct got {
  int done;
  prosody_err_t err;
  char errstr[512];
  int64_t *times;
  size_t n;
  pr__trec_t *recs;
} got_t;

static void on_times(void *arg, prosody_err_t err, const char *errstr,
                     const int64_t *times, size_t n) {
  got_t *g = arg;
  g->done = 1;
  g->err = err;
  snprintf(g->errstr, sizeof(g->errstr), "%s", errstr ? errstr : "");
  g->n = n;
  if (n) {
    g->times = malloc(n * sizeof(*times));
    memcpy(g->times, times, n * sizeof(*times));
  }
}

static void on_recs(void *arg, prosody_err_t err, const char *errstr,
                    const pr__trec_t *recs, size_t n) {
  got_t *g = arg;
  g->done = 1;
  g->err = err;
  snprintf(g->errstr, sizeof(g->errstr), "%s", errstr ? errstr : "");
  g->n = n;
  if (n) {
    g->recs = calloc(n, sizeof(*recs));
    for (size_t i = 0; i < n; i++) {
      g->recs[i] = recs[i];
      g->recs[i].key = strdup(recs[i].key);
    }
  }
}

static void got_free(got_t *g) {
  for (size_t i = 0; g->recs && i < g->n; i++)
    free((char *)g->recs[i].key);
  free(g->recs);
  free(g->times);
  memset(g, 0, sizeof(*g));
}

/* Polls until `*v` reaches `want` (callbacks run here). */
static void await_n(pr__tstore_t *s, const int *v, int want, double seconds) {
  double deadline = t_now() + seconds;
  while (*v < want && t_now() < deadline) {
    struct timespec ts;
    pthread_mutex_lock(&lock);
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 100 * 1000 * 1000;
    if (ts.tv_nsec >= 1000000000) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000;
    }
    while (!woken)
      if (pthread_cond_timedwait(&cond, &lock, &ts))
        break;
    woken = 0;
    pthread_mutex_unlock(&lock);
    s->ops->poll(s);
  }
  CHECK(*v >= want, "%d of %d answers within %.0f s", *v, want, seconds);
}

static void await_got(pr__tstore_t *s, got_t *g) {
  await_n(s, &g->done, 1, 30);
  CHECK(g->err == PROSODY_OK, "%s: %s", prosody_err_name(g->err), g->errstr);
}

static int64_t base_s; /* slab-aligned, a day ahead */

static int64_t time_of(int k, int i) {
  return base_s + (int64_t)i * (SLAB_S * 3 / PER_KEY) + k % 7;
}

static void test_many(pr__tstore_t *s, const pr__tseg_t *segs, int nsegs) {
  char key[32];
  got_t g = {0};
  int want = 0;
  answered = failed = 0;
  /* Every put at once: the store holds them all in its queue. */
  for (int sg = 0; sg < nsegs; sg++)
    for (int k = 0; k < KEYS; k++)
      for (int i = 0; i < PER_KEY; i++) {
        snprintf(key, sizeof(key), "key-%03d", k);
        s->ops->put(s, &segs[sg], key, time_of(k, i), PR_TIMER_APPLICATION,
                    NULL, on_done, NULL);
        want++;
      }
  await_n(s, &answered, want, 60);
  CHECK(!failed, "%d puts failed: %s", failed, last_errstr);
  for (int sg = 0; sg < nsegs; sg++) {
    size_t total = 0;
    int64_t first = pr__slab_of(base_s, SLAB_S);
    s->ops->slabs(s, &segs[sg], SLAB_S, on_times, &g);
    await_got(s, &g);
    CHECK(g.n == 3 && g.times[0] == first && g.times[2] == first + 2,
          "slabs of %s: %zu listed", segs[sg].topic, g.n);
    got_free(&g);
    for (int64_t slab = first; slab < first + 3; slab++) {
      s->ops->load_slab(s, &segs[sg], SLAB_S, slab, on_recs, &g);
      await_got(s, &g);
      for (size_t i = 0; i < g.n; i++)
        CHECK(pr__slab_of(g.recs[i].time_s, SLAB_S) == slab &&
                  g.recs[i].type == PR_TIMER_APPLICATION,
              "a timer of slab %lld in slab %lld",
              (long long)pr__slab_of(g.recs[i].time_s, SLAB_S),
              (long long)slab);
      total += g.n;
      got_free(&g);
    }
    CHECK(total == KEYS * PER_KEY, "%s: %zu of %d timers loaded",
          segs[sg].topic, total, KEYS * PER_KEY);
  }
  for (int k = 0; k < KEYS; k += 37) {
    snprintf(key, sizeof(key), "key-%03d", k);
    s->ops->key_times(s, &segs[0], key, PR_TIMER_APPLICATION, on_times, &g);
    await_got(s, &g);
    CHECK(g.n == PER_KEY, "%s: %zu of %d times", key, g.n, PER_KEY);
    for (int i = 0; i < PER_KEY; i++)
      CHECK(g.times[i] == time_of(k, i), "%s: time %d is %lld", key, i,
            (long long)g.times[i]);
    got_free(&g);
  }
  /* Deleting them all at once. */
  answered = failed = want = 0;
  for (int k = 0; k < KEYS; k++)
    for (int i = 0; i < PER_KEY; i++) {
      snprintf(key, sizeof(key), "key-%03d", k);
      s->ops->del(s, &segs[1], key, time_of(k, i), PR_TIMER_APPLICATION,
                  on_done, NULL);
      want++;
    }
  await_n(s, &answered, want, 60);
  CHECK(!failed, "%d deletes failed: %s", failed, last_errstr);
  for (int64_t slab = pr__slab_of(base_s, SLAB_S);
       slab < pr__slab_of(base_s, SLAB_S) + 3; slab++) {
    s->ops->load_slab(s, &segs[1], SLAB_S, slab, on_recs, &g);
    await_got(s, &g);
    CHECK(g.n == 0, "%zu timers left in slab %lld after deleting all", g.n,
          (long long)slab);
    got_free(&g);
  }
  /* ... from both tables: deletes of one second share a statement. */
  for (int k = 0; k < KEYS; k += 37) {
    snprintf(key, sizeof(key), "key-%03d", k);
    s->ops->key_times(s, &segs[1], key, PR_TIMER_APPLICATION, on_times, &g);
    await_got(s, &g);
    CHECK(g.n == 0, "%s: %zu times listed after deleting all", key, g.n);
    got_free(&g);
  }
}

/* A timer keeps the trace context it was written with (the newest, when
 * written again); one written without has none. */
static void test_trace(pr__tstore_t *s, const pr__tseg_t *seg) {
  const char *tp1 = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
  const char *tp2 = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";
  pr_span_ctx_t c1, c2;
  got_t g = {0};
  int64_t t = base_s + 20 * SLAB_S; /* past test_order's noise */
  char out[PR_TRACEPARENT_LEN + 1];
  CHECK(!pr__span_ctx_parse(tp1, SIZE_MAX, &c1) &&
            !pr__span_ctx_parse(tp2, SIZE_MAX, &c2),
        "traceparents");
  answered = failed = 0;
  s->ops->put(s, seg, "traced", t, PR_TIMER_APPLICATION, &c1, on_done, NULL);
  s->ops->put(s, seg, "traced", t + 1, PR_TIMER_APPLICATION, &c1, on_done,
              NULL);
  s->ops->put(s, seg, "plain", t, PR_TIMER_APPLICATION, NULL, on_done, NULL);
  await_n(s, &answered, 3, 30);
  /* Written again once the first is in (two writes of one timer that
   * share a batch keep either context). */
  s->ops->put(s, seg, "traced", t + 1, PR_TIMER_APPLICATION, &c2, on_done,
              NULL);
  await_n(s, &answered, 4, 30);
  CHECK(!failed, "puts failed: %s", last_errstr);
  s->ops->load_slab(s, seg, SLAB_S, pr__slab_of(t, SLAB_S), on_recs, &g);
  await_got(s, &g);
  CHECK(g.n == 3, "%zu timers in the slab", g.n);
  for (size_t i = 0; i < g.n; i++) {
    const pr__trec_t *r = &g.recs[i];
    if (!strcmp(r->key, "plain")) {
      CHECK(!r->ctx.valid, "a timer written without a context has one");
      continue;
    }
    CHECK(r->ctx.valid, "timer %s at %lld lost its context", r->key,
          (long long)r->time_s);
    pr__span_ctx_format(&r->ctx, out);
    CHECK(!strcmp(out, r->time_s == t ? tp1 : tp2), "context %s at %lld", out,
          (long long)r->time_s);
  }
  got_free(&g);
}

/* A put and a delete of one timer, issued back to back, land in that
 * order; so do puts and deletes queued behind other writes. */
static void test_order(pr__tstore_t *s, const pr__tseg_t *seg) {
  got_t g = {0};
  int64_t t = base_s + 5;
  answered = failed = 0;
  for (int round = 0; round < 20; round++) {
    char key[32];
    snprintf(key, sizeof(key), "order-%d", round);
    /* Other writes in the same round, so the pairs share groups. */
    for (int i = 0; i < 20; i++)
      s->ops->put(s, seg, "noise", base_s + 100 + round * 20 + i,
                  PR_TIMER_APPLICATION, NULL, on_done, NULL);
    s->ops->put(s, seg, key, t, PR_TIMER_APPLICATION, NULL, on_done, NULL);
    s->ops->del(s, seg, key, t, PR_TIMER_APPLICATION, on_done, NULL);
    s->ops->del(s, seg, key, t + 1, PR_TIMER_APPLICATION, on_done, NULL);
    s->ops->put(s, seg, key, t + 1, PR_TIMER_APPLICATION, NULL, on_done, NULL);
    s->ops->put(s, seg, key, t + 2, PR_TIMER_APPLICATION, NULL, on_done, NULL);
    s->ops->del(s, seg, key, t + 2, PR_TIMER_APPLICATION, on_done, NULL);
    s->ops->put(s, seg, key, t + 2, PR_TIMER_APPLICATION, NULL, on_done, NULL);
    /* A read queued behind them sees them. */
    s->ops->key_times(s, seg, key, PR_TIMER_APPLICATION, on_times, &g);
    await_got(s, &g);
    CHECK(g.n == 2 && g.times[0] == t + 1 && g.times[1] == t + 2,
          "%s: %zu times after put/del, del/put, put/del/put", key, g.n);
    got_free(&g);
  }
  await_n(s, &answered, 20 * 27, 30);
  CHECK(!failed, "%d writes failed: %s", failed, last_errstr);
  s->ops->load_slab(s, seg, SLAB_S, pr__slab_of(t, SLAB_S), on_recs, &g);
  await_got(s, &g);
  for (size_t i = 0; i < g.n; i++)
    CHECK(strncmp(g.recs[i].key, "order-", 6) || g.recs[i].time_s != t,
          "%s at the deleted time is loaded", g.recs[i].key);
  got_free(&g);
  /* del_key keeps the one asked for. */
  answered = failed = 0;
  s->ops->del_key(s, seg, "order-0", PR_TIMER_APPLICATION, t + 2, on_done,
                  NULL);
  await_n(s, &answered, 1, 30);
  CHECK(!failed, "del_key: %s", last_errstr);
  s->ops->key_times(s, seg, "order-0", PR_TIMER_APPLICATION, on_times, &g);
  await_got(s, &g);
  CHECK(g.n == 1 && g.times[0] == t + 2, "%zu times after del_key", g.n);
  got_free(&g);
}

/* Checks that key_times() lists `want` for `key` ("t1,t2,...", relative
 * to t0). */
static void expect_times(pr__tstore_t *s, const pr__tseg_t *seg,
                         const char *key, int64_t t0, const char *want) {
  got_t g = {0};
  char out[256];
  s->ops->key_times(s, seg, key, PR_TIMER_APPLICATION, on_times, &g);
  await_got(s, &g);
  t_offsets_text(g.times, g.n, t0, out, sizeof(out));
  got_free(&g);
  CHECK(!strcmp(out, want), "%s: times %s, expected %s", key, out, want);
}

/* What one store writes, a store of another process (no model of the keys:
 * it reads them) finds: each key's timers in the key index, whether one
 * (held inline in the key's state entry) or several (clustering rows), and
 * after deletes that move a key between the two. A partition's next owner,
 * ours or the original, relies on this. */
static void test_handover(pr__cql_conf_t *conf, const pr__tseg_t *seg,
                          const char *group) {
  char err[1024];
  int64_t t = base_s + 30 * SLAB_S;
  pr__tstore_t *a, *b;
  got_t g = {0};
  a = T_LONE_STORE(
      conf, wake, NULL, err,
      pr__cqlstore_new(w, T_KEYSPACE, group, SLAB_S, 3600, err, sizeof(err)));
  CHECK(a, "%s", err);
  answered = failed = 0;
  a->ops->put(a, seg, "one", t, PR_TIMER_APPLICATION, NULL, on_done, NULL);
  for (int i = 0; i < 3; i++) {
    a->ops->put(a, seg, "two", t + i, PR_TIMER_APPLICATION, NULL, on_done,
                NULL);
    a->ops->put(a, seg, "shrinks", t + i, PR_TIMER_APPLICATION, NULL, on_done,
                NULL);
  }
  a->ops->put(a, seg, "gone", t, PR_TIMER_APPLICATION, NULL, on_done, NULL);
  await_n(a, &answered, 8, 30);
  a->ops->del(a, seg, "two", t + 2, PR_TIMER_APPLICATION, on_done, NULL);
  a->ops->del(a, seg, "shrinks", t, PR_TIMER_APPLICATION, on_done, NULL);
  a->ops->del(a, seg, "gone", t, PR_TIMER_APPLICATION, on_done, NULL);
  await_n(a, &answered, 11, 30);
  a->ops->del(a, seg, "shrinks", t + 2, PR_TIMER_APPLICATION, on_done, NULL);
  await_n(a, &answered, 12, 30);
  CHECK(!failed, "writes failed: %s", last_errstr);
  a->ops->release(a, seg);
  a->ops->destroy(a);

  b = T_LONE_STORE(
      conf, wake, NULL, err,
      pr__cqlstore_new(w, T_KEYSPACE, group, SLAB_S, 3600, err, sizeof(err)));
  CHECK(b, "%s", err);
  expect_times(b, seg, "one", t, "0");
  expect_times(b, seg, "two", t, "0,1");
  expect_times(b, seg, "shrinks", t, "1");
  expect_times(b, seg, "gone", t, "");
  /* ... and fires them: the slab holds exactly the live ones. */
  b->ops->load_slab(b, seg, SLAB_S, pr__slab_of(t, SLAB_S), on_recs, &g);
  await_got(b, &g);
  CHECK(g.n == 4, "%zu timers in the slab, 4 live", g.n);
  got_free(&g);
  /* It changes them in turn (its model: read), for a third to see. */
  answered = failed = 0;
  b->ops->del(b, seg, "two", t, PR_TIMER_APPLICATION, on_done, NULL);
  b->ops->put(b, seg, "one", t + 5, PR_TIMER_APPLICATION, NULL, on_done, NULL);
  b->ops->del_key(b, seg, "shrinks", PR_TIMER_APPLICATION, -1, on_done, NULL);
  await_n(b, &answered, 3, 30);
  CHECK(!failed, "writes failed: %s", last_errstr);
  b->ops->destroy(b);
  a = T_LONE_STORE(
      conf, wake, NULL, err,
      pr__cqlstore_new(w, T_KEYSPACE, group, SLAB_S, 3600, err, sizeof(err)));
  CHECK(a, "%s", err);
  expect_times(a, seg, "two", t, "1");
  expect_times(a, seg, "one", t, "0,5");
  expect_times(a, seg, "shrinks", t, "");
  a->ops->destroy(a);
}

/* A segment written with one slab size is refused to a store with another
 * (the slab table's partitions depend on it), naming both. */
static void test_slab_size_refused(pr__cql_conf_t *conf, const pr__tseg_t *seg,
                                   const char *group) {
  char err[1024];
  pr__tstore_t *s =
      T_LONE_STORE(conf, wake, NULL, err,
                   pr__cqlstore_new(w, T_KEYSPACE, group, SLAB_S * 2, 3600, err,
                                    sizeof(err)));
  CHECK(s, "%s", err);
  answered = failed = 0;
  s->ops->put(s, seg, "k", base_s, PR_TIMER_APPLICATION, NULL, on_done, NULL);
  await_n(s, &answered, 1, 30);
  CHECK(failed == 1 && last_err == PROSODY_ERR_PERMANENT &&
            strstr(last_errstr, "slab_size 60s") &&
            strstr(last_errstr, "is 120s"),
        "a put with another slab size: %s", last_errstr);
  s->ops->destroy(s);
}

/* No Cassandra: every put reports an error, none is lost. */
static void test_unreachable(void) {
  char err[1024], *nodes[1] = {"127.0.0.1:1"};
  pr__cql_conf_t conf;
  pr__tseg_t seg = {"t", 0};
  pr__tstore_t *s;
  memset(&conf, 0, sizeof(conf));
  conf.nodes = nodes;
  conf.nnodes = 1;
  conf.connect_timeout_ms = 300;
  conf.request_timeout_ms = 1000;
  s = T_LONE_STORE(&conf, wake, NULL, err,
                   pr__cqlstore_new(w, "prosody_test", "nobody", SLAB_S, 3600,
                                    err, sizeof(err)));
  CHECK(s, "%s", err);
  answered = failed = 0;
  for (int i = 0; i < 50; i++)
    s->ops->put(s, &seg, "k", base_s + i, PR_TIMER_APPLICATION, NULL, on_done,
                NULL);
  s->ops->del(s, &seg, "k", base_s, PR_TIMER_APPLICATION, on_done, NULL);
  await_n(s, &answered, 51, 30);
  CHECK(failed == 51, "%d of 51 writes failed without Cassandra", failed);
  CHECK(last_err != PROSODY_OK && last_errstr[0], "no error message");
  /* Destroyed with writes queued and in flight: each is answered. */
  answered = failed = 0;
  for (int i = 0; i < 50; i++)
    s->ops->put(s, &seg, "k", base_s + i, PR_TIMER_APPLICATION, NULL, on_done,
                NULL);
  s->ops->destroy(s);
  CHECK(answered == 50 && failed == 50, "%d answered, %d failed at destroy",
        answered, failed);
}

static char store_group[64]; /* store_new()'s */

/* A store of a group of this process's own over T_KEYSPACE (migrated),
 * timers a day ahead; segs[0] and segs[1] two segments. */
static pr__tstore_t *store_new(pr__cql_conf_t *conf, char **node,
                               pr__tseg_t *segs) {
  char err[1024];
  pr__tstore_t *s;
  t_cql_conf(conf, node);
  t_cql_migrate(conf);
  base_s = (pr__wall_ms() / 1000 / SLAB_S + 1440) * SLAB_S;
  snprintf(store_group, sizeof(store_group), "tstore-%d", (int)getpid());
  segs[0] = (pr__tseg_t){"topic", 3};
  segs[1] = (pr__tseg_t){"other", 0};
  s = T_LONE_STORE(conf, wake, NULL, err,
                   pr__cqlstore_new(w, T_KEYSPACE, store_group, SLAB_S, 3600,
                                    err, sizeof(err)));
  CHECK(s, "%s", err);
  return s;
}

T_SCENARIO(thousands_of_puts_acknowledged_and_read_back, T_REAL, 120) {
  char *node;
  pr__cql_conf_t conf;
  pr__tseg_t segs[2];
  pr__tstore_t *s = store_new(&conf, &node, segs);
  test_many(s, segs, 2);
  s->ops->destroy(s);
  return 0;
}

T_SCENARIO(put_and_delete_resolve_in_issue_order, T_REAL, 90) {
  char *node;
  pr__cql_conf_t conf;
  pr__tseg_t segs[2];
  pr__tstore_t *s = store_new(&conf, &node, segs);
  test_order(s, &segs[0]);
  s->ops->destroy(s);
  return 0;
}

T_SCENARIO(timer_trace_context_stored_and_loaded, T_REAL, 90) {
  char *node;
  pr__cql_conf_t conf;
  pr__tseg_t segs[2];
  pr__tstore_t *s = store_new(&conf, &node, segs);
  test_trace(s, &segs[0]);
  s->ops->destroy(s);
  return 0;
}

T_SCENARIO(another_store_reads_what_one_wrote, T_REAL, 90) {
  char *node;
  pr__cql_conf_t conf;
  pr__tseg_t segs[2];
  pr__tstore_t *s = store_new(&conf, &node, segs);
  const char *group = store_group;
  s->ops->destroy(s);
  test_handover(&conf, &segs[0], group);
  return 0;
}

T_SCENARIO(segment_of_another_slab_size_refused, T_REAL, 90) {
  char *node;
  pr__cql_conf_t conf;
  pr__tseg_t segs[2];
  pr__tstore_t *s = store_new(&conf, &node, segs);
  answered = failed = 0;
  s->ops->put(s, &segs[0], "k", base_s, PR_TIMER_APPLICATION, NULL, on_done,
              NULL);
  await_n(s, &answered, 1, 30);
  CHECK(!failed, "put: %s", last_errstr);
  s->ops->destroy(s);
  test_slab_size_refused(&conf, &segs[0], store_group);
  return 0;
}

/* The slabs a store of another process (the partition's next owner)
 * lists, as "a,b,c" relative to `s0`. */
static void expect_listed(pr__cql_conf_t *conf, const pr__tseg_t *seg,
                          int64_t s0, const char *want) {
  char err[1024], out[256];
  got_t g = {0};
  pr__tstore_t *o =
      T_LONE_STORE(conf, wake, NULL, err,
                   pr__cqlstore_new(w, T_KEYSPACE, store_group, SLAB_S, 3600,
                                    err, sizeof(err)));
  CHECK(o, "%s", err);
  o->ops->slabs(o, seg, SLAB_S, on_times, &g);
  await_got(o, &g);
  t_offsets_text(g.times, g.n, s0, out, sizeof(out));
  got_free(&g);
  o->ops->destroy(o);
  CHECK(!strcmp(out, want), "listed slabs %s, expected %s", out, want);
}

static void retire(pr__tstore_t *s, const pr__tseg_t *seg, const int64_t *slabs,
                   size_t n, int64_t watermark) {
  answered = failed = 0;
  s->ops->retire(s, seg, slabs, n, watermark, on_done, NULL);
  await_n(s, &answered, 1, 30);
  CHECK(!failed, "retire: %s", last_errstr);
}

/* Retiring finished slabs, as the original does: their listing rows are
 * deleted, and the watermark rises so that listings start above it; a put
 * into a retired slab writes its row again and lowers the watermark below
 * it (else no owner would load it); a watermark is never lowered by a
 * retire. Each listing is another store's, reading what Cassandra holds. */
T_SCENARIO(finished_slabs_retired_and_watermark_raised, T_REAL, 90) {
  char *node;
  pr__cql_conf_t conf;
  pr__tseg_t segs[2], seg = {"retire", 0};
  pr__tstore_t *s = store_new(&conf, &node, segs);
  int64_t s0 = pr__slab_of(base_s, SLAB_S), one[1];
  answered = failed = 0;
  for (int i = 0; i < 4; i++)
    s->ops->put(s, &seg, "k", (s0 + i) * SLAB_S + 5, PR_TIMER_APPLICATION, NULL,
                on_done, NULL);
  await_n(s, &answered, 4, 30);
  CHECK(!failed, "puts: %s", last_errstr);
  expect_listed(&conf, &seg, s0, "0,1,2,3");
  one[0] = s0 + 1; /* a row alone, the watermark left as it is */
  retire(s, &seg, one, 1, -1);
  expect_listed(&conf, &seg, s0, "0,2,3");
  one[0] = s0; /* the lowest row, and the watermark up to it */
  retire(s, &seg, one, 1, s0 + 1);
  expect_listed(&conf, &seg, s0, "2,3");
  retire(s, &seg, NULL, 0, s0 - 10); /* lower: left as it is */
  expect_listed(&conf, &seg, s0, "2,3");
  /* A timer put into a retired slab below the watermark is listed again. */
  answered = failed = 0;
  s->ops->put(s, &seg, "k2", s0 * SLAB_S + 9, PR_TIMER_APPLICATION, NULL,
              on_done, NULL);
  await_n(s, &answered, 1, 30);
  CHECK(!failed, "put: %s", last_errstr);
  expect_listed(&conf, &seg, s0, "0,2,3");
  s->ops->destroy(s);
  return 0;
}

T_SCENARIO(unreachable_node_answers_every_operation, T_REAL, 90) {
  test_unreachable();
  return 0;
}
