/*
 * metrics.h - the consumer's counters and histograms (private to
 * src/engine/; metrics.c renders them for /metrics).
 *
 * Threads: one writer per field (the engine thread, or the thread its
 * comment names), relaxed atomics; readers (the probe thread) load
 * relaxed; the gauges' snapshot is guarded by its lock.
 */
#ifndef PR_ENGINE_METRICS_H
#define PR_ENGINE_METRICS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* One writer (the engine thread): a relaxed load and store, no locked
 * read-modify-write; readers (the probe thread) load relaxed. */
#define PR_BUMP(v, by)                                                         \
  atomic_store_explicit(                                                       \
      &(v), atomic_load_explicit(&(v), memory_order_relaxed) + (by),           \
      memory_order_relaxed)

#define PR_HIST_BOUNDS 18
typedef struct pr__hist {
  atomic_uint_fast64_t count[PR_HIST_BOUNDS + 1]; /* per bucket, +Inf last */
  atomic_uint_fast64_t sum_ns;
} pr__hist_t;

typedef struct pr__metrics {
  /* Written by the engine thread only (PR_BUMP). */
  atomic_uint_fast64_t consumed;
  atomic_uint_fast64_t skipped_undecodable, skipped_filtered, skipped_duplicate;
  atomic_uint_fast64_t calls[2][3]; /* [message, timer][success, transient,
                                       permanent] */
  atomic_uint_fast64_t retries, rejected_monopoly, dead_lettered, deferred;
  atomic_uint_fast64_t timers_scheduled, timers_fired;
  pr__hist_t handler_time, sched_wait;
  /* The engine thread's snapshot, every poll_interval: guarded by lock. */
  pthread_mutex_t lock;
  int in_flight;
  size_t timers_pending;
  char *parts_text; /* committed offsets' lines; then, after its NUL, ... */
  char *lag_text;   /* ... the lags' lines (same allocation) */
} pr__metrics_t;

#endif /* PR_ENGINE_METRICS_H */
