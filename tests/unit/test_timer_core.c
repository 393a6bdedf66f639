/*
 * test_timers.c - timer building blocks: rounding and range checks, slab
 * arithmetic, the time queue (against a brute-force model), and the memory
 * store's operations.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "timers/timers.h"

static void test_rounding(void **state) {
  int64_t s = -1;
  char err[256];
  (void)state;
  assert_int_equal(pr__timer_round(0, &s, err, sizeof(err)), PROSODY_OK);
  assert_int_equal(s, 0);
  assert_int_equal(pr__timer_round(1499, &s, err, sizeof(err)), PROSODY_OK);
  assert_int_equal(s, 1);
  assert_int_equal(pr__timer_round(1500, &s, err, sizeof(err)), PROSODY_OK);
  assert_int_equal(s, 2); /* half up */
  assert_int_equal(pr__timer_round(499, &s, err, sizeof(err)), PROSODY_OK);
  assert_int_equal(s, 0);
  assert_int_equal(
      pr__timer_round(PR_TIMER_MAX_S * 1000 + 499, &s, err, sizeof(err)),
      PROSODY_OK);
  assert_int_equal(s, PR_TIMER_MAX_S);
}

/* Segment ids are the original Prosody's: a timer it scheduled is found
 * under the same id. The first vector is the id the original (0.6.1)
 * wrote to timer_segments for that name; the others are RFC 4122 version 5
 * UUIDs in the URL namespace, as any implementation computes them. */
static void test_segment_id(void **state) {
  static const struct {
    const char *name, *hex;
  } v[] = {
      {"g-orig1:wtt-topic1/0", "4f3342ef7c4755668de36d823cf77fa8"},
      {"group:topic/3", "d59dd03a2273578f94a7d83ddb477ea3"},
      {"", "1b4db7eb40575ddf91e036dec72071f5"},
  };
  (void)state;
  for (size_t i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
    uint8_t id[16];
    char hex[33];
    assert_int_equal(pr__timer_segment_id(v[i].name, id), 0);
    for (int b = 0; b < 16; b++)
      snprintf(hex + 2 * b, 3, "%02x", id[b]);
    assert_string_equal(hex, v[i].hex);
  }
}

static void test_range(void **state) {
  int64_t s;
  char err[256];
  (void)state;
  assert_int_equal(pr__timer_round(-1, &s, err, sizeof(err)),
                   PROSODY_ERR_INVALID_ARG);
  assert_non_null(strstr(err, "-1 ms"));
  assert_non_null(strstr(err, "1969-12-31T23:59:59Z"));
  assert_non_null(strstr(err, "before the epoch"));
  assert_int_equal(
      pr__timer_round(PR_TIMER_MAX_S * 1000 + 500, &s, err, sizeof(err)),
      PROSODY_ERR_INVALID_ARG);
  assert_non_null(strstr(err, "2106-02-07T06:28:15Z"));
  assert_int_equal(pr__timer_round(INT64_MAX, &s, err, sizeof(err)),
                   PROSODY_ERR_INVALID_ARG);
  assert_non_null(strstr(err, "9223372036854775807"));
}

static void test_slabs(void **state) {
  (void)state;
  assert_int_equal(pr__slab_of(0, 3600), 0);
  assert_int_equal(pr__slab_of(3599, 3600), 0);
  assert_int_equal(pr__slab_of(3600, 3600), 1);
  assert_int_equal(pr__slab_start(1, 3600), 3600);
  assert_int_equal(pr__slab_of(PR_TIMER_MAX_S, 1), PR_TIMER_MAX_S);
  for (int64_t t = 0; t < 20000; t += 7) {
    int64_t slab = pr__slab_of(t, 60);
    assert_true(pr__slab_start(slab, 60) <= t);
    assert_true(t < pr__slab_start(slab + 1, 60));
  }
}

static void test_tq_basics(void **state) {
  pr__tq_t *tq = pr__tq_new();
  char *key;
  int64_t t, *times;
  size_t n;
  (void)state;
  assert_non_null(tq);
  assert_int_equal(pr__tq_next_time(tq), -1);
  assert_int_equal(pr__tq_add(tq, "a", 30), 1);
  assert_int_equal(pr__tq_add(tq, "a", 10), 1);
  assert_int_equal(pr__tq_add(tq, "a", 10), 0); /* same second: one */
  assert_int_equal(pr__tq_add(tq, "b", 10), 1); /* another key: two */
  assert_int_equal(pr__tq_add(tq, "a", 20), 1);
  assert_int_equal(pr__tq_size(tq), 4);
  assert_true(pr__tq_contains(tq, "a", 20));
  assert_false(pr__tq_contains(tq, "a", 25));

  assert_int_equal(pr__tq_key_times(tq, "a", &times, &n), 0);
  assert_int_equal(n, 3);
  assert_int_equal(times[0], 10);
  assert_int_equal(times[1], 20);
  assert_int_equal(times[2], 30);
  free(times);

  assert_int_equal(pr__tq_pop_due(tq, 9, &key, &t), 0); /* none due */
  assert_int_equal(pr__tq_pop_due(tq, 10, &key, &t), 1);
  assert_string_equal(key, "a"); /* ties by key */
  assert_int_equal(t, 10);
  free(key);
  assert_int_equal(pr__tq_pop_due(tq, 10, &key, &t), 1);
  assert_string_equal(key, "b");
  free(key);
  assert_int_equal(pr__tq_pop_due(tq, 10, &key, &t), 0);

  assert_int_equal(pr__tq_remove(tq, "a", 30), 1);
  assert_int_equal(pr__tq_remove(tq, "a", 30), 0);
  assert_int_equal(pr__tq_next_time(tq), 20);
  assert_int_equal(pr__tq_add(tq, "a", 40), 1);
  assert_int_equal(pr__tq_add(tq, "a", 50), 1);
  assert_int_equal(pr__tq_remove_key(tq, "a", 40), 2); /* keeps 40 */
  assert_int_equal(pr__tq_key_times(tq, "a", &times, &n), 0);
  assert_int_equal(n, 1);
  assert_int_equal(times[0], 40);
  free(times);
  assert_int_equal(pr__tq_remove_key(tq, "a", -1), 1);
  assert_int_equal(pr__tq_size(tq), 0);
  assert_int_equal(pr__tq_key_times(tq, "a", &times, &n), 0);
  assert_null(times);
  assert_int_equal(n, 0);
  pr__tq_free(tq);
}

/* The queue against a brute-force model under random operations. */
#define MK 16
#define MT 64
/* A queued timer keeps its scheduling context: the newest given, none
 * when added without one, and it comes out with the timer. */
static void test_tq_trace(void **state) {
  pr__tq_t *tq = pr__tq_new();
  pr_span_ctx_t c1, c2, got;
  char *key;
  int64_t t;
  char tp[PR_TRACEPARENT_LEN + 1];
  (void)state;
  assert_int_equal(
      pr__span_ctx_parse(
          "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", SIZE_MAX,
          &c1),
      0);
  assert_int_equal(
      pr__span_ctx_parse(
          "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00", SIZE_MAX,
          &c2),
      0);
  assert_int_equal(pr__tq_add_ctx(tq, "a", 10, &c1), 1);
  assert_int_equal(pr__tq_add_ctx(tq, "a", 10, &c2), 0); /* replaced */
  assert_int_equal(pr__tq_add(tq, "a", 10), 0);          /* kept */
  assert_int_equal(pr__tq_add(tq, "b", 11), 1);
  assert_int_equal(pr__tq_pop_due_ctx(tq, 20, &key, &t, &got), 1);
  assert_string_equal(key, "a");
  assert_true(got.valid);
  pr__span_ctx_format(&got, tp);
  assert_string_equal(
      tp, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00");
  free(key);
  assert_int_equal(pr__tq_pop_due_ctx(tq, 20, &key, &t, &got), 1);
  assert_string_equal(key, "b");
  assert_false(got.valid);
  free(key);
  /* Removed with its context (ASan would see a leak otherwise). */
  assert_int_equal(pr__tq_add_ctx(tq, "c", 12, &c1), 1);
  assert_int_equal(pr__tq_remove(tq, "c", 12), 1);
  assert_int_equal(pr__tq_add_ctx(tq, "d", 13, &c1), 1);
  pr__tq_free(tq);
}

static void test_tq_model(void **state) {
  pr__tq_t *tq = pr__tq_new();
  static unsigned char model[MK][MT];
  unsigned seed = 12345;
  size_t count = 0;
  (void)state;
  memset(model, 0, sizeof(model));
  for (int step = 0; step < 200000; step++) {
    int op = (int)(rand_r(&seed) % 10), k = (int)(rand_r(&seed) % MK);
    int64_t t = rand_r(&seed) % MT;
    char key[8];
    snprintf(key, sizeof(key), "k%d", k);
    if (op < 5) {
      int added = pr__tq_add(tq, key, t);
      assert_int_equal(added, !model[k][t]);
      count += (size_t)added;
      model[k][t] = 1;
    } else if (op < 7) {
      int removed = pr__tq_remove(tq, key, t);
      assert_int_equal(removed, model[k][t]);
      count -= (size_t)removed;
      model[k][t] = 0;
    } else if (op == 7) {
      size_t want = 0;
      for (int i = 0; i < MT; i++)
        if (model[k][i] && i != t) {
          want++;
          model[k][i] = 0;
        }
      assert_int_equal(pr__tq_remove_key(tq, key, t), want);
      count -= want;
    } else {
      /* Pop everything due at t: in (time, key) order, matching the model. */
      char *got;
      int64_t gt, last_t = -1;
      char last_key[8] = "";
      while (pr__tq_pop_due(tq, t, &got, &gt) == 1) {
        int gk = atoi(got + 1);
        assert_true(gt <= t);
        assert_true(gt > last_t || (gt == last_t && strcmp(got, last_key) > 0));
        assert_true(model[gk][gt]);
        model[gk][gt] = 0;
        count--;
        last_t = gt;
        snprintf(last_key, sizeof(last_key), "%s", got);
        free(got);
      }
      for (int i = 0; i < MK; i++)
        for (int j = 0; j <= t; j++)
          assert_false(model[i][j]);
    }
    assert_int_equal(pr__tq_size(tq), count);
  }
  pr__tq_free(tq);
}

/* --- memory store --------------------------------------------------------- */

typedef struct result {
  int calls;
  prosody_err_t err;
  int64_t v[64];
  size_t n;
  char keys[64][16];
} result_t;

static void done_cb(void *arg, prosody_err_t err, const char *errstr) {
  result_t *r = arg;
  (void)errstr;
  r->calls++;
  r->err = err;
}

static void times_cb(void *arg, prosody_err_t err, const char *errstr,
                     const int64_t *v, size_t n) {
  result_t *r = arg;
  (void)errstr;
  r->calls++;
  r->err = err;
  r->n = n;
  if (n)
    memcpy(r->v, v, n * sizeof(int64_t));
}

static void recs_cb(void *arg, prosody_err_t err, const char *errstr,
                    const pr__trec_t *recs, size_t n) {
  result_t *r = arg;
  (void)errstr;
  r->calls++;
  r->err = err;
  r->n = n;
  for (size_t i = 0; i < n; i++) {
    r->v[i] = recs[i].time_s;
    snprintf(r->keys[i], sizeof(r->keys[i]), "%s", recs[i].key);
  }
}

static void test_memstore(void **state) {
  pr__tstore_t *s = pr__memstore_new();
  pr__tseg_t seg = {"topic", 3}, other = {"topic", 4};
  result_t r;
  (void)state;
  assert_non_null(s);
  assert_true(s->sync);
#define PUT(sg, k, t)                                                          \
  do {                                                                         \
    memset(&r, 0, sizeof(r));                                                  \
    s->ops->put(s, &(sg), k, t, PR_TIMER_APPLICATION, NULL, done_cb, &r);      \
    assert_int_equal(r.calls, 1);                                              \
    assert_int_equal(r.err, PROSODY_OK);                                       \
  } while (0)
#define TIMES(sg, k)                                                           \
  do {                                                                         \
    memset(&r, 0, sizeof(r));                                                  \
    s->ops->key_times(s, &(sg), k, PR_TIMER_APPLICATION, times_cb, &r);        \
    assert_int_equal(r.calls, 1);                                              \
  } while (0)
  PUT(seg, "a", 7300);
  PUT(seg, "a", 100);
  PUT(seg, "a", 100);
  PUT(seg, "b", 3700);
  PUT(other, "a", 5);
  TIMES(seg, "a");
  assert_int_equal(r.n, 2);
  assert_int_equal(r.v[0], 100);
  assert_int_equal(r.v[1], 7300);

  /* Other types are separate. */
  memset(&r, 0, sizeof(r));
  s->ops->key_times(s, &seg, "a", PR_TIMER_DEFER_MESSAGE, times_cb, &r);
  assert_int_equal(r.n, 0);

  /* Slabs (1 h): 0, 1, 2. */
  memset(&r, 0, sizeof(r));
  s->ops->slabs(s, &seg, 3600, times_cb, &r);
  assert_int_equal(r.n, 3);
  assert_int_equal(r.v[0], 0);
  assert_int_equal(r.v[1], 1);
  assert_int_equal(r.v[2], 2);
  memset(&r, 0, sizeof(r));
  s->ops->load_slab(s, &seg, 3600, 1, recs_cb, &r);
  assert_int_equal(r.n, 1);
  assert_string_equal(r.keys[0], "b");
  assert_int_equal(r.v[0], 3700);

  /* Delete, delete-all-but, release. */
  memset(&r, 0, sizeof(r));
  s->ops->del(s, &seg, "a", 100, PR_TIMER_APPLICATION, done_cb, &r);
  assert_int_equal(r.calls, 1);
  TIMES(seg, "a");
  assert_int_equal(r.n, 1);
  PUT(seg, "a", 200);
  PUT(seg, "a", 300);
  memset(&r, 0, sizeof(r));
  s->ops->del_key(s, &seg, "a", PR_TIMER_APPLICATION, 300, done_cb, &r);
  assert_int_equal(r.calls, 1);
  TIMES(seg, "a");
  assert_int_equal(r.n, 1);
  assert_int_equal(r.v[0], 300);
  s->ops->release(s, &seg);
  TIMES(seg, "a");
  assert_int_equal(r.n, 0); /* forgotten on release */
  TIMES(other, "a");
  assert_int_equal(r.n, 1); /* other segments kept */
  s->ops->destroy(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_rounding), cmocka_unit_test(test_range),
      cmocka_unit_test(test_slabs),    cmocka_unit_test(test_tq_basics),
      cmocka_unit_test(test_tq_model), cmocka_unit_test(test_memstore),
      cmocka_unit_test(test_tq_trace), cmocka_unit_test(test_segment_id),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
