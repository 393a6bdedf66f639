/*
 * test_mock_group_delay.c - prosody_mock_set_group_initial_rebalance_delay():
 *  - a value outside 0..=300000 ms is refused, naming the bound, and changes
 *    nothing; each accepted call reports the value it replaced, 3000 ms (the
 *    mock's own default) the first time;
 *  - it governs the first assignment of a new group: with 0 a lone member
 *    is assigned in well under the default's 3 s, and with the default back
 *    a new group waits the 3 s again (this is the contrast that shows the
 *    first check can fail).
 * Mock tier only: it is about the embedded mock cluster, whose 3 s wait
 * these scenarios keep at their start (T_GROUP_WAIT).
 */
#include "harness.h"

static prosody_result_t on_message(prosody_context_t *ctx,
                                   const prosody_message_t *m, void *op) {
  (void)ctx, (void)m, (void)op;
  return PROSODY_SUCCESS;
}

/* Seconds from subscribe until a lone member of a new group owns
 * partitions (at most 30). */
static double seconds_to_assignment(const char *prefix) {
  char err[1024];
  const char *topic = t_topic(prefix);
  prosody_client_t *c;
  prosody_handler_t h = {on_message, NULL, NULL, 0};
  double t0, took;

  t_create_topic(topic, 2);
  c = prosody_client_new(t_consumer_config(t_topic(prefix), topic), err,
                         sizeof(err));
  CHECK(c, "%s", err);
  t0 = t_now();
  CHECK_OK(prosody_subscribe(c, &h, err, sizeof(err)), err);
  while (prosody_assigned_partition_count(c) == 0 && t_now() - t0 < 30)
    usleep(10000);
  took = t_now() - t0;
  CHECK(prosody_assigned_partition_count(c) > 0,
        "no partition of %s assigned within 30 s", topic);
  CHECK_OK(prosody_unsubscribe(c), "unsubscribe");
  prosody_client_destroy(c);
  return took;
}

T_SCENARIO(out_of_range_refused_and_previous_reported, T_MOCK | T_GROUP_WAIT,
           30) {
  char err[512] = "";
  int previous = -1;

  CHECK(prosody_mock_set_group_initial_rebalance_delay(
            -1, &previous, err, sizeof(err)) == PROSODY_ERR_INVALID_ARG &&
            strstr(err, "0..=300000 ms, got -1") && previous == -1,
        "-1: \"%s\", previous %d", err, previous);
  CHECK(prosody_mock_set_group_initial_rebalance_delay(
            300001, NULL, err, sizeof(err)) == PROSODY_ERR_INVALID_ARG &&
            strstr(err, "got 300001"),
        "300001: \"%s\"", err);
  CHECK_OK(prosody_mock_set_group_initial_rebalance_delay(0, &previous, err,
                                                          sizeof(err)),
           err);
  CHECK(previous == 3000, "the first call replaced %d ms, not the mock's 3000",
        previous);
  CHECK_OK(prosody_mock_set_group_initial_rebalance_delay(300000, &previous,
                                                          err, sizeof(err)),
           err);
  CHECK(previous == 0, "replaced %d ms, not the 0 set before", previous);
  CHECK_OK(prosody_mock_set_group_initial_rebalance_delay(3000, NULL, err,
                                                          sizeof(err)),
           err);
  printf("ok\n");
  return 0;
}

T_SCENARIO(zero_assigns_a_lone_member_at_once_default_waits,
           T_MOCK | T_GROUP_WAIT, 90) {
  char err[512];
  double prompt, waited;

  CHECK_OK(
      prosody_mock_set_group_initial_rebalance_delay(0, NULL, err, sizeof(err)),
      err);
  prompt = seconds_to_assignment("delay-zero");
  CHECK(prompt < 2.5, "a lone member waited %.2f s with a delay of 0", prompt);
  CHECK_OK(prosody_mock_set_group_initial_rebalance_delay(3000, NULL, err,
                                                          sizeof(err)),
           err);
  waited = seconds_to_assignment("delay-default");
  CHECK(waited >= 2.9, "a lone member waited only %.2f s with the default",
        waited);
  printf("ok: assigned after %.2f s with 0, %.2f s with 3000 ms\n", prompt,
         waited);
  return 0;
}
