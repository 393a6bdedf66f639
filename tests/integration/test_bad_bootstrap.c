/*
 * test_bad_bootstrap.c - an unreachable broker gives a clear, transient
 * error within the configured budget, never a hang: for a blocking send, an
 * async send, admin topic creation, and client destruction; and consuming
 * without Cassandra outside mock mode is a configuration error.
 */
#include <pthread.h>
#include <stdatomic.h>

#include "harness.h"

static atomic_int async_calls;
static atomic_int async_err;

static void on_delivery(prosody_err_t err, const char *errstr,
                        const prosody_delivery_t *d, void *opaque) {
  atomic_store(&async_err, (int)err);
  atomic_fetch_add(&async_calls, 1);
}

static prosody_result_t on_message(prosody_context_t *ctx,
                                   const prosody_message_t *m, void *op) {
  (void)ctx;
  (void)m;
  (void)op;
  return PROSODY_SUCCESS;
}

static prosody_result_t on_timer(prosody_context_t *ctx,
                                 const prosody_timer_t *t, void *op) {
  (void)ctx;
  (void)t;
  (void)op;
  return PROSODY_SUCCESS;
}

int main(void) {
  char err[1024];
  prosody_config_t *conf = prosody_config_new();
  prosody_client_t *client;
  prosody_admin_t *admin;
  prosody_topic_options_t o = PROSODY_TOPIC_OPTIONS_INIT;
  prosody_err_t e;
  double t0, took;

  /* Port 1 on loopback: nothing listens, connections are refused. */
  t_set(conf, "bootstrap_servers", "127.0.0.1:1");
  t_set(conf, "source_system", "unreachable");
  t_set(conf, "send_timeout", "1s");
  t_set(conf, "log", "off");
  client = prosody_client_new(conf, err, sizeof(err));
  CHECK(client, "creating a client must not need the broker: %s", err);

  t0 = t_now();
  e = prosody_send(client, "orders", "k", "{}", NULL, err, sizeof(err));
  took = t_now() - t0;
  CHECK(e == PROSODY_ERR_TIMEOUT, "got %s (%s)", prosody_err_name(e), err);
  CHECK(prosody_err_is_transient(e), "timeout must be transient");
  /* exactly the budget: librdkafka's own report can come a second late */
  CHECK(took >= 0.95 && took < 1.4, "send took %.2f s with send_timeout 1s",
        took);
  CHECK(strstr(err, "orders") && strstr(err, "send_timeout 1s"),
        "message \"%s\" should name the topic and the budget", err);
  CHECK(strstr(err, "127.0.0.1:1"),
        "message \"%s\" should quote the broker error", err);

  CHECK_OK(prosody_send_async(client, "orders", "k", "{}", NULL, on_delivery,
                              NULL, err, sizeof(err)),
           err);
  t0 = t_now();
  while (atomic_load(&async_calls) == 0 && t_now() - t0 < 10)
    usleep(10000);
  CHECK(atomic_load(&async_calls) == 1, "async callback never fired");
  CHECK(atomic_load(&async_err) == PROSODY_ERR_TIMEOUT, "async error %s",
        prosody_err_name((prosody_err_t)atomic_load(&async_err)));

  t0 = t_now();
  prosody_client_destroy(client);
  took = t_now() - t0;
  CHECK(took < 5.0, "destroy took %.2f s", took);

  conf = prosody_config_new();
  t_set(conf, "bootstrap_servers", "127.0.0.1:1");
  t_set(conf, "log", "off");
  admin = prosody_admin_new(conf, err, sizeof(err));
  CHECK(admin, "admin: %s", err);
  o.timeout_ms = 2000;
  t0 = t_now();
  e = prosody_admin_create_topic(admin, "orders", &o, err, sizeof(err));
  took = t_now() - t0;
  CHECK(e == PROSODY_ERR_TIMEOUT || e == PROSODY_ERR_TRANSIENT,
        "create: %s (%s)", prosody_err_name(e), err);
  CHECK(took < 6.0, "create took %.2f s with timeout 2s", took);
  CHECK(strstr(err, "orders"), "message \"%s\" should name the topic", err);
  prosody_admin_destroy(admin);

  /* A malformed address is a configuration error naming the option. */
  conf = prosody_config_new();
  e = prosody_config_set(conf, "bootstrap_servers", "localhost", err,
                         sizeof(err));
  CHECK(e == PROSODY_ERR_CONFIG && strstr(err, "bootstrap_servers") &&
            strstr(err, "host:port"),
        "bad address: %s", err);
  prosody_config_destroy(conf);

  /* Consuming with timers outside mock mode needs Cassandra: without
   * cassandra_nodes, subscribe fails at once with a configuration error
   * naming the option (it is not worth retrying). */
  conf = prosody_config_new();
  t_set(conf, "bootstrap_servers", "127.0.0.1:1");
  t_set(conf, "group_id", "no-cassandra");
  t_set(conf, "subscribed_topics", "orders");
  t_set(conf, "probe_port", "none");
  t_set(conf, "log", "off");
  client = prosody_client_new(conf, err, sizeof(err));
  CHECK(client, "%s", err);
  {
    prosody_handler_t h = {on_message, on_timer, NULL, 0};
    t0 = t_now();
    e = prosody_subscribe(client, &h, err, sizeof(err));
    took = t_now() - t0;
  }
  CHECK(e == PROSODY_ERR_CONFIG && strstr(err, "cassandra_nodes") &&
            strstr(err, "host:port"),
        "subscribe without cassandra_nodes: %s (%s)", prosody_err_name(e), err);
  CHECK(took < 2.0, "the configuration error took %.2f s", took);
  CHECK(prosody_assigned_partition_count(client) == 0, "assigned");
  prosody_client_destroy(client);
  printf("ok\n");
  return 0;
}
