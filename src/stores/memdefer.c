/*
 * memdefer.c - the deferral store in memory (mock mode): per (kind,
 * segment, key), whether the key is deferred with its retry time, and its
 * deferred positions in ascending order with their retry counts.
 *
 * One store per process, shared by every client (a revoked partition's
 * deferred keys wait here for its next owner) and never freed; each
 * client's handle (pr__defer_memory) is a view of one kind of it. Threads:
 * any; g_lock guards everything. Callbacks run before the operation
 * returns, outside the lock.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "../util/util.h"
#include "stores.h"

#define NBUCKETS 4096

typedef struct pos {
  int64_t position;
  int32_t retries;
} pos_t;

typedef struct entry {
  struct entry *next; /* bucket chain */
  int kind;
  char *segment, *key; /* one allocation, after the entry */
  int keyed;           /* the key is marked deferred ... */
  int64_t retry_at_s;  /* ... retrying then */
  pos_t *pos;          /* ascending */
  size_t n, cap;
} entry_t;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static entry_t *g_buckets[NBUCKETS]; /* guarded by g_lock */

static size_t bucket_of(int kind, const char *segment, const char *key) {
  return (pr__fnv1a_str(segment) * 31 + pr__fnv1a_str(key) + (size_t)kind) %
         NBUCKETS;
}

/* The entry of (kind, segment, key), created if `create`; NULL if absent or
 * out of memory. Under g_lock. */
static entry_t *find(int kind, const char *segment, const char *key,
                     int create) {
  size_t b = bucket_of(kind, segment, key), sl, kl;
  entry_t *e;
  for (e = g_buckets[b]; e; e = e->next)
    if (e->kind == kind && !strcmp(e->segment, segment) && !strcmp(e->key, key))
      return e;
  if (!create)
    return NULL;
  sl = strlen(segment) + 1;
  kl = strlen(key) + 1;
  if (!(e = calloc(1, sizeof(*e) + sl + kl)))
    return NULL;
  e->kind = kind;
  e->segment = (char *)(e + 1);
  memcpy(e->segment, segment, sl);
  e->key = e->segment + sl;
  memcpy(e->key, key, kl);
  e->next = g_buckets[b];
  g_buckets[b] = e;
  return e;
}

/* Frees `e` once it holds nothing. Under g_lock. */
static void trim(entry_t *e) {
  entry_t **pp;
  if (e->keyed || e->n > 0)
    return;
  for (pp = &g_buckets[bucket_of(e->kind, e->segment, e->key)]; *pp != e;
       pp = &(*pp)->next)
    ;
  *pp = e->next;
  free(e->pos);
  free(e);
}

static void done(pr__store_done_cb cb, void *arg, int nomem) {
  if (cb)
    cb(arg, nomem ? PROSODY_ERR_NOMEM : PROSODY_OK,
       nomem ? "out of memory" : NULL);
}

static void put(pr__defer_kind_t kind, const char *segment, const char *key,
                int64_t position, int32_t retries, int existing_only,
                pr__store_done_cb cb, void *arg) {
  entry_t *e;
  size_t i;
  int nomem = 0;
  pthread_mutex_lock(&g_lock);
  if ((e = find((int)kind, segment, key, !existing_only))) {
    for (i = 0; i < e->n && e->pos[i].position < position; i++)
      ;
    if (i < e->n && e->pos[i].position == position) {
      e->pos[i].retries = retries;
    } else if (!existing_only) {
      if (e->n == e->cap) {
        size_t cap = e->cap ? e->cap * 2 : 4;
        pos_t *p = realloc(e->pos, cap * sizeof(*p));
        if (p) {
          e->pos = p;
          e->cap = cap;
        }
      }
      if (e->n < e->cap) {
        memmove(e->pos + i + 1, e->pos + i, (e->n - i) * sizeof(*e->pos));
        e->pos[i].position = position;
        e->pos[i].retries = retries;
        e->n++;
      } else {
        nomem = 1;
        trim(e);
      }
    }
  } else if (!existing_only) {
    nomem = 1;
  }
  pthread_mutex_unlock(&g_lock);
  done(cb, arg, nomem);
}

static void mem_head(pr__defer_t *d, const char *segment, const char *key,
                     pr__head_cb cb, void *arg) {
  pr__defer_kind_t kind = d->kind;
  entry_t *e;
  int found = 0;
  int64_t position = 0;
  int32_t retries = 0;
  pthread_mutex_lock(&g_lock);
  if ((e = find((int)kind, segment, key, 0)) && e->n > 0) {
    found = 1;
    position = e->pos[0].position;
    retries = e->pos[0].retries;
  }
  pthread_mutex_unlock(&g_lock);
  cb(arg, PROSODY_OK, NULL, found, position, retries);
}

static void mem_advance(pr__defer_t *d, const char *segment, const char *key,
                        int64_t position, pr__store_done_cb cb, void *arg) {
  pr__defer_kind_t kind = d->kind;
  entry_t *e;
  pthread_mutex_lock(&g_lock);
  if ((e = find((int)kind, segment, key, 0))) {
    for (size_t i = 0; i < e->n; i++)
      if (e->pos[i].position == position) {
        memmove(e->pos + i, e->pos + i + 1, (e->n - i - 1) * sizeof(*e->pos));
        e->n--;
        break;
      }
    trim(e);
  }
  pthread_mutex_unlock(&g_lock);
  done(cb, arg, 0);
}

static void mem_trim(pr__defer_t *d, const char *segment, const char *key,
                     int64_t below, pr__store_done_cb cb, void *arg) {
  pr__defer_kind_t kind = d->kind;
  entry_t *e;
  pthread_mutex_lock(&g_lock);
  if ((e = find((int)kind, segment, key, 0))) {
    size_t i = 0;
    while (i < e->n && e->pos[i].position < below)
      i++;
    memmove(e->pos, e->pos + i, (e->n - i) * sizeof(*e->pos));
    e->n -= i;
    trim(e);
  }
  pthread_mutex_unlock(&g_lock);
  done(cb, arg, 0);
}

static void mem_keys(pr__defer_t *d, const char *segment, pr__dkeys_cb cb,
                     void *arg) {
  pr__defer_kind_t kind = d->kind;
  pr__dkey_t *keys = NULL;
  size_t n = 0, cap = 0;
  int nomem = 0;
  pthread_mutex_lock(&g_lock);
  for (size_t b = 0; b < NBUCKETS && !nomem; b++)
    for (entry_t *e = g_buckets[b]; e && !nomem; e = e->next) {
      if (e->kind != (int)kind || !e->keyed || strcmp(e->segment, segment))
        continue;
      if (n == cap) {
        pr__dkey_t *k = realloc(keys, (cap = cap ? cap * 2 : 16) * sizeof(*k));
        if (!k) {
          nomem = 1;
          break;
        }
        keys = k;
      }
      keys[n].retry_at_s = e->retry_at_s;
      if (!(keys[n].key = strdup(e->key)))
        nomem = 1;
      else
        n++;
    }
  pthread_mutex_unlock(&g_lock);
  if (nomem)
    cb(arg, PROSODY_ERR_NOMEM, "out of memory", NULL, 0);
  else
    cb(arg, PROSODY_OK, NULL, keys, n);
  for (size_t i = 0; i < n; i++)
    free((char *)keys[i].key);
  free(keys);
}

static void mem_set_key(pr__defer_t *d, const char *segment, const char *key,
                        int64_t retry_at_s, pr__store_done_cb cb, void *arg) {
  pr__defer_kind_t kind = d->kind;
  entry_t *e;
  pthread_mutex_lock(&g_lock);
  if ((e = find((int)kind, segment, key, 1))) {
    e->keyed = 1;
    e->retry_at_s = retry_at_s;
  }
  pthread_mutex_unlock(&g_lock);
  done(cb, arg, e == NULL);
}

static void mem_del_key(pr__defer_t *d, const char *segment, const char *key,
                        pr__store_done_cb cb, void *arg) {
  pr__defer_kind_t kind = d->kind;
  entry_t *e;
  pthread_mutex_lock(&g_lock);
  if ((e = find((int)kind, segment, key, 0))) {
    e->keyed = 0;
    trim(e);
  }
  pthread_mutex_unlock(&g_lock);
  done(cb, arg, 0);
}

static void mem_append(pr__defer_t *d, const char *segment, const char *key,
                       int64_t position, int32_t retries, pr__store_done_cb cb,
                       void *arg) {
  put(d->kind, segment, key, position, retries, 0, cb, arg);
}

static void mem_set_retries(pr__defer_t *d, const char *segment,
                            const char *key, int64_t position, int32_t retries,
                            pr__store_done_cb cb, void *arg) {
  put(d->kind, segment, key, position, retries, 1, cb, arg);
}

static void mem_poll(pr__defer_t *d) { (void)d; }

/* The handle goes; what it stored stays (process-wide). */
static void mem_destroy(pr__defer_t *d) { free(d); }

static const pr__defer_ops_t mem_ops = {
    mem_keys,    mem_set_key, mem_del_key,     mem_append, mem_head,
    mem_advance, mem_trim,    mem_set_retries, mem_poll,   mem_destroy};

pr__defer_t *pr__defer_memory(pr__defer_kind_t kind) {
  pr__defer_t *d = calloc(1, sizeof(*d));
  if (d) {
    d->ops = &mem_ops;
    d->kind = kind;
    d->sync = 1;
  }
  return d;
}
