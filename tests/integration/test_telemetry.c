/*
 * test_telemetry.c - the telemetry topic's contract: every event type a
 * client emits, with every field, read back from the topic.
 *
 * A producer client sends three records (one with a traceparent); a
 * consumer (pipeline mode, its own telemetry topic) handles them: key
 * "ok" schedules a timer one second ahead and another that it then
 * unschedules; key "bad" fails transiently once and then succeeds (its
 * second dispatch is a retry: demandType failure); the timer fires and
 * succeeds. The topic must then hold, as JSON keyed by the event's key:
 * message.sent (x3, from the producer), message.dispatched (x4),
 * message.succeeded (x3), message.failed (x1), timer.scheduled (x2),
 * timer.cancelled (x1), timer.dispatched (x1) and timer.succeeded (x1),
 * each with the original Prosody's fields in its order.
 *
 * A second scenario exports spans: a message's events then carry its
 * receive span's context, as the original's carry its handler span's.
 */
#include <jansson.h>
#include <regex.h>
#include <stdatomic.h>
#include <unistd.h>

#include "harness.h"

#define TP "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

static atomic_int bad_tries, timers_done, handled;
static atomic_llong timer_at;

static prosody_result_t on_message(prosody_context_t *ctx,
                                   const prosody_message_t *m, void *op) {
  char err[256];
  (void)op;
  if (!strcmp(prosody_message_key(m), "bad") &&
      atomic_fetch_add(&bad_tries, 1) == 0)
    return PROSODY_TRANSIENT;
  if (!strcmp(prosody_message_key(m), "ok")) {
    int64_t at = (time(NULL) + 1) * 1000;
    atomic_store(&timer_at, at);
    CHECK_OK(prosody_schedule(ctx, at, err, sizeof(err)), err);
    CHECK_OK(prosody_schedule(ctx, at + 60000, err, sizeof(err)), err);
    CHECK_OK(prosody_unschedule(ctx, at + 60000, err, sizeof(err)), err);
  }
  atomic_fetch_add(&handled, 1);
  return PROSODY_SUCCESS;
}

static prosody_result_t on_timer(prosody_context_t *ctx,
                                 const prosody_timer_t *t, void *op) {
  (void)ctx;
  (void)op;
  (void)t;
  atomic_fetch_add(&timers_done, 1);
  return PROSODY_SUCCESS;
}

static const char *str(json_t *o, const char *k) {
  json_t *v = json_object_get(o, k);
  return json_is_string(v) ? json_string_value(v) : NULL;
}

static int has(json_t *o, const char *k) {
  return json_object_get(o, k) != NULL;
}

/* The original Prosody's fields for each kind of event, in its order: an
 * event has a subsequence of its kind's (jansson keeps the text's order). */
static const char *const msg_fields[] = {
    "type",      "eventTime",   "offset",     "topic",      "partition",
    "key",       "source",      "hostname",   "demandType", "errorCategory",
    "exception", "traceParent", "traceState", NULL};
static const char *const timer_fields[] = {
    "type",          "eventTime", "scheduledTime", "timerType",  "topic",
    "partition",     "key",       "source",        "hostname",   "demandType",
    "errorCategory", "exception", "traceParent",   "traceState", NULL};
static const char *const sent_fields[] = {
    "type",   "eventTime", "topic",       "partition",  "offset", "key",
    "source", "hostname",  "traceParent", "traceState", NULL};

static int in_order(json_t *o, const char *const *fields) {
  const char *k;
  json_t *v;
  json_object_foreach(o, k, v) {
    while (*fields && strcmp(*fields, k))
      fields++;
    if (!*fields)
      return 0;
    fields++;
  }
  return 1;
}

/* A source topic and a telemetry topic of their own (one partition each),
 * and the group's name, for scenario `name`. */
static void make_topics(const char *name, char topic[128], char tm_topic[128],
                        char group[160]) {
  char what[64];
  snprintf(what, sizeof(what), "%s-src", name);
  snprintf(topic, 128, "%s", t_topic(what));
  snprintf(what, sizeof(what), "%s-events", name);
  snprintf(tm_topic, 128, "%s", t_topic(what));
  snprintf(group, 160, "%s-g", topic);
  t_create_topic(topic, 1);
  t_create_topic(tm_topic, 1);
}

T_SCENARIO(every_event_type_and_field_on_telemetry_topic, T_BOTH, 90) {
  char err[1024], topic[128], tm_topic[128], group[160], host[256] = "";
  prosody_config_t *conf;
  prosody_client_t *p, *c;
  prosody_handler_t h = {on_message, on_timer, NULL, 0};
  prosody_trace_t trace = {TP, "k=v", NULL};
  t_record_t recs[17];
  int n, counts[9] = {0};
  static const char *types[9] = {
      "prosody.message.dispatched", "prosody.message.succeeded",
      "prosody.message.failed",     "prosody.message.sent",
      "prosody.timer.scheduled",    "prosody.timer.cancelled",
      "prosody.timer.dispatched",   "prosody.timer.succeeded",
      "prosody.timer.failed"};
  static const int want[9] = {4, 3, 1, 3, 2, 1, 1, 1, 0};
  regex_t rfc3339;

  regex_t rfc3339_s;

  CHECK(!regcomp(&rfc3339,
                 "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\\."
                 "[0-9]{3}Z$",
                 REG_EXTENDED | REG_NOSUB),
        "regcomp");
  /* A timer's time: to the second, as the original writes it. */
  CHECK(!regcomp(&rfc3339_s,
                 "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z$",
                 REG_EXTENDED | REG_NOSUB),
        "regcomp");
  gethostname(host, sizeof(host) - 1);
  make_topics("telemetry", topic, tm_topic, group);

  conf = t_config();
  t_set(conf, "source_system", "telemetry-producer");
  t_set(conf, "telemetry_topic", tm_topic);
  p = prosody_client_new(conf, err, sizeof(err));
  CHECK(p, "producer: %s", err);
  CHECK_OK(prosody_send(p, topic, "ok", "{\"n\":1}", &trace, err, sizeof(err)),
           err);
  CHECK_OK(prosody_send(p, topic, "bad", "{\"n\":2}", NULL, err, sizeof(err)),
           err);
  CHECK_OK(prosody_send(p, topic, "plain", "{\"n\":3}", NULL, err, sizeof(err)),
           err);
  prosody_client_destroy(p);

  conf = t_consumer_config(group, topic);
  t_set(conf, "telemetry_topic", tm_topic);
  t_set(conf, "retry_base", "10ms");
  c = prosody_client_new(conf, err, sizeof(err));
  CHECK(c, "consumer: %s", err);
  CHECK_OK(prosody_subscribe(c, &h, err, sizeof(err)), err);
  CHECK(t_wait_at_least(&handled, 3, 60), "handled %d of 3",
        atomic_load(&handled));
  CHECK(t_wait_at_least(&timers_done, 1, 30), "the timer did not fire");
  CHECK_OK(prosody_unsubscribe(c), "unsubscribe");
  prosody_client_destroy(c); /* flushes its telemetry */

  /* The client flushed its events when destroyed: all 16 are in the
   * topic. A 17th is waited for (8 s) to show there is none. */
  n = t_read_back(tm_topic, 17, 8, recs);
  for (int i = 0; i < n; i++) {
    json_error_t je;
    json_t *o = json_loads(recs[i].value, 0, &je);
    const char *type, *key;
    int ti = -1, timer, failed, sent;
    CHECK(o && json_is_object(o), "event %d is not a JSON object: %s", i,
          recs[i].value);
    type = str(o, "type");
    for (int k = 0; type && k < 9; k++)
      if (!strcmp(type, types[k]))
        ti = k;
    CHECK(ti >= 0, "unknown event type in %s", recs[i].value);
    counts[ti]++;
    timer = ti >= 4, failed = ti == 2, sent = ti == 3;
    CHECK(in_order(o, sent    ? sent_fields
                      : timer ? timer_fields
                              : msg_fields),
          "fields not the original's, or not in its order: %s", recs[i].value);
    key = str(o, "key");
    CHECK(key && !strcmp(key, recs[i].key), "event %s: key %s, record key %s",
          recs[i].value, key ? key : "-", recs[i].key);
    CHECK(str(o, "eventTime") &&
              !regexec(&rfc3339, str(o, "eventTime"), 0, NULL, 0),
          "eventTime in %s", recs[i].value);
    CHECK(str(o, "topic") && !strcmp(str(o, "topic"), topic), "topic in %s",
          recs[i].value);
    CHECK(json_is_integer(json_object_get(o, "partition")) &&
              json_integer_value(json_object_get(o, "partition")) == 0,
          "partition in %s", recs[i].value);
    CHECK(str(o, "hostname") && !strcmp(str(o, "hostname"), host),
          "hostname in %s (want %s)", recs[i].value, host);
    CHECK(str(o, "source") &&
              !strcmp(str(o, "source"), sent ? "telemetry-producer" : group),
          "source in %s", recs[i].value);
    if (timer) {
      CHECK(!has(o, "offset"), "a timer event with an offset: %s",
            recs[i].value);
      CHECK(str(o, "scheduledTime") &&
                !regexec(&rfc3339_s, str(o, "scheduledTime"), 0, NULL, 0),
            "scheduledTime in %s", recs[i].value);
      CHECK(str(o, "timerType") && !strcmp(str(o, "timerType"), "application"),
            "timerType in %s", recs[i].value);
      CHECK(!strcmp(key, "ok"), "a timer of key %s", key);
    } else {
      CHECK(json_is_integer(json_object_get(o, "offset")) &&
                json_integer_value(json_object_get(o, "offset")) >= 0 &&
                json_integer_value(json_object_get(o, "offset")) < 3,
            "offset in %s", recs[i].value);
      CHECK(!has(o, "scheduledTime") && !has(o, "timerType"),
            "a message event with timer fields: %s", recs[i].value);
    }
    if (ti == 0 || ti == 1 || ti == 2 || ti == 6 || ti == 7) {
      const char *d = str(o, "demandType");
      CHECK(d && (!strcmp(d, "normal") || !strcmp(d, "failure")),
            "demandType in %s", recs[i].value);
    } else {
      CHECK(!has(o, "demandType"), "demandType in %s", recs[i].value);
    }
    if (failed) {
      CHECK(str(o, "errorCategory") &&
                !strcmp(str(o, "errorCategory"), "transient"),
            "errorCategory in %s", recs[i].value);
      CHECK(str(o, "exception"), "exception in %s", recs[i].value);
      CHECK(!strcmp(key, "bad"), "a failure of key %s", key);
    } else {
      CHECK(!has(o, "errorCategory") && !has(o, "exception"),
            "failure fields in %s", recs[i].value);
    }
    /* The traced record's events carry its context: its send and
     * consume events and its handler's timer operations with its
     * tracestate; the timer, fired in that context, with an empty one (the
     * original's propagator writes traceState whenever traceParent). */
    if (!strcmp(key, "ok"))
      CHECK(str(o, "traceParent") && !strcmp(str(o, "traceParent"), TP) &&
                str(o, "traceState") &&
                !strcmp(str(o, "traceState"), ti >= 6 ? "" : "k=v"),
            "trace context in %s", recs[i].value);
    else
      CHECK(!has(o, "traceParent") && !has(o, "traceState"),
            "trace context in %s", recs[i].value);
    json_decref(o);
  }
  for (int k = 0; k < 9; k++)
    CHECK(counts[k] == want[k], "%d %s event(s), want %d (%d events read)",
          counts[k], types[k], want[k], n);
  /* The retry of "bad" is a failure-class dispatch. */
  {
    int normal = 0, failure = 0;
    for (int i = 0; i < n; i++) {
      json_t *o = json_loads(recs[i].value, 0, NULL);
      if (!strcmp(str(o, "type"), types[0]) && !strcmp(str(o, "key"), "bad"))
        !strcmp(str(o, "demandType"), "failure") ? failure++ : normal++;
      json_decref(o);
    }
    CHECK(normal == 1 && failure == 1,
          "key bad's dispatches: %d normal, %d failure (want 1 and 1)", normal,
          failure);
  }
  t_records_free(recs, n);
  regfree(&rfc3339);
  regfree(&rfc3339_s);
  printf("ok: %d telemetry events, every type and field as specified\n", n);
  return 0;
}

/* With spans exported, a message's events carry the context its handler
 * ran in, as the original's do: its `receive` span (the record's trace, a
 * span id of its own), with the record's tracestate. The endpoint is a
 * closed port: spans are made, their export fails quietly. */
T_SCENARIO(exported_span_is_the_events_trace_context, T_BOTH, 60) {
  char err[1024], topic[128], tm_topic[128], group[160], want_trace[33];
  prosody_config_t *conf;
  prosody_client_t *p, *c;
  prosody_handler_t h = {on_message, NULL, NULL, 0}; /* "traced": counted */
  prosody_trace_t trace = {TP, "k=v", NULL};
  t_record_t recs[4];
  const char *first = NULL;
  json_t *evs[4] = {NULL};
  int n, consumed = 0;

  snprintf(want_trace, sizeof(want_trace), "%.32s", TP + 3);
  make_topics("telemetry-span", topic, tm_topic, group);
  conf = t_config();
  t_set(conf, "telemetry_enabled", "false");
  t_set(conf, "source_system", "telemetry-span-producer");
  CHECK(p = prosody_client_new(conf, err, sizeof(err)), "producer: %s", err);
  CHECK_OK(prosody_send(p, topic, "traced", "{}", &trace, err, sizeof(err)),
           err);
  prosody_client_destroy(p);

  conf = t_consumer_config(group, topic);
  t_set(conf, "telemetry_topic", tm_topic);
  t_set(conf, "otel_exporter_otlp_endpoint", "http://127.0.0.1:1");
  CHECK(c = prosody_client_new(conf, err, sizeof(err)), "consumer: %s", err);
  CHECK_OK(prosody_subscribe(c, &h, err, sizeof(err)), err);
  CHECK(t_wait_at_least(&handled, 1, 60), "the record was not handled");
  CHECK_OK(prosody_unsubscribe(c), "unsubscribe");
  prosody_client_destroy(c); /* flushes its telemetry */

  n = t_read_back(tm_topic, 3, 8, recs); /* a third would be a stray event */
  CHECK(n == 2, "%d events, want dispatched and succeeded", n);
  for (int i = 0; i < n; i++) {
    const char *tp, *ts;
    CHECK(evs[i] = json_loads(recs[i].value, 0, NULL), "not JSON: %s",
          recs[i].value);
    tp = str(evs[i], "traceParent");
    ts = str(evs[i], "traceState");
    CHECK(tp && strlen(tp) == 55 && !strncmp(tp + 3, want_trace, 32) &&
              strncmp(tp + 36, TP + 36, 16),
          "traceParent %s: want the receive span's, in trace %s (not the "
          "record's own %s)",
          tp ? tp : "(none)", want_trace, TP);
    CHECK(ts && !strcmp(ts, "k=v"), "traceState %s", ts ? ts : "(none)");
    CHECK(!first || !strcmp(first, tp),
          "dispatched and succeeded in different spans: %s, %s", first, tp);
    first = tp;
    consumed++;
  }
  for (int i = 0; i < n; i++)
    json_decref(evs[i]);
  t_records_free(recs, n);
  printf("ok: %d events in the receive span's context\n", consumed);
  return 0;
}
