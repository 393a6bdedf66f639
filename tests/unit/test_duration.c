/*
 * test_duration.c - humantime duration parsing and formatting.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "config/config.h"

#define S INT64_C(1000000000)

static int64_t parse_ok(const char *text) {
  int64_t ns = -1;
  char err[256] = "";
  if (pr__duration_parse(text, &ns, err, sizeof(err)) != 0)
    fail_msg("\"%s\" should parse, got: %s", text, err);
  return ns;
}

static void parse_err(const char *text, const char *needle) {
  int64_t ns = -1;
  char err[256] = "";
  if (pr__duration_parse(text, &ns, err, sizeof(err)) == 0)
    fail_msg("\"%s\" should be rejected, parsed as %lld ns", text,
             (long long)ns);
  if (!strstr(err, needle))
    fail_msg("error for \"%s\" is \"%s\"; expected it to contain \"%s\"", text,
             err, needle);
}

static void test_units(void **state) {
  (void)state;
  assert_int_equal(parse_ok("10ns"), 10);
  assert_int_equal(parse_ok("10nsec"), 10);
  assert_int_equal(parse_ok("3us"), 3000);
  assert_int_equal(parse_ok("3\xc2\xb5s"), 3000);
  assert_int_equal(parse_ok("500ms"), 500 * INT64_C(1000000));
  assert_int_equal(parse_ok("1s"), S);
  assert_int_equal(parse_ok("2sec"), 2 * S);
  assert_int_equal(parse_ok("1second"), S);
  assert_int_equal(parse_ok("5m"), 300 * S);
  assert_int_equal(parse_ok("5min"), 300 * S);
  assert_int_equal(parse_ok("2minutes"), 120 * S);
  assert_int_equal(parse_ok("1h"), 3600 * S);
  assert_int_equal(parse_ok("1hr"), 3600 * S);
  assert_int_equal(parse_ok("2hours"), 7200 * S);
  assert_int_equal(parse_ok("7d"), 7 * 86400 * S);
  assert_int_equal(parse_ok("1day"), 86400 * S);
  assert_int_equal(parse_ok("1w"), 604800 * S);
  assert_int_equal(parse_ok("1M"), 2630016 * S);
  assert_int_equal(parse_ok("1y"), 31557600 * S);
  assert_int_equal(parse_ok("0s"), 0);
}

static void test_compound(void **state) {
  (void)state;
  assert_int_equal(parse_ok("2h 30m"), 9000 * S);
  assert_int_equal(parse_ok("2h30m"), 9000 * S);
  assert_int_equal(parse_ok("  1m  30s "), 90 * S);
  assert_int_equal(parse_ok("1s 500ms"), 1500 * INT64_C(1000000));
  /* "m" is minutes and "M" months: case matters for units. */
  assert_true(parse_ok("1m") != parse_ok("1M"));
}

static void test_errors(void **state) {
  (void)state;
  parse_err("", "empty duration");
  parse_err("   ", "empty duration");
  parse_err("30", "missing unit after \"30\"");
  parse_err("30", "\"30s\"");
  parse_err("5x", "unknown unit \"x\"");
  parse_err("5 s", "missing unit after \"5\"");
  parse_err("-1s", "expected a number");
  parse_err("1.5s", "missing unit after \"1\"");
  parse_err("s", "expected a number");
  parse_err("300y", "too large");
  parse_err("99999999999999999999s", "too large");
  parse_err("1h 2", "missing unit after \"2\"");
}

static void format_is(int64_t ns, const char *want) {
  char buf[64];
  pr__duration_format(ns, buf, sizeof(buf));
  assert_string_equal(buf, want);
}

static void test_format(void **state) {
  (void)state;
  format_is(0, "0s");
  format_is(20 * INT64_C(1000000), "20ms");
  format_is(9000 * S, "2h 30m");
  format_is(1500 * INT64_C(1000000), "1s 500ms");
  format_is(31557600 * S, "365d 6h");
  format_is(7 * 86400 * S, "7d");
  format_is(1, "1ns");
}

static void test_round_trip(void **state) {
  unsigned seed = 7;
  (void)state;
  for (int i = 0; i < 10000; i++) {
    int64_t ns =
        ((int64_t)rand_r(&seed) << 31 | rand_r(&seed)) % (INT64_C(1) << 62);
    char buf[128];
    pr__duration_format(ns, buf, sizeof(buf));
    assert_int_equal(parse_ok(buf), ns);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_units),      cmocka_unit_test(test_compound),
      cmocka_unit_test(test_errors),     cmocka_unit_test(test_format),
      cmocka_unit_test(test_round_trip),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
