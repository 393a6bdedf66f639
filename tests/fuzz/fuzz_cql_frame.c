/*
 * fuzz_cql_frame.c - libFuzzer target for the CQL v4 decoder: the input is
 * a server frame (header + body). Whatever the bytes, decoding must fail
 * cleanly or yield results whose every cell can be read within bounds.
 * Built and run by scripts/fuzz.sh (seed corpus: the recorded frames in
 * tests/data/cql/).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cql/wire.h"

static void read_cells(const pr__cql_result_t *r) {
  pr__cql_cell_t el[64];
  char text[256];
  int64_t i64;
  for (int32_t row = 0; row < r->nrows; row++)
    for (int32_t col = 0; col < r->ncols; col++) {
      const pr__cql_cell_t *c = pr__cql_cell(r, row, col);
      (void)pr__cql_get_bigint(c, &i64);
      (void)pr__cql_get_text(c, text, sizeof(text));
      if (r->cols[col].type) {
        int n = pr__cql_get_elements(c, r->cols[col].type, el, 64);
        for (int i = 0; i < n; i++)
          (void)pr__cql_get_text(&el[i], text, sizeof(text));
      }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  pr__cql_header_t h;
  pr__cql_result_t r;
  pr__cql_error_t e;
  char err[256], warn[64];
  uint8_t *body;
  long start;
  if (pr__cql_header_parse(data, size, &h, err, sizeof(err)) != 1 ||
      h.length > size - PR_CQL_HEADER)
    return 0;
  /* An exact-size copy: any read past the body is caught. */
  body = malloc(h.length ? h.length : 1);
  if (!body)
    return 0;
  memcpy(body, data + PR_CQL_HEADER, h.length);
  start = pr__cql_body_start(&h, body, warn, sizeof(warn), err, sizeof(err));
  if (start < 0) {
    free(body);
    return 0;
  }
  if (h.opcode == PR_CQL_ERROR) {
    (void)pr__cql_parse_error(body + start, h.length - (size_t)start, &e, err,
                              sizeof(err));
  } else if (pr__cql_parse_result(body + start, h.length - (size_t)start, &r,
                                  err, sizeof(err)) == 0) {
    read_cells(&r);
    pr__cql_result_free(&r);
  }
  free(body);
  return 0;
}
