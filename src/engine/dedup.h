/*
 * dedup.h - the deduplication layer (dedup.c) as the rest of the engine
 * sees it: the states of an event's lookup and the calls of the files on
 * its data path (decode, dispatch, outcome, message, keyed state, the
 * defer layer). Each declaration names its thread.
 */
#ifndef PR_ENGINE_DEDUP_H
#define PR_ENGINE_DEDUP_H

#include "internal.h"

enum dd_state {
  DD_OFF,     /* not deduplicated (layer off, or a timer) */
  DD_PENDING, /* the store lookup is in flight */
  DD_UNSEEN,  /* not handled before (as of intake, or of pr__dd_prepare) */
  DD_SEEN,    /* handled before: skip it */
  DD_ERROR,   /* the lookup failed: ask again */
  DD_LATE,    /* no store: its id is read and looked up by the thread about
                 to run its first attempt (pr__dd_prepare) */
  DD_RECORDED /* recorded by the thread that gave its success (its completed
                 hook) */
};
enum dd_gate { DD_RUN, DD_SKIP, DD_WAIT };

/* An event's deduplication state (inv->ddx, which no other file reads).
 * `st` and `did` are written by the thread running the event while it runs
 * (DD_LATE: pr__dd_prepare and the completed hook), else by the engine
 * thread; the rest by the engine thread. */
typedef struct pr__dd_ev {
  pr__did_t did;          /* its id (st != DD_OFF) */
  struct pr__dd_req *req; /* the store lookup in flight, or NULL */
  int tries;              /* failed lookups in a row */
  uint8_t st;             /* enum dd_state */
  uint8_t waiting;        /* at its key's head, waiting for the lookup */
} pr__dd_ev_t;
_Static_assert(sizeof(pr__dd_ev_t) <= sizeof(((inv_t *)0)->ddx),
               "pr__dd_ev_t must fit struct inv's ddx");
#define DDX(inv) ((pr__dd_ev_t *)(void *)(inv)->ddx.bytes)

pr__did_t pr__dd_id(const char *version, const char *group, const char *topic,
                    int32_t partition, const char *key, const char *id,
                    size_t id_len, int64_t offset);
/* Right before a message's first attempt (the thread about to run it):
 * when DD_LATE, reads its id and looks it up; 1 when it is a duplicate
 * (DD_SEEN), else 0. */
int pr__dd_prepare(inv_t *inv);
/* The event leaves its key's head to be deferred: a lookup's answer no
 * longer schedules it (engine thread). */
void pr__dd_unwait(inv_t *inv);
/* Is deduplication on (pipeline mode, idempotence_cache_size > 0)? Any
 * thread once the layer is open. */
int pr__dd_on(const pr__engine_t *eng);
/* How long a handled id is remembered (idempotence_ttl; 0: the layer is
 * off). */
int64_t pr__dd_ttl_s(const pr__engine_t *eng);
/* The id that keyed state stores with a successful event's state, in the
 * same batch (the layer on Cassandra and the event not a known duplicate),
 * else NULL (engine thread). */
const pr__did_t *pr__dd_stored_id(const inv_t *inv);

#endif /* PR_ENGINE_DEDUP_H */
