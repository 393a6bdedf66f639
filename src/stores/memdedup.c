/*
 * memdedup.c - the deduplication store in memory (mock mode, or no
 * cassandra_nodes): the ids handled in this process, at most
 * PR_DD_MEMORY_IDS of them (about 80 MB), the least recently used
 * evicted, each until its TTL.
 *
 * One store per process, shared by every client (as a Cassandra keyspace
 * is) and never freed; each client's handle (pr__dedup_memory) is a view
 * of it. Ids already carry their scope (the group is hashed into them), so
 * the scope is not kept.
 *
 * Threads: any. The ids are PR_DD_SHARDS sets by the id's top bits, each
 * under its own lock: handler threads look ids up and record them
 * concurrently (one lock for all cost the handler threads a fifth of their
 * time in lock waits and wake-ups on two cores); each shard evicts its own
 * least recently used. Callbacks run before the call returns, outside the
 * locks.
 */
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "stores.h"

#define PR_DD_MEMORY_IDS (1u << 20)
#define PR_DD_SHARDS 16

/* `set` is created once (under g_init) and never freed; its contents are
 * guarded by `lock`. */
static struct shard {
  pthread_mutex_t lock;
  pr__idset_t *set;
} __attribute__((aligned(64))) g_shards[PR_DD_SHARDS];
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t g_init = PTHREAD_MUTEX_INITIALIZER;

static void locks_init(void) {
  for (int i = 0; i < PR_DD_SHARDS; i++)
    pthread_mutex_init(&g_shards[i].lock, NULL);
}

static struct shard *shard_of(pr__did_t d) {
  return &g_shards[d.hi >> 60]; /* PR_DD_SHARDS == 16 */
}

static void mem_seen(pr__dedup_t *d, const char *scope, pr__did_t id,
                     pr__seen_cb cb, void *arg) {
  struct shard *sh = shard_of(id);
  int hit;
  (void)d;
  (void)scope;
  pthread_mutex_lock(&sh->lock);
  hit = pr__idset_has(sh->set, id, (int64_t)time(NULL));
  pthread_mutex_unlock(&sh->lock);
  cb(arg, PROSODY_OK, NULL, hit);
}

static void mem_record(pr__dedup_t *d, const char *scope, pr__did_t id,
                       int64_t ttl_s, pr__store_done_cb cb, void *arg) {
  struct shard *sh = shard_of(id);
  int rc;
  (void)d;
  (void)scope;
  pthread_mutex_lock(&sh->lock);
  rc = pr__idset_add(sh->set, id, (int64_t)time(NULL) + ttl_s);
  pthread_mutex_unlock(&sh->lock);
  if (cb)
    cb(arg, rc ? PROSODY_ERR_NOMEM : PROSODY_OK, rc ? "out of memory" : NULL);
}

static void mem_poll(pr__dedup_t *d) { (void)d; }

/* The handle goes; the ids stay (process-wide). */
static void mem_destroy(pr__dedup_t *d) { free(d); }

static const pr__dedup_ops_t mem_ops = {mem_seen, mem_record, mem_poll,
                                        mem_destroy};

pr__dedup_t *pr__dedup_memory(void) {
  pr__dedup_t *d;
  int ok = 1;
  pthread_once(&g_once, locks_init);
  pthread_mutex_lock(&g_init);
  for (int i = 0; i < PR_DD_SHARDS; i++) {
    /* Set before any client uses it; read under the shard's lock after. */
    pthread_mutex_lock(&g_shards[i].lock);
    if (!g_shards[i].set)
      g_shards[i].set = pr__idset_new(PR_DD_MEMORY_IDS / PR_DD_SHARDS);
    ok = ok && g_shards[i].set;
    pthread_mutex_unlock(&g_shards[i].lock);
  }
  pthread_mutex_unlock(&g_init);
  if (!ok || !(d = calloc(1, sizeof(*d))))
    return NULL;
  d->ops = &mem_ops;
  d->sync = 1;
  return d;
}
