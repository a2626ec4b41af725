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

/*
 * Lays out k significant digits d with exponent n (value 0.d * 10^n) as
 * ECMAScript's Number.prototype.toString does. Every copy has a fixed size
 * (a few vector moves, where variable lengths were calls to memcpy and
 * memset): o has NUM_TEXT_BUF bytes and d NUM_DIGITS_BUF, more than the
 * longest text (k <= 17, |n| <= 325) needs; bytes past the length returned
 * are scratch.
 */
size_t ag__jcs_num_layout(char *o, bool neg, const char *d, int k, long n) {
  char *p = o;
  if (k == 0) {
    o[0] = '0';
    return 1;
  }
  *p = '-';
  p += neg;
  if (k <= n && n <= 21) { /* digits, then n - k zeros */
    memcpy(p, d, 24);
    memset(p + k, '0', 21);
    p += n;
  } else if (0 < n && n <= 21) { /* n < k <= 17: d[0..n) '.' d[n..k) */
    memcpy(p, d, 16);
    p[n] = '.';
    memcpy(p + n + 1, d + n, 16);
    p += k + 1;
  } else if (-6 < n && n <= 0) { /* "0." and -n zeros, then the digits */
    memcpy(p, "0.00000", 8);
    p += 2 - n;
    memcpy(p, d, 24);
    p += k;
  } else { /* d[0] '.' d[1..k) 'e' sign exponent (at most 3 digits) */
    long e = n - 1;
    p[0] = d[0];
    p[1] = '.';
    memcpy(p + 2, d + 1, 24);
    p += k > 1 ? k + 1 : 1;
    *p++ = 'e';
    *p++ = e < 0 ? '-' : '+';
    if (e < 0)
      e = -e;
    if (e >= 100)
      *p++ = (char)('0' + e / 100);
    if (e >= 10)
      *p++ = (char)('0' + e / 10 % 10);
    *p++ = (char)('0' + e % 10);
  }
  return (size_t)(p - o);
}

/*
 * The ECMAScript text of a finite double into o[NUM_TEXT_BUF]: the fewest
 * significant digits (15 with trailing zeros dropped, else 16, else 17)
 * whose correctly rounded decimal reads back as v. printf's decimal point
 * depends on the process locale, so only its digits and exponent are used; the
 * round-trip check builds its own text and reads it with strtod_l in the "C"
 * locale.
 */
size_t ag__jcs_num_double(const ag__jcs *j, double v, char *o) {
  if (v == 0)
    return ag__jcs_num_layout(o, false, "", 0, 0);
  char buf[64], d[NUM_DIGITS_BUF], rt[40];
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
