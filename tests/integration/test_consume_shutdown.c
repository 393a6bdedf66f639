/*
 * test_consume_shutdown.c - cancellation and shutdown:
 *  - a handler over its `timeout` sees should_cancel/wait_cancel fire;
 *  - unsubscribe lets running handlers run until 80% of shutdown_timeout,
 *    then cancels them, and returns within the budget;
 *  - the aborted record is not committed, and the group redelivers it (and
 *    what queued behind it) to the next consumer.
 */
#include <pthread.h>
#include <stdatomic.h>

#include "harness.h"

static atomic_int others, stuck_started, redelivered;
static atomic_llong cancel_seen_ns;
static atomic_llong timeout_elapsed_us = -1; /* set by the handler */

static prosody_result_t slow(prosody_context_t *ctx, const prosody_message_t *m,
                             void *op) {
  double t0 = t_now();
  int cancelled = prosody_wait_cancel(ctx, 5000);
  if (cancelled && prosody_should_cancel(ctx))
    atomic_store(&timeout_elapsed_us, (long long)((t_now() - t0) * 1e6));
  return PROSODY_SUCCESS;
}

/* Attempt 1 outlives its timeout and fails; attempt 2 must start with a
 * fresh, uncancelled context. */
static atomic_int attempts, second_was_cancelled = -1;
static prosody_result_t times_out_once(prosody_context_t *ctx,
                                       const prosody_message_t *m, void *op) {
  if (atomic_fetch_add(&attempts, 1) == 0) {
    prosody_wait_cancel(ctx, 5000);
    return PROSODY_TRANSIENT;
  }
  atomic_store(&second_was_cancelled, prosody_should_cancel(ctx));
  return PROSODY_SUCCESS;
}

static prosody_result_t stuck(prosody_context_t *ctx,
                              const prosody_message_t *m, void *op) {
  if (!strcmp(prosody_message_key(m), "key-0")) {
    atomic_store(&stuck_started, 1);
    prosody_wait_cancel(ctx, -1);
    atomic_store(&cancel_seen_ns, t_mono_ns());
    return PROSODY_TRANSIENT; /* aborted: shutdown makes it terminal */
  }
  atomic_fetch_add(&others, 1);
  return PROSODY_SUCCESS;
}

static prosody_result_t second(prosody_context_t *ctx,
                               const prosody_message_t *m, void *op) {
  if (!strcmp(prosody_message_key(m), "key-0"))
    atomic_fetch_add(&redelivered, 1);
  return PROSODY_SUCCESS;
}

/* Handler timeout. */
T_SCENARIO(handler_over_timeout_sees_cancellation, T_BOTH, 60) {
  char err[1024], t2[128], g2[160];
  prosody_config_t *conf;
  prosody_client_t *c;

  snprintf(t2, sizeof(t2), "%s", t_topic("shutdown-timeout"));
  snprintf(g2, sizeof(g2), "%s-g", t2);
  t_create_topic(t2, 1);
  t_produce(t2, 0, 1, 1);
  conf = t_consumer_config(g2, t2);
  t_set(conf, "timeout", "300ms");
  c = prosody_client_new(conf, err, sizeof(err));
  CHECK(c, "%s", err);
  {
    prosody_handler_t h = {slow, NULL, NULL, 0};
    double deadline = t_now() + 60;
    CHECK_OK(prosody_subscribe(c, &h, err, sizeof(err)), err);
    while (atomic_load(&timeout_elapsed_us) < 0 && t_now() < deadline)
      usleep(10000);
  }
  {
    double el = (double)atomic_load(&timeout_elapsed_us) / 1e6;
    CHECK(el >= 0.25 && el < 1.5,
          "cancellation after %.3f s with timeout "
          "300ms",
          el);
  }
  CHECK_OK(prosody_unsubscribe(c), "unsubscribe");
  prosody_client_destroy(c);
  return 0;
}

/* A retry after a timeout starts uncancelled. */
T_SCENARIO(retry_after_timeout_starts_uncancelled, T_BOTH, 60) {
  char err[1024];
  prosody_config_t *conf;
  prosody_client_t *c;
  {
    char t3[128], g3[160];
    prosody_handler_t h = {times_out_once, NULL, NULL, 0};
    double deadline;
    snprintf(t3, sizeof(t3), "%s", t_topic("shutdown-retry"));
    snprintf(g3, sizeof(g3), "%s-g", t3);
    t_create_topic(t3, 1);
    t_produce(t3, 0, 1, 1);
    conf = t_consumer_config(g3, t3);
    t_set(conf, "timeout", "200ms");
    t_set(conf, "retry_base", "1ms");
    c = prosody_client_new(conf, err, sizeof(err));
    CHECK(c, "%s", err);
    CHECK_OK(prosody_subscribe(c, &h, err, sizeof(err)), err);
    deadline = t_now() + 60;
    while (atomic_load(&second_was_cancelled) < 0 && t_now() < deadline)
      usleep(10000);
    CHECK(atomic_load(&second_was_cancelled) == 0,
          "the retry after a timeout started cancelled (%d)",
          atomic_load(&second_was_cancelled));
    CHECK_OK(prosody_unsubscribe(c), "unsubscribe");
    prosody_client_destroy(c);
  }
  return 0;
}

/* Shutdown phases; the next consumer of the group gets the aborted
 * record and what queued behind it. */
T_SCENARIO(unsubscribe_cancels_at_80_percent_and_aborted_work_redelivered,
           T_BOTH, 90) {
  char err[1024], topic[128], group[160];
  prosody_config_t *conf;
  prosody_client_t *c;
  int64_t committed[2], end[2], start_ns;
  double took;

  snprintf(topic, sizeof(topic), "%s", t_topic("shutdown-phases"));
  snprintf(group, sizeof(group), "%s-g", topic);
  t_create_topic(topic, 1);
  t_produce(topic, 0, 20, 5); /* key-0 has seq 0, 5, 10, 15 */
  conf = t_consumer_config(group, topic);
  t_set(conf, "shutdown_timeout", "2s");
  c = prosody_client_new(conf, err, sizeof(err));
  CHECK(c, "%s", err);
  {
    prosody_handler_t h = {stuck, NULL, NULL, 0};
    CHECK_OK(prosody_subscribe(c, &h, err, sizeof(err)), err);
  }
  CHECK(t_wait_at_least(&stuck_started, 1, 60), "the stuck handler never ran");
  CHECK(t_wait_at_least(&others, 16, 60), "other keys: %d of 16 done",
        atomic_load(&others));
  usleep(300000); /* their offsets are stored and committed */
  start_ns = t_mono_ns();
  CHECK_OK(prosody_unsubscribe(c), "unsubscribe");
  took = (double)(t_mono_ns() - start_ns) / 1e9;
  {
    double cancel_at = (double)(atomic_load(&cancel_seen_ns) - start_ns) / 1e9;
    CHECK(cancel_at >= 1.5 && cancel_at < 1.9,
          "cancellation reached the handler %.3f s into shutdown; want 80%% "
          "of 2 s",
          cancel_at);
  }
  CHECK(took < 2.6, "unsubscribe took %.3f s with shutdown_timeout 2s", took);
  prosody_client_destroy(c);
  t_committed(group, topic, committed, end);
  CHECK(committed[0] <= 0,
        "committed %lld: the aborted record (offset 0) "
        "must not be committed",
        (long long)committed[0]);

  /* The next consumer of the group gets key-0's records again. */
  conf = t_consumer_config(group, topic);
  c = prosody_client_new(conf, err, sizeof(err));
  CHECK(c, "%s", err);
  {
    prosody_handler_t h = {second, NULL, NULL, 0};
    CHECK_OK(prosody_subscribe(c, &h, err, sizeof(err)), err);
  }
  CHECK(t_wait_at_least(&redelivered, 4, 60),
        "key-0 redelivered %d of 4 records", atomic_load(&redelivered));
  CHECK_OK(prosody_unsubscribe(c), "unsubscribe");
  prosody_client_destroy(c);
  printf("ok: timeout cancels at 300ms, shutdown cancels at 80%%, aborted "
         "work redelivered\n");
  return 0;
}
