/*
 * test_consume_faults.c - the consumer survives broker faults injected into
 * the mock cluster: the broker going down and coming back, and failing
 * Fetch and OffsetCommit requests. Every record is processed at least
 * once, no key skips ahead, and the committed offsets reach the end.
 */
#include <pthread.h>

#include "harness.h"
#include "kafka/kafka.h"

#define N 2000
#define KEYS 40

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int times[N]; /* guarded by lock */
static int distinct, gaps;
static char first_gap[160];

static prosody_result_t handle(prosody_context_t *ctx,
                               const prosody_message_t *m, void *op) {
  int k, seq;
  if (sscanf(prosody_message_payload(m), "{\"k\":%d,\"seq\":%d}", &k, &seq) !=
          2 ||
      seq < 0 || seq >= N)
    return PROSODY_PERMANENT;
  usleep(200);
  pthread_mutex_lock(&lock);
  for (int s = seq - KEYS; s >= 0; s -= KEYS)
    if (!times[s]) {
      if (!gaps++)
        snprintf(first_gap, sizeof(first_gap), "seq %d before seq %d", seq, s);
      break;
    }
  if (!times[seq]++)
    distinct++;
  pthread_mutex_unlock(&lock);
  return PROSODY_SUCCESS;
}

static void wait_processed(int want, double seconds) {
  int n = t_wait_locked(&lock, &distinct, want, seconds);
  CHECK(n >= want, "processed %d of %d", n, want);
}

T_SCENARIO(survives_broker_outage_and_request_errors, T_MOCK, 120) {
  char err[1024], topic[128], group[160];
  prosody_config_t *conf;
  prosody_client_t *c;
  prosody_handler_t h = {handle, NULL, NULL, 0};
  rd_kafka_mock_cluster_t *mc;
  int64_t committed[4], end[4];
  double deadline;
  int at_end = 0;

  snprintf(topic, sizeof(topic), "%s", t_topic("faults"));
  snprintf(group, sizeof(group), "%s-g", topic);
  t_create_topic(topic, 3);
  mc = pr__mock_cluster();
  CHECK(mc, "no mock cluster");
  t_produce(topic, 0, N / 2, KEYS);
  conf = t_consumer_config(group, topic);
  t_set(conf, "log", "error");
  c = prosody_client_new(conf, err, sizeof(err));
  CHECK(c, "%s", err);
  CHECK_OK(prosody_subscribe(c, &h, err, sizeof(err)), err);
  wait_processed(N / 8, 60);

  /* The only broker goes away for two seconds. */
  rd_kafka_mock_broker_set_down(mc, 1);
  usleep(2000000);
  rd_kafka_mock_broker_set_up(mc, 1);
  wait_processed(N / 2, 60);

  /* Fetch (ApiKey 1) and OffsetCommit (ApiKey 8) fail a few times. */
  rd_kafka_mock_push_request_errors(mc, 1, 3,
                                    RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION,
                                    RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT,
                                    RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION);
  rd_kafka_mock_push_request_errors(mc, 8, 3,
                                    RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT,
                                    RD_KAFKA_RESP_ERR_COORDINATOR_NOT_AVAILABLE,
                                    RD_KAFKA_RESP_ERR_NOT_COORDINATOR);
  t_produce(topic, N / 2, N, KEYS);
  wait_processed(N, 90);

  deadline = t_now() + 30;
  while (!at_end && t_now() < deadline) {
    int np = t_committed(group, topic, committed, end);
    at_end = 1;
    for (int p = 0; p < np; p++)
      at_end &= committed[p] == end[p];
    if (!at_end)
      usleep(200000);
  }
  CHECK(at_end, "committed offsets did not reach the end after the faults");
  CHECK_OK(prosody_unsubscribe(c), "unsubscribe");
  prosody_client_destroy(c);
  CHECK(gaps == 0, "%d ordering gaps; first: %s", gaps, first_gap);
  printf("ok: %d records through a broker outage and request errors\n", N);
  return 0;
}
