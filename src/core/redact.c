/*
 * src/core/redact.c - hides credentials in texts that leave agentguard:
 * events, timelines, provider error messages (docs/security.md#secrets).
 *
 * What is a credential here. Three kinds, chosen because they are what
 * actually leaks from agent runs:
 *   - the value of an environment variable whose name ends in _KEY,
 *     _TOKEN, _SECRET or _PASSWORD (OPENAI_API_KEY, GITHUB_TOKEN, ...),
 *     when the value is at least AG__SECRET_MIN bytes long (a value like
 *     "1" or "true" is not a secret, and hiding every "1" would wreck the
 *     text); also a prefix of such a value of that length that ends the
 *     text, since a capped output can cut a key in half;
 *   - "Bearer <token>" (an Authorization header pasted into an error), the
 *     token being at least 8 of [A-Za-z0-9-._~+/=];
 *   - "sk-" followed by at least 16 of [A-Za-z0-9_-] at the start of a word
 *     (OpenAI and Anthropic API keys).
 * Each is replaced by "[REDACTED]" ("Bearer [REDACTED]" keeps the word).
 * Not caught: a credential in any other shape that is not in the
 * environment (a password typed into a prompt, a key in a file a tool
 * prints), an encoded one (base64, URL-escaped), one split across texts.
 *
 * Shape. Pure functions over caller-owned buffers: the secret values come
 * in as an argument (ag__secrets_from_env reads them from an envp the
 * caller passes, normally `environ`), the output goes into a caller-sized
 * buffer with snprintf's contract. Every replaced span is at least 8 bytes
 * and the mark 10, so the output is at most len + len / 4 + 2 bytes
 * (ag__redact_bound). One pass; at each byte only a 256-bit table of the
 * bytes that can start a match is looked at, so a text with nothing to hide
 * costs one table lookup per byte (plus a compare of each secret whose
 * first byte matches).
 *
 * Rejected: regular expressions (a dependency and an allocation for three
 * fixed shapes); redacting in place (the mark can be longer than an 8-byte
 * value).
 *
 * Thread-safety: no state; safe from any thread.
 */
#include <string.h>

#include "internal.h"

#define MARK "[REDACTED]"
#define MARK_LEN (sizeof(MARK) - 1)
#define BEARER_MIN 8
#define SK_MIN 16

static char lower(char c) {
  return c >= 'A' && c <= 'Z' ? (char)(c - 'A' + 'a') : c;
}

static bool alnum(char c) {
  return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') ||
         (c >= 'A' && c <= 'Z');
}

static bool ends_with_ci(const char *s, size_t len, const char *suffix) {
  size_t n = strlen(suffix);
  if (len < n)
    return false;
  for (size_t i = 0; i < n; i++)
    if (lower(s[len - n + i]) != lower(suffix[i]))
      return false;
  return true;
}

bool ag__secret_name(const char *name, size_t len) {
  static const char *const suffixes[] = {"_KEY", "_TOKEN", "_SECRET",
                                         "_PASSWORD"};
  for (size_t i = 0; i < sizeof(suffixes) / sizeof(suffixes[0]); i++)
    if (ends_with_ci(name, len, suffixes[i]))
      return true;
  return false;
}

size_t ag__secrets_from_env(char *const *envp, ag__secret *out, size_t cap) {
  size_t n = 0;
  for (size_t i = 0; envp != NULL && envp[i] != NULL && n < cap; i++) {
    const char *eq = strchr(envp[i], '=');
    if (eq == NULL || !ag__secret_name(envp[i], (size_t)(eq - envp[i])))
      continue;
    size_t vl = strlen(eq + 1);
    if (vl < AG__SECRET_MIN)
      continue;
    out[n].s = eq + 1;
    out[n].len = vl;
    n++;
  }
  return n;
}

size_t ag__redact_bound(size_t len) {
  size_t extra = len / 4 + 2;
  return len > SIZE_MAX - extra - 1 ? SIZE_MAX : len + extra + 1;
}

static bool bearer_char(char c) {
  return alnum(c) || c == '-' || c == '.' || c == '_' || c == '~' || c == '+' ||
         c == '/' || c == '=';
}

static bool sk_char(char c) {
  return alnum(c) || c == '-' || c == '_';
}

/*
 * Length of the credential that starts at in[i], and *keep: how many of
 * its first bytes stay visible ("Bearer "); 0 when none starts there.
 */
static size_t match_at(const char *in, size_t len, size_t i,
                       const ag__secret *secrets, size_t n, size_t *keep) {
  *keep = 0;
  size_t rest = len - i;
  size_t best = 0;
  for (size_t k = 0; k < n; k++) {
    const ag__secret *s = &secrets[k];
    if (s->len < AG__SECRET_MIN || in[i] != s->s[0])
      continue;
    if (rest >= s->len) {
      if (s->len > best && memcmp(in + i, s->s, s->len) == 0)
        best = s->len;
    } else if (rest >= AG__SECRET_MIN && rest > best &&
               memcmp(in + i, s->s, rest) == 0) {
      best = rest; /* the text ends inside the secret */
    }
  }
  if (best > 0)
    return best;
  bool word_start =
      i == 0 || !(alnum(in[i - 1]) || in[i - 1] == '_' || in[i - 1] == '-');
  if (!word_start)
    return 0;
  if (rest > 3 && in[i] == 's' && in[i + 1] == 'k' && in[i + 2] == '-') {
    size_t j = i + 3;
    while (j < len && sk_char(in[j]))
      j++;
    if (j - (i + 3) >= SK_MIN)
      return j - i;
  }
  static const char bearer[] = "bearer";
  if (rest > 6 && lower(in[i]) == 'b') {
    size_t k = 1;
    while (k < 6 && lower(in[i + k]) == bearer[k])
      k++;
    if (k == 6) {
      size_t j = i + 6;
      while (j < len && (in[j] == ' ' || in[j] == '\t'))
        j++;
      size_t t = j;
      while (t < len && bearer_char(in[t]))
        t++;
      if (j > i + 6 && t - j >= BEARER_MIN) {
        *keep = j - i;
        return t - i;
      }
    }
  }
  return 0;
}

/* Bytes that can start a match: each secret's first byte, 's', 'b', 'B'. */
static void starts_table(const ag__secret *secrets, size_t n,
                         unsigned char table[32]) {
  memset(table, 0, 32);
  const unsigned char fixed[] = {'s', 'b', 'B'};
  for (size_t i = 0; i < sizeof(fixed); i++)
    table[fixed[i] >> 3] |= (unsigned char)(1u << (fixed[i] & 7));
  for (size_t k = 0; k < n; k++) {
    if (secrets[k].len < AG__SECRET_MIN)
      continue;
    unsigned char c = (unsigned char)secrets[k].s[0];
    table[c >> 3] |= (unsigned char)(1u << (c & 7));
  }
}

static bool may_start(const unsigned char table[32], char c) {
  unsigned char u = (unsigned char)c;
  return (table[u >> 3] >> (u & 7)) & 1u;
}

bool ag__redact_needed(const char *in, size_t len, const ag__secret *secrets,
                       size_t n) {
  if (in == NULL)
    return false;
  unsigned char table[32];
  starts_table(secrets, n, table);
  for (size_t i = 0; i < len; i++) {
    size_t keep;
    if (may_start(table, in[i]) && match_at(in, len, i, secrets, n, &keep) > 0)
      return true;
  }
  return false;
}

/* Appends data to out[0..cap) at *o (counting past cap, like snprintf). */
static void put(char *out, size_t cap, size_t *o, const char *data, size_t n) {
  if (*o < cap) {
    size_t room = cap - *o;
    memcpy(out + *o, data, n < room ? n : room);
  }
  *o = n > SIZE_MAX - *o ? SIZE_MAX : *o + n;
}

size_t ag__redact(const char *in, size_t len, const ag__secret *secrets,
                  size_t n, char *out, size_t cap) {
  size_t o = 0;
  if (in == NULL)
    len = 0;
  unsigned char table[32];
  starts_table(secrets, n, table);
  size_t plain = 0; /* start of the bytes not yet copied */
  for (size_t i = 0; i < len;) {
    size_t keep, m = 0;
    if (may_start(table, in[i]))
      m = match_at(in, len, i, secrets, n, &keep);
    if (m == 0) {
      i++;
      continue;
    }
    put(out, cap, &o, in + plain, i + keep - plain);
    put(out, cap, &o, MARK, MARK_LEN);
    i += m;
    plain = i;
  }
  put(out, cap, &o, in + plain, len - plain);
  if (cap > 0)
    out[o < cap ? o : cap - 1] = '\0';
  return o;
}
