/*
 * firing.c - durable timers on the engine side: loading each partition's
 * slabs from the timer store, turning due timers into events in their
 * key's queue, and deleting them from the store once handled.
 *
 * Threads: the engine thread only (the store answers through the mailbox).
 */
#include <stdlib.h>
#include <string.h>

#include "defer.h"
#include "internal.h"

pr__tseg_t pr__firing_seg(const char *topic, int32_t partition) {
  pr__tseg_t g = {topic, partition};
  return g;
}

static void store_log_cb(void *arg, prosody_err_t err, const char *errstr) {
  if (err)
    PR_ERROR("timers", "%s: %s", (const char *)arg,
             errstr ? errstr : prosody_err_name(err));
}

/* The firing event of (key, time) in `part`, or NULL. */
inv_t *pr__firing_find(part_t *part, const char *key, int64_t time_s) {
  PR_ENGINE_THREAD(part->eng);
  kq_t *kq = pr__kq_get(part, key, 0);
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
static void timer_loaded(part_t *part, const char *key, int64_t time_s,
                         const pr_span_ctx_t *trace) {
  if (pr__firing_find(part, key, time_s))
    return;
  if (pr__tq_add_ctx(part->tq, key, time_s, trace) < 0) {
    PR_ERROR("timers", "out of memory loading a timer of %s[%d]", part->topic,
             part->partition);
    pr__slabs_untracked(part);
  }
}

/* A timer was written by a handler: queue it if its slab is loaded (or
 * loading); a firing one of the same second is rearmed (or undropped). */
void pr__firing_written(pr__engine_t *eng, part_t *part, const char *key,
                        int64_t time_s, const pr_span_ctx_t *trace) {
  PR_ENGINE_THREAD(eng);
  inv_t *f = pr__firing_find(part, key, time_s);
  if (f) {
    if (f->state == INV_QUEUED || f->state == INV_READY)
      f->dropped = 0;
    else
      f->rearmed = 1;
    return;
  }
  if (pr__slab_of(time_s, eng->slab_s) <= part->horizon)
    timer_loaded(part, key, time_s, trace);
}

/* Timers of `key` were deleted: (key, time_s), or all but `keep_s` when
 * `time_s` is -1. */
void pr__firing_deleted(part_t *part, const char *key, int64_t time_s,
                        int64_t keep_s) {
  PR_ENGINE_THREAD(part->eng);
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
  pr__layers_unscheduled(part, key, time_s); /* defer's queue */
  kq = pr__kq_get(part, key, 0);
  for (inv_t *i = kq ? kq->head : NULL; i; i = i->next) {
    if (!i->is_timer ||
        (time_s >= 0 ? i->time_s != time_s : i->time_s == keep_s))
      continue;
    if (i->state == INV_QUEUED || i->state == INV_READY) {
      i->dropped = 1;
    } else {
      i->rearmed = 0;
      i->df_gone = i->df_loaded;
    }
  }
}

/* The end hook: a timer event ends (pr__outcome_finish). A deferred
 * timer (df_loaded) is the defer layer's, which comes first. */
static int end(inv_t *inv, int commit) {
  PR_ENGINE_THREAD(inv->eng);
  pr__engine_t *eng = inv->eng;
  part_t *part = inv->part;
  pr__tseg_t seg;
  if (!inv->is_timer)
    return 0;
  seg = pr__firing_seg(part->topic, part->partition);
  if (!commit && eng->store && !inv->dropped && !part->revoking)
    pr__slabs_pin(part, inv->time_s, 0); /* still stored, not queued */
  if (!commit || !eng->store)
    return 1; /* aborted, or dropped (already deleted); or stopped: it
                 fires again on the next load */
  /* Rearmed: scheduled again while it fired, also once its delete was
   * posted (the put lands after the delete): it stays queued. */
  if (inv->rearmed) {
    if (!part->revoking && !part->zombie &&
        pr__tq_add(part->tq, inv->msg.key, inv->time_s) < 0) {
      PR_ERROR("timers", "out of memory re-queueing a timer of %s[%d]",
               part->topic, part->partition);
      pr__slabs_untracked(part);
    }
    return 1;
  }
  if (!inv->deleted)
    eng->store->ops->del(eng->store, &seg, inv->msg.key, inv->time_s,
                         PR_TIMER_APPLICATION, store_log_cb,
                         "could not delete a fired timer (it may fire again)");
  return 1;
}

static void firing_delete(inv_t *inv);
static void delete_again(uv_timer_t *t);

static void timer_deleted_cb(void *arg, prosody_err_t err, const char *errstr) {
  inv_t *inv = arg;
  pr__engine_t *eng = inv->eng;
  part_t *part = inv->part;
  char ev[160];
  part->active--;
  eng->dlq_inflight--;
  /* A failure that is not permanent (Cassandra down or slow) is retried
   * with backoff while the partition stays: a timer left stored would fire
   * again after the next assignment, although it succeeded. The key waits
   * meanwhile, so that its next event sees the timer gone. */
  if (err && err != PROSODY_ERR_PERMANENT && eng->phase == PH_RUNNING &&
      !part->revoking && !part->zombie) {
    if (inv->delete_failures++ % 10 == 0)
      PR_WARN("timers", "%s: could not delete the fired timer: %s; retrying",
              pr__inv_describe(inv, ev, sizeof(ev)),
              errstr ? errstr : prosody_err_name(err));
    /* Still INV_DLQ (firing_delete set it): delete_again deletes again.
     * Nothing after this call: with no memory for the timer it deletes at
     * once, and a store answering at once may finish (free) the event. */
    if (pr__inv_timer_start(inv,
                            pr__outcome_backoff_ms(eng, inv->delete_failures),
                            delete_again))
      firing_delete(inv);
    return;
  }
  if (err)
    PR_ERROR("timers",
             "%s: could not delete the fired timer (it may fire "
             "again): %s",
             pr__inv_describe(inv, ev, sizeof(ev)),
             errstr ? errstr : prosody_err_name(err));
  inv->deleted = 1;
  pr__outcome_finish(inv, 1);
}

static void delete_again(uv_timer_t *t) {
  inv_t *inv = t->data;
  if (!pr__outcome_retry_fired(inv)) /* released: it fires again on a load */
    firing_delete(inv);
}

/* A timer event is done: delete it from the store, then finish it, so the
 * key's next event sees it gone. Counted as active (a drain waits for it)
 * and as in flight (the engine is not freed under it). */
static void firing_delete(inv_t *inv) {
  PR_ENGINE_THREAD(inv->eng);
  pr__engine_t *eng = inv->eng;
  pr__tseg_t seg = pr__firing_seg(inv->part->topic, inv->part->partition);
  if (inv->rearmed) { /* a retry, and scheduled again since: a delete now
                         would land after that put */
    pr__outcome_finish(inv, 1);
    return;
  }
  inv->state = INV_DLQ;
  inv->part->active++;
  eng->dlq_inflight++;
  if (eng->timer_refuse > 0) { /* test option: as if the store refused */
    eng->timer_refuse--;
    timer_deleted_cb(inv, PROSODY_ERR_TRANSIENT,
                     "refused (test option timer_refuse_deletes)");
    return;
  }
  eng->store->ops->del(eng->store, &seg, inv->msg.key, inv->time_s,
                       PR_TIMER_APPLICATION, timer_deleted_cb, inv);
}

/* Room for another timer event in `part`: not while the partition is
 * stopped for backpressure (until it is released at half the limit), so
 * that due timers cannot keep its budget full and starve the messages
 * waiting in its queue. Every change of a partition's counts is followed
 * by pr__bp_check(), so `stopped` says whether it is at the limit.
 * Other partitions' timers fire meanwhile. */
static int timer_room(const part_t *part) { return !part->stopped; }

static void on_fire(uv_timer_t *t);

/* Arms the loop's timer for the earliest loaded timer of the partitions
 * with room. A stopped partition's timers wait for its release, which
 * reads the queues and calls pr__firing_due(). */
void pr__firing_arm(pr__engine_t *eng) {
  PR_ENGINE_THREAD(eng);
  int64_t next = -1, delay;
  if (eng->phase == PH_RUNNING)
    for (part_t *part = eng->parts; part; part = part->next) {
      int64_t t = part->tq && !part->revoking && timer_room(part) &&
                          !pr__df_listing(part)
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

inv_t *pr__firing_inv(part_t *part, const char *key, int64_t time_s) {
  PR_ENGINE_THREAD(part->eng);
  inv_t *inv = calloc(1, sizeof(*inv));
  if (!inv || !(inv->msg.key = strdup(key))) {
    free(inv);
    return NULL;
  }
  inv->eng = part->eng;
  inv->part = part;
  inv->is_timer = 1;
  inv->time_s = time_s;
  inv->msg.topic = part->topic;
  inv->msg.partition = part->partition;
  inv->msg.offset = -1;
  inv->msg.timestamp = time_s * 1000;
  inv->tmr.key = inv->msg.key;
  inv->tmr.time_ms = time_s * 1000;
  return inv;
}

/* Turns due timers into events, within max_uncommitted. */
void pr__firing_due(pr__engine_t *eng) {
  PR_ENGINE_THREAD(eng);
  int64_t now_s = pr__wall_ms() / 1000;
  if (eng->phase != PH_RUNNING)
    return;
  for (part_t *part = eng->parts; part; part = part->next) {
    char *key;
    int64_t t;
    pr_span_ctx_t trace;
    if (part->revoking || !part->tq || pr__df_listing(part))
      continue;
    while (timer_room(part) &&
           pr__tq_pop_due_ctx(part->tq, now_s, &key, &t, &trace) > 0) {
      inv_t *inv = pr__firing_inv(part, key, t);
      if (inv && trace.valid && (inv->tr = calloc(1, sizeof(*inv->tr))))
        inv->tr->from = trace; /* its span links back to it */
      if (!inv && pr__tq_add_ctx(part->tq, key, t, &trace) < 0) /* later */
        pr__slabs_untracked(part);
      free(key);
      if (!inv)
        break;
      PR_BUMP(eng->metrics.timers_fired, 1);
      pr__dispatch_enqueue(inv);
    }
  }
  pr__firing_arm(eng);
}

static void on_fire(uv_timer_t *t) { pr__firing_due(t->data); }

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
  part_t *part = pr__part_find(r->eng, r->topic, r->partition);
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

/* A listing or load of `part` (still this assignment) failed: its slabs
 * are listed and loaded again later, backing off from 1 s to 30 s, so that
 * stored timers, and the retry times of keys an earlier owner deferred,
 * still fire while we own it. Loading a slab again adds nothing twice. */
static void load_failed(part_t *part, const load_req_t *r, const char *what,
                        prosody_err_t err, const char *errstr) {
  int64_t delay_ms = 1000;
  for (int i = 0; i < part->relists && delay_ms < 30000; i++)
    delay_ms *= 2;
  if (delay_ms > 30000)
    delay_ms = 30000;
  part->relists++;
  if (!part->relist_ms)
    part->relist_ms = (pr__now_ns() / 1000000) + delay_ms;
  PR_ERROR("timers",
           "could not %s timers of %s[%d]: %s; trying again in %lld ms", what,
           r->topic, r->partition, errstr ? errstr : prosody_err_name(err),
           (long long)delay_ms);
}

static void slab_loaded(void *arg, prosody_err_t err, const char *errstr,
                        const pr__trec_t *recs, size_t n) {
  load_req_t *r = arg;
  pr__engine_t *eng = r->eng;
  part_t *part = load_part(r);
  if (err && part && !part->revoking)
    load_failed(part, r, "load", err, errstr);
  else if (err)
    PR_WARN("timers", "could not load timers of %s[%d] (no longer ours): %s",
            r->topic, r->partition, errstr ? errstr : prosody_err_name(err));
  else if (part && !part->revoking)
    for (size_t i = 0; i < n; i++) {
      /* Without on_timer the store is open only for deferral's retry
       * times: the group's application timers and deferred timers (other
       * members' or another implementation's) are left in it untouched,
       * never fired into a handler that cannot take them (and deleted). */
      /* What is left in the store untracked pins its slab (slabs.c). */
      if (!eng->handler.on_timer && recs[i].type != PR_TIMER_DEFER_MESSAGE)
        pr__slabs_pin(part, recs[i].time_s, 0);
      else if (recs[i].type == PR_TIMER_APPLICATION) {
        if (!deleted_meanwhile(part, recs[i].key, recs[i].time_s))
          timer_loaded(part, recs[i].key, recs[i].time_s, &recs[i].ctx);
      } else { /* a deferred key's (defer), or the original's type 3 */
        pr__slabs_pin(part, recs[i].time_s,
                      pr__layers_timer_loaded(part, recs[i].key, recs[i].type,
                                              recs[i].time_s));
      }
    }
  load_done(part);
  free(r);
  pr__firing_arm(eng);
}

/* Loads slab `slab` of `part` into its time queue. */
static void load_slab(pr__engine_t *eng, part_t *part, int64_t slab) {
  load_req_t *r = load_req(eng, part);
  pr__tseg_t seg = pr__firing_seg(part->topic, part->partition);
  if (!r) {
    PR_ERROR("timers", "out of memory loading timers of %s[%d]", part->topic,
             part->partition);
    pr__slabs_untracked(part);
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
  if (err && part && !part->revoking)
    load_failed(part, r, "list the", err, errstr);
  else if (err)
    PR_WARN("timers",
            "could not list the timers of %s[%d] (no longer ours): %s",
            r->topic, r->partition, errstr ? errstr : prosody_err_name(err));
  else if (part && !part->revoking) {
    part->relists = 0;
    pr__slabs_listed(part, slabs, n);
    for (size_t i = 0; i < n; i++) /* oldest first: overdue ones fire now */
      if (slabs[i] <= part->horizon)
        load_slab(eng, part, slabs[i]);
  }
  load_done(part);
  free(r);
}

/* A partition was assigned: load every stored slab up to the horizon. */
void pr__firing_assigned(pr__engine_t *eng, part_t *part) {
  PR_ENGINE_THREAD(eng);
  int64_t jitter = eng->slab_s / 10 + 1;
  pr__tseg_t seg = pr__firing_seg(part->topic, part->partition);
  load_req_t *r;
  part->gen = ++eng->part_gen;
  part->wm_raised = -1;
  part->preload_s = eng->slab_s / 2 + (int64_t)(rand_r(&eng->seed) % jitter);
  part->horizon =
      pr__slab_of(pr__wall_ms() / 1000 + part->preload_s, eng->slab_s);
  if (!(r = load_req(eng, part))) {
    PR_ERROR("timers", "out of memory: timers of %s[%d] will not fire",
             part->topic, part->partition);
    part->horizon = -1;
    return;
  }
  part->relist_ms = 0;
  part->relists = 0;
  part->loads++; /* the listing counts as a load */
  eng->store->ops->slabs(eng->store, &seg, eng->slab_s, slabs_listed, r);
}

/* Lists and loads `part`'s slabs again after a failure (loop tick). */
static void relist(pr__engine_t *eng, part_t *part) {
  pr__tseg_t seg = pr__firing_seg(part->topic, part->partition);
  load_req_t *r = load_req(eng, part);
  part->relist_ms = 0;
  if (!r) {
    pr__slabs_untracked(part); /* what the failed load held is unknown */
    return;
  }
  part->loads++;
  eng->store->ops->slabs(eng->store, &seg, eng->slab_s, slabs_listed, r);
}

/* Loads the slabs that came within the preload window (loop tick). */
void pr__firing_advance(pr__engine_t *eng) {
  PR_ENGINE_THREAD(eng);
  int64_t now_s = pr__wall_ms() / 1000;
  for (part_t *part = eng->parts; part; part = part->next) {
    int64_t target;
    if (!part->tq || part->revoking || part->horizon < 0)
      continue;
    if (part->relist_ms && (pr__now_ns() / 1000000) >= part->relist_ms)
      relist(eng, part);
    target = pr__slab_of(now_s + part->preload_s, eng->slab_s);
    while (part->horizon < target)
      load_slab(eng, part, ++part->horizon);
    pr__slabs_tidy(eng, part, now_s);
  }
}

/* A partition leaves: drop its loaded timers; the store decides what it
 * keeps (the memory store forgets them). */
void pr__firing_released(pr__engine_t *eng, part_t *part) {
  PR_ENGINE_THREAD(eng);
  pr__tseg_t seg = pr__firing_seg(part->topic, part->partition);
  pr__tq_free(part->tq);
  part->tq = NULL;
  eng->store->ops->release(eng->store, &seg);
}

/* The commit hook: a fired timer (not a deferred one, which is defer's;
 * not one scheduled again while it ran, which stays stored) is committed
 * by deleting it from the store; it finishes once the store has. */
static int commit(inv_t *inv) {
  if (!inv->is_timer || inv->rearmed || !inv->eng->store || inv->df_loaded)
    return 0;
  firing_delete(inv);
  return 1;
}

/* Durable timers' side of the engine as a layer, in every mode's table
 * (after defer, whose deferred timers are its own). */
const pr__layer_t pr__layer_timers = {
    .name = "timers", .commit = commit, .end = end};
