/*
 * cli/check_config.c - `agentguard check-config FILE`: validates a config
 * file exactly as the library will read it (ag_config_load_file: the
 * preset, then every key, then the cross-key rules) and prints the
 * effective config, every key included, so "what does my file amount to?"
 * has a literal answer. On an error the library's message names the file
 * and the key path, and the exit code is 2.
 */
#include <string.h>

#include "args.h"
#include "cli.h"

static void usage(FILE *f) {
  fputs("usage: agentguard check-config FILE\n"
        "\n"
        "Validates the config file FILE ('-' reads stdin) and prints the "
        "effective config\n(the preset with the file's keys on top, every "
        "key) as JSON. The format is in\ndocs/configuration.md.\n"
        "\n"
        "options:\n"
        "  --help, -h   this help\n"
        "\n"
        "Exit codes: 0 valid; 2 invalid (the message names the key) or bad "
        "usage;\n1 the file could not be written out.\n",
        f);
}

int cli_check_config(int argc, char **argv) {
  const char *path = NULL;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      usage(stdout);
      return AG_EXIT_OK;
    }
    if (argv[i][0] == '-' && argv[i][1] != '\0') {
      return cli_usage_error("check-config", "unknown option '%s'", argv[i]);
    }
    if (path != NULL) {
      fprintf(stderr, "agentguard check-config: one FILE only\n\n");
      usage(stderr);
      return AG_EXIT_USAGE;
    }
    path = argv[i];
  }
  if (path == NULL) {
    fprintf(stderr, "agentguard check-config: a config FILE is required\n\n");
    usage(stderr);
    return AG_EXIT_USAGE;
  }
  if (strcmp(path, "-") == 0)
    path = "/dev/stdin";

  ag_config cfg;
  ag_error_t err;
  ag_config_init(&cfg);
  ag_err_t e = ag_config_load_file(&cfg, path, &err);
  if (e != AG_OK) {
    fprintf(stderr, "%s\n", err.msg);
    return e == AG_ENOMEM ? AG_EXIT_FAILURE : AG_EXIT_USAGE;
  }
  char *json = NULL;
  if (ag_config_to_json(&cfg, &json, &err) != AG_OK) {
    fprintf(stderr, "agentguard check-config: %s\n", err.msg);
    return AG_EXIT_FAILURE;
  }
  printf("%s\n", json);
  ag_free(json);
  return fflush(stdout) == 0 ? AG_EXIT_OK : AG_EXIT_FAILURE;
}
