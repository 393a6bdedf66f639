/*
 * test_consume_order.c - the core promise: every record is processed, in
 * order per key, concurrently across keys, with out-of-order completion
 * (random handler delays), and the committed offsets end at the end of
 * every partition, and the assignment readings; apart, the consumer state
 * across subscribe and unsubscribe.
 */
#include <pthread.h>

#include "harness.h"

#define N 3000
#define KEYS 60

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static int last_seq[KEYS]; /* guarded by lock */
static int processed[N];   /* guarded by lock: times each seq ran */
static int distinct;       /* guarded by lock */
static int violations;     /* guarded by lock */
static char first_violation[256];

static prosody_result_t on_message(prosody_context_t *ctx,
                                   const prosody_message_t *msg, void *op) {
  int k, seq;
  char want[32];
  unsigned r = (unsigned)prosody_message_offset(msg) * 2654435761u;
  if (sscanf(prosody_message_payload(msg), "{\"k\":%d,\"seq\":%d}", &k, &seq) !=
          2 ||
      k < 0 || k >= KEYS || seq < 0 || seq >= N)
    return PROSODY_PERMANENT;
  snprintf(want, sizeof(want), "key-%d", k);
  if (r % 10 == 0) /* some handlers are slow: completion out of order */
    usleep(r % 3000);
  pthread_mutex_lock(&lock);
  if (strcmp(prosody_message_key(msg), want) || seq <= last_seq[k]) {
    if (!violations++)
      snprintf(first_violation, sizeof(first_violation),
               "key %s: seq %d after %d", prosody_message_key(msg), seq,
               last_seq[k]);
  }
  last_seq[k] = seq;
  if (!processed[seq]++)
    distinct++;
  pthread_cond_broadcast(&cond);
  pthread_mutex_unlock(&lock);
  return PROSODY_SUCCESS;
}

T_SCENARIO(every_record_once_in_key_order_committed_to_end, T_BOTH, 120) {
  char err[1024], group[128];
  const char *topic = t_topic("consume-order");
  prosody_config_t *conf;
  prosody_client_t *client;
  prosody_handler_t handler = {on_message, NULL, NULL, 0};
  int64_t committed[16], end[16];
  int np, done;
  double deadline;

  for (int k = 0; k < KEYS; k++)
    last_seq[k] = -1;
  snprintf(group, sizeof(group), "%s-group", topic);
  t_create_topic(topic, 4);
  t_produce(topic, 0, N, KEYS);

  conf = t_consumer_config(group, topic);
  t_set(conf, "max_concurrency", "8");
  client = prosody_client_new(conf, err, sizeof(err));
  CHECK(client, "client: %s", err);
  CHECK_OK(prosody_subscribe(client, &handler, err, sizeof(err)), err);

  deadline = t_now() + 60;
  pthread_mutex_lock(&lock);
  while (distinct < N && t_now() < deadline) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 1;
    pthread_cond_timedwait(&cond, &lock, &ts);
  }
  done = distinct;
  pthread_mutex_unlock(&lock);
  CHECK(done == N, "processed %d of %d records within 60 s", done, N);
  CHECK(prosody_assigned_partition_count(client) == 4,
        "%d partitions assigned, want 4",
        prosody_assigned_partition_count(client));
  CHECK(!prosody_is_stalled(client), "reported stalled");

  CHECK_OK(prosody_unsubscribe(client), "unsubscribe");
  prosody_client_destroy(client);

  CHECK(violations == 0, "%d per-key order violations, first: %s", violations,
        first_violation);
  for (int i = 0; i < N; i++)
    CHECK(processed[i] == 1, "record %d processed %d times", i, processed[i]);
  np = t_committed(group, topic, committed, end);
  for (int p = 0; p < np; p++)
    CHECK(committed[p] == end[p],
          "partition %d: committed %lld, end %lld (all processed)", p,
          (long long)committed[p], (long long)end[p]);
  printf("ok: %d records in per-key order over %d partitions, committed to "
         "the end\n",
         N, np);
  return 0;
}

/* The consumer's state across subscribe and unsubscribe; each refused a
 * second time. */
T_SCENARIO(state_follows_subscribe_and_unsubscribe_each_refused_twice, T_BOTH,
           60) {
  char err[1024], group[128];
  const char *topic = t_topic("consume-state");
  prosody_config_t *conf;
  prosody_client_t *client;
  prosody_handler_t handler = {on_message, NULL, NULL, 0};

  snprintf(group, sizeof(group), "%s-group", topic);
  t_create_topic(topic, 1);
  conf = t_consumer_config(group, topic);
  client = prosody_client_new(conf, err, sizeof(err));
  CHECK(client, "client: %s", err);
  CHECK(!strcmp(prosody_consumer_state(client), "configured"), "state %s",
        prosody_consumer_state(client));
  CHECK_OK(prosody_subscribe(client, &handler, err, sizeof(err)), err);
  CHECK(!strcmp(prosody_consumer_state(client), "running"), "state %s",
        prosody_consumer_state(client));
  CHECK(prosody_subscribe(client, &handler, err, sizeof(err)) ==
            PROSODY_ERR_STATE,
        "second subscribe accepted");
  CHECK_OK(prosody_unsubscribe(client), "unsubscribe");
  CHECK(!strcmp(prosody_consumer_state(client), "configured"), "state %s",
        prosody_consumer_state(client));
  CHECK(prosody_unsubscribe(client) == PROSODY_ERR_STATE,
        "second unsubscribe accepted");
  prosody_client_destroy(client);
  return 0;
}
