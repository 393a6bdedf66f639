/*
 * fuzz_json_valid.c - differential libFuzzer target: pr__json_valid()
 * must accept exactly the inputs jansson's json_loadb(JSON_DECODE_ANY)
 * accepts (but for NUL bytes, below), since the engine validates payloads
 * with the one and builds the handler's tree with the other; and the
 * dedup layer's "id" capture (pr__json_scan, pr__json_unescape) must read
 * what jansson reads.
 */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/util.h"

/* The dedup layer's id: pr__json_scan() judges validity as
 * pr__json_valid() does, and the top-level "id" string it captures,
 * unescaped, is the one jansson reads (when no key repeats, as jansson's
 * last-one-wins and our first-one-wins would differ). */
static void check_id(const char *text, size_t size, int valid) {
  const char *v;
  size_t vn, n;
  json_error_t err;
  json_t *j, *id;
  char *out;
  const char *fv;
  size_t fvn;
  int found = pr__json_find(text, size, "id", &fv, &fvn);
  if (pr__json_scan(text, size, "id", &v, &vn) != valid)
    abort();
  /* pr__json_find: the same id; stopped at it, or the same verdict */
  if (fv != v || (v && fvn != vn) || (found && found != (valid ? 1 : -1)) ||
      (!found && !v))
    abort();
  if (!valid || !v)
    return;
  if (!(out = malloc(vn + 1)))
    return;
  n = pr__json_unescape(v, vn, out);
  if (n > vn)
    abort(); /* unescaping never lengthens */
  j = json_loadb(text, size, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &err);
  if (j) {
    id = json_object_get(j, "id");
    if (!id || !json_is_string(id) || json_string_length(id) != n ||
        memcmp(json_string_value(id), out, n)) {
      fprintf(stderr, "id: ours \"%.*s\", jansson's %s\n", (int)n, out,
              id && json_is_string(id) ? json_string_value(id) : "(none)");
      abort();
    }
    json_decref(j);
  }
  free(out);
}

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
  check_id((const char *)data, size, valid);
  return 0;
}
