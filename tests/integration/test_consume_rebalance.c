/*
 * test_consume_rebalance.c - the ordering property across rebalances and a
 * killed consumer. Records with random keys over a random number of
 * partitions (3-12; the seed is printed, PROSODY_TEST_SEED replays it);
 * consumer A
 * starts, B joins mid-stream, A leaves, then C (a child process) joins and
 * is killed with SIGKILL mid-flight, and B finishes. Every record must be
 * processed at least once, and whenever a record is processed every earlier
 * record of its key has been processed before (no key ever skips ahead).
 * And an assignment that arrives with the stop is served inside the
 * consumer's close, and the revoke librdkafka queued behind it neither
 * crashes nor hangs the close (an internal test option holds the consumer
 * queue until the stop).
 *
 *   test_consume_rebalance            the scenario
 *   test_consume_rebalance --child B T G   consumer C (bootstrap B)
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>

#include "config/config.h"
#include "harness.h"

#define N 3000
#define KEYS 50

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int key_of[N];  /* immutable after produce */
static int prev_of[N]; /* previous seq with the same key, or -1 */
static int times[N];   /* guarded by lock */
static int distinct;   /* guarded by lock */
static int gaps;       /* guarded by lock */
static char first_gap[256];
static atomic_int by_a, by_b;

/* Highest seq of each key such that all its earlier seqs were processed. */
static prosody_result_t handle(prosody_context_t *ctx,
                               const prosody_message_t *m, void *op) {
  int k, seq;
  if (sscanf(prosody_message_payload(m), "{\"k\":%d,\"seq\":%d}", &k, &seq) !=
          2 ||
      seq < 0 || seq >= N)
    return PROSODY_PERMANENT;
  if (seq % 7 == 0)
    usleep(500);
  pthread_mutex_lock(&lock);
  for (int s = prev_of[seq]; s >= 0; s = prev_of[s]) /* same key, earlier */
    if (!times[s]) {
      if (!gaps++)
        snprintf(first_gap, sizeof(first_gap),
                 "key-%d: seq %d processed before seq %d", k, seq, s);
      break;
    }
  if (!times[seq]++)
    distinct++;
  pthread_mutex_unlock(&lock);
  atomic_fetch_add(op == &by_a ? &by_a : &by_b, 1);
  return PROSODY_SUCCESS;
}

/* The child: consume and report each processed seq on stdout. */
static prosody_result_t child_handle(prosody_context_t *ctx,
                                     const prosody_message_t *m, void *op) {
  int k, seq;
  if (sscanf(prosody_message_payload(m), "{\"k\":%d,\"seq\":%d}", &k, &seq) ==
      2) {
    char line[32];
    int n = snprintf(line, sizeof(line), "%d\n", seq);
    usleep(2000);
    if (write(STDOUT_FILENO, line, (size_t)n) != n)
      _exit(3);
  }
  return PROSODY_SUCCESS;
}

static int child_main(const char *bootstrap, const char *topic,
                      const char *group) {
  char err[1024];
  prosody_config_t *conf = prosody_config_new();
  prosody_client_t *c;
  prosody_handler_t h = {child_handle, NULL, NULL, 0};
  t_set(conf, "bootstrap_servers", bootstrap);
  t_set(conf, "group_id", group);
  t_set(conf, "subscribed_topics", topic);
  t_set(conf, "probe_port", "none");
  t_set(conf, "commit_interval", "100ms");
  t_set(conf, "log", "error");
  if (t_real_bootstrap()) {
    t_set(conf, "cassandra_nodes", t_cassandra_nodes());
    t_set(conf, "cassandra_keyspace", T_KEYSPACE);
  } else {
    /* Joins the mock cluster by address (so mock is false): no Cassandra
     * here, and the mock's short session like A and B (a dead member with
     * Kafka's default 45 s session can stall the mock's group). */
    pr__test_opts_t test = {.memory_timers = 1, .session_timeout_ms = 6000};
    pr__config_set_test(conf, &test);
  }
  c = prosody_client_new(conf, err, sizeof(err));
  if (!c || prosody_subscribe(c, &h, err, sizeof(err)))
    return 2;
  /* Tell the parent once partitions are assigned, then work until killed. */
  while (prosody_assigned_partition_count(c) == 0)
    usleep(10000);
  if (write(STDOUT_FILENO, "assigned\n", 9) != 9)
    return 3;
  for (;;)
    pause();
}

/* Reads the child's lines until `pred` holds or the time is up. */
static int child_lines, child_assigned;
static int by_child[N]; /* seqs the child reported processing */
static void read_child(int fd, int want_lines, int want_assigned,
                       double seconds) {
  static char line[64];
  static size_t len;
  double deadline = t_now() + seconds;
  while ((child_lines < want_lines || child_assigned < want_assigned) &&
         t_now() < deadline) {
    int rc = t_read_line(fd, line, sizeof(line), &len);
    if (rc < 0)
      return;
    if (rc == 0)
      continue;
    if (!strcmp(line, "assigned")) {
      child_assigned = 1;
    } else {
      int seq = atoi(line);
      child_lines++;
      if (seq >= 0 && seq < N)
        by_child[seq]++;
    }
  }
}

static prosody_client_t *member(const char *topic, const char *group,
                                atomic_int *counter) {
  char err[1024];
  prosody_config_t *conf = t_consumer_config(group, topic);
  prosody_handler_t h = {handle, NULL, counter, 0};
  prosody_client_t *c;
  t_set(conf, "max_concurrency", "6");
  c = prosody_client_new(conf, err, sizeof(err));
  CHECK(c, "%s", err);
  CHECK_OK(prosody_subscribe(c, &h, err, sizeof(err)), err);
  return c;
}

static void wait_processed(int want, double seconds) {
  int n = t_wait_locked(&lock, &distinct, want, seconds);
  CHECK(n >= want, "processed %d of %d", n, want);
}

/* `--child BOOTSTRAP TOPIC GROUP`: member C, killed mid-flight. */
static int child(int argc, char **argv) {
  CHECK(argc == 5, "usage: %s --child BOOTSTRAP TOPIC GROUP", argv[0]);
  return child_main(argv[2], argv[3], argv[4]);
}
T_CHILD(child)

T_SCENARIO(members_join_leave_and_die_without_key_skipping_ahead, T_BOTH, 300) {
  char topic[128], group[160];
  prosody_client_t *a, *b;
  pid_t child;
  int pipefd[2];
  unsigned seed = getenv("PROSODY_TEST_SEED")
                      ? (unsigned)atoi(getenv("PROSODY_TEST_SEED"))
                      : (unsigned)time(NULL) ^ (unsigned)getpid();
  int partitions, last[KEYS];

  snprintf(topic, sizeof(topic), "%s", t_topic("rebalance"));
  snprintf(group, sizeof(group), "%s-g", topic);
  unsigned seed0 = seed;
  partitions = 3 + (int)(rand_r(&seed) % 10);
  printf("seed %u (PROSODY_TEST_SEED): %d partitions\n", seed0, partitions);
  fflush(stdout);
  t_create_topic(topic, partitions);
  for (int k = 0; k < KEYS; k++)
    last[k] = -1;
  for (int i = 0; i < N; i++) {
    key_of[i] = (int)(rand_r(&seed) % KEYS);
    prev_of[i] = last[key_of[i]];
    last[key_of[i]] = i;
  }
  t_produce_keyed(topic, 0, N / 3, key_of);

  a = member(topic, group, &by_a);
  wait_processed(N / 6, 60);
  t_produce_keyed(topic, N / 3, 2 * N / 3, key_of);
  b = member(topic, group, &by_b); /* rebalance: A and B share */
  wait_processed(N / 2, 90);
  CHECK_OK(prosody_unsubscribe(a), "A leaves"); /* rebalance: B has all */
  prosody_client_destroy(a);

  /* C joins in a child process and is killed mid-flight. */
  {
    const char *args[] = {t_bootstrap(), topic, group, NULL};
    child = t_spawn_child(args, &pipefd[0]);
  }
  /* Once C shares the partitions, the last third arrives; when C has
   * processed some of it, kill it. */
  read_child(pipefd[0], 0, 1, 120);
  CHECK(child_assigned, "the child consumer never got partitions");
  t_produce_keyed(topic, 2 * N / 3, N, key_of);
  read_child(pipefd[0], 20, 1, 120);
  CHECK(child_lines >= 20, "child processed only %d records", child_lines);
  kill(child, SIGKILL);
  waitpid(child, NULL, 0);
  /* Everything C reported before it died counts as processed (and may
   * have been committed): merge it before its partitions move to B. */
  read_child(pipefd[0], N + 1, 1, 2);
  close(pipefd[0]);
  pthread_mutex_lock(&lock);
  for (int i = 0; i < N; i++)
    if (by_child[i] && !times[i]++)
      distinct++;
  pthread_mutex_unlock(&lock);

  /* B alone must now process everything (C's unfinished work included). */
  wait_processed(N, 180); /* a real broker evicts C after its session */
  CHECK_OK(prosody_unsubscribe(b), "B leaves");
  prosody_client_destroy(b);

  CHECK(gaps == 0, "%d ordering gaps; first: %s", gaps, first_gap);
  for (int i = 0; i < N; i++)
    CHECK(times[i] >= 1, "record %d never processed", i);
  CHECK(atomic_load(&by_a) > 0 && atomic_load(&by_b) > 0,
        "both members should have worked: A %d, B %d", atomic_load(&by_a),
        atomic_load(&by_b));
  printf("ok: %d records over %d partitions across 3 members (A %d, B %d, "
         "killed C %d), no key skipped ahead\n",
         N, partitions, atomic_load(&by_a), atomic_load(&by_b), child_lines);
  return 0;
}

/* The lines of the held consumers below (any thread logs). */
static atomic_int held_said, assigned_said;

static void watch_log(prosody_log_level_t level, const char *subsystem,
                      const char *message, void *opaque) {
  (void)level, (void)subsystem, (void)opaque;
  if (strstr(message, "holding the consumer queue"))
    atomic_fetch_add(&held_said, 1);
  if (strstr(message, "assigned 1 partition(s)"))
    atomic_fetch_add(&assigned_said, 1);
}

#define HELD_ROUNDS 10

/* The stop arrives with the group's first assignment: the close serves the
 * assignment, then the revoke librdkafka queued behind it while the group
 * was already leaving. That revoke used to ask the group, which had often
 * ended by then: rd_kafka_rebalance_protocol() NULL (SIGSEGV in strcmp) or
 * an unassign never answered (the close hung); about 4 rounds in 10. */
T_SCENARIO(assignment_arriving_with_the_stop_closes_cleanly, T_MOCK, 120) {
  char err[1024], topic[128], group[160];
  prosody_handler_t h = {handle, NULL, NULL, 0};
  pr__test_opts_t test = {.hold_rebalances = 1, .stop_grace_ms = 1000};
  for (int round = 0; round < HELD_ROUNDS; round++) {
    prosody_config_t *conf;
    prosody_client_t *c;
    int64_t start_ns;
    double took;
    snprintf(topic, sizeof(topic), "%s", t_topic("held-assign"));
    snprintf(group, sizeof(group), "%s-g", topic);
    t_create_topic(topic, 1);
    conf = t_consumer_config(group, topic);
    /* A hung close is abandoned after shutdown_timeout + stop_grace_ms
     * (6 s); a clean one takes well under a second, with room here for a
     * loaded machine. */
    t_set(conf, "shutdown_timeout", "5s");
    prosody_config_set_log_cb(conf, watch_log, NULL);
    pr__config_set_test(conf, &test);
    c = prosody_client_new(conf, err, sizeof(err));
    CHECK(c, "%s", err);
    CHECK_OK(prosody_subscribe(c, &h, err, sizeof(err)), err);
    CHECK(t_wait_at_least(&held_said, round + 1, 30),
          "round %d: no rebalance event reached the consumer queue", round);
    start_ns = t_mono_ns();
    CHECK_OK(prosody_unsubscribe(c), "unsubscribe");
    took = (double)(t_mono_ns() - start_ns) / 1e9;
    prosody_client_destroy(c);
    CHECK(took < 5.0,
          "round %d: unsubscribe took %.3f s (the close hung; the engine "
          "was abandoned after shutdown_timeout)",
          round, took);
    CHECK(atomic_load(&assigned_said) == round + 1,
          "round %d: the held assignment was not served by the close (%d "
          "assignments said)",
          round, atomic_load(&assigned_said));
  }
  printf("ok: %d assignments arriving with the stop closed cleanly\n",
         HELD_ROUNDS);
  return 0;
}
