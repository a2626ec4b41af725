/*
 * src/base/buf.c - the one capped growable buffer (curl's dynbuf): every
 * append checks the cap, so no text built with it grows past what its
 * owner said. A heap buffer doubles its allocation up to cap + 1 bytes; a
 * fixed one writes into the caller's array (error messages, stack text).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define BUF_MIN_ALLOC 64

void ag__buf_init(ag__buf *b, size_t cap) {
  memset(b, 0, sizeof(*b));
  b->cap = cap < SIZE_MAX / 2 ? cap : SIZE_MAX / 2;
}

void ag__buf_init_fixed(ag__buf *b, char *storage, size_t size) {
  memset(b, 0, sizeof(*b));
  b->p = storage;
  b->alloc = size;
  b->cap = size > 0 ? size - 1 : 0;
  b->fixed = true;
  if (size > 0)
    storage[0] = '\0';
}

/* Room for `need` content bytes plus the NUL; need <= cap. */
static ag_err_t reserve(ag__buf *b, size_t need) {
  if (b->alloc > need)
    return AG_OK;
  if (b->fixed)
    return AG_ETOOBIG;
  size_t a = b->alloc > 0 ? b->alloc : BUF_MIN_ALLOC;
  if (a > b->cap + 1)
    a = b->cap + 1;
  while (a <= need)
    a = a > (b->cap + 1) / 2 ? b->cap + 1 : a * 2;
  char *p = realloc(b->p, a);
  if (p == NULL)
    return AG_ENOMEM;
  b->p = p;
  b->alloc = a;
  return AG_OK;
}

ag_err_t ag__buf_reserve(ag__buf *b, size_t n) {
  return reserve(b, n < b->cap ? n : b->cap);
}

ag_err_t ag__buf_add(ag__buf *b, const void *s, size_t n) {
  if (n > b->cap - b->len) {
    b->cut = true;
    return AG_ETOOBIG;
  }
  ag_err_t rc = reserve(b, b->len + n);
  if (rc != AG_OK)
    return rc;
  if (n > 0)
    memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = '\0';
  return AG_OK;
}

ag_err_t ag__buf_addstr(ag__buf *b, const char *s) {
  return ag__buf_add(b, s, strlen(s));
}

void ag__buf_add_cut(ag__buf *b, const char *s, size_t n) {
  b->want = n > SIZE_MAX - b->want ? SIZE_MAX : b->want + n;
  if (b->cut)
    return; /* the text stays a prefix of what was asked for */
  size_t room = b->cap - b->len;
  if (n > room) {
    /* s[room] exists since n > room: back off to a character start */
    n = ag__utf8_back(s, room);
    b->cut = true;
  }
  if (n == 0 || reserve(b, b->len + n) != AG_OK) {
    b->cut = b->cut || n > 0;
    return;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = '\0';
}

void ag__buf_addstr_cut(ag__buf *b, const char *s) {
  ag__buf_add_cut(b, s, strlen(s));
}

void ag__buf_addc_cut(ag__buf *b, char c) {
  ag__buf_add_cut(b, &c, 1);
}

void ag__buf_vprintf_cut(ag__buf *b, const char *fmt, va_list ap) {
  char tmp[AG_ERROR_MSG_MAX];
  int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
  if (n < 0)
    return;
  size_t len = (size_t)n;
  if (len >= sizeof(tmp)) {
    /* vsnprintf cut it: drop a character it split, count the rest */
    len = sizeof(tmp) - 1;
    len -= ag__utf8_incomplete_tail(tmp, len);
    ag__buf_add_cut(b, tmp, len);
    b->cut = true;
    b->want += (size_t)n - len;
    return;
  }
  ag__buf_add_cut(b, tmp, len);
}

void ag__buf_printf_cut(ag__buf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  ag__buf_vprintf_cut(b, fmt, ap);
  va_end(ap);
}

const char *ag__buf_str(const ag__buf *b) {
  return b->p != NULL ? b->p : "";
}

void ag__buf_reset(ag__buf *b) {
  b->len = 0;
  b->want = 0;
  b->cut = false;
  if (b->p != NULL && b->alloc > 0)
    b->p[0] = '\0';
}

void ag__buf_free(ag__buf *b) {
  if (b->fixed) {
    ag__buf_reset(b);
    return;
  }
  free(b->p);
  b->p = NULL;
  b->len = b->alloc = b->want = 0;
  b->cut = false;
}
