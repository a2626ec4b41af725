/*
 * cli/args.h - command-line options shared by the commands.
 */
#ifndef AG_CLI_ARGS_H
#define AG_CLI_ARGS_H

#include <stddef.h>

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

#endif /* AG_CLI_ARGS_H */
