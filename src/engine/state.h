/*
 * state.h - keyed state's pieces (private to src/engine/state*.c): the
 * transaction's overlay of cells (state.c), an operation in flight
 * (state_ops.c, its arguments checked in state_args.c), the kinds' steps
 * (state_kinds.c), and published state's readers (state_pub.c,
 * state_pub_open.c). See state.c for the design. Everything here is the
 * engine thread's, except an operation's arguments (the caller's until
 * posted), a published read's (the reader thread's) and the readers'
 * structures, whose owners are written at their definitions.
 */
#ifndef PR_ENGINE_STATE_H
#define PR_ENGINE_STATE_H

#include <pthread.h>
#include <stdint.h>

#include "../stores/state.h"
#include "internal.h"

#define SECTIONS 2
#define SCAN_DEFAULT 256
#define EVICT_MAX 2 /* items a push drops past capacity, as the original */

struct prosody_state {
  prosody_context_t *ctx;
  int def;
  int kind;
  int payload; /* prosody_state_payload_t */
  char *name;  /* owned: for errors */
};

/* The largest document a collection takes: well under what Cassandra
 * takes in one write (half its commit log segment, 16 MiB by default). */
#define PR_STATE_DOC_MAX ((size_t)4 << 20)

/* A cell in a transaction's overlay: dirty (to write: data, or absent to
 * delete) or clean (the store's, or known absent). */
typedef struct ocell {
  int section;
  uint8_t *coord; /* coord and data in one allocation */
  size_t coord_len;
  uint8_t *data; /* NULL when absent */
  size_t data_len;
  uint8_t dirty;
} ocell_t;

typedef struct scoll {
  struct scoll *next;
  int def; /* eng->st->states.d[def] */
  char *name;
  ocell_t *cells; /* sorted by (section, coord) */
  size_t n, cap;
  uint8_t cleared[SECTIONS];  /* a section delete to write first */
  uint8_t complete[SECTIONS]; /* the overlay is all of the section */
  int dirty;                  /* something to write */
} scoll_t;

struct pr__stx {
  pr__engine_t *eng;
  inv_t *inv; /* NULL once the attempt has ended */
  char *topic, *key;
  int32_t partition;
  scoll_t *colls;
  int busy;   /* operations and applies in flight */
  int closed; /* the handler has succeeded: operations are refused */
  uv_timer_t *retry;
  int failures;
  /* The settle's writes, kept for a retry. */
  pr__swrite_t *w;
  size_t nw;
  pr__scoll_t *addr; /* per collection, for w */
};

/* ---- encodings ---------------------------------------------------------- */

static inline void be64(uint8_t *o, uint64_t v) {
  for (int i = 7; i >= 0; i--) {
    o[i] = (uint8_t)v;
    v >>= 8;
  }
}

static inline uint64_t rd64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++)
    v = v << 8 | p[i];
  return v;
}

static inline void pos_coord(uint8_t o[8], int64_t pos) {
  be64(o, (uint64_t)pos ^ UINT64_C(0x8000000000000000));
}

/* A cell a scan read (a copy). */
typedef struct row {
  uint8_t *coord; /* coord and data in one allocation */
  size_t coord_len;
  uint8_t *data;
  size_t data_len;
} row_t;

/* One operation: a blocking call's is on the caller's stack (the engine
 * fills the result and signals `cond`, then never touches it); an
 * asynchronous one (`cb`) is malloc'd and freed once `cb` returned. */
typedef struct sop sop_t;
/* How an operation is answered (pr__st_sop_done; resolve's continuation). */
typedef void (*pr__st_answer_fn)(sop_t *op, prosody_err_t err, const char *fmt,
                                 ...) __attribute__((format(printf, 3, 4)));

struct sop {
  pr__mail_t mail;
  prosody_context_t *ctx;
  int def, kind, op;
  int payload;   /* PROSODY_STATE_MESSAGE: items are loaded before ... */
  int resolving; /* ... the answer (state_msg.c), which then goes ... */
  pr__st_answer_fn resolved; /* ... through this */
  /* The arguments, copied. */
  char *key;
  size_t key_len;
  char **keys;
  size_t nkeys;
  char *json;
  size_t json_len;
  int64_t index;
  char *after;
  size_t after_len;
  size_t limit;
  int backward, keys_only;
  /* Engine thread (or a published reader's thread: eng and stx NULL),
   * while it runs. */
  pr__engine_t *eng;
  pr__sstore_t *store; /* the store read */
  pr__scoll_t paddr;   /* a published read's address (stx NULL) */
  int64_t capacity;    /* the deque's, from its definition */
  pr__stx_t *stx;
  scoll_t *coll;
  int stage;
  size_t at;          /* GET_MANY: the next key */
  int64_t head, tail; /* deque bounds, once read */
  int64_t pos;        /* deque: the item read */
  int64_t after_pos;  /* deque SCAN: resume after this position */
  uint8_t *got;       /* the last read: a copy (NULL: absent) */
  size_t got_len;
  uint8_t *rc; /* the cell being read, to cache its answer */
  size_t rc_len;
  int rc_section;
  row_t *rows; /* the last scan's cells */
  size_t nrows;
  int scan_section, scan_backward, scan_end;
  uint8_t *scan_after; /* NULL: from the start */
  size_t scan_after_len;
  pr__swrite_t *w; /* a flush's writes, while applied */
  pr__scoll_t addr;
  /* The result. */
  prosody_state_result_t r;
  size_t rcap;
  prosody_err_t err;
  char errstr[512];
  pthread_mutex_t lock;
  pthread_cond_t cond;
  int done;
  prosody_state_cb cb;
  void *opaque;
};

/* ---- across the files ---- */

ocell_t *pr__st_ov_find(scoll_t *c, int section, const uint8_t *coord,
                        size_t len);
int pr__st_ov_set(scoll_t *c, int section, const uint8_t *coord, size_t len,
                  const uint8_t *data, size_t data_len, int dirty);
void pr__st_ov_drop_section(scoll_t *c, int section);
void pr__st_ov_reset(scoll_t *c);
void pr__st_ov_written(scoll_t *c);
void pr__st_stx_free(pr__stx_t *t);
pr__stx_t *pr__st_stx_of(inv_t *inv);
/* The keyed-state store of a consumer with collections (state.c). */
pr__sstore_t *pr__st_store(const pr__engine_t *eng);
scoll_t *pr__st_coll_of(pr__stx_t *t, int def);
pr__scoll_t pr__st_addr_of(pr__stx_t *t, scoll_t *c);
int pr__st_writes_of(pr__stx_t *t, scoll_t *c, const pr__scoll_t *addr,
                     pr__swrite_t **w, size_t *n, size_t *cap);
int pr__st_add_item(sop_t *op, const void *key, size_t key_len,
                    const void *json, size_t json_len);
void pr__st_sop_done(sop_t *op, prosody_err_t err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void pr__st_read_cell(sop_t *op, int section, const uint8_t *coord, size_t len);
void pr__st_read_range(sop_t *op);
void pr__st_clear_sections(scoll_t *c, int upto);
void pr__st_wrote(sop_t *op);
/* Checks and copies an operation's arguments into `op` (any thread;
 * state_args.c). */
prosody_err_t pr__st_prepare(sop_t *op, prosody_state_t *st, int kind_op,
                             const prosody_state_args_t *a, char *errstr,
                             size_t errstr_size);
/* Frees what pr__st_prepare copied (and a run's buffers). */
void pr__st_sop_free_args(sop_t *op);
/* Runs `op` on (op->store, op->paddr, op->coll), with no transaction: a
 * published read (state_pub.c), on the reader's thread. */
void pr__st_run_read(sop_t *op);
/* Each kind's steps (state_kinds.c), by PROSODY_STATE_VALUE, _MAP and
 * _DEQUE: what an operation does to it, reading at most one cell or page
 * per step (pr__st_read_cell, pr__st_read_range continue it). */
extern void (*const pr__st_kind_step[3])(sop_t *op);

/* ---- published state's readers (state_pub.c, state_pub_open.c) ---------- */

#define PR_PUBS_BUCKETS 1024 /* the answer cache's hash buckets */

/* A client's published-state readers, their reader thread and their answer
 * cache: created by the first pr__pubs_open and freed by pr__pubs_free,
 * both under the client's lock (client.c). Each field names its owner. */
struct pr__pubs {
  const pr__settings_t *st;     /* the client's (outlives us) */
  pr__sstore_t *store;          /* reader thread's (a sync store: any) */
  prosody_published_t *readers; /* the client's lock */
  /* The reader thread. */
  pthread_t thread;
  uv_loop_t loop;
  uv_async_t mail_wake, store_wake, stop;
  pr__mailbox_t mb;
  int stopping; /* reader thread: answer everything with STATE */
  /* The answer cache (its entries: state_pub.c's centry_t). */
  pthread_mutex_t cache_lock;
  struct centry *buckets[PR_PUBS_BUCKETS]; /* cache_lock */
  struct centry *oldest, *newest;          /* cache_lock */
  size_t cache_bytes;                      /* cache_lock */
  size_t cache_max; /* state_read_cache_size (immutable) */
};

/* A reader (prosody_published_open): its settings are immutable once open
 * (its place in the list: the client's lock); its routes are the reader
 * thread's. */
struct prosody_published {
  prosody_published_t *next; /* pubs->readers */
  pr__pubs_t *pubs;
  char *subsystem, *name;
  int kind;
  int64_t ttl_ns; /* 0: no cache */
  /* Reader thread: the routes, while fresh. */
  pr__sroute_t routes[PR_SROUTES_MAX]; /* strings owned */
  size_t nroutes;
  int have_routes;
  int64_t routes_ns;
  uint8_t checked[PR_SROUTES_MAX]; /* CK_* (state_pub.c) */
  uint64_t gen; /* routes read so far: a read that began on earlier routes
                   starts its choice again */
};

/* Frees a reader's routes (reader thread; or pr__pubs_free, once it ended). */
void pr__pubs_routes_free(prosody_published_t *p);
/* Empties the answer cache (pr__pubs_free, once the reader thread ended). */
void pr__pubs_cache_clear(pr__pubs_t *pubs);

/* state_msg.c: MESSAGE collections. */
int pr__st_ref_encode(const prosody_message_t *m, char **out, size_t *len);
int pr__st_ref_decode(const uint8_t *p, size_t n, char **topic,
                      int32_t *partition, int64_t *offset);
/* Loads the answer's records, then answers through `then` (the caller's
 * pr__st_sop_done, called again with op->resolving set). */
void pr__st_resolve(sop_t *op, pr__st_answer_fn then);
void pr__st_message_free(prosody_message_t *m);

#endif /* PR_ENGINE_STATE_H */
