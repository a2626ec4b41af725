/*
 * tests/unit/test_base.c - the base layer's helpers (src/base/): the capped
 * buffer, the UTF-8 helpers, strndup, the JSON type names, the HTTP reason
 * phrases and the backoff calculation.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "base/internal.h"

Test(buf, every_append_checks_the_cap) {
  ag__buf b;
  ag__buf_init(&b, 10);
  cr_assert_str_eq(ag__buf_str(&b), "");
  cr_assert_eq(ag__buf_addstr(&b, "hello"), AG_OK);
  cr_assert_eq(ag__buf_addstr(&b, "world"), AG_OK);
  cr_assert_str_eq(ag__buf_str(&b), "helloworld");
  cr_assert_eq(ag__buf_addstr(&b, "!"), AG_ETOOBIG);
  cr_assert_str_eq(ag__buf_str(&b), "helloworld",
                   "a refused append adds "
                   "nothing");
  cr_assert(b.cut);
  cr_assert_leq(b.alloc, 11u, "never more than cap + 1 bytes");
  ag__buf_reset(&b);
  cr_assert_eq(b.len, 0u);
  cr_assert_not(b.cut);
  cr_assert_str_eq(ag__buf_str(&b), "");
  ag__buf_free(&b);
  cr_assert_null(b.p);
}

Test(buf, grows_past_its_first_allocation) {
  ag__buf b;
  ag__buf_init(&b, 100000);
  for (int i = 0; i < 1000; i++)
    cr_assert_eq(ag__buf_add(&b, "0123456789", 10), AG_OK);
  cr_assert_eq(b.len, 10000u);
  cr_assert_eq(strlen(ag__buf_str(&b)), 10000u);
  ag__buf_free(&b);
}

Test(buf, reserve_allocates_once_within_the_cap) {
  ag__buf b;
  ag__buf_init(&b, 100);
  cr_assert_eq(ag__buf_reserve(&b, 50), AG_OK);
  cr_assert_gt(b.alloc, 50u);
  char *p = b.p;
  for (int i = 0; i < 50; i++)
    cr_assert_eq(ag__buf_add(&b, "x", 1), AG_OK);
  cr_assert_eq(b.p, p, "no reallocation within the reserve");
  cr_assert_eq(ag__buf_reserve(&b, 1000), AG_OK, "clamped to the cap");
  cr_assert_leq(b.alloc, 101u);
  ag__buf_free(&b);
  char store[4];
  ag__buf_init_fixed(&b, store, sizeof(store));
  cr_assert_eq(ag__buf_reserve(&b, 3), AG_OK);
  cr_assert_eq(ag__buf_add(&b, "abcd", 4), AG_ETOOBIG);
  cr_assert_str_eq(store, "");
}

Test(buf, cut_appends_stop_on_a_character_boundary) {
  char store[6];
  ag__buf b;
  ag__buf_init_fixed(&b, store, sizeof(store));
  ag__buf_addstr_cut(&b, "ab");
  ag__buf_addstr_cut(&b, "\xC3\xA9\xC3\xA9"); /* "éé": 4 bytes, room 3 */
  cr_assert_str_eq(store, "ab\xC3\xA9");
  cr_assert(b.cut);
  /* after a cut nothing more is kept (the text stays a prefix of what was
   * asked for), even what would fit; want counts everything */
  ag__buf_printf_cut(&b, "%d", 7);
  cr_assert_str_eq(store, "ab\xC3\xA9");
  cr_assert_eq(b.want, 7u);
  ag__buf_free(&b); /* fixed: only emptied */
  cr_assert_str_eq(store, "");
}

Test(text, strndup_copies_and_terminates) {
  char *d = ag__strndup("abcdef", 3);
  cr_assert_str_eq(d, "abc");
  free(d);
  d = ag__strndup(NULL, 0);
  cr_assert_str_eq(d, "");
  free(d);
  cr_assert_null(ag__strdup(NULL));
  d = ag__strdup("xyz");
  cr_assert_str_eq(d, "xyz");
  free(d);
  cr_assert_null(ag__strndup("x", SIZE_MAX));
}

Test(text, utf8_follows_jansson) {
  const unsigned char ok2[] = {0xC3, 0xA9}, ok4[] = {0xF0, 0x9F, 0x98, 0x80};
  cr_assert_eq(ag__utf8_seq((const unsigned char *)"a", 1), 1u);
  cr_assert_eq(ag__utf8_seq(ok2, 2), 2u);
  cr_assert_eq(ag__utf8_seq(ok4, 4), 4u);
  cr_assert_eq(ag__utf8_seq(ok4, 3), 0u, "truncated");
  const unsigned char overlong[] = {0xC0, 0x80}, sur[] = {0xED, 0xA0, 0x80},
                      big[] = {0xF4, 0x90, 0x80, 0x80},
                      over3[] = {0xE0, 0x80, 0x80};
  cr_assert_eq(ag__utf8_seq(overlong, 2), 0u);
  cr_assert_eq(ag__utf8_seq(sur, 3), 0u);
  cr_assert_eq(ag__utf8_seq(big, 4), 0u);
  cr_assert_eq(ag__utf8_seq(over3, 3), 0u);
  cr_assert(ag__utf8_valid("a\xC3\xA9z", 4));
  cr_assert_not(ag__utf8_valid("a\xC3", 2));
  cr_assert(ag__utf8_valid("", 0));
  /* cutting "aé" (3 bytes) at 2 would split é: back to 1 */
  cr_assert_eq(ag__utf8_back("a\xC3\xA9", 2), 1u);
  cr_assert_eq(ag__utf8_back("ab", 1), 1u);
  cr_assert_eq(ag__utf8_incomplete_tail("a\xE2\x82", 3), 2u);
  cr_assert_eq(ag__utf8_incomplete_tail("a\xE2\x82\xAC", 4), 0u);
  cr_assert_eq(ag__utf8_incomplete_tail("abc", 3), 0u);
}

Test(text, json_kind_and_http_reason) {
  json_t *v = json_loads("[{}, [], \"s\", 1, 1.5, true, null]", 0, NULL);
  static const char *const want[] = {"object", "array",   "string", "integer",
                                     "number", "boolean", "null"};
  for (size_t i = 0; i < 7; i++)
    cr_assert_str_eq(ag__json_kind(json_array_get(v, i)), want[i]);
  json_decref(v);
  cr_assert_str_eq(ag__http_reason(503), "Service Unavailable");
  cr_assert_str_eq(ag__http_reason(429), "Too Many Requests");
  cr_assert_str_eq(ag__http_reason(599), "Server Error");
  cr_assert_str_eq(ag__http_reason(418), "Client Error");
  cr_assert_str_eq(ag__http_reason(200), "Unexpected Status");
}

Test(rand, backoff_kinds_caps_and_jitter) {
  uint64_t rng = 42;
  cr_assert_eq(
      ag__backoff(100, 2, AG__BACKOFF_LINEAR, 0, AG__JITTER_NONE, &rng), 300);
  cr_assert_eq(
      ag__backoff(100, 2, AG__BACKOFF_CONSTANT, 0, AG__JITTER_NONE, &rng), 100);
  cr_assert_eq(
      ag__backoff(100, 3, AG__BACKOFF_EXPONENTIAL, 0, AG__JITTER_NONE, &rng),
      800);
  cr_assert_eq(
      ag__backoff(100, 3, AG__BACKOFF_EXPONENTIAL, 500, AG__JITTER_NONE, &rng),
      500);
  cr_assert_eq(ag__backoff(INT64_MAX / 2, 70, AG__BACKOFF_EXPONENTIAL, 0,
                           AG__JITTER_NONE, &rng),
               INT64_MAX, "saturates");
  cr_assert_eq(ag__backoff(-5, 1, AG__BACKOFF_LINEAR, 0, AG__JITTER_NONE, &rng),
               0);
  for (int i = 0; i < 200; i++) {
    int64_t e =
        ag__backoff(1000, 0, AG__BACKOFF_CONSTANT, 0, AG__JITTER_EQUAL, &rng);
    cr_assert(e >= 500 && e <= 1000, "%lld", (long long)e);
    int64_t f =
        ag__backoff(1000, 0, AG__BACKOFF_CONSTANT, 0, AG__JITTER_FULL, &rng);
    cr_assert(f >= 0 && f <= 1000, "%lld", (long long)f);
  }
  uint64_t zero = 0;
  cr_assert_neq(ag__rand_next(&zero), 0u, "a zero state is reseeded");
  cr_assert_neq(zero, 0u);
}
