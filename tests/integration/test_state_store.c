/*
 * test_state_store.c - the Cassandra keyed-state store (src/stores/
 * cqlstate.c) against real Cassandra (real tier), driven directly: cells
 * put, read and listed in both directions, sections deleted, TTLs, the
 * event's dedup row written with its cells (also when the apply is split),
 * the collection's recorded kind, and rows as the original Prosody writes
 * them (a cell it left staged, a compressed one), read back and written
 * with plain CQL in its layout.
 */
#include <poll.h>

#include "cql/cql.h"
#include "harness.h"
#include "stores/state.h"
#include "util/util.h"

static int wake_fd[2]; /* the store's wake-ups, a byte each */

static void wake(void *arg) {
  char c = 1;
  (void)arg;
  (void)!write(wake_fd[1], &c, 1);
}

#define MAXC 8

/* One answer, filled by a callback (this thread). */
typedef struct ans {
  int done, found, end;
  prosody_err_t err;
  char errstr[512];
  char data[64]; /* get's value, as text */
  size_t n;      /* range: the cells */
  int section[MAXC];
  char coord[MAXC][32], cell[MAXC][64]; /* coordinates and values, as text */
} ans_t;

static void text_of(char *out, size_t size, const uint8_t *p, size_t n) {
  snprintf(out, size, "%.*s", (int)n, (const char *)p);
}

static void on_done(void *arg, prosody_err_t err, const char *errstr) {
  ans_t *a = arg;
  a->done = 1;
  a->err = err;
  snprintf(a->errstr, sizeof(a->errstr), "%s", errstr ? errstr : "");
}

static void on_get(void *arg, prosody_err_t err, const char *errstr,
                   const uint8_t *data, size_t len, int found) {
  ans_t *a = arg;
  on_done(a, err, errstr);
  a->found = found;
  if (found)
    text_of(a->data, sizeof(a->data), data, len);
}

static void on_range(void *arg, prosody_err_t err, const char *errstr,
                     const pr__scell_t *cells, size_t n, int end) {
  ans_t *a = arg;
  on_done(a, err, errstr);
  a->n = n;
  a->end = end;
  for (size_t i = 0; i < n && i < MAXC; i++) {
    a->section[i] = cells[i].section;
    text_of(a->coord[i], sizeof(a->coord[i]), cells[i].coord,
            cells[i].coord_len);
    text_of(a->cell[i], sizeof(a->cell[i]), cells[i].data, cells[i].data_len);
  }
}

/* Polls `s` on its wake-ups until `a` is answered (30 s at most). */
static void await(pr__sstore_t *s, ans_t *a) {
  double deadline = t_now() + 30;
  while (!a->done && t_now() < deadline) {
    struct pollfd p = {wake_fd[0], POLLIN, 0};
    char buf[64];
    if (poll(&p, 1, 1000) > 0)
      (void)!read(wake_fd[0], buf, sizeof(buf));
    s->ops->poll(s);
  }
  CHECK(a->done, "the store did not answer within 30 s");
}

/* The store under test and a plain CQL session beside it. */
static pr__sstore_t *st;
static pr__cql_sync_t *y;
static pr__cql_conf_t cqlconf;
static char group[64]; /* this run's: its cells are its own */

static pr__sstore_t *store_new(void) {
  char err[512];
  pr__sstore_t *s =
      T_LONE_STORE(&cqlconf, wake, NULL, err,
                   pr__cqlstate_new(w, T_KEYSPACE, err, sizeof(err)));
  CHECK(s, "pr__cqlstate_new: %s", err);
  CHECK(!s->sync, "the Cassandra store answers from poll()");
  return s;
}

static void setup(void) {
  static char *node;
  char err[512];
  CHECK(pipe(wake_fd) == 0, "pipe");
  t_cql_conf(&cqlconf, &node);
  t_cql_migrate(&cqlconf);
  y = pr__cql_sync_new(&cqlconf, err, sizeof(err));
  CHECK(y, "%s", err);
  snprintf(group, sizeof(group), "state-%d-%lld", (int)getpid(),
           (long long)t_wall_ms());
  st = store_new();
}

/* Runs a statement with plain CQL; its result into *res (NULL: freed). */
static void cql(const char *q, const pr__cql_val_t *v, uint16_t n,
                pr__cql_result_t *res) {
  char err[512], full[1024];
  pr__cql_result_t r;
  snprintf(full, sizeof(full), q, T_KEYSPACE);
  CHECK_OK(pr__cql_sync_run(y, full, v, n, NULL, 0, res ? res : &r, err,
                            sizeof(err)),
           err);
  if (!res)
    pr__cql_result_free(&r);
}

static ans_t get(const pr__scoll_t *c, int section, const char *coord) {
  ans_t a = {0};
  st->ops->get(st, c, section, (const uint8_t *)coord, strlen(coord), on_get,
               &a);
  await(st, &a);
  CHECK(a.err == PROSODY_OK, "get: %s", a.errstr);
  return a;
}

static ans_t range(const pr__scoll_t *c, int section, const char *after,
                   int backward, size_t limit) {
  ans_t a = {0};
  st->ops->range(st, c, section, (const uint8_t *)after,
                 after ? strlen(after) : 0, backward, limit, on_range, &a);
  await(st, &a);
  CHECK(a.err == PROSODY_OK, "range: %s", a.errstr);
  return a;
}

static pr__swrite_t put(const pr__scoll_t *c, int section, const char *coord,
                        const char *data, int64_t ttl_s) {
  pr__swrite_t w = {c,
                    PR_SW_PUT,
                    section,
                    (const uint8_t *)coord,
                    strlen(coord),
                    (const uint8_t *)data,
                    strlen(data),
                    ttl_s};
  return w;
}

static pr__swrite_t del(const pr__scoll_t *c, int op, int section,
                        const char *coord) {
  pr__swrite_t w = {c,    op, section, (const uint8_t *)coord, strlen(coord),
                    NULL, 0,  0};
  return w;
}

static void apply(const pr__swrite_t *w, size_t n, const pr__did_t *dedup) {
  ans_t a = {0};
  st->ops->apply(st, w, n, dedup, 3600, on_done, &a);
  await(st, &a);
  CHECK(a.err == PROSODY_OK, "apply: %s", a.errstr);
}

/* Checks a range answer: its cells' coordinates, joined with ",". */
static void expect(const ans_t *a, const char *coords, int end) {
  char got[256] = "";
  for (size_t i = 0; i < a->n && i < MAXC; i++)
    snprintf(got + strlen(got), sizeof(got) - strlen(got), "%s%s", i ? "," : "",
             a->coord[i]);
  CHECK(!strcmp(got, coords) && a->end == end,
        "cells \"%s\" (end %d), expected \"%s\" (end %d)", got, a->end, coords,
        end);
}

T_SCENARIO(cells_put_get_and_range_both_ways, T_REAL, 90) {
  pr__scoll_t c;
  ans_t a;
  setup();
  c = (pr__scoll_t){group, "orders", 3, "k1", "cart"};
  {
    pr__swrite_t w[] = {put(&c, 1, "b", "2", 0), put(&c, 1, "a", "1", 0),
                        put(&c, 1, "d", "4", 0), put(&c, 1, "c", "3", 0),
                        put(&c, 0, "", "v", 0)};
    apply(w, 5, NULL);
  }
  a = get(&c, 1, "c");
  CHECK(a.found && !strcmp(a.data, "3"), "cell c: found %d \"%s\"", a.found,
        a.data);
  a = get(&c, 0, "");
  CHECK(a.found && !strcmp(a.data, "v"), "the empty coordinate of section 0");
  a = get(&c, 1, "e");
  CHECK(!a.found, "a cell never written is found");
  a = get(&c, 0, "a");
  CHECK(!a.found, "cell a is found in section 0 (it is in section 1)");
  {
    pr__scoll_t other = {group, "orders", 4, "k1", "cart"};
    a = get(&other, 1, "a");
    CHECK(!a.found, "another partition's collection shares the cells");
  }
  a = range(&c, 1, NULL, 0, 2);
  expect(&a, "a,b", 0);
  CHECK(!strcmp(a.cell[1], "2") && a.section[1] == 1, "cell b's value");
  a = range(&c, 1, "b", 0, 2);
  expect(&a, "c,d", 1);
  a = range(&c, 1, "d", 0, 2);
  expect(&a, "", 1);
  a = range(&c, 1, NULL, 1, 3);
  expect(&a, "d,c,b", 0);
  a = range(&c, 1, "b", 1, 5);
  expect(&a, "a", 1);
  a = range(&c, 1, NULL, 0, 0);
  expect(&a, "", 0);
  a = range(&c, 0, NULL, 0, 10);
  expect(&a, "", 1); /* the empty coordinate */
  CHECK(a.n == 1 && !strcmp(a.cell[0], "v"), "section 0 holds its one cell");
  /* Blob order is unsigned: 0x7f... (deque index -1) before 0x80... (0). */
  {
    pr__swrite_t w[] = {put(&c, 2, "\x80", "zero", 0),
                        put(&c, 2, "\x7f", "minus one", 0)};
    apply(w, 2, NULL);
    a = range(&c, 2, NULL, 0, 5);
    CHECK(a.n == 2 && !strcmp(a.cell[0], "minus one") &&
              !strcmp(a.cell[1], "zero"),
          "coordinates are not in unsigned byte order");
  }
  st->ops->destroy(st);
  return 0;
}

T_SCENARIO(section_delete_and_order_within_an_apply, T_REAL, 90) {
  pr__scoll_t c;
  ans_t a;
  setup();
  c = (pr__scoll_t){group, "orders", 0, "k2", "queue"};
  {
    pr__swrite_t w[] = {put(&c, 0, "", "bounds", 0), put(&c, 1, "a", "1", 0),
                        put(&c, 1, "b", "2", 0)};
    apply(w, 3, NULL);
  }
  { /* a section cleared, then a put in it: the put stays */
    pr__swrite_t w[] = {del(&c, PR_SW_DEL_SECTION, 1, ""),
                        put(&c, 1, "c", "3", 0)};
    apply(w, 2, NULL);
  }
  a = range(&c, 1, NULL, 0, 10);
  expect(&a, "c", 1);
  a = get(&c, 0, "");
  CHECK(a.found && !strcmp(a.data, "bounds"),
        "deleting section 1 removed section 0's cell");
  { /* a put then its delete: gone; a delete then a put: there */
    pr__swrite_t w[] = {put(&c, 1, "d", "4", 0), del(&c, PR_SW_DEL, 1, "d"),
                        del(&c, PR_SW_DEL, 1, "c"), put(&c, 1, "c", "5", 0)};
    apply(w, 4, NULL);
  }
  a = range(&c, 1, NULL, 0, 10);
  expect(&a, "c", 1);
  CHECK(!strcmp(a.cell[0], "5"), "cell c is \"%s\", not the later put's",
        a.cell[0]);
  {
    pr__swrite_t w[] = {del(&c, PR_SW_DEL, 1, "c")};
    apply(w, 1, NULL);
  }
  a = get(&c, 1, "c");
  CHECK(!a.found, "a deleted cell is found");
  st->ops->destroy(st);
  return 0;
}

T_SCENARIO(cell_ttl_expires, T_REAL, 90) {
  pr__scoll_t c;
  ans_t a;
  double deadline;
  setup();
  c = (pr__scoll_t){group, "orders", 0, "k3", "session"};
  {
    pr__swrite_t w[] = {put(&c, 0, "", "short", 1), put(&c, 1, "kept", "x", 0)};
    apply(w, 2, NULL);
  }
  /* The TTL runs on the server's clock: poll the cell until it goes. */
  deadline = t_now() + 20;
  do
    a = get(&c, 0, "");
  while (a.found && t_now() < deadline);
  CHECK(!a.found, "a cell of TTL 1 s still there after 20 s");
  a = get(&c, 1, "kept");
  CHECK(a.found, "a cell without a TTL expired with its neighbour");
  st->ops->destroy(st);
  return 0;
}

/* Whether deduplication has the row of `d`. */
static int dedup_row(pr__did_t d) {
  uint8_t u[16];
  pr__cql_result_t res;
  int got;
  for (int i = 0; i < 8; i++) {
    u[i] = (uint8_t)(d.hi >> (56 - 8 * i));
    u[8 + i] = (uint8_t)(d.lo >> (56 - 8 * i));
  }
  {
    pr__cql_val_t v[1] = {pr__cv_uuid(u)};
    cql("SELECT id FROM %s.deduplication WHERE id = ?", v, 1, &res);
  }
  got = res.nrows == 1;
  pr__cql_result_free(&res);
  return got;
}

T_SCENARIO(dedup_row_lands_with_the_cells, T_REAL, 120) {
  uint64_t run = ((uint64_t)getpid() << 32) ^ (uint64_t)t_wall_ms();
  pr__did_t d1 = {run, 1}, d2 = {run, 2}, d3 = {run, 3};
  pr__scoll_t c, c2;
  ans_t a;
  setup();
  c = (pr__scoll_t){group, "orders", 0, "k4", "cart"};
  c2 = (pr__scoll_t){group, "orders", 0, "k4", "seen"};
  CHECK(!dedup_row(d1), "the dedup row is there before the apply");
  {
    pr__swrite_t w[] = {put(&c, 0, "", "v", 0)};
    apply(w, 1, &d1);
  }
  CHECK(dedup_row(d1), "the apply did not write the event's dedup row");
  apply(NULL, 0, &d2); /* only the record */
  CHECK(dedup_row(d2), "an apply of no cells did not write the dedup row");
  /* A batch Cassandra refuses (a key that is not UTF-8, for its text
   * column) writes nothing: neither its other cells nor the dedup row. */
  {
    pr__scoll_t bad = {group, "orders", 0, "\xff", "cart"};
    pr__did_t d0 = {run, 99};
    pr__swrite_t w[] = {put(&c, 5, "ok", "v", 0), put(&bad, 5, "x", "v", 0)};
    memset(&a, 0, sizeof(a));
    st->ops->apply(st, w, 2, &d0, 3600, on_done, &a);
    await(st, &a);
    CHECK(a.err == PROSODY_ERR_PERMANENT, "a refused batch: %s \"%s\"",
          prosody_err_name(a.err), a.errstr);
    CHECK(!dedup_row(d0), "a refused batch wrote the dedup row");
    CHECK(!get(&c, 5, "ok").found, "a refused batch wrote a cell");
  }
  /* Over Cassandra's 50 KiB limit of a batch of several partitions: two
   * collections of 40 KiB each, and the dedup row. */
  {
    static char big[40 * 1024 + 1];
    pr__swrite_t w[2];
    memset(big, 'x', sizeof(big) - 1);
    w[0] = put(&c, 1, "big", big, 0);
    w[1] = put(&c2, 1, "big", big, 0);
    apply(w, 2, &d3);
    CHECK(dedup_row(d3), "the split apply did not write the dedup row");
    a = range(&c2, 1, NULL, 0, 1);
    CHECK(a.n == 1, "the second collection's large cell is missing");
  }
  /* Many small cells over two collections, sent in one batch when the
   * store's estimate allows: Cassandra counts each cell's timestamp, TTL
   * and deletion time too, and the estimate must keep such a batch below
   * its 50 KiB (300 puts: one batch; 590: one with too small an estimate). */
  for (int m = 300, k = 0; k < 2; m = 590, k++) {
    static char coords[590][8];
    static pr__swrite_t w[590];
    pr__did_t dm = {run, (uint64_t)(4 + k)};
    for (int i = 0; i < m; i++) {
      snprintf(coords[i], sizeof(coords[i]), "%03d", i);
      w[i] = put(i % 2 ? &c : &c2, 4 + k, coords[i], "s", 0);
    }
    apply(w, (size_t)m, &dm);
    CHECK(dedup_row(dm), "the dedup row of %d small cells is missing", m);
    a = range(&c2, 4 + k, NULL, 1, 1);
    CHECK(a.n == 1 && atoi(a.coord[0]) == m - 2, "the last cell of %d", m);
  }
  /* More than 4096 cells of one collection (split batches), listed over
   * several pages. */
  {
    enum { N = 5000 };
    static char coords[N][8];
    static pr__swrite_t w[N];
    for (int i = 0; i < N; i++) {
      snprintf(coords[i], sizeof(coords[i]), "%05d", i);
      w[i] = put(&c, 3, coords[i], "e", 0);
    }
    apply(w, N, NULL);
    a = range(&c, 3, "00001", 0, N - 3);
    CHECK(a.n == N - 3 && !a.end && !strcmp(a.coord[0], "00002"),
          "listed %zu cells (end %d) of %d, expected %d and more", a.n, a.end,
          N - 2, N - 3);
    a = range(&c, 3, NULL, 1, 1);
    expect(&a, "04999", 0);
  }
  st->ops->destroy(st);
  return 0;
}

/* The recorded identity row of `name`: kind, format_id, key_format_id. */
static void identity_row(const char *name, int *kind, char *fmt, char *keys) {
  pr__cql_result_t res;
  int8_t k = 0;
  pr__cql_val_t v[2] = {pr__cv_text(group), pr__cv_text(name)};
  cql("SELECT kind, format_id, key_format_id FROM %s.keyed_state_identity "
      "WHERE group_id = ? AND state_type = 0 AND name = ?",
      v, 2, &res);
  CHECK(res.nrows == 1, "no keyed_state_identity row of %s", name);
  CHECK(!pr__cql_get_tinyint(pr__cql_cell(&res, 0, 0), &k) &&
            !pr__cql_get_text(pr__cql_cell(&res, 0, 1), fmt, 32) &&
            !pr__cql_get_text(pr__cql_cell(&res, 0, 2), keys, 32),
        "malformed identity row");
  *kind = k;
  pr__cql_result_free(&res);
}

static ans_t identity(pr__sstore_t *s, const char *name, int kind) {
  ans_t a = {0};
  pr__sident_t id = {kind, 0, 0};
  s->ops->identity(s, group, name, &id, on_done, &a);
  await(s, &a);
  return a;
}

T_SCENARIO(identity_recorded_once_and_another_kind_refused, T_REAL, 90) {
  char fmt[32], keys[32], want[512];
  int kind;
  ans_t a, b;
  pr__sstore_t *other;
  setup();
  a = identity(st, "cart", 1); /* a map of JSON */
  CHECK(a.err == PROSODY_OK, "first record: %s", a.errstr);
  identity_row("cart", &kind, fmt, keys);
  CHECK(kind == 2 && !strcmp(fmt, "json") && !strcmp(keys, "utf8.v1"),
        "recorded (%d, %s, %s), expected (2, json, utf8.v1)", kind, fmt, keys);
  a = identity(st, "cart", 1);
  CHECK(a.err == PROSODY_OK, "the same again: %s", a.errstr);
  a = identity(st, "cart", 0); /* a value */
  snprintf(want, sizeof(want),
           "keyed state: collection \"cart\" of group \"%s\" is recorded as a "
           "map (json), not a value (json): give the new collection another "
           "name",
           group);
  CHECK(a.err == PROSODY_ERR_PERMANENT && !strcmp(a.errstr, want),
        "another kind: %s \"%s\"", prosody_err_name(a.err), a.errstr);
  /* Two stores record a new name at once with different kinds: one wins,
   * the other is refused (by the read, or by the insert it lost). */
  other = store_new();
  {
    pr__sident_t deque = {2, 0, 0}, value = {0, 0, 0};
    memset(&a, 0, sizeof(a));
    memset(&b, 0, sizeof(b));
    st->ops->identity(st, group, "race", &deque, on_done, &a);
    other->ops->identity(other, group, "race", &value, on_done, &b);
    await(st, &a);
    await(other, &b);
  }
  CHECK((a.err == PROSODY_OK) != (b.err == PROSODY_OK) &&
            (a.err == PROSODY_ERR_PERMANENT || b.err == PROSODY_ERR_PERMANENT),
        "a race: %s \"%s\" and %s \"%s\"", prosody_err_name(a.err), a.errstr,
        prosody_err_name(b.err), b.errstr);
  identity_row("race", &kind, fmt, keys);
  CHECK(kind == (a.err == PROSODY_OK ? 3 : 1),
        "the recorded kind is not the winner's");
  other->ops->destroy(other);
  st->ops->destroy(st);
  return 0;
}

/* The collection's segment id, as the original derives it. */
static void seg_of(const pr__scoll_t *c, uint8_t out[16]) {
  char name[256];
  snprintf(name, sizeof(name), "%s/%d:%s", c->topic, (int)c->partition,
           c->group);
  CHECK(!pr__uuid_v5(pr__uuid_ns_oid, name, strlen(name), out), "uuid");
}

T_SCENARIO(original_rows_staged_and_compressed, T_REAL, 90) {
  pr__scoll_t c;
  uint8_t seg[16];
  ans_t a;
  setup();
  c = (pr__scoll_t){group, "orders", 1, "k5", "cart"};
  seg_of(&c, seg);
  { /* staged by the original's event, with and without a value before */
    pr__cql_val_t v[5] = {pr__cv_uuid(seg), pr__cv_text("k5"),
                          pr__cv_text("cart"), pr__cv_blob("a", 1),
                          pr__cv_blob("new", 3)};
    const char *q =
        "UPDATE %s.keyed_state_cell SET data = ?, prev_data = ?, encoding "
        "= 1, version = 1, event = {kind: 0, msg_dedup_id: uuid()} WHERE "
        "segment_id = ? AND key = ? AND state_type = 0 AND name = ? AND "
        "kind = 0 AND section = 1 AND coordinate = ?";
    pr__cql_val_t w[6] = {v[4], pr__cv_blob("old", 3), v[0], v[1], v[2], v[3]};
    cql(q, w, 6, NULL);
    w[1] = pr__cv_null();
    w[5] = pr__cv_blob("b", 1);
    cql(q, w, 6, NULL);
  }
  a = get(&c, 1, "a");
  CHECK(a.found && !strcmp(a.data, "old"),
        "a staged cell reads \"%s\" (found %d), not its value before", a.data,
        a.found);
  a = get(&c, 1, "b");
  CHECK(!a.found, "a staged cell without a value before is found");
  a = range(&c, 1, NULL, 0, 5);
  expect(&a, "a", 1);
  CHECK(!strcmp(a.cell[0], "old"), "range reads the staged value");
  { /* our put resolves the row */
    pr__swrite_t w[] = {put(&c, 1, "a", "mine", 0)};
    pr__cql_result_t res;
    pr__cql_val_t v[3] = {pr__cv_uuid(seg), pr__cv_text("k5"),
                          pr__cv_text("cart")};
    apply(w, 1, NULL);
    a = get(&c, 1, "a");
    CHECK(a.found && !strcmp(a.data, "mine"), "after a put: \"%s\"", a.data);
    cql("SELECT prev_data, event FROM %s.keyed_state_cell WHERE segment_id "
        "= ? AND key = ? AND state_type = 0 AND name = ? AND kind = 0 AND "
        "section = 1 AND coordinate = 0x61",
        v, 3, &res);
    CHECK(res.nrows == 1 && pr__cql_cell(&res, 0, 0)->len < 0 &&
              pr__cql_cell(&res, 0, 1)->len < 0,
          "a put left prev_data or event set");
    pr__cql_result_free(&res);
  }
  { /* compressed by the original (encoding 4) */
    pr__cql_val_t v[3] = {pr__cv_uuid(seg), pr__cv_text("k5"),
                          pr__cv_text("cart")};
    cql("UPDATE %s.keyed_state_cell SET data = 0x28b52ffd, encoding = 4, "
        "version = 1 WHERE segment_id = ? AND key = ? AND state_type = 0 AND "
        "name = ? AND kind = 0 AND section = 2 AND coordinate = 0x7a",
        v, 3, NULL);
    memset(&a, 0, sizeof(a));
    st->ops->get(st, &c, 2, (const uint8_t *)"z", 1, on_get, &a);
    await(st, &a);
    CHECK(a.err == PROSODY_ERR_PERMANENT && strstr(a.errstr, "zstd") &&
              strstr(a.errstr, "\"cart\"") && strstr(a.errstr, "0x7a"),
          "a compressed cell: %s \"%s\"", prosody_err_name(a.err), a.errstr);
  }
  st->ops->destroy(st);
  return 0;
}

T_SCENARIO(deque_cells_in_the_original_layout, T_REAL, 90) {
  /* The original's frozen segment vector: ("topic", 0, "group"). */
  pr__scoll_t c = {"group", "topic", 0, NULL, "queue"};
  static const uint8_t bounds[16] = {0, 0, 0, 0, 0, 0, 0, 0,
                                     0, 0, 0, 0, 0, 0, 0, 1};
  static const uint8_t index0[8] = {0x80, 0, 0, 0, 0, 0, 0, 0};
  char key[80];
  pr__cql_result_t res;
  setup();
  snprintf(key, sizeof(key), "%s-k", group); /* this run's key */
  c.key = key;
  {
    pr__swrite_t w[2] = {
        {&c, PR_SW_PUT, 0, (const uint8_t *)"", 0, bounds, 16, 0},
        {&c, PR_SW_PUT, 1, index0, 8, (const uint8_t *)"{\"a\":1}", 7, 0}};
    apply(w, 2, NULL);
  }
  {
    pr__cql_val_t v[1] = {pr__cv_text(key)};
    cql("SELECT kind, section, coordinate, encoding, version, data, "
        "prev_data, event FROM %s.keyed_state_cell WHERE segment_id = "
        "8e49149d-48f6-5bf4-a392-f16c57fe3059 AND key = ? AND state_type = 0 "
        "AND name = 'queue'",
        v, 1, &res);
  }
  CHECK(res.nrows == 2, "%d rows in the collection's partition, expected 2",
        res.nrows);
  for (int r = 0; r < 2; r++) {
    int8_t kind = -1, section = -1;
    int32_t version = 0;
    const pr__cql_cell_t *coord = pr__cql_cell(&res, r, 2);
    const pr__cql_cell_t *enc = pr__cql_cell(&res, r, 3);
    const pr__cql_cell_t *data = pr__cql_cell(&res, r, 5);
    CHECK(!pr__cql_get_tinyint(pr__cql_cell(&res, r, 0), &kind) && kind == 0,
          "row %d: kind %d, expected 0 (a cell)", r, kind);
    CHECK(!pr__cql_get_tinyint(pr__cql_cell(&res, r, 1), &section) &&
              section == r,
          "row %d: section %d", r, section);
    CHECK(enc->len == 2 && enc->p[0] == 0 && enc->p[1] == 1,
          "row %d: encoding is not 1 (raw)", r);
    CHECK(!pr__cql_get_int(pr__cql_cell(&res, r, 4), &version) && version == 1,
          "row %d: version %d, expected 1", r, version);
    CHECK(pr__cql_cell(&res, r, 6)->len < 0 &&
              pr__cql_cell(&res, r, 7)->len < 0,
          "row %d: prev_data or event set", r);
    if (r == 0)
      CHECK(coord->len == 0 && data->len == 16 && !memcmp(data->p, bounds, 16),
            "the bounds cell: an empty (not null) coordinate, 16 bytes");
    else
      CHECK(coord->len == 8 && !memcmp(coord->p, index0, 8) && data->len == 7,
            "the entry of index 0: coordinate 80 00 00 00 00 00 00 00");
  }
  pr__cql_result_free(&res);
  st->ops->destroy(st);
  return 0;
}

T_SCENARIO(store_failure_is_transient_and_named, T_BOTH, 60) {
  /* No Cassandra on the port: the read times out, a transient failure
   * that says which collection and why. */
  char *node = "127.0.0.1:1", err[512];
  pr__scoll_t c = {"g", "orders", 0, "k", "cart"};
  ans_t a = {0};
  pr__cql_conf_t conf = {0};
  CHECK(pipe(wake_fd) == 0, "pipe");
  conf.nodes = &node;
  conf.nnodes = 1;
  conf.connect_timeout_ms = 300;
  conf.request_timeout_ms = 800;
  st = T_LONE_STORE(&conf, wake, NULL, err,
                    pr__cqlstate_new(w, T_KEYSPACE, err, sizeof(err)));
  CHECK(st, "pr__cqlstate_new: %s", err);
  st->ops->get(st, &c, 0, (const uint8_t *)"", 0, on_get, &a);
  await(st, &a);
  CHECK(a.err == PROSODY_ERR_TRANSIENT &&
            strstr(a.errstr, "keyed state: reading collection \"cart\"") &&
            strstr(a.errstr, "800 ms"),
        "a store failure: %s \"%s\"", prosody_err_name(a.err), a.errstr);
  st->ops->destroy(st);
  return 0;
}
