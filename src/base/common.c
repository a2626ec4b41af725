/*
 * src/base/common.c - version, error table, error details, ag_free, and
 * the error helpers every layer uses (ag__set_error, ag__scopy,
 * ag__opts_read).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

AG_EXTERN const char *ag_version(void) {
  return AG_VERSION_STRING;
}

AG_EXTERN int ag_version_number(void) {
  return AG_VERSION_NUMBER;
}

static const char *const err_msgs[] = {
#define X(name, msg) msg,
    AG_ERRNO_MAP(X)
#undef X
};

static const char *const err_names[] = {
#define X(name, msg) #name,
    AG_ERRNO_MAP(X)
#undef X
};

AG_EXTERN const char *ag_strerror(ag_err_t code) {
  if ((int)code < 0 || code >= AG_E__COUNT)
    return "unknown error code";
  return err_msgs[code];
}

AG_EXTERN const char *ag_err_name(ag_err_t code) {
  if ((int)code < 0 || code >= AG_E__COUNT)
    return "UNKNOWN";
  return err_names[code];
}

AG_EXTERN void ag_error_clear(ag_error_t *err) {
  if (err == NULL)
    return;
  memset(err, 0, sizeof(*err));
  err->pos = -1;
}

AG_EXTERN void ag_free(void *p) {
  free(p);
}

ag_err_t ag__set_error(ag_error_t *err, ag_err_t code, long pos,
                       const char *fmt, ...) {
  if (err == NULL)
    return code;
  ag_error_clear(err);
  err->code = code;
  err->pos = pos;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
  va_end(ap);
  return code;
}

ag_err_t ag__opts_read(void *dst, size_t dst_size, const void *src,
                       size_t min_size, const char *what, ag_error_t *err) {
  size_t n;
  memcpy(&n, src, sizeof(n));
  /* an options struct is a few KiB; a larger size is garbage (the struct
   * was never initialised), and reading that far could fault */
  if (n < min_size || n > AG__OPTS_SIZE_MAX)
    return ag__set_error(err, AG_EINVAL, -1,
                         "%s: size is %zu, expected %zu..%d (fill the "
                         "struct with its _init function first)",
                         what, n, min_size, AG__OPTS_SIZE_MAX);
  const unsigned char *extra = (const unsigned char *)src;
  for (size_t i = dst_size; i < n; i++)
    if (extra[i] != 0)
      return ag__set_error(err, AG_EINVAL, -1,
                           "%s: byte %zu is set, past the %zu bytes this "
                           "library version knows (a newer header's field)",
                           what, i, dst_size);
  memcpy(dst, src, n < dst_size ? n : dst_size);
  memcpy(dst, &dst_size, sizeof(dst_size));
  return AG_OK;
}

size_t ag__scopy(char *dst, size_t cap, const char *src) {
  if (cap == 0)
    return 0;
  size_t n = strlen(src);
  if (n >= cap)
    n = cap - 1;
  memcpy(dst, src, n);
  dst[n] = '\0';
  return n;
}
