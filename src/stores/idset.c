/*
 * idset.c - a bounded set of 128-bit ids, least recently used evicted
 * first, each id with an expiry: the dedup layer's process-wide cache and
 * its memory store (mock mode).
 *
 * Threads: not thread-safe; its owner locks (src/engine/dedup.c).
 */
#include <stdlib.h>

#include "stores.h"

typedef struct ident {
  struct ident *hnext;         /* bucket chain */
  struct ident *lprev, *lnext; /* LRU list, most recent first */
  pr__did_t id;
  int64_t expires_s;
} ident_t;

/* Entries come from chunks (one allocation per CHUNK ids, kept until the
 * set is freed); dropped ones wait on a free list. */
#define CHUNK 256
typedef struct chunk {
  struct chunk *next;
  ident_t e[CHUNK];
} chunk_t;

struct pr__idset {
  ident_t **buckets;
  size_t nbuckets, n, cap;
  ident_t *head, *tail;
  ident_t *spare;  /* free entries, linked by hnext */
  chunk_t *chunks; /* every chunk, for _free */
  size_t fresh;    /* entries of chunks->e not handed out yet */
};

pr__idset_t *pr__idset_new(size_t capacity) {
  pr__idset_t *s = calloc(1, sizeof(*s));
  if (s)
    s->cap = capacity ? capacity : 1;
  return s;
}

void pr__idset_free(pr__idset_t *s) {
  chunk_t *c, *next;
  if (!s)
    return;
  for (c = s->chunks; c; c = next) {
    next = c->next;
    free(c);
  }
  free(s->buckets);
  free(s);
}

static ident_t *entry_new(pr__idset_t *s) {
  ident_t *e = s->spare;
  if (e) {
    s->spare = e->hnext;
    return e;
  }
  if (!s->chunks || s->fresh == 0) {
    chunk_t *c = malloc(sizeof(*c));
    if (!c)
      return NULL;
    c->next = s->chunks;
    s->chunks = c;
    s->fresh = CHUNK;
  }
  return &s->chunks->e[--s->fresh];
}

void pr__idset_reserve(pr__idset_t *s, size_t capacity) {
  if (capacity > s->cap)
    s->cap = capacity;
}

size_t pr__idset_size(const pr__idset_t *s) { return s->n; }

static size_t slot(const pr__idset_t *s, pr__did_t id) {
  return (size_t)(id.lo ^ id.hi) & (s->nbuckets - 1);
}

static void unlink_lru(pr__idset_t *s, ident_t *e) {
  if (e->lprev)
    e->lprev->lnext = e->lnext;
  else
    s->head = e->lnext;
  if (e->lnext)
    e->lnext->lprev = e->lprev;
  else
    s->tail = e->lprev;
}

static void push_front(pr__idset_t *s, ident_t *e) {
  e->lprev = NULL;
  e->lnext = s->head;
  if (s->head)
    s->head->lprev = e;
  else
    s->tail = e;
  s->head = e;
}

static ident_t **find(pr__idset_t *s, pr__did_t id) {
  ident_t **pp;
  if (!s->buckets)
    return NULL;
  for (pp = &s->buckets[slot(s, id)]; *pp; pp = &(*pp)->hnext)
    if ((*pp)->id.hi == id.hi && (*pp)->id.lo == id.lo)
      return pp;
  return NULL;
}

static void drop(pr__idset_t *s, ident_t **pp) {
  ident_t *e = *pp;
  *pp = e->hnext;
  unlink_lru(s, e);
  s->n--;
  e->hnext = s->spare;
  s->spare = e;
}

int pr__idset_has(pr__idset_t *s, pr__did_t id, int64_t now_s) {
  ident_t **pp = find(s, id);
  if (!pp)
    return 0;
  if ((*pp)->expires_s <= now_s) {
    drop(s, pp);
    return 0;
  }
  unlink_lru(s, *pp);
  push_front(s, *pp);
  return 1;
}

static int grow(pr__idset_t *s) {
  size_t n = s->nbuckets ? s->nbuckets * 2 : 64;
  ident_t **b = calloc(n, sizeof(*b));
  if (!b)
    return -1;
  for (size_t i = 0; i < s->nbuckets; i++) {
    ident_t *e = s->buckets[i], *next;
    for (; e; e = next) {
      next = e->hnext;
      e->hnext = b[(size_t)(e->id.lo ^ e->id.hi) & (n - 1)];
      b[(size_t)(e->id.lo ^ e->id.hi) & (n - 1)] = e;
    }
  }
  free(s->buckets);
  s->buckets = b;
  s->nbuckets = n;
  return 0;
}

int pr__idset_add(pr__idset_t *s, pr__did_t id, int64_t expires_s) {
  ident_t **pp = find(s, id), *e;
  if (pp) {
    (*pp)->expires_s = expires_s;
    unlink_lru(s, *pp);
    push_front(s, *pp);
    return 0;
  }
  if (s->n >= s->nbuckets && grow(s) && !s->buckets)
    return -1;
  if (s->n >= s->cap) { /* full: the least recently used entry is reused */
    pp = find(s, s->tail->id);
    e = *pp;
    *pp = e->hnext;
    unlink_lru(s, e);
    s->n--;
  } else if (!(e = entry_new(s))) {
    return -1;
  }
  e->id = id;
  e->expires_s = expires_s;
  e->hnext = s->buckets[slot(s, id)];
  s->buckets[slot(s, id)] = e;
  push_front(s, e);
  s->n++;
  return 0;
}
