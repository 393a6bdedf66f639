/*
 * bench_consume.c - consumer throughput with a no-op handler against a raw
 * librdkafka high-level consumer (poll, store offset, nothing else) reading
 * the same pre-produced records from the same embedded mock cluster in the
 * same run. Throughput is measured from the first to the last record
 * (group joins excluded); ratio = prosody / raw. Default configuration.
 *
 *   bench_consume [messages] [repetitions] [uniform|zipf]
 *
 * Keys: 1 000, drawn uniformly or from a Zipf(1.1) distribution. After each
 * prosody run the group's committed offsets must equal the partitions' end
 * offsets (checked with a plain librdkafka handle), or the run fails.
 *
 * BENCH_BOOTSTRAP=host:port runs the same scenario against a real broker
 * (a fresh 4-partition topic, deleted afterwards) instead of the embedded
 * mock cluster; result names then carry "-real".
 *
 * BENCH_TELEMETRY=pair runs prosody twice per repetition instead of raw
 * and prosody: telemetry on (the default: every event to the telemetry
 * topic) and off, in turn; the line consume-telemetry-DIST gives the rate
 * with it on and ratio = on / off (medians).
 *
 * The pair also measures the floor: raw librdkafka producing 2n records
 * of a telemetry event's size with the telemetry producer's settings
 * (src/kafka/telemetry.c), the CPU each record costs; with two events per
 * consumed record, off_cpu / (off_cpu + 2 floor) is the best ratio a
 * CPU-bound run can have while every event is a record of its own.
 *
 * BENCH_TELEMETRY=off runs prosody with telemetry off (the engine alone,
 * as issue 14's targets measure it); result names then end in
 * "-telemetry-off".
 *
 * BENCH_SECURITY=pair (with BENCH_BOOTSTRAP, the PLAINTEXT listener of
 * scripts/services/kafka) runs prosody twice per repetition: over PLAINTEXT
 * and over SASL_SSL with SCRAM-SHA-512 (BENCH_SASL_BOOTSTRAP, default
 * localhost:9097; CA from BENCH_TLS_DIR, default
 * /tmp/prosody-services/kafka/tls), in turn, on the same records; the line
 * consume-sasl_ssl-real-DIST gives the SASL_SSL rate, ratio = SASL_SSL /
 * PLAINTEXT (medians).
 *
 * BENCH_STATE=pair runs prosody twice per repetition: a handler that adds
 * one to a keyed-state value per record (a GET and a SET, stored with the
 * event's success) and the no-op handler, in turn, on the same records;
 * the line consume-state-DIST gives the rate with state, ratio = state /
 * no-op (medians). In mock mode the memory store; with BENCH_BOOTSTRAP and
 * BENCH_CASSANDRA the Cassandra store (suffix -cassandra).
 *
 * BENCH_MAX_CONCURRENCY / BENCH_MAX_UNCOMMITTED override those options and
 * BENCH_SKIP_RAW=1 skips the baseline, for profiling; `make bench` uses
 * neither.
 *
 * BENCH_CASSANDRA=host:port gives prosody Cassandra (keyspace
 * prosody_bench), so that deferral and dedup use their Cassandra stores,
 * and BENCH_SET="name=value;..." sets further options: with deferral on,
 * each key's first record of a burst asks the defer store whether the key
 * is deferred (docs/ARCHITECTURE.md, section 3b); BENCH_KEYS=n spreads
 * the uniform records over n keys (each record a key of its own when n is
 * the record count). Ad-hoc: `make bench` uses none of them.
 */
#include <librdkafka/rdkafka.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "prosody.h"

/* CPU per record of the last run (us), from the first record to the
 * last. */
static double last_cpu_us;

static atomic_long produced_ok;
static void on_sent(prosody_err_t err, const char *errstr,
                    const prosody_delivery_t *d, void *op) {
  if (err) {
    fprintf(stderr, "produce: %s\n", errstr);
    exit(1);
  }
  atomic_fetch_add(&produced_ok, 1);
}

/* Key of record i: uniform over 1 000 keys (BENCH_KEYS: that many), or
 * Zipf(1.1) (rank r drawn with probability proportional to 1 / r^1.1). */
#define NKEYS 1000
static int zipf;
static long uniform_keys = NKEYS;
static double zipf_cdf[NKEYS];
static long key_of(long i, unsigned *seed) {
  double u;
  long lo = 0, hi = NKEYS - 1;
  if (!zipf)
    return uniform_keys == NKEYS ? (i * 7919) % NKEYS : i % uniform_keys;
  u = (double)rand_r(seed) / ((double)RAND_MAX + 1.0);
  while (lo < hi) { /* first rank whose CDF reaches u */
    long mid = (lo + hi) / 2;
    if (zipf_cdf[mid] < u)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

static void zipf_init(void) {
  double sum = 0, acc = 0;
  for (int r = 1; r <= NKEYS; r++)
    sum += 1.0 / pow((double)r, 1.1);
  for (int r = 1; r <= NKEYS; r++) {
    acc += 1.0 / pow((double)r, 1.1) / sum;
    zipf_cdf[r - 1] = acc;
  }
  zipf_cdf[NKEYS - 1] = 1.0;
}

/* The real broker's address (BENCH_BOOTSTRAP), or NULL: the mock cluster. */
static const char *real_bootstrap;
/* BENCH_SECURITY=pair: the next prosody run goes over SASL_SSL. */
static int over_sasl_ssl;

/* Points `conf` at the SASL_SSL listener of scripts/services/kafka. */
static void sasl_ssl_target(prosody_config_t *conf) {
  const char *b = getenv("BENCH_SASL_BOOTSTRAP");
  const char *dir = getenv("BENCH_TLS_DIR");
  char ca[512];
  snprintf(ca, sizeof(ca), "%s/ca.pem",
           dir && *dir ? dir : "/tmp/prosody-services/kafka/tls");
  bench_set(conf, "bootstrap_servers", b && *b ? b : "localhost:9097");
  bench_set(conf, "kafka_security_protocol", "SASL_SSL");
  bench_set(conf, "kafka_sasl_mechanism", "SCRAM-SHA-512");
  bench_set(conf, "kafka_sasl_username", "scram-user");
  bench_set(conf, "kafka_sasl_password", "scram-secret");
  bench_set(conf, "kafka_ssl_ca_location", ca);
}

static void produce(const char *topic, long n) {
  unsigned seed = 42;
  char err[1024], key[32], buf[200];
  prosody_config_t *conf = prosody_config_new();
  prosody_client_t *c;
  bench_target(conf, real_bootstrap);
  c = bench_producer(conf);
  for (long i = 0; i < n; i++) {
    snprintf(key, sizeof(key), "key-%04ld", key_of(i, &seed));
    bench_order_json(buf, sizeof(buf), i, key);
    if (prosody_send_async(c, topic, key, buf, NULL, on_sent, NULL, err,
                           sizeof(err))) {
      fprintf(stderr, "send: %s\n", err);
      exit(1);
    }
  }
  prosody_client_destroy(c);
}

static double run_raw(const char *bootstrap, const char *topic, long n,
                      int rep) {
  char group[64];
  snprintf(group, sizeof(group), "bench-raw-%s-%d", topic, rep);
  return bench_raw_read(bench_raw_consumer(bootstrap, group, topic), n, NULL,
                        NULL, &last_cpu_us);
}

static atomic_long pr_got;
static _Atomic double pr_first, pr_last, pr_cpu0;
static prosody_result_t noop(prosody_context_t *ctx, const prosody_message_t *m,
                             void *op) {
  long n = atomic_fetch_add(&pr_got, 1);
  double t = bench_now_s();
  if (n == 0) {
    atomic_store(&pr_first, t);
    atomic_store(&pr_cpu0, bench_cpu_s());
  }
  atomic_store(&pr_last, t);
  return PROSODY_SUCCESS;
}

/* BENCH_STATE: the next prosody run keeps a counter per key. */
static int with_state;

static prosody_result_t counting(prosody_context_t *ctx,
                                 const prosody_message_t *m, void *op) {
  prosody_state_t *st = NULL;
  prosody_state_args_t a = PROSODY_STATE_ARGS_INIT;
  prosody_state_result_t r;
  char err[256], doc[32];
  long v = 0;
  if (prosody_state_open(ctx, "count", &st, NULL, err, sizeof(err)) ||
      prosody_state_call(st, PROSODY_STATE_GET, NULL, &r, err, sizeof(err))) {
    fprintf(stderr, "state: %s\n", err);
    exit(1);
  }
  if (r.n && r.items[0].json)
    v = atol(r.items[0].json);
  prosody_state_result_free(&r);
  a.json_len = (size_t)snprintf(doc, sizeof(doc), "%ld", v + 1);
  a.json = doc;
  if (prosody_state_call(st, PROSODY_STATE_SET, &a, NULL, err, sizeof(err))) {
    fprintf(stderr, "state: %s\n", err);
    exit(1);
  }
  prosody_state_free(st);
  return noop(ctx, m, op);
}

/* BENCH_POISON=<mode>: the key of record 0 (key-0000) fails transiently
 * for ever, in that mode; the rate is that of the records of the other
 * partitions, which per-partition backpressure keeps flowing. */
static const char *poison_mode;
static atomic_int poison_partition = -1;
static atomic_long healthy_got;
static long healthy_want;
static _Atomic double healthy_first, healthy_last, healthy_cpu0;
static prosody_result_t poisoned(prosody_context_t *ctx,
                                 const prosody_message_t *m, void *op) {
  int p = prosody_message_partition(m);
  double t, first = 0;
  if (!strcmp(prosody_message_key(m), "key-0000")) {
    atomic_store(&poison_partition, p);
    return PROSODY_TRANSIENT;
  }
  if (p == atomic_load(&poison_partition))
    return PROSODY_SUCCESS;
  t = bench_now_s();
  if (atomic_compare_exchange_strong(&healthy_first, &first, t))
    atomic_store(&healthy_cpu0, bench_cpu_s());
  atomic_store(&healthy_last, t);
  atomic_fetch_add(&healthy_got, 1);
  return PROSODY_SUCCESS;
}

/* The end offset of each partition of `topic` (hi[p]); the count. */
static int end_offsets(rd_kafka_t *rk, const char *topic, int64_t *hi,
                       int max) {
  const struct rd_kafka_metadata *md;
  rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, topic, NULL);
  int np;
  if (rd_kafka_metadata(rk, 0, rkt, &md, 10000) || md->topic_cnt != 1) {
    fprintf(stderr, "bench_consume: no metadata for %s\n", topic);
    exit(1);
  }
  np = md->topics[0].partition_cnt < max ? md->topics[0].partition_cnt : max;
  rd_kafka_metadata_destroy(md);
  rd_kafka_topic_destroy(rkt);
  for (int p = 0; p < np; p++) {
    int64_t lo;
    if (rd_kafka_query_watermark_offsets(rk, topic, p, &lo, &hi[p], 10000)) {
      fprintf(stderr, "bench_consume: no watermarks for %s[%d]\n", topic, p);
      exit(1);
    }
  }
  return np;
}

/* The group's committed offsets equal the end offsets of every partition:
 * nothing skipped, nothing left uncommitted. */
static void verify_committed(const char *bootstrap, const char *topic,
                             const char *group) {
  char err[512];
  rd_kafka_conf_t *kc = rd_kafka_conf_new();
  rd_kafka_topic_partition_list_t *parts;
  rd_kafka_t *rk;
  int64_t hi[64];
  int np;
  rd_kafka_conf_set(kc, "bootstrap.servers", bootstrap, err, sizeof(err));
  rd_kafka_conf_set(kc, "group.id", group, err, sizeof(err));
  rd_kafka_conf_set(kc, "broker.address.family", "v4", err, sizeof(err));
  rk = rd_kafka_new(RD_KAFKA_CONSUMER, kc, err, sizeof(err));
  np = end_offsets(rk, topic, hi, 64);
  parts = rd_kafka_topic_partition_list_new(np);
  for (int p = 0; p < np; p++)
    rd_kafka_topic_partition_list_add(parts, topic, p);
  if (rd_kafka_committed(rk, parts, 10000)) {
    fprintf(stderr, "bench_consume: could not read committed offsets\n");
    exit(1);
  }
  for (int p = 0; p < np; p++) {
    if (parts->elems[p].offset != hi[p]) {
      fprintf(stderr,
              "bench_consume: %s[%d] committed %lld, end %lld: not every "
              "record was committed\n",
              topic, p, (long long)parts->elems[p].offset, (long long)hi[p]);
      exit(1);
    }
  }
  rd_kafka_topic_partition_list_destroy(parts);
  rd_kafka_destroy(rk);
}

/* How many records the partitions other than key-0000's hold. */
static long healthy_records(const char *bootstrap, const char *topic) {
  char err[512];
  rd_kafka_conf_t *kc = rd_kafka_conf_new();
  rd_kafka_t *rk;
  int64_t hi[64];
  long sum = 0;
  int np, pp;
  rd_kafka_conf_set(kc, "bootstrap.servers", bootstrap, err, sizeof(err));
  rd_kafka_conf_set(kc, "broker.address.family", "v4", err, sizeof(err));
  rk = rd_kafka_new(RD_KAFKA_CONSUMER, kc, err, sizeof(err));
  np = end_offsets(rk, topic, hi, 64);
  pp = rd_kafka_msg_partitioner_consistent_random(NULL, "key-0000", 8, np, NULL,
                                                  NULL);
  for (int p = 0; p < np; p++)
    if (p != pp)
      sum += (long)hi[p];
  rd_kafka_destroy(rk);
  return sum;
}

static const char *bench_bootstrap;

static int telemetry_off; /* the next prosody run has telemetry off */

static double run_prosody(const char *topic, long n, int rep) {
  char err[1024], group[64];
  prosody_config_t *conf = prosody_config_new();
  prosody_client_t *c;
  prosody_handler_t h = {poison_mode  ? poisoned
                         : with_state ? counting
                                      : noop,
                         NULL, NULL, 0};
  char dlq[96];
  snprintf(group, sizeof(group), "bench-prosody-%s-%d", topic, rep);
  if (poison_mode) {
    snprintf(dlq, sizeof(dlq), "%s-dlq", topic);
    prosody_config_set(conf, "mode", poison_mode, err, sizeof(err));
    prosody_config_set(conf, "failure_topic", dlq, err, sizeof(err));
    prosody_config_set(conf, "defer_enabled", "false", err, sizeof(err));
    prosody_config_set(conf, "shutdown_timeout", "2s", err, sizeof(err));
  }
  bench_target(conf, real_bootstrap);
  if (over_sasl_ssl)
    sasl_ssl_target(conf);
  if (telemetry_off)
    prosody_config_set(conf, "telemetry_enabled", "false", err, sizeof(err));
  prosody_config_set(conf, "group_id", group, err, sizeof(err));
  prosody_config_set(conf, "subscribed_topics", topic, err, sizeof(err));
  prosody_config_set(conf, "log", poison_mode ? "error" : "warn", err,
                     sizeof(err));
  if (getenv("BENCH_CASSANDRA")) {
    prosody_config_set(conf, "cassandra_nodes", getenv("BENCH_CASSANDRA"), err,
                       sizeof(err));
    prosody_config_set(conf, "cassandra_keyspace", "prosody_bench", err,
                       sizeof(err));
  }
  if (getenv("BENCH_SET")) { /* name=value;name=value */
    char *opts = strdup(getenv("BENCH_SET")), *save = NULL;
    for (char *o = opts ? strtok_r(opts, ";", &save) : NULL; o;
         o = strtok_r(NULL, ";", &save)) {
      char *eq = strchr(o, '=');
      if (!eq)
        continue;
      *eq = '\0';
      if (prosody_config_set(conf, o, eq + 1, err, sizeof(err)))
        fprintf(stderr, "BENCH_SET %s: %s\n", o, err);
    }
    free(opts);
  }
  if (with_state) {
    prosody_state_def_t def = PROSODY_STATE_DEF_INIT;
    def.name = "count";
    if (prosody_config_add_state(conf, &def, err, sizeof(err))) {
      fprintf(stderr, "state: %s\n", err);
      exit(1);
    }
  }
  if (getenv("BENCH_MAX_CONCURRENCY"))
    prosody_config_set(conf, "max_concurrency", getenv("BENCH_MAX_CONCURRENCY"),
                       err, sizeof(err));
  if (getenv("BENCH_MAX_UNCOMMITTED"))
    prosody_config_set(conf, "max_uncommitted", getenv("BENCH_MAX_UNCOMMITTED"),
                       err, sizeof(err));
  c = prosody_client_new(conf, err, sizeof(err));
  atomic_store(&pr_got, 0);
  atomic_store(&healthy_got, 0);
  atomic_store(&healthy_first, 0);
  if (!c || prosody_subscribe(c, &h, err, sizeof(err))) {
    fprintf(stderr, "prosody: %s\n", err);
    exit(1);
  }
  if (poison_mode) {
    while (atomic_load(&healthy_got) < healthy_want)
      usleep(1000);
    last_cpu_us = (bench_cpu_s() - atomic_load(&healthy_cpu0)) * 1e6 /
                  (double)healthy_want; /* the failing key's work included */
    prosody_client_destroy(c);
    return (double)healthy_want /
           (atomic_load(&healthy_last) - atomic_load(&healthy_first));
  }
  while (atomic_load(&pr_got) < n)
    usleep(1000);
  last_cpu_us = (bench_cpu_s() - atomic_load(&pr_cpu0)) * 1e6 / (double)n;
  prosody_client_destroy(c); /* unsubscribes: commits what finished */
  verify_committed(bench_bootstrap, topic, group);
  return (double)n / (atomic_load(&pr_last) - atomic_load(&pr_first));
}

/* CPU per record (us) of raw librdkafka producing `n` telemetry-sized
 * records over 1 000 keys, flush included, with the settings of the
 * telemetry producer (src/kafka/telemetry.c). */
static double telemetry_floor_us(const char *bootstrap, long n) {
  static const char ev[] =
      "{\"type\":\"prosody.message.succeeded\",\"eventTime\":\"2026-12-05T08:"
      "00:00.000Z\",\"topic\":\"bench-consume-uniform\",\"partition\":3,"
      "\"offset\":123456,\"key\":\"key-0042\",\"source\":\"bench-prosody-"
      "bench-consume-uniform-0\",\"hostname\":\"localhost\",\"demandType\":"
      "\"normal\"}";
  const char *settings[][2] = {{"linger.ms", "100"},
                               {"acks", "1"},
                               {"enable.idempotence", "false"},
                               {"delivery.report.only.error", "true"},
                               {"queue.buffering.max.messages", "100000"}};
  char err[512], key[16];
  rd_kafka_conf_t *kc = rd_kafka_conf_new();
  rd_kafka_t *rk;
  double cpu0;
  rd_kafka_conf_set(kc, "bootstrap.servers", bootstrap, err, sizeof(err));
  for (size_t i = 0; i < sizeof(settings) / sizeof(settings[0]); i++)
    rd_kafka_conf_set(kc, settings[i][0], settings[i][1], err, sizeof(err));
  if (!(rk = rd_kafka_new(RD_KAFKA_PRODUCER, kc, err, sizeof(err)))) {
    fprintf(stderr, "bench_consume: producer: %s\n", err);
    exit(1);
  }
  cpu0 = bench_cpu_s();
  for (long i = 0; i < n; i++) {
    int kl = snprintf(key, sizeof(key), "key-%04ld", i % 1000);
    while (rd_kafka_producev(rk, RD_KAFKA_V_TOPIC("bench-telemetry-floor"),
                             RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                             RD_KAFKA_V_KEY(key, (size_t)kl),
                             RD_KAFKA_V_VALUE((void *)ev, sizeof(ev) - 1),
                             RD_KAFKA_V_END))
      rd_kafka_poll(rk, 1); /* full: wait, unlike telemetry, to count all */
    if ((i & 1023) == 0)
      rd_kafka_poll(rk, 0);
  }
  rd_kafka_flush(rk, 60000);
  cpu0 = (bench_cpu_s() - cpu0) * 1e6 / (double)n;
  rd_kafka_destroy(rk);
  return cpu0;
}

/* Runs prosody twice per repetition, with *flag 0 (into a) and 1 (into
 * b), the order alternating; rates and CPU per record sorted (medians at
 * reps / 2). CPU per record too: on a machine busy with other work the
 * rates swing, the CPU each record costs much less. */
static void run_pair(const char *topic, long n, int reps, int *flag,
                     const char *a_name, double *a, double *a_cpu,
                     const char *b_name, double *b, double *b_cpu) {
  for (int r = 0; r < reps; r++) {
    for (int i = 0; i < 2; i++) {
      *flag = (r + i) % 2; /* the order alternates */
      (*flag ? b : a)[r] = run_prosody(topic, n, 2 * r + i);
      (*flag ? b_cpu : a_cpu)[r] = last_cpu_us;
    }
    *flag = 0;
    fprintf(stderr,
            "  run %d: %s %.0f msg/s (%.2f us CPU/record), %s %.0f msg/s "
            "(%.2f us)\n",
            r, a_name, a[r], a_cpu[r], b_name, b[r], b_cpu[r]);
  }
  qsort(a, (size_t)reps, sizeof(double), bench_cmp_double);
  qsort(b, (size_t)reps, sizeof(double), bench_cmp_double);
  qsort(a_cpu, (size_t)reps, sizeof(double), bench_cmp_double);
  qsort(b_cpu, (size_t)reps, sizeof(double), bench_cmp_double);
}

int main(int argc, char **argv) {
  long n = argc > 1 ? atol(argv[1]) : 200000;
  int reps = argc > 2 ? atoi(argv[2]) : 3;
  char bootstrap[256], err[512], topic[64];
  double raw[16], pr[16], raw_cpu[16], pr_cpu[16];
  if (reps < 1 || reps > 16 || n < 1)
    return 2;
  const char *dist = argc > 3 ? argv[3] : "uniform";
  const char *where = "", *suffix = "";
  zipf = !strcmp(dist, "zipf");
  if (zipf)
    zipf_init();
  real_bootstrap = getenv("BENCH_BOOTSTRAP");
  if (getenv("BENCH_KEYS") && atol(getenv("BENCH_KEYS")) > 0)
    uniform_keys = atol(getenv("BENCH_KEYS"));
  if (real_bootstrap) {
    snprintf(bootstrap, sizeof(bootstrap), "%s", real_bootstrap);
    snprintf(topic, sizeof(topic), "bench-consume-%s-%ld", dist,
             (long)time(NULL));
    bench_real_topic(real_bootstrap, topic, 1);
    where = "real-";
  } else {
    prosody_mock_bootstrap_servers(bootstrap, sizeof(bootstrap), err,
                                   sizeof(err));
    snprintf(topic, sizeof(topic), "bench-consume-%s", dist);
  }
  bench_bootstrap = bootstrap;
  poison_mode = getenv("BENCH_POISON");
  if (poison_mode && !real_bootstrap) /* a topic of its own */
    snprintf(topic, sizeof(topic), "bench-consume-%s-poison-%s", dist,
             poison_mode);
  produce(topic, n); /* 4 partitions, 1000 keys */
  if (poison_mode)
    healthy_want = healthy_records(bootstrap, topic);
  if (getenv("BENCH_TELEMETRY") && !strcmp(getenv("BENCH_TELEMETRY"), "pair")) {
    double on[16], off[16], on_cpu[16], off_cpu[16], floor_us;
    run_pair(topic, n, reps, &telemetry_off, "telemetry on", on, on_cpu, "off",
             off, off_cpu);
    floor_us = telemetry_floor_us(bootstrap, 2 * n);
    printf("bench consume-telemetry-%s%s %.0f msg/s ratio=%.3f off=%.0f "
           "cpu=%.2fus/record off_cpu=%.2fus/record "
           "producer_floor=%.2fus/event cpu_bound_ratio_max=%.3f (no-op "
           "handler, telemetry on against off)\n",
           where, dist, on[reps / 2], on[reps / 2] / off[reps / 2],
           off[reps / 2], on_cpu[reps / 2], off_cpu[reps / 2], floor_us,
           off_cpu[reps / 2] / (off_cpu[reps / 2] + 2 * floor_us));
    if (real_bootstrap)
      bench_real_topic(real_bootstrap, topic, 0);
    return 0;
  }
  if (getenv("BENCH_STATE") && !strcmp(getenv("BENCH_STATE"), "pair")) {
    double st[16], plain[16], st_cpu[16], plain_cpu[16];
    /* mock mode keeps state in memory whatever BENCH_CASSANDRA says */
    const char *store =
        real_bootstrap && getenv("BENCH_CASSANDRA") ? "-cassandra" : "";
    run_pair(topic, n, reps, &with_state, "no-op", plain, plain_cpu,
             "keyed state", st, st_cpu);
    printf("bench consume-state%s-%s%s %.0f msg/s ratio=%.3f noop=%.0f "
           "cpu=%.2fus/record noop_cpu=%.2fus/record (a keyed-state counter "
           "per key: GET and SET per record, stored with the success, "
           "against the no-op handler)\n",
           store, where, dist, st[reps / 2], st[reps / 2] / plain[reps / 2],
           plain[reps / 2], st_cpu[reps / 2], plain_cpu[reps / 2]);
    if (real_bootstrap)
      bench_real_topic(real_bootstrap, topic, 0);
    return 0;
  }
  if (real_bootstrap && getenv("BENCH_SECURITY") &&
      !strcmp(getenv("BENCH_SECURITY"), "pair")) {
    double tls[16], plain[16], tls_cpu[16], plain_cpu[16];
    run_pair(topic, n, reps, &over_sasl_ssl, "PLAINTEXT", plain, plain_cpu,
             "SASL_SSL", tls, tls_cpu);
    printf("bench consume-sasl_ssl-real-%s %.0f msg/s ratio=%.3f "
           "plaintext=%.0f cpu=%.2fus/record plaintext_cpu=%.2fus/record "
           "(no-op handler, SASL_SSL SCRAM-SHA-512 against PLAINTEXT)\n",
           dist, tls[reps / 2], tls[reps / 2] / plain[reps / 2],
           plain[reps / 2], tls_cpu[reps / 2], plain_cpu[reps / 2]);
    bench_real_topic(real_bootstrap, topic, 0);
    return 0;
  }
  if (getenv("BENCH_TELEMETRY") && !strcmp(getenv("BENCH_TELEMETRY"), "off")) {
    telemetry_off = 1;
    suffix = "-telemetry-off";
  }
  for (int r = 0; r < reps; r++) {
    if (getenv("BENCH_SKIP_RAW")) {
      raw[r] = pr[r] = run_prosody(topic, n, r);
      raw_cpu[r] = pr_cpu[r] = last_cpu_us;
    } else if (r % 2) {
      pr[r] = run_prosody(topic, n, r);
      pr_cpu[r] = last_cpu_us;
      raw[r] = run_raw(bootstrap, topic, n, r);
      raw_cpu[r] = last_cpu_us;
    } else {
      raw[r] = run_raw(bootstrap, topic, n, r);
      raw_cpu[r] = last_cpu_us;
      pr[r] = run_prosody(topic, n, r);
      pr_cpu[r] = last_cpu_us;
    }
    fprintf(stderr,
            "  run %d: raw %.0f msg/s (%.2f us CPU/record), prosody %.0f msg/s "
            "(%.2f us)\n",
            r, raw[r], raw_cpu[r], pr[r], pr_cpu[r]);
  }
  qsort(raw, (size_t)reps, sizeof(double), bench_cmp_double);
  qsort(pr, (size_t)reps, sizeof(double), bench_cmp_double);
  qsort(raw_cpu, (size_t)reps, sizeof(double), bench_cmp_double);
  qsort(pr_cpu, (size_t)reps, sizeof(double), bench_cmp_double);
  if (real_bootstrap)
    bench_real_topic(real_bootstrap, topic, 0);
  if (poison_mode) { /* the raw rate is a note: its row is the no-op's */
    printf("bench consume-poisoned-%s-%s%s %.0f msg/s ratio=%.3f raw=%.0f "
           "(the other partitions, while key-0000 fails for ever)\n",
           poison_mode, where, dist, pr[reps / 2], pr[reps / 2] / raw[reps / 2],
           raw[reps / 2]);
  } else {
    printf("bench consume-raw-%s%s%s %.0f msg/s ratio=1.000 "
           "cpu=%.2fus/record\n",
           where, dist, suffix, raw[reps / 2], raw_cpu[reps / 2]);
    printf("bench consume-noop-%s%s%s %.0f msg/s ratio=%.3f "
           "committed=verified cpu=%.2fus/record\n",
           where, dist, suffix, pr[reps / 2], pr[reps / 2] / raw[reps / 2],
           pr_cpu[reps / 2]);
  }
  fprintf(stderr,
          "consume: %ld records x %d runs (median); prosody no-op handler "
          "%.0f msg/s vs raw librdkafka %.0f msg/s = %.2fx\n",
          n, reps, pr[reps / 2], raw[reps / 2], pr[reps / 2] / raw[reps / 2]);
  return 0;
}
