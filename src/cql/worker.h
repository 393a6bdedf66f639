/*
 * worker.h - a CQL session on its own thread (private), for the stores of
 * one owner thread (a consumer engine: its timer, deduplication, deferral
 * and keyed-state stores share one session, so one thread and one
 * connection per node). The owner posts jobs; the worker thread starts
 * them on its session; a finished job is queued back and the owner is
 * woken (its `wake` function) to deliver it with pr__cqlw_poll() on its
 * own thread. A job belongs to one thread at a time: owner, then worker,
 * then owner. Every store on a worker has the same owner.
 *
 * Lifetime: counted references. pr__cqlw_new gives its caller one; a store
 * made on the worker takes one (pr__cqlw_ref) and drops it when destroyed
 * (pr__cqlw_free). The last drop stops the worker. A job's delivery needs
 * its store, so no store may be freed while a job of it is pending: an
 * owner with several stores on one worker stops it (pr__cqlw_stop: what is
 * pending fails and is delivered) before it destroys the first of them; a
 * lone store stops the worker with its own last drop.
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

/* Creates the session (connecting once started), with one reference.
 * Statements (pr__cql_stmt(pr__cqlw_cql(w), ...)) and round hooks may be
 * added before or after pr__cqlw_start(). */
pr__cqlw_t *pr__cqlw_new(const pr__cql_conf_t *conf, void (*wake)(void *),
                         void *wake_arg, char *errstr, size_t errstr_size);
/* Starts the thread (again: nothing). -1 (errstr) when it cannot. */
int pr__cqlw_start(pr__cqlw_t *w, char *errstr, size_t errstr_size);
/* Another reference (owner thread). */
pr__cqlw_t *pr__cqlw_ref(pr__cqlw_t *w);
/* Owner thread, any time before the stop: `fn` runs on the worker thread
 * after each round of posted jobs has been started (a store may queue what
 * its jobs wrote and send it there as one request), and once more with
 * `stopping` set right before the session closes (it must then complete
 * what it still holds). At most PR_CQLW_ROUNDS hooks: -1 beyond. */
#define PR_CQLW_ROUNDS 8
int pr__cqlw_on_round(pr__cqlw_t *w, void (*fn)(void *arg, int stopping),
                      void *arg);
/* The session, for statements (any thread: pr__cql_stmt) and for requests
 * (worker thread only). */
pr__cql_t *pr__cqlw_cql(pr__cqlw_t *w);
/* Owner thread: queue a job (w set by the caller). After the stop it
 * fails at once (delivered by the next poll). */
void pr__cqlw_post(pr__cqlw_job_t *j);
/* Worker thread: the job is finished. */
void pr__cqlw_complete(pr__cqlw_job_t *j, prosody_err_t err,
                       const char *errstr);
/* Owner thread: deliver finished jobs. */
void pr__cqlw_poll(pr__cqlw_t *w);
/* Owner thread, while its loop does not run (a store opening): blocks
 * until a job has finished that no poll delivered yet, or `ms` passed. */
void pr__cqlw_wait(pr__cqlw_t *w, int64_t ms);
/* Owner thread: delivers finished jobs until none is pending (posted and
 * not yet delivered) or `ms` passed; the number still pending. */
int pr__cqlw_drain(pr__cqlw_t *w, int64_t ms);
/* Owner thread: stops the worker (pending jobs fail; the round hooks run
 * with `stopping`; the session closes; the thread ends) and delivers what
 * finished. Again: delivers only. */
void pr__cqlw_stop(pr__cqlw_t *w);
/* Owner thread: drops a reference; the last stops the worker and frees
 * it. Delivers what finished either way. */
void pr__cqlw_free(pr__cqlw_t *w);

#endif /* PR_CQL_WORKER_H */
