/*
 * src/core/jcs_number.c - numbers in their canonical form for the JCS
 * canonicalizer (jcs_impl.h): a literal of at most 15 significant digits
 * rearranged, any other through its double, written as ECMAScript's
 * Number.prototype.toString writes it.
 */
#define _GNU_SOURCE /* strtod_l */
#include "jcs_impl.h"

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
bool ag__jcs_num_text(const uint8_t *s, size_t len, char d[15], int *k, long *n,
                      bool *neg) {
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
size_t ag__jcs_num_layout(char *o, bool neg, const char *d, int k, long n) {
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
size_t ag__jcs_num_double(const ag__jcs *j, double v, char *o) {
  if (v == 0)
    return ag__jcs_num_layout(o, false, "", 0, 0);
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
  return ag__jcs_num_layout(o, v < 0, d, k, ex + 1);
}

/* ------------------------------------------------------------------------ */
