/*
 * fuzz_record.c - libFuzzer target for the record intake path: a record's
 * key, headers and payload bytes as librdkafka hands them over, through
 * what the engine does before a handler sees it (src/engine/record.c:
 * the key check of intake, the copy into an invocation, decode's verdict,
 * and the prosody_message_* accessors a handler calls).
 *
 * Input (readable, so seeds are text files: tests/data/record/):
 *
 *   FLAGS\n          letters: k no key, p no payload (tombstone),
 *                    a allowed_events "order.,user" set, e set but empty,
 *                    h headers present even if none follow, x the
 *                    handler takes excise records
 *   KEY\n            %XX escapes a byte (%00, %0a, %ff)
 *   NAME:VALUE\n     a header, escaped the same way; NAME alone: a
 *   ...              header with no value (a NULL value)
 *   \n               the end of the headers
 *   PAYLOAD          every byte to the end, unescaped
 *
 * Checked, beyond no crash and no sanitizer report: a record passes the
 * key check only with a key (a whole C string: no NUL byte inside) and a
 * payload, or none when the handler takes excise records (no
 * payload, no tree, never filtered by type); the handler sees the exact
 * key and payload bytes, each NUL-terminated; a message its handler sees
 * has a JSON tree; each header
 * it looks up reads as librdkafka's last value of that name (up to a NUL
 * byte), the same pointer each time, and a name not sent (or one that
 * librdkafka cannot find: it holds a NUL byte) reads as NULL.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/internal.h"

#define GROUP "fuzz-group"

static int hexval(uint8_t c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f')
    return (c | 0x20) - 'a' + 10;
  return -1;
}

/* Reads one line of `d` from *pos (to '\n' or the end), unescaping %XX,
 * into a new buffer; NULL at the end of the input or out of memory. */
static char *line(const uint8_t *d, size_t n, size_t *pos, size_t *len) {
  size_t i = *pos, o = 0;
  char *out;
  if (i >= n || !(out = malloc(n - i + 1)))
    return NULL;
  while (i < n && d[i] != '\n') {
    if (d[i] == '%' && i + 2 < n && hexval(d[i + 1]) >= 0 &&
        hexval(d[i + 2]) >= 0) {
      out[o++] = (char)(hexval(d[i + 1]) << 4 | hexval(d[i + 2]));
      i += 3;
    } else
      out[o++] = (char)d[i++];
  }
  out[o] = '\0';
  *pos = i < n ? i + 1 : i;
  *len = o;
  return out;
}

/* The handler's view of every header name sent, and of one never sent. */
static void check_headers(const prosody_message_t *m,
                          const rd_kafka_headers_t *sent) {
  const char *name;
  const void *v;
  size_t len;
  for (size_t i = 0; !rd_kafka_header_get_all(sent, i, &name, &v, &len); i++) {
    const char *got = prosody_message_header(m, name), *want;
    const void *last;
    size_t last_len;
    /* librdkafka finds no name holding a NUL byte: nor may we */
    if (rd_kafka_header_get_last(sent, name, &last, &last_len)) {
      if (got)
        abort();
      continue;
    }
    if (!got)
      abort(); /* sent: must be found */
    want = last;
    if (strlen(got) > last_len ||
        (last_len && memcmp(got, want, strlen(got))) ||
        (strlen(got) < last_len && ((const char *)want)[strlen(got)]))
      abort(); /* not the last value, up to its first NUL byte */
    if (prosody_message_header(m, name) != got)
      abort(); /* one copy per name */
  }
  if ((rd_kafka_header_get_last(sent, "x-never-sent", &v, &len) &&
       prosody_message_header(m, "x-never-sent")) ||
      prosody_message_header(m, NULL))
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  size_t pos = 0, flags_len = 0, key_len = 0, n, vn;
  char *flags = line(data, size, &pos, &flags_len), *key, *h;
  char *allowed_list[] = {"order.", "user"};
  pr__value_t allowed = {0};
  rd_kafka_headers_t *hdrs = NULL;
  const void *payload, *v;
  size_t len;
  const char *why, *skip;
  struct part part = {0};
  inv_t *inv;
  int warn, excise_ok;

  if (!flags)
    return 0;
  key = line(data, size, &pos, &key_len);
  if (strchr(flags, 'a')) {
    allowed.isset = 1;
    allowed.list = allowed_list;
    allowed.list_n = 2;
  } else if (strchr(flags, 'e'))
    allowed.isset = 1;
  while ((h = line(data, size, &pos, &n)) && n > 0) {
    char *colon = memchr(h, ':', n);
    if (!hdrs)
      hdrs = rd_kafka_headers_new(4);
    if (colon)
      rd_kafka_header_add(hdrs, h, colon - h, colon + 1, n - (colon - h) - 1);
    else
      rd_kafka_header_add(hdrs, h, n, NULL, 0);
    free(h);
  }
  free(h);
  if (!hdrs && strchr(flags, 'h'))
    hdrs = rd_kafka_headers_new(0);
  payload = strchr(flags, 'p') ? NULL : data + pos;
  len = payload ? size - pos : 0;
  if (strchr(flags, 'k') && key) {
    free(key);
    key = NULL, key_len = 0;
  }

  /* intake: checked, then copied into an invocation (as the engine does) */
  excise_ok = strchr(flags, 'x') != NULL;
  why = pr__record_check(key, key_len, payload, excise_ok);
  if (!why && (!key || (!payload && !excise_ok) || memchr(key, 0, key_len)))
    abort();
  if (why && key && (payload || excise_ok) && !memchr(key, 0, key_len) &&
      strcmp(why, "key is not valid UTF-8 text"))
    abort();
  if (why)
    goto out;
  part.topic = "fuzz";
  part.partition = 3;
  if (!(inv = pr__inv_message(&part, key, key_len, payload, len, 42, -1)))
    goto out;
  inv->msg.headers = hdrs ? rd_kafka_headers_copy(hdrs) : NULL;
  if (strlen(prosody_message_key(&inv->msg)) != key_len ||
      memcmp(prosody_message_key(&inv->msg), key, key_len) ||
      prosody_message_payload_len(&inv->msg) != len ||
      prosody_message_is_excise(&inv->msg) != !payload ||
      (payload && (memcmp(prosody_message_payload(&inv->msg), payload, len) ||
                   prosody_message_payload(&inv->msg)[len])) ||
      (!payload && prosody_message_payload(&inv->msg)) ||
      strcmp(prosody_message_topic(&inv->msg), "fuzz") ||
      prosody_message_partition(&inv->msg) != 3 ||
      prosody_message_offset(&inv->msg) != 42)
    abort();

  /* decode: the verdict; a record that reaches its handler has a tree */
  skip = pr__record_verdict(&inv->msg, 0, GROUP, &allowed, &warn);
  if (warn != (skip && !strcmp(skip, "payload is not valid JSON")))
    abort();
  if (!payload && skip && strcmp(skip, "our own output"))
    abort(); /* an excise record is filtered only as our own output */
  if (!skip && !payload && prosody_message_json(&inv->msg))
    abort();
  if (!skip && payload) {
    const json_t *j = prosody_message_json(&inv->msg);
    if (!j || prosody_message_json(&inv->msg) != j)
      abort();
  }
  if (!skip && hdrs &&
      !rd_kafka_header_get_last(hdrs, "source-system", &v, &vn) &&
      vn == strlen(GROUP) && !memcmp(v, GROUP, vn))
    abort(); /* our own output reached the handler */

  /* the handler: every header it can ask for */
  if (inv->msg.headers)
    check_headers(&inv->msg, hdrs);
  else if (prosody_message_header(&inv->msg, "source-system"))
    abort();
  pr__inv_shed(inv, 0);
  free(inv);
out:
  if (hdrs)
    rd_kafka_headers_destroy(hdrs);
  free(key);
  free(flags);
  return 0;
}
