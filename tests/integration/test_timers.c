/*
 * test_timers.c - per-key timers through the public API: they fire at the
 * right second (absolute and relative times), in time order per key, for
 * every key sharing a second; schedule / unschedule / clear_scheduled /
 * clear_and_schedule / scheduled() semantics (same-second upsert,
 * sub-second rounding, a timer replaced while it fires); a key's timer and
 * messages never overlap, and a message waits for the key's running timer;
 * a transiently failing timer is retried and deleted once it succeeds, and
 * a delete the store refuses is retried before the key's next event;
 * in low-latency mode a timer failing past max_retries is dropped, never
 * sent to the failure topic;
 * 500 timers behind a slow handler all fire under max_uncommitted; a
 * context kept past its handler is refused; bad times are refused with the
 * time named.
 *
 * One consumer runs every scenario but the low-latency and refused-delete
 * ones (their own ctest entries); each has its own keys. A record's payload
 * is a JSON string "<op> <arg>".
 */
#include <pthread.h>

#include "config/config.h"
#include "harness.h"

#define BURST 500
#define MAX_KEYS 1024

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;

/* Everything below is guarded by lock. */
static struct {
  char key[64];
  int busy;
} busy[MAX_KEYS];
static int overlaps;
static char overlap_what[128];

typedef struct fired {
  char key[64];
  int64_t time_ms, at_ms;
} fired_t;
static fired_t fired[4 * BURST];
static int nfired;

static int64_t abs_target, rel_target; /* requested times (ms) */
static char ops_log[2048];             /* scheduled() answers, in order */
static int ops_done;
static char err_negative[512], err_huge[512];
static prosody_err_t code_negative, code_huge;
static prosody_context_t *leaked;
static int leak_ready;
static int g_timer_started, g_timer_ended, g_msg_started_after_timer;
static int g_msg_done;
static int h_attempts, h_success, h_after_done;
static char h_after[128];
static int replace_fires, replace2_fires, replace_before_n = -1;
static char replace_log[512];
static int burst_running, burst_peak;
static int ll_attempts, ll_after_done;
static char ll_after[128];
static int d_fires, d_fires_at_after, d_after_done, d_refused_logs;
static char d_after[128];

/* Marks `key` busy; notes an overlap if it already was. */
static void enter(const char *key) {
  int free_slot = -1;
  pthread_mutex_lock(&lock);
  for (int i = 0; i < MAX_KEYS; i++) {
    if (busy[i].key[0] && !strcmp(busy[i].key, key)) {
      if (busy[i].busy++ && !overlaps++)
        snprintf(overlap_what, sizeof(overlap_what), "key %s", key);
      pthread_mutex_unlock(&lock);
      return;
    }
    if (!busy[i].key[0] && free_slot < 0)
      free_slot = i;
  }
  CHECK(free_slot >= 0, "too many keys");
  snprintf(busy[free_slot].key, sizeof(busy[free_slot].key), "%s", key);
  busy[free_slot].busy = 1;
  pthread_mutex_unlock(&lock);
}

static void leave(const char *key) {
  pthread_mutex_lock(&lock);
  for (int i = 0; i < MAX_KEYS; i++)
    if (!strcmp(busy[i].key, key)) {
      busy[i].busy--;
      break;
    }
  pthread_cond_broadcast(&cond);
  pthread_mutex_unlock(&lock);
}

/* scheduled() as "[t1,t2,...] " (ms relative to `base_ms`) into buf. */
static void scheduled_str(prosody_context_t *ctx, int64_t base_ms, char *buf,
                          size_t size) {
  int64_t *times;
  size_t n;
  char err[512];
  int off = 0;
  prosody_err_t e = prosody_scheduled(ctx, &times, &n, err, sizeof(err));
  if (e) {
    snprintf(buf, size, "error:%s ", prosody_err_name(e));
    return;
  }
  off += snprintf(buf + off, size - (size_t)off, "[");
  for (size_t i = 0; i < n; i++)
    off += snprintf(buf + off, size - (size_t)off, "%s%lld", i ? "," : "",
                    (long long)(times[i] - base_ms));
  snprintf(buf + off, size - (size_t)off, "] ");
  prosody_times_free(times);
}

/* Appends scheduled() to ops_log. */
static void log_scheduled(prosody_context_t *ctx, int64_t base_ms) {
  char buf[256];
  scheduled_str(ctx, base_ms, buf, sizeof(buf));
  pthread_mutex_lock(&lock);
  strncat(ops_log, buf, sizeof(ops_log) - strlen(ops_log) - 1);
  pthread_mutex_unlock(&lock);
}

#define SCHED(ctx, t)                                                          \
  CHECK_OK(prosody_schedule((ctx), (t), err, sizeof(err)), err)

static prosody_result_t on_message(prosody_context_t *ctx,
                                   const prosody_message_t *msg, void *op) {
  const char *key = prosody_message_key(msg);
  char verb[32], err[512];
  long long arg = 0;
  int64_t now = t_wall_ms();
  (void)op;
  CHECK(sscanf(prosody_message_payload(msg), "\"%31s %lld", verb, &arg) >= 1,
        "payload %s", prosody_message_payload(msg));
  enter(key);
  if (!strcmp(verb, "abs")) { /* an absolute time chosen by the test */
    SCHED(ctx, arg);
  } else if (!strcmp(verb, "rel")) { /* relative to now */
    pthread_mutex_lock(&lock);
    rel_target = now + arg;
    pthread_mutex_unlock(&lock);
    SCHED(ctx, now + arg);
  } else if (!strcmp(verb, "three")) { /* out of order: +3 s, +1 s, +2 s */
    SCHED(ctx, now + 3000);
    SCHED(ctx, now + 1000);
    SCHED(ctx, now + 2000);
  } else if (!strcmp(verb, "same")) { /* an absolute second, shared */
    SCHED(ctx, arg);
  } else if (!strcmp(verb, "ops")) {
    /* Whole-second base an hour ahead, so nothing fires meanwhile. */
    int64_t b = (now / 1000 + 3600) * 1000;
    SCHED(ctx, b + 1000);
    SCHED(ctx, b + 2000);
    SCHED(ctx, b + 3000);
    SCHED(ctx, b + 1000);       /* the same second again: one timer */
    SCHED(ctx, b + 1000 + 300); /* rounds down to the same second */
    log_scheduled(ctx, b);      /* [1000,2000,3000] */
    CHECK_OK(prosody_unschedule(ctx, b + 2000, err, sizeof(err)), err);
    log_scheduled(ctx, b); /* [1000,3000] */
    CHECK_OK(prosody_clear_and_schedule(ctx, b + 4600, err, sizeof(err)), err);
    log_scheduled(ctx, b); /* [5000]: 4.6 s rounds up */
    CHECK_OK(prosody_clear_scheduled(ctx, err, sizeof(err)), err);
    log_scheduled(ctx, b); /* [] */
    code_negative =
        prosody_schedule(ctx, -1500, err_negative, sizeof(err_negative));
    code_huge = prosody_schedule(ctx, INT64_C(5000000000000), err_huge,
                                 sizeof(err_huge));
    pthread_mutex_lock(&lock);
    ops_done = 1;
    pthread_cond_broadcast(&cond);
    pthread_mutex_unlock(&lock);
  } else if (!strcmp(verb, "leak")) {
    pthread_mutex_lock(&lock);
    leaked = ctx; /* kept past the handler: must be refused later */
    pthread_mutex_unlock(&lock);
  } else if (!strcmp(verb, "leak2")) { /* runs after "leak" finished */
    pthread_mutex_lock(&lock);
    leak_ready = 1;
    pthread_cond_broadcast(&cond);
    pthread_mutex_unlock(&lock);
  } else if (!strcmp(verb, "replace") || !strcmp(verb, "replace2")) {
    SCHED(ctx, now + 1000);
  } else if (!strcmp(verb, "g1")) {
    SCHED(ctx, now + 1000);
  } else if (!strcmp(verb, "g2")) { /* produced while g's timer runs */
    pthread_mutex_lock(&lock);
    g_msg_started_after_timer = g_timer_ended;
    g_msg_done = 1;
    pthread_cond_broadcast(&cond);
    pthread_mutex_unlock(&lock);
  } else if (!strcmp(verb, "h")) {
    SCHED(ctx, now + 1000);
  } else if (!strcmp(verb, "h-after")) {
    char buf[128];
    scheduled_str(ctx, 0, buf, sizeof(buf));
    pthread_mutex_lock(&lock);
    snprintf(h_after, sizeof(h_after), "%s", buf);
    h_after_done = 1;
    pthread_cond_broadcast(&cond);
    pthread_mutex_unlock(&lock);
  } else if (!strcmp(verb, "ll")) {
    SCHED(ctx, now + 1000);
  } else if (!strcmp(verb, "ll-after")) { /* queued behind the ll timer */
    char buf[128];
    scheduled_str(ctx, 0, buf, sizeof(buf));
    pthread_mutex_lock(&lock);
    snprintf(ll_after, sizeof(ll_after), "%s", buf);
    ll_after_done = 1;
    pthread_cond_broadcast(&cond);
    pthread_mutex_unlock(&lock);
    leave(key);
    prosody_context_set_error(ctx, "dead-lettered on purpose");
    return PROSODY_PERMANENT; /* the failure topic's only record */
  } else if (!strcmp(verb, "burst")) {
    SCHED(ctx, now + 1000);
  } else if (!strcmp(verb, "d")) {
    SCHED(ctx, now + 1000);
  } else if (!strcmp(verb, "d-after")) { /* produced once the timer fired */
    char buf[128];
    scheduled_str(ctx, 0, buf, sizeof(buf));
    pthread_mutex_lock(&lock);
    snprintf(d_after, sizeof(d_after), "%s", buf);
    d_fires_at_after = d_fires;
    d_after_done = 1;
    pthread_cond_broadcast(&cond);
    pthread_mutex_unlock(&lock);
  }
  leave(key);
  return PROSODY_SUCCESS;
}

static prosody_result_t on_timer(prosody_context_t *ctx,
                                 const prosody_timer_t *timer, void *op) {
  const char *key = prosody_timer_key(timer);
  int64_t t = prosody_timer_time(timer), now = t_wall_ms();
  char err[512];
  prosody_result_t r = PROSODY_SUCCESS;
  (void)op;
  enter(key);
  pthread_mutex_lock(&lock);
  if (nfired < (int)(sizeof(fired) / sizeof(fired[0]))) {
    snprintf(fired[nfired].key, sizeof(fired[nfired].key), "%s", key);
    fired[nfired].time_ms = t;
    fired[nfired].at_ms = now;
    nfired++;
  }
  pthread_mutex_unlock(&lock);

  if (!strcmp(key, "replace")) {
    int n;
    pthread_mutex_lock(&lock);
    n = ++replace_fires;
    pthread_mutex_unlock(&lock);
    if (n == 1) {
      int64_t *times;
      size_t cnt;
      /* The firing timer is not "scheduled"... */
      CHECK_OK(prosody_scheduled(ctx, &times, &cnt, err, sizeof(err)), err);
      prosody_times_free(times);
      pthread_mutex_lock(&lock);
      replace_before_n = (int)cnt;
      pthread_mutex_unlock(&lock);
      /* ...and scheduling its own second again makes a new one. */
      SCHED(ctx, t);
      scheduled_str(ctx, t, err, sizeof(err)); /* [0] */
      pthread_mutex_lock(&lock);
      snprintf(replace_log, sizeof(replace_log), "%s", err);
      pthread_mutex_unlock(&lock);
    }
  } else if (!strcmp(key, "replace2")) {
    int n;
    pthread_mutex_lock(&lock);
    n = ++replace2_fires;
    pthread_mutex_unlock(&lock);
    if (n == 1) /* replaced by a later one: fires once more, later */
      CHECK_OK(prosody_clear_and_schedule(ctx, t + 2000, err, sizeof(err)),
               err);
  } else if (!strcmp(key, "g")) {
    pthread_mutex_lock(&lock);
    g_timer_started = 1;
    pthread_cond_broadcast(&cond);
    pthread_mutex_unlock(&lock);
    usleep(1500 * 1000); /* the key's message arrives meanwhile */
    pthread_mutex_lock(&lock);
    g_timer_ended = 1;
    pthread_mutex_unlock(&lock);
  } else if (!strcmp(key, "h")) {
    pthread_mutex_lock(&lock);
    if (++h_attempts < 3)
      r = PROSODY_TRANSIENT;
    else
      h_success = 1;
    pthread_cond_broadcast(&cond);
    pthread_mutex_unlock(&lock);
  } else if (!strcmp(key, "ll")) {
    pthread_mutex_lock(&lock);
    ll_attempts++;
    pthread_cond_broadcast(&cond);
    pthread_mutex_unlock(&lock);
    r = PROSODY_TRANSIENT; /* always */
  } else if (!strcmp(key, "del")) {
    pthread_mutex_lock(&lock);
    d_fires++;
    pthread_cond_broadcast(&cond);
    pthread_mutex_unlock(&lock);
  } else if (!strncmp(key, "burst-", 6)) {
    pthread_mutex_lock(&lock);
    if (++burst_running > burst_peak)
      burst_peak = burst_running;
    pthread_mutex_unlock(&lock);
    usleep(5000); /* slow */
    pthread_mutex_lock(&lock);
    burst_running--;
    pthread_mutex_unlock(&lock);
  }
  leave(key);
  pthread_mutex_lock(&lock);
  pthread_cond_broadcast(&cond);
  pthread_mutex_unlock(&lock);
  return r;
}

/* Fired timers of `key`, into out (up to max); returns the count. */
static int fired_of(const char *key, fired_t *out, int max) {
  int n = 0;
  for (int i = 0; i < nfired; i++)
    if (!strcmp(fired[i].key, key) && n < max)
      out[n++] = fired[i];
  return n;
}

/* `key` fired once, at `requested` rounded to its second, and within a
 * second of that time by the wall clock (lock held). */
static void check_fired_once(const char *key, int64_t requested) {
  fired_t f[8];
  int n = fired_of(key, f, 8);
  CHECK(n == 1, "%s fired %d times", key, n);
  CHECK(f[0].time_ms == (requested + 500) / 1000 * 1000,
        "%s: timer time %lld for requested %lld", key, (long long)f[0].time_ms,
        (long long)requested);
  CHECK(f[0].at_ms >= f[0].time_ms && f[0].at_ms - f[0].time_ms <= 1000,
        "%s fired %lld ms after its time", key,
        (long long)(f[0].at_ms - f[0].time_ms));
}

static int burst_fired(void) {
  int n = 0;
  for (int i = 0; i < nfired; i++)
    n += !strncmp(fired[i].key, "burst-", 6);
  return n;
}

/* Waits (lock held) until `cond_expr` or the deadline. */
#define WAIT_UNTIL(cond_expr, seconds)                                         \
  T_WAIT_UNTIL(cond_expr, &cond, &lock, seconds)

static void produce(const char *topic, const char *key, const char *verb,
                    long long arg) {
  char err[1024], payload[96];
  prosody_config_t *conf = t_config();
  prosody_client_t *client;
  t_set(conf, "source_system", "timer-test");
  client = prosody_client_new(conf, err, sizeof(err));
  CHECK(client, "producer: %s", err);
  snprintf(payload, sizeof(payload), "\"%s %lld\"", verb, arg);
  CHECK_OK(prosody_send(client, topic, key, payload, NULL, err, sizeof(err)),
           err);
  prosody_client_destroy(client);
}

/* One consumer runs the scenarios of the public API at once (each with keys
 * of its own), sharing one group join. */
T_SCENARIO(timers_fire_at_their_second_in_key_order_with_context_rules, T_BOTH,
           120) {
  char err[1024], group[160], key[32], payload[64];
  const char *topic = t_topic("timers");
  prosody_config_t *conf;
  prosody_client_t *client, *prod;
  prosody_handler_t handler = {on_message, on_timer, NULL, 0};
  fired_t f[8];
  int n;
  int64_t same_target;

  snprintf(group, sizeof(group), "%s-group", topic);
  t_create_topic(topic, 4);

  conf = t_consumer_config(group, topic);
  t_set(conf, "max_concurrency", "8");
  t_set(conf, "max_uncommitted", "32");
  t_set(conf, "retry_base", "50ms");
  t_set(conf, "max_retry_delay", "200ms");
  client = prosody_client_new(conf, err, sizeof(err));
  CHECK(client, "client: %s", err);
  CHECK_OK(prosody_subscribe(client, &handler, err, sizeof(err)), err);

  /* All scenarios at once. Absolute targets leave room for the group
   * join (3 s on the mock cluster). */
  abs_target = t_wall_ms() + 9000 + 250; /* a sub-second part: rounds */
  same_target = (t_wall_ms() / 1000 + 9) * 1000;
  conf = t_config();
  t_set(conf, "source_system", "timer-test");
  prod = prosody_client_new(conf, err, sizeof(err));
  CHECK(prod, "producer: %s", err);
#define SEND(k, verb, arg)                                                     \
  do {                                                                         \
    snprintf(payload, sizeof(payload), "\"%s %lld\"", verb, (long long)(arg)); \
    CHECK_OK(prosody_send_async(prod, topic, k, payload, NULL, t_ignore_cb,    \
                                NULL, err, sizeof(err)),                       \
             err);                                                             \
  } while (0)
  SEND("abs", "abs", abs_target);
  SEND("rel", "rel", 2000);
  SEND("three", "three", 0);
  SEND("same-1", "same", same_target);
  SEND("same-2", "same", same_target);
  SEND("ops", "ops", 0);
  SEND("leak", "leak", 0);
  SEND("leak", "leak2", 0);
  SEND("replace", "replace", 0);
  SEND("replace2", "replace2", 0);
  SEND("g", "g1", 0);
  SEND("h", "h", 0);
  for (int i = 0; i < BURST; i++) {
    snprintf(key, sizeof(key), "burst-%d", i);
    SEND(key, "burst", 0);
  }
  prosody_client_destroy(prod);
  CHECK(t_send_failures == 0, "%d sends failed", t_send_failures);

  /* The context operations and their errors. */
  pthread_mutex_lock(&lock);
  WAIT_UNTIL(ops_done, 60);
  CHECK(ops_done, "the ops scenario did not run");
  CHECK(!strcmp(ops_log, "[1000,2000,3000] [1000,3000] [5000] [] "),
        "scheduled() answers: %s", ops_log);
  CHECK(code_negative == PROSODY_ERR_INVALID_ARG &&
            strstr(err_negative, "-1500") &&
            strstr(err_negative, "before the epoch"),
        "negative time: %s: %s", prosody_err_name(code_negative), err_negative);
  CHECK(code_huge == PROSODY_ERR_INVALID_ARG &&
            strstr(err_huge, "5000000000000") && strstr(err_huge, "2106"),
        "huge time: %s: %s", prosody_err_name(code_huge), err_huge);

  /* A kept context is refused once its handler returned. */
  WAIT_UNTIL(leak_ready, 30);
  CHECK(leaked && leak_ready, "the leak scenario did not run");
  {
    /* The key's next message ran, so the first handler had finished. */
    prosody_context_t *kept = leaked;
    prosody_err_t e;
    pthread_mutex_unlock(&lock);
    e = prosody_schedule(kept, t_wall_ms() + 60000, err, sizeof(err));
    CHECK(e == PROSODY_ERR_STATE && strstr(err, "stale"),
          "schedule on a kept context: %s: %s", prosody_err_name(e), err);
    CHECK(prosody_complete(kept, PROSODY_SUCCESS, NULL) == PROSODY_ERR_STATE,
          "complete on a stale context accepted");
    CHECK(prosody_should_cancel(kept) == 1, "stale context not cancelled");
    pthread_mutex_lock(&lock);
  }

  /* A message for g arrives while g's timer runs: it waits for it. */
  WAIT_UNTIL(g_timer_started, 30);
  CHECK(g_timer_started, "g's timer did not fire");
  pthread_mutex_unlock(&lock);
  produce(topic, "g", "g2", 0);
  pthread_mutex_lock(&lock);
  WAIT_UNTIL(g_msg_done, 30);
  CHECK(g_msg_done, "g's second message was not processed");
  CHECK(g_msg_started_after_timer,
        "g's message ran while g's timer was running");

  /* Transient failures are retried; success deletes the timer. */
  WAIT_UNTIL(h_success, 30);
  CHECK(h_success && h_attempts == 3, "h: %d attempts, success %d", h_attempts,
        h_success);
  pthread_mutex_unlock(&lock);
  produce(topic, "h", "h-after", 0);
  pthread_mutex_lock(&lock);
  WAIT_UNTIL(h_after_done, 30);
  CHECK(h_after_done && !strcmp(h_after, "[] "),
        "h's timer still scheduled after success: %s", h_after);

  /* Every timer fires, at its second. */
  /* Every scenario's timers, however the seconds fall (same-1/2 may share
   * abs's second and fire just after it). */
  WAIT_UNTIL(burst_fired() >= BURST && replace2_fires >= 2 &&
                 replace_fires >= 2 && fired_of("abs", f, 8) >= 1 &&
                 fired_of("rel", f, 8) >= 1 && fired_of("three", f, 8) >= 3 &&
                 fired_of("same-1", f, 8) >= 1 && fired_of("same-2", f, 8) >= 1,
             60);
  CHECK(burst_fired() == BURST, "%d of %d burst timers fired", burst_fired(),
        BURST);
  CHECK(burst_peak <= 8, "%d timer handlers ran at once (max_concurrency 8)",
        burst_peak);

  check_fired_once("abs", abs_target);
  check_fired_once("rel", rel_target);

  n = fired_of("three", f, 8);
  CHECK(n == 3, "three fired %d times", n);
  CHECK(f[0].time_ms < f[1].time_ms && f[1].time_ms < f[2].time_ms,
        "three fired out of order: %lld %lld %lld", (long long)f[0].time_ms,
        (long long)f[1].time_ms, (long long)f[2].time_ms);

  CHECK(fired_of("same-1", f, 8) == 1 && f[0].time_ms == same_target,
        "same-1 did not fire once at its second");
  CHECK(fired_of("same-2", f, 8) == 1 && f[0].time_ms == same_target,
        "same-2 did not fire once at its second");

  /* Replaced while firing: its own second again fires once more. */
  CHECK(replace_before_n == 0, "the firing timer was listed as scheduled");
  CHECK(!strcmp(replace_log, "[0] "), "after re-scheduling: %s", replace_log);
  WAIT_UNTIL(replace_fires >= 2, 10);
  n = fired_of("replace", f, 8);
  CHECK(n == 2 && f[0].time_ms == f[1].time_ms, "replace fired %d times", n);
  n = fired_of("replace2", f, 8);
  CHECK(n == 2 && f[1].time_ms == f[0].time_ms + 2000,
        "replace2 fired %d times", n);
  CHECK(overlaps == 0, "a key ran two handlers at once: %s", overlap_what);
  pthread_mutex_unlock(&lock);

  CHECK_OK(prosody_unsubscribe(client), "unsubscribe");
  prosody_client_destroy(client);

  /* Nothing fired twice, nothing unexpected fired. */
  pthread_mutex_lock(&lock);
  CHECK(fired_of("ops", f, 8) == 0, "ops timers fired");
  CHECK(fired_of("h", f, 8) == 3, "h fired %d times", fired_of("h", f, 8));
  CHECK(fired_of("replace", f, 8) == 2, "replace fired again");
  pthread_mutex_unlock(&lock);
  return 0;
}

/* Low-latency: a timer failing past max_retries (2) is dropped; the
 * failure topic gets only the key's next record, which fails on purpose
 * and runs only after the timer's event ended. */
T_SCENARIO(low_latency_timer_dropped_past_max_retries_not_dead_lettered, T_BOTH,
           90) {
  char err[1024], group[160];
  prosody_config_t *conf;
  prosody_client_t *client;
  prosody_handler_t handler = {on_message, on_timer, NULL, 0};
  int n;
  {
    char ll_topic[128], dlq[128];
    t_record_t recs[4];
    snprintf(ll_topic, sizeof(ll_topic), "%s", t_topic("timers-ll"));
    snprintf(dlq, sizeof(dlq), "%s", t_topic("timers-ll-dlq"));
    snprintf(group, sizeof(group), "%s-group", ll_topic);
    t_create_topic(ll_topic, 2);
    t_create_topic(dlq, 1);
    conf = t_consumer_config(group, ll_topic);
    t_set(conf, "mode", "low-latency");
    t_set(conf, "failure_topic", dlq);
    t_set(conf, "max_retries", "2");
    t_set(conf, "retry_base", "20ms");
    t_set(conf, "max_retry_delay", "100ms");
    client = prosody_client_new(conf, err, sizeof(err));
    CHECK(client, "client: %s", err);
    CHECK_OK(prosody_subscribe(client, &handler, err, sizeof(err)), err);
    produce(ll_topic, "ll", "ll", 0);
    pthread_mutex_lock(&lock);
    WAIT_UNTIL(ll_attempts >= 1, 60);
    CHECK(ll_attempts >= 1, "the low-latency timer did not fire");
    pthread_mutex_unlock(&lock);
    produce(ll_topic, "ll", "ll-after", 0);
    pthread_mutex_lock(&lock);
    WAIT_UNTIL(ll_after_done, 30);
    CHECK(ll_after_done, "the record after the failing timer did not run");
    CHECK(ll_attempts == 3, "the timer ran %d times (max_retries 2)",
          ll_attempts);
    CHECK(!strcmp(ll_after, "[] "), "dropped timer still scheduled: %s",
          ll_after);
    pthread_mutex_unlock(&lock);
    n = t_read_back(dlq, 1, 30, recs);
    CHECK(n == 1 && !strcmp(recs[0].key, "ll") &&
              strstr(recs[0].value, "ll-after"),
          "failure topic: %d record(s), first %s", n, n ? recs[0].value : "-");
    t_records_free(recs, n);
    CHECK_OK(prosody_unsubscribe(client), "unsubscribe");
    prosody_client_destroy(client);
  }
  printf("ok: timers\n");
  return 0;
}

/* The store's refusals of a fired timer's delete, as logged. */
static void count_refusals(prosody_log_level_t level, const char *subsystem,
                           const char *message, void *opaque) {
  (void)level;
  (void)subsystem;
  (void)opaque;
  if (!strstr(message, "could not delete the fired timer"))
    return;
  pthread_mutex_lock(&lock);
  d_refused_logs++;
  pthread_mutex_unlock(&lock);
}

/* A fired timer's delete that the store refuses is retried with backoff,
 * without running the handler again, and the key's next event starts only
 * once the timer is deleted: it lists no timer. */
T_SCENARIO(fired_timer_delete_refused_retried_before_the_keys_next_event,
           T_BOTH, 90) {
  static pr__test_opts_t refuse = {.timer_refuse_deletes = 3};
  char err[1024], group[160], topic[128];
  prosody_config_t *conf;
  prosody_client_t *client;
  prosody_handler_t handler = {on_message, on_timer, NULL, 0};
  snprintf(topic, sizeof(topic), "%s", t_topic("timers-del"));
  snprintf(group, sizeof(group), "%s-group", topic);
  t_create_topic(topic, 1);
  conf = t_consumer_config(group, topic);
  t_set(conf, "retry_base", "50ms");
  t_set(conf, "max_retry_delay", "200ms");
  pr__config_set_test(conf, &refuse);
  prosody_config_set_log_cb(conf, count_refusals, NULL);
  client = prosody_client_new(conf, err, sizeof(err));
  CHECK(client, "client: %s", err);
  CHECK_OK(prosody_subscribe(client, &handler, err, sizeof(err)), err);
  produce(topic, "del", "d", 0);
  pthread_mutex_lock(&lock);
  WAIT_UNTIL(d_fires >= 1, 60);
  CHECK(d_fires >= 1, "the timer did not fire");
  pthread_mutex_unlock(&lock);
  produce(topic, "del", "d-after", 0);
  pthread_mutex_lock(&lock);
  WAIT_UNTIL(d_after_done, 30);
  CHECK(d_after_done, "the key's next record did not run (the timer's "
                      "refused delete was not retried)");
  CHECK(d_fires_at_after == 1 && d_fires == 1,
        "the timer ran %d times (its handler succeeded once; only its delete "
        "was refused)",
        d_fires);
  CHECK(!strcmp(d_after, "[] "),
        "the key's next record still sees the timer stored: %s", d_after);
  CHECK(d_refused_logs >= 1,
        "no refused delete was logged: the test option did not act");
  pthread_mutex_unlock(&lock);
  CHECK_OK(prosody_unsubscribe(client), "unsubscribe");
  prosody_client_destroy(client);
  return 0;
}
