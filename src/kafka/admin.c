/*
 * admin.c - prosody_admin_*: create and delete topics.
 *
 * DESIGN: an admin handle owns one librdkafka producer-type handle used only
 * for the Admin API and metadata queries (never shared with a consumer:
 * librdkafka rule 6, docs/ARCHITECTURE.md). Against a real cluster,
 * CreateTopics/DeleteTopics results are awaited on a private queue; then
 * metadata is polled until every broker of the cluster has answered that
 * the topic shows every partition with a leader (or is gone), so callers
 * can produce or subscribe at once: a new topic reaches the brokers one by
 * one, and a producer that asks a broker still without it marks the topic
 * unknown and fails its records (librdkafka 2.0.2, whatever
 * topic.metadata.propagation.max.ms says). The handle keeps a connection
 * to every broker (enable.sparse.connections=false), and librdkafka sends
 * each metadata request to a random connected one, so the polls reach them
 * all. Against the
 * mock cluster, which has no admin protocol, topics are created with the
 * mock's own API (mock.c). Metadata is always requested for all topics: a
 * request naming an unknown topic would auto-create it on the mock.
 *
 * A prosody_admin_t is used from one thread at a time per call; its fields
 * are immutable after prosody_admin_new().
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../util/util.h"
#include "kafka.h"

#define DEFAULT_TIMEOUT_MS 30000

struct prosody_admin {
  prosody_config_t *conf; /* owned, taken at _new */
  pr__settings_t st;      /* resolved at _new, read-only */
  int mock;               /* use the mock cluster's API */
  rd_kafka_t *rk;         /* admin + metadata handle */
  char *bootstrap;        /* for messages */
  /* Written by error_cb, on the thread calling rd_kafka_poll(): */
  /* Every broker is unreachable: set on librdkafka's all-brokers-down
   * report (made once per transition, so it is a state kept across calls),
   * cleared by reach_cluster() when a broker answers; down_reports counts
   * the reports. */
  atomic_int all_down;
  atomic_int down_reports;
  pthread_mutex_t err_lock; /* guards last_error */
  char last_error[512];     /* the latest error-callback text (explained) */
};

static void admin_error_cb(rd_kafka_t *rk, int err, const char *reason,
                           void *opaque) {
  prosody_admin_t *admin = opaque;
  if (err == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN) {
    atomic_store(&admin->all_down, 1);
    atomic_fetch_add(&admin->down_reports, 1);
    return; /* "1/1 brokers are down": the error before it says why */
  }
  pthread_mutex_lock(&admin->err_lock);
  pr__kafka_explain(rk, reason, admin->last_error, sizeof(admin->last_error));
  pthread_mutex_unlock(&admin->err_lock);
}

PROSODY_EXPORT prosody_admin_t *
prosody_admin_new(prosody_config_t *conf, char *errstr, size_t errstr_size) {
  prosody_admin_t *admin;
  rd_kafka_conf_t *kconf;
  char *bootstrap = NULL;
  const char *mock_bootstrap = NULL;
  char why[512];

  if (!conf) {
    pr__errf(errstr, errstr_size, "prosody_admin_new: conf is NULL");
    return NULL;
  }
  admin = calloc(1, sizeof(*admin));
  if (!admin) {
    pr__errf(errstr, errstr_size, "out of memory");
    return NULL;
  }
  if (pr__settings_resolve(conf, &admin->st, errstr, errstr_size)) {
    free(admin);
    return NULL;
  }
  if (pr__settings_check_kafka(&admin->st, errstr, errstr_size))
    goto fail;
  admin->mock = PR_CFG_BOOL(&admin->st, MOCK);
  if (admin->mock) {
    if (pr__mock_acquire(&mock_bootstrap, errstr, errstr_size))
      goto fail;
    bootstrap = strdup(mock_bootstrap);
  } else {
    bootstrap = pr__join_list(PR_CFG(&admin->st, BOOTSTRAP_SERVERS).list,
                              PR_CFG(&admin->st, BOOTSTRAP_SERVERS).list_n);
  }
  if (!bootstrap) {
    pr__errf(errstr, errstr_size, "out of memory");
    goto fail_mock;
  }
  kconf = pr__kafka_conf_new(&admin->st, bootstrap, admin->mock, errstr,
                             errstr_size);
  admin->bootstrap = bootstrap;
  if (!kconf)
    goto fail_mock;
  pthread_mutex_init(&admin->err_lock, NULL);
  if (!admin->mock && pr__kafka_conf_set(kconf, "enable.sparse.connections",
                                         "false", why, sizeof(why))) {
    rd_kafka_conf_destroy(kconf);
    pr__errf(errstr, errstr_size, "admin configuration: %s", why);
    goto fail_mock;
  }
  rd_kafka_conf_set_error_cb(kconf, admin_error_cb);
  rd_kafka_conf_set_opaque(kconf, admin);
  admin->rk = pr__kafka_new(RD_KAFKA_PRODUCER, kconf, why, sizeof(why));
  if (!admin->rk) {
    rd_kafka_conf_destroy(kconf);
    pr__errf(errstr, errstr_size, "could not create the admin handle: %s", why);
    pthread_mutex_destroy(&admin->err_lock);
    goto fail_mock;
  }
  admin->conf = conf;
  return admin;

fail_mock:
  free(admin->bootstrap);
  if (admin->mock)
    pr__mock_release();
fail:
  pr__settings_fini(&admin->st);
  free(admin);
  return NULL;
}

PROSODY_EXPORT void prosody_admin_destroy(prosody_admin_t *admin) {
  if (!admin)
    return;
  pr__kafka_destroy_bounded(admin->rk, 30000, "admin");
  if (admin->mock)
    pr__mock_release();
  pthread_mutex_destroy(&admin->err_lock);
  free(admin->bootstrap);
  pr__settings_fini(&admin->st);
  prosody_config_destroy(admin->conf);
  free(admin);
}

/* How long a cluster that answers metadata may name a controller that is
 * not among its brokers before we conclude it cannot create topics. A real
 * cluster names one of its brokers in its first answer; a librdkafka mock
 * cluster is recognised at once by its cluster id (MOCK_CLUSTER_ID). */
#define NO_CONTROLLER_MS 1500

/* How long a call trusts an all-brokers-down state reported before it
 * began without a new report: long enough for a broker that has come back
 * (or that closed an idle connection) to answer. */
#define STALE_DOWN_MS 1000

/* The cluster id every librdkafka mock cluster reports ("mockCluster"
 * and a hex number: rd_kafka_mock_cluster_new() in librdkafka 2.0.2). */
#define MOCK_CLUSTER_ID "mockCluster"

/* The error for a cluster that has no admin API (UNSUPPORTED): what was
 * seen, and what to do instead. */
static prosody_err_t no_admin_api(prosody_admin_t *admin, const char *what,
                                  const char *name, const char *seen, int mock,
                                  char *errstr, size_t errstr_size) {
  pr__errf(errstr, errstr_size,
           "%s topic \"%s\": the cluster at %s %s, so it cannot create or "
           "delete topics; %s creates a topic on first use, with %d "
           "partitions (in the same process, mock=true creates and deletes "
           "topics through the mock's own API)",
           what, name, admin->bootstrap, seen,
           mock ? "it" : "a librdkafka mock cluster (such as `prosody broker`)",
           pr__mock_default_partitions());
  return PROSODY_ERR_UNSUPPORTED;
}

/*
 * Before a create or delete (real clusters only): waits until the cluster
 * names a controller, so that what cannot work fails at once with the
 * reason instead of at the end of the request's timeout. Errors: no broker
 * answers at the bootstrap address (TRANSIENT: librdkafka reports all
 * brokers down during the call, or still down after STALE_DOWN_MS), or the
 * cluster has no admin API (UNSUPPORTED): a librdkafka mock cluster (its
 * cluster id says so in the first answer; its controller id 0 is none of its
 * brokers, and admin requests wait for that controller for ever), or any
 * cluster that keeps naming a controller outside its brokers. Returns OK at the
 * deadline too, and while no controller is named (-1: a cluster electing one):
 * the request then reports its own timeout.
 */
static prosody_err_t reach_cluster(prosody_admin_t *admin, const char *what,
                                   const char *name, int64_t deadline,
                                   char *errstr, size_t errstr_size) {
  int64_t stray_since = 0, start = pr__now_ns();
  int32_t ctrl = -1;
  int reports = atomic_load(&admin->down_reports);
  while (pr__now_ns() < deadline) {
    const rd_kafka_metadata_t *md = NULL;
    int stray = 0;
    if (rd_kafka_metadata(admin->rk, 0, NULL, &md, 200) ==
            RD_KAFKA_RESP_ERR_NO_ERROR &&
        md->broker_cnt > 0) {
      char seen[128], *id;
      int mock;
      atomic_store(&admin->all_down, 0); /* a broker answers */
      id = rd_kafka_clusterid(admin->rk, 0);
      mock = id && !strncmp(id, MOCK_CLUSTER_ID, strlen(MOCK_CLUSTER_ID));
      if (mock)
        snprintf(seen, sizeof(seen),
                 "is a librdkafka mock cluster (id %s, such as `prosody "
                 "broker` runs)",
                 id);
      if (id)
        rd_kafka_mem_free(admin->rk, id);
      if (mock) {
        rd_kafka_metadata_destroy(md);
        return no_admin_api(admin, what, name, seen, 1, errstr, errstr_size);
      }
      ctrl = rd_kafka_controllerid(admin->rk, 0);
      stray = ctrl >= 0;
      for (int i = 0; stray && i < md->broker_cnt; i++)
        stray = md->brokers[i].id != ctrl;
      if (ctrl >= 0 && !stray) {
        rd_kafka_metadata_destroy(md);
        return PROSODY_OK;
      }
    }
    if (md)
      rd_kafka_metadata_destroy(md);
    if (!stray)
      stray_since = 0;
    else if (!stray_since)
      stray_since = pr__now_ns();
    rd_kafka_poll(admin->rk, 0); /* serves admin_error_cb */
    if (atomic_load(&admin->all_down) &&
        (atomic_load(&admin->down_reports) != reports ||
         pr__now_ns() - start > STALE_DOWN_MS * INT64_C(1000000))) {
      char last[512];
      pthread_mutex_lock(&admin->err_lock);
      memcpy(last, admin->last_error, sizeof(last));
      pthread_mutex_unlock(&admin->err_lock);
      pr__errf(errstr, errstr_size,
               "%s topic \"%s\": no Kafka broker answers at %s (%s)", what,
               name, admin->bootstrap, last);
      return PROSODY_ERR_TRANSIENT;
    }
    if (stray_since &&
        pr__now_ns() - stray_since > NO_CONTROLLER_MS * INT64_C(1000000)) {
      char seen[128];
      snprintf(seen, sizeof(seen),
               "names as its controller broker %d, which is none of its "
               "brokers",
               (int)ctrl);
      return no_admin_api(admin, what, name, seen, 0, errstr, errstr_size);
    }
    usleep(50000);
  }
  return PROSODY_OK;
}

/* Brokers whose metadata answered as awaited, by broker id. */
#define MAX_CONFIRM 64
typedef struct confirmed {
  int32_t id[MAX_CONFIRM];
  int n;
} confirmed_t;

static void confirm(confirmed_t *c, int32_t id) {
  for (int i = 0; i < c->n; i++)
    if (c->id[i] == id)
      return;
  if (c->n < MAX_CONFIRM)
    c->id[c->n++] = id;
}

/* 1 when every broker listed in `md` (the first MAX_CONFIRM) confirmed. */
static int all_confirmed(const confirmed_t *c,
                         const struct rd_kafka_metadata *md) {
  for (int b = 0; b < md->broker_cnt && b < MAX_CONFIRM; b++) {
    int found = 0;
    for (int i = 0; i < c->n && !found; i++)
      found = c->id[i] == md->brokers[b].id;
    if (!found)
      return 0;
  }
  return 1;
}

/* Partitions with a leader for `topic` in all-topics metadata: -1 when the
 * topic is absent (or reports an error), -2 when metadata failed. With
 * `done` (not NULL): the answering broker confirms when the topic is ready
 * with `want` partitions (0: any), or with `gone` absent; *done is set
 * once every broker of the cluster confirmed. */
static int topic_state(prosody_admin_t *admin, const char *topic,
                       int timeout_ms, int *ready, char *why, size_t why_size,
                       int want, int gone, confirmed_t *c, int *done) {
  const struct rd_kafka_metadata *md;
  rd_kafka_resp_err_t kerr;
  int count = -1;

  *ready = 0;
  kerr = rd_kafka_metadata(admin->rk, 1, NULL, &md, timeout_ms);
  if (kerr) {
    pr__errf(why, why_size, "metadata request failed: %s",
             rd_kafka_err2str(kerr));
    return -2;
  }
  for (int i = 0; i < md->topic_cnt; i++) {
    const struct rd_kafka_metadata_topic *t = &md->topics[i];
    if (strcmp(t->topic, topic))
      continue;
    if (t->err || (admin->mock && pr__mock_topic_deleted(topic)))
      break;
    count = t->partition_cnt;
    *ready = count > 0;
    for (int p = 0; p < t->partition_cnt; p++)
      if (t->partitions[p].err || t->partitions[p].leader < 0)
        *ready = 0;
    break;
  }
  if (done) {
    if (gone ? count == -1 : *ready && (want <= 0 || count == want))
      confirm(c, md->orig_broker_id);
    *done = c->n > 0 && all_confirmed(c, md);
    if (!*done && c->n > 0)
      pr__errf(why, why_size, "%d of %d brokers show it so far", c->n,
               md->broker_cnt);
  }
  rd_kafka_metadata_destroy(md);
  return count;
}

/* How long the other brokers get to answer once one showed the topic as
 * awaited: librdkafka picks the broker of each metadata request itself and
 * may keep asking the same one (seen once in 8 runs of the cluster tier),
 * so past this the topic is taken as propagated rather than the call
 * failing although the topic was made. */
#define PROPAGATION_WAIT_NS 5000000000LL

/* Polls metadata until every broker answered that the topic is ready with
 * `want` partitions (0: any), or, with `gone`, that it is absent; or until
 * one did and PROPAGATION_WAIT_NS passed. */
static prosody_err_t await_topic(prosody_admin_t *admin, const char *topic,
                                 int want, int gone, int64_t deadline,
                                 char *errstr, size_t errstr_size) {
  char why[256] = "";
  confirmed_t c = {.n = 0};
  int64_t first_ns = 0; /* when the first broker showed it */
  for (;;) {
    int64_t left_ms = (deadline - pr__now_ns()) / 1000000;
    int ready, done = 0;
    if (left_ms <= 0)
      break;
    topic_state(admin, topic, (int)(left_ms < 5000 ? left_ms : 5000), &ready,
                why, sizeof(why), want, gone, &c, &done);
    if (c.n > 0 && !first_ns)
      first_ns = pr__now_ns();
    if (done || (first_ns && pr__now_ns() - first_ns >= PROPAGATION_WAIT_NS))
      return PROSODY_OK;
    usleep(c.n ? 10000 : 50000);
  }
  pr__errf(errstr, errstr_size,
           "topic \"%s\" was %s but the cluster's metadata did not show it %s "
           "in time%s%s",
           topic, gone ? "deleted" : "created", gone ? "gone" : "ready",
           *why ? ": " : "", why);
  return PROSODY_ERR_TIMEOUT;
}

/* Runs one admin request on a private queue and returns the event. */
static rd_kafka_event_t *await_event(rd_kafka_queue_t *q, int64_t deadline) {
  rd_kafka_event_t *ev = NULL;
  while (!ev) {
    int64_t left_ms = (deadline - pr__now_ns()) / 1000000;
    if (left_ms <= 0)
      break;
    ev = rd_kafka_queue_poll(q, (int)(left_ms < 1000 ? left_ms : 1000));
  }
  return ev;
}

static prosody_err_t admin_options(prosody_admin_t *admin,
                                   rd_kafka_admin_op_t op, int timeout_ms,
                                   rd_kafka_AdminOptions_t **out, char *errstr,
                                   size_t errstr_size) {
  char why[256];
  rd_kafka_AdminOptions_t *o = rd_kafka_AdminOptions_new(admin->rk, op);
  if (!o ||
      rd_kafka_AdminOptions_set_request_timeout(o, timeout_ms, why,
                                                sizeof(why)) ||
      rd_kafka_AdminOptions_set_operation_timeout(o, timeout_ms, why,
                                                  sizeof(why))) {
    if (o)
      rd_kafka_AdminOptions_destroy(o);
    pr__errf(errstr, errstr_size, "could not set admin options: %s",
             o ? why : "out of memory");
    return PROSODY_ERR_NOMEM;
  }
  *out = o;
  return PROSODY_OK;
}

static prosody_err_t check_name(const char *name, char *errstr,
                                size_t errstr_size) {
  char why[256];
  if (!name || pr__topic_name_check(name, why, sizeof(why))) {
    pr__errf(errstr, errstr_size, "invalid topic: %s",
             name ? why : "name is NULL");
    return PROSODY_ERR_INVALID_ARG;
  }
  return PROSODY_OK;
}

PROSODY_EXPORT prosody_err_t prosody_admin_create_topic(
    prosody_admin_t *admin, const char *name,
    const prosody_topic_options_t *opts, char *errstr, size_t errstr_size) {
  prosody_topic_options_t o = PROSODY_TOPIC_OPTIONS_INIT;
  const pr__settings_t *st;
  char policy[32] = "", retention[32] = "", why[512];
  rd_kafka_NewTopic_t *nt = NULL;
  rd_kafka_AdminOptions_t *aopts = NULL;
  rd_kafka_queue_t *q = NULL;
  rd_kafka_event_t *ev = NULL;
  prosody_err_t err;
  int64_t deadline;

  if (!admin) {
    pr__errf(errstr, errstr_size, "admin is NULL");
    return PROSODY_ERR_INVALID_ARG;
  }
  if ((err = check_name(name, errstr, errstr_size)))
    return err;
  st = &admin->st;
  if (opts)
    o = *opts;
  if (o.partitions < 0 || o.replication_factor < 0 || o.retention_ms < -1 ||
      o.timeout_ms < 0 || o.timeout_ms > 3600000) {
    pr__errf(errstr, errstr_size,
             "invalid topic options for \"%s\": partitions and "
             "replication_factor must be >= 0, retention_ms >= -1 and "
             "timeout_ms from 0 (default) to 3600000",
             name);
    return PROSODY_ERR_INVALID_ARG;
  }
  /* Unset fields fall back to PROSODY_TOPIC_*, then the broker default. */
  if (o.partitions == 0 && PR_CFG_SET(st, TOPIC_PARTITIONS))
    o.partitions = (int32_t)PR_CFG_INT(st, TOPIC_PARTITIONS);
  if (o.replication_factor == 0 && PR_CFG_SET(st, TOPIC_REPLICATION_FACTOR))
    o.replication_factor = (int16_t)PR_CFG_INT(st, TOPIC_REPLICATION_FACTOR);
  if (o.cleanup_policy) {
    pr__value_t v;
    char why[512];
    /* The argument, not the variable, is what is wrong: name it. "none"
     * is the broker's default, as for the option. */
    if (pr__opt_parse(PR_OPT_TOPIC_CLEANUP_POLICY, o.cleanup_policy, 0, &v, why,
                      sizeof(why))) {
      pr__errf(errstr, errstr_size,
               "invalid cleanup_policy \"%s\" for topic \"%s\": expected %s "
               "(or NULL for topic_cleanup_policy's value)",
               o.cleanup_policy, name,
               pr__opt_accepted(PR_OPT_TOPIC_CLEANUP_POLICY));
      return PROSODY_ERR_INVALID_ARG;
    }
    if (v.isset)
      pr__opt_format(PR_OPT_TOPIC_CLEANUP_POLICY, &v, policy, sizeof(policy));
    pr__value_fini(PR_OPT_TOPIC_CLEANUP_POLICY, &v);
  } else if (PR_CFG_SET(st, TOPIC_CLEANUP_POLICY)) {
    pr__opt_format(PR_OPT_TOPIC_CLEANUP_POLICY,
                   &PR_CFG(st, TOPIC_CLEANUP_POLICY), policy, sizeof(policy));
  }
  if (o.retention_ms == 0 && PR_CFG_SET(st, TOPIC_RETENTION))
    o.retention_ms = PR_CFG_MS(st, TOPIC_RETENTION);
  if (o.retention_ms != 0)
    snprintf(retention, sizeof(retention), "%lld", (long long)o.retention_ms);
  if (o.timeout_ms == 0)
    o.timeout_ms = DEFAULT_TIMEOUT_MS;
  deadline = pr__now_ns() + o.timeout_ms * INT64_C(1000000);

  if (admin->mock) {
    /* The mock has one broker and no topic configs: the replication factor
     * is capped at 1 and cleanup policy / retention are not applied. */
    err = pr__mock_create_topic(name, o.partitions, errstr, errstr_size);
    if (err)
      return err;
    return await_topic(admin, name, 0, 0, deadline, errstr, errstr_size);
  }

  nt = rd_kafka_NewTopic_new(
      name, o.partitions > 0 ? o.partitions : -1,
      o.replication_factor > 0 ? o.replication_factor : -1, why, sizeof(why));
  if (!nt) {
    pr__errf(errstr, errstr_size, "invalid topic \"%s\": %s", name, why);
    return PROSODY_ERR_INVALID_ARG;
  }
  if ((*policy && rd_kafka_NewTopic_set_config(nt, "cleanup.policy", policy)) ||
      (*retention &&
       rd_kafka_NewTopic_set_config(nt, "retention.ms", retention))) {
    rd_kafka_NewTopic_destroy(nt);
    pr__errf(errstr, errstr_size, "could not set topic configs");
    return PROSODY_ERR_NOMEM;
  }
  err = reach_cluster(admin, "creating", name, deadline, errstr, errstr_size);
  if (err)
    goto done;
  err = admin_options(admin, RD_KAFKA_ADMIN_OP_CREATETOPICS, (int)o.timeout_ms,
                      &aopts, errstr, errstr_size);
  if (err)
    goto done;
  q = rd_kafka_queue_new(admin->rk);
  rd_kafka_CreateTopics(admin->rk, &nt, 1, aopts, q);
  ev = await_event(q, deadline);
  if (!ev) {
    err = PROSODY_ERR_TIMEOUT;
    pr__errf(errstr, errstr_size,
             "creating topic \"%s\": no answer from the cluster within %lld ms",
             name, (long long)o.timeout_ms);
  } else if (rd_kafka_event_error(ev)) {
    err = pr__kafka_classify(rd_kafka_event_error(ev));
    pr__errf(errstr, errstr_size, "creating topic \"%s\" failed: %s", name,
             rd_kafka_event_error_string(ev));
  } else {
    const rd_kafka_CreateTopics_result_t *res =
        rd_kafka_event_CreateTopics_result(ev);
    size_t n = 0;
    const rd_kafka_topic_result_t **tr =
        res ? rd_kafka_CreateTopics_result_topics(res, &n) : NULL;
    rd_kafka_resp_err_t kerr =
        n ? rd_kafka_topic_result_error(tr[0]) : RD_KAFKA_RESP_ERR__BAD_MSG;
    if (kerr) {
      err = pr__kafka_classify(kerr);
      if (err == PROSODY_ERR_TOPIC_EXISTS)
        pr__errf(errstr, errstr_size, "topic \"%s\" already exists", name);
      else
        pr__errf(errstr, errstr_size, "creating topic \"%s\" failed: %s", name,
                 n && rd_kafka_topic_result_error_string(tr[0])
                     ? rd_kafka_topic_result_error_string(tr[0])
                     : rd_kafka_err2str(kerr));
    }
  }
  if (!err)
    err = await_topic(admin, name, o.partitions, 0, deadline, errstr,
                      errstr_size);
done:
  if (ev)
    rd_kafka_event_destroy(ev);
  if (q)
    rd_kafka_queue_destroy(q);
  if (aopts)
    rd_kafka_AdminOptions_destroy(aopts);
  rd_kafka_NewTopic_destroy(nt);
  return err;
}

PROSODY_EXPORT prosody_err_t prosody_admin_delete_topic(prosody_admin_t *admin,
                                                        const char *name,
                                                        char *errstr,
                                                        size_t errstr_size) {
  rd_kafka_DeleteTopic_t *dt;
  rd_kafka_AdminOptions_t *aopts = NULL;
  rd_kafka_queue_t *q;
  rd_kafka_event_t *ev;
  prosody_err_t err;
  int64_t deadline = pr__now_ns() + DEFAULT_TIMEOUT_MS * INT64_C(1000000);
  char why[256];
  int ready;

  if (!admin) {
    pr__errf(errstr, errstr_size, "admin is NULL");
    return PROSODY_ERR_INVALID_ARG;
  }
  if ((err = check_name(name, errstr, errstr_size)))
    return err;

  if (admin->mock) {
    int n = topic_state(admin, name, 5000, &ready, why, sizeof(why), 0, 0, NULL,
                        NULL);
    if (n == -2) {
      pr__errf(errstr, errstr_size, "deleting topic \"%s\": %s", name, why);
      return PROSODY_ERR_TRANSIENT;
    }
    if (n == -1) {
      pr__errf(errstr, errstr_size, "topic \"%s\" does not exist", name);
      return PROSODY_ERR_UNKNOWN_TOPIC;
    }
    return pr__mock_delete_topic(name, errstr, errstr_size);
  }

  err = reach_cluster(admin, "deleting", name, deadline, errstr, errstr_size);
  if (err)
    return err;
  err = admin_options(admin, RD_KAFKA_ADMIN_OP_DELETETOPICS, DEFAULT_TIMEOUT_MS,
                      &aopts, errstr, errstr_size);
  if (err)
    return err;
  dt = rd_kafka_DeleteTopic_new(name);
  q = rd_kafka_queue_new(admin->rk);
  rd_kafka_DeleteTopics(admin->rk, &dt, 1, aopts, q);
  ev = await_event(q, deadline);
  if (!ev) {
    err = PROSODY_ERR_TIMEOUT;
    pr__errf(errstr, errstr_size,
             "deleting topic \"%s\": no answer from the cluster within %d ms",
             name, DEFAULT_TIMEOUT_MS);
  } else if (rd_kafka_event_error(ev)) {
    err = pr__kafka_classify(rd_kafka_event_error(ev));
    pr__errf(errstr, errstr_size, "deleting topic \"%s\" failed: %s", name,
             rd_kafka_event_error_string(ev));
  } else {
    const rd_kafka_DeleteTopics_result_t *res =
        rd_kafka_event_DeleteTopics_result(ev);
    size_t n = 0;
    const rd_kafka_topic_result_t **tr =
        res ? rd_kafka_DeleteTopics_result_topics(res, &n) : NULL;
    rd_kafka_resp_err_t kerr =
        n ? rd_kafka_topic_result_error(tr[0]) : RD_KAFKA_RESP_ERR__BAD_MSG;
    if (kerr) {
      err = pr__kafka_classify(kerr);
      if (err == PROSODY_ERR_UNKNOWN_TOPIC)
        pr__errf(errstr, errstr_size, "topic \"%s\" does not exist", name);
      else
        pr__errf(errstr, errstr_size, "deleting topic \"%s\" failed: %s", name,
                 rd_kafka_err2str(kerr));
    }
  }
  if (!err)
    err = await_topic(admin, name, 0, 1, deadline, errstr, errstr_size);
  if (ev)
    rd_kafka_event_destroy(ev);
  rd_kafka_queue_destroy(q);
  rd_kafka_AdminOptions_destroy(aopts);
  rd_kafka_DeleteTopic_destroy(dt);
  return err;
}
