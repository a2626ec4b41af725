/*
 * cli/main.c - the agentguard program: dispatches to its commands.
 *
 * Output is never lost silently: after any command, standard output is
 * flushed and closed here, and a write that failed at any point (a full
 * disk, a closed pipe, /dev/full) is reported as "cannot write" with exit
 * code 1, whatever the command itself returned (except 2: nothing ran).
 * Commands that write files of their own (simulate --events) check those
 * themselves.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"

typedef struct command {
  const char *name;
  int (*run)(int argc, char **argv);
  const char *summary;
} command;

static const command commands[] = {
    {"run", cli_run, "run a guarded agent against a real model, in a workdir"},
    {"simulate", cli_simulate,
     "run a scenario (scripted model and tools) through the guarded loop"},
    {"proxy", cli_proxy,
     "an OpenAI/Anthropic/Gemini proxy that guards any agent's tool loop"},
    {"audit", cli_audit,
     "replay recorded agent runs through the guard: where would it stop?"},
    {"presets", cli_presets, "list the presets, or print one as JSON"},
    {"check-config", cli_check_config,
     "validate a config file and print the effective config"},
};

#define N_COMMANDS (sizeof(commands) / sizeof(commands[0]))

static void usage(FILE *f) {
  fprintf(f, "usage: agentguard <command> [options]\n\ncommands:\n");
  for (size_t i = 0; i < N_COMMANDS; i++)
    fprintf(f, "  %-13s %s\n", commands[i].name, commands[i].summary);
  fprintf(f, "\n'agentguard help <command>' (or '<command> --help') "
             "describes a command.\n"
             "Exit codes: 0 completed, 3 stopped or escalated, 4 timed out "
             "or cancelled,\n1 other failure, 2 invalid input (nothing "
             "ran). See docs/cli.md.\n");
}

/* Flushes and closes stdout; on any write error so far, says so and turns
 * the exit code into 1 (2 stays: it means nothing ran). */
static int finish(const char *cmd, int rc) {
  errno = 0;
  int e = 0;
  if (fflush(stdout) != 0)
    e = errno;
  bool failed = e != 0 || ferror(stdout);
  if (fclose(stdout) != 0 && !failed) {
    failed = true;
    e = errno;
  }
  if (!failed)
    return rc;
  fprintf(stderr, "agentguard%s%s: cannot write to standard output: %s\n",
          cmd != NULL ? " " : "", cmd != NULL ? cmd : "",
          e != 0 ? strerror(e) : "an earlier write failed");
  return rc == AG_EXIT_USAGE ? rc : AG_EXIT_FAILURE;
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return AG_EXIT_USAGE;
  }
  const char *cmd = argv[1];
  if (strcmp(cmd, "help") == 0 && argc >= 3) {
    /* "agentguard help run" is "agentguard run --help" */
    for (size_t i = 0; i < N_COMMANDS; i++)
      if (strcmp(argv[2], commands[i].name) == 0) {
        char *sub[] = {argv[2], "--help", NULL};
        return finish(argv[2], commands[i].run(2, sub));
      }
    fprintf(stderr, "agentguard help: unknown command '%s'\n\n", argv[2]);
    usage(stderr);
    return AG_EXIT_USAGE;
  }
  if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 ||
      strcmp(cmd, "help") == 0) {
    usage(stdout);
    return finish(NULL, AG_EXIT_OK);
  }
  if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "version") == 0) {
    printf("agentguard %s\n", ag_version());
    return finish(NULL, AG_EXIT_OK);
  }
  for (size_t i = 0; i < N_COMMANDS; i++)
    if (strcmp(cmd, commands[i].name) == 0)
      return finish(cmd, commands[i].run(argc - 1, argv + 1));
  fprintf(stderr, "agentguard: unknown command '%s'\n\n", cmd);
  usage(stderr);
  return AG_EXIT_USAGE;
}
