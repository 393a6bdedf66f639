/*
 * mailbox.c - the one way into the engine thread from other threads.
 *
 * Workers completing handlers, a host loop completing async handlers,
 * librdkafka's delivery reports, handlers' timer calls and the timer
 * store's thread all post letters here: one lock, one FIFO, one
 * wake-up (uv_async_send, sent only when the mailbox turns non-empty, so
 * a burst of completions costs the engine one wake-up). The engine takes
 * the whole FIFO at once and handles it in posting order.
 *
 * Threads: pr__mail_post* from any thread; the rest on the engine thread.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

int pr__mail_post(pr__engine_t *eng, pr__mail_t *mail) {
  int first;
  /* Once the letter is linked the engine may handle it (and finish with
   * the engine) at once; the counter keeps the engine and its wake handle
   * alive until this function has finished touching them. */
  atomic_fetch_add(&eng->pushers, 1);
  pthread_mutex_lock(&eng->lock);
  if (mail->kind == MAIL_OP && eng->mail_closed) {
    pthread_mutex_unlock(&eng->lock);
    atomic_fetch_sub(&eng->pushers, 1);
    return -1;
  }
  mail->next = NULL;
  first = eng->mail_head == NULL;
  if (eng->mail_tail)
    eng->mail_tail->next = mail;
  else
    eng->mail_head = mail;
  eng->mail_tail = mail;
  if (eng->draining)
    pthread_cond_signal(&eng->cond);
  pthread_mutex_unlock(&eng->lock);
  /* Whoever made the mailbox non-empty wakes the engine; later letters
   * ride on that wake-up (the engine takes the whole mailbox at once). */
  if (first)
    uv_async_send(&eng->wake);
  atomic_fetch_sub(&eng->pushers, 1);
  return 0;
}

void pr__mail_post_store(pr__engine_t *eng) {
  if (!atomic_exchange(&eng->store_posted, 1))
    pr__mail_post(eng, &eng->store_mail);
}

void pr__mail_deliver(pr__engine_t *eng) {
  pr__mail_t *m;
  pthread_mutex_lock(&eng->lock);
  m = eng->mail_head;
  eng->mail_head = eng->mail_tail = NULL;
  pthread_mutex_unlock(&eng->lock);
  while (m) {
    pr__mail_t *next = m->next; /* m may be freed by its handling */
    switch (m->kind) {
    case MAIL_DONE:
      pr__outcome_handler_done(PR_CONTAINER_OF(m, inv_t, mail));
      break;
    case MAIL_DLQ:
      pr__dlq_done(PR_CONTAINER_OF(m, inv_t, mail));
      break;
    case MAIL_OP:
      pr__tops_run_mail(eng, m);
      break;
    case MAIL_LOADED:
      pr__df_loaded(PR_CONTAINER_OF(m, pr__load_t, mail));
      break;
    default: /* MAIL_STORE: results posted after this are posted anew */
      atomic_store(&eng->store_posted, 0);
      if (eng->store)
        eng->store->ops->poll(eng->store);
      if (eng->dd_store)
        pr__dedup_poll(eng->dd_store);
      for (int kind = 0; kind < 2; kind++)
        if (eng->df_store[kind])
          pr__defer_poll(eng->df_store[kind]);
      break;
    }
    m = next;
  }
}

void pr__mail_wait(pr__engine_t *eng, const struct timespec *deadline) {
  pthread_mutex_lock(&eng->lock);
  if (!eng->mail_head) {
    eng->draining = 1;
    pthread_cond_timedwait(&eng->cond, &eng->lock, deadline);
    eng->draining = 0;
  }
  pthread_mutex_unlock(&eng->lock);
}

void pr__mail_close(pr__engine_t *eng) {
  pthread_mutex_lock(&eng->lock);
  eng->mail_closed = 1;
  pthread_mutex_unlock(&eng->lock);
  pr__mail_deliver(eng); /* operations queued before: refused as stopping */
}
