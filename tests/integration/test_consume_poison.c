/*
 * test_consume_poison.c - backpressure is per partition: one key whose
 * handler fails for ever, or hangs, stops at most its own partition.
 *
 * Four partitions; partition 0 holds the poisoned key (its first record and
 * every 25th after it), the other partitions only healthy keys. Pipeline
 * mode with deferral off and max_uncommitted=16, so the poisoned key alone
 * fills partition 0's budget. For each scenario (failing for ever, hanging):
 *  - every record of partitions 1-3 is handled and committed while the
 *    poisoned key still fails (or hangs);
 *  - timers scheduled by handlers of partitions 1-3 fire meanwhile;
 *  - partition 0 stops taking records: its commit stays before the
 *    poisoned record and no record past its offset window is handled
 *    (memory stays bounded);
 *  - once the key recovers, partition 0 is handled and committed in full
 *    (nothing lost).
 * A third run puts undecodable (keyless) records behind the failing key's
 * first record, past the offset window: partition 0 still stops there,
 * although no event fills its budget.
 * The healthy partitions' rate is printed for the record; speed itself is
 * measured by `make bench`, not asserted here.
 */
#include <pthread.h>
#include <stdatomic.h>

#include "harness.h"

#define NPART 4
#define PER_PART 2500    /* records per partition */
#define KEYS_PER_PART 50 /* healthy keys per partition */
#define POISON_EVERY 25  /* partition 0: the poisoned key's share */
#define MAX_UNCOMMITTED 16

/* WINDOW: the key fails for ever, and the records after its first one are
 * keyless (undecodable, skipped) up to past the offset window: the
 * partition must stop at the window although no event fills its budget. */
enum { FAIL_FOREVER, HANG, WINDOW };
#define WINDOW_GAP (MAX_UNCOMMITTED * 64 + 100)

static int scenario;
static atomic_int poisoned = 1;    /* the key fails (or hangs) while set */
static atomic_int poison_attempts; /* attempts on the poisoned key */
static atomic_int poison_first_off = -1; /* lowest offset of the key seen */
static atomic_int healthy_done;          /* successes in partitions 1-3 */
static atomic_int max_off_p0 = -1;       /* highest offset handled in p0 */
static atomic_int timers_scheduled, timers_fired;
static atomic_int timer_keys[NPART]; /* a timer scheduled for p<P>-k1 */
static _Atomic double healthy_first, healthy_last;
static atomic_uchar handled[NPART][PER_PART]; /* succeeded at least once */
static pthread_mutex_t hang_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t hang_cond = PTHREAD_COND_INITIALIZER;

static const char *poison_key = "p0-k0";

/* Partition 0's record i has no key (WINDOW scenario only). */
static int keyless(int p, int i) {
  return scenario == WINDOW && p == 0 && i >= 1 && i <= WINDOW_GAP;
}

/* Produces PER_PART records into each partition, explicitly partitioned:
 * keys p<P>-k<i>; in partition 0 the poisoned key at offset 0 and every
 * POISON_EVERY records. */
static void produce(const char *topic) {
  char err[512], key[32], value[96];
  rd_kafka_conf_t *kc = rd_kafka_conf_new();
  rd_kafka_t *rk;
  rd_kafka_conf_set(kc, "bootstrap.servers", t_bootstrap(), err, sizeof(err));
  rd_kafka_conf_set(kc, "linger.ms", "5", err, sizeof(err));
  /* Offset i of each partition must be record i (the poisoned key at 0):
   * without idempotence a retried batch (a fresh topic's first produce
   * answered NOT_LEADER, say) can land behind the next one. */
  rd_kafka_conf_set(kc, "enable.idempotence", "true", err, sizeof(err));
  rk = rd_kafka_new(RD_KAFKA_PRODUCER, kc, err, sizeof(err));
  CHECK(rk, "producer: %s", err);
  for (int i = 0; i < PER_PART; i++)
    for (int p = 0; p < NPART; p++) {
      rd_kafka_resp_err_t e;
      if (keyless(p, i))
        key[0] = '\0';
      else if (p == 0 && (scenario == WINDOW ? i == 0 : i % POISON_EVERY == 0))
        snprintf(key, sizeof(key), "%s", poison_key);
      else
        snprintf(key, sizeof(key), "p%d-k%d", p, 1 + i % KEYS_PER_PART);
      snprintf(value, sizeof(value), "{\"p\":%d,\"i\":%d}", p, i);
      while ((e = rd_kafka_producev(
                  rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_PARTITION(p),
                  RD_KAFKA_V_KEY(*key ? key : NULL, strlen(key)),
                  RD_KAFKA_V_VALUE(value, strlen(value)),
                  RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END)) ==
             RD_KAFKA_RESP_ERR__QUEUE_FULL)
        rd_kafka_poll(rk, 10);
      CHECK(!e, "produce: %s", rd_kafka_err2str(e));
    }
  CHECK(rd_kafka_flush(rk, 30000) == 0, "flush");
  rd_kafka_destroy(rk);
}

static prosody_result_t on_message(prosody_context_t *ctx,
                                   const prosody_message_t *m, void *op) {
  int p = prosody_message_partition(m);
  int64_t off = prosody_message_offset(m);
  const char *key = prosody_message_key(m);
  char err[256];
  if (!strcmp(key, poison_key)) {
    int first = atomic_load(&poison_first_off);
    while ((first < 0 || off < first) &&
           !atomic_compare_exchange_weak(&poison_first_off, &first, (int)off))
      ;
    atomic_fetch_add(&poison_attempts, 1);
    if (scenario == HANG) {
      pthread_mutex_lock(&hang_lock);
      while (atomic_load(&poisoned))
        pthread_cond_wait(&hang_cond, &hang_lock);
      pthread_mutex_unlock(&hang_lock);
    } else if (atomic_load(&poisoned)) {
      return PROSODY_TRANSIENT;
    }
  }
  if (p == 0) {
    int seen = atomic_load(&max_off_p0);
    while (off > seen &&
           !atomic_compare_exchange_weak(&max_off_p0, &seen, (int)off))
      ;
  } else {
    double t = t_now();
    double first = 0;
    atomic_compare_exchange_strong(&healthy_first, &first, t);
    atomic_store(&healthy_last, t);
    /* The first time a healthy partition's key p<P>-k1 runs, it schedules
     * a timer two seconds ahead. */
    if (!strcmp(key + strlen(key) - 3, "-k1") &&
        !atomic_exchange(&timer_keys[p], 1)) {
      struct timespec now;
      clock_gettime(CLOCK_REALTIME, &now);
      if (prosody_schedule(ctx, (int64_t)now.tv_sec * 1000 + 2000, err,
                           sizeof(err)) != PROSODY_OK) {
        fprintf(stderr, "schedule: %s\n", err);
        atomic_store(&timer_keys[p], 0);
        return PROSODY_TRANSIENT;
      }
      atomic_fetch_add(&timers_scheduled, 1);
    }
  }
  if (off >= 0 && off < PER_PART && !atomic_exchange(&handled[p][off], 1) &&
      p != 0)
    atomic_fetch_add(&healthy_done, 1);
  return PROSODY_SUCCESS;
}

static prosody_result_t on_timer(prosody_context_t *ctx,
                                 const prosody_timer_t *t, void *op) {
  atomic_fetch_add(&timers_fired, 1);
  return PROSODY_SUCCESS;
}

static void run(int which, const char *name) {
  char topic[128], group[160], err[1024], mu[16];
  int64_t committed[NPART], end[NPART];
  prosody_handler_t h = {on_message, on_timer, NULL, 0};
  prosody_config_t *conf;
  prosody_client_t *c;
  int healthy = (NPART - 1) * PER_PART, attempts;

  scenario = which;
  atomic_store(&poisoned, 1);
  atomic_store(&poison_attempts, 0);
  atomic_store(&poison_first_off, -1);
  atomic_store(&healthy_done, 0);
  atomic_store(&max_off_p0, -1);
  atomic_store(&timers_scheduled, 0);
  atomic_store(&timers_fired, 0);
  atomic_store(&healthy_first, 0);
  for (int p = 0; p < NPART; p++) {
    atomic_store(&timer_keys[p], 0);
    for (int i = 0; i < PER_PART; i++)
      atomic_store(&handled[p][i], 0);
  }
  snprintf(topic, sizeof(topic), "%s", t_topic(name));
  snprintf(group, sizeof(group), "%s-g", topic);
  t_create_topic(topic, NPART);
  produce(topic);

  conf = t_consumer_config(group, topic);
  snprintf(mu, sizeof(mu), "%d", MAX_UNCOMMITTED);
  t_set(conf, "mode", "pipeline");
  t_set(conf, "defer_enabled", "false");
  t_set(conf, "max_uncommitted", mu);
  t_set(conf, "retry_base", "5ms");
  t_set(conf, "max_retry_delay", "20ms");
  t_set(conf, "log", "error"); /* the poisoned key's retries are warnings */
  c = prosody_client_new(conf, err, sizeof(err));
  CHECK(c, "client: %s", err);
  CHECK_OK(prosody_subscribe(c, &h, err, sizeof(err)), err);

  /* Partitions 1-3: every record handled and committed, while the
   * poisoned key still fails (or hangs). */
  CHECK(t_wait_at_least(&healthy_done, healthy, 120),
        "%s: %d of %d records of the healthy partitions handled", name,
        atomic_load(&healthy_done), healthy);
  CHECK(t_wait_committed(group, topic, 0xEu, committed, end, 30),
        "%s: healthy partitions committed %lld/%lld/%lld of "
        "%lld/%lld/%lld",
        name, (long long)committed[1], (long long)committed[2],
        (long long)committed[3], (long long)end[1], (long long)end[2],
        (long long)end[3]);
  /* Their timers fire while partition 0 is backed up. */
  CHECK(atomic_load(&timers_scheduled) == NPART - 1,
        "%s: %d timers scheduled, want %d", name,
        atomic_load(&timers_scheduled), NPART - 1);
  CHECK(t_wait_at_least(&timers_fired, NPART - 1, 30),
        "%s: %d of %d timers of healthy partitions fired while partition 0 "
        "was backed up",
        name, atomic_load(&timers_fired), NPART - 1);
  /* Partition 0 stopped: its commit is held at the poisoned record, and it
   * took no record past its offset window. */
  attempts = atomic_load(&poison_attempts);
  CHECK(attempts >= 1, "%s: the poisoned key never ran", name);
  CHECK(atomic_load(&poison_first_off) == 0,
        "%s: the poisoned key's first record is at offset %d of partition 0, "
        "not 0 (the test's producer reordered)",
        name, atomic_load(&poison_first_off));
  CHECK(committed[0] <= 0,
        "%s: partition 0 committed %lld past the poisoned record at 0", name,
        (long long)committed[0]);
  CHECK(atomic_load(&max_off_p0) < MAX_UNCOMMITTED * 64,
        "%s: partition 0 handled offset %d although its record at 0 is "
        "unfinished: its intake did not stop",
        name, atomic_load(&max_off_p0));
  if (which == FAIL_FOREVER) {
    /* Still failing, not abandoned. */
    CHECK(t_wait_at_least(&poison_attempts, attempts + 3, 10),
          "%s: the poisoned key stopped being retried", name);
  }
  printf("%s: healthy partitions: %d records in %.2f s (%.0f records/s) "
         "while partition 0 was stuck (highest offset handled there %d, %d "
         "attempts on the poisoned key)\n",
         name, healthy,
         atomic_load(&healthy_last) - atomic_load(&healthy_first),
         healthy / (atomic_load(&healthy_last) - atomic_load(&healthy_first)),
         atomic_load(&max_off_p0), atomic_load(&poison_attempts));

  /* The key recovers: partition 0 is handled and committed in full. */
  pthread_mutex_lock(&hang_lock);
  atomic_store(&poisoned, 0);
  pthread_cond_broadcast(&hang_cond);
  pthread_mutex_unlock(&hang_lock);
  CHECK(t_wait_committed(group, topic, ~0u, committed, end, 60),
        "%s: after recovery partition 0 committed %lld of %lld", name,
        (long long)committed[0], (long long)end[0]);
  for (int i = 0; i < PER_PART; i++)
    CHECK(keyless(0, i) || atomic_load(&handled[0][i]),
          "%s: partition 0 offset %d was never handled", name, i);
  CHECK_OK(prosody_unsubscribe(c), "unsubscribe");
  prosody_client_destroy(c);
}

T_SCENARIO(failing_key_stops_only_its_partition, T_BOTH, 180) {
  run(FAIL_FOREVER, "poison-failing");
  return 0;
}

T_SCENARIO(hanging_key_stops_only_its_partition, T_BOTH, 180) {
  run(HANG, "poison-hanging");
  return 0;
}

/* Undecodable records behind the failing key's first record, past the
 * offset window: partition 0 still stops there. */
T_SCENARIO(keyless_records_past_window_do_not_unstop_partition, T_BOTH, 180) {
  run(WINDOW, "poison-window");
  return 0;
}
