/*
 * timers.h - timer building blocks (private): time rounding and range
 * checks, slab arithmetic and the in-memory time queue. The timer store's
 * interface is ../stores/tstore.h, its implementations in src/stores/.
 *
 * A timer is (key, time in whole seconds since the epoch, type). Times are
 * kept as seconds in [0, PR_TIMER_MAX_S]: the range a 32-bit unsigned
 * second count holds, which is what the stores persist.
 */
#ifndef PR_TIMERS_H
#define PR_TIMERS_H

#include <stddef.h>
#include <stdint.h>

#include "../otel/otel.h"
#include "prosody.h"

#define PR_TIMER_MAX_S INT64_C(4294967295) /* 2106-02-07T06:28:15Z */

#include "../stores/tstore.h" /* the store interface, and timer types */

/* Milliseconds since the epoch -> whole seconds, rounded to the nearest
 * (half up). PROSODY_ERR_INVALID_ARG, with a message naming the time, for a
 * time before the epoch or past PR_TIMER_MAX_S. */
prosody_err_t pr__timer_round(int64_t time_ms, int64_t *out_s, char *errstr,
                              size_t errstr_size);

/* Slab arithmetic: slab `id` holds the seconds [id * slab_s, (id + 1) *
 * slab_s). `slab_s` >= 1. */
static inline int64_t pr__slab_of(int64_t time_s, int64_t slab_s) {
  return time_s / slab_s; /* times are never negative */
}
static inline int64_t pr__slab_start(int64_t slab, int64_t slab_s) {
  return slab * slab_s;
}

/* ------------------------------------------------------------------------ */
/* Time queue: pending timers ordered by time, indexed by key.              */
/* One owner (the engine thread, or the memory store's owner); no locks.   */
/* ------------------------------------------------------------------------ */

typedef struct pr__tq pr__tq_t;

pr__tq_t *pr__tq_new(void);
void pr__tq_free(pr__tq_t *tq);
/* Number of timers. */
size_t pr__tq_size(const pr__tq_t *tq);
/* Adds (key, time); 1 if added, 0 if it was there, -1 out of memory. */
int pr__tq_add(pr__tq_t *tq, const char *key, int64_t time_s);
/* The same, keeping the trace context of the span that scheduled it (a
 * valid `ctx` replaces the one kept; NULL or invalid: none added). */
int pr__tq_add_ctx(pr__tq_t *tq, const char *key, int64_t time_s,
                   const pr_span_ctx_t *ctx);
/* Removes (key, time); 1 if removed, 0 if absent. */
int pr__tq_remove(pr__tq_t *tq, const char *key, int64_t time_s);
/* Removes every timer of `key` except the one at `keep_s` (-1: none);
 * returns how many were removed. */
size_t pr__tq_remove_key(pr__tq_t *tq, const char *key, int64_t keep_s);
/* 1 if (key, time) is queued. */
int pr__tq_contains(const pr__tq_t *tq, const char *key, int64_t time_s);
/* The earliest time, or -1 when empty. */
int64_t pr__tq_next_time(const pr__tq_t *tq);
/* Removes the earliest timer if its time is <= `now_s`: copies its key into
 * `*key` (malloc'd; the caller frees) and its time into `*time_s`. 1 if one
 * was taken, 0 if none is due, -1 out of memory (nothing removed). */
int pr__tq_pop_due(pr__tq_t *tq, int64_t now_s, char **key, int64_t *time_s);
/* The same, with its trace context copied into `*ctx` (valid false when it
 * has none). */
int pr__tq_pop_due_ctx(pr__tq_t *tq, int64_t now_s, char **key, int64_t *time_s,
                       pr_span_ctx_t *ctx);
/* The times of `key`, ascending, into a malloc'd array (NULL when none);
 * -1 out of memory. */
int pr__tq_key_times(const pr__tq_t *tq, const char *key, int64_t **times,
                     size_t *n);
/* Calls `fn` for every timer whose time is in [from_s, to_s), with its
 * trace context or NULL. */
void pr__tq_each_in(const pr__tq_t *tq, int64_t from_s, int64_t to_s,
                    void (*fn)(void *arg, const char *key, int64_t time_s,
                               const pr_span_ctx_t *ctx),
                    void *arg);

#endif /* PR_TIMERS_H */
