/*
 * cql.c - the Cassandra session (see cql.h).
 *
 * Ownership: everything here belongs to the thread running the session's
 * loop; no locks. A request lives from submission until its callback ran
 * and its timer handle closed; while on the wire it sits in its
 * connection's stream table. A request that timed out leaves an ORPHAN
 * marker in its stream slot so the id is not reused before the late
 * response arrives (or the connection drops).
 *
 * Requests' frames are not written one syscall each: send_req() queues a
 * frame on its connection, and the session's prepare handle (which runs
 * once per loop iteration, right before the loop polls) writes each
 * connection's queued frames with one uv_write (writev). A round of
 * callbacks that sends several requests (a timer store's group: its slab
 * rows and its key rows) so costs one write instead of one per request
 * (measured: a TCP write on loopback also runs the receiving side's
 * processing, ~10 us of our CPU each). The connection's handshake frames
 * are still written at once.
 *
 * TLS (conf.ssl): OpenSSL over memory BIOs on the same libuv stream.
 * Ciphertext read goes into the SSL's read BIO and the plaintext it yields
 * into rbuf, where the frame parser reads it as before; frames written go
 * through SSL_write and what the write BIO then holds is written to the
 * stream. The handshake runs before STARTUP, verifying the node's
 * certificate and that it names the host we connected to (the host of
 * cassandra_nodes, or a discovered node's address).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>

#include "../util/util.h"
#include "cql.h"

#define MAX_STREAMS 1024
#define READ_CHUNK 65536
#define BACKOFF_MIN_MS 100
#define BACKOFF_MAX_MS 5000
#define MAX_TIMEOUTS_IN_ROW 3 /* then the connection is replaced */
#define OUT_MAX 64            /* frames queued on a connection, at most */

enum { K_QUERY, K_EXEC, K_BATCH, K_PREPARE };
enum { Q_NONE, Q_PENDING, Q_WAITING, Q_WIRE };
enum { C_DOWN, C_CONNECTING, C_STARTING, C_UP };

typedef struct conn conn_t;
typedef struct req req_t;

struct pr__cql_stmt {
  pr__cql_stmt_t *next;
  char *query;
  uint8_t id[64];
  uint16_t id_len;  /* 0: not prepared (yet, or any more) */
  req_t *preparing; /* the PREPARE in flight, or NULL */
  req_t *wait_head; /* executions waiting for it */
  req_t *wait_tail;
};

struct req {
  req_t *next;
  pr__cql_t *s;
  int kind, where, reprepared, finished;
  char *query;        /* K_QUERY (owned) */
  pr__cql_stmt_t *st; /* K_EXEC, K_PREPARE */
  pr__cql_val_t *vals;
  uint16_t nvals;
  uint8_t *blob; /* value bytes (owned) */
  pr__cql_bstmt_t *bstmts;
  uint16_t nb;
  uint8_t btype;
  pr__cql_opts_t opts;
  uint8_t *paging; /* copy of opts.paging_state */
  pr__cql_cb cb;
  void *arg;
  int64_t ts; /* its client timestamp, taken when it was issued (so writes
                 resolve in the order they were issued, even when one waits
                 for its statement to be prepared or its connection to come
                 up and a later one does not), kept when it is sent again */
  conn_t *conn;
  int16_t stream;
  uv_timer_t *timer;
};

static req_t orphan; /* marks a stream whose request timed out */

struct conn {
  pr__cql_t *s;
  char *host;
  int port;
  int state;
  uv_tcp_t *tcp;
  uv_timer_t *retry;
  int backoff_ms;
  uint8_t *rbuf;
  size_t rlen, rcap;
  req_t *streams[MAX_STREAMS];
  int inflight, next_stream;
  int orphans;           /* stream ids reserved by timed-out requests */
  int timeouts_row;      /* requests timed out since the last answer */
  char dc[64], rack[64]; /* from system.local / system.peers; "" unknown */
  uv_buf_t out[OUT_MAX]; /* frames queued for the next flush (malloc'd) */
  unsigned nout;
  int flushing; /* on the session's flush list */
  int wfail;    /* a write could not start: the flush fails the conn */
  conn_t *fnext;
  SSL *ssl;      /* TLS over memory BIOs (see the top); NULL: plaintext */
  int tls_up;    /* the handshake finished */
  uint8_t *cbuf; /* TLS: ciphertext as read (READ_CHUNK bytes) */
};

struct pr__cql {
  uv_loop_t *loop;
  pr__cql_conf_t conf; /* nodes, user and password copied */
  conn_t **conns;      /* configured nodes first, then discovered ones */
  size_t nconns, capconns, rr;
  int discovered; /* system.peers has been read */
  req_t *pend_head, *pend_tail;
  pthread_mutex_t stmt_lock; /* guards the list `stmts` (pr__cql_stmt may
                                run on any thread); each statement's other
                                fields belong to the loop's thread */
  pr__cql_stmt_t *stmts;
  int64_t last_ts;
  SSL_CTX *ssl_ctx;     /* conf.ssl: the TLS settings; NULL: plaintext */
  char last_error[384]; /* "host:port: why" of the last connection lost */
  int closing;
  int handles;         /* open libuv handles: freed at 0 once closing */
  uv_prepare_t *flush; /* writes the connections' queued frames */
  conn_t *flush_head;  /* connections with queued frames */
  char auth_error[1024];
};

static void pump(pr__cql_t *s);
static void conn_connect(conn_t *c);

/* ---- small helpers ------------------------------------------------------ */

static void session_destroy(pr__cql_t *s) {
  {
    for (size_t i = 0; i < s->nconns; i++) {
      free(s->conns[i]->host);
      free(s->conns[i]->rbuf);
      free(s->conns[i]->cbuf);
      SSL_free(s->conns[i]->ssl);
      free(s->conns[i]);
    }
    free(s->conns);
    for (size_t i = 0; s->conf.nodes && i < s->conf.nnodes; i++)
      free(s->conf.nodes[i]);
    free(s->conf.nodes);
    free((char *)s->conf.user);
    free((char *)s->conf.password);
    free((char *)s->conf.datacenter);
    free((char *)s->conf.rack);
    SSL_CTX_free(s->ssl_ctx);
    while (s->stmts) {
      pr__cql_stmt_t *n = s->stmts->next;
      free(s->stmts->query);
      free(s->stmts);
      s->stmts = n;
    }
    pthread_mutex_destroy(&s->stmt_lock);
    free(s);
  }
}

/* A libuv handle of the session finished closing. */
static void session_release(pr__cql_t *s) {
  if (--s->handles == 0 && s->closing)
    session_destroy(s);
}

static void handle_closed(uv_handle_t *h) {
  pr__cql_t *s = h->data;
  free(h);
  session_release(s);
}

static void close_handle(pr__cql_t *s, uv_handle_t *h) {
  h->data = s;
  uv_close(h, handle_closed);
}

/* Client-side timestamps: microseconds, strictly increasing. */
static int64_t next_ts(pr__cql_t *s) {
  struct timespec ts;
  int64_t us;
  clock_gettime(CLOCK_REALTIME, &ts);
  us = (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
  if (us <= s->last_ts)
    us = s->last_ts + 1;
  return s->last_ts = us;
}

static void req_free(req_t *r) {
  free(r->paging);
  free(r->query);
  free(r->vals);
  free(r->blob);
  free(r->bstmts);
  free(r);
}

static void timer_closed(uv_handle_t *h) {
  req_t *r = h->data;
  pr__cql_t *s = r->s;
  free(h);
  req_free(r);
  session_release(s);
}

/* Unlinks r from the queue it waits in (not the wire). */
static void unqueue(req_t *r) {
  req_t **pp = NULL, **tail = NULL;
  if (r->where == Q_PENDING) {
    pp = &r->s->pend_head;
    tail = &r->s->pend_tail;
  } else if (r->where == Q_WAITING) {
    pp = &r->st->wait_head;
    tail = &r->st->wait_tail;
  }
  if (pp) {
    req_t *prev = NULL;
    while (*pp && *pp != r) {
      prev = *pp;
      pp = &(*pp)->next;
    }
    if (*pp) {
      *pp = r->next;
      if (*tail == r)
        *tail = prev;
    }
  }
  r->where = Q_NONE;
  r->next = NULL;
}

/* Completes a request once: callback, then the timer closes and frees. */
static void finish(req_t *r, prosody_err_t err, const char *errstr,
                   const pr__cql_result_t *res) {
  if (r->finished)
    return;
  r->finished = 1;
  if (r->where == Q_WIRE && r->conn) {
    r->conn->streams[r->stream] = NULL;
    r->conn->inflight--;
  }
  unqueue(r);
  if (r->kind == K_PREPARE && err) {
    /* What waited for this statement fails with it. */
    pr__cql_stmt_t *st = r->st;
    req_t *w = st->wait_head;
    st->preparing = NULL;
    st->wait_head = st->wait_tail = NULL;
    while (w) {
      req_t *n = w->next;
      w->where = Q_NONE;
      w->next = NULL;
      finish(w, err, errstr, NULL);
      w = n;
    }
  }
  if (r->cb)
    r->cb(r->arg, err, errstr, err ? NULL : res);
  uv_timer_stop(r->timer);
  uv_close((uv_handle_t *)r->timer, timer_closed);
}

static void conn_fail(conn_t *c, const char *why);

static void on_req_timeout(uv_timer_t *t) {
  req_t *r = t->data;
  char why[640];
  conn_t *c = r->where == Q_WIRE ? r->conn : NULL;
  if (c) {
    c->streams[r->stream] = &orphan; /* until the late answer */
    c->inflight--;
    c->orphans++;
    r->where = Q_NONE;
  }
  /* Never sent (no connection came up): what the last attempt met. */
  snprintf(why, sizeof(why), "Cassandra did not answer within %lld ms%s%s",
           (long long)r->s->conf.request_timeout_ms,
           !c && r->s->last_error[0] ? "; last connection error: " : "",
           !c ? r->s->last_error : "");
  finish(r, PROSODY_ERR_TIMEOUT, why, NULL);
  /* A connection that stopped answering altogether (half-open) is
   * replaced rather than fed more requests. */
  if (c && ++c->timeouts_row >= MAX_TIMEOUTS_IN_ROW)
    conn_fail(c, "several requests in a row got no answer");
}

static req_t *req_new(pr__cql_t *s, int kind, pr__cql_cb cb, void *arg) {
  req_t *r = calloc(1, sizeof(*r));
  if (!r)
    return NULL;
  r->timer = malloc(sizeof(*r->timer));
  if (!r->timer) {
    free(r);
    return NULL;
  }
  r->s = s;
  r->kind = kind;
  r->cb = cb;
  r->arg = arg;
  r->ts = kind == K_PREPARE ? INT64_MIN : next_ts(s);
  uv_timer_init(s->loop, r->timer);
  r->timer->data = r;
  s->handles++;
  uv_timer_start(r->timer, on_req_timeout, (uint64_t)s->conf.request_timeout_ms,
                 0);
  return r;
}

/* Copies values into one owned block. */
static int copy_values(req_t *r, const pr__cql_val_t *v, uint16_t n) {
  size_t total = 0, off = 0;
  if (!n)
    return 0;
  for (uint16_t i = 0; i < n; i++)
    total += v[i].len > 0 ? (size_t)v[i].len : 0;
  r->vals = malloc(n * sizeof(*v));
  r->blob = malloc(total ? total : 1);
  if (!r->vals || !r->blob)
    return -1;
  for (uint16_t i = 0; i < n; i++) {
    r->vals[i] = v[i];
    if (v[i].len > 0) {
      memcpy(r->blob + off, v[i].p ? v[i].p : v[i].inl, (size_t)v[i].len);
      r->vals[i].p = r->blob + off;
      off += (size_t)v[i].len;
    } else {
      r->vals[i].p = NULL;
    }
  }
  r->nvals = n;
  return 0;
}

static void enqueue(pr__cql_t *s, req_t *r, int front) {
  r->where = Q_PENDING;
  if (front) {
    r->next = s->pend_head;
    s->pend_head = r;
    if (!s->pend_tail)
      s->pend_tail = r;
  } else {
    r->next = NULL;
    if (s->pend_tail)
      s->pend_tail->next = r;
    else
      s->pend_head = r;
    s->pend_tail = r;
  }
}

/* ---- the wire ----------------------------------------------------------- */

/* One write of n frames; each frame's bytes are freed once written. */
typedef struct wreq {
  uv_write_t w;
  unsigned n;
  uint8_t *data[];
} wreq_t;

static void on_written(uv_write_t *w, int status) {
  wreq_t *wr = (wreq_t *)w;
  (void)status; /* a failed write shows up as a read error */
  for (unsigned i = 0; i < wr->n; i++)
    free(wr->data[i]);
  free(wr);
}

/* Writes n buffers to the stream at once (each freed whatever happens). */
static int raw_writev(conn_t *c, const uv_buf_t *bufs, unsigned n) {
  wreq_t *wr = malloc(sizeof(*wr) + n * sizeof(uint8_t *));
  if (!wr) {
    for (unsigned i = 0; i < n; i++)
      free(bufs[i].base);
    return -1;
  }
  wr->n = n;
  for (unsigned i = 0; i < n; i++)
    wr->data[i] = (uint8_t *)bufs[i].base;
  if (uv_write(&wr->w, (uv_stream_t *)c->tcp, bufs, n, on_written)) {
    on_written(&wr->w, -1);
    return -1;
  }
  return 0;
}

/* Writes what TLS has for the stream; -1 if it could not. */
static int tls_flush(conn_t *c) {
  BIO *w = SSL_get_wbio(c->ssl);
  size_t pend = BIO_ctrl_pending(w);
  uv_buf_t b;
  if (!pend)
    return 0;
  if (!(b.base = malloc(pend)))
    return -1;
  b.len = (size_t)BIO_read(w, b.base, (int)pend);
  return raw_writev(c, &b, 1);
}

/* Writes n frames at once (each freed whatever happens). */
static int conn_writev(conn_t *c, const uv_buf_t *bufs, unsigned n) {
  int ok = 1;
  if (!c->ssl)
    return raw_writev(c, bufs, n);
  for (unsigned i = 0; i < n; i++) {
    if (ok && bufs[i].len &&
        SSL_write(c->ssl, bufs[i].base, (int)bufs[i].len) <= 0)
      ok = 0;
    free(bufs[i].base);
  }
  return tls_flush(c) || !ok ? -1 : 0;
}

/* Writes b at once (the handshake's frames). */
static int conn_write(conn_t *c, pr__cbuf_t *b) {
  uv_buf_t ub;
  if (b->oom) {
    pr__cbuf_free(b);
    return -1;
  }
  ub = uv_buf_init((char *)b->p, (unsigned)b->len);
  return conn_writev(c, &ub, 1);
}

/* Drops the connection's queued frames (it failed: their requests are
 * answered or queued again by conn_fail). */
static void out_drop(conn_t *c) {
  for (unsigned i = 0; i < c->nout; i++)
    free(c->out[i].base);
  c->nout = 0;
}

/* Writes the connection's queued frames as one write; a write that could
 * not start marks the connection, which the flush then fails. */
static void out_flush(conn_t *c) {
  unsigned n = c->nout;
  c->nout = 0;
  if (n && conn_writev(c, c->out, n))
    c->wfail = 1;
}

/* The loop is about to poll: write what this iteration queued. */
static void on_flush(uv_prepare_t *h) {
  pr__cql_t *s = h->data;
  uv_prepare_stop(h);
  while (s->flush_head) { /* conn_fail's callbacks may queue more */
    conn_t *c = s->flush_head;
    s->flush_head = c->fnext;
    c->fnext = NULL;
    c->flushing = 0;
    out_flush(c);
    if (c->wfail && c->state != C_DOWN)
      conn_fail(c, "could not write to the socket");
  }
}

/* Queues b on the connection for the iteration's flush (the frame then
 * belongs to the connection). */
static int conn_queue(conn_t *c, pr__cbuf_t *b) {
  pr__cql_t *s = c->s;
  if (b->oom) {
    pr__cbuf_free(b);
    return -1;
  }
  if (c->nout == OUT_MAX) /* a long run: write what is queued now */
    out_flush(c);
  if (c->wfail) { /* failed by the flush (below, or of the one above) */
    pr__cbuf_free(b);
    return -1;
  }
  c->out[c->nout++] = uv_buf_init((char *)b->p, (unsigned)b->len);
  if (!c->flushing) {
    c->flushing = 1;
    c->fnext = s->flush_head;
    s->flush_head = c;
    if (!uv_is_active((uv_handle_t *)s->flush))
      uv_prepare_start(s->flush, on_flush);
  }
  return 0;
}

static int free_stream(conn_t *c) {
  for (int i = 0; i < MAX_STREAMS; i++) {
    int id = (c->next_stream + i) % MAX_STREAMS;
    if (id != 0 && !c->streams[id]) { /* 0 is the handshake's */
      c->next_stream = id + 1;
      return id;
    }
  }
  return -1;
}

/* Encodes and sends r on c (a free stream exists). */
static int send_req(conn_t *c, req_t *r) {
  pr__cbuf_t b = {0};
  pr__cql_params_t q;
  int id = free_stream(c);
  if (id < 0)
    return -1;
  memset(&q, 0, sizeof(q));
  q.consistency =
      r->opts.consistency ? r->opts.consistency : r->s->conf.consistency;
  q.values = r->vals;
  q.nvalues = r->nvals;
  q.page_size = r->opts.page_size;
  q.paging_state = r->opts.paging_state;
  q.paging_len = r->opts.paging_len;
  q.serial_consistency = r->opts.serial_consistency;
  q.timestamp = r->ts;
  switch (r->kind) {
  case K_QUERY:
    pr__cql_query(&b, (int16_t)id, r->query, &q);
    break;
  case K_PREPARE:
    pr__cql_prepare(&b, (int16_t)id, r->st->query);
    break;
  case K_EXEC:
    pr__cql_execute(&b, (int16_t)id, r->st->id, r->st->id_len, &q);
    break;
  default: {
    pr__cql_batch_stmt_t bs[r->nb ? r->nb : 1];
    for (uint16_t i = 0; i < r->nb; i++) {
      bs[i].id = r->bstmts[i].st->id;
      bs[i].id_len = r->bstmts[i].st->id_len;
      bs[i].query = NULL;
      bs[i].values = r->bstmts[i].values;
      bs[i].nvalues = r->bstmts[i].n;
    }
    pr__cql_batch(&b, (int16_t)id, r->btype, bs, r->nb, q.consistency,
                  q.timestamp);
    break;
  }
  }
  if (conn_queue(c, &b))
    return -2;
  c->streams[id] = r;
  c->inflight++;
  r->conn = c;
  r->stream = (int16_t)id;
  r->where = Q_WIRE;
  return 0;
}

/* How well a node matches cassandra_datacenter / cassandra_rack: 2 same
 * rack (or no rack asked), 1 same datacenter, 0 other (or unknown). With no
 * datacenter asked, every node is 2. */
static int locality(const pr__cql_t *s, const conn_t *c) {
  if (!s->conf.datacenter)
    return 2;
  if (strcmp(c->dc, s->conf.datacenter))
    return 0;
  return !s->conf.rack || !strcmp(c->rack, s->conf.rack) ? 2 : 1;
}

/* Round robin over the usable connections of the best locality. */
static conn_t *pick_conn(pr__cql_t *s) {
  for (int want = 2; want >= 0; want--)
    for (size_t i = 0; i < s->nconns; i++) {
      conn_t *c = s->conns[(s->rr + i) % s->nconns];
      if (c->state == C_UP && c->inflight + c->orphans < MAX_STREAMS - 1 &&
          locality(s, c) == want) {
        s->rr = (s->rr + i + 1) % s->nconns;
        return c;
      }
    }
  return NULL;
}

/* A statement this request needs is not prepared: wait for it. */
static int needs_prepare(req_t *r) {
  pr__cql_stmt_t *st = NULL;
  if (r->kind == K_EXEC && !r->st->id_len)
    st = r->st;
  for (uint16_t i = 0; !st && r->kind == K_BATCH && i < r->nb; i++)
    if (!r->bstmts[i].st->id_len)
      st = r->bstmts[i].st;
  if (!st)
    return 0;
  r->where = Q_WAITING;
  r->next = NULL;
  r->st = r->kind == K_EXEC ? r->st : st; /* the one it waits for */
  if (st->wait_tail)
    st->wait_tail->next = r;
  else
    st->wait_head = r;
  st->wait_tail = r;
  if (!st->preparing) {
    req_t *p = req_new(r->s, K_PREPARE, NULL, NULL);
    if (!p)
      return 1; /* the waiter times out */
    p->st = st;
    st->preparing = p;
    enqueue(r->s, p, 1);
  }
  return 1;
}

static void pump(pr__cql_t *s) {
  while (s->pend_head && !s->closing) {
    req_t *r = s->pend_head;
    conn_t *c;
    if (s->auth_error[0]) {
      finish(r, PROSODY_ERR_PERMANENT, s->auth_error, NULL);
      continue;
    }
    if (r->kind != K_PREPARE) {
      s->pend_head = r->next;
      if (!s->pend_head)
        s->pend_tail = NULL;
      r->where = Q_NONE;
      if (needs_prepare(r))
        continue;
      enqueue(s, r, 1);
    }
    if (!(c = pick_conn(s)))
      return; /* waits for a connection (or its timeout) */
    s->pend_head = r->next;
    if (!s->pend_head)
      s->pend_tail = NULL;
    r->where = Q_NONE;
    if (send_req(c, r)) {
      enqueue(s, r, 1);
      return;
    }
  }
}

/* ---- connections -------------------------------------------------------- */

/* The connection's timer: a reconnect when down; while connecting or
 * starting, the connect_timeout_ms budget ran out. */
static void on_retry(uv_timer_t *t) {
  conn_t *c = t->data;
  if (c->state == C_DOWN)
    conn_connect(c);
  else if (c->state != C_UP)
    conn_fail(c, "no session within connect_timeout_ms");
}

static void conn_fail(conn_t *c, const char *why) {
  pr__cql_t *s = c->s;
  char msg[384];
  if (c->state == C_DOWN)
    return;
  if (!s->closing)
    PR_WARN("cql", "connection to %s:%d lost: %s", c->host, c->port, why);
  snprintf(msg, sizeof(msg), "connection to Cassandra at %s:%d lost: %s",
           c->host, c->port, why);
  snprintf(s->last_error, sizeof(s->last_error), "%s:%d: %s", c->host, c->port,
           why);
  c->state = C_DOWN;
  for (int i = 0; i < MAX_STREAMS; i++) {
    req_t *r = c->streams[i];
    c->streams[i] = NULL;
    if (r && r != &orphan) {
      r->where = Q_NONE;
      if (r->kind == K_PREPARE)
        r->st->preparing = NULL;
      finish(r, PROSODY_ERR_TRANSIENT, msg, NULL);
    }
  }
  c->inflight = 0;
  c->orphans = 0;
  c->timeouts_row = 0;
  c->rlen = 0;
  c->wfail = 0;
  out_drop(c);
  if (c->tcp) {
    uv_read_stop((uv_stream_t *)c->tcp);
    close_handle(s, (uv_handle_t *)c->tcp);
    c->tcp = NULL;
  }
  SSL_free(c->ssl);
  c->ssl = NULL;
  c->tls_up = 0;
  if (!s->closing && c->retry) {
    int jitter = c->backoff_ms / 4 + 1;
    uv_timer_start(c->retry, on_retry,
                   (uint64_t)(c->backoff_ms + rand() % jitter), 0);
    c->backoff_ms =
        c->backoff_ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : c->backoff_ms * 2;
  }
}

/* ---- topology: the node's own datacenter and rack, and its peers -------- */

static void discover_on(conn_t *c, const char *query, pr__cql_cb cb);
static conn_t *add_node(pr__cql_t *s, const char *host, int port);

static int add_discovered(pr__cql_t *s, const pr__cql_cell_t *addr, int port,
                          const char *dc, const char *rack) {
  char host[64];
  conn_t *c;
  if (!addr->p || (addr->len != 4 && addr->len != 16) || port <= 0 ||
      !inet_ntop(addr->len == 4 ? AF_INET : AF_INET6, addr->p, host,
                 sizeof(host)))
    return 0;
  for (size_t i = 0; i < s->nconns; i++)
    if (s->conns[i]->port == port && !strcmp(s->conns[i]->host, host))
      return 0;
  if (!(c = add_node(s, host, port)))
    return 0;
  snprintf(c->dc, sizeof(c->dc), "%s", dc);
  snprintf(c->rack, sizeof(c->rack), "%s", rack);
  PR_INFO("cql", "discovered Cassandra node %s:%d (%s/%s)", host, port, dc,
          rack);
  conn_connect(c);
  return 1;
}

/* After discovery: say so if no node is in the preferred datacenter. */
static void check_locality(pr__cql_t *s) {
  int local = 0;
  if (!s->conf.datacenter)
    return;
  for (size_t i = 0; i < s->nconns; i++)
    local += !strcmp(s->conns[i]->dc, s->conf.datacenter);
  if (!local)
    PR_WARN("cql",
            "no known Cassandra node is in cassandra_datacenter \"%s\"; "
            "using the others",
            s->conf.datacenter);
}

/* system.peers (Cassandra 3.x): peer, data_center, rack, rpc_address. */
static void peers_v1(void *arg, prosody_err_t err, const char *errstr,
                     const pr__cql_result_t *res) {
  conn_t *c = arg;
  char dc[64], rack[64];
  if (err) {
    PR_WARN("cql", "could not read system.peers from %s:%d: %s", c->host,
            c->port, errstr);
    return;
  }
  for (int32_t i = 0; i < res->nrows && res->ncols >= 4; i++)
    if (!pr__cql_get_text(pr__cql_cell(res, i, 1), dc, sizeof(dc)) &&
        !pr__cql_get_text(pr__cql_cell(res, i, 2), rack, sizeof(rack)))
      add_discovered(c->s, pr__cql_cell(res, i, 3), c->port, dc, rack);
  c->s->discovered = 1;
  check_locality(c->s);
}

/* system.peers_v2 (Cassandra 4+): peer, data_center, rack, native_address,
 * native_port; absent before 4.0, then system.peers. */
static void peers_v2(void *arg, prosody_err_t err, const char *errstr,
                     const pr__cql_result_t *res) {
  conn_t *c = arg;
  char dc[64], rack[64];
  int32_t port;
  (void)errstr;
  if (err) {
    discover_on(c,
                "SELECT peer, data_center, rack, rpc_address FROM "
                "system.peers",
                peers_v1);
    return;
  }
  for (int32_t i = 0; i < res->nrows && res->ncols >= 5; i++)
    if (!pr__cql_get_text(pr__cql_cell(res, i, 1), dc, sizeof(dc)) &&
        !pr__cql_get_text(pr__cql_cell(res, i, 2), rack, sizeof(rack)) &&
        !pr__cql_get_int(pr__cql_cell(res, i, 4), &port))
      add_discovered(c->s, pr__cql_cell(res, i, 3), port, dc, rack);
  c->s->discovered = 1;
  check_locality(c->s);
}

static void local_row(void *arg, prosody_err_t err, const char *errstr,
                      const pr__cql_result_t *res) {
  conn_t *c = arg;
  if (err) {
    PR_WARN("cql", "could not read system.local from %s:%d: %s", c->host,
            c->port, errstr);
    return;
  }
  if (res->nrows >= 1 && res->ncols >= 2) {
    pr__cql_get_text(pr__cql_cell(res, 0, 0), c->dc, sizeof(c->dc));
    pr__cql_get_text(pr__cql_cell(res, 0, 1), c->rack, sizeof(c->rack));
  }
  if (!c->s->discovered)
    discover_on(c,
                "SELECT peer, data_center, rack, native_address, native_port "
                "FROM system.peers_v2",
                peers_v2);
  else
    check_locality(c->s);
}

/* Sends a topology query on this very connection. */
static void discover_on(conn_t *c, const char *query, pr__cql_cb cb) {
  req_t *r = req_new(c->s, K_QUERY, cb, c);
  if (!r)
    return;
  if (!(r->query = strdup(query)) || c->state != C_UP || send_req(c, r) != 0)
    finish(r, PROSODY_ERR_TRANSIENT, "could not send a topology query", NULL);
}

static void prepared(req_t *p, const pr__cql_result_t *res) {
  pr__cql_stmt_t *st = p->st;
  req_t *w = st->wait_head;
  st->preparing = NULL;
  if (res->prepared_len > sizeof(st->id)) {
    finish(p, PROSODY_ERR_PERMANENT, "prepared id too long", NULL);
    return;
  }
  memcpy(st->id, res->prepared_id, res->prepared_len);
  st->id_len = res->prepared_len;
  st->wait_head = st->wait_tail = NULL;
  finish(p, PROSODY_OK, NULL, res);
  while (w) { /* back to the queue, in order, ahead of newer requests */
    req_t *n = w->next;
    w->where = Q_NONE;
    enqueue(p->s, w, 0);
    w = n;
  }
}

static void handle_response(conn_t *c, const pr__cql_header_t *h,
                            const uint8_t *body) {
  pr__cql_t *s = c->s;
  req_t *r;
  char err[512];
  if (c->state == C_STARTING && h->stream == 0) {
    pr__cql_error_t e;
    if (h->opcode == PR_CQL_READY || h->opcode == PR_CQL_AUTH_SUCCESS) {
      c->state = C_UP;
      uv_timer_stop(c->retry);
      c->backoff_ms = BACKOFF_MIN_MS;
      s->auth_error[0] = '\0'; /* logged in (or not asked to) */
      PR_DEBUG("cql", "connected to %s:%d", c->host, c->port);
      if (!c->dc[0] || !s->discovered)
        discover_on(c, "SELECT data_center, rack FROM system.local", local_row);
      pump(s);
    } else if (h->opcode == PR_CQL_AUTHENTICATE) {
      pr__cbuf_t b = {0};
      if (!s->conf.user) {
        snprintf(s->auth_error, sizeof(s->auth_error),
                 "Cassandra at %s:%d requires authentication: set "
                 "cassandra_user and cassandra_password",
                 c->host, c->port);
        conn_fail(c, s->auth_error);
        pump(s);
        return;
      }
      pr__cql_auth_response(&b, 0, s->conf.user,
                            s->conf.password ? s->conf.password : "");
      if (conn_write(c, &b))
        conn_fail(c, "could not send credentials");
    } else if (h->opcode == PR_CQL_ERROR &&
               !pr__cql_parse_error(body, h->length, &e, err, sizeof(err))) {
      if (e.code == PR_CQL_E_BAD_CREDENTIALS)
        snprintf(s->auth_error, sizeof(s->auth_error),
                 "Cassandra at %s:%d rejected the credentials of "
                 "cassandra_user \"%s\": %s",
                 c->host, c->port, s->conf.user ? s->conf.user : "", e.message);
      conn_fail(c, e.message);
      pump(s);
    } else {
      conn_fail(c, "unexpected answer to STARTUP");
    }
    return;
  }
  if (h->stream < 0 || h->stream >= MAX_STREAMS)
    return; /* events (stream -1) are not subscribed to */
  r = c->streams[h->stream];
  c->timeouts_row = 0; /* it answers */
  if (r == &orphan) {
    c->streams[h->stream] = NULL;
    c->orphans--;
    pump(s); /* an id is free again */
    return;
  }
  if (!r)
    return;
  c->streams[h->stream] = NULL;
  c->inflight--;
  r->where = Q_NONE;
  if (h->opcode == PR_CQL_ERROR) {
    pr__cql_error_t e;
    char msg[700];
    if (pr__cql_parse_error(body, h->length, &e, err, sizeof(err))) {
      finish(r, PROSODY_ERR_TRANSIENT, err, NULL);
      return;
    }
    if (e.code == PR_CQL_E_UNPREPARED && !r->reprepared &&
        (r->kind == K_EXEC || r->kind == K_BATCH)) {
      /* The node forgot it (restart): prepare again, run again, once. */
      if (r->kind == K_EXEC)
        r->st->id_len = 0;
      else
        for (uint16_t i = 0; i < r->nb; i++)
          r->bstmts[i].st->id_len = 0;
      r->reprepared = 1;
      enqueue(s, r, 1);
      pump(s);
      return;
    }
    if (r->kind == K_PREPARE)
      r->st->preparing = NULL;
    snprintf(msg, sizeof(msg), "Cassandra %s (0x%04x): %s",
             pr__cql_error_name(e.code), (unsigned)e.code, e.message);
    finish(r, pr__cql_error_class(e.code), msg, NULL);
    pump(s); /* its stream id is free again */
    return;
  }
  if (h->opcode == PR_CQL_RESULT) {
    pr__cql_result_t res;
    if (pr__cql_parse_result(body, h->length, &res, err, sizeof(err))) {
      if (r->kind == K_PREPARE)
        r->st->preparing = NULL;
      finish(r, PROSODY_ERR_PERMANENT, err, NULL);
      return;
    }
    res.body = body;
    res.body_len = h->length;
    if (r->kind == K_PREPARE)
      prepared(r, &res);
    else
      finish(r, PROSODY_OK, NULL, &res);
    pr__cql_result_free(&res);
    pump(s);
    return;
  }
  snprintf(err, sizeof(err), "unexpected CQL opcode 0x%02x", h->opcode);
  finish(r, PROSODY_ERR_PERMANENT, err, NULL);
}

/* Room for READ_CHUNK more bytes in rbuf; 0 when out of memory. */
static int rbuf_room(conn_t *c) {
  if (c->rcap - c->rlen < READ_CHUNK) {
    uint8_t *p = realloc(c->rbuf, c->rlen + READ_CHUNK);
    if (!p)
      return 0;
    c->rbuf = p;
    c->rcap = c->rlen + READ_CHUNK;
  }
  return 1;
}

static void on_alloc(uv_handle_t *h, size_t hint, uv_buf_t *buf) {
  conn_t *c = h->data;
  (void)hint;
  if (c->ssl) {
    if (!c->cbuf && !(c->cbuf = malloc(READ_CHUNK)))
      *buf = uv_buf_init(NULL, 0);
    else
      *buf = uv_buf_init((char *)c->cbuf, READ_CHUNK);
    return;
  }
  if (!rbuf_room(c)) {
    *buf = uv_buf_init(NULL, 0);
    return;
  }
  *buf = uv_buf_init((char *)c->rbuf + c->rlen, (unsigned)(c->rcap - c->rlen));
}

/* Fails the connection with why TLS did (the node's certificate refused:
 * OpenSSL's reason). */
static void tls_fail(conn_t *c) {
  long v = SSL_get_verify_result(c->ssl);
  unsigned long e = ERR_peek_last_error();
  char why[384];
  if (v != X509_V_OK)
    snprintf(why, sizeof(why),
             "TLS handshake failed: the node's certificate %s (OpenSSL: %s)",
             v == X509_V_ERR_CERT_HAS_EXPIRED ? "has expired"
             : v == X509_V_ERR_HOSTNAME_MISMATCH ||
                     v == X509_V_ERR_IP_ADDRESS_MISMATCH
                 ? "does not name the host we connected to (use the name it "
                   "was issued for in cassandra_nodes)"
             : v == X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY ||
                     v == X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT ||
                     v == X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN
                 ? "is not signed by a CA in cassandra_ssl_ca_location (or the "
                   "system's CAs when it is not set)"
                 : "was refused",
             X509_verify_cert_error_string(v));
  else
    snprintf(why, sizeof(why),
             "TLS failed: %s (is the port a TLS one? cassandra_ssl is on)",
             e ? ERR_reason_error_string(e) : "the node closed the connection");
  ERR_clear_error();
  conn_fail(c, why);
}

static void send_startup(conn_t *c) {
  pr__cbuf_t b = {0};
  pr__cql_startup(&b, 0);
  if (conn_write(c, &b))
    conn_fail(c, "could not start the session");
}

/* Ciphertext in; the plaintext it yields appended to rbuf. -1 when the
 * connection failed. */
static int tls_read(conn_t *c, const char *data, size_t n) {
  BIO_write(SSL_get_rbio(c->ssl), data, (int)n);
  if (!c->tls_up) {
    int r = SSL_do_handshake(c->ssl);
    if (r != 1) {
      if (SSL_get_error(c->ssl, r) != SSL_ERROR_WANT_READ)
        tls_fail(c);
      else if (tls_flush(c))
        conn_fail(c, "could not write the TLS handshake");
      return c->state == C_DOWN ? -1 : 0;
    }
    c->tls_up = 1;
    if (tls_flush(c)) {
      conn_fail(c, "could not write the TLS handshake");
      return -1;
    }
    send_startup(c);
    if (c->state == C_DOWN)
      return -1;
  }
  for (;;) {
    int r;
    if (!rbuf_room(c)) {
      conn_fail(c, "out of memory");
      return -1;
    }
    r = SSL_read(c->ssl, c->rbuf + c->rlen, (int)(c->rcap - c->rlen));
    if (r > 0) {
      c->rlen += (size_t)r;
      continue;
    }
    r = SSL_get_error(c->ssl, r);
    if (r == SSL_ERROR_WANT_READ)
      break;
    if (r == SSL_ERROR_ZERO_RETURN)
      conn_fail(c, "closed by the server");
    else
      tls_fail(c);
    return -1;
  }
  if (tls_flush(c)) {
    conn_fail(c, "could not write");
    return -1;
  }
  return 0;
}

/* Bytes a plaintext connection got that open a TLS record (a handshake
 * or an alert: type 0x15 or 0x16, version 3.x), where a CQL frame starts
 * with its version byte (0x83 to 0x85 from a node). */
static int looks_like_tls(const conn_t *c) {
  return c->rlen >= 2 && (c->rbuf[0] == 0x15 || c->rbuf[0] == 0x16) &&
         c->rbuf[1] == 0x03;
}

#define TLS_HINT                                                               \
  " (a node that speaks only TLS does this: set cassandra_ssl=true, "          \
  "PROSODY_CASSANDRA_SSL)"

static void on_read(uv_stream_t *st, ssize_t n, const uv_buf_t *buf) {
  conn_t *c = st->data;
  size_t off = 0;
  char err[256];
  if (n < 0) {
    /* A plaintext connection closed before its first answer. */
    conn_fail(c, n != UV_EOF ? uv_strerror((int)n)
                 : !c->ssl && c->state == C_STARTING
                     ? "closed by the server before answering" TLS_HINT
                     : "closed by the server");
    return;
  }
  if (c->ssl) {
    if (n == 0 || tls_read(c, buf->base, (size_t)n))
      return;
  } else {
    c->rlen += (size_t)n;
    if (looks_like_tls(c)) {
      conn_fail(c, "answered with TLS where a CQL frame was expected" TLS_HINT);
      return;
    }
  }
  for (;;) {
    pr__cql_header_t h, body_h;
    int rc = pr__cql_header_parse(c->rbuf + off, c->rlen - off, &h, err,
                                  sizeof(err));
    if (rc < 0) {
      conn_fail(c, err);
      return;
    }
    if (rc == 0 || c->rlen - off - PR_CQL_HEADER < h.length)
      break;
    {
      /* Tracing id, warnings, custom payload: skipped (warnings logged). */
      char warn[256];
      long start = pr__cql_body_start(&h, c->rbuf + off + PR_CQL_HEADER, warn,
                                      sizeof(warn), err, sizeof(err));
      if (start < 0) {
        conn_fail(c, err);
        return;
      }
      if (warn[0])
        PR_DEBUG("cql", "warning from %s:%d: %s", c->host, c->port, warn);
      body_h = h;
      body_h.length -= (uint32_t)start;
      handle_response(c, &body_h, c->rbuf + off + PR_CQL_HEADER + start);
    }
    if (c->state == C_DOWN)
      return; /* the handler failed the connection */
    off += PR_CQL_HEADER + h.length;
  }
  if (off) {
    memmove(c->rbuf, c->rbuf + off, c->rlen - off);
    c->rlen -= off;
  }
}

/* Starts TLS on a fresh connection: the ClientHello is written, the
 * rest follows as the node answers (tls_read). -1 when it could not. */
static int tls_start(conn_t *c) {
  struct in6_addr a6;
  struct in_addr a4;
  int ip = inet_pton(AF_INET, c->host, &a4) == 1 ||
           inet_pton(AF_INET6, c->host, &a6) == 1;
  if (!(c->ssl = SSL_new(c->s->ssl_ctx)))
    return -1;
  SSL_set_bio(c->ssl, BIO_new(BIO_s_mem()), BIO_new(BIO_s_mem()));
  SSL_set_connect_state(c->ssl);
  if (ip ? !X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(c->ssl), c->host)
         : !SSL_set1_host(c->ssl, c->host) ||
               !SSL_set_tlsext_host_name(c->ssl, c->host))
    return -1;
  if (SSL_do_handshake(c->ssl) != -1 ||
      SSL_get_error(c->ssl, -1) != SSL_ERROR_WANT_READ)
    return -1;
  return tls_flush(c);
}

static void on_connected(uv_connect_t *creq, int status) {
  conn_t *c = creq->data;
  free(creq);
  if (c->state != C_CONNECTING)
    return;
  if (status) {
    conn_fail(c, uv_strerror(status));
    return;
  }
  uv_tcp_nodelay(c->tcp, 1);
  c->state = C_STARTING;
  c->tcp->data = c;
  if (uv_read_start((uv_stream_t *)c->tcp, on_alloc, on_read)) {
    conn_fail(c, "could not start the session");
    return;
  }
  if (!c->s->ssl_ctx)
    send_startup(c);
  else if (tls_start(c))
    conn_fail(c, "could not start TLS");
}

static void conn_connect(conn_t *c) {
  pr__cql_t *s = c->s;
  struct sockaddr_storage addr;
  uv_connect_t *creq;
  if (s->closing || c->state != C_DOWN)
    return;
  /* Literal addresses and "localhost"; other names through getaddrinfo. */
  if (uv_ip4_addr(!strcmp(c->host, "localhost") ? "127.0.0.1" : c->host,
                  c->port, (struct sockaddr_in *)&addr) &&
      uv_ip6_addr(c->host, c->port, (struct sockaddr_in6 *)&addr)) {
    struct addrinfo *ai = NULL, hints;
    memset(&hints, 0, sizeof(hints));
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(c->host, NULL, &hints, &ai) || !ai) {
      c->state = C_CONNECTING; /* so conn_fail reschedules */
      conn_fail(c, "cannot resolve the host name");
      return;
    }
    memcpy(&addr, ai->ai_addr, ai->ai_addrlen);
    ((struct sockaddr_in *)&addr)->sin_port = htons((uint16_t)c->port);
    freeaddrinfo(ai);
  }
  c->tcp = malloc(sizeof(*c->tcp));
  creq = malloc(sizeof(*creq));
  if (!c->tcp || !creq) {
    free(c->tcp);
    free(creq);
    c->tcp = NULL;
    return;
  }
  uv_tcp_init(s->loop, c->tcp);
  s->handles++;
  c->tcp->data = c;
  creq->data = c;
  c->state = C_CONNECTING;
  /* Bounded: connect, STARTUP and authentication within the budget. */
  uv_timer_start(c->retry, on_retry, (uint64_t)s->conf.connect_timeout_ms, 0);
  if (uv_tcp_connect(creq, c->tcp, (struct sockaddr *)&addr, on_connected)) {
    free(creq);
    conn_fail(c, "could not start connecting");
  }
}

/* ---- public ------------------------------------------------------------- */

/* The TLS settings of conf; NULL (errstr) when a file cannot be used. */
/* OpenSSL's password callback for an encrypted client key: the configured
 * password, or none. Without it OpenSSL would prompt on the terminal. */
static int key_password(char *buf, int size, int rwflag, void *arg) {
  const char *pw = arg;
  size_t n = pw ? strlen(pw) : 0;
  (void)rwflag;
  if (n > (size_t)size)
    return 0;
  memcpy(buf, pw ? pw : "", n);
  return (int)n;
}

static SSL_CTX *tls_ctx(const pr__cql_conf_t *conf, char *errstr,
                        size_t errstr_size) {
  SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
  struct stat sb;
  const char *what = NULL, *file = NULL;
  if (!ctx) {
    pr__errf(errstr, errstr_size, "out of memory");
    return NULL;
  }
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
  if (conf->ssl_ca) {
    int dir = stat(conf->ssl_ca, &sb) == 0 && S_ISDIR(sb.st_mode);
    if (!SSL_CTX_load_verify_locations(ctx, dir ? NULL : conf->ssl_ca,
                                       dir ? conf->ssl_ca : NULL))
      what = "cassandra_ssl_ca_location (PROSODY_CASSANDRA_SSL_CA_LOCATION)",
      file = conf->ssl_ca;
  } else if (!SSL_CTX_set_default_verify_paths(ctx)) {
    what = "the system's CA certificates", file = "";
  }
  if (!what && conf->ssl_cert &&
      SSL_CTX_use_certificate_chain_file(ctx, conf->ssl_cert) != 1)
    what = "cassandra_ssl_certificate_location "
           "(PROSODY_CASSANDRA_SSL_CERTIFICATE_LOCATION)",
    file = conf->ssl_cert;
  /* The key is read here, once: the password is not kept past it. */
  SSL_CTX_set_default_passwd_cb(ctx, key_password);
  SSL_CTX_set_default_passwd_cb_userdata(ctx, (void *)conf->ssl_key_password);
  if (!what && conf->ssl_key &&
      (SSL_CTX_use_PrivateKey_file(ctx, conf->ssl_key, SSL_FILETYPE_PEM) != 1 ||
       SSL_CTX_check_private_key(ctx) != 1))
    what = conf->ssl_key_password
               ? "cassandra_ssl_key_location "
                 "(PROSODY_CASSANDRA_SSL_KEY_LOCATION) with "
                 "cassandra_ssl_key_password"
               : "cassandra_ssl_key_location "
                 "(PROSODY_CASSANDRA_SSL_KEY_LOCATION; an encrypted key "
                 "needs cassandra_ssl_key_password)",
    file = conf->ssl_key;
  SSL_CTX_set_default_passwd_cb_userdata(ctx, NULL);
  if (what) {
    /* The first error of the queue is the cause (a key that would not
     * decrypt); the last one only says which library gave up ("PEM lib"). */
    unsigned long e = ERR_peek_error();
    pr__errf(errstr, errstr_size, "%s \"%s\" cannot be used: %s", what, file,
             e ? ERR_reason_error_string(e) : "unknown error");
    ERR_clear_error();
    SSL_CTX_free(ctx);
    return NULL;
  }
  return ctx;
}

/* Adds a node (not yet connecting); NULL when out of memory. */
static conn_t *add_node(pr__cql_t *s, const char *host, int port) {
  conn_t *c;
  if (s->nconns == s->capconns) {
    size_t cap = s->capconns ? s->capconns * 2 : 4;
    conn_t **g = realloc(s->conns, cap * sizeof(*g));
    if (!g)
      return NULL;
    s->conns = g;
    s->capconns = cap;
  }
  if (!(c = calloc(1, sizeof(*c))) || !(c->host = strdup(host)) ||
      !(c->retry = malloc(sizeof(*c->retry)))) {
    if (c)
      free(c->host);
    free(c);
    return NULL;
  }
  c->s = s;
  c->port = port;
  c->backoff_ms = BACKOFF_MIN_MS;
  uv_timer_init(s->loop, c->retry);
  c->retry->data = c;
  s->handles++;
  s->conns[s->nconns++] = c;
  return c;
}

pr__cql_t *pr__cql_new(uv_loop_t *loop, const pr__cql_conf_t *conf,
                       char *errstr, size_t errstr_size) {
  pr__cql_t *s;
  if (!conf->nnodes) {
    pr__errf(errstr, errstr_size, "no Cassandra nodes given");
    return NULL;
  }
  if (!(s = calloc(1, sizeof(*s))))
    goto oom;
  pthread_mutex_init(&s->stmt_lock, NULL);
  s->loop = loop;
  s->conf = *conf;
  if (!(s->flush = malloc(sizeof(*s->flush))))
    goto oom_free_s;
  uv_prepare_init(loop, s->flush);
  s->flush->data = s;
  s->handles++;
  if (!s->conf.connect_timeout_ms)
    s->conf.connect_timeout_ms = 5000;
  if (!s->conf.request_timeout_ms)
    s->conf.request_timeout_ms = 12000;
  if (!s->conf.consistency)
    s->conf.consistency = PR_CQL_LOCAL_QUORUM;
  s->conf.user = pr__strdup(conf->user);
  s->conf.password = pr__strdup(conf->password);
  s->conf.datacenter = pr__strdup(conf->datacenter);
  s->conf.rack = pr__strdup(conf->rack);
  s->conf.ssl_ca = s->conf.ssl_cert = s->conf.ssl_key = NULL; /* not kept */
  s->conf.ssl_key_password = NULL;
  /* The caller's list until the copy below: pr__cql_free must not free it
   * when the TLS context fails. */
  s->conf.nodes = NULL;
  if (conf->ssl && !(s->ssl_ctx = tls_ctx(conf, errstr, errstr_size))) {
    s->closing = 1;
    pr__cql_free(s);
    return NULL;
  }
  s->conf.nodes = calloc(conf->nnodes, sizeof(char *));
  if (!s->conf.nodes)
    goto oom_free;
  for (size_t i = 0; i < conf->nnodes; i++) {
    const char *colon = strrchr(conf->nodes[i], ':');
    char *host;
    int ok;
    if (!(s->conf.nodes[i] = strdup(conf->nodes[i])))
      goto oom_free;
    host = colon ? strndup(conf->nodes[i], (size_t)(colon - conf->nodes[i]))
                 : strdup(conf->nodes[i]);
    ok = host && add_node(s, host, colon ? atoi(colon + 1) : 9042);
    free(host);
    if (!ok)
      goto oom_free;
  }
  for (size_t i = 0; i < s->nconns; i++)
    conn_connect(s->conns[i]);
  return s;
oom_free:
  s->closing = 1;
  pr__cql_free(s);
  goto oom;
oom_free_s:
  free(s);
oom:
  pr__errf(errstr, errstr_size, "out of memory");
  return NULL;
}

void pr__cql_free(pr__cql_t *s) {
  pr__cql_stmt_t *head;
  if (!s)
    return;
  s->closing = 1;
  while (s->pend_head)
    finish(s->pend_head, PROSODY_ERR_STATE, "the Cassandra session closed",
           NULL);
  /* Statements are only ever added at the head: those after a snapshot of
   * it stay put (a callback below may add one). */
  pthread_mutex_lock(&s->stmt_lock);
  head = s->stmts;
  pthread_mutex_unlock(&s->stmt_lock);
  for (pr__cql_stmt_t *st = head; st; st = st->next)
    while (st->wait_head)
      finish(st->wait_head, PROSODY_ERR_STATE, "the Cassandra session closed",
             NULL);
  for (size_t i = 0; i < s->nconns; i++) {
    conn_t *c = s->conns[i];
    if (c->host && c->state != C_DOWN)
      conn_fail(c, "session closed");
    if (c->retry) {
      uv_timer_stop(c->retry);
      close_handle(s, (uv_handle_t *)c->retry);
      c->retry = NULL;
    }
  }
  if (s->flush) { /* every connection failed above: nothing is queued */
    s->flush_head = NULL;
    uv_prepare_stop(s->flush);
    close_handle(s, (uv_handle_t *)s->flush);
    s->flush = NULL;
  }
  if (!s->handles) /* nothing left to close */
    session_destroy(s);
}

pr__cql_stmt_t *pr__cql_stmt(pr__cql_t *s, const char *query) {
  pr__cql_stmt_t *st;
  pthread_mutex_lock(&s->stmt_lock);
  for (st = s->stmts; st; st = st->next)
    if (!strcmp(st->query, query))
      break;
  if (!st && (st = calloc(1, sizeof(*st)))) {
    if ((st->query = strdup(query))) {
      st->next = s->stmts;
      s->stmts = st;
    } else {
      free(st);
      st = NULL;
    }
  }
  pthread_mutex_unlock(&s->stmt_lock);
  return st;
}

static void submit(pr__cql_t *s, req_t *r, const pr__cql_opts_t *opts) {
  if (opts) {
    r->opts = *opts;
    r->opts.paging_state = NULL;
    if (opts->paging_state && opts->paging_len > 0) {
      if (!(r->paging = malloc((size_t)opts->paging_len))) {
        finish(r, PROSODY_ERR_NOMEM, "out of memory", NULL);
        return;
      }
      memcpy(r->paging, opts->paging_state, (size_t)opts->paging_len);
      r->opts.paging_state = r->paging;
    }
  }
  if (s->closing) {
    finish(r, PROSODY_ERR_STATE, "the Cassandra session closed", NULL);
    return;
  }
  enqueue(s, r, 0);
  pump(s);
}

void pr__cql_execute_stmt(pr__cql_t *s, pr__cql_stmt_t *st,
                          const pr__cql_val_t *values, uint16_t n,
                          const pr__cql_opts_t *opts, pr__cql_cb cb,
                          void *arg) {
  req_t *r = req_new(s, K_EXEC, cb, arg);
  if (!r) {
    cb(arg, PROSODY_ERR_NOMEM, "out of memory", NULL);
    return;
  }
  r->st = st;
  if (!st || copy_values(r, values, n)) {
    finish(r, PROSODY_ERR_NOMEM, "out of memory", NULL);
    return;
  }
  submit(s, r, opts);
}

void pr__cql_run(pr__cql_t *s, const char *query, const pr__cql_val_t *values,
                 uint16_t n, const pr__cql_opts_t *opts, pr__cql_cb cb,
                 void *arg) {
  req_t *r = req_new(s, K_QUERY, cb, arg);
  if (!r) {
    cb(arg, PROSODY_ERR_NOMEM, "out of memory", NULL);
    return;
  }
  if (!(r->query = strdup(query)) || copy_values(r, values, n)) {
    finish(r, PROSODY_ERR_NOMEM, "out of memory", NULL);
    return;
  }
  submit(s, r, opts);
}

void pr__cql_batch_run(pr__cql_t *s, uint8_t type, const pr__cql_bstmt_t *b,
                       uint16_t n, pr__cql_cb cb, void *arg) {
  req_t *r = req_new(s, K_BATCH, cb, arg);
  size_t total = 0, at = 0;
  if (!r) {
    cb(arg, PROSODY_ERR_NOMEM, "out of memory", NULL);
    return;
  }
  r->btype = type;
  for (uint16_t i = 0; i < n; i++)
    total += b[i].n;
  r->bstmts = calloc(n ? n : 1, sizeof(*r->bstmts));
  if (!r->bstmts) {
    finish(r, PROSODY_ERR_NOMEM, "out of memory", NULL);
    return;
  }
  /* All statements' values in one owned block. */
  {
    pr__cql_val_t *all = malloc((total ? total : 1) * sizeof(*all));
    if (!all) {
      finish(r, PROSODY_ERR_NOMEM, "out of memory", NULL);
      return;
    }
    for (uint16_t i = 0; i < n; i++)
      for (uint16_t j = 0; j < b[i].n; j++)
        all[at++] = b[i].values[j];
    if (copy_values(r, all, (uint16_t)total)) {
      free(all);
      finish(r, PROSODY_ERR_NOMEM, "out of memory", NULL);
      return;
    }
    free(all);
  }
  at = 0;
  for (uint16_t i = 0; i < n; i++) {
    r->bstmts[i].st = b[i].st;
    r->bstmts[i].values = r->vals ? r->vals + at : NULL;
    r->bstmts[i].n = b[i].n;
    at += b[i].n;
  }
  r->nb = n;
  r->nvals = 0; /* the values belong to the statements */
  submit(s, r, NULL);
}

/* ---- blocking ----------------------------------------------------------- */

/*
 * A write to a connection the server closed raises SIGPIPE, which would
 * kill the process: the library does not change the process's signal
 * disposition, so while a blocking call runs the loop on the caller's
 * thread SIGPIPE is blocked there (the write then fails with EPIPE), and a
 * SIGPIPE that became pending meanwhile is consumed before the mask is
 * restored. Worker threads block it for good (pr__cql_block_sigpipe).
 */
typedef struct sigpipe_guard {
  sigset_t old;
  int was_unblocked;
} sigpipe_guard_t;

static void sigpipe_block(sigpipe_guard_t *g) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &set, &g->old);
  g->was_unblocked = !sigismember(&g->old, SIGPIPE);
}

static void sigpipe_restore(sigpipe_guard_t *g) {
  sigset_t set;
  struct timespec zero = {0, 0};
  if (!g->was_unblocked)
    return;
  sigemptyset(&set);
  sigaddset(&set, SIGPIPE);
  while (sigtimedwait(&set, NULL, &zero) > 0)
    ;
  pthread_sigmask(SIG_SETMASK, &g->old, NULL);
}

void pr__cql_block_sigpipe(void) {
  sigpipe_guard_t g;
  sigpipe_block(&g); /* for the rest of this thread's life */
}

/* Runs the private loop once, SIGPIPE-safe. */
static int run_once(uv_loop_t *loop, uv_run_mode mode) {
  sigpipe_guard_t g;
  int r;
  sigpipe_block(&g);
  r = uv_run(loop, mode);
  sigpipe_restore(&g);
  return r;
}

struct pr__cql_sync {
  uv_loop_t loop;
  pr__cql_t *s;
};

pr__cql_sync_t *pr__cql_sync_new(const pr__cql_conf_t *conf, char *errstr,
                                 size_t errstr_size) {
  pr__cql_sync_t *y = calloc(1, sizeof(*y));
  if (!y) {
    pr__errf(errstr, errstr_size, "out of memory");
    return NULL;
  }
  uv_loop_init(&y->loop);
  if (!(y->s = pr__cql_new(&y->loop, conf, errstr, errstr_size))) {
    run_once(&y->loop, UV_RUN_DEFAULT);
    uv_loop_close(&y->loop);
    free(y);
    return NULL;
  }
  return y;
}

void pr__cql_sync_free(pr__cql_sync_t *y) {
  if (!y)
    return;
  pr__cql_free(y->s);
  run_once(&y->loop, UV_RUN_DEFAULT);
  uv_loop_close(&y->loop);
  free(y);
}

typedef struct sync_wait {
  int done;
  prosody_err_t err;
  char errstr[768];
  pr__cql_result_t *res;
} sync_wait_t;

static void sync_cb(void *arg, prosody_err_t err, const char *errstr,
                    const pr__cql_result_t *res) {
  sync_wait_t *w = arg;
  w->done = 1;
  w->err = err;
  snprintf(w->errstr, sizeof(w->errstr), "%s", errstr ? errstr : "");
  if (!err && w->res && res) {
    uint8_t *copy = malloc(res->body_len ? res->body_len : 1);
    char why[256];
    if (!copy) {
      w->err = PROSODY_ERR_NOMEM;
      snprintf(w->errstr, sizeof(w->errstr), "out of memory");
      return;
    }
    memcpy(copy, res->body, res->body_len);
    if (pr__cql_parse_result(copy, res->body_len, w->res, why, sizeof(why))) {
      free(copy);
      w->err = PROSODY_ERR_PERMANENT;
      snprintf(w->errstr, sizeof(w->errstr), "%s", why);
      return;
    }
    w->res->owned = copy;
    w->res->body = copy;
    w->res->body_len = res->body_len;
  }
}

prosody_err_t pr__cql_sync_run(pr__cql_sync_t *y, const char *query,
                               const pr__cql_val_t *values, uint16_t n,
                               const pr__cql_opts_t *opts, int prepare,
                               pr__cql_result_t *res, char *errstr,
                               size_t errstr_size) {
  sync_wait_t w;
  memset(&w, 0, sizeof(w));
  w.res = res;
  if (res)
    memset(res, 0, sizeof(*res));
  if (prepare)
    pr__cql_execute_stmt(y->s, pr__cql_stmt(y->s, query), values, n, opts,
                         sync_cb, &w);
  else
    pr__cql_run(y->s, query, values, n, opts, sync_cb, &w);
  while (!w.done && run_once(&y->loop, UV_RUN_ONCE))
    ;
  if (w.err)
    pr__errf(errstr, errstr_size, "%s", w.errstr);
  return w.err;
}

pr__cql_t *pr__cql_sync_session(pr__cql_sync_t *y) { return y->s; }

void pr__cql_sync_wait(pr__cql_sync_t *y, const int *done) {
  while (!*done && run_once(&y->loop, UV_RUN_ONCE))
    ;
}

size_t pr__cql_describe(const pr__cql_t *s, char *buf, size_t size) {
  size_t off = 0;
  static const char *states[] = {"down", "connecting", "starting", "up"};
  if (size)
    buf[0] = '\0';
  for (size_t i = 0; i < s->nconns && off < size; i++) {
    const conn_t *c = s->conns[i];
    int n = snprintf(buf + off, size - off, "%s%s:%d %s/%s %s", i ? "; " : "",
                     c->host, c->port, c->dc[0] ? c->dc : "?",
                     c->rack[0] ? c->rack : "?", states[c->state]);
    if (n < 0)
      break;
    off += (size_t)n;
  }
  return off;
}
