/*
 * cli/args.c - what the commands share (args.h): options with a value, exit
 * codes, the events file.
 *
 * Events are written one line per write(2) (cli_write_event), never through
 * stdio: stdio writes a line longer than its buffer (4 KiB for most files)
 * in several calls, so a `kill -9` between them left a cut last line, and
 * `agentguard audit` then refused the whole file (issue 25). One write puts
 * the line in the file in one piece, and O_APPEND at the end even beside
 * another writer of the same file: a crash loses at most the line being
 * written (and audit reads a file whose last line was cut without it).
 */
#include "args.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
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

int cli_usage_error(const char *cmd, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "agentguard %s: ", cmd);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n(see 'agentguard help %s')\n", cmd);
  va_end(ap);
  return AG_EXIT_USAGE;
}

/* A regular file (or a link to one) at buf, which holds a path of at most
 * cap - 1 bytes: true. A path that would not fit is no file. */
static bool is_file(const char *buf, int n, size_t cap) {
  struct stat st;
  return n > 0 && (size_t)n < cap && stat(buf, &st) == 0 && S_ISREG(st.st_mode);
}

const char *cli_default_config(char *buf, size_t cap) {
  const char *off = getenv("AGENTGUARD_NO_CONFIG");
  if (off != NULL && off[0] != '\0' && strcmp(off, "0") != 0)
    return NULL;
  if (is_file(buf, snprintf(buf, cap, "agentguard.json"), cap))
    return buf;
  const char *xdg = getenv("XDG_CONFIG_HOME");
  const char *home = getenv("HOME");
  int n;
  if (xdg != NULL && xdg[0] == '/')
    n = snprintf(buf, cap, "%s/agentguard/config.json", xdg);
  else if (home != NULL && home[0] == '/')
    n = snprintf(buf, cap, "%s/.config/agentguard/config.json", home);
  else
    return NULL;
  return is_file(buf, n, cap) ? buf : NULL;
}

void cli_use_default_config(const char *cmd, const char **config, char *buf,
                            size_t cap) {
  if (*config == NULL && (*config = cli_default_config(buf, cap)) != NULL)
    fprintf(stderr, "agentguard %s: config from %s\n", cmd, *config);
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
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
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

int cli_write_event(FILE *f, const json_t *ev) {
  if (fflush(f) != 0)
    return errno != 0 ? errno : EIO;
  char *line = json_dumps(ev, JSON_COMPACT); /* free() it, says jansson */
  if (line == NULL)
    return ENOMEM;
  size_t len = strlen(line); /* a NUL in a string is dumped as \u0000 */
  line[len++] = '\n';        /* over the NUL: not a C string from here on */
  int fd = fileno(f), rc = 0;
  for (size_t done = 0; done < len;) {
    ssize_t n = write(fd, line + done, len - done);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      rc = n < 0 ? errno : EIO;
      break;
    }
    done += (size_t)n;
  }
  free(line);
  return rc;
}

int cli_otlp(const char *endpoint, char *url, size_t cap, const char **headers,
             const char **service, char *msg, size_t msgcap) {
  const char *base = endpoint, *whole = NULL;
  const char *off = getenv("OTEL_SDK_DISABLED");
  const char *exp = getenv("OTEL_TRACES_EXPORTER");
  bool env_off = (off != NULL && strcasecmp(off, "true") == 0) ||
                 (exp != NULL && strcmp(exp, "none") == 0);
  if (base == NULL && !env_off) {
    whole = getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
    if (whole == NULL || whole[0] == '\0') {
      whole = NULL;
      base = getenv("OTEL_EXPORTER_OTLP_ENDPOINT");
      if (base != NULL && base[0] == '\0')
        base = NULL;
    }
  }
  if (base == NULL && whole == NULL)
    return -1;
  const char *proto = getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL");
  if (proto == NULL)
    proto = getenv("OTEL_EXPORTER_OTLP_PROTOCOL");
  if (proto != NULL && strcmp(proto, "grpc") == 0) {
    snprintf(msg, msgcap,
             "OTEL_EXPORTER_OTLP_PROTOCOL=grpc: agentguard exports traces "
             "over OTLP/HTTP (JSON) only; give the collector's HTTP endpoint "
             "(port 4318)");
    return 1;
  }
  size_t bl = base != NULL ? strlen(base) : 0;
  while (bl > 0 && base[bl - 1] == '/')
    bl--;
  bool has_path = bl >= 10 && strncmp(base + bl - 10, "/v1/traces", 10) == 0;
  int n = whole != NULL ? snprintf(url, cap, "%s", whole)
                        : snprintf(url, cap, "%.*s%s", (int)bl, base,
                                   has_path ? "" : "/v1/traces");
  if (n < 0 || (size_t)n >= cap) {
    snprintf(msg, msgcap, "the OTLP endpoint is longer than %zu bytes",
             cap - 1);
    return 1;
  }
  *headers = getenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS");
  if (*headers == NULL)
    *headers = getenv("OTEL_EXPORTER_OTLP_HEADERS");
  *service = getenv("OTEL_SERVICE_NAME");
  return 0;
}
