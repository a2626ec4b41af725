/*
 * src/core/jcs_impl.h - what the parts of the JCS canonicalizer share (not
 * installed, not API): the tape's record, the scratch, the small helpers
 * and the number forms (static inline: each part keeps its calls inlined).
 *
 *   jcs.c           pass 2 (emit), the scratch's life, the signature and
 *                   the public functions; the design note
 *   jcs_tokenize.c  pass 1: validation, the tape, key order, numbers
 *                   classified
 *   jcs_tape.c      the tape as a read-only JSON reader (internal.h)
 */
#ifndef AG_CORE_JCS_IMPL_H
#define AG_CORE_JCS_IMPL_H

#include <float.h>
#include <locale.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__APPLE__)
#include <xlocale.h>
#endif

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "internal.h"

/* ------------------------------------------------------------------------ */
/* Data structures                                                          */
/* ------------------------------------------------------------------------ */

enum { T_OBJ = 1, T_ARR, T_STR, T_KEY, T_NUM, T_TRUE, T_FALSE, T_NULL };

enum {
  F_ESC = 1,      /* key: has escapes (decoded in the arena); value: has
                     escapes JCS writes differently */
  F_NUM_INT = 2,  /* integer literal of <= 15 digits: copy it */
  F_NUM_TEXT = 4, /* <= 15 significant digits: rearrange the digits */
  F_NUM_DBL = 8,  /* w[] holds the double */
  F_CANON = 16    /* container whose source text is already canonical */
};

/*
 * One tape record. Meaning of the fields by type:
 *   T_STR, T_KEY  off: first content byte (after the quote)
 *                 w[0]: length (keys with F_ESC: decoded length)
 *                 w[1]: keys with F_ESC: offset of the decoded key in arena
 *   T_NUM         off: first byte; w[0]: length, or w[0..1]: the double
 *   T_ARR         off: the '['; w[0]: index past the subtree; w[1]: count,
 *                 or with F_CANON the offset just past the ']'
 *   T_OBJ         off: the '{' until closed, then (without F_CANON) the
 *                 first index of its sorted keys in `order`; w[0], w[1]: as
 *                 T_ARR
 *   literals      off: first byte
 */
typedef struct tok {
  uint32_t off;
  uint32_t w[2];
  uint8_t type;
  uint8_t flags;
  uint16_t spare;
} tok;

/* A key waiting to be sorted: its first bytes in sort order, and its token. */
typedef struct kent {
  uint64_t prefix;
  uint32_t tok;
} kent;

/* A container being parsed (pass 1) or written (pass 2). */
typedef struct frame {
  uint32_t tok;   /* its tape index */
  uint32_t count; /* pass 1: members so far; pass 2: members left */
  uint32_t base;  /* pass 1: key stack base; pass 2: next index in order */
  uint32_t cur;   /* pass 2 arrays: tape index of the next element */
  bool obj;
  bool clean; /* pass 1: the parent's "canonical so far" while this is open */
} frame;

#define OBUF_SIZE 4096
#define NONE UINT32_MAX

/*
 * Scratch grows with the arguments it meets, up to the limits, and shrinks
 * back (ag__jcs_trim): a fresh scratch holds JCS_INITIAL_TOKENS tokens and
 * JCS_INITIAL_ARENA bytes of arena (about 12 KiB in all); capacity up to the
 * RETAIN sizes is kept, so ordinary calls allocate nothing once warm, and a
 * larger call's memory is returned at the next trim.
 */
#define JCS_INITIAL_TOKENS 256
#define JCS_INITIAL_ARENA 2048
#define JCS_RETAIN_TOKENS 1024
#define JCS_RETAIN_ARENA 8192

struct ag__jcs {
  size_t max_bytes;
  size_t max_tokens;
  int max_depth;
  size_t cap_tokens; /* tape entries allocated (<= max_tokens) */
  size_t cap_keys;   /* keys can be at most half of the tokens, plus one */
  size_t cap_arena;  /* arena bytes allocated */

  tok *tape;
  kent *keys;      /* key stack of the open objects */
  uint32_t *order; /* sorted keys of every closed object, back to back */
  kent *aux;       /* merge sort buffer */
  frame *stack;
  uint8_t *arena; /* decoded keys; number text for strtod_l */

  /* per call */
  const uint8_t *src;
  size_t len;
  size_t arena_len;
  uint32_t dup_tok; /* pending duplicate key (the second one), or NONE */

  locale_t c_locale;
  ag__sha256 *sha; /* NULL for scratch made only to canonicalize */

  ag__sink_fn sink; /* NULL: feed ctx */
  void *user;
  bool stopped; /* the sink asked to stop */
  size_t olen;
  char obuf[OBUF_SIZE + 32]; /* slack for fixed-size copies */
};

/* ------------------------------------------------------------------------ */
/* Small helpers                                                            */
/* ------------------------------------------------------------------------ */

static inline bool is_digit(uint8_t c) {
  return (uint8_t)(c - '0') < 10;
}

static inline bool is_ws(uint8_t c) {
  return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}

static inline unsigned ctz64(uint64_t m) {
#if defined(__GNUC__)
  return (unsigned)__builtin_ctzll(m);
#else
  unsigned n = 0;
  while (!(m & 1)) {
    m >>= 1;
    n++;
  }
  return n;
#endif
}

static inline size_t skip_ws(const uint8_t *s, size_t len, size_t p) {
  while (p < len && s[p] <= ' ' && is_ws(s[p]))
    p++;
  return p;
}

static inline int hexval(uint8_t c) {
  if (is_digit(c))
    return c - '0';
  c |= 0x20;
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  return -1;
}

/* Four hex digits at s[0..4) (caller checked they exist); -1 if invalid. */
static inline long hex4(const uint8_t *s) {
  long v = 0;
  for (int i = 0; i < 4; i++) {
    int h = hexval(s[i]);
    if (h < 0)
      return -1;
    v = v * 16 + h;
  }
  return v;
}

/* As hex4 for s[p..p+4) of a text of `len` bytes: -1 if a digit is not hex,
 * -2 if the text ends first. */
static inline long hex4_checked(const uint8_t *s, size_t len, size_t p) {
  long v = 0;
  for (size_t i = 0; i < 4; i++) {
    if (p + i >= len)
      return -2;
    int h = hexval(s[p + i]);
    if (h < 0)
      return -1;
    v = v * 16 + h;
  }
  return v;
}

static inline size_t utf8_put(uint32_t cp, uint8_t *o) {
  if (cp < 0x80) {
    o[0] = (uint8_t)cp;
    return 1;
  }
  if (cp < 0x800) {
    o[0] = (uint8_t)(0xC0 | (cp >> 6));
    o[1] = (uint8_t)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    o[0] = (uint8_t)(0xE0 | (cp >> 12));
    o[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    o[2] = (uint8_t)(0x80 | (cp & 0x3F));
    return 3;
  }
  o[0] = (uint8_t)(0xF0 | (cp >> 18));
  o[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
  o[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
  o[3] = (uint8_t)(0x80 | (cp & 0x3F));
  return 4;
}

/*
 * Decodes the escape at s[*p] == '\\' of a string validated by pass 1;
 * advances *p past it and returns the code point.
 */
static inline uint32_t esc_decode(const uint8_t *s, size_t *p) {
  uint8_t c = s[*p + 1];
  switch (c) {
  case 'b':
    *p += 2;
    return 0x08;
  case 'f':
    *p += 2;
    return 0x0C;
  case 'n':
    *p += 2;
    return 0x0A;
  case 'r':
    *p += 2;
    return 0x0D;
  case 't':
    *p += 2;
    return 0x09;
  case 'u': {
    uint32_t cp = (uint32_t)hex4(s + *p + 2);
    *p += 6;
    if (cp >= 0xD800 && cp <= 0xDBFF) {
      uint32_t lo = (uint32_t)hex4(s + *p + 2);
      *p += 6;
      cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
    }
    return cp;
  }
  default: /* '"', '\\', '/' */
    *p += 2;
    return c;
  }
}

/* A byte for an error message: 'c' when printable ASCII, else 0xNN. */
static inline const char *show_byte(uint8_t c, char buf[8]) {
  if (c > 0x20 && c < 0x7F && c != '\'')
    snprintf(buf, 8, "'%c'", c);
  else
    snprintf(buf, 8, "0x%02x", c);
  return buf;
}

/* ------------------------------------------------------------------------ */
/* Numbers                                                                  */
/* ------------------------------------------------------------------------ */

/* Decimal exponents for which 15 significant digits always round-trip. */
#define TEXT_EXP_MIN (-300)
#define TEXT_EXP_MAX 300
#define EXP_SATURATE 1000000000000000LL

/*
 * For a validated number literal s[0..len): when it has at most 15
 * significant digits and a decimal exponent in the safe range (or is zero),
 * sets d[0..*k) to its significant digits without trailing zeros, *n so that
 * the value is 0.d * 10^n, *neg, and returns true (*k == 0 for zero).
 * Returns false when the double has to be computed.
 */
static inline bool num_text(const uint8_t *s, size_t len, char d[15], int *k,
                            long *n, bool *neg) {
  size_t i = 0;
  int64_t int_digits = 0, lz = 0, sig = 0, last = 0;
  bool seen = false;
  *neg = false;
  if (s[0] == '-') {
    *neg = true;
    i = 1;
  }
  for (bool frac = false;; i++) {
    if (i < len && s[i] == '.' && !frac) {
      frac = true;
      continue;
    }
    if (i >= len || !is_digit(s[i]))
      break;
    uint8_t c = s[i];
    if (!frac)
      int_digits++;
    if (!seen) {
      if (c == '0') {
        lz++;
        continue;
      }
      seen = true;
    }
    if (sig < 15)
      d[sig] = (char)c;
    else if (c != '0')
      return false;
    sig++;
    if (c != '0')
      last = sig;
  }
  int64_t e = 0;
  if (i < len && (s[i] | 0x20) == 'e') {
    bool eneg = false;
    i++;
    if (s[i] == '+' || s[i] == '-') {
      eneg = s[i] == '-';
      i++;
    }
    for (; i < len && is_digit(s[i]); i++)
      if (e < EXP_SATURATE)
        e = e * 10 + (s[i] - '0');
    if (eneg)
      e = -e;
  }
  if (!seen) {
    *k = 0;
    *n = 0;
    return true;
  }
  int64_t nn = int_digits - lz + e;
  if (nn < TEXT_EXP_MIN || nn > TEXT_EXP_MAX)
    return false;
  *k = (int)last;
  *n = (long)nn;
  return true;
}

/*
 * Lays out k significant digits d with exponent n (value 0.d * 10^n) as
 * ECMAScript's Number.prototype.toString does. `o` needs 32 bytes.
 */
static inline size_t num_layout(char *o, bool neg, const char *d, int k,
                                long n) {
  char *p = o;
  if (k == 0) {
    o[0] = '0';
    return 1;
  }
  if (neg)
    *p++ = '-';
  if (k <= n && n <= 21) {
    memcpy(p, d, (size_t)k);
    p += k;
    memset(p, '0', (size_t)(n - k));
    p += n - k;
  } else if (0 < n && n <= 21) {
    memcpy(p, d, (size_t)n);
    p += n;
    *p++ = '.';
    memcpy(p, d + n, (size_t)(k - n));
    p += k - n;
  } else if (-6 < n && n <= 0) {
    *p++ = '0';
    *p++ = '.';
    memset(p, '0', (size_t)-n);
    p += -n;
    memcpy(p, d, (size_t)k);
    p += k;
  } else {
    long e = n - 1;
    *p++ = d[0];
    if (k > 1) {
      *p++ = '.';
      memcpy(p, d + 1, (size_t)(k - 1));
      p += k - 1;
    }
    *p++ = 'e';
    *p++ = e < 0 ? '-' : '+';
    if (e < 0)
      e = -e;
    char tmp[8];
    int t = 0;
    do {
      tmp[t++] = (char)('0' + e % 10);
      e /= 10;
    } while (e > 0);
    while (t > 0)
      *p++ = tmp[--t];
  }
  return (size_t)(p - o);
}

/*
 * The ECMAScript text of a finite double into o[32]: the fewest significant
 * digits (15 with trailing zeros dropped, else 16, else 17) whose correctly
 * rounded decimal reads back as v. printf's decimal point depends on the
 * process locale, so only its digits and exponent are used; the round-trip
 * check builds its own text and reads it with strtod_l in the "C" locale.
 */
static inline size_t num_double(const ag__jcs *j, double v, char *o) {
  if (v == 0)
    return num_layout(o, false, "", 0, 0);
  char buf[64], d[17], rt[40];
  int k = 0;
  long ex = 0;
  /* A normal double's shortest form has at most 15 digits exactly when its
   * 15-digit rounding reads back; subnormals carry fewer digits, so for them
   * every length is tried. */
  int first = fabs(v) < DBL_MIN ? 0 : 14;
  for (int prec = first; prec <= 16; prec++) {
    snprintf(buf, sizeof(buf), "%.*e", prec, v);
    k = 0;
    const char *p = buf;
    while (*p && *p != 'e' && *p != 'E') {
      if (is_digit((uint8_t)*p) && k < 17)
        d[k++] = *p;
      p++;
    }
    ex = (*p) ? strtol(p + 1, NULL, 10) : 0;
    if (prec == 16)
      break;
    int r = snprintf(rt, sizeof(rt), "%s%.*se%ld", v < 0 ? "-" : "", k, d,
                     ex - (k - 1));
    if (r > 0 && (size_t)r < sizeof(rt) && strtod_l(rt, NULL, j->c_locale) == v)
      break;
  }
  while (k > 1 && d[k - 1] == '0')
    k--;
  return num_layout(o, v < 0, d, k, ex + 1);
}

/* ---- shared between the parts ------------------------------------------ */

/* Pass 1 (jcs_tokenize.c): j->src[0..j->len) validated into the tape;
 * *ntok its records. */
ag_err_t ag__jcs_tokenize(ag__jcs *j, size_t *ntok, ag_error_t *err);
/* The scratch sized for `cap` tokens / arena bytes (jcs_tokenize.c). */
ag_err_t ag__jcs_size_tokens(ag__jcs *j, size_t cap);
ag_err_t ag__jcs_size_arena(ag__jcs *j, size_t cap);
/* A scratch (jcs.c): `digest` with a SHA-256 context, for signatures. */
ag_err_t ag__jcs_create(ag__jcs **out, size_t max_bytes, size_t max_tokens,
                        int max_depth, bool digest, ag_error_t *err);
/* args[0..args_len) as j's text, tokenized (jcs.c; "" is "{}"). */
ag_err_t ag__jcs_prepare(ag__jcs *j, const char *args, size_t args_len,
                         size_t *ntok, ag_error_t *err);
/* The escaped source s[a..b) decoded into o; its length. */
size_t ag__jcs_decode_escaped(const uint8_t *s, size_t a, size_t b, uint8_t *o);

#endif /* AG_CORE_JCS_IMPL_H */
