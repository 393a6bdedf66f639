/*
 * jaeger.h - reading Jaeger's v1 HTTP query API from the tracing tests
 * (test_trace_chain, test_otel_jaeger). Include after harness.h; link
 * libcurl and jansson. The caller runs curl_global_init once.
 */
#ifndef PROSODY_TEST_JAEGER_H
#define PROSODY_TEST_JAEGER_H

#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>
#include <jansson.h>

typedef struct t_body {
  char *p;
  size_t n;
} t_body_t;

static size_t t_on_body(char *d, size_t sz, size_t nm, void *arg) {
  t_body_t *b = arg;
  char *g = realloc(b->p, b->n + sz * nm + 1);
  CHECK(g, "out of memory");
  memcpy(g + b->n, d, sz * nm);
  b->n += sz * nm;
  g[b->n] = '\0';
  b->p = g;
  return sz * nm;
}

/* GET `url` (5 s at most); its JSON body when the answer is 200 (owned),
 * else NULL with the HTTP status (0: no answer) in *status if given. */
static inline json_t *t_get_json(const char *url, long *status) {
  t_body_t b = {0};
  long code = 0;
  json_t *doc;
  CURL *c = curl_easy_init();
  CHECK(c, "curl_easy_init failed");
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, t_on_body);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 5000L);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  if (curl_easy_perform(c) == CURLE_OK)
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
  curl_easy_cleanup(c);
  doc = code == 200 && b.p ? json_loads(b.p, 0, NULL) : NULL;
  if (doc && getenv("PROSODY_TEST_VERBOSE"))
    printf("%s\n", b.p);
  free(b.p);
  if (status)
    *status = code;
  return doc;
}

#endif
