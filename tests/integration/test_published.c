/*
 * test_published.c - published keyed state (prosody.h, "Published keyed
 * state"): a group's published collections are read by another client,
 * which neither registers nor consumes them: committed state only, every
 * read operation of each kind, the read cache, an unknown key reading as
 * empty, an unknown subsystem (no routes) a transient error as in the
 * original, a reader of the wrong kind refused, writes and empty keys
 * refused, a publication retired by a deploy that registers it
 * unpublished, and the configuration errors.
 */
#include <pthread.h>
#include <stdatomic.h>

#include "harness.h"

#define N 5 /* counted messages of key "a" */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int handled;          /* guarded by lock: handler calls that ended */
static char first_bad[1024]; /* guarded by lock */

static void note_bad(const char *what, const char *err) {
  pthread_mutex_lock(&lock);
  if (!first_bad[0])
    snprintf(first_bad, sizeof(first_bad), "%s: %s", what, err);
  pthread_mutex_unlock(&lock);
}

static prosody_state_t *open_or_note(prosody_context_t *ctx, const char *n) {
  char err[512];
  prosody_state_t *st = NULL;
  if (prosody_state_open(ctx, n, &st, NULL, err, sizeof(err)))
    note_bad(n, err);
  return st;
}

static void put(prosody_state_t *st, prosody_state_op_t op, const char *key,
                const char *json) {
  char err[512];
  prosody_state_args_t a = PROSODY_STATE_ARGS_INIT;
  a.key = key;
  a.key_len = key ? strlen(key) : 0;
  a.json = json;
  a.json_len = strlen(json);
  if (st && prosody_state_call(st, op, &a, NULL, err, sizeof(err)))
    note_bad("write", err);
}

/* {"i":I}: value "pv" = {"n":I}, map "pm"["mI"] = I, deque "pd" push I.
 * {"poison":1}: writes value {"poisoned":true}, then fails for good (the
 * best-effort mode skips it: its writes must vanish). {"probe":1}: nothing. */
static prosody_result_t owner_msg(prosody_context_t *ctx,
                                  const prosody_message_t *msg, void *op) {
  prosody_state_t *v = open_or_note(ctx, "pv");
  prosody_result_t res = PROSODY_SUCCESS;
  const char *payload = prosody_message_payload(msg);
  int i;
  char doc[64], mk[16];
  (void)op;
  if (strstr(payload, "poison")) {
    put(v, PROSODY_STATE_SET, NULL, "{\"poisoned\":true}");
    res = PROSODY_PERMANENT;
  } else if (sscanf(payload, "{\"i\":%d}", &i) == 1) {
    prosody_state_t *m = open_or_note(ctx, "pm"), *d = open_or_note(ctx, "pd");
    snprintf(doc, sizeof(doc), "{\"n\":%d}", i);
    put(v, PROSODY_STATE_SET, NULL, doc);
    snprintf(mk, sizeof(mk), "m%d", i);
    snprintf(doc, sizeof(doc), "%d", i);
    put(m, PROSODY_STATE_SET, mk, doc);
    put(d, PROSODY_STATE_PUSH_BACK, NULL, doc);
    prosody_state_free(m);
    prosody_state_free(d);
  }
  prosody_state_free(v);
  pthread_mutex_lock(&lock);
  handled++;
  pthread_mutex_unlock(&lock);
  return res;
}

/* The owner's configuration: value, map and deque, "pv" unpublished when
 * `retire`. */
static prosody_config_t *owner_config(const char *group, const char *topic,
                                      const char *subsystem, int retire) {
  static const char *const names[] = {"pv", "pm", "pd"};
  char err[512];
  prosody_config_t *conf = t_consumer_config(group, topic);
  t_set(conf, "mode", "best-effort");
  t_set(conf, "subsystem", subsystem);
  for (int i = 0; i < 3; i++) {
    prosody_state_def_t d = PROSODY_STATE_DEF_INIT;
    d.name = names[i];
    d.kind = i;
    d.published = !(retire && i == 0);
    CHECK_OK(prosody_config_add_state(conf, &d, err, sizeof(err)), err);
  }
  return conf;
}

static void send_one(prosody_client_t *p, const char *topic, const char *key,
                     const char *payload) {
  char err[512];
  CHECK_OK(prosody_send(p, topic, key, payload, NULL, err, sizeof(err)), err);
}

/* A producing client outside the owner's group. */
static prosody_client_t *producer_client(void) {
  char err[512];
  prosody_config_t *conf = t_config();
  prosody_client_t *c;
  t_set(conf, "source_system", "published-test-producer");
  c = prosody_client_new(conf, err, sizeof(err));
  CHECK(c, "producer: %s", err);
  return c;
}

/* A client that only reads: no group, no topics, no registration; its
 * answer cache of `cache_size` (NULL: the default). */
static prosody_client_t *reader_client_sized(const char *cache_size) {
  char err[512];
  prosody_config_t *conf = t_config();
  prosody_client_t *c;
  t_set(conf, "source_system", "published-test-reader");
  if (cache_size)
    t_set(conf, "state_read_cache_size", cache_size);
  if (t_real_bootstrap()) {
    t_set(conf, "cassandra_nodes", t_cassandra_nodes());
    t_set(conf, "cassandra_keyspace", T_KEYSPACE);
  }
  c = prosody_client_new(conf, err, sizeof(err));
  CHECK(c, "reader client: %s", err);
  return c;
}

static prosody_client_t *reader_client(void) {
  return reader_client_sized(NULL);
}

static prosody_published_t *reader(prosody_client_t *c, const char *sub,
                                   const char *name, int kind, int64_t ms) {
  char err[512];
  prosody_published_t *p = NULL;
  CHECK_OK(prosody_published_open(c, sub, name, kind, ms, &p, err, sizeof(err)),
           err);
  return p;
}

/* Runs `op` (map key `mk`, or deque index `index`); the result's items
 * joined as "key=json,..." into out ("-" for an absent document). */
static prosody_err_t read_op(prosody_published_t *p, const char *key,
                             prosody_state_op_t op, const char *mk,
                             int64_t index, char *out, size_t size,
                             int64_t *number) {
  char err[512];
  prosody_state_args_t a = PROSODY_STATE_ARGS_INIT;
  prosody_state_result_t r;
  prosody_err_t e;
  size_t used = 0;
  a.key = mk;
  a.key_len = mk ? strlen(mk) : 0;
  a.index = index;
  out[0] = 0;
  if ((e = prosody_published_call(p, key, op, &a, &r, err, sizeof(err)))) {
    snprintf(out, size, "%s", err);
    return e;
  }
  for (size_t i = 0; i < r.n && used < size; i++)
    used += (size_t)snprintf(out + used, size - used, "%s%s%s%s", i ? "," : "",
                             r.items[i].key ? r.items[i].key : "",
                             r.items[i].key ? "=" : "",
                             r.items[i].json ? r.items[i].json : "-");
  if (number)
    *number = r.number;
  prosody_state_result_free(&r);
  return PROSODY_OK;
}

static void expect(prosody_published_t *p, const char *key,
                   prosody_state_op_t op, const char *mk, int64_t index,
                   const char *want, int64_t want_number, const char *what) {
  char got[1024];
  int64_t number = -7;
  prosody_err_t e = read_op(p, key, op, mk, index, got, sizeof(got), &number);
  CHECK(!e, "%s: %s", what, got);
  CHECK(!strcmp(got, want), "%s: got \"%s\", want \"%s\"", what, got, want);
  CHECK(want_number < 0 || number == want_number, "%s: number %lld, want %lld",
        what, (long long)number, (long long)want_number);
}

/* The owner consumes `msgs` more handler calls' worth, then stops. */
static void own(const char *group, const char *topic, const char *sub,
                int retire, int want) {
  char err[512];
  prosody_handler_t h = {owner_msg, NULL, NULL, 0};
  prosody_client_t *c = prosody_client_new(
      owner_config(group, topic, sub, retire), err, sizeof(err));
  CHECK(c, "owner: %s", err);
  CHECK_OK(prosody_subscribe(c, &h, err, sizeof(err)), err);
  CHECK(t_wait_locked(&lock, &handled, want, 60) >= want,
        "the owner handled %d of %d", t_locked_int(&lock, &handled), want);
  CHECK_OK(prosody_unsubscribe(c), "unsubscribe");
  prosody_client_destroy(c);
  pthread_mutex_lock(&lock);
  CHECK(!first_bad[0], "%s", first_bad);
  pthread_mutex_unlock(&lock);
}

T_SCENARIO(published_collections_read_by_another_client, T_BOTH, 180) {
  const char *topic = t_topic("published");
  char group[128], sub[128], doc[32], got[1024];
  prosody_client_t *producer, *rc;
  prosody_published_t *pv, *pm, *pd, *wrong, *none;
  int64_t number;

  handled = 0;
  t_create_topic(topic, 3);
  snprintf(group, sizeof(group), "%s-g", topic);
  snprintf(sub, sizeof(sub), "sub-%s", topic); /* routes outlive a run */
  producer = producer_client();
  for (int i = 0; i < N; i++) {
    snprintf(doc, sizeof(doc), "{\"i\":%d}", i);
    send_one(producer, topic, "a", doc);
  }
  send_one(producer, topic, "p", "{\"poison\":1}");
  own(group, topic, sub, 0, N + 1);

  rc = reader_client();
  pv = reader(rc, sub, "pv", PROSODY_STATE_VALUE, 0);
  pm = reader(rc, sub, "pm", PROSODY_STATE_MAP, 0);
  pd = reader(rc, sub, "pd", PROSODY_STATE_DEQUE, 0);
  /* value */
  expect(pv, "a", PROSODY_STATE_GET, NULL, 0, "{\"n\":4}", -1, "value GET");
  expect(pv, "p", PROSODY_STATE_GET, NULL, 0, "", -1,
         "a failed attempt's write is not published");
  expect(pv, "nobody", PROSODY_STATE_GET, NULL, 0, "", -1, "unknown key");
  /* map */
  expect(pm, "a", PROSODY_STATE_GET, "m3", 0, "3", -1, "map GET");
  expect(pm, "a", PROSODY_STATE_GET, "zz", 0, "", -1, "map GET absent");
  expect(pm, "a", PROSODY_STATE_CONTAINS, "m1", 0, "", 1, "map CONTAINS");
  expect(pm, "a", PROSODY_STATE_CONTAINS, "zz", 0, "", 0, "map CONTAINS no");
  {
    const char *keys[] = {"m0", "zz", "m4"};
    prosody_state_args_t a = PROSODY_STATE_ARGS_INIT;
    prosody_state_result_t r;
    char err[512];
    a.keys = keys;
    a.nkeys = 3;
    CHECK_OK(prosody_published_call(pm, "a", PROSODY_STATE_GET_MANY, &a, &r,
                                    err, sizeof(err)),
             err);
    CHECK(r.n == 3 && r.items[0].json && !strcmp(r.items[0].json, "0") &&
              !r.items[1].json && r.items[2].json &&
              !strcmp(r.items[2].json, "4"),
          "GET_MANY: %zu items", r.n);
    prosody_state_result_free(&r);
    a = (prosody_state_args_t)PROSODY_STATE_ARGS_INIT;
    a.limit = 2;
    a.backward = 1;
    CHECK_OK(prosody_published_call(pm, "a", PROSODY_STATE_SCAN, &a, &r, err,
                                    sizeof(err)),
             err);
    CHECK(r.n == 2 && !strcmp(r.items[0].key, "m4") &&
              !strcmp(r.items[1].key, "m3") && r.number == 0,
          "map SCAN backward: %zu items, end %lld", r.n, (long long)r.number);
    prosody_state_result_free(&r);
  }
  /* deque */
  expect(pd, "a", PROSODY_STATE_LEN, NULL, 0, "", N, "deque LEN");
  expect(pd, "a", PROSODY_STATE_PEEK_FRONT, NULL, 0, "0", -1, "PEEK_FRONT");
  expect(pd, "a", PROSODY_STATE_PEEK_BACK, NULL, 0, "4", -1, "PEEK_BACK");
  expect(pd, "a", PROSODY_STATE_GET, NULL, -2, "3", -1, "deque GET -2");
  CHECK(
      !read_op(pd, "a", PROSODY_STATE_SCAN, NULL, 0, got, sizeof(got), &number),
      "deque SCAN: %s", got);
  CHECK(strstr(got, "=0,") && strstr(got, "=4") && number == 1,
        "deque SCAN: %s (end %lld)", got, (long long)number);
  expect(pd, "nobody", PROSODY_STATE_LEN, NULL, 0, "", 0, "empty deque LEN");
  /* read-only; of the wrong kind; of a subsystem nobody publishes */
  CHECK(read_op(pv, "a", PROSODY_STATE_SET, NULL, 0, got, sizeof(got), NULL) ==
                PROSODY_ERR_INVALID_ARG &&
            strstr(got, "read-only"),
        "a write through a reader: %s", got);
  wrong = reader(rc, sub, "pv", PROSODY_STATE_MAP, 0);
  CHECK(read_op(wrong, "a", PROSODY_STATE_GET, "x", 0, got, sizeof(got),
                NULL) == PROSODY_ERR_PERMANENT &&
            strstr(got, "\"pv\""),
        "a map reader of a value: %s", got);
  none = reader(rc, "no-such-subsystem", "pv", PROSODY_STATE_VALUE, 0);
  CHECK(read_op(none, "a", PROSODY_STATE_GET, NULL, 0, got, sizeof(got),
                NULL) == PROSODY_ERR_TRANSIENT &&
            strstr(got, "no publication rows"),
        "no routes: %s", got);
  CHECK(read_op(pv, "", PROSODY_STATE_GET, NULL, 0, got, sizeof(got), NULL) ==
                PROSODY_ERR_PERMANENT &&
            strstr(got, "empty key"),
        "an empty key: %s", got);

  /* Retiring: a deploy that registers "pv" unpublished deletes its
   * route; the others stay. */
  send_one(producer, topic, "a", "{\"probe\":1}");
  own(group, topic, sub, 1, N + 2);
  CHECK(read_op(pv, "a", PROSODY_STATE_GET, NULL, 0, got, sizeof(got), NULL) ==
                PROSODY_ERR_TRANSIENT &&
            strstr(got, "no publication rows"),
        "a retired collection: %s", got);
  expect(pm, "a", PROSODY_STATE_GET, "m3", 0, "3", -1, "still published");
  prosody_client_destroy(rc);
  prosody_client_destroy(producer);
  return 0;
}

/* The read cache: an answer is kept for the reader's time to live. */
T_SCENARIO(published_reads_are_cached_for_their_ttl, T_BOTH, 120) {
  const char *topic = t_topic("published-cache");
  char group[128], sub[128], got[256];
  prosody_client_t *producer, *rc, *tiny;
  prosody_published_t *kept, *fresh, *brief, *squeezed;
  double until;

  handled = 0;
  t_create_topic(topic, 1);
  snprintf(group, sizeof(group), "%s-g", topic);
  snprintf(sub, sizeof(sub), "sub-%s", topic);
  producer = producer_client();
  send_one(producer, topic, "a", "{\"i\":1}");
  own(group, topic, sub, 0, 1);
  rc = reader_client();
  kept = reader(rc, sub, "pv", PROSODY_STATE_VALUE, 3600 * 1000);
  fresh = reader(rc, sub, "pv", PROSODY_STATE_VALUE, 0);
  brief = reader(rc, sub, "pv", PROSODY_STATE_VALUE, 300);
  expect(kept, "a", PROSODY_STATE_GET, NULL, 0, "{\"n\":1}", -1, "first read");
  expect(brief, "a", PROSODY_STATE_GET, NULL, 0, "{\"n\":1}", -1, "brief");
  /* A client whose cache holds no answer (state_read_cache_size 1 B). */
  tiny = reader_client_sized("1 B");
  squeezed = reader(tiny, sub, "pv", PROSODY_STATE_VALUE, 3600 * 1000);
  expect(squeezed, "a", PROSODY_STATE_GET, NULL, 0, "{\"n\":1}", -1,
         "a cache too small");
  send_one(producer, topic, "a", "{\"i\":2}");
  own(group, topic, sub, 0, 2);
  expect(fresh, "a", PROSODY_STATE_GET, NULL, 0, "{\"n\":2}", -1,
         "no cache: the new value");
  expect(kept, "a", PROSODY_STATE_GET, NULL, 0, "{\"n\":1}", -1,
         "cached: the old value");
  expect(squeezed, "a", PROSODY_STATE_GET, NULL, 0, "{\"n\":2}", -1,
         "a cache too small to keep it: the new value");
  prosody_client_destroy(tiny);
  /* The brief cache's answer expires: the new value within a few reads. */
  until = t_now() + 10;
  do {
    CHECK(!read_op(brief, "a", PROSODY_STATE_GET, NULL, 0, got, sizeof(got),
                   NULL),
          "%s", got);
    if (!strcmp(got, "{\"n\":2}"))
      break;
    usleep(50000);
  } while (t_now() < until);
  CHECK(!strcmp(got, "{\"n\":2}"), "a 300 ms cache still says %s", got);
  prosody_client_destroy(rc);
  prosody_client_destroy(producer);
  return 0;
}

/* Answers of concurrent reads: right, wrong (the first wrong one kept). */
static atomic_int async_right, async_wrong, async_done;
static char async_first_wrong[512]; /* guarded by lock */

static void async_answer(prosody_err_t err, const char *errstr,
                         const prosody_state_result_t *r, void *opaque) {
  const char *want = opaque; /* NULL: absent */
  int right =
      !err && (want ? r->n == 1 && !strcmp(r->items[0].json, want) : r->n == 0);
  if (right) {
    atomic_fetch_add(&async_right, 1);
  } else {
    pthread_mutex_lock(&lock);
    if (!async_first_wrong[0])
      snprintf(async_first_wrong, sizeof(async_first_wrong), "%s / %s",
               err    ? errstr
               : r->n ? r->items[0].json
                      : "(absent)",
               want ? want : "(absent)");
    pthread_mutex_unlock(&lock);
    atomic_fetch_add(&async_wrong, 1);
  }
  atomic_fetch_add(&async_done, 1);
}

/* Two groups publish one collection, each from its own topic: a key's
 * read goes to the group that holds it, also with many reads in flight
 * while the routes are read again (a 1 ms cache). */
T_SCENARIO(published_read_finds_the_source_that_holds_the_key, T_BOTH, 120) {
  const char *t1 = t_topic("published-src1"), *t2 = t_topic("published-src2");
  char g1[128], g2[128], sub[128];
  prosody_client_t *producer, *rc;
  prosody_published_t *pv;

  handled = 0;
  t_create_topic(t1, 2);
  t_create_topic(t2, 3);
  snprintf(g1, sizeof(g1), "%s-g", t1);
  snprintf(g2, sizeof(g2), "%s-g", t2);
  snprintf(sub, sizeof(sub), "sub-%s", t1);
  producer = producer_client();
  send_one(producer, t1, "x", "{\"i\":1}");
  send_one(producer, t2, "y", "{\"i\":2}");
  own(g1, t1, sub, 0, 1);
  own(g2, t2, sub, 0, 2);
  rc = reader_client();
  pv = reader(rc, sub, "pv", PROSODY_STATE_VALUE, -1);
  expect(pv, "x", PROSODY_STATE_GET, NULL, 0, "{\"n\":1}", -1, "x, of g1");
  expect(pv, "y", PROSODY_STATE_GET, NULL, 0, "{\"n\":2}", -1, "y, of g2");
  expect(pv, "z", PROSODY_STATE_GET, NULL, 0, "", -1, "z, of nobody");
  {
    static const char *const keys[] = {"x", "y", "z"};
    static const char *const want[] = {"{\"n\":1}", "{\"n\":2}", NULL};
    prosody_published_t *hot = reader(rc, sub, "pv", PROSODY_STATE_VALUE, 1);
    char err[512];
    atomic_store(&async_right, 0);
    atomic_store(&async_wrong, 0);
    atomic_store(&async_done, 0);
    for (int i = 0; i < 300; i++)
      CHECK_OK(prosody_published_async(hot, keys[i % 3], PROSODY_STATE_GET,
                                       NULL, async_answer, (void *)want[i % 3],
                                       err, sizeof(err)),
               err);
    CHECK(t_wait_at_least(&async_done, 300, 60), "%d of 300 reads answered",
          atomic_load(&async_done));
    pthread_mutex_lock(&lock);
    CHECK(atomic_load(&async_right) == 300,
          "%d of 300 concurrent reads right; the first wrong: %s",
          atomic_load(&async_right), async_first_wrong);
    pthread_mutex_unlock(&lock);
  }
  prosody_client_destroy(rc);
  prosody_client_destroy(producer);
  return 0;
}

T_SCENARIO(published_configuration_errors_name_the_option, T_MOCK, 30) {
  char err[512];
  prosody_state_def_t d = PROSODY_STATE_DEF_INIT;
  prosody_config_t *conf = t_config();
  prosody_client_t *c;
  prosody_published_t *p;
  d.name = "pv";
  d.published = 1;
  t_set(conf, "group_id", "g");
  CHECK_OK(prosody_config_add_state(conf, &d, err, sizeof(err)), err);
  CHECK(!prosody_client_new(conf, err, sizeof(err)) &&
            strstr(err, "subsystem") && strstr(err, "\"pv\""),
        "a published collection without subsystem: %s", err);
  prosody_config_destroy(conf);
  c = reader_client();
  CHECK(prosody_published_open(c, "  ", "pv", 0, -1, &p, err, sizeof(err)) ==
                PROSODY_ERR_INVALID_ARG &&
            strstr(err, "subsystem"),
        "a blank subsystem: %s", err);
  CHECK(prosody_published_open(c, "s", "pv", 9, -1, &p, err, sizeof(err)) ==
                PROSODY_ERR_INVALID_ARG &&
            strstr(err, "kind"),
        "a bad kind: %s", err);
  prosody_client_destroy(c);
  return 0;
}
