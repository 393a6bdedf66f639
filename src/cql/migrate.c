/*
 * migrate.c - schema migrations (see cql.h): keyspace, a migrations table,
 * a lock row taken with a lightweight transaction, and each shipped schema
 * file applied once, in name order, recorded with its checksum.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../util/util.h"
#include "cql.h"
#include "schema_files.h"

#define LOCK_TTL_S 120

/* FNV-1a 64 of the file as shipped, as 16 hex digits. Not pr__fnv1a: the
 * checksums of applied migrations are stored in Cassandra, and this one
 * has used an offset basis one digit short of FNV's since it first
 * shipped; changing it would fail every deployed keyspace's check. */
static void checksum(const char *text, char out[17]) {
  uint64_t h = 1469598103934665603ULL;
  for (const unsigned char *p = (const unsigned char *)text; *p; p++)
    h = (h ^ *p) * 1099511628211ULL;
  snprintf(out, 17, "%016llx", (unsigned long long)h);
}

/* Runs one statement, blocking. */
static prosody_err_t run(pr__cql_sync_t *y, const char *q,
                         const pr__cql_val_t *v, uint16_t n, uint16_t serial,
                         pr__cql_result_t *res, char *errstr,
                         size_t errstr_size) {
  pr__cql_opts_t o;
  memset(&o, 0, sizeof(o));
  o.serial_consistency = serial;
  return pr__cql_sync_run(y, q, v, n, &o, 0, res, errstr, errstr_size);
}

/* The file's statements with {keyspace} replaced, run one by one. */
static prosody_err_t apply_file(pr__cql_sync_t *y, const char *keyspace,
                                const pr__cql_schema_file_t *f, char *errstr,
                                size_t errstr_size) {
  /* {keyspace} (10 bytes) grows to strlen(keyspace): a safe bound. */
  size_t cap = strlen(f->text) * (strlen(keyspace) + 1) + 256, len = 0;
  char *stmt = malloc(cap);
  prosody_err_t err = PROSODY_OK;
  const char *p = f->text;
  char why[1024];
  if (!stmt) {
    pr__errf(errstr, errstr_size, "out of memory");
    return PROSODY_ERR_NOMEM;
  }
  while (*p && !err) {
    const char *eol = strchr(p, '\n');
    size_t n = eol ? (size_t)(eol - p) : strlen(p);
    const char *q = p;
    while (q < p + n && (*q == ' ' || *q == '\t'))
      q++;
    if (!(q + 1 < p + n && q[0] == '-' && q[1] == '-')) { /* not a comment */
      for (const char *c = p; c < p + n; c++) {
        if (!strncmp(c, "{keyspace}", 10)) {
          size_t kl = strlen(keyspace);
          memcpy(stmt + len, keyspace, kl);
          len += kl;
          c += 9;
        } else {
          stmt[len++] = *c;
        }
      }
      stmt[len++] = '\n';
      /* A statement ends with ';' at the end of a line. */
      while (len > 1 && (stmt[len - 2] == ' ' || stmt[len - 2] == '\r'))
        len--, stmt[len - 1] = '\n';
      if (len > 1 && stmt[len - 2] == ';') {
        stmt[len - 2] = '\0';
        err = run(y, stmt, NULL, 0, 0, NULL, why, sizeof(why));
        if (err)
          pr__errf(errstr, errstr_size, "schema file %s: %s", f->name, why);
        len = 0;
      }
    }
    p += n + (eol ? 1 : 0);
  }
  free(stmt);
  return err;
}

static void owner_id(char *buf, size_t n) {
  char host[64] = "host";
  struct timespec ts;
  gethostname(host, sizeof(host) - 1);
  clock_gettime(CLOCK_REALTIME, &ts);
  snprintf(buf, n, "%s/%d/%ld", host, (int)getpid(), (long)ts.tv_nsec);
}

/* Takes the lock row, waiting up to wait_ms. */
static prosody_err_t lock(pr__cql_sync_t *y, const char *ks, const char *me,
                          int64_t wait_ms, char *errstr, size_t errstr_size) {
  char q[256];
  int64_t deadline = pr__now_ns() + wait_ms * 1000000;
  pr__cql_val_t v = pr__cv_text(me);
  snprintf(q, sizeof(q),
           "INSERT INTO %s.schema_lock (id, owner) VALUES (1, ?) IF NOT "
           "EXISTS USING TTL %d",
           ks, LOCK_TTL_S);
  for (;;) {
    pr__cql_result_t res;
    int applied = 0;
    prosody_err_t err =
        run(y, q, &v, 1, PR_CQL_SERIAL, &res, errstr, errstr_size);
    if (err)
      return err;
    if (res.nrows >= 1 && res.ncols >= 1)
      pr__cql_get_bool(pr__cql_cell(&res, 0, 0), &applied);
    pr__cql_result_free(&res);
    if (applied)
      return PROSODY_OK;
    if (pr__now_ns() >= deadline) {
      pr__errf(errstr, errstr_size,
               "another instance holds the schema migration lock of "
               "keyspace %s; gave up after %lld ms (the lock expires %d s "
               "after it was taken)",
               ks, (long long)wait_ms, LOCK_TTL_S);
      return PROSODY_ERR_TIMEOUT;
    }
    usleep(250 * 1000); /* another instance migrates: poll its lock */
  }
}

prosody_err_t pr__cql_migrate_files(pr__cql_sync_t *y, const char *keyspace,
                                    const pr__cql_schema_file_t *files,
                                    size_t n, int64_t wait_ms, int *applied,
                                    char *errstr, size_t errstr_size) {
  char q[512], me[128], why[1024];
  prosody_err_t err;
  int done = 0;

  if (applied)
    *applied = 0;
  snprintf(q, sizeof(q),
           "CREATE KEYSPACE IF NOT EXISTS %s WITH replication = {'class': "
           "'SimpleStrategy', 'replication_factor': 1}",
           keyspace);
  if ((err = run(y, q, NULL, 0, 0, NULL, why, sizeof(why))))
    goto fail;
  snprintf(q, sizeof(q),
           "CREATE TABLE IF NOT EXISTS %s.schema_lock (id int PRIMARY KEY, "
           "owner text)",
           keyspace);
  if ((err = run(y, q, NULL, 0, 0, NULL, why, sizeof(why))))
    goto fail;
  snprintf(q, sizeof(q),
           "CREATE TABLE IF NOT EXISTS %s.schema_migrations (name text "
           "PRIMARY KEY, checksum text, applied_at timestamp)",
           keyspace);
  if ((err = run(y, q, NULL, 0, 0, NULL, why, sizeof(why))))
    goto fail;

  owner_id(me, sizeof(me));
  if ((err = lock(y, keyspace, me, wait_ms, why, sizeof(why))))
    goto fail;
  for (size_t i = 0; i < n && !err; i++) {
    pr__cql_result_t res;
    pr__cql_val_t v[3];
    char sum[17], recorded[64] = "";
    int found;
    checksum(files[i].text, sum);
    snprintf(q, sizeof(q),
             "SELECT checksum FROM %s.schema_migrations WHERE name = ?",
             keyspace);
    v[0] = pr__cv_text(files[i].name);
    if ((err = run(y, q, v, 1, 0, &res, why, sizeof(why))))
      break;
    found = res.nrows > 0;
    if (found)
      pr__cql_get_text(pr__cql_cell(&res, 0, 0), recorded, sizeof(recorded));
    pr__cql_result_free(&res);
    if (found) {
      if (strcmp(recorded, sum)) {
        err = PROSODY_ERR_PERMANENT;
        snprintf(why, sizeof(why),
                 "schema file %s changed after it was applied to keyspace "
                 "%s (checksum %s, recorded %s): add a new file instead of "
                 "editing an applied one",
                 files[i].name, keyspace, sum, recorded);
      }
      continue;
    }
    PR_INFO("cql", "applying schema file %s to keyspace %s", files[i].name,
            keyspace);
    if ((err = apply_file(y, keyspace, &files[i], why, sizeof(why))))
      break;
    snprintf(q, sizeof(q),
             "INSERT INTO %s.schema_migrations (name, checksum, applied_at) "
             "VALUES (?, ?, ?)",
             keyspace);
    v[1] = pr__cv_text(sum);
    v[2] = pr__cv_bigint(pr__wall_ms());
    if ((err = run(y, q, v, 3, 0, NULL, why, sizeof(why))))
      break;
    done++;
  }
  {
    char unlock_q[256], ignore[256];
    pr__cql_val_t v = pr__cv_text(me);
    snprintf(unlock_q, sizeof(unlock_q),
             "DELETE FROM %s.schema_lock WHERE id = 1 IF owner = ?", keyspace);
    run(y, unlock_q, &v, 1, PR_CQL_SERIAL, NULL, ignore, sizeof(ignore));
  }
  if (applied)
    *applied = done;
  if (!err)
    return PROSODY_OK;
fail:
  pr__errf(errstr, errstr_size, "migrating keyspace %s: %s", keyspace, why);
  return err;
}

size_t pr__cql_schema_count(void) {
  return sizeof(schema_files) / sizeof(schema_files[0]);
}

prosody_err_t pr__cql_migrate(pr__cql_sync_t *y, const char *keyspace,
                              int64_t wait_ms, int *applied, char *errstr,
                              size_t errstr_size) {
  pr__cql_schema_file_t files[sizeof(schema_files) / sizeof(schema_files[0])];
  size_t n = sizeof(schema_files) / sizeof(schema_files[0]);
  for (size_t i = 0; i < n; i++) {
    files[i].name = schema_files[i].name;
    files[i].text = schema_files[i].text;
  }
  return pr__cql_migrate_files(y, keyspace, files, n, wait_ms, applied, errstr,
                               errstr_size);
}
