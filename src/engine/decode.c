/*
 * decode.c - the payload's JSON and the filters (source-system loop
 * prevention, allowed_events), applied right before the first attempt on
 * the thread about to run the handler, so the engine thread (the serial
 * part of the pipeline) does not parse.
 *
 * Threads: the handler's thread (a worker for synchronous handlers).
 */
#include <string.h>

#include "internal.h"

int pr__decode_allowed(const pr__value_t *list, json_t *json) {
  json_t *type;
  const char *t;
  if (!list->isset || list->list_n == 0)
    return 1;
  type = json_is_object(json) ? json_object_get(json, "type") : NULL;
  if (!type || !json_is_string(type))
    return 1; /* no type: processed */
  t = json_string_value(type);
  for (size_t i = 0; i < list->list_n; i++)
    if (!strncmp(t, list->list[i], strlen(list->list[i])))
      return 1;
  return 0;
}

/* Decodes the payload and applies the filters, on the thread about to run
 * the handler (a worker for synchronous handlers), so the engine thread
 * does not spend its time parsing JSON. Sets inv->skip for a record that
 * is undecodable or filtered: the engine then commits past it without
 * running the handler. Reads only the inv and immutable engine fields. */
void pr__decode_prepare(inv_t *inv) {
  pr__engine_t *eng = inv->eng;
  rd_kafka_headers_t *hdrs;
  const pr__value_t *allowed = &PR_CFG(eng->st, ALLOWED_EVENTS);
  json_error_t jerr;
  int valid;
  const void *v;
  size_t len;
  inv->unprepared = 0;
  pr__inv_release_rkm(inv);
  hdrs = inv->msg.headers;
  if (allowed->isset && allowed->list_n > 0) {
    /* The filter reads the payload's "type": parse it now. */
    inv->msg.json = json_loadb(inv->msg.payload, inv->msg.payload_len,
                               JSON_DECODE_ANY, &jerr);
    valid = inv->msg.json != NULL;
  } else {
    /* Validated only: the tree is built if the handler asks for it
     * (prosody_message_json), at several times the cost. */
    valid = inv->json_state
                ? inv->json_state > 0
                : pr__json_valid(inv->msg.payload, inv->msg.payload_len);
  }
  if (!valid) {
    inv->skip = "payload is not valid JSON";
    inv->skip_warn = 1;
  } else if (hdrs &&
             !rd_kafka_header_get_last(hdrs, "source-system", &v, &len) &&
             len == strlen(eng->group_id) && !memcmp(v, eng->group_id, len)) {
    inv->skip = "our own output";
  } else if (!pr__decode_allowed(allowed, inv->msg.json)) {
    inv->skip = "event type not allowed";
  }
}
