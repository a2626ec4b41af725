/*
 * cli/args.c - command-line options shared by the commands (args.h).
 */
#include "args.h"

#include <stdio.h>
#include <string.h>

int cli_value_option(int argc, char **argv, int *i, const char *const *names,
                     const char **const *slots, size_t n, char *msg,
                     size_t cap) {
  const char *arg = argv[*i];
  for (size_t k = 0; k < n; k++) {
    size_t len = strlen(names[k]);
    if (strncmp(arg, names[k], len) != 0 ||
        (arg[len] != '\0' && arg[len] != '='))
      continue;
    const char *value;
    if (arg[len] == '=') {
      value = arg + len + 1;
    } else {
      if (*i + 1 >= argc) {
        snprintf(msg, cap, "option '%s' needs a value", arg);
        return -1;
      }
      value = argv[++*i];
    }
    if (value[0] == '\0') {
      snprintf(msg, cap, "option '%s' needs a non-empty value", names[k]);
      return -1;
    }
    if (*slots[k] != NULL) {
      snprintf(msg, cap, "option '%s' given twice", names[k]);
      return -1;
    }
    *slots[k] = value;
    return 1;
  }
  return 0;
}
