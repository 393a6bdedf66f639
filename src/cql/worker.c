/*
 * worker.c - a CQL session on its own thread (see worker.h).
 *
 * Ownership: `lock` guards both queues, `pending`, `waiting`, `stopping`
 * and the round hooks; `refs` and `started` belong to the owner thread;
 * the session, its loop and everything they own belong to the worker
 * thread once started (statements excepted: cql.c locks their list).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../util/util.h"
#include "worker.h"

struct pr__cqlw {
  pr__cql_t *cql;
  pr__logger_t *logger; /* its creator's: the thread logs there */
  uv_loop_t loop;
  uv_async_t async;
  pthread_t thread;
  int started; /* owner: the thread runs (1) or ran and ended (2) */
  int refs;    /* owner */
  pthread_mutex_t lock;
  pthread_cond_t done;                 /* a job finished, for `waiting` */
  pr__cqlw_job_t *in_head, *in_tail;   /* posted, to start */
  pr__cqlw_job_t *out_head, *out_tail; /* finished, to deliver */
  int pending;                         /* posted, not yet delivered */
  int waiting;                         /* owner threads in pr__cqlw_wait */
  int stopping;
  void (*wake)(void *);
  void *wake_arg;
  struct {
    void (*fn)(void *arg, int stopping);
    void *arg;
  } round[PR_CQLW_ROUNDS]; /* pr__cqlw_on_round: each entry written once,
                              before `nround` counts it */
  int nround;
};

static void q_push(pr__cqlw_job_t **head, pr__cqlw_job_t **tail,
                   pr__cqlw_job_t *j) {
  j->qnext = NULL;
  if (*tail)
    (*tail)->qnext = j;
  else
    *head = j;
  *tail = j;
}

void pr__cqlw_complete(pr__cqlw_job_t *j, prosody_err_t err,
                       const char *errstr) {
  pr__cqlw_t *w = j->w;
  j->err = err;
  snprintf(j->errstr, sizeof(j->errstr), "%s", err && errstr ? errstr : "");
  pthread_mutex_lock(&w->lock);
  q_push(&w->out_head, &w->out_tail, j);
  if (w->waiting)
    pthread_cond_broadcast(&w->done);
  pthread_mutex_unlock(&w->lock);
  w->wake(w->wake_arg);
}

void pr__cqlw_post(pr__cqlw_job_t *j) {
  pr__cqlw_t *w = j->w;
  int stopping;
  pthread_mutex_lock(&w->lock);
  w->pending++;
  stopping = w->stopping;
  if (!stopping)
    q_push(&w->in_head, &w->in_tail, j);
  pthread_mutex_unlock(&w->lock);
  if (stopping)
    pr__cqlw_complete(j, PROSODY_ERR_STATE, "the Cassandra store is closed");
  else
    uv_async_send(&w->async);
}

void pr__cqlw_poll(pr__cqlw_t *w) {
  pr__cqlw_job_t *j;
  pthread_mutex_lock(&w->lock);
  j = w->out_head;
  w->out_head = w->out_tail = NULL;
  for (pr__cqlw_job_t *k = j; k; k = k->qnext)
    w->pending--;
  pthread_mutex_unlock(&w->lock);
  while (j) {
    pr__cqlw_job_t *next = j->qnext;
    j->deliver(j);
    j = next;
  }
}

void pr__cqlw_wait(pr__cqlw_t *w, int64_t ms) {
  struct timespec ts;
  pr__deadline_after(CLOCK_REALTIME, ms * 1000000, &ts);
  pthread_mutex_lock(&w->lock);
  w->waiting++;
  while (!w->out_head && pthread_cond_timedwait(&w->done, &w->lock, &ts) == 0)
    ;
  w->waiting--;
  pthread_mutex_unlock(&w->lock);
}

int pr__cqlw_drain(pr__cqlw_t *w, int64_t ms) {
  int64_t give_up = pr__now_ns() + ms * 1000000;
  int left;
  for (;;) {
    pr__cqlw_poll(w);
    pthread_mutex_lock(&w->lock);
    left = w->pending;
    pthread_mutex_unlock(&w->lock);
    if (!left || pr__now_ns() >= give_up)
      return left;
    pr__cqlw_wait(w, (give_up - pr__now_ns()) / 1000000 + 1);
  }
}

/* The round hooks (worker thread), `stopping` as said. */
static void rounds(pr__cqlw_t *w, int stopping) {
  int n;
  pthread_mutex_lock(&w->lock);
  n = w->nround;
  pthread_mutex_unlock(&w->lock);
  for (int i = 0; i < n; i++)
    w->round[i].fn(w->round[i].arg, stopping);
}

/* Worker thread: start what was posted; on stop, close the session. */
static void on_async(uv_async_t *a) {
  pr__cqlw_t *w = a->data;
  pr__cqlw_job_t *j;
  int stopping;
  pthread_mutex_lock(&w->lock);
  j = w->in_head;
  w->in_head = w->in_tail = NULL;
  stopping = w->stopping;
  pthread_mutex_unlock(&w->lock);
  while (j) {
    pr__cqlw_job_t *next = j->qnext;
    j->start(j);
    j = next;
  }
  if (!w->cql)
    return;
  rounds(w, stopping);
  if (stopping) {
    pr__cql_free(w->cql); /* fails what is pending */
    w->cql = NULL;
    uv_close((uv_handle_t *)&w->async, NULL);
  }
}

static void *worker_main(void *arg) {
  pr__cqlw_t *w = arg;
  pthread_setname_np(pthread_self(), "prosody-cql");
  pr__log_adopt(w->logger);
  pr__cql_block_sigpipe();
  uv_run(&w->loop, UV_RUN_DEFAULT);
  return NULL;
}

pr__cqlw_t *pr__cqlw_new(const pr__cql_conf_t *conf, void (*wake)(void *),
                         void *wake_arg, char *errstr, size_t errstr_size) {
  pr__cqlw_t *w = calloc(1, sizeof(*w));
  if (!w) {
    pr__errf(errstr, errstr_size, "out of memory");
    return NULL;
  }
  w->refs = 1;
  w->wake = wake;
  w->wake_arg = wake_arg;
  pthread_mutex_init(&w->lock, NULL);
  pthread_cond_init(&w->done, NULL);
  uv_loop_init(&w->loop);
  uv_async_init(&w->loop, &w->async, on_async);
  w->async.data = w;
  if (!(w->cql = pr__cql_new(&w->loop, conf, errstr, errstr_size))) {
    pr__cqlw_free(w);
    return NULL;
  }
  return w;
}

int pr__cqlw_start(pr__cqlw_t *w, char *errstr, size_t errstr_size) {
  if (w->started)
    return 0;
  w->logger = pr__log_current();
  if (pthread_create(&w->thread, NULL, worker_main, w)) {
    pr__errf(errstr, errstr_size, "could not start the Cassandra thread");
    return -1;
  }
  w->started = 1;
  return 0;
}

pr__cqlw_t *pr__cqlw_ref(pr__cqlw_t *w) {
  w->refs++;
  return w;
}

int pr__cqlw_on_round(pr__cqlw_t *w, void (*fn)(void *arg, int stopping),
                      void *arg) {
  int rc = -1;
  pthread_mutex_lock(&w->lock);
  if (w->nround < PR_CQLW_ROUNDS && !w->stopping) {
    w->round[w->nround].fn = fn;
    w->round[w->nround].arg = arg;
    w->nround++;
    rc = 0;
  }
  pthread_mutex_unlock(&w->lock);
  return rc;
}

pr__cql_t *pr__cqlw_cql(pr__cqlw_t *w) { return w->cql; }

/* Delivers until nothing finished is left: a delivered callback may post
 * again (a chained operation), which after the stop completes at once. */
static void deliver_all(pr__cqlw_t *w) {
  for (;;) {
    int more;
    pr__cqlw_poll(w);
    pthread_mutex_lock(&w->lock);
    more = w->out_head != NULL;
    pthread_mutex_unlock(&w->lock);
    if (!more)
      break;
  }
}

void pr__cqlw_stop(pr__cqlw_t *w) {
  int was;
  pthread_mutex_lock(&w->lock);
  was = w->stopping;
  w->stopping = 1;
  pthread_mutex_unlock(&w->lock);
  if (!was) {
    if (w->started) {
      uv_async_send(&w->async);
      pthread_join(w->thread, NULL);
      w->started = 2;
    } else { /* never ran: close here */
      if (w->cql)
        rounds(w, 1);
      pr__cql_free(w->cql);
      w->cql = NULL;
      uv_close((uv_handle_t *)&w->async, NULL);
      uv_run(&w->loop, UV_RUN_DEFAULT);
    }
    uv_loop_close(&w->loop);
  }
  deliver_all(w);
}

void pr__cqlw_free(pr__cqlw_t *w) {
  if (!w)
    return;
  if (--w->refs > 0) {
    deliver_all(w);
    return;
  }
  pr__cqlw_stop(w);
  pthread_cond_destroy(&w->done);
  pthread_mutex_destroy(&w->lock);
  free(w);
}
