/*
 * test_bad_bootstrap.c - an unreachable broker gives a clear, transient
 * error within the configured budget, never a hang: for a blocking send, an
 * async send, admin topic creation, and client destruction; and consuming
 * without Cassandra outside mock mode is a configuration error. Admin
 * create/delete fail at once, saying why, against a refused port and
 * against a librdkafka mock cluster reached over the network (which has no
 * admin API: `prosody broker`). A send to a port that is not Kafka (a
 * service answering in another protocol, as Cassandra's port does) or to a
 * listener that stays silent fails at send_timeout, naming host:port and
 * saying what it saw there.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/socket.h>

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

/* A loopback listener; its "127.0.0.1:PORT" in `addr`. */
static int listen_at(char *addr, size_t n) {
  struct sockaddr_in a = {0};
  socklen_t len = sizeof(a);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  CHECK(fd >= 0 && !bind(fd, (struct sockaddr *)&a, sizeof(a)) &&
            !listen(fd, 16) && !getsockname(fd, (struct sockaddr *)&a, &len),
        "listener");
  snprintf(addr, n, "127.0.0.1:%d", ntohs(a.sin_port));
  return fd;
}

/* Not Kafka: answers whatever comes with an HTTP error and hangs up. */
static atomic_int stop_http;
static void *http_main(void *arg) {
  int lfd = *(int *)arg;
  static const char reply[] = "HTTP/1.1 400 Bad Request\r\n\r\n";
  while (!atomic_load(&stop_http)) {
    struct pollfd p = {lfd, POLLIN, 0};
    char buf[512];
    int fd;
    if (poll(&p, 1, 50) <= 0 || (fd = accept(lfd, NULL, NULL)) < 0)
      continue;
    p.fd = fd;
    if (poll(&p, 1, 1000) > 0 && read(fd, buf, sizeof(buf)) > 0 &&
        write(fd, reply, sizeof(reply) - 1) < 0)
      perror("write");
    close(fd);
  }
  return NULL;
}

/* A blocking send with send_timeout=1s to `bootstrap` fails with a
 * timeout at the budget, the message naming it and holding `seen`. */
static void send_sees(const char *bootstrap, const char *seen) {
  char err[1536];
  prosody_config_t *conf = prosody_config_new();
  prosody_client_t *client;
  prosody_err_t e;
  double t0, took;
  t_set(conf, "bootstrap_servers", bootstrap);
  t_set(conf, "source_system", "not-kafka");
  t_set(conf, "send_timeout", "1s");
  t_set(conf, "log", "off");
  client = prosody_client_new(conf, err, sizeof(err));
  CHECK(client, "%s", err);
  t0 = t_now();
  e = prosody_send(client, "orders", "k", "{}", NULL, err, sizeof(err));
  took = t_now() - t0;
  CHECK(e == PROSODY_ERR_TIMEOUT, "%s: got %s (%s)", bootstrap,
        prosody_err_name(e), err);
  CHECK(took >= 0.95 && took < 1.3, "%s: send took %.2f s with send_timeout 1s",
        bootstrap, took);
  CHECK(strstr(err, bootstrap) && strstr(err, seen),
        "message \"%s\" should name %s and say \"%s\"", err, bootstrap, seen);
  t0 = t_now();
  prosody_client_destroy(client);
  took = t_now() - t0;
  CHECK(took < 0.5, "%s: destroy after the failed send took %.2f s", bootstrap,
        took);
}

/* An admin handle for `bootstrap` (mock=false). */
static prosody_admin_t *admin_at(const char *bootstrap) {
  char err[1024];
  prosody_config_t *conf = prosody_config_new();
  prosody_admin_t *admin;
  t_set(conf, "bootstrap_servers", bootstrap);
  t_set(conf, "log", "off");
  admin = prosody_admin_new(conf, err, sizeof(err));
  CHECK(admin, "admin: %s", err);
  return admin;
}

/* Create and delete with the default (30 s) timeout both fail with `want`
 * in well under two seconds, the message holding `needle`. */
static void admin_fails_fast(prosody_admin_t *admin, prosody_err_t want,
                             const char *needle) {
  char err[1024];
  for (int create = 1; create >= 0; create--) {
    double t0 = t_now(), took;
    prosody_err_t e =
        create ? prosody_admin_create_topic(admin, "orders", NULL, err,
                                            sizeof(err))
               : prosody_admin_delete_topic(admin, "orders", err, sizeof(err));
    took = t_now() - t0;
    CHECK(e == want, "%s: %s, want %s (%s)", create ? "create" : "delete",
          prosody_err_name(e), prosody_err_name(want), err);
    CHECK(took < 2.0, "%s took %.2f s: %s", create ? "create" : "delete", took,
          err);
    CHECK(strstr(err, "\"orders\"") && strstr(err, needle),
          "message \"%s\" should name the topic and say \"%s\"", err, needle);
  }
}

T_SCENARIO(refused_port_send_fails_at_send_timeout, T_MOCK, 60) {
  char err[1024];
  prosody_config_t *conf = prosody_config_new();
  prosody_client_t *client;
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
  CHECK(took >= 0.95 && took < 1.3, "send took %.2f s with send_timeout 1s",
        took);
  CHECK(strstr(err, "orders") && strstr(err, "send_timeout 1s"),
        "message \"%s\" should name the topic and the budget", err);
  CHECK(strstr(err, "127.0.0.1:1"),
        "message \"%s\" should quote the broker error", err);

  /* The async report comes at send_timeout too (librdkafka's own comes
   * up to a second later), and destroy then has nothing to wait for. */
  t0 = t_now();
  CHECK_OK(prosody_send_async(client, "orders", "k", "{}", NULL, on_delivery,
                              NULL, err, sizeof(err)),
           err);
  while (atomic_load(&async_calls) == 0 && t_now() - t0 < 10)
    usleep(1000);
  took = t_now() - t0;
  CHECK(atomic_load(&async_calls) == 1, "async callback never fired");
  CHECK(atomic_load(&async_err) == PROSODY_ERR_TIMEOUT, "async error %s",
        prosody_err_name((prosody_err_t)atomic_load(&async_err)));
  CHECK(took >= 0.95 && took < 1.3,
        "async report took %.2f s with send_timeout 1s", took);

  t0 = t_now();
  prosody_client_destroy(client);
  took = t_now() - t0;
  CHECK(took < 0.5, "destroy took %.2f s", took);
  return 0;
}

/* Not Kafka, and a silent listener: what was seen there, at the budget. */
T_SCENARIO(not_kafka_and_silent_listener_named_at_send_timeout, T_MOCK, 60) {
  {
    char http[64], silent[64];
    int hfd = listen_at(http, sizeof(http));
    int sfd = listen_at(silent, sizeof(silent)); /* never accepts: the
                                                    kernel does */
    pthread_t thr;
    CHECK(!pthread_create(&thr, NULL, http_main, &hfd), "thread");
    send_sees(http, " is not a Kafka broker: it answered Kafka's first "
                    "request (ApiVersion) with bytes that are no Kafka "
                    "response (it began \"HTTP\": an HTTP server)");
    send_sees(silent, " accepted a TCP connection but sent nothing back to "
                      "Kafka's first request (ApiVersion)");
    atomic_store(&stop_http, 1);
    pthread_join(thr, NULL);
    close(hfd);
    close(sfd);
  }
  return 0;
}

/* Cassandra's port, when a node runs here (the real tier's services). */
T_SCENARIO(cassandra_port_named_as_not_kafka, T_MOCK, 60) {
  int skipped = 0;
  {
    const char *nodes = getenv("PROSODY_TEST_CASSANDRA_NODES");
    char node[64];
    struct sockaddr_in a = {0};
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    snprintf(node, sizeof(node), "%.*s",
             nodes && *nodes ? (int)strcspn(nodes, ",") : 14,
             nodes && *nodes ? nodes : "127.0.0.1:9042");
    a.sin_family = AF_INET;
    a.sin_port = htons(9042);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if ((nodes && *nodes) || !connect(fd, (struct sockaddr *)&a, sizeof(a)))
      send_sees(node, " is not a Kafka broker: it answered Kafka's first "
                      "request (ApiVersion) with bytes that are no Kafka "
                      "response (a CQL frame: Cassandra's protocol)");
    else
      printf("no Cassandra at 127.0.0.1:9042: its port not tried\n"),
          skipped = 1;
    close(fd);
  }
  return skipped ? T_SKIP : 0;
}

T_SCENARIO(admin_at_refused_port_fails_fast_naming_topic, T_MOCK, 60) {
  char err[1024];
  prosody_config_t *conf;
  prosody_admin_t *admin;
  prosody_topic_options_t o = PROSODY_TOPIC_OPTIONS_INIT;
  prosody_err_t e;
  double t0, took;

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

  /* With the default timeout: no 30 s wait for a refused port. */
  admin = admin_at("127.0.0.1:1");
  admin_fails_fast(admin, PROSODY_ERR_TRANSIENT,
                   "no Kafka broker answers at 127.0.0.1:1 (");
  prosody_admin_destroy(admin);
  return 0;
}

/* A librdkafka mock cluster over the network (what `prosody broker`
 * serves) has no admin API: said at once, with the partition count it
 * gives a topic it creates on first use, which a metadata request for
 * an unknown topic shows. */
T_SCENARIO(admin_at_networked_mock_cluster_unsupported, T_MOCK, 60) {
  char err[1024];
  prosody_admin_t *admin;
  {
    char addr[256], want[128];
    rd_kafka_conf_t *kc = rd_kafka_conf_new();
    rd_kafka_t *rk;
    rd_kafka_topic_t *rkt;
    const struct rd_kafka_metadata *md;
    int n;
    CHECK_OK(
        prosody_mock_bootstrap_servers(addr, sizeof(addr), err, sizeof(err)),
        err);
    rd_kafka_conf_set(kc, "bootstrap.servers", addr, err, sizeof(err));
    rk = rd_kafka_new(RD_KAFKA_PRODUCER, kc, err, sizeof(err));
    CHECK(rk, "%s", err);
    rkt = rd_kafka_topic_new(rk, "auto-created", NULL);
    CHECK(!rd_kafka_metadata(rk, 0, rkt, &md, 10000), "metadata failed");
    n = md->topic_cnt == 1 && !md->topics[0].err ? md->topics[0].partition_cnt
                                                 : -1;
    rd_kafka_metadata_destroy(md);
    rd_kafka_topic_destroy(rkt);
    rd_kafka_destroy(rk);
    CHECK(n > 0, "the mock did not create a topic on first use");
    snprintf(want, sizeof(want),
             "creates a topic on first use, with %d "
             "partitions",
             n);
    admin = admin_at(addr);
    admin_fails_fast(admin, PROSODY_ERR_UNSUPPORTED, want);
    admin_fails_fast(admin, PROSODY_ERR_UNSUPPORTED, "mock cluster");
    prosody_admin_destroy(admin);
  }
  return 0;
}

/* A malformed address is a configuration error naming the option. */
T_SCENARIO(malformed_bootstrap_is_config_error_naming_option, T_MOCK, 30) {
  char err[1024];
  prosody_config_t *conf = prosody_config_new();
  prosody_err_t e;
  e = prosody_config_set(conf, "bootstrap_servers", "localhost", err,
                         sizeof(err));
  CHECK(e == PROSODY_ERR_CONFIG && strstr(err, "bootstrap_servers") &&
            strstr(err, "host:port"),
        "bad address: %s", err);
  prosody_config_destroy(conf);
  return 0;
}

/* Consuming with timers outside mock mode needs Cassandra: without
 * cassandra_nodes, subscribe fails at once with a configuration error
 * naming the option (it is not worth retrying). */
T_SCENARIO(timers_without_cassandra_nodes_refused_at_subscribe, T_MOCK, 30) {
  char err[1024];
  prosody_config_t *conf = prosody_config_new();
  prosody_client_t *client;
  prosody_err_t e;
  double t0, took;

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
