/*
 * test_excise.c - excise records (a key without a value): prosody_excise()
 * sends one; a handler with PROSODY_HANDLER_EXCISE receives it, and every
 * other record without a value, in its key's order among the messages;
 * a handler without the flag is not called for them and the consumer
 * commits past them; a failed one goes to failure_topic as an excise
 * record. Apart: a client after prosody_client_shutdown().
 */
#include <pthread.h>

#include "harness.h"

#define KEYS 4
#define PER_KEY 6 /* events per key: messages, an excise in the middle */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char seen[KEYS][PER_KEY + 1]; /* guarded by lock: 'm'/'x' per event */
static int events;                   /* guarded by lock */
static int bad;                      /* guarded by lock: malformed events */
static char first_bad[256];          /* guarded by lock */

static void note_bad(const char *what, const prosody_message_t *msg) {
  if (!bad++)
    snprintf(first_bad, sizeof(first_bad), "%s (key %s offset %lld)", what,
             prosody_message_key(msg), (long long)prosody_message_offset(msg));
}

static prosody_result_t on_message(prosody_context_t *ctx,
                                   const prosody_message_t *msg, void *op) {
  int k = -1;
  (void)ctx, (void)op;
  pthread_mutex_lock(&lock);
  if (sscanf(prosody_message_key(msg), "key-%d", &k) != 1 || k < 0 ||
      k >= KEYS) {
    note_bad("unexpected key", msg);
  } else if (prosody_message_is_excise(msg)) {
    if (prosody_message_payload(msg) || prosody_message_payload_len(msg) ||
        prosody_message_json(msg))
      note_bad("an excise record with a payload", msg);
    if (strlen(seen[k]) < PER_KEY)
      strcat(seen[k], "x");
  } else {
    if (!prosody_message_payload(msg) || !prosody_message_json(msg))
      note_bad("a message without its payload", msg);
    if (strlen(seen[k]) < PER_KEY)
      strcat(seen[k], "m");
  }
  events++;
  pthread_mutex_unlock(&lock);
  return PROSODY_SUCCESS;
}

/* Per key: two messages, an excise, two messages, an excise. */
static const char want_seq[] = "mmxmmx";

/* A producing client (not the consumers' group: their own output would be
 * filtered). */
static prosody_client_t *producer(void) {
  char err[1024];
  prosody_config_t *conf = t_config();
  prosody_client_t *client;
  t_set(conf, "source_system", "excise-test-producer");
  client = prosody_client_new(conf, err, sizeof(err));
  CHECK(client, "producer: %s", err);
  return client;
}

static void produce(const char *topic) {
  char err[1024], key[32];
  prosody_client_t *client = producer();
  for (int i = 0; i < PER_KEY; i++)
    for (int k = 0; k < KEYS; k++) {
      snprintf(key, sizeof(key), "key-%d", k);
      if (want_seq[i] == 'x')
        CHECK_OK(prosody_excise(client, topic, key, NULL, err, sizeof(err)),
                 err);
      else
        CHECK_OK(prosody_send(client, topic, key, "{\"v\":1}", NULL, err,
                              sizeof(err)),
                 err);
    }
  prosody_client_destroy(client);
}

static void reset(void) {
  pthread_mutex_lock(&lock);
  memset(seen, 0, sizeof(seen));
  events = bad = 0;
  pthread_mutex_unlock(&lock);
}

static int consume(const char *topic, unsigned flags, int want_events) {
  char err[1024], group[128];
  int64_t committed[8], end[8];
  prosody_client_t *client;
  prosody_handler_t h = {on_message, NULL, NULL, flags};
  int got;

  snprintf(group, sizeof(group), "%s-group-%u", topic, flags);
  client =
      prosody_client_new(t_consumer_config(group, topic), err, sizeof(err));
  CHECK(client, "client: %s", err);
  CHECK_OK(prosody_subscribe(client, &h, err, sizeof(err)), err);
  got = t_wait_locked(&lock, &events, want_events, 60);
  CHECK(got == want_events, "%d of %d events handled within 60 s", got,
        want_events);
  /* Committed past every record, the excise records included. */
  CHECK(t_wait_committed(group, topic, ~0u, committed, end, 30),
        "offsets not committed to the end within 30 s: at %lld of %lld",
        (long long)committed[0], (long long)end[0]);
  CHECK_OK(prosody_unsubscribe(client), "unsubscribe");
  prosody_client_destroy(client);
  return got;
}

T_SCENARIO(excise_records_reach_the_handler_in_key_order, T_BOTH, 120) {
  const char *topic = t_topic("excise");
  t_create_topic(topic, 1); /* every partition gets records */
  produce(topic);

  reset();
  consume(topic, PROSODY_HANDLER_EXCISE, KEYS * PER_KEY);
  pthread_mutex_lock(&lock);
  CHECK(bad == 0, "%d malformed events, first: %s", bad, first_bad);
  for (int k = 0; k < KEYS; k++)
    CHECK(!strcmp(seen[k], want_seq), "key-%d saw \"%s\", want \"%s\"", k,
          seen[k], want_seq);
  pthread_mutex_unlock(&lock);

  /* Without the flag: the messages only, and committed past the rest. */
  reset();
  consume(topic, 0, KEYS * 4);
  pthread_mutex_lock(&lock);
  CHECK(bad == 0, "%d malformed events, first: %s", bad, first_bad);
  for (int k = 0; k < KEYS; k++)
    CHECK(!strcmp(seen[k], "mmmm"), "key-%d saw \"%s\" without the flag", k,
          seen[k]);
  pthread_mutex_unlock(&lock);
  printf("ok: excise records in key order; skipped without the flag\n");
  return 0;
}

static prosody_result_t refuse_excise(prosody_context_t *ctx,
                                      const prosody_message_t *msg, void *op) {
  (void)ctx, (void)op;
  return prosody_message_is_excise(msg) ? PROSODY_PERMANENT : PROSODY_SUCCESS;
}

/* Low-latency mode: an excise record its handler fails on permanently
 * reaches failure_topic still without a value. */
T_SCENARIO(failed_excise_dead_lettered_as_excise, T_BOTH, 120) {
  char err[1024], group[128], failures[160];
  const char *topic = t_topic("excise-dlq");
  prosody_handler_t h = {refuse_excise, NULL, NULL, PROSODY_HANDLER_EXCISE};
  prosody_config_t *conf;
  prosody_client_t *client, *p;

  snprintf(group, sizeof(group), "%s-group", topic);
  snprintf(failures, sizeof(failures), "%s-failures", topic);
  t_create_topic(topic, 1);
  t_create_topic(failures, 1);
  p = producer();
  CHECK_OK(prosody_excise(p, topic, "key-1", NULL, err, sizeof(err)), err);
  prosody_client_destroy(p);

  conf = t_consumer_config(group, topic);
  t_set(conf, "mode", "low-latency");
  t_set(conf, "failure_topic", failures);
  client = prosody_client_new(conf, err, sizeof(err));
  CHECK(client, "client: %s", err);
  CHECK_OK(prosody_subscribe(client, &h, err, sizeof(err)), err);

  /* What failure_topic holds: one excise record of the key. */
  reset();
  consume(failures, PROSODY_HANDLER_EXCISE, 1);
  CHECK_OK(prosody_unsubscribe(client), "unsubscribe");
  prosody_client_destroy(client);
  pthread_mutex_lock(&lock);
  CHECK(bad == 0, "%d malformed events, first: %s", bad, first_bad);
  CHECK(!strcmp(seen[1], "x"), "failure topic held \"%s\" for key-1", seen[1]);
  pthread_mutex_unlock(&lock);
  return 0;
}

T_SCENARIO(excise_arguments_are_checked, T_MOCK, 30) {
  char err[1024];
  prosody_client_t *client = producer();
  CHECK(prosody_excise(client, t_topic("excise-args"), NULL, NULL, err,
                       sizeof(err)) == PROSODY_ERR_INVALID_ARG,
        "a NULL key accepted");
  CHECK(strstr(err, "key"), "error does not name the key: %s", err);
  CHECK(prosody_excise(client, "", "k", NULL, err, sizeof(err)) ==
            PROSODY_ERR_INVALID_ARG,
        "an empty topic accepted");
  CHECK(prosody_excise(NULL, "t", "k", NULL, err, sizeof(err)) ==
            PROSODY_ERR_INVALID_ARG,
        "a NULL client accepted");
  prosody_client_destroy(client);
  return 0;
}

/* After prosody_client_shutdown(): the consumer stopped, the state says
 * so, and sends, excises and subscribe are refused; a second shutdown is
 * harmless, and destroy still frees it. */
T_SCENARIO(shutdown_stops_and_refuses, T_BOTH, 60) {
  char err[1024], group[128];
  const char *topic = t_topic("excise-shutdown");
  prosody_handler_t h = {on_message, NULL, NULL, PROSODY_HANDLER_EXCISE};
  prosody_client_t *client;

  snprintf(group, sizeof(group), "%s-group", topic);
  t_create_topic(topic, 1);
  client =
      prosody_client_new(t_consumer_config(group, topic), err, sizeof(err));
  CHECK(client, "client: %s", err);
  CHECK_OK(prosody_subscribe(client, &h, err, sizeof(err)), err);
  CHECK_OK(prosody_send(client, topic, "key-0", "{}", NULL, err, sizeof(err)),
           err);
  CHECK_OK(prosody_client_shutdown(client), "shutdown");
  CHECK(!strcmp(prosody_consumer_state(client), "shut-down"), "state %s",
        prosody_consumer_state(client));
  CHECK(prosody_send(client, topic, "k", "{}", NULL, err, sizeof(err)) ==
            PROSODY_ERR_STATE,
        "send accepted after shutdown");
  CHECK(strstr(err, "shut down"), "send error: %s", err);
  CHECK(prosody_excise(client, topic, "k", NULL, err, sizeof(err)) ==
            PROSODY_ERR_STATE,
        "excise accepted after shutdown");
  CHECK(prosody_subscribe(client, &h, err, sizeof(err)) == PROSODY_ERR_STATE,
        "subscribe accepted after shutdown");
  CHECK(strstr(err, "shut down"), "subscribe error: %s", err);
  CHECK(prosody_unsubscribe(client) == PROSODY_ERR_STATE,
        "unsubscribe after shutdown");
  CHECK_OK(prosody_client_shutdown(client), "second shutdown");
  CHECK(prosody_client_shutdown(NULL) == PROSODY_ERR_INVALID_ARG,
        "NULL client accepted");
  prosody_client_destroy(client);
  /* No exporter: both are no-ops. */
  CHECK_OK(prosody_telemetry_flush(1000), "telemetry flush");
  return 0;
}
