/*
 * tq.c - the time queue: pending timers in a binary min-heap by (time,
 * key), each also linked into its key's time-sorted list so that a key's
 * timers can be listed or removed without a scan. Entries remember their
 * heap slot, so removing any timer is O(log n).
 *
 * Single owner; no locks (see timers.h).
 */
#include <stdlib.h>
#include <string.h>

#include "../util/util.h"
#include "timers.h"

typedef struct tkey tkey_t;

typedef struct entry {
  tkey_t *k;
  int64_t time_s;
  size_t hidx;        /* position in the heap */
  struct entry *next; /* next later timer of the same key */
  pr_span_ctx_t *ctx; /* the scheduling trace context (owned), or NULL */
} entry_t;

struct tkey {
  tkey_t *next; /* bucket chain */
  char *key;
  entry_t *head; /* the key's timers, ascending */
};

struct pr__tq {
  tkey_t **buckets;
  size_t nbuckets, nkeys;
  entry_t **heap;
  size_t n, cap;
};

pr__tq_t *pr__tq_new(void) {
  pr__tq_t *tq = calloc(1, sizeof(*tq));
  if (!tq)
    return NULL;
  tq->nbuckets = 64;
  tq->buckets = calloc(tq->nbuckets, sizeof(tkey_t *));
  if (!tq->buckets) {
    free(tq);
    return NULL;
  }
  return tq;
}

void pr__tq_free(pr__tq_t *tq) {
  if (!tq)
    return;
  for (size_t i = 0; i < tq->nbuckets; i++) {
    tkey_t *k = tq->buckets[i], *kn;
    for (; k; k = kn) {
      entry_t *e = k->head, *en;
      kn = k->next;
      for (; e; e = en) {
        en = e->next;
        free(e->ctx);
        free(e);
      }
      free(k->key);
      free(k);
    }
  }
  free(tq->buckets);
  free(tq->heap);
  free(tq);
}

size_t pr__tq_size(const pr__tq_t *tq) { return tq->n; }

/* --- keys --------------------------------------------------------------- */

static tkey_t *key_find(const pr__tq_t *tq, const char *key) {
  tkey_t *k = tq->buckets[pr__fnv1a_str(key) % tq->nbuckets];
  for (; k; k = k->next)
    if (!strcmp(k->key, key))
      return k;
  return NULL;
}

static void key_grow(pr__tq_t *tq) {
  size_t n = tq->nbuckets * 4;
  tkey_t **b = calloc(n, sizeof(tkey_t *));
  if (!b)
    return; /* longer chains; still correct */
  for (size_t i = 0; i < tq->nbuckets; i++) {
    tkey_t *k = tq->buckets[i], *kn;
    for (; k; k = kn) {
      size_t h = pr__fnv1a_str(k->key) % n;
      kn = k->next;
      k->next = b[h];
      b[h] = k;
    }
  }
  free(tq->buckets);
  tq->buckets = b;
  tq->nbuckets = n;
}

static tkey_t *key_get(pr__tq_t *tq, const char *key) {
  tkey_t *k = key_find(tq, key);
  size_t h;
  if (k)
    return k;
  if (tq->nkeys >= tq->nbuckets * 2)
    key_grow(tq);
  k = calloc(1, sizeof(*k));
  if (!k || !(k->key = strdup(key))) {
    free(k);
    return NULL;
  }
  h = pr__fnv1a_str(key) % tq->nbuckets;
  k->next = tq->buckets[h];
  tq->buckets[h] = k;
  tq->nkeys++;
  return k;
}

static void key_drop_if_empty(pr__tq_t *tq, tkey_t *k) {
  tkey_t **pp;
  if (k->head)
    return;
  pp = &tq->buckets[pr__fnv1a_str(k->key) % tq->nbuckets];
  while (*pp && *pp != k)
    pp = &(*pp)->next;
  if (*pp)
    *pp = k->next;
  tq->nkeys--;
  free(k->key);
  free(k);
}

/* --- heap --------------------------------------------------------------- */

static int before(const entry_t *a, const entry_t *b) {
  if (a->time_s != b->time_s)
    return a->time_s < b->time_s;
  return strcmp(a->k->key, b->k->key) < 0;
}

static void heap_set(pr__tq_t *tq, size_t i, entry_t *e) {
  tq->heap[i] = e;
  e->hidx = i;
}

static void sift_up(pr__tq_t *tq, size_t i) {
  entry_t *e = tq->heap[i];
  while (i > 0) {
    size_t p = (i - 1) / 2;
    if (!before(e, tq->heap[p]))
      break;
    heap_set(tq, i, tq->heap[p]);
    i = p;
  }
  heap_set(tq, i, e);
}

static void sift_down(pr__tq_t *tq, size_t i) {
  entry_t *e = tq->heap[i];
  for (;;) {
    size_t l = 2 * i + 1, r = l + 1, m = l;
    if (l >= tq->n)
      break;
    if (r < tq->n && before(tq->heap[r], tq->heap[l]))
      m = r;
    if (!before(tq->heap[m], e))
      break;
    heap_set(tq, i, tq->heap[m]);
    i = m;
  }
  heap_set(tq, i, e);
}

static void heap_remove(pr__tq_t *tq, entry_t *e) {
  size_t i = e->hidx;
  entry_t *last = tq->heap[--tq->n];
  if (last == e)
    return;
  heap_set(tq, i, last);
  if (i > 0 && before(last, tq->heap[(i - 1) / 2]))
    sift_up(tq, i);
  else
    sift_down(tq, i);
}

/* --- operations --------------------------------------------------------- */

/* Sets or replaces an entry's context; -1 out of memory. */
static int entry_ctx(entry_t *e, const pr_span_ctx_t *ctx) {
  if (!ctx || !ctx->valid)
    return 0;
  if (!e->ctx && !(e->ctx = malloc(sizeof(*e->ctx))))
    return -1;
  *e->ctx = *ctx;
  return 0;
}

int pr__tq_add(pr__tq_t *tq, const char *key, int64_t time_s) {
  return pr__tq_add_ctx(tq, key, time_s, NULL);
}

int pr__tq_add_ctx(pr__tq_t *tq, const char *key, int64_t time_s,
                   const pr_span_ctx_t *ctx) {
  tkey_t *k;
  entry_t *e, **pp;
  if (pr__grow(&tq->heap, &tq->cap, tq->n, sizeof(*tq->heap), 64))
    return -1;
  if (!(k = key_get(tq, key)))
    return -1;
  for (pp = &k->head; *pp && (*pp)->time_s < time_s; pp = &(*pp)->next)
    ;
  if (*pp && (*pp)->time_s == time_s)
    return entry_ctx(*pp, ctx) ? -1 : 0;
  if (!(e = calloc(1, sizeof(*e))) || entry_ctx(e, ctx)) {
    free(e);
    key_drop_if_empty(tq, k);
    return -1;
  }
  e->k = k;
  e->time_s = time_s;
  e->next = *pp;
  *pp = e;
  tq->heap[tq->n] = e;
  e->hidx = tq->n++;
  sift_up(tq, e->hidx);
  return 1;
}

/* Unlinks and frees the entry at *pp of key k. */
static void entry_drop(pr__tq_t *tq, entry_t **pp) {
  entry_t *e = *pp;
  *pp = e->next;
  heap_remove(tq, e);
  free(e->ctx);
  free(e);
}

int pr__tq_remove(pr__tq_t *tq, const char *key, int64_t time_s) {
  tkey_t *k = key_find(tq, key);
  entry_t **pp;
  if (!k)
    return 0;
  for (pp = &k->head; *pp && (*pp)->time_s < time_s; pp = &(*pp)->next)
    ;
  if (!*pp || (*pp)->time_s != time_s)
    return 0;
  entry_drop(tq, pp);
  key_drop_if_empty(tq, k);
  return 1;
}

size_t pr__tq_remove_key(pr__tq_t *tq, const char *key, int64_t keep_s) {
  tkey_t *k = key_find(tq, key);
  entry_t **pp;
  size_t removed = 0;
  if (!k)
    return 0;
  pp = &k->head;
  while (*pp) {
    if ((*pp)->time_s == keep_s) {
      pp = &(*pp)->next;
      continue;
    }
    entry_drop(tq, pp);
    removed++;
  }
  key_drop_if_empty(tq, k);
  return removed;
}

int pr__tq_contains(const pr__tq_t *tq, const char *key, int64_t time_s) {
  tkey_t *k = key_find(tq, key);
  for (entry_t *e = k ? k->head : NULL; e && e->time_s <= time_s; e = e->next)
    if (e->time_s == time_s)
      return 1;
  return 0;
}

int64_t pr__tq_next_time(const pr__tq_t *tq) {
  return tq->n ? tq->heap[0]->time_s : -1;
}

int pr__tq_pop_due(pr__tq_t *tq, int64_t now_s, char **key, int64_t *time_s) {
  return pr__tq_pop_due_ctx(tq, now_s, key, time_s, NULL);
}

int pr__tq_pop_due_ctx(pr__tq_t *tq, int64_t now_s, char **key, int64_t *time_s,
                       pr_span_ctx_t *ctx) {
  entry_t *e;
  char *copy;
  if (!tq->n || tq->heap[0]->time_s > now_s)
    return 0;
  e = tq->heap[0];
  if (!(copy = strdup(e->k->key)))
    return -1;
  *key = copy;
  *time_s = e->time_s;
  if (ctx) {
    if (e->ctx)
      *ctx = *e->ctx;
    else
      ctx->valid = false;
  }
  pr__tq_remove(tq, copy, e->time_s);
  return 1;
}

int pr__tq_key_times(const pr__tq_t *tq, const char *key, int64_t **times,
                     size_t *n) {
  tkey_t *k = key_find(tq, key);
  size_t c = 0, i = 0;
  *times = NULL;
  *n = 0;
  for (entry_t *e = k ? k->head : NULL; e; e = e->next)
    c++;
  if (!c)
    return 0;
  if (!(*times = malloc(c * sizeof(int64_t))))
    return -1;
  for (entry_t *e = k->head; e; e = e->next)
    (*times)[i++] = e->time_s;
  *n = c;
  return 0;
}

void pr__tq_each_in(const pr__tq_t *tq, int64_t from_s, int64_t to_s,
                    void (*fn)(void *arg, const char *key, int64_t time_s,
                               const pr_span_ctx_t *ctx),
                    void *arg) {
  for (size_t i = 0; i < tq->n; i++) {
    const entry_t *e = tq->heap[i];
    if (e->time_s >= from_s && e->time_s < to_s)
      fn(arg, e->k->key, e->time_s, e->ctx);
  }
}
