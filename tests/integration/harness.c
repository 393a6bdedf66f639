/*
 * harness.c - main() of every integration program: runs one scenario of the
 * program's T_SCENARIO table per process (harness.h).
 *
 *   prog NAME          runs scenario NAME: exit 0 passed, 77 skipped, else
 *                      failed (a failed CHECK exits 1)
 *   prog --list        one line per scenario: NAME TIERS TIMEOUT, TIERS being
 *                      mock, real, both or cluster; tests/scenarios.cmake
 *                      registers the ctest entries from it after each build
 *   prog --child ...   the program's T_CHILD function (a member it started)
 *   prog               every scenario of the current tier in turn, each in a
 *                      child process of its own; exit 1 if one failed
 *
 * Threads: main() only, before and after the scenario.
 */
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

static t_scenario_t *scenarios;                    /* in definition order */
static t_scenario_t **scenarios_tail = &scenarios; /* where the next goes */
static int (*child_main)(int argc, char **argv);

void t_scenario_add(t_scenario_t *s) {
  s->next = NULL;
  *scenarios_tail = s;
  scenarios_tail = &s->next;
}

void t_child_set(int (*fn)(int argc, char **argv)) { child_main = fn; }

pid_t t_spawn_child(const char *const *args, int *out) {
  char exe[512];
  const char *argv[16];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  pid_t parent = getpid(), pid;
  int fds[2], argc = 0;
  CHECK(n > 0, "readlink /proc/self/exe");
  exe[n] = '\0';
  argv[argc++] = exe;
  argv[argc++] = "--child";
  for (; *args; args++) {
    CHECK(argc < 15, "too many --child arguments");
    argv[argc++] = *args;
  }
  argv[argc] = NULL;
  CHECK(pipe(fds) == 0, "pipe");
  fflush(NULL);
  pid = fork();
  CHECK(pid >= 0, "fork");
  if (pid == 0) {
    /* A failed check ends the test: its children end with it. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
      _exit(1);
    dup2(fds[1], STDOUT_FILENO);
    close(fds[0]);
    close(fds[1]);
    execv(exe, (char *const *)argv);
    _exit(127);
  }
  close(fds[1]);
  *out = fds[0];
  return pid;
}

static const char *tiers_name(unsigned tiers) {
  switch (tiers & ~T_GROUP_WAIT) {
  case T_MOCK:
    return "mock";
  case T_REAL:
    return "real";
  case T_BOTH:
    return "both";
  case T_CLUSTER:
    return "cluster";
  }
  return "none";
}

static int run(const t_scenario_t *s) {
  char err[512];
  int rc;
  fprintf(stderr, "scenario %s\n", s->name);
  /* The mock tier: no wait before a new group's first assignment, as on
   * the real tier's broker (T_GROUP_WAIT, harness.h). Children of the
   * scenario join this process's cluster, so it holds for them too. */
  if (!t_real_bootstrap() && !(s->tiers & T_GROUP_WAIT))
    CHECK_OK(prosody_mock_set_group_initial_rebalance_delay(0, NULL, err,
                                                            sizeof(err)),
             err);
  rc = s->run();
  if (rc == 0)
    printf("ok: %s\n", s->name);
  else if (rc == T_SKIP)
    printf("skipped: %s\n", s->name);
  return rc;
}

/* Runs each scenario of the current tier in a process of its own, as ctest
 * would, so that none sees another's state. */
static int run_all(void) {
  unsigned tier = t_real_bootstrap() ? T_REAL : T_MOCK;
  int failed = 0;
  for (const t_scenario_t *s = scenarios; s; s = s->next) {
    int status;
    pid_t pid;
    if (!(s->tiers & tier))
      continue;
    fflush(NULL);
    pid = fork();
    CHECK(pid >= 0, "fork failed");
    if (pid == 0)
      exit(run(s)); /* as a CHECK would: stdout flushed */
    CHECK(waitpid(pid, &status, 0) == pid, "waitpid failed");
    if (!WIFEXITED(status) ||
        (WEXITSTATUS(status) != 0 && WEXITSTATUS(status) != T_SKIP)) {
      fprintf(stderr, "FAILED: %s\n", s->name);
      failed = 1;
    }
  }
  return failed;
}

#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
/* A crash prints the crashing thread's stack before the process dies, so
 * a crash seen once (in CI) says where: frames as offsets into the program
 * or libprosody.so (`addr2line -f -e FILE OFFSET` on the same build). The
 * sanitizers print their own. */
static void crashed(int sig) {
  void *frames[64];
  int n = backtrace(frames, 64);
  static const char head[] = "harness: crashed; the crashing thread's stack:\n";
  (void)!write(2, head, sizeof(head) - 1);
  backtrace_symbols_fd(frames, n, 2);
  signal(sig, SIG_DFL);
  raise(sig);
}

static void crash_stacks(void) {
  static const int sigs[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
  void *warm[1];
  backtrace(warm, 1); /* loads libgcc now, not in the handler */
  for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++)
    signal(sigs[i], crashed);
}
#else
static void crash_stacks(void) {}
#endif

int main(int argc, char **argv) {
  crash_stacks();
  if (argc >= 2 && !strcmp(argv[1], "--child")) {
    CHECK(child_main, "%s has no --child", argv[0]);
    return child_main(argc, argv);
  }
  if (argc == 2 && !strcmp(argv[1], "--list")) {
    for (const t_scenario_t *s = scenarios; s; s = s->next)
      printf("%s %s %d\n", s->name, tiers_name(s->tiers), s->timeout);
    return 0;
  }
  if (argc == 1)
    return run_all();
  CHECK(argc == 2, "usage: %s [--list | SCENARIO]", argv[0]);
  for (const t_scenario_t *s = scenarios; s; s = s->next)
    if (!strcmp(s->name, argv[1]))
      return run(s);
  fprintf(stderr, "%s: no scenario %s; --list names them\n", argv[0], argv[1]);
  return 2;
}
