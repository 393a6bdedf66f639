/*
 * bench_timers.c - timer throughput and lateness: KEYS keys each receive
 * one message whose handler schedules TIMERS/KEYS timers due within the
 * next WINDOW seconds (at distinct seconds: a key holds one timer per
 * second, so TIMERS/KEYS must not exceed WINDOW); reports timers scheduled per
 * second (handler side), fired per second (from the first to the last firing),
 * lateness p50/p99 (firing time minus the timer's second), and the process's
 * peak RSS growth per 100 000 pending timers. Memory store (mock mode) unless
 * BENCH_CASSANDRA=host:port is set (then the Cassandra store, the mock
 * cluster for Kafka via its address; keyspace prosody_bench, or
 * BENCH_KEYSPACE). BENCH_FAR=1 makes the timers due an hour later and
 * ends the run once all are scheduled (only scheduling is measured). Also
 * prints the process's CPU (user + sys, all threads) per timer from the
 * first handler call to the last acknowledgement ("cpu_sched"), and to the
 * last firing ("cpu_total", not with BENCH_FAR); the samples are taken by
 * the main thread every 20 ms. Each handler schedules its timers
 * one blocking prosody_schedule() call at a time, so at most
 * max_concurrency (32, or BENCH_MAX_CONCURRENCY) are in flight; with
 * BENCH_TIMER_ASYNC=1 it issues them all with prosody_timer_async() and then
 * waits for them.
 *
 *   bench_timers [timers] [keys] [window_s]
 * Prints "bench timers_scheduled N timers/s", "bench timers_fired ...",
 * "bench timers_lateness_p99 N ms", "bench timers_rss_per_100k N MiB".
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "prosody.h"

static long per_key;
static int64_t base_ms; /* timers are due at base_ms + 1..window s */
static long window_s;
static atomic_long scheduled, fired, schedule_errors;
static _Atomic double sched_first, sched_last, fire_first, fire_last;
static double *late_ms; /* by firing order */
static long total;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int64_t wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The process's CPU time so far (all threads), in seconds. */
static double cpu_s(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec / 1e6 +
         (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec / 1e6;
}

static long peak_rss_kb(void) {
  char line[256];
  long kb = -1;
  FILE *f = fopen("/proc/self/status", "r");
  while (f && fgets(line, sizeof(line), f))
    if (!strncmp(line, "VmHWM:", 6))
      kb = atol(line + 6);
  if (f)
    fclose(f);
  return kb;
}

/* BENCH_TIMER_ASYNC: a handler's timers are scheduled together
 * (prosody_timer_async), then it waits for all of them. */
static int async_mode;
typedef struct waiter {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  long left;
} waiter_t;

static void on_scheduled(prosody_err_t err, const char *errstr,
                         const int64_t *times, size_t n, void *opaque) {
  waiter_t *w = opaque;
  (void)errstr;
  (void)times;
  (void)n;
  if (err)
    atomic_fetch_add(&schedule_errors, 1);
  else
    atomic_fetch_add(&scheduled, 1);
  pthread_mutex_lock(&w->lock);
  if (--w->left == 0)
    pthread_cond_signal(&w->cond);
  pthread_mutex_unlock(&w->lock);
}

static prosody_result_t on_message(prosody_context_t *ctx,
                                   const prosody_message_t *m, void *op) {
  char err[256];
  double t = now_s();
  waiter_t w = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
  (void)m;
  (void)op;
  if (atomic_load(&sched_first) == 0)
    atomic_store(&sched_first, t);
  /* Distinct seconds per key, spread over the window. */
  for (long i = 0; i < per_key; i++) {
    int64_t at = base_ms + 1000 * (1 + (i * window_s) / per_key) +
                 (i % 1000); /* sub-second parts round */
    if (async_mode) {
      pthread_mutex_lock(&w.lock);
      w.left++;
      pthread_mutex_unlock(&w.lock);
      if (prosody_timer_async(ctx, PROSODY_TIMER_SCHEDULE, at, on_scheduled, &w,
                              err, sizeof(err))) {
        atomic_fetch_add(&schedule_errors, 1);
        pthread_mutex_lock(&w.lock);
        w.left--;
        pthread_mutex_unlock(&w.lock);
      }
    } else if (prosody_schedule(ctx, at, err, sizeof(err))) {
      atomic_fetch_add(&schedule_errors, 1);
    } else {
      atomic_fetch_add(&scheduled, 1);
    }
  }
  pthread_mutex_lock(&w.lock);
  while (w.left > 0)
    pthread_cond_wait(&w.cond, &w.lock);
  pthread_mutex_unlock(&w.lock);
  atomic_store(&sched_last, now_s());
  return PROSODY_SUCCESS;
}

static prosody_result_t on_timer(prosody_context_t *ctx,
                                 const prosody_timer_t *t, void *op) {
  long n = atomic_fetch_add(&fired, 1);
  double s = now_s();
  (void)ctx;
  (void)op;
  if (n == 0)
    atomic_store(&fire_first, s);
  atomic_store(&fire_last, s);
  if (n < total)
    late_ms[n] = (double)(wall_ms() - prosody_timer_time(t));
  return PROSODY_SUCCESS;
}

static atomic_long acked;
static void on_sent(prosody_err_t err, const char *errstr,
                    const prosody_delivery_t *d, void *op) {
  (void)d;
  (void)op;
  if (err) {
    fprintf(stderr, "bench_timers: %s\n", errstr);
    exit(1);
  }
  atomic_fetch_add(&acked, 1);
}

int main(int argc, char **argv) {
  long timers = argc > 1 ? atol(argv[1]) : 100000;
  /* A key holds one timer per second: 100 000 timers due within 10 s need
   * at least 10 000 keys (10 each). */
  long keys = argc > 2 ? atol(argv[2]) : 10000;
  const char *cass = getenv("BENCH_CASSANDRA");
  char err[1024], topic[64], key[32], boot[256];
  prosody_config_t *conf;
  prosody_client_t *prod, *cons;
  prosody_handler_t h = {on_message, on_timer, NULL, 0};
  long rss0, rss1;
  double deadline, span;
  double cpu0 = -1, cpu_sched = -1, cpu_end;
  int far = getenv("BENCH_FAR") && *getenv("BENCH_FAR") &&
            strcmp(getenv("BENCH_FAR"), "0");
  window_s = argc > 3 ? atol(argv[3]) : 10;
  async_mode = getenv("BENCH_TIMER_ASYNC") && *getenv("BENCH_TIMER_ASYNC") &&
               strcmp(getenv("BENCH_TIMER_ASYNC"), "0");
  per_key = timers / keys;
  total = per_key * keys;
  if (per_key < 1 || per_key > window_s) {
    fprintf(stderr,
            "bench_timers: %ld timers per key cannot be due at distinct "
            "seconds within %ld s\n",
            per_key, window_s);
    return 2;
  }
  late_ms = calloc((size_t)total, sizeof(double));
  snprintf(topic, sizeof(topic), "bench-timers-%d", (int)getpid());

  /* The records, one per key. */
  conf = prosody_config_new();
  bench_set(conf, "mock", "true");
  bench_set(conf, "source_system", "bench");
  prod = prosody_client_new(conf, err, sizeof(err));
  if (!prod) {
    fprintf(stderr, "bench_timers: %s\n", err);
    return 1;
  }
  for (long k = 0; k < keys; k++) { /* batched: acknowledged below */
    snprintf(key, sizeof(key), "key-%05ld", k);
    if (prosody_send_async(prod, topic, key, "{\"type\":\"tick\"}", NULL,
                           on_sent, NULL, err, sizeof(err))) {
      fprintf(stderr, "bench_timers: %s\n", err);
      return 1;
    }
  }
  while (atomic_load(&acked) < keys)
    usleep(1000);
  if (prosody_mock_bootstrap_servers(boot, sizeof(boot), err, sizeof(err))) {
    fprintf(stderr, "bench_timers: %s\n", err);
    return 1;
  }

  conf = prosody_config_new();
  if (cass) { /* the Cassandra store: join the mock cluster by address */
    bench_set(conf, "bootstrap_servers", boot);
    bench_set(conf, "cassandra_nodes", cass);
    bench_set(conf, "cassandra_keyspace",
              getenv("BENCH_KEYSPACE") ? getenv("BENCH_KEYSPACE")
                                       : "prosody_bench");
  } else {
    bench_set(conf, "mock", "true");
  }
  bench_set(conf, "group_id", topic);
  bench_set(conf, "subscribed_topics", topic);
  if (!getenv("PROSODY_LOG"))
    bench_set(conf, "log", "warn");
  bench_set(conf, "probe_port", "none");
  if (getenv("BENCH_MAX_CONCURRENCY")) /* handler threads: calls in flight */
    bench_set(conf, "max_concurrency", getenv("BENCH_MAX_CONCURRENCY"));
  if (getenv("BENCH_MAX_UNCOMMITTED"))
    bench_set(conf, "max_uncommitted", getenv("BENCH_MAX_UNCOMMITTED"));
  cons = prosody_client_new(conf, err, sizeof(err));
  rss0 = peak_rss_kb();
  /* Due 1..window s after the consumer has joined (3 s on the mock). */
  base_ms = wall_ms() + 4000 + (far ? 3600000 : 0);
  if (!cons || prosody_subscribe(cons, &h, err, sizeof(err))) {
    fprintf(stderr, "bench_timers: %s\n", err);
    return 1;
  }
  deadline = now_s() + 60 + (double)window_s;
  while (atomic_load(&fired) + atomic_load(&schedule_errors) < total &&
         now_s() < deadline) {
    usleep(20000);
    if (cpu0 < 0 && atomic_load(&sched_first) != 0)
      cpu0 = cpu_s();
    if (cpu_sched < 0 &&
        atomic_load(&scheduled) + atomic_load(&schedule_errors) >= total) {
      cpu_sched = cpu_s();
      if (far)
        break;
    }
    if (getenv("BENCH_PROGRESS")) {
      static double last;
      if (now_s() - last >= 1) {
        last = now_s();
        fprintf(stderr, "  scheduled %ld fired %ld\n", atomic_load(&scheduled),
                atomic_load(&fired));
      }
    }
  }
  cpu_end = cpu_s();
  rss1 = peak_rss_kb();
  prosody_unsubscribe(cons);
  prosody_client_destroy(cons);
  prosody_client_destroy(prod);

  if ((!far && atomic_load(&fired) != total) || atomic_load(&schedule_errors)) {
    fprintf(stderr, "bench_timers: %ld of %ld fired, %ld schedule errors\n",
            atomic_load(&fired), total, atomic_load(&schedule_errors));
    return 1;
  }
  qsort(late_ms, (size_t)total, sizeof(double), bench_cmp_double);
  span = atomic_load(&sched_last) - atomic_load(&sched_first);
  printf("bench timers_scheduled %.0f timers/s store=%s calls=%s\n",
         span > 0 ? (double)total / span : 0, cass ? "cassandra" : "memory",
         async_mode ? "async" : "blocking");
  printf("bench timers_cpu_sched %.1f us/timer\n",
         (cpu_sched - cpu0) * 1e6 / (double)total);
  if (far) {
    free(late_ms);
    return 0;
  }
  printf("bench timers_cpu_total %.1f us/timer\n",
         (cpu_end - cpu0) * 1e6 / (double)total);
  span = atomic_load(&fire_last) - atomic_load(&fire_first);
  printf("bench timers_fired %.0f timers/s over_window_s=%ld\n",
         span > 0 ? (double)total / span : 0, window_s);
  printf("bench timers_lateness_p50 %.0f ms\n",
         late_ms[(size_t)(0.50 * (double)(total - 1))]);
  printf("bench timers_lateness_p99 %.0f ms\n",
         late_ms[(size_t)(0.99 * (double)(total - 1))]);
  printf("bench timers_rss_per_100k %.1f MiB pending_peak=%ld\n",
         (double)(rss1 - rss0) / 1024.0 * 100000.0 / (double)total, total);
  free(late_ms);
  return 0;
}
