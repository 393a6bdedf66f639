/*
 * cqlstore.c - the Cassandra timer store: the store interface of timers.h
 * over a CQL session, on the tables of src/cql/schema/0001_timers.cql. A
 * segment is "<group>/<topic>/<partition>". A timer is a row in
 * timers_by_slab (what loads read), a row in timers_by_key (scheduled(),
 * unschedule, clear) and its slab's row in timer_slabs (the slabs listed on
 * assignment), each with a TTL of (time - now) + retention.
 *
 * Threads: the CQL session runs on a worker thread (worker.h), so it keeps
 * working while the engine thread blocks (draining a revoked partition
 * waits for fired timers' deletes). Operations are posted from the engine
 * thread, run on the worker, and delivered back on the engine thread by
 * poll(). Each op is owned by one thread at a time.
 *
 * Writes are coalesced. Every op joins the store's send queue in the order
 * it was posted; after each round of posted jobs (and whenever a group is
 * answered) the queue is sent from its head: a run of consecutive puts and
 * single-timer deletes becomes one group, written as unlogged batches (one
 * of timers_by_slab rows, one of timers_by_key rows, split at BATCH_BYTES;
 * the deletes of one second share a statement, `key IN ?`),
 * at most GROUPS_INFLIGHT partial groups on the wire, so what arrives while
 * they are answered waits and goes out together (measured on 2 shared
 * cores: the rows cost Cassandra about a third of the CPU of the logged
 * batches they replace). Any other op (a read, a clear)
 * is started when it reaches the head and every write posted before it was
 * acknowledged, so it sees them. An op is answered once every request holding
 * one of its rows was acknowledged, with the first error of any of them (an
 * error also fails the op's neighbours in that request: a write that failed may
 * or may not have landed, as with any Cassandra write, so this only asks for a
 * retry, and every write here is idempotent).
 *
 * Order: the session stamps each request with a strictly increasing client
 * timestamp when it is sent, and Cassandra keeps the newest write of a
 * cell (a delete wins a tie). Ops are sent in the order they were posted
 * (except past a group waiting for its timer_slabs rows, below, and then
 * never a put or delete of one of that group's timers), and a group ends
 * before a put and a delete of the same timer would share it, so a put
 * then a delete of a timer (or the reverse) resolve as they were issued,
 * as with one request per op before (prosody_timer_async callers need not
 * wait between a schedule and an unschedule).
 *
 * Why no logged batch. A logged batch (batchlog write and removal on top
 * of the rows) cost about as much as the three rows themselves and allowed
 * only 5k-11k puts/s. What its atomicity bought, and why it is not needed:
 *  - timer_slabs: a timer whose slab row is missing would never be loaded
 *    after a reassignment once its slab is in the past (assignment loads
 *    only the listed slabs up to the horizon). So the slab row is written,
 *    and acknowledged, before any timer row of that slab is sent: once per
 *    slab and process (remembered until the row's TTL, which covers the
 *    slab's last second plus retention, so every later timer of the slab).
 *    Its group's timer rows wait for it; later groups do not, unless they
 *    hold a put or delete of one of its timers (order above).
 *  - timers_by_slab without timers_by_key (a put whose key row failed): the
 *    timer fires, then is deleted as usual, but scheduled() does not list
 *    it and a clear misses it. timers_by_key without timers_by_slab: a time
 *    listed that never fires, until it is unscheduled or cleared, its put
 *    retried, or its TTL ends. Either needs a put that reported an error;
 *    after an error a logged batch was indeterminate too (a timed-out one
 *    is replayed from the batchlog later, after a clear issued meanwhile
 *    may have missed it), and the caller that sees the error retries the
 *    put (the handler fails and its event is retried or redelivered),
 *    which writes both rows again. A process that dies mid-put never
 *    finished its handler, so the event is redelivered and re-puts.
 *  - deletes: a fired timer whose slab row survived fires again (at least
 *    once, as a failed delete always allowed); a key row that survived is
 *    listed until a clear or its TTL.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cql/worker.h"
#include "../util/util.h"
#include "timers.h"

#define PAGE 5000
#define MAX_TTL_S 630720000 /* Cassandra's limit: 20 years */
#define DEL_CHUNK 100       /* timers deleted per batch by del_key */
#define GROUP_MAX 256       /* puts and deletes per group */
/* Estimated row bytes per batch request: Cassandra refuses a batch over
 * several partitions above batch_size_fail_threshold (50 KiB by default). */
#define BATCH_BYTES 16384
/* Groups on the wire: a partial group waits while GROUPS_INFLIGHT are
 * answered (what arrives meanwhile joins it); full ones go up to
 * GROUPS_INFLIGHT_MAX, so a long queue (an outage) is not held back. */
#define GROUPS_INFLIGHT 4
#define GROUPS_INFLIGHT_MAX 32
#define KNOWN_BUCKETS 1024 /* slabs whose timer_slabs row is written */
#define KNOWN_MAX 65536    /* ... forgotten beyond this many */
#define KNOWN_MARGIN_S 600 /* ... and this long before their row expires */

typedef struct op op_t;

/* A segment's name, made once per (topic, partition) by the engine thread
 * and kept until the store is destroyed: ops point at it (the worker
 * reads it), so a timer op costs no formatting or copy of it. */
typedef struct seg_name {
  struct seg_name *next;
  int32_t partition;
  const char *topic; /* in `name`'s allocation, after it */
  char name[];       /* "<group>/<topic>/<partition>" */
} seg_name_t;

#define SEG_BUCKETS 64
#define SPARE_MAX 1024 /* finished ops kept for reuse (engine thread) */
#define KEY_INLINE 48  /* keys shorter than this live in the op */

/* A slab whose timer_slabs row was acknowledged, until `until_s`. */
typedef struct known {
  struct known *next;
  int64_t slab, until_s;
  char segment[];
} known_t;

typedef struct cqlstore {
  pr__tstore_t base;
  pr__cqlw_t *w;
  pr__cql_t *cql; /* the worker's session: worker thread only */
  char *group;
  int64_t slab_s, retention_s;
  pr__cql_stmt_t *ins_slab, *ins_slab_span, *ins_key, *ins_slabs, *del_slab,
      *del_key, *del_slabs_in, *del_keys_in, *sel_key, *sel_slabs, *sel_slab;
  /* Worker thread only: the send queue (see the top of the file). */
  op_t *q_head, *q_tail;
  size_t qlen;
  int inflight;           /* groups sent and not fully answered */
  struct group *slabbing; /* groups waiting for their timer_slabs rows */
  int closing;            /* the session closes: fail what is queued */
  int dispatching;        /* in dispatch() (re-entered from callbacks) */
  int again;              /* ... which must look at the queue again */
  known_t *known[KNOWN_BUCKETS];
  size_t nknown;
  /* Engine thread only: segment names, and finished ops for reuse (an op
   * is over 1 KiB, past malloc's per-thread cache). */
  seg_name_t *segs[SEG_BUCKETS];
  op_t *spare;
  size_t nspare;
} cqlstore_t;

enum { R_DONE, R_TIMES, R_RECS };
/* How an op is sent: started alone, or as a put or delete of a group. */
enum { S_ALONE, S_PUT, S_DEL };

/* One operation in progress. */
struct op {
  pr__cqlw_job_t job; /* first: the worker's view of it */
  cqlstore_t *st;
  void (*start)(op_t *o); /* runs on the worker thread */
  int result;             /* R_*: which callback gets it */
  int64_t time_s;
  const char *segment; /* "<group>/<topic>/<partition>": st->segs' */
  char *key;           /* keybuf, or malloc'd */
  char keybuf[KEY_INLINE];
  int64_t keep_s;
  pr__timer_type_t type;
  char span[PR_TRACEPARENT_LEN + 1]; /* S_PUT: its trace context, or "" */
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
  pr__cql_cb next; /* key_times_page's continuation */
  /* Worker thread: the send queue and the op's group. */
  op_t *qnext;
  int send;  /* S_* */
  int waits; /* requests holding its rows, not yet answered (+1 while sent) */
  prosody_err_t werr;
  char werrstr[256];
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

/* The segment's name, made on first use (engine thread). */
static const char *seg_name(cqlstore_t *st, const pr__tseg_t *seg) {
  uint64_t h = UINT64_C(14695981039346656037) ^ (uint32_t)seg->partition;
  seg_name_t **at, *sn;
  size_t tlen = strlen(seg->topic), nlen;
  for (size_t i = 0; i < tlen; i++)
    h = (h ^ (unsigned char)seg->topic[i]) * UINT64_C(1099511628211);
  at = &st->segs[h % SEG_BUCKETS];
  for (sn = *at; sn; sn = sn->next)
    if (sn->partition == seg->partition && !strcmp(sn->topic, seg->topic))
      return sn->name;
  nlen = strlen(st->group) + tlen + 16;
  if (!(sn = malloc(sizeof(*sn) + nlen + tlen + 1)))
    return NULL;
  snprintf(sn->name, nlen, "%s/%s/%d", st->group, seg->topic, seg->partition);
  memcpy(sn->name + nlen, seg->topic, tlen + 1);
  sn->topic = sn->name + nlen;
  sn->partition = seg->partition;
  sn->next = *at;
  *at = sn;
  return sn->name;
}

static op_t *op_new(cqlstore_t *st, const pr__tseg_t *seg, const char *key) {
  const char *name = seg_name(st, seg);
  size_t klen = key ? strlen(key) : 0;
  op_t *o = st->spare;
  if (!name)
    return NULL;
  if (o) {
    st->spare = o->qnext;
    st->nspare--;
    memset(o, 0, sizeof(*o));
  } else if (!(o = calloc(1, sizeof(*o)))) {
    return NULL;
  }
  o->st = st;
  o->segment = name;
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

static int32_t ttl_for(const cqlstore_t *st, int64_t time_s) {
  int64_t ttl = time_s - pr__wall_ms() / 1000;
  ttl = (ttl > 0 ? ttl : 0) + st->retention_s;
  return (int32_t)(ttl > MAX_TTL_S ? MAX_TTL_S : ttl < 1 ? 1 : ttl);
}

/* ---- the send queue and groups (worker thread) ------------------------ */

typedef struct group group_t;

/* One batch request of a group: the ops it holds a row of. */
typedef struct greq {
  group_t *g;
  size_t n;
  op_t *ops[];
} greq_t;

struct group {
  cqlstore_t *st;
  size_t n;
  int out;              /* requests not yet answered (+1 while sending) */
  group_t *snext;       /* st->slabbing */
  op_t *ops[GROUP_MAX]; /* NULL once answered early */
};

static uint64_t known_hash(const char *segment, int64_t slab) {
  uint64_t h = UINT64_C(14695981039346656037);
  for (const unsigned char *p = (const unsigned char *)segment; *p; p++)
    h = (h ^ *p) * UINT64_C(1099511628211);
  return (h ^ (uint64_t)slab) * UINT64_C(1099511628211);
}

static known_t **known_at(cqlstore_t *st, const char *segment, int64_t slab) {
  known_t **k = &st->known[known_hash(segment, slab) % KNOWN_BUCKETS];
  while (*k && ((*k)->slab != slab || strcmp((*k)->segment, segment)))
    k = &(*k)->next;
  return k;
}

static void known_clear(cqlstore_t *st) {
  for (size_t i = 0; i < KNOWN_BUCKETS; i++)
    while (st->known[i]) {
      known_t *k = st->known[i];
      st->known[i] = k->next;
      free(k);
    }
  st->nknown = 0;
}

static int known_has(cqlstore_t *st, const char *segment, int64_t slab,
                     int64_t now_s) {
  known_t *k = *known_at(st, segment, slab);
  return k && k->until_s > now_s;
}

static void known_add(cqlstore_t *st, const char *segment, int64_t slab,
                      int64_t until_s) {
  known_t **at = known_at(st, segment, slab), *k = *at;
  size_t len = strlen(segment);
  if (k) {
    k->until_s = until_s;
    return;
  }
  if (st->nknown >= KNOWN_MAX) { /* forgotten: written again when used */
    known_clear(st);
    at = known_at(st, segment, slab);
  }
  if (!(k = malloc(sizeof(*k) + len + 1)))
    return; /* written again next time */
  memcpy(k->segment, segment, len + 1);
  k->slab = slab;
  k->until_s = until_s;
  k->next = NULL;
  *at = k;
  st->nknown++;
}

/* The TTL of a slab's timer_slabs row: it outlives every timer of the slab
 * written from now on. */
static int32_t slab_ttl(const cqlstore_t *st, int64_t slab) {
  return ttl_for(st, pr__slab_start(slab + 1, st->slab_s) - 1);
}

static int same_timer(const op_t *a, const op_t *b) {
  return a->time_s == b->time_s && a->type == b->type &&
         !strcmp(a->key, b->key) && !strcmp(a->segment, b->segment);
}

/* An op of the group is answered: its first error, if any. */
static void op_answered(op_t *o) {
  complete(o, o->werr, o->werr ? o->werrstr : NULL);
}

static void op_error(op_t *o, prosody_err_t err, const char *errstr) {
  if (!o->werr) {
    o->werr = err;
    snprintf(o->werrstr, sizeof(o->werrstr), "%s", errstr ? errstr : "");
  }
}

static void group_done(group_t *g) {
  cqlstore_t *st = g->st;
  free(g);
  st->inflight--;
  dispatch(st);
}

static void rows_done(void *arg, prosody_err_t err, const char *errstr,
                      const pr__cql_result_t *res) {
  greq_t *r = arg;
  group_t *g = r->g;
  (void)res;
  for (size_t i = 0; i < r->n; i++) {
    op_t *o = r->ops[i];
    if (err)
      op_error(o, err, errstr);
    if (--o->waits == 0)
      op_answered(o); /* the engine thread owns it now */
  }
  free(r);
  if (--g->out == 0)
    group_done(g);
}

/* The row put by `o` in timers_by_slab (`slab_row`) or timers_by_key, as
 * values at `v`; their statement. */
static pr__cql_bstmt_t put_row(cqlstore_t *st, op_t *o, int slab_row,
                               pr__cql_val_t *v) {
  uint16_t n = 0;
  v[n++] = pr__cv_text(o->segment);
  if (slab_row) {
    v[n++] = pr__cv_bigint(pr__slab_of(o->time_s, st->slab_s));
    v[n++] = pr__cv_bigint(o->time_s);
    v[n++] = pr__cv_text(o->key);
    v[n++] = pr__cv_tinyint((int8_t)o->type);
    if (o->span[0]) /* else no column written: no tombstone */
      v[n++] = pr__cv_text(o->span);
  } else {
    v[n++] = pr__cv_text(o->key);
    v[n++] = pr__cv_tinyint((int8_t)o->type);
    v[n++] = pr__cv_bigint(o->time_s);
  }
  v[n++] = pr__cv_int(ttl_for(st, o->time_s));
  return (pr__cql_bstmt_t){
      slab_row ? (o->span[0] ? st->ins_slab_span : st->ins_slab) : st->ins_key,
      v, n};
}

/* 1 if deletes `a` and `b` remove rows of one (segment, time, type): one
 * statement deletes them all, `key IN ?` (in timers_by_slab, rows of one
 * partition; in timers_by_key, one row of each key's partition). */
static int same_second(const op_t *a, const op_t *b) {
  return a->send == S_DEL && b->send == S_DEL && a->time_s == b->time_s &&
         a->type == b->type && !strcmp(a->segment, b->segment);
}

/* Sends ops[0, n) (live ops of the group) as one unlogged batch of their
 * slab rows or key rows: a statement per put, and one per second's deletes
 * (same_second(): fired timers come due together), their keys bound as one
 * list<text>. The rows deleted are the same; Cassandra parses and applies
 * fewer statements (measured: about 7% less of its CPU per delete, and the
 * values we encode shrink to the keys). */
static void send_rows(group_t *g, op_t **ops, size_t n, int slab_row) {
  cqlstore_t *st = g->st;
  greq_t *r = malloc(sizeof(*r) + n * sizeof(op_t *));
  pr__cql_val_t *v = malloc(n * 7 * sizeof(*v));
  pr__cql_bstmt_t *b = malloc(n * sizeof(*b));
  size_t *set = malloc(n * sizeof(*set)); /* a delete's first of its second */
  size_t *len = calloc(n, sizeof(*len));  /* ... that first's list bytes */
  uint8_t **list = calloc(n, sizeof(*list));
  size_t nb = 0, counted = 0;
  if (!r || !v || !b || !set || !len || !list)
    goto oom;
  counted = 1;
  r->g = g;
  r->n = n;
  for (size_t i = 0; i < n; i++) {
    size_t j = i;
    r->ops[i] = ops[i];
    ops[i]->waits++;
    if (ops[i]->send == S_DEL)
      for (j = 0; j < i && !(set[j] == j && same_second(ops[j], ops[i])); j++)
        ;
    set[i] = j;
    if (ops[i]->send == S_DEL)
      len[j] += 4 + strlen(ops[i]->key);
  }
  for (size_t i = 0; i < n; i++) {
    op_t *o = ops[i];
    if (o->send == S_PUT) {
      b[nb++] = put_row(st, o, slab_row, v + i * 7);
      continue;
    }
    if (set[i] == i) { /* the list: [int n] then each key as [int len] */
      pr__cql_val_t *x = v + i * 7;
      uint32_t count = 0;
      size_t at = 4;
      if (!(list[i] = malloc(4 + len[i])))
        goto oom;
      for (size_t k = i; k < n; k++)
        if (set[k] == i) {
          uint32_t kl = (uint32_t)strlen(ops[k]->key);
          uint8_t *p = list[i] + at;
          p[0] = (uint8_t)(kl >> 24);
          p[1] = (uint8_t)(kl >> 16);
          p[2] = (uint8_t)(kl >> 8);
          p[3] = (uint8_t)kl;
          memcpy(p + 4, ops[k]->key, kl);
          at += 4 + kl;
          count++;
        }
      list[i][0] = (uint8_t)(count >> 24);
      list[i][1] = (uint8_t)(count >> 16);
      list[i][2] = (uint8_t)(count >> 8);
      list[i][3] = (uint8_t)count;
      x[0] = pr__cv_text(o->segment);
      if (slab_row) {
        x[1] = pr__cv_bigint(pr__slab_of(o->time_s, st->slab_s));
        x[2] = pr__cv_bigint(o->time_s);
        x[3] = pr__cv_blob(list[i], (int32_t)at);
        x[4] = pr__cv_tinyint((int8_t)o->type);
        b[nb++] = (pr__cql_bstmt_t){st->del_slabs_in, x, 5};
      } else {
        x[1] = pr__cv_blob(list[i], (int32_t)at);
        x[2] = pr__cv_tinyint((int8_t)o->type);
        x[3] = pr__cv_bigint(o->time_s);
        b[nb++] = (pr__cql_bstmt_t){st->del_keys_in, x, 4};
      }
    }
  }
  g->out++;
  pr__cql_batch_run(st->cql, PR_CQL_BATCH_UNLOGGED, b, (uint16_t)nb, rows_done,
                    r);
  r = NULL;
  counted = 2;
oom:
  for (size_t i = 0; counted < 2 && i < n; i++) {
    op_error(ops[i], PROSODY_ERR_NOMEM, "out of memory");
    ops[i]->waits -= counted; /* as if never sent */
  }
  for (size_t i = 0; list && i < n; i++)
    free(list[i]);
  free(list);
  free(len);
  free(set);
  free(r);
  free(v);
  free(b);
}

/* Writes the group's timer rows: its slab rows, then its key rows, in
 * batches of about BATCH_BYTES. */
static void write_rows(group_t *g) {
  cqlstore_t *st = g->st;
  op_t *run[GROUP_MAX];
  g->out = 1;
  for (size_t i = 0; i < g->n; i++)
    if (g->ops[i]) {
      if (st->closing)
        op_error(g->ops[i], PROSODY_ERR_STATE, "the Cassandra store is closed");
      g->ops[i]->waits = 1; /* answered below, once everything is sent */
    }
  for (int slab_row = 1; slab_row >= 0 && !st->closing; slab_row--) {
    size_t n = 0, bytes = 0;
    for (size_t i = 0; i <= g->n; i++) {
      op_t *o = i < g->n ? g->ops[i] : NULL;
      size_t len = o ? strlen(o->segment) + strlen(o->key) + 48 : 0;
      if (i < g->n && !o)
        continue;
      if (n && (!o || bytes + len > BATCH_BYTES)) {
        send_rows(g, run, n, slab_row);
        n = bytes = 0;
      }
      if (o) {
        run[n++] = o;
        bytes += len;
      }
    }
  }
  for (size_t i = 0; i < g->n; i++)
    if (g->ops[i] && --g->ops[i]->waits == 0)
      op_answered(g->ops[i]);
  if (--g->out == 0)
    group_done(g);
}

/* Takes the queue's head op (worker thread). */
static op_t *q_pop(cqlstore_t *st) {
  op_t *o = st->q_head;
  if (!(st->q_head = o->qnext))
    st->q_tail = NULL;
  st->qlen--;
  return o;
}

/* The group's new slabs are in timer_slabs (or not: their puts fail). */
static void slabs_written(void *arg, prosody_err_t err, const char *errstr,
                          const pr__cql_result_t *res) {
  group_t *g = arg;
  cqlstore_t *st = g->st;
  int64_t now_s = pr__wall_ms() / 1000;
  group_t **at = &st->slabbing;
  (void)res;
  while (*at != g)
    at = &(*at)->snext;
  *at = g->snext;
  for (size_t i = 0; i < g->n; i++) {
    op_t *o = g->ops[i];
    int64_t slab;
    if (!o || o->send != S_PUT)
      continue;
    slab = pr__slab_of(o->time_s, st->slab_s);
    if (known_has(st, o->segment, slab, now_s))
      continue;
    if (!err) {
      known_add(st, o->segment, slab,
                now_s + slab_ttl(st, slab) - KNOWN_MARGIN_S);
    } else {
      complete(o, err, errstr);
      g->ops[i] = NULL;
    }
  }
  write_rows(g);
  dispatch(st);
}

/* 1 if `o` is a put and `p` a delete of the same timer, or the reverse. */
static int conflicts(const op_t *o, const op_t *p) {
  return p && p->send != o->send && same_timer(p, o);
}

/* 1 if `o` must wait for a group whose timer rows are not sent yet. */
static int waits_for_slabbing(const cqlstore_t *st, const op_t *o) {
  for (const group_t *g = st->slabbing; g; g = g->snext)
    for (size_t i = 0; i < g->n; i++)
      if (conflicts(o, g->ops[i]))
        return 1;
  return 0;
}

/* Sends the queue's head run of puts and deletes as one group: first the
 * timer_slabs rows of slabs not yet known, then, once they are
 * acknowledged, the timer rows (meanwhile later groups go out, unless they
 * hold a put or delete of one of its timers). 0 if the head must wait. */
static int send_group(cqlstore_t *st) {
  group_t *g;
  int64_t now_s = pr__wall_ms() / 1000;
  op_t *fresh[GROUP_MAX];
  size_t nf = 0;
  if (st->slabbing && waits_for_slabbing(st, st->q_head))
    return 0;
  if (!(g = malloc(sizeof(*g)))) {
    complete(q_pop(st), PROSODY_ERR_NOMEM, "out of memory");
    return 1;
  }
  g->st = st;
  g->n = 0;
  g->out = 0;
  while (st->q_head && st->q_head->send != S_ALONE && g->n < GROUP_MAX) {
    op_t *o = st->q_head;
    size_t i;
    for (i = 0; i < g->n; i++) /* a put and a delete of one timer */
      if (conflicts(o, g->ops[i]))
        break;
    if (i < g->n || (st->slabbing && waits_for_slabbing(st, o)))
      break; /* ... go out in order, in two groups */
    g->ops[g->n++] = q_pop(st);
    if (o->send == S_PUT &&
        !known_has(st, o->segment, pr__slab_of(o->time_s, st->slab_s), now_s)) {
      int64_t slab = pr__slab_of(o->time_s, st->slab_s);
      for (i = 0; i < nf; i++)
        if (pr__slab_of(fresh[i]->time_s, st->slab_s) == slab &&
            !strcmp(fresh[i]->segment, o->segment))
          break;
      if (i == nf)
        fresh[nf++] = o;
    }
  }
  st->inflight++;
  if (!nf) {
    write_rows(g);
    return 1;
  }
  {
    pr__cql_val_t v[GROUP_MAX * 3];
    pr__cql_bstmt_t b[GROUP_MAX];
    for (size_t i = 0; i < nf; i++) {
      int64_t slab = pr__slab_of(fresh[i]->time_s, st->slab_s);
      v[i * 3] = pr__cv_text(fresh[i]->segment);
      v[i * 3 + 1] = pr__cv_bigint(slab);
      v[i * 3 + 2] = pr__cv_int(slab_ttl(st, slab));
      b[i] = (pr__cql_bstmt_t){st->ins_slabs, v + i * 3, 3};
    }
    g->snext = st->slabbing;
    st->slabbing = g;
    pr__cql_batch_run(st->cql, PR_CQL_BATCH_UNLOGGED, b, (uint16_t)nf,
                      slabs_written, g);
  }
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
    while (st->q_head) {
      op_t *o = st->q_head;
      if (st->closing) {
        complete(q_pop(st), PROSODY_ERR_STATE, "the Cassandra store is closed");
        continue;
      }
      if (o->send == S_ALONE) {
        if (st->inflight > 0)
          break; /* it sees every write posted before it */
        q_pop(st)->start(o);
        continue;
      }
      if (st->inflight >=
          (st->qlen >= GROUP_MAX ? GROUPS_INFLIGHT_MAX : GROUPS_INFLIGHT))
        break; /* what arrives meanwhile joins the next group */
      if (!send_group(st))
        break; /* its timer's put or delete is not sent yet */
    }
  } while (st->again);
  st->dispatching = 0;
}

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
    else
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
  else
    o->recs_cb = (pr__tstore_recs_cb)cb;
  return o;
}

/* Posts an operation on one timer (key, time, type). */
static void post_timer(pr__tstore_t *s, const pr__tseg_t *seg, const char *key,
                       int64_t time_s, pr__timer_type_t type, int send,
                       const pr_span_ctx_t *ctx, pr__tstore_done_cb cb,
                       void *arg) {
  op_t *o = op_for(s, seg, key, R_DONE, NULL, (void *)cb, arg);
  if (o) {
    o->time_s = time_s;
    o->type = type;
    o->send = send;
    if (ctx && ctx->valid)
      pr__span_ctx_format(ctx, o->span);
    post(o);
  }
}

static void c_put(pr__tstore_t *s, const pr__tseg_t *seg, const char *key,
                  int64_t time_s, pr__timer_type_t type,
                  const pr_span_ctx_t *ctx, pr__tstore_done_cb cb, void *arg) {
  post_timer(s, seg, key, time_s, type, S_PUT, ctx, cb, arg);
}

/* Deletes (key, times[0..n)) from both timer tables in one batch. */
static void delete_times(cqlstore_t *st, op_t *o, const char *key,
                         const int64_t *times, size_t n, pr__cql_cb cb) {
  pr__cql_val_t *v = calloc(n * 9 + 1, sizeof(*v));
  pr__cql_bstmt_t *b = calloc(n * 2 + 1, sizeof(*b));
  if (!v || !b) {
    free(v);
    free(b);
    cb(o, PROSODY_ERR_NOMEM, "out of memory", NULL);
    return;
  }
  for (size_t i = 0; i < n; i++) {
    pr__cql_val_t *x = v + i * 9;
    x[0] = pr__cv_text(o->segment);
    x[1] = pr__cv_bigint(pr__slab_of(times[i], st->slab_s));
    x[2] = pr__cv_bigint(times[i]);
    x[3] = pr__cv_text(key);
    x[4] = pr__cv_tinyint((int8_t)o->type);
    x[5] = pr__cv_text(o->segment);
    x[6] = pr__cv_text(key);
    x[7] = pr__cv_tinyint((int8_t)o->type);
    x[8] = pr__cv_bigint(times[i]);
    b[2 * i] = (pr__cql_bstmt_t){st->del_slab, x, 5};
    b[2 * i + 1] = (pr__cql_bstmt_t){st->del_key, x + 5, 4};
  }
  pr__cql_batch_run(st->cql, PR_CQL_BATCH_LOGGED, b, (uint16_t)(n * 2), cb, o);
  free(v);
  free(b);
}

static void c_del(pr__tstore_t *s, const pr__tseg_t *seg, const char *key,
                  int64_t time_s, pr__timer_type_t type, pr__tstore_done_cb cb,
                  void *arg) {
  post_timer(s, seg, key, time_s, type, S_DEL, NULL, cb, arg);
}

/* Paged SELECT of a key's times; `next` runs once all pages are in. */
static void key_times_page(op_t *o, pr__cql_cb next);

static void key_times_cb(void *arg, prosody_err_t err, const char *errstr,
                         const pr__cql_result_t *res);

/* Options for the op's next page (PAGE rows, from its paging state). */
static pr__cql_opts_t page_opts(const op_t *o) {
  pr__cql_opts_t opts;
  memset(&opts, 0, sizeof(opts));
  opts.page_size = PAGE;
  opts.paging_state = o->paging;
  opts.paging_len = o->paging_len;
  return opts;
}

static void key_times_page(op_t *o, pr__cql_cb next) {
  pr__cql_val_t v[3];
  pr__cql_opts_t opts = page_opts(o);
  v[0] = pr__cv_text(o->segment);
  v[1] = pr__cv_text(o->key);
  v[2] = pr__cv_tinyint((int8_t)o->type);
  o->next = next;
  pr__cql_execute_stmt(o->st->cql, o->st->sel_key, v, 3, &opts, key_times_cb,
                       o);
}

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

static void key_times_cb(void *arg, prosody_err_t err, const char *errstr,
                         const pr__cql_result_t *res) {
  op_t *o = arg;
  pr__cql_cb next = o->next;
  int more;
  if (err) {
    next(o, err, errstr, NULL);
    return;
  }
  for (int32_t i = 0; i < res->nrows; i++) {
    int64_t t;
    if (pr__cql_get_bigint(pr__cql_cell(res, i, 0), &t))
      continue;
    if (o->n == o->cap) {
      size_t cap = o->cap ? o->cap * 2 : 16;
      int64_t *g = realloc(o->times, cap * sizeof(*g));
      if (!g) {
        next(o, PROSODY_ERR_NOMEM, "out of memory", NULL);
        return;
      }
      o->times = g;
      o->cap = cap;
    }
    o->times[o->n++] = t;
  }
  more = keep_paging(o, res);
  if (more < 0)
    next(o, PROSODY_ERR_NOMEM, "out of memory", NULL);
  else if (more)
    key_times_page(o, next);
  else
    next(o, PROSODY_OK, NULL, res);
}

static void times_done(void *arg, prosody_err_t err, const char *errstr,
                       const pr__cql_result_t *res) {
  (void)res;
  complete(arg, err, errstr);
}

static void start_key_times(op_t *o) { key_times_page(o, times_done); }

static void c_key_times(pr__tstore_t *s, const pr__tseg_t *seg, const char *key,
                        pr__timer_type_t type, pr__tstore_times_cb cb,
                        void *arg) {
  op_t *o = op_for(s, seg, key, R_TIMES, start_key_times, (void *)cb, arg);
  if (o) {
    o->type = type;
    post(o);
  }
}

/* del_key: list the key's times, then delete all but keep_s in chunks. */
static void del_chunk(void *arg, prosody_err_t err, const char *errstr,
                      const pr__cql_result_t *res) {
  op_t *o = arg;
  size_t n = 0;
  (void)res;
  if (err) {
    complete(o, err, errstr);
    return;
  }
  /* Drop keep_s and what the previous chunk deleted (the list's tail). */
  while (o->n > 0 && n < DEL_CHUNK) {
    int64_t t = o->times[--o->n];
    if (t != o->keep_s)
      o->times[o->cap - 1 - n++] = t; /* gather at the array's end */
  }
  if (!n) {
    complete(o, PROSODY_OK, NULL);
    return;
  }
  delete_times(o->st, o, o->key, o->times + o->cap - n, n, del_chunk);
}

static void start_del_key(op_t *o) { key_times_page(o, del_chunk); }

static void c_del_key(pr__tstore_t *s, const pr__tseg_t *seg, const char *key,
                      pr__timer_type_t type, int64_t keep_s,
                      pr__tstore_done_cb cb, void *arg) {
  op_t *o = op_for(s, seg, key, R_DONE, start_del_key, (void *)cb, arg);
  if (o) {
    o->type = type;
    o->keep_s = keep_s;
    post(o);
  }
}

static void slabs_cb(void *arg, prosody_err_t err, const char *errstr,
                     const pr__cql_result_t *res) {
  op_t *o = arg;
  if (!err) {
    if (res->nrows > 0 &&
        !(o->times = malloc((size_t)res->nrows * sizeof(int64_t)))) {
      err = PROSODY_ERR_NOMEM;
      errstr = "out of memory";
    }
    for (int32_t i = 0; !err && i < res->nrows; i++)
      if (!pr__cql_get_bigint(pr__cql_cell(res, i, 0), &o->times[o->n]))
        o->n++; /* clustering order: ascending */
  }
  complete(o, err, errstr);
}

static void start_slabs(op_t *o) {
  pr__cql_val_t v[1];
  v[0] = pr__cv_text(o->segment);
  pr__cql_execute_stmt(o->st->cql, o->st->sel_slabs, v, 1, NULL, slabs_cb, o);
}

static void c_slabs(pr__tstore_t *s, const pr__tseg_t *seg, int64_t slab_s,
                    pr__tstore_times_cb cb, void *arg) {
  op_t *o = op_for(s, seg, NULL, R_TIMES, start_slabs, (void *)cb, arg);
  (void)slab_s; /* the store's own slab size: slabs are stored with it */
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
    const pr__cql_cell_t *kc = pr__cql_cell(res, i, 0), *sc;
    char *key;
    int64_t t;
    int8_t type;
    if (!kc->p || kc->len < 0 ||
        pr__cql_get_bigint(pr__cql_cell(res, i, 1), &t) ||
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
    o->recs[o->nrecs].key = key;
    o->recs[o->nrecs].time_s = t;
    o->recs[o->nrecs].type = (pr__timer_type_t)type;
    sc = pr__cql_cell(res, i, 3);
    if (!sc->p || sc->len <= 0 ||
        pr__span_ctx_parse((const char *)sc->p, (size_t)sc->len,
                           &o->recs[o->nrecs].ctx))
      o->recs[o->nrecs].ctx.valid = false;
    o->nrecs++;
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
  pr__cql_val_t v[2];
  pr__cql_opts_t opts = page_opts(o);
  v[0] = pr__cv_text(o->segment);
  v[1] = pr__cv_bigint(o->slab);
  pr__cql_execute_stmt(o->st->cql, o->st->sel_slab, v, 2, &opts, load_cb, o);
}

static void c_load_slab(pr__tstore_t *s, const pr__tseg_t *seg, int64_t slab_s,
                        int64_t slab, pr__tstore_recs_cb cb, void *arg) {
  op_t *o = op_for(s, seg, NULL, R_RECS, load_page, (void *)cb, arg);
  (void)slab_s;
  if (o) {
    o->slab = slab;
    post(o);
  }
}

static void c_release(pr__tstore_t *s, const pr__tseg_t *seg) {
  (void)s; /* durable: the next owner of the partition loads them */
  (void)seg;
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
  else
    o->recs_cb(o->arg, err, why, err ? NULL : o->recs, err ? 0 : o->nrecs);
  op_free(o);
}

static void c_poll(pr__tstore_t *s) { pr__cqlw_poll(((cqlstore_t *)s)->w); }

/* Stops the worker, then delivers what finished (engine thread). */
static void c_destroy(pr__tstore_t *s) {
  cqlstore_t *st = (cqlstore_t *)s;
  pr__cqlw_free(st->w);
  known_clear(st);
  while (st->spare) {
    op_t *o = st->spare;
    st->spare = o->qnext;
    free(o);
  }
  for (size_t i = 0; i < SEG_BUCKETS; i++)
    while (st->segs[i]) {
      seg_name_t *sn = st->segs[i];
      st->segs[i] = sn->next;
      free(sn);
    }
  free(st->group);
  free(st);
}

static const pr__tstore_ops_t cqlstore_ops = {c_put,       c_del,   c_del_key,
                                              c_key_times, c_slabs, c_load_slab,
                                              c_release,   c_poll,  c_destroy};

pr__tstore_t *pr__cqlstore_new(const pr__cql_conf_t *conf, const char *keyspace,
                               const char *group, int64_t slab_s,
                               int64_t retention_s, void (*wake)(void *),
                               void *wake_arg, char *errstr,
                               size_t errstr_size) {
  cqlstore_t *st = calloc(1, sizeof(*st));
  char q[512];
  if (!st || !(st->group = strdup(group))) {
    free(st);
    pr__errf(errstr, errstr_size, "out of memory");
    return NULL;
  }
  st->base.ops = &cqlstore_ops;
  st->slab_s = slab_s;
  st->retention_s = retention_s;
  if (!(st->w = pr__cqlw_new(conf, wake, wake_arg, errstr, errstr_size))) {
    free(st->group);
    free(st);
    return NULL;
  }
  st->cql = pr__cqlw_cql(st->w);
  pr__cqlw_on_round(st->w, on_round, st);
#define STMT(field, ...)                                                       \
  do {                                                                         \
    snprintf(q, sizeof(q), __VA_ARGS__);                                       \
    if (!(st->field = pr__cql_stmt(st->cql, q)))                               \
      goto oom;                                                                \
  } while (0)
  STMT(ins_slab,
       "INSERT INTO %s.timers_by_slab (segment, slab, time, key, type) "
       "VALUES (?, ?, ?, ?, ?) USING TTL ?",
       keyspace);
  STMT(ins_slab_span,
       "INSERT INTO %s.timers_by_slab (segment, slab, time, key, type, span) "
       "VALUES (?, ?, ?, ?, ?, ?) USING TTL ?",
       keyspace);
  STMT(ins_key,
       "INSERT INTO %s.timers_by_key (segment, key, type, time) VALUES (?, "
       "?, ?, ?) USING TTL ?",
       keyspace);
  STMT(ins_slabs,
       "INSERT INTO %s.timer_slab_list (segment, slab) VALUES (?, ?) USING TTL "
       "?",
       keyspace);
  STMT(del_slab,
       "DELETE FROM %s.timers_by_slab WHERE segment = ? AND slab = ? AND "
       "time = ? AND key = ? AND type = ?",
       keyspace);
  STMT(del_key,
       "DELETE FROM %s.timers_by_key WHERE segment = ? AND key = ? AND type "
       "= ? AND time = ?",
       keyspace);
  STMT(del_slabs_in,
       "DELETE FROM %s.timers_by_slab WHERE segment = ? AND slab = ? AND "
       "time = ? AND key IN ? AND type = ?",
       keyspace);
  STMT(del_keys_in,
       "DELETE FROM %s.timers_by_key WHERE segment = ? AND key IN ? AND type "
       "= ? AND time = ?",
       keyspace);
  STMT(sel_key,
       "SELECT time FROM %s.timers_by_key WHERE segment = ? AND key = ? AND "
       "type = ?",
       keyspace);
  STMT(sel_slabs, "SELECT slab FROM %s.timer_slab_list WHERE segment = ?",
       keyspace);
  STMT(sel_slab,
       "SELECT key, time, type, span FROM %s.timers_by_slab WHERE segment = ? "
       "AND slab = ?",
       keyspace);
#undef STMT
  if (pr__cqlw_start(st->w, errstr, errstr_size))
    goto fail;
  return &st->base;
oom:
  pr__errf(errstr, errstr_size, "out of memory");
fail:
  c_destroy(&st->base);
  return NULL;
}
