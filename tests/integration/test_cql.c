/*
 * test_cql.c - the CQL client against real Cassandra (real tier): prepared
 * statements round-trip every type we use; logged and unlogged batches;
 * paging; a statement the server forgot (its table dropped and created
 * again) is prepared again transparently; server errors arrive classified
 * with their message; a connection cut mid-test (through a local proxy) is
 * re-established and operations resume; migrations started by four clients
 * at once apply each file exactly once, in the original Prosody's
 * bookkeeping; a changed file, a keyspace at a newer version and a keyspace
 * of another schema are refused and left unchanged; the timer store's
 * operations.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>

#include "cql/cql.h"
#include "harness.h"
#include "timers/timers.h"

static char ks[64];

static const char *cassandra(void) { return t_cassandra_nodes(); }

static pr__cql_sync_t *session(const char *node) {
  char err[1024], *nodes[1] = {(char *)node};
  /* Generous: schema changes (CREATE TABLE, the migrations) take seconds
   * on a node that the other real-tier tests keep busy. */
  pr__cql_conf_t conf = {
      .nodes = nodes, .nnodes = 1, .request_timeout_ms = 15000};
  pr__cql_sync_t *y = pr__cql_sync_new(&conf, err, sizeof(err));
  CHECK(y, "session: %s", err);
  return y;
}

static void run_ok(pr__cql_sync_t *y, const char *q, const pr__cql_val_t *v,
                   uint16_t n, int prepare) {
  char err[1024];
  CHECK_OK(pr__cql_sync_run(y, q, v, n, NULL, prepare, NULL, err, sizeof(err)),
           err);
}

static void test_types_batches_paging(pr__cql_sync_t *y) {
  char q[512], err[1024], text[64];
  pr__cql_result_t r;
  pr__cql_val_t v[8];
  static const uint8_t uuid[16] = {1, 2,  3,  4,  5,  6,  7,  8,
                                   9, 10, 11, 12, 13, 14, 15, 16};
  uint8_t got_uuid[16];
  int64_t i64;
  int32_t i32;
  int8_t i8;
  int flag;

  snprintf(q, sizeof(q),
           "CREATE TABLE IF NOT EXISTS %s.t (id int PRIMARY KEY, big bigint, "
           "tiny tinyint, flag boolean, u uuid, ts timestamp, data blob, "
           "txt text)",
           ks);
  run_ok(y, q, NULL, 0, 0);
  snprintf(q, sizeof(q),
           "INSERT INTO %s.t (id, big, tiny, flag, u, ts, data, txt) VALUES "
           "(?, ?, ?, ?, ?, ?, ?, ?)",
           ks);
  v[0] = pr__cv_int(7);
  v[1] = pr__cv_bigint(INT64_C(-123456789012));
  v[2] = pr__cv_tinyint(-3);
  v[3] = pr__cv_bool(1);
  v[4] = pr__cv_uuid(uuid);
  v[5] = pr__cv_bigint(INT64_C(1700000000999));
  v[6] = pr__cv_blob("\x00\xff", 2);
  v[7] = pr__cv_text("caf\xc3\xa9");
  run_ok(y, q, v, 8, 1);
  snprintf(q, sizeof(q),
           "SELECT big, tiny, flag, u, ts, data, txt FROM %s.t WHERE id = ?",
           ks);
  CHECK_OK(pr__cql_sync_run(y, q, v, 1, NULL, 1, &r, err, sizeof(err)), err);
  CHECK(r.nrows == 1 && r.ncols == 7, "%d rows, %d cols", r.nrows, r.ncols);
  CHECK(!pr__cql_get_bigint(pr__cql_cell(&r, 0, 0), &i64) &&
            i64 == INT64_C(-123456789012),
        "bigint");
  CHECK(!pr__cql_get_tinyint(pr__cql_cell(&r, 0, 1), &i8) && i8 == -3,
        "tinyint");
  CHECK(!pr__cql_get_bool(pr__cql_cell(&r, 0, 2), &flag) && flag, "bool");
  CHECK(!pr__cql_get_uuid(pr__cql_cell(&r, 0, 3), got_uuid) &&
            !memcmp(got_uuid, uuid, 16),
        "uuid");
  CHECK(!pr__cql_get_bigint(pr__cql_cell(&r, 0, 4), &i64) &&
            i64 == INT64_C(1700000000999),
        "timestamp");
  CHECK(pr__cql_cell(&r, 0, 5)->len == 2 &&
            !memcmp(pr__cql_cell(&r, 0, 5)->p, "\x00\xff", 2),
        "blob");
  CHECK(!pr__cql_get_text(pr__cql_cell(&r, 0, 6), text, sizeof(text)) &&
            !strcmp(text, "caf\xc3\xa9"),
        "text");
  pr__cql_result_free(&r);

  /* Paging: 5 rows, 2 per page. */
  snprintf(q, sizeof(q),
           "CREATE TABLE IF NOT EXISTS %s.p (k int, c int, "
           "PRIMARY KEY (k, c))",
           ks);
  run_ok(y, q, NULL, 0, 0);
  snprintf(q, sizeof(q), "INSERT INTO %s.p (k, c) VALUES (1, ?)", ks);
  for (int i = 0; i < 5; i++) {
    v[0] = pr__cv_int(i);
    run_ok(y, q, v, 1, 1);
  }
  {
    pr__cql_opts_t o;
    uint8_t state[256];
    int32_t state_len = 0, total = 0, pages = 0, next = 0;
    snprintf(q, sizeof(q), "SELECT c FROM %s.p WHERE k = 1", ks);
    do {
      memset(&o, 0, sizeof(o));
      o.page_size = 2;
      o.paging_state = state_len > 0 ? state : NULL;
      o.paging_len = state_len;
      CHECK_OK(pr__cql_sync_run(y, q, NULL, 0, &o, 1, &r, err, sizeof(err)),
               err);
      for (int32_t i = 0; i < r.nrows; i++) {
        CHECK(!pr__cql_get_int(pr__cql_cell(&r, i, 0), &i32) && i32 == next,
              "page %d row %d: %d, want %d", pages, i, i32, next);
        next++;
      }
      total += r.nrows;
      pages++;
      state_len = r.paging_len > 0 && (size_t)r.paging_len <= sizeof(state)
                      ? r.paging_len
                      : 0;
      if (state_len)
        memcpy(state, r.paging_state, (size_t)state_len);
      pr__cql_result_free(&r);
    } while (state_len > 0 && pages < 10);
    CHECK(total == 5 && pages >= 3, "%d rows in %d pages", total, pages);
  }
}

/* Batches go through the async API on the sync session's loop: a logged
 * one and an unlogged one, each of two statements. */
typedef struct bwait {
  int done;
  prosody_err_t err;
  char errstr[512];
} bwait_t;

static void batch_cb(void *arg, prosody_err_t err, const char *errstr,
                     const pr__cql_result_t *res) {
  bwait_t *w = arg;
  (void)res;
  w->done = 1;
  w->err = err;
  snprintf(w->errstr, sizeof(w->errstr), "%s", errstr ? errstr : "");
}

static void test_batches(pr__cql_sync_t *y) {
  char q1[256], q2[256], err[1024];
  pr__cql_t *s = pr__cql_sync_session(y);
  pr__cql_val_t a[2], b[2];
  pr__cql_result_t r;
  /* Rows (1, 0..4), which the batches' deletes remove two of. */
  snprintf(q1, sizeof(q1),
           "CREATE TABLE IF NOT EXISTS %s.p (k int, c int, PRIMARY KEY (k, c))",
           ks);
  run_ok(y, q1, NULL, 0, 0);
  snprintf(q1, sizeof(q1), "INSERT INTO %s.p (k, c) VALUES (1, ?)", ks);
  for (int i = 0; i < 5; i++) {
    a[0] = pr__cv_int(i);
    run_ok(y, q1, a, 1, 1);
  }
  snprintf(q1, sizeof(q1), "INSERT INTO %s.p (k, c) VALUES (?, ?)", ks);
  snprintf(q2, sizeof(q2), "DELETE FROM %s.p WHERE k = ? AND c = ?", ks);
  for (int type = PR_CQL_BATCH_LOGGED; type <= PR_CQL_BATCH_UNLOGGED; type++) {
    bwait_t w = {0};
    pr__cql_bstmt_t st[2];
    a[0] = pr__cv_int(2);
    a[1] = pr__cv_int(10 + type);
    b[0] = pr__cv_int(1);
    b[1] = pr__cv_int(type); /* deletes row c = 0, then c = 1 */
    st[0] = (pr__cql_bstmt_t){pr__cql_stmt(s, q1), a, 2};
    st[1] = (pr__cql_bstmt_t){pr__cql_stmt(s, q2), b, 2};
    pr__cql_batch_run(s, (uint8_t)type, st, 2, batch_cb, &w);
    pr__cql_sync_wait(y, &w.done);
    CHECK(w.done && w.err == PROSODY_OK, "batch type %d: %s", type, w.errstr);
  }
  snprintf(q1, sizeof(q1), "SELECT c FROM %s.p WHERE k = 2", ks);
  CHECK_OK(pr__cql_sync_run(y, q1, NULL, 0, NULL, 1, &r, err, sizeof(err)),
           err);
  CHECK(r.nrows == 2, "batched inserts: %d rows", r.nrows);
  pr__cql_result_free(&r);
  snprintf(q1, sizeof(q1), "SELECT c FROM %s.p WHERE k = 1", ks);
  CHECK_OK(pr__cql_sync_run(y, q1, NULL, 0, NULL, 1, &r, err, sizeof(err)),
           err);
  CHECK(r.nrows == 3, "batched deletes: %d rows left of 5", r.nrows);
  pr__cql_result_free(&r);
}

static void test_unprepared(pr__cql_sync_t *y) {
  char q[256], err[1024];
  pr__cql_val_t v[1];
  snprintf(q, sizeof(q),
           "CREATE TABLE IF NOT EXISTS %s.gone (id int PRIMARY "
           "KEY, x int)",
           ks);
  run_ok(y, q, NULL, 0, 0);
  snprintf(q, sizeof(q), "SELECT x FROM %s.gone WHERE id = ?", ks);
  v[0] = pr__cv_int(1);
  run_ok(y, q, v, 1, 1); /* prepared and cached by the session */
  {
    char ddl[256];
    snprintf(ddl, sizeof(ddl), "DROP TABLE %s.gone", ks);
    run_ok(y, ddl, NULL, 0, 0);
    snprintf(ddl, sizeof(ddl),
             "CREATE TABLE %s.gone (id int PRIMARY KEY, x int)", ks);
    run_ok(y, ddl, NULL, 0, 0);
  }
  /* The server forgot the statement with its table: prepared again. */
  CHECK_OK(pr__cql_sync_run(y, q, v, 1, NULL, 1, NULL, err, sizeof(err)), err);
}

static void test_errors(pr__cql_sync_t *y) {
  char err[1024], q[256];
  prosody_err_t e = pr__cql_sync_run(y, "SELEC nonsense", NULL, 0, NULL, 0,
                                     NULL, err, sizeof(err));
  CHECK(e == PROSODY_ERR_PERMANENT && strstr(err, "syntax_error"),
        "syntax error: %s: %s", prosody_err_name(e), err);
  snprintf(q, sizeof(q), "SELECT * FROM %s.no_such_table", ks);
  e = pr__cql_sync_run(y, q, NULL, 0, NULL, 1, NULL, err, sizeof(err));
  CHECK(e == PROSODY_ERR_PERMANENT && strstr(err, "invalid") &&
            strstr(err, "no_such_table"),
        "unknown table: %s: %s", prosody_err_name(e), err);
}

/* ---- a proxy whose connections can be cut ------------------------------ */

static int proxy_listen_fd, proxy_port;
static atomic_int proxy_cut, proxy_stop;
static int cass_port;

static void *proxy_main(void *arg) {
  int client = -1, server = -1;
  (void)arg;
  while (!atomic_load(&proxy_stop)) {
    struct pollfd p[3];
    int n = 0;
    p[n++] = (struct pollfd){proxy_listen_fd, POLLIN, 0};
    if (client >= 0) {
      p[n++] = (struct pollfd){client, POLLIN, 0};
      p[n++] = (struct pollfd){server, POLLIN, 0};
    }
    if (atomic_exchange(&proxy_cut, 0) && client >= 0) {
      close(client);
      close(server);
      client = server = -1;
      continue;
    }
    if (poll(p, (nfds_t)n, 50) <= 0)
      continue;
    if (p[0].revents & POLLIN) {
      struct sockaddr_in a = {0};
      int c = accept(proxy_listen_fd, NULL, NULL);
      if (c < 0)
        continue;
      if (client >= 0) { /* one connection at a time: the newest */
        close(client);
        close(server);
      }
      server = socket(AF_INET, SOCK_STREAM, 0);
      a.sin_family = AF_INET;
      a.sin_port = htons((uint16_t)cass_port);
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if (connect(server, (struct sockaddr *)&a, sizeof(a))) {
        close(c);
        close(server);
        client = server = -1;
        continue;
      }
      client = c;
      continue;
    }
    for (int i = 1; i < n; i++) {
      char buf[65536];
      ssize_t got;
      if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR)))
        continue;
      got = read(p[i].fd, buf, sizeof(buf));
      if (got <= 0 ||
          write(p[i].fd == client ? server : client, buf, (size_t)got) != got) {
        close(client);
        close(server);
        client = server = -1;
        break;
      }
    }
  }
  if (client >= 0) {
    close(client);
    close(server);
  }
  return NULL;
}

static void test_reconnect(void) {
  struct sockaddr_in a = {0};
  socklen_t len = sizeof(a);
  pthread_t thr;
  char node[64], err[1024];
  pr__cql_sync_t *y;
  prosody_err_t e = PROSODY_ERR_TRANSIENT;
  const char *colon = strrchr(cassandra(), ':');
  cass_port = colon ? atoi(colon + 1) : 9042;
  proxy_listen_fd = socket(AF_INET, SOCK_STREAM, 0);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  CHECK(!bind(proxy_listen_fd, (struct sockaddr *)&a, sizeof(a)) &&
            !listen(proxy_listen_fd, 4) &&
            !getsockname(proxy_listen_fd, (struct sockaddr *)&a, &len),
        "proxy socket");
  proxy_port = ntohs(a.sin_port);
  CHECK(!pthread_create(&thr, NULL, proxy_main, NULL), "proxy thread");
  snprintf(node, sizeof(node), "127.0.0.1:%d", proxy_port);
  y = session(node);
  run_ok(y, "SELECT release_version FROM system.local", NULL, 0, 1);
  atomic_store(&proxy_cut, 1); /* the connection drops */
  /* The next requests may fail while it reconnects (transient); within a
   * few seconds they succeed again, on a new connection. */
  {
    double deadline = t_now() + 20;
    int failures = 0;
    while (t_now() < deadline) {
      e = pr__cql_sync_run(y, "SELECT release_version FROM system.local", NULL,
                           0, NULL, 1, NULL, err, sizeof(err));
      if (!e)
        break;
      CHECK(e == PROSODY_ERR_TRANSIENT || e == PROSODY_ERR_TIMEOUT,
            "while reconnecting: %s: %s", prosody_err_name(e), err);
      failures++;
    }
    CHECK(e == PROSODY_OK, "no reconnect within 20 s: %s", err);
    printf("reconnect: resumed after %d failed request(s)\n", failures);
  }
  pr__cql_sync_free(y);
  atomic_store(&proxy_stop, 1);
  pthread_join(thr, NULL);
  close(proxy_listen_fd);
}

/* ---- migrations ---------------------------------------------------------- */

typedef struct mig {
  char keyspace[64];
  int applied;
  prosody_err_t err;
  char errstr[1024];
} mig_t;

static void *migrate_one(void *arg) {
  mig_t *m = arg;
  pr__cql_sync_t *y = session(cassandra());
  m->err = pr__cql_migrate(y, m->keyspace, 60000, &m->applied, m->errstr,
                           sizeof(m->errstr));
  pr__cql_sync_free(y);
  return NULL;
}

/* The keyspace's migrate error, or "" when it migrated. */
static prosody_err_t migrate_err(const char *keyspace, char *err, size_t n) {
  pr__cql_sync_t *y = session(cassandra());
  prosody_err_t e = pr__cql_migrate(y, keyspace, 20000, NULL, err, n);
  pr__cql_sync_free(y);
  return e;
}

static void drop_keyspace(pr__cql_sync_t *y, const char *keyspace) {
  char q[128];
  snprintf(q, sizeof(q), "DROP KEYSPACE IF EXISTS %s", keyspace);
  run_ok(y, q, NULL, 0, 0);
}

/* The number of rows `q` returns. */
static int count_rows(pr__cql_sync_t *y, const char *q, const char *arg) {
  char err[1024];
  pr__cql_result_t r;
  pr__cql_val_t v = pr__cv_text(arg);
  int n;
  CHECK_OK(
      pr__cql_sync_run(y, q, &v, arg ? 1 : 0, NULL, 0, &r, err, sizeof(err)),
      err);
  n = r.nrows;
  pr__cql_result_free(&r);
  return n;
}

static void test_migrations(void) {
  mig_t m[4];
  pthread_t t[4];
  char fresh[64], err[1024], q[512];
  int total = 0;
  pr__cql_sync_t *y;
  pr__cql_result_t r;
  /* The first shipped file with other text (a later file, so that the
   * keyspace's other files count as known or older). */
  pr__cql_schema_file_t files[2] = {
      {"20250613_create_timers.cql",
       "create table {{KEYSPACE}}.x (id int primary key);\n"},
      {"29991231_later.cql", "create table {{KEYSPACE}}.y (id int);\n"}};
  prosody_err_t e;

  snprintf(fresh, sizeof(fresh), "pt_mig_%d_%ld", (int)getpid(),
           (long)time(NULL) % 100000);
  for (int i = 0; i < 4; i++) {
    memset(&m[i], 0, sizeof(m[i]));
    snprintf(m[i].keyspace, sizeof(m[i].keyspace), "%s", fresh);
    CHECK(!pthread_create(&t[i], NULL, migrate_one, &m[i]), "thread");
  }
  for (int i = 0; i < 4; i++) {
    pthread_join(t[i], NULL);
    CHECK(m[i].err == PROSODY_OK, "client %d: %s", i, m[i].errstr);
    total += m[i].applied;
  }
  CHECK(total == (int)pr__cql_schema_count(),
        "the schema files were applied %d times in all (want %zu: "
        "each once)",
        total, pr__cql_schema_count());

  /* The bookkeeping is the original's: one row per file, a SHA-256 (64
   * lowercase hex digits) and the execution time; the lock row is gone. */
  y = session(cassandra());
  snprintf(q, sizeof(q),
           "SELECT filename, checksum, applied_at, execution_time_ms FROM "
           "%s.schema_migrations",
           fresh);
  CHECK_OK(pr__cql_sync_run(y, q, NULL, 0, NULL, 0, &r, err, sizeof(err)), err);
  CHECK(r.nrows == (int)pr__cql_schema_count(), "%d rows", r.nrows);
  for (int32_t i = 0; i < r.nrows; i++) {
    char sum[80];
    int64_t ms;
    CHECK(!pr__cql_get_text(pr__cql_cell(&r, i, 1), sum, sizeof(sum)) &&
              strlen(sum) == 64 && strspn(sum, "0123456789abcdef") == 64,
          "checksum %s", sum);
    CHECK(!pr__cql_get_bigint(pr__cql_cell(&r, i, 2), &ms) && ms > 0,
          "applied_at");
    CHECK(!pr__cql_get_bigint(pr__cql_cell(&r, i, 3), &ms) && ms >= 0,
          "execution_time_ms");
  }
  pr__cql_result_free(&r);
  snprintf(q, sizeof(q), "SELECT lock_name FROM %s.locks", fresh);
  CHECK(count_rows(y, q, NULL) == 0, "the migration lock was released");

  /* An applied file whose text differs is refused, naming it. */
  e = pr__cql_migrate_files(y, fresh, files, 2, 10000, NULL, err, sizeof(err));
  CHECK(e == PROSODY_ERR_PERMANENT &&
            strstr(err, "20250613_create_timers.cql") &&
            strstr(err, "checksum") && strstr(err, fresh),
        "changed file: %s: %s", prosody_err_name(e), err);

  /* A keyspace at a newer version than ours is refused, naming the
   * keyspace, the version found and the versions we support. */
  snprintf(q, sizeof(q),
           "INSERT INTO %s.schema_migrations (filename, checksum) VALUES "
           "('29991231_from_the_future.cql', 'ff')",
           fresh);
  run_ok(y, q, NULL, 0, 0);
  e = migrate_err(fresh, err, sizeof(err));
  CHECK(e == PROSODY_ERR_PERMANENT && strstr(err, fresh) &&
            strstr(err, "29991231_from_the_future.cql") &&
            strstr(err, "newer") && strstr(err, "0.7.1"),
        "newer keyspace: %s: %s", prosody_err_name(e), err);
  drop_keyspace(y, fresh);

  /* A keyspace whose schema is neither Prosody's nor ours is refused and
   * left unchanged: another program's tables... */
  snprintf(q, sizeof(q),
           "CREATE KEYSPACE %s WITH replication = {'class': "
           "'SimpleStrategy', 'replication_factor': 1}",
           fresh);
  run_ok(y, q, NULL, 0, 0);
  snprintf(q, sizeof(q), "CREATE TABLE %s.orders (id int PRIMARY KEY)", fresh);
  run_ok(y, q, NULL, 0, 0);
  e = migrate_err(fresh, err, sizeof(err));
  CHECK(e == PROSODY_ERR_PERMANENT && strstr(err, fresh) &&
            strstr(err, "orders") && strstr(err, "unchanged"),
        "foreign keyspace: %s: %s", prosody_err_name(e), err);
  CHECK(count_rows(y,
                   "SELECT table_name FROM system_schema.tables WHERE "
                   "keyspace_name = ?",
                   fresh) == 1,
        "the foreign keyspace was left unchanged");
  /* ... or a bookkeeping table of another layout (our unreleased one). */
  snprintf(q, sizeof(q),
           "CREATE TABLE %s.schema_migrations (name text PRIMARY KEY, "
           "checksum text)",
           fresh);
  run_ok(y, q, NULL, 0, 0);
  e = migrate_err(fresh, err, sizeof(err));
  CHECK(e == PROSODY_ERR_PERMANENT && strstr(err, fresh) &&
            strstr(err, "filename") && strstr(err, "unchanged"),
        "other bookkeeping: %s: %s", prosody_err_name(e), err);
  CHECK(count_rows(y,
                   "SELECT table_name FROM system_schema.tables WHERE "
                   "keyspace_name = ?",
                   fresh) == 2,
        "the keyspace with other bookkeeping was left unchanged");
  drop_keyspace(y, fresh);
  pr__cql_sync_free(y);
  printf("migrations: 4 concurrent clients applied each file once; "
         "changed, newer and foreign keyspaces refused\n");
}

/* Datacenter and rack: the session learns the node's from system.local
 * (the test node: SimpleSnitch, datacenter1/rack1); a preferred datacenter
 * with no node still works (the others serve); a single node discovers no
 * peers. */
static void test_locality(void) {
  const char *dcs[] = {"datacenter1", "elsewhere"};
  for (int i = 0; i < 2; i++) {
    char err[1024], desc[512], *nodes[1] = {(char *)cassandra()};
    pr__cql_conf_t conf = {
        .nodes = nodes, .nnodes = 1, .datacenter = dcs[i], .rack = "rack1"};
    pr__cql_sync_t *y = pr__cql_sync_new(&conf, err, sizeof(err));
    CHECK(y, "%s", err);
    /* The topology queries run beside the first requests and may answer
     * after them: query until they did (or 10 s). */
    {
      double deadline = t_now() + 10;
      do {
        run_ok(y, "SELECT release_version FROM system.local", NULL, 0, 1);
        pr__cql_describe(pr__cql_sync_session(y), desc, sizeof(desc));
      } while (strstr(desc, "?/?") && t_now() < deadline);
    }
    CHECK(strstr(desc, "datacenter1/rack1 up") && !strchr(desc, ';'),
          "nodes with cassandra_datacenter %s: %s", dcs[i], desc);
    pr__cql_sync_free(y);
  }
  printf("locality: the node's datacenter and rack are known; no phantom "
         "peers\n");
}

/* A session with keyspace `ks` (this process's own) created; drop it with
 * keyspace_drop(). */
static pr__cql_sync_t *keyspace_new(void) {
  pr__cql_sync_t *y;
  char q[256];
  CHECK(t_real_bootstrap(), "needs the real tier (Cassandra)");
  snprintf(ks, sizeof(ks), "pt_cql_%d", (int)getpid());
  y = session(cassandra());
  snprintf(q, sizeof(q),
           "CREATE KEYSPACE IF NOT EXISTS %s WITH replication = {'class': "
           "'SimpleStrategy', 'replication_factor': 1}",
           ks);
  run_ok(y, q, NULL, 0, 0);
  return y;
}

static void keyspace_drop(pr__cql_sync_t *y) {
  char q[256];
  snprintf(q, sizeof(q), "DROP KEYSPACE %s", ks);
  run_ok(y, q, NULL, 0, 0);
  pr__cql_sync_free(y);
}

T_SCENARIO(prepared_statements_round_trip_every_type_and_page, T_REAL, 90) {
  pr__cql_sync_t *y = keyspace_new();
  test_types_batches_paging(y);
  keyspace_drop(y);
  return 0;
}

T_SCENARIO(logged_and_unlogged_batches_apply, T_REAL, 90) {
  pr__cql_sync_t *y = keyspace_new();
  test_batches(y);
  keyspace_drop(y);
  return 0;
}

T_SCENARIO(forgotten_statement_prepared_again, T_REAL, 90) {
  pr__cql_sync_t *y = keyspace_new();
  test_unprepared(y);
  keyspace_drop(y);
  return 0;
}

T_SCENARIO(server_errors_classified_with_message, T_REAL, 90) {
  pr__cql_sync_t *y = keyspace_new();
  test_errors(y);
  keyspace_drop(y);
  return 0;
}

T_SCENARIO(cut_connection_reestablished_and_resumed, T_REAL, 90) {
  CHECK(t_real_bootstrap(), "needs the real tier (Cassandra)");
  test_reconnect();
  return 0;
}

T_SCENARIO(session_learns_node_datacenter_and_rack, T_REAL, 90) {
  CHECK(t_real_bootstrap(), "needs the real tier (Cassandra)");
  test_locality();
  return 0;
}

T_SCENARIO(concurrent_migrations_apply_each_file_once, T_REAL, 120) {
  CHECK(t_real_bootstrap(), "needs the real tier (Cassandra)");
  test_migrations();
  return 0;
}
