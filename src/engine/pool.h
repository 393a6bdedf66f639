/*
 * pool.h - the C executor: a fixed pool of worker threads running jobs in
 * FIFO order (private). The engine never submits more jobs than threads
 * (its limiter holds the rest), so every job gets a thread: at once when
 * a worker is free, else after the wake-ups of the jobs queued before it
 * (see pool.c for the wake-up policy).
 */
#ifndef PR_POOL_H
#define PR_POOL_H

typedef struct pr__pool pr__pool_t;
typedef void (*pr__job_fn)(void *arg);

/* Starts `threads` workers; NULL on failure. */
pr__pool_t *pr__pool_new(int threads);
/* Queues a job; 0 on success. Thread-safe. */
int pr__pool_submit(pr__pool_t *pool, pr__job_fn fn, void *arg);
/* Queues one job of a burst: wakes a sleeper (if no awake worker is free)
 * only while *may_wake is set, and clears it when it does; the submitter
 * sets it again, and calls pr__pool_kick(), when the burst ends. */
int pr__pool_submit_burst(pr__pool_t *pool, pr__job_fn fn, void *arg,
                          int *may_wake);
/* Wakes a sleeping worker if jobs are queued and no awake worker is free
 * to take them. Thread-safe. */
void pr__pool_kick(pr__pool_t *pool);
/* Runs the queued jobs, then joins the workers and frees the pool. */
void pr__pool_destroy(pr__pool_t *pool);

#endif /* PR_POOL_H */
