/*
 * defer.c - deferred retry (pipeline mode, messages): deferring. A message
 * that fails transiently, while the recent failure rate is at most
 * defer_failure_threshold, leaves its partition's commit path: its offset
 * joins its key's defer queue in the store, and it is committed once that
 * is written. While a key has deferred messages, its later messages join the
 * queue behind them, so the key's order holds while the partition moves on.
 * The key's retry time lives with it in the store, and as a retry timer in
 * the timer store; when it comes, defer_retry.c retries the head of its
 * queue. A retried entry that fails transiently again is written back here:
 * it waits a uniform whole number of seconds in
 * [1, max(1, min(defer_base * 2^(n-1), defer_max_delay))] for its n-th
 * retry. Above the threshold, a failure is not deferred: the retry layer
 * outside retries it in place, which holds the partition (backpressure)
 * until the storm passes.
 *
 * A key deferred by an earlier owner (ours or the original: the stores
 * share its tables) keeps its order: the memory store lists a partition's
 * deferred keys when it is assigned (its records wait until then;
 * defer_retry.c reads the list); with Cassandra's, whose layout lists none,
 * a key's first event of a kind asks the store (through the head cache)
 * before it runs, and the keys' retry timers (types deferred message and
 * deferred timer, in the timer store) name them as the partition's timers
 * are loaded.
 *
 * Threads: the engine thread only (the Cassandra store answers through the
 * mailbox; the memory store answers at once).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dedup.h"
#include "defer.h"

/* A segment is one group's topic partition, named as the original names
 * it (its id in Cassandra is derived from the name). */
void pr__df_segment(const part_t *part, char *buf, size_t n) {
  PR_ENGINE_THREAD(part->eng);
  snprintf(buf, n, "%s/%" PRId32 ":%s", part->topic, part->partition,
           part->eng->group_id);
}

/* ---- deferred keys ------------------------------------------------------- */

pr__dk_t *pr__df_dk_new(part_t *part, kq_t *kq, int kind, int64_t retry_at_ms) {
  PR_ENGINE_THREAD(part->eng);
  pr__dk_t *dk = calloc(1, sizeof(*dk));
  if (!dk)
    return NULL;
  dk->kq = kq;
  dk->kind = kind;
  dk->retry_at_ms = retry_at_ms;
  DFK(kq)->dk[kind] = dk;
  dk->next = DFP(part)->dks;
  DFP(part)->dks = dk;
  return dk;
}

static void dk_free(part_t *part, pr__dk_t *dk) {
  pr__dk_t **pp = &DFP(part)->dks;
  while (*pp && *pp != dk)
    pp = &(*pp)->next;
  if (*pp)
    *pp = dk->next;
  DFK(dk->kq)->dk[dk->kind] = NULL;
  pr__kq_trim(part, dk->kq);
  free(dk);
}

void pr__df_part_free(part_t *part) {
  PR_ENGINE_THREAD(part->eng);
  pr__dk_t *dk, *next;
  for (dk = DFP(part)->dks; dk; dk = next) {
    next = dk->next;
    DFK(dk->kq)->dk[dk->kind] = NULL;
    free(dk);
  }
  DFP(part)->dks = NULL;
}

pr__load_t *pr__df_req_new(const part_t *part, const char *key, int kind) {
  PR_ENGINE_THREAD(part->eng);
  size_t tl = strlen(part->topic) + 1, kl = strlen(key) + 1;
  pr__load_t *r = calloc(1, sizeof(*r) + tl + kl);
  if (!r)
    return NULL;
  r->eng = part->eng;
  r->gen = part->gen;
  r->kind = kind;
  r->partition = part->partition;
  r->topic = (char *)(r + 1);
  memcpy(r->topic, part->topic, tl);
  r->key = r->topic + tl;
  memcpy(r->key, key, kl);
  return r;
}

/* The assignment a request was made for, if it is still live. */
part_t *pr__df_req_part(const pr__load_t *r) {
  PR_ENGINE_THREAD(r->eng);
  part_t *part = pr__part_find(r->eng, r->topic, r->partition);
  return part && part->gen == r->gen && !part->revoking &&
                 r->eng->phase == PH_RUNNING
             ? part
             : NULL;
}

pr__dk_t *pr__df_req_dk(const pr__load_t *r, part_t **partp) {
  PR_ENGINE_THREAD(r->eng);
  part_t *part = pr__df_req_part(r);
  kq_t *kq = part ? pr__kq_get(part, r->key, 0) : NULL;
  *partp = part;
  return kq ? DFK(kq)->dk[r->kind] : NULL;
}

static void log_cb(void *arg, prosody_err_t err, const char *errstr) {
  pr__load_t *r = arg;
  if (err)
    PR_WARN("defer", "%s[%" PRId32 "] key \"%.64s\": %s: %s", r->topic,
            r->partition, r->key, r->error ? r->error : "store",
            errstr ? errstr : prosody_err_name(err));
  pr__load_free(r);
}

/* ---- the retry timers ------------------------------------------------------
 * A deferred key's retry time is a timer of the original's type 1
 * (deferred message) or 2 (deferred timer) in the timer store, one per
 * key and type, as the original keeps it: either implementation taking the
 * partition over finds it when it loads the partition's timers
 * (pr__df_timer_loaded). The deferral store keeps it too (the memory store
 * lists its keys at assignment; Cassandra's has nowhere to). */

static void timer_log_cb(void *arg, prosody_err_t err, const char *errstr) {
  (void)arg;
  if (err)
    PR_WARN("defer", "could not delete a deferred key's retry timer: %s",
            errstr ? errstr : prosody_err_name(err));
}

/* A retry timer's write; once it is stored, the key's other retry timers
 * are deleted. Not both at once: the deletion could land and the write
 * fail, leaving the key with no retry timer, and a later owner would not
 * know it is deferred until a new record of it came. */
typedef struct retry_put {
  pr__engine_t *eng;
  pr__timer_type_t type;
  uint64_t gen; /* the partition's assignment */
  int64_t at_s;
  int32_t partition;
  pr__tstore_done_cb cb;
  void *arg;
  char *topic, *key; /* in the same allocation */
} retry_put_t;

static void retry_put_done(void *arg, prosody_err_t err, const char *errstr) {
  retry_put_t *p = arg;
  pr__tstore_t *ts = p->eng->store;
  pr__slabs_put_done(pr__part_find(p->eng, p->topic, p->partition), p->gen,
                     p->at_s);
  if (!err && p->eng->phase == PH_RUNNING) {
    pr__tseg_t seg = {p->topic, p->partition};
    ts->ops->del_key(ts, &seg, p->key, p->type, p->at_s, timer_log_cb, NULL);
  }
  p->cb(p->arg, err, errstr);
  free(p);
}

/* Writes the key's retry timer at `at_s`, deleting its others, or (at_s
 * -1) deletes them all; `cb` has the write's answer. */
static void retry_timer(part_t *part, const char *key, int kind, int64_t at_s,
                        pr__store_done_cb cb, void *arg) {
  pr__tstore_t *ts = part->eng->store;
  pr__tseg_t seg = pr__firing_seg(part->topic, part->partition);
  pr__timer_type_t type =
      kind == PR_DEFER_TIMERS ? PR_TIMER_DEFER_TIMER : PR_TIMER_DEFER_MESSAGE;
  if (!ts) {
    cb(arg, PROSODY_OK, NULL);
    return;
  }
  if (at_s < 0) {
    ts->ops->del_key(ts, &seg, key, type, -1, cb, arg);
    return;
  }
  if (at_s > PR_TIMER_MAX_S)
    at_s = PR_TIMER_MAX_S;
  {
    size_t tl = strlen(part->topic) + 1, kl = strlen(key) + 1;
    retry_put_t *p = malloc(sizeof(*p) + tl + kl);
    if (!p) {
      cb(arg, PROSODY_ERR_NOMEM, "out of memory");
      return;
    }
    p->eng = part->eng;
    p->type = type;
    p->at_s = at_s;
    p->partition = part->partition;
    p->cb = cb;
    p->arg = arg;
    p->topic = (char *)(p + 1);
    p->key = p->topic + tl;
    memcpy(p->topic, part->topic, tl);
    memcpy(p->key, key, kl);
    p->gen = part->gen;
    pr__slabs_put(part, at_s);
    pr__slabs_pin(part, at_s, 1);
    ts->ops->put(ts, &seg, key, at_s, type, NULL, retry_put_done, p);
  }
}

/* A key whose queue defer_retry.c found empty is not deferred any more. */
void pr__df_forget(part_t *part, pr__dk_t *dk, pr__load_t *r) {
  PR_ENGINE_THREAD(part->eng);
  char seg[PR_DF_SEG_MAX];
  PR_INFO("defer",
          "%s[%" PRId32 "] key \"%.64s\": no deferred %s left; the key "
          "is not deferred for them any more",
          r->topic, r->partition, r->key,
          r->kind == PR_DEFER_TIMERS ? "timer" : "message");
  pr__df_segment(part, seg, sizeof(seg));
  r->error = strdup("forgetting the deferred key");
  retry_timer(part, r->key, r->kind, -1, timer_log_cb, NULL);
  dk_free(part, dk);
  pr__defer_del_key(pr__df_store(part->eng, r->kind), seg, r->key, log_cb, r);
}

/* ---- deferring a message --------------------------------------------------
 */

/* The message's writes are over (or abandoned): it leaves the deferring
 * state, committed when `commit`. */
static void leave(inv_t *inv, int commit) {
  kq_t *kq = pr__kq_get(inv->part, inv->msg.key, 0);
  pr__dk_t *dk = kq ? DFK(kq)->dk[PR_DF_KIND(inv)] : NULL;
  if (dk) {
    dk->writes--;
    if (DFX(inv)->prev)
      DFX(DFX(inv)->prev)->next = DFX(inv)->next;
    else if (dk->deferring == inv)
      dk->deferring = DFX(inv)->next;
    if (DFX(inv)->next)
      DFX(DFX(inv)->next)->prev = DFX(inv)->prev;
    DFX(inv)->prev = DFX(inv)->next = NULL;
  }
  inv->part->active--;
  inv->eng->dlq_inflight--;
  pr__outcome_finish(inv, commit);
}

/* Leaves with `commit`; the first event of a newly deferred key takes the
 * events held for its key row along. They leave first: while `inv` is
 * still counted, the partition (a zombie's too) and the key stay. */
static void leave_all(inv_t *inv, int commit) {
  kq_t *kq = DFX(inv)->key_at ? pr__kq_get(inv->part, inv->msg.key, 0) : NULL;
  pr__dk_t *dk = kq ? DFK(kq)->dk[PR_DF_KIND(inv)] : NULL;
  if (dk) {
    if (commit)
      dk->row_written = 1;
    for (inv_t *h = dk->deferring, *next; h; h = next) {
      next = DFX(h)->next; /* leave() unlinks it */
      if (DFX(h)->held)
        leave(h, commit);
    }
  }
  leave(inv, commit); /* frees inv */
}

static void write_again(uv_timer_t *t);

static void written(void *arg, prosody_err_t err, const char *errstr) {
  inv_t *inv = arg;
  char ev[160];
  if (err) {
    DFX(inv)->failed = 1;
    PR_WARN("defer",
            "%s: could not write it to its key's defer queue: %s; trying "
            "again (it is not committed meanwhile)",
            pr__inv_describe(inv, ev, sizeof(ev)),
            errstr ? errstr : prosody_err_name(err));
  }
  if (--DFX(inv)->writes > 0)
    return;
  if (!DFX(inv)->failed) {
    kq_t *kq = pr__kq_get(inv->part, inv->msg.key, 0);
    pr__dk_t *dk = kq ? DFK(kq)->dk[PR_DF_KIND(inv)] : NULL;
    if (!DFX(inv)->key_at && dk && !dk->row_written) {
      DFX(inv)->held = 1; /* committed with the key's first event */
      return;
    }
    leave_all(inv, 1);
    return;
  }
  DFX(inv)->failed = 0;
  if (inv->part->revoking || inv->part->zombie ||
      inv->eng->phase != PH_RUNNING) {
    leave_all(inv, 0); /* not committed: redelivered to the next owner */
    return;
  }
  if (pr__inv_timer_start(inv, pr__outcome_backoff_ms(inv->eng, 1) + 100,
                          write_again))
    pr__df_write(inv); /* no timer: at once */
}

static void write_again(uv_timer_t *t) {
  inv_t *inv = t->data;
  pr__inv_timer_close(&inv->timer); /* a timer means a retry is pending */
  pr__df_write(inv);                /* gives up itself when released */
}

void pr__df_write(inv_t *inv) {
  PR_ENGINE_THREAD(inv->eng);
  pr__engine_t *eng = inv->eng;
  part_t *part = inv->part;
  char seg[PR_DF_SEG_MAX];
  int64_t key_at = DFX(inv)->key_at;
  int kind = PR_DF_KIND(inv);
  pr__defer_t *store = pr__df_store(eng, kind);
  kq_t *kq = pr__kq_get(part, inv->msg.key, 0);
  int64_t position = inv->is_timer ? inv->time_s : inv->msg.offset;
  if (!store || part->revoking || part->zombie || eng->phase != PH_RUNNING) {
    leave_all(inv, 0);
    return;
  }
  if (kq && DFK(kq)->dk[kind])
    DFK(kq)->dk[kind]->appended = 1;
  pr__df_segment(part, seg, sizeof(seg));
  DFX(inv)->writes = key_at ? 2 : 1;
  DFX(inv)->failed = 0;
  if (key_at) { /* first: the memory store answers at once */
    /* The key was not deferred: whatever the store holds below it was
     * left by a deferral whose key row was never written, and its events
     * were handled since (redelivered uncommitted). */
    DFX(inv)->writes++;
    pr__defer_trim(store, seg, inv->msg.key, position, written, inv);
    if (pr__df_refuse_row(eng)) { /* test option */
      written(inv, PROSODY_ERR_TRANSIENT, "refused (test option)");
    } else {
      DFX(inv)->writes++; /* the retry timer too */
      retry_timer(part, inv->msg.key, kind, (key_at + 999) / 1000, written,
                  inv);
      pr__defer_set_key(store, seg, inv->msg.key, (key_at + 999) / 1000,
                        written, inv);
    }
  }
  /* The last write may finish (and free) inv. */
  pr__defer_append(store, seg, inv->msg.key, position, DFX(inv)->retries,
                   written, inv);
}

void pr__df_release_waiting(part_t *part) {
  PR_ENGINE_THREAD(part->eng);
  for (pr__dk_t *dk = DFP(part)->dks; dk; dk = dk->next)
    for (inv_t *inv = dk->deferring, *next; inv; inv = next) {
      next = DFX(inv)->next;       /* leave() unlinks it */
      if (DFX(inv)->writes == 0) { /* its retry timer is armed, or held */
        pr__inv_timer_close(&inv->timer);
        leave(inv, 0);
      }
    }
}

void pr__df_unscheduled(part_t *part, const char *key, int64_t time_s) {
  PR_ENGINE_THREAD(part->eng);
  pr__engine_t *eng = part->eng;
  pr__defer_t *store = pr__df_store(eng, PR_DEFER_TIMERS);
  kq_t *kq = pr__kq_get(part, key, 0);
  pr__load_t *r;
  char seg[PR_DF_SEG_MAX];
  if (!store || !kq || !DFK(kq)->dk[PR_DEFER_TIMERS] ||
      !(r = pr__df_req_new(part, key, PR_DEFER_TIMERS)))
    return;
  r->error = strdup("removing an unscheduled timer from its defer queue (it "
                    "may still fire)");
  pr__df_segment(part, seg, sizeof(seg));
  if (time_s >= 0)
    pr__defer_advance(store, seg, key, time_s, log_cb, r);
  else
    pr__defer_trim(store, seg, key, INT64_MAX, log_cb, r);
}

/* Takes `inv` out of its key queue into the deferring state; `key_at_ms`
 * (else 0): the key's row is written too, retrying then. */
static void defer_inv(inv_t *inv, pr__dk_t *dk, int32_t retries,
                      int64_t key_at_ms) {
  if (inv->is_timer && !inv->df_loaded) /* stored until it is written */
    pr__slabs_pin(inv->part, inv->time_s, 0);
  pr__kq_unlink(inv);
  inv->state = INV_DEFERRING;
  DFX(inv)->retries = retries;
  DFX(inv)->key_at = key_at_ms;
  inv->part->active++;
  inv->eng->dlq_inflight++;
  dk->writes++;
  DFX(inv)->prev = NULL;
  DFX(inv)->next = dk->deferring;
  if (dk->deferring)
    DFX(dk->deferring)->prev = inv;
  dk->deferring = inv;
  PR_BUMP(inv->eng->metrics.deferred, 1);
  pr__inv_release_rkm(inv);
  pr__dm_put(inv);
  pr__df_write(inv);
}

int pr__df_hold(inv_t *inv) {
  PR_ENGINE_THREAD(inv->eng);
  pr__dk_t *dk = DFK(inv->kq)->dk[PR_DF_KIND(inv)];
  if (!dk || inv->df_loaded)
    return 0;
  inv->kq = NULL; /* never in the key queue */
  defer_inv(inv, dk, 0, 0);
  return 1;
}

/* A loaded message failed again: its retry count and the key's retry time
 * are written, and it goes (its offset was committed long ago). */
static void rescheduled(void *arg, prosody_err_t err, const char *errstr) {
  pr__load_t *r = arg;
  part_t *part;
  pr__dk_t *dk;
  if (err && !r->err) {
    r->err = err;
    PR_WARN("defer",
            "%s[%" PRId32 "] key \"%.64s\": could not store its next retry: "
            "%s",
            r->topic, r->partition, r->key,
            errstr ? errstr : prosody_err_name(err));
  }
  if (--r->pending > 0)
    return;
  if ((dk = pr__df_req_dk(r, &part)))
    dk->busy = 0;
  pr__load_free(r);
}

static void retry_later(inv_t *inv) {
  pr__engine_t *eng = inv->eng;
  kq_t *kq = inv->kq;
  int kind = PR_DF_KIND(inv);
  pr__dk_t *dk = kq ? DFK(kq)->dk[kind] : NULL;
  int32_t n = DFX(inv)->retries + 1;
  int64_t delay = pr__df_delay_s(eng, n);
  int64_t at_ms = pr__wall_ms() + delay * 1000;
  char seg[PR_DF_SEG_MAX], ev[160];
  pr__load_t *r;
  if (!pr__df_store(eng, kind)) { /* closed: the entry stays for the next
                                     owner */
    pr__outcome_finish(inv, 0);
    return;
  }
  if (inv->df_gone) {
    /* Unscheduled while it ran: its entry was removed then, and writing
     * its retry count would bring it back (an UPDATE makes the row). It
     * ends as a dropped timer does: the queue moves on. */
    PR_INFO("defer",
            "%s: deferred retry %d failed after the timer was unscheduled; "
            "not retried",
            pr__inv_describe(inv, ev, sizeof(ev)), (int)DFX(inv)->retries);
    pr__outcome_finish(inv, 1);
    return;
  }
  r = dk ? pr__df_req_new(inv->part, kq->key, kind) : NULL;
  PR_WARN("defer", "%s: deferred retry %d failed: %s; next retry in %llds",
          pr__inv_describe(inv, ev, sizeof(ev)), (int)DFX(inv)->retries,
          inv->result_error ? inv->result_error : "(no message)",
          (long long)delay);
  inv->df_loaded = 0; /* what follows is this function's */
  if (dk) {
    dk->busy = 1;
    dk->retry_at_ms = at_ms;
  }
  if (r) {
    pr__df_segment(inv->part, seg, sizeof(seg));
    r->pending = 3;
    retry_timer(inv->part, kq->key, kind, (at_ms + 999) / 1000, rescheduled, r);
    pr__defer_set_retries(pr__df_store(eng, kind), seg, kq->key, dk->position,
                          n, rescheduled, r);
    pr__defer_set_key(pr__df_store(eng, kind), seg, kq->key,
                      (at_ms + 999) / 1000, rescheduled, r);
  } else if (dk) {
    dk->busy = 0; /* out of memory: retried as stored */
  }
  pr__outcome_finish(inv, 0);
}

/* Defers the key's queued events of `kind` (not started) from `j` on
 * behind `dk`. */
static void defer_queued(pr__dk_t *dk, int kind, inv_t *j) {
  for (inv_t *jn; j; j = jn) {
    jn = j->next;
    if (PR_DF_KIND(j) != kind || j->state != INV_QUEUED || j->df_loaded)
      continue;
    if (j->is_timer && j->dropped) { /* unscheduled: nothing to defer */
      pr__kq_unlink(j);
      pr__outcome_finish_detach(j, 0);
      continue;
    }
    /* A head waiting for its dedup lookup is not scheduled by the answer
     * any more: it is deferred (its retry is looked up again). */
    pr__dd_unwait(j);
    defer_inv(j, dk, 0, 0);
  }
}

/* An event (of the other kind) left at the key's head may start now. */
static void start_head(part_t *part, kq_t *kq) {
  if (kq->head && kq->head->state == INV_QUEUED && !part->held &&
      !part->revoking && part->eng->phase == PH_RUNNING)
    pr__dispatch_schedule(kq->head);
}

/* The key's queued events of `kind` join `dk`; the others go on. */
static void take_queued(part_t *part, kq_t *kq, pr__dk_t *dk, int kind) {
  defer_queued(dk, kind, kq->head);
  start_head(part, kq);
}

void pr__df_defer(inv_t *inv) {
  PR_ENGINE_THREAD(inv->eng);
  pr__engine_t *eng = inv->eng;
  part_t *part = inv->part;
  kq_t *kq = inv->kq;
  int kind = PR_DF_KIND(inv);
  pr__dk_t *dk = DFK(kq)->dk[kind];
  int64_t delay, key_at = 0;
  char ev[160];
  if (inv->df_loaded) {
    retry_later(inv);
    return;
  }
  delay = pr__df_delay_s(eng, 1);
  if (!dk) {
    key_at = pr__wall_ms() + delay * 1000;
    if (!(dk = pr__df_dk_new(part, kq, kind, key_at))) { /* out of memory */
      inv->state = INV_RETRY_WAIT;
      pr__outcome_arm_retry(inv, pr__outcome_backoff_ms(eng, inv->attempt));
      return;
    }
    dk->busy = 0;
  }
  PR_WARN("defer",
          "%s: transient handler failure (attempt %d): %s; deferring it and "
          "the key's later %s (retry in %llds)",
          pr__inv_describe(inv, ev, sizeof(ev)), inv->attempt,
          inv->result_error ? inv->result_error : "(no message)",
          inv->is_timer ? "timers" : "messages", (long long)delay);
  /* The key's queued events of its kind follow it; the others stay. */
  defer_queued(dk, kind, inv->next);
  defer_inv(inv, dk, 1, key_at);
  if ((kq = pr__kq_get(part, kq->key, 0)))
    start_head(part, kq);
}

/* ---- is a key deferred? ---------------------------------------------------
 * A key is deferred while its queue in the store is not empty; nothing
 * lists a segment's deferred keys in the original's layout. So before a
 * key's first event of a kind runs (the key's queue in memory is new), the
 * store is asked for the key's head, which the head cache
 * (defer_store_cache_size) answers at once for a key it knows, deferred or
 * not. Meanwhile the event waits at the head of its key; a key found
 * deferred (by an earlier owner, ours or the original) takes its queued
 * events of the kind into its queue, and its head is retried at once. A
 * retry timer loaded from the timer store says the same. A failed read
 * holds a message (asked again every second by defer_retry.c's tick, as a
 * failed dedup lookup holds it) but not a timer: timers keep firing while
 * Cassandra is down. */

/* `key` of `part` is deferred: its dk (retried at `at_ms`), or NULL when
 * out of memory. */
static pr__dk_t *dk_found(part_t *part, kq_t *kq, int kind, int64_t at_ms) {
  pr__dk_t *dk = DFK(kq)->dk[kind];
  if (dk)
    return dk;
  if (!(dk = pr__df_dk_new(part, kq, kind, at_ms)))
    return NULL;
  dk->row_written = 1;
  DFK(kq)->known[kind] = PR_DF_KNOWN;
  PR_INFO("defer",
          "%s[%" PRId32 "] key \"%.64s\": has deferred %s in the store (an "
          "earlier owner's); its later ones join them",
          part->topic, part->partition, kq->key,
          kind == PR_DEFER_TIMERS ? "timers" : "messages");
  return dk;
}

/* The store's answer to "is the key deferred?". r->pending is 1 while
 * pr__df_admit() waits in the call (an answer at once: left to it). */
static void asked(void *arg, prosody_err_t err, const char *errstr, int found,
                  int64_t position, int32_t retries) {
  pr__load_t *r = arg;
  part_t *part = pr__df_req_part(r);
  kq_t *kq = part ? pr__kq_get(part, r->key, 0) : NULL;
  int kind = r->kind;
  (void)position;
  (void)retries;
  if (!kq || DFK(kq)->known[kind] != PR_DF_ASKING) {
    if (r->pending == 1)
      r->pending = 2;
    else
      pr__load_free(r);
    return;
  }
  if (!err && found && !dk_found(part, kq, kind, pr__wall_ms())) {
    err = PROSODY_ERR_NOMEM;
    errstr = "out of memory";
  }
  if (err && kind == PR_DEFER_TIMERS) {
    /* Timers keep firing while the store cannot be read (no dedup lookup
     * holds them either); the price: a timer of a key whose earlier timers
     * another owner deferred may run before them meanwhile. */
    PR_WARN("defer",
            "%s[%" PRId32 "]: could not read whether a key's timers are "
            "deferred: %s; its timer runs",
            part->topic, part->partition,
            errstr ? errstr : prosody_err_name(err));
    err = PROSODY_OK;
  }
  if (err) {
    DFK(kq)->known[kind] = PR_DF_UNKNOWN;
    DFP(part)->ask_ms = pr__wall_ms() + 1000;
    PR_WARN("defer",
            "%s[%" PRId32 "] key \"%.64s\": could not read whether it is "
            "deferred: %s; its events wait (asking again in 1s)",
            part->topic, part->partition, r->key,
            errstr ? errstr : prosody_err_name(err));
  } else {
    DFK(kq)->known[kind] = PR_DF_KNOWN;
  }
  if (r->pending == 1) {
    r->pending = 2;
    return;
  }
  pr__load_free(r);
  if (err)
    return;
  if (DFK(kq)->dk[kind])
    take_queued(part, kq, DFK(kq)->dk[kind], kind);
  else
    start_head(part, kq);
}

int pr__df_admit(inv_t *inv) {
  PR_ENGINE_THREAD(inv->eng);
  pr__engine_t *eng = inv->eng;
  part_t *part = inv->part;
  kq_t *kq = inv->kq;
  int kind = PR_DF_KIND(inv);
  pr__load_t *r;
  char seg[PR_DF_SEG_MAX];
  if (!pr__df_store(eng, kind) || inv->df_loaded || !kq)
    return PR_ADMIT_RUN;
  if (DFK(kq)->dk[kind]) { /* found deferred since it was queued */
    take_queued(part, kq, DFK(kq)->dk[kind], kind);
    return PR_ADMIT_TAKEN;
  }
  if (DFK(kq)->known[kind] == PR_DF_KNOWN)
    return PR_ADMIT_RUN;
  if (DFK(kq)->known[kind] == PR_DF_ASKING || DFP(part)->ask_ms > pr__wall_ms())
    return PR_ADMIT_WAIT; /* the answer, or the tick, schedules it */
  if (!(r = pr__df_req_new(part, kq->key, kind))) {
    DFP(part)->ask_ms = pr__wall_ms() + 1000;
    return PR_ADMIT_WAIT;
  }
  DFK(kq)->known[kind] = PR_DF_ASKING;
  r->pending = 1;
  pr__df_segment(part, seg, sizeof(seg));
  pr__defer_head(pr__df_store(eng, kind), seg, kq->key, asked, r);
  if (r->pending == 1) { /* the answer comes later */
    r->pending = 0;
    return PR_ADMIT_WAIT;
  }
  pr__load_free(r); /* answered at once */
  if (DFK(kq)->known[kind] != PR_DF_KNOWN)
    return PR_ADMIT_WAIT;
  if (DFK(kq)->dk[kind]) {
    take_queued(part, kq, DFK(kq)->dk[kind], kind);
    return PR_ADMIT_TAKEN;
  }
  return PR_ADMIT_RUN;
}

int pr__df_timer_loaded(part_t *part, const char *key, int type,
                        int64_t time_s) {
  PR_ENGINE_THREAD(part->eng);
  int kind = type == PR_TIMER_DEFER_TIMER ? PR_DEFER_TIMERS : PR_DEFER_MESSAGES;
  kq_t *kq;
  pr__dk_t *dk;
  if ((type != PR_TIMER_DEFER_MESSAGE && type != PR_TIMER_DEFER_TIMER) ||
      !pr__df_store(part->eng, kind))
    return 0;
  if (!(kq = pr__kq_get(part, key, 1)))
    return 0; /* out of memory: read again at the next assignment */
  if ((dk = DFK(kq)->dk[kind])) {
    if (!dk->busy && time_s * 1000 < dk->retry_at_ms)
      dk->retry_at_ms = time_s * 1000;
    return 1;
  }
  if ((dk = dk_found(part, kq, kind, time_s * 1000)))
    take_queued(part, kq, dk, kind);
  else
    pr__kq_trim(part, kq);
  return 1;
}
