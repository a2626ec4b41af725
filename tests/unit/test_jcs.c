/*
 * tests/unit/test_jcs.c - RFC 8785 canonicalization and call signatures
 * (src/core/jcs.c): the reference vectors and number file of data/jcs/ in
 * ../shared (skipped, saying so, when it is not beside the project) and the
 * project's own in tests/fixtures/jcs/, the error codes and positions,
 * limits, key order, and the SHA-256 framing.
 */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <openssl/evp.h>

#include "core/internal.h"

#define JCS_DIR AG_SHARED_DIR "/data/jcs"
/* The project's own vectors (scripts/gen-jcs-numbers.mjs and
 * scripts/gen-jcs-vectors.mjs), checked whether or not ../shared is there. */
#define FIXTURE_JCS_DIR AG_SOURCE_DIR "/tests/fixtures/jcs"

/* ------------------------------------------------------------------------ */
/* Helpers                                                                  */
/* ------------------------------------------------------------------------ */

static char *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (f == NULL)
    return NULL;
  size_t cap = 4096, n = 0;
  char *buf = malloc(cap);
  cr_assert_not_null(buf);
  for (;;) {
    if (n == cap) {
      cap *= 2;
      buf = realloc(buf, cap);
      cr_assert_not_null(buf);
    }
    size_t r = fread(buf + n, 1, cap - n, f);
    if (r == 0)
      break;
    n += r;
  }
  fclose(f);
  *len = n;
  return buf;
}

/* Canonical form of a NUL-terminated text; asserts success. Caller frees. */
static char *canon(const char *json) {
  char *out = NULL;
  size_t n = 0;
  ag_error_t err;
  ag_err_t rc = ag_canonicalize(json, strlen(json), &out, &n, &err);
  cr_assert_eq(rc, AG_OK, "canonicalize(%s): %s %s", json, ag_err_name(rc),
               err.msg);
  cr_assert_eq(strlen(out), n);
  return out;
}

static void expect_canon(const char *json, const char *want) {
  char *got = canon(json);
  cr_expect_str_eq(got, want, "canonicalize(%s)\n  got:  %s\n  want: %s", json,
                   got, want);
  ag_free(got);
}

/* Asserts that `json` fails with `code` at byte `pos`. */
static void expect_error(const char *json, size_t len, ag_err_t code,
                         long pos) {
  uint8_t sig[AG_SIG_LEN];
  ag_error_t err;
  ag_err_t rc = ag_signature("t", json, len, sig, &err);
  cr_expect_eq(rc, code, "signature(%.*s): got %s (%s), want %s", (int)len,
               json, ag_err_name(rc), err.msg, ag_err_name(code));
  if (rc == code) {
    cr_expect_eq(err.code, code);
    cr_expect_eq(err.pos, pos, "signature(%.*s): pos %ld, want %ld (%s)",
                 (int)len, json, err.pos, pos, err.msg);
    cr_expect_neq(err.msg[0], '\0');
  }
  char *out = (char *)1;
  rc = ag_canonicalize(json, len, &out, NULL, &err);
  cr_expect_eq(rc, code, "canonicalize(%.*s): got %s, want %s", (int)len, json,
               ag_err_name(rc), ag_err_name(code));
  cr_expect_null(out);
}

static void expect_error_s(const char *json, ag_err_t code, long pos) {
  expect_error(json, strlen(json), code, pos);
}

static void sig_of(const char *name, const char *args, uint8_t sig[32]) {
  ag_error_t err;
  ag_err_t rc = ag_signature(name, args, strlen(args), sig, &err);
  cr_assert_eq(rc, AG_OK, "signature(%s, %s): %s", name, args, err.msg);
}

static void expect_same_sig(const char *a, const char *b) {
  uint8_t sa[32], sb[32];
  char ha[65], hb[65];
  sig_of("tool", a, sa);
  sig_of("tool", b, sb);
  ag_sig_hex(sa, ha);
  ag_sig_hex(sb, hb);
  cr_expect_str_eq(ha, hb, "signatures differ:\n  %s -> %s\n  %s -> %s", a, ha,
                   b, hb);
}

typedef struct membuf {
  char *p;
  size_t len, cap;
} membuf;

static int mem_sink(void *user, const char *data, size_t len) {
  membuf *b = user;
  if (b->len + len > b->cap)
    return 1;
  memcpy(b->p + b->len, data, len);
  b->len += len;
  return 0;
}

/* Skips the running test, saying so on stderr (`make test` lists these
 * lines) and to Criterion, when `path` is missing: ../shared is not beside
 * a clone of the project alone. */
static void skip_without(const char *path, const char *instead) {
  if (access(path, R_OK) == 0)
    return;
  fprintf(stderr,
          "skipped: %s::%s: %s not found (../shared is not beside the "
          "project); %s runs instead\n",
          criterion_current_test->category, criterion_current_test->name, path,
          instead);
  cr_skip_test("skipped: %s not found (../shared is not beside the project); "
               "%s runs instead",
               path, instead);
}

/* ------------------------------------------------------------------------ */
/* Reference vectors                                                        */
/* ------------------------------------------------------------------------ */

/* Every dir/input/NAME must canonicalize to the bytes of dir/output/NAME. */
static void check_vectors(const char *dir, int min_files) {
  char in_dir[1024];
  snprintf(in_dir, sizeof(in_dir), "%s/input", dir);
  DIR *d = opendir(in_dir);
  cr_assert_not_null(d, "test data folder %s is missing", in_dir);
  int files = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.')
      continue;
    char in_path[1024], out_path[1024];
    snprintf(in_path, sizeof(in_path), "%s/input/%s", dir, e->d_name);
    snprintf(out_path, sizeof(out_path), "%s/output/%s", dir, e->d_name);
    size_t in_len, want_len;
    char *in = read_file(in_path, &in_len);
    char *want = read_file(out_path, &want_len);
    cr_assert_not_null(in, "cannot read %s", in_path);
    cr_assert_not_null(want, "cannot read %s (expected output of %s)", out_path,
                       in_path);
    char *got = NULL;
    size_t got_len = 0;
    ag_error_t err;
    ag_err_t rc = ag_canonicalize(in, in_len, &got, &got_len, &err);
    cr_expect_eq(rc, AG_OK, "%s: %s %s", e->d_name, ag_err_name(rc), err.msg);
    if (rc == AG_OK) {
      cr_expect(got_len == want_len && memcmp(got, want, want_len) == 0,
                "%s:\n  got:  %.*s\n  want: %.*s", e->d_name, (int)got_len, got,
                (int)want_len, want);
      /* Canonical text is a fixed point. */
      char *again = NULL;
      size_t again_len = 0;
      cr_expect_eq(ag_canonicalize(got, got_len, &again, &again_len, NULL),
                   AG_OK);
      cr_expect(again_len == got_len && memcmp(again, got, got_len) == 0,
                "%s: canonical form is not a fixed point", e->d_name);
      ag_free(again);
    }
    ag_free(got);
    free(in);
    free(want);
    files++;
  }
  closedir(d);
  cr_assert_geq(files, min_files, "only %d vector files in %s", files, in_dir);
}

Test(jcs, reference_vectors) {
  /* The scheme authors' vectors, in the shared data beside the project. */
  skip_without(JCS_DIR "/input", "fixtures::jcs_reference_vectors");
  check_vectors(JCS_DIR, 6);
}

Test(fixtures, jcs_reference_vectors) {
  check_vectors(FIXTURE_JCS_DIR, 5);
}

/* ------------------------------------------------------------------------ */
/* numbers.csv: ECMAScript Number.prototype.toString                        */
/* ------------------------------------------------------------------------ */

/* Checks every "HEX,TEXT" line of `path`; at least `min_lines` finite. */
static void check_numbers(const char *path, long min_lines) {
  size_t len;
  char *text = read_file(path, &len);
  cr_assert_not_null(text, "test data %s is missing", path);
  ag__jcs *j;
  cr_assert_eq(ag__jcs_new(&j, 4096, 64, 8, NULL), AG_OK);
  char buf[128];
  membuf out = {buf, 0, sizeof(buf) - 1};
  long checked = 0, skipped = 0, mismatches = 0, text_checked = 0;
  char *line = text, *end = text + len;
  while (line < end) {
    char *nl = memchr(line, '\n', (size_t)(end - line));
    char *eol = nl ? nl : end;
    char *comma = memchr(line, ',', (size_t)(eol - line));
    if (comma == NULL) {
      line = eol + 1;
      continue;
    }
    uint64_t bits = strtoull(line, NULL, 16);
    char want[64];
    size_t wlen = (size_t)(eol - comma - 1);
    if (wlen > 0 && comma[wlen] == '\r')
      wlen--;
    cr_assert_lt(wlen, sizeof(want));
    memcpy(want, comma + 1, wlen);
    want[wlen] = '\0';
    line = eol + 1;
    double v;
    memcpy(&v, &bits, sizeof(v));
    if (!isfinite(v)) {
      skipped++;
      continue;
    }
    /* Two spellings: 17 digits (the double path), and the shortest "%.*e"
     * that reads back (<= 15 digits takes the digit-moving path). */
    char in[2][64];
    int n_in = 1;
    snprintf(in[0], sizeof(in[0]), "%.17g", v);
    for (int prec = 0; prec <= 14; prec++) {
      snprintf(in[1], sizeof(in[1]), "%.*e", prec, v);
      if (strtod(in[1], NULL) == v) {
        n_in = 2;
        break;
      }
    }
    for (int k = 0; k < n_in; k++) {
      out.len = 0;
      ag_error_t err;
      ag_err_t rc =
          ag__jcs_write(j, in[k], strlen(in[k]), mem_sink, &out, &err);
      buf[out.len] = '\0';
      if (rc != AG_OK || strcmp(buf, want) != 0) {
        if (mismatches < 10)
          cr_log_error("%s %016llx: %s -> %s (%s), want %s", path,
                       (unsigned long long)bits, in[k],
                       rc == AG_OK ? buf : ag_err_name(rc),
                       rc == AG_OK ? "ok" : err.msg, want);
        mismatches++;
      }
    }
    checked++;
    text_checked += n_in - 1;
  }
  ag__jcs_free(j);
  free(text);
  cr_log_info("%s: %ld checked (%ld also as <= 15 digits), %ld "
              "NaN/Infinity skipped",
              path, checked, text_checked, skipped);
  cr_expect_geq(checked, min_lines, "only %ld lines checked", checked);
  cr_expect_eq(mismatches, 0, "%ld mismatches (first 10 logged)", mismatches);
}

Test(jcs, numbers_csv, .timeout = 120) {
  skip_without(JCS_DIR "/numbers.csv", "fixtures::jcs_numbers_csv");
  check_numbers(JCS_DIR "/numbers.csv", 30000);
}

Test(fixtures, jcs_numbers_csv, .timeout = 120) {
  check_numbers(FIXTURE_JCS_DIR "/numbers.csv", 7000);
}

Test(jcs, number_forms) {
  expect_canon("[1,1.0,1e0,10e-1,0.1e1,100e-2]", "[1,1,1,1,1,1]");
  expect_canon("[-0,-0.0,0e5,-0e-5,0.000]", "[0,0,0,0,0]");
  expect_canon("[123456789012345,-123456789012345]",
               "[123456789012345,-123456789012345]");
  expect_canon("[1234567890123456,12345678901234567890]",
               "[1234567890123456,12345678901234567000]");
  expect_canon("[1e21,1e20,123e19,1.5e-7,0.000001,0.0000015]",
               "[1e+21,100000000000000000000,1.23e+21,1.5e-7,0.000001,"
               "0.0000015]");
  expect_canon("[4.50,2e-3,1E30,0.000000000000000000000000001,1E+2]",
               "[4.5,0.002,1e+30,1e-27,100]");
  expect_canon("[333333333.33333329,0.1,0.30000000000000004]",
               "[333333333.3333333,0.1,0.30000000000000004]");
  expect_canon(
      "[5e-324,1.7976931348623157e308,-1e-400,2.2250738585072014e-308]",
      "[5e-324,1.7976931348623157e+308,0,2.2250738585072014e-308]");
  /* Digits around the '.', leading and trailing zeros, then an exponent
   * (the tokenizer keeps where the digits are; emit lays them out). */
  expect_canon("[0.00120e3,120.0e-2,1.20e1,-0.0500e2,12.50,100.0,"
               "0.000100e-1,-1.0e0,98.7650e1,1234.5e-9]",
               "[1.2,1.2,12,-5,12.5,100,0.00001,-1,987.65,0.0000012345]");
  expect_canon("[1e-300,1e300,9.99999999999999e299]",
               "[1e-300,1e+300,9.99999999999999e+299]");
  /* Long mantissas and huge exponents that cancel. */
  expect_canon("[1000000000000000000000000000000e-30,"
               "0.00000000000000000000000000001e29]",
               "[1,1]");
  expect_canon("[0e99999999999999999999,1e-99999999999999999999]", "[0,0]");
  expect_error_s("1e400", AG_ENUMBER, 0);
  expect_error_s("[1,-1e99999999999999999999]", AG_ENUMBER, 3);
  expect_error_s("[1.7976931348623159e308]", AG_ENUMBER, 1);
}

/* A plain decimal that is its own canonical form is copied as it is by
 * the tokenizer (F_NUM_COPY); the same value with an exponent ("e0") always
 * goes through the digits or the double. The two must be written alike,
 * for literals on both sides of the copy's limits: 15 and 16 significant
 * digits, fractions ending in 0, up to eight leading zeros below 1, signs,
 * integers; alone (the tokenizer's byte scan) and followed by more text
 * (judged from one 16-byte load when the literal ends inside it). */
Test(jcs, copied_decimals_equal_their_exponent_forms) {
  uint64_t x = 0x9e3779b97f4a7c15ULL;
  char lit[64];
  for (int i = 0; i < 200000; i++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    size_t n = 0;
    if (x & 1)
      lit[n++] = '-';
    unsigned nd = (unsigned)(x >> 8) % 17, nz = (unsigned)(x >> 16) % 9,
             nf = (unsigned)(x >> 24) % 18;
    if (nd == 0 || (x >> 32) % 3 == 0) {
      lit[n++] = '0';
    } else {
      lit[n++] = (char)('1' + (x >> 36) % 9);
      for (unsigned k = 1; k < nd; k++)
        lit[n++] = (char)('0' + (x >> (k % 40)) % 10);
    }
    if ((x >> 50) % 4 != 0) { /* else an integer */
      lit[n++] = '.';
      for (unsigned k = 0; k < nz && lit[n - 2] == '0'; k++)
        lit[n++] = '0';
      for (unsigned k = 0; k < nf; k++)
        lit[n++] = (char)('0' + (x >> ((k * 7) % 50)) % 10);
      if (lit[n - 1] == '.')
        lit[n++] = (char)('0' + (x >> 44) % 10);
    }
    lit[n] = '\0';
    for (int followed = 0; followed < 2; followed++) {
      char in[96], in_alt[112];
      snprintf(in, sizeof in, followed ? "[%s,1,2,3,4,5,6,7,8]" : "%s", lit);
      snprintf(in_alt, sizeof in_alt,
               followed ? "[%se0,1,2,3,4,5,6,7,8]" : "%se0", lit);
      char *a = NULL, *b = NULL;
      size_t al, bl;
      ag_error_t err;
      cr_assert_eq(ag_canonicalize(in, strlen(in), &a, &al, &err), AG_OK, "%s",
                   in);
      cr_assert_eq(ag_canonicalize(in_alt, strlen(in_alt), &b, &bl, &err),
                   AG_OK, "%s", in_alt);
      cr_assert_str_eq(a, b, "%s is written %s, %s is written %s", in, a,
                       in_alt, b);
      ag_free(a);
      ag_free(b);
    }
  }
  expect_canon("[97.1,-0.5,0.000001,0.0000001,1.50,123456789012345.5,"
               "12345678901234.5,0.1234567890123456]",
               "[97.1,-0.5,0.000001,1e-7,1.5,123456789012345.5,"
               "12345678901234.5,0.1234567890123456]");
}

/* Members of an object whose keys are out of order, each written as the
 * canonical form writes it or not (a space, an escape, a number to
 * rewrite, "-0"): copied in one piece or written token by token, the
 * same text. */
Test(jcs, members_copied_whole_or_in_pieces) {
  expect_canon(
      "{\"z\":\"x\\ny\",\"y\":1.5,\"x\":true,\"w\":null,\"v\":false,"
      "\"u\":-0,\"t\":\"\u00e9\",\"s\" :2,\"r\": 3,\"q\":1E2,"
      "\"p\":\"\\u0041\",\"o\":[1],\"n\":{\"b\":1,\"a\":\"\"},"
      "\"a\\u0062\":0}",
      "{\"ab\":0,\"n\":{\"a\":\"\",\"b\":1},\"o\":[1],\"p\":\"A\",\"q\":100,"
      "\"r\":3,\"s\":2,\"t\":\"\u00e9\",\"u\":0,\"v\":false,\"w\":null,"
      "\"x\":true,\"y\":1.5,\"z\":\"x\\ny\"}");
}

/* ------------------------------------------------------------------------ */
/* Invariance and framing                                                   */
/* ------------------------------------------------------------------------ */

Test(jcs, invariance) {
  expect_same_sig("{\"a\":1,\"b\":[true,null]}", "{\"b\":[true,null],\"a\":1}");
  expect_same_sig("{\"x\":{\"q\":1,\"p\":2},\"a\":0}",
                  " { \"a\" : 0 ,\n\t\"x\" : { \"p\" : 2 , \"q\" : 1 } }\r\n");
  expect_same_sig("{\"n\":1}", "{\"n\":1.0}");
  expect_same_sig("{\"n\":1}", "{\"n\":1e0}");
  expect_same_sig("{\"n\":1}", "{\"n\":10e-1}");
  expect_same_sig("{\"s\":\"A\"}", "{\"s\":\"\\u0041\"}");
  expect_same_sig("{\"s\":\"a/b\"}", "{\"s\":\"a\\/b\"}");
  expect_same_sig("{\"k\":1}", "{\"\\u006b\":1}");
  expect_same_sig("{\"s\":\"\xf0\x9f\x98\x80\"}", "{\"s\":\"\\ud83d\\ude00\"}");
  expect_same_sig("{\"s\":\"\\u00e9\"}", "{\"s\":\"\\u00E9\"}");

  uint8_t a[32], b[32];
  sig_of("read_file", "{\"path\":\"x\"}", a);
  sig_of("write_file", "{\"path\":\"x\"}", b);
  cr_expect_neq(memcmp(a, b, 32), 0, "different names, same signature");
  sig_of("t", "{\"path\":\"x\"}", a);
  sig_of("t", "{\"path\":\"y\"}", b);
  cr_expect_neq(memcmp(a, b, 32), 0, "different values, same signature");
}

Test(jcs, sha256_vector) {
  uint8_t sig[32], want[32];
  unsigned int n = 0;
  cr_assert_eq(EVP_Digest("f:{}", 4, want, &n, EVP_sha256(), NULL), 1);
  sig_of("f", "{}", sig);
  char hs[65], hw[65];
  ag_sig_hex(sig, hs);
  ag_sig_hex(want, hw);
  cr_expect_str_eq(hs, hw, "signature(f, {}) = %s, SHA-256(\"f:{}\") = %s", hs,
                   hw);
  cr_expect_str_eq(
      hw, "4b238bdfc4a73af1500095a95c193e1bab981bb46ba717255a2fc2292eb43406",
      "independent SHA-256 of \"f:{}\"");

  /* Empty arguments are {}. */
  uint8_t e[32];
  ag_error_t err;
  cr_assert_eq(ag_signature("f", "", 0, e, &err), AG_OK, "%s", err.msg);
  cr_expect_eq(memcmp(e, want, 32), 0, "empty args differ from {}");
  cr_assert_eq(ag_signature("f", NULL, 0, e, &err), AG_OK, "%s", err.msg);
  cr_expect_eq(memcmp(e, want, 32), 0, "NULL args differ from {}");
  expect_canon("", "{}");
  expect_error_s("   ", AG_EJSON, 3);

  /* Internal entry point with a non-terminated name. */
  ag__jcs *j;
  cr_assert_eq(ag__jcs_new(&j, 64, 16, 4, NULL), AG_OK);
  cr_assert_eq(ag__jcs_signature(j, "fxyz", 1, "{ }", 3, sig, NULL), AG_OK);
  cr_expect_eq(memcmp(sig, want, 32), 0);
  ag__jcs_free(j);
  ag__jcs_free(NULL);
}

Test(jcs, sig_hex) {
  uint8_t sig[32];
  for (int i = 0; i < 32; i++)
    sig[i] = (uint8_t)(i * 8 + 15);
  char hex[65];
  ag_sig_hex(sig, hex);
  cr_expect_str_eq(
      hex, "0f171f272f373f474f575f676f777f878f979fa7afb7bfc7cfd7dfe7eff7ff07");
}

/* ------------------------------------------------------------------------ */
/* Strings and keys                                                         */
/* ------------------------------------------------------------------------ */

Test(jcs, string_escapes) {
  expect_canon("\"\\b\\f\\n\\r\\t\\\"\\\\\\/\"",
               "\"\\b\\f\\n\\r\\t\\\"\\\\/\"");
  expect_canon("\"\\u0000\\u001F\\u0007\\u007f\\u0080\"",
               "\"\\u0000\\u001f\\u0007\x7f\xc2\x80\"");
  expect_canon("\"\xe2\x82\xac \\u20ac\"", "\"\xe2\x82\xac \xe2\x82\xac\"");
  expect_canon("{\"\\u0022\\n\\u0000\":\"\\u0022\"}",
               "{\"\\\"\\n\\u0000\":\"\\\"\"}");
  /* Raw DEL and non-ASCII pass through. */
  expect_canon("\"\x7f\xf4\x8f\xbf\xbf\"", "\"\x7f\xf4\x8f\xbf\xbf\"");
  /* Long plain strings with every kind of byte at every alignment. */
  for (int shift = 0; shift < 9; shift++) {
    char in[128], want[128];
    memset(in, 'x', sizeof(in));
    in[0] = '"';
    memcpy(in + 1 + shift, "\xc3\xa9\\n\\u0041", 10);
    in[40] = '"';
    in[41] = '\0';
    memset(want, 'x', sizeof(want));
    want[0] = '"';
    memcpy(want + 1 + shift, "\xc3\xa9\\nA", 5);
    want[35] = '"';
    want[36] = '\0';
    expect_canon(in, want);
  }
}

Test(jcs, canonical_spans) {
  /* Subtrees that are already canonical are copied; the rest is rebuilt. */
  expect_canon("{\"a\":[1,2,{\"b\":\"c\"}],\"b\":{\"x\":1}}",
               "{\"a\":[1,2,{\"b\":\"c\"}],\"b\":{\"x\":1}}");
  expect_canon("{\"b\":[1,2],\"a\":[3]}", "{\"a\":[3],\"b\":[1,2]}");
  expect_canon("[{\"b\":1,\"a\":2},[3]]", "[{\"a\":2,\"b\":1},[3]]");
  expect_canon("[[1],[2 ],[ 3],[4\n]]", "[[1],[2],[3],[4]]");
  expect_canon("[[-0],[1.0],[1e2],[\"\\u0041\"],[\"\\/\"],[\"\\n\"]]",
               "[[0],[1],[100],[\"A\"],[\"/\"],[\"\\n\"]]");
  expect_canon("[{\"\\u0061\":1},{\"a\\nb\":1},{\"a\":1,\"a\\u0000\":2}]",
               "[{\"a\":1},{\"a\\nb\":1},{\"a\":1,\"a\\u0000\":2}]");
  expect_canon("{\"a\":{\"b\":{\"d\":1,\"c\":2}}}",
               "{\"a\":{\"b\":{\"c\":2,\"d\":1}}}");
  expect_canon("[1234567890123456,-0.0,0,-1]", "[1234567890123456,0,0,-1]");
}

/* A string of n bytes of content built from a repeating pattern. */
static char *pattern_string(const char *pat, size_t n) {
  size_t pl = strlen(pat);
  char *s = malloc(n + 3);
  s[0] = '"';
  for (size_t i = 0; i < n; i++)
    s[1 + i] = pat[i % pl];
  s[n + 1] = '"';
  s[n + 2] = '\0';
  return s;
}

Test(jcs, long_escaped_strings) {
  /* Canonical escapes in long ASCII strings are copied as they are, at every
   * alignment relative to 64-byte blocks, with backslash runs crossing them. */
  const char *pats[] = {"ab\\n", "\\\\", "x\\\\\\\"", "\\\"\\t\\r\\b\\f",
                        "0123456789abcdefghij\\\\\\\\\\\\\\\\\\n"};
  for (size_t k = 0; k < sizeof(pats) / sizeof(pats[0]); k++) {
    for (size_t n = 60; n < 200; n += 7) {
      size_t pl = strlen(pats[k]);
      size_t m = n - n % pl; /* whole escapes only */
      char *s = pattern_string(pats[k], m);
      char *lead = malloc(m + 16);
      for (int shift = 0; shift < 3; shift++) {
        /* shift the string start by wrapping it in an array */
        snprintf(lead, m + 16, "%.*s%s", shift, "[[[", s);
        char *in = malloc(m + 16);
        snprintf(in, m + 16, "%s%.*s", lead, shift, "]]]");
        expect_canon(in, in);
        free(in);
      }
      free(lead);
      free(s);
    }
  }
  /* Fall-backs inside long strings: \u, \/, non-ASCII, after block scans. */
  char *s = pattern_string("abc\\n", 150);
  memcpy(s + 1 + 130, "\\u0041", 6);
  char *want = pattern_string("abc\\n", 150);
  memmove(want + 1 + 131, want + 1 + 136, strlen(want + 1 + 136) + 1);
  want[1 + 130] = 'A';
  expect_canon(s, want);
  free(want);
  memcpy(s + 1 + 130, "\\/\xc3\xa9\\\"\\\\", 8);
  char *out = canon(s);
  cr_expect_eq(strncmp(out + 1 + 130, "/\xc3\xa9\\\"\\\\", 7), 0, "%s", out);
  ag_free(out);
  free(s);

  /* Surrogate pairs and multi-byte characters across 64-byte blocks. */
  for (int shift = 0; shift < 16; shift++) {
    char in[256], exp[256];
    int a = 40 + shift;
    snprintf(in, sizeof(in), "\"\\n%.*s\\ud83d\\ude00\xf0\x9f\x98\x82%.*s\"", a,
             "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", 70,
             "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
             "bbbbbbb");
    snprintf(exp, sizeof(exp),
             "\"\\n%.*s\xf0\x9f\x98\x80\xf0\x9f\x98\x82%.*s\"", a,
             "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", 70,
             "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
             "bbbbbbb");
    expect_canon(in, exp);
    /* The same with the pair broken: the error is at the high surrogate. */
    char *hole = strstr(in, "\\ude00");
    memcpy(hole, "\\u0041", 6);
    expect_error_s(in, AG_EUTF8, 2 + 1 + a);
    /* A truncated 4-byte sequence: the error is at its lead byte. */
    snprintf(in, sizeof(in), "\"\\t%.*s\xf0\x9f\x98%.*s\"", a,
             "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", 70,
             "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
             "bbbbbbb");
    expect_error_s(in, AG_EUTF8, 3 + a);
  }

  /* Errors inside long escaped strings keep exact positions. */
  s = pattern_string("ab\\n", 200);
  s[1 + 150] = '\x01';
  expect_error_s(s, AG_EJSON, 151);
  free(s);
  s = pattern_string("ab\\t", 200);
  memcpy(s + 1 + 100, "\\x", 2);
  expect_error_s(s, AG_EJSON, 101);
  free(s);
  s = pattern_string("ab\\\\", 200);
  s[1 + 140] = '\xff';
  expect_error_s(s, AG_EUTF8, 141);
  free(s);
  s = pattern_string("ab\\\"", 200);
  memcpy(s + 1 + 120, "\\ud800", 6);
  expect_error_s(s, AG_EUTF8, 121);
  free(s);
  /* Unterminated: the last quote is escaped. */
  s = pattern_string("ab\\\"", 200);
  s[201] = '\0'; /* ...ab\" with no closing quote */
  expect_error_s(s, AG_EJSON, 201);
  free(s);
}

Test(jcs, key_order_utf16) {
  /* U+1F600 (UTF-16 D83D DE00) sorts before U+FB33 although its UTF-8 is
   * larger; U+00F6 and U+20AC in between as in RFC 8785's example. */
  expect_canon(
      "{\"\xef\xac\xb3\":2,\"\xf0\x9f\x98\x80\":1,\"\xe2\x82\xac\":3,"
      "\"\xc3\xb6\":4,\"z\":5}",
      "{\"z\":5,\"\xc3\xb6\":4,\"\xe2\x82\xac\":3,\"\xf0\x9f\x98\x80\":"
      "1,\"\xef\xac\xb3\":2}");
  expect_canon(
      "{\"\\ufb33\":2,\"\\ud83d\\ude00\":1,\"\\ud7ff\":0}",
      "{\"\xed\x9f\xbf\":0,\"\xf0\x9f\x98\x80\":1,\"\xef\xac\xb3\":2}");
  /* Prefixes first; escaped and plain keys compare decoded. */
  expect_canon("{\"ab\":1,\"a\":2,\"\":3,\"\\u0061c\":4,\"a\\u0000\":5}",
               "{\"\":3,\"a\":2,\"a\\u0000\":5,\"ab\":1,\"ac\":4}");
  /* Every depth is sorted. */
  expect_canon("{\"b\":{\"d\":[{\"z\":1,\"y\":2}],\"c\":0},\"a\":[]}",
               "{\"a\":[],\"b\":{\"c\":0,\"d\":[{\"y\":2,\"z\":1}]}}");
}

Test(jcs, many_keys) {
  /* 2,000 keys in scrambled order: the merge sort path. */
  enum { N = 2000 };
  char *in = malloc(N * 16 + 16), *want = malloc(N * 16 + 16);
  char *p = in, *q = want;
  *p++ = '{';
  *q++ = '{';
  for (int i = 0; i < N; i++) {
    int k = (i * 7919) % N; /* 7919 is prime: a permutation */
    p += sprintf(p, "%s\"k%05d\":%d", i ? "," : "", k, k);
    q += sprintf(q, "%s\"k%05d\":%d", i ? "," : "", i, i);
  }
  strcpy(p, "}");
  strcpy(q, "}");
  expect_canon(in, want);
  /* A duplicate among them is found, at the second occurrence. */
  size_t len = strlen(in);
  in[len - 1] = '\0';
  strcat(in, ",\"k00005\":1}");
  expect_error_s(in, AG_EDUPKEY, (long)len);
  free(in);
  free(want);
}

/* Small objects (up to 17 keys: the counting path and past it) in every
 * kind of disorder, with keys that share their first 8 bytes (the prefixes
 * tie: the comparison path) or not, and a duplicate among them. */
Test(jcs, small_objects_in_any_order) {
  uint64_t x = 0x2545F4914F6CDD1DULL;
  char in[1024], want[1024];
  for (int round = 0; round < 3000; round++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    int n = 1 + (int)(x % 17), perm[17];
    bool shared = (x >> 8) & 1;
    for (int i = 0; i < n; i++)
      perm[i] = i;
    for (int i = n - 1; i > 0; i--) { /* Fisher-Yates from x's bits */
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      int k = (int)(x % (uint64_t)(i + 1)), t = perm[i];
      perm[i] = perm[k];
      perm[k] = t;
    }
    const char *pre = shared ? "samekey_" : "";
    size_t a = 0, b = 0;
    in[a++] = '{';
    want[b++] = '{';
    for (int i = 0; i < n; i++) {
      a += (size_t)sprintf(in + a, "%s\"%s%02d\":%d", i ? "," : "", pre,
                           perm[i], perm[i]);
      b +=
          (size_t)sprintf(want + b, "%s\"%s%02d\":%d", i ? "," : "", pre, i, i);
    }
    strcpy(in + a, "}");
    strcpy(want + b, "}");
    expect_canon(in, want);
    if (n > 1) { /* the last key again */
      in[a] = '\0';
      size_t at = a + 1;
      sprintf(in + a, ",\"%s%02d\":0}", pre, perm[0]);
      expect_error_s(in, AG_EDUPKEY, (long)at);
    }
  }
}

Test(jcs, duplicate_keys) {
  expect_error_s("{\"a\":1,\"a\":2}", AG_EDUPKEY, 7);
  expect_error_s("{\"a\":1,\"\\u0061\":2}", AG_EDUPKEY, 7);
  expect_error_s("{\"\\u00e9\":1,\"\xc3\xa9\":2}", AG_EDUPKEY, 12);
  expect_error_s("{\"b\":1,\"a\":1,\"c\":1,\"a\":2,\"a\":3}", AG_EDUPKEY, 19);
  expect_error_s("[{\"x\":[{\"p\":1}],\"x\":2}]", AG_EDUPKEY, 16);
  /* Source order: the earliest problem wins. */
  expect_error_s("{\"a\":1,\"a\":{\"b\":1,\"b\":2}}", AG_EDUPKEY, 7);
  expect_error_s("{\"x\":{\"b\":1,\"b\":2},\"a\":1,\"a\":2}", AG_EDUPKEY, 12);
  expect_error_s("{\"x\":{\"b\":1,\"b\":2}, oops", AG_EDUPKEY, 12);
  /* Same key in different objects is fine. */
  expect_canon("{\"a\":{\"a\":{\"a\":1}},\"b\":{\"a\":2}}",
               "{\"a\":{\"a\":{\"a\":1}},\"b\":{\"a\":2}}");

  ag_error_t err;
  uint8_t sig[32];
  const char *j = "{\"path\":1,\"path\":2}";
  cr_assert_eq(ag_signature("t", j, strlen(j), sig, &err), AG_EDUPKEY);
  cr_expect_str_eq(err.msg, "arguments: duplicate key \"path\" at byte 10");
}

/* ------------------------------------------------------------------------ */
/* Invalid input                                                            */
/* ------------------------------------------------------------------------ */

Test(jcs, invalid_json) {
  expect_error_s("{\"a\":", AG_EJSON, 5);        /* truncated */
  expect_error_s("{\"a\":1", AG_EJSON, 6);       /* truncated */
  expect_error_s("{\"a", AG_EJSON, 3);           /* truncated string */
  expect_error_s("[1,2,]", AG_EJSON, 5);         /* trailing comma */
  expect_error_s("{\"a\":1,}", AG_EJSON, 7);     /* trailing comma */
  expect_error_s("{'a':1}", AG_EJSON, 1);        /* single quotes */
  expect_error_s("{\"a\":'x'}", AG_EJSON, 5);    /* single quotes */
  expect_error_s("[NaN]", AG_EJSON, 1);          /* NaN */
  expect_error_s("[Infinity]", AG_EJSON, 1);     /* Infinity */
  expect_error_s("{\"n\":012}", AG_EJSON, 5);    /* leading zero */
  expect_error_s("-01", AG_EJSON, 0);            /* leading zero */
  expect_error_s("hello", AG_EJSON, 0);          /* bare word */
  expect_error_s("[tru]", AG_EJSON, 1);          /* bad literal */
  expect_error_s("{\"a\":1} x", AG_EJSON, 8);    /* trailing garbage */
  expect_error_s("{} {}", AG_EJSON, 3);          /* two values */
  expect_error_s("[1 2]", AG_EJSON, 3);          /* missing comma */
  expect_error_s("{\"a\" 1}", AG_EJSON, 5);      /* missing colon */
  expect_error_s("{1:2}", AG_EJSON, 1);          /* non-string key */
  expect_error_s("[1.]", AG_EJSON, 3);           /* fraction digits */
  expect_error_s("[.5]", AG_EJSON, 1);           /* no int part */
  expect_error_s("[1e]", AG_EJSON, 3);           /* exponent digits */
  expect_error_s("[+1]", AG_EJSON, 1);           /* plus sign */
  expect_error_s("[-]", AG_EJSON, 2);            /* lone minus */
  expect_error_s("\"a\tb\"", AG_EJSON, 2);       /* raw control char */
  expect_error_s("\"\\x\"", AG_EJSON, 1);        /* bad escape */
  expect_error_s("\"\\u12g4\"", AG_EJSON, 1);    /* bad \u */
  expect_error_s("\"\\u12\"", AG_EJSON, 1);      /* short \u */
  expect_error_s("[1,2", AG_EJSON, 4);           /* unclosed array */
  expect_error_s("[1}", AG_EJSON, 2);            /* mismatched */
  expect_error_s("\xef\xbb\xbf{}", AG_EJSON, 0); /* BOM */
  expect_error_s("{\"a\":1}\v", AG_EJSON, 7);    /* not JSON whitespace */
  expect_error("[1,\0]", 5, AG_EJSON, 3);        /* NUL byte */

  ag_error_t err;
  uint8_t sig[32];
  cr_assert_eq(ag_signature("t", "[1,]", 4, sig, &err), AG_EJSON);
  cr_expect(strstr(err.msg, "byte 3") != NULL, "message: %s", err.msg);
  cr_assert_eq(ag_signature("t", "{'a':1}", 7, sig, &err), AG_EJSON);
  cr_expect(strstr(err.msg, "byte 1") != NULL, "message: %s", err.msg);
}

Test(jcs, invalid_utf8) {
  expect_error_s("\"\\ud800\"", AG_EUTF8, 1);           /* lone high */
  expect_error_s("\"\\udc00\"", AG_EUTF8, 1);           /* lone low */
  expect_error_s("\"x\\ud800\\u0041\"", AG_EUTF8, 2);   /* high + BMP */
  expect_error_s("\"\\ud800\\ud800\"", AG_EUTF8, 1);    /* high + high */
  expect_error_s("{\"\\ud83d\":1}", AG_EUTF8, 2);       /* in a key */
  expect_error_s("\"\xff\"", AG_EUTF8, 1);              /* invalid byte */
  expect_error_s("\"ab\x80\"", AG_EUTF8, 3);            /* stray cont. */
  expect_error_s("\"\xc0\xaf\"", AG_EUTF8, 1);          /* overlong */
  expect_error_s("\"\xe0\x80\xaf\"", AG_EUTF8, 1);      /* overlong */
  expect_error_s("\"\xed\xa0\x80\"", AG_EUTF8, 1);      /* UTF-8 surrogate */
  expect_error_s("\"\xf4\x90\x80\x80\"", AG_EUTF8, 1);  /* > U+10FFFF */
  expect_error_s("\"\xe2\x82\"", AG_EUTF8, 1);          /* truncated */
  expect_error_s("\"0123456789\xe2\x82", AG_EUTF8, 11); /* at the end */
  expect_error_s("[\"ok\",\"0123456789abcdef\xfe\"]", AG_EUTF8, 23);
}

/* ------------------------------------------------------------------------ */
/* Limits                                                                   */
/* ------------------------------------------------------------------------ */

static char *nested(int depth) {
  char *s = malloc((size_t)depth * 2 + 1);
  for (int i = 0; i < depth; i++) {
    s[i] = '[';
    s[depth * 2 - 1 - i] = ']';
  }
  s[depth * 2] = '\0';
  return s;
}

Test(jcs, limits) {
  ag__jcs *j;
  ag_error_t err;
  uint8_t sig[32];
  cr_assert_eq(ag__jcs_new(&j, 100, 10, 4, &err), AG_OK, "%s", err.msg);

  /* depth: 4 is fine, 5 is not; the position is the fifth bracket. */
  cr_expect_eq(ag__jcs_signature(j, "t", 1, "[[[[]]]]", 8, sig, &err), AG_OK);
  cr_expect_eq(ag__jcs_signature(j, "t", 1, "[[{\"a\":[[]]}]]", 14, sig, &err),
               AG_EDEPTH);
  cr_expect_eq(err.pos, 8, "depth pos %ld", err.pos);

  /* tokens: 10 values and keys are fine, 11 are not. */
  cr_expect_eq(
      ag__jcs_signature(j, "t", 1, "[1,2,3,4,5,6,7,8,9]", 19, sig, &err), AG_OK,
      "%s", err.msg);
  cr_expect_eq(
      ag__jcs_signature(j, "t", 1, "[1,2,3,4,5,6,7,8,9,0]", 21, sig, &err),
      AG_ETOOBIG);
  cr_expect_eq(err.pos, 19, "token pos %ld", err.pos);
  cr_expect_eq(ag__jcs_signature(j, "t", 1,
                                 "{\"a\":1,\"b\":2,\"c\":3,\"d\":4,"
                                 "\"e\":5}",
                                 31, sig, &err),
               AG_ETOOBIG);
  cr_expect_eq(err.pos, 29, "token pos %ld", err.pos);

  /* bytes: 100 is fine, 101 is not. */
  char buf[128];
  memset(buf, ' ', sizeof(buf));
  buf[0] = '1';
  cr_expect_eq(ag__jcs_signature(j, "t", 1, buf, 100, sig, &err), AG_OK);
  cr_expect_eq(ag__jcs_signature(j, "t", 1, buf, 101, sig, &err), AG_ETOOBIG);
  cr_expect_eq(err.code, AG_ETOOBIG);

  /* Still usable after errors. */
  cr_expect_eq(ag__jcs_signature(j, "t", 1, "{\"b\":1,\"a\":2}", 13, sig, &err),
               AG_OK);
  ag__jcs_free(j);

  /* Invalid limits. */
  cr_expect_eq(ag__jcs_new(&j, 100, 0, 4, &err), AG_EINVAL);
  cr_expect_null(j);
  cr_expect_eq(ag__jcs_new(&j, 100, 10, 0, &err), AG_EINVAL);

  /* The convenience functions allow depth 256. */
  char *s = nested(256);
  char *out = canon(s);
  cr_expect_str_eq(out, s);
  ag_free(out);
  free(s);
  s = nested(257);
  expect_error_s(s, AG_EDEPTH, 256);
  free(s);

  /* The convenience functions never stop at a token cap: unclosed
   * brackets are a syntax error at the end. */
  char open[200];
  memset(open, '[', sizeof(open) - 1);
  open[sizeof(open) - 1] = '\0';
  for (int i = 0; i < 150; i += 3)
    open[i] = '\t';
  expect_error_s(open, AG_EJSON, 199);
}

Test(jcs, huge_but_allowed) {
  ag__jcs *j;
  ag_error_t err;
  uint8_t sig[32], sig2[32];
  cr_assert_eq(ag__jcs_new(&j, 1 << 20, 65536, 64, &err), AG_OK);

  /* A 512 KiB string value. */
  size_t n = 512 * 1024;
  char *big = malloc(n + 64);
  int len = sprintf(big, "{\"content\":\"");
  for (size_t i = 0; i < n; i++)
    big[len + i] = (char)('a' + i % 26);
  len += (int)n;
  len += sprintf(big + len, "\",\"path\":\"/tmp/x\"}");
  cr_expect_eq(ag__jcs_signature(j, "write", 5, big, (size_t)len, sig, &err),
               AG_OK, "%s", err.msg);
  cr_expect_eq(ag_signature("write", big, (size_t)len, sig2, &err), AG_OK);
  cr_expect_eq(memcmp(sig, sig2, 32), 0);
  char *c = NULL;
  size_t clen = 0;
  cr_expect_eq(ag_canonicalize(big, (size_t)len, &c, &clen, &err), AG_OK);
  cr_expect_eq(clen, (size_t)len);
  cr_expect_eq(memcmp(c, big, clen), 0);
  ag_free(c);
  free(big);

  /* An array of 20,000 numbers, some needing the double path. */
  char *arr = malloc(20000 * 24 + 16);
  char *p = arr;
  *p++ = '[';
  for (int i = 0; i < 20000; i++)
    p += sprintf(p, i % 100 == 0 ? "%s%d.12345678901234567" : "%s%d",
                 i ? "," : "", i);
  *p++ = ']';
  cr_expect_eq(
      ag__jcs_signature(j, "nums", 4, arr, (size_t)(p - arr), sig, &err), AG_OK,
      "%s", err.msg);
  cr_expect_eq(ag_signature("nums", arr, (size_t)(p - arr), sig2, &err), AG_OK,
               "%s", err.msg);
  cr_expect_eq(memcmp(sig, sig2, 32), 0);
  free(arr);
  ag__jcs_free(j);
}

Test(jcs, million_signatures, .timeout = 120) {
  ag__jcs *j;
  ag_error_t err;
  cr_assert_eq(ag__jcs_new(&j, 4096, 256, 16, &err), AG_OK);
  uint8_t first[32], sig[32];
  const char *args =
      "{\"path\":\"src/main.c\",\"line\":42,\"opts\":{\"b\":true,"
      "\"a\":[1.5,\"x\"]}}";
  size_t len = strlen(args);
  cr_assert_eq(ag__jcs_signature(j, "read", 4, args, len, first, &err), AG_OK);
  for (int i = 0; i < 1000000; i++) {
    ag_err_t rc = ag__jcs_signature(j, "read", 4, args, len, sig, &err);
    if (rc != AG_OK || memcmp(sig, first, 32) != 0)
      cr_assert_fail("signature %d differs or failed: %s", i, err.msg);
  }
  ag__jcs_free(j);
}

Test(jcs, sink_stop) {
  ag__jcs *j;
  cr_assert_eq(ag__jcs_new(&j, 1 << 16, 1024, 16, NULL), AG_OK);
  char buf[8];
  membuf out = {buf, 0, sizeof(buf)};
  ag_error_t err;
  const char *args = "{\"a\":\"0123456789\"}";
  cr_expect_eq(ag__jcs_write(j, args, strlen(args), mem_sink, &out, &err),
               AG_ENOSPACE);
  cr_expect_eq(err.code, AG_ENOSPACE);
  /* Errors are found before the sink sees any byte. */
  out.len = 0;
  cr_expect_eq(ag__jcs_write(j, "[1,1e999]", 9, mem_sink, &out, &err),
               AG_ENUMBER);
  cr_expect_eq(out.len, 0);
  /* A large output goes through in chunks. */
  size_t n = 20000;
  char *in = malloc(n + 3), *got = malloc(n + 3);
  in[0] = '"';
  memset(in + 1, 'q', n);
  in[n + 1] = '"';
  membuf big = {got, 0, n + 3};
  cr_expect_eq(ag__jcs_write(j, in, n + 2, mem_sink, &big, &err), AG_OK);
  cr_expect_eq(big.len, n + 2);
  cr_expect_eq(memcmp(got, in, n + 2), 0);
  free(in);
  free(got);
  ag__jcs_free(j);
}

Test(jcs, null_arguments) {
  uint8_t sig[32];
  char *out;
  cr_expect_eq(ag_signature(NULL, "{}", 2, sig, NULL), AG_EINVAL);
  cr_expect_eq(ag_signature("t", NULL, 2, sig, NULL), AG_EINVAL);
  cr_expect_eq(ag_signature("t", "{}", 2, NULL, NULL), AG_EINVAL);
  cr_expect_eq(ag_canonicalize("{}", 2, NULL, NULL, NULL), AG_EINVAL);
  cr_expect_eq(ag_canonicalize(NULL, 2, &out, NULL, NULL), AG_EINVAL);
  cr_expect_eq(ag_canonicalize(NULL, 0, &out, NULL, NULL), AG_OK);
  cr_expect_str_eq(out, "{}");
  ag_free(out);
}

/* ---- the tape as a JSON reader (ag__jcs_tape, for the proxy) ------------ */

Test(jcs, tape_reader) {
  ag__jcs *j = NULL;
  ag_error_t err;
  cr_assert_eq(ag__jcs_tape_new(&j, 4096, 8, &err), AG_OK, "%s", err.msg);
  const char *text =
      "{ \"b\\u0061\" : [1, {\"x\": \"\\u00e9\\ud83d\\ude00\\n\\\"\\/\"}, "
      "-2.5e3 ] , \"c\":true,\"d\": { } ,\"e\":\"plain\"}";
  size_t n = 0;
  cr_assert_eq(ag__jcs_tape(j, text, strlen(text), &n, &err), AG_OK, "%s",
               err.msg);
  /* { ba [ 1 { x "..." } -2.5e3 ] c true d {} e "plain" } */
  cr_assert_eq(n, 14);
  cr_expect_eq(ag__jcs_tok_type(j, 0), AG__JT_OBJ);
  cr_expect_eq(ag__jcs_tok_next(j, 0), 14);
  cr_expect_eq(ag__jcs_tok_type(j, 1), AG__JT_KEY);
  cr_expect(ag__jcs_key_is(j, 1, "ba", 2)); /* decoded */
  cr_expect(!ag__jcs_key_is(j, 1, "b\\u0061", 7));
  cr_expect_eq(ag__jcs_tok_type(j, 2), AG__JT_ARR);
  cr_expect_eq(ag__jcs_tok_next(j, 2), 8);
  cr_expect_eq(ag__jcs_tok_type(j, 3), AG__JT_NUM);
  cr_expect_eq(ag__jcs_tok_next(j, 4), 7);
  cr_expect_eq(ag__jcs_tok_type(j, 6), AG__JT_STR);
  cr_expect(ag__jcs_str_escaped(j, 6));
  char out[64];
  size_t l = ag__jcs_str_decode(j, 6, out);
  cr_expect_eq(l, 2 + 4 + 3);
  cr_expect_str_eq(out, "\xc3\xa9\xf0\x9f\x98\x80\n\"/");
  cr_expect_eq(ag__jcs_tok_type(j, 7), AG__JT_NUM);
  cr_expect_eq(ag__jcs_tok_type(j, 9), AG__JT_TRUE);
  cr_expect_eq(ag__jcs_tok_type(j, 11), AG__JT_OBJ);
  cr_expect_eq(ag__jcs_tok_next(j, 11), 12);
  cr_expect(!ag__jcs_str_escaped(j, 13));
  const char *raw;
  cr_expect_eq(ag__jcs_str_raw(j, 13, &raw), 5);
  cr_expect_eq(strncmp(raw, "plain", 5), 0);
  /* member spans: the value's own text, whitespace around it left out */
  size_t at, len;
  len = ag__jcs_member_span(j, 1, &at);
  cr_expect_eq(len, strlen("[1, {\"x\": \"\\u00e9\\ud83d\\ude00\\n\\\"\\/\"}, "
                           "-2.5e3 ]"));
  cr_expect_eq(text[at], '[');
  cr_expect_eq(text[at + len - 1], ']');
  len = ag__jcs_member_span(j, 5, &at); /* inside: "x" */
  cr_expect_eq(text[at], '"');
  cr_expect_eq(text[at + len - 1], '"');
  len = ag__jcs_member_span(j, 10, &at);
  cr_expect_eq(len, 3);
  cr_expect_eq(strncmp(text + at, "{ }", 3), 0);
  len = ag__jcs_member_span(j, 8, &at);
  cr_expect_eq(len, 4);
  cr_expect_eq(strncmp(text + at, "true", 4), 0);
  /* a number at the end of a member */
  const char *num = "{\"n\":-12.5e-3}";
  cr_assert_eq(ag__jcs_tape(j, num, strlen(num), &n, &err), AG_OK);
  len = ag__jcs_member_span(j, 1, &at);
  cr_expect_eq(len, 8);
  /* refusals: empty text (no "{}" default here), duplicates, depth */
  cr_expect_eq(ag__jcs_tape(j, "", 0, &n, &err), AG_EJSON);
  cr_expect_eq(ag__jcs_tape(j, "{\"a\":1,\"a\":2}", 13, &n, &err), AG_EDUPKEY);
  cr_expect_eq(ag__jcs_tape(j, "[[[[[[[[[1]]]]]]]]]", 19, &n, &err), AG_EDEPTH);
  cr_expect_eq(ag__jcs_tape(j, "{\"a\":1} x", 9, &n, &err), AG_EJSON);
  ag__jcs_free(j);
}
