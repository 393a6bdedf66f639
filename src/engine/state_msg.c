/*
 * state_msg.c - keyed state's MESSAGE collections: a cell holds a reference
 * to a Kafka record, the original's MessagePack map {"topic": str,
 * "partition": int, "offset": int} (in that order, each integer in its
 * smallest form), and reading one loads the record again through the
 * engine's loader (loader.c) into a prosody_message_t of its own.
 *
 * An operation of a MESSAGE collection runs as for JSON, with the
 * reference as its document; before it is answered, pr__st_resolve() loads
 * each item's record in turn (one load in flight per operation) and puts
 * it in the item's `message` (its `json` cleared).
 *
 * Threads: the engine thread; pr__st_message_free() any.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "state.h"

/* ---- the reference ------------------------------------------------------ */

static uint8_t *put_str(uint8_t *o, const char *s, size_t n) {
  if (n < 32) {
    *o++ = (uint8_t)(0xa0 | n);
  } else if (n < 256) {
    *o++ = 0xd9;
    *o++ = (uint8_t)n;
  } else if (n < 65536) {
    *o++ = 0xda;
    *o++ = (uint8_t)(n >> 8);
    *o++ = (uint8_t)n;
  } else {
    *o++ = 0xdb;
    for (int i = 3; i >= 0; i--)
      *o++ = (uint8_t)(n >> (8 * i));
  }
  memcpy(o, s, n);
  return o + n;
}

static uint8_t *put_be(uint8_t *o, uint8_t tag, uint64_t v, int bytes) {
  *o++ = tag;
  for (int i = bytes - 1; i >= 0; i--)
    *o++ = (uint8_t)(v >> (8 * i));
  return o;
}

/* An integer in its smallest form, as rmp's write_sint does. */
static uint8_t *put_int(uint8_t *o, int64_t v) {
  if (v >= 0) {
    uint64_t u = (uint64_t)v;
    if (u < 128) {
      *o++ = (uint8_t)u;
      return o;
    }
    return u < 256          ? put_be(o, 0xcc, u, 1)
           : u < 65536      ? put_be(o, 0xcd, u, 2)
           : u < 1ull << 32 ? put_be(o, 0xce, u, 4)
                            : put_be(o, 0xcf, u, 8);
  }
  if (v >= -32) {
    *o++ = (uint8_t)(int8_t)v;
    return o;
  }
  return v >= -128        ? put_be(o, 0xd0, (uint64_t)v, 1)
         : v >= -32768    ? put_be(o, 0xd1, (uint64_t)v, 2)
         : v >= INT32_MIN ? put_be(o, 0xd2, (uint64_t)v, 4)
                          : put_be(o, 0xd3, (uint64_t)v, 8);
}

int pr__st_ref_encode(const prosody_message_t *m, char **out, size_t *len) {
  size_t tl = strlen(m->topic);
  uint8_t *buf = malloc(tl + 64), *o = buf;
  if (!buf)
    return -1;
  *o++ = 0x83;
  o = put_str(o, "topic", 5);
  o = put_str(o, m->topic, tl);
  o = put_str(o, "partition", 9);
  o = put_int(o, m->partition);
  o = put_str(o, "offset", 6);
  o = put_int(o, m->offset);
  *out = (char *)buf;
  *len = (size_t)(o - buf);
  return 0;
}

typedef struct rd {
  const uint8_t *p, *end;
} rd_t;

static int get_be(rd_t *r, int bytes, uint64_t *v) {
  if (r->end - r->p < bytes)
    return -1;
  *v = 0;
  for (int i = 0; i < bytes; i++)
    *v = *v << 8 | *r->p++;
  return 0;
}

static int get_str(rd_t *r, const uint8_t **s, size_t *n) {
  uint64_t len;
  uint8_t t;
  if (r->p >= r->end)
    return -1;
  t = *r->p++;
  if ((t & 0xe0) == 0xa0)
    len = t & 0x1f;
  else if (t == 0xd9   ? get_be(r, 1, &len)
           : t == 0xda ? get_be(r, 2, &len)
           : t == 0xdb ? get_be(r, 4, &len)
                       : -1)
    return -1;
  if ((uint64_t)(r->end - r->p) < len)
    return -1;
  *s = r->p;
  *n = (size_t)len;
  r->p += len;
  return 0;
}

static int get_int(rd_t *r, int64_t *v) {
  uint64_t u;
  uint8_t t;
  if (r->p >= r->end)
    return -1;
  t = *r->p++;
  if (t < 0x80 || t >= 0xe0) {
    *v = (int8_t)t;
    if (t < 0x80)
      *v = t;
    return 0;
  }
  switch (t) {
  case 0xcc:
  case 0xcd:
  case 0xce:
  case 0xcf:
    if (get_be(r, 1 << (t - 0xcc), &u) || u > INT64_MAX)
      return -1;
    *v = (int64_t)u;
    return 0;
  case 0xd0:
    if (get_be(r, 1, &u))
      return -1;
    *v = (int8_t)u;
    return 0;
  case 0xd1:
    if (get_be(r, 2, &u))
      return -1;
    *v = (int16_t)u;
    return 0;
  case 0xd2:
    if (get_be(r, 4, &u))
      return -1;
    *v = (int32_t)u;
    return 0;
  case 0xd3:
    if (get_be(r, 8, &u))
      return -1;
    *v = (int64_t)u;
    return 0;
  default:
    return -1;
  }
}

int pr__st_ref_decode(const uint8_t *p, size_t n, char **topic,
                      int32_t *partition, int64_t *offset) {
  rd_t r = {p, p + n};
  int have = 0, entries;
  *topic = NULL;
  if (n < 1 || (p[0] & 0xf0) != 0x80)
    return -1;
  entries = *r.p++ & 0x0f;
  for (int i = 0; i < entries; i++) {
    const uint8_t *k, *s;
    size_t kl, sl;
    int64_t v;
    if (get_str(&r, &k, &kl))
      goto bad;
    if (kl == 5 && !memcmp(k, "topic", 5)) {
      if (get_str(&r, &s, &sl) || *topic || !(*topic = malloc(sl + 1)))
        goto bad;
      memcpy(*topic, s, sl);
      (*topic)[sl] = 0;
      have |= 1;
    } else if (kl == 9 && !memcmp(k, "partition", 9)) {
      if (get_int(&r, &v) || v < 0 || v > INT32_MAX)
        goto bad;
      *partition = (int32_t)v;
      have |= 2;
    } else if (kl == 6 && !memcmp(k, "offset", 6)) {
      if (get_int(&r, &v) || v < 0)
        goto bad;
      *offset = v;
      have |= 4;
    } else {
      goto bad;
    }
  }
  if (have == 7)
    return 0;
bad:
  free(*topic);
  *topic = NULL;
  return -1;
}

/* ---- a record of its own --------------------------------------------------
 */

/* A message owning copies of the record's parts; NULL when out of memory. */
static prosody_message_t *message_of(const rd_kafka_message_t *rkm) {
  const char *topic = rd_kafka_topic_name(rkm->rkt);
  size_t tl = strlen(topic) + 1;
  prosody_message_t *m = calloc(1, sizeof(*m) + tl);
  rd_kafka_headers_t *h = NULL;
  if (!m)
    return NULL;
  m->topic = memcpy((char *)(m + 1), topic, tl);
  m->partition = rkm->partition;
  m->offset = rkm->offset;
  m->timestamp = rd_kafka_message_timestamp(rkm, NULL);
  m->key = malloc(rkm->key_len + 1);
  if (m->key) {
    if (rkm->key_len)
      memcpy(m->key, rkm->key, rkm->key_len);
    m->key[rkm->key_len] = 0;
  }
  if (!rkm->payload) {
    m->payload = (char *)pr__no_value;
  } else if ((m->payload = malloc(rkm->len + 1))) {
    memcpy(m->payload, rkm->payload, rkm->len);
    m->payload[rkm->len] = 0;
    m->payload_len = rkm->len;
  }
  if (!rd_kafka_message_headers(rkm, &h) && h)
    m->headers = rd_kafka_headers_copy(h);
  if (!m->key || !m->payload) {
    pr__st_message_free(m);
    return NULL;
  }
  return m;
}

void pr__st_message_free(prosody_message_t *m) {
  hdr_copy_t *h, *next;
  if (!m)
    return;
  free(m->key);
  if (m->payload != pr__no_value)
    free(m->payload);
  if (m->json)
    json_decref(m->json);
  if (m->headers)
    rd_kafka_headers_destroy(m->headers);
  for (h = m->hdr_copies; h; h = next) {
    next = h->next;
    free(h->name);
    free(h->value);
    free(h);
  }
  free(m);
}

/* ---- loading the items' records ------------------------------------------ */

typedef struct sload {
  pr__load_t r; /* first: pr__load_free frees the whole */
  sop_t *op;
} sload_t;

static void load_next(sop_t *op);

static void loaded(pr__mail_t *mail, void *owner) {
  sload_t *l = PR_CONTAINER_OF(mail, sload_t, r.mail);
  sop_t *op = l->op;
  prosody_state_item_t *it = &op->r.items[op->at];
  (void)owner;
  if (l->r.error || l->r.gone || !l->r.rkm) {
    prosody_err_t err =
        l->r.gone ? PROSODY_ERR_PERMANENT : PROSODY_ERR_TRANSIENT;
    char why[512];
    snprintf(why, sizeof(why),
             "keyed state: loading the record %s[%d]@%lld of \"%s\" failed: %s",
             l->r.topic, (int)l->r.partition, (long long)l->r.offset,
             op->coll ? op->coll->name : "?",
             l->r.gone    ? "Kafka no longer has it (retention or compaction "
                            "removed it)"
             : l->r.error ? l->r.error
                          : "no record");
    pr__load_free(&l->r);
    op->resolved(op, err, "%s", why);
    return;
  }
  it->message = message_of(l->r.rkm);
  pr__load_free(&l->r);
  if (!it->message) {
    op->resolved(op, PROSODY_ERR_NOMEM, "out of memory");
    return;
  }
  free((char *)it->json);
  it->json = NULL;
  it->json_len = 0;
  op->at++;
  load_next(op);
}

static void load_next(sop_t *op) {
  pr__engine_t *eng = op->eng;
  char *topic;
  int32_t partition = 0;
  int64_t offset = 0;
  sload_t *l;
  size_t tl, kl;
  while (op->at < op->r.n && !op->r.items[op->at].json)
    op->at++;
  if (op->at == op->r.n) {
    op->resolved(op, PROSODY_OK, NULL);
    return;
  }
  if (pr__st_ref_decode((const uint8_t *)op->r.items[op->at].json,
                        op->r.items[op->at].json_len, &topic, &partition,
                        &offset)) {
    op->resolved(op, PROSODY_ERR_PERMANENT,
                 "keyed state: \"%s\" holds a malformed record reference",
                 op->coll->name);
    return;
  }
  if (!eng->loader && !(eng->loader = pr__loader_new(eng, eng->bootstrap))) {
    free(topic);
    op->resolved(op, PROSODY_ERR_TRANSIENT,
                 "keyed state: could not start the record loader");
    return;
  }
  tl = strlen(topic) + 1;
  kl = strlen(op->stx->key) + 1;
  if (!(l = calloc(1, sizeof(*l) + tl + kl))) {
    free(topic);
    op->resolved(op, PROSODY_ERR_NOMEM, "out of memory");
    return;
  }
  l->op = op;
  l->r.eng = eng;
  l->r.answered = loaded;
  l->r.partition = partition;
  l->r.offset = offset;
  l->r.topic = (char *)(l + 1);
  memcpy(l->r.topic, topic, tl);
  l->r.key = l->r.topic + tl;
  memcpy(l->r.key, op->stx->key, kl);
  free(topic);
  pr__loader_post(eng->loader, &l->r);
}

void pr__st_resolve(sop_t *op, pr__st_answer_fn then) {
  op->resolving = 1;
  op->resolved = then;
  op->at = 0;
  load_next(op);
}
