/*
 * cli/args.c - command-line options shared by the commands (args.h).
 */
#include "args.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

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

int cli_exit_code(ag_turn_status s) {
  switch (s) {
  case AG_TURN_COMPLETED:
    return AG_EXIT_OK;
  case AG_TURN_STOPPED:
  case AG_TURN_ESCALATED:
    return AG_EXIT_STOPPED;
  case AG_TURN_TIMED_OUT:
  case AG_TURN_CANCELLED:
    return AG_EXIT_TIMEOUT;
  case AG_TURN_FAILED:
    return AG_EXIT_FAILURE;
  }
  return AG_EXIT_FAILURE;
}

FILE *cli_open_events(const char *path) {
  if (strcmp(path, "-") == 0)
    return stdout;
  int fd;
  do
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  while (fd < 0 && errno == EINTR);
  if (fd < 0)
    return NULL;
  FILE *f = fdopen(fd, "w");
  if (f == NULL) {
    int e = errno;
    close(fd);
    errno = e;
  }
  return f;
}
