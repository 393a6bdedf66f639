/*
 * dedup.c - deduplication (pipeline mode, messages): an event whose id was
 * recorded as handled is committed past without running the handler.
 *
 * The id is the original Prosody's: a UUID (version 8) whose bytes are
 * XXH3-128 (xxHash, header-only), little-endian, of idempotence_version,
 * group, topic, key (each after its length, u32) and the partition (i32),
 * then the payload's top-level string "id" (a byte 1, its length, it) or,
 * when there is none, the offset (a byte 0, i64); integers little-endian.
 * So a message the original recorded is a duplicate here, and the other
 * way round (same group and idempotence_version). The payload is
 * scanned for "id" only when the four bytes "id" (quotes included) occur
 * in it: a top-level "id" member cannot be written without them.
 *
 * With a Cassandra store each message is looked up at intake: first in a
 * process-wide cache of ids (idempotence_cache_size, least recently used
 * evicted), then in the store, so lookups run ahead of the key's queue. An id
 * is recorded, in the cache and the store with idempotence_ttl, only once its
 * handler succeeded or failed permanently; the events queued behind it on its
 * key with the same id (taken before it was recorded) are marked as
 * duplicates then, and a run never takes a duplicate of an event it runs
 * first. A failed store lookup is transient: the event waits and the lookup
 * is retried with the retry backoff; the handler does not run meanwhile.
 *
 * With the memory store (mock mode, or cassandra_nodes unset:
 * src/stores/memdedup.c, process-wide, which is its own cache and answers
 * at once on any thread) the engine thread, the pipeline's serial stage,
 * neither reads the id nor looks it up (DD_LATE): the thread about to run
 * the event's first attempt does both (pr__dd_prepare, before decode),
 * and the thread giving a success records it before posting the result
 * (its completed hook). A key's events start one after another, each once the
 * one before it has been recorded, so a duplicate queued behind its original,
 * or claimed by the same run, is still found; it is skipped like a
 * filtered record and committed in order.
 *
 * Threads: the engine thread, except pr__dd_prepare() and the completed hook
 * (the thread running the event, see above). The process-wide cache is shared
 * by every client, guarded by g_lock. The layer's engine-wide state is
 * struct pr__dd_state (eng->dd), which no other file reads.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dedup.h"
#include "internal.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

/* The cache in front of an asynchronous (Cassandra) store. */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pr__idset_t *g_cache; /* guarded by g_lock; never freed */

/* The layer's state (eng->dd): made by its open hook when the layer is on
 * (pipeline mode, idempotence_cache_size > 0) and its store opened, freed
 * by its close(final 1); eng->dd NULL: the layer is off. Written only while
 * the engine's owner opens the layer, except as said. */
struct pr__dd_state {
  int late;           /* the memory store: ids are read and looked up by
                         the thread about to run the event (DD_LATE) */
  int64_t ttl_s;      /* idempotence_ttl */
  pr__dedup_t *store; /* memory (answers at once on any thread: read by
                         the threads running events while `late`, kept
                         until close(final 1)) or Cassandra (engine thread;
                         closed, NULL, at close(final 0)) */
};

/* A store lookup in flight: `inv` is cleared when the event goes first. */
struct pr__dd_req {
  inv_t *inv;
};

/* Appends `n` bytes, after their length (u32, little-endian) when `len`. */
static char *put(char *o, const void *p, size_t n, int len) {
  if (len) {
    uint32_t l = (uint32_t)n;
    for (int i = 0; i < 4; i++)
      *o++ = (char)(l >> (8 * i));
  }
  memcpy(o, p, n);
  return o + n;
}

static uint64_t bswap64(uint64_t v) { return __builtin_bswap64(v); }

pr__did_t pr__dd_id(const char *version, const char *group, const char *topic,
                    int32_t partition, const char *key, const char *id,
                    size_t id_len, int64_t offset) {
  size_t vl = strlen(version), gl = strlen(group), tl = strlen(topic),
         kl = strlen(key), need = vl + gl + tl + kl + id_len + 64;
  char small[512], *buf = need <= sizeof(small) ? small : malloc(need), *o;
  uint8_t num[8];
  XXH128_hash_t h;
  pr__did_t d;
  if (!buf) { /* no memory: the fields hashed apart, less well mixed */
    d.hi = pr__fnv1a(key, kl) ^ (uint64_t)offset;
    d.lo = pr__fnv1a(id ? id : "", id ? id_len : 0) ^ pr__fnv1a(topic, tl);
    return d;
  }
  o = put(buf, version, vl, 1);
  o = put(o, group, gl, 1);
  o = put(o, topic, tl, 1);
  for (int i = 0; i < 4; i++)
    num[i] = (uint8_t)((uint32_t)partition >> (8 * i));
  o = put(o, num, 4, 0);
  o = put(o, key, kl, 1);
  if (id) {
    o = put(o, "\1", 1, 0);
    o = put(o, id, id_len, 1);
  } else {
    for (int i = 0; i < 8; i++)
      num[i] = (uint8_t)((uint64_t)offset >> (8 * i));
    o = put(o, "\0", 1, 0);
    o = put(o, num, 8, 0);
  }
  h = XXH3_128bits(buf, (size_t)(o - buf));
  if (buf != small)
    free(buf);
  /* The UUID's bytes are the 128-bit hash, little-endian (low half first),
   * marked version 8 (custom) and variant RFC 9562; hi/lo hold them in
   * order, big-endian. */
  d.hi = (bswap64(h.low64) & ~UINT64_C(0xf000)) | UINT64_C(0x8000);
  d.lo = (bswap64(h.high64) & ~(UINT64_C(0xc0) << 56)) | (UINT64_C(0x80) << 56);
  return d;
}

static int64_t now_s(void) { return (int64_t)time(NULL); }

static void got_seen(void *arg, prosody_err_t err, const char *errstr,
                     int seen) {
  (void)errstr;
  *(int *)arg = !err && seen;
}

/* In the cache, or (a memory store) the store itself: a superset of the
 * cache, at the cost of a cache lookup, so it replaces it. Any thread. */
static int known(pr__engine_t *eng, pr__did_t d) {
  int hit;
  if (eng->dd->late) {
    pr__dedup_seen(eng->dd->store, eng->group_id, d, got_seen, &hit);
    return hit;
  }
  pthread_mutex_lock(&g_lock);
  hit = pr__idset_has(g_cache, d, now_s());
  pthread_mutex_unlock(&g_lock);
  return hit;
}

/* Records a handled id in the cache or the memory store. Any thread. */
static void remember(pr__engine_t *eng, pr__did_t d) {
  if (eng->dd->late) {
    pr__dedup_record(eng->dd->store, eng->group_id, d, eng->dd->ttl_s, NULL,
                     NULL);
    return;
  }
  pthread_mutex_lock(&g_lock);
  pr__idset_add(g_cache, d, now_s() + eng->dd->ttl_s);
  pthread_mutex_unlock(&g_lock);
}

/* Puts the layer in place (pipeline mode, idempotence_cache_size > 0) with
 * its store, on the engine's Cassandra session (subscribing thread). */
static prosody_err_t dd_open(pr__engine_t *eng, char *errstr,
                             size_t errstr_size) {
  const pr__settings_t *st = eng->st;
  size_t cap = (size_t)PR_CFG_INT(st, IDEMPOTENCE_CACHE_SIZE);
  int memory = PR_CFG_BOOL(st, MOCK) || st->test.memory_timers ||
               !PR_CFG_SET(st, CASSANDRA_NODES);
  struct pr__dd_state *dd;
  prosody_err_t err;

  if (eng->mode != PR_MODE_PIPELINE || cap == 0)
    return PROSODY_OK; /* the layer is not in the list */
  if (!(dd = calloc(1, sizeof(*dd)))) {
    pr__errf(errstr, errstr_size, "out of memory");
    return PROSODY_ERR_NOMEM;
  }
  dd->ttl_s = PR_CFG_NS(st, IDEMPOTENCE_TTL) / 1000000000;
  if (memory) {
    if (!(dd->store = pr__dedup_memory())) {
      pr__errf(errstr, errstr_size, "out of memory");
      err = PROSODY_ERR_NOMEM;
      goto fail;
    }
    dd->late = 1;
    eng->dd = dd;
    return PROSODY_OK;
  }
  pthread_mutex_lock(&g_lock);
  if (!g_cache)
    g_cache = pr__idset_new(cap);
  else
    pr__idset_reserve(g_cache, cap); /* process-wide: the largest asked */
  err = g_cache ? PROSODY_OK : PROSODY_ERR_NOMEM;
  pthread_mutex_unlock(&g_lock);
  if (err) {
    pr__errf(errstr, errstr_size, "out of memory");
    goto fail;
  }
  if ((err = pr__cql_shared_open(&eng->cql, st, errstr, errstr_size)))
    goto fail;
  dd->store = pr__dedup_new(eng->cql.w, PR_CFG_STR(st, CASSANDRA_KEYSPACE),
                            errstr, errstr_size);
  if (!dd->store) {
    err = PROSODY_ERR_TRANSIENT;
    goto fail;
  }
  eng->dd = dd;
  return PROSODY_OK;
fail:
  free(dd);
  return err;
}

/* Closes the store: at shutdown (`final` 0) a Cassandra one, whose
 * records still being written the engine waited for (a little) before it
 * stopped their session (engine.c, stores_stop); when the engine is freed
 * (1), any. */
static void dd_close(pr__engine_t *eng, int final) {
  PR_ENGINE_THREAD(eng);
  struct pr__dd_state *dd = eng->dd;
  if (!dd)
    return;
  /* The memory store stays until the engine is freed: a handler that
   * outlived the shutdown records its success in it (the completed hook), and
   * an abandoned engine is never freed. The state stays too (the completed hook
   * reads it). */
  if (dd->late && !final)
    return;
  pr__dedup_free(dd->store);
  dd->store = NULL;
  if (final) {
    free(dd);
    eng->dd = NULL;
  }
}

int pr__dd_on(const pr__engine_t *eng) { return eng->dd != NULL; }

int64_t pr__dd_ttl_s(const pr__engine_t *eng) {
  return eng->dd ? eng->dd->ttl_s : 0;
}

const pr__did_t *pr__dd_stored_id(const inv_t *inv) {
  PR_ENGINE_THREAD(inv->eng);
  if (!inv->eng->dd || inv->eng->dd->late || DDX(inv)->st != DD_UNSEEN)
    return NULL;
  return &DDX(inv)->did;
}

static void on_seen(void *arg, prosody_err_t err, const char *errstr, int seen);

static void lookup(inv_t *inv) {
  pr__engine_t *eng = inv->eng;
  struct pr__dd_req *req = malloc(sizeof(*req));
  DDX(inv)->st = DD_PENDING;
  if (!req) {
    DDX(inv)->st = DD_ERROR; /* asked again at the head, with backoff */
    return;
  }
  req->inv = inv;
  DDX(inv)->req = req;
  pr__dedup_seen(eng->dd->store, eng->group_id, DDX(inv)->did, on_seen, req);
}

static void on_seen(void *arg, prosody_err_t err, const char *errstr,
                    int seen) {
  struct pr__dd_req *req = arg;
  inv_t *inv = req ? req->inv : NULL;
  char ev[160];
  free(req);
  if (!inv)
    return; /* the event went first (released) */
  DDX(inv)->req = NULL;
  /* Recorded since the lookup was sent (by the event ahead of this one on
   * its key, dd_record): the store's answer is older than that. */
  if (DDX(inv)->st == DD_SEEN || known(inv->eng, DDX(inv)->did)) {
    err = PROSODY_OK;
    seen = 1;
  }
  if (err) {
    DDX(inv)->st = DD_ERROR;
    PR_WARN("engine",
            "%s: deduplication lookup failed: %s; the handler waits and the "
            "lookup is retried",
            pr__inv_describe(inv, ev, sizeof(ev)), errstr ? errstr : "error");
    if (DDX(inv)->waiting) {
      DDX(inv)->waiting = 0;
      pr__outcome_arm_retry(
          inv, pr__outcome_backoff_ms(inv->eng, ++DDX(inv)->tries));
    }
    return;
  }
  DDX(inv)->st = seen ? DD_SEEN : DD_UNSEEN;
  DDX(inv)->tries = 0;
  if (DDX(inv)->waiting) {
    DDX(inv)->waiting = 0;
    pr__dispatch_schedule(inv);
  }
}

/* The message's id (and, when the payload was read for it, its JSON
 * verdict). Reads only the inv and immutable engine fields: any thread. */
static void read_id(inv_t *inv) {
  pr__engine_t *eng = inv->eng;
  const char *v = NULL;
  char small[128], *id = NULL;
  size_t vn = 0, idn = 0;
  if (memmem(inv->msg.payload, inv->msg.payload_len, "\"id\"", 4)) {
    /* Read up to the id only: the id is the one a full scan would give,
     * and the rest is validated by decode. Without an id the whole
     * payload was read: decode need not validate again. */
    int valid =
        pr__json_find(inv->msg.payload, inv->msg.payload_len, "id", &v, &vn);
    inv->json_state = valid; /* 0: not known */
  }
  if (v && (id = vn <= sizeof(small) ? small : malloc(vn)))
    idn = pr__json_unescape(v, vn, id);
  DDX(inv)->did = pr__dd_id(PR_CFG_STR(eng->st, IDEMPOTENCE_VERSION),
                            eng->group_id, inv->msg.topic, inv->msg.partition,
                            inv->msg.key, id, idn, inv->msg.offset);
  if (id && id != small)
    free(id);
}

/* A message taken: its id, looked up in the cache and the store; without
 * a store only marked DD_LATE. */
static void dd_intake(inv_t *inv) {
  PR_ENGINE_THREAD(inv->eng);
  pr__engine_t *eng = inv->eng;
  if (eng->dd->late) {
    DDX(inv)->st = DD_LATE; /* read and looked up by the thread that runs it */
    return;
  }
  read_id(inv);
  if (known(eng, DDX(inv)->did))
    DDX(inv)->st = DD_SEEN;
  else
    lookup(inv);
}

int pr__dd_prepare(inv_t *inv) {
  if (DDX(inv)->st != DD_LATE)
    return 0;
  read_id(inv);
  DDX(inv)->st = known(inv->eng, DDX(inv)->did) ? DD_SEEN : DD_UNSEEN;
  return DDX(inv)->st == DD_SEEN;
}

/* The completed hook (the completing thread, before the post): without a
 * store a success is recorded here (DD_RECORDED). */
static void completed(inv_t *inv, prosody_result_t result) {
  if (DDX(inv)->st != DD_UNSEEN || !inv->eng->dd->late ||
      result != PROSODY_SUCCESS || inv->skip)
    return; /* a permanent failure: dd_record, on the engine thread */
  remember(inv->eng, DDX(inv)->did);
  DDX(inv)->st = DD_RECORDED;
}

/* At the head of its key: run it, skip it (a duplicate: commit past it),
 * or wait (pr__dispatch_schedule() is called again once known). */
static int dd_gate(inv_t *inv) {
  PR_ENGINE_THREAD(inv->eng);
  switch (DDX(inv)->st) {
  case DD_OFF:
    return DD_RUN;
  case DD_SEEN:
    return DD_SKIP;
  case DD_ERROR:
    lookup(inv);
    if (DDX(inv)->st == DD_ERROR) { /* could not even ask: later */
      pr__outcome_arm_retry(
          inv, pr__outcome_backoff_ms(inv->eng, ++DDX(inv)->tries));
      return DD_WAIT;
    }
    /* fall through */
  case DD_PENDING:
    DDX(inv)->waiting = 1;
    return DD_WAIT;
  default: /* DD_UNSEEN (dd_record marks later duplicates) */
    return DD_RUN;
  }
}

/* Two events' ids are the same (both read). */
static int same_id(const inv_t *a, const inv_t *b) {
  return DDX(a)->did.hi == DDX(b)->did.hi && DDX(a)->did.lo == DDX(b)->did.lo;
}

/* The claimable hook: not a duplicate of one the run handles first. */
static int claimable(inv_t *head, inv_t *f) {
  PR_ENGINE_THREAD(head->eng);
  if (!head->eng->dd || DDX(f)->st == DD_OFF || DDX(f)->st == DD_LATE)
    return 1; /* DD_LATE: looked up once the run's earlier ones recorded */
  if (DDX(f)->st != DD_UNSEEN)
    return 0;
  for (inv_t *i = head; i; i = i->chain_next)
    if (DDX(i)->st != DD_OFF && same_id(i, f))
      return 0; /* a duplicate of one the run handles first */
  return 1;
}

static void on_recorded(void *arg, prosody_err_t err, const char *errstr) {
  (void)arg;
  if (err)
    PR_WARN("engine",
            "deduplication: recording a handled id failed: %s (the "
            "process-wide cache still has it)",
            errstr ? errstr : "error");
}

/* Its handler succeeded or failed permanently: remember its id. */
static void dd_record(inv_t *inv) {
  PR_ENGINE_THREAD(inv->eng);
  pr__engine_t *eng = inv->eng;
  /* A miss in the cache costs a store lookup; the memory store is its own
   * cache. */
  remember(eng, DDX(inv)->did);
  /* Taken before this was recorded, the same id behind it on its key. */
  for (inv_t *i = inv->next; i; i = i->next)
    if (i->state == INV_QUEUED && DDX(i)->st != DD_OFF &&
        DDX(i)->st != DD_LATE && same_id(i, inv))
      DDX(i)->st = DD_SEEN;
  if (!eng->dd->late)
    pr__dedup_record(eng->dd->store, eng->group_id, DDX(inv)->did,
                     eng->dd->ttl_s, on_recorded, NULL);
}

/* The forget hook: a lookup in flight must not reach the freed inv. */
static void forget(inv_t *inv) {
  PR_ENGINE_THREAD(inv->eng);
  if (DDX(inv)->req)
    DDX(inv)->req->inv = NULL;
  DDX(inv)->req = NULL;
}

/* ---- the layer ---------------------------------------------------------- */

static prosody_err_t open_layer(pr__engine_t *eng, const char *bootstrap,
                                char *errstr, size_t errstr_size) {
  (void)bootstrap;
  return dd_open(eng, errstr, errstr_size);
}

static void intake(inv_t *inv) {
  if (inv->eng->dd && !inv->is_timer)
    dd_intake(inv);
}

static int admit(inv_t *inv) {
  if (DDX(inv)->st == DD_OFF)
    return PR_ADMIT_RUN;
  switch (dd_gate(inv)) {
  case DD_RUN:
    return PR_ADMIT_RUN;
  case DD_SKIP:
    pr__outcome_count_duplicate(inv);
    return PR_ADMIT_SKIP;
  default:
    return PR_ADMIT_WAIT;
  }
}

/* Handled (success or permanent failure): remembered, and the same id
 * queued behind it on its key is a duplicate from now on (DD_RECORDED: by
 * its worker already). */
static void done(inv_t *inv) {
  if (DDX(inv)->st == DD_UNSEEN)
    dd_record(inv);
}

const pr__layer_t pr__layer_dedup = {.name = "dedup",
                                     .open = open_layer,
                                     .intake = intake,
                                     .admit = admit,
                                     .claimable = claimable,
                                     .completed = completed,
                                     .done = done,
                                     .forget = forget,
                                     .close = dd_close};

void pr__dd_unwait(inv_t *inv) {
  PR_ENGINE_THREAD(inv->eng);
  DDX(inv)->waiting = 0;
}
