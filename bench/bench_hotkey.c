/*
 * bench_hotkey.c - the healthy keys' latency while one key is hot or
 * failing (issue 15): does one bad key slow everyone else down?
 *
 *   bench_hotkey [RATE [SECONDS [HOT_SECONDS [HANDLER_US]]]]
 *
 * Handlers hold their slot for a fixed time: HANDLER_US (default 100 us,
 * a sleep, as a handler waiting on a database or a service would; timer
 * slack set to 1 ns so the sleep is what it says). The stream is
 * bench_latency's (bench_stream(): 1 000 keys in turn, 4 partitions on the
 * embedded mock cluster, each record carrying its intended send time), at
 * RATE records/s for SECONDS (default 8; the hotkey runs HOT_SECONDS,
 * default 20: see below). RATE 0 or absent: half the capacity measured
 * first in this process: 100 000 records produced before a consumer with
 * the same handler reads them flat out. BENCH_LOG=debug shows the
 * consumers' backpressure.
 *
 * Three runs, each on a topic and consumer of its own:
 *   baseline   every key takes HANDLER_US;
 *   hotkey     key-0000 takes 100 x what a healthy handler took in the
 *              baseline (measured: on a busy machine a 100 us sleep
 *              takes longer); its records run one after another, as one
 *              key's must. Longer than the others: the fair scheduler
 *              ranks a key by the handler time it used (decaying with a
 *              120 s half-life), so what it does to the hot key grows
 *              with the run;
 *   failstorm  key-0000 fails transiently on every attempt (pipeline
 *              mode: deferred with its later records, retried from its
 *              defer queue every few seconds; with defer off, retried in
 *              place for ever with backoff).
 * The healthy keys are the other 999 (key-0000 is left out of the
 * baseline too). Latency = handler start minus intended send time, as
 * bench_latency (no coordinated omission); a healthy record not handled
 * within GRACE_S of the stream's end counts as latency up to then (a lower
 * bound: `unhandled=N` says how many). The healthy rate is healthy
 * records handled / (last handled - first handled).
 *
 * Each run goes twice: with the defaults (fair scheduler; deferral) and with
 * the fair scheduler off (the internal sched_fifo option: waiting events
 * start in arrival order, the limiter before it) and defer_enabled=false,
 * one after the other. Each mode's ratios are against its own baseline.
 *
 * Lines: bench hotkey-baseline-p99[-fifo], hotkey-p99[-fifo] and
 * failstorm-p99[-fifo], VALUE ms, ratio = p99 / baseline p99.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include <librdkafka/rdkafka.h>

#include "bench.h"
#include "config/config.h" /* pr__config_set_test: sched_fifo */
#include "prosody.h"

#define HOT_FACTOR 100
#define GRACE_S 3.0
#define CAPACITY_RECORDS 100000
#define NPART 4 /* the mock cluster's topics */

enum { BASELINE, HOTKEY, FAILSTORM };
static const char *const scen_name[] = {"baseline", "hotkey", "failstorm"};

static long handler_us = 100;
static long hot_us; /* HOT_FACTOR x the baseline's measured mean */
static int part_of_key[BENCH_KEYS]; /* as the producer's partitioner */

typedef struct run {
  int scen;
  long total;
  double *lat_ms; /* per record index; NAN until handled */
  atomic_long healthy_got, warm, wrong_part;
  _Atomic double first, last; /* wall times: first, last healthy handled */
  atomic_long held_ns[2], held_n[2]; /* healthy, key-0000: time held */
} run_t;

static double mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* Holds the handler slot for `us` microseconds; returns the ns held. */
static long hold(long us) {
  static _Thread_local int slack_set;
  struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
  double t0 = mono_ns();
  if (!slack_set) { /* the default 50 us slack would be half of it */
    prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
    slack_set = 1;
  }
  while (nanosleep(&ts, &ts))
    ;
  return (long)(mono_ns() - t0);
}

static prosody_result_t on_message(prosody_context_t *ctx,
                                   const prosody_message_t *m, void *op) {
  run_t *r = op;
  double now = bench_wall_s();
  const char *payload = prosody_message_payload(m);
  long i = bench_index(payload), k;
  int bad;
  (void)ctx;
  if (i < 0 || i >= r->total) { /* the warm-up record */
    atomic_fetch_add(&r->warm, 1);
    return PROSODY_SUCCESS;
  }
  k = bench_key_of(i);
  bad = k == 0;
  if (bad && r->scen == FAILSTORM) {
    atomic_fetch_add(&r->held_n[1], 1); /* attempts, none held */
    return PROSODY_TRANSIENT;
  }
  if (!bad) {
    if (prosody_message_partition(m) != part_of_key[k])
      atomic_fetch_add(&r->wrong_part, 1);
    if (isnan(r->lat_ms[i])) { /* a record is handled once (no failures) */
      r->lat_ms[i] = (now - bench_intended(payload)) * 1e3;
      double zero = 0;
      atomic_compare_exchange_strong(&r->first, &zero, now);
      atomic_fetch_add(&r->healthy_got, 1);
      atomic_store(&r->last, now);
    }
  }
  atomic_fetch_add(&r->held_ns[bad],
                   hold(bad && r->scen == HOTKEY ? hot_us : handler_us));
  atomic_fetch_add(&r->held_n[bad], 1);
  return PROSODY_SUCCESS;
}

static prosody_client_t *prod;
static bench_sends_t sends;

/* A fresh topic (the mock creates it, 4 partitions, on first use) with
 * one warm-up record, and a consumer of it that has read that record. */
static prosody_client_t *consumer(run_t *r, const char *topic, int fifo) {
  char err[512];
  prosody_config_t *conf = prosody_config_new();
  prosody_handler_t h = {on_message, NULL, r, 0};
  prosody_client_t *c;
  double deadline;
  if (prosody_send(prod, topic, "warm-up", "{\"intended\":0}", NULL, err,
                   sizeof(err))) {
    fprintf(stderr, "bench_hotkey: %s\n", err);
    exit(1);
  }
  /* The failing key's retries warn; BENCH_LOG=debug shows backpressure. */
  bench_set(conf, "log", getenv("BENCH_LOG") ? getenv("BENCH_LOG") : "error");
  bench_set(conf, "shutdown_timeout", "2s");
  if (fifo) {
    pr__test_opts_t opts = {0};
    opts.sched_fifo = 1;
    pr__config_set_test(conf, &opts);
    bench_set(conf, "defer_enabled", "false");
  }
  c = bench_mock_consumer(conf, topic, &h);
  for (deadline = bench_wall_s() + 30;
       !atomic_load(&r->warm) && bench_wall_s() < deadline;)
    usleep(1000);
  return c;
}

static run_t *run_new(int scen, long total) {
  run_t *r = calloc(1, sizeof(*r));
  r->scen = scen;
  r->total = total;
  r->lat_ms = malloc((size_t)total * sizeof(double));
  for (long i = 0; i < total; i++)
    r->lat_ms[i] = NAN;
  return r;
}

/* How many of records 0..total-1 are healthy (not key-0000's). */
static long healthy_of(long total) {
  return total - (total + BENCH_KEYS - 1) / BENCH_KEYS;
}

static void run_free(run_t *r) {
  free(r->lat_ms);
  free(r);
}

/* Capacity: records/s of a consumer with the healthy handler reading
 * CAPACITY_RECORDS produced beforehand, first to last handled. */
static double capacity(void) {
  char topic[96];
  run_t *r = run_new(BASELINE, CAPACITY_RECORDS);
  prosody_client_t *c;
  double rate, deadline = bench_wall_s() + 60;
  long want = healthy_of(CAPACITY_RECORDS);
  snprintf(topic, sizeof(topic), "bench-hotkey-%d-capacity", (int)getpid());
  atomic_store(&sends.ok, 0);
  bench_stream(prod, topic, CAPACITY_RECORDS, 0, 0, &sends);
  while (atomic_load(&sends.ok) + atomic_load(&sends.failed) < CAPACITY_RECORDS)
    usleep(10000);
  c = consumer(r, topic, 0);
  while (atomic_load(&r->healthy_got) < want && bench_wall_s() < deadline)
    usleep(1000);
  rate = (double)atomic_load(&r->healthy_got) /
         (atomic_load(&r->last) - atomic_load(&r->first));
  prosody_client_destroy(c);
  run_free(r);
  return rate;
}

typedef struct result {
  double p50, p99, p999, p99_other, p99_same; /* ms */
  double rate;                                /* healthy records/s */
  long unhandled, key0_attempts;
  double held_us[2]; /* mean time held: healthy, key-0000 */
} result_t;

static double pct(double *v, long n, double q) {
  return n ? v[(long)(q * (double)(n - 1))] : NAN;
}

static result_t run_one(int scen, int fifo, long rate, long secs) {
  char topic[96];
  long total = rate * secs, n = 0, n_other = 0, n_same = 0;
  run_t *r = run_new(scen, total);
  prosody_client_t *c;
  double start, end, *all, *other, *same;
  result_t res = {0};
  int hot_part = part_of_key[0];
  static int runs; /* a topic (and group) per run: the records' ids repeat */
  snprintf(topic, sizeof(topic), "bench-hotkey-%d-%d-%s%s", (int)getpid(),
           ++runs, scen_name[scen], fifo ? "-fifo" : "");
  c = consumer(r, topic, fifo);
  start = bench_wall_s() + 0.1;
  bench_stream(prod, topic, total, rate, start, &sends);
  end = start + (double)secs + GRACE_S;
  while (atomic_load(&r->healthy_got) < healthy_of(total) &&
         bench_wall_s() < end)
    usleep(10000);
  end = bench_wall_s();
  prosody_client_destroy(c);

  all = malloc((size_t)total * sizeof(double) * 3);
  other = all + total;
  same = other + total;
  for (long i = 0; i < total; i++) {
    long k = bench_key_of(i);
    double ms = r->lat_ms[i];
    if (!k)
      continue;
    if (isnan(ms)) { /* never handled: at least this late */
      ms = (end - (start + (double)i / (double)rate)) * 1e3;
      res.unhandled++;
    }
    all[n++] = ms;
    if (part_of_key[k] == hot_part)
      same[n_same++] = ms;
    else
      other[n_other++] = ms;
  }
  qsort(all, (size_t)n, sizeof(double), bench_cmp_double);
  qsort(other, (size_t)n_other, sizeof(double), bench_cmp_double);
  qsort(same, (size_t)n_same, sizeof(double), bench_cmp_double);
  res.p50 = pct(all, n, 0.5);
  res.p99 = pct(all, n, 0.99);
  res.p999 = pct(all, n, 0.999);
  res.p99_other = pct(other, n_other, 0.99);
  res.p99_same = pct(same, n_same, 0.99);
  res.rate = (double)atomic_load(&r->healthy_got) /
             (atomic_load(&r->last) - atomic_load(&r->first));
  for (int b = 0; b < 2; b++)
    res.held_us[b] = atomic_load(&r->held_n[b])
                         ? (double)atomic_load(&r->held_ns[b]) / 1e3 /
                               (double)atomic_load(&r->held_n[b])
                         : 0;
  res.key0_attempts = atomic_load(&r->held_n[1]);
  fprintf(stderr,
          "  %s%s: p50 %.1f p99 %.1f p99.9 %.1f ms (key-0000's partition %d: "
          "p99 %.1f, others %.1f); healthy %.0f/s, %ld unhandled; held "
          "%.0f us, key-0000 %.0f us x %ld\n",
          scen_name[scen], fifo ? "-fifo" : "", res.p50, res.p99, res.p999,
          hot_part, res.p99_same, res.p99_other, res.rate, res.unhandled,
          res.held_us[0], res.held_us[1], atomic_load(&r->held_n[1]));
  if (atomic_load(&r->wrong_part))
    fprintf(stderr,
            "bench_hotkey: %ld records on another partition than "
            "expected: the same/other split is wrong\n",
            atomic_load(&r->wrong_part));
  free(all);
  run_free(r);
  return res;
}

/* A hotkey-p99 or failstorm-p99 line; `extra`: notes of its own. */
static void report(const char *name, const char *suffix, const result_t *x,
                   const result_t *base, int fifo, const char *extra) {
  printf("bench %s-p99%s %.1f ms ratio=%.2f baseline=%.1fms "
         "healthy_rate_ratio=%.3f p99_other_partitions=%.1fms "
         "p99_key0_partition=%.1fms unhandled=%ld%s %s %s\n",
         name, suffix, x->p99, x->p99 / base->p99, base->p99,
         x->rate / base->rate, x->p99_other, x->p99_same, x->unhandled,
         x->unhandled ? " (p99_a_lower_bound)" : "", extra,
         fifo ? "sched=fifo defer=off" : "sched=fair defer=on");
}

int main(int argc, char **argv) {
  long rate = argc > 1 ? atol(argv[1]) : 0;
  long secs = argc > 2 ? atol(argv[2]) : 8;
  long hot_secs = argc > 3 ? atol(argv[3]) : 20;
  double cap = 0;
  prosody_config_t *conf;
  result_t res[3][2]; /* [scenario][fifo] */
  if (argc > 4)
    handler_us = atol(argv[4]);
  if (rate < 0 || secs < 1 || hot_secs < 1 || handler_us < 1)
    return 2;
  for (int k = 0; k < BENCH_KEYS; k++) {
    char key[32];
    snprintf(key, sizeof(key), "key-%04d", k);
    part_of_key[k] = rd_kafka_msg_partitioner_consistent_random(
        NULL, key, strlen(key), NPART, NULL, NULL);
  }
  conf = prosody_config_new();
  bench_set(conf, "mock", "true");
  prod = bench_producer(conf);
  if (!rate) {
    cap = capacity();
    rate = (long)(cap / 2);
    fprintf(stderr,
            "hotkey: capacity with a %ld us handler %.0f records/s; "
            "streaming at %ld/s\n",
            handler_us, cap, rate);
  }
  /* Each scenario in both modes back to back, the first mode alternating
   * (fair, fifo; fifo, fair; fair, fifo): a slow stretch of a shared
   * machine then hits a pair, not one mode's whole set. */
  for (int scen = BASELINE; scen <= FAILSTORM; scen++)
    for (int j = 0; j < 2; j++) {
      int fifo = j ^ (scen == HOTKEY);
      if (scen == HOTKEY)
        hot_us = lround(HOT_FACTOR * res[BASELINE][fifo].held_us[0]);
      res[scen][fifo] =
          run_one(scen, fifo, rate, scen == HOTKEY ? hot_secs : secs);
    }
  for (int fifo = 0; fifo < 2; fifo++) {
    const char *sfx = fifo ? "-fifo" : "";
    char extra[128];
    result_t *base = &res[BASELINE][fifo], *hot = &res[HOTKEY][fifo],
             *fail = &res[FAILSTORM][fifo];
    printf("bench hotkey-baseline-p99%s %.1f ms rate=%ld/s capacity=%.0f/s "
           "seconds=%ld handler=%ldus held=%.0fus healthy_rate=%.0f/s %s\n",
           sfx, base->p99, rate, cap, secs, handler_us, base->held_us[0],
           base->rate, fifo ? "sched=fifo defer=off" : "sched=fair defer=on");
    snprintf(extra, sizeof(extra),
             "seconds=%ld hot_held=%.1fms hot_key_load=%.2f", hot_secs,
             hot->held_us[1] / 1e3,
             (double)rate / BENCH_KEYS * hot->held_us[1] / 1e6);
    report("hotkey", sfx, hot, base, fifo, extra);
    snprintf(extra, sizeof(extra), "key0_attempts=%ld", fail->key0_attempts);
    report("failstorm", sfx, fail, base, fifo, extra);
  }
  prosody_client_destroy(prod);
  if (atomic_load(&sends.failed)) {
    fprintf(stderr, "bench_hotkey: %ld sends failed\n",
            atomic_load(&sends.failed));
    return 1;
  }
  return 0;
}
