/*
 * backpressure.c - per-partition backpressure: when a partition stops
 * being read and when it is read again.
 *
 * Threads: the engine thread (the predicates are pure).
 */
#include "internal.h"

/* At the limit: max_uncommitted unfinished events (messages and timers),
 * or the offset window full. */
int pr__bp_over(int invs, size_t window, int max_uncommitted) {
  return invs >= max_uncommitted ||
         window >= (size_t)max_uncommitted * PR_WINDOW_FACTOR;
}

/* Back at half of both. */
int pr__bp_under_half(int invs, size_t window, int max_uncommitted) {
  return invs <= max_uncommitted / 2 &&
         window <= (size_t)max_uncommitted * PR_WINDOW_FACTOR / 2;
}

/* Backpressure, per partition: at the limit the partition stops (its
 * queue is not read, its timers do not fire); at half of it, it is read
 * again. Other partitions are not affected: their records arrive on
 * queues of their own. A partition stopped for PR_BP_PAUSE_AFTER_NS is
 * also paused in librdkafka (pr__bp_tick), which empties its fetch queue
 * and stops prefetching it, so memory levels off behind a key that stays
 * stuck; released, it is resumed and read from the first record not yet
 * taken. Not at once: a partition that stops and starts many times a
 * second would throw its prefetched records away and fetch them again
 * each time (measured: pausing at once made the poison test's recovery of
 * 2 500 records at max_uncommitted 16 take over a minute instead of
 * seconds). A partition that stops and is read again within 100 ms is
 * not paused. */
void pr__bp_check(pr__engine_t *eng, part_t *part) {
  PR_ENGINE_THREAD(eng);
  /* Half way to its offset window's limit, a partition's waiting events
   * go first in the scheduler (holding a key back would soon hold the
   * partition back). Not by its unfinished events: every delivery burst
   * fills those to max_uncommitted, so that made nearly every partition
   * urgent at once and the boost meant nothing (bench_hotkey: the hot
   * key's partition fell behind, p99 3x the others'). */
  int pressed =
      part->tracker.len * 2 >= (size_t)eng->max_uncommitted * PR_WINDOW_FACTOR;
  if (pressed != part->pressed) {
    part->pressed = pressed;
    if (pressed)
      pr__sched_rekey_soon(&eng->sched);
  }
  if (!part->stopped &&
      pr__bp_over(part->invs, part->tracker.len, eng->max_uncommitted)) {
    part->stopped = 1;
    part->stopped_ns = pr__now_ns();
    PR_DEBUG("engine",
             "backpressure: %s[%d] has %d unfinished events, %zu uncommitted "
             "offsets",
             part->topic, part->partition, part->invs, part->tracker.len);
  } else if (part->stopped && pr__bp_under_half(part->invs, part->tracker.len,
                                                eng->max_uncommitted)) {
    part->stopped = 0;
    pr__part_pause(eng, part, 0);
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

void pr__bp_tick(pr__engine_t *eng) {
  PR_ENGINE_THREAD(eng);
  int64_t now = pr__now_ns();
  for (part_t *part = eng->parts; part; part = part->next)
    if (part->stopped && !part->paused &&
        now - part->stopped_ns >= PR_BP_PAUSE_AFTER_NS) {
      PR_DEBUG("engine", "backpressure: pausing %s[%d] (stopped for %lld ms)",
               part->topic, part->partition,
               (long long)((now - part->stopped_ns) / 1000000));
      pr__part_pause(eng, part, 1);
    } else if (!part->stopped && part->paused) {
      pr__part_pause(eng, part, 0); /* a resume that failed: again */
    }
}
