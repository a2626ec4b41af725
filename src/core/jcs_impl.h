/*
 * src/core/jcs_impl.h - what the parts of the JCS canonicalizer share (not
 * installed, not API; jcs.c's note says the design):
 *
 *   jcs.c         pass 1 (tokenize and validate), the scratch's life,
 *                 ag__jcs_prepare: its per-byte path in one file, so that
 *                 the compiler sees it whole
 *   jcs_emit.c    pass 2 (the canonical bytes), ag__jcs_signature and
 *                 ag__jcs_write: the same for its per-byte path
 *   jcs_api.c     the public one-shot functions (ag_signature & co.)
 *   jcs_keys.c    the order of an object's keys (UTF-16 code units)
 *   jcs_number.c  numbers in their canonical form (ECMAScript's)
 *   jcs_tape.c    the tape as a read-only JSON reader (internal.h)
 *   jcs_impl.h    the tape's record, the scratch, the small helpers
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
  F_NUM_COPY = 2, /* its own canonical form: copied as it is */
  F_NUM_TEXT = 4, /* <= 15 significant digits: rearrange the digits */
  F_NUM_DBL = 8,  /* w[] holds the double */
  F_CANON = 16    /* container whose source text is already canonical */
};

/*
 * One tape record. Meaning of the fields by type:
 *   T_STR, T_KEY  off: first content byte (after the quote)
 *                 w[0]: length (keys with F_ESC: decoded length)
 *                 w[1]: keys with F_ESC: offset of the decoded key in arena
 *   T_NUM         off: first byte; F_NUM_COPY: w[0] the length; F_NUM_TEXT:
 *                 w[0] the first significant digit's offset from off, w[1]
 *                 the exponent n (int32) of the value 0.d * 10^n, spare the
 *                 number of digits k (bits 0-3, 0 for zero), the sign (bit
 *                 4) and the place of a '.' among the digits (bits 5-9, 0:
 *                 none); F_NUM_DBL: w[0..1] the double
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

  locale_t c_locale; /* (locale_t)0 until a number needs strtod_l */
  ag__sha256 *sha;   /* NULL for scratch made only to canonicalize */

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
/* Key order: UTF-16 code units                                             */
/* ------------------------------------------------------------------------ */
static inline const uint8_t *key_bytes(const ag__jcs *j, const tok *t,
                                       size_t *n) {
  *n = t->w[0];
  if (t->flags & F_ESC)
    return j->arena + t->w[1];
  return j->src + t->off;
}

/* Rank of a byte: UTF-8 byte order with the lead bytes EE/EF moved past
 * F0..F4 (to F5/F6, which never occur in UTF-8). */
static inline uint8_t key_rank(uint8_t c) {
  return (c == 0xEE || c == 0xEF) ? (uint8_t)(c + 7) : c;
}

/* The first 8 bytes of a key, ranked, as a big-endian number (zero padded):
 * different prefixes order the keys; equal ones need key_cmp. `limit` is the
 * end of the buffer holding the key: reading up to it is allowed. */
static inline uint64_t key_prefix(const uint8_t *b, size_t n,
                                  const uint8_t *limit) {
  uint64_t x = 0;
  if (limit - b >= 8) {
    /* One load, then drop the bytes past the key (no byte loop, and no
     * store-to-load stall through a stack buffer). */
#if defined(__GNUC__) && defined(__BYTE_ORDER__) &&                            \
    __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    memcpy(&x, b, 8);
    x = __builtin_bswap64(x);
#else
    for (int i = 0; i < 8; i++)
      x = x << 8 | b[i];
#endif
    if (n < 8)
      x = n == 0 ? 0 : x & ~(~0ULL >> (8 * n));
  } else {
    for (size_t i = 0; i < 8; i++)
      x = x << 8 | (i < n ? b[i] : 0);
  }
  if (x & 0x8080808080808080ULL) {
    uint64_t y = 0;
    for (int i = 7; i >= 0; i--)
      y = y << 8 | key_rank((uint8_t)(x >> (8 * i)));
    x = y;
  }
  return x;
}

static inline int key_cmp(const ag__jcs *j, uint32_t ia, uint32_t ib) {
  size_t na, nb;
  const uint8_t *a = key_bytes(j, &j->tape[ia], &na);
  const uint8_t *b = key_bytes(j, &j->tape[ib], &nb);
  size_t n = na < nb ? na : nb;
  size_t i = 0;
  while (i + 8 <= n) {
    uint64_t x, y;
    memcpy(&x, a + i, 8);
    memcpy(&y, b + i, 8);
    if (x != y)
      break;
    i += 8;
  }
  for (; i < n; i++) {
    if (a[i] != b[i])
      return key_rank(a[i]) < key_rank(b[i]) ? -1 : 1;
  }
  return na < nb ? -1 : (na > nb ? 1 : 0);
}

static inline int kent_cmp(const ag__jcs *j, const kent *a, const kent *b) {
  if (a->prefix != b->prefix)
    return a->prefix < b->prefix ? -1 : 1;
  return key_cmp(j, a->tok, b->tok);
}

/* ---- between the parts -------------------------------------------------- */

/* An object's keys v[0..n) sorted, stable (jcs_keys.c). */
void ag__jcs_sort_keys(const ag__jcs *j, kent *v, size_t n);
/* The tokens of an object's keys v[0..n), in order, into o[0..n): only when
 * n is small and no two keys share their first 8 bytes, which then order
 * them and rule out duplicates; false otherwise (nothing written). */
bool ag__jcs_rank_keys(const kent *v, size_t n, uint32_t *o);

/* Numbers (jcs_number.c). A literal of at most 15 significant digits is
 * rearranged when its decimal exponent is in this range (its double is
 * never needed); exponents are read up to the saturation value. */
#define NUM_TEXT_EXP_MIN (-300)
#define NUM_TEXT_EXP_MAX 300
#define NUM_EXP_SATURATE 1000000000000000LL
/* Room for a number's digits (laid out with fixed-size copies, so more than
 * the 17 the longest has) and for its canonical text. */
#define NUM_DIGITS_BUF 32
#define NUM_TEXT_BUF 64
/* 0.d[0..k) * 10^n (negative with neg) laid out as ECMAScript's
 * Number.prototype.toString does, into o[NUM_TEXT_BUF]; its length. d must
 * have NUM_DIGITS_BUF bytes (only the first k are read as digits). */
size_t ag__jcs_num_layout(char *o, bool neg, const char *d, int k, long n);
/* A double as ECMAScript writes it: the shortest of 15, 16, 17 significant
 * digits that reads back; its length in o. */
size_t ag__jcs_num_double(const ag__jcs *j, double v, char *o);

/* A scratch (jcs.c): `digest` with a SHA-256 context, for signatures. */
ag_err_t ag__jcs_create(ag__jcs **out, size_t max_bytes, size_t max_tokens,
                        int max_depth, bool digest, ag_error_t *err);
/* args[0..args_len) as j's text, tokenized (pass 1; "" is "{}"). */
ag_err_t ag__jcs_prepare(ag__jcs *j, const char *args, size_t args_len,
                         size_t *ntok, ag_error_t *err);
/* The escaped source s[a..b) decoded into o; its length. */
size_t ag__jcs_decode_escaped(const uint8_t *s, size_t a, size_t b, uint8_t *o);

#endif /* AG_CORE_JCS_IMPL_H */
