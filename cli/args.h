/*
 * cli/args.h - what the commands share: options with a value, exit codes,
 * the events file.
 */
#ifndef AG_CLI_ARGS_H
#define AG_CLI_ARGS_H

#include <stddef.h>
#include <stdio.h>

#include "agentguard.h"

/*
 * Options that take a value, "--name VALUE" or "--name=VALUE". When argv[*i]
 * is one of names[0..n), stores its value in *slots[k] (moving *i past a
 * separate value) and returns 1; returns 0 when it is none of them; returns
 * -1 with a message in msg[0..cap) when the value is missing or empty, or
 * the option was given before.
 */
int cli_value_option(int argc, char **argv, int *i, const char *const *names,
                     const char **const *slots, size_t n, char *msg,
                     size_t cap);

/* The exit code of DESIGN.md section 5 for a turn's status. */
int cli_exit_code(ag_turn_status s);

/* Opens an events file for writing (created or truncated, close-on-exec);
 * "-" is stdout. NULL with errno set when it cannot be opened. */
FILE *cli_open_events(const char *path);

#endif /* AG_CLI_ARGS_H */
