/*
 * cli/cli.h - the agentguard program's commands. Each lives in its own file
 * and is built only on the public API (include/agentguard.h).
 *
 * A command gets argv without the program name (argv[0] is the command) and
 * returns the process exit code (docs/cli.md): 0 the last turn
 * completed (or the command succeeded); 3 stopped or escalated; 4 timed out
 * or cancelled; 1 any other failure; 2 invalid input (nothing ran).
 */
#ifndef AG_CLI_H
#define AG_CLI_H

#include <stdio.h>

#include "agentguard.h"

enum {
  AG_EXIT_OK = 0,
  AG_EXIT_FAILURE = 1,
  AG_EXIT_USAGE = 2,
  AG_EXIT_STOPPED = 3,
  AG_EXIT_TIMEOUT = 4
};

int cli_simulate(int argc, char **argv);     /* cli/simulate.c */
int cli_presets(int argc, char **argv);      /* cli/presets.c */
int cli_check_config(int argc, char **argv); /* cli/check_config.c */
int cli_audit(int argc, char **argv);        /* cli/audit.c */
int cli_run(int argc, char **argv);          /* cli/run.c */
int cli_proxy(int argc, char **argv);        /* cli/proxy.c */

#endif /* AG_CLI_H */
