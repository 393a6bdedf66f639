/*
 * test_consume_cooperative.c - what a member joining a group costs the
 * member already in it, per assignment strategy.
 *
 * Member A holds every partition of a 4-partition topic, with one handler
 * running on each of NREC records (distinct keys, all in flight, each
 * waiting for the test to let it finish or for its cancellation). Member B
 * joins. Partitions that B takes moved; the others stayed with A.
 *
 *   cooperative-sticky (the default): only the moved partitions are
 *   revoked. Every record of a partition that stayed ran once, was never
 *   cancelled, and was not delivered again.
 *   range (eager): the join revokes every partition, so records of
 *   partitions that stayed with A are cancelled or delivered again too.
 *   This is the contrast that shows the first check can fail.
 *
 * Both: every record is finally handled, and committed.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

#define NPART 4
#define NREC 32

typedef struct member {
  int id; /* 0: A, 1: B */
  atomic_int started[NPART];
} member_t;

static atomic_int release;          /* the handlers may finish */
static atomic_int runs[NREC];       /* times record i's handler started */
static atomic_int cancels[NREC];    /* times it saw its cancellation */
static atomic_int done[NREC];       /* times it succeeded */
static atomic_int part_of[NREC];    /* its partition */
static atomic_int started_distinct; /* records started at least once */

static prosody_result_t on_message(prosody_context_t *ctx,
                                   const prosody_message_t *m, void *opaque) {
  member_t *me = opaque;
  int i = -1, p = prosody_message_partition(m);
  if (sscanf(prosody_message_key(m), "key-%d", &i) != 1 || i < 0 || i >= NREC ||
      p < 0 || p >= NPART)
    return PROSODY_PERMANENT;
  atomic_store(&part_of[i], p);
  atomic_fetch_add(&me->started[p], 1);
  if (atomic_fetch_add(&runs[i], 1) == 0)
    atomic_fetch_add(&started_distinct, 1);
  while (!atomic_load(&release))
    if (prosody_wait_cancel(ctx, 20)) {
      atomic_fetch_add(&cancels[i], 1);
      return PROSODY_TRANSIENT;
    }
  atomic_fetch_add(&done[i], 1);
  return PROSODY_SUCCESS;
}

static prosody_client_t *join(const char *topic, const char *group,
                              const char *strategy, member_t *me) {
  int kip848 = !strcmp(strategy, "consumer");
  char err[1024];
  prosody_handler_t h = {on_message, NULL, me, 0};
  prosody_config_t *conf = t_consumer_config(group, topic);
  prosody_client_t *c;
  if (kip848)
    t_set(conf, "group_protocol", "consumer");
  else
    t_set(conf, "partition_assignment_strategy", strategy);
  /* A revoked partition's handlers are cancelled at 80% of this. */
  t_set(conf, "shutdown_timeout", "2s");
  t_set(conf, "mode", "pipeline");
  t_set(conf, "defer_enabled", "false");
  c = prosody_client_new(conf, err, sizeof(err));
  CHECK(c, "client: %s", err);
  CHECK_OK(prosody_subscribe(c, &h, err, sizeof(err)), err);
  return c;
}

static int all_done(void) {
  for (int i = 0; i < NREC; i++)
    if (!atomic_load(&done[i]))
      return 0;
  return 1;
}

static void scenario(const char *strategy, int eager) {
  char topic[128], group[160];
  int keys[NREC], kept = 0, moved = 0, disturbed = 0, kept_records = 0;
  int64_t committed[NPART], end[NPART];
  member_t a = {.id = 0}, b = {.id = 1};
  prosody_client_t *ca, *cb;
  double t0;

  atomic_store(&release, 0);
  atomic_store(&started_distinct, 0);
  for (int i = 0; i < NREC; i++) {
    keys[i] = i;
    atomic_store(&runs[i], 0);
    atomic_store(&cancels[i], 0);
    atomic_store(&done[i], 0);
    atomic_store(&part_of[i], -1);
  }
  snprintf(topic, sizeof(topic), "%s", t_topic("coop"));
  snprintf(group, sizeof(group), "%s-g", topic);
  t_create_topic(topic, NPART);
  t_produce_keyed(topic, 0, NREC, keys);

  ca = join(topic, group, strategy, &a);
  CHECK(t_wait_at_least(&started_distinct, NREC, 60),
        "%s: A started %d of %d records", strategy,
        atomic_load(&started_distinct), NREC);
  for (int p = 0; p < NPART; p++) /* the keys' partitions are fixed */
    CHECK(atomic_load(&a.started[p]) > 0, "%s: no record on partition %d",
          strategy, p);
  CHECK(prosody_assigned_partition_count(ca) == NPART,
        "%s: A holds %d partitions, want %d", strategy,
        prosody_assigned_partition_count(ca), NPART);

  /* B joins while all NREC handlers of A are running. */
  cb = join(topic, group, strategy, &b);
  t0 = t_now();
  while (!(prosody_assigned_partition_count(cb) > 0 &&
           prosody_assigned_partition_count(ca) +
                   prosody_assigned_partition_count(cb) ==
               NPART)) {
    CHECK(t_now() - t0 < 90, "%s: the group did not settle: A %d, B %d",
          strategy, prosody_assigned_partition_count(ca),
          prosody_assigned_partition_count(cb));
    usleep(20000);
  }
  /* B is given again the records of the partitions it took (A never
   * finished them): wait until it has started each of them, then let every
   * handler finish. */
  t0 = t_now();
  for (;;) {
    int waiting = 0;
    moved = 0;
    for (int p = 0; p < NPART; p++)
      moved += atomic_load(&b.started[p]) > 0;
    for (int i = 0; i < NREC; i++)
      if (atomic_load(&b.started[atomic_load(&part_of[i])]) > 0 &&
          atomic_load(&runs[i]) < 2)
        waiting++;
    if (!waiting && moved == prosody_assigned_partition_count(cb))
      break;
    CHECK(t_now() - t0 < 60,
          "%s: B started records of %d of its %d partition(s)", strategy, moved,
          prosody_assigned_partition_count(cb));
    usleep(20000);
  }
  atomic_store(&release, 1);
  t0 = t_now();
  while (!all_done()) {
    CHECK(t_now() - t0 < 60, "%s: not every record was handled", strategy);
    usleep(20000);
  }

  for (int p = 0; p < NPART; p++) {
    if (atomic_load(&b.started[p]) > 0)
      continue; /* moved to B */
    kept++;
    for (int i = 0; i < NREC; i++) {
      if (atomic_load(&part_of[i]) != p)
        continue;
      kept_records++;
      if (atomic_load(&runs[i]) != 1 || atomic_load(&cancels[i]) != 0)
        disturbed++;
    }
  }
  printf("%s: A kept %d partition(s) (%d records), B took %d; records of "
         "kept partitions cancelled or delivered again: %d\n",
         strategy, kept, kept_records, moved, disturbed);
  CHECK(kept > 0 && moved > 0, "%s: A kept %d, B took %d partitions", strategy,
        kept, moved);
  CHECK(kept_records > 0, "%s: no record on the partitions A kept", strategy);
  if (eager)
    CHECK(disturbed > 0,
          "%s: an eager join left the partitions that stayed undisturbed",
          strategy);
  else
    CHECK(disturbed == 0,
          "%s: %d record(s) of partitions that stayed with A were cancelled "
          "or delivered again",
          strategy, disturbed);

  CHECK(t_wait_committed(group, topic, ~0u, committed, end, 30),
        "%s: committed %lld/%lld/%lld/%lld of %lld/%lld/%lld/%lld", strategy,
        (long long)committed[0], (long long)committed[1],
        (long long)committed[2], (long long)committed[3], (long long)end[0],
        (long long)end[1], (long long)end[2], (long long)end[3]);
  CHECK_OK(prosody_unsubscribe(cb), "B leaves");
  prosody_client_destroy(cb);
  CHECK_OK(prosody_unsubscribe(ca), "A leaves");
  prosody_client_destroy(ca);
}

/* KIP-848 (group_protocol=consumer): incremental too, assigned by the
 * broker; Kafka 4 serves it (PROSODY_TEST_KAFKA4=1), and so does
 * librdkafka's mock cluster. */
T_SCENARIO(consumer_protocol_join_revokes_only_moved_partitions, T_BOTH, 120) {
  const char *k4 = getenv("PROSODY_TEST_KAFKA4");
  if (t_real_bootstrap() && !(k4 && *k4 == '1')) {
    printf("the broker is not Kafka 4: group_protocol=consumer not tried\n");
    return T_SKIP;
  }
  scenario("consumer", 0);
  return 0;
}

T_SCENARIO(cooperative_sticky_join_revokes_only_moved_partitions, T_BOTH, 120) {
  scenario("cooperative-sticky", 0);
  return 0;
}

/* The contrast that shows the check above can fail. */
T_SCENARIO(range_join_revokes_every_partition, T_BOTH, 120) {
  scenario("range", 1);
  return 0;
}
