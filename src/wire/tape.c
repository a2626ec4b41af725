/*
 * src/wire/tape.c - a request read from the JCS tokenizer's tape
 * (src/core/jcs.c) instead of a jansson tree (wire.h: ag__wtape).
 *
 * jansson builds a tree at about 60 MB/s here: 1.2 ms for a 500-message
 * (76 KB) request, more than the whole decision may take. The tokenizer
 * validates the same text and writes a flat tape several times faster, so
 * the proxy reads its requests from the tape: the shapes' turn readers
 * (tape_turn in chat.c and messages.c) walk it with these helpers and
 * decode the strings they keep into the tape's one buffer.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/internal.h"
#include "wire.h"

size_t ag__wt_get(const ag__wtape *t, size_t obj, const char *key) {
  return ag__jcs_get(t->j, obj, key);
}

bool ag__wt_int(const ag__wtape *t, size_t i, long long *v) {
  if (!ag__wt_is(t, i, AG__JT_NUM))
    return false;
  size_t off = ag__jcs_tok_off(t->j, i), e = off;
  while (e < t->len && t->s[e] != '\0' &&
         strchr("+-0123456789.eE", t->s[e]) != NULL)
    e++;
  char num[24];
  if (e - off >= sizeof num || memchr(t->s + off, '.', e - off) != NULL ||
      memchr(t->s + off, 'e', e - off) != NULL ||
      memchr(t->s + off, 'E', e - off) != NULL)
    return false;
  memcpy(num, t->s + off, e - off);
  num[e - off] = '\0';
  *v = strtoll(num, NULL, 10); /* in range: ag__jcs_jansson_safe */
  return true;
}

bool ag__wt_full(ag__asm *a, const char *s) {
  if (s == NULL && a->failed == AG_OK)
    a->failed = AG_ENOMEM;
  return true;
}

bool ag__wt_is(const ag__wtape *t, size_t i, int type) {
  return i != 0 && ag__jcs_tok_type(t->j, i) == type;
}

const char *ag__wt_str(ag__wtape *t, size_t i, size_t *len) {
  if (!ag__wt_is(t, i, AG__JT_STR))
    return NULL;
  const char *raw;
  size_t n = ag__jcs_str_raw(t->j, i, &raw);
  if (t->cap - t->used < n + 1)
    return NULL;
  char *o = t->buf + t->used;
  if (ag__jcs_str_escaped(t->j, i)) {
    n = ag__jcs_str_decode(t->j, i, o);
  } else {
    memcpy(o, raw, n);
    o[n] = '\0';
  }
  t->used += n + 1;
  if (len != NULL)
    *len = n;
  return o;
}

/* A decoded byte takes at most 6 bytes of source ("\u0061"), so a string
 * whose source is longer than 6 x 20 cannot be equal to one of 20. */
bool ag__wt_eq(const ag__wtape *t, size_t i, const char *lit) {
  if (!ag__wt_is(t, i, AG__JT_STR))
    return false;
  const char *raw;
  size_t n = ag__jcs_str_raw(t->j, i, &raw), l = strlen(lit);
  if (!ag__jcs_str_escaped(t->j, i))
    return n == l && memcmp(raw, lit, l) == 0;
  char tmp[6 * 20 + 1];
  return n < sizeof tmp && ag__jcs_str_decode(t->j, i, tmp) == l &&
         memcmp(tmp, lit, l) == 0;
}

size_t ag__wt_count(const ag__wtape *t, size_t arr) {
  if (!ag__wt_is(t, arr, AG__JT_ARR))
    return 0;
  size_t n = 0, end = ag__jcs_tok_next(t->j, arr);
  for (size_t i = arr + 1; i < end; i = ag__jcs_tok_next(t->j, i))
    n++;
  return n;
}

/* The "text" strings of the parts from token `first` to `end` (strings
 * themselves too with `bare`), joined by '\n' in the buffer. */
static const char *join_texts(ag__wtape *t, size_t first, size_t end, bool bare,
                              size_t *len) {
  char *out = t->buf + t->used;
  size_t n = 0;
  for (size_t p = first; p < end; p = ag__jcs_tok_next(t->j, p)) {
    size_t tx =
        bare && ag__wt_is(t, p, AG__JT_STR) ? p : ag__wt_get(t, p, "text");
    if (!ag__wt_is(t, tx, AG__JT_STR))
      continue;  /* images, audio, tool blocks: no text to judge */
    if (n++ > 0) /* the separator takes the previous string's NUL */
      t->buf[t->used - 1] = '\n';
    if (ag__wt_str(t, tx, NULL) == NULL)
      return NULL;
  }
  if (n == 0) {
    if (t->used >= t->cap)
      return NULL;
    t->buf[t->used++] = '\0';
  }
  *len = (size_t)(t->buf + t->used - 1 - out);
  return out;
}

const char *ag__wt_blocks_text(ag__wtape *t, size_t c, size_t *len) {
  *len = 0;
  if (ag__wt_is(t, c, AG__JT_STR))
    return ag__wt_str(t, c, len);
  if (!ag__wt_is(t, c, AG__JT_ARR))
    return join_texts(t, 0, 0, false, len);
  return join_texts(t, c + 1, ag__jcs_tok_next(t->j, c), false, len);
}

const char *ag__wt_parts_text(ag__wtape *t, size_t c, size_t *len) {
  *len = 0;
  if (c == 0 || ag__wt_is(t, c, AG__JT_NULL))
    return "";
  if (ag__wt_is(t, c, AG__JT_STR))
    return ag__wt_str(t, c, len);
  if (ag__wt_is(t, c, AG__JT_OBJ))
    return join_texts(t, c, c + 1, true, len);
  if (ag__wt_is(t, c, AG__JT_ARR))
    return join_texts(t, c + 1, ag__jcs_tok_next(t->j, c), true, len);
  return NULL;
}
