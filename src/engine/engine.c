/*
 * engine.c - the consumer engine's life: start (consumer, timer store,
 * worker pool, loop), the loop's callbacks, shutdown and stop.
 *
 * The engine thread runs a libuv loop and owns all consumer state (see
 * internal.h for the files of the data path and which thread runs what).
 *
 * Kafka. librdkafka's main queue is forwarded to the consumer queue, which
 * carries rebalances and errors; each assigned partition's records arrive
 * on a queue of its own (its fetch queue, not forwarded). Every queue
 * writes the same pipe when it turns non-empty, which wakes the loop
 * through a uv_poll_t (on_kafka); a timer every poll_interval polls too,
 * as a safety net, and loads timer slabs that came within reach. Other
 * threads wake the loop through the mailbox (on_wake). Rebalance
 * callbacks therefore run on the engine thread.
 *
 * Shutdown. No new event starts; events not started (and those waiting
 * for a retry, or deferred and waiting to write again) are released
 * without commit; running handlers get until
 * 80% of shutdown_timeout, then their contexts are cancelled; at 100% the
 * engine stops waiting (drain.c). Finished work is stored before the
 * consumer leaves the group.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

/* The engine whose loop runs on this thread, if any. */
static __thread pr__engine_t *tls_engine;

pr__engine_t *pr__engine_current(void) { return tls_engine; }

void pr__engine_check_thread(const pr__engine_t *eng, const char *fn) {
  if (eng && eng->owned && !pthread_equal(eng->owner, pthread_self())) {
    fprintf(stderr,
            "prosody: internal error: %s called on a thread that does not "
            "own the consumer engine\n",
            fn);
    abort();
  }
}

static void error_cb(rd_kafka_t *rk, int err, const char *reason,
                     void *opaque) {
  char text[512];
  (void)opaque;
  pr__kafka_explain(rk, reason, text, sizeof(text));
  if (err == RD_KAFKA_RESP_ERR__FATAL)
    PR_ERROR("engine", "fatal consumer error: %s", text);
  else
    PR_WARN("engine", "consumer: %s (%s)", text,
            rd_kafka_err2name((rd_kafka_resp_err_t)err));
}

/* Before the stores close (engine thread; the opening thread when the
 * start failed): their writes still in flight are waited for, up to
 * `wait_ms` (a handled id that never reaches the dedup store would be
 * handled again when resent); then the session they share stops, so what
 * is left fails, and is delivered while every store is still there. Its
 * thread no longer wakes the engine, whose wake handle may then close. */
static void stores_stop(pr__engine_t *eng, int64_t wait_ms) {
  int left;
  if (!eng->cql.w)
    return;
  if (wait_ms && (left = pr__cqlw_drain(eng->cql.w, wait_ms)) > 0)
    PR_WARN("engine",
            "%d Cassandra operation(s) still pending after %lld ms at "
            "shutdown: they fail",
            left, (long long)wait_ms);
  pr__cqlw_stop(eng->cql.w);
}

/* Closes (and so stops) the loop's handles; the loop's last run finishes
 * closing them. */
static void close_handles(pr__engine_t *eng) {
  uv_close((uv_handle_t *)&eng->kpoll, NULL);
  uv_close((uv_handle_t *)&eng->tick, NULL);
  uv_close((uv_handle_t *)&eng->tfire, NULL);
  uv_close((uv_handle_t *)&eng->tmo, NULL);
  uv_close((uv_handle_t *)&eng->wake, NULL);
  uv_close((uv_handle_t *)&eng->kick, NULL);
  uv_close((uv_handle_t *)&eng->kick_pre, NULL);
}

static void shutdown_engine(pr__engine_t *eng) {
  int64_t t0 = pr__now_ns();
  if (eng->stopping)
    return;
  eng->stopping = 1;
  eng->phase = PH_DRAINING;
  uv_timer_stop(&eng->tfire);
  pr__drain_release_idle(eng, NULL);
  pr__drain_wait(eng, 0);
  pr__part_store_offsets(eng, NULL);
  /* Leaves the group; the revoke callback stores and releases what is
   * left, and librdkafka commits the stored offsets. */
  rd_kafka_consumer_close(eng->rk);
  if (eng->assign_retry) { /* never taken: nothing of it was read */
    rd_kafka_topic_partition_list_destroy(eng->assign_retry);
    eng->assign_retry = NULL;
  }
  while (eng->parts)
    pr__part_release(eng, eng->parts);
  /* The loader's last answers reach the mailbox before it closes. */
  pr__loader_free(eng->loader);
  eng->loader = NULL;
  pr__mailbox_close(&eng->mb);
  stores_stop(eng, 2000);
  /* The store's handles close with the loop's last run. */
  eng->store->ops->destroy(eng->store);
  eng->store = NULL;
  pr__layers_close(eng, 0);
  pr__part_count(eng);
  PR_INFO("engine", "consumer stopped in %lld ms",
          (long long)((pr__now_ns() - t0) / 1000000));
  close_handles(eng);
}

static void on_kafka(uv_poll_t *h, int status, int events) {
  (void)status;
  (void)events;
  pr__intake_poll(h->data);
}

static void on_tick(uv_timer_t *t) {
  pr__engine_t *eng = t->data;
  pr__rebalance_retry(eng);
  pr__firing_advance(eng);
  pr__layers_tick(eng);
  pr__intake_poll(eng);
  pr__part_check_stalls(eng);
  pr__bp_tick(eng);
  pr__rebalance_mismatch_poll(eng);
  pr__part_tick_keys(eng);
  pr__metrics_snapshot(eng);
}

static void on_wake(uv_async_t *a) {
  pr__engine_t *eng = a->data;
  pr__mailbox_deliver(&eng->mb);
  pr__part_store_offsets(eng, NULL);
  if (eng->stop_asked) /* after the letters that came before the request */
    shutdown_engine(eng);
  else if (eng->resumed)
    pr__intake_poll(eng); /* fires due timers too */
  else
    pr__firing_due(eng);
}

/* Ends a burst of jobs handed to the pool: a worker is woken if jobs wait
 * and none is free. Runs before the loop blocks in poll (prepare: after
 * the timer callbacks) and after the poll callbacks (check), so no job
 * waits for the next wake-up of the loop. */
static void end_burst(pr__engine_t *eng) {
  eng->may_wake = 1;
  if (eng->pool)
    pr__pool_kick(eng->pool);
}

static void on_prepare(uv_prepare_t *h) { end_burst(h->data); }
static void on_check(uv_check_t *h) { end_burst(h->data); }

static void *engine_main(void *arg) {
  pr__engine_t *eng = arg;
  eng->owner = pthread_self(); /* after pthread_create: the creator has
                                  finished with the engine's state */
  tls_engine = eng;
  pr__log_adopt(eng->logger);
  pthread_setname_np(pthread_self(), "prosody-engine");
  uv_run(&eng->loop, UV_RUN_DEFAULT);
  tls_engine = NULL;
  return NULL;
}

static void engine_free(pr__engine_t *eng) {
  if (eng->cql.w) /* stopped already, unless the start failed early */
    pr__cqlw_stop(eng->cql.w);
  if (eng->pool)
    pr__pool_destroy(eng->pool);
  if (eng->pipefd[0] >= 0)
    close(eng->pipefd[0]);
  if (eng->pipefd[1] >= 0)
    close(eng->pipefd[1]);
  if (eng->store)
    eng->store->ops->destroy(eng->store);
  pr__layers_close(eng, 1);
  pr__cqlw_free(eng->cql.w); /* after its stores */
  free(eng->bootstrap);      /* unless the defer layer's close freed it */
  pr__sched_fini(&eng->sched);
  pr__metrics_fini(&eng->metrics);
  pr__ctx_stash_flush(&eng->ctx_stash);
  while (eng->inv_pool) {
    inv_t *inv = eng->inv_pool;
    eng->inv_pool = inv->next;
    free(inv);
  }
  pr__mailbox_fini(&eng->mb);
  free(eng);
}

/* The stores' letter: their session delivers the results its thread has
 * finished, for every store on it (memory stores answer at once). Results
 * finished after this are posted anew. */
static void store_mail(pr__mail_t *mail, void *owner) {
  pr__engine_t *eng = owner;
  (void)mail;
  atomic_store(&eng->store_posted, 0);
  if (eng->cql.w)
    pr__cqlw_poll(eng->cql.w);
}

/* A store's thread finished operations (any thread): the engine delivers
 * them; one letter waits at most. */
static void store_wake(void *arg) {
  pr__engine_t *eng = arg;
  pr__mailbox_post_once(&eng->mb, &eng->store_mail, store_mail,
                        &eng->store_posted);
}

/* pr__engine_stop's request: the engine shuts down once the letters
 * delivered with it have run (on_wake). */
static void stop_mail(pr__mail_t *mail, void *owner) {
  (void)mail;
  ((pr__engine_t *)owner)->stop_asked = 1;
}

/* Closes the loop's handles and the loop (start failed). */
static void loop_abandon(pr__engine_t *eng) {
  close_handles(eng);
  uv_run(&eng->loop, UV_RUN_DEFAULT);
  uv_loop_close(&eng->loop);
}

/* Creates the consumer, subscribes, and wires its queues to the loop. */
static prosody_err_t consumer_start(pr__engine_t *eng, const char *bootstrap,
                                    char *errstr, size_t errstr_size) {
  const pr__value_t *subs = &PR_CFG(eng->st, SUBSCRIBED_TOPICS);
  rd_kafka_conf_t *kconf;
  rd_kafka_topic_partition_list_t *topics;
  rd_kafka_resp_err_t kerr;
  char why[512];

  if (!(kconf =
            pr__kafka_consumer_conf(eng->st, bootstrap, errstr, errstr_size)))
    return PROSODY_ERR_CONFIG;
  rd_kafka_conf_set_rebalance_cb(kconf, pr__rebalance_cb);
  rd_kafka_conf_set_error_cb(kconf, error_cb);
  rd_kafka_conf_set_opaque(kconf, eng);
  eng->rk = pr__kafka_new(RD_KAFKA_CONSUMER, kconf, why, sizeof(why));
  if (!eng->rk) {
    rd_kafka_conf_destroy(kconf);
    pr__errf(errstr, errstr_size, "could not create the Kafka consumer: %s",
             why);
    return PROSODY_ERR_CONFIG;
  }
  rd_kafka_poll_set_consumer(eng->rk);
  eng->cq = rd_kafka_queue_get_consumer(eng->rk);
  rd_kafka_queue_io_event_enable(eng->cq, eng->pipefd[1], "1", 1);
  uv_poll_start(&eng->kpoll, UV_READABLE, on_kafka);

  if (PR_CFG_BOOL(eng->st, MOCK))
    for (size_t i = 0; i < subs->list_n; i++)
      pr__mock_ensure_topic(subs->list[i], NULL, 0);
  if (!(topics = rd_kafka_topic_partition_list_new((int)subs->list_n))) {
    pr__errf(errstr, errstr_size, "out of memory");
    return PROSODY_ERR_NOMEM;
  }
  for (size_t i = 0; i < subs->list_n; i++)
    rd_kafka_topic_partition_list_add(topics, subs->list[i],
                                      RD_KAFKA_PARTITION_UA);
  kerr = rd_kafka_subscribe(eng->rk, topics);
  rd_kafka_topic_partition_list_destroy(topics);
  if (kerr) {
    pr__errf(errstr, errstr_size, "could not subscribe: %s",
             rd_kafka_err2str(kerr));
    return pr__kafka_classify(kerr);
  }
  return PROSODY_OK;
}

prosody_err_t pr__engine_start(const pr__settings_t *st, const char *bootstrap,
                               pr__producer_t *producer,
                               const prosody_handler_t *handler,
                               pr__engine_t **out, char *errstr,
                               size_t errstr_size) {
  pr__engine_t *eng = calloc(1, sizeof(*eng));
  prosody_err_t err;

  *out = NULL;
  if (!eng) {
    pr__errf(errstr, errstr_size, "out of memory");
    return PROSODY_ERR_NOMEM;
  }
  eng->pipefd[0] = eng->pipefd[1] = -1;
  eng->owner = pthread_self();
  eng->owned = 1;
  eng->logger = pr__log_current(); /* the subscribing client's */
  pr__metrics_init(&eng->metrics);
  pr__mailbox_init(&eng->mb, eng, &eng->wake);
  eng->st = st;
  eng->producer = producer;
  eng->tm = pr__producer_telemetry(producer);
  eng->otel = pr__producer_otel(producer);
  eng->span_rel[0] =
      PR_CFG_ENUM(st, MESSAGE_SPANS) ? PR_SPAN_FOLLOWS_FROM : PR_SPAN_CHILD;
  eng->span_rel[1] =
      PR_CFG_ENUM(st, TIMER_SPANS) ? PR_SPAN_FOLLOWS_FROM : PR_SPAN_CHILD;
  eng->handler = *handler;
  eng->group_id = PR_CFG_STR(st, GROUP_ID);
  eng->mode = PR_CFG_ENUM(st, MODE);
  eng->layers = pr__mode_layers(eng->mode);
  eng->max_concurrency = (int)PR_CFG_INT(st, MAX_CONCURRENCY);
  eng->max_uncommitted = (int)PR_CFG_INT(st, MAX_UNCOMMITTED);
  eng->stall_ns = PR_CFG_NS(st, STALL_THRESHOLD);
  eng->timeout_ms = PR_CFG_SET(st, TIMEOUT) ? PR_CFG_MS(st, TIMEOUT)
                                            : eng->stall_ns / 1000000 * 8 / 10;
  eng->shutdown_ms = PR_CFG_MS(st, SHUTDOWN_TIMEOUT);
  eng->grace_ms = st->test.stop_grace_ms ? st->test.stop_grace_ms : 60000;
  eng->seed = (unsigned)pr__now_ns();
  {
    size_t keys = (size_t)PR_CFG_INT(st, SCHEDULER_CACHE_SIZE);
    /* Monopolization (pipeline mode) keeps its per-key handler time in
     * the scheduler's key states: the table holds the larger count. */
    if (pr__mono_keys(st, eng->mode) > keys)
      keys = pr__mono_keys(st, eng->mode);
    pr__sched_init(&eng->sched, PR_CFG_FLOAT(st, SCHEDULER_FAILURE_WEIGHT),
                   (double)PR_CFG_NS(st, SCHEDULER_MAX_WAIT) / 1e9,
                   PR_CFG_FLOAT(st, SCHEDULER_WAIT_WEIGHT), keys);
  }
  eng->sched.fifo = st->test.sched_fifo;
  eng->sched.urgent = pr__dispatch_urgent;
  eng->fail_part_new = st->test.fail_part_new;
  eng->dlq_refuse = st->test.dlq_refuse_sends;
  eng->timer_refuse = st->test.timer_refuse_deletes;
  eng->may_wake = 1;
  eng->slab_s = PR_CFG_NS(st, SLAB_SIZE) / 1000000000;
  if (eng->slab_s < 1)
    eng->slab_s = 1;
  if (pipe2(eng->pipefd, O_NONBLOCK | O_CLOEXEC)) {
    pr__errf(errstr, errstr_size, "pipe: %s", strerror(errno));
    engine_free(eng);
    return PROSODY_ERR_TRANSIENT;
  }

  uv_loop_init(&eng->loop);
  uv_poll_init(&eng->loop, &eng->kpoll, eng->pipefd[0]);
  eng->kpoll.data = eng;
  uv_timer_init(&eng->loop, &eng->tick);
  eng->tick.data = eng;
  uv_timer_start(&eng->tick, on_tick, (uint64_t)PR_CFG_MS(st, POLL_INTERVAL),
                 (uint64_t)PR_CFG_MS(st, POLL_INTERVAL));
  uv_async_init(&eng->loop, &eng->wake, on_wake);
  eng->wake.data = eng;
  uv_timer_init(&eng->loop, &eng->tfire);
  eng->tfire.data = eng;
  uv_timer_init(&eng->loop, &eng->tmo);
  eng->tmo.data = eng;
  uv_check_init(&eng->loop, &eng->kick);
  eng->kick.data = eng;
  uv_check_start(&eng->kick, on_check);
  uv_prepare_init(&eng->loop, &eng->kick_pre);
  eng->kick_pre.data = eng;
  uv_prepare_start(&eng->kick_pre, on_prepare);

  /* The timer store first: outside mock mode it needs Cassandra, and a
   * missing or unreachable one is said before anything joins the group.
   * Deferral keeps its keys' retry times there too (defer.c), so it is
   * durable whenever deferral is. */
  eng->cql.wake = store_wake;
  eng->cql.wake_arg = eng;
  if ((err = pr__tstore_open(
           st,
           handler->on_timer != NULL || (eng->mode == PR_MODE_PIPELINE &&
                                         PR_CFG_BOOL(st, DEFER_ENABLED) &&
                                         PR_CFG_SET(st, CASSANDRA_NODES)),
           eng->slab_s, &eng->cql, &eng->store, errstr, errstr_size)))
    goto fail;
  if ((err = pr__layers_open(eng, bootstrap, errstr, errstr_size)))
    goto fail;
  /* The loader reads records again for deferral and for message
   * collections: it needs the bootstrap also without the defer layer
   * (which sets it when it is in the list). */
  if (!eng->bootstrap && !(eng->bootstrap = strdup(bootstrap))) {
    pr__errf(errstr, errstr_size, "out of memory");
    err = PROSODY_ERR_NOMEM;
    goto fail;
  }
  if (!(handler->flags & PROSODY_HANDLER_ASYNC) &&
      !(eng->pool = pr__pool_new(eng->max_concurrency))) {
    pr__errf(errstr, errstr_size, "could not start %d worker threads",
             eng->max_concurrency);
    err = PROSODY_ERR_NOMEM;
    goto fail;
  }
  if ((err = consumer_start(eng, bootstrap, errstr, errstr_size)))
    goto fail;
  if (pthread_create(&eng->thread, NULL, engine_main, eng)) {
    pr__errf(errstr, errstr_size, "could not start the engine thread");
    err = PROSODY_ERR_NOMEM;
    goto fail;
  }
  *out = eng;
  return PROSODY_OK;

fail:
  stores_stop(eng, 0);
  if (eng->store)
    eng->store->ops->destroy(eng->store);
  eng->store = NULL;
  pr__layers_close(eng, 0);
  loop_abandon(eng);
  if (eng->rk) {
    pr__rebalance_mismatch_free(eng);
    if (eng->cq)
      rd_kafka_queue_destroy(eng->cq);
    rd_kafka_consumer_close(eng->rk);
    pr__kafka_destroy_bounded(eng->rk, 30000, "consumer");
  }
  engine_free(eng);
  return err;
}

int pr__engine_stop(pr__engine_t *eng) {
  struct timespec ts;
  int rc;
  if (!eng)
    return 0;
  pr__mailbox_post(&eng->mb, &eng->stop_mail, stop_mail);
  /* The engine drains within shutdown_timeout; leaving the group is
   * librdkafka's part. Wait generously, but not for ever (librdkafka
   * rule 9, docs/ARCHITECTURE.md). */
  pr__deadline_after(CLOCK_REALTIME,
                     (eng->shutdown_ms + eng->grace_ms) * 1000000, &ts);
  rc = pthread_timedjoin_np(eng->thread, NULL, &ts);
  if (rc) {
    PR_ERROR("engine",
             "the consumer did not stop within shutdown_timeout + %lld ms; "
             "abandoning it",
             (long long)eng->grace_ms);
    return 1;
  }
  eng->owner = pthread_self();
  /* The engine thread has exited: this thread owns its state now. Collect
   * completions that arrived after its last look (bounded), and let
   * libuv finish closing the timers that closes. */
  {
    int64_t deadline = pr__now_ns() + INT64_C(100000000);
    do {
      pr__mailbox_deliver(&eng->mb);
      if (eng->running == 0 && eng->dlq_inflight == 0)
        break;
      usleep(1000);
    } while (pr__now_ns() < deadline);
    uv_run(&eng->loop, UV_RUN_NOWAIT);
  }
  /* The engine thread has exited, so its counters are stable. A handler
   * (or failure-topic send) that outlived shutdown_timeout still holds
   * pointers into the engine: leave its memory to it rather than free it
   * under a running thread. */
  if (eng->running > 0 || eng->dlq_inflight > 0) {
    PR_ERROR("engine",
             "%d handler(s) and %d failure-topic send(s) still running after "
             "shutdown; leaving the consumer's memory to them",
             eng->running, eng->dlq_inflight);
    return 1;
  }
  pr__mailbox_quiesce(&eng->mb);
  if (eng->pool) {
    pr__pool_destroy(eng->pool);
    eng->pool = NULL;
  }
  uv_loop_close(&eng->loop);
  pr__rebalance_mismatch_free(eng);
  rd_kafka_queue_destroy(eng->cq);
  pr__kafka_destroy_bounded(eng->rk, 30000, "consumer");
  engine_free(eng);
  return 0;
}

int pr__engine_assigned(const pr__engine_t *eng) {
  return atomic_load(&((pr__engine_t *)eng)->assigned);
}

int pr__engine_stalled(const pr__engine_t *eng) {
  return atomic_load(&((pr__engine_t *)eng)->stalled);
}
