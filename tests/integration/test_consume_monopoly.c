/*
 * test_consume_monopoly.c - monopolization detection (pipeline mode): a
 * key whose handler time exceeds monopolization_threshold of the last
 * monopolization_window is refused (transient: retried after a backoff)
 * until its share drops, while the other keys go on; its own events
 * still run once each, in order. The same stream with the layer off lets
 * the key take the whole window.
 *
 * The share is checked from the handler's side: at each start of the hot
 * key's handler, the time its earlier runs took within the window before
 * that start, over the window.
 */
#include <pthread.h>
#include <stdatomic.h>

#include "harness.h"

#define HOG 8         /* events of the hot key */
#define HOG_MS 300    /* its handler time */
#define WINDOW_S 2.0  /* monopolization_window */
#define THRESHOLD 0.3 /* monopolization_threshold */
#define LIGHT 50      /* events of the other keys (10 keys) */

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static double hog_start[HOG], hog_end[HOG]; /* guarded by lock */
static int hog_seq[HOG], hogs;              /* guarded by lock */
static atomic_int light, hog_done;

static prosody_result_t on_message(prosody_context_t *ctx,
                                   const prosody_message_t *m, void *op) {
  const char *seq = strstr(prosody_message_payload(m), "\"seq\":");
  (void)ctx;
  (void)op;
  if (strcmp(prosody_message_key(m), "key-99")) {
    usleep(1000);
    atomic_fetch_add(&light, 1);
    return PROSODY_SUCCESS;
  }
  {
    double start = t_now();
    int i;
    usleep(HOG_MS * 1000);
    pthread_mutex_lock(&lock);
    i = hogs++;
    if (i < HOG) {
      hog_start[i] = start;
      hog_end[i] = t_now();
      hog_seq[i] = seq ? atoi(seq + 6) : -1;
    }
    pthread_mutex_unlock(&lock);
    atomic_fetch_add(&hog_done, 1);
  }
  return PROSODY_SUCCESS;
}

/* The largest share of the window the hot key had used when one of its
 * runs started. */
static double max_share(void) {
  double worst = 0;
  pthread_mutex_lock(&lock);
  for (int i = 0; i < hogs && i < HOG; i++) {
    double busy = 0, from = hog_start[i] - WINDOW_S;
    for (int j = 0; j < i; j++) {
      double a = hog_start[j] > from ? hog_start[j] : from;
      double b = hog_end[j] < hog_start[i] ? hog_end[j] : hog_start[i];
      if (b > a)
        busy += b - a;
    }
    if (busy / WINDOW_S > worst)
      worst = busy / WINDOW_S;
  }
  pthread_mutex_unlock(&lock);
  return worst;
}

static double run(int enabled) {
  char err[1024], topic[128], group[160];
  int keys[HOG + LIGHT];
  prosody_config_t *conf;
  prosody_client_t *c;
  prosody_handler_t h = {on_message, NULL, NULL, 0};
  int64_t committed[1], end[1];
  double share;

  atomic_store(&light, 0);
  atomic_store(&hog_done, 0);
  hogs = 0;
  snprintf(topic, sizeof(topic), "%s", t_topic("monopoly"));
  snprintf(group, sizeof(group), "%s-g", topic);
  t_create_topic(topic, 1);
  /* the hot key's events first, then ten light keys' */
  for (int i = 0; i < HOG + LIGHT; i++)
    keys[i] = i < HOG ? 99 : i % 10;
  t_produce_keyed(topic, 0, HOG + LIGHT, keys);

  conf = t_consumer_config(group, topic);
  t_set(conf, "max_concurrency", "4");
  t_set(conf, "monopolization_enabled", enabled ? "true" : "false");
  t_set(conf, "monopolization_window", "2s");
  t_set(conf, "monopolization_threshold", "0.3");
  t_set(conf, "retry_base", "20ms");
  t_set(conf, "max_retry_delay", "200ms");
  c = prosody_client_new(conf, err, sizeof(err));
  CHECK(c, "client: %s", err);
  CHECK_OK(prosody_subscribe(c, &h, err, sizeof(err)), err);
  CHECK(t_wait_at_least(&light, LIGHT, 60), "light keys: %d of %d",
        atomic_load(&light), LIGHT);
  /* the light keys are not held behind the hot one */
  if (enabled)
    CHECK(atomic_load(&hog_done) < HOG,
          "the hot key finished before the light keys (%d of %d done)",
          atomic_load(&hog_done), HOG);
  CHECK(t_wait_at_least(&hog_done, HOG, 60), "hot key: %d of %d",
        atomic_load(&hog_done), HOG);
  CHECK(t_wait_committed(group, topic, ~0u, committed, end, 30),
        "committed %lld of %lld", (long long)committed[0], (long long)end[0]);
  CHECK_OK(prosody_unsubscribe(c), "unsubscribe");
  prosody_client_destroy(c);
  pthread_mutex_lock(&lock);
  CHECK(hogs == HOG, "the hot key ran %d times for %d events", hogs, HOG);
  for (int i = 0; i < HOG; i++)
    CHECK(hog_seq[i] == i, "the hot key's event %d ran as number %d",
          hog_seq[i], i);
  pthread_mutex_unlock(&lock);
  share = max_share();
  printf("monopolization %s: the hot key's largest share at a start: %.2f\n",
         enabled ? "on" : "off", share);
  return share;
}

/* Refused above 0.3 as measured in buckets of window/32: one bucket and
 * the clocks' distance of slack. */
T_SCENARIO(hot_key_kept_under_threshold_while_others_go_on, T_BOTH, 90) {
  double on = run(1);
  CHECK(on <= THRESHOLD + 0.1,
        "with monopolization on the hot key reached "
        "%.2f of the window (threshold %.2f)",
        on, THRESHOLD);
  return 0;
}

/* The control: the same load without the layer shows the layer's effect. */
T_SCENARIO(without_layer_hot_key_takes_the_window, T_BOTH, 90) {
  double off = run(0);
  CHECK(off >= 0.6,
        "without monopolization the hot key only reached %.2f: "
        "the test does not load it enough to show the layer",
        off);
  return 0;
}
