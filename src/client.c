/*
 * client.c - prosody_client_*: the object users hold. It resolves the
 * configuration once, picks the cluster (configured or embedded mock) and
 * owns the producer. The consumer engine joins it in a later release.
 *
 * A client's fields are immutable after prosody_client_new(), so every
 * thread may use it; the producer is thread-safe.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <pthread.h>

#include "config/config.h"
#include "engine/engine.h"
#include "kafka/kafka.h"
#include "probe/probe.h"
#include "util/util.h"

struct prosody_client {
  prosody_config_t *conf;   /* owned, taken at _new */
  pr__settings_t st;        /* resolved at _new, read-only; kept (with c)
                               when an engine was abandoned */
  char *source_system;      /* source_system, or group_id */
  char *bootstrap;          /* effective bootstrap.servers */
  pr__producer_t *producer; /* thread-safe */
  pr__tm_t *tm;             /* telemetry (thread-safe), or NULL */
  pr_otel_t *otel;          /* span exporter (thread-safe), or NULL */
  pthread_mutex_t lock;     /* guards engine (subscribe/unsubscribe) */
  pr__engine_t *engine;     /* the running consumer, or NULL */
  pr__probe_t *probe;       /* probe server while subscribed, or NULL */
  int stopping;             /* guarded by lock: unsubscribe in progress */
  int start_failed;         /* guarded by lock: the last prosody_subscribe
                               could not start the consumer */
  pr__logger_t *logger;     /* its threads' and calls' logger */
  int abandoned;            /* an engine outlived its stop: keep logger */
  atomic_int shut_down;     /* prosody_client_shutdown() began: sends and
                               subscribe refused (written under lock) */
  pr__pubs_t *pubs;         /* published-state readers, or NULL (lock) */
};

/* How long a closing client waits for its last spans to be exported. */
#define OTEL_CLOSE_FLUSH_MS 2000

/* The client's public functions log to its logger. */
#define LOG_SCOPE(c) pr__logger_t *prev_logger_ = pr__log_adopt((c)->logger)
#define LOG_SCOPE_END() pr__log_adopt(prev_logger_)

static int probe_assigned(void *opaque) { return pr__engine_assigned(opaque); }
static int probe_stalled(void *opaque) { return pr__engine_stalled(opaque); }
static char *probe_metrics(void *opaque) { return pr__engine_metrics(opaque); }

/* Probes run while subscribed, on probe_port unless it is none. In mock
 * mode they are off unless probe_port was given explicitly. */
static int probe_wanted(const prosody_client_t *c) {
  if (!PR_CFG_SET(&c->st, PROBE_PORT))
    return 0;
  if (PR_CFG_BOOL(&c->st, MOCK) &&
      c->st.src[PR_OPT_PROBE_PORT] == PROSODY_CONFIG_SOURCE_DEFAULT)
    return 0;
  return 1;
}

PROSODY_EXPORT prosody_client_t *
prosody_client_new(prosody_config_t *conf, char *errstr, size_t errstr_size) {
  prosody_client_t *c;
  const char *mock_bootstrap;
  const char *source;
  pr__logger_t *prev = NULL;

  if (!conf) {
    pr__errf(errstr, errstr_size, "prosody_client_new: conf is NULL");
    return NULL;
  }
  c = calloc(1, sizeof(*c));
  if (!c) {
    pr__errf(errstr, errstr_size, "out of memory");
    return NULL;
  }
  if (pr__settings_resolve(conf, &c->st, errstr, errstr_size)) {
    free(c);
    return NULL;
  }
  if (pr__settings_check_client(&c->st, errstr, errstr_size))
    goto fail;
  if (!(c->logger = malloc(sizeof(*c->logger)))) {
    pr__errf(errstr, errstr_size, "out of memory");
    goto fail;
  }
  /* The level is this client's `log` (set, PROSODY_LOG, or info). */
  pr__logger_init(c->logger, (pr__log_level_t)PR_CFG_ENUM(&c->st, LOG),
                  conf->log_cb, conf->log_opaque);
  prev = pr__log_adopt(c->logger); /* the producer's thread inherits it */
  pr__settings_warn_ignored(&c->st);

  source = PR_CFG_STR(&c->st, SOURCE_SYSTEM);
  if (!source)
    source = PR_CFG_STR(&c->st, GROUP_ID);
  c->source_system = strdup(source);
  if (PR_CFG_BOOL(&c->st, MOCK)) {
    if (pr__mock_acquire(&mock_bootstrap, errstr, errstr_size))
      goto fail;
    c->bootstrap = strdup(mock_bootstrap);
  } else {
    c->bootstrap = pr__join_list(PR_CFG(&c->st, BOOTSTRAP_SERVERS).list,
                                 PR_CFG(&c->st, BOOTSTRAP_SERVERS).list_n);
  }
  if (!c->source_system || !c->bootstrap) {
    pr__errf(errstr, errstr_size, "out of memory");
    goto fail_mock;
  }
  c->producer = pr__producer_new(&c->st, c->bootstrap, c->source_system, errstr,
                                 errstr_size);
  if (!c->producer)
    goto fail_mock;
  c->tm = pr__tm_new(&c->st, c->bootstrap);
  pr__producer_set_telemetry(c->producer, c->tm);
  if (PR_CFG_SET(&c->st, OTEL_ENDPOINT)) {
    pr_otel_config_t oc = {
        .endpoint = PR_CFG_STR(&c->st, OTEL_ENDPOINT),
        .protocol = (pr_otlp_protocol_t)PR_CFG_ENUM(&c->st, OTEL_PROTOCOL),
        .service_name = PR_CFG_STR(&c->st, OTEL_SERVICE_NAME),
        .resource_attributes = PR_CFG_STR(&c->st, OTEL_RESOURCE_ATTRIBUTES)};
    if (!(c->otel = pr__otel_open(&oc, errstr, errstr_size))) {
      pr__producer_destroy(c->producer);
      pr__tm_free(c->tm);
      goto fail_mock;
    }
    pr__producer_set_otel(c->producer, c->otel);
  }
  pthread_mutex_init(&c->lock, NULL);
  c->conf = conf;
  PR_DEBUG("client", "client ready (bootstrap %s, source-system \"%s\")",
           c->bootstrap, c->source_system);
  pr__log_adopt(prev);
  return c;

fail_mock:
  if (PR_CFG_BOOL(&c->st, MOCK))
    pr__mock_release();
fail:
  if (c->logger) {
    pr__log_adopt(prev);
    pr__logger_fini(c->logger);
    free(c->logger);
  }
  free(c->source_system);
  free(c->bootstrap);
  pr__settings_fini(&c->st);
  free(c);
  return NULL;
}

PROSODY_EXPORT void prosody_client_destroy(prosody_client_t *c) {
  if (!c)
    return;
  if (c->engine)
    prosody_unsubscribe(c);
  pr__pubs_free(c->pubs); /* its reads still running end with STATE */
  c->pubs = NULL;
  {
    LOG_SCOPE(c);
    pr__producer_destroy(c->producer);
    /* After the producer: its last reports emit. An engine that outlived
     * its stop may still emit: its telemetry stays, as its logger does,
     * but starts no producer once we return. */
    if (!c->abandoned) {
      pr__tm_free(c->tm);
      /* Spans still queued get a moment to leave. */
      pr__otel_close(c->otel, OTEL_CLOSE_FLUSH_MS);
    } else {
      pr__tm_seal(c->tm);
    }
    LOG_SCOPE_END();
  }
  pthread_mutex_destroy(&c->lock);
  if (!c->abandoned) {
    pr__logger_fini(c->logger);
    free(c->logger);
  } else {
    /* Threads that outlived their stop still log there, but no longer to
     * the application's callback: its opaque may be freed once we return. */
    pr__logger_detach(c->logger);
  }
  prosody_config_destroy(c->conf);
  if (c->abandoned)
    return; /* the abandoned engine (and its telemetry) still reads the
               settings and the strings taken from them, and its consumer
               still talks to the mock cluster: all kept with it */
  if (PR_CFG_BOOL(&c->st, MOCK))
    pr__mock_release();
  free(c->source_system);
  free(c->bootstrap);
  pr__settings_fini(&c->st);
  free(c);
}

PROSODY_EXPORT const char *
prosody_client_source_system(const prosody_client_t *c) {
  return c ? c->source_system : NULL;
}

/* The refusal of a call on a client that is shut down. */
static int refused(prosody_client_t *c, const char *call, char *errstr,
                   size_t errstr_size) {
  if (!atomic_load(&c->shut_down))
    return 0;
  pr__errf(errstr, errstr_size, "%s: the client is shut down", call);
  return 1;
}

PROSODY_EXPORT prosody_err_t prosody_send(prosody_client_t *c,
                                          const char *topic, const char *key,
                                          const char *payload_json,
                                          const prosody_trace_t *trace,
                                          char *errstr, size_t errstr_size) {
  if (!c) {
    pr__errf(errstr, errstr_size, "prosody_send: client is NULL");
    return PROSODY_ERR_INVALID_ARG;
  }
  if (refused(c, "prosody_send", errstr, errstr_size))
    return PROSODY_ERR_STATE;
  {
    prosody_err_t err;
    LOG_SCOPE(c);
    err = pr__producer_send(c->producer, topic, key, payload_json, trace,
                            errstr, errstr_size);
    LOG_SCOPE_END();
    return err;
  }
}

PROSODY_EXPORT prosody_err_t prosody_send_async(
    prosody_client_t *c, const char *topic, const char *key,
    const char *payload_json, const prosody_trace_t *trace, prosody_send_cb cb,
    void *opaque, char *errstr, size_t errstr_size) {
  if (!c) {
    pr__errf(errstr, errstr_size, "prosody_send_async: client is NULL");
    return PROSODY_ERR_INVALID_ARG;
  }
  if (refused(c, "prosody_send_async", errstr, errstr_size))
    return PROSODY_ERR_STATE;
  {
    prosody_err_t err;
    LOG_SCOPE(c);
    err = pr__producer_send_async(c->producer, topic, key, payload_json, trace,
                                  cb, opaque, errstr, errstr_size);
    LOG_SCOPE_END();
    return err;
  }
}

PROSODY_EXPORT prosody_err_t prosody_excise(prosody_client_t *c,
                                            const char *topic, const char *key,
                                            const prosody_trace_t *trace,
                                            char *errstr, size_t errstr_size) {
  if (!c) {
    pr__errf(errstr, errstr_size, "prosody_excise: client is NULL");
    return PROSODY_ERR_INVALID_ARG;
  }
  if (refused(c, "prosody_excise", errstr, errstr_size))
    return PROSODY_ERR_STATE;
  {
    prosody_err_t err;
    LOG_SCOPE(c);
    err = pr__producer_send(c->producer, topic, key, pr__no_value, trace,
                            errstr, errstr_size);
    LOG_SCOPE_END();
    return err;
  }
}

PROSODY_EXPORT prosody_err_t
prosody_excise_async(prosody_client_t *c, const char *topic, const char *key,
                     const prosody_trace_t *trace, prosody_send_cb cb,
                     void *opaque, char *errstr, size_t errstr_size) {
  if (!c) {
    pr__errf(errstr, errstr_size, "prosody_excise_async: client is NULL");
    return PROSODY_ERR_INVALID_ARG;
  }
  if (refused(c, "prosody_excise_async", errstr, errstr_size))
    return PROSODY_ERR_STATE;
  {
    prosody_err_t err;
    LOG_SCOPE(c);
    err = pr__producer_send_async(c->producer, topic, key, pr__no_value, trace,
                                  cb, opaque, errstr, errstr_size);
    LOG_SCOPE_END();
    return err;
  }
}

/* Internal: the client's producer, for tests (fault injection). */
pr__producer_t *pr__client_producer(prosody_client_t *c) { return c->producer; }

PROSODY_EXPORT prosody_err_t prosody_subscribe(prosody_client_t *c,
                                               const prosody_handler_t *handler,
                                               char *errstr,
                                               size_t errstr_size) {
  prosody_err_t err = PROSODY_OK;
  if (!c || !handler || !handler->on_message) {
    pr__errf(errstr, errstr_size, "prosody_subscribe: %s is NULL",
             !c         ? "client"
             : !handler ? "handler"
                        : "handler->on_message");
    return PROSODY_ERR_INVALID_ARG;
  }
  if (!PR_CFG_SET(&c->st, GROUP_ID) || !PR_CFG_SET(&c->st, SUBSCRIBED_TOPICS) ||
      PR_CFG(&c->st, SUBSCRIBED_TOPICS).list_n == 0) {
    pr__errf(errstr, errstr_size,
             "cannot subscribe: option %s is not set; expected %s",
             !PR_CFG_SET(&c->st, GROUP_ID)
                 ? "group_id (PROSODY_GROUP_ID)"
                 : "subscribed_topics (PROSODY_SUBSCRIBED_TOPICS)",
             !PR_CFG_SET(&c->st, GROUP_ID)
                 ? "the consumer group name"
                 : "a comma-separated list of topic names");
    return PROSODY_ERR_CONFIG;
  }
  LOG_SCOPE(c); /* the engine's threads inherit it */
  pthread_mutex_lock(&c->lock);
  if (c->engine || c->stopping || atomic_load(&c->shut_down)) {
    pr__errf(errstr, errstr_size,
             c->engine     ? "already subscribed"
             : c->stopping ? "still unsubscribing"
                           : "cannot subscribe: the client is shut down");
    err = PROSODY_ERR_STATE;
  } else {
    char why[1024] = "";
    err = pr__engine_start(&c->st, c->bootstrap, c->producer, handler,
                           &c->engine, why, sizeof(why));
    c->start_failed = err != PROSODY_OK;
    if (err) {
      c->engine = NULL;
      pr__errf(errstr, errstr_size, "%s", why);
      /* Said here as well as returned: a host that does not wait for the
       * call's result (the bindings' examples do not await subscribe())
       * would otherwise run on with no consumer and no word of it. */
      PR_ERROR("consumer", "the consumer did not start: %s",
               *why ? why : prosody_err_message(err));
    } else if (probe_wanted(c)) {
      /* A probe server that cannot start (its port taken, often by the
       * application's own HTTP server) does not stop the consumer: the
       * records keep flowing, and the failure is logged at ERROR and
       * seen as prosody_probe_port() == -1 while running. */
      char perr[256];
      pr__probe_source_t src = {probe_assigned, probe_stalled, probe_metrics,
                                c->engine};
      c->probe = pr__probe_start(PR_CFG_STR(&c->st, PROBE_HOST),
                                 (int)PR_CFG_INT(&c->st, PROBE_PORT), src, perr,
                                 sizeof(perr));
      if (!c->probe)
        PR_ERROR("probe",
                 "%s; the consumer runs without /readyz, /livez and /metrics",
                 perr);
    }
  }
  pthread_mutex_unlock(&c->lock);
  LOG_SCOPE_END();
  return err;
}

PROSODY_EXPORT prosody_err_t prosody_unsubscribe(prosody_client_t *c) {
  pr__engine_t *engine;
  if (!c)
    return PROSODY_ERR_INVALID_ARG;
  pr__probe_t *probe;
  /* Take the engine under the lock: readers see NULL from here on, and a
   * concurrent unsubscribe gets PROSODY_ERR_STATE. */
  pthread_mutex_lock(&c->lock);
  engine = c->engine;
  probe = c->probe;
  c->engine = NULL;
  c->probe = NULL;
  if (engine)
    c->stopping = 1;
  pthread_mutex_unlock(&c->lock);
  if (!engine)
    return PROSODY_ERR_STATE;
  {
    int abandoned;
    LOG_SCOPE(c);
    pr__probe_stop(probe); /* before the engine its callbacks read */
    abandoned = pr__engine_stop(engine);
    LOG_SCOPE_END();
    pthread_mutex_lock(&c->lock);
    c->stopping = 0;
    c->abandoned |= abandoned;
    pthread_mutex_unlock(&c->lock);
  }
  return PROSODY_OK;
}

PROSODY_EXPORT prosody_err_t prosody_client_shutdown(prosody_client_t *c) {
  int first;
  if (!c)
    return PROSODY_ERR_INVALID_ARG;
  /* Marked under the lock: a subscribe either ran before (and is stopped
   * below) or sees the mark. */
  pthread_mutex_lock(&c->lock);
  first = !atomic_exchange(&c->shut_down, 1);
  pthread_mutex_unlock(&c->lock);
  (void)prosody_unsubscribe(c); /* PROSODY_ERR_STATE: was not running */
  if (first) {
    LOG_SCOPE(c);
    pr__producer_flush(c->producer);
    pr__otel_flush(c->otel, OTEL_CLOSE_FLUSH_MS);
    LOG_SCOPE_END();
  }
  return PROSODY_OK;
}

PROSODY_EXPORT prosody_err_t prosody_telemetry_flush(uint32_t timeout_ms) {
  return pr__otel_flush_all(timeout_ms) ? PROSODY_ERR_TIMEOUT : PROSODY_OK;
}

PROSODY_EXPORT prosody_err_t prosody_telemetry_shutdown(uint32_t timeout_ms) {
  return pr__otel_shutdown_all(timeout_ms) ? PROSODY_ERR_TIMEOUT : PROSODY_OK;
}

PROSODY_EXPORT const char *prosody_consumer_state(const prosody_client_t *c) {
  const char *state;
  if (!c)
    return "unconfigured";
  pthread_mutex_lock((pthread_mutex_t *)&c->lock);
  state =
      c->engine || c->stopping     ? "running"
      : atomic_load(&c->shut_down) ? "shut-down"
      : !PR_CFG_SET(&c->st, GROUP_ID) || !PR_CFG_SET(&c->st, SUBSCRIBED_TOPICS)
          ? "unconfigured"
      : c->start_failed ? "configuration-failed"
                        : "configured";
  pthread_mutex_unlock((pthread_mutex_t *)&c->lock);
  return state;
}

/* A reading of the running engine, 0 when not subscribed. */
static int engine_reading(const prosody_client_t *c,
                          int (*read)(const pr__engine_t *)) {
  int n = 0;
  if (!c)
    return 0;
  pthread_mutex_lock((pthread_mutex_t *)&c->lock);
  if (c->engine)
    n = read(c->engine);
  pthread_mutex_unlock((pthread_mutex_t *)&c->lock);
  return n;
}

PROSODY_EXPORT int prosody_assigned_partition_count(const prosody_client_t *c) {
  return engine_reading(c, pr__engine_assigned);
}

PROSODY_EXPORT int prosody_is_stalled(const prosody_client_t *c) {
  return engine_reading(c, pr__engine_stalled);
}

PROSODY_EXPORT int prosody_probe_port(const prosody_client_t *c) {
  int port = -1;
  if (!c)
    return -1;
  pthread_mutex_lock((pthread_mutex_t *)&c->lock);
  if (c->probe)
    port = pr__probe_port(c->probe);
  pthread_mutex_unlock((pthread_mutex_t *)&c->lock);
  return port;
}

PROSODY_EXPORT prosody_err_t prosody_published_open(
    prosody_client_t *client, const char *subsystem, const char *name, int kind,
    int64_t read_cache_ms, prosody_published_t **out, char *errstr,
    size_t errstr_size) {
  prosody_err_t err;
  if (!client) {
    pr__errf(errstr, errstr_size, "published state: the client is NULL");
    return PROSODY_ERR_INVALID_ARG;
  }
  pthread_mutex_lock(&client->lock);
  {
    LOG_SCOPE(client);
    err = pr__pubs_open(&client->pubs, &client->st, subsystem, name, kind,
                        read_cache_ms, out, errstr, errstr_size);
    LOG_SCOPE_END();
  }
  pthread_mutex_unlock(&client->lock);
  return err;
}
