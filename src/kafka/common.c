/*
 * common.c - what every librdkafka handle shares: base configuration, log
 * routing into our logger, error classification, bounded destruction, and
 * what a bootstrap address shows when no broker answers.
 */
#include <errno.h>
#include <netdb.h>
#include <openssl/x509_vfy.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../util/util.h"
#include "kafka.h"

/* The client logger each of our handles logs to: librdkafka calls log_cb
 * on its own threads, which have none. Guarded by bind_lock. */
typedef struct log_bind {
  const rd_kafka_t *rk;
  pr__logger_t *logger;
  uint64_t seq; /* which binding: a freed handle's address may come back */
} log_bind_t;
/* Held by log_cb while it writes to a bound logger, so that once
 * log_unbind() returns no line is being written to it (recursive: a log
 * callback may make a client, which binds). */
static pthread_mutex_t bind_lock = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;
static log_bind_t *binds; /* under bind_lock, oldest first */
static size_t nbinds, capbinds;
static uint64_t bind_seq;

/* Lines of handles being made (pr__kafka_new): librdkafka's threads may
 * log before rd_kafka_new() returns, when nothing is bound yet; they wait
 * here (at most PEND_MAX) for the binding. Under bind_lock. */
#define PEND_MAX 64
typedef struct pend {
  const rd_kafka_t *rk;
  pr__log_level_t level;
  char *line;
} pend_t;
static pend_t pending[PEND_MAX];
static int npending, creating;

/* Writes one line to `lg` (NULL: the calling thread's or the default). */
static void write_line(pr__logger_t *lg, pr__log_level_t level,
                       const char *line) {
  pr__logger_t *prev = NULL;
  if (lg)
    prev = pr__log_adopt(lg);
  pr__log(level, "kafka", "%s", line);
  if (lg)
    pr__log_adopt(prev);
}

/* Lines held for `rk` (NULL: all of them) go to `lg`. Under bind_lock. */
static void flush_pending(const rd_kafka_t *rk, pr__logger_t *lg) {
  int kept = 0;
  for (int i = 0; i < npending; i++) {
    if (!rk || pending[i].rk == rk) {
      write_line(lg, pending[i].level, pending[i].line);
      free(pending[i].line);
    } else {
      pending[kept++] = pending[i];
    }
  }
  npending = kept;
}

rd_kafka_t *pr__kafka_new(rd_kafka_type_t type, rd_kafka_conf_t *conf,
                          char *errstr, size_t errstr_size) {
  pr__logger_t *lg = pr__log_current();
  rd_kafka_t *rk;
  if (lg) {
    pthread_mutex_lock(&bind_lock);
    creating++;
    pthread_mutex_unlock(&bind_lock);
  }
  rk = rd_kafka_new(type, conf, errstr, errstr_size);
  if (!lg)
    return rk;
  pthread_mutex_lock(&bind_lock);
  if (rk && !pr__grow(&binds, &capbinds, nbinds, sizeof(*binds), 8)) {
    binds[nbinds].rk = rk;
    binds[nbinds].seq = ++bind_seq;
    binds[nbinds++].logger = lg;
  } /* else its lines go to the thread's logger or the default */
  if (rk)
    flush_pending(rk, lg);
  if (--creating == 0)
    flush_pending(NULL, NULL); /* a handle that never bound */
  pthread_mutex_unlock(&bind_lock);
  return rk;
}

/* The binding of `rk` (its sequence number; 0: none). */
static uint64_t bind_of(const rd_kafka_t *rk) {
  uint64_t seq = 0;
  pthread_mutex_lock(&bind_lock);
  for (size_t i = nbinds; i-- > 0 && !seq;)
    if (binds[i].rk == rk)
      seq = binds[i].seq;
  pthread_mutex_unlock(&bind_lock);
  return seq;
}

/* Removes binding `seq`; once this returns no line is being written to its
 * logger. */
static void log_unbind(uint64_t seq) {
  pthread_mutex_lock(&bind_lock);
  for (size_t i = 0; i < nbinds; i++)
    if (binds[i].seq == seq) {
      memmove(binds + i, binds + i + 1, (nbinds - i - 1) * sizeof(*binds));
      nbinds--;
      break;
    }
  pthread_mutex_unlock(&bind_lock);
}

/* Under bind_lock. */
static pr__logger_t *bound_logger(const rd_kafka_t *rk) {
  pr__logger_t *lg = NULL;
  for (size_t i = nbinds; i-- > 0 && !lg;) /* the newest handle first */
    if (binds[i].rk == rk)
      lg = binds[i].logger;
  return lg;
}

static void log_cb(const rd_kafka_t *rk, int level, const char *fac,
                   const char *buf) {
  pr__logger_t *lg, *prev = NULL;
  pr__log_level_t l = level <= 3   ? PR_LOG_ERROR
                      : level == 4 ? PR_LOG_WARN
                      : level == 5 ? PR_LOG_INFO
                                   : PR_LOG_DEBUG;
  /* A failed connection is transient (librdkafka rule 8,
   * docs/ARCHITECTURE.md): a warning, whatever level librdkafka gives it. */
  if (l == PR_LOG_ERROR && fac && !strcmp(fac, "FAIL"))
    l = PR_LOG_WARN;
  /* A refused broker certificate, once per attempt: the handle's error
   * callback reports it (explained, repeats folded), so debug here. */
  if (fac && !strcmp(fac, "SSLCERTVRFY"))
    l = PR_LOG_DEBUG;
  pthread_mutex_lock(&bind_lock);
  lg = rk ? bound_logger(rk) : NULL;
  if (!lg && rk && creating > 0 && npending < PEND_MAX) {
    /* Perhaps a handle being made: held until it is bound. */
    size_t n = strlen(rd_kafka_name(rk)) + strlen(fac) + strlen(buf) + 8;
    if ((pending[npending].line = malloc(n))) {
      snprintf(pending[npending].line, n, "%s: [%s] %s", rd_kafka_name(rk), fac,
               buf);
      pending[npending].rk = rk;
      pending[npending++].level = l;
      pthread_mutex_unlock(&bind_lock);
      return;
    }
  }
  if (lg)
    prev = pr__log_adopt(lg);
  pr__log(l, "kafka", "%s: [%s] %s", rk ? rd_kafka_name(rk) : "-", fac, buf);
  if (lg)
    pr__log_adopt(prev);
  pthread_mutex_unlock(&bind_lock);
}

int pr__kafka_conf_set(rd_kafka_conf_t *kconf, const char *name,
                       const char *value, char *errstr, size_t errstr_size) {
  char why[256];
  if (rd_kafka_conf_set(kconf, name, value, why, sizeof(why)) !=
      RD_KAFKA_CONF_OK) {
    pr__errf(errstr, errstr_size, "librdkafka rejected %s=\"%s\": %s", name,
             pr__kafka_prop_secret(name) ? "****" : value, why);
    return -1;
  }
  return 0;
}

/* ---- why a broker's certificate was refused ------------------------------
 * librdkafka reports every failed verification as "certificate verify
 * failed"; its verify callback sees OpenSSL's reason (expired, host name
 * mismatch, unknown issuer). The reason is kept per handle until
 * pr__kafka_explain() quotes it. Guarded by tls_lock; entries go with
 * their handle (pr__kafka_destroy_bounded). */
typedef struct tls_cause {
  const rd_kafka_t *rk;
  char text[320];
} tls_cause_t;
static pthread_mutex_t tls_lock = PTHREAD_MUTEX_INITIALIZER;
static tls_cause_t *tls_causes; /* under tls_lock */
static size_t ntls_causes, captls_causes;

static const char *tls_hint(int x509_error) {
  switch (x509_error) {
  case X509_V_ERR_CERT_HAS_EXPIRED:
    return "the broker's certificate has expired";
  case X509_V_ERR_CERT_NOT_YET_VALID:
    return "the broker's certificate is not valid yet (check the clocks)";
  case X509_V_ERR_HOSTNAME_MISMATCH:
  case X509_V_ERR_IP_ADDRESS_MISMATCH:
    return "the broker's certificate does not name the host we connected to "
           "(use the name it was issued for in bootstrap_servers, or set "
           "kafka_ssl_endpoint_identification=false)";
  case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY:
  case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT:
  case X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN:
  case X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT:
  case X509_V_ERR_CERT_SIGNATURE_FAILURE:
    return "the broker's certificate is not signed by a CA in "
           "kafka_ssl_ca_location (or the system's CAs when it is not set)";
  default:
    return "the broker's certificate was refused";
  }
}

static int cert_verify_cb(rd_kafka_t *rk, const char *broker_name,
                          int32_t broker_id, int *x509_error, int depth,
                          const char *buf, size_t size, char *errstr,
                          size_t errstr_size, void *opaque) {
  (void)broker_id, (void)buf, (void)size, (void)opaque;
  if (*x509_error == X509_V_OK)
    return 1;
  snprintf(errstr, errstr_size, "%s: %s (OpenSSL: %s, certificate depth %d)",
           broker_name, tls_hint(*x509_error),
           X509_verify_cert_error_string(*x509_error), depth);
  pthread_mutex_lock(&tls_lock);
  size_t i = 0;
  while (i < ntls_causes && tls_causes[i].rk != rk)
    i++;
  if (i < ntls_causes || !pr__grow(&tls_causes, &captls_causes, ntls_causes,
                                   sizeof(*tls_causes), 4)) {
    if (i == ntls_causes)
      tls_causes[ntls_causes++].rk = rk;
    snprintf(tls_causes[i].text, sizeof(tls_causes[i].text), "%s", errstr);
  }
  pthread_mutex_unlock(&tls_lock);
  return 0;
}

/* Forgets the certificate failure kept for `rk`. */
static void tls_cause_drop(const rd_kafka_t *rk) {
  pthread_mutex_lock(&tls_lock);
  for (size_t i = 0; i < ntls_causes; i++)
    if (tls_causes[i].rk == rk) {
      tls_causes[i] = tls_causes[--ntls_causes];
      break;
    }
  pthread_mutex_unlock(&tls_lock);
}

/* The security options and kafka_properties of `st` onto `kconf`. */
static int conf_security(rd_kafka_conf_t *kconf, const pr__settings_t *st,
                         char *errstr, size_t errstr_size) {
  static const char *const protocols[] = {"plaintext", "ssl", "sasl_plaintext",
                                          "sasl_ssl"};
  static const char *const mechanisms[] = {"PLAIN", "SCRAM-SHA-256",
                                           "SCRAM-SHA-512", "OAUTHBEARER"};
  static const struct {
    pr__opt_id_t id;
    const char *prop;
  } strs[] = {
      {PR_OPT_KAFKA_SASL_USERNAME, "sasl.username"},
      {PR_OPT_KAFKA_SASL_PASSWORD, "sasl.password"},
      {PR_OPT_KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL,
       "sasl.oauthbearer.token.endpoint.url"},
      {PR_OPT_KAFKA_SASL_OAUTHBEARER_CLIENT_ID, "sasl.oauthbearer.client.id"},
      {PR_OPT_KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET,
       "sasl.oauthbearer.client.secret"},
      {PR_OPT_KAFKA_SASL_OAUTHBEARER_SCOPE, "sasl.oauthbearer.scope"},
      {PR_OPT_KAFKA_SSL_CA_LOCATION, "ssl.ca.location"},
      {PR_OPT_KAFKA_SSL_CERTIFICATE_LOCATION, "ssl.certificate.location"},
      {PR_OPT_KAFKA_SSL_KEY_LOCATION, "ssl.key.location"},
      {PR_OPT_KAFKA_SSL_KEY_PASSWORD, "ssl.key.password"},
  };
  int proto = PR_CFG_ENUM(st, KAFKA_SECURITY_PROTOCOL);
  const pr__value_t *props = &PR_CFG(st, KAFKA_PROPERTIES);

  if (pr__kafka_conf_set(kconf, "security.protocol", protocols[proto], errstr,
                         errstr_size))
    return -1;
  if (PR_CFG_SET(st, KAFKA_SASL_MECHANISM)) {
    int mech = PR_CFG_ENUM(st, KAFKA_SASL_MECHANISM);
    if (pr__kafka_conf_set(kconf, "sasl.mechanism", mechanisms[mech], errstr,
                           errstr_size) ||
        (mech == 3 && pr__kafka_conf_set(kconf, "sasl.oauthbearer.method",
                                         "oidc", errstr, errstr_size)))
      return -1;
  }
  for (size_t i = 0; i < sizeof(strs) / sizeof(strs[0]); i++)
    if (st->v[strs[i].id].isset &&
        pr__kafka_conf_set(kconf, strs[i].prop, st->v[strs[i].id].u.s, errstr,
                           errstr_size))
      return -1;
  if ((proto == 1 || proto == 3) &&
      rd_kafka_conf_set_ssl_cert_verify_cb(kconf, cert_verify_cb) !=
          RD_KAFKA_CONF_OK) {
    pr__errf(errstr, errstr_size,
             "option kafka_security_protocol (PROSODY_KAFKA_SECURITY_PROTOCOL) "
             "asks for TLS, which this librdkafka was built without");
    return -1;
  }
  if ((proto == 1 || proto == 3) &&
      pr__kafka_conf_set(
          kconf, "ssl.endpoint.identification.algorithm",
          PR_CFG_BOOL(st, KAFKA_SSL_ENDPOINT_IDENTIFICATION) ? "https" : "none",
          errstr, errstr_size))
    return -1;
  for (size_t i = 0; i < props->list_n; i++) {
    char name[128];
    const char *eq = strchr(props->list[i], '=');
    snprintf(name, sizeof(name), "%.*s", (int)(eq - props->list[i]),
             props->list[i]);
    if (pr__kafka_conf_set(kconf, name, eq + 1, errstr, errstr_size)) {
      char why[512];
      snprintf(why, sizeof(why), "%s", errstr);
      pr__errf(errstr, errstr_size,
               "option kafka_properties (PROSODY_KAFKA_PROPERTIES): %s", why);
      return -1;
    }
  }
  return 0;
}

rd_kafka_conf_t *pr__kafka_conf_new(const pr__settings_t *st,
                                    const char *bootstrap, int mock,
                                    char *errstr, size_t errstr_size) {
  rd_kafka_conf_t *kconf = rd_kafka_conf_new();
  if (!kconf) {
    pr__errf(errstr, errstr_size, "out of memory");
    return NULL;
  }
  if ((bootstrap && pr__kafka_conf_set(kconf, "bootstrap.servers", bootstrap,
                                       errstr, errstr_size)) ||
      pr__kafka_conf_set(kconf, "client.id", "prosody", errstr, errstr_size) ||
      pr__kafka_conf_set(kconf, "socket.nagle.disable", "true", errstr,
                         errstr_size) ||
      (mock && pr__kafka_conf_set(kconf, "broker.address.family", "v4", errstr,
                                  errstr_size)) ||
      /* Identical connection errors are reported once, not every retry. */
      pr__kafka_conf_set(kconf, "log.connection.close", "false", errstr,
                         errstr_size)) {
    rd_kafka_conf_destroy(kconf);
    return NULL;
  }
  /* Developer aid (docs/DEVELOPMENT.md): librdkafka's own debug contexts,
   * shown with PROSODY_LOG=debug. */
  const char *debug = getenv("PROSODY_KAFKA_DEBUG");
  if ((debug && *debug &&
       pr__kafka_conf_set(kconf, "debug", debug, errstr, errstr_size)) ||
      (st && conf_security(kconf, st, errstr, errstr_size))) {
    rd_kafka_conf_destroy(kconf);
    return NULL;
  }
  rd_kafka_conf_set_log_cb(kconf, log_cb);
  return kconf;
}

int pr__kafka_conf_fetch_wait(rd_kafka_conf_t *kconf, const pr__settings_t *st,
                              int mock, char *errstr, size_t errstr_size) {
  char ms[16];
  if (!mock ||
      pr__kafka_props_has(&PR_CFG(st, KAFKA_PROPERTIES), "fetch.wait.max.ms"))
    return 0;
  snprintf(ms, sizeof(ms), "%d", PR_KAFKA_MOCK_FETCH_WAIT_MS);
  return pr__kafka_conf_set(kconf, "fetch.wait.max.ms", ms, errstr,
                            errstr_size);
}

prosody_err_t pr__kafka_classify(rd_kafka_resp_err_t err) {
  switch (err) {
  case RD_KAFKA_RESP_ERR_NO_ERROR:
    return PROSODY_OK;
  case RD_KAFKA_RESP_ERR__MSG_TIMED_OUT:
  case RD_KAFKA_RESP_ERR__TIMED_OUT:
  case RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT:
    return PROSODY_ERR_TIMEOUT;
  case RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS:
    return PROSODY_ERR_TOPIC_EXISTS;
  case RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC:
  case RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART:
    return PROSODY_ERR_UNKNOWN_TOPIC;
  case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE:
  case RD_KAFKA_RESP_ERR_INVALID_MSG:
  case RD_KAFKA_RESP_ERR_INVALID_MSG_SIZE:
  case RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE:
  case RD_KAFKA_RESP_ERR_INVALID_RECORD:
  case RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED:
  case RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED:
  case RD_KAFKA_RESP_ERR_SASL_AUTHENTICATION_FAILED:
  case RD_KAFKA_RESP_ERR__AUTHENTICATION:
  case RD_KAFKA_RESP_ERR_TOPIC_EXCEPTION:
  case RD_KAFKA_RESP_ERR_INVALID_REQUIRED_ACKS:
  case RD_KAFKA_RESP_ERR_INVALID_PARTITIONS:
  case RD_KAFKA_RESP_ERR_INVALID_REPLICATION_FACTOR:
  case RD_KAFKA_RESP_ERR_INVALID_CONFIG:
  case RD_KAFKA_RESP_ERR_POLICY_VIOLATION:
  case RD_KAFKA_RESP_ERR_UNSUPPORTED_VERSION:
  case RD_KAFKA_RESP_ERR__INVALID_ARG:
  case RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION:
  case RD_KAFKA_RESP_ERR__NOT_IMPLEMENTED:
    return PROSODY_ERR_PERMANENT;
  default:
    return PROSODY_ERR_TRANSIENT;
  }
}

typedef struct destroy_job {
  rd_kafka_t *rk;
  pthread_mutex_t lock;
  pthread_cond_t cond;
  int done;      /* guarded by lock */
  int abandoned; /* guarded by lock: the waiter gave up; the thread frees */
} destroy_job_t;

static void *destroy_thread(void *arg) {
  destroy_job_t *job = arg;
  int abandoned;
  rd_kafka_destroy(job->rk);
  pthread_mutex_lock(&job->lock);
  job->done = 1;
  abandoned = job->abandoned;
  pthread_cond_signal(&job->cond);
  pthread_mutex_unlock(&job->lock);
  if (abandoned) {
    pthread_mutex_destroy(&job->lock);
    pthread_cond_destroy(&job->cond);
    free(job);
  }
  return NULL;
}

int pr__kafka_destroy_bounded(rd_kafka_t *rk, int timeout_ms,
                              const char *what) {
  destroy_job_t *job;
  uint64_t seq = bind_of(rk);
  pthread_t thr;
  pthread_condattr_t attr;
  struct timespec deadline;
  int done;

  if (!rk)
    return 0;
  tls_cause_drop(rk);
  /* Its lines go to its client's logger until it is destroyed (or
   * abandoned): that logger may go once this returns. */
  job = calloc(1, sizeof(*job));
  if (!job) {
    rd_kafka_destroy(rk);
    log_unbind(seq);
    return 0;
  }
  job->rk = rk;
  pthread_mutex_init(&job->lock, NULL);
  pthread_condattr_init(&attr);
  pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
  pthread_cond_init(&job->cond, &attr);
  pthread_condattr_destroy(&attr);
  if (pthread_create(&thr, NULL, destroy_thread, job) != 0) {
    rd_kafka_destroy(rk);
    log_unbind(seq);
    pthread_mutex_destroy(&job->lock);
    pthread_cond_destroy(&job->cond);
    free(job);
    return 0;
  }
  pr__deadline_after(CLOCK_MONOTONIC, (int64_t)timeout_ms * 1000000, &deadline);
  pthread_mutex_lock(&job->lock);
  while (!job->done &&
         pthread_cond_timedwait(&job->cond, &job->lock, &deadline) == 0)
    ;
  done = job->done;
  if (!done)
    job->abandoned = 1;
  pthread_mutex_unlock(&job->lock);
  log_unbind(seq); /* an abandoned handle's later lines: the default's */
  if (!done) {
    pthread_detach(thr);
    PR_ERROR("kafka",
             "librdkafka did not finish destroying the %s handle within %d "
             "ms; abandoning it (it keeps its threads and sockets until it "
             "returns)",
             what, timeout_ms);
    return -1;
  }
  pthread_join(thr, NULL);
  pthread_mutex_destroy(&job->lock);
  pthread_cond_destroy(&job->cond);
  free(job);
  return 0;
}

const char *pr__header_str(const rd_kafka_headers_t *h, const char *name,
                           char *out, size_t n) {
  const void *v;
  size_t len;
  if (!h || rd_kafka_header_get_last(h, name, &v, &len) || !v)
    return NULL;
  if (len >= n)
    len = n - 1;
  memcpy(out, v, len);
  out[len] = '\0';
  return out;
}

char *pr__join_list(char **items, size_t n) {
  size_t len = 1;
  char *out, *p;
  for (size_t i = 0; i < n; i++)
    len += strlen(items[i]) + 1;
  out = malloc(len);
  if (!out)
    return NULL;
  p = out;
  *p = '\0';
  for (size_t i = 0; i < n; i++) {
    size_t l = strlen(items[i]);
    if (i)
      *p++ = ',';
    memcpy(p, items[i], l);
    p += l;
    *p = '\0';
  }
  return out;
}

/* ---- what a bootstrap address shows ------------------------------------ */

/* What a reply that is not Kafka's looks like, from its first 4 bytes. */
static const char *looks_like(const unsigned char b[4]) {
  if (!memcmp(b, "HTTP", 4))
    return " (it began \"HTTP\": an HTTP server)";
  if (b[0] >= 0x83 && b[0] <= 0x85 && b[1] == 0)
    return " (a CQL frame: Cassandra's protocol)";
  if (b[0] == 0x15 && b[1] == 0x03)
    return " (a TLS alert: a TLS listener)";
  return "";
}

const char *pr__kafka_explain(const rd_kafka_t *rk, const char *reason,
                              char *out, size_t n) {
  const char *at = strstr(reason, "Invalid response size ");
  const char *slash = strchr(reason, '/');
  long long size;
  unsigned char b[4];
  if (rk && strstr(reason, "certificate verify failed")) {
    int found = 0;
    pthread_mutex_lock(&tls_lock);
    for (size_t i = 0; i < ntls_causes && !found; i++)
      if (tls_causes[i].rk == rk) {
        snprintf(out, n, "TLS handshake failed: %s", tls_causes[i].text);
        found = 1;
      }
    pthread_mutex_unlock(&tls_lock);
    if (found)
      return out;
  }
  /* librdkafka's OIDC refresh failed: it says what the endpoint answered
   * (or the transport error), not where it asked nor what to check. */
  if (rk && strstr(reason, "SASL OAUTHBEARER token")) {
    char url[256];
    const char *host = url, *scheme_end, *at;
    size_t un = sizeof(url);
    if (rd_kafka_conf_get(rd_kafka_conf((rd_kafka_t *)rk),
                          "sasl.oauthbearer.token.endpoint.url", url,
                          &un) != RD_KAFKA_CONF_OK)
      snprintf(url, sizeof(url), "(unknown)");
    /* Never the user information of https://user:password@host/... */
    scheme_end = strstr(url, "://");
    at = scheme_end ? strchr(scheme_end + 3, '@') : NULL;
    if (at &&
        (!strchr(scheme_end + 3, '/') || at < strchr(scheme_end + 3, '/')))
      host = at + 1;
    snprintf(out, n,
             "%s (the token request to %.*s%s, kafka_sasl_oauthbearer_token_"
             "endpoint_url, failed: check it, kafka_sasl_oauthbearer_client_id "
             "and kafka_sasl_oauthbearer_client_secret)",
             reason, host == url ? 0 : (int)(scheme_end + 3 - url), url, host);
    return out;
  }
  if (strstr(reason, "alert bad certificate") ||
      strstr(reason, "alert certificate required")) {
    snprintf(out, n,
             "%s (the broker refused our client certificate, or wants one: "
             "check kafka_ssl_certificate_location and kafka_ssl_key_location)",
             reason);
    return out;
  }
  /* A reply to the ApiVersion request (the first one on a connection)
   * whose length field is absurd: not a Kafka broker at all. */
  if (!at || !strstr(reason, "receive.message.max.bytes") ||
      !strstr(reason, "APIVERSION_QUERY") || !slash || slash > at) {
    snprintf(out, n, "%s", reason);
    return out;
  }
  size = strtoll(at + strlen("Invalid response size "), NULL, 10);
  for (int i = 0; i < 4; i++) /* the bytes librdkafka read as a length */
    b[i] = (unsigned char)((uint32_t)size >> (24 - 8 * i));
  snprintf(out, n,
           "%.*s is not a Kafka broker: it answered Kafka's first request "
           "(ApiVersion) with bytes that are no Kafka response%s (read as a "
           "length of %lld bytes); does bootstrap_servers point at another "
           "service?",
           (int)(slash - reason), reason, looks_like(b), size);
  return out;
}

/* Splits "host:port" or "[v6]:port" into host and port; -1 if malformed. */
static int split_address(const char *a, size_t len, char *host, size_t hn,
                         char *port, size_t pn) {
  const char *colon = NULL;
  size_t h0 = 0, hl;
  for (size_t i = 0; i < len; i++)
    if (a[i] == ':')
      colon = a + i;
  if (!colon || (size_t)(a + len - colon - 1) >= pn || colon == a + len - 1)
    return -1;
  hl = (size_t)(colon - a);
  if (hl >= 2 && a[0] == '[' && a[hl - 1] == ']')
    h0 = 1, hl -= 2;
  if (hl == 0 || hl >= hn)
    return -1;
  memcpy(host, a + h0, hl);
  host[hl] = '\0';
  memcpy(port, colon + 1, (size_t)(a + len - colon - 1));
  port[a + len - colon - 1] = '\0';
  return 0;
}

/* Waits for `events` on `fd` until `deadline_ns`; > 0 when ready. */
static int wait_fd(int fd, short events, int64_t deadline_ns) {
  struct pollfd p = {fd, events, 0};
  int64_t left = (deadline_ns - pr__now_ns()) / 1000000;
  return left > 0 ? poll(&p, 1, (int)left) : 0;
}

/* What one address shows within `budget_ms` (see pr__kafka_probe). */
static void probe_one(const char *addr, size_t len, int budget_ms, char *out,
                      size_t n) {
  /* ApiVersions v0, correlation id 1, client id "prosody" */
  static const unsigned char req[] = {0,   0,   0,   17,  0,   18,  0,
                                      0,   0,   0,   0,   1,   0,   7,
                                      'p', 'r', 'o', 's', 'o', 'd', 'y'};
  int64_t deadline = pr__now_ns() + (int64_t)budget_ms * 1000000;
  struct addrinfo hints = {0}, *ai = NULL;
  unsigned char rep[8];
  char host[256], port[16];
  size_t got = 0;
  int fd = -1, rc, soerr = 0;
  socklen_t sl = sizeof(soerr);

  if (split_address(addr, len, host, sizeof(host), port, sizeof(port))) {
    snprintf(out, n, "\"%.*s\" is not host:port", (int)len, addr);
    return;
  }
  hints.ai_socktype = SOCK_STREAM;
  if ((rc = getaddrinfo(host, port, &hints, &ai)) || !ai) {
    snprintf(out, n, "%.*s does not resolve (%s)", (int)len, addr,
             gai_strerror(rc));
    return;
  }
  fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  rc = fd < 0 ? -1 : connect(fd, ai->ai_addr, ai->ai_addrlen);
  freeaddrinfo(ai);
  if (fd < 0) {
    snprintf(out, n, "no socket to probe %.*s", (int)len, addr);
    return;
  }
  if (rc && errno != EINPROGRESS)
    soerr = errno;
  else if (rc && wait_fd(fd, POLLOUT, deadline) <= 0) {
    snprintf(out, n,
             "%.*s did not accept a TCP connection within %d ms (nothing "
             "answers there, or a firewall drops the packets)",
             (int)len, addr, budget_ms);
    goto done;
  } else if (rc)
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
  if (soerr) {
    snprintf(out, n, "%.*s refused a TCP connection (%s)", (int)len, addr,
             strerror(soerr));
    goto done;
  }
  if (send(fd, req, sizeof(req), MSG_NOSIGNAL) != (ssize_t)sizeof(req)) {
    snprintf(out, n, "%.*s accepted a TCP connection but not a request",
             (int)len, addr);
    goto done;
  }
  while (got < sizeof(rep) && wait_fd(fd, POLLIN, deadline) > 0) {
    ssize_t r = recv(fd, rep + got, sizeof(rep) - got, 0);
    if (r <= 0)
      break;
    got += (size_t)r;
  }
  if (got == 0)
    snprintf(out, n,
             "%.*s accepted a TCP connection but sent nothing back to "
             "Kafka's first request (ApiVersion) within %d ms: it is not a "
             "Kafka broker, or one that does not answer",
             (int)len, addr, budget_ms);
  else if (got == sizeof(rep) && rep[4] == 0 && rep[5] == 0 && rep[6] == 0 &&
           rep[7] == 1 && rep[0] == 0)
    snprintf(out, n, "%.*s answers as a Kafka broker", (int)len, addr);
  else if (got >= 4)
    snprintf(out, n,
             "%.*s is not a Kafka broker: it answered Kafka's first request "
             "(ApiVersion) with bytes that are no Kafka response%s",
             (int)len, addr, looks_like(rep));
  else
    snprintf(out, n,
             "%.*s is not a Kafka broker: it answered Kafka's first request "
             "(ApiVersion) with %zu byte(s) and hung up",
             (int)len, addr, got);
done:
  close(fd);
}

void pr__kafka_probe(const char *bootstrap, int budget_ms, char *out,
                     size_t n) {
  const char *p = bootstrap;
  size_t used = 0;
  int count = 1;
  for (const char *c = bootstrap; *c; c++)
    count += *c == ',';
  if (count > 3)
    count = 3;
  out[0] = '\0';
  for (int i = 0; i < count && *p && used + 1 < n; i++) {
    size_t len = strcspn(p, ",");
    if (i) {
      snprintf(out + used, n - used, "; ");
      used += strlen(out + used);
    }
    probe_one(p, len, budget_ms / count, out + used, n - used);
    used += strlen(out + used);
    p += len + (p[len] == ',');
  }
}

PROSODY_EXPORT const char *prosody_librdkafka_version_str(void) {
  return rd_kafka_version_str();
}

int pr__kafka_partition_count(rd_kafka_t *rk, const char *topic,
                              int timeout_ms) {
  const struct rd_kafka_metadata *md = NULL;
  rd_kafka_topic_t *rkt = rd_kafka_topic_new(rk, topic, NULL);
  int n = -2;
  if (!rkt)
    return -1;
  if (rd_kafka_metadata(rk, 0, rkt, &md, timeout_ms) ==
      RD_KAFKA_RESP_ERR_NO_ERROR) {
    n = -1;
    for (int i = 0; i < md->topic_cnt; i++)
      if (!strcmp(md->topics[i].topic, topic) && !md->topics[i].err &&
          md->topics[i].partition_cnt > 0)
        n = md->topics[i].partition_cnt;
    rd_kafka_metadata_destroy(md);
  }
  rd_kafka_topic_destroy(rkt);
  return n;
}
