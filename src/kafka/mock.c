/*
 * mock.c - the process-wide embedded mock Kafka cluster.
 *
 * DESIGN: one librdkafka mock cluster per process, shared by every
 * `mock=true` client and admin handle, so that what one client sends another
 * reads. It is created on first use on a dedicated owner handle and lives
 * until process exit (an atexit handler destroys it, cluster before owner,
 * when no handle still holds a reference), so data survives between clients
 * the way it would on a broker. All state below is guarded by `lock`.
 *
 * The 2.0.2 mock has no CreateTopics/DeleteTopics: topics are created with
 * rd_kafka_mock_topic_create() (on first use by a client, or by the admin
 * API), and "deleted" topics are made to answer UNKNOWN_TOPIC_OR_PART.
 *
 * The wait before the first assignment of an empty group (a broker's
 * group.initial.rebalance.delay.ms) is the mock's default, 3 s, unless
 * prosody_mock_set_group_initial_rebalance_delay() changed it; the value is
 * kept here so that a cluster started after the call gets it too.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "../util/util.h"
#include "kafka.h"

#define MOCK_BROKERS 1
/* The partitions of a topic created without a count. The same as the
 * librdkafka mock's own default (fixed at 4 in 2.0.2, no setter), which
 * applies to topics a client of another process's mock cluster creates on
 * first use (`prosody broker`): test_bad_bootstrap checks the two agree. */
#define MOCK_DEFAULT_PARTITIONS 4
/* The mock's own group.initial.rebalance.delay.ms (librdkafka's default,
 * which is Kafka's), and the most that
 * prosody_mock_set_group_initial_rebalance_delay() accepts: five minutes,
 * beyond any test's need, so that a value in the wrong unit is refused. */
#define MOCK_GROUP_DELAY_DEFAULT_MS 3000
#define MOCK_GROUP_DELAY_MAX_MS 300000

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static rd_kafka_t *owner;           /* guarded by lock */
static rd_kafka_mock_cluster_t *mc; /* guarded by lock */
static char *bootstraps;            /* guarded by lock */
static int refs;                    /* guarded by lock */
static int atexit_registered;       /* guarded by lock */
static pr__strset_t known;          /* topics created; guarded by lock */
static pr__strset_t deleted;        /* topics "deleted"; guarded by lock */
static int group_delay_ms = MOCK_GROUP_DELAY_DEFAULT_MS; /* guarded by lock */

static void mock_shutdown(void) {
  pthread_mutex_lock(&lock);
  if (mc && refs == 0) {
    rd_kafka_mock_cluster_destroy(mc);
    mc = NULL;
    pr__kafka_destroy_bounded(owner, 10000, "mock cluster owner");
    owner = NULL;
    free(bootstraps);
    bootstraps = NULL;
    pr__strset_clear(&known);
    pr__strset_clear(&deleted);
  }
  pthread_mutex_unlock(&lock);
}

/* Starts the cluster; called with lock held. */
static prosody_err_t start_locked(char *errstr, size_t errstr_size) {
  rd_kafka_conf_t *kconf;
  char why[512];

  if (mc)
    return PROSODY_OK;
  kconf = pr__kafka_conf_new(NULL, NULL, 1, errstr, errstr_size);
  if (!kconf)
    return PROSODY_ERR_TRANSIENT;
  /* The owner never connects anywhere: keep its "no bootstrap.servers"
   * notice out of the log, but let the mock's warnings through. */
  if (pr__kafka_conf_set(kconf, "log_level", "4", errstr, errstr_size)) {
    rd_kafka_conf_destroy(kconf);
    return PROSODY_ERR_TRANSIENT;
  }
  owner = rd_kafka_new(RD_KAFKA_PRODUCER, kconf, why, sizeof(why));
  if (!owner) {
    rd_kafka_conf_destroy(kconf);
    pr__errf(errstr, errstr_size,
             "could not create the mock cluster's owner handle: %s", why);
    return PROSODY_ERR_TRANSIENT;
  }
  mc = rd_kafka_mock_cluster_new(owner, MOCK_BROKERS);
  if (!mc) {
    pr__kafka_destroy_bounded(owner, 10000, "mock cluster owner");
    owner = NULL;
    pr__errf(errstr, errstr_size, "could not start the mock Kafka cluster");
    return PROSODY_ERR_TRANSIENT;
  }
  rd_kafka_mock_group_initial_rebalance_delay_ms(mc, group_delay_ms);
  bootstraps = strdup(rd_kafka_mock_cluster_bootstraps(mc));
  if (!bootstraps) {
    rd_kafka_mock_cluster_destroy(mc);
    mc = NULL;
    pr__kafka_destroy_bounded(owner, 10000, "mock cluster owner");
    owner = NULL;
    pr__errf(errstr, errstr_size, "out of memory");
    return PROSODY_ERR_NOMEM;
  }
  if (!atexit_registered) {
    atexit(mock_shutdown);
    atexit_registered = 1;
  }
  PR_DEBUG("mock", "mock Kafka cluster listening on %s", bootstraps);
  return PROSODY_OK;
}

prosody_err_t pr__mock_acquire(const char **out, char *errstr,
                               size_t errstr_size) {
  prosody_err_t err;
  pthread_mutex_lock(&lock);
  err = start_locked(errstr, errstr_size);
  if (!err) {
    refs++;
    *out = bootstraps;
  }
  pthread_mutex_unlock(&lock);
  return err;
}

void pr__mock_release(void) {
  pthread_mutex_lock(&lock);
  if (refs > 0)
    refs--;
  pthread_mutex_unlock(&lock);
}

rd_kafka_mock_cluster_t *pr__mock_cluster(void) {
  rd_kafka_mock_cluster_t *c;
  pthread_mutex_lock(&lock);
  c = mc;
  pthread_mutex_unlock(&lock);
  return c;
}

prosody_err_t pr__mock_ensure_topic(const char *topic, char *errstr,
                                    size_t errstr_size) {
  prosody_err_t err = PROSODY_OK;
  rd_kafka_resp_err_t kerr;

  pthread_mutex_lock(&lock);
  if (!mc) {
    err = PROSODY_ERR_STATE;
    pr__errf(errstr, errstr_size, "the mock cluster is not running");
  } else if (pr__strset_find(&known, topic) < 0) {
    kerr = rd_kafka_mock_topic_create(mc, topic, MOCK_DEFAULT_PARTITIONS, 1);
    if (kerr && kerr != RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS) {
      err = pr__kafka_classify(kerr);
      pr__errf(errstr, errstr_size,
               "could not create topic \"%s\" on the mock cluster: %s", topic,
               rd_kafka_err2str(kerr));
    } else if (pr__strset_add(&known, topic)) {
      err = PROSODY_ERR_NOMEM;
      pr__errf(errstr, errstr_size, "out of memory");
    }
  }
  pthread_mutex_unlock(&lock);
  return err;
}

prosody_err_t pr__mock_create_topic(const char *topic, int partitions,
                                    char *errstr, size_t errstr_size) {
  prosody_err_t err = PROSODY_OK;
  rd_kafka_resp_err_t kerr;
  int i;

  pthread_mutex_lock(&lock);
  if (!mc) {
    pthread_mutex_unlock(&lock);
    pr__errf(errstr, errstr_size, "the mock cluster is not running");
    return PROSODY_ERR_STATE;
  }
  i = pr__strset_find(&deleted, topic);
  if (i >= 0) {
    /* The mock cannot drop a topic's data: "re-creating" a deleted topic
     * makes it visible again with its previous partitions. */
    rd_kafka_mock_topic_set_error(mc, topic, RD_KAFKA_RESP_ERR_NO_ERROR);
    pr__strset_remove(&deleted, (size_t)i);
  } else {
    kerr = rd_kafka_mock_topic_create(
        mc, topic, partitions > 0 ? partitions : MOCK_DEFAULT_PARTITIONS, 1);
    if (kerr) {
      err = pr__kafka_classify(kerr);
      if (err == PROSODY_ERR_TOPIC_EXISTS)
        pr__errf(errstr, errstr_size, "topic \"%s\" already exists", topic);
      else
        pr__errf(errstr, errstr_size,
                 "could not create topic \"%s\" on the mock cluster: %s", topic,
                 rd_kafka_err2str(kerr));
    } else if (pr__strset_find(&known, topic) < 0 &&
               pr__strset_add(&known, topic)) {
      err = PROSODY_ERR_NOMEM;
      pr__errf(errstr, errstr_size, "out of memory");
    }
  }
  pthread_mutex_unlock(&lock);
  return err;
}

prosody_err_t pr__mock_delete_topic(const char *topic, char *errstr,
                                    size_t errstr_size) {
  prosody_err_t err = PROSODY_OK;
  pthread_mutex_lock(&lock);
  if (!mc) {
    err = PROSODY_ERR_STATE;
    pr__errf(errstr, errstr_size, "the mock cluster is not running");
  } else if (pr__strset_find(&deleted, topic) < 0) {
    if (pr__strset_add(&deleted, topic)) {
      err = PROSODY_ERR_NOMEM;
      pr__errf(errstr, errstr_size, "out of memory");
    } else {
      rd_kafka_mock_topic_set_error(mc, topic,
                                    RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART);
    }
  }
  pthread_mutex_unlock(&lock);
  return err;
}

int pr__mock_topic_deleted(const char *topic) {
  int found;
  pthread_mutex_lock(&lock);
  found = pr__strset_find(&deleted, topic) >= 0;
  pthread_mutex_unlock(&lock);
  return found;
}

PROSODY_EXPORT prosody_err_t prosody_mock_bootstrap_servers(
    char *buf, size_t buf_size, char *errstr, size_t errstr_size) {
  prosody_err_t err;
  if (!buf || buf_size == 0) {
    pr__errf(errstr, errstr_size, "no output buffer");
    return PROSODY_ERR_INVALID_ARG;
  }
  pthread_mutex_lock(&lock);
  err = start_locked(errstr, errstr_size);
  if (!err && strlen(bootstraps) >= buf_size) {
    err = PROSODY_ERR_INVALID_ARG;
    pr__errf(errstr, errstr_size, "buffer of %zu bytes is too small for \"%s\"",
             buf_size, bootstraps);
  } else if (!err) {
    memcpy(buf, bootstraps, strlen(bootstraps) + 1);
  }
  pthread_mutex_unlock(&lock);
  return err;
}

PROSODY_EXPORT prosody_err_t prosody_mock_set_group_initial_rebalance_delay(
    int delay_ms, int *previous_ms, char *errstr, size_t errstr_size) {
  if (delay_ms < 0 || delay_ms > MOCK_GROUP_DELAY_MAX_MS) {
    pr__errf(errstr, errstr_size,
             "the mock cluster's group initial rebalance delay must be "
             "0..=%d ms, got %d",
             MOCK_GROUP_DELAY_MAX_MS, delay_ms);
    return PROSODY_ERR_INVALID_ARG;
  }
  pthread_mutex_lock(&lock);
  if (previous_ms)
    *previous_ms = group_delay_ms;
  group_delay_ms = delay_ms;
  if (mc)
    rd_kafka_mock_group_initial_rebalance_delay_ms(mc, delay_ms);
  pthread_mutex_unlock(&lock);
  return PROSODY_OK;
}

int pr__mock_default_partitions(void) { return MOCK_DEFAULT_PARTITIONS; }
