/*
 * cli.h - what the files of the `prosody` command-line tool share
 * (private): the helpers defined in prosody.c that every command uses,
 * and the demo command of demo.c.
 */
#ifndef PR_CLI_H
#define PR_CLI_H

#include "prosody.h"

/* Size of the error buffers passed to the library. */
#define ERRLEN 1024

/* Prints "prosody: WHAT: MSG (ERROR_NAME)" to stderr; returns the exit
 * status for `err`: 2 for a configuration or argument error, else 1. */
int pr__cli_fail(const char *what, prosody_err_t err, const char *msg);
/* Prints "prosody CMD: FLAG needs a value: ACCEPTED" to stderr; returns
 * the exit status for a usage error (2). */
int pr__cli_no_value(const char *cmd, const char *flag, const char *accepted);
/* Sets `name` unless the user already set it or the environment has it. */
int pr__cli_set_default(prosody_config_t *conf, const char *name,
                        const char *value);
/* A client from `conf` (which it takes); on failure reports the error,
 * frees `conf` and sets `*rc` to the exit status. */
prosody_client_t *pr__cli_open_client(prosody_config_t *conf, const char *what,
                                      int *rc);

/* `prosody demo [--messages N] [--keys N] [--topic T]`: takes `conf` and
 * returns the exit status. Defined in demo.c. */
int pr__cli_demo(prosody_config_t *conf, int argc, char **argv);

#endif /* PR_CLI_H */
