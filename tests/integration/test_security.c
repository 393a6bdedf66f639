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
 *  - OAUTHBEARER over SASL_PLAINTEXT (localhost:9100) with librdkafka's
 *    OIDC client-credentials flow against a token endpoint this program
 *    serves (libmicrohttpd on 127.0.0.1, an ephemeral port): the admin
 *    client, a producer and a consumer work, and the endpoint saw our
 *    client id and secret; with a wrong secret the send fails naming
 *    OAUTHBEARER, the endpoint and its refusal, and the token requests in
 *    those 10 s are counted. The broker runs Kafka's default, unsecured
 *    OAUTHBEARER validator: it does NOT verify the token's signature (the
 *    tokens here are unsigned, alg "none"). What this proves is our side:
 *    the token request our options make (librdkafka sends the client id
 *    and secret as HTTP Basic credentials), the token's use by the admin
 *    client, the producer and the consumer, and the error when the
 *    endpoint refuses; not a broker's validation;
 *  - failures: a wrong password, an unknown CA, an expired certificate, a
 *    host name mismatch, a plaintext client on the TLS port, no client
 *    certificate where one is required. Each send fails within
 *    send_timeout (10 s) with an error naming the broker and the cause;
 *    the connection attempts in those 10 s are counted (printed, and
 *    bounded: a tight reconnect loop would make thousands).
 * No secret value (passwords, key password, OAUTHBEARER client secrets and
 * their Basic credentials) appears in any log line or error of the whole
 * run.
 */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/stat.h>

#include "harness.h"

#define N_RECORDS 20
#define SCRAM_SECRET "scram-secret"
#define PLAIN_SECRET "plain-secret"
#define KEY_SECRET "client-key-secret"
#define WRONG_SECRET "Wrong-Secret-7731"
#define OAUTH_ID "prosody-oauth-client"
#define OAUTH_SECRET "oauth-client-secret"
#define OAUTH_SCOPE "kafka-test"
/* scripts/services/kafka's OAUTHBEARER listener (SASL_PLAINTEXT) */
#define OAUTH_BOOTSTRAP "localhost:9100"

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
  static const char *const secrets[] = {
      SCRAM_SECRET, PLAIN_SECRET, KEY_SECRET, WRONG_SECRET, OAUTH_SECRET,
      /* base64 of "client id:secret": the Basic credentials as sent */
      "cHJvc29keS1vYXV0aC1jbGllbnQ6b2F1dGgtY2xpZW50LXNlY3JldA",
      "cHJvc29keS1vYXV0aC1jbGllbnQ6V3JvbmctU2VjcmV0LTc3MzE"};
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

/* Cassandra's certificate refused (or, with `ca` NULL, a plaintext client
 * refused by a TLS-only endpoint): subscribe fails, naming the node and
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
                         ca ? "cassandra_ssl" : NULL, /* NULL: plaintext */
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

/* ---- OAUTHBEARER: a token endpoint of our own --------------------------- */

/* Base64 of `n` bytes of `in` into `out` (size 4 * (n + 2) / 3 + 1 at
 * least): standard with padding, or URL-safe without (`url`). */
static void b64(const char *in, size_t n, int url, char *out) {
  const char *abc = url ? "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                          "0123456789-_"
                        : "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                          "0123456789+/";
  const unsigned char *u = (const unsigned char *)in;
  size_t o = 0;
  for (size_t i = 0; i < n; i += 3) {
    unsigned v = (unsigned)u[i] << 16 | (i + 1 < n ? u[i + 1] << 8 : 0) |
                 (i + 2 < n ? u[i + 2] : 0);
    out[o++] = abc[v >> 18 & 63];
    out[o++] = abc[v >> 12 & 63];
    if (i + 1 < n || !url)
      out[o++] = i + 1 < n ? abc[v >> 6 & 63] : '=';
    if (i + 2 < n || !url)
      out[o++] = i + 2 < n ? abc[v & 63] : '=';
  }
  out[o] = '\0';
}

/* 1 if the form `body` holds the field `item` ("name=value") whole. */
static int form_has(const char *body, const char *item) {
  size_t n = strlen(item);
  for (const char *p = body; (p = strstr(p, item)); p += n)
    if ((p == body || p[-1] == '&') && (p[n] == '&' || p[n] == '\0'))
      return 1;
  return 0;
}

typedef struct token_endpoint {
  struct MHD_Daemon *daemon;
  char url[96];
  atomic_int requests; /* every POST */
  atomic_int granted;  /* answered with a token */
  atomic_int basic;    /* carrying HTTP Basic credentials */
  atomic_int in_body;  /* carrying client_id / client_secret in the form */
  atomic_int scoped;   /* asking for grant_type=client_credentials and our
                          scope */
} token_endpoint_t;

typedef struct token_req {
  size_t n;
  char body[2048];
} token_req_t;

static enum MHD_Result token_reply(struct MHD_Connection *conn, unsigned status,
                                   const char *json) {
  struct MHD_Response *r = MHD_create_response_from_buffer(
      strlen(json), (void *)json, MHD_RESPMEM_MUST_COPY);
  enum MHD_Result ret;
  MHD_add_response_header(r, "Content-Type", "application/json");
  ret = MHD_queue_response(conn, status, r);
  MHD_destroy_response(r);
  return ret;
}

/* An OAuth 2.0 token endpoint (client credentials, RFC 6749 4.4): the
 * client authenticates with HTTP Basic (or client_id and client_secret in
 * the form); the token is an unsigned JWT (alg "none") with sub and exp,
 * all the broker's unsecured validator asks for. */
static enum MHD_Result on_token(void *cls, struct MHD_Connection *conn,
                                const char *url, const char *method,
                                const char *version, const char *upload,
                                size_t *upload_size, void **req_cls) {
  token_endpoint_t *ep = cls;
  token_req_t *req = *req_cls;
  const char *auth;
  char want[160], header[64], claims[160], jwt[400], json[600];
  int ok;
  (void)url, (void)version;
  if (!req) {
    req = calloc(1, sizeof(*req));
    *req_cls = req;
    return req ? MHD_YES : MHD_NO;
  }
  if (*upload_size) {
    size_t take = *upload_size < sizeof(req->body) - 1 - req->n
                      ? *upload_size
                      : sizeof(req->body) - 1 - req->n;
    memcpy(req->body + req->n, upload, take);
    req->n += take;
    *upload_size = 0;
    return MHD_YES;
  }
  if (strcmp(method, "POST"))
    return token_reply(conn, 405, "{\"error\":\"invalid_request\"}");
  atomic_fetch_add(&ep->requests, 1);
  if (strstr(req->body, "grant_type=client_credentials") &&
      strstr(req->body, "scope=" OAUTH_SCOPE))
    atomic_fetch_add(&ep->scoped, 1);
  auth = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                     MHD_HTTP_HEADER_AUTHORIZATION);
  if (auth) {
    atomic_fetch_add(&ep->basic, 1);
    strcpy(want, "Basic ");
    b64(OAUTH_ID ":" OAUTH_SECRET, strlen(OAUTH_ID ":" OAUTH_SECRET), 0,
        want + 6);
    ok = !strcmp(auth, want);
  } else {
    atomic_fetch_add(&ep->in_body, 1);
    ok = form_has(req->body, "client_id=" OAUTH_ID) &&
         form_has(req->body, "client_secret=" OAUTH_SECRET);
  }
  if (!ok)
    return token_reply(conn, 401,
                       "{\"error\":\"invalid_client\",\"error_description\":"
                       "\"client authentication failed\"}");
  b64("{\"alg\":\"none\"}", 15, 1, header);
  snprintf(json, sizeof(json), "{\"sub\":\"%s\",\"iat\":%lld,\"exp\":%lld}",
           OAUTH_ID, (long long)(t_wall_ms() / 1000),
           (long long)(t_wall_ms() / 1000 + 3600));
  b64(json, strlen(json), 1, claims);
  snprintf(jwt, sizeof(jwt), "%s.%s.", header, claims); /* no signature */
  snprintf(json, sizeof(json),
           "{\"access_token\":\"%s\",\"token_type\":\"bearer\","
           "\"expires_in\":3600}",
           jwt);
  atomic_fetch_add(&ep->granted, 1);
  return token_reply(conn, 200, json);
}

static void token_req_done(void *cls, struct MHD_Connection *conn,
                           void **req_cls, enum MHD_RequestTerminationCode c) {
  (void)cls, (void)conn, (void)c;
  free(*req_cls);
  *req_cls = NULL;
}

static void token_endpoint_start(token_endpoint_t *ep) {
  struct sockaddr_in a = {0};
  const union MHD_DaemonInfo *info;
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ep->daemon = MHD_start_daemon(
      MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG, 0, NULL, NULL,
      on_token, ep, MHD_OPTION_SOCK_ADDR, (const struct sockaddr *)&a,
      MHD_OPTION_NOTIFY_COMPLETED, token_req_done, NULL, MHD_OPTION_END);
  CHECK(ep->daemon, "the token endpoint did not start");
  info = MHD_get_daemon_info(ep->daemon, MHD_DAEMON_INFO_BIND_PORT);
  CHECK(info && info->port, "the token endpoint has no port");
  snprintf(ep->url, sizeof(ep->url), "http://127.0.0.1:%u/oauth2/token",
           (unsigned)info->port);
}

#define OAUTH(ep, secret)                                                      \
  "kafka_security_protocol", "SASL_PLAINTEXT", "kafka_sasl_mechanism",         \
      "OAUTHBEARER", "kafka_sasl_oauthbearer_token_endpoint_url", (ep)->url,   \
      "kafka_sasl_oauthbearer_client_id", OAUTH_ID,                            \
      "kafka_sasl_oauthbearer_client_secret", secret,                          \
      "kafka_sasl_oauthbearer_scope", OAUTH_SCOPE, "kafka_properties",         \
      "debug=broker,security" /* librdkafka's SASL lines, for the secrets */

static atomic_int oauth_handled;

static prosody_result_t on_oauth_message(prosody_context_t *ctx,
                                         const prosody_message_t *m, void *op) {
  (void)ctx, (void)m, (void)op;
  atomic_fetch_add(&oauth_handled, 1);
  return PROSODY_SUCCESS;
}

/* The admin client, a producer and a consumer over OAUTHBEARER. */
static void oauth_works(void) {
  char err[1024], topic[128], group[160];
  const char *nodes = getenv("PROSODY_TEST_CASSANDRA_NODES");
  token_endpoint_t ep = {0};
  prosody_topic_options_t o = PROSODY_TOPIC_OPTIONS_INIT;
  prosody_handler_t h = {on_oauth_message, on_timer, NULL, 0};
  prosody_admin_t *admin;
  prosody_client_t *c;

  token_endpoint_start(&ep);
  snprintf(topic, sizeof(topic), "%s", t_topic("security-oauth"));
  snprintf(group, sizeof(group), "%s-g", topic);
  {
    const char *pairs[] = {OAUTH(&ep, OAUTH_SECRET), NULL};
    admin = prosody_admin_new(secure_config(OAUTH_BOOTSTRAP, NULL, pairs), err,
                              sizeof(err));
  }
  CHECK(admin, "OAUTHBEARER admin: %s", err);
  o.partitions = 1;
  CHECK_OK(prosody_admin_create_topic(admin, topic, &o, err, sizeof(err)), err);
  prosody_admin_destroy(admin);
  {
    const char *pairs[] = {OAUTH(&ep, OAUTH_SECRET),
                           "group_id",
                           group,
                           "subscribed_topics",
                           topic,
                           "probe_port",
                           "none",
                           "commit_interval",
                           "100ms",
                           "send_timeout",
                           "20s",
                           "cassandra_nodes",
                           nodes && *nodes ? nodes : "localhost:9042",
                           "cassandra_keyspace",
                           "prosody_test",
                           "source_system",
                           "security-producer",
                           NULL};
    c = prosody_client_new(secure_config(OAUTH_BOOTSTRAP, NULL, pairs), err,
                           sizeof(err));
  }
  CHECK(c, "OAUTHBEARER client: %s", err);
  for (int i = 0; i < N_RECORDS; i++)
    CHECK_OK(prosody_send(c, topic, i % 2 ? "a" : "b", "{\"over\":\"oauth\"}",
                          NULL, err, sizeof(err)),
             err);
  CHECK_OK(prosody_subscribe(c, &h, err, sizeof(err)), err);
  CHECK(t_wait_at_least(&oauth_handled, N_RECORDS, 60),
        "handled %d of %d records over OAUTHBEARER",
        atomic_load(&oauth_handled), N_RECORDS);
  CHECK_OK(prosody_unsubscribe(c), "unsubscribe");
  prosody_client_destroy(c);
  MHD_stop_daemon(ep.daemon);
  printf("ok: OAUTHBEARER (SASL_PLAINTEXT, %s): admin created %s, %d records "
         "sent and consumed; token endpoint: %d requests, %d granted, %d "
         "with HTTP Basic credentials, %d with them in the form, %d asking "
         "grant_type=client_credentials and scope %s\n",
         OAUTH_BOOTSTRAP, topic, N_RECORDS, atomic_load(&ep.requests),
         atomic_load(&ep.granted), atomic_load(&ep.basic),
         atomic_load(&ep.in_body), atomic_load(&ep.scoped), OAUTH_SCOPE);
  CHECK(atomic_load(&ep.granted) >= 1 &&
            atomic_load(&ep.granted) == atomic_load(&ep.requests),
        "the token endpoint granted %d of %d requests",
        atomic_load(&ep.granted), atomic_load(&ep.requests));
  CHECK(atomic_load(&ep.scoped) == atomic_load(&ep.requests),
        "%d of %d token requests asked for client credentials with scope %s",
        atomic_load(&ep.scoped), atomic_load(&ep.requests), OAUTH_SCOPE);
}

/* A wrong client secret: the endpoint answers 401. */
static void oauth_refused(void) {
  char err[2048], topic[128];
  token_endpoint_t ep = {0};
  const char *pairs[] = {OAUTH(&ep, WRONG_SECRET), NULL};
  log_sink_t sink = {0};
  prosody_config_t *conf;
  prosody_client_t *c;
  prosody_err_t rc;
  double t0, took;
  int in_10s;

  token_endpoint_start(&ep);
  conf = secure_config(OAUTH_BOOTSTRAP, &sink, pairs);
  t_set(conf, "source_system", "security");
  t_set(conf, "send_timeout", "10s");
  t0 = t_now();
  c = prosody_client_new(conf, err, sizeof(err));
  CHECK(c, "client: %s", err);
  snprintf(topic, sizeof(topic), "%s", t_topic("security-oauth-fail"));
  rc = prosody_send(c, topic, "k", "{}", NULL, err, sizeof(err));
  took = t_now() - t0;
  in_10s = atomic_load(&ep.requests);
  prosody_client_destroy(c);
  MHD_stop_daemon(ep.daemon);
  printf("case: OAUTHBEARER, wrong client secret: %s after %.1f s, %d token "
         "requests (%d by the client's end), %d connections to the broker: "
         "%s\n",
         prosody_err_name(rc), took, in_10s, atomic_load(&ep.requests),
         atomic_load(&sink.connects), err);
  CHECK(rc != PROSODY_OK, "the send succeeded with a wrong client secret");
  CHECK(atomic_load(&ep.granted) == 0, "a token for a wrong secret");
  CHECK(strstr(err, "OAUTHBEARER") && strstr(err, ep.url) &&
            strstr(err, "invalid_client") &&
            strstr(err, "kafka_sasl_oauthbearer_client_secret"),
        "the error does not name OAUTHBEARER, %s, the endpoint's answer and "
        "the options to check: %s",
        ep.url, err);
  CHECK(took < 12, "the send took %.1f s", took);
  /* librdkafka retries a failed token request on its refresh timer (every
   * 10 s; 1 request in the test), not in a loop, whatever the handle asks
   * meanwhile. */
  CHECK(in_10s >= 1 && in_10s <= 3,
        "%d token requests in %.1f s (at least 1, at most 3 expected)", in_10s,
        took);
  no_secret_in("the error", err);
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
  if (setup())
    return T_SKIP;
  cassandra_refused("localhost:9098", NULL, "cassandra_ssl");
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

T_SCENARIO(oauthbearer_oidc_producer_consumer_and_admin, T_REAL, 150) {
  if (setup())
    return T_SKIP;
  oauth_works();
  return no_secret_logged();
}

T_SCENARIO(oauthbearer_wrong_client_secret_names_the_token_endpoint, T_REAL,
           90) {
  if (setup())
    return T_SKIP;
  oauth_refused();
  return no_secret_logged();
}

T_SCENARIO(kafka_failures_name_broker_and_cause_without_a_retry_storm, T_REAL,
           120) {
  if (setup())
    return T_SKIP;
  failures();
  return no_secret_logged();
}
