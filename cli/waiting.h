/*
 * cli/waiting.h - "waiting for the model (12 s)" on a terminal while a model
 * request is under way, redrawn each second by a thread of its own and
 * erased the moment anything else is written (the reply's text, the
 * timeline). `agentguard run` shows it when stderr is a terminal and the
 * timeline is on (not --quiet).
 */
#ifndef AG_CLI_WAITING_H
#define AG_CLI_WAITING_H

#include <stdio.h>

typedef struct cli_waiting cli_waiting;

/* A stopped indicator writing to `out` (a terminal), shown once a wait has
 * lasted 1 s. NULL when its thread cannot start (then there is none: every
 * function below takes NULL and does nothing). */
cli_waiting *cli_waiting_new(FILE *out);

/* A model request was sent: the wait starts now. */
void cli_waiting_start(cli_waiting *w);

/* Something else is about to be written: the wait is over, and its line is
 * erased if it was shown. Call before writing to the terminal. */
void cli_waiting_clear(cli_waiting *w);

/* Stops the thread (erasing the line) and frees. */
void cli_waiting_free(cli_waiting *w);

#endif /* AG_CLI_WAITING_H */
