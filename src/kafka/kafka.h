/*
 * kafka.h - everything that talks to librdkafka (private): common handle
 * configuration and error classification, the process-wide mock cluster,
 * the producer and the admin operations.
 *
 * The librdkafka rules (docs/ARCHITECTURE.md section 7) that shape this
 * layer: one separate handle per role (producer, admin, consumer; rule 6);
 * idempotent lz4 producer with Nagle off (rule 7); only __FATAL is fatal,
 * every other error-callback error is transient (rule 8); handles are
 * destroyed under a bounded wait that reports a hang loudly (rule 9).
 */
#ifndef PR_KAFKA_H
#define PR_KAFKA_H

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

/* cmake/rdkafka.cmake picks a librdkafka of at least 2.10.0 (librdkafka
 * rule 1); this catches a build that found an older header first. */
#if RD_KAFKA_VERSION < 0x020a0000
#error "librdkafka >= 2.10.0 required (found an older rdkafka.h)"
#endif

#include "../config/config.h"
#include "../otel/otel.h"
#include "prosody.h"

/* ---- common.c ---- */

/* A librdkafka configuration with what every handle shares: bootstrap
 * servers, Nagle off, our log callback, and from the settings `st` (NULL:
 * none, the mock cluster's own handle) the security options and then
 * kafka_properties (so a user's client.id or debug wins over ours; the
 * properties a role sets itself are refused by the option table). `mock`:
 * the embedded cluster, which listens on 127.0.0.1 but advertises
 * "localhost", so IPv4 only (else every connection first tries ::1 and
 * waits out a reconnect backoff). NULL on error (errstr). */
rd_kafka_conf_t *pr__kafka_conf_new(const pr__settings_t *st,
                                    const char *bootstrap, int mock,
                                    char *errstr, size_t errstr_size);
/* A consumer handle's fetch wait (fetch.wait.max.ms) on the embedded mock
 * cluster (`mock`): PR_KAFKA_MOCK_FETCH_WAIT_MS, unless kafka_properties of
 * `st` sets the property (the user's value wins; it is already on `kconf`).
 * The mock answers a Fetch that finds nothing new only when its wait is
 * over, even when a record arrives meanwhile; librdkafka's 500 ms default
 * would make every record sent to a caught-up consumer wait up to half a
 * second. Nothing outside mock mode. 0, or -1 on error (errstr). */
#define PR_KAFKA_MOCK_FETCH_WAIT_MS 20
int pr__kafka_conf_fetch_wait(rd_kafka_conf_t *kconf, const pr__settings_t *st,
                              int mock, char *errstr, size_t errstr_size);
/* rd_kafka_conf_set() that reports failures in our words (a secret's value
 * never appears in them). */
int pr__kafka_conf_set(rd_kafka_conf_t *kconf, const char *name,
                       const char *value, char *errstr, size_t errstr_size);
/* Maps a librdkafka error to our error class. */
prosody_err_t pr__kafka_classify(rd_kafka_resp_err_t err);
/* Destroys a handle, waiting at most `timeout_ms`; when librdkafka does not
 * return in time the hang is logged as an error and the handle abandoned
 * (librdkafka rule 9, docs/ARCHITECTURE.md). Returns 0 if destroyed, -1 if
 * abandoned. */
int pr__kafka_destroy_bounded(rd_kafka_t *rk, int timeout_ms, const char *what);
/* The partition count of `topic` from a metadata request through `rk`
 * (blocking, at most timeout_ms); -1 when the topic is unknown, -2 when no
 * broker answered. */
int pr__kafka_partition_count(rd_kafka_t *rk, const char *topic,
                              int timeout_ms);
/* rd_kafka_new(), with librdkafka's lines about the handle going to the
 * calling thread's logger (its client's) from its first line until
 * pr__kafka_destroy_bounded(). */
rd_kafka_t *pr__kafka_new(rd_kafka_type_t type, rd_kafka_conf_t *conf,
                          char *errstr, size_t errstr_size);
/* librdkafka's broker error `reason` in words a user can act on (into
 * `out`, returned): a reply to the first request on a connection that is
 * no Kafka response ("increase receive.message.max.bytes") says the
 * address is not a Kafka broker; a refused broker certificate on handle
 * `rk` (NULL: none) says why OpenSSL refused it (expired, host name
 * mismatch, unknown CA); a failed OAUTHBEARER token request on `rk`
 * names the token endpoint and the options to check; anything else is
 * copied. */
const char *pr__kafka_explain(const rd_kafka_t *rk, const char *reason,
                              char *out, size_t n);
/* What the first three addresses of `bootstrap` show within `budget_ms`
 * (shared): no TCP connection, a refused one, silence after Kafka's
 * ApiVersion request, a reply that is not Kafka's, or a Kafka broker. For
 * errors when librdkafka reported nothing (it says nothing of a listener
 * that accepts and stays silent). Blocks; thread-safe. */
void pr__kafka_probe(const char *bootstrap, int budget_ms, char *out, size_t n);
/* Joins a host:port list with commas into a new string. */
char *pr__join_list(char **items, size_t n);
/* The last value of header `name` in `h` (NULL: none) as a string in
 * `out` (cut to n - 1 bytes), or NULL when it has none. */
const char *pr__header_str(const rd_kafka_headers_t *h, const char *name,
                           char *out, size_t n);

/* ---- consumer.c ---- */

/* The consumer's configuration (common settings plus group, offsets,
 * assignment strategy and session) for the settings `st`; NULL on error
 * (errstr). The caller adds its callbacks. */
struct pr__settings;
/* What this consumer offers its group, for messages: the strategy name,
 * or the KIP-848 protocol. */
const char *pr__kafka_consumer_strategy(const struct pr__settings *st);
rd_kafka_conf_t *pr__kafka_consumer_conf(const struct pr__settings *st,
                                         const char *bootstrap, char *errstr,
                                         size_t errstr_size);

/* ---- mock.c: the process-wide mock cluster ----
 * Owned by mock.c; every function is thread-safe (one mutex). The cluster is
 * created on first use and destroyed at process exit. */

/* Takes a reference to the cluster, starting it if needed, and returns its
 * bootstrap address (valid while the reference is held). */
prosody_err_t pr__mock_acquire(const char **bootstraps, char *errstr,
                               size_t errstr_size);
/* Drops a reference taken by pr__mock_acquire(). */
void pr__mock_release(void);
/* Creates `topic` on the cluster unless this process already did. */
prosody_err_t pr__mock_ensure_topic(const char *topic, char *errstr,
                                    size_t errstr_size);
/* Admin operations on the mock cluster (no CreateTopics/DeleteTopics). */
/* Partitions of a topic the mock creates on first use (ours and librdkafka's
 * own auto-creation agree). */
int pr__mock_default_partitions(void);
prosody_err_t pr__mock_create_topic(const char *topic, int partitions,
                                    char *errstr, size_t errstr_size);
prosody_err_t pr__mock_delete_topic(const char *topic, char *errstr,
                                    size_t errstr_size);
/* 1 if `topic` was deleted through pr__mock_delete_topic() and not created
 * again. */
int pr__mock_topic_deleted(const char *topic);
/* The cluster, for tests that inject faults (NULL before first use). */
rd_kafka_mock_cluster_t *pr__mock_cluster(void);

/* ---- producer.c ---- */

typedef struct pr__producer pr__producer_t;
typedef struct pr__tm pr__tm_t; /* telemetry.c */

pr__producer_t *pr__producer_new(const pr__settings_t *st,
                                 const char *bootstrap,
                                 const char *source_system, char *errstr,
                                 size_t errstr_size);
/* Waits up to send_timeout for outstanding records, fails the rest (their
 * callbacks fire), then frees everything. */
void pr__producer_destroy(pr__producer_t *prod);
/* Waits (at most send_timeout) until every record sent so far is
 * reported; the producer stays usable. */
void pr__producer_flush(pr__producer_t *prod);
/* Validates and queues one record; `cb` fires exactly once on success.
 * `json` pr__no_value (util.h) sends the key without a value. */
prosody_err_t pr__producer_send_async(pr__producer_t *prod, const char *topic,
                                      const char *key, const char *json,
                                      const prosody_trace_t *trace,
                                      prosody_send_cb cb, void *opaque,
                                      char *errstr, size_t errstr_size);
/* Like pr__producer_send_async() with `extra` headers (copied) first. */
prosody_err_t pr__producer_send_async_ex(
    pr__producer_t *prod, const char *topic, const char *key, const char *json,
    const prosody_trace_t *trace, const rd_kafka_headers_t *extra,
    prosody_send_cb cb, void *opaque, char *errstr, size_t errstr_size);
/* Queues one record and waits for its delivery report. */
prosody_err_t pr__producer_send(pr__producer_t *prod, const char *topic,
                                const char *key, const char *json,
                                const prosody_trace_t *trace, char *errstr,
                                size_t errstr_size);
/* The current librdkafka handle (tests: fault injection). */
rd_kafka_t *pr__producer_handle(pr__producer_t *prod);
/* How many times a fatal error made the producer replace its handle. */
int pr__producer_recoveries(pr__producer_t *prod);

/* The client's telemetry emitter, which the producer reports its sent
 * records to and the client's consumer engine its events (NULL: none).
 * Set once, before the first send. */
void pr__producer_set_telemetry(pr__producer_t *prod, pr__tm_t *tm);
pr__tm_t *pr__producer_telemetry(pr__producer_t *prod);

/* ---- telemetry.c ---- */

typedef enum pr__tm_type {
  PR_TM_MESSAGE_DISPATCHED,
  PR_TM_MESSAGE_SUCCEEDED,
  PR_TM_MESSAGE_FAILED,
  PR_TM_MESSAGE_SENT,
  PR_TM_TIMER_SCHEDULED,
  PR_TM_TIMER_CANCELLED,
  PR_TM_TIMER_DISPATCHED,
  PR_TM_TIMER_SUCCEEDED,
  PR_TM_TIMER_FAILED
} pr__tm_type_t;

/* One lifecycle event; strings are borrowed for the call. */
typedef struct pr__tm_event {
  pr__tm_type_t type;
  const char *topic;
  int32_t partition;
  int64_t offset;         /* messages; -1: none */
  int64_t time_ms;        /* timers: when they fire */
  const char *timer_type; /* timers: application, deferredMessage or
                             deferredTimer; NULL for messages */
  const char *key;
  const char *source;         /* the group id; the source system for sent */
  int failure_demand;         /* a retry (demandType failure) */
  const char *error_category; /* failed: transient, permanent or terminal */
  const char *exception;      /* failed: the handler's error text */
  const char *traceparent, *tracestate; /* the message's, or NULL */
  int64_t at_ms; /* when it happened (ms since the epoch); 0: now */
} pr__tm_event_t;

/* The client's emitter, or NULL when telemetry_enabled is false (or out
 * of memory: logged). Its producer is made on the first event. `st` must
 * outlive the emitter (it is read when the producer is made). */
pr__tm_t *pr__tm_new(const pr__settings_t *st, const char *bootstrap);
/* Queues the event (fire and forget; dropped and counted when the queue is
 * full). Any thread; `t` NULL: nothing. */
void pr__tm_emit(pr__tm_t *t, const pr__tm_event_t *ev);
/* The event's JSON text in `out` (NUL-terminated, at most n - 1 bytes);
 * returns its length. */
size_t pr__tm_json(const pr__tm_t *t, const pr__tm_event_t *ev, int64_t now_ms,
                   char *out, size_t n);
/* Events dropped (queue full) or not delivered. */
uint64_t pr__tm_dropped(const pr__tm_t *t);
/* Flushes for up to 2 s, then frees. */
void pr__tm_free(pr__tm_t *t);
/* The client is gone but an abandoned engine may still emit: no producer
 * is made from now on (a new Kafka handle's threads would start after
 * prosody_client_destroy() returned); one made already goes on. */
void pr__tm_seal(pr__tm_t *t);

/* The producer of a client (client.c; tests inject faults through it). */
pr__producer_t *pr__client_producer(prosody_client_t *client);

/* The trace context a send from this thread continues when its caller
 * gives none: set by the engine around a handler's call, so a handler's
 * sends carry its span's context (`fn(arg, out)`: 0 and `out`, or -1 for
 * none). NULL clears it. Thread-local. */
typedef int (*pr__send_parent_fn)(const void *arg, pr_span_ctx_t *out);
void pr__send_parent_set(pr__send_parent_fn fn, const void *arg);
/* The client's span exporter (or NULL): sends get `send` spans. Set once,
 * before the first send. */
void pr__producer_set_otel(pr__producer_t *prod, pr_otel_t *otel);
pr_otel_t *pr__producer_otel(pr__producer_t *prod);

/* Checks a W3C traceparent; 0 if valid, -1 with the reason. */
int pr__traceparent_check(const char *tp, char *why, size_t why_size);

#endif /* PR_KAFKA_H */
