/*
 * pool.c - worker threads for synchronous handlers. One mutex guards the
 * job queue and the stop flag; workers sleep on a condition variable.
 */
#include <pthread.h>
#include <stdlib.h>

#include "pool.h"

typedef struct job {
  struct job *next;
  pr__job_fn fn;
  void *arg;
} job_t;

struct pr__pool {
  pthread_mutex_t lock; /* guards head, tail, stop */
  pthread_cond_t cond;
  job_t *head, *tail;
  int stop;
  int n;
  pthread_t *threads; /* immutable after _new */
};

static void *worker(void *arg) {
  pr__pool_t *pool = arg;
  for (;;) {
    job_t *j;
    pthread_mutex_lock(&pool->lock);
    while (!pool->head && !pool->stop)
      pthread_cond_wait(&pool->cond, &pool->lock);
    j = pool->head;
    if (!j) { /* stop, and nothing left */
      pthread_mutex_unlock(&pool->lock);
      return NULL;
    }
    pool->head = j->next;
    if (!pool->head)
      pool->tail = NULL;
    pthread_mutex_unlock(&pool->lock);
    j->fn(j->arg);
    free(j);
  }
}

pr__pool_t *pr__pool_new(int threads) {
  pr__pool_t *pool = calloc(1, sizeof(*pool));
  if (!pool)
    return NULL;
  pool->threads = calloc((size_t)threads, sizeof(pthread_t));
  if (!pool->threads) {
    free(pool);
    return NULL;
  }
  pthread_mutex_init(&pool->lock, NULL);
  pthread_cond_init(&pool->cond, NULL);
  for (pool->n = 0; pool->n < threads; pool->n++) {
    if (pthread_create(&pool->threads[pool->n], NULL, worker, pool)) {
      pr__pool_destroy(pool);
      return NULL;
    }
  }
  return pool;
}

int pr__pool_submit(pr__pool_t *pool, pr__job_fn fn, void *arg) {
  job_t *j = malloc(sizeof(*j));
  if (!j)
    return -1;
  j->next = NULL;
  j->fn = fn;
  j->arg = arg;
  pthread_mutex_lock(&pool->lock);
  if (pool->tail)
    pool->tail->next = j;
  else
    pool->head = j;
  pool->tail = j;
  pthread_cond_signal(&pool->cond);
  pthread_mutex_unlock(&pool->lock);
  return 0;
}

void pr__pool_destroy(pr__pool_t *pool) {
  if (!pool)
    return;
  pthread_mutex_lock(&pool->lock);
  pool->stop = 1;
  pthread_cond_broadcast(&pool->cond);
  pthread_mutex_unlock(&pool->lock);
  for (int i = 0; i < pool->n; i++)
    pthread_join(pool->threads[i], NULL);
  pthread_mutex_destroy(&pool->lock);
  pthread_cond_destroy(&pool->cond);
  free(pool->threads);
  free(pool);
}
