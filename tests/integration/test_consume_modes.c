/*
 * test_consume_modes.c - failure handling per mode, one consumer per
 * scenario:
 *  - pipeline, transient: retried until success (here: 4th attempt);
 *  - pipeline, permanent: never retried, committed past;
 *  - low-latency: max_retries, then the record goes to failure_topic with
 *    the source-* headers, and only then is it committed; a send the
 *    broker refuses is sent again (not the handler run again) until it is
 *    written, once;
 *  - best-effort: a failure is logged and committed past, never retried.
 */
#include <pthread.h>
#include <stdatomic.h>

#include "config/config.h"
#include "harness.h"

#define N 200
#define KEYS 20

typedef struct scenario {
  const char *name;
  const char *mode;
  char topic[128], group[160];
  prosody_client_t *client;
  atomic_int attempts[N];
  atomic_int succeeded; /* records whose handler finally returned success */
  atomic_int settled;   /* records that will not be retried again */
  int fail_until;       /* pipeline-transient: attempts that fail */
  int fail_every;       /* others: seq % fail_every == 0 always fails */
  prosody_result_t failure;
  pr__test_opts_t *test; /* test options, or NULL */
} scenario_t;

static prosody_result_t on_message(prosody_context_t *ctx,
                                   const prosody_message_t *msg, void *op) {
  scenario_t *s = op;
  int k, seq, n;
  if (sscanf(prosody_message_payload(msg), "{\"k\":%d,\"seq\":%d}", &k, &seq) !=
          2 ||
      seq < 0 || seq >= N)
    return PROSODY_PERMANENT;
  n = atomic_fetch_add(&s->attempts[seq], 1) + 1;
  if (s->fail_until) {
    if (n <= s->fail_until) {
      prosody_context_set_error(ctx, "not yet");
      return PROSODY_TRANSIENT;
    }
    atomic_fetch_add(&s->succeeded, 1);
    atomic_fetch_add(&s->settled, 1);
    return PROSODY_SUCCESS;
  }
  if (seq % s->fail_every == 0) {
    prosody_context_set_error(ctx, "boom");
    return s->failure;
  }
  atomic_fetch_add(&s->succeeded, 1);
  atomic_fetch_add(&s->settled, 1);
  return PROSODY_SUCCESS;
}

static void start(scenario_t *s, const char *failure_topic) {
  char err[1024];
  prosody_handler_t h = {on_message, NULL, s, 0};
  prosody_config_t *conf;
  snprintf(s->topic, sizeof(s->topic), "%s", t_topic(s->name));
  snprintf(s->group, sizeof(s->group), "%s-group", s->topic);
  t_create_topic(s->topic, 2);
  t_produce(s->topic, 0, N, KEYS);
  conf = t_consumer_config(s->group, s->topic);
  t_set(conf, "mode", s->mode);
  t_set(conf, "retry_base", "1ms");
  t_set(conf, "max_retry_delay", "5ms");
  t_set(conf, "max_retries", "2");
  /* Pipeline mode's retry layer (deferral, which takes a transient failure
   * out of its partition and retries it seconds later, has its own test:
   * test_consume_defer.c). */
  t_set(conf, "defer_enabled", "false");
  if (failure_topic)
    t_set(conf, "failure_topic", failure_topic);
  if (s->test)
    pr__config_set_test(conf, s->test);
  s->client = prosody_client_new(conf, err, sizeof(err));
  CHECK(s->client, "%s: %s", s->name, err);
  CHECK_OK(prosody_subscribe(s->client, &h, err, sizeof(err)), err);
}

/* Waits until every record of the scenario has settled and the committed
 * offsets reach the end, then stops the consumer. */
static void finish(scenario_t *s, int want_settled) {
  int64_t committed[8], end[8];
  double deadline = t_now() + 60;
  int np, at_end = 0;
  while (atomic_load(&s->settled) < want_settled && t_now() < deadline)
    usleep(20000);
  CHECK(atomic_load(&s->settled) == want_settled, "%s: %d of %d settled",
        s->name, atomic_load(&s->settled), want_settled);
  /* Commits follow within commit_interval; poll the group's offsets. */
  while (!at_end && t_now() < deadline) {
    np = t_committed(s->group, s->topic, committed, end);
    at_end = 1;
    for (int p = 0; p < np; p++)
      at_end &= committed[p] == end[p];
    if (!at_end)
      usleep(100000);
  }
  CHECK(at_end, "%s: committed offsets did not reach the end", s->name);
  CHECK_OK(prosody_unsubscribe(s->client), "unsubscribe");
  prosody_client_destroy(s->client);
}

/* Waits until every record seq with seq % every == 0 ran at least
 * `attempts` times (a failing record settles without a success), then
 * counts them as settled. */
static void failures_settle(scenario_t *s, int every, int attempts) {
  double deadline = t_now() + 60;
  int want = (N + every - 1) / every, n = 0;
  while (t_now() < deadline) {
    n = 0;
    for (int i = 0; i < N; i += every)
      n += atomic_load(&s->attempts[i]) >= attempts;
    if (n == want)
      break;
    usleep(20000);
  }
  CHECK(n == want, "%s: %d of %d failing records reached their attempt limit",
        s->name, n, want);
  atomic_fetch_add(&s->settled, want);
}

T_SCENARIO(pipeline_retries_transient_failure_until_success, T_BOTH, 90) {
  static scenario_t retry = {
      .name = "modes-pipeline-transient", .mode = "pipeline", .fail_until = 3};
  start(&retry, NULL);
  finish(&retry, N);
  for (int i = 0; i < N; i++)
    CHECK(retry.attempts[i] == 4, "pipeline transient: record %d ran %d times",
          i, retry.attempts[i]);
  return 0;
}

T_SCENARIO(pipeline_skips_permanent_failure_without_retry, T_BOTH, 90) {
  static scenario_t perm = {.name = "modes-pipeline-permanent",
                            .mode = "pipeline",
                            .fail_every = 5,
                            .failure = PROSODY_PERMANENT};
  start(&perm, NULL);
  failures_settle(&perm, 5, 1);
  finish(&perm, N);
  for (int i = 0; i < N; i++)
    CHECK(perm.attempts[i] == 1, "pipeline permanent: record %d ran %d times",
          i, perm.attempts[i]);
  return 0;
}

T_SCENARIO(low_latency_dead_letters_after_max_retries_with_headers, T_BOTH,
           90) {
  static scenario_t low = {.name = "modes-low-latency",
                           .mode = "low-latency",
                           .fail_every = 4,
                           .failure = PROSODY_TRANSIENT};
  char dlq[128];
  t_record_t *recs = calloc(N, sizeof(*recs));
  int want_dlq, got;

  snprintf(dlq, sizeof(dlq), "%s", t_topic("modes-dlq"));
  t_create_topic(dlq, 1);
  start(&low, dlq);
  failures_settle(&low, 4, 3);
  finish(&low, N);
  for (int i = 0; i < N; i++)
    CHECK(low.attempts[i] == (i % 4 == 0 ? 3 : 1),
          "low-latency: record %d ran %d times", i, low.attempts[i]);

  /* The dead letters: exactly the failing records, with their headers. */
  want_dlq = (N + 3) / 4;
  got = t_read_back(dlq, want_dlq, 30, recs);
  CHECK(got == want_dlq, "%d dead letters, want %d", got, want_dlq);
  for (int r = 0; r < got; r++) {
    char h[256], want[32];
    int k, seq;
    CHECK(sscanf(recs[r].value, "{\"k\":%d,\"seq\":%d}", &k, &seq) == 2 &&
              seq % 4 == 0,
          "dead letter payload %s", recs[r].value);
    snprintf(want, sizeof(want), "key-%d", k);
    CHECK(!strcmp(recs[r].key, want), "dead letter key %s", recs[r].key);
    CHECK(t_header(&recs[r], "source-topic", h, sizeof(h)) &&
              !strcmp(h, low.topic),
          "source-topic");
    CHECK(t_header(&recs[r], "source-group-id", h, sizeof(h)) &&
              !strcmp(h, low.group),
          "source-group-id");
    CHECK(t_header(&recs[r], "source-error", h, sizeof(h)) &&
              !strcmp(h, "handler error: boom"), /* the original's words */
          "source-error is %s", h);
    CHECK(t_header(&recs[r], "source-kind", h, sizeof(h)) &&
              !strcmp(h, "message"),
          "source-kind");
    CHECK(t_header(&recs[r], "source-partition", h, sizeof(h)) &&
              (h[0] == '0' || h[0] == '1') && !h[1],
          "source-partition %s", h);
    CHECK(t_header(&recs[r], "source-offset", h, sizeof(h)) && atoll(h) >= 0,
          "source-offset");
    CHECK(t_header(&recs[r], "source-timestamp", h, sizeof(h)) &&
              strlen(h) == 24 && h[10] == 'T' && h[19] == '.' && h[23] == 'Z',
          "source-timestamp %s is not RFC 3339 with ms", h);
    CHECK(t_header(&recs[r], "source-system", h, sizeof(h)) &&
              !strcmp(h, low.group),
          "a dead letter carries the consumer's source-system");
    /* The original's headers, in its order, and no others (the failed
     * records carried no trace context). */
    {
      static const char *const names[] = {"source-kind",      "source-topic",
                                          "source-partition", "source-offset",
                                          "source-timestamp", "source-group-id",
                                          "source-error",     "source-system"};
      const char *name;
      const void *v;
      size_t len, i = 0;
      while (recs[r].headers &&
             !rd_kafka_header_get_all(recs[r].headers, i, &name, &v, &len)) {
        CHECK(i < 8 && !strcmp(name, names[i]),
              "dead letter header %zu is %s, want %s", i, name,
              i < 8 ? names[i] : "none");
        i++;
      }
      CHECK(i == 8, "dead letter has %zu headers, want 8", i);
    }
  }
  t_records_free(recs, got);
  free(recs);
  return 0;
}

/* The failure topic's first sends are refused (a test option, as when the
 * broker refuses them): each refused dead letter is sent again after a
 * backoff, without running the handler again, and its record is committed
 * only once it is written; each failing record is on the failure topic
 * exactly once. */
T_SCENARIO(low_latency_refused_dead_letters_sent_again_then_committed, T_BOTH,
           90) {
  static pr__test_opts_t refuse = {.dlq_refuse_sends = 9};
  static scenario_t low = {.name = "modes-dlq-refused",
                           .mode = "low-latency",
                           .fail_every = 40,
                           .failure = PROSODY_TRANSIENT,
                           .test = &refuse};
  char dlq[128];
  int want_dlq = (N + 39) / 40, got, seen[N] = {0};
  t_record_t *recs = calloc((size_t)want_dlq + 8, sizeof(*recs));
  CHECK(recs, "memory");
  snprintf(dlq, sizeof(dlq), "%s", t_topic("modes-dlq-refused-dlq"));
  t_create_topic(dlq, 1);
  start(&low, dlq);
  failures_settle(&low, 40, 3);
  finish(&low, N); /* the committed offsets reach the end */
  for (int i = 0; i < N; i++)
    CHECK(low.attempts[i] == (i % 40 == 0 ? 3 : 1),
          "record %d ran %d times (a refused dead letter must not run its "
          "handler again)",
          i, low.attempts[i]);
  /* Read one more than expected: a second copy would show. */
  got = t_read_back(dlq, want_dlq + 1, 5, recs);
  CHECK(got == want_dlq, "%d dead letters, want %d", got, want_dlq);
  for (int r = 0; r < got; r++) {
    int k, seq;
    CHECK(sscanf(recs[r].value, "{\"k\":%d,\"seq\":%d}", &k, &seq) == 2 &&
              seq >= 0 && seq < N && seq % 40 == 0 && !seen[seq]++,
          "dead letter %s: not a failing record, or twice", recs[r].value);
  }
  t_records_free(recs, got);
  free(recs);
  return 0;
}

T_SCENARIO(best_effort_commits_past_failure_without_retry, T_BOTH, 90) {
  static scenario_t best = {.name = "modes-best-effort",
                            .mode = "best-effort",
                            .fail_every = 3,
                            .failure = PROSODY_TRANSIENT};
  start(&best, NULL);
  failures_settle(&best, 3, 1);
  finish(&best, N);
  for (int i = 0; i < N; i++)
    CHECK(best.attempts[i] == 1, "best-effort: record %d ran %d times", i,
          best.attempts[i]);
  return 0;
}
