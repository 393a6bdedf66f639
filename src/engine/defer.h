/*
 * defer.h - what the defer layer's two state-machine files share (private
 * to defer.c, which defers events and keeps the deferred keys, and
 * defer_retry.c, which retries them). Everything here is the engine
 * thread's.
 */
#ifndef PR_ENGINE_DEFER_H
#define PR_ENGINE_DEFER_H

#include <stddef.h>
#include <stdint.h>

#include "internal.h"

/* The room a segment's name is given (pr__df_segment). */
#define PR_DF_SEG_MAX 1024

/* Writes `part`'s segment name (as the original names it) into `buf`. */
void pr__df_segment(const part_t *part, char *buf, size_t n);
/* A new deferred key of `kq`, retried at `retry_at_ms`; NULL: no memory. */
pr__dk_t *pr__df_dk_new(part_t *part, kq_t *kq, int kind, int64_t retry_at_ms);
/* A request about `key` of `part` (store or loader); NULL: no memory. */
pr__load_t *pr__df_req_new(const part_t *part, const char *key, int kind);
/* The assignment a request was made for while it is live, else NULL. */
part_t *pr__df_req_part(const pr__load_t *r);
/* The request's deferred key (its live assignment in *partp), or NULL. */
pr__dk_t *pr__df_req_dk(const pr__load_t *r, part_t **partp);
/* Forgets `dk` (its queue is empty), its retry timers and row; takes `r`. */
void pr__df_forget(part_t *part, pr__dk_t *dk, pr__load_t *r);

#endif /* PR_ENGINE_DEFER_H */
