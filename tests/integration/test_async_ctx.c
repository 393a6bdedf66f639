/*
 * test_async_ctx.c - the non-blocking context calls an event-loop host (a
 * language binding) uses. An asynchronous handler hands every event to a
 * "host loop" thread of the test, which serves it and completes it:
 *  - prosody_timer_async from the host thread: SCHEDULE, SCHEDULED,
 *    UNSCHEDULE, CLEAR_AND_SCHEDULE, CLEAR, each checked in its callback,
 *    which runs on the engine thread; pipelined calls; argument errors and
 *    a finished or stale context refused at once, the callback never
 *    called; a timer scheduled this way fires on_timer with its key and
 *    time, and scheduled() from the firing timer's context leaves it out;
 *  - prosody_timer_async from the engine thread itself (inside on_message,
 *    and again inside its callback), whatever the store;
 *  - prosody_context_on_cancel: fires once, on the engine thread, at the
 *    handler timeout and at 80% of shutdown_timeout on unsubscribe for
 *    events the host does not complete by itself; runs at once on an
 *    already cancelled context; a replaced registration never fires;
 *    nothing fires for invocations that completed; a finished or stale
 *    context is refused. Timer calls made once the shutdown cancelled an
 *    event all reach their callback (refused), none is lost.
 */
#include <pthread.h>

#include "harness.h"

#define LOG_SIZE 1024
#define HANG_OPS 20

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;

/* Everything below is guarded by lock. */
static pthread_t engine_tid, host_tid;
static int engine_tid_set;
static char failure[1024]; /* the first failure seen off the main thread */

enum { J_EVENT, J_CANCELLED, J_STOP };
typedef struct job {
  struct job *next;
  int kind;
  int is_timer;
  prosody_context_t *ctx;
  char key[64];
  int64_t time_ms; /* a timer's time */
} job_t;
static job_t *jobs_head, *jobs_tail;

static int64_t ops_base;           /* whole second an hour ahead */
static char ops_log[LOG_SIZE];     /* results, in order */
static int ops_done;               /* the ops event was served */
static prosody_context_t *ops_ctx; /* kept past its handler */
static int64_t fire_target;        /* the time asked for (ms) */
static int64_t fire_time, fire_at; /* on_timer's time and wall clock */
static char fire_log[LOG_SIZE];
static int fire_done;
static char inline_log[LOG_SIZE]; /* engine-thread calls, in order */
static int inline_calls;          /* their callbacks so far */
static int inline_done;
static double tmo_started, tmo_cancelled_at;
static int tmo_done;
static int now_cb_on_host = -1; /* on_cancel on a cancelled context */
static int hang_registered;
static int64_t hang_cancel_ns;
static int hang_ops_ok, hang_ops_cb, hang_ops_refused;
static char hang_ops_err[256];
static int hang_done;
static int unexpected_cancels, wrong_cancels, cancels_off_engine;
static int stale_cb_calls; /* callbacks of refused calls: must stay 0 */

#define FAIL(...) host_fail(__LINE__, __VA_ARGS__)

static void host_fail(int line, const char *fmt, ...) {
  va_list ap;
  pthread_mutex_lock(&lock);
  if (!failure[0]) {
    int n = snprintf(failure, sizeof(failure), "line %d: ", line);
    va_start(ap, fmt);
    vsnprintf(failure + n, sizeof(failure) - (size_t)n, fmt, ap);
    va_end(ap);
  }
  pthread_cond_broadcast(&cond);
  pthread_mutex_unlock(&lock);
}

/* 1 on the engine thread (lock held). */
static int on_engine_locked(void) {
  return engine_tid_set && pthread_equal(pthread_self(), engine_tid);
}

/* Waits (lock held) until `cond_expr`, a failure, or the deadline. */
#define WAIT_UNTIL(cond_expr, seconds)                                         \
  T_WAIT_UNTIL((cond_expr) || failure[0], &cond, &lock, seconds)

/* Appends to a log (lock held). */
static void log_add(char *log, const char *fmt, ...) {
  size_t len = strlen(log);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(log + len, LOG_SIZE - len, fmt, ap);
  va_end(ap);
}

/* Hands a job to the host loop (any thread). */
static void post(int kind, int is_timer, prosody_context_t *ctx,
                 const char *key, int64_t time_ms) {
  job_t *j = calloc(1, sizeof(*j));
  CHECK(j, "out of memory");
  j->kind = kind;
  j->is_timer = is_timer;
  j->ctx = ctx;
  snprintf(j->key, sizeof(j->key), "%s", key ? key : "");
  j->time_ms = time_ms;
  pthread_mutex_lock(&lock);
  if (jobs_tail)
    jobs_tail->next = j;
  else
    jobs_head = j;
  jobs_tail = j;
  pthread_cond_broadcast(&cond);
  pthread_mutex_unlock(&lock);
}

/* --- Timer calls and their callbacks ----------------------------------- */

/* One prosody_timer_async call's result, as its callback saw it. */
typedef struct call {
  int done; /* callbacks so far (must end at 1) */
  int on_engine;
  int malformed; /* a success with errstr, or times and n disagreeing */
  prosody_err_t err;
  char errstr[256];
  char times[256]; /* "[t1,t2]" relative to `base` */
  int64_t base;
} call_t;

static void timer_cb(prosody_err_t err, const char *errstr,
                     const int64_t *times, size_t n, void *opaque) {
  call_t *c = opaque;
  int off = 0;
  pthread_mutex_lock(&lock);
  c->done++;
  c->on_engine = on_engine_locked();
  c->err = err;
  snprintf(c->errstr, sizeof(c->errstr), "%s", errstr ? errstr : "(null)");
  c->malformed = !err && (errstr || (n == 0) != (times == NULL));
  off += snprintf(c->times + off, sizeof(c->times) - (size_t)off, "[");
  for (size_t i = 0; i < n; i++)
    off += snprintf(c->times + off, sizeof(c->times) - (size_t)off, "%s%lld",
                    i ? "," : "", (long long)(times[i] - c->base));
  snprintf(c->times + off, sizeof(c->times) - (size_t)off, "]");
  pthread_cond_broadcast(&cond);
  pthread_mutex_unlock(&lock);
}

/* A callback that must never run. */
static void never_cb(prosody_err_t err, const char *errstr,
                     const int64_t *times, size_t n, void *opaque) {
  (void)err;
  (void)errstr;
  (void)times;
  (void)n;
  (void)opaque;
  pthread_mutex_lock(&lock);
  stale_cb_calls++;
  pthread_cond_broadcast(&cond);
  pthread_mutex_unlock(&lock);
}

static const char *op_name(prosody_timer_op_t op) {
  static const char *names[] = {"SCHEDULE", "UNSCHEDULE", "CLEAR_AND_SCHEDULE",
                                "CLEAR", "SCHEDULED"};
  return (int)op >= 0 && (int)op < 5 ? names[op] : "?";
}

/* Starts `op` without waiting (host thread). */
static int start_call(prosody_context_t *ctx, prosody_timer_op_t op,
                      int64_t time_ms, int64_t base, call_t *c) {
  char err[256];
  prosody_err_t e;
  memset(c, 0, sizeof(*c));
  c->base = base;
  e = prosody_timer_async(ctx, op, time_ms, timer_cb, c, err, sizeof(err));
  if (e) {
    FAIL("prosody_timer_async(%s): %s: %s", op_name(op), prosody_err_name(e),
         err);
    return -1;
  }
  return 0;
}

/* Waits for a started call's callback (host thread); 0 when it came once,
 * on the engine thread. */
static int finish_call(prosody_timer_op_t op, call_t *c) {
  int ok;
  pthread_mutex_lock(&lock);
  WAIT_UNTIL(c->done, 30);
  ok = c->done == 1 && c->on_engine && !c->malformed;
  pthread_mutex_unlock(&lock);
  if (!ok)
    FAIL("%s: %d callback(s), on the engine thread: %d, malformed: %d",
         op_name(op), c->done, c->on_engine, c->malformed);
  return ok ? 0 : -1;
}

/* Runs `op` and waits for its result; appends "OP:result " to `log`. */
static int host_call(prosody_context_t *ctx, prosody_timer_op_t op,
                     int64_t time_ms, int64_t base, char *log) {
  call_t c;
  if (start_call(ctx, op, time_ms, base, &c) || finish_call(op, &c))
    return -1;
  pthread_mutex_lock(&lock);
  if (c.err)
    log_add(log, "%s:%s ", op_name(op), prosody_err_name(c.err));
  else if (op == PROSODY_TIMER_SCHEDULED)
    log_add(log, "%s ", c.times);
  else
    log_add(log, "ok ");
  pthread_mutex_unlock(&lock);
  return c.err ? -1 : 0;
}

/* --- Cancellation callbacks (engine thread, the context's lock held) --- */

static void unexpected_cancel(prosody_context_t *ctx, void *opaque) {
  (void)ctx;
  pthread_mutex_lock(&lock);
  unexpected_cancels++;
  if (!failure[0])
    snprintf(failure, sizeof(failure), "%s was cancelled",
             (const char *)opaque);
  pthread_cond_broadcast(&cond);
  pthread_mutex_unlock(&lock);
}

static void wrong_cancel(prosody_context_t *ctx, void *opaque) {
  (void)ctx;
  (void)opaque;
  pthread_mutex_lock(&lock);
  wrong_cancels++; /* a replaced registration */
  pthread_mutex_unlock(&lock);
}

static void tmo_cancel(prosody_context_t *ctx, void *opaque) {
  (void)opaque;
  pthread_mutex_lock(&lock);
  cancels_off_engine += !on_engine_locked();
  tmo_cancelled_at = t_now();
  pthread_mutex_unlock(&lock);
  post(J_CANCELLED, 0, ctx, "tmo", 0);
}

static void hang_cancel(prosody_context_t *ctx, void *opaque) {
  (void)opaque;
  pthread_mutex_lock(&lock);
  cancels_off_engine += !on_engine_locked();
  hang_cancel_ns = t_mono_ns();
  pthread_mutex_unlock(&lock);
  post(J_CANCELLED, 0, ctx, "hang", 0);
}

static void now_cancel(prosody_context_t *ctx, void *opaque) {
  (void)ctx;
  (void)opaque;
  pthread_mutex_lock(&lock);
  now_cb_on_host = pthread_equal(pthread_self(), host_tid);
  pthread_mutex_unlock(&lock);
}

static void hang_op_cb(prosody_err_t err, const char *errstr,
                       const int64_t *times, size_t n, void *opaque) {
  (void)times;
  (void)n;
  (void)opaque;
  pthread_mutex_lock(&lock);
  hang_ops_cb++;
  if (err == PROSODY_ERR_STATE)
    hang_ops_refused++;
  else
    snprintf(hang_ops_err, sizeof(hang_ops_err), "%s: %s",
             prosody_err_name(err), errstr ? errstr : "(null)");
  pthread_cond_broadcast(&cond);
  pthread_mutex_unlock(&lock);
}

/* --- The engine-thread calls (inline) ---------------------------------- */

static void inline_listed(prosody_err_t err, const char *errstr,
                          const int64_t *times, size_t n, void *opaque) {
  (void)opaque;
  pthread_mutex_lock(&lock);
  inline_calls++;
  if (!on_engine_locked())
    log_add(inline_log, "off-engine ");
  if (err)
    log_add(inline_log, "SCHEDULED:%s:%s ", prosody_err_name(err), errstr);
  for (size_t i = 0; i < n; i++)
    log_add(inline_log, "%lld ", (long long)(times[i] - ops_base));
  pthread_cond_broadcast(&cond);
  pthread_mutex_unlock(&lock);
}

static void inline_written(prosody_err_t err, const char *errstr,
                           const int64_t *times, size_t n, void *opaque) {
  prosody_context_t *ctx = opaque;
  char why[256];
  prosody_err_t e;
  (void)times;
  (void)n;
  pthread_mutex_lock(&lock);
  inline_calls++;
  if (!on_engine_locked())
    log_add(inline_log, "off-engine ");
  log_add(inline_log, "%s ", err ? prosody_err_name(err) : "ok");
  if (err)
    log_add(inline_log, "(%s) ", errstr);
  pthread_mutex_unlock(&lock);
  /* Chained from the callback, on the engine thread again. */
  e = prosody_timer_async(ctx, PROSODY_TIMER_SCHEDULED, 0, inline_listed, ctx,
                          why, sizeof(why));
  if (e)
    FAIL("SCHEDULED from a callback: %s: %s", prosody_err_name(e), why);
}

/* --- The handler (engine thread) ---------------------------------------- */

static void note_engine_thread(const char *what) {
  pthread_mutex_lock(&lock);
  if (!engine_tid_set) {
    engine_tid = pthread_self();
    engine_tid_set = 1;
  } else if (!pthread_equal(engine_tid, pthread_self()) && !failure[0]) {
    snprintf(failure, sizeof(failure), "%s ran off the engine thread", what);
  }
  pthread_mutex_unlock(&lock);
}

static prosody_result_t on_message(prosody_context_t *ctx,
                                   const prosody_message_t *msg, void *op) {
  const char *key = prosody_message_key(msg);
  (void)op;
  note_engine_thread("on_message");
  if (!strcmp(key, "inline")) {
    char why[256];
    int64_t base;
    prosody_err_t e;
    pthread_mutex_lock(&lock);
    base = ops_base;
    pthread_mutex_unlock(&lock);
    /* The memory store answers before this returns, Cassandra later: both
     * on this thread. */
    e = prosody_timer_async(ctx, PROSODY_TIMER_SCHEDULE, base + 7000,
                            inline_written, ctx, why, sizeof(why));
    if (e)
      FAIL("SCHEDULE from the engine thread: %s: %s", prosody_err_name(e), why);
  }
  if (!strcmp(key, "tmo")) {
    pthread_mutex_lock(&lock);
    tmo_started = t_now();
    pthread_mutex_unlock(&lock);
  }
  post(J_EVENT, 0, ctx, key, 0);
  return PROSODY_PENDING;
}

static prosody_result_t on_timer(prosody_context_t *ctx,
                                 const prosody_timer_t *timer, void *op) {
  (void)op;
  note_engine_thread("on_timer");
  post(J_EVENT, 1, ctx, prosody_timer_key(timer), prosody_timer_time(timer));
  return PROSODY_PENDING;
}

/* --- The host loop ------------------------------------------------------ */

static void complete(prosody_context_t *ctx, prosody_result_t r,
                     const char *what) {
  prosody_err_t e = prosody_complete(ctx, r, NULL);
  if (e)
    FAIL("complete %s: %s", what, prosody_err_name(e));
}

/* Every call of a finished context is refused at once, without callback. */
static void check_refused(prosody_context_t *ctx, const char *what) {
  char err[256] = "";
  prosody_err_t e =
      prosody_timer_async(ctx, PROSODY_TIMER_SCHEDULE, t_wall_ms() + 60000,
                          never_cb, NULL, err, sizeof(err));
  if (e != PROSODY_ERR_STATE || !strstr(err, "stale"))
    FAIL("%s: timer call on a finished context: %s: %s", what,
         prosody_err_name(e), err);
  e = prosody_timer_async(ctx, PROSODY_TIMER_SCHEDULED, 0, never_cb, NULL, err,
                          sizeof(err));
  if (e != PROSODY_ERR_STATE)
    FAIL("%s: SCHEDULED on a finished context: %s", what, prosody_err_name(e));
  e = prosody_context_on_cancel(ctx, unexpected_cancel, (void *)what);
  if (e != PROSODY_ERR_STATE)
    FAIL("%s: on_cancel on a finished context: %s", what, prosody_err_name(e));
}

static void serve_ops(prosody_context_t *ctx) {
  char err[256];
  int64_t b;
  prosody_err_t e;
  call_t c[3];
  pthread_mutex_lock(&lock);
  b = ops_base;
  pthread_mutex_unlock(&lock);
  if (prosody_context_on_cancel(ctx, unexpected_cancel, "ops"))
    FAIL("on_cancel(ops) refused");

  /* Argument errors: refused at once, no callback. */
  e = prosody_timer_async(ctx, PROSODY_TIMER_SCHEDULE, b, NULL, NULL, err,
                          sizeof(err));
  if (e != PROSODY_ERR_INVALID_ARG || !strstr(err, "callback"))
    FAIL("NULL callback: %s: %s", prosody_err_name(e), err);
  e = prosody_timer_async(ctx, (prosody_timer_op_t)99, b, never_cb, NULL, err,
                          sizeof(err));
  if (e != PROSODY_ERR_INVALID_ARG || !strstr(err, "99"))
    FAIL("unknown operation: %s: %s", prosody_err_name(e), err);
  e = prosody_timer_async(ctx, PROSODY_TIMER_SCHEDULE, -1500, never_cb, NULL,
                          err, sizeof(err));
  if (e != PROSODY_ERR_INVALID_ARG || !strstr(err, "-1500"))
    FAIL("negative time: %s: %s", prosody_err_name(e), err);
  e = prosody_timer_async(ctx, PROSODY_TIMER_CLEAR_AND_SCHEDULE,
                          INT64_C(5000000000000), never_cb, NULL, err,
                          sizeof(err));
  if (e != PROSODY_ERR_INVALID_ARG || !strstr(err, "2106"))
    FAIL("time past 2106: %s: %s", prosody_err_name(e), err);

  /* One at a time. */
  host_call(ctx, PROSODY_TIMER_SCHEDULE, b + 1000, b, ops_log);
  host_call(ctx, PROSODY_TIMER_SCHEDULE, b + 2000, b, ops_log);
  host_call(ctx, PROSODY_TIMER_SCHEDULE, b + 3000 + 300, b, ops_log);
  host_call(ctx, PROSODY_TIMER_SCHEDULED, 0, b, ops_log);
  host_call(ctx, PROSODY_TIMER_UNSCHEDULE, b + 2000, b, ops_log);
  host_call(ctx, PROSODY_TIMER_SCHEDULED, -1, b, ops_log); /* time ignored */
  host_call(ctx, PROSODY_TIMER_CLEAR_AND_SCHEDULE, b + 4600, b, ops_log);
  host_call(ctx, PROSODY_TIMER_SCHEDULED, 0, b, ops_log);
  host_call(ctx, PROSODY_TIMER_CLEAR, -1, b, ops_log); /* time ignored */
  host_call(ctx, PROSODY_TIMER_SCHEDULED, 0, b, ops_log);

  /* Pipelined: three in flight at once, each with its own callback. */
  for (int i = 0; i < 3; i++)
    start_call(ctx, PROSODY_TIMER_SCHEDULE, b + 10000 * (i + 1), b, &c[i]);
  for (int i = 0; i < 3; i++)
    if (!finish_call(PROSODY_TIMER_SCHEDULE, &c[i]) && c[i].err)
      FAIL("pipelined SCHEDULE: %s", c[i].errstr);
  host_call(ctx, PROSODY_TIMER_SCHEDULED, 0, b, ops_log);
  host_call(ctx, PROSODY_TIMER_CLEAR, 0, b, ops_log);

  complete(ctx, PROSODY_SUCCESS, "ops");
  check_refused(ctx, "ops"); /* finished, perhaps not yet released */
  pthread_mutex_lock(&lock);
  ops_ctx = ctx;
  ops_done = 1;
  pthread_cond_broadcast(&cond);
  pthread_mutex_unlock(&lock);
}

static void serve_fire_message(prosody_context_t *ctx) {
  int64_t target = t_wall_ms() + 1500;
  prosody_context_on_cancel(ctx, unexpected_cancel, "fire");
  pthread_mutex_lock(&lock);
  fire_target = target;
  pthread_mutex_unlock(&lock);
  host_call(ctx, PROSODY_TIMER_SCHEDULE, target, 0, fire_log);
  complete(ctx, PROSODY_SUCCESS, "fire");
}

static void serve_fire_timer(prosody_context_t *ctx, const char *key,
                             int64_t time_ms) {
  prosody_context_on_cancel(ctx, unexpected_cancel, "fire timer");
  pthread_mutex_lock(&lock);
  fire_time = time_ms;
  fire_at = t_wall_ms();
  log_add(fire_log, "fired:%s ", key);
  pthread_mutex_unlock(&lock);
  /* The firing timer is not listed. */
  host_call(ctx, PROSODY_TIMER_SCHEDULED, 0, 0, fire_log);
  complete(ctx, PROSODY_SUCCESS, "fire timer");
  check_refused(ctx, "fire timer");
  pthread_mutex_lock(&lock);
  fire_done = 1;
  pthread_cond_broadcast(&cond);
  pthread_mutex_unlock(&lock);
}

static void serve_inline(prosody_context_t *ctx) {
  prosody_context_on_cancel(ctx, unexpected_cancel, "inline");
  /* Both engine-thread callbacks (Cassandra answers later). */
  pthread_mutex_lock(&lock);
  WAIT_UNTIL(inline_calls >= 2, 30);
  pthread_mutex_unlock(&lock);
  host_call(ctx, PROSODY_TIMER_CLEAR, 0, 0, inline_log);
  complete(ctx, PROSODY_SUCCESS, "inline");
  pthread_mutex_lock(&lock);
  inline_done = 1;
  pthread_cond_broadcast(&cond);
  pthread_mutex_unlock(&lock);
}

static void serve_cancelled(prosody_context_t *ctx, const char *key) {
  if (!prosody_should_cancel(ctx))
    FAIL("%s: cancel callback before should_cancel", key);
  if (!strcmp(key, "tmo")) {
    /* Already cancelled: runs at once, here. */
    if (prosody_context_on_cancel(ctx, now_cancel, NULL))
      FAIL("on_cancel on a cancelled context refused");
    complete(ctx, PROSODY_SUCCESS, "tmo");
    check_refused(ctx, "tmo");
    pthread_mutex_lock(&lock);
    tmo_done = 1;
    pthread_cond_broadcast(&cond);
    pthread_mutex_unlock(&lock);
    return;
  }
  /* hang: the consumer is shutting down. Every call is accepted (the
   * context is live) and refused through its callback. */
  for (int i = 0; i < HANG_OPS; i++) {
    char err[256];
    prosody_err_t e =
        prosody_timer_async(ctx, PROSODY_TIMER_SCHEDULE, t_wall_ms() + 60000,
                            hang_op_cb, NULL, err, sizeof(err));
    if (e)
      FAIL("timer call during shutdown: %s: %s", prosody_err_name(e), err);
    else {
      pthread_mutex_lock(&lock);
      hang_ops_ok++;
      pthread_mutex_unlock(&lock);
    }
  }
  pthread_mutex_lock(&lock);
  WAIT_UNTIL(hang_ops_cb >= hang_ops_ok, 30);
  pthread_mutex_unlock(&lock);
  complete(ctx, PROSODY_TRANSIENT, "hang"); /* aborted: redelivered */
  pthread_mutex_lock(&lock);
  hang_done = 1;
  pthread_cond_broadcast(&cond);
  pthread_mutex_unlock(&lock);
}

static void *host_loop(void *arg) {
  (void)arg;
  for (;;) {
    job_t *j;
    pthread_mutex_lock(&lock);
    while (!jobs_head)
      pthread_cond_wait(&cond, &lock);
    j = jobs_head;
    jobs_head = j->next;
    if (!jobs_head)
      jobs_tail = NULL;
    pthread_mutex_unlock(&lock);
    if (j->kind == J_STOP) {
      free(j);
      return NULL;
    }
    if (j->kind == J_CANCELLED)
      serve_cancelled(j->ctx, j->key);
    else if (j->is_timer && !strcmp(j->key, "fire"))
      serve_fire_timer(j->ctx, j->key, j->time_ms);
    else if (j->is_timer)
      FAIL("unexpected timer of %s at %lld", j->key, (long long)j->time_ms);
    else if (!strcmp(j->key, "ops"))
      serve_ops(j->ctx);
    else if (!strcmp(j->key, "fire"))
      serve_fire_message(j->ctx);
    else if (!strcmp(j->key, "inline"))
      serve_inline(j->ctx);
    else if (!strcmp(j->key, "tmo")) {
      /* The first registration is replaced: only tmo_cancel fires. */
      if (prosody_context_on_cancel(j->ctx, wrong_cancel, NULL) ||
          prosody_context_on_cancel(j->ctx, tmo_cancel, NULL))
        FAIL("on_cancel(tmo) refused");
    } else if (!strcmp(j->key, "hang")) {
      if (prosody_context_on_cancel(j->ctx, hang_cancel, NULL))
        FAIL("on_cancel(hang) refused");
      pthread_mutex_lock(&lock);
      hang_registered = 1;
      pthread_cond_broadcast(&cond);
      pthread_mutex_unlock(&lock);
    } else
      FAIL("unexpected key %s", j->key);
    free(j);
  }
}

static void produce(const char *topic, const char *const *keys) {
  char err[1024];
  prosody_config_t *conf = t_config();
  prosody_client_t *prod;
  t_set(conf, "source_system", "async-ctx-test");
  prod = prosody_client_new(conf, err, sizeof(err));
  CHECK(prod, "producer: %s", err);
  for (int i = 0; keys[i]; i++)
    CHECK_OK(prosody_send(prod, topic, keys[i], "{}", NULL, err, sizeof(err)),
             err);
  prosody_client_destroy(prod);
}

T_SCENARIO(async_timer_calls_and_cancel_callbacks_from_host_loop, T_BOTH, 120) {
  char err[1024], group[160];
  const char *topic = t_topic("async-ctx");
  /* tmo first: its cancel callback is registered before its timeout. */
  const char *first[] = {"tmo", "ops", "fire", "inline", NULL};
  const char *last[] = {"hang", NULL};
  prosody_handler_t handler = {on_message, on_timer, NULL,
                               PROSODY_HANDLER_ASYNC};
  prosody_config_t *conf;
  prosody_client_t *client;
  pthread_t host;
  int64_t start_ns;
  double took, cancel_at;
  prosody_context_t *kept;

  /* No context: refused at once. */
  CHECK(prosody_timer_async(NULL, PROSODY_TIMER_CLEAR, 0, never_cb, NULL, err,
                            sizeof(err)) == PROSODY_ERR_INVALID_ARG &&
            strstr(err, "context"),
        "NULL context: %s", err);
  CHECK(prosody_context_on_cancel(NULL, unexpected_cancel, NULL) ==
            PROSODY_ERR_INVALID_ARG,
        "on_cancel(NULL) accepted");

  ops_base = (t_wall_ms() / 1000 + 3600) * 1000; /* nothing fires meanwhile */
  CHECK(!pthread_create(&host, NULL, host_loop, NULL), "host thread");
  pthread_mutex_lock(&lock);
  host_tid = host;
  pthread_mutex_unlock(&lock);

  snprintf(group, sizeof(group), "%s-group", topic);
  t_create_topic(topic, 1);
  conf = t_consumer_config(group, topic);
  t_set(conf, "timeout", "3s");
  t_set(conf, "shutdown_timeout", "2s");
  client = prosody_client_new(conf, err, sizeof(err));
  CHECK(client, "client: %s", err);
  CHECK_OK(prosody_subscribe(client, &handler, err, sizeof(err)), err);
  produce(topic, first);

  pthread_mutex_lock(&lock);
  WAIT_UNTIL(ops_done && fire_done && inline_done && tmo_done, 90);
  CHECK(!failure[0], "%s", failure);
  CHECK(ops_done, "the ops event was not served");
  CHECK(!strcmp(ops_log, "ok ok ok [1000,2000,3000] ok [1000,3000] ok [5000] "
                         "ok [] [10000,20000,30000] ok "),
        "ops: %s", ops_log);

  CHECK(inline_done, "the inline event was not served");
  CHECK(!strcmp(inline_log, "ok 7000 ok "), "engine-thread calls: %s",
        inline_log);

  CHECK(fire_done, "the scheduled timer did not fire");
  CHECK(!strcmp(fire_log, "ok fired:fire [] "), "fire: %s", fire_log);
  CHECK(fire_time == (fire_target + 500) / 1000 * 1000,
        "fired at time %lld for %lld", (long long)fire_time,
        (long long)fire_target);
  CHECK(fire_at >= fire_time, "fired %lld ms early",
        (long long)(fire_time - fire_at));

  CHECK(tmo_done, "the timed-out event was not cancelled");
  CHECK(tmo_cancelled_at - tmo_started >= 2.9 &&
            tmo_cancelled_at - tmo_started < 4.5,
        "cancelled %.3f s after start with timeout 3s",
        tmo_cancelled_at - tmo_started);
  CHECK(now_cb_on_host == 1, "on_cancel on a cancelled context: %d",
        now_cb_on_host);
  pthread_mutex_unlock(&lock);

  /* Shutdown cancels an event the host never completes by itself. */
  produce(topic, last);
  pthread_mutex_lock(&lock);
  WAIT_UNTIL(hang_registered, 60);
  CHECK(!failure[0], "%s", failure);
  CHECK(hang_registered, "the hang event did not start");
  pthread_mutex_unlock(&lock);
  start_ns = t_mono_ns();
  CHECK_OK(prosody_unsubscribe(client), "unsubscribe");
  took = (double)(t_mono_ns() - start_ns) / 1e9;

  pthread_mutex_lock(&lock);
  WAIT_UNTIL(hang_done, 10);
  CHECK(!failure[0], "%s", failure);
  CHECK(hang_done, "the hang event was not cancelled");
  cancel_at = (double)(hang_cancel_ns - start_ns) / 1e9;
  CHECK(cancel_at >= 1.5 && cancel_at < 1.9,
        "cancel callback %.3f s into shutdown; want 80%% of 2 s", cancel_at);
  CHECK(hang_ops_ok == HANG_OPS && hang_ops_cb == HANG_OPS &&
            hang_ops_refused == HANG_OPS,
        "timer calls during shutdown: %d accepted, %d callbacks, %d refused "
        "(%s)",
        hang_ops_ok, hang_ops_cb, hang_ops_refused, hang_ops_err);
  pthread_mutex_unlock(&lock);
  CHECK(took < 2.6, "unsubscribe took %.3f s with shutdown_timeout 2s", took);
  prosody_client_destroy(client);

  /* A context kept past its handler (and its consumer) is stale. */
  pthread_mutex_lock(&lock);
  kept = ops_ctx;
  pthread_mutex_unlock(&lock);
  CHECK(prosody_timer_async(kept, PROSODY_TIMER_SCHEDULED, 0, never_cb, NULL,
                            err, sizeof(err)) == PROSODY_ERR_STATE &&
            strstr(err, "stale"),
        "timer call on a stale context: %s", err);
  CHECK(prosody_context_on_cancel(kept, unexpected_cancel, "stale") ==
            PROSODY_ERR_STATE,
        "on_cancel on a stale context accepted");

  post(J_STOP, 0, NULL, NULL, 0);
  pthread_join(host, NULL);
  pthread_mutex_lock(&lock);
  CHECK(unexpected_cancels == 0, "%d completed invocations were cancelled",
        unexpected_cancels);
  CHECK(wrong_cancels == 0, "a replaced cancel callback fired %d times",
        wrong_cancels);
  CHECK(cancels_off_engine == 0, "%d cancel callbacks off the engine thread",
        cancels_off_engine);
  CHECK(stale_cb_calls == 0, "%d refused calls reached a callback",
        stale_cb_calls);
  pthread_mutex_unlock(&lock);
  printf("ok: async timer calls and cancel callbacks\n");
  return 0;
}
