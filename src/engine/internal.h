/*
 * internal.h - the consumer engine's types and the functions its files
 * share (private to src/engine/).
 *
 * The data path, one file per step (docs/ARCHITECTURE.md section 3):
 *
 *   intake.c      poll librdkafka's queues, check the key, take the offset
 *   partition.c   partitions, key queues, offsets and commits, stalls
 *   backpressure.c  when a partition stops and is read again
 *   dispatch.c    limiter, worker hand-off, handler timeouts, completion
 *   scheduler.c   the fair scheduler: which waiting event runs next
 *   decode.c      JSON and filters, on the thread about to run the handler
 *   dedup.c       deduplication: ids of handled messages, cache and store
 *   mailbox.c     the one way into the engine thread from other threads
 *   outcome.c     the mode's result layers, retries, finishing an event
 *   deadletter.c  failure-topic sends (low-latency mode)
 *   firing.c      durable timers: loading, firing, deleting once handled
 *   timer_ops.c   the handler's timer calls (prosody_schedule & co.)
 *   drain.c       shutdown and revoke: release, cancel, wait
 *   rebalance.c   librdkafka's assign and revoke callbacks
 *   record.c      a record's bytes: key check, copy, verdict, accessors
 *   message.c     invocations, the public timer accessors
 *   engine.c      start, stop, the loop's callbacks, shutdown
 *
 * Threads. One engine thread per subscribed client runs a libuv loop and
 * owns every field marked "engine thread" below: it takes no locks for
 * them. Other threads (workers running synchronous handlers, the host
 * loop completing asynchronous ones, librdkafka's producer thread, the
 * timer store's thread) reach the engine only through its mailbox
 * (pr__mail_post: one lock, one wake-up) and read the atomics.
 *
 * Lifetimes. An inv (invocation) lives from intake until its event
 * finishes or is released; its message and context are embedded in it.
 * A part lives from assignment until revoke (or until its last inv ends,
 * for a zombie).
 */
#ifndef PR_ENGINE_INTERNAL_H
#define PR_ENGINE_INTERNAL_H

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "../config/config.h"
#include "../kafka/kafka.h"
#include "../otel/otel.h"
#include "../stores/stores.h"
#include "../timers/timers.h"
#include "../util/util.h"
#include "context.h"
#include "engine.h"
#include "layer.h"
#include "mailbox.h"
#include "metrics.h"
#include "pool.h"
#include "prosody.h"
#include "scheduler.h"
#include "tracker.h"

typedef struct part part_t;
typedef struct kq kq_t;
typedef struct inv inv_t;

/* --- Messages, timers, invocations (engine thread unless marked) ------- */

/* A header value copied out for prosody_message_header(). */
typedef struct hdr_copy {
  struct hdr_copy *next;
  char *name, *value;
} hdr_copy_t;

/* What the handler sees. Written at intake (engine thread); read by the
 * handler's thread while it runs; `json` set by decode when a filter
 * needs it, else on first prosody_message_json() (atomically: any thread
 * of the handler's), and freed by whichever thread holds the inv. */
struct prosody_message {
  const char *topic; /* the partition's topic string */
  int32_t partition;
  int64_t offset;
  int64_t timestamp;           /* ms since epoch, -1 if none */
  char *key;                   /* owned, NUL-terminated */
  char *payload;               /* owned, NUL-terminated */
  size_t payload_len;          /* bytes, without the NUL */
  json_t *json;                /* owned, or NULL until asked for */
  rd_kafka_headers_t *headers; /* owned (detached), or NULL */
  hdr_copy_t *hdr_copies;      /* values handed out by _header(), under
                                  the message's striped lock (record.c) */
};

struct prosody_timer {
  const char *key; /* the inv's msg.key */
  int64_t time_ms;
};

/* An event's tracing (trace.c), made when it has a trace context or its
 * client exports spans. Written by the thread about to run an attempt,
 * before the handler starts; read while it runs. */
typedef struct pr__itrace {
  pr_span_t *span;    /* the running attempt's span (owned by the thread
                         running it; ended with its result), or NULL */
  pr_span_ctx_t from; /* a timer: the context it was scheduled in */
  pr_span_ctx_t ctx;  /* the context the handler runs in */
  int spanned;        /* ... which is the client's own span's */
  char tp[PR_TRACEPARENT_LEN + 1]; /* ctx as a traceparent */
} pr__itrace_t;

enum inv_state {
  INV_QUEUED,     /* in its key FIFO, not started */
  INV_READY,      /* head of its key, waiting in the scheduler */
  INV_RUNNING,    /* handler invoked, result not processed yet */
  INV_RETRY_WAIT, /* waiting on its retry timer */
  INV_DLQ,        /* being sent to the failure topic (or a fired timer
                     being deleted from the store) */
  INV_DEFERRING   /* deferred: its offset is being written to the key's
                     defer queue (out of its key queue; committed once
                     written) */
};

/* A layer's own state in an engine structure (an event's ddx and dfx, a
 * key queue's dfk, a partition's dfp): opaque room for a struct that only
 * the layer's files define, which checks that it fits (_Static_assert
 * beside its definition). */
#define PR__AREA(n)                                                            \
  union {                                                                      \
    int64_t align_i;                                                           \
    void *align_p;                                                             \
    unsigned char bytes[n];                                                    \
  }

/* One event (a record or a fired timer) from intake until it finishes.
 * Engine thread, except: while RUNNING the handler's thread reads `msg`,
 * `tmr` and the decode fields; the completing thread writes `result` and
 * `result_error` before it posts `mail` (the post publishes them). */
struct inv {
  inv_t *next;         /* key FIFO link */
  inv_t *chain_next;   /* the key's next event claimed for the same run
                          (set by the engine before the run starts; read by
                          the run's worker) */
  atomic_int released; /* claimed, and its partition is being released:
                          the run must not start it */
  pr__mail_t mail;
  pr__sched_task_t sched; /* INV_READY: its place in the scheduler */
  int64_t started_ns;     /* when its handler started (the thread running
                             it; published by the result's post) */
  int64_t run_ns;         /* the attempt's handler time (set with the
                             result) */
  pr__engine_t *eng;
  part_t *part;
  kq_t *kq;
  prosody_message_t msg;    /* a timer: key, topic, partition; offset -1 */
  struct prosody_timer tmr; /* is_timer: the fired timer */
  pr__ctx_t *cslot;         /* the running attempt's context slot, or NULL */
  pr__itrace_t *tr;         /* its tracing (trace.c), or NULL */
  prosody_context_t *ctx;   /* its handle */
  int64_t time_s;           /* is_timer: the timer's time */
  int delete_failures;      /* is_timer: failed deletes (retried) so far */
  int attempt;              /* attempts started so far */
  prosody_result_t result;  /* set by the completer before posting */
  char *result_error;       /* owned; set by the completer */
  prosody_err_t dlq_err;    /* failure-topic send result */
  char *dlq_errstr;         /* owned */
  uv_timer_t *timer;        /* retry / failure-topic retry timer, or NULL */
  inv_t *tprev, *tnext;     /* deadline list links */
  int64_t deadline_ns;      /* RUNNING with a timeout: when it expires */
  rd_kafka_message_t *rkm;  /* the record, until its headers are detached
                               (owned), else NULL; see pr__inv_release_rkm.
                               While RUNNING the handler's thread's (decode
                               releases it), else the engine thread's */
  size_t room;              /* bytes after the struct (pr__inv_alloc), 0
                               for an inv of another size */
  const char *skip;         /* set by decode: why the record is skipped */
  /* The layers' per-event state, opaque here: bytes in the event's
   * allocation, a struct that only the layer's own files define and read
   * (dedup.h's pr__dd_ev_t through DDX(inv), defer.h's pr__df_ev_t through
   * DFX(inv)); zero (calloc) until the layer sets it. */
  PR__AREA(32) ddx;
  PR__AREA(40) dfx;
  /* Keyed state (state.c): the running attempt's transaction (a struct
   * only its files define), or NULL. */
  struct pr__stx *stx;
  /* Flags and small states, a byte each, together. Each has the writer its
   * comment (or, unsaid, the struct's) gives; bytes are separate memory
   * locations (bit-fields would not be). */
  uint8_t state;          /* enum inv_state */
  uint8_t is_timer;       /* a timer firing, not a message */
  uint8_t rearmed;        /* is_timer: scheduled again while firing */
  uint8_t dropped;        /* is_timer: unscheduled before it started */
  uint8_t deleted;        /* is_timer: already deleted from the store */
  uint8_t df_gone;        /* df_loaded timer unscheduled while it ran: its
                             defer entry is removed, a failure must not
                             write it back */
  uint8_t run_end;        /* the worker stops the run after this event (set
                             with the result) */
  uint8_t emitted;        /* the attempt's telemetry events were queued by
                             its completing thread (set with the result) */
  uint8_t timed;          /* in the deadline list */
  uint8_t unprepared;     /* a message decode has not seen yet */
  uint8_t skip_warn;      /* skip: whether it is worth a warning */
  uint8_t skip_dup;       /* skip: because it is a duplicate (dedup.c) */
  uint8_t inline_strings; /* msg.key/payload live in this allocation */
  int8_t json_state;      /* payload checked at intake: 1 valid, -1 not;
                             0 unchecked (decode checks it) */
  uint8_t df_loaded;      /* a deferred message loaded again: its offset
                             was committed when it was deferred */
};

/* A deferred key of a partition (defer.c; engine thread): hung on its key
 * queue, which it keeps alive. Its entries (offsets) are in the store. */
typedef struct pr__dk {
  struct pr__dk *next; /* the partition's deferred keys */
  kq_t *kq;
  int kind;            /* pr__defer_kind_t: its messages or its timers */
  int64_t retry_at_ms; /* when its head is retried next */
  int busy;            /* a lookup, load, attempt or write of its head in
                          flight */
  int writes;          /* its events in INV_DEFERRING (appends in flight or
                          waiting to be written again) */
  inv_t *deferring;    /* ... those events (linked through their DFX prev/next,
                          defer.h) */
  int row_written;     /* its key row is known to be in the store; until
                          then, events written after the first are held
                          (not committed: a timer would be lost) */
  int appended;        /* appended since the last head lookup was sent */
  int64_t position;    /* busy: the head's offset ... */
  int32_t retries;     /* ... and retries */
} pr__dk_t;

/* A request about a deferred key (a store operation or a load), naming its
 * partition assignment and key rather than pointing at them: a revoke may
 * come first. Posted back by the loader as a letter. */
typedef struct pr__load {
  pr__mail_t mail;
  pr__mail_fn *answered; /* receives the answer (engine thread) */
  struct pr__load *next; /* the loader's queue */
  pr__engine_t *eng;
  uint64_t gen; /* the assignment */
  int kind;     /* pr__defer_kind_t */
  int32_t partition;
  int64_t offset;
  int pending;             /* store answers still expected */
  prosody_err_t err;       /* the first failed answer's class */
  rd_kafka_message_t *rkm; /* loaded: the record */
  int gone;                /* loaded: the offset is not there any more */
  char *error;             /* a failure (owned) */
  pr_span_t *span;         /* a fetch: its `load` span (engine thread) */
  char *topic, *key;       /* in the same allocation */
} pr__load_t;
typedef struct pr__loader pr__loader_t;

/* A deferred message kept for its retries (defer.c; engine thread): the
 * defer_cache_size most recently deferred, so a retry needs no fetch. A
 * deferred timer with a trace context is kept the same way (is_timer,
 * offset: its time in seconds, no payload), so its retries' spans still
 * link to the span that scheduled it. */
typedef struct pr__dmsg {
  struct pr__dmsg *prev, *next; /* most recently used first */
  int32_t partition;
  int is_timer;
  int excise;         /* an excise record: no payload */
  pr_span_ctx_t from; /* a timer: the context it was scheduled in */
  int64_t offset, timestamp;
  rd_kafka_headers_t *headers; /* owned, or NULL */
  size_t key_len, len;
  char *topic, *key, *payload; /* in the same allocation */
} pr__dmsg_t;

/* A key's FIFO within a partition (engine thread). */
struct kq {
  kq_t *next;          /* bucket chain */
  char *key;           /* in the same allocation */
  pr__sched_key_t *sk; /* its scheduler state, pinned while the queue lives */
  inv_t *head, *tail;  /* FIFO; head is the only one that may run */
  PR__AREA(24)
  dfk;      /* the defer layer's (defer.h's pr__df_kq_t): the
               key's deferred kinds; the queue lives while one
               is (pr__df_holds) */
  int idle; /* empty at the last tick and not asked for since:
               the next tick removes it (pr__part_tick_keys) */
};

/* An assigned partition (engine thread). */
struct part {
  part_t *next;
  pr__engine_t *eng;
  char *topic;
  int32_t partition;
  rd_kafka_queue_t *rkq; /* its own fetch queue (not forwarded to the
                            consumer queue), or NULL: records then arrive
                            on the consumer queue */
  int stopped;           /* backpressure: its queue is not read, its
                            timers not fired, until the backlog halves */
  int paused;            /* paused in librdkafka by us (librdkafka rule 2:
                            this flag is the exact set we resume from) */
  int64_t stopped_ns;    /* when it last stopped */
  int pressed;           /* its offset window half way to its limit: its
                            waiting events get the scheduler's full wait
                            boost */
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
  int64_t relist_ms;     /* a listing or load failed: list again then (0) */
  int relists;           /* ... how many failed in a row (the backoff) */
  /* Its timer slabs with a listing row in the store (slabs.c), sorted. */
  struct pr__slabrow *rows;
  size_t nrows, caprows;
  uint64_t rows_epoch; /* bumped by each put (a retire keeps newer rows) */
  int64_t wm_raised;   /* the slab watermark as last raised; -1: unknown */
  int64_t tidy_ms;     /* the next look for finished slabs */
  int retiring;        /* a retire in flight */
  int no_retire;       /* out of memory: finished slabs left to expire */
  PR__AREA(24)
  dfp; /* the defer layer's (defer.h's pr__df_part_t): its
          deferred keys, and whether they are being read
          (pr__df_listing, pr__df_keyed) */
};

enum phase { PH_RUNNING, PH_DRAINING };

struct pr__engine {
  /* Immutable after start. */
  const pr__settings_t *st;
  pr__producer_t *producer;
  pr__tm_t *tm;    /* the client's telemetry (thread-safe), or NULL */
  pr_otel_t *otel; /* the client's span exporter (thread-safe), or NULL */
  pr_span_relation_t span_rel[2]; /* message_spans, timer_spans */
  prosody_handler_t handler;
  const char *group_id;
  int mode;
  int max_concurrency, max_uncommitted;
  int64_t timeout_ms;  /* handler timeout, 0: none */
  int64_t shutdown_ms; /* shutdown_timeout */
  int64_t grace_ms;    /* then this long before the engine is abandoned */
  int64_t stall_ns;
  rd_kafka_t *rk;
  rd_kafka_queue_t *cq; /* the consumer queue (IO-event fd enabled) */
  int pipefd[2];
  pr__pool_t *pool; /* NULL for async handlers */
  pthread_t thread;
  pr__logger_t *logger; /* the client's: the engine's threads log there */

  /* The mailbox (mailbox.h: its own lock), and the letters the engine
   * posts to itself. */
  pr__mailbox_t mb;
  pr__mail_t store_mail;   /* the stores' letter, posted at most once ... */
  atomic_int store_posted; /* ... while this is set */
  pr__mail_t stop_mail;    /* pr__engine_stop's request */

  /* The thread that owns the engine's state (PR_ENGINE_THREAD): written
   * only by the thread taking it over, before or after the hand-over
   * (pthread_create, pthread_join) orders it against the others. */
  pthread_t owner;
  int owned; /* `owner` is set (engines made by pr__engine_start) */

  /* Cross-thread atomics. */
  atomic_int assigned;
  atomic_int stalled;

  /* Engine thread only. */
  uv_loop_t loop;
  uv_poll_t kpoll;
  uv_timer_t tick;
  uv_async_t wake;
  uv_check_t kick;       /* after the poll callbacks, and ... */
  uv_prepare_t kick_pre; /* ... before the poll: wake a worker for the jobs
                            queued meanwhile (pr__pool_kick) */
  int may_wake;          /* this iteration has not woken a worker yet */
  part_t *parts;
  part_t *zombies; /* released partitions with handlers still running */
  inv_t *inv_pool; /* freed message invs kept for reuse (linked by next;
                      pr__inv_alloc, pr__inv_free) ... */
  int inv_pool_n;  /* ... how many */
  pr__ctx_stash_t ctx_stash; /* free context slots (the engine thread's;
                                pr__ctx_acquire, pr__ctx_release) */

  int resumed;       /* a partition left backpressure: read queues */
  int running;       /* handlers started, not completed */
  int dlq_inflight;  /* failure-topic sends and fired-timer deletes in flight */
  pr__sched_t sched; /* events waiting for a handler slot */
  pr__metrics_t metrics;
  struct pr__mono_state *mono;      /* monopolization (monopoly.c); NULL: the
                                       layer is off */
  const pr__layer_t *const *layers; /* the mode's (mode.c), NULL-ended */
  struct pr__dd_state *dd;   /* deduplication (dedup.c: its fields' threads
                                there); NULL: the layer is off */
  struct pr__kst_state *kst; /* keyed state (state.c: its fields' threads
                                and lock there); NULL: no collection is
                                registered */
  struct pr__df_state *df;   /* deferral (defer_layer.c); NULL: the layer
                                is off */
  pr__loader_t *loader;      /* started on the first load (the defer layer
                                and keyed state's message collections) */
  char *bootstrap;           /* for the loader (owned) */
  int phase;
  int stop_asked;     /* the stop letter arrived: shut down after this batch */
  int stopping;       /* shutdown has begun */
  int close_answered; /* the consumer's close made an (un)assign call: the
                         group's later rebalance events are stale
                         (rebalance.c) */
  int held;           /* test option hold_rebalances: said an event waits */
  unsigned seed;
  pr__tstore_t *store;  /* the timer store */
  pr__cql_shared_t cql; /* the one Cassandra session of the stores (w NULL
                           until a store needs it): opened by the opening
                           thread, stopped by shutdown_engine (or by a
                           failed start) before any store is destroyed,
                           its reference dropped by engine_free */
  uint64_t part_gen;    /* last partition assignment generation */
  /* An assignment that could not be allocated, retried on the tick. */
  rd_kafka_topic_partition_list_t *assign_retry;
  int assign_coop; /* ... and whether it is an incremental one */
  /* The group refused our join (inconsistent protocol): the describe of
   * the group in flight on this queue, and when it was last reported. */
  rd_kafka_queue_t *mismatch_q;
  int64_t mismatch_ns;
  int fail_part_new; /* test option: partitions that fail to allocate */
  int dlq_refuse;    /* test option: failure-topic sends that fail */
  int timer_refuse;  /* test option: fired timers' deletes that fail */
  int64_t slab_s;    /* slab_size in seconds */
  uv_timer_t tfire;  /* wakes the loop when the next timer is due */
  /* Running handlers with a timeout, in start order; all have the same
   * timeout, so that is deadline order too, and one loop timer (tmo,
   * armed for the head) serves them all. */
  inv_t *tmo_head, *tmo_tail;
  uv_timer_t tmo;
};

/* --- engine.c --------------------------------------------------------- */

/* The engine whose loop runs on the calling thread, or NULL. */
pr__engine_t *pr__engine_current(void);

/* Thread checks. Every function of the engine that runs on the engine
 * thread starts with PR_ENGINE_THREAD(eng): in builds without NDEBUG (the
 * Debug builds of the sanitizer tiers) it aborts, naming the function,
 * when the calling thread does not own the engine. The owner is the
 * subscribing thread until the engine thread starts, then the engine
 * thread, then, once it has exited, the thread that stops the engine. An
 * engine not made by pr__engine_start (the unit tests') has no owner and
 * is not checked. */
void pr__engine_check_thread(const pr__engine_t *eng, const char *fn);
#ifndef NDEBUG
#define PR_ENGINE_THREAD(eng) pr__engine_check_thread((eng), __func__)
#else
#define PR_ENGINE_THREAD(eng) ((void)0)
#endif

/* --- message.c -------------------------------------------------------- */

/* A zeroed inv with at least `room` bytes after it (for its key and
 * payload), from the engine's free list when one fits; NULL when out of
 * memory. `eng` may be NULL (no free list). */
inv_t *pr__inv_alloc(pr__engine_t *eng, size_t room);
/* The free list keeps at most this many invs (each a few hundred bytes
 * plus its key and payload); their room is rounded up to a multiple of
 * the step, so that similar records share them (record.c). */
#define PR_INV_POOL_MAX 1024
#define PR_INV_ROOM_STEP 64
/* Frees an inv (back to the free list when it came from pr__inv_alloc). */
void pr__inv_free(inv_t *inv);
/* Leaves the running events' deadline list (pr__dispatch_time joins it). */
void pr__inv_untime(inv_t *inv);
/* Frees what only the handler needed (JSON tree, headers, header copies):
 * on success, by the worker that ran it, so the engine thread does not
 * (record.c). `keep_trace`: headers with a traceparent stay while
 * telemetry is on (its events report the context). */
void pr__inv_shed(inv_t *inv, int keep_trace);
/* "topic[p] offset N key "k"" or "topic[p] timer T key "k"", for logs
 * (record.c). */
const char *pr__inv_describe(const inv_t *inv, char *buf, size_t n);
void pr__inv_release_rkm(inv_t *inv);
void pr__inv_timer_close(uv_timer_t **t);
/* Arms the event's one timer (inv->timer, closing the one before) to call
 * `cb` (data: the inv) after `ms`; -1 without memory (no timer). */
int pr__inv_timer_start(inv_t *inv, uint64_t ms, uv_timer_cb cb);

/* Telemetry of an event whose handler ran: dispatched (at its start),
 * then succeeded or failed (message.c). Any thread holding the inv: the
 * worker that completes a synchronous handler's attempt, else the engine
 * thread. */
void pr__inv_emit_ran(inv_t *inv);
/* Telemetry of a timer operation: scheduled or cancelled (message.c), in
 * the calling handler's trace context (`trace`: NULL or invalid for none;
 * `tracestate`: its record's, NULL or "" for none). */
void pr__emit_timer_op(pr__engine_t *eng, pr__tm_type_t type, const char *topic,
                       int32_t partition, const char *key, int64_t time_s,
                       const pr_span_ctx_t *trace, const char *tracestate);

/* --- partition.c ------------------------------------------------------ */

part_t *pr__part_find(pr__engine_t *eng, const char *topic, int32_t p);
/* A new partition with its tracker and own queue; NULL when out of
 * memory. */
part_t *pr__part_new(pr__engine_t *eng, const char *topic, int32_t p);
void pr__part_free(part_t *part);
part_t *pr__part_zombie_find(pr__engine_t *eng, const char *topic, int32_t p);
void pr__part_zombie_done(pr__engine_t *eng, part_t *zombie);
void pr__part_store_offsets(pr__engine_t *eng, part_t *only);
void pr__part_queue_open(pr__engine_t *eng, part_t *part);
void pr__part_queue_close(part_t *part);
/* Pauses (1) or resumes (0) fetching `part` in librdkafka; resumes only
 * what it paused (librdkafka rule 2). */
void pr__part_pause(pr__engine_t *eng, part_t *part, int pause);
void pr__part_release(pr__engine_t *eng, part_t *part);
void pr__part_count(pr__engine_t *eng);
void pr__part_check_stalls(pr__engine_t *eng);
/* The tick: waiting events let go of their librdkafka messages, key
 * queues empty since the last tick go. */
void pr__part_tick_keys(pr__engine_t *eng);
/* The key's queue in `part`, created if `create`; NULL if absent or out
 * of memory. */
kq_t *pr__kq_get(part_t *part, const char *key, int create);
void pr__kq_remove(part_t *part, kq_t *kq);
/* Removes the queue if nothing keeps it: no event and not deferred. */
void pr__kq_trim(part_t *part, kq_t *kq);
/* Takes `inv` out of its key queue, wherever it is in it. */
void pr__kq_unlink(inv_t *inv);
/* Detaches a finished or released event from its key and partition;
 * returns the key's next event. */
inv_t *pr__kq_detach(inv_t *inv);

/* --- backpressure.c ---------------------------------------------------- */

/* How far a partition's committed offset may lag behind what it has
 * taken, in records, per max_uncommitted. */
#define PR_WINDOW_FACTOR 64
int pr__bp_over(int invs, size_t window, int max_uncommitted);
int pr__bp_under_half(int invs, size_t window, int max_uncommitted);
void pr__bp_check(pr__engine_t *eng, part_t *part);
/* A partition stopped this long is paused in librdkafka (backpressure.c). */
#define PR_BP_PAUSE_AFTER_NS 100000000LL
/* Pauses the partitions stopped for PR_BP_PAUSE_AFTER_NS, and resumes
 * again those released whose resume failed (engine tick). */
void pr__bp_tick(pr__engine_t *eng);

/* --- intake.c --------------------------------------------------------- */

/* Reads the consumer queue and every partition queue that is not stopped,
 * then delivers the mailbox, stores offsets and fires due timers. */
void pr__intake_poll(pr__engine_t *eng);
/* A new invocation of record `rkm` of `part` (which it then owns); NULL
 * when out of memory. Its offset is not taken. */
inv_t *pr__intake_inv(part_t *part, rd_kafka_message_t *rkm);

/* --- decode.c (the handler's thread) ----------------------------------- */

/* Sets inv->skip (and skip_warn) by pr__record_verdict(), after letting
 * go of its librdkafka message. */
void pr__decode_prepare(inv_t *inv);

/* --- record.c (no engine state; fuzzed by tests/fuzz/fuzz_record.c) --- */

/* Why a record with these bytes is skipped at intake (no key, a key that
 * is not UTF-8 text or holds a NUL byte, no payload unless `excise_ok`:
 * the handler takes excise records), or NULL. */
const char *pr__record_check(const void *key, size_t key_len,
                             const void *payload, int excise_ok);
/* A new invocation of a message of `part` from its parts (copied); a NULL
 * `payload` makes an excise record (payload pr__no_value, length 0). */
inv_t *pr__inv_message(part_t *part, const void *key, size_t key_len,
                       const void *payload, size_t len, int64_t offset,
                       int64_t timestamp);
/* Why message `m` is skipped before its handler (the payload is not JSON
 * (*warn set), `group_id`'s own output, a type allowed_events filters
 * out), or NULL. `json_state`: 1 or -1 when the payload was judged
 * already, else 0. Sets m->json when a filter needs the tree. */
const char *pr__record_verdict(prosody_message_t *m, int json_state,
                               const char *group_id, const pr__value_t *allowed,
                               int *warn);
/* Does `json` pass allowed_events (a list of type prefixes)? */
int pr__decode_allowed(const pr__value_t *allowed_events, json_t *json);

/* --- trace.c ---------------------------------------------------------- */

/* Starts the attempt's span (`receive` or `trigger`) when the client
 * exports spans, and sets the context its handler runs in (the thread
 * about to run the handler). */
void pr__trace_start(inv_t *inv);
/* Ends the attempt's span with its result (the completing thread). */
void pr__trace_end(inv_t *inv, prosody_result_t result, const char *error);
/* A `message.filtered` span for a record skipped before its handler. */
void pr__trace_filtered(inv_t *inv);
/* The context the running attempt's handler runs in (under the attempt's
 * context lock): 0, or -1 when there is none. */
int pr__trace_of(const inv_t *inv, pr_span_ctx_t *out);
void pr__trace_free(inv_t *inv);

/* --- dispatch.c ------------------------------------------------------- */

void pr__dispatch_enqueue(inv_t *inv);
void pr__dispatch_schedule(inv_t *inv);
void pr__dispatch_start_ready(pr__engine_t *eng);
void pr__dispatch_ready_remove(pr__engine_t *eng, part_t *part);
void pr__dispatch_cancel(inv_t *inv);
/* The scheduler's `urgent` callback. */
int pr__dispatch_urgent(const pr__sched_task_t *t);
/* Joins the deadline list (a claimed event that has just started). */
void pr__dispatch_time(inv_t *inv);
/* The run that ended with `inv` gives its unrun claimed events back to
 * their key queue (freed instead when the partition is released). */
void pr__dispatch_run_ended(inv_t *inv);

/* --- loader.c --------------------------------------------------------- */

/* A loader whose answers (pr__load_t letters) go to each request's
 * `answered` on the engine thread; NULL when it cannot start. Shared by
 * the defer layer and keyed state's message collections. */
pr__loader_t *pr__loader_new(pr__engine_t *eng, const char *bootstrap);
void pr__loader_post(pr__loader_t *l, pr__load_t *r);
void pr__loader_free(pr__loader_t *l);
void pr__load_free(pr__load_t *r);

/* --- metrics.c -------------------------------------------------------- */

void pr__metrics_init(pr__metrics_t *m);
void pr__metrics_fini(pr__metrics_t *m);
void pr__hist_observe(pr__hist_t *h, int64_t ns);
/* Refreshes the gauges' snapshot (engine thread, every poll_interval). */
void pr__metrics_snapshot(pr__engine_t *eng);

/* --- outcome.c -------------------------------------------------------- */

void pr__outcome_handler_done(inv_t *inv);
/* The letter of a completed attempt (`inv->mail`): pr__outcome_handler_done. */
void pr__outcome_mail(pr__mail_t *mail, void *owner);
inv_t *pr__outcome_finish_detach(inv_t *inv, int commit);
void pr__outcome_finish(inv_t *inv, int commit);
/* Counts and logs a duplicate about to be committed past (the dedup layer
 * found it at its key's head, or its worker did), as the other skips are
 * counted here. */
void pr__outcome_count_duplicate(inv_t *inv);
/* A handled event (success or permanent failure) whose keyed state is
 * stored: done with it (the layers' `done`, a fired timer's delete, the
 * offset). */
void pr__outcome_committed(inv_t *inv);
/* A handled event failed after all (its keyed state could not be stored):
 * the mode's layers decide again on `result` (`why`, copied, replaces its
 * error). */
void pr__outcome_fail(inv_t *inv, prosody_result_t result, const char *why);

/* --- state.c: keyed state ------------------------------------------------- */

typedef struct pr__stx pr__stx_t;
/* Fails a queued event transiently without running its handler (a layer
 * on the way in refused it): the mode's layers decide, as for a handler's
 * transient failure. */
void pr__outcome_reject(inv_t *inv, const char *why);
/* Runs the inv's handler again after `ms`. */
void pr__outcome_arm_retry(inv_t *inv, uint64_t ms);
/* An event's retry timer fired (first in its callback): from now on a
 * timer means a retry is pending (a drain keeps a send or delete in flight,
 * and releases one that waits for its retry). 1: the event was released
 * meanwhile (stopping, or its partition revoking) and is finished
 * uncommitted (redelivered, or fired again, later): do nothing more; 0:
 * retry it. */
int pr__outcome_retry_fired(inv_t *inv);
/* Full jitter: uniform in [0, min(2^n * retry_base, max_retry_delay)). */
uint64_t pr__outcome_backoff_ms(pr__engine_t *eng, int n);

/* --- monopoly.c ------------------------------------------------------- */

/* How many scheduler key states the monopolization layer keeps its handler
 * time in (monopolization_cache_size; 0 when the layer is off): the engine
 * sizes the scheduler's key table before the layer opens. */
size_t pr__mono_keys(const pr__settings_t *st, int mode);

/* --- deadletter.c ----------------------------------------------------- */

void pr__dlq_send(inv_t *inv);
void pr__dlq_done(inv_t *inv);

/* --- firing.c --------------------------------------------------------- */

pr__tseg_t pr__firing_seg(const char *topic, int32_t partition);
inv_t *pr__firing_find(part_t *part, const char *key, int64_t time_s);
void pr__firing_written(pr__engine_t *eng, part_t *part, const char *key,
                        int64_t time_s, const pr_span_ctx_t *trace);
void pr__firing_deleted(part_t *part, const char *key, int64_t time_s,
                        int64_t keep_s);
void pr__firing_arm(pr__engine_t *eng);
void pr__firing_due(pr__engine_t *eng);
/* A new firing event of (key, time) in `part`; NULL when out of memory. */
inv_t *pr__firing_inv(part_t *part, const char *key, int64_t time_s);
void pr__firing_assigned(pr__engine_t *eng, part_t *part);
void pr__firing_advance(pr__engine_t *eng);
void pr__firing_released(pr__engine_t *eng, part_t *part);

/* Retiring finished timer slabs (slabs.c; engine thread). */
typedef struct pr__slabrow pr__slabrow_t;
/* The listing found these slabs' rows. */
void pr__slabs_listed(part_t *part, const int64_t *slabs, size_t n);
/* The slab of `time_s` holds a timer the engine does not track: kept for
 * the assignment, or (`retry`, a deferred key's retry timer) while the
 * partition has deferred keys. */
void pr__slabs_pin(part_t *part, int64_t time_s, int retry);
/* A put of a timer at `time_s` was posted; its answer came (`part`: the
 * partition the caller found, or NULL; `gen`: the assignment the put was
 * posted in). A partition revoking or without timers never retires
 * again, so a caller that finds only those passes NULL. */
void pr__slabs_put(part_t *part, int64_t time_s);
void pr__slabs_put_done(part_t *part, uint64_t gen, int64_t time_s);
/* The engine lost track of a stored timer (out of memory): no slab of the
 * partition is retired for the rest of the assignment. */
void pr__slabs_untracked(part_t *part);
/* Retires the partition's finished slabs when it is time to look. */
void pr__slabs_tidy(pr__engine_t *eng, part_t *part, int64_t now_s);
void pr__slabs_free(part_t *part);

/* --- drain.c ---------------------------------------------------------- */

void pr__drain_release_idle(pr__engine_t *eng, part_t *only);
void pr__drain_wait(pr__engine_t *eng, int revoking_only);

/* --- rebalance.c ------------------------------------------------------ */

void pr__rebalance_cb(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                      rd_kafka_topic_partition_list_t *list, void *opaque);
/* Retries an assignment that did not fit in memory (loop tick). */
void pr__rebalance_retry(pr__engine_t *eng);
/* The broker refused our JoinGroup: the group's members use another
 * strategy or protocol. Asks the broker which (at most every 30 s) ... */
void pr__rebalance_mismatch(pr__engine_t *eng);
/* ... and, on the tick, reports the answer as an error naming both sides. */
void pr__rebalance_mismatch_poll(pr__engine_t *eng);
/* Frees what pr__rebalance_mismatch() holds (before the handle goes). */
void pr__rebalance_mismatch_free(pr__engine_t *eng);

#endif /* PR_ENGINE_INTERNAL_H */
