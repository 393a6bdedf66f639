/*
 * memstate.c - the keyed-state store in memory (mock mode, or no
 * cassandra_nodes): one per process, shared by every client (as a
 * keyspace is), never freed.
 *
 * A collection of one key is a sorted array of cells; collections are
 * found through a hash table of their names (group, topic, partition, key,
 * collection). Expired cells are dropped when met. Identities and the
 * published collections' routes are lists.
 *
 * Threads: any; everything is guarded by g_lock. Callbacks run before the
 * call returns, outside the lock (their arguments are copies).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../util/util.h"
#include "state.h"

typedef struct mcell {
  int section;
  uint8_t *coord; /* coord and data in one allocation */
  size_t coord_len;
  uint8_t *data;
  size_t data_len;
  int64_t expires_s; /* 0: never */
} mcell_t;

typedef struct mcoll {
  struct mcoll *next; /* hash chain */
  uint64_t hash;
  char *name; /* the address, NUL-separated */
  size_t name_len;
  mcell_t *cells; /* sorted by (section, coord) */
  size_t n, cap;
} mcoll_t;

typedef struct mident {
  struct mident *next;
  char *group, *name;
  pr__sident_t id;
} mident_t;

/* A published collection's route. */
typedef struct mroute {
  struct mroute *next; /* in (subsystem, name, group, topic) order */
  char *subsystem, *name, *group, *topic;
  int32_t partitions;
} mroute_t;

#define BUCKETS 4096

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static mcoll_t *g_table[BUCKETS]; /* g_lock */
static mident_t *g_idents;        /* g_lock */
static mroute_t *g_routes;        /* g_lock */

static int64_t now_s(void) { return (int64_t)time(NULL); }

/* The collection's address as one string; its length in *len. */
static char *address(const pr__scoll_t *c, size_t *len) {
  size_t g = strlen(c->group), t = strlen(c->topic), k = strlen(c->key),
         n = strlen(c->name);
  char *a = malloc(g + t + k + n + 32);
  if (!a)
    return NULL;
  *len = (size_t)sprintf(a, "%s%c%s%c%d%c%s%c", c->group, 0, c->topic, 0,
                         (int)c->partition, 0, c->key, 0);
  memcpy(a + *len, c->name, n);
  *len += n;
  return a;
}

/* The collection (created when `create`); g_lock held. */
static mcoll_t *find(const pr__scoll_t *c, int create) {
  size_t len;
  char *a = address(c, &len);
  uint64_t h;
  mcoll_t *m;
  if (!a)
    return NULL;
  h = pr__fnv1a(a, len);
  for (m = g_table[h % BUCKETS]; m; m = m->next)
    if (m->hash == h && m->name_len == len && !memcmp(m->name, a, len)) {
      free(a);
      return m;
    }
  if (!create || !(m = calloc(1, sizeof(*m)))) {
    free(a);
    return NULL;
  }
  m->hash = h;
  m->name = a;
  m->name_len = len;
  m->next = g_table[h % BUCKETS];
  g_table[h % BUCKETS] = m;
  return m;
}

/* The first cell at or after (section, coord); `*hit` when equal. */
static size_t lower(const mcoll_t *m, int section, const uint8_t *coord,
                    size_t len, int *hit) {
  size_t lo = 0, hi = m->n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    const mcell_t *x = &m->cells[mid];
    if (pr__scell_cmp(x->section, x->coord, x->coord_len, section, coord, len) <
        0)
      lo = mid + 1;
    else
      hi = mid;
  }
  *hit =
      lo < m->n && !pr__scell_cmp(m->cells[lo].section, m->cells[lo].coord,
                                  m->cells[lo].coord_len, section, coord, len);
  return lo;
}

static void drop(mcoll_t *m, size_t i) {
  free(m->cells[i].coord);
  memmove(&m->cells[i], &m->cells[i + 1], (m->n - i - 1) * sizeof(mcell_t));
  m->n--;
}

static int live(const mcell_t *x, int64_t now) {
  return !x->expires_s || x->expires_s > now;
}

static void mem_get(pr__sstore_t *s, const pr__scoll_t *c, int section,
                    const uint8_t *coord, size_t coord_len, pr__sget_cb cb,
                    void *arg) {
  uint8_t *copy = NULL;
  size_t len = 0;
  int hit = 0, found = 0, nomem = 0;
  mcoll_t *m;
  (void)s;
  pthread_mutex_lock(&g_lock);
  if ((m = find(c, 0))) {
    size_t i = lower(m, section, coord, coord_len, &hit);
    if (hit && !live(&m->cells[i], now_s())) {
      drop(m, i);
    } else if (hit) {
      len = m->cells[i].data_len;
      if ((copy = malloc(len + 1))) {
        memcpy(copy, m->cells[i].data, len);
        copy[len] = 0;
        found = 1;
      } else {
        nomem = 1;
      }
    }
  }
  pthread_mutex_unlock(&g_lock);
  if (nomem)
    cb(arg, PROSODY_ERR_NOMEM, "out of memory", NULL, 0, 0);
  else
    cb(arg, PROSODY_OK, NULL, copy, found ? len : 0, found);
  free(copy);
}

static void mem_range(pr__sstore_t *s, const pr__scoll_t *c, int section,
                      const uint8_t *after, size_t after_len, int backward,
                      size_t limit, pr__srange_cb cb, void *arg) {
  pr__scell_t *out = NULL;
  uint8_t **bufs = NULL;
  size_t n = 0, i;
  int end = 1, hit;
  int64_t now = now_s();
  mcoll_t *m;
  (void)s;
  pthread_mutex_lock(&g_lock);
  if ((m = find(c, 0)) && limit > 0) {
    out = calloc(limit, sizeof(*out));
    bufs = calloc(limit, sizeof(*bufs));
    if (!out || !bufs) {
      pthread_mutex_unlock(&g_lock);
      free(out);
      free(bufs);
      cb(arg, PROSODY_ERR_NOMEM, "out of memory", NULL, 0, 0);
      return;
    }
    if (!backward) {
      i = after ? lower(m, section, after, after_len, &hit)
                : lower(m, section, (const uint8_t *)"", 0, &hit);
      if (after && hit)
        i++;
      for (; i < m->n && m->cells[i].section == section;) {
        if (!live(&m->cells[i], now)) {
          drop(m, i);
          continue;
        }
        if (n == limit) {
          end = 0;
          break;
        }
        out[n].section = section;
        if ((bufs[n] =
                 malloc(m->cells[i].coord_len + m->cells[i].data_len + 2))) {
          out[n].coord =
              memcpy(bufs[n], m->cells[i].coord, m->cells[i].coord_len);
          out[n].coord_len = m->cells[i].coord_len;
          out[n].data = memcpy(bufs[n] + out[n].coord_len + 1, m->cells[i].data,
                               m->cells[i].data_len);
          out[n].data_len = m->cells[i].data_len;
          n++;
        }
        i++;
      }
    } else {
      /* The first cell past the upper bound, then walk down. */
      size_t j;
      if (after)
        j = lower(m, section, after, after_len, &hit);
      else
        j = lower(m, section + 1, (const uint8_t *)"", 0, &hit);
      while (j > 0 && m->cells[j - 1].section == section) {
        mcell_t *x = &m->cells[j - 1];
        if (!live(x, now)) {
          drop(m, j - 1);
          j--;
          continue;
        }
        if (n == limit) {
          end = 0;
          break;
        }
        out[n].section = section;
        if ((bufs[n] = malloc(x->coord_len + x->data_len + 2))) {
          out[n].coord = memcpy(bufs[n], x->coord, x->coord_len);
          out[n].coord_len = x->coord_len;
          out[n].data =
              memcpy(bufs[n] + x->coord_len + 1, x->data, x->data_len);
          out[n].data_len = x->data_len;
          n++;
        }
        j--;
      }
    }
  }
  pthread_mutex_unlock(&g_lock);
  cb(arg, PROSODY_OK, NULL, out, n, end);
  for (i = 0; i < n; i++)
    free(bufs[i]);
  free(bufs);
  free(out);
}

/* Puts one cell; g_lock held. -1 when out of memory. */
static int put(mcoll_t *m, const pr__swrite_t *w, int64_t now) {
  int hit;
  size_t i = lower(m, w->section, w->coord, w->coord_len, &hit);
  uint8_t *buf = malloc(w->coord_len + w->data_len + 2);
  mcell_t *x;
  if (!buf)
    return -1;
  if (!hit) {
    if (m->n == m->cap) {
      size_t cap = m->cap ? m->cap * 2 : 8;
      mcell_t *cells = realloc(m->cells, cap * sizeof(*cells));
      if (!cells) {
        free(buf);
        return -1;
      }
      m->cells = cells;
      m->cap = cap;
    }
    memmove(&m->cells[i + 1], &m->cells[i], (m->n - i) * sizeof(mcell_t));
    m->n++;
  } else {
    free(m->cells[i].coord);
  }
  x = &m->cells[i];
  x->section = w->section;
  x->coord = buf;
  if (w->coord_len)
    memcpy(buf, w->coord, w->coord_len);
  x->coord_len = w->coord_len;
  x->data = buf + w->coord_len + 1;
  if (w->data_len)
    memcpy(x->data, w->data, w->data_len);
  x->data[w->data_len] = 0;
  x->data_len = w->data_len;
  x->expires_s = w->ttl_s > 0 ? now + w->ttl_s : 0;
  return 0;
}

static void mem_apply(pr__sstore_t *s, const pr__swrite_t *w, size_t n,
                      const pr__did_t *dedup, int64_t dedup_ttl_s,
                      pr__store_done_cb cb, void *arg) {
  int64_t now = now_s();
  int failed = 0, hit;
  mcoll_t *m = NULL;
  (void)s;
  (void)dedup; /* the memory dedup store records it (src/engine/dedup.c) */
  (void)dedup_ttl_s;
  pthread_mutex_lock(&g_lock);
  for (size_t i = 0; i < n && !failed; i++) {
    size_t j;
    if (!(m = find(w[i].coll, 1))) {
      failed = 1;
      break;
    }
    switch (w[i].op) {
    case PR_SW_PUT:
      failed = put(m, &w[i], now);
      break;
    case PR_SW_DEL:
      j = lower(m, w[i].section, w[i].coord, w[i].coord_len, &hit);
      if (hit)
        drop(m, j);
      break;
    default:
      j = lower(m, w[i].section, (const uint8_t *)"", 0, &hit);
      while (j < m->n && m->cells[j].section == w[i].section)
        drop(m, j);
      break;
    }
  }
  pthread_mutex_unlock(&g_lock);
  if (failed)
    cb(arg, PROSODY_ERR_NOMEM, "out of memory writing keyed state");
  else
    cb(arg, PROSODY_OK, NULL);
}

static const char *kind_name(int kind) {
  return kind == 0 ? "value" : kind == 1 ? "map" : "deque";
}

static void mem_identity(pr__sstore_t *s, const char *group, const char *name,
                         const pr__sident_t *id, pr__store_done_cb cb,
                         void *arg) {
  char why[512];
  mident_t *x;
  int clash = 0;
  (void)s;
  pthread_mutex_lock(&g_lock);
  for (x = g_idents; x; x = x->next)
    if (!strcmp(x->group, group) && !strcmp(x->name, name))
      break;
  if (x) {
    clash = x->id.kind != id->kind || x->id.payload != id->payload;
    if (clash)
      snprintf(why, sizeof(why),
               "keyed state: collection \"%s\" of group \"%s\" is recorded "
               "as a %s%s, not a %s%s: give the new collection another name",
               name, group, x->id.payload ? "message " : "",
               kind_name(x->id.kind), id->payload ? "message " : "",
               kind_name(id->kind));
  } else if (!id->check && (x = calloc(1, sizeof(*x)))) {
    x->group = strdup(group);
    x->name = strdup(name);
    x->id = *id;
    x->next = g_idents;
    g_idents = x;
  }
  pthread_mutex_unlock(&g_lock);
  if (clash)
    cb(arg, PROSODY_ERR_PERMANENT, why);
  else if (!x && id->check)
    cb(arg, PROSODY_ERR_STATE, "keyed state: no kind recorded");
  else
    cb(arg, PROSODY_OK, NULL);
}

/* ---- routes ---------------------------------------------------------- */

/* Orders a route against (subsystem, name, group, topic); NULL group or
 * topic compares as the lowest. */
static int route_cmp(const mroute_t *r, const char *sub, const char *name,
                     const char *group, const char *topic) {
  int c = strcmp(r->subsystem, sub);
  if (!c)
    c = strcmp(r->name, name);
  if (!c && group)
    c = strcmp(r->group, group);
  if (!c && topic)
    c = strcmp(r->topic, topic);
  return c;
}

static void mem_publish(pr__sstore_t *s, const char *subsystem,
                        const char *name, const pr__sroute_t *r,
                        pr__store_done_cb cb, void *arg) {
  mroute_t **at, *x;
  int c = 1, failed = 0;
  (void)s;
  pthread_mutex_lock(&g_lock);
  for (at = &g_routes; *at; at = &(*at)->next)
    if ((c = route_cmp(*at, subsystem, name, r->group, r->topic)) >= 0)
      break;
  if (*at && c == 0) {
    (*at)->partitions = r->partitions;
  } else if (!(x = calloc(1, sizeof(*x))) ||
             !(x->subsystem = strdup(subsystem)) || !(x->name = strdup(name)) ||
             !(x->group = strdup(r->group)) || !(x->topic = strdup(r->topic))) {
    if (x) {
      free(x->subsystem);
      free(x->name);
      free(x->group);
    }
    free(x);
    failed = 1;
  } else {
    x->partitions = r->partitions;
    x->next = *at;
    *at = x;
  }
  pthread_mutex_unlock(&g_lock);
  if (failed)
    cb(arg, PROSODY_ERR_NOMEM, "out of memory recording a route");
  else
    cb(arg, PROSODY_OK, NULL);
}

static void mem_unpublish(pr__sstore_t *s, const char *subsystem,
                          const char *name, const char *group,
                          pr__store_done_cb cb, void *arg) {
  mroute_t **at = &g_routes;
  (void)s;
  pthread_mutex_lock(&g_lock);
  while (*at) {
    mroute_t *x = *at;
    if (route_cmp(x, subsystem, name, group, NULL)) {
      at = &x->next;
      continue;
    }
    *at = x->next;
    free(x->subsystem);
    free(x->name);
    free(x->group);
    free(x->topic);
    free(x);
  }
  pthread_mutex_unlock(&g_lock);
  cb(arg, PROSODY_OK, NULL);
}

static void mem_routes(pr__sstore_t *s, const char *subsystem, const char *name,
                       pr__sroutes_cb cb, void *arg) {
  pr__sroute_t r[PR_SROUTES_MAX + 1];
  char *copies[2 * (PR_SROUTES_MAX + 1)];
  size_t n = 0, k;
  int failed = 0;
  (void)s;
  pthread_mutex_lock(&g_lock);
  for (mroute_t *x = g_routes; x && n <= PR_SROUTES_MAX; x = x->next) {
    if (route_cmp(x, subsystem, name, NULL, NULL))
      continue;
    copies[2 * n] = strdup(x->group);
    copies[2 * n + 1] = strdup(x->topic);
    r[n] = (pr__sroute_t){copies[2 * n], copies[2 * n + 1], x->partitions};
    failed |= !copies[2 * n] || !copies[2 * n + 1];
    n++;
  }
  pthread_mutex_unlock(&g_lock);
  if (failed)
    cb(arg, PROSODY_ERR_NOMEM, "out of memory listing routes", NULL, 0);
  else
    cb(arg, PROSODY_OK, NULL, r, n);
  for (k = 0; k < 2 * n; k++)
    free(copies[k]);
}

static void mem_poll(pr__sstore_t *s) { (void)s; }
static void mem_destroy(pr__sstore_t *s) { (void)s; }

static const pr__sstore_ops_t mem_ops = {
    mem_get,       mem_range,  mem_apply, mem_identity, mem_publish,
    mem_unpublish, mem_routes, mem_poll,  mem_destroy};
static pr__sstore_t g_store = {&mem_ops, 1};

pr__sstore_t *pr__memstate(void) { return &g_store; }
