/*
 * slabs.c - retiring a partition's finished timer slabs: which slabs have
 * a listing row in the timer store (listed at assignment, or written since),
 * which still hold timers, and, once a past slab holds none, deleting its
 * row and raising the segment's watermark, as the original Prosody does.
 * Without this a slab's row lives until its TTL (retention), and every
 * assignment lists and loads it again: a slab of a busy partition holds
 * one tombstone per fired timer, which Cassandra reads (and, past its
 * tombstone_failure_threshold, refuses to read) on every load.
 *
 * A past slab (wholly before the current second's slab and loaded) is
 * finished when none of these holds a timer in it:
 *  - the partition's time queue (loaded timers not yet firing);
 *  - its key queues (timer events firing, retried, or being deleted);
 *  - puts in flight (posted, not yet answered: not in the queue yet);
 *  - what the engine does not track: records a load skipped (the types a
 *    handler without on_timer leaves, the original's state recovery type,
 *    retry timers with deferral off), timer events being deferred (out of
 *    their key queue, still stored until the deferral is written) and
 *    timer events ended uncommitted: those pin the slab for the rest of
 *    the assignment;
 *  - retry timers of deferred keys (types 1 and 2): a slab that held one
 *    stays until the partition has no deferred key left (the defer layer's
 *    retry time moves while a retry runs, so it does not say which slab its
 *    stored timer is in).
 * Having lost track of a stored timer (out of memory), the engine retires
 * nothing more in the assignment. The store runs a retire (at most
 * RETIRE_MAX rows, one batch) alone: after every write posted before it,
 * so a put the engine had not heard back from is counted by the in-flight
 * count, and before any posted after it, so such a put writes the row
 * again (the store forgot the slab) and lowers the watermark again.
 *
 * Threads: the engine thread only.
 */
#include <stdlib.h>
#include <string.h>

#include "defer.h"
#include "internal.h"

/* Slab rows one retire deletes at most: one batch, so that the writes
 * posted after it are all stamped after it (the rest go next time). */
#define RETIRE_MAX 100

/* A slab of the partition with a listing row (as far as the engine knows). */
struct pr__slabrow {
  int64_t slab;
  int puts;       /* puts into it in flight */
  uint8_t pinned; /* PIN_*: kept for the rest of the assignment */
  uint8_t active; /* tidy(): holds a timer */
  uint64_t epoch; /* rows_epoch at its last put */
};

enum { PIN_NONE, PIN_RETRY, PIN_KEEP };

/* The row of `slab`, added when `add` (NULL: absent, or out of memory). */
static pr__slabrow_t *row_at(part_t *part, int64_t slab, int add) {
  size_t lo = 0, hi = part->nrows;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (part->rows[mid].slab < slab)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo < part->nrows && part->rows[lo].slab == slab)
    return &part->rows[lo];
  if (!add)
    return NULL;
  if (part->nrows == part->caprows) {
    size_t cap = part->caprows ? part->caprows * 2 : 8;
    pr__slabrow_t *r = realloc(part->rows, cap * sizeof(*r));
    if (!r)
      return NULL;
    part->rows = r;
    part->caprows = cap;
  }
  memmove(&part->rows[lo + 1], &part->rows[lo],
          (part->nrows - lo) * sizeof(*part->rows));
  part->nrows++;
  memset(&part->rows[lo], 0, sizeof(*part->rows));
  part->rows[lo].slab = slab;
  return &part->rows[lo];
}

void pr__slabs_untracked(part_t *part) {
  PR_ENGINE_THREAD(part->eng);
  if (!part->no_retire)
    PR_WARN("timers",
            "out of memory: finished timer slabs of %s[%d] are left to "
            "expire",
            part->topic, part->partition);
  part->no_retire = 1;
}

/* Without memory for a row, the slab may hold timers the engine cannot
 * account for: retiring stops for this assignment. */
static pr__slabrow_t *row_add(part_t *part, int64_t slab) {
  pr__slabrow_t *r = row_at(part, slab, 1);
  if (!r)
    pr__slabs_untracked(part);
  return r;
}

void pr__slabs_listed(part_t *part, const int64_t *slabs, size_t n) {
  PR_ENGINE_THREAD(part->eng);
  for (size_t i = 0; i < n; i++)
    row_add(part, slabs[i]);
}

void pr__slabs_pin(part_t *part, int64_t time_s, int retry) {
  PR_ENGINE_THREAD(part->eng);
  pr__slabrow_t *r = row_add(part, pr__slab_of(time_s, part->eng->slab_s));
  if (r && r->pinned != PIN_KEEP)
    r->pinned = retry ? PIN_RETRY : PIN_KEEP;
}

void pr__slabs_put(part_t *part, int64_t time_s) {
  PR_ENGINE_THREAD(part->eng);
  int64_t slab = pr__slab_of(time_s, part->eng->slab_s);
  pr__slabrow_t *r = row_add(part, slab);
  if (r) {
    r->puts++;
    r->epoch = ++part->rows_epoch;
  }
  if (slab <= part->wm_raised) /* the store lowers it again */
    part->wm_raised = slab - 1;
}

void pr__slabs_put_done(part_t *part, uint64_t gen, int64_t time_s) {
  pr__slabrow_t *r;
  if (!part || part->gen != gen)
    return; /* an earlier assignment's: its rows went with it */
  PR_ENGINE_THREAD(part->eng);
  if ((r = row_at(part, pr__slab_of(time_s, part->eng->slab_s), 0)) &&
      r->puts > 0)
    r->puts--;
}

void pr__slabs_free(part_t *part) {
  free(part->rows);
  part->rows = NULL;
  part->nrows = part->caprows = 0;
}

/* Marks the slab of `time_s` as holding a timer. */
static void mark(part_t *part, int64_t time_s) {
  pr__slabrow_t *r = row_add(part, pr__slab_of(time_s, part->eng->slab_s));
  if (r)
    r->active = 1;
}

static void mark_queued(void *arg, const char *key, int64_t time_s,
                        const pr_span_ctx_t *ctx) {
  (void)key;
  (void)ctx;
  mark(arg, time_s);
}

/* What a retire is for: the assignment, and the rows it deletes. */
typedef struct retire {
  pr__engine_t *eng;
  uint64_t gen;
  uint64_t epoch;    /* rows_epoch when posted */
  int64_t watermark; /* raised to, or -1 */
  int32_t partition;
  size_t n;
  int64_t *slabs;
  char topic[];
} retire_t;

static void retired(void *arg, prosody_err_t err, const char *errstr) {
  retire_t *t = arg;
  part_t *part = pr__part_find(t->eng, t->topic, t->partition);
  if (!part || part->gen != t->gen) {
    free(t->slabs);
    free(t);
    return;
  }
  part->retiring = 0;
  if (err) {
    PR_WARN("timers",
            "could not retire finished timer slabs of %s[%d]: %s; trying "
            "again later",
            t->topic, t->partition, errstr ? errstr : prosody_err_name(err));
  } else {
    for (size_t i = 0; i < t->n; i++) {
      pr__slabrow_t *r = row_at(part, t->slabs[i], 0);
      /* A put since the retire wrote the row again. */
      if (r && r->epoch <= t->epoch && !r->puts) {
        size_t at = (size_t)(r - part->rows);
        memmove(r, r + 1, (part->nrows - at - 1) * sizeof(*r));
        part->nrows--;
      }
    }
    /* (a put since then may have lowered it again: looked at next time) */
    if (t->watermark > part->wm_raised && part->rows_epoch == t->epoch)
      part->wm_raised = t->watermark;
  }
  free(t->slabs);
  free(t);
}

/* The partition's retire, if one is due (see the top of the file). */
static void tidy(pr__engine_t *eng, part_t *part, int64_t now_s) {
  int64_t end = pr__slab_of(now_s, eng->slab_s) - 1, low = -1, wm;
  size_t n = 0, tl;
  retire_t *t;
  if (end > part->horizon)
    end = part->horizon; /* slabs above it are not loaded yet */
  if (end < 0 || part->no_retire)
    return;
  for (size_t i = 0; i < part->nrows; i++) {
    part->rows[i].active =
        part->rows[i].puts > 0 || part->rows[i].pinned == PIN_KEEP ||
        (part->rows[i].pinned == PIN_RETRY && pr__df_keyed(part));
    if (!pr__df_keyed(part) && part->rows[i].pinned == PIN_RETRY)
      part->rows[i].pinned = PIN_NONE; /* no deferred key left */
  }
  pr__tq_each_in(part->tq, 0, (end + 1) * eng->slab_s, mark_queued, part);
  for (size_t b = 0; part->buckets && b < part->nbuckets; b++)
    for (kq_t *kq = part->buckets[b]; kq; kq = kq->next)
      for (inv_t *i = kq->head; i; i = i->next)
        if (i->is_timer && !i->df_loaded) /* (a re-made deferred timer:
                                             its row went when deferred) */
          mark(part, i->time_s);
  if (part->no_retire)
    return; /* a mark ran out of memory */
  for (size_t i = 0; i < part->nrows && part->rows[i].slab <= end; i++)
    if ((part->rows[i].active || n == RETIRE_MAX) && low < 0)
      low = part->rows[i].slab; /* held, or left for the next retire */
    else if (!part->rows[i].active && n < RETIRE_MAX)
      n++;
  wm = low >= 0 ? low - 1 : end;
  if (!n && wm <= part->wm_raised)
    return;
  tl = strlen(part->topic) + 1;
  if (!(t = malloc(sizeof(*t) + tl)) ||
      (n && !(t->slabs = malloc(n * sizeof(*t->slabs))))) {
    free(t);
    return; /* tried again on a later tick */
  }
  t->eng = eng;
  t->gen = part->gen;
  t->epoch = part->rows_epoch;
  t->watermark = wm > part->wm_raised ? wm : -1;
  t->partition = part->partition;
  t->n = 0;
  if (!n)
    t->slabs = NULL;
  memcpy(t->topic, part->topic, tl);
  for (size_t i = 0; i < part->nrows && part->rows[i].slab <= end && t->n < n;
       i++)
    if (!part->rows[i].active)
      t->slabs[t->n++] = part->rows[i].slab;
  part->retiring = 1;
  {
    pr__tseg_t seg = {part->topic, part->partition};
    eng->store->ops->retire(eng->store, &seg, t->slabs, t->n, t->watermark,
                            retired, t);
  }
}

void pr__slabs_tidy(pr__engine_t *eng, part_t *part, int64_t now_s) {
  PR_ENGINE_THREAD(eng);
  int64_t now_ms = now_s * 1000, every_s;
  if (!eng->store || !eng->store->ops->retire || eng->phase != PH_RUNNING ||
      !part->tq || part->revoking || part->zombie || part->retiring ||
      part->loads > 0 || part->relist_ms || part->horizon < 0 ||
      now_ms < part->tidy_ms)
    return;
  every_s = eng->slab_s < 60 ? eng->slab_s : 60;
  part->tidy_ms = now_ms + every_s * 1000;
  tidy(eng, part, now_s);
}
