/*
 * src/exec/output.c - bounded output buffers for tool results and captured
 * subprocess streams.
 *
 * A buffer keeps at most `cap` bytes plus a NUL; whatever comes after is
 * counted in `dropped` and sets `truncated`, never stored. Nothing here ever
 * allocates more than cap + 1 bytes, including ag_output_printf, which
 * formats into the room that is left and only counts the rest.
 *
 * Growth. struct ag_output (internal.h) records no allocation size, so the
 * allocation is a function of the length instead: capacity(len) is the
 * smallest power of two >= len (at least INITIAL), clamped to cap. The
 * buffer is always at least capacity(len) + 1 bytes: it is created with
 * capacity(0) + 1, reallocated to capacity(new_len) + 1 whenever new_len
 * outgrows capacity(len), and reset only lowers len (a smaller capacity()
 * than the real allocation is safe). So most tools, which answer a few
 * hundred bytes, cost a few hundred bytes, not the 1 MiB default cap.
 * Rejected: allocating cap + 1 at init (one 1 MiB allocation per attempt
 * and stream, mostly unused).
 *
 * Out of memory while growing: the bytes that do not fit are dropped and the
 * buffer reads as truncated (the write functions cannot return an error
 * code other than "truncated").
 *
 * Threading: a buffer belongs to one tool attempt; no locking.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define INITIAL 64

static size_t capacity(const ag_output *o, size_t len) {
  if (o->cap <= INITIAL)
    return o->cap;
  size_t c = INITIAL;
  while (c < len && c < o->cap)
    c = c > SIZE_MAX / 2 ? SIZE_MAX : c * 2;
  return c < o->cap ? c : o->cap;
}

/* Makes room for `need` bytes of content (need <= cap). Returns false on
 * ENOMEM (the buffer is unchanged). */
static bool reserve(ag_output *o, size_t need) {
  if (o->buf != NULL && need <= capacity(o, o->len))
    return true;
  size_t c = capacity(o, need);
  char *nb = realloc(o->buf, c + 1);
  if (nb == NULL)
    return false;
  if (o->buf == NULL)
    nb[0] = '\0';
  o->buf = nb;
  return true;
}

static void drop(ag_output *o, size_t n) {
  if (n == 0)
    return;
  o->dropped = n > SIZE_MAX - o->dropped ? SIZE_MAX : o->dropped + n;
  o->truncated = true;
}

ag_err_t ag__output_init(ag_output *o, size_t cap) {
  if (o == NULL)
    return AG_EINVAL;
  memset(o, 0, sizeof(*o));
  o->cap = cap > SIZE_MAX - 1 ? SIZE_MAX - 1 : cap;
  o->transient = -1;
  o->buf = malloc(capacity(o, 0) + 1);
  if (o->buf == NULL)
    return AG_ENOMEM;
  o->buf[0] = '\0';
  return AG_OK;
}

void ag__output_free(ag_output *o) {
  if (o == NULL)
    return;
  free(o->buf);
  memset(o, 0, sizeof(*o));
  o->transient = -1;
}

void ag__output_reset(ag_output *o) {
  if (o == NULL)
    return;
  o->len = 0;
  o->dropped = 0;
  o->truncated = false;
  o->transient = -1;
  if (o->buf != NULL)
    o->buf[0] = '\0';
}

char *ag__output_take(ag_output *o, size_t *len) {
  char *b = o->buf;
  size_t n = o->len;
  if (b == NULL) {
    b = malloc(1);
    if (b == NULL)
      return NULL;
    b[0] = '\0';
    n = 0;
  } else if (capacity(o, n) > n + INITIAL) {
    /* Hand over no more than the text needs; keep the big one on failure. */
    char *shrunk = realloc(b, n + 1);
    if (shrunk != NULL)
      b = shrunk;
  }
  /* Empty: no text, nothing dropped (read truncated before taking). */
  o->buf = NULL;
  o->len = 0;
  o->dropped = 0;
  o->truncated = false;
  if (len != NULL)
    *len = n;
  return b;
}

AG_EXTERN int ag_output_write(ag_output *o, const char *data, size_t len) {
  if (o == NULL)
    return 1;
  if (len == 0 || data == NULL)
    return o->truncated ? 1 : 0;
  size_t room = o->cap - o->len;
  size_t n = len < room ? len : room;
  if (n > 0 && !reserve(o, o->len + n))
    n = 0;
  if (n > 0) {
    memcpy(o->buf + o->len, data, n);
    o->len += n;
    o->buf[o->len] = '\0';
  }
  drop(o, len - n);
  return o->truncated ? 1 : 0;
}

AG_EXTERN int ag_output_printf(ag_output *o, const char *fmt, ...) {
  if (o == NULL || fmt == NULL)
    return 1;
  if (o->buf == NULL && !reserve(o, 0)) {
    va_list ap;
    va_start(ap, fmt);
    int need = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    drop(o, need > 0 ? (size_t)need : 0);
    return 1;
  }
  /* First into the space already allocated; if the text is longer, grow
   * (never past cap) and format again. The part past cap is only counted. */
  size_t avail = capacity(o, o->len) - o->len;
  va_list ap, ap2;
  va_start(ap, fmt);
  va_copy(ap2, ap);
  int need = vsnprintf(o->buf + o->len, avail + 1, fmt, ap);
  va_end(ap);
  if (need < 0) { /* encoding error: nothing written */
    o->buf[o->len] = '\0';
    va_end(ap2);
    return o->truncated ? 1 : 0;
  }
  size_t want = (size_t)need;
  if (want > avail) {
    size_t room = o->cap - o->len;
    size_t fit = want < room ? want : room;
    if (fit > avail && reserve(o, o->len + fit)) {
      vsnprintf(o->buf + o->len, fit + 1, fmt, ap2);
      avail = fit;
    }
    o->len += avail;
    o->buf[o->len] = '\0';
    drop(o, want - avail);
  } else {
    o->len += want;
  }
  va_end(ap2);
  return o->truncated ? 1 : 0;
}

AG_EXTERN void ag_output_set_transient(ag_output *o, bool transient) {
  if (o != NULL)
    o->transient = transient ? 1 : 0;
}
