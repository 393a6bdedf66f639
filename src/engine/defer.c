/*
 * defer.c - deferred retry (pipeline mode, messages): a message that fails
 * transiently, while the recent failure rate is at most
 * defer_failure_threshold, leaves its partition's commit path: its offset
 * joins its key's defer queue in the store, and it is committed once that
 * is written. While a key has deferred messages, its later messages join the
 * queue behind them, so the key's order holds while the partition moves on.
 * The key's retry time lives with it in the store; when it comes, the head
 * of its queue is taken from the defer_cache_size most recently deferred
 * messages kept in memory, or else fetched again from Kafka by the loader
 * (loader.c), and handled as a new event of the key. A deferred timer is
 * made again from (key, time); the same cache keeps its trace context. Handled
 * (or failed permanently), it leaves the queue and the next entry goes on the
 * loop's next tick; failed transiently, it waits a uniform whole number of
 * seconds in [1, max(1, min(defer_base * 2^(n-1), defer_max_delay))] for its
 * n-th retry. An entry whose record is gone from Kafka is skipped with an error
 * naming it. Above the threshold, a failure is not deferred: the retry layer
 * outside retries it in place, which holds the partition (backpressure) until
 * the storm passes.
 *
 * A key deferred by an earlier owner (ours or the original: the stores
 * share its tables) keeps its order: the memory store lists a partition's
 * deferred keys when it is assigned (its records wait until then); with
 * Cassandra's, whose layout lists none, a key's first event of a kind asks
 * the store (through the head cache) before it runs, and the keys' retry
 * timers (types deferred message and deferred timer, in the timer store)
 * name them as the partition's timers are loaded.
 *
 * Threads: the engine thread only (the Cassandra store and the loader
 * answer through the mailbox; the memory store answers at once).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

static void loaded_mail(pr__mail_t *mail, void *owner);

/* A segment is one group's topic partition, named as the original names
 * it (its id in Cassandra is derived from the name). */
static void segment_of(const part_t *part, char *buf, size_t n) {
  snprintf(buf, n, "%s/%" PRId32 ":%s", part->topic, part->partition,
           part->eng->group_id);
}

#define SEG_MAX 1024

/* ---- deferred keys ------------------------------------------------------- */

static pr__dk_t *dk_new(part_t *part, kq_t *kq, int kind, int64_t retry_at_ms) {
  pr__dk_t *dk = calloc(1, sizeof(*dk));
  if (!dk)
    return NULL;
  dk->kq = kq;
  dk->kind = kind;
  dk->retry_at_ms = retry_at_ms;
  kq->dk[kind] = dk;
  dk->next = part->dks;
  part->dks = dk;
  return dk;
}

static void dk_free(part_t *part, pr__dk_t *dk) {
  pr__dk_t **pp = &part->dks;
  while (*pp && *pp != dk)
    pp = &(*pp)->next;
  if (*pp)
    *pp = dk->next;
  dk->kq->dk[dk->kind] = NULL;
  pr__kq_trim(part, dk->kq);
  free(dk);
}

void pr__df_part_free(part_t *part) {
  PR_ENGINE_THREAD(part->eng);
  pr__dk_t *dk, *next;
  for (dk = part->dks; dk; dk = next) {
    next = dk->next;
    dk->kq->dk[dk->kind] = NULL;
    free(dk);
  }
  part->dks = NULL;
}

static pr__load_t *req_new(const part_t *part, const char *key, int kind) {
  size_t tl = strlen(part->topic) + 1, kl = strlen(key) + 1;
  pr__load_t *r = calloc(1, sizeof(*r) + tl + kl);
  if (!r)
    return NULL;
  r->eng = part->eng;
  r->answered = loaded_mail;
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
static part_t *req_part(const pr__load_t *r) {
  part_t *part = pr__part_find(r->eng, r->topic, r->partition);
  return part && part->gen == r->gen && !part->revoking &&
                 r->eng->phase == PH_RUNNING
             ? part
             : NULL;
}

static pr__dk_t *req_dk(const pr__load_t *r, part_t **partp) {
  part_t *part = req_part(r);
  kq_t *kq = part ? pr__kq_get(part, r->key, 0) : NULL;
  *partp = part;
  return kq ? kq->dk[r->kind] : NULL;
}

static void log_cb(void *arg, prosody_err_t err, const char *errstr) {
  pr__load_t *r = arg;
  if (err)
    PR_WARN("defer", "%s[%" PRId32 "] key \"%.64s\": %s: %s", r->topic,
            r->partition, r->key, r->error ? r->error : "store",
            errstr ? errstr : prosody_err_name(err));
  pr__load_free(r);
}

/* Retried at `at_ms` (not busy any more). */
static void dk_idle(pr__dk_t *dk, int64_t at_ms) {
  dk->busy = 0;
  dk->retry_at_ms = at_ms;
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

/* ---- deferring a message --------------------------------------------------
 */

/* The message's writes are over (or abandoned): it leaves the deferring
 * state, committed when `commit`. */
static void leave(inv_t *inv, int commit) {
  kq_t *kq = pr__kq_get(inv->part, inv->msg.key, 0);
  pr__dk_t *dk = kq ? kq->dk[PR_DF_KIND(inv)] : NULL;
  if (dk) {
    dk->writes--;
    if (inv->df_prev)
      inv->df_prev->df_next = inv->df_next;
    else if (dk->deferring == inv)
      dk->deferring = inv->df_next;
    if (inv->df_next)
      inv->df_next->df_prev = inv->df_prev;
    inv->df_prev = inv->df_next = NULL;
  }
  inv->part->active--;
  inv->eng->dlq_inflight--;
  pr__outcome_finish(inv, commit);
}

/* Leaves with `commit`; the first event of a newly deferred key takes the
 * events held for its key row along. They leave first: while `inv` is
 * still counted, the partition (a zombie's too) and the key stay. */
static void leave_all(inv_t *inv, int commit) {
  kq_t *kq = inv->df_key_at ? pr__kq_get(inv->part, inv->msg.key, 0) : NULL;
  pr__dk_t *dk = kq ? kq->dk[PR_DF_KIND(inv)] : NULL;
  if (dk) {
    if (commit)
      dk->row_written = 1;
    for (inv_t *h = dk->deferring, *next; h; h = next) {
      next = h->df_next; /* leave() unlinks it */
      if (h->df_held)
        leave(h, commit);
    }
  }
  leave(inv, commit); /* frees inv */
}

static void written(void *arg, prosody_err_t err, const char *errstr) {
  inv_t *inv = arg;
  char ev[160];
  if (err) {
    inv->df_failed = 1;
    PR_WARN("defer",
            "%s: could not write it to its key's defer queue: %s; trying "
            "again (it is not committed meanwhile)",
            pr__inv_describe(inv, ev, sizeof(ev)),
            errstr ? errstr : prosody_err_name(err));
  }
  if (--inv->df_writes > 0)
    return;
  if (!inv->df_failed) {
    kq_t *kq = pr__kq_get(inv->part, inv->msg.key, 0);
    pr__dk_t *dk = kq ? kq->dk[PR_DF_KIND(inv)] : NULL;
    if (!inv->df_key_at && dk && !dk->row_written) {
      inv->df_held = 1; /* committed with the key's first event */
      return;
    }
    leave_all(inv, 1);
    return;
  }
  inv->df_failed = 0;
  if (inv->part->revoking || inv->part->zombie ||
      inv->eng->phase != PH_RUNNING) {
    leave_all(inv, 0); /* not committed: redelivered to the next owner */
    return;
  }
  pr__outcome_arm_retry(inv, pr__outcome_backoff_ms(inv->eng, 1) + 100);
}

void pr__df_write(inv_t *inv) {
  PR_ENGINE_THREAD(inv->eng);
  pr__engine_t *eng = inv->eng;
  part_t *part = inv->part;
  char seg[SEG_MAX];
  int64_t key_at = inv->df_key_at;
  int kind = PR_DF_KIND(inv);
  pr__defer_t *store = pr__df_store(eng, kind);
  kq_t *kq = pr__kq_get(part, inv->msg.key, 0);
  int64_t position = inv->is_timer ? inv->time_s : inv->msg.offset;
  if (!store || part->revoking || part->zombie || eng->phase != PH_RUNNING) {
    leave_all(inv, 0);
    return;
  }
  if (kq && kq->dk[kind])
    kq->dk[kind]->appended = 1;
  segment_of(part, seg, sizeof(seg));
  inv->df_writes = key_at ? 2 : 1;
  inv->df_failed = 0;
  if (key_at) { /* first: the memory store answers at once */
    /* The key was not deferred: whatever the store holds below it was
     * left by a deferral whose key row was never written, and its events
     * were handled since (redelivered uncommitted). */
    inv->df_writes++;
    pr__defer_trim(store, seg, inv->msg.key, position, written, inv);
    if (pr__df_refuse_row(eng)) { /* test option */
      written(inv, PROSODY_ERR_TRANSIENT, "refused (test option)");
    } else {
      inv->df_writes++; /* the retry timer too */
      retry_timer(part, inv->msg.key, kind, (key_at + 999) / 1000, written,
                  inv);
      pr__defer_set_key(store, seg, inv->msg.key, (key_at + 999) / 1000,
                        written, inv);
    }
  }
  /* The last write may finish (and free) inv. */
  pr__defer_append(store, seg, inv->msg.key, position, inv->df_retries, written,
                   inv);
}

void pr__df_release_waiting(part_t *part) {
  PR_ENGINE_THREAD(part->eng);
  for (pr__dk_t *dk = part->dks; dk; dk = dk->next)
    for (inv_t *inv = dk->deferring, *next; inv; inv = next) {
      next = inv->df_next;       /* leave() unlinks it */
      if (inv->df_writes == 0) { /* its retry timer is armed, or held */
        pr__inv_timer_close(&inv->timer);
        leave(inv, 0);
      }
    }
}

/* The lowest position of the key's entries not known to be written yet
 * (INT64_MAX: none): a head read may miss them. */
static int64_t unwritten_low(const pr__dk_t *dk) {
  int64_t low = INT64_MAX;
  for (const inv_t *inv = dk->deferring; inv; inv = inv->df_next) {
    int64_t p = inv->is_timer ? inv->time_s : inv->msg.offset;
    if (!inv->df_held && p < low)
      low = p;
  }
  return low;
}

/* Takes `inv` out of its key queue into the deferring state; `key_at_ms`
 * (else 0): the key's row is written too, retrying then. */
static void defer_inv(inv_t *inv, pr__dk_t *dk, int32_t retries,
                      int64_t key_at_ms) {
  if (inv->is_timer && !inv->df_loaded) /* stored until it is written */
    pr__slabs_pin(inv->part, inv->time_s, 0);
  pr__kq_unlink(inv);
  inv->state = INV_DEFERRING;
  inv->df_retries = retries;
  inv->df_key_at = key_at_ms;
  inv->part->active++;
  inv->eng->dlq_inflight++;
  dk->writes++;
  inv->df_prev = NULL;
  inv->df_next = dk->deferring;
  if (dk->deferring)
    dk->deferring->df_prev = inv;
  dk->deferring = inv;
  PR_BUMP(inv->eng->metrics.deferred, 1);
  pr__inv_release_rkm(inv);
  pr__dm_put(inv);
  pr__df_write(inv);
}

void pr__df_join(inv_t *inv) {
  PR_ENGINE_THREAD(inv->eng);
  pr__dk_t *dk = inv->kq->dk[PR_DF_KIND(inv)];
  inv->kq = NULL; /* never in the key queue */
  defer_inv(inv, dk, 0, 0);
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
  if ((dk = req_dk(r, &part)))
    dk->busy = 0;
  pr__load_free(r);
}

static void retry_later(inv_t *inv) {
  pr__engine_t *eng = inv->eng;
  kq_t *kq = inv->kq;
  int kind = PR_DF_KIND(inv);
  pr__dk_t *dk = kq ? kq->dk[kind] : NULL;
  int32_t n = inv->df_retries + 1;
  int64_t delay = pr__df_delay_s(eng, n);
  int64_t at_ms = pr__wall_ms() + delay * 1000;
  char seg[SEG_MAX], ev[160];
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
            pr__inv_describe(inv, ev, sizeof(ev)), (int)inv->df_retries);
    pr__outcome_finish(inv, 1);
    return;
  }
  r = dk ? req_new(inv->part, kq->key, kind) : NULL;
  PR_WARN("defer", "%s: deferred retry %d failed: %s; next retry in %llds",
          pr__inv_describe(inv, ev, sizeof(ev)), (int)inv->df_retries,
          inv->result_error ? inv->result_error : "(no message)",
          (long long)delay);
  inv->df_loaded = 0; /* what follows is this function's */
  if (dk) {
    dk->busy = 1;
    dk->retry_at_ms = at_ms;
  }
  if (r) {
    segment_of(inv->part, seg, sizeof(seg));
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
    j->dd_waiting = 0;
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
  pr__dk_t *dk = kq->dk[kind];
  int64_t delay, key_at = 0;
  char ev[160];
  if (inv->df_loaded) {
    retry_later(inv);
    return;
  }
  delay = pr__df_delay_s(eng, 1);
  if (!dk) {
    key_at = pr__wall_ms() + delay * 1000;
    if (!(dk = dk_new(part, kq, kind, key_at))) { /* out of memory */
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
 * holds a message (asked again every second, as a failed dedup lookup
 * holds it) but not a timer: timers keep firing while Cassandra is down. */

/* `key` of `part` is deferred: its dk (retried at `at_ms`), or NULL when
 * out of memory. */
static pr__dk_t *dk_found(part_t *part, kq_t *kq, int kind, int64_t at_ms) {
  pr__dk_t *dk = kq->dk[kind];
  if (dk)
    return dk;
  if (!(dk = dk_new(part, kq, kind, at_ms)))
    return NULL;
  dk->row_written = 1;
  kq->df_known[kind] = PR_DF_KNOWN;
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
  part_t *part = req_part(r);
  kq_t *kq = part ? pr__kq_get(part, r->key, 0) : NULL;
  int kind = r->kind;
  (void)position;
  (void)retries;
  if (!kq || kq->df_known[kind] != PR_DF_ASKING) {
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
    kq->df_known[kind] = PR_DF_UNKNOWN;
    part->df_ask_ms = pr__wall_ms() + 1000;
    PR_WARN("defer",
            "%s[%" PRId32 "] key \"%.64s\": could not read whether it is "
            "deferred: %s; its events wait (asking again in 1s)",
            part->topic, part->partition, r->key,
            errstr ? errstr : prosody_err_name(err));
  } else {
    kq->df_known[kind] = PR_DF_KNOWN;
  }
  if (r->pending == 1) {
    r->pending = 2;
    return;
  }
  pr__load_free(r);
  if (err)
    return;
  if (kq->dk[kind])
    take_queued(part, kq, kq->dk[kind], kind);
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
  char seg[SEG_MAX];
  if (!pr__df_store(eng, kind) || inv->df_loaded || !kq)
    return PR_ADMIT_RUN;
  if (kq->dk[kind]) { /* found deferred since it was queued */
    take_queued(part, kq, kq->dk[kind], kind);
    return PR_ADMIT_TAKEN;
  }
  if (kq->df_known[kind] == PR_DF_KNOWN)
    return PR_ADMIT_RUN;
  if (kq->df_known[kind] == PR_DF_ASKING || part->df_ask_ms > pr__wall_ms())
    return PR_ADMIT_WAIT; /* the answer, or the tick, schedules it */
  if (!(r = req_new(part, kq->key, kind))) {
    part->df_ask_ms = pr__wall_ms() + 1000;
    return PR_ADMIT_WAIT;
  }
  kq->df_known[kind] = PR_DF_ASKING;
  r->pending = 1;
  segment_of(part, seg, sizeof(seg));
  pr__defer_head(pr__df_store(eng, kind), seg, kq->key, asked, r);
  if (r->pending == 1) { /* the answer comes later */
    r->pending = 0;
    return PR_ADMIT_WAIT;
  }
  pr__load_free(r); /* answered at once */
  if (kq->df_known[kind] != PR_DF_KNOWN)
    return PR_ADMIT_WAIT;
  if (kq->dk[kind]) {
    take_queued(part, kq, kq->dk[kind], kind);
    return PR_ADMIT_TAKEN;
  }
  return PR_ADMIT_RUN;
}

int pr__df_timer_loaded(part_t *part, const char *key, int kind,
                        int64_t time_s) {
  PR_ENGINE_THREAD(part->eng);
  kq_t *kq;
  pr__dk_t *dk;
  if (!pr__df_store(part->eng, kind))
    return 0;
  if (!(kq = pr__kq_get(part, key, 1)))
    return 0; /* out of memory: read again at the next assignment */
  if ((dk = kq->dk[kind])) {
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

/* Events waiting for a failed "is it deferred?" are asked about again. */
static void ask_again(pr__engine_t *eng, part_t *part, int64_t now_ms) {
  if (!part->df_ask_ms || part->df_ask_ms > now_ms)
    return;
  part->df_ask_ms = 0;
  for (size_t b = 0; part->buckets && b < part->nbuckets; b++) {
    kq_t *kq = part->buckets[b], *knext;
    for (; kq; kq = knext) {
      knext = kq->next; /* scheduling may finish (and free) a dropped head */
      if (kq->head && kq->head->state == INV_QUEUED &&
          kq->df_known[PR_DF_KIND(kq->head)] == PR_DF_UNKNOWN &&
          eng->phase == PH_RUNNING)
        pr__dispatch_schedule(kq->head);
    }
  }
}

/* ---- retrying a deferred key ----------------------------------------------
 */

static void advanced(void *arg, prosody_err_t err, const char *errstr) {
  pr__load_t *r = arg;
  part_t *part;
  pr__dk_t *dk = req_dk(r, &part);
  if (dk) {
    if (err) {
      PR_WARN("defer",
              "%s[%" PRId32 "] offset %lld key \"%.64s\": could not remove "
              "it from its defer queue: %s; trying again",
              r->topic, r->partition, (long long)r->offset, r->key,
              errstr ? errstr : prosody_err_name(err));
      dk->busy = 2; /* the removal, again, on a later tick */
      dk->retry_at_ms = pr__wall_ms() + 1000;
    } else {
      dk_idle(dk, 0); /* the next entry at once */
    }
  }
  if (!err)
    pr__dm_drop(r->eng, r->kind == PR_DEFER_TIMERS, r->topic, r->partition,
                r->key, r->offset);
  pr__load_free(r);
}

/* The head at dk->position is done with: remove it from the queue. */
static void advance(part_t *part, pr__dk_t *dk) {
  char seg[SEG_MAX];
  pr__load_t *r = req_new(part, dk->kq->key, dk->kind);
  dk->busy = 1;
  if (!r) {
    dk->busy = 2;
    dk->retry_at_ms = pr__wall_ms() + 1000;
    return;
  }
  r->offset = dk->position;
  segment_of(part, seg, sizeof(seg));
  pr__defer_advance(pr__df_store(part->eng, dk->kind), seg, r->key, r->offset,
                    advanced, r);
}

void pr__df_finished(inv_t *inv, int commit) {
  PR_ENGINE_THREAD(inv->eng);
  pr__engine_t *eng = inv->eng;
  part_t *part = inv->part;
  pr__dk_t *dk = inv->kq ? inv->kq->dk[PR_DF_KIND(inv)] : NULL;
  inv->df_loaded = 0;
  /* The store closed (it finished after shutdown): its entry stays at the
   * head of the queue for the partition's next owner (handled again: at
   * least once). While the partition drains, the removal is still sent:
   * the drain delivers its answer. */
  if (!dk || !pr__df_store(eng, dk->kind))
    return;
  if (commit && inv->is_timer && inv->rearmed && part->tq &&
      pr__tq_add(part->tq, inv->msg.key, inv->time_s) < 0) {
    PR_ERROR("timers", "out of memory re-queueing a timer of %s[%d]",
             part->topic, part->partition);
    pr__slabs_untracked(part);
  }
  if (commit)
    advance(part, dk);
  else
    dk_idle(dk, pr__wall_ms() + 1000);
}

void pr__df_unscheduled(part_t *part, const char *key, int64_t time_s) {
  PR_ENGINE_THREAD(part->eng);
  pr__engine_t *eng = part->eng;
  pr__defer_t *store = pr__df_store(eng, PR_DEFER_TIMERS);
  kq_t *kq = pr__kq_get(part, key, 0);
  pr__load_t *r;
  char seg[SEG_MAX];
  if (!store || !kq || !kq->dk[PR_DEFER_TIMERS] ||
      !(r = req_new(part, key, PR_DEFER_TIMERS)))
    return;
  r->error = strdup("removing an unscheduled timer from its defer queue (it "
                    "may still fire)");
  segment_of(part, seg, sizeof(seg));
  if (time_s >= 0)
    pr__defer_advance(store, seg, key, time_s, log_cb, r);
  else
    pr__defer_trim(store, seg, key, INT64_MAX, log_cb, r);
}

/* A deferred timer's retry: its event, made again from (key, time), with
 * the context it was scheduled in when that is still kept. */
static void load_timer(part_t *part, pr__dk_t *dk, pr__load_t *r) {
  inv_t *inv = pr__firing_inv(part, r->key, r->offset);
  pr__dmsg_t *d = inv ? pr__dm_find(part->eng, 1, part->topic, part->partition,
                                    r->key, r->offset)
                      : NULL;
  pr__load_free(r);
  if (!inv) {
    dk_idle(dk, pr__wall_ms() + 1000);
    return;
  }
  if (d && (inv->tr = calloc(1, sizeof(*inv->tr))))
    inv->tr->from = d->from; /* its span links back to it */
  inv->df_loaded = 1;
  inv->df_retries = dk->retries;
  pr__dispatch_enqueue(inv);
}

static void head_read(void *arg, prosody_err_t err, const char *errstr,
                      int found, int64_t position, int32_t retries) {
  pr__load_t *r = arg;
  part_t *part;
  pr__dk_t *dk = req_dk(r, &part);
  pr__engine_t *eng = r->eng;
  char seg[SEG_MAX];
  if (!dk) {
    pr__load_free(r);
    return;
  }
  if (err) {
    PR_WARN("defer",
            "%s[%" PRId32 "] key \"%.64s\": could not read its defer queue: "
            "%s; trying again in 1s",
            r->topic, r->partition, r->key,
            errstr ? errstr : prosody_err_name(err));
    dk_idle(dk, pr__wall_ms() + 1000);
    pr__load_free(r);
    return;
  }
  if (!found) {
    if (dk->appended || dk->writes) { /* joined meanwhile: read again */
      dk_idle(dk, 0);
      pr__load_free(r);
      return;
    }
    PR_INFO("defer",
            "%s[%" PRId32 "] key \"%.64s\": no deferred %s left; the key "
            "is not deferred for them any more",
            r->topic, r->partition, r->key,
            r->kind == PR_DEFER_TIMERS ? "timer" : "message");
    segment_of(part, seg, sizeof(seg));
    r->error = strdup("forgetting the deferred key");
    retry_timer(part, r->key, r->kind, -1, timer_log_cb, NULL);
    dk_free(part, dk);
    pr__defer_del_key(pr__df_store(eng, r->kind), seg, r->key, log_cb, r);
    return;
  }
  if (position >= r->offset) { /* an entry below it may not be written yet */
    dk_idle(dk, 0);
    pr__load_free(r);
    return;
  }
  dk->position = position;
  dk->retries = retries;
  r->offset = position;
  if (r->kind == PR_DEFER_TIMERS) { /* the timer is all there is to it */
    load_timer(part, dk, r);
    return;
  }
  {
    inv_t *inv = pr__dm_inv(part, r->key, position); /* kept: no fetch */
    if (inv) {
      pr__load_free(r);
      inv->df_loaded = 1;
      inv->df_retries = retries;
      pr__dispatch_enqueue(inv);
      return;
    }
  }
  if (!eng->loader && !(eng->loader = pr__loader_new(eng, eng->bootstrap))) {
    PR_ERROR("defer", "could not start the deferred message loader; trying "
                      "again in 1s");
    dk_idle(dk, pr__wall_ms() + 1000);
    pr__load_free(r);
    return;
  }
  if ((r->span = pr__span_start(eng->otel, "load", PR_SPAN_CLIENT, NULL,
                                PR_SPAN_CHILD, NULL))) {
    char p[16];
    snprintf(p, sizeof(p), "%d", (int)r->partition);
    pr__span_attr_str(r->span, "messaging.system", "kafka", SIZE_MAX);
    pr__span_attr_str(r->span, "messaging.operation.type", "receive", SIZE_MAX);
    pr__span_attr_str(r->span, "messaging.destination.name", r->topic,
                      SIZE_MAX);
    pr__span_attr_str(r->span, "messaging.destination.partition.id", p,
                      SIZE_MAX);
    pr__span_attr_int(r->span, "messaging.kafka.offset", r->offset);
    pr__span_attr_str(r->span, "messaging.kafka.message.key", r->key, SIZE_MAX);
    pr__span_attr_str(r->span, "messaging.consumer.group.name", eng->group_id,
                      SIZE_MAX);
  }
  pr__loader_post(eng->loader, r);
}

static void read_head(part_t *part, pr__dk_t *dk) {
  char seg[SEG_MAX];
  pr__load_t *r = req_new(part, dk->kq->key, dk->kind);
  if (!r)
    return; /* out of memory: next tick */
  dk->busy = 1;
  dk->appended = 0;
  r->offset = unwritten_low(dk);
  segment_of(part, seg, sizeof(seg));
  pr__defer_head(pr__df_store(part->eng, dk->kind), seg, r->key, head_read, r);
}

static void loaded(pr__load_t *r) {
  part_t *part;
  pr__dk_t *dk = req_dk(r, &part);
  pr__engine_t *eng = r->eng;
  rd_kafka_message_t *m = r->rkm;
  inv_t *inv;
  if (r->span) { /* the fetch is over, whatever comes of it */
    if (r->error || r->gone)
      pr__span_set_error(r->span, r->error ? r->error : "the offset is gone");
    pr__span_end(r->span);
    r->span = NULL;
  }
  if (!dk || dk->position != r->offset) {
    pr__load_free(r);
    return;
  }
  if (r->error) {
    int64_t delay = pr__df_delay_s(eng, dk->retries > 0 ? dk->retries : 1);
    PR_WARN("defer",
            "%s[%" PRId32 "] offset %lld key \"%.64s\": could not load the "
            "deferred message: %s; trying again in %llds",
            r->topic, r->partition, (long long)r->offset, r->key, r->error,
            (long long)delay);
    dk_idle(dk, pr__wall_ms() + delay * 1000);
    pr__load_free(r);
    return;
  }
  if (r->gone || !m->key || m->key_len != strlen(r->key) ||
      memcmp(m->key, r->key, m->key_len)) {
    PR_ERROR("defer",
             "%s[%" PRId32 "] offset %lld key \"%.64s\": the deferred message "
             "%s; skipping it",
             r->topic, r->partition, (long long)r->offset, r->key,
             r->gone ? "is not in the partition any more (retention or "
                       "compaction)"
                     : "read back has another key");
    advance(part, dk);
    pr__load_free(r);
    return;
  }
  if (!(inv = pr__intake_inv(part, m))) {
    dk_idle(dk, pr__wall_ms() + 1000);
    pr__load_free(r);
    return;
  }
  r->rkm = NULL; /* the inv's now */
  pr__load_free(r);
  inv->df_loaded = 1;
  inv->df_retries = dk->retries;
  pr__dispatch_enqueue(inv);
}

/* The loader answered (engine thread). */
static void loaded_mail(pr__mail_t *mail, void *owner) {
  (void)owner;
  loaded(PR_CONTAINER_OF(mail, pr__load_t, mail));
}

static void keys_read(void *arg, prosody_err_t err, const char *errstr,
                      const pr__dkey_t *keys, size_t n) {
  pr__load_t *r = arg;
  part_t *part = req_part(r);
  size_t i;
  if (!part) {
    pr__load_free(r);
    return;
  }
  if (err) {
    PR_ERROR("defer",
             "%s[%" PRId32 "]: could not read its deferred keys: %s; its "
             "records wait until they are read (trying again)",
             r->topic, r->partition, errstr ? errstr : prosody_err_name(err));
    part->df_listing[r->kind] = 2;
    pr__load_free(r);
    return;
  }
  for (i = 0; i < n; i++) {
    kq_t *kq = pr__kq_get(part, keys[i].key, 1);
    pr__dk_t *dk;
    if (!kq)
      break;
    if (!kq->dk[r->kind]) {
      if (!(dk = dk_new(part, kq, r->kind, keys[i].retry_at_s * 1000)))
        break;
      dk->row_written = 1;
    }
  }
  if (i < n) {
    PR_ERROR("defer",
             "%s[%" PRId32 "]: out of memory taking its deferred "
             "keys; trying again",
             r->topic, r->partition);
    part->df_listing[r->kind] = 2;
    pr__load_free(r);
    return;
  }
  if (n > 0)
    PR_INFO("defer", "%s[%" PRId32 "]: %zu key(s) with deferred %s", r->topic,
            r->partition, n,
            r->kind == PR_DEFER_TIMERS ? "timers" : "messages");
  part->df_listing[r->kind] = 0;
  part->eng->resumed = 1;    /* its queue is read again */
  pr__firing_arm(part->eng); /* and its timers fire */
  pr__load_free(r);
}

static void read_keys(part_t *part, int kind) {
  char seg[SEG_MAX];
  pr__load_t *r = req_new(part, "", kind);
  part->df_listing[kind] = 1;
  if (!r) {
    part->df_listing[kind] = 2;
    return;
  }
  segment_of(part, seg, sizeof(seg));
  pr__defer_keys(pr__df_store(part->eng, kind), seg, keys_read, r);
}

void pr__df_assigned(pr__engine_t *eng, part_t *part) {
  PR_ENGINE_THREAD(eng);
  for (int kind = 0; kind < 2; kind++)
    if (pr__df_store(eng, kind))
      read_keys(part, kind);
}

void pr__df_tick(pr__engine_t *eng) {
  PR_ENGINE_THREAD(eng);
  int64_t now_ms = pr__wall_ms();
  if (eng->phase != PH_RUNNING)
    return;
  for (part_t *part = eng->parts; part; part = part->next) {
    pr__dk_t *dk, *next;
    if (part->revoking || part->held)
      continue;
    for (int kind = 0; kind < 2; kind++)
      if (part->df_listing[kind] == 2)
        read_keys(part, kind);
    ask_again(eng, part, now_ms);
    if (pr__df_listing(part))
      continue;
    for (dk = part->dks; dk; dk = next) {
      next = dk->next;              /* reading the head may free dk */
      if (dk->retry_at_ms > now_ms) /* writes in flight do not hold it:
                                        head_read checks what it read */
        continue;
      if (dk->busy == 2)
        advance(part, dk);
      else if (!dk->busy)
        read_head(part, dk);
    }
  }
}
