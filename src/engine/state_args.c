/*
 * state_args.c - keyed state's operations' arguments (pr__st_prepare):
 * checked against the collection's kind and payload (the operation exists
 * for the kind; a map key where one is needed; a JSON document of at most
 * 4 MiB, not a null, or a record for a message collection; GET_MANY's
 * keys; a deque scan's position) and copied into the operation, before it
 * is posted. Used by handlers' operations (state_ops.c) and published
 * reads (state_pub.c).
 *
 * Threads: the caller's (any thread); it touches only the operation being
 * prepared.
 */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "state.h"

static const char *op_name(int op) {
  static const char *const names[] = {
      "GET",      "GET_MANY",  "SET",       "REMOVE",
      "CLEAR",    "CONTAINS",  "PUSH_BACK", "PUSH_FRONT",
      "POP_BACK", "POP_FRONT", "PEEK_BACK", "PEEK_FRONT",
      "LEN",      "SCAN",      "COMMIT",    "ROLLBACK"};
  return op >= 0 && op <= PROSODY_STATE_ROLLBACK ? names[op] : "?";
}

static const char *kind_name(int kind) {
  return kind == PROSODY_STATE_VALUE ? "value"
         : kind == PROSODY_STATE_MAP ? "map"
                                     : "deque";
}

/* Which operations each kind has (bit per prosody_state_op_t). */
static int kind_has(int kind, int op) {
  unsigned common = 1u << PROSODY_STATE_CLEAR | 1u << PROSODY_STATE_COMMIT |
                    1u << PROSODY_STATE_ROLLBACK;
  unsigned value = common | 1u << PROSODY_STATE_GET | 1u << PROSODY_STATE_SET;
  unsigned map = common | 1u << PROSODY_STATE_GET |
                 1u << PROSODY_STATE_GET_MANY | 1u << PROSODY_STATE_SET |
                 1u << PROSODY_STATE_REMOVE | 1u << PROSODY_STATE_CONTAINS |
                 1u << PROSODY_STATE_SCAN;
  unsigned deque =
      common | 1u << PROSODY_STATE_GET | 1u << PROSODY_STATE_PUSH_BACK |
      1u << PROSODY_STATE_PUSH_FRONT | 1u << PROSODY_STATE_POP_BACK |
      1u << PROSODY_STATE_POP_FRONT | 1u << PROSODY_STATE_PEEK_BACK |
      1u << PROSODY_STATE_PEEK_FRONT | 1u << PROSODY_STATE_LEN |
      1u << PROSODY_STATE_SCAN;
  unsigned has = kind == PROSODY_STATE_VALUE ? value
                 : kind == PROSODY_STATE_MAP ? map
                                             : deque;
  return op >= 0 && op <= PROSODY_STATE_ROLLBACK && (has >> op & 1);
}

static char *dup_n(const char *p, size_t n) {
  char *d = malloc(n + 1);
  if (d) {
    memcpy(d, p, n);
    d[n] = 0;
  }
  return d;
}

/* Checks the arguments and copies them into `op`. */
prosody_err_t pr__st_prepare(sop_t *op, prosody_state_t *st, int kind_op,
                             const prosody_state_args_t *a, char *errstr,
                             size_t errstr_size) {
  static const prosody_state_args_t none = PROSODY_STATE_ARGS_INIT;
  int needs_key, needs_json;
  if (!st) {
    pr__errf(errstr, errstr_size, "keyed state: the handle is NULL");
    return PROSODY_ERR_INVALID_ARG;
  }
  if (!a)
    a = &none;
  if (!kind_has(st->kind, kind_op)) {
    pr__errf(errstr, errstr_size,
             "keyed state: a %s collection has no %s operation",
             kind_name(st->kind), op_name(kind_op));
    return PROSODY_ERR_INVALID_ARG;
  }
  op->ctx = st->ctx;
  op->def = st->def;
  op->kind = st->kind;
  op->payload = st->payload;
  op->op = kind_op;
  op->index = a->index;
  op->limit = a->limit ? a->limit : SCAN_DEFAULT;
  op->backward = a->backward != 0;
  op->keys_only = a->keys_only != 0;
  needs_key =
      st->kind == PROSODY_STATE_MAP &&
      (kind_op == PROSODY_STATE_GET || kind_op == PROSODY_STATE_SET ||
       kind_op == PROSODY_STATE_REMOVE || kind_op == PROSODY_STATE_CONTAINS);
  needs_json = kind_op == PROSODY_STATE_SET ||
               kind_op == PROSODY_STATE_PUSH_BACK ||
               kind_op == PROSODY_STATE_PUSH_FRONT;
  if (needs_key) {
    if (!a->key) {
      pr__errf(errstr, errstr_size, "keyed state: %s needs a map key",
               op_name(kind_op));
      return PROSODY_ERR_INVALID_ARG;
    }
    if (!(op->key = dup_n(a->key, a->key_len)))
      return PROSODY_ERR_NOMEM;
    op->key_len = a->key_len;
  }
  if (needs_json && st->payload == PROSODY_STATE_MESSAGE) {
    prosody_message_t named;
    if (!a->message && a->ref_topic) {
      if (a->ref_partition < 0 || a->ref_offset < 0) {
        pr__errf(errstr, errstr_size,
                 "keyed state: %s: a record's partition and offset are not "
                 "negative, got %d and %lld",
                 op_name(kind_op), (int)a->ref_partition,
                 (long long)a->ref_offset);
        return PROSODY_ERR_INVALID_ARG;
      }
      memset(&named, 0, sizeof(named));
      named.topic = a->ref_topic;
      named.partition = a->ref_partition;
      named.offset = a->ref_offset;
      if (pr__st_ref_encode(&named, &op->json, &op->json_len))
        return PROSODY_ERR_NOMEM;
    } else if (!a->message) {
      pr__errf(errstr, errstr_size,
               "keyed state: %s: expected a Kafka message; a JSON value "
               "cannot be stored in a message collection",
               op_name(kind_op));
      return PROSODY_ERR_INVALID_ARG;
    } else if (pr__st_ref_encode(a->message, &op->json, &op->json_len)) {
      return PROSODY_ERR_NOMEM;
    }
  } else if (needs_json) {
    json_error_t jerr;
    json_t *j;
    if (a->message || a->ref_topic) {
      pr__errf(errstr, errstr_size,
               "keyed state: %s: a Kafka message cannot be stored in a JSON "
               "collection; store its payload, or use a message collection",
               op_name(kind_op));
      return PROSODY_ERR_INVALID_ARG;
    }
    if (!a->json) {
      pr__errf(errstr, errstr_size,
               "keyed state: %s needs a JSON document; a null cannot be "
               "stored (use %s)",
               op_name(kind_op),
               st->kind == PROSODY_STATE_MAP ? "REMOVE" : "CLEAR");
      return PROSODY_ERR_INVALID_ARG;
    }
    if (a->json_len > PR_STATE_DOC_MAX) {
      pr__errf(errstr, errstr_size,
               "keyed state: %s: the document for \"%s\" is %zu bytes; a "
               "collection takes documents of at most %zu bytes (4 MiB)",
               op_name(kind_op), st->name, a->json_len, PR_STATE_DOC_MAX);
      return PROSODY_ERR_INVALID_ARG;
    }
    j = json_loadb(a->json, a->json_len, JSON_DECODE_ANY, &jerr);
    if (!j) {
      pr__errf(errstr, errstr_size,
               "keyed state: %s: not a JSON document: %s (at byte %d)",
               op_name(kind_op), jerr.text, jerr.position);
      return PROSODY_ERR_INVALID_ARG;
    }
    if (json_is_null(j)) {
      json_decref(j);
      pr__errf(errstr, errstr_size,
               "keyed state: a top-level null cannot be stored; use %s "
               "instead",
               st->kind == PROSODY_STATE_MAP ? "REMOVE" : "CLEAR");
      return PROSODY_ERR_INVALID_ARG;
    }
    json_decref(j);
    if (!(op->json = dup_n(a->json, a->json_len)))
      return PROSODY_ERR_NOMEM;
    op->json_len = a->json_len;
  }
  if (kind_op == PROSODY_STATE_GET_MANY) {
    if (a->nkeys && !a->keys) {
      pr__errf(errstr, errstr_size, "keyed state: GET_MANY: keys is NULL");
      return PROSODY_ERR_INVALID_ARG;
    }
    if (a->nkeys && !(op->keys = calloc(a->nkeys, sizeof(char *))))
      return PROSODY_ERR_NOMEM;
    op->nkeys = a->nkeys;
    for (size_t i = 0; i < a->nkeys; i++)
      if (!a->keys[i]) {
        pr__errf(errstr, errstr_size,
                 "keyed state: GET_MANY: keys[%zu] is NULL", i);
        return PROSODY_ERR_INVALID_ARG;
      } else if (!(op->keys[i] = strdup(a->keys[i]))) {
        return PROSODY_ERR_NOMEM;
      }
  }
  if (kind_op == PROSODY_STATE_SCAN && a->after) {
    if (st->kind == PROSODY_STATE_DEQUE) {
      char *end;
      char *txt = dup_n(a->after, a->after_len);
      if (!txt)
        return PROSODY_ERR_NOMEM;
      op->after_pos = strtoll(txt, &end, 10);
      if (!*txt || *end) {
        pr__errf(errstr, errstr_size,
                 "keyed state: a deque scan resumes after a position (the "
                 "key of an item it returned), got \"%s\"",
                 txt);
        free(txt);
        return PROSODY_ERR_INVALID_ARG;
      }
      op->after = txt;
    } else if (!(op->after = dup_n(a->after, a->after_len))) {
      return PROSODY_ERR_NOMEM;
    }
    op->after_len = a->after_len;
  }
  return PROSODY_OK;
}
