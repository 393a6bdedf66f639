/*
 * test_consume_defer.c - deferred retry (pipeline mode, messages).
 *
 * One partition; 1 000 healthy keys and one failing key ("key-1000", every
 * 200th record) interleaved. While the failing key fails:
 *  - every healthy record is handled and the partition's committed offset
 *    reaches its end (the failing key does not hold it);
 *  - only the failing key's first message is attempted (its later ones wait
 *    behind it, in order), again and again, with deferred-retry delays of
 *    whole seconds that grow from defer_base up to defer_max_delay.
 * Then the consumer is replaced by another of the group (a restart: the
 * defer queue is in the store: memory in mock mode, Cassandra in the real
 * tier) and more records arrive, the failing key's among them: they join
 * its queue, and the new consumer retries the same first message. Once the
 * fault clears, every message of the key is handled exactly once, in
 * order.
 *
 * The same for timers: a key whose first timer fails keeps its later
 * timers behind it (they are deferred as they fire) while the other keys'
 * timers fire; once it recovers its timers run once each, in order.
 *
 * A deferred key that gets no new record is retried by the next consumer
 * all the same (its retry timer names it; mock mode: the store's list).
 *
 * In the real tier, deferred messages deleted from the partition (as by
 * retention) are skipped by the next consumer, and the key is free again.
 *
 * A failure storm (every record failing, above defer_failure_threshold):
 * nothing is deferred, failures are retried in place and the partition's
 * commit stays put; when the storm ends the backlog drains, and once the
 * failures leave defer_failure_window a new failure is deferred again.
 */
#include <pthread.h>
#include <stdatomic.h>

#include "config/config.h"
#include "harness.h"

#define N1 2000 /* records before the restart */
#define N2 400  /* after it */
#define BAD 1000
#define BAD_EVERY 200
#define MAX_TRIES 64

static atomic_int faulty = 1, storm = 0, healthy;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
/* guarded by lock: the failing key's attempts (seq, time) and the seqs
 * of its successes in handling order */
static int tried_seq[MAX_TRIES], tries;
static double tried_at[MAX_TRIES];
static int done_seq[64], dones;
static int storm_seen[4096]; /* storm run: attempts per seq */

static int seq_of(const prosody_message_t *m) {
  const char *s = strstr(prosody_message_payload(m), "\"seq\":");
  return s ? atoi(s + 6) : -1;
}

static prosody_result_t on_message(prosody_context_t *ctx,
                                   const prosody_message_t *m, void *op) {
  int seq = seq_of(m);
  (void)ctx;
  (void)op;
  if (strcmp(prosody_message_key(m), "key-1000")) {
    atomic_fetch_add(&healthy, 1);
    return PROSODY_SUCCESS;
  }
  pthread_mutex_lock(&lock);
  if (atomic_load(&faulty)) {
    if (tries < MAX_TRIES) {
      tried_seq[tries] = seq;
      tried_at[tries] = t_now();
    }
    tries++;
    pthread_mutex_unlock(&lock);
    return PROSODY_TRANSIENT;
  }
  if (dones < 64)
    done_seq[dones] = seq;
  dones++;
  pthread_mutex_unlock(&lock);
  return PROSODY_SUCCESS;
}

static int tries_now(void) {
  int n;
  pthread_mutex_lock(&lock);
  n = tries;
  pthread_mutex_unlock(&lock);
  return n;
}

static int wait_tries(int want, double seconds) {
  double deadline = t_now() + seconds;
  while (tries_now() < want && t_now() < deadline)
    usleep(20000);
  return tries_now() >= want;
}

static prosody_client_t *consume_with(const char *group, const char *topic,
                                      prosody_handler_t *h, const char *window,
                                      const char *threshold,
                                      const pr__test_opts_t *test, int dedup,
                                      int probe) {
  char err[1024];
  prosody_config_t *conf = t_consumer_config(group, topic);
  prosody_client_t *c;
  if (test)
    pr__config_set_test(conf, test);
  if (!dedup) /* what the defer layer does alone */
    t_set(conf, "idempotence_cache_size", "0");
  if (probe)
    t_set(conf, "probe_port", "0"); /* any free port */
  t_set(conf, "mode", "pipeline");
  t_set(conf, "defer_base", "1s");
  t_set(conf, "defer_max_delay", "3s");
  t_set(conf, "defer_failure_window", window);
  t_set(conf, "defer_failure_threshold", threshold);
  t_set(conf, "retry_base", "100ms");
  t_set(conf, "max_retry_delay", "200ms");
  t_set(conf, "shutdown_timeout", "20s");
  c = prosody_client_new(conf, err, sizeof(err));
  CHECK(c, "client: %s", err);
  CHECK_OK(prosody_subscribe(c, h, err, sizeof(err)), err);
  return c;
}

static prosody_client_t *consume(const char *group, const char *topic,
                                 prosody_handler_t *h, const char *window,
                                 const char *threshold) {
  return consume_with(group, topic, h, window, threshold, NULL, 1, 0);
}

static void stop(prosody_client_t *c) {
  CHECK_OK(prosody_unsubscribe(c), "unsubscribe");
  prosody_client_destroy(c);
}

static void keys_for(int *keys, int from, int to) {
  for (int i = from; i < to; i++)
    keys[i] = i % BAD_EVERY == 7 ? BAD : i % 1000;
}

static void failing_key(void) {
  static int keys[N1 + N2];
  char topic[128], group[160];
  prosody_handler_t h = {on_message, NULL, NULL, 0};
  prosody_client_t *c;
  int64_t committed[1], end[1];
  int n_bad = 0, first_bad = -1, healthy_want = 0;

  snprintf(topic, sizeof(topic), "%s", t_topic("defer"));
  snprintf(group, sizeof(group), "%s-g", topic);
  t_create_topic(topic, 1);
  keys_for(keys, 0, N1 + N2);
  for (int i = 0; i < N1 + N2; i++) {
    if (keys[i] == BAD && first_bad < 0)
      first_bad = i;
    n_bad += keys[i] == BAD;
  }
  healthy_want = N1 + N2 - n_bad;
  t_produce_keyed(topic, 0, N1, keys);

  /* A threshold of 1 defers every failure: a first result that fails
   * would otherwise be 100% of the window and retried in place (the
   * storm test below covers the threshold). */
  c = consume(group, topic, &h, "1m", "1.0");
  CHECK(t_wait_at_least(&healthy, N1 - N1 / BAD_EVERY, 60),
        "healthy records handled: %d", atomic_load(&healthy));
  CHECK(t_wait_committed(group, topic, ~0u, committed, end, 60),
        "the failing key holds the partition: committed %lld of %lld",
        (long long)committed[0], (long long)end[0]);
  CHECK(wait_tries(4, 30), "the failing key was tried %d times", tries_now());
  stop(c);

  /* The delays between its attempts: whole seconds in [1, min(2^(n-1),
   * 3)] for retry n, plus the reload's latency (a tick, a fetch). */
  pthread_mutex_lock(&lock);
  for (int i = 0; i < tries && i < MAX_TRIES; i++) {
    CHECK(tried_seq[i] == first_bad,
          "attempt %d was of record %d, not the key's first (%d): its "
          "later messages must wait behind it",
          i, tried_seq[i], first_bad);
    if (i > 0 && i < 4) {
      double gap = tried_at[i] - tried_at[i - 1];
      double most = i == 1 ? 1 : i == 2 ? 2 : 3;
      CHECK(gap >= 0.95 && gap <= most + 1.5,
            "deferred retry %d came %.2fs after the last attempt (want "
            "1..%.0fs)",
            i, gap, most);
    }
  }
  pthread_mutex_unlock(&lock);

  /* Another consumer of the group, more records: the key stays deferred
   * (from the store), its new messages join its queue. */
  t_produce_keyed(topic, N1, N1 + N2, keys);
  {
    int before = tries_now();
    c = consume(group, topic, &h, "1m", "1.0");
    CHECK(t_wait_at_least(&healthy, healthy_want, 60),
          "healthy records handled after the restart: %d of %d",
          atomic_load(&healthy), healthy_want);
    CHECK(t_wait_committed(group, topic, ~0u, committed, end, 60),
          "after the restart the failing key holds the partition: committed "
          "%lld of %lld",
          (long long)committed[0], (long long)end[0]);
    CHECK(wait_tries(before + 1, 30),
          "the new consumer did not retry the deferred key");
  }
  pthread_mutex_lock(&lock);
  for (int i = 0; i < tries && i < MAX_TRIES; i++)
    CHECK(tried_seq[i] == first_bad,
          "after the restart, attempt %d was of record %d, not %d", i,
          tried_seq[i], first_bad);
  pthread_mutex_unlock(&lock);

  /* The fault clears: every message of the key, once, in order. */
  atomic_store(&faulty, 0);
  for (double deadline = t_now() + 60; t_now() < deadline;) {
    int d;
    pthread_mutex_lock(&lock);
    d = dones;
    pthread_mutex_unlock(&lock);
    if (d >= n_bad)
      break;
    usleep(20000);
  }
  CHECK(t_wait_committed(group, topic, ~0u, committed, end, 30),
        "committed %lld of %lld", (long long)committed[0], (long long)end[0]);
  stop(c);
  pthread_mutex_lock(&lock);
  CHECK(dones == n_bad,
        "the failing key's messages were handled %d times "
        "after it recovered, for %d messages",
        dones, n_bad);
  for (int i = 0, want = 0; i < dones && i < 64; i++, want++) {
    while (keys[want] != BAD)
      want++;
    CHECK(done_seq[i] == want,
          "the failing key's message %d was record %d, want %d", i, done_seq[i],
          want);
  }
  pthread_mutex_unlock(&lock);
  printf("failing key: %d attempts while failing, %d messages in order "
         "after, the partition committed throughout\n",
         tries, dones);
}

/* The storm: every record fails while `storm` is set. */
static prosody_result_t on_storm(prosody_context_t *ctx,
                                 const prosody_message_t *m, void *op) {
  int seq = seq_of(m);
  (void)ctx;
  (void)op;
  pthread_mutex_lock(&lock);
  if (seq >= 0 && seq < 4096)
    storm_seen[seq]++;
  pthread_mutex_unlock(&lock);
  if (atomic_load(&storm) || (seq == 1000 && atomic_load(&faulty)))
    return PROSODY_TRANSIENT;
  atomic_fetch_add(&healthy, 1);
  return PROSODY_SUCCESS;
}

static void failure_storm(void) {
  char topic[128], group[160];
  prosody_handler_t h = {on_storm, NULL, NULL, 0};
  prosody_client_t *c;
  int64_t committed[1], end[1];
  int keys[1001];
  double deadline;

  snprintf(topic, sizeof(topic), "%s", t_topic("defer-storm"));
  snprintf(group, sizeof(group), "%s-g", topic);
  t_create_topic(topic, 1);
  for (int i = 0; i < 1001; i++)
    keys[i] = i % 50;
  keys[1000] = 777; /* its own key */
  atomic_store(&storm, 1);
  atomic_store(&faulty, 1);
  atomic_store(&healthy, 0);
  t_produce_keyed(topic, 0, 200, keys);
  c = consume(group, topic, &h, "3s", "0.5");
  /* Every key's first message is retried in place: nothing is deferred,
   * nothing committed. */
  deadline = t_now() + 30;
  for (;;) {
    int again = 0;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < 50; i++)
      again += storm_seen[i] >= 3;
    pthread_mutex_unlock(&lock);
    if (again == 50 || t_now() > deadline)
      break;
    usleep(20000);
  }
  t_committed(group, topic, committed, end);
  CHECK(committed[0] <= 0,
        "during the storm the partition committed up to %lld: a failure "
        "was deferred above defer_failure_threshold",
        (long long)committed[0]);
  pthread_mutex_lock(&lock);
  for (int i = 0; i < 50; i++)
    CHECK(storm_seen[i] >= 3, "key %d's first message was tried %d times", i,
          storm_seen[i]);
  for (int i = 50; i < 200; i++)
    CHECK(storm_seen[i] == 0,
          "record %d of a failing key ran before the key's first", i);
  pthread_mutex_unlock(&lock);

  /* The storm ends: the backlog drains. */
  atomic_store(&storm, 0);
  CHECK(t_wait_committed(group, topic, ~0u, committed, end, 60),
        "after the storm: committed %lld of %lld", (long long)committed[0],
        (long long)end[0]);
  /* Healthy traffic, and one record that fails: once the storm's failures
   * leave the window, it is deferred and the partition commits past it. */
  t_produce_keyed(topic, 200, 1000, keys);
  t_produce_keyed(topic, 1000, 1001, keys);
  CHECK(t_wait_committed(group, topic, ~0u, committed, end, 60),
        "after the storm a new failure was not deferred: committed %lld of "
        "%lld",
        (long long)committed[0], (long long)end[0]);
  atomic_store(&faulty, 0);
  CHECK(t_wait_at_least(&healthy, 1001, 30),
        "the deferred record was not handled once the fault cleared (%d "
        "handled)",
        atomic_load(&healthy));
  stop(c);
  printf("storm: retried in place while above the threshold; deferral "
         "resumed after\n");
}

/* ---- a failing timer ------------------------------------------------ */

#define TIMER_KEYS 50 /* healthy keys, one timer each */
static atomic_int tfaulty = 1, healthy_timers;
static int64_t ttried[MAX_TRIES], tdone[8]; /* guarded by lock */
static double ttried_at[MAX_TRIES];
static int ttries, tdones; /* guarded by lock */

static double wall_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static prosody_result_t on_schedule(prosody_context_t *ctx,
                                    const prosody_message_t *m, void *op) {
  const char *at = strstr(prosody_message_payload(m), "\"at\":");
  char err[256];
  (void)op;
  CHECK(at, "no time in %s", prosody_message_payload(m));
  CHECK_OK(prosody_schedule(ctx, atoll(at + 5), err, sizeof(err)), err);
  return PROSODY_SUCCESS;
}

static prosody_result_t on_timer(prosody_context_t *ctx,
                                 const prosody_timer_t *t, void *op) {
  int64_t when = prosody_timer_time(t);
  (void)ctx;
  (void)op;
  if (strcmp(prosody_timer_key(t), "tk")) {
    atomic_fetch_add(&healthy_timers, 1);
    return PROSODY_SUCCESS;
  }
  pthread_mutex_lock(&lock);
  if (atomic_load(&tfaulty)) {
    if (ttries < MAX_TRIES) {
      ttried[ttries] = when;
      ttried_at[ttries] = wall_s(); /* against the timers' times */
    }
    ttries++;
    pthread_mutex_unlock(&lock);
    return PROSODY_TRANSIENT;
  }
  if (tdones < 8)
    tdone[tdones] = when;
  tdones++;
  pthread_mutex_unlock(&lock);
  return PROSODY_SUCCESS;
}

static void failing_timer(void) {
  char topic[128], group[160], err[1024], key[32], payload[64];
  prosody_handler_t h = {on_schedule, on_timer, NULL, 0};
  prosody_config_t *conf;
  prosody_client_t *c, *p;
  int64_t base = ((int64_t)wall_s() + 2) * 1000;

  snprintf(topic, sizeof(topic), "%s", t_topic("defer-timer"));
  snprintf(group, sizeof(group), "%s-g", topic);
  t_create_topic(topic, 1);
  conf = t_config();
  t_set(conf, "source_system", "test-producer");
  p = prosody_client_new(conf, err, sizeof(err));
  CHECK(p, "producer: %s", err);
  for (int i = 0; i < TIMER_KEYS + 3; i++) {
    int tk = i >= TIMER_KEYS;
    snprintf(key, sizeof(key), tk ? "tk" : "h-%d", i);
    snprintf(payload, sizeof(payload), "{\"at\":%lld}",
             (long long)(base + (tk ? i - TIMER_KEYS : i % 3) * 1000));
    CHECK_OK(prosody_send_async(p, topic, key, payload, NULL, t_ignore_cb, NULL,
                                err, sizeof(err)),
             err);
  }
  prosody_client_destroy(p);

  c = consume(group, topic, &h, "1m", "1.0");
  CHECK(t_wait_at_least(&healthy_timers, TIMER_KEYS, 60),
        "healthy timers fired: %d of %d", atomic_load(&healthy_timers),
        TIMER_KEYS);
  t_wait_locked(&lock, &ttries, 4, 30);
  pthread_mutex_lock(&lock);
  CHECK(ttries >= 4, "the failing timer was tried %d times", ttries);
  for (int i = 0; i < ttries && i < MAX_TRIES; i++) {
    CHECK(ttried[i] == base,
          "attempt %d was of the timer at %lld, not the key's first (%lld): "
          "its later timers must wait behind it",
          i, (long long)ttried[i], (long long)base);
    if (i > 0 && i < 4)
      CHECK(ttried_at[i] - ttried_at[i - 1] >= 0.95,
            "deferred timer retry %d came %.2fs after the last attempt", i,
            ttried_at[i] - ttried_at[i - 1]);
  }
  /* its later timers were due meanwhile: they joined its queue */
  CHECK(ttried_at[3] * 1000 > (double)base + 2500,
        "the test did not outlast the key's later timers");
  pthread_mutex_unlock(&lock);

  atomic_store(&tfaulty, 0);
  t_wait_locked(&lock, &tdones, 3, 30);
  stop(c);
  pthread_mutex_lock(&lock);
  CHECK(tdones == 3,
        "the failing key's timers ran %d times once it "
        "recovered, for 3 timers",
        tdones);
  for (int i = 0; i < 3; i++)
    CHECK(tdone[i] == base + i * 1000, "its timer %d was the one at %lld", i,
          (long long)tdone[i]);
  pthread_mutex_unlock(&lock);
  printf("failing timer: %d attempts while failing, its 3 timers in order "
         "after\n",
         ttries);
}

/* ---- unscheduling a deferred timer ------------------------------------ */

static atomic_int utfault = 1, uttries, ut_base_ran, ut_later_ran;
static atomic_llong ut_base;

/* {"at":T} schedules T for the key, {"un":T} unschedules it. */
static prosody_result_t on_ut_message(prosody_context_t *ctx,
                                      const prosody_message_t *m, void *op) {
  const char *p = prosody_message_payload(m), *at = strstr(p, "\"at\":"),
             *un = strstr(p, "\"un\":");
  char err[256];
  (void)op;
  if (at)
    CHECK_OK(prosody_schedule(ctx, atoll(at + 5), err, sizeof(err)), err);
  if (un)
    CHECK_OK(prosody_unschedule(ctx, atoll(un + 5), err, sizeof(err)), err);
  return PROSODY_SUCCESS;
}

static prosody_result_t on_ut_timer(prosody_context_t *ctx,
                                    const prosody_timer_t *t, void *op) {
  (void)ctx;
  (void)op;
  if (prosody_timer_time(t) != atomic_load(&ut_base)) {
    atomic_fetch_add(&ut_later_ran, 1);
    return PROSODY_SUCCESS;
  }
  if (atomic_load(&utfault)) {
    atomic_fetch_add(&uttries, 1);
    return PROSODY_TRANSIENT;
  }
  atomic_fetch_add(&ut_base_ran, 1);
  return PROSODY_SUCCESS;
}

static void send_to(const char *topic, const char *key, const char *field,
                    int64_t t) {
  char err[1024], payload[64];
  prosody_config_t *conf = t_config();
  prosody_client_t *p;
  t_set(conf, "source_system", "test-producer");
  p = prosody_client_new(conf, err, sizeof(err));
  CHECK(p, "producer: %s", err);
  snprintf(payload, sizeof(payload), "{\"%s\":%lld}", field, (long long)t);
  CHECK_OK(prosody_send(p, topic, key, payload, NULL, err, sizeof(err)), err);
  prosody_client_destroy(p);
}

/* A deferred timer that its key unschedules leaves its defer queue: once
 * the fault clears it does not run, and the key's next timer does. */
static void unscheduled_timer(void) {
  char topic[128], group[160];
  prosody_handler_t h = {on_ut_message, on_ut_timer, NULL, 0};
  prosody_client_t *c;
  int64_t base = ((int64_t)wall_s() + 2) * 1000;

  snprintf(topic, sizeof(topic), "%s", t_topic("defer-unsched"));
  snprintf(group, sizeof(group), "%s-g", topic);
  t_create_topic(topic, 1);
  atomic_store(&ut_base, base);
  send_to(topic, "ut", "at", base);
  c = consume(group, topic, &h, "1m", "1.0");
  CHECK(t_wait_at_least(&uttries, 2, 30),
        "the failing timer was tried %d times", atomic_load(&uttries));
  send_to(topic, "ut", "un", base);
  atomic_store(&utfault, 0);
  send_to(topic, "ut", "at", ((int64_t)wall_s() + 1) * 1000);
  CHECK(t_wait_at_least(&ut_later_ran, 1, 30),
        "the key's next timer did not run");
  stop(c);
  CHECK(atomic_load(&ut_base_ran) == 0,
        "the unscheduled deferred timer ran %d time(s) after its fault "
        "cleared",
        atomic_load(&ut_base_ran));
  printf("unscheduled timer: left its defer queue; the key's next ran\n");
}

/* A deferred timer whose retry unschedules it and fails anyway: the entry
 * its key's queue lost must not come back with the failure's retry count
 * (Cassandra's UPDATE makes a missing row), so the key's next timer runs
 * and the unscheduled one is not tried again. */
static atomic_int su_tries, su_later_ran;
static atomic_llong su_base;

static prosody_result_t on_su_timer(prosody_context_t *ctx,
                                    const prosody_timer_t *t, void *op) {
  char err[256];
  (void)op;
  if (prosody_timer_time(t) != atomic_load(&su_base)) {
    atomic_fetch_add(&su_later_ran, 1);
    return PROSODY_SUCCESS;
  }
  if (atomic_fetch_add(&su_tries, 1) == 1) /* its first deferred retry */
    CHECK_OK(prosody_unschedule(ctx, atomic_load(&su_base), err, sizeof(err)),
             err);
  return PROSODY_TRANSIENT;
}

static void self_unscheduled_timer(void) {
  char topic[128], group[160];
  prosody_handler_t h = {on_ut_message, on_su_timer, NULL, 0};
  prosody_client_t *c;
  int64_t base = ((int64_t)wall_s() + 2) * 1000;

  snprintf(topic, sizeof(topic), "%s", t_topic("defer-selfun"));
  snprintf(group, sizeof(group), "%s-g", topic);
  t_create_topic(topic, 1);
  atomic_store(&su_base, base);
  send_to(topic, "su", "at", base);
  send_to(topic, "su", "at", base + 1000);
  c = consume(group, topic, &h, "1m", "1.0");
  CHECK(t_wait_at_least(&su_later_ran, 1, 30),
        "the key's next timer did not run (the unscheduled one was tried %d "
        "times)",
        atomic_load(&su_tries));
  stop(c);
  CHECK(atomic_load(&su_tries) == 2,
        "the timer that unscheduled itself was tried %d times, want 2",
        atomic_load(&su_tries));
  printf("self-unscheduled timer: not retried after its failing retry; the "
         "key's next ran\n");
}

/* ---- a deferred offset gone from Kafka (real tier) ------------------- */

static atomic_int gfaulty = 1, gtries, gdone_seq = -1;

static prosody_result_t on_gone(prosody_context_t *ctx,
                                const prosody_message_t *m, void *op) {
  (void)ctx;
  (void)op;
  if (strcmp(prosody_message_key(m), "key-7"))
    return PROSODY_SUCCESS;
  if (atomic_load(&gfaulty)) {
    atomic_fetch_add(&gtries, 1);
    return PROSODY_TRANSIENT;
  }
  atomic_store(&gdone_seq, seq_of(m));
  return PROSODY_SUCCESS;
}

/* Deletes every record of partition 0 before `before` (DeleteRecords). */
static void delete_records(const char *topic, int64_t before) {
  char err[512];
  rd_kafka_conf_t *kc = rd_kafka_conf_new();
  rd_kafka_t *rk;
  rd_kafka_topic_partition_list_t *offs, *done;
  rd_kafka_DeleteRecords_t *del;
  rd_kafka_queue_t *q;
  rd_kafka_event_t *ev;
  rd_kafka_conf_set(kc, "bootstrap.servers", t_bootstrap(), err, sizeof(err));
  rk = rd_kafka_new(RD_KAFKA_PRODUCER, kc, err, sizeof(err));
  CHECK(rk, "admin: %s", err);
  offs = rd_kafka_topic_partition_list_new(1);
  rd_kafka_topic_partition_list_add(offs, topic, 0)->offset = before;
  del = rd_kafka_DeleteRecords_new(offs);
  rd_kafka_topic_partition_list_destroy(offs);
  q = rd_kafka_queue_new(rk);
  rd_kafka_DeleteRecords(rk, &del, 1, NULL, q);
  rd_kafka_DeleteRecords_destroy(del);
  ev = rd_kafka_queue_poll(q, 30000);
  CHECK(ev && !rd_kafka_event_error(ev), "DeleteRecords: %s",
        ev ? rd_kafka_event_error_string(ev) : "no answer");
  done =
      (rd_kafka_topic_partition_list_t *)rd_kafka_DeleteRecords_result_offsets(
          rd_kafka_event_DeleteRecords_result(ev));
  CHECK(done && done->cnt == 1 && !done->elems[0].err, "DeleteRecords: %s",
        done && done->cnt ? rd_kafka_err2str(done->elems[0].err) : "?");
  rd_kafka_event_destroy(ev);
  rd_kafka_queue_destroy(q);
  rd_kafka_destroy(rk);
}

/* Two deferred messages of a key are deleted from the partition (as
 * retention would); the next consumer (no message kept in memory) skips
 * both, and the key is not deferred any more: its next message runs. */
static void gone_offset(void) {
  char topic[128], group[160];
  prosody_handler_t h = {on_gone, NULL, NULL, 0};
  prosody_client_t *c;
  int64_t committed[1], end[1];
  int keys[41];

  if (!t_real_bootstrap()) {
    printf("gone offset: real tier only (the mock cluster has no "
           "DeleteRecords)\n");
    return;
  }
  snprintf(topic, sizeof(topic), "%s", t_topic("defer-gone"));
  snprintf(group, sizeof(group), "%s-g", topic);
  t_create_topic(topic, 1);
  for (int i = 0; i < 41; i++)
    keys[i] = i == 3 || i == 20 || i == 40 ? 7 : 100 + i;
  t_produce_keyed(topic, 0, 40, keys);
  c = consume(group, topic, &h, "1m", "1.0");
  CHECK(t_wait_committed(group, topic, ~0u, committed, end, 60),
        "committed %lld of %lld", (long long)committed[0], (long long)end[0]);
  CHECK(t_wait_at_least(&gtries, 1, 30), "key-7 was not tried");
  stop(c);
  delete_records(topic, end[0]);
  atomic_store(&gfaulty, 0);
  t_produce_keyed(topic, 40, 41, keys); /* key-7's next message */
  c = consume(group, topic, &h, "1m", "1.0");
  for (double deadline = t_now() + 60;
       atomic_load(&gdone_seq) < 0 && t_now() < deadline;)
    usleep(20000);
  stop(c);
  CHECK(atomic_load(&gdone_seq) == 40,
        "key-7's next message was not handled (handled: %d): its deferred "
        "messages gone from the partition were not skipped",
        atomic_load(&gdone_seq));
  printf("gone offset: skipped, the key's next message handled\n");
}

/* ---- the store refuses a deferred key's row --------------------------- */

static atomic_int rfault = 1;
static int rdone[16], rdones; /* guarded by lock: "rk" seqs handled */

static prosody_result_t on_refused(prosody_context_t *ctx,
                                   const prosody_message_t *m, void *op) {
  int seq = seq_of(m);
  (void)ctx;
  (void)op;
  if (strcmp(prosody_message_key(m), "key-77"))
    return PROSODY_SUCCESS;
  if (atomic_load(&rfault)) {
    atomic_fetch_add(&gtries, 1);
    return PROSODY_TRANSIENT;
  }
  pthread_mutex_lock(&lock);
  if (rdones < 16)
    rdone[rdones] = seq;
  rdones++;
  pthread_mutex_unlock(&lock);
  return PROSODY_SUCCESS;
}

/* A key is deferred but the store refuses its key row (a test option
 * refuses every such write): its messages' entries are written, yet
 * nothing says the key is deferred. The first message is not committed
 * (it keeps trying to write the row), nor are the key's later ones, and
 * stopping the consumer does not wait for those writes. The next consumer
 * handles the key's messages as usual (redelivered), and when the key is
 * deferred again later, the entries left behind are dropped rather than
 * handled a second time, out of order. Deduplication is off: it would
 * hide a second handling. */
static void refused_key_row(void) {
  char topic[128], group[160];
  prosody_handler_t h = {on_refused, NULL, NULL, 0};
  pr__test_opts_t refuse = {.defer_refuse_rows = 1000000};
  prosody_client_t *c;
  int64_t committed[1], end[1];
  int keys[40], n;
  double t0, took;

  snprintf(topic, sizeof(topic), "%s", t_topic("defer-row"));
  snprintf(group, sizeof(group), "%s-g", topic);
  t_create_topic(topic, 1);
  for (int i = 0; i < 40; i++)
    keys[i] = i == 2 || i == 5 || i == 8 || i == 31 || i == 35 ? 77 : 100 + i;
  atomic_store(&gtries, 0);
  t_produce_keyed(topic, 0, 30, keys);
  /* A threshold of 1: every failure is deferred, whatever ran before. */
  c = consume_with(group, topic, &h, "1m", "1.0", &refuse, 0, 0);
  CHECK(t_wait_at_least(&gtries, 1, 30), "key-77 was not tried");
  /* The healthy records behind it are handled; it holds the commit. */
  for (double deadline = t_now() + 30; t_now() < deadline; usleep(20000)) {
    t_committed(group, topic, committed, end);
    if (committed[0] == 2)
      break;
  }
  CHECK(committed[0] == 2,
        "with its key row refused, the deferred message at offset 2 must "
        "hold the partition's commit: committed %lld",
        (long long)committed[0]);
  t0 = t_now();
  stop(c);
  took = t_now() - t0;
  CHECK(took < 8,
        "stopping took %.1fs: it waited for the refused write (shutdown_"
        "timeout is 20s)",
        took);

  /* The next consumer handles the key's messages as they come. */
  atomic_store(&rfault, 0);
  c = consume_with(group, topic, &h, "1m", "1.0", NULL, 0, 0);
  n = t_wait_locked(&lock, &rdones, 3, 30);
  CHECK(n == 3, "key-77's messages handled: %d of 3", n);
  /* Deferred again, at 31: the entries below it are dropped. */
  atomic_store(&rfault, 1);
  t_produce_keyed(topic, 30, 32, keys);
  CHECK(t_wait_at_least(&gtries, 2, 30), "key-77 was not tried again");
  atomic_store(&rfault, 0);
  t_produce_keyed(topic, 32, 40, keys);
  t_wait_locked(&lock, &rdones, 5, 30);
  CHECK(t_wait_committed(group, topic, ~0u, committed, end, 30),
        "committed %lld of %lld", (long long)committed[0], (long long)end[0]);
  stop(c);
  pthread_mutex_lock(&lock);
  {
    static const int want[] = {2, 5, 8, 31, 35};
    CHECK(rdones == 5, "key-77 was handled %d times for 5 messages", rdones);
    for (int i = 0; i < 5; i++)
      CHECK(rdone[i] == want[i],
            "key-77's handling %d was of record %d, want %d (entries left "
            "by the refused deferral were handled again)",
            i, rdone[i], want[i]);
  }
  pthread_mutex_unlock(&lock);
  printf("refused key row: nothing committed past it, stop in %.1fs, no "
         "stale entry handled later\n",
         took);
}

static atomic_int rtfault = 1;
static int64_t rtdone[8]; /* guarded by lock: "rt" timers handled */
static int rtdones;       /* guarded by lock */

static prosody_result_t on_rt_timer(prosody_context_t *ctx,
                                    const prosody_timer_t *t, void *op) {
  (void)ctx;
  (void)op;
  if (strcmp(prosody_timer_key(t), "rt"))
    return PROSODY_SUCCESS;
  if (atomic_load(&rtfault))
    return PROSODY_TRANSIENT;
  pthread_mutex_lock(&lock);
  if (rtdones < 8)
    rtdone[rtdones] = prosody_timer_time(t);
  rtdones++;
  pthread_mutex_unlock(&lock);
  return PROSODY_SUCCESS;
}

/* prosody_deferred_total from the consumer's /metrics, or -1. */
static long deferred_total(prosody_client_t *c) {
  static char body[1 << 16];
  const char *v;
  if (t_http_get(prosody_probe_port(c), "/metrics", body, sizeof(body)) != 200)
    return -1;
  v = strstr(body, "\nprosody_deferred_total ");
  return v ? atol(v + strlen("\nprosody_deferred_total ")) : -1;
}

/* The same with timers: the key's first timer fails and its row is
 * refused; its later timers fire and join it. None of them may be taken
 * out of the timer store (a joined timer's entry would be all that is
 * left of it, and no key row points at it): the next consumer fires all
 * three, in order. Real tier: timers outlive the consumer in Cassandra. */
static void refused_timer_row(void) {
  char topic[128], group[160], err[1024], payload[64];
  prosody_handler_t h = {on_schedule, on_rt_timer, NULL, 0};
  pr__test_opts_t refuse = {.defer_refuse_rows = 1000000};
  prosody_config_t *conf;
  prosody_client_t *c, *p;
  int64_t base = ((int64_t)wall_s() + 2) * 1000;
  long deferred = -1;

  if (!t_real_bootstrap()) {
    printf("refused timer row: real tier only (mock mode keeps a client's "
           "timers in its own memory: they end with it)\n");
    return;
  }
  snprintf(topic, sizeof(topic), "%s", t_topic("defer-trow"));
  snprintf(group, sizeof(group), "%s-g", topic);
  t_create_topic(topic, 1);
  conf = t_config();
  t_set(conf, "source_system", "test-producer");
  p = prosody_client_new(conf, err, sizeof(err));
  CHECK(p, "producer: %s", err);
  for (int i = 0; i < 3; i++) {
    snprintf(payload, sizeof(payload), "{\"at\":%lld}",
             (long long)(base + i * 1000));
    CHECK_OK(prosody_send(p, topic, "rt", payload, NULL, err, sizeof(err)),
             err);
  }
  prosody_client_destroy(p);

  c = consume_with(group, topic, &h, "1m", "1.0", &refuse, 0, 1);
  for (double deadline = t_now() + 30; t_now() < deadline; usleep(50000))
    if ((deferred = deferred_total(c)) >= 3)
      break;
  CHECK(deferred == 3, "the key's three timers deferred: %ld", deferred);
  stop(c);

  atomic_store(&rtfault, 0);
  c = consume_with(group, topic, &h, "1m", "1.0", NULL, 0, 0);
  t_wait_locked(&lock, &rtdones, 3, 30);
  stop(c);
  pthread_mutex_lock(&lock);
  CHECK(rtdones == 3,
        "the next consumer ran %d of the key's 3 timers (the ones that "
        "joined a key whose row was never written were lost)",
        rtdones);
  for (int i = 0; i < 3; i++)
    CHECK(rtdone[i] == base + i * 1000, "timer %d was the one at %lld", i,
          (long long)rtdone[i]);
  pthread_mutex_unlock(&lock);
  printf("refused timer row: the joined timers were kept; all 3 ran, in "
         "order, on the next consumer\n");
}

/* ---- a deferred key with no new records -------------------------------- */

static atomic_int qfault = 1, qtries;
static int qdone[8], qdones; /* guarded by lock: "key-55" seqs handled */

static prosody_result_t on_quiet(prosody_context_t *ctx,
                                 const prosody_message_t *m, void *op) {
  int seq = seq_of(m);
  (void)ctx;
  (void)op;
  if (strcmp(prosody_message_key(m), "key-55"))
    return PROSODY_SUCCESS;
  if (atomic_load(&qfault)) {
    atomic_fetch_add(&qtries, 1);
    return PROSODY_TRANSIENT;
  }
  pthread_mutex_lock(&lock);
  if (qdones < 8)
    qdone[qdones] = seq;
  qdones++;
  pthread_mutex_unlock(&lock);
  return PROSODY_SUCCESS;
}

/* A key is deferred, every record is committed, and the consumer stops.
 * The next consumer gets no new record of the key, yet retries it: it
 * learns that the key is deferred from the key's retry timer (the
 * original's: type deferred message, in the timer store) as it loads the
 * partition's timers, or (mock mode) from the memory store's list. */
static void quiet_key(void) {
  char topic[128], group[160];
  prosody_handler_t h = {on_quiet, NULL, NULL, 0};
  prosody_client_t *c;
  int64_t committed[1], end[1];
  int keys[20], n;
  static const int want[3] = {2, 5, 8};

  snprintf(topic, sizeof(topic), "%s", t_topic("defer-quiet"));
  snprintf(group, sizeof(group), "%s-g", topic);
  t_create_topic(topic, 1);
  for (int i = 0; i < 20; i++)
    keys[i] = i == 2 || i == 5 || i == 8 ? 55 : 100 + i;
  t_produce_keyed(topic, 0, 20, keys);
  c = consume_with(group, topic, &h, "1m", "1.0", NULL, 0, 0);
  CHECK(t_wait_at_least(&qtries, 1, 30), "key-55 was not tried");
  CHECK(t_wait_committed(group, topic, ~0u, committed, end, 30),
        "the deferred key's records must be committed: %lld of %lld",
        (long long)committed[0], (long long)end[0]);
  stop(c);
  atomic_store(&qfault, 0);
  c = consume_with(group, topic, &h, "1m", "1.0", NULL, 0, 0);
  n = t_wait_locked(&lock, &qdones, 3, 30);
  stop(c);
  CHECK(n == 3,
        "key-55's deferred records handled after the restart: %d of "
        "3 (nothing new arrived for it)",
        n);
  pthread_mutex_lock(&lock);
  for (int i = 0; i < 3; i++)
    CHECK(qdone[i] == want[i], "key-55's handling %d was of record %d, want %d",
          i, qdone[i], want[i]);
  pthread_mutex_unlock(&lock);
  printf("quiet deferred key: retried in order by the next consumer with no "
         "new record of it\n");
}

T_SCENARIO(deferred_key_without_new_records_retried_after_restart, T_BOTH,
           120) {
  quiet_key();
  return 0;
}

T_SCENARIO(refused_key_row_keeps_key_messages_uncommitted_in_order, T_BOTH,
           120) {
  refused_key_row();
  return 0;
}

T_SCENARIO(refused_timer_row_keeps_key_timers_in_store_in_order, T_BOTH, 120) {
  refused_timer_row();
  return 0;
}

T_SCENARIO(unscheduled_deferred_timer_leaves_defer_queue, T_BOTH, 120) {
  unscheduled_timer();
  return 0;
}

T_SCENARIO(timer_unscheduling_itself_in_retry_leaves_defer_queue, T_BOTH, 120) {
  self_unscheduled_timer();
  return 0;
}

T_SCENARIO(failing_key_deferred_partition_moves_key_in_order_across_restart,
           T_BOTH, 180) {
  failing_key();
  return 0;
}

T_SCENARIO(failing_timer_defers_key_timers_others_fire, T_BOTH, 120) {
  failing_timer();
  return 0;
}

/* The mock cluster cannot delete records from a partition. */
T_SCENARIO(deferred_messages_gone_from_partition_skipped, T_REAL, 120) {
  gone_offset();
  return 0;
}

T_SCENARIO(failure_storm_retries_in_place_then_defers_again, T_BOTH, 120) {
  failure_storm();
  return 0;
}
