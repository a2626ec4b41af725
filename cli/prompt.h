/*
 * cli/prompt.h - the prompt of `agentguard run`'s interactive session: one
 * line read with Debian's libedit (emacs keys: arrows, Ctrl-A/E/K/W, ...)
 * and an in-memory history of the session's tasks (Up/Down, Ctrl-P/N),
 * while the stop signals stay blocked everywhere but inside ppoll(2), so
 * a Ctrl-C that comes just before the wait is not lost.
 */
#ifndef AG_CLI_PROMPT_H
#define AG_CLI_PROMPT_H

#include <signal.h>
#include <stdbool.h>
#include <stdio.h>

typedef struct cli_prompt cli_prompt;

typedef enum {
  CLI_PROMPT_LINE,    /* a line was entered */
  CLI_PROMPT_EOF,     /* Ctrl-D on an empty line, or the input ended */
  CLI_PROMPT_SIGNAL,  /* a signal came first (the line is dropped) */
  CLI_PROMPT_TOO_LONG /* the line was longer than the cap (dropped) */
} cli_prompt_result;

/* Waits until fd has input; false when a signal came first. The caller has
 * the signals blocked; `open_mask` unblocks them inside ppoll only. */
bool cli_wait_input(int fd, const sigset_t *open_mask);

/* A prompt reading the terminal `in` and drawing on `out`; `history_max`
 * lines are kept. NULL when libedit cannot start on it (then read plainly). */
cli_prompt *cli_prompt_new(FILE *in, FILE *out, int history_max);

/* Shows `text` and reads one line into buf (cap bytes, the newline
 * removed), with the signals blocked as for cli_wait_input. A line that is
 * not empty joins the history. */
cli_prompt_result cli_prompt_read(cli_prompt *p, const char *text,
                                  const sigset_t *open_mask, char *buf,
                                  size_t cap);

void cli_prompt_free(cli_prompt *p);

#endif /* AG_CLI_PROMPT_H */
