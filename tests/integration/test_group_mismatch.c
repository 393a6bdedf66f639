/*
 * test_group_mismatch.c - two members of one group whose assignment
 * strategies cannot agree (range against cooperative-sticky): the broker
 * refuses the second one's join. That member reports it as an error that
 * names the group and the strategy on both sides, and the first member
 * keeps every partition and goes on handling records.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char mismatch[2048]; /* the first matching error line; under lock */
static atomic_int handled;

static void on_log(prosody_log_level_t level, const char *subsystem,
                   const char *message, void *opaque) {
  const char *group = opaque;
  if (level != PROSODY_LOG_ERROR || !strstr(message, group) ||
      !strstr(message, "inconsistent group protocol"))
    return;
  pthread_mutex_lock(&lock);
  if (!mismatch[0])
    snprintf(mismatch, sizeof(mismatch), "%s", message);
  pthread_mutex_unlock(&lock);
}

static prosody_result_t on_message(prosody_context_t *ctx,
                                   const prosody_message_t *m, void *op) {
  atomic_fetch_add(&handled, 1);
  return PROSODY_SUCCESS;
}

static prosody_client_t *member(const char *topic, const char *group,
                                const char *strategy) {
  char err[1024];
  prosody_handler_t h = {on_message, NULL, NULL, 0};
  prosody_config_t *conf = t_consumer_config(group, topic);
  prosody_client_t *c;
  t_set(conf, "partition_assignment_strategy", strategy);
  prosody_config_set_log_cb(conf, on_log, (void *)group);
  c = prosody_client_new(conf, err, sizeof(err));
  CHECK(c, "client: %s", err);
  CHECK_OK(prosody_subscribe(c, &h, err, sizeof(err)), err);
  return c;
}

T_SCENARIO(mismatched_strategy_refused_first_member_undisturbed, T_REAL, 120) {
  char topic[128], group[160], line[2048];
  prosody_client_t *a, *b;
  double t0;

  snprintf(topic, sizeof(topic), "%s", t_topic("mismatch"));
  snprintf(group, sizeof(group), "%s-g", topic);
  t_create_topic(topic, 2);
  t_produce(topic, 0, 100, 10);

  a = member(topic, group, "cooperative-sticky");
  CHECK(t_wait_at_least(&handled, 100, 60), "A handled %d of 100",
        atomic_load(&handled));
  b = member(topic, group, "range");
  t0 = t_now();
  for (;;) {
    pthread_mutex_lock(&lock);
    snprintf(line, sizeof(line), "%s", mismatch);
    pthread_mutex_unlock(&lock);
    if (line[0])
      break;
    CHECK(t_now() - t0 < 60, "no error about the refused join within 60 s");
    usleep(20000);
  }
  printf("B reported: %s\n", line);
  CHECK(strstr(line, "offers range"), "the error names B's strategy: %s", line);
  CHECK(strstr(line, "use cooperative-sticky"),
        "the error names the group's strategy: %s", line);
  CHECK(prosody_assigned_partition_count(b) == 0, "B holds %d partitions",
        prosody_assigned_partition_count(b));
  /* A was not disturbed: it holds both partitions and handles new records. */
  t_produce(topic, 100, 200, 10);
  CHECK(t_wait_at_least(&handled, 200, 60), "A handled %d of 200",
        atomic_load(&handled));
  CHECK(prosody_assigned_partition_count(a) == 2, "A holds %d partitions",
        prosody_assigned_partition_count(a));
  CHECK_OK(prosody_unsubscribe(b), "B leaves");
  prosody_client_destroy(b);
  CHECK_OK(prosody_unsubscribe(a), "A leaves");
  prosody_client_destroy(a);
  printf("ok\n");
  return 0;
}
