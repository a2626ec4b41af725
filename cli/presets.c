/*
 * cli/presets.c - `agentguard presets [NAME]`: lists the presets with a
 * line each, or prints one as the complete config JSON that
 * ag_config_to_json writes (every key, so it can be saved and edited as a
 * config file). The descriptions are ours; the names come from the library
 * (ag_preset_names), so a preset added there is listed even before it has a
 * description here.
 */
#include <string.h>

#include "args.h"
#include "cli.h"

static const struct {
  const char *name, *line;
} descriptions[] = {
    {"default", "every mechanism, tuned on real agent runs not to stop "
                "healthy ones (the library's default)"},
    {"none", "every mechanism off, no retries, no timeouts, full errors"},
    {"hpd", "HPD-Agent's rules: identical-call breaker 5, 3 "
            "consecutive failing iterations, 3 retries, 30s/5m timeouts"},
    {"development", "hpd, fail fast: 3 identical calls, 2 retries, 10s per "
                    "attempt, 2m per turn"},
    {"production", "hpd, resilient: 5 identical calls, 3 retries from 2s, 60s "
                   "per attempt, 10m per turn"},
    {"long-running", "hpd, patient: 10 identical calls, 5 retries from 3s, 5m "
                     "per attempt, 30m per turn"},
    {"forge", "Forge's rules: 5 identical errors, a tool call required, "
              "ended by task_complete or ask_question"},
    {"twelve-factor", "12-factor agents' rules: 3 failures per tool, 10 "
                      "per turn, escalate to a human, compact errors"},
    {"monadic", "Monadic Chat's rules: 3 errors of a kind, 20 calls per "
                "turn, model-request retries"},
    {"meai", "Microsoft.Extensions.AI: 40 iterations then a final answer, 3 "
             "consecutive errors (one failed call fails the iteration)"},
};

static void usage(FILE *f) {
  fputs("usage: agentguard presets [NAME]\n"
        "\n"
        "Without NAME, lists the presets with a line each. With NAME, prints "
        "that preset\nas a complete config (JSON, every key), ready to save "
        "and edit as a config file.\n"
        "\n"
        "options:\n"
        "  --help, -h   this help\n"
        "\n"
        "Exit codes: 0 done; 2 unknown preset or bad usage.\n",
        f);
}

int cli_presets(int argc, char **argv) {
  const char *name = NULL;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      usage(stdout);
      return AG_EXIT_OK;
    }
    if (argv[i][0] == '-' && argv[i][1] != '\0') {
      return cli_usage_error("presets", "unknown option '%s'", argv[i]);
    }
    if (name != NULL) {
      fprintf(stderr, "agentguard presets: one preset name only\n\n");
      usage(stderr);
      return AG_EXIT_USAGE;
    }
    name = argv[i];
  }

  if (name == NULL) {
    const char *const *names = ag_preset_names();
    for (size_t i = 0; names[i] != NULL; i++) {
      const char *line = "";
      for (size_t j = 0; j < sizeof descriptions / sizeof descriptions[0]; j++)
        if (strcmp(descriptions[j].name, names[i]) == 0)
          line = descriptions[j].line;
      printf("%-14s %s\n", names[i], line);
    }
    return AG_EXIT_OK;
  }

  ag_config cfg;
  ag_error_t err;
  if (ag_config_preset(&cfg, name, &err) != AG_OK) {
    const char *m = err.msg;
    if (strncmp(m, "preset: ", 8) == 0)
      m += 8;
    fprintf(stderr, "agentguard presets: %s\n", m);
    return AG_EXIT_USAGE;
  }
  char *json = NULL;
  if (ag_config_to_json(&cfg, &json, &err) != AG_OK) {
    fprintf(stderr, "agentguard presets: %s\n", err.msg);
    return AG_EXIT_FAILURE;
  }
  printf("%s\n", json);
  ag_free(json);
  return fflush(stdout) == 0 ? AG_EXIT_OK : AG_EXIT_FAILURE;
}
