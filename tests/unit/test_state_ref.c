/*
 * test_state_ref.c - the record reference of keyed state's MESSAGE
 * collections: the original's bytes (its frozen test vector), the smallest
 * integer forms, and refused malformed references.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "engine/state.h"

static void encode(const char *topic, int32_t partition, int64_t offset,
                   char **out, size_t *len) {
  prosody_message_t m;
  memset(&m, 0, sizeof(m));
  m.topic = topic;
  m.partition = partition;
  m.offset = offset;
  assert_int_equal(pr__st_ref_encode(&m, out, len), 0);
}

static void test_original_vector(void **state) {
  static const uint8_t want[] = {
      0x83, 0xa5, 't', 'o',  'p',  'i',  'c', 0xa9, 'o', 'r', 'd', 'e',
      'r',  's',  '.', 'v',  '1',  0xa9, 'p', 'a',  'r', 't', 'i', 't',
      'i',  'o',  'n', 0x03, 0xa6, 'o',  'f', 'f',  's', 'e', 't', 0x2a};
  char *out;
  size_t len;
  (void)state;
  encode("orders.v1", 3, 42, &out, &len);
  assert_int_equal(len, sizeof(want));
  assert_memory_equal(out, want, sizeof(want));
  free(out);
}

static void test_round_trips_and_int_forms(void **state) {
  static const int64_t offsets[] = {0,
                                    127,
                                    128,
                                    255,
                                    256,
                                    65535,
                                    65536,
                                    INT64_C(4294967295),
                                    INT64_C(4294967296),
                                    INT64_MAX};
  static const size_t tails[] = {1, 1, 2, 2, 3, 3, 5, 5, 9, 9};
  (void)state;
  for (size_t i = 0; i < sizeof(offsets) / sizeof(offsets[0]); i++) {
    char *out, *topic;
    size_t len, base;
    int32_t p = -1;
    int64_t o = -1;
    encode("t", 7, offsets[i], &out, &len);
    base = 1 + 6 + 2 + 10 + 1 + 7; /* map, "topic" "t" "partition" 7 "offset" */
    assert_int_equal(len, base + tails[i]);
    assert_int_equal(pr__st_ref_decode((uint8_t *)out, len, &topic, &p, &o), 0);
    assert_string_equal(topic, "t");
    assert_int_equal(p, 7);
    assert_true(o == offsets[i]);
    free(topic);
    free(out);
  }
}

static void test_malformed_refused(void **state) {
  char *out, *topic = (char *)"x";
  size_t len;
  int32_t p;
  int64_t o;
  (void)state;
  encode("topic-a", 1, 1000, &out, &len);
  for (size_t cut = 0; cut < len; cut++) {
    assert_int_equal(pr__st_ref_decode((uint8_t *)out, cut, &topic, &p, &o),
                     -1);
    assert_null(topic);
  }
  out[0] = (char)0x82; /* two entries: the offset missing */
  assert_int_equal(pr__st_ref_decode((uint8_t *)out, len, &topic, &p, &o), -1);
  free(out);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_original_vector),
      cmocka_unit_test(test_round_trips_and_int_forms),
      cmocka_unit_test(test_malformed_refused),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
