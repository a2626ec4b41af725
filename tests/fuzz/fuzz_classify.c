/*
 * tests/fuzz/fuzz_classify.c - libFuzzer target for the error classifier
 * (ag_classify, src/core/classify.c) and the compact error record
 * (ag_format_compact_error, ag_utf8_truncate). Built by CMake with clang
 * (AG_FUZZ); scripts/fuzz.sh runs it with tests/fuzz/corpus/classify/ and
 * tests/fuzz/classify.dict.
 *
 * Properties checked on every input (any bytes, NUL included):
 *  - ag_classify returns a category inside the enum, the same one twice,
 *    and depends only on the `len` bytes given (the bytes after them are
 *    never read: the input is copied to an exactly sized heap block, so
 *    ASan catches any over-read);
 *  - ag_utf8_truncate returns n <= min(len, max), at most 3 bytes back, a
 *    stable cut point (truncating at n again gives n), with no cut point
 *    between n and max;
 *  - ag_format_compact_error returns the same length whatever the buffer's
 *    size, always terminates the buffer, and the cut record is a prefix of
 *    the whole one.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agentguard.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok, const char *what) {
  if (!ok) {
    fprintf(stderr, "fuzz_classify: property failed: %s\n", what);
    abort();
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = malloc(size ? size : 1);
  check(text != NULL, "malloc");
  if (size)
    memcpy(text, data, size);

  ag_category cat = ag_classify(text, size);
  check(cat >= AG_CAT_UNKNOWN && cat < AG_CAT__COUNT, "category in range");
  check(ag_classify(text, size) == cat, "deterministic");
  check(ag_category_name(cat) != NULL && ag_category_suggestion(cat) != NULL,
        "category name and suggestion");

  /* The first byte picks a cut; the rest is the text. */
  size_t max = size ? (size_t)data[0] * 3 : 0;
  size_t n = ag_utf8_truncate(text, size, max);
  check(n <= size && n <= max, "truncation within bounds");
  check(n + 3 >= (max < size ? max : size), "moves back at most 3 bytes");
  check(ag_utf8_truncate(text, size, n) == n, "a cut point is stable");
  if (n < size && n < max)
    check(ag_utf8_truncate(text, size, n + 1) == n,
          "no cut point between n and max");

  size_t max_chars = size ? data[size - 1] : 0;
  size_t big_cap = size + 1024;
  char *big = malloc(big_cap);
  check(big != NULL, "malloc");
  size_t full =
      ag_format_compact_error(big, big_cap, "tool", cat, text, size, max_chars);
  check(full < big_cap, "record fits a buffer of the text's size + 1 KiB");
  check(big[full] == '\0', "the record is terminated after its length");
  char small[64];
  size_t caps[] = {1, 7, sizeof small};
  for (size_t k = 0; k < sizeof caps / sizeof caps[0]; k++) {
    memset(small, 'x', sizeof small);
    size_t need = ag_format_compact_error(small, caps[k], "tool", cat, text,
                                          size, max_chars);
    check(need == full, "same length whatever the buffer");
    size_t got = full < caps[k] - 1 ? full : caps[k] - 1;
    check(small[got] == '\0', "always terminated");
    check(memcmp(small, big, got) == 0,
          "the cut record is a prefix of the whole one");
  }
  free(big);
  free(text);
  return 0;
}
