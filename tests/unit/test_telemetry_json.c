/*
 * test_telemetry_json.c - the telemetry topic's JSON (src/kafka/telemetry.c):
 * valid JSON whatever the key and error text hold (quotes, control bytes,
 * bytes that are not UTF-8, tens of kilobytes), each type with the fields
 * it carries and none it does not, and each kind's text exactly as the
 * original Prosody (prosody-events 0.6.1) writes it: its field names,
 * their order, its timestamp formats and enum spellings (the expected
 * texts are its records as read back from its telemetry topic, with our
 * values).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "config/config.h"
#include "kafka/kafka.h"

static pr__tm_t *tm;
static pr__settings_t st;
static char out[1 << 18];

static int setup(void **state) {
  char err[256];
  prosody_config_t *conf = prosody_config_new();
  (void)state;
  assert_int_equal(prosody_config_set(conf, "mock", "true", err, sizeof(err)),
                   PROSODY_OK);
  assert_int_equal(pr__settings_resolve(conf, &st, err, sizeof(err)), 0);
  prosody_config_destroy(conf);
  tm = pr__tm_new(&st, "127.0.0.1:1"); /* its producer: never made here */
  assert_non_null(tm);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  pr__tm_free(tm);
  pr__settings_fini(&st);
  return 0;
}

static json_t *parse(const pr__tm_event_t *ev) {
  json_error_t je;
  size_t n = pr__tm_json(tm, ev, INT64_C(1796393797123), out, sizeof(out));
  json_t *o;
  assert_int_equal(strlen(out), n);
  o = json_loads(out, 0, &je);
  if (!o)
    fail_msg("not JSON (%s): %.200s", je.text, out);
  return o;
}

static const char *str(json_t *o, const char *k) {
  json_t *v = json_object_get(o, k);
  return json_is_string(v) ? json_string_value(v) : NULL;
}

static void test_hostile_text(void **state) {
  static char key[20001], exc[10001];
  pr__tm_event_t ev = {.type = PR_TM_MESSAGE_FAILED,
                       .topic = "t\"1",
                       .partition = 3,
                       .offset = 42,
                       .key = key,
                       .source = "g",
                       .failure_demand = 1,
                       .error_category = "transient",
                       .exception = exc};
  json_t *o;
  (void)state;
  memset(key, 'k', sizeof(key) - 1);
  key[0] = '"';
  key[1] = '\\';
  key[2] = '\n';
  key[3] = (char)0xC3; /* a lone lead byte: not UTF-8 */
  key[4] = 'x';
  memcpy(key + 5, "\xC3\xA9", 2); /* é: kept */
  memset(exc, 'e', sizeof(exc) - 1);
  exc[0] = '\x01';
  o = parse(&ev);
  assert_string_equal(str(o, "type"), "prosody.message.failed");
  assert_string_equal(str(o, "eventTime"), "2026-12-04T14:16:37.123Z");
  assert_string_equal(str(o, "topic"), "t\"1");
  assert_int_equal(json_integer_value(json_object_get(o, "partition")), 3);
  assert_int_equal(json_integer_value(json_object_get(o, "offset")), 42);
  assert_int_equal(strlen(str(o, "key")), 20000 + 2); /* U+FFFD: 3 bytes */
  assert_memory_equal(str(o, "key"), "\"\\\n\xEF\xBF\xBDx\xC3\xA9", 9);
  assert_string_equal(str(o, "demandType"), "failure");
  assert_string_equal(str(o, "errorCategory"), "transient");
  assert_int_equal(strlen(str(o, "exception")), 4096); /* cut */
  assert_int_equal(str(o, "exception")[0], 1);
  assert_null(json_object_get(o, "scheduledTime"));
  assert_null(json_object_get(o, "traceParent"));
  json_decref(o);
}

static void test_timer_fields(void **state) {
  pr__tm_event_t ev = {.type = PR_TM_TIMER_SCHEDULED,
                       .topic = "t",
                       .partition = 0,
                       .offset = -1,
                       .time_ms = INT64_C(1796393797000),
                       .timer_type = "application",
                       .key = "k",
                       .source = "g"};
  json_t *o;
  (void)state;
  o = parse(&ev);
  assert_string_equal(str(o, "type"), "prosody.timer.scheduled");
  assert_string_equal(str(o, "scheduledTime"), "2026-12-04T14:16:37Z");
  assert_string_equal(str(o, "timerType"), "application");
  assert_null(json_object_get(o, "offset"));
  assert_null(json_object_get(o, "demandType")); /* not a handler run */
  assert_non_null(str(o, "hostname"));
  json_decref(o);
  ev.type = PR_TM_TIMER_SUCCEEDED;
  o = parse(&ev);
  assert_string_equal(str(o, "demandType"), "normal");
  assert_null(json_object_get(o, "errorCategory"));
  json_decref(o);
}

static void test_trace_and_sent(void **state) {
  pr__tm_event_t ev = {
      .type = PR_TM_MESSAGE_SENT,
      .topic = "t",
      .partition = 1,
      .offset = 7,
      .key = "k",
      .source = "sys",
      .traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
      .tracestate = "a=b"};
  json_t *o;
  (void)state;
  o = parse(&ev);
  assert_string_equal(str(o, "type"), "prosody.message.sent");
  assert_string_equal(str(o, "source"), "sys");
  assert_string_equal(str(o, "traceParent"), ev.traceparent);
  assert_string_equal(str(o, "traceState"), "a=b");
  assert_null(json_object_get(o, "demandType"));
  json_decref(o);
}

/* `want` with "%s" for the hostname. */
static void assert_text(const pr__tm_event_t *ev, const char *want) {
  char host[256] = "", expect[2048];
  gethostname(host, sizeof(host) - 1);
  snprintf(expect, sizeof(expect), want, host);
  pr__tm_json(tm, ev, INT64_C(1796393797123), out, sizeof(out));
  assert_string_equal(out, expect);
}

#define TP_A "00-0af7651916cd43dd8448eb211c80319c-b87022c0864e7890-01"

static void test_message_text_as_original(void **state) {
  pr__tm_event_t ev = {.type = PR_TM_MESSAGE_FAILED,
                       .topic = "in",
                       .partition = 0,
                       .offset = 1,
                       .key = "bad",
                       .source = "g",
                       .error_category = "permanent",
                       .exception = "Boom: boom for bad",
                       .traceparent = TP_A};
  (void)state;
  assert_text(&ev, "{\"type\":\"prosody.message.failed\","
                   "\"eventTime\":\"2026-12-04T14:16:37.123Z\",\"offset\":1,"
                   "\"topic\":\"in\",\"partition\":0,\"key\":\"bad\","
                   "\"source\":\"g\",\"hostname\":\"%s\","
                   "\"demandType\":\"normal\",\"errorCategory\":\"permanent\","
                   "\"exception\":\"Boom: boom for bad\","
                   "\"traceParent\":\"" TP_A "\",\"traceState\":\"\"}");
  ev.type = PR_TM_MESSAGE_DISPATCHED;
  ev.failure_demand = 1;
  ev.error_category = ev.exception = NULL;
  ev.traceparent = NULL;
  ev.tracestate = "a=b"; /* no traceState without a traceParent */
  assert_text(&ev, "{\"type\":\"prosody.message.dispatched\","
                   "\"eventTime\":\"2026-12-04T14:16:37.123Z\",\"offset\":1,"
                   "\"topic\":\"in\",\"partition\":0,\"key\":\"bad\","
                   "\"source\":\"g\",\"hostname\":\"%s\","
                   "\"demandType\":\"failure\"}");
}

static void test_timer_text_as_original(void **state) {
  pr__tm_event_t ev = {.type = PR_TM_TIMER_SCHEDULED,
                       .topic = "in",
                       .partition = 2,
                       .offset = -1,
                       .time_ms = INT64_C(1796393799000),
                       .timer_type = "application",
                       .key = "ok",
                       .source = "g",
                       .traceparent = TP_A,
                       .tracestate = "vendor=x"};
  (void)state;
  assert_text(&ev, "{\"type\":\"prosody.timer.scheduled\","
                   "\"eventTime\":\"2026-12-04T14:16:37.123Z\","
                   "\"scheduledTime\":\"2026-12-04T14:16:39Z\","
                   "\"timerType\":\"application\",\"topic\":\"in\","
                   "\"partition\":2,\"key\":\"ok\",\"source\":\"g\","
                   "\"hostname\":\"%s\",\"traceParent\":\"" TP_A "\","
                   "\"traceState\":\"vendor=x\"}");
  ev.type = PR_TM_TIMER_FAILED;
  ev.timer_type = "deferredTimer";
  ev.failure_demand = 1;
  ev.error_category = "transient";
  ev.exception = "x";
  ev.traceparent = ev.tracestate = NULL;
  assert_text(&ev, "{\"type\":\"prosody.timer.failed\","
                   "\"eventTime\":\"2026-12-04T14:16:37.123Z\","
                   "\"scheduledTime\":\"2026-12-04T14:16:39Z\","
                   "\"timerType\":\"deferredTimer\",\"topic\":\"in\","
                   "\"partition\":2,\"key\":\"ok\",\"source\":\"g\","
                   "\"hostname\":\"%s\",\"demandType\":\"failure\","
                   "\"errorCategory\":\"transient\",\"exception\":\"x\"}");
}

static void test_sent_text_as_original(void **state) {
  pr__tm_event_t ev = {.type = PR_TM_MESSAGE_SENT,
                       .topic = "out",
                       .partition = 0,
                       .offset = 0,
                       .key = "sent-ok",
                       .source = "src",
                       .traceparent = TP_A,
                       .tracestate = "vendor=x"};
  (void)state;
  assert_text(&ev, "{\"type\":\"prosody.message.sent\","
                   "\"eventTime\":\"2026-12-04T14:16:37.123Z\","
                   "\"topic\":\"out\",\"partition\":0,\"offset\":0,"
                   "\"key\":\"sent-ok\",\"source\":\"src\","
                   "\"hostname\":\"%s\",\"traceParent\":\"" TP_A "\","
                   "\"traceState\":\"vendor=x\"}");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_hostile_text),
      cmocka_unit_test(test_timer_fields),
      cmocka_unit_test(test_trace_and_sent),
      cmocka_unit_test(test_message_text_as_original),
      cmocka_unit_test(test_timer_text_as_original),
      cmocka_unit_test(test_sent_text_as_original),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
