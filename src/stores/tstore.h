/*
 * tstore.h - the timer store interface (private): a function table with a
 * memory implementation (memtimers.c) and a Cassandra one (cqltimers.c, on
 * the original Prosody's tables), opened one way (timers_open.c), as the
 * deduplication and deferral stores are (stores.h).
 */
#ifndef PR_TSTORE_H
#define PR_TSTORE_H

#include <stddef.h>
#include <stdint.h>

#include "../otel/otel.h"
#include "prosody.h"

/* Timer types (stored with each timer; deferred retries use the others):
 * the values of the original Prosody's TimerType, stored as they are. Its
 * type 3 (state recovery) is loaded from its tables but never written. */
typedef enum pr__timer_type {
  PR_TIMER_APPLICATION = 0,
  PR_TIMER_DEFER_MESSAGE = 1,
  PR_TIMER_DEFER_TIMER = 2
} pr__timer_type_t;

/* ------------------------------------------------------------------------ */
/* Timer store interface                                                    */
/* ------------------------------------------------------------------------ */

/*
 * A store persists timers per segment (one consumer group's topic
 * partition). Every operation is asynchronous: it is started on the engine
 * thread and its callback runs on the engine thread, possibly before the
 * call returns (the memory store always completes at once). A failed
 * operation reports PROSODY_ERR_TRANSIENT or PROSODY_ERR_PERMANENT with a
 * message.
 */
typedef struct pr__tstore pr__tstore_t;

typedef struct pr__tseg {
  const char *topic;
  int32_t partition;
} pr__tseg_t;

/* One stored timer, as a load returns it. */
typedef struct pr__trec {
  const char *key;
  int64_t time_s;
  pr__timer_type_t type;
  pr_span_ctx_t ctx; /* the scheduling span's context (valid false: none) */
} pr__trec_t;

typedef void (*pr__tstore_done_cb)(void *arg, prosody_err_t err,
                                   const char *errstr);
/* `recs` / `times` are valid during the callback only. */
typedef void (*pr__tstore_recs_cb)(void *arg, prosody_err_t err,
                                   const char *errstr, const pr__trec_t *recs,
                                   size_t n);
typedef void (*pr__tstore_times_cb)(void *arg, prosody_err_t err,
                                    const char *errstr, const int64_t *times,
                                    size_t n);

typedef struct pr__tstore_ops {
  /* Writes (key, time, type) with the trace context of the span that
   * scheduled it (NULL: none); writing one that exists keeps one, with
   * the later context (Cassandra: of two writes of one timer coalesced
   * into one batch, either). */
  void (*put)(pr__tstore_t *s, const pr__tseg_t *seg, const char *key,
              int64_t time_s, pr__timer_type_t type, const pr_span_ctx_t *ctx,
              pr__tstore_done_cb cb, void *arg);
  /* Deletes (key, time, type); absent is not an error. */
  void (*del)(pr__tstore_t *s, const pr__tseg_t *seg, const char *key,
              int64_t time_s, pr__timer_type_t type, pr__tstore_done_cb cb,
              void *arg);
  /* Deletes every timer of `key` and `type` except the one at `keep_s`
   * (-1: none). */
  void (*del_key)(pr__tstore_t *s, const pr__tseg_t *seg, const char *key,
                  pr__timer_type_t type, int64_t keep_s, pr__tstore_done_cb cb,
                  void *arg);
  /* The times of `key` and `type`, ascending. */
  void (*key_times)(pr__tstore_t *s, const pr__tseg_t *seg, const char *key,
                    pr__timer_type_t type, pr__tstore_times_cb cb, void *arg);
  /* The ids of the slabs that hold timers, ascending. */
  void (*slabs)(pr__tstore_t *s, const pr__tseg_t *seg, int64_t slab_s,
                pr__tstore_times_cb cb, void *arg);
  /* Every timer in slab `slab`. */
  void (*load_slab)(pr__tstore_t *s, const pr__tseg_t *seg, int64_t slab_s,
                    int64_t slab, pr__tstore_recs_cb cb, void *arg);
  /* The segment's partition left this instance (the memory store forgets
   * its timers, as mock mode promises; a durable store keeps them). */
  void (*release)(pr__tstore_t *s, const pr__tseg_t *seg);
  /* Delivers the callbacks of finished operations (a store that completes
   * on another thread calls its wake function, then the engine polls). */
  void (*poll)(pr__tstore_t *s);
  /* Completes what is pending (with errors), then frees the store. */
  void (*destroy)(pr__tstore_t *s);
  /* Retires finished slabs: deletes the listing rows of `slabs` (their
   * timers were all handled; what remains in them is never loaded again)
   * and raises the segment's slab watermark to `watermark` (-1: leave it)
   * when it lies above the current one, so that listings skip what is
   * below. Runs after every operation posted before it, and those posted
   * after it see its result (a put into a retired slab writes its row
   * again, lowering the watermark). NULL in a store without listing rows
   * (the memory store). */
  void (*retire)(pr__tstore_t *s, const pr__tseg_t *seg, const int64_t *slabs,
                 size_t n, int64_t watermark, pr__tstore_done_cb cb, void *arg);
} pr__tstore_ops_t;

struct pr__tstore {
  const pr__tstore_ops_t *ops;
  int sync; /* every operation completes before it returns */
};

/* The id of the timer segment named `name` ("<group>:<topic>/<partition>")
 * in the original Prosody's tables: the name-based (version 5, SHA-1) UUID
 * of the name in the URL namespace. 0, or -1 when SHA-1 failed. */
int pr__timer_segment_id(const char *name, uint8_t out[16]);

/* The in-memory store (engine thread only). NULL when out of memory. */
pr__tstore_t *pr__memstore_new(void);

/* The Cassandra store for consumer group `group` on session `w` (a
 * reference taken; see worker.h for the order of closing); the keyspace
 * must be migrated (pr__cql_migrate). The session's `wake` is called from
 * its thread when operations finished: the owner then calls poll() on its
 * own thread. */
struct pr__cqlw;
pr__tstore_t *pr__cqlstore_new(struct pr__cqlw *w, const char *keyspace,
                               const char *group, int64_t slab_s,
                               int64_t retention_s, char *errstr,
                               size_t errstr_size);

/*
 * One owner's Cassandra session, shared by its stores: `w` NULL until the
 * first store that needs it opens it (pr__cql_shared_open), then one
 * reference of it, which the owner drops (pr__cqlw_free) after stopping
 * the session and destroying the stores. `wake` and `wake_arg` are the
 * session's wake-up (worker.h).
 */
typedef struct pr__cql_shared {
  struct pr__cqlw *w;
  void (*wake)(void *);
  void *wake_arg;
} pr__cql_shared_t;

/* Opens `sh`'s session unless it is open (blocking: checks that
 * cassandra_nodes is set and migrates the keyspace first); sh->w then.
 * Errors as pr__cql_keyspace_ready's, and PROSODY_ERR_NOMEM. */
struct pr__settings;
prosody_err_t pr__cql_shared_open(pr__cql_shared_t *sh,
                                  const struct pr__settings *st, char *errstr,
                                  size_t errstr_size);

/* Opens the store the settings ask for: memory in mock mode, when the
 * handler has no on_timer (`uses_timers` 0) or for a test that asks for
 * it; else Cassandra, on the session `sh` (opened if need be). Errors:
 * PROSODY_ERR_CONFIG (cassandra_nodes missing), PROSODY_ERR_TRANSIENT
 * (Cassandra unreachable or failing), PROSODY_ERR_NOMEM. */
prosody_err_t pr__tstore_open(const struct pr__settings *st, int uses_timers,
                              int64_t slab_s, pr__cql_shared_t *sh,
                              pr__tstore_t **out, char *errstr,
                              size_t errstr_size);
/* The Cassandra settings as the CQL client takes them (pointers into
 * `st`). */
struct pr__cql_conf pr__cql_conf_of(const struct pr__settings *st);
/* Checks that cassandra_nodes is set and migrates the keyspace (blocking):
 * PROSODY_ERR_CONFIG when unset or the schema conflicts, TRANSIENT when
 * Cassandra cannot be reached. */
prosody_err_t pr__cql_keyspace_ready(const struct pr__settings *st,
                                     char *errstr, size_t errstr_size);

#endif /* PR_TSTORE_H */
