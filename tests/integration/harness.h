/*
 * harness.h - shared helpers for the integration tests.
 *
 * A program holds scenarios, each one behaviour, defined with T_SCENARIO and
 * run one per process by harness.c's main(): `prog NAME` runs one, `prog
 * --list` prints them for tests/CMakeLists.txt, which registers each as its
 * own ctest entry per tier (mock.PROG.NAME, real.PROG.NAME), `prog` alone
 * runs them all in turn. A scenario makes its own topics, groups and
 * keyspace rows, so entries run alone and side by side (ctest -j).
 *
 * Every scenario runs against the embedded mock cluster by default, or
 * against a real broker when PROSODY_TEST_REAL=1 (the `real` tier; the
 * broker is PROSODY_TEST_BOOTSTRAP, by default 127.0.0.1:9094). In the mock
 * tier a new group is assigned at once, as on the real tier's broker
 * (unless T_GROUP_WAIT). Records are
 * read back with a plain librdkafka consumer using assign() (no group), so no
 * test waits on a rebalance. Assertions run on the test's main thread only;
 * failures print what did not happen and exit 1.
 */
#ifndef PR_TEST_HARNESS_H
#define PR_TEST_HARNESS_H

#include <arpa/inet.h>
#include <librdkafka/rdkafka.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "prosody.h"

/* The tiers a scenario is registered in. */
#define T_MOCK 1u /* the embedded mock cluster */
#define T_REAL 2u /* real Kafka (and Cassandra, Jaeger) */
#define T_BOTH (T_MOCK | T_REAL)
#define T_CLUSTER 4u /* the three-broker cluster (make test-cluster) */
/* A flag beside the tiers: in the mock tier, keep the mock cluster's 3 s
 * wait for more members before a new group's first assignment. Without it
 * harness.c sets the wait to 0, as the real tier's broker has it
 * (group.initial.rebalance.delay.ms=0): a lone member is assigned at once;
 * a member joining a group already assigned waits for a rebalance, which
 * the mock runs 5 s later. For scenarios about the wait itself, or whose
 * members start together and gain from sharing the first assignment. */
#define T_GROUP_WAIT 8u

/* What a scenario returns when its tier lacks what it needs (ctest's
 * SKIP_RETURN_CODE). */
#define T_SKIP 77

typedef struct t_scenario {
  const char *name;        /* what it checks, as in the ctest name */
  int (*run)(void);        /* 0 passed, T_SKIP; a failed CHECK exits 1 */
  unsigned tiers;          /* T_MOCK, T_REAL, T_BOTH or T_CLUSTER, and
                              T_GROUP_WAIT */
  int timeout;             /* seconds, ctest's TIMEOUT for the entry */
  struct t_scenario *next; /* harness.c's list, in definition order */
} t_scenario_t;

/* harness.c: adds a scenario (T_SCENARIO does, before main()). */
void t_scenario_add(t_scenario_t *s);

/* harness.c: `prog --child ARGS...` calls fn(argc, argv) instead of a
 * scenario (T_CHILD does), for programs that start members of their own. */
void t_child_set(int (*fn)(int argc, char **argv));

/* Defines scenario NAME, registered in TIERS with TIMEOUT seconds:
 *   T_SCENARIO(key_order_held, T_BOTH, 120) { ...; return 0; } */
#define T_SCENARIO(name_, tiers_, timeout_)                                    \
  static int t_run_##name_(void);                                              \
  static t_scenario_t t_sc_##name_ = {#name_, t_run_##name_, tiers_, timeout_, \
                                      NULL};                                   \
  __attribute__((constructor)) static void t_add_##name_(void) {               \
    t_scenario_add(&t_sc_##name_);                                             \
  }                                                                            \
  static int t_run_##name_(void)

/* harness.c: starts this program again as `prog --child ARGS...` (its
 * T_CHILD function; `args` ends with NULL), killed if this process dies,
 * its standard output into a pipe whose read end goes to *out (read it
 * with t_read_line()). Returns the child's pid. */
pid_t t_spawn_child(const char *const *args, int *out);

/* The function `prog --child ...` runs. */
#define T_CHILD(fn_)                                                           \
  __attribute__((constructor)) static void t_child_##fn_(void) {               \
    t_child_set(fn_);                                                          \
  }

#define CHECK(cond, ...)                                                       \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                            \
      fprintf(stderr, "\n");                                                   \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

#define CHECK_OK(expr, err)                                                    \
  do {                                                                         \
    prosody_err_t e_ = (expr);                                                 \
    CHECK(e_ == PROSODY_OK, "%s: %s", prosody_err_name(e_), err);              \
  } while (0)

static inline double t_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* The wall clock in milliseconds since the epoch (timer times). */
static inline int64_t t_wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* `v[0..n)` minus `base`, comma-separated ("0,1,6"), into out[size]. */
static inline void t_offsets_text(const int64_t *v, size_t n, int64_t base,
                                  char *out, size_t size) {
  size_t at = 0;
  out[0] = '\0';
  for (size_t i = 0; i < n && at < size; i++)
    at += (size_t)snprintf(out + at, size - at, "%s%lld", i ? "," : "",
                           (long long)(v[i] - base));
}

/* The monotonic clock in nanoseconds. */
static inline int64_t t_mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Waits, holding `mu`, until `cond_expr` (read under `mu`) or `seconds`
 * pass: `cv` is signalled by whoever changes what cond_expr reads, and
 * each wait is bounded (50 ms), so a missed signal costs 50 ms at most. */
#define T_WAIT_UNTIL(cond_expr, cv, mu, seconds)                               \
  do {                                                                         \
    double d_ = t_now() + (seconds);                                           \
    while (!(cond_expr) && t_now() < d_) {                                     \
      struct timespec ts_;                                                     \
      clock_gettime(CLOCK_REALTIME, &ts_);                                     \
      ts_.tv_nsec += 50 * 1000000;                                             \
      if (ts_.tv_nsec >= 1000000000) {                                         \
        ts_.tv_sec++;                                                          \
        ts_.tv_nsec -= 1000000000;                                             \
      }                                                                        \
      pthread_cond_timedwait((cv), (mu), &ts_);                                \
    }                                                                          \
  } while (0)

/* Waits until *v >= want or `seconds` pass; 1 if reached. */
static inline int t_wait_at_least(atomic_int *v, int want, double seconds) {
  double deadline = t_now() + seconds;
  while (atomic_load(v) < want && t_now() < deadline)
    usleep(5000);
  return atomic_load(v) >= want;
}

/* Reads a child process's output line by line: waits up to 100 ms for a
 * byte; returns 1 when `line` holds a whole line (NUL-terminated, without
 * the newline), 0 when none is complete yet, -1 at end of file. `*len`
 * keeps the partial line between calls. */
/* *v read under `mu` (a counter that handlers raise holding `mu`). */
static inline int t_locked_int(pthread_mutex_t *mu, const int *v) {
  int n;
  pthread_mutex_lock(mu);
  n = *v;
  pthread_mutex_unlock(mu);
  return n;
}

/* Waits until *v (read under `mu`) reaches `want`, or `seconds` pass;
 * returns the last reading. */
static inline int t_wait_locked(pthread_mutex_t *mu, const int *v, int want,
                                double seconds) {
  double deadline = t_now() + seconds;
  int n;
  while ((n = t_locked_int(mu, v)) < want && t_now() < deadline)
    usleep(10000);
  return n;
}

static inline int t_read_line(int fd, char *line, size_t size, size_t *len) {
  struct pollfd p = {fd, POLLIN, 0};
  char c;
  if (poll(&p, 1, 100) <= 0)
    return 0;
  if (read(fd, &c, 1) != 1)
    return -1;
  if (c != '\n') {
    if (*len < size - 1)
      line[(*len)++] = c;
    return 0;
  }
  line[*len] = '\0';
  *len = 0;
  return 1;
}

/* The real broker's address, or NULL for the mock cluster. The `real`
 * tier sets PROSODY_TEST_REAL=1 (default address 127.0.0.1:9094);
 * PROSODY_TEST_BOOTSTRAP points it at another broker. */
static inline const char *t_real_bootstrap(void) {
  const char *b = getenv("PROSODY_TEST_BOOTSTRAP");
  const char *real = getenv("PROSODY_TEST_REAL");
  if (!real || strcmp(real, "1"))
    return NULL;
  return b && *b ? b : "127.0.0.1:9094";
}

/* Set in a child process of the mock tier: the address of its parent's
 * embedded mock cluster, which t_config() and t_bootstrap() then join
 * instead of starting a cluster of their own. */
static const char *t_mock_address;

/* The address a plain librdkafka client should use. */
static inline const char *t_bootstrap(void) {
  static char buf[256];
  char err[512];
  if (t_real_bootstrap())
    return t_real_bootstrap();
  if (t_mock_address)
    return t_mock_address;
  CHECK(prosody_mock_bootstrap_servers(buf, sizeof(buf), err, sizeof(err)) ==
            PROSODY_OK,
        "mock cluster: %s", err);
  return buf;
}

static int t_send_failures;
static inline void t_ignore_cb(prosody_err_t err, const char *errstr,
                               const prosody_delivery_t *d, void *opaque) {
  if (err) {
    __atomic_add_fetch(&t_send_failures, 1, __ATOMIC_SEQ_CST);
    fprintf(stderr, "send failed: %s\n", errstr);
  }
}

/* A configuration pointing at the broker under test. */
static inline prosody_config_t *t_config(void) {
  char err[1024];
  prosody_config_t *conf = prosody_config_new();
  CHECK(conf, "out of memory");
  if (t_real_bootstrap() || t_mock_address)
    CHECK_OK(prosody_config_set(conf, "bootstrap_servers", t_bootstrap(), err,
                                sizeof(err)),
             err);
  else
    CHECK_OK(prosody_config_set(conf, "mock", "true", err, sizeof(err)), err);
  CHECK_OK(prosody_config_set(conf, "send_timeout", "30s", err, sizeof(err)),
           err);
  return conf;
}

static inline void t_set(prosody_config_t *conf, const char *k, const char *v) {
  char err[1024];
  CHECK_OK(prosody_config_set(conf, k, v, err, sizeof(err)), err);
}

/* A topic name no other test (or earlier run) uses. */
static inline const char *t_topic(const char *prefix) {
  static char buf[4][128];
  static int n;
  struct timespec ts;
  char *out = buf[n++ % 4];
  clock_gettime(CLOCK_REALTIME, &ts);
  snprintf(out, 128, "%s-%d-%ld-%d", prefix, (int)getpid(),
           (long)(ts.tv_nsec / 1000), n);
  return out;
}

static inline void t_create_topic_rf(const char *topic, int partitions,
                                     int replicas) {
  char err[1024];
  prosody_topic_options_t o = PROSODY_TOPIC_OPTIONS_INIT;
  prosody_admin_t *admin = prosody_admin_new(t_config(), err, sizeof(err));
  CHECK(admin, "admin: %s", err);
  o.partitions = partitions;
  o.replication_factor = (int16_t)replicas;
  CHECK_OK(prosody_admin_create_topic(admin, topic, &o, err, sizeof(err)), err);
  prosody_admin_destroy(admin);
}

static inline void t_create_topic(const char *topic, int partitions) {
  t_create_topic_rf(topic, partitions, 1);
}

/* One record read back. */
typedef struct t_record {
  char *key, *value;
  int32_t partition;
  int64_t offset;
  rd_kafka_headers_t *headers;
} t_record_t;

/* The value of header `name`, or NULL (points into the record). */
static inline const char *t_header(const t_record_t *r, const char *name,
                                   char *buf, size_t n) {
  const void *v;
  size_t len;
  if (!r->headers || rd_kafka_header_get_last(r->headers, name, &v, &len) != 0)
    return NULL;
  snprintf(buf, n, "%.*s", (int)len, (const char *)v);
  return buf;
}

static inline int t_partition_count(rd_kafka_t *rk, const char *topic) {
  const struct rd_kafka_metadata *md;
  int n = -1;
  if (rd_kafka_metadata(rk, 1, NULL, &md, 10000))
    return -1;
  for (int i = 0; i < md->topic_cnt; i++)
    if (!strcmp(md->topics[i].topic, topic) && !md->topics[i].err)
      n = md->topics[i].partition_cnt;
  rd_kafka_metadata_destroy(md);
  return n;
}

/* Reads `want` records of `topic` from the beginning of every partition,
 * waiting at most `timeout_s`. Returns how many were read. */
static inline int t_read_back(const char *topic, int want, double timeout_s,
                              t_record_t *out) {
  char err[512];
  rd_kafka_conf_t *kc = rd_kafka_conf_new();
  rd_kafka_t *rk;
  rd_kafka_topic_partition_list_t *parts;
  int got = 0, np;
  double deadline = t_now() + timeout_s;

  rd_kafka_conf_set(kc, "bootstrap.servers", t_bootstrap(), err, sizeof(err));
  rd_kafka_conf_set(kc, "group.id", "prosody-test-reader", err, sizeof(err));
  rd_kafka_conf_set(kc, "enable.auto.commit", "false", err, sizeof(err));
  rd_kafka_conf_set(kc, "broker.address.family", "v4", err, sizeof(err));
  /* The mock answers a Fetch that finds nothing only when its wait is over,
   * even when a record arrives meanwhile (libprosody's consumers in mock
   * mode wait as little: PR_KAFKA_MOCK_FETCH_WAIT_MS). */
  if (!t_real_bootstrap())
    rd_kafka_conf_set(kc, "fetch.wait.max.ms", "20", err, sizeof(err));
  rk = rd_kafka_new(RD_KAFKA_CONSUMER, kc, err, sizeof(err));
  CHECK(rk, "reader: %s", err);
  np = t_partition_count(rk, topic);
  CHECK(np > 0, "topic %s not in metadata", topic);
  parts = rd_kafka_topic_partition_list_new(np);
  for (int p = 0; p < np; p++)
    rd_kafka_topic_partition_list_add(parts, topic, p)->offset =
        RD_KAFKA_OFFSET_BEGINNING;
  CHECK(!rd_kafka_assign(rk, parts), "assign failed");
  rd_kafka_topic_partition_list_destroy(parts);
  while (got < want && t_now() < deadline) {
    rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
    if (!m)
      continue;
    if (!m->err) {
      t_record_t *r = &out[got++];
      r->key = strndup(m->key ? (const char *)m->key : "", m->key_len);
      r->value = strndup(m->payload ? (const char *)m->payload : "", m->len);
      r->partition = m->partition;
      r->offset = m->offset;
      r->headers = NULL;
      rd_kafka_message_detach_headers(m, &r->headers);
    }
    rd_kafka_message_destroy(m);
  }
  rd_kafka_consumer_close(rk);
  rd_kafka_destroy(rk);
  return got;
}

static inline void t_records_free(t_record_t *r, int n) {
  for (int i = 0; i < n; i++) {
    free(r[i].key);
    free(r[i].value);
    if (r[i].headers)
      rd_kafka_headers_destroy(r[i].headers);
  }
}

/* Sends records i = from..to-1 as {"k":keys[i],"seq":i} with key
 * "key-<keys[i]>" and waits for every acknowledgement. */
static inline void t_produce_keyed(const char *topic, int from, int to,
                                   const int *keys) {
  char err[1024], key[32], payload[96];
  prosody_config_t *conf = t_config();
  prosody_client_t *client;
  t_set(conf, "source_system", "test-producer");
  client = prosody_client_new(conf, err, sizeof(err));
  CHECK(client, "producer: %s", err);
  for (int i = from; i < to; i++) {
    snprintf(key, sizeof(key), "key-%d", keys[i]);
    snprintf(payload, sizeof(payload), "{\"k\":%d,\"seq\":%d}", keys[i], i);
    CHECK_OK(prosody_send_async(client, topic, key, payload, NULL, t_ignore_cb,
                                NULL, err, sizeof(err)),
             err);
  }
  prosody_client_destroy(client);
  CHECK(t_send_failures == 0, "%d sends failed", t_send_failures);
}

/* t_produce_keyed() with key i % keys. */
static inline void t_produce(const char *topic, int from, int to, int keys) {
  int *k = malloc((size_t)to * sizeof(int));
  CHECK(k, "out of memory");
  for (int i = 0; i < to; i++)
    k[i] = i % keys;
  t_produce_keyed(topic, from, to, k);
  free(k);
}

/* The real tier's Cassandra node: PROSODY_TEST_CASSANDRA_NODES, by default
 * 127.0.0.1:9042. */
static inline const char *t_cassandra_nodes(void) {
  const char *n = getenv("PROSODY_TEST_CASSANDRA_NODES");
  return n && *n ? n : "127.0.0.1:9042";
}

/* The keyspace of the real tier's consumers and store tests. */
#define T_KEYSPACE "prosody_test"

/* A consumer configuration: the broker under test, a fresh group, topics. */
static inline prosody_config_t *t_consumer_config(const char *group,
                                                  const char *topics) {
  prosody_config_t *conf = t_config();
  t_set(conf, "group_id", group);
  t_set(conf, "subscribed_topics", topics);
  t_set(conf, "probe_port", "none");
  t_set(conf, "commit_interval", "100ms");
  t_set(conf, "poll_interval", "20ms");
  if (t_real_bootstrap()) { /* consumers keep timers in real Cassandra */
    t_set(conf, "cassandra_nodes", t_cassandra_nodes());
    t_set(conf, "cassandra_keyspace", T_KEYSPACE);
  }
  return conf;
}

/* The group's committed offset for each partition of `topic` (out[p]), and
 * the end offset (end[p]). Returns the partition count. */
static inline int t_committed(const char *group, const char *topic,
                              int64_t *out, int64_t *end) {
  char err[512];
  rd_kafka_conf_t *kc = rd_kafka_conf_new();
  rd_kafka_t *rk;
  rd_kafka_topic_partition_list_t *parts;
  int np;
  rd_kafka_conf_set(kc, "bootstrap.servers", t_bootstrap(), err, sizeof(err));
  rd_kafka_conf_set(kc, "group.id", group, err, sizeof(err));
  rd_kafka_conf_set(kc, "enable.auto.commit", "false", err, sizeof(err));
  rk = rd_kafka_new(RD_KAFKA_CONSUMER, kc, err, sizeof(err));
  CHECK(rk, "reader: %s", err);
  np = t_partition_count(rk, topic);
  parts = rd_kafka_topic_partition_list_new(np);
  for (int p = 0; p < np; p++)
    rd_kafka_topic_partition_list_add(parts, topic, p);
  CHECK(!rd_kafka_committed(rk, parts, 10000), "committed() failed");
  for (int p = 0; p < np; p++) {
    int64_t lo, hi;
    out[p] = parts->elems[p].offset;
    CHECK(!rd_kafka_query_watermark_offsets(rk, topic, p, &lo, &hi, 10000),
          "watermarks");
    end[p] = hi;
  }
  rd_kafka_topic_partition_list_destroy(parts);
  rd_kafka_destroy(rk);
  return np;
}

/* Waits up to `seconds` until the group's committed offset equals the end
 * offset on every partition of `topic` whose bit is set in `mask` (~0u:
 * all); 1 if so. committed[] and end[] hold the last reading. */
static inline int t_wait_committed(const char *group, const char *topic,
                                   unsigned mask, int64_t *committed,
                                   int64_t *end, double seconds) {
  double deadline = t_now() + seconds;
  for (;;) {
    int np, done = 1;
    usleep(100000);
    np = t_committed(group, topic, committed, end);
    for (int p = 0; p < np; p++)
      if (p >= 32 || (mask >> p & 1u))
        done &= committed[p] == end[p];
    if (done || t_now() >= deadline)
      return done;
  }
}

/* GET path on 127.0.0.1:port; returns the status, body in `body`. */
static inline int t_http_get(int port, const char *path, char *body, size_t n) {
  struct sockaddr_in a = {0};
  char req[256], resp[32768];
  size_t got = 0;
  ssize_t r;
  int fd = socket(AF_INET, SOCK_STREAM, 0), status = -1;
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&a, sizeof(a))) {
    close(fd);
    return -1;
  }
  snprintf(req, sizeof(req),
           "GET %s HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
           path);
  CHECK(write(fd, req, strlen(req)) == (ssize_t)strlen(req), "write");
  while ((r = read(fd, resp + got, sizeof(resp) - 1 - got)) > 0)
    got += (size_t)r;
  resp[got] = '\0';
  close(fd);
  sscanf(resp, "HTTP/1.%*d %d", &status);
  {
    const char *b = strstr(resp, "\r\n\r\n");
    snprintf(body, n, "%s", b ? b + 4 : "");
  }
  return status;
}

/* The value of metric `name` (no labels) in the client's /metrics on
 * `port`, or -1 when it is absent. */
static inline long long t_metric(int port, const char *name) {
  char body[32768];
  const char *p;
  size_t n = strlen(name);
  CHECK(t_http_get(port, "/metrics", body, sizeof(body)) == 200, "/metrics");
  for (p = body; (p = strstr(p, name)); p++)
    if ((p == body || p[-1] == '\n') && p[n] == ' ')
      return atoll(p + n + 1);
  return -1;
}

#ifdef PROSODY_TEST_INTERNAL
/* White-box programs (tests/CMakeLists.txt: INTERNAL) also get the store
 * tests' Cassandra set-up. */
#include "cql/cql.h"
#include "cql/worker.h"

/* `conf` pointing at t_cassandra_nodes() (`*node` holds the address). */
static inline void t_cql_conf(pr__cql_conf_t *conf, char **node) {
  *node = (char *)t_cassandra_nodes();
  memset(conf, 0, sizeof(*conf));
  conf->nodes = node;
  conf->nnodes = 1;
}

/* Brings T_KEYSPACE's tables up to date (the real tier; the mock has no
 * Cassandra). */
static inline void t_cql_migrate(const pr__cql_conf_t *conf) {
  char err[1024];
  pr__cql_sync_t *y;
  CHECK(t_real_bootstrap(), "needs the real tier (Cassandra)");
  y = pr__cql_sync_new(conf, err, sizeof(err));
  CHECK(y, "%s", err);
  CHECK_OK(pr__cql_migrate(y, T_KEYSPACE, 60000, NULL, err, sizeof(err)), err);
  pr__cql_sync_free(y);
}

/* A store on a session of its own, which the store then holds alone (its
 * destroy stops it): `make` makes the store on `w` (NULL and errstr on
 * failure). */
#define T_LONE_STORE(conf, wake, wake_arg, err, make)                          \
  __extension__({                                                              \
    pr__cqlw_t *w =                                                            \
        pr__cqlw_new((conf), (wake), (wake_arg), (err), sizeof(err));          \
    CHECK(w && !pr__cqlw_start(w, (err), sizeof(err)), "%s", (err));           \
    __typeof__(make) t_store_ = (make);                                        \
    pr__cqlw_free(w);                                                          \
    t_store_;                                                                  \
  })
#endif

#endif /* PR_TEST_HARNESS_H */
