/*
 * scheduler.h - the fair scheduler: which waiting event runs when a
 * handler slot (max_concurrency) frees up.
 *
 * Each (topic, partition, key) has a virtual time (VT): the handler time
 * its events used, decaying with a 120 s half-life. A waiting task's
 * priority is
 *
 *     VT_seconds - wait_weight * min(waited / max_wait, 1)^2
 *
 * and the lowest runs next (ties by arrival), so a key that used little
 * time, or has waited long, goes before a hot one. Tasks of the normal
 * class (first attempts) and of the failure class (retries) wait in
 * separate pools; when both have tasks, the normal pool is picked when
 * normal_time / (1 - failure_weight) <= failure_time / failure_weight,
 * the class times being the decayed handler time each class used. So
 * retries get about failure_weight of the handler time when both compete,
 * and all of it when nothing else waits.
 *
 * An urgent task (the `urgent` callback says so: the engine's are the
 * events that hold their partition's commit position, and those of a
 * partition whose offset window is half way to its limit) gets the full
 * wait boost
 * at once: holding such an event back would hold back every key of its
 * partition, which stops reading at its limit until its backlog halves.
 *
 * Each pool is a binary heap: picking costs O(log n). Priorities fall as
 * tasks wait (the wait boost grows, VTs decay), so the heaps are re-keyed
 * in O(n) when the pick comes PR_SCHED_REKEY_NS or more after the last
 * re-key; between re-keys an order can be stale by at most what a
 * priority moves in that time (under 0.04 at the defaults).
 *
 * Monopolization (pipeline mode) reads the same key states: each key's
 * handler time within the last `window_ns`, kept in PR_SCHED_BUSY_SLOTS
 * buckets of window/PR_SCHED_BUSY_SLOTS, so its share of the window is
 * known to within one bucket.
 *
 * Key states live in a table of at most cache_size entries, least
 * recently used evicted first (an evicted key starts again at VT 0); a
 * key whose events are queued is pinned and never evicted.
 *
 * Threads: the engine thread only (no locks). Times are passed in, in ns
 * of a monotonic clock, so tests drive them.
 */
#ifndef PR_ENGINE_SCHEDULER_H
#define PR_ENGINE_SCHEDULER_H

#include <stddef.h>
#include <stdint.h>

#define PR_SCHED_HALF_LIFE_S 120.0
#define PR_SCHED_REKEY_NS 10000000 /* 10 ms */
#define PR_SCHED_BUSY_SLOTS 32

enum { PR_SCHED_NORMAL, PR_SCHED_FAILURE };

/* One key's state (opaque outside scheduler.c). */
typedef struct pr__sched_key pr__sched_key_t;

/* A waiting task, embedded in what it schedules. */
typedef struct pr__sched_task {
  pr__sched_key_t *key;
  int64_t ready_ns; /* when it began to wait */
  uint64_t seq;     /* arrival order, for ties */
  double prio;      /* as of the last re-key (or its push) */
  int cls;          /* PR_SCHED_NORMAL or PR_SCHED_FAILURE */
} pr__sched_task_t;

typedef struct pr__sched_heap {
  pr__sched_task_t **v;
  size_t n, cap;
} pr__sched_heap_t;

typedef struct pr__sched {
  double failure_weight; /* in (0, 1) */
  double max_wait_s;     /* > 0 */
  double wait_weight;    /* >= 0 */
  size_t cache_size;     /* >= 1 */
  int fifo;              /* arrival order only (benchmarks' baseline) */
  int64_t window_ns;     /* monopolization window; 0: busy time not kept */
  /* Is this task urgent now (the full wait boost)? NULL: none is. */
  int (*urgent)(const pr__sched_task_t *t);

  pr__sched_heap_t pool[2];
  double cls_time[2]; /* decayed handler seconds per class ... */
  int64_t cls_at[2];  /* ... as of this time */
  int64_t rekey_ns;   /* last re-key */
  uint64_t seq;       /* next arrival number */
  pr__sched_key_t **buckets;
  size_t nbuckets, nkeys;
  pr__sched_key_t *lru_head, *lru_tail; /* unpinned keys, most recent first */
} pr__sched_t;

void pr__sched_init(pr__sched_t *s, double failure_weight, double max_wait_s,
                    double wait_weight, size_t cache_size);
void pr__sched_fini(pr__sched_t *s);

/* The key's state, created at VT 0 if absent, and pinned (not evicted)
 * until pr__sched_unpin(); NULL when out of memory. */
pr__sched_key_t *pr__sched_pin(pr__sched_t *s, const char *topic,
                               int32_t partition, const char *key);
void pr__sched_unpin(pr__sched_t *s, pr__sched_key_t *k);

/* Adds a handler's run time to its key's VT and to its class's time. */
void pr__sched_charge(pr__sched_t *s, pr__sched_key_t *k, int cls,
                      int64_t run_ns, int64_t now_ns);
/* The key's VT in seconds at `now_ns`. */
double pr__sched_vt(const pr__sched_key_t *k, int64_t now_ns);
/* A class's decayed handler seconds at `now_ns`. */
double pr__sched_class_time(const pr__sched_t *s, int cls, int64_t now_ns);
/* Records that the key's handler ran from start_ns to end_ns (kept only
 * with window_ns set). */
void pr__sched_busy(pr__sched_t *s, pr__sched_key_t *k, int64_t start_ns,
                    int64_t end_ns);
/* The key's handler time within the window ending at now_ns, as a share
 * of the window (0 without window_ns). */
double pr__sched_share(const pr__sched_t *s, const pr__sched_key_t *k,
                       int64_t now_ns);
/* 0 when the key's share cannot be above `share` (its handler time in
 * all the buckets kept, old ones too, is not): a test without the
 * window's sum, for the dispatch of every event; else 1. */
int pr__sched_may_exceed(const pr__sched_t *s, const pr__sched_key_t *k,
                         double share);
/* The key's name, for messages. */
const char *pr__sched_key_name(const pr__sched_key_t *k);

/* The priority formula (lower runs first). With `fifo` set (after init)
 * every priority is 0 and both classes share one order: arrival. */
double pr__sched_priority(const pr__sched_t *s, double vt_s, double waited_s);

/* Makes `t` (key and cls set by the caller) wait; 0, or -1 when out of
 * memory (then it does not wait). */
int pr__sched_push(pr__sched_t *s, pr__sched_task_t *t, int64_t now_ns);
/* The task to run next, removed; NULL when none waits. */
pr__sched_task_t *pr__sched_pop(pr__sched_t *s, int64_t now_ns);
/* Removes every waiting task for which drop(t, arg) is true (drop may
 * act on the task: it is out of the pools by the time drop returns 1). */
void pr__sched_remove_if(pr__sched_t *s,
                         int (*drop)(pr__sched_task_t *t, void *arg),
                         void *arg);
/* Re-keys at the next pick (what `urgent` says has changed). */
void pr__sched_rekey_soon(pr__sched_t *s);
/* Tasks waiting, both classes. */
size_t pr__sched_waiting(const pr__sched_t *s);
/* Keys tracked (pinned or not). */
size_t pr__sched_keys(const pr__sched_t *s);

#endif /* PR_ENGINE_SCHEDULER_H */
