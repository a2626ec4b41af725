/*
 * src/core/jcs.c - RFC 8785 JSON Canonicalization Scheme streamed into
 * SHA-256: the call signature of DESIGN.md section 3. In parts: pass 1 in
 * jcs_tokenize.c, pass 2 (emit) and the public functions here, the tape as
 * a reader in jcs_tape.c, what they share in jcs_impl.h.
 *
 * Design. A signature is SHA-256(name ":" JCS(args)). It is computed for
 * every call the guard checks, so this file never builds a document tree and
 * never allocates after ag__jcs_new (jansson parses at ~10 ns/byte, several
 * times the budget of a whole check). Two passes over the argument text:
 *
 *  1. ag__jcs_tokenize() validates the text and records a "tape": one 16-byte
 * record per value or key (offset, length, type, flags; containers also hold
 * the index just past their subtree). Nesting is tracked on an explicit stack
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
 *     are not moved; otherwise insertion sort for short lists, bottom-up
 *     merge sort with a preallocated buffer for long ones (qsort may
 *     allocate). A container with no whitespace inside, keys in order and
 *     only canonical members is flagged so that pass 2 copies its text in
 *     one piece. Numbers are classified here so that AG_ENUMBER is found
 *     before any output: an integer literal of at most 15 digits is its own
 *     canonical form; a literal with at most 15 significant digits and a
 *     decimal exponent well inside the normal range is canonicalized by
 *     moving digits around (DBL_DIG = 15: no shorter decimal maps to the
 *     same double); anything else goes through strtod_l in a "C" locale
 *     made once per scratch, and the double is kept in the token.
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

/* ------------------------------------------------------------------------ */
/* Pass 2: emit                                                             */
/* ------------------------------------------------------------------------ */

static void deliver(ag__jcs *j, const void *data, size_t n) {
  if (j->stopped || n == 0)
    return;
  if (j->sink == NULL) {
    ag__sha256_update(j->sha, data, n);
  } else if (j->sink(j->user, data, n) != 0) {
    j->stopped = true;
  }
}

static void flush(ag__jcs *j) {
  deliver(j, j->obuf, j->olen);
  j->olen = 0;
}

static void put_slow(ag__jcs *j, const void *d, size_t n) {
  flush(j);
  if (n >= OBUF_SIZE / 2) {
    deliver(j, d, n);
  } else {
    memcpy(j->obuf, d, n);
    j->olen = n;
  }
}

static inline void put(ag__jcs *j, const void *d, size_t n) {
  if (n <= OBUF_SIZE - j->olen) {
    memcpy(j->obuf + j->olen, d, n);
    j->olen += n;
  } else {
    put_slow(j, d, n);
  }
}

static inline void put1(ag__jcs *j, char c) {
  if (j->olen == OBUF_SIZE)
    flush(j);
  j->obuf[j->olen++] = c;
}

/* Writes code point cp of a string with JCS's minimal escaping. */
static void put_cp(ag__jcs *j, uint32_t cp) {
  static const char hex[] = "0123456789abcdef";
  char b[8];
  switch (cp) {
  case '"':
    put(j, "\\\"", 2);
    return;
  case '\\':
    put(j, "\\\\", 2);
    return;
  case 0x08:
    put(j, "\\b", 2);
    return;
  case 0x09:
    put(j, "\\t", 2);
    return;
  case 0x0A:
    put(j, "\\n", 2);
    return;
  case 0x0C:
    put(j, "\\f", 2);
    return;
  case 0x0D:
    put(j, "\\r", 2);
    return;
  default:
    break;
  }
  if (cp < 0x20) {
    memcpy(b, "\\u00", 4);
    b[4] = hex[cp >> 4];
    b[5] = hex[cp & 15];
    put(j, b, 6);
    return;
  }
  put(j, b, utf8_put(cp, (uint8_t *)b));
}

/* A string with escapes, straight from the (validated) source. Escapes that
 * are already canonical stay in the copied runs; \u and \/ are rewritten. */
static void put_src_escaped(ag__jcs *j, const uint8_t *s, size_t a, size_t b) {
  size_t p = a, run = a;
  while (p < b) {
    const uint8_t *bs = memchr(s + p, '\\', b - p);
    if (bs == NULL)
      break;
    p = (size_t)(bs - s);
    if (s[p + 1] != 'u' && s[p + 1] != '/') {
      p += 2;
      continue;
    }
    put(j, s + run, p - run);
    put_cp(j, esc_decode(s, &p));
    run = p;
  }
  put(j, s + run, b - run);
}

/* A decoded string (a key from the arena): escape what JCS escapes. */
static void put_decoded(ag__jcs *j, const uint8_t *s, size_t n) {
  size_t run = 0;
  for (size_t i = 0; i < n; i++) {
    uint8_t c = s[i];
    if (c < 0x20 || c == '"' || c == '\\') {
      put(j, s + run, i - run);
      put_cp(j, c);
      run = i + 1;
    }
  }
  put(j, s + run, n - run);
}

static void put_string_slow(ag__jcs *j, const tok *t) {
  put1(j, '"');
  if (!(t->flags & F_ESC))
    put(j, j->src + t->off, t->w[0]);
  else if (t->type == T_KEY)
    put_decoded(j, j->arena + t->w[1], t->w[0]);
  else
    put_src_escaped(j, j->src, t->off, t->off + t->w[0]);
  put1(j, '"');
}

static inline void put_string(ag__jcs *j, const tok *t) {
  size_t n = t->w[0];
  if (!(t->flags & F_ESC) && n + 2 <= OBUF_SIZE - j->olen) {
    const uint8_t *b = j->src + t->off;
    char *o = j->obuf + j->olen;
    o[0] = '"';
    /* Short strings: one fixed 16-byte copy (obuf has slack past
     * OBUF_SIZE) instead of a call to memcpy, when the source allows. */
    if (n <= 16 && j->len - t->off >= 16)
      memcpy(o + 1, b, 16);
    else
      memcpy(o + 1, b, n);
    o[n + 1] = '"';
    j->olen += n + 2;
    return;
  }
  put_string_slow(j, t);
}

static void put_number(ag__jcs *j, const tok *t) {
  const uint8_t *s = j->src + t->off;
  char o[32];
  size_t n;
  if (t->flags & F_NUM_INT) {
    if (t->w[0] == 2 && s[0] == '-' && s[1] == '0')
      put1(j, '0');
    else
      put(j, s, t->w[0]);
    return;
  }
  if (t->flags & F_NUM_TEXT) {
    char d[15];
    int k = 0;
    long e = 0;
    bool neg = false;
    num_text(s, t->w[0], d, &k, &e, &neg); /* pass 1 found it takes it */
    n = num_layout(o, neg, d, k, e);
  } else {
    double v;
    memcpy(&v, t->w, sizeof(v));
    n = num_double(j, v, o);
  }
  put(j, o, n);
}

static inline uint32_t skip(const tok *tape, uint32_t i) {
  return tape[i].type <= T_ARR ? tape[i].w[0] : i + 1;
}

static void emit(ag__jcs *j, size_t ntok) {
  const tok *const tape = j->tape;
  const tok *t;
  size_t depth = 0;
  uint32_t i = 0, k;
  frame *f;
  if (ntok == 0) { /* empty arguments */
    put(j, "{}", 2);
    return;
  }

value:
  t = &tape[i];
  switch (t->type) {
  case T_STR:
    put_string(j, t);
    break;
  case T_NUM:
    put_number(j, t);
    break;
  case T_TRUE:
    put(j, "true", 4);
    break;
  case T_FALSE:
    put(j, "false", 5);
    break;
  case T_NULL:
    put(j, "null", 4);
    break;
  case T_ARR:
    if (t->flags & F_CANON) {
      put(j, j->src + t->off, t->w[1] - t->off);
      break;
    }
    put1(j, '[');
    if (t->w[1] == 0) {
      put1(j, ']');
      break;
    }
    f = &j->stack[depth++];
    f->obj = false;
    f->count = t->w[1] - 1;
    f->cur = skip(tape, i + 1);
    i = i + 1;
    goto value;
  default: /* T_OBJ */
    if (t->flags & F_CANON) {
      put(j, j->src + t->off, t->w[1] - t->off);
      break;
    }
    put1(j, '{');
    if (t->w[1] == 0) {
      put1(j, '}');
      break;
    }
    f = &j->stack[depth++];
    f->obj = true;
    f->count = t->w[1];
    f->base = t->off;
    goto member;
  }

next:
  if (depth == 0)
    return;
  f = &j->stack[depth - 1];
  if (f->count == 0) {
    put1(j, f->obj ? '}' : ']');
    depth--;
    goto next;
  }
  put1(j, ',');
  if (!f->obj) {
    i = f->cur;
    f->cur = skip(tape, i);
    f->count--;
    goto value;
  }

member:
  k = j->order[f->base++];
  f->count--;
  put_string(j, &tape[k]);
  put1(j, ':');
  i = k + 1;
  goto value;
}

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
  j->c_locale = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
  if (ag__jcs_size_tokens(j, max_tokens < JCS_INITIAL_TOKENS
                                 ? max_tokens
                                 : JCS_INITIAL_TOKENS) != AG_OK ||
      ag__jcs_size_arena(j, arena) != AG_OK || j->stack == NULL ||
      j->c_locale == (locale_t)0) {
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
  if (args_len + 1 > j->cap_arena &&
      ag__jcs_size_arena(j, args_len + 1) != AG_OK)
    return ag__set_error(err, AG_ENOMEM, -1, "arguments: out of memory");
  j->src = (const uint8_t *)args;
  j->len = args_len;
  j->olen = 0;
  j->stopped = false;
  if (args_len == 0) {
    *ntok = 0;
    return AG_OK;
  }
  return ag__jcs_tokenize(j, ntok, err);
}

ag_err_t ag__jcs_signature(ag__jcs *j, const char *name, size_t name_len,
                           const char *args, size_t args_len,
                           uint8_t sig[AG_SIG_LEN], ag_error_t *err) {
  size_t ntok;
  if (j == NULL || j->sha == NULL || (name == NULL && name_len > 0) ||
      sig == NULL)
    return ag__set_error(err, AG_EINVAL, -1, "signature: invalid argument");
  ag_err_t rc = ag__jcs_prepare(j, args, args_len, &ntok, err);
  if (rc != AG_OK)
    return rc;
  ag__sha256_init(j->sha);
  j->sink = NULL;
  if (name_len > 0)
    put(j, name, name_len);
  put1(j, ':');
  emit(j, ntok);
  flush(j);
  if (!ag__sha256_final(j->sha, sig))
    return ag__set_error(err, AG_ECRYPTO, -1, "signature: SHA-256 failed");
  return AG_OK;
}

ag_err_t ag__jcs_write(ag__jcs *j, const char *args, size_t args_len,
                       ag__sink_fn sink, void *user, ag_error_t *err) {
  size_t ntok;
  if (j == NULL || sink == NULL)
    return ag__set_error(err, AG_EINVAL, -1, "canonicalize: invalid argument");
  ag_err_t rc = ag__jcs_prepare(j, args, args_len, &ntok, err);
  if (rc != AG_OK)
    return rc;
  j->sink = sink;
  j->user = user;
  emit(j, ntok);
  flush(j);
  j->sink = NULL;
  if (j->stopped)
    return ag__set_error(err, AG_ENOSPACE, -1,
                         "canonicalize: the output sink stopped");
  return AG_OK;
}

/* ------------------------------------------------------------------------ */
/* Public convenience functions                                             */
/* ------------------------------------------------------------------------ */

/* Limits of the scratch sized for one input: a token takes at least one
 * byte, so the token cap is never what stops it (invalid text such as
 * "[[[[" gets AG_EJSON, as with a guard's larger scratch). Pages that are
 * not touched are not committed. */
#define CONV_DEPTH 256

static ag_err_t conv_create(ag__jcs **j, size_t len, bool digest,
                            ag_error_t *err) {
  if (len > UINT32_MAX - 2)
    return ag__set_error(err, AG_ETOOBIG, (long)(UINT32_MAX - 2),
                         "arguments: %zu bytes exceed the limit of %lu", len,
                         (unsigned long)(UINT32_MAX - 2));
  return ag__jcs_create(j, len, len + 1, CONV_DEPTH, digest, err);
}

AG_EXTERN ag_err_t ag_signature(const char *name, const char *args,
                                size_t args_len, uint8_t sig[AG_SIG_LEN],
                                ag_error_t *err) {
  if (name == NULL || sig == NULL || (args == NULL && args_len > 0))
    return ag__set_error(err, AG_EINVAL, -1,
                         "ag_signature: name, args or sig is NULL");
  ag__jcs *j;
  ag_err_t rc = conv_create(&j, args_len, true, err);
  if (rc != AG_OK)
    return rc;
  rc = ag__jcs_signature(j, name, strlen(name), args, args_len, sig, err);
  ag__jcs_free(j);
  return rc;
}

/* The canonical text goes into an ag__buf; a full or failed buffer stops
 * the writer (AG_ENOSPACE, reported as out of memory). */
static int buf_sink(void *user, const char *data, size_t len) {
  return ag__buf_add(user, data, len) == AG_OK ? 0 : 1;
}

AG_EXTERN ag_err_t ag_canonicalize(const char *json, size_t len, char **out,
                                   size_t *out_len, ag_error_t *err) {
  if (out == NULL || (json == NULL && len > 0))
    return ag__set_error(err, AG_EINVAL, -1,
                         "ag_canonicalize: json or out is NULL");
  *out = NULL;
  if (out_len != NULL)
    *out_len = 0;
  ag__jcs *j;
  ag_err_t rc = conv_create(&j, len, false, err);
  if (rc != AG_OK)
    return rc;
  /* Canonical text is rarely longer than the input; the sink grows it. */
  ag__buf b;
  ag__buf_init(&b, SIZE_MAX / 2); /* the input's own cap bounds it */
  if (ag__buf_reserve(&b, len < SIZE_MAX / 2 - 64 ? len + 64 : len) != AG_OK) {
    ag__jcs_free(j);
    return ag__set_error(err, AG_ENOMEM, -1, "ag_canonicalize: out of memory");
  }
  rc = ag__jcs_write(j, json, len, buf_sink, &b, err);
  ag__jcs_free(j);
  if (rc == AG_ENOSPACE)
    rc = ag__set_error(err, AG_ENOMEM, -1, "ag_canonicalize: out of memory");
  if (rc != AG_OK) {
    ag__buf_free(&b);
    return rc;
  }
  b.p[b.len] = '\0';
  *out = b.p;
  if (out_len != NULL)
    *out_len = b.len;
  return AG_OK;
}

AG_EXTERN void ag_sig_hex(const uint8_t sig[AG_SIG_LEN], char hex[65]) {
  static const char digits[] = "0123456789abcdef";
  for (int i = 0; i < AG_SIG_LEN; i++) {
    hex[2 * i] = digits[sig[i] >> 4];
    hex[2 * i + 1] = digits[sig[i] & 15];
  }
  hex[64] = '\0';
}
