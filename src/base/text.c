/*
 * src/base/text.c - strings, UTF-8, JSON type names and HTTP reason phrases:
 * one copy of each for every layer (they used to be written in each file
 * that needed them, with slightly different edge cases and wordings).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

char *ag__strndup(const char *s, size_t n) {
  if (n == SIZE_MAX)
    return NULL;
  char *d = malloc(n + 1);
  if (d != NULL) {
    if (n > 0)
      memcpy(d, s, n);
    d[n] = '\0';
  }
  return d;
}

char *ag__strdup(const char *s) {
  return s != NULL ? ag__strndup(s, strlen(s)) : NULL;
}

size_t ag__utf8_seq(const unsigned char *s, size_t n) {
  unsigned char c = s[0], lo = 0x80, hi = 0xBF;
  size_t len;
  if (c < 0x80)
    return 1;
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0)
      lo = 0xA0; /* overlong */
    else if (c == 0xED)
      hi = 0x9F; /* surrogates */
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0)
      lo = 0x90; /* overlong */
    else if (c == 0xF4)
      hi = 0x8F; /* above U+10FFFF */
  } else {
    return 0;
  }
  if (n < len || s[1] < lo || s[1] > hi)
    return 0;
  for (size_t i = 2; i < len; i++)
    if ((s[i] & 0xC0) != 0x80)
      return 0;
  return len;
}

bool ag__utf8_valid(const char *str, size_t n) {
  const unsigned char *s = (const unsigned char *)str;
  size_t i = 0;
  while (i < n) {
    size_t k = ag__utf8_seq(s + i, n - i);
    if (k == 0)
      return false;
    i += k;
  }
  return true;
}

size_t ag__utf8_back(const char *s, size_t n) {
  while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80)
    n--;
  return n;
}

const char *ag__shown(const char *s, size_t max, char *buf, size_t cap) {
  size_t n = strlen(s), keep = n > max ? ag__utf8_back(s, max) : n;
  if (keep + 4 > cap)
    keep = ag__utf8_back(s, cap > 4 ? cap - 4 : 0);
  size_t j = 0;
  for (size_t i = 0; i < keep; i++)
    buf[j++] = (unsigned char)s[i] < 0x20 || s[i] == 0x7f ? '?' : s[i];
  if (keep < n) {
    memcpy(buf + j, "...", 3);
    j += 3;
  }
  buf[j] = '\0';
  return buf;
}

size_t ag__utf8_incomplete_tail(const char *buf, size_t len) {
  const unsigned char *b = (const unsigned char *)buf;
  size_t back = 0;
  while (back < 4 && back < len && (b[len - 1 - back] & 0xC0) == 0x80)
    back++;
  if (back == len || back == 4)
    return 0; /* no lead byte in reach: not ours to fix */
  unsigned char lead = b[len - 1 - back];
  size_t want = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
  size_t have = back + 1;
  return want > have && lead >= 0xC0 && lead < 0xF8 ? have : 0;
}

const char *ag__json_kind(const json_t *v) {
  if (v == NULL)
    return "nothing";
  switch (json_typeof(v)) {
  case JSON_OBJECT:
    return "object";
  case JSON_ARRAY:
    return "array";
  case JSON_STRING:
    return "string";
  case JSON_INTEGER:
    return "integer";
  case JSON_REAL:
    return "number";
  case JSON_TRUE:
  case JSON_FALSE:
    return "boolean";
  default:
    return "null";
  }
}

const char *ag__http_reason(int status) {
  switch (status) {
  case 400:
    return "Bad Request";
  case 401:
    return "Unauthorized";
  case 402:
    return "Payment Required";
  case 403:
    return "Forbidden";
  case 404:
    return "Not Found";
  case 405:
    return "Method Not Allowed";
  case 408:
    return "Request Timeout";
  case 409:
    return "Conflict";
  case 413:
    return "Content Too Large";
  case 415:
    return "Unsupported Media Type";
  case 422:
    return "Unprocessable Content";
  case 429:
    return "Too Many Requests";
  case 500:
    return "Internal Server Error";
  case 501:
    return "Not Implemented";
  case 502:
    return "Bad Gateway";
  case 503:
    return "Service Unavailable";
  case 504:
    return "Gateway Timeout";
  default:
    break;
  }
  if (status >= 500)
    return "Server Error";
  if (status >= 400)
    return "Client Error";
  return "Unexpected Status";
}
