/*
 * src/core/jcs.c - RFC 8785 JSON Canonicalization Scheme streamed into
 * SHA-256: the call signature of DESIGN.md section 3. This file is pass 1
 * (tokenize and validate), the scratch's life and ag__jcs_prepare; pass 2
 * and the signature are jcs_emit.c, the public one-shot functions
 * jcs_api.c, the order of keys jcs_keys.c, numbers jcs_number.c, the tape
 * as a reader jcs_tape.c, what they share jcs_impl.h. Each pass's per-byte
 * path stays in one file, which the compiler sees whole (the helpers of a
 * pass split across files inlined less: signatures 2-5% slower, bench_jcs);
 * the passes meet once per call.
 *
 * Design. A signature is SHA-256(name ":" JCS(args)). It is computed for
 * every call the guard checks, so this file never builds a document tree and
 * never allocates after ag__jcs_new (jansson parses at ~10 ns/byte, several
 * times the budget of a whole check). Two passes over the argument text:
 *
 *  1. tokenize() validates the text and records a "tape": one 16-byte record
 *     per value or key (offset, length, type, flags; containers also hold the
 *     index just past their subtree). Nesting is tracked on an explicit stack
 *     of max_depth frames, so hostile input cannot recurse; the tape is
 *     capped at max_tokens. Strings are scanned 16 bytes at a time with SSE2
 *     (8 with portable SWAR elsewhere) for the bytes that need attention:
 *     '"', '\\', controls, non-ASCII (validated as UTF-8). A string with
 *     escapes switches to a 64-byte block scanner that finds escaped bytes
 *     with carries rather than a branch per escape. Escapes JCS writes the
 *     same way (\" \\ \b \f \n \r \t) need no rewriting, so such
 *     values are later copied verbatim; only \u and \/ force a rewrite.
 *     Keys with any escape are decoded into a scratch arena, because keys
 *     are compared after decoding. When an object closes, its keys
 *     (collected on a key stack with their first 8 bytes as a sortable
 *     integer) are sorted in UTF-16 code unit order - UTF-8 byte order,
 *     except that lead bytes EE/EF (U+E000..U+FFFF) sort after F0..F4
 *     (supplementary planes, surrogates D800..DFFF in UTF-16). Equal
 *     neighbours are duplicate keys. Keys already in order (checked first)
 *     are not moved; otherwise up to 16 keys whose first 8 bytes differ
 *     are placed by counting, and others go through insertion sort for
 *     short lists, bottom-up merge sort with a preallocated buffer for long
 *     ones (qsort may allocate). A container with no whitespace inside,
 *     keys in order and only canonical members is flagged so that pass 2
 *     copies its text in one piece. Numbers are classified here so that
 *     AG_ENUMBER is found before any output: an integer literal of at most
 *     15 digits, or a plain decimal that is already its own form, is copied
 *     (judged from one 16-byte load); a literal with at most 15 significant
 *     digits and a decimal exponent well inside the normal range is
 *     canonicalized by moving digits around (DBL_DIG = 15: no shorter
 *     decimal maps to the same double; the token keeps where its digits
 *     are, so pass 2 does not read it again); anything else goes through
 *     strtod_l in a "C" locale made once per scratch, and the double is
 *     kept in the token.
 *  2. emit() walks the tape with an explicit stack and writes canonical bytes
 *     into a fixed 4 KiB buffer that is flushed to SHA-256 (or to the
 *     caller's sink) when full; long runs bypass the buffer. Doubles are
 *     printed the ECMAScript way: the shortest of 15, 16, 17 significant
 *     digits that reads back (all lengths for subnormals), laid out as
 *     Number.prototype.toString does.
 *
 * SHA-256: one ag__sha256 context (src/core/sha256.c: allocation-free,
 * unlike OpenSSL 3.0's EVP re-initialisation) is re-initialised per
 * signature, fed name ":" and the canonical text through the output buffer,
 * and finalised.
 *
 * Errors are reported in source order: the first problem in the text wins
 * (a duplicate key found when its object closes is remembered and reported
 * unless an earlier duplicate turns up). Empty argument text (length 0) is
 * treated as the empty object "{}", because models often send "" for tools
 * without parameters; whitespace-only text is invalid JSON. The one-shot
 * public functions size their scratch to the input: no token cap, depth 256.
 *
 * The tape is also a read-only JSON reader for the rest of the library
 * (internal.h, ag__jcs_tape and its accessors, jcs_tape.c):
 * the proxy reads a request's messages from it instead of a jansson tree.
 * Those functions only read what pass 1 wrote; the signature path does
 * not go through them.
 *
 * Threading: an ag__jcs is used by one thread at a time; the public
 * convenience functions create their own and are safe from any thread.
 * Nothing depends on the process locale.
 *
 * Rejected: jansson (too slow, and it cannot report where a duplicate key
 * is); a single pass that sorts while emitting (every key of an object must
 * be known before its first byte is written, and errors must be found before
 * the sink sees anything); recursion (depth would be bounded by the C
 * stack, not by max_depth); hashing through OpenSSL's EVP interface here
 * (on OpenSSL 3.0 every EVP digest re-initialisation allocates; the hash
 * goes through src/core/sha256.c, which uses SHA256_Init/Update/Final and
 * falls back to EVP only where OpenSSL is built without deprecated APIs).
 */
#define _GNU_SOURCE /* strtod_l */
#include "jcs_impl.h"

/* Pass 1: tokenize and validate                                            */
/* ------------------------------------------------------------------------ */

/* Errors are reported in source order: a pending duplicate key is earlier
 * than anything found after it. */
static ag_err_t dup_error(ag__jcs *j, ag_error_t *err) {
  const tok *t = &j->tape[j->dup_tok];
  size_t n;
  const uint8_t *b = key_bytes(j, t, &n);
  char shown[64];
  size_t o = 0, i = 0;
  /* The key as JSON string content, cut at a character boundary. */
  while (i < n) {
    uint8_t c = b[i];
    size_t step = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (o + 7 > sizeof(shown) - 4)
      break;
    if (c < 0x20 || c == '"' || c == '\\' || c == 0x7F)
      o += (size_t)snprintf(shown + o, sizeof(shown) - o, "\\u%04x", c);
    else {
      memcpy(shown + o, b + i, step);
      o += step;
    }
    i += step;
  }
  shown[o] = '\0';
  return ag__set_error(err, AG_EDUPKEY, (long)t->off - 1,
                       "arguments: duplicate key \"%s%s\" at byte %ld", shown,
                       i < n ? "..." : "", (long)t->off - 1);
}

#define FAIL(code, pos, ...)                                                   \
  return (j->dup_tok != NONE                                                   \
              ? dup_error(j, err)                                              \
              : ag__set_error(err, code, (long)(pos), __VA_ARGS__))

/* What scan_string found in a string. */
enum {
  S_ESC = 1,    /* some escape: keys must be decoded to be compared */
  S_REWRITE = 2 /* an escape JCS writes differently (\/ or \u) */
};

/*
 * Block scanner for strings with escapes. Per 64-byte block it builds four
 * bit masks (quotes, backslashes, the letters of canonical escapes, and
 * "attention" bytes: controls and non-ASCII), finds the escaped bytes with
 * carries instead of branches (simdjson's odd-backslash-run trick), and so
 * finds the closing quote without a branch per escape. Only the rarer items
 * get a look each: an escape JCS rewrites (\/, and \u: hex digits and
 * surrogate pairs) and a non-ASCII lead byte (UTF-8 validation). Anything
 * wrong - a control byte, a bad escape or sequence, the end of the input -
 * hands over to the byte scanner in scan_string, which finds the exact error.
 */
#if defined(__SSE2__)
static inline uint64_t mm_bits(__m128i m, int i) {
  return (uint64_t)(uint16_t)_mm_movemask_epi8(m) << (16 * i);
}

static inline void block_masks(const uint8_t *b, uint64_t *q, uint64_t *bs,
                               uint64_t *att, uint64_t *keep) {
  uint64_t mq = 0, mb = 0, ma = 0, mk = 0;
  for (int i = 0; i < 4; i++) {
    __m128i x = _mm_loadu_si128((const __m128i *)(const void *)(b + 16 * i));
    __m128i eq = _mm_cmpeq_epi8(x, _mm_set1_epi8('"'));
    __m128i eb = _mm_cmpeq_epi8(x, _mm_set1_epi8('\\'));
    __m128i k = _mm_or_si128(
        _mm_or_si128(_mm_or_si128(eq, eb),
                     _mm_or_si128(_mm_cmpeq_epi8(x, _mm_set1_epi8('n')),
                                  _mm_cmpeq_epi8(x, _mm_set1_epi8('t')))),
        _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(x, _mm_set1_epi8('r')),
                                  _mm_cmpeq_epi8(x, _mm_set1_epi8('b'))),
                     _mm_cmpeq_epi8(x, _mm_set1_epi8('f'))));
    mq |= mm_bits(eq, i);
    mb |= mm_bits(eb, i);
    mk |= mm_bits(k, i);
    /* signed compare: 0x80..0xFF are negative, so this flags both kinds */
    ma |= mm_bits(_mm_cmplt_epi8(x, _mm_set1_epi8(0x20)), i);
  }
  *q = mq;
  *bs = mb;
  *att = ma;
  *keep = mk;
}
#else
/* Portable: exact per-byte flags in the high bits, gathered by a multiply. */
static inline uint64_t load_le64(const uint8_t *b) {
  uint64_t x = 0;
  for (int i = 7; i >= 0; i--)
    x = (x << 8) | b[i];
  return x;
}

static inline uint64_t gather8(uint64_t m) {
  return ((m >> 7) * 0x0102040810204080ULL) >> 56;
}

static inline uint64_t eq_bytes(uint64_t x, uint8_t c) {
  const uint64_t lo7 = 0x7F7F7F7F7F7F7F7FULL;
  uint64_t t = x ^ (0x0101010101010101ULL * c);
  return ~(((t & lo7) + lo7) | t | lo7);
}

static inline void block_masks(const uint8_t *b, uint64_t *q, uint64_t *bs,
                               uint64_t *att, uint64_t *keep) {
  const uint64_t lo7 = 0x7F7F7F7F7F7F7F7FULL, high = 0x8080808080808080ULL;
  uint64_t mq = 0, mb = 0, ma = 0, mk = 0;
  for (int i = 0; i < 8; i++) {
    uint64_t x = load_le64(b + 8 * i);
    uint64_t eq = eq_bytes(x, '"'), eb = eq_bytes(x, '\\');
    uint64_t k = eq | eb | eq_bytes(x, 'n') | eq_bytes(x, 't') |
                 eq_bytes(x, 'r') | eq_bytes(x, 'b') | eq_bytes(x, 'f');
    mq |= gather8(eq) << (8 * i);
    mb |= gather8(eb) << (8 * i);
    mk |= gather8(k) << (8 * i);
    ma |= gather8((~((x & lo7) + 0x6060606060606060ULL) | x) & high) << (8 * i);
  }
  *q = mq;
  *bs = mb;
  *att = ma;
  *keep = mk;
}
#endif

/*
 * Scans from s[*pp] (an unescaped position inside a string). Returns true
 * and sets *endp at the closing quote when the rest of the string is valid;
 * otherwise returns false with *pp at a position where the byte scanner can
 * resume: the start of the block it could not handle, or the start of the
 * escape or UTF-8 sequence that spills into that block.
 */
static bool scan_block(const uint8_t *s, size_t len, size_t *pp, size_t *endp,
                       int *found) {
  const uint64_t even = 0x5555555555555555ULL;
  uint64_t carry = 0; /* 1 when the block's first byte is escaped */
  unsigned cont = 0;  /* continuation bytes spilled into the block */
  size_t skip_u = 0;  /* the 'u' of a low surrogate already checked */
  size_t p = *pp, resume = *pp;
  uint8_t pad[64];
  for (;;) {
    const uint8_t *b = s + p;
    size_t avail = len - p;
    uint64_t valid = ~0ULL;
    if (avail < 64) {
      if (avail > 0)
        memcpy(pad, b, avail);
      memset(pad + avail, ' ', 64 - avail);
      b = pad;
      valid = (1ULL << avail) - 1;
    }
    uint64_t q, bs, att, keep;
    block_masks(b, &q, &bs, &att, &keep);
    /* escaped = bytes preceded by an odd run of backslashes */
    uint64_t carry_in = carry;
    bs &= ~carry_in;
    uint64_t follows = (bs << 1) | carry_in;
    uint64_t odd_starts = bs & ~even & ~follows;
    uint64_t even_seq = odd_starts + bs;
    carry = even_seq < bs; /* overflow: the last backslash escapes on */
    uint64_t escaped = (even ^ (even_seq << 1)) & follows;

    uint64_t qe = q & ~escaped & valid;
    uint64_t before = qe ? (qe & (0 - qe)) - 1 : valid;
    if (qe == 0 && avail <= 64)
      goto fallback; /* the input ends inside the string */
    uint64_t esc = escaped & before;
    if (esc)
      *found |= S_ESC;
    /* Escapes other than the canonical ones: \u, \/ or invalid. */
    for (uint64_t m = esc & ~keep; m != 0; m &= m - 1) {
      size_t u = p + ctz64(m);
      if (b[u - p] == '/') {
        *found |= S_REWRITE;
        continue;
      }
      if (b[u - p] != 'u')
        goto fallback;
      *found |= S_REWRITE;
      if (u == skip_u)
        continue;
      long cp = hex4_checked(s, len, u + 1);
      if (cp < 0 || (cp >= 0xDC00 && cp <= 0xDFFF))
        goto fallback;
      if (cp >= 0xD800 && cp <= 0xDBFF) {
        long lo = -1;
        if (len - u >= 7 && s[u + 5] == '\\' && s[u + 6] == 'u')
          lo = hex4_checked(s, len, u + 7);
        if (lo < 0xDC00 || lo > 0xDFFF)
          goto fallback;
        skip_u = u + 6;
      }
    }
    /* Controls (errors) and non-ASCII (validated sequence by sequence). */
    uint64_t h = att & before & ~((1ULL << cont) - 1);
    size_t lead = 0;
    cont = 0;
    while (h != 0) {
      unsigned i = ctz64(h);
      size_t n = b[i] >= 0x80 ? ag__utf8_seq(s + p + i, len - p - i) : 0;
      if (n == 0)
        goto fallback;
      if (i + n > 64) {
        cont = (unsigned)(i + n - 64);
        lead = p + i;
        break;
      }
      h &= ~(((1ULL << n) - 1) << i);
    }
    if (qe) {
      *endp = p + ctz64(qe);
      return true;
    }
    p += 64;
    resume = p;
    if (carry)
      resume = p - 1;
    if (cont)
      resume = lead;
    if (skip_u >= p && skip_u - 7 < resume)
      resume = skip_u - 7;
    continue;
  fallback:
    *pp = resume;
    return false;
  }
}

/*
 * Position of the first byte at or after p that is '"', '\\', a control or
 * non-ASCII byte, or len. 16 bytes at a time with SSE2, else 8 with SWAR
 * (borrows only flag bytes above a true hit, so the lowest flag is right).
 */
static inline size_t find_special(const uint8_t *s, size_t len, size_t p) {
#if defined(__SSE2__)
  const __m128i vq = _mm_set1_epi8('"'), vb = _mm_set1_epi8('\\'),
                v20 = _mm_set1_epi8(0x20);
  while (len - p >= 16) {
    __m128i x = _mm_loadu_si128((const __m128i *)(const void *)(s + p));
    __m128i m =
        _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(x, vq), _mm_cmpeq_epi8(x, vb)),
                     _mm_cmplt_epi8(x, v20));
    unsigned bits = (unsigned)_mm_movemask_epi8(m);
    if (bits != 0)
      return p + ctz64(bits);
    p += 16;
  }
  if (p < len && len >= 16) {
    /* The tail: one load ending at len, ignoring the bytes before p. */
    size_t base = len - 16;
    __m128i x = _mm_loadu_si128((const __m128i *)(const void *)(s + base));
    __m128i m =
        _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(x, vq), _mm_cmpeq_epi8(x, vb)),
                     _mm_cmplt_epi8(x, v20));
    unsigned bits = (unsigned)_mm_movemask_epi8(m) >> (p - base);
    return bits != 0 ? p + ctz64(bits) : len;
  }
#endif
  const uint64_t ones = 0x0101010101010101ULL, high = 0x8080808080808080ULL;
  while (len - p >= 8) {
    uint64_t x;
    memcpy(&x, s + p, 8);
    uint64_t xq = x ^ (ones * '"'), xb = x ^ (ones * '\\');
    uint64_t m =
        (((xq - ones) & ~xq) | ((xb - ones) & ~xb) | (x - ones * 0x20) | x) &
        high;
    if (m != 0) {
#if defined(__GNUC__) && defined(__BYTE_ORDER__) &&                            \
    __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
      return p + (ctz64(m) >> 3);
#else
      break;
#endif
    }
    p += 8;
  }
  while (p < len && s[p] != '"' && s[p] != '\\' && s[p] >= 0x20 && s[p] < 0x80)
    p++;
  return p;
}

/*
 * Position of the first byte at or after p that is not an ASCII digit, or
 * len: 8 bytes at a time, so that a number's digits end without the
 * mispredicted loop exit of a byte loop (a dense argument is mostly
 * numbers). A byte below '0' borrows and one above '9' overflows the high
 * bit of its lane; borrows and carries only reach lanes above a non-digit,
 * so the lowest flagged lane is the first non-digit.
 */
static inline size_t digits_end(const uint8_t *s, size_t len, size_t p) {
#if defined(__GNUC__) && defined(__BYTE_ORDER__) &&                            \
    __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
  const uint64_t ones = 0x0101010101010101ULL, high = 0x8080808080808080ULL;
  while (len - p >= 8) {
    uint64_t x;
    memcpy(&x, s + p, 8);
    uint64_t m = ((x - ones * '0') | (x + ones * (0x7f - '9'))) & high;
    if (m != 0)
      return p + (ctz64(m) >> 3);
    p += 8;
  }
#endif
  while (p < len && is_digit(s[p]))
    p++;
  return p;
}

/*
 * The tokenizer's fast path for numbers: the end of the literal at p when
 * it is its own canonical form (F_NUM_COPY), else 0 (parse_number decides,
 * and finds any error). That is a plain integer of at most 15 digits but
 * "-0"; or a plain decimal of at most 15 significant digits whose fraction
 * does not end in '0' and, below 1, starts with at most five zeros (1e-7
 * and below are written with an exponent). Such a literal reads back to
 * the same digits (DBL_DIG is 15) and no shorter digits read to its double,
 * so ECMAScript writes it as it is.
 *
 * With SSE2 a literal that ends within 16 bytes is judged from one load:
 * a few vector and bit operations instead of a scan of the integer digits,
 * a test for '.' and a scan of the fraction one after the other. A number
 * token takes some 140 instructions (callgrind), 3-4 a cycle at
 * bench_jcs's times; attempts that judged more from the same load (an
 * exponent; every test without a branch) executed more and were slower,
 * while one that skipped a dozen of the general path's tests for a number
 * after ',' in an array ran no faster - what bounds this loop is not
 * settled without performance counters (docs/benchmarks.md).
 */
static inline size_t copy_number_end_scalar(const uint8_t *s, size_t len,
                                            size_t p) {
  size_t d0 = p + (s[p] == '-'), e = digits_end(s, len, d0);
  size_t nd = e - d0;
  bool lead = nd >= 1 && (s[d0] != '0' || nd == 1); /* valid, no 0x */
  size_t q = e;
  if (lead && nd <= 15 && e < len && s[e] == '.') {
    size_t f0 = e + 1, z = 0;
    q = digits_end(s, len, f0);
    if (s[d0] == '0')
      while (f0 + z < q && s[f0 + z] == '0')
        z++;
    size_t nf = q - f0, sig = s[d0] == '0' ? nf - z : nd + nf;
    if (nf == 0 || s[q - 1] == '0' || sig > 15 || z > 5)
      lead = false;
  } else if (nd > 15 || (s[p] == '-' && nd == 1 && s[d0] == '0')) {
    lead = false; /* "-0" is written "0" */
  }
  return lead && (q >= len || (s[q] | 0x20) != 'e') ? q : 0;
}

static inline size_t copy_number_end(const uint8_t *s, size_t len, size_t p) {
#if defined(__SSE2__)
  if (len - p >= 16) {
    __m128i x = _mm_loadu_si128((const __m128i *)(const void *)(s + p));
    unsigned dig = (unsigned)_mm_movemask_epi8(
        _mm_and_si128(_mm_cmpgt_epi8(x, _mm_set1_epi8('0' - 1)),
                      _mm_cmplt_epi8(x, _mm_set1_epi8('9' + 1))));
    unsigned dot =
        (unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(x, _mm_set1_epi8('.')));
    unsigned neg = s[p] == '-';
    /* e: past the integer digits; qf: past the fraction's, if a '.' is at
     * e; both 16 when the literal goes on past the load. The rest are
     * byte tests, off that chain. */
    unsigned e = ctz64((~dig & ~neg & 0xFFFF) | 0x10000);
    unsigned qf = ctz64((~dig & ~((2u << e) - 1) & 0xFFFF) | 0x10000);
    bool has_dot = (dot >> e) & 1;
    unsigned q = has_dot ? qf : e;
    if (q >= 16)
      return copy_number_end_scalar(s, len, p);
    const uint8_t *d = s + p + neg;
    unsigned nd = e - neg, nf = qf - e - 1;
    bool z0 = d[0] == '0'; /* the integer part is "0" (or invalid) */
    bool ok =
        nd >= 1 && nd <= 15 && (!z0 || nd == 1) && (s[p + q] | 0x20) != 'e';
    if (has_dot) {
      unsigned z = 0;
      if (z0)
        while (z < nf && d[2 + z] == '0')
          z++;
      unsigned sig = z0 ? nf - z : nd + nf;
      ok = ok && nf >= 1 && s[p + q - 1] != '0' && sig <= 15 && z <= 5;
    } else {
      ok = ok && !(neg && z0); /* "-0" is written "0" */
    }
    return ok ? p + q : 0;
  }
#endif
  return copy_number_end_scalar(s, len, p);
}

/*
 * Scans the string whose opening quote is at q, from p (an unescaped
 * position; the caller has skipped plain bytes). On success sets *endp to
 * the closing quote and *found to S_* bits. \" \\ \b \f \n \r \t are
 * already in canonical form, so a value that has only those is copied
 * verbatim.
 */
static ag_err_t scan_string(ag__jcs *j, size_t q, size_t p, size_t *endp,
                            int *found, ag_error_t *err) {
  const uint8_t *s = j->src;
  const size_t len = j->len;
  size_t block_from = 0;
  int e = 0;
  char cb[8];
  for (;;) {
    p = find_special(s, len, p);
    if (p >= len)
      FAIL(AG_EJSON, len,
           "arguments: unexpected end of input at byte %zu in the string "
           "starting at byte %zu",
           len, q);
    uint8_t c = s[p];
    if (c == '"') {
      *endp = p;
      *found = e;
      return AG_OK;
    }
    if (c == '\\') {
      if (p >= block_from) {
        if (scan_block(s, len, &p, endp, &e)) {
          *found = e;
          return AG_OK;
        }
        block_from = p + 64; /* resume bytewise; retry blocks later */
        continue;
      }
      e |= S_ESC;
      if (len - p < 2)
        FAIL(AG_EJSON, len,
             "arguments: unexpected end of input at byte %zu in the string "
             "starting at byte %zu",
             len, q);
      uint8_t x = s[p + 1];
      if (x == 'n' || x == '"' || x == '\\' || x == 't' || x == 'r' ||
          x == 'b' || x == 'f') {
        p += 2;
        continue;
      }
      e |= S_REWRITE;
      if (x == 'u') {
        long cp = hex4_checked(s, len, p + 2);
        if (cp == -2)
          FAIL(AG_EJSON, len,
               "arguments: unexpected end of input at byte %zu in a \\u "
               "escape",
               len);
        if (cp < 0)
          FAIL(AG_EJSON, p, "arguments: invalid \\u escape at byte %zu", p);
        if (cp >= 0xDC00 && cp <= 0xDFFF)
          FAIL(AG_EUTF8, p,
               "arguments: lone low surrogate \\u%04lx at byte %zu", cp, p);
        if (cp >= 0xD800 && cp <= 0xDBFF) {
          if (len - p >= 8 && s[p + 6] == '\\' && s[p + 7] == 'u') {
            long lo = hex4_checked(s, len, p + 8);
            if (lo == -2)
              FAIL(AG_EJSON, len,
                   "arguments: unexpected end of input at byte %zu in a \\u "
                   "escape",
                   len);
            if (lo < 0)
              FAIL(AG_EJSON, p + 6, "arguments: invalid \\u escape at byte %zu",
                   p + 6);
            if (lo >= 0xDC00 && lo <= 0xDFFF) {
              p += 12;
              continue;
            }
          }
          FAIL(AG_EUTF8, p,
               "arguments: lone high surrogate \\u%04lx at byte %zu", cp, p);
        }
        p += 6;
        continue;
      }
      if (x == '/') {
        p += 2;
        continue;
      }
      FAIL(AG_EJSON, p, "arguments: invalid escape \\%s at byte %zu",
           show_byte(x, cb), p);
    }
    if (c < 0x20)
      FAIL(AG_EJSON, p,
           "arguments: unescaped control character 0x%02x in a string at "
           "byte %zu",
           c, p);
    if (c >= 0x80) {
      size_t n = ag__utf8_seq(s + p, len - p);
      if (n == 0)
        FAIL(AG_EUTF8, p, "arguments: invalid UTF-8 byte 0x%02x at byte %zu", c,
             p);
      p += n;
      continue;
    }
    p++; /* not reached: find_special stops only at the bytes above */
  }
}

/* Decodes the (validated) string content s[a..b), escapes and all, into
 * `o`, which has room for b - a bytes; returns the bytes written. */
size_t ag__jcs_decode_escaped(const uint8_t *s, size_t a, size_t b,
                              uint8_t *o) {
  uint8_t *o0 = o;
  size_t p = a;
  while (p < b) {
    const uint8_t *bs = memchr(s + p, '\\', b - p);
    size_t run = bs ? (size_t)(bs - (s + p)) : b - p;
    memcpy(o, s + p, run);
    o += run;
    p += run;
    if (p < b)
      o += utf8_put(esc_decode(s, &p), o);
  }
  return (size_t)(o - o0);
}

/* Decodes the escaped key content s[a..b) into the arena. */
static void decode_key(ag__jcs *j, tok *t, size_t a, size_t b) {
  size_t n = ag__jcs_decode_escaped(j->src, a, b, j->arena + j->arena_len);
  t->w[1] = (uint32_t)j->arena_len;
  t->w[0] = (uint32_t)n;
  j->arena_len += n;
}

/* Sorts the keys of the object in frame f, checks duplicates, stores the
 * sorted list in `order`. Returns true when the source order was already
 * strictly ascending (sorted, no duplicates). */
static bool close_object(ag__jcs *j, const frame *f, size_t *norder) {
  kent *v = j->keys + f->base;
  size_t n = f->count;
  uint32_t *o = j->order + *norder;
  bool sorted = true;
  for (size_t i = 1; i < n && sorted; i++)
    sorted = kent_cmp(j, &v[i - 1], &v[i]) < 0;
  if (sorted || !ag__jcs_rank_keys(v, n, o)) {
    if (!sorted) {
      ag__jcs_sort_keys(j, v, n);
      for (size_t i = 1; i < n; i++) {
        if (v[i - 1].prefix == v[i].prefix &&
            key_cmp(j, v[i - 1].tok, v[i].tok) == 0 &&
            (j->dup_tok == NONE ||
             j->tape[v[i].tok].off < j->tape[j->dup_tok].off))
          j->dup_tok = v[i].tok;
      }
    }
    for (size_t i = 0; i < n; i++)
      o[i] = v[i].tok;
  }
  j->tape[f->tok].off = (uint32_t)*norder;
  *norder += n;
  return sorted;
}

/*
 * A number the fast path in tokenize() did not take: validated, then
 * classified in the same scan. F_NUM_COPY: an integer of at most 15 digits
 * (but "-0"). F_NUM_TEXT: at most 15 significant digits and a decimal
 * exponent in the safe range: the token keeps where the digits are, so
 * that emit() lays them out without reading the literal again (see tok).
 * Else the double, through strtod_l (F_NUM_DBL).
 */
static ag_err_t parse_number(ag__jcs *j, size_t start, size_t *endp, tok *t,
                             ag_error_t *err) {
  const uint8_t *s = j->src;
  const size_t len = j->len;
  size_t p = start, dot = 0, d0;
  bool neg = s[p] == '-';
  int64_t e = 0;
  p += neg;
  if (p >= len || !is_digit(s[p]))
    FAIL(AG_EJSON, p,
         "arguments: invalid number at byte %zu (expected a digit)", p);
  d0 = p;
  if (s[p] == '0') {
    p++;
    if (p < len && is_digit(s[p]))
      FAIL(AG_EJSON, start, "arguments: number with a leading zero at byte %zu",
           start);
  } else {
    while (p < len && is_digit(s[p]))
      p++;
  }
  size_t int_end = p;
  if (p < len && s[p] == '.') {
    dot = p++;
    if (p >= len || !is_digit(s[p]))
      FAIL(AG_EJSON, p,
           "arguments: invalid number at byte %zu (expected a digit after "
           "'.')",
           p);
    while (p < len && is_digit(s[p]))
      p++;
  }
  size_t dend = p; /* past the last digit of the mantissa */
  if (p < len && (s[p] | 0x20) == 'e') {
    bool eneg = false;
    p++;
    if (p < len) { /* the sign without a branch: which one comes is a
                    * coin toss in a run of numbers (bench_jcs "exps":
                    * 16 KiB 91 -> 73 us) */
      eneg = s[p] == '-';
      p += (size_t)(eneg | (s[p] == '+'));
    }
    if (p >= len || !is_digit(s[p]))
      FAIL(AG_EJSON, p,
           "arguments: invalid number at byte %zu (expected an exponent "
           "digit)",
           p);
    for (; p < len && is_digit(s[p]); p++)
      if (e < NUM_EXP_SATURATE)
        e = e * 10 + (s[p] - '0');
    if (eneg)
      e = -e;
  }
  t->type = T_NUM;
  t->off = (uint32_t)start;
  *endp = p;
  if (dend == int_end && p == dend && int_end - d0 <= 15 &&
      !(neg && s[d0] == '0')) {
    t->flags = F_NUM_COPY;
    t->w[0] = (uint32_t)(p - start);
    return AG_OK;
  }
  /* The significant digits: from the first non-zero one (fs) to the last
   * (ls), the '.' skipped. */
  size_t fs = d0;
  if (s[d0] == '0') {
    fs = dot != 0 ? dot + 1 : dend;
    while (fs < dend && s[fs] == '0')
      fs++;
  }
  t->flags = F_NUM_TEXT;
  if (fs == dend) { /* zero */
    t->w[0] = 0;
    t->spare = 0;
    return AG_OK;
  }
  size_t ls = dend - 1;
  while (s[ls] == '0' || s[ls] == '.')
    ls--;
  bool split = dot > fs && dot < ls;
  size_t k = ls - fs + 1 - split;
  /* zeros before fs are not significant; a "0." before them counts as one
   * integer digit */
  int64_t n = (int64_t)(int_end - d0) -
              (int64_t)(s[d0] == '0' ? fs - d0 - (dot != 0 && fs > dot) : 0) +
              e;
  if (k <= 15 && n >= NUM_TEXT_EXP_MIN && n <= NUM_TEXT_EXP_MAX) {
    t->w[0] = (uint32_t)(fs - start);
    t->w[1] = (uint32_t)(int32_t)n;
    t->spare = (uint16_t)(k | (unsigned)neg << 4 |
                          (split ? (unsigned)(dot - fs) : 0u) << 5);
    return AG_OK;
  }
  /* strtod_l needs a terminated copy; the arena has room: decoded keys so
   * far plus this literal are at most the input length. */
  char *tmp = (char *)j->arena + j->arena_len;
  memcpy(tmp, s + start, p - start);
  tmp[p - start] = '\0';
  /* the "C" locale is made for the first number that needs its double
   * (most texts have none: a guard made per proxy request, its tape, never
   * pays for it) */
  if (j->c_locale == (locale_t)0 &&
      (j->c_locale = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0)) ==
          (locale_t)0)
    FAIL(AG_ENOMEM, start, "arguments: out of memory at byte %zu", start);
  double v = strtod_l(tmp, NULL, j->c_locale);
  if (isinf(v))
    FAIL(AG_ENUMBER, start,
         "arguments: number out of the range of a double at byte %zu", start);
  t->flags = F_NUM_DBL;
  memcpy(t->w, &v, sizeof(v));
  return AG_OK;
}

/* Skips whitespace at p; inside a container, whitespace means its source
 * text is not canonical. */
#define SKIP_WS()                                                              \
  do {                                                                         \
    if (p < len && s[p] <= ' ' && is_ws(s[p])) {                               \
      p = skip_ws(s, len, p);                                                  \
      clean = false;                                                           \
    }                                                                          \
  } while (0)

/* Sizes the token arrays for `cap` tokens (allocation: only when a call has
 * more values than any since the last trim). */
static ag_err_t size_tokens(ag__jcs *j, size_t cap) {
  size_t keys = cap / 2 + 1;
  tok *t = realloc(j->tape, cap * sizeof(tok));
  if (t != NULL)
    j->tape = t;
  kent *k = realloc(j->keys, keys * sizeof(kent));
  if (k != NULL)
    j->keys = k;
  uint32_t *o = realloc(j->order, keys * sizeof(uint32_t));
  if (o != NULL)
    j->order = o;
  kent *a = realloc(j->aux, keys * sizeof(kent));
  if (a != NULL)
    j->aux = a;
  if (t == NULL || k == NULL || o == NULL || a == NULL)
    return AG_ENOMEM; /* the arrays keep at least their old capacity */
  j->cap_tokens = cap;
  j->cap_keys = keys;
  return AG_OK;
}

/* The tape is full at token `nt` (< max_tokens): doubles it. */
static ag_err_t grow_tokens(ag__jcs *j, size_t nt, ag_error_t *err) {
  size_t cap = j->cap_tokens * 2 > nt + 1 ? j->cap_tokens * 2 : nt + 1;
  if (cap > j->max_tokens)
    cap = j->max_tokens;
  if (size_tokens(j, cap) != AG_OK)
    return ag__set_error(err, AG_ENOMEM, -1, "arguments: out of memory");
  return AG_OK;
}

/* Sizes the arena for `cap` bytes; its content does not outlive a call. */
static ag_err_t size_arena(ag__jcs *j, size_t cap) {
  uint8_t *a = calloc(1, cap); /* key_prefix may read past a key */
  if (a == NULL)
    return AG_ENOMEM;
  free(j->arena);
  j->arena = a;
  j->cap_arena = cap;
  return AG_OK;
}

size_t ag__jcs_held(const ag__jcs *j) {
  return sizeof(*j) + j->cap_tokens * sizeof(tok) +
         j->cap_keys * (2 * sizeof(kent) + sizeof(uint32_t)) + j->cap_arena +
         (size_t)j->max_depth * sizeof(frame);
}

void ag__jcs_trim(ag__jcs *j) {
  if (j->cap_tokens > JCS_RETAIN_TOKENS) {
    size_t cap =
        JCS_INITIAL_TOKENS < j->max_tokens ? JCS_INITIAL_TOKENS : j->max_tokens;
    (void)size_tokens(j, cap); /* a shrink that fails keeps the memory */
  }
  if (j->cap_arena > JCS_RETAIN_ARENA)
    (void)size_arena(j, JCS_INITIAL_ARENA);
}

static ag_err_t tokenize(ag__jcs *j, size_t *ntok, ag_error_t *err) {
  const uint8_t *s = j->src;
  const size_t len = j->len;
  const size_t max_tokens = j->max_tokens;
  tok *tape = j->tape;
  size_t p = 0, nt = 0, nkeys = 0, norder = 0, depth = 0;
  frame *f = NULL;
  tok *ct;           /* the container being closed */
  uint32_t start;    /* its first byte */
  bool clean = true; /* the innermost open container is canonical so far */
  ag_err_t rc;
  char cb[8];

  j->arena_len = 0;
  j->dup_tok = NONE;

value:
  SKIP_WS();
  if (p >= len)
    FAIL(AG_EJSON, len,
         "arguments: unexpected end of input at byte %zu (expected a value)",
         len);
  if (nt >= j->cap_tokens) {
    if (nt >= max_tokens)
      FAIL(AG_ETOOBIG, p, "arguments: more than %zu values at byte %zu",
           max_tokens, p);
    if ((rc = grow_tokens(j, nt, err)) != AG_OK)
      return rc;
    tape = j->tape;
  }
  {
    tok *t = &tape[nt];
    uint8_t c = s[p];
    if (c == '"') {
      size_t end = find_special(s, len, p + 1);
      int found = 0;
      if (end >= len || s[end] != '"')
        if ((rc = scan_string(j, p, end, &end, &found, err)) != AG_OK)
          return rc;
      t->type = T_STR;
      t->flags = (found & S_REWRITE) ? F_ESC : 0;
      clean &= !(found & S_REWRITE);
      t->off = (uint32_t)(p + 1);
      t->w[0] = (uint32_t)(end - p - 1);
      p = end + 1;
      nt++;
      goto after;
    }
    if (is_digit(c) || c == '-') {
      size_t q = copy_number_end(s, len, p);
      if (q != 0) {
        t->type = T_NUM;
        t->flags = F_NUM_COPY;
        t->off = (uint32_t)p;
        t->w[0] = (uint32_t)(q - p);
        p = q;
        nt++;
        goto after;
      }
      if ((rc = parse_number(j, p, &p, t, err)) != AG_OK)
        return rc;
      clean &= t->flags == F_NUM_COPY;
      nt++;
      goto after;
    }
    t->flags = 0;
    switch (c) {
    case '{':
    case '[':
      if (depth >= (size_t)j->max_depth)
        FAIL(AG_EDEPTH, p, "arguments: nesting deeper than %d at byte %zu",
             j->max_depth, p);
      t->type = c == '{' ? T_OBJ : T_ARR;
      t->off = (uint32_t)p;
      f = &j->stack[depth++];
      f->tok = (uint32_t)nt++;
      f->count = 0;
      f->base = (uint32_t)nkeys;
      f->obj = c == '{';
      f->clean = clean;
      clean = true;
      p++;
      SKIP_WS();
      if (p < len && s[p] == (f->obj ? '}' : ']')) {
        p++;
        goto close;
      }
      if (f->obj)
        goto key;
      goto value;
    case 't':
    case 'f':
    case 'n': {
      const char *lit = c == 't' ? "true" : c == 'f' ? "false" : "null";
      size_t n = c == 'f' ? 5 : 4;
      if (len - p < n || memcmp(s + p, lit, n) != 0)
        FAIL(AG_EJSON, p,
             "arguments: invalid literal at byte %zu (expected true, false "
             "or null)",
             p);
      t->type = c == 't' ? T_TRUE : c == 'f' ? T_FALSE : T_NULL;
      t->off = (uint32_t)p;
      p += n;
      nt++;
      goto after;
    }
    default:
      FAIL(AG_EJSON, p,
           "arguments: unexpected character %s at byte %zu (expected a "
           "value)",
           show_byte(c, cb), p);
    }
  }

key: /* p is at the expected '"' of a key (whitespace skipped) */
  if (p >= len)
    FAIL(AG_EJSON, len,
         "arguments: unexpected end of input at byte %zu (expected a string "
         "key)",
         len);
  if (s[p] != '"')
    FAIL(AG_EJSON, p,
         "arguments: unexpected character %s at byte %zu (expected a "
         "string key)",
         show_byte(s[p], cb), p);
  if (nt >= j->cap_tokens) {
    if (nt >= max_tokens)
      FAIL(AG_ETOOBIG, p, "arguments: more than %zu values at byte %zu",
           max_tokens, p);
    if ((rc = grow_tokens(j, nt, err)) != AG_OK)
      return rc;
    tape = j->tape;
  }
  {
    tok *t = &tape[nt];
    size_t end = find_special(s, len, p + 1);
    int found = 0;
    if (end >= len || s[end] != '"')
      if ((rc = scan_string(j, p, end, &end, &found, err)) != AG_OK)
        return rc;
    t->type = T_KEY;
    t->flags = (found & S_ESC) ? F_ESC : 0;
    clean &= !(found & S_REWRITE);
    t->off = (uint32_t)(p + 1);
    t->w[0] = (uint32_t)(end - p - 1);
    const uint8_t *kb = s + p + 1, *limit = s + len;
    if (found & S_ESC) {
      decode_key(j, t, p + 1, end);
      kb = j->arena + t->w[1];
      limit = j->arena + j->cap_arena;
    }
    j->keys[nkeys].prefix = key_prefix(kb, t->w[0], limit);
    j->keys[nkeys++].tok = (uint32_t)nt++;
    p = end + 1;
    SKIP_WS();
    if (p >= len)
      FAIL(AG_EJSON, len,
           "arguments: unexpected end of input at byte %zu (expected ':')",
           len);
    if (s[p] != ':')
      FAIL(AG_EJSON, p,
           "arguments: unexpected character %s at byte %zu (expected ':')",
           show_byte(s[p], cb), p);
    p++;
    goto value;
  }

after: /* a value ended at p */
  if (depth == 0) {
    p = skip_ws(s, len, p);
    if (p != len)
      FAIL(AG_EJSON, p,
           "arguments: unexpected character %s at byte %zu after the JSON "
           "value",
           show_byte(s[p], cb), p);
    if (j->dup_tok != NONE)
      return dup_error(j, err);
    *ntok = nt;
    return AG_OK;
  }
  f = &j->stack[depth - 1];
  f->count++;
  SKIP_WS();
  if (p >= len)
    FAIL(AG_EJSON, len,
         "arguments: unexpected end of input at byte %zu (expected ',' or "
         "'%c')",
         len, f->obj ? '}' : ']');
  if (s[p] == ',') {
    p++;
    SKIP_WS();
    if (f->obj)
      goto key;
    goto value;
  }
  if (s[p] == (f->obj ? '}' : ']')) {
    p++;
    goto close;
  }
  FAIL(AG_EJSON, p,
       "arguments: unexpected character %s at byte %zu (expected ',' or "
       "'%c')",
       show_byte(s[p], cb), p, f->obj ? '}' : ']');

close: /* the container of frame f ended just before p */
  ct = &tape[f->tok];
  start = ct->off;
  ct->w[0] = (uint32_t)nt;
  ct->w[1] = f->count;
  if (f->obj) {
    clean &= close_object(j, f, &norder);
    nkeys = f->base;
  }
  if (clean) { /* emit copies s[start..p) */
    ct->flags = F_CANON;
    ct->off = start;
    ct->w[1] = (uint32_t)p;
  }
  depth--;
  clean = clean && f->clean;
  goto after;
}

#undef SKIP_WS

/* ------------------------------------------------------------------------ */
/* Construction                                                             */
/* ------------------------------------------------------------------------ */

ag_err_t ag__jcs_create(ag__jcs **out, size_t max_bytes, size_t max_tokens,
                        int max_depth, bool digest, ag_error_t *err) {
  if (out == NULL)
    return ag__set_error(err, AG_EINVAL, -1, "jcs: out is NULL");
  *out = NULL;
  if (max_bytes > UINT32_MAX - 1 || max_tokens == 0 ||
      max_tokens > UINT32_MAX - 1 || max_tokens > SIZE_MAX / sizeof(tok) ||
      max_depth < 1 || (size_t)max_depth > UINT32_MAX / sizeof(frame))
    return ag__set_error(err, AG_EINVAL, -1,
                         "jcs: invalid limits (bytes %zu, tokens %zu, depth "
                         "%d)",
                         max_bytes, max_tokens, max_depth);
  ag__jcs *j = calloc(1, sizeof(*j));
  if (j == NULL)
    return ag__set_error(err, AG_ENOMEM, -1, "jcs: out of memory");
  j->max_bytes = max_bytes;
  j->max_tokens = max_tokens;
  j->max_depth = max_depth;
  size_t arena =
      max_bytes + 1 < JCS_INITIAL_ARENA ? max_bytes + 1 : JCS_INITIAL_ARENA;
  j->stack = malloc((size_t)max_depth * sizeof(frame));
  if (size_tokens(j, max_tokens < JCS_INITIAL_TOKENS
                         ? max_tokens
                         : JCS_INITIAL_TOKENS) != AG_OK ||
      size_arena(j, arena) != AG_OK || j->stack == NULL) {
    ag__jcs_free(j);
    return ag__set_error(err, AG_ENOMEM, -1, "jcs: out of memory");
  }
  if (digest) {
    ag_err_t rc = ag__sha256_new(&j->sha);
    if (rc != AG_OK) {
      ag__jcs_free(j);
      return ag__set_error(err, rc, -1,
                           rc == AG_ENOMEM
                               ? "jcs: out of memory"
                               : "jcs: cannot set up SHA-256 in OpenSSL");
    }
  }
  *out = j;
  return AG_OK;
}

ag_err_t ag__jcs_new(ag__jcs **out, size_t max_bytes, size_t max_tokens,
                     int max_depth, ag_error_t *err) {
  return ag__jcs_create(out, max_bytes, max_tokens, max_depth, true, err);
}

void ag__jcs_free(ag__jcs *j) {
  if (j == NULL)
    return;
  free(j->tape);
  free(j->keys);
  free(j->order);
  free(j->aux);
  free(j->stack);
  free(j->arena);
  if (j->c_locale != (locale_t)0)
    freelocale(j->c_locale);
  ag__sha256_free(j->sha);
  free(j);
}

/* Pass 1 over args; on success the tape is ready for emit(). */
ag_err_t ag__jcs_prepare(ag__jcs *j, const char *args, size_t args_len,
                         size_t *ntok, ag_error_t *err) {
  if (args == NULL && args_len > 0)
    return ag__set_error(err, AG_EINVAL, -1, "arguments: NULL text");
  if (args_len > j->max_bytes)
    return ag__set_error(err, AG_ETOOBIG, (long)j->max_bytes,
                         "arguments: %zu bytes exceed the limit of %zu",
                         args_len, j->max_bytes);
  /* Decoded keys and a number's text never take more than the input. */
  if (args_len + 1 > j->cap_arena && size_arena(j, args_len + 1) != AG_OK)
    return ag__set_error(err, AG_ENOMEM, -1, "arguments: out of memory");
  j->src = (const uint8_t *)args;
  j->len = args_len;
  j->olen = 0;
  j->stopped = false;
  if (args_len == 0) {
    *ntok = 0;
    return AG_OK;
  }
  return tokenize(j, ntok, err);
}
