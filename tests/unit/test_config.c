/*
 * test_config.c - the option table, value parsing for every type and
 * bound, error message content, precedence (set > env > default), the
 * cross-option checks, and the error/version tables.
 */
#include <ctype.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "config/config.h"
#include "kafka/kafka.h"
#include "prosody.h"

static void contains(const char *haystack, const char *needle) {
  if (!strstr(haystack, needle))
    fail_msg("\"%s\"\n  does not contain \"%s\"", haystack, needle);
}

/* Sets name=value and expects success; returns the canonical value. */
static const char *set_ok(const char *name, const char *value) {
  static char buf[512];
  char err[1024] = "";
  prosody_config_t *conf = prosody_config_new();
  if (prosody_config_set(conf, name, value, err, sizeof(err)) != PROSODY_OK)
    fail_msg("%s=\"%s\" should be accepted: %s", name, value, err);
  assert_int_equal(
      prosody_config_get(conf, name, buf, sizeof(buf), NULL, err, sizeof(err)),
      PROSODY_OK);
  prosody_config_destroy(conf);
  return buf;
}

/* Sets name=value and expects a config error containing every needle. */
static void set_bad(const char *name, const char *value, const char *needle) {
  char err[1024] = "";
  prosody_config_t *conf = prosody_config_new();
  prosody_err_t e = prosody_config_set(conf, name, value, err, sizeof(err));
  if (e != PROSODY_ERR_CONFIG)
    fail_msg("%s=\"%s\" should be rejected (got %s)", name, value,
             prosody_err_name(e));
  /* Every message names the option, its variable and the value. */
  contains(err, name);
  contains(err, pr__opt_defs[pr__opt_lookup(name)].env);
  if (!(pr__opt_defs[pr__opt_lookup(name)].flags & PR_F_SECRET) &&
      pr__opt_defs[pr__opt_lookup(name)].type != PR_T_PROPS)
    contains(err, value);
  contains(err, "expected");
  contains(err, needle);
  prosody_config_destroy(conf);
}

/* ---------------------------------------------------------------------- */

/* Every environment variable the specification documents. */
static const char *const spec_envs[] = {
    "PROSODY_BOOTSTRAP_SERVERS",
    "PROSODY_GROUP_ID",
    "PROSODY_SUBSCRIBED_TOPICS",
    "PROSODY_ALLOWED_EVENTS",
    "PROSODY_SOURCE_SYSTEM",
    "PROSODY_MOCK",
    "PROSODY_MAX_CONCURRENCY",
    "PROSODY_MAX_UNCOMMITTED",
    "PROSODY_TIMEOUT",
    "PROSODY_COMMIT_INTERVAL",
    "PROSODY_POLL_INTERVAL",
    "PROSODY_SHUTDOWN_TIMEOUT",
    "PROSODY_STALL_THRESHOLD",
    "PROSODY_PROBE_PORT",
    "PROSODY_FAILURE_TOPIC",
    "PROSODY_IDEMPOTENCE_CACHE_SIZE",
    "PROSODY_IDEMPOTENCE_VERSION",
    "PROSODY_IDEMPOTENCE_TTL",
    "PROSODY_SLAB_SIZE",
    "PROSODY_MESSAGE_SPANS",
    "PROSODY_TIMER_SPANS",
    "PROSODY_SEND_TIMEOUT",
    "PROSODY_MAX_RETRIES",
    "PROSODY_RETRY_BASE",
    "PROSODY_RETRY_MAX_DELAY",
    "PROSODY_DEFER_ENABLED",
    "PROSODY_DEFER_BASE",
    "PROSODY_DEFER_MAX_DELAY",
    "PROSODY_DEFER_FAILURE_THRESHOLD",
    "PROSODY_DEFER_FAILURE_WINDOW",
    "PROSODY_DEFER_CACHE_SIZE",
    "PROSODY_DEFER_STORE_CACHE_SIZE",
    "PROSODY_DEFER_SEEK_TIMEOUT",
    "PROSODY_DEFER_DISCARD_THRESHOLD",
    "PROSODY_MONOPOLIZATION_ENABLED",
    "PROSODY_MONOPOLIZATION_THRESHOLD",
    "PROSODY_MONOPOLIZATION_WINDOW",
    "PROSODY_MONOPOLIZATION_CACHE_SIZE",
    "PROSODY_SCHEDULER_FAILURE_WEIGHT",
    "PROSODY_SCHEDULER_MAX_WAIT",
    "PROSODY_SCHEDULER_WAIT_WEIGHT",
    "PROSODY_SCHEDULER_CACHE_SIZE",
    "PROSODY_TELEMETRY_TOPIC",
    "PROSODY_TELEMETRY_ENABLED",
    "PROSODY_CASSANDRA_NODES",
    "PROSODY_CASSANDRA_KEYSPACE",
    "PROSODY_CASSANDRA_USER",
    "PROSODY_CASSANDRA_PASSWORD",
    "PROSODY_CASSANDRA_DATACENTER",
    "PROSODY_CASSANDRA_RACK",
    "PROSODY_CASSANDRA_RETENTION",
    "PROSODY_TOPIC_PARTITIONS",
    "PROSODY_TOPIC_REPLICATION_FACTOR",
    "PROSODY_TOPIC_CLEANUP_POLICY",
    "PROSODY_TOPIC_RETENTION",
    "PROSODY_LOG",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
};

static void test_table_covers_spec(void **state) {
  (void)state;
  for (size_t i = 0; i < sizeof(spec_envs) / sizeof(spec_envs[0]); i++) {
    int found = 0;
    for (int o = 0; o < PR_OPT__COUNT; o++)
      found |=
          !strcmp(pr__opt_defs[o].env, spec_envs[i]) ||
          (pr__opt_alias_env[o] && !strcmp(pr__opt_alias_env[o], spec_envs[i]));
    if (!found)
      fail_msg("the spec's %s has no option in options.def", spec_envs[i]);
  }
  assert_int_equal(prosody_option_count(), PR_OPT__COUNT);
  assert_null(prosody_option_info(PR_OPT__COUNT));
}

static void test_env_names(void **state) {
  (void)state;
  for (int i = 0; i < PR_OPT__COUNT; i++) {
    const pr__opt_def_t *d = &pr__opt_defs[i];
    char want[128];
    size_t k = 0;
    /* PROSODY_ + upper-case name, except the spec's own spellings. */
    if (!strcmp(d->name, "max_retry_delay")) {
      assert_string_equal(d->env, "PROSODY_RETRY_MAX_DELAY");
    } else if (!strcmp(d->name, "state_read_cache")) {
      /* the original's variable for the read cache's time to live */
      assert_string_equal(d->env, "PROSODY_STATE_READ_CACHE_TTL");
    } else if (!strncmp(d->name, "otel_", 5)) {
      for (const char *p = d->name; *p; p++)
        want[k++] = (char)toupper((unsigned char)*p);
      want[k] = '\0';
      assert_string_equal(d->env, want);
    } else {
      k = (size_t)snprintf(want, sizeof(want), "PROSODY_");
      for (const char *p = d->name; *p; p++)
        want[k++] = (char)toupper((unsigned char)*p);
      want[k] = '\0';
      assert_string_equal(d->env, want);
    }
    for (int j = 0; j < i; j++) {
      if (!strcmp(d->name, pr__opt_defs[j].name) ||
          !strcmp(d->env, pr__opt_defs[j].env))
        fail_msg("option %s is in the table twice", d->name);
    }
  }
}

static void test_defaults_parse_and_match_spec(void **state) {
  static const struct {
    const char *name, *value;
  } spec[] = {
      {"mock", "false"},
      {"mode", "pipeline"},
      {"max_concurrency", "32"},
      {"max_uncommitted", "64"},
      {"timeout", "none"},
      {"commit_interval", "1s"},
      {"poll_interval", "100ms"},
      {"shutdown_timeout", "30s"},
      {"stall_threshold", "5m"},
      {"probe_port", "8000"},
      {"idempotence_cache_size", "8192"},
      {"idempotence_version", "1"},
      {"idempotence_ttl", "7d"},
      {"slab_size", "1h"},
      {"message_spans", "child"},
      {"timer_spans", "follows_from"},
      {"send_timeout", "1s"},
      {"max_retries", "3"},
      {"retry_base", "20ms"},
      {"max_retry_delay", "5m"},
      {"defer_enabled", "true"},
      {"defer_base", "1s"},
      {"defer_max_delay", "1d"},
      {"defer_failure_threshold", "0.9"},
      {"defer_failure_window", "5m"},
      {"defer_cache_size", "1024"},
      {"defer_store_cache_size", "8192"},
      {"defer_seek_timeout", "30s"},
      {"defer_discard_threshold", "100"},
      {"monopolization_enabled", "true"},
      {"monopolization_threshold", "0.9"},
      {"monopolization_window", "5m"},
      {"monopolization_cache_size", "8192"},
      {"scheduler_failure_weight", "0.3"},
      {"scheduler_max_wait", "2m"},
      {"scheduler_wait_weight", "200"},
      {"scheduler_cache_size", "8192"},
      {"telemetry_topic", "prosody.telemetry-events"},
      {"telemetry_enabled", "true"},
      {"cassandra_keyspace", "prosody"},
      {"cassandra_retention", "365d 6h"},
      {"log", "info"},
  };
  prosody_config_t *conf = prosody_config_new();
  char buf[256], err[1024];
  prosody_config_source_t src;
  (void)state;

  for (int i = 0; i < PR_OPT__COUNT; i++)
    unsetenv(pr__opt_defs[i].env);
  for (size_t i = 0; i < sizeof(spec) / sizeof(spec[0]); i++) {
    prosody_err_t e = prosody_config_get(conf, spec[i].name, buf, sizeof(buf),
                                         &src, err, sizeof(err));
    if (e)
      fail_msg("%s: %s", spec[i].name, err);
    if (strcmp(buf, spec[i].value))
      fail_msg("default of %s is \"%s\", the spec says \"%s\"", spec[i].name,
               buf, spec[i].value);
    assert_int_equal(src, PROSODY_CONFIG_SOURCE_DEFAULT);
  }
  for (int i = 0; i < PR_OPT__COUNT; i++) {
    const prosody_option_info_t *o = prosody_option_info((size_t)i);
    assert_true(strlen(o->accepted) > 0);
    assert_true(strlen(o->default_value) > 0);
    assert_true(strlen(o->description) > 0);
    assert_int_equal(prosody_config_get(conf, o->name, buf, sizeof(buf), NULL,
                                        err, sizeof(err)),
                     PROSODY_OK);
  }
  prosody_config_destroy(conf);
}

static void test_int(void **state) {
  (void)state;
  assert_string_equal(set_ok("max_concurrency", "1"), "1");
  assert_string_equal(set_ok("max_concurrency", " 65536 "), "65536");
  set_bad("max_concurrency", "abc", "an integer from 1 to 65536");
  set_bad("max_concurrency", "0", "out of range");
  set_bad("max_concurrency", "65537", "an integer from 1 to 65536");
  set_bad("max_concurrency", "12x", "not an integer");
  set_bad("max_concurrency", "1.5", "not an integer");
  set_bad("max_concurrency", "", "not an integer");
  set_bad("max_concurrency", "none", "not an integer");
  /* Beyond long long: out of range, with the bounds, not "not an integer". */
  set_bad("max_concurrency", "99999999999999999999",
          "out of range; expected an integer from 1 to 65536");
  set_bad("max_concurrency", "-99999999999999999999",
          "out of range; expected an integer from 1 to 65536");
  set_bad("max_uncommitted", "-1", "an integer from 1 to 1000000");
  assert_string_equal(set_ok("max_retries", "0"), "0");
  assert_string_equal(set_ok("idempotence_cache_size", "0"), "0");
  set_bad("probe_port", "65536", "an integer from 0 to 65535, or none");
  assert_string_equal(set_ok("probe_port", "none"), "none");
  assert_string_equal(set_ok("probe_port", "NONE"), "none");
  set_bad("topic_partitions", "0", "an integer from 1 to 1000000, or none");
}

static void test_float(void **state) {
  (void)state;
  assert_string_equal(set_ok("defer_failure_threshold", "0.5"), "0.5");
  assert_string_equal(set_ok("defer_failure_threshold", "0"), "0");
  assert_string_equal(set_ok("defer_failure_threshold", "1"), "1");
  set_bad("defer_failure_threshold", "1.5", "a number from 0 to 1");
  set_bad("defer_failure_threshold", "nan", "not a number");
  set_bad("defer_failure_threshold", "inf", "not a number");
  set_bad("defer_failure_threshold", "half", "not a number");
  /* (0, 1): both ends excluded, since the scheduler divides by w and 1-w. */
  set_bad("scheduler_failure_weight", "0", "greater than 0 and less than 1");
  set_bad("scheduler_failure_weight", "1", "greater than 0 and less than 1");
  assert_string_equal(set_ok("scheduler_failure_weight", "0.3"), "0.3");
  /* (0, 1] */
  set_bad("monopolization_threshold", "0", "greater than 0 and at most 1");
  assert_string_equal(set_ok("monopolization_threshold", "1"), "1");
  assert_string_equal(set_ok("scheduler_wait_weight", "0"), "0");
}

static void test_bool(void **state) {
  (void)state;
  assert_string_equal(set_ok("mock", "true"), "true");
  assert_string_equal(set_ok("mock", "FALSE"), "false");
  set_bad("mock", "yes", "true or false");
  set_bad("mock", "1", "true or false");
  set_bad("defer_enabled", "", "true or false");
}

static void test_duration_bounds(void **state) {
  (void)state;
  assert_string_equal(set_ok("commit_interval", "1ms"), "1ms");
  set_bad("commit_interval", "0s", "from 1ms to 1h");
  set_bad("commit_interval", "2h", "out of range");
  set_bad("commit_interval", "5", "missing unit");
  assert_string_equal(set_ok("shutdown_timeout", "0s"), "0s");
  assert_string_equal(set_ok("stall_threshold", "2h 30m"), "2h 30m");
  set_bad("stall_threshold", "500ms", "from 1s to 30d");
  assert_string_equal(set_ok("timeout", "none"), "none");
  assert_string_equal(set_ok("timeout", "90s"), "1m 30s");
  set_bad("timeout", "0s", "or none");
  set_bad("send_timeout", "1x", "unknown unit");
  set_bad("idempotence_ttl", "21y", "out of range");
  assert_string_equal(set_ok("retry_base", "0s"), "0s");
}

static void test_lists(void **state) {
  (void)state;
  assert_string_equal(set_ok("allowed_events", " user. , account. ,,"),
                      "user.,account.");
  assert_string_equal(set_ok("subscribed_topics", "orders, payments"),
                      "orders,payments");
  set_bad("subscribed_topics", "orders,bad topic", "bad topic");
  set_bad("subscribed_topics", "orders,a/b", "contains '/'");
  /* Set, but naming no topic: refused now, not at subscribe. */
  set_bad("subscribed_topics", "", "the list is empty");
  set_bad("subscribed_topics", ",", "the list is empty");
  set_bad("subscribed_topics", ",,", "the list is empty");
  {
    /* Whitespace only: the message quotes the trimmed value. */
    char err[1024] = "";
    prosody_config_t *conf = prosody_config_new();
    assert_int_equal(
        prosody_config_set(conf, "subscribed_topics", "   ", err, sizeof(err)),
        PROSODY_ERR_CONFIG);
    contains(err, "subscribed_topics");
    contains(err, "the list is empty");
    prosody_config_destroy(conf);
  }
  assert_string_equal(
      set_ok("bootstrap_servers", "localhost:9092, 127.0.0.1:9093"),
      "localhost:9092,127.0.0.1:9093");
  assert_string_equal(set_ok("bootstrap_servers", "[::1]:9092"), "[::1]:9092");
  set_bad("bootstrap_servers", "localhost", "has no :port");
  set_bad("bootstrap_servers", "localhost:0", "invalid port");
  set_bad("bootstrap_servers", "localhost:99999", "invalid port");
  set_bad("bootstrap_servers", ":9092", "has no host");
  set_bad("bootstrap_servers", "", "the list is empty");
  set_bad("cassandra_nodes", "db1:9042,db2", "\"db2\" has no :port");
  assert_string_equal(set_ok("cassandra_nodes", "none"), "none");
}

static void test_enum_ident_url_string(void **state) {
  (void)state;
  assert_string_equal(set_ok("mode", "low-latency"), "low-latency");
  assert_string_equal(set_ok("mode", "BEST-EFFORT"), "best-effort");
  set_bad("mode", "fast", "one of pipeline, low-latency, best-effort");
  set_bad("message_spans", "parent", "one of child, follows_from");
  assert_string_equal(set_ok("topic_cleanup_policy", "compact,delete"),
                      "compact,delete");
  set_bad("log", "verbose", "one of off, error, warn, info, debug, trace");
  assert_string_equal(set_ok("cassandra_keyspace", "prosody_2"), "prosody_2");
  set_bad("cassandra_keyspace", "2fast", "must start with a letter");
  set_bad("cassandra_keyspace", "a-b", "contains '-'");
  assert_string_equal(
      set_ok("otel_exporter_otlp_endpoint", "http://localhost:4318"),
      "http://localhost:4318");
  set_bad("otel_exporter_otlp_endpoint", "localhost:4318",
          "an http:// or https:// URL");
  set_bad("group_id", "", "a non-empty string");
  set_bad("group_id", "\xff\xfe", "not valid UTF-8");
  assert_string_equal(set_ok("group_id", "none"), "none");
  set_bad("failure_topic", "dead letters", "topic name");
  set_bad("telemetry_topic", "", "topic name");
}

static void test_secret_never_printed(void **state) {
  char buf[64], err[1024] = "";
  prosody_config_t *conf = prosody_config_new();
  (void)state;
  assert_int_equal(prosody_config_set(conf, "cassandra_password", "hunter2",
                                      err, sizeof(err)),
                   PROSODY_OK);
  assert_int_equal(prosody_config_get(conf, "cassandra_password", buf,
                                      sizeof(buf), NULL, err, sizeof(err)),
                   PROSODY_OK);
  assert_string_equal(buf, "****");
  assert_int_equal(
      prosody_config_set(conf, "cassandra_password", "\xff", err, sizeof(err)),
      PROSODY_ERR_CONFIG);
  contains(err, "****");
  prosody_config_destroy(conf);
}

/* A buffer too short for the value is an error that says how much is
 * needed, never a silently truncated value. */
static void test_get_short_buffer(void **state) {
  char buf[16], err[1024] = "";
  prosody_config_t *conf = prosody_config_new();
  (void)state;
  assert_int_equal(prosody_config_set(conf, "subscribed_topics",
                                      "orders,payments,refunds", err,
                                      sizeof(err)),
                   PROSODY_OK);
  assert_int_equal(prosody_config_get(conf, "subscribed_topics", buf,
                                      sizeof(buf), NULL, err, sizeof(err)),
                   PROSODY_ERR_INVALID_ARG);
  assert_string_equal(buf, "");
  contains(err, "subscribed_topics");
  contains(err, "needs 24 bytes");
  /* Exactly enough room works. */
  assert_int_equal(prosody_config_set(conf, "subscribed_topics",
                                      "orders,payments", err, sizeof(err)),
                   PROSODY_OK);
  assert_int_equal(prosody_config_get(conf, "subscribed_topics", buf,
                                      sizeof(buf), NULL, err, sizeof(err)),
                   PROSODY_OK);
  assert_string_equal(buf, "orders,payments");
  prosody_config_destroy(conf);
}

/* A renamed option: the old name and variable set it, and both names (or
 * both variables) at once are refused, naming both. */
static void test_alias(void **state) {
  char buf[64], err[1024] = "";
  prosody_config_source_t src;
  prosody_config_t *conf = prosody_config_new();
  const prosody_option_info_t *info = NULL;
  (void)state;

  for (size_t i = 0; i < prosody_option_count(); i++)
    if (!strcmp(prosody_option_info(i)->name, "loader_cache_size"))
      info = prosody_option_info(i);
  assert_non_null(info);
  assert_string_equal(info->alias, "defer_cache_size");
  assert_string_equal(info->alias_env, "PROSODY_DEFER_CACHE_SIZE");

  unsetenv("PROSODY_LOADER_CACHE_SIZE");
  setenv("PROSODY_DEFER_CACHE_SIZE", "77", 1);
  assert_int_equal(prosody_config_get(conf, "loader_cache_size", buf,
                                      sizeof(buf), &src, err, sizeof(err)),
                   PROSODY_OK);
  assert_string_equal(buf, "77");
  assert_int_equal(src, PROSODY_CONFIG_SOURCE_ENV);
  setenv("PROSODY_LOADER_CACHE_SIZE", "78", 1);
  assert_int_equal(prosody_config_get(conf, "defer_cache_size", buf,
                                      sizeof(buf), &src, err, sizeof(err)),
                   PROSODY_ERR_CONFIG);
  assert_non_null(strstr(err, "PROSODY_LOADER_CACHE_SIZE"));
  assert_non_null(strstr(err, "PROSODY_DEFER_CACHE_SIZE"));
  unsetenv("PROSODY_LOADER_CACHE_SIZE");
  /* A bad value names the variable it came from. */
  setenv("PROSODY_DEFER_CACHE_SIZE", "lots", 1);
  assert_int_equal(prosody_config_get(conf, "loader_cache_size", buf,
                                      sizeof(buf), &src, err, sizeof(err)),
                   PROSODY_ERR_CONFIG);
  assert_non_null(strstr(err, "PROSODY_DEFER_CACHE_SIZE"));
  unsetenv("PROSODY_DEFER_CACHE_SIZE");

  assert_int_equal(
      prosody_config_set(conf, "defer_seek_timeout", "5s", err, sizeof(err)),
      PROSODY_OK);
  assert_int_equal(prosody_config_get(conf, "loader_seek_timeout", buf,
                                      sizeof(buf), &src, err, sizeof(err)),
                   PROSODY_OK);
  assert_string_equal(buf, "5s");
  assert_int_equal(src, PROSODY_CONFIG_SOURCE_SET);
  /* The same name again replaces, as for any option. */
  assert_int_equal(
      prosody_config_set(conf, "defer_seek_timeout", "6s", err, sizeof(err)),
      PROSODY_OK);
  assert_int_equal(
      prosody_config_set(conf, "loader_seek_timeout", "7s", err, sizeof(err)),
      PROSODY_ERR_CONFIG);
  assert_non_null(strstr(err, "loader_seek_timeout"));
  assert_non_null(strstr(err, "defer_seek_timeout"));
  /* Unset by the old name, then the new name is free. */
  assert_int_equal(
      prosody_config_set(conf, "defer_seek_timeout", NULL, err, sizeof(err)),
      PROSODY_OK);
  assert_int_equal(
      prosody_config_set(conf, "loader_seek_timeout", "7s", err, sizeof(err)),
      PROSODY_OK);
  prosody_config_destroy(conf);
}

static void test_precedence(void **state) {
  char buf[64], err[1024] = "";
  prosody_config_source_t src;
  prosody_config_t *conf = prosody_config_new();
  (void)state;

  unsetenv("PROSODY_MAX_CONCURRENCY");
  prosody_config_get(conf, "max_concurrency", buf, sizeof(buf), &src, err,
                     sizeof(err));
  assert_string_equal(buf, "32");
  assert_int_equal(src, PROSODY_CONFIG_SOURCE_DEFAULT);

  setenv("PROSODY_MAX_CONCURRENCY", "7", 1);
  prosody_config_get(conf, "max_concurrency", buf, sizeof(buf), &src, err,
                     sizeof(err));
  assert_string_equal(buf, "7");
  assert_int_equal(src, PROSODY_CONFIG_SOURCE_ENV);

  prosody_config_set(conf, "max_concurrency", "9", err, sizeof(err));
  prosody_config_get(conf, "max_concurrency", buf, sizeof(buf), &src, err,
                     sizeof(err));
  assert_string_equal(buf, "9");
  assert_int_equal(src, PROSODY_CONFIG_SOURCE_SET);

  /* A failed set keeps the previous value. */
  assert_int_equal(
      prosody_config_set(conf, "max_concurrency", "0", err, sizeof(err)),
      PROSODY_ERR_CONFIG);
  prosody_config_get(conf, "max_concurrency", buf, sizeof(buf), &src, err,
                     sizeof(err));
  assert_string_equal(buf, "9");

  prosody_config_set(conf, "max_concurrency", NULL, err, sizeof(err));
  prosody_config_get(conf, "max_concurrency", buf, sizeof(buf), &src, err,
                     sizeof(err));
  assert_string_equal(buf, "7");

  /* An invalid environment value is reported as coming from there. */
  setenv("PROSODY_MAX_CONCURRENCY", "lots", 1);
  assert_int_equal(prosody_config_get(conf, "max_concurrency", buf, sizeof(buf),
                                      &src, err, sizeof(err)),
                   PROSODY_ERR_CONFIG);
  contains(err, "environment variable PROSODY_MAX_CONCURRENCY");
  contains(err, "\"lots\"");
  contains(err, "an integer from 1 to 65536");
  /* ... unless code sets the option, which wins. */
  prosody_config_set(conf, "max_concurrency", "3", err, sizeof(err));
  assert_int_equal(prosody_config_get(conf, "max_concurrency", buf, sizeof(buf),
                                      &src, err, sizeof(err)),
                   PROSODY_OK);
  assert_string_equal(buf, "3");
  /* An empty variable counts as unset. */
  setenv("PROSODY_MAX_CONCURRENCY", "", 1);
  prosody_config_set(conf, "max_concurrency", NULL, err, sizeof(err));
  prosody_config_get(conf, "max_concurrency", buf, sizeof(buf), &src, err,
                     sizeof(err));
  assert_string_equal(buf, "32");
  unsetenv("PROSODY_MAX_CONCURRENCY");
  prosody_config_destroy(conf);
}

static void test_unknown_option(void **state) {
  char err[1024] = "";
  prosody_config_t *conf = prosody_config_new();
  (void)state;
  assert_int_equal(
      prosody_config_set(conf, "max_concurency", "3", err, sizeof(err)),
      PROSODY_ERR_CONFIG);
  contains(err, "unknown option \"max_concurency\"");
  contains(err, "did you mean \"max_concurrency\"");
  assert_int_equal(
      prosody_config_set(conf, "PROSODY_GROUP_ID", "g", err, sizeof(err)),
      PROSODY_ERR_CONFIG);
  contains(err, "did you mean \"group_id\"");
  assert_int_equal(
      prosody_config_set(conf, "zzzzzzzzzzzz", "g", err, sizeof(err)),
      PROSODY_ERR_CONFIG);
  contains(err, "unknown option");
  assert_int_equal(prosody_config_set(NULL, "mock", "true", err, sizeof(err)),
                   PROSODY_ERR_INVALID_ARG);
  prosody_config_destroy(conf);
  prosody_config_destroy(NULL);
}

static prosody_err_t validate_with(const char *const *pairs, char *err,
                                   size_t n) {
  prosody_config_t *conf = prosody_config_new();
  prosody_err_t e;
  for (int i = 0; pairs[i]; i += 2)
    if (prosody_config_set(conf, pairs[i], pairs[i + 1], err, n))
      fail_msg("%s", err);
  e = prosody_config_validate(conf, err, n);
  prosody_config_destroy(conf);
  return e;
}

static void test_cross_checks(void **state) {
  char err[1024] = "";
  (void)state;
  for (int i = 0; i < PR_OPT__COUNT; i++)
    unsetenv(pr__opt_defs[i].env);
  {
    const char *p[] = {"mock", "true", "group_id", "g", NULL};
    assert_int_equal(validate_with(p, err, sizeof(err)), PROSODY_OK);
  }
  {
    const char *p[] = {"group_id", "g", NULL};
    assert_int_equal(validate_with(p, err, sizeof(err)), PROSODY_ERR_CONFIG);
    contains(err, "bootstrap_servers (PROSODY_BOOTSTRAP_SERVERS) is not set");
    contains(err, "mock=true");
  }
  {
    const char *p[] = {"mock", "true", NULL};
    assert_int_equal(validate_with(p, err, sizeof(err)), PROSODY_ERR_CONFIG);
    contains(err, "source_system (PROSODY_SOURCE_SYSTEM)");
    contains(err, "group_id (PROSODY_GROUP_ID)");
  }
  {
    const char *p[] = {"mock", "true", "source_system", "s", NULL};
    assert_int_equal(validate_with(p, err, sizeof(err)), PROSODY_OK);
  }
  {
    const char *p[] = {"mock",       "true", "group_id",        "g",
                       "retry_base", "1s",   "max_retry_delay", "500ms",
                       NULL};
    assert_int_equal(validate_with(p, err, sizeof(err)), PROSODY_ERR_CONFIG);
    contains(err, "max_retry_delay (PROSODY_RETRY_MAX_DELAY) is 500ms");
    contains(err, "retry_base (PROSODY_RETRY_BASE) 1s");
  }
  {
    const char *p[] = {"mock",       "true", "group_id",        "g",
                       "defer_base", "2h",   "defer_max_delay", "1h",
                       NULL};
    assert_int_equal(validate_with(p, err, sizeof(err)), PROSODY_ERR_CONFIG);
    contains(err, "defer_max_delay >= defer_base");
  }
  {
    const char *p[] = {"mock", "true",        "group_id", "g",
                       "mode", "low-latency", NULL};
    assert_int_equal(validate_with(p, err, sizeof(err)), PROSODY_ERR_CONFIG);
    contains(err, "failure_topic (PROSODY_FAILURE_TOPIC) is required");
    contains(err, "low-latency");
  }
  {
    const char *p[] = {"mock",        "true",          "group_id", "g", "mode",
                       "low-latency", "failure_topic", "dlq",      NULL};
    assert_int_equal(validate_with(p, err, sizeof(err)), PROSODY_OK);
  }
  /* The original's programs pass subsystem and peer_bind_address: checked,
   * though nothing uses them yet. */
  {
    const char *p[] = {
        "mock",      "true",      "group_id",          "g",
        "subsystem", " billing ", "peer_bind_address", "127.0.0.1:0",
        NULL};
    assert_int_equal(validate_with(p, err, sizeof(err)), PROSODY_OK);
  }
  {
    prosody_config_t *conf = prosody_config_new();
    assert_int_equal(
        prosody_config_set(conf, "subsystem", "   ", err, sizeof(err)),
        PROSODY_ERR_CONFIG);
    contains(err, "option subsystem (PROSODY_SUBSYSTEM): empty");
    prosody_config_destroy(conf);
  }
  {
    const char *p[] = {"mock",
                       "true",
                       "group_id",
                       "g",
                       "subsystem",
                       "a-name-of-sixty-five-bytes-a-name-of-sixty-five-bytes-"
                       "0123456789x",
                       NULL};
    assert_int_equal(validate_with(p, err, sizeof(err)), PROSODY_ERR_CONFIG);
    contains(err, "expected a name of 1 to 64 bytes");
  }
  {
    const char *p[] = {
        "mock", "true", "group_id", "g", "peer_bind_address", "localhost:70000",
        NULL};
    assert_int_equal(validate_with(p, err, sizeof(err)), PROSODY_ERR_CONFIG);
    contains(err, "peer_bind_address (PROSODY_PEER_BIND_ADDRESS)");
    contains(err, "expected host:port, the port 0 to 65535");
  }
  /* The original's keyed-state options: sizes as it writes them, whole
   * seconds of recovery delay. */
  {
    const char *p[] = {"mock",
                       "true",
                       "group_id",
                       "g",
                       "state_owned_cache_size",
                       "64 MiB",
                       "state_read_cache_size",
                       "500 MB",
                       "state_cache_dir",
                       "/tmp/x",
                       "state_recovery_delay",
                       "30s",
                       NULL};
    assert_int_equal(validate_with(p, err, sizeof(err)), PROSODY_OK);
  }
  {
    static const char *const bad[] = {"0", "-1 MiB", "nonsense", "1.5", "2 xb"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
      prosody_config_t *conf = prosody_config_new();
      assert_int_equal(prosody_config_set(conf, "state_read_cache_size", bad[i],
                                          err, sizeof(err)),
                       PROSODY_ERR_CONFIG);
      contains(err, "option state_read_cache_size");
      contains(err, "expected a size from 1 B to 1 TiB");
      prosody_config_destroy(conf);
    }
  }
  {
    const char *p[] = {
        "mock",   "true", "group_id", "g", "state_recovery_delay",
        "1500ms", NULL};
    assert_int_equal(validate_with(p, err, sizeof(err)), PROSODY_ERR_CONFIG);
    contains(err, "state_recovery_delay (PROSODY_STATE_RECOVERY_DELAY) is "
                  "1s 500ms; expected a whole number of seconds");
  }
  /* A client refuses the same configuration and leaves conf with the
   * caller. */
  {
    prosody_config_t *conf = prosody_config_new();
    prosody_config_set(conf, "mock", "true", err, sizeof(err));
    assert_null(prosody_client_new(conf, err, sizeof(err)));
    contains(err, "source_system");
    prosody_config_destroy(conf);
  }
}

/* The Kafka security options refuse what does not go together, naming
 * both options, and accept each complete combination. */
static void test_kafka_security_checks(void **state) {
  static const struct {
    const char *pairs[13];
    const char *needle1, *needle2; /* NULL: accepted */
  } cases[] = {
      {{"kafka_sasl_username", "u", NULL},
       "kafka_sasl_username (PROSODY_KAFKA_SASL_USERNAME) is set",
       "kafka_security_protocol (PROSODY_KAFKA_SECURITY_PROTOCOL) is "
       "PLAINTEXT"},
      {{"kafka_security_protocol", "SSL", "kafka_sasl_mechanism", "PLAIN",
        NULL},
       "kafka_sasl_mechanism",
       "is SSL"},
      {{"kafka_security_protocol", "SASL_PLAINTEXT", "kafka_ssl_ca_location",
        "/ca.pem", "kafka_sasl_mechanism", "PLAIN", NULL},
       "kafka_ssl_ca_location",
       "is SASL_PLAINTEXT"},
      {{"kafka_ssl_endpoint_identification", "false", NULL},
       "kafka_ssl_endpoint_identification",
       "PLAINTEXT"},
      {{"kafka_security_protocol", "SSL", "kafka_ssl_certificate_location",
        "/c.pem", NULL},
       "kafka_ssl_certificate_location (PROSODY_KAFKA_SSL_CERTIFICATE_"
       "LOCATION) is set but option kafka_ssl_key_location",
       "both or neither"},
      {{"kafka_security_protocol", "SSL", "kafka_ssl_key_location", "/k.pem",
        NULL},
       "kafka_ssl_key_location (PROSODY_KAFKA_SSL_KEY_LOCATION) is set but "
       "option kafka_ssl_certificate_location",
       "both or neither"},
      {{"kafka_security_protocol", "SSL", "kafka_ssl_key_password", "pw", NULL},
       "kafka_ssl_key_password",
       "kafka_ssl_key_location"},
      {{"kafka_security_protocol", "SASL_SSL", NULL},
       "kafka_sasl_mechanism (PROSODY_KAFKA_SASL_MECHANISM) is not set",
       "SCRAM-SHA-512"},
      {{"kafka_security_protocol", "SASL_SSL", "kafka_sasl_mechanism",
        "SCRAM-SHA-256", "kafka_sasl_username", "u", NULL},
       "kafka_sasl_password (PROSODY_KAFKA_SASL_PASSWORD) is not set",
       "SCRAM-SHA-256"},
      {{"kafka_security_protocol", "SASL_SSL", "kafka_sasl_mechanism", "PLAIN",
        "kafka_sasl_username", "u", "kafka_sasl_password", "p",
        "kafka_sasl_oauthbearer_client_id", "c", NULL},
       "kafka_sasl_oauthbearer_client_id",
       "kafka_sasl_mechanism"},
      {{"kafka_security_protocol", "SASL_SSL", "kafka_sasl_mechanism",
        "OAUTHBEARER", "kafka_sasl_username", "u", NULL},
       "kafka_sasl_username",
       "OAUTHBEARER"},
      {{"kafka_security_protocol", "SASL_SSL", "kafka_sasl_mechanism",
        "OAUTHBEARER", "kafka_sasl_oauthbearer_client_id", "c", NULL},
       "kafka_sasl_oauthbearer_token_endpoint_url",
       "OAUTHBEARER"},
      {{"cassandra_ssl_ca_location", "/ca.pem", NULL},
       "cassandra_ssl_ca_location (PROSODY_CASSANDRA_SSL_CA_LOCATION) is set",
       "cassandra_ssl (PROSODY_CASSANDRA_SSL) is false"},
      {{"cassandra_ssl", "true", "cassandra_ssl_certificate_location", "/c.pem",
        NULL},
       "cassandra_ssl_certificate_location",
       "cassandra_ssl_key_location"},
      {{"cassandra_ssl", "true", "cassandra_ssl_key_password", "pw", NULL},
       "cassandra_ssl_key_password (PROSODY_CASSANDRA_SSL_KEY_PASSWORD) is set",
       "cassandra_ssl_key_location"},
      {{"mock", "true", "kafka_security_protocol", "SSL", NULL},
       "mock (PROSODY_MOCK)",
       "is SSL"},
      {{"kafka_security_protocol", "SASL_SSL", "kafka_sasl_mechanism",
        "scram-sha-512", "kafka_sasl_username", "u", "kafka_sasl_password", "p",
        "kafka_ssl_ca_location", "/ca.pem", NULL},
       NULL,
       NULL},
      {{"kafka_security_protocol", "SASL_SSL", "kafka_sasl_mechanism",
        "OAUTHBEARER", "kafka_sasl_oauthbearer_token_endpoint_url",
        "https://idp.example/token", "kafka_sasl_oauthbearer_client_id", "c",
        "kafka_sasl_oauthbearer_client_secret", "s", NULL},
       NULL,
       NULL},
      {{"kafka_security_protocol", "SSL", "kafka_ssl_certificate_location",
        "/c.pem", "kafka_ssl_key_location", "/k.pem", "kafka_ssl_key_password",
        "pw", "kafka_ssl_endpoint_identification", "false", NULL},
       NULL,
       NULL},
  };
  char err[1024];
  (void)state;
  for (int i = 0; i < PR_OPT__COUNT; i++)
    unsetenv(pr__opt_defs[i].env);
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    const char *p[20];
    size_t k = 0;
    int mock = 0;
    for (size_t j = 0; cases[i].pairs[j]; j++) {
      p[k++] = cases[i].pairs[j];
      mock |= !strcmp(cases[i].pairs[j], "mock");
    }
    p[k++] = "group_id", p[k++] = "g";
    if (!mock)
      p[k++] = "bootstrap_servers", p[k++] = "127.0.0.1:9092";
    p[k] = NULL;
    err[0] = '\0';
    if (!cases[i].needle1) {
      if (validate_with(p, err, sizeof(err)) != PROSODY_OK)
        fail_msg("case %zu should be accepted: %s", i, err);
      continue;
    }
    assert_int_equal(validate_with(p, err, sizeof(err)), PROSODY_ERR_CONFIG);
    contains(err, cases[i].needle1);
    contains(err, cases[i].needle2);
  }
}

/* kafka_properties: name=value items (commas inside a value continue it),
 * refusing what prosody sets itself or an option carries, naming it;
 * secret values are masked. */
static void test_kafka_properties(void **state) {
  (void)state;
  assert_string_equal(
      set_ok("kafka_properties", " client.id = me , ssl.cipher.suites=A,B,"),
      "client.id=me,ssl.cipher.suites=A,B");
  assert_string_equal(
      set_ok("kafka_properties", "ssl.keystore.password=hunter2,debug=all"),
      "ssl.keystore.password=****,debug=all");
  assert_string_equal(set_ok("kafka_properties", "none"), "none");
  set_bad("kafka_properties", "enable.auto.commit=true",
          "property enable.auto.commit is refused: set by prosody");
  set_bad("kafka_properties", "client.id=x,group.id=y",
          "property group.id is refused: an option of its own: group_id");
  set_bad("kafka_properties", "sasl.password=x",
          "an option of its own: kafka_sasl_password");
  set_bad("kafka_properties", "rebalance_cb=x", "a callback");
  set_bad("kafka_properties", "isolation.level=read_uncommitted",
          "isolation.level is refused");
  set_bad("kafka_properties", "partition.assignment.strategy=range",
          "partition_assignment_strategy");
  set_bad("kafka_properties", "debug", "the first item is not name=value");
  set_bad("kafka_properties", "Client.Id=x", "no librdkafka property name");
  set_bad("kafka_properties", "debug=all,debug=broker", "given twice");
}

/* kafka_properties reach librdkafka: an unknown property is refused when
 * a handle is made, naming kafka_properties. */
static void test_kafka_properties_reach_librdkafka(void **state) {
  char err[1024] = "";
  prosody_config_t *conf = prosody_config_new();
  (void)state;
  for (int i = 0; i < PR_OPT__COUNT; i++)
    unsetenv(pr__opt_defs[i].env);
  /* No broker and no mock cluster: librdkafka refuses the property while
   * the producer's configuration is built, before any thread starts (a
   * unit test starts none: its TSan build has no C11 threads shim). */
  assert_int_equal(prosody_config_set(conf, "bootstrap_servers", "127.0.0.1:1",
                                      err, sizeof(err)),
                   PROSODY_OK);
  assert_int_equal(prosody_config_set(conf, "group_id", "g", err, sizeof(err)),
                   PROSODY_OK);
  assert_int_equal(prosody_config_set(conf, "kafka_properties",
                                      "no.such.property=1", err, sizeof(err)),
                   PROSODY_OK);
  assert_null(prosody_client_new(conf, err, sizeof(err)));
  contains(err, "kafka_properties (PROSODY_KAFKA_PROPERTIES)");
  contains(err, "no.such.property");
  prosody_config_destroy(conf);
}

/* The fetch.wait.max.ms of a consumer handle built from the options given
 * after `n` as name, value pairs ending with NULL, into `out`. */
static const char *consumer_fetch_wait(char *out, size_t n, ...) {
  char err[1024] = "";
  prosody_config_t *conf = prosody_config_new();
  pr__settings_t st;
  rd_kafka_conf_t *kconf;
  const char *name;
  va_list ap;
  for (int i = 0; i < PR_OPT__COUNT; i++)
    unsetenv(pr__opt_defs[i].env);
  va_start(ap, n);
  while ((name = va_arg(ap, const char *)))
    if (prosody_config_set(conf, name, va_arg(ap, const char *), err,
                           sizeof(err)) != PROSODY_OK)
      fail_msg("%s: %s", name, err);
  va_end(ap);
  if (pr__settings_resolve(conf, &st, err, sizeof(err)) != PROSODY_OK)
    fail_msg("resolve: %s", err);
  /* Builds the configuration only: no handle, no thread, no cluster. */
  if (!(kconf = pr__kafka_consumer_conf(&st, "127.0.0.1:1", err, sizeof(err))))
    fail_msg("consumer conf: %s", err);
  assert_int_equal(rd_kafka_conf_get(kconf, "fetch.wait.max.ms", out, &n),
                   RD_KAFKA_CONF_OK);
  rd_kafka_conf_destroy(kconf);
  pr__settings_fini(&st);
  prosody_config_destroy(conf);
  return out;
}

/* In mock mode a consumer has the broker hold an empty fetch 20 ms, not
 * librdkafka's 500 (the mock answers only when that wait is over); a
 * fetch.wait.max.ms in kafka_properties wins; outside mock mode
 * librdkafka's default stays. */
static void test_mock_consumer_fetch_wait(void **state) {
  char v[32];
  (void)state;
  assert_string_equal(
      consumer_fetch_wait(v, sizeof(v), "mock", "true", "group_id", "g", NULL),
      "20");
  assert_string_equal(consumer_fetch_wait(v, sizeof(v), "mock", "true",
                                          "group_id", "g", "kafka_properties",
                                          "client.id=x,fetch.wait.max.ms=250",
                                          NULL),
                      "250");
  assert_string_equal(consumer_fetch_wait(v, sizeof(v), "bootstrap_servers",
                                          "127.0.0.1:1", "group_id", "g", NULL),
                      "500");
}

static void test_errors_table(void **state) {
  (void)state;
  for (int e = PROSODY_OK; e <= PROSODY_ERR_STATE; e++) {
    assert_true(!strncmp(prosody_err_name((prosody_err_t)e), "PROSODY_", 8));
    assert_true(strlen(prosody_err_message((prosody_err_t)e)) > 0);
    assert_int_equal(prosody_err_is_transient((prosody_err_t)e),
                     e == PROSODY_ERR_TIMEOUT || e == PROSODY_ERR_TRANSIENT);
  }
  assert_string_equal(prosody_err_name(PROSODY_ERR_TIMEOUT),
                      "PROSODY_ERR_TIMEOUT");
  assert_string_equal(prosody_err_name(PROSODY_ERR_STATE), "PROSODY_ERR_STATE");
  assert_string_equal(prosody_err_name((prosody_err_t)99),
                      "PROSODY_ERR_UNKNOWN");
  assert_int_equal(prosody_err_is_transient((prosody_err_t)-1), 0);
}

/* Every accepted value prints as text that parses back to the same value
 * (tests/fuzz/fuzz_options.c checks it on random input); a list of the
 * one item "none" must not read back as unset. */
static void test_format_round_trip(void **state) {
  static const struct {
    pr__opt_id_t id;
    const char *text, *canon;
  } cases[] = {
      {PR_OPT_ALLOWED_EVENTS, "nonE,", "nonE,"},
      {PR_OPT_ALLOWED_EVENTS, " a , b ", "a,b"},
      {PR_OPT_ALLOWED_EVENTS, "none,x", "none,x"},
      {PR_OPT_MAX_CONCURRENCY, "32", "32"},
  };
  char err[512], canon[256], again[256];
  (void)state;
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    pr__value_t v, w;
    memset(&v, 0, sizeof(v));
    memset(&w, 0, sizeof(w));
    assert_int_equal(
        pr__opt_parse(cases[i].id, cases[i].text, 0, &v, err, sizeof(err)),
        PROSODY_OK);
    pr__opt_format(cases[i].id, &v, canon, sizeof(canon));
    assert_string_equal(canon, cases[i].canon);
    assert_int_equal(pr__opt_parse(cases[i].id, canon, 0, &w, err, sizeof(err)),
                     PROSODY_OK);
    assert_int_equal(w.isset, 1);
    pr__opt_format(cases[i].id, &w, again, sizeof(again));
    assert_string_equal(again, canon);
    pr__value_fini(cases[i].id, &v);
    pr__value_fini(cases[i].id, &w);
  }
}

static void test_version(void **state) {
  char want[32];
  (void)state;
  snprintf(want, sizeof(want), "%d.%d.%d", PROSODY_VERSION_MAJOR,
           PROSODY_VERSION_MINOR, PROSODY_VERSION_PATCH);
  assert_string_equal(prosody_version_str(), want);
  assert_int_equal(prosody_version(), PROSODY_VERSION);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_table_covers_spec),
      cmocka_unit_test(test_env_names),
      cmocka_unit_test(test_alias),
      cmocka_unit_test(test_defaults_parse_and_match_spec),
      cmocka_unit_test(test_int),
      cmocka_unit_test(test_float),
      cmocka_unit_test(test_bool),
      cmocka_unit_test(test_duration_bounds),
      cmocka_unit_test(test_lists),
      cmocka_unit_test(test_enum_ident_url_string),
      cmocka_unit_test(test_secret_never_printed),
      cmocka_unit_test(test_get_short_buffer),
      cmocka_unit_test(test_precedence),
      cmocka_unit_test(test_unknown_option),
      cmocka_unit_test(test_cross_checks),
      cmocka_unit_test(test_kafka_security_checks),
      cmocka_unit_test(test_kafka_properties),
      cmocka_unit_test(test_kafka_properties_reach_librdkafka),
      cmocka_unit_test(test_mock_consumer_fetch_wait),
      cmocka_unit_test(test_errors_table),
      cmocka_unit_test(test_version),
      cmocka_unit_test(test_format_round_trip),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
