/*
 * src/core/jcs_tape.c - the JCS tokenizer's tape as a read-only JSON reader
 * (internal.h: ag__jcs_tape and its accessors): the wire layer, the proxy
 * and the audit read requests and runs from it instead of a jansson tree.
 * It only reads what pass 1 (jcs.c) wrote; the signature path does not
 * come here.
 */
#define _GNU_SOURCE /* memmem */
#include "jcs_impl.h"

_Static_assert((int)T_OBJ == (int)AG__JT_OBJ && (int)T_ARR == (int)AG__JT_ARR &&
                   (int)T_STR == (int)AG__JT_STR &&
                   (int)T_KEY == (int)AG__JT_KEY &&
                   (int)T_NUM == (int)AG__JT_NUM &&
                   (int)T_TRUE == (int)AG__JT_TRUE &&
                   (int)T_FALSE == (int)AG__JT_FALSE &&
                   (int)T_NULL == (int)AG__JT_NULL,
               "the tape's token types are internal.h's");

ag_err_t ag__jcs_tape_new(ag__jcs **out, size_t max_bytes, int max_depth,
                          ag_error_t *err) {
  if (max_bytes > UINT32_MAX - 2)
    return ag__set_error(err, AG_ETOOBIG, (long)(UINT32_MAX - 2),
                         "json: %zu bytes exceed the limit of %lu", max_bytes,
                         (unsigned long)(UINT32_MAX - 2));
  return ag__jcs_create(out, max_bytes, max_bytes + 1, max_depth, false, err);
}

ag_err_t ag__jcs_tape(ag__jcs *j, const char *text, size_t len,
                      size_t *n_tokens, ag_error_t *err) {
  if (j == NULL || n_tokens == NULL || (text == NULL && len > 0))
    return ag__set_error(err, AG_EINVAL, -1, "json: invalid argument");
  *n_tokens = 0;
  if (len == 0) /* not the "{}" of empty arguments: no JSON at all */
    return ag__set_error(err, AG_EJSON, 0, "json: empty text");
  return ag__jcs_prepare(j, text, len, n_tokens, err);
}

int ag__jcs_tok_type(const ag__jcs *j, size_t i) {
  return j->tape[i].type;
}

size_t ag__jcs_tok_next(const ag__jcs *j, size_t i) {
  const tok *t = &j->tape[i];
  return t->type == T_OBJ || t->type == T_ARR ? t->w[0] : i + 1;
}

size_t ag__jcs_tok_off(const ag__jcs *j, size_t i) {
  return j->tape[i].off;
}

bool ag__jcs_key_is(const ag__jcs *j, size_t i, const char *s, size_t n) {
  const tok *t = &j->tape[i];
  if (t->w[0] != n)
    return false;
  const uint8_t *k = t->flags & F_ESC ? j->arena + t->w[1] : j->src + t->off;
  return memcmp(k, s, n) == 0;
}

/* The raw content of the string token t (keys with escapes included: their
 * w[0] is the decoded length, so the closing quote is looked for). */
static size_t raw_len(const ag__jcs *j, const tok *t) {
  if (t->type == T_STR || !(t->flags & F_ESC))
    return t->w[0];
  size_t p = t->off;
  while (j->src[p] != '"')
    p += j->src[p] == '\\' ? 2 : 1;
  return p - t->off;
}

size_t ag__jcs_str_raw(const ag__jcs *j, size_t i, const char **s) {
  const tok *t = &j->tape[i];
  *s = (const char *)j->src + t->off;
  return raw_len(j, t);
}

bool ag__jcs_str_escaped(const ag__jcs *j, size_t i) {
  const tok *t = &j->tape[i];
  if (t->flags & F_ESC)
    return true;
  return memchr(j->src + t->off, '\\', raw_len(j, t)) != NULL;
}

size_t ag__jcs_str_decode(const ag__jcs *j, size_t i, char *out) {
  const tok *t = &j->tape[i];
  size_t n = ag__jcs_decode_escaped(j->src, t->off, t->off + raw_len(j, t),
                                    (uint8_t *)out);
  out[n] = '\0';
  return n;
}

size_t ag__jcs_get(const ag__jcs *j, size_t obj, const char *key) {
  if (ag__jcs_tok_type(j, obj) != AG__JT_OBJ)
    return 0;
  size_t n = strlen(key), end = ag__jcs_tok_next(j, obj);
  for (size_t i = obj + 1; i < end; i = ag__jcs_tok_next(j, i + 1))
    if (ag__jcs_key_is(j, i, key, n))
      return i + 1;
  return 0;
}

bool ag__jcs_jansson_safe(const ag__jcs *j, size_t n) {
  const char *s = (const char *)j->src;
  size_t len = j->len;
  /* "\u0000" has a '\\': most texts have none, found by a vector scan */
  if (memchr(s, '\\', len) != NULL && memmem(s, len, "\\u0000", 6) != NULL)
    return false;
  for (size_t i = 0; i < n; i++) {
    if (ag__jcs_tok_type(j, i) != AG__JT_NUM)
      continue;
    size_t p = ag__jcs_tok_off(j, i), d;
    p += s[p] == '-';
    for (d = 0; p + d < len && s[p + d] >= '0' && s[p + d] <= '9';)
      d++;
    if (d > 18 &&
        (p + d >= len || (s[p + d] != '.' && (s[p + d] | 0x20) != 'e')))
      return false;
  }
  return true;
}

bool ag__jcs_as_jansson_writes(const ag__jcs *j, size_t v, const char *s,
                               size_t n) {
  for (size_t k = v, end = ag__jcs_tok_next(j, v); k < end; k++) {
    const tok *t = &j->tape[k];
    if (t->type == T_NUM || (t->type == T_STR && (t->flags & F_ESC)) ||
        (t->type == T_KEY && ag__jcs_str_escaped(j, k)))
      return false;
  }
  bool in = false; /* inside a string: whitespace there is its own */
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (in) {
      if (c == '\\')
        i++;
      else if (c == '"')
        in = false;
    } else if (c == '"') {
      in = true;
    } else if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      return false;
    }
  }
  return true;
}

size_t ag__jcs_member_span(const ag__jcs *j, size_t key, size_t *start) {
  const tok *k = &j->tape[key];
  const uint8_t *s = j->src;
  size_t p = skip_ws(s, j->len, k->off + raw_len(j, k) + 1); /* at ':' */
  p = skip_ws(s, j->len, p + 1);
  *start = p;
  const tok *v = &j->tape[key + 1];
  switch (v->type) {
  case T_STR:
    return v->w[0] + 2;
  case T_TRUE:
  case T_NULL:
    return 4;
  case T_FALSE:
    return 5;
  default:
    break;
  }
  /* a number or a container: scanned to its end (the text is valid) */
  size_t q = p;
  int depth = 0;
  do {
    uint8_t c = s[q];
    if (c == '"') {
      q++;
      while (s[q] != '"')
        q += s[q] == '\\' ? 2 : 1;
    } else if (c == '{' || c == '[') {
      depth++;
    } else if (c == '}' || c == ']') {
      depth--;
    } else if (v->type == T_NUM) {
      while (q < j->len && (is_digit(s[q]) || s[q] == '-' || s[q] == '+' ||
                            s[q] == '.' || (s[q] | 0x20) == 'e'))
        q++;
      return q - p;
    }
    q++;
  } while (depth > 0);
  return q - p;
}
