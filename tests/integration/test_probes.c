/*
 * test_probes.c - /readyz and /livez: 503 before any partition is assigned,
 * 200 once assigned; /livez turns 503 when a handler makes no progress for
 * stall_threshold and 200 again once it finishes; bodies say why; /metrics
 * answers (the Python suite parses it); 404 for
 * other paths; the server stops with unsubscribe. Also prosody_is_stalled,
 * and probe_host: every interface by default, loopback only when asked.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <sys/socket.h>

#include "harness.h"

static atomic_int blocked, release_it;

static prosody_result_t handler(prosody_context_t *ctx,
                                const prosody_message_t *m, void *op) {
  atomic_store(&blocked, 1);
  while (!atomic_load(&release_it))
    usleep(1000);
  return PROSODY_SUCCESS;
}

/* 1 if a TCP connection to `ip`:`port` is accepted. 127.0.0.2 is on the
 * loopback interface too but is not 127.0.0.1: a server bound to 127.0.0.1
 * refuses it, one bound to every interface accepts it. */
static int connects(const char *ip, int port) {
  struct sockaddr_in a = {0};
  int fd = socket(AF_INET, SOCK_STREAM, 0), ok;
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  inet_pton(AF_INET, ip, &a.sin_addr);
  ok = connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
  close(fd);
  return ok;
}

T_SCENARIO(readiness_liveness_and_stall_reported, T_BOTH, 90) {
  char err[1024], topic[128], group[160], body[32768];
  prosody_config_t *conf;
  prosody_client_t *c;
  prosody_handler_t h = {handler, NULL, NULL, 0};
  int port, status;
  double deadline;

  snprintf(topic, sizeof(topic), "%s", t_topic("probes"));
  snprintf(group, sizeof(group), "%s-g", topic);
  t_create_topic(topic, 1);
  conf = t_consumer_config(group, topic);
  t_set(conf, "probe_port", "0"); /* any free port */
  t_set(conf, "stall_threshold", "1s");
  t_set(conf, "timeout", "10s");
  c = prosody_client_new(conf, err, sizeof(err));
  CHECK(c, "%s", err);
  CHECK(prosody_probe_port(c) == -1, "probe server before subscribe");
  CHECK_OK(prosody_subscribe(c, &h, err, sizeof(err)), err);
  port = prosody_probe_port(c);
  CHECK(port > 0, "no probe port");
  CHECK(connects("127.0.0.2", port), "probe_host 0.0.0.0 (the default) does "
                                     "not listen on every interface");

  /* Before the first assignment (the mock's first join takes seconds). */
  status = t_http_get(port, "/readyz", body, sizeof(body));
  if (prosody_assigned_partition_count(c) == 0) {
    CHECK(status == 503, "/readyz before assignment: %d", status);
    CHECK(strstr(body, "no partitions assigned"), "body: %s", body);
  }
  deadline = t_now() + 60;
  while (prosody_assigned_partition_count(c) == 0 && t_now() < deadline)
    usleep(10000);
  status = t_http_get(port, "/readyz", body, sizeof(body));
  CHECK(status == 200 && strstr(body, "1 partition"), "/readyz: %d %s", status,
        body);
  status = t_http_get(port, "/livez", body, sizeof(body));
  CHECK(status == 200, "/livez: %d %s", status, body);
  status = t_http_get(port, "/metrics", body, sizeof(body));
  CHECK(status == 200 && strstr(body, "\nprosody_partitions_assigned 1\n"),
        "/metrics: %d %.300s", status, body);
  status = t_http_get(port, "/nothing", body, sizeof(body));
  CHECK(status == 404, "/nothing: %d", status);

  /* A handler that makes no progress for stall_threshold. */
  t_produce(topic, 0, 1, 1);
  deadline = t_now() + 30;
  while (!atomic_load(&blocked) && t_now() < deadline)
    usleep(10000);
  CHECK(atomic_load(&blocked), "the handler never ran");
  deadline = t_now() + 10;
  while (!prosody_is_stalled(c) && t_now() < deadline)
    usleep(20000);
  CHECK(prosody_is_stalled(c), "not reported stalled");
  status = t_http_get(port, "/livez", body, sizeof(body));
  CHECK(status == 503 && strstr(body, "stall_threshold"), "/livez: %d %s",
        status, body);
  atomic_store(&release_it, 1);
  deadline = t_now() + 10;
  while (prosody_is_stalled(c) && t_now() < deadline)
    usleep(20000);
  status = t_http_get(port, "/livez", body, sizeof(body));
  CHECK(status == 200, "/livez after progress: %d %s", status, body);

  CHECK_OK(prosody_unsubscribe(c), "unsubscribe");
  CHECK(t_http_get(port, "/readyz", body, sizeof(body)) == -1,
        "probe server still answers after unsubscribe");
  prosody_client_destroy(c);

  /* probe_host=127.0.0.1: loopback only. */
  conf = t_consumer_config(group, topic);
  t_set(conf, "probe_port", "0");
  t_set(conf, "probe_host", "127.0.0.1");
  c = prosody_client_new(conf, err, sizeof(err));
  CHECK(c, "%s", err);
  CHECK_OK(prosody_subscribe(c, &h, err, sizeof(err)), err);
  port = prosody_probe_port(c);
  CHECK(connects("127.0.0.1", port) && !connects("127.0.0.2", port),
        "probe_host=127.0.0.1 should accept 127.0.0.1 only");
  CHECK_OK(prosody_unsubscribe(c), "unsubscribe");
  prosody_client_destroy(c);

  /* Not an IP address: refused at configuration, naming the option. */
  conf = t_consumer_config(group, topic);
  t_set(conf, "probe_host", "localhost");
  CHECK(!prosody_client_new(conf, err, sizeof(err)) &&
            strstr(err, "probe_host (PROSODY_PROBE_HOST)"),
        "probe_host=localhost: %s", err);
  prosody_config_destroy(conf);
  printf("ok: readiness, liveness and stall reporting\n");
  return 0;
}
