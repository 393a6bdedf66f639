/*
 * test_queue.c - prosody_queue_*, the event queue the Python and Node
 * packages wait on: items come out in push order; the descriptor is
 * readable from the push that makes the queue non-empty until the take,
 * once per batch; offered items are capped and refusals counted; a wake
 * function replaces the descriptor; items pushed by several threads at once
 * all arrive, each thread's in order, and no wake-up is lost.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <poll.h>
#include <pthread.h>

#include "prosody.h"

typedef struct {
  prosody_queue_item_t item;
  int value;
} node_t;

/* 1 if the queue's descriptor is readable now. */
static int readable(prosody_queue_t *q) {
  struct pollfd p = {.fd = prosody_queue_fd(q), .events = POLLIN};
  return poll(&p, 1, 0) == 1 && (p.revents & POLLIN);
}

static void test_fifo_and_one_wake_per_batch(void **state) {
  char err[128];
  prosody_queue_t *q = prosody_queue_new(0, err, sizeof(err));
  node_t n[3];
  prosody_queue_item_t *it;
  unsigned long dropped = 99;
  (void)state;
  assert_non_null(q);
  assert_false(readable(q));
  assert_null(prosody_queue_take(q, &dropped));
  assert_int_equal(dropped, 0);
  for (int i = 0; i < 3; i++) {
    n[i].value = i;
    n[i].item.kind = 7;
    prosody_queue_push(q, &n[i].item);
    assert_true(readable(q));
  }
  it = prosody_queue_take(q, NULL);
  assert_false(readable(q)); /* the take resets the wake-up */
  for (int i = 0; i < 3; i++, it = it->next) {
    assert_non_null(it);
    assert_int_equal(((node_t *)it)->value, i);
    assert_int_equal(it->kind, 7); /* the host's tag is left alone */
  }
  assert_null(it);
  /* A push after the take wakes again. */
  prosody_queue_push(q, &n[0].item);
  assert_true(readable(q));
  assert_ptr_equal(prosody_queue_take(q, NULL), &n[0].item);
  prosody_queue_destroy(q);
  prosody_queue_destroy(NULL);
  assert_int_equal(prosody_queue_fd(NULL), -1);
}

static void test_offer_is_capped_and_counted(void **state) {
  prosody_queue_t *q = prosody_queue_new(2, NULL, 0);
  node_t n[4];
  prosody_queue_item_t *it;
  unsigned long dropped;
  int listed = 0;
  (void)state;
  assert_int_equal(prosody_queue_offer(q, &n[0].item), 0);
  assert_int_equal(prosody_queue_offer(q, &n[1].item), 0);
  assert_int_equal(prosody_queue_offer(q, &n[2].item), -1); /* full */
  assert_int_equal(prosody_queue_offer(q, NULL), -1); /* no item: counted */
  prosody_queue_push(q, &n[3].item);                  /* push ignores the cap */
  it = prosody_queue_take(q, &dropped);
  assert_int_equal(dropped, 2);
  for (; it; it = it->next)
    listed++;
  assert_int_equal(listed, 3);
  /* The take made room again; a refusal alone wakes (the count is news). */
  assert_int_equal(prosody_queue_offer(q, &n[0].item), 0);
  prosody_queue_take(q, NULL);
  assert_int_equal(prosody_queue_offer(q, NULL), -1);
  assert_true(readable(q));
  assert_null(prosody_queue_take(q, &dropped));
  assert_int_equal(dropped, 1);
  prosody_queue_destroy(q);
}

static void count_wake(void *opaque) { (*(int *)opaque)++; }

static void test_wake_function_replaces_the_descriptor(void **state) {
  prosody_queue_t *q = prosody_queue_new(0, NULL, 0);
  node_t n[2];
  int wakes = 0;
  (void)state;
  prosody_queue_set_wake_cb(q, count_wake, &wakes);
  prosody_queue_push(q, &n[0].item);
  prosody_queue_push(q, &n[1].item);
  assert_int_equal(wakes, 1);
  assert_false(readable(q));
  assert_non_null(prosody_queue_take(q, NULL));
  prosody_queue_push(q, &n[0].item);
  assert_int_equal(wakes, 2);
  prosody_queue_take(q, NULL);
  prosody_queue_destroy(q);
}

#define PRODUCERS 4
#define PER_PRODUCER 20000

typedef struct {
  prosody_queue_t *q;
  node_t *nodes;
} producer_t;

static void *produce(void *arg) {
  producer_t *p = arg;
  for (int i = 0; i < PER_PRODUCER; i++)
    prosody_queue_push(p->q, &p->nodes[i].item);
  return NULL;
}

static void test_many_producers_nothing_lost(void **state) {
  prosody_queue_t *q = prosody_queue_new(0, NULL, 0);
  producer_t p[PRODUCERS];
  pthread_t t[PRODUCERS];
  int next[PRODUCERS] = {0}, got = 0;
  (void)state;
  for (int k = 0; k < PRODUCERS; k++) {
    p[k].q = q;
    p[k].nodes = calloc(PER_PRODUCER, sizeof(node_t));
    assert_non_null(p[k].nodes);
    for (int i = 0; i < PER_PRODUCER; i++) {
      p[k].nodes[i].value = i;
      p[k].nodes[i].item.kind = k;
    }
    assert_int_equal(pthread_create(&t[k], NULL, produce, &p[k]), 0);
  }
  /* The host's loop: wait for the descriptor, take, repeat. A lost
   * wake-up would leave items listed with nothing readable: the bounded
   * poll then fails the test. */
  while (got < PRODUCERS * PER_PRODUCER) {
    struct pollfd pf = {.fd = prosody_queue_fd(q), .events = POLLIN};
    prosody_queue_item_t *it;
    if (poll(&pf, 1, 10000) != 1)
      fail_msg("no wake-up with %d of %d items taken", got,
               PRODUCERS * PER_PRODUCER);
    for (it = prosody_queue_take(q, NULL); it; it = it->next) {
      node_t *n = (node_t *)it;
      assert_int_equal(n->value, next[it->kind]); /* each thread in order */
      next[it->kind]++;
      got++;
    }
  }
  for (int k = 0; k < PRODUCERS; k++) {
    pthread_join(t[k], NULL);
    free(p[k].nodes);
  }
  prosody_queue_destroy(q);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fifo_and_one_wake_per_batch),
      cmocka_unit_test(test_offer_is_capped_and_counted),
      cmocka_unit_test(test_wake_function_replaces_the_descriptor),
      cmocka_unit_test(test_many_producers_nothing_lost),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
