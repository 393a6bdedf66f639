/*
 * test_cql_wire.c - the CQL v4 codec against frames recorded from a real
 * Cassandra 5.0 (tests/data/cql/, re-record with record.py there): headers,
 * every result kind we use, typed cells including collections and a UDT,
 * server errors; every truncation of every recorded body fails cleanly
 * (each parse reads from an exact-size copy, so ASan sees any over-read);
 * lengths that claim more than the frame holds are refused before
 * allocating; request encoding byte for byte.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "cql/wire.h"

typedef struct blob {
  uint8_t *p;
  size_t n;
} blob_t;

static blob_t load(const char *name) {
  char path[512], hex[8192];
  blob_t b = {0};
  FILE *f;
  size_t len;
  snprintf(path, sizeof(path), "%s/cql/%s.hex", PROSODY_TEST_DATA, name);
  f = fopen(path, "r");
  if (!f)
    fail_msg("cannot open %s", path);
  len = fread(hex, 1, sizeof(hex) - 1, f);
  fclose(f);
  while (len && (hex[len - 1] == '\n' || hex[len - 1] == '\r'))
    len--;
  b.n = len / 2;
  b.p = malloc(b.n ? b.n : 1);
  for (size_t i = 0; i < b.n; i++) {
    unsigned v;
    sscanf(hex + 2 * i, "%2x", &v);
    b.p[i] = (uint8_t)v;
  }
  return b;
}

/* The frame's body as an exact-size heap copy. */
static blob_t body_of(const blob_t *frame) {
  blob_t b;
  pr__cql_header_t h;
  char err[256];
  assert_int_equal(
      pr__cql_header_parse(frame->p, frame->n, &h, err, sizeof(err)), 1);
  assert_int_equal(h.length, frame->n - PR_CQL_HEADER);
  b.n = h.length;
  b.p = malloc(b.n ? b.n : 1);
  memcpy(b.p, frame->p + PR_CQL_HEADER, b.n);
  return b;
}

static void test_header(void **state) {
  blob_t f = load("ready");
  pr__cql_header_t h;
  char err[256];
  uint8_t bad[9];
  (void)state;
  assert_int_equal(pr__cql_header_parse(f.p, f.n, &h, err, sizeof(err)), 1);
  assert_int_equal(h.version, 0x84);
  assert_int_equal(h.opcode, PR_CQL_READY);
  assert_int_equal(h.stream, 1);
  assert_int_equal(h.length, 0);
  for (size_t n = 0; n < PR_CQL_HEADER; n++) /* not enough bytes yet */
    assert_int_equal(pr__cql_header_parse(f.p, n, &h, err, sizeof(err)), 0);
  memcpy(bad, f.p, 9);
  bad[0] = 0x83; /* a v3 response */
  assert_int_equal(pr__cql_header_parse(bad, 9, &h, err, sizeof(err)), -1);
  assert_non_null(strstr(err, "0x83"));
  memcpy(bad, f.p, 9);
  bad[5] = 0x7f; /* a 2 GB body */
  assert_int_equal(pr__cql_header_parse(bad, 9, &h, err, sizeof(err)), -1);
  assert_non_null(strstr(err, "exceeds"));
  free(f.p);
}

/* A response whose flags announce a tracing id, warnings and a custom
 * payload (a server warning comes with e.g. an unlogged batch across many
 * partitions): the message starts after them; truncations fail. */
static void test_body_start(void **state) {
  static const uint8_t body[] = {/* tracing id */
                                 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14,
                                 15, 16,
                                 /* warnings: 2 strings */
                                 0, 2, 0, 4, 'w', 'a', 'r', 'n', 0, 1, 'x',
                                 /* custom payload: 1 entry, "k" -> 2 bytes */
                                 0, 1, 0, 1, 'k', 0, 0, 0, 2, 0xaa, 0xbb,
                                 /* the message: RESULT Void */
                                 0, 0, 0, 1};
  pr__cql_header_t h = {0x84, 0x02 | 0x04 | 0x08, PR_CQL_RESULT, 3,
                        sizeof(body)};
  pr__cql_result_t r;
  char err[256], warn[64];
  long start;
  (void)state;
  start = pr__cql_body_start(&h, body, warn, sizeof(warn), err, sizeof(err));
  assert_int_equal(start, sizeof(body) - 4);
  assert_string_equal(warn, "warn");
  assert_int_equal(pr__cql_parse_result(body + start, 4, &r, err, sizeof(err)),
                   0);
  assert_int_equal(r.kind, PR_CQL_RESULT_VOID);
  pr__cql_result_free(&r);
  h.flags = 0x08; /* warnings only: they start the body */
  h.length = 15;
  assert_int_equal(pr__cql_body_start(&h, body + 16, NULL, 0, err, sizeof(err)),
                   11);
  h.flags = 0;
  assert_int_equal(
      pr__cql_body_start(&h, body, warn, sizeof(warn), err, sizeof(err)), 0);
  assert_string_equal(warn, "");
  h.flags = 0x02 | 0x04 | 0x08;
  for (uint32_t n = 0; n < sizeof(body) - 4; n++) {
    uint8_t *copy = malloc(n ? n : 1); /* exact size: ASan sees over-reads */
    memcpy(copy, body, n);
    h.length = n;
    assert_int_equal(
        pr__cql_body_start(&h, copy, warn, sizeof(warn), err, sizeof(err)), -1);
    assert_non_null(strstr(err, "flags"));
    free(copy);
  }
}

static void test_rows_types(void **state) {
  blob_t f = load("rows_types"), b = body_of(&f);
  pr__cql_result_t r;
  pr__cql_cell_t el[16];
  char err[256], text[64];
  int32_t i32;
  int64_t i64;
  int8_t i8;
  int flag;
  uint8_t uuid[16];
  const uint8_t want_uuid[16] = {0x12, 0x3e, 0x45, 0x67, 0xe8, 0x9b,
                                 0x12, 0xd3, 0xa4, 0x56, 0x42, 0x66,
                                 0x14, 0x17, 0x40, 0x00};
  (void)state;
  assert_int_equal(pr__cql_parse_result(b.p, b.n, &r, err, sizeof(err)), 0);
  assert_int_equal(r.kind, PR_CQL_RESULT_ROWS);
  assert_int_equal(r.ncols, 12);
  assert_int_equal(r.nrows, 1);
  assert_string_equal(r.cols[0].name, "id");
  assert_int_equal(r.cols[7].type->id, PR_CQL_T_MAP);
  assert_int_equal(r.cols[7].type->nsub, 2);
  assert_int_equal(r.cols[7].type->sub[0]->id, PR_CQL_T_VARCHAR);
  assert_int_equal(r.cols[10].type->id, PR_CQL_T_UDT);
  assert_string_equal(r.cols[10].type->field_names[1], "label");

  assert_int_equal(pr__cql_get_int(pr__cql_cell(&r, 0, 0), &i32), 0);
  assert_int_equal(i32, 1);
  assert_int_equal(pr__cql_get_bigint(pr__cql_cell(&r, 0, 1), &i64), 0);
  assert_int_equal(i64, INT64_C(-9000000000));
  assert_int_equal(pr__cql_get_tinyint(pr__cql_cell(&r, 0, 2), &i8), 0);
  assert_int_equal(i8, -7);
  assert_int_equal(pr__cql_get_bool(pr__cql_cell(&r, 0, 3), &flag), 0);
  assert_int_equal(flag, 1);
  assert_int_equal(pr__cql_get_uuid(pr__cql_cell(&r, 0, 4), uuid), 0);
  assert_memory_equal(uuid, want_uuid, 16);
  assert_int_equal(pr__cql_get_bigint(pr__cql_cell(&r, 0, 5), &i64), 0);
  assert_int_equal(i64, INT64_C(1700000000123));
  assert_int_equal(pr__cql_cell(&r, 0, 6)->len, 2);
  assert_memory_equal(pr__cql_cell(&r, 0, 6)->p, "\xca\xfe", 2);
  /* map<text, int> {'a': 1, 'b': 2}: key, value pairs */
  assert_int_equal(
      pr__cql_get_elements(pr__cql_cell(&r, 0, 7), r.cols[7].type, el, 16), 4);
  assert_int_equal(pr__cql_get_text(&el[0], text, sizeof(text)), 0);
  assert_string_equal(text, "a");
  assert_int_equal(pr__cql_get_int(&el[3], &i32), 0);
  assert_int_equal(i32, 2);
  /* list<int> [3, 1, 2], in order */
  assert_int_equal(
      pr__cql_get_elements(pr__cql_cell(&r, 0, 8), r.cols[8].type, el, 16), 3);
  assert_int_equal(pr__cql_get_int(&el[0], &i32), 0);
  assert_int_equal(i32, 3);
  /* set<text> {'x', 'y'} */
  assert_int_equal(
      pr__cql_get_elements(pr__cql_cell(&r, 0, 9), r.cols[9].type, el, 16), 2);
  assert_int_equal(pr__cql_get_text(&el[1], text, sizeof(text)), 0);
  assert_string_equal(text, "y");
  /* frozen<point> {x: 5, label: 'five'} */
  assert_int_equal(
      pr__cql_get_elements(pr__cql_cell(&r, 0, 10), r.cols[10].type, el, 16),
      2);
  assert_int_equal(pr__cql_get_int(&el[0], &i32), 0);
  assert_int_equal(i32, 5);
  assert_int_equal(pr__cql_get_text(&el[1], text, sizeof(text)), 0);
  assert_string_equal(text, "five");
  assert_int_equal(pr__cql_get_text(pr__cql_cell(&r, 0, 11), text, 64), 0);
  assert_string_equal(text, "h\xc3\xa9llo");
  /* Too small a buffer, and the wrong type's size, are refused. */
  assert_int_equal(pr__cql_get_text(pr__cql_cell(&r, 0, 11), text, 3), -1);
  assert_int_equal(pr__cql_get_int(pr__cql_cell(&r, 0, 1), &i32), -1);
  /* Too few slots for the elements. */
  assert_int_equal(
      pr__cql_get_elements(pr__cql_cell(&r, 0, 7), r.cols[7].type, el, 3), -1);
  pr__cql_result_free(&r);
  free(b.p);
  free(f.p);
}

/* Collection and UDT values we bind (the timer store's span map and
 * key_timer_state) decode back to what was encoded, byte for byte as the
 * protocol lays them out, and never past the buffer. */
static void test_encode_elements(void **state) {
  pr__cql_type_t text_t = {PR_CQL_T_VARCHAR, 0, NULL, NULL};
  pr__cql_type_t *kv[2] = {&text_t, &text_t};
  pr__cql_type_t map_t = {PR_CQL_T_MAP, 2, kv, NULL};
  pr__cql_type_t udt_t = {PR_CQL_T_UDT, 4, NULL, NULL};
  pr__cql_val_t el[4];
  pr__cql_cell_t out[8], c;
  uint8_t buf[128];
  char text[64];
  int32_t n, i32;
  int flag;
  (void)state;
  /* map<text, text> {'traceparent': 'v'} */
  el[0] = pr__cv_text("traceparent");
  el[1] = pr__cv_text("v");
  n = pr__cql_encode_elements(buf, sizeof(buf), 1, el, 2);
  assert_int_equal(n, 4 + 4 + 11 + 4 + 1);
  assert_memory_equal(buf, "\0\0\0\1\0\0\0\x0btraceparent\0\0\0\1v", 24);
  c = (pr__cql_cell_t){buf, n};
  assert_int_equal(pr__cql_get_elements(&c, &map_t, out, 8), 2);
  assert_int_equal(pr__cql_get_text(&out[1], text, sizeof(text)), 0);
  assert_string_equal(text, "v");
  /* The empty map: a count of 0, not null. */
  assert_int_equal(pr__cql_encode_elements(buf, sizeof(buf), 0, NULL, 0), 4);
  assert_memory_equal(buf, "\0\0\0\0", 4);
  /* A UDT (inline boolean, time int, span map, tag int) with null fields. */
  el[0] = pr__cv_bool(0);
  el[1] = pr__cv_null();
  el[2] = pr__cv_null();
  el[3] = pr__cv_int(-5);
  n = pr__cql_encode_elements(buf, sizeof(buf), -1, el, 4);
  assert_int_equal(n, 5 + 4 + 4 + 8);
  c = (pr__cql_cell_t){buf, n};
  assert_int_equal(pr__cql_get_elements(&c, &udt_t, out, 8), 4);
  assert_int_equal(pr__cql_get_bool(&out[0], &flag), 0);
  assert_int_equal(flag, 0);
  assert_int_equal(out[1].len, -1);
  assert_int_equal(out[2].len, -1);
  assert_int_equal(pr__cql_get_int(&out[3], &i32), 0);
  assert_int_equal(i32, -5);
  /* What does not fit is refused, whatever the cut. */
  for (size_t cap = 0; cap < (size_t)n; cap++)
    assert_int_equal(pr__cql_encode_elements(buf, cap, -1, el, 4), -1);
}

static void test_nulls_and_paging(void **state) {
  blob_t f = load("rows_nulls"), b = body_of(&f);
  pr__cql_result_t r;
  char err[256];
  int64_t v;
  (void)state;
  assert_int_equal(pr__cql_parse_result(b.p, b.n, &r, err, sizeof(err)), 0);
  assert_int_equal(r.nrows, 1);
  assert_true(pr__cql_cell(&r, 0, 1)->len < 0);
  assert_int_equal(pr__cql_get_bigint(pr__cql_cell(&r, 0, 1), &v), -1);
  assert_int_equal(r.paging_len, -1);
  pr__cql_result_free(&r);
  free(b.p);
  free(f.p);

  f = load("rows_paged");
  b = body_of(&f);
  assert_int_equal(pr__cql_parse_result(b.p, b.n, &r, err, sizeof(err)), 0);
  assert_int_equal(r.nrows, 1);
  assert_true(r.paging_len > 0);
  assert_non_null(r.paging_state);
  pr__cql_result_free(&r);
  free(b.p);
  free(f.p);
}

static void test_prepared_void_schema(void **state) {
  struct {
    const char *name;
    int32_t kind;
  } cases[] = {{"prepared", PR_CQL_RESULT_PREPARED},
               {"void", PR_CQL_RESULT_VOID},
               {"schema_change", PR_CQL_RESULT_SCHEMA}};
  (void)state;
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    blob_t f = load(cases[i].name), b = body_of(&f);
    pr__cql_result_t r;
    char err[256];
    assert_int_equal(pr__cql_parse_result(b.p, b.n, &r, err, sizeof(err)), 0);
    assert_int_equal(r.kind, cases[i].kind);
    if (r.kind == PR_CQL_RESULT_PREPARED) {
      assert_int_equal(r.prepared_len, 16); /* an MD5 */
      assert_int_equal(r.nbind, 1);
      assert_int_equal(r.ncols, 2);
      assert_string_equal(r.cols[1].name, "t");
    }
    pr__cql_result_free(&r);
    free(b.p);
    free(f.p);
  }
}

static void test_errors(void **state) {
  struct {
    const char *name;
    int32_t code;
    prosody_err_t cls;
    const char *needle;
  } cases[] = {
      {"error_syntax", PR_CQL_E_SYNTAX, PROSODY_ERR_PERMANENT, "SELEC"},
      {"error_invalid", PR_CQL_E_INVALID, PROSODY_ERR_PERMANENT,
       "no_such_table"},
      {"error_unprepared", PR_CQL_E_UNPREPARED, PROSODY_ERR_PERMANENT,
       "01020304"},
  };
  (void)state;
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    blob_t f = load(cases[i].name), b = body_of(&f);
    pr__cql_error_t e;
    char err[256];
    assert_int_equal(f.p[4], PR_CQL_ERROR);
    assert_int_equal(pr__cql_parse_error(b.p, b.n, &e, err, sizeof(err)), 0);
    assert_int_equal(e.code, cases[i].code);
    assert_int_equal(pr__cql_error_class(e.code), cases[i].cls);
    assert_non_null(strstr(e.message, cases[i].needle));
    if (e.code == PR_CQL_E_UNPREPARED) { /* the id we sent, to re-prepare */
      assert_int_equal(e.unprepared_len, 4);
      assert_memory_equal(e.unprepared_id, "\x01\x02\x03\x04", 4);
    }
    free(b.p);
    free(f.p);
  }
  assert_int_equal(pr__cql_error_class(PR_CQL_E_UNAVAILABLE),
                   PROSODY_ERR_TRANSIENT);
  assert_int_equal(pr__cql_error_class(PR_CQL_E_WRITE_TIMEOUT),
                   PROSODY_ERR_TRANSIENT);
  assert_int_equal(pr__cql_error_class(PR_CQL_E_OVERLOADED),
                   PROSODY_ERR_TRANSIENT);
  assert_string_equal(pr__cql_error_name(PR_CQL_E_READ_TIMEOUT),
                      "read_timeout");
}

/* Every strict prefix of every recorded body: a clean error, never a read
 * past the copy. */
static void test_truncations(void **state) {
  const char *names[] = {"rows_types",   "rows_nulls",    "rows_paged",
                         "prepared",     "void",          "schema_change",
                         "error_syntax", "error_invalid", "error_unprepared"};
  (void)state;
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
    blob_t f = load(names[i]), b = body_of(&f);
    for (size_t n = 0; n < b.n; n++) {
      uint8_t *copy = malloc(n ? n : 1);
      pr__cql_result_t r;
      pr__cql_error_t e;
      char err[256];
      memcpy(copy, b.p, n);
      if (f.p[4] == PR_CQL_ERROR) {
        if (pr__cql_parse_error(copy, n, &e, err, sizeof(err)) == 0)
          fail_msg("%s cut to %zu bytes parsed as an error", names[i], n);
      } else if (pr__cql_parse_result(copy, n, &r, err, sizeof(err)) == 0) {
        pr__cql_result_free(&r);
        fail_msg("%s cut to %zu of %zu bytes parsed", names[i], n, b.n);
      } else {
        assert_non_null(strstr(err, "CQL"));
      }
      free(copy);
    }
    free(b.p);
    free(f.p);
  }
}

/* Counts that claim more than the body holds are refused before any
 * allocation of that size. */
/* A rows body: global table spec "k"."t", one column "a" whose type is a
 * list nested `depth` times around int, then `nrows` (no cells). */
static void rows_body(pr__cbuf_t *b, int depth, uint32_t nrows) {
  pr__cbuf_u32(b, PR_CQL_RESULT_ROWS);
  pr__cbuf_u32(b, 0x0001); /* global table spec */
  pr__cbuf_u32(b, 1);      /* one column */
  pr__cbuf_string(b, "k");
  pr__cbuf_string(b, "t");
  pr__cbuf_string(b, "a");
  for (int i = 0; i < depth; i++)
    pr__cbuf_u16(b, PR_CQL_T_LIST);
  pr__cbuf_u16(b, PR_CQL_T_INT);
  pr__cbuf_u32(b, nrows);
}

static void test_oversized_counts(void **state) {
  pr__cbuf_t b = {0};
  pr__cql_result_t r;
  char err[256];
  (void)state;
  /* no-metadata rows claiming 0x7fffffff columns */
  pr__cbuf_u32(&b, PR_CQL_RESULT_ROWS);
  pr__cbuf_u32(&b, 0x0004);
  pr__cbuf_u32(&b, 0x7fffffff);
  assert_int_equal(pr__cql_parse_result(b.p, b.len, &r, err, sizeof(err)), -1);
  pr__cbuf_free(&b);
  /* 0x7fffffff rows of one column in a 27-byte body */
  rows_body(&b, 0, 0x7fffffff);
  assert_int_equal(pr__cql_parse_result(b.p, b.len, &r, err, sizeof(err)), -1);
  pr__cbuf_free(&b);
  /* the same body with 0 rows is fine: the builder is right */
  rows_body(&b, 0, 0);
  assert_int_equal(pr__cql_parse_result(b.p, b.len, &r, err, sizeof(err)), 0);
  pr__cql_result_free(&r);
  pr__cbuf_free(&b);
  /* types nested just within, and beyond, the depth limit */
  rows_body(&b, PR_CQL_MAX_TYPE_DEPTH, 0);
  assert_int_equal(pr__cql_parse_result(b.p, b.len, &r, err, sizeof(err)), 0);
  pr__cql_result_free(&r);
  pr__cbuf_free(&b);
  rows_body(&b, PR_CQL_MAX_TYPE_DEPTH + 1, 0);
  assert_int_equal(pr__cql_parse_result(b.p, b.len, &r, err, sizeof(err)), -1);
  pr__cbuf_free(&b);
  /* a collection cell claiming 2^31 elements */
  {
    pr__cql_type_t list = {PR_CQL_T_LIST, 0, NULL, NULL};
    pr__cql_cell_t c = {(const uint8_t *)"\x7f\xff\xff\xff", 4}, out[4];
    assert_int_equal(pr__cql_get_elements(&c, &list, out, 4), -1);
  }
}

static void test_encoding(void **state) {
  pr__cbuf_t b = {0};
  pr__crd_t r;
  pr__cql_val_t v[3];
  pr__cql_params_t q;
  const uint8_t *p;
  static const uint8_t startup[] =
      "\x04\x00\x00\x07\x01\x00\x00\x00\x16\x00\x01\x00\x0b"
      "CQL_VERSION\x00\x05"
      "3.0.0";
  (void)state;
  pr__cql_startup(&b, 7);
  assert_int_equal(b.len, sizeof(startup) - 1);
  assert_memory_equal(b.p, startup, b.len);
  pr__cbuf_free(&b);

  v[0] = pr__cv_int(42);
  v[1] = pr__cv_text("k");
  v[2] = pr__cv_null();
  memset(&q, 0, sizeof(q));
  q.consistency = PR_CQL_LOCAL_QUORUM;
  q.values = v;
  q.nvalues = 3;
  q.page_size = 100;
  q.timestamp = 1234567;
  pr__cql_query(&b, 3, "SELECT 1", &q);
  assert_false(b.oom);
  pr__crd_init(&r, b.p, b.len);
  assert_int_equal(pr__crd_u8(&r), 0x04);
  pr__crd_take(&r, 1);
  assert_int_equal(pr__crd_u16(&r), 3);
  assert_int_equal(pr__crd_u8(&r), PR_CQL_QUERY);
  assert_int_equal(pr__crd_u32(&r), b.len - 9);
  assert_int_equal(pr__crd_u32(&r), 8);
  p = pr__crd_take(&r, 8);
  assert_memory_equal(p, "SELECT 1", 8);
  assert_int_equal(pr__crd_u16(&r), PR_CQL_LOCAL_QUORUM);
  assert_int_equal(pr__crd_u8(&r), 0x01 | 0x04 | 0x20);
  assert_int_equal(pr__crd_u16(&r), 3);
  assert_int_equal(pr__crd_bytes(&r, &p), 4);
  assert_memory_equal(p, "\x00\x00\x00\x2a", 4);
  assert_int_equal(pr__crd_bytes(&r, &p), 1);
  assert_int_equal(pr__crd_bytes(&r, &p), -1); /* null */
  assert_int_equal(pr__crd_u32(&r), 100);
  assert_int_equal(pr__crd_u64(&r), 1234567);
  assert_int_equal(r.off, b.len);
  assert_false(r.bad);
  pr__cbuf_free(&b);

  /* SASL PLAIN: \0user\0password */
  pr__cql_auth_response(&b, 0, "u", "pw");
  assert_memory_equal(b.p + 9, "\x00\x00\x00\x05\x00u\x00pw", 9);
  pr__cbuf_free(&b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_header),
      cmocka_unit_test(test_rows_types),
      cmocka_unit_test(test_nulls_and_paging),
      cmocka_unit_test(test_prepared_void_schema),
      cmocka_unit_test(test_errors),
      cmocka_unit_test(test_body_start),
      cmocka_unit_test(test_truncations),
      cmocka_unit_test(test_oversized_counts),
      cmocka_unit_test(test_encoding),
      cmocka_unit_test(test_encode_elements),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
