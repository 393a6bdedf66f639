/*
 * wire.h - the CQL native protocol v4 on the wire (private): a growable
 * writer for requests, a bounded reader, frame headers, request encoders,
 * and decoders for the responses we use (ERROR, READY, AUTHENTICATE,
 * AUTH_SUCCESS, RESULT: void, rows, set keyspace, prepared, schema change).
 *
 * Decoding never trusts a length from the wire: every read is checked
 * against the bytes actually present, sizes are checked before anything is
 * allocated, and type nesting is bounded. Pure functions, no I/O, no
 * globals: what the libFuzzer target (tests/fuzz/) exercises.
 */
#ifndef PR_CQL_WIRE_H
#define PR_CQL_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "prosody.h"

#define PR_CQL_VERSION 0x04
#define PR_CQL_HEADER 9
/* The largest frame body accepted (the server's default native transport
 * frame limit is 16 MiB). */
#define PR_CQL_MAX_BODY (16u * 1024 * 1024)
#define PR_CQL_MAX_TYPE_DEPTH 16

enum pr__cql_opcode {
  PR_CQL_ERROR = 0x00,
  PR_CQL_STARTUP = 0x01,
  PR_CQL_READY = 0x02,
  PR_CQL_AUTHENTICATE = 0x03,
  PR_CQL_OPTIONS = 0x05,
  PR_CQL_SUPPORTED = 0x06,
  PR_CQL_QUERY = 0x07,
  PR_CQL_RESULT = 0x08,
  PR_CQL_PREPARE = 0x09,
  PR_CQL_EXECUTE = 0x0A,
  PR_CQL_REGISTER = 0x0B,
  PR_CQL_EVENT = 0x0C,
  PR_CQL_BATCH = 0x0D,
  PR_CQL_AUTH_CHALLENGE = 0x0E,
  PR_CQL_AUTH_RESPONSE = 0x0F,
  PR_CQL_AUTH_SUCCESS = 0x10
};

enum pr__cql_consistency {
  PR_CQL_ANY = 0x0000,
  PR_CQL_ONE = 0x0001,
  PR_CQL_QUORUM = 0x0004,
  PR_CQL_ALL = 0x0005,
  PR_CQL_LOCAL_QUORUM = 0x0006,
  PR_CQL_SERIAL = 0x0008,
  PR_CQL_LOCAL_SERIAL = 0x0009,
  PR_CQL_LOCAL_ONE = 0x000A
};

/* Column types (the option ids of the protocol). */
enum pr__cql_type_id {
  PR_CQL_T_CUSTOM = 0x0000,
  PR_CQL_T_ASCII = 0x0001,
  PR_CQL_T_BIGINT = 0x0002,
  PR_CQL_T_BLOB = 0x0003,
  PR_CQL_T_BOOLEAN = 0x0004,
  PR_CQL_T_COUNTER = 0x0005,
  PR_CQL_T_DECIMAL = 0x0006,
  PR_CQL_T_DOUBLE = 0x0007,
  PR_CQL_T_FLOAT = 0x0008,
  PR_CQL_T_INT = 0x0009,
  PR_CQL_T_TIMESTAMP = 0x000B,
  PR_CQL_T_UUID = 0x000C,
  PR_CQL_T_VARCHAR = 0x000D,
  PR_CQL_T_VARINT = 0x000E,
  PR_CQL_T_TIMEUUID = 0x000F,
  PR_CQL_T_INET = 0x0010,
  PR_CQL_T_DATE = 0x0011,
  PR_CQL_T_TIME = 0x0012,
  PR_CQL_T_SMALLINT = 0x0013,
  PR_CQL_T_TINYINT = 0x0014,
  PR_CQL_T_DURATION = 0x0015,
  PR_CQL_T_LIST = 0x0020,
  PR_CQL_T_MAP = 0x0021,
  PR_CQL_T_SET = 0x0022,
  PR_CQL_T_UDT = 0x0030,
  PR_CQL_T_TUPLE = 0x0031
};

/* ---- writer ------------------------------------------------------------ */

typedef struct pr__cbuf {
  uint8_t *p;
  size_t len, cap;
  int oom; /* a write failed: the buffer is unusable */
} pr__cbuf_t;

void pr__cbuf_free(pr__cbuf_t *b);
void pr__cbuf_u8(pr__cbuf_t *b, uint8_t v);
void pr__cbuf_u16(pr__cbuf_t *b, uint16_t v);
void pr__cbuf_u32(pr__cbuf_t *b, uint32_t v);
void pr__cbuf_u64(pr__cbuf_t *b, uint64_t v);
void pr__cbuf_raw(pr__cbuf_t *b, const void *p, size_t n);
void pr__cbuf_string(pr__cbuf_t *b, const char *s);      /* [string] */
void pr__cbuf_long_string(pr__cbuf_t *b, const char *s); /* [long string] */
void pr__cbuf_short_bytes(pr__cbuf_t *b, const void *p, size_t n);
void pr__cbuf_bytes(pr__cbuf_t *b, const void *p, int32_t n); /* -1: null */

/* A bound value: `len` bytes at `p`, or null (len -1). Constructors encode
 * scalars into `inl`. */
typedef struct pr__cql_val {
  const uint8_t *p;
  int32_t len;
  uint8_t inl[16];
} pr__cql_val_t;

pr__cql_val_t pr__cv_null(void);
pr__cql_val_t pr__cv_text(const char *s);            /* borrowed */
pr__cql_val_t pr__cv_blob(const void *p, int32_t n); /* borrowed */
pr__cql_val_t pr__cv_int(int32_t v);
pr__cql_val_t pr__cv_bigint(int64_t v); /* also timestamp (ms) */
pr__cql_val_t pr__cv_tinyint(int8_t v);
pr__cql_val_t pr__cv_bool(int v);
pr__cql_val_t pr__cv_uuid(const uint8_t uuid[16]);

/* Encodes a collection or UDT value from its elements into out[cap]: a map
 * (key, value pairs: `count` pairs), list or set (`count` elements) starts
 * with the count; a UDT or tuple (`count` -1) is its fields alone. Each
 * element is [bytes] (a null one: length -1). The length written, or -1
 * when it does not fit. Bind it with pr__cv_blob. */
int32_t pr__cql_encode_elements(uint8_t *out, size_t cap, int32_t count,
                                const pr__cql_val_t *elems, size_t n);

/* Query parameters (QUERY, EXECUTE). */
typedef struct pr__cql_params {
  uint16_t consistency;
  const pr__cql_val_t *values;
  uint16_t nvalues;
  int32_t page_size;           /* <= 0: none */
  const uint8_t *paging_state; /* NULL: first page */
  int32_t paging_len;
  uint16_t serial_consistency; /* 0: none */
  int64_t timestamp;           /* client timestamp (us); INT64_MIN: none */
  int skip_metadata;
} pr__cql_params_t;

/* One statement of a BATCH: a prepared id, or a query string. */
typedef struct pr__cql_batch_stmt {
  const uint8_t *id;
  uint16_t id_len;
  const char *query; /* when id is NULL */
  const pr__cql_val_t *values;
  uint16_t nvalues;
} pr__cql_batch_stmt_t;

#define PR_CQL_BATCH_LOGGED 0
#define PR_CQL_BATCH_UNLOGGED 1

/* Request frames, appended to `b`. */
void pr__cql_startup(pr__cbuf_t *b, int16_t stream);
void pr__cql_auth_response(pr__cbuf_t *b, int16_t stream, const char *user,
                           const char *password);
void pr__cql_query(pr__cbuf_t *b, int16_t stream, const char *query,
                   const pr__cql_params_t *params);
void pr__cql_prepare(pr__cbuf_t *b, int16_t stream, const char *query);
void pr__cql_execute(pr__cbuf_t *b, int16_t stream, const uint8_t *id,
                     uint16_t id_len, const pr__cql_params_t *params);
void pr__cql_batch(pr__cbuf_t *b, int16_t stream, uint8_t type,
                   const pr__cql_batch_stmt_t *stmts, uint16_t n,
                   uint16_t consistency, int64_t timestamp);

/* ---- reader ------------------------------------------------------------ */

typedef struct pr__crd {
  const uint8_t *p;
  size_t len, off;
  int bad; /* a read went past the end: every later read fails too */
} pr__crd_t;

void pr__crd_init(pr__crd_t *r, const void *p, size_t len);
uint8_t pr__crd_u8(pr__crd_t *r);
uint16_t pr__crd_u16(pr__crd_t *r);
uint32_t pr__crd_u32(pr__crd_t *r);
uint64_t pr__crd_u64(pr__crd_t *r);
/* Points at the next n bytes (NULL and bad if fewer remain). */
const uint8_t *pr__crd_take(pr__crd_t *r, size_t n);
/* [string] into buf (NUL-terminated, truncated to size - 1); its length. */
size_t pr__crd_string(pr__crd_t *r, char *buf, size_t size);
/* [bytes]: length (-1: null) and a pointer to them. */
int32_t pr__crd_bytes(pr__crd_t *r, const uint8_t **p);

/* ---- frames and responses ---------------------------------------------- */

typedef struct pr__cql_header {
  uint8_t version, flags, opcode;
  int16_t stream;
  uint32_t length;
} pr__cql_header_t;

/* Parses a response header from `n` bytes: 0 when fewer than 9 bytes are
 * there, 1 when parsed, -1 (errstr) when it is not a v4 response or its
 * body is larger than PR_CQL_MAX_BODY. */
int pr__cql_header_parse(const uint8_t *p, size_t n, pr__cql_header_t *h,
                         char *errstr, size_t errstr_size);

/* What a response's header flags put before its message, in the order
 * Cassandra writes them: tracing id (0x02), warnings (0x08), custom payload
 * (0x04). Returns the message's offset in `body` (0 without those flags)
 * and copies the first warning, if any, into `warn` (may be NULL); -1
 * (errstr) when they run past the body. A response with warnings (e.g. an
 * unlogged batch across many partitions, a large batch) is otherwise a
 * normal answer. */
long pr__cql_body_start(const pr__cql_header_t *h, const uint8_t *body,
                        char *warn, size_t warn_size, char *errstr,
                        size_t errstr_size);

/* A server ERROR body. */
typedef struct pr__cql_error {
  int32_t code;
  char message[512];
  const uint8_t *unprepared_id; /* code 0x2500: into the body */
  uint16_t unprepared_len;
} pr__cql_error_t;

#define PR_CQL_E_SERVER 0x0000
#define PR_CQL_E_PROTOCOL 0x000A
#define PR_CQL_E_BAD_CREDENTIALS 0x0100
#define PR_CQL_E_UNAVAILABLE 0x1000
#define PR_CQL_E_OVERLOADED 0x1001
#define PR_CQL_E_BOOTSTRAPPING 0x1002
#define PR_CQL_E_TRUNCATE 0x1003
#define PR_CQL_E_WRITE_TIMEOUT 0x1100
#define PR_CQL_E_READ_TIMEOUT 0x1200
#define PR_CQL_E_READ_FAILURE 0x1300
#define PR_CQL_E_FUNCTION_FAILURE 0x1400
#define PR_CQL_E_WRITE_FAILURE 0x1500
#define PR_CQL_E_SYNTAX 0x2000
#define PR_CQL_E_UNAUTHORIZED 0x2100
#define PR_CQL_E_INVALID 0x2200
#define PR_CQL_E_CONFIG 0x2300
#define PR_CQL_E_ALREADY_EXISTS 0x2400
#define PR_CQL_E_UNPREPARED 0x2500

/* -1 (errstr) when the body is malformed. */
int pr__cql_parse_error(const uint8_t *body, size_t len, pr__cql_error_t *e,
                        char *errstr, size_t errstr_size);
/* The error's name ("unavailable", "write_timeout", ...). */
const char *pr__cql_error_name(int32_t code);
/* PROSODY_ERR_TRANSIENT for errors a retry can fix (unavailable,
 * overloaded, bootstrapping, timeouts, truncate, server error), else
 * PROSODY_ERR_PERMANENT. */
prosody_err_t pr__cql_error_class(int32_t code);

/* A column type: a tree (collections, UDTs, tuples), at most
 * PR_CQL_MAX_TYPE_DEPTH deep. */
typedef struct pr__cql_type {
  uint16_t id;
  uint16_t nsub;             /* list/set 1, map 2, UDT/tuple fields */
  struct pr__cql_type **sub; /* element types */
  char **field_names;        /* UDT only */
} pr__cql_type_t;

typedef struct pr__cql_col {
  char name[128];
  pr__cql_type_t *type;
} pr__cql_col_t;

/* One cell of a row: `len` bytes at `p`, or null (len < 0). */
typedef struct pr__cql_cell {
  const uint8_t *p;
  int32_t len;
} pr__cql_cell_t;

#define PR_CQL_RESULT_VOID 0x0001
#define PR_CQL_RESULT_ROWS 0x0002
#define PR_CQL_RESULT_KEYSPACE 0x0003
#define PR_CQL_RESULT_PREPARED 0x0004
#define PR_CQL_RESULT_SCHEMA 0x0005

/* A decoded RESULT; pointers refer into the body, which must outlive it. */
typedef struct pr__cql_result {
  int32_t kind;
  /* Rows (and a prepared statement's result columns). */
  int32_t ncols;
  pr__cql_col_t *cols;
  int32_t nrows;
  pr__cql_cell_t *cells; /* nrows * ncols, row-major */
  const uint8_t *paging_state;
  int32_t paging_len; /* -1: no more pages */
  /* Prepared. */
  const uint8_t *prepared_id;
  uint16_t prepared_len;
  int32_t nbind; /* bind markers */
  /* Set keyspace / schema change. */
  char text[256];
  /* The body the pointers refer to (set by the session), and a copy this
   * result owns (pr__cql_sync_run), freed by pr__cql_result_free. */
  const uint8_t *body;
  size_t body_len;
  uint8_t *owned;
} pr__cql_result_t;

/* 0, or -1 (errstr) when malformed. Free with pr__cql_result_free. */
int pr__cql_parse_result(const uint8_t *body, size_t len, pr__cql_result_t *res,
                         char *errstr, size_t errstr_size);
void pr__cql_result_free(pr__cql_result_t *res);
/* The cell at (row, col); a null cell (len -1) when out of range, so that
 * a result with fewer columns or rows than a caller expects reads as
 * nulls, never past the array. */
static inline const pr__cql_cell_t *pr__cql_cell(const pr__cql_result_t *r,
                                                 int32_t row, int32_t col) {
  static const pr__cql_cell_t null_cell = {NULL, -1};
  if (!r->cells || row < 0 || col < 0 || row >= r->nrows || col >= r->ncols)
    return &null_cell;
  return &r->cells[(size_t)row * (size_t)r->ncols + (size_t)col];
}

/* Typed cell readers: 0 on success, -1 when the cell is null or has the
 * wrong size. */
int pr__cql_get_int(const pr__cql_cell_t *c, int32_t *v);
int pr__cql_get_bigint(const pr__cql_cell_t *c, int64_t *v); /* +timestamp */
int pr__cql_get_tinyint(const pr__cql_cell_t *c, int8_t *v);
int pr__cql_get_bool(const pr__cql_cell_t *c, int *v);
int pr__cql_get_uuid(const pr__cql_cell_t *c, uint8_t out[16]);
/* Text: copies into buf (NUL-terminated; -1 when it does not fit). */
int pr__cql_get_text(const pr__cql_cell_t *c, char *buf, size_t size);
/* Collection (list, set: one cell per element; map: key, value pairs) and
 * UDT (one cell per field) elements, into out[max]; the element count, or
 * -1 when malformed. */
int pr__cql_get_elements(const pr__cql_cell_t *c, const pr__cql_type_t *type,
                         pr__cql_cell_t *out, int max);

#endif /* PR_CQL_WIRE_H */
