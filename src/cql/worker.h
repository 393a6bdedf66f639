/*
 * worker.h - a CQL session on its own thread (private), for stores whose
 * owner is another thread (the consumer engine). The owner posts jobs; the
 * worker thread starts them on its session; a finished job is queued back
 * and the owner is woken (its `wake` function) to deliver it with
 * pr__cqlw_poll() on its own thread. A job belongs to one thread at a time:
 * owner, then worker, then owner.
 */
#ifndef PR_CQL_WORKER_H
#define PR_CQL_WORKER_H

#include "cql.h"

typedef struct pr__cqlw pr__cqlw_t;
typedef struct pr__cqlw_job pr__cqlw_job_t;

struct pr__cqlw_job {
  pr__cqlw_job_t *qnext;
  pr__cqlw_t *w;
  void (*start)(pr__cqlw_job_t *j);   /* worker thread: issue requests */
  void (*deliver)(pr__cqlw_job_t *j); /* owner thread: callback, then free */
  prosody_err_t err;
  char errstr[512];
};

/* Creates the session (not yet running: register statements with
 * pr__cql_stmt(pr__cqlw_cql(w), ...) now), then pr__cqlw_start(). */
pr__cqlw_t *pr__cqlw_new(const pr__cql_conf_t *conf, void (*wake)(void *),
                         void *wake_arg, char *errstr, size_t errstr_size);
int pr__cqlw_start(pr__cqlw_t *w, char *errstr, size_t errstr_size);
/* Before start: `fn` runs on the worker thread after each round of posted
 * jobs has been started (a store may queue what its jobs wrote and send it
 * there as one request), and once more with `stopping` set right before
 * the session closes (it must then complete what it still holds). */
void pr__cqlw_on_round(pr__cqlw_t *w, void (*fn)(void *arg, int stopping),
                       void *arg);
/* The session: before start, or on the worker thread. */
pr__cql_t *pr__cqlw_cql(pr__cqlw_t *w);
/* Owner thread: queue a job (w set by the caller). */
void pr__cqlw_post(pr__cqlw_job_t *j);
/* Worker thread: the job is finished. */
void pr__cqlw_complete(pr__cqlw_job_t *j, prosody_err_t err,
                       const char *errstr);
/* Owner thread: deliver finished jobs. */
void pr__cqlw_poll(pr__cqlw_t *w);
/* Owner thread: stop (pending jobs fail), deliver what finished, free. */
void pr__cqlw_free(pr__cqlw_t *w);

#endif /* PR_CQL_WORKER_H */
