/*
 * bench_rebalance.c - what a member joining a busy group costs, eager
 * (partition_assignment_strategy=range) against cooperative
 * (cooperative-sticky, the default).
 *
 *   bench_rebalance [RATE [BASELINE_S [HANDLER_MS]]]
 *                   (defaults 200 records/s, 8 s, 1000 ms)
 *
 * Against the real broker BENCH_BOOTSTRAP, else the embedded mock cluster.
 * BENCH_STRATEGY=cooperative-sticky or range runs one strategy only (no
 * ratios then); BENCH_VERBOSE=1 narrates on stderr.
 *
 * Per strategy, on a fresh 6-partition topic (so that three members each
 * keep some) and group, all in this process: member A joins alone; a
 * producer thread then sends a steady stream of RATE records/s (bench.h's
 * payload with `id` and intended send time; 1 000 keys in turn) for the
 * whole run. Every handler waits HANDLER_MS (prosody_wait_cancel) and succeeds,
 * or returns TRANSIENT when cancelled. After a warm-up and BASELINE_S of
 * baseline, member B joins; once the group has settled (every member holds
 * partitions and together they hold all six, polled with
 * prosody_assigned_partition_count: the cooperative protocol takes two
 * rounds) and its records have caught up, member C joins the same way.
 *
 * Per join (join2, join3), counted from the join to the next one:
 *   redelivered  records whose handler started a second time;
 *   cancelled    handlers whose prosody_wait_cancel returned 1 (a revoked
 *                partition's handlers are cancelled at 80% of
 *                shutdown_timeout, 2 s here);
 *   p99 pause    on the partitions that did not move (the same member
 *                started their records before the join and after it), the
 *                p99 of handler start minus intended send time of the
 *                records intended from 1 s before the join to TAIL_S after
 *                it settled, minus the p99 of the same partitions over the
 *                baseline (before any join).
 *
 * Options: mode pipeline, defer_enabled false (a failure retries in place),
 * shutdown_timeout 2s, max_concurrency 256 and max_uncommitted 1024 (so
 * neither throttles 1-second handlers, even catching up after a pause),
 * and deduplication off (idempotence_cache_size 0: the three members
 * share this process's dedup store, which would hide redeliveries that
 * members in processes of their own, without a shared store, would see).
 * 1 000 keys rather than fewer: a key runs one record at a time, so keys
 * must outnumber RATE records/s of 1-second handlers.
 *
 * Lines (suffix _kafka against the real broker): rebalance_redelivered_*
 * and rebalance_cancelled_* (records; the sum of both joins), and
 * rebalance_p99_pause_* (ms; the larger of the two joins), one per
 * strategy. The cooperative line's ratio is cooperative / eager (absent
 * when eager's figure is 0); the eager line is the reference (ratio 1).
 */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "prosody.h"

#define NPART 6
#define NMEMBERS 3
#define MAXREC (1L << 17) /* records per strategy; at 200/s, 655 s */
#define WARMUP_S 3.0      /* after A's join, before the baseline */
#define BEFORE_S 1.0      /* a join's window opens this long before it */
#define TAIL_S 3.0        /* and closes this long after it settled */
#define NPHASE 4          /* 0 baseline, 1 join2, 2 join3, 3 shutdown */

/* One strategy's run: written by the handlers and the producer thread,
 * read by the main thread. */
typedef struct run {
  atomic_int phase;              /* the current phase, set by the main thread */
  atomic_int starts[MAXREC];     /* handler starts of record i */
  atomic_long lat_us[MAXREC];    /* its first start minus intended send */
  atomic_int part[MAXREC];       /* its partition (set at its first start) */
  atomic_int last_member[NPART]; /* who last started a record of p */
  atomic_llong last_start_us[NPART];      /* when (wall us) */
  atomic_long redelivered[NPHASE][NPART]; /* second starts, by phase */
  atomic_long cancelled[NPHASE][NPART];   /* cancellations seen */
  atomic_long produced;                   /* records sent so far */
  atomic_int stop;                        /* the producer stops */
  bench_sends_t sends;                    /* their acknowledgements */
  double t0; /* record i's intended send time: t0 + i / rate (wall) */
  long rate; /* records/s */
  char topic[96];
  prosody_client_t *prod; /* the producer thread's client */
} run_t;

/* A member: its index in the run (A 0, B 1, C 2). */
typedef struct member {
  run_t *run;
  int id;
} member_t;

/* One join's figures. */
typedef struct join {
  long redelivered, cancelled; /* all partitions */
  long redelivered_stayed, cancelled_stayed;
  int nstayed;                /* partitions that did not move */
  int stayed[NPART];          /* 1: partition p did not move */
  double p99_ms, base_p99_ms; /* window and baseline, stayed ones */
  double settle_s;            /* join to settled */
} join_t;

static int verbose;
static long handler_ms = 1000; /* each handler's wait */

static prosody_result_t on_message(prosody_context_t *ctx,
                                   const prosody_message_t *m, void *op) {
  member_t *me = op;
  run_t *run = me->run;
  double now = bench_wall_s();
  const char *payload = prosody_message_payload(m);
  long i = bench_index(payload);
  int p = prosody_message_partition(m), ph = atomic_load(&run->phase), n;

  if (i < 0 || i >= MAXREC || p < 0 || p >= NPART)
    return PROSODY_PERMANENT;
  atomic_store(&run->last_member[p], me->id);
  atomic_store(&run->last_start_us[p], (long long)(now * 1e6));
  n = atomic_fetch_add(&run->starts[i], 1);
  if (n == 0) {
    atomic_store(&run->lat_us[i],
                 (long)((now - bench_intended(payload)) * 1e6));
    atomic_store(&run->part[i], p);
  } else if (n == 1) {
    atomic_fetch_add(&run->redelivered[ph][p], 1);
  }
  if (prosody_wait_cancel(ctx, handler_ms)) {
    atomic_fetch_add(&run->cancelled[ph][p], 1);
    return PROSODY_TRANSIENT; /* not done: whoever holds it next redoes it */
  }
  return PROSODY_SUCCESS;
}

/* The producer thread: record i at t0 + i / rate, until told to stop
 * (behind schedule a record goes at once and its lateness shows up as
 * latency, as in bench_stream()). */
static void *produce_main(void *arg) {
  run_t *run = arg;
  char err[512], key[32], payload[160];
  for (long i = 0; i < MAXREC && !atomic_load(&run->stop); i++) {
    double intended = run->t0 + (double)i / (double)run->rate,
           now = bench_wall_s();
    if (intended > now)
      usleep((useconds_t)((intended - now) * 1e6));
    snprintf(key, sizeof(key), "key-%04ld", bench_key_of(i));
    snprintf(payload, sizeof(payload),
             "{\"id\":\"evt-%010ld\",\"type\":\"order.created\","
             "\"intended\":%.6f}",
             i, intended);
    if (prosody_send_async(run->prod, run->topic, key, payload, NULL,
                           bench_on_sent, &run->sends, err, sizeof(err)))
      atomic_fetch_add(&run->sends.failed, 1);
    atomic_store(&run->produced, i + 1);
  }
  return NULL;
}

static prosody_client_t *member_new(const char *bootstrap, member_t *me,
                                    const char *strategy) {
  char err[512];
  prosody_config_t *conf = prosody_config_new();
  prosody_handler_t h = {on_message, NULL, me, 0};
  prosody_client_t *c;
  bench_target(conf, bootstrap);
  bench_set(conf, "group_id", me->run->topic);
  bench_set(conf, "subscribed_topics", me->run->topic);
  bench_set(conf, "partition_assignment_strategy", strategy);
  bench_set(conf, "log", getenv("BENCH_LOG") ? getenv("BENCH_LOG") : "error");
  bench_set(conf, "probe_port", "none");
  bench_set(conf, "mode", "pipeline");
  bench_set(conf, "defer_enabled", "false");
  bench_set(conf, "shutdown_timeout", "2s");
  bench_set(conf, "max_concurrency", "256");
  bench_set(conf, "max_uncommitted", "1024");
  bench_set(conf, "idempotence_cache_size", "0");
  if (getenv("BENCH_TELEMETRY") && !strcmp(getenv("BENCH_TELEMETRY"), "off"))
    bench_set(conf, "telemetry_enabled", "false");
  if (!(c = prosody_client_new(conf, err, sizeof(err))) ||
      prosody_subscribe(c, &h, err, sizeof(err))) {
    fprintf(stderr, "bench_rebalance: %s\n", err);
    exit(1);
  }
  return c;
}

/* Waits (at most 90 s) until each of the n members holds partitions and
 * together they hold all of them; returns the wall time it happened. */
static double wait_settled(prosody_client_t **c, int n, const char *what) {
  double t0 = bench_now_s();
  for (;;) {
    int sum = 0, each = 1;
    for (int k = 0; k < n; k++) {
      int a = prosody_assigned_partition_count(c[k]);
      sum += a;
      each &= a > 0;
    }
    if (each && sum == NPART)
      return bench_wall_s();
    if (bench_now_s() - t0 > 90) {
      fprintf(stderr,
              "bench_rebalance: %s: the group did not settle in 90 s "
              "(%d of %d partitions held)\n",
              what, sum, NPART);
      exit(1);
    }
    usleep(20000);
  }
}

/* Waits (at most 30 s) until every partition has had a record started
 * after `since` (wall s); its owner then is who started it. */
static void wait_owners(run_t *run, double since, int *owner,
                        const char *what) {
  double t0 = bench_now_s();
  for (int p = 0; p < NPART;) {
    if (atomic_load(&run->last_start_us[p]) > (long long)(since * 1e6)) {
      owner[p] = atomic_load(&run->last_member[p]);
      p++;
      continue;
    }
    if (bench_now_s() - t0 > 30) {
      fprintf(stderr,
              "bench_rebalance: %s: no record of partition %d started in "
              "30 s after the group settled\n",
              what, p);
      exit(1);
    }
    usleep(20000);
  }
}

/* The first record intended at or after wall time t. */
static long index_at(const run_t *run, double t) {
  double x = ceil((t - run->t0) * (double)run->rate);
  return x < 0 ? 0 : x >= MAXREC ? MAXREC - 1 : (long)x;
}

/* Waits (at most 30 s) until records [lo, hi) were all sent and started. */
static void wait_started(run_t *run, long lo, long hi, const char *what) {
  double t0 = bench_now_s();
  for (long i = lo; i < hi;) {
    if (atomic_load(&run->produced) > i && atomic_load(&run->starts[i])) {
      i++;
      continue;
    }
    if (bench_now_s() - t0 > 30) {
      fprintf(stderr,
              "bench_rebalance: %s: record %ld (%ld..%ld) not started in "
              "30 s\n",
              what, i, lo, hi - 1);
      exit(1);
    }
    usleep(20000);
  }
}

/* The p99 (ms) of the first-start latencies of records [lo, hi) on the
 * partitions in `in`; NAN when there are none. */
static double p99_of(run_t *run, long lo, long hi, const int *in) {
  double *v = malloc((size_t)(hi > lo ? hi - lo : 1) * sizeof(double));
  long n = 0;
  double r;
  if (!v)
    exit(1);
  for (long i = lo; i < hi; i++)
    if (atomic_load(&run->starts[i]) && in[atomic_load(&run->part[i])])
      v[n++] = (double)atomic_load(&run->lat_us[i]) / 1000.0;
  if (!n) {
    free(v);
    return NAN;
  }
  qsort(v, (size_t)n, sizeof(double), bench_cmp_double);
  r = v[(size_t)ceil(0.99 * (double)n) - 1];
  free(v);
  return r;
}

/* Member k+1 joins the k members in c[] (k = 1 or 2) and the group
 * settles; fills `j` but for its counts (count()). The baseline is
 * records [base_lo, base_hi). */
static void join(run_t *run, const char *bootstrap, const char *strategy,
                 prosody_client_t **c, member_t *mem, int k, long base_lo,
                 long base_hi, join_t *j) {
  char what[64];
  int before[NPART], after[NPART];
  double t_join, t_settled;
  long lo, hi;

  snprintf(what, sizeof(what), "%s join%d", strategy, k + 1);
  for (int p = 0; p < NPART; p++)
    before[p] = atomic_load(&run->last_member[p]);
  t_join = bench_wall_s();
  atomic_store(&run->phase, k);
  c[k] = member_new(bootstrap, &mem[k], strategy);
  t_settled = wait_settled(c, k + 1, what);
  j->settle_s = t_settled - t_join;
  wait_owners(run, t_settled, after, what);
  j->nstayed = 0;
  for (int p = 0; p < NPART; p++)
    j->nstayed += j->stayed[p] = before[p] == after[p];
  if (verbose) {
    fprintf(stderr, "%s: settled in %.1f s; owner before>after:", what,
            j->settle_s);
    for (int p = 0; p < NPART; p++)
      fprintf(stderr, " p%d %c>%c", p, 'A' + before[p], 'A' + after[p]);
    fprintf(stderr, "\n");
  }
  /* The window: records intended from BEFORE_S before the join to TAIL_S
   * after it settled, once every one of them has started (the sleep only
   * paces; the wait for the starts is what makes the window complete). */
  while (bench_wall_s() < t_settled + TAIL_S)
    usleep(50000);
  lo = index_at(run, t_join - BEFORE_S);
  hi = index_at(run, t_settled + TAIL_S);
  wait_started(run, lo, hi, what);
  j->p99_ms = p99_of(run, lo, hi, j->stayed);
  j->base_p99_ms = p99_of(run, base_lo, base_hi, j->stayed);
  if (verbose)
    fprintf(stderr,
            "%s: stayed p99 %.0f ms (baseline %.0f ms) over %ld "
            "records\n",
            what, j->p99_ms, j->base_p99_ms, hi - lo);
}

/* Adds phase k's counts to `j`, over all partitions and the stayed ones. */
static void count(run_t *run, int k, join_t *j) {
  j->redelivered = j->cancelled = 0;
  j->redelivered_stayed = j->cancelled_stayed = 0;
  for (int p = 0; p < NPART; p++) {
    long r = atomic_load(&run->redelivered[k][p]),
         x = atomic_load(&run->cancelled[k][p]);
    j->redelivered += r;
    j->cancelled += x;
    if (j->stayed[p]) {
      j->redelivered_stayed += r;
      j->cancelled_stayed += x;
    }
  }
}

/* Creates `topic` with NPART partitions (the mock cluster through its
 * own API), or exits. */
static void create_topic(const char *bootstrap, const char *topic) {
  char err[512];
  prosody_config_t *conf = prosody_config_new();
  prosody_topic_options_t o = PROSODY_TOPIC_OPTIONS_INIT;
  prosody_admin_t *a;
  o.partitions = NPART;
  bench_target(conf, bootstrap);
  if (!(a = prosody_admin_new(conf, err, sizeof(err))) ||
      prosody_admin_create_topic(a, topic, &o, err, sizeof(err))) {
    fprintf(stderr, "bench_rebalance: topic %s: %s\n", topic, err);
    exit(1);
  }
  prosody_admin_destroy(a); /* it owns conf */
}

/* A member leaves the group and is destroyed (a thread of its own). */
static void *leave_main(void *arg) {
  prosody_unsubscribe(arg);
  prosody_client_destroy(arg);
  return NULL;
}

/* One strategy's run: A alone, then B, then C join under load; fills
 * js[0] (join2) and js[1] (join3). */
static void run_strategy(const char *bootstrap, const char *strategy, long rate,
                         double baseline_s, join_t *js) {
  run_t *run = calloc(1, sizeof(*run));
  member_t mem[NMEMBERS];
  prosody_client_t *c[NMEMBERS] = {NULL};
  prosody_config_t *pconf;
  pthread_t producer, leavers[NMEMBERS];
  long base_lo, base_hi;
  double t_a;

  if (!run)
    exit(1);
  snprintf(run->topic, sizeof(run->topic), "bench-rebalance-%s-%ld", strategy,
           (long)getpid());
  create_topic(bootstrap, run->topic);
  pconf = prosody_config_new();
  bench_target(pconf, bootstrap);
  run->prod = bench_producer(pconf);
  for (int k = 0; k < NMEMBERS; k++)
    mem[k] = (member_t){run, k};

  t_a = bench_wall_s();
  c[0] = member_new(bootstrap, &mem[0], strategy);
  wait_settled(c, 1, "A joins");
  if (verbose)
    fprintf(stderr, "%s: A holds %d partitions after %.1f s\n", strategy, NPART,
            bench_wall_s() - t_a);
  /* The stream starts once A reads, so that its first records do not wait
   * for A's join. */
  run->rate = rate;
  run->t0 = bench_wall_s() + 0.1;
  if (pthread_create(&producer, NULL, produce_main, run)) {
    fprintf(stderr, "bench_rebalance: cannot start the producer\n");
    exit(1);
  }
  while (bench_wall_s() < run->t0 + WARMUP_S + baseline_s + BEFORE_S)
    usleep(50000);
  base_lo = index_at(run, run->t0 + WARMUP_S);
  base_hi = index_at(run, run->t0 + WARMUP_S + baseline_s);
  wait_started(run, base_lo, base_hi, "baseline");

  join(run, bootstrap, strategy, c, mem, 1, base_lo, base_hi, &js[0]);
  join(run, bootstrap, strategy, c, mem, 2, base_lo, base_hi, &js[1]);
  atomic_store(&run->phase, 3);
  atomic_store(&run->stop, 1);
  pthread_join(producer, NULL);
  count(run, 1, &js[0]);
  count(run, 2, &js[1]);
  if (atomic_load(&run->sends.failed))
    fprintf(stderr, "bench_rebalance: %s: %ld of %ld sends failed\n", strategy,
            atomic_load(&run->sends.failed), atomic_load(&run->produced));

  /* The members leave together: one after another, each leave is a
   * rebalance that the next close may have to wait out. */
  for (int k = 0; k < NMEMBERS; k++)
    if (pthread_create(&leavers[k], NULL, leave_main, c[k])) {
      fprintf(stderr, "bench_rebalance: cannot start a thread\n");
      exit(1);
    }
  for (int k = 0; k < NMEMBERS; k++)
    pthread_join(leavers[k], NULL);
  prosody_client_destroy(run->prod);
  if (bootstrap)
    bench_real_topic(bootstrap, run->topic, 0);
  free(run);
}

/* A join's pause: its window's p99 minus the baseline's, ms. */
static double pause_ms(const join_t *j) { return j->p99_ms - j->base_p99_ms; }

/* The figure `what` (0 redelivered, 1 cancelled, 2 pause) of a strategy's
 * two joins: their sum, or for the pause the larger. */
static double figure(const join_t *js, int what) {
  switch (what) {
  case 0:
    return (double)(js[0].redelivered + js[1].redelivered);
  case 1:
    return (double)(js[0].cancelled + js[1].cancelled);
  default:
    return fmax(pause_ms(&js[0]), pause_ms(&js[1]));
  }
}

/* A strategy's line for `what`. The eager line is the reference (ratio 1);
 * the cooperative line's ratio is cooperative / eager, left out when
 * eager's figure is not positive (0 / 0 says nothing) or eager did not
 * run. */
static void report(const char *sfx, int what, const join_t *js, int eager,
                   const join_t *other) {
  static const char *names[] = {"redelivered", "cancelled", "p99_pause"};
  const char *who = eager ? "eager" : "cooperative";
  char r[32] = "";
  double v = figure(js, what);
  if (other && eager)
    snprintf(r, sizeof(r), " ratio=1.000");
  else if (other && figure(other, what) > 0)
    snprintf(r, sizeof(r), " ratio=%.3f", v / figure(other, what));
  if (what < 2) {
    long j2 = what ? js[0].cancelled : js[0].redelivered,
         j3 = what ? js[1].cancelled : js[1].redelivered,
         s2 = what ? js[0].cancelled_stayed : js[0].redelivered_stayed,
         s3 = what ? js[1].cancelled_stayed : js[1].redelivered_stayed;
    printf("bench rebalance_%s_%s%s %.0f records%s join2=%ld join3=%ld "
           "on_stayed_partitions=%ld/%ld\n",
           names[what], who, sfx, v, r, j2, j3, s2, s3);
  } else {
    printf("bench rebalance_%s_%s%s %.0f ms%s join2=%.0fms join3=%.0fms "
           "p99=%.0fms/%.0fms baseline_p99=%.0fms/%.0fms stayed=%d/%d "
           "settle=%.1fs/%.1fs\n",
           names[what], who, sfx, v, r, pause_ms(&js[0]), pause_ms(&js[1]),
           js[0].p99_ms, js[1].p99_ms, js[0].base_p99_ms, js[1].base_p99_ms,
           js[0].nstayed, js[1].nstayed, js[0].settle_s, js[1].settle_s);
  }
}

int main(int argc, char **argv) {
  long rate = argc > 1 ? atol(argv[1]) : 200;
  double baseline_s = argc > 2 ? atof(argv[2]) : 8;
  const char *bootstrap = getenv("BENCH_BOOTSTRAP");
  const char *only = getenv("BENCH_STRATEGY");
  const char *sfx = bootstrap ? "_kafka" : "";
  join_t coop[2], eager[2];
  int run_coop = !only || !strcmp(only, "cooperative-sticky"),
      run_eager = !only || !strcmp(only, "range");

  verbose = getenv("BENCH_VERBOSE") != NULL;
  if (argc > 3)
    handler_ms = atol(argv[3]);
  if (rate < 1 || baseline_s < 1 || handler_ms < 0 ||
      (!run_coop && !run_eager)) {
    fprintf(stderr, "usage: bench_rebalance [RATE [BASELINE_S [HANDLER_MS]]] "
                    "(BENCH_STRATEGY=cooperative-sticky|range)\n");
    return 2;
  }
  memset(coop, 0, sizeof(coop));
  memset(eager, 0, sizeof(eager));
  if (run_coop)
    run_strategy(bootstrap, "cooperative-sticky", rate, baseline_s, coop);
  if (run_eager)
    run_strategy(bootstrap, "range", rate, baseline_s, eager);
  for (int what = 0; what < 3; what++) {
    if (run_coop)
      report(sfx, what, coop, 0, run_eager ? eager : NULL);
    if (run_eager)
      report(sfx, what, eager, 1, run_coop ? coop : NULL);
  }
  return 0;
}
