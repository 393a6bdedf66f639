/*
 * cqlstores.c - the Cassandra deduplication and deferral stores (see
 * stores.h). Each store owns a CQL worker (its own thread and session);
 * an operation is one job: posted by the owner, run on the worker, its
 * callback delivered back on the owner's thread by poll().
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cql/worker.h"
#include "../util/util.h"
#include "stores.h"

#define MAX_TTL_S 630720000 /* Cassandra's limit: 20 years */

enum { J_DONE, J_SEEN, J_HEAD, J_KEYS };

/* One operation of either store. */
typedef struct job {
  pr__cqlw_job_t job; /* first: the worker's view */
  void (*start)(struct job *j);
  pr__cql_stmt_t *st;
  pr__cql_t *cql;
  int kind; /* J_*: which callback */
  pr__store_done_cb done;
  pr__seen_cb seen_cb;
  pr__head_cb head_cb;
  pr__dkeys_cb keys_cb;
  void *arg;
  char *a, *b; /* scope and id, or segment and key */
  int64_t n;   /* position, or TTL */
  int32_t r;   /* retries */
  int nvals;   /* values the statement takes */
  int found;   /* results */
  int64_t position;
  int32_t retries;
  pr__dkey_t *keys; /* J_KEYS: the rows (keys owned) */
  size_t nkeys;
} job_t;

static void job_free(job_t *j) {
  for (size_t i = 0; i < j->nkeys; i++)
    free((char *)j->keys[i].key);
  free(j->keys);
  free(j->a);
  free(j->b);
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
  else if (j->kind == J_KEYS)
    j->keys_cb(j->arg, err, why, err ? NULL : j->keys, err ? 0 : j->nkeys);
  else
    j->head_cb(j->arg, err, why, !err && j->found, j->position, j->retries);
  job_free(j);
}

static void job_start(pr__cqlw_job_t *w) {
  job_t *j = (job_t *)w;
  j->start(j);
}

/* Fills a new job; on out of memory reports to the callback and returns
 * NULL. */
static job_t *job_new(pr__cqlw_t *worker, int kind, void *cb, void *arg,
                      const char *a, const char *b) {
  job_t *j = calloc(1, sizeof(*j));
  if (j && (!(j->a = strdup(a)) || !(j->b = strdup(b)))) {
    job_free(j);
    j = NULL;
  }
  if (!j) {
    if (kind == J_DONE)
      ((pr__store_done_cb)cb)(arg, PROSODY_ERR_NOMEM, "out of memory");
    else if (kind == J_SEEN)
      ((pr__seen_cb)cb)(arg, PROSODY_ERR_NOMEM, "out of memory", 0);
    else if (kind == J_KEYS)
      ((pr__dkeys_cb)cb)(arg, PROSODY_ERR_NOMEM, "out of memory", NULL, 0);
    else
      ((pr__head_cb)cb)(arg, PROSODY_ERR_NOMEM, "out of memory", 0, 0, 0);
    return NULL;
  }
  j->job.w = worker;
  j->job.start = job_start;
  j->job.deliver = job_deliver;
  j->kind = kind;
  j->arg = arg;
  if (kind == J_DONE)
    j->done = (pr__store_done_cb)cb;
  else if (kind == J_SEEN)
    j->seen_cb = (pr__seen_cb)cb;
  else if (kind == J_KEYS)
    j->keys_cb = (pr__dkeys_cb)cb;
  else
    j->head_cb = (pr__head_cb)cb;
  return j;
}

/* A keys listing's rows (key, retry_at) into j->keys (worker thread). */
static prosody_err_t keys_of(job_t *j, const pr__cql_result_t *res) {
  if (!(j->keys = calloc((size_t)res->nrows, sizeof(*j->keys))))
    return PROSODY_ERR_NOMEM;
  for (int32_t r = 0; r < res->nrows; r++) {
    const pr__cql_cell_t *k = pr__cql_cell(res, r, 0);
    char *key = k->len >= 0 ? malloc((size_t)k->len + 1) : NULL;
    if (!key)
      return k->len >= 0 ? PROSODY_ERR_NOMEM : PROSODY_ERR_PERMANENT;
    j->keys[j->nkeys++].key = key;
    if (pr__cql_get_text(k, key, (size_t)k->len + 1) ||
        pr__cql_get_bigint(pr__cql_cell(res, r, 1),
                           &j->keys[j->nkeys - 1].retry_at_s))
      return PROSODY_ERR_PERMANENT;
  }
  return PROSODY_OK;
}

/* The statement's answer (worker thread): rows give `found` and, for a
 * head, its position and retry count. */
static void answered(void *arg, prosody_err_t err, const char *errstr,
                     const pr__cql_result_t *res) {
  job_t *j = arg;
  if (!err && j->kind == J_KEYS && res && res->kind == PR_CQL_RESULT_ROWS &&
      res->nrows > 0) {
    err = keys_of(j, res);
    errstr = err == PROSODY_ERR_NOMEM ? "out of memory"
                                      : "malformed deferred key row";
  } else if (!err && res && res->kind == PR_CQL_RESULT_ROWS && res->nrows > 0) {
    j->found = 1;
    if (j->kind == J_HEAD &&
        (pr__cql_get_bigint(pr__cql_cell(res, 0, 0), &j->position) ||
         pr__cql_get_int(pr__cql_cell(res, 0, 1), &j->retries))) {
      err = PROSODY_ERR_PERMANENT;
      errstr = "malformed deferral row";
    }
  }
  pr__cqlw_complete(&j->job, err, errstr);
}

/* Runs j->st with values (a, b[, n[, r]]) in the order the statements take
 * them (see the constructors). */
static void run_stmt(job_t *j) {
  pr__cql_val_t v[4];
  int n = 0;
  v[n++] = pr__cv_text(j->a);
  v[n++] = pr__cv_text(j->b);
  if (j->nvals >= 3)
    v[n++] = pr__cv_bigint(j->n);
  if (j->nvals >= 4)
    v[n++] = pr__cv_int(j->r);
  pr__cql_execute_stmt(j->cql, j->st, v, (uint16_t)n, NULL, answered, j);
}

/* ---- dedup -------------------------------------------------------------- */

typedef struct cql_dedup {
  pr__dedup_t base; /* first */
  pr__cqlw_t *w;
  pr__cql_stmt_t *sel, *ins;
} cql_dedup_t;

/* An id as the table keeps it: 32 hex digits. */
static void hex(pr__did_t d, char out[33]) {
  snprintf(out, 33, "%016" PRIx64 "%016" PRIx64, d.hi, d.lo);
}

static void dedup_record_start(job_t *j) {
  pr__cql_val_t v[3] = {pr__cv_text(j->a), pr__cv_text(j->b),
                        pr__cv_int((int32_t)j->n)};
  pr__cql_execute_stmt(j->cql, j->st, v, 3, NULL, answered, j);
}

static void cql_seen(pr__dedup_t *b, const char *scope, pr__did_t id,
                     pr__seen_cb cb, void *arg) {
  cql_dedup_t *d = (cql_dedup_t *)b;
  char idx[33];
  job_t *j;
  hex(id, idx);
  if (!(j = job_new(d->w, J_SEEN, (void *)cb, arg, scope, idx)))
    return;
  j->start = run_stmt;
  j->st = d->sel;
  j->cql = pr__cqlw_cql(d->w);
  j->nvals = 2;
  pr__cqlw_post(&j->job);
}

static void cql_record(pr__dedup_t *b, const char *scope, pr__did_t id,
                       int64_t ttl_s, pr__store_done_cb cb, void *arg) {
  cql_dedup_t *d = (cql_dedup_t *)b;
  char idx[33];
  job_t *j;
  hex(id, idx);
  if (!(j = job_new(d->w, J_DONE, (void *)cb, arg, scope, idx)))
    return;
  j->start = dedup_record_start;
  j->st = d->ins;
  j->cql = pr__cqlw_cql(d->w);
  j->n = ttl_s < 1 ? 1 : ttl_s > MAX_TTL_S ? MAX_TTL_S : ttl_s;
  pr__cqlw_post(&j->job);
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

pr__dedup_t *pr__dedup_new(const pr__cql_conf_t *conf, const char *keyspace,
                           void (*wake)(void *), void *wake_arg, char *errstr,
                           size_t errstr_size) {
  cql_dedup_t *d = calloc(1, sizeof(*d));
  char q[256];
  if (!d || !(d->w = pr__cqlw_new(conf, wake, wake_arg, errstr, errstr_size))) {
    if (!d)
      pr__errf(errstr, errstr_size, "out of memory");
    free(d);
    return NULL;
  }
  d->base.ops = &cql_dedup_ops;
  snprintf(q, sizeof(q),
           "SELECT id FROM %s.dedup_ids WHERE scope = ? AND id = ?", keyspace);
  d->sel = pr__cql_stmt(pr__cqlw_cql(d->w), q);
  /* TTL last: bound as the statement's third value (a bigint would not do:
   * TTL is an int). */
  snprintf(q, sizeof(q),
           "INSERT INTO %s.dedup_ids (scope, id) VALUES (?, ?) USING TTL ?",
           keyspace);
  d->ins = pr__cql_stmt(pr__cqlw_cql(d->w), q);
  if (!d->sel || !d->ins || pr__cqlw_start(d->w, errstr, errstr_size)) {
    if (!d->sel || !d->ins)
      pr__errf(errstr, errstr_size, "out of memory");
    cql_dedup_destroy(&d->base);
    return NULL;
  }
  return &d->base;
}

/* ---- deferral ----------------------------------------------------------- */

/* The Cassandra deferral store. */
typedef struct cql_defer {
  pr__defer_t base; /* first */
  pr__cqlw_t *w;
  int64_t retention_s;
  pr__cql_stmt_t *ins, *head, *del, *trim, *upd, *keys, *key_ins, *key_del;
} cql_defer_t;

static void cql_defer_destroy(pr__defer_t *base) {
  cql_defer_t *d = (cql_defer_t *)base;
  if (d->w)
    pr__cqlw_free(d->w);
  free(d);
}

static void post_defer(cql_defer_t *d, pr__cql_stmt_t *st, int kind, void *cb,
                       void *arg, const char *segment, const char *key,
                       int nvals, int64_t position, int32_t retries,
                       void (*start)(job_t *)) {
  job_t *j = job_new(d->w, kind, cb, arg, segment, key);
  if (!j)
    return;
  j->start = start;
  j->st = st;
  j->cql = pr__cqlw_cql(d->w);
  j->nvals = nvals;
  j->n = position;
  j->r = retries;
  pr__cqlw_post(&j->job);
}

/* UPDATE takes retry_count first, then the key columns. */
static void update_start(job_t *j) {
  pr__cql_val_t v[4] = {pr__cv_int(j->r), pr__cv_text(j->a), pr__cv_text(j->b),
                        pr__cv_bigint(j->n)};
  pr__cql_execute_stmt(j->cql, j->st, v, 4, NULL, answered, j);
}

/* A statement of the segment alone. */
static void segment_start(job_t *j) {
  pr__cql_val_t v[1] = {pr__cv_text(j->a)};
  pr__cql_execute_stmt(j->cql, j->st, v, 1, NULL, answered, j);
}

static void cql_append(pr__defer_t *b, const char *segment, const char *key,
                       int64_t position, int32_t retries, pr__store_done_cb cb,
                       void *arg) {
  cql_defer_t *d = (cql_defer_t *)b;
  post_defer(d, d->ins, J_DONE, (void *)cb, arg, segment, key, 4, position,
             retries, run_stmt);
}

static void cql_head(pr__defer_t *b, const char *segment, const char *key,
                     pr__head_cb cb, void *arg) {
  cql_defer_t *d = (cql_defer_t *)b;
  post_defer(d, d->head, J_HEAD, (void *)cb, arg, segment, key, 2, 0, 0,
             run_stmt);
}

static void cql_advance(pr__defer_t *b, const char *segment, const char *key,
                        int64_t position, pr__store_done_cb cb, void *arg) {
  cql_defer_t *d = (cql_defer_t *)b;
  post_defer(d, d->del, J_DONE, (void *)cb, arg, segment, key, 3, position, 0,
             run_stmt);
}

static void cql_trim(pr__defer_t *b, const char *segment, const char *key,
                     int64_t below, pr__store_done_cb cb, void *arg) {
  cql_defer_t *d = (cql_defer_t *)b;
  post_defer(d, d->trim, J_DONE, (void *)cb, arg, segment, key, 3, below, 0,
             run_stmt);
}

static void cql_set_retries(pr__defer_t *b, const char *segment,
                            const char *key, int64_t position, int32_t retries,
                            pr__store_done_cb cb, void *arg) {
  cql_defer_t *d = (cql_defer_t *)b;
  post_defer(d, d->upd, J_DONE, (void *)cb, arg, segment, key, 4, position,
             retries, update_start);
}

static void cql_keys(pr__defer_t *b, const char *segment, pr__dkeys_cb cb,
                     void *arg) {
  cql_defer_t *d = (cql_defer_t *)b;
  post_defer(d, d->keys, J_KEYS, (void *)cb, arg, segment, "", 1, 0, 0,
             segment_start);
}

static void cql_set_key(pr__defer_t *b, const char *segment, const char *key,
                        int64_t retry_at_s, pr__store_done_cb cb, void *arg) {
  cql_defer_t *d = (cql_defer_t *)b;
  post_defer(d, d->key_ins, J_DONE, (void *)cb, arg, segment, key, 3,
             retry_at_s, 0, run_stmt);
}

static void cql_del_key(pr__defer_t *b, const char *segment, const char *key,
                        pr__store_done_cb cb, void *arg) {
  cql_defer_t *d = (cql_defer_t *)b;
  post_defer(d, d->key_del, J_DONE, (void *)cb, arg, segment, key, 2, 0, 0,
             run_stmt);
}

static void cql_poll(pr__defer_t *b) { pr__cqlw_poll(((cql_defer_t *)b)->w); }

static const pr__defer_ops_t cql_ops = {
    cql_keys,    cql_set_key, cql_del_key,     cql_append, cql_head,
    cql_advance, cql_trim,    cql_set_retries, cql_poll,   cql_defer_destroy};

pr__defer_t *pr__defer_new(const pr__cql_conf_t *conf, const char *keyspace,
                           pr__defer_kind_t kind, int64_t retention_s,
                           void (*wake)(void *), void *wake_arg, char *errstr,
                           size_t errstr_size) {
  const char *table =
      kind == PR_DEFER_MESSAGES ? "deferred_messages" : "deferred_timer_queue";
  const char *col = kind == PR_DEFER_MESSAGES ? "message_offset" : "time";
  cql_defer_t *d = calloc(1, sizeof(*d));
  pr__cql_t *cql;
  char q[256];
  if (!d || !(d->w = pr__cqlw_new(conf, wake, wake_arg, errstr, errstr_size))) {
    if (!d)
      pr__errf(errstr, errstr_size, "out of memory");
    free(d);
    return NULL;
  }
  d->base.ops = &cql_ops;
  d->base.kind = kind;
  d->retention_s = retention_s > MAX_TTL_S ? MAX_TTL_S : retention_s;
  cql = pr__cqlw_cql(d->w);
  snprintf(q, sizeof(q),
           "INSERT INTO %s.%s (segment, key, %s, retry_count) VALUES (?, ?, "
           "?, ?) USING TTL %lld",
           keyspace, table, col, (long long)d->retention_s);
  d->ins = pr__cql_stmt(cql, q);
  snprintf(q, sizeof(q),
           "SELECT %s, retry_count FROM %s.%s WHERE segment = ? AND key = ? "
           "LIMIT 1",
           col, keyspace, table);
  d->head = pr__cql_stmt(cql, q);
  snprintf(q, sizeof(q),
           "DELETE FROM %s.%s WHERE segment = ? AND key = ? AND %s = ?",
           keyspace, table, col);
  d->del = pr__cql_stmt(cql, q);
  snprintf(q, sizeof(q),
           "DELETE FROM %s.%s WHERE segment = ? AND key = ? AND %s < ?",
           keyspace, table, col);
  d->trim = pr__cql_stmt(cql, q);
  /* An UPDATE creates a missing row: callers set the head they read. */
  snprintf(q, sizeof(q),
           "UPDATE %s.%s USING TTL %lld SET retry_count = ? WHERE segment = ? "
           "AND key = ? AND %s = ?",
           keyspace, table, (long long)d->retention_s, col);
  d->upd = pr__cql_stmt(cql, q);
  snprintf(q, sizeof(q),
           "SELECT key, retry_at FROM %s.deferred_keys WHERE segment = ? AND "
           "kind = %d",
           keyspace, (int)kind);
  d->keys = pr__cql_stmt(cql, q);
  snprintf(q, sizeof(q),
           "INSERT INTO %s.deferred_keys (segment, kind, key, retry_at) VALUES "
           "(?, %d, ?, ?) USING TTL %lld",
           keyspace, (int)kind, (long long)d->retention_s);
  d->key_ins = pr__cql_stmt(cql, q);
  snprintf(q, sizeof(q),
           "DELETE FROM %s.deferred_keys WHERE segment = ? AND kind = %d AND "
           "key = ?",
           keyspace, (int)kind);
  d->key_del = pr__cql_stmt(cql, q);
  if (!d->ins || !d->head || !d->del || !d->trim || !d->upd || !d->keys ||
      !d->key_ins || !d->key_del || pr__cqlw_start(d->w, errstr, errstr_size)) {
    if (!d->ins || !d->head || !d->del || !d->trim || !d->upd || !d->keys ||
        !d->key_ins || !d->key_del)
      pr__errf(errstr, errstr_size, "out of memory");
    cql_defer_destroy(&d->base);
    return NULL;
  }
  return &d->base;
}
