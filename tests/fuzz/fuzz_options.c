/*
 * fuzz_options.c - libFuzzer target for configuration values: every
 * option's parser (the first byte picks the option, the rest is the value
 * text, as prosody_config_set and the environment hand it over) and the
 * duration parser. A value is either accepted, formatted back and parsed
 * again to the same canonical text, or refused with a message naming the
 * option; nothing else (no crash, no leak, no sanitizer report).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char text[512], err[1024], canon[1024], again[1024];
  pr__value_t v, w;
  pr__opt_id_t id;
  int64_t ns;
  size_t n;
  if (size < 1)
    return 0;
  id = (pr__opt_id_t)(data[0] % PR_OPT__COUNT);
  n = size - 1 < sizeof(text) - 1 ? size - 1 : sizeof(text) - 1;
  memcpy(text, data + 1, n);
  text[n] = '\0';
  err[0] = '\0';
  memset(&v, 0, sizeof(v));
  if (pr__opt_parse(id, text, data[0] & 0x80, &v, err, sizeof(err)) ==
      PROSODY_OK) {
    /* The canonical text parses back to itself (secrets print as ****). */
    pr__opt_format(id, &v, canon, sizeof(canon));
    memset(&w, 0, sizeof(w));
    if (strcmp(canon, "****") &&
        pr__opt_parse(id, canon, 0, &w, err, sizeof(err)) == PROSODY_OK) {
      pr__opt_format(id, &w, again, sizeof(again));
      if (strcmp(canon, again)) {
        fprintf(stderr, "option %d: \"%s\" -> \"%s\" -> \"%s\"\n", (int)id,
                text, canon, again);
        abort();
      }
      pr__value_fini(id, &w);
    }
    pr__value_fini(id, &v);
  } else if (!err[0]) {
    abort(); /* a refusal always says why */
  }
  if (pr__duration_parse(text, &ns, err, sizeof(err)) == 0 && ns < 0)
    abort(); /* durations are never negative */
  return 0;
}
