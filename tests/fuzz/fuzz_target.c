/*
 * tests/fuzz/fuzz_target.c - libFuzzer target for the proxy's
 * request-target check and normalisation (ag__target_normalise,
 * src/proxy/target.c): the one place that stands between a client's
 * request line and the upstream's URL. Built by CMake with clang
 * (AG_FUZZ); scripts/fuzz.sh runs it with tests/fuzz/corpus/target/ and
 * tests/fuzz/target.dict.
 *
 * Properties checked on every input (any bytes; cut at the first NUL, as
 * a request line is):
 *  - an accepted target gives a result no longer than the input, starting
 *    with exactly one '/', with no empty, "." or ".." segment in its path,
 *    no '%' that is not followed by two upper-case hex digits in its path,
 *    no escape of an unreserved character or of ':', and nothing outside the
 *    characters RFC 3986 allows;
 *  - normalising is idempotent: the result, normalised again, is itself;
 *  - a refused target always says why; the input is never read past its
 *    NUL (the copy is exactly sized, so ASan catches an over-read).
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../src/proxy/target.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok, const char *what, const char *in) {
  if (!ok) {
    fprintf(stderr, "fuzz_target: property failed: %s (input \"%s\")\n", what,
            in);
    abort();
  }
}

static bool hex_upper(char c) {
  return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'F');
}

static bool unreserved(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (c >= '0' && c <= '9') || c == '-' || c == '.' || c == '_' || c == '~';
}

static int hexv(char c) {
  return c <= '9' ? c - '0' : c - 'A' + 10;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  size_t n = strnlen((const char *)data, size);
  char *in = malloc(n + 1);
  check(in != NULL, "malloc", "");
  memcpy(in, data, n);
  in[n] = '\0';
  char *out = malloc(n + 1);
  check(out != NULL, "malloc", "");
  const char *why = NULL;
  if (!ag__target_normalise(in, out, n + 1, &why)) {
    check(why != NULL && why[0] != '\0', "a refusal says why", in);
    free(out);
    free(in);
    return 0;
  }
  size_t ol = strlen(out);
  check(ol <= n, "never longer than the input", in);
  check(out[0] == '/' && out[1] != '/', "one leading '/'", in);
  size_t pl = strcspn(out, "?");
  for (size_t i = 0; i < pl; i++) {
    unsigned char c = (unsigned char)out[i];
    check(c > 0x20 && c < 0x7f && c != '\\' && c != '#', "only URL characters",
          in);
    if (c == '/') {
      check(i + 1 >= pl || out[i + 1] != '/', "no empty segment", in);
      size_t e = i + 1;
      while (e < pl && out[e] != '/')
        e++;
      size_t sl = e - (i + 1);
      check(!(sl == 1 && out[i + 1] == '.'), "no '.' segment", in);
      check(!(sl == 2 && out[i + 1] == '.' && out[i + 2] == '.'),
            "no '..' segment", in);
    }
    if (c == '%') {
      check(i + 2 < pl && hex_upper(out[i + 1]) && hex_upper(out[i + 2]),
            "escapes are two upper-case hex digits", in);
      int v = hexv(out[i + 1]) * 16 + hexv(out[i + 2]);
      check(!unreserved((unsigned char)v) && v != ':',
            "unreserved ones and ':' decoded", in);
      check(v != '/' && v != '\\' && v >= 0x20 && v != 0x7f,
            "no encoded '/', '\\' or control", in);
    }
  }
  char *again = malloc(ol + 1);
  check(again != NULL, "malloc", "");
  check(ag__target_normalise(out, again, ol + 1, &why),
        "a normalised target is accepted", in);
  check(strcmp(again, out) == 0, "idempotent", in);
  free(again);
  free(out);
  free(in);
  return 0;
}
