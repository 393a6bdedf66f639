/*
 * cqlstate.c - the Cassandra keyed-state store (see state.h), on the
 * original Prosody's tables (keyed_state_cell, keyed_state_identity), so
 * that one keyspace serves both implementations.
 *
 * Threads: as cqlstores.c, on a CQL worker (src/cql/worker.h). An
 * operation is one job, copied and posted on the owner's thread, run on the
 * worker's (a statement or a few in turn), its callback delivered on the
 * owner's by poll(). A job belongs to one thread at a time (owner, worker,
 * owner); the store's `last_ts` to the worker thread.
 *
 * Layout. A collection of a key is one partition (segment_id, key,
 * state_type, name): segment_id is the UUID v5 (OID namespace) of
 * "<topic>/<partition>:<group>", as the deferral store names a segment;
 * state_type is 0 (application state). Our cells are its kind=0 rows,
 * (section, coordinate) as the engine names them, the bytes in `data` with
 * encoding 1 (raw) and version 1. The original's kind=1 rows (its commit
 * markers) are neither read nor written.
 *
 * Reading a row: with `event` null, its value is `data` (null: no cell).
 * With `event` set, the original staged the row and stopped before it
 * resolved it (a commit in flight, or a crash); its readers decide with its
 * commit markers whether `data` or `prev_data` holds. We do not read the
 * markers and take `prev_data` (null: no cell), the value before that event:
 * the conservative choice, an event whose promotion the original never
 * finished reads as not applied (a committed one is redelivered and its
 * writes repeated, or the original's recovery resolves the row when it next
 * owns the key). A zstd blob (encoding 4: the original compresses documents
 * over 16 KiB) is refused with PROSODY_ERR_PERMANENT: not supported yet.
 *
 * Writing: apply() is one LOGGED batch of its writes, in order, and of the
 * event's deduplication row: all land or none do. A put is an UPDATE of
 * (data, encoding=1, version=1, prev_data=null, event=null) with the cell's
 * TTL (0: none), which also resolves a row the original left staged; a
 * delete is a row delete, a section's delete a range delete. Cassandra gives
 * a batch one timestamp and a delete wins a tie, so a section's delete would
 * hide the puts after it: each statement carries its own timestamp (USING
 * TIMESTAMP), increasing in the batch's order.
 *
 * Batches over Cassandra's limits are split: at most 4096 statements and
 * about 5 MiB a batch, and about 40 KiB for a batch over several partitions
 * (collections, or one and the dedup row): Cassandra refuses those over
 * batch_size_fail_threshold, 50 KiB by default. A larger apply is sent as
 * batches of one collection each, one after the other, the dedup row alone
 * last: only then is an apply not all or nothing (a failure part way leaves
 * the earlier batches applied; the event, not recorded, is retried).
 *
 * identity() reads keyed_state_identity's row of (group, 0, name) and
 * records ours with INSERT ... IF NOT EXISTS when there is none; a
 * different row (read, or returned by a lost insert) is
 * PROSODY_ERR_PERMANENT naming both. A reader's check (id->check) only
 * compares: nothing recorded is PROSODY_ERR_STATE.
 *
 * Published collections' routes are keyed_state_publication's rows of
 * (subsystem, 0, name): publish() is a plain upsert, unpublish() deletes
 * one group's rows (a range of the partition), routes() reads the first
 * 17 (PR_SROUTES_MAX + 1: one more than a reader takes) in (group, topic)
 * order.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cql/worker.h"
#include "../util/util.h"
#include "state.h"

#define MAX_TTL_S 630720000 /* Cassandra's limit: 20 years */
#define BATCH_MAX_STMTS 4096
#define BATCH_MAX_BYTES (5u * 1024 * 1024)
#define MULTI_MAX_BYTES (40u * 1024)
/* A statement's size beyond its blobs, as Cassandra counts a batch: a put
 * writes five cells of 16 bytes each (timestamp, TTL, deletion time) and
 * the clustering; rounded up. */
#define ROW_OVERHEAD 128
#define PAGE_MAX 1000 /* rows per page of a range read */
#define ENC_RAW 1     /* keyed_state_cell.encoding */
#define ENC_ZSTD 4

enum {
  OP_GET,
  OP_RANGE,
  OP_APPLY,
  OP_IDENTITY,
  OP_PUBLISH,
  OP_UNPUBLISH,
  OP_ROUTES
};

typedef struct cql_state {
  pr__sstore_t base; /* first */
  pr__cqlw_t *w;
  int64_t last_ts; /* the last statement timestamp given (worker thread) */
  int bad;         /* a statement could not be made (pr__cqlstate_new) */
  pr__cql_stmt_t *get, *first, *after, *last, *before, *put, *del, *del_sec,
      *dedup, *id_sel, *id_ins, *pub_ins, *pub_del, *pub_sel;
} cql_state_t;

/* A collection of an apply (its partition). */
typedef struct spart {
  uint8_t seg[16];
  char *key, *name;
  size_t first; /* its first write */
} spart_t;

/* A write of an apply, copied (coord and data in one block at `coord`). */
typedef struct srow {
  int op, section;
  size_t part;
  uint8_t *coord, *data;
  size_t coord_len, data_len;
  int32_t ttl;
} srow_t;

/* One operation (owner thread, then worker, then owner). */
typedef struct sjob {
  pr__cqlw_job_t job; /* first: the worker's view */
  cql_state_t *s;
  int op;   /* OP_* */
  int step; /* identity: 0 read, 1 insert */
  void *cb, *arg;
  /* get, range: the collection (key and name also name it in errors) */
  uint8_t seg[16];
  char *key, *name, *group;
  int section;
  uint8_t *coord; /* get: the cell; range: `after` (NULL: none) */
  size_t coord_len;
  int backward;
  size_t limit;
  /* answers (a get's: its cell, if any) */
  int end;
  pr__scell_t *cells; /* each cell's coord is its malloc'd block */
  size_t n, cap;
  /* apply */
  spart_t *parts;
  size_t nparts;
  srow_t *rows;
  size_t nrows;
  int has_dedup;
  uint8_t did[16];
  int32_t dedup_ttl;
  size_t *order; /* rows (nrows: the dedup row) in the order sent */
  size_t *ends;  /* each batch's end in `order` */
  size_t nbatches, batch;
  int64_t ts0; /* row i's timestamp is ts0 + i */
  /* identity */
  int8_t kind;
  int check; /* compare only */
  const char *format, *key_format;
  /* routes (publish: routes[0], the one to record; `name` and `group`
   * above), their strings owned */
  char *subsystem;
  pr__sroute_t routes[PR_SROUTES_MAX + 1];
  size_t nroutes;
} sjob_t;

static void job_free(sjob_t *j) {
  if (!j)
    return;
  free(j->key);
  free(j->name);
  free(j->group);
  free(j->coord);
  for (size_t i = 0; i < j->n; i++)
    free((void *)j->cells[i].coord);
  free(j->cells);
  for (size_t i = 0; i < j->nparts; i++) {
    free(j->parts[i].key);
    free(j->parts[i].name);
  }
  free(j->parts);
  for (size_t i = 0; i < j->nrows; i++)
    free(j->rows[i].coord);
  free(j->rows);
  free(j->order);
  free(j->ends);
  free(j->subsystem);
  for (size_t i = 0; i < j->nroutes; i++) {
    free((char *)j->routes[i].group);
    free((char *)j->routes[i].topic);
  }
  free(j);
}

/* Owner thread: the callback, then the job goes. */
static void job_deliver(pr__cqlw_job_t *w) {
  sjob_t *j = (sjob_t *)w;
  prosody_err_t err = j->job.err;
  const char *why = err ? j->job.errstr : NULL;
  switch (j->op) {
  case OP_GET:
    ((pr__sget_cb)j->cb)(j->arg, err, why, j->n ? j->cells[0].data : NULL,
                         j->n ? j->cells[0].data_len : 0, j->n > 0);
    break;
  case OP_RANGE:
    ((pr__srange_cb)j->cb)(j->arg, err, why, err ? NULL : j->cells,
                           err ? 0 : j->n, !err && j->end);
    break;
  case OP_ROUTES:
    ((pr__sroutes_cb)j->cb)(j->arg, err, why, err ? NULL : j->routes,
                            err ? 0 : j->nroutes);
    break;
  default:
    ((pr__store_done_cb)j->cb)(j->arg, err, why);
    break;
  }
  job_free(j);
}

/* Out of memory before the job `j` (may be NULL) of kind `op` was posted:
 * it goes, and its callback says so (owner thread). */
static void nomem(sjob_t *j, int op, void *cb, void *arg) {
  const char *why = "keyed state: out of memory";
  job_free(j);
  if (op == OP_GET)
    ((pr__sget_cb)cb)(arg, PROSODY_ERR_NOMEM, why, NULL, 0, 0);
  else if (op == OP_RANGE)
    ((pr__srange_cb)cb)(arg, PROSODY_ERR_NOMEM, why, NULL, 0, 0);
  else if (op == OP_ROUTES)
    ((pr__sroutes_cb)cb)(arg, PROSODY_ERR_NOMEM, why, NULL, 0);
  else
    ((pr__store_done_cb)cb)(arg, PROSODY_ERR_NOMEM, why);
}

static sjob_t *job_new(cql_state_t *s, int op, void *cb, void *arg) {
  sjob_t *j = calloc(1, sizeof(*j));
  if (!j)
    return NULL;
  j->job.w = s->w;
  j->job.deliver = job_deliver;
  j->s = s;
  j->op = op;
  j->cb = cb;
  j->arg = arg;
  return j;
}

/* The segment id of the collection's partition: the UUID v5 (OID
 * namespace) of "<topic>/<partition>:<group>", as the original names it. */
static int segment_id(const pr__scoll_t *c, uint8_t out[16]) {
  int len =
      snprintf(NULL, 0, "%s/%" PRId32 ":%s", c->topic, c->partition, c->group);
  char *name = len < 0 ? NULL : malloc((size_t)len + 1);
  int rc;
  if (!name)
    return -1;
  snprintf(name, (size_t)len + 1, "%s/%" PRId32 ":%s", c->topic, c->partition,
           c->group);
  rc = pr__uuid_v5(pr__uuid_ns_oid, name, (size_t)len, out);
  free(name);
  return rc;
}

/* Worker thread: the job is over. A timeout of the client is a store
 * failure like the others the server reports (transient); every message
 * says which operation of which collection failed. */
static void job_done(sjob_t *j, prosody_err_t err, const char *why) {
  char msg[512];
  static const char *const verb[] = {"reading",
                                     "reading",
                                     "writing",
                                     "recording the kind of",
                                     "recording the route of",
                                     "deleting the routes of",
                                     "reading the routes of"};
  if (err == PROSODY_ERR_TIMEOUT)
    err = PROSODY_ERR_TRANSIENT;
  if (err && strncmp(why ? why : "", "keyed state:", 12)) {
    if (j->op == OP_APPLY)
      snprintf(msg, sizeof(msg), "keyed state: writing %zu cell(s)%s: %s",
               j->nrows, j->has_dedup ? " and the event's dedup row" : "",
               why ? why : "");
    else if (j->op >= OP_PUBLISH)
      snprintf(msg, sizeof(msg),
               "keyed state: %s published collection \"%.64s\" of subsystem "
               "\"%.64s\": %s",
               verb[j->op], j->name, j->subsystem, why ? why : "");
    else
      snprintf(msg, sizeof(msg),
               "keyed state: %s collection \"%.64s\" (%s \"%.64s\"): %s",
               verb[j->op], j->name, j->op == OP_IDENTITY ? "group" : "key",
               j->op == OP_IDENTITY ? j->group : j->key, why ? why : "");
    why = msg;
  }
  pr__cqlw_complete(&j->job, err, why);
}

/* ---- reading cells ------------------------------------------------------ */

/* Values (segment_id, key, name, section) into v. */
static void pk(const uint8_t seg[16], const char *key, const char *name,
               int section, pr__cql_val_t *v) {
  v[0] = pr__cv_uuid(seg);
  v[1] = pr__cv_text(key);
  v[2] = pr__cv_text(name);
  v[3] = pr__cv_tinyint((int8_t)section);
}

/*
 * The value of a row (coordinate, data, prev_data, encoding, event): 1
 * with *p, *n set, 0 for no cell, -1 (why) when the store cannot read it.
 */
static int row_value(const sjob_t *j, const pr__cql_result_t *res, int32_t row,
                     const uint8_t **p, size_t *n, char *why, size_t why_size) {
  const pr__cql_cell_t *coord = pr__cql_cell(res, row, 0);
  const pr__cql_cell_t *enc = pr__cql_cell(res, row, 3);
  const pr__cql_cell_t *v =
      pr__cql_cell(res, row, pr__cql_cell(res, row, 4)->len < 0 ? 1 : 2);
  char hex[2 * 16 + 4] = "";
  int encoding = -1;
  if (v->len < 0)
    return 0;
  if (enc->len == 2)
    encoding = (int16_t)((enc->p[0] << 8) | enc->p[1]);
  if (encoding == ENC_RAW) {
    *p = v->p;
    *n = (size_t)v->len;
    return 1;
  }
  for (int32_t i = 0; i < coord->len && i < 16; i++)
    snprintf(hex + 2 * i, 3, "%02x", coord->p[i]);
  if (coord->len > 16)
    strcat(hex, "...");
  if (encoding == ENC_ZSTD)
    snprintf(why, why_size,
             "keyed state: cell (section %d, coordinate 0x%s) of collection "
             "\"%.64s\" of key \"%.64s\" is zstd-compressed (written by the "
             "original for a document over 16 KiB); not supported yet",
             j->section, hex, j->name, j->key);
  else
    snprintf(why, why_size,
             "keyed state: cell (section %d, coordinate 0x%s) of collection "
             "\"%.64s\" of key \"%.64s\" has encoding %d (1 raw or 4 zstd "
             "expected): the row is corrupt",
             j->section, hex, j->name, j->key, encoding);
  return -1;
}

static void range_page(sjob_t *j, const uint8_t *paging, int32_t paging_len);

/* A page of rows: the cells kept, then the next page while fewer than
 * limit + 1 cells are (one more than asked says whether another
 * follows). A get is a range of its one cell. */
static void range_answered(void *arg, prosody_err_t err, const char *errstr,
                           const pr__cql_result_t *res) {
  sjob_t *j = arg;
  char why[512];
  if (err) {
    job_done(j, err, errstr);
    return;
  }
  for (int32_t r = 0; res && r < res->nrows; r++) {
    const pr__cql_cell_t *coord = pr__cql_cell(res, r, 0);
    const uint8_t *p = NULL;
    size_t n = 0, cl = coord->len > 0 ? (size_t)coord->len : 0;
    uint8_t *b;
    int got = row_value(j, res, r, &p, &n, why, sizeof(why));
    if (got < 0) {
      job_done(j, PROSODY_ERR_PERMANENT, why);
      return;
    }
    if (!got) /* staged by the original with no value before */
      continue;
    if (j->n == j->limit) { /* one more than asked: not the end */
      job_done(j, PROSODY_OK, NULL);
      return;
    }
    if (pr__grow(&j->cells, &j->cap, j->n, sizeof(*j->cells), 16) ||
        !(b = malloc(cl + n + 1))) {
      job_done(j, PROSODY_ERR_NOMEM, "keyed state: out of memory");
      return;
    }
    if (cl)
      memcpy(b, coord->p, cl);
    if (n)
      memcpy(b + cl, p, n);
    j->cells[j->n++] = (pr__scell_t){j->section, b, cl, b + cl, n};
  }
  if (res && res->paging_len > 0 && res->paging_state) {
    range_page(j, res->paging_state, res->paging_len);
    return;
  }
  j->end = 1;
  job_done(j, PROSODY_OK, NULL);
}

static void range_page(sjob_t *j, const uint8_t *paging, int32_t paging_len) {
  cql_state_t *s = j->s;
  pr__cql_val_t v[5];
  pr__cql_opts_t o;
  size_t want = j->limit - j->n + 1;
  int bound = j->coord != NULL;
  pr__cql_stmt_t *st = j->op == OP_GET ? s->get
                       : j->backward   ? (bound ? s->before : s->last)
                                       : (bound ? s->after : s->first);
  memset(&o, 0, sizeof(o));
  o.page_size = want > PAGE_MAX ? PAGE_MAX : (int32_t)want;
  o.paging_state = paging;
  o.paging_len = paging_len;
  pk(j->seg, j->key, j->name, j->section, v);
  v[4] = pr__cv_blob(j->coord, (int32_t)j->coord_len);
  pr__cql_execute_stmt(pr__cqlw_cql(s->w), st, v, bound ? 5 : 4, &o,
                       range_answered, j);
}

static void range_start(pr__cqlw_job_t *w) { range_page((sjob_t *)w, NULL, 0); }

/* Copies the collection into the job; -1 when out of memory. */
static int job_coll(sjob_t *j, const pr__scoll_t *c, int section,
                    const uint8_t *coord, size_t coord_len) {
  j->section = section;
  j->coord_len = coord_len;
  if (!(j->key = strdup(c->key)) || !(j->name = strdup(c->name)) ||
      (coord && !(j->coord = malloc(coord_len + 1))))
    return -1;
  if (coord_len)
    memcpy(j->coord, coord, coord_len);
  return segment_id(c, j->seg);
}

/* Posts a read of `c` (a get: limit 1, `after` the cell itself). */
static void post_read(pr__sstore_t *b, int op, const pr__scoll_t *c,
                      int section, const uint8_t *after, size_t after_len,
                      int backward, size_t limit, void *cb, void *arg) {
  sjob_t *j = job_new((cql_state_t *)b, op, cb, arg);
  if (!j || job_coll(j, c, section, after, after ? after_len : 0)) {
    nomem(j, op, cb, arg);
    return;
  }
  j->backward = backward;
  j->limit = limit > INT32_MAX - 1 ? INT32_MAX - 1 : limit;
  j->job.start = range_start;
  pr__cqlw_post(&j->job);
}

static void cql_get(pr__sstore_t *b, const pr__scoll_t *c, int section,
                    const uint8_t *coord, size_t coord_len, pr__sget_cb cb,
                    void *arg) {
  post_read(b, OP_GET, c, section, coord ? coord : (const uint8_t *)"",
            coord ? coord_len : 0, 0, 1, (void *)cb, arg);
}

static void cql_range(pr__sstore_t *b, const pr__scoll_t *c, int section,
                      const uint8_t *after, size_t after_len, int backward,
                      size_t limit, pr__srange_cb cb, void *arg) {
  post_read(b, OP_RANGE, c, section, after, after_len, backward, limit,
            (void *)cb, arg);
}

/* ---- writing cells ------------------------------------------------------ */

static size_t row_bytes(const srow_t *r) {
  return r->coord_len + r->data_len + ROW_OVERHEAD;
}

/* Which rows each batch sends (owner thread): all in one when it fits;
 * else each collection's in order, cut at the limits of a batch, the dedup
 * row alone last. 0, or -1 when out of memory. */
static int plan(sjob_t *j) {
  size_t total = 0, nsend = j->nrows + (size_t)j->has_dedup, k = 0;
  int whole; /* one batch: every row, in order */
  if (!(j->order = malloc((nsend ? nsend : 1) * sizeof(*j->order))) ||
      !(j->ends = malloc((nsend ? nsend : 1) * sizeof(*j->ends))))
    return -1;
  for (size_t i = 0; i < j->nrows; i++)
    total += row_bytes(&j->rows[i]);
  whole = nsend <= BATCH_MAX_STMTS && total <= BATCH_MAX_BYTES &&
          (j->nparts + (size_t)j->has_dedup <= 1 || total <= MULTI_MAX_BYTES);
  for (size_t p = 0; p < (whole ? 1 : j->nparts); p++) {
    size_t count = 0, bytes = 0;
    for (size_t i = 0; i < j->nrows; i++) {
      if (!whole && j->rows[i].part != p)
        continue;
      if (count && (count == BATCH_MAX_STMTS ||
                    bytes + row_bytes(&j->rows[i]) > BATCH_MAX_BYTES)) {
        j->ends[j->nbatches++] = k;
        count = bytes = 0;
      }
      j->order[k++] = i;
      count++;
      bytes += row_bytes(&j->rows[i]);
    }
    if (count)
      j->ends[j->nbatches++] = k;
  }
  if (j->has_dedup) { /* with the rows when whole, else alone */
    j->order[k++] = j->nrows;
    if (whole && j->nbatches)
      j->nbatches--;
    j->ends[j->nbatches++] = k;
  }
  return 0;
}

static void apply_batch(sjob_t *j);

static void apply_answered(void *arg, prosody_err_t err, const char *errstr,
                           const pr__cql_result_t *res) {
  sjob_t *j = arg;
  (void)res;
  if (err || ++j->batch == j->nbatches) {
    job_done(j, err, errstr);
    return;
  }
  apply_batch(j);
}

/* Sends batch number j->batch (worker thread). */
static void apply_batch(sjob_t *j) {
  cql_state_t *s = j->s;
  size_t from = j->batch ? j->ends[j->batch - 1] : 0, to = j->ends[j->batch];
  size_t n = to - from;
  pr__cql_val_t *v = malloc(n * 8 * sizeof(*v));
  pr__cql_bstmt_t *bs = malloc(n * sizeof(*bs));
  if (!v || !bs) {
    free(v);
    free(bs);
    job_done(j, PROSODY_ERR_NOMEM, "keyed state: out of memory");
    return;
  }
  for (size_t k = 0; k < n; k++) {
    size_t i = j->order[from + k];
    pr__cql_val_t *x = v + 8 * k, *at = x;
    const srow_t *r = i < j->nrows ? &j->rows[i] : NULL;
    const spart_t *p = r ? &j->parts[r->part] : NULL;
    bs[k].values = x;
    if (!r) { /* the event's dedup row */
      x[0] = pr__cv_uuid(j->did);
      x[1] = pr__cv_int(j->dedup_ttl);
      bs[k].st = s->dedup;
      bs[k].n = 2;
      continue;
    }
    if (r->op == PR_SW_PUT) {
      *at++ = pr__cv_int(r->ttl);
      *at++ = pr__cv_bigint(j->ts0 + (int64_t)i);
      *at++ = pr__cv_blob(r->data, (int32_t)r->data_len);
    } else {
      *at++ = pr__cv_bigint(j->ts0 + (int64_t)i);
    }
    pk(p->seg, p->key, p->name, r->section, at);
    at += 4;
    if (r->op != PR_SW_DEL_SECTION)
      *at++ = pr__cv_blob(r->coord, (int32_t)r->coord_len);
    bs[k].st = r->op == PR_SW_PUT   ? s->put
               : r->op == PR_SW_DEL ? s->del
                                    : s->del_sec;
    bs[k].n = (uint16_t)(at - x);
  }
  pr__cql_batch_run(pr__cqlw_cql(s->w), PR_CQL_BATCH_LOGGED, bs, (uint16_t)n,
                    apply_answered, j);
  free(v);
  free(bs);
}

static void apply_start(pr__cqlw_job_t *w) {
  sjob_t *j = (sjob_t *)w;
  cql_state_t *s = j->s;
  int64_t now = pr__wall_ms() * 1000;
  /* Timestamps in microseconds, increasing across applies too. */
  j->ts0 = now > s->last_ts ? now : s->last_ts + 1;
  s->last_ts = j->ts0 + (int64_t)j->nrows;
  apply_batch(j);
}

static int same_coll(const pr__scoll_t *a, const pr__scoll_t *b) {
  return a == b || (a->partition == b->partition && !strcmp(a->key, b->key) &&
                    !strcmp(a->name, b->name) && !strcmp(a->topic, b->topic) &&
                    !strcmp(a->group, b->group));
}

/* Copies the writes into the job (owner thread); -1 when out of memory. */
static int copy_writes(sjob_t *j, const pr__swrite_t *w, size_t n) {
  if (!(j->rows = calloc(n ? n : 1, sizeof(*j->rows))) ||
      !(j->parts = calloc(n ? n : 1, sizeof(*j->parts))))
    return -1;
  for (size_t i = 0; i < n; i++) {
    srow_t *r = &j->rows[i];
    size_t p = i && same_coll(w[i].coll, w[i - 1].coll) ? j->rows[i - 1].part
                                                        : j->nparts;
    for (size_t q = 0; p == j->nparts && q < j->nparts; q++)
      if (same_coll(w[i].coll, w[j->parts[q].first].coll))
        p = q;
    if (p == j->nparts) {
      spart_t *sp = &j->parts[j->nparts++];
      sp->first = i;
      if (!(sp->key = strdup(w[i].coll->key)) ||
          !(sp->name = strdup(w[i].coll->name)) ||
          segment_id(w[i].coll, sp->seg))
        return -1;
    }
    r->op = w[i].op;
    r->section = w[i].section;
    r->part = p;
    r->coord_len =
        w[i].op == PR_SW_DEL_SECTION || !w[i].coord ? 0 : w[i].coord_len;
    r->data_len = w[i].op == PR_SW_PUT && w[i].data ? w[i].data_len : 0;
    r->ttl =
        w[i].ttl_s > 0 && w[i].ttl_s <= MAX_TTL_S ? (int32_t)w[i].ttl_s : 0;
    if (!(r->coord = malloc(r->coord_len + r->data_len + 1)))
      return -1;
    j->nrows = i + 1;
    r->data = r->coord + r->coord_len;
    if (r->coord_len)
      memcpy(r->coord, w[i].coord, r->coord_len);
    if (r->data_len)
      memcpy(r->data, w[i].data, r->data_len);
  }
  return 0;
}

static void cql_apply(pr__sstore_t *b, const pr__swrite_t *w, size_t n,
                      const pr__did_t *dedup, int64_t dedup_ttl_s,
                      pr__store_done_cb cb, void *arg) {
  sjob_t *j;
  for (size_t i = 0; i < n; i++)
    if (w[i].data_len > INT32_MAX || w[i].coord_len > INT32_MAX) {
      cb(arg, PROSODY_ERR_INVALID_ARG,
         "keyed state: a cell's coordinate or value is over 2 GiB");
      return;
    }
  if (!n && !dedup) { /* nothing to write */
    cb(arg, PROSODY_OK, NULL);
    return;
  }
  j = job_new((cql_state_t *)b, OP_APPLY, (void *)cb, arg);
  if (j)
    j->has_dedup = dedup != NULL;
  if (!j || copy_writes(j, w, n) || plan(j)) {
    nomem(j, OP_APPLY, (void *)cb, arg);
    return;
  }
  if (dedup) { /* the uuid's 16 bytes: hi, then lo, big-endian */
    for (int i = 0; i < 8; i++) {
      j->did[i] = (uint8_t)(dedup->hi >> (56 - 8 * i));
      j->did[8 + i] = (uint8_t)(dedup->lo >> (56 - 8 * i));
    }
    j->dedup_ttl = (int32_t)(dedup_ttl_s < 1           ? 1
                             : dedup_ttl_s > MAX_TTL_S ? MAX_TTL_S
                                                       : dedup_ttl_s);
  }
  j->job.start = apply_start;
  pr__cqlw_post(&j->job);
}

/* ---- identity ----------------------------------------------------------- */

/* keyed_state_identity.kind: value 1, map 2, deque 3 (set 4, which we do
 * not have); our kinds (prosody_state_kind_t) are value 0, map 1, deque
 * 2. */
static const char *kind_name(int id_kind) {
  static const char *const names[] = {"value", "map", "deque", "set"};
  return id_kind >= 1 && id_kind <= 4 ? names[id_kind - 1] : "unknown kind";
}

static int col_of(const pr__cql_result_t *res, const char *name) {
  for (int32_t c = 0; c < res->ncols; c++)
    if (!strcmp(res->cols[c].name, name))
      return c;
  return -1;
}

/* Compares the recorded row (row 0 of res) with ours. */
static void identity_compare(sjob_t *j, const pr__cql_result_t *res) {
  char fmt[64] = "", keys[64] = "", why[512];
  int8_t kind = 0;
  int same;
  if (pr__cql_get_tinyint(pr__cql_cell(res, 0, col_of(res, "kind")), &kind) ||
      pr__cql_get_text(pr__cql_cell(res, 0, col_of(res, "format_id")), fmt,
                       sizeof(fmt)) ||
      pr__cql_get_text(pr__cql_cell(res, 0, col_of(res, "key_format_id")), keys,
                       sizeof(keys))) {
    snprintf(why, sizeof(why),
             "keyed state: malformed keyed_state_identity "
             "row of \"%.64s\" of group \"%.64s\"",
             j->name, j->group);
    job_done(j, PROSODY_ERR_PERMANENT, why);
    return;
  }
  same = kind == j->kind && !strcmp(fmt, j->format);
  if (same && !strcmp(keys, j->key_format)) {
    job_done(j, PROSODY_OK, NULL);
    return;
  }
  /* The key formats only when they alone differ (a map of i64 keys). */
  snprintf(why, sizeof(why),
           "keyed state: collection \"%.64s\" of group \"%.64s\" is "
           "recorded as a %s (%s%s%s), not a %s (%s%s%s): give the new "
           "collection another name",
           j->name, j->group, kind_name(kind), fmt, same ? ", keys " : "",
           same ? keys : "", kind_name(j->kind), j->format,
           same ? ", keys " : "", same ? j->key_format : "");
  job_done(j, PROSODY_ERR_PERMANENT, why);
}

/* The read, then the insert when nothing was recorded: [applied], and
 * the row that won when it was not. */
static void identity_answered(void *arg, prosody_err_t err, const char *errstr,
                              const pr__cql_result_t *res) {
  sjob_t *j = arg;
  int rows = !err && res && res->kind == PR_CQL_RESULT_ROWS && res->nrows > 0;
  int applied = 0;
  if (!err && j->step == 1 &&
      (!rows || pr__cql_get_bool(pr__cql_cell(res, 0, col_of(res, "[applied]")),
                                 &applied))) {
    err = PROSODY_ERR_TRANSIENT;
    errstr = "no [applied] in the answer to an insert";
  }
  if (err) {
    job_done(j, err, errstr);
  } else if (j->step == 0 && !rows && j->check) {
    pr__cqlw_complete(&j->job, PROSODY_ERR_STATE,
                      "keyed state: no kind recorded");
  } else if (j->step == 0 && !rows) {
    pr__cql_val_t v[5] = {pr__cv_text(j->group), pr__cv_text(j->name),
                          pr__cv_tinyint(j->kind), pr__cv_text(j->format),
                          pr__cv_text(j->key_format)};
    pr__cql_opts_t o = {0};
    o.serial_consistency = PR_CQL_SERIAL;
    j->step = 1;
    pr__cql_execute_stmt(pr__cqlw_cql(j->s->w), j->s->id_ins, v, 5, &o,
                         identity_answered, j);
  } else if (applied) {
    job_done(j, PROSODY_OK, NULL);
  } else {
    identity_compare(j, res);
  }
}

static void identity_start(pr__cqlw_job_t *w) {
  sjob_t *j = (sjob_t *)w;
  pr__cql_val_t v[2] = {pr__cv_text(j->group), pr__cv_text(j->name)};
  pr__cql_execute_stmt(pr__cqlw_cql(j->s->w), j->s->id_sel, v, 2, NULL,
                       identity_answered, j);
}

static void cql_identity(pr__sstore_t *b, const char *group, const char *name,
                         const pr__sident_t *id, pr__store_done_cb cb,
                         void *arg) {
  static const char *const key_formats[] = {"unit.v1", "utf8.v1", "i64.v1"};
  sjob_t *j;
  if (id->kind < 0 || id->kind > 2 || id->payload < 0 || id->payload > 1) {
    cb(arg, PROSODY_ERR_INVALID_ARG,
       "keyed state: a collection's kind is value, map or deque, and its "
       "payload JSON or message");
    return;
  }
  j = job_new((cql_state_t *)b, OP_IDENTITY, (void *)cb, arg);
  if (!j || !(j->group = strdup(group)) || !(j->name = strdup(name))) {
    nomem(j, OP_IDENTITY, (void *)cb, arg);
    return;
  }
  j->kind = (int8_t)(id->kind + 1);
  j->check = id->check;
  j->format = id->payload == 1 ? "message-ref" : "json";
  j->key_format = key_formats[id->kind];
  j->job.start = identity_start;
  pr__cqlw_post(&j->job);
}

/* ---- routes of published collections ------------------------------------ */

static void route_answered(void *arg, prosody_err_t err, const char *errstr,
                           const pr__cql_result_t *res) {
  sjob_t *j = arg;
  char group[512], topic[512];
  int32_t parts;
  if (err || j->op != OP_ROUTES || !res) {
    job_done(j, err, errstr);
    return;
  }
  for (int32_t r = 0; r < res->nrows && j->nroutes <= PR_SROUTES_MAX; r++) {
    pr__sroute_t *x = &j->routes[j->nroutes];
    if (pr__cql_get_text(pr__cql_cell(res, r, 0), group, sizeof(group)) ||
        pr__cql_get_text(pr__cql_cell(res, r, 1), topic, sizeof(topic)) ||
        pr__cql_get_int(pr__cql_cell(res, r, 2), &parts) || parts < 1)
      continue; /* not a route we can follow */
    if (!(x->group = strdup(group)) || !(x->topic = strdup(topic))) {
      free((char *)x->group);
      x->group = NULL;
      job_done(j, PROSODY_ERR_NOMEM, "keyed state: out of memory");
      return;
    }
    x->partitions = parts;
    j->nroutes++;
  }
  job_done(j, PROSODY_OK, NULL);
}

static void route_start(pr__cqlw_job_t *w) {
  sjob_t *j = (sjob_t *)w;
  cql_state_t *s = j->s;
  pr__cql_val_t v[5] = {pr__cv_text(j->subsystem), pr__cv_text(j->name)};
  pr__cql_stmt_t *st = s->pub_sel;
  int n = 2;
  if (j->op == OP_PUBLISH) {
    v[2] = pr__cv_text(j->routes[0].group);
    v[3] = pr__cv_text(j->routes[0].topic);
    v[4] = pr__cv_int(j->routes[0].partitions);
    st = s->pub_ins;
    n = 5;
  } else if (j->op == OP_UNPUBLISH) {
    v[2] = pr__cv_text(j->group);
    st = s->pub_del;
    n = 3;
  }
  pr__cql_execute_stmt(pr__cqlw_cql(s->w), st, v, n, NULL, route_answered, j);
}

/* Posts a job on the routes of (subsystem, name). */
static void post_route(pr__sstore_t *b, int op, const char *subsystem,
                       const char *name, const pr__sroute_t *r,
                       const char *group, void *cb, void *arg) {
  sjob_t *j = job_new((cql_state_t *)b, op, cb, arg);
  if (!j || !(j->subsystem = strdup(subsystem)) || !(j->name = strdup(name)) ||
      (group && !(j->group = strdup(group)))) {
    nomem(j, op, cb, arg);
    return;
  }
  if (r) {
    j->nroutes = 1;
    j->routes[0].group = strdup(r->group);
    j->routes[0].topic = strdup(r->topic);
    j->routes[0].partitions = r->partitions;
    if (!j->routes[0].group || !j->routes[0].topic) {
      nomem(j, op, cb, arg);
      return;
    }
  }
  j->job.start = route_start;
  pr__cqlw_post(&j->job);
}

static void cql_publish(pr__sstore_t *b, const char *subsystem,
                        const char *name, const pr__sroute_t *r,
                        pr__store_done_cb cb, void *arg) {
  post_route(b, OP_PUBLISH, subsystem, name, r, NULL, (void *)cb, arg);
}

static void cql_unpublish(pr__sstore_t *b, const char *subsystem,
                          const char *name, const char *group,
                          pr__store_done_cb cb, void *arg) {
  post_route(b, OP_UNPUBLISH, subsystem, name, NULL, group, (void *)cb, arg);
}

static void cql_routes(pr__sstore_t *b, const char *subsystem, const char *name,
                       pr__sroutes_cb cb, void *arg) {
  post_route(b, OP_ROUTES, subsystem, name, NULL, NULL, (void *)cb, arg);
}

/* ---- the store ---------------------------------------------------------- */

static void cql_poll(pr__sstore_t *b) { pr__cqlw_poll(((cql_state_t *)b)->w); }

static void cql_destroy(pr__sstore_t *b) {
  cql_state_t *s = (cql_state_t *)b;
  if (s->w)
    pr__cqlw_free(s->w);
  free(s);
}

static const pr__sstore_ops_t cql_state_ops = {
    cql_get,       cql_range,  cql_apply, cql_identity, cql_publish,
    cql_unpublish, cql_routes, cql_poll,  cql_destroy};

#define PK_WHERE                                                               \
  " WHERE segment_id = ? AND key = ? AND state_type = 0 AND name = ? AND "     \
  "kind = 0 AND section = ?"
#define SEL_ROWS "SELECT coordinate, data, prev_data, encoding, event FROM "
#define DESC " ORDER BY kind DESC, section DESC, coordinate DESC"

/* Prepares `a` `keyspace` `b` (the statement's text around its table's
 * keyspace). */
static pr__cql_stmt_t *stmt(cql_state_t *s, const char *ks, const char *a,
                            const char *b) {
  char q[512];
  pr__cql_stmt_t *st = NULL;
  if ((size_t)snprintf(q, sizeof(q), "%s%s%s", a, ks, b) < sizeof(q))
    st = pr__cql_stmt(pr__cqlw_cql(s->w), q);
  s->bad |= !st;
  return st;
}

pr__sstore_t *pr__cqlstate_new(pr__cqlw_t *w, const char *keyspace,
                               char *errstr, size_t errstr_size) {
  cql_state_t *s = calloc(1, sizeof(*s));
  const char *ks = keyspace;
  if (!s) {
    pr__errf(errstr, errstr_size, "out of memory");
    return NULL;
  }
  s->w = pr__cqlw_ref(w);
  s->base.ops = &cql_state_ops;
  s->get =
      stmt(s, ks, SEL_ROWS, ".keyed_state_cell" PK_WHERE " AND coordinate = ?");
  s->first = stmt(s, ks, SEL_ROWS, ".keyed_state_cell" PK_WHERE);
  s->after =
      stmt(s, ks, SEL_ROWS, ".keyed_state_cell" PK_WHERE " AND coordinate > ?");
  s->last = stmt(s, ks, SEL_ROWS, ".keyed_state_cell" PK_WHERE DESC);
  s->before = stmt(s, ks, SEL_ROWS,
                   ".keyed_state_cell" PK_WHERE " AND coordinate < ?" DESC);
  s->put = stmt(s, ks, "UPDATE ",
                ".keyed_state_cell USING TTL ? AND TIMESTAMP ? SET data = ?, "
                "encoding = 1, version = 1, prev_data = null, event = "
                "null" PK_WHERE " AND coordinate = ?");
  s->del = stmt(s, ks, "DELETE FROM ",
                ".keyed_state_cell USING TIMESTAMP ?" PK_WHERE
                " AND coordinate = ?");
  s->del_sec = stmt(s, ks, "DELETE FROM ",
                    ".keyed_state_cell USING TIMESTAMP ?" PK_WHERE);
  s->dedup =
      stmt(s, ks, "INSERT INTO ", ".deduplication (id) VALUES (?) USING TTL ?");
  s->id_sel = stmt(s, ks, "SELECT kind, format_id, key_format_id FROM ",
                   ".keyed_state_identity WHERE group_id = ? AND state_type "
                   "= 0 AND name = ?");
  s->id_ins = stmt(s, ks, "INSERT INTO ",
                   ".keyed_state_identity (group_id, state_type, name, kind, "
                   "format_id, key_format_id) VALUES (?, 0, ?, ?, ?, ?) IF "
                   "NOT EXISTS");
  s->pub_ins = stmt(s, ks, "INSERT INTO ",
                    ".keyed_state_publication (subsystem, state_type, name, "
                    "group_id, topic, partition_count) VALUES (?, 0, ?, ?, ?, "
                    "?)");
  s->pub_del = stmt(s, ks, "DELETE FROM ",
                    ".keyed_state_publication WHERE subsystem = ? AND "
                    "state_type = 0 AND name = ? AND group_id = ?");
  s->pub_sel = stmt(s, ks, "SELECT group_id, topic, partition_count FROM ",
                    ".keyed_state_publication WHERE subsystem = ? AND "
                    "state_type = 0 AND name = ? LIMIT 17");
  if (s->bad) {
    pr__errf(errstr, errstr_size,
             "keyed state: out of memory, or keyspace "
             "name \"%.64s\" too long",
             keyspace);
    cql_destroy(&s->base);
    return NULL;
  }
  return &s->base;
}
