/*
 * timers_open.c - opens an owner's one Cassandra session (its keyspace
 * migrated first), which all its stores share, and picks and opens the
 * timer store a consumer's settings ask for: memory in mock mode (or when
 * the handler cannot use timers), else Cassandra on that session.
 *
 * Threads: the subscribing thread (blocking: the migration runs on a
 * private loop).
 */
#include <string.h>

#include "../config/config.h"
#include "../cql/cql.h"
#include "../cql/worker.h"
#include "../timers/timers.h"
#include "../util/util.h"

pr__cql_conf_t pr__cql_conf_of(const pr__settings_t *st) {
  pr__cql_conf_t c;
  memset(&c, 0, sizeof(c));
  c.nodes = PR_CFG(st, CASSANDRA_NODES).list;
  c.nnodes = PR_CFG(st, CASSANDRA_NODES).list_n;
  c.user = PR_CFG_STR(st, CASSANDRA_USER);
  c.password = PR_CFG_STR(st, CASSANDRA_PASSWORD);
  c.datacenter = PR_CFG_STR(st, CASSANDRA_DATACENTER);
  c.rack = PR_CFG_STR(st, CASSANDRA_RACK);
  c.ssl = PR_CFG_BOOL(st, CASSANDRA_SSL);
  c.ssl_ca = PR_CFG_STR(st, CASSANDRA_SSL_CA_LOCATION);
  c.ssl_cert = PR_CFG_STR(st, CASSANDRA_SSL_CERTIFICATE_LOCATION);
  c.ssl_key = PR_CFG_STR(st, CASSANDRA_SSL_KEY_LOCATION);
  c.ssl_key_password = PR_CFG_STR(st, CASSANDRA_SSL_KEY_PASSWORD);
  return c;
}

/* Cassandra is required, and its keyspace is migrated before the
 * consumer starts. */
prosody_err_t pr__cql_keyspace_ready(const pr__settings_t *st, char *errstr,
                                     size_t errstr_size) {
  pr__cql_conf_t c = pr__cql_conf_of(st);
  pr__cql_sync_t *y;
  char why[1024];
  prosody_err_t err;
  if (!PR_CFG_SET(st, CASSANDRA_NODES) || !c.nnodes) {
    pr__errf(errstr, errstr_size,
             "cassandra_nodes (PROSODY_CASSANDRA_NODES) is required to consume "
             "unless mock is true: timers are stored in Cassandra; give "
             "host:port[,host:port...]");
    return PROSODY_ERR_CONFIG;
  }
  if (!(y = pr__cql_sync_new(&c, why, sizeof(why)))) {
    pr__errf(errstr, errstr_size, "Cassandra: %s", why);
    return PROSODY_ERR_TRANSIENT;
  }
  err = pr__cql_migrate(y, PR_CFG_STR(st, CASSANDRA_KEYSPACE), 60000, NULL, why,
                        sizeof(why));
  pr__cql_sync_free(y);
  if (err) {
    pr__errf(errstr, errstr_size, "Cassandra (cassandra_nodes %s): %s",
             PR_CFG(st, CASSANDRA_NODES).list[0], why);
    return err == PROSODY_ERR_CONFIG ? err : PROSODY_ERR_TRANSIENT;
  }
  return PROSODY_OK;
}

prosody_err_t pr__cql_shared_open(pr__cql_shared_t *sh,
                                  const pr__settings_t *st, char *errstr,
                                  size_t errstr_size) {
  pr__cql_conf_t c;
  prosody_err_t err;
  pr__cqlw_t *w;
  if (sh->w)
    return PROSODY_OK;
  if ((err = pr__cql_keyspace_ready(st, errstr, errstr_size)))
    return err;
  c = pr__cql_conf_of(st);
  if (!(w = pr__cqlw_new(&c, sh->wake, sh->wake_arg, errstr, errstr_size)))
    return PROSODY_ERR_TRANSIENT;
  if (pr__cqlw_start(w, errstr, errstr_size)) {
    pr__cqlw_free(w);
    return PROSODY_ERR_NOMEM;
  }
  sh->w = w;
  return PROSODY_OK;
}

prosody_err_t pr__tstore_open(const pr__settings_t *st, int uses_timers,
                              int64_t slab_s, pr__cql_shared_t *sh,
                              pr__tstore_t **out, char *errstr,
                              size_t errstr_size) {
  prosody_err_t err;
  *out = NULL;
  if (PR_CFG_BOOL(st, MOCK) || !uses_timers || st->test.memory_timers) {
    if (!(*out = pr__memstore_new())) {
      pr__errf(errstr, errstr_size, "out of memory");
      return PROSODY_ERR_NOMEM;
    }
    return PROSODY_OK;
  }
  if ((err = pr__cql_shared_open(sh, st, errstr, errstr_size)))
    return err;
  *out = pr__cqlstore_new(sh->w, PR_CFG_STR(st, CASSANDRA_KEYSPACE),
                          PR_CFG_STR(st, GROUP_ID), slab_s,
                          PR_CFG_NS(st, CASSANDRA_RETENTION) / 1000000000,
                          errstr, errstr_size);
  return *out ? PROSODY_OK : PROSODY_ERR_TRANSIENT;
}
