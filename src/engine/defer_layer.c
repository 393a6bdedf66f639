/*
 * defer_layer.c - the defer layer's frame (defer.c and defer_retry.c hold
 * its state machine): the failure rate that gates deferral, the deferred
 * messages kept in memory for their retries (defer_cache_size), opening and
 * closing the layer's stores, and its hooks (layer.h).
 *
 * Threads: the engine thread only (open: the thread that owns the engine
 * before it starts).
 */
#include <stdlib.h>
#include <string.h>

#include "dedup.h"
#include "defer.h"
#include "internal.h"

/* The failure-rate window, in buckets. */
#define PR_DF_BUCKETS 60

/* The layer's state (eng->df): made by its open hook when the layer is on
 * (pipeline mode, defer_enabled), freed by its close(final 1); eng->df
 * NULL: the layer is off. The engine thread's (written by the engine's
 * owner while the layer opens). */
struct pr__df_state {
  pr__defer_t *store[2]; /* per pr__defer_kind_t; NULL: that kind is not
                            deferred (no store, or closed) */
  int refuse_rows;       /* test option: key-row writes that fail */
  int64_t bucket_ns;     /* the failure window's bucket width */
  int64_t epoch;         /* the current bucket (now / bucket_ns), which
                            counts in ok/fail[epoch % PR_DF_BUCKETS] */
  uint32_t ok[PR_DF_BUCKETS], fail[PR_DF_BUCKETS]; /* ring */
  int64_t warned_ns;             /* last "deferral paused" warning */
  pr__dmsg_t *dm_head, *dm_tail; /* the deferred messages kept */
  size_t dm_n, dm_cap;           /* how many; defer_cache_size */
};

pr__defer_t *pr__df_store(const pr__engine_t *eng, int kind) {
  return eng->df ? eng->df->store[kind] : NULL;
}

int pr__df_refuse_row(pr__engine_t *eng) {
  PR_ENGINE_THREAD(eng);
  if (!eng->df || eng->df->refuse_rows <= 0)
    return 0;
  eng->df->refuse_rows--;
  return 1;
}

/* ---- the failure rate ---------------------------------------------------- */

static void gate_roll(struct pr__df_state *df, int64_t now_ns) {
  int64_t idx = now_ns / df->bucket_ns;
  int64_t gap = idx - df->epoch;
  if (gap <= 0)
    return;
  for (int64_t i = 1; i <= gap && i <= PR_DF_BUCKETS; i++) {
    size_t b = (size_t)((df->epoch + i) % PR_DF_BUCKETS);
    df->ok[b] = df->fail[b] = 0;
  }
  df->epoch = idx;
}

void pr__df_count(pr__engine_t *eng, prosody_result_t result, int64_t now_ns) {
  PR_ENGINE_THREAD(eng);
  struct pr__df_state *df = eng->df;
  size_t b;
  if (!df || (!df->store[PR_DEFER_MESSAGES] && !df->store[PR_DEFER_TIMERS]))
    return;
  gate_roll(df, now_ns);
  b = (size_t)(df->epoch % PR_DF_BUCKETS);
  if (result == PROSODY_TRANSIENT)
    df->fail[b]++;
  else
    df->ok[b]++;
}

int pr__df_gate(pr__engine_t *eng, int64_t now_ns) {
  PR_ENGINE_THREAD(eng);
  struct pr__df_state *df = eng->df;
  uint64_t ok = 0, fail = 0;
  if (!df)
    return 1; /* nothing counted */
  gate_roll(df, now_ns);
  for (size_t b = 0; b < PR_DF_BUCKETS; b++) {
    ok += df->ok[b];
    fail += df->fail[b];
  }
  return ok + fail == 0 || (double)fail / (double)(ok + fail) <=
                               PR_CFG_FLOAT(eng->st, DEFER_FAILURE_THRESHOLD);
}

int64_t pr__df_delay_s(pr__engine_t *eng, int32_t n) {
  double cap = (double)PR_CFG_NS(eng->st, DEFER_BASE) / 1e9;
  double max = (double)PR_CFG_NS(eng->st, DEFER_MAX_DELAY) / 1e9;
  int64_t ceil_s;
  if (n <= 0)
    return 0;
  for (int32_t i = 1; i < n && cap < max; i++)
    cap *= 2;
  if (cap > max)
    cap = max;
  ceil_s = cap < 1 ? 1 : (int64_t)cap;
  return 1 + (int64_t)((unsigned)rand_r(&eng->seed) % (uint64_t)ceil_s);
}

/* ---- the deferred messages kept (defer_cache_size) ----------------------- */

static void dm_unlink(struct pr__df_state *df, pr__dmsg_t *d) {
  if (d->prev)
    d->prev->next = d->next;
  else
    df->dm_head = d->next;
  if (d->next)
    d->next->prev = d->prev;
  else
    df->dm_tail = d->prev;
  d->prev = d->next = NULL;
  df->dm_n--;
}

static void dm_push(struct pr__df_state *df, pr__dmsg_t *d) {
  d->prev = NULL;
  d->next = df->dm_head;
  if (df->dm_head)
    df->dm_head->prev = d;
  else
    df->dm_tail = d;
  df->dm_head = d;
  df->dm_n++;
}

static void dm_free(pr__dmsg_t *d) {
  if (d->headers)
    rd_kafka_headers_destroy(d->headers);
  free(d);
}

/* A linear search: the list is short and searched once per retry. A
 * message is found by its offset, a timer by its key and time. */
pr__dmsg_t *pr__dm_find(pr__engine_t *eng, int is_timer, const char *topic,
                        int32_t partition, const char *key, int64_t offset) {
  for (pr__dmsg_t *d = eng->df ? eng->df->dm_head : NULL; d; d = d->next)
    if (d->offset == offset && d->partition == partition &&
        d->is_timer == is_timer && !strcmp(d->topic, topic) &&
        (!is_timer || !strcmp(d->key, key)))
      return d;
  return NULL;
}

/* Keeps a copy of a message being deferred (out of memory: not kept). */
void pr__dm_put(inv_t *inv) {
  pr__engine_t *eng = inv->eng;
  size_t tl = strlen(inv->msg.topic) + 1, kl = strlen(inv->msg.key);
  size_t pl = inv->is_timer ? 0 : inv->msg.payload_len;
  pr__dmsg_t *d;
  if (inv->is_timer && !(inv->tr && inv->tr->from.valid))
    return; /* a timer without a context: nothing to keep */
  if (!eng->df || eng->df->dm_cap == 0 ||
      !(d = calloc(1, sizeof(*d) + tl + kl + pl + 2)))
    return;
  d->partition = inv->msg.partition;
  d->is_timer = inv->is_timer;
  d->excise = !inv->is_timer && inv->msg.payload == pr__no_value;
  if (inv->is_timer)
    d->from = inv->tr->from;
  d->offset = inv->is_timer ? inv->time_s : inv->msg.offset;
  d->timestamp = inv->msg.timestamp;
  d->topic = (char *)(d + 1);
  memcpy(d->topic, inv->msg.topic, tl);
  d->key = d->topic + tl;
  memcpy(d->key, inv->msg.key, kl + 1);
  d->key_len = kl;
  d->payload = d->key + kl + 1;
  if (!inv->is_timer)
    memcpy(d->payload, inv->msg.payload, pl + 1);
  d->len = pl;
  if (inv->msg.headers &&
      !(d->headers = rd_kafka_headers_copy(inv->msg.headers))) {
    free(d);
    return;
  }
  dm_push(eng->df, d);
  while (eng->df->dm_n > eng->df->dm_cap) {
    pr__dmsg_t *old = eng->df->dm_tail;
    dm_unlink(eng->df, old);
    dm_free(old);
  }
}

/* Handled (or gone): not kept any more. */
void pr__dm_drop(pr__engine_t *eng, int is_timer, const char *topic,
                 int32_t partition, const char *key, int64_t offset) {
  pr__dmsg_t *d = pr__dm_find(eng, is_timer, topic, partition, key, offset);
  if (d) {
    dm_unlink(eng->df, d);
    dm_free(d);
  }
}

/* The retry of a kept message: a new event of it, or NULL. */
inv_t *pr__dm_inv(part_t *part, const char *key, int64_t offset) {
  pr__engine_t *eng = part->eng;
  pr__dmsg_t *d =
      pr__dm_find(eng, 0, part->topic, part->partition, key, offset);
  inv_t *inv;
  if (!d || strcmp(d->key, key))
    return NULL;
  dm_unlink(eng->df, d); /* the most recently used now */
  dm_push(eng->df, d);
  inv = pr__inv_message(part, d->key, d->key_len, d->excise ? NULL : d->payload,
                        d->len, d->offset, d->timestamp);
  if (inv && d->headers &&
      !(inv->msg.headers = rd_kafka_headers_copy(d->headers))) {
    pr__inv_free(inv);
    return NULL;
  }
  return inv;
}

prosody_err_t pr__df_open(pr__engine_t *eng, const char *bootstrap,
                          char *errstr, size_t errstr_size) {
  const pr__settings_t *st = eng->st;
  int kinds = eng->handler.on_timer ? 2 : 1; /* timers only with on_timer */
  struct pr__df_state *df;
  prosody_err_t err;
  if (eng->mode != PR_MODE_PIPELINE || !PR_CFG_BOOL(st, DEFER_ENABLED))
    return PROSODY_OK; /* the layer is not in the list */
  /* Made here, freed by close(final 1) also when opening fails. */
  if (!(df = eng->df = calloc(1, sizeof(*df)))) {
    pr__errf(errstr, errstr_size, "out of memory");
    return PROSODY_ERR_NOMEM;
  }
  df->dm_cap = (size_t)PR_CFG_INT(st, DEFER_CACHE_SIZE);
  df->refuse_rows = st->test.defer_refuse_rows;
  df->bucket_ns = PR_CFG_NS(st, DEFER_FAILURE_WINDOW) / PR_DF_BUCKETS;
  if (df->bucket_ns < 1000000)
    df->bucket_ns = 1000000;
  if (!(eng->bootstrap = strdup(bootstrap))) {
    pr__errf(errstr, errstr_size, "out of memory");
    return PROSODY_ERR_NOMEM;
  }
  if (PR_CFG_BOOL(st, MOCK) || st->test.memory_timers) {
    for (int kind = 0; kind < kinds; kind++)
      if (!(df->store[kind] = pr__defer_memory((pr__defer_kind_t)kind))) {
        pr__errf(errstr, errstr_size, "out of memory");
        return PROSODY_ERR_NOMEM;
      }
    return PROSODY_OK;
  }
  if (!PR_CFG_SET(st, CASSANDRA_NODES)) {
    PR_INFO("defer", "deferral is off: a deferred message must outlive the "
                     "process, and cassandra_nodes is not set (failures are "
                     "retried in place)");
    return PROSODY_OK;
  }
  if ((err = pr__cql_shared_open(&eng->cql, st, errstr, errstr_size)))
    return err;
  for (int kind = 0; kind < kinds; kind++) {
    size_t cache = (size_t)PR_CFG_INT(st, DEFER_STORE_CACHE_SIZE);
    pr__defer_t *d, *cached;
    if (!(d = pr__defer_new(eng->cql.w, PR_CFG_STR(st, CASSANDRA_KEYSPACE),
                            (pr__defer_kind_t)kind,
                            PR_CFG_NS(st, CASSANDRA_RETENTION) / 1000000000,
                            errstr, errstr_size)))
      return PROSODY_ERR_TRANSIENT;
    if (cache && !(cached = pr__defer_cached(d, cache))) {
      /* Freed by the close, once the engine has stopped the session
       * (the store's round hook runs on its thread until then). */
      df->store[kind] = d;
      pr__errf(errstr, errstr_size, "out of memory");
      return PROSODY_ERR_NOMEM;
    }
    df->store[kind] = cache ? cached : d;
  }
  return PROSODY_OK;
}

void pr__df_close(pr__engine_t *eng) {
  PR_ENGINE_THREAD(eng);
  struct pr__df_state *df = eng->df;
  pr__loader_free(eng->loader);
  eng->loader = NULL;
  while (df && df->dm_head) {
    pr__dmsg_t *d = df->dm_head;
    dm_unlink(df, d);
    dm_free(d);
  }
  for (int kind = 0; df && kind < 2; kind++) { /* delivers what is pending */
    pr__defer_free(df->store[kind]);
    df->store[kind] = NULL;
  }
  free(eng->bootstrap);
  eng->bootstrap = NULL;
}

/* ---- the layer ---------------------------------------------------------- */

/* pipeline: a transient failure (message or timer) is deferred (defer.c)
 * while the failure rate allows; a deferred event loaded again always is. Else
 * it falls through to the retry layer, which retries it in place. */
static pr__verdict_t decide(inv_t *inv) {
  pr__engine_t *eng = inv->eng;
  int64_t now;
  if (inv->result != PROSODY_TRANSIENT || !pr__df_store(eng, PR_DF_KIND(inv)))
    return V_NEXT;
  if (inv->df_loaded || pr__df_gate(eng, now = pr__now_ns()))
    return V_DEFER;
  if (now - eng->df->warned_ns > INT64_C(10000000000)) {
    eng->df->warned_ns = now;
    PR_WARN("defer",
            "more than defer_failure_threshold of recent results are "
            "failures: deferral pauses and failures are retried in place "
            "(their partitions wait)");
  }
  return V_NEXT;
}

/* A handler's result, for the failure rate. */
static void ran(inv_t *inv) {
  pr__df_count(inv->eng, inv->result, pr__now_ns());
}

/* At shutdown (0) the stores close; the state goes with the engine (1). */
static void close_layer(pr__engine_t *eng, int final) {
  pr__df_close(eng);
  if (final) {
    free(eng->df);
    eng->df = NULL;
  }
}

const pr__layer_t pr__layer_defer = {.name = "defer",
                                     .open = pr__df_open,
                                     .hold = pr__df_hold,
                                     .admit = pr__df_admit,
                                     .ran = ran,
                                     .decide = decide,
                                     .take = pr__df_defer,
                                     .end = pr__df_end,
                                     .on_assign = pr__df_assigned,
                                     .on_free = pr__df_part_free,
                                     .timer_loaded = pr__df_timer_loaded,
                                     .unscheduled = pr__df_unscheduled,
                                     .on_tick = pr__df_tick,
                                     .close = close_layer};
