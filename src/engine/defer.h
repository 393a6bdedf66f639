/*
 * defer.h - the defer layer (pipeline mode: deferred messages and timers).
 * Its first part is what the engine's other files call (the data path,
 * the partitions, the timers); the second what only its own files share
 * (defer.c, which defers events and keeps the deferred keys, and
 * defer_retry.c, which retries them; defer_layer.c is the layer's hooks and
 * the kept messages). Everything here is the engine thread's unless said.
 */
#ifndef PR_ENGINE_DEFER_H
#define PR_ENGINE_DEFER_H

#include <stddef.h>
#include <stdint.h>

#include "internal.h"

/* An event's deferral state (inv->dfx, which no other file reads; the
 * engine thread's). */
typedef struct pr__df_ev {
  int64_t key_at;     /* INV_DEFERRING: also writes its key's row,
                         retrying then (ms since the epoch), else 0 */
  inv_t *prev, *next; /* INV_DEFERRING: its deferred key's list */
  int32_t retries;    /* df_loaded: its deferred retries so far */
  int writes;         /* INV_DEFERRING: store writes not yet
                         acknowledged ... */
  int failed;         /* ... of which failed (written again later) */
  uint8_t held;       /* INV_DEFERRING, written, waiting for the key's
                         row */
} pr__df_ev_t;
_Static_assert(sizeof(pr__df_ev_t) <= sizeof(((inv_t *)0)->dfx),
               "pr__df_ev_t must fit struct inv's dfx");
#define DFX(inv) ((pr__df_ev_t *)(void *)(inv)->dfx.bytes)

/* A key queue's deferral state (kq->dfk; the engine thread's). */
typedef struct pr__df_kq {
  pr__dk_t *dk[2];  /* deferred messages [PR_DEFER_MESSAGES] or timers
                       [PR_DEFER_TIMERS]: the key's later ones of that
                       kind join the store's queue, not this one */
  uint8_t known[2]; /* per kind: whether the store was asked if the key
                       is deferred (PR_DF_UNKNOWN, _ASKING, _KNOWN): its
                       events wait at the head until it answers */
} pr__df_kq_t;
_Static_assert(sizeof(pr__df_kq_t) <= sizeof(((kq_t *)0)->dfk),
               "pr__df_kq_t must fit struct kq's dfk");
#define DFK(kq) ((pr__df_kq_t *)(void *)(kq)->dfk.bytes)
enum { PR_DF_UNKNOWN = 0, PR_DF_ASKING, PR_DF_KNOWN };

/* A partition's deferral state (part->dfp; the engine thread's). */
typedef struct pr__df_part {
  pr__dk_t *dks;  /* its deferred keys */
  int listing[2]; /* its deferred keys (per kind) are being read: its
                     queue is not read nor its timers fired meanwhile (2:
                     read them again) */
  int64_t ask_ms; /* a key lookup failed: its keys are asked again from
                     then (0: none) */
} pr__df_part_t;
_Static_assert(sizeof(pr__df_part_t) <= sizeof(((part_t *)0)->dfp),
               "pr__df_part_t must fit struct part's dfp");
#define DFP(part) ((pr__df_part_t *)(void *)(part)->dfp.bytes)

/* Is the key deferred (of either kind)? Its queue lives while it is
 * (keyq.c). */
static inline int pr__df_holds(const kq_t *kq) {
  const pr__df_kq_t *k = (const pr__df_kq_t *)(const void *)kq->dfk.bytes;
  return k->dk[0] || k->dk[1];
}
/* Has `part` deferred keys (slabs.c: a slab pinned for a retry timer)? */
static inline int pr__df_keyed(const part_t *part) {
  return ((const pr__df_part_t *)(const void *)part->dfp.bytes)->dks != NULL;
}

/* ---- the layer, for the engine ------------------------------------------ */

/* Puts the layer in place when defer_enabled (pipeline mode) with its
 * store: memory in mock mode, Cassandra when cassandra_nodes is set, else
 * the layer stays off (a deferred message must outlive the process). */
prosody_err_t pr__df_open(pr__engine_t *eng, const char *bootstrap,
                          char *errstr, size_t errstr_size);
void pr__df_close(pr__engine_t *eng);
/* A handler result, for the failure rate. */
void pr__df_count(pr__engine_t *eng, prosody_result_t result, int64_t now_ns);
/* May a transient failure be deferred (the failure rate is at most
 * defer_failure_threshold)? */
int pr__df_gate(pr__engine_t *eng, int64_t now_ns);
/* The whole-second delay before deferred retry `n` (0: at once). */
int64_t pr__df_delay_s(pr__engine_t *eng, int32_t n);
/* A message's transient failure is deferred, with the queued messages of
 * its key behind it; a loaded one is retried later. */
void pr__df_defer(inv_t *inv);
/* The hold hook: a new message of a key with deferred events of its kind
 * joins the key's defer queue (1); a loaded one is their retry (0). */
int pr__df_hold(inv_t *inv);
/* Admission of an event at the head of its key: unless the key is known
 * (deferred or not), the store is asked first (PR_ADMIT_WAIT; the answer
 * schedules the head again, or defers the key's queued events of the
 * kind when it is deferred: PR_ADMIT_TAKEN when it answers at once). */
int pr__df_admit(inv_t *inv);
/* The end hook: a loaded deferred event is done (`commit`: handled; else
 * aborted): its entry goes from the key's queue (1); 0 for any other. */
int pr__df_end(inv_t *inv, int commit);
/* An INV_DEFERRING message's retry timer: write again. */
void pr__df_write(inv_t *inv);
/* Releases `part`'s INV_DEFERRING events that wait for their retry timer
 * (not committed: the next owner gets them again); those with writes in
 * flight finish when the store answers. */
void pr__df_release_waiting(part_t *part);
void pr__df_assigned(pr__engine_t *eng, part_t *part);
/* Starts the retries that are due (loop tick). */
void pr__df_tick(pr__engine_t *eng);
/* The layer's store of deferred events of `kind` (pr__defer_kind_t), or
 * NULL: that kind is not deferred (the layer is off or closed). */
pr__defer_t *pr__df_store(const pr__engine_t *eng, int kind);
/* Test option defer_refuse_rows: is this key-row write to fail? Each yes
 * counts one down. */
int pr__df_refuse_row(pr__engine_t *eng);
/* Are `part`'s deferred keys being read (its records and timers wait)? */
static inline int pr__df_listing(const part_t *part) {
  const pr__df_part_t *p = (const pr__df_part_t *)(const void *)part->dfp.bytes;
  return p->listing[0] || p->listing[1];
}
/* The deferred messages kept for their retries (defer_layer.c). */
/* Keeps a copy of a message being deferred (out of memory: not kept). */
void pr__dm_put(inv_t *inv);
/* The kept message (a timer: its key and time) of this partition, or
 * NULL. */
pr__dmsg_t *pr__dm_find(pr__engine_t *eng, int is_timer, const char *topic,
                        int32_t partition, const char *key, int64_t offset);
/* Handled (or gone): not kept any more. */
void pr__dm_drop(pr__engine_t *eng, int is_timer, const char *topic,
                 int32_t partition, const char *key, int64_t offset);
/* The retry of a kept message: a new event of it, or NULL. */
inv_t *pr__dm_inv(part_t *part, const char *key, int64_t offset);
/* The deferral kind of an event. */
#define PR_DF_KIND(inv) ((inv)->is_timer ? PR_DEFER_TIMERS : PR_DEFER_MESSAGES)

/* ---- the layer's hooks (defer_layer.c's table) and what its files share - */

/* The timer_loaded hook: the timer store loaded a timer of `type` (as
 * stored) of `key`; a retry timer (deferred message or deferred timer)
 * means the key is deferred, retried at `time_s`. 0 for another type, or
 * when the layer keeps no deferral of that kind (left alone). */
int pr__df_timer_loaded(part_t *part, const char *key, int type,
                        int64_t time_s);
/* A handler unscheduled the key's timer at `time_s` (-1: all its timers):
 * a deferred one leaves its defer queue too (a failed removal is logged:
 * that timer may still fire). */
void pr__df_unscheduled(part_t *part, const char *key, int64_t time_s);
/* Frees a partition's deferred keys (it is being freed). */
void pr__df_part_free(part_t *part);

/* The room a segment's name is given (pr__df_segment). */
#define PR_DF_SEG_MAX 1024

/* Writes `part`'s segment name (as the original names it) into `buf`. */
void pr__df_segment(const part_t *part, char *buf, size_t n);
/* A new deferred key of `kq`, retried at `retry_at_ms`; NULL: no memory. */
pr__dk_t *pr__df_dk_new(part_t *part, kq_t *kq, int kind, int64_t retry_at_ms);
/* A request about `key` of `part` (store or loader); NULL: no memory. */
pr__load_t *pr__df_req_new(const part_t *part, const char *key, int kind);
/* The assignment a request was made for while it is live, else NULL. */
part_t *pr__df_req_part(const pr__load_t *r);
/* The request's deferred key (its live assignment in *partp), or NULL. */
pr__dk_t *pr__df_req_dk(const pr__load_t *r, part_t **partp);
/* Forgets `dk` (its queue is empty), its retry timers and row; takes `r`. */
void pr__df_forget(part_t *part, pr__dk_t *dk, pr__load_t *r);

#endif /* PR_ENGINE_DEFER_H */
