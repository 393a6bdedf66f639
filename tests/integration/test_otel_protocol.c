/*
 * OTEL_EXPORTER_OTLP_PROTOCOL never stops a client from being built: other
 * programs share the variable (a container sets it for every process), so
 * an unknown value is a warning, not an error. For each value (the three
 * OTLP transports, in any case, and values no SDK accepts), with export on
 * (an endpoint on a closed loopback port) and off: prosody_client_new and
 * prosody_admin_new succeed; a client logs exactly one warning naming the
 * variable and the accepted values for an unknown value, and none for a
 * known one; prosody_config_get reports the protocol in force and where it
 * came from. The same value set in code is still refused, naming the
 * option and the accepted values.
 *
 * Threads: the main thread; the log callback runs on the client's threads
 * and counts under `mu`.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int warnings;    /* warnings that name the variable (mu) */
static char last[1024]; /* the last of them (mu) */

static void on_log(prosody_log_level_t level, const char *subsystem,
                   const char *message, void *opaque) {
  (void)subsystem;
  (void)opaque;
  if (level != PROSODY_LOG_WARN ||
      !strstr(message, "OTEL_EXPORTER_OTLP_PROTOCOL"))
    return;
  pthread_mutex_lock(&mu);
  warnings++;
  snprintf(last, sizeof last, "%s", message);
  pthread_mutex_unlock(&mu);
}

static prosody_config_t *make_config(const char *endpoint) {
  prosody_config_t *conf = t_config();
  t_set(conf, "group_id", "otel-protocol");
  if (endpoint)
    t_set(conf, "otel_exporter_otlp_endpoint", endpoint);
  prosody_config_set_log_cb(conf, on_log, NULL);
  return conf;
}

/* One value of the variable; `want` is the protocol in force, `known`
 * whether the value is one of the accepted ones. */
static void check_value(const char *value, const char *want, int known,
                        const char *endpoint) {
  char err[1024], buf[64];
  prosody_config_source_t src;
  prosody_config_t *conf;
  prosody_client_t *c;
  prosody_admin_t *a;
  int n;

  setenv("OTEL_EXPORTER_OTLP_PROTOCOL", value, 1);
  conf = make_config(endpoint);

  CHECK_OK(prosody_config_get(conf, "otel_exporter_otlp_protocol", buf,
                              sizeof buf, &src, err, sizeof err),
           err);
  CHECK(!strcmp(buf, want), "\"%s\": protocol %s, want %s", value, buf, want);
  CHECK(src == (known && *value ? PROSODY_CONFIG_SOURCE_ENV
                                : PROSODY_CONFIG_SOURCE_DEFAULT),
        "\"%s\": source %d", value, (int)src);
  CHECK_OK(prosody_config_validate(conf, err, sizeof err), err);

  pthread_mutex_lock(&mu);
  warnings = 0;
  pthread_mutex_unlock(&mu);
  c = prosody_client_new(conf, err, sizeof err); /* takes conf */
  CHECK(c, "OTEL_EXPORTER_OTLP_PROTOCOL=\"%s\" (endpoint %s): %s", value,
        endpoint ? endpoint : "none", err);
  prosody_client_destroy(c);
  pthread_mutex_lock(&mu);
  n = warnings;
  pthread_mutex_unlock(&mu);
  CHECK(n == (known ? 0 : 1), "\"%s\": %d warnings naming the variable", value,
        n);
  if (!known) {
    CHECK(strstr(last, "one of http/protobuf, http/json, grpc"),
          "the warning does not list the accepted values: %s", last);
    CHECK(strstr(last, "using the default, http/protobuf"),
          "the warning does not say what applies: %s", last);
  }

  conf = make_config(endpoint);
  a = prosody_admin_new(conf, err, sizeof err); /* takes conf */
  CHECK(a, "admin, OTEL_EXPORTER_OTLP_PROTOCOL=\"%s\": %s", value, err);
  prosody_admin_destroy(a);
}

T_SCENARIO(every_protocol_value_builds_a_client_and_an_admin, T_MOCK, 120) {
  static const struct {
    const char *value, *want;
    int known;
  } cases[] = {
      {"grpc", "grpc", 1},
      {"GRPC", "grpc", 1},
      {" grpc ", "grpc", 1},
      {"http/protobuf", "http/protobuf", 1},
      {"http/json", "http/json", 1},
      {"HTTP/JSON", "http/json", 1},
      {"", "http/protobuf", 1}, /* empty: unset */
      {"http", "http/protobuf", 0},
      {"grpc/protobuf", "http/protobuf", 0},
      {"h2", "http/protobuf", 0},
      {"none", "http/protobuf", 0},
      {"\xff\xfe", "http/protobuf", 0},
      {"grpc,http/protobuf", "http/protobuf", 0},
  };
  /* Port 1 on loopback: nothing listens, a request fails at once. */
  const char *closed = "http://127.0.0.1:1";
  char longv[3000];

  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    check_value(cases[i].value, cases[i].want, cases[i].known, NULL);
    check_value(cases[i].value, cases[i].want, cases[i].known, closed);
  }
  memset(longv, 'x', sizeof longv - 1);
  longv[sizeof longv - 1] = 0;
  check_value(longv, "http/protobuf", 0, closed);
  printf("every value of OTEL_EXPORTER_OTLP_PROTOCOL builds a client\n");
  return 0;
}

/* In code, a bad value is the caller's mistake: refused. */
T_SCENARIO(a_bad_protocol_set_in_code_is_refused, T_MOCK, 30) {
  char err[1024];
  prosody_config_t *conf;
  unsetenv("OTEL_EXPORTER_OTLP_PROTOCOL");
  conf = prosody_config_new();
  CHECK(prosody_config_set(conf, "otel_exporter_otlp_protocol", "bogus", err,
                           sizeof err) == PROSODY_ERR_CONFIG,
        "a bad value set in code was accepted");
  CHECK(strstr(err, "otel_exporter_otlp_protocol") && strstr(err, "grpc") &&
            strstr(err, "http/json"),
        "error: %s", err);
  prosody_config_destroy(conf);
  return 0;
}
