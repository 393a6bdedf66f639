/*
 * error.c - error names and messages, and the library version.
 *
 * The table below is the single source for prosody_err_name(),
 * prosody_err_message() and prosody_err_is_transient(); its order must match
 * the enum in prosody.h (a unit test checks every value).
 */
#include "prosody.h"

/* X(code, message, transient) */
#define PR_ERRORS(X)                                                           \
  X(PROSODY_OK, "success", 0)                                                  \
  X(PROSODY_ERR_INVALID_ARG, "invalid argument", 0)                            \
  X(PROSODY_ERR_CONFIG, "invalid configuration", 0)                            \
  X(PROSODY_ERR_NOMEM, "out of memory", 0)                                     \
  X(PROSODY_ERR_INVALID_PAYLOAD, "payload is not valid JSON", 0)               \
  X(PROSODY_ERR_TIMEOUT, "timed out", 1)                                       \
  X(PROSODY_ERR_TRANSIENT, "transient Kafka error", 1)                         \
  X(PROSODY_ERR_PERMANENT, "permanent Kafka error", 0)                         \
  X(PROSODY_ERR_TOPIC_EXISTS, "topic already exists", 0)                       \
  X(PROSODY_ERR_UNKNOWN_TOPIC, "topic does not exist", 0)                      \
  X(PROSODY_ERR_UNSUPPORTED, "operation not supported", 0)                     \
  X(PROSODY_ERR_STATE, "invalid state for this operation", 0)

static const struct {
  prosody_err_t code;
  const char *name;
  const char *message;
  int transient;
} errors[] = {
#define X(code, message, transient) {code, #code, message, transient},
    PR_ERRORS(X)
#undef X
};

#define N_ERRORS (sizeof(errors) / sizeof(errors[0]))

PROSODY_EXPORT const char *prosody_err_name(prosody_err_t err) {
  if ((unsigned)err < N_ERRORS && errors[err].code == err)
    return errors[err].name;
  return "PROSODY_ERR_UNKNOWN";
}

PROSODY_EXPORT const char *prosody_err_message(prosody_err_t err) {
  if ((unsigned)err < N_ERRORS && errors[err].code == err)
    return errors[err].message;
  return "unknown error";
}

PROSODY_EXPORT int prosody_err_is_transient(prosody_err_t err) {
  if ((unsigned)err < N_ERRORS && errors[err].code == err)
    return errors[err].transient;
  return 0;
}

#define PR_STR2(x) #x
#define PR_STR(x) PR_STR2(x)

PROSODY_EXPORT const char *prosody_version_str(void) {
  return PR_STR(PROSODY_VERSION_MAJOR) "." PR_STR(
      PROSODY_VERSION_MINOR) "." PR_STR(PROSODY_VERSION_PATCH);
}

PROSODY_EXPORT int prosody_version(void) { return PROSODY_VERSION; }
