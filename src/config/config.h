/*
 * config.h - the option table, value parsing and settings resolution
 * (private to libprosody).
 *
 * Ownership: a prosody_config_t belongs to its creator and is used from one
 * thread at a time; a pr__settings_t is the immutable, resolved snapshot a
 * client or admin handle builds once in its constructor and owns from then on
 * (read-only afterwards, so any thread may read it without a lock).
 */
#ifndef PR_CONFIG_H
#define PR_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "prosody.h"

typedef enum pr__opt_type {
  PR_T_STRING,    /* any non-empty UTF-8 string */
  PR_T_TOPIC,     /* a Kafka topic name */
  PR_T_TOPICS,    /* comma-separated topic names */
  PR_T_LIST,      /* comma-separated strings, trimmed */
  PR_T_HOSTPORTS, /* comma-separated host:port */
  PR_T_IDENT,     /* a CQL identifier: letter, then letters/digits/_ */
  PR_T_URL,       /* http:// or https:// URL */
  PR_T_BOOL,      /* true | false */
  PR_T_INT,       /* integer within [min, max] */
  PR_T_FLOAT,     /* number within [min, max] (PR_F_OPEN_* for exclusive) */
  PR_T_DURATION,  /* humantime duration within [min, max] seconds */
  PR_T_ENUM,      /* one of the '|'-separated values */
  PR_T_PROPS,     /* comma-separated librdkafka name=value (config.c) */
  PR_T_SIZE       /* bytes within [min, max]: "64 MiB", "500 MB", "4096" */
} pr__opt_type_t;

#define PR_F_OPTIONAL 0x1u /* "none" unsets the value */
#define PR_F_SECRET 0x2u   /* value is never printed */
#define PR_F_OPEN_MIN 0x4u /* float bound min is exclusive */
#define PR_F_OPEN_MAX 0x8u /* float bound max is exclusive */
/* A value from the environment that does not parse is ignored (the default
 * applies, and the client logs one warning) instead of failing: for
 * variables other programs share, such as OTEL_EXPORTER_OTLP_PROTOCOL. A
 * value set in code is still checked. */
#define PR_F_ENV_LENIENT 0x10u

typedef enum pr__opt_id {
#define PR_OPT(id, ...) PR_OPT_##id,
#include "options.def"
#undef PR_OPT
  PR_OPT__COUNT
} pr__opt_id_t;

/* The old names of renamed options (PR_ALIAS rows), NULL for the rest. */
extern const char *const pr__opt_alias[PR_OPT__COUNT];
extern const char *const pr__opt_alias_env[PR_OPT__COUNT];

typedef struct pr__opt_def {
  const char *name;        /* option name, snake_case */
  const char *env;         /* environment variable */
  pr__opt_type_t type;     /* value type */
  const char *def;         /* default as a user would write it, or NULL */
  double min, max;         /* bounds (durations in seconds) */
  unsigned flags;          /* PR_F_* */
  const char *section;     /* documentation section */
  const char *values;      /* enum values, '|'-separated */
  const char *default_doc; /* shown in docs when def is NULL */
  const char *help;        /* one-sentence description */
} pr__opt_def_t;

extern const pr__opt_def_t pr__opt_defs[PR_OPT__COUNT];

/* A parsed value. `isset` is 0 for an unset optional value. */
typedef struct pr__value {
  int isset;
  union {
    int b;      /* PR_T_BOOL */
    int64_t i;  /* PR_T_INT, PR_T_SIZE (bytes) */
    double f;   /* PR_T_FLOAT */
    int64_t ns; /* PR_T_DURATION, nanoseconds */
    int e;      /* PR_T_ENUM, index into values */
    char *s;    /* string types (owned) */
  } u;
  char **list;   /* list types: owned array of owned strings */
  size_t list_n; /* number of list entries */
} pr__value_t;

/* Internal options, set only by white-box tests (pr__config_set_test),
 * never read from the environment: a consumer in another process that
 * joins the embedded mock cluster by address has no Cassandra and needs
 * the mock's short session. */
typedef struct pr__test_opts {
  int memory_timers;          /* keep timers in memory although mock=false */
  int64_t session_timeout_ms; /* session.timeout.ms, 0: librdkafka's */
  int fail_part_new;          /* the next N partitions taken fail to
                                 allocate, as when out of memory */
  int sched_fifo;             /* waiting events run in arrival order (the
                                 limiter before the fair scheduler), for
                                 benchmarks that show what it buys */
  int defer_refuse_rows;      /* the next N writes of a deferred key's row
                                 fail, as when the store refuses them */
  int64_t stop_grace_ms;      /* how long a stop waits past
                                 shutdown_timeout before abandoning the
                                 engine (0: 60 s) */
  int state_refuse_settles;   /* the next N stores of an event's keyed
                                 state fail permanently */
  int state_exit_after;       /* the process exits (status 42) once this
                                 many events' keyed state is stored,
                                 before their commit: a crash there */
  int dlq_refuse_sends;       /* the next N sends to failure_topic fail
                                 transiently, as when the broker refuses */
  int timer_refuse_deletes;   /* the next N deletes of fired timers fail
                                 transiently, as when the store refuses */
  int hold_rebalances;        /* the engine does not serve its consumer
                                 queue until it stops (an assignment is
                                 served inside the consumer's close, as
                                 when the stop arrives with it); it logs
                                 "holding" once an event waits there; in
                                 the close each rebalance callback first
                                 waits 50 ms (the group's leave goes
                                 through meanwhile) */
} pr__test_opts_t;

/* A prosody_config_t: only what was set in code, as validated text. */
/* Registered keyed-state collections (prosody_config_add_state): the
 * definitions, each name owned. */
typedef struct pr__state_defs {
  prosody_state_def_t *d;
  size_t n;
} pr__state_defs_t;

struct prosody_config {
  pr__state_defs_t states;               /* owned */
  char *set[PR_OPT__COUNT];              /* owned; NULL when not set in code */
  unsigned char by_alias[PR_OPT__COUNT]; /* set[] was given by its alias */
  pr__test_opts_t test;  /* pr__config_set_test(); zero otherwise */
  prosody_log_cb log_cb; /* prosody_config_set_log_cb(), or NULL */
  void *log_opaque;
};

/* Every option resolved: value plus where it came from. */
typedef struct pr__settings {
  pr__value_t v[PR_OPT__COUNT];
  prosody_config_source_t src[PR_OPT__COUNT];
  /* Why the environment's value of a PR_F_ENV_LENIENT option was ignored
   * (owned), or NULL. */
  char *env_ignored[PR_OPT__COUNT];
  pr__test_opts_t test;
  pr__state_defs_t states; /* a copy of the configuration's (owned) */
} pr__settings_t;

/* Sets the internal test options of `conf`. */
void pr__config_set_test(prosody_config_t *conf, const pr__test_opts_t *opts);

/* Index of option `name`, or -1. */
int pr__opt_lookup(const char *name);

/* Parses `text` for option `id`. On error writes a message naming the
 * option, its variable, the value and the accepted form, and returns
 * PROSODY_ERR_CONFIG. `from_env` only changes the wording: 1 names the
 * option's variable, 2 the variable of its old name (PR_ALIAS). */
prosody_err_t pr__opt_parse(pr__opt_id_t id, const char *text, int from_env,
                            pr__value_t *out, char *errstr, size_t errstr_size);

/* Frees what a value of option `id` owns and zeroes it. */
void pr__value_fini(pr__opt_id_t id, pr__value_t *v);

/* Canonical text of a value ("none" when unset, "****" for secrets). */
void pr__opt_format(pr__opt_id_t id, const pr__value_t *v, char *buf,
                    size_t buf_size);

/* The accepted form of option `id` ("an integer from 1 to 65536"). */
const char *pr__opt_accepted(pr__opt_id_t id);

/* Resolves one option (set, then environment, then default). The
 * environment's value of a PR_F_ENV_LENIENT option that does not parse is
 * ignored (the source is then the default); `*env_ignored` (if given) is
 * then the reason, malloc'd, else NULL. */
prosody_err_t pr__opt_resolve(const prosody_config_t *conf, pr__opt_id_t id,
                              pr__value_t *out, prosody_config_source_t *source,
                              char **env_ignored, char *errstr,
                              size_t errstr_size);

/* Resolves every option. On error the settings are left empty (nothing to
 * free). The rules between options are in pr__settings_check_*. */
prosody_err_t pr__settings_resolve(const prosody_config_t *conf,
                                   pr__settings_t *st, char *errstr,
                                   size_t errstr_size);
/* Logs one warning (on the calling thread's logger) for each environment
 * value that resolution ignored. */
void pr__settings_warn_ignored(const pr__settings_t *st);

/* Checks what every Kafka handle needs: bootstrap_servers unless mock, and
 * Kafka security options that agree with each other (the SASL options
 * only with a SASL protocol, the TLS ones only with a TLS one, a client
 * certificate with its key, what the SASL mechanism needs). */
prosody_err_t pr__settings_check_kafka(const pr__settings_t *st, char *errstr,
                                       size_t errstr_size);
/* Checks what a client needs on top: probe_host an IP address, the rules
 * between options
 * (max_retry_delay >= retry_base, defer_max_delay >= defer_base,
 * failure_topic in low-latency mode) and source_system or group_id. */
prosody_err_t pr__settings_check_client(const pr__settings_t *st, char *errstr,
                                        size_t errstr_size);

/* Frees resolved settings. */
void pr__settings_fini(pr__settings_t *st);

/* Typed access to resolved settings. */
#define PR_CFG(st, ID) ((st)->v[PR_OPT_##ID])
#define PR_CFG_SET(st, ID) ((st)->v[PR_OPT_##ID].isset)
#define PR_CFG_INT(st, ID) ((st)->v[PR_OPT_##ID].u.i)
#define PR_CFG_BOOL(st, ID) ((st)->v[PR_OPT_##ID].u.b)
#define PR_CFG_FLOAT(st, ID) ((st)->v[PR_OPT_##ID].u.f)
#define PR_CFG_NS(st, ID) ((st)->v[PR_OPT_##ID].u.ns)
#define PR_CFG_MS(st, ID) ((st)->v[PR_OPT_##ID].u.ns / 1000000)
#define PR_CFG_ENUM(st, ID) ((st)->v[PR_OPT_##ID].u.e)
#define PR_CFG_STR(st, ID)                                                     \
  ((st)->v[PR_OPT_##ID].isset ? (st)->v[PR_OPT_##ID].u.s : NULL)

/* Mode values, in the order of the table's enum. */
enum { PR_MODE_PIPELINE = 0, PR_MODE_LOW_LATENCY = 1, PR_MODE_BEST_EFFORT = 2 };

/* Durations (duration.c). Parses humantime text into nanoseconds; returns 0
 * on success, -1 with a message (without the option name) on error. */
int pr__duration_parse(const char *text, int64_t *ns, char *errstr,
                       size_t errstr_size);
/* Formats nanoseconds as a humantime string ("2h 30m", "20ms", "0s"). */
void pr__duration_format(int64_t ns, char *buf, size_t buf_size);

/* 1 if the librdkafka property `name` holds a secret (a password, a
 * private key, a client secret): its value is never printed. */
int pr__kafka_prop_secret(const char *name);
/* 1 if the kafka_properties value `props` (a PR_T_PROPS list of
 * "name=value" items) sets librdkafka property `name`. */
int pr__kafka_props_has(const pr__value_t *props, const char *name);

/* Validates a Kafka topic name; 0 if valid, -1 with the reason. */
int pr__topic_name_check(const char *name, char *why, size_t why_size);

#endif /* PR_CONFIG_H */
