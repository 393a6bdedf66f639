/*
 * state.c - keyed state (prosody.h, "Keyed state"): the collections a
 * handler opens, each attempt's transaction over them, and its commit
 * with the event.
 *
 * Cells. A collection of one key is cells in a store (src/stores/state.h):
 *   value  section 0, coordinate empty: the document;
 *   map    section 1, coordinate the key's UTF-8 bytes: its document;
 *          section 0, coordinate 0x02: the original's index of the keys,
 *          which we write as "overflowed" (0x01) with every set and remove, so
 * its ordered scans read the entries themselves; deque  section 0, coordinate
 * empty: the bounds, head and tail (two big-endian i64, the items are head ..
 * tail-1); section 1, coordinate the position (big-endian u64 of position ^
 * 2^63, so that byte order is number order): the item's document.
 *
 * Transactions. An attempt's writes go to its transaction (`stx`, hung on
 * the event): an overlay of cells, sorted, each dirty (to write) or clean
 * (read from the store, kept as a cache), plus, per section, whether it was
 * cleared (a section delete to write first) and whether the overlay is all
 * there is of it (`complete`: reads need not ask the store). Reads look in
 * the overlay first. PROSODY_STATE_COMMIT and a read_uncommitted write
 * apply the collection's dirty cells at once; PROSODY_STATE_ROLLBACK drops
 * the overlay. When the handler succeeds, the `settle` hook applies every
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
 * Threads: the public functions (state_ops.c) on any thread; operations,
 * the transactions and the store's callbacks on the engine thread (the
 * state store answers there, or at once when `sync`). This file: the
 * overlay, transactions, the event's commit and the layer.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "dedup.h"
#include "state.h"

/* The layer's state (eng->kst): made by its open hook when collections are
 * registered, freed by its close(final 1); eng->kst NULL: no keyed state.
 * Written only while the engine's owner opens the layer, except as said. */
struct pr__kst_state {
  pr__sstore_t *store; /* memory or Cassandra (on the engine's
                          session); its operations and answers on
                          the engine thread (the opening thread
                          while the layer opens) */
  int settles;         /* engine thread: events whose state was
                          stored */
  int refused;         /* engine thread: settles refused (test
                          option) */
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

ocell_t *pr__st_ov_find(scoll_t *c, int section, const uint8_t *coord,
                        size_t len) {
  int hit;
  size_t i = ov_lower(c, section, coord, len, &hit);
  return hit ? &c->cells[i] : NULL;
}

/* Sets a cell (data NULL: absent); -1 when out of memory. A clean set
 * never replaces a dirty cell. */
int pr__st_ov_set(scoll_t *c, int section, const uint8_t *coord, size_t len,
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

void pr__st_ov_drop_section(scoll_t *c, int section) {
  size_t j = 0;
  for (size_t i = 0; i < c->n; i++) {
    if (c->cells[i].section == section)
      free(c->cells[i].coord);
    else
      c->cells[j++] = c->cells[i];
  }
  c->n = j;
}

void pr__st_ov_reset(scoll_t *c) {
  for (size_t i = 0; i < c->n; i++)
    free(c->cells[i].coord);
  c->n = 0;
  memset(c->cleared, 0, sizeof(c->cleared));
  memset(c->complete, 0, sizeof(c->complete));
  c->dirty = 0;
}

/* After an apply: what was written is the store's now. */
void pr__st_ov_written(scoll_t *c) {
  for (size_t i = 0; i < c->n; i++)
    c->cells[i].dirty = 0;
  memset(c->cleared, 0, sizeof(c->cleared));
  c->dirty = 0;
}

static void coll_free(scoll_t *c) {
  pr__st_ov_reset(c);
  free(c->cells);
  free(c->name);
  free(c);
}

/* ---- transactions ------------------------------------------------------- */

void pr__st_stx_free(pr__stx_t *t) {
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
    pr__st_stx_free(t);
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
    pr__st_stx_free(t);
}

/* The `drop` and `forget` hooks: drops the event's transaction (its writes
 * are not stored). */
static void state_drop(inv_t *inv) {
  if (!inv->stx)
    return;
  stx_detach(inv->stx);
  inv->stx = NULL;
}

pr__stx_t *pr__st_stx_of(inv_t *inv) {
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
    pr__st_stx_free(t);
    return NULL;
  }
  inv->stx = t;
  return t;
}

scoll_t *pr__st_coll_of(pr__stx_t *t, int def) {
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

pr__scoll_t pr__st_addr_of(pr__stx_t *t, scoll_t *c) {
  pr__scoll_t a = {t->eng->group_id, t->topic, t->partition, t->key, c->name};
  return a;
}

/* The writes of `c` (appended to *w); -1 when out of memory. */
int pr__st_writes_of(pr__stx_t *t, scoll_t *c, const pr__scoll_t *addr,
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

/* ---- the event's commit -----------------------------------------------------
 */

static void settle_apply(pr__stx_t *t);

static void handle_free(uv_handle_t *h) { free(h); }

/* The retry's time: the timer is let go first (a store answering at once
 * may arm the next). A detached transaction's timer was stopped, so `t`
 * still has its event here. */
static void settle_retry(uv_timer_t *h) {
  pr__stx_t *t = h->data;
  t->retry = NULL;
  uv_close((uv_handle_t *)h, handle_free);
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
      pr__st_stx_free(t);
    return;
  }
  if (err == PROSODY_ERR_PERMANENT) {
    /* The store will never take it (too big, say): the event failed
     * permanently after all, its writes dropped; the mode decides (the
     * pipeline logs and skips it, low-latency sends it to failure_topic). */
    char why[640];
    snprintf(why, sizeof(why), "its keyed state could not be stored: %s",
             errstr ? errstr : prosody_err_name(err));
    inv->part->active--;
    eng->dlq_inflight--;
    state_drop(inv);
    inv->state = INV_RUNNING; /* deciding again, as after its attempt */
    pr__outcome_fail(inv, PROSODY_PERMANENT, why);
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
  state_drop(inv);
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
      ++eng->kst->settles == eng->st->test.state_exit_after)
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
    t->addr[k] = pr__st_addr_of(t, c);
    if (c->dirty && !eng->st->states.d[c->def].read_uncommitted &&
        pr__st_writes_of(t, c, &t->addr[k], &t->w, &n, &cap))
      goto nomem;
  }
  t->nw = n;
  dedup = pr__dd_stored_id(inv);
  t->busy++;
  if (eng->kst->refused < eng->st->test.state_refuse_settles) {
    eng->kst->refused++;
    settled(t, PROSODY_ERR_PERMANENT, "refused by the test option");
    return;
  }
  eng->kst->store->ops->apply(eng->kst->store, t->w, n, dedup,
                              pr__dd_ttl_s(eng), settled, t);
  return;
nomem:
  t->busy++;
  settled(t, PROSODY_ERR_NOMEM, "out of memory");
}

/* The `settle` hook: a success stores the transaction's writes (with the
 * event's dedup record) and returns 1, then pr__outcome_committed() once
 * stored; 0 when there is nothing to store (the caller goes on). */
static int state_settle(inv_t *inv) {
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
    state_drop(inv);
    return 0;
  }
  inv->state = INV_DLQ; /* in flight: a drain waits for it */
  inv->part->active++;
  inv->eng->dlq_inflight++;
  settle_apply(t);
  return 1;
}

/* ---- the layer ----------------------------------------------------------- */

/* Answers the opening thread waits for (the engine delivers the store's
 * answers once it runs; while the layer opens, the opening thread does). */
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

/* Waits for the store's answers of `w` (the opening thread); w->err. The
 * memory store has answered before this (it answers at once). */
static prosody_err_t ident_wait(pr__engine_t *eng, struct ident_wait *w) {
  struct pr__kst_state *k = eng->kst;
  while (w->pending > 0 && eng->cql.w) {
    pr__cqlw_wait(eng->cql.w, 1000);
    k->store->ops->poll(k->store);
  }
  return w->err;
}

/*
 * Published collections' routes (with the subsystem option): one per
 * published collection and subscribed topic, recorded before the consumer
 * starts, so before any of its state is written; the group's routes of a
 * collection registered unpublished are deleted (retiring it). A topic
 * whose partition count no broker gives (it does not exist yet) is routed
 * the next time the consumer starts: said at WARN.
 */
static void publication(pr__engine_t *eng, struct ident_wait *w) {
  const pr__settings_t *st = eng->st;
  const pr__value_t *subs = &PR_CFG(st, SUBSCRIBED_TOPICS);
  const char *sub =
      PR_CFG_SET(st, SUBSYSTEM) ? PR_CFG_STR(st, SUBSYSTEM) : NULL;
  pr__sstore_t *s = eng->kst->store;
  rd_kafka_t *rk = eng->producer ? pr__producer_handle(eng->producer) : NULL;
  int *parts;
  if (!sub || !(parts = calloc(subs->list_n + 1, sizeof(*parts))))
    return;
  for (size_t t = 0, down = 0; t < subs->list_n; t++) {
    if (PR_CFG_BOOL(st, MOCK))
      (void)pr__mock_ensure_topic(subs->list[t], NULL, 0);
    /* After a broker that did not answer, the others are not asked: the
     * subscribe waits once, at most 10 s. */
    parts[t] =
        rk && !down ? pr__kafka_partition_count(rk, subs->list[t], 10000) : -2;
    down |= parts[t] == -2;
  }
  for (size_t i = 0; i < st->states.n; i++) {
    const prosody_state_def_t *d = &st->states.d[i];
    if (!d->published) {
      w->pending++;
      s->ops->unpublish(s, sub, d->name, eng->group_id, ident_done, w);
      continue;
    }
    for (size_t t = 0; t < subs->list_n; t++) {
      pr__sroute_t r = {eng->group_id, subs->list[t], parts[t]};
      if (parts[t] < 1) {
        PR_WARN("state",
                "published collection \"%s\": no partition count for topic "
                "\"%s\" (%s); its route is recorded when the consumer next "
                "starts",
                d->name, subs->list[t],
                parts[t] == -2 ? "no broker answered the metadata request"
                               : "it does not exist yet?");
        continue;
      }
      w->pending++;
      s->ops->publish(s, sub, d->name, &r, ident_done, w);
    }
  }
  free(parts);
  (void)ident_wait(eng, w);
}

static prosody_err_t open_layer(pr__engine_t *eng, const char *bootstrap,
                                char *errstr, size_t errstr_size) {
  const pr__settings_t *st = eng->st;
  int memory = PR_CFG_BOOL(st, MOCK) || st->test.memory_timers;
  struct ident_wait w = {0, PROSODY_OK, ""};
  struct pr__kst_state *k;
  prosody_err_t err;
  (void)bootstrap;
  if (!st->states.n)
    return PROSODY_OK;
  if (!memory && !PR_CFG_SET(st, CASSANDRA_NODES)) {
    pr__errf(
        errstr, errstr_size,
        "keyed state (%zu collection%s registered, \"%s\" first) is "
        "kept in Cassandra: set cassandra_nodes (PROSODY_CASSANDRA_NODES), "
        "or mock for a store in memory",
        st->states.n, st->states.n == 1 ? "" : "s", st->states.d[0].name);
    return PROSODY_ERR_CONFIG;
  }
  /* Made here, freed by close_layer(final 1) also when opening fails. */
  if (!(k = calloc(1, sizeof(*k)))) {
    pr__errf(errstr, errstr_size, "out of memory");
    return PROSODY_ERR_NOMEM;
  }
  eng->kst = k;
  if (memory) {
    k->store = pr__memstate();
  } else {
    if ((err = pr__cql_shared_open(&eng->cql, st, errstr, errstr_size)))
      return err;
    k->store = pr__cqlstate_new(eng->cql.w, PR_CFG_STR(st, CASSANDRA_KEYSPACE),
                                errstr, errstr_size);
    if (!k->store)
      return PROSODY_ERR_TRANSIENT;
  }
  /* Each collection's kind, recorded for the group (or compared). */
  w.pending = (int)st->states.n;
  for (size_t i = 0; i < st->states.n; i++) {
    pr__sident_t id = {st->states.d[i].kind, st->states.d[i].payload, 0};
    k->store->ops->identity(k->store, eng->group_id, st->states.d[i].name, &id,
                            ident_done, &w);
  }
  if (!ident_wait(eng, &w))
    publication(eng, &w);
  if (w.err) {
    pr__errf(errstr, errstr_size, "%s", w.errstr);
    return w.err;
  }
  return PROSODY_OK;
}

static void close_layer(pr__engine_t *eng, int final) {
  struct pr__kst_state *k = eng->kst;
  /* At shutdown (`final` 0) the store stays: the engine stopped its
   * session, whose answers no longer wake the engine. */
  if (!k || !final)
    return;
  if (k->store)
    k->store->ops->destroy(k->store);
  free(k);
  eng->kst = NULL;
}

pr__sstore_t *pr__st_store(const pr__engine_t *eng) {
  return eng->kst ? eng->kst->store : NULL;
}

/* The claimable hook: with keyed state no event follows another in one
 * run, as the key's next event must read what this one wrote, which the
 * engine stores only once it has this one's result. */
static int claimable(inv_t *head, inv_t *f) {
  (void)f;
  return !(head->eng->kst && head->eng->kst->store);
}

const pr__layer_t pr__layer_state = {.name = "keyed state",
                                     .open = open_layer,
                                     .claimable = claimable,
                                     .settle = state_settle,
                                     .drop = state_drop,
                                     .forget = state_drop,
                                     .close = close_layer};
