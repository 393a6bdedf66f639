/*
 * tracker.h - per-partition offset tracker (private).
 *
 * Offsets are taken in increasing order as records arrive and completed in
 * any order. The commit position is watermark + 1, where the watermark is
 * the highest offset such that every taken offset at or below it has
 * completed. Owned by the engine thread (one tracker per partition).
 */
#ifndef PR_TRACKER_H
#define PR_TRACKER_H

#include <stddef.h>
#include <stdint.h>

typedef struct pr__tracker {
  int64_t *offs;       /* ring of taken, not yet retired offsets */
  unsigned char *done; /* parallel ring: completed? */
  size_t cap, head, len;
  size_t completed;   /* entries in the ring marked done */
  int64_t last_taken; /* highest offset taken, -1 if none */
  int64_t commit;     /* next offset to commit (watermark + 1), -1 none */
} pr__tracker_t;

void pr__tracker_init(pr__tracker_t *t);
void pr__tracker_fini(pr__tracker_t *t);
/* Takes `offset`. Returns 0, 1 if it is not above the last taken offset
 * (a redelivery: ignore the record), -1 when out of memory. */
int pr__tracker_take(pr__tracker_t *t, int64_t offset);
/* Completes a taken offset. Returns 1 if the commit position advanced, 0 if
 * not, -1 if the offset is not pending. */
int pr__tracker_complete(pr__tracker_t *t, int64_t offset);
/* The oldest pending offset, or -1. */
int64_t pr__tracker_oldest(const pr__tracker_t *t);

#endif /* PR_TRACKER_H */
