/*
 * bench_blocked.c - resident memory behind one blocked key.
 *
 *   bench_blocked [records_behind]     (default 200 000)
 *
 * Against the real broker BENCH_BOOTSTRAP (a fresh topic; what the run
 * measures there is our process alone), else the embedded mock cluster
 * (whose records live in this process too, so its RSS hides most of what
 * a paused partition saves). Partition 0 of a 4-partition topic holds a
 * record of the key "blocked" and then `records_behind` records of other
 * keys; partitions 1-3 hold 50 000 records each. The handler of "blocked"
 * does not return until the end of the run, so partition 0 fills its
 * offset window and stops; the other partitions flow (1 ms per record, 32
 * at a time: about 5 s). The resident set is
 * sampled when 50 000 records have been handled and again once every
 * record of partitions 1-3 has been handled and 3 s more have passed
 * (librdkafka would go on prefetching a partition that is merely not
 * read, up to queued.max.messages.kbytes, 64 MiB by default).
 *
 * Prints "bench blocked_rss_growth RATIO x ratio=RATIO" (end / after 50 000
 * records; the target is at most 1.25) and the MiB at both points.
 */
#include <librdkafka/rdkafka.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "prosody.h"

#define OTHERS 50000 /* per partition 1-3 */

static atomic_long handled, handled_others;
static atomic_int finish;

static prosody_result_t on_message(prosody_context_t *ctx,
                                   const prosody_message_t *m, void *op) {
  if (!strcmp(prosody_message_key(m), "blocked")) {
    while (!atomic_load(&finish) && !prosody_wait_cancel(ctx, 50))
      ;
    return PROSODY_SUCCESS;
  }
  if (prosody_message_partition(m) != 0) {
    usleep(1000); /* so that they flow for seconds, not a fraction of one */
    atomic_fetch_add(&handled_others, 1);
  }
  atomic_fetch_add(&handled, 1);
  return PROSODY_SUCCESS;
}

static void produce(const char *bootstrap, const char *topic, long behind) {
  char err[512], key[32], buf[200];
  rd_kafka_conf_t *kc = rd_kafka_conf_new();
  rd_kafka_t *rk;
  rd_kafka_conf_set(kc, "bootstrap.servers", bootstrap, err, sizeof(err));
  rd_kafka_conf_set(kc, "broker.address.family", "v4", err, sizeof(err));
  rd_kafka_conf_set(kc, "linger.ms", "5", err, sizeof(err));
  rd_kafka_conf_set(kc, "queue.buffering.max.messages", "1000000", err,
                    sizeof(err));
  if (!(rk = rd_kafka_new(RD_KAFKA_PRODUCER, kc, err, sizeof(err)))) {
    fprintf(stderr, "bench_blocked: %s\n", err);
    exit(1);
  }
  for (int p = 0; p < 4; p++) {
    long n = p == 0 ? behind + 1 : OTHERS;
    for (long i = 0; i < n; i++) {
      if (p == 0 && i == 0)
        snprintf(key, sizeof(key), "blocked");
      else
        snprintf(key, sizeof(key), "p%d-k%ld", p, i % 100);
      bench_order_json(buf, sizeof(buf), i, key);
      while (rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(topic),
                               RD_KAFKA_V_PARTITION(p),
                               RD_KAFKA_V_KEY(key, strlen(key)),
                               RD_KAFKA_V_VALUE(buf, strlen(buf)),
                               RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                               RD_KAFKA_V_END) == RD_KAFKA_RESP_ERR__QUEUE_FULL)
        rd_kafka_poll(rk, 10);
    }
  }
  rd_kafka_flush(rk, 60000);
  rd_kafka_destroy(rk);
}

int main(int argc, char **argv) {
  long behind = argc > 1 ? atol(argv[1]) : 200000;
  char bootstrap[256], err[512], topic[64];
  const char *real = getenv("BENCH_BOOTSTRAP");
  prosody_config_t *conf;
  prosody_handler_t h = {on_message, NULL, NULL, 0};
  prosody_client_t *c;
  long at50k = -1, end, peak = 0;
  double t0;

  if (behind < 1)
    return 2;
  snprintf(topic, sizeof(topic), "bench-blocked-%ld", (long)getpid());
  if (real) {
    snprintf(bootstrap, sizeof(bootstrap), "%s", real);
    bench_real_topic(real, topic, 1);
  } else {
    prosody_mock_bootstrap_servers(bootstrap, sizeof(bootstrap), err,
                                   sizeof(err));
  }
  produce(bootstrap, topic, behind);

  conf = prosody_config_new();
  bench_target(conf, real);
  bench_set(conf, "group_id", "bench-blocked");
  bench_set(conf, "subscribed_topics", topic);
  bench_set(conf, "log", "error");
  bench_set(conf, "mode", "pipeline");
  bench_set(conf, "defer_enabled", "false");
  bench_set(conf, "shutdown_timeout", "2s");
  if (getenv("BENCH_TELEMETRY") && !strcmp(getenv("BENCH_TELEMETRY"), "off"))
    bench_set(conf, "telemetry_enabled", "false");
  if (!(c = prosody_client_new(conf, err, sizeof(err))) ||
      prosody_subscribe(c, &h, err, sizeof(err))) {
    fprintf(stderr, "bench_blocked: %s\n", err);
    return 1;
  }
  t0 = bench_now_s();
  while (atomic_load(&handled_others) < 3L * OTHERS) {
    long r = bench_rss_kib();
    if (r > peak)
      peak = r;
    if (at50k < 0 && atomic_load(&handled) >= 50000)
      at50k = r;
    if (getenv("BENCH_VERBOSE"))
      fprintf(stderr, "%.2f s: %ld handled, rss %.1f MiB\n", bench_now_s() - t0,
              atomic_load(&handled), r / 1024.0);
    if (bench_now_s() - t0 > 300) {
      fprintf(stderr,
              "bench_blocked: %ld of %ld records of partitions 1-3 "
              "handled in 300 s\n",
              atomic_load(&handled_others), 3L * OTHERS);
      return 1;
    }
    usleep(20000);
  }
  for (double t1 = bench_now_s(); bench_now_s() - t1 < 3;) {
    long r = bench_rss_kib();
    if (r > peak)
      peak = r;
    usleep(20000);
  }
  end = bench_rss_kib();
  if (at50k < 0)
    at50k = end;
  printf("bench blocked_rss_growth%s %.3f x ratio=%.3f rss_at_50k_mib=%.1f "
         "rss_end_mib=%.1f rss_peak_mib=%.1f records_behind=%ld "
         "handled=%ld\n",
         real ? "_kafka" : "", (double)end / (double)at50k,
         (double)end / (double)at50k, at50k / 1024.0, end / 1024.0,
         peak / 1024.0, behind, atomic_load(&handled));
  atomic_store(&finish, 1);
  prosody_unsubscribe(c);
  prosody_client_destroy(c);
  if (real)
    bench_real_topic(real, topic, 0);
  return 0;
}
