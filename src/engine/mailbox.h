/*
 * mailbox.h - a FIFO of letters from any thread to one libuv loop's
 * thread, with one wake-up per burst (private to src/engine/).
 *
 * A letter names the function that receives it (as libuv's work requests
 * and librdkafka's ops do), so the mailbox knows nothing of what it
 * carries: it is a leaf of the engine's call graph. A letter is embedded
 * in what it carries (PR_CONTAINER_OF gets that back) and is not copied;
 * it must stay valid until its function has run.
 *
 * Threads. pr__mailbox_post and pr__mailbox_try_post: any thread. The
 * rest: the owner thread (the engine's loop thread, or whichever thread
 * owns the engine while no loop runs: the subscribing thread before the
 * start, the stopping thread after the engine thread has exited).
 */
#ifndef PR_ENGINE_MAILBOX_H
#define PR_ENGINE_MAILBOX_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <time.h>
#include <uv.h>

typedef struct pr__mail pr__mail_t;

/* Receives a letter on the owner thread. `owner` is the mailbox's. The
 * letter may be freed or posted again by its function. */
typedef void pr__mail_fn(pr__mail_t *mail, void *owner);

/* A letter. `fn` is set by the poster; `next` is the mailbox's, linked
 * under its lock while posted. */
struct pr__mail {
  struct pr__mail *next;
  pr__mail_fn *fn;
};

#define PR_CONTAINER_OF(p, type, member)                                       \
  ((type *)(void *)((char *)(p)-offsetof(type, member)))

typedef struct pr__mailbox {
  void *owner;             /* passed to every letter's function (immutable) */
  uv_async_t *wake;        /* sent when the mailbox turns non-empty (immutable;
                              owned by the owner's loop) */
  pthread_mutex_t lock;    /* guards head, tail, closed and waiting */
  pthread_cond_t cond;     /* signalled on a post while `waiting` */
  pr__mail_t *head, *tail; /* letters in posting order */
  int closed;              /* pr__mailbox_try_post refuses */
  int waiting;             /* the owner sleeps in pr__mailbox_wait */
  atomic_int pushers;      /* threads inside a post: the mailbox (and what
                              embeds it) is not freed until none is left */
} pr__mailbox_t;

void pr__mailbox_init(pr__mailbox_t *mb, void *owner, uv_async_t *wake);
/* Waits until no thread is inside a post (so the wake handle may close). */
void pr__mailbox_quiesce(pr__mailbox_t *mb);
/* Frees the lock: after pr__mailbox_quiesce, or when none ever posted. */
void pr__mailbox_fini(pr__mailbox_t *mb);
/* Posts `mail` (with `fn`) and wakes the owner; always taken. */
void pr__mailbox_post(pr__mailbox_t *mb, pr__mail_t *mail, pr__mail_fn *fn);
/* As pr__mailbox_post, but refused (-1, the letter untouched) once the
 * mailbox is closed. */
int pr__mailbox_try_post(pr__mailbox_t *mb, pr__mail_t *mail, pr__mail_fn *fn);
/* Posts `mail` unless `*posted` says it waits already (a letter that stands
 * for "there is more", however often its cause recurs). Its function
 * clears `*posted` before it looks at what the letter stands for, so
 * what arrives after that is posted anew. */
void pr__mailbox_post_once(pr__mailbox_t *mb, pr__mail_t *mail, pr__mail_fn *fn,
                           atomic_int *posted);
/* Runs every letter posted so far, in posting order (owner thread). */
void pr__mailbox_deliver(pr__mailbox_t *mb);
/* Sleeps until a letter arrives or `deadline` (CLOCK_REALTIME) passes
 * (owner thread, outside the loop). */
void pr__mailbox_wait(pr__mailbox_t *mb, const struct timespec *deadline);
/* From now on pr__mailbox_try_post refuses; then delivers what is queued
 * (owner thread). */
void pr__mailbox_close(pr__mailbox_t *mb);
/* Holds the mailbox alive across a post the caller makes after letting go
 * of what otherwise keeps the owner alive (pr__mailbox_fini waits). */
static inline void pr__mailbox_hold(pr__mailbox_t *mb) {
  atomic_fetch_add(&mb->pushers, 1);
}
static inline void pr__mailbox_unhold(pr__mailbox_t *mb) {
  atomic_fetch_sub(&mb->pushers, 1);
}

#endif /* PR_ENGINE_MAILBOX_H */
