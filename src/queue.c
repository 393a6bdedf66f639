/*
 * queue.c - prosody_queue_*: the event queue from libprosody's threads to
 * a host's event loop (the Python and Node.js packages). A list of the
 * host's intrusive items under one lock, and a wake-up (an eventfd, or the
 * host's function) only when the list turns non-empty: one wake-up per
 * batch, however many items are pushed before the host takes them.
 *
 * Threads: any thread pushes and offers; one thread at a time takes (the
 * host's loop). `lock` guards every field below it in struct
 * prosody_queue; `fd`, `bound` and the wake function are set before the
 * first push and read-only afterwards.
 *
 * Wake-ups: `signalled` is set by the push that wakes and cleared by the
 * take, so pushes before the host takes add no wake-up, and a push after a
 * take always wakes (the descriptor is drained under the lock before the
 * flag is cleared, so no wake-up is lost between them). A pusher writes
 * the descriptor after unlocking: such a write may land after the take
 * that took its item, giving the host one empty batch, never a lost one.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "util/util.h"

struct prosody_queue {
  int fd;                        /* eventfd, EFD_NONBLOCK */
  size_t bound;                  /* cap on offered items; 0: none */
  void (*wake_cb)(void *opaque); /* instead of the fd, or NULL */
  void *wake_opaque;             /* wake_cb's argument */
  pthread_mutex_t lock;          /* guards the fields below */
  prosody_queue_item_t *head;    /* oldest listed item, or NULL */
  prosody_queue_item_t *tail;    /* newest listed item, or NULL */
  size_t offered;                /* listed items that came by offer */
  unsigned long dropped;         /* refusals since the last take */
  int signalled;                 /* woken since the last take */
};

PROSODY_EXPORT prosody_queue_t *prosody_queue_new(size_t bound, char *errstr,
                                                  size_t errstr_size) {
  prosody_queue_t *q = calloc(1, sizeof(*q));
  if (!q) {
    pr__errf(errstr, errstr_size, "prosody_queue_new: out of memory");
    return NULL;
  }
  q->fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (q->fd < 0) {
    pr__errf(errstr, errstr_size, "prosody_queue_new: eventfd: %s",
             strerror(errno));
    free(q);
    return NULL;
  }
  q->bound = bound;
  pthread_mutex_init(&q->lock, NULL);
  return q;
}

PROSODY_EXPORT void prosody_queue_destroy(prosody_queue_t *q) {
  if (!q)
    return;
  close(q->fd);
  pthread_mutex_destroy(&q->lock);
  free(q);
}

PROSODY_EXPORT int prosody_queue_fd(const prosody_queue_t *q) {
  return q ? q->fd : -1;
}

PROSODY_EXPORT void prosody_queue_set_wake_cb(prosody_queue_t *q,
                                              void (*cb)(void *opaque),
                                              void *opaque) {
  if (!q)
    return;
  q->wake_cb = cb;
  q->wake_opaque = opaque;
}

/* The wake-up, after the lock is released. */
static void wake(prosody_queue_t *q) {
  if (q->wake_cb) {
    q->wake_cb(q->wake_opaque);
  } else {
    uint64_t one = 1;
    while (write(q->fd, &one, sizeof(one)) < 0 && errno == EINTR)
      ;
  }
}

/* Lists `it` (NULL: nothing), lock held; returns whether to wake. */
static int append(prosody_queue_t *q, prosody_queue_item_t *it) {
  int was = q->signalled;
  if (it) {
    it->next = NULL;
    if (q->tail)
      q->tail->next = it;
    else
      q->head = it;
    q->tail = it;
  }
  q->signalled = 1;
  return !was;
}

PROSODY_EXPORT void prosody_queue_push(prosody_queue_t *q,
                                       prosody_queue_item_t *it) {
  int w;
  if (!q || !it)
    return;
  it->bounded = 0;
  pthread_mutex_lock(&q->lock);
  w = append(q, it);
  pthread_mutex_unlock(&q->lock);
  if (w)
    wake(q);
}

PROSODY_EXPORT int prosody_queue_offer(prosody_queue_t *q,
                                       prosody_queue_item_t *it) {
  int w, refused = 0;
  if (!q)
    return -1;
  pthread_mutex_lock(&q->lock);
  if (!it || (q->bound && q->offered >= q->bound)) {
    q->dropped++;
    refused = 1;
    it = NULL; /* the count alone is news */
  } else {
    it->bounded = 1;
    q->offered++;
  }
  w = append(q, it);
  pthread_mutex_unlock(&q->lock);
  if (w)
    wake(q);
  return refused ? -1 : 0;
}

PROSODY_EXPORT prosody_queue_item_t *
prosody_queue_take(prosody_queue_t *q, unsigned long *dropped) {
  prosody_queue_item_t *it;
  uint64_t n;
  if (!q) {
    if (dropped)
      *dropped = 0;
    return NULL;
  }
  pthread_mutex_lock(&q->lock);
  /* Always, not only when signalled: a pusher writes after unlocking, so
   * a write may land after the take that took its item, and that wake-up
   * must not leave the descriptor readable for ever. */
  if (!q->wake_cb)
    while (read(q->fd, &n, sizeof(n)) < 0 && errno == EINTR)
      ;
  it = q->head;
  q->head = q->tail = NULL;
  q->offered = 0;
  if (dropped)
    *dropped = q->dropped;
  q->dropped = 0;
  q->signalled = 0;
  pthread_mutex_unlock(&q->lock);
  return it;
}
