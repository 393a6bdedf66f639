/*
 * state.h - the keyed-state store (private): cells of collections, for
 * src/engine/state.c. Two implementations: memory (memstate.c, one per
 * process, shared by every client, answers at once on any thread) and
 * Cassandra (cqlstate.c, the original Prosody's keyed_state_cell and
 * keyed_state_identity, on a CQL worker thread).
 *
 * The model: a collection of one key is an ordered set of cells, each named
 * by (section, coordinate) and holding bytes. Sections separate a
 * collection's parts (a deque's bookkeeping from its items); coordinates
 * order cells within a section as unsigned bytes, shorter first on a common
 * prefix (Cassandra's blob order). The engine encodes values, map keys and
 * deque positions into cells (state.c); the store only keeps cells.
 *
 * As with the other stores, every operation is started on the owner's
 * thread and its callback runs there, before the call returns (`sync`) or
 * later from poll() after `wake` was called. A `sync` store may be called
 * from any thread.
 */
#ifndef PR_STORES_STATE_H
#define PR_STORES_STATE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "../cql/cql.h"
#include "stores.h"

/* One collection of one key: the partition (group, topic, partition) that
 * owns the key, the key and the collection's name. Borrowed by every call
 * for its duration only. */
typedef struct pr__scoll {
  const char *group;
  const char *topic;
  int32_t partition;
  const char *key;
  const char *name;
} pr__scoll_t;

/* A cell as a store returns it (borrowed: valid during the callback). */
typedef struct pr__scell {
  int section;
  const uint8_t *coord;
  size_t coord_len;
  const uint8_t *data;
  size_t data_len;
} pr__scell_t;

/* A write: put one cell, delete one cell, or delete every cell of a
 * section (coord unused). `ttl_s` (put) 0 for none. */
enum pr__sw_op { PR_SW_PUT = 0, PR_SW_DEL = 1, PR_SW_DEL_SECTION = 2 };
typedef struct pr__swrite {
  const pr__scoll_t *coll;
  int op;
  int section;
  const uint8_t *coord;
  size_t coord_len;
  const uint8_t *data;
  size_t data_len;
  int64_t ttl_s;
} pr__swrite_t;

/* What a collection is, recorded once per group and name. */
typedef struct pr__sident {
  int kind;    /* prosody_state_kind_t */
  int payload; /* prosody_state_payload_t */
  int check;   /* compare only: record nothing (none recorded is
                  PROSODY_ERR_STATE) */
} pr__sident_t;

/* A route of a published collection (keyed_state_publication): `group`
 * keeps it for the keys of `topic`, of `partitions` partitions. */
typedef struct pr__sroute {
  const char *group;
  const char *topic;
  int32_t partitions;
} pr__sroute_t;

/* The routes a collection may have: a reader refuses more (the original's
 * bound); routes() lists one more, to tell. */
#define PR_SROUTES_MAX 16

typedef struct pr__sstore pr__sstore_t;

/* Orders cells: by section, then coordinate as unsigned bytes, a prefix
 * first (Cassandra's order of the clustering columns). */
static inline int pr__scell_cmp(int sa, const uint8_t *a, size_t al, int sb,
                                const uint8_t *b, size_t bl) {
  size_t n = al < bl ? al : bl;
  int r;
  if (sa != sb)
    return sa < sb ? -1 : 1;
  if (n && (r = memcmp(a, b, n)))
    return r;
  return al < bl ? -1 : al > bl;
}

/* Routes in (group, topic) order, at most PR_SROUTES_MAX + 1 (borrowed:
 * valid during the callback). */
typedef void (*pr__sroutes_cb)(void *arg, prosody_err_t err, const char *errstr,
                               const pr__sroute_t *r, size_t n);

/* `found` 0: no such cell (data NULL). */
typedef void (*pr__sget_cb)(void *arg, prosody_err_t err, const char *errstr,
                            const uint8_t *data, size_t data_len, int found);
/* Cells in the asked order; `end` 1 when no cell follows them. */
typedef void (*pr__srange_cb)(void *arg, prosody_err_t err, const char *errstr,
                              const pr__scell_t *cells, size_t n, int end);

typedef struct pr__sstore_ops {
  /* The cell (section, coord) of `c`. */
  void (*get)(pr__sstore_t *s, const pr__scoll_t *c, int section,
              const uint8_t *coord, size_t coord_len, pr__sget_cb cb,
              void *arg);
  /* Up to `limit` cells of `section` strictly after `after` (NULL: from
   * the first), ascending; with `backward`, strictly before `after` (NULL:
   * from the last), descending. */
  void (*range)(pr__sstore_t *s, const pr__scoll_t *c, int section,
                const uint8_t *after, size_t after_len, int backward,
                size_t limit, pr__srange_cb cb, void *arg);
  /* Applies `w[0 .. n)` (borrowed for the call only: a store that answers
   * later copies them) in order (a section's delete before the puts
   * after it), all or nothing: with a Cassandra store one logged batch,
   * which also records `dedup` (may be NULL) in the deduplication table
   * for `dedup_ttl_s`, so that the event's record and its state land
   * together. n may be 0 (only the record). Except when it is too big for
   * one batch (Cassandra refuses a batch over several partitions past its
   * batch_size_fail_threshold, 50 KiB by default): then one batch per
   * collection in turn and the record last (cqlstate.c). */
  void (*apply)(pr__sstore_t *s, const pr__swrite_t *w, size_t n,
                const pr__did_t *dedup, int64_t dedup_ttl_s,
                pr__store_done_cb cb, void *arg);
  /* Records `id` for (group, name) if none is, else compares: a different
   * recorded identity is PROSODY_ERR_PERMANENT naming both. */
  void (*identity)(pr__sstore_t *s, const char *group, const char *name,
                   const pr__sident_t *id, pr__store_done_cb cb, void *arg);
  /* Published collections' routes, under (subsystem, name): records one
   * (an upsert), deletes `group`'s, or lists them. */
  void (*publish)(pr__sstore_t *s, const char *subsystem, const char *name,
                  const pr__sroute_t *r, pr__store_done_cb cb, void *arg);
  void (*unpublish)(pr__sstore_t *s, const char *subsystem, const char *name,
                    const char *group, pr__store_done_cb cb, void *arg);
  void (*routes)(pr__sstore_t *s, const char *subsystem, const char *name,
                 pr__sroutes_cb cb, void *arg);
  void (*poll)(pr__sstore_t *s);
  /* Completes what is pending (with errors), then frees the store. */
  void (*destroy)(pr__sstore_t *s);
} pr__sstore_ops_t;

struct pr__sstore {
  const pr__sstore_ops_t *ops;
  int sync;
};

/* The memory store: one per process (never freed; destroy is a no-op).
 * NULL when out of memory. */
pr__sstore_t *pr__memstate(void);

/* The Cassandra store (the keyspace migrated) on session `w` (a
 * reference taken; see worker.h for the order of closing). */
pr__sstore_t *pr__cqlstate_new(pr__cqlw_t *w, const char *keyspace,
                               char *errstr, size_t errstr_size);

#endif /* PR_STORES_STATE_H */
