/*
 * engine.h - the consumer engine (private): one thread per subscribed
 * client running a libuv loop that owns every piece of consumer state.
 */
#ifndef PR_ENGINE_H
#define PR_ENGINE_H

#include "../config/config.h"
#include "../kafka/kafka.h"
#include "prosody.h"

typedef struct pr__engine pr__engine_t;

/* Opens the timer store, creates the consumer and starts the engine
 * thread (*engine). `st` and `producer` must outlive the engine. Errors
 * keep their class: PROSODY_ERR_CONFIG (e.g. cassandra_nodes missing, a
 * Kafka setting refused), PROSODY_ERR_TRANSIENT (Cassandra unreachable),
 * PROSODY_ERR_NOMEM. */
prosody_err_t pr__engine_start(const pr__settings_t *st, const char *bootstrap,
                               pr__producer_t *producer,
                               const prosody_handler_t *handler,
                               pr__engine_t **engine, char *errstr,
                               size_t errstr_size);
/* Graceful shutdown (phases per shutdown_timeout), then frees the engine.
 * Blocks. Returns 1 when it had to abandon the engine to threads still
 * running (its memory, and the logger they use, must then stay). */
int pr__engine_stop(pr__engine_t *engine);
/* Thread-safe readings. */
int pr__engine_assigned(const pr__engine_t *engine);
/* The consumer's metrics in Prometheus text format (malloc'd; NULL when
 * out of memory). Any thread. */
char *pr__engine_metrics(pr__engine_t *engine);
int pr__engine_stalled(const pr__engine_t *engine);

/* Published keyed state's readers (state_pub_open.c; their reads:
 * state_pub.c): the client's, created by its first prosody_published_open()
 * and freed with the client (both under the client's lock). */
typedef struct pr__pubs pr__pubs_t;
prosody_err_t pr__pubs_open(pr__pubs_t **pubs, const pr__settings_t *st,
                            const char *subsystem, const char *name, int kind,
                            int64_t read_cache_ms, prosody_published_t **out,
                            char *errstr, size_t errstr_size);
void pr__pubs_free(pr__pubs_t *pubs);

#endif /* PR_ENGINE_H */
