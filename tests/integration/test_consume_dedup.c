/*
 * test_consume_dedup.c - deduplication (pipeline mode): payloads with the
 * same "id" on the same key reach the handler once, within a batch (the
 * duplicate queued behind its original), across a restart of the consumer
 * (another client of the group: the id comes from the store, Cassandra in
 * the real tier, since the process-wide cache holds one id here), with
 * the id written with escapes; the same id on another key is another
 * event; a record without "id" is its own event. A permanent failure is
 * recorded like a success, a transient one is not (its retry runs).
 * Low-latency mode does not deduplicate.
 */
#include <pthread.h>
#include <stdatomic.h>

#include "harness.h"

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int handled[64]; /* guarded by lock: calls per "n" */
static atomic_int calls;

static prosody_result_t on_message(prosody_context_t *ctx,
                                   const prosody_message_t *m, void *op) {
  const char *p = prosody_message_payload(m);
  const char *n = strstr(p, "\"n\":");
  int i = n ? atoi(n + 4) : 0, first;
  (void)ctx;
  (void)op;
  pthread_mutex_lock(&lock);
  first = i > 0 && i < 64 && handled[i]++ == 0;
  pthread_mutex_unlock(&lock);
  atomic_fetch_add(&calls, 1);
  if (strstr(p, "\"fail\":\"permanent\""))
    return PROSODY_PERMANENT;
  if (first && strstr(p, "\"fail\":\"transient-once\""))
    return PROSODY_TRANSIENT;
  return PROSODY_SUCCESS;
}

static void send_all(const char *topic, const char *const *kv) {
  char err[1024];
  prosody_config_t *conf = t_config();
  prosody_client_t *c;
  t_set(conf, "source_system", "test-producer");
  c = prosody_client_new(conf, err, sizeof(err));
  CHECK(c, "producer: %s", err);
  for (int i = 0; kv[i]; i += 2)
    CHECK_OK(prosody_send_async(c, topic, kv[i], kv[i + 1], NULL, t_ignore_cb,
                                NULL, err, sizeof(err)),
             err);
  prosody_client_destroy(c);
  CHECK(t_send_failures == 0, "%d sends failed", t_send_failures);
}

static prosody_client_t *consume(const char *topic, const char *group,
                                 const char *mode) {
  char err[1024];
  prosody_config_t *conf = t_consumer_config(group, topic);
  prosody_handler_t h = {on_message, NULL, NULL, 0};
  prosody_client_t *c;
  t_set(conf, "mode", mode);
  if (!strcmp(mode, "low-latency"))
    t_set(conf, "failure_topic", "dedup-failures");
  t_set(conf, "idempotence_cache_size", "1");
  t_set(conf, "retry_base", "10ms");
  /* A transient failure is retried in place, so a partition committed to
   * its end is a partition handled (deferral commits a failing message
   * first and retries it later: test_consume_defer.c). */
  t_set(conf, "defer_enabled", "false");
  c = prosody_client_new(conf, err, sizeof(err));
  CHECK(c, "client: %s", err);
  CHECK_OK(prosody_subscribe(c, &h, err, sizeof(err)), err);
  return c;
}

static void drain(prosody_client_t *c, const char *group, const char *topic) {
  int64_t committed[4], end[4];
  CHECK(t_wait_committed(group, topic, ~0u, committed, end, 60),
        "committed %lld/%lld of %lld/%lld", (long long)committed[0],
        (long long)committed[1], (long long)end[0], (long long)end[1]);
  CHECK_OK(prosody_unsubscribe(c), "unsubscribe");
  prosody_client_destroy(c);
}

/* Every n in 1..63 was handled want[n] times. */
static void expect(const int *want, const char *phase) {
  pthread_mutex_lock(&lock);
  for (int i = 1; i < 64; i++)
    CHECK(handled[i] == want[i], "%s: n=%d handled %d time(s), want %d", phase,
          i, handled[i], want[i]);
  pthread_mutex_unlock(&lock);
}

static const char *round1[] = {
    "A", "{\"id\":\"x\",\"n\":1}",
    "A", "{\"id\":\"x\",\"n\":2}", /* duplicate, queued behind n=1 */
    "A", "{\"id\":\"y\",\"n\":3}",
    "B", "{\"id\":\"x\",\"n\":4}",                              /* other key */
    "A", "{\"n\":5}",                                           /* no id */
    "A", "{\"n\":6,\"id\":\"\\u0078\"}",                        /* "x" again */
    "B", "{\"id\":\"x\",\"n\":7}",                              /* duplicate */
    "D", "{\"id\":\"p\",\"fail\":\"permanent\",\"n\":8}",       /* recorded */
    "D", "{\"id\":\"p\",\"n\":9}",                              /* duplicate */
    "E", "{\"id\":\"t\",\"fail\":\"transient-once\",\"n\":10}", /* retried */
    "E", "{\"id\":\"t\",\"n\":11}",                             /* duplicate */
    "F", "{\"id\":{\"not\":\"a string\"},\"n\":12}",            /* no id */
    "F", "{\"id\":{\"not\":\"a string\"},\"n\":13}",
    NULL};
static const char *round2[] = {
    "A", "{\"id\":\"x\",\"n\":20}", /* handled before the restart */
    "A", "{\"id\":\"z\",\"n\":21}", "C", "{\"id\":\"x\",\"n\":22}",
    "D", "{\"id\":\"p\",\"n\":23}", /* its permanent failure counts */
    NULL};
static const char *lowlat[] = {"A", "{\"id\":\"x\",\"n\":30}", "A",
                               "{\"id\":\"x\",\"n\":31}", NULL};

/* Round 1 on a fresh topic and group, drained; `want` holds the calls
 * expected per "n". */
static void round_one(const char *topic, const char *group, int *want) {
  prosody_client_t *c;
  t_create_topic(topic, 2);
  send_all(topic, round1);
  c = consume(topic, group, "pipeline");
  drain(c, group, topic);
  want[1] = want[3] = want[4] = want[5] = want[8] = 1;
  want[10] = 2; /* failed once, then succeeded: one event, two attempts */
  want[12] = want[13] = 1;
  expect(want, "one consumer");
}

T_SCENARIO(duplicate_id_handled_once_per_key_within_a_batch, T_BOTH, 90) {
  char topic[128], group[160];
  int want[64] = {0};
  snprintf(topic, sizeof(topic), "%s", t_topic("dedup"));
  snprintf(group, sizeof(group), "%s-g", topic);
  round_one(topic, group, want);
  return 0;
}

/* Another client of the group (a restart): the ids handled before come
 * from the store (the process-wide cache holds one id). */
T_SCENARIO(duplicate_id_skipped_after_restart_from_store, T_BOTH, 120) {
  char topic[128], group[160];
  int want[64] = {0};
  prosody_client_t *c;
  snprintf(topic, sizeof(topic), "%s", t_topic("dedup-restart"));
  snprintf(group, sizeof(group), "%s-g", topic);
  round_one(topic, group, want);
  send_all(topic, round2);
  c = consume(topic, group, "pipeline");
  drain(c, group, topic);
  want[21] = want[22] = 1;
  expect(want, "after a restart");
  return 0;
}

/* Low-latency mode has no dedup layer. */
T_SCENARIO(low_latency_mode_keeps_duplicates, T_BOTH, 60) {
  char topic2[128], group2[160];
  int want[64] = {0};
  prosody_client_t *c;
  snprintf(topic2, sizeof(topic2), "%s", t_topic("dedup-ll"));
  snprintf(group2, sizeof(group2), "%s-g", topic2);
  t_create_topic(topic2, 1);
  send_all(topic2, lowlat);
  c = consume(topic2, group2, "low-latency");
  drain(c, group2, topic2);
  want[30] = want[31] = 1;
  expect(want, "low-latency mode");
  return 0;
}
