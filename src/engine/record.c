/*
 * record.c - a record's bytes as the engine takes them, with no engine
 * state: the key check at intake, the copy into an invocation, the
 * payload's verdict at decode, and what the handler reads of it (the
 * prosody_message_* accessors), and its description for logs. The libFuzzer
 * target tests/fuzz/fuzz_record.c drives these functions with hostile records.
 *
 * Threads: the key check and the copy on the engine thread; the verdict
 * and the accessors on the handler's thread.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

const char *pr__record_check(const void *key, size_t key_len,
                             const void *payload, int excise_ok) {
  if (!key)
    return "no key";
  if (!pr__utf8_valid(key, key_len) || memchr(key, 0, key_len))
    return "key is not valid UTF-8 text";
  if (!payload && !excise_ok)
    return "no value (an excise record), which this handler does not take";
  return NULL;
}

/* The engine's free list (pr__inv_free puts them back), here so that
 * this file stands alone for its fuzz target. */
inv_t *pr__inv_alloc(pr__engine_t *eng, size_t room) {
  inv_t *inv = eng ? eng->inv_pool : NULL;
  size_t have;
  if (inv && inv->room >= room) { /* the engine thread's */
    eng->inv_pool = inv->next;
    eng->inv_pool_n--;
    have = inv->room;
  } else {
    have = (room + PR_INV_ROOM_STEP - 1) / PR_INV_ROOM_STEP * PR_INV_ROOM_STEP;
    if (!(inv = malloc(sizeof(*inv) + have)))
      return NULL;
  }
  memset(inv, 0, sizeof(*inv)); /* not the room: its user writes it */
  inv->room = have;
  return inv;
}

inv_t *pr__inv_message(part_t *part, const void *key, size_t key_len,
                       const void *payload, size_t len, int64_t offset,
                       int64_t timestamp) {
  /* One allocation: the inv, then its key and payload (NUL-terminated).
   * No payload: an excise record, whose payload is pr__no_value. */
  inv_t *inv;
  if (!payload)
    len = 0;
  if (!(inv = pr__inv_alloc(part->eng, key_len + len + 2)))
    return NULL;
  inv->eng = part->eng;
  inv->part = part;
  inv->msg.topic = part->topic;
  inv->msg.partition = part->partition;
  inv->msg.offset = offset;
  inv->msg.timestamp = timestamp;
  inv->inline_strings = 1;
  inv->msg.key = (char *)(inv + 1);
  memcpy(inv->msg.key, key, key_len);
  inv->msg.key[key_len] = '\0';
  if (payload) {
    inv->msg.payload = inv->msg.key + key_len + 1;
    memcpy(inv->msg.payload, payload, len);
    inv->msg.payload[len] = '\0';
  } else {
    inv->msg.payload = (char *)pr__no_value; /* never written */
  }
  inv->msg.payload_len = len;
  inv->unprepared = 1;
  return inv;
}

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

const char *pr__record_verdict(prosody_message_t *m, int json_state,
                               const char *group_id, const pr__value_t *allowed,
                               int *warn) {
  json_error_t jerr;
  int valid;
  const void *v;
  size_t len;
  *warn = 0;
  if (m->payload == pr__no_value) {
    /* An excise record: no JSON to judge, and the type filter lets it
     * through (it has no type); only the loop check below applies. */
    valid = 1;
  } else if (allowed->isset && allowed->list_n > 0) {
    /* The filter reads the payload's "type": parse it now. */
    m->json = json_loadb(m->payload, m->payload_len, JSON_DECODE_ANY, &jerr);
    valid = m->json != NULL;
  } else {
    /* Validated only: the tree is built if the handler asks for it
     * (prosody_message_json), at several times the cost. */
    valid = json_state ? json_state > 0
                       : pr__json_valid(m->payload, m->payload_len);
  }
  if (!valid) {
    *warn = 1;
    return "payload is not valid JSON";
  }
  if (m->headers &&
      !rd_kafka_header_get_last(m->headers, "source-system", &v, &len) &&
      len == strlen(group_id) && !memcmp(v, group_id, len))
    return "our own output";
  if (m->payload != pr__no_value && !pr__decode_allowed(allowed, m->json))
    return "event type not allowed";
  return NULL;
}

void pr__inv_shed(inv_t *inv, int keep_trace) {
  hdr_copy_t *h, *next;
  const void *v;
  size_t len;
  if (inv->msg.json)
    json_decref(inv->msg.json);
  inv->msg.json = NULL;
  /* Telemetry reports the trace context once the result is in. */
  if (inv->msg.headers &&
      !(keep_trace && inv->eng->tm &&
        !rd_kafka_header_get_last(inv->msg.headers, "traceparent", &v, &len))) {
    rd_kafka_headers_destroy(inv->msg.headers);
    inv->msg.headers = NULL;
  }
  for (h = inv->msg.hdr_copies; h; h = next) {
    next = h->next;
    free(h->name);
    free(h->value);
    free(h);
  }
  inv->msg.hdr_copies = NULL;
}

PROSODY_EXPORT const char *prosody_message_topic(const prosody_message_t *m) {
  return m->topic;
}

PROSODY_EXPORT int32_t prosody_message_partition(const prosody_message_t *m) {
  return m->partition;
}

PROSODY_EXPORT int64_t prosody_message_offset(const prosody_message_t *m) {
  return m->offset;
}

PROSODY_EXPORT int64_t prosody_message_timestamp(const prosody_message_t *m) {
  return m->timestamp;
}

PROSODY_EXPORT const char *prosody_message_key(const prosody_message_t *m) {
  return m->key;
}

PROSODY_EXPORT int prosody_message_is_excise(const prosody_message_t *m) {
  return m && m->payload == pr__no_value;
}

PROSODY_EXPORT const char *prosody_message_payload(const prosody_message_t *m) {
  return m->payload == pr__no_value ? NULL : m->payload;
}

PROSODY_EXPORT size_t prosody_message_payload_len(const prosody_message_t *m) {
  return m->payload_len;
}

/* The tree is built on first use (the payload was validated at decode),
 * on the asking thread; concurrent first calls agree on one tree. */
PROSODY_EXPORT const struct json_t *
prosody_message_json(const prosody_message_t *m) {
  prosody_message_t *mm = (prosody_message_t *)m;
  json_t *j, *none = NULL;
  if (!m)
    return NULL;
  j = __atomic_load_n(&mm->json, __ATOMIC_ACQUIRE);
  if (j || !m->payload || m->payload == pr__no_value)
    return j;
  if (!(j = json_loadb(m->payload, m->payload_len, JSON_DECODE_ANY, NULL)))
    return NULL;
  if (!__atomic_compare_exchange_n(&mm->json, &none, j, 0, __ATOMIC_ACQ_REL,
                                   __ATOMIC_ACQUIRE)) {
    json_decref(j);
    j = none;
  }
  return j;
}

/* prosody_message_header()'s copies. A lock in each message would cost
 * every record 40 bytes and a mutex's set-up; handlers ask for headers
 * far less often than records arrive, so messages share striped locks,
 * picked by the message's address. */
#define HDR_LOCKS 64
static pthread_mutex_t hdr_locks[HDR_LOCKS] = {[0 ... HDR_LOCKS - 1] =
                                                   PTHREAD_MUTEX_INITIALIZER};

static pthread_mutex_t *hdr_lock_of(const prosody_message_t *m) {
  return &hdr_locks[((uintptr_t)m * 0x9E3779B97F4A7C15u) >> 58];
}

PROSODY_EXPORT const char *prosody_message_header(const prosody_message_t *m,
                                                  const char *name) {
  prosody_message_t *mm = (prosody_message_t *)m;
  const void *v;
  size_t len;
  hdr_copy_t *h;
  const char *out = NULL;
  if (!m || !name || !m->headers ||
      rd_kafka_header_get_last(m->headers, name, &v, &len))
    return NULL;
  pthread_mutex_lock(hdr_lock_of(m));
  for (h = mm->hdr_copies; h; h = h->next)
    if (!strcmp(h->name, name)) {
      out = h->value;
      break;
    }
  if (!out && (h = calloc(1, sizeof(*h)))) {
    h->name = strdup(name);
    h->value = pr__strndup(v, len);
    if (h->name && h->value) {
      h->next = mm->hdr_copies;
      mm->hdr_copies = h;
      out = h->value;
    } else {
      free(h->name);
      free(h->value);
      free(h);
    }
  }
  pthread_mutex_unlock(hdr_lock_of(m));
  return out;
}

/* For logs (any thread holding the inv). */
const char *pr__inv_describe(const inv_t *inv, char *buf, size_t n) {
  snprintf(buf, n, "%s[%d] %s %lld key \"%.64s\"", inv->msg.topic,
           inv->msg.partition, inv->is_timer ? "timer" : "offset",
           (long long)(inv->is_timer ? inv->time_s : inv->msg.offset),
           inv->msg.key ? inv->msg.key : "");
  return buf;
}
