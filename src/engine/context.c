/*
 * context.c - the process-wide table of handler contexts (see context.h).
 *
 * Ownership: `table_lock` guards the free list and table growth; each
 * slot's own lock guards its fields. Chunks are published once (atomic
 * pointers) and never freed, so a stale handle can always be checked. A
 * thread that acquires and releases many slots (the engine's) keeps a
 * stash of free ones (pr__ctx_stash_t): its own, without the table's
 * lock.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "../util/util.h"
#include "context.h"

#define CHUNK_BITS 10
#define CHUNK_SLOTS (1u << CHUNK_BITS)
#define INDEX_BITS 24
#define MAX_CHUNKS (1u << (INDEX_BITS - CHUNK_BITS))
#define GEN_MASK ((UINT64_C(1) << (64 - INDEX_BITS)) - 1)
#define NO_SLOT UINT32_MAX
#define STASH_MAX 256 /* a stash's slots at most */

_Static_assert(sizeof(uintptr_t) >= 8, "context handles need 64-bit pointers");

static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic(pr__ctx_t *) chunks[MAX_CHUNKS]; /* published once */
static uint32_t nchunks;                        /* guarded by table_lock */
static uint32_t free_head = NO_SLOT;            /* guarded by table_lock */

static pr__ctx_t *slot_at(uint32_t index) {
  pr__ctx_t *chunk = atomic_load(&chunks[index >> CHUNK_BITS]);
  return chunk ? &chunk[index & (CHUNK_SLOTS - 1)] : NULL;
}

/* Adds a chunk to the free list; table_lock held. */
static int grow_locked(void) {
  pr__ctx_t *chunk;
  uint32_t base;
  if (nchunks == MAX_CHUNKS || !(chunk = calloc(CHUNK_SLOTS, sizeof(*chunk))))
    return -1;
  base = nchunks << CHUNK_BITS;
  for (uint32_t i = 0; i < CHUNK_SLOTS; i++) {
    pthread_mutex_init(&chunk[i].lock, NULL);
    pthread_cond_init(&chunk[i].cond, NULL);
    chunk[i].gen = 1;
    chunk[i].index = base + i;
    chunk[i].next_free = i + 1 < CHUNK_SLOTS ? base + i + 1 : free_head;
  }
  atomic_store(&chunks[nchunks], chunk);
  nchunks++;
  free_head = base;
  return 0;
}

static prosody_context_t *handle_of(const pr__ctx_t *slot) {
  uint64_t h = ((slot->gen & GEN_MASK) << INDEX_BITS) | slot->index;
  return (prosody_context_t *)(uintptr_t)h;
}

prosody_context_t *pr__ctx_acquire(pr__ctx_stash_t *stash, void *owner,
                                   pr__ctx_t **out) {
  pr__ctx_t *slot;
  prosody_context_t *h;
  if (stash && stash->n > 0) {
    slot = slot_at(stash->head);
    stash->head = slot->next_free;
    stash->n--;
  } else {
    pthread_mutex_lock(&table_lock);
    if (free_head == NO_SLOT && grow_locked()) {
      pthread_mutex_unlock(&table_lock);
      return NULL;
    }
    slot = slot_at(free_head);
    free_head = slot->next_free;
    pthread_mutex_unlock(&table_lock);
  }

  pthread_mutex_lock(&slot->lock);
  slot->owner = owner;
  slot->cancelled = 0;
  slot->finished = 0;
  slot->cancel_cb = NULL;
  slot->cancel_opaque = NULL;
  h = handle_of(slot);
  pthread_mutex_unlock(&slot->lock);
  *out = slot;
  return h;
}

void pr__ctx_release(pr__ctx_stash_t *stash, pr__ctx_t *slot) {
  pthread_mutex_lock(&slot->lock);
  slot->gen = (slot->gen + 1) & GEN_MASK;
  if (slot->gen == 0)
    slot->gen = 1;
  slot->owner = NULL;
  slot->cancel_cb = NULL; /* the attempt is over: never called now */
  slot->cancel_opaque = NULL;
  free(slot->error);
  slot->error = NULL;
  pthread_cond_broadcast(&slot->cond);
  pthread_mutex_unlock(&slot->lock);

  if (stash && stash->n < STASH_MAX) {
    slot->next_free = stash->n > 0 ? stash->head : NO_SLOT;
    stash->head = slot->index;
    stash->n++;
    return;
  }
  pthread_mutex_lock(&table_lock);
  slot->next_free = free_head;
  free_head = slot->index;
  pthread_mutex_unlock(&table_lock);
}

void pr__ctx_stash_flush(pr__ctx_stash_t *stash) {
  pthread_mutex_lock(&table_lock);
  while (stash->n > 0) {
    pr__ctx_t *slot = slot_at(stash->head);
    stash->head = slot->next_free;
    stash->n--;
    slot->next_free = free_head;
    free_head = slot->index;
  }
  pthread_mutex_unlock(&table_lock);
}

pr__ctx_t *pr__ctx_lock(const prosody_context_t *handle) {
  uint64_t h = (uint64_t)(uintptr_t)handle;
  uint32_t index = (uint32_t)(h & ((UINT64_C(1) << INDEX_BITS) - 1));
  uint64_t gen = h >> INDEX_BITS;
  pr__ctx_t *slot;
  if (!handle || index >= (MAX_CHUNKS << CHUNK_BITS) ||
      !(slot = slot_at(index)))
    return NULL;
  pthread_mutex_lock(&slot->lock);
  if (slot->gen != gen || !slot->owner) {
    pthread_mutex_unlock(&slot->lock);
    return NULL;
  }
  return slot;
}

pr__ctx_t *pr__ctx_lock_live(const prosody_context_t *handle) {
  pr__ctx_t *slot = pr__ctx_lock(handle);
  if (slot && slot->finished) {
    pthread_mutex_unlock(&slot->lock);
    slot = NULL;
  }
  return slot;
}
PROSODY_EXPORT int prosody_should_cancel(const prosody_context_t *ctx) {
  pr__ctx_t *slot = pr__ctx_lock(ctx);
  int cancelled;
  if (!slot)
    return 1; /* stale: its invocation is over */
  /* Finished counts as over too: the engine may not have released the
   * slot yet (a worker can be running the key's next event already). */
  cancelled = slot->cancelled || slot->finished;
  pthread_mutex_unlock(&slot->lock);
  return cancelled;
}

PROSODY_EXPORT prosody_err_t prosody_context_on_cancel(prosody_context_t *ctx,
                                                       prosody_cancel_cb cb,
                                                       void *opaque) {
  pr__ctx_t *slot;
  if (!ctx)
    return PROSODY_ERR_INVALID_ARG;
  if (!(slot = pr__ctx_lock_live(ctx)))
    return PROSODY_ERR_STATE;
  slot->cancel_cb = NULL;
  slot->cancel_opaque = NULL;
  if (cb && slot->cancelled) {
    cb(ctx, opaque); /* lock held, as pr__dispatch_cancel() calls it */
  } else {
    slot->cancel_cb = cb;
    slot->cancel_opaque = opaque;
  }
  pthread_mutex_unlock(&slot->lock);
  return PROSODY_OK;
}

PROSODY_EXPORT int prosody_wait_cancel(prosody_context_t *ctx,
                                       int64_t timeout_ms) {
  struct timespec ts;
  pr__ctx_t *slot;
  uint64_t gen;
  int cancelled;
  if (timeout_ms >= 0) /* capped at ~31 years so the ns cannot overflow */
    pr__deadline_after(CLOCK_REALTIME,
                       (timeout_ms < INT64_C(1000000000000)
                            ? timeout_ms
                            : INT64_C(1000000000000)) *
                           1000000,
                       &ts);
  if (!(slot = pr__ctx_lock(ctx)))
    return 1;
  gen = slot->gen;
  /* A result or a release (new generation) ends the wait too: the
   * invocation is over. */
  while (!slot->cancelled && !slot->finished && slot->gen == gen) {
    if (timeout_ms < 0)
      pthread_cond_wait(&slot->cond, &slot->lock);
    else if (pthread_cond_timedwait(&slot->cond, &slot->lock, &ts) == ETIMEDOUT)
      break;
  }
  cancelled = slot->cancelled || slot->finished || slot->gen != gen;
  pthread_mutex_unlock(&slot->lock);
  return cancelled;
}

PROSODY_EXPORT void prosody_context_set_error(prosody_context_t *ctx,
                                              const char *message) {
  pr__ctx_t *slot = pr__ctx_lock(ctx);
  if (!slot)
    return;
  free(slot->error);
  slot->error = message ? strdup(message) : NULL;
  pthread_mutex_unlock(&slot->lock);
}
