/*
 * defer_retry.c - deferred retry (pipeline mode, messages): retrying the
 * keys that defer.c deferred. The memory store lists a partition's deferred
 * keys when it is assigned (its records and timers wait until then). On the
 * loop's tick, each key whose retry time has come has the head of its queue
 * read from the store; a message is taken from the defer_cache_size most
 * recently deferred messages kept in memory, or else fetched again from
 * Kafka by the loader (loader.c), and handled as a new event of the key. A
 * deferred timer is made again from (key, time); the same cache keeps its
 * trace context. Handled (or failed permanently), it leaves the queue and
 * the next entry goes on the loop's next tick; failed transiently, it waits
 * for its next retry (defer.c writes it). An entry whose record is gone
 * from Kafka is skipped with an error naming it. A key whose queue is found
 * empty is not deferred any more (defer.c forgets it). The tick also asks
 * the store again about the keys whose "is it deferred?" failed (defer.c).
 *
 * Threads: the engine thread only (the Cassandra store and the loader
 * answer through the mailbox; the memory store answers at once).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "defer.h"

static void loaded_mail(pr__mail_t *mail, void *owner);

/* ---- retrying a deferred key ----------------------------------------------
 */

/* Retried at `at_ms` (not busy any more). */
static void dk_idle(pr__dk_t *dk, int64_t at_ms) {
  dk->busy = 0;
  dk->retry_at_ms = at_ms;
}

/* The lowest position of the key's entries not known to be written yet
 * (INT64_MAX: none): a head read may miss them. */
static int64_t unwritten_low(const pr__dk_t *dk) {
  int64_t low = INT64_MAX;
  for (const inv_t *inv = dk->deferring; inv; inv = DFX(inv)->next) {
    int64_t p = inv->is_timer ? inv->time_s : inv->msg.offset;
    if (!DFX(inv)->held && p < low)
      low = p;
  }
  return low;
}

static void advanced(void *arg, prosody_err_t err, const char *errstr) {
  pr__load_t *r = arg;
  part_t *part;
  pr__dk_t *dk = pr__df_req_dk(r, &part);
  if (dk) {
    if (err) {
      PR_WARN("defer",
              "%s[%" PRId32 "] offset %lld key \"%.64s\": could not remove "
              "it from its defer queue: %s; trying again",
              r->topic, r->partition, (long long)r->offset, r->key,
              errstr ? errstr : prosody_err_name(err));
      dk->busy = 2; /* the removal, again, on a later tick */
      dk->retry_at_ms = pr__wall_ms() + 1000;
    } else {
      dk_idle(dk, 0); /* the next entry at once */
    }
  }
  if (!err)
    pr__dm_drop(r->eng, r->kind == PR_DEFER_TIMERS, r->topic, r->partition,
                r->key, r->offset);
  pr__load_free(r);
}

/* The head at dk->position is done with: remove it from the queue. */
static void advance(part_t *part, pr__dk_t *dk) {
  char seg[PR_DF_SEG_MAX];
  pr__load_t *r = pr__df_req_new(part, dk->kq->key, dk->kind);
  dk->busy = 1;
  if (!r) {
    dk->busy = 2;
    dk->retry_at_ms = pr__wall_ms() + 1000;
    return;
  }
  r->offset = dk->position;
  pr__df_segment(part, seg, sizeof(seg));
  pr__defer_advance(pr__df_store(part->eng, dk->kind), seg, r->key, r->offset,
                    advanced, r);
}

int pr__df_end(inv_t *inv, int commit) {
  PR_ENGINE_THREAD(inv->eng);
  pr__engine_t *eng = inv->eng;
  part_t *part = inv->part;
  pr__dk_t *dk = inv->kq ? DFK(inv->kq)->dk[PR_DF_KIND(inv)] : NULL;
  if (!inv->df_loaded)
    return 0;
  inv->df_loaded = 0;
  /* The store closed (it finished after shutdown): its entry stays at the
   * head of the queue for the partition's next owner (handled again: at
   * least once). While the partition drains, the removal is still sent:
   * the drain delivers its answer. */
  if (!dk || !pr__df_store(eng, dk->kind))
    return 1;
  if (commit && inv->is_timer && inv->rearmed && part->tq &&
      pr__tq_add(part->tq, inv->msg.key, inv->time_s) < 0) {
    PR_ERROR("timers", "out of memory re-queueing a timer of %s[%d]",
             part->topic, part->partition);
    pr__slabs_untracked(part);
  }
  if (commit)
    advance(part, dk);
  else
    dk_idle(dk, pr__wall_ms() + 1000);
  return 1;
}

/* A deferred timer's retry: its event, made again from (key, time), with
 * the context it was scheduled in when that is still kept. */
static void load_timer(part_t *part, pr__dk_t *dk, pr__load_t *r) {
  inv_t *inv = pr__firing_inv(part, r->key, r->offset);
  pr__dmsg_t *d = inv ? pr__dm_find(part->eng, 1, part->topic, part->partition,
                                    r->key, r->offset)
                      : NULL;
  pr__load_free(r);
  if (!inv) {
    dk_idle(dk, pr__wall_ms() + 1000);
    return;
  }
  if (d && (inv->tr = calloc(1, sizeof(*inv->tr))))
    inv->tr->from = d->from; /* its span links back to it */
  inv->df_loaded = 1;
  DFX(inv)->retries = dk->retries;
  pr__dispatch_enqueue(inv);
}

static void head_read(void *arg, prosody_err_t err, const char *errstr,
                      int found, int64_t position, int32_t retries) {
  pr__load_t *r = arg;
  part_t *part;
  pr__dk_t *dk = pr__df_req_dk(r, &part);
  pr__engine_t *eng = r->eng;
  if (!dk) {
    pr__load_free(r);
    return;
  }
  if (err) {
    PR_WARN("defer",
            "%s[%" PRId32 "] key \"%.64s\": could not read its defer queue: "
            "%s; trying again in 1s",
            r->topic, r->partition, r->key,
            errstr ? errstr : prosody_err_name(err));
    dk_idle(dk, pr__wall_ms() + 1000);
    pr__load_free(r);
    return;
  }
  if (!found) {
    if (dk->appended || dk->writes) { /* joined meanwhile: read again */
      dk_idle(dk, 0);
      pr__load_free(r);
      return;
    }
    pr__df_forget(part, dk, r);
    return;
  }
  if (position >= r->offset) { /* an entry below it may not be written yet */
    dk_idle(dk, 0);
    pr__load_free(r);
    return;
  }
  dk->position = position;
  dk->retries = retries;
  r->offset = position;
  if (r->kind == PR_DEFER_TIMERS) { /* the timer is all there is to it */
    load_timer(part, dk, r);
    return;
  }
  {
    inv_t *inv = pr__dm_inv(part, r->key, position); /* kept: no fetch */
    if (inv) {
      pr__load_free(r);
      inv->df_loaded = 1;
      DFX(inv)->retries = retries;
      pr__dispatch_enqueue(inv);
      return;
    }
  }
  if (!eng->loader && !(eng->loader = pr__loader_new(eng, eng->bootstrap))) {
    PR_ERROR("defer", "could not start the deferred message loader; trying "
                      "again in 1s");
    dk_idle(dk, pr__wall_ms() + 1000);
    pr__load_free(r);
    return;
  }
  if ((r->span = pr__span_start(eng->otel, "load", PR_SPAN_CLIENT, NULL,
                                PR_SPAN_CHILD, NULL))) {
    char p[16];
    snprintf(p, sizeof(p), "%d", (int)r->partition);
    pr__span_attr_str(r->span, "messaging.system", "kafka", SIZE_MAX);
    pr__span_attr_str(r->span, "messaging.operation.type", "receive", SIZE_MAX);
    pr__span_attr_str(r->span, "messaging.destination.name", r->topic,
                      SIZE_MAX);
    pr__span_attr_str(r->span, "messaging.destination.partition.id", p,
                      SIZE_MAX);
    pr__span_attr_int(r->span, "messaging.kafka.offset", r->offset);
    pr__span_attr_str(r->span, "messaging.kafka.message.key", r->key, SIZE_MAX);
    pr__span_attr_str(r->span, "messaging.consumer.group.name", eng->group_id,
                      SIZE_MAX);
  }
  r->answered = loaded_mail; /* the loader answers there */
  pr__loader_post(eng->loader, r);
}

static void read_head(part_t *part, pr__dk_t *dk) {
  char seg[PR_DF_SEG_MAX];
  pr__load_t *r = pr__df_req_new(part, dk->kq->key, dk->kind);
  if (!r)
    return; /* out of memory: next tick */
  dk->busy = 1;
  dk->appended = 0;
  r->offset = unwritten_low(dk);
  pr__df_segment(part, seg, sizeof(seg));
  pr__defer_head(pr__df_store(part->eng, dk->kind), seg, r->key, head_read, r);
}

static void loaded(pr__load_t *r) {
  part_t *part;
  pr__dk_t *dk = pr__df_req_dk(r, &part);
  pr__engine_t *eng = r->eng;
  rd_kafka_message_t *m = r->rkm;
  inv_t *inv;
  if (r->span) { /* the fetch is over, whatever comes of it */
    if (r->error || r->gone)
      pr__span_set_error(r->span, r->error ? r->error : "the offset is gone");
    pr__span_end(r->span);
    r->span = NULL;
  }
  if (!dk || dk->position != r->offset) {
    pr__load_free(r);
    return;
  }
  if (r->error) {
    int64_t delay = pr__df_delay_s(eng, dk->retries > 0 ? dk->retries : 1);
    PR_WARN("defer",
            "%s[%" PRId32 "] offset %lld key \"%.64s\": could not load the "
            "deferred message: %s; trying again in %llds",
            r->topic, r->partition, (long long)r->offset, r->key, r->error,
            (long long)delay);
    dk_idle(dk, pr__wall_ms() + delay * 1000);
    pr__load_free(r);
    return;
  }
  if (r->gone || !m->key || m->key_len != strlen(r->key) ||
      memcmp(m->key, r->key, m->key_len)) {
    PR_ERROR("defer",
             "%s[%" PRId32 "] offset %lld key \"%.64s\": the deferred message "
             "%s; skipping it",
             r->topic, r->partition, (long long)r->offset, r->key,
             r->gone ? "is not in the partition any more (retention or "
                       "compaction)"
                     : "read back has another key");
    advance(part, dk);
    pr__load_free(r);
    return;
  }
  if (!(inv = pr__intake_inv(part, m))) {
    dk_idle(dk, pr__wall_ms() + 1000);
    pr__load_free(r);
    return;
  }
  r->rkm = NULL; /* the inv's now */
  pr__load_free(r);
  inv->df_loaded = 1;
  DFX(inv)->retries = dk->retries;
  pr__dispatch_enqueue(inv);
}

/* The loader answered (engine thread). */
static void loaded_mail(pr__mail_t *mail, void *owner) {
  (void)owner;
  loaded(PR_CONTAINER_OF(mail, pr__load_t, mail));
}

/* ---- a partition's deferred keys -------------------------------------------
 * Listed by the store when the partition is assigned (the memory store:
 * Cassandra's lists none); until then its records and timers wait
 * (pr__df_listing). A failed listing is read again on the tick. */

static void keys_read(void *arg, prosody_err_t err, const char *errstr,
                      const pr__dkey_t *keys, size_t n) {
  pr__load_t *r = arg;
  part_t *part = pr__df_req_part(r);
  size_t i;
  if (!part) {
    pr__load_free(r);
    return;
  }
  if (err) {
    PR_ERROR("defer",
             "%s[%" PRId32 "]: could not read its deferred keys: %s; its "
             "records wait until they are read (trying again)",
             r->topic, r->partition, errstr ? errstr : prosody_err_name(err));
    DFP(part)->listing[r->kind] = 2;
    pr__load_free(r);
    return;
  }
  for (i = 0; i < n; i++) {
    kq_t *kq = pr__kq_get(part, keys[i].key, 1);
    pr__dk_t *dk;
    if (!kq)
      break;
    if (!DFK(kq)->dk[r->kind]) {
      if (!(dk = pr__df_dk_new(part, kq, r->kind, keys[i].retry_at_s * 1000)))
        break;
      dk->row_written = 1;
    }
  }
  if (i < n) {
    PR_ERROR("defer",
             "%s[%" PRId32 "]: out of memory taking its deferred "
             "keys; trying again",
             r->topic, r->partition);
    DFP(part)->listing[r->kind] = 2;
    pr__load_free(r);
    return;
  }
  if (n > 0)
    PR_INFO("defer", "%s[%" PRId32 "]: %zu key(s) with deferred %s", r->topic,
            r->partition, n,
            r->kind == PR_DEFER_TIMERS ? "timers" : "messages");
  DFP(part)->listing[r->kind] = 0;
  part->eng->resumed = 1;    /* its queue is read again */
  pr__firing_arm(part->eng); /* and its timers fire */
  pr__load_free(r);
}

static void read_keys(part_t *part, int kind) {
  char seg[PR_DF_SEG_MAX];
  pr__load_t *r = pr__df_req_new(part, "", kind);
  DFP(part)->listing[kind] = 1;
  if (!r) {
    DFP(part)->listing[kind] = 2;
    return;
  }
  pr__df_segment(part, seg, sizeof(seg));
  pr__defer_keys(pr__df_store(part->eng, kind), seg, keys_read, r);
}

void pr__df_assigned(pr__engine_t *eng, part_t *part) {
  PR_ENGINE_THREAD(eng);
  for (int kind = 0; kind < 2; kind++)
    if (pr__df_store(eng, kind))
      read_keys(part, kind);
}

/* ---- the loop's tick --------------------------------------------------------
 */

/* Events waiting for a failed "is it deferred?" are asked about again. */
static void ask_again(pr__engine_t *eng, part_t *part, int64_t now_ms) {
  if (!DFP(part)->ask_ms || DFP(part)->ask_ms > now_ms)
    return;
  DFP(part)->ask_ms = 0;
  for (size_t b = 0; part->buckets && b < part->nbuckets; b++) {
    kq_t *kq = part->buckets[b], *knext;
    for (; kq; kq = knext) {
      knext = kq->next; /* scheduling may finish (and free) a dropped head */
      if (kq->head && kq->head->state == INV_QUEUED &&
          DFK(kq)->known[PR_DF_KIND(kq->head)] == PR_DF_UNKNOWN &&
          eng->phase == PH_RUNNING)
        pr__dispatch_schedule(kq->head);
    }
  }
}

void pr__df_tick(pr__engine_t *eng) {
  PR_ENGINE_THREAD(eng);
  int64_t now_ms = pr__wall_ms();
  if (eng->phase != PH_RUNNING)
    return;
  for (part_t *part = eng->parts; part; part = part->next) {
    pr__dk_t *dk, *next;
    if (part->revoking || part->held)
      continue;
    for (int kind = 0; kind < 2; kind++)
      if (DFP(part)->listing[kind] == 2)
        read_keys(part, kind);
    ask_again(eng, part, now_ms);
    if (pr__df_listing(part))
      continue;
    for (dk = DFP(part)->dks; dk; dk = next) {
      next = dk->next;              /* reading the head may free dk */
      if (dk->retry_at_ms > now_ms) /* writes in flight do not hold it:
                                        head_read checks what it read */
        continue;
      if (dk->busy == 2)
        advance(part, dk);
      else if (!dk->busy)
        read_head(part, dk);
    }
  }
}
