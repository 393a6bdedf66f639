/*
 * Trace propagation across send -> consume -> schedule -> timer, asserted
 * in a real Jaeger (started by scripts/services/jaeger; the real tier).
 *
 * An upstream client sends record "first" under a trace of the test's own
 * (root span P0 in trace T0). The consumer's handler schedules a timer and
 * sends record "second" from within the handler; a third client, whose
 * source system is the consumer's group, sends a record the consumer
 * filters out. Then Jaeger must hold, with the consumer's service name:
 *   T0: send (child of P0) -> receive "first" -> send -> receive "second"
 *   a trace of its own: send -> message.filtered
 *   a new trace: trigger, with a FOLLOWS_FROM link to receive "first"
 *   a load span for a deferred record fetched again from Kafka
 * with the messaging attributes, and the contexts the handlers saw
 * (prosody_message_traceparent / prosody_timer_traceparent) are those
 * spans'.
 *
 * The load span: records "d4" and "d5" (keys k4, k5) fail once each and are
 * deferred; with defer_cache_size=1 the first of them leaves the cache, so
 * its retry fetches it from Kafka again (loader.c), under a `load` span
 * with the record's topic, partition, offset, key and group.
 */
#include <curl/curl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "jaeger.h"

#define JAEGER_OTLP "http://127.0.0.1:4318"
#define JAEGER_QUERY "http://127.0.0.1:16686"
#define P0 "00f067aa0ba902b7"

/* The caller's trace: new in each run (Jaeger keeps earlier runs'). */
static char T0[33];

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int got_first, got_second, got_timer;
static char tp_first[64], tp_second[64], tp_timer[64];
static int spanned_first, spanned_timer;
/* guarded by mu: attempts of the deferred records "d4" and "d5", and their
 * offsets */
static int tries_d[2];
static int64_t offset_d[2];
static prosody_client_t *consumer;
static const char *topic;

static prosody_result_t on_message(prosody_context_t *ctx,
                                   const prosody_message_t *m, void *opaque) {
  char err[512];
  int spanned = 0;
  const char *tp = prosody_message_traceparent(m, &spanned);
  (void)opaque;
  if (strstr(prosody_message_payload(m), "\"first\"")) {
    CHECK_OK(prosody_schedule(ctx, (int64_t)(t_now() * 1000) + 1000, err,
                              sizeof(err)),
             err);
    /* No trace given: the record carries this handler's context. */
    CHECK_OK(prosody_send(consumer, topic, "k2", "{\"type\":\"second\"}", NULL,
                          err, sizeof(err)),
             err);
    pthread_mutex_lock(&mu);
    snprintf(tp_first, sizeof(tp_first), "%s", tp ? tp : "");
    spanned_first = spanned;
    got_first = 1;
    pthread_mutex_unlock(&mu);
  } else if (strstr(prosody_message_payload(m), "\"d4\"") ||
             strstr(prosody_message_payload(m), "\"d5\"")) {
    int i = strstr(prosody_message_payload(m), "\"d5\"") != NULL;
    int first;
    pthread_mutex_lock(&mu);
    first = tries_d[i]++ == 0;
    offset_d[i] = prosody_message_offset(m);
    pthread_mutex_unlock(&mu);
    return first ? PROSODY_TRANSIENT : PROSODY_SUCCESS; /* deferred once */
  } else if (strstr(prosody_message_payload(m), "\"second\"")) {
    pthread_mutex_lock(&mu);
    snprintf(tp_second, sizeof(tp_second), "%s", tp ? tp : "");
    got_second = 1;
    pthread_mutex_unlock(&mu);
  }
  return PROSODY_SUCCESS;
}

static prosody_result_t on_timer(prosody_context_t *ctx,
                                 const prosody_timer_t *t, void *opaque) {
  int spanned = 0;
  const char *tp = prosody_timer_traceparent(t, &spanned);
  (void)ctx;
  (void)opaque;
  pthread_mutex_lock(&mu);
  snprintf(tp_timer, sizeof(tp_timer), "%s", tp ? tp : "");
  spanned_timer = spanned;
  got_timer = 1;
  pthread_mutex_unlock(&mu);
  return PROSODY_SUCCESS;
}

/* --- Jaeger's query API -------------------------------------------------- */

/* The spans of trace `id` (32 hex) once Jaeger holds at least `want` of
 * them (polled for up to 30 s), and its processes (both owned). */
static json_t *trace_spans(const char *id, size_t want, json_t **processes) {
  char url[256];
  double deadline = t_now() + 30;
  snprintf(url, sizeof(url), JAEGER_QUERY "/api/traces/%s", id);
  for (;; usleep(200000)) {
    json_t *doc = t_get_json(url, NULL);
    json_t *t = json_array_get(json_object_get(doc, "data"), 0);
    json_t *spans = json_object_get(t, "spans");
    if (spans && json_array_size(spans) >= want) {
      json_incref(spans);
      *processes = json_incref(json_object_get(t, "processes"));
      json_decref(doc);
      return spans;
    }
    json_decref(doc);
    CHECK(t_now() < deadline,
          "Jaeger has not shown %zu spans of trace %s within 30 s", want, id);
  }
}

static const char *str_of(json_t *o, const char *k) {
  return json_string_value(json_object_get(o, k));
}

/* The span with `name` whose reference of type `ref` is `parent_span`
 * (NULL: any); NULL when none. */
static json_t *find_span(json_t *spans, const char *name, const char *ref,
                         const char *parent_trace, const char *parent_span) {
  size_t i, j;
  json_t *s, *r;
  json_array_foreach(spans, i, s) {
    if (strcmp(str_of(s, "operationName"), name))
      continue;
    json_array_foreach(json_object_get(s, "references"), j, r) {
      if (!strcmp(str_of(r, "refType"), ref) &&
          (!parent_trace || !strcmp(str_of(r, "traceID"), parent_trace)) &&
          (!parent_span || !strcmp(str_of(r, "spanID"), parent_span)))
        return s;
    }
  }
  return NULL;
}

/* The span's tag `key` as text ("" when absent). */
static const char *tag(json_t *span, const char *key, char *out, size_t n) {
  size_t i;
  json_t *t;
  out[0] = '\0';
  json_array_foreach(json_object_get(span, "tags"), i, t) {
    if (strcmp(str_of(t, "key"), key))
      continue;
    json_t *v = json_object_get(t, "value");
    if (json_is_string(v))
      snprintf(out, n, "%s", json_string_value(v));
    else if (json_is_integer(v))
      snprintf(out, n, "%lld", (long long)json_integer_value(v));
    else if (json_is_true(v))
      snprintf(out, n, "true");
  }
  return out;
}

/* "00-<trace>-<span>-01" -> its parts. */
static void split_tp(const char *tp, char trace[33], char span[17]) {
  CHECK(strlen(tp) == 55, "not a traceparent: \"%s\"", tp);
  memcpy(trace, tp + 3, 32);
  trace[32] = '\0';
  memcpy(span, tp + 36, 16);
  span[16] = '\0';
}

static prosody_client_t *sender(const char *service, const char *source) {
  char err[1024];
  prosody_config_t *conf = t_config();
  prosody_client_t *c;
  t_set(conf, "otel_exporter_otlp_endpoint", JAEGER_OTLP);
  t_set(conf, "otel_service_name", service);
  t_set(conf, "source_system", source);
  CHECK(c = prosody_client_new(conf, err, sizeof(err)), "client: %s", err);
  return c;
}

T_SCENARIO(trace_follows_send_consume_schedule_timer_in_jaeger, T_REAL, 180) {
  char err[1024], service[96], group[96], v[256];
  char t_first[33], s_first[17], t_second[33], s_second[17], t_timer[33],
      s_timer[17];
  char root_tp[64];
  prosody_trace_t root = {.traceparent = root_tp};
  prosody_handler_t h = {on_message, on_timer, NULL, 0};
  prosody_client_t *up, *looped;
  prosody_config_t *conf;
  json_t *spans, *procs, *send1, *recv1, *send2, *recv2, *filtered, *trig;

  curl_global_init(CURL_GLOBAL_DEFAULT);
  srand((unsigned)(getpid() ^ (int)(t_now() * 1000)));
  for (int i = 0; i < 32; i++)
    T0[i] = "0123456789abcdef"[rand() % 16];
  T0[0] = '1'; /* never all zero */
  snprintf(root_tp, sizeof(root_tp), "00-%s-%s-01", T0, P0);
  topic = t_topic("trace-chain");
  snprintf(group, sizeof(group), "trace-chain-%d", (int)getpid());
  snprintf(service, sizeof(service), "prosody-chain-%d-%ld", (int)getpid(),
           (long)(t_now() * 1000) % 100000);
  t_create_topic(topic, 1);

  conf = t_consumer_config(group, topic);
  t_set(conf, "otel_exporter_otlp_endpoint", JAEGER_OTLP);
  t_set(conf, "otel_service_name", service);
  t_set(conf, "source_system", "chain-consumer"); /* its sends are read */
  t_set(conf, "defer_cache_size", "1"); /* one of d4, d5 is fetched again */
  t_set(conf, "defer_base", "1s");
  CHECK(consumer = prosody_client_new(conf, err, sizeof(err)), "client: %s",
        err);
  CHECK_OK(prosody_subscribe(consumer, &h, err, sizeof(err)), err);

  up = sender("chain-upstream", "upstream");
  looped = sender("chain-looped", group); /* the consumer's own output */
  CHECK_OK(prosody_send(up, topic, "k1", "{\"type\":\"first\"}", &root, err,
                        sizeof(err)),
           err);
  CHECK_OK(prosody_send(looped, topic, "k3", "{\"type\":\"looped\"}", NULL, err,
                        sizeof(err)),
           err);
  CHECK(t_wait_locked(&mu, &got_second, 1, 60), "second record not handled");
  CHECK(t_wait_locked(&mu, &got_timer, 1, 60), "timer did not fire");
  /* After two successes, so the failure rate (2 of 4) allows deferral. */
  CHECK_OK(prosody_send(up, topic, "k4", "{\"type\":\"d4\"}", NULL, err,
                        sizeof(err)),
           err);
  CHECK_OK(prosody_send(up, topic, "k5", "{\"type\":\"d5\"}", NULL, err,
                        sizeof(err)),
           err);
  CHECK(t_wait_locked(&mu, &tries_d[0], 2, 60) >= 2 &&
            t_wait_locked(&mu, &tries_d[1], 2, 60) >= 2,
        "the deferred records were not retried (attempts %d %d)", tries_d[0],
        tries_d[1]);
  /* Closing flushes each client's spans. */
  prosody_client_destroy(consumer);
  prosody_client_destroy(up);
  prosody_client_destroy(looped);

  CHECK(spanned_first && spanned_timer,
        "handlers did not run in the client's spans (%d %d)", spanned_first,
        spanned_timer);
  split_tp(tp_first, t_first, s_first);
  split_tp(tp_second, t_second, s_second);
  split_tp(tp_timer, t_timer, s_timer);
  CHECK(!strcmp(t_first, T0) && !strcmp(t_second, T0),
        "messages left the producer's trace: %s %s", tp_first, tp_second);
  CHECK(strcmp(t_timer, T0), "timer_spans follows_from: a new trace");

  /* T0: send, receive, send, receive. */
  spans = trace_spans(T0, 4, &procs);
  send1 = find_span(spans, "send", "CHILD_OF", T0, P0);
  CHECK(send1, "no send span child of the caller's span");
  recv1 = find_span(spans, "receive", "CHILD_OF", T0, str_of(send1, "spanID"));
  CHECK(recv1, "no receive span child of the send span");
  CHECK(!strcmp(str_of(recv1, "spanID"), s_first),
        "the handler saw %s, not its receive span %s", s_first,
        str_of(recv1, "spanID"));
  send2 = find_span(spans, "send", "CHILD_OF", T0, s_first);
  CHECK(send2, "the handler's send is not a child of its receive span");
  recv2 = find_span(spans, "receive", "CHILD_OF", T0, str_of(send2, "spanID"));
  CHECK(recv2 && !strcmp(str_of(recv2, "spanID"), s_second),
        "no receive span of the second record under the handler's send");
  CHECK(!strcmp(tag(recv1, "messaging.system", v, sizeof(v)), "kafka"),
        "messaging.system %s", v);
  CHECK(!strcmp(tag(recv1, "messaging.destination.name", v, sizeof(v)), topic),
        "destination %s", v);
  CHECK(!strcmp(tag(recv1, "messaging.destination.partition.id", v, sizeof(v)),
                "0"),
        "partition %s", v);
  CHECK(!strcmp(tag(recv1, "messaging.kafka.offset", v, sizeof(v)), "0"),
        "offset %s", v);
  CHECK(!strcmp(tag(recv1, "messaging.kafka.message.key", v, sizeof(v)), "k1"),
        "key %s", v);
  CHECK(
      !strcmp(tag(recv1, "messaging.consumer.group.name", v, sizeof(v)), group),
      "group %s", v);
  CHECK(!strcmp(tag(send2, "messaging.destination.name", v, sizeof(v)), topic),
        "send destination %s", v);
  CHECK(!strcmp(tag(send2, "messaging.kafka.offset", v, sizeof(v)), "1") ||
            !strcmp(v, "2"),
        "send offset %s", v);
  {
    const char *pid = str_of(recv1, "processID");
    json_t *p = json_object_get(procs, pid);
    CHECK(p && !strcmp(str_of(p, "serviceName"), service),
          "receive span's service is not %s", service);
  }
  json_decref(spans);
  json_decref(procs);

  /* The filtered record: a trace of its own (sent without a context),
   * found through Jaeger's search by service and operation. */
  {
    char url[512];
    double deadline = t_now() + 30;
    json_t *send3 = NULL;
    snprintf(url, sizeof(url),
             JAEGER_QUERY "/api/traces?service=%s&operation=message.filtered"
                          "&limit=5",
             service);
    for (filtered = NULL; !filtered; usleep(200000)) {
      json_t *doc = t_get_json(url, NULL);
      json_t *ss = json_object_get(
          json_array_get(json_object_get(doc, "data"), 0), "spans");
      send3 = ss ? find_span(ss, "send", "CHILD_OF", NULL, NULL) : NULL;
      for (size_t i = 0; !send3 && i < json_array_size(ss); i++)
        if (!strcmp(str_of(json_array_get(ss, i), "operationName"), "send"))
          send3 = json_array_get(ss, i); /* a root: no references */
      if (send3)
        filtered = find_span(ss, "message.filtered", "CHILD_OF", NULL,
                             str_of(send3, "spanID"));
      json_incref(filtered);
      json_decref(doc);
      CHECK(filtered || t_now() < deadline,
            "no message.filtered span under its send span in Jaeger within "
            "30 s");
    }
    CHECK(!strcmp(tag(filtered, "prosody.filter.reason", v, sizeof(v)),
                  "our own output"),
          "filter reason \"%s\"", v);
    CHECK(!strcmp(tag(filtered, "messaging.kafka.message.key", v, sizeof(v)),
                  "k3"),
          "filtered key %s", v);
    json_decref(filtered);
  }

  /* The deferred record fetched again: a `load` span. */
  {
    char url[512], key[8], want_off[24];
    double deadline = t_now() + 30;
    json_t *load = NULL;
    snprintf(url, sizeof(url),
             JAEGER_QUERY "/api/traces?service=%s&operation=load&limit=5",
             service);
    while (!load) {
      json_t *doc = t_get_json(url, NULL);
      json_t *ss = json_object_get(
          json_array_get(json_object_get(doc, "data"), 0), "spans");
      for (size_t i = 0; !load && i < json_array_size(ss); i++)
        if (!strcmp(str_of(json_array_get(ss, i), "operationName"), "load"))
          load = json_incref(json_array_get(ss, i));
      json_decref(doc);
      CHECK(load || t_now() < deadline, "no load span in Jaeger within 30 s");
      if (!load)
        usleep(200000);
    }
    snprintf(key, sizeof(key), "%s",
             tag(load, "messaging.kafka.message.key", v, sizeof(v)));
    CHECK(!strcmp(key, "k4") || !strcmp(key, "k5"), "load key \"%s\"", key);
    snprintf(want_off, sizeof(want_off), "%lld",
             (long long)offset_d[!strcmp(key, "k5")]);
    CHECK(!strcmp(tag(load, "messaging.kafka.offset", v, sizeof(v)), want_off),
          "load offset %s, want %s", v, want_off);
    CHECK(!strcmp(tag(load, "messaging.destination.name", v, sizeof(v)), topic),
          "load destination %s", v);
    CHECK(!strcmp(tag(load, "messaging.destination.partition.id", v, sizeof(v)),
                  "0"),
          "load partition %s", v);
    CHECK(!strcmp(tag(load, "messaging.consumer.group.name", v, sizeof(v)),
                  group),
          "load group %s", v);
    CHECK(!strcmp(tag(load, "span.kind", v, sizeof(v)), "client"),
          "load span.kind %s", v);
    CHECK(!strcmp(tag(load, "error", v, sizeof(v)), ""), "load failed");
    json_decref(load);
  }

  /* The timer: a trace of its own, linked to the scheduling span. */
  spans = trace_spans(t_timer, 1, &procs);
  trig = find_span(spans, "trigger", "FOLLOWS_FROM", T0, s_first);
  CHECK(trig, "no trigger span linked (FOLLOWS_FROM) to receive span %s",
        s_first);
  CHECK(!strcmp(str_of(trig, "spanID"), s_timer),
        "the timer handler saw %s, not its trigger span", s_timer);
  CHECK(!strcmp(tag(trig, "messaging.kafka.message.key", v, sizeof(v)), "k1"),
        "timer key %s", v);
  for (size_t i = 0; i < json_array_size(json_object_get(trig, "references"));
       i++)
    CHECK(strcmp(str_of(json_array_get(json_object_get(trig, "references"), i),
                        "refType"),
                 "CHILD_OF"),
          "the trigger span has a parent: follows_from makes a new trace");
  json_decref(spans);
  json_decref(procs);
  curl_global_cleanup();
  printf("ok: send -> receive -> send -> receive, filtered, a linked "
         "trigger span and a load span, in Jaeger\n");
  return 0;
}
