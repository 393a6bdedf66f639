/*
 * stores.h - the deduplication and deferral stores (private), for the
 * quality-of-service layers: Cassandra implementations on a CQL worker
 * thread (src/cql/worker.h) that their owner's other stores share, on the
 * original Prosody's tables (the layout: cqlstores.c).
 *
 * Like the timer store, every operation is started on its owner's thread
 * and its callback runs there too, from poll() after `wake` was called.
 */
#ifndef PR_STORES_H
#define PR_STORES_H

#include <stddef.h>
#include <stdint.h>

#include "../cql/worker.h"
#include "prosody.h"

typedef void (*pr__store_done_cb)(void *arg, prosody_err_t err,
                                  const char *errstr);

/* ---- a bounded set of 128-bit ids (idset.c) ------------------------- */

/* A dedup id (src/engine/dedup.c makes them). */
typedef struct pr__did {
  uint64_t hi, lo;
} pr__did_t;

/* At most `capacity` ids, the least recently used (added or found) evicted
 * first; each expires at its own time (seconds, any clock the caller
 * uses consistently). Not thread-safe. */
typedef struct pr__idset pr__idset_t;
pr__idset_t *pr__idset_new(size_t capacity);
void pr__idset_free(pr__idset_t *s);
/* Raises the capacity (never lowers it). */
void pr__idset_reserve(pr__idset_t *s, size_t capacity);
/* 1 if `id` is in the set and not expired at `now_s` (it becomes the most
 * recently used), else 0 (an expired id is removed). */
int pr__idset_has(pr__idset_t *s, pr__did_t id, int64_t now_s);
/* Adds `id` (or renews it) until `expires_s`; 0, or -1 when out of
 * memory. */
int pr__idset_add(pr__idset_t *s, pr__did_t id, int64_t expires_s);
size_t pr__idset_size(const pr__idset_t *s);

/* ---- deduplication: ids already processed, per scope ------------------ */

typedef struct pr__dedup pr__dedup_t;
typedef void (*pr__seen_cb)(void *arg, prosody_err_t err, const char *errstr,
                            int seen);

/* A deduplication store's operations. As with the deferral stores, each
 * is started on the owner's thread and its callback runs there, before
 * the call returns (`sync`) or later from poll(); a `sync` store's seen
 * and record may also be called from any thread (the memory store is
 * thread-safe), which the dedup layer uses to look ids up on the thread
 * about to run the handler. */
typedef struct pr__dedup_ops {
  /* Was `id` recorded in `scope` (and not expired)? */
  void (*seen)(pr__dedup_t *d, const char *scope, pr__did_t id, pr__seen_cb cb,
               void *arg);
  /* Records `id` in `scope` for `ttl_s` seconds. */
  void (*record)(pr__dedup_t *d, const char *scope, pr__did_t id, int64_t ttl_s,
                 pr__store_done_cb cb, void *arg);
  void (*poll)(pr__dedup_t *d);
  /* Completes what is pending (with errors), then frees the store. */
  void (*destroy)(pr__dedup_t *d);
} pr__dedup_ops_t;

struct pr__dedup {
  const pr__dedup_ops_t *ops;
  int sync; /* completes before it returns, on any thread */
};

/* The Cassandra store (the keyspace migrated) on session `w` (a
 * reference taken; see worker.h for the order of closing). */
pr__dedup_t *pr__dedup_new(pr__cqlw_t *w, const char *keyspace, char *errstr,
                           size_t errstr_size);
/* The memory store (memdedup.c): one per process, shared by every client,
 * of about a million ids (the least recently used evicted). NULL when out
 * of memory. */
pr__dedup_t *pr__dedup_memory(void);

static inline void pr__dedup_seen(pr__dedup_t *d, const char *scope,
                                  pr__did_t id, pr__seen_cb cb, void *arg) {
  d->ops->seen(d, scope, id, cb, arg);
}
static inline void pr__dedup_record(pr__dedup_t *d, const char *scope,
                                    pr__did_t id, int64_t ttl_s,
                                    pr__store_done_cb cb, void *arg) {
  d->ops->record(d, scope, id, ttl_s, cb, arg);
}
static inline void pr__dedup_poll(pr__dedup_t *d) { d->ops->poll(d); }
/* NULL is a no-op. */
static inline void pr__dedup_free(pr__dedup_t *d) {
  if (d)
    d->ops->destroy(d);
}

/* ---- deferral: a FIFO of positions per (segment, key) ----------------- */

/*
 * Deferred messages (positions are offsets) and deferred timers (positions
 * are times in seconds): a key's deferred entries in ascending order, each
 * with a retry count. A segment is one group's topic partition.
 */
typedef enum pr__defer_kind {
  PR_DEFER_MESSAGES = 0,
  PR_DEFER_TIMERS = 1
} pr__defer_kind_t;

typedef struct pr__defer pr__defer_t;
/* found 0: the key has nothing deferred. */
typedef void (*pr__head_cb)(void *arg, prosody_err_t err, const char *errstr,
                            int found, int64_t position, int32_t retries);

/* A key with deferred entries and when it retries next. */
typedef struct pr__dkey {
  const char *key;
  int64_t retry_at_s; /* whole seconds since the epoch */
} pr__dkey_t;
/* `keys` are valid during the callback only. */
typedef void (*pr__dkeys_cb)(void *arg, prosody_err_t err, const char *errstr,
                             const pr__dkey_t *keys, size_t n);

/* A deferral store's operations. Each is started on the owner's thread
 * and its callback runs there: before the call returns (a store whose
 * `sync` is set, or a cache hit), or later from poll().
 *
 * The Cassandra store (the original's layout) keeps one retry count per
 * key, the head's: appending another position does not change it, and
 * its count is the stored retry_count + 1 (the original counts failed
 * retries from 0, we count failures). It keeps no key rows: keys() lists
 * nothing, set_key() and del_key() write nothing (the retry time is a
 * timer in the timer store), and a key's entries alone say it is
 * deferred, so trim() below INT64_MAX has nothing to remove. */
typedef struct pr__defer_ops {
  /* Every deferred key of `segment` (when a partition is assigned). */
  void (*keys)(pr__defer_t *d, const char *segment, pr__dkeys_cb cb, void *arg);
  /* Marks `key` deferred in `segment`, retrying at `retry_at_s`. */
  void (*set_key)(pr__defer_t *d, const char *segment, const char *key,
                  int64_t retry_at_s, pr__store_done_cb cb, void *arg);
  /* `key` has nothing deferred left. */
  void (*del_key)(pr__defer_t *d, const char *segment, const char *key,
                  pr__store_done_cb cb, void *arg);
  /* Appends (or rewrites) `position` with `retries`. */
  void (*append)(pr__defer_t *d, const char *segment, const char *key,
                 int64_t position, int32_t retries, pr__store_done_cb cb,
                 void *arg);
  /* The key's first (lowest) position and its retry count. */
  void (*head)(pr__defer_t *d, const char *segment, const char *key,
               pr__head_cb cb, void *arg);
  /* Removes `position` (the head, once it succeeded). */
  void (*advance)(pr__defer_t *d, const char *segment, const char *key,
                  int64_t position, pr__store_done_cb cb, void *arg);
  /* Removes every position below `below` (left over by an earlier
   * deferral of the key whose key row was never written). */
  void (*trim)(pr__defer_t *d, const char *segment, const char *key,
               int64_t below, pr__store_done_cb cb, void *arg);
  /* Sets the retry count of `position`. */
  void (*set_retries)(pr__defer_t *d, const char *segment, const char *key,
                      int64_t position, int32_t retries, pr__store_done_cb cb,
                      void *arg);
  /* Delivers the callbacks of finished operations. */
  void (*poll)(pr__defer_t *d);
  /* Completes what is pending (with errors), then frees the store. */
  void (*destroy)(pr__defer_t *d);
} pr__defer_ops_t;

/* What every deferral store starts with. */
struct pr__defer {
  const pr__defer_ops_t *ops;
  pr__defer_kind_t kind;
  int sync; /* every operation completes before it returns */
};

/* The Cassandra store (the keyspace migrated) on session `w` (a
 * reference taken; see worker.h for the order of closing). */
pr__defer_t *pr__defer_new(pr__cqlw_t *w, const char *keyspace,
                           pr__defer_kind_t kind, int64_t retention_s,
                           char *errstr, size_t errstr_size);
/* The memory store of `kind` (memdefer.c): one per process, shared by
 * every client, so what a client deferred outlives its partition's
 * revoke and the client itself (mock mode promises no more: the process
 * is the cluster). Operations complete before they return. NULL when out
 * of memory. */
pr__defer_t *pr__defer_memory(pr__defer_kind_t kind);
/* A cache of at most `capacity` keys' heads in front of `inner`
 * (defer_store_cache_size; defer_cache.c), which it then owns: a head
 * read the cache can answer costs no store read. It must be the only
 * writer of its segments while it holds them: keys() of a segment (its
 * partition is assigned) forgets what it knew of that segment. NULL when
 * out of memory (`inner` is not freed then). */
pr__defer_t *pr__defer_cached(pr__defer_t *inner, size_t capacity);
/* The cache's counters, for tests: head reads answered, and passed on. */
void pr__defer_cache_stats(const pr__defer_t *d, uint64_t *hits,
                           uint64_t *misses);

static inline void pr__defer_keys(pr__defer_t *d, const char *segment,
                                  pr__dkeys_cb cb, void *arg) {
  d->ops->keys(d, segment, cb, arg);
}
static inline void pr__defer_set_key(pr__defer_t *d, const char *segment,
                                     const char *key, int64_t retry_at_s,
                                     pr__store_done_cb cb, void *arg) {
  d->ops->set_key(d, segment, key, retry_at_s, cb, arg);
}
static inline void pr__defer_del_key(pr__defer_t *d, const char *segment,
                                     const char *key, pr__store_done_cb cb,
                                     void *arg) {
  d->ops->del_key(d, segment, key, cb, arg);
}
static inline void pr__defer_append(pr__defer_t *d, const char *segment,
                                    const char *key, int64_t position,
                                    int32_t retries, pr__store_done_cb cb,
                                    void *arg) {
  d->ops->append(d, segment, key, position, retries, cb, arg);
}
static inline void pr__defer_head(pr__defer_t *d, const char *segment,
                                  const char *key, pr__head_cb cb, void *arg) {
  d->ops->head(d, segment, key, cb, arg);
}
static inline void pr__defer_advance(pr__defer_t *d, const char *segment,
                                     const char *key, int64_t position,
                                     pr__store_done_cb cb, void *arg) {
  d->ops->advance(d, segment, key, position, cb, arg);
}
static inline void pr__defer_trim(pr__defer_t *d, const char *segment,
                                  const char *key, int64_t below,
                                  pr__store_done_cb cb, void *arg) {
  d->ops->trim(d, segment, key, below, cb, arg);
}
static inline void pr__defer_set_retries(pr__defer_t *d, const char *segment,
                                         const char *key, int64_t position,
                                         int32_t retries, pr__store_done_cb cb,
                                         void *arg) {
  d->ops->set_retries(d, segment, key, position, retries, cb, arg);
}
static inline void pr__defer_poll(pr__defer_t *d) { d->ops->poll(d); }
/* NULL is a no-op. */
static inline void pr__defer_free(pr__defer_t *d) {
  if (d)
    d->ops->destroy(d);
}

#endif /* PR_STORES_H */
