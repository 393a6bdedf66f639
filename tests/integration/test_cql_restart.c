/*
 * test_cql_restart.c - the CQL client while its node restarts (real tier,
 * run alone: it restarts the Cassandra that scripts/services started):
 *  - a session survives a restart: requests fail as transient while the
 *    node is down, then the same session reconnects and its prepared
 *    statement runs again;
 *  - authentication: with the node restarted under PasswordAuthenticator,
 *    a session without credentials and one with a wrong password get
 *    permanent errors that name cassandra_user; the right credentials work.
 * The node is restarted without authentication at the end. Skipped (77)
 * when PROSODY_TEST_CASSANDRA says Cassandra is not ours to restart.
 */
#include "cql/cql.h"
#include "harness.h"

#define SERVICE "/scripts/services/cassandra"

static const char *root = PROSODY_SOURCE_DIR;

static void service(const char *verb, int auth) {
  char cmd[1024];
  snprintf(cmd, sizeof(cmd), "PROSODY_CASSANDRA_AUTH=%d %s%s %s >&2", auth,
           root, SERVICE, verb);
  CHECK(system(cmd) == 0, "%s failed", cmd);
}

static pr__cql_sync_t *session(const char *user, const char *password) {
  char err[1024], *nodes[1] = {"127.0.0.1:9042"};
  pr__cql_conf_t conf = {.nodes = nodes,
                         .nnodes = 1,
                         .user = user,
                         .password = password,
                         .request_timeout_ms = 3000};
  pr__cql_sync_t *y = pr__cql_sync_new(&conf, err, sizeof(err));
  CHECK(y, "session: %s", err);
  return y;
}

static prosody_err_t select_version(pr__cql_sync_t *y, char *err, size_t n) {
  return pr__cql_sync_run(y,
                          "SELECT release_version FROM system.local WHERE "
                          "key = ?",
                          (pr__cql_val_t[]){pr__cv_text("local")}, 1, NULL, 1,
                          NULL, err, n);
}

/* Runs the query until it succeeds (transient failures allowed) or 60 s. */
static int until_ok(pr__cql_sync_t *y, const char *what) {
  char err[1024];
  double deadline = t_now() + 60;
  int failures = 0;
  prosody_err_t e;
  while ((e = select_version(y, err, sizeof(err))) != PROSODY_OK &&
         t_now() < deadline) {
    CHECK(e == PROSODY_ERR_TRANSIENT || e == PROSODY_ERR_TIMEOUT, "%s: %s: %s",
          what, prosody_err_name(e), err);
    failures++;
  }
  CHECK(e == PROSODY_OK, "%s: still failing after 60 s: %s", what, err);
  return failures;
}

T_SCENARIO(session_survives_node_restart_and_names_auth_failures, T_REAL, 600) {
  char err[1024];
  pr__cql_sync_t *y, *bad;
  prosody_err_t e;
  double t0;
  int failures;

  if (getenv("PROSODY_TEST_CASSANDRA") && *getenv("PROSODY_TEST_CASSANDRA")) {
    printf("skipped: Cassandra is external (PROSODY_TEST_CASSANDRA)\n");
    return T_SKIP;
  }
  CHECK(t_real_bootstrap(), "needs the real tier (Cassandra)");

  /* A session survives its node's restart. (A run that died midway may
   * have left the node requiring authentication: start it plain.) */
  y = session(NULL, NULL);
  if (select_version(y, err, sizeof(err)) == PROSODY_ERR_PERMANENT &&
      strstr(err, "requires authentication")) {
    service("stop", 1);
    service("start", 0);
    pr__cql_sync_free(y);
    y = session(NULL, NULL);
    until_ok(y, "after restoring the plain node");
  }
  CHECK_OK(select_version(y, err, sizeof(err)), err);
  t0 = t_now();
  service("stop", 0);
  e = select_version(y, err, sizeof(err));
  CHECK(e == PROSODY_ERR_TRANSIENT || e == PROSODY_ERR_TIMEOUT,
        "with the node down: %s: %s", prosody_err_name(e), err);
  service("start", 0);
  failures = until_ok(y, "after the restart");
  printf("restart: the session resumed %.1f s after the stop (%d failed "
         "request(s) while it reconnected)\n",
         t_now() - t0, failures);

  /* Authentication required: clear errors without or with bad credentials. */
  service("stop", 0);
  service("start", 1);
  {
    double deadline = t_now() + 60;
    do /* the old session reconnects and is asked to log in */
      e = select_version(y, err, sizeof(err));
    while (e != PROSODY_ERR_PERMANENT && t_now() < deadline);
  }
  CHECK(e == PROSODY_ERR_PERMANENT && strstr(err, "requires authentication") &&
            strstr(err, "cassandra_user"),
        "no credentials: %s: %s", prosody_err_name(e), err);
  pr__cql_sync_free(y);
  bad = session("cassandra", "wrong-password");
  e = select_version(bad, err, sizeof(err));
  CHECK(e == PROSODY_ERR_PERMANENT && strstr(err, "rejected the credentials") &&
            strstr(err, "cassandra_user \"cassandra\""),
        "wrong password: %s: %s", prosody_err_name(e), err);
  pr__cql_sync_free(bad);
  y = session("cassandra", "cassandra");
  until_ok(y, "with the right credentials");
  pr__cql_sync_free(y);
  printf("auth: missing and wrong credentials reported, right ones work\n");

  service("stop", 1);
  service("start", 0); /* as the other tests expect it */
  printf("ok: cql restart and authentication\n");
  return 0;
}
