/*
 * jsonv.c - a JSON validator that builds nothing: accepts exactly what
 * jansson's json_loadb(JSON_DECODE_ANY) accepts (checked by the
 * differential fuzz target tests/fuzz/fuzz_json_valid.c), at a fraction
 * of its cost, so that a record's payload can be checked at intake and
 * parsed into a tree only when the handler asks for one.
 *
 * What jansson rejects beyond the grammar of RFC 8259, and so does this:
 * invalid UTF-8 anywhere; "\u0000" and unpaired surrogate escapes in
 * strings; integers outside int64; reals that overflow a double; values
 * nested deeper than JSON_PARSER_MAX_DEPTH (every value counts, a scalar
 * too). One deliberate difference: a NUL byte is never valid here, while
 * jansson drops one that directly follows a number or a literal ("1\0").
 *
 * Threads: any (pure).
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

typedef struct scan {
  const unsigned char *p, *end;
} scan_t;

static void skip_ws(scan_t *s) {
  while (s->p < s->end &&
         (*s->p == ' ' || *s->p == '\t' || *s->p == '\n' || *s->p == '\r'))
    s->p++;
}

static int hex4(const unsigned char *p, unsigned *out) {
  unsigned v = 0;
  for (int i = 0; i < 4; i++) {
    unsigned c = p[i], d;
    if (c >= '0' && c <= '9')
      d = c - '0';
    else if (c >= 'a' && c <= 'f')
      d = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F')
      d = c - 'A' + 10;
    else
      return -1;
    v = v << 4 | d;
  }
  *out = v;
  return 0;
}

/* One UTF-8 sequence of 2 to 4 bytes whose first byte `c` was consumed:
 * no overlong form, no surrogate, nothing above U+10FFFF. */
static int utf8_tail(scan_t *s, unsigned c) {
  unsigned n, cp, min;
  if (c >= 0xC2 && c <= 0xDF)
    n = 1, cp = c & 0x1F, min = 0x80;
  else if (c >= 0xE0 && c <= 0xEF)
    n = 2, cp = c & 0x0F, min = 0x800;
  else if (c >= 0xF0 && c <= 0xF4)
    n = 3, cp = c & 0x07, min = 0x10000;
  else
    return -1;
  if ((size_t)(s->end - s->p) < n)
    return -1;
  for (unsigned i = 0; i < n; i++) {
    if ((s->p[i] & 0xC0) != 0x80)
      return -1;
    cp = cp << 6 | (s->p[i] & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
    return -1;
  s->p += n;
  return 0;
}

/* A string, the opening quote consumed. Outside strings any byte above
 * 0x7F breaks the grammar, so UTF-8 is checked here only. */
static int string(scan_t *s) {
  while (s->p < s->end) {
    unsigned c = *s->p++;
    if (c == '"')
      return 0;
    if (c < 0x20)
      return -1;
    if (c >= 0x80) {
      if (utf8_tail(s, c))
        return -1;
      continue;
    }
    if (c != '\\')
      continue;
    if (s->p >= s->end)
      return -1;
    c = *s->p++;
    if (c == 'u') {
      unsigned v, lo;
      if (s->end - s->p < 4 || hex4(s->p, &v))
        return -1;
      s->p += 4;
      if (v == 0 || (v >= 0xDC00 && v <= 0xDFFF))
        return -1;
      if (v >= 0xD800 && v <= 0xDBFF) { /* must pair with a low one */
        if (s->end - s->p < 6 || s->p[0] != '\\' || s->p[1] != 'u' ||
            hex4(s->p + 2, &lo) || lo < 0xDC00 || lo > 0xDFFF)
          return -1;
        s->p += 6;
      }
    } else if (!strchr("\"\\/bfnrt", (int)c) || c == 0) {
      return -1;
    }
  }
  return -1;
}

static int digit(const scan_t *s) {
  return s->p < s->end && *s->p >= '0' && *s->p <= '9';
}

/* A number, within int64 when it is an integer, within a double's range
 * when it is not. */
static int number(scan_t *s) {
  const unsigned char *start = s->p, *int_start;
  int real = 0, exp_sign = 1;
  size_t int_digits;
  long exp = 0;
  if (s->p < s->end && *s->p == '-')
    s->p++;
  if (!digit(s))
    return -1;
  int_start = s->p;
  if (*s->p == '0') {
    s->p++;
    if (digit(s))
      return -1;
  } else {
    while (digit(s))
      s->p++;
  }
  int_digits = (size_t)(s->p - int_start);
  if (s->p < s->end && *s->p == '.') {
    s->p++;
    if (!digit(s))
      return -1;
    while (digit(s))
      s->p++;
    real = 1;
  }
  if (s->p < s->end && (*s->p == 'e' || *s->p == 'E')) {
    s->p++;
    if (s->p < s->end && (*s->p == '+' || *s->p == '-'))
      exp_sign = *s->p++ == '-' ? -1 : 1;
    if (!digit(s))
      return -1;
    while (digit(s)) {
      if (exp < 100000)
        exp = exp * 10 + (*s->p - '0');
      s->p++;
    }
    real = 1;
  }
  /* Below 1e300 in magnitude a double cannot overflow: no strtod. */
  if (real && (long)int_digits + exp_sign * exp < 300)
    return 0;
  {
    char buf[64], *copy = buf, *end;
    size_t n = (size_t)(s->p - start);
    int bad;
    if (!real && n < 18) /* fits in int64 whatever the digits */
      return 0;
    if (n >= sizeof(buf) && !(copy = malloc(n + 1)))
      return -1;
    memcpy(copy, start, n);
    copy[n] = '\0';
    errno = 0;
    if (real) {
      double d = strtod(copy, &end);
      bad = errno == ERANGE && (d == HUGE_VAL || d == -HUGE_VAL);
    } else {
      (void)strtoll(copy, &end, 10);
      bad = errno == ERANGE;
    }
    if (copy != buf)
      free(copy);
    return bad ? -1 : 0;
  }
}

static int literal(scan_t *s, const char *word) {
  size_t n = strlen(word);
  if ((size_t)(s->end - s->p) < n || memcmp(s->p, word, n))
    return -1;
  s->p += n;
  /* jansson reads a run of letters as one token ("truex" is no word) */
  if (s->p < s->end &&
      ((*s->p >= 'a' && *s->p <= 'z') || (*s->p >= 'A' && *s->p <= 'Z')))
    return -1;
  return 0;
}

/* An object's key and its ':', leading whitespace included; *k is set
 * to the key's first byte after the quote. */
static int key(scan_t *s, const unsigned char **k) {
  skip_ws(s);
  if (s->p >= s->end || *s->p++ != '"')
    return -1;
  *k = s->p;
  if (string(s))
    return -1;
  skip_ws(s);
  return s->p < s->end && *s->p++ == ':' ? 0 : -1;
}

const char pr__no_value[1] = "";

int pr__json_valid(const char *text, size_t len) {
  return pr__json_scan(text, len, NULL, NULL, NULL);
}

static int scan(const char *text, size_t len, const char *member,
                const char **value, size_t *value_len, int stop);

int pr__json_scan(const char *text, size_t len, const char *member,
                  const char **value, size_t *value_len) {
  return scan(text, len, member, value, value_len, 0) > 0;
}

int pr__json_find(const char *text, size_t len, const char *member,
                  const char **value, size_t *value_len) {
  return scan(text, len, member, value, value_len, 1);
}

/* Values iteratively: `stack` holds the open containers ('[' or '{').
 * 1: valid, -1: not; 0: `stop` and the member's string was found (the
 * rest is not read). */
static int scan(const char *text, size_t len, const char *member,
                const char **value, size_t *value_len, int stop) {
  scan_t s = {(const unsigned char *)text, (const unsigned char *)text + len};
  char small[64], *stack = small;
  size_t depth = 0, cap = sizeof(small);
  size_t mlen = member ? strlen(member) : 0;
  const unsigned char *k = NULL; /* the last key read */
  int ok = -1;

  if (value)
    *value = NULL;

  for (;;) {
    /* A value is expected. */
    skip_ws(&s);
    if (depth + 1 > JSON_PARSER_MAX_DEPTH || s.p >= s.end)
      goto out;
    switch (*s.p) {
    case '[':
    case '{':
      if (depth == cap) {
        char *bigger = malloc(cap * 2);
        if (!bigger)
          goto out;
        memcpy(bigger, stack, cap);
        if (stack != small)
          free(stack);
        stack = bigger;
        cap *= 2;
      }
      stack[depth++] = (char)*s.p++;
      skip_ws(&s);
      if (s.p < s.end && *s.p == (stack[depth - 1] == '[' ? ']' : '}')) {
        s.p++;
        depth--;
        break; /* an empty container is a complete value */
      }
      if (stack[depth - 1] == '{' && key(&s, &k))
        goto out;
      continue; /* the first element */
    case '"':
      s.p++;
      /* The top-level object's first `member` (its key compared as
       * written, escapes and all) whose value is a string. */
      if (member && value && !*value && depth == 1 && stack[0] == '{' &&
          k + mlen + 1 <= s.p && !memcmp(k, member, mlen) && k[mlen] == '"') {
        const unsigned char *v = s.p;
        if (string(&s))
          goto out;
        *value = (const char *)v;
        *value_len = (size_t)(s.p - 1 - v);
        if (stop) {
          ok = 0;
          goto out;
        }
        break;
      }
      if (string(&s))
        goto out;
      break;
    case 't':
      if (literal(&s, "true"))
        goto out;
      break;
    case 'f':
      if (literal(&s, "false"))
        goto out;
      break;
    case 'n':
      if (literal(&s, "null"))
        goto out;
      break;
    default:
      if (number(&s))
        goto out;
      break;
    }
    /* A value is complete: close containers, or go on to the next
     * element. */
    for (;;) {
      skip_ws(&s);
      if (depth == 0) {
        ok = s.p == s.end ? 1 : -1;
        goto out;
      }
      if (s.p >= s.end)
        goto out;
      if (*s.p == (stack[depth - 1] == '[' ? ']' : '}')) {
        s.p++;
        depth--;
        continue;
      }
      if (*s.p++ != ',' || (stack[depth - 1] == '{' && key(&s, &k)))
        goto out;
      break; /* the next element */
    }
  }
out:
  if (stack != small)
    free(stack);
  return ok;
}

/* Appends code point `cp` as UTF-8. */
static char *put_utf8(char *o, unsigned cp) {
  if (cp < 0x80) {
    *o++ = (char)cp;
  } else if (cp < 0x800) {
    *o++ = (char)(0xC0 | cp >> 6);
    *o++ = (char)(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    *o++ = (char)(0xE0 | cp >> 12);
    *o++ = (char)(0x80 | (cp >> 6 & 0x3F));
    *o++ = (char)(0x80 | (cp & 0x3F));
  } else {
    *o++ = (char)(0xF0 | cp >> 18);
    *o++ = (char)(0x80 | (cp >> 12 & 0x3F));
    *o++ = (char)(0x80 | (cp >> 6 & 0x3F));
    *o++ = (char)(0x80 | (cp & 0x3F));
  }
  return o;
}

size_t pr__json_unescape(const char *raw, size_t n, char *out) {
  const unsigned char *p = (const unsigned char *)raw, *end = p + n;
  char *o = out;
  while (p < end) {
    unsigned c = *p++, cp = 0, lo = 0;
    if (c != '\\') {
      *o++ = (char)c;
      continue;
    }
    switch (c = *p++) {
    case 'b':
      *o++ = '\b';
      break;
    case 'f':
      *o++ = '\f';
      break;
    case 'n':
      *o++ = '\n';
      break;
    case 'r':
      *o++ = '\r';
      break;
    case 't':
      *o++ = '\t';
      break;
    case 'u':
      hex4(p, &cp);
      p += 4;
      if (cp >= 0xD800 && cp <= 0xDBFF) { /* paired: the scan checked */
        hex4(p + 2, &lo);
        p += 6;
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
      }
      o = put_utf8(o, cp);
      break;
    default: /* " \ / */
      *o++ = (char)c;
      break;
    }
  }
  return (size_t)(o - out);
}
