/*
 * fuzz_json_valid.c - differential libFuzzer target: pr__json_valid()
 * must accept exactly the inputs jansson's json_loadb(JSON_DECODE_ANY)
 * accepts (but for NUL bytes, below), since the engine validates payloads
 * with the one and builds the handler's tree with the other.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  json_error_t err;
  json_t *j;
  int valid = pr__json_valid((const char *)data, size);
  if (memchr(data, 0, size)) {
    /* The one deliberate difference: a NUL byte is never valid JSON, but
     * jansson loses one that directly follows a number or a literal. */
    if (valid)
      abort();
    return 0;
  }
  j = json_loadb((const char *)data, size, JSON_DECODE_ANY, &err);
  if (valid != (j != NULL)) {
    fprintf(stderr, "pr__json_valid says %d, jansson %s (%s)\n", valid,
            j ? "accepts" : "rejects", j ? "" : err.text);
    abort();
  }
  json_decref(j);
  return 0;
}
