/*
 * test_timer_slabs.c - a consumer retires its finished timer slabs (real
 * Kafka + real Cassandra), as the original Prosody does: with 2-second
 * slabs, each key schedules a timer in slab A, one in slab A + 1 and one
 * in slab A + 6. Once the first two have fired and their slabs are past,
 * their listing rows are gone while slab A + 6's stays (it holds a
 * pending timer); once that one has fired too, nothing is listed. The
 * listings are another store's (the partition's next owner, ours or the
 * original), which lists above the segment's slab_watermark: so the next
 * owner loads none of the finished slabs, and no timer fires twice.
 */
#include <pthread.h>

#include "harness.h"
#include "timers/timers.h"

#define KEYS 8
#define SLAB_S 2

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static int scheduled, fired[KEYS]; /* guarded by lock, signalled by cond */
static int woken;                  /* the listing store's: guarded by lock */

static void wake(void *arg) {
  (void)arg;
  pthread_mutex_lock(&lock);
  woken = 1;
  pthread_cond_broadcast(&cond);
  pthread_mutex_unlock(&lock);
}

/* Payload "<k> <base s>": schedule key k's three timers. */
static prosody_result_t on_message(prosody_context_t *ctx,
                                   const prosody_message_t *msg, void *op) {
  static const int64_t after_s[3] = {0, SLAB_S, 6 * SLAB_S};
  char err[512];
  int k;
  long long base;
  (void)op;
  if (sscanf(prosody_message_payload(msg), "\"%d %lld\"", &k, &base) != 2)
    return PROSODY_PERMANENT;
  for (int i = 0; i < 3; i++)
    if (prosody_schedule(ctx, (base + after_s[i]) * 1000, err, sizeof(err))) {
      prosody_context_set_error(ctx, err);
      return PROSODY_TRANSIENT;
    }
  pthread_mutex_lock(&lock);
  scheduled++;
  pthread_cond_broadcast(&cond);
  pthread_mutex_unlock(&lock);
  return PROSODY_SUCCESS;
}

static prosody_result_t on_timer(prosody_context_t *ctx,
                                 const prosody_timer_t *t, void *op) {
  int k = atoi(prosody_timer_key(t) + 1); /* "k<n>" */
  (void)ctx;
  (void)op;
  if (k < 0 || k >= KEYS)
    return PROSODY_PERMANENT;
  pthread_mutex_lock(&lock);
  fired[k]++;
  pthread_cond_broadcast(&cond);
  pthread_mutex_unlock(&lock);
  return PROSODY_SUCCESS;
}

/* Under `lock`. */
static int fired_locked(void) {
  int n = 0;
  for (int k = 0; k < KEYS; k++)
    n += fired[k];
  return n;
}

/* Waits up to `seconds` until `want` timers fired; how many did. */
static int await_fired(int want, double seconds) {
  int n;
  pthread_mutex_lock(&lock);
  T_WAIT_UNTIL(fired_locked() >= want, &cond, &lock, seconds);
  n = fired_locked();
  pthread_mutex_unlock(&lock);
  return n;
}

/* A listing's answer (this thread, inside poll()). */
typedef struct listing {
  int done;
  prosody_err_t err;
  char errstr[256];
  int64_t a;
  char text[256];
} listing_t;

static void on_slabs(void *arg, prosody_err_t err, const char *errstr,
                     const int64_t *slabs, size_t n) {
  listing_t *l = arg;
  l->err = err;
  snprintf(l->errstr, sizeof(l->errstr), "%s", errstr ? errstr : "");
  t_offsets_text(slabs, n, l->a, l->text, sizeof(l->text));
  l->done = 1;
}

/* The slabs the group's segment lists now, relative to slab `a` ("0,1,6"),
 * read by a store of its own, as the partition's next owner reads them. */
static void listed(const char *group, const char *topic, int64_t a, char *out,
                   size_t size) {
  char err[1024], *node;
  pr__cql_conf_t conf;
  pr__tseg_t seg = {topic, 0};
  listing_t l = {0};
  double deadline = t_now() + 30;
  pr__tstore_t *s;
  t_cql_conf(&conf, &node);
  s = T_LONE_STORE(
      &conf, wake, NULL, err,
      pr__cqlstore_new(w, T_KEYSPACE, group, SLAB_S, 3600, err, sizeof(err)));
  CHECK(s, "%s", err);
  l.a = a;
  s->ops->slabs(s, &seg, SLAB_S, on_slabs, &l);
  while (!l.done && t_now() < deadline) { /* poll() delivers, here */
    pthread_mutex_lock(&lock);
    T_WAIT_UNTIL(woken, &cond, &lock, 1);
    woken = 0;
    pthread_mutex_unlock(&lock);
    s->ops->poll(s);
  }
  s->ops->destroy(s);
  CHECK(l.done && l.err == PROSODY_OK, "listing: %s", l.errstr);
  snprintf(out, size, "%s", l.text);
}

/* Waits up to `seconds` for the listing to read `want`. */
static void await_listed(const char *group, const char *topic, int64_t a,
                         const char *want, double seconds) {
  char got[256];
  double deadline = t_now() + seconds;
  for (;;) {
    listed(group, topic, a, got, sizeof(got));
    if (!strcmp(got, want) || t_now() >= deadline)
      break;
    usleep(250000); /* another process's view: read it again */
  }
  CHECK(!strcmp(got, want), "slabs listed: \"%s\", expected \"%s\"", got, want);
}

T_SCENARIO(finished_slabs_retired_pending_slab_kept, T_REAL, 120) {
  char topic[128], group[160], err[1024], key[16], payload[64];
  prosody_config_t *conf;
  prosody_handler_t h = {on_message, on_timer, NULL, 0};
  prosody_client_t *c, *p;
  int64_t base, a;
  int n;

  CHECK(t_real_bootstrap(), "needs the real tier (Kafka and Cassandra)");
  snprintf(topic, sizeof(topic), "%s", t_topic("slabs"));
  snprintf(group, sizeof(group), "%s-g", topic);
  t_create_topic(topic, 1);
  conf = t_consumer_config(group, topic);
  t_set(conf, "slab_size", "2s");
  c = prosody_client_new(conf, err, sizeof(err));
  CHECK(c, "%s", err);
  CHECK_OK(prosody_subscribe(c, &h, err, sizeof(err)), err);

  /* Slab A starts at least 4 s from now: the schedules land before it. */
  base = (t_wall_ms() / 1000 / SLAB_S + 3) * SLAB_S;
  a = base / SLAB_S;
  conf = t_config();
  t_set(conf, "source_system", "slabs-test");
  p = prosody_client_new(conf, err, sizeof(err));
  CHECK(p, "%s", err);
  for (int k = 0; k < KEYS; k++) {
    snprintf(key, sizeof(key), "k%d", k);
    snprintf(payload, sizeof(payload), "\"%d %lld\"", k, (long long)base);
    CHECK_OK(prosody_send(p, topic, key, payload, NULL, err, sizeof(err)), err);
  }
  prosody_client_destroy(p);
  pthread_mutex_lock(&lock);
  T_WAIT_UNTIL(scheduled >= KEYS, &cond, &lock, 30);
  CHECK(scheduled == KEYS, "%d of %d keys scheduled", scheduled, KEYS);
  pthread_mutex_unlock(&lock);
  CHECK(t_wall_ms() / 1000 < base, "scheduling ran past slab A's start");
  await_listed(group, topic, a, "0,1,6", 5);

  /* Slabs A and A + 1 fired and past: retired; A + 6 still pending. */
  n = await_fired(2 * KEYS, 30);
  CHECK(n >= 2 * KEYS, "%d of %d timers fired", n, 2 * KEYS);
  await_listed(group, topic, a, "6", 20);
  n = await_fired(0, 0);
  CHECK(n == 2 * KEYS, "%d timers fired before slab A + 6", n);

  /* ... and once it has fired, none is left. */
  n = await_fired(3 * KEYS, 30);
  CHECK(n >= 3 * KEYS, "%d of %d timers fired", n, 3 * KEYS);
  await_listed(group, topic, a, "", 20);
  CHECK_OK(prosody_unsubscribe(c), "unsubscribe");
  prosody_client_destroy(c);
  for (int k = 0; k < KEYS; k++)
    CHECK(fired[k] == 3, "k%d fired %d times", k, fired[k]);
  return 0;
}
