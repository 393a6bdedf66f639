/*
 * config.c - configuration: the option table, parsing of each value type,
 * resolution (set in code > environment > default), cross-option checks, and
 * the public prosody_config_* / prosody_option_* functions.
 *
 * Every message a user can see names the option, its environment variable,
 * the offending value and the accepted form.
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "../util/util.h"
#include "config.h"

const pr__opt_def_t pr__opt_defs[PR_OPT__COUNT] = {
#define PR_OPT(id, name, env, type, def, min, max, flags, section, values,     \
               default_doc, help)                                              \
  {name, env, type, def, min, max, flags, section, values, default_doc, help},
#include "options.def"
#undef PR_OPT
};

#define PR_OPT(...)
#define PR_ALIAS(id, name, env) [PR_OPT_##id] = name,
const char *const pr__opt_alias[PR_OPT__COUNT] = {
#include "options.def"
};
#undef PR_ALIAS
#define PR_ALIAS(id, name, env) [PR_OPT_##id] = env,
const char *const pr__opt_alias_env[PR_OPT__COUNT] = {
#include "options.def"
};
#undef PR_ALIAS
#undef PR_OPT

/* ------------------------------------------------------------------------ */
/* Accepted forms and public option info (built once, static afterwards)     */
/* ------------------------------------------------------------------------ */

static int is_string_type(pr__opt_type_t t);
static char *accepted_text[PR_OPT__COUNT];
static char *default_text[PR_OPT__COUNT];
static prosody_option_info_t option_info[PR_OPT__COUNT];
static pthread_once_t info_once = PTHREAD_ONCE_INIT;

static const char *type_name(pr__opt_type_t t) {
  switch (t) {
  case PR_T_STRING:
    return "string";
  case PR_T_TOPIC:
    return "topic";
  case PR_T_TOPICS:
    return "topic list";
  case PR_T_LIST:
    return "list";
  case PR_T_HOSTPORTS:
    return "host:port list";
  case PR_T_IDENT:
    return "identifier";
  case PR_T_URL:
    return "URL";
  case PR_T_BOOL:
    return "boolean";
  case PR_T_INT:
    return "integer";
  case PR_T_FLOAT:
    return "number";
  case PR_T_DURATION:
    return "duration";
  case PR_T_ENUM:
    return "enum";
  case PR_T_PROPS:
    return "property list";
  case PR_T_SIZE:
    return "size";
  }
  return "?";
}

static int64_t seconds_to_ns(double s) { return (int64_t)llround(s * 1e9); }

/* A size as text: in the largest binary unit that divides it. */
static void size_format(int64_t v, char *buf, size_t n) {
  static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (u < 4 && v != 0 && v % 1024 == 0) {
    v /= 1024;
    u++;
  }
  snprintf(buf, n, "%lld %s", (long long)v, units[u]);
}

/* Parses a size: a number (decimals allowed with a unit), then an optional
 * unit, case-insensitive: B, KB MB GB TB (powers of 1000), KiB MiB GiB TiB
 * (powers of 1024). 0, or -1 with the reason in why. */
static int size_parse(const char *s, int64_t *out, char *why, size_t n) {
  static const struct {
    const char *name;
    double factor;
  } units[] = {{"", 1},
               {"b", 1},
               {"kb", 1e3},
               {"mb", 1e6},
               {"gb", 1e9},
               {"tb", 1e12},
               {"kib", 1024.0},
               {"mib", 1048576.0},
               {"gib", 1073741824.0},
               {"tib", 1099511627776.0}};
  char *end;
  double v;
  if (!isdigit((unsigned char)*s)) {
    snprintf(why, n, "not a size");
    return -1;
  }
  errno = 0;
  v = strtod(s, &end);
  if (errno || !isfinite(v)) {
    snprintf(why, n, "not a size");
    return -1;
  }
  while (*end == ' ')
    end++;
  for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++)
    if (!strcasecmp(end, units[i].name)) {
      double bytes = v * units[i].factor;
      if (bytes != floor(bytes)) {
        snprintf(why, n, "not a whole number of bytes");
        return -1;
      }
      if (bytes > 9.2e18) {
        snprintf(why, n, "out of range");
        return -1;
      }
      *out = (int64_t)bytes;
      return 0;
    }
  snprintf(why, n, "unknown unit \"%.16s\"", end);
  return -1;
}

static void fmt_number(double v, char *buf, size_t n) {
  if (v == floor(v) && fabs(v) < 1e15)
    snprintf(buf, n, "%.0f", v);
  else
    snprintf(buf, n, "%g", v);
}

static void build_accepted(pr__opt_id_t id, char *buf, size_t n) {
  const pr__opt_def_t *d = &pr__opt_defs[id];
  char lo[64], hi[64];
  size_t off = 0;

  switch (d->type) {
  case PR_T_STRING:
    off = (size_t)snprintf(buf, n, "a non-empty string");
    break;
  case PR_T_TOPIC:
    off = (size_t)snprintf(buf, n,
                           "a topic name (1-249 characters from a-z A-Z 0-9 "
                           ". _ -)");
    break;
  case PR_T_TOPICS:
    off = (size_t)snprintf(buf, n,
                           "a comma-separated list of topic names (1-249 "
                           "characters from a-z A-Z 0-9 . _ - each)");
    break;
  case PR_T_LIST:
    off = (size_t)snprintf(buf, n, "a comma-separated list");
    break;
  case PR_T_PROPS:
    off = (size_t)snprintf(buf, n,
                           "a comma-separated list of librdkafka name=value "
                           "properties");
    break;
  case PR_T_HOSTPORTS:
    off = (size_t)snprintf(
        buf, n, "a comma-separated list of host:port (port 1-65535)");
    break;
  case PR_T_IDENT:
    off = (size_t)snprintf(buf, n,
                           "an identifier of 1-48 characters: a letter, then "
                           "letters, digits or _");
    break;
  case PR_T_URL:
    off = (size_t)snprintf(buf, n, "an http:// or https:// URL");
    break;
  case PR_T_BOOL:
    off = (size_t)snprintf(buf, n, "true or false");
    break;
  case PR_T_INT:
    fmt_number(d->min, lo, sizeof(lo));
    fmt_number(d->max, hi, sizeof(hi));
    off = (size_t)snprintf(buf, n, "an integer from %s to %s", lo, hi);
    break;
  case PR_T_FLOAT:
    fmt_number(d->min, lo, sizeof(lo));
    fmt_number(d->max, hi, sizeof(hi));
    if (d->flags & (PR_F_OPEN_MIN | PR_F_OPEN_MAX))
      off = (size_t)snprintf(
          buf, n, "a number %s %s and %s %s",
          (d->flags & PR_F_OPEN_MIN) ? "greater than" : "at least", lo,
          (d->flags & PR_F_OPEN_MAX) ? "less than" : "at most", hi);
    else
      off = (size_t)snprintf(buf, n, "a number from %s to %s", lo, hi);
    break;
  case PR_T_SIZE:
    size_format((int64_t)d->min, lo, sizeof(lo));
    size_format((int64_t)d->max, hi, sizeof(hi));
    off = (size_t)snprintf(buf, n,
                           "a size from %s to %s, like \"64 MiB\", \"500 "
                           "MB\" or \"4096\" (bytes; units B KB MB GB TB "
                           "KiB MiB GiB TiB)",
                           lo, hi);
    break;
  case PR_T_DURATION:
    pr__duration_format(seconds_to_ns(d->min), lo, sizeof(lo));
    pr__duration_format(seconds_to_ns(d->max), hi, sizeof(hi));
    off =
        (size_t)snprintf(buf, n,
                         "a duration from %s to %s, like \"500ms\", \"5m\" or "
                         "\"2h 30m\" (units ns us ms s m h d w M y)",
                         lo, hi);
    break;
  case PR_T_ENUM: {
    const char *p = d->values;
    off = (size_t)snprintf(buf, n, "one of ");
    while (*p && off < n) {
      const char *bar = strchr(p, '|');
      size_t len = bar ? (size_t)(bar - p) : strlen(p);
      off += (size_t)snprintf(buf + off, n - off, "%s%.*s",
                              p == d->values ? "" : ", ", (int)len, p);
      p += len + (bar ? 1 : 0);
    }
    break;
  }
  }
  if ((d->flags & PR_F_OPTIONAL) && off < n)
    snprintf(buf + off, n - off, ", or none");
}

static void build_info(void) {
  for (int i = 0; i < PR_OPT__COUNT; i++) {
    const pr__opt_def_t *d = &pr__opt_defs[i];
    char buf[512];
    build_accepted((pr__opt_id_t)i, buf, sizeof(buf));
    accepted_text[i] = strdup(buf);
    if (d->def) {
      pr__value_t v;
      char err[256];
      /* Defaults are shown in canonical form (what `prosody config`
       * prints), so the docs and the listing agree. */
      if (pr__opt_parse((pr__opt_id_t)i, d->def, 0, &v, err, sizeof(err)) ==
          PROSODY_OK) {
        pr__opt_format((pr__opt_id_t)i, &v, buf, sizeof(buf));
        pr__value_fini((pr__opt_id_t)i, &v);
      } else {
        snprintf(buf, sizeof(buf), "%s", d->def);
      }
    } else {
      snprintf(buf, sizeof(buf), "%s", d->default_doc ? d->default_doc : "-");
    }
    default_text[i] = strdup(buf);
    option_info[i].name = d->name;
    option_info[i].env = d->env;
    option_info[i].type = type_name(d->type);
    option_info[i].default_value = default_text[i] ? default_text[i] : "-";
    option_info[i].accepted = accepted_text[i] ? accepted_text[i] : "";
    option_info[i].section = d->section;
    option_info[i].description = d->help;
    option_info[i].alias = pr__opt_alias[i];
    option_info[i].alias_env = pr__opt_alias_env[i];
  }
}

/* The option-info strings live as long as the process (still reachable
 * at exit, not leaked): prosody_option_info() may be called during
 * teardown, e.g. by a language binding. */

const char *pr__opt_accepted(pr__opt_id_t id) {
  pthread_once(&info_once, build_info);
  return accepted_text[id] ? accepted_text[id] : "";
}

PROSODY_EXPORT size_t prosody_option_count(void) { return PR_OPT__COUNT; }

PROSODY_EXPORT const prosody_option_info_t *prosody_option_info(size_t i) {
  if (i >= PR_OPT__COUNT)
    return NULL;
  pthread_once(&info_once, build_info);
  return &option_info[i];
}

/* ------------------------------------------------------------------------ */
/* Lookup                                                                    */
/* ------------------------------------------------------------------------ */

int pr__opt_lookup(const char *name) {
  if (!name)
    return -1;
  for (int i = 0; i < PR_OPT__COUNT; i++)
    if (!strcmp(pr__opt_defs[i].name, name) ||
        (pr__opt_alias[i] && !strcmp(pr__opt_alias[i], name)))
      return i;
  return -1;
}

/* Levenshtein distance, capped to keep it cheap; for "did you mean". */
static size_t edit_distance(const char *a, const char *b) {
  size_t la = strlen(a), lb = strlen(b), row[64], i, j;
  if (la >= 63 || lb >= 63)
    return 99;
  for (j = 0; j <= lb; j++)
    row[j] = j;
  for (i = 1; i <= la; i++) {
    size_t prev = row[0];
    row[0] = i;
    for (j = 1; j <= lb; j++) {
      size_t cur = row[j];
      size_t sub = prev + (a[i - 1] != b[j - 1]);
      size_t best = row[j] + 1 < row[j - 1] + 1 ? row[j] + 1 : row[j - 1] + 1;
      row[j] = sub < best ? sub : best;
      prev = cur;
    }
  }
  return row[lb];
}

static void unknown_option(const char *name, char *errstr, size_t n) {
  int best = -1;
  size_t best_d = 4;
  for (int i = 0; i < PR_OPT__COUNT; i++) {
    size_t d = edit_distance(name, pr__opt_defs[i].name);
    if (d < best_d) {
      best_d = d;
      best = i;
    }
    if (!strcasecmp(name, pr__opt_defs[i].env)) {
      best = i;
      best_d = 0;
      break;
    }
  }
  if (best >= 0)
    pr__errf(errstr, n, "unknown option \"%s\" (did you mean \"%s\"?)", name,
             pr__opt_defs[best].name);
  else
    pr__errf(errstr, n,
             "unknown option \"%s\" (see docs/CONFIGURATION.md or `prosody "
             "config` for the list)",
             name);
}

/* ------------------------------------------------------------------------ */
/* Parsing                                                                   */
/* ------------------------------------------------------------------------ */

static int is_string_type(pr__opt_type_t t) {
  return t == PR_T_STRING || t == PR_T_TOPIC || t == PR_T_IDENT ||
         t == PR_T_URL;
}

void pr__value_fini(pr__opt_id_t id, pr__value_t *v) {
  if (!v)
    return;
  if (is_string_type(pr__opt_defs[id].type) && v->isset)
    free(v->u.s);
  for (size_t i = 0; i < v->list_n; i++)
    free(v->list[i]);
  free(v->list);
  memset(v, 0, sizeof(*v));
}

int pr__topic_name_check(const char *name, char *why, size_t why_size) {
  size_t len = strlen(name);
  if (len == 0) {
    pr__errf(why, why_size, "topic name is empty");
    return -1;
  }
  if (len > 249) {
    pr__errf(why, why_size, "topic name is %zu characters long (at most 249)",
             len);
    return -1;
  }
  if (!strcmp(name, ".") || !strcmp(name, "..")) {
    pr__errf(why, why_size, "\"%s\" is not a valid topic name", name);
    return -1;
  }
  for (size_t i = 0; i < len; i++) {
    unsigned char c = (unsigned char)name[i];
    if (!(isalnum(c) || c == '.' || c == '_' || c == '-')) {
      pr__errf(why, why_size,
               "topic name \"%s\" contains '%c' (allowed: a-z A-Z 0-9 . _ -)",
               name, isprint(c) ? c : '?');
      return -1;
    }
  }
  return 0;
}

static int hostport_check(const char *s, char *why, size_t n) {
  const char *colon;
  char *end;
  long port;

  if (s[0] == '[') {
    const char *close = strchr(s, ']');
    if (!close || close == s + 1 || close[1] != ':') {
      pr__errf(why, n, "\"%s\" is not [ipv6]:port", s);
      return -1;
    }
    colon = close + 1;
  } else {
    colon = strrchr(s, ':');
    if (!colon || colon == s) {
      pr__errf(why, n, "\"%s\" has no %s", s, colon ? "host" : ":port");
      return -1;
    }
    for (const char *p = s; p < colon; p++) {
      if (isspace((unsigned char)*p) || *p == ':') {
        pr__errf(why, n, "\"%s\" is not host:port", s);
        return -1;
      }
    }
  }
  errno = 0;
  port = strtol(colon + 1, &end, 10);
  if (!isdigit((unsigned char)colon[1]) || *end || errno || port < 1 ||
      port > 65535) {
    pr__errf(why, n, "\"%s\" has an invalid port (1-65535)", s);
    return -1;
  }
  return 0;
}

static int ident_check(const char *s, char *why, size_t n) {
  size_t len = strlen(s);
  if (len == 0 || len > 48 || !isalpha((unsigned char)s[0])) {
    pr__errf(why, n, "\"%s\" must start with a letter and be 1-48 long", s);
    return -1;
  }
  for (size_t i = 0; i < len; i++) {
    if (!(isalnum((unsigned char)s[i]) || s[i] == '_')) {
      pr__errf(why, n, "\"%s\" contains '%c'", s, s[i]);
      return -1;
    }
  }
  return 0;
}

static int url_check(const char *s, char *why, size_t n) {
  const char *rest = NULL;
  if (!strncasecmp(s, "http://", 7))
    rest = s + 7;
  else if (!strncasecmp(s, "https://", 8))
    rest = s + 8;
  if (!rest || !*rest || *rest == '/') {
    pr__errf(why, n, "\"%s\" is not an http:// or https:// URL with a host", s);
    return -1;
  }
  for (const char *p = s; *p; p++) {
    if (isspace((unsigned char)*p)) {
      pr__errf(why, n, "URL contains whitespace");
      return -1;
    }
  }
  return 0;
}

/* Copies `text` without leading/trailing whitespace into a new string. */
static char *trimmed_dup(const char *text, size_t len) {
  while (len && isspace((unsigned char)*text)) {
    text++;
    len--;
  }
  while (len && isspace((unsigned char)text[len - 1]))
    len--;
  char *s = malloc(len + 1);
  if (s) {
    memcpy(s, text, len);
    s[len] = '\0';
  }
  return s;
}

/* Appends `item` (owned) to a list value; -1 (item freed) when out of
 * memory. */
static int list_push(pr__value_t *out, char *item) {
  char **grown = realloc(out->list, (out->list_n + 1) * sizeof(char *));
  if (!grown) {
    free(item);
    return -1;
  }
  out->list = grown;
  out->list[out->list_n++] = item;
  return 0;
}

static int parse_list(pr__opt_id_t id, const char *text, pr__value_t *out,
                      char *why, size_t n) {
  const pr__opt_def_t *d = &pr__opt_defs[id];
  const char *p = text;

  for (;;) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    char *item = trimmed_dup(p, len);
    if (!item)
      goto nomem;
    if (*item == '\0') {
      free(item); /* empty entries (e.g. a trailing comma) are ignored */
    } else {
      if ((d->type == PR_T_TOPICS && pr__topic_name_check(item, why, n)) ||
          (d->type == PR_T_HOSTPORTS && hostport_check(item, why, n))) {
        free(item);
        return -1;
      }
      if (list_push(out, item))
        goto nomem;
    }
    if (!comma)
      break;
    p = comma + 1;
  }
  /* Servers and topics must name at least one; an empty allowed_events
   * list means "all" and stays allowed. */
  if (out->list_n == 0 &&
      (d->type == PR_T_HOSTPORTS || d->type == PR_T_TOPICS)) {
    pr__errf(why, n, "the list is empty");
    return -1;
  }
  out->isset = 1;
  return 0;
nomem:
  pr__errf(why, n, "out of memory");
  return -1;
}

/* The librdkafka properties kafka_properties refuses, and why: prosody
 * sets them itself on some handle (a value given here would be overridden
 * there, or break the engine), or an option of ours carries them. */
static const struct {
  const char *name;
  const char *why;
} owned_props[] = {
    {"bootstrap.servers", "an option of its own: bootstrap_servers"},
    {"metadata.broker.list", "an option of its own: bootstrap_servers"},
    {"group.id", "an option of its own: group_id"},
    {"enable.auto.commit", "set by prosody: offsets are stored as events "
                           "finish and committed every commit_interval"},
    {"auto.commit.interval.ms", "an option of its own: commit_interval"},
    {"enable.auto.offset.store", "set by prosody: offsets are stored as "
                                 "events finish"},
    {"auto.offset.reset", "set by prosody (earliest)"},
    {"enable.partition.eof", "set by prosody"},
    {"partition.assignment.strategy",
     "an option of its own: partition_assignment_strategy"},
    {"group.protocol", "an option of its own: group_protocol"},
    {"isolation.level", "set by prosody (read_committed, librdkafka's "
                        "default: aborted transactions are never handled)"},
    {"enable.idempotence", "set by prosody (on for the producer, off for "
                           "telemetry)"},
    {"acks", "set by prosody (all for the producer, 1 for telemetry)"},
    {"request.required.acks", "set by prosody (all for the producer, 1 for "
                              "telemetry)"},
    {"message.timeout.ms", "an option of its own: send_timeout"},
    {"delivery.timeout.ms", "an option of its own: send_timeout"},
    {"linger.ms", "set by prosody per producer"},
    {"queue.buffering.max.ms", "set by prosody per producer"},
    {"compression.type", "set by prosody (lz4)"},
    {"compression.codec", "set by prosody (lz4)"},
    {"queue.buffering.max.messages", "set by prosody for telemetry"},
    {"delivery.report.only.error", "set by prosody for telemetry"},
    {"queued.max.messages.kbytes", "set by prosody for the defer loader"},
    {"enable.sparse.connections", "set by prosody for the admin client"},
    {"security.protocol", "an option of its own: kafka_security_protocol"},
    {"sasl.mechanism", "an option of its own: kafka_sasl_mechanism"},
    {"sasl.mechanisms", "an option of its own: kafka_sasl_mechanism"},
    {"sasl.username", "an option of its own: kafka_sasl_username"},
    {"sasl.password", "an option of its own: kafka_sasl_password (secret)"},
    {"sasl.oauthbearer.method", "set by prosody (oidc with OAUTHBEARER)"},
    {"sasl.oauthbearer.token.endpoint.url",
     "an option of its own: kafka_sasl_oauthbearer_token_endpoint_url"},
    {"sasl.oauthbearer.client.id",
     "an option of its own: kafka_sasl_oauthbearer_client_id"},
    {"sasl.oauthbearer.client.secret",
     "an option of its own: kafka_sasl_oauthbearer_client_secret (secret)"},
    {"sasl.oauthbearer.scope",
     "an option of its own: kafka_sasl_oauthbearer_scope"},
    {"ssl.ca.location", "an option of its own: kafka_ssl_ca_location"},
    {"ssl.certificate.location",
     "an option of its own: kafka_ssl_certificate_location"},
    {"ssl.key.location", "an option of its own: kafka_ssl_key_location"},
    {"ssl.key.password",
     "an option of its own: kafka_ssl_key_password (secret)"},
    {"ssl.endpoint.identification.algorithm",
     "an option of its own: kafka_ssl_endpoint_identification"},
    {"opaque", "set by prosody"},
    {"default_topic_conf", "set by prosody"},
};

int pr__kafka_prop_secret(const char *name) {
  return strstr(name, "password") || strstr(name, "secret") ||
         strstr(name, "key.pem") || strstr(name, "jaas") ||
         !strcmp(name, "sasl.oauthbearer.config") || strstr(name, "keystore");
}

int pr__kafka_props_has(const pr__value_t *props, const char *name) {
  size_t len = strlen(name);
  for (size_t i = 0; i < props->list_n; i++)
    if (!strncmp(props->list[i], name, len) && props->list[i][len] == '=')
      return 1;
  return 0;
}

/* Why kafka_properties refuses property `name`, or NULL. */
static const char *prop_refused(const char *name) {
  size_t len = strlen(name);
  for (size_t i = 0; i < sizeof(owned_props) / sizeof(owned_props[0]); i++)
    if (!strcmp(owned_props[i].name, name))
      return owned_props[i].why;
  if (len > 3 && !strcmp(name + len - 3, "_cb"))
    return "a callback, set by prosody";
  return NULL;
}

/* kafka_properties: "name=value" items; an item without '=' belongs to the
 * previous value (a value may hold commas: ssl.cipher.suites=A,B). */
static int parse_props(const char *text, pr__value_t *out, char *why,
                       size_t n) {
  const char *p = text;
  for (;;) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    char *item = trimmed_dup(p, len), *eq;
    if (!item)
      goto nomem;
    eq = strchr(item, '=');
    if (*item == '\0') {
      free(item); /* empty entries (e.g. a trailing comma) are ignored */
    } else if (!eq && out->list_n == 0) {
      pr__errf(why, n, "the first item is not name=value");
      free(item);
      return -1;
    } else if (!eq) { /* continues the previous value */
      char **last = &out->list[out->list_n - 1];
      char *joined = malloc(strlen(*last) + strlen(item) + 2);
      if (!joined) {
        free(item);
        goto nomem;
      }
      sprintf(joined, "%s,%s", *last, item);
      free(*last);
      free(item);
      *last = joined;
    } else {
      const char *refused;
      char *name_end = eq;
      while (name_end > item && isspace((unsigned char)name_end[-1]))
        name_end--;
      *name_end = '\0';
      if (*item == '\0' ||
          strspn(item, "abcdefghijklmnopqrstuvwxyz0123456789._") !=
              strlen(item)) {
        pr__errf(why, n,
                 "\"%.60s\" is no librdkafka property name (lower-case "
                 "letters, digits, . and _)",
                 item);
        free(item);
        return -1;
      }
      if ((refused = prop_refused(item))) {
        pr__errf(why, n, "property %s is refused: %s", item, refused);
        free(item);
        return -1;
      }
      if (pr__kafka_props_has(out, item)) {
        pr__errf(why, n, "property %s is given twice", item);
        free(item);
        return -1;
      }
      /* "name=value" again, without blanks around the '='. */
      eq++;
      while (isspace((unsigned char)*eq))
        eq++;
      memmove(item + strlen(item) + 1, eq, strlen(eq) + 1);
      item[strlen(item)] = '=';
      if (list_push(out, item))
        goto nomem;
    }
    if (!comma)
      break;
    p = comma + 1;
  }
  out->isset = 1;
  return 0;
nomem:
  pr__errf(why, n, "out of memory");
  return -1;
}

static int parse_enum(const pr__opt_def_t *d, const char *s, int *index) {
  const char *p = d->values;
  int i = 0;
  while (*p) {
    const char *bar = strchr(p, '|');
    size_t len = bar ? (size_t)(bar - p) : strlen(p);
    if (strlen(s) == len && !strncasecmp(s, p, len)) {
      *index = i;
      return 0;
    }
    i++;
    p += len + (bar ? 1 : 0);
  }
  return -1;
}

/* Copies the i-th enum value into buf. */
static void enum_name(const pr__opt_def_t *d, int index, char *buf, size_t n) {
  const char *p = d->values;
  for (int i = 0; *p; i++) {
    const char *bar = strchr(p, '|');
    size_t len = bar ? (size_t)(bar - p) : strlen(p);
    if (i == index) {
      snprintf(buf, n, "%.*s", (int)len, p);
      return;
    }
    p += len + (bar ? 1 : 0);
  }
  snprintf(buf, n, "?");
}

static int in_float_bounds(const pr__opt_def_t *d, double f) {
  if ((d->flags & PR_F_OPEN_MIN) ? !(f > d->min) : !(f >= d->min))
    return 0;
  if ((d->flags & PR_F_OPEN_MAX) ? !(f < d->max) : !(f <= d->max))
    return 0;
  return 1;
}

prosody_err_t pr__opt_parse(pr__opt_id_t id, const char *text, int from_env,
                            pr__value_t *out, char *errstr,
                            size_t errstr_size) {
  const pr__opt_def_t *d = &pr__opt_defs[id];
  char why[256] = "";
  char *s = NULL;
  int rc = -1;

  memset(out, 0, sizeof(*out));
  if (!text)
    text = "";
  s = trimmed_dup(text, strlen(text));
  if (!s) {
    pr__errf(errstr, errstr_size, "out of memory parsing %s", d->name);
    return PROSODY_ERR_NOMEM;
  }
  if (!pr__utf8_valid(s, strlen(s))) {
    snprintf(why, sizeof(why), "not valid UTF-8");
    goto bad;
  }
  if ((d->flags & PR_F_OPTIONAL) && !strcasecmp(s, "none")) {
    free(s);
    return PROSODY_OK; /* isset stays 0 */
  }

  switch (d->type) {
  case PR_T_STRING:
  case PR_T_TOPIC:
  case PR_T_IDENT:
  case PR_T_URL:
    if (*s == '\0') {
      snprintf(why, sizeof(why), "empty");
      goto bad;
    }
    if ((d->type == PR_T_TOPIC && pr__topic_name_check(s, why, sizeof(why))) ||
        (d->type == PR_T_IDENT && ident_check(s, why, sizeof(why))) ||
        (d->type == PR_T_URL && url_check(s, why, sizeof(why))))
      goto bad;
    out->u.s = s;
    out->isset = 1;
    return PROSODY_OK;
  case PR_T_TOPICS:
  case PR_T_LIST:
  case PR_T_HOSTPORTS:
    rc = parse_list(id, s, out, why, sizeof(why));
    break;
  case PR_T_PROPS:
    rc = parse_props(s, out, why, sizeof(why));
    break;
  case PR_T_BOOL:
    if (!strcasecmp(s, "true"))
      out->u.b = 1;
    else if (!strcasecmp(s, "false"))
      out->u.b = 0;
    else
      goto bad;
    rc = 0;
    break;
  case PR_T_INT: {
    char *end;
    long long v;
    errno = 0;
    v = strtoll(s, &end, 10);
    if (*s == '\0' || *end || (errno && errno != ERANGE)) {
      snprintf(why, sizeof(why), "not an integer");
      goto bad;
    }
    /* Too many digits for long long (ERANGE) is out of range too. */
    if (errno == ERANGE || (double)v < d->min || (double)v > d->max) {
      snprintf(why, sizeof(why), "out of range");
      goto bad;
    }
    out->u.i = v;
    rc = 0;
    break;
  }
  case PR_T_FLOAT: {
    char *end;
    double v;
    errno = 0;
    v = strtod(s, &end);
    if (*s == '\0' || *end || errno || !isfinite(v)) {
      snprintf(why, sizeof(why), "not a number");
      goto bad;
    }
    if (!in_float_bounds(d, v)) {
      snprintf(why, sizeof(why), "out of range");
      goto bad;
    }
    out->u.f = v;
    rc = 0;
    break;
  }
  case PR_T_SIZE: {
    int64_t bytes;
    if (size_parse(s, &bytes, why, sizeof(why)))
      goto bad;
    if ((double)bytes < d->min || (double)bytes > d->max) {
      snprintf(why, sizeof(why), "out of range");
      goto bad;
    }
    out->u.i = bytes;
    rc = 0;
    break;
  }
  case PR_T_DURATION: {
    int64_t ns;
    if (pr__duration_parse(s, &ns, why, sizeof(why)))
      goto bad;
    if (ns < seconds_to_ns(d->min) || ns > seconds_to_ns(d->max)) {
      snprintf(why, sizeof(why), "out of range");
      goto bad;
    }
    out->u.ns = ns;
    rc = 0;
    break;
  }
  case PR_T_ENUM:
    if (parse_enum(d, s, &out->u.e))
      goto bad;
    rc = 0;
    break;
  }
  if (rc != 0)
    goto bad;
  out->isset = 1;
  free(s);
  return PROSODY_OK;

bad:
  /* kafka_properties may hold secrets: its message names the item. */
  pr__errf(errstr, errstr_size,
           "invalid value \"%.80s\" for option %s (%s%s)%s%s; expected %s",
           (d->flags & PR_F_SECRET) || d->type == PR_T_PROPS ? "****" : s,
           d->name, from_env ? "environment variable " : "",
           from_env == 2 ? pr__opt_alias_env[id] : d->env, *why ? ": " : "",
           why, pr__opt_accepted(id));
  pr__value_fini(id, out);
  free(s);
  return PROSODY_ERR_CONFIG;
}

void pr__opt_format(pr__opt_id_t id, const pr__value_t *v, char *buf,
                    size_t n) {
  const pr__opt_def_t *d = &pr__opt_defs[id];
  size_t off = 0;

  if (n == 0)
    return;
  buf[0] = '\0';
  if (!v->isset) {
    snprintf(buf, n, "none");
    return;
  }
  if (d->flags & PR_F_SECRET) {
    snprintf(buf, n, "****");
    return;
  }
  switch (d->type) {
  case PR_T_STRING:
  case PR_T_TOPIC:
  case PR_T_IDENT:
  case PR_T_URL:
    snprintf(buf, n, "%s", v->u.s);
    break;
  case PR_T_PROPS:
    for (size_t i = 0; i < v->list_n && off < n; i++) {
      const char *eq = strchr(v->list[i], '=');
      char name[128];
      snprintf(name, sizeof(name), "%.*s", (int)(eq - v->list[i]), v->list[i]);
      off += (size_t)snprintf(buf + off, n - off, "%s%s=%s", i ? "," : "", name,
                              pr__kafka_prop_secret(name) ? "****" : eq + 1);
    }
    break;
  case PR_T_TOPICS:
  case PR_T_LIST:
  case PR_T_HOSTPORTS:
    for (size_t i = 0; i < v->list_n && off < n; i++)
      off += (size_t)snprintf(buf + off, n - off, "%s%s", i ? "," : "",
                              v->list[i]);
    /* A lone item "none" would read back as unset: "none," keeps it a
     * list (found by tests/fuzz/fuzz_options.c). */
    if (v->list_n == 1 && (d->flags & PR_F_OPTIONAL) &&
        !strcasecmp(v->list[0], "none") && off + 1 < n)
      snprintf(buf + off, n - off, ",");
    break;
  case PR_T_BOOL:
    snprintf(buf, n, "%s", v->u.b ? "true" : "false");
    break;
  case PR_T_INT:
    snprintf(buf, n, "%lld", (long long)v->u.i);
    break;
  case PR_T_FLOAT:
    snprintf(buf, n, "%g", v->u.f);
    break;
  case PR_T_DURATION:
    pr__duration_format(v->u.ns, buf, n);
    break;
  case PR_T_SIZE:
    size_format(v->u.i, buf, n);
    break;
  case PR_T_ENUM:
    enum_name(d, v->u.e, buf, n);
    break;
  }
}

/* ------------------------------------------------------------------------ */
/* Resolution                                                                */
/* ------------------------------------------------------------------------ */

prosody_err_t pr__opt_resolve(const prosody_config_t *conf, pr__opt_id_t id,
                              pr__value_t *out, prosody_config_source_t *source,
                              char **env_ignored, char *errstr,
                              size_t errstr_size) {
  const pr__opt_def_t *d = &pr__opt_defs[id];
  const char *env;
  char why[512];
  prosody_err_t err;

  if (env_ignored)
    *env_ignored = NULL;
  if (conf && conf->set[id]) {
    if (source)
      *source = PROSODY_CONFIG_SOURCE_SET;
    return pr__opt_parse(id, conf->set[id], 0, out, errstr, errstr_size);
  }
  int from_env = 1; /* 2: from the old name's variable */
  env = getenv(d->env);
  if (pr__opt_alias_env[id]) {
    const char *old = getenv(pr__opt_alias_env[id]);
    if (old && *old && env && *env) {
      pr__errf(errstr, errstr_size,
               "%s and %s (the old name of %s) are both set; set only %s",
               d->env, pr__opt_alias_env[id], d->env, d->env);
      return PROSODY_ERR_CONFIG;
    }
    if (old && *old) {
      env = old;
      from_env = 2;
    }
  }
  if (env && *env) {
    if (source)
      *source = PROSODY_CONFIG_SOURCE_ENV;
    if (!(d->flags & PR_F_ENV_LENIENT))
      return pr__opt_parse(id, env, from_env, out, errstr, errstr_size);
    err = pr__opt_parse(id, env, from_env, out, why, sizeof(why));
    if (err != PROSODY_ERR_CONFIG) {
      if (err)
        pr__errf(errstr, errstr_size, "%s", why);
      return err;
    }
    /* Ignored: the default applies, and the caller may keep the reason. */
    if (env_ignored) {
      size_t n = strlen(why) + 64 + (d->def ? strlen(d->def) : 4);
      if (!(*env_ignored = malloc(n))) {
        pr__errf(errstr, errstr_size, "out of memory");
        return PROSODY_ERR_NOMEM;
      }
      snprintf(*env_ignored, n, "%s; using the default, %s", why,
               d->def ? d->def : "none");
    }
  }
  if (source)
    *source = PROSODY_CONFIG_SOURCE_DEFAULT;
  if (!d->def) {
    memset(out, 0, sizeof(*out));
    return PROSODY_OK;
  }
  return pr__opt_parse(id, d->def, 0, out, errstr, errstr_size);
}

/* ---- keyed-state collections ------------------------------------------ */

static void defs_fini(pr__state_defs_t *s) {
  for (size_t i = 0; i < s->n; i++)
    free((char *)s->d[i].name);
  free(s->d);
  s->d = NULL;
  s->n = 0;
}

static int defs_copy(pr__state_defs_t *to, const pr__state_defs_t *from) {
  to->n = 0;
  if (!from->n) {
    to->d = NULL;
    return 0;
  }
  if (!(to->d = calloc(from->n, sizeof(*to->d))))
    return -1;
  for (size_t i = 0; i < from->n; i++) {
    to->d[i] = from->d[i];
    if (!(to->d[i].name = strdup(from->d[i].name)))
      return -1;
    to->n++;
  }
  return 0;
}

#define STATE_MAX_TTL_S INT64_C(630720000)
#define STATE_MAX_CAPACITY INT64_C(4294967295) /* the original's (u32) */

PROSODY_EXPORT prosody_err_t
prosody_config_add_state(prosody_config_t *conf, const prosody_state_def_t *def,
                         char *errstr, size_t errstr_size) {
  prosody_state_def_t *d;
  if (!conf || !def) {
    pr__errf(errstr, errstr_size, "%s is NULL", conf ? "def" : "conf");
    return PROSODY_ERR_INVALID_ARG;
  }
  if (!def->name || !def->name[0]) {
    pr__errf(errstr, errstr_size, "name: must be a non-empty string");
    return PROSODY_ERR_CONFIG;
  }
  if (strlen(def->name) > 256) {
    pr__errf(errstr, errstr_size, "name: at most 256 bytes, got %zu",
             strlen(def->name));
    return PROSODY_ERR_CONFIG;
  }
  if (def->kind < PROSODY_STATE_VALUE || def->kind > PROSODY_STATE_DEQUE) {
    pr__errf(errstr, errstr_size,
             "kind: expected \"value\", \"map\", or \"deque\", got %d",
             def->kind);
    return PROSODY_ERR_CONFIG;
  }
  if (def->payload != PROSODY_STATE_JSON &&
      def->payload != PROSODY_STATE_MESSAGE) {
    pr__errf(errstr, errstr_size,
             "payload: expected \"json\" or \"message\", got %d", def->payload);
    return PROSODY_ERR_CONFIG;
  }
  if (def->ttl_s < 0 || def->ttl_s > STATE_MAX_TTL_S) {
    pr__errf(errstr, errstr_size,
             "ttl: must be a whole number of seconds in 1..=%" PRId64
             " (0: no expiry), got %" PRId64,
             STATE_MAX_TTL_S, def->ttl_s);
    return PROSODY_ERR_CONFIG;
  }
  if (def->published && def->payload != PROSODY_STATE_JSON) {
    pr__errf(errstr, errstr_size,
             "published: only JSON collections can be published (\"%s\" "
             "holds messages)",
             def->name);
    return PROSODY_ERR_CONFIG;
  }
  if (def->keyset_limit != -1 && def->kind != PROSODY_STATE_MAP) {
    pr__errf(errstr, errstr_size,
             "keyset_limit: only valid for map collections");
    return PROSODY_ERR_CONFIG;
  }
  if (def->keyset_limit < -1 || def->keyset_limit > 4096) {
    pr__errf(errstr, errstr_size,
             "keyset_limit: must be a whole number in 0..=4096, got %" PRId64,
             def->keyset_limit);
    return PROSODY_ERR_CONFIG;
  }
  if (def->capacity != 0 && def->kind != PROSODY_STATE_DEQUE) {
    pr__errf(errstr, errstr_size, "capacity: only valid for deque collections");
    return PROSODY_ERR_CONFIG;
  }
  if (def->capacity < 0 || def->capacity > STATE_MAX_CAPACITY) {
    pr__errf(errstr, errstr_size,
             "capacity: must be a whole number in 1..=%" PRId64
             ", got %" PRId64,
             STATE_MAX_CAPACITY, def->capacity);
    return PROSODY_ERR_CONFIG;
  }
  for (size_t i = 0; i < conf->states.n; i++)
    if (!strcmp(conf->states.d[i].name, def->name)) {
      pr__errf(errstr, errstr_size,
               "name: collection \"%s\" is registered twice", def->name);
      return PROSODY_ERR_CONFIG;
    }
  d = realloc(conf->states.d, (conf->states.n + 1) * sizeof(*d));
  if (!d) {
    pr__errf(errstr, errstr_size, "out of memory");
    return PROSODY_ERR_NOMEM;
  }
  conf->states.d = d;
  d[conf->states.n] = *def;
  d[conf->states.n].read_uncommitted = def->read_uncommitted != 0;
  if (!(d[conf->states.n].name = strdup(def->name))) {
    pr__errf(errstr, errstr_size, "out of memory");
    return PROSODY_ERR_NOMEM;
  }
  conf->states.n++;
  return PROSODY_OK;
}

void pr__settings_fini(pr__settings_t *st) {
  if (!st)
    return;
  for (int i = 0; i < PR_OPT__COUNT; i++) {
    pr__value_fini((pr__opt_id_t)i, &st->v[i]);
    free(st->env_ignored[i]);
    st->env_ignored[i] = NULL;
  }
  defs_fini(&st->states);
}

void pr__settings_warn_ignored(const pr__settings_t *st) {
  for (int i = 0; i < PR_OPT__COUNT; i++)
    if (st->env_ignored[i])
      PR_WARN("config", "%s", st->env_ignored[i]);
}

static void describe(const pr__settings_t *st, pr__opt_id_t id, char *buf,
                     size_t n) {
  pr__opt_format(id, &st->v[id], buf, n);
}

prosody_err_t pr__settings_resolve(const prosody_config_t *conf,
                                   pr__settings_t *st, char *errstr,
                                   size_t errstr_size) {
  prosody_err_t err;

  memset(st, 0, sizeof(*st));
  for (int i = 0; i < PR_OPT__COUNT; i++) {
    err = pr__opt_resolve(conf, (pr__opt_id_t)i, &st->v[i], &st->src[i],
                          &st->env_ignored[i], errstr, errstr_size);
    if (err) {
      pr__settings_fini(st);
      return err;
    }
  }
  st->test = conf->test;
  if (defs_copy(&st->states, &conf->states)) {
    pr__settings_fini(st);
    pr__errf(errstr, errstr_size, "out of memory");
    return PROSODY_ERR_NOMEM;
  }
  return PROSODY_OK;
}

void pr__config_set_test(prosody_config_t *conf, const pr__test_opts_t *opts) {
  conf->test = *opts;
}

/* ------------------------------------------------------------------------ */
/* Public API                                                                */
/* ------------------------------------------------------------------------ */

PROSODY_EXPORT prosody_config_t *prosody_config_new(void) {
  return calloc(1, sizeof(prosody_config_t));
}

PROSODY_EXPORT void prosody_config_set_log_cb(prosody_config_t *conf,
                                              prosody_log_cb cb, void *opaque) {
  if (!conf)
    return;
  conf->log_cb = cb;
  conf->log_opaque = opaque;
}

PROSODY_EXPORT void prosody_config_destroy(prosody_config_t *conf) {
  if (!conf)
    return;
  for (int i = 0; i < PR_OPT__COUNT; i++)
    free(conf->set[i]);
  defs_fini(&conf->states);
  free(conf);
}

PROSODY_EXPORT prosody_err_t prosody_config_set(prosody_config_t *conf,
                                                const char *name,
                                                const char *value, char *errstr,
                                                size_t errstr_size) {
  pr__value_t v;
  prosody_err_t err;
  char *copy = NULL;
  int id;

  if (!conf || !name) {
    pr__errf(errstr, errstr_size, "prosody_config_set: %s is NULL",
             conf ? "name" : "conf");
    return PROSODY_ERR_INVALID_ARG;
  }
  id = pr__opt_lookup(name);
  if (id < 0) {
    unknown_option(name, errstr, errstr_size);
    return PROSODY_ERR_CONFIG;
  }
  if (value) {
    err = pr__opt_parse((pr__opt_id_t)id, value, 0, &v, errstr, errstr_size);
    if (err)
      return err;
    pr__value_fini((pr__opt_id_t)id, &v);
    copy = strdup(value);
    if (!copy) {
      pr__errf(errstr, errstr_size, "out of memory");
      return PROSODY_ERR_NOMEM;
    }
  }
  {
    /* Both names of a renamed option: which one should win is anyone's
     * guess, so neither does. */
    int by_alias = pr__opt_alias[id] && !strcmp(name, pr__opt_alias[id]);
    if (copy && conf->set[id] && conf->by_alias[id] != by_alias) {
      free(copy);
      pr__errf(errstr, errstr_size,
               "%s and %s (the old name of %s) are both set; set only %s",
               pr__opt_defs[id].name, pr__opt_alias[id], pr__opt_defs[id].name,
               pr__opt_defs[id].name);
      return PROSODY_ERR_CONFIG;
    }
    conf->by_alias[id] = (unsigned char)by_alias;
  }
  free(conf->set[id]);
  conf->set[id] = copy;
  return PROSODY_OK;
}

PROSODY_EXPORT prosody_err_t prosody_config_get(
    const prosody_config_t *conf, const char *name, char *buf, size_t buf_size,
    prosody_config_source_t *source, char *errstr, size_t errstr_size) {
  pr__value_t v;
  prosody_err_t err;
  int id;

  if (!name || !buf || buf_size == 0) {
    pr__errf(errstr, errstr_size, "prosody_config_get: %s",
             !name ? "name is NULL" : "no output buffer");
    return PROSODY_ERR_INVALID_ARG;
  }
  id = pr__opt_lookup(name);
  if (id < 0) {
    unknown_option(name, errstr, errstr_size);
    return PROSODY_ERR_CONFIG;
  }
  err = pr__opt_resolve(conf, (pr__opt_id_t)id, &v, source, NULL, errstr,
                        errstr_size);
  if (err)
    return err;
  /* Format into a buffer that grows until the value fits, so that a short
   * `buf` is reported, never silently truncated. */
  {
    size_t room = 64, need;
    char *tmp = NULL;
    for (;;) {
      char *grown = realloc(tmp, room);
      if (!grown) {
        free(tmp);
        pr__value_fini((pr__opt_id_t)id, &v);
        pr__errf(errstr, errstr_size, "out of memory");
        return PROSODY_ERR_NOMEM;
      }
      tmp = grown;
      pr__opt_format((pr__opt_id_t)id, &v, tmp, room);
      if (strlen(tmp) + 1 < room)
        break; /* not truncated */
      room *= 2;
    }
    pr__value_fini((pr__opt_id_t)id, &v);
    need = strlen(tmp) + 1;
    if (need > buf_size) {
      buf[0] = '\0';
      free(tmp);
      pr__errf(errstr, errstr_size,
               "prosody_config_get: the value of %s needs %zu bytes, the "
               "buffer has %zu",
               name, need, buf_size);
      return PROSODY_ERR_INVALID_ARG;
    }
    memcpy(buf, tmp, need);
    free(tmp);
  }
  return PROSODY_OK;
}

PROSODY_EXPORT prosody_err_t prosody_config_validate(
    const prosody_config_t *conf, char *errstr, size_t errstr_size) {
  pr__settings_t st;
  prosody_err_t err = pr__settings_resolve(conf, &st, errstr, errstr_size);
  if (err)
    return err;
  err = pr__settings_check_client(&st, errstr, errstr_size);
  pr__settings_fini(&st);
  return err;
}

/* "option a (A) is x, which does not go with option b (B) being y; why". */
static prosody_err_t conflict(const pr__settings_t *st, pr__opt_id_t a,
                              pr__opt_id_t b, const char *why, char *errstr,
                              size_t errstr_size) {
  char va[64], vb[64];
  describe(st, a, va, sizeof(va));
  describe(st, b, vb, sizeof(vb));
  pr__errf(errstr, errstr_size,
           "option %s (%s) is set (%s) but option %s (%s) is %s; %s",
           pr__opt_defs[a].name, pr__opt_defs[a].env, va, pr__opt_defs[b].name,
           pr__opt_defs[b].env, vb, why);
  return PROSODY_ERR_CONFIG;
}

/* "option a (A) is needed when b (B) is y". */
static prosody_err_t needed(const pr__settings_t *st, pr__opt_id_t a,
                            pr__opt_id_t b, const char *accepted, char *errstr,
                            size_t errstr_size) {
  char vb[64];
  describe(st, b, vb, sizeof(vb));
  pr__errf(errstr, errstr_size,
           "option %s (%s) is not set but option %s (%s) is %s, which needs "
           "it; expected %s",
           pr__opt_defs[a].name, pr__opt_defs[a].env, pr__opt_defs[b].name,
           pr__opt_defs[b].env, vb, accepted);
  return PROSODY_ERR_CONFIG;
}

/* Security protocols and SASL mechanisms, in the order of the table. */
enum { PR_SEC_PLAINTEXT, PR_SEC_SSL, PR_SEC_SASL_PLAINTEXT, PR_SEC_SASL_SSL };
enum { PR_SASL_PLAIN, PR_SASL_SCRAM_256, PR_SASL_SCRAM_512, PR_SASL_OAUTH };

static prosody_err_t check_kafka_security(const pr__settings_t *st,
                                          char *errstr, size_t errstr_size) {
  static const pr__opt_id_t sasl_opts[] = {
      PR_OPT_KAFKA_SASL_MECHANISM,
      PR_OPT_KAFKA_SASL_USERNAME,
      PR_OPT_KAFKA_SASL_PASSWORD,
      PR_OPT_KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL,
      PR_OPT_KAFKA_SASL_OAUTHBEARER_CLIENT_ID,
      PR_OPT_KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET,
      PR_OPT_KAFKA_SASL_OAUTHBEARER_SCOPE};
  static const pr__opt_id_t oauth_opts[] = {
      PR_OPT_KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL,
      PR_OPT_KAFKA_SASL_OAUTHBEARER_CLIENT_ID,
      PR_OPT_KAFKA_SASL_OAUTHBEARER_CLIENT_SECRET,
      PR_OPT_KAFKA_SASL_OAUTHBEARER_SCOPE};
  static const pr__opt_id_t ssl_opts[] = {
      PR_OPT_KAFKA_SSL_CA_LOCATION, PR_OPT_KAFKA_SSL_CERTIFICATE_LOCATION,
      PR_OPT_KAFKA_SSL_KEY_LOCATION, PR_OPT_KAFKA_SSL_KEY_PASSWORD};
  const pr__opt_id_t proto = PR_OPT_KAFKA_SECURITY_PROTOCOL;
  int p = PR_CFG_ENUM(st, KAFKA_SECURITY_PROTOCOL);
  int sasl = p == PR_SEC_SASL_PLAINTEXT || p == PR_SEC_SASL_SSL;
  int tls = p == PR_SEC_SSL || p == PR_SEC_SASL_SSL;
  int mech = PR_CFG_SET(st, KAFKA_SASL_MECHANISM)
                 ? PR_CFG_ENUM(st, KAFKA_SASL_MECHANISM)
                 : -1;

  if (PR_CFG_BOOL(st, MOCK) && p != PR_SEC_PLAINTEXT)
    return conflict(st, PR_OPT_MOCK, proto,
                    "the embedded mock cluster speaks PLAINTEXT only; expected "
                    "kafka_security_protocol=PLAINTEXT with mock=true",
                    errstr, errstr_size);
  for (size_t i = 0; !sasl && i < sizeof(sasl_opts) / sizeof(*sasl_opts); i++)
    if (st->v[sasl_opts[i]].isset)
      return conflict(st, sasl_opts[i], proto,
                      "SASL options need kafka_security_protocol "
                      "SASL_PLAINTEXT or SASL_SSL",
                      errstr, errstr_size);
  for (size_t i = 0; !tls && i < sizeof(ssl_opts) / sizeof(*ssl_opts); i++)
    if (st->v[ssl_opts[i]].isset)
      return conflict(st, ssl_opts[i], proto,
                      "TLS options need kafka_security_protocol SSL or "
                      "SASL_SSL",
                      errstr, errstr_size);
  if (!tls && !PR_CFG_BOOL(st, KAFKA_SSL_ENDPOINT_IDENTIFICATION))
    return conflict(st, PR_OPT_KAFKA_SSL_ENDPOINT_IDENTIFICATION, proto,
                    "TLS options need kafka_security_protocol SSL or SASL_SSL",
                    errstr, errstr_size);
  if (PR_CFG_SET(st, KAFKA_SSL_CERTIFICATE_LOCATION) !=
      PR_CFG_SET(st, KAFKA_SSL_KEY_LOCATION)) {
    int cert = PR_CFG_SET(st, KAFKA_SSL_CERTIFICATE_LOCATION);
    pr__errf(errstr, errstr_size,
             "option %s (%s) is set but option %s (%s) is not; a client "
             "certificate needs its private key and a key its certificate: "
             "expected both or neither",
             cert ? "kafka_ssl_certificate_location" : "kafka_ssl_key_location",
             cert ? "PROSODY_KAFKA_SSL_CERTIFICATE_LOCATION"
                  : "PROSODY_KAFKA_SSL_KEY_LOCATION",
             cert ? "kafka_ssl_key_location" : "kafka_ssl_certificate_location",
             cert ? "PROSODY_KAFKA_SSL_KEY_LOCATION"
                  : "PROSODY_KAFKA_SSL_CERTIFICATE_LOCATION");
    return PROSODY_ERR_CONFIG;
  }
  if (PR_CFG_SET(st, KAFKA_SSL_KEY_PASSWORD) &&
      !PR_CFG_SET(st, KAFKA_SSL_KEY_LOCATION))
    return conflict(st, PR_OPT_KAFKA_SSL_KEY_PASSWORD,
                    PR_OPT_KAFKA_SSL_KEY_LOCATION,
                    "a key password needs the key: expected "
                    "kafka_ssl_key_location too",
                    errstr, errstr_size);
  if (!sasl)
    return PROSODY_OK;
  if (mech < 0)
    return needed(st, PR_OPT_KAFKA_SASL_MECHANISM, proto,
                  "one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER",
                  errstr, errstr_size);
  if (mech == PR_SASL_OAUTH) {
    if (PR_CFG_SET(st, KAFKA_SASL_USERNAME))
      return conflict(st, PR_OPT_KAFKA_SASL_USERNAME,
                      PR_OPT_KAFKA_SASL_MECHANISM,
                      "OAUTHBEARER takes a client id and secret, not a user "
                      "name and password",
                      errstr, errstr_size);
    if (PR_CFG_SET(st, KAFKA_SASL_PASSWORD))
      return conflict(st, PR_OPT_KAFKA_SASL_PASSWORD,
                      PR_OPT_KAFKA_SASL_MECHANISM,
                      "OAUTHBEARER takes a client id and secret, not a user "
                      "name and password",
                      errstr, errstr_size);
    for (size_t i = 0; i < 3; i++) /* all but the scope */
      if (!st->v[oauth_opts[i]].isset)
        return needed(st, oauth_opts[i], PR_OPT_KAFKA_SASL_MECHANISM,
                      pr__opt_accepted(oauth_opts[i]), errstr, errstr_size);
    return PROSODY_OK;
  }
  for (size_t i = 0; i < sizeof(oauth_opts) / sizeof(*oauth_opts); i++)
    if (st->v[oauth_opts[i]].isset)
      return conflict(st, oauth_opts[i], PR_OPT_KAFKA_SASL_MECHANISM,
                      "the OAUTHBEARER options need "
                      "kafka_sasl_mechanism=OAUTHBEARER",
                      errstr, errstr_size);
  if (!PR_CFG_SET(st, KAFKA_SASL_USERNAME))
    return needed(st, PR_OPT_KAFKA_SASL_USERNAME, PR_OPT_KAFKA_SASL_MECHANISM,
                  "a non-empty string", errstr, errstr_size);
  if (!PR_CFG_SET(st, KAFKA_SASL_PASSWORD))
    return needed(st, PR_OPT_KAFKA_SASL_PASSWORD, PR_OPT_KAFKA_SASL_MECHANISM,
                  "a non-empty string", errstr, errstr_size);
  return PROSODY_OK;
}

prosody_err_t pr__settings_check_kafka(const pr__settings_t *st, char *errstr,
                                       size_t errstr_size) {
  if (!PR_CFG_BOOL(st, MOCK) && !PR_CFG_SET(st, BOOTSTRAP_SERVERS)) {
    pr__errf(errstr, errstr_size,
             "option bootstrap_servers (PROSODY_BOOTSTRAP_SERVERS) is not "
             "set; expected a comma-separated list of host:port, or mock=true "
             "(PROSODY_MOCK) for the embedded mock cluster");
    return PROSODY_ERR_CONFIG;
  }
  return check_kafka_security(st, errstr, errstr_size);
}

/* A duration option that must not be below another one. */
static prosody_err_t check_not_below(const pr__settings_t *st, pr__opt_id_t hi,
                                     pr__opt_id_t lo, char *errstr,
                                     size_t errstr_size) {
  char a[64], b[64];
  if (st->v[hi].u.ns >= st->v[lo].u.ns)
    return PROSODY_OK;
  describe(st, hi, a, sizeof(a));
  describe(st, lo, b, sizeof(b));
  pr__errf(errstr, errstr_size,
           "option %s (%s) is %s, less than %s (%s) %s; expected %s >= %s",
           pr__opt_defs[hi].name, pr__opt_defs[hi].env, a,
           pr__opt_defs[lo].name, pr__opt_defs[lo].env, b,
           pr__opt_defs[hi].name, pr__opt_defs[lo].name);
  return PROSODY_ERR_CONFIG;
}

/* subsystem: at most 64 bytes (the string type trims it and refuses it
 * empty). */
static prosody_err_t check_subsystem(const pr__settings_t *st, char *errstr,
                                     size_t errstr_size) {
  const char *v = PR_CFG_SET(st, SUBSYSTEM) ? PR_CFG_STR(st, SUBSYSTEM) : NULL;
  size_t n = v ? strlen(v) : 0;
  if (n > 64) {
    pr__errf(errstr, errstr_size,
             "option subsystem (PROSODY_SUBSYSTEM) is %zu bytes; expected a "
             "name of 1 to 64 bytes",
             n);
    return PROSODY_ERR_CONFIG;
  }
  if (PR_CFG_NS(st, STATE_RECOVERY_DELAY) % 1000000000) {
    char d[64];
    pr__duration_format(PR_CFG_NS(st, STATE_RECOVERY_DELAY), d, sizeof(d));
    pr__errf(errstr, errstr_size,
             "option state_recovery_delay (PROSODY_STATE_RECOVERY_DELAY) is "
             "%s; expected a whole number of seconds, at least 1s",
             d);
    return PROSODY_ERR_CONFIG;
  }
  /* A published collection is routed under the subsystem's name. */
  for (size_t i = 0; !v && i < st->states.n; i++)
    if (st->states.d[i].published) {
      pr__errf(errstr, errstr_size,
               "published: collection \"%s\" is published, which needs the "
               "option subsystem (PROSODY_SUBSYSTEM): the name readers give "
               "to find it",
               st->states.d[i].name);
      return PROSODY_ERR_CONFIG;
    }
  return PROSODY_OK;
}

/* peer_bind_address: host:port, the port 0 to 65535. */
static prosody_err_t check_peer_bind(const pr__settings_t *st, char *errstr,
                                     size_t errstr_size) {
  const char *v = PR_CFG_SET(st, PEER_BIND_ADDRESS)
                      ? PR_CFG_STR(st, PEER_BIND_ADDRESS)
                      : NULL;
  const char *colon = v ? strrchr(v, ':') : NULL;
  char *end = NULL;
  long port = colon ? strtol(colon + 1, &end, 10) : -1;
  if (!v)
    return PROSODY_OK;
  if (!colon || colon == v || !colon[1] || *end || port < 0 || port > 65535) {
    pr__errf(errstr, errstr_size,
             "option peer_bind_address (PROSODY_PEER_BIND_ADDRESS) is \"%s\"; "
             "expected host:port, the port 0 to 65535 (e.g. 127.0.0.1:0)",
             v);
    return PROSODY_ERR_CONFIG;
  }
  return PROSODY_OK;
}

prosody_err_t pr__settings_check_client(const pr__settings_t *st, char *errstr,
                                        size_t errstr_size) {
  prosody_err_t err = pr__settings_check_kafka(st, errstr, errstr_size);
  if (err)
    return err;
  if ((err = check_not_below(st, PR_OPT_MAX_RETRY_DELAY, PR_OPT_RETRY_BASE,
                             errstr, errstr_size)) ||
      (err = check_not_below(st, PR_OPT_DEFER_MAX_DELAY, PR_OPT_DEFER_BASE,
                             errstr, errstr_size)))
    return err;
  if ((err = check_subsystem(st, errstr, errstr_size)) ||
      (err = check_peer_bind(st, errstr, errstr_size)))
    return err;
  if (PR_CFG_ENUM(st, MODE) == PR_MODE_LOW_LATENCY &&
      !PR_CFG_SET(st, FAILURE_TOPIC)) {
    pr__errf(errstr, errstr_size,
             "option failure_topic (PROSODY_FAILURE_TOPIC) is required when "
             "mode (PROSODY_MODE) is low-latency; expected a topic name for "
             "messages that fail after max_retries");
    return PROSODY_ERR_CONFIG;
  }
  {
    static const pr__opt_id_t cass_tls[] = {
        PR_OPT_CASSANDRA_SSL_CA_LOCATION,
        PR_OPT_CASSANDRA_SSL_CERTIFICATE_LOCATION,
        PR_OPT_CASSANDRA_SSL_KEY_LOCATION, PR_OPT_CASSANDRA_SSL_KEY_PASSWORD};
    for (size_t i = 0; i < 4 && !PR_CFG_BOOL(st, CASSANDRA_SSL); i++)
      if (st->v[cass_tls[i]].isset)
        return conflict(st, cass_tls[i], PR_OPT_CASSANDRA_SSL,
                        "expected cassandra_ssl=true with the Cassandra TLS "
                        "options",
                        errstr, errstr_size);
    if (PR_CFG_SET(st, CASSANDRA_SSL_CERTIFICATE_LOCATION) !=
        PR_CFG_SET(st, CASSANDRA_SSL_KEY_LOCATION))
      return conflict(
          st,
          PR_CFG_SET(st, CASSANDRA_SSL_KEY_LOCATION)
              ? PR_OPT_CASSANDRA_SSL_KEY_LOCATION
              : PR_OPT_CASSANDRA_SSL_CERTIFICATE_LOCATION,
          PR_CFG_SET(st, CASSANDRA_SSL_KEY_LOCATION)
              ? PR_OPT_CASSANDRA_SSL_CERTIFICATE_LOCATION
              : PR_OPT_CASSANDRA_SSL_KEY_LOCATION,
          "a client certificate needs its private key and a key its "
          "certificate: expected both or neither",
          errstr, errstr_size);
    if (PR_CFG_SET(st, CASSANDRA_SSL_KEY_PASSWORD) &&
        !PR_CFG_SET(st, CASSANDRA_SSL_KEY_LOCATION))
      return conflict(st, PR_OPT_CASSANDRA_SSL_KEY_PASSWORD,
                      PR_OPT_CASSANDRA_SSL_KEY_LOCATION,
                      "a key password needs the key it opens: expected "
                      "cassandra_ssl_key_location too",
                      errstr, errstr_size);
  }
  {
    const char *host = PR_CFG_STR(st, PROBE_HOST);
    unsigned char addr[16];
    if (inet_pton(AF_INET, host, addr) != 1 &&
        inet_pton(AF_INET6, host, addr) != 1) {
      pr__errf(errstr, errstr_size,
               "option probe_host (PROSODY_PROBE_HOST) is \"%s\", no IP "
               "address; expected an IPv4 or IPv6 address such as 0.0.0.0 "
               "(every IPv4 interface), :: (every interface) or 127.0.0.1 "
               "(loopback only)",
               host);
      return PROSODY_ERR_CONFIG;
    }
  }
  if (!PR_CFG_SET(st, SOURCE_SYSTEM) && !PR_CFG_SET(st, GROUP_ID)) {
    pr__errf(errstr, errstr_size,
             "option source_system (PROSODY_SOURCE_SYSTEM) is not set and "
             "there is no group_id (PROSODY_GROUP_ID) to default to; expected "
             "a non-empty string in either");
    return PROSODY_ERR_CONFIG;
  }
  return PROSODY_OK;
}
