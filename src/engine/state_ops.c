/*
 * state_ops.c - keyed state's operations (prosody_state_open, _call,
 * _async): checked and copied on the caller's thread (state_args.c), run on
 * the engine thread against the attempt's transaction, reading the store
 * through it; answered to the caller. The kinds' own steps are
 * state_kinds.c's.
 *
 * Threads: the public functions on any thread; the rest on the engine
 * thread (or, for a published read, pr__st_run_read's steps on the reader
 * thread: state_pub.c).
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "state.h"

/* ---- operations -----------------------------------------------------------
 */

void pr__st_sop_free_args(sop_t *op) {
  free(op->key);
  for (size_t i = 0; i < op->nkeys; i++)
    free(op->keys ? op->keys[i] : NULL);
  free(op->keys);
  free(op->json);
  free(op->after);
  free(op->got);
  free(op->rc);
  free(op->scan_after);
  free(op->w);
  for (size_t i = 0; i < op->nrows; i++)
    free(op->rows[i].coord);
  free(op->rows);
  op->key = op->json = op->after = NULL;
  op->keys = NULL;
  op->got = op->rc = op->scan_after = NULL;
  op->rows = NULL;
  op->nrows = 0;
  op->w = NULL;
}

PROSODY_EXPORT void prosody_state_result_free(prosody_state_result_t *r) {
  if (!r)
    return;
  for (size_t i = 0; i < r->n; i++) {
    free((char *)r->items[i].key);
    free((char *)r->items[i].json);
    pr__st_message_free(r->items[i].message);
  }
  free(r->items);
  r->items = NULL;
  r->n = 0;
}

/* Appends an item (copies; NULL for none); -1 when out of memory. */
int pr__st_add_item(sop_t *op, const void *key, size_t key_len,
                    const void *json, size_t json_len) {
  prosody_state_item_t *it;
  if (op->r.n == op->rcap) {
    size_t cap = op->rcap ? op->rcap * 2 : 4;
    prosody_state_item_t *x = realloc(op->r.items, cap * sizeof(*x));
    if (!x)
      return -1;
    op->r.items = x;
    op->rcap = cap;
  }
  it = &op->r.items[op->r.n];
  memset(it, 0, sizeof(*it));
  if (key) {
    char *k = malloc(key_len + 1);
    if (!k)
      return -1;
    memcpy(k, key, key_len);
    k[key_len] = 0;
    it->key = k;
    it->key_len = key_len;
  }
  if (json) {
    char *j = malloc(json_len + 1);
    if (!j) {
      free((char *)it->key);
      return -1;
    }
    memcpy(j, json, json_len);
    j[json_len] = 0;
    it->json = j;
    it->json_len = json_len;
  }
  op->r.n++;
  return 0;
}

/* The operation's end: answered, and the transaction let go. */
void pr__st_sop_done(sop_t *op, prosody_err_t err, const char *fmt, ...) {
  pr__stx_t *t = op->stx;
  char why[512] = "";
  if (!err && op->payload == PROSODY_STATE_MESSAGE && !op->resolving &&
      op->r.n) {
    pr__st_resolve(op, pr__st_sop_done); /* the records first; it answers */
    return;
  }
  if (fmt) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
  }
  if (err)
    prosody_state_result_free(&op->r);
  pr__st_sop_free_args(op);
  if (t) {
    op->stx = NULL;
    if (--t->busy == 0 && !t->inv && !t->retry)
      pr__st_stx_free(t);
  }
  if (op->cb) {
    op->cb(err, err ? why : NULL, err ? NULL : &op->r, op->opaque);
    prosody_state_result_free(&op->r);
    free(op);
    return;
  }
  pthread_mutex_lock(&op->lock);
  op->err = err;
  snprintf(op->errstr, sizeof(op->errstr), "%s", why);
  op->done = 1;
  pthread_cond_signal(&op->cond);
  pthread_mutex_unlock(&op->lock);
}

static void step(sop_t *op);

/* The attempt ended while the operation waited. */
static int fenced(sop_t *op) {
  if (!op->stx || (op->stx->inv && !op->stx->closed))
    return 0;
  pr__st_sop_done(
      op, PROSODY_ERR_STATE,
      "keyed state: the handle's attempt has ended (a handle is valid "
      "only in the handler invocation that opened it)");
  return 1;
}

/* ---- reads ----------------------------------------------------------- */

static void got_cell(void *arg, prosody_err_t err, const char *errstr,
                     const uint8_t *data, size_t data_len, int found) {
  sop_t *op = arg;
  if (fenced(op))
    return;
  if (err) {
    pr__st_sop_done(op,
                    err == PROSODY_ERR_PERMANENT ? err : PROSODY_ERR_TRANSIENT,
                    "keyed state: reading \"%s\" failed: %s", op->coll->name,
                    errstr ? errstr : prosody_err_name(err));
    return;
  }
  if (pr__st_ov_set(op->coll, op->rc_section, op->rc, op->rc_len,
                    found ? data : NULL, data_len, 0) ||
      (found && !(op->got = malloc(data_len + 1)))) {
    pr__st_sop_done(op, PROSODY_ERR_NOMEM, "out of memory");
    return;
  }
  if (found) {
    memcpy(op->got, data, data_len);
    op->got[data_len] = 0;
    op->got_len = data_len;
  }
  step(op);
}

/* Reads a cell into op->got (NULL: absent), then steps on. */
void pr__st_read_cell(sop_t *op, int section, const uint8_t *coord,
                      size_t len) {
  scoll_t *c = op->coll;
  ocell_t *x = pr__st_ov_find(c, section, coord, len);
  pr__sstore_t *s = op->store;
  pr__scoll_t a;
  free(op->got);
  op->got = NULL;
  op->got_len = 0;
  if (x || c->complete[section]) {
    if (x && x->data) {
      if (!(op->got = malloc(x->data_len + 1))) {
        pr__st_sop_done(op, PROSODY_ERR_NOMEM, "out of memory");
        return;
      }
      memcpy(op->got, x->data, x->data_len);
      op->got[x->data_len] = 0;
      op->got_len = x->data_len;
    }
    step(op);
    return;
  }
  free(op->rc);
  if (!(op->rc = malloc(len + 1))) {
    pr__st_sop_done(op, PROSODY_ERR_NOMEM, "out of memory");
    return;
  }
  if (len)
    memcpy(op->rc, coord, len);
  op->rc_len = len;
  op->rc_section = section;
  a = op->stx ? pr__st_addr_of(op->stx, c) : op->paddr;
  s->ops->get(s, &a, section, coord, len, got_cell, op);
}

static void rows_free(sop_t *op) {
  for (size_t i = 0; i < op->nrows; i++)
    free(op->rows[i].coord);
  free(op->rows);
  op->rows = NULL;
  op->nrows = 0;
}

/* Appends a row (copies); -1 when out of memory. */
static int add_row(sop_t *op, const uint8_t *coord, size_t len,
                   const uint8_t *data, size_t data_len) {
  row_t *r;
  uint8_t *buf;
  if (!(buf = malloc(len + data_len + 2)))
    return -1;
  r = realloc(op->rows, (op->nrows + 1) * sizeof(*r));
  if (!r) {
    free(buf);
    return -1;
  }
  op->rows = r;
  r = &op->rows[op->nrows++];
  r->coord = buf;
  if (len)
    memcpy(buf, coord, len);
  r->coord_len = len;
  r->data = buf + len + 1;
  if (data_len)
    memcpy(r->data, data, data_len);
  r->data[data_len] = 0;
  r->data_len = data_len;
  return 0;
}

/* Is `x` (section `sec`) inside the scan's window: past op->after in the
 * scan's direction, and not past `bound` (NULL: unbounded)? */
static int in_window(const sop_t *op, int sec, const ocell_t *x,
                     const uint8_t *bound, size_t bound_len) {
  int dir = op->scan_backward ? -1 : 1;
  if (x->section != sec)
    return 0;
  if (op->scan_after &&
      dir * pr__scell_cmp(sec, x->coord, x->coord_len, sec, op->scan_after,
                          op->scan_after_len) <=
          0)
    return 0;
  if (bound &&
      dir * pr__scell_cmp(sec, x->coord, x->coord_len, sec, bound, bound_len) >
          0)
    return 0;
  return 1;
}

/* The overlay's cells of the window merged into the store's `cells`, in
 * the scan's order, into op->rows. */
static int merge(sop_t *op, int sec, const pr__scell_t *cells, size_t n,
                 int end) {
  scoll_t *c = op->coll;
  const uint8_t *bound = !end && n ? cells[n - 1].coord : NULL;
  size_t bound_len = !end && n ? cells[n - 1].coord_len : 0;
  int dir = op->scan_backward ? -1 : 1;
  size_t i = 0, k, nov = 0;
  ocell_t **ov = NULL;
  /* The window's overlay cells, in the scan's order. */
  for (k = 0; k < c->n; k++)
    if (in_window(op, sec, &c->cells[k], bound, bound_len))
      nov++;
  if (nov && !(ov = malloc(nov * sizeof(*ov))))
    return -1;
  nov = 0;
  for (k = 0; k < c->n; k++) {
    size_t at = op->scan_backward ? c->n - 1 - k : k;
    if (in_window(op, sec, &c->cells[at], bound, bound_len))
      ov[nov++] = &c->cells[at];
  }
  k = 0;
  while (i < n || k < nov) {
    int r;
    if (i == n)
      r = 1;
    else if (k == nov)
      r = -1;
    else
      r = dir * pr__scell_cmp(sec, cells[i].coord, cells[i].coord_len, sec,
                              ov[k]->coord, ov[k]->coord_len);
    if (r < 0) { /* only in the store */
      if (add_row(op, cells[i].coord, cells[i].coord_len, cells[i].data,
                  cells[i].data_len))
        goto nomem;
      i++;
      continue;
    }
    if (r == 0)
      i++; /* the overlay's is newer */
    if (ov[k]->data && add_row(op, ov[k]->coord, ov[k]->coord_len, ov[k]->data,
                               ov[k]->data_len))
      goto nomem;
    k++;
  }
  free(ov);
  return 0;
nomem:
  free(ov);
  return -1;
}

static void got_range(void *arg, prosody_err_t err, const char *errstr,
                      const pr__scell_t *cells, size_t n, int end) {
  sop_t *op = arg;
  if (fenced(op))
    return;
  if (err) {
    pr__st_sop_done(op,
                    err == PROSODY_ERR_PERMANENT ? err : PROSODY_ERR_TRANSIENT,
                    "keyed state: scanning \"%s\" failed: %s", op->coll->name,
                    errstr ? errstr : prosody_err_name(err));
    return;
  }
  if (merge(op, op->scan_section, cells, n, end)) {
    pr__st_sop_done(op, PROSODY_ERR_NOMEM, "out of memory");
    return;
  }
  op->scan_end = end;
  if (!op->nrows && !end && n) {
    /* Everything here was removed in the overlay: go on after it. */
    uint8_t *after = malloc(cells[n - 1].coord_len + 1);
    if (!after) {
      pr__st_sop_done(op, PROSODY_ERR_NOMEM, "out of memory");
      return;
    }
    memcpy(after, cells[n - 1].coord, cells[n - 1].coord_len);
    free(op->scan_after);
    op->scan_after = after;
    op->scan_after_len = cells[n - 1].coord_len;
    pr__st_read_range(op);
    return;
  }
  step(op);
}

/* Reads up to op->limit cells of op->scan_section after op->scan_after
 * into op->rows (op->scan_end: nothing follows), then steps on. */
void pr__st_read_range(sop_t *op) {
  scoll_t *c = op->coll;
  pr__sstore_t *s = op->store;
  pr__scoll_t a;
  rows_free(op);
  if (c->complete[op->scan_section]) {
    if (merge(op, op->scan_section, NULL, 0, 1)) {
      pr__st_sop_done(op, PROSODY_ERR_NOMEM, "out of memory");
      return;
    }
    op->scan_end = 1;
    step(op);
    return;
  }
  a = op->stx ? pr__st_addr_of(op->stx, c) : op->paddr;
  s->ops->range(s, &a, op->scan_section, op->scan_after, op->scan_after_len,
                op->scan_backward, op->limit, got_range, op);
}

/* ---- writes ---------------------------------------------------------- */

void pr__st_clear_sections(scoll_t *c, int upto) {
  for (int s = 0; s <= upto; s++) {
    pr__st_ov_drop_section(c, s);
    c->cleared[s] = c->complete[s] = 1;
  }
  c->dirty = 1;
}

static void flushed(void *arg, prosody_err_t err, const char *errstr) {
  sop_t *op = arg;
  free(op->w);
  op->w = NULL;
  if (err) {
    pr__st_sop_done(op,
                    err == PROSODY_ERR_PERMANENT ? err : PROSODY_ERR_TRANSIENT,
                    "keyed state: writing \"%s\" failed: %s", op->coll->name,
                    errstr ? errstr : prosody_err_name(err));
    return;
  }
  if (op->stx->inv && !op->stx->closed)
    pr__st_ov_written(op->coll);
  pr__st_sop_done(op, PROSODY_OK, NULL);
}

/* Writes the collection's buffered cells now (commit, read_uncommitted),
 * then answers. */
static void flush(sop_t *op) {
  pr__sstore_t *s = pr__st_store(op->eng);
  size_t n = 0, cap = 0;
  if (!op->coll->dirty) {
    pr__st_sop_done(op, PROSODY_OK, NULL);
    return;
  }
  op->addr = pr__st_addr_of(op->stx, op->coll);
  if (pr__st_writes_of(op->stx, op->coll, &op->addr, &op->w, &n, &cap)) {
    pr__st_sop_done(op, PROSODY_ERR_NOMEM, "out of memory");
    return;
  }
  s->ops->apply(s, op->w, n, NULL, 0, flushed, op);
}

/* A write was buffered: written through for read_uncommitted. */
void pr__st_wrote(sop_t *op) {
  if (op->eng->st->states.d[op->def].read_uncommitted)
    flush(op);
  else
    pr__st_sop_done(op, PROSODY_OK, NULL);
}

static void step(sop_t *op) {
  switch (op->op) {
  case PROSODY_STATE_COMMIT:
    flush(op);
    return;
  case PROSODY_STATE_ROLLBACK:
    pr__st_ov_reset(op->coll);
    pr__st_sop_done(op, PROSODY_OK, NULL);
    return;
  default:
    break;
  }
  pr__st_kind_step[op->kind](op);
}

/* ---- running an operation ---------------------------------------------- */

/* Runs an operation (engine thread). */
static void run_op(pr__engine_t *eng, sop_t *op) {
  pr__ctx_t *slot = pr__ctx_lock_live(op->ctx);
  inv_t *inv;
  pr__stx_t *t;
  if (!slot) {
    pr__st_sop_done(op, PROSODY_ERR_STATE,
                    "keyed state: the handle's attempt has ended (a handle is "
                    "valid only in the handler invocation that opened it)");
    return;
  }
  inv = slot->owner;
  pthread_mutex_unlock(&slot->lock);
  if (eng->stopping || eng->phase != PH_RUNNING) {
    pr__st_sop_done(op, PROSODY_ERR_STATE,
                    "keyed state: the consumer is shutting down");
    return;
  }
  if (!(t = pr__st_stx_of(inv)) || !(op->coll = pr__st_coll_of(t, op->def))) {
    pr__st_sop_done(op, PROSODY_ERR_NOMEM, "out of memory");
    return;
  }
  if (t->closed) {
    pr__st_sop_done(op, PROSODY_ERR_STATE,
                    "keyed state: the handle's attempt has ended");
    return;
  }
  op->eng = eng;
  op->store = pr__st_store(eng);
  op->capacity = eng->st->states.d[op->def].capacity;
  op->stx = t;
  t->busy++;
  step(op);
}

void pr__st_run_read(sop_t *op) { step(op); }

static void op_mail(pr__mail_t *mail, void *owner) {
  run_op(owner, PR_CONTAINER_OF(mail, sop_t, mail));
}

/* Hands an operation to the engine (any thread), as timer_ops.c does. */
static prosody_err_t submit(sop_t *op, char *errstr, size_t errstr_size) {
  pr__ctx_t *slot = pr__ctx_lock_live(op->ctx);
  pr__engine_t *eng;
  if (!slot) {
    pr__errf(errstr, errstr_size,
             "keyed state: the handle's attempt has ended (a handle is "
             "valid only in the handler invocation that opened it)");
    return PROSODY_ERR_STATE;
  }
  eng = ((inv_t *)slot->owner)->eng;
  if (pr__engine_current() == eng) {
    pthread_mutex_unlock(&slot->lock);
    if (!op->cb && !pr__st_store(eng)->sync) {
      pr__errf(errstr, errstr_size,
               "keyed state: a blocking call from the engine thread needs a "
               "store that answers at once; use prosody_state_async");
      return PROSODY_ERR_STATE;
    }
    run_op(eng, op);
    return PROSODY_OK;
  }
  pr__mailbox_hold(&eng->mb);
  pthread_mutex_unlock(&slot->lock);
  if (pr__mailbox_try_post(&eng->mb, &op->mail, op_mail))
    pr__st_sop_done(op, PROSODY_ERR_STATE,
                    "keyed state: the consumer has stopped");
  pr__mailbox_unhold(&eng->mb);
  return PROSODY_OK;
}

/* ---- the public functions ----------------------------------------------- */

PROSODY_EXPORT prosody_err_t prosody_state_open(prosody_context_t *ctx,
                                                const char *name,
                                                prosody_state_t **out,
                                                int *kind, char *errstr,
                                                size_t errstr_size) {
  pr__ctx_t *slot;
  const pr__state_defs_t *defs;
  prosody_state_t *st;
  int def = -1;
  if (!ctx || !name || !out) {
    pr__errf(errstr, errstr_size, "keyed state: %s is NULL",
             !ctx    ? "context"
             : !name ? "name"
                     : "out");
    return PROSODY_ERR_INVALID_ARG;
  }
  *out = NULL;
  if (!(slot = pr__ctx_lock_live(ctx))) {
    pr__errf(errstr, errstr_size,
             "keyed state: the context is stale: its handler has already "
             "finished");
    return PROSODY_ERR_STATE;
  }
  defs = &((inv_t *)slot->owner)->eng->st->states;
  pthread_mutex_unlock(&slot->lock);
  for (size_t i = 0; i < defs->n; i++)
    if (!strcmp(defs->d[i].name, name))
      def = (int)i;
  if (def < 0) {
    pr__errf(errstr, errstr_size,
             "keyed state: no collection named \"%s\" is registered: "
             "register it (state_collections) before subscribing",
             name);
    return PROSODY_ERR_PERMANENT;
  }
  if (!(st = calloc(1, sizeof(*st)))) {
    pr__errf(errstr, errstr_size, "out of memory");
    return PROSODY_ERR_NOMEM;
  }
  st->ctx = ctx;
  st->def = def;
  st->kind = defs->d[def].kind;
  st->payload = defs->d[def].payload;
  if (!(st->name = strdup(name))) {
    free(st);
    pr__errf(errstr, errstr_size, "out of memory");
    return PROSODY_ERR_NOMEM;
  }
  if (kind)
    *kind = st->kind;
  *out = st;
  return PROSODY_OK;
}

PROSODY_EXPORT void prosody_state_free(prosody_state_t *st) {
  if (st)
    free(st->name);
  free(st);
}

PROSODY_EXPORT prosody_err_t prosody_state_call(prosody_state_t *st,
                                                prosody_state_op_t kind_op,
                                                const prosody_state_args_t *a,
                                                prosody_state_result_t *r,
                                                char *errstr,
                                                size_t errstr_size) {
  sop_t op;
  prosody_err_t err;
  memset(&op, 0, sizeof(op));
  if (r)
    memset(r, 0, sizeof(*r));
  if ((err = pr__st_prepare(&op, st, (int)kind_op, a, errstr, errstr_size))) {
    pr__st_sop_free_args(&op);
    return err;
  }
  pthread_mutex_init(&op.lock, NULL);
  pthread_cond_init(&op.cond, NULL);
  if (!(err = submit(&op, errstr, errstr_size))) {
    pthread_mutex_lock(&op.lock);
    while (!op.done)
      pthread_cond_wait(&op.cond, &op.lock);
    pthread_mutex_unlock(&op.lock);
  } else {
    pr__st_sop_free_args(&op);
  }
  pthread_mutex_destroy(&op.lock);
  pthread_cond_destroy(&op.cond);
  if (err)
    return err;
  if (op.err) {
    pr__errf(errstr, errstr_size, "%s", op.errstr);
    prosody_state_result_free(&op.r);
    return op.err;
  }
  if (r)
    *r = op.r;
  else
    prosody_state_result_free(&op.r);
  return PROSODY_OK;
}

PROSODY_EXPORT prosody_err_t prosody_state_async(prosody_state_t *st,
                                                 prosody_state_op_t kind_op,
                                                 const prosody_state_args_t *a,
                                                 prosody_state_cb cb,
                                                 void *opaque, char *errstr,
                                                 size_t errstr_size) {
  sop_t *op;
  prosody_err_t err;
  if (!cb) {
    pr__errf(errstr, errstr_size, "keyed state: the callback is NULL");
    return PROSODY_ERR_INVALID_ARG;
  }
  if (!(op = calloc(1, sizeof(*op)))) {
    pr__errf(errstr, errstr_size, "out of memory");
    return PROSODY_ERR_NOMEM;
  }
  op->cb = cb;
  op->opaque = opaque;
  if ((err = pr__st_prepare(op, st, (int)kind_op, a, errstr, errstr_size)) ||
      (err = submit(op, errstr, errstr_size))) {
    pr__st_sop_free_args(op);
    free(op);
  }
  return err;
}
