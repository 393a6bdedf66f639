/*
 * test_engine.c - the consumer engine's logic, file by file, without a
 * broker: backpressure thresholds (backpressure.c), key queues and the
 * offset tracker (partition.c, tracker.c), the mode's result layers and
 * the retry backoff (outcome.c), decoding, filters and the JSON validator
 * (decode.c, util/jsonv.c), deduplication ids and their cache (dedup.c,
 * stores/idset.c), the defer layer's delays and failure rate (defer.c) and
 * its memory store (stores/memdefer.c), and the mailbox (mailbox.c).
 */
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine/dedup.h"
#include "engine/defer.h"
#include "engine/internal.h"

/* --- backpressure.c ---------------------------------------------------- */

static void test_backpressure_limits(void **state) {
  (void)state;
  /* max_uncommitted 64: stops at 64 unfinished events ... */
  assert_false(pr__bp_over(63, 0, 64));
  assert_true(pr__bp_over(64, 0, 64));
  /* ... or a full offset window (64 x 64 records behind the commit) */
  assert_false(pr__bp_over(1, 64 * 64 - 1, 64));
  assert_true(pr__bp_over(1, 64 * 64, 64));
  /* read again only when both are at half */
  assert_true(pr__bp_under_half(32, 64 * 32, 64));
  assert_false(pr__bp_under_half(33, 0, 64));
  assert_false(pr__bp_under_half(0, 64 * 32 + 1, 64));
  /* max_uncommitted 1: one event stops it, none releases it */
  assert_true(pr__bp_over(1, 0, 1));
  assert_true(pr__bp_under_half(0, 0, 1));
  assert_false(pr__bp_under_half(1, 0, 1));
}

/* --- partition.c: key queues, tracker ---------------------------------- */

/* A partition of an engine that has just its scheduler (key queues pin
 * their key's scheduler state). */
static void part_init(part_t *part, pr__engine_t *eng) {
  memset(eng, 0, sizeof(*eng));
  memset(part, 0, sizeof(*part));
  pr__sched_init(&eng->sched, 0.3, 120, 200, 8192);
  part->eng = eng;
  part->topic = "t";
}

static void test_key_queues(void **state) {
  pr__engine_t eng;
  part_t part;
  kq_t *a, *b;
  char key[32];
  (void)state;
  part_init(&part, &eng);
  assert_null(pr__kq_get(&part, "a", 0)); /* absent, not created */
  a = pr__kq_get(&part, "a", 1);
  assert_non_null(a);
  assert_string_equal(a->key, "a");
  assert_ptr_equal(pr__kq_get(&part, "a", 1), a); /* found, not duplicated */
  assert_int_equal(part.nkeys, 1);
  assert_int_equal(pr__sched_keys(&eng.sched), 1); /* pinned in the scheduler */
  /* growing the table keeps every key findable */
  for (int i = 0; i < 5000; i++) {
    snprintf(key, sizeof(key), "key-%d", i);
    assert_non_null(pr__kq_get(&part, key, 1));
  }
  assert_int_equal(part.nkeys, 5001);
  assert_true(part.nbuckets > 64);
  assert_ptr_equal(pr__kq_get(&part, "a", 0), a);
  b = pr__kq_get(&part, "key-4999", 0);
  assert_non_null(b);
  assert_string_equal(b->key, "key-4999");
  pr__kq_remove(&part, b);
  assert_null(pr__kq_get(&part, "key-4999", 0));
  assert_int_equal(part.nkeys, 5000);
  for (int i = 0; i < 4999; i++) {
    snprintf(key, sizeof(key), "key-%d", i);
    pr__kq_remove(&part, pr__kq_get(&part, key, 0));
  }
  pr__kq_remove(&part, a);
  assert_int_equal(part.nkeys, 0);
  /* unpinned: kept (LRU) up to scheduler_cache_size */
  assert_int_equal(pr__sched_keys(&eng.sched), 5001);
  free(part.buckets);
  pr__sched_fini(&eng.sched);
}

/* Detaching the head hands over the key's next event; the emptied queue
 * stays for the key's next event until a tick finds it still empty since
 * the last one (a revoking partition's goes at once). */
static void test_key_fifo_detach(void **state) {
  pr__engine_t eng;
  part_t part;
  inv_t i1, i2;
  kq_t *kq;
  (void)state;
  part_init(&part, &eng);
  memset(&i1, 0, sizeof(i1));
  memset(&i2, 0, sizeof(i2));
  kq = pr__kq_get(&part, "k", 1);
  i1.part = i2.part = &part;
  i1.kq = i2.kq = kq;
  kq->head = &i1;
  i1.next = &i2;
  kq->tail = &i2;
  part.invs = 2;
  assert_ptr_equal(pr__kq_detach(&i1), &i2);
  assert_ptr_equal(kq->head, &i2);
  assert_int_equal(part.invs, 1);
  assert_null(pr__kq_detach(&i2));
  assert_int_equal(part.invs, 0);
  eng.parts = &part;
  pr__part_tick_keys(&eng);                        /* empty: marked */
  assert_ptr_equal(pr__kq_get(&part, "k", 0), kq); /* asked for: kept */
  assert_null(kq->head);
  pr__part_tick_keys(&eng);
  assert_ptr_equal(pr__kq_get(&part, "k", 0), kq);
  assert_int_equal(part.nkeys, 1);
  pr__part_tick_keys(&eng);
  pr__part_tick_keys(&eng); /* empty since the last tick: removed */
  assert_null(pr__kq_get(&part, "k", 0));
  assert_int_equal(part.nkeys, 0);
  /* a revoking partition's emptied queue goes at once */
  kq = pr__kq_get(&part, "k", 1);
  i1.kq = kq;
  i1.next = NULL;
  kq->head = kq->tail = &i1;
  part.invs = 1;
  part.revoking = 1;
  assert_null(pr__kq_detach(&i1));
  assert_null(pr__kq_get(&part, "k", 0));
  free(part.buckets);
  pr__sched_fini(&eng.sched);
}

/* Offsets complete in any order; the commit position is watermark + 1. */
static void test_tracker(void **state) {
  pr__tracker_t t;
  (void)state;
  pr__tracker_init(&t);
  for (int64_t o = 10; o < 15; o++)
    assert_int_equal(pr__tracker_take(&t, o), 0);
  assert_int_equal(pr__tracker_take(&t, 12), 1); /* redelivery: ignored */
  assert_int_equal(pr__tracker_oldest(&t), 10);
  assert_int_equal(pr__tracker_complete(&t, 12), 0); /* 10 still pending */
  assert_int_equal(pr__tracker_complete(&t, 10), 1);
  assert_int_equal(t.commit, 11);
  assert_int_equal(pr__tracker_complete(&t, 11), 1);
  assert_int_equal(t.commit, 13); /* 12 was done already */
  assert_int_equal(pr__tracker_oldest(&t), 13);
  assert_int_equal(pr__tracker_complete(&t, 99), -1);
  assert_int_equal(pr__tracker_complete(&t, 14), 0);
  assert_int_equal(pr__tracker_complete(&t, 13), 1);
  assert_int_equal(t.commit, 15);
  assert_int_equal(pr__tracker_oldest(&t), -1);
  /* a long run wraps the ring and grows it */
  for (int64_t o = 100; o < 10100; o++)
    assert_int_equal(pr__tracker_take(&t, o), 0);
  for (int64_t o = 10099; o > 100; o--)
    assert_int_equal(pr__tracker_complete(&t, o), 0);
  assert_int_equal(pr__tracker_complete(&t, 100), 1);
  assert_int_equal(t.commit, 10100);
  pr__tracker_fini(&t);
}

/* Offsets with gaps (compaction, transaction markers), completed in a
 * scrambled order while the ring wraps and grows: the tracker agrees with
 * a plain model (the commit position, the oldest pending offset). */
static void test_tracker_gaps(void **state) {
  enum { N = 3000 };
  static int64_t offs[N];
  static unsigned char done[N];
  pr__tracker_t t;
  int64_t o = 5;
  size_t taken = 0, next = 0;
  unsigned seed = 7;
  (void)state;
  pr__tracker_init(&t);
  memset(done, 0, sizeof(done));
  while (next < N) {
    /* take a few (sometimes skipping offsets), then complete one pending */
    for (int i = 0; i < 3 && taken < N; i++) {
      o += rand_r(&seed) % 4 == 0 ? 1 + rand_r(&seed) % 5 : 1;
      offs[taken++] = o;
      assert_int_equal(pr__tracker_take(&t, o), 0);
    }
    size_t pick = next + (size_t)rand_r(&seed) % (taken - next);
    while (done[pick])
      pick = pick + 1 < taken ? pick + 1 : next;
    done[pick] = 1;
    assert_int_not_equal(pr__tracker_complete(&t, offs[pick]), -1);
    assert_int_equal(pr__tracker_complete(&t, offs[pick]), -1); /* twice */
    assert_int_equal(pr__tracker_complete(&t, offs[pick] + 1000000), -1);
    while (next < taken && done[next])
      next++;
    if (next > 0)
      assert_int_equal(t.commit, offs[next - 1] + 1);
    assert_int_equal(pr__tracker_oldest(&t), next < taken ? offs[next] : -1);
  }
  pr__tracker_fini(&t);
}

/* --- outcome.c --------------------------------------------------------- */

typedef struct fixture {
  prosody_config_t *conf;
  pr__settings_t st;
  pr__engine_t eng;
  part_t part;
  inv_t inv;
} fixture_t;

static fixture_t *fixture(const char *mode, const char *max_retries) {
  fixture_t *f = calloc(1, sizeof(*f));
  char err[512];
  assert_non_null(f);
  f->conf = prosody_config_new();
  assert_int_equal(prosody_config_set(f->conf, "mode", mode, err, sizeof(err)),
                   PROSODY_OK);
  assert_int_equal(
      prosody_config_set(f->conf, "max_retries", max_retries, err, sizeof(err)),
      PROSODY_OK);
  assert_int_equal(prosody_config_set(f->conf, "allowed_events",
                                      "order.,user.created", err, sizeof(err)),
                   PROSODY_OK);
  assert_int_equal(
      prosody_config_set(f->conf, "retry_base", "100ms", err, sizeof(err)),
      PROSODY_OK);
  assert_int_equal(
      prosody_config_set(f->conf, "max_retry_delay", "1s", err, sizeof(err)),
      PROSODY_OK);
  assert_int_equal(pr__settings_resolve(f->conf, &f->st, err, sizeof(err)),
                   PROSODY_OK);
  f->eng.st = &f->st;
  f->eng.mode = PR_CFG_ENUM(&f->st, MODE);
  f->eng.layers = pr__mode_layers(f->eng.mode);
  f->eng.group_id = "g";
  f->eng.phase = PH_RUNNING;
  f->eng.seed = 42;
  f->part.topic = "t";
  f->inv.eng = &f->eng;
  f->inv.part = &f->part;
  f->inv.msg.topic = "t";
  f->inv.msg.key = "k";
  return f;
}

static void fixture_free(fixture_t *f) {
  pr__settings_fini(&f->st);
  prosody_config_destroy(f->conf);
  free(f);
}

static pr__verdict_t decide(fixture_t *f, prosody_result_t r, int attempt) {
  f->inv.result = r;
  f->inv.attempt = attempt;
  return pr__layers_decide(&f->inv, NULL);
}

static void test_outcome_pipeline(void **state) {
  fixture_t *f = fixture("pipeline", "3");
  (void)state;
  assert_int_equal(decide(f, PROSODY_SUCCESS, 1), V_COMMIT);
  assert_int_equal(decide(f, PROSODY_TRANSIENT, 1), V_RETRY);
  assert_int_equal(decide(f, PROSODY_TRANSIENT, 1000), V_RETRY); /* for ever */
  assert_int_equal(decide(f, PROSODY_PERMANENT, 1), V_COMMIT);   /* skipped */
  f->inv.is_timer = 1; /* the same for a timer */
  assert_int_equal(decide(f, PROSODY_TRANSIENT, 7), V_RETRY);
  f->part.revoking = 1; /* revoke: any failure ends without commit */
  assert_int_equal(decide(f, PROSODY_TRANSIENT, 1), V_ABORT);
  assert_int_equal(decide(f, PROSODY_SUCCESS, 1), V_COMMIT);
  f->part.revoking = 0;
  f->eng.phase = PH_DRAINING; /* shutdown: likewise */
  assert_int_equal(decide(f, PROSODY_PERMANENT, 1), V_ABORT);
  fixture_free(f);
}

static void test_outcome_low_latency(void **state) {
  fixture_t *f = fixture("low-latency", "2");
  (void)state;
  assert_int_equal(decide(f, PROSODY_SUCCESS, 3), V_COMMIT);
  assert_int_equal(decide(f, PROSODY_TRANSIENT, 1), V_RETRY);
  assert_int_equal(decide(f, PROSODY_TRANSIENT, 2), V_RETRY);
  assert_int_equal(decide(f, PROSODY_TRANSIENT, 3), V_DEAD); /* 2 retries */
  assert_int_equal(decide(f, PROSODY_PERMANENT, 1), V_DEAD); /* no retry */
  f->inv.is_timer = 1; /* a timer is dropped, never dead-lettered */
  assert_int_equal(decide(f, PROSODY_TRANSIENT, 3), V_COMMIT);
  f->part.zombie = 1;
  assert_int_equal(decide(f, PROSODY_TRANSIENT, 1), V_ABORT);
  fixture_free(f);
}

static void test_outcome_best_effort(void **state) {
  fixture_t *f = fixture("best-effort", "3");
  (void)state;
  assert_int_equal(decide(f, PROSODY_SUCCESS, 1), V_COMMIT);
  assert_int_equal(decide(f, PROSODY_TRANSIENT, 1), V_COMMIT);
  assert_int_equal(decide(f, PROSODY_PERMANENT, 1), V_COMMIT);
  fixture_free(f);
}

/* --- defer.c, stores/memdefer.c ---------------------------------------- */

/* Deferred retry n waits a uniform whole number of seconds in [1, max(1,
 * min(defer_base * 2^(n-1), defer_max_delay))]; retry 0 goes at once. */
static void test_defer_delay(void **state) {
  fixture_t *f = fixture("pipeline", "3");
  char err[256];
  int seen[6][9] = {{0}};
  (void)state;
  assert_int_equal(
      prosody_config_set(f->conf, "defer_base", "1s", err, sizeof(err)),
      PROSODY_OK);
  assert_int_equal(
      prosody_config_set(f->conf, "defer_max_delay", "6s", err, sizeof(err)),
      PROSODY_OK);
  pr__settings_fini(&f->st);
  assert_int_equal(pr__settings_resolve(f->conf, &f->st, err, sizeof(err)),
                   PROSODY_OK);
  assert_int_equal(pr__df_delay_s(&f->eng, 0), 0);
  for (int round = 0; round < 4000; round++)
    for (int n = 1; n < 6; n++) {
      int64_t d = pr__df_delay_s(&f->eng, n);
      int64_t most = n == 1 ? 1 : n == 2 ? 2 : n == 3 ? 4 : 6;
      assert_true(d >= 1 && d <= most);
      seen[n][d]++;
    }
  /* every whole second of each range comes up */
  assert_true(seen[2][1] && seen[2][2]);
  assert_true(seen[3][1] && seen[3][4]);
  assert_true(seen[5][1] && seen[5][6] && !seen[5][7]);
  fixture_free(f);
}

/* The failure rate over the window: transient failures over all results,
 * forgotten once they leave the window. */
static void test_defer_gate(void **state) {
  fixture_t *f = fixture("pipeline", "3");
  /* the engine's clock (the layers read it): 60 buckets of 1 s */
  int64_t t = pr__now_ns();
  char err[256];
  (void)state;
  assert_int_equal(prosody_config_set(f->conf, "defer_failure_window", "60s",
                                      err, sizeof(err)),
                   PROSODY_OK);
  pr__settings_fini(&f->st);
  assert_int_equal(pr__settings_resolve(f->conf, &f->st, err, sizeof(err)),
                   PROSODY_OK);
  f->st.test.memory_timers = 1; /* the layer's stores in memory */
  /* no on_timer: a message store only */
  assert_int_equal(pr__df_open(&f->eng, "localhost:9092", err, sizeof(err)),
                   PROSODY_OK);
  assert_true(pr__df_gate(&f->eng, t)); /* nothing yet: open */
  pr__df_count(&f->eng, PROSODY_TRANSIENT, t);
  assert_false(pr__df_gate(&f->eng, t)); /* 1 of 1 > 0.9 */
  for (int i = 0; i < 10; i++)
    pr__df_count(&f->eng, PROSODY_SUCCESS, t + i * 1000000);
  assert_true(pr__df_gate(&f->eng, t)); /* 1 of 11 */
  for (int i = 0; i < 89; i++)
    pr__df_count(&f->eng, PROSODY_TRANSIENT, t + INT64_C(30000000000));
  assert_true(pr__df_gate(&f->eng, t + INT64_C(30000000000))); /* 90 / 100 */
  pr__df_count(&f->eng, PROSODY_TRANSIENT, t + INT64_C(30000000000));
  assert_false(pr__df_gate(&f->eng, t + INT64_C(30000000000))); /* 91/101 */
  /* a permanent failure is not a failure here (it is not retried) */
  for (int i = 0; i < 20; i++)
    pr__df_count(&f->eng, PROSODY_PERMANENT, t + INT64_C(31000000000));
  assert_true(pr__df_gate(&f->eng, t + INT64_C(31000000000)));
  /* 61 s on: the first second's results have left the window */
  assert_true(pr__df_gate(&f->eng, t + INT64_C(61000000000)));
  /* 2 min on: all of them */
  pr__df_count(&f->eng, PROSODY_TRANSIENT, t + INT64_C(120000000000));
  assert_false(pr__df_gate(&f->eng, t + INT64_C(120000000000)));
  /* the pipeline's layers: deferred while open, else retried in place; a
   * deferred event loaded again is always deferred again */
  f->inv.result = PROSODY_TRANSIENT;
  f->inv.attempt = 1;
  assert_int_equal(pr__layers_decide(&f->inv, NULL), V_RETRY); /* closed now */
  f->inv.df_loaded = 1;
  assert_int_equal(pr__layers_decide(&f->inv, NULL), V_DEFER);
  f->inv.df_loaded = 0;
  for (int i = 0; i < 20; i++)
    pr__df_count(&f->eng, PROSODY_SUCCESS, t + INT64_C(121000000000));
  assert_int_equal(pr__layers_decide(&f->inv, NULL), V_DEFER);
  f->inv.result = PROSODY_PERMANENT;
  assert_int_equal(pr__layers_decide(&f->inv, NULL), V_COMMIT);
  f->inv.is_timer = 1; /* timers: only with a timer defer store */
  f->inv.result = PROSODY_TRANSIENT;
  assert_int_equal(pr__layers_decide(&f->inv, NULL), V_RETRY);
  pr__layers_close(&f->eng, 1);
  fixture_free(f);
}

static int g_done, g_found;
static int64_t g_pos;
static int32_t g_retries;
static size_t g_nkeys;
static char g_keys[4][32];

static void on_done(void *arg, prosody_err_t err, const char *errstr) {
  (void)arg;
  (void)errstr;
  assert_int_equal(err, PROSODY_OK);
  g_done++;
}

static void on_head(void *arg, prosody_err_t err, const char *errstr, int found,
                    int64_t position, int32_t retries) {
  (void)arg;
  (void)errstr;
  assert_int_equal(err, PROSODY_OK);
  g_found = found;
  g_pos = position;
  g_retries = retries;
}

static void on_keys(void *arg, prosody_err_t err, const char *errstr,
                    const pr__dkey_t *keys, size_t n) {
  (void)arg;
  (void)errstr;
  assert_int_equal(err, PROSODY_OK);
  g_nkeys = n;
  for (size_t i = 0; i < n && i < 4; i++)
    snprintf(g_keys[i], sizeof(g_keys[i]), "%s@%lld", keys[i].key,
             (long long)keys[i].retry_at_s);
}

/* The memory store: per (kind, segment, key) the positions in ascending
 * order, each with its retry count; keys listed per segment and kind. */
static void test_memdefer(void **state) {
  pr__defer_t *m = pr__defer_memory(PR_DEFER_MESSAGES);
  pr__defer_t *t = pr__defer_memory(PR_DEFER_TIMERS);
  (void)state;
  pr__defer_set_key(m, "s1", "a", 100, on_done, NULL);
  pr__defer_append(m, "s1", "a", 30, 1, on_done, NULL);
  pr__defer_append(m, "s1", "a", 10, 0, on_done, NULL); /* before 30 */
  pr__defer_append(m, "s1", "a", 20, 0, on_done, NULL);
  pr__defer_append(m, "s2", "a", 5, 0, on_done, NULL); /* another segment */
  pr__defer_append(t, "s1", "a", 7, 0, on_done, NULL); /* another kind */
  assert_int_equal(g_done, 6);
  pr__defer_head(m, "s1", "a", on_head, NULL);
  assert_true(g_found);
  assert_int_equal(g_pos, 10);
  pr__defer_set_retries(m, "s1", "a", 10, 4, on_done, NULL);
  pr__defer_head(m, "s1", "a", on_head, NULL);
  assert_int_equal(g_retries, 4);
  pr__defer_advance(m, "s1", "a", 10, on_done, NULL);
  pr__defer_head(m, "s1", "a", on_head, NULL);
  assert_int_equal(g_pos, 20);
  assert_int_equal(g_retries, 0);
  /* only keys marked deferred are listed, with their retry time */
  pr__defer_keys(m, "s1", on_keys, NULL);
  assert_int_equal(g_nkeys, 1);
  assert_string_equal(g_keys[0], "a@100");
  pr__defer_keys(m, "s2", on_keys, NULL);
  assert_int_equal(g_nkeys, 0);
  pr__defer_keys(t, "s1", on_keys, NULL);
  assert_int_equal(g_nkeys, 0);
  pr__defer_advance(m, "s1", "a", 20, on_done, NULL);
  pr__defer_advance(m, "s1", "a", 30, on_done, NULL);
  pr__defer_head(m, "s1", "a", on_head, NULL);
  assert_false(g_found);
  pr__defer_del_key(m, "s1", "a", on_done, NULL);
  pr__defer_keys(m, "s1", on_keys, NULL);
  assert_int_equal(g_nkeys, 0);
  pr__defer_head(t, "s1", "a", on_head, NULL);
  assert_true(g_found);
  assert_int_equal(g_pos, 7);
  pr__defer_advance(t, "s1", "a", 7, on_done, NULL);
  pr__defer_advance(m, "s2", "a", 5, on_done, NULL);
  pr__defer_free(m);
  pr__defer_free(t);
}

/* A deferral store whose answers wait until the test releases them. */
typedef struct slow_store {
  pr__defer_t base;
  int nheld;
  struct {
    pr__head_cb head;
    pr__store_done_cb done;
    void *arg;
  } held[8];
} slow_store_t;

static void slow_head(pr__defer_t *d, const char *seg, const char *key,
                      pr__head_cb cb, void *arg) {
  slow_store_t *s = (slow_store_t *)d;
  (void)seg;
  (void)key;
  s->held[s->nheld].head = cb;
  s->held[s->nheld].done = NULL;
  s->held[s->nheld++].arg = arg;
}

static void slow_append(pr__defer_t *d, const char *seg, const char *key,
                        int64_t position, int32_t retries, pr__store_done_cb cb,
                        void *arg) {
  slow_store_t *s = (slow_store_t *)d;
  (void)seg;
  (void)key;
  (void)position;
  (void)retries;
  s->held[s->nheld].head = NULL;
  s->held[s->nheld].done = cb;
  s->held[s->nheld++].arg = arg;
}

/* Answers held request `i`: a head read says `found` at `pos`; a write
 * gives `err`. */
static void slow_release(slow_store_t *s, int i, int found, int64_t pos,
                         prosody_err_t err) {
  if (s->held[i].head)
    s->held[i].head(s->held[i].arg, PROSODY_OK, NULL, found, pos, 0);
  else
    s->held[i].done(s->held[i].arg, err, err ? "refused" : NULL);
}

static void slow_destroy(pr__defer_t *d) { (void)d; }

static void cache_on_done(void *arg, prosody_err_t err, const char *errstr) {
  (void)errstr;
  *(prosody_err_t *)arg = err;
}

/* defer_store_cache_size: a head read the cache knows costs no store read,
 * and what it answers is what the store would. */
static void test_defer_cache(void **state) {
  pr__defer_t *m = pr__defer_memory(PR_DEFER_MESSAGES);
  pr__defer_t *c = pr__defer_cached(m, 2);
  static const pr__defer_ops_t slow_ops = {
      NULL, NULL, NULL, slow_append, slow_head,
      NULL, NULL, NULL, NULL,        slow_destroy};
  slow_store_t slow = {{&slow_ops, PR_DEFER_MESSAGES, 0}, 0, {{0}}};
  prosody_err_t werr = PROSODY_OK;
  uint64_t hits, misses;
  (void)state;
  assert_non_null(c);
  pr__defer_head(c, "dc", "a", on_head, NULL); /* read, and kept */
  assert_false(g_found);
  pr__defer_head(c, "dc", "a", on_head, NULL);
  assert_false(g_found);
  pr__defer_cache_stats(c, &hits, &misses);
  assert_int_equal(hits, 1);
  assert_int_equal(misses, 1);
  /* writes keep a known head true: append, retry count, a lower append */
  pr__defer_append(c, "dc", "a", 10, 0, on_done, NULL);
  pr__defer_head(c, "dc", "a", on_head, NULL);
  assert_true(g_found);
  assert_int_equal(g_pos, 10);
  pr__defer_set_retries(c, "dc", "a", 10, 3, on_done, NULL);
  pr__defer_append(c, "dc", "a", 20, 0, on_done, NULL);
  pr__defer_head(c, "dc", "a", on_head, NULL);
  assert_int_equal(g_pos, 10);
  assert_int_equal(g_retries, 3);
  pr__defer_append(c, "dc", "a", 5, 1, on_done, NULL);
  pr__defer_head(c, "dc", "a", on_head, NULL);
  assert_int_equal(g_pos, 5);
  assert_int_equal(g_retries, 1);
  pr__defer_cache_stats(c, &hits, &misses);
  assert_int_equal(hits, 4);
  assert_int_equal(misses, 1);
  /* removing the head: the next one is read from the store */
  pr__defer_advance(c, "dc", "a", 5, on_done, NULL);
  pr__defer_head(c, "dc", "a", on_head, NULL);
  assert_int_equal(g_pos, 10);
  assert_int_equal(g_retries, 3);
  pr__defer_trim(c, "dc", "a", 15, on_done, NULL);
  pr__defer_head(c, "dc", "a", on_head, NULL);
  assert_int_equal(g_pos, 20);
  pr__defer_cache_stats(c, &hits, &misses);
  assert_int_equal(misses, 3);
  /* an assignment of the segment forgets it */
  pr__defer_keys(c, "dc", on_keys, NULL);
  pr__defer_head(c, "dc", "a", on_head, NULL);
  pr__defer_cache_stats(c, &hits, &misses);
  assert_int_equal(misses, 4);
  /* at most two keys: the least recently used goes */
  pr__defer_head(c, "dc", "b", on_head, NULL);
  pr__defer_head(c, "dc", "c", on_head, NULL);
  pr__defer_head(c, "dc", "a", on_head, NULL);
  pr__defer_cache_stats(c, &hits, &misses);
  assert_int_equal(misses, 7);
  assert_int_equal(g_pos, 20);
  pr__defer_advance(c, "dc", "a", 20, on_done, NULL);
  pr__defer_free(c); /* frees m too */

  /* A read answered after a write of its key started is not kept (it may
   * predate the write), and a failed write forgets the head. */
  c = pr__defer_cached(&slow.base, 4);
  pr__defer_head(c, "s", "k", on_head, NULL);         /* held 0 */
  pr__defer_append(c, "s", "k", 7, 0, on_done, NULL); /* held 1 */
  slow_release(&slow, 0, 0, 0, PROSODY_OK);           /* "nothing" */
  assert_false(g_found);
  slow_release(&slow, 1, 0, 0, PROSODY_OK);
  pr__defer_head(c, "s", "k", on_head, NULL); /* not known: read (held 2) */
  assert_int_equal(slow.nheld, 3);
  slow_release(&slow, 2, 1, 7, PROSODY_OK);
  pr__defer_head(c, "s", "k", on_head, NULL); /* known now */
  assert_int_equal(slow.nheld, 3);
  assert_int_equal(g_pos, 7);
  pr__defer_append(c, "s", "k", 3, 0, cache_on_done, &werr); /* held 3 */
  slow_release(&slow, 3, 0, 0, PROSODY_ERR_TRANSIENT);
  assert_int_equal(werr, PROSODY_ERR_TRANSIENT);
  pr__defer_head(c, "s", "k", on_head, NULL); /* unknown again: read */
  assert_int_equal(slow.nheld, 5);
  slow_release(&slow, 4, 1, 7, PROSODY_OK);
  pr__defer_free(c);
}

/* Full jitter: uniform in [0, min(2^n * base, max)). */
static void test_backoff(void **state) {
  fixture_t *f = fixture("pipeline", "3");
  uint64_t max_seen[12] = {0};
  (void)state;
  for (int round = 0; round < 2000; round++)
    for (int n = 0; n < 12; n++) {
      uint64_t ms = pr__outcome_backoff_ms(&f->eng, n);
      uint64_t ceil = (uint64_t)100 << n;
      if (ceil > 1000)
        ceil = 1000;
      assert_true(ms < ceil);
      if (ms > max_seen[n])
        max_seen[n] = ms;
    }
  /* the draws spread over the range (not stuck near 0) */
  assert_true(max_seen[0] >= 80);
  assert_true(max_seen[11] >= 900);
  fixture_free(f);
}

/* --- decode.c ---------------------------------------------------------- */

static void prepare_payload(fixture_t *f, const char *payload) {
  if (f->inv.msg.json)
    json_decref(f->inv.msg.json);
  f->inv.msg.json = NULL;
  f->inv.skip = NULL;
  f->inv.skip_warn = 0;
  f->inv.msg.payload = (char *)payload;
  f->inv.msg.payload_len = strlen(payload);
  pr__decode_prepare(&f->inv);
}

static void test_decode(void **state) {
  fixture_t *f = fixture("pipeline", "3");
  (void)state;
  prepare_payload(f, "{\"type\":\"order.placed\",\"n\":1}");
  assert_null(f->inv.skip);
  assert_non_null(f->inv.msg.json);
  assert_int_equal(json_integer_value(json_object_get(f->inv.msg.json, "n")),
                   1);
  prepare_payload(f, "{\"type\":\"user.created\"}"); /* prefix matches */
  assert_null(f->inv.skip);
  prepare_payload(f, "{\"type\":\"user.deleted\"}"); /* filtered */
  assert_string_equal(f->inv.skip, "event type not allowed");
  assert_false(f->inv.skip_warn);
  prepare_payload(f, "[1,2,3]"); /* not an object: no type, processed */
  assert_null(f->inv.skip);
  prepare_payload(f, "\"text\""); /* any JSON value */
  assert_null(f->inv.skip);
  prepare_payload(f, "{\"type\":"); /* not JSON: skipped with a warning */
  assert_string_equal(f->inv.skip, "payload is not valid JSON");
  assert_true(f->inv.skip_warn);
  /* our own output (source-system = group id) is skipped */
  f->inv.msg.headers = rd_kafka_headers_new(1);
  rd_kafka_header_add(f->inv.msg.headers, "source-system", -1, "g", -1);
  prepare_payload(f, "{\"type\":\"order.placed\"}");
  assert_string_equal(f->inv.skip, "our own output");
  rd_kafka_headers_destroy(f->inv.msg.headers);
  f->inv.msg.headers = rd_kafka_headers_new(1);
  rd_kafka_header_add(f->inv.msg.headers, "source-system", -1, "other", -1);
  prepare_payload(f, "{\"type\":\"order.placed\"}");
  assert_null(f->inv.skip);
  rd_kafka_headers_destroy(f->inv.msg.headers);
  f->inv.msg.headers = NULL;
  if (f->inv.msg.json)
    json_decref(f->inv.msg.json);
  fixture_free(f);
}

/* Without allowed_events the payload is only validated; the tree is built
 * on the first prosody_message_json() and kept. */
static void test_decode_lazy(void **state) {
  fixture_t *f = fixture("pipeline", "3");
  const json_t *j;
  (void)state;
  pr__value_fini(PR_OPT_ALLOWED_EVENTS, &f->st.v[PR_OPT_ALLOWED_EVENTS]);
  prepare_payload(f, "{\"type\":\"user.deleted\",\"n\":2}");
  assert_null(f->inv.skip);
  assert_null(f->inv.msg.json);
  j = prosody_message_json(&f->inv.msg);
  assert_non_null(j);
  assert_int_equal(json_integer_value(json_object_get(j, "n")), 2);
  assert_ptr_equal(prosody_message_json(&f->inv.msg), j);
  prepare_payload(f, "{\"n\":"); /* invalid: skipped, nothing built */
  assert_string_equal(f->inv.skip, "payload is not valid JSON");
  assert_null(f->inv.msg.json);
  fixture_free(f);
}

/* The validator agrees with jansson at its edges (the fuzz target
 * tests/fuzz/fuzz_json_valid.c compares them on random inputs). */
static int jansson_accepts(const char *s, size_t n) {
  json_t *j = json_loadb(s, n, JSON_DECODE_ANY, NULL);
  json_decref(j);
  return j != NULL;
}

static void check_valid(const char *s) {
  size_t n = strlen(s);
  int v = pr__json_valid(s, n);
  if (v != jansson_accepts(s, n))
    fail_msg("validator %d, jansson %d: %.80s", v, !v, s);
}

static void test_json_valid(void **state) {
  static const char *cases[] = {"{}",
                                "[]",
                                "0",
                                "-0",
                                "-",
                                "01",
                                "1.",
                                ".5",
                                "1e",
                                "1e+",
                                "1E-7",
                                "9223372036854775807",
                                "9223372036854775808",
                                "-9223372036854775808",
                                "-9223372036854775809",
                                "1e308",
                                "1e309",
                                "-1e309",
                                "1e-400",
                                "123456789012345678901234567890.5",
                                "true",
                                "truex",
                                "nul",
                                "null ",
                                " \t\r\n[1 , 2 ]\n",
                                "[1,]",
                                "[,1]",
                                "{\"a\":1,}",
                                "{\"a\" 1}",
                                "{1:2}",
                                "{\"a\":1}{",
                                "\"\\u0000\"",
                                "\"\\u00e9\"",
                                "\"\\ud83d\\ude00\"",
                                "\"\\ud83d\"",
                                "\"\\ude00\"",
                                "\"\\ud83dx\"",
                                "\"\\uZZZZ\"",
                                "\"\\x\"",
                                "\"a\tb\"",
                                "\"caf\xc3\xa9\"",
                                "\"\xc3\"",
                                "\"\xed\xa0\x80\"",
                                "\"\xf4\x90\x80\x80\"",
                                "\"\xc0\xaf\"",
                                "[\"a\"]]",
                                "",
                                " ",
                                "[[]",
                                "\"abc",
                                "{\"a\":[{\"b\":null}],\"c\":{}}"};
  char *deep;
  (void)state;
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
    check_valid(cases[i]);
  /* nesting: every value counts, up to JSON_PARSER_MAX_DEPTH */
  deep = malloc(2 * 2100 + 2);
  assert_non_null(deep);
  for (int depth = 2046; depth <= 2050; depth++) {
    memset(deep, '[', (size_t)depth);
    memset(deep + depth, ']', (size_t)depth);
    deep[2 * depth] = '\0';
    check_valid(deep); /* empty innermost array */
    memset(deep, '[', (size_t)depth);
    deep[depth] = '1';
    memset(deep + depth + 1, ']', (size_t)depth);
    deep[2 * depth + 1] = '\0';
    check_valid(deep); /* a scalar one level deeper */
  }
  free(deep);
  assert_false(pr__json_valid("1\0", 2)); /* NUL: never valid here */
  assert_true(pr__json_valid("{\"type\":\"a\"}", 12));
}

/* --- dedup.c, util/jsonv.c, stores/idset.c ----------------------------- */

/* The payload's top-level string "id", as the dedup layer reads it. */
static void test_json_member(void **state) {
  const char *v;
  size_t n;
  char out[64];
  (void)state;
#define ID(json) pr__json_scan(json, strlen(json), "id", &v, &n)
  assert_true(ID("{\"id\":\"abc\",\"n\":1}"));
  assert_non_null(v);
  assert_int_equal(n, 3);
  assert_memory_equal(v, "abc", 3);
  /* not the first member; whitespace; the first "id" wins */
  assert_true(
      ID(" { \"a\" : {\"id\":\"inner\"} , \"id\" : \"x\" , \"id\":\"y\"}"));
  assert_int_equal(n, 1);
  assert_memory_equal(v, "x", 1);
  /* only at the top level, only a string, only the exact key */
  assert_true(ID("{\"a\":{\"id\":\"inner\"}}"));
  assert_null(v);
  assert_true(ID("{\"id\":7}"));
  assert_null(v);
  assert_true(ID("[\"id\",\"x\"]"));
  assert_null(v);
  assert_true(ID("{\"idx\":\"x\",\"i\":\"y\"}"));
  assert_null(v);
  assert_true(ID("\"id\""));
  assert_null(v);
  /* invalid JSON: not valid, no id */
  assert_false(ID("{\"id\":\"x\""));
  assert_false(ID("{\"id\":\"x\",}"));
  /* escapes are undone: "\u0078" is "x", a surrogate pair one code point */
  assert_true(ID("{\"id\":\"a\\u0078\\n\\\"\\/\\ud83d\\ude00\"}"));
  n = pr__json_unescape(v, n, out);
  assert_int_equal(n, 1 + 1 + 1 + 1 + 1 + 4);
  assert_memory_equal(out, "ax\n\"/\xf0\x9f\x98\x80", n);
  assert_true(ID("{\"id\":\"\\u00e9\\u20ac\"}"));
  n = pr__json_unescape(v, n, out);
  assert_int_equal(n, 5);
  assert_memory_equal(out, "\xc3\xa9\xe2\x82\xac", 5);
#undef ID
  /* pr__json_find: stops at the id (validity unknown: 0), else judges the
   * whole text as pr__json_scan does */
#define FIND(json) pr__json_find(json, strlen(json), "id", &v, &n)
  assert_int_equal(FIND("{\"a\":[1,{\"id\":\"in\"}],\"id\":\"x\",}"), 0);
  assert_int_equal(n, 1);
  assert_memory_equal(v, "x", 1);
  assert_int_equal(FIND("{\"id\":7,\"n\":1}"), 1);
  assert_null(v);
  assert_int_equal(FIND("{\"id\":7,}"), -1);
  assert_null(v);
  assert_int_equal(FIND("{\"a\":tru,\"id\":\"x\"}"), -1); /* before it */
  assert_null(v);
  assert_int_equal(FIND("{\"id\":\"x\xff\"}"), -1); /* the id itself */
#undef FIND
}

/* Each input of the id matters, and an "id" is not an offset. */
static void test_dedup_id(void **state) {
  pr__did_t base = pr__dd_id("1", "g", "t", 0, "k", "x", 1, 5), d;
  (void)state;
  d = pr__dd_id("1", "g", "t", 0, "k", "x", 1, 99); /* offset unused */
  assert_true(d.hi == base.hi && d.lo == base.lo);
#define DIFFERS(...)                                                           \
  d = pr__dd_id(__VA_ARGS__);                                                  \
  assert_false(d.hi == base.hi && d.lo == base.lo)
  DIFFERS("2", "g", "t", 0, "k", "x", 1, 5);
  DIFFERS("1", "h", "t", 0, "k", "x", 1, 5);
  DIFFERS("1", "g", "u", 0, "k", "x", 1, 5);
  DIFFERS("1", "g", "t", 1, "k", "x", 1, 5);
  DIFFERS("1", "g", "t", 0, "j", "x", 1, 5);
  DIFFERS("1", "g", "t", 0, "k", "y", 1, 5);
  DIFFERS("1", "g", "t", 0, "k", NULL, 0, 5);
  /* fields do not run into each other */
  DIFFERS("1", "gt", "", 0, "k", "x", 1, 5);
#undef DIFFERS
  base = pr__dd_id("1", "g", "t", 0, "k", NULL, 0, 5);
  d = pr__dd_id("1", "g", "t", 0, "k", NULL, 0, 6);
  assert_false(d.hi == base.hi && d.lo == base.lo);
}

/* The ids are the original Prosody's (its deduplication table is shared):
 * values worked out apart from this code, from the original's layout of
 * the hashed fields, with Python's xxhash. */
static void test_dedup_id_original(void **state) {
  pr__did_t d =
      pr__dd_id("1", "billing", "orders", 3, "customer-7", "evt-42", 6, 0);
  (void)state;
  /* 32a59138-6737-869b-b679-03fbb8a5516c */
  assert_true(d.hi == UINT64_C(0x32a591386737869b));
  assert_true(d.lo == UINT64_C(0xb67903fbb8a5516c));
  /* no "id": the offset; c993fbaa-641a-8b1d-9683-55f61ffa5d8a */
  d = pr__dd_id("1", "billing", "orders", 3, "customer-7", NULL, 0, 1234);
  assert_true(d.hi == UINT64_C(0xc993fbaa641a8b1d));
  assert_true(d.lo == UINT64_C(0x968355f61ffa5d8a));
}

/* Segment ids: the name-based UUID (v5, OID namespace) of
 * "<topic>/<partition>:<group>", as Python's uuid.uuid5 makes it. */
static void test_segment_uuid(void **state) {
  static const uint8_t want[16] = {0x1b, 0x25, 0x26, 0xc8, 0xb7, 0x22,
                                   0x5c, 0xe1, 0xb5, 0xae, 0x1a, 0xb1,
                                   0x51, 0xde, 0xff, 0x06};
  uint8_t u[16];
  (void)state;
  assert_int_equal(pr__uuid_v5(pr__uuid_ns_oid, "orders/3:billing", 16, u), 0);
  assert_memory_equal(u, want, 16);
}

/* The cache: least recently used out first; expired ids are gone. */
static void test_idset(void **state) {
  pr__idset_t *s = pr__idset_new(3);
  pr__did_t id[5];
  (void)state;
  assert_non_null(s);
  for (int i = 0; i < 5; i++) {
    id[i].hi = (uint64_t)i * 7;
    id[i].lo = (uint64_t)i;
  }
  for (int i = 0; i < 3; i++)
    assert_int_equal(pr__idset_add(s, id[i], 100), 0);
  assert_true(pr__idset_has(s, id[0], 50)); /* 0 is now the most recent */
  assert_int_equal(pr__idset_add(s, id[3], 100), 0); /* evicts 1 */
  assert_int_equal(pr__idset_size(s), 3);
  assert_false(pr__idset_has(s, id[1], 50));
  assert_true(pr__idset_has(s, id[0], 50));
  assert_true(pr__idset_has(s, id[2], 50));
  assert_true(pr__idset_has(s, id[3], 50));
  /* expiry: at 100 an id added until 100 is gone */
  assert_false(pr__idset_has(s, id[2], 100));
  assert_int_equal(pr__idset_size(s), 2);
  /* renewing keeps one entry */
  assert_int_equal(pr__idset_add(s, id[0], 200), 0);
  assert_int_equal(pr__idset_add(s, id[0], 300), 0);
  assert_int_equal(pr__idset_size(s), 2);
  assert_true(pr__idset_has(s, id[0], 250));
  /* a larger capacity is kept; a smaller one is not taken */
  pr__idset_reserve(s, 1);
  assert_int_equal(pr__idset_add(s, id[4], 300), 0);
  assert_int_equal(pr__idset_size(s), 3);
  /* many ids: the table grows and finds them all */
  pr__idset_reserve(s, 100000);
  for (uint64_t i = 0; i < 50000; i++) {
    pr__did_t x = {i * 0x9E3779B97F4A7C15ull, ~i};
    assert_int_equal(pr__idset_add(s, x, 1000), 0);
  }
  for (uint64_t i = 0; i < 50000; i++) {
    pr__did_t x = {i * 0x9E3779B97F4A7C15ull, ~i};
    assert_true(pr__idset_has(s, x, 10));
  }
  pr__idset_free(s);
}

/* The set against a plain model under random adds, lookups and expiries
 * with a small capacity: same answers, same evictions (least recently
 * used first), whatever the probe clusters and removals did to the table. */
static void test_idset_model(void **state) {
  enum { CAP = 40, IDS = 120, STEPS = 200000 };
  struct {
    int in;
    int64_t expires, used;
  } m[IDS] = {0};
  pr__idset_t *s = pr__idset_new(CAP);
  unsigned seed = 12345;
  size_t n = 0;
  int64_t now = 10, tick = 0;
  (void)state;
  assert_non_null(s);
  for (int step = 0; step < STEPS; step++) {
    int k = (int)(rand_r(&seed) % IDS), op = (int)(rand_r(&seed) % 8);
    /* ids close together in hi and lo: crowded probe clusters */
    pr__did_t id = {(uint64_t)(k % 7), (uint64_t)k};
    tick++;
    if (op == 0) {
      now++; /* some ids expire */
      continue;
    }
    if (m[k].in && m[k].expires <= now && op < 4) { /* found expired */
      assert_false(pr__idset_has(s, id, now));
      m[k].in = 0;
      n--;
    } else if (op < 4) {
      assert_int_equal(pr__idset_has(s, id, now), m[k].in);
      if (m[k].in)
        m[k].used = tick;
    } else {
      if (!m[k].in && n == CAP) { /* the least recently used goes */
        int lru = -1;
        for (int i = 0; i < IDS; i++)
          if (m[i].in && (lru < 0 || m[i].used < m[lru].used))
            lru = i;
        m[lru].in = 0;
        n--;
      }
      assert_int_equal(pr__idset_add(s, id, now + 1 + op), 0);
      if (!m[k].in)
        n++;
      m[k].in = 1;
      m[k].expires = now + 1 + op;
      m[k].used = tick;
    }
    assert_int_equal(pr__idset_size(s), n);
  }
  for (int k = 0; k < IDS; k++) { /* everything the model holds, found */
    pr__did_t id = {(uint64_t)(k % 7), (uint64_t)k};
    if (m[k].in && m[k].expires > now)
      assert_true(pr__idset_has(s, id, now));
  }
  pr__idset_free(s);
}

/* --- util.c: the logger --------------------------------------------- */

static char log_seen[8][128];
static int log_n;

static void log_into(prosody_log_level_t level, const char *subsystem,
                     const char *message, void *opaque) {
  (void)opaque;
  if (log_n < 8)
    snprintf(log_seen[log_n++], sizeof(log_seen[0]), "%d %s %s", (int)level,
             subsystem, message);
}

/* A warning said again word for word is folded into a count; lines below
 * the logger's level are dropped; info is never folded. */
static void test_logger(void **state) {
  pr__logger_t lg, *prev;
  (void)state;
  pr__logger_init(&lg, PR_LOG_INFO, log_into, NULL);
  prev = pr__log_adopt(&lg);
  log_n = 0;
  for (int i = 0; i < 4; i++)
    PR_WARN("engine", "broker down");
  PR_DEBUG("engine", "not shown");
  PR_INFO("engine", "same");
  PR_INFO("engine", "same");
  PR_ERROR("cql", "another");
  PR_ERROR("cql", "another");
  pr__log_adopt(prev);
  pr__logger_fini(&lg); /* says the last fold */
  assert_int_equal(log_n, 6);
  assert_string_equal(log_seen[0], "2 engine broker down");
  assert_string_equal(log_seen[1], "3 engine same");
  assert_string_equal(log_seen[2], "3 engine same");
  assert_string_equal(log_seen[3],
                      "2 engine the previous message repeated 3 more times");
  assert_string_equal(log_seen[4], "1 cql another");
  assert_string_equal(log_seen[5],
                      "1 cql the previous message repeated 1 more time");
}

/* --- thread checks (engine.c) ------------------------------------------ */

/* In builds with the checks (no NDEBUG: the sanitizer tiers), an engine
 * function called on a thread that does not own the engine aborts, naming
 * the function; on the owner it runs. */
static void test_thread_check(void **state) {
#ifndef NDEBUG
  pr__engine_t eng;
  pid_t pid;
  int status;
  (void)state;
  memset(&eng, 0, sizeof(eng));
  eng.owned = 1;
  eng.owner = pthread_self();
  pr__part_count(&eng); /* the owner: runs */
  fflush(NULL);
  pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) { /* the child's only thread is not the recorded owner */
    eng.owner = (pthread_t)0;
    if (!freopen("/dev/null", "w", stderr))
      _exit(1);
    pr__part_count(&eng);
    _exit(0);
  }
  assert_int_equal(waitpid(pid, &status, 0), pid);
  assert_true(WIFSIGNALED(status));
  assert_int_equal(WTERMSIG(status), SIGABRT);
#else
  (void)state;
  skip();
#endif
}

/* --- mailbox.c --------------------------------------------------------- */

/* Letters run their own functions, in posting order. */
static char mail_seen[8];
static int mail_n;
typedef struct {
  pr__mail_t mail;
  char name;
} named_mail_t;

static void note_mail(pr__mail_t *mail, void *owner) {
  assert_ptr_equal(owner, &mail_seen);
  mail_seen[mail_n++] = PR_CONTAINER_OF(mail, named_mail_t, mail)->name;
}

static atomic_int once_posted;
static void once_mail(pr__mail_t *mail, void *owner) {
  atomic_store(&once_posted, 0);
  note_mail(mail, owner);
}

static void test_mailbox(void **state) {
  pr__mailbox_t mb;
  uv_loop_t loop;
  uv_async_t wake;
  named_mail_t a = {{NULL, NULL}, 'a'}, b = {{NULL, NULL}, 'b'},
               o = {{NULL, NULL}, 'o'}, r = {{NULL, NULL}, 'r'};
  (void)state;
  uv_loop_init(&loop);
  uv_async_init(&loop, &wake, NULL);
  pr__mailbox_init(&mb, &mail_seen, &wake);
  pr__mailbox_post(&mb, &a.mail, note_mail);
  /* the coalesced letter is posted once however often its cause recurs */
  pr__mailbox_post_once(&mb, &o.mail, once_mail, &once_posted);
  pr__mailbox_post_once(&mb, &o.mail, once_mail, &once_posted);
  pr__mailbox_post(&mb, &b.mail, note_mail);
  pr__mailbox_deliver(&mb);
  assert_int_equal(mail_n, 3);
  assert_memory_equal(mail_seen, "aob", 3);
  /* after delivery it is posted anew */
  pr__mailbox_post_once(&mb, &o.mail, once_mail, &once_posted);
  pr__mailbox_deliver(&mb);
  assert_int_equal(mail_n, 4);
  /* closing delivers what waits; then refusable letters are refused and
   * the rest still taken */
  pr__mailbox_try_post(&mb, &r.mail, note_mail);
  pr__mailbox_close(&mb);
  assert_int_equal(mail_n, 5);
  assert_int_equal(mail_seen[4], 'r');
  assert_int_equal(pr__mailbox_try_post(&mb, &r.mail, note_mail), -1);
  assert_null(mb.head);
  pr__mailbox_post(&mb, &a.mail, note_mail);
  pr__mailbox_deliver(&mb);
  assert_int_equal(mail_n, 6);
  assert_int_equal(mail_seen[5], 'a');
  pr__mailbox_quiesce(&mb);
  pr__mailbox_fini(&mb);
  uv_close((uv_handle_t *)&wake, NULL);
  uv_run(&loop, UV_RUN_DEFAULT);
  uv_loop_close(&loop);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_backpressure_limits),
      cmocka_unit_test(test_key_queues),
      cmocka_unit_test(test_key_fifo_detach),
      cmocka_unit_test(test_tracker),
      cmocka_unit_test(test_tracker_gaps),
      cmocka_unit_test(test_outcome_pipeline),
      cmocka_unit_test(test_outcome_low_latency),
      cmocka_unit_test(test_outcome_best_effort),
      cmocka_unit_test(test_backoff),
      cmocka_unit_test(test_defer_delay),
      cmocka_unit_test(test_defer_gate),
      cmocka_unit_test(test_memdefer),
      cmocka_unit_test(test_defer_cache),
      cmocka_unit_test(test_decode),
      cmocka_unit_test(test_decode_lazy),
      cmocka_unit_test(test_json_valid),
      cmocka_unit_test(test_json_member),
      cmocka_unit_test(test_dedup_id),
      cmocka_unit_test(test_dedup_id_original),
      cmocka_unit_test(test_segment_uuid),
      cmocka_unit_test(test_idset),
      cmocka_unit_test(test_idset_model),
      cmocka_unit_test(test_mailbox),
      cmocka_unit_test(test_thread_check),
      cmocka_unit_test(test_logger),
  };
  static pr__logger_t quiet; /* the layers log their decisions */
  pr__logger_init(&quiet, PR_LOG_OFF, NULL, NULL);
  pr__log_adopt(&quiet);
  return cmocka_run_group_tests(tests, NULL, NULL);
}
