/*
 * soak.c - a long run against the real tier (`make soak`, scripts/soak.sh):
 * does a consumer's process plateau, and do its commits keep moving?
 *
 *   soak MINUTES [SUMMARY.md]   the run (this process orchestrates)
 *   soak consumer TOPIC GROUP STATS_FD   the measured consumer
 *   soak member TOPIC GROUP STATS_FD     the member that joins and leaves
 *
 * The orchestrator creates a topic, starts the measured consumer (a child
 * process running this program: its memory, descriptors and threads are
 * its own) and sends keyed records to the topic from a producer of its
 * own, SOAK_RATE records/s over SOAK_KEYS keys. Every tenth record's
 * handler schedules a timer 5-44 s ahead; timers fire and succeed. One key
 * in a hundred records, `key-bad`, fails for ever (transient): pipeline
 * mode defers it and retries it while the others flow. A second member
 * (another child) joins the group 90 s in and every two minutes after,
 * and leaves gracefully 60 s after each join.
 *
 * Every minute the orchestrator samples the consumer's VmRSS and Threads
 * (/proc/PID/status), its open descriptors (/proc/PID/fd), the group's
 * committed offsets (summed over the partitions), the consumer's counters
 * (shared memory) and its /metrics probe, and prints one line. At the end
 * it prints a markdown summary (also written to SUMMARY.md) and exits 1 if
 * a criterion failed, naming it:
 *
 *  - commits: the committed sum grew in every one-minute interval;
 *  - timers: timers fired in every one-minute interval;
 *  - failing key: key-bad was retried in the last third of the run;
 *  - plateau: the samples are split in thirds (the first is warm-up); the
 *    last third's maximum must not exceed the middle third's by more than
 *    10% + 4 MiB (RSS), 4 descriptors or 4 threads. The slope after
 *    warm-up (least squares, per minute) is reported, not judged.
 *
 * SOAK_RATE (200), SOAK_KEYS (2000) and SOAK_PARTITIONS (8) shape the
 * load; SOAK_LEAK_BYTES makes every handled record leak that many bytes,
 * to see the plateau criterion fail.
 *
 * Against PROSODY_TEST_BOOTSTRAP (127.0.0.1:9094) and
 * PROSODY_TEST_CASSANDRA_NODES (127.0.0.1:9042), keyspace prosody_soak.
 */
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>

#include "harness.h"

#define BAD_KEY "key-bad"

/* The counters of one side (the measured consumer, or the members),
 * updated by its handlers and log callback in shared memory. */
typedef struct soak_side {
  atomic_long handled, bad_attempts, scheduled, schedule_failed, fired;
  atomic_long assigned, revoked, subscribe_retries;
  atomic_int probe_port;
} soak_side_t;

typedef struct soak_stats {
  soak_side_t consumer, member;
} soak_stats_t;

/* ------------------------------------------------------------------------ */
/* The consumer and the member                                               */
/* ------------------------------------------------------------------------ */

static long env_long(const char *name, long dflt) {
  const char *v = getenv(name);
  return v && *v ? atol(v) : dflt;
}

static int64_t wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* SOAK_LEAK_BYTES: every handled record leaks this much (0), to see the
 * plateau criterion fail. */
static size_t leak_bytes;

static prosody_result_t on_message(prosody_context_t *ctx,
                                   const prosody_message_t *m, void *op) {
  soak_side_t *s = op;
  int64_t off = prosody_message_offset(m);
  char err[256];
  if (!strcmp(prosody_message_key(m), BAD_KEY)) {
    atomic_fetch_add(&s->bad_attempts, 1);
    prosody_context_set_error(ctx, "soak: this key always fails");
    return PROSODY_TRANSIENT;
  }
  if (off % 10 == 0) {
    if (prosody_schedule(ctx, wall_ms() + 5000 + off % 40 * 1000, err,
                         sizeof(err)) == PROSODY_OK)
      atomic_fetch_add(&s->scheduled, 1);
    else
      atomic_fetch_add(&s->schedule_failed, 1);
  }
  if (leak_bytes > 0) { /* the check of the check: a handler that leaks */
    char *p = malloc(leak_bytes);
    if (p)
      memset(p, 1, leak_bytes);
  }
  atomic_fetch_add(&s->handled, 1);
  return PROSODY_SUCCESS;
}

static prosody_result_t on_timer(prosody_context_t *ctx,
                                 const prosody_timer_t *t, void *op) {
  atomic_fetch_add(&((soak_side_t *)op)->fired, 1);
  return PROSODY_SUCCESS;
}

static const char *side_name;

/* Counts the engine's assignment and revocation lines; warnings and errors
 * go to standard error with the time and the side's name. */
static void on_log(prosody_log_level_t level, const char *subsystem,
                   const char *message, void *op) {
  soak_side_t *s = op;
  if (!strcmp(subsystem, "engine") && !strncmp(message, "assigned ", 9))
    atomic_fetch_add(&s->assigned, 1);
  else if (!strcmp(subsystem, "engine") && !strncmp(message, "revoked ", 8))
    atomic_fetch_add(&s->revoked, 1);
  if (level <= PROSODY_LOG_WARN) {
    time_t now = time(NULL);
    char ts[16];
    strftime(ts, sizeof(ts), "%H:%M:%S", gmtime(&now));
    fprintf(stderr, "%s [%s] %s %s: %s\n", ts, side_name,
            level == PROSODY_LOG_ERROR ? "ERROR" : "WARN", subsystem, message);
  }
}

/* Consumes until SIGTERM, then leaves the group gracefully. */
static int run_consumer(const char *topic, const char *group, int stats_fd,
                        int measured) {
  soak_stats_t *st =
      mmap(NULL, sizeof(*st), PROT_READ | PROT_WRITE, MAP_SHARED, stats_fd, 0);
  soak_side_t *s;
  const char *nodes = getenv("PROSODY_TEST_CASSANDRA_NODES");
  prosody_config_t *conf = t_config();
  prosody_handler_t h = {on_message, on_timer, NULL, 0};
  prosody_client_t *c;
  char err[1024];
  prosody_err_t e;
  sigset_t set;
  int sig;
  CHECK(st != MAP_FAILED, "mmap: %s", strerror(errno));
  s = measured ? &st->consumer : &st->member;
  side_name = measured ? "consumer" : "member";
  leak_bytes = (size_t)env_long("SOAK_LEAK_BYTES", 0);
  h.opaque = s;
  /* Every thread the client starts inherits the mask: sigwait gets it. */
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, NULL);
  t_set(conf, "group_id", group);
  t_set(conf, "subscribed_topics", topic);
  t_set(conf, "cassandra_nodes", nodes && *nodes ? nodes : "127.0.0.1:9042");
  t_set(conf, "cassandra_keyspace", "prosody_soak");
  t_set(conf, "probe_port", measured ? "0" : "none");
  t_set(conf, "defer_max_delay", "20s");
  prosody_config_set_log_cb(conf, on_log, s);
  c = prosody_client_new(conf, err, sizeof(err));
  CHECK(c, "%s: %s", side_name, err);
  /* Cassandra unreachable (restarted by other work on the machine): retry
   * every second, as an application would, until it answers or SIGTERM. */
  while ((e = prosody_subscribe(c, &h, err, sizeof(err))) != PROSODY_OK) {
    struct timespec second = {1, 0};
    CHECK(prosody_err_is_transient(e), "%s: %s", side_name, err);
    atomic_fetch_add(&s->subscribe_retries, 1);
    fprintf(stderr, "[%s] subscribe: %s; retrying in 1 s\n", side_name, err);
    if (sigtimedwait(&set, NULL, &second) > 0) {
      prosody_client_destroy(c);
      return 0;
    }
  }
  if (measured)
    atomic_store(&s->probe_port, prosody_probe_port(c));
  sigwait(&set, &sig);
  prosody_unsubscribe(c);
  prosody_client_destroy(c);
  return 0;
}

/* ------------------------------------------------------------------------ */
/* The orchestrator                                                          */
/* ------------------------------------------------------------------------ */

/* The member's joins and leaves; those killed after the grace, and those
 * that died by themselves. */
static long joins, leaves, member_killed, member_died;

static atomic_int stop_producing;
static atomic_long sent, send_failed;
static long rate, keys;

static void on_sent(prosody_err_t err, const char *errstr,
                    const prosody_delivery_t *d, void *op) {
  atomic_fetch_add(err ? &send_failed : &sent, 1);
}

/* Record i goes at start + i / rate; every hundredth to key-bad. */
static void *produce(void *topic) {
  char err[512], key[32], payload[96];
  prosody_config_t *conf = t_config();
  prosody_client_t *c;
  double start = t_now();
  t_set(conf, "source_system", "soak");
  c = prosody_client_new(conf, err, sizeof(err));
  CHECK(c, "producer: %s", err);
  for (long i = 0; !atomic_load(&stop_producing); i++) {
    double due = start + (double)i / (double)rate, now = t_now();
    if (due > now)
      usleep((useconds_t)((due - now) * 1e6));
    if (i % 100 == 0)
      snprintf(key, sizeof(key), BAD_KEY);
    else
      snprintf(key, sizeof(key), "key-%05ld", i * 7919 % keys);
    snprintf(payload, sizeof(payload), "{\"seq\":%ld}", i);
    if (prosody_send_async(c, topic, key, payload, NULL, on_sent, NULL, err,
                           sizeof(err)))
      atomic_fetch_add(&send_failed, 1);
  }
  prosody_client_destroy(c);
  return NULL;
}

/* A child running this program in `mode`; its pid. */
static pid_t spawn(const char *mode, const char *topic, const char *group,
                   int stats_fd) {
  char fd[16];
  pid_t pid;
  snprintf(fd, sizeof(fd), "%d", stats_fd);
  pid = fork();
  CHECK(pid >= 0, "fork: %s", strerror(errno));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM); /* never outlive the orchestrator */
    execl("/proc/self/exe", "soak", mode, topic, group, fd, (char *)NULL);
    _exit(127);
  }
  return pid;
}

/* SIGTERM, then SIGKILL after `grace_s`; 1 if it exited by itself. */
static int stop_child(pid_t pid, double grace_s) {
  double deadline = t_now() + grace_s;
  int status;
  kill(pid, SIGTERM);
  while (t_now() < deadline) {
    if (waitpid(pid, &status, WNOHANG) == pid)
      return WIFEXITED(status) && WEXITSTATUS(status) == 0;
    usleep(100000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return 0;
}

typedef struct sample {
  double t;
  long rss_kib, fds, threads;
  int64_t committed, lag;
  long handled, fired, bad, deferred, pending, assigned_parts;
  int member;
} sample_t;

static long status_field(pid_t pid, const char *field) {
  char path[64], line[256];
  long v = -1;
  size_t n = strlen(field);
  FILE *f;
  snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
  if (!(f = fopen(path, "r")))
    return -1;
  while (fgets(line, sizeof(line), f))
    if (!strncmp(line, field, n) && line[n] == ':')
      v = atol(line + n + 1);
  fclose(f);
  return v;
}

static long count_fds(pid_t pid) {
  char path[64];
  long n = 0;
  struct dirent *e;
  DIR *d;
  snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
  if (!(d = opendir(path)))
    return -1;
  while ((e = readdir(d)))
    n += e->d_name[0] != '.';
  closedir(d);
  return n;
}

/* A value of the consumer's /metrics (the line starting with `name `), or
 * -1. */
static long metric(const char *body, const char *name) {
  size_t n = strlen(name);
  for (const char *p = body; p && *p;
       p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
    if (!strncmp(p, name, n) && p[n] == ' ')
      return atol(p + n + 1);
  return -1;
}

/* The group's committed offsets and the partitions' end offsets, summed
 * into s->committed and s->lag, through `rk` (a handle of the
 * orchestrator's, in `group` but never subscribed); 0 on success. */
static int read_offsets(rd_kafka_t *rk, const char *topic, int np,
                        sample_t *s) {
  rd_kafka_topic_partition_list_t *parts =
      rd_kafka_topic_partition_list_new(np);
  int rc = 0;
  s->committed = s->lag = 0;
  for (int p = 0; p < np; p++)
    rd_kafka_topic_partition_list_add(parts, topic, p);
  if (rd_kafka_committed(rk, parts, 10000))
    rc = -1;
  for (int p = 0; p < np && !rc; p++) {
    int64_t lo, hi, done = parts->elems[p].offset;
    if (rd_kafka_query_watermark_offsets(rk, topic, p, &lo, &hi, 10000) ||
        parts->elems[p].err)
      rc = -1;
    done = done < 0 ? 0 : done;
    s->committed += done;
    s->lag += hi - done;
  }
  rd_kafka_topic_partition_list_destroy(parts);
  return rc;
}

/* One sample; the offsets are read up to three times (a failed reading
 * leaves committed at -1, which fails the commits criterion). */
static void take_sample(sample_t *s, double t, pid_t pid, const soak_side_t *c,
                        rd_kafka_t *rk, const char *topic, int np, int member) {
  static char body[32768];
  int port = atomic_load(&c->probe_port), tries = 0;
  memset(s, 0, sizeof(*s));
  s->t = t;
  s->rss_kib = status_field(pid, "VmRSS");
  s->threads = status_field(pid, "Threads");
  s->fds = count_fds(pid);
  while (read_offsets(rk, topic, np, s) && ++tries < 3)
    sleep(1);
  if (tries == 3) {
    fprintf(stderr, "soak: the committed offsets could not be read\n");
    s->committed = s->lag = -1;
  }
  s->handled = atomic_load(&c->handled);
  s->fired = atomic_load(&c->fired);
  s->bad = atomic_load(&c->bad_attempts);
  s->member = member;
  s->deferred = s->pending = s->assigned_parts = -1;
  if (port > 0 && t_http_get(port, "/metrics", body, sizeof(body)) == 200) {
    s->deferred = metric(body, "prosody_deferred_total");
    s->pending = metric(body, "prosody_timers_pending");
    s->assigned_parts = metric(body, "prosody_partitions_assigned");
  }
}

/* The samples' table: its header, and sample i's row (with the change
 * since sample i - 1). */
static void print_header(FILE *out) {
  fprintf(out, "| minute | at | RSS MiB | fds | threads | committed | "
               "commits/min | lag | handled/min | timers fired/min | "
               "failing-key attempts/min | deferred | timers pending | "
               "partitions | member |\n");
  fprintf(out,
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
}

static void print_row(FILE *out, const sample_t *s, int i) {
  const sample_t *a = &s[i], *b = i ? &s[i - 1] : &s[0];
  fprintf(out,
          "| %d | %d:%02d | %.1f | %ld | %ld | %lld | %lld | %lld | %ld | %ld "
          "| %ld | %ld | %ld | %ld | %s |\n",
          i, (int)a->t / 60, (int)a->t % 60, (double)a->rss_kib / 1024.0,
          a->fds, a->threads, (long long)a->committed,
          (long long)(a->committed - b->committed), (long long)a->lag,
          a->handled - b->handled, a->fired - b->fired, a->bad - b->bad,
          a->deferred, a->pending, a->assigned_parts, a->member ? "in" : "");
  fflush(out);
}

/* The plateau of one series: the last third's maximum against the middle
 * third's. */
typedef struct plateau {
  const char *name, *unit;
  double first, warm_max, mid_max, last_max, last, limit;
  double slope; /* per minute, least squares over the samples after warm-up */
  int ok;
} plateau_t;

static plateau_t plateau_of(const char *name, const char *unit,
                            const sample_t *s, int n, size_t field,
                            double scale, double rel, double slack) {
  plateau_t p = {name, unit, 0, 0, 0, 0, 0, 0, 0, 1};
  double sx = 0, sy = 0, sxx = 0, sxy = 0, k = 0;
  int w = n / 3 > 0 ? n / 3 : 1, m = 2 * n / 3 > w ? 2 * n / 3 : w + 1;
#define AT(i) ((double)*(const long *)((const char *)&s[i] + field) / scale)
  p.first = AT(1);
  p.last = AT(n);
  for (int i = 1; i <= n; i++) {
    double v = AT(i);
    double *max = i <= w ? &p.warm_max : i <= m ? &p.mid_max : &p.last_max;
    if (v > *max)
      *max = v;
    if (i > w) {
      sx += i, sy += v, sxx += (double)i * i, sxy += i * v, k++;
    }
  }
  if (k > 1)
    p.slope = (k * sxy - sx * sy) / (k * sxx - sx * sx);
#undef AT
  p.limit = p.mid_max * (1 + rel) + slack;
  p.ok = p.last_max <= p.limit;
  return p;
}

static void report(FILE *out, const sample_t *s, int n, const char *topic,
                   int partitions, const plateau_t *pl, int npl,
                   const char *const *checks, const int *ok, int nchecks,
                   const soak_stats_t *st) {
  time_t now = time(NULL);
  char date[32];
  strftime(date, sizeof(date), "%Y-%m-%d %H:%M UTC", gmtime(&now));
  fprintf(out,
          "### Soak, %d minutes (%s)\n\n"
          "Topic `%s`, %d partitions; %ld records/s over %ld keys, every "
          "hundredth to `" BAD_KEY "` (fails for ever, transient); every "
          "tenth handled record schedules a timer 5-44 s ahead. A member "
          "joined %ld times and left %ld times (%ld killed after a 45 s "
          "grace, %ld died by itself).\n\n",
          n, date, topic, partitions, rate, keys, joins, leaves, member_killed,
          member_died);
  print_header(out);
  for (int i = 0; i <= n; i++)
    print_row(out, s, i);
  fprintf(out,
          "\n| series | first | warm-up max | middle-third max | "
          "last-third max | last | limit | slope after warm-up | verdict |\n"
          "|---|---|---|---|---|---|---|---|---|\n");
  for (int i = 0; i < npl; i++)
    fprintf(out,
            "| %s (%s) | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %+.2f/min | "
            "%s |\n",
            pl[i].name, pl[i].unit, pl[i].first, pl[i].warm_max, pl[i].mid_max,
            pl[i].last_max, pl[i].last, pl[i].limit, pl[i].slope,
            pl[i].ok ? "plateau" : "**FAIL**");
  fprintf(
      out,
      "\nTotals: consumer handled %ld, scheduled %ld timers (%ld "
      "failed), %ld fired, `" BAD_KEY "` attempted %ld times, %ld "
      "assignments and %ld revocations; members handled %ld, %ld "
      "timers fired, `" BAD_KEY "` attempted %ld times; subscriptions "
      "retried (Cassandra unreachable): consumer %ld, members %ld. Sent "
      "%ld (%ld failed).\n\n",
      atomic_load(&st->consumer.handled), atomic_load(&st->consumer.scheduled),
      atomic_load(&st->consumer.schedule_failed),
      atomic_load(&st->consumer.fired), atomic_load(&st->consumer.bad_attempts),
      atomic_load(&st->consumer.assigned), atomic_load(&st->consumer.revoked),
      atomic_load(&st->member.handled), atomic_load(&st->member.fired),
      atomic_load(&st->member.bad_attempts),
      atomic_load(&st->consumer.subscribe_retries),
      atomic_load(&st->member.subscribe_retries), atomic_load(&sent),
      atomic_load(&send_failed));
  for (int i = 0; i < nchecks; i++)
    fprintf(out, "- %s: %s\n", checks[i], ok[i] ? "pass" : "**FAIL**");
}

static int orchestrate(int minutes, const char *summary_path) {
  int partitions = (int)env_long("SOAK_PARTITIONS", 8), nchecks = 0;
  const char *topic = t_topic("soak");
  char group[160];
  sample_t *s = calloc((size_t)minutes + 1, sizeof(*s));
  int stats_fd = memfd_create("soak-stats", 0);
  soak_stats_t *st;
  pthread_t producer;
  rd_kafka_t *reader;
  pid_t consumer, member = 0;
  double t0, member_since = 0, next_join;
  const char *checks[8];
  int ok[8], failed = 0, dead = 0;
  plateau_t pl[3];
  rate = env_long("SOAK_RATE", 200);
  keys = env_long("SOAK_KEYS", 2000);
  CHECK(s && stats_fd >= 0 && !ftruncate(stats_fd, sizeof(*st)), "setup: %s",
        strerror(errno));
  st = mmap(NULL, sizeof(*st), PROT_READ | PROT_WRITE, MAP_SHARED, stats_fd, 0);
  CHECK(st != MAP_FAILED, "mmap: %s", strerror(errno));
  snprintf(group, sizeof(group), "%s-group", topic);
  t_create_topic(topic, partitions);
  consumer = spawn("consumer", topic, group, stats_fd);
  {
    double deadline = t_now() + 180;
    while (!atomic_load(&st->consumer.assigned) && t_now() < deadline)
      usleep(100000);
    CHECK(atomic_load(&st->consumer.assigned), "no partitions in 180 s");
  }
  /* Made after the consumer started, which must not inherit its sockets. */
  {
    char err[512];
    rd_kafka_conf_t *kc = rd_kafka_conf_new();
    rd_kafka_conf_set(kc, "bootstrap.servers", t_bootstrap(), err, sizeof(err));
    rd_kafka_conf_set(kc, "group.id", group, err, sizeof(err));
    rd_kafka_conf_set(kc, "enable.auto.commit", "false", err, sizeof(err));
    reader = rd_kafka_new(RD_KAFKA_CONSUMER, kc, err, sizeof(err));
    CHECK(reader, "offset reader: %s", err);
  }
  pthread_create(&producer, NULL, produce, (void *)topic);
  t0 = t_now();
  next_join = t0 + 90;
  printf("soak: %d minutes, topic %s, consumer pid %d, %ld records/s\n",
         minutes, topic, (int)consumer, rate);
  take_sample(&s[0], 0, consumer, &st->consumer, reader, topic, partitions, 0);
  print_header(stdout);
  print_row(stdout, s, 0);
  for (int k = 1; k <= minutes;) {
    double now = t_now();
    int status;
    if (waitpid(consumer, &status, WNOHANG) == consumer) {
      dead = 1;
      fprintf(stderr, "soak: the consumer died (status %d)\n", status);
      break;
    }
    if (member && waitpid(member, &status, WNOHANG) == member) {
      fprintf(stderr, "soak: the member died (status %d)\n", status);
      member_died++;
      member = 0;
      leaves++;
    }
    if (!member && now >= next_join) {
      member = spawn("member", topic, group, stats_fd);
      member_since = now;
      joins++;
      next_join += 120;
    } else if (member && now - member_since >= 60) {
      if (!stop_child(member, 45))
        member_killed++;
      member = 0;
      leaves++;
    }
    if (now - t0 >= 60.0 * k) {
      take_sample(&s[k], now - t0, consumer, &st->consumer, reader, topic,
                  partitions, !!member);
      print_row(stdout, s, k);
      k++;
    }
    usleep(200000);
  }
  atomic_store(&stop_producing, 1);
  pthread_join(producer, NULL);
  if (member) {
    member_killed += !stop_child(member, 45);
    leaves++;
  }
  if (dead)
    return 1;
  checks[nchecks] = "the consumer left the group and exited within 60 s";
  ok[nchecks++] = stop_child(consumer, 60);

  {
    int commits = 1, timers = 1, n = minutes, third = n - 2 * n / 3;
    for (int k = 2; k <= n; k++) {
      commits &= s[k].committed > s[k - 1].committed;
      timers &= s[k].fired > s[k - 1].fired;
    }
    checks[nchecks] = "commits moved in every minute after the first";
    ok[nchecks++] = commits;
    checks[nchecks] = "timers fired in every minute after the first";
    ok[nchecks++] = timers;
    checks[nchecks] = "the failing key was retried in the last third";
    ok[nchecks++] = n >= 3 &&
                    atomic_load(&st->consumer.bad_attempts) +
                            atomic_load(&st->member.bad_attempts) >
                        0 &&
                    s[n].bad > s[n - third].bad;
    pl[0] = plateau_of("RSS", "MiB", s, n, offsetof(sample_t, rss_kib), 1024,
                       0.10, 4);
    pl[1] =
        plateau_of("open fds", "count", s, n, offsetof(sample_t, fds), 1, 0, 4);
    pl[2] = plateau_of("threads", "count", s, n, offsetof(sample_t, threads), 1,
                       0, 4);
    for (int i = 0; i < 3; i++) {
      static char names[3][64];
      snprintf(names[i], sizeof(names[i]), "%s plateau", pl[i].name);
      checks[nchecks] = names[i];
      ok[nchecks++] = pl[i].ok;
    }
  }
  printf("\n");
  report(stdout, s, minutes, topic, partitions, pl, 3, checks, ok, nchecks, st);
  if (summary_path) {
    FILE *f = fopen(summary_path, "w");
    CHECK(f, "%s: %s", summary_path, strerror(errno));
    report(f, s, minutes, topic, partitions, pl, 3, checks, ok, nchecks, st);
    fclose(f);
  }
  for (int i = 0; i < nchecks; i++)
    if (!ok[i]) {
      fprintf(stderr, "soak: FAILED: %s\n", checks[i]);
      failed = 1;
    }
  rd_kafka_destroy(reader);
  free(s);
  return failed;
}

int main(int argc, char **argv) {
  setenv("PROSODY_TEST_REAL", "1", 1); /* the real tier only */
  if (argc == 5 && (!strcmp(argv[1], "consumer") || !strcmp(argv[1], "member")))
    return run_consumer(argv[2], argv[3], atoi(argv[4]),
                        !strcmp(argv[1], "consumer"));
  if (argc < 2 || atoi(argv[1]) < 3) {
    fprintf(stderr, "usage: soak MINUTES(>=3) [SUMMARY.md]\n");
    return 2;
  }
  return orchestrate(atoi(argv[1]), argc > 2 ? argv[2] : NULL);
}
