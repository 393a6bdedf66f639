/*
 * scheduler.c - the fair scheduler (see scheduler.h for the policy).
 *
 * Threads: the engine thread only.
 */
#include "scheduler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../util/util.h"

struct pr__sched_key {
  pr__sched_key_t *hnext;         /* bucket chain */
  pr__sched_key_t *lprev, *lnext; /* LRU list, while unpinned */
  uint64_t hash;
  int pins;
  int32_t partition;
  double vt;     /* seconds ... */
  int64_t vt_at; /* ... as of this time */
  char *topic;   /* topic and key: in the same allocation */
  char *key;
  struct busy *busy; /* with window_ns: handler time per bucket, or NULL */
};

/* A key's handler time in the buckets of the last window: slot i holds
 * bucket idx[i] (time / width) when idx[i] is recent. */
struct busy {
  int64_t idx[PR_SCHED_BUSY_SLOTS];
  int64_t ns[PR_SCHED_BUSY_SLOTS];
  int64_t total; /* the sum of ns[], recent or not: a bound on the share */
};

/* 2^(-elapsed / half-life). Most calls are milliseconds apart (each
 * result charges its key and its class, each wait computes a priority):
 * below a second the series of e^-y to y^5, y = ln 2 x elapsed / half-life
 * < 0.006, is exp2's value to within a unit in the last place (the first
 * term left out is under 6e-17) at a fraction of its cost. */
static double decay(int64_t from_ns, int64_t to_ns) {
  double y;
  if (to_ns <= from_ns)
    return 1.0;
  if (to_ns - from_ns >= 1000000000)
    return exp2(-((double)(to_ns - from_ns) / 1e9) / PR_SCHED_HALF_LIFE_S);
  y = (double)(to_ns - from_ns) * (M_LN2 / 1e9 / PR_SCHED_HALF_LIFE_S);
  return 1 - y * (1 - y / 2 * (1 - y / 3 * (1 - y / 4 * (1 - y / 5))));
}

void pr__sched_init(pr__sched_t *s, double failure_weight, double max_wait_s,
                    double wait_weight, size_t cache_size) {
  memset(s, 0, sizeof(*s));
  s->failure_weight = failure_weight;
  s->max_wait_s = max_wait_s > 0 ? max_wait_s : 1e-9;
  s->wait_weight = wait_weight;
  s->cache_size = cache_size ? cache_size : 1;
}

void pr__sched_fini(pr__sched_t *s) {
  for (size_t b = 0; s->buckets && b < s->nbuckets; b++) {
    pr__sched_key_t *k = s->buckets[b], *next;
    for (; k; k = next) {
      next = k->hnext;
      free(k->busy);
      free(k);
    }
  }
  free(s->buckets);
  free(s->pool[0].v);
  free(s->pool[1].v);
  memset(s, 0, sizeof(*s));
}

/* --- key table and LRU ------------------------------------------------ */

static uint64_t key_hash(const char *topic, int32_t partition,
                         const char *key) {
  return pr__fnv1a_str(key) ^ (pr__fnv1a_str(topic) * 31 + (uint32_t)partition);
}

static void lru_unlink(pr__sched_t *s, pr__sched_key_t *k) {
  if (k->lprev)
    k->lprev->lnext = k->lnext;
  else
    s->lru_head = k->lnext;
  if (k->lnext)
    k->lnext->lprev = k->lprev;
  else
    s->lru_tail = k->lprev;
  k->lprev = k->lnext = NULL;
}

static void lru_push_head(pr__sched_t *s, pr__sched_key_t *k) {
  k->lprev = NULL;
  k->lnext = s->lru_head;
  if (s->lru_head)
    s->lru_head->lprev = k;
  else
    s->lru_tail = k;
  s->lru_head = k;
}

static void table_unlink(pr__sched_t *s, pr__sched_key_t *k) {
  pr__sched_key_t **pp = &s->buckets[k->hash & (s->nbuckets - 1)];
  while (*pp != k)
    pp = &(*pp)->hnext;
  *pp = k->hnext;
  s->nkeys--;
}

/* Evicts least recently used unpinned keys beyond cache_size. */
static void evict(pr__sched_t *s) {
  while (s->nkeys > s->cache_size && s->lru_tail) {
    pr__sched_key_t *k = s->lru_tail;
    lru_unlink(s, k);
    table_unlink(s, k);
    free(k->busy);
    free(k);
  }
}

static int table_grow(pr__sched_t *s) {
  size_t n = s->nbuckets ? s->nbuckets * 2 : 64;
  pr__sched_key_t **b = calloc(n, sizeof(*b));
  if (!b)
    return -1;
  for (size_t i = 0; i < s->nbuckets; i++) {
    pr__sched_key_t *k = s->buckets[i], *next;
    for (; k; k = next) {
      next = k->hnext;
      k->hnext = b[k->hash & (n - 1)];
      b[k->hash & (n - 1)] = k;
    }
  }
  free(s->buckets);
  s->buckets = b;
  s->nbuckets = n;
  return 0;
}

pr__sched_key_t *pr__sched_pin(pr__sched_t *s, const char *topic,
                               int32_t partition, const char *key) {
  uint64_t h = key_hash(topic, partition, key);
  size_t tlen, klen;
  pr__sched_key_t *k;
  if (s->buckets)
    for (k = s->buckets[h & (s->nbuckets - 1)]; k; k = k->hnext)
      if (k->hash == h && k->partition == partition && !strcmp(k->key, key) &&
          !strcmp(k->topic, topic)) {
        if (k->pins++ == 0)
          lru_unlink(s, k);
        return k;
      }
  if (s->nkeys >= s->nbuckets && table_grow(s) && !s->buckets)
    return NULL;
  tlen = strlen(topic);
  klen = strlen(key);
  if (!(k = calloc(1, sizeof(*k) + tlen + klen + 2)))
    return NULL;
  k->topic = (char *)(k + 1);
  memcpy(k->topic, topic, tlen + 1);
  k->key = k->topic + tlen + 1;
  memcpy(k->key, key, klen + 1);
  k->hash = h;
  k->partition = partition;
  k->pins = 1;
  k->hnext = s->buckets[h & (s->nbuckets - 1)];
  s->buckets[h & (s->nbuckets - 1)] = k;
  s->nkeys++;
  evict(s);
  return k;
}

void pr__sched_unpin(pr__sched_t *s, pr__sched_key_t *k) {
  if (--k->pins > 0)
    return;
  lru_push_head(s, k);
  evict(s);
}

size_t pr__sched_keys(const pr__sched_t *s) { return s->nkeys; }

/* --- time accounting -------------------------------------------------- */

double pr__sched_vt(const pr__sched_key_t *k, int64_t now_ns) {
  return k->vt * decay(k->vt_at, now_ns);
}

double pr__sched_class_time(const pr__sched_t *s, int cls, int64_t now_ns) {
  return s->cls_time[cls] * decay(s->cls_at[cls], now_ns);
}

void pr__sched_charge(pr__sched_t *s, pr__sched_key_t *k, int cls,
                      int64_t run_ns, int64_t now_ns) {
  double run_s = run_ns > 0 ? (double)run_ns / 1e9 : 0;
  k->vt = pr__sched_vt(k, now_ns) + run_s;
  k->vt_at = now_ns;
  s->cls_time[cls] = pr__sched_class_time(s, cls, now_ns) + run_s;
  s->cls_at[cls] = now_ns;
}

const char *pr__sched_key_name(const pr__sched_key_t *k) { return k->key; }

static int64_t bucket_ns(const pr__sched_t *s) {
  int64_t w = s->window_ns / PR_SCHED_BUSY_SLOTS;
  return w > 0 ? w : 1;
}

void pr__sched_busy(pr__sched_t *s, pr__sched_key_t *k, int64_t start_ns,
                    int64_t end_ns) {
  int64_t w = bucket_ns(s), t;
  if (!s->window_ns || end_ns <= start_ns)
    return;
  if (!k->busy) {
    if (!(k->busy = calloc(1, sizeof(*k->busy))))
      return; /* not measured: never rejected */
    for (int i = 0; i < PR_SCHED_BUSY_SLOTS; i++)
      k->busy->idx[i] = -1;
  }
  if (end_ns - start_ns > s->window_ns)
    start_ns = end_ns - s->window_ns;
  for (t = start_ns; t < end_ns;) {
    int64_t idx = t / w, upto = (idx + 1) * w;
    int slot = (int)(idx % PR_SCHED_BUSY_SLOTS);
    if (upto > end_ns)
      upto = end_ns;
    if (k->busy->idx[slot] != idx) {
      k->busy->idx[slot] = idx;
      k->busy->total -= k->busy->ns[slot];
      k->busy->ns[slot] = 0;
    }
    k->busy->ns[slot] += upto - t;
    k->busy->total += upto - t;
    t = upto;
  }
}

int pr__sched_may_exceed(const pr__sched_t *s, const pr__sched_key_t *k,
                         double share) {
  return s->window_ns && k->busy &&
         (double)k->busy->total > share * (double)s->window_ns;
}

double pr__sched_share(const pr__sched_t *s, const pr__sched_key_t *k,
                       int64_t now_ns) {
  int64_t w = bucket_ns(s), cur = now_ns / w, sum = 0;
  if (!s->window_ns || !k->busy)
    return 0;
  for (int i = 0; i < PR_SCHED_BUSY_SLOTS; i++)
    if (k->busy->idx[i] > cur - PR_SCHED_BUSY_SLOTS && k->busy->idx[i] <= cur)
      sum += k->busy->ns[i];
  return (double)sum / (double)s->window_ns;
}

double pr__sched_priority(const pr__sched_t *s, double vt_s, double waited_s) {
  double w = waited_s / s->max_wait_s;
  if (w > 1)
    w = 1;
  if (w < 0)
    w = 0;
  return vt_s - s->wait_weight * w * w;
}

static double task_priority(const pr__sched_t *s, const pr__sched_task_t *t,
                            int64_t now_ns) {
  if (s->fifo)
    return 0;
  return pr__sched_priority(s, pr__sched_vt(t->key, now_ns),
                            s->urgent && s->urgent(t)
                                ? s->max_wait_s
                                : (double)(now_ns - t->ready_ns) / 1e9);
}

/* --- the heaps -------------------------------------------------------- */

static int before(const pr__sched_task_t *a, const pr__sched_task_t *b) {
  return a->prio < b->prio || (a->prio == b->prio && a->seq < b->seq);
}

static void sift_up(pr__sched_heap_t *h, size_t i) {
  pr__sched_task_t *t = h->v[i];
  while (i > 0 && before(t, h->v[(i - 1) / 2])) {
    h->v[i] = h->v[(i - 1) / 2];
    i = (i - 1) / 2;
  }
  h->v[i] = t;
}

static void sift_down(pr__sched_heap_t *h, size_t i) {
  pr__sched_task_t *t = h->v[i];
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= h->n)
      break;
    if (c + 1 < h->n && before(h->v[c + 1], h->v[c]))
      c++;
    if (!before(h->v[c], t))
      break;
    h->v[i] = h->v[c];
    i = c;
  }
  h->v[i] = t;
}

static void heapify(pr__sched_heap_t *h) {
  for (size_t i = h->n / 2; i-- > 0;)
    sift_down(h, i);
}

static void rekey(pr__sched_t *s, int64_t now_ns) {
  for (int c = 0; c < 2; c++) {
    pr__sched_heap_t *h = &s->pool[c];
    for (size_t i = 0; i < h->n; i++)
      h->v[i]->prio = task_priority(s, h->v[i], now_ns);
    heapify(h);
  }
  s->rekey_ns = now_ns;
}

int pr__sched_push(pr__sched_t *s, pr__sched_task_t *t, int64_t now_ns) {
  pr__sched_heap_t *h = &s->pool[t->cls == PR_SCHED_FAILURE];
  if (pr__grow(&h->v, &h->cap, h->n, sizeof(*h->v), 64))
    return -1;
  t->ready_ns = now_ns;
  t->seq = s->seq++;
  t->prio = task_priority(s, t, now_ns);
  h->v[h->n++] = t;
  sift_up(h, h->n - 1);
  return 0;
}

pr__sched_task_t *pr__sched_pop(pr__sched_t *s, int64_t now_ns) {
  pr__sched_heap_t *h;
  pr__sched_task_t *t;
  if (!s->pool[0].n && !s->pool[1].n)
    return NULL;
  if (now_ns - s->rekey_ns >= PR_SCHED_REKEY_NS)
    rekey(s, now_ns);
  if (s->pool[0].n && s->pool[1].n && s->fifo) {
    h = s->pool[0].v[0]->seq < s->pool[1].v[0]->seq ? &s->pool[0] : &s->pool[1];
  } else if (s->pool[0].n && s->pool[1].n) {
    double fw = s->failure_weight;
    h = pr__sched_class_time(s, PR_SCHED_NORMAL, now_ns) / (1 - fw) <=
                pr__sched_class_time(s, PR_SCHED_FAILURE, now_ns) / fw
            ? &s->pool[0]
            : &s->pool[1];
  } else {
    h = s->pool[0].n ? &s->pool[0] : &s->pool[1];
  }
  t = h->v[0];
  h->v[0] = h->v[--h->n];
  if (h->n)
    sift_down(h, 0);
  return t;
}

void pr__sched_remove_if(pr__sched_t *s,
                         int (*drop)(pr__sched_task_t *t, void *arg),
                         void *arg) {
  for (int c = 0; c < 2; c++) {
    pr__sched_heap_t *h = &s->pool[c];
    size_t kept = 0;
    for (size_t i = 0; i < h->n; i++) {
      pr__sched_task_t *t = h->v[i];
      if (!drop(t, arg))
        h->v[kept++] = t;
    }
    h->n = kept;
    heapify(h);
  }
}

void pr__sched_rekey_soon(pr__sched_t *s) { s->rekey_ns = INT64_MIN / 2; }

size_t pr__sched_waiting(const pr__sched_t *s) {
  return s->pool[0].n + s->pool[1].n;
}
