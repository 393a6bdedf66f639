/*
 * probe.h - the liveness/readiness HTTP server (private).
 *
 * libmicrohttpd runs it on its own thread; the handler reads only the
 * engine's atomics (through the callbacks), so it takes no engine lock.
 */
#ifndef PR_PROBE_H
#define PR_PROBE_H

typedef struct pr__probe pr__probe_t;

typedef struct pr__probe_source {
  int (*assigned)(void *opaque);  /* partitions assigned now */
  int (*stalled)(void *opaque);   /* 1 if a partition is stalled */
  char *(*metrics)(void *opaque); /* Prometheus text, malloc'd; NULL: OOM */
  void *opaque;
} pr__probe_source_t;

/* Listens on `host` (an IPv4 or IPv6 address, checked by the option
 * table's probe_host rule) at `port` (0: any free port). NULL on error. */
pr__probe_t *pr__probe_start(const char *host, int port, pr__probe_source_t src,
                             char *errstr, size_t errstr_size);
/* The port actually bound. */
int pr__probe_port(const pr__probe_t *probe);
/* Stops the server (waits for requests in progress). NULL is a no-op. */
void pr__probe_stop(pr__probe_t *probe);

#endif /* PR_PROBE_H */
