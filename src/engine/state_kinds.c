/*
 * state_kinds.c - what each operation does to a value, a map and a deque,
 * in cells (the layout: state.c), step by step: each step reads at most
 * one cell or page and continues when it is there.
 *
 * Threads: the engine thread.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "state.h"

/* ---- the operations' steps ------------------------------------------------
 */

static const uint8_t KEYSET[1] = {0x02};
static const uint8_t OVERFLOWED[1] = {0x01};

static void answer_got(sop_t *op, const char *key, size_t key_len) {
  if ((op->got || key) &&
      pr__st_add_item(op, key, key_len, op->got, op->got_len)) {
    pr__st_sop_done(op, PROSODY_ERR_NOMEM, "out of memory");
    return;
  }
  pr__st_sop_done(op, PROSODY_OK, NULL);
}

static void put_bounds(sop_t *op) {
  uint8_t b[16];
  be64(b, (uint64_t)op->head);
  be64(b + 8, (uint64_t)op->tail);
  if (pr__st_ov_set(op->coll, 0, NULL, 0, b, sizeof(b), 1))
    op->err = PROSODY_ERR_NOMEM;
}

static int del_pos(sop_t *op, int64_t pos) {
  uint8_t k[8];
  pos_coord(k, pos);
  return pr__st_ov_set(op->coll, 1, k, sizeof(k), NULL, 0, 1);
}

static void value_step(sop_t *op) {
  switch (op->op) {
  case PROSODY_STATE_GET:
    if (op->stage++ == 0)
      pr__st_read_cell(op, 0, NULL, 0);
    else
      answer_got(op, NULL, 0);
    return;
  case PROSODY_STATE_SET:
    if (pr__st_ov_set(op->coll, 0, NULL, 0, (const uint8_t *)op->json,
                      op->json_len, 1)) {
      pr__st_sop_done(op, PROSODY_ERR_NOMEM, "out of memory");
      return;
    }
    pr__st_wrote(op);
    return;
  default: /* CLEAR */
    pr__st_clear_sections(op->coll, 0);
    pr__st_wrote(op);
    return;
  }
}

static void map_step(sop_t *op) {
  switch (op->op) {
  case PROSODY_STATE_GET:
  case PROSODY_STATE_CONTAINS:
    if (op->stage++ == 0) {
      pr__st_read_cell(op, 1, (const uint8_t *)op->key, op->key_len);
      return;
    }
    if (op->op == PROSODY_STATE_CONTAINS) {
      op->r.number = op->got != NULL;
      pr__st_sop_done(op, PROSODY_OK, NULL);
    } else {
      answer_got(op, NULL, 0);
    }
    return;
  case PROSODY_STATE_GET_MANY:
    if (op->stage++ > 0) {
      const char *k = op->keys[op->at];
      if (pr__st_add_item(op, k, strlen(k), op->got, op->got_len)) {
        pr__st_sop_done(op, PROSODY_ERR_NOMEM, "out of memory");
        return;
      }
      op->at++;
    }
    if (op->at == op->nkeys) {
      pr__st_sop_done(op, PROSODY_OK, NULL);
      return;
    }
    pr__st_read_cell(op, 1, (const uint8_t *)op->keys[op->at],
                     strlen(op->keys[op->at]));
    return;
  case PROSODY_STATE_SET:
    /* The original's ordered-scan index of the keys is marked overflowed,
     * which sends its scans to the entries themselves (we keep no index). */
    if (pr__st_ov_set(op->coll, 1, (const uint8_t *)op->key, op->key_len,
                      (const uint8_t *)op->json, op->json_len, 1) ||
        pr__st_ov_set(op->coll, 0, KEYSET, 1, OVERFLOWED, 1, 1)) {
      pr__st_sop_done(op, PROSODY_ERR_NOMEM, "out of memory");
      return;
    }
    pr__st_wrote(op);
    return;
  case PROSODY_STATE_REMOVE:
    /* The original's index of the keys, if it keeps one, would still name
     * the key: it is marked overflowed too. */
    if (pr__st_ov_set(op->coll, 1, (const uint8_t *)op->key, op->key_len, NULL,
                      0, 1) ||
        pr__st_ov_set(op->coll, 0, KEYSET, 1, OVERFLOWED, 1, 1)) {
      pr__st_sop_done(op, PROSODY_ERR_NOMEM, "out of memory");
      return;
    }
    pr__st_wrote(op);
    return;
  case PROSODY_STATE_CLEAR:
    pr__st_clear_sections(op->coll, 1);
    pr__st_wrote(op);
    return;
  default: /* SCAN */
    if (op->stage++ == 0) {
      op->scan_section = 1;
      op->scan_backward = op->backward;
      if (op->after) {
        op->scan_after = (uint8_t *)op->after;
        op->scan_after_len = op->after_len;
        op->after = NULL;
      }
      pr__st_read_range(op);
      return;
    }
    for (size_t i = 0; i < op->nrows && i < op->limit; i++)
      if (pr__st_add_item(op, op->rows[i].coord, op->rows[i].coord_len,
                          op->keys_only ? NULL : op->rows[i].data,
                          op->rows[i].data_len)) {
        pr__st_sop_done(op, PROSODY_ERR_NOMEM, "out of memory");
        return;
      }
    op->r.number = op->scan_end && op->nrows <= op->limit;
    pr__st_sop_done(op, PROSODY_OK, NULL);
    return;
  }
}

/* The deque's bounds from op->got; -1 (answered) when malformed. */
static int bounds(sop_t *op) {
  if (!op->got) {
    op->head = op->tail = 0;
    return 0;
  }
  if (op->got_len != 16) {
    pr__st_sop_done(
        op, PROSODY_ERR_PERMANENT,
        "keyed state: deque \"%s\" has malformed bounds (%zu bytes, "
        "want 16)",
        op->coll->name, op->got_len);
    return -1;
  }
  op->head = (int64_t)rd64(op->got);
  op->tail = (int64_t)rd64(op->got + 8);
  return 0;
}

static void deque_step(sop_t *op) {
  uint8_t k[8];
  int64_t len, pos, cap = op->capacity;
  if (op->op == PROSODY_STATE_CLEAR) {
    pr__st_clear_sections(op->coll, 1);
    pr__st_wrote(op);
    return;
  }
  if (op->stage == 0) { /* the bounds first */
    op->stage = 1;
    pr__st_read_cell(op, 0, NULL, 0);
    return;
  }
  if (op->stage == 1) {
    if (bounds(op))
      return;
    op->stage = 2;
  }
  len = op->tail - op->head;
  switch (op->op) {
  case PROSODY_STATE_LEN:
    op->r.number = len;
    pr__st_sop_done(op, PROSODY_OK, NULL);
    return;
  case PROSODY_STATE_PUSH_BACK:
  case PROSODY_STATE_PUSH_FRONT: {
    int back = op->op == PROSODY_STATE_PUSH_BACK;
    int64_t evict = 0;
    if (cap > 0 && len - (cap - 1) > 0)
      evict = len - (cap - 1) < EVICT_MAX ? len - (cap - 1) : EVICT_MAX;
    pos = back ? op->tail : op->head - 1;
    pos_coord(k, pos);
    if (pr__st_ov_set(op->coll, 1, k, sizeof(k), (const uint8_t *)op->json,
                      op->json_len, 1)) {
      pr__st_sop_done(op, PROSODY_ERR_NOMEM, "out of memory");
      return;
    }
    if (back)
      op->tail++;
    else
      op->head--;
    for (int64_t i = 0; i < evict; i++)
      if (del_pos(op, back ? op->head++ : --op->tail)) {
        pr__st_sop_done(op, PROSODY_ERR_NOMEM, "out of memory");
        return;
      }
    put_bounds(op);
    if (op->err) {
      pr__st_sop_done(op, PROSODY_ERR_NOMEM, "out of memory");
      return;
    }
    pr__st_wrote(op);
    return;
  }
  case PROSODY_STATE_POP_BACK:
  case PROSODY_STATE_POP_FRONT:
  case PROSODY_STATE_PEEK_BACK:
  case PROSODY_STATE_PEEK_FRONT:
  case PROSODY_STATE_GET: {
    int back =
        op->op == PROSODY_STATE_POP_BACK || op->op == PROSODY_STATE_PEEK_BACK;
    if (op->stage == 2) {
      if (op->op == PROSODY_STATE_GET)
        pos = op->index < 0 ? op->tail + op->index : op->head + op->index;
      else
        pos = back ? op->tail - 1 : op->head;
      if (len <= 0 || pos < op->head || pos >= op->tail) {
        pr__st_sop_done(op, PROSODY_OK, NULL); /* none */
        return;
      }
      op->pos = pos;
      op->stage = 3;
      pos_coord(k, pos);
      pr__st_read_cell(op, 1, k, sizeof(k));
      return;
    }
    if (op->op == PROSODY_STATE_POP_BACK || op->op == PROSODY_STATE_POP_FRONT) {
      if (del_pos(op, op->pos)) {
        pr__st_sop_done(op, PROSODY_ERR_NOMEM, "out of memory");
        return;
      }
      if (back)
        op->tail--;
      else
        op->head++;
      put_bounds(op);
      if (op->err ||
          ((op->got && pr__st_add_item(op, NULL, 0, op->got, op->got_len)))) {
        pr__st_sop_done(op, PROSODY_ERR_NOMEM, "out of memory");
        return;
      }
      pr__st_wrote(op);
      return;
    }
    answer_got(op, NULL, 0);
    return;
  }
  default: /* SCAN */
    if (op->stage == 2) {
      int64_t from;
      op->stage = 3;
      op->scan_section = 1;
      op->scan_backward = op->backward;
      if (op->after)
        from = op->after_pos; /* resume after this position */
      else
        from = op->backward ? op->tail - op->index : op->head + op->index - 1;
      if (!(op->scan_after = malloc(8))) {
        pr__st_sop_done(op, PROSODY_ERR_NOMEM, "out of memory");
        return;
      }
      pos_coord(op->scan_after, from);
      op->scan_after_len = 8;
      pr__st_read_range(op);
      return;
    }
    for (size_t i = 0; i < op->nrows && i < op->limit; i++) {
      char at[24];
      int n;
      if (op->rows[i].coord_len != 8)
        continue;
      pos = (int64_t)(rd64(op->rows[i].coord) ^ UINT64_C(0x8000000000000000));
      if (pos < op->head || pos >= op->tail)
        continue;
      n = snprintf(at, sizeof(at), "%" PRId64, pos);
      if (pr__st_add_item(op, at, (size_t)n, op->rows[i].data,
                          op->rows[i].data_len)) {
        pr__st_sop_done(op, PROSODY_ERR_NOMEM, "out of memory");
        return;
      }
    }
    op->r.number = op->scan_end && op->nrows <= op->limit;
    pr__st_sop_done(op, PROSODY_OK, NULL);
    return;
  }
}

void (*const pr__st_kind_step[3])(sop_t *op) = {
    [PROSODY_STATE_VALUE] = value_step,
    [PROSODY_STATE_MAP] = map_step,
    [PROSODY_STATE_DEQUE] = deque_step};
