/*
 * tsan_shim.c - C11 threads on top of pthreads, linked into libprosody only
 * in ThreadSanitizer builds (PROSODY_SANITIZE=thread).
 *
 * Debian's librdkafka uses glibc's C11 <threads.h>. glibc implements those
 * functions by calling its pthread internals directly, past TSan's
 * interceptors, so TSan never learns about librdkafka's threads (it crashes
 * on their first allocation) nor about its locks (it would report races
 * between our code and librdkafka's threads that the locks prevent). These
 * definitions interpose glibc's for librdkafka and route every call through
 * the intercepted pthread functions. glibc's mtx_t/cnd_t are layout-
 * compatible with pthread_mutex_t/pthread_cond_t, which is how glibc itself
 * implements them.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <threads.h>

#define SHIM __attribute__((visibility("default")))

static int thrd_result(int rc) {
  return rc == 0           ? thrd_success
         : rc == ENOMEM    ? thrd_nomem
         : rc == ETIMEDOUT ? thrd_timedout
         : rc == EBUSY     ? thrd_busy
                           : thrd_error;
}

typedef struct tramp {
  thrd_start_t fn;
  void *arg;
} tramp_t;

static void *tramp_main(void *p) {
  tramp_t t = *(tramp_t *)p;
  free(p);
  return (void *)(intptr_t)t.fn(t.arg);
}

SHIM int thrd_create(thrd_t *thr, thrd_start_t fn, void *arg) {
  tramp_t *t = malloc(sizeof(*t));
  int rc;
  if (!t)
    return thrd_nomem;
  t->fn = fn;
  t->arg = arg;
  rc = pthread_create((pthread_t *)thr, NULL, tramp_main, t);
  if (rc)
    free(t);
  return thrd_result(rc);
}

SHIM int thrd_join(thrd_t thr, int *res) {
  void *ret;
  int rc = pthread_join((pthread_t)thr, &ret);
  if (!rc && res)
    *res = (int)(intptr_t)ret;
  return thrd_result(rc);
}

SHIM int thrd_detach(thrd_t thr) {
  return thrd_result(pthread_detach((pthread_t)thr));
}

SHIM int mtx_init(mtx_t *m, int type) {
  pthread_mutexattr_t attr;
  int rc;
  pthread_mutexattr_init(&attr);
  if (type & mtx_recursive)
    pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_RECURSIVE);
  rc = pthread_mutex_init((pthread_mutex_t *)m, &attr);
  pthread_mutexattr_destroy(&attr);
  return thrd_result(rc);
}

SHIM int mtx_lock(mtx_t *m) {
  return thrd_result(pthread_mutex_lock((pthread_mutex_t *)m));
}

SHIM int mtx_trylock(mtx_t *m) {
  return thrd_result(pthread_mutex_trylock((pthread_mutex_t *)m));
}

SHIM int mtx_timedlock(mtx_t *restrict m, const struct timespec *restrict ts) {
  return thrd_result(pthread_mutex_timedlock((pthread_mutex_t *)m, ts));
}

SHIM int mtx_unlock(mtx_t *m) {
  return thrd_result(pthread_mutex_unlock((pthread_mutex_t *)m));
}

SHIM void mtx_destroy(mtx_t *m) { pthread_mutex_destroy((pthread_mutex_t *)m); }

SHIM int cnd_init(cnd_t *c) {
  return thrd_result(pthread_cond_init((pthread_cond_t *)c, NULL));
}

SHIM int cnd_signal(cnd_t *c) {
  return thrd_result(pthread_cond_signal((pthread_cond_t *)c));
}

SHIM int cnd_broadcast(cnd_t *c) {
  return thrd_result(pthread_cond_broadcast((pthread_cond_t *)c));
}

SHIM int cnd_wait(cnd_t *c, mtx_t *m) {
  return thrd_result(
      pthread_cond_wait((pthread_cond_t *)c, (pthread_mutex_t *)m));
}

SHIM int cnd_timedwait(cnd_t *restrict c, mtx_t *restrict m,
                       const struct timespec *restrict ts) {
  return thrd_result(
      pthread_cond_timedwait((pthread_cond_t *)c, (pthread_mutex_t *)m, ts));
}

SHIM void cnd_destroy(cnd_t *c) { pthread_cond_destroy((pthread_cond_t *)c); }
