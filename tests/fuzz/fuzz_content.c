/*
 * tests/fuzz/fuzz_content.c - libFuzzer target for the content-loop
 * detector (src/core/content.c). Not built by CMake. From the project root:
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined \
 *     -D_POSIX_C_SOURCE=200809L -Iinclude -Isrc \
 *     tests/fuzz/fuzz_content.c src/core/content.c src/base/common.c \
 *     -o /tmp/fuzz_content
 *   /tmp/fuzz_content -max_total_time=60 -max_len=8192
 *
 * The first input byte picks small options (so short inputs reach the
 * history cut and the index deletions); the rest is the text, cut into
 * pieces at every 0xff byte (the 0xff bytes are kept in the pieces, so they
 * are also invalid UTF-8 inside the text). Properties checked on every
 * input:
 *  - feeding never crashes, reads nothing outside the pieces, and is
 *    deterministic: a second detector fed the same pieces agrees at every
 *    piece, also after a reset in the middle;
 *  - once true, the answer stays true until reset;
 *  - ag_content_loop_chunk() writes valid UTF-8 of at most cap - 1 bytes,
 *    with no control bytes, no leading, trailing or double spaces, and
 *    every shorter cap gives a prefix of it;
 *  - ag_content_loop_check_text() on the same text never crashes and
 *    agrees with ag_content_loop_found() afterwards.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agentguard/content.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok, const char *what) {
  if (!ok) {
    fprintf(stderr, "fuzz_content: property broken: %s\n", what);
    abort();
  }
}

static int valid_utf8(const unsigned char *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    unsigned char c = s[i];
    size_t len = c < 0x80                 ? 1
                 : c >= 0xc2 && c <= 0xdf ? 2
                 : c >= 0xe0 && c <= 0xef ? 3
                 : c >= 0xf0 && c <= 0xf4 ? 4
                                          : 0;
    if (len == 0 || i + len > n)
      return 0;
    for (size_t j = 1; j < len; j++)
      if ((s[i + j] & 0xc0) != 0x80)
        return 0;
    i += len;
  }
  return 1;
}

static void check_chunk(const ag_content_loop *d) {
  char buf[128];
  size_t n = ag_content_loop_chunk(d, buf, sizeof(buf));
  check(n < sizeof(buf) && buf[n] == '\0' && strlen(buf) == n, "length");
  check(valid_utf8((const unsigned char *)buf, n), "chunk is valid UTF-8");
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)buf[i];
    check(c >= 0x20 && c != 0x7f, "no control bytes");
    if (c == ' ')
      check(i > 0 && i + 1 < n && buf[i + 1] != ' ', "spaces collapsed");
  }
  for (size_t cap = 1; cap < sizeof(buf); cap++) {
    char small[128];
    size_t m = ag_content_loop_chunk(d, small, cap);
    check(m < cap && m <= n && memcmp(small, buf, m) == 0, "prefix");
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  ag_content_loop_opts o;
  ag_content_loop_opts_init(&o);
  uint8_t sel = data[0];
  if (sel & 1) {
    o.chunk_size = 1 + (sel >> 1) % 8;
    o.threshold = 2 + (sel >> 4) % 4;
    o.max_history = o.chunk_size + o.threshold + (sel >> 2) % 40;
  }
  data++;
  size--;
  ag_content_loop *a = NULL, *b = NULL;
  check(ag_content_loop_new(&a, &o, NULL) == AG_OK, "new a");
  check(ag_content_loop_new(&b, &o, NULL) == AG_OK, "new b");
  size_t start = 0, piece = 0;
  int seen = 0;
  for (size_t i = 0; i <= size; i++) {
    if (i < size && data[i] != 0xff)
      continue;
    size_t end = i < size ? i + 1 : size;
    size_t n = end - start;
    /* An exact-size copy so ASan sees any read past the piece. */
    char *p = malloc(n > 0 ? n : 1);
    if (p == NULL)
      abort();
    memcpy(p, data + start, n);
    int ra = ag_content_loop_feed(a, p, n);
    int rb = ag_content_loop_feed(b, p, n);
    free(p);
    check(ra == rb, "deterministic");
    check(!seen || ra, "sticky");
    seen = ra;
    check(ra == ag_content_loop_found(a), "found agrees");
    if (ra)
      check_chunk(a);
    if (++piece == 7) { /* a reset in the middle */
      ag_content_loop_reset(a);
      ag_content_loop_reset(b);
      seen = 0;
    }
    start = end;
  }
  char *whole = malloc(size > 0 ? size : 1);
  if (whole == NULL)
    abort();
  memcpy(whole, data, size);
  int r = ag_content_loop_check_text(a, whole, size);
  free(whole);
  check(r == ag_content_loop_found(a), "check_text agrees with found");
  if (r)
    check_chunk(a);
  ag_content_loop_free(a);
  ag_content_loop_free(b);
  return 0;
}
