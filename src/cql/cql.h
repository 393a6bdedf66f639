/*
 * cql.h - a small Cassandra client (private) on a libuv loop: one
 * connection per configured node, STARTUP with SASL PLAIN authentication,
 * many requests in flight per connection (stream ids), per-request
 * timeouts, prepared statements (prepared on first use, re-prepared on
 * UNPREPARED), batches, paging, reconnection with backoff, client-side
 * monotonic timestamps, LOCAL_QUORUM by default.
 *
 * Threading: a session belongs to the thread running its loop; every
 * function and callback runs there, pr__cql_stmt excepted. pr__cql_sync_* wrap
 * a session on a private loop for blocking callers (migrations, tools, tests).
 */
#ifndef PR_CQL_H
#define PR_CQL_H

#include <uv.h>

#include "wire.h"

typedef struct pr__cql pr__cql_t;
typedef struct pr__cql_stmt pr__cql_stmt_t;

typedef struct pr__cql_conf {
  char **nodes; /* "host:port" */
  size_t nnodes;
  const char *user, *password;    /* NULL: no authentication */
  const char *datacenter;         /* prefer nodes here (NULL: any) */
  const char *rack;               /* ... and on this rack (NULL: any) */
  int64_t connect_timeout_ms;     /* default 5000 */
  int64_t request_timeout_ms;     /* default 12000 */
  uint16_t consistency;           /* default LOCAL_QUORUM */
  int ssl;                        /* TLS: verify the node and its host name */
  const char *ssl_ca;             /* CA file or directory (NULL: system's) */
  const char *ssl_cert, *ssl_key; /* client certificate (NULL: none) */
  const char *ssl_key_password;   /* of an encrypted ssl_key (NULL: none) */
} pr__cql_conf_t;

/* `res` is valid during the callback only; NULL on error. */
typedef void (*pr__cql_cb)(void *arg, prosody_err_t err, const char *errstr,
                           const pr__cql_result_t *res);

/* Starts connecting; requests may be issued at once (they wait for a
 * connection, within their timeout). NULL (errstr) on bad input. */
pr__cql_t *pr__cql_new(uv_loop_t *loop, const pr__cql_conf_t *conf,
                       char *errstr, size_t errstr_size);
/* Fails what is pending, closes the connections; the loop finishes
 * closing them (run it until it returns). */
void pr__cql_free(pr__cql_t *s);

/* A statement by its text, prepared on first use; owned by the session.
 * The one call that may run on any thread (a store opening on a running
 * session): its requests still go through the loop's thread. */
pr__cql_stmt_t *pr__cql_stmt(pr__cql_t *s, const char *query);

typedef struct pr__cql_opts {
  uint16_t consistency; /* 0: the session's */
  int32_t page_size;    /* 0: none */
  const uint8_t *paging_state;
  int32_t paging_len;
  uint16_t serial_consistency; /* lightweight transactions */
} pr__cql_opts_t;

/* Executes a prepared statement (values are copied). */
void pr__cql_execute_stmt(pr__cql_t *s, pr__cql_stmt_t *st,
                          const pr__cql_val_t *values, uint16_t n,
                          const pr__cql_opts_t *opts, pr__cql_cb cb, void *arg);
/* Runs a query string (schema changes, one-off queries). */
void pr__cql_run(pr__cql_t *s, const char *query, const pr__cql_val_t *values,
                 uint16_t n, const pr__cql_opts_t *opts, pr__cql_cb cb,
                 void *arg);

typedef struct pr__cql_bstmt {
  pr__cql_stmt_t *st;
  const pr__cql_val_t *values;
  uint16_t n;
} pr__cql_bstmt_t;
/* A batch of prepared statements (type PR_CQL_BATCH_LOGGED/UNLOGGED). */
void pr__cql_batch_run(pr__cql_t *s, uint8_t type, const pr__cql_bstmt_t *b,
                       uint16_t n, pr__cql_cb cb, void *arg);

/* The known nodes, "host:port dc/rack state; ...", into buf (for logs and
 * tests); the length it wanted. */
size_t pr__cql_describe(const pr__cql_t *s, char *buf, size_t size);

/* Blocks SIGPIPE on the calling thread for good (threads that run a
 * session's loop: a write to a closed connection must fail, not kill). */
void pr__cql_block_sigpipe(void);

/* ---- blocking use, on a private loop ------------------------------------ */

typedef struct pr__cql_sync pr__cql_sync_t;
pr__cql_sync_t *pr__cql_sync_new(const pr__cql_conf_t *conf, char *errstr,
                                 size_t errstr_size);
void pr__cql_sync_free(pr__cql_sync_t *y);
/* Runs a query (prepared when `prepare`); on success `*res` holds the
 * result (free with pr__cql_result_free; it owns a copy of the body). */
prosody_err_t pr__cql_sync_run(pr__cql_sync_t *y, const char *query,
                               const pr__cql_val_t *values, uint16_t n,
                               const pr__cql_opts_t *opts, int prepare,
                               pr__cql_result_t *res, char *errstr,
                               size_t errstr_size);

/* The session behind a blocking wrapper, for asynchronous calls, and a
 * loop runner: returns once *done is non-zero (or nothing is left to run). */
pr__cql_t *pr__cql_sync_session(pr__cql_sync_t *y);
void pr__cql_sync_wait(pr__cql_sync_t *y, const int *done);

/* ---- schema migrations ------------------------------------------------- */

/*
 * Brings `keyspace` to the original Prosody's schema (migrate.c): the
 * original's migration files (third_party/prosody-migrations), each applied
 * once and recorded in its bookkeeping (<keyspace>.schema_migrations with
 * SHA-256 checksums, the 'migration' row of <keyspace>.locks taken with a
 * lightweight transaction), so that the original and Prosody-C migrate one
 * keyspace in turn. Creates the keyspace if absent (SimpleStrategy,
 * replication factor 1: create it yourself for production replication).
 * Concurrent starts migrate once: the others wait for the lock, up to
 * `wait_ms` (PROSODY_ERR_TIMEOUT). Refused with PROSODY_ERR_PERMANENT, the
 * keyspace left unchanged: tables but no bookkeeping, bookkeeping of
 * another layout, a recorded file whose checksum differs from ours, or a
 * file newer than our newest (a newer release of the original). Returns
 * the number of the original's files applied in `*applied` (may be NULL).
 */
prosody_err_t pr__cql_migrate(pr__cql_sync_t *y, const char *keyspace,
                              int64_t wait_ms, int *applied, char *errstr,
                              size_t errstr_size);
/* How many of the original's migration files the library ships. */
size_t pr__cql_schema_count(void);
/* Test hook: migrate with the given files instead of the shipped ones. */
typedef struct pr__cql_schema_file {
  const char *name, *text;
} pr__cql_schema_file_t;
prosody_err_t pr__cql_migrate_files(pr__cql_sync_t *y, const char *keyspace,
                                    const pr__cql_schema_file_t *files,
                                    size_t n, int64_t wait_ms, int *applied,
                                    char *errstr, size_t errstr_size);

#endif /* PR_CQL_H */
