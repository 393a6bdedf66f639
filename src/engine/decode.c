/*
 * decode.c - the payload's JSON and the filters (source-system loop
 * prevention, allowed_events), applied right before the first attempt on
 * the thread about to run the handler, so the engine thread (the serial
 * part of the pipeline) does not parse.
 *
 * Threads: the handler's thread (a worker for synchronous handlers).
 */
#include <string.h>

#include "dedup.h"
#include "internal.h"

/* Decodes the payload and applies the filters, on the thread about to run
 * the handler (a worker for synchronous handlers), so the engine thread
 * does not spend its time parsing JSON; first, without a dedup store, the
 * dedup lookup (pr__dd_prepare). Sets inv->skip for a record that is a
 * duplicate, undecodable or filtered: the engine then commits past it without
 * running the handler (the verdict: pr__record_verdict() in record.c).
 * Reads only the inv and immutable engine fields. */
void pr__decode_prepare(inv_t *inv) {
  pr__engine_t *eng = inv->eng;
  int warn = 0;
  inv->unprepared = 0;
  pr__inv_release_rkm(inv);
  if (pr__dd_prepare(inv)) {
    inv->skip = "a duplicate of one already handled";
    inv->skip_dup = 1;
    return;
  }
  inv->skip = pr__record_verdict(&inv->msg, inv->json_state, eng->group_id,
                                 &PR_CFG(eng->st, ALLOWED_EVENTS), &warn);
  inv->skip_warn = (uint8_t)warn;
}
