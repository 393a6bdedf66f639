/*
 * timer.c - timer times: rounding to whole seconds and range checks.
 */
#include <stdio.h>
#include <time.h>

#include "../util/util.h"
#include "timers.h"

static void format_utc(int64_t s, char *buf, size_t n) {
  time_t t = (time_t)s;
  struct tm tm;
  if (!gmtime_r(&t, &tm) || !strftime(buf, n, "%Y-%m-%dT%H:%M:%SZ", &tm))
    snprintf(buf, n, "%lld s", (long long)s);
}

prosody_err_t pr__timer_round(int64_t time_ms, int64_t *out_s, char *errstr,
                              size_t errstr_size) {
  char when[64], max[64];
  if (time_ms < 0) {
    format_utc(time_ms / 1000 - (time_ms % 1000 != 0), when, sizeof(when));
    pr__errf(errstr, errstr_size,
             "timer time %lld ms (%s) is before the epoch; timers take "
             "milliseconds since 1970-01-01T00:00:00Z",
             (long long)time_ms, when);
    return PROSODY_ERR_INVALID_ARG;
  }
  /* Half up; no overflow: time_ms <= INT64_MAX, so time_ms / 1000 + 1
   * fits. */
  *out_s = time_ms / 1000 + (time_ms % 1000 >= 500);
  if (*out_s > PR_TIMER_MAX_S) {
    format_utc(PR_TIMER_MAX_S, max, sizeof(max));
    pr__errf(errstr, errstr_size,
             "timer time %lld ms is beyond %s, the latest time a timer can "
             "hold",
             (long long)time_ms, max);
    return PROSODY_ERR_INVALID_ARG;
  }
  return PROSODY_OK;
}
