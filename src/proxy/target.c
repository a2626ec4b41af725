/*
 * src/proxy/target.c - the request-target, checked and normalised
 * (target.h says what and why).
 *
 * Two passes over at most the target's length: the path's escapes are
 * decoded or checked into `out`, then its segments are rewritten in place
 * (the result only ever shrinks), then the query is checked and copied.
 * No allocation.
 */
#include "target.h"

#include <string.h>

static int hexval(unsigned char c) {
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

/* RFC 3986 unreserved: ALPHA / DIGIT / "-" / "." / "_" / "~" */
static bool unreserved(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (c >= '0' && c <= '9') || c == '-' || c == '.' || c == '_' || c == '~';
}

/* pchar without pct-encoded, plus "/": what a path may hold literally */
static bool path_char(unsigned char c) {
  return unreserved(c) || strchr("!$&'()*+,;=:@/", c) != NULL;
}

/* A "%XX" at s: its value, or -1 when the two hex digits are not there. */
static int escape_at(const char *s) {
  int hi = hexval((unsigned char)s[1]);
  int lo = hi < 0 ? -1 : hexval((unsigned char)s[2]);
  return lo < 0 ? -1 : hi * 16 + lo;
}

/* An escape decoded in the path: an unreserved character, or ':' - which a
 * path may hold as it is, and which Google's APIs (and servers that decode
 * a path before routing) read as the method's separator in
 * ".../models/{model}:generateContent": kept encoded, "%3A" would be a
 * path the guard does not match that the upstream routes as one it does. */
static bool decoded_in_path(unsigned char c) {
  return unreserved(c) || c == ':';
}

/* Pass 1: the path (up to '?' or the end) into out, escapes decoded where
 * decoded_in_path says, checked everywhere. Returns its length, or -1 with
 * *why. */
static long decode_path(const char *t, size_t n, char *out, const char **why) {
  static const char hex[] = "0123456789ABCDEF";
  size_t o = 0;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)t[i];
    if (c != '%') {
      if (c == 0 || !path_char(c)) {
        *why = c == '#'    ? "the request-target has a fragment ('#')"
               : c == '\\' ? "the path holds a '\\'"
                           : "the path holds a character that a URL may "
                             "not (a space, a control or non-ASCII byte, or "
                             "one of \"<>^`{|})";
        return -1;
      }
      out[o++] = (char)c;
      continue;
    }
    int v = escape_at(t + i);
    if (v < 0) {
      *why = "the path holds a '%' without two hex digits after it";
      return -1;
    }
    if (v == '/' || v == '\\' || v < 0x20 || v == 0x7f) {
      *why = "the path holds an encoded '/', '\\' or control character "
             "(%2F, %5C, %00-%1F, %7F)";
      return -1;
    }
    i += 2;
    if (decoded_in_path((unsigned char)v)) {
      out[o++] = (char)v;
    } else {
      out[o++] = '%';
      out[o++] = hex[v >> 4];
      out[o++] = hex[v & 15];
    }
  }
  return (long)o;
}

/* Pass 2: dot segments removed and runs of '/' merged, in place on
 * p[0..n) (which starts with '/'). Returns the new length, or -1 with
 * *why for a ".." above the root. */
static long remove_dots(char *p, size_t n, const char **why) {
  size_t o = 0; /* the output, p[0..o): "" or "/seg/seg" */
  size_t i = 0;
  bool trailing = false;
  while (i < n) {
    /* p[i] is '/': the segment is p[s..e) */
    size_t s = i + 1, e = s;
    while (e < n && p[e] != '/')
      e++;
    size_t len = e - s;
    bool last = e >= n;
    i = e;
    if (len == 0 || (len == 1 && p[s] == '.')) {
      trailing = last;
      continue;
    }
    if (len == 2 && p[s] == '.' && p[s + 1] == '.') {
      if (o == 0) {
        *why = "the path's \"..\" goes above the root";
        return -1;
      }
      while (o > 0 && p[o - 1] != '/')
        o--;
      o--; /* the '/' before the segment */
      trailing = last;
      continue;
    }
    p[o++] = '/';
    memmove(p + o, p + s, len);
    o += len;
    trailing = false;
  }
  if (o == 0 || trailing)
    p[o++] = '/';
  return (long)o;
}

bool ag__target_normalise(const char *target, char *out, size_t cap,
                          const char **why) {
  static const char *no_why;
  if (why == NULL)
    why = &no_why;
  size_t tl = target != NULL ? strlen(target) : 0;
  if (out == NULL || cap < tl + 1) {
    *why = "the request-target is too long";
    return false;
  }
  if (tl == 0 || target[0] != '/') {
    *why = "the request-target must be a path starting with '/' "
           "(origin-form): no host, no absolute URL, no '*'";
    return false;
  }
  if (target[1] == '/') {
    *why = "the request-target starts with \"//\" (a host, not a path)";
    return false;
  }
  size_t pl = strcspn(target, "?");
  long n = decode_path(target, pl, out, why);
  if (n < 0)
    return false;
  n = remove_dots(out, (size_t)n, why);
  if (n < 0)
    return false;
  size_t o = (size_t)n;
  if (target[pl] == '?') {
    out[o++] = '?';
    for (size_t i = pl + 1; i < tl; i++) {
      unsigned char c = (unsigned char)target[i];
      if (c == '%' && escape_at(target + i) < 0) {
        *why = "the query holds a '%' without two hex digits after it";
        return false;
      }
      if (c != '%' && c != '?' && !path_char(c)) {
        *why = "the query holds a character that a URL may not (a space, "
               "'#', a control or non-ASCII byte, or one of \"<>\\^`{|})";
        return false;
      }
      out[o++] = (char)c;
    }
  }
  out[o] = '\0';
  return true;
}
