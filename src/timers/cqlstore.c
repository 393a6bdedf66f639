/*
 * cqlstore.c - the Cassandra timer store: the store interface of timers.h
 * over a CQL session, on the tables of src/cql/schema/0001_timers.cql. A
 * segment is "<group>/<topic>/<partition>". Writes go to timers_by_slab,
 * timers_by_key and timer_slabs in one logged batch (all or nothing), with
 * a TTL of (time - now) + retention.
 *
 * Threads: the CQL session runs on a worker thread (worker.h), so it keeps
 * working while the engine thread blocks (draining a revoked partition
 * waits for fired timers' deletes). Operations are posted from the engine
 * thread, run on the worker, and delivered back on the engine thread by
 * poll(). Each op is owned by one thread at a time.
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

typedef struct op op_t;

typedef struct cqlstore {
  pr__tstore_t base;
  pr__cqlw_t *w;
  pr__cql_t *cql; /* the worker's session: worker thread only */
  char *group;
  int64_t slab_s, retention_s;
  pr__cql_stmt_t *ins_slab, *ins_key, *ins_slabs, *del_slab, *del_key, *sel_key,
      *sel_slabs, *sel_slab;
} cqlstore_t;

enum { R_DONE, R_TIMES, R_RECS };

/* One operation in progress. */
struct op {
  pr__cqlw_job_t job; /* first: the worker's view of it */
  cqlstore_t *st;
  void (*start)(op_t *o); /* runs on the worker thread */
  int result;             /* R_*: which callback gets it */
  int64_t time_s;
  char *segment; /* "<group>/<topic>/<partition>" */
  char *key;
  int64_t keep_s;
  pr__timer_type_t type;
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
};

/* The op is finished (worker thread). */
static void complete(op_t *o, prosody_err_t err, const char *errstr) {
  pr__cqlw_complete(&o->job, err, errstr);
}

static void op_start(pr__cqlw_job_t *j) {
  op_t *o = (op_t *)j;
  o->start(o);
}

static void op_deliver(pr__cqlw_job_t *j);

/* Queues an op for the worker (engine thread). */
static void post(op_t *o) {
  o->job.w = o->st->w;
  o->job.start = op_start;
  o->job.deliver = op_deliver;
  pr__cqlw_post(&o->job);
}

static void op_free(op_t *o) {
  free(o->segment);
  for (size_t i = 0; i < o->nrecs; i++)
    free((char *)o->recs[i].key);
  free(o->recs);
  free(o->times);
  free(o->paging);
  free(o->key);
  free(o);
}

static op_t *op_new(cqlstore_t *st, const pr__tseg_t *seg, const char *key) {
  op_t *o = calloc(1, sizeof(*o));
  if (!o)
    return NULL;
  o->st = st;
  size_t n = strlen(st->group) + strlen(seg->topic) + 16;
  if (!(o->segment = malloc(n)) || (key && !(o->key = strdup(key)))) {
    free(o->segment);
    free(o);
    return NULL;
  }
  snprintf(o->segment, n, "%s/%s/%d", st->group, seg->topic, seg->partition);
  return o;
}

static int32_t ttl_for(const cqlstore_t *st, int64_t time_s) {
  int64_t ttl = time_s - pr__wall_ms() / 1000;
  ttl = (ttl > 0 ? ttl : 0) + st->retention_s;
  return (int32_t)(ttl > MAX_TTL_S ? MAX_TTL_S : ttl < 1 ? 1 : ttl);
}

static void done_cb(void *arg, prosody_err_t err, const char *errstr,
                    const pr__cql_result_t *res) {
  (void)res;
  complete(arg, err, errstr);
}

static void start_put(op_t *o) {
  cqlstore_t *st = o->st;
  const char *key = o->key;
  int64_t time_s = o->time_s;
  int64_t slab = pr__slab_of(time_s, st->slab_s);
  int32_t ttl = ttl_for(st, time_s);
  pr__timer_type_t type = o->type;
  pr__cql_val_t a[6], b[5], c[3];
  pr__cql_bstmt_t batch[3];
  a[0] = pr__cv_text(o->segment);
  a[1] = pr__cv_bigint(slab);
  a[2] = pr__cv_bigint(time_s);
  a[3] = pr__cv_text(key);
  a[4] = pr__cv_tinyint((int8_t)type);
  a[5] = pr__cv_int(ttl);
  b[0] = pr__cv_text(o->segment);
  b[1] = pr__cv_text(key);
  b[2] = pr__cv_tinyint((int8_t)type);
  b[3] = pr__cv_bigint(time_s);
  b[4] = pr__cv_int(ttl);
  c[0] = pr__cv_text(o->segment);
  c[1] = pr__cv_bigint(slab);
  c[2] = pr__cv_int(ttl);
  batch[0] = (pr__cql_bstmt_t){st->ins_slab, a, 6};
  batch[1] = (pr__cql_bstmt_t){st->ins_key, b, 5};
  batch[2] = (pr__cql_bstmt_t){st->ins_slabs, c, 3};
  pr__cql_batch_run(st->cql, PR_CQL_BATCH_LOGGED, batch, 3, done_cb, o);
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
                       int64_t time_s, pr__timer_type_t type,
                       void (*start)(op_t *), pr__tstore_done_cb cb,
                       void *arg) {
  op_t *o = op_for(s, seg, key, R_DONE, start, (void *)cb, arg);
  if (o) {
    o->time_s = time_s;
    o->type = type;
    post(o);
  }
}

static void c_put(pr__tstore_t *s, const pr__tseg_t *seg, const char *key,
                  int64_t time_s, pr__timer_type_t type, pr__tstore_done_cb cb,
                  void *arg) {
  post_timer(s, seg, key, time_s, type, start_put, cb, arg);
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

static void start_del(op_t *o) {
  delete_times(o->st, o, o->key, &o->time_s, 1, done_cb);
}

static void c_del(pr__tstore_t *s, const pr__tseg_t *seg, const char *key,
                  int64_t time_s, pr__timer_type_t type, pr__tstore_done_cb cb,
                  void *arg) {
  post_timer(s, seg, key, time_s, type, start_del, cb, arg);
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
    const pr__cql_cell_t *kc = pr__cql_cell(res, i, 0);
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
  STMT(ins_key,
       "INSERT INTO %s.timers_by_key (segment, key, type, time) VALUES (?, "
       "?, ?, ?) USING TTL ?",
       keyspace);
  STMT(ins_slabs,
       "INSERT INTO %s.timer_slabs (segment, slab) VALUES (?, ?) USING TTL ?",
       keyspace);
  STMT(del_slab,
       "DELETE FROM %s.timers_by_slab WHERE segment = ? AND slab = ? AND "
       "time = ? AND key = ? AND type = ?",
       keyspace);
  STMT(del_key,
       "DELETE FROM %s.timers_by_key WHERE segment = ? AND key = ? AND type "
       "= ? AND time = ?",
       keyspace);
  STMT(sel_key,
       "SELECT time FROM %s.timers_by_key WHERE segment = ? AND key = ? AND "
       "type = ?",
       keyspace);
  STMT(sel_slabs, "SELECT slab FROM %s.timer_slabs WHERE segment = ?",
       keyspace);
  STMT(sel_slab,
       "SELECT key, time, type FROM %s.timers_by_slab WHERE segment = ? AND "
       "slab = ?",
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
