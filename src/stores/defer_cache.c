/*
 * defer_cache.c - a cache of deferred keys' heads in front of a deferral
 * store (defer_store_cache_size entries per store).
 *
 * A deferred key's retries read its head (the lowest position and its
 * retry count) from the store before each retry. While the store is
 * Cassandra, that is a read per retry; a key that keeps failing reads the
 * head it has just written. The cache keeps, per (segment, key), what the
 * head is known to be (nothing, or a position with its retry count) and
 * answers a head read it knows at once, before the call returns.
 *
 * What it knows comes from two places:
 *   - a head read's answer, kept unless a write of that key was started
 *     while the read was in flight (the answer may predate it);
 *   - the writes themselves, applied when started and again when
 *     finished (each write's effect on the head is idempotent): an append
 *     or a retry count (Cassandra's UPDATE writes a missing row too) below
 *     the known head becomes the head; removing the head, or trimming
 *     below it, makes the head unknown (the next one is in the store).
 * A failed write makes the key's head unknown. keys() of a segment (its
 * partition was assigned: another instance may have written it since)
 * forgets the whole segment.
 *
 * Capacity: at most `capacity` keys, the least recently used evicted.
 *
 * Threads: the store's owner thread only (the engine thread), like the
 * store it wraps: every field below is that thread's, no lock.
 */
#include <stdlib.h>
#include <string.h>

#include "../util/util.h"
#include "stores.h"

typedef struct centry {
  struct centry *chain;       /* bucket chain */
  struct centry *prev, *next; /* LRU list, most recent first */
  uint64_t wseq;              /* the last write of this key started */
  int known;                  /* found/position/retries are the head */
  int found;
  int64_t position;
  int32_t retries;
  size_t hash;
  size_t seg_len;
  char *seg, *key; /* one allocation, after the entry */
} centry_t;

typedef struct cache {
  pr__defer_t base; /* first */
  pr__defer_t *inner;
  size_t capacity, n, nbuckets;
  centry_t **buckets;
  centry_t *mru, *lru;
  uint64_t seq; /* writes started so far */
  uint64_t hits, misses;
} cache_t;

/* A write or read in flight: the caller's callback and what to apply. */
typedef struct req {
  cache_t *c;
  int op; /* W_* for writes; W_HEAD for a read */
  uint64_t seq;
  int64_t position;
  int32_t retries;
  pr__store_done_cb done;
  pr__head_cb head;
  void *arg;
  char *seg, *key; /* in the same allocation */
} req_t;

enum { W_UPSERT, W_REMOVE, W_TRIM, W_OTHER, W_HEAD };

static size_t hash_of(const char *seg, const char *key) {
  return pr__fnv1a_str(seg) * 1099511628211u ^ pr__fnv1a_str(key);
}

static centry_t *lookup(cache_t *c, const char *seg, const char *key,
                        size_t h) {
  for (centry_t *e = c->buckets[h & (c->nbuckets - 1)]; e; e = e->chain)
    if (e->hash == h && !strcmp(e->seg, seg) && !strcmp(e->key, key))
      return e;
  return NULL;
}

static void lru_unlink(cache_t *c, centry_t *e) {
  if (e->prev)
    e->prev->next = e->next;
  else
    c->mru = e->next;
  if (e->next)
    e->next->prev = e->prev;
  else
    c->lru = e->prev;
  e->prev = e->next = NULL;
}

static void lru_front(cache_t *c, centry_t *e) {
  e->next = c->mru;
  if (c->mru)
    c->mru->prev = e;
  c->mru = e;
  if (!c->lru)
    c->lru = e;
}

static void drop(cache_t *c, centry_t *e) {
  centry_t **pp = &c->buckets[e->hash & (c->nbuckets - 1)];
  while (*pp != e)
    pp = &(*pp)->chain;
  *pp = e->chain;
  lru_unlink(c, e);
  c->n--;
  free(e);
}

/* The entry of (seg, key), made most recently used; created (unknown)
 * when `create`; NULL when absent or out of memory (the cache then just
 * knows less). */
static centry_t *touch(cache_t *c, const char *seg, const char *key,
                       int create) {
  size_t h = hash_of(seg, key), sl, kl;
  centry_t *e = lookup(c, seg, key, h);
  if (e) {
    lru_unlink(c, e);
    lru_front(c, e);
    return e;
  }
  if (!create)
    return NULL;
  sl = strlen(seg) + 1;
  kl = strlen(key) + 1;
  if (!(e = calloc(1, sizeof(*e) + sl + kl)))
    return NULL;
  e->seg = (char *)(e + 1);
  e->key = e->seg + sl;
  memcpy(e->seg, seg, sl);
  memcpy(e->key, key, kl);
  e->seg_len = sl - 1;
  e->hash = h;
  e->chain = c->buckets[h & (c->nbuckets - 1)];
  c->buckets[h & (c->nbuckets - 1)] = e;
  lru_front(c, e);
  if (++c->n > c->capacity)
    drop(c, c->lru);
  return e;
}

/* A write's effect on a known head. */
static void apply(centry_t *e, int op, int64_t position, int32_t retries) {
  if (!e->known)
    return;
  switch (op) {
  case W_UPSERT:
    if (!e->found || position < e->position) {
      e->found = 1;
      e->position = position;
      e->retries = retries;
    } else if (position == e->position) {
      e->retries = retries;
    }
    break;
  case W_REMOVE: /* position: the one removed */
    if (e->found && position == e->position)
      e->known = 0;
    break;
  case W_TRIM: /* position: removed below it */
    if (e->found && e->position < position)
      e->known = 0;
    break;
  default:
    break;
  }
}

static req_t *req_new(cache_t *c, int op, const char *seg, const char *key,
                      int64_t position, int32_t retries) {
  size_t sl = strlen(seg) + 1, kl = strlen(key) + 1;
  req_t *r = malloc(sizeof(*r) + sl + kl);
  if (!r)
    return NULL;
  r->c = c;
  r->op = op;
  r->seq = c->seq;
  r->position = position;
  r->retries = retries;
  r->seg = (char *)(r + 1);
  r->key = r->seg + sl;
  memcpy(r->seg, seg, sl);
  memcpy(r->key, key, kl);
  return r;
}

static void write_done(void *arg, prosody_err_t err, const char *errstr) {
  req_t *r = arg;
  centry_t *e = touch(r->c, r->seg, r->key, 0);
  if (e) {
    if (err)
      e->known = 0; /* the store may or may not hold it */
    else
      apply(e, r->op, r->position, r->retries);
  }
  r->done(r->arg, err, errstr);
  free(r);
}

/* Starts a write of (seg, key): applied now, and again when it finishes. */
static req_t *write_start(cache_t *c, int op, const char *seg, const char *key,
                          int64_t position, int32_t retries,
                          pr__store_done_cb cb, void *arg) {
  centry_t *e = touch(c, seg, key, 1);
  req_t *r;
  c->seq++;
  if (e) {
    e->wseq = c->seq;
    apply(e, op, position, retries);
  }
  if (!(r = req_new(c, op, seg, key, position, retries))) {
    if (e)
      e->known = 0;
    cb(arg, PROSODY_ERR_NOMEM, "out of memory");
    return NULL;
  }
  r->done = cb;
  r->arg = arg;
  return r;
}

static void c_append(pr__defer_t *b, const char *seg, const char *key,
                     int64_t position, int32_t retries, pr__store_done_cb cb,
                     void *arg) {
  cache_t *c = (cache_t *)b;
  req_t *r = write_start(c, W_UPSERT, seg, key, position, retries, cb, arg);
  if (r)
    pr__defer_append(c->inner, seg, key, position, retries, write_done, r);
}

static void c_set_retries(pr__defer_t *b, const char *seg, const char *key,
                          int64_t position, int32_t retries,
                          pr__store_done_cb cb, void *arg) {
  cache_t *c = (cache_t *)b;
  req_t *r = write_start(c, W_UPSERT, seg, key, position, retries, cb, arg);
  if (r)
    pr__defer_set_retries(c->inner, seg, key, position, retries, write_done, r);
}

static void c_advance(pr__defer_t *b, const char *seg, const char *key,
                      int64_t position, pr__store_done_cb cb, void *arg) {
  cache_t *c = (cache_t *)b;
  req_t *r = write_start(c, W_REMOVE, seg, key, position, 0, cb, arg);
  if (r)
    pr__defer_advance(c->inner, seg, key, position, write_done, r);
}

static void c_trim(pr__defer_t *b, const char *seg, const char *key,
                   int64_t below, pr__store_done_cb cb, void *arg) {
  cache_t *c = (cache_t *)b;
  req_t *r = write_start(c, W_TRIM, seg, key, below, 0, cb, arg);
  if (r)
    pr__defer_trim(c->inner, seg, key, below, write_done, r);
}

/* The key rows do not touch the heads. */
static void c_set_key(pr__defer_t *b, const char *seg, const char *key,
                      int64_t retry_at_s, pr__store_done_cb cb, void *arg) {
  pr__defer_set_key(((cache_t *)b)->inner, seg, key, retry_at_s, cb, arg);
}

static void c_del_key(pr__defer_t *b, const char *seg, const char *key,
                      pr__store_done_cb cb, void *arg) {
  pr__defer_del_key(((cache_t *)b)->inner, seg, key, cb, arg);
}

static void head_answer(void *arg, prosody_err_t err, const char *errstr,
                        int found, int64_t position, int32_t retries) {
  req_t *r = arg;
  cache_t *c = r->c;
  if (!err) {
    /* Kept unless a write of the key started after the read did (an
     * entry evicted meanwhile cannot tell: then any write since counts). */
    centry_t *e = touch(c, r->seg, r->key, c->seq == r->seq);
    if (e && e->wseq <= r->seq) {
      e->known = 1;
      e->found = found;
      e->position = position;
      e->retries = retries;
    }
  }
  r->head(r->arg, err, errstr, found, position, retries);
  free(r);
}

static void c_head(pr__defer_t *b, const char *seg, const char *key,
                   pr__head_cb cb, void *arg) {
  cache_t *c = (cache_t *)b;
  centry_t *e = touch(c, seg, key, 0);
  req_t *r;
  if (e && e->known) {
    c->hits++;
    cb(arg, PROSODY_OK, NULL, e->found, e->position, e->retries);
    return;
  }
  c->misses++;
  if (!(r = req_new(c, W_HEAD, seg, key, 0, 0))) {
    cb(arg, PROSODY_ERR_NOMEM, "out of memory", 0, 0, 0);
    return;
  }
  r->head = cb;
  r->arg = arg;
  pr__defer_head(c->inner, seg, key, head_answer, r);
}

/* The segment's partition was assigned: forget what it knew of it. */
static void c_keys(pr__defer_t *b, const char *seg, pr__dkeys_cb cb,
                   void *arg) {
  cache_t *c = (cache_t *)b;
  size_t sl = strlen(seg);
  /* Counts as a write: a read issued before the assignment (the partition
   * owned earlier) must not be cached by its late answer, which another
   * owner's deferral may have outdated meanwhile. */
  c->seq++;
  for (centry_t *e = c->mru, *next; e; e = next) {
    next = e->next;
    if (e->seg_len == sl && !memcmp(e->seg, seg, sl))
      drop(c, e);
  }
  pr__defer_keys(c->inner, seg, cb, arg);
}

static void c_poll(pr__defer_t *b) { pr__defer_poll(((cache_t *)b)->inner); }

static void c_destroy(pr__defer_t *b) {
  cache_t *c = (cache_t *)b;
  /* The store's pending callbacks still reach their requests. */
  pr__defer_free(c->inner);
  while (c->mru)
    drop(c, c->mru);
  free(c->buckets);
  free(c);
}

static const pr__defer_ops_t cache_ops = {
    c_keys,    c_set_key, c_del_key,     c_append, c_head,
    c_advance, c_trim,    c_set_retries, c_poll,   c_destroy};

pr__defer_t *pr__defer_cached(pr__defer_t *inner, size_t capacity) {
  cache_t *c = calloc(1, sizeof(*c));
  size_t nb = 16;
  if (!c)
    return NULL;
  while (nb < capacity && nb < ((size_t)1 << 24))
    nb <<= 1;
  if (!(c->buckets = calloc(nb, sizeof(*c->buckets)))) {
    free(c);
    return NULL;
  }
  c->nbuckets = nb;
  c->capacity = capacity ? capacity : 1;
  c->inner = inner;
  c->base.ops = &cache_ops;
  c->base.kind = inner->kind;
  c->base.sync = inner->sync;
  return &c->base;
}

void pr__defer_cache_stats(const pr__defer_t *d, uint64_t *hits,
                           uint64_t *misses) {
  const cache_t *c = (const cache_t *)d;
  *hits = d->ops == &cache_ops ? c->hits : 0;
  *misses = d->ops == &cache_ops ? c->misses : 0;
}
