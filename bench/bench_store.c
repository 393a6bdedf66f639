/*
 * bench_store.c - prepared INSERT and SELECT throughput of our CQL client
 * against a Cassandra node (the Python cassandra-driver runs the same
 * statements at the same concurrency in bench_store.py; run.sh reports the
 * ratio). Keeps `concurrency` requests in flight on one session.
 *
 *   bench_store NODE KEYSPACE OPS CONCURRENCY
 * Prints "insert_ops_s N" and "select_ops_s N".
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cql/cql.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

typedef struct run {
  pr__cql_t *s;
  pr__cql_stmt_t *st;
  int select;
  long issued, done, ops;
  int failed;
  int finished; /* done == ops */
} run_t;

static void issue(run_t *r);

static void on_done(void *arg, prosody_err_t err, const char *errstr,
                    const pr__cql_result_t *res) {
  run_t *r = arg;
  (void)res;
  if (err && !r->failed++)
    fprintf(stderr, "bench_store: %s\n", errstr);
  r->done++;
  if (r->issued < r->ops)
    issue(r);
  else if (r->done == r->ops)
    r->finished = 1;
}

static void issue(run_t *r) {
  char key[32];
  pr__cql_val_t v[2];
  long i = r->issued++;
  snprintf(key, sizeof(key), "key-%ld", i % 10000);
  v[0] = pr__cv_text(key);
  v[1] = pr__cv_bigint(i);
  pr__cql_execute_stmt(r->s, r->st, v, r->select ? 1 : 2, NULL, on_done, r);
}

static double measure(pr__cql_sync_t *y, const char *q, int select, long ops,
                      int conc) {
  run_t r = {pr__cql_sync_session(y), NULL, select, 0, 0, ops, 0, 0};
  double t0;
  r.st = pr__cql_stmt(r.s, q);
  t0 = now_s();
  for (int i = 0; i < conc && r.issued < ops; i++)
    issue(&r);
  pr__cql_sync_wait(y, &r.finished);
  if (r.failed) {
    fprintf(stderr, "bench_store: %d failures\n", r.failed);
    exit(1);
  }
  return (double)ops / (now_s() - t0);
}

int main(int argc, char **argv) {
  char err[1024], q[256], *nodes[1];
  pr__cql_conf_t conf;
  pr__cql_sync_t *y;
  long ops = argc > 3 ? atol(argv[3]) : 20000;
  int conc = argc > 4 ? atoi(argv[4]) : 64;
  const char *ks = argc > 2 ? argv[2] : "prosody_bench";
  nodes[0] = argc > 1 ? argv[1] : "127.0.0.1:9042";
  memset(&conf, 0, sizeof(conf));
  conf.nodes = nodes;
  conf.nnodes = 1;
  if (!(y = pr__cql_sync_new(&conf, err, sizeof(err)))) {
    fprintf(stderr, "bench_store: %s\n", err);
    return 1;
  }
  snprintf(q, sizeof(q),
           "CREATE KEYSPACE IF NOT EXISTS %s WITH replication = {'class': "
           "'SimpleStrategy', 'replication_factor': 1}",
           ks);
  if (pr__cql_sync_run(y, q, NULL, 0, NULL, 0, NULL, err, sizeof(err)))
    goto fail;
  snprintf(q, sizeof(q),
           "CREATE TABLE IF NOT EXISTS %s.kv (k text PRIMARY KEY, v bigint)",
           ks);
  if (pr__cql_sync_run(y, q, NULL, 0, NULL, 0, NULL, err, sizeof(err)))
    goto fail;
  snprintf(q, sizeof(q), "INSERT INTO %s.kv (k, v) VALUES (?, ?)", ks);
  measure(y, q, 0, ops / 10 + 1, conc); /* warm-up: prepare, JIT */
  printf("insert_ops_s %.0f\n", measure(y, q, 0, ops, conc));
  snprintf(q, sizeof(q), "SELECT v FROM %s.kv WHERE k = ?", ks);
  measure(y, q, 1, ops / 10 + 1, conc);
  printf("select_ops_s %.0f\n", measure(y, q, 1, ops, conc));
  pr__cql_sync_free(y);
  return 0;
fail:
  fprintf(stderr, "bench_store: %s\n", err);
  pr__cql_sync_free(y);
  return 1;
}
