/*
 * pool.c - worker threads for synchronous handlers.
 *
 * Wake-up policy. Waking a sleeping thread costs a futex call and two
 * context switches, which for a short handler is far more than the
 * handler itself. So a submit wakes a sleeper only when no awake worker
 * is free to take the job ("free": awake and not running a handler, which
 * includes a worker just woken); and a worker taking a job wakes one more
 * sleeper when jobs remain queued and nobody else is free. A burst of
 * jobs therefore ramps the number of running workers up one wake-up at a
 * time: handlers that block get a thread each (after one wake-up latency
 * per job ahead of them), while short handlers are run back to back by
 * the few workers already awake, with no wake-up at all.
 *
 * A submitter that hands over jobs in bursts (the engine, in each loop
 * iteration) wakes at most one sleeper for the burst, at its first job (so
 * that job does not wait for the rest of the burst), and kicks once at
 * the end; the woken worker wakes more as above.
 *
 * (Spinning before sleeping was tried and measured: on two cores it only
 * takes CPU from the engine thread, the pipeline's serial stage.)
 *
 * Sleepers wait on their own condition variable, in a LIFO stack (the
 * most recently active thread, with the warmest cache, is woken first),
 * and are signalled after the lock is released, so a woken worker does
 * not block on the lock its waker still holds.
 */
#include <pthread.h>
#include <stdlib.h>

#include "pool.h"

#include "../util/util.h"

typedef struct job {
  struct job *next;
  pr__job_fn fn;
  void *arg;
} job_t;

typedef struct worker {
  struct pr__pool *pool;
  struct worker *next_idle; /* idle stack link (pool lock) */
  pthread_cond_t cond;
  int woken; /* set by the waker (pool lock) */
  pthread_t thread;
} worker_t;

struct pr__pool {
  pthread_mutex_t lock; /* guards every field below but the immutable */
  job_t *head, *tail;   /* queued jobs */
  job_t *spare;         /* recycled job nodes */
  int nspare;
  worker_t *idle; /* sleeping workers, LIFO */
  int free;       /* awake workers not running a handler */
  int stop;
  int n;                /* started workers */
  worker_t *workers;    /* immutable after _new */
  pr__logger_t *logger; /* its creator's: the workers log there */
};

#define MAX_SPARE 1024

/* Takes one sleeper off the idle stack and marks it woken (lock held);
 * the caller signals it once the lock is released. */
static worker_t *take_sleeper(pr__pool_t *pool) {
  worker_t *w = pool->idle;
  if (!w)
    return NULL;
  pool->idle = w->next_idle;
  w->woken = 1;
  pool->free++;
  return w;
}

static void *worker_main(void *arg) {
  worker_t *self = arg;
  pr__pool_t *pool = self->pool;
  pthread_setname_np(pthread_self(), "prosody-handler");
  pr__log_adopt(pool->logger);
  pthread_mutex_lock(&pool->lock);
  for (;;) {
    job_t *j = pool->head;
    worker_t *wake = NULL;
    pr__job_fn fn;
    void *jarg;
    if (!j) {
      if (pool->stop)
        break;
      pool->free--;
      self->woken = 0;
      self->next_idle = pool->idle;
      pool->idle = self;
      while (!self->woken)
        pthread_cond_wait(&self->cond, &pool->lock);
      continue; /* the waker counted us free again */
    }
    pool->head = j->next;
    if (!pool->head)
      pool->tail = NULL;
    pool->free--;
    if (pool->head && pool->free == 0)
      wake = take_sleeper(pool);
    fn = j->fn;
    jarg = j->arg;
    if (pool->nspare < MAX_SPARE) {
      j->next = pool->spare;
      pool->spare = j;
      pool->nspare++;
      j = NULL;
    }
    pthread_mutex_unlock(&pool->lock);
    if (wake)
      pthread_cond_signal(&wake->cond);
    free(j);
    fn(jarg);
    pthread_mutex_lock(&pool->lock);
    pool->free++;
  }
  pool->free--;
  pthread_mutex_unlock(&pool->lock);
  return NULL;
}

pr__pool_t *pr__pool_new(int threads) {
  pr__pool_t *pool = calloc(1, sizeof(*pool));
  if (!pool)
    return NULL;
  pool->workers = calloc((size_t)threads, sizeof(worker_t));
  if (!pool->workers) {
    free(pool);
    return NULL;
  }
  pthread_mutex_init(&pool->lock, NULL);
  pool->logger = pr__log_current();
  for (pool->n = 0; pool->n < threads; pool->n++) {
    worker_t *w = &pool->workers[pool->n];
    w->pool = pool;
    pthread_cond_init(&w->cond, NULL);
    pthread_mutex_lock(&pool->lock);
    pool->free++; /* awake until it finds the queue empty */
    pthread_mutex_unlock(&pool->lock);
    if (pthread_create(&w->thread, NULL, worker_main, w)) {
      pthread_mutex_lock(&pool->lock);
      pool->free--;
      pthread_mutex_unlock(&pool->lock);
      pthread_cond_destroy(&w->cond);
      pr__pool_destroy(pool);
      return NULL;
    }
  }
  return pool;
}

static int submit(pr__pool_t *pool, pr__job_fn fn, void *arg, int *may_wake) {
  worker_t *wake = NULL;
  job_t *j;
  pthread_mutex_lock(&pool->lock);
  j = pool->spare;
  if (j) {
    pool->spare = j->next;
    pool->nspare--;
  } else {
    pthread_mutex_unlock(&pool->lock);
    if (!(j = malloc(sizeof(*j))))
      return -1;
    pthread_mutex_lock(&pool->lock);
  }
  j->next = NULL;
  j->fn = fn;
  j->arg = arg;
  if (pool->tail)
    pool->tail->next = j;
  else
    pool->head = j;
  pool->tail = j;
  if (*may_wake && pool->free == 0 && (wake = take_sleeper(pool)))
    *may_wake = 0;
  pthread_mutex_unlock(&pool->lock);
  if (wake)
    pthread_cond_signal(&wake->cond);
  return 0;
}

int pr__pool_submit(pr__pool_t *pool, pr__job_fn fn, void *arg) {
  int may_wake = 1;
  return submit(pool, fn, arg, &may_wake);
}

int pr__pool_submit_burst(pr__pool_t *pool, pr__job_fn fn, void *arg,
                          int *may_wake) {
  return submit(pool, fn, arg, may_wake);
}

void pr__pool_kick(pr__pool_t *pool) {
  worker_t *wake = NULL;
  pthread_mutex_lock(&pool->lock);
  if (pool->head && pool->free == 0)
    wake = take_sleeper(pool);
  pthread_mutex_unlock(&pool->lock);
  if (wake)
    pthread_cond_signal(&wake->cond);
}

void pr__pool_destroy(pr__pool_t *pool) {
  if (!pool)
    return;
  pthread_mutex_lock(&pool->lock);
  pool->stop = 1;
  while (pool->idle)
    pthread_cond_signal(&take_sleeper(pool)->cond);
  pthread_mutex_unlock(&pool->lock);
  for (int i = 0; i < pool->n; i++) {
    pthread_join(pool->workers[i].thread, NULL);
    pthread_cond_destroy(&pool->workers[i].cond);
  }
  while (pool->spare) {
    job_t *j = pool->spare;
    pool->spare = j->next;
    free(j);
  }
  pthread_mutex_destroy(&pool->lock);
  free(pool->workers);
  free(pool);
}
