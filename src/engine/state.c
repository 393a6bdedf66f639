/*
 * state.c - keyed state (prosody.h, "Keyed state"): the collections a
 * handler opens, each attempt's transaction over them, and its commit
 * with the event.
 *
 * Cells. A collection of one key is cells in a store (src/stores/state.h):
 *   value  section 0, coordinate empty: the document;
 *   map    section 0, coordinate the key's UTF-8 bytes: its document;
 *   deque  section 0, coordinate empty: the bounds, head and tail (two
 *          big-endian i64, the items are head .. tail-1); section 1,
 *          coordinate the position (big-endian u64 of position ^ 2^63, so
 *          that byte order is number order): the item's document.
 *
 * Transactions. An attempt's writes go to its transaction (`stx`, hung on
 * the event): an overlay of cells, sorted, each dirty (to write) or clean
 * (read from the store, kept as a cache), plus, per section, whether it was
 * cleared (a section delete to write first) and whether the overlay is all
 * there is of it (`complete`: reads need not ask the store). Reads look in
 * the overlay first. PROSODY_STATE_COMMIT and a read_uncommitted write
 * apply the collection's dirty cells at once; PROSODY_STATE_ROLLBACK drops
 * the overlay. When the handler succeeds, pr__state_settle() applies every
 * collection's dirty cells in one store call, with the event's
 * deduplication record when the dedup layer runs on Cassandra (one logged
 * batch: a redelivered event whose state landed is a duplicate), and the
 * event finishes once the store has them: its offset is committed after
 * its state. A failed apply is retried, with the same cells, while the
 * partition stays (an apply is idempotent). Any other result drops the
 * transaction.
 *
 * Fencing: a handle names its attempt's context; once the attempt has its
 * result the context is stale and every operation answers
 * PROSODY_ERR_STATE. An operation in flight when the attempt ends answers
 * the same, and the transaction is freed when the last one is done.
 *
 * Threads: the public functions on any thread; operations, the
 * transactions and the store's callbacks on the engine thread (the state
 * store answers there, or at once when `sync`).
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "../stores/state.h"
#include "internal.h"

#define SECTIONS 2
#define SCAN_DEFAULT 256
#define EVICT_MAX 16 /* items a push drops past a lowered capacity */

struct prosody_state {
  prosody_context_t *ctx;
  int def;
  int kind;
};

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

/* ---- the overlay ---------------------------------------------------- */

static size_t ov_lower(const scoll_t *c, int section, const uint8_t *coord,
                       size_t len, int *hit) {
  size_t lo = 0, hi = c->n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    const ocell_t *x = &c->cells[mid];
    if (pr__scell_cmp(x->section, x->coord, x->coord_len, section, coord, len) <
        0)
      lo = mid + 1;
    else
      hi = mid;
  }
  *hit =
      lo < c->n && !pr__scell_cmp(c->cells[lo].section, c->cells[lo].coord,
                                  c->cells[lo].coord_len, section, coord, len);
  return lo;
}

static ocell_t *ov_find(scoll_t *c, int section, const uint8_t *coord,
                        size_t len) {
  int hit;
  size_t i = ov_lower(c, section, coord, len, &hit);
  return hit ? &c->cells[i] : NULL;
}

/* Sets a cell (data NULL: absent); -1 when out of memory. A clean set
 * never replaces a dirty cell. */
static int ov_set(scoll_t *c, int section, const uint8_t *coord, size_t len,
                  const uint8_t *data, size_t data_len, int dirty) {
  int hit;
  size_t i = ov_lower(c, section, coord, len, &hit);
  uint8_t *buf;
  ocell_t *x;
  if (hit && !dirty && c->cells[i].dirty)
    return 0;
  if (!(buf = malloc(len + (data ? data_len : 0) + 2)))
    return -1;
  if (!hit) {
    if (c->n == c->cap) {
      size_t cap = c->cap ? c->cap * 2 : 8;
      ocell_t *cells = realloc(c->cells, cap * sizeof(*cells));
      if (!cells) {
        free(buf);
        return -1;
      }
      c->cells = cells;
      c->cap = cap;
    }
    memmove(&c->cells[i + 1], &c->cells[i], (c->n - i) * sizeof(ocell_t));
    c->n++;
  } else {
    free(c->cells[i].coord);
  }
  x = &c->cells[i];
  x->section = section;
  x->coord = buf;
  if (len)
    memcpy(buf, coord, len);
  x->coord_len = len;
  x->data = NULL;
  x->data_len = 0;
  if (data) {
    x->data = buf + len + 1;
    if (data_len)
      memcpy(x->data, data, data_len);
    x->data[data_len] = 0;
    x->data_len = data_len;
  }
  x->dirty = (uint8_t)dirty;
  if (dirty)
    c->dirty = 1;
  return 0;
}

static void ov_drop_section(scoll_t *c, int section) {
  size_t j = 0;
  for (size_t i = 0; i < c->n; i++) {
    if (c->cells[i].section == section)
      free(c->cells[i].coord);
    else
      c->cells[j++] = c->cells[i];
  }
  c->n = j;
}

static void ov_reset(scoll_t *c) {
  for (size_t i = 0; i < c->n; i++)
    free(c->cells[i].coord);
  c->n = 0;
  memset(c->cleared, 0, sizeof(c->cleared));
  memset(c->complete, 0, sizeof(c->complete));
  c->dirty = 0;
}

/* After an apply: what was written is the store's now. */
static void ov_written(scoll_t *c) {
  for (size_t i = 0; i < c->n; i++)
    c->cells[i].dirty = 0;
  memset(c->cleared, 0, sizeof(c->cleared));
  c->dirty = 0;
}

static void coll_free(scoll_t *c) {
  ov_reset(c);
  free(c->cells);
  free(c->name);
  free(c);
}

/* ---- transactions ------------------------------------------------------- */

static void stx_free(pr__stx_t *t) {
  while (t->colls) {
    scoll_t *n = t->colls->next;
    coll_free(t->colls);
    t->colls = n;
  }
  free(t->w);
  free(t->addr);
  free(t->topic);
  free(t->key);
  free(t);
}

static void retry_closed(uv_handle_t *h) {
  pr__stx_t *t = h->data;
  free(h);
  t->retry = NULL;
  if (!t->inv && !t->busy)
    stx_free(t);
}

/* The attempt is over for `t`: freed now, or by the last operation. */
static void stx_detach(pr__stx_t *t) {
  t->inv = NULL;
  if (t->retry) {
    uv_timer_stop(t->retry);
    uv_close((uv_handle_t *)t->retry, retry_closed);
    return;
  }
  if (!t->busy)
    stx_free(t);
}

void pr__state_drop(inv_t *inv) {
  if (!inv->stx)
    return;
  stx_detach(inv->stx);
  inv->stx = NULL;
}

static pr__stx_t *stx_of(inv_t *inv) {
  pr__stx_t *t;
  if (inv->stx)
    return inv->stx;
  if (!(t = calloc(1, sizeof(*t))))
    return NULL;
  t->eng = inv->eng;
  t->inv = inv;
  t->partition = inv->part->partition;
  t->topic = strdup(inv->part->topic);
  t->key = strdup(inv->msg.key);
  if (!t->topic || !t->key) {
    stx_free(t);
    return NULL;
  }
  inv->stx = t;
  return t;
}

static scoll_t *coll_of(pr__stx_t *t, int def) {
  scoll_t *c;
  for (c = t->colls; c; c = c->next)
    if (c->def == def)
      return c;
  if (!(c = calloc(1, sizeof(*c))))
    return NULL;
  c->def = def;
  if (!(c->name = strdup(t->eng->st->states.d[def].name))) {
    free(c);
    return NULL;
  }
  c->next = t->colls;
  t->colls = c;
  return c;
}

static pr__scoll_t addr_of(pr__stx_t *t, scoll_t *c) {
  pr__scoll_t a = {t->eng->group_id, t->topic, t->partition, t->key, c->name};
  return a;
}

/* The writes of `c` (appended to *w); -1 when out of memory. */
static int writes_of(pr__stx_t *t, scoll_t *c, const pr__scoll_t *addr,
                     pr__swrite_t **w, size_t *n, size_t *cap) {
  int64_t ttl = t->eng->st->states.d[c->def].ttl_s;
  size_t need = *n + c->n + SECTIONS;
  (void)t;
  if (need > *cap) {
    pr__swrite_t *x = realloc(*w, need * 2 * sizeof(*x));
    if (!x)
      return -1;
    *w = x;
    *cap = need * 2;
  }
  for (int s = 0; s < SECTIONS; s++)
    if (c->cleared[s])
      (*w)[(*n)++] =
          (pr__swrite_t){addr, PR_SW_DEL_SECTION, s, NULL, 0, NULL, 0, 0};
  for (size_t i = 0; i < c->n; i++) {
    ocell_t *x = &c->cells[i];
    if (!x->dirty)
      continue;
    if (!x->data && c->cleared[x->section])
      continue; /* the section delete removed it */
    (*w)[(*n)++] = (pr__swrite_t){addr,         x->data ? PR_SW_PUT : PR_SW_DEL,
                                  x->section,   x->coord,
                                  x->coord_len, x->data,
                                  x->data_len,  ttl};
  }
  return 0;
}

/* ---- encodings ---------------------------------------------------------- */

static void be64(uint8_t *o, uint64_t v) {
  for (int i = 7; i >= 0; i--) {
    o[i] = (uint8_t)v;
    v >>= 8;
  }
}

static uint64_t rd64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++)
    v = v << 8 | p[i];
  return v;
}

static void pos_coord(uint8_t o[8], int64_t pos) {
  be64(o, (uint64_t)pos ^ UINT64_C(0x8000000000000000));
}

/* ---- operations -----------------------------------------------------------
 */

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
typedef struct sop {
  pr__mail_t mail;
  prosody_context_t *ctx;
  int def, kind, op;
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
  /* Engine thread, while it runs. */
  pr__engine_t *eng;
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
} sop_t;

static void sop_free_args(sop_t *op) {
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
  }
  free(r->items);
  r->items = NULL;
  r->n = 0;
}

/* Appends an item (copies; NULL for none); -1 when out of memory. */
static int add_item(sop_t *op, const void *key, size_t key_len,
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
static void sop_done(sop_t *op, prosody_err_t err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void sop_done(sop_t *op, prosody_err_t err, const char *fmt, ...) {
  pr__stx_t *t = op->stx;
  char why[512] = "";
  if (fmt) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
  }
  if (err)
    prosody_state_result_free(&op->r);
  sop_free_args(op);
  if (t) {
    op->stx = NULL;
    if (--t->busy == 0 && !t->inv && !t->retry)
      stx_free(t);
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
static void read_range(sop_t *op);

/* The attempt ended while the operation waited. */
static int fenced(sop_t *op) {
  if (op->stx->inv && !op->stx->closed)
    return 0;
  sop_done(op, PROSODY_ERR_STATE,
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
    sop_done(op, err == PROSODY_ERR_PERMANENT ? err : PROSODY_ERR_TRANSIENT,
             "keyed state: reading \"%s\" failed: %s", op->coll->name,
             errstr ? errstr : prosody_err_name(err));
    return;
  }
  if (ov_set(op->coll, op->rc_section, op->rc, op->rc_len, found ? data : NULL,
             data_len, 0) ||
      (found && !(op->got = malloc(data_len + 1)))) {
    sop_done(op, PROSODY_ERR_NOMEM, "out of memory");
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
static void read_cell(sop_t *op, int section, const uint8_t *coord,
                      size_t len) {
  scoll_t *c = op->coll;
  ocell_t *x = ov_find(c, section, coord, len);
  pr__sstore_t *s = op->eng->st_store;
  pr__scoll_t a;
  free(op->got);
  op->got = NULL;
  op->got_len = 0;
  if (x || c->complete[section]) {
    if (x && x->data) {
      if (!(op->got = malloc(x->data_len + 1))) {
        sop_done(op, PROSODY_ERR_NOMEM, "out of memory");
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
    sop_done(op, PROSODY_ERR_NOMEM, "out of memory");
    return;
  }
  if (len)
    memcpy(op->rc, coord, len);
  op->rc_len = len;
  op->rc_section = section;
  a = addr_of(op->stx, c);
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
    sop_done(op, err == PROSODY_ERR_PERMANENT ? err : PROSODY_ERR_TRANSIENT,
             "keyed state: scanning \"%s\" failed: %s", op->coll->name,
             errstr ? errstr : prosody_err_name(err));
    return;
  }
  if (merge(op, op->scan_section, cells, n, end)) {
    sop_done(op, PROSODY_ERR_NOMEM, "out of memory");
    return;
  }
  op->scan_end = end;
  if (!op->nrows && !end && n) {
    /* Everything here was removed in the overlay: go on after it. */
    uint8_t *after = malloc(cells[n - 1].coord_len + 1);
    if (!after) {
      sop_done(op, PROSODY_ERR_NOMEM, "out of memory");
      return;
    }
    memcpy(after, cells[n - 1].coord, cells[n - 1].coord_len);
    free(op->scan_after);
    op->scan_after = after;
    op->scan_after_len = cells[n - 1].coord_len;
    read_range(op);
    return;
  }
  step(op);
}

/* Reads up to op->limit cells of op->scan_section after op->scan_after
 * into op->rows (op->scan_end: nothing follows), then steps on. */
static void read_range(sop_t *op) {
  scoll_t *c = op->coll;
  pr__sstore_t *s = op->eng->st_store;
  pr__scoll_t a;
  rows_free(op);
  if (c->complete[op->scan_section]) {
    if (merge(op, op->scan_section, NULL, 0, 1)) {
      sop_done(op, PROSODY_ERR_NOMEM, "out of memory");
      return;
    }
    op->scan_end = 1;
    step(op);
    return;
  }
  a = addr_of(op->stx, c);
  s->ops->range(s, &a, op->scan_section, op->scan_after, op->scan_after_len,
                op->scan_backward, op->limit, got_range, op);
}

/* ---- writes ---------------------------------------------------------- */

static void clear_sections(scoll_t *c, int upto) {
  for (int s = 0; s <= upto; s++) {
    ov_drop_section(c, s);
    c->cleared[s] = c->complete[s] = 1;
  }
  c->dirty = 1;
}

static void flushed(void *arg, prosody_err_t err, const char *errstr) {
  sop_t *op = arg;
  free(op->w);
  op->w = NULL;
  if (err) {
    sop_done(op, err == PROSODY_ERR_PERMANENT ? err : PROSODY_ERR_TRANSIENT,
             "keyed state: writing \"%s\" failed: %s", op->coll->name,
             errstr ? errstr : prosody_err_name(err));
    return;
  }
  if (op->stx->inv && !op->stx->closed)
    ov_written(op->coll);
  sop_done(op, PROSODY_OK, NULL);
}

/* Writes the collection's buffered cells now (commit, read_uncommitted),
 * then answers. */
static void flush(sop_t *op) {
  pr__sstore_t *s = op->eng->st_store;
  size_t n = 0, cap = 0;
  if (!op->coll->dirty) {
    sop_done(op, PROSODY_OK, NULL);
    return;
  }
  op->addr = addr_of(op->stx, op->coll);
  if (writes_of(op->stx, op->coll, &op->addr, &op->w, &n, &cap)) {
    sop_done(op, PROSODY_ERR_NOMEM, "out of memory");
    return;
  }
  s->ops->apply(s, op->w, n, NULL, 0, flushed, op);
}

/* A write was buffered: written through for read_uncommitted. */
static void wrote(sop_t *op) {
  if (op->eng->st->states.d[op->def].read_uncommitted)
    flush(op);
  else
    sop_done(op, PROSODY_OK, NULL);
}

/* ---- the operations' steps ------------------------------------------------
 */

static const uint8_t KEYSET[1] = {0x02};
static const uint8_t OVERFLOWED[1] = {0x01};

static void answer_got(sop_t *op, const char *key, size_t key_len) {
  if ((op->got || key) && add_item(op, key, key_len, op->got, op->got_len)) {
    sop_done(op, PROSODY_ERR_NOMEM, "out of memory");
    return;
  }
  sop_done(op, PROSODY_OK, NULL);
}

static void put_bounds(sop_t *op) {
  uint8_t b[16];
  be64(b, (uint64_t)op->head);
  be64(b + 8, (uint64_t)op->tail);
  if (ov_set(op->coll, 0, NULL, 0, b, sizeof(b), 1))
    op->err = PROSODY_ERR_NOMEM;
}

static int del_pos(sop_t *op, int64_t pos) {
  uint8_t k[8];
  pos_coord(k, pos);
  return ov_set(op->coll, 1, k, sizeof(k), NULL, 0, 1);
}

static void value_step(sop_t *op) {
  switch (op->op) {
  case PROSODY_STATE_GET:
    if (op->stage++ == 0)
      read_cell(op, 0, NULL, 0);
    else
      answer_got(op, NULL, 0);
    return;
  case PROSODY_STATE_SET:
    if (ov_set(op->coll, 0, NULL, 0, (const uint8_t *)op->json, op->json_len,
               1)) {
      sop_done(op, PROSODY_ERR_NOMEM, "out of memory");
      return;
    }
    wrote(op);
    return;
  default: /* CLEAR */
    clear_sections(op->coll, 0);
    wrote(op);
    return;
  }
}

static void map_step(sop_t *op) {
  switch (op->op) {
  case PROSODY_STATE_GET:
  case PROSODY_STATE_CONTAINS:
    if (op->stage++ == 0) {
      read_cell(op, 1, (const uint8_t *)op->key, op->key_len);
      return;
    }
    if (op->op == PROSODY_STATE_CONTAINS) {
      op->r.number = op->got != NULL;
      sop_done(op, PROSODY_OK, NULL);
    } else {
      answer_got(op, NULL, 0);
    }
    return;
  case PROSODY_STATE_GET_MANY:
    if (op->stage++ > 0) {
      const char *k = op->keys[op->at];
      if (add_item(op, k, strlen(k), op->got, op->got_len)) {
        sop_done(op, PROSODY_ERR_NOMEM, "out of memory");
        return;
      }
      op->at++;
    }
    if (op->at == op->nkeys) {
      sop_done(op, PROSODY_OK, NULL);
      return;
    }
    read_cell(op, 1, (const uint8_t *)op->keys[op->at],
              strlen(op->keys[op->at]));
    return;
  case PROSODY_STATE_SET:
    /* The original's ordered-scan index of the keys is marked overflowed,
     * which sends its scans to the entries themselves (we keep no index). */
    if (ov_set(op->coll, 1, (const uint8_t *)op->key, op->key_len,
               (const uint8_t *)op->json, op->json_len, 1) ||
        ov_set(op->coll, 0, KEYSET, 1, OVERFLOWED, 1, 1)) {
      sop_done(op, PROSODY_ERR_NOMEM, "out of memory");
      return;
    }
    wrote(op);
    return;
  case PROSODY_STATE_REMOVE:
    if (ov_set(op->coll, 1, (const uint8_t *)op->key, op->key_len, NULL, 0,
               1)) {
      sop_done(op, PROSODY_ERR_NOMEM, "out of memory");
      return;
    }
    wrote(op);
    return;
  case PROSODY_STATE_CLEAR:
    clear_sections(op->coll, 1);
    wrote(op);
    return;
  default: /* SCAN */
    if (op->stage++ == 0) {
      op->scan_section = 1;
      op->scan_backward = op->backward;
      if (op->after) {
        op->scan_after = (uint8_t *)op->after;
        op->scan_after_len = op->after_len;
        op->after = NULL;
      }
      read_range(op);
      return;
    }
    for (size_t i = 0; i < op->nrows && i < op->limit; i++)
      if (add_item(op, op->rows[i].coord, op->rows[i].coord_len,
                   op->keys_only ? NULL : op->rows[i].data,
                   op->rows[i].data_len)) {
        sop_done(op, PROSODY_ERR_NOMEM, "out of memory");
        return;
      }
    op->r.number = op->scan_end && op->nrows <= op->limit;
    sop_done(op, PROSODY_OK, NULL);
    return;
  }
}

/* The deque's bounds from op->got; -1 (answered) when malformed. */
static int bounds(sop_t *op) {
  if (!op->got) {
    op->head = op->tail = 0;
    return 0;
  }
  if (op->got_len != 16) {
    sop_done(op, PROSODY_ERR_PERMANENT,
             "keyed state: deque \"%s\" has malformed bounds (%zu bytes, "
             "want 16)",
             op->coll->name, op->got_len);
    return -1;
  }
  op->head = (int64_t)rd64(op->got);
  op->tail = (int64_t)rd64(op->got + 8);
  return 0;
}

static void deque_step(sop_t *op) {
  uint8_t k[8];
  int64_t len, pos, cap = op->eng->st->states.d[op->def].capacity;
  if (op->op == PROSODY_STATE_CLEAR) {
    clear_sections(op->coll, 1);
    wrote(op);
    return;
  }
  if (op->stage == 0) { /* the bounds first */
    op->stage = 1;
    read_cell(op, 0, NULL, 0);
    return;
  }
  if (op->stage == 1) {
    if (bounds(op))
      return;
    op->stage = 2;
  }
  len = op->tail - op->head;
  switch (op->op) {
  case PROSODY_STATE_LEN:
    op->r.number = len;
    sop_done(op, PROSODY_OK, NULL);
    return;
  case PROSODY_STATE_PUSH_BACK:
  case PROSODY_STATE_PUSH_FRONT: {
    int back = op->op == PROSODY_STATE_PUSH_BACK;
    int64_t evict = 0;
    if (cap > 0 && len - (cap - 1) > 0)
      evict = len - (cap - 1) < 2 ? len - (cap - 1) : 2;
    pos = back ? op->tail : op->head - 1;
    pos_coord(k, pos);
    if (ov_set(op->coll, 1, k, sizeof(k), (const uint8_t *)op->json,
               op->json_len, 1)) {
      sop_done(op, PROSODY_ERR_NOMEM, "out of memory");
      return;
    }
    if (back)
      op->tail++;
    else
      op->head--;
    for (int64_t i = 0; i < evict; i++)
      if (del_pos(op, back ? op->head++ : --op->tail)) {
        sop_done(op, PROSODY_ERR_NOMEM, "out of memory");
        return;
      }
    put_bounds(op);
    if (op->err) {
      sop_done(op, PROSODY_ERR_NOMEM, "out of memory");
      return;
    }
    wrote(op);
    return;
  }
  case PROSODY_STATE_POP_BACK:
  case PROSODY_STATE_POP_FRONT:
  case PROSODY_STATE_PEEK_BACK:
  case PROSODY_STATE_PEEK_FRONT:
  case PROSODY_STATE_GET: {
    int back =
        op->op == PROSODY_STATE_POP_BACK || op->op == PROSODY_STATE_PEEK_BACK;
    if (op->stage == 2) {
      if (op->op == PROSODY_STATE_GET)
        pos = op->index < 0 ? op->tail + op->index : op->head + op->index;
      else
        pos = back ? op->tail - 1 : op->head;
      if (len <= 0 || pos < op->head || pos >= op->tail) {
        sop_done(op, PROSODY_OK, NULL); /* none */
        return;
      }
      op->pos = pos;
      op->stage = 3;
      pos_coord(k, pos);
      read_cell(op, 1, k, sizeof(k));
      return;
    }
    if (op->op == PROSODY_STATE_POP_BACK || op->op == PROSODY_STATE_POP_FRONT) {
      if (del_pos(op, op->pos)) {
        sop_done(op, PROSODY_ERR_NOMEM, "out of memory");
        return;
      }
      if (back)
        op->tail--;
      else
        op->head++;
      put_bounds(op);
      if (op->err ||
          ((op->got && add_item(op, NULL, 0, op->got, op->got_len)))) {
        sop_done(op, PROSODY_ERR_NOMEM, "out of memory");
        return;
      }
      wrote(op);
      return;
    }
    answer_got(op, NULL, 0);
    return;
  }
  default: /* SCAN */
    if (op->stage == 2) {
      int64_t from;
      op->stage = 3;
      op->scan_section = 1;
      op->scan_backward = op->backward;
      if (op->after)
        from = op->after_pos; /* resume after this position */
      else
        from = op->backward ? op->tail - op->index : op->head + op->index - 1;
      if (!(op->scan_after = malloc(8))) {
        sop_done(op, PROSODY_ERR_NOMEM, "out of memory");
        return;
      }
      pos_coord(op->scan_after, from);
      op->scan_after_len = 8;
      read_range(op);
      return;
    }
    for (size_t i = 0; i < op->nrows && i < op->limit; i++) {
      char at[24];
      int n;
      if (op->rows[i].coord_len != 8)
        continue;
      pos = (int64_t)(rd64(op->rows[i].coord) ^ UINT64_C(0x8000000000000000));
      if (pos < op->head || pos >= op->tail)
        continue;
      n = snprintf(at, sizeof(at), "%" PRId64, pos);
      if (add_item(op, at, (size_t)n, op->rows[i].data, op->rows[i].data_len)) {
        sop_done(op, PROSODY_ERR_NOMEM, "out of memory");
        return;
      }
    }
    op->r.number = op->scan_end && op->nrows <= op->limit;
    sop_done(op, PROSODY_OK, NULL);
    return;
  }
}

static void step(sop_t *op) {
  switch (op->op) {
  case PROSODY_STATE_COMMIT:
    flush(op);
    return;
  case PROSODY_STATE_ROLLBACK:
    ov_reset(op->coll);
    sop_done(op, PROSODY_OK, NULL);
    return;
  default:
    break;
  }
  if (op->kind == PROSODY_STATE_VALUE)
    value_step(op);
  else if (op->kind == PROSODY_STATE_MAP)
    map_step(op);
  else
    deque_step(op);
}

/* ---- running an operation ---------------------------------------------- */

/* Runs an operation (engine thread). */
static void run_op(pr__engine_t *eng, sop_t *op) {
  pr__ctx_t *slot = pr__ctx_lock_live(op->ctx);
  inv_t *inv;
  pr__stx_t *t;
  if (!slot) {
    sop_done(op, PROSODY_ERR_STATE,
             "keyed state: the handle's attempt has ended (a handle is "
             "valid only in the handler invocation that opened it)");
    return;
  }
  inv = slot->owner;
  pthread_mutex_unlock(&slot->lock);
  if (eng->stopping || eng->phase != PH_RUNNING) {
    sop_done(op, PROSODY_ERR_STATE,
             "keyed state: the consumer is shutting down");
    return;
  }
  if (!(t = stx_of(inv)) || !(op->coll = coll_of(t, op->def))) {
    sop_done(op, PROSODY_ERR_NOMEM, "out of memory");
    return;
  }
  if (t->closed) {
    sop_done(op, PROSODY_ERR_STATE,
             "keyed state: the handle's attempt has ended");
    return;
  }
  op->eng = eng;
  op->stx = t;
  t->busy++;
  step(op);
}

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
    if (!op->cb && !eng->st_store->sync) {
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
    sop_done(op, PROSODY_ERR_STATE, "keyed state: the consumer has stopped");
  pr__mailbox_unhold(&eng->mb);
  return PROSODY_OK;
}

static const char *op_name(int op) {
  static const char *const names[] = {
      "GET",      "GET_MANY",  "SET",       "REMOVE",
      "CLEAR",    "CONTAINS",  "PUSH_BACK", "PUSH_FRONT",
      "POP_BACK", "POP_FRONT", "PEEK_BACK", "PEEK_FRONT",
      "LEN",      "SCAN",      "COMMIT",    "ROLLBACK"};
  return op >= 0 && op <= PROSODY_STATE_ROLLBACK ? names[op] : "?";
}

static const char *kind_name(int kind) {
  return kind == PROSODY_STATE_VALUE ? "value"
         : kind == PROSODY_STATE_MAP ? "map"
                                     : "deque";
}

/* Which operations each kind has (bit per prosody_state_op_t). */
static int kind_has(int kind, int op) {
  unsigned common = 1u << PROSODY_STATE_CLEAR | 1u << PROSODY_STATE_COMMIT |
                    1u << PROSODY_STATE_ROLLBACK;
  unsigned value = common | 1u << PROSODY_STATE_GET | 1u << PROSODY_STATE_SET;
  unsigned map = common | 1u << PROSODY_STATE_GET |
                 1u << PROSODY_STATE_GET_MANY | 1u << PROSODY_STATE_SET |
                 1u << PROSODY_STATE_REMOVE | 1u << PROSODY_STATE_CONTAINS |
                 1u << PROSODY_STATE_SCAN;
  unsigned deque =
      common | 1u << PROSODY_STATE_GET | 1u << PROSODY_STATE_PUSH_BACK |
      1u << PROSODY_STATE_PUSH_FRONT | 1u << PROSODY_STATE_POP_BACK |
      1u << PROSODY_STATE_POP_FRONT | 1u << PROSODY_STATE_PEEK_BACK |
      1u << PROSODY_STATE_PEEK_FRONT | 1u << PROSODY_STATE_LEN |
      1u << PROSODY_STATE_SCAN;
  unsigned has = kind == PROSODY_STATE_VALUE ? value
                 : kind == PROSODY_STATE_MAP ? map
                                             : deque;
  return op >= 0 && op <= PROSODY_STATE_ROLLBACK && (has >> op & 1);
}

static char *dup_n(const char *p, size_t n) {
  char *d = malloc(n + 1);
  if (d) {
    memcpy(d, p, n);
    d[n] = 0;
  }
  return d;
}

/* Checks the arguments and copies them into `op`. */
static prosody_err_t prepare(sop_t *op, prosody_state_t *st, int kind_op,
                             const prosody_state_args_t *a, char *errstr,
                             size_t errstr_size) {
  static const prosody_state_args_t none = PROSODY_STATE_ARGS_INIT;
  int needs_key, needs_json;
  if (!st) {
    pr__errf(errstr, errstr_size, "keyed state: the handle is NULL");
    return PROSODY_ERR_INVALID_ARG;
  }
  if (!a)
    a = &none;
  if (!kind_has(st->kind, kind_op)) {
    pr__errf(errstr, errstr_size,
             "keyed state: a %s collection has no %s operation",
             kind_name(st->kind), op_name(kind_op));
    return PROSODY_ERR_INVALID_ARG;
  }
  op->ctx = st->ctx;
  op->def = st->def;
  op->kind = st->kind;
  op->op = kind_op;
  op->index = a->index;
  op->limit = a->limit ? a->limit : SCAN_DEFAULT;
  op->backward = a->backward != 0;
  op->keys_only = a->keys_only != 0;
  needs_key =
      st->kind == PROSODY_STATE_MAP &&
      (kind_op == PROSODY_STATE_GET || kind_op == PROSODY_STATE_SET ||
       kind_op == PROSODY_STATE_REMOVE || kind_op == PROSODY_STATE_CONTAINS);
  needs_json = kind_op == PROSODY_STATE_SET ||
               kind_op == PROSODY_STATE_PUSH_BACK ||
               kind_op == PROSODY_STATE_PUSH_FRONT;
  if (needs_key) {
    if (!a->key) {
      pr__errf(errstr, errstr_size, "keyed state: %s needs a map key",
               op_name(kind_op));
      return PROSODY_ERR_INVALID_ARG;
    }
    if (!(op->key = dup_n(a->key, a->key_len)))
      return PROSODY_ERR_NOMEM;
    op->key_len = a->key_len;
  }
  if (needs_json) {
    json_error_t jerr;
    json_t *j;
    if (!a->json) {
      pr__errf(errstr, errstr_size,
               "keyed state: %s needs a JSON document; a null cannot be "
               "stored (use %s)",
               op_name(kind_op),
               st->kind == PROSODY_STATE_MAP ? "REMOVE" : "CLEAR");
      return PROSODY_ERR_INVALID_ARG;
    }
    j = json_loadb(a->json, a->json_len, JSON_DECODE_ANY, &jerr);
    if (!j) {
      pr__errf(errstr, errstr_size,
               "keyed state: %s: not a JSON document: %s (at byte %d)",
               op_name(kind_op), jerr.text, jerr.position);
      return PROSODY_ERR_INVALID_ARG;
    }
    if (json_is_null(j)) {
      json_decref(j);
      pr__errf(errstr, errstr_size,
               "keyed state: a top-level null cannot be stored; use %s "
               "instead",
               st->kind == PROSODY_STATE_MAP ? "REMOVE" : "CLEAR");
      return PROSODY_ERR_INVALID_ARG;
    }
    json_decref(j);
    if (!(op->json = dup_n(a->json, a->json_len)))
      return PROSODY_ERR_NOMEM;
    op->json_len = a->json_len;
  }
  if (kind_op == PROSODY_STATE_GET_MANY) {
    if (a->nkeys && !a->keys) {
      pr__errf(errstr, errstr_size, "keyed state: GET_MANY: keys is NULL");
      return PROSODY_ERR_INVALID_ARG;
    }
    if (a->nkeys && !(op->keys = calloc(a->nkeys, sizeof(char *))))
      return PROSODY_ERR_NOMEM;
    op->nkeys = a->nkeys;
    for (size_t i = 0; i < a->nkeys; i++)
      if (!a->keys[i]) {
        pr__errf(errstr, errstr_size,
                 "keyed state: GET_MANY: keys[%zu] is NULL", i);
        return PROSODY_ERR_INVALID_ARG;
      } else if (!(op->keys[i] = strdup(a->keys[i]))) {
        return PROSODY_ERR_NOMEM;
      }
  }
  if (kind_op == PROSODY_STATE_SCAN && a->after) {
    if (st->kind == PROSODY_STATE_DEQUE) {
      char *end;
      char *txt = dup_n(a->after, a->after_len);
      if (!txt)
        return PROSODY_ERR_NOMEM;
      op->after_pos = strtoll(txt, &end, 10);
      if (!*txt || *end) {
        pr__errf(errstr, errstr_size,
                 "keyed state: a deque scan resumes after a position (the "
                 "key of an item it returned), got \"%s\"",
                 txt);
        free(txt);
        return PROSODY_ERR_INVALID_ARG;
      }
      op->after = txt;
    } else if (!(op->after = dup_n(a->after, a->after_len))) {
      return PROSODY_ERR_NOMEM;
    }
    op->after_len = a->after_len;
  }
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
  if (kind)
    *kind = st->kind;
  *out = st;
  return PROSODY_OK;
}

PROSODY_EXPORT void prosody_state_free(prosody_state_t *st) { free(st); }

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
  if ((err = prepare(&op, st, (int)kind_op, a, errstr, errstr_size))) {
    sop_free_args(&op);
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
    sop_free_args(&op);
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
  if ((err = prepare(op, st, (int)kind_op, a, errstr, errstr_size)) ||
      (err = submit(op, errstr, errstr_size))) {
    sop_free_args(op);
    free(op);
  }
  return err;
}

/* ---- the event's commit -----------------------------------------------------
 */

static void settle_apply(pr__stx_t *t);

static void settle_retry(uv_timer_t *h) {
  pr__stx_t *t = h->data;
  uv_close((uv_handle_t *)h, retry_closed);
  if (t->inv)
    settle_apply(t);
}

static void settled(void *arg, prosody_err_t err, const char *errstr) {
  pr__stx_t *t = arg;
  inv_t *inv = t->inv;
  pr__engine_t *eng = t->eng;
  char ev[160];
  t->busy--;
  if (!inv) { /* the event went away meanwhile */
    if (!t->busy && !t->retry)
      stx_free(t);
    return;
  }
  if (err && eng->phase == PH_RUNNING && !inv->part->revoking &&
      !inv->part->zombie && (t->retry = malloc(sizeof(uv_timer_t)))) {
    if (t->failures++ % 10 == 0)
      PR_WARN("state", "%s: storing its keyed state failed: %s; retrying",
              pr__inv_describe(inv, ev, sizeof(ev)),
              errstr ? errstr : prosody_err_name(err));
    uv_timer_init(&eng->loop, t->retry);
    t->retry->data = t;
    uv_timer_start(t->retry, settle_retry,
                   pr__outcome_backoff_ms(eng, t->failures), 0);
    return;
  }
  inv->part->active--;
  eng->dlq_inflight--;
  pr__state_drop(inv);
  if (err) {
    PR_WARN("state",
            "%s: storing its keyed state failed: %s; it is not committed "
            "(the partition is going; its next owner runs it again)",
            pr__inv_describe(inv, ev, sizeof(ev)),
            errstr ? errstr : prosody_err_name(err));
    pr__outcome_finish(inv, 0);
    return;
  }
  if (eng->st->test.state_exit_after > 0 &&
      ++eng->st_settles == eng->st->test.state_exit_after)
    _exit(42); /* a crash between the state and the commit (tests) */
  pr__outcome_committed(inv);
}

static void settle_apply(pr__stx_t *t) {
  inv_t *inv = t->inv;
  pr__engine_t *eng = t->eng;
  size_t n = 0, cap = 0, k = 0, ncolls = 0;
  const pr__did_t *dedup = NULL;
  scoll_t *c;
  free(t->w);
  free(t->addr);
  t->w = NULL;
  for (c = t->colls; c; c = c->next)
    ncolls++;
  if (!(t->addr = calloc(ncolls ? ncolls : 1, sizeof(*t->addr))))
    goto nomem;
  for (c = t->colls; c; c = c->next, k++) {
    t->addr[k] = addr_of(t, c);
    if (c->dirty && !eng->st->states.d[c->def].read_uncommitted &&
        writes_of(t, c, &t->addr[k], &t->w, &n, &cap))
      goto nomem;
  }
  t->nw = n;
  if (eng->dd_on && !eng->dd_late && inv->dd == DD_UNSEEN)
    dedup = &inv->did;
  t->busy++;
  eng->st_store->ops->apply(eng->st_store, t->w, n, dedup, eng->dd_ttl_s,
                            settled, t);
  return;
nomem:
  t->busy++;
  settled(t, PROSODY_ERR_NOMEM, "out of memory");
}

int pr__state_settle(inv_t *inv) {
  PR_ENGINE_THREAD(inv->eng);
  pr__stx_t *t = inv->stx;
  int dirty = 0;
  if (!t)
    return 0;
  t->closed = 1; /* late operations are refused */
  for (scoll_t *c = t->colls; c; c = c->next)
    if (c->dirty && !inv->eng->st->states.d[c->def].read_uncommitted)
      dirty = 1;
  if (!dirty) {
    pr__state_drop(inv);
    return 0;
  }
  inv->state = INV_DLQ; /* in flight: a drain waits for it */
  inv->part->active++;
  inv->eng->dlq_inflight++;
  settle_apply(t);
  return 1;
}

/* ---- the layer ----------------------------------------------------------- */

/* The store finished operations (its thread): the engine delivers them;
 * while the layer opens, the opening thread does. */
static void st_wake(void *arg) {
  pr__engine_t *eng = arg;
  pthread_mutex_lock(&eng->st_lock);
  eng->st_woken = 1;
  pthread_cond_broadcast(&eng->st_cond);
  pthread_mutex_unlock(&eng->st_lock);
  if (eng->st_engine_wake)
    eng->st_engine_wake(eng);
}

struct ident_wait {
  int pending;
  prosody_err_t err;
  char errstr[512];
};

static void ident_done(void *arg, prosody_err_t err, const char *errstr) {
  struct ident_wait *w = arg;
  w->pending--;
  if (err && !w->err) {
    w->err = err;
    snprintf(w->errstr, sizeof(w->errstr), "%s",
             errstr ? errstr : prosody_err_name(err));
  }
}

static prosody_err_t open_layer(pr__engine_t *eng, const char *bootstrap,
                                void (*wake)(void *), char *errstr,
                                size_t errstr_size) {
  const pr__settings_t *st = eng->st;
  int memory = PR_CFG_BOOL(st, MOCK) || st->test.memory_timers ||
               !PR_CFG_SET(st, CASSANDRA_NODES);
  struct ident_wait w = {0, PROSODY_OK, ""};
  prosody_err_t err;
  (void)bootstrap;
  if (!st->states.n)
    return PROSODY_OK;
  pthread_mutex_init(&eng->st_lock, NULL);
  pthread_cond_init(&eng->st_cond, NULL);
  eng->st_inited = 1;
  if (memory) {
    eng->st_store = pr__memstate();
  } else {
    pr__cql_conf_t c;
    if ((err = pr__cql_keyspace_ready(st, errstr, errstr_size)))
      return err;
    c = pr__cql_conf_of(st);
    eng->st_engine_wake = wake;
    eng->st_store = pr__cqlstate_new(&c, PR_CFG_STR(st, CASSANDRA_KEYSPACE),
                                     st_wake, eng, errstr, errstr_size);
    if (!eng->st_store)
      return PROSODY_ERR_TRANSIENT;
  }
  /* Each collection's kind, recorded for the group (or compared). */
  w.pending = (int)st->states.n;
  for (size_t i = 0; i < st->states.n; i++) {
    pr__sident_t id = {st->states.d[i].kind, st->states.d[i].payload};
    eng->st_store->ops->identity(eng->st_store, eng->group_id,
                                 st->states.d[i].name, &id, ident_done, &w);
  }
  while (w.pending > 0) {
    pthread_mutex_lock(&eng->st_lock);
    while (!eng->st_woken)
      pthread_cond_wait(&eng->st_cond, &eng->st_lock);
    eng->st_woken = 0;
    pthread_mutex_unlock(&eng->st_lock);
    eng->st_store->ops->poll(eng->st_store);
  }
  if (w.err) {
    pr__errf(errstr, errstr_size, "%s", w.errstr);
    return w.err;
  }
  return PROSODY_OK;
}

static void close_layer(pr__engine_t *eng, int final) {
  if (!final || !eng->st_inited)
    return;
  if (eng->st_store)
    eng->st_store->ops->destroy(eng->st_store);
  eng->st_store = NULL;
  pthread_mutex_destroy(&eng->st_lock);
  pthread_cond_destroy(&eng->st_cond);
  eng->st_inited = 0;
}

void pr__state_poll(pr__engine_t *eng) {
  if (eng->st_store)
    eng->st_store->ops->poll(eng->st_store);
}

const pr__layer_t pr__layer_state = {
    .name = "keyed state", .open = open_layer, .close = close_layer};

/* Until the Cassandra store lands (cqlstate.c). */
__attribute__((weak)) pr__sstore_t *
pr__cqlstate_new(const pr__cql_conf_t *conf, const char *keyspace,
                 void (*wake)(void *), void *wake_arg, char *errstr,
                 size_t errstr_size) {
  (void)conf;
  (void)keyspace;
  (void)wake;
  (void)wake_arg;
  pr__errf(errstr, errstr_size,
           "keyed state: the Cassandra store is not built in");
  return NULL;
}
