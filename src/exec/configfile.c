/*
 * src/exec/configfile.c - ag_config_load_file: reads a config file and hands
 * its bytes to the core's parser. The core reads buffers, never files
 * (DESIGN.md section 1), so the reading lives here, in the first layer that
 * does I/O; the declaration stays in agentguard/core.h beside
 * ag_config_parse, where callers look for it.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

#define CONFIG_FILE_CAP (1024 * 1024)

/* Reads the whole file (at most CONFIG_FILE_CAP bytes) into *buf. */
static ag_err_t read_file(const char *path, char **buf, size_t *len,
                          ag_error_t *e) {
  int fd;
  do
    fd = open(path, O_RDONLY | O_CLOEXEC);
  while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    int sys = errno;
    char why[128];
    if (strerror_r(sys, why, sizeof(why)) != 0)
      snprintf(why, sizeof(why), "errno %d", sys);
    ag__set_error(e, AG_EIO, -1, "cannot open: %s", why);
    e->sys_errno = sys;
    return AG_EIO;
  }
  struct stat st;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
      st.st_size > CONFIG_FILE_CAP) {
    close(fd);
    return ag__set_error(e, AG_ETOOBIG, -1, "larger than 1 MiB (%lld bytes)",
                         (long long)st.st_size);
  }
  /* Read up to one byte past the cap: a file that grew, or a pipe, is
   * caught by the same test. */
  size_t cap = 64 * 1024, n = 0;
  char *b = malloc(cap);
  if (b == NULL) {
    close(fd);
    return ag__set_error(e, AG_ENOMEM, -1, "out of memory");
  }
  for (;;) {
    if (n == cap) {
      if (cap > CONFIG_FILE_CAP) {
        free(b);
        close(fd);
        return ag__set_error(e, AG_ETOOBIG, -1, "larger than 1 MiB");
      }
      size_t ncap =
          cap * 2 > CONFIG_FILE_CAP + 1 ? CONFIG_FILE_CAP + 1 : cap * 2;
      char *nb = realloc(b, ncap);
      if (nb == NULL) {
        free(b);
        close(fd);
        return ag__set_error(e, AG_ENOMEM, -1, "out of memory");
      }
      b = nb;
      cap = ncap;
    }
    ssize_t r = read(fd, b + n, cap - n);
    if (r < 0 && errno == EINTR)
      continue;
    if (r < 0) {
      int sys = errno;
      char why[128];
      if (strerror_r(sys, why, sizeof(why)) != 0)
        snprintf(why, sizeof(why), "errno %d", sys);
      free(b);
      close(fd);
      ag__set_error(e, AG_EIO, -1, "cannot read: %s", why);
      e->sys_errno = sys;
      return AG_EIO;
    }
    if (r == 0)
      break;
    n += (size_t)r;
  }
  close(fd);
  if (n > CONFIG_FILE_CAP) {
    free(b);
    return ag__set_error(e, AG_ETOOBIG, -1, "larger than 1 MiB");
  }
  *buf = b;
  *len = n;
  return AG_OK;
}

AG_EXTERN ag_err_t ag_config_load_file(ag_config *cfg, const char *path,
                                       ag_error_t *err) {
  if (cfg == NULL || path == NULL)
    return ag__set_error(err, AG_EINVAL, -1,
                         "ag_config_load_file: cfg and path must not be NULL");
  ag_error_t e;
  char *buf = NULL;
  size_t len = 0;
  ag_error_clear(&e);
  ag_err_t rc = read_file(path, &buf, &len, &e);
  if (rc != AG_OK)
    return ag__config_error_from(err, &e, path);
  rc = ag__config_parse_from(cfg, buf, len, path, err);
  free(buf);
  return rc;
}
