/*
 * bench_timer_store.c - Cassandra's CPU per timer written and deleted by
 * the Cassandra timer store alone (src/stores/cqltimers.c), without a
 * consumer: what bench_timers cannot separate from the engine, the group
 * join and the machine's other work.
 *
 *   bench_timer_store NODE KEYSPACE CASSANDRA_PID [TIMERS [KEYS]]
 *
 * Puts TIMERS timers (default 100 000) over KEYS keys (default 10 000,
 * one timer per key and second) on 4 segments, all posted at once as
 * prosody_timer_async callers do; then deletes them second by second at
 * 20 000/s, as fired timers are. CPU is read from /proc/CASSANDRA_PID/stat
 * (the node on this host) over each phase and the 3 s after it (flushes),
 * so it includes Cassandra's background work and anyone else's requests:
 * compare builds in alternating runs. Prints "put_ops_s", "put_cass_us"
 * (Cassandra CPU per timer), "del_cass_us".
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cql/cql.h"
#include "cql/worker.h"
#include "timers/timers.h"
#include "util/util.h"

#define SEGS 4
#define DEL_RATE 20000 /* deletes/s: twice the due rate of bench_timers */

static int answered, failed;

static void wake(void *arg) { (void)arg; } /* polled below */

static void on_done(void *arg, prosody_err_t err, const char *errstr) {
  (void)arg;
  answered++;
  if (err && !failed++)
    fprintf(stderr, "bench_timer_store: %s\n", errstr ? errstr : "error");
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* utime + stime of `pid` in seconds (fields 14 and 15 of its stat). */
static double cpu_s(int pid) {
  char path[64], buf[4096], *p;
  long ticks = 0;
  FILE *f;
  snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  if (!(f = fopen(path, "r")))
    return 0;
  p = fgets(buf, sizeof(buf), f) ? strrchr(buf, ')') : NULL;
  fclose(f);
  for (int field = 2; p && field < 15; field++) {
    p = strchr(p + 1, ' ');
    if (p && field >= 13)
      ticks += atol(p + 1);
  }
  return (double)ticks / (double)sysconf(_SC_CLK_TCK);
}

static void await_answers(pr__tstore_t *s, int want) {
  while (answered < want) {
    s->ops->poll(s);
    usleep(200);
  }
}

int main(int argc, char **argv) {
  char err[512], key[32], group[64], *nodes[1];
  const char *keyspace;
  int pid, timers, keys, per_key, want = 0;
  pr__cql_conf_t conf;
  pr__cql_sync_t *y;
  pr__tstore_t *s;
  pr__cqlw_t *w;
  pr__tseg_t segs[SEGS];
  int64_t base_s;
  double t0, t1, c0;
  if (argc < 4) {
    fprintf(stderr, "usage: bench_timer_store NODE KEYSPACE CASSANDRA_PID "
                    "[TIMERS [KEYS]]\n");
    return 2;
  }
  nodes[0] = argv[1];
  keyspace = argv[2];
  pid = atoi(argv[3]);
  timers = argc > 4 ? atoi(argv[4]) : 100000;
  keys = argc > 5 ? atoi(argv[5]) : 10000;
  per_key = keys > 0 ? timers / keys : 0;
  if (per_key < 1) {
    fprintf(stderr, "bench_timer_store: fewer timers than keys\n");
    return 2;
  }
  memset(&conf, 0, sizeof(conf));
  conf.nodes = nodes;
  conf.nnodes = 1;
  if (!(y = pr__cql_sync_new(&conf, err, sizeof(err))) ||
      pr__cql_migrate(y, keyspace, 60000, NULL, err, sizeof(err))) {
    fprintf(stderr, "bench_timer_store: %s\n", err);
    return 1;
  }
  pr__cql_sync_free(y);
  snprintf(group, sizeof(group), "bench-tstore-%d", (int)getpid());
  /* A session of its own, which the store then holds alone. */
  if (!(w = pr__cqlw_new(&conf, wake, NULL, err, sizeof(err))) ||
      pr__cqlw_start(w, err, sizeof(err)) ||
      !(s = pr__cqlstore_new(w, keyspace, group, 3600, 3600, err,
                             sizeof(err)))) {
    fprintf(stderr, "bench_timer_store: %s\n", err);
    return 1;
  }
  pr__cqlw_free(w);
  for (int i = 0; i < SEGS; i++)
    segs[i] = (pr__tseg_t){"bench", i};
  base_s = pr__wall_ms() / 1000 + 600;

  t0 = now_s();
  c0 = cpu_s(pid);
  for (int k = 0; k < keys; k++) {
    snprintf(key, sizeof(key), "key-%05d", k);
    for (int i = 0; i < per_key; i++, want++)
      s->ops->put(s, &segs[k % SEGS], key, base_s + i, PR_TIMER_APPLICATION,
                  NULL, on_done, NULL);
  }
  await_answers(s, want);
  t1 = now_s();
  sleep(3);
  printf("bench timer_store_put_ops_s %.0f\n", want / (t1 - t0));
  printf("bench timer_store_put_cass_us %.1f\n",
         (cpu_s(pid) - c0) * 1e6 / want);

  answered = want = 0;
  t0 = now_s();
  c0 = cpu_s(pid);
  for (int i = 0; i < per_key; i++)
    for (int k = 0; k < keys; k++, want++) {
      snprintf(key, sizeof(key), "key-%05d", k);
      s->ops->del(s, &segs[k % SEGS], key, base_s + i, PR_TIMER_APPLICATION,
                  on_done, NULL);
      if (want % 1000 == 999) /* paced: 1 000 at a time */
        while (now_s() < t0 + (want + 1) / (double)DEL_RATE) {
          s->ops->poll(s);
          usleep(500);
        }
    }
  await_answers(s, want);
  sleep(3);
  printf("bench timer_store_del_cass_us %.1f\n",
         (cpu_s(pid) - c0) * 1e6 / want);
  s->ops->destroy(s);
  if (failed) {
    fprintf(stderr, "bench_timer_store: %d operations failed\n", failed);
    return 1;
  }
  return 0;
}
