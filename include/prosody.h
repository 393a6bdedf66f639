/*
 * prosody.h - the public interface of libprosody, a Kafka consumer/producer
 * framework with per-key ordering, durable per-key timers and failure
 * handling that never lets one bad key stall a partition.
 *
 * This is the only installed header. Every type is opaque except the plain
 * option tables documented as such. Conventions, shared by every function:
 *
 *  - Functions that can fail return a prosody_err_t (0 is success) and, when
 *    they take an `errstr`/`errstr_size` pair, write a human-readable message
 *    naming what was wrong into it (always NUL-terminated, truncated to fit;
 *    `errstr` may be NULL when the caller does not want the text).
 *  - Constructors return NULL on failure and fill `errstr`.
 *  - Ownership moves only on success. `*_destroy(NULL)` is a no-op.
 *  - Unless a function says otherwise it is thread-safe and may be called
 *    from any thread.
 */
#ifndef PROSODY_H
#define PROSODY_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(PROSODY_BUILDING) && defined(__GNUC__)
#define PROSODY_EXPORT __attribute__((visibility("default")))
#else
#define PROSODY_EXPORT
#endif

/* ------------------------------------------------------------------------ */
/* Version                                                                   */
/* ------------------------------------------------------------------------ */

#define PROSODY_VERSION_MAJOR 0
#define PROSODY_VERSION_MINOR 2
#define PROSODY_VERSION_PATCH 0
/* 0xMMmmpp: comparable with < and >. */
#define PROSODY_VERSION                                                        \
  ((PROSODY_VERSION_MAJOR << 16) | (PROSODY_VERSION_MINOR << 8) |              \
   PROSODY_VERSION_PATCH)

/* The library's version as "MAJOR.MINOR.PATCH" (static storage). */
PROSODY_EXPORT const char *prosody_version_str(void);
/* The library's version as PROSODY_VERSION would encode it at build time. */
PROSODY_EXPORT int prosody_version(void);
/* The version of the librdkafka inside libprosody (linked privately, so it
 * is never the process's other librdkafka, if any), as "MAJOR.MINOR.PATCH"
 * (static storage). At least 2.10.0. */
PROSODY_EXPORT const char *prosody_librdkafka_version_str(void);

/* ------------------------------------------------------------------------ */
/* Errors                                                                    */
/* ------------------------------------------------------------------------ */

/*
 * Every error the library returns. Transient errors may succeed when retried
 * (see prosody_err_is_transient()); the others will not.
 */
typedef enum prosody_err {
  PROSODY_OK = 0,
  /* An argument was NULL, empty or malformed (the message names it). */
  PROSODY_ERR_INVALID_ARG = 1,
  /* The configuration is invalid (the message names the option, its
   * environment variable, the bad value and the accepted form). */
  PROSODY_ERR_CONFIG = 2,
  /* Memory allocation failed. */
  PROSODY_ERR_NOMEM = 3,
  /* A payload is not valid JSON (the message gives line and column). */
  PROSODY_ERR_INVALID_PAYLOAD = 4,
  /* The operation did not complete within its time budget. Transient. */
  PROSODY_ERR_TIMEOUT = 5,
  /* Kafka reported an error that may go away when retried. Transient. */
  PROSODY_ERR_TRANSIENT = 6,
  /* Kafka reported an error that retrying will not fix. */
  PROSODY_ERR_PERMANENT = 7,
  /* The topic to create already exists. */
  PROSODY_ERR_TOPIC_EXISTS = 8,
  /* The topic does not exist. */
  PROSODY_ERR_UNKNOWN_TOPIC = 9,
  /* The operation is not supported here (the message says why). */
  PROSODY_ERR_UNSUPPORTED = 10,
  /* The object is shutting down or not in a state that allows the call. */
  PROSODY_ERR_STATE = 11
} prosody_err_t;

/* The constant's name, e.g. "PROSODY_ERR_TIMEOUT" (static storage; an
 * unknown value gives "PROSODY_ERR_UNKNOWN"). */
PROSODY_EXPORT const char *prosody_err_name(prosody_err_t err);
/* A short English description of the error (static storage). */
PROSODY_EXPORT const char *prosody_err_message(prosody_err_t err);
/* 1 when retrying the failed operation may succeed, 0 otherwise. */
PROSODY_EXPORT int prosody_err_is_transient(prosody_err_t err);

/* ------------------------------------------------------------------------ */
/* Configuration                                                             */
/* ------------------------------------------------------------------------ */

/*
 * A set of options. Every option of the specification has a name (e.g.
 * "max_concurrency") and an environment variable (e.g.
 * PROSODY_MAX_CONCURRENCY). The effective value of an option is, in order of
 * precedence: the value set with prosody_config_set(), the environment
 * variable (read when the configuration is resolved, i.e. by
 * prosody_client_new(), prosody_admin_new(), prosody_config_get() and
 * prosody_config_validate()), the default. The full table, with types,
 * defaults and bounds, is in docs/CONFIGURATION.md. An environment value
 * that does not parse is an error (naming the option, the variable and the
 * accepted form), except for OTEL_EXPORTER_OTLP_PROTOCOL, which other
 * programs share: a value of it that is not accepted is ignored (the
 * default applies, and a client logs one warning).
 *
 * Value syntax: durations are humantime strings ("500ms", "5m", "2h 30m",
 * "7d"; units ns us ms s m h d w M y; a bare number is an error); lists are
 * comma-separated and trimmed; booleans are "true"/"false"; optional values
 * accept "none" to unset them.
 *
 * A prosody_config_t is not thread-safe: use it from one thread at a time.
 */
typedef struct prosody_config prosody_config_t;

/* Where an option's effective value came from. */
typedef enum prosody_config_source {
  PROSODY_CONFIG_SOURCE_DEFAULT = 0, /* the built-in default */
  PROSODY_CONFIG_SOURCE_ENV = 1,     /* the option's environment variable */
  PROSODY_CONFIG_SOURCE_SET = 2      /* prosody_config_set() */
} prosody_config_source_t;

/* A new, empty configuration (every option at its environment value or
 * default). Returns NULL only when out of memory. */
PROSODY_EXPORT prosody_config_t *prosody_config_new(void);

/*
 * Sets option `name` to `value`, validating the value at once. A NULL `value`
 * removes an earlier set, so the environment or default applies again.
 * Errors: PROSODY_ERR_INVALID_ARG (NULL conf or name), PROSODY_ERR_CONFIG
 * (unknown option, or a value that does not parse or is out of bounds; the
 * message says which and what is accepted). On error the option keeps its
 * previous value.
 */
PROSODY_EXPORT prosody_err_t prosody_config_set(prosody_config_t *conf,
                                                const char *name,
                                                const char *value, char *errstr,
                                                size_t errstr_size);

/*
 * Writes option `name`'s effective value, in canonical form, into `buf` and
 * where it came from into `*source` (may be NULL). Unset optional values are
 * written as "none". Errors: PROSODY_ERR_INVALID_ARG (NULL name or buffer;
 * or `buf_size` too small for the value: `buf` is then set to "" and the
 * message says how many bytes the value needs), PROSODY_ERR_CONFIG
 * (unknown option, or its environment variable holds an invalid value),
 * PROSODY_ERR_NOMEM.
 */
PROSODY_EXPORT prosody_err_t prosody_config_get(
    const prosody_config_t *conf, const char *name, char *buf, size_t buf_size,
    prosody_config_source_t *source, char *errstr, size_t errstr_size);

/*
 * Resolves every option (set values, environment, defaults) and checks the
 * rules between options that a client needs (e.g. max_retry_delay >=
 * retry_base, failure_topic in low-latency mode). Returns the first error.
 * prosody_client_new() runs the same checks.
 */
PROSODY_EXPORT prosody_err_t prosody_config_validate(
    const prosody_config_t *conf, char *errstr, size_t errstr_size);

/* Frees the configuration. NULL is a no-op. */
PROSODY_EXPORT void prosody_config_destroy(prosody_config_t *conf);

/* Log levels, most severe first (the `log` option's values). */
typedef enum prosody_log_level {
  PROSODY_LOG_ERROR = 1,
  PROSODY_LOG_WARN = 2,
  PROSODY_LOG_INFO = 3,
  PROSODY_LOG_DEBUG = 4,
  PROSODY_LOG_TRACE = 5
} prosody_log_level_t;

/*
 * A client's log line: its level, the subsystem ("engine", "kafka",
 * "cql", ...; docs/OBSERVABILITY.md lists them) and the message (no
 * timestamp, no newline). Called on the client's own threads (its
 * consumer, its workers, its producer's poller, its Cassandra threads) and
 * on the thread calling the client's functions: it must be thread-safe and
 * return quickly, and it must not call the client back.
 */
typedef void (*prosody_log_cb)(prosody_log_level_t level, const char *subsystem,
                               const char *message, void *opaque);

/*
 * Sends the log lines of the client made from `conf` to `cb` instead of
 * standard error (NULL: standard error, the default). Which lines are
 * logged is the client's own `log` option: two clients in one process may
 * log at different levels. A warning or error repeated word for word
 * within 10 s is said once, then once more with how many times it
 * repeated. librdkafka's lines about the client's own Kafka handles are
 * the client's too. Lines that belong to no client (the embedded mock
 * cluster's, an admin handle's) go to standard error at the level of
 * PROSODY_LOG. Once prosody_client_destroy() has returned, `cb` is never
 * called again and no call is still running, so `opaque` may be freed:
 * threads of a consumer abandoned at shutdown (a handler that outlived
 * shutdown_timeout and the stop's grace) log to standard error from then
 * on.
 */
PROSODY_EXPORT void prosody_config_set_log_cb(prosody_config_t *conf,
                                              prosody_log_cb cb, void *opaque);

/*
 * A read-only description of one option, as recorded in the option table.
 * This is a plain table: all strings are static storage.
 */
typedef struct prosody_option_info {
  const char *name;          /* "max_concurrency" */
  const char *env;           /* "PROSODY_MAX_CONCURRENCY" */
  const char *type;          /* "integer", "duration", "list", ... */
  const char *default_value; /* display form, e.g. "32", "5m" or "-" */
  const char *accepted;      /* the accepted form, e.g. "integer 1..65536" */
  const char *section;       /* "Core", "Consumer", ... */
  const char *description;   /* one sentence */
  /* The option's old name and variable, still accepted (setting both the
   * old and the new is an error), or NULL when it was never renamed. */
  const char *alias;     /* "defer_cache_size" */
  const char *alias_env; /* "PROSODY_DEFER_CACHE_SIZE" */
} prosody_option_info_t;

/* Number of options in the table. */
PROSODY_EXPORT size_t prosody_option_count(void);
/* The i-th option (0-based), or NULL when out of range. */
PROSODY_EXPORT const prosody_option_info_t *prosody_option_info(size_t i);

/* ------------------------------------------------------------------------ */
/* Client and producer                                                       */
/* ------------------------------------------------------------------------ */

/*
 * A client: one Kafka producer now, and the consumer in later releases.
 * Created from a configuration that needs `bootstrap_servers` (unless
 * `mock` is true) and `source_system` or `group_id` (the value of the
 * `source-system` header on every record sent).
 */
typedef struct prosody_client prosody_client_t;

/*
 * Creates a client. On success the client takes ownership of `conf` (do not
 * use or destroy it afterwards); on failure the caller keeps it. With
 * `mock=true` the client uses the process-wide embedded mock cluster (see
 * prosody_mock_bootstrap_servers()). Does not block on the network.
 * Returns NULL on error with the reason in `errstr`.
 */
PROSODY_EXPORT prosody_client_t *
prosody_client_new(prosody_config_t *conf, char *errstr, size_t errstr_size);

/*
 * Destroys the client. Records still awaiting delivery are waited for up to
 * `send_timeout`; their async callbacks fire (with an error if they were not
 * delivered) before this returns, on the client's internal thread. Must not
 * be called from a send callback. NULL is a no-op.
 */
PROSODY_EXPORT void prosody_client_destroy(prosody_client_t *client);

/*
 * Shuts the client down, without freeing it: stops the consumer as
 * prosody_unsubscribe() does (when subscribed), waits (at most
 * send_timeout) for the records already sent to be reported, and flushes
 * the client's spans. From the call on, sends, excises and subscribe fail
 * with PROSODY_ERR_STATE ("the client is shut down") and
 * prosody_consumer_state() says "shut-down" once the consumer has stopped.
 * prosody_client_destroy() is still needed to free it. Blocks; any thread
 * but a handler's. A second call returns PROSODY_OK at once, without
 * waiting for the first. Errors: PROSODY_ERR_INVALID_ARG (NULL client).
 */
PROSODY_EXPORT prosody_err_t prosody_client_shutdown(prosody_client_t *client);

/*
 * Telemetry for the whole process. prosody_telemetry_flush() waits until
 * every span ended so far, in every client, has been exported (or
 * dropped), at most `timeout_ms` in all; use it when one of several
 * clients stops. prosody_telemetry_shutdown() stops tracing for the
 * process for good (no span starts afterwards, in any client, open or
 * created later), then flushes as above; use it once, at process exit.
 * Both are no-ops without an exporter (no client with
 * otel_exporter_otlp_endpoint). They cover the spans; the Kafka telemetry
 * events (telemetry_topic) are sent by each client's producer and
 * delivered by prosody_client_shutdown() / _destroy(). Any thread;
 * blocks. Errors: PROSODY_ERR_TIMEOUT (spans still unexported at the
 * deadline).
 */
PROSODY_EXPORT prosody_err_t prosody_telemetry_flush(uint32_t timeout_ms);
PROSODY_EXPORT prosody_err_t prosody_telemetry_shutdown(uint32_t timeout_ms);

/* The value of the `source-system` header this client writes (owned by the
 * client, valid until it is destroyed). */
PROSODY_EXPORT const char *
prosody_client_source_system(const prosody_client_t *client);

/*
 * Optional W3C trace context for a record sent from within a traced
 * operation. A plain table: every field may be NULL. `traceparent` must be a
 * W3C traceparent ("00-<32 hex>-<16 hex>-<2 hex>"); `tracestate` and
 * `baggage` are passed through as given.
 */
typedef struct prosody_trace {
  const char *traceparent;
  const char *tracestate;
  const char *baggage;
} prosody_trace_t;

/*
 * Sends `payload_json` (a JSON text) to `topic` with `key`, and waits for the
 * broker's acknowledgement, at most `send_timeout`. The record carries the
 * header `source-system` and, when `trace` gives them, `traceparent`,
 * `tracestate` and `baggage`. Blocks the calling thread.
 *
 * Errors: PROSODY_ERR_INVALID_ARG (NULL/empty topic, NULL key, key not
 * UTF-8, malformed traceparent), PROSODY_ERR_INVALID_PAYLOAD,
 * PROSODY_ERR_TIMEOUT (not acknowledged within send_timeout; transient; the
 * record may still be written later, as with any retry: at-least-once),
 * PROSODY_ERR_TRANSIENT, PROSODY_ERR_PERMANENT (e.g. record too large),
 * PROSODY_ERR_STATE (client shutting down).
 */
PROSODY_EXPORT prosody_err_t prosody_send(prosody_client_t *client,
                                          const char *topic, const char *key,
                                          const char *payload_json,
                                          const prosody_trace_t *trace,
                                          char *errstr, size_t errstr_size);

/* Where a delivered record landed. A plain table. */
typedef struct prosody_delivery {
  const char *topic;
  int32_t partition;
  int64_t offset;
} prosody_delivery_t;

/*
 * Called exactly once per accepted prosody_send_async() call, on an internal
 * thread, when the record was acknowledged (`err` == PROSODY_OK, `delivery`
 * set) or finally failed (`errstr` says why, `delivery` is NULL or carries
 * the topic only), at the latest `send_timeout` after the call (then with
 * PROSODY_ERR_TIMEOUT). The strings and `delivery` are valid during the call
 * only. The callback must not block for long and must not destroy the client.
 */
typedef void (*prosody_send_cb)(prosody_err_t err, const char *errstr,
                                const prosody_delivery_t *delivery,
                                void *opaque);

/*
 * Like prosody_send() but does not wait for the acknowledgement: returns
 * PROSODY_OK once the record is queued, and `cb` fires later exactly once.
 * It waits only when librdkafka's local queue is full (for room, within
 * send_timeout; from inside a send callback it fails at once instead).
 * When this returns an error the record was not queued and `cb` never
 * fires.
 */
PROSODY_EXPORT prosody_err_t prosody_send_async(
    prosody_client_t *client, const char *topic, const char *key,
    const char *payload_json, const prosody_trace_t *trace, prosody_send_cb cb,
    void *opaque, char *errstr, size_t errstr_size);

/*
 * Sends an excise record: `key` with no value (a Kafka tombstone), which a
 * consumer's on_excise receives in the key's order, and which log
 * compaction later uses to drop the key's earlier records. Headers,
 * blocking, threads and errors as prosody_send() (no payload error).
 */
PROSODY_EXPORT prosody_err_t prosody_excise(prosody_client_t *client,
                                            const char *topic, const char *key,
                                            const prosody_trace_t *trace,
                                            char *errstr, size_t errstr_size);

/* The non-blocking form of prosody_excise(), with the callback contract of
 * prosody_send_async(). */
PROSODY_EXPORT prosody_err_t prosody_excise_async(
    prosody_client_t *client, const char *topic, const char *key,
    const prosody_trace_t *trace, prosody_send_cb cb, void *opaque,
    char *errstr, size_t errstr_size);

/* ------------------------------------------------------------------------ */
/* Consumer                                                                  */
/* ------------------------------------------------------------------------ */

/*
 * What a handler reports for one event. A failure without a class is
 * transient. PROSODY_PENDING (asynchronous handlers only) means the result
 * comes later through prosody_complete().
 *
 *  - SUCCESS:   done; the offset may be committed.
 *  - TRANSIENT: may succeed if retried. pipeline: retried without limit
 *               (exponential backoff with full jitter between retry_base and
 *               max_retry_delay); low-latency: up to max_retries, then the
 *               record goes to failure_topic; best-effort: logged, skipped.
 *  - PERMANENT: retrying will not help: logged and committed past
 *               (low-latency: sent to failure_topic first).
 */
typedef enum prosody_result {
  PROSODY_SUCCESS = 0,
  PROSODY_TRANSIENT = 1,
  PROSODY_PERMANENT = 2,
  PROSODY_PENDING = 3
} prosody_result_t;

/* A received record, valid until its handler finishes (returns, or its
 * prosody_complete() call). Read-only; any thread may read it. */
typedef struct prosody_message prosody_message_t;

/* The context of one handler invocation: cancellation and timers for the
 * event's key. Any thread may use it until the handler finishes; after
 * that it is stale, and every function refuses it safely (timer calls and
 * prosody_complete return PROSODY_ERR_STATE, prosody_should_cancel
 * returns 1). It is a handle, not an address: never dereference it. */
typedef struct prosody_context prosody_context_t;

/* A fired timer, delivered to on_timer; valid until its handler finishes. */
typedef struct prosody_timer prosody_timer_t;

/* Handler flags. */
#define PROSODY_HANDLER_ASYNC 0x1  /* callbacks return PENDING; see below */
#define PROSODY_HANDLER_EXCISE 0x2 /* on_message gets excise records too */

/*
 * The user's handler: a plain table. For one key, events run one at a time
 * in order; different keys run concurrently, at most max_concurrency at once.
 *
 * Synchronous (flags 0): callbacks run on a pool of max_concurrency worker
 * threads and return the result; they may block. Asynchronous
 * (PROSODY_HANDLER_ASYNC): callbacks run on the engine thread and must only
 * hand the event over (to the host's own loop) and return PROSODY_PENDING,
 * or return a final result at once; they never occupy a worker.
 * `on_timer` runs when a timer of the key fires, in order with the key's
 * messages, with the same results and retries as on_message (a timer is
 * never sent to failure_topic). NULL means the consumer does not use
 * timers: scheduling fails (PROSODY_ERR_STATE) and no timer store is
 * needed (no cassandra_nodes outside mock mode).
 *
 * Excise records: a record with a key and no value (a Kafka tombstone, as
 * prosody_excise() sends it), whoever wrote it. With the flag
 * PROSODY_HANDLER_EXCISE, on_message receives them too, in the key's order
 * like any message, with the same results, retries, deferral and
 * failure_topic routing (a failed one goes there as a tombstone);
 * prosody_message_is_excise() is 1 and prosody_message_payload() NULL for
 * one. Prosody changes nothing of the key's data on an excise record:
 * deleting what the application keeps for the key (its timers, say) is
 * the handler's work. Without the flag (handlers written before excise
 * records existed) they are committed past without a handler call.
 */
typedef struct prosody_handler {
  prosody_result_t (*on_message)(prosody_context_t *ctx,
                                 const prosody_message_t *msg, void *opaque);
  prosody_result_t (*on_timer)(prosody_context_t *ctx,
                               const prosody_timer_t *timer, void *opaque);
  void *opaque;
  unsigned flags;
} prosody_handler_t;

/* Message accessors (no allocation; strings owned by the message). */
PROSODY_EXPORT const char *prosody_message_topic(const prosody_message_t *m);
PROSODY_EXPORT int32_t prosody_message_partition(const prosody_message_t *m);
PROSODY_EXPORT int64_t prosody_message_offset(const prosody_message_t *m);
/* Record timestamp in milliseconds since the epoch (-1 if none). */
PROSODY_EXPORT int64_t prosody_message_timestamp(const prosody_message_t *m);
/* The key, NUL-terminated, valid UTF-8. */
PROSODY_EXPORT const char *prosody_message_key(const prosody_message_t *m);
/* 1 for an excise record (a key without a value, delivered with
 * PROSODY_HANDLER_EXCISE), 0 for a message. */
PROSODY_EXPORT int prosody_message_is_excise(const prosody_message_t *m);
/* The payload's JSON text, NUL-terminated; its length in bytes. NULL and 0
 * for an excise record. */
PROSODY_EXPORT const char *prosody_message_payload(const prosody_message_t *m);
PROSODY_EXPORT size_t prosody_message_payload_len(const prosody_message_t *m);
/* The parsed payload as a jansson value (include <jansson.h>); borrowed,
 * valid while the handler runs. Built on the first call (the payload was
 * validated before the handler started): a handler that reads the text
 * itself never pays for the tree. NULL when out of memory, and for an
 * excise record. */
struct json_t;
PROSODY_EXPORT const struct json_t *
prosody_message_json(const prosody_message_t *m);
/* Value of header `name` (NUL-terminated copy owned by the message), or
 * NULL. */
PROSODY_EXPORT const char *prosody_message_header(const prosody_message_t *m,
                                                  const char *name);
/*
 * The W3C traceparent of the trace context the handler runs in, or NULL
 * when there is none; valid while the handler runs. When the client
 * exports spans (otel_exporter_otlp_endpoint set) it is the context of
 * the message's `receive` span, and `*spanned` (may be NULL) is set to 1:
 * make the handler's own spans its children. Otherwise it is the record's
 * own `traceparent` header and `*spanned` is 0: a binding applies
 * message_spans itself. Records a handler sends (prosody_send* without a
 * trace) and timers it schedules carry this context.
 */
PROSODY_EXPORT const char *
prosody_message_traceparent(const prosody_message_t *m, int *spanned);

/* 1 once the invocation should stop (handler timeout, shutdown, revoke). */
PROSODY_EXPORT int prosody_should_cancel(const prosody_context_t *ctx);
/* Blocks until cancellation or `timeout_ms` (-1: no limit). Returns 1 if
 * cancelled (or the invocation has finished), 0 on timeout. For
 * synchronous handlers (worker threads). */
PROSODY_EXPORT int prosody_wait_cancel(prosody_context_t *ctx,
                                       int64_t timeout_ms);
/* Attaches an error message to a failing result (copied; the last one
 * wins). */
PROSODY_EXPORT void prosody_context_set_error(prosody_context_t *ctx,
                                              const char *message);
/*
 * Completes an invocation whose callback returned PROSODY_PENDING, from any
 * thread. Call it exactly once per PENDING return, and never after the
 * callback returned a final result. `result` is SUCCESS, TRANSIENT or
 * PERMANENT; `message` (may be NULL) describes a failure.
 * PROSODY_ERR_STATE reports a second call, or a stale context;
 * PROSODY_ERR_INVALID_ARG a NULL context or PROSODY_PENDING.
 */
PROSODY_EXPORT prosody_err_t prosody_complete(prosody_context_t *ctx,
                                              prosody_result_t result,
                                              const char *message);

/*
 * Timers, for the key of the context's event (message or timer). Times are
 * milliseconds since the epoch, rounded to the nearest whole second; a time
 * already past fires at once. A key holds at most one timer per second:
 * scheduling a second that is already scheduled keeps one timer. A timer
 * belongs to the partition of the event that scheduled it and fires
 * through that key's queue, so it never runs concurrently with the key's
 * messages. Each call blocks until the timer store has applied it; call
 * from the handler (or a thread it waits for) before it finishes.
 *
 * Errors (errstr says which): PROSODY_ERR_INVALID_ARG (NULL context, a time
 * before the epoch or after 2106-02-07T06:28:15Z), PROSODY_ERR_STATE (stale
 * context: its handler finished; the consumer is shutting down or the
 * partition is being revoked; or an asynchronous handler called from the
 * engine thread while the store would have to wait), PROSODY_ERR_NOMEM,
 * PROSODY_ERR_TRANSIENT / PROSODY_ERR_PERMANENT (the store failed). A
 * schedule that failed transiently (or timed out) may still have been
 * stored, and then fires once its partition is loaded again: fail the
 * event and let it schedule again (a second already scheduled keeps one
 * timer).
 */
/* Schedules a timer at `time_ms`. */
PROSODY_EXPORT prosody_err_t prosody_schedule(prosody_context_t *ctx,
                                              int64_t time_ms, char *errstr,
                                              size_t errstr_size);
/* Removes the timer at `time_ms`, if any. */
PROSODY_EXPORT prosody_err_t prosody_unschedule(prosody_context_t *ctx,
                                                int64_t time_ms, char *errstr,
                                                size_t errstr_size);
/* Removes every timer of the key. */
PROSODY_EXPORT prosody_err_t prosody_clear_scheduled(prosody_context_t *ctx,
                                                     char *errstr,
                                                     size_t errstr_size);
/* Schedules `time_ms` and removes every other timer of the key: the new
 * timer is written first, and is never removed. */
PROSODY_EXPORT prosody_err_t prosody_clear_and_schedule(prosody_context_t *ctx,
                                                        int64_t time_ms,
                                                        char *errstr,
                                                        size_t errstr_size);
/* The key's scheduled times (ms since the epoch), ascending, excluding a
 * timer that is firing now. `*times` is NULL when `*n` is 0; free it with
 * prosody_times_free(). */
PROSODY_EXPORT prosody_err_t prosody_scheduled(prosody_context_t *ctx,
                                               int64_t **times, size_t *n,
                                               char *errstr,
                                               size_t errstr_size);
PROSODY_EXPORT void prosody_times_free(int64_t *times);

/*
 * The non-blocking form of the five timer calls above, for hosts with an
 * event loop of their own (the Python and Node.js bindings): `op` starts
 * and this returns at once; `cb` fires exactly once with the result when
 * the store has applied it. For PROSODY_TIMER_SCHEDULED, `times`/`n` carry
 * the key's scheduled times (ms, ascending; valid during the call only);
 * they are NULL/0 otherwise. `errstr` says why on failure and is NULL on
 * success. `time_ms` is ignored by CLEAR and SCHEDULED.
 *
 * `cb` runs on the engine's thread, or on the calling thread before this
 * returns when the result is known at once; it must not block. It works
 * from an asynchronous handler on the engine thread whatever the store.
 * Returns an error (and `cb` never fires) for the argument errors of the
 * blocking calls (NULL context or callback, a time out of range) and for a
 * stale context (PROSODY_ERR_STATE); every other failure reaches `cb`.
 */
typedef enum prosody_timer_op {
  PROSODY_TIMER_SCHEDULE = 0,
  PROSODY_TIMER_UNSCHEDULE = 1,
  PROSODY_TIMER_CLEAR_AND_SCHEDULE = 2,
  PROSODY_TIMER_CLEAR = 3,
  PROSODY_TIMER_SCHEDULED = 4
} prosody_timer_op_t;

typedef void (*prosody_timer_cb)(prosody_err_t err, const char *errstr,
                                 const int64_t *times, size_t n, void *opaque);

PROSODY_EXPORT prosody_err_t prosody_timer_async(
    prosody_context_t *ctx, prosody_timer_op_t op, int64_t time_ms,
    prosody_timer_cb cb, void *opaque, char *errstr, size_t errstr_size);

/*
 * Asks for `cb(ctx, opaque)` once, when the invocation is cancelled
 * (handler timeout, shutdown, revoke): the callback form of
 * prosody_wait_cancel(), for hosts that must not park a thread per event.
 * If the invocation is already cancelled, `cb` runs on the calling thread
 * before this returns, otherwise on the thread that cancels; either way
 * with the context's lock held: it must only hand the news over and return
 * (it must not call any prosody function with this context). A second call
 * replaces the first; a NULL `cb` removes it. Once the invocation has
 * finished (its callback returned a final result, or prosody_complete()
 * returned) `cb` is never called.
 * Errors: PROSODY_ERR_INVALID_ARG (NULL context), PROSODY_ERR_STATE (stale
 * context, or the invocation has finished).
 */
typedef void (*prosody_cancel_cb)(prosody_context_t *ctx, void *opaque);
PROSODY_EXPORT prosody_err_t prosody_context_on_cancel(prosody_context_t *ctx,
                                                       prosody_cancel_cb cb,
                                                       void *opaque);

/* The fired timer's key (NUL-terminated, owned by the timer) and time (ms
 * since the epoch, a whole second). */
PROSODY_EXPORT const char *prosody_timer_key(const prosody_timer_t *timer);
PROSODY_EXPORT int64_t prosody_timer_time(const prosody_timer_t *timer);
/* As prosody_message_traceparent(), for a fired timer: its `trigger`
 * span's context (`*spanned` 1), or without export the context it was
 * scheduled in (`*spanned` 0: apply timer_spans yourself); NULL when it
 * was scheduled without one. */
PROSODY_EXPORT const char *prosody_timer_traceparent(const prosody_timer_t *t,
                                                     int *spanned);

/* ------------------------------------------------------------------------ */
/* Keyed state                                                               */
/* ------------------------------------------------------------------------ */

/*
 * Durable state per consumer group and Kafka key, kept in collections the
 * client registers before it subscribes. A handler opens a collection for
 * its event's key (never naming the key) and reads and writes it; since a
 * key's events never run concurrently, no locking is needed.
 *
 * Kinds: a value (one JSON document), a map (string keys, ordered by their
 * UTF-8 bytes, each holding a JSON document) and a deque (JSON documents,
 * pushed and popped at both ends, indexed from the front). Documents are
 * JSON text; a top-level null cannot be stored (clear or remove instead).
 *
 * Transactions: an attempt's writes are buffered and its reads see them.
 * When the handler succeeds they become durable together with the event's
 * completion, before its offset is committed; when it fails they vanish,
 * so a retry starts from the committed state. In the pipeline mode with
 * deduplication (the default) the writes and the event's deduplication
 * record are one logged Cassandra batch: after a crash at any point the
 * state shows each message's changes exactly once (a redelivered message
 * whose batch landed is a duplicate and is skipped). PROSODY_STATE_COMMIT
 * makes a collection's buffered writes durable at once (a later failure
 * keeps them: a retry sees them); PROSODY_STATE_ROLLBACK drops the writes
 * buffered since the last commit. `read_uncommitted` collections write
 * through at once (writes must then be idempotent). A store that fails is
 * retried while the partition stays; one that refuses the writes for good
 * makes the event a permanent failure (its writes dropped), which the
 * mode handles as any other.
 *
 * Storage: memory in mock mode (one store per process), otherwise Cassandra
 * (cassandra_nodes is then required) in the original Prosody's tables
 * (keyed_state_cell, keyed_state_identity). State is addressed by the
 * partition's timer segment (group, topic, partition), the key and the
 * collection's name, so a partition that moves keeps its state. A
 * collection's kind is recorded once per group (keyed_state_identity): a
 * later deploy that gives the name another kind is refused with
 * PROSODY_ERR_PERMANENT when it subscribes.
 */
typedef enum prosody_state_kind {
  PROSODY_STATE_VALUE = 0,
  PROSODY_STATE_MAP = 1,
  PROSODY_STATE_DEQUE = 2
} prosody_state_kind_t;

/* What a collection holds: JSON documents, or Kafka records (MESSAGE): a
 * reference to a record this consumer was given (its topic, partition and
 * offset, as the original stores it: MessagePack {topic, partition,
 * offset}), loaded again from Kafka when read, through the loader of the
 * defer layer (loader_* options). A record Kafka no longer has (retention,
 * compaction) fails the read with PROSODY_ERR_PERMANENT. */
typedef enum prosody_state_payload {
  PROSODY_STATE_JSON = 0,
  PROSODY_STATE_MESSAGE = 1
} prosody_state_payload_t;

/* A collection's definition. Initialise with PROSODY_STATE_DEF_INIT and set
 * what you need. */
typedef struct prosody_state_def {
  const char *name;     /* non-empty, unique per client, <= 256 bytes */
  int kind;             /* prosody_state_kind_t */
  int payload;          /* prosody_state_payload_t */
  int64_t ttl_s;        /* seconds each cell lives after its last write,
                           1 ..= 630720000; 0: forever */
  int read_uncommitted; /* 1: writes go to the store at once */
  int published;        /* 1: readable by other services through
                           prosody_published_open() (JSON payloads only;
                           the client needs the subsystem option) */
  int64_t keyset_limit; /* maps: 0 ..= 4096; -1: the default, 128 */
  int64_t capacity;     /* deques: 1 ..= 4294967295; 0: unbounded */
} prosody_state_def_t;

#define PROSODY_STATE_DEF_INIT                                                 \
  { NULL, 0, 0, 0, 0, 0, -1, 0 }

/* Registers a collection (copied) with `conf`; needed before the client
 * subscribes, and only handlers of that client can open it. Errors
 * (PROSODY_ERR_CONFIG, errstr naming the field and its accepted values,
 * e.g. "capacity: only valid for deque collections"): an empty or
 * duplicate name, an unknown kind or payload, a field out of bounds or set
 * on a kind it does not apply to. */
PROSODY_EXPORT prosody_err_t
prosody_config_add_state(prosody_config_t *conf, const prosody_state_def_t *def,
                         char *errstr, size_t errstr_size);

/* A handler's view of one collection for its event's key: valid for the
 * attempt that opened it (any thread). Free it with prosody_state_free()
 * (any time, also after the attempt). */
typedef struct prosody_state prosody_state_t;

/* Opens collection `name` for the key of `ctx`'s event. Errors:
 * PROSODY_ERR_PERMANENT (no collection of that name is registered),
 * PROSODY_ERR_STATE (a stale context), PROSODY_ERR_INVALID_ARG,
 * PROSODY_ERR_NOMEM. `*kind` (may be NULL) is set to the collection's
 * prosody_state_kind_t. */
PROSODY_EXPORT prosody_err_t prosody_state_open(prosody_context_t *ctx,
                                                const char *name,
                                                prosody_state_t **out,
                                                int *kind, char *errstr,
                                                size_t errstr_size);
PROSODY_EXPORT void prosody_state_free(prosody_state_t *st);

/* The operations. Each names the kinds it applies to; `a` is the argument
 * table (PROSODY_STATE_ARGS_INIT), `r` the result. */
typedef enum prosody_state_op {
  /* value: the document (r.n 0 when absent). map: the document of a.key.
   * deque: the document at a.index (negative counts from the back). */
  PROSODY_STATE_GET = 0,
  /* map: the documents of a.keys[0 .. a.nkeys), one item per key in
   * order (an absent one has json NULL). */
  PROSODY_STATE_GET_MANY = 1,
  /* value: sets a.json. map: sets a.key to a.json. */
  PROSODY_STATE_SET = 2,
  /* map: removes a.key. */
  PROSODY_STATE_REMOVE = 3,
  /* every kind: removes everything. */
  PROSODY_STATE_CLEAR = 4,
  /* map: r.number 1 when a.key is present, else 0. */
  PROSODY_STATE_CONTAINS = 5,
  /* deque: pushes a.json at the back / front (a deque with a capacity
   * drops from the other end past it). */
  PROSODY_STATE_PUSH_BACK = 6,
  PROSODY_STATE_PUSH_FRONT = 7,
  /* deque: removes and returns the back / front (r.n 0 when empty). */
  PROSODY_STATE_POP_BACK = 8,
  PROSODY_STATE_POP_FRONT = 9,
  /* deque: returns the back / front without removing it. */
  PROSODY_STATE_PEEK_BACK = 10,
  PROSODY_STATE_PEEK_FRONT = 11,
  /* map: the number of keys; deque: the number of items (r.number). */
  PROSODY_STATE_LEN = 12,
  /* map: up to a.limit entries (key and document; documents omitted with
   * a.keys_only) after the key a.after (NULL: from the start), in key
   * order, backward with a.backward. deque: up to a.limit documents from
   * position a.index (0: the front; with a.backward, counted from the
   * back). r.number is 1 when the scan reached the end. */
  PROSODY_STATE_SCAN = 13,
  /* every kind: makes the buffered writes durable now / drops them. */
  PROSODY_STATE_COMMIT = 14,
  PROSODY_STATE_ROLLBACK = 15
} prosody_state_op_t;

typedef struct prosody_state_args {
  const char *key; /* map key (UTF-8) */
  size_t key_len;
  const char *const *keys; /* GET_MANY: NUL-terminated keys */
  size_t nkeys;
  const char *json; /* a JSON document (validated) */
  size_t json_len;
  int64_t index;     /* deque GET / SCAN */
  const char *after; /* map SCAN: resume after this key (NULL: start) */
  size_t after_len;
  size_t limit;  /* SCAN: at most this many items (0: 256) */
  int backward;  /* SCAN: from the end */
  int keys_only; /* map SCAN: keys without documents */
  /* MESSAGE collections' SET and PUSH_*: the record to keep (in place of
   * json): one a handler of this client was given, or one read from a
   * collection. */
  const prosody_message_t *message;
  /* ... or, when `message` is NULL and `ref_topic` is not, the record
   * named by its coordinates: what a binding keeps of a record it was
   * given (it must have been given it: Prosody cannot check). */
  const char *ref_topic;
  int32_t ref_partition;
  int64_t ref_offset;
} prosody_state_args_t;

#define PROSODY_STATE_ARGS_INIT                                                \
  { NULL, 0, NULL, 0, NULL, 0, 0, NULL, 0, 0, 0, 0, NULL, NULL, 0, 0 }

/* One item of a result: a map key (NULL for values; a deque SCAN's item's
 * position, as decimal) and a JSON document (NULL when absent), each with
 * its length, NUL-terminated. In a MESSAGE collection `json` is NULL and
 * `message` is the record loaded again (NULL when absent, and in keys-only
 * scans), valid until the result is freed. */
typedef struct prosody_state_item {
  const char *key;
  size_t key_len;
  const char *json;
  size_t json_len;
  prosody_message_t *message;
} prosody_state_item_t;

typedef struct prosody_state_result {
  prosody_state_item_t *items;
  size_t n;
  int64_t number; /* LEN, CONTAINS, SCAN's end flag */
} prosody_state_result_t;

/* Runs `op` and waits for it (any thread but the engine's: an asynchronous
 * handler uses prosody_state_async). `r` (may be NULL when the operation
 * returns nothing) is owned by the caller: free it with
 * prosody_state_result_free(). Errors: PROSODY_ERR_STATE (the handle's
 * attempt has ended, or the consumer is stopping), PROSODY_ERR_INVALID_ARG
 * (an operation the kind does not have, a NULL or malformed document, a
 * missing key; errstr says which), PROSODY_ERR_TRANSIENT (the store
 * failed or timed out), PROSODY_ERR_NOMEM. */
PROSODY_EXPORT prosody_err_t prosody_state_call(
    prosody_state_t *st, prosody_state_op_t op, const prosody_state_args_t *a,
    prosody_state_result_t *r, char *errstr, size_t errstr_size);
PROSODY_EXPORT void prosody_state_result_free(prosody_state_result_t *r);

/* The non-blocking form: `cb` runs exactly once with the result (valid
 * during the call only), on the engine's thread or on the calling thread
 * before this returns; it must not block. Argument errors known at once are
 * returned (and `cb` never runs); every other failure reaches `cb`. */
typedef void (*prosody_state_cb)(prosody_err_t err, const char *errstr,
                                 const prosody_state_result_t *r, void *opaque);
PROSODY_EXPORT prosody_err_t prosody_state_async(
    prosody_state_t *st, prosody_state_op_t op, const prosody_state_args_t *a,
    prosody_state_cb cb, void *opaque, char *errstr, size_t errstr_size);

/* ------------------------------------------------------------------------ */
/* Published keyed state                                                     */
/* ------------------------------------------------------------------------ */

/*
 * A collection registered with `published` = 1 can be read outside
 * handlers, by any client of any service that reaches the same Cassandra
 * keyspace (or, in mock mode, the same process), without consuming.
 *
 * Owner side: a client with published collections must set the subsystem
 * option (PROSODY_ERR_CONFIG at prosody_client_new otherwise). When it
 * subscribes, it records a route per published collection and subscribed
 * topic in keyed_state_publication (subsystem, name, group, topic and the
 * topic's partition count), before any of its state is written; it deletes
 * its group's routes of collections it registers unpublished (retiring a
 * publication: deploy once with published 0, then drop the registration).
 * A topic whose partition count is not known when the consumer subscribes
 * (it does not exist yet) is routed when the consumer next subscribes.
 *
 * Reader side: prosody_published_open() names a collection by subsystem,
 * name and kind (the reader's own definition; the client needs no
 * registration, group or subscription). A read names the Kafka key. It
 * finds the routes of (subsystem, name), at most 16 (more is
 * PROSODY_ERR_PERMANENT), in the order of their group and topic, and reads
 * each source (the key's partition there is
 * crc32(key) % partition count, librdkafka's default partitioner, which
 * both implementations' producers use) until one has data for the key:
 * that source's answer is the read's. A source whose recorded kind differs
 * from the reader's fails the read with PROSODY_ERR_PERMANENT naming both.
 * Reads see committed state only (never an attempt's pending writes), and
 * may be stale by up to the read cache's time to live: answers (and the
 * routes) are kept for `read_cache_ms`, within the state_read_cache_size
 * bytes the client gives all its readers (state_read_cache_size; oldest
 * out first). A SCAN's pages
 * each choose their source afresh.
 */
typedef struct prosody_published prosody_published_t;

/*
 * A reader of collection `name` (of kind `kind`, prosody_state_kind_t) as
 * published by `subsystem` (trimmed: 1 to 64 bytes). `read_cache_ms`: how
 * long answers are kept; -1 for the client's state_read_cache option
 * (5 s by default), 0 to read the store every time. The reader belongs to
 * the client and lives as long as it (prosody_client_destroy frees it; a
 * read still running then ends with PROSODY_ERR_STATE). Opening the same
 * subsystem, name, kind and read_cache_ms again gives the same reader (a
 * program may open one per request). Errors: PROSODY_ERR_INVALID_ARG (a bad
 * subsystem, name or kind), PROSODY_ERR_CONFIG (outside mock mode: no
 * cassandra_nodes), PROSODY_ERR_TRANSIENT (Cassandra unreachable: the
 * first reader of a client connects and migrates the keyspace, blocking),
 * PROSODY_ERR_NOMEM.
 */
PROSODY_EXPORT prosody_err_t prosody_published_open(
    prosody_client_t *client, const char *subsystem, const char *name, int kind,
    int64_t read_cache_ms, prosody_published_t **out, char *errstr,
    size_t errstr_size);

/*
 * Reads key `key`'s collection: GET, GET_MANY, CONTAINS, LEN, PEEK_BACK,
 * PEEK_FRONT and SCAN, as prosody_state_async() defines them for the
 * reader's kind; any other operation is PROSODY_ERR_INVALID_ARG (readers
 * are read-only), as is an empty key (PROSODY_ERR_PERMANENT: it has no
 * partition). No source holding the key: the answer of an empty
 * collection. No route at all (nobody publishes it, or not yet), or none
 * whose group recorded the collection's kind: PROSODY_ERR_TRANSIENT ("no
 * publication rows"), as the original's readers say.
 * `cb` runs exactly once, on the client's reader thread (or on the calling
 * thread before this returns, when the answer is in the cache); it must
 * not block. Errors known at once are returned and `cb` never runs;
 * the others (PROSODY_ERR_TRANSIENT: the store failed;
 * PROSODY_ERR_PERMANENT: a source of another kind; PROSODY_ERR_STATE: the
 * client is being destroyed) reach `cb`. Any thread.
 */
PROSODY_EXPORT prosody_err_t prosody_published_async(
    prosody_published_t *p, const char *key, prosody_state_op_t op,
    const prosody_state_args_t *a, prosody_state_cb cb, void *opaque,
    char *errstr, size_t errstr_size);

/* The blocking form (any thread but the reader's): `r` as for
 * prosody_state_call(). */
PROSODY_EXPORT prosody_err_t prosody_published_call(
    prosody_published_t *p, const char *key, prosody_state_op_t op,
    const prosody_state_args_t *a, prosody_state_result_t *r, char *errstr,
    size_t errstr_size);

/*
 * Starts consuming `subscribed_topics` as member of `group_id` with
 * `handler` (copied). Needs both options (PROSODY_ERR_CONFIG otherwise).
 * Returns once the consumer runs; partitions arrive asynchronously.
 * Outside mock mode a handler with on_timer needs Cassandra: its keyspace
 * is migrated first (blocking). Errors: PROSODY_ERR_STATE (already
 * subscribed), PROSODY_ERR_CONFIG (a missing or invalid option, e.g. no
 * cassandra_nodes), PROSODY_ERR_TRANSIENT (Cassandra unreachable or
 * failing: worth retrying), PROSODY_ERR_NOMEM, PROSODY_ERR_INVALID_ARG (no
 * on_message).
 *
 * When the consumer itself could not start (Cassandra, the store's
 * schema, cassandra_nodes, librdkafka, memory; not for the argument,
 * group_id/subscribed_topics and already-subscribed errors) the error is also
 * logged at ERROR through the client's logger (subsystem "consumer"), and
 * prosody_consumer_state() then says "configuration-failed" until a later
 * call starts it. The probe server is not part of the consumer: when it
 * cannot start (probe_port taken) the consumer runs all the same, the
 * failure is logged at ERROR (subsystem "probe") and prosody_probe_port()
 * is -1.
 */
PROSODY_EXPORT prosody_err_t prosody_subscribe(prosody_client_t *client,
                                               const prosody_handler_t *handler,
                                               char *errstr,
                                               size_t errstr_size);

/*
 * Stops consuming, gracefully: no new events start; running handlers get
 * until 80% of shutdown_timeout, then their contexts are cancelled (retry
 * waits end); at 100% the engine stops waiting. Finished work is committed;
 * the rest is redelivered to the group later. Blocks. Must not be called
 * from a handler. Returns PROSODY_ERR_STATE when not subscribed.
 */
PROSODY_EXPORT prosody_err_t prosody_unsubscribe(prosody_client_t *client);

/* "unconfigured" (no group_id or subscribed_topics), "configured",
 * "running" (subscribed), "configuration-failed" (the last
 * prosody_subscribe() could not start the consumer; its error was returned
 * and logged), or "shut-down" (prosody_client_shutdown() was called and the
 * consumer, if any, has stopped). Static storage. */
PROSODY_EXPORT const char *
prosody_consumer_state(const prosody_client_t *client);
/* Partitions currently assigned to this consumer (0 when not running). */
PROSODY_EXPORT int
prosody_assigned_partition_count(const prosody_client_t *client);
/* 1 if a partition's oldest unfinished event made no progress for
 * stall_threshold. */
PROSODY_EXPORT int prosody_is_stalled(const prosody_client_t *client);

/* The port of the probe server (/readyz, /livez, /metrics) while subscribed, or
 * -1 when it is not running (probe_port none, not subscribed, mock mode
 * without an explicit probe_port, or it could not start: see
 * prosody_subscribe()). */
PROSODY_EXPORT int prosody_probe_port(const prosody_client_t *client);

/* ------------------------------------------------------------------------ */
/* Admin                                                                     */
/* ------------------------------------------------------------------------ */

/*
 * Topic management, for tests and operational tooling (production topics are
 * better managed declaratively). Uses `bootstrap_servers` and `mock` from
 * its configuration; against the mock cluster it creates topics through the
 * mock's own API, since the mock has no admin protocol.
 */
typedef struct prosody_admin prosody_admin_t;

/* Creates an admin handle. Takes `conf` on success, like
 * prosody_client_new(). Returns NULL on error with the reason in errstr. */
PROSODY_EXPORT prosody_admin_t *
prosody_admin_new(prosody_config_t *conf, char *errstr, size_t errstr_size);

/* Frees the admin handle. NULL is a no-op. */
PROSODY_EXPORT void prosody_admin_destroy(prosody_admin_t *admin);

/*
 * Topic settings: a plain table. Zero / NULL fields take the value of the
 * PROSODY_TOPIC_* environment variable when set, and the broker's default
 * otherwise. Initialise with PROSODY_TOPIC_OPTIONS_INIT.
 */
typedef struct prosody_topic_options {
  int32_t partitions;         /* 0: default */
  int16_t replication_factor; /* 0: default */
  const char *cleanup_policy; /* "delete", "compact", "compact,delete",
                                 "delete,compact"; "none": the broker's */
  int64_t retention_ms;       /* 0: default; -1: keep for ever */
  int64_t timeout_ms;         /* 0: 30 s; at most 3600000; bounds the call */
} prosody_topic_options_t;

#define PROSODY_TOPIC_OPTIONS_INIT                                             \
  { 0, 0, NULL, 0, 0 }

/*
 * Creates topic `name` and waits until the cluster's metadata shows it with
 * all its partitions. `opts` may be NULL. Blocks.
 * Errors: PROSODY_ERR_INVALID_ARG (bad name or option field, e.g. an
 * unknown cleanup_policy), PROSODY_ERR_CONFIG (bad PROSODY_TOPIC_*
 * variable), PROSODY_ERR_TOPIC_EXISTS, PROSODY_ERR_TIMEOUT,
 * PROSODY_ERR_TRANSIENT (also, at once, when no broker answers at
 * bootstrap_servers), PROSODY_ERR_UNSUPPORTED (at once: the cluster has no
 * admin API, as a librdkafka mock cluster reached over the network, such
 * as `prosody broker`, which creates a topic on first use instead),
 * PROSODY_ERR_PERMANENT.
 */
PROSODY_EXPORT prosody_err_t prosody_admin_create_topic(
    prosody_admin_t *admin, const char *name,
    const prosody_topic_options_t *opts, char *errstr, size_t errstr_size);

/*
 * Deletes topic `name` and waits for the broker's answer (at most 30 s).
 * Destroy every client that consumed from the topic first (librdkafka can
 * hang otherwise). On the mock cluster, which cannot delete, the topic is
 * made to report UNKNOWN_TOPIC_OR_PART until it is created again.
 * Errors: PROSODY_ERR_INVALID_ARG, PROSODY_ERR_UNKNOWN_TOPIC,
 * PROSODY_ERR_TIMEOUT, PROSODY_ERR_TRANSIENT, PROSODY_ERR_UNSUPPORTED and
 * PROSODY_ERR_PERMANENT, as for prosody_admin_create_topic().
 */
PROSODY_EXPORT prosody_err_t prosody_admin_delete_topic(prosody_admin_t *admin,
                                                        const char *name,
                                                        char *errstr,
                                                        size_t errstr_size);

/* ------------------------------------------------------------------------ */
/* Event queue: from libprosody's threads to a host's event loop             */
/* ------------------------------------------------------------------------ */

/*
 * A multi-producer, single-consumer queue of the host's own items, with one
 * wake-up each time it turns non-empty: for hosts with an event loop of
 * their own (the Python and Node.js packages), whose callbacks run on
 * libprosody's threads (an asynchronous handler on the engine thread, the
 * results of prosody_timer_async() and prosody_send_async(), cancellations,
 * log lines) and must only hand the news over. Such a callback pushes an
 * item and returns; the host's loop is woken once per batch, takes every
 * item queued since, and handles them on its own thread.
 *
 * The wake-up is a file descriptor (as librdkafka's
 * rd_kafka_queue_io_event_enable()): prosody_queue_fd() is readable from
 * the push that makes the queue non-empty until the next
 * prosody_queue_take(); a loop watches it (asyncio's add_reader, a
 * uv_poll_t, poll()). Or, with prosody_queue_set_wake_cb(), a function of
 * the host's is called instead (as rd_kafka_queue_cb_event_enable()), for
 * a host whose loop has a thread-safe wake-up of its own (Node-API's
 * napi_call_threadsafe_function()).
 *
 * Items are intrusive: the host embeds a prosody_queue_item_t in its own
 * struct, so a push never allocates and cannot fail for want of memory.
 * An item belongs to the queue from its push until the take that returns
 * it, and to the host otherwise: it must not be pushed twice before it is
 * taken. The queue never reads `kind` and never frees an item.
 *
 * Thread contracts: push and offer from any thread (they take the queue's
 * lock briefly, never block otherwise and never call back except the wake
 * function); take from one thread at a time (the host's loop thread).
 */
typedef struct prosody_queue prosody_queue_t;

/* A queued item: a plain struct embedded in the host's own. */
typedef struct prosody_queue_item {
  struct prosody_queue_item *next; /* the queue's while listed; then the
                                      next item of the taken list */
  int kind;                        /* the host's own tag, never read here */
  int bounded;                     /* set by the queue: listed by offer */
} prosody_queue_item_t;

/*
 * A new, empty queue. `bound` caps the items listed by
 * prosody_queue_offer() (0: no cap); prosody_queue_push() ignores it.
 * Returns NULL with the reason in errstr when out of memory or out of file
 * descriptors (the eventfd).
 */
PROSODY_EXPORT prosody_queue_t *prosody_queue_new(size_t bound, char *errstr,
                                                  size_t errstr_size);

/*
 * Frees the queue and closes its descriptor. Items still listed are not
 * freed (they are the host's: take them first). No push may run or follow.
 * NULL is a no-op.
 */
PROSODY_EXPORT void prosody_queue_destroy(prosody_queue_t *q);

/* The descriptor a loop watches for readability (owned by the queue: do
 * not read, write or close it). -1 for a NULL queue. */
PROSODY_EXPORT int prosody_queue_fd(const prosody_queue_t *q);

/*
 * Calls `cb(opaque)` instead of signalling the descriptor each time the
 * queue turns non-empty, on the pushing thread, after the queue's lock is
 * released: it must not block and must not take from the queue. Set it
 * before the first push (not thread-safe against pushes). NULL restores
 * the descriptor.
 */
PROSODY_EXPORT void prosody_queue_set_wake_cb(prosody_queue_t *q,
                                              void (*cb)(void *opaque),
                                              void *opaque);

/* Lists `item` at the tail and wakes the host if the queue was empty (or
 * was taken since the last wake-up). Never fails; NULL is a no-op. */
PROSODY_EXPORT void prosody_queue_push(prosody_queue_t *q,
                                       prosody_queue_item_t *item);

/*
 * Like prosody_queue_push() for items that may be dropped (log lines): it
 * refuses `item`, returning -1, when `bound` offered items are listed
 * already; a NULL `item` (the caller could not allocate one) is refused
 * too. Each refusal is counted, and the count is given by the next take
 * (which also wakes the host: the count is news). 0 when listed.
 */
PROSODY_EXPORT int prosody_queue_offer(prosody_queue_t *q,
                                       prosody_queue_item_t *item);

/*
 * Takes every listed item, oldest first, as a list linked by `next`
 * (NULL when empty), and resets the wake-up: a push after this call wakes
 * the host again. `*dropped` (may be NULL) receives the refusals counted
 * since the last take. Call it from one thread at a time.
 */
PROSODY_EXPORT prosody_queue_item_t *prosody_queue_take(prosody_queue_t *q,
                                                        unsigned long *dropped);

/* ------------------------------------------------------------------------ */
/* Embedded mock cluster                                                     */
/* ------------------------------------------------------------------------ */

/*
 * Starts (on first use) the process-wide mock Kafka cluster that every
 * `mock=true` client and admin handle shares, and writes its bootstrap
 * address ("127.0.0.1:port") into `buf`. Plain librdkafka clients in the same
 * process (or other processes on this machine) can connect to it. The
 * cluster lives until the process exits. Errors: PROSODY_ERR_INVALID_ARG
 * (buffer too small), PROSODY_ERR_TRANSIENT (could not start).
 */
PROSODY_EXPORT prosody_err_t prosody_mock_bootstrap_servers(char *buf,
                                                            size_t buf_size,
                                                            char *errstr,
                                                            size_t errstr_size);

/*
 * Sets how long the mock cluster waits, when a member joins an empty
 * consumer group, for more members before it assigns the partitions (a
 * broker's group.initial.rebalance.delay.ms). The default is the mock's own,
 * 3000 ms, as Kafka's: members started together share the first
 * assignment. With 0 a group of one is assigned at once (a test with one
 * consumer per group saves 3 s per group); a member that joins a group
 * already assigned then starts a rebalance, which the mock runs
 * `session.timeout.ms` minus 1 s later (5 s in mock mode). Applies to every
 * join after the call, in the running cluster and in one started later;
 * process-wide, like the cluster. Writes the value it replaces into
 * `*previous_ms` (may be NULL), to restore it. Any thread; does not block.
 * Errors: PROSODY_ERR_INVALID_ARG (`delay_ms` outside 0..=300000; nothing
 * changes).
 */
PROSODY_EXPORT prosody_err_t prosody_mock_set_group_initial_rebalance_delay(
    int delay_ms, int *previous_ms, char *errstr, size_t errstr_size);

#ifdef __cplusplus
}
#endif

#endif /* PROSODY_H */
