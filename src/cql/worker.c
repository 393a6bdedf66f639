/*
 * worker.c - a CQL session on its own thread (see worker.h).
 *
 * Ownership: `lock` guards both queues and `stopping`; the session, its
 * loop and everything they own belong to the worker thread once started.
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
  int started;
  pthread_mutex_t lock;
  pr__cqlw_job_t *in_head, *in_tail;   /* posted, to start */
  pr__cqlw_job_t *out_head, *out_tail; /* finished, to deliver */
  int stopping;
  void (*wake)(void *);
  void *wake_arg;
  void (*round)(void *arg, int stopping); /* pr__cqlw_on_round */
  void *round_arg;
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
  pthread_mutex_unlock(&w->lock);
  w->wake(w->wake_arg);
}

void pr__cqlw_post(pr__cqlw_job_t *j) {
  pr__cqlw_t *w = j->w;
  int stopping;
  pthread_mutex_lock(&w->lock);
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
  pthread_mutex_unlock(&w->lock);
  while (j) {
    pr__cqlw_job_t *next = j->qnext;
    j->deliver(j);
    j = next;
  }
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
  if (w->round && w->cql)
    w->round(w->round_arg, stopping);
  if (stopping && w->cql) {
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
  w->wake = wake;
  w->wake_arg = wake_arg;
  pthread_mutex_init(&w->lock, NULL);
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
  w->logger = pr__log_current();
  if (pthread_create(&w->thread, NULL, worker_main, w)) {
    pr__errf(errstr, errstr_size, "could not start the Cassandra thread");
    return -1;
  }
  w->started = 1;
  return 0;
}

void pr__cqlw_on_round(pr__cqlw_t *w, void (*fn)(void *arg, int stopping),
                       void *arg) {
  w->round = fn;
  w->round_arg = arg;
}

pr__cql_t *pr__cqlw_cql(pr__cqlw_t *w) { return w->cql; }

void pr__cqlw_free(pr__cqlw_t *w) {
  if (!w)
    return;
  pthread_mutex_lock(&w->lock);
  w->stopping = 1;
  pthread_mutex_unlock(&w->lock);
  if (w->started) {
    uv_async_send(&w->async);
    pthread_join(w->thread, NULL);
  } else { /* never ran: close here */
    if (w->round && w->cql)
      w->round(w->round_arg, 1);
    pr__cql_free(w->cql);
    w->cql = NULL;
    uv_close((uv_handle_t *)&w->async, NULL);
    uv_run(&w->loop, UV_RUN_DEFAULT);
  }
  uv_loop_close(&w->loop);
  /* A delivered callback may post again (a chained operation): with
   * `stopping` set that completes at once, so poll until nothing is left. */
  for (;;) {
    int more;
    pr__cqlw_poll(w);
    pthread_mutex_lock(&w->lock);
    more = w->out_head != NULL;
    pthread_mutex_unlock(&w->lock);
    if (!more)
      break;
  }
  pthread_mutex_destroy(&w->lock);
  free(w);
}
