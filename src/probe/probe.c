/*
 * probe.c - GET /readyz and /livez over libmicrohttpd.
 *
 *   /readyz  200 when at least one partition is assigned, else 503
 *   /livez   200 unless a partition's oldest unfinished event has made no
 *            progress for stall_threshold, then 503
 *   /metrics the consumer's metrics in Prometheus text format 0.0.4
 * Bodies are plain text saying why. Anything else is 404; other methods
 * are 405.
 */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../util/util.h"
#include "probe.h"

struct pr__probe {
  struct MHD_Daemon *daemon; /* owns its thread */
  pr__probe_source_t src;    /* immutable after _start */
  int port;                  /* immutable after _start */
};

static enum MHD_Result reply_as(struct MHD_Connection *conn, unsigned status,
                                const char *body, const char *type) {
  struct MHD_Response *r = MHD_create_response_from_buffer(
      strlen(body), (void *)body, MHD_RESPMEM_MUST_COPY);
  enum MHD_Result ret;
  if (!r)
    return MHD_NO;
  MHD_add_response_header(r, "Content-Type", type);
  ret = MHD_queue_response(conn, status, r);
  MHD_destroy_response(r);
  return ret;
}

static enum MHD_Result reply(struct MHD_Connection *conn, unsigned status,
                             const char *body) {
  return reply_as(conn, status, body, "text/plain; charset=utf-8");
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn,
                                  const char *url, const char *method,
                                  const char *version, const char *data,
                                  size_t *data_size, void **state) {
  pr__probe_t *probe = cls;
  char body[160];
  (void)version;
  (void)data;
  (void)data_size;
  (void)state;
  if (strcmp(method, "GET") && strcmp(method, "HEAD"))
    return reply(conn, 405, "method not allowed: use GET\n");
  if (!strcmp(url, "/readyz")) {
    int n = probe->src.assigned(probe->src.opaque);
    if (n <= 0)
      return reply(conn, 503, "not ready: no partitions assigned\n");
    snprintf(body, sizeof(body), "ready: %d partition(s) assigned\n", n);
    return reply(conn, 200, body);
  }
  if (!strcmp(url, "/livez")) {
    if (probe->src.stalled(probe->src.opaque))
      return reply(conn, 503,
                   "not live: a partition has made no progress for longer "
                   "than stall_threshold\n");
    return reply(conn, 200, "live\n");
  }
  if (!strcmp(url, "/metrics")) {
    char *text = probe->src.metrics(probe->src.opaque);
    enum MHD_Result ret;
    if (!text)
      return reply(conn, 500, "out of memory\n");
    ret = reply_as(conn, 200, text, "text/plain; version=0.0.4; charset=utf-8");
    free(text);
    return ret;
  }
  return reply(conn, 404, "not found: try /readyz, /livez or /metrics\n");
}

pr__probe_t *pr__probe_start(const char *host, int port, pr__probe_source_t src,
                             char *errstr, size_t errstr_size) {
  pr__probe_t *probe = calloc(1, sizeof(*probe));
  const union MHD_DaemonInfo *info;
  struct sockaddr_in a4 = {0};
  struct sockaddr_in6 a6 = {0};
  const struct sockaddr *addr;
  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
  if (!probe) {
    pr__errf(errstr, errstr_size, "out of memory");
    return NULL;
  }
  if (inet_pton(AF_INET, host, &a4.sin_addr) == 1) {
    a4.sin_family = AF_INET;
    a4.sin_port = htons((uint16_t)port);
    addr = (const struct sockaddr *)&a4;
  } else if (inet_pton(AF_INET6, host, &a6.sin6_addr) == 1) {
    a6.sin6_family = AF_INET6;
    a6.sin6_port = htons((uint16_t)port);
    addr = (const struct sockaddr *)&a6;
    flags |= MHD_USE_IPv6;
  } else {
    pr__errf(errstr, errstr_size,
             "probe_host (PROSODY_PROBE_HOST) \"%s\" is no IP address; "
             "expected one such as 0.0.0.0, :: or 127.0.0.1",
             host);
    free(probe);
    return NULL;
  }
  probe->src = src;
  probe->daemon = MHD_start_daemon(flags, (uint16_t)port, NULL, NULL,
                                   on_request, probe, MHD_OPTION_SOCK_ADDR,
                                   addr, MHD_OPTION_CONNECTION_TIMEOUT,
                                   (unsigned)10, MHD_OPTION_END);
  if (!probe->daemon) {
    pr__errf(errstr, errstr_size,
             "could not start the probe server on %s port %d (probe_host "
             "PROSODY_PROBE_HOST, probe_port PROSODY_PROBE_PORT): is the port "
             "in use, or the address not this host's? Set probe_port=none to "
             "disable it",
             host, port);
    free(probe);
    return NULL;
  }
  info = MHD_get_daemon_info(probe->daemon, MHD_DAEMON_INFO_BIND_PORT);
  probe->port = info ? info->port : port;
  PR_INFO("probe", "probe server on %s port %d (/readyz, /livez, /metrics)",
          host, probe->port);
  return probe;
}

int pr__probe_port(const pr__probe_t *probe) { return probe->port; }

void pr__probe_stop(pr__probe_t *probe) {
  if (!probe)
    return;
  MHD_stop_daemon(probe->daemon);
  free(probe);
}
