/*
 * state_pub.c - published keyed state's reads (prosody_published_async,
 * _call): a client's reads of collections other groups publish, outside
 * handlers. The readers, and the reader thread their reads run on, are
 * opened and freed in state_pub_open.c.
 *
 * The reader thread runs every read: the routes of the collection
 * (keyed_state_publication), a check of each route's recorded kind
 * (keyed_state_identity), the choice of the source, and then the
 * operation itself through the same steps a handler's read takes
 * (state_kinds.c), with no transaction: an empty overlay that only caches
 * what the read fetched.
 *
 * The source, among the routes whose group recorded the collection's kind
 * (the original's admitted sources): with one, that one; with several, the
 * first (in the store's (group, topic) order) holding any cell for the key
 * (a read of one cell of each of the two sections); when none holds the
 * key, an empty collection (the read runs against an address of the memory
 * store nobody writes, so that each operation's empty answer is the one a
 * handler would get). As the original's reader: no route is a transient
 * error ("no publication rows"), as is no route with a recorded kind; more
 * than 16 routes, a route of another kind, and an empty key are permanent.
 *
 * Caches. A reader keeps its routes, and the kinds it checked, for its
 * time to live (reader thread only). Answers are kept in the client's
 * answer cache, shared by its readers, at most state_read_cache_size bytes
 * (else state_owned_cache_size, else 1 MiB; oldest out first), each for its
 * reader's time to live; a hit is answered on the calling thread.
 *
 * Threads and ownership (the structures: state.h):
 *   public functions  any thread; a request is the calling thread's until
 *                     posted, then the reader thread's until answered.
 *   reader thread     each reader's routes, every request while it runs.
 *   cache             `cache_lock` (callers look up, the reader thread
 *                     inserts).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <zlib.h>

#include "mailbox.h"
#include "state.h"

#define ENTRY_OVERHEAD 96 /* an entry's bytes beyond its strings */

/* An answer kept (in struct pr__pubs's cache: state.h). */
typedef struct centry {
  struct centry *hnext;         /* hash chain */
  struct centry *older, *newer; /* age list */
  uint64_t hash;
  char *key; /* the request, serialised */
  size_t key_len;
  prosody_state_result_t r; /* a copy */
  size_t bytes;
  int64_t expires_ns;
} centry_t;

enum { CK_NOT, CK_ADMITTED, CK_MISSING }; /* a route's recorded kind */

enum { RQ_ROUTES, RQ_CHECK, RQ_PROBE, RQ_RUN };

/* A read in flight. */
typedef struct preq {
  pr__mail_t mail;
  prosody_published_t *p;
  sop_t *op;  /* prepared; answers through pub_answered */
  char *key;  /* the Kafka key */
  char *ckey; /* the cache's key (NULL: not cached) */
  size_t ckey_len;
  prosody_state_cb cb;
  void *opaque;
  int stage;
  uint64_t gen;        /* p->gen of the routes it chooses among */
  size_t src;          /* RQ_PROBE: the route probed */
  int section;         /* RQ_PROBE: its section probed */
  char *group, *topic; /* the source read (copies) */
  int32_t partition;
  scoll_t *coll; /* the read's overlay */
} preq_t;

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ---- the answer cache ---------------------------------------------------- */

/* A deep copy of a JSON collection's answer; -1 when out of memory. */
static int result_copy(const prosody_state_result_t *in,
                       prosody_state_result_t *out, size_t *bytes) {
  memset(out, 0, sizeof(*out));
  out->number = in->number;
  if (in->n && !(out->items = calloc(in->n, sizeof(*out->items))))
    return -1;
  *bytes = 0;
  for (size_t i = 0; i < in->n; i++, out->n++) {
    const prosody_state_item_t *a = &in->items[i];
    prosody_state_item_t *b = &out->items[i];
    if ((a->key && !(b->key = pr__strndup(a->key, a->key_len))) ||
        (a->json && !(b->json = pr__strndup(a->json, a->json_len)))) {
      free((char *)b->key);
      b->key = NULL;
      prosody_state_result_free(out);
      return -1;
    }
    b->key_len = a->key_len;
    b->json_len = a->json_len;
    *bytes += a->key_len + a->json_len + sizeof(*b);
  }
  return 0;
}

static void entry_unlink(pr__pubs_t *pubs, centry_t *e) {
  centry_t **at = &pubs->buckets[e->hash % PR_PUBS_BUCKETS];
  while (*at != e)
    at = &(*at)->hnext;
  *at = e->hnext;
  if (e->older)
    e->older->newer = e->newer;
  else
    pubs->oldest = e->newer;
  if (e->newer)
    e->newer->older = e->older;
  else
    pubs->newest = e->older;
  pubs->cache_bytes -= e->bytes;
  prosody_state_result_free(&e->r);
  free(e->key);
  free(e);
}

/* The live entry of `key` (cache_lock held); an expired one goes. */
static centry_t *entry_find(pr__pubs_t *pubs, const char *key, size_t len,
                            uint64_t h) {
  centry_t *e = pubs->buckets[h % PR_PUBS_BUCKETS];
  while (e && !(e->hash == h && e->key_len == len && !memcmp(e->key, key, len)))
    e = e->hnext;
  if (e && e->expires_ns <= now_ns()) {
    entry_unlink(pubs, e);
    e = NULL;
  }
  return e;
}

/* A copy of the cached answer of `key` into *out: 1, else 0. */
static int cache_get(pr__pubs_t *pubs, const char *key, size_t len,
                     prosody_state_result_t *out) {
  uint64_t h = pr__fnv1a(key, len);
  size_t bytes;
  int hit = 0;
  centry_t *e;
  pthread_mutex_lock(&pubs->cache_lock);
  if ((e = entry_find(pubs, key, len, h)))
    hit = !result_copy(&e->r, out, &bytes);
  pthread_mutex_unlock(&pubs->cache_lock);
  return hit;
}

/* Keeps an answer (a copy) for ttl_ns; out of memory keeps nothing. */
static void cache_put(pr__pubs_t *pubs, const char *key, size_t len,
                      const prosody_state_result_t *r, int64_t ttl_ns) {
  centry_t *e = calloc(1, sizeof(*e)), *old;
  if (!e || !(e->key = malloc(len)) || result_copy(r, &e->r, &e->bytes)) {
    if (e)
      free(e->key);
    free(e);
    return;
  }
  memcpy(e->key, key, len);
  e->key_len = len;
  e->hash = pr__fnv1a(key, len);
  e->bytes += len + ENTRY_OVERHEAD;
  e->expires_ns = now_ns() + ttl_ns;
  pthread_mutex_lock(&pubs->cache_lock);
  if ((old = entry_find(pubs, key, len, e->hash)))
    entry_unlink(pubs, old);
  while (pubs->oldest && pubs->cache_bytes + e->bytes > pubs->cache_max)
    entry_unlink(pubs, pubs->oldest);
  if (e->bytes > pubs->cache_max) { /* never fits */
    pthread_mutex_unlock(&pubs->cache_lock);
    prosody_state_result_free(&e->r);
    free(e->key);
    free(e);
    return;
  }
  e->hnext = pubs->buckets[e->hash % PR_PUBS_BUCKETS];
  pubs->buckets[e->hash % PR_PUBS_BUCKETS] = e;
  e->older = pubs->newest;
  if (pubs->newest)
    pubs->newest->newer = e;
  else
    pubs->oldest = e;
  pubs->newest = e;
  pubs->cache_bytes += e->bytes;
  pthread_mutex_unlock(&pubs->cache_lock);
}

void pr__pubs_cache_clear(pr__pubs_t *pubs) {
  pthread_mutex_lock(&pubs->cache_lock);
  while (pubs->oldest)
    entry_unlink(pubs, pubs->oldest);
  pthread_mutex_unlock(&pubs->cache_lock);
}

/* A buffer a request is serialised into, as the cache's key. */
typedef struct kbuf {
  char *p;
  size_t n, cap;
  int failed;
} kbuf_t;

static void kb_put(kbuf_t *b, const void *p, size_t n) {
  if (!b->failed && b->n + n > b->cap) {
    size_t cap = b->cap ? b->cap : 64;
    char *x;
    while (cap < b->n + n)
      cap *= 2;
    if ((x = realloc(b->p, cap))) {
      b->p = x;
      b->cap = cap;
    } else {
      b->failed = 1;
    }
  }
  if (b->failed)
    return;
  memcpy(b->p + b->n, p, n);
  b->n += n;
}

/* A length, then the bytes: no two requests serialise alike. */
static void kb_str(kbuf_t *b, const char *s, size_t n) {
  uint64_t len = s ? n : UINT64_MAX;
  kb_put(b, &len, sizeof(len));
  if (s)
    kb_put(b, s, n);
}

static void kb_i64(kbuf_t *b, int64_t v) { kb_put(b, &v, sizeof(v)); }

/* The cache's key of (reader, key, operation and its arguments). */
static int cache_key(preq_t *q, const prosody_state_args_t *a) {
  kbuf_t b = {0};
  sop_t *op = q->op;
  kb_put(&b, &q->p, sizeof(q->p));
  kb_i64(&b, op->op);
  kb_str(&b, q->key, strlen(q->key));
  kb_str(&b, op->key, op->key_len);
  kb_i64(&b, (int64_t)op->nkeys);
  for (size_t i = 0; i < op->nkeys; i++)
    kb_str(&b, op->keys[i], strlen(op->keys[i]));
  kb_i64(&b, op->index);
  kb_str(&b, a ? a->after : NULL, a ? a->after_len : 0);
  kb_i64(&b, (int64_t)op->limit);
  kb_i64(&b, op->backward);
  kb_i64(&b, op->keys_only);
  if (b.failed) {
    free(b.p);
    return -1;
  }
  q->ckey = b.p;
  q->ckey_len = b.n;
  return 0;
}

/* ---- a read -------------------------------------------------------------- */

static void req_free(preq_t *q) {
  if (q->coll) {
    pr__st_ov_reset(q->coll);
    free(q->coll->cells);
    free(q->coll->name);
    free(q->coll);
  }
  free(q->key);
  free(q->ckey);
  free(q->group);
  free(q->topic);
  free(q);
}

/* The operation's answer (reader thread, or the thread that failed to post
 * it): kept, then the caller's. */
static void pub_answered(prosody_err_t err, const char *errstr,
                         const prosody_state_result_t *r, void *opaque) {
  preq_t *q = opaque;
  if (!err && q->ckey && q->p->ttl_ns > 0)
    cache_put(q->p->pubs, q->ckey, q->ckey_len, r, q->p->ttl_ns);
  q->cb(err, errstr, r, q->opaque);
  req_free(q);
}

static void req_step(preq_t *q);

static void req_fail(preq_t *q, prosody_err_t err, const char *errstr) {
  prosody_published_t *p = q->p;
  if (err == PROSODY_ERR_TIMEOUT)
    err = PROSODY_ERR_TRANSIENT;
  pr__st_sop_done(q->op, err, "published \"%s\" of subsystem \"%s\": %s",
                  p->name, p->subsystem,
                  errstr ? errstr : prosody_err_name(err));
}

void pr__pubs_routes_free(prosody_published_t *p) {
  for (size_t i = 0; i < p->nroutes; i++) {
    free((char *)p->routes[i].group);
    free((char *)p->routes[i].topic);
  }
  p->nroutes = 0;
  p->have_routes = 0;
}

static void routes_got(void *arg, prosody_err_t err, const char *errstr,
                       const pr__sroute_t *r, size_t n) {
  preq_t *q = arg;
  prosody_published_t *p = q->p;
  if (err) {
    req_fail(q, err, errstr);
    return;
  }
  pr__pubs_routes_free(p);
  if (n > PR_SROUTES_MAX) {
    req_fail(q, PROSODY_ERR_PERMANENT,
             "more than 16 publication sources (consumer groups and topics) "
             "advertise it; a reader takes at most 16");
    return;
  }
  for (size_t i = 0; i < n; i++) {
    char *g = strdup(r[i].group), *t = strdup(r[i].topic);
    if (!g || !t) {
      free(g);
      free(t);
      pr__pubs_routes_free(p);
      req_fail(q, PROSODY_ERR_NOMEM, "out of memory");
      return;
    }
    p->routes[p->nroutes++] = (pr__sroute_t){g, t, r[i].partitions};
  }
  memset(p->checked, 0, sizeof(p->checked));
  p->have_routes = 1;
  p->routes_ns = now_ns();
  q->gen = ++p->gen;
  q->stage = RQ_CHECK;
  req_step(q);
}

/* Another read replaced the routes while this one waited on the store:
 * its choice starts again among the new ones (what it learnt is dropped). */
static int routes_moved(preq_t *q) {
  if (q->gen == q->p->gen)
    return 0;
  q->gen = q->p->gen;
  q->stage = RQ_CHECK;
  q->section = 0;
  req_step(q);
  return 1;
}

static void checked(void *arg, prosody_err_t err, const char *errstr) {
  preq_t *q = arg;
  if (err && err != PROSODY_ERR_STATE) {
    req_fail(q, err, errstr);
    return;
  }
  if (routes_moved(q))
    return;
  /* STATE: the group recorded no kind (yet): not a source. */
  q->p->checked[q->src] = err ? CK_MISSING : CK_ADMITTED;
  req_step(q);
}

/* The next admitted route from `i`, or nroutes. */
static size_t admitted_from(const prosody_published_t *p, size_t i) {
  while (i < p->nroutes && p->checked[i] != CK_ADMITTED)
    i++;
  return i;
}

static void probed(void *arg, prosody_err_t err, const char *errstr,
                   const pr__scell_t *cells, size_t n, int end) {
  preq_t *q = arg;
  (void)cells;
  (void)end;
  if (err) {
    req_fail(q, err, errstr);
    return;
  }
  if (routes_moved(q))
    return;
  if (n) {
    q->stage = RQ_RUN; /* this source has the key */
  } else if (q->section == 0) {
    q->section = 1;
  } else {
    q->section = 0;
    q->src = admitted_from(q->p, q->src + 1);
  }
  req_step(q);
}

/* The key's partition in a topic of `partitions`: librdkafka's default
 * partitioner (consistent_random: CRC-32 of the key). */
static int32_t partition_of(const char *key, int32_t partitions) {
  uLong c = crc32(0L, (const Bytef *)key, (uInt)strlen(key));
  return (int32_t)(c % (uLong)partitions);
}

/* Sets the source of the read: route `i`, or none (i = nroutes). */
static int source(preq_t *q, size_t i) {
  prosody_published_t *p = q->p;
  free(q->group);
  free(q->topic);
  q->group = q->topic = NULL;
  if (i >= p->nroutes) {
    q->partition = 0;
    return !(q->group = strdup("")) || !(q->topic = strdup(""));
  }
  q->partition = partition_of(q->key, p->routes[i].partitions);
  return !(q->group = strdup(p->routes[i].group)) ||
         !(q->topic = strdup(p->routes[i].topic));
}

static void run(preq_t *q, size_t src) {
  prosody_published_t *p = q->p;
  sop_t *op = q->op;
  if (source(q, src) || !(q->coll = calloc(1, sizeof(*q->coll))) ||
      !(q->coll->name = strdup(p->name))) {
    req_fail(q, PROSODY_ERR_NOMEM, "out of memory");
    return;
  }
  q->coll->def = -1;
  op->store = src < p->nroutes ? p->pubs->store : pr__memstate();
  op->paddr = (pr__scoll_t){q->group, q->topic, q->partition, q->key, p->name};
  op->coll = q->coll;
  pr__st_run_read(op);
}

/* The read's next step (reader thread). */
static void req_step(preq_t *q) {
  prosody_published_t *p = q->p;
  pr__sstore_t *s = p->pubs->store;
  switch (q->stage) {
  case RQ_ROUTES:
    if (p->have_routes && p->ttl_ns > 0 &&
        now_ns() - p->routes_ns < p->ttl_ns) {
      q->gen = p->gen;
      q->stage = RQ_CHECK;
      req_step(q);
      return;
    }
    s->ops->routes(s, p->subsystem, p->name, routes_got, q);
    return;
  case RQ_CHECK:
    for (q->src = 0; q->src < p->nroutes; q->src++)
      if (p->checked[q->src] == CK_NOT) {
        pr__sident_t id = {p->kind, PROSODY_STATE_JSON, 1};
        s->ops->identity(s, p->routes[q->src].group, p->name, &id, checked, q);
        return;
      }
    /* Kept as the routes are (for the time to live): a reader of a
     * collection nobody publishes does not ask the store each time. */
    if (!p->nroutes) {
      req_fail(q, PROSODY_ERR_TRANSIENT,
               "no publication rows (no group publishes it, or not yet)");
      return;
    }
    q->src = admitted_from(p, 0);
    if (q->src == p->nroutes) {
      req_fail(q, PROSODY_ERR_TRANSIENT,
               "no publishing group has recorded its kind (yet)");
      return;
    }
    q->stage = RQ_PROBE;
    q->section = 0;
    if (admitted_from(p, q->src + 1) == p->nroutes) { /* no choice */
      run(q, q->src);
      return;
    }
    req_step(q);
    return;
  case RQ_PROBE:
    if (q->src >= p->nroutes) {
      run(q, p->nroutes); /* no source has the key */
      return;
    }
    if (source(q, q->src)) {
      req_fail(q, PROSODY_ERR_NOMEM, "out of memory");
      return;
    }
    {
      pr__scoll_t a = {q->group, q->topic, q->partition, q->key, p->name};
      s->ops->range(s, &a, q->section, NULL, 0, 0, 1, probed, q);
    }
    return;
  default: /* RQ_RUN */
    run(q, q->src);
    return;
  }
}

static void req_mail(pr__mail_t *mail, void *owner) {
  preq_t *q = PR_CONTAINER_OF(mail, preq_t, mail);
  pr__pubs_t *pubs = owner;
  if (pubs->stopping) {
    req_fail(q, PROSODY_ERR_STATE, "the client is being destroyed");
    return;
  }
  req_step(q);
}

/* ---- the public functions ------------------------------------------------ */

static int read_only(int op) {
  return op == PROSODY_STATE_GET || op == PROSODY_STATE_GET_MANY ||
         op == PROSODY_STATE_CONTAINS || op == PROSODY_STATE_LEN ||
         op == PROSODY_STATE_PEEK_BACK || op == PROSODY_STATE_PEEK_FRONT ||
         op == PROSODY_STATE_SCAN;
}

PROSODY_EXPORT prosody_err_t prosody_published_async(
    prosody_published_t *p, const char *key, prosody_state_op_t kind_op,
    const prosody_state_args_t *a, prosody_state_cb cb, void *opaque,
    char *errstr, size_t errstr_size) {
  prosody_state_t shape;
  prosody_state_result_t hit;
  preq_t *q;
  sop_t *op;
  prosody_err_t err;
  if (!p || !key || !cb) {
    pr__errf(errstr, errstr_size, "published state: %s is NULL",
             !p     ? "the reader"
             : !key ? "key"
                    : "the callback");
    return PROSODY_ERR_INVALID_ARG;
  }
  if (!key[0]) {
    pr__errf(errstr, errstr_size,
             "published state: cannot compute a partition for an empty key");
    return PROSODY_ERR_PERMANENT;
  }
  if (!read_only((int)kind_op)) {
    pr__errf(errstr, errstr_size,
             "published state: \"%s\" is read-only here; only its owner's "
             "handlers write it",
             p->name);
    return PROSODY_ERR_INVALID_ARG;
  }
  memset(&shape, 0, sizeof(shape));
  shape.def = -1;
  shape.kind = p->kind;
  shape.payload = PROSODY_STATE_JSON;
  shape.name = p->name;
  q = calloc(1, sizeof(*q));
  op = calloc(1, sizeof(*op));
  if (!q || !op || !(q->key = strdup(key))) {
    free(op);
    if (q)
      free(q->key);
    free(q);
    pr__errf(errstr, errstr_size, "out of memory");
    return PROSODY_ERR_NOMEM;
  }
  q->p = p;
  q->op = op;
  q->cb = cb;
  q->opaque = opaque;
  op->cb = pub_answered;
  op->opaque = q;
  if ((err =
           pr__st_prepare(op, &shape, (int)kind_op, a, errstr, errstr_size)) ||
      (p->ttl_ns > 0 && cache_key(q, a))) {
    pr__st_sop_free_args(op);
    free(op);
    req_free(q);
    if (!err)
      pr__errf(errstr, errstr_size, "out of memory");
    return err ? err : PROSODY_ERR_NOMEM;
  }
  if (q->ckey && cache_get(p->pubs, q->ckey, q->ckey_len, &hit)) {
    pr__st_sop_free_args(op);
    free(op);
    cb(PROSODY_OK, NULL, &hit, opaque);
    prosody_state_result_free(&hit);
    req_free(q);
    return PROSODY_OK;
  }
  if (pr__mailbox_try_post(&p->pubs->mb, &q->mail, req_mail))
    req_fail(q, PROSODY_ERR_STATE, "the client is being destroyed");
  return PROSODY_OK;
}

struct pub_wait {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  int done;
  prosody_err_t err;
  char errstr[512];
  prosody_state_result_t r;
};

static void call_answered(prosody_err_t err, const char *errstr,
                          const prosody_state_result_t *r, void *opaque) {
  struct pub_wait *w = opaque;
  size_t bytes;
  pthread_mutex_lock(&w->lock);
  w->err = err;
  if (err)
    snprintf(w->errstr, sizeof(w->errstr), "%s", errstr ? errstr : "");
  else if (r && result_copy(r, &w->r, &bytes))
    w->err = PROSODY_ERR_NOMEM;
  w->done = 1;
  pthread_cond_signal(&w->cond);
  pthread_mutex_unlock(&w->lock);
}

PROSODY_EXPORT prosody_err_t prosody_published_call(
    prosody_published_t *p, const char *key, prosody_state_op_t op,
    const prosody_state_args_t *a, prosody_state_result_t *r, char *errstr,
    size_t errstr_size) {
  struct pub_wait w;
  prosody_err_t err;
  memset(&w, 0, sizeof(w));
  if (r)
    memset(r, 0, sizeof(*r));
  pthread_mutex_init(&w.lock, NULL);
  pthread_cond_init(&w.cond, NULL);
  err = prosody_published_async(p, key, op, a, call_answered, &w, errstr,
                                errstr_size);
  if (!err) {
    pthread_mutex_lock(&w.lock);
    while (!w.done)
      pthread_cond_wait(&w.cond, &w.lock);
    pthread_mutex_unlock(&w.lock);
    if ((err = w.err))
      pr__errf(errstr, errstr_size, "%s",
               w.err == PROSODY_ERR_NOMEM && !w.errstr[0] ? "out of memory"
                                                          : w.errstr);
  }
  pthread_mutex_destroy(&w.lock);
  pthread_cond_destroy(&w.cond);
  if (!err && r)
    *r = w.r;
  else
    prosody_state_result_free(&w.r);
  return err;
}
