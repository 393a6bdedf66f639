/*
 * duration.c - humantime durations: "500ms", "5m", "2h 30m", "1h30m", "7d".
 *
 * A duration is one or more <integer><unit> terms, optionally separated by
 * whitespace. Units: ns, us (µs), ms, s, m, h, d, w, M (30.44 days) and
 * y (365.25 days), plus their long spellings (nsec, usec, msec, sec,
 * second(s), min, minute(s), hr, hour(s), day(s), week(s), month(s),
 * year(s)). A bare number is an error: the unit is never guessed.
 * Results are nanoseconds in an int64_t (up to about 292 years).
 */
#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "config.h"

#define NS_PER_US INT64_C(1000)
#define NS_PER_MS INT64_C(1000000)
#define NS_PER_S INT64_C(1000000000)

typedef struct unit {
  const char *name;
  int64_t ns;
} unit_t;

/* Case matters: "M" is months and "m" minutes. */
static const unit_t units[] = {
    {"nsec", 1},
    {"ns", 1},
    {"usec", NS_PER_US},
    {"us", NS_PER_US},
    {"\xc2\xb5s", NS_PER_US},
    {"msec", NS_PER_MS},
    {"ms", NS_PER_MS},
    {"seconds", NS_PER_S},
    {"second", NS_PER_S},
    {"sec", NS_PER_S},
    {"s", NS_PER_S},
    {"minutes", 60 * NS_PER_S},
    {"minute", 60 * NS_PER_S},
    {"min", 60 * NS_PER_S},
    {"m", 60 * NS_PER_S},
    {"hours", 3600 * NS_PER_S},
    {"hour", 3600 * NS_PER_S},
    {"hr", 3600 * NS_PER_S},
    {"h", 3600 * NS_PER_S},
    {"days", 86400 * NS_PER_S},
    {"day", 86400 * NS_PER_S},
    {"d", 86400 * NS_PER_S},
    {"weeks", 604800 * NS_PER_S},
    {"week", 604800 * NS_PER_S},
    {"w", 604800 * NS_PER_S},
    {"months", 2630016 * NS_PER_S},
    {"month", 2630016 * NS_PER_S},
    {"M", 2630016 * NS_PER_S},
    {"years", 31557600 * NS_PER_S},
    {"year", 31557600 * NS_PER_S},
    {"y", 31557600 * NS_PER_S},
};

static int is_unit_char(unsigned char c) {
  return isalpha(c) || c >= 0x80; /* 0x80+: the UTF-8 bytes of "µ" */
}

int pr__duration_parse(const char *text, int64_t *ns_out, char *errstr,
                       size_t errstr_size) {
  const char *p = text;
  int64_t total = 0;
  int terms = 0;

  if (!text)
    goto empty;
  while (*p) {
    int64_t n = 0;
    const char *num, *u;
    size_t ulen, i;
    const unit_t *unit = NULL;

    while (isspace((unsigned char)*p))
      p++;
    if (!*p)
      break;
    num = p;
    if (!isdigit((unsigned char)*p)) {
      snprintf(errstr, errstr_size,
               "expected a number at \"%s\" (a duration is like \"500ms\", "
               "\"5m\" or \"2h 30m\")",
               p);
      return -1;
    }
    while (isdigit((unsigned char)*p)) {
      int d = *p - '0';
      if (n > (INT64_MAX - d) / 10)
        goto overflow;
      n = n * 10 + d;
      p++;
    }
    u = p;
    while (*p && is_unit_char((unsigned char)*p))
      p++;
    ulen = (size_t)(p - u);
    if (ulen == 0) {
      snprintf(errstr, errstr_size,
               "missing unit after \"%.*s\" (write e.g. \"%.*ss\" or "
               "\"%.*sms\")",
               (int)(p - num), num, (int)(p - num), num, (int)(p - num), num);
      return -1;
    }
    for (i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
      if (strlen(units[i].name) == ulen && !memcmp(units[i].name, u, ulen)) {
        unit = &units[i];
        break;
      }
    }
    if (!unit) {
      snprintf(errstr, errstr_size, "unknown unit \"%.*s\"", (int)ulen, u);
      return -1;
    }
    if (n > INT64_MAX / unit->ns || total > INT64_MAX - n * unit->ns)
      goto overflow;
    total += n * unit->ns;
    terms++;
  }
  if (terms == 0)
    goto empty;
  *ns_out = total;
  return 0;

empty:
  snprintf(errstr, errstr_size,
           "empty duration (write e.g. \"500ms\", \"5m\" or \"2h 30m\")");
  return -1;
overflow:
  snprintf(errstr, errstr_size, "duration too large (at most about 292y)");
  return -1;
}

void pr__duration_format(int64_t ns, char *buf, size_t buf_size) {
  static const unit_t parts[] = {
      {"d", 86400 * NS_PER_S},
      {"h", 3600 * NS_PER_S},
      {"m", 60 * NS_PER_S},
      {"s", NS_PER_S},
      {"ms", NS_PER_MS},
      {"us", NS_PER_US},
      {"ns", 1},
  };
  size_t off = 0, i;

  if (buf_size == 0)
    return;
  buf[0] = '\0';
  if (ns <= 0) {
    snprintf(buf, buf_size, "0s");
    return;
  }
  for (i = 0; i < sizeof(parts) / sizeof(parts[0]) && off < buf_size; i++) {
    int64_t q = ns / parts[i].ns;
    if (q == 0)
      continue;
    ns -= q * parts[i].ns;
    off += (size_t)snprintf(buf + off, buf_size - off, "%s%lld%s",
                            off ? " " : "", (long long)q, parts[i].name);
  }
}
