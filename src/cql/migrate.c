/*
 * migrate.c - schema migrations (see cql.h) in the original Prosody's
 * bookkeeping, so that both implementations migrate one keyspace in turn.
 *
 * The files are the original's (third_party/prosody-migrations, applied in
 * file name order, which is their date order). The bookkeeping is its too:
 *  - <ks>.schema_migrations (filename text PRIMARY KEY, checksum text,
 *    applied_at timestamp, execution_time_ms bigint): one row per applied
 *    file; checksum is the lowercase hex SHA-256 of the file's text after
 *    the {{KEYSPACE}} and {{TABLE_*}} placeholders are filled in;
 *  - <ks>.locks (lock_name text PRIMARY KEY, owner_id uuid, acquired_at
 *    timestamp, expires_at timestamp, process_info text): the row
 *    'migration', taken with INSERT ... IF NOT EXISTS USING TTL 600 and
 *    released with DELETE ... IF owner_id = ?;
 *  - a file's statements are its lines, comment lines ("--") and blank
 *    lines left out, up to a line that ends with ';'.
 * Before it changes anything, the keyspace must be one we recognise: empty,
 * or with a schema_migrations table of that layout whose rows name files we
 * ship (same checksums) or retired files older than our newest. Anything
 * else is refused, naming the keyspace, what was found and what we support.
 */
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../util/util.h"
#include "cql.h"
#include "schema_files.h"

/* The original's lock row lives 10 minutes (its MIGRATION_LOCK_TIMEOUT). */
#define LOCK_TTL_S 600
#define LOCK_NAME "migration"
/* How long a table just created elsewhere may take to be served. */
#define SCHEMA_SETTLE_TRIES 30
#define SCHEMA_SETTLE_MS 100

/* The table names behind the files' placeholders (the original's). */
static const struct {
  const char *placeholder, *table;
} tables[] = {
    {"{{TABLE_SEGMENTS}}", "timer_segments"},
    {"{{TABLE_SLABS}}", "timer_slabs"},
    {"{{TABLE_KEYS}}", "timer_keys"},
    {"{{TABLE_TYPED_SLABS}}", "timer_typed_slabs"},
    {"{{TABLE_TYPED_KEYS}}", "timer_typed_keys"},
    {"{{TABLE_SCHEMA_MIGRATIONS}}", "schema_migrations"},
    {"{{TABLE_DEFERRED_SEGMENTS}}", "deferred_segments"},
    {"{{TABLE_DEFERRED_OFFSETS}}", "deferred_offsets"},
    {"{{TABLE_DEFERRED_TIMERS}}", "deferred_timers"},
    {"{{TABLE_DEDUPLICATION}}", "deduplication"},
    {"{{TABLE_KEYED_STATE_CELL}}", "keyed_state_cell"},
    {"{{TABLE_KEYED_STATE_IDENTITY}}", "keyed_state_identity"},
    {"{{TABLE_KEYED_STATE_PUBLICATION}}", "keyed_state_publication"},
    {"{{TABLE_PEER_DIRECTORY}}", "peer_directory"},
};

/* The file's text with its placeholders filled in (malloc'd), or NULL. */
static char *fill(const char *text, const char *keyspace) {
  size_t cap = strlen(text) * 2 + 64 * strlen(keyspace) + 1024, len = 0;
  char *out = malloc(cap);
  const char *p = text;
  if (!out)
    return NULL;
  while (*p) {
    const char *with = NULL;
    size_t skip = 0;
    if (p[0] == '{' && p[1] == '{') {
      if (!strncmp(p, "{{KEYSPACE}}", 12))
        with = keyspace, skip = 12;
      for (size_t i = 0; !with && i < sizeof(tables) / sizeof(tables[0]); i++)
        if (!strncmp(p, tables[i].placeholder, strlen(tables[i].placeholder)))
          with = tables[i].table, skip = strlen(tables[i].placeholder);
    }
    if (len + (with ? strlen(with) : 1) + 1 > cap) {
      char *grown = realloc(out, cap *= 2);
      if (!grown) {
        free(out);
        return NULL;
      }
      out = grown;
    }
    if (with) {
      memcpy(out + len, with, strlen(with));
      len += strlen(with);
      p += skip;
    } else {
      out[len++] = *p++;
    }
  }
  out[len] = '\0';
  return out;
}

/* Lowercase hex SHA-256 of `text`. */
static void checksum(const char *text, char out[65]) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_Digest(text, strlen(text), md, &n, EVP_sha256(), NULL);
  for (unsigned int i = 0; i < n && i < 32; i++)
    snprintf(out + 2 * i, 3, "%02x", md[i]);
}

/* Runs one statement, blocking. */
static prosody_err_t run(pr__cql_sync_t *y, const char *q,
                         const pr__cql_val_t *v, uint16_t n, uint16_t serial,
                         pr__cql_result_t *res, char *errstr,
                         size_t errstr_size) {
  pr__cql_opts_t o;
  prosody_err_t err;
  memset(&o, 0, sizeof(o));
  o.serial_consistency = serial;
  /* A table another instance has just created can be listed in
   * system_schema (or exist for CREATE ... IF NOT EXISTS) a moment before
   * the node serves it ("table ... does not exist", or a server error
   * "Unknown CF <table id>" while the node applies the new table):
   * instances starting together on a new keyspace meet that window, so it
   * is waited out for a few seconds. */
  for (int tries = 0;; tries++) {
    err = pr__cql_sync_run(y, q, v, n, &o, 0, res, errstr, errstr_size);
    if (!err || tries >= SCHEMA_SETTLE_TRIES ||
        (!strstr(errstr, "does not exist") && !strstr(errstr, "Unknown CF")))
      return err;
    usleep(SCHEMA_SETTLE_MS * 1000);
  }
}

/* Runs the filled-in file's statements one by one. */
static prosody_err_t apply_file(pr__cql_sync_t *y, const char *name,
                                const char *text, char *errstr,
                                size_t errstr_size) {
  size_t len = 0;
  char *stmt = malloc(strlen(text) + 2);
  prosody_err_t err = PROSODY_OK;
  const char *p = text;
  int index = 0;
  char why[1024];
  if (!stmt) {
    pr__errf(errstr, errstr_size, "out of memory");
    return PROSODY_ERR_NOMEM;
  }
  while (*p && !err) {
    const char *eol = strchr(p, '\n');
    size_t n = eol ? (size_t)(eol - p) : strlen(p);
    const char *b = p, *e = p + n;
    while (b < e && (*b == ' ' || *b == '\t' || *b == '\r'))
      b++;
    while (e > b && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r'))
      e--;
    if (b < e && !(e - b >= 2 && b[0] == '-' && b[1] == '-')) {
      memcpy(stmt + len, p, n);
      len += n;
      stmt[len++] = '\n';
      if (e[-1] == ';') {
        stmt[len] = '\0';
        index++;
        if ((err = run(y, stmt, NULL, 0, 0, NULL, why, sizeof(why))))
          pr__errf(errstr, errstr_size, "statement %d of %s: %s", index, name,
                   why);
        len = 0;
      }
    }
    p += n + (eol ? 1 : 0);
  }
  if (!err && len) { /* a last statement without ';' */
    stmt[len] = '\0';
    if ((err = run(y, stmt, NULL, 0, 0, NULL, why, sizeof(why))))
      pr__errf(errstr, errstr_size, "last statement of %s: %s", name, why);
  }
  free(stmt);
  return err;
}

/* The shipped file named `name`, or -1. */
static int find_file(const pr__cql_schema_file_t *files, size_t n,
                     const char *name) {
  for (size_t i = 0; i < n; i++)
    if (!strcmp(files[i].name, name))
      return (int)i;
  return -1;
}

/* Which files are applied (applied[i] = 1), after checking that the
 * keyspace is one we recognise. PROSODY_ERR_PERMANENT with `why` when not. */
static prosody_err_t read_applied(pr__cql_sync_t *y, const char *ks,
                                  const pr__cql_schema_file_t *files, size_t n,
                                  char *const *sums, int *applied, char *why,
                                  size_t why_size) {
  char q[256], name[256], sum[80];
  pr__cql_result_t res;
  pr__cql_val_t v = pr__cv_text(ks);
  prosody_err_t err;
  int has_migrations = 0, has_filename = 0, has_checksum = 0, other = 0;
  char other_name[256] = "";
  const char *newest = n ? files[n - 1].name : "";

  memset(applied, 0, n * sizeof(*applied));
  if ((err = run(y,
                 "SELECT table_name FROM system_schema.tables WHERE "
                 "keyspace_name = ?",
                 &v, 1, 0, &res, why, why_size)))
    return err;
  for (int32_t r = 0; r < res.nrows; r++) {
    if (pr__cql_get_text(pr__cql_cell(&res, r, 0), name, sizeof(name)))
      continue;
    if (!strcmp(name, "schema_migrations"))
      has_migrations = 1;
    else if (strcmp(name, "locks") && !other++)
      snprintf(other_name, sizeof(other_name), "%s", name);
  }
  pr__cql_result_free(&res);
  if (!has_migrations) {
    if (!other)
      return PROSODY_OK; /* new or empty: every file is pending */
    snprintf(why, why_size,
             "keyspace %s holds %d table(s) (%s, ...) but no "
             "schema_migrations table: a schema neither Prosody's nor "
             "Prosody-C's; it is left unchanged. Use another keyspace "
             "(cassandra_keyspace), or an empty one",
             ks, other, other_name);
    return PROSODY_ERR_PERMANENT;
  }
  if ((err = run(y,
                 "SELECT column_name FROM system_schema.columns WHERE "
                 "keyspace_name = ? AND table_name = 'schema_migrations'",
                 &v, 1, 0, &res, why, why_size)))
    return err;
  for (int32_t r = 0; r < res.nrows; r++) {
    if (pr__cql_get_text(pr__cql_cell(&res, r, 0), name, sizeof(name)))
      continue;
    has_filename |= !strcmp(name, "filename");
    has_checksum |= !strcmp(name, "checksum");
  }
  pr__cql_result_free(&res);
  if (!has_filename || !has_checksum) {
    snprintf(why, why_size,
             "keyspace %s has a schema_migrations table without the "
             "filename and checksum columns of Prosody's migrations (an "
             "unreleased Prosody-C layout, or another program's); it is "
             "left unchanged. Supported: Prosody's migrations up to %s. Use "
             "another keyspace (cassandra_keyspace), or drop this one",
             ks, newest);
    return PROSODY_ERR_PERMANENT;
  }
  snprintf(q, sizeof(q), "SELECT filename, checksum FROM %s.schema_migrations",
           ks);
  if ((err = run(y, q, NULL, 0, 0, &res, why, why_size)))
    return err;
  for (int32_t r = 0; r < res.nrows && !err; r++) {
    int i;
    if (pr__cql_get_text(pr__cql_cell(&res, r, 0), name, sizeof(name)))
      continue;
    if (pr__cql_get_text(pr__cql_cell(&res, r, 1), sum, sizeof(sum)))
      sum[0] = '\0';
    if ((i = find_file(files, n, name)) >= 0) {
      if (strcmp(sum, sums[i])) {
        snprintf(why, why_size,
                 "keyspace %s records migration %s with checksum %s, but "
                 "the file we ship has %s: the keyspace was migrated by a "
                 "version whose file differs; it is left unchanged",
                 ks, name, sum, sums[i]);
        err = PROSODY_ERR_PERMANENT;
      }
      applied[i] = 1;
    } else if (strncmp(name, newest, 8) > 0) {
      snprintf(why, why_size,
               "keyspace %s is at a newer schema than this version of "
               "Prosody-C supports: it records migration %s; we support "
               "Prosody's migrations up to %s (crate prosody 0.7.1, PyPI "
               "prosody-events 0.6.1). Upgrade Prosody-C, or use another "
               "keyspace",
               ks, name, newest);
      err = PROSODY_ERR_PERMANENT;
    } else {
      /* A file an earlier release of the original applied and later
       * replaced (as the original, we only note it). */
      PR_INFO("cql",
              "keyspace %s records migration %s, which we do not "
              "ship (a retired file of an earlier release)",
              ks, name);
    }
  }
  pr__cql_result_free(&res);
  return err;
}

/* Takes the 'migration' lock row, waiting up to wait_ms. */
static prosody_err_t lock(pr__cql_sync_t *y, const char *ks,
                          const uint8_t owner[16], int64_t wait_ms,
                          char *errstr, size_t errstr_size) {
  char q[256], info[128], host[64] = "unknown";
  int64_t deadline = pr__now_ns() + wait_ms * 1000000;
  gethostname(host, sizeof(host) - 1);
  snprintf(info, sizeof(info), "%s:%d", host, (int)getpid());
  snprintf(q, sizeof(q),
           "INSERT INTO %s.locks (lock_name, owner_id, acquired_at, "
           "expires_at, process_info) VALUES (?, ?, ?, ?, ?) IF NOT EXISTS "
           "USING TTL %d",
           ks, LOCK_TTL_S);
  for (;;) {
    pr__cql_result_t res;
    int64_t now = pr__wall_ms();
    pr__cql_val_t v[5] = {
        pr__cv_text(LOCK_NAME), pr__cv_uuid(owner), pr__cv_bigint(now),
        pr__cv_bigint(now + LOCK_TTL_S * 1000LL), pr__cv_text(info)};
    int applied = 0;
    prosody_err_t err =
        run(y, q, v, 5, PR_CQL_SERIAL, &res, errstr, errstr_size);
    if (err)
      return err;
    if (res.nrows >= 1 && res.ncols >= 1)
      pr__cql_get_bool(pr__cql_cell(&res, 0, 0), &applied);
    pr__cql_result_free(&res);
    if (applied)
      return PROSODY_OK;
    if (pr__now_ns() >= deadline) {
      pr__errf(errstr, errstr_size,
               "another instance (Prosody or Prosody-C) holds the schema "
               "migration lock of keyspace %s (row '%s' of %s.locks); gave "
               "up after %lld ms (the lock expires %d s after it was taken)",
               ks, LOCK_NAME, ks, (long long)wait_ms, LOCK_TTL_S);
      return PROSODY_ERR_TIMEOUT;
    }
    usleep(250 * 1000); /* another instance migrates: poll its lock */
  }
}

static void unlock(pr__cql_sync_t *y, const char *ks, const uint8_t owner[16]) {
  char q[256], ignore[256];
  pr__cql_val_t v[2] = {pr__cv_text(LOCK_NAME), pr__cv_uuid(owner)};
  snprintf(q, sizeof(q),
           "DELETE FROM %s.locks WHERE lock_name = ? IF owner_id = ?", ks);
  run(y, q, v, 2, PR_CQL_SERIAL, NULL, ignore, sizeof(ignore));
}

/* Creates the keyspace and the bookkeeping tables, as the original does. */
static prosody_err_t prepare(pr__cql_sync_t *y, const char *ks, char *why,
                             size_t why_size) {
  char q[512];
  prosody_err_t err;
  snprintf(q, sizeof(q),
           "CREATE KEYSPACE IF NOT EXISTS %s WITH replication = {'class': "
           "'SimpleStrategy', 'replication_factor': 1}",
           ks);
  if ((err = run(y, q, NULL, 0, 0, NULL, why, why_size)))
    return err;
  snprintf(q, sizeof(q),
           "CREATE TABLE IF NOT EXISTS %s.schema_migrations (filename text "
           "PRIMARY KEY, checksum text, applied_at timestamp, "
           "execution_time_ms bigint) WITH compression = {'class': "
           "'ZstdCompressor'} AND compaction = {'class': "
           "'UnifiedCompactionStrategy'}",
           ks);
  if ((err = run(y, q, NULL, 0, 0, NULL, why, why_size)))
    return err;
  snprintf(q, sizeof(q),
           "CREATE TABLE IF NOT EXISTS %s.locks (lock_name text PRIMARY KEY, "
           "owner_id uuid, acquired_at timestamp, expires_at timestamp, "
           "process_info text) WITH compression = {'class': "
           "'ZstdCompressor'}",
           ks);
  return run(y, q, NULL, 0, 0, NULL, why, why_size);
}

prosody_err_t pr__cql_migrate_files(pr__cql_sync_t *y, const char *keyspace,
                                    const pr__cql_schema_file_t *files,
                                    size_t n, int64_t wait_ms, int *applied,
                                    char *errstr, size_t errstr_size) {
  char q[512], why[1024];
  char **filled = calloc(n ? n : 1, sizeof(*filled));
  char **sums = calloc(n ? n : 1, sizeof(*sums));
  int *done = calloc(n ? n : 1, sizeof(*done));
  uint8_t owner[16];
  prosody_err_t err = PROSODY_OK;
  int pending = 0, locked = 0, count = 0;

  if (applied)
    *applied = 0;
  if (!filled || !sums || !done) {
    snprintf(why, sizeof(why), "out of memory");
    err = PROSODY_ERR_NOMEM;
    goto out;
  }
  for (size_t i = 0; i < n && !err; i++) {
    filled[i] = fill(files[i].text, keyspace);
    sums[i] = malloc(65);
    if (!filled[i] || !sums[i]) {
      snprintf(why, sizeof(why), "out of memory");
      err = PROSODY_ERR_NOMEM;
    } else {
      checksum(filled[i], sums[i]);
    }
  }
  if (err)
    goto out;
  /* Recognise before creating anything. */
  if ((err = read_applied(y, keyspace, files, n, sums, done, why, sizeof(why))))
    goto out;
  for (size_t i = 0; i < n; i++)
    pending += !done[i];
  if (!pending)
    goto out;
  if ((err = prepare(y, keyspace, why, sizeof(why))))
    goto out;
  if (RAND_bytes(owner, sizeof(owner)) != 1) {
    snprintf(why, sizeof(why), "no random bytes for the lock owner id");
    err = PROSODY_ERR_TRANSIENT;
    goto out;
  }
  owner[6] = (uint8_t)((owner[6] & 0x0f) | 0x40); /* version 4 */
  owner[8] = (uint8_t)((owner[8] & 0x3f) | 0x80); /* RFC 4122 variant */
  locked = 1; /* released even when taking it failed: a write whose answer
                 was lost may have taken it (the delete is ours only) */
  if ((err = lock(y, keyspace, owner, wait_ms, why, sizeof(why))))
    goto out;
  /* Another instance may have migrated while we waited for the lock. */
  if ((err = read_applied(y, keyspace, files, n, sums, done, why, sizeof(why))))
    goto out;
  snprintf(q, sizeof(q),
           "INSERT INTO %s.schema_migrations (filename, checksum, "
           "applied_at, execution_time_ms) VALUES (?, ?, ?, ?)",
           keyspace);
  for (size_t i = 0; i < n && !err; i++) {
    int64_t t0 = pr__now_ns();
    pr__cql_val_t v[4];
    if (done[i])
      continue;
    PR_INFO("cql", "applying migration %s to keyspace %s", files[i].name,
            keyspace);
    if ((err = apply_file(y, files[i].name, filled[i], why, sizeof(why))))
      break;
    v[0] = pr__cv_text(files[i].name);
    v[1] = pr__cv_text(sums[i]);
    v[2] = pr__cv_bigint(pr__wall_ms());
    v[3] = pr__cv_bigint((pr__now_ns() - t0) / 1000000);
    if ((err = run(y, q, v, 4, 0, NULL, why, sizeof(why))))
      break;
    count++;
  }
out:
  if (locked)
    unlock(y, keyspace, owner);
  if (applied)
    *applied = count;
  for (size_t i = 0; filled && sums && i < n; i++)
    free(filled[i]), free(sums[i]);
  free(filled);
  free(sums);
  free(done);
  if (!err)
    return PROSODY_OK;
  pr__errf(errstr, errstr_size, "migrating keyspace %s: %s", keyspace, why);
  return err;
}

/* The shipped files of a generated array (it ends with a {0, 0} entry). */
#define SHIPPED(a) (sizeof(a) / sizeof((a)[0]) - 1)

size_t pr__cql_schema_count(void) { return SHIPPED(schema_files); }

prosody_err_t pr__cql_migrate(pr__cql_sync_t *y, const char *keyspace,
                              int64_t wait_ms, int *applied, char *errstr,
                              size_t errstr_size) {
  pr__cql_schema_file_t files[sizeof(schema_files) / sizeof(schema_files[0])];
  size_t n = SHIPPED(schema_files);
  for (size_t i = 0; i < n; i++) {
    files[i].name = schema_files[i].name;
    files[i].text = schema_files[i].text;
  }
  return pr__cql_migrate_files(y, keyspace, files, n, wait_ms, applied, errstr,
                               errstr_size);
}
