/*
 * wire.c - CQL native protocol v4 encoding and bounded decoding (see
 * wire.h). Byte layouts follow the protocol specification (native_protocol
 * _v4.spec): big-endian integers, [string] = u16 length + bytes, [bytes] =
 * i32 length (negative: null) + bytes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../util/util.h"
#include "wire.h"

/* ---- writer ------------------------------------------------------------ */

void pr__cbuf_free(pr__cbuf_t *b) {
  free(b->p);
  memset(b, 0, sizeof(*b));
}

static int reserve(pr__cbuf_t *b, size_t n) {
  size_t cap;
  uint8_t *p;
  if (b->oom)
    return -1;
  if (b->len + n <= b->cap)
    return 0;
  cap = b->cap ? b->cap : 256;
  while (cap < b->len + n)
    cap *= 2;
  if (!(p = realloc(b->p, cap))) {
    b->oom = 1;
    return -1;
  }
  b->p = p;
  b->cap = cap;
  return 0;
}

void pr__cbuf_raw(pr__cbuf_t *b, const void *p, size_t n) {
  if (n && !reserve(b, n)) {
    memcpy(b->p + b->len, p, n);
    b->len += n;
  }
}

void pr__cbuf_u8(pr__cbuf_t *b, uint8_t v) { pr__cbuf_raw(b, &v, 1); }

void pr__cbuf_u16(pr__cbuf_t *b, uint16_t v) {
  uint8_t x[2] = {(uint8_t)(v >> 8), (uint8_t)v};
  pr__cbuf_raw(b, x, 2);
}

void pr__cbuf_u32(pr__cbuf_t *b, uint32_t v) {
  uint8_t x[4] = {(uint8_t)(v >> 24), (uint8_t)(v >> 16), (uint8_t)(v >> 8),
                  (uint8_t)v};
  pr__cbuf_raw(b, x, 4);
}

void pr__cbuf_u64(pr__cbuf_t *b, uint64_t v) {
  pr__cbuf_u32(b, (uint32_t)(v >> 32));
  pr__cbuf_u32(b, (uint32_t)v);
}

void pr__cbuf_string(pr__cbuf_t *b, const char *s) {
  size_t n = strlen(s);
  if (n > UINT16_MAX) {
    b->oom = 1; /* not representable: fail the request */
    return;
  }
  pr__cbuf_u16(b, (uint16_t)n);
  pr__cbuf_raw(b, s, n);
}

void pr__cbuf_long_string(pr__cbuf_t *b, const char *s) {
  size_t n = strlen(s);
  pr__cbuf_u32(b, (uint32_t)n);
  pr__cbuf_raw(b, s, n);
}

void pr__cbuf_short_bytes(pr__cbuf_t *b, const void *p, size_t n) {
  pr__cbuf_u16(b, (uint16_t)n);
  pr__cbuf_raw(b, p, n);
}

void pr__cbuf_bytes(pr__cbuf_t *b, const void *p, int32_t n) {
  pr__cbuf_u32(b, (uint32_t)(n < 0 ? -1 : n));
  if (n > 0)
    pr__cbuf_raw(b, p, (size_t)n);
}

/* ---- values ------------------------------------------------------------ */

pr__cql_val_t pr__cv_null(void) {
  pr__cql_val_t v;
  memset(&v, 0, sizeof(v));
  v.len = -1;
  return v;
}

pr__cql_val_t pr__cv_blob(const void *p, int32_t n) {
  pr__cql_val_t v;
  memset(&v, 0, sizeof(v));
  v.p = p;
  v.len = n;
  return v;
}

pr__cql_val_t pr__cv_text(const char *s) {
  return s ? pr__cv_blob(s, (int32_t)strlen(s)) : pr__cv_null();
}

static pr__cql_val_t inline_be(uint64_t x, int n) {
  pr__cql_val_t v;
  memset(&v, 0, sizeof(v));
  for (int i = 0; i < n; i++)
    v.inl[i] = (uint8_t)(x >> (8 * (n - 1 - i)));
  v.len = n;
  return v; /* p is set by the encoder: inl moves with the value */
}

pr__cql_val_t pr__cv_int(int32_t x) { return inline_be((uint32_t)x, 4); }
pr__cql_val_t pr__cv_bigint(int64_t x) { return inline_be((uint64_t)x, 8); }
pr__cql_val_t pr__cv_tinyint(int8_t x) { return inline_be((uint8_t)x, 1); }
pr__cql_val_t pr__cv_bool(int x) { return inline_be(x ? 1 : 0, 1); }

pr__cql_val_t pr__cv_uuid(const uint8_t uuid[16]) {
  pr__cql_val_t v;
  memset(&v, 0, sizeof(v));
  memcpy(v.inl, uuid, 16);
  v.len = 16;
  return v;
}

int32_t pr__cql_encode_elements(uint8_t *out, size_t cap, int32_t count,
                                const pr__cql_val_t *elems, size_t n) {
  size_t at = 0;
  if (count >= 0) {
    if (cap < 4)
      return -1;
    for (int i = 0; i < 4; i++)
      out[at++] = (uint8_t)((uint32_t)count >> (24 - 8 * i));
  }
  for (size_t e = 0; e < n; e++) {
    const pr__cql_val_t *v = &elems[e];
    int32_t len = v->len < 0 ? -1 : v->len;
    if (cap - at < 4 || (len > 0 && cap - at - 4 < (size_t)len))
      return -1;
    for (int i = 0; i < 4; i++)
      out[at++] = (uint8_t)((uint32_t)len >> (24 - 8 * i));
    if (len > 0)
      memcpy(out + at, v->p ? v->p : v->inl, (size_t)len);
    at += len > 0 ? (size_t)len : 0;
  }
  return at > INT32_MAX ? -1 : (int32_t)at;
}

static void put_value(pr__cbuf_t *b, const pr__cql_val_t *v) {
  pr__cbuf_bytes(b, v->p ? v->p : v->inl, v->len);
}

/* ---- requests ---------------------------------------------------------- */

static size_t begin(pr__cbuf_t *b, int16_t stream, uint8_t opcode) {
  size_t at = b->len;
  pr__cbuf_u8(b, PR_CQL_VERSION);
  pr__cbuf_u8(b, 0);
  pr__cbuf_u16(b, (uint16_t)stream);
  pr__cbuf_u8(b, opcode);
  pr__cbuf_u32(b, 0); /* length, set by end() */
  return at;
}

static void end(pr__cbuf_t *b, size_t at) {
  size_t body;
  if (b->oom)
    return;
  body = b->len - at - PR_CQL_HEADER;
  if (body > PR_CQL_MAX_BODY) {
    b->oom = 1;
    return;
  }
  b->p[at + 5] = (uint8_t)(body >> 24);
  b->p[at + 6] = (uint8_t)(body >> 16);
  b->p[at + 7] = (uint8_t)(body >> 8);
  b->p[at + 8] = (uint8_t)body;
}

void pr__cql_startup(pr__cbuf_t *b, int16_t stream) {
  size_t at = begin(b, stream, PR_CQL_STARTUP);
  pr__cbuf_u16(b, 1); /* [string map] */
  pr__cbuf_string(b, "CQL_VERSION");
  pr__cbuf_string(b, "3.0.0");
  end(b, at);
}

void pr__cql_auth_response(pr__cbuf_t *b, int16_t stream, const char *user,
                           const char *password) {
  size_t at = begin(b, stream, PR_CQL_AUTH_RESPONSE);
  size_t ul = strlen(user), pl = strlen(password);
  pr__cbuf_u32(b, (uint32_t)(ul + pl + 2)); /* SASL PLAIN: \0user\0pass */
  pr__cbuf_u8(b, 0);
  pr__cbuf_raw(b, user, ul);
  pr__cbuf_u8(b, 0);
  pr__cbuf_raw(b, password, pl);
  end(b, at);
}

static void put_params(pr__cbuf_t *b, const pr__cql_params_t *q) {
  uint8_t flags = 0;
  if (q->nvalues)
    flags |= 0x01;
  if (q->skip_metadata)
    flags |= 0x02;
  if (q->page_size > 0)
    flags |= 0x04;
  if (q->paging_state)
    flags |= 0x08;
  if (q->serial_consistency)
    flags |= 0x10;
  if (q->timestamp != INT64_MIN)
    flags |= 0x20;
  pr__cbuf_u16(b, q->consistency);
  pr__cbuf_u8(b, flags);
  if (q->nvalues) {
    pr__cbuf_u16(b, q->nvalues);
    for (uint16_t i = 0; i < q->nvalues; i++)
      put_value(b, &q->values[i]);
  }
  if (q->page_size > 0)
    pr__cbuf_u32(b, (uint32_t)q->page_size);
  if (q->paging_state)
    pr__cbuf_bytes(b, q->paging_state, q->paging_len);
  if (q->serial_consistency)
    pr__cbuf_u16(b, q->serial_consistency);
  if (q->timestamp != INT64_MIN)
    pr__cbuf_u64(b, (uint64_t)q->timestamp);
}

void pr__cql_query(pr__cbuf_t *b, int16_t stream, const char *query,
                   const pr__cql_params_t *params) {
  size_t at = begin(b, stream, PR_CQL_QUERY);
  pr__cbuf_long_string(b, query);
  put_params(b, params);
  end(b, at);
}

void pr__cql_prepare(pr__cbuf_t *b, int16_t stream, const char *query) {
  size_t at = begin(b, stream, PR_CQL_PREPARE);
  pr__cbuf_long_string(b, query);
  end(b, at);
}

void pr__cql_execute(pr__cbuf_t *b, int16_t stream, const uint8_t *id,
                     uint16_t id_len, const pr__cql_params_t *params) {
  size_t at = begin(b, stream, PR_CQL_EXECUTE);
  pr__cbuf_short_bytes(b, id, id_len);
  put_params(b, params);
  end(b, at);
}

void pr__cql_batch(pr__cbuf_t *b, int16_t stream, uint8_t type,
                   const pr__cql_batch_stmt_t *stmts, uint16_t n,
                   uint16_t consistency, int64_t timestamp) {
  size_t at = begin(b, stream, PR_CQL_BATCH);
  pr__cbuf_u8(b, type);
  pr__cbuf_u16(b, n);
  for (uint16_t i = 0; i < n; i++) {
    if (stmts[i].id) {
      pr__cbuf_u8(b, 1);
      pr__cbuf_short_bytes(b, stmts[i].id, stmts[i].id_len);
    } else {
      pr__cbuf_u8(b, 0);
      pr__cbuf_long_string(b, stmts[i].query);
    }
    pr__cbuf_u16(b, stmts[i].nvalues);
    for (uint16_t j = 0; j < stmts[i].nvalues; j++)
      put_value(b, &stmts[i].values[j]);
  }
  pr__cbuf_u16(b, consistency);
  pr__cbuf_u8(b, timestamp != INT64_MIN ? 0x20 : 0);
  if (timestamp != INT64_MIN)
    pr__cbuf_u64(b, (uint64_t)timestamp);
  end(b, at);
}

/* ---- reader ------------------------------------------------------------ */

void pr__crd_init(pr__crd_t *r, const void *p, size_t len) {
  r->p = p;
  r->len = len;
  r->off = 0;
  r->bad = 0;
}

const uint8_t *pr__crd_take(pr__crd_t *r, size_t n) {
  const uint8_t *p;
  if (r->bad || n > r->len - r->off) {
    r->bad = 1;
    return NULL;
  }
  p = r->p + r->off;
  r->off += n;
  return p;
}

uint8_t pr__crd_u8(pr__crd_t *r) {
  const uint8_t *p = pr__crd_take(r, 1);
  return p ? p[0] : 0;
}

uint16_t pr__crd_u16(pr__crd_t *r) {
  const uint8_t *p = pr__crd_take(r, 2);
  return p ? (uint16_t)(p[0] << 8 | p[1]) : 0;
}

uint32_t pr__crd_u32(pr__crd_t *r) {
  const uint8_t *p = pr__crd_take(r, 4);
  return p ? (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 |
                 p[3]
           : 0;
}

uint64_t pr__crd_u64(pr__crd_t *r) {
  uint64_t hi = pr__crd_u32(r);
  return hi << 32 | pr__crd_u32(r);
}

size_t pr__crd_string(pr__crd_t *r, char *buf, size_t size) {
  uint16_t n = pr__crd_u16(r);
  const uint8_t *p = pr__crd_take(r, n);
  size_t c = n < size ? n : size - 1;
  if (!size)
    return n;
  if (!p)
    c = 0;
  if (c)
    memcpy(buf, p, c);
  buf[c] = '\0';
  return n;
}

int32_t pr__crd_bytes(pr__crd_t *r, const uint8_t **p) {
  int32_t n = (int32_t)pr__crd_u32(r);
  *p = NULL;
  if (r->bad || n < 0)
    return r->bad ? -1 : n;
  *p = pr__crd_take(r, (size_t)n);
  return *p ? n : -1;
}

/* ---- responses --------------------------------------------------------- */

int pr__cql_header_parse(const uint8_t *p, size_t n, pr__cql_header_t *h,
                         char *errstr, size_t errstr_size) {
  if (n < PR_CQL_HEADER)
    return 0;
  h->version = p[0];
  h->flags = p[1];
  h->stream = (int16_t)(p[2] << 8 | p[3]);
  h->opcode = p[4];
  h->length =
      (uint32_t)p[5] << 24 | (uint32_t)p[6] << 16 | (uint32_t)p[7] << 8 | p[8];
  if (h->version != (0x80 | PR_CQL_VERSION)) {
    pr__errf(errstr, errstr_size, "not a CQL v4 response (version byte 0x%02x)",
             h->version);
    return -1;
  }
  if (h->length > PR_CQL_MAX_BODY) {
    pr__errf(errstr, errstr_size,
             "CQL frame body of %u bytes exceeds the %u-byte limit", h->length,
             PR_CQL_MAX_BODY);
    return -1;
  }
  return 1;
}

long pr__cql_body_start(const pr__cql_header_t *h, const uint8_t *body,
                        char *warn, size_t warn_size, char *errstr,
                        size_t errstr_size) {
  pr__crd_t r;
  pr__crd_init(&r, body, h->length);
  if (warn && warn_size)
    warn[0] = '\0';
  if (h->flags & 0x02) /* tracing id: [uuid] */
    pr__crd_take(&r, 16);
  if (h->flags & 0x08) { /* warnings: [string list] */
    uint16_t n = pr__crd_u16(&r);
    for (uint16_t i = 0; i < n && !r.bad; i++)
      pr__crd_string(&r, i == 0 ? warn : NULL, i == 0 && warn ? warn_size : 0);
  }
  if (h->flags & 0x04) { /* custom payload: [bytes map] */
    uint16_t n = pr__crd_u16(&r);
    for (uint16_t i = 0; i < n && !r.bad; i++) {
      const uint8_t *v;
      pr__crd_string(&r, NULL, 0);
      pr__crd_bytes(&r, &v);
    }
  }
  if (r.bad) {
    pr__errf(errstr, errstr_size,
             "malformed CQL response: flags 0x%02x announce more than its "
             "%u-byte body",
             h->flags, h->length);
    return -1;
  }
  return (long)r.off;
}

const char *pr__cql_error_name(int32_t code) {
  switch (code) {
  case PR_CQL_E_SERVER:
    return "server_error";
  case PR_CQL_E_PROTOCOL:
    return "protocol_error";
  case PR_CQL_E_BAD_CREDENTIALS:
    return "bad_credentials";
  case PR_CQL_E_UNAVAILABLE:
    return "unavailable";
  case PR_CQL_E_OVERLOADED:
    return "overloaded";
  case PR_CQL_E_BOOTSTRAPPING:
    return "is_bootstrapping";
  case PR_CQL_E_TRUNCATE:
    return "truncate_error";
  case PR_CQL_E_WRITE_TIMEOUT:
    return "write_timeout";
  case PR_CQL_E_READ_TIMEOUT:
    return "read_timeout";
  case PR_CQL_E_READ_FAILURE:
    return "read_failure";
  case PR_CQL_E_FUNCTION_FAILURE:
    return "function_failure";
  case PR_CQL_E_WRITE_FAILURE:
    return "write_failure";
  case PR_CQL_E_SYNTAX:
    return "syntax_error";
  case PR_CQL_E_UNAUTHORIZED:
    return "unauthorized";
  case PR_CQL_E_INVALID:
    return "invalid";
  case PR_CQL_E_CONFIG:
    return "config_error";
  case PR_CQL_E_ALREADY_EXISTS:
    return "already_exists";
  case PR_CQL_E_UNPREPARED:
    return "unprepared";
  default:
    return "unknown_error";
  }
}

prosody_err_t pr__cql_error_class(int32_t code) {
  switch (code) {
  case PR_CQL_E_SERVER:
  case PR_CQL_E_UNAVAILABLE:
  case PR_CQL_E_OVERLOADED:
  case PR_CQL_E_BOOTSTRAPPING:
  case PR_CQL_E_TRUNCATE:
  case PR_CQL_E_WRITE_TIMEOUT:
  case PR_CQL_E_READ_TIMEOUT:
    return PROSODY_ERR_TRANSIENT;
  default:
    return PROSODY_ERR_PERMANENT;
  }
}

int pr__cql_parse_error(const uint8_t *body, size_t len, pr__cql_error_t *e,
                        char *errstr, size_t errstr_size) {
  pr__crd_t r;
  memset(e, 0, sizeof(*e));
  pr__crd_init(&r, body, len);
  e->code = (int32_t)pr__crd_u32(&r);
  pr__crd_string(&r, e->message, sizeof(e->message));
  if (e->code == PR_CQL_E_UNPREPARED) {
    e->unprepared_len = pr__crd_u16(&r);
    e->unprepared_id = pr__crd_take(&r, e->unprepared_len);
  }
  if (r.bad) {
    pr__errf(errstr, errstr_size, "malformed CQL ERROR body (%zu bytes)", len);
    return -1;
  }
  return 0;
}

static void type_free(pr__cql_type_t *t) {
  if (!t)
    return;
  for (uint16_t i = 0; t->sub && i < t->nsub; i++)
    type_free(t->sub[i]);
  for (uint16_t i = 0; t->field_names && i < t->nsub; i++)
    free(t->field_names[i]);
  free(t->sub);
  free(t->field_names);
  free(t);
}

static pr__cql_type_t *type_parse(pr__crd_t *r, int depth) {
  pr__cql_type_t *t;
  char skip[256];
  uint16_t n = 0;
  if (depth > PR_CQL_MAX_TYPE_DEPTH || r->bad)
    return NULL;
  if (!(t = calloc(1, sizeof(*t))))
    return NULL;
  t->id = pr__crd_u16(r);
  switch (t->id) {
  case PR_CQL_T_CUSTOM:
    pr__crd_string(r, skip, sizeof(skip));
    break;
  case PR_CQL_T_LIST:
  case PR_CQL_T_SET:
    n = 1;
    break;
  case PR_CQL_T_MAP:
    n = 2;
    break;
  case PR_CQL_T_UDT:
    pr__crd_string(r, skip, sizeof(skip)); /* keyspace */
    pr__crd_string(r, skip, sizeof(skip)); /* name */
    n = pr__crd_u16(r);
    break;
  case PR_CQL_T_TUPLE:
    n = pr__crd_u16(r);
    break;
  default:
    if (t->id > PR_CQL_T_DURATION) {
      r->bad = 1; /* unknown type: we cannot skip its values' layout */
      free(t);
      return NULL;
    }
  }
  /* Each element type takes at least 2 bytes: no allocation beyond what the
   * frame could describe. */
  if (n && (size_t)n * 2 > r->len - r->off)
    r->bad = 1;
  if (n && !r->bad) {
    t->sub = calloc(n, sizeof(*t->sub));
    if (t->id == PR_CQL_T_UDT)
      t->field_names = calloc(n, sizeof(char *));
    if (!t->sub || (t->id == PR_CQL_T_UDT && !t->field_names)) {
      type_free(t);
      return NULL;
    }
    t->nsub = n;
    for (uint16_t i = 0; i < n && !r->bad; i++) {
      if (t->id == PR_CQL_T_UDT) {
        char name[256];
        pr__crd_string(r, name, sizeof(name));
        if (!(t->field_names[i] = strdup(name)))
          r->bad = 1;
      }
      if (!r->bad && !(t->sub[i] = type_parse(r, depth + 1)))
        r->bad = 1;
    }
  }
  if (r->bad) {
    type_free(t);
    return NULL;
  }
  return t;
}

/* Column specs of a metadata block (flags already read). */
static int parse_cols(pr__crd_t *r, uint32_t flags, int32_t ncols,
                      pr__cql_col_t **out) {
  char skip[256];
  int global = flags & 0x0001;
  pr__cql_col_t *cols;
  if (ncols < 0 || (size_t)ncols > r->len - r->off)
    return -1;
  if (global) {
    pr__crd_string(r, skip, sizeof(skip));
    pr__crd_string(r, skip, sizeof(skip));
  }
  if (!ncols) {
    *out = NULL;
    return r->bad ? -1 : 0;
  }
  if (!(cols = calloc((size_t)ncols, sizeof(*cols))))
    return -1;
  for (int32_t i = 0; i < ncols && !r->bad; i++) {
    if (!global) {
      pr__crd_string(r, skip, sizeof(skip));
      pr__crd_string(r, skip, sizeof(skip));
    }
    pr__crd_string(r, cols[i].name, sizeof(cols[i].name));
    if (!r->bad && !(cols[i].type = type_parse(r, 0)))
      r->bad = 1;
  }
  *out = cols;
  return r->bad ? -1 : 0;
}

/* Rows metadata: flags, count, paging state, column specs. */
static int parse_rows_meta(pr__crd_t *r, pr__cql_result_t *res) {
  uint32_t flags = pr__crd_u32(r);
  res->ncols = (int32_t)pr__crd_u32(r);
  res->paging_len = -1;
  if (flags & 0x0002)
    res->paging_len = pr__crd_bytes(r, &res->paging_state);
  if (r->bad || res->ncols < 0)
    return -1;
  if (!(flags & 0x0004))
    return parse_cols(r, flags, res->ncols, &res->cols);
  /* No metadata: columns unnamed and untyped. Bounded like parse_cols. */
  if ((size_t)res->ncols > r->len - r->off)
    return -1;
  res->cols = calloc((size_t)res->ncols + 1, sizeof(*res->cols));
  return res->cols ? 0 : -1;
}

int pr__cql_parse_result(const uint8_t *body, size_t len, pr__cql_result_t *res,
                         char *errstr, size_t errstr_size) {
  pr__crd_t r;
  memset(res, 0, sizeof(*res));
  res->paging_len = -1;
  pr__crd_init(&r, body, len);
  res->kind = (int32_t)pr__crd_u32(&r);
  switch (res->kind) {
  case PR_CQL_RESULT_VOID:
    break;
  case PR_CQL_RESULT_ROWS: {
    size_t ncells;
    if (parse_rows_meta(&r, res))
      goto bad;
    res->nrows = (int32_t)pr__crd_u32(&r);
    if (r.bad || res->nrows < 0 || (size_t)res->nrows > len)
      goto bad;
    ncells = (size_t)res->nrows * (size_t)res->ncols;
    /* Each cell takes at least its 4-byte length. */
    if (ncells > (r.len - r.off) / 4)
      goto bad;
    if (ncells && !(res->cells = calloc(ncells, sizeof(*res->cells))))
      goto bad;
    for (size_t i = 0; i < ncells && !r.bad; i++)
      res->cells[i].len = pr__crd_bytes(&r, &res->cells[i].p);
    if (r.bad)
      goto bad;
    break;
  }
  case PR_CQL_RESULT_KEYSPACE:
    pr__crd_string(&r, res->text, sizeof(res->text));
    break;
  case PR_CQL_RESULT_PREPARED: {
    uint32_t flags;
    int32_t pk;
    pr__cql_col_t *bind = NULL;
    res->prepared_len = pr__crd_u16(&r);
    res->prepared_id = pr__crd_take(&r, res->prepared_len);
    flags = pr__crd_u32(&r);
    res->nbind = (int32_t)pr__crd_u32(&r);
    pk = (int32_t)pr__crd_u32(&r);
    if (r.bad || pk < 0 || (size_t)pk * 2 > r.len - r.off)
      goto bad;
    pr__crd_take(&r, (size_t)pk * 2);
    if (parse_cols(&r, flags, res->nbind, &bind)) {
      for (int32_t i = 0; bind && i < res->nbind; i++)
        type_free(bind[i].type);
      free(bind);
      goto bad;
    }
    for (int32_t i = 0; bind && i < res->nbind; i++)
      type_free(bind[i].type);
    free(bind);
    if (parse_rows_meta(&r, res))
      goto bad;
    break;
  }
  case PR_CQL_RESULT_SCHEMA: {
    /* change type, target, then the target's options: KEYSPACE: name;
     * TABLE, TYPE: keyspace, name; FUNCTION, AGGREGATE: keyspace, name,
     * argument types. */
    char target[64], skip[256];
    pr__crd_string(&r, res->text, sizeof(res->text));
    pr__crd_string(&r, target, sizeof(target));
    pr__crd_string(&r, skip, sizeof(skip));
    if (strcmp(target, "KEYSPACE"))
      pr__crd_string(&r, skip, sizeof(skip));
    if (!strcmp(target, "FUNCTION") || !strcmp(target, "AGGREGATE"))
      for (uint16_t i = 0, n = pr__crd_u16(&r); i < n && !r.bad; i++)
        pr__crd_string(&r, skip, sizeof(skip));
    if (r.bad)
      goto bad;
    break;
  }
  default:
    pr__errf(errstr, errstr_size, "unknown CQL RESULT kind %d", res->kind);
    pr__cql_result_free(res);
    return -1;
  }
  if (r.bad)
    goto bad;
  return 0;
bad:
  pr__errf(errstr, errstr_size,
           "malformed CQL RESULT (kind %d, %zu bytes, failed at byte %zu)",
           res->kind, len, r.off);
  pr__cql_result_free(res);
  return -1;
}

void pr__cql_result_free(pr__cql_result_t *res) {
  for (int32_t i = 0; res->cols && i < res->ncols; i++)
    type_free(res->cols[i].type);
  free(res->cols);
  free(res->cells);
  free(res->owned);
  res->cols = NULL;
  res->cells = NULL;
  res->owned = NULL;
  res->ncols = res->nrows = 0;
}

/* ---- cells ------------------------------------------------------------- */

static int get_be(const pr__cql_cell_t *c, int n, uint64_t *v) {
  if (!c->p || c->len != n)
    return -1;
  *v = 0;
  for (int i = 0; i < n; i++)
    *v = *v << 8 | c->p[i];
  return 0;
}

int pr__cql_get_int(const pr__cql_cell_t *c, int32_t *v) {
  uint64_t x;
  if (get_be(c, 4, &x))
    return -1;
  *v = (int32_t)(uint32_t)x;
  return 0;
}

int pr__cql_get_bigint(const pr__cql_cell_t *c, int64_t *v) {
  uint64_t x;
  if (get_be(c, 8, &x))
    return -1;
  *v = (int64_t)x;
  return 0;
}

int pr__cql_get_tinyint(const pr__cql_cell_t *c, int8_t *v) {
  uint64_t x;
  if (get_be(c, 1, &x))
    return -1;
  *v = (int8_t)(uint8_t)x;
  return 0;
}

int pr__cql_get_bool(const pr__cql_cell_t *c, int *v) {
  uint64_t x;
  if (get_be(c, 1, &x))
    return -1;
  *v = x != 0;
  return 0;
}

int pr__cql_get_uuid(const pr__cql_cell_t *c, uint8_t out[16]) {
  if (!c->p || c->len != 16)
    return -1;
  memcpy(out, c->p, 16);
  return 0;
}

int pr__cql_get_text(const pr__cql_cell_t *c, char *buf, size_t size) {
  if (!c->p || c->len < 0 || (size_t)c->len >= size)
    return -1;
  memcpy(buf, c->p, (size_t)c->len);
  buf[c->len] = '\0';
  return 0;
}

int pr__cql_get_elements(const pr__cql_cell_t *c, const pr__cql_type_t *type,
                         pr__cql_cell_t *out, int max) {
  pr__crd_t r;
  int32_t n;
  int per = type && type->id == PR_CQL_T_MAP ? 2 : 1, got = 0;
  if (!c->p || c->len < 0 || !type)
    return -1;
  pr__crd_init(&r, c->p, (size_t)c->len);
  if (type->id == PR_CQL_T_UDT || type->id == PR_CQL_T_TUPLE) {
    /* Fields in order; a UDT value may carry fewer fields than its type. */
    while (r.off < r.len && got < max && got < type->nsub) {
      out[got].len = pr__crd_bytes(&r, &out[got].p);
      if (r.bad)
        return -1;
      got++;
    }
    return got;
  }
  if (type->id != PR_CQL_T_LIST && type->id != PR_CQL_T_SET &&
      type->id != PR_CQL_T_MAP)
    return -1;
  n = (int32_t)pr__crd_u32(&r);
  if (r.bad || n < 0 || (size_t)n * (size_t)per > (size_t)max ||
      (size_t)n * (size_t)per > (r.len - r.off) / 4)
    return -1;
  for (int32_t i = 0; i < n * per; i++) {
    out[i].len = pr__crd_bytes(&r, &out[i].p);
    if (r.bad)
      return -1;
  }
  return n * per;
}
