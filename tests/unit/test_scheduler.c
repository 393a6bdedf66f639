/*
 * test_scheduler.c - the fair scheduler (src/engine/scheduler.c) against
 * priorities computed by hand: the VT's 120 s half-life, the quadratic
 * wait boost, the split between the normal and failure classes, ties by
 * arrival, the key cache's LRU eviction (pinned keys never go), removal,
 * and the heap's order over many tasks.
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/scheduler.h"

#define S(x) ((int64_t)((x)*1e9)) /* seconds -> ns */
/* The engine's clock is monotonic from an arbitrary origin: start at 1000 s
 * so no test relies on 0. */
#define T0 S(1000)

static pr__sched_t *sched(double fw, double max_wait_s, double ww,
                          size_t cache) {
  pr__sched_t *s = malloc(sizeof(*s));
  assert_non_null(s);
  pr__sched_init(s, fw, max_wait_s, ww, cache);
  return s;
}

static void done(pr__sched_t *s) {
  pr__sched_fini(s);
  free(s);
}

static pr__sched_task_t task(pr__sched_key_t *k, int cls) {
  pr__sched_task_t t;
  memset(&t, 0, sizeof(t));
  t.key = k;
  t.cls = cls;
  return t;
}

/* VT: the sum of run times, halving every 120 s. */
static void test_vt_decay(void **state) {
  pr__sched_t *s = sched(0.3, 120, 200, 16);
  pr__sched_key_t *k = pr__sched_pin(s, "t", 0, "a");
  (void)state;
  assert_non_null(k);
  assert_float_equal(pr__sched_vt(k, T0), 0.0, 1e-12);
  pr__sched_charge(s, k, PR_SCHED_NORMAL, S(10), T0);
  assert_float_equal(pr__sched_vt(k, T0), 10.0, 1e-9);
  assert_float_equal(pr__sched_vt(k, T0 + S(120)), 5.0, 1e-9);
  assert_float_equal(pr__sched_vt(k, T0 + S(240)), 2.5, 1e-9);
  assert_float_equal(pr__sched_vt(k, T0 + S(60)), 10.0 / 1.4142135623730951,
                     1e-9);
  /* a later charge adds to the decayed value: 5 + 2 at 120 s */
  pr__sched_charge(s, k, PR_SCHED_NORMAL, S(2), T0 + S(120));
  assert_float_equal(pr__sched_vt(k, T0 + S(120)), 7.0, 1e-9);
  assert_float_equal(pr__sched_vt(k, T0 + S(240)), 3.5, 1e-9);
  /* the class's time decays the same way */
  assert_float_equal(pr__sched_class_time(s, PR_SCHED_NORMAL, T0 + S(240)), 3.5,
                     1e-9);
  assert_float_equal(pr__sched_class_time(s, PR_SCHED_FAILURE, T0), 0.0, 1e-12);
  pr__sched_unpin(s, k);
  done(s);
}

/* priority = VT - wait_weight * min(waited / max_wait, 1)^2 */
static void test_priority_formula(void **state) {
  pr__sched_t *s = sched(0.3, 120, 200, 16);
  (void)state;
  assert_float_equal(pr__sched_priority(s, 5, 0), 5.0, 1e-12);
  assert_float_equal(pr__sched_priority(s, 5, 60), 5 - 200 * 0.25, 1e-9);
  assert_float_equal(pr__sched_priority(s, 5, 120), 5 - 200.0, 1e-9);
  assert_float_equal(pr__sched_priority(s, 5, 1000), 5 - 200.0, 1e-9);
  assert_float_equal(pr__sched_priority(s, 0, 30), -200 * 0.0625, 1e-9);
  done(s);
}

/* The lower priority runs first: a key that used little time goes before
 * a hot one, unless the hot one has waited long enough. */
static void test_order_vt_and_wait(void **state) {
  pr__sched_t *s = sched(0.3, 120, 200, 16);
  pr__sched_key_t *hot = pr__sched_pin(s, "t", 0, "hot");
  pr__sched_key_t *cold = pr__sched_pin(s, "t", 0, "cold");
  pr__sched_task_t a = task(hot, PR_SCHED_NORMAL);
  pr__sched_task_t b = task(cold, PR_SCHED_NORMAL);
  (void)state;
  pr__sched_charge(s, hot, PR_SCHED_NORMAL, S(100), T0);

  /* hot waits from 0, cold from 30 s; at 30 s:
   *   hot:  100 * 2^(-30/120) - 200 * (30/120)^2 = 84.09 - 12.5 = 71.59
   *   cold: 0 - 0 = 0                                 -> cold first */
  assert_int_equal(pr__sched_push(s, &a, T0), 0);
  assert_int_equal(pr__sched_push(s, &b, T0 + S(30)), 0);
  assert_int_equal(pr__sched_waiting(s), 2);
  assert_ptr_equal(pr__sched_pop(s, T0 + S(30)), &b);
  assert_float_equal(a.prio, 100 * 0.8408964152537145 - 12.5, 1e-6);
  assert_ptr_equal(pr__sched_pop(s, T0 + S(30)), &a);
  assert_null(pr__sched_pop(s, T0 + S(30)));

  /* hot waits from 0, cold from 100 s; at 100 s:
   *   hot:  100 * 2^(-100/120) - 200 * (100/120)^2 = 56.12 - 138.89 < 0
   *   cold: 0                                         -> hot first */
  assert_int_equal(pr__sched_push(s, &a, T0), 0);
  assert_int_equal(pr__sched_push(s, &b, T0 + S(100)), 0);
  assert_ptr_equal(pr__sched_pop(s, T0 + S(100)), &a);
  assert_float_equal(
      a.prio, 100 * 0.5612310241546865 - 200 * (100.0 / 120) * (100.0 / 120),
      1e-6);
  assert_ptr_equal(pr__sched_pop(s, T0 + S(100)), &b);
  pr__sched_unpin(s, hot);
  pr__sched_unpin(s, cold);
  done(s);
}

/* Equal priorities run in arrival order. */
static void test_ties_by_arrival(void **state) {
  pr__sched_t *s = sched(0.3, 120, 200, 16);
  pr__sched_key_t *k[5];
  pr__sched_task_t t[5];
  char name[8];
  (void)state;
  for (int i = 0; i < 5; i++) {
    snprintf(name, sizeof(name), "k%d", i);
    k[i] = pr__sched_pin(s, "t", 0, name);
    t[i] = task(k[i], PR_SCHED_NORMAL);
    assert_int_equal(pr__sched_push(s, &t[i], T0), 0);
  }
  for (int i = 0; i < 5; i++)
    assert_ptr_equal(pr__sched_pop(s, T0), &t[i]);
  for (int i = 0; i < 5; i++)
    pr__sched_unpin(s, k[i]);
  done(s);
}

/* When both classes wait, normal is picked while
 * normal_time / (1 - w) <= failure_time / w (w = 0.3). */
static void test_class_split(void **state) {
  pr__sched_t *s = sched(0.3, 120, 200, 16);
  pr__sched_key_t *kn = pr__sched_pin(s, "t", 0, "n");
  pr__sched_key_t *kf = pr__sched_pin(s, "t", 1, "f");
  pr__sched_task_t n = task(kn, PR_SCHED_NORMAL);
  pr__sched_task_t f = task(kf, PR_SCHED_FAILURE);
  (void)state;
  /* normal 7 s, failure 3 s: 7/0.7 = 10 <= 3/0.3 = 10 -> normal, even
   * though the failure task's key has the lower VT (it is 0; n's is 7) */
  pr__sched_charge(s, kn, PR_SCHED_NORMAL, S(7), T0);
  pr__sched_charge(s, pr__sched_pin(s, "t", 2, "other"), PR_SCHED_FAILURE, S(3),
                   T0);
  assert_int_equal(pr__sched_push(s, &f, T0), 0);
  assert_int_equal(pr__sched_push(s, &n, T0), 0);
  assert_ptr_equal(pr__sched_pop(s, T0), &n);
  assert_ptr_equal(pr__sched_pop(s, T0), &f);
  /* one more second of normal time: 8/0.7 = 11.4 > 10 -> failure first */
  pr__sched_charge(s, kn, PR_SCHED_NORMAL, S(1), T0);
  assert_int_equal(pr__sched_push(s, &n, T0), 0);
  assert_int_equal(pr__sched_push(s, &f, T0), 0);
  assert_ptr_equal(pr__sched_pop(s, T0), &f);
  assert_ptr_equal(pr__sched_pop(s, T0), &n);
  /* only one class waiting: it runs whatever the split */
  assert_int_equal(pr__sched_push(s, &n, T0), 0);
  assert_ptr_equal(pr__sched_pop(s, T0), &n);
  /* both class times decay alike, so the split is stable over time:
   * 8/0.7 vs 3/0.3, a minute later, still failure first */
  assert_int_equal(pr__sched_push(s, &n, T0 + S(60)), 0);
  assert_int_equal(pr__sched_push(s, &f, T0 + S(60)), 0);
  assert_ptr_equal(pr__sched_pop(s, T0 + S(60)), &f);
  assert_ptr_equal(pr__sched_pop(s, T0 + S(60)), &n);
  done(s);
}

/* At most cache_size keys are kept; the least recently used unpinned one
 * goes first and starts again at VT 0; a pinned key is never evicted. */
static void test_lru_eviction(void **state) {
  pr__sched_t *s = sched(0.3, 120, 200, 2);
  pr__sched_key_t *a, *b, *c, *p;
  (void)state;
  a = pr__sched_pin(s, "t", 0, "a");
  pr__sched_charge(s, a, PR_SCHED_NORMAL, S(5), T0);
  pr__sched_unpin(s, a);
  b = pr__sched_pin(s, "t", 0, "b");
  pr__sched_charge(s, b, PR_SCHED_NORMAL, S(6), T0);
  pr__sched_unpin(s, b);
  assert_int_equal(pr__sched_keys(s), 2);
  /* a used again: b is now the least recently used */
  a = pr__sched_pin(s, "t", 0, "a");
  assert_float_equal(pr__sched_vt(a, T0), 5.0, 1e-9);
  pr__sched_unpin(s, a);
  c = pr__sched_pin(s, "t", 0, "c"); /* evicts b */
  assert_int_equal(pr__sched_keys(s), 2);
  pr__sched_unpin(s, c);
  b = pr__sched_pin(s, "t", 0, "b"); /* back, from VT 0; evicts a */
  assert_float_equal(pr__sched_vt(b, T0), 0.0, 1e-12);
  pr__sched_unpin(s, b);
  a = pr__sched_pin(s, "t", 0, "a");
  assert_float_equal(pr__sched_vt(a, T0), 0.0, 1e-12);
  pr__sched_unpin(s, a);
  /* the same key on another partition or topic is another key */
  p = pr__sched_pin(s, "t", 1, "a");
  assert_ptr_not_equal(p, a);
  pr__sched_charge(s, p, PR_SCHED_NORMAL, S(9), T0);
  /* pinned keys stay even beyond the capacity */
  {
    pr__sched_key_t *q = pr__sched_pin(s, "u", 1, "a");
    pr__sched_key_t *r = pr__sched_pin(s, "u", 2, "a");
    assert_true(pr__sched_keys(s) >= 3);
    assert_float_equal(pr__sched_vt(p, T0), 9.0, 1e-9);
    pr__sched_unpin(s, q);
    pr__sched_unpin(s, r);
  }
  assert_int_equal(pr__sched_keys(s), 2);
  assert_ptr_equal(pr__sched_pin(s, "t", 1, "a"), p); /* still there */
  assert_float_equal(pr__sched_vt(p, T0), 9.0, 1e-9);
  pr__sched_unpin(s, p); /* pinned twice */
  pr__sched_unpin(s, p);
  done(s);
}

static int of_key(pr__sched_task_t *t, void *arg) { return t->key == arg; }

/* Removal (a revoked partition's waiting events) keeps the others' order. */
static void test_remove_if(void **state) {
  pr__sched_t *s = sched(0.3, 120, 200, 16);
  pr__sched_key_t *a = pr__sched_pin(s, "t", 0, "a");
  pr__sched_key_t *b = pr__sched_pin(s, "t", 1, "b");
  pr__sched_task_t t[6];
  (void)state;
  for (int i = 0; i < 6; i++) {
    t[i] = task(i % 2 ? b : a, i < 3 ? PR_SCHED_NORMAL : PR_SCHED_FAILURE);
    assert_int_equal(pr__sched_push(s, &t[i], T0 + i), 0);
  }
  pr__sched_remove_if(s, of_key, a);
  assert_int_equal(pr__sched_waiting(s), 3);
  assert_ptr_equal(pr__sched_pop(s, T0 + 10), &t[1]); /* normal first */
  assert_ptr_equal(pr__sched_pop(s, T0 + 10), &t[3]);
  assert_ptr_equal(pr__sched_pop(s, T0 + 10), &t[5]);
  assert_null(pr__sched_pop(s, T0 + 10));
  pr__sched_unpin(s, a);
  pr__sched_unpin(s, b);
  done(s);
}

/* Many tasks with random VTs pop in priority order, ties by arrival. */
static void test_heap_order(void **state) {
  enum { N = 5000, KEYS = 300 };
  pr__sched_t *s = sched(0.3, 120, 200, KEYS);
  pr__sched_key_t *k[KEYS];
  pr__sched_task_t *t = calloc(N, sizeof(*t)), *prev = NULL;
  unsigned seed = 7;
  char name[16];
  (void)state;
  assert_non_null(t);
  for (int i = 0; i < KEYS; i++) {
    snprintf(name, sizeof(name), "k%d", i);
    k[i] = pr__sched_pin(s, "t", 0, name);
    pr__sched_charge(s, k[i], PR_SCHED_NORMAL, rand_r(&seed) % S(50), T0);
  }
  for (int i = 0; i < N; i++) {
    t[i] = task(k[rand_r(&seed) % KEYS], PR_SCHED_NORMAL);
    assert_int_equal(pr__sched_push(s, &t[i], T0 + S(1)), 0);
  }
  for (int i = 0; i < N; i++) {
    pr__sched_task_t *x = pr__sched_pop(s, T0 + S(1));
    assert_non_null(x);
    if (prev)
      assert_true(prev->prio < x->prio ||
                  (prev->prio == x->prio && prev->seq < x->seq));
    prev = x;
  }
  assert_null(pr__sched_pop(s, T0 + S(1)));
  for (int i = 0; i < KEYS; i++)
    pr__sched_unpin(s, k[i]);
  free(t);
  done(s);
}

/* The benchmarks' baseline: arrival order, whatever the VTs and classes. */
static void test_fifo(void **state) {
  pr__sched_t *s = sched(0.3, 120, 200, 16);
  pr__sched_key_t *hot = pr__sched_pin(s, "t", 0, "hot");
  pr__sched_key_t *cold = pr__sched_pin(s, "t", 0, "cold");
  pr__sched_task_t a = task(hot, PR_SCHED_FAILURE);
  pr__sched_task_t b = task(cold, PR_SCHED_NORMAL);
  pr__sched_task_t c = task(hot, PR_SCHED_NORMAL);
  (void)state;
  s->fifo = 1;
  pr__sched_charge(s, hot, PR_SCHED_NORMAL, S(100), T0);
  assert_int_equal(pr__sched_push(s, &a, T0), 0);
  assert_int_equal(pr__sched_push(s, &b, T0 + 1), 0);
  assert_int_equal(pr__sched_push(s, &c, T0 + 2), 0);
  assert_ptr_equal(pr__sched_pop(s, T0 + S(1)), &a);
  assert_ptr_equal(pr__sched_pop(s, T0 + S(1)), &b);
  assert_ptr_equal(pr__sched_pop(s, T0 + S(1)), &c);
  pr__sched_unpin(s, hot);
  pr__sched_unpin(s, cold);
  done(s);
}

/* Monopolization's share: handler time within the window, in buckets of
 * window/32 (here 32 s / 32 = 1 s). */
static void test_busy_share(void **state) {
  pr__sched_t *s = sched(0.3, 120, 200, 16);
  pr__sched_key_t *k = pr__sched_pin(s, "t", 0, "k");
  pr__sched_key_t *idle = pr__sched_pin(s, "t", 0, "idle");
  (void)state;
  assert_float_equal(pr__sched_share(s, k, T0), 0.0, 1e-12); /* off */
  s->window_ns = S(32);
  pr__sched_busy(s, k, T0, T0 + S(8)); /* 8 s of 32 */
  assert_float_equal(pr__sched_share(s, k, T0 + S(8)), 0.25, 1e-9);
  /* the bound: every bucket kept, old ones too */
  assert_true(pr__sched_may_exceed(s, k, 0.24));
  assert_false(pr__sched_may_exceed(s, k, 0.25));
  assert_false(pr__sched_may_exceed(s, idle, 0.0));
  assert_float_equal(pr__sched_share(s, idle, T0 + S(8)), 0.0, 1e-12);
  pr__sched_busy(s, k, T0 + S(10), T0 + S(10.5)); /* within one bucket */
  assert_float_equal(pr__sched_share(s, k, T0 + S(11)), 8.5 / 32, 1e-9);
  /* the window is the current bucket and the 31 before it: at 36 s the
   * buckets from 5 s on (3 s of the first run, and the half second) */
  assert_float_equal(pr__sched_share(s, k, T0 + S(36)), 3.5 / 32, 1e-9);
  assert_float_equal(pr__sched_share(s, k, T0 + S(40)), 0.5 / 32, 1e-9);
  assert_float_equal(pr__sched_share(s, k, T0 + S(43)), 0.0, 1e-12);
  /* a run longer than the window counts as the whole window, once (as
   * seen at a bucket's start: all but the bucket just begun) */
  pr__sched_busy(s, k, T0 + S(50), T0 + S(150));
  assert_float_equal(pr__sched_share(s, k, T0 + S(150)), 31.0 / 32, 1e-9);
  assert_float_equal(pr__sched_share(s, k, T0 + S(149.5)), 1.0, 1e-9);
  /* a slot reused by a later bucket starts from zero */
  pr__sched_busy(s, k, T0 + S(200), T0 + S(201));
  assert_float_equal(pr__sched_share(s, k, T0 + S(201)), 1.0 / 32, 1e-9);
  /* ... and leaves the bound: 31 s in the slots kept from the long run,
   * and this second */
  assert_true(pr__sched_may_exceed(s, k, 31.5 / 32));
  assert_false(pr__sched_may_exceed(s, k, 32.0 / 32));
  pr__sched_unpin(s, k);
  pr__sched_unpin(s, idle);
  done(s);
}

static const pr__sched_task_t *urgent_task;
static int urgent_now;

static int is_urgent(const pr__sched_task_t *t) {
  return urgent_now && t == urgent_task;
}

/* An urgent task (its partition is backing up) gets the full wait boost:
 * the hot key's event goes before fresh keys' while it is urgent. */
static void test_urgent(void **state) {
  pr__sched_t *s = sched(0.3, 120, 200, 16);
  pr__sched_key_t *hot = pr__sched_pin(s, "t", 0, "hot");
  pr__sched_key_t *cold = pr__sched_pin(s, "t", 1, "cold");
  pr__sched_task_t a = task(hot, PR_SCHED_NORMAL);
  pr__sched_task_t b = task(cold, PR_SCHED_NORMAL);
  (void)state;
  urgent_task = &a;
  s->urgent = is_urgent;
  pr__sched_charge(s, hot, PR_SCHED_NORMAL, S(30), T0);
  assert_int_equal(pr__sched_push(s, &a, T0), 0);
  assert_int_equal(pr__sched_push(s, &b, T0), 0);
  /* not stopped: VT 30 against 0, the cold key first */
  assert_ptr_equal(pr__sched_pop(s, T0 + S(1)), &b);
  assert_int_equal(pr__sched_push(s, &b, T0 + S(1)), 0);
  /* its partition stops: 30 - 200 against 0 at the next pick */
  urgent_now = 1;
  pr__sched_rekey_soon(s);
  assert_ptr_equal(pr__sched_pop(s, T0 + S(1)), &a);
  assert_float_equal(a.prio, 30 * pow(2, -1.0 / 120) - 200, 1e-6);
  assert_ptr_equal(pr__sched_pop(s, T0 + S(1)), &b);
  pr__sched_unpin(s, hot);
  pr__sched_unpin(s, cold);
  done(s);
}

/* Below a second the decay is a short series, not exp2: the same value to
 * within a few units in the last place, on both sides of the switch. */
static void test_vt_decay_short(void **state) {
  static const int64_t gaps[] = {1,          1000,      999999,    2500000,
                                 10000000,   123456789, 999999999, 1000000000,
                                 1000000001, S(30)};
  pr__sched_t *s = sched(0.3, 120, 200, 16);
  pr__sched_key_t *k = pr__sched_pin(s, "t", 0, "a");
  (void)state;
  assert_non_null(k);
  pr__sched_charge(s, k, PR_SCHED_NORMAL, S(1000), T0);
  for (size_t i = 0; i < sizeof(gaps) / sizeof(gaps[0]); i++) {
    double want = 1000 * exp2(-((double)gaps[i] / 1e9) / 120);
    assert_float_equal(pr__sched_vt(k, T0 + gaps[i]), want, want * 1e-15);
  }
  pr__sched_unpin(s, k);
  done(s);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_vt_decay),
      cmocka_unit_test(test_vt_decay_short),
      cmocka_unit_test(test_priority_formula),
      cmocka_unit_test(test_order_vt_and_wait),
      cmocka_unit_test(test_ties_by_arrival),
      cmocka_unit_test(test_class_split),
      cmocka_unit_test(test_lru_eviction),
      cmocka_unit_test(test_remove_if),
      cmocka_unit_test(test_heap_order),
      cmocka_unit_test(test_fifo),
      cmocka_unit_test(test_busy_share),
      cmocka_unit_test(test_urgent),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
