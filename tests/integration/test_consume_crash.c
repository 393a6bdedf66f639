/*
 * test_consume_crash.c - the consuming process killed with SIGKILL, and
 * what the group's next consumer makes of it. 200 keys x 50 values go to a
 * 4-partition topic; consumers run in child processes of this test (in the
 * mock tier they join this process's embedded cluster by address) and
 * append one line per handling (child, key, seq, partition, offset, time) to
 * a file with O_APPEND, so a killed child loses nothing it recorded.
 *
 * Seven kills, at moments drawn from a printed seed (PROSODY_TEST_SEED
 * replays it): five while one consumer works alone, each followed by a new
 * consumer in the same group; one while a second consumer joins (the first
 * is killed once the rebalance has taken its partitions); one right after a
 * consumer was asked to stop (SIGTERM: it calls prosody_unsubscribe, which
 * drains; the last fifth of the values is produced just before, so that it
 * has work in flight). A last consumer then runs until the group's committed
 * offsets reach the end of every partition.
 *
 * Deduplication is off, so duplicates show what the group redelivers.
 * From the recorded handlings: no value lost; each key's values handled
 * for the first time in sequence order; every duplicate is of a record at
 * or above the offset the group had committed just before the kill that
 * preceded it, and a kill is followed by no more duplicates than records
 * handled but uncommitted at it. The stall of each kill (until every
 * partition with work left is handled again) is printed.
 *
 *   test_consume_crash                                  the scenario
 *   test_consume_crash --child I ADDR|- TOPIC GROUP FILE   consumer I
 */
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>

#include "config/config.h"
#include "harness.h"

#define KEYS 200
#define N (KEYS * 50)
#define PARTS 4
#define KILLS 7

/* ---- the child: a consumer that records its handlings ---- */

static int rec_fd, child_index;

static prosody_result_t record(prosody_context_t *ctx,
                               const prosody_message_t *m, void *op) {
  char line[128];
  int k, seq, n;
  struct timespec ts;
  if (sscanf(prosody_message_payload(m), "{\"k\":%d,\"seq\":%d}", &k, &seq) !=
      2)
    return PROSODY_PERMANENT;
  usleep(1000); /* work in flight when the kill comes */
  clock_gettime(CLOCK_MONOTONIC, &ts);
  n = snprintf(line, sizeof(line), "%d %d %d %d %lld %lld\n", child_index, k,
               seq, (int)prosody_message_partition(m),
               (long long)prosody_message_offset(m),
               (long long)ts.tv_sec * 1000000000 + ts.tv_nsec);
  if (write(rec_fd, line, (size_t)n) != n)
    _exit(3);
  return PROSODY_SUCCESS;
}

static void say(const char *fmt, int v) {
  char line[64];
  int n = snprintf(line, sizeof(line), fmt, v);
  if (write(STDOUT_FILENO, line, (size_t)n) != n)
    _exit(3);
}

/* Reports "assigned N" on each change of its partition count; on SIGTERM
 * says "draining", unsubscribes, says "drained" and exits 0. */
static int child_main(char **argv) {
  char err[1024];
  sigset_t term;
  struct timespec tick = {0, 1000000};
  prosody_handler_t h = {record, NULL, NULL, 0};
  prosody_config_t *conf;
  prosody_client_t *c;
  int last = -1;

  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &term, NULL); /* before any thread starts */
  child_index = atoi(argv[2]);
  if (strcmp(argv[3], "-"))
    t_mock_address = argv[3];
  rec_fd = open(argv[6], O_WRONLY | O_APPEND);
  if (rec_fd < 0)
    return 2;
  conf = t_consumer_config(argv[5], argv[4]);
  t_set(conf, "max_concurrency", "4");
  t_set(conf, "log", "error");
  /* Measure delivery itself: deduplication (in Cassandra on the real tier)
   * would hide the duplicates, and with them a commit that never came. */
  t_set(conf, "idempotence_cache_size", "0");
  {
    /* Kafka's default 45 s session would make each kill cost 45 s; a
     * broker accepts 6 s at the least. The mock took about 11 s to give a
     * dead member's partitions away with 6 s, about 5 s with 3 s. */
    pr__test_opts_t test = {.memory_timers = !t_real_bootstrap(),
                            .session_timeout_ms =
                                t_real_bootstrap() ? 6000 : 3000};
    pr__config_set_test(conf, &test);
  }
  c = prosody_client_new(conf, err, sizeof(err));
  if (!c || prosody_subscribe(c, &h, err, sizeof(err))) {
    fprintf(stderr, "child %d: %s\n", child_index, err);
    return 2;
  }
  for (;;) {
    int n = prosody_assigned_partition_count(c);
    if (n != last)
      say("assigned %d\n", last = n);
    if (sigtimedwait(&term, NULL, &tick) == SIGTERM)
      break;
  }
  say("draining\n", 0);
  if (prosody_unsubscribe(c))
    return 4;
  say("drained\n", 0);
  prosody_client_destroy(c);
  return 0;
}

/* ---- the parent ---- */

typedef struct child {
  pid_t pid;
  int fd; /* the child's stdout */
  char line[64];
  size_t len;
} child_t;

/* One recorded handling. */
typedef struct handling {
  int child, key, seq, part;
  int64_t off;
  double t; /* CLOCK_MONOTONIC seconds, like t_now() */
} handling_t;

typedef struct kill_rec {
  const char *what;
  int64_t committed[PARTS]; /* read just before the kill */
  double t;                 /* when it was sent */
  int line;                 /* handlings recorded before it */
  int uncommitted;          /* of those, at or above committed[] */
  int dups;                 /* duplicates after it, before the next */
  double stall;             /* until each partition with work is handled */
} kill_rec_t;

static char topic[128], group[160], rec_path[64];
static handling_t *hs;
static int n_hs, cap_hs, distinct, handled[N];
static kill_rec_t kills[KILLS];
static int n_kills;

/* Parses the handlings appended to the file since the last call. */
static void tail(void) {
  static int fd = -1;
  static char buf[1 << 16];
  static size_t have;
  ssize_t r;
  if (fd < 0)
    CHECK((fd = open(rec_path, O_RDONLY)) >= 0, "open %s", rec_path);
  while ((r = read(fd, buf + have, sizeof(buf) - 1 - have)) > 0) {
    char *p = buf, *nl;
    have += (size_t)r;
    buf[have] = '\0';
    while ((nl = strchr(p, '\n'))) {
      handling_t h;
      long long off, ns;
      *nl = '\0';
      CHECK(sscanf(p, "%d %d %d %d %lld %lld", &h.child, &h.key, &h.seq,
                   &h.part, &off, &ns) == 6 &&
                h.seq >= 0 && h.seq < N && h.part >= 0 && h.part < PARTS,
            "bad line: %s", p);
      h.off = off;
      h.t = (double)ns / 1e9;
      if (n_hs == cap_hs) {
        cap_hs = cap_hs ? 2 * cap_hs : 4 * N;
        CHECK((hs = realloc(hs, (size_t)cap_hs * sizeof(*hs))), "memory");
      }
      hs[n_hs++] = h;
      if (!handled[h.seq]++)
        distinct++;
      p = nl + 1;
    }
    have -= (size_t)(p - buf);
    memmove(buf, p, have);
  }
}

static void wait_distinct(int want, double seconds) {
  double deadline = t_now() + seconds;
  for (tail(); distinct < want && t_now() < deadline; tail())
    usleep(1000);
  CHECK(distinct >= want, "handled %d of %d values, want %d", distinct, N,
        want);
}

static void start(child_t *c, int index) {
  char idx[16];
  const char *args[] = {idx,      t_real_bootstrap() ? "-" : t_bootstrap(),
                        topic,    group,
                        rec_path, NULL};
  snprintf(idx, sizeof(idx), "%d", index);
  c->pid = t_spawn_child(args, &c->fd);
  c->len = 0;
}

/* Reads the child's reports until one starts with `prefix` (and, for
 * "assigned", names fewer than `below` partitions). */
static void await(child_t *c, const char *prefix, int below, double seconds) {
  double deadline = t_now() + seconds;
  while (t_now() < deadline) {
    int rc = t_read_line(c->fd, c->line, sizeof(c->line), &c->len);
    CHECK(rc >= 0, "child %d ended before saying %s", (int)c->pid, prefix);
    if (rc == 1 && !strncmp(c->line, prefix, strlen(prefix)) &&
        (below < 0 || atoi(c->line + strlen(prefix)) < below))
      return;
  }
  CHECK(0, "child %d never said %s", (int)c->pid, prefix);
}

/* The group's committed offsets now, for the kill that follows. */
static kill_rec_t *before_kill(const char *what) {
  int64_t end[PARTS];
  kill_rec_t *k = &kills[n_kills++];
  k->what = what;
  CHECK(t_committed(group, topic, k->committed, end) == PARTS, "partitions");
  return k;
}

/* SIGKILL; once the child is gone every handling it recorded is in the
 * file. Returns 1 if it had finished draining (said "drained"). */
static int crash(child_t *c, kill_rec_t *k) {
  int drained = 0;
  k->t = t_now();
  kill(c->pid, SIGKILL);
  CHECK(waitpid(c->pid, NULL, 0) == c->pid, "waitpid");
  tail();
  k->line = n_hs;
  for (int rc;
       (rc = t_read_line(c->fd, c->line, sizeof(c->line), &c->len)) >= 0;)
    drained |= rc == 1 && !strcmp(c->line, "drained");
  close(c->fd);
  printf("kill %d (%s) at %d of %d values handled\n", n_kills, k->what,
         distinct, N);
  fflush(stdout);
  return drained;
}

/* A moment in the `slot`th tenth of the values, after what is done. */
static int moment(unsigned *seed, int slot) {
  int tenth = N / 10, want = slot * tenth + tenth / 4 +
                             (int)(rand_r(seed) % (unsigned)(tenth * 3 / 4));
  return want > distinct + tenth / 4 ? want : distinct + tenth / 4;
}

/* The checks and figures, from the handlings in file order. */
static void verify(void) {
  static int first[KEYS]; /* first handlings of each key so far */
  static int seen[N];
  int lost = 0, disorder = 0, dups = 0, m = -1;
  for (int i = 0; i < n_hs; i++) {
    const handling_t *h = &hs[i];
    while (m + 1 < n_kills && kills[m + 1].line <= i)
      m++;
    if (seen[h->seq]++) {
      dups++;
      CHECK(m >= 0, "value %d handled twice before any kill", h->seq);
      CHECK(h->off >= kills[m].committed[h->part],
            "value %d (partition %d offset %lld) handled again after kill %d, "
            "below the offset %lld committed before it",
            h->seq, h->part, (long long)h->off, m + 1,
            (long long)kills[m].committed[h->part]);
      kills[m].dups++;
    } else if (h->seq != h->key + KEYS * first[h->key]++) {
      if (!disorder++)
        fprintf(stderr, "key-%d: value %d handled first after %d others\n",
                h->key, h->seq, first[h->key] - 1);
    }
  }
  for (int s = 0; s < N; s++)
    lost += !seen[s];
  for (int k = 0; k < n_kills; k++) {
    kill_rec_t *kr = &kills[k];
    double next[PARTS] = {0};
    static int counted[N];
    memset(counted, 0, sizeof(counted));
    for (int i = 0; i < kr->line; i++)
      if (hs[i].off >= kr->committed[hs[i].part] && !counted[hs[i].seq]++)
        kr->uncommitted++;
    for (int i = kr->line; i < n_hs; i++)
      if (hs[i].t > kr->t && !next[hs[i].part])
        next[hs[i].part] = hs[i].t;
    for (int p = 0; p < PARTS; p++)
      if (next[p] && next[p] - kr->t > kr->stall)
        kr->stall = next[p] - kr->t;
    printf("kill %d (%s): %d uncommitted, %d duplicates after it, stall "
           "%.1f s\n",
           k + 1, kr->what, kr->uncommitted, kr->dups, kr->stall);
    CHECK(kr->dups <= kr->uncommitted,
          "kill %d: %d duplicates, but only %d handled and uncommitted", k + 1,
          kr->dups, kr->uncommitted);
  }
  for (int i = 0; i < n_hs; i++)
    if (hs[i].child == 6) { /* the consumer that joined at kill 6 */
      printf("the joining consumer's first handling came %.1f s after kill "
             "6\n",
             hs[i].t - kills[5].t);
      break;
    }
  printf("%d handlings of %d values: %d lost, %d out of order, %d "
         "duplicates\n",
         n_hs, N, lost, disorder, dups);
  CHECK(lost == 0, "%d values never handled", lost);
  CHECK(disorder == 0, "%d values handled first out of key order", disorder);
}

/* `--child ...`: one consumer of the group (start()). */
static int child(int argc, char **argv) {
  CHECK(argc == 7, "usage: %s --child INDEX BOOTSTRAP TOPIC GROUP FILE",
        argv[0]);
  return child_main(argv);
}
T_CHILD(child)

T_SCENARIO(killed_members_lose_no_record_and_keep_key_order, T_BOTH, 180) {
  unsigned seed = getenv("PROSODY_TEST_SEED")
                      ? (unsigned)atoi(getenv("PROSODY_TEST_SEED"))
                      : (unsigned)time(NULL) ^ (unsigned)getpid();
  child_t a, b;
  kill_rec_t *k;
  int64_t committed[PARTS], end[PARTS];
  int fd, status = 0, drained;
  pid_t gone;
  double t0 = t_now(), deadline;

  printf("seed %u (PROSODY_TEST_SEED)\n", seed);
  snprintf(topic, sizeof(topic), "%s", t_topic("crash"));
  snprintf(group, sizeof(group), "%s-g", topic);
  snprintf(rec_path, sizeof(rec_path), "/tmp/prosody-crash-XXXXXX");
  CHECK((fd = mkstemp(rec_path)) >= 0, "mkstemp");
  close(fd);
  printf("handlings recorded in %s (removed if the test passes)\n", rec_path);
  t_create_topic(topic, PARTS);
  /* Key i % KEYS, seq i. The last fifth waits for the drain: however far
   * the first consumers got, the one that drains has work in flight. */
  t_produce(topic, 0, N * 4 / 5, KEYS);

  /* Five kills of a consumer working alone, each replaced at once. */
  start(&a, 0);
  for (int i = 0; i < 5; i++) {
    wait_distinct(moment(&seed, i), 60);
    crash(&a, before_kill("alone"));
    start(&a, i + 1);
  }
  /* A second consumer joins: kill the first once its partitions are
   * revoked, before the rebalance can complete. */
  wait_distinct(moment(&seed, 5), 60);
  await(&a, "assigned 4", -1, 10); /* alone, it has all PARTS */
  k = before_kill("rebalance");
  start(&b, 6);
  await(&a, "assigned ", PARTS, 60);
  crash(&a, k);
  /* Ask the second to stop, and kill it while it drains. */
  t_produce(topic, N * 4 / 5, N, KEYS);
  wait_distinct(moment(&seed, 8), 60);
  k = before_kill("drain");
  kill(b.pid, SIGTERM);
  await(&b, "draining", -1, 10);
  drained = crash(&b, k);
  printf("drain %s when the kill came\n", drained ? "had finished" : "ran");

  /* The last consumer finishes, and stops gracefully. */
  start(&a, 7);
  CHECK(t_wait_committed(group, topic, ~0u, committed, end, 60),
        "the group's offsets never reached the end of the topic");
  kill(a.pid, SIGTERM);
  deadline = t_now() + 30;
  while ((gone = waitpid(a.pid, &status, WNOHANG)) == 0 && t_now() < deadline)
    usleep(10000);
  CHECK(gone == a.pid && WIFEXITED(status) && WEXITSTATUS(status) == 0,
        "the last consumer did not stop cleanly");
  close(a.fd);
  tail();
  verify();
  unlink(rec_path);
  printf("ok: %d kills, %.0f s\n", n_kills, t_now() - t0);
  return 0;
}
