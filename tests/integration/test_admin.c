/*
 * test_admin.c - topic creation and deletion: explicit partition counts,
 * PROSODY_TOPIC_* defaults, "already exists" and "does not exist" errors,
 * a created topic usable at once, delete then re-create. Against a real
 * broker also the cleanup policy and retention reach the topic's config
 * ("none": the broker's default). A bad cleanup_policy argument is named
 * as the argument; a bad PROSODY_TOPIC_CLEANUP_POLICY as the variable.
 */
#include "harness.h"

static prosody_admin_t *admin_new(void) {
  char err[1024];
  prosody_admin_t *a = prosody_admin_new(t_config(), err, sizeof(err));
  CHECK(a, "admin: %s", err);
  return a;
}

static int partitions_of(const char *topic) {
  char err[512];
  rd_kafka_conf_t *kc = rd_kafka_conf_new();
  rd_kafka_t *rk;
  int n;
  rd_kafka_conf_set(kc, "bootstrap.servers", t_bootstrap(), err, sizeof(err));
  rd_kafka_conf_set(kc, "broker.address.family", "v4", err, sizeof(err));
  rk = rd_kafka_new(RD_KAFKA_PRODUCER, kc, err, sizeof(err));
  n = t_partition_count(rk, topic);
  rd_kafka_destroy(rk);
  return n;
}

/* Real broker only: reads one topic config through DescribeConfigs. */
static void topic_config(const char *topic, const char *name, char *out,
                         size_t n) {
  char err[512];
  rd_kafka_conf_t *kc = rd_kafka_conf_new();
  rd_kafka_t *rk;
  rd_kafka_ConfigResource_t *res;
  rd_kafka_queue_t *q;
  rd_kafka_event_t *ev;
  const rd_kafka_DescribeConfigs_result_t *r;
  const rd_kafka_ConfigResource_t **rs;
  size_t rcnt, ecnt;

  out[0] = '\0';
  rd_kafka_conf_set(kc, "bootstrap.servers", t_bootstrap(), err, sizeof(err));
  rk = rd_kafka_new(RD_KAFKA_PRODUCER, kc, err, sizeof(err));
  res = rd_kafka_ConfigResource_new(RD_KAFKA_RESOURCE_TOPIC, topic);
  q = rd_kafka_queue_new(rk);
  rd_kafka_DescribeConfigs(rk, &res, 1, NULL, q);
  ev = rd_kafka_queue_poll(q, 20000);
  CHECK(ev && !rd_kafka_event_error(ev), "DescribeConfigs failed");
  r = rd_kafka_event_DescribeConfigs_result(ev);
  rs = rd_kafka_DescribeConfigs_result_resources(r, &rcnt);
  CHECK(rcnt == 1, "no resource");
  {
    const rd_kafka_ConfigEntry_t **es =
        rd_kafka_ConfigResource_configs(rs[0], &ecnt);
    for (size_t i = 0; i < ecnt; i++)
      if (!strcmp(rd_kafka_ConfigEntry_name(es[i]), name))
        snprintf(out, n, "%s", rd_kafka_ConfigEntry_value(es[i]));
  }
  rd_kafka_event_destroy(ev);
  rd_kafka_queue_destroy(q);
  rd_kafka_ConfigResource_destroy(res);
  rd_kafka_destroy(rk);
}

T_SCENARIO(created_topic_has_its_partitions_and_is_usable_at_once, T_BOTH, 60) {
  char err[1024];
  prosody_admin_t *admin = admin_new();
  prosody_topic_options_t o = PROSODY_TOPIC_OPTIONS_INIT;
  const char *t1 = t_topic("admin-three");
  prosody_config_t *conf;
  prosody_client_t *client;
  t_record_t r[1];
  prosody_err_t e;

  o.partitions = 3;
  o.replication_factor = 1;
  CHECK_OK(prosody_admin_create_topic(admin, t1, &o, err, sizeof(err)), err);
  CHECK(partitions_of(t1) == 3, "%s has %d partitions, want 3", t1,
        partitions_of(t1));

  e = prosody_admin_create_topic(admin, t1, &o, err, sizeof(err));
  CHECK(e == PROSODY_ERR_TOPIC_EXISTS, "second create: %s (%s)",
        prosody_err_name(e), err);
  CHECK(strstr(err, t1), "message \"%s\" does not name the topic", err);

  /* A created topic is usable at once. */
  conf = t_config();
  t_set(conf, "source_system", "admin-test");
  client = prosody_client_new(conf, err, sizeof(err));
  CHECK(client, "client: %s", err);
  CHECK_OK(prosody_send(client, t1, "k", "{\"x\":1}", NULL, err, sizeof(err)),
           err);
  prosody_client_destroy(client);
  CHECK(t_read_back(t1, 1, 20, r) == 1, "record missing");
  t_records_free(r, 1);
  if (t_real_bootstrap())
    CHECK_OK(prosody_admin_delete_topic(admin, t1, err, sizeof(err)), err);
  prosody_admin_destroy(admin);
  return 0;
}

/* PROSODY_TOPIC_PARTITIONS applies when the call leaves it unset. */
T_SCENARIO(partitions_default_from_environment, T_BOTH, 60) {
  char err[1024];
  prosody_admin_t *admin;
  const char *t2 = t_topic("admin-env");

  setenv("PROSODY_TOPIC_PARTITIONS", "2", 1);
  admin = admin_new();
  CHECK_OK(prosody_admin_create_topic(admin, t2, NULL, err, sizeof(err)), err);
  CHECK(partitions_of(t2) == 2, "%s has %d partitions, want 2 from env", t2,
        partitions_of(t2));
  unsetenv("PROSODY_TOPIC_PARTITIONS");
  if (t_real_bootstrap())
    CHECK_OK(prosody_admin_delete_topic(admin, t2, err, sizeof(err)), err);
  prosody_admin_destroy(admin);
  return 0;
}

T_SCENARIO(bad_name_and_cleanup_policy_named_in_error, T_BOTH, 60) {
  char err[1024];
  prosody_admin_t *admin = admin_new();
  prosody_topic_options_t o = PROSODY_TOPIC_OPTIONS_INIT;
  prosody_err_t e;

  e = prosody_admin_create_topic(admin, "no spaces", NULL, err, sizeof(err));
  CHECK(e == PROSODY_ERR_INVALID_ARG, "bad name: %s", prosody_err_name(e));
  o.partitions = 3;
  o.replication_factor = 1;
  o.cleanup_policy = "shred";
  e = prosody_admin_create_topic(admin, t_topic("admin-bad"), &o, err,
                                 sizeof(err));
  /* An invalid argument, named as such: not the environment variable the
   * caller never set. */
  CHECK(e == PROSODY_ERR_INVALID_ARG && strstr(err, "cleanup_policy") &&
            strstr(err, "\"shred\"") &&
            strstr(err, "one of delete, compact, compact,delete, "
                        "delete,compact, or none") &&
            !strstr(err, "PROSODY_TOPIC_CLEANUP_POLICY"),
        "bad policy: %s (%s)", prosody_err_name(e), err);
  /* The variable is named when the value came from it. */
  setenv("PROSODY_TOPIC_CLEANUP_POLICY", "shred", 1);
  {
    prosody_config_t *conf = t_config(); /* still ours when _new fails */
    prosody_admin_t *a = prosody_admin_new(conf, err, sizeof(err));
    CHECK(!a && strstr(err, "\"shred\"") &&
              strstr(err, "environment variable PROSODY_TOPIC_CLEANUP_POLICY"),
          "bad policy from the environment: %s", a ? "accepted" : err);
    prosody_config_destroy(conf);
  }
  unsetenv("PROSODY_TOPIC_CLEANUP_POLICY");
  prosody_admin_destroy(admin);
  return 0;
}

/* Delete, then the topic is gone, then it can be created again. */
T_SCENARIO(deleted_topic_is_gone_and_can_be_created_again, T_BOTH, 60) {
  char err[1024];
  prosody_admin_t *admin = admin_new();
  const char *t2 = t_topic("admin-delete");
  prosody_err_t e;

  CHECK_OK(prosody_admin_create_topic(admin, t2, NULL, err, sizeof(err)), err);
  CHECK(partitions_of(t2) > 0, "%s not created", t2);
  CHECK_OK(prosody_admin_delete_topic(admin, t2, err, sizeof(err)), err);
  CHECK(partitions_of(t2) < 0, "%s still listed after delete", t2);
  e = prosody_admin_delete_topic(admin, t2, err, sizeof(err));
  CHECK(e == PROSODY_ERR_UNKNOWN_TOPIC, "second delete: %s (%s)",
        prosody_err_name(e), err);
  CHECK_OK(prosody_admin_create_topic(admin, t2, NULL, err, sizeof(err)), err);
  CHECK(partitions_of(t2) > 0, "%s not back after re-create", t2);
  if (t_real_bootstrap())
    CHECK_OK(prosody_admin_delete_topic(admin, t2, err, sizeof(err)), err);
  prosody_admin_destroy(admin);
  return 0;
}

/* The cleanup policy and retention reach the topic's config; "none" is the
 * broker's default (the mock cluster keeps no topic config). */
T_SCENARIO(cleanup_policy_and_retention_reach_topic_config, T_REAL, 60) {
  char err[1024], value[64];
  prosody_admin_t *admin = admin_new();
  const char *t3 = t_topic("admin-config");
  prosody_topic_options_t c = PROSODY_TOPIC_OPTIONS_INIT;

  c.partitions = 1;
  c.cleanup_policy = "compact";
  c.retention_ms = 3600000;
  CHECK_OK(prosody_admin_create_topic(admin, t3, &c, err, sizeof(err)), err);
  topic_config(t3, "cleanup.policy", value, sizeof(value));
  CHECK(!strcmp(value, "compact"), "cleanup.policy is \"%s\"", value);
  topic_config(t3, "retention.ms", value, sizeof(value));
  CHECK(!strcmp(value, "3600000"), "retention.ms is \"%s\"", value);
  CHECK_OK(prosody_admin_delete_topic(admin, t3, err, sizeof(err)), err);
  {
    const char *t4 = t_topic("admin-policy-none");
    c.cleanup_policy = "none";
    c.retention_ms = 0;
    CHECK_OK(prosody_admin_create_topic(admin, t4, &c, err, sizeof(err)), err);
    topic_config(t4, "cleanup.policy", value, sizeof(value));
    CHECK(!strcmp(value, "delete"), "cleanup.policy is \"%s\"", value);
    CHECK_OK(prosody_admin_delete_topic(admin, t4, err, sizeof(err)), err);
  }
  prosody_admin_destroy(admin);
  return 0;
}
