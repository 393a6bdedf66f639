/*
 * util.c - bounded formatting, UTF-8 validation, clocks and the logger.
 *
 * The logger's threshold is one atomic int shared by the process; lines are
 * written with a single fprintf so concurrent lines do not interleave.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "util.h"

void pr__errf(char *errstr, size_t errstr_size, const char *fmt, ...) {
  va_list ap;
  if (!errstr || errstr_size == 0)
    return;
  va_start(ap, fmt);
  vsnprintf(errstr, errstr_size, fmt, ap);
  va_end(ap);
}

char *pr__strdup(const char *s) { return s ? strdup(s) : NULL; }

int pr__utf8_valid(const char *str, size_t len) {
  const unsigned char *s = (const unsigned char *)str;
  size_t i = 0;
  while (i < len) {
    unsigned char c = s[i];
    size_t n;
    uint32_t cp;
    uint64_t w;
    if (i + 8 <= len) { /* eight ASCII bytes at once (keys mostly are) */
      memcpy(&w, s + i, 8);
      if (!(w & UINT64_C(0x8080808080808080))) {
        i += 8;
        continue;
      }
    }
    if (c < 0x80) {
      i++;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      n = 1;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      n = 2;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      n = 3;
      cp = c & 0x07;
    } else {
      return 0;
    }
    if (i + n >= len)
      return 0;
    for (size_t k = 1; k <= n; k++) {
      if ((s[i + k] & 0xC0) != 0x80)
        return 0;
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) ||
        (n == 3 && cp < 0x10000) || cp > 0x10FFFF ||
        (cp >= 0xD800 && cp <= 0xDFFF))
      return 0;
    i += n + 1;
  }
  return 1;
}

void pr__deadline_after(clockid_t clk, int64_t delay_ns, struct timespec *ts) {
  int64_t ns;
  clock_gettime(clk, ts);
  ns = ts->tv_nsec + delay_ns % 1000000000;
  ts->tv_sec += (time_t)(delay_ns / 1000000000 + ns / 1000000000);
  ts->tv_nsec = (long)(ns % 1000000000);
}

int64_t pr__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t pr__wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static atomic_int log_level = -1; /* -1: not yet read from PROSODY_LOG */
static const char *const level_names[] = {"OFF",  "ERROR", "WARN",
                                          "INFO", "DEBUG", "TRACE"};
static __thread pr__logger_t *tls_logger; /* NULL: the process default */
static pthread_mutex_t default_lock = PTHREAD_MUTEX_INITIALIZER;
static pr__logger_t default_logger; /* its repeat state: under default_lock;
                                      its level: pr__log_level() */

/* How long a repeated warning or error stays folded. */
#define PR_LOG_REPEAT_NS INT64_C(10000000000)

static pr__log_level_t level_from_env(void) {
  const char *e = getenv("PROSODY_LOG");
  if (e && *e) {
    for (int i = 0; i <= PR_LOG_TRACE; i++)
      if (!strcasecmp(e, level_names[i]))
        return (pr__log_level_t)i;
  }
  return PR_LOG_INFO;
}

pr__log_level_t pr__log_level(void) {
  int l = atomic_load(&log_level);
  if (l < 0) {
    l = (int)level_from_env();
    atomic_store(&log_level, l);
  }
  return (pr__log_level_t)l;
}

void pr__logger_init(pr__logger_t *lg, pr__log_level_t level, prosody_log_cb cb,
                     void *opaque) {
  memset(lg, 0, sizeof(*lg));
  lg->level = (int)level;
  lg->cb = cb;
  lg->opaque = opaque;
  pthread_mutex_init(&lg->lock, NULL);
  pthread_rwlock_init(&lg->cb_lock, NULL);
}

void pr__logger_detach(pr__logger_t *lg) {
  pthread_rwlock_wrlock(&lg->cb_lock);
  lg->cb = NULL;
  lg->opaque = NULL;
  pthread_rwlock_unlock(&lg->cb_lock);
}

pr__logger_t *pr__log_current(void) { return tls_logger; }

pr__logger_t *pr__log_adopt(pr__logger_t *lg) {
  pr__logger_t *prev = tls_logger;
  tls_logger = lg;
  return prev;
}

/* Writes one line (the repeat lock not held: a callback may take its own;
 * a client's callback runs under its read lock, so detaching waits for
 * it). */
static void emit(pr__logger_t *lg, pr__log_level_t level, const char *subsystem,
                 const char *msg) {
  char stamp[32];
  struct timespec ts;
  struct tm tm;
  if (lg != &default_logger) {
    pthread_rwlock_rdlock(&lg->cb_lock);
    if (lg->cb) {
      lg->cb((prosody_log_level_t)level, subsystem, msg, lg->opaque);
      pthread_rwlock_unlock(&lg->cb_lock);
      return;
    }
    pthread_rwlock_unlock(&lg->cb_lock);
  }
  clock_gettime(CLOCK_REALTIME, &ts);
  gmtime_r(&ts.tv_sec, &tm);
  strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%S", &tm);
  fprintf(stderr, "%s.%03ldZ %-5s prosody::%s: %s\n", stamp,
          ts.tv_nsec / 1000000, level_names[level], subsystem, msg);
}

/* A folded line's count, taken (lock held): what to say, if anything. */
typedef struct repeat {
  int level;
  char sub[32], msg[96];
} repeat_t;

static int take_repeats(pr__logger_t *lg, repeat_t *r) {
  if (!lg->repeats)
    return 0;
  r->level = lg->last_level;
  snprintf(r->sub, sizeof(r->sub), "%s", lg->last_sub);
  snprintf(r->msg, sizeof(r->msg),
           "the previous message repeated %u more time%s", lg->repeats,
           lg->repeats == 1 ? "" : "s");
  lg->repeats = 0;
  return 1;
}

void pr__logger_fini(pr__logger_t *lg) {
  repeat_t r;
  int said;
  pthread_mutex_lock(&lg->lock);
  said = take_repeats(lg, &r);
  pthread_mutex_unlock(&lg->lock);
  if (said)
    emit(lg, (pr__log_level_t)r.level, r.sub, r.msg);
  pthread_mutex_destroy(&lg->lock);
  pthread_rwlock_destroy(&lg->cb_lock);
}

void pr__log(pr__log_level_t level, const char *subsystem, const char *fmt,
             ...) {
  pr__logger_t *lg = tls_logger ? tls_logger : &default_logger;
  pthread_mutex_t *lock = tls_logger ? &lg->lock : &default_lock;
  int threshold = tls_logger ? lg->level : (int)pr__log_level();
  char msg[1024];
  repeat_t r;
  int said = 0;
  va_list ap;

  if (level == PR_LOG_OFF || (int)level > threshold)
    return;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  if (level <= PR_LOG_WARN) { /* fold a warning or error said again */
    uint64_t h = pr__fnv1a_str(msg) ^ pr__fnv1a_str(subsystem) ^ level;
    int64_t now = pr__now_ns();
    pthread_mutex_lock(lock);
    if (h == lg->last_hash && now - lg->last_ns < PR_LOG_REPEAT_NS) {
      lg->repeats++;
      pthread_mutex_unlock(lock);
      return;
    }
    said = take_repeats(lg, &r);
    lg->last_hash = h;
    lg->last_ns = now;
    lg->last_level = (int)level;
    snprintf(lg->last_sub, sizeof(lg->last_sub), "%s", subsystem);
    pthread_mutex_unlock(lock);
  }
  if (said)
    emit(lg, (pr__log_level_t)r.level, r.sub, r.msg);
  emit(lg, level, subsystem, msg);
}

int pr__strset_find(const pr__strset_t *set, const char *s) {
  for (size_t i = 0; i < set->n; i++)
    if (!strcmp(set->v[i], s))
      return (int)i;
  return -1;
}

int pr__strset_add(pr__strset_t *set, const char *s) {
  char **grown = realloc(set->v, (set->n + 1) * sizeof(char *));
  char *copy = strdup(s);
  if (grown)
    set->v = grown;
  if (!grown || !copy) {
    free(copy);
    return -1;
  }
  set->v[set->n++] = copy;
  return 0;
}

void pr__strset_remove(pr__strset_t *set, size_t i) {
  free(set->v[i]);
  set->v[i] = set->v[--set->n];
}

void pr__strset_clear(pr__strset_t *set) {
  for (size_t i = 0; i < set->n; i++)
    free(set->v[i]);
  free(set->v);
  set->v = NULL;
  set->n = 0;
}

char *pr__strndup(const void *p, size_t n) {
  char *s = malloc(n + 1);
  if (s) {
    if (n)
      memcpy(s, p, n);
    s[n] = '\0';
  }
  return s;
}

#define FNV_OFFSET UINT64_C(14695981039346656037)
#define FNV_PRIME UINT64_C(1099511628211)

uint64_t pr__fnv1a(const void *p, size_t n) {
  const unsigned char *b = p;
  uint64_t h = FNV_OFFSET;
  for (size_t i = 0; i < n; i++)
    h = (h ^ b[i]) * FNV_PRIME;
  return h;
}

uint64_t pr__fnv1a_str(const char *s) {
  uint64_t h = FNV_OFFSET;
  for (; *s; s++)
    h = (h ^ (unsigned char)*s) * FNV_PRIME;
  return h;
}

int pr__grow(void *p, size_t *cap, size_t n, size_t size, size_t first) {
  void *arr, *grown;
  size_t want;
  if (n < *cap)
    return 0;
  want = *cap ? *cap * 2 : first;
  if (want < *cap || want > SIZE_MAX / size)
    return -1;
  /* `p` points at a typed pointer (int64_t **, ...): copied, not punned */
  memcpy(&arr, p, sizeof(arr));
  if (!(grown = realloc(arr, want * size)))
    return -1;
  memcpy(p, &grown, sizeof(grown));
  *cap = want;
  return 0;
}

#define RFC_SLOTS 16 /* seconds whose text a thread keeps */

void pr__rfc3339_ms(int64_t ms, char *buf, size_t n) {
  /* The seconds' text is kept per thread in a small table by second:
   * events come many per second, and a timer's event names two seconds
   * (now and the timer's), which a single entry would recompute each
   * time. */
  static __thread int64_t cached_sec[RFC_SLOTS] = {
      INT64_MIN, INT64_MIN, INT64_MIN, INT64_MIN, INT64_MIN, INT64_MIN,
      INT64_MIN, INT64_MIN, INT64_MIN, INT64_MIN, INT64_MIN, INT64_MIN,
      INT64_MIN, INT64_MIN, INT64_MIN, INT64_MIN};
  static __thread char base[RFC_SLOTS][32];
  static __thread size_t base_len[RFC_SLOTS];
  int64_t sec = ms / 1000;
  size_t slot = (size_t)((uint64_t)sec % RFC_SLOTS), len;
  int frac = (int)(ms % 1000);
  if (sec != cached_sec[slot]) {
    time_t t = (time_t)sec;
    struct tm tm;
    gmtime_r(&t, &tm);
    base_len[slot] =
        strftime(base[slot], sizeof(base[slot]), "%Y-%m-%dT%H:%M:%S", &tm);
    cached_sec[slot] = sec;
  }
  len = base_len[slot];
  if (frac < 0 || n < len + 6) { /* before the epoch, or a short buffer */
    snprintf(buf, n, "%s.%03dZ", base[slot], frac);
    return;
  }
  memcpy(buf, base[slot], len);
  buf[len] = '.';
  buf[len + 1] = (char)('0' + frac / 100);
  buf[len + 2] = (char)('0' + frac / 10 % 10);
  buf[len + 3] = (char)('0' + frac % 10);
  buf[len + 4] = 'Z';
  buf[len + 5] = '\0';
}
