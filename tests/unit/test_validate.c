/*
 * test_validate.c - input checks applied before anything reaches Kafka:
 * UTF-8 keys, topic names and W3C traceparent headers; and how Kafka's
 * errors are classified and explained.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "config/config.h"
#include "kafka/kafka.h"
#include "util/util.h"

#define UTF8(s) pr__utf8_valid(s, sizeof(s) - 1)

static void test_utf8(void **state) {
  (void)state;
  assert_true(UTF8(""));
  assert_true(UTF8("plain ascii"));
  assert_true(UTF8("caf\xc3\xa9"));       /* é */
  assert_true(UTF8("\xe2\x82\xac"));      /* € */
  assert_true(UTF8("\xf0\x9f\x98\x80"));  /* emoji */
  assert_false(UTF8("\xc3"));             /* truncated */
  assert_false(UTF8("\xe2\x82"));         /* truncated */
  assert_false(UTF8("\xc0\xaf"));         /* overlong '/' */
  assert_false(UTF8("\xe0\x80\xaf"));     /* overlong */
  assert_false(UTF8("\xed\xa0\x80"));     /* surrogate */
  assert_false(UTF8("\xf4\x90\x80\x80")); /* > U+10FFFF */
  assert_false(UTF8("\xff"));
  assert_false(UTF8("ok\x80")); /* stray continuation */
  /* past the eight-byte ASCII steps: before, across and after them */
  assert_true(UTF8("key-0001key-0002caf\xc3\xa9"));
  assert_true(UTF8("key-000\xc3\xa9key-0002"));
  assert_false(UTF8("key-0001key-0002\xc3"));
  assert_false(UTF8("key-000\xc0\xafkey-0002"));
  assert_false(UTF8("key-0001\x80key-0002"));
  assert_false(UTF8("key-0001key-000\xff"));
}

static void test_topic_names(void **state) {
  char why[256], long_name[300];
  (void)state;
  assert_int_equal(pr__topic_name_check("orders.v1_x-y", why, sizeof(why)), 0);
  assert_int_equal(pr__topic_name_check("", why, sizeof(why)), -1);
  assert_int_equal(pr__topic_name_check(".", why, sizeof(why)), -1);
  assert_int_equal(pr__topic_name_check("..", why, sizeof(why)), -1);
  assert_int_equal(pr__topic_name_check("a b", why, sizeof(why)), -1);
  assert_non_null(strstr(why, "contains ' '"));
  memset(long_name, 'a', 250);
  long_name[250] = '\0';
  assert_int_equal(pr__topic_name_check(long_name, why, sizeof(why)), -1);
  assert_non_null(strstr(why, "at most 249"));
  long_name[249] = '\0';
  assert_int_equal(pr__topic_name_check(long_name, why, sizeof(why)), 0);
}

static void test_traceparent(void **state) {
  char why[256];
  (void)state;
  assert_int_equal(
      pr__traceparent_check(
          "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", why,
          sizeof(why)),
      0);
  /* A future version may append fields after a dash. */
  assert_int_equal(
      pr__traceparent_check(
          "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-xyz", why,
          sizeof(why)),
      0);
  /* Version 00 has exactly four fields. */
  assert_int_equal(
      pr__traceparent_check(
          "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-xyz", why,
          sizeof(why)),
      -1);
  assert_int_equal(
      pr__traceparent_check(
          "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", why,
          sizeof(why)),
      -1);
  assert_int_equal(
      pr__traceparent_check(
          "00-00000000000000000000000000000000-00f067aa0ba902b7-01", why,
          sizeof(why)),
      -1);
  assert_non_null(strstr(why, "trace id"));
  assert_int_equal(
      pr__traceparent_check(
          "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", why,
          sizeof(why)),
      -1);
  assert_non_null(strstr(why, "parent id"));
  assert_int_equal(
      pr__traceparent_check(
          "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", why,
          sizeof(why)),
      -1);
  assert_int_equal(pr__traceparent_check("garbage", why, sizeof(why)), -1);
  assert_int_equal(
      pr__traceparent_check(
          "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g", why,
          sizeof(why)),
      -1);
}

static void test_classify(void **state) {
  (void)state;
  assert_int_equal(pr__kafka_classify(RD_KAFKA_RESP_ERR_NO_ERROR), PROSODY_OK);
  assert_int_equal(pr__kafka_classify(RD_KAFKA_RESP_ERR__MSG_TIMED_OUT),
                   PROSODY_ERR_TIMEOUT);
  assert_int_equal(pr__kafka_classify(RD_KAFKA_RESP_ERR__TRANSPORT),
                   PROSODY_ERR_TRANSIENT);
  assert_int_equal(pr__kafka_classify(RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN),
                   PROSODY_ERR_TRANSIENT);
  assert_int_equal(
      pr__kafka_classify(RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION),
      PROSODY_ERR_TRANSIENT);
  assert_int_equal(pr__kafka_classify(RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE),
                   PROSODY_ERR_PERMANENT);
  assert_int_equal(
      pr__kafka_classify(RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED),
      PROSODY_ERR_PERMANENT);
  assert_int_equal(pr__kafka_classify(RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS),
                   PROSODY_ERR_TOPIC_EXISTS);
  assert_int_equal(pr__kafka_classify(RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART),
                   PROSODY_ERR_UNKNOWN_TOPIC);
}

/* A failed OAUTHBEARER token request names the endpoint, without the user
 * information a URL may carry. */
static void explain_oauth(const char *url, const char *want) {
  rd_kafka_conf_t *conf = rd_kafka_conf_new();
  char err[256], out[1024];
  rd_kafka_t *rk;
  assert_int_equal(rd_kafka_conf_set(conf, "log_level", "3", err, sizeof(err)),
                   RD_KAFKA_CONF_OK);
  assert_int_equal(rd_kafka_conf_set(conf,
                                     "sasl.oauthbearer.token.endpoint.url", url,
                                     err, sizeof(err)),
                   RD_KAFKA_CONF_OK);
  rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
  assert_non_null(rk);
  pr__kafka_explain(rk, "Failed to acquire SASL OAUTHBEARER token: refused",
                    out, sizeof(out));
  rd_kafka_destroy(rk);
  assert_non_null(strstr(out, "Failed to acquire SASL OAUTHBEARER token: "
                              "refused (the token request to "));
  assert_non_null(strstr(out, want));
  assert_non_null(strstr(out, "kafka_sasl_oauthbearer_client_secret"));
  assert_null(strstr(out, "pw@"));
}

static void test_explain_oauthbearer(void **state) {
  (void)state;
  explain_oauth("http://127.0.0.1:8080/token",
                "to http://127.0.0.1:8080/token, "
                "kafka_sasl_oauthbearer_token_endpoint_url, failed");
  explain_oauth("https://user:pw@idp.example/oauth2/token",
                "to https://idp.example/oauth2/token, ");
  explain_oauth("https://user:pw@idp.example", "to https://idp.example, ");
  /* an @ in the path is no user information */
  explain_oauth("https://idp.example/a@b", "to https://idp.example/a@b, ");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_utf8),
      cmocka_unit_test(test_topic_names),
      cmocka_unit_test(test_traceparent),
      cmocka_unit_test(test_classify),
      cmocka_unit_test(test_explain_oauthbearer),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
