/*
 * memtimers.c - the in-memory timer store (mock mode): a time queue per
 * segment and timer type. Every operation completes before it returns.
 * Single owner (the engine thread); no locks. A released segment is
 * forgotten: mock-mode timers do not survive a rebalance.
 */
#include <stdlib.h>
#include <string.h>

#include "../timers/timers.h"
#include "../util/util.h"

#define NTYPES 3

typedef struct seg {
  struct seg *next;
  char *topic;
  int32_t partition;
  pr__tq_t *tq[NTYPES];
} seg_t;

typedef struct memstore {
  pr__tstore_t base;
  seg_t *segs;
} memstore_t;

static seg_t *seg_find(memstore_t *m, const pr__tseg_t *s, int create) {
  seg_t *g;
  for (g = m->segs; g; g = g->next)
    if (g->partition == s->partition && !strcmp(g->topic, s->topic))
      return g;
  if (!create || !(g = calloc(1, sizeof(*g))))
    return NULL;
  g->partition = s->partition;
  if (!(g->topic = strdup(s->topic)))
    goto fail;
  for (int i = 0; i < NTYPES; i++)
    if (!(g->tq[i] = pr__tq_new()))
      goto fail;
  g->next = m->segs;
  m->segs = g;
  return g;
fail:
  for (int i = 0; i < NTYPES; i++)
    pr__tq_free(g->tq[i]);
  free(g->topic);
  free(g);
  return NULL;
}

static void seg_free(seg_t *g) {
  for (int i = 0; i < NTYPES; i++)
    pr__tq_free(g->tq[i]);
  free(g->topic);
  free(g);
}

static void m_put(pr__tstore_t *s, const pr__tseg_t *seg, const char *key,
                  int64_t time_s, pr__timer_type_t type,
                  const pr_span_ctx_t *ctx, pr__tstore_done_cb cb, void *arg) {
  seg_t *g = seg_find((memstore_t *)s, seg, 1);
  if (!g || pr__tq_add_ctx(g->tq[type], key, time_s, ctx) < 0) {
    cb(arg, PROSODY_ERR_NOMEM, "out of memory storing a timer");
    return;
  }
  cb(arg, PROSODY_OK, NULL);
}

static void m_del(pr__tstore_t *s, const pr__tseg_t *seg, const char *key,
                  int64_t time_s, pr__timer_type_t type, pr__tstore_done_cb cb,
                  void *arg) {
  seg_t *g = seg_find((memstore_t *)s, seg, 0);
  if (g)
    pr__tq_remove(g->tq[type], key, time_s);
  cb(arg, PROSODY_OK, NULL);
}

static void m_del_key(pr__tstore_t *s, const pr__tseg_t *seg, const char *key,
                      pr__timer_type_t type, int64_t keep_s,
                      pr__tstore_done_cb cb, void *arg) {
  seg_t *g = seg_find((memstore_t *)s, seg, 0);
  if (g)
    pr__tq_remove_key(g->tq[type], key, keep_s);
  cb(arg, PROSODY_OK, NULL);
}

static void m_key_times(pr__tstore_t *s, const pr__tseg_t *seg, const char *key,
                        pr__timer_type_t type, pr__tstore_times_cb cb,
                        void *arg) {
  seg_t *g = seg_find((memstore_t *)s, seg, 0);
  int64_t *times = NULL;
  size_t n = 0;
  if (g && pr__tq_key_times(g->tq[type], key, &times, &n) < 0) {
    cb(arg, PROSODY_ERR_NOMEM, "out of memory listing timers", NULL, 0);
    return;
  }
  cb(arg, PROSODY_OK, NULL, times, n);
  free(times);
}

typedef struct collect {
  int64_t slab_s;
  int64_t *v;
  size_t n, cap;
  pr__trec_t *recs;
  size_t nrecs, caprecs;
  pr__timer_type_t type;
  int oom;
} collect_t;

static int push_i64(collect_t *c, int64_t x) {
  if (pr__grow(&c->v, &c->cap, c->n, sizeof(*c->v), 16))
    return -1;
  c->v[c->n++] = x;
  return 0;
}

static void add_slab(void *arg, const char *key, int64_t time_s,
                     const pr_span_ctx_t *ctx) {
  collect_t *c = arg;
  int64_t slab = pr__slab_of(time_s, c->slab_s);
  (void)key;
  (void)ctx;
  if (c->n && c->v[c->n - 1] == slab)
    return; /* cheap de-duplication; sorted below */
  if (push_i64(c, slab))
    c->oom = 1;
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? -1 : x > y;
}

static void m_slabs(pr__tstore_t *s, const pr__tseg_t *seg, int64_t slab_s,
                    pr__tstore_times_cb cb, void *arg) {
  seg_t *g = seg_find((memstore_t *)s, seg, 0);
  collect_t c = {.slab_s = slab_s};
  size_t w = 0;
  for (int t = 0; g && t < NTYPES; t++)
    pr__tq_each_in(g->tq[t], 0, INT64_MAX, add_slab, &c);
  if (c.oom) {
    free(c.v);
    cb(arg, PROSODY_ERR_NOMEM, "out of memory listing timer slabs", NULL, 0);
    return;
  }
  if (c.n)
    qsort(c.v, c.n, sizeof(int64_t), cmp_i64);
  for (size_t i = 0; i < c.n; i++)
    if (!w || c.v[w - 1] != c.v[i])
      c.v[w++] = c.v[i];
  cb(arg, PROSODY_OK, NULL, c.v, w);
  free(c.v);
}

static void add_rec(void *arg, const char *key, int64_t time_s,
                    const pr_span_ctx_t *ctx) {
  collect_t *c = arg;
  if (pr__grow(&c->recs, &c->caprecs, c->nrecs, sizeof(*c->recs), 16)) {
    c->oom = 1;
    return;
  }
  c->recs[c->nrecs].key = key; /* valid while the store is untouched */
  c->recs[c->nrecs].time_s = time_s;
  c->recs[c->nrecs].type = c->type;
  if (ctx)
    c->recs[c->nrecs].ctx = *ctx;
  else
    c->recs[c->nrecs].ctx.valid = false;
  c->nrecs++;
}

static void m_load_slab(pr__tstore_t *s, const pr__tseg_t *seg, int64_t slab_s,
                        int64_t slab, pr__tstore_recs_cb cb, void *arg) {
  seg_t *g = seg_find((memstore_t *)s, seg, 0);
  collect_t c = {.slab_s = slab_s};
  int64_t from = pr__slab_start(slab, slab_s);
  for (int t = 0; g && t < NTYPES; t++) {
    c.type = (pr__timer_type_t)t;
    pr__tq_each_in(g->tq[t], from, from + slab_s, add_rec, &c);
  }
  if (c.oom) {
    free(c.recs);
    cb(arg, PROSODY_ERR_NOMEM, "out of memory loading timers", NULL, 0);
    return;
  }
  cb(arg, PROSODY_OK, NULL, c.recs, c.nrecs);
  free(c.recs);
}

static void m_release(pr__tstore_t *s, const pr__tseg_t *seg) {
  memstore_t *m = (memstore_t *)s;
  for (seg_t **pp = &m->segs; *pp; pp = &(*pp)->next)
    if ((*pp)->partition == seg->partition &&
        !strcmp((*pp)->topic, seg->topic)) {
      seg_t *g = *pp;
      *pp = g->next;
      seg_free(g);
      return;
    }
}

static void m_poll(pr__tstore_t *s) { (void)s; /* completes at once */ }

static void m_destroy(pr__tstore_t *s) {
  memstore_t *m = (memstore_t *)s;
  while (m->segs) {
    seg_t *g = m->segs;
    m->segs = g->next;
    seg_free(g);
  }
  free(m);
}

/* No listing rows: nothing to retire. */
static const pr__tstore_ops_t memstore_ops = {
    m_put,       m_del,     m_del_key, m_key_times, m_slabs,
    m_load_slab, m_release, m_poll,    m_destroy,   NULL};

pr__tstore_t *pr__memstore_new(void) {
  memstore_t *m = calloc(1, sizeof(*m));
  if (!m)
    return NULL;
  m->base.ops = &memstore_ops;
  m->base.sync = 1;
  return &m->base;
}
