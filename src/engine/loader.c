/*
 * loader.c - the Kafka loader of deferred messages: its own consumer (no
 * group membership: partitions are assigned explicitly) on its own thread,
 * fetching records again by offset for the defer layer (defer_retry.c).
 *
 * Requests queue under `lock`; the thread takes them all at once, serves
 * them in (topic, partition, offset) order, so that requests for one
 * partition share one fetch, and posts each answer to the engine's mailbox.
 * A request within defer_discard_threshold records ahead of where the
 * consumer reads is reached by reading on; any other is a new assignment at
 * its offset (a seek). A record that is not there any more (retention,
 * compaction: the partition resumes past it) is reported gone; no record
 * within defer_seek_timeout is a transient failure.
 *
 * Threads: pr__loader_new/post/free on the engine thread (free delivers
 * the mailbox: it owns the engine's state); serve() on the loader's
 * thread, which alone uses `rk` and the read position.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

struct pr__loader {
  pr__engine_t *eng;
  char *bootstrap;
  int mock;
  int64_t seek_timeout_ms;
  int64_t discard; /* defer_discard_threshold */
  pthread_t thread;
  pthread_mutex_t lock;
  pthread_cond_t cond;
  pr__load_t *queue; /* guarded by lock */
  int stop;          /* guarded by lock */
  atomic_int halt;   /* stop, for serve() to see between polls */
  /* The loader thread's. */
  rd_kafka_t *rk;
  char *topic; /* assigned partition, or NULL */
  int32_t partition;
  int64_t next; /* offset the consumer reads next */
};

void pr__load_free(pr__load_t *r) {
  if (!r)
    return;
  if (r->rkm)
    rd_kafka_message_destroy(r->rkm);
  pr__span_discard(r->span);
  free(r->error);
  free(r);
}

static void fail(pr__load_t *r, const char *why) {
  free(r->error);
  r->error = strdup(why);
}

static int consumer_new(pr__loader_t *l, pr__load_t *r) {
  char errstr[512], group[300];
  rd_kafka_conf_t *kc = pr__kafka_conf_new(l->eng->st, l->bootstrap, l->mock,
                                           errstr, sizeof(errstr));
  /* A group id is what rd_kafka_consumer_poll() needs; nothing joins it
   * (partitions are assigned) and nothing is committed. */
  snprintf(group, sizeof(group), "%s.prosody-loader", l->eng->group_id);
  if (!kc ||
      pr__kafka_conf_set(kc, "group.id", group, errstr, sizeof(errstr)) ||
      pr__kafka_conf_set(kc, "enable.auto.commit", "false", errstr,
                         sizeof(errstr)) ||
      pr__kafka_conf_set(kc, "enable.auto.offset.store", "false", errstr,
                         sizeof(errstr)) ||
      pr__kafka_conf_set(kc, "auto.offset.reset", "earliest", errstr,
                         sizeof(errstr)) ||
      /* One record is wanted at a time: keep the prefetch small. */
      pr__kafka_conf_set(kc, "queued.max.messages.kbytes", "1024", errstr,
                         sizeof(errstr)) ||
      pr__kafka_conf_fetch_wait(kc, l->eng->st, l->mock, errstr,
                                sizeof(errstr))) {
    if (kc)
      rd_kafka_conf_destroy(kc);
    fail(r, errstr);
    return -1;
  }
  if (!(l->rk = pr__kafka_new(RD_KAFKA_CONSUMER, kc, errstr, sizeof(errstr)))) {
    rd_kafka_conf_destroy(kc);
    fail(r, errstr);
    return -1;
  }
  return 0;
}

/* Assigns the request's partition at its offset (a seek). */
static int seek_to(pr__loader_t *l, pr__load_t *r) {
  rd_kafka_topic_partition_list_t *tp = rd_kafka_topic_partition_list_new(1);
  rd_kafka_resp_err_t err;
  rd_kafka_topic_partition_list_add(tp, r->topic, r->partition)->offset =
      r->offset;
  err = rd_kafka_assign(l->rk, tp);
  rd_kafka_topic_partition_list_destroy(tp);
  free(l->topic);
  l->topic = NULL;
  if (err) {
    fail(r, rd_kafka_err2str(err));
    return -1;
  }
  if (!(l->topic = strdup(r->topic))) {
    fail(r, "out of memory");
    return -1;
  }
  l->partition = r->partition;
  l->next = r->offset;
  return 0;
}

static void serve(pr__loader_t *l, pr__load_t *r) {
  int64_t deadline;
  if (atomic_load(&l->halt)) { /* the rest of a batch: not fetched */
    fail(r, "the consumer is stopping");
    return;
  }
  if (!l->rk && consumer_new(l, r))
    return;
  if (!l->topic || strcmp(l->topic, r->topic) || l->partition != r->partition ||
      r->offset < l->next || r->offset > l->next + l->discard)
    if (seek_to(l, r))
      return;
  deadline = pr__now_ns() + l->seek_timeout_ms * 1000000;
  for (;;) {
    int64_t left = (deadline - pr__now_ns()) / 1000000;
    rd_kafka_message_t *m;
    if (atomic_load(&l->halt)) {
      fail(r, "the consumer is stopping");
      return;
    }
    if (left <= 0)
      break;
    if (!(m = rd_kafka_consumer_poll(l->rk, left < 100 ? (int)left : 100)))
      continue;
    if (m->err || m->partition != r->partition ||
        strcmp(rd_kafka_topic_name(m->rkt), r->topic)) {
      if (m->err && m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF)
        PR_WARN("defer", "loader: %s", rd_kafka_message_errstr(m));
      rd_kafka_message_destroy(m);
      continue;
    }
    l->next = m->offset + 1;
    if (m->offset < r->offset) { /* reading on towards it */
      rd_kafka_message_destroy(m);
      continue;
    }
    if (m->offset == r->offset)
      r->rkm = m;
    else {
      r->gone = 1; /* the partition resumes past it */
      rd_kafka_message_destroy(m);
    }
    return;
  }
  free(l->topic); /* where it reads is unknown now: seek next time */
  l->topic = NULL;
  fail(r, "no record within loader_seek_timeout");
}

static int load_cmp(const void *a, const void *b) {
  const pr__load_t *x = *(pr__load_t *const *)a, *y = *(pr__load_t *const *)b;
  int c = strcmp(x->topic, y->topic);
  if (c)
    return c;
  if (x->partition != y->partition)
    return x->partition < y->partition ? -1 : 1;
  return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static void *loader_main(void *arg) {
  pr__loader_t *l = arg;
  pr__log_adopt(l->eng->logger);
  pthread_setname_np(pthread_self(), "prosody-loader");
  for (;;) {
    pr__load_t *batch, **v;
    size_t n = 0, i;
    pthread_mutex_lock(&l->lock);
    while (!l->queue && !l->stop)
      pthread_cond_wait(&l->cond, &l->lock);
    batch = l->stop ? NULL : l->queue;
    if (batch)
      l->queue = NULL;
    pthread_mutex_unlock(&l->lock);
    if (!batch)
      break;
    for (pr__load_t *r = batch; r; r = r->next)
      n++;
    if ((v = malloc(n * sizeof(*v)))) {
      for (i = 0; batch; batch = batch->next)
        v[i++] = batch;
      qsort(v, n, sizeof(*v), load_cmp);
    }
    for (i = 0; i < n; i++) {
      pr__load_t *r = v ? v[i] : batch;
      if (!v)
        batch = batch->next;
      serve(l, r);
      pr__mailbox_post(&l->eng->mb, &r->mail, r->answered);
    }
    free(v);
  }
  return NULL;
}

pr__loader_t *pr__loader_new(pr__engine_t *eng, const char *bootstrap) {
  PR_ENGINE_THREAD(eng);
  pr__loader_t *l = calloc(1, sizeof(*l));
  if (!l || !(l->bootstrap = strdup(bootstrap))) {
    free(l);
    return NULL;
  }
  l->eng = eng;
  l->mock = PR_CFG_BOOL(eng->st, MOCK);
  l->seek_timeout_ms = PR_CFG_MS(eng->st, DEFER_SEEK_TIMEOUT);
  l->discard = PR_CFG_INT(eng->st, DEFER_DISCARD_THRESHOLD);
  pthread_mutex_init(&l->lock, NULL);
  pthread_cond_init(&l->cond, NULL);
  if (pthread_create(&l->thread, NULL, loader_main, l)) {
    pthread_mutex_destroy(&l->lock);
    pthread_cond_destroy(&l->cond);
    free(l->bootstrap);
    free(l);
    return NULL;
  }
  return l;
}

void pr__loader_post(pr__loader_t *l, pr__load_t *r) {
  PR_ENGINE_THREAD(l->eng);
  pthread_mutex_lock(&l->lock);
  r->next = l->queue;
  l->queue = r;
  pthread_cond_signal(&l->cond);
  pthread_mutex_unlock(&l->lock);
}

void pr__loader_free(pr__loader_t *l) {
  pr__load_t *r;
  if (!l)
    return;
  PR_ENGINE_THREAD(l->eng);
  atomic_store(&l->halt, 1);
  pthread_mutex_lock(&l->lock);
  l->stop = 1;
  pthread_cond_signal(&l->cond);
  pthread_mutex_unlock(&l->lock);
  pthread_join(l->thread, NULL);
  while ((r = l->queue)) { /* never served: nobody waits for them now */
    l->queue = r->next;
    pr__load_free(r);
  }
  /* Its answers in the mailbox may hold records of its consumer, which
   * must be destroyed before the consumer is. */
  pr__mailbox_deliver(&l->eng->mb);
  if (l->rk) {
    rd_kafka_consumer_close(l->rk);
    pr__kafka_destroy_bounded(l->rk, 10000, "deferred message loader");
  }
  free(l->topic);
  free(l->bootstrap);
  pthread_mutex_destroy(&l->lock);
  pthread_cond_destroy(&l->cond);
  free(l);
}
