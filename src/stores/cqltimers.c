/*
 * cqltimers.c - the Cassandra timer store: the store interface of tstore.h
 * over a CQL session, on the timer tables of the original Prosody (its
 * migrations are vendored in third_party/prosody-migrations), so that one
 * keyspace serves both implementations: a timer either one schedules fires
 * on the other, and scheduled(), unschedule and clear see both sides'.
 *
 * LAYOUT (facts of the original's release 0.7.x; docs/ARCHITECTURE.md)
 *  - Segment: one consumer group's topic partition. Its name is
 *    "<group>:<topic>/<partition>" and its id the name-based (version 5,
 *    SHA-1) UUID of that name in the URL namespace
 *    (6ba7b811-9dad-11d1-80b4-00c04fd430c8).
 *  - timer_segments, partition `id`: static columns name, slab_size (int
 *    seconds), version (tinyint) and slab_watermark (int); one clustering
 *    row per slab holding timers (slab_id int, TTL: the slab's end - now +
 *    retention). Version 4 is the layout written here (typed tables, the
 *    key `state` map, tags); a version 3 segment is bumped to 4 (the same
 *    layout), anything else is refused with an error naming it. A non-null
 *    slab_watermark is below every slab row: slabs are listed above it, and
 *    a slab row written at or below it lowers it to slab - 1 in the same
 *    batch. Once every timer of a past slab was handled, its row is deleted
 *    and the watermark raised below the lowest slab still holding timers,
 *    as the original does (retire(), asked for by engine/slabs.c).
 *  - Times are whole seconds since the epoch as an unsigned 32-bit number,
 *    stored in `int` columns by bit pattern (after 2038 they read
 *    negative); slab id = time / slab_size, also an int by bit pattern.
 *  - Timer types (tinyint): 0 application, 1 deferred message, 2 deferred
 *    timer (ours, pr__timer_type_t, have the same values), 3 the
 *    original's state recovery (loaded and listed, never written here).
 *  - timer_typed_slabs, partition (segment_id, slab_size, id), clustering
 *    (timer_type, key, time): every timer, with span and tag; TTL: the end
 *    of its slab - now + retention. What loads read.
 *  - timer_typed_keys, partition (segment_id, key), clustering
 *    (timer_type, time): the key index. Its static `state` map (timer_type
 *    -> key_timer_state {inline boolean, time int, span, tag int}) says,
 *    per type: no entry, no timer; inline true, exactly one timer, held in
 *    the entry (no clustering row); inline false, two or more timers,
 *    held as clustering rows (span, tag). TTL: time - now + retention (the
 *    overflow marker: of the latest of its rows).
 *  - span: frozen map<text, text> of the W3C propagators; we write
 *    {"traceparent": "00-..."} (an empty map without a context: never
 *    null, which the original reads as a static-only row) and read its
 *    "traceparent" (tracestate and baggage are not kept).
 *  - tag: a random non-zero int per schedule, written with the timer in
 *    both tables. The original fires a timer by its slab row, then
 *    compares that row's tag with the key index's: a different tag is a
 *    replacement (scheduled again meanwhile), kept; the same is deleted.
 *  - TTL: (time - now, at least 0) + cassandra_retention; past Cassandra's
 *    20-year limit, none (0), as the original binds it.
 *  - Deleting a fired timer: its timer_typed_slabs row, and its key index
 *    entry: an inline entry is deleted; of an overflow set, the row is
 *    deleted and, with one survivor left, the survivor moves into an inline
 *    entry (its row deleted), with none left the entry is deleted.
 *
 * KEY MODEL. Which writes a put or delete needs depends on the key's
 * current state, so the store keeps, per (segment, key, type) it touched,
 * the timers the key index holds and whether its entry is inline. A key not
 * yet known is read first (one IN query for up to READ_KEYS keys of a
 * segment: its static map and clustering rows), unless this process wrote
 * the segment's row: it had none, and both implementations write it before
 * a segment's first timer, so none of its keys had timers. The model is trusted
 * while this process owns the partition: release() forgets it, as does an error
 * writing the key (it is read again, once nothing is in flight). What a
 * group of operations changes on one key is written as the difference of
 * the model before and after them, in one batch: each cell once.
 *
 * Threads: the CQL session runs on a worker thread (worker.h), so it keeps
 * working while the engine thread blocks (draining a revoked partition
 * waits for fired timers' deletes). Operations are posted from the engine
 * thread, run on the worker, and delivered back on the engine thread by
 * poll(). Each op is owned by one thread at a time; segments (seg_t) are
 * made by the engine thread and their mutable part is the worker's; the key
 * model and known slabs are the worker's.
 *
 * Writes are coalesced. Every op joins the send queue in the order it was
 * posted; the queue is sent from its head: a run of puts, deletes, clears
 * and key listings becomes one group (at most GROUP_MAX; a second op on a
 * timer already in the group, or any op on a key a clear or listing of the
 * group touches, starts the next group; so does an op on a key a group
 * still preparing holds, which waits for it). A group first prepares
 * (checks its segments' rows, reads the keys it does not know, writes the
 * slab rows of slabs new to it; up to PREP_MAX groups at once, on disjoint
 * keys), then decides its ops against the model and sends the writes as
 * unlogged batches of about BATCH_BYTES (a key's statements in one batch),
 * up to GROUPS_INFLIGHT groups on the wire.
 * Its ops are answered once all its batches are, with the first error of
 * any (a write that failed may or may not have landed; every write is
 * idempotent and the caller retries). Slab listings and loads start once
 * nothing is in flight, so they see every write posted before them.
 *
 * Order: the session stamps each request with a strictly increasing client
 * timestamp when it is sent, and Cassandra keeps the newest write of a
 * cell. The groups that write a key are decided and sent in the order they
 * were posted (groups on other keys may pass them: they write other
 * cells), and one group writes each cell at most once, so writes resolve as
 * they were issued.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cql/worker.h"
#include "../timers/timers.h"
#include "../util/util.h"

#define PAGE 5000
#define MAX_TTL_S 630720000 /* Cassandra's limit: 20 years */
#define GROUP_MAX 256       /* ops per group */
#define READ_KEYS 64        /* keys per IN read of the key index */
#define SEG_VERSION 4       /* the original's segment layout we write */
/* Estimated bytes per batch request: Cassandra refuses a batch over several
 * partitions above batch_size_fail_threshold (50 KiB by default). */
#define BATCH_BYTES 16384
#define GROUPS_INFLIGHT 4
#define PREP_MAX 4 /* groups preparing at once (on disjoint keys) */
#define GROUPS_INFLIGHT_MAX 32
#define KNOWN_BUCKETS 1024 /* slabs whose timer_segments row is written */
#define KNOWN_MAX 65536    /* ... forgotten beyond this many */
#define KNOWN_MARGIN_S 600 /* ... and this long before their row expires */
#define KEY_BUCKETS 65536  /* the key model's hash table */
#define KEYS_MAX 262144    /* key entries kept before the model is dropped */
#define SEG_BUCKETS 64
#define SPARE_MAX 1024 /* finished ops kept for reuse (engine thread) */
#define KEY_INLINE 48  /* keys shorter than this live in the op */
#define NTYPES 4       /* timer types the original knows */

typedef struct op op_t;
typedef struct group group_t;

/* A segment, made once per (topic, partition) by the engine thread and
 * kept until the store is destroyed: ops point at it. */
typedef struct seg {
  struct seg *next; /* engine thread: the lookup table */
  int32_t partition;
  uint8_t id[16];    /* uuid v5 of the name */
  const char *topic; /* in `name`'s allocation, after it */
  /* Worker thread. */
  int ready;          /* 1 its row checked, -1 refused (`why`), 0 unknown */
  int fresh;          /* we wrote its row: no key of it had timers then */
  uint64_t fresh_gen; /* ... while the model of that generation lasts */
  int64_t watermark;  /* slab_watermark, -1 null */
  char why[256];
  char name[]; /* "<group>:<topic>/<partition>" */
} seg_t;

/* One timer of a key index entry (the model). */
typedef struct ktimer {
  int64_t time_s;
  int32_t tag;
  int dirty; /* written by the group being decided */
  pr_span_ctx_t ctx;
} tm_t;

enum { K_READING, K_KNOWN, K_STALE };

/* A (segment, key, type) of the key index as this store knows it (worker
 * thread). */
typedef struct kent {
  struct kent *next;
  seg_t *seg;
  pr__timer_type_t type;
  int state; /* K_* */
  int inl;   /* the stored entry is inline (then n == 1) */
  tm_t *t;   /* ascending by time */
  size_t n, cap;
  /* While read: the entry found (0 none, 1 inline, 2 overflow). */
  int found;
  tm_t found_inl;
  group_t *pg; /* the preparing group holding an op on it */
  /* While a group decides: the model before it. */
  group_t *touched;
  tm_t *b;
  size_t bn;
  int binl;
  char key[];
} kent_t;

/* A slab whose timer_segments row was acknowledged, until `until_s`. */
typedef struct known {
  struct known *next;
  seg_t *seg;
  int64_t slab, until_s;
} known_t;

typedef struct cqlstore {
  pr__tstore_t base;
  pr__cqlw_t *w;
  pr__cql_t *cql; /* the worker's session: worker thread only */
  char *group;
  int64_t slab_s, retention_s;
  pr__cql_stmt_t *sel_seg, *ins_seg, *upd_seg_version, *ins_slab,
      *set_watermark, *del_slab, *sel_slabs, *sel_slabs_above, *ins_trigger,
      *del_trigger, *sel_slab, *sel_keys, *set_state, *del_state, *ins_row,
      *del_row, *del_rows;
  /* Worker thread only: the send queue (see the top of the file). */
  op_t *q_head, *q_tail;
  size_t qlen;
  int inflight;  /* groups whose writes are not all answered */
  group_t *prep; /* groups preparing (their keys disjoint) */
  int nprep;
  int closing;     /* the session closes: fail what is queued */
  int dispatching; /* in dispatch() (re-entered from callbacks) */
  int again;       /* ... which must look at the queue again */
  int retiring;    /* a retire's batches are out: nothing else starts */
  known_t *known[KNOWN_BUCKETS];
  size_t nknown;
  kent_t **keys; /* KEY_BUCKETS */
  size_t nkeys;
  uint64_t rng;       /* tags */
  uint64_t model_gen; /* bumped when the whole model is dropped */
  /* Engine thread only: segments, and finished ops for reuse. */
  seg_t *segs[SEG_BUCKETS];
  op_t *spare;
  size_t nspare;
} cqlstore_t;

enum { R_DONE, R_TIMES, R_RECS, R_NONE };
/* How an op is sent: started alone, or as part of a group. */
enum { S_ALONE, S_PUT, S_DEL, S_DEL_KEY, S_TIMES };

/* One operation in progress. */
struct op {
  pr__cqlw_job_t job; /* first: the worker's view of it */
  cqlstore_t *st;
  void (*start)(op_t *o); /* S_ALONE: runs on the worker thread */
  int result;             /* R_*: which callback gets it */
  int64_t time_s;
  seg_t *seg;
  char *key; /* keybuf, or malloc'd */
  char keybuf[KEY_INLINE];
  int64_t keep_s;
  pr__timer_type_t type;
  pr_span_ctx_t ctx; /* S_PUT: its trace context */
  pr__tstore_done_cb done;
  pr__tstore_times_cb times_cb;
  pr__tstore_recs_cb recs_cb;
  void *arg;
  /* Accumulated across pages. */
  int64_t *times;
  size_t n, cap;
  pr__trec_t *recs;
  size_t nrecs, caprecs;
  uint8_t *paging;
  int32_t paging_len;
  int64_t slab;
  int wm_left; /* a retire: its watermark raise is not yet sent */
  /* Worker thread: the send queue and the op's group. */
  op_t *qnext;
  int send; /* S_* */
  kent_t *ent;
};

/* The op is finished (worker thread). */
static void complete(op_t *o, prosody_err_t err, const char *errstr) {
  pr__cqlw_complete(&o->job, err, errstr);
}

static void dispatch(cqlstore_t *st);

/* A posted op joins the send queue; the round's end sends it (worker.h). */
static void op_start(pr__cqlw_job_t *j) {
  op_t *o = (op_t *)j;
  cqlstore_t *st = o->st;
  o->qnext = NULL;
  if (st->q_tail)
    st->q_tail->qnext = o;
  else
    st->q_head = o;
  st->q_tail = o;
  st->qlen++;
}

static void on_round(void *arg, int stopping) {
  cqlstore_t *st = arg;
  if (stopping)
    st->closing = 1; /* what is queued fails; what is sent fails with it */
  dispatch(st);
}

static void op_deliver(pr__cqlw_job_t *j);

/* Queues an op for the worker (engine thread). */
static void post(op_t *o) {
  o->job.w = o->st->w;
  o->job.start = op_start;
  o->job.deliver = op_deliver;
  pr__cqlw_post(&o->job);
}

/* Frees what the op owns, then keeps it for reuse or frees it (engine
 * thread). */
static void op_free(op_t *o) {
  cqlstore_t *st = o->st;
  for (size_t i = 0; i < o->nrecs; i++)
    free((char *)o->recs[i].key);
  free(o->recs);
  free(o->times);
  free(o->paging);
  if (o->key != o->keybuf)
    free(o->key);
  if (st->nspare >= SPARE_MAX) {
    free(o);
    return;
  }
  o->qnext = st->spare;
  st->spare = o;
  st->nspare++;
}

int pr__timer_segment_id(const char *name, uint8_t out[16]) {
  return pr__uuid_v5(pr__uuid_ns_url, name, strlen(name), out);
}

/* The segment, made on first use (engine thread). */
static seg_t *seg_of(cqlstore_t *st, const pr__tseg_t *ts) {
  uint64_t h = UINT64_C(14695981039346656037) ^ (uint32_t)ts->partition;
  seg_t **at, *sg;
  size_t tlen = strlen(ts->topic), nlen;
  for (size_t i = 0; i < tlen; i++)
    h = (h ^ (unsigned char)ts->topic[i]) * UINT64_C(1099511628211);
  at = &st->segs[h % SEG_BUCKETS];
  for (sg = *at; sg; sg = sg->next)
    if (sg->partition == ts->partition && !strcmp(sg->topic, ts->topic))
      return sg;
  nlen = strlen(st->group) + tlen + 16;
  if (!(sg = calloc(1, sizeof(*sg) + nlen + tlen + 1)))
    return NULL;
  snprintf(sg->name, nlen, "%s:%s/%d", st->group, ts->topic, ts->partition);
  memcpy(sg->name + nlen, ts->topic, tlen + 1);
  sg->topic = sg->name + nlen;
  sg->partition = ts->partition;
  sg->watermark = -1;
  if (pr__timer_segment_id(sg->name, sg->id)) {
    free(sg);
    return NULL;
  }
  sg->next = *at;
  *at = sg;
  return sg;
}

static op_t *op_new(cqlstore_t *st, const pr__tseg_t *ts, const char *key) {
  seg_t *sg = seg_of(st, ts);
  size_t klen = key ? strlen(key) : 0;
  op_t *o = st->spare;
  if (!sg)
    return NULL;
  if (o) {
    st->spare = o->qnext;
    st->nspare--;
    memset(o, 0, sizeof(*o));
  } else if (!(o = calloc(1, sizeof(*o)))) {
    return NULL;
  }
  o->st = st;
  o->seg = sg;
  if (key && klen < KEY_INLINE) {
    memcpy(o->keybuf, key, klen + 1);
    o->key = o->keybuf;
  } else if (key && !(o->key = malloc(klen + 1))) {
    free(o);
    return NULL;
  } else if (key) {
    memcpy(o->key, key, klen + 1);
  }
  return o;
}

/* The TTL of a row about `time_s`: (time - now, at least 0) + retention;
 * 0 (none) past Cassandra's limit, as the original binds it. */
static int32_t ttl_for(const cqlstore_t *st, int64_t time_s) {
  int64_t ttl = time_s - pr__wall_ms() / 1000;
  ttl = (ttl > 0 ? ttl : 0) + st->retention_s;
  return ttl > MAX_TTL_S ? 0 : ttl < 1 ? 1 : (int32_t)ttl;
}

/* The end of `slab` (its rows' TTL anchor). */
static int64_t slab_end(const cqlstore_t *st, int64_t slab) {
  return pr__slab_start(slab + 1, st->slab_s);
}

/* Seconds and slab ids as the original's int columns hold them. */
static int32_t as_int(int64_t v) { return (int32_t)(uint32_t)v; }
static int64_t of_int(int32_t v) { return (int64_t)(uint32_t)v; }

/* ---- known slabs (worker thread) --------------------------------------- */

static known_t **known_at(cqlstore_t *st, seg_t *sg, int64_t slab) {
  uint64_t h =
      ((uint64_t)(uintptr_t)sg ^ (uint64_t)slab) * UINT64_C(1099511628211);
  known_t **k = &st->known[(h >> 7) % KNOWN_BUCKETS];
  while (*k && ((*k)->slab != slab || (*k)->seg != sg))
    k = &(*k)->next;
  return k;
}

/* Forgets the known slabs (of `sg`, or all when NULL). */
static void known_clear(cqlstore_t *st, const seg_t *sg) {
  for (size_t i = 0; i < KNOWN_BUCKETS; i++)
    for (known_t **at = &st->known[i]; *at;) {
      known_t *k = *at;
      if (sg && k->seg != sg) {
        at = &k->next;
        continue;
      }
      *at = k->next;
      free(k);
      st->nknown--;
    }
}

static void known_forget(cqlstore_t *st, seg_t *sg, int64_t slab) {
  known_t **at = known_at(st, sg, slab), *k = *at;
  if (k) {
    *at = k->next;
    free(k);
    st->nknown--;
  }
}

static int known_has(cqlstore_t *st, seg_t *sg, int64_t slab, int64_t now_s) {
  known_t *k = *known_at(st, sg, slab);
  return k && k->until_s > now_s;
}

static void known_add(cqlstore_t *st, seg_t *sg, int64_t slab,
                      int64_t until_s) {
  known_t **at = known_at(st, sg, slab), *k = *at;
  if (k) {
    k->until_s = until_s;
    return;
  }
  if (st->nknown >= KNOWN_MAX) { /* forgotten: written again when used */
    known_clear(st, NULL);
    at = known_at(st, sg, slab);
  }
  if (!(k = malloc(sizeof(*k))))
    return; /* written again next time */
  k->seg = sg;
  k->slab = slab;
  k->until_s = until_s;
  k->next = NULL;
  *at = k;
  st->nknown++;
}

/* ---- the key model (worker thread) ------------------------------------- */

static uint64_t key_hash(const seg_t *sg, const char *key,
                         pr__timer_type_t type) {
  uint64_t h = UINT64_C(14695981039346656037) ^ (uint64_t)(uintptr_t)sg ^
               ((uint64_t)type << 56);
  for (const unsigned char *p = (const unsigned char *)key; *p; p++)
    h = (h ^ *p) * UINT64_C(1099511628211);
  return h;
}

static kent_t **kent_at(cqlstore_t *st, const seg_t *sg, const char *key,
                        pr__timer_type_t type) {
  kent_t **e = &st->keys[key_hash(sg, key, type) % KEY_BUCKETS];
  while (*e &&
         ((*e)->seg != sg || (*e)->type != type || strcmp((*e)->key, key)))
    e = &(*e)->next;
  return e;
}

static kent_t *kent_find(cqlstore_t *st, const seg_t *sg, const char *key,
                         pr__timer_type_t type) {
  return *kent_at(st, sg, key, type);
}

static void kent_free(kent_t *e) {
  free(e->t);
  free(e->b);
  free(e);
}

/* Forgets the model (of `sg`, or all when NULL). Only when no group is
 * preparing or in flight: none points at an entry then. */
static void keys_clear(cqlstore_t *st, const seg_t *sg) {
  for (size_t i = 0; i < KEY_BUCKETS; i++)
    for (kent_t **at = &st->keys[i]; *at;) {
      kent_t *e = *at;
      if (sg && e->seg != sg) {
        at = &e->next;
        continue;
      }
      *at = e->next;
      kent_free(e);
      st->nkeys--;
    }
}

/* The entry of (seg, key, type), made K_READING when new; NULL when out of
 * memory. */
static kent_t *kent_get(cqlstore_t *st, seg_t *sg, const char *key,
                        pr__timer_type_t type) {
  kent_t **at = kent_at(st, sg, key, type), *e = *at;
  size_t len = strlen(key);
  if (e)
    return e;
  if (!(e = calloc(1, sizeof(*e) + len + 1)))
    return NULL;
  memcpy(e->key, key, len + 1);
  e->seg = sg;
  e->type = type;
  e->state = K_READING;
  *at = e;
  st->nkeys++;
  return e;
}

/* Index of `time_s` in e->t, or where it goes (then *found 0). */
static size_t tm_find(const kent_t *e, int64_t time_s, int *found) {
  size_t lo = 0, hi = e->n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (e->t[mid].time_s < time_s)
      lo = mid + 1;
    else
      hi = mid;
  }
  *found = lo < e->n && e->t[lo].time_s == time_s;
  return lo;
}

/* Adds (or replaces) a timer in the model: 0, or -1 out of memory. */
static int tm_put(kent_t *e, const tm_t *t) {
  int found;
  size_t i = tm_find(e, t->time_s, &found);
  if (found) {
    e->t[i] = *t;
    return 0;
  }
  if (e->n == e->cap) {
    size_t cap = e->cap ? e->cap * 2 : 2;
    tm_t *g = realloc(e->t, cap * sizeof(*g));
    if (!g)
      return -1;
    e->t = g;
    e->cap = cap;
  }
  memmove(e->t + i + 1, e->t + i, (e->n - i) * sizeof(*e->t));
  e->t[i] = *t;
  e->n++;
  return 0;
}

static void tm_del(kent_t *e, int64_t time_s) {
  int found;
  size_t i = tm_find(e, time_s, &found);
  if (!found)
    return;
  memmove(e->t + i, e->t + i + 1, (e->n - i - 1) * sizeof(*e->t));
  e->n--;
}

/* A random non-zero tag (xorshift64*, worker thread). */
static int32_t new_tag(uint64_t *rng) {
  uint32_t v = 0;
  while (!v) {
    *rng ^= *rng >> 12;
    *rng ^= *rng << 25;
    *rng ^= *rng >> 27;
    v = (uint32_t)((*rng * UINT64_C(2685821657736338717)) >> 32);
  }
  return (int32_t)v;
}

/* ---- values: the span map and the key_timer_state UDT ------------------ */

#define SPAN_MAX (4 + 4 + 11 + 4 + PR_TRACEPARENT_LEN)
#define STATE_MAX (4 + 1 + 4 + 4 + 4 + SPAN_MAX + 4 + 4)

/* The span map of `ctx` into out[SPAN_MAX]; its length. */
static int32_t span_encode(const pr_span_ctx_t *ctx, uint8_t *out) {
  char tp[PR_TRACEPARENT_LEN + 1];
  pr__cql_val_t kv[2];
  if (!ctx || !ctx->valid)
    return pr__cql_encode_elements(out, SPAN_MAX, 0, NULL, 0);
  pr__span_ctx_format(ctx, tp);
  kv[0] = pr__cv_text("traceparent");
  kv[1] = pr__cv_text(tp);
  return pr__cql_encode_elements(out, SPAN_MAX, 1, kv, 2);
}

/* The context of a span map cell (valid false when it has none). */
static void span_decode(const pr__cql_cell_t *c, const pr__cql_type_t *type,
                        pr_span_ctx_t *ctx) {
  pr__cql_cell_t el[16];
  int n = c->len > 0 ? pr__cql_get_elements(c, type, el, 16) : -1;
  ctx->valid = false;
  for (int i = 0; i + 1 < n; i += 2)
    if (el[i].len == 11 && !memcmp(el[i].p, "traceparent", 11) &&
        el[i + 1].len > 0)
      pr__span_ctx_parse((const char *)el[i + 1].p, (size_t)el[i + 1].len, ctx);
}

/* A key_timer_state value into out[STATE_MAX]: inline with `t`, or the
 * overflow marker (t NULL). Its length. */
static int32_t state_encode(const tm_t *t, uint8_t *out) {
  uint8_t span[SPAN_MAX];
  pr__cql_val_t f[4];
  f[0] = pr__cv_bool(t != NULL);
  if (t) {
    f[1] = pr__cv_int(as_int(t->time_s));
    f[2] = pr__cv_blob(span, span_encode(&t->ctx, span));
    f[3] = pr__cv_int(t->tag);
  } else {
    f[1] = f[2] = f[3] = pr__cv_null();
  }
  return pr__cql_encode_elements(out, STATE_MAX, -1, f, 4);
}

/* ---- ops: creation and delivery --------------------------------------- */

/* A new op for the engine-side entry points; NULL after reporting OOM. */
static op_t *op_for(pr__tstore_t *s, const pr__tseg_t *seg, const char *key,
                    int result, void (*start)(op_t *), void *cb, void *arg) {
  op_t *o = op_new((cqlstore_t *)s, seg, key);
  if (!o) {
    if (result == R_DONE)
      ((pr__tstore_done_cb)cb)(arg, PROSODY_ERR_NOMEM, "out of memory");
    else if (result == R_TIMES)
      ((pr__tstore_times_cb)cb)(arg, PROSODY_ERR_NOMEM, "out of memory", NULL,
                                0);
    else if (result == R_RECS)
      ((pr__tstore_recs_cb)cb)(arg, PROSODY_ERR_NOMEM, "out of memory", NULL,
                               0);
    return NULL;
  }
  o->result = result;
  o->start = start;
  o->arg = arg;
  if (result == R_DONE)
    o->done = (pr__tstore_done_cb)cb;
  else if (result == R_TIMES)
    o->times_cb = (pr__tstore_times_cb)cb;
  else if (result == R_RECS)
    o->recs_cb = (pr__tstore_recs_cb)cb;
  return o;
}

/* Runs a finished op's callback, then frees it (engine thread). */
static void op_deliver(pr__cqlw_job_t *j) {
  op_t *o = (op_t *)j;
  prosody_err_t err = o->job.err;
  const char *why = err ? o->job.errstr : NULL;
  if (o->result == R_DONE)
    o->done(o->arg, err, why);
  else if (o->result == R_TIMES)
    o->times_cb(o->arg, err, why, err ? NULL : o->times, err ? 0 : o->n);
  else if (o->result == R_RECS)
    o->recs_cb(o->arg, err, why, err ? NULL : o->recs, err ? 0 : o->nrecs);
  op_free(o);
}

/* ---- segments (worker thread) ------------------------------------------ */

typedef struct segchk {
  cqlstore_t *st;
  seg_t *sg;
  void (*then)(void *arg);
  void *arg;
} segchk_t;

static void seg_refuse(seg_t *sg, const char *why) {
  sg->ready = -1;
  snprintf(sg->why, sizeof(sg->why), "timer segment %s (%s): %s", sg->name,
           "table timer_segments", why);
}

static void seg_written(void *arg, prosody_err_t err, const char *errstr,
                        const pr__cql_result_t *res) {
  segchk_t *c = arg;
  (void)res;
  if (!err)
    c->sg->ready = 1; /* else unknown: checked again by the next op */
  else
    snprintf(c->sg->why, sizeof(c->sg->why), "segment %s: %s", c->sg->name,
             errstr ? errstr : "write failed");
  c->then(c->arg);
  free(c);
}

/* The segment's row read: adopt it, write it, or refuse it. */
static void seg_read(void *arg, prosody_err_t err, const char *errstr,
                     const pr__cql_result_t *res) {
  segchk_t *c = arg;
  cqlstore_t *st = c->st;
  seg_t *sg = c->sg;
  int32_t slab_size, wm;
  int8_t version;
  pr__cql_val_t v[4];
  if (err) {
    snprintf(sg->why, sizeof(sg->why), "segment %s: %s", sg->name,
             errstr ? errstr : "read failed");
    c->then(c->arg);
    free(c);
    return;
  }
  if (res->nrows < 1 || pr__cql_cell(res, 0, 0)->len < 0 ||
      pr__cql_get_int(pr__cql_cell(res, 0, 1), &slab_size)) {
    /* New (or only slab rows, no name yet): write it as version 4. With no
     * row at all, no key of it has timers (both implementations write a
     * segment's row before its first timer): none is read. */
    sg->fresh = res->nrows < 1;
    sg->fresh_gen = st->model_gen;
    v[0] = pr__cv_uuid(sg->id);
    v[1] = pr__cv_text(sg->name);
    v[2] = pr__cv_int(as_int(st->slab_s));
    v[3] = pr__cv_tinyint(SEG_VERSION);
    sg->watermark =
        pr__cql_get_int(pr__cql_cell(res, 0, 3), &wm) ? -1 : of_int(wm);
    pr__cql_execute_stmt(st->cql, st->ins_seg, v, 4, NULL, seg_written, c);
    return;
  }
  sg->watermark =
      pr__cql_get_int(pr__cql_cell(res, 0, 3), &wm) ? -1 : of_int(wm);
  if (pr__cql_get_tinyint(pr__cql_cell(res, 0, 2), &version))
    version = 1; /* the original's first layout had no version column */
  if (version < 3 || version > SEG_VERSION) {
    char why[160];
    snprintf(why, sizeof(why),
             "layout version %d of the original Prosody; Prosody-C supports "
             "versions 3 and 4 (let the original 0.7.x open it once first)",
             version);
    seg_refuse(sg, why);
  } else if (of_int(slab_size) != st->slab_s) {
    char why[160];
    snprintf(why, sizeof(why),
             "written with slab_size %llds, this consumer's is %llds: set "
             "slab_size (PROSODY_SLAB_SIZE) to the segment's",
             (long long)of_int(slab_size), (long long)st->slab_s);
    seg_refuse(sg, why);
  } else if (version == 3) { /* same layout: the original bumps it too */
    v[0] = pr__cv_tinyint(SEG_VERSION);
    v[1] = pr__cv_int(slab_size);
    v[2] = pr__cv_uuid(sg->id);
    pr__cql_execute_stmt(st->cql, st->upd_seg_version, v, 3, NULL, seg_written,
                         c);
    return;
  } else {
    sg->ready = 1;
  }
  c->then(c->arg);
  free(c);
}

/* Checks the segment's row (writing it when absent), then calls `then`:
 * sg->ready is 1, -1 (refused) or 0 (failed: sg->why). */
static void seg_check(cqlstore_t *st, seg_t *sg, void (*then)(void *),
                      void *arg) {
  segchk_t *c = malloc(sizeof(*c));
  pr__cql_val_t v[1];
  if (!c) {
    snprintf(sg->why, sizeof(sg->why), "out of memory");
    then(arg);
    return;
  }
  *c = (segchk_t){st, sg, then, arg};
  v[0] = pr__cv_uuid(sg->id);
  pr__cql_execute_stmt(st->cql, st->sel_seg, v, 1, NULL, seg_read, c);
}

/* ---- groups (worker thread) ------------------------------------------- */

/* A write statement of a group, with its values. */
typedef struct wst {
  pr__cql_stmt_t *stmt;
  uint16_t n;
  int unit; /* statements of one unit share a batch */
  size_t bytes;
  pr__cql_val_t v[9];
  int blob_at;             /* v[blob_at] is `blob` (bound when sent), or -1 */
  uint8_t blob[STATE_MAX]; /* a span map or key_timer_state value */
} wst_t;

struct group {
  cqlstore_t *st;
  size_t n;
  int out;        /* requests not yet answered (+1 while issuing) */
  int waiting;    /* prep waits for nothing in flight */
  group_t *pnext; /* st->prep */
  int phase;      /* prep's next step */
  struct {
    seg_t *seg;
    int64_t slab;
  } slabs[GROUP_MAX]; /* slab rows prep writes */
  size_t nslabs;
  prosody_err_t err;
  char errstr[256];
  size_t nent;
  kent_t **ents; /* entries it touched (GROUP_MAX) */
  wst_t *w;      /* its writes */
  size_t nw, capw;
  op_t *ops[GROUP_MAX]; /* NULL once answered early */
};

static void group_error(group_t *g, prosody_err_t err, const char *errstr) {
  if (!g->err) {
    g->err = err;
    snprintf(g->errstr, sizeof(g->errstr), "%s", errstr ? errstr : "");
  }
}

static int same_key(const op_t *a, const op_t *b) {
  return a->seg == b->seg && a->type == b->type && !strcmp(a->key, b->key);
}

/* 1 if `o` cannot join a group holding `p`: two ops on one timer, or any
 * op on a key the other clears or lists. */
static int conflicts(const op_t *o, const op_t *p) {
  if (!p || !same_key(o, p))
    return 0;
  return o->send == S_DEL_KEY || p->send == S_DEL_KEY || o->send == S_TIMES ||
         p->send == S_TIMES || o->time_s == p->time_s;
}

/* Takes the queue's head op. */
static op_t *q_pop(cqlstore_t *st) {
  op_t *o = st->q_head;
  if (!(st->q_head = o->qnext))
    st->q_tail = NULL;
  st->qlen--;
  return o;
}

static void prep(group_t *g);

static void prep_step_done(void *arg) {
  group_t *g = arg;
  if (--g->out == 0)
    prep(g);
}

static void prep_cb(void *arg, prosody_err_t err, const char *errstr,
                    const pr__cql_result_t *res) {
  group_t *g = arg;
  (void)res;
  if (err)
    group_error(g, err, errstr);
  prep_step_done(g);
}

/* Answers every op of the group with its error, then frees it. */
static void group_free(group_t *g) {
  free(g->w);
  free(g->ents);
  free(g);
}

static void group_answer(group_t *g) {
  for (size_t i = 0; i < g->n; i++)
    if (g->ops[i])
      complete(g->ops[i], g->err, g->err ? g->errstr : NULL);
}

/* A key read of the group: its segment and keys. */
typedef struct kread {
  group_t *g;
  seg_t *sg;
  uint8_t *list; /* the keys, as a list<text> */
  int32_t list_len;
  uint8_t *paging;
  int32_t paging_len;
} kread_t;

static void kread_page(kread_t *r);

/* Rows of the key index: accumulate into the entries being read. */
static void kread_cb(void *arg, prosody_err_t err, const char *errstr,
                     const pr__cql_result_t *res) {
  kread_t *r = arg;
  group_t *g = r->g;
  cqlstore_t *st = g->st;
  char *key = NULL;
  size_t key_cap = 0;
  if (err) {
    group_error(g, err, errstr);
    goto done;
  }
  if (res->ncols < 6 || res->cols[5].type->id != PR_CQL_T_MAP ||
      res->cols[5].type->nsub != 2 ||
      res->cols[5].type->sub[1]->id != PR_CQL_T_UDT ||
      res->cols[5].type->sub[1]->nsub < 3) {
    group_error(g, PROSODY_ERR_PERMANENT,
                "timer_typed_keys.state is not the original Prosody's "
                "map<tinyint, frozen<key_timer_state>>");
    goto done;
  }
  for (int32_t i = 0; i < res->nrows; i++) {
    const pr__cql_cell_t *sc = pr__cql_cell(res, i, 5);
    pr__cql_cell_t el[2 * 16], f[4];
    int8_t type;
    int32_t time, tag;
    int ne;
    kent_t *e;
    const pr__cql_cell_t *kc = pr__cql_cell(res, i, 0);
    if (kc->len < 0)
      continue;
    if ((size_t)kc->len >= key_cap) {
      char *nk = realloc(key, (size_t)kc->len + 1);
      if (!nk) {
        group_error(g, PROSODY_ERR_NOMEM, "out of memory");
        goto done;
      }
      key = nk;
      key_cap = (size_t)kc->len + 1;
    }
    memcpy(key, kc->p, (size_t)kc->len);
    key[kc->len] = '\0';
    /* The static map (the same on each row of the key). */
    ne = sc->len > 0 ? pr__cql_get_elements(sc, res->cols[5].type, el, 32) : 0;
    for (int k = 0; k + 1 < ne; k += 2) {
      int inl = 0;
      if (pr__cql_get_tinyint(&el[k], &type) || type < 0 || type >= NTYPES ||
          !(e = kent_find(st, r->sg, key, (pr__timer_type_t)type)) ||
          e->state != K_READING)
        continue;
      if (pr__cql_get_elements(&el[k + 1], res->cols[5].type->sub[1], f, 4) <
          2) {
        e->found = 2; /* unreadable: the original reads it as overflow */
        continue;
      }
      pr__cql_get_bool(&f[0], &inl);
      if (inl && !pr__cql_get_int(&f[1], &time)) {
        e->found = 1;
        e->found_inl.time_s = of_int(time);
        e->found_inl.tag = pr__cql_get_int(&f[3], &tag) ? 0 : tag;
        e->found_inl.dirty = 0;
        span_decode(&f[2], res->cols[5].type->sub[1]->sub[2],
                    &e->found_inl.ctx);
      } else {
        e->found = 2;
      }
    }
    /* A clustering row. */
    if (pr__cql_get_tinyint(pr__cql_cell(res, i, 1), &type) ||
        pr__cql_get_int(pr__cql_cell(res, i, 2), &time) ||
        pr__cql_cell(res, i, 3)->len < 0 || type < 0 || type >= NTYPES ||
        !(e = kent_find(st, r->sg, key, (pr__timer_type_t)type)) ||
        e->state != K_READING)
      continue;
    {
      tm_t t;
      memset(&t, 0, sizeof(t));
      t.time_s = of_int(time);
      t.tag = pr__cql_get_int(pr__cql_cell(res, i, 4), &tag) ? 0 : tag;
      span_decode(pr__cql_cell(res, i, 3), res->cols[3].type, &t.ctx);
      if (tm_put(e, &t)) {
        group_error(g, PROSODY_ERR_NOMEM, "out of memory");
        goto done;
      }
    }
  }
  free(r->paging);
  r->paging = NULL;
  if (res->paging_len > 0) {
    if (!(r->paging = malloc((size_t)res->paging_len))) {
      group_error(g, PROSODY_ERR_NOMEM, "out of memory");
      goto done;
    }
    memcpy(r->paging, res->paging_state, (size_t)res->paging_len);
    r->paging_len = res->paging_len;
    free(key);
    kread_page(r);
    return;
  }
done:
  free(key);
  free(r->paging);
  free(r->list);
  free(r);
  prep_step_done(g);
}

static void kread_page(kread_t *r) {
  pr__cql_val_t v[2];
  pr__cql_opts_t opts;
  memset(&opts, 0, sizeof(opts));
  opts.page_size = PAGE;
  opts.paging_state = r->paging;
  opts.paging_len = r->paging ? r->paging_len : 0;
  v[0] = pr__cv_uuid(r->sg->id);
  v[1] = pr__cv_blob(r->list, r->list_len);
  pr__cql_execute_stmt(r->g->st->cql, r->g->st->sel_keys, v, 2, &opts, kread_cb,
                       r);
}

/* Reads keys[0, n) of `sg` (distinct) into their K_READING entries. */
static void kread_start(group_t *g, seg_t *sg, const char **keys, size_t n) {
  kread_t *r = calloc(1, sizeof(*r));
  size_t len = 4, at = 4;
  for (size_t i = 0; i < n; i++)
    len += 4 + strlen(keys[i]);
  if (!r || !(r->list = malloc(len))) {
    free(r);
    group_error(g, PROSODY_ERR_NOMEM, "out of memory");
    return;
  }
  for (int b = 0; b < 4; b++)
    r->list[b] = (uint8_t)((uint32_t)n >> (24 - 8 * b));
  for (size_t i = 0; i < n; i++) {
    uint32_t kl = (uint32_t)strlen(keys[i]);
    for (int b = 0; b < 4; b++)
      r->list[at++] = (uint8_t)(kl >> (24 - 8 * b));
    memcpy(r->list + at, keys[i], kl);
    at += kl;
  }
  r->g = g;
  r->sg = sg;
  r->list_len = (int32_t)len;
  g->out++;
  kread_page(r);
}

/* The read is in: each entry read becomes known. */
static void kread_settle(group_t *g) {
  for (size_t i = 0; i < g->n; i++) {
    kent_t *e = g->ops[i] ? g->ops[i]->ent : NULL;
    if (!e || e->state != K_READING)
      continue;
    if (g->err) { /* read again by the next group that needs it */
      e->n = 0;
      e->found = 0;
      e->state = K_STALE;
      continue;
    }
    if (e->found == 1) {
      e->n = 0;
      e->inl = 1;
      if (tm_put(e, &e->found_inl)) {
        e->state = K_STALE; /* out of memory: read again */
        continue;
      }
    } else if (e->found != 2) {
      e->n = 0; /* no entry: no timer (rows without one are not read) */
      e->inl = 0;
    } else {
      e->inl = 0;
    }
    e->found = 0;
    e->state = K_KNOWN;
  }
}

static void decide(group_t *g);

/* The group is prepared (or failed): out of st->prep, its keys free for
 * the next group. */
static void prep_end(group_t *g) {
  cqlstore_t *st = g->st;
  group_t **at = &st->prep;
  while (*at != g)
    at = &(*at)->pnext;
  *at = g->pnext;
  st->nprep--;
  for (size_t i = 0; i < g->n; i++)
    if (g->ops[i] && g->ops[i]->ent && g->ops[i]->ent->pg == g)
      g->ops[i]->ent->pg = NULL;
}

/* Fails a group that has not been decided, and frees it. */
static void prep_fail(group_t *g) {
  cqlstore_t *st = g->st;
  kread_settle(g);
  prep_end(g);
  group_answer(g);
  group_free(g);
  dispatch(st);
}

/* Step 1: the segments' rows (refused ones fail their ops). 1 when
 * requests went out. */
static int prep_segments(group_t *g) {
  for (size_t i = 0; i < g->n; i++) {
    op_t *o = g->ops[i];
    size_t j;
    if (!o)
      continue;
    if (o->seg->ready == -1) {
      complete(o, PROSODY_ERR_PERMANENT, o->seg->why);
      g->ops[i] = NULL;
      continue;
    }
    if (o->seg->ready == 1)
      continue;
    for (j = 0; j < i && !(g->ops[j] && g->ops[j]->seg == o->seg); j++)
      ;
    if (j == i) { /* once per segment */
      g->out++;
      seg_check(g->st, o->seg, prep_step_done, g);
    }
  }
  return g->out > 1;
}

/* Step 2: the keys not known are read. -1 when it must wait for the
 * groups in flight (a key of it is stale), 1 when requests went out. */
static int prep_keys(group_t *g) {
  cqlstore_t *st = g->st;
  const char *keys[READ_KEYS];
  seg_t *sg = NULL;
  size_t nk = 0;
  for (size_t i = 0; i < g->n; i++) {
    op_t *o = g->ops[i];
    if (!o)
      continue;
    if (o->seg->ready == -1) { /* refused by step 1 */
      complete(o, PROSODY_ERR_PERMANENT, o->seg->why);
      g->ops[i] = NULL;
      continue;
    }
    if (o->seg->ready != 1) {
      group_error(g, PROSODY_ERR_TRANSIENT, o->seg->why);
      return 0;
    }
    if (!(o->ent = kent_get(st, o->seg, o->key, o->type))) {
      group_error(g, PROSODY_ERR_NOMEM, "out of memory");
      return 0;
    }
    if (o->ent->state == K_STALE && st->inflight > 0)
      return -1; /* what landed of its writes is read once all are answered */
  }
  for (size_t i = 0; i < g->n; i++) {
    kent_t *e = g->ops[i] ? g->ops[i]->ent : NULL;
    if (!e || e->state == K_KNOWN || e->found == 3)
      continue;
    if (e->state == K_READING && e->seg->fresh &&
        e->seg->fresh_gen == st->model_gen) {
      e->state = K_KNOWN; /* a key of a segment we created: no timer */
      e->n = 0;
      e->inl = 0;
      continue;
    }
    e->state = K_READING;
    e->n = 0;
    e->found = 3; /* asked for */
    if (sg != e->seg || nk == READ_KEYS) {
      if (nk)
        kread_start(g, sg, keys, nk);
      sg = e->seg;
      nk = 0;
    }
    keys[nk++] = e->key;
  }
  if (nk)
    kread_start(g, sg, keys, nk);
  return g->out > 1;
}

/* Step 3: the timer_segments rows of slabs new to the group's puts, each
 * lowering the watermark when at or below it. 1 when a request went out. */
static int prep_slabs(group_t *g) {
  cqlstore_t *st = g->st;
  int64_t now_s = pr__wall_ms() / 1000;
  pr__cql_val_t v[GROUP_MAX * 6];
  pr__cql_bstmt_t b[GROUP_MAX * 2];
  uint16_t nb = 0;
  size_t nv = 0;
  g->nslabs = 0;
  for (size_t i = 0; i < g->n; i++) {
    op_t *o = g->ops[i];
    int64_t slab;
    int32_t ttl;
    size_t j;
    if (!o || o->send != S_PUT)
      continue;
    slab = pr__slab_of(o->time_s, st->slab_s);
    if (known_has(st, o->seg, slab, now_s))
      continue;
    for (j = 0; j < g->nslabs; j++)
      if (g->slabs[j].seg == o->seg && g->slabs[j].slab == slab)
        break;
    if (j < g->nslabs)
      continue;
    g->slabs[g->nslabs].seg = o->seg;
    g->slabs[g->nslabs++].slab = slab;
    ttl = ttl_for(st, slab_end(st, slab));
    v[nv] = pr__cv_uuid(o->seg->id);
    v[nv + 1] = pr__cv_int(as_int(slab));
    v[nv + 2] = pr__cv_int(ttl);
    b[nb++] = (pr__cql_bstmt_t){st->ins_slab, v + nv, 3};
    nv += 3;
    if (o->seg->watermark >= 0 && slab <= o->seg->watermark) {
      v[nv] = pr__cv_int(ttl);
      v[nv + 1] = slab > 0 ? pr__cv_int(as_int(slab - 1)) : pr__cv_null();
      v[nv + 2] = pr__cv_uuid(o->seg->id);
      b[nb++] = (pr__cql_bstmt_t){st->set_watermark, v + nv, 3};
      nv += 3;
      o->seg->watermark = slab - 1; /* -1: null */
    }
  }
  if (!nb)
    return 0;
  g->out++;
  pr__cql_batch_run(st->cql, PR_CQL_BATCH_UNLOGGED, b, nb, prep_cb, g);
  return 1;
}

/* Prepares the group (see the top of the file): runs its steps in turn;
 * a step's requests call it again once all are answered. */
static void prep(group_t *g) {
  cqlstore_t *st = g->st;
  int r = 0;
  g->out = 1; /* while issuing */
  if (st->closing)
    group_error(g, PROSODY_ERR_STATE, "the Cassandra store is closed");
  while (!g->err && g->phase < 4 && !r) {
    switch (g->phase++) {
    case 0:
      r = prep_segments(g);
      break;
    case 1:
      r = prep_keys(g);
      if (r < 0) {
        g->phase--;
        g->waiting = 1; /* dispatch() calls prep() again */
        g->out--;
        return;
      }
      break;
    case 2:
      kread_settle(g);
      r = prep_slabs(g);
      break;
    default: {
      int64_t now_s = pr__wall_ms() / 1000;
      for (size_t j = 0; j < g->nslabs; j++)
        known_add(st, g->slabs[j].seg, g->slabs[j].slab,
                  now_s + ttl_for(st, slab_end(st, g->slabs[j].slab)) -
                      KNOWN_MARGIN_S);
      g->nslabs = 0;
      break;
    }
    }
  }
  if (--g->out > 0)
    return;
  if (g->err) {
    prep_fail(g);
    return;
  }
  if (g->phase < 4) {
    prep(g);
    return;
  }
  prep_end(g);
  decide(g);
}

/* A new write statement of the group (NULL out of memory). */
static wst_t *wst_add(group_t *g, pr__cql_stmt_t *stmt, int unit) {
  wst_t *w;
  if (g->nw == g->capw) {
    size_t cap = g->capw ? g->capw * 2 : 64;
    wst_t *n = realloc(g->w, cap * sizeof(*n));
    if (!n)
      return NULL;
    g->w = n;
    g->capw = cap;
  }
  w = &g->w[g->nw++];
  w->stmt = stmt;
  w->unit = unit;
  w->n = 0;
  w->bytes = 0;
  w->blob_at = -1;
  return w;
}

/* A value of `w` over bytes it keeps (copied; bound to them when sent,
 * since g->w moves as it grows). */
static int wst_blob(wst_t *w, const uint8_t *p, int32_t len) {
  if (len < 0 || (size_t)len > sizeof(w->blob) || w->blob_at >= 0)
    return -1;
  memcpy(w->blob, p, (size_t)len);
  w->blob_at = w->n;
  w->v[w->n++] = pr__cv_blob(NULL, len);
  w->bytes += (size_t)len;
  return 0;
}

/* The timer_typed_slabs row of (key, t) of `e`: written or deleted. */
static int slab_row(group_t *g, const kent_t *e, const tm_t *t, int del,
                    int unit) {
  cqlstore_t *st = g->st;
  int64_t slab = pr__slab_of(t->time_s, st->slab_s);
  wst_t *w = wst_add(g, del ? st->del_trigger : st->ins_trigger, unit);
  uint8_t span[SPAN_MAX];
  if (!w)
    return -1;
  w->v[w->n++] = pr__cv_uuid(e->seg->id);
  w->v[w->n++] = pr__cv_int(as_int(st->slab_s));
  w->v[w->n++] = pr__cv_int(as_int(slab));
  w->v[w->n++] = pr__cv_tinyint((int8_t)e->type);
  w->v[w->n++] = pr__cv_text(e->key);
  w->v[w->n++] = pr__cv_int(as_int(t->time_s));
  w->bytes = 64 + strlen(e->key);
  if (del)
    return 0;
  if (wst_blob(w, span, span_encode(&t->ctx, span)))
    return -1;
  w->v[w->n++] = pr__cv_int(t->tag);
  w->v[w->n++] = pr__cv_int(ttl_for(st, slab_end(st, slab)));
  return 0;
}

/* The key index's first three values: segment, key (and type). */
static void key_vals(wst_t *w, const kent_t *e, int with_type) {
  w->v[w->n++] = pr__cv_uuid(e->seg->id);
  w->v[w->n++] = pr__cv_text(e->key);
  if (with_type)
    w->v[w->n++] = pr__cv_tinyint((int8_t)e->type);
  w->bytes = 64 + strlen(e->key);
}

/* Writes state[type] (inline `t`, or the overflow marker: NULL) with the
 * TTL of `ttl_time`. */
static int set_state(group_t *g, const kent_t *e, const tm_t *t,
                     int64_t ttl_time, int unit) {
  cqlstore_t *st = g->st;
  wst_t *w = wst_add(g, st->set_state, unit);
  uint8_t buf[STATE_MAX];
  if (!w)
    return -1;
  w->v[w->n++] = pr__cv_int(ttl_for(st, ttl_time));
  w->v[w->n++] = pr__cv_tinyint((int8_t)e->type);
  if (wst_blob(w, buf, state_encode(t, buf)))
    return -1;
  w->v[w->n++] = pr__cv_uuid(e->seg->id);
  w->v[w->n++] = pr__cv_text(e->key);
  w->bytes += 64 + strlen(e->key);
  return 0;
}

static int del_state(group_t *g, const kent_t *e, int unit) {
  wst_t *w = wst_add(g, g->st->del_state, unit);
  if (!w)
    return -1;
  w->v[w->n++] = pr__cv_tinyint((int8_t)e->type);
  w->v[w->n++] = pr__cv_uuid(e->seg->id);
  w->v[w->n++] = pr__cv_text(e->key);
  w->bytes = 64 + strlen(e->key);
  return 0;
}

static int key_row(group_t *g, const kent_t *e, const tm_t *t, int del,
                   int unit) {
  cqlstore_t *st = g->st;
  wst_t *w = wst_add(g, del ? st->del_row : st->ins_row, unit);
  uint8_t span[SPAN_MAX];
  if (!w)
    return -1;
  key_vals(w, e, 1);
  w->v[w->n++] = pr__cv_int(as_int(t->time_s));
  if (del)
    return 0;
  if (wst_blob(w, span, span_encode(&t->ctx, span)))
    return -1;
  w->v[w->n++] = pr__cv_int(t->tag);
  w->v[w->n++] = pr__cv_int(ttl_for(st, t->time_s));
  return 0;
}

static int in_set(const tm_t *t, size_t n, int64_t time_s) {
  for (size_t i = 0; i < n; i++)
    if (t[i].time_s == time_s)
      return 1;
  return 0;
}

/* The key index writes that take entry `e` from its state before the group
 * (e->b, e->bn, e->binl) to its model now, as one unit. */
static int key_writes(group_t *g, kent_t *e, int unit) {
  const tm_t *a = e->t, *b = e->b;
  size_t n = e->n, bn = e->bn;
  int overflow_before = bn > 0 && !e->binl;
  if (n == 0) {
    if (bn == 0)
      return 0;
    if (overflow_before && bn > 8) {
      wst_t *w = wst_add(g, g->st->del_rows, unit);
      if (!w)
        return -1;
      key_vals(w, e, 1);
    } else if (overflow_before) {
      for (size_t i = 0; i < bn; i++)
        if (key_row(g, e, &b[i], 1, unit))
          return -1;
    }
    return del_state(g, e, unit);
  }
  if (n == 1) {
    if (!(e->binl && bn == 1 && b[0].time_s == a[0].time_s && !a[0].dirty) &&
        set_state(g, e, &a[0], a[0].time_s, unit))
      return -1;
    if (overflow_before && bn > 8) {
      wst_t *w = wst_add(g, g->st->del_rows, unit);
      if (!w)
        return -1;
      key_vals(w, e, 1);
      return 0;
    }
    for (size_t i = 0; overflow_before && i < bn; i++)
      if (key_row(g, e, &b[i], 1, unit))
        return -1;
    return 0;
  }
  /* Two or more: clustering rows, and the overflow marker. */
  for (size_t i = 0; i < n; i++)
    if ((!overflow_before || a[i].dirty || !in_set(b, bn, a[i].time_s)) &&
        key_row(g, e, &a[i], 0, unit))
      return -1;
  for (size_t i = 0; overflow_before && i < bn; i++)
    if (!in_set(a, n, b[i].time_s) && key_row(g, e, &b[i], 1, unit))
      return -1;
  if ((!overflow_before || a[n - 1].time_s > b[bn - 1].time_s) &&
      set_state(g, e, NULL, a[n - 1].time_s, unit))
    return -1;
  return 0;
}

/* A batch of the group is answered. */
static void write_cb(void *arg, prosody_err_t err, const char *errstr,
                     const pr__cql_result_t *res);

static void group_written(group_t *g) {
  cqlstore_t *st = g->st;
  if (g->err) /* what landed is unknown: read those keys again */
    for (size_t i = 0; i < g->nent; i++)
      g->ents[i]->state = K_STALE;
  group_answer(g);
  group_free(g);
  st->inflight--;
  dispatch(st);
}

static void write_cb(void *arg, prosody_err_t err, const char *errstr,
                     const pr__cql_result_t *res) {
  group_t *g = arg;
  (void)res;
  if (err)
    group_error(g, err, errstr);
  if (--g->out == 0)
    group_written(g);
}

/* Sends the group's writes as unlogged batches of about BATCH_BYTES, a
 * unit's statements in one. */
static void send_writes(group_t *g) {
  cqlstore_t *st = g->st;
  pr__cql_bstmt_t *b = malloc((g->nw + 1) * sizeof(*b));
  size_t from = 0;
  if (!b && g->nw) {
    group_error(g, PROSODY_ERR_NOMEM, "out of memory");
    return;
  }
  while (from < g->nw) {
    size_t to = from, bytes = 0;
    while (to < g->nw) {
      size_t end = to;
      while (end < g->nw && g->w[end].unit == g->w[to].unit)
        bytes += g->w[end++].bytes;
      if (to > from && bytes > BATCH_BYTES)
        break;
      to = end;
    }
    for (size_t i = from; i < to; i++) {
      wst_t *w = &g->w[i];
      if (w->blob_at >= 0)
        w->v[w->blob_at].p = w->blob;
      b[i - from] = (pr__cql_bstmt_t){w->stmt, w->v, w->n};
    }
    g->out++;
    pr__cql_batch_run(st->cql, PR_CQL_BATCH_UNLOGGED, b, (uint16_t)(to - from),
                      write_cb, g);
    from = to;
  }
  free(b);
}

/* Applies the group's ops to the model, in order, and sends the writes
 * that take the stored state there. */
static void decide(group_t *g) {
  cqlstore_t *st = g->st;
  int unit = 0;
  st->inflight++;
  g->out = 1;
  if (!(g->ents = malloc(GROUP_MAX * sizeof(*g->ents)))) {
    group_error(g, PROSODY_ERR_NOMEM, "out of memory");
    goto sent;
  }
  for (size_t i = 0; i < g->n; i++) {
    op_t *o = g->ops[i];
    kent_t *e = o ? o->ent : NULL;
    tm_t t;
    if (!e)
      continue;
    if (e->touched != g) {
      e->touched = g;
      e->bn = e->n;
      e->binl = e->inl;
      free(e->b);
      e->b = NULL;
      if (e->n && !(e->b = malloc(e->n * sizeof(*e->b)))) {
        group_error(g, PROSODY_ERR_NOMEM, "out of memory");
        goto sent;
      }
      if (e->n)
        memcpy(e->b, e->t, e->n * sizeof(*e->b));
      g->ents[g->nent++] = e;
    }
    switch (o->send) {
    case S_PUT:
      memset(&t, 0, sizeof(t));
      t.time_s = o->time_s;
      t.tag = new_tag(&st->rng);
      t.ctx = o->ctx;
      t.dirty = 1;
      if (tm_put(e, &t) || slab_row(g, e, &t, 0, unit++)) {
        group_error(g, PROSODY_ERR_NOMEM, "out of memory");
        goto sent;
      }
      break;
    case S_DEL:
      memset(&t, 0, sizeof(t));
      t.time_s = o->time_s;
      tm_del(e, o->time_s);
      if (slab_row(g, e, &t, 1, unit++)) {
        group_error(g, PROSODY_ERR_NOMEM, "out of memory");
        goto sent;
      }
      break;
    case S_DEL_KEY:
      for (size_t k = e->n; k-- > 0;)
        if (e->t[k].time_s != o->keep_s) {
          if (slab_row(g, e, &e->t[k], 1, unit++)) {
            group_error(g, PROSODY_ERR_NOMEM, "out of memory");
            goto sent;
          }
          tm_del(e, e->t[k].time_s);
        }
      break;
    default: /* S_TIMES: the times as of this point of the group */
      if (e->n && !(o->times = malloc(e->n * sizeof(*o->times)))) {
        complete(o, PROSODY_ERR_NOMEM, "out of memory");
        g->ops[i] = NULL;
        break;
      }
      for (size_t k = 0; k < e->n; k++)
        o->times[o->n++] = e->t[k].time_s;
      break;
    }
  }
  for (size_t i = 0; i < g->nent; i++) {
    kent_t *e = g->ents[i];
    if (key_writes(g, e, unit++)) {
      group_error(g, PROSODY_ERR_NOMEM, "out of memory");
      goto sent;
    }
    e->inl = e->n == 1;
    for (size_t k = 0; k < e->n; k++)
      e->t[k].dirty = 0;
    free(e->b);
    e->b = NULL;
    e->touched = NULL;
  }
  if (!st->closing)
    send_writes(g);
  else
    group_error(g, PROSODY_ERR_STATE, "the Cassandra store is closed");
sent:
  if (--g->out == 0)
    group_written(g);
}

/* Takes the queue's head run of group ops as a group and starts it; 0
 * when the head op's key is held by a group preparing (it waits). */
static int send_group(cqlstore_t *st) {
  group_t *g = calloc(1, sizeof(*g));
  if (!g) {
    complete(q_pop(st), PROSODY_ERR_NOMEM, "out of memory");
    return 1;
  }
  g->st = st;
  while (st->q_head && st->q_head->send != S_ALONE && g->n < GROUP_MAX) {
    op_t *o = st->q_head;
    kent_t *e = kent_get(st, o->seg, o->key, o->type);
    size_t i;
    if (!e) {
      complete(q_pop(st), PROSODY_ERR_NOMEM, "out of memory");
      continue;
    }
    if (e->pg && e->pg != g)
      break; /* its key is another group's until that one is decided */
    for (i = 0; i < g->n; i++)
      if (conflicts(o, g->ops[i]))
        break;
    if (i < g->n)
      break; /* ... goes out in the next group */
    e->pg = g;
    o->ent = e; /* only an op in a group points at an entry */
    g->ops[g->n++] = q_pop(st);
  }
  if (!g->n) {
    free(g);
    return 0;
  }
  g->pnext = st->prep;
  st->prep = g;
  st->nprep++;
  prep(g);
  return 1;
}

/* Sends the queue from its head (see the top of the file). */
static void dispatch(cqlstore_t *st) {
  if (st->dispatching) {
    st->again = 1;
    return;
  }
  st->dispatching = 1;
  do {
    st->again = 0;
    for (group_t *g = st->prep; g && st->inflight == 0; g = g->pnext)
      if (g->waiting) { /* (prep() may end it: start over) */
        g->waiting = 0;
        prep(g);
        st->again = 1;
        break;
      }
    while (st->q_head && !st->retiring) {
      op_t *o = st->q_head;
      if (st->closing) {
        complete(q_pop(st), PROSODY_ERR_STATE, "the Cassandra store is closed");
        continue;
      }
      if (o->send == S_ALONE) {
        if (st->inflight > 0 || st->prep)
          break; /* it sees every write posted before it */
        q_pop(st)->start(o);
        continue;
      }
      if (st->inflight >=
          (st->qlen >= GROUP_MAX ? GROUPS_INFLIGHT_MAX : GROUPS_INFLIGHT))
        break; /* what arrives meanwhile joins the next group */
      if (st->nprep >= PREP_MAX)
        break;
      if (st->nkeys > KEYS_MAX) { /* bounded: dropped, then read again */
        if (st->inflight > 0 || st->prep)
          break; /* ... once nothing points at an entry */
        keys_clear(st, NULL);
        st->model_gen++; /* what we wrote is no longer known */
      }
      if (!send_group(st))
        break; /* its key is being read */
    }
  } while (st->again);
  st->dispatching = 0;
}

/* ---- the entry points (engine thread) --------------------------------- */

/* Posts an operation on one key (and type). */
static void post_key(pr__tstore_t *s, const pr__tseg_t *seg, const char *key,
                     int64_t time_s, pr__timer_type_t type, int send,
                     const pr_span_ctx_t *ctx, int result, void *cb,
                     void *arg) {
  op_t *o = op_for(s, seg, key, result, NULL, cb, arg);
  if (o) {
    o->time_s = time_s;
    o->keep_s = time_s;
    o->type = type;
    o->send = send;
    if (ctx && ctx->valid)
      o->ctx = *ctx;
    post(o);
  }
}

static void c_put(pr__tstore_t *s, const pr__tseg_t *seg, const char *key,
                  int64_t time_s, pr__timer_type_t type,
                  const pr_span_ctx_t *ctx, pr__tstore_done_cb cb, void *arg) {
  post_key(s, seg, key, time_s, type, S_PUT, ctx, R_DONE, (void *)cb, arg);
}

static void c_del(pr__tstore_t *s, const pr__tseg_t *seg, const char *key,
                  int64_t time_s, pr__timer_type_t type, pr__tstore_done_cb cb,
                  void *arg) {
  post_key(s, seg, key, time_s, type, S_DEL, NULL, R_DONE, (void *)cb, arg);
}

static void c_del_key(pr__tstore_t *s, const pr__tseg_t *seg, const char *key,
                      pr__timer_type_t type, int64_t keep_s,
                      pr__tstore_done_cb cb, void *arg) {
  post_key(s, seg, key, keep_s, type, S_DEL_KEY, NULL, R_DONE, (void *)cb, arg);
}

static void c_key_times(pr__tstore_t *s, const pr__tseg_t *seg, const char *key,
                        pr__timer_type_t type, pr__tstore_times_cb cb,
                        void *arg) {
  post_key(s, seg, key, -1, type, S_TIMES, NULL, R_TIMES, (void *)cb, arg);
}

/* ---- slab listing and loading (worker thread, alone) ------------------ */

static int keep_paging(op_t *o, const pr__cql_result_t *res) {
  free(o->paging);
  o->paging = NULL;
  o->paging_len = 0;
  if (res->paging_len <= 0)
    return 0;
  if (!(o->paging = malloc((size_t)res->paging_len)))
    return -1;
  memcpy(o->paging, res->paging_state, (size_t)res->paging_len);
  o->paging_len = res->paging_len;
  return 1;
}

static pr__cql_opts_t page_opts(const op_t *o) {
  pr__cql_opts_t opts;
  memset(&opts, 0, sizeof(opts));
  opts.page_size = PAGE;
  opts.paging_state = o->paging;
  opts.paging_len = o->paging_len;
  return opts;
}

/* Runs `go` once the op's segment is checked, or fails the op. */
static void with_seg(op_t *o, void (*go)(op_t *o));

typedef struct segwait {
  op_t *o;
  void (*go)(op_t *o);
} segwait_t;

static void seg_then(void *arg) {
  segwait_t *sw = arg;
  op_t *o = sw->o;
  void (*go)(op_t *) = sw->go;
  free(sw);
  if (o->seg->ready == 1)
    go(o);
  else
    complete(o,
             o->seg->ready < 0 ? PROSODY_ERR_PERMANENT : PROSODY_ERR_TRANSIENT,
             o->seg->why);
}

static void with_seg(op_t *o, void (*go)(op_t *o)) {
  segwait_t *sw;
  if (o->st->closing) {
    complete(o, PROSODY_ERR_STATE, "the Cassandra store is closed");
    return;
  }
  if (o->seg->ready == 1) {
    go(o);
    return;
  }
  if (o->seg->ready < 0 || !(sw = malloc(sizeof(*sw)))) {
    complete(o, o->seg->ready < 0 ? PROSODY_ERR_PERMANENT : PROSODY_ERR_NOMEM,
             o->seg->ready < 0 ? o->seg->why : "out of memory");
    return;
  }
  *sw = (segwait_t){o, go};
  seg_check(o->st, o->seg, seg_then, sw);
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? -1 : x > y;
}

static void slabs_page(op_t *o);

static void slabs_cb(void *arg, prosody_err_t err, const char *errstr,
                     const pr__cql_result_t *res) {
  op_t *o = arg;
  int more;
  if (err) {
    complete(o, err, errstr);
    return;
  }
  for (int32_t i = 0; i < res->nrows; i++) {
    int32_t id;
    if (pr__cql_get_int(pr__cql_cell(res, i, 0), &id))
      continue; /* the static-only row */
    if (o->n == o->cap) {
      size_t cap = o->cap ? o->cap * 2 : 64;
      int64_t *g = realloc(o->times, cap * sizeof(*g));
      if (!g) {
        complete(o, PROSODY_ERR_NOMEM, "out of memory");
        return;
      }
      o->times = g;
      o->cap = cap;
    }
    o->times[o->n++] = of_int(id);
  }
  more = keep_paging(o, res);
  if (more < 0) {
    complete(o, PROSODY_ERR_NOMEM, "out of memory");
  } else if (more) {
    slabs_page(o);
  } else {
    if (o->n > 1) /* int order differs past 2^31 */
      qsort(o->times, o->n, sizeof(*o->times), cmp_i64);
    complete(o, PROSODY_OK, NULL);
  }
}

/* The segment's slab ids above its watermark (the original's invariant:
 * none is at or below it). */
static void slabs_page(op_t *o) {
  pr__cql_val_t v[2];
  pr__cql_opts_t opts = page_opts(o);
  v[0] = pr__cv_uuid(o->seg->id);
  v[1] = pr__cv_int(as_int(o->seg->watermark));
  if (o->seg->watermark >= 0 && o->seg->watermark < INT32_MAX)
    pr__cql_execute_stmt(o->st->cql, o->st->sel_slabs_above, v, 2, &opts,
                         slabs_cb, o);
  else
    pr__cql_execute_stmt(o->st->cql, o->st->sel_slabs, v, 1, &opts, slabs_cb,
                         o);
}

static void start_slabs(op_t *o) { with_seg(o, slabs_page); }

static void c_slabs(pr__tstore_t *s, const pr__tseg_t *seg, int64_t slab_s,
                    pr__tstore_times_cb cb, void *arg) {
  op_t *o = op_for(s, seg, NULL, R_TIMES, start_slabs, (void *)cb, arg);
  (void)slab_s; /* the store's own, which every segment it uses has */
  if (o)
    post(o);
}

static void load_page(op_t *o);

static void load_cb(void *arg, prosody_err_t err, const char *errstr,
                    const pr__cql_result_t *res) {
  op_t *o = arg;
  int more;
  if (err) {
    complete(o, err, errstr);
    return;
  }
  for (int32_t i = 0; i < res->nrows; i++) {
    const pr__cql_cell_t *kc = pr__cql_cell(res, i, 0);
    pr__trec_t *rec;
    char *key;
    int32_t t;
    int8_t type;
    if (!kc->p || kc->len < 0 || pr__cql_get_int(pr__cql_cell(res, i, 1), &t) ||
        pr__cql_get_tinyint(pr__cql_cell(res, i, 2), &type))
      continue;
    if (o->nrecs == o->caprecs) {
      size_t cap = o->caprecs ? o->caprecs * 2 : 64;
      pr__trec_t *g = realloc(o->recs, cap * sizeof(*g));
      if (!g)
        goto oom;
      o->recs = g;
      o->caprecs = cap;
    }
    if (!(key = malloc((size_t)kc->len + 1)))
      goto oom;
    memcpy(key, kc->p, (size_t)kc->len); /* keys of any length */
    key[kc->len] = '\0';
    rec = &o->recs[o->nrecs++];
    rec->key = key;
    rec->time_s = of_int(t);
    rec->type = (pr__timer_type_t)type;
    span_decode(pr__cql_cell(res, i, 3), res->cols[3].type, &rec->ctx);
  }
  more = keep_paging(o, res);
  if (more < 0)
    goto oom;
  if (more) {
    load_page(o);
    return;
  }
  complete(o, PROSODY_OK, NULL);
  return;
oom:
  complete(o, PROSODY_ERR_NOMEM, "out of memory loading timers");
}

static void load_page(op_t *o) {
  pr__cql_val_t v[3];
  pr__cql_opts_t opts = page_opts(o);
  v[0] = pr__cv_uuid(o->seg->id);
  v[1] = pr__cv_int(as_int(o->st->slab_s));
  v[2] = pr__cv_int(as_int(o->slab));
  pr__cql_execute_stmt(o->st->cql, o->st->sel_slab, v, 3, &opts, load_cb, o);
}

static void start_load(op_t *o) { with_seg(o, load_page); }

static void c_load_slab(pr__tstore_t *s, const pr__tseg_t *seg, int64_t slab_s,
                        int64_t slab, pr__tstore_recs_cb cb, void *arg) {
  op_t *o = op_for(s, seg, NULL, R_RECS, start_load, (void *)cb, arg);
  (void)slab_s;
  if (o) {
    o->slab = slab;
    post(o);
  }
}

/* The partition left: its next owner may change its rows, so forget what
 * we know of them (nothing is in flight or preparing: this op is alone). */
static void start_release(op_t *o) {
  cqlstore_t *st = o->st;
  keys_clear(st, o->seg);
  known_clear(st, o->seg);
  o->seg->ready = 0;
  o->seg->fresh = 0;
  o->seg->watermark = -1;
  complete(o, PROSODY_OK, NULL);
}

static void c_release(pr__tstore_t *s, const pr__tseg_t *seg) {
  op_t *o = op_for(s, seg, NULL, R_NONE, start_release, NULL, NULL);
  if (o)
    post(o); /* out of memory: the model stays (as before any release) */
}

/* ---- retiring slabs (worker thread, alone) ----------------------------- */

#define RETIRE_BATCH 100 /* slab row deletes per batch (one partition) */

static void retire_next(op_t *o);

/* The retire is over: what queued behind it starts. */
static void retire_end(op_t *o, prosody_err_t err, const char *errstr) {
  cqlstore_t *st = o->st;
  if (err && o->time_s >= 0 && o->seg->watermark == o->time_s)
    o->seg->watermark = o->keep_s; /* (the raise may not have landed) */
  st->retiring = 0;
  complete(o, err, errstr);
  dispatch(st);
}

static void retire_cb(void *arg, prosody_err_t err, const char *errstr,
                      const pr__cql_result_t *res) {
  op_t *o = arg;
  (void)res;
  if (err)
    retire_end(o, err, errstr);
  else if (o->slab < (int64_t)o->n || o->wm_left)
    retire_next(o);
  else
    retire_end(o, PROSODY_OK, NULL);
}

/* The next batch: up to RETIRE_BATCH slab rows, the last one with the
 * watermark (o->slab: the next slab's index; o->time_s: the raised
 * watermark, or -1; o->keep_s: the one before). Deletes come first:
 * a watermark written before them would hide rows that are still to be
 * deleted, never live ones. */
static void retire_next(op_t *o) {
  cqlstore_t *st = o->st;
  pr__cql_val_t v[RETIRE_BATCH * 2 + 3];
  pr__cql_bstmt_t b[RETIRE_BATCH + 1];
  uint16_t nb = 0;
  size_t nv = 0;
  while (o->slab < (int64_t)o->n && nb < RETIRE_BATCH) {
    v[nv] = pr__cv_uuid(o->seg->id);
    v[nv + 1] = pr__cv_int(as_int(o->times[o->slab++]));
    b[nb++] = (pr__cql_bstmt_t){st->del_slab, v + nv, 2};
    nv += 2;
  }
  if (o->slab >= (int64_t)o->n && o->wm_left) {
    v[nv] = pr__cv_int(ttl_for(st, slab_end(st, o->time_s + 1)));
    v[nv + 1] = pr__cv_int(as_int(o->time_s));
    v[nv + 2] = pr__cv_uuid(o->seg->id);
    b[nb++] = (pr__cql_bstmt_t){st->set_watermark, v + nv, 3};
    o->wm_left = 0;
  }
  pr__cql_batch_run(st->cql, PR_CQL_BATCH_UNLOGGED, b, nb, retire_cb, o);
}

/* Alone: every write before it is answered, nothing after it starts
 * until it is (st->retiring), and the puts after it see the slabs
 * forgotten (they write the rows again) and the raised watermark (they
 * lower it again). */
static void retire_go(op_t *o) {
  for (size_t i = 0; i < o->n; i++)
    known_forget(o->st, o->seg, o->times[i]);
  o->keep_s = o->seg->watermark;
  if (o->time_s > o->seg->watermark)
    o->seg->watermark = o->time_s;
  else
    o->time_s = -1; /* not a raise */
  o->wm_left = o->time_s >= 0;
  o->slab = 0;
  if (!o->n && o->time_s < 0) {
    complete(o, PROSODY_OK, NULL);
    return;
  }
  o->st->retiring = 1;
  retire_next(o);
}

static void start_retire(op_t *o) { with_seg(o, retire_go); }

static void c_retire(pr__tstore_t *s, const pr__tseg_t *seg,
                     const int64_t *slabs, size_t n, int64_t watermark,
                     pr__tstore_done_cb cb, void *arg) {
  op_t *o = op_for(s, seg, NULL, R_DONE, start_retire, (void *)cb, arg);
  if (!o)
    return;
  if (n && !(o->times = malloc(n * sizeof(*slabs)))) {
    op_free(o);
    cb(arg, PROSODY_ERR_NOMEM, "out of memory");
    return;
  }
  if (n)
    memcpy(o->times, slabs, n * sizeof(*slabs));
  o->n = n;
  o->time_s = watermark;
  post(o);
}

static void c_poll(pr__tstore_t *s) { pr__cqlw_poll(((cqlstore_t *)s)->w); }

/* Stops the worker, then delivers what finished (engine thread). */
static void c_destroy(pr__tstore_t *s) {
  cqlstore_t *st = (cqlstore_t *)s;
  pr__cqlw_free(st->w);
  known_clear(st, NULL);
  if (st->keys)
    keys_clear(st, NULL);
  free(st->keys);
  while (st->spare) {
    op_t *o = st->spare;
    st->spare = o->qnext;
    free(o);
  }
  for (size_t i = 0; i < SEG_BUCKETS; i++)
    while (st->segs[i]) {
      seg_t *sg = st->segs[i];
      st->segs[i] = sg->next;
      free(sg);
    }
  free(st->group);
  free(st);
}

static const pr__tstore_ops_t cqlstore_ops = {
    c_put,       c_del,     c_del_key, c_key_times, c_slabs,
    c_load_slab, c_release, c_poll,    c_destroy,   c_retire};

pr__tstore_t *pr__cqlstore_new(pr__cqlw_t *w, const char *keyspace,
                               const char *group, int64_t slab_s,
                               int64_t retention_s, char *errstr,
                               size_t errstr_size) {
  cqlstore_t *st = calloc(1, sizeof(*st));
  char q[512];
  if (!st || !(st->group = strdup(group)) ||
      !(st->keys = calloc(KEY_BUCKETS, sizeof(*st->keys)))) {
    if (st)
      free(st->group);
    free(st);
    pr__errf(errstr, errstr_size, "out of memory");
    return NULL;
  }
  st->base.ops = &cqlstore_ops;
  st->slab_s = slab_s;
  st->retention_s = retention_s;
  st->rng = (uint64_t)pr__wall_ms() * UINT64_C(0x9E3779B97F4A7C15) ^
            (uint64_t)(uintptr_t)st;
  st->rng = st->rng ? st->rng : 1;
  st->w = pr__cqlw_ref(w);
  st->cql = pr__cqlw_cql(st->w);
#define STMT(field, ...)                                                       \
  do {                                                                         \
    snprintf(q, sizeof(q), __VA_ARGS__);                                       \
    if (!(st->field = pr__cql_stmt(st->cql, q)))                               \
      goto oom;                                                                \
  } while (0)
  /* The segment's statics, read on the live tail of the partition (the
   * original's reverse scan: deleted slab rows sit at its low end). */
  STMT(sel_seg,
       "SELECT name, slab_size, version, slab_watermark FROM "
       "%s.timer_segments WHERE id = ? ORDER BY slab_id DESC LIMIT 1",
       keyspace);
  STMT(ins_seg,
       "INSERT INTO %s.timer_segments (id, name, slab_size, version) VALUES "
       "(?, ?, ?, ?)",
       keyspace);
  STMT(upd_seg_version,
       "UPDATE %s.timer_segments SET version = ?, slab_size = ? WHERE id = ?",
       keyspace);
  STMT(ins_slab,
       "INSERT INTO %s.timer_segments (id, slab_id) VALUES (?, ?) USING TTL ?",
       keyspace);
  STMT(set_watermark,
       "UPDATE %s.timer_segments USING TTL ? SET slab_watermark = ? WHERE id "
       "= ?",
       keyspace);
  STMT(del_slab, "DELETE FROM %s.timer_segments WHERE id = ? AND slab_id = ?",
       keyspace);
  STMT(sel_slabs, "SELECT slab_id FROM %s.timer_segments WHERE id = ?",
       keyspace);
  STMT(sel_slabs_above,
       "SELECT slab_id FROM %s.timer_segments WHERE id = ? AND slab_id > ?",
       keyspace);
  STMT(ins_trigger,
       "INSERT INTO %s.timer_typed_slabs (segment_id, slab_size, id, "
       "timer_type, key, time, span, tag) VALUES (?, ?, ?, ?, ?, ?, ?, ?) "
       "USING TTL ?",
       keyspace);
  STMT(del_trigger,
       "DELETE FROM %s.timer_typed_slabs WHERE segment_id = ? AND slab_size = "
       "? AND id = ? AND timer_type = ? AND key = ? AND time = ?",
       keyspace);
  STMT(sel_slab,
       "SELECT key, time, timer_type, span, tag FROM %s.timer_typed_slabs "
       "WHERE segment_id = ? AND slab_size = ? AND id = ?",
       keyspace);
  STMT(sel_keys,
       "SELECT key, timer_type, time, span, tag, state FROM "
       "%s.timer_typed_keys WHERE segment_id = ? AND key IN ?",
       keyspace);
  STMT(set_state,
       "UPDATE %s.timer_typed_keys USING TTL ? SET state[?] = ? WHERE "
       "segment_id = ? AND key = ?",
       keyspace);
  STMT(del_state,
       "DELETE state[?] FROM %s.timer_typed_keys WHERE segment_id = ? AND key "
       "= ?",
       keyspace);
  STMT(ins_row,
       "INSERT INTO %s.timer_typed_keys (segment_id, key, timer_type, time, "
       "span, tag) VALUES (?, ?, ?, ?, ?, ?) USING TTL ?",
       keyspace);
  STMT(del_row,
       "DELETE FROM %s.timer_typed_keys WHERE segment_id = ? AND key = ? AND "
       "timer_type = ? AND time = ?",
       keyspace);
  STMT(del_rows,
       "DELETE FROM %s.timer_typed_keys WHERE segment_id = ? AND key = ? AND "
       "timer_type = ?",
       keyspace);
#undef STMT
  /* Last: a hook stays registered as long as the worker runs. */
  if (pr__cqlw_on_round(st->w, on_round, st)) {
    pr__errf(errstr, errstr_size, "too many stores on one Cassandra session");
    goto fail;
  }
  return &st->base;
oom:
  pr__errf(errstr, errstr_size, "out of memory");
fail:
  c_destroy(&st->base);
  return NULL;
}
