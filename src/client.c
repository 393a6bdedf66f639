/*
 * client.c - prosody_client_*: the object users hold. It resolves the
 * configuration once, picks the cluster (configured or embedded mock) and
 * owns the producer. The consumer engine joins it in a later release.
 *
 * A client's fields are immutable after prosody_client_new(), so every
 * thread may use it; the producer is thread-safe.
 */
#include <stdlib.h>
#include <string.h>

#include "config/config.h"
#include "kafka/kafka.h"
#include "util/util.h"

struct prosody_client {
  prosody_config_t *conf;   /* owned, taken at _new */
  pr__settings_t st;        /* resolved at _new, read-only */
  char *source_system;      /* source_system, or group_id */
  char *bootstrap;          /* effective bootstrap.servers */
  pr__producer_t *producer; /* thread-safe */
};

PROSODY_EXPORT prosody_client_t *
prosody_client_new(prosody_config_t *conf, char *errstr, size_t errstr_size) {
  prosody_client_t *c;
  const char *mock_bootstrap;
  const char *source;

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
  if (c->st.src[PR_OPT_LOG] == PROSODY_CONFIG_SOURCE_SET)
    pr__log_set_level((pr__log_level_t)PR_CFG_ENUM(&c->st, LOG));

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
  c->conf = conf;
  PR_DEBUG("client", "client ready (bootstrap %s, source-system \"%s\")",
           c->bootstrap, c->source_system);
  return c;

fail_mock:
  if (PR_CFG_BOOL(&c->st, MOCK))
    pr__mock_release();
fail:
  free(c->source_system);
  free(c->bootstrap);
  pr__settings_fini(&c->st);
  free(c);
  return NULL;
}

PROSODY_EXPORT void prosody_client_destroy(prosody_client_t *c) {
  if (!c)
    return;
  pr__producer_destroy(c->producer);
  if (PR_CFG_BOOL(&c->st, MOCK))
    pr__mock_release();
  free(c->source_system);
  free(c->bootstrap);
  pr__settings_fini(&c->st);
  prosody_config_destroy(c->conf);
  free(c);
}

PROSODY_EXPORT const char *
prosody_client_source_system(const prosody_client_t *c) {
  return c ? c->source_system : NULL;
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
  return pr__producer_send(c->producer, topic, key, payload_json, trace, errstr,
                           errstr_size);
}

PROSODY_EXPORT prosody_err_t prosody_send_async(
    prosody_client_t *c, const char *topic, const char *key,
    const char *payload_json, const prosody_trace_t *trace, prosody_send_cb cb,
    void *opaque, char *errstr, size_t errstr_size) {
  if (!c) {
    pr__errf(errstr, errstr_size, "prosody_send_async: client is NULL");
    return PROSODY_ERR_INVALID_ARG;
  }
  return pr__producer_send_async(c->producer, topic, key, payload_json, trace,
                                 cb, opaque, errstr, errstr_size);
}

/* Internal: the client's producer, for tests (fault injection). */
pr__producer_t *pr__client_producer(prosody_client_t *c) { return c->producer; }
