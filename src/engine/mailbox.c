/*
 * mailbox.c - the one way into the engine thread from other threads.
 *
 * Workers completing handlers, a host loop completing async handlers,
 * librdkafka's delivery reports, handlers' timer calls, the stores'
 * threads, the loader and the stopping thread all post letters here: one
 * lock, one FIFO, one wake-up (uv_async_send, sent only when the mailbox
 * turns non-empty, so a burst of completions costs the owner one
 * wake-up). The owner takes the whole FIFO at once and runs each letter's
 * function in posting order. It calls nothing else of the engine.
 *
 * Threads: the posts from any thread; the rest on the owner thread
 * (mailbox.h).
 */
#include <sched.h>

#include "mailbox.h"

void pr__mailbox_init(pr__mailbox_t *mb, void *owner, uv_async_t *wake) {
  mb->owner = owner;
  mb->wake = wake;
  pthread_mutex_init(&mb->lock, NULL);
  pthread_cond_init(&mb->cond, NULL);
  mb->head = mb->tail = NULL;
  mb->closed = mb->waiting = 0;
  atomic_init(&mb->pushers, 0);
}

void pr__mailbox_quiesce(pr__mailbox_t *mb) {
  while (atomic_load(&mb->pushers) > 0)
    sched_yield();
}

void pr__mailbox_fini(pr__mailbox_t *mb) {
  pthread_mutex_destroy(&mb->lock);
  pthread_cond_destroy(&mb->cond);
}

static int post(pr__mailbox_t *mb, pr__mail_t *mail, pr__mail_fn *fn,
                int refusable) {
  int first;
  /* Once the letter is linked the owner may run it (and finish with the
   * mailbox) at once; the counter keeps the mailbox and its wake handle
   * alive until this function has finished touching them. */
  atomic_fetch_add(&mb->pushers, 1);
  pthread_mutex_lock(&mb->lock);
  if (refusable && mb->closed) {
    pthread_mutex_unlock(&mb->lock);
    atomic_fetch_sub(&mb->pushers, 1);
    return -1;
  }
  mail->fn = fn;
  mail->next = NULL;
  first = mb->head == NULL;
  if (mb->tail)
    mb->tail->next = mail;
  else
    mb->head = mail;
  mb->tail = mail;
  if (mb->waiting)
    pthread_cond_signal(&mb->cond);
  pthread_mutex_unlock(&mb->lock);
  /* Whoever made the mailbox non-empty wakes the owner; later letters
   * ride on that wake-up (the owner takes the whole mailbox at once). */
  if (first)
    uv_async_send(mb->wake);
  atomic_fetch_sub(&mb->pushers, 1);
  return 0;
}

void pr__mailbox_post(pr__mailbox_t *mb, pr__mail_t *mail, pr__mail_fn *fn) {
  (void)post(mb, mail, fn, 0);
}

int pr__mailbox_try_post(pr__mailbox_t *mb, pr__mail_t *mail, pr__mail_fn *fn) {
  return post(mb, mail, fn, 1);
}

void pr__mailbox_post_once(pr__mailbox_t *mb, pr__mail_t *mail, pr__mail_fn *fn,
                           atomic_int *posted) {
  if (!atomic_exchange(posted, 1))
    (void)post(mb, mail, fn, 0);
}

void pr__mailbox_deliver(pr__mailbox_t *mb) {
  pr__mail_t *m;
  pthread_mutex_lock(&mb->lock);
  m = mb->head;
  mb->head = mb->tail = NULL;
  pthread_mutex_unlock(&mb->lock);
  while (m) {
    pr__mail_t *next = m->next; /* m may be freed by its function */
    m->fn(m, mb->owner);
    m = next;
  }
}

void pr__mailbox_wait(pr__mailbox_t *mb, const struct timespec *deadline) {
  pthread_mutex_lock(&mb->lock);
  if (!mb->head) {
    mb->waiting = 1;
    pthread_cond_timedwait(&mb->cond, &mb->lock, deadline);
    mb->waiting = 0;
  }
  pthread_mutex_unlock(&mb->lock);
}

void pr__mailbox_close(pr__mailbox_t *mb) {
  pthread_mutex_lock(&mb->lock);
  mb->closed = 1;
  pthread_mutex_unlock(&mb->lock);
  pr__mailbox_deliver(mb); /* refusable letters queued before: run, and
                              their functions see the owner stopping */
}
