/*
 * state_pub_open.c - published keyed state's readers opened and freed
 * (pr__pubs_open for prosody_published_open, pr__pubs_free with the
 * client: client.c), and the reader thread their reads run on (the reads
 * themselves: state_pub.c).
 *
 * A client's readers share one reader thread (started by the first
 * prosody_published_open), which owns a keyed-state store of its own (the
 * memory store in mock mode, else a Cassandra store on the client's
 * keyspace) and a mailbox the reads are posted to. Opening a reader checks
 * its subsystem (trimmed, 1 to 64 bytes), name, kind and time to live; the
 * same reader opened again is the one already open. Freeing stops the
 * thread: reads posted and not yet run are answered PROSODY_ERR_STATE, the
 * store's destruction ends those running with errors; then the readers,
 * their routes and the answer cache go.
 *
 * Threads and ownership (the structures: state.h):
 *   pr__pubs_t        created and freed under the client's lock
 *                     (client.c); `readers` too.
 *   reader thread     the loop and the store (on_stop runs there).
 */
#include <stdlib.h>
#include <string.h>

#include <uv.h>

#include "../timers/timers.h"
#include "mailbox.h"
#include "state.h"

#define CACHE_BYTES_DEFAULT ((size_t)1 << 20) /* the answer cache's budget */

/* ---- the reader thread --------------------------------------------------- */

static void on_mail(uv_async_t *h) {
  pr__pubs_t *pubs = h->data;
  pr__mailbox_deliver(&pubs->mb);
}

static void on_store(uv_async_t *h) {
  pr__pubs_t *pubs = h->data;
  pubs->store->ops->poll(pubs->store);
}

static void store_wake(void *arg) {
  pr__pubs_t *pubs = arg;
  uv_async_send(&pubs->store_wake);
}

static void on_stop(uv_async_t *h) {
  pr__pubs_t *pubs = h->data;
  pubs->stopping = 1;
  pr__mailbox_close(&pubs->mb); /* what was posted: answered STATE */
  /* What runs: the store completes it with errors. */
  pubs->store->ops->destroy(pubs->store);
  pubs->store = NULL;
  pr__mailbox_quiesce(&pubs->mb);
  uv_close((uv_handle_t *)&pubs->mail_wake, NULL);
  uv_close((uv_handle_t *)&pubs->store_wake, NULL);
  uv_close((uv_handle_t *)&pubs->stop, NULL);
}

static void *reader_main(void *arg) {
  pr__pubs_t *pubs = arg;
  pthread_setname_np(pthread_self(), "prosody-pubread");
  uv_run(&pubs->loop, UV_RUN_DEFAULT);
  return NULL;
}

static prosody_err_t pubs_new(const pr__settings_t *st, pr__pubs_t **out,
                              char *errstr, size_t errstr_size) {
  pr__pubs_t *pubs = calloc(1, sizeof(*pubs));
  int memory = PR_CFG_BOOL(st, MOCK) || st->test.memory_timers;
  prosody_err_t err;
  if (!pubs) {
    pr__errf(errstr, errstr_size, "out of memory");
    return PROSODY_ERR_NOMEM;
  }
  pubs->st = st;
  pubs->cache_max = PR_CFG_SET(st, STATE_READ_CACHE_SIZE)
                        ? (size_t)PR_CFG(st, STATE_READ_CACHE_SIZE).u.i
                    : PR_CFG_SET(st, STATE_OWNED_CACHE_SIZE)
                        ? (size_t)PR_CFG(st, STATE_OWNED_CACHE_SIZE).u.i
                        : CACHE_BYTES_DEFAULT;
  if (!memory && !PR_CFG_SET(st, CASSANDRA_NODES)) {
    free(pubs);
    pr__errf(errstr, errstr_size,
             "published keyed state is read from Cassandra: set "
             "cassandra_nodes (PROSODY_CASSANDRA_NODES), or mock for the "
             "store in memory");
    return PROSODY_ERR_CONFIG;
  }
  uv_loop_init(&pubs->loop);
  uv_async_init(&pubs->loop, &pubs->mail_wake, on_mail);
  uv_async_init(&pubs->loop, &pubs->store_wake, on_store);
  uv_async_init(&pubs->loop, &pubs->stop, on_stop);
  pubs->mail_wake.data = pubs->store_wake.data = pubs->stop.data = pubs;
  pr__mailbox_init(&pubs->mb, pubs, &pubs->mail_wake);
  pthread_mutex_init(&pubs->cache_lock, NULL);
  if (memory) {
    pubs->store = pr__memstate();
  } else {
    /* The reader's own session (its thread owns the store): the store
     * holds its one reference, and its destroy stops it. */
    pr__cql_shared_t sh = {NULL, store_wake, pubs};
    if ((err = pr__cql_shared_open(&sh, st, errstr, errstr_size)))
      goto fail;
    pubs->store = pr__cqlstate_new(sh.w, PR_CFG_STR(st, CASSANDRA_KEYSPACE),
                                   errstr, errstr_size);
    pr__cqlw_free(sh.w);
    if (!pubs->store) {
      err = PROSODY_ERR_TRANSIENT;
      goto fail;
    }
  }
  if (pthread_create(&pubs->thread, NULL, reader_main, pubs)) {
    pr__errf(errstr, errstr_size, "could not start the reader thread");
    err = PROSODY_ERR_NOMEM;
    goto fail;
  }
  *out = pubs;
  return PROSODY_OK;
fail:
  if (pubs->store)
    pubs->store->ops->destroy(pubs->store);
  uv_close((uv_handle_t *)&pubs->mail_wake, NULL);
  uv_close((uv_handle_t *)&pubs->store_wake, NULL);
  uv_close((uv_handle_t *)&pubs->stop, NULL);
  uv_run(&pubs->loop, UV_RUN_DEFAULT);
  uv_loop_close(&pubs->loop);
  pr__mailbox_fini(&pubs->mb);
  pthread_mutex_destroy(&pubs->cache_lock);
  free(pubs);
  return err;
}

void pr__pubs_free(pr__pubs_t *pubs) {
  if (!pubs)
    return;
  uv_async_send(&pubs->stop);
  pthread_join(pubs->thread, NULL);
  uv_loop_close(&pubs->loop);
  pr__mailbox_fini(&pubs->mb);
  while (pubs->readers) {
    prosody_published_t *p = pubs->readers;
    pubs->readers = p->next;
    pr__pubs_routes_free(p);
    free(p->subsystem);
    free(p->name);
    free(p);
  }
  pr__pubs_cache_clear(pubs);
  pthread_mutex_destroy(&pubs->cache_lock);
  free(pubs);
}

/* ---- opening a reader ---------------------------------------------------- */

/* A reader's time to live: its own, else the client's (unset: none). */
static int64_t ttl_of(const pr__settings_t *st, int64_t read_cache_ms) {
  if (read_cache_ms >= 0)
    return read_cache_ms * 1000000;
  return PR_CFG_SET(st, STATE_READ_CACHE) ? PR_CFG_NS(st, STATE_READ_CACHE) : 0;
}

prosody_err_t pr__pubs_open(pr__pubs_t **pubs, const pr__settings_t *st,
                            const char *subsystem, const char *name, int kind,
                            int64_t read_cache_ms, prosody_published_t **out,
                            char *errstr, size_t errstr_size) {
  prosody_published_t *p;
  char *sub;
  prosody_err_t err;
  if (!subsystem || !name || !out) {
    pr__errf(errstr, errstr_size, "published state: %s is NULL",
             !subsystem ? "subsystem"
             : !name    ? "name"
                        : "out");
    return PROSODY_ERR_INVALID_ARG;
  }
  *out = NULL;
  while (*subsystem == ' ' || *subsystem == '\t')
    subsystem++;
  if (!(sub = strdup(subsystem))) {
    pr__errf(errstr, errstr_size, "out of memory");
    return PROSODY_ERR_NOMEM;
  }
  for (size_t n = strlen(sub); n && (sub[n - 1] == ' ' || sub[n - 1] == '\t');)
    sub[--n] = 0;
  if (!sub[0] || strlen(sub) > 64) {
    pr__errf(errstr, errstr_size,
             "published state: subsystem \"%.80s\" is %zu bytes (trimmed); "
             "expected a name of 1 to 64 bytes",
             subsystem, strlen(sub));
    free(sub);
    return PROSODY_ERR_INVALID_ARG;
  }
  if (!name[0] || strlen(name) > 256 || kind < PROSODY_STATE_VALUE ||
      kind > PROSODY_STATE_DEQUE || read_cache_ms < -1) {
    pr__errf(errstr, errstr_size,
             !name[0] || strlen(name) > 256
                 ? "published state: name must be 1 to 256 bytes"
             : read_cache_ms < -1
                 ? "published state: read_cache_ms is -1 (the client's "
                   "state_read_cache), 0 (none) or a number of milliseconds"
                 : "published state: kind must be value, map or deque");
    free(sub);
    return PROSODY_ERR_INVALID_ARG;
  }
  if (!*pubs && (err = pubs_new(st, pubs, errstr, errstr_size))) {
    free(sub);
    return err;
  }
  /* The same reader again: a program that opens one per request does not
   * pile them up. */
  for (p = (*pubs)->readers; p; p = p->next)
    if (p->kind == kind && p->ttl_ns == ttl_of(st, read_cache_ms) &&
        !strcmp(p->subsystem, sub) && !strcmp(p->name, name)) {
      free(sub);
      *out = p;
      return PROSODY_OK;
    }
  if (!(p = calloc(1, sizeof(*p))) || !(p->name = strdup(name))) {
    free(p);
    free(sub);
    pr__errf(errstr, errstr_size, "out of memory");
    return PROSODY_ERR_NOMEM;
  }
  p->pubs = *pubs;
  p->subsystem = sub;
  p->kind = kind;
  p->ttl_ns = ttl_of(st, read_cache_ms);
  p->next = (*pubs)->readers;
  (*pubs)->readers = p;
  *out = p;
  return PROSODY_OK;
}
