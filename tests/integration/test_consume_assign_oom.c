/*
 * test_consume_assign_oom.c - a partition the engine cannot allocate when
 * it is assigned is not skipped: the assignment is retried until it fits,
 * and every record of every partition is handled and committed. The
 * allocation failures are injected with an internal test option (the
 * first two partitions taken fail, as when out of memory).
 */
#include <pthread.h>
#include <stdatomic.h>

#include "config/config.h"
#include "harness.h"

#define N 600
#define KEYS 30

static atomic_int seen[N];
static atomic_int distinct;

static prosody_result_t handle(prosody_context_t *ctx,
                               const prosody_message_t *m, void *op) {
  int k, seq;
  (void)ctx;
  (void)op;
  if (sscanf(prosody_message_payload(m), "{\"k\":%d,\"seq\":%d}", &k, &seq) !=
          2 ||
      seq < 0 || seq >= N)
    return PROSODY_PERMANENT;
  if (atomic_fetch_add(&seen[seq], 1) == 0)
    atomic_fetch_add(&distinct, 1);
  return PROSODY_SUCCESS;
}

T_SCENARIO(failed_partition_allocation_retried_until_all_handled, T_MOCK, 60) {
  char err[1024], topic[128], group[160];
  prosody_config_t *conf;
  prosody_client_t *c;
  prosody_handler_t h = {handle, NULL, NULL, 0};
  pr__test_opts_t test = {.fail_part_new = 2};
  int64_t committed[8], end[8];

  snprintf(topic, sizeof(topic), "%s", t_topic("assign-oom"));
  snprintf(group, sizeof(group), "%s-g", topic);
  t_create_topic(topic, 3);
  t_produce(topic, 0, N, KEYS);
  conf = t_consumer_config(group, topic);
  t_set(conf, "log", "off");
  pr__config_set_test(conf, &test);
  c = prosody_client_new(conf, err, sizeof(err));
  CHECK(c, "%s", err);
  CHECK_OK(prosody_subscribe(c, &h, err, sizeof(err)), err);
  CHECK(t_wait_at_least(&distinct, N, 60), "handled %d of %d records",
        atomic_load(&distinct), N);
  CHECK(prosody_assigned_partition_count(c) == 3, "%d partitions assigned",
        prosody_assigned_partition_count(c));
  CHECK(t_wait_committed(group, topic, ~0u, committed, end, 30),
        "committed offsets did not reach the end");
  CHECK_OK(prosody_unsubscribe(c), "unsubscribe");
  prosody_client_destroy(c);
  printf("ok: %d records on 3 partitions after two failed allocations\n", N);
  return 0;
}
