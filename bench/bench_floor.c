/*
 * bench_floor.c - the per-record work floor of the no-op consumer: what
 * prosody must do for every record whatever its design (the key check, a
 * copy of key and payload, the headers parsed for loop prevention, the
 * deduplication id and its lookup and record, the payload's JSON check,
 * the handler's call), done inline on the polling thread of a raw
 * librdkafka consumer, against that raw consumer alone, alternating in the
 * same run on the same records (white-box: prosody's own key check,
 * validator, dedup id and id set, linked from the static library).
 *
 * It leaves out what prosody adds on top: handing each record to a
 * handler thread and its result back (handlers may block, so they cannot
 * run on the polling thread), per-key ordering, the fair scheduler,
 * offset tracking, timeouts and locks. So its rate bounds the no-op
 * consumer's from above on one polling thread, and the gap between the
 * two is the price of the hand-off and the bookkeeping (docs/BENCHMARKS.md,
 * "Engine hot path").
 *
 *   bench_floor [records] [runs]   (embedded mock cluster, 1 000 keys)
 * Prints "bench consume-floor-raw N msg/s ..." and "bench consume-floor N
 * msg/s ratio=R cpu=..." (R against the raw line; medians of the runs).
 * BENCH_BOOTSTRAP=host:port runs it against a real broker instead, on a
 * fresh topic of 4 partitions (deleted afterwards), and names the lines
 * consume-floor-real-raw and consume-floor-real.
 */
#include <string.h>

#include "bench.h"
#include "engine/dedup.h"
#include "engine/internal.h"
#include "stores/stores.h"
#include "util/util.h"

static prosody_result_t noop(prosody_context_t *ctx, const prosody_message_t *m,
                             void *op) {
  (void)ctx;
  (void)m;
  (void)op;
  return PROSODY_SUCCESS;
}
static prosody_result_t (*volatile handler)(prosody_context_t *,
                                            const prosody_message_t *,
                                            void *) = noop;

static pr__idset_t *seen; /* one thread: no lock, unlike prosody's */
static char copy[1 << 16];
static long duplicates, skipped;

/* The work prosody does for record m between the poll and the commit. */
static void work(rd_kafka_message_t *m, const char *group) {
  const char *key = m->key, *payload = m->payload, *v = NULL, *topic;
  size_t klen = m->key_len, len = m->len, vn = 0, idn = 0;
  rd_kafka_headers_t *hdrs;
  const void *hv;
  size_t hl;
  char id[128];
  pr__did_t d;
  int state = 0, valid;
  if (pr__record_check(key, klen, payload, 0) ||
      klen + len + 2 > sizeof(copy)) {
    skipped++;
    return;
  }
  memcpy(copy, key, klen); /* the event's own copy, as at intake */
  copy[klen] = '\0';
  memcpy(copy + klen + 1, payload, len);
  copy[klen + 1 + len] = '\0';
  key = copy;
  payload = copy + klen + 1;
  if (!rd_kafka_message_headers(m, &hdrs) &&
      !rd_kafka_header_get_last(hdrs, "source-system", &hv, &hl) &&
      hl == strlen(group) && !memcmp(hv, group, hl))
    skipped++; /* our own output */
  topic = rd_kafka_topic_name(m->rkt);
  if (memmem(payload, len, "\"id\"", 4))
    state = pr__json_find(payload, len, "id", &v, &vn);
  if (v && vn <= sizeof(id))
    idn = pr__json_unescape(v, vn, id);
  d = pr__dd_id("1", group, topic, m->partition, key, v ? id : NULL, idn,
                m->offset);
  if (pr__idset_has(seen, d, 1)) {
    duplicates++;
    return;
  }
  valid = state ? state > 0 : pr__json_valid(payload, len);
  if (!valid) {
    skipped++;
    return;
  }
  if (handler(NULL, NULL, NULL) == PROSODY_SUCCESS)
    pr__idset_add(seen, d, 1000);
}

static void work_cb(rd_kafka_message_t *m, void *group) { work(m, group); }

/* One run: a fresh group reads the n records, with or without the work.
 * Returns records/s; *cpu_us per record. */
static double run(const char *bootstrap, const char *topic, long n, int rep,
                  int with_work, double *cpu_us) {
  char group[64], err[512];
  rd_kafka_conf_t *kc;
  snprintf(group, sizeof(group), "bench-floor-%d-%d", with_work, rep);
  kc = bench_raw_conf(bootstrap, group);
  /* All the records may be prefetched: a consumer slower than the fetcher
   * otherwise fills the consumer queue's 100 000 and librdkafka 2.0.2
   * fetches again up to a second later, which would measure that wait, not
   * the work (prosody reads each partition's own queue, which this bench's
   * 50 000 records per partition never fill). */
  rd_kafka_conf_set(kc, "queued.min.messages", "10000000", err, sizeof(err));
  return bench_raw_read(bench_raw_start(kc, topic), n,
                        with_work ? work_cb : NULL, group, cpu_us);
}

int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 200000;
  int reps = argc > 2 ? atoi(argv[2]) : 3;
  char bootstrap[256], err[512];
  const char *real = getenv("BENCH_BOOTSTRAP"), *where = real ? "-real" : "";
  char topic[64] = "bench-floor";
  double raw[16], fl[16], raw_cpu[16], fl_cpu[16];
  bench_sends_t sends = {0};
  prosody_config_t *conf;
  prosody_client_t *prod;
  if (reps < 1 || reps > 16 || n < 1)
    return 2;
  if (real) {
    snprintf(bootstrap, sizeof(bootstrap), "%s", real);
    snprintf(topic, sizeof(topic), "bench-floor-%ld", (long)time(NULL));
    bench_real_topic(real, topic, 1);
  } else if (prosody_mock_bootstrap_servers(bootstrap, sizeof(bootstrap), err,
                                            sizeof(err))) {
    fprintf(stderr, "bench_floor: %s\n", err);
    return 1;
  }
  /* the records of bench_consume's uniform run: 1 000 keys, ~100-byte
   * JSON with an id, and the producer's source-system header */
  conf = prosody_config_new();
  bench_target(conf, real);
  prod = bench_producer(conf);
  bench_stream(prod, topic, n, 0, bench_wall_s(), &sends);
  for (int waited = 0;
       atomic_load(&sends.ok) + atomic_load(&sends.failed) < n &&
       waited < 60000;
       waited += 10)
    usleep(10000);
  if (atomic_load(&sends.ok) != n) {
    fprintf(stderr, "bench_floor: produce: %ld of %ld acknowledged\n",
            atomic_load(&sends.ok), n);
    return 1;
  }
  seen = pr__idset_new((size_t)n * (size_t)reps);
  for (int r = 0; r < reps; r++) { /* the order alternates */
    int w = r % 2;
    double *a = w ? fl : raw, *ac = w ? fl_cpu : raw_cpu;
    double *b = w ? raw : fl, *bc = w ? raw_cpu : fl_cpu;
    a[r] = run(bootstrap, topic, n, r, w, &ac[r]);
    b[r] = run(bootstrap, topic, n, r, !w, &bc[r]);
    fprintf(stderr,
            "  run %d: raw %.0f msg/s (%.2f us CPU/record), raw + the "
            "work %.0f msg/s (%.2f us)\n",
            r, raw[r], raw_cpu[r], fl[r], fl_cpu[r]);
  }
  if (duplicates || skipped) {
    fprintf(stderr, "bench_floor: %ld duplicates, %ld skipped: expected 0\n",
            duplicates, skipped);
    return 1;
  }
  qsort(raw, (size_t)reps, sizeof(double), bench_cmp_double);
  qsort(fl, (size_t)reps, sizeof(double), bench_cmp_double);
  qsort(raw_cpu, (size_t)reps, sizeof(double), bench_cmp_double);
  qsort(fl_cpu, (size_t)reps, sizeof(double), bench_cmp_double);
  printf("bench consume-floor%s-raw %.0f msg/s ratio=1.000 "
         "cpu=%.2fus/record\n",
         where, raw[reps / 2], raw_cpu[reps / 2]);
  printf("bench consume-floor%s %.0f msg/s ratio=%.3f cpu=%.2fus/record (raw "
         "librdkafka plus prosody's per-record work on the polling thread; "
         "no hand-off)\n",
         where, fl[reps / 2], fl[reps / 2] / raw[reps / 2], fl_cpu[reps / 2]);
  prosody_client_destroy(prod);
  if (real)
    bench_real_topic(real, topic, 0);
  return 0;
}
