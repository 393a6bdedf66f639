/*
 * test_security.c - Kafka over TLS and SASL (real tier only), against the
 * secured listeners of scripts/services/kafka (test material made at its
 * start in <run>/kafka/tls):
 *  - SASL_SSL with PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512: the admin client
 *    creates a topic and the producer sends to it;
 *  - a consumer over SCRAM-SHA-512 handles every record, with deferred
 *    retries reloaded from Kafka (defer_cache_size 1: the defer loader's
 *    own handle) and telemetry on (its producer), and a timer, with its
 *    timers and deferrals in Cassandra over TLS (cassandra_ssl; the
 *    service's port takes TLS and plaintext alike);
 *  - Cassandra's certificate refused (unknown CA, host name mismatch):
 *    subscribe fails naming the node and the cause;
 *  - mutual TLS with an encrypted client key (kafka_ssl_key_password);
 *  - a Cassandra client certificate with an encrypted key: it opens with
 *    cassandra_ssl_key_password; without it, or with a wrong one, subscribe
 *    fails naming the key option (and never prompts on a terminal);
 *  - failures: a wrong password, an unknown CA, an expired certificate, a
 *    host name mismatch, a plaintext client on the TLS port, no client
 *    certificate where one is required. Each send fails within
 *    send_timeout (10 s) with an error naming the broker and the cause;
 *    the connection attempts in those 10 s are counted (printed, and
 *    bounded: a tight reconnect loop would make thousands).
 * No secret value (passwords, key password) appears in any log line or
 * error of the whole run.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <sys/stat.h>

#include "harness.h"

#define N_RECORDS 20
#define SCRAM_SECRET "scram-secret"
#define PLAIN_SECRET "plain-secret"
#define KEY_SECRET "client-key-secret"
#define WRONG_SECRET "Wrong-Secret-7731"

static char tls_dir[512], sasl_bootstrap[128], cass_ca[600], cass_other[600];

/* Every log line of every client, for the secrets check. Guarded by
 * log_lock. */
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static char *all_logs;
static size_t all_logs_len;

typedef struct log_sink {
  atomic_int connects; /* "Connecting to" lines: TCP connection attempts */
} log_sink_t;

static void log_cb(prosody_log_level_t level, const char *subsystem,
                   const char *message, void *opaque) {
  log_sink_t *sink = opaque;
  size_t n = strlen(message);
  if (level <= PROSODY_LOG_WARN) /* what a failure needs explained */
    fprintf(stderr, "%s: %s\n", subsystem, message);
  if (sink && strstr(message, "Connecting to ipv"))
    atomic_fetch_add(&sink->connects, 1);
  pthread_mutex_lock(&log_lock);
  char *grown = realloc(all_logs, all_logs_len + n + 2);
  CHECK(grown, "out of memory");
  all_logs = grown;
  memcpy(all_logs + all_logs_len, message, n);
  all_logs_len += n;
  all_logs[all_logs_len++] = '\n';
  all_logs[all_logs_len] = '\0';
  pthread_mutex_unlock(&log_lock);
}

static void no_secret_in(const char *what, const char *text) {
  static const char *const secrets[] = {SCRAM_SECRET, PLAIN_SECRET, KEY_SECRET,
                                        WRONG_SECRET};
  for (size_t i = 0; i < sizeof(secrets) / sizeof(secrets[0]); i++)
    CHECK(!text || !strstr(text, secrets[i]), "%s shows the secret \"%s\"",
          what, secrets[i]);
}

static const char *tls_file(const char *name) {
  static char buf[8][640];
  static int n;
  char *out = buf[n++ % 8];
  snprintf(out, 640, "%s/%s", tls_dir, name);
  return out;
}

/* A configuration for `bootstrap` with `pairs` (name, value, ..., NULL),
 * logging everything to log_cb with `sink`. */
static prosody_config_t *secure_config(const char *bootstrap, log_sink_t *sink,
                                       const char *const *pairs) {
  prosody_config_t *conf = prosody_config_new();
  t_set(conf, "bootstrap_servers", bootstrap);
  t_set(conf, "log", "debug");
  for (int i = 0; pairs[i]; i += 2)
    t_set(conf, pairs[i], pairs[i + 1]);
  prosody_config_set_log_cb(conf, log_cb, sink);
  return conf;
}

#define SASL(mech, user, pw)                                                   \
  "kafka_security_protocol", "SASL_SSL", "kafka_sasl_mechanism", mech,         \
      "kafka_sasl_username", user, "kafka_sasl_password", pw,                  \
      "kafka_ssl_ca_location", tls_file("ca.pem")

/* ---- success over SASL_SSL --------------------------------------------- */

static void admin_and_send(const char *mech, const char *user, const char *pw) {
  char err[1024], topic[128];
  const char *pairs[] = {SASL(mech, user, pw), "source_system", "security",
                         "send_timeout",       "20s",           NULL};
  prosody_topic_options_t o = PROSODY_TOPIC_OPTIONS_INIT;
  prosody_admin_t *admin;
  prosody_client_t *c;

  snprintf(topic, sizeof(topic), "%s", t_topic("security-send"));
  admin = prosody_admin_new(secure_config(sasl_bootstrap, NULL, pairs), err,
                            sizeof(err));
  CHECK(admin, "%s admin: %s", mech, err);
  o.partitions = 1;
  CHECK_OK(prosody_admin_create_topic(admin, topic, &o, err, sizeof(err)), err);
  prosody_admin_destroy(admin);
  c = prosody_client_new(secure_config(sasl_bootstrap, NULL, pairs), err,
                         sizeof(err));
  CHECK(c, "%s client: %s", mech, err);
  CHECK_OK(prosody_send(c, topic, "k", "{\"over\":\"sasl_ssl\"}", NULL, err,
                        sizeof(err)),
           err);
  prosody_client_destroy(c);
  {
    t_record_t r[1];
    CHECK(t_read_back(topic, 1, 30, r) == 1, "%s: the record is not there",
          mech);
    t_records_free(r, 1);
  }
  printf("ok: SASL_SSL %s: admin created %s, producer sent to it\n", mech,
         topic);
}

static atomic_int handled, first_failures, timers_fired;
static pthread_mutex_t seen_lock = PTHREAD_MUTEX_INITIALIZER;
static int seen[N_RECORDS]; /* successful handler calls per record */

static prosody_result_t on_message(prosody_context_t *ctx,
                                   const prosody_message_t *m, void *op) {
  const char *key = prosody_message_key(m);
  int64_t off = prosody_message_offset(m);
  (void)op;
  /* Keys k0 and k1 fail their first record once: two deferred keys with
   * a defer cache of one, so a retry reloads its record from Kafka. */
  if ((!strcmp(key, "k0") && off == 0) || (!strcmp(key, "k1") && off == 1)) {
    pthread_mutex_lock(&seen_lock);
    int again = seen[off] < 0;
    if (!again)
      seen[off] = -1;
    pthread_mutex_unlock(&seen_lock);
    if (!again) {
      atomic_fetch_add(&first_failures, 1);
      return PROSODY_TRANSIENT;
    }
  }
  pthread_mutex_lock(&seen_lock);
  if (off >= 0 && off < N_RECORDS)
    seen[off] = seen[off] < 0 ? 1 : seen[off] + 1;
  pthread_mutex_unlock(&seen_lock);
  if (off == 2) { /* a timer, stored in Cassandra over TLS */
    char err[512];
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    CHECK_OK(prosody_schedule(
                 ctx, (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000 + 1000,
                 err, sizeof(err)),
             err);
  }
  atomic_fetch_add(&handled, 1);
  return PROSODY_SUCCESS;
}

static prosody_result_t on_timer(prosody_context_t *ctx,
                                 const prosody_timer_t *t, void *op) {
  (void)ctx, (void)t, (void)op;
  atomic_fetch_add(&timers_fired, 1);
  return PROSODY_SUCCESS;
}

static void consume_with_defer(void) {
  char err[1024], topic[128], group[160], key[8];
  const char *nodes = getenv("PROSODY_TEST_CASSANDRA_NODES");
  prosody_handler_t h = {on_message, on_timer, NULL, 0};
  prosody_client_t *c;
  prosody_config_t *conf;

  snprintf(topic, sizeof(topic), "%s", t_topic("security-consume"));
  snprintf(group, sizeof(group), "%s-g", topic);
  {
    const char *pairs[] = {
        SASL("SCRAM-SHA-512", "scram-user", SCRAM_SECRET), "group_id", group,
        "subscribed_topics", topic, "probe_port", "none", "commit_interval",
        "100ms", "poll_interval", "20ms", "defer_base", "1s",
        "defer_cache_size", "1", "send_timeout", "20s", "cassandra_nodes",
        nodes && *nodes ? nodes : "localhost:9042", "cassandra_keyspace",
        "prosody_test", "telemetry_enabled", "true", "cassandra_ssl", "true",
        "cassandra_ssl_ca_location", cass_ca, "defer_failure_threshold", "1",
        /* not the group: its own records would be skipped as its output */
        "source_system", "security-producer", NULL};
    conf = secure_config(sasl_bootstrap, NULL, pairs);
  }
  {
    prosody_topic_options_t o = PROSODY_TOPIC_OPTIONS_INIT;
    const char *pairs[] = {SASL("SCRAM-SHA-512", "scram-user", SCRAM_SECRET),
                           NULL};
    prosody_admin_t *admin = prosody_admin_new(
        secure_config(sasl_bootstrap, NULL, pairs), err, sizeof(err));
    CHECK(admin, "admin: %s", err);
    o.partitions = 1;
    CHECK_OK(prosody_admin_create_topic(admin, topic, &o, err, sizeof(err)),
             err);
    prosody_admin_destroy(admin);
  }
  c = prosody_client_new(conf, err, sizeof(err));
  CHECK(c, "%s", err);
  for (int i = 0; i < N_RECORDS; i++) {
    snprintf(key, sizeof(key), "k%d", i % 4);
    CHECK_OK(prosody_send(c, topic, key, "{\"n\":1}", NULL, err, sizeof(err)),
             err);
  }
  CHECK_OK(prosody_subscribe(c, &h, err, sizeof(err)), err);
  CHECK(t_wait_at_least(&handled, N_RECORDS, 90),
        "handled %d of %d records over SASL_SSL (%d first failures)",
        atomic_load(&handled), N_RECORDS, atomic_load(&first_failures));
  CHECK(atomic_load(&first_failures) == 2, "first failures: %d",
        atomic_load(&first_failures));
  CHECK(t_wait_at_least(&timers_fired, 1, 30), "the timer never fired");
  pthread_mutex_lock(&seen_lock);
  for (int i = 0; i < N_RECORDS; i++)
    CHECK(seen[i] == 1, "record %d handled %d times", i, seen[i]);
  pthread_mutex_unlock(&seen_lock);
  CHECK_OK(prosody_unsubscribe(c), "unsubscribe");
  prosody_client_destroy(c);
  printf("ok: consumer over SASL_SSL (SCRAM-SHA-512): %d records, 2 deferred "
         "and retried from Kafka, telemetry on, a timer fired; Cassandra over "
         "TLS\n",
         N_RECORDS);
}

/* Cassandra's certificate refused: subscribe fails, naming the node and
 * why. */
static void cassandra_refused(const char *node, const char *ca,
                              const char *want) {
  char err[2048], topic[128], group[160];
  const char *pairs[] = {"group_id",
                         group,
                         "subscribed_topics",
                         topic,
                         "probe_port",
                         "none",
                         "source_system",
                         "security",
                         "cassandra_nodes",
                         node,
                         "cassandra_keyspace",
                         "prosody_test",
                         "cassandra_ssl",
                         "true",
                         "cassandra_ssl_ca_location",
                         ca,
                         NULL};
  prosody_handler_t h = {on_message, on_timer, NULL, 0};
  log_sink_t sink = {0};
  prosody_client_t *c;
  double t0;
  snprintf(topic, sizeof(topic), "%s", t_topic("security-cass"));
  snprintf(group, sizeof(group), "%s-g", topic);
  c = prosody_client_new(secure_config(t_bootstrap(), &sink, pairs), err,
                         sizeof(err));
  CHECK(c, "%s", err);
  t0 = t_now();
  CHECK(prosody_subscribe(c, &h, err, sizeof(err)) != PROSODY_OK,
        "subscribe with Cassandra's certificate refused succeeded");
  printf("case: Cassandra %s: subscribe failed after %.1f s: %s\n", want,
         t_now() - t0, err);
  CHECK(strstr(err, node) && strstr(err, want), "the error: %s", err);
  prosody_client_destroy(c);
}

static void mutual_tls(void) {
  char err[1024], topic[128];
  const char *pairs[] = {"kafka_security_protocol",
                         "SSL",
                         "kafka_ssl_ca_location",
                         tls_file("ca.pem"),
                         "kafka_ssl_certificate_location",
                         tls_file("client.crt"),
                         "kafka_ssl_key_location",
                         tls_file("client.key"),
                         "kafka_ssl_key_password",
                         KEY_SECRET,
                         "source_system",
                         "security",
                         "send_timeout",
                         "20s",
                         NULL};
  prosody_client_t *c = prosody_client_new(
      secure_config("localhost:9099", NULL, pairs), err, sizeof(err));
  CHECK(c, "mTLS client: %s", err);
  snprintf(topic, sizeof(topic), "%s", t_topic("security-mtls"));
  t_create_topic(topic, 1);
  CHECK_OK(prosody_send(c, topic, "k", "{\"over\":\"mtls\"}", NULL, err,
                        sizeof(err)),
           err);
  prosody_client_destroy(c);
  printf("ok: mutual TLS with an encrypted client key\n");
}

/* ---- failures ----------------------------------------------------------- */

typedef struct failure {
  const char *name, *bootstrap;
  const char *pairs[16];
  const char *want1, *want2; /* in the send's error */
  int max_connects;          /* connection attempts in the 10 s, at most */
  pthread_t thr;
  log_sink_t sink;
  char err[2048];
  prosody_err_t rc;
  double seconds;
} failure_t;

static void *run_failure(void *arg) {
  failure_t *f = arg;
  char cerr[1024], topic[128];
  prosody_config_t *conf = secure_config(f->bootstrap, &f->sink, f->pairs);
  prosody_client_t *c;
  double t0;
  t_set(conf, "source_system", "security");
  t_set(conf, "send_timeout", "10s");
  t_set(conf, "kafka_properties", "debug=broker");
  c = prosody_client_new(conf, cerr, sizeof(cerr));
  CHECK(c, "%s: client: %s", f->name, cerr);
  snprintf(topic, sizeof(topic), "%s", t_topic("security-fail"));
  t0 = t_now();
  f->rc = prosody_send(c, topic, "k", "{}", NULL, f->err, sizeof(f->err));
  f->seconds = t_now() - t0;
  prosody_client_destroy(c);
  return NULL;
}

static void failures(void) {
  failure_t cases[] = {
      {.name = "wrong password",
       .bootstrap = sasl_bootstrap,
       .pairs = {SASL("SCRAM-SHA-512", "scram-user", WRONG_SECRET), NULL},
       .want1 = "localhost:9097",
       .want2 = "Authentication failed",
       .max_connects = 10},
      {.name = "unknown CA",
       .bootstrap = sasl_bootstrap,
       .pairs = {"kafka_security_protocol", "SASL_SSL", "kafka_sasl_mechanism",
                 "PLAIN", "kafka_sasl_username", "plain-user",
                 "kafka_sasl_password", PLAIN_SECRET, "kafka_ssl_ca_location",
                 tls_file("other-ca.pem"), NULL},
       .want1 = "localhost:9097",
       .want2 = "not signed by a CA in kafka_ssl_ca_location",
       .max_connects = 100},
      {.name = "expired certificate",
       .bootstrap = "localhost:9098",
       .pairs = {"kafka_security_protocol", "SSL", "kafka_ssl_ca_location",
                 tls_file("ca.pem"), NULL},
       .want1 = "localhost:9098",
       .want2 = "certificate has expired",
       .max_connects = 100},
      {.name = "host name mismatch",
       .bootstrap = "127.0.0.1:9097",
       .pairs = {SASL("PLAIN", "plain-user", PLAIN_SECRET), NULL},
       .want1 = "127.0.0.1:9097",
       .want2 = "does not name the host we connected to",
       .max_connects = 100},
      {.name = "plaintext client on the TLS port",
       .bootstrap = sasl_bootstrap,
       .pairs = {NULL},
       .want1 = "localhost:9097",
       .want2 = "a TLS listener",
       .max_connects = 10},
      {.name = "no client certificate (mutual TLS)",
       .bootstrap = "localhost:9099",
       .pairs = {"kafka_security_protocol", "SSL", "kafka_ssl_ca_location",
                 tls_file("ca.pem"), NULL},
       .want1 = "localhost:9099",
       .want2 = "refused our client certificate",
       .max_connects = 10},
  };
  size_t n = sizeof(cases) / sizeof(cases[0]);
  /* All at once: each waits out its 10 s send_timeout. */
  for (size_t i = 0; i < n; i++)
    CHECK(!pthread_create(&cases[i].thr, NULL, run_failure, &cases[i]),
          "thread");
  for (size_t i = 0; i < n; i++)
    pthread_join(cases[i].thr, NULL);
  for (size_t i = 0; i < n; i++) {
    failure_t *f = &cases[i];
    int connects = atomic_load(&f->sink.connects);
    printf("case: %s: %s after %.1f s, %d connection attempts: %s\n", f->name,
           prosody_err_name(f->rc), f->seconds, connects, f->err);
    CHECK(f->rc != PROSODY_OK, "%s: the send succeeded", f->name);
    CHECK(strstr(f->err, f->want1) && strstr(f->err, f->want2),
          "%s: the error does not say \"%s\" and \"%s\": %s", f->name, f->want1,
          f->want2, f->err);
    CHECK(f->seconds < 12, "%s: the send took %.1f s", f->name, f->seconds);
    /* librdkafka backs off between attempts (4 in 10 s); a refused broker
     * certificate is retried each time the producer asks for metadata, at
     * most every reconnect.backoff.ms / 2 (about 46; docs/SECURITY.md). A
     * loop without a backoff would make thousands. */
    CHECK(connects >= 1 && connects <= f->max_connects,
          "%s: %d connection attempts (at most %d expected)", f->name, connects,
          f->max_connects);
    no_secret_in(f->name, f->err);
  }
}

/* PROSODY_TEST_LOG_FILE: every log line of the run, for a failure's
 * post-mortem. */
static void dump_logs(void) {
  const char *path = getenv("PROSODY_TEST_LOG_FILE");
  FILE *f = path && *path ? fopen(path, "w") : NULL;
  if (!f)
    return;
  pthread_mutex_lock(&log_lock);
  if (all_logs)
    fputs(all_logs, f);
  pthread_mutex_unlock(&log_lock);
  fclose(f);
}

/* Finds the services' TLS material; T_SKIP under make test-kafka4
 * (scripts/services/kafka4 has no secured listeners). */
static int setup(void) {
  const char *run = getenv("PROSODY_SERVICES_RUN");
  const char *b = getenv("PROSODY_TEST_SASL_BOOTSTRAP");
  struct stat sb;
  atexit(dump_logs);
  if (getenv("PROSODY_TEST_KAFKA4") &&
      !strcmp(getenv("PROSODY_TEST_KAFKA4"), "1")) {
    printf("skip: the secured listeners are scripts/services/kafka's only\n");
    return T_SKIP;
  }
  snprintf(tls_dir, sizeof(tls_dir), "%s/kafka/tls",
           run && *run ? run : "/tmp/prosody-services");
  if (getenv("PROSODY_TEST_TLS_DIR"))
    snprintf(tls_dir, sizeof(tls_dir), "%s", getenv("PROSODY_TEST_TLS_DIR"));
  snprintf(sasl_bootstrap, sizeof(sasl_bootstrap), "%s",
           b && *b ? b : "localhost:9097");
  CHECK(stat(tls_file("ca.pem"), &sb) == 0,
        "no test CA at %s: start Kafka with scripts/services/kafka (it makes "
        "the TLS material and the secured listeners)",
        tls_file("ca.pem"));
  snprintf(cass_ca, sizeof(cass_ca), "%s/cassandra/tls/ca.pem",
           run && *run ? run : "/tmp/prosody-services");
  snprintf(cass_other, sizeof(cass_other), "%s/cassandra/tls/other-ca.pem",
           run && *run ? run : "/tmp/prosody-services");
  return 0;
}

static void need_cassandra_ca(void) {
  struct stat sb;
  CHECK(stat(cass_ca, &sb) == 0,
        "no Cassandra test CA at %s: start Cassandra with "
        "scripts/services/cassandra",
        cass_ca);
}

/* No secret value in any log line of the scenario. */
static int no_secret_logged(void) {
  pthread_mutex_lock(&log_lock);
  no_secret_in("the log", all_logs);
  printf("ok: no secret in %zu bytes of log lines or in any error\n",
         all_logs_len);
  pthread_mutex_unlock(&log_lock);
  return 0;
}

T_SCENARIO(sasl_plain_and_scram_admin_and_producer, T_REAL, 120) {
  if (setup())
    return T_SKIP;
  admin_and_send("PLAIN", "plain-user", PLAIN_SECRET);
  admin_and_send("SCRAM-SHA-256", "scram-user", SCRAM_SECRET);
  admin_and_send("SCRAM-SHA-512", "scram-user", SCRAM_SECRET);
  return no_secret_logged();
}

T_SCENARIO(mutual_tls_with_an_encrypted_client_key, T_REAL, 90) {
  if (setup())
    return T_SKIP;
  mutual_tls();
  return no_secret_logged();
}

T_SCENARIO(consumer_over_sasl_ssl_with_defer_timers_and_cassandra_tls, T_REAL,
           180) {
  if (setup())
    return T_SKIP;
  need_cassandra_ca();
  consume_with_defer();
  return no_secret_logged();
}

T_SCENARIO(cassandra_certificate_refused_names_node_and_cause, T_REAL, 120) {
  if (setup())
    return T_SKIP;
  need_cassandra_ca();
  cassandra_refused("localhost:9042", cass_other, "is not signed by a CA");
  cassandra_refused("127.0.0.1:9042", cass_ca,
                    "does not name the host we connected to");
  /* A TLS endpoint whose certificate expired (the Kafka service's SSL
   * listener with the certificate that expired in 2020: the handshake
   * fails before any CQL is spoken). */
  cassandra_refused("localhost:9098", tls_file("ca.pem"),
                    "certificate has expired");
  return no_secret_logged();
}

/* A plaintext client (no cassandra_ssl) against an endpoint that speaks
 * only TLS: the error says to turn TLS on, instead of a timeout alone. */
T_SCENARIO(cassandra_plaintext_against_a_tls_only_endpoint, T_REAL, 120) {
  char err[2048], topic[128], group[160];
  const char *pairs[] = {"group_id",
                         group,
                         "subscribed_topics",
                         topic,
                         "probe_port",
                         "none",
                         "source_system",
                         "security",
                         "cassandra_nodes",
                         "localhost:9098",
                         "cassandra_keyspace",
                         "prosody_test",
                         NULL};
  prosody_handler_t h = {on_message, on_timer, NULL, 0};
  log_sink_t sink = {0};
  prosody_client_t *c;
  double t0;
  if (setup())
    return T_SKIP;
  snprintf(topic, sizeof(topic), "%s", t_topic("security-cass-plain"));
  snprintf(group, sizeof(group), "%s-g", topic);
  c = prosody_client_new(secure_config(t_bootstrap(), &sink, pairs), err,
                         sizeof(err));
  CHECK(c, "%s", err);
  t0 = t_now();
  CHECK(prosody_subscribe(c, &h, err, sizeof(err)) != PROSODY_OK,
        "a plaintext subscribe to a TLS-only endpoint succeeded");
  printf("case: Cassandra plaintext against TLS only: failed after %.1f s: "
         "%s\n",
         t_now() - t0, err);
  CHECK(strstr(err, "localhost:9098") && strstr(err, "cassandra_ssl"),
        "the error: %s", err);
  prosody_client_destroy(c);
  return no_secret_logged();
}

/* A client certificate whose key is encrypted (the service's
 * <run>/cassandra/tls/client.key, password KEY_SECRET): subscribe over TLS
 * works with `password`, else fails naming the key option and what is
 * wrong, without prompting on a terminal and without the password. */
static void cassandra_client_key(const char *password, const char *want) {
  char err[2048], topic[128], group[160], crt[640], key[640];
  const char *dir = getenv("PROSODY_SERVICES_RUN");
  const char *pairs[] = {"group_id",
                         group,
                         "subscribed_topics",
                         topic,
                         "probe_port",
                         "none",
                         "source_system",
                         "security",
                         "cassandra_nodes",
                         "localhost:9042",
                         "cassandra_keyspace",
                         "prosody_test",
                         "cassandra_ssl",
                         "true",
                         "cassandra_ssl_ca_location",
                         cass_ca,
                         "cassandra_ssl_certificate_location",
                         crt,
                         "cassandra_ssl_key_location",
                         key,
                         password ? "cassandra_ssl_key_password" : NULL,
                         password,
                         NULL};
  prosody_handler_t h = {on_message, on_timer, NULL, 0};
  log_sink_t sink = {0};
  prosody_client_t *c;
  prosody_err_t e;
  snprintf(crt, sizeof(crt), "%s/cassandra/tls/client.crt",
           dir && *dir ? dir : "/tmp/prosody-services");
  snprintf(key, sizeof(key), "%s/cassandra/tls/client.key",
           dir && *dir ? dir : "/tmp/prosody-services");
  snprintf(topic, sizeof(topic), "%s", t_topic("security-cass-key"));
  snprintf(group, sizeof(group), "%s-g", topic);
  c = prosody_client_new(secure_config(t_bootstrap(), &sink, pairs), err,
                         sizeof(err));
  CHECK(c, "%s", err);
  e = prosody_subscribe(c, &h, err, sizeof(err));
  if (!want) {
    CHECK_OK(e, err);
    CHECK_OK(prosody_unsubscribe(c), "unsubscribe");
    printf("case: Cassandra over TLS with an encrypted client key: ok\n");
  } else {
    CHECK(e != PROSODY_OK, "subscribe with key password %s succeeded",
          password ? "wrong" : "missing");
    printf("case: Cassandra client key, password %s: %s\n",
           password ? "wrong" : "missing", err);
    CHECK(strstr(err, "cassandra_ssl_key_location") && strstr(err, want),
          "the error: %s", err);
    no_secret_in("the error", err);
  }
  prosody_client_destroy(c);
}

T_SCENARIO(cassandra_encrypted_client_key_opens_with_its_password, T_REAL,
           120) {
  if (setup())
    return T_SKIP;
  need_cassandra_ca();
  cassandra_client_key(KEY_SECRET, NULL);
  cassandra_client_key(NULL, "needs cassandra_ssl_key_password");
  cassandra_client_key(WRONG_SECRET, "with cassandra_ssl_key_password");
  return no_secret_logged();
}

T_SCENARIO(kafka_failures_name_broker_and_cause_without_a_retry_storm, T_REAL,
           120) {
  if (setup())
    return T_SKIP;
  failures();
  return no_secret_logged();
}
