/*
 * context.h - handler contexts as generation-checked handles (private).
 *
 * A prosody_context_t pointer given to a handler is not an address: it
 * encodes a slot index and the slot's generation. Slots live in a
 * process-wide table that is never freed, and a slot's generation changes
 * when its invocation ends, so a context kept past its handler (leaked,
 * or used by a late thread) is recognised as stale and refused with
 * PROSODY_ERR_STATE instead of touching freed memory.
 */
#ifndef PR_CONTEXT_H
#define PR_CONTEXT_H

#include <pthread.h>
#include <stdint.h>

#include "prosody.h"

typedef struct pr__ctx {
  pthread_mutex_t lock; /* guards every field below */
  pthread_cond_t cond;  /* signalled on cancel and on release */
  uint64_t gen;         /* current generation (>= 1) */
  void *owner;          /* the invocation while acquired, else NULL */
  int cancelled;        /* timeout, shutdown or revoke */
  int finished;         /* this attempt's result has been given */
  char *error;          /* set_error's message */
  uint32_t index;       /* immutable: the slot's place in the table */
  uint32_t next_free;   /* free-list link (table lock; in a stash, the
                           stash's thread) */
  /* prosody_context_on_cancel()'s, until it fires or the attempt ends */
  prosody_cancel_cb cancel_cb;
  void *cancel_opaque;
} pr__ctx_t;

/* A thread's own free slots: released there and acquired there again
 * without the table's lock (the engine thread acquires and releases every
 * attempt's slot). Owner: the one thread that uses it; zeroed is empty.
 * Its slots are linked by `next_free`, which the stash's thread owns while
 * they are in it. */
typedef struct pr__ctx_stash {
  uint32_t head; /* the first slot's index, valid when n > 0 */
  uint32_t n;    /* slots in it */
} pr__ctx_stash_t;

/* Takes a free slot for `owner` (from `stash` when it has one; `stash` may
 * be NULL); returns its handle and slot (NULL when out of memory). */
prosody_context_t *pr__ctx_acquire(pr__ctx_stash_t *stash, void *owner,
                                   pr__ctx_t **slot);
/* Ends the slot's current generation (waking waiters) and frees it, into
 * `stash` while it has room (`stash` may be NULL). */
void pr__ctx_release(pr__ctx_stash_t *stash, pr__ctx_t *slot);
/* Gives the stash's slots back to the table (its thread, or once that
 * thread has ended). */
void pr__ctx_stash_flush(pr__ctx_stash_t *stash);
/* The handle's slot, locked, if the handle is current; NULL (nothing
 * locked) if stale or invalid. */
pr__ctx_t *pr__ctx_lock(const prosody_context_t *handle);
/* The same, but also NULL (nothing locked) once the attempt has its
 * result: the slot of an attempt still running. */
pr__ctx_t *pr__ctx_lock_live(const prosody_context_t *handle);

#endif /* PR_CONTEXT_H */
