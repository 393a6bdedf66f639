/*
 * cqlstores.c - the Cassandra deduplication and deferral stores (see
 * stores.h), on the original Prosody's tables, so that one keyspace serves
 * both implementations (docs/ARCHITECTURE.md, "Stores"). Each store owns a
 * CQL worker (its own thread and session); an operation is one job:
 * posted by the owner, run on the worker (one or a few statements in
 * turn), its callback delivered back on the owner's thread by poll().
 *
 * Deduplication: deduplication(id uuid), one row per handled message,
 * written with idempotence_ttl; the id (src/engine/dedup.c) already names
 * the group, so the scope is not stored.
 *
 * Deferral. A segment is one group's topic partition, named
 * "<topic>/<partition>:<group>"; its id is the UUID v5 of that name in the
 * OID namespace. deferred_segments keeps (id, topic, partition,
 * consumer_group), upserted when a key of the segment is first deferred.
 * A key's queue is one partition (segment_id, key) of deferred_offsets
 * (messages: offset) or deferred_timers (timers: original_time, with the
 * span map, written empty), ascending, with two static columns:
 *   - the hint next_offset / next_timer (a UDT of time and span): the
 *     lowest live position, so the head is one static read that resolves on
 *     the partition's live tail (ORDER BY ... DESC LIMIT 1) and never scans
 *     the tombstones that removing heads leaves at its front;
 *   - retry_count: the failed retries of the current head (0 when it is
 *     first deferred, reset to 0 when the head is removed after a
 *     success). Our count (stores.h) is retry_count + 1.
 * Writes:
 *   - deferring a key (its queue empty): one INSERT of the row with
 *     retry_count 0 and the hint at it (after the segment's row);
 *   - appending behind it: an INSERT of the row; below the hint (an
 *     earlier offset redelivered), in one unlogged batch with the hint
 *     lowered;
 *   - a failed retry: an UPDATE of retry_count;
 *   - removing the head: when another row follows (one probe), an unlogged
 *     batch deleting the row and moving the hint to it with retry_count 0;
 *     else the partition is deleted (statics too);
 *   - clearing a key: the partition is deleted.
 * A partition whose hint is null while retry_count is set (written before
 * the original added the hint, or a retry count left after its rows went)
 * is probed for its lowest row. Every write reads the statics first (one
 * read) to keep the hint the lowest live position.
 * TTLs: rows of messages and every retry_count write carry
 * cassandra_retention; a timer row and the hint that names it carry the
 * time until it plus cassandra_retention (none past Cassandra's 20-year
 * limit), as the original writes them.
 * The retry times are not here: the original keeps them as timers of type
 * 1 (deferred message) and 2 (deferred timer) in the timer store.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../cql/worker.h"
#include "../util/util.h"
#include "stores.h"

#define MAX_TTL_S 630720000 /* Cassandra's limit: 20 years */

enum { J_DONE, J_SEEN, J_HEAD, J_KEYS };

/* What a deferral job does once it has read the key's statics. */
enum {
  OP_HEAD,
  OP_APPEND,
  OP_ADVANCE,
  OP_CLEAR,
  OP_RETRIES,
  OP_SEEN,
  OP_RECORD
};

/* Steps of a deferral job (worker thread). */
enum { S_STATIC, S_MIN, S_AFTER, S_SEGMENT, S_WRITE };

struct cql_defer;

/* One operation of either store. */
typedef struct job {
  pr__cqlw_job_t job; /* first: the worker's view */
  struct cql_defer *d;
  pr__cql_stmt_t *st; /* dedup */
  pr__cql_t *cql;
  int kind; /* J_*: which callback */
  int op;   /* OP_* */
  int step; /* S_* */
  pr__store_done_cb done;
  pr__seen_cb seen_cb;
  pr__head_cb head_cb;
  void *arg;
  char *seg, *key;  /* segment name and key (deferral) */
  uint8_t id[16];   /* segment id, or dedup id */
  int64_t position; /* the head read */
  int32_t retries;  /* the head's retry count (ours) */
  int64_t ttl;      /* dedup */
  int64_t at;       /* the position written or removed */
  int32_t count;    /* the retry count written (ours: stores.h) */
  int found;        /* results: a head (or an id) was found */
  int64_t next;     /* the row after the head (advance) */
  int has_next;
  struct kbusy *kb;  /* deferral: its key's entry (worker thread) */
  struct job *wnext; /* ... the key's jobs waiting behind it */
} job_t;

static void job_free(job_t *j) {
  free(j->seg);
  free(j->key);
  free(j);
}

static void job_deliver(pr__cqlw_job_t *w) {
  job_t *j = (job_t *)w;
  prosody_err_t err = j->job.err;
  const char *why = err ? j->job.errstr : NULL;
  if (j->kind == J_DONE)
    j->done(j->arg, err, why);
  else if (j->kind == J_SEEN)
    j->seen_cb(j->arg, err, why, !err && j->found);
  else
    j->head_cb(j->arg, err, why, !err && j->found, j->position, j->retries);
  job_free(j);
}

/* Fills a new job; on out of memory reports to the callback and returns
 * NULL. */
static job_t *job_new(pr__cqlw_t *worker, int kind, void *cb, void *arg,
                      const char *seg, const char *key) {
  job_t *j = calloc(1, sizeof(*j));
  if (j &&
      ((seg && !(j->seg = strdup(seg))) || (key && !(j->key = strdup(key))))) {
    job_free(j);
    j = NULL;
  }
  if (!j) {
    if (kind == J_DONE)
      ((pr__store_done_cb)cb)(arg, PROSODY_ERR_NOMEM, "out of memory");
    else if (kind == J_SEEN)
      ((pr__seen_cb)cb)(arg, PROSODY_ERR_NOMEM, "out of memory", 0);
    else
      ((pr__head_cb)cb)(arg, PROSODY_ERR_NOMEM, "out of memory", 0, 0, 0);
    return NULL;
  }
  j->job.w = worker;
  j->job.deliver = job_deliver;
  j->kind = kind;
  j->arg = arg;
  j->cql = pr__cqlw_cql(worker);
  if (kind == J_DONE)
    j->done = (pr__store_done_cb)cb;
  else if (kind == J_SEEN)
    j->seen_cb = (pr__seen_cb)cb;
  else
    j->head_cb = (pr__head_cb)cb;
  return j;
}

/* ---- dedup -------------------------------------------------------------- */

typedef struct cql_dedup {
  pr__dedup_t base; /* first */
  pr__cqlw_t *w;
  pr__cql_stmt_t *sel, *ins;
} cql_dedup_t;

/* An id as the table keeps it: the UUID's 16 bytes. */
static void uuid_of(pr__did_t d, uint8_t out[16]) {
  for (int i = 0; i < 8; i++) {
    out[i] = (uint8_t)(d.hi >> (56 - 8 * i));
    out[8 + i] = (uint8_t)(d.lo >> (56 - 8 * i));
  }
}

static void dedup_answered(void *arg, prosody_err_t err, const char *errstr,
                           const pr__cql_result_t *res) {
  job_t *j = arg;
  j->found = !err && res && res->kind == PR_CQL_RESULT_ROWS && res->nrows > 0;
  pr__cqlw_complete(&j->job, err, errstr);
}

static void dedup_start(pr__cqlw_job_t *w) {
  job_t *j = (job_t *)w;
  pr__cql_val_t v[2] = {pr__cv_uuid(j->id), pr__cv_int((int32_t)j->ttl)};
  pr__cql_execute_stmt(j->cql, j->st, v, j->op == OP_RECORD ? 2 : 1, NULL,
                       dedup_answered, j);
}

static void dedup_post(cql_dedup_t *d, int op, pr__did_t id, int64_t ttl_s,
                       void *cb, void *arg) {
  job_t *j =
      job_new(d->w, op == OP_SEEN ? J_SEEN : J_DONE, cb, arg, NULL, NULL);
  if (!j)
    return;
  j->job.start = dedup_start;
  j->op = op;
  j->st = op == OP_SEEN ? d->sel : d->ins;
  j->ttl = ttl_s < 1 ? 1 : ttl_s > MAX_TTL_S ? MAX_TTL_S : ttl_s;
  uuid_of(id, j->id);
  pr__cqlw_post(&j->job);
}

static void cql_seen(pr__dedup_t *b, const char *scope, pr__did_t id,
                     pr__seen_cb cb, void *arg) {
  (void)scope; /* the id names the group */
  dedup_post((cql_dedup_t *)b, OP_SEEN, id, 0, (void *)cb, arg);
}

static void cql_record(pr__dedup_t *b, const char *scope, pr__did_t id,
                       int64_t ttl_s, pr__store_done_cb cb, void *arg) {
  (void)scope;
  dedup_post((cql_dedup_t *)b, OP_RECORD, id, ttl_s, (void *)cb, arg);
}

static void cql_dedup_poll(pr__dedup_t *b) {
  pr__cqlw_poll(((cql_dedup_t *)b)->w);
}

static void cql_dedup_destroy(pr__dedup_t *b) {
  cql_dedup_t *d = (cql_dedup_t *)b;
  if (d->w)
    pr__cqlw_free(d->w);
  free(d);
}

static const pr__dedup_ops_t cql_dedup_ops = {
    cql_seen, cql_record, cql_dedup_poll, cql_dedup_destroy};

pr__dedup_t *pr__dedup_new(pr__cqlw_t *w, const char *keyspace, char *errstr,
                           size_t errstr_size) {
  cql_dedup_t *d = calloc(1, sizeof(*d));
  char q[256];
  if (!d) {
    pr__errf(errstr, errstr_size, "out of memory");
    return NULL;
  }
  d->w = pr__cqlw_ref(w);
  d->base.ops = &cql_dedup_ops;
  snprintf(q, sizeof(q), "SELECT id FROM %s.deduplication WHERE id = ?",
           keyspace);
  d->sel = pr__cql_stmt(pr__cqlw_cql(d->w), q);
  snprintf(q, sizeof(q),
           "INSERT INTO %s.deduplication (id) VALUES (?) USING TTL ?",
           keyspace);
  d->ins = pr__cql_stmt(pr__cqlw_cql(d->w), q);
  if (!d->sel || !d->ins) {
    pr__errf(errstr, errstr_size, "out of memory");
    cql_dedup_destroy(&d->base);
    return NULL;
  }
  return &d->base;
}

/* ---- deferral ----------------------------------------------------------- */

/* A key with a job running (worker thread): one job of a key at a time,
 * in the order they were posted, since each reads the statics it then
 * writes (two at once would both take the key for new, and the later
 * write would set the hint above the earlier's row). */
typedef struct kbusy {
  struct kbusy *next; /* bucket chain */
  job_t *head, *tail; /* waiting */
  char name[];        /* segment NUL key */
} kbusy_t;

#define KB_BUCKETS 256

/* The Cassandra deferral store of one kind. */
typedef struct cql_defer {
  pr__defer_t base; /* first */
  pr__cqlw_t *w;
  kbusy_t *busy[KB_BUCKETS]; /* worker thread */
  int64_t retention_s;
  pr__cql_stmt_t *statics, *min, *after, *segment, *first, *add, *set_next,
      *set_rc, *next_rc0, *del_row, *del_key;
} cql_defer_t;

static int timers(const job_t *j) { return j->d->base.kind == PR_DEFER_TIMERS; }

/* The TTL of a row at `position` (and of a hint naming it). */
static int32_t row_ttl(const job_t *j, int64_t position) {
  int64_t ttl = j->d->retention_s, ahead;
  if (timers(j) && (ahead = position - (int64_t)time(NULL)) > 0)
    ttl += ahead;
  return ttl > MAX_TTL_S ? 0 : (int32_t)ttl; /* 0: none, as the original */
}

/* A position as the table keeps it: a timer's time is the int of the
 * unsigned second count. */
static pr__cql_val_t pos_val(const job_t *j, int64_t position) {
  return timers(j) ? pr__cv_int((int32_t)(uint32_t)position)
                   : pr__cv_bigint(position);
}

static int get_pos(const job_t *j, const pr__cql_cell_t *c, int64_t *out) {
  int32_t t;
  if (!timers(j))
    return pr__cql_get_bigint(c, out);
  if (pr__cql_get_int(c, &t))
    return -1;
  *out = (int64_t)(uint32_t)t;
  return 0;
}

/* An empty span map (frozen<map<text, text>>: no entries). */
static const uint8_t empty_map[4] = {0, 0, 0, 0};

/* The next_timer UDT of a time: (time int, span frozen<map>), each field
 * after its length. */
static void next_timer_udt(const job_t *j, int64_t time_s, uint8_t out[16]) {
  uint32_t t = (uint32_t)time_s;
  static const uint8_t four[4] = {0, 0, 0, 4};
  (void)j;
  memcpy(out, four, 4);
  for (int i = 0; i < 4; i++)
    out[4 + i] = (uint8_t)(t >> (24 - 8 * i));
  memcpy(out + 8, four, 4);
  memcpy(out + 12, empty_map, 4);
}

static void step(job_t *j);
static void begin(job_t *j);

static size_t kb_bucket(const char *seg, const char *key) {
  return (size_t)((pr__fnv1a_str(seg) * 31) ^ pr__fnv1a_str(key)) % KB_BUCKETS;
}

/* The job is over: the next of its key starts (worker thread). */
static void fail(job_t *j, prosody_err_t err, const char *why) {
  kbusy_t *kb = j->kb, **pp;
  job_t *next = kb ? kb->head : NULL;
  if (next && !(kb->head = next->wnext))
    kb->tail = NULL;
  if (kb && !next) {
    for (pp = &j->d->busy[kb_bucket(j->seg, j->key)]; *pp != kb;)
      pp = &(*pp)->next;
    *pp = kb->next;
    free(kb);
  }
  pr__cqlw_complete(&j->job, err, why);
  if (next)
    begin(next);
}

/* The statics read: (hint, retry_count). */
static int read_statics(job_t *j, const pr__cql_result_t *res, int *probe) {
  const pr__cql_cell_t *h, *rc;
  int32_t r = 0;
  *probe = 0;
  j->found = 0;
  if (!res || res->kind != PR_CQL_RESULT_ROWS || res->nrows < 1)
    return 0;
  h = pr__cql_cell(res, 0, 0);
  rc = pr__cql_cell(res, 0, 1);
  if (rc->len >= 0 && pr__cql_get_int(rc, &r))
    return -1;
  j->retries = (r > 0 ? r : 0) + 1;
  if (h->len < 0) {
    *probe = rc->len >= 0; /* a legacy partition, or a stale count */
    return 0;
  }
  if (timers(j)) { /* next_timer: (time, span) */
    pr__cql_cell_t f[2];
    if (pr__cql_get_elements(h, res->cols[0].type, f, 2) < 1 ||
        get_pos(j, &f[0], &j->position))
      return -1;
  } else if (get_pos(j, h, &j->position)) {
    return -1;
  }
  j->found = 1;
  return 0;
}

static void answered(void *arg, prosody_err_t err, const char *errstr,
                     const pr__cql_result_t *res) {
  job_t *j = arg;
  int probe;
  if (err) {
    fail(j, err, errstr);
    return;
  }
  switch (j->step) {
  case S_STATIC:
    if (read_statics(j, res, &probe)) {
      fail(j, PROSODY_ERR_PERMANENT, "malformed deferral statics");
      return;
    }
    j->step = probe ? S_MIN : S_WRITE;
    break;
  case S_MIN:
    if (res && res->kind == PR_CQL_RESULT_ROWS && res->nrows > 0) {
      if (get_pos(j, pr__cql_cell(res, 0, 0), &j->position)) {
        fail(j, PROSODY_ERR_PERMANENT, "malformed deferral row");
        return;
      }
      j->found = 1;
    }
    j->step = S_WRITE;
    break;
  case S_AFTER:
    if (res && res->kind == PR_CQL_RESULT_ROWS && res->nrows > 0) {
      if (get_pos(j, pr__cql_cell(res, 0, 0), &j->next)) {
        fail(j, PROSODY_ERR_PERMANENT, "malformed deferral row");
        return;
      }
      j->has_next = 1;
    }
    j->step = S_WRITE + 1; /* the removal itself */
    break;
  case S_SEGMENT:
    j->step = S_WRITE + 1; /* the first row itself */
    break;
  default:
    fail(j, PROSODY_OK, NULL);
    return;
  }
  step(j);
}

/* Values (segment_id, key) into v. */
static void pk(job_t *j, pr__cql_val_t *v) {
  v[0] = pr__cv_uuid(j->id);
  v[1] = pr__cv_text(j->key);
}

/* Runs `st` with the values v[n]. */
static void run(job_t *j, pr__cql_stmt_t *st, const pr__cql_val_t *v, int n) {
  pr__cql_execute_stmt(j->cql, st, v, (uint16_t)n, NULL, answered, j);
}

/* An UPDATE of the hint (TTL, hint, segment_id, key) into v; `udt` holds
 * a timer's. */
static void hint_vals(job_t *j, int64_t position, uint8_t udt[16],
                      pr__cql_val_t *v) {
  v[0] = pr__cv_int(row_ttl(j, position));
  if (timers(j)) {
    next_timer_udt(j, position, udt);
    v[1] = pr__cv_blob(udt, 16);
  } else {
    v[1] = pr__cv_bigint(position);
  }
  pk(j, v + 2);
}

/* The segment's row: (id, topic, partition, consumer_group) from its name
 * "<topic>/<partition>:<group>". */
static void write_segment(job_t *j) {
  pr__cql_val_t v[4];
  char *slash = strchr(j->seg, '/'), *colon = slash ? strchr(slash, ':') : NULL;
  if (!slash || !colon) {
    fail(j, PROSODY_ERR_PERMANENT, "malformed segment name");
    return;
  }
  *slash = *colon = '\0';
  v[0] = pr__cv_uuid(j->id);
  v[1] = pr__cv_text(j->seg);
  v[2] = pr__cv_int((int32_t)strtol(slash + 1, NULL, 10));
  v[3] = pr__cv_text(colon + 1);
  run(j, j->d->segment, v, 4); /* values are copied */
  *slash = '/';
  *colon = ':';
}

/* The operation's writes, the statics read (step S_WRITE, or S_WRITE + 1
 * after a probe or the segment's row). */
static void write_op(job_t *j) {
  cql_defer_t *d = j->d;
  pr__cql_val_t v[8], b1[4], b2[5];
  uint8_t udt[16];
  int n = 0, later = j->step > S_WRITE;
  j->step = S_WRITE + 2; /* the last statement: its answer completes */
  switch (j->op) {
  case OP_HEAD:
    fail(j, PROSODY_OK, NULL);
    return;
  case OP_APPEND: {
    int32_t rc = j->count > 1 ? j->count - 1 : 0;
    int64_t at = j->at;
    if (!j->found && !later) { /* the key's first row: the segment's first */
      j->step = S_SEGMENT;
      write_segment(j);
      return;
    }
    pk(j, v);
    v[2] = pos_val(j, at);
    n = 3;
    if (timers(j))
      v[n++] = pr__cv_blob(empty_map, 4);
    if (!j->found) { /* retry_count and the hint with it */
      v[n++] = pr__cv_int(rc);
      if (timers(j)) {
        next_timer_udt(j, at, udt);
        v[n++] = pr__cv_blob(udt, 16);
      } else {
        v[n++] = pr__cv_bigint(at);
      }
      v[n++] = pr__cv_int(row_ttl(j, at));
      run(j, d->first, v, n);
      return;
    }
    v[n++] = pr__cv_int(row_ttl(j, at));
    if (at >= j->position) {
      run(j, d->add, v, n);
      return;
    }
    { /* below the hint: lowered with it */
      pr__cql_bstmt_t bs[2] = {{d->add, v, (uint16_t)n}, {d->set_next, b2, 4}};
      hint_vals(j, at, udt, b2);
      pr__cql_batch_run(j->cql, PR_CQL_BATCH_UNLOGGED, bs, 2, answered, j);
    }
    return;
  }
  case OP_ADVANCE:
    if (!j->found) { /* nothing live: a stale count goes too */
      pk(j, v);
      run(j, d->del_key, v, 2);
      return;
    }
    if (j->position != j->at) { /* not the head: the row alone */
      pk(j, v);
      v[2] = pos_val(j, j->at);
      run(j, d->del_row, v, 3);
      return;
    }
    if (!later) { /* the head: find the row after it first */
      j->step = S_AFTER;
      pk(j, v);
      v[2] = pos_val(j, j->position);
      run(j, d->after, v, 3);
      return;
    }
    pk(j, v);
    if (!j->has_next) { /* the last: the partition goes */
      run(j, d->del_key, v, 2);
      return;
    }
    pk(j, b1);
    b1[2] = pos_val(j, j->position);
    hint_vals(j, j->next, udt, b2); /* TTL, hint, pk; then retry_count 0 */
    {
      pr__cql_bstmt_t bs[2] = {{d->del_row, b1, 3}, {d->next_rc0, b2, 4}};
      pr__cql_batch_run(j->cql, PR_CQL_BATCH_UNLOGGED, bs, 2, answered, j);
    }
    return;
  case OP_CLEAR:
    pk(j, v);
    run(j, d->del_key, v, 2);
    return;
  default: /* OP_RETRIES */
    v[0] =
        pr__cv_int((int32_t)(d->retention_s > MAX_TTL_S ? 0 : d->retention_s));
    v[1] = pr__cv_int(j->count > 1 ? j->count - 1 : 0);
    pk(j, v + 2);
    run(j, d->set_rc, v, 4);
    return;
  }
}

static void step(job_t *j) {
  pr__cql_val_t v[2];
  switch (j->step) {
  case S_STATIC:
    pk(j, v);
    run(j, j->d->statics, v, 2);
    return;
  case S_MIN:
    pk(j, v);
    run(j, j->d->min, v, 2);
    return;
  default:
    write_op(j);
    return;
  }
}

/* Runs the job (its key's turn). */
static void begin(job_t *j) {
  if (pr__uuid_v5(pr__uuid_ns_oid, j->seg, strlen(j->seg), j->id)) {
    fail(j, PROSODY_ERR_NOMEM, "out of memory");
    return;
  }
  /* Clearing and a retry count need not read the statics. */
  j->step = j->op == OP_CLEAR || j->op == OP_RETRIES ? S_WRITE : S_STATIC;
  step(j);
}

static void defer_start(pr__cqlw_job_t *w) {
  job_t *j = (job_t *)w;
  size_t sl = strlen(j->seg), kl = strlen(j->key);
  kbusy_t **b = &j->d->busy[kb_bucket(j->seg, j->key)], *kb;
  for (kb = *b; kb; kb = kb->next)
    if (!strcmp(kb->name, j->seg) && !strcmp(kb->name + sl + 1, j->key))
      break;
  if (kb) { /* its key is busy: after the others */
    j->kb = kb;
    if (kb->tail)
      kb->tail->wnext = j;
    else
      kb->head = j;
    kb->tail = j;
    return;
  }
  if (!(kb = calloc(1, sizeof(*kb) + sl + kl + 2))) {
    pr__cqlw_complete(&j->job, PROSODY_ERR_NOMEM, "out of memory");
    return;
  }
  memcpy(kb->name, j->seg, sl + 1);
  memcpy(kb->name + sl + 1, j->key, kl + 1);
  kb->next = *b;
  *b = kb;
  j->kb = kb;
  begin(j);
}

/* The session closes: the jobs still waiting for their key fail (worker
 * thread). */
static void on_round(void *arg, int stopping) {
  cql_defer_t *d = arg;
  if (!stopping)
    return;
  for (size_t b = 0; b < KB_BUCKETS; b++)
    for (kbusy_t *kb = d->busy[b]; kb; kb = kb->next)
      while (kb->head) {
        job_t *j = kb->head;
        if (!(kb->head = j->wnext))
          kb->tail = NULL;
        pr__cqlw_complete(&j->job, PROSODY_ERR_TRANSIENT, "the store closed");
      }
}

static void post_defer(cql_defer_t *d, int op, int kind, void *cb, void *arg,
                       const char *seg, const char *key, int64_t position,
                       int32_t retries) {
  job_t *j = job_new(d->w, kind, cb, arg, seg, key);
  if (!j)
    return;
  j->job.start = defer_start;
  j->d = d;
  j->op = op;
  j->at = position;
  j->count = retries;
  pr__cqlw_post(&j->job);
}

static void cql_defer_destroy(pr__defer_t *base) {
  cql_defer_t *d = (cql_defer_t *)base;
  if (d->w)
    pr__cqlw_free(d->w);
  free(d);
}

/* The original's layout cannot list a segment's deferred keys (a key's
 * queue is its own partition): none are listed, and the engine looks a
 * key up when it needs to know. */
static void cql_keys(pr__defer_t *b, const char *segment, pr__dkeys_cb cb,
                     void *arg) {
  (void)b;
  (void)segment;
  cb(arg, PROSODY_OK, NULL, NULL, 0);
}

/* A key's retry time is not kept here (the original keeps it as a timer
 * in the timer store): nothing to write. */
static void cql_set_key(pr__defer_t *b, const char *segment, const char *key,
                        int64_t retry_at_s, pr__store_done_cb cb, void *arg) {
  (void)b;
  (void)segment;
  (void)key;
  (void)retry_at_s;
  cb(arg, PROSODY_OK, NULL);
}

/* A key whose queue is empty has no rows left: nothing to delete. */
static void cql_del_key(pr__defer_t *b, const char *segment, const char *key,
                        pr__store_done_cb cb, void *arg) {
  (void)b;
  (void)segment;
  (void)key;
  cb(arg, PROSODY_OK, NULL);
}

static void cql_append(pr__defer_t *b, const char *segment, const char *key,
                       int64_t position, int32_t retries, pr__store_done_cb cb,
                       void *arg) {
  post_defer((cql_defer_t *)b, OP_APPEND, J_DONE, (void *)cb, arg, segment, key,
             position, retries);
}

static void cql_head(pr__defer_t *b, const char *segment, const char *key,
                     pr__head_cb cb, void *arg) {
  post_defer((cql_defer_t *)b, OP_HEAD, J_HEAD, (void *)cb, arg, segment, key,
             0, 0);
}

static void cql_advance(pr__defer_t *b, const char *segment, const char *key,
                        int64_t position, pr__store_done_cb cb, void *arg) {
  post_defer((cql_defer_t *)b, OP_ADVANCE, J_DONE, (void *)cb, arg, segment,
             key, position, 0);
}

/* Every entry goes (below INT64_MAX: the layout keeps no entries apart
 * from a deferred key's queue, so none are left below a first deferral,
 * and there is nothing to trim). */
static void cql_trim(pr__defer_t *b, const char *segment, const char *key,
                     int64_t below, pr__store_done_cb cb, void *arg) {
  if (below != INT64_MAX) {
    cb(arg, PROSODY_OK, NULL);
    return;
  }
  post_defer((cql_defer_t *)b, OP_CLEAR, J_DONE, (void *)cb, arg, segment, key,
             0, 0);
}

/* The key's retry_count (one per key: the head's). */
static void cql_set_retries(pr__defer_t *b, const char *segment,
                            const char *key, int64_t position, int32_t retries,
                            pr__store_done_cb cb, void *arg) {
  post_defer((cql_defer_t *)b, OP_RETRIES, J_DONE, (void *)cb, arg, segment,
             key, position, retries);
}

static void cql_poll(pr__defer_t *b) { pr__cqlw_poll(((cql_defer_t *)b)->w); }

static const pr__defer_ops_t cql_ops = {
    cql_keys,    cql_set_key, cql_del_key,     cql_append, cql_head,
    cql_advance, cql_trim,    cql_set_retries, cql_poll,   cql_defer_destroy};

/* Prepares `fmt` with each "{k}" replaced by the keyspace, "{t}" by the
 * table, "{p}" by the position column and "{h}" by the hint column. */
static pr__cql_stmt_t *stmt(pr__cql_t *cql, const char *fmt, const char *ks,
                            const char *table, const char *pos,
                            const char *hint) {
  char q[512];
  size_t n = 0;
  for (const char *f = fmt; *f && n < sizeof(q) - 1; f++) {
    const char *with = NULL;
    if (f[0] == '{' && f[1] && f[2] == '}')
      with = f[1] == 'k'   ? ks
             : f[1] == 't' ? table
             : f[1] == 'p' ? pos
             : f[1] == 'h' ? hint
                           : NULL;
    if (!with) {
      q[n++] = *f;
      continue;
    }
    n += (size_t)snprintf(q + n, sizeof(q) - n, "%s", with);
    if (n >= sizeof(q))
      return NULL;
    f += 2;
  }
  q[n] = '\0';
  return pr__cql_stmt(cql, q);
}

pr__defer_t *pr__defer_new(pr__cqlw_t *w, const char *keyspace,
                           pr__defer_kind_t kind, int64_t retention_s,
                           char *errstr, size_t errstr_size) {
  int t = kind == PR_DEFER_TIMERS;
  const char *tb = t ? "deferred_timers" : "deferred_offsets";
  const char *pos = t ? "original_time" : "offset";
  const char *hint = t ? "next_timer" : "next_offset";
  const char *ks = keyspace;
  cql_defer_t *d = calloc(1, sizeof(*d));
  pr__cql_t *cql;
  if (!d) {
    pr__errf(errstr, errstr_size, "out of memory");
    return NULL;
  }
  d->w = pr__cqlw_ref(w);
  d->base.ops = &cql_ops;
  d->base.kind = kind;
  d->retention_s = retention_s;
  cql = pr__cqlw_cql(d->w);
  d->statics = stmt(cql,
                    "SELECT {h}, retry_count FROM {k}.{t} WHERE segment_id "
                    "= ? AND key = ? ORDER BY {p} DESC LIMIT 1",
                    ks, tb, pos, hint);
  d->min = stmt(cql,
                "SELECT {p} FROM {k}.{t} WHERE segment_id = ? AND key = ? "
                "LIMIT 1",
                ks, tb, pos, hint);
  d->after = stmt(cql,
                  "SELECT {p} FROM {k}.{t} WHERE segment_id = ? AND key = ? "
                  "AND {p} > ? LIMIT 1",
                  ks, tb, pos, hint);
  d->segment = stmt(cql,
                    "INSERT INTO {k}.deferred_segments (id, topic, "
                    "partition, consumer_group) VALUES (?, ?, ?, ?)",
                    ks, tb, pos, hint);
  d->first = stmt(cql,
                  t ? "INSERT INTO {k}.{t} (segment_id, key, {p}, span, "
                      "retry_count, {h}) VALUES (?, ?, ?, ?, ?, ?) USING TTL ?"
                    : "INSERT INTO {k}.{t} (segment_id, key, {p}, "
                      "retry_count, {h}) VALUES (?, ?, ?, ?, ?) USING TTL ?",
                  ks, tb, pos, hint);
  d->add = stmt(cql,
                t ? "INSERT INTO {k}.{t} (segment_id, key, {p}, span) "
                    "VALUES (?, ?, ?, ?) USING TTL ?"
                  : "INSERT INTO {k}.{t} (segment_id, key, {p}) VALUES (?, "
                    "?, ?) USING TTL ?",
                ks, tb, pos, hint);
  d->set_next = stmt(cql,
                     "UPDATE {k}.{t} USING TTL ? SET {h} = ? WHERE "
                     "segment_id = ? AND key = ?",
                     ks, tb, pos, hint);
  d->set_rc = stmt(cql,
                   "UPDATE {k}.{t} USING TTL ? SET retry_count = ? WHERE "
                   "segment_id = ? AND key = ?",
                   ks, tb, pos, hint);
  d->next_rc0 = stmt(cql,
                     "UPDATE {k}.{t} USING TTL ? SET {h} = ?, retry_count "
                     "= 0 WHERE segment_id = ? AND key = ?",
                     ks, tb, pos, hint);
  d->del_row = stmt(cql,
                    "DELETE FROM {k}.{t} WHERE segment_id = ? AND key = ? "
                    "AND {p} = ?",
                    ks, tb, pos, hint);
  d->del_key = stmt(cql, "DELETE FROM {k}.{t} WHERE segment_id = ? AND key = ?",
                    ks, tb, pos, hint);
  if (!d->statics || !d->min || !d->after || !d->segment || !d->first ||
      !d->add || !d->set_next || !d->set_rc || !d->next_rc0 || !d->del_row ||
      !d->del_key) {
    pr__errf(errstr, errstr_size, "out of memory");
    cql_defer_destroy(&d->base);
    return NULL;
  }
  if (pr__cqlw_on_round(d->w, on_round, d)) {
    pr__errf(errstr, errstr_size, "too many stores on one Cassandra session");
    cql_defer_destroy(&d->base);
    return NULL;
  }
  return &d->base;
}
