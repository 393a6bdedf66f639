/*
 * tracker.c - the offset tracker: a ring of taken offsets in order, each
 * with a done flag. Completing the head retires it and every done entry
 * after it, which moves the commit position; completing any other entry
 * only marks it. take is O(1) amortised; complete is O(1) when the
 * offsets taken are consecutive (Kafka's, but for gaps that compaction or
 * transaction markers leave), else O(log n) (binary search in the ordered
 * ring). The ring's capacity is a power of two.
 */
#include <stdlib.h>
#include <string.h>

#include "tracker.h"

void pr__tracker_init(pr__tracker_t *t) {
  memset(t, 0, sizeof(*t));
  t->last_taken = -1;
  t->commit = -1;
}

void pr__tracker_fini(pr__tracker_t *t) {
  free(t->offs);
  free(t->done);
  pr__tracker_init(t);
}

static size_t slot(const pr__tracker_t *t, size_t i) {
  return (t->head + i) & (t->cap - 1);
}

static int grow(pr__tracker_t *t) {
  size_t cap = t->cap ? t->cap * 2 : 64;
  int64_t *offs = malloc(cap * sizeof(*offs));
  unsigned char *done = malloc(cap);
  if (!offs || !done) {
    free(offs);
    free(done);
    return -1;
  }
  for (size_t i = 0; i < t->len; i++) {
    offs[i] = t->offs[slot(t, i)];
    done[i] = t->done[slot(t, i)];
  }
  free(t->offs);
  free(t->done);
  t->offs = offs;
  t->done = done;
  t->cap = cap;
  t->head = 0;
  return 0;
}

int pr__tracker_take(pr__tracker_t *t, int64_t offset) {
  if (offset <= t->last_taken)
    return 1;
  if (t->len == t->cap && grow(t))
    return -1;
  t->offs[slot(t, t->len)] = offset;
  t->done[slot(t, t->len)] = 0;
  t->len++;
  t->last_taken = offset;
  return 0;
}

int pr__tracker_complete(pr__tracker_t *t, int64_t offset) {
  size_t lo = 0, hi = t->len, i;
  int advanced = 0;
  if (t->len > 0 && offset >= t->offs[t->head] &&
      (uint64_t)(offset - t->offs[t->head]) < t->len &&
      t->offs[slot(t, (size_t)(offset - t->offs[t->head]))] == offset)
    lo = hi = (size_t)(offset - t->offs[t->head]); /* no gap before it */
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (t->offs[slot(t, mid)] < offset)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo >= t->len || t->offs[slot(t, lo)] != offset || t->done[slot(t, lo)])
    return -1;
  t->done[slot(t, lo)] = 1;
  t->completed++;
  while (t->len > 0 && t->done[t->head]) {
    i = t->head;
    t->commit = t->offs[i] + 1;
    t->head = (t->head + 1) & (t->cap - 1);
    t->len--;
    t->completed--;
    advanced = 1;
  }
  return advanced;
}

int64_t pr__tracker_oldest(const pr__tracker_t *t) {
  /* The head is never done: completing it retires it and every done
   * entry behind it. */
  return t->len > 0 ? t->offs[t->head] : -1;
}
