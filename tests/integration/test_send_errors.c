/*
 * test_send_errors.c - bad input gets a clear, classified error before
 * anything is sent: invalid JSON (with line and column), missing or
 * non-UTF-8 keys, bad topic names, malformed traceparent, records larger
 * than the producer accepts (permanent), NULL handles.
 */
#include "harness.h"

static void expect(prosody_err_t got, prosody_err_t want, const char *err,
                   const char *needle, const char *what) {
  CHECK(got == want, "%s: got %s (%s), want %s", what, prosody_err_name(got),
        err, prosody_err_name(want));
  CHECK(strstr(err, needle), "%s: message \"%s\" lacks \"%s\"", what, err,
        needle);
}

T_SCENARIO(bad_input_refused_with_named_error_and_nothing_sent, T_BOTH, 60) {
  char err[1024];
  const char *topic = t_topic("send-errors");
  prosody_config_t *conf = t_config();
  prosody_client_t *client;
  prosody_trace_t bad_trace = {"00-xyz", NULL, NULL};
  char *big;
  t_record_t recs[1];
  prosody_err_t e;

  t_create_topic(topic, 1);
  t_set(conf, "source_system", "errors");
  client = prosody_client_new(conf, err, sizeof(err));
  CHECK(client, "client: %s", err);

  e = prosody_send(client, topic, "k", "{\"a\": 1,,}", NULL, err, sizeof(err));
  expect(e, PROSODY_ERR_INVALID_PAYLOAD, err, "is not valid JSON", "bad JSON");
  CHECK(strstr(err, "line 1, column"), "no position in \"%s\"", err);
  CHECK(strstr(err, topic), "topic missing from \"%s\"", err);
  e = prosody_send(client, topic, "k", "", NULL, err, sizeof(err));
  expect(e, PROSODY_ERR_INVALID_PAYLOAD, err, "not valid JSON", "empty");
  e = prosody_send(client, topic, "k", "{} trailing", NULL, err, sizeof(err));
  expect(e, PROSODY_ERR_INVALID_PAYLOAD, err, "not valid JSON", "trailing");
  e = prosody_send(client, topic, "k", "\"\xff\"", NULL, err, sizeof(err));
  expect(e, PROSODY_ERR_INVALID_PAYLOAD, err, "not valid JSON", "bad UTF-8");
  e = prosody_send(client, topic, "k", NULL, NULL, err, sizeof(err));
  expect(e, PROSODY_ERR_INVALID_PAYLOAD, err, "is NULL", "NULL payload");
  e = prosody_send(client, topic, NULL, "{}", NULL, err, sizeof(err));
  expect(e, PROSODY_ERR_INVALID_ARG, err, "key is NULL", "NULL key");
  e = prosody_send(client, topic, "\xc3(", "{}", NULL, err, sizeof(err));
  expect(e, PROSODY_ERR_INVALID_ARG, err, "not valid UTF-8", "key UTF-8");
  e = prosody_send(client, "bad topic", "k", "{}", NULL, err, sizeof(err));
  expect(e, PROSODY_ERR_INVALID_ARG, err, "contains ' '", "topic name");
  e = prosody_send(client, NULL, "k", "{}", NULL, err, sizeof(err));
  expect(e, PROSODY_ERR_INVALID_ARG, err, "topic is NULL", "NULL topic");
  e = prosody_send(client, topic, "k", "{}", &bad_trace, err, sizeof(err));
  expect(e, PROSODY_ERR_INVALID_ARG, err, "traceparent", "traceparent");
  e = prosody_send(NULL, topic, "k", "{}", NULL, err, sizeof(err));
  expect(e, PROSODY_ERR_INVALID_ARG, err, "client is NULL", "NULL client");

  /* 2 MB exceeds the producer's message.max.bytes (1 MB): permanent. */
  big = malloc(2 * 1024 * 1024 + 3);
  big[0] = '"';
  memset(big + 1, 'x', 2 * 1024 * 1024);
  big[2 * 1024 * 1024 + 1] = '"';
  big[2 * 1024 * 1024 + 2] = '\0';
  e = prosody_send(client, topic, "big", big, NULL, err, sizeof(err));
  CHECK(e == PROSODY_ERR_PERMANENT, "2 MB record: %s (%s)", prosody_err_name(e),
        err);
  CHECK(!prosody_err_is_transient(e), "too-large must not be retried");
  free(big);

  /* Nothing rejected above reached the topic; a valid record still does. */
  CHECK_OK(prosody_send(client, topic, "good", "{\"ok\":true}", NULL, err,
                        sizeof(err)),
           err);
  prosody_client_destroy(client);
  CHECK(t_read_back(topic, 1, 20, recs) == 1, "valid record missing");
  CHECK(!strcmp(recs[0].key, "good"), "first record is %s", recs[0].key);
  t_records_free(recs, 1);
  {
    /* ... and it is the only one. */
    t_record_t more[2];
    int n = t_read_back(topic, 2, 2, more);
    CHECK(n == 1, "%d records on the topic, want 1", n);
    t_records_free(more, n);
  }
  return 0;
}

/* Handles: NULL is a no-op for destroy, an error for new. */
T_SCENARIO(null_handles_noop_on_destroy_refused_on_new, T_BOTH, 30) {
  char err[1024];
  prosody_client_destroy(NULL);
  prosody_admin_destroy(NULL);
  CHECK(!prosody_client_new(NULL, err, sizeof(err)), "NULL conf accepted");
  printf("ok\n");
  return 0;
}
