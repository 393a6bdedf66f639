/*
 * test_qos_stores.c - the deduplication and deferral stores against real
 * Cassandra (real tier): every operation, through each store's worker
 * thread, with callbacks delivered on this thread by poll(): dedup ids are
 * seen once recorded and expire with their TTL; deferred messages and
 * timers form a FIFO per key (head, advance, retry counts), separate per
 * key and per segment. The rows are the original Prosody's (its tables are
 * shared): read back with plain CQL, and rows written as it writes them
 * (a partition without the next hint, as before its hint existed) read by
 * the store.
 */
#include <arpa/inet.h>
#include <endian.h>
#include <pthread.h>
#include <time.h>

#include "cql/cql.h"
#include "harness.h"
#include "stores/stores.h"
#include "util/util.h"

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static int woken; /* guarded by lock */

static void wake(void *arg) {
  (void)arg;
  pthread_mutex_lock(&lock);
  woken = 1;
  pthread_cond_signal(&cond);
  pthread_mutex_unlock(&lock);
}

/* One answer, filled by the callbacks (this thread). */
typedef struct ans {
  int done, seen, found;
  prosody_err_t err;
  char errstr[512];
  int64_t position;
  int32_t retries;
} ans_t;

static void on_done(void *arg, prosody_err_t err, const char *errstr) {
  ans_t *a = arg;
  a->done = 1;
  a->err = err;
  snprintf(a->errstr, sizeof(a->errstr), "%s", errstr ? errstr : "");
}

static void on_seen(void *arg, prosody_err_t err, const char *errstr,
                    int seen) {
  on_done(arg, err, errstr);
  ((ans_t *)arg)->seen = seen;
}

static void on_head(void *arg, prosody_err_t err, const char *errstr, int found,
                    int64_t position, int32_t retries) {
  ans_t *a = arg;
  on_done(arg, err, errstr);
  a->found = found;
  a->position = position;
  a->retries = retries;
}

/* Waits for the wake-ups and polls until `a` is answered. */
static void await_ans(ans_t *a, void (*poll)(void *), void *store) {
  double deadline = t_now() + 30;
  while (!a->done && t_now() < deadline) {
    struct timespec ts;
    pthread_mutex_lock(&lock);
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 1;
    while (!woken)
      if (pthread_cond_timedwait(&cond, &lock, &ts))
        break;
    woken = 0;
    pthread_mutex_unlock(&lock);
    poll(store);
  }
  CHECK(a->done, "no answer within 30 s");
  CHECK(a->err == PROSODY_OK, "%s: %s", prosody_err_name(a->err), a->errstr);
}

static void dpoll(void *s) { pr__dedup_poll(s); }
static void fpoll(void *s) { pr__defer_poll(s); }

#define DEDUP(call)                                                            \
  do {                                                                         \
    memset(&a, 0, sizeof(a));                                                  \
    call;                                                                      \
    await_ans(&a, dpoll, d);                                                   \
  } while (0)
#define DEFER(call)                                                            \
  do {                                                                         \
    memset(&a, 0, sizeof(a));                                                  \
    call;                                                                      \
    await_ans(&a, fpoll, f);                                                   \
  } while (0)

static const char *keyspace = T_KEYSPACE;

/* One row (`sel`'s first cell, bound to values v[n]) read back with plain
 * CQL: its first `out_len` bytes into `out` (NULL: only whether there is a
 * row). 1 when there is a row (and a cell of at least out_len bytes when
 * out is set). */
static int read_back(const pr__cql_conf_t *conf, const char *sel,
                     const pr__cql_val_t *v, uint16_t n, void *out,
                     size_t out_len) {
  char err[1024];
  pr__cql_result_t res;
  pr__cql_sync_t *y = pr__cql_sync_new(conf, err, sizeof(err));
  int got;
  CHECK(y, "%s", err);
  CHECK_OK(pr__cql_sync_run(y, sel, v, n, NULL, 0, &res, err, sizeof(err)),
           err);
  got = res.kind == PR_CQL_RESULT_ROWS && res.nrows > 0;
  if (got && out) {
    const pr__cql_cell_t *c = pr__cql_cell(&res, 0, 0);
    got = c->len >= (int32_t)out_len;
    if (got)
      memcpy(out, c->p, out_len);
  }
  pr__cql_result_free(&res);
  pr__cql_sync_free(y);
  return got;
}

/* Runs one statement with plain CQL. */
static void run_cql(const pr__cql_conf_t *conf, const char *q,
                    const pr__cql_val_t *v, uint16_t n) {
  char err[1024];
  pr__cql_result_t res;
  pr__cql_sync_t *y = pr__cql_sync_new(conf, err, sizeof(err));
  CHECK(y, "%s", err);
  CHECK_OK(pr__cql_sync_run(y, q, v, n, NULL, 0, &res, err, sizeof(err)), err);
  pr__cql_result_free(&res);
  pr__cql_sync_free(y);
}

static void test_dedup(const pr__cql_conf_t *conf) {
  char err[1024], q[256];
  /* Ids of this run: the table is shared by every run. */
  uint64_t run = ((uint64_t)getpid() << 32) ^ (uint64_t)time(NULL);
  const pr__did_t evt1 = {run, 1}, evt2 = {run, 2}, evt3 = {run, 3};
  uint8_t u[16];
  ans_t a;
  pr__dedup_t *d = T_LONE_STORE(conf, wake, NULL, err,
                                pr__dedup_new(w, keyspace, err, sizeof(err)));
  CHECK(d, "dedup: %s", err);
  DEDUP(pr__dedup_seen(d, "g", evt1, on_seen, &a));
  CHECK(!a.seen, "evt-1 seen before it was recorded");
  DEDUP(pr__dedup_record(d, "g", evt1, 3600, on_done, &a));
  DEDUP(pr__dedup_seen(d, "g", evt1, on_seen, &a));
  CHECK(a.seen, "evt-1 not seen after it was recorded");
  /* The row is the original's: the id as a uuid, big-endian hi then lo. */
  for (int i = 0; i < 8; i++) {
    u[i] = (uint8_t)(evt1.hi >> (56 - 8 * i));
    u[8 + i] = (uint8_t)(evt1.lo >> (56 - 8 * i));
  }
  snprintf(q, sizeof(q), "SELECT id FROM %s.deduplication WHERE id = ?",
           keyspace);
  {
    pr__cql_val_t v[1] = {pr__cv_uuid(u)};
    CHECK(read_back(conf, q, v, 1, NULL, 0),
          "evt-1 is not in deduplication as its uuid");
  }
  /* A row the original wrote is seen. */
  for (int i = 0; i < 8; i++) {
    u[i] = (uint8_t)(evt3.hi >> (56 - 8 * i));
    u[8 + i] = (uint8_t)(evt3.lo >> (56 - 8 * i));
  }
  snprintf(q, sizeof(q),
           "INSERT INTO %s.deduplication (id) VALUES (?) USING TTL 3600",
           keyspace);
  {
    pr__cql_val_t v[1] = {pr__cv_uuid(u)};
    run_cql(conf, q, v, 1);
  }
  DEDUP(pr__dedup_seen(d, "g", evt3, on_seen, &a));
  CHECK(a.seen, "a row written with plain CQL (as the original) is not seen");
  /* A short TTL expires (5 s: a busy node may take a second or two
   * between the write and the read). */
  DEDUP(pr__dedup_record(d, "g", evt2, 5, on_done, &a));
  DEDUP(pr__dedup_seen(d, "g", evt2, on_seen, &a));
  CHECK(a.seen, "evt-2 not seen right after it was recorded");
  {
    double deadline = t_now() + 15;
    do {
      usleep(200 * 1000); /* the TTL is the server's clock: poll it */
      DEDUP(pr__dedup_seen(d, "g", evt2, on_seen, &a));
    } while (a.seen && t_now() < deadline);
    CHECK(!a.seen, "evt-2 still seen 15 s after its 5 s TTL");
  }
  pr__dedup_free(d);
}

static void test_defer(const pr__cql_conf_t *conf, pr__defer_kind_t kind) {
  int t = kind == PR_DEFER_TIMERS;
  const char *tb = t ? "deferred_timers" : "deferred_offsets";
  const char *pos = t ? "original_time" : "offset";
  char err[1024], seg[96], group[64], q[512];
  uint8_t id[16];
  ans_t a;
  pr__defer_t *f =
      T_LONE_STORE(conf, wake, NULL, err,
                   pr__defer_new(w, keyspace, kind, 86400, err, sizeof(err)));
  CHECK(f, "defer: %s", err);
  snprintf(group, sizeof(group), "g-%d-%ld", (int)getpid(), (long)time(NULL));
  snprintf(seg, sizeof(seg), "topic/3:%s", group);
  CHECK(pr__uuid_v5(pr__uuid_ns_oid, seg, strlen(seg), id) == 0, "uuid");
  DEFER(pr__defer_head(f, seg, "k", on_head, &a));
  CHECK(!a.found, "an empty key has a head");
  DEFER(pr__defer_append(f, seg, "k", 20, 1, on_done, &a));
  DEFER(pr__defer_append(f, seg, "k", 10, 0, on_done, &a)); /* below it */
  DEFER(pr__defer_append(f, seg, "k", 30, 0, on_done, &a));
  DEFER(pr__defer_append(f, seg, "other", 5, 7, on_done, &a));
  DEFER(pr__defer_head(f, seg, "k", on_head, &a));
  /* One count per key: the first deferral's (1: failed once). */
  CHECK(a.found && a.position == 10 && a.retries == 1, "head %lld/%d",
        (long long)a.position, a.retries);
  DEFER(pr__defer_set_retries(f, seg, "k", 10, 3, on_done, &a));
  DEFER(pr__defer_head(f, seg, "k", on_head, &a));
  CHECK(a.found && a.position == 10 && a.retries == 3, "retries %d", a.retries);
  /* The original's rows: its segment id, the hint at the head, its count
   * (ours less one), the segment's row. */
  {
    pr__cql_val_t v[2] = {pr__cv_uuid(id), pr__cv_text("k")};
    int32_t rc;
    snprintf(q, sizeof(q),
             "SELECT retry_count FROM %s.%s WHERE segment_id = ? AND key = ? "
             "LIMIT 1",
             keyspace, tb);
    CHECK(read_back(conf, q, v, 2, &rc, 4), "no row of key k in %s", tb);
    CHECK(ntohl((uint32_t)rc) == 2, "%s.retry_count %d, want 2", tb,
          (int)ntohl((uint32_t)rc));
    snprintf(q, sizeof(q),
             t ? "SELECT next_timer FROM %s.%s WHERE segment_id = ? AND key = "
                 "? LIMIT 1"
               : "SELECT next_offset FROM %s.%s WHERE segment_id = ? AND key "
                 "= ? LIMIT 1",
             keyspace, tb);
    if (t) {
      uint8_t udt[8]; /* (time int, span map): each field after its length */
      CHECK(read_back(conf, q, v, 2, udt, 8), "no next_timer");
      CHECK(udt[3] == 4 && udt[7] == 10, "next_timer's time is not 10");
    } else {
      int64_t next;
      CHECK(read_back(conf, q, v, 2, &next, 8), "no next_offset");
      CHECK(be64toh((uint64_t)next) == 10, "next_offset %lld, want 10",
            (long long)be64toh((uint64_t)next));
    }
    snprintf(q, sizeof(q),
             "SELECT consumer_group FROM %s.deferred_segments WHERE id = ? "
             "AND topic = 'topic' AND partition = 3 ALLOW FILTERING",
             keyspace);
    CHECK(read_back(conf, q, v, 1, NULL, 0), "no deferred_segments row");
  }
  DEFER(pr__defer_advance(f, seg, "k", 10, on_done, &a));
  DEFER(pr__defer_head(f, seg, "k", on_head, &a));
  CHECK(a.found && a.position == 20 && a.retries == 1,
        "head after advance %lld/%d (its count starts again)",
        (long long)a.position, a.retries);
  DEFER(pr__defer_head(f, seg, "other", on_head, &a));
  CHECK(a.found && a.position == 5 && a.retries == 7, "other key %lld/%d",
        (long long)a.position, a.retries);
  DEFER(pr__defer_head(f, "topic/3:g-other", "k", on_head, &a));
  CHECK(!a.found, "another segment shares the key's FIFO");
  DEFER(pr__defer_advance(f, seg, "k", 30, on_done, &a)); /* not the head */
  DEFER(pr__defer_head(f, seg, "k", on_head, &a));
  CHECK(a.found && a.position == 20, "head %lld after removing 30",
        (long long)a.position);
  DEFER(pr__defer_advance(f, seg, "k", 20, on_done, &a));
  DEFER(pr__defer_head(f, seg, "k", on_head, &a));
  CHECK(!a.found, "the key still has a head after its last advance");
  /* Rows without the hint, with a count (the original before its hint
   * existed): the lowest row is the head. */
  {
    pr__cql_val_t v[3] = {pr__cv_uuid(id), pr__cv_text("legacy"),
                          t ? pr__cv_int(40) : pr__cv_bigint(40)};
    snprintf(q, sizeof(q),
             "INSERT INTO %s.%s (segment_id, key, %s) VALUES (?, ?, ?)",
             keyspace, tb, pos);
    run_cql(conf, q, v, 3);
    v[2] = t ? pr__cv_int(50) : pr__cv_bigint(50);
    run_cql(conf, q, v, 3);
    snprintf(q, sizeof(q),
             "UPDATE %s.%s SET retry_count = 4 WHERE segment_id = ? AND key = "
             "?",
             keyspace, tb);
    run_cql(conf, q, v, 2);
  }
  DEFER(pr__defer_head(f, seg, "legacy", on_head, &a));
  CHECK(a.found && a.position == 40 && a.retries == 5, "legacy head %lld/%d",
        (long long)a.position, a.retries);
  DEFER(pr__defer_advance(f, seg, "legacy", 40, on_done, &a));
  DEFER(pr__defer_head(f, seg, "legacy", on_head, &a));
  CHECK(a.found && a.position == 50 && a.retries == 1, "legacy next %lld/%d",
        (long long)a.position, a.retries);
  /* Appends of a new key sent together (as the engine sends a deferred
   * message's followers): the first one's row stays the head. */
  {
    ans_t r[3];
    memset(r, 0, sizeof(r));
    pr__defer_append(f, seg, "burst", 7, 1, on_done, &r[0]);
    pr__defer_append(f, seg, "burst", 207, 0, on_done, &r[1]);
    pr__defer_append(f, seg, "burst", 407, 0, on_done, &r[2]);
    for (int i = 0; i < 3; i++)
      await_ans(&r[i], fpoll, f);
  }
  DEFER(pr__defer_head(f, seg, "burst", on_head, &a));
  CHECK(a.found && a.position == 7 && a.retries == 1,
        "head of appends sent together %lld/%d, want 7/1",
        (long long)a.position, a.retries);
  /* Clearing a key (a timer unscheduled: all of its entries). */
  DEFER(pr__defer_trim(f, seg, "legacy", INT64_MAX, on_done, &a));
  DEFER(pr__defer_head(f, seg, "legacy", on_head, &a));
  CHECK(!a.found, "a cleared key has a head");
  pr__defer_free(f);
}

/* The store tests' CQL configuration, T_KEYSPACE's tables migrated. */
static void store_conf(pr__cql_conf_t *conf, char **node) {
  t_cql_conf(conf, node);
  t_cql_migrate(conf);
}

T_SCENARIO(dedup_ids_seen_once_recorded_and_expire_with_ttl, T_REAL, 90) {
  char *node;
  pr__cql_conf_t conf;
  store_conf(&conf, &node);
  test_dedup(&conf);
  return 0;
}

T_SCENARIO(deferred_messages_fifo_per_key_and_segment, T_REAL, 90) {
  char *node;
  pr__cql_conf_t conf;
  store_conf(&conf, &node);
  test_defer(&conf, PR_DEFER_MESSAGES);
  return 0;
}

T_SCENARIO(deferred_timers_fifo_per_key_and_segment, T_REAL, 90) {
  char *node;
  pr__cql_conf_t conf;
  store_conf(&conf, &node);
  test_defer(&conf, PR_DEFER_TIMERS);
  return 0;
}
