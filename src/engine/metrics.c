/*
 * metrics.c - the consumer's counters, gauges and histograms, and their
 * Prometheus text (GET /metrics on the probe server).
 *
 * Threads: the engine thread writes every counter and histogram (one
 * writer: relaxed loads and stores, no read-modify-write), and every
 * poll_interval a snapshot of its gauges (in flight, timers pending, each
 * partition's committed offset and lag) under `mlock`; the probe
 * server's thread renders them (pr__engine_metrics).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* Histogram bucket bounds, seconds. */
static const double bounds[PR_HIST_BOUNDS] = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1,    0.25,    0.5,    1,     2.5,    5,     10,   30,    60};

/* The same bounds in ns, so an observation needs no division. */
static const int64_t bounds_ns[PR_HIST_BOUNDS] = {
    100000,     250000,     500000,     1000000,     2500000,     5000000,
    10000000,   25000000,   50000000,   100000000,   250000000,   500000000,
    1000000000, 2500000000, 5000000000, 10000000000, 30000000000, 60000000000};

void pr__hist_observe(pr__hist_t *h, int64_t ns) {
  int i = 0;
  while (i < PR_HIST_BOUNDS && ns > bounds_ns[i])
    i++;
  PR_BUMP(h->count[i], 1);
  PR_BUMP(h->sum_ns, ns > 0 ? (uint64_t)ns : 0);
}

/* Every poll_interval (engine thread). */
void pr__metrics_snapshot(pr__engine_t *eng) {
  pr__metrics_t *m = &eng->metrics;
  size_t pending = 0, n = 0, need = 0, lagged;
  char *text;
  for (part_t *p = eng->parts; p; p = p->next) {
    need += 2 * (strlen(p->topic) + 96);
    if (p->tq)
      pending += pr__tq_size(p->tq);
  }
  /* One family after the other: committed offsets, then lags. */
  if ((text = malloc(need + 2))) {
    for (part_t *p = eng->parts; p; p = p->next)
      if (p->tracker.commit >= 0)
        n += (size_t)snprintf(text + n, need + 2 - n,
                              "prosody_partition_committed_offset{topic=\"%s\","
                              "partition=\"%d\"} %lld\n",
                              p->topic, p->partition,
                              (long long)p->tracker.commit);
    text[n++] = '\0';
    lagged = n;
    for (part_t *p = eng->parts; p; p = p->next) {
      int64_t lo = -1, hi = -1, committed = p->tracker.commit;
      rd_kafka_get_watermark_offsets(eng->rk, p->topic, p->partition, &lo, &hi);
      if (hi >= 0 && committed >= 0)
        n += (size_t)snprintf(text + n, need + 2 - n,
                              "prosody_partition_lag{topic=\"%s\","
                              "partition=\"%d\"} %lld\n",
                              p->topic, p->partition,
                              (long long)(hi > committed ? hi - committed : 0));
    }
    text[n] = '\0';
  }
  pthread_mutex_lock(&m->lock);
  m->in_flight = eng->running;
  m->timers_pending = pending;
  if (text) { /* else the last one stays */
    free(m->parts_text);
    m->parts_text = text;
    m->lag_text = text + lagged;
  }
  pthread_mutex_unlock(&m->lock);
}

void pr__metrics_init(pr__metrics_t *m) {
  memset(m, 0, sizeof(*m));
  pthread_mutex_init(&m->lock, NULL);
}

void pr__metrics_fini(pr__metrics_t *m) {
  free(m->parts_text);
  pthread_mutex_destroy(&m->lock);
}

/* A growing text buffer. */
typedef struct out {
  char *s;
  size_t n, cap;
  int oom;
} out_t;

static void put(out_t *o, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void put(out_t *o, const char *fmt, ...) {
  va_list ap;
  int len;
  if (o->oom)
    return;
  for (;;) {
    va_start(ap, fmt);
    len = vsnprintf(o->s + o->n, o->cap - o->n, fmt, ap);
    va_end(ap);
    if (len < 0) {
      o->oom = 1;
      return;
    }
    if ((size_t)len < o->cap - o->n) {
      o->n += (size_t)len;
      return;
    }
    {
      size_t cap = (o->cap + (size_t)len + 1) * 2;
      char *s = realloc(o->s, cap);
      if (!s) {
        o->oom = 1;
        return;
      }
      o->s = s;
      o->cap = cap;
    }
  }
}

static void counter(out_t *o, const char *name, const char *help,
                    const char *labels, const atomic_uint_fast64_t *v) {
  if (help)
    put(o, "# HELP %s %s\n# TYPE %s counter\n", name, help, name);
  put(o, "%s%s %llu\n", name, labels ? labels : "",
      (unsigned long long)atomic_load_explicit(v, memory_order_relaxed));
}

static void histogram(out_t *o, const char *name, const char *help,
                      const pr__hist_t *h) {
  unsigned long long cum = 0;
  put(o, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
  for (int i = 0; i <= PR_HIST_BOUNDS; i++) {
    cum += atomic_load_explicit(&h->count[i], memory_order_relaxed);
    if (i < PR_HIST_BOUNDS)
      put(o, "%s_bucket{le=\"%g\"} %llu\n", name, bounds[i], cum);
    else
      put(o, "%s_bucket{le=\"+Inf\"} %llu\n", name, cum);
  }
  put(o, "%s_sum %.9f\n%s_count %llu\n", name,
      (double)atomic_load_explicit(&h->sum_ns, memory_order_relaxed) / 1e9,
      name, cum);
}

char *pr__engine_metrics(pr__engine_t *eng) {
  pr__metrics_t *m = &eng->metrics;
  out_t o = {0};
  static const char *kinds[2] = {"message", "timer"};
  static const char *results[3] = {"success", "transient", "permanent"};

  counter(&o, "prosody_records_consumed_total",
          "Records taken from Kafka (each once per assignment)", NULL,
          &m->consumed);
  put(&o, "# HELP prosody_records_skipped_total Records committed past without "
          "their handler, by reason\n# TYPE prosody_records_skipped_total "
          "counter\n");
  counter(&o, "prosody_records_skipped_total", NULL, "{reason=\"undecodable\"}",
          &m->skipped_undecodable);
  counter(&o, "prosody_records_skipped_total", NULL, "{reason=\"filtered\"}",
          &m->skipped_filtered);
  counter(&o, "prosody_records_skipped_total", NULL, "{reason=\"duplicate\"}",
          &m->skipped_duplicate);
  put(&o, "# HELP prosody_handler_calls_total Handler attempts finished, by "
          "event kind and result\n# TYPE prosody_handler_calls_total "
          "counter\n");
  for (int k = 0; k < 2; k++)
    for (int r = 0; r < 3; r++) {
      char labels[64];
      snprintf(labels, sizeof(labels), "{kind=\"%s\",result=\"%s\"}", kinds[k],
               results[r]);
      counter(&o, "prosody_handler_calls_total", NULL, labels, &m->calls[k][r]);
    }
  counter(&o, "prosody_retries_total",
          "Failed attempts retried after a backoff", NULL, &m->retries);
  counter(&o, "prosody_deferred_total",
          "Messages and timers deferred (written to their key's defer "
          "queue)",
          NULL, &m->deferred);
  counter(&o, "prosody_rejected_total",
          "Events refused before their handler ran (monopolization), "
          "retried later",
          "{reason=\"monopolization\"}", &m->rejected_monopoly);
  counter(&o, "prosody_dead_lettered_total",
          "Messages written to failure_topic (low-latency mode)", NULL,
          &m->dead_lettered);
  {
    atomic_uint_fast64_t dropped = pr__tm_dropped(eng->tm);
    counter(&o, "prosody_telemetry_dropped_total",
            "Telemetry events dropped (the telemetry producer's queue was "
            "full) or not delivered",
            NULL, &dropped);
  }
  if (eng->otel) {
    pr_otel_stats_t os;
    atomic_uint_fast64_t exported, dropped, failed;
    pr__otel_stats(eng->otel, &os);
    atomic_init(&exported, os.exported);
    atomic_init(&dropped, os.dropped);
    atomic_init(&failed, os.failed_requests);
    counter(&o, "prosody_spans_exported_total",
            "Spans the OTLP receiver accepted (this client's, producer "
            "included)",
            NULL, &exported);
    counter(&o, "prosody_spans_dropped_total",
            "Spans dropped: the export queue was full, the receiver failed "
            "or did not answer in time, or the client closed first",
            NULL, &dropped);
    counter(&o, "prosody_span_export_failures_total",
            "OTLP export requests that failed (no answer, or not 2xx)", NULL,
            &failed);
  }
  counter(&o, "prosody_timers_scheduled_total",
          "Timers written by the handler's timer calls", NULL,
          &m->timers_scheduled);
  counter(&o, "prosody_timers_fired_total", "Timers that came due and fired",
          NULL, &m->timers_fired);
  histogram(&o, "prosody_handler_duration_seconds",
            "Handler time per attempt (until completion for asynchronous "
            "handlers)",
            &m->handler_time);
  histogram(&o, "prosody_scheduler_wait_seconds",
            "Time an event at the head of its key waited for a handler slot",
            &m->sched_wait);
  put(&o,
      "# HELP prosody_partitions_assigned Partitions assigned\n# TYPE "
      "prosody_partitions_assigned gauge\nprosody_partitions_assigned "
      "%d\n",
      atomic_load(&eng->assigned));
  pthread_mutex_lock(&m->lock);
  put(&o,
      "# HELP prosody_handlers_in_flight Handler attempts running\n# "
      "TYPE prosody_handlers_in_flight gauge\nprosody_handlers_in_flight "
      "%d\n",
      m->in_flight);
  put(&o,
      "# HELP prosody_timers_pending Timers loaded and not yet due\n# "
      "TYPE prosody_timers_pending gauge\nprosody_timers_pending %zu\n",
      m->timers_pending);
  put(&o,
      "# HELP prosody_partition_committed_offset The offset committed "
      "next (watermark + 1), per assigned partition\n# TYPE "
      "prosody_partition_committed_offset gauge\n%s",
      m->parts_text ? m->parts_text : "");
  put(&o,
      "# HELP prosody_partition_lag Records behind the partition's high "
      "watermark, per assigned partition\n# TYPE prosody_partition_lag "
      "gauge\n%s",
      m->lag_text ? m->lag_text : "");
  pthread_mutex_unlock(&m->lock);
  if (o.oom) {
    free(o.s);
    return NULL;
  }
  return o.s;
}
