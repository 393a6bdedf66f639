/*
 * demo.c - `prosody demo`: its options, the producing half (a stream of
 * realistic events sent to the embedded mock cluster, then a report of
 * the acknowledgements, partitions and per-key order) and the consuming
 * half (a handler and timers that check per-key ordering and measure
 * themselves, then a report of both).
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "prosody.h"

#include "cli.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static const char *const event_types[] = {"order.created",
                                          "order.paid",
                                          "order.shipped",
                                          "user.signup",
                                          "user.login",
                                          "payment.failed",
                                          NULL /* no type field */};
#define N_TYPES (sizeof(event_types) / sizeof(event_types[0]))

/* Results written by the delivery callbacks (librdkafka's thread), read by
 * the main thread once `acked` reaches the number sent. */
typedef struct demo {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  long acked, failed;    /* guarded by lock */
  double *sent_at;       /* per record, written before send */
  double *latency;       /* per record; guarded by lock */
  int32_t *partition;    /* per record; guarded by lock */
  int64_t *offset;       /* per record; guarded by lock */
  char first_error[512]; /* guarded by lock */
} demo_t;

typedef struct demo_rec {
  demo_t *demo;
  long index;
} demo_rec_t;

static void demo_delivered(prosody_err_t err, const char *errstr,
                           const prosody_delivery_t *d, void *opaque) {
  demo_rec_t *rec = opaque;
  demo_t *demo = rec->demo;
  double t = now_s();
  pthread_mutex_lock(&demo->lock);
  demo->latency[rec->index] = t - demo->sent_at[rec->index];
  if (err) {
    demo->failed++;
    demo->partition[rec->index] = -1;
    if (!demo->first_error[0])
      snprintf(demo->first_error, sizeof(demo->first_error), "%s", errstr);
  } else {
    demo->partition[rec->index] = d->partition;
    demo->offset[rec->index] = d->offset;
  }
  demo->acked++;
  pthread_cond_signal(&demo->cond);
  pthread_mutex_unlock(&demo->lock);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double percentile(double *sorted, long n, double p) {
  long i = (long)(p * (double)(n - 1) + 0.5);
  return n ? sorted[i] : 0;
}

/* The consuming half of the demo: a handler that checks per-key order and
 * measures itself. Written by handler threads under `lock`; read by main. */
typedef struct demo_consume {
  pthread_mutex_t lock;
  long processed, violations, running, max_running;
  long *last_seq; /* per key */
  char *busy;     /* per key: a handler of it runs (overlap check) */
  long *seen;     /* per key: events processed */
  double *handler_ms, *e2e_ms;
  double first_at, last_at;
  long scheduled, fired, timer_errors;
  double *late_ms; /* per fired timer */
} demo_consume_t;

/* Follow-up timers: a key's first event schedules one 1-3 s out; the
 * third event of every fourth key another, 4.5 s out (so a later second:
 * each scheduled timer is distinct). */
static double demo_follow_up_ms(long k, long nth) {
  if (nth == 0)
    return 1000 + (double)(k % 3) * 1000;
  return nth == 2 && k % 4 == 0 ? 4500 : -1;
}

static double wall_ms_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Marks key k busy (or idle); an event of a busy key is a violation.
 * Called with dc->lock held. */
static void demo_key_busy(demo_consume_t *dc, long k, int enter) {
  if (k < 0)
    return;
  if (enter && dc->busy[k]++)
    dc->violations++;
  else if (!enter)
    dc->busy[k]--;
}

static prosody_result_t demo_timer(prosody_context_t *ctx,
                                   const prosody_timer_t *t, void *op) {
  demo_consume_t *dc = op;
  double late = wall_ms_now() - (double)prosody_timer_time(t);
  long k = -1;
  (void)ctx;
  sscanf(prosody_timer_key(t), "customer-%ld", &k);
  pthread_mutex_lock(&dc->lock);
  demo_key_busy(dc, k, 1);
  pthread_mutex_unlock(&dc->lock);
  usleep(200); /* a follow-up: a little work */
  pthread_mutex_lock(&dc->lock);
  demo_key_busy(dc, k, 0);
  if (dc->fired < dc->scheduled)
    dc->late_ms[dc->fired] = late;
  dc->fired++;
  pthread_mutex_unlock(&dc->lock);
  return PROSODY_SUCCESS;
}

static prosody_result_t demo_handler(prosody_context_t *ctx,
                                     const prosody_message_t *m, void *op) {
  demo_consume_t *dc = op;
  const char *p = strstr(prosody_message_payload(m), "\"seq\":");
  long seq = p ? atol(p + 6) : -1, k = -1, i;
  double t0 = now_s(), e2e, follow;
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  e2e = (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6 -
        (double)prosody_message_timestamp(m);
  sscanf(prosody_message_key(m), "customer-%ld", &k);
  pthread_mutex_lock(&dc->lock);
  if (++dc->running > dc->max_running)
    dc->max_running = dc->running;
  if (dc->first_at == 0)
    dc->first_at = t0;
  demo_key_busy(dc, k, 1);
  pthread_mutex_unlock(&dc->lock);
  /* Simulated work: most events are quick, a few take a millisecond. */
  usleep(seq % 10 == 0 ? 1000 : 100 + (unsigned)(seq % 7) * 50);
  pthread_mutex_lock(&dc->lock);
  follow = k >= 0 ? demo_follow_up_ms(k, dc->seen[k]++) : -1;
  pthread_mutex_unlock(&dc->lock);
  if (follow > 0) { /* follow up on this key later */
    char err[ERRLEN];
    double at = wall_ms_now() + follow;
    prosody_err_t e = prosody_schedule(ctx, (int64_t)at, err, sizeof(err));
    pthread_mutex_lock(&dc->lock);
    if (e) {
      if (!dc->timer_errors++)
        fprintf(stderr, "prosody demo: schedule: %s\n", err);
    } else {
      dc->scheduled++;
    }
    pthread_mutex_unlock(&dc->lock);
  }
  pthread_mutex_lock(&dc->lock);
  demo_key_busy(dc, k, 0);
  dc->running--;
  if (k >= 0 && seq >= 0) {
    if (seq <= dc->last_seq[k])
      dc->violations++;
    dc->last_seq[k] = seq;
  }
  i = dc->processed++;
  dc->handler_ms[i] = (now_s() - t0) * 1e3;
  dc->e2e_ms[i] = e2e;
  dc->last_at = now_s();
  pthread_mutex_unlock(&dc->lock);
  return PROSODY_SUCCESS;
}

/* Consumes `messages` events of `topic` and prints the summary. */
static int demo_consume(const char *topic, long messages, long keys, int tty) {
  char err[ERRLEN];
  demo_consume_t dc;
  prosody_config_t *conf = prosody_config_new();
  prosody_client_t *client;
  prosody_handler_t h = {demo_handler, demo_timer, &dc, 0};
  double deadline, last_print = 0, start = now_s();
  long done = 0, prev = 0;
  int rc = 0;

  memset(&dc, 0, sizeof(dc));
  pthread_mutex_init(&dc.lock, NULL);
  dc.last_seq = malloc((size_t)keys * sizeof(long));
  dc.busy = calloc((size_t)keys, 1);
  dc.seen = calloc((size_t)keys, sizeof(long));
  dc.handler_ms = calloc((size_t)messages, sizeof(double));
  dc.e2e_ms = calloc((size_t)messages, sizeof(double));
  dc.late_ms = calloc((size_t)keys * 2, sizeof(double));
  if (!dc.last_seq || !dc.busy || !dc.seen || !dc.handler_ms || !dc.e2e_ms ||
      !dc.late_ms)
    return pr__cli_fail("demo", PROSODY_ERR_NOMEM, "out of memory");
  for (long k = 0; k < keys; k++)
    dc.last_seq[k] = -1;
  if (prosody_config_set(conf, "mock", "true", err, sizeof(err)) ||
      prosody_config_set(conf, "group_id", "prosody-demo-consumer", err,
                         sizeof(err)) ||
      prosody_config_set(conf, "subscribed_topics", topic, err, sizeof(err)) ||
      pr__cli_set_default(conf, "log", "warn")) {
    prosody_config_destroy(conf);
    return pr__cli_fail("demo", PROSODY_ERR_CONFIG, err);
  }
  if (!(client = pr__cli_open_client(conf, "demo", &rc)))
    return rc;
  if (prosody_subscribe(client, &h, err, sizeof(err)))
    return pr__cli_fail("demo subscribe", PROSODY_ERR_STATE, err);
  printf("prosody demo: consuming with per-key ordering (group "
         "\"prosody-demo-consumer\")\n");
  fflush(stdout);
  deadline = now_s() + 120;
  for (;;) {
    double t = now_s();
    long running, fired, scheduled;
    usleep(50000);
    pthread_mutex_lock(&dc.lock);
    done = dc.processed;
    running = dc.running;
    fired = dc.fired;
    scheduled = dc.scheduled;
    pthread_mutex_unlock(&dc.lock);
    /* Done once every event ran and every follow-up timer fired. */
    if ((done >= messages && fired >= scheduled) || t >= deadline)
      break;
    if (t - last_print >= (tty ? 0.25 : 1.0)) {
      double rate = (double)(done - prev) / (t - last_print);
      if (last_print == 0)
        rate = 0;
      if (tty)
        fprintf(stderr,
                "\r  processed %ld/%ld  %.0f events/s  in flight %ld  lag "
                "%ld   ",
                done, messages, rate, running, messages - done);
      else
        printf("  processed %ld/%ld  %.0f events/s  in flight %ld  lag %ld\n",
               done, messages, rate, running, messages - done);
      fflush(stdout);
      prev = done;
      last_print = t;
    }
  }
  if (tty)
    fprintf(stderr, "\r%70s\r", "");
  prosody_unsubscribe(client);
  prosody_client_destroy(client);

  qsort(dc.handler_ms, (size_t)dc.processed, sizeof(double), cmp_double);
  qsort(dc.e2e_ms, (size_t)dc.processed, sizeof(double), cmp_double);
  qsort(dc.late_ms, (size_t)dc.fired, sizeof(double), cmp_double);
  {
    double span = dc.last_at - dc.first_at;
    printf("  consumed      %ld of %ld in %.2f s after the group join "
           "(%.2f s in all), %.0f events/s, at most %ld handlers at once\n",
           dc.processed, messages, span, now_s() - start,
           span > 0 ? (double)dc.processed / span : 0.0, dc.max_running);
  }
  printf("  key order     %ld violations across %ld keys (order, or two "
         "handlers of a key at once)\n",
         dc.violations, keys);
  printf("  handler time  p50 %.2f ms, p99 %.2f ms\n",
         percentile(dc.handler_ms, dc.processed, 0.50),
         percentile(dc.handler_ms, dc.processed, 0.99));
  printf("  end to end    p50 %.0f ms, p99 %.0f ms (producer timestamp to "
         "handler start, including the group join)\n",
         percentile(dc.e2e_ms, dc.processed, 0.50),
         percentile(dc.e2e_ms, dc.processed, 0.99));
  printf("  timers        scheduled %ld, fired %ld, lateness p50 %.0f ms, p99 "
         "%.0f ms (past their second)\n",
         dc.scheduled, dc.fired, percentile(dc.late_ms, dc.fired, 0.50),
         percentile(dc.late_ms, dc.fired, 0.99));
  if (dc.processed != messages || dc.violations || dc.timer_errors ||
      dc.fired != dc.scheduled)
    rc = 1;
  free(dc.last_seq);
  free(dc.busy);
  free(dc.seen);
  free(dc.late_ms);
  free(dc.handler_ms);
  free(dc.e2e_ms);
  pthread_mutex_destroy(&dc.lock);
  return rc;
}

/* The demo keeps a few arrays of this many entries in memory, and the
 * embedded mock cluster keeps every record: about 0.6 GB and a minute at
 * the most. */
#define DEMO_MAX_MESSAGES 1000000
#define DEMO_STR_(x) #x
#define DEMO_STR(x) DEMO_STR_(x)
#define DEMO_COUNT_FORM "a whole number from 1 to " DEMO_STR(DEMO_MAX_MESSAGES)

/* Parses a whole decimal count from 1 to DEMO_MAX_MESSAGES for option
 * `name`; 0 on success, else prints why (naming the option) and returns
 * -1. */
static int parse_count(const char *name, const char *arg, long *out) {
  char *end;
  long v;
  errno = 0;
  v = strtol(arg, &end, 10);
  if (*arg == '\0' || *end || errno || v < 1 || v > DEMO_MAX_MESSAGES) {
    fprintf(stderr,
            "prosody demo: invalid %s \"%s\": expected " DEMO_COUNT_FORM "\n",
            name, arg);
    return -1;
  }
  *out = v;
  return 0;
}

int pr__cli_demo(prosody_config_t *conf, int argc, char **argv) {
  long messages = 20000, keys = 500;
  const char *topic = "prosody-demo";
  char err[ERRLEN], bootstrap[256], payload[256], key[32];
  prosody_client_t *client;
  demo_t demo;
  demo_rec_t *recs;
  long *key_of;
  long type_counts[N_TYPES] = {0}, with_id = 0, part_counts[64] = {0};
  long keys_ordered = 0, i;
  unsigned seed = 42;
  double start, elapsed, last_progress = 0;
  int tty = isatty(STDERR_FILENO), rc = 0;

  for (int a = 0; a < argc; a++) {
    int count = !strcmp(argv[a], "--messages") || !strcmp(argv[a], "--keys");
    if ((count || !strcmp(argv[a], "--topic")) && a + 1 >= argc) {
      prosody_config_destroy(conf);
      return pr__cli_no_value("demo", argv[a],
                              count ? DEMO_COUNT_FORM : "a topic name");
    }
    if (count) {
      if (parse_count(argv[a], argv[a + 1],
                      !strcmp(argv[a], "--messages") ? &messages : &keys)) {
        prosody_config_destroy(conf);
        return 2;
      }
      a++;
    } else if (!strcmp(argv[a], "--topic"))
      topic = argv[++a];
    else {
      fprintf(stderr, "prosody demo: unexpected argument \"%s\"\n", argv[a]);
      prosody_config_destroy(conf);
      return 2;
    }
  }
  if (messages < 1 || keys < 1 || keys > messages) {
    fprintf(stderr, "prosody demo: need 1 <= --keys <= --messages\n");
    prosody_config_destroy(conf);
    return 2;
  }
  if (prosody_config_set(conf, "mock", "true", err, sizeof(err)) ||
      pr__cli_set_default(conf, "source_system", "prosody-demo") ||
      pr__cli_set_default(conf, "send_timeout", "30s")) {
    prosody_config_destroy(conf);
    return pr__cli_fail("demo", PROSODY_ERR_CONFIG, err);
  }
  if (!(client = pr__cli_open_client(conf, "demo", &rc)))
    return rc;
  prosody_mock_bootstrap_servers(bootstrap, sizeof(bootstrap), err,
                                 sizeof(err));

  memset(&demo, 0, sizeof(demo));
  pthread_mutex_init(&demo.lock, NULL);
  pthread_cond_init(&demo.cond, NULL);
  demo.sent_at = calloc((size_t)messages, sizeof(double));
  demo.latency = calloc((size_t)messages, sizeof(double));
  demo.partition = calloc((size_t)messages, sizeof(int32_t));
  demo.offset = calloc((size_t)messages, sizeof(int64_t));
  recs = calloc((size_t)messages, sizeof(*recs));
  key_of = calloc((size_t)messages, sizeof(long));
  if (!key_of || !demo.sent_at || !demo.latency || !demo.partition ||
      !demo.offset || !recs) {
    fprintf(stderr, "prosody demo: out of memory\n");
    return 1;
  }

  printf("prosody demo: %ld events for %ld keys -> topic \"%s\" on the "
         "embedded mock cluster %s\n",
         messages, keys, topic, bootstrap);
  fflush(stdout);
  start = now_s();
  for (i = 0; i < messages; i++) {
    long k = (long)(rand_r(&seed) % (unsigned)keys);
    size_t t = (size_t)rand_r(&seed) % N_TYPES;
    int has_id = rand_r(&seed) % 10 != 0; /* 90% carry an id */
    int amount = rand_r(&seed) % 100000;
    int len = 0;
    prosody_err_t e;

    snprintf(key, sizeof(key), "customer-%04ld", k);
    key_of[i] = k;
    len += snprintf(payload + len, sizeof(payload) - (size_t)len, "{");
    if (has_id) {
      len += snprintf(payload + len, sizeof(payload) - (size_t)len,
                      "\"id\":\"evt-%08ld\",", i);
      with_id++;
    }
    if (event_types[t])
      len += snprintf(payload + len, sizeof(payload) - (size_t)len,
                      "\"type\":\"%s\",", event_types[t]);
    type_counts[t]++;
    snprintf(payload + len, sizeof(payload) - (size_t)len,
             "\"customer\":\"%s\",\"amount\":%d.%02d,\"seq\":%ld}", key,
             amount / 100, amount % 100, i);
    recs[i].demo = &demo;
    recs[i].index = i;
    demo.sent_at[i] = now_s();
    e = prosody_send_async(client, topic, key, payload, NULL, demo_delivered,
                           &recs[i], err, sizeof(err));
    if (e) {
      rc = pr__cli_fail("demo send", e, err);
      messages = i; /* wait only for what was queued */
      break;
    }
    if (demo.sent_at[i] - last_progress > 0.25) {
      long acked;
      last_progress = demo.sent_at[i];
      pthread_mutex_lock(&demo.lock);
      acked = demo.acked;
      pthread_mutex_unlock(&demo.lock);
      if (tty)
        fprintf(stderr, "\r  sent %ld/%ld, acknowledged %ld", i + 1, messages,
                acked);
    }
  }
  pthread_mutex_lock(&demo.lock);
  while (demo.acked < messages) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 1;
    pthread_cond_timedwait(&demo.cond, &demo.lock, &ts);
    if (tty)
      fprintf(stderr, "\r  sent %ld/%ld, acknowledged %ld", messages, messages,
              demo.acked);
  }
  pthread_mutex_unlock(&demo.lock);
  elapsed = now_s() - start;
  if (tty)
    fprintf(stderr, "\r%60s\r", "");

  /* Per-key order: a key's records land in one partition at increasing
   * offsets, in the order they were sent. */
  {
    int32_t *kp = malloc((size_t)keys * sizeof(int32_t));
    int64_t *ko = malloc((size_t)keys * sizeof(int64_t));
    char *bad = calloc((size_t)keys, 1);
    for (long k = 0; k < keys; k++) {
      kp[k] = -1;
      ko[k] = -1;
    }
    for (i = 0; i < messages; i++) {
      long k = key_of[i];
      if (demo.partition[i] < 0)
        continue;
      if (demo.partition[i] < 64)
        part_counts[demo.partition[i]]++;
      if (kp[k] >= 0 && (kp[k] != demo.partition[i] || demo.offset[i] <= ko[k]))
        bad[k] = 1;
      kp[k] = demo.partition[i];
      ko[k] = demo.offset[i];
    }
    for (long k = 0; k < keys; k++)
      keys_ordered += kp[k] >= 0 && !bad[k];
    free(kp);
    free(ko);
    free(bad);
  }
  qsort(demo.latency, (size_t)messages, sizeof(double), cmp_double);

  printf("  acknowledged  %ld of %ld (%ld failed) in %.2f s, %.0f events/s\n",
         demo.acked - demo.failed, messages, demo.failed, elapsed,
         (double)messages / elapsed);
  printf("  ack latency   p50 %.1f ms, p99 %.1f ms, max %.1f ms\n",
         percentile(demo.latency, messages, 0.50) * 1e3,
         percentile(demo.latency, messages, 0.99) * 1e3,
         percentile(demo.latency, messages, 1.0) * 1e3);
  printf("  partitions   ");
  for (int p = 0; p < 64; p++)
    if (part_counts[p])
      printf(" p%d=%ld", p, part_counts[p]);
  printf("\n  event types  ");
  for (size_t t = 0; t < N_TYPES; t++)
    printf(" %s=%ld", event_types[t] ? event_types[t] : "(none)",
           type_counts[t]);
  printf("\n  with id       %ld of %ld\n", with_id, messages);
  printf("  key order     %ld of %ld keys stored in send order (one "
         "partition, increasing offsets)\n",
         keys_ordered, keys);
  if (demo.failed)
    printf("  first error   %s\n", demo.first_error);

  prosody_client_destroy(client);
  pthread_mutex_destroy(&demo.lock);
  pthread_cond_destroy(&demo.cond);
  free(demo.sent_at);
  free(demo.latency);
  free(demo.partition);
  free(demo.offset);
  free(recs);
  free(key_of);
  if (!rc && (demo.failed || keys_ordered != keys))
    rc = 1;
  if (!rc)
    rc = demo_consume(topic, messages, keys, tty);
  printf("prosody demo: %s\n", rc ? "FAILED" : "ok");
  return rc;
}
