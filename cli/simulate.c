/* placeholder until this command lands (replaced by its owner) */
#include "cli.h"
int cli_simulate(int argc, char **argv) {
  (void)argc;
  fprintf(stderr, "agentguard: '%s' is not built yet\n", argv[0]);
  return AG_EXIT_FAILURE;
}
