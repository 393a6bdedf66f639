/*
 * engine.c - the consumer engine.
 *
 * DESIGN
 *
 * Threads. One engine thread per subscribed client runs a libuv loop and
 * owns all consumer state: partitions, key queues, offset trackers, the
 * limiter, retry and timeout timers. Nothing else touches
 * that state, so it takes no locks. Other threads reach the engine only
 * through the completion stack (`done`, lock-free) plus
 * uv_async_send(&wake), and read three atomics (assigned, stalled, stop).
 *
 * Kafka. librdkafka's main queue is forwarded to the consumer queue, which
 * carries rebalances and errors; each assigned partition's records arrive
 * on a queue of its own (its fetch queue, not forwarded). Every queue
 * writes the same pipe when it turns non-empty, which wakes the loop
 * through a uv_poll_t; every wake-up serves the consumer queue until it is
 * empty and reads each partition queue until it is empty or its partition
 * is backed up (LIBRDKAFKA.md rule 4), and a timer every poll_interval
 * does the same as a safety net. Rebalance callbacks therefore run on the
 * engine thread.
 *
 * Message path. intake: key checks (present, UTF-8) -> offset taken in the
 * partition's tracker -> the key's FIFO. The head of each key's FIFO is
 * scheduled: the limiter starts it when fewer than max_concurrency run,
 * else it waits in the ready FIFO. Synchronous handlers run on the worker
 * pool; asynchronous ones on this thread, completing later through
 * prosody_complete(). Right before the first attempt, on the handler's
 * thread, prepare() parses the payload's JSON and applies the filters
 * (source-system loop prevention, allowed_events); a record it rejects is
 * committed past without running the handler. (Parsing there keeps the
 * engine thread, the serial part of the pipeline, free of it.) Completions come
 * back through the completion queue; the mode's policy (retry with backoff,
 * failure topic, log-and-skip) decides, and a finished event completes its
 * offset, which may advance the partition's watermark; advanced partitions are
 * stored with rd_kafka_offsets_store (watermark + 1) and auto-commit commits
 * them every commit_interval.
 *
 * Backpressure, per partition. A partition stops when it has
 * max_uncommitted unfinished events (messages and timers), or when its
 * commit lags 64 x max_uncommitted records behind what it has taken (a
 * stuck record holds the commit while other keys go on; the window bounds
 * the tracker's memory and what a crash redelivers). A stopped partition's
 * queue is not read and its timers do not fire; at half of both limits it
 * is read again. Its records wait in its librdkafka fetch queue, which
 * stops fetching at queued.min.messages records or
 * queued.max.messages.kbytes per partition; records we have taken hold
 * only their own copies once they wait (release_rkm()), so a stopped
 * partition costs at most max_uncommitted events plus that prefetch. The
 * consumer queue and every other partition keep flowing, so one stuck key
 * stops at most its own partition. Nothing is paused: a pause throws the
 * prefetched records away and librdkafka 2.0.2 resumes fetching up to 1 s
 * later (measured).
 *
 * Shutdown and revoke. No new event starts; events not started (and those
 * waiting for a retry) are released without commit; running handlers get
 * until 80% of shutdown_timeout, then their contexts are cancelled; at 100%
 * the engine stops waiting. Finished work is stored before the partition
 * is released. A partition whose handler never returns is kept (as a
 * zombie) until it does, so no memory is freed under a running handler.
 *
 * Lifetimes. An inv (invocation) lives from intake until its event
 * finishes or is released; its message and context are embedded in it.
 * A part lives from assignment until revoke (or until its last inv ends,
 * for a zombie).
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

#include "../cql/cql.h"
#include "../timers/timers.h"
#include "../util/util.h"
#include "context.h"
#include "engine.h"
#include "pool.h"
#include "tracker.h"

typedef struct part part_t;
typedef struct kq kq_t;
typedef struct inv inv_t;

/* A header value copied out for prosody_message_header(). */
typedef struct hdr_copy {
  struct hdr_copy *next;
  char *name, *value;
} hdr_copy_t;

struct prosody_message {
  const char *topic; /* the partition's topic string */
  int32_t partition;
  int64_t offset;
  int64_t timestamp;           /* ms since epoch, -1 if none */
  char *key;                   /* owned, NUL-terminated */
  char *payload;               /* owned, NUL-terminated */
  size_t payload_len;          /* bytes, without the NUL */
  json_t *json;                /* owned */
  rd_kafka_headers_t *headers; /* owned (detached), or NULL */
  pthread_mutex_t hdr_lock;    /* guards hdr_copies */
  hdr_copy_t *hdr_copies;      /* values handed out by _header() */
};

struct prosody_timer {
  const char *key; /* the inv's msg.key */
  int64_t time_ms;
};

enum inv_state {
  INV_QUEUED,     /* in its key FIFO, not started */
  INV_READY,      /* head of its key, waiting for the limiter */
  INV_RUNNING,    /* handler invoked, result not processed yet */
  INV_RETRY_WAIT, /* waiting on its retry timer */
  INV_DLQ         /* being sent to the failure topic */
};

enum inv_kind { KIND_HANDLER, KIND_DLQ };

struct inv {
  inv_t *next;  /* link in key FIFO; `rnext` for ready; `dnext` done */
  inv_t *rnext; /* ready FIFO link (engine thread) */
  inv_t *dnext; /* completion queue link (under engine->lock) */
  pr__engine_t *eng;
  part_t *part;
  kq_t *kq;
  prosody_message_t msg;    /* a timer: key, topic, partition; offset -1 */
  struct prosody_timer tmr; /* is_timer: the fired timer */
  pr__ctx_t *cslot;         /* the running attempt's context slot, or NULL */
  prosody_context_t *ctx;   /* its handle */
  int is_timer;             /* a timer firing, not a message */
  int64_t time_s;           /* is_timer: the timer's time */
  int rearmed;              /* is_timer: scheduled again while firing */
  int dropped;              /* is_timer: unscheduled before it started */
  int deleted;              /* is_timer: already deleted from the store */
  int state;                /* enum inv_state; engine thread */
  int attempt;              /* attempts started so far */
  int kind;                 /* what the pending completion is */
  prosody_result_t result;  /* set by the completer before queueing */
  char *result_error;       /* owned; set by the completer */
  prosody_err_t dlq_err;    /* failure-topic send result */
  char *dlq_errstr;         /* owned */
  uv_timer_t *timer;        /* retry / failure-topic retry timer, or NULL */
  inv_t *tprev, *tnext;     /* deadline list links (engine thread) */
  int64_t deadline_ns;      /* RUNNING with a timeout: when it expires */
  int timed;                /* in the deadline list */
  rd_kafka_message_t *rkm;  /* the record, until its headers are detached
                               (owned), else NULL; see release_rkm() */
  int unprepared;           /* a message whose JSON and filters prepare()
                               has not applied yet (handler's thread) */
  const char *skip;         /* set by prepare(): why the record is skipped */
  int skip_warn;            /* ... and whether that is worth a warning */
  int inline_strings;       /* msg.key/payload live in this allocation */
};

struct kq {
  kq_t *next;         /* bucket chain */
  char *key;          /* in the same allocation */
  inv_t *head, *tail; /* FIFO; head is the only one that may run */
};

struct part {
  part_t *next;
  char *topic;
  int32_t partition;
  rd_kafka_queue_t *rkq; /* its own fetch queue (not forwarded to the
                            consumer queue), or NULL: records then arrive
                            on the consumer queue */
  int stopped;           /* backpressure: its queue is not read, its
                            timers not fired, until the backlog halves */
  pr__tracker_t tracker;
  kq_t **buckets;
  size_t nbuckets, nkeys;
  int invs;              /* invs alive for this partition */
  int active;            /* of which RUNNING or DLQ */
  int revoking;          /* no new starts; being released */
  int zombie;            /* released while a handler still runs */
  int held;              /* a zombie of the same partition still runs: queue,
                            don't start (per-key exclusivity) */
  int dirty;             /* watermark advanced since last store */
  int64_t head_off;      /* oldest pending offset seen by the stall check */
  int64_t head_since_ns; /* since when it has been the oldest */
  pr__tq_t *tq;          /* loaded pending timers (not yet firing) */
  uint64_t gen;          /* this assignment (loads of an earlier one differ) */
  int loads;             /* slab listings and loads in flight */
  pr__tq_t *tombs;       /* while loads run: (key, time) deleted meanwhile */
  pr__tq_t *clears;      /* ... and (key, kept time or -1) cleared */
  int64_t horizon;       /* last slab loaded or being loaded; -1: none */
  int64_t preload_s;     /* how far ahead of now slabs are loaded */
};

enum phase { PH_RUNNING, PH_DRAINING };

struct pr__engine {
  /* Immutable after start. */
  const pr__settings_t *st;
  pr__producer_t *producer;
  prosody_handler_t handler;
  const char *group_id;
  int mode;
  int max_concurrency, max_uncommitted;
  int64_t timeout_ms;  /* handler timeout, 0: none */
  int64_t shutdown_ms; /* shutdown_timeout */
  int64_t stall_ns;
  rd_kafka_t *rk;
  rd_kafka_queue_t *cq; /* the consumer queue (IO-event fd enabled) */
  int pipefd[2];
  pr__pool_t *pool; /* NULL for async handlers */
  pthread_t thread;

  /* Cross-thread. */
  _Atomic(inv_t *) done; /* lock-free stack of completions (LIFO; the
                            engine takes it whole and reverses it) */
  atomic_int draining;   /* the engine waits on `cond` (drain) */
  atomic_int pushers;    /* threads inside push_done(): the engine is not
                            freed until none is left */
  pthread_mutex_t lock;  /* with cond: wakes a draining engine */
  pthread_cond_t cond;
  atomic_int stop_requested;
  atomic_int assigned;
  atomic_int stalled;

  /* Engine thread only. */
  uv_loop_t loop;
  uv_poll_t kpoll;
  uv_timer_t tick;
  uv_async_t wake;
  part_t *parts;
  part_t *zombies; /* released partitions with handlers still running */

  int resumed;      /* a partition left backpressure: read queues */
  int running;      /* handlers started, not completed */
  int dlq_inflight; /* failure-topic sends and fired-timer deletes in flight */
  inv_t *ready_head, *ready_tail;
  int phase;
  int stopping; /* shutdown has begun */
  unsigned seed;
  pr__tstore_t *store; /* the timer store */
  int memory_timers;   /* the store is the memory one */
  uint64_t part_gen;   /* last partition assignment generation */
  int64_t slab_s;      /* slab_size in seconds */
  uv_timer_t tfire;    /* wakes the loop when the next timer is due */
  /* Running handlers with a timeout, in start order; all have the same
   * timeout, so that is deadline order too, and one loop timer (tmo,
   * armed for the head) serves them all. */
  inv_t *tmo_head, *tmo_tail;
  uv_timer_t tmo;

  /* Timer operations from handler threads (see prosody_schedule). */
  pthread_mutex_t ops_lock; /* guards ops_head/tail, ops_closed */
  struct top *ops_head, *ops_tail;
  int ops_closed;           /* the engine takes no more operations */
  atomic_int ops_pending;   /* ops_head != NULL, for the drain wait */
  atomic_int store_pending; /* the store has callbacks to deliver */
};

/* The engine whose loop runs on this thread, if any. */
static __thread pr__engine_t *tls_engine;

static void schedule(inv_t *inv);
static inv_t *finish_detach(inv_t *inv, int commit);
static void process_done(pr__engine_t *eng);
static void timer_finished(inv_t *inv, int commit);
static void timer_store_delete(inv_t *inv);
static void fire_due(pr__engine_t *eng);
static void prepare(inv_t *inv);
static void release_rkm(inv_t *inv);
static void tmo_unlink(inv_t *inv);

/* ------------------------------------------------------------------------ */
/* Small helpers                                                             */
/* ------------------------------------------------------------------------ */

static uint64_t hash_key(const char *s) {
  uint64_t h = 1469598103934665603ULL;
  for (; *s; s++)
    h = (h ^ (unsigned char)*s) * 1099511628211ULL;
  return h;
}

static char *dup_n(const void *p, size_t n) {
  char *s = malloc(n + 1);
  if (s) {
    if (n)
      memcpy(s, p, n);
    s[n] = '\0';
  }
  return s;
}

static void timer_free_cb(uv_handle_t *h) { free(h); }

static void timer_close(uv_timer_t **t) {
  if (*t) {
    uv_timer_stop(*t);
    uv_close((uv_handle_t *)*t, timer_free_cb);
    *t = NULL;
  }
}

static part_t *part_find(pr__engine_t *eng, const char *topic, int32_t p) {
  for (part_t *part = eng->parts; part; part = part->next)
    if (part->partition == p && !strcmp(part->topic, topic))
      return part;
  return NULL;
}

/* ------------------------------------------------------------------------ */
/* Key queues                                                                */
/* ------------------------------------------------------------------------ */

static kq_t *kq_get(part_t *part, const char *key, int create) {
  uint64_t h = hash_key(key);
  kq_t *kq;
  if (!part->buckets) {
    if (!create)
      return NULL;
    part->nbuckets = 64;
    part->buckets = calloc(part->nbuckets, sizeof(kq_t *));
    if (!part->buckets)
      return NULL;
  }
  for (kq = part->buckets[h % part->nbuckets]; kq; kq = kq->next)
    if (!strcmp(kq->key, key))
      return kq;
  if (!create)
    return NULL;
  if (part->nkeys >= part->nbuckets * 2) { /* grow the table */
    size_t n = part->nbuckets * 4;
    kq_t **b = calloc(n, sizeof(kq_t *));
    if (b) {
      for (size_t i = 0; i < part->nbuckets; i++) {
        kq_t *k = part->buckets[i], *next;
        for (; k; k = next) {
          next = k->next;
          k->next = b[hash_key(k->key) % n];
          b[hash_key(k->key) % n] = k;
        }
      }
      free(part->buckets);
      part->buckets = b;
      part->nbuckets = n;
    }
  }
  {
    size_t len = strlen(key);
    if (!(kq = calloc(1, sizeof(*kq) + len + 1)))
      return NULL;
    kq->key = (char *)(kq + 1);
    memcpy(kq->key, key, len + 1);
  }
  kq->next = part->buckets[h % part->nbuckets];
  part->buckets[h % part->nbuckets] = kq;
  part->nkeys++;
  return kq;
}

static void kq_remove(part_t *part, kq_t *kq) {
  kq_t **pp = &part->buckets[hash_key(kq->key) % part->nbuckets];
  while (*pp && *pp != kq)
    pp = &(*pp)->next;
  if (*pp)
    *pp = kq->next;
  part->nkeys--;
  free(kq);
}

/* ------------------------------------------------------------------------ */
/* Invocations                                                               */
/* ------------------------------------------------------------------------ */

static void inv_free(inv_t *inv) {
  hdr_copy_t *h, *next;
  tmo_unlink(inv);
  timer_close(&inv->timer);
  if (!inv->inline_strings) {
    free(inv->msg.key);
    free(inv->msg.payload);
  }
  if (inv->rkm)
    rd_kafka_message_destroy(inv->rkm);
  if (inv->msg.json)
    json_decref(inv->msg.json);
  if (inv->msg.headers)
    rd_kafka_headers_destroy(inv->msg.headers);
  for (h = inv->msg.hdr_copies; h; h = next) {
    next = h->next;
    free(h->name);
    free(h->value);
    free(h);
  }
  pthread_mutex_destroy(&inv->msg.hdr_lock);
  if (inv->cslot)
    pr__ctx_release(inv->cslot);
  free(inv->result_error);
  free(inv->dlq_errstr);
  free(inv);
}

static void part_free(part_t *part) {
  for (size_t i = 0; part->buckets && i < part->nbuckets; i++) {
    kq_t *k = part->buckets[i], *next;
    for (; k; k = next) {
      next = k->next;
      free(k);
    }
  }
  free(part->buckets);
  pr__tq_free(part->tq);
  pr__tq_free(part->tombs);
  pr__tq_free(part->clears);
  pr__tracker_fini(&part->tracker);
  free(part->topic);
  free(part);
}

/* Detaches a finished or released event from its key and partition. */
static inv_t *inv_detach(inv_t *inv) {
  part_t *part = inv->part;
  kq_t *kq = inv->kq;
  inv_t *next = NULL;
  if (kq && kq->head == inv) {
    kq->head = inv->next;
    if (!kq->head)
      kq->tail = NULL;
    next = kq->head;
    if (!next)
      kq_remove(part, kq);
  }
  part->invs--;
  return next;
}

static void backpressure_check(pr__engine_t *eng, part_t *part);

static part_t *zombie_find(pr__engine_t *eng, const char *topic, int32_t p) {
  for (part_t *z = eng->zombies; z; z = z->next)
    if (z->partition == p && !strcmp(z->topic, topic))
      return z;
  return NULL;
}

/* The last handler of a released partition finished: free it, and let a
 * live assignment of the same partition start its keys. */
static void zombie_done(pr__engine_t *eng, part_t *zombie) {
  part_t **pp = &eng->zombies, *live;
  while (*pp && *pp != zombie)
    pp = &(*pp)->next;
  if (*pp)
    *pp = zombie->next;
  live = part_find(eng, zombie->topic, zombie->partition);
  part_free(zombie);
  if (!live || !live->held || zombie_find(eng, live->topic, live->partition))
    return;
  live->held = 0;
  if (live->revoking || eng->phase != PH_RUNNING)
    return;
  for (size_t b = 0; live->buckets && b < live->nbuckets; b++) {
    kq_t *kq = live->buckets[b], *knext;
    for (; kq; kq = knext) {
      knext = kq->next; /* schedule() may finish (and free) a dropped head */
      if (kq->head && kq->head->state == INV_QUEUED)
        schedule(kq->head);
    }
  }
}

/* The event is done: commit its offset when `commit`, free it; returns the
 * key's next event if it may start now (finish() starts it). */
static inv_t *finish_detach(inv_t *inv, int commit) {
  pr__engine_t *eng = inv->eng;
  part_t *part = inv->part;
  inv_t *next;
  if (inv->is_timer)
    timer_finished(inv, commit);
  else if (commit && pr__tracker_complete(&part->tracker, inv->msg.offset) > 0)
    part->dirty = 1;
  next = inv_detach(inv);
  inv_free(inv);
  if (part->zombie) {
    if (part->invs == 0)
      zombie_done(eng, part);
    return NULL;
  }
  backpressure_check(eng, part);
  return next && !part->revoking && !part->held && eng->phase == PH_RUNNING
             ? next
             : NULL;
}

static void finish(inv_t *inv, int commit) {
  inv_t *next = finish_detach(inv, commit);
  if (next)
    schedule(next);
}

/* Pushes a completion for the engine (any thread). */
static void push_done(inv_t *inv) {
  pr__engine_t *eng = inv->eng;
  inv_t *head;
  /* Once the CAS publishes inv the engine may process it at once; the
   * counter keeps the engine (and its wake handle) alive until this
   * function has finished touching it. */
  atomic_fetch_add(&eng->pushers, 1);
  head = atomic_load(&eng->done);
  do
    inv->dnext = head;
  while (!atomic_compare_exchange_weak(&eng->done, &head, inv));
  if (atomic_load(&eng->draining)) {
    pthread_mutex_lock(&eng->lock);
    pthread_cond_broadcast(&eng->cond);
    pthread_mutex_unlock(&eng->lock);
  }
  uv_async_send(&eng->wake); /* coalesced by libuv while pending */
  atomic_fetch_sub(&eng->pushers, 1);
}

/* Cancels the running attempt's context (engine thread), and calls its
 * prosody_context_on_cancel() callback once, with the slot's lock held. */
static void cancel_ctx(inv_t *inv) {
  pr__ctx_t *slot = inv->cslot;
  prosody_cancel_cb cb;
  if (!slot)
    return;
  pthread_mutex_lock(&slot->lock);
  slot->cancelled = 1;
  cb = slot->cancel_cb; /* NULL once the attempt has finished */
  slot->cancel_cb = NULL;
  if (cb)
    cb(inv->ctx, slot->cancel_opaque);
  pthread_cond_broadcast(&slot->cond);
  pthread_mutex_unlock(&slot->lock);
}

/* Records the attempt's result exactly once (any thread); -1 for a stale
 * context or a second result. */
static int complete_attempt(prosody_context_t *ctx, prosody_result_t result,
                            const char *message) {
  pr__ctx_t *slot = pr__ctx_lock(ctx);
  inv_t *inv;
  if (!slot)
    return -1;
  if (slot->finished) {
    pthread_mutex_unlock(&slot->lock);
    return -1;
  }
  slot->finished = 1;
  slot->cancel_cb = NULL; /* finished: a later cancel is not reported */
  inv = slot->owner;
  if (result != PROSODY_SUCCESS && result != PROSODY_PERMANENT)
    result = PROSODY_TRANSIENT; /* a failure without a class */
  if (result == PROSODY_SUCCESS && inv->msg.json &&
      !(inv->eng->handler.flags & PROSODY_HANDLER_ASYNC)) {
    /* Not needed any more (a failure keeps it for the retry): a worker
     * frees it here rather than the engine thread. An asynchronous
     * handler's completing thread is the host's event loop: the engine
     * frees it there instead (the tree was allocated on the engine thread,
     * and freeing it on the loop cost the Python binding a quarter of its
     * loop thread, mostly waiting on malloc's lock). */
    json_decref(inv->msg.json);
    inv->msg.json = NULL;
  }
  inv->result = result;
  free(inv->result_error);
  inv->result_error = message       ? strdup(message)
                      : slot->error ? strdup(slot->error)
                                    : NULL;
  pthread_mutex_unlock(&slot->lock);
  inv->kind = KIND_HANDLER;
  push_done(inv);
  return 0;
}

static void run_handler(void *arg) {
  inv_t *inv = arg;
  prosody_handler_t *h = &inv->eng->handler;
  prosody_context_t *ctx = inv->ctx; /* inv may be gone once completed */
  prosody_result_t r;
  if (inv->unprepared)
    prepare(inv);
  if (inv->skip) {
    r = PROSODY_SUCCESS; /* handler_done commits past it */
  } else if (!inv->is_timer) {
    r = h->on_message(ctx, &inv->msg, h->opaque);
  } else if (h->on_timer) {
    r = h->on_timer(ctx, &inv->tmr, h->opaque);
  } else {
    PR_WARN("engine",
            "timer of key \"%.64s\" at %lld fired but the handler has no "
            "on_timer; dropping it",
            inv->msg.key, (long long)inv->time_s);
    r = PROSODY_SUCCESS;
  }
  if (r != PROSODY_PENDING)
    complete_attempt(ctx, r, NULL);
}

/* "topic[p] offset N key "k"" or "topic[p] timer T key "k"", for logs. */
static const char *describe(const inv_t *inv, char *buf, size_t n) {
  snprintf(buf, n, "%s[%d] %s %lld key \"%.64s\"", inv->msg.topic,
           inv->msg.partition, inv->is_timer ? "timer" : "offset",
           (long long)(inv->is_timer ? inv->time_s : inv->msg.offset),
           inv->msg.key ? inv->msg.key : "");
  return buf;
}

/* Leaves the deadline list (engine thread). The loop timer stays armed for
 * the old head: on_timeout re-arms it for the new one. */
static void tmo_unlink(inv_t *inv) {
  pr__engine_t *eng = inv->eng;
  if (!inv->timed)
    return;
  if (inv->tprev)
    inv->tprev->tnext = inv->tnext;
  else
    eng->tmo_head = inv->tnext;
  if (inv->tnext)
    inv->tnext->tprev = inv->tprev;
  else
    eng->tmo_tail = inv->tprev;
  inv->tprev = inv->tnext = NULL;
  inv->timed = 0;
}

static void on_timeout(uv_timer_t *t) {
  pr__engine_t *eng = t->data;
  int64_t now = pr__now_ns();
  inv_t *inv;
  char what[160];
  while ((inv = eng->tmo_head) && inv->deadline_ns <= now) {
    tmo_unlink(inv);
    PR_WARN("engine", "handler for %s exceeded its timeout; cancelling it",
            describe(inv, what, sizeof(what)));
    cancel_ctx(inv);
  }
  if (inv) /* ms, rounded up so the head has expired when it fires */
    uv_timer_start(&eng->tmo, on_timeout,
                   (uint64_t)((inv->deadline_ns - now + 999999) / 1000000), 0);
}

/* Joins the deadline list (engine thread). */
static void tmo_link(inv_t *inv) {
  pr__engine_t *eng = inv->eng;
  inv->deadline_ns = pr__now_ns() + eng->timeout_ms * 1000000;
  inv->tnext = NULL;
  inv->tprev = eng->tmo_tail;
  if (eng->tmo_tail)
    eng->tmo_tail->tnext = inv;
  else
    eng->tmo_head = inv;
  eng->tmo_tail = inv;
  inv->timed = 1;
  if (!uv_is_active((uv_handle_t *)&eng->tmo))
    uv_timer_start(&eng->tmo, on_timeout, (uint64_t)eng->timeout_ms, 0);
}

static void start(inv_t *inv) {
  pr__engine_t *eng = inv->eng;
  inv->state = INV_RUNNING;
  inv->attempt++;
  inv->part->active++;
  eng->running++;
  /* Each attempt gets a fresh context: one kept from an earlier attempt
   * is stale. */
  if (inv->cslot)
    pr__ctx_release(inv->cslot);
  inv->ctx = pr__ctx_acquire(inv, &inv->cslot);
  if (!inv->ctx) {
    inv->cslot = NULL;
    inv->result = PROSODY_TRANSIENT;
    free(inv->result_error);
    inv->result_error = strdup("out of memory (no handler context)");
    inv->kind = KIND_HANDLER;
    push_done(inv);
    return;
  }
  if (eng->timeout_ms > 0)
    tmo_link(inv);
  if (eng->pool) {
    if (pr__pool_submit(eng->pool, run_handler, inv))
      complete_attempt(inv->ctx, PROSODY_TRANSIENT, "out of memory");
  } else {
    run_handler(inv); /* async: must hand over and return quickly */
  }
}

/* Starts the event when the limiter allows, else queues it as ready. A
 * timer unscheduled while it waited is skipped. */
static void schedule(inv_t *inv) {
  pr__engine_t *eng = inv->eng;
  /* Iteratively: a key may have many dropped timers queued. */
  while (inv->is_timer && inv->dropped)
    if (!(inv = finish_detach(inv, 0)))
      return;
  if (eng->running < eng->max_concurrency) {
    start(inv);
    return;
  }
  release_rkm(inv);
  inv->state = INV_READY;
  inv->rnext = NULL;
  if (eng->ready_tail)
    eng->ready_tail->rnext = inv;
  else
    eng->ready_head = inv;
  eng->ready_tail = inv;
}

static void start_ready(pr__engine_t *eng) {
  while (eng->running < eng->max_concurrency && eng->ready_head) {
    inv_t *inv = eng->ready_head;
    eng->ready_head = inv->rnext;
    if (!eng->ready_head)
      eng->ready_tail = NULL;
    if (inv->is_timer && inv->dropped)
      finish(inv, 0);
    else
      start(inv);
  }
}

/* Removes every ready event of `part` (NULL: all) from the ready FIFO. */
static void ready_remove(pr__engine_t *eng, part_t *part) {
  inv_t **pp = &eng->ready_head;
  eng->ready_tail = NULL;
  while (*pp) {
    if (!part || (*pp)->part == part) {
      (*pp)->state = INV_QUEUED;
      *pp = (*pp)->rnext;
    } else {
      eng->ready_tail = *pp;
      pp = &(*pp)->rnext;
    }
  }
}

/* ------------------------------------------------------------------------ */
/* Modes: retry, failure topic, log                                          */
/* ------------------------------------------------------------------------ */

/* Full jitter: uniform in [0, min(2^n * base, max)). */
static uint64_t backoff_ms(pr__engine_t *eng, int n) {
  int64_t base = PR_CFG_MS(eng->st, RETRY_BASE);
  int64_t cap = PR_CFG_MS(eng->st, MAX_RETRY_DELAY);
  int64_t ceil = base;
  if (base <= 0)
    return 0;
  for (int i = 0; i < n && ceil < cap; i++)
    ceil *= 2;
  if (ceil > cap)
    ceil = cap;
  if (ceil <= 0)
    return 0;
  return (uint64_t)(((uint64_t)rand_r(&eng->seed) << 16 ^
                     (uint64_t)rand_r(&eng->seed)) %
                    (uint64_t)ceil);
}

static void on_retry(uv_timer_t *t);
static void dlq_send(inv_t *inv);

static void arm_timer(inv_t *inv, uint64_t ms) {
  timer_close(&inv->timer);
  inv->timer = malloc(sizeof(uv_timer_t));
  if (!inv->timer) { /* no timer: try again at once */
    if (inv->state == INV_DLQ)
      dlq_send(inv);
    else
      schedule(inv);
    return;
  }
  uv_timer_init(&inv->eng->loop, inv->timer);
  inv->timer->data = inv;
  uv_timer_start(inv->timer, on_retry, ms, 0);
}

static void on_retry(uv_timer_t *t) {
  inv_t *inv = t->data;
  if (inv->eng->phase != PH_RUNNING || inv->part->revoking) {
    finish(inv, 0); /* released: redelivered later */
    return;
  }
  if (inv->state == INV_DLQ)
    dlq_send(inv);
  else
    schedule(inv);
}

static void rfc3339_ms(int64_t ms, char *buf, size_t n) {
  time_t s = (time_t)(ms / 1000);
  struct tm tm;
  char base[32];
  gmtime_r(&s, &tm);
  strftime(base, sizeof(base), "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(buf, n, "%s.%03dZ", base, (int)(ms % 1000));
}

static void dlq_cb(prosody_err_t err, const char *errstr,
                   const prosody_delivery_t *d, void *opaque) {
  inv_t *inv = opaque;
  (void)d;
  inv->dlq_err = err;
  free(inv->dlq_errstr);
  inv->dlq_errstr = errstr ? strdup(errstr) : NULL;
  inv->kind = KIND_DLQ;
  push_done(inv);
}

/* Sends the record to failure_topic with the source-* headers. */
static void dlq_send(inv_t *inv) {
  pr__engine_t *eng = inv->eng;
  rd_kafka_headers_t *h = rd_kafka_headers_new(8);
  prosody_trace_t trace = {NULL, NULL, NULL};
  char num[32], stamp[40], err[512];
  const void *v;
  size_t len;
  char *tp = NULL, *ts = NULL, *bg = NULL;
  prosody_err_t e;

  inv->state = INV_DLQ;
  inv->part->active++;
  eng->dlq_inflight++;
  rd_kafka_header_add(h, "source-kind", -1, "message", -1);
  rd_kafka_header_add(h, "source-topic", -1, inv->msg.topic, -1);
  snprintf(num, sizeof(num), "%d", inv->msg.partition);
  rd_kafka_header_add(h, "source-partition", -1, num, -1);
  snprintf(num, sizeof(num), "%lld", (long long)inv->msg.offset);
  rd_kafka_header_add(h, "source-offset", -1, num, -1);
  rfc3339_ms(inv->msg.timestamp >= 0 ? inv->msg.timestamp : pr__wall_ms(),
             stamp, sizeof(stamp));
  rd_kafka_header_add(h, "source-timestamp", -1, stamp, -1);
  rd_kafka_header_add(h, "source-group-id", -1, eng->group_id, -1);
  rd_kafka_header_add(h, "source-error", -1,
                      inv->result_error ? inv->result_error : "(no message)",
                      -1);
  if (inv->msg.headers) {
    if (!rd_kafka_header_get_last(inv->msg.headers, "traceparent", &v, &len))
      trace.traceparent = tp = dup_n(v, len);
    if (!rd_kafka_header_get_last(inv->msg.headers, "tracestate", &v, &len))
      trace.tracestate = ts = dup_n(v, len);
    if (!rd_kafka_header_get_last(inv->msg.headers, "baggage", &v, &len))
      trace.baggage = bg = dup_n(v, len);
    if (tp && pr__traceparent_check(tp, err, sizeof(err)))
      trace.traceparent = NULL; /* never fail a dead letter on a bad header */
  }
  e = pr__producer_send_async_ex(
      eng->producer, PR_CFG_STR(eng->st, FAILURE_TOPIC), inv->msg.key,
      inv->msg.payload, &trace, h, dlq_cb, inv, err, sizeof(err));
  rd_kafka_headers_destroy(h);
  free(tp);
  free(ts);
  free(bg);
  if (e) /* not queued: report like a failed delivery */
    dlq_cb(e, err, NULL, inv);
}

static const char *mode_name(int mode) {
  return mode == PR_MODE_LOW_LATENCY   ? "low-latency"
         : mode == PR_MODE_BEST_EFFORT ? "best-effort"
                                       : "pipeline";
}

static void log_failure(inv_t *inv, const char *what) {
  char ev[160];
  PR_WARN("engine", "%s: %s handler failure (attempt %d, %s mode): %s; %s",
          describe(inv, ev, sizeof(ev)),
          inv->result == PROSODY_PERMANENT ? "permanent" : "transient",
          inv->attempt, mode_name(inv->eng->mode),
          inv->result_error ? inv->result_error : "(no message)", what);
}

/*
 * Result layers (DESIGN section 4). A mode is a list of small layers, from
 * the handler outwards; on the way out each layer sees the attempt's result
 * and either passes it on (NEXT) or decides. The invocation side (limiter,
 * timeout, handler) lives in schedule()/start(); dedup, defer,
 * monopolization and telemetry join these lists as further layers.
 */
typedef enum verdict {
  V_NEXT,   /* no decision: the next layer out decides */
  V_COMMIT, /* done: complete the offset */
  V_ABORT,  /* done without commit: redelivered later */
  V_RETRY,  /* run the handler again after a backoff */
  V_DEAD    /* send to failure_topic, commit once written */
} verdict_t;

typedef struct layer {
  const char *name;
  verdict_t (*complete)(inv_t *inv);
} layer_t;

/* Success is final in every mode. */
static verdict_t l_success(inv_t *inv) {
  return inv->result == PROSODY_SUCCESS ? V_COMMIT : V_NEXT;
}

/* Shutdown, revoke or a released partition make any failure terminal. */
static verdict_t l_terminal(inv_t *inv) {
  char ev[160];
  if (inv->eng->phase == PH_RUNNING && !inv->part->revoking &&
      !inv->part->zombie)
    return V_NEXT;
  PR_DEBUG("engine", "%s aborted by shutdown/revoke",
           describe(inv, ev, sizeof(ev)));
  return V_ABORT;
}

/* low-latency: transient failures retried up to max_retries. */
static verdict_t l_retry_capped(inv_t *inv) {
  if (inv->result == PROSODY_TRANSIENT &&
      inv->attempt <= PR_CFG_INT(inv->eng->st, MAX_RETRIES))
    return V_RETRY;
  return V_NEXT;
}

/* low-latency: what is still failing goes to the failure topic; a timer
 * never does: it is dropped. */
static verdict_t l_failure_topic(inv_t *inv) {
  if (inv->is_timer) {
    log_failure(inv, "dropping the timer");
    return V_COMMIT;
  }
  log_failure(inv, "sending it to the failure topic");
  return V_DEAD;
}

/* pipeline: transient failures retried without limit; permanent ones are
 * logged and committed past. */
static verdict_t l_retry_unbounded(inv_t *inv) {
  if (inv->result == PROSODY_PERMANENT) {
    log_failure(inv, "skipping it");
    return V_COMMIT;
  }
  if (inv->attempt == 1 || inv->attempt % 10 == 0)
    log_failure(inv, "retrying");
  return V_RETRY;
}

/* best-effort: any failure is logged and committed past. */
static verdict_t l_log_skip(inv_t *inv) {
  log_failure(inv, "skipping it");
  return V_COMMIT;
}

#define LAYER(fn)                                                              \
  { #fn, fn }
static const layer_t pipeline_layers[] = {
    LAYER(l_success), LAYER(l_terminal), LAYER(l_retry_unbounded), {0, 0}};
static const layer_t low_latency_layers[] = {LAYER(l_success),
                                             LAYER(l_terminal),
                                             LAYER(l_retry_capped),
                                             LAYER(l_failure_topic),
                                             {0, 0}};
static const layer_t best_effort_layers[] = {
    LAYER(l_success), LAYER(l_terminal), LAYER(l_log_skip), {0, 0}};

static const layer_t *mode_layers(int mode) {
  return mode == PR_MODE_LOW_LATENCY   ? low_latency_layers
         : mode == PR_MODE_BEST_EFFORT ? best_effort_layers
                                       : pipeline_layers;
}

/* A handler attempt finished (engine thread): free its slot, then let the
 * mode's layers decide. */
static void handler_done(inv_t *inv) {
  pr__engine_t *eng = inv->eng;
  verdict_t v = V_COMMIT; /* no layer decided: done */

  eng->running--;
  inv->part->active--;
  tmo_unlink(inv);
  if (inv->cslot) { /* the attempt is over: its context goes stale */
    pr__ctx_release(inv->cslot);
    inv->cslot = NULL;
  }
  start_ready(eng);

  if (inv->skip) {
    char what[160];
    if (inv->skip_warn)
      PR_WARN("engine",
              "skipping undecodable record %s: %s; committing past it",
              describe(inv, what, sizeof(what)), inv->skip);
    else
      PR_DEBUG("engine", "skipping %s: %s", describe(inv, what, sizeof(what)),
               inv->skip);
    finish(inv, 1);
    return;
  }
  for (const layer_t *l = mode_layers(eng->mode); l->complete; l++)
    if ((v = l->complete(inv)) != V_NEXT)
      break;
  switch (v) {
  case V_RETRY:
    inv->state = INV_RETRY_WAIT;
    arm_timer(inv, backoff_ms(eng, inv->attempt));
    return;
  case V_DEAD:
    dlq_send(inv);
    return;
  case V_ABORT:
    finish(inv, 0);
    return;
  default:
    if (inv->is_timer && !inv->rearmed && eng->store) {
      timer_store_delete(inv); /* finishes once the store has deleted it */
      return;
    }
    finish(inv, 1);
    return;
  }
}

static void dlq_done(inv_t *inv) {
  pr__engine_t *eng = inv->eng;
  inv->part->active--;
  eng->dlq_inflight--;
  if (!inv->dlq_err) {
    finish(inv, 1); /* committed only once the dead letter is written */
    return;
  }
  if (eng->phase != PH_RUNNING || inv->part->revoking || inv->part->zombie) {
    finish(inv, 0);
    return;
  }
  PR_ERROR("engine",
           "%s[%d] offset %lld: could not write to failure topic %s: %s; "
           "retrying",
           inv->msg.topic, inv->msg.partition, (long long)inv->msg.offset,
           PR_CFG_STR(eng->st, FAILURE_TOPIC),
           inv->dlq_errstr ? inv->dlq_errstr : "");
  /* Stay in the DLQ state: on_retry sends again. */
  arm_timer(inv, backoff_ms(eng, ++inv->attempt));
  inv->state = INV_DLQ;
}

static void process_done(pr__engine_t *eng) {
  inv_t *lifo = atomic_exchange(&eng->done, NULL), *inv = NULL;
  while (lifo) { /* reverse into completion order */
    inv_t *n = lifo->dnext;
    lifo->dnext = inv;
    inv = lifo;
    lifo = n;
  }
  while (inv) {
    inv_t *next = inv->dnext;
    if (inv->kind == KIND_DLQ)
      dlq_done(inv);
    else
      handler_done(inv);
    inv = next;
  }
}

/* ------------------------------------------------------------------------ */
/* Offsets and backpressure                                                  */
/* ------------------------------------------------------------------------ */

/* Stores watermark + 1 of every partition that advanced (or `only`). */
static void store_offsets(pr__engine_t *eng, part_t *only) {
  rd_kafka_topic_partition_list_t *list = NULL;
  for (part_t *part = eng->parts; part; part = part->next) {
    if (!part->dirty || (only && part != only))
      continue;
    if (!list)
      list = rd_kafka_topic_partition_list_new(8);
    rd_kafka_topic_partition_list_add(list, part->topic, part->partition)
        ->offset = part->tracker.commit;
    part->dirty = 0;
  }
  if (!list)
    return; /* never an empty list (rule 3) */
  rd_kafka_offsets_store(eng->rk, list);
  for (int i = 0; i < list->cnt; i++)
    if (list->elems[i].err)
      PR_WARN("engine", "could not store offset %lld for %s[%d]: %s",
              (long long)list->elems[i].offset, list->elems[i].topic,
              list->elems[i].partition, rd_kafka_err2str(list->elems[i].err));
  rd_kafka_topic_partition_list_destroy(list);
}

/* How far a partition's committed offset may lag behind what it has taken,
 * in records, per max_uncommitted: a stuck record holds the commit back
 * while the other keys go on, and every record taken behind it occupies
 * the tracker's window and is redelivered after a crash. */
#define PR_WINDOW_FACTOR 64

/* At the limit: max_uncommitted unfinished events (messages and timers),
 * or the offset window full. */
static int over_limit(const pr__engine_t *eng, const part_t *part) {
  return part->invs >= eng->max_uncommitted ||
         part->tracker.len >= (size_t)eng->max_uncommitted * PR_WINDOW_FACTOR;
}

/* Back at half of both. */
static int under_half(const pr__engine_t *eng, const part_t *part) {
  return part->invs <= eng->max_uncommitted / 2 &&
         part->tracker.len <=
             (size_t)eng->max_uncommitted * PR_WINDOW_FACTOR / 2;
}

/* Backpressure, per partition: at the limit the partition stops (its
 * queue is not read, its timers do not fire); at half of it, it is read
 * again. Other partitions are not affected: their records arrive on
 * queues of their own. */
static void backpressure_check(pr__engine_t *eng, part_t *part) {
  if (!part->stopped && over_limit(eng, part)) {
    part->stopped = 1;
    PR_DEBUG("engine",
             "backpressure: %s[%d] has %d unfinished events, %zu uncommitted "
             "offsets",
             part->topic, part->partition, part->invs, part->tracker.len);
  } else if (part->stopped && under_half(eng, part)) {
    part->stopped = 0;
    PR_DEBUG("engine", "backpressure released: %s[%d]", part->topic,
             part->partition);
    /* Its queue holds records that no wake-up announces any more (the
     * pipe is written only when a queue turns non-empty): read it. */
    if (!eng->resumed) {
      eng->resumed = 1;
      uv_async_send(&eng->wake);
    }
  }
}

/* Gives the partition its own queue: librdkafka forwards a partition's
 * fetch queue to the consumer queue unless the application set the
 * forwarding itself, which it keeps across fetch restarts. Done before
 * assign(), so that no record of the partition reaches the consumer queue.
 * The queue shares the consumer queue's wake-up pipe. */
static void part_queue_open(pr__engine_t *eng, part_t *part) {
  part->rkq =
      rd_kafka_queue_get_partition(eng->rk, part->topic, part->partition);
  if (!part->rkq) {
    PR_WARN("engine",
            "%s[%d]: no partition queue; its records share the "
            "consumer queue (backpressure stops no other partition)",
            part->topic, part->partition);
    return;
  }
  rd_kafka_queue_forward(part->rkq, NULL);
  rd_kafka_queue_io_event_enable(part->rkq, eng->pipefd[1], "1", 1);
}

static void part_queue_close(part_t *part) {
  if (!part->rkq)
    return;
  rd_kafka_queue_io_event_enable(part->rkq, -1, NULL, 0);
  rd_kafka_queue_destroy(part->rkq);
  part->rkq = NULL;
}

/* ------------------------------------------------------------------------ */
/* Intake                                                                    */
/* ------------------------------------------------------------------------ */

/* Takes the offset and finishes it at once (filtered or undecodable). */
static void skip_record(part_t *part, int64_t offset) {
  if (pr__tracker_take(&part->tracker, offset) == 0 &&
      pr__tracker_complete(&part->tracker, offset) > 0)
    part->dirty = 1;
}

/* Detaches a message's headers and frees its librdkafka message. A
 * message from librdkafka pins the fetch buffer it came in (a whole fetch
 * response), so a record that waits (behind its key, or for the limiter)
 * lets go of it at once, on the engine thread; one that starts at once is
 * released by prepare() on the handler's thread. Either way the memory of
 * waiting records is their own copies, bounded by max_uncommitted per
 * partition. */
static void release_rkm(inv_t *inv) {
  rd_kafka_headers_t *hdrs = NULL;
  if (!inv->rkm)
    return;
  rd_kafka_message_detach_headers(inv->rkm, &hdrs);
  rd_kafka_message_destroy(inv->rkm);
  inv->rkm = NULL;
  inv->msg.headers = hdrs;
}

/* Appends a new event (message or timer) to its key's FIFO, counting it
 * against max_uncommitted (its partition stops at the limit), and starts
 * it if it is the key's head. */
static void enqueue(inv_t *inv) {
  pr__engine_t *eng = inv->eng;
  part_t *part = inv->part;
  kq_t *kq;
  char ev[160];
  part->invs++;
  kq = inv->msg.key && (inv->is_timer || inv->msg.payload)
           ? kq_get(part, inv->msg.key, 1)
           : NULL;
  if (!kq) {
    PR_ERROR("engine", "out of memory queueing %s",
             describe(inv, ev, sizeof(ev)));
    finish(inv, 0);
    return;
  }
  inv->kq = kq;
  inv->state = INV_QUEUED;
  if (kq->tail) {
    release_rkm(inv);
    kq->tail->next = inv;
    kq->tail = inv;
  } else {
    kq->head = kq->tail = inv;
    if (eng->phase == PH_RUNNING && !part->held)
      schedule(inv);
  }
  backpressure_check(eng, part);
}

static int allowed(pr__engine_t *eng, json_t *json) {
  const pr__value_t *list = &PR_CFG(eng->st, ALLOWED_EVENTS);
  json_t *type;
  const char *t;
  if (!list->isset || list->list_n == 0)
    return 1;
  type = json_is_object(json) ? json_object_get(json, "type") : NULL;
  if (!type || !json_is_string(type))
    return 1; /* no type: processed */
  t = json_string_value(type);
  for (size_t i = 0; i < list->list_n; i++)
    if (!strncmp(t, list->list[i], strlen(list->list[i])))
      return 1;
  return 0;
}

/* Decodes the payload and applies the filters, on the thread about to run
 * the handler (a worker for synchronous handlers), so the engine thread
 * does not spend its time parsing JSON. Sets inv->skip for a record that
 * is undecodable or filtered: the engine then commits past it without
 * running the handler. Reads only the inv and immutable engine fields. */
static void prepare(inv_t *inv) {
  pr__engine_t *eng = inv->eng;
  rd_kafka_headers_t *hdrs;
  json_error_t jerr;
  const void *v;
  size_t len;
  inv->unprepared = 0;
  release_rkm(inv);
  hdrs = inv->msg.headers;
  inv->msg.json = json_loadb(inv->msg.payload, inv->msg.payload_len,
                             JSON_DECODE_ANY, &jerr);
  if (!inv->msg.json) {
    inv->skip = "payload is not valid JSON";
    inv->skip_warn = 1;
  } else if (hdrs &&
             !rd_kafka_header_get_last(hdrs, "source-system", &v, &len) &&
             len == strlen(eng->group_id) && !memcmp(v, eng->group_id, len)) {
    inv->skip = "our own output";
  } else if (!allowed(eng, inv->msg.json)) {
    inv->skip = "event type not allowed";
  }
}

static void intake(pr__engine_t *eng, rd_kafka_message_t *rkm) {
  const char *topic = rd_kafka_topic_name(rkm->rkt);
  part_t *part = part_find(eng, topic, rkm->partition);
  const char *why = NULL;
  inv_t *inv;
  int rc;

  if (!part || part->revoking) {
    rd_kafka_message_destroy(rkm);
    return;
  }
  /* Key present and UTF-8 text, payload present; the payload's JSON and
   * the filters are checked by prepare(). */
  if (!rkm->key)
    why = "no key";
  else if (!pr__utf8_valid(rkm->key, rkm->key_len) ||
           memchr(rkm->key, 0, rkm->key_len))
    why = "key is not valid UTF-8 text";
  else if (!rkm->payload)
    why = "no payload";
  if (why) {
    PR_WARN("engine",
            "skipping undecodable record %s[%d] offset %lld: %s; committing "
            "past it",
            topic, rkm->partition, (long long)rkm->offset, why);
    skip_record(part, rkm->offset);
    backpressure_check(eng, part); /* behind a stuck record it widens the
                                      offset window */
    rd_kafka_message_destroy(rkm);
    return;
  }

  rc = pr__tracker_take(&part->tracker, rkm->offset);
  /* One allocation: the inv, then its key and payload (NUL-terminated). */
  inv = rc == 0 ? calloc(1, sizeof(*inv) + rkm->key_len + rkm->len + 2) : NULL;
  if (!inv) {
    if (rc == 0)
      PR_ERROR("engine", "out of memory taking %s[%d] offset %lld", topic,
               rkm->partition, (long long)rkm->offset);
    rd_kafka_message_destroy(rkm);
    return;
  }
  inv->eng = eng;
  inv->part = part;
  inv->msg.topic = part->topic;
  inv->msg.partition = rkm->partition;
  inv->msg.offset = rkm->offset;
  inv->msg.timestamp = rd_kafka_message_timestamp(rkm, NULL);
  inv->inline_strings = 1;
  inv->msg.key = (char *)(inv + 1);
  memcpy(inv->msg.key, rkm->key, rkm->key_len);
  inv->msg.key[rkm->key_len] = '\0';
  inv->msg.payload = inv->msg.key + rkm->key_len + 1;
  memcpy(inv->msg.payload, rkm->payload, rkm->len);
  inv->msg.payload[rkm->len] = '\0';
  inv->msg.payload_len = rkm->len;
  inv->rkm = rkm;
  inv->unprepared = 1;
  pthread_mutex_init(&inv->msg.hdr_lock, NULL);
  enqueue(inv);
}

/* Handles one record or error from a queue. */
static void take(pr__engine_t *eng, rd_kafka_message_t *rkm) {
  if (rkm->err) {
    if (rkm->err != RD_KAFKA_RESP_ERR__PARTITION_EOF)
      PR_WARN("engine", "consumer: %s", rd_kafka_message_errstr(rkm));
    rd_kafka_message_destroy(rkm);
    return;
  }
  intake(eng, rkm);
}

/* Serves the consumer queue (rebalances, errors: always, whatever the
 * backpressure) and then every partition's own queue that is not stopped,
 * each until it is empty or its partition reaches max_uncommitted. Every
 * wake-up reads every queue to empty (LIBRDKAFKA.md rule 4: the pipe is
 * written only when a queue turns non-empty), except a stopped one, which
 * backpressure_check() has read again once it is released. */
static void drain_kafka(pr__engine_t *eng) {
  char buf[256];
  rd_kafka_message_t *rkm;
  while (read(eng->pipefd[0], buf, sizeof(buf)) > 0)
    ;
  eng->resumed = 0;
  while ((rkm = rd_kafka_consumer_poll(eng->rk, 0)))
    take(eng, rkm);
  for (part_t *part = eng->parts; part; part = part->next) {
    if (!part->rkq || part->revoking)
      continue;
    while (!part->stopped && (rkm = rd_kafka_consume_queue(part->rkq, 0)))
      take(eng, rkm);
  }
  process_done(eng);
  store_offsets(eng, NULL);
  fire_due(eng);
}

/* ------------------------------------------------------------------------ */
/* Timers                                                                    */
/* ------------------------------------------------------------------------ */

/*
 * Each partition keeps the timers of its loaded slabs (every slab up to
 * slab_of(now + preload)) in a time queue. A due timer leaves the queue and
 * becomes an event in its key's FIFO, ordered with the key's messages and
 * counted against max_uncommitted; from then on it is "firing" (excluded
 * from scheduled()) until its event finishes. Success or a final failure
 * deletes it from the store; an abort leaves it stored, to fire again on
 * the next load. A firing timer scheduled again (its own second) is
 * "rearmed": it stays stored and fires again; unscheduled before it
 * started, it is "dropped" and skipped.
 */

static pr__tseg_t seg_of(const char *topic, int32_t partition) {
  pr__tseg_t g = {topic, partition};
  return g;
}

static void store_log_cb(void *arg, prosody_err_t err, const char *errstr) {
  if (err)
    PR_ERROR("timers", "%s: %s", (const char *)arg,
             errstr ? errstr : prosody_err_name(err));
}

/* The firing event of (key, time) in `part`, or NULL. */
static inv_t *firing_find(part_t *part, const char *key, int64_t time_s) {
  kq_t *kq = kq_get(part, key, 0);
  for (inv_t *i = kq ? kq->head : NULL; i; i = i->next)
    if (i->is_timer && i->time_s == time_s)
      return i;
  return NULL;
}

/* Deleted while the load that found it was in flight? */
static int deleted_meanwhile(const part_t *part, const char *key,
                             int64_t time_s) {
  int64_t *keeps;
  size_t n;
  int gone = 0;
  if (part->tombs && pr__tq_contains(part->tombs, key, time_s))
    return 1;
  if (!part->clears || pr__tq_key_times(part->clears, key, &keeps, &n))
    return 0;
  for (size_t i = 0; i < n; i++)
    gone |= keeps[i] != time_s;
  free(keeps);
  return gone;
}

/* A stored timer was found by a load: queue it unless it is firing. */
static void timer_loaded(part_t *part, const char *key, int64_t time_s) {
  if (firing_find(part, key, time_s))
    return;
  if (pr__tq_add(part->tq, key, time_s) < 0)
    PR_ERROR("timers", "out of memory loading a timer of %s[%d]", part->topic,
             part->partition);
}

/* A timer was written by a handler: queue it if its slab is loaded (or
 * loading); a firing one of the same second is rearmed (or undropped). */
static void timer_written(pr__engine_t *eng, part_t *part, const char *key,
                          int64_t time_s) {
  inv_t *f = firing_find(part, key, time_s);
  if (f) {
    if (f->state == INV_QUEUED || f->state == INV_READY)
      f->dropped = 0;
    else
      f->rearmed = 1;
    return;
  }
  if (pr__slab_of(time_s, eng->slab_s) <= part->horizon)
    timer_loaded(part, key, time_s);
}

/* Timers of `key` were deleted: (key, time_s), or all but `keep_s` when
 * `time_s` is -1. */
static void timer_deleted(part_t *part, const char *key, int64_t time_s,
                          int64_t keep_s) {
  kq_t *kq;
  /* A load in flight may have read the store before this delete: remember
   * it, so the load's result does not bring the timer back. */
  if (part->loads > 0) {
    pr__tq_t **set = time_s >= 0 ? &part->tombs : &part->clears;
    if ((*set || (*set = pr__tq_new())) &&
        pr__tq_add(*set, key, time_s >= 0 ? time_s : keep_s) < 0)
      PR_ERROR("timers", "out of memory recording a deleted timer");
  }
  if (time_s >= 0)
    pr__tq_remove(part->tq, key, time_s);
  else
    pr__tq_remove_key(part->tq, key, keep_s);
  kq = kq_get(part, key, 0);
  for (inv_t *i = kq ? kq->head : NULL; i; i = i->next) {
    if (!i->is_timer ||
        (time_s >= 0 ? i->time_s != time_s : i->time_s == keep_s))
      continue;
    if (i->state == INV_QUEUED || i->state == INV_READY)
      i->dropped = 1;
    else
      i->rearmed = 0;
  }
}

/* A timer event ends (from finish()). */
static void timer_finished(inv_t *inv, int commit) {
  pr__engine_t *eng = inv->eng;
  part_t *part = inv->part;
  pr__tseg_t seg = seg_of(part->topic, part->partition);
  if (!commit || !eng->store)
    return; /* aborted, or dropped (already deleted); or stopped: it fires
               again on the next load */
  if (inv->deleted)
    return;
  if (inv->rearmed) {
    if (!part->revoking && !part->zombie &&
        pr__tq_add(part->tq, inv->msg.key, inv->time_s) < 0)
      PR_ERROR("timers", "out of memory re-queueing a timer of %s[%d]",
               part->topic, part->partition);
    return;
  }
  eng->store->ops->del(eng->store, &seg, inv->msg.key, inv->time_s,
                       PR_TIMER_APPLICATION, store_log_cb,
                       "could not delete a fired timer (it may fire again)");
}

static void timer_deleted_cb(void *arg, prosody_err_t err, const char *errstr) {
  inv_t *inv = arg;
  char ev[160];
  inv->part->active--;
  inv->eng->dlq_inflight--;
  if (err)
    PR_ERROR("timers",
             "%s: could not delete the fired timer (it may fire "
             "again): %s",
             describe(inv, ev, sizeof(ev)),
             errstr ? errstr : prosody_err_name(err));
  inv->deleted = 1;
  finish(inv, 1);
}

/* A timer event is done: delete it from the store, then finish it, so the
 * key's next event sees it gone. Counted as active (a drain waits for it)
 * and as in flight (the engine is not freed under it). */
static void timer_store_delete(inv_t *inv) {
  pr__engine_t *eng = inv->eng;
  pr__tseg_t seg = seg_of(inv->part->topic, inv->part->partition);
  inv->state = INV_DLQ;
  inv->part->active++;
  eng->dlq_inflight++;
  eng->store->ops->del(eng->store, &seg, inv->msg.key, inv->time_s,
                       PR_TIMER_APPLICATION, timer_deleted_cb, inv);
}

static void on_fire(uv_timer_t *t);

/* Room for another timer event in `part`: not while the partition is
 * stopped for backpressure (until it is released at half the limit), so
 * that due timers cannot keep its budget full and starve the messages
 * waiting in its queue. Every change of a partition's counts is followed
 * by backpressure_check(), so `stopped` says whether it is at the limit.
 * Other partitions' timers fire meanwhile. */
static int timer_room(const part_t *part) { return !part->stopped; }

/* Arms the loop's timer for the earliest loaded timer of the partitions
 * with room. A stopped partition's timers wait for its release, which
 * reads the queues and calls fire_due(). */
static void arm_fire(pr__engine_t *eng) {
  int64_t next = -1, delay;
  if (eng->phase == PH_RUNNING)
    for (part_t *part = eng->parts; part; part = part->next) {
      int64_t t = part->tq && !part->revoking && timer_room(part)
                      ? pr__tq_next_time(part->tq)
                      : -1;
      if (t >= 0 && (next < 0 || t < next))
        next = t;
    }
  if (next < 0) {
    uv_timer_stop(&eng->tfire);
    return;
  }
  delay = next * 1000 - pr__wall_ms();
  uv_timer_start(&eng->tfire, on_fire, delay > 0 ? (uint64_t)delay : 0, 0);
}

/* Turns due timers into events, within max_uncommitted. */
static void fire_due(pr__engine_t *eng) {
  int64_t now_s = pr__wall_ms() / 1000;
  if (eng->phase != PH_RUNNING)
    return;
  for (part_t *part = eng->parts; part; part = part->next) {
    char *key;
    int64_t t;
    if (part->revoking || !part->tq)
      continue;
    while (timer_room(part) && pr__tq_pop_due(part->tq, now_s, &key, &t) > 0) {
      inv_t *inv = calloc(1, sizeof(*inv));
      if (!inv) {
        (void)pr__tq_add(part->tq, key, t); /* try again later */
        free(key);
        break;
      }
      inv->eng = eng;
      inv->part = part;
      inv->is_timer = 1;
      inv->time_s = t;
      inv->msg.topic = part->topic;
      inv->msg.partition = part->partition;
      inv->msg.offset = -1;
      inv->msg.timestamp = t * 1000;
      inv->msg.key = key;
      inv->tmr.key = key;
      inv->tmr.time_ms = t * 1000;
      pthread_mutex_init(&inv->msg.hdr_lock, NULL);
      enqueue(inv);
    }
  }
  arm_fire(eng);
}

static void on_fire(uv_timer_t *t) { fire_due(t->data); }

typedef struct load_req {
  pr__engine_t *eng;
  uint64_t gen; /* the assignment it loads for */
  int32_t partition;
  char topic[];
} load_req_t;

static load_req_t *load_req(pr__engine_t *eng, const part_t *part) {
  size_t n = strlen(part->topic) + 1;
  load_req_t *r = malloc(sizeof(*r) + n);
  if (r) {
    r->eng = eng;
    r->gen = part->gen;
    r->partition = part->partition;
    memcpy(r->topic, part->topic, n);
  }
  return r;
}

/* The partition a load was for, if it is still that assignment. */
static part_t *load_part(const load_req_t *r) {
  part_t *part = part_find(r->eng, r->topic, r->partition);
  return part && part->gen == r->gen ? part : NULL;
}

/* A listing or load finished: once none runs, forget the deletions. */
static void load_done(part_t *part) {
  if (part && --part->loads == 0) {
    pr__tq_free(part->tombs);
    pr__tq_free(part->clears);
    part->tombs = part->clears = NULL;
  }
}

static void slab_loaded(void *arg, prosody_err_t err, const char *errstr,
                        const pr__trec_t *recs, size_t n) {
  load_req_t *r = arg;
  pr__engine_t *eng = r->eng;
  part_t *part = load_part(r);
  if (err)
    PR_ERROR("timers",
             "could not load timers of %s[%d]: %s; they fire after the "
             "partition is next assigned",
             r->topic, r->partition, errstr ? errstr : prosody_err_name(err));
  else if (part && !part->revoking)
    for (size_t i = 0; i < n; i++)
      if (recs[i].type == PR_TIMER_APPLICATION &&
          !deleted_meanwhile(part, recs[i].key, recs[i].time_s))
        timer_loaded(part, recs[i].key, recs[i].time_s);
  load_done(part);
  free(r);
  arm_fire(eng);
}

/* Loads slab `slab` of `part` into its time queue. */
static void load_slab(pr__engine_t *eng, part_t *part, int64_t slab) {
  load_req_t *r = load_req(eng, part);
  pr__tseg_t seg = seg_of(part->topic, part->partition);
  if (!r) {
    PR_ERROR("timers", "out of memory loading timers of %s[%d]", part->topic,
             part->partition);
    return;
  }
  part->loads++;
  eng->store->ops->load_slab(eng->store, &seg, eng->slab_s, slab, slab_loaded,
                             r);
}

static void slabs_listed(void *arg, prosody_err_t err, const char *errstr,
                         const int64_t *slabs, size_t n) {
  load_req_t *r = arg;
  pr__engine_t *eng = r->eng;
  part_t *part = load_part(r);
  if (err)
    PR_ERROR("timers",
             "could not list the timers of %s[%d]: %s; they fire after the "
             "partition is next assigned",
             r->topic, r->partition, errstr ? errstr : prosody_err_name(err));
  else if (part && !part->revoking)
    for (size_t i = 0; i < n; i++) /* oldest first: overdue ones fire now */
      if (slabs[i] <= part->horizon)
        load_slab(eng, part, slabs[i]);
  load_done(part);
  free(r);
}

/* A partition was assigned: load every stored slab up to the horizon. */
static void timers_assigned(pr__engine_t *eng, part_t *part) {
  int64_t jitter = eng->slab_s / 10 + 1;
  pr__tseg_t seg = seg_of(part->topic, part->partition);
  load_req_t *r;
  part->gen = ++eng->part_gen;
  part->tq = pr__tq_new();
  part->preload_s = eng->slab_s / 2 + (int64_t)(rand_r(&eng->seed) % jitter);
  part->horizon =
      pr__slab_of(pr__wall_ms() / 1000 + part->preload_s, eng->slab_s);
  if (!part->tq || !(r = load_req(eng, part))) {
    PR_ERROR("timers", "out of memory: timers of %s[%d] will not fire",
             part->topic, part->partition);
    part->horizon = -1;
    return;
  }
  part->loads++; /* the listing counts as a load */
  eng->store->ops->slabs(eng->store, &seg, eng->slab_s, slabs_listed, r);
}

/* Loads the slabs that came within the preload window (loop tick). */
static void timers_advance(pr__engine_t *eng) {
  int64_t now_s = pr__wall_ms() / 1000;
  for (part_t *part = eng->parts; part; part = part->next) {
    int64_t target;
    if (!part->tq || part->revoking || part->horizon < 0)
      continue;
    target = pr__slab_of(now_s + part->preload_s, eng->slab_s);
    while (part->horizon < target)
      load_slab(eng, part, ++part->horizon);
  }
}

/* A partition leaves: drop its loaded timers; the store decides what it
 * keeps (the memory store forgets them). */
static void timers_released(pr__engine_t *eng, part_t *part) {
  pr__tseg_t seg = seg_of(part->topic, part->partition);
  pr__tq_free(part->tq);
  part->tq = NULL;
  eng->store->ops->release(eng->store, &seg);
}

/* --- Timer operations from handlers ------------------------------------- */

/* The public operations' values (prosody_timer_async). */
enum top_kind {
  TOP_SCHEDULE = PROSODY_TIMER_SCHEDULE,
  TOP_UNSCHEDULE = PROSODY_TIMER_UNSCHEDULE,
  TOP_CLEAR_AND_SCHEDULE = PROSODY_TIMER_CLEAR_AND_SCHEDULE,
  TOP_CLEAR = PROSODY_TIMER_CLEAR,
  TOP_SCHEDULED = PROSODY_TIMER_SCHEDULED
};

/* One timer operation. A blocking call's is on the caller's stack: the
 * engine fills the result and signals `cond`, then never touches it. An
 * asynchronous one (`cb` set) is malloc'd: top_done() calls `cb` with the
 * result and frees it. Queued, it belongs to the engine (close_ops()
 * completes what is left); started, to the store, which completes every
 * operation before it is destroyed. */
typedef struct top {
  struct top *next; /* engine queue link (ops_lock) */
  int kind;
  prosody_context_t *ctx;
  int64_t time_s;
  /* Engine thread, while it runs the operation. */
  pr__engine_t *eng;
  char *key, *topic;
  int32_t partition;
  /* The result, published under `lock`. */
  pthread_mutex_t lock;
  pthread_cond_t cond;
  int done;
  prosody_err_t err;
  char errstr[512];
  int64_t *times; /* TOP_SCHEDULED: ms, malloc'd; NULL when n is 0 */
  size_t n;
  /* Asynchronous (prosody_timer_async): called once, then `op` is freed. */
  prosody_timer_cb cb;
  void *opaque;
} top_t;

static void top_done(top_t *op, prosody_err_t err, const char *errstr) {
  free(op->key);
  free(op->topic);
  op->key = op->topic = NULL;
  if (op->cb) {
    if (err)
      op->cb(err, errstr ? errstr : prosody_err_message(err), NULL, 0,
             op->opaque);
    else
      op->cb(PROSODY_OK, NULL, op->times, op->n, op->opaque);
    free(op->times);
    free(op);
    return;
  }
  pthread_mutex_lock(&op->lock);
  op->err = err;
  snprintf(op->errstr, sizeof(op->errstr), "%s", err && errstr ? errstr : "");
  op->done = 1;
  pthread_cond_signal(&op->cond);
  pthread_mutex_unlock(&op->lock);
}

/* The operation's partition, if it is still assigned with its timers. */
static part_t *top_part(top_t *op) {
  part_t *part = part_find(op->eng, op->topic, op->partition);
  return part && part->tq && !part->revoking ? part : NULL;
}

static void top_cleared(void *arg, prosody_err_t err, const char *errstr) {
  top_t *op = arg;
  part_t *part = top_part(op);
  if (!err && part)
    timer_deleted(part, op->key, -1,
                  op->kind == TOP_CLEAR_AND_SCHEDULE ? op->time_s : -1);
  top_done(op, err, errstr);
}

static void top_written(void *arg, prosody_err_t err, const char *errstr) {
  top_t *op = arg;
  part_t *part = top_part(op);
  pr__tseg_t seg = seg_of(op->topic, op->partition);
  if (err) {
    top_done(op, err, errstr);
    return;
  }
  if (part) {
    timer_written(op->eng, part, op->key, op->time_s);
    arm_fire(op->eng);
  }
  if (op->kind == TOP_CLEAR_AND_SCHEDULE) /* the new timer is written */
    op->eng->store->ops->del_key(op->eng->store, &seg, op->key,
                                 PR_TIMER_APPLICATION, op->time_s, top_cleared,
                                 op);
  else
    top_done(op, PROSODY_OK, NULL);
}

static void top_deleted(void *arg, prosody_err_t err, const char *errstr) {
  top_t *op = arg;
  part_t *part = top_part(op);
  if (!err && part)
    timer_deleted(part, op->key, op->time_s, -1);
  top_done(op, err, errstr);
}

static void top_listed(void *arg, prosody_err_t err, const char *errstr,
                       const int64_t *times, size_t n) {
  top_t *op = arg;
  part_t *part = top_part(op);
  if (!err && n > 0) {
    if (!(op->times = malloc(n * sizeof(int64_t)))) {
      top_done(op, PROSODY_ERR_NOMEM, "out of memory listing timers");
      return;
    }
    for (size_t i = 0; i < n; i++) {
      inv_t *f = part ? firing_find(part, op->key, times[i]) : NULL;
      if (!f || f->rearmed) /* a firing timer is not "scheduled" */
        op->times[op->n++] = times[i] * 1000;
    }
    if (!op->n) { /* only the firing one */
      free(op->times);
      op->times = NULL;
    }
  }
  top_done(op, err, errstr);
}

/* Runs a handler's timer operation (engine thread). */
static void run_op(pr__engine_t *eng, top_t *op) {
  pr__ctx_t *slot = pr__ctx_lock(op->ctx);
  char why[256];
  inv_t *inv;
  part_t *part;
  pr__tseg_t seg;
  pr__tstore_t *st = eng->store;

  if (slot && slot->finished) {
    pthread_mutex_unlock(&slot->lock);
    slot = NULL;
  }
  if (!slot) {
    top_done(op, PROSODY_ERR_STATE,
             "the context is stale: its handler has already finished");
    return;
  }
  inv = slot->owner;
  pthread_mutex_unlock(&slot->lock);
  part = inv->part;
  if (eng->stopping || eng->phase != PH_RUNNING) {
    top_done(op, PROSODY_ERR_STATE, "the consumer is shutting down");
    return;
  }
  if (part->revoking || part->zombie || !part->tq) {
    snprintf(why, sizeof(why), "partition %s[%d] is being revoked", part->topic,
             part->partition);
    top_done(op, PROSODY_ERR_STATE, why);
    return;
  }
  if (!eng->handler.on_timer) {
    top_done(op, PROSODY_ERR_STATE,
             "the handler has no on_timer: its timers could never fire");
    return;
  }
  op->eng = eng;
  op->key = strdup(inv->msg.key);
  op->topic = strdup(part->topic);
  op->partition = part->partition;
  if (!op->key || !op->topic) {
    top_done(op, PROSODY_ERR_NOMEM, "out of memory");
    return;
  }
  seg = seg_of(op->topic, op->partition);
  switch (op->kind) {
  case TOP_SCHEDULE:
  case TOP_CLEAR_AND_SCHEDULE:
    st->ops->put(st, &seg, op->key, op->time_s, PR_TIMER_APPLICATION,
                 top_written, op);
    break;
  case TOP_UNSCHEDULE:
    st->ops->del(st, &seg, op->key, op->time_s, PR_TIMER_APPLICATION,
                 top_deleted, op);
    break;
  case TOP_CLEAR:
    st->ops->del_key(st, &seg, op->key, PR_TIMER_APPLICATION, -1, top_cleared,
                     op);
    break;
  default:
    st->ops->key_times(st, &seg, op->key, PR_TIMER_APPLICATION, top_listed, op);
    break;
  }
}

/* Delivers the store's finished operations (engine thread). */
static void poll_store(pr__engine_t *eng) {
  if (atomic_exchange(&eng->store_pending, 0) && eng->store)
    eng->store->ops->poll(eng->store);
}

static void process_ops(pr__engine_t *eng) {
  top_t *op;
  pthread_mutex_lock(&eng->ops_lock);
  op = eng->ops_head;
  eng->ops_head = eng->ops_tail = NULL;
  atomic_store(&eng->ops_pending, 0);
  pthread_mutex_unlock(&eng->ops_lock);
  while (op) {
    top_t *next = op->next; /* op is freed or its caller's once done */
    run_op(eng, op);
    op = next;
  }
}

/* The engine stops: refuse queued and future operations. */
static void close_ops(pr__engine_t *eng) {
  top_t *op;
  pthread_mutex_lock(&eng->ops_lock);
  eng->ops_closed = 1;
  op = eng->ops_head;
  eng->ops_head = eng->ops_tail = NULL;
  atomic_store(&eng->ops_pending, 0);
  pthread_mutex_unlock(&eng->ops_lock);
  while (op) {
    top_t *next = op->next;
    top_done(op, PROSODY_ERR_STATE, "the consumer has stopped");
    op = next;
  }
}

/* Hands an operation to the engine (any thread): an asynchronous handler
 * on the engine thread runs it at once, any other thread queues it; either
 * way top_done() reports it, possibly before this returns. A stale context
 * is refused here (PROSODY_ERR_STATE, `op` untouched). */
static prosody_err_t top_submit(top_t *op, char *errstr, size_t errstr_size) {
  pr__ctx_t *slot = pr__ctx_lock(op->ctx);
  pr__engine_t *eng;

  if (slot && slot->finished) {
    pthread_mutex_unlock(&slot->lock);
    slot = NULL;
  }
  if (!slot) {
    pr__errf(errstr, errstr_size,
             "the context is stale: its handler has already finished");
    return PROSODY_ERR_STATE;
  }
  eng = ((inv_t *)slot->owner)->eng;
  if (tls_engine == eng) {
    /* A blocking call cannot wait for a store that answers through this
     * very thread; a callback can: the store completes it later here. */
    pthread_mutex_unlock(&slot->lock);
    if (!op->cb && !eng->store->sync)
      top_done(op, PROSODY_ERR_STATE,
               "timer calls from the engine thread need a store that answers "
               "at once; call from another thread");
    else
      run_op(eng, op);
    return PROSODY_OK;
  }
  /* The live attempt keeps the engine alive; `pushers` keeps it alive
   * until this thread has finished touching it. */
  atomic_fetch_add(&eng->pushers, 1);
  pthread_mutex_unlock(&slot->lock);
  pthread_mutex_lock(&eng->ops_lock);
  if (eng->ops_closed) {
    pthread_mutex_unlock(&eng->ops_lock);
    top_done(op, PROSODY_ERR_STATE, "the consumer has stopped");
  } else {
    op->next = NULL;
    if (eng->ops_tail)
      eng->ops_tail->next = op;
    else
      eng->ops_head = op;
    eng->ops_tail = op;
    atomic_store(&eng->ops_pending, 1);
    pthread_mutex_unlock(&eng->ops_lock);
    if (atomic_load(&eng->draining)) {
      pthread_mutex_lock(&eng->lock);
      pthread_cond_broadcast(&eng->cond);
      pthread_mutex_unlock(&eng->lock);
    }
    uv_async_send(&eng->wake);
  }
  atomic_fetch_sub(&eng->pushers, 1);
  return PROSODY_OK;
}

/* Submits an operation and waits for its result (any thread). */
static prosody_err_t timer_call(prosody_context_t *ctx, int kind,
                                int64_t time_s, int64_t **times, size_t *n,
                                char *errstr, size_t errstr_size) {
  top_t op;
  prosody_err_t err;

  memset(&op, 0, sizeof(op));
  op.kind = kind;
  op.ctx = ctx;
  op.time_s = time_s;
  pthread_mutex_init(&op.lock, NULL);
  pthread_cond_init(&op.cond, NULL);
  if (!(err = top_submit(&op, errstr, errstr_size))) {
    pthread_mutex_lock(&op.lock);
    while (!op.done)
      pthread_cond_wait(&op.cond, &op.lock);
    pthread_mutex_unlock(&op.lock);
  }
  pthread_mutex_destroy(&op.lock);
  pthread_cond_destroy(&op.cond);
  if (err)
    return err;
  if (op.err) {
    pr__errf(errstr, errstr_size, "%s", op.errstr);
    free(op.times);
    return op.err;
  }
  if (times) {
    *times = op.times;
    *n = op.n;
  } else {
    free(op.times);
  }
  return PROSODY_OK;
}

/* Submits an operation whose result goes to `cb` (any thread). */
static prosody_err_t timer_async(prosody_context_t *ctx, int kind,
                                 int64_t time_s, prosody_timer_cb cb,
                                 void *opaque, char *errstr,
                                 size_t errstr_size) {
  top_t *op = calloc(1, sizeof(*op));
  prosody_err_t err;
  if (!op) { /* known at once: reported like any failure of the operation */
    cb(PROSODY_ERR_NOMEM, "out of memory", NULL, 0, opaque);
    return PROSODY_OK;
  }
  op->kind = kind;
  op->ctx = ctx;
  op->time_s = time_s;
  op->cb = cb;
  op->opaque = opaque;
  if ((err = top_submit(op, errstr, errstr_size)))
    free(op);
  return err;
}

/* ------------------------------------------------------------------------ */
/* Draining (shutdown and revoke)                                            */
/* ------------------------------------------------------------------------ */

/* Releases every event of `part` (NULL: all partitions) that is not
 * running: not started, ready, or waiting for a retry. */
static void release_idle(pr__engine_t *eng, part_t *only) {
  ready_remove(eng, only);
  for (part_t *part = eng->parts; part; part = part->next) {
    if (only && part != only)
      continue;
    for (size_t b = 0; part->buckets && b < part->nbuckets; b++) {
      kq_t *kq = part->buckets[b];
      while (kq) {
        kq_t *knext = kq->next;
        inv_t *inv = kq->head, *keep = NULL;
        /* The head may be running (or in a DLQ send); everything behind
         * it, and an idle head, is released without commit. */
        if (inv && (inv->state == INV_RUNNING ||
                    (inv->state == INV_DLQ && !inv->timer))) {
          keep = inv;
          inv = inv->next;
          keep->next = NULL;
          kq->tail = keep;
        } else {
          kq->head = kq->tail = NULL;
        }
        while (inv) {
          inv_t *n = inv->next;
          part->invs--;
          inv_free(inv);
          inv = n;
        }
        if (!kq->head)
          kq_remove(part, kq);
        kq = knext;
      }
    }
  }
}

static void cancel_running(pr__engine_t *eng, int revoking_only) {
  for (part_t *part = eng->parts; part; part = part->next) {
    if (revoking_only && !part->revoking)
      continue;
    for (size_t b = 0; part->buckets && b < part->nbuckets; b++)
      for (kq_t *kq = part->buckets[b]; kq; kq = kq->next)
        if (kq->head && kq->head->state == INV_RUNNING)
          cancel_ctx(kq->head);
  }
}

/* Waits for running handlers (of revoking partitions, or all), cancelling
 * them at 80% of shutdown_timeout and giving up at 100%. Runs on the
 * engine thread outside the loop (e.g. inside a rebalance callback). */
static void drain(pr__engine_t *eng, int revoking_only) {
  int64_t start = pr__now_ns();
  int64_t cancel_at = start + eng->shutdown_ms * 800000;
  int64_t end = start + eng->shutdown_ms * 1000000;
  int cancelled = 0;

  for (;;) {
    int64_t now = pr__now_ns(), wake_at;
    struct timespec ts;
    int pending = 0;
    for (part_t *part = eng->parts; part; part = part->next)
      if (part->active > 0 && (!revoking_only || part->revoking))
        pending = 1;
    if (!pending)
      return;
    if (!cancelled && now >= cancel_at) {
      PR_INFO("engine", "cancelling running handlers (%s)",
              revoking_only ? "partitions revoked" : "shutting down");
      cancel_running(eng, revoking_only);
      cancelled = 1;
    }
    if (now >= end) {
      PR_ERROR("engine",
               "handlers still running after shutdown_timeout; giving up on "
               "them (their events are redelivered later)");
      return;
    }
    wake_at = cancelled ? end : cancel_at;
    if (wake_at - now > 50000000)
      wake_at = now + 50000000;
    pr__deadline_after(CLOCK_REALTIME, wake_at - now, &ts);
    atomic_store(&eng->draining, 1);
    pthread_mutex_lock(&eng->lock);
    if (!atomic_load(&eng->done) && !atomic_load(&eng->ops_pending) &&
        !atomic_load(&eng->store_pending))
      pthread_cond_timedwait(&eng->cond, &eng->lock, &ts);
    pthread_mutex_unlock(&eng->lock);
    atomic_store(&eng->draining, 0);
    process_ops(eng); /* refused for what drains, served for the rest */
    poll_store(eng);  /* e.g. fired timers' deletes */
    process_done(eng);
  }
}

/* Unlinks `part`; frees it, or keeps it as a zombie while a handler of it
 * still runs. */
static void part_release(pr__engine_t *eng, part_t *part) {
  part_t **pp = &eng->parts;
  while (*pp && *pp != part)
    pp = &(*pp)->next;
  if (*pp)
    *pp = part->next;
  part_queue_close(part);
  timers_released(eng, part);
  if (part->invs > 0) {
    part->zombie = 1;
    part->next = eng->zombies;
    eng->zombies = part;
    /* Already cancelled: their timeouts have nothing left to do. */
    for (size_t b = 0; part->buckets && b < part->nbuckets; b++)
      for (kq_t *kq = part->buckets[b]; kq; kq = kq->next)
        if (kq->head)
          tmo_unlink(kq->head);
    PR_WARN("engine", "%s[%d] released with %d handler(s) still running",
            part->topic, part->partition, part->invs);
  } else {
    part_free(part);
  }
}

/* ------------------------------------------------------------------------ */
/* Rebalance                                                                 */
/* ------------------------------------------------------------------------ */

static void update_assigned(pr__engine_t *eng) {
  int n = 0;
  for (part_t *part = eng->parts; part; part = part->next)
    n++;
  atomic_store(&eng->assigned, n);
}

static void on_assign(pr__engine_t *eng, rd_kafka_topic_partition_list_t *list,
                      int coop) {
  rd_kafka_error_t *error = NULL;

  for (int i = 0; i < list->cnt; i++) {
    rd_kafka_topic_partition_t *tp = &list->elems[i];
    part_t *part;
    if (part_find(eng, tp->topic, tp->partition))
      continue;
    part = calloc(1, sizeof(*part));
    if (!part || !(part->topic = strdup(tp->topic))) {
      free(part);
      continue;
    }
    part->partition = tp->partition;
    pr__tracker_init(&part->tracker);
    part->head_off = -1;
    part->held = zombie_find(eng, tp->topic, tp->partition) != NULL;
    part->next = eng->parts;
    eng->parts = part;
    part_queue_open(eng, part);
    timers_assigned(eng, part);
  }
  if (coop)
    error = rd_kafka_incremental_assign(eng->rk, list);
  else
    rd_kafka_assign(eng->rk, list);
  if (error) {
    PR_ERROR("engine", "incremental assign failed: %s",
             rd_kafka_error_string(error));
    rd_kafka_error_destroy(error);
  }
  update_assigned(eng);
  arm_fire(eng);
  PR_INFO("engine", "assigned %d partition(s); %d in total", list->cnt,
          atomic_load(&eng->assigned));
}

static void on_revoke(pr__engine_t *eng, rd_kafka_topic_partition_list_t *list,
                      int coop) {
  rd_kafka_error_t *error = NULL;
  for (int i = 0; i < list->cnt; i++) {
    part_t *part =
        part_find(eng, list->elems[i].topic, list->elems[i].partition);
    if (part) {
      part->revoking = 1;
      release_idle(eng, part);
    }
  }
  if (!eng->stopping) /* shutdown has drained already */
    drain(eng, 1);
  /* Store the final watermark before giving the partitions up. */
  store_offsets(eng, NULL);
  for (int i = 0; i < list->cnt; i++) {
    part_t *part =
        part_find(eng, list->elems[i].topic, list->elems[i].partition);
    if (part)
      part_release(eng, part);
  }
  if (coop)
    error = rd_kafka_incremental_unassign(eng->rk, list);
  else
    rd_kafka_assign(eng->rk, NULL);
  if (error) {
    PR_ERROR("engine", "incremental unassign failed: %s",
             rd_kafka_error_string(error));
    rd_kafka_error_destroy(error);
  }
  update_assigned(eng);
  PR_INFO("engine", "revoked %d partition(s); %d remain", list->cnt,
          atomic_load(&eng->assigned));
}

static void rebalance_cb(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                         rd_kafka_topic_partition_list_t *list, void *opaque) {
  pr__engine_t *eng = opaque;
  int coop = !strcmp(rd_kafka_rebalance_protocol(rk), "COOPERATIVE");
  if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
    on_assign(eng, list, coop);
  } else if (err == RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS) {
    on_revoke(eng, list, coop);
  } else {
    PR_ERROR("engine", "rebalance error: %s", rd_kafka_err2str(err));
    on_revoke(eng, list, coop);
  }
}

static void error_cb(rd_kafka_t *rk, int err, const char *reason,
                     void *opaque) {
  (void)rk;
  (void)opaque;
  if (err == RD_KAFKA_RESP_ERR__FATAL)
    PR_ERROR("engine", "fatal consumer error: %s", reason);
  else
    PR_WARN("engine", "consumer: %s (%s)", reason,
            rd_kafka_err2name((rd_kafka_resp_err_t)err));
}

/* ------------------------------------------------------------------------ */
/* Loop callbacks                                                            */
/* ------------------------------------------------------------------------ */

static void check_stalls(pr__engine_t *eng) {
  int64_t now = pr__now_ns();
  int stalled = 0;
  for (part_t *part = eng->parts; part; part = part->next) {
    int64_t oldest = pr__tracker_oldest(&part->tracker);
    if (oldest < 0) {
      part->head_off = -1;
      continue;
    }
    if (oldest != part->head_off) {
      part->head_off = oldest;
      part->head_since_ns = now;
    } else if (now - part->head_since_ns > eng->stall_ns) {
      stalled = 1;
    }
  }
  atomic_store(&eng->stalled, stalled);
}

static void shutdown_engine(pr__engine_t *eng) {
  int64_t t0 = pr__now_ns();
  if (eng->stopping)
    return;
  eng->stopping = 1;
  eng->phase = PH_DRAINING;
  uv_timer_stop(&eng->tfire);
  release_idle(eng, NULL);
  drain(eng, 0);
  store_offsets(eng, NULL);
  /* Leaves the group; the revoke callback stores and releases what is
   * left, and librdkafka commits the stored offsets. */
  rd_kafka_consumer_close(eng->rk);
  while (eng->parts)
    part_release(eng, eng->parts);
  process_done(eng);
  close_ops(eng);
  /* The store's handles close with the loop's last run. */
  eng->store->ops->destroy(eng->store);
  eng->store = NULL;
  update_assigned(eng);
  PR_INFO("engine", "consumer stopped in %lld ms",
          (long long)((pr__now_ns() - t0) / 1000000));
  uv_poll_stop(&eng->kpoll);
  uv_close((uv_handle_t *)&eng->kpoll, NULL);
  uv_timer_stop(&eng->tick);
  uv_close((uv_handle_t *)&eng->tick, NULL);
  uv_close((uv_handle_t *)&eng->tfire, NULL);
  uv_close((uv_handle_t *)&eng->tmo, NULL);
  uv_close((uv_handle_t *)&eng->wake, NULL);
}

static void on_kafka(uv_poll_t *h, int status, int events) {
  (void)status;
  (void)events;
  drain_kafka(h->data);
}

static void on_tick(uv_timer_t *t) {
  pr__engine_t *eng = t->data;
  timers_advance(eng);
  drain_kafka(eng);
  check_stalls(eng);
}

static void on_wake(uv_async_t *a) {
  pr__engine_t *eng = a->data;
  poll_store(eng);
  process_ops(eng);
  process_done(eng);
  store_offsets(eng, NULL);
  if (atomic_load(&eng->stop_requested))
    shutdown_engine(eng);
  else if (eng->resumed)
    drain_kafka(eng); /* fires due timers too */
  else
    fire_due(eng);
}

static void *engine_main(void *arg) {
  pr__engine_t *eng = arg;
  tls_engine = eng;
  pthread_setname_np(pthread_self(), "prosody-engine");
  uv_run(&eng->loop, UV_RUN_DEFAULT);
  tls_engine = NULL;
  return NULL;
}

/* ------------------------------------------------------------------------ */
/* Start / stop                                                              */
/* ------------------------------------------------------------------------ */

static void engine_free(pr__engine_t *eng) {
  if (eng->pool)
    pr__pool_destroy(eng->pool);
  if (eng->pipefd[0] >= 0)
    close(eng->pipefd[0]);
  if (eng->pipefd[1] >= 0)
    close(eng->pipefd[1]);
  if (eng->store)
    eng->store->ops->destroy(eng->store);
  pthread_mutex_destroy(&eng->ops_lock);
  pthread_mutex_destroy(&eng->lock);
  pthread_cond_destroy(&eng->cond);
  free(eng);
}

/* The Cassandra settings as the CQL client takes them. */
static pr__cql_conf_t cql_conf(const pr__settings_t *st) {
  pr__cql_conf_t c;
  memset(&c, 0, sizeof(c));
  c.nodes = PR_CFG(st, CASSANDRA_NODES).list;
  c.nnodes = PR_CFG(st, CASSANDRA_NODES).list_n;
  c.user =
      PR_CFG_SET(st, CASSANDRA_USER) ? PR_CFG_STR(st, CASSANDRA_USER) : NULL;
  c.password = PR_CFG_SET(st, CASSANDRA_PASSWORD)
                   ? PR_CFG_STR(st, CASSANDRA_PASSWORD)
                   : NULL;
  c.datacenter = PR_CFG_SET(st, CASSANDRA_DATACENTER)
                     ? PR_CFG_STR(st, CASSANDRA_DATACENTER)
                     : NULL;
  c.rack =
      PR_CFG_SET(st, CASSANDRA_RACK) ? PR_CFG_STR(st, CASSANDRA_RACK) : NULL;
  return c;
}

/* Outside mock mode: Cassandra is required, and its keyspace is migrated
 * before the consumer starts (blocking, on a private loop). */
static int migrate_store(const pr__settings_t *st, char *errstr,
                         size_t errstr_size) {
  pr__cql_conf_t c = cql_conf(st);
  pr__cql_sync_t *y;
  char why[1024];
  prosody_err_t err;
  if (!PR_CFG_SET(st, CASSANDRA_NODES) || !c.nnodes) {
    pr__errf(errstr, errstr_size,
             "cassandra_nodes (PROSODY_CASSANDRA_NODES) is required to consume "
             "unless mock is true: timers are stored in Cassandra; give "
             "host:port[,host:port...]");
    return -1;
  }
  if (!(y = pr__cql_sync_new(&c, why, sizeof(why)))) {
    pr__errf(errstr, errstr_size, "Cassandra: %s", why);
    return -1;
  }
  err = pr__cql_migrate(y, PR_CFG_STR(st, CASSANDRA_KEYSPACE), 60000, NULL, why,
                        sizeof(why));
  pr__cql_sync_free(y);
  if (err) {
    pr__errf(errstr, errstr_size, "Cassandra (cassandra_nodes %s): %s",
             PR_CFG(st, CASSANDRA_NODES).list[0], why);
    return -1;
  }
  return 0;
}

/* The store thread finished operations: let the engine deliver them. */
static void store_wake(void *arg) {
  pr__engine_t *eng = arg;
  atomic_store(&eng->store_pending, 1);
  if (atomic_load(&eng->draining)) {
    pthread_mutex_lock(&eng->lock);
    pthread_cond_broadcast(&eng->cond);
    pthread_mutex_unlock(&eng->lock);
  }
  uv_async_send(&eng->wake);
}

/* The timer store: memory in mock mode, else Cassandra. */
static pr__tstore_t *new_store(pr__engine_t *eng, char *errstr,
                               size_t errstr_size) {
  pr__cql_conf_t c;
  pr__tstore_t *s;
  if (eng->memory_timers) {
    if (!(s = pr__memstore_new()))
      pr__errf(errstr, errstr_size, "out of memory");
    return s;
  }
  c = cql_conf(eng->st);
  return pr__cqlstore_new(&c, PR_CFG_STR(eng->st, CASSANDRA_KEYSPACE),
                          eng->group_id, eng->slab_s,
                          PR_CFG_NS(eng->st, CASSANDRA_RETENTION) / 1000000000,
                          store_wake, eng, errstr, errstr_size);
}

pr__engine_t *pr__engine_start(const pr__settings_t *st, const char *bootstrap,
                               pr__producer_t *producer,
                               const prosody_handler_t *handler, char *errstr,
                               size_t errstr_size) {
  pr__engine_t *eng = calloc(1, sizeof(*eng));
  rd_kafka_conf_t *kconf = NULL;
  rd_kafka_topic_partition_list_t *topics;
  rd_kafka_resp_err_t kerr;
  char buf[32], why[512];
  const pr__value_t *subs = &PR_CFG(st, SUBSCRIBED_TOPICS);

  if (!eng) {
    pr__errf(errstr, errstr_size, "out of memory");
    return NULL;
  }
  eng->pipefd[0] = eng->pipefd[1] = -1;
  pthread_mutex_init(&eng->ops_lock, NULL);
  pthread_mutex_init(&eng->lock, NULL);
  pthread_cond_init(&eng->cond, NULL);
  eng->st = st;
  eng->producer = producer;
  eng->handler = *handler;
  eng->group_id = PR_CFG_STR(st, GROUP_ID);
  eng->mode = PR_CFG_ENUM(st, MODE);
  eng->max_concurrency = (int)PR_CFG_INT(st, MAX_CONCURRENCY);
  eng->max_uncommitted = (int)PR_CFG_INT(st, MAX_UNCOMMITTED);
  eng->stall_ns = PR_CFG_NS(st, STALL_THRESHOLD);
  eng->timeout_ms = PR_CFG_SET(st, TIMEOUT) ? PR_CFG_MS(st, TIMEOUT)
                                            : eng->stall_ns / 1000000 * 8 / 10;
  eng->shutdown_ms = PR_CFG_MS(st, SHUTDOWN_TIMEOUT);
  eng->seed = (unsigned)pr__now_ns();
  eng->slab_s = PR_CFG_NS(st, SLAB_SIZE) / 1000000000;
  if (eng->slab_s < 1)
    eng->slab_s = 1;
  /* Timers need a durable store outside mock mode, unless the handler has
   * no on_timer (it cannot use timers: no store is touched). Test hook
   * (docs/DEVELOPMENT.md): a consumer joining the embedded mock cluster by
   * address from another process keeps timers in memory. */
  eng->memory_timers = PR_CFG_BOOL(st, MOCK) || !handler->on_timer ||
                       (getenv("PROSODY_TEST_MEMORY_TIMERS") &&
                        !strcmp(getenv("PROSODY_TEST_MEMORY_TIMERS"), "1"));
  if (!eng->memory_timers && migrate_store(st, errstr, errstr_size))
    goto fail;

  if (!(handler->flags & PROSODY_HANDLER_ASYNC)) {
    eng->pool = pr__pool_new(eng->max_concurrency);
    if (!eng->pool) {
      pr__errf(errstr, errstr_size, "could not start %d worker threads",
               eng->max_concurrency);
      goto fail;
    }
  }
  if (pipe2(eng->pipefd, O_NONBLOCK | O_CLOEXEC)) {
    pr__errf(errstr, errstr_size, "pipe: %s", strerror(errno));
    goto fail;
  }

  kconf =
      pr__kafka_conf_new(bootstrap, PR_CFG_BOOL(st, MOCK), errstr, errstr_size);
  if (!kconf)
    goto fail;
  snprintf(buf, sizeof(buf), "%lld", (long long)PR_CFG_MS(st, COMMIT_INTERVAL));
  if (pr__kafka_conf_set(kconf, "group.id", eng->group_id, errstr,
                         errstr_size) ||
      pr__kafka_conf_set(kconf, "enable.auto.commit", "true", errstr,
                         errstr_size) ||
      pr__kafka_conf_set(kconf, "auto.commit.interval.ms", buf, errstr,
                         errstr_size) ||
      pr__kafka_conf_set(kconf, "enable.auto.offset.store", "false", errstr,
                         errstr_size) ||
      pr__kafka_conf_set(kconf, "auto.offset.reset", "earliest", errstr,
                         errstr_size) ||
      pr__kafka_conf_set(kconf, "enable.partition.eof", "false", errstr,
                         errstr_size) ||
      /* Rule 1: cooperative-sticky only where its bugs are fixed. */
      pr__kafka_conf_set(kconf, "partition.assignment.strategy",
                         rd_kafka_version() >= 0x020a0000 ? "cooperative-sticky"
                                                          : "range",
                         errstr, errstr_size) ||
      (PR_CFG_BOOL(st, MOCK) &&
       (pr__kafka_conf_set(kconf, "session.timeout.ms", "6000", errstr,
                           errstr_size) ||
        pr__kafka_conf_set(kconf, "heartbeat.interval.ms", "500", errstr,
                           errstr_size)))) {
    rd_kafka_conf_destroy(kconf);
    goto fail;
  }
  /* Test hook: a consumer in another process that joins the embedded mock
   * cluster by address (so `mock` is false) gets the mock's short session
   * too; see docs/DEVELOPMENT.md. */
  if (getenv("PROSODY_TEST_SESSION_TIMEOUT_MS") &&
      (pr__kafka_conf_set(kconf, "session.timeout.ms",
                          getenv("PROSODY_TEST_SESSION_TIMEOUT_MS"), errstr,
                          errstr_size) ||
       pr__kafka_conf_set(kconf, "heartbeat.interval.ms", "500", errstr,
                          errstr_size))) {
    rd_kafka_conf_destroy(kconf);
    goto fail;
  }
  rd_kafka_conf_set_rebalance_cb(kconf, rebalance_cb);
  rd_kafka_conf_set_error_cb(kconf, error_cb);
  rd_kafka_conf_set_opaque(kconf, eng);
  eng->rk = rd_kafka_new(RD_KAFKA_CONSUMER, kconf, why, sizeof(why));
  if (!eng->rk) {
    rd_kafka_conf_destroy(kconf);
    pr__errf(errstr, errstr_size, "could not create the Kafka consumer: %s",
             why);
    goto fail;
  }
  rd_kafka_poll_set_consumer(eng->rk);
  eng->cq = rd_kafka_queue_get_consumer(eng->rk);
  rd_kafka_queue_io_event_enable(eng->cq, eng->pipefd[1], "1", 1);

  uv_loop_init(&eng->loop);
  uv_poll_init(&eng->loop, &eng->kpoll, eng->pipefd[0]);
  eng->kpoll.data = eng;
  uv_poll_start(&eng->kpoll, UV_READABLE, on_kafka);
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
  if (!(eng->store = new_store(eng, errstr, errstr_size)))
    goto fail_loop;

  if (PR_CFG_BOOL(st, MOCK))
    for (size_t i = 0; i < subs->list_n; i++)
      pr__mock_ensure_topic(subs->list[i], NULL, 0);
  topics = rd_kafka_topic_partition_list_new((int)subs->list_n);
  for (size_t i = 0; i < subs->list_n; i++)
    rd_kafka_topic_partition_list_add(topics, subs->list[i],
                                      RD_KAFKA_PARTITION_UA);
  kerr = rd_kafka_subscribe(eng->rk, topics);
  rd_kafka_topic_partition_list_destroy(topics);
  if (kerr) {
    pr__errf(errstr, errstr_size, "could not subscribe: %s",
             rd_kafka_err2str(kerr));
    goto fail_loop;
  }
  if (pthread_create(&eng->thread, NULL, engine_main, eng)) {
    pr__errf(errstr, errstr_size, "could not start the engine thread");
    goto fail_loop;
  }
  return eng;

fail_loop:
  if (eng->store)
    eng->store->ops->destroy(eng->store);
  eng->store = NULL;
  uv_close((uv_handle_t *)&eng->kpoll, NULL);
  uv_close((uv_handle_t *)&eng->tick, NULL);
  uv_close((uv_handle_t *)&eng->tfire, NULL);
  uv_close((uv_handle_t *)&eng->tmo, NULL);
  uv_close((uv_handle_t *)&eng->wake, NULL);
  uv_run(&eng->loop, UV_RUN_DEFAULT);
  uv_loop_close(&eng->loop);
  rd_kafka_queue_destroy(eng->cq);
  rd_kafka_consumer_close(eng->rk);
  pr__kafka_destroy_bounded(eng->rk, 30000, "consumer");
fail:
  engine_free(eng);
  return NULL;
}

void pr__engine_stop(pr__engine_t *eng) {
  struct timespec ts;
  int rc;
  if (!eng)
    return;
  atomic_store(&eng->stop_requested, 1);
  uv_async_send(&eng->wake);
  /* The engine drains within shutdown_timeout; leaving the group is
   * librdkafka's part. Wait generously, but not for ever (rule 9). */
  pr__deadline_after(CLOCK_REALTIME, (eng->shutdown_ms + 60000) * 1000000, &ts);
  rc = pthread_timedjoin_np(eng->thread, NULL, &ts);
  if (rc) {
    PR_ERROR("engine",
             "the consumer did not stop within shutdown_timeout + 60 s; "
             "abandoning it");
    return;
  }
  /* The engine thread has exited: this thread owns its state now. Collect
   * completions that arrived after its last look (bounded), and let
   * libuv finish closing the timers that closes. */
  {
    int64_t deadline = pr__now_ns() + INT64_C(100000000);
    do {
      process_done(eng);
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
    return;
  }
  while (atomic_load(&eng->pushers) > 0)
    sched_yield();
  if (eng->pool) {
    pr__pool_destroy(eng->pool);
    eng->pool = NULL;
  }
  uv_loop_close(&eng->loop);
  rd_kafka_queue_destroy(eng->cq);
  pr__kafka_destroy_bounded(eng->rk, 30000, "consumer");
  engine_free(eng);
}

int pr__engine_assigned(const pr__engine_t *eng) {
  return atomic_load(&((pr__engine_t *)eng)->assigned);
}

int pr__engine_stalled(const pr__engine_t *eng) {
  return atomic_load(&((pr__engine_t *)eng)->stalled);
}

/* ------------------------------------------------------------------------ */
/* Public message and context functions                                      */
/* ------------------------------------------------------------------------ */

PROSODY_EXPORT const char *prosody_message_topic(const prosody_message_t *m) {
  return m->topic;
}
PROSODY_EXPORT int32_t prosody_message_partition(const prosody_message_t *m) {
  return m->partition;
}
PROSODY_EXPORT int64_t prosody_message_offset(const prosody_message_t *m) {
  return m->offset;
}
PROSODY_EXPORT int64_t prosody_message_timestamp(const prosody_message_t *m) {
  return m->timestamp;
}
PROSODY_EXPORT const char *prosody_message_key(const prosody_message_t *m) {
  return m->key;
}
PROSODY_EXPORT const char *prosody_message_payload(const prosody_message_t *m) {
  return m->payload;
}
PROSODY_EXPORT size_t prosody_message_payload_len(const prosody_message_t *m) {
  return m->payload_len;
}
PROSODY_EXPORT const struct json_t *
prosody_message_json(const prosody_message_t *m) {
  return m->json;
}

PROSODY_EXPORT const char *prosody_message_header(const prosody_message_t *m,
                                                  const char *name) {
  prosody_message_t *mm = (prosody_message_t *)m;
  const void *v;
  size_t len;
  hdr_copy_t *h;
  const char *out = NULL;
  if (!m || !name || !m->headers ||
      rd_kafka_header_get_last(m->headers, name, &v, &len))
    return NULL;
  pthread_mutex_lock(&mm->hdr_lock);
  for (h = mm->hdr_copies; h; h = h->next)
    if (!strcmp(h->name, name)) {
      out = h->value;
      break;
    }
  if (!out && (h = calloc(1, sizeof(*h)))) {
    h->name = strdup(name);
    h->value = dup_n(v, len);
    if (h->name && h->value) {
      h->next = mm->hdr_copies;
      mm->hdr_copies = h;
      out = h->value;
    } else {
      free(h->name);
      free(h->value);
      free(h);
    }
  }
  pthread_mutex_unlock(&mm->hdr_lock);
  return out;
}

PROSODY_EXPORT int prosody_should_cancel(const prosody_context_t *ctx) {
  pr__ctx_t *slot = pr__ctx_lock(ctx);
  int cancelled;
  if (!slot)
    return 1; /* stale: its invocation is over */
  cancelled = slot->cancelled;
  pthread_mutex_unlock(&slot->lock);
  return cancelled;
}

PROSODY_EXPORT prosody_err_t prosody_context_on_cancel(prosody_context_t *ctx,
                                                       prosody_cancel_cb cb,
                                                       void *opaque) {
  pr__ctx_t *slot;
  if (!ctx)
    return PROSODY_ERR_INVALID_ARG;
  if (!(slot = pr__ctx_lock(ctx)))
    return PROSODY_ERR_STATE;
  if (slot->finished) {
    pthread_mutex_unlock(&slot->lock);
    return PROSODY_ERR_STATE;
  }
  slot->cancel_cb = NULL;
  slot->cancel_opaque = NULL;
  if (cb && slot->cancelled) {
    cb(ctx, opaque); /* lock held, as cancel_ctx() calls it */
  } else {
    slot->cancel_cb = cb;
    slot->cancel_opaque = opaque;
  }
  pthread_mutex_unlock(&slot->lock);
  return PROSODY_OK;
}

PROSODY_EXPORT int prosody_wait_cancel(prosody_context_t *ctx,
                                       int64_t timeout_ms) {
  struct timespec ts;
  pr__ctx_t *slot;
  uint64_t gen;
  int cancelled;
  if (timeout_ms >= 0) /* capped at ~31 years so the ns cannot overflow */
    pr__deadline_after(CLOCK_REALTIME,
                       (timeout_ms < INT64_C(1000000000000)
                            ? timeout_ms
                            : INT64_C(1000000000000)) *
                           1000000,
                       &ts);
  if (!(slot = pr__ctx_lock(ctx)))
    return 1;
  gen = slot->gen;
  /* A release (new generation) ends the wait too: the invocation is over. */
  while (!slot->cancelled && slot->gen == gen) {
    if (timeout_ms < 0)
      pthread_cond_wait(&slot->cond, &slot->lock);
    else if (pthread_cond_timedwait(&slot->cond, &slot->lock, &ts) == ETIMEDOUT)
      break;
  }
  cancelled = slot->cancelled || slot->gen != gen;
  pthread_mutex_unlock(&slot->lock);
  return cancelled;
}

PROSODY_EXPORT void prosody_context_set_error(prosody_context_t *ctx,
                                              const char *message) {
  pr__ctx_t *slot = pr__ctx_lock(ctx);
  if (!slot)
    return;
  free(slot->error);
  slot->error = message ? strdup(message) : NULL;
  pthread_mutex_unlock(&slot->lock);
}

PROSODY_EXPORT prosody_err_t prosody_complete(prosody_context_t *ctx,
                                              prosody_result_t result,
                                              const char *message) {
  if (!ctx || result == PROSODY_PENDING)
    return PROSODY_ERR_INVALID_ARG;
  return complete_attempt(ctx, result, message) ? PROSODY_ERR_STATE
                                                : PROSODY_OK;
}

/* ------------------------------------------------------------------------ */
/* Public timer functions                                                    */
/* ------------------------------------------------------------------------ */

static prosody_err_t timer_call_at(prosody_context_t *ctx, int kind,
                                   int64_t time_ms, char *errstr,
                                   size_t errstr_size) {
  int64_t time_s;
  prosody_err_t err;
  if (!ctx) {
    pr__errf(errstr, errstr_size, "context is NULL");
    return PROSODY_ERR_INVALID_ARG;
  }
  err = pr__timer_round(time_ms, &time_s, errstr, errstr_size);
  if (err)
    return err;
  return timer_call(ctx, kind, time_s, NULL, NULL, errstr, errstr_size);
}

PROSODY_EXPORT prosody_err_t prosody_schedule(prosody_context_t *ctx,
                                              int64_t time_ms, char *errstr,
                                              size_t errstr_size) {
  return timer_call_at(ctx, TOP_SCHEDULE, time_ms, errstr, errstr_size);
}

PROSODY_EXPORT prosody_err_t prosody_unschedule(prosody_context_t *ctx,
                                                int64_t time_ms, char *errstr,
                                                size_t errstr_size) {
  return timer_call_at(ctx, TOP_UNSCHEDULE, time_ms, errstr, errstr_size);
}

PROSODY_EXPORT prosody_err_t prosody_clear_and_schedule(prosody_context_t *ctx,
                                                        int64_t time_ms,
                                                        char *errstr,
                                                        size_t errstr_size) {
  return timer_call_at(ctx, TOP_CLEAR_AND_SCHEDULE, time_ms, errstr,
                       errstr_size);
}

PROSODY_EXPORT prosody_err_t prosody_clear_scheduled(prosody_context_t *ctx,
                                                     char *errstr,
                                                     size_t errstr_size) {
  if (!ctx) {
    pr__errf(errstr, errstr_size, "context is NULL");
    return PROSODY_ERR_INVALID_ARG;
  }
  return timer_call(ctx, TOP_CLEAR, -1, NULL, NULL, errstr, errstr_size);
}

PROSODY_EXPORT prosody_err_t prosody_scheduled(prosody_context_t *ctx,
                                               int64_t **times, size_t *n,
                                               char *errstr,
                                               size_t errstr_size) {
  if (!ctx || !times || !n) {
    pr__errf(errstr, errstr_size, "context, times and n must not be NULL");
    return PROSODY_ERR_INVALID_ARG;
  }
  *times = NULL;
  *n = 0;
  return timer_call(ctx, TOP_SCHEDULED, -1, times, n, errstr, errstr_size);
}

PROSODY_EXPORT void prosody_times_free(int64_t *times) { free(times); }

PROSODY_EXPORT prosody_err_t prosody_timer_async(
    prosody_context_t *ctx, prosody_timer_op_t op, int64_t time_ms,
    prosody_timer_cb cb, void *opaque, char *errstr, size_t errstr_size) {
  int64_t time_s = -1;
  prosody_err_t err;
  if (!ctx || !cb) {
    pr__errf(errstr, errstr_size, "%s is NULL", ctx ? "callback" : "context");
    return PROSODY_ERR_INVALID_ARG;
  }
  switch ((int)op) {
  case PROSODY_TIMER_SCHEDULE:
  case PROSODY_TIMER_UNSCHEDULE:
  case PROSODY_TIMER_CLEAR_AND_SCHEDULE:
    if ((err = pr__timer_round(time_ms, &time_s, errstr, errstr_size)))
      return err;
    break;
  case PROSODY_TIMER_CLEAR:
  case PROSODY_TIMER_SCHEDULED:
    break; /* time_ms is ignored */
  default:
    pr__errf(errstr, errstr_size,
             "unknown timer operation %d: want PROSODY_TIMER_SCHEDULE (0) .. "
             "PROSODY_TIMER_SCHEDULED (4)",
             (int)op);
    return PROSODY_ERR_INVALID_ARG;
  }
  return timer_async(ctx, (int)op, time_s, cb, opaque, errstr, errstr_size);
}

PROSODY_EXPORT const char *prosody_timer_key(const prosody_timer_t *timer) {
  return timer ? timer->key : NULL;
}

PROSODY_EXPORT int64_t prosody_timer_time(const prosody_timer_t *timer) {
  return timer ? timer->time_ms : -1;
}
