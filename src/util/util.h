/*
 * util.h - small helpers shared by every subsystem: bounded string
 * formatting, UTF-8 validation, monotonic time, and the process-wide logger.
 */
#ifndef PR_UTIL_H
#define PR_UTIL_H

#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "prosody.h"

#if defined(__GNUC__)
#define PR_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define PR_PRINTF(f, a)
#endif

/* snprintf into a caller's errstr that may be NULL or zero-sized. */
void pr__errf(char *errstr, size_t errstr_size, const char *fmt, ...)
    PR_PRINTF(3, 4);

/* strdup that returns NULL for NULL. */
char *pr__strdup(const char *s);
/* A NUL-terminated copy of `n` bytes at `p` (which need not be); NULL when
 * out of memory. */
char *pr__strndup(const void *p, size_t n);
/* The payload of a record with no value (an excise record, a Kafka
 * tombstone): an empty string whose address is the mark. Handed to the
 * producer in place of a JSON text, it sends the key without a value; an
 * excise record's message points its payload here (jsonv.c). */
extern const char pr__no_value[1];
/* 1 if `len` bytes at `text` are one JSON value (any type) that
 * json_loadb(JSON_DECODE_ANY) would accept; builds nothing (jsonv.c). */
int pr__json_valid(const char *text, size_t len);
/* pr__json_valid(), and: when the value is an object whose first member
 * named `member` (compared as written, without unescaping) holds a
 * string, *value and *value_len give that string's escaped text (between
 * the quotes), else *value is NULL. */
int pr__json_scan(const char *text, size_t len, const char *member,
                  const char **value, size_t *value_len);
/* pr__json_scan() that stops at the member's string: 0 when found (*value
 * set as pr__json_scan() would set it; the rest is not read, so validity
 * is not known), else 1 if the text is valid, -1 if not. */
int pr__json_find(const char *text, size_t len, const char *member,
                  const char **value, size_t *value_len);
/* Unescapes the text of a JSON string that pr__json_scan() accepted
 * into `out` (at most `n` bytes: unescaping never lengthens); returns the
 * length written (no NUL added). */
size_t pr__json_unescape(const char *raw, size_t n, char *out);
/* Makes room for one more element in the growable array *p of *cap
 * elements of `size` bytes holding `n` (doubling, from `first`); 0, or
 * -1 when out of memory (the array is left as it was). */
int pr__grow(void *p, size_t *cap, size_t n, size_t size, size_t first);
/* 64-bit FNV-1a of `n` bytes, and of a NUL-terminated string. */
uint64_t pr__fnv1a(const void *p, size_t n);
uint64_t pr__fnv1a_str(const char *s);
/* The name-based UUID (RFC 9562 version 5: SHA-1, OpenSSL's) of the `n`
 * bytes at `name` in the namespace `ns` (16 bytes, network order), as 16
 * bytes in `out`; 0, or -1 when the digest fails (out of memory). */
int pr__uuid_v5(const uint8_t ns[16], const void *name, size_t n,
                uint8_t out[16]);
/* RFC 9562's namespace for ISO OIDs, 6ba7b812-9dad-11d1-80b4-00c04fd430c8. */
extern const uint8_t pr__uuid_ns_oid[16];
/* ... and for URLs, 6ba7b811-9dad-11d1-80b4-00c04fd430c8. */
extern const uint8_t pr__uuid_ns_url[16];

/* 1 if the `len` bytes at `s` are valid UTF-8 (no overlongs, no surrogates,
 * nothing above U+10FFFF), 0 otherwise. */
int pr__utf8_valid(const char *s, size_t len);

/* `*ts` = clock `clk` now + `delay_ns` (normalised): an absolute deadline
 * for pthread_cond_timedwait and friends. */
void pr__deadline_after(clockid_t clk, int64_t delay_ns, struct timespec *ts);

/* A small set of strings (linear; for the handful of topics a client uses).
 * Not thread-safe: its owner's lock guards it. */
typedef struct pr__strset {
  char **v;
  size_t n;
} pr__strset_t;
/* Index of `s`, or -1. */
int pr__strset_find(const pr__strset_t *set, const char *s);
/* Adds a copy of `s` (no duplicate check); 0, or -1 when out of memory. */
int pr__strset_add(pr__strset_t *set, const char *s);
/* Removes (and frees) the element at index `i`; order is not kept. */
void pr__strset_remove(pr__strset_t *set, size_t i);
/* Frees every element and the array. */
void pr__strset_clear(pr__strset_t *set);

/* Monotonic clock in nanoseconds. */
int64_t pr__now_ns(void);
/* Wall clock in milliseconds since the epoch. */
int64_t pr__wall_ms(void);
/* `ms` since the epoch as RFC 3339 in UTC with milliseconds
 * ("2026-12-04T13:55:34.123Z"). */
void pr__rfc3339_ms(int64_t ms, char *buf, size_t n);

/* Log levels, most severe first; matches the `log` option's enum order
 * (off, error, warn, info, debug, trace). */
typedef enum pr__log_level {
  PR_LOG_OFF = 0,
  PR_LOG_ERROR = 1,
  PR_LOG_WARN = 2,
  PR_LOG_INFO = 3,
  PR_LOG_DEBUG = 4,
  PR_LOG_TRACE = 5
} pr__log_level_t;

/*
 * A logger: a threshold, where lines go (a callback, or stderr), and the
 * state that folds repeated warnings and errors. Each client has one; the
 * process default (level from PROSODY_LOG, default info; stderr) takes
 * lines of threads that belong to no client.
 *
 * A thread logs to its current logger: pr__log_adopt() sets it (the
 * client's threads adopt it when they start, the public functions around
 * their body). A thread the library starts adopts its creator's logger
 * (pr__log_current() read by the creator, adopted by the new thread).
 */
typedef struct pr__logger {
  int level; /* pr__log_level_t; immutable after init */
  /* Where lines go: cb (NULL: stderr) with opaque, under cb_lock (read
   * while calling it, written by pr__logger_detach). */
  pthread_rwlock_t cb_lock;
  void (*cb)(prosody_log_level_t level, const char *subsystem,
             const char *message, void *opaque);
  void *opaque;
  pthread_mutex_t lock; /* guards the repeat state below */
  uint64_t last_hash;   /* the last warning/error said */
  int64_t last_ns;      /* when it was said */
  unsigned repeats;     /* how often it came again since, unsaid */
  int last_level;
  char last_sub[32];
} pr__logger_t;

void pr__logger_init(pr__logger_t *lg, pr__log_level_t level, prosody_log_cb cb,
                     void *opaque);
/* From its return on, the callback is never called again, and no call is
 * still running: lines go to stderr (for threads that outlive their
 * client, whose callback's opaque the application may free). */
void pr__logger_detach(pr__logger_t *lg);
/* Says what repeated, if anything, then forgets it. */
void pr__logger_fini(pr__logger_t *lg);
/* The calling thread's logger, NULL for the process default. */
pr__logger_t *pr__log_current(void);
/* Makes `lg` (NULL: the default) the calling thread's logger; returns the
 * previous one, to restore. */
pr__logger_t *pr__log_adopt(pr__logger_t *lg);
/* The process default's level (PROSODY_LOG, read once). */
pr__log_level_t pr__log_level(void);
/* Logs one line to the calling thread's logger when `level` passes its
 * threshold. */
void pr__log(pr__log_level_t level, const char *subsystem, const char *fmt, ...)
    PR_PRINTF(3, 4);

#define PR_ERROR(sub, ...) pr__log(PR_LOG_ERROR, sub, __VA_ARGS__)
#define PR_WARN(sub, ...) pr__log(PR_LOG_WARN, sub, __VA_ARGS__)
#define PR_INFO(sub, ...) pr__log(PR_LOG_INFO, sub, __VA_ARGS__)
#define PR_DEBUG(sub, ...) pr__log(PR_LOG_DEBUG, sub, __VA_ARGS__)

#endif /* PR_UTIL_H */
