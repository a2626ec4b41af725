/*
 * src/core/jcs_emit.c - pass 2 of the JCS canonicalizer (jcs_impl.h; the
 * design is jcs.c's note): emit() walks the tape pass 1 wrote and writes
 * the canonical bytes into the scratch's 4 KiB output buffer, flushed to
 * SHA-256 (ag__jcs_signature) or to the caller's sink (ag__jcs_write).
 * Pass 2's per-byte path - the buffer, strings, numbers, the walk - is
 * this one file, so that the compiler sees it whole.
 */
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
  char *o;
  if (t->flags & F_NUM_COPY) { /* never "-0": that is F_NUM_TEXT */
    put(j, s, t->w[0]);
    return;
  }
  /* laid out in place: the buffer is flushed first when it has less than
   * the room the layout may write */
  if (OBUF_SIZE - j->olen < NUM_TEXT_BUF)
    flush(j);
  o = j->obuf + j->olen;
  if (t->flags & F_NUM_TEXT) {
    /* parse_number() kept where the digits are: k of them from the first
     * significant one, a '.' `dot` places after it when it splits them */
    char d[NUM_DIGITS_BUF];
    unsigned k = t->spare & 15, dot = t->spare >> 5, m = 0;
    const uint8_t *q = s + t->w[0];
    if (j->len - (t->off + t->w[0]) >= 32) {
      /* two fixed-size copies, the second over the '.' (k + 1 <= 16 bytes
       * of source, dot < k): no loop whose exit depends on the digits */
      memcpy(d, q, 16);
      if (dot != 0)
        memcpy(d + dot, q + dot + 1, 16);
    } else {
      for (unsigned i = 0; m < k; i++)
        if (i != dot || dot == 0)
          d[m++] = (char)q[i];
    }
    j->olen += ag__jcs_num_layout(o, t->spare >> 4 & 1, d, (int)k,
                                  (long)(int32_t)t->w[1]);
  } else {
    double v;
    memcpy(&v, t->w, sizeof(v));
    j->olen += ag__jcs_num_double(j, v, o);
  }
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
  i = k + 1;
  {
    /* A member written as its source writes it - a key without escapes,
     * ':' right after it, then a scalar that is its own canonical form -
     * is copied in one piece (the members of a dense argument's small
     * objects, whose keys are out of order, would be five writes each). */
    const tok *kt = &tape[k], *vt = &tape[i];
    size_t ks = kt->off - 1, vs = kt->off + kt->w[0] + 2, ve = 0;
    size_t v0 = vt->type == T_STR ? vt->off - 1 : vt->off; /* its quote */
    if (!(kt->flags & F_ESC) && v0 == vs && j->src[vs - 1] == ':') {
      if (vt->type == T_NUM && (vt->flags & F_NUM_COPY))
        ve = vs + vt->w[0];
      else if (vt->type == T_STR && !(vt->flags & F_ESC))
        ve = vs + vt->w[0] + 2; /* both quotes */
      else if (vt->type == T_TRUE || vt->type == T_NULL)
        ve = vs + 4;
      else if (vt->type == T_FALSE)
        ve = vs + 5;
    }
    if (ve != 0) {
      size_t n = ve - ks;
      if (n <= 32 && j->len - ks >= 32 && n <= OBUF_SIZE - j->olen) {
        memcpy(j->obuf + j->olen, j->src + ks, 32); /* obuf's slack */
        j->olen += n;
      } else {
        put(j, j->src + ks, n);
      }
      goto next;
    }
  }
  put_string(j, &tape[k]);
  put1(j, ':');
  goto value;
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
