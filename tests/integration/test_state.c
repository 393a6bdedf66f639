/*
 * test_state.c - keyed state (prosody.h, "Keyed state"): a handler's
 * writes become durable with its success and vanish with its failure;
 * commit and rollback mid-handler; values, maps and deques read and write
 * as documented (read-your-writes, scan order, capacity); a handle outlives
 * its attempt only to be refused; registration and identity errors name
 * what is wrong; a consumer killed between storing an event's state and
 * committing its offset leaves each message's changes applied once.
 *
 *   test_state --child BOOTSTRAP|- TOPIC GROUP   a consumer that exits at
 *                                                its third stored event
 */
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>

#include "config/config.h"
#include "harness.h"

#define KEYS 3
#define PER_KEY 10

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int events;           /* guarded by lock: handler calls that ended */
static int bad;              /* guarded by lock */
static char first_bad[1200]; /* guarded by lock */
static int failed_once[KEYS * PER_KEY + 8]; /* guarded by lock */
static long final_count[KEYS];              /* guarded by lock */
static prosody_state_t *leaked;             /* guarded by lock */

static void note_bad(const char *fmt, const char *a, const char *b) {
  pthread_mutex_lock(&lock);
  if (!bad++)
    snprintf(first_bad, sizeof(first_bad), fmt, a, b);
  pthread_mutex_unlock(&lock);
}

static void ended(void) {
  pthread_mutex_lock(&lock);
  events++;
  pthread_mutex_unlock(&lock);
}

static void reset(void) {
  pthread_mutex_lock(&lock);
  events = bad = 0;
  memset(failed_once, 0, sizeof(failed_once));
  memset(final_count, 0, sizeof(final_count));
  pthread_mutex_unlock(&lock);
}

static prosody_state_t *open_state(prosody_context_t *ctx, const char *name) {
  char err[512];
  prosody_state_t *st = NULL;
  if (prosody_state_open(ctx, name, &st, NULL, err, sizeof(err)))
    note_bad("open %s: %s", name, err);
  return st;
}

/* Runs `op`; the result's first document (or NULL), a copy. */
static char *call(prosody_state_t *st, prosody_state_op_t op,
                  const prosody_state_args_t *a, int64_t *number) {
  char err[512];
  prosody_state_result_t r;
  char *doc = NULL;
  prosody_err_t e = prosody_state_call(st, op, a, &r, err, sizeof(err));
  if (e) {
    note_bad("state call failed: %s (%s)", err, prosody_err_name(e));
    return NULL;
  }
  if (r.n && r.items[0].json)
    doc = strdup(r.items[0].json);
  if (number)
    *number = r.number;
  prosody_state_result_free(&r);
  return doc;
}

static void set_json(prosody_state_t *st, const char *json) {
  prosody_state_args_t a = PROSODY_STATE_ARGS_INIT;
  a.json = json;
  a.json_len = strlen(json);
  free(call(st, PROSODY_STATE_SET, &a, NULL));
}

static long get_long(prosody_state_t *st) {
  char *doc = call(st, PROSODY_STATE_GET, NULL, NULL);
  long v = doc ? atol(doc) : 0;
  free(doc);
  return v;
}

/* ---- shared by the counting scenarios --------------------------------- */

/* A producing client outside the consumers' group. */
static prosody_client_t *producer_client(void) {
  char err[1024];
  prosody_config_t *conf = t_config();
  prosody_client_t *client;
  t_set(conf, "source_system", "state-test-producer");
  client = prosody_client_new(conf, err, sizeof(err));
  CHECK(client, "producer: %s", err);
  return client;
}

/* `per` counted messages per key, ids "<prefix>-<k>-<i>", key by key in
 * turn. */
static void send_counted(prosody_client_t *p, const char *topic,
                         const char *prefix, int per) {
  char err[1024], key[32], payload[128];
  for (int i = 0; i < per; i++)
    for (int k = 0; k < KEYS; k++) {
      snprintf(key, sizeof(key), "key-%d", k);
      snprintf(payload, sizeof(payload), "{\"id\":\"%s-%d-%d\",\"i\":%d}",
               prefix, k, i, i);
      CHECK_OK(prosody_send(p, topic, key, payload, NULL, err, sizeof(err)),
               err);
    }
}

/* A probe per key: its handler records the key's count. */
static void send_probes(prosody_client_t *p, const char *topic) {
  char err[1024], key[32], payload[64];
  for (int k = 0; k < KEYS; k++) {
    snprintf(key, sizeof(key), "key-%d", k);
    snprintf(payload, sizeof(payload), "{\"probe\":1,\"k\":%d}", k);
    CHECK_OK(prosody_send(p, topic, key, payload, NULL, err, sizeof(err)), err);
  }
}

/* Waits until every key's probe reported a count; how many did. */
static int wait_probed(double seconds) {
  int probed = 0;
  for (double until = t_now() + seconds;;) {
    pthread_mutex_lock(&lock);
    probed = 0;
    for (int k = 0; k < KEYS; k++)
      probed += final_count[k] > 0;
    pthread_mutex_unlock(&lock);
    if (probed == KEYS || t_now() >= until)
      return probed;
    usleep(20000);
  }
}

/* `per_key` messages per key, `fmt` given (i, k). */
static void produce(const char *topic, int per_key, const char *fmt) {
  char err[1024], key[32], payload[128];
  prosody_client_t *client = producer_client();
  for (int i = 0; i < per_key; i++)
    for (int k = 0; k < KEYS; k++) {
      snprintf(key, sizeof(key), "key-%d", k);
      snprintf(payload, sizeof(payload), fmt, i, k);
      CHECK_OK(
          prosody_send(client, topic, key, payload, NULL, err, sizeof(err)),
          err);
    }
  prosody_client_destroy(client);
}

/* 1: the next client runs without the defer layer (defer_enabled false). */
static int no_deferral;

static prosody_config_t *state_config(const char *group, const char *topic,
                                      const prosody_state_def_t *defs, int n) {
  char err[512];
  prosody_config_t *conf = t_consumer_config(group, topic);
  if (no_deferral)
    t_set(conf, "defer_enabled", "false");
  for (int i = 0; i < n; i++)
    CHECK_OK(prosody_config_add_state(conf, &defs[i], err, sizeof(err)), err);
  return conf;
}

static void run(const char *group, const char *topic,
                const prosody_state_def_t *defs, int n, prosody_handler_t *h,
                int want) {
  char err[1024];
  prosody_client_t *client =
      prosody_client_new(state_config(group, topic, defs, n), err, sizeof(err));
  int got;
  CHECK(client, "client: %s", err);
  CHECK_OK(prosody_subscribe(client, h, err, sizeof(err)), err);
  got = t_wait_locked(&lock, &events, want, 60);
  CHECK(got >= want, "%d of %d handler calls within 60 s", got, want);
  CHECK_OK(prosody_unsubscribe(client), "unsubscribe");
  prosody_client_destroy(client);
  pthread_mutex_lock(&lock);
  CHECK(!bad, "%d bad observations, the first: %s", bad, first_bad);
  pthread_mutex_unlock(&lock);
}

/* ---- a counter per key: success commits, failure vanishes ----------- */

/* Payload {"i":I,"k":K}: count += 1; every third message fails once after
 * its write (the retry must start from the committed count); the last
 * records the count. */
static prosody_result_t count_msg(prosody_context_t *ctx,
                                  const prosody_message_t *msg, void *op) {
  int i = 0, k = 0, first;
  prosody_state_t *st = open_state(ctx, "count");
  char doc[32];
  long n;
  (void)op;
  if (!st)
    return PROSODY_PERMANENT;
  sscanf(prosody_message_payload(msg), "{\"i\":%d,\"k\":%d}", &i, &k);
  n = get_long(st) + 1;
  snprintf(doc, sizeof(doc), "%ld", n);
  set_json(st, doc);
  CHECK(get_long(st) == n, "a read after the write sees it");
  pthread_mutex_lock(&lock);
  first = i % 3 == 1 && !failed_once[k * PER_KEY + i]++;
  if (!first && i == PER_KEY - 1)
    final_count[k] = n;
  pthread_mutex_unlock(&lock);
  prosody_state_free(st);
  ended();
  return first ? PROSODY_TRANSIENT : PROSODY_SUCCESS;
}

T_SCENARIO(success_commits_state_and_failure_drops_it, T_BOTH, 120) {
  const char *topic = t_topic("state-count");
  prosody_state_def_t def = PROSODY_STATE_DEF_INIT;
  prosody_handler_t h = {count_msg, NULL, NULL, 0};
  char group[128];
  int fails = 0;
  def.name = "count";
  def.kind = PROSODY_STATE_VALUE;
  for (int i = 0; i < PER_KEY; i++)
    fails += i % 3 == 1;
  reset();
  t_create_topic(topic, 2);
  produce(topic, PER_KEY, "{\"i\":%d,\"k\":%d}");
  snprintf(group, sizeof(group), "%s-g", topic);
  run(group, topic, &def, 1, &h, KEYS * (PER_KEY + fails));
  for (int k = 0; k < KEYS; k++)
    CHECK(final_count[k] == PER_KEY,
          "key-%d counted %ld of %d messages (failed attempts' writes must "
          "vanish)",
          k, final_count[k], PER_KEY);
  return 0;
}

/* ---- maps and deques -------------------------------------------------- */

static void check_doc(char *doc, const char *want, const char *what) {
  if (!want ? doc != NULL : !doc || strcmp(doc, want))
    note_bad("%s: got %s", what, doc ? doc : "(absent)");
  free(doc);
}

static void map_set(prosody_state_t *m, const char *key, const char *json) {
  prosody_state_args_t a = PROSODY_STATE_ARGS_INIT;
  a.key = key;
  a.key_len = strlen(key);
  a.json = json;
  a.json_len = strlen(json);
  free(call(m, PROSODY_STATE_SET, &a, NULL));
}

static char *map_get(prosody_state_t *m, const char *key) {
  prosody_state_args_t a = PROSODY_STATE_ARGS_INIT;
  a.key = key;
  a.key_len = strlen(key);
  return call(m, PROSODY_STATE_GET, &a, NULL);
}

/* The map's keys in scan order, joined by ',', in `out`. */
static void map_keys(prosody_state_t *m, int backward, size_t limit, char *out,
                     size_t n) {
  prosody_state_args_t a = PROSODY_STATE_ARGS_INIT;
  char err[512], last[64] = "";
  int end = 0;
  out[0] = 0;
  a.backward = backward;
  a.limit = limit;
  a.keys_only = 1;
  while (!end) {
    prosody_state_result_t r;
    if (prosody_state_call(m, PROSODY_STATE_SCAN, &a, &r, err, sizeof(err))) {
      note_bad("scan: %s%s", err, "");
      return;
    }
    for (size_t i = 0; i < r.n; i++) {
      snprintf(out + strlen(out), n - strlen(out), "%s%s", *out ? "," : "",
               r.items[i].key);
      snprintf(last, sizeof(last), "%s", r.items[i].key);
    }
    end = (int)r.number || !r.n;
    prosody_state_result_free(&r);
    a.after = last;
    a.after_len = strlen(last);
  }
}

static void push(prosody_state_t *d, int back, const char *json) {
  prosody_state_args_t a = PROSODY_STATE_ARGS_INIT;
  a.json = json;
  a.json_len = strlen(json);
  free(call(d, back ? PROSODY_STATE_PUSH_BACK : PROSODY_STATE_PUSH_FRONT, &a,
            NULL));
}

static int64_t len_of(prosody_state_t *d) {
  int64_t n = -1;
  free(call(d, PROSODY_STATE_LEN, NULL, &n));
  return n;
}

static char *at(prosody_state_t *d, int64_t index) {
  prosody_state_args_t a = PROSODY_STATE_ARGS_INIT;
  a.index = index;
  return call(d, PROSODY_STATE_GET, &a, NULL);
}

/* Payload {"i":0}: writes and reads in one attempt; {"i":1}: reads what
 * the first stored. */
static prosody_result_t kinds_msg(prosody_context_t *ctx,
                                  const prosody_message_t *msg, void *op) {
  prosody_state_t *m = open_state(ctx, "totals"),
                  *d = open_state(ctx, "backlog"),
                  *b = open_state(ctx, "bounded");
  prosody_state_args_t a = PROSODY_STATE_ARGS_INIT;
  const char *many[] = {"b", "zz", "a"};
  char keys[256];
  int64_t n;
  int i = 0;
  (void)op;
  if (!m || !d || !b)
    return PROSODY_PERMANENT;
  sscanf(prosody_message_payload(msg), "{\"i\":%d", &i);
  if (i == 0) {
    map_set(m, "b", "2");
    map_set(m, "caf\xc3\xa9", "{\"x\":[1,2]}");
    map_set(m, "a", "1");
    map_set(m, "c", "3");
    a.key = "c";
    a.key_len = 1;
    free(call(m, PROSODY_STATE_REMOVE, &a, NULL));
    push(d, 1, "\"m\"");
    push(d, 1, "\"n\"");
    push(d, 0, "\"l\"");
    for (int k = 0; k < 5; k++) {
      char doc[8];
      snprintf(doc, sizeof(doc), "%d", k);
      push(b, 1, doc);
    }
  }
  /* Read in the writing attempt (overlay) and in the next (store). */
  map_keys(m, 0, 1, keys, sizeof(keys));
  if (strcmp(keys, "a,b,caf\xc3\xa9"))
    note_bad("map keys forward: %s%s", keys, "");
  map_keys(m, 1, 2, keys, sizeof(keys));
  if (strcmp(keys, "caf\xc3\xa9,b,a"))
    note_bad("map keys backward: %s%s", keys, "");
  check_doc(map_get(m, "a"), "1", "map a");
  check_doc(map_get(m, "c"), NULL, "map c (removed)");
  a.key = "caf\xc3\xa9";
  a.key_len = strlen(a.key);
  free(call(m, PROSODY_STATE_CONTAINS, &a, &n));
  if (n != 1)
    note_bad("contains caf\xc3\xa9: %s%s", "0", "");
  {
    prosody_state_args_t g = PROSODY_STATE_ARGS_INIT;
    prosody_state_result_t r;
    char err[512];
    g.keys = many;
    g.nkeys = 3;
    if (prosody_state_call(m, PROSODY_STATE_GET_MANY, &g, &r, err,
                           sizeof(err)) ||
        r.n != 3 || !r.items[0].json || strcmp(r.items[0].json, "2") ||
        r.items[1].json || !r.items[2].json || strcmp(r.items[2].json, "1"))
      note_bad("get_many b,zz,a: wrong answer%s%s", "", "");
    else
      prosody_state_result_free(&r);
  }
  if ((n = len_of(d)) != 3)
    note_bad("deque length %s%s", "not 3", "");
  check_doc(at(d, 0), "\"l\"", "deque[0]");
  check_doc(at(d, -1), "\"n\"", "deque[-1]");
  check_doc(at(d, 3), NULL, "deque[3]");
  check_doc(call(d, PROSODY_STATE_PEEK_FRONT, NULL, NULL), "\"l\"",
            "peek front");
  /* capacity 3: the first two pushes' items were dropped from the front */
  if (len_of(b) != 3)
    note_bad("bounded deque length %s%s", "not 3", "");
  check_doc(at(b, 0), "2", "bounded[0]");
  if (i == 1) {
    check_doc(call(d, PROSODY_STATE_POP_BACK, NULL, NULL), "\"n\"", "pop back");
    check_doc(call(d, PROSODY_STATE_POP_FRONT, NULL, NULL), "\"l\"",
              "pop front");
    if (len_of(d) != 1)
      note_bad("deque length after pops %s%s", "not 1", "");
    free(call(m, PROSODY_STATE_CLEAR, NULL, NULL));
    map_keys(m, 0, 10, keys, sizeof(keys));
    if (*keys)
      note_bad("map keys after clear: %s%s", keys, "");
  }
  prosody_state_free(m);
  prosody_state_free(d);
  prosody_state_free(b);
  ended();
  return PROSODY_SUCCESS;
}

T_SCENARIO(maps_and_deques_read_their_writes_and_store_them, T_BOTH, 120) {
  const char *topic = t_topic("state-kinds");
  prosody_state_def_t defs[3] = {PROSODY_STATE_DEF_INIT, PROSODY_STATE_DEF_INIT,
                                 PROSODY_STATE_DEF_INIT};
  prosody_handler_t h = {kinds_msg, NULL, NULL, 0};
  char group[128];
  defs[0].name = "totals";
  defs[0].kind = PROSODY_STATE_MAP;
  defs[0].keyset_limit = 256;
  defs[1].name = "backlog";
  defs[1].kind = PROSODY_STATE_DEQUE;
  defs[2].name = "bounded";
  defs[2].kind = PROSODY_STATE_DEQUE;
  defs[2].capacity = 3;
  reset();
  t_create_topic(topic, 2);
  produce(topic, 2, "{\"i\":%d,\"k\":%d}");
  snprintf(group, sizeof(group), "%s-g", topic);
  run(group, topic, defs, 3, &h, KEYS * 2);
  return 0;
}

/* ---- commit and rollback mid-handler; fencing; errors ------------------ */

/* {"i":0}: a=1, COMMIT, a=2, then fail once; the retry sees a=1, writes b,
 * rolls back, sees no b. {"i":1}: a is 1, b absent; a leaked handle of the
 * first is refused. */
static prosody_result_t commit_msg(prosody_context_t *ctx,
                                   const prosody_message_t *msg, void *op) {
  prosody_state_t *a = open_state(ctx, "a"), *b = open_state(ctx, "b"), *x;
  prosody_state_args_t args = PROSODY_STATE_ARGS_INIT;
  char err[512];
  int i = 0, k = 0, first = 0;
  prosody_err_t e;
  (void)op;
  if (!a || !b)
    return PROSODY_PERMANENT;
  sscanf(prosody_message_payload(msg), "{\"i\":%d,\"k\":%d}", &i, &k);
  if (i == 0) {
    pthread_mutex_lock(&lock);
    first = !failed_once[k]++;
    pthread_mutex_unlock(&lock);
  }
  if (i == 0 && first) {
    set_json(a, "1");
    free(call(a, PROSODY_STATE_COMMIT, NULL, NULL));
    set_json(a, "2");
    pthread_mutex_lock(&lock);
    if (!leaked) {
      leaked = a;
      a = NULL;
    }
    pthread_mutex_unlock(&lock);
    prosody_state_free(a);
    prosody_state_free(b);
    ended();
    return PROSODY_TRANSIENT;
  }
  if (i == 0) {
    if (get_long(a) != 1)
      note_bad("the retry sees %s, want the committed %s", "a != 1", "1");
    set_json(b, "7");
    free(call(b, PROSODY_STATE_ROLLBACK, NULL, NULL));
    check_doc(call(b, PROSODY_STATE_GET, NULL, NULL), NULL, "b after rollback");
  } else {
    if (get_long(a) != 1)
      note_bad("stored a is not %s%s", "1", "");
    check_doc(call(b, PROSODY_STATE_GET, NULL, NULL), NULL, "stored b");
    pthread_mutex_lock(&lock);
    x = leaked;
    leaked = NULL;
    pthread_mutex_unlock(&lock);
    if (x) {
      e = prosody_state_call(x, PROSODY_STATE_GET, NULL, NULL, err,
                             sizeof(err));
      if (e != PROSODY_ERR_STATE)
        note_bad("a leaked handle: %s (%s), want PROSODY_ERR_STATE",
                 prosody_err_name(e), err);
      prosody_state_free(x);
    }
    /* Caller mistakes are refused, naming the mistake. */
    if (prosody_state_open(ctx, "nope", &x, NULL, err, sizeof(err)) !=
            PROSODY_ERR_PERMANENT ||
        !strstr(err, "\"nope\""))
      note_bad("an unregistered name: %s%s", err, "");
    args.json = "null";
    args.json_len = 4;
    if (prosody_state_call(a, PROSODY_STATE_SET, &args, NULL, err,
                           sizeof(err)) != PROSODY_ERR_INVALID_ARG ||
        !strstr(err, "null"))
      note_bad("a null write: %s%s", err, "");
    args.json = "{bad";
    args.json_len = 4;
    if (prosody_state_call(a, PROSODY_STATE_SET, &args, NULL, err,
                           sizeof(err)) != PROSODY_ERR_INVALID_ARG)
      note_bad("malformed JSON accepted%s%s", "", "");
    {
      size_t big = ((size_t)4 << 20) + 2;
      char *doc = malloc(big + 1);
      CHECK(doc, "malloc");
      memset(doc, 'x', big);
      doc[0] = doc[big - 1] = '"';
      doc[big] = 0;
      args.json = doc;
      args.json_len = big;
      if (prosody_state_call(a, PROSODY_STATE_SET, &args, NULL, err,
                             sizeof(err)) != PROSODY_ERR_INVALID_ARG ||
          !strstr(err, "\"a\"") || !strstr(err, "at most"))
        note_bad("a document over the limit: %s%s", err, "");
      free(doc);
    }
    if (prosody_state_call(a, PROSODY_STATE_POP_BACK, NULL, NULL, err,
                           sizeof(err)) != PROSODY_ERR_INVALID_ARG ||
        !strstr(err, "value collection has no POP_BACK"))
      note_bad("an operation of another kind: %s%s", err, "");
  }
  prosody_state_free(a);
  prosody_state_free(b);
  ended();
  return PROSODY_SUCCESS;
}

T_SCENARIO(commit_keeps_rollback_drops_and_stale_handles_refused, T_BOTH, 120) {
  const char *topic = t_topic("state-commit");
  prosody_state_def_t defs[2] = {PROSODY_STATE_DEF_INIT,
                                 PROSODY_STATE_DEF_INIT};
  prosody_handler_t h = {commit_msg, NULL, NULL, 0};
  char group[128];
  defs[0].name = "a";
  defs[1].name = "b";
  reset();
  t_create_topic(topic, 2);
  produce(topic, 2, "{\"i\":%d,\"k\":%d}");
  snprintf(group, sizeof(group), "%s-g", topic);
  run(group, topic, defs, 2, &h, KEYS * 3);
  return 0;
}

/* ---- message collections --------------------------------------------- */

static int64_t first_offset[KEYS]; /* guarded by lock */

/* The first item's record of `op`, checked against the key's first
 * message; 1 when it is that record. */
static int is_first(prosody_state_t *st, prosody_state_op_t op,
                    const prosody_state_args_t *a, int k, const char *what) {
  char err[512];
  prosody_state_result_t r;
  const prosody_message_t *m;
  int64_t want;
  int ok;
  if (prosody_state_call(st, op, a, &r, err, sizeof(err))) {
    note_bad("%s: %s", what, err);
    return 0;
  }
  pthread_mutex_lock(&lock);
  want = first_offset[k];
  pthread_mutex_unlock(&lock);
  m = r.n ? r.items[0].message : NULL;
  ok = m && !r.items[0].json && prosody_message_offset(m) == want &&
       strstr(prosody_message_payload(m), "\"i\":0") &&
       prosody_message_partition(m) >= 0 &&
       !strncmp(prosody_message_key(m), "key-", 4);
  if (!ok)
    note_bad("%s: not the key's first record (%s)", what,
             m ? prosody_message_payload(m) : "no record");
  prosody_state_result_free(&r);
  return ok;
}

static prosody_result_t msgs_msg(prosody_context_t *ctx,
                                 const prosody_message_t *msg, void *op) {
  prosody_state_t *last = open_state(ctx, "last"),
                  *log = open_state(ctx, "msglog"),
                  *idx = open_state(ctx, "byseq"),
                  *json = open_state(ctx, "plain");
  prosody_state_args_t a = PROSODY_STATE_ARGS_INIT;
  char err[512];
  int i = 0, k = 0;
  int64_t n = -1;
  (void)op;
  if (!last || !log || !idx || !json)
    return PROSODY_PERMANENT;
  sscanf(prosody_message_payload(msg), "{\"i\":%d,\"k\":%d}", &i, &k);
  a.message = msg;
  if (i == 0) {
    pthread_mutex_lock(&lock);
    first_offset[k] = prosody_message_offset(msg);
    pthread_mutex_unlock(&lock);
    free(call(last, PROSODY_STATE_SET, &a, NULL));
    free(call(log, PROSODY_STATE_PUSH_BACK, &a, NULL));
    a.key = "m0";
    a.key_len = 2;
    free(call(idx, PROSODY_STATE_SET, &a, NULL));
    /* read back in the same attempt */
    is_first(last, PROSODY_STATE_GET, NULL, k, "message value, same attempt");
    /* each kind of collection takes only its own kind of item */
    if (prosody_state_call(json, PROSODY_STATE_SET, &a, NULL, err,
                           sizeof(err)) != PROSODY_ERR_INVALID_ARG ||
        !strstr(err, "cannot be stored in a JSON collection"))
      note_bad("a record into a JSON collection: %s%s", err, "");
    a.message = NULL;
    a.json = "1";
    a.json_len = 1;
    if (prosody_state_call(last, PROSODY_STATE_SET, &a, NULL, err,
                           sizeof(err)) != PROSODY_ERR_INVALID_ARG ||
        !strstr(err, "expected a Kafka message"))
      note_bad("JSON into a message collection: %s%s", err, "");
  } else {
    prosody_state_args_t g = PROSODY_STATE_ARGS_INIT;
    prosody_state_result_t r;
    is_first(last, PROSODY_STATE_GET, NULL, k, "message value");
    is_first(log, PROSODY_STATE_PEEK_FRONT, NULL, k, "message deque");
    g.key = "m0";
    g.key_len = 2;
    is_first(idx, PROSODY_STATE_GET, &g, k, "message map");
    g.key = NULL;
    g.keys_only = 1;
    if (prosody_state_call(idx, PROSODY_STATE_SCAN, &g, &r, err, sizeof(err)) ||
        r.n != 1 || strcmp(r.items[0].key, "m0") || r.items[0].message)
      note_bad("message map keys-only scan: %s%s", err, "");
    else
      prosody_state_result_free(&r);
    free(call(log, PROSODY_STATE_PUSH_BACK, &a, NULL));
    /* a record named by its coordinates, as a binding keeps one */
    a.message = NULL;
    a.ref_topic = prosody_message_topic(msg);
    a.ref_partition = prosody_message_partition(msg);
    a.ref_offset = prosody_message_offset(msg);
    free(call(log, PROSODY_STATE_PUSH_FRONT, &a, NULL));
    free(call(log, PROSODY_STATE_LEN, NULL, &n));
    if (n != 3)
      note_bad("message deque length %s%s", "not 3", "");
    {
      prosody_state_result_t r;
      if (prosody_state_call(log, PROSODY_STATE_PEEK_FRONT, NULL, &r, err,
                             sizeof(err)) ||
          r.n != 1 || !r.items[0].message ||
          prosody_message_offset(r.items[0].message) !=
              prosody_message_offset(msg))
        note_bad("a record pushed by its coordinates: %s%s", err, "");
      else
        prosody_state_result_free(&r);
    }
  }
  prosody_state_free(last);
  prosody_state_free(log);
  prosody_state_free(idx);
  prosody_state_free(json);
  ended();
  return PROSODY_SUCCESS;
}

static int message_collections(void) {
  const char *topic = t_topic("state-msgs");
  prosody_state_def_t defs[4] = {PROSODY_STATE_DEF_INIT, PROSODY_STATE_DEF_INIT,
                                 PROSODY_STATE_DEF_INIT,
                                 PROSODY_STATE_DEF_INIT};
  prosody_handler_t h = {msgs_msg, NULL, NULL, 0};
  char group[128];
  defs[0].name = "last";
  defs[0].payload = PROSODY_STATE_MESSAGE;
  defs[1].name = "msglog";
  defs[1].kind = PROSODY_STATE_DEQUE;
  defs[1].payload = PROSODY_STATE_MESSAGE;
  defs[2].name = "byseq";
  defs[2].kind = PROSODY_STATE_MAP;
  defs[2].payload = PROSODY_STATE_MESSAGE;
  defs[3].name = "plain";
  reset();
  t_create_topic(topic, 2);
  produce(topic, 2, "{\"i\":%d,\"k\":%d}");
  snprintf(group, sizeof(group), "%s-g", topic);
  run(group, topic, defs, 4, &h, KEYS * 2);
  return 0;
}

T_SCENARIO(message_collections_keep_records_and_load_them_again, T_BOTH, 120) {
  return message_collections();
}

/* The loader that reads the records again is deferral's: it starts without
 * the defer layer too. */
T_SCENARIO(message_collections_load_without_deferral, T_MOCK, 120) {
  no_deferral = 1;
  return message_collections();
}

/* ---- configuration ------------------------------------------------------ */

static void refused(prosody_state_def_t def, const char *want) {
  char err[512] = "";
  prosody_config_t *conf = t_config();
  prosody_state_def_t ok = PROSODY_STATE_DEF_INIT;
  ok.name = "dup";
  CHECK_OK(prosody_config_add_state(conf, &ok, err, sizeof(err)), err);
  CHECK(prosody_config_add_state(conf, &def, err, sizeof(err)) ==
                PROSODY_ERR_CONFIG &&
            strstr(err, want),
        "want an error with \"%s\", got \"%s\"", want, err);
  prosody_config_destroy(conf);
}

T_SCENARIO(bad_definitions_refused_naming_the_field, T_MOCK, 30) {
  prosody_state_def_t d = PROSODY_STATE_DEF_INIT;
  d.name = "";
  refused(d, "name: must be a non-empty string");
  d.name = "dup";
  refused(d, "registered twice");
  d.name = "x";
  d.kind = 7;
  refused(d, "kind: expected \"value\", \"map\", or \"deque\"");
  d.kind = PROSODY_STATE_VALUE;
  d.capacity = 3;
  refused(d, "capacity: only valid for deque collections");
  d.kind = PROSODY_STATE_DEQUE;
  d.capacity = INT64_C(4294967296);
  refused(d, "capacity: must be a whole number in 1..=4294967295");
  d.kind = PROSODY_STATE_VALUE;
  d.capacity = 0;
  d.keyset_limit = 5;
  refused(d, "keyset_limit: only valid for map collections");
  d.kind = PROSODY_STATE_MAP;
  d.keyset_limit = 4097;
  refused(d, "keyset_limit: must be a whole number in 0..=4096");
  d.keyset_limit = -1;
  d.ttl_s = -2;
  refused(d, "ttl: must be a whole number of seconds");
  d.ttl_s = 0;
  d.payload = 5;
  refused(d, "payload: expected \"json\" or \"message\"");
  d.payload = PROSODY_STATE_MESSAGE;
  d.published = 1;
  refused(d, "published: only JSON collections can be published");
  return 0;
}

static prosody_result_t nop_msg(prosody_context_t *ctx,
                                const prosody_message_t *msg, void *op);

/* Keyed state is durable: outside mock mode it needs Cassandra. */
T_SCENARIO(collections_without_cassandra_refused_at_subscribe, T_MOCK, 30) {
  char err[1024];
  prosody_state_def_t def = PROSODY_STATE_DEF_INIT;
  prosody_handler_t h = {nop_msg, NULL, NULL, 0};
  prosody_config_t *conf = t_config();
  prosody_client_t *client;
  def.name = "cart";
  t_set(conf, "mock", "false");
  t_set(conf, "bootstrap_servers", "127.0.0.1:1");
  t_set(conf, "group_id", "g");
  t_set(conf, "subscribed_topics", "t");
  unsetenv("PROSODY_CASSANDRA_NODES");
  CHECK_OK(prosody_config_add_state(conf, &def, err, sizeof(err)), err);
  client = prosody_client_new(conf, err, sizeof(err));
  CHECK(client, "client: %s", err);
  CHECK(prosody_subscribe(client, &h, err, sizeof(err)) == PROSODY_ERR_CONFIG &&
            strstr(err, "cassandra_nodes") && strstr(err, "\"cart\""),
        "subscribe without cassandra_nodes: %s", err);
  prosody_client_destroy(client);
  return 0;
}

static prosody_result_t nop_msg(prosody_context_t *ctx,
                                const prosody_message_t *msg, void *op) {
  (void)ctx, (void)msg, (void)op;
  return PROSODY_SUCCESS;
}

T_SCENARIO(another_kind_under_a_recorded_name_refused, T_BOTH, 60) {
  const char *topic = t_topic("state-ident");
  prosody_state_def_t def = PROSODY_STATE_DEF_INIT;
  prosody_handler_t h = {nop_msg, NULL, NULL, 0};
  prosody_client_t *client;
  char err[1024], group[128];
  t_create_topic(topic, 1);
  snprintf(group, sizeof(group), "%s-g", topic);
  def.name = "cart";
  def.kind = PROSODY_STATE_VALUE;
  client =
      prosody_client_new(state_config(group, topic, &def, 1), err, sizeof(err));
  CHECK(client, "client: %s", err);
  CHECK_OK(prosody_subscribe(client, &h, err, sizeof(err)), err);
  CHECK_OK(prosody_unsubscribe(client), "unsubscribe");
  prosody_client_destroy(client);
  def.kind = PROSODY_STATE_MAP;
  client =
      prosody_client_new(state_config(group, topic, &def, 1), err, sizeof(err));
  CHECK(client, "client: %s", err);
  CHECK(prosody_subscribe(client, &h, err, sizeof(err)) ==
                PROSODY_ERR_PERMANENT &&
            strstr(err, "\"cart\"") && strstr(err, "value") &&
            strstr(err, "map"),
        "subscribe with another kind: %s", err);
  prosody_client_destroy(client);
  return 0;
}

/* ---- a crash between the state and the commit -------------------------- */

#define CRASH_PER_KEY 5

/* In a child: say "working" at the first count (crash_child). */
static int crash_child_mode;
static _Atomic int crash_child_working;

/* {"id":..,"i":I,"k":K}: count += 1; {"probe":1,"k":K}: records the count. */
static prosody_result_t crash_msg(prosody_context_t *ctx,
                                  const prosody_message_t *msg, void *op) {
  prosody_state_t *st = open_state(ctx, "count");
  int k = 0;
  char doc[32];
  long n;
  (void)op;
  if (!st)
    return PROSODY_PERMANENT;
  if (sscanf(prosody_message_payload(msg), "{\"probe\":1,\"k\":%d}", &k) == 1) {
    pthread_mutex_lock(&lock);
    if (k >= 0 && k < KEYS)
      final_count[k] = get_long(st);
    pthread_mutex_unlock(&lock);
  } else {
    n = get_long(st) + 1;
    snprintf(doc, sizeof(doc), "%ld", n);
    set_json(st, doc);
    if (crash_child_mode) {
      if (!crash_child_working++) {
        printf("working\n"); /* the test kills it from now on */
        fflush(stdout);
      }
      usleep(3000); /* under load: enough work for five kills */
    }
  }
  prosody_state_free(st);
  ended();
  return PROSODY_SUCCESS;
}

static prosody_config_t *crash_config(const char *group, const char *topic) {
  prosody_state_def_t def = PROSODY_STATE_DEF_INIT;
  def.name = "count";
  return state_config(group, topic, &def, 1);
}

/* `--child BOOTSTRAP|- TOPIC GROUP [EXIT_AFTER]`: consumes until its
 * EXIT_AFTER-th (default 3; 0: never) event's state is stored, then exits
 * (42) before committing it. */
static int crash_child(int argc, char **argv) {
  char err[1024];
  prosody_config_t *conf;
  prosody_client_t *client;
  prosody_handler_t h = {crash_msg, NULL, NULL, 0};
  pr__test_opts_t test;
  CHECK(argc == 5 || argc == 6,
        "usage: %s --child BOOTSTRAP|- TOPIC GROUP [EXIT_AFTER]", argv[0]);
  if (strcmp(argv[2], "-"))
    setenv("PROSODY_BOOTSTRAP_SERVERS", argv[2], 1);
  conf = crash_config(argv[4], argv[3]);
  memset(&test, 0, sizeof(test));
  test.state_exit_after = argc == 6 ? atoi(argv[5]) : 3;
  crash_child_mode = 1;
  test.session_timeout_ms = 6000; /* the group notices its death soon */
  pr__config_set_test(conf, &test);
  client = prosody_client_new(conf, err, sizeof(err));
  CHECK(client, "child client: %s", err);
  CHECK_OK(prosody_subscribe(client, &h, err, sizeof(err)), err);
  printf("subscribed\n");
  fflush(stdout);
  sleep(300); /* the engine exits the process, or the test kills it */
  return 1;
}
T_CHILD(crash_child)

T_SCENARIO(killed_between_state_and_commit_applies_each_message_once, T_REAL,
           180) {
  const char *topic = t_topic("state-crash");
  const char *args[4];
  char group[128], err[1024];
  prosody_client_t *client;
  prosody_handler_t h = {crash_msg, NULL, NULL, 0};
  int fd, status = 0, got;
  pid_t pid;

  reset();
  t_create_topic(topic, 1);
  snprintf(group, sizeof(group), "%s-g", topic);
  client = producer_client();
  send_counted(client, topic, "c", CRASH_PER_KEY);
  send_probes(client, topic);
  prosody_client_destroy(client);

  /* The first consumer stores three events' state and dies before their
   * commit. */
  args[0] = t_real_bootstrap() ? "-" : t_bootstrap();
  args[1] = topic;
  args[2] = group;
  args[3] = NULL;
  pid = t_spawn_child(args, &fd);
  CHECK(waitpid(pid, &status, 0) == pid, "waitpid");
  close(fd);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 42,
        "the child did not exit at its third stored event (status %d)", status);

  /* The group's next consumer gets them again: their state is stored with
   * their dedup records, so they are skipped, and every count is exact. */
  client = prosody_client_new(crash_config(group, topic), err, sizeof(err));
  CHECK(client, "client: %s", err);
  CHECK_OK(prosody_subscribe(client, &h, err, sizeof(err)), err);
  got = t_wait_locked(&lock, &events, KEYS, 60);
  wait_probed(60);
  CHECK_OK(prosody_unsubscribe(client), "unsubscribe");
  prosody_client_destroy(client);
  CHECK(got >= KEYS, "only %d events handled after the crash", got);
  for (int k = 0; k < KEYS; k++)
    CHECK(final_count[k] == CRASH_PER_KEY,
          "key-%d: its count is %ld after %d increments (a message whose state "
          "was stored before the crash was applied %s)",
          k, final_count[k], CRASH_PER_KEY,
          final_count[k] > CRASH_PER_KEY ? "twice" : "not at all");
  return 0;
}

/* The store refuses an event's state for good (here: a test option; in
 * life a write Cassandra will never take): the event fails permanently,
 * its writes dropped, and the mode decides (the pipeline logs and skips
 * it); the key's next events go on from the committed state. */
T_SCENARIO(state_the_store_refuses_fails_the_event_permanently, T_MOCK, 60) {
  const char *topic = t_topic("state-refused");
  char group[128], err[1024], payload[64];
  prosody_config_t *conf;
  prosody_client_t *client;
  prosody_handler_t h = {crash_msg, NULL, NULL, 0};
  pr__test_opts_t test;
  int64_t committed[1], end[1];
  int got;

  reset();
  t_create_topic(topic, 1);
  snprintf(group, sizeof(group), "%s-g", topic);
  client = producer_client();
  for (int i = 0; i < 3; i++) {
    snprintf(payload, sizeof(payload), "{\"id\":\"r-%d\",\"i\":%d}", i, i);
    CHECK_OK(
        prosody_send(client, topic, "key-0", payload, NULL, err, sizeof(err)),
        err);
  }
  CHECK_OK(prosody_send(client, topic, "key-0", "{\"probe\":1,\"k\":0}", NULL,
                        err, sizeof(err)),
           err);
  prosody_client_destroy(client);

  conf = crash_config(group, topic);
  memset(&test, 0, sizeof(test));
  test.state_refuse_settles = 1; /* the first event's */
  pr__config_set_test(conf, &test);
  client = prosody_client_new(conf, err, sizeof(err));
  CHECK(client, "client: %s", err);
  CHECK_OK(prosody_subscribe(client, &h, err, sizeof(err)), err);
  got = t_wait_locked(&lock, &events, 4, 60);
  CHECK(got == 4, "%d of 4 events handled", got);
  CHECK(t_wait_committed(group, topic, ~0u, committed, end, 30),
        "the refused event was not committed past");
  CHECK_OK(prosody_unsubscribe(client), "unsubscribe");
  prosody_client_destroy(client);
  CHECK(final_count[0] == 2,
        "key-0 counted %ld: the refused event's write must be dropped and "
        "the two after it kept",
        final_count[0]);
  return 0;
}

/* ---- TTL ----------------------------------------------------------------- */

static double ttl_written_at;   /* guarded by lock: when "v" was written */
static double ttl_gone_at = -1; /* guarded by lock: first read finding none */
static int ttl_seen_fresh;      /* guarded by lock: read back at once */

/* {"w":1}: writes "v" and reads it back; {"p":1}: reads it. */
static prosody_result_t ttl_msg(prosody_context_t *ctx,
                                const prosody_message_t *msg, void *op) {
  prosody_state_t *st = open_state(ctx, "short");
  char *doc;
  (void)op;
  if (!st)
    return PROSODY_PERMANENT;
  if (strstr(prosody_message_payload(msg), "\"w\"")) {
    set_json(st, "\"here\"");
    pthread_mutex_lock(&lock);
    ttl_written_at = t_now();
    pthread_mutex_unlock(&lock);
  }
  doc = call(st, PROSODY_STATE_GET, NULL, NULL);
  pthread_mutex_lock(&lock);
  if (doc && strstr(prosody_message_payload(msg), "\"w\""))
    ttl_seen_fresh = 1;
  if (!doc && ttl_gone_at < 0 && ttl_written_at > 0)
    ttl_gone_at = t_now();
  pthread_mutex_unlock(&lock);
  free(doc);
  prosody_state_free(st);
  ended();
  return PROSODY_SUCCESS;
}

T_SCENARIO(cells_expire_after_their_ttl, T_BOTH, 90) {
  const char *topic = t_topic("state-ttl");
  prosody_state_def_t def = PROSODY_STATE_DEF_INIT;
  prosody_handler_t h = {ttl_msg, NULL, NULL, 0};
  prosody_client_t *consumer, *producer;
  char group[128], err[1024];
  double gone = -1, written = 0;
  int fresh = 0, sent = 1;

  reset();
  def.name = "short";
  def.ttl_s = 3;
  t_create_topic(topic, 1);
  snprintf(group, sizeof(group), "%s-g", topic);
  consumer =
      prosody_client_new(state_config(group, topic, &def, 1), err, sizeof(err));
  CHECK(consumer, "client: %s", err);
  CHECK_OK(prosody_subscribe(consumer, &h, err, sizeof(err)), err);
  producer = producer_client();
  CHECK_OK(prosody_send(producer, topic, "key-0", "{\"w\":1}", NULL, err,
                        sizeof(err)),
           err);
  /* Probes, one at a time, until a read finds the cell gone. */
  for (double until = t_now() + 60; t_now() < until;) {
    CHECK(t_wait_locked(&lock, &events, sent, 30) >= sent, "probe not handled");
    pthread_mutex_lock(&lock);
    gone = ttl_gone_at;
    written = ttl_written_at;
    fresh = ttl_seen_fresh;
    pthread_mutex_unlock(&lock);
    if (gone >= 0)
      break;
    usleep(250000);
    CHECK_OK(prosody_send(producer, topic, "key-0", "{\"p\":1}", NULL, err,
                          sizeof(err)),
             err);
    sent++;
  }
  CHECK_OK(prosody_unsubscribe(consumer), "unsubscribe");
  prosody_client_destroy(consumer);
  prosody_client_destroy(producer);
  CHECK(fresh, "the cell was not there right after its write");
  CHECK(gone >= 0, "the cell did not expire within 60 s");
  /* Cassandra counts TTLs in whole seconds from the second of the write
   * (stored with the event's success, just after `written`): a 3 s TTL
   * ends 2 to 3 s after it; the memory store does the same. */
  CHECK(gone - written >= 1.95 && gone - written < 10,
        "the cell expired %.2f s after its write, with a TTL of 3 s",
        gone - written);
  return 0;
}

/* Five consumers killed with SIGKILL at random moments while they work
 * through 1 000 counted messages; then the group's last consumer finishes.
 * Every key's counter equals its number of messages: nothing lost, nothing
 * applied twice. */
T_SCENARIO(sigkill_at_random_points_leaves_exact_counters, T_REAL, 240) {
  const char *topic = t_topic("state-kills");
  const char *args[5];
  char group[128], err[1024], key[32], payload[128], line[256];
  prosody_client_t *client;
  prosody_handler_t h = {crash_msg, NULL, NULL, 0};
  unsigned seed = getenv("PROSODY_TEST_SEED")
                      ? (unsigned)atoi(getenv("PROSODY_TEST_SEED"))
                      : (unsigned)time(NULL) ^ (unsigned)getpid();
  enum { PER = 600 };
  int got;

  printf("seed %u (PROSODY_TEST_SEED replays it)\n", seed);
  srand(seed);
  reset();
  t_create_topic(topic, 2);
  snprintf(group, sizeof(group), "%s-g", topic);
  client = producer_client();
  for (int i = 0; i < PER; i++)
    for (int k = 0; k < KEYS; k++) {
      snprintf(key, sizeof(key), "key-%d", k);
      snprintf(payload, sizeof(payload), "{\"id\":\"s-%d-%d\",\"i\":%d}", k, i,
               i);
      CHECK_OK(
          prosody_send(client, topic, key, payload, NULL, err, sizeof(err)),
          err);
    }

  args[0] = t_real_bootstrap() ? "-" : t_bootstrap();
  args[1] = topic;
  args[2] = group;
  args[3] = "0"; /* no exit of its own */
  args[4] = NULL;
  for (int kill_no = 0; kill_no < 5; kill_no++) {
    int fd, status = 0;
    size_t len = 0;
    pid_t pid = t_spawn_child(args, &fd);
    double until = t_now() + 60, after;
    int rc;
    /* Killed while it works: after its first count, at a random moment. */
    do {
      while ((rc = t_read_line(fd, line, sizeof(line), &len)) != 1 &&
             t_now() < until)
        CHECK(rc >= 0, "child %d ended before working", (int)pid);
    } while (rc == 1 && strcmp(line, "working") && t_now() < until);
    CHECK(rc == 1, "child %d did not start working within 60 s", (int)pid);
    after = 0.02 + 0.4 * rand() / (double)RAND_MAX;
    usleep((useconds_t)(after * 1e6));
    kill(pid, SIGKILL);
    CHECK(waitpid(pid, &status, 0) == pid, "waitpid");
    close(fd);
    printf("kill %d: after %.2f s\n", kill_no + 1, after);
  }

  send_probes(client, topic);
  prosody_client_destroy(client);
  client = prosody_client_new(crash_config(group, topic), err, sizeof(err));
  CHECK(client, "client: %s", err);
  CHECK_OK(prosody_subscribe(client, &h, err, sizeof(err)), err);
  wait_probed(120);
  got = t_wait_locked(&lock, &events, 0, 0);
  CHECK_OK(prosody_unsubscribe(client), "unsubscribe");
  prosody_client_destroy(client);
  printf("the last consumer handled %d events\n", got);
  for (int k = 0; k < KEYS; k++)
    CHECK(final_count[k] == PER,
          "key-%d: its counter is %ld after %d messages (seed %u)", k,
          final_count[k], PER, seed);
  return 0;
}

/* A partition moves while its keys' state is being written: a second
 * consumer joins the group mid-stream and takes partitions over (the
 * cooperative rebalance), then the first leaves. Every counter is exact. */
static prosody_result_t slow_count(prosody_context_t *ctx,
                                   const prosody_message_t *msg, void *op) {
  usleep(2000); /* keeps events in flight across the moves */
  return crash_msg(ctx, msg, op);
}

T_SCENARIO(partitions_move_with_state_in_flight, T_BOTH, 180) {
  const char *topic = t_topic("state-move");
  char group[128], err[1024], key[32], payload[128];
  prosody_client_t *producer, *a, *b;
  prosody_handler_t h = {slow_count, NULL, NULL, 0};
  enum { PER = 300 };
  int probed = 0;

  reset();
  t_create_topic(topic, 4);
  snprintf(group, sizeof(group), "%s-g", topic);
  producer = producer_client();
  for (int i = 0; i < PER; i++)
    for (int k = 0; k < KEYS; k++) {
      snprintf(key, sizeof(key), "key-%d", k);
      snprintf(payload, sizeof(payload), "{\"id\":\"m-%d-%d\",\"i\":%d}", k, i,
               i);
      CHECK_OK(
          prosody_send(producer, topic, key, payload, NULL, err, sizeof(err)),
          err);
    }
  a = prosody_client_new(crash_config(group, topic), err, sizeof(err));
  CHECK(a, "client a: %s", err);
  CHECK_OK(prosody_subscribe(a, &h, err, sizeof(err)), err);
  CHECK(t_wait_locked(&lock, &events, 50, 60) >= 50, "a did not start");
  b = prosody_client_new(crash_config(group, topic), err, sizeof(err));
  CHECK(b, "client b: %s", err);
  CHECK_OK(prosody_subscribe(b, &h, err, sizeof(err)), err);
  for (double until = t_now() + 60;
       prosody_assigned_partition_count(b) == 0 && t_now() < until;)
    usleep(20000);
  CHECK(prosody_assigned_partition_count(b) > 0, "b got no partition");
  CHECK_OK(prosody_unsubscribe(a), "unsubscribe a");
  prosody_client_destroy(a);
  send_probes(producer, topic);
  prosody_client_destroy(producer);
  probed = wait_probed(120);
  CHECK_OK(prosody_unsubscribe(b), "unsubscribe b");
  prosody_client_destroy(b);
  CHECK(probed == KEYS, "%d of %d keys probed", probed, KEYS);
  for (int k = 0; k < KEYS; k++)
    CHECK(final_count[k] == PER, "key-%d: its counter is %ld after %d messages",
          k, final_count[k], PER);
  return 0;
}

/* Timers have state too: on_timer's writes are stored with its success,
 * and the key's next message reads them. */
static prosody_result_t timer_state_msg(prosody_context_t *ctx,
                                        const prosody_message_t *msg,
                                        void *op) {
  char err[512];
  int k = 0;
  (void)op;
  if (sscanf(prosody_message_payload(msg), "{\"probe\":1,\"k\":%d}", &k) == 1) {
    prosody_state_t *st = open_state(ctx, "count");
    if (!st)
      return PROSODY_PERMANENT;
    pthread_mutex_lock(&lock);
    if (k >= 0 && k < KEYS)
      final_count[k] = get_long(st);
    pthread_mutex_unlock(&lock);
    prosody_state_free(st);
  } else if (prosody_schedule(ctx, (int64_t)time(NULL) * 1000, err,
                              sizeof(err))) {
    note_bad("schedule: %s%s", err, "");
  }
  ended();
  return PROSODY_SUCCESS;
}

static int timers_fired; /* guarded by lock */

static prosody_result_t timer_state_fire(prosody_context_t *ctx,
                                         const prosody_timer_t *t, void *op) {
  prosody_state_t *st = open_state(ctx, "count");
  char doc[32];
  (void)t, (void)op;
  if (!st)
    return PROSODY_PERMANENT;
  snprintf(doc, sizeof(doc), "%ld", get_long(st) + 1);
  set_json(st, doc);
  prosody_state_free(st);
  pthread_mutex_lock(&lock);
  timers_fired++;
  pthread_mutex_unlock(&lock);
  return PROSODY_SUCCESS;
}

T_SCENARIO(timer_handlers_write_state_too, T_BOTH, 120) {
  const char *topic = t_topic("state-timers");
  char group[128], err[1024], key[32];
  prosody_client_t *producer, *client;
  prosody_handler_t h = {timer_state_msg, timer_state_fire, NULL, 0};

  reset();
  pthread_mutex_lock(&lock);
  timers_fired = 0;
  pthread_mutex_unlock(&lock);
  t_create_topic(topic, 2);
  snprintf(group, sizeof(group), "%s-g", topic);
  producer = producer_client();
  client = prosody_client_new(crash_config(group, topic), err, sizeof(err));
  CHECK(client, "client: %s", err);
  CHECK_OK(prosody_subscribe(client, &h, err, sizeof(err)), err);
  for (int k = 0; k < KEYS; k++) {
    snprintf(key, sizeof(key), "key-%d", k);
    CHECK_OK(
        prosody_send(producer, topic, key, "{\"t\":1}", NULL, err, sizeof(err)),
        err);
  }
  CHECK(t_wait_locked(&lock, &timers_fired, KEYS, 60) == KEYS,
        "timers did not fire");
  send_probes(producer, topic);
  wait_probed(60);
  CHECK_OK(prosody_unsubscribe(client), "unsubscribe");
  prosody_client_destroy(client);
  prosody_client_destroy(producer);
  pthread_mutex_lock(&lock);
  CHECK(!bad, "%s", first_bad);
  pthread_mutex_unlock(&lock);
  for (int k = 0; k < KEYS; k++)
    CHECK(final_count[k] == 1, "key-%d: its timer's write reads %ld", k,
          final_count[k]);
  return 0;
}

/* ---- a record Kafka no longer has --------------------------------------- */

static prosody_err_t gone_err = PROSODY_OK; /* guarded by lock */
static char gone_why[512];                  /* guarded by lock */
static int gone_read;                       /* guarded by lock */

/* {"keep":1}: the record goes into message value "kept"; {"read":1}: reads
 * it back, recording the outcome; anything else: nothing. */
static prosody_result_t gone_msg(prosody_context_t *ctx,
                                 const prosody_message_t *msg, void *op) {
  prosody_state_t *kept = open_state(ctx, "kept");
  prosody_state_args_t a = PROSODY_STATE_ARGS_INIT;
  prosody_state_result_t r;
  const char *p = prosody_message_payload(msg);
  char err[512] = "";
  (void)op;
  if (!kept)
    return PROSODY_PERMANENT;
  if (strstr(p, "keep")) {
    a.message = msg;
    free(call(kept, PROSODY_STATE_SET, &a, NULL));
  } else if (strstr(p, "read")) {
    prosody_err_t e =
        prosody_state_call(kept, PROSODY_STATE_GET, NULL, &r, err, sizeof(err));
    if (!e)
      prosody_state_result_free(&r);
    pthread_mutex_lock(&lock);
    gone_err = e;
    snprintf(gone_why, sizeof(gone_why), "%s", err);
    gone_read = 1;
    pthread_mutex_unlock(&lock);
  }
  prosody_state_free(kept);
  ended();
  return PROSODY_SUCCESS;
}

/* Deletes the records of partition 0 of `topic` before `offset` (Kafka's
 * DeleteRecords, as retention does). */
static void delete_before(const char *topic, int64_t offset) {
  char err[512];
  rd_kafka_conf_t *kc = rd_kafka_conf_new();
  rd_kafka_t *rk;
  rd_kafka_queue_t *q;
  rd_kafka_topic_partition_list_t *parts = rd_kafka_topic_partition_list_new(1);
  rd_kafka_DeleteRecords_t *del;
  rd_kafka_event_t *ev = NULL;
  rd_kafka_conf_set(kc, "bootstrap.servers", t_bootstrap(), err, sizeof(err));
  rk = rd_kafka_new(RD_KAFKA_PRODUCER, kc, err, sizeof(err));
  CHECK(rk, "admin: %s", err);
  q = rd_kafka_queue_new(rk);
  rd_kafka_topic_partition_list_add(parts, topic, 0)->offset = offset;
  del = rd_kafka_DeleteRecords_new(parts);
  rd_kafka_DeleteRecords(rk, &del, 1, NULL, q);
  for (double until = t_now() + 30; !ev && t_now() < until;)
    ev = rd_kafka_queue_poll(q, 1000);
  CHECK(ev && !rd_kafka_event_error(ev), "DeleteRecords: %s",
        ev ? rd_kafka_event_error_string(ev) : "no answer within 30 s");
  {
    const rd_kafka_topic_partition_list_t *res =
        rd_kafka_DeleteRecords_result_offsets(
            rd_kafka_event_DeleteRecords_result(ev));
    CHECK(res && res->cnt == 1 && !res->elems[0].err,
          "DeleteRecords of %s[0]: %s", topic,
          res && res->cnt ? rd_kafka_err2str(res->elems[0].err) : "no result");
  }
  rd_kafka_event_destroy(ev);
  rd_kafka_DeleteRecords_destroy(del);
  rd_kafka_topic_partition_list_destroy(parts);
  rd_kafka_queue_destroy(q);
  rd_kafka_destroy(rk);
}

/* A message collection's record that retention removed: the read fails
 * for good (PROSODY_ERR_PERMANENT), naming the record, instead of hanging
 * or returning another record. */
T_SCENARIO(a_record_kafka_no_longer_has_reads_as_a_permanent_error, T_REAL,
           120) {
  const char *topic = t_topic("state-gone");
  char group[128], err[1024];
  prosody_state_def_t def = PROSODY_STATE_DEF_INIT;
  prosody_handler_t h = {gone_msg, NULL, NULL, 0};
  prosody_client_t *producer, *client;
  reset();
  t_create_topic(topic, 1);
  snprintf(group, sizeof(group), "%s-g", topic);
  def.name = "kept";
  def.payload = PROSODY_STATE_MESSAGE;
  producer = producer_client();
  CHECK_OK(prosody_send(producer, topic, "k", "{\"keep\":1}", NULL, err,
                        sizeof(err)),
           err);
  CHECK_OK(prosody_send(producer, topic, "f", "{}", NULL, err, sizeof(err)),
           err);
  client =
      prosody_client_new(state_config(group, topic, &def, 1), err, sizeof(err));
  CHECK(client, "client: %s", err);
  CHECK_OK(prosody_subscribe(client, &h, err, sizeof(err)), err);
  CHECK(t_wait_locked(&lock, &events, 2, 60) >= 2, "the first two records");
  delete_before(topic, 1); /* offset 0, the kept record, goes */
  CHECK_OK(prosody_send(producer, topic, "k", "{\"read\":1}", NULL, err,
                        sizeof(err)),
           err);
  CHECK(t_wait_locked(&lock, &gone_read, 1, 60) == 1, "the read ran");
  CHECK_OK(prosody_unsubscribe(client), "unsubscribe");
  prosody_client_destroy(client);
  prosody_client_destroy(producer);
  pthread_mutex_lock(&lock);
  CHECK(gone_err == PROSODY_ERR_PERMANENT && strstr(gone_why, "no longer has"),
        "reading a deleted record: %s (%s)", prosody_err_name(gone_err),
        gone_why);
  pthread_mutex_unlock(&lock);
  return 0;
}

/* ---- one Cassandra session for every store ----------------------------- */

/* Threads of this process named `name`. */
static int threads_named(const char *name) {
  DIR *d = opendir("/proc/self/task");
  struct dirent *e;
  int n = 0;
  CHECK(d, "/proc/self/task");
  while ((e = readdir(d))) {
    char path[300], comm[64] = "";
    FILE *f;
    if (e->d_name[0] == '.')
      continue;
    snprintf(path, sizeof(path), "/proc/self/task/%s/comm", e->d_name);
    if (!(f = fopen(path, "r")))
      continue; /* ended meanwhile */
    if (fgets(comm, sizeof(comm), f))
      comm[strcspn(comm, "\n")] = '\0';
    fclose(f);
    n += !strcmp(comm, name);
  }
  closedir(d);
  return n;
}

/* This process's established TCP connections to `port`: the sockets of
 * /proc/self/fd found in /proc/net/tcp and tcp6 with that remote port. */
static int connections_to(int port) {
  unsigned long inodes[1024];
  size_t ni = 0;
  int n = 0;
  DIR *d = opendir("/proc/self/fd");
  struct dirent *e;
  CHECK(d, "/proc/self/fd");
  while ((e = readdir(d)) && ni < 1024) {
    char path[300], link[64];
    ssize_t len;
    snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
    if ((len = readlink(path, link, sizeof(link) - 1)) > 0) {
      link[len] = '\0';
      if (sscanf(link, "socket:[%lu]", &inodes[ni]) == 1)
        ni++;
    }
  }
  closedir(d);
  for (int v6 = 0; v6 < 2; v6++) {
    FILE *f = fopen(v6 ? "/proc/net/tcp6" : "/proc/net/tcp", "r");
    char line[512];
    if (!f)
      continue;
    while (fgets(line, sizeof(line), f)) {
      char rem[64];
      unsigned st, rport;
      unsigned long inode;
      char *colon;
      if (sscanf(line, " %*s %*s %63s %x %*s %*s %*s %*s %*s %lu", rem, &st,
                 &inode) != 3 ||
          !(colon = strrchr(rem, ':')) || sscanf(colon + 1, "%x", &rport) != 1)
        continue;
      for (size_t i = 0; i < ni; i++)
        n += st == 1 && (int)rport == port && inodes[i] == inode;
    }
    fclose(f);
  }
  return n;
}

static prosody_result_t plain_msg(prosody_context_t *ctx,
                                  const prosody_message_t *msg, void *op) {
  prosody_state_t *st = open_state(ctx, "count");
  (void)msg;
  (void)op;
  if (!st)
    return PROSODY_PERMANENT;
  set_json(st, "1");
  prosody_state_free(st);
  ended();
  return PROSODY_SUCCESS;
}

static prosody_result_t plain_timer(prosody_context_t *ctx,
                                    const prosody_timer_t *t, void *op) {
  (void)ctx;
  (void)t;
  (void)op;
  return PROSODY_SUCCESS;
}

/* A consumer with every store in Cassandra (timers, deduplication,
 * deferred messages and timers, keyed state) has one session: one thread
 * and one connection to the one node, which its stop closes. */
T_SCENARIO(every_store_shares_one_cassandra_session, T_REAL, 120) {
  const char *topic = t_topic("state-one-session");
  const char *node = t_cassandra_nodes();
  const char *colon = strrchr(node, ':');
  int port = colon ? atoi(colon + 1) : 9042;
  prosody_state_def_t def = PROSODY_STATE_DEF_INIT;
  prosody_handler_t h = {plain_msg, plain_timer, NULL, 0};
  prosody_client_t *client;
  char err[1024], group[128];
  int threads, conns;
  double t0, subscribe_s;
  def.name = "count";
  def.kind = PROSODY_STATE_VALUE;
  reset();
  t_create_topic(topic, 1);
  produce(topic, 1, "{\"i\":%d,\"k\":%d}");
  snprintf(group, sizeof(group), "%s-g", topic);
  CHECK(threads_named("prosody-cql") == 0, "no session before the consumer");
  client =
      prosody_client_new(state_config(group, topic, &def, 1), err, sizeof(err));
  CHECK(client, "client: %s", err);
  t0 = t_now();
  CHECK_OK(prosody_subscribe(client, &h, err, sizeof(err)), err);
  subscribe_s = t_now() - t0;
  /* Each store has been used: the timers' segment, dedup's lookups,
   * keyed state's reads and writes. */
  CHECK(t_wait_locked(&lock, &events, KEYS, 60) >= KEYS, "the %d records",
        KEYS);
  threads = threads_named("prosody-cql");
  conns = connections_to(port);
  t0 = t_now();
  CHECK_OK(prosody_unsubscribe(client), "unsubscribe");
  printf("one consumer, every store in Cassandra: %d CQL thread(s), %d "
         "connection(s); subscribe %.0f ms, unsubscribe %.0f ms\n",
         threads, conns, subscribe_s * 1000, (t_now() - t0) * 1000);
  CHECK(threads == 1, "%d Cassandra threads for one consumer (want 1)",
        threads);
  CHECK(conns == 1, "%d connections to the one Cassandra node (want 1)", conns);
  CHECK(threads_named("prosody-cql") == 0, "the stop ends the session");
  prosody_client_destroy(client);
  pthread_mutex_lock(&lock);
  CHECK(!bad, "%d bad observations, the first: %s", bad, first_bad);
  pthread_mutex_unlock(&lock);
  return 0;
}
