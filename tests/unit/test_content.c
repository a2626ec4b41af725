/*
 * tests/unit/test_content.c - the content-loop detector (content.h).
 *
 * Suites:
 *   gemini     Gemini CLI's content-loop test catalogue
 *              (loopDetectionService.test.ts, the current version: a
 *              5000-character history, the 5 x chunk-size rule and the
 *              period check), ported one to one; where Gemini's test could not
 * fail (a "reset" checked with different content afterwards) the port uses the
 *              same content, so it fails without the reset.
 *   rules      exact thresholds: the piece that trips, the 250/251-byte
 *              boundary of the distance rule, the period check, the
 *              history cap.
 *   markdown   each markdown check on its own: what resets, what does not.
 *   stream     awkward piece boundaries, multi-byte UTF-8 cut anywhere.
 *   api        options, errors, check_text, the chunk description, NULLs.
 *   reference  a literal, slow port of Gemini's algorithm (strings, index
 *              arrays, every index rewritten on each cut) against the
 *              detector on random streams: same answer at the same piece.
 *   noalloc    feed and check_text never allocate.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agentguard.h"

#if defined(__SANITIZE_ADDRESS__)
#define AG_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define AG_TEST_ASAN 1
#endif
#endif

#define CHUNK 50
#define THRESHOLD 10

/* ------------------------------------------------------------------------ */
/* Helpers                                                                  */
/* ------------------------------------------------------------------------ */

static ag_content_loop *new_default(void) {
  ag_content_loop *d = NULL;
  ag_error_t err;
  cr_assert_eq(ag_content_loop_new(&d, NULL, &err), AG_OK, "new: %s", err.msg);
  return d;
}

static ag_content_loop *new_opts(size_t chunk, size_t thr, size_t hist) {
  ag_content_loop_opts o;
  ag_content_loop_opts_init(&o);
  o.chunk_size = chunk;
  o.threshold = thr;
  o.max_history = hist;
  ag_content_loop *d = NULL;
  ag_error_t err;
  cr_assert_eq(ag_content_loop_new(&d, &o, &err), AG_OK, "new: %s", err.msg);
  return d;
}

/* Feeds a copy of s in a buffer of exactly its length, so a read past the
 * piece is caught by AddressSanitizer. */
static bool feed(ag_content_loop *d, const char *s) {
  size_t n = strlen(s);
  char *copy = malloc(n > 0 ? n : 1);
  cr_assert_not_null(copy);
  memcpy(copy, s, n);
  bool r = ag_content_loop_feed(d, copy, n);
  free(copy);
  return r;
}

static bool feed_n(ag_content_loop *d, const char *s, size_t n) {
  char *copy = malloc(n > 0 ? n : 1);
  cr_assert_not_null(copy);
  memcpy(copy, s, n);
  bool r = ag_content_loop_feed(d, copy, n);
  free(copy);
  return r;
}

/* Gemini's createRepetitiveContent(id, length). */
static char *rep_content(int id, size_t length) {
  char base[64];
  snprintf(base, sizeof(base), "This is a unique sentence, id=%d. ", id);
  size_t bl = strlen(base);
  char *s = malloc(length + 1);
  cr_assert_not_null(s);
  for (size_t i = 0; i < length; i++)
    s[i] = base[i % bl];
  s[length] = '\0';
  return s;
}

static uint64_t rng_state = 88172645463325252ULL;
static uint64_t rng(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

/* Gemini's generateRandomString (caller frees). */
static char *random_string(size_t n) {
  static const char cs[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  char *s = malloc(n + 1);
  cr_assert_not_null(s);
  for (size_t i = 0; i < n; i++)
    s[i] = cs[rng() % (sizeof(cs) - 1)];
  s[n] = '\0';
  return s;
}

/* Feeds s `times` times; returns the 1-based feed that first returned true,
 * or 0. */
static int feed_times(ag_content_loop *d, const char *s, int times) {
  for (int i = 1; i <= times; i++)
    if (feed(d, s))
      return i;
  return 0;
}

/* Builds the state "rep x 9" then feeds `marker`, then checks that the next
 * `after` repetitions of the same content do (expect_trip) or do not trip. */
static void check_reset_by(const char *marker, bool expect_reset) {
  ag_content_loop *d = new_default();
  char *r = rep_content(1, CHUNK);
  cr_assert_eq(feed_times(d, r, THRESHOLD - 1), 0);
  feed(d, marker);
  int at = feed_times(d, r, THRESHOLD - 1);
  if (expect_reset)
    cr_expect_eq(at, 0,
                 "after %s: tripped at repetition %d; the piece should have "
                 "reset the tracking",
                 marker, at);
  else
    cr_expect_eq(at, 1,
                 "after \"%s\": tripped at repetition %d, want 1 (the piece "
                 "must not reset the tracking)",
                 marker, at);
  free(r);
  ag_content_loop_free(d);
}

/* ------------------------------------------------------------------------ */
/* Gemini CLI's catalogue                                                   */
/* ------------------------------------------------------------------------ */

Test(gemini, no_loop_for_random_content) {
  ag_content_loop *d = new_default();
  for (int i = 0; i < 1000; i++) {
    char *s = random_string(10);
    cr_assert_not(feed(d, s), "random piece %d (%s) tripped", i, s);
    free(s);
  }
  ag_content_loop_free(d);
}

Test(gemini, loop_when_a_chunk_repeats_consecutively) {
  ag_content_loop *d = new_default();
  char *r = rep_content(1, CHUNK);
  int at = feed_times(d, r, THRESHOLD);
  cr_expect_eq(at, THRESHOLD, "tripped at repetition %d, want %d", at,
               THRESHOLD);
  free(r);
  ag_content_loop_free(d);
}

Test(gemini, no_loop_when_repetitions_are_far_apart) {
  ag_content_loop *d = new_default();
  char *r = rep_content(1, CHUNK);
  for (int i = 0; i < THRESHOLD; i++) {
    cr_assert_not(feed(d, r), "repetition %d tripped", i + 1);
    char *filler = random_string(2000);
    cr_assert_not(feed(d, filler), "filler %d tripped", i + 1);
    free(filler);
  }
  free(r);
  ag_content_loop_free(d);
}

Test(gemini, no_loop_for_a_list_with_a_long_shared_prefix) {
  char list[2048] = "";
  for (int i = 0; i < 15; i++) {
    char line[128];
    snprintf(line, sizeof line,
             "- projects/my-google-cloud-project-12345/locations/"
             "us-central1/services/%d\n",
             i);
    strcat(list, line);
  }
  ag_content_loop *d = new_default();
  cr_expect_not(feed(d, list));
  ag_content_loop_free(d);
}

/* Gemini's loops of longer periods, each fed up to threshold + 20 times
 * (alternating phrases: threshold x 10): every one trips. */
Test(gemini, loops_of_longer_periods_trip) {
  char *longp = rep_content(1, 150);
  const struct {
    const char *text;
    int times;
  } cases[] = {
      {longp, THRESHOLD + 20},
      {"I will not output any text.\n  I will just end the turn.\n  I am "
       "done.\n  I will not do anything else.\n  I will wait for the user's "
       "next command.\n",
       THRESHOLD + 20},
      {"I have added all the requested logs and verified the test file. I "
       "will now mark the task as complete.\n  ",
       THRESHOLD + 20},
      {"Thinking... Done. ", THRESHOLD * 10},
      {"I need to check the file. The file does not exist. I will create "
       "the file. ",
       THRESHOLD + 20},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    ag_content_loop *d = new_default();
    cr_expect_neq(feed_times(d, cases[i].text, cases[i].times), 0,
                  "case %zu did not trip", i);
    ag_content_loop_free(d);
  }
  free(longp);
}

Test(gemini, no_loop_inside_a_code_block) {
  ag_content_loop *d = new_default();
  char *r = rep_content(1, CHUNK);
  cr_assert_not(feed(d, "```\n"));
  cr_expect_eq(feed_times(d, r, THRESHOLD), 0);
  cr_expect_not(feed(d, "\n```"));
  free(r);
  ag_content_loop_free(d);
}

Test(gemini, no_loop_when_content_moves_into_a_code_block) {
  ag_content_loop *d = new_default();
  char *r = rep_content(1, CHUNK);
  cr_assert_eq(feed_times(d, r, THRESHOLD - 2), 0);
  cr_assert_not(feed(d, "```javascript\n"));
  cr_expect_eq(feed_times(d, r, THRESHOLD), 0);
  free(r);
  ag_content_loop_free(d);
}

Test(gemini, skips_detection_when_already_inside_a_code_block) {
  ag_content_loop *d = new_default();
  char *r = rep_content(1, CHUNK);
  cr_assert_not(feed(d, "Here is some code:\n```\n"));
  cr_expect_eq(feed_times(d, r, THRESHOLD + 5), 0);
  free(r);
  ag_content_loop_free(d);
}

Test(gemini, tracks_the_code_block_state_over_several_fences) {
  ag_content_loop *d = new_default();
  char *r = rep_content(1, CHUNK);
  cr_assert_not(feed(d, "Normal text "));
  cr_assert_not(feed(d, "```\n")); /* enter */
  cr_assert_eq(feed_times(d, r, 5), 0);
  cr_assert_not(feed(d, "```\n"));       /* leave */
  cr_assert_not(feed(d, "```python\n")); /* enter again */
  /* Beyond Gemini's test: still inside, then outside again. */
  cr_expect_eq(feed_times(d, r, THRESHOLD + 2), 0, "tripped inside a block");
  cr_assert_not(feed(d, "```\n")); /* leave */
  int at = feed_times(d, r, THRESHOLD);
  cr_expect_eq(at, THRESHOLD, "outside the block: tripped at %d, want %d", at,
               THRESHOLD);
  free(r);
  ag_content_loop_free(d);
}

Test(gemini, loop_outside_a_code_block) {
  ag_content_loop *d = new_default();
  char *r = rep_content(1, CHUNK);
  feed(d, "```");
  feed(d, "\nsome code\n");
  feed(d, "```");
  int at = feed_times(d, r, THRESHOLD);
  cr_expect_eq(at, THRESHOLD, "tripped at %d, want %d", at, THRESHOLD);
  free(r);
  ag_content_loop_free(d);
}

Test(gemini, several_code_blocks_and_no_loop) {
  ag_content_loop *d = new_default();
  cr_expect_not(feed(d, "```\ncode1\n```"));
  cr_expect_not(feed(d, "\nsome text\n"));
  cr_expect_not(feed(d, "```\ncode2\n```"));
  /* Both blocks were closed within their pieces: prose is analysed. */
  char *r = rep_content(1, CHUNK);
  cr_expect_eq(feed_times(d, r, THRESHOLD), THRESHOLD);
  free(r);
  ag_content_loop_free(d);
}

Test(gemini, mixed_code_blocks_and_looping_text) {
  ag_content_loop *d = new_default();
  char *r = rep_content(1, CHUNK);
  feed(d, "```");
  feed(d, "\ncode1\n");
  feed(d, "```");
  cr_expect_eq(feed_times(d, r, THRESHOLD), THRESHOLD);
  free(r);
  ag_content_loop_free(d);
}

Test(gemini, long_code_block_with_repeating_tokens) {
  ag_content_loop *d = new_default();
  const char *tokens = "for (let i = 0; i < 10; i++) { console.log(i); }";
  cr_assert_not(feed(d, "```\n"));
  cr_expect_eq(feed_times(d, tokens, 20), 0);
  cr_expect_not(feed(d, "\n```"));
  /* The same tokens outside a block are a loop (48-byte period). */
  ag_content_loop_reset(d);
  cr_expect_neq(feed_times(d, tokens, 20), 0);
  ag_content_loop_free(d);
}

Test(gemini, code_fence_resets_tracking) {
  ag_content_loop *d = new_default();
  char *r = rep_content(1, CHUNK);
  cr_assert_eq(feed_times(d, r, THRESHOLD - 1), 0);
  cr_assert_not(feed(d, "```"));
  cr_expect_eq(feed_times(d, r, THRESHOLD), 0);
  free(r);
  ag_content_loop_free(d);
}

Test(gemini, table_resets_tracking) {
  check_reset_by("| Column 1 | Column 2 |", true);
}

Test(gemini, list_item_resets_tracking) {
  check_reset_by("* List item", true);
}

Test(gemini, heading_resets_tracking) {
  check_reset_by("## Heading", true);
}

Test(gemini, blockquote_resets_tracking) {
  check_reset_by("> Quote text", true);
}

Test(gemini, various_list_item_formats_reset) {
  const char *formats[] = {"\n* Bullet item", "\n- Dash item", "\n+ Plus item",
                           "\n1. Numbered item", "\n42. Another numbered item"};
  for (size_t i = 0; i < sizeof(formats) / sizeof(formats[0]); i++)
    check_reset_by(formats[i], true);
}

Test(gemini, various_table_formats_reset) {
  const char *formats[] = {"\n| Column 1 | Column 2 |", "\n|---|---|",
                           "\n|++|++|", "\n+---+---+"};
  for (size_t i = 0; i < sizeof(formats) / sizeof(formats[0]); i++)
    check_reset_by(formats[i], true);
}

Test(gemini, various_heading_levels_reset) {
  const char *formats[] = {"\n# H1 Heading",     "\n## H2 Heading",
                           "\n### H3 Heading",   "\n#### H4 Heading",
                           "\n##### H5 Heading", "\n###### H6 Heading"};
  for (size_t i = 0; i < sizeof(formats) / sizeof(formats[0]); i++)
    check_reset_by(formats[i], true);
}

Test(gemini, empty_content) {
  ag_content_loop *d = new_default();
  cr_expect_not(ag_content_loop_feed(d, "", 0));
  cr_expect_not(ag_content_loop_feed(d, NULL, 0));
  cr_expect_not(ag_content_loop_feed(d, NULL, 5)); /* NULL: empty piece */
  ag_content_loop_free(d);
}

Test(gemini, repeating_divider_is_not_a_loop) {
  ag_content_loop *d = new_default();
  char div[CHUNK + 1];
  memset(div, '-', CHUNK);
  div[CHUNK] = '\0';
  cr_expect_eq(feed_times(d, div, THRESHOLD + 5), 0);
  ag_content_loop_free(d);
}

Test(gemini, repeating_box_drawing_divider_is_not_a_loop) {
  ag_content_loop *d = new_default();
  char div[CHUNK / 2 * 6 + 1] = "";
  for (int i = 0; i < CHUNK / 2; i++)
    strcat(div, "\xe2\x95\xad\xe2\x94\x80"); /* U+256D U+2500 */
  cr_expect_eq(feed_times(d, div, THRESHOLD + 5), 0);
  ag_content_loop_free(d);
}

/* Gemini: a tool call resets the content tracking; here the caller resets
 * at a new reply. 'Some content.' is 13 bytes: 12 pieces hold 9 occurrences
 * of the first chunk, the 13th piece makes 10. */
Test(gemini, reset_clears_the_count) {
  ag_content_loop *d = new_default();
  cr_assert_eq(feed_times(d, "Some content.", 12), 0);
  cr_expect(feed(d, "Some content."), "control: the 13th piece trips");
  ag_content_loop_reset(d);
  cr_assert_not(ag_content_loop_found(d));
  cr_assert_eq(feed_times(d, "Some content.", 12), 0);
  ag_content_loop_reset(d);
  cr_expect_not(feed(d, "Some content."), "tripped after a reset");
  cr_expect_not(feed(d, "Fresh content."));
  ag_content_loop_free(d);
}

/* ------------------------------------------------------------------------ */
/* Exact rules                                                              */
/* ------------------------------------------------------------------------ */

/* A period P of text with no inner repetition: each chunk recurs every P
 * bytes, so the average distance is P; the loop needs P <= 250 (5 chunks)
 * and 10 occurrences inside the 5000-byte history. */
static int trips_with_period(size_t period, int pieces) {
  char *unit = random_string(period);
  ag_content_loop *d = new_default();
  int at = feed_times(d, unit, pieces);
  ag_content_loop_free(d);
  free(unit);
  return at;
}

Test(rules, distance_boundary_is_five_chunks) {
  /* 10 occurrences of the first chunk need 50 + 9 * 250 = 2300 bytes: the
   * 10th piece of 250 bytes completes them. */
  int at = trips_with_period(250, 30);
  cr_expect_eq(at, 10, "period 250: tripped at piece %d, want 10", at);
  at = trips_with_period(251, 30);
  cr_expect_eq(at, 0, "period 251: tripped at piece %d, want never", at);
  at = trips_with_period(76, 30);
  cr_expect_eq(at, 10, "period 76 (not a loop under the old 1.5 rule): %d", at);
}

/* Gemini's two "user-provided loop examples" (loopDetectionService
 * .test.ts): periods of 130 and 105 bytes, which the earlier 1.5-chunk rule
 * let through. */
Test(rules, the_user_provided_loop_examples_trip) {
  const char *unit =
      "I will not output any text.\n  I will just end the turn.\n  I am "
      "done.\n  I will not do anything else.\n  I will wait for the user's "
      "next command.\n";
  ag_content_loop *d = new_default();
  cr_expect_neq(feed_times(d, unit, THRESHOLD + 20), 0, "%zu-byte unit",
                strlen(unit));
  ag_content_loop_free(d);
  d = new_default();
  cr_expect_neq(feed_times(d,
                           "I have added all the requested logs and verified "
                           "the test file. I will now mark the task as "
                           "complete.\n  ",
                           THRESHOLD + 20),
                0);
  ag_content_loop_free(d);
  /* Gemini's "complex thought" example is exactly 75 bytes: it trips. */
  const char *thought = "I need to check the file. The file does not exist. "
                        "I will create the file. ";
  cr_assert_eq(strlen(thought), 75);
  d = new_default();
  cr_expect_eq(feed_times(d, thought, 30), 10);
  ag_content_loop_free(d);
}

/* The period check: a phrase that comes back every 60 bytes with
 * different text in between each time is no loop; the same phrase with
 * the same text in between is. */
Test(rules, a_phrase_between_different_texts_is_no_loop) {
  const char *phrase = "Let me check the configuration file again now. ";
  ag_content_loop *d = new_default();
  int tripped = 0;
  for (int i = 0; i < 40 && tripped == 0; i++) {
    char piece[128];
    snprintf(piece, sizeof piece, "%sStep %02d: %s", phrase, i,
             i % 2 ? "edit" : "test");
    tripped = feed(d, piece) ? i + 1 : 0;
  }
  cr_expect_eq(tripped, 0, "tripped at piece %d", tripped);
  ag_content_loop_free(d);
  d = new_default();
  cr_expect_neq(feed_times(d,
                           "Let me check the configuration file again "
                           "now. Step: test. ",
                           30),
                0);
  ag_content_loop_free(d);
}

Test(rules, long_pattern_with_inner_repetition_trips) {
  /* Gemini: createRepetitiveContent(1, 150) x N trips; its 33-byte sentence
   * repeats inside each piece. */
  ag_content_loop *d = new_default();
  char *r = rep_content(1, 150);
  cr_expect_neq(feed_times(d, r, THRESHOLD + 20), 0);
  free(r);
  ag_content_loop_free(d);
}

Test(rules, short_alternating_phrases_trip_at_the_exact_piece) {
  /* 18-byte period: 10 occurrences need 50 + 9 * 18 = 212 bytes: piece 12
   * (216 bytes) completes them, piece 11 (198) does not. */
  ag_content_loop *d = new_default();
  int at = feed_times(d, "Thinking... Done. ", THRESHOLD * 10);
  cr_expect_eq(at, 12, "tripped at piece %d, want 12", at);
  ag_content_loop_free(d);
}

Test(rules, found_is_sticky_until_reset) {
  ag_content_loop *d = new_default();
  char *r = rep_content(1, CHUNK);
  cr_assert_eq(feed_times(d, r, THRESHOLD), THRESHOLD);
  cr_expect(ag_content_loop_found(d));
  cr_expect(feed(d, "Something else entirely, and new."));
  cr_expect(feed(d, "```"));
  ag_content_loop_reset(d);
  cr_expect_not(ag_content_loop_found(d));
  cr_expect_not(feed(d, r));
  free(r);
  ag_content_loop_free(d);
}

Test(rules, a_repeat_needs_the_whole_chunk) {
  /* A run of one letter is the shortest loop: the chunk of 50 'a' recurs
   * at every byte, so 50 + 9 bytes hold its 10 occurrences. */
  ag_content_loop *d = new_default();
  char run[60];
  memset(run, 'a', sizeof(run));
  cr_expect_not(feed_n(d, run, 58), "58 a's: 9 chunk positions only");
  cr_expect(feed_n(d, run, 1), "59 a's: the 10th position trips");
  ag_content_loop_free(d);
}

Test(rules, history_cap_forgets_old_occurrences) {
  /* Nine occurrences, then 5000 bytes of fresh text push them out of the
   * history; nine more occurrences are then only nine. */
  ag_content_loop *d = new_default();
  char *r = rep_content(1, CHUNK);
  cr_assert_eq(feed_times(d, r, THRESHOLD - 1), 0);
  char *filler = random_string(5000);
  cr_assert_not(feed(d, filler));
  cr_expect_eq(feed_times(d, r, THRESHOLD - 1), 0, "old occurrences counted");
  cr_expect(feed(d, r), "the 10th new occurrence trips");
  free(filler);
  free(r);
  ag_content_loop_free(d);
}

Test(rules, a_piece_longer_than_the_history_is_cut_as_in_gemini) {
  /* Gemini appends the piece, then keeps its last 5000 bytes: a loop that
   * sits only in the part cut off is never seen. */
  ag_content_loop *d = new_default();
  char *r = rep_content(1, CHUNK);
  char *filler = random_string(5100);
  static char big[500 + 5100 + 1];
  big[0] = '\0';
  for (int i = 0; i < 10; i++)
    strcat(big, r);
  strcat(big, filler);
  cr_expect_not(feed(d, big));
  /* The same bytes in pieces of 50: the loop is seen. */
  ag_content_loop_reset(d);
  bool hit = false;
  for (size_t i = 0; i < strlen(big) && !hit; i += 50)
    hit = feed_n(d, big + i, 50);
  cr_expect(hit);
  free(filler);
  free(r);
  ag_content_loop_free(d);
}

/* A hash match is confirmed on the bytes. The Thue-Morse word of length
 * 4096 is a block of 2048 and its complement; the two blocks (and other
 * 2048-byte windows) have the same polynomial hash modulo 2^64 for any odd
 * base, while no 2048-byte window occurs twice (the word is overlap-free).
 * With threshold 2, any hash-only match would be a "loop". */
Test(rules, hash_collisions_are_not_repeats) {
  enum { N = 4096 };
  char *tm = malloc(N);
  cr_assert_not_null(tm);
  for (unsigned i = 0; i < N; i++)
    tm[i] = (__builtin_popcount(i) & 1) ? 'b' : 'a';
  ag_content_loop *d = new_opts(N / 2, 2, 2 * N);
  cr_expect_not(feed_n(d, tm, N), "Thue-Morse halves counted as a repeat");
  /* Control: a real repeat of the first half trips. */
  ag_content_loop_reset(d);
  cr_assert_not(feed_n(d, tm, N / 2));
  cr_expect(feed_n(d, tm, N / 2));
  ag_content_loop_free(d);
  free(tm);
}

Test(rules, long_prose_then_a_loop) {
  /* 200 KB of prose with many cuts of the history, then a loop: it trips at
   * the same repetition as on a fresh detector. */
  ag_content_loop *d = new_default();
  for (int i = 0; i < 4000; i++) {
    char *s = random_string(1 + rng() % 100);
    cr_assert_not(feed(d, s));
    free(s);
  }
  char *r = rep_content(7, CHUNK);
  int at = feed_times(d, r, THRESHOLD);
  cr_expect_eq(at, THRESHOLD, "tripped at %d", at);
  free(r);
  ag_content_loop_free(d);
}

/* ------------------------------------------------------------------------ */
/* Markdown checks                                                          */
/* ------------------------------------------------------------------------ */

Test(markdown, line_starts_that_reset) {
  const char *resets[] = {
      "* item",
      "- item",
      "+ item",
      "1. item",
      "  * indented",
      "\n\n  - after blank lines",
      "\t+ tab",
      "text\n* item on the next line",
      "7.\titem",
      "\xc2\xa0* after NBSP", /* JS \s includes U+00A0 */
      "\xe3\x80\x80- after U+3000",
      "# h",
      "###### h6",
      "#\n",
      "> q",
      "text\n> quote",
      "| a |",
      "|x|",
      "  | a | b",
      "---",
      "+-+-",
      "|||",
      "text\n|--|",
      "```",
      "```js",
      "====",
      "***",
      "___",
      "\xe2\x94\x80\xe2\x94\x80", /* U+2500 x2 */
  };
  for (size_t i = 0; i < sizeof(resets) / sizeof(resets[0]); i++)
    check_reset_by(resets[i], true);
}

Test(markdown, look_alikes_that_do_not_reset) {
  const char *keep[] = {
      "#hashtag",
      " # not at line start",
      "a # b",
      ">quote",
      " > not at line start",
      "-item",
      "*emphasis*",
      "1.5 is a number",
      "a - b",
      "x * y",
      "v1. no",
      "a | b | c",
      "| only one pipe",
      "|-",
      "text ``code``",
      "== a",
      "`` two ticks",
      "text ---",
      "HELLO",
      "1234",
      "\xe2\x94\x80 with text", /* divider char plus text */
  };
  for (size_t i = 0; i < sizeof(keep) / sizeof(keep[0]); i++)
    check_reset_by(keep[i], false);
}

Test(markdown, a_divider_piece_is_skipped_not_appended) {
  /* A divider resets and is not appended; prose around it is analysed. */
  ag_content_loop *d = new_default();
  char *r = rep_content(1, CHUNK);
  for (int i = 0; i < 3; i++) {
    cr_assert_not(feed(d, "----------"));
    cr_assert_not(feed(d, "=========="));
  }
  cr_expect_eq(feed_times(d, r, THRESHOLD), THRESHOLD);
  free(r);
  ag_content_loop_free(d);
}

Test(markdown, fences_counted_without_overlap) {
  /* "````" is one fence (JavaScript's /```/g): it opens a block. */
  ag_content_loop *d = new_default();
  char *r = rep_content(1, CHUNK);
  cr_assert_not(feed(d, "````"));
  cr_expect_eq(feed_times(d, r, THRESHOLD), 0, "inside the block");
  /* "``````" is two fences: a block opened and closed in one piece. */
  ag_content_loop_reset(d);
  cr_assert_not(feed(d, "``````"));
  cr_expect_eq(feed_times(d, r, THRESHOLD), THRESHOLD);
  free(r);
  ag_content_loop_free(d);
}

Test(markdown, fence_split_across_pieces_is_not_a_fence) {
  /* As in Gemini: each piece is checked on its own, so "``" + "`" is no
   * fence and the text stays outside a code block. */
  ag_content_loop *d = new_default();
  char *r = rep_content(1, CHUNK);
  cr_assert_not(feed(d, "``"));
  cr_assert_not(feed(d, "`"));
  cr_expect_eq(feed_times(d, r, THRESHOLD), THRESHOLD);
  free(r);
  ag_content_loop_free(d);
}

/* ------------------------------------------------------------------------ */
/* Streaming: awkward boundaries, UTF-8                                     */
/* ------------------------------------------------------------------------ */

/* Feeds s in pieces of `step` bytes; returns the number of bytes fed when
 * the detector first said true, or 0. */
static size_t bytes_to_trip(ag_content_loop *d, const char *s, size_t n,
                            size_t step) {
  for (size_t i = 0; i < n; i += step) {
    size_t m = (n - i < step) ? n - i : step;
    if (feed_n(d, s + i, m))
      return i + m;
  }
  return 0;
}

Test(stream, split_at_awkward_places_trips_at_the_same_byte) {
  /* 50 bytes without digits, '=' or markdown characters, which a piece
   * boundary could turn into a list item or a divider (next test). */
  const char *r = "The model keeps saying the same thing, over again. ";
  cr_assert_eq(strlen(r), CHUNK + 1);
  char text[CHUNK * 12];
  for (int i = 0; i < 12; i++)
    memcpy(text + i * CHUNK, r, CHUNK);
  size_t n = sizeof(text);
  size_t steps[] = {1, 2, 3, 7, 13, 49, 51, 97};
  for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
    ag_content_loop *d = new_default();
    size_t at = bytes_to_trip(d, text, n, steps[i]);
    /* The 10th occurrence of the first chunk ends at byte 500. */
    size_t want = ((500 + steps[i] - 1) / steps[i]) * steps[i];
    cr_expect_eq(at, want, "pieces of %zu: tripped after %zu bytes, want %zu",
                 steps[i], at, want);
    ag_content_loop_free(d);
  }
}

/* As in Gemini CLI, each piece is checked on its own and "start of line"
 * includes the start of the piece: a delta "3. " is a numbered list item
 * and a delta "=" a divider, whatever came before them. */
Test(stream, piece_start_counts_as_line_start) {
  const char *pieces[] = {"3. ", "=", "* ", "# "};
  for (size_t i = 0; i < sizeof(pieces) / sizeof(pieces[0]); i++)
    check_reset_by(pieces[i], true);
}

Test(stream, multibyte_sentence_trips_whole_and_cut_anywhere) {
  /* 12 characters of 3 bytes: a 36-byte period. */
  const char *unit = "これは繰り返しの文です。";
  size_t ul = strlen(unit);
  cr_assert_eq(ul, 36);
  char text[36 * 20 + 1] = "";
  for (int i = 0; i < 20; i++)
    strcat(text, unit);
  size_t n = strlen(text);
  /* 10 occurrences of the first chunk: 50 + 9 * 36 = 374 bytes. */
  size_t steps[] = {36, 1, 2, 4, 5, 11};
  for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
    ag_content_loop *d = new_default();
    size_t at = bytes_to_trip(d, text, n, steps[i]);
    cr_expect(at >= 374 && at < 374 + steps[i] + 3,
              "pieces of %zu: tripped after %zu bytes, want 374 (+ the piece "
              "and a held-back partial character)",
              steps[i], at);
    ag_content_loop_free(d);
  }
}

Test(stream, emoji_loop_trips) {
  ag_content_loop *d = new_default();
  const char *unit = "Done \xf0\x9f\x8e\x89 "; /* "Done 🎉 " */
  int at = feed_times(d, unit, 100);
  cr_expect_neq(at, 0);
  ag_content_loop_free(d);
}

Test(stream, box_divider_cut_inside_characters_is_still_a_divider) {
  /* "╭─" x 25 per line, fed in pieces that cut the 3-byte characters: the
   * partial character is held back, so each piece is still only box drawing
   * (Gemini's pieces are whole JavaScript strings). */
  char div[CHUNK / 2 * 6 + 1] = "";
  for (int i = 0; i < CHUNK / 2; i++)
    strcat(div, "\xe2\x95\xad\xe2\x94\x80");
  size_t n = strlen(div);
  size_t steps[] = {4, 5, 7, 1};
  for (size_t s = 0; s < sizeof(steps) / sizeof(steps[0]); s++) {
    ag_content_loop *d = new_default();
    for (int rep = 0; rep < THRESHOLD + 5; rep++)
      cr_expect_eq(bytes_to_trip(d, div, n, steps[s]), 0,
                   "pieces of %zu: the divider tripped", steps[s]);
    ag_content_loop_free(d);
  }
}

Test(stream, nbsp_cut_before_a_list_marker_still_resets) {
  /* "\n" U+00A0 "* item" with the NBSP cut in two: still a list item. */
  ag_content_loop *d = new_default();
  char *r = rep_content(1, CHUNK);
  cr_assert_eq(feed_times(d, r, THRESHOLD - 1), 0);
  feed(d, "\n\xc2");
  feed(d, "\xa0* item");
  cr_expect_eq(feed_times(d, r, THRESHOLD - 1), 0);
  free(r);
  ag_content_loop_free(d);
}

Test(stream, invalid_utf8_is_analysed_as_bytes) {
  ag_content_loop *d = new_default();
  /* Stray continuation bytes and a lead byte followed by ASCII. */
  const char unit[] = "abc\x80\x81 def \xe2(x) ghi \xff\xfe jkl ";
  int at = 0;
  for (int i = 1; i <= 100 && at == 0; i++)
    if (feed_n(d, unit, sizeof(unit) - 1))
      at = i;
  cr_expect_neq(at, 0, "a loop of invalid UTF-8 was not found");
  ag_content_loop_free(d);
}

Test(stream, trailing_partial_character_is_held_then_completed) {
  /* A piece that ends in a lead byte: the byte waits for the next piece. */
  ag_content_loop *d = new_default();
  char *r = rep_content(1, CHUNK);
  cr_assert_eq(feed_times(d, r, THRESHOLD - 1), 0);
  /* "\n\xe2" then "\x94\x80\xe2\x94\x80": the first piece is "\n" (the
   * lead byte waits), the second is the whole "──", a divider, which
   * resets. Without the hold neither piece would be a divider. */
  feed(d, "\n\xe2");
  feed(d, "\x94\x80\xe2\x94\x80");
  cr_expect_eq(feed_times(d, r, THRESHOLD - 1), 0);
  free(r);
  ag_content_loop_free(d);
}

/* ------------------------------------------------------------------------ */
/* API                                                                      */
/* ------------------------------------------------------------------------ */

Test(api, defaults) {
  ag_content_loop_opts o;
  ag_content_loop_opts_init(&o);
  cr_expect_eq(o.chunk_size, 50);
  cr_expect_eq(o.threshold, 10);
  cr_expect_eq(o.max_history, 5000);
  ag_content_loop_opts_init(NULL);
}

static void expect_bad_opts(size_t chunk, size_t thr, size_t hist,
                            const char *name) {
  ag_content_loop_opts o = {chunk, thr, hist};
  ag_content_loop *d = (ag_content_loop *)&o; /* must be set to NULL */
  ag_error_t err;
  ag_err_t rc = ag_content_loop_new(&d, &o, &err);
  cr_expect_eq(rc, AG_EINVAL, "(%zu, %zu, %zu): %s", chunk, thr, hist,
               ag_err_name(rc));
  cr_expect_null(d);
  cr_expect_eq(err.code, AG_EINVAL);
  cr_expect_not_null(strstr(err.msg, name), "message \"%s\" lacks \"%s\"",
                     err.msg, name);
}

Test(api, options_out_of_range) {
  expect_bad_opts(0, 10, 1000, "chunk_size");
  expect_bad_opts(1001, 10, 1000, "chunk_size");
  expect_bad_opts(50, 1, 1000, "threshold");
  expect_bad_opts(50, 0, 1000, "threshold");
  expect_bad_opts(50, 1001, 1000, "threshold");
  expect_bad_opts(50, 10, 0, "max_history");
  expect_bad_opts(50, 10, AG_CONTENT_MAX_HISTORY_LIMIT + 1, "max_history");
  cr_expect_eq(ag_content_loop_new(NULL, NULL, NULL), AG_EINVAL);
}

Test(api, options_change_the_rule) {
  /* chunk 10, threshold 3: a 12-byte period trips once 10 + 2 * 12 = 34
   * bytes are in: the 3rd piece. */
  ag_content_loop *d = new_opts(10, 3, 100);
  cr_expect_eq(feed_times(d, "abcdefghijk ", 10), 3);
  ag_content_loop_free(d);
  /* A history of 100 bytes cannot hold 10 occurrences 50 bytes apart. */
  d = new_opts(50, 10, 100);
  char *r = rep_content(1, CHUNK);
  cr_expect_eq(feed_times(d, r, 30), 0);
  free(r);
  ag_content_loop_free(d);
  /* The largest history works. */
  d = new_opts(50, 10, AG_CONTENT_MAX_HISTORY_LIMIT);
  r = rep_content(1, CHUNK);
  cr_expect_eq(feed_times(d, r, 30), THRESHOLD);
  free(r);
  ag_content_loop_free(d);
}

Test(api, null_detector) {
  cr_expect_not(ag_content_loop_feed(NULL, "x", 1));
  cr_expect_not(ag_content_loop_check_text(NULL, "x", 1));
  cr_expect_not(ag_content_loop_found(NULL));
  char buf[8] = "junk";
  cr_expect_eq(ag_content_loop_chunk(NULL, buf, sizeof(buf)), 0);
  cr_expect_str_eq(buf, "");
  ag_content_loop_reset(NULL);
  ag_content_loop_free(NULL);
}

Test(api, chunk_describes_the_repeated_text) {
  ag_content_loop *d = new_default();
  char buf[128];
  cr_expect_eq(ag_content_loop_chunk(d, buf, sizeof(buf)), 0);
  cr_expect_str_eq(buf, "");
  char *r = rep_content(1, CHUNK);
  cr_assert_eq(feed_times(d, r, THRESHOLD), THRESHOLD);
  size_t n = ag_content_loop_chunk(d, buf, sizeof(buf));
  cr_expect_str_eq(buf, "This is a unique sentence, id=1. This is a unique");
  cr_expect_eq(n, strlen(buf));
  n = ag_content_loop_chunk(d, buf, 10);
  cr_expect_str_eq(buf, "This is a");
  cr_expect_eq(n, 9);
  cr_expect_eq(ag_content_loop_chunk(d, buf, 0), 0);
  free(r);
  ag_content_loop_free(d);
}

Test(api, chunk_is_one_line_of_whole_characters) {
  ag_content_loop *d = new_default();
  /* 36-byte period of 3-byte characters with a newline and a tab. */
  const char *unit = "ループ\n\tループ ループ!!";
  cr_assert_neq(feed_times(d, unit, 40), 0);
  char buf[128];
  size_t n = ag_content_loop_chunk(d, buf, sizeof(buf));
  cr_expect_eq(n, strlen(buf));
  cr_expect_null(strchr(buf, '\n'), "newline in \"%s\"", buf);
  cr_expect_null(strchr(buf, '\t'), "tab in \"%s\"", buf);
  cr_expect_null(strstr(buf, "  "), "double space in \"%s\"", buf);
  cr_expect(n > 0 && buf[0] != ' ' && buf[n - 1] != ' ', "untrimmed \"%s\"",
            buf);
  /* Every sequence whole: starts on a lead byte, ends complete. */
  cr_expect(((unsigned char)buf[0] & 0xc0) != 0x80, "starts mid-character");
  for (size_t cap = 1; cap < 40; cap++) {
    char small[40];
    size_t m = ag_content_loop_chunk(d, small, cap);
    cr_expect(m < cap);
    cr_expect_eq(memcmp(small, buf, m), 0, "cap %zu: not a prefix", cap);
    cr_expect(m == n || ((unsigned char)buf[m] & 0xc0) != 0x80,
              "cap %zu: cut inside a character", cap);
  }
  ag_content_loop_free(d);
}

Test(api, check_text_whole_replies) {
  ag_content_loop *d = new_default();
  char *r = rep_content(1, CHUNK);
  char text[CHUNK * 12 + 1] = "";
  for (int i = 0; i < 12; i++)
    strcat(text, r);
  cr_expect(ag_content_loop_check_text(d, text, strlen(text)));
  cr_expect(ag_content_loop_found(d));
  char buf[64];
  cr_expect_gt(ag_content_loop_chunk(d, buf, sizeof(buf)), 0);
  /* Each call starts afresh. */
  cr_expect_not(ag_content_loop_check_text(d, "Hello.", 6));
  cr_expect_not(ag_content_loop_found(d));
  /* The same sentence on its own lines. */
  char lines[64 * 15] = "";
  for (int i = 0; i < 15; i++)
    strcat(lines, "I will now call the tool again to check.\n");
  cr_expect(ag_content_loop_check_text(d, lines, strlen(lines)));
  free(r);
  ag_content_loop_free(d);
}

Test(api, check_text_structured_replies) {
  ag_content_loop *d = new_default();
  /* A code block of identical lines: never a loop. */
  char code[4096] = "Here is the fix:\n```python\n";
  for (int i = 0; i < 40; i++)
    strcat(code, "    total = total + compute(item, factor)\n");
  strcat(code, "```\nThat is all.\n");
  cr_expect_not(ag_content_loop_check_text(d, code, strlen(code)));
  /* A list of items sharing a prefix: each line resets. */
  char list[4096] = "Files:\n";
  for (int i = 0; i < 40; i++) {
    char line[96];
    snprintf(line, sizeof(line), "- src/components/widgets/item_%d.c\n", i);
    strcat(list, line);
  }
  cr_expect_not(ag_content_loop_check_text(d, list, strlen(list)));
  /* A table. */
  char table[4096] = "| name | value |\n|------|-------|\n";
  for (int i = 0; i < 40; i++)
    strcat(table, "| same | same  |\n");
  cr_expect_not(ag_content_loop_check_text(d, table, strlen(table)));
  /* A divider line of box drawing between paragraphs. */
  char div[2048] = "Intro.\n";
  for (int k = 0; k < 3; k++) {
    for (int i = 0; i < 60; i++)
      strcat(div, "\xe2\x94\x80");
    strcat(div, "\nNext part.\n");
  }
  cr_expect_not(ag_content_loop_check_text(d, div, strlen(div)));
  /* And after the code block closes, a loop is found. */
  char mixed[8192] = "```\nx\n```\n";
  for (int i = 0; i < 15; i++)
    strcat(mixed, "I apologize for the confusion. Let me try again. ");
  cr_expect(ag_content_loop_check_text(d, mixed, strlen(mixed)));
  ag_content_loop_free(d);
}

Test(api, check_text_null_and_empty) {
  ag_content_loop *d = new_default();
  cr_expect_not(ag_content_loop_check_text(d, NULL, 0));
  cr_expect_not(ag_content_loop_check_text(d, "", 0));
  cr_expect_not(ag_content_loop_check_text(d, "\n\n\n", 3));
  ag_content_loop_free(d);
}

/* ------------------------------------------------------------------------ */
/* Reference: Gemini's algorithm, literally                                 */
/* ------------------------------------------------------------------------ */

/* checkContentLoop minus the markdown checks (the streams below contain no
 * markdown), with Gemini's data structures: a history string, a map from
 * chunk to an array of indices, every index rewritten on each cut. */
typedef struct ref_entry {
  char *chunk;
  size_t *idx;
  size_t n;
  long next; /* lookup chain (the lookup method is not Gemini's concern) */
} ref_entry;

#define REF_BUCKETS 4096

typedef struct ref {
  size_t k, thr, max;
  char *hist;
  size_t len;
  size_t last;
  ref_entry *e;
  size_t ne;
  bool found;
  long bucket[REF_BUCKETS];
} ref;

static size_t ref_hash(const char *c, size_t k) {
  uint64_t h = 1469598103934665603ULL;
  for (size_t i = 0; i < k; i++)
    h = (h ^ (unsigned char)c[i]) * 1099511628211ULL;
  return (size_t)(h % REF_BUCKETS);
}

static void ref_reindex(ref *r) {
  for (size_t i = 0; i < REF_BUCKETS; i++)
    r->bucket[i] = -1;
  for (size_t i = 0; i < r->ne; i++) {
    size_t b = ref_hash(r->e[i].chunk, r->k);
    r->e[i].next = r->bucket[b];
    r->bucket[b] = (long)i;
  }
}

static void ref_init(ref *r, size_t k, size_t thr, size_t max) {
  memset(r, 0, sizeof(*r));
  r->k = k;
  r->thr = thr;
  r->max = max;
  ref_reindex(r);
}

static void ref_clear(ref *r) {
  for (size_t i = 0; i < r->ne; i++) {
    free(r->e[i].chunk);
    free(r->e[i].idx);
  }
  free(r->e);
  free(r->hist);
  ref_init(r, r->k, r->thr, r->max);
}

static bool ref_feed(ref *r, const char *p, size_t n) {
  if (r->found)
    return true;
  r->hist = realloc(r->hist, r->len + n + 1);
  memcpy(r->hist + r->len, p, n);
  r->len += n;
  if (r->len > r->max) {
    size_t cut = r->len - r->max;
    memmove(r->hist, r->hist + cut, r->max);
    r->len = r->max;
    r->last = r->last > cut ? r->last - cut : 0;
    size_t w = 0;
    for (size_t i = 0; i < r->ne; i++) {
      ref_entry *e = &r->e[i];
      size_t m = 0;
      for (size_t j = 0; j < e->n; j++)
        if (e->idx[j] >= cut)
          e->idx[m++] = e->idx[j] - cut;
      e->n = m;
      if (m == 0) {
        free(e->chunk);
        free(e->idx);
      } else {
        r->e[w++] = *e;
      }
    }
    r->ne = w;
    ref_reindex(r);
  }
  while (r->last + r->k <= r->len) {
    const char *c = r->hist + r->last;
    ref_entry *e = NULL;
    size_t b = ref_hash(c, r->k);
    for (long i = r->bucket[b]; i >= 0 && e == NULL; i = r->e[i].next)
      if (memcmp(r->e[i].chunk, c, r->k) == 0)
        e = &r->e[i];
    if (e == NULL) {
      r->e = realloc(r->e, (r->ne + 1) * sizeof(*r->e));
      e = &r->e[r->ne];
      e->chunk = malloc(r->k);
      memcpy(e->chunk, c, r->k);
      e->idx = malloc(sizeof(size_t));
      e->idx[0] = r->last;
      e->n = 1;
      e->next = r->bucket[b];
      r->bucket[b] = (long)r->ne++;
    } else {
      e->idx = realloc(e->idx, (e->n + 1) * sizeof(size_t));
      e->idx[e->n++] = r->last;
      if (e->n >= r->thr) {
        double total = (double)(e->idx[e->n - 1] - e->idx[e->n - r->thr]);
        double avg = total / (double)(r->thr - 1);
        /* the periods: distinct texts between the recent occurrences */
        size_t distinct = 0;
        const size_t *w = e->idx + e->n - r->thr;
        for (size_t i = 0; i + 1 < r->thr; i++) {
          bool seen = false;
          for (size_t j = 0; j < i && !seen; j++)
            seen = w[j + 1] - w[j] == w[i + 1] - w[i] &&
                   memcmp(r->hist + w[j], r->hist + w[i], w[i + 1] - w[i]) == 0;
          distinct += !seen;
        }
        if (avg <= (double)r->k * 5 && distinct <= r->thr / 2) {
          r->found = true;
          return true;
        }
      }
    }
    r->last++;
  }
  return false;
}

/* Random streams of a small alphabet: a motif repeated with mutations and
 * noise, cut into random pieces (sometimes longer than the history). */
static void differential(size_t k, size_t thr, size_t max, int streams,
                         int pieces) {
  static const char alpha[] = "ab c.";
  ag_content_loop *d = new_opts(k, thr, max);
  ref rf;
  ref_init(&rf, k, thr, max);
  long trips = 0;
  char buf[4096];
  for (int s = 0; s < streams; s++) {
    ag_content_loop_reset(d);
    ref_clear(&rf);
    char motif[64];
    size_t ml = 1 + rng() % (sizeof(motif) - 1);
    for (size_t i = 0; i < ml; i++)
      motif[i] = alpha[rng() % 5];
    size_t mpos = 0;
    unsigned noise = rng() % 4 == 0 ? rng() % 40 : rng() % 3;
    for (int p = 0; p < pieces; p++) {
      size_t n = rng() % 8 == 0 ? rng() % (2 * max + 2) : rng() % 24;
      if (n > sizeof(buf))
        n = sizeof(buf);
      for (size_t i = 0; i < n; i++) {
        if (rng() % 100 < noise)
          buf[i] = alpha[rng() % 5];
        else
          buf[i] = motif[mpos++ % ml];
      }
      bool got = ag_content_loop_feed(d, buf, n);
      bool want = ref_feed(&rf, buf, n);
      cr_assert_eq(got, want,
                   "k=%zu thr=%zu max=%zu stream %d piece %d (len %zu): "
                   "detector %d, reference %d",
                   k, thr, max, s, p, n, got, want);
      if (got) {
        trips++;
        break;
      }
    }
  }
  ref_clear(&rf);
  ag_content_loop_free(d);
  cr_log_info("k=%zu thr=%zu max=%zu: %ld of %d streams tripped", k, thr, max,
              trips, streams);
  cr_assert_gt(trips, streams / 10, "too few loops (%ld) to compare", trips);
  cr_assert_lt(trips, streams, "every stream tripped: no negatives compared");
}

Test(reference, small_chunks_small_history) {
  differential(4, 3, 40, 2000, 200);
}

Test(reference, gemini_defaults) {
  differential(50, 10, 5000, 120, 300);
}

Test(reference, odd_sizes) {
  differential(7, 5, 97, 1000, 200);
  differential(1, 3, 16, 1000, 100);
}

/* ------------------------------------------------------------------------ */
/* No allocation after _new                                                 */
/* ------------------------------------------------------------------------ */

static _Thread_local int armed;
static _Thread_local long allocations;

#ifdef AG_TEST_ASAN
int __sanitizer_install_malloc_and_free_hooks(
    void (*malloc_hook)(const volatile void *, size_t),
    void (*free_hook)(const volatile void *));
static void on_malloc(const volatile void *p, size_t n) {
  (void)p;
  (void)n;
  if (armed)
    allocations++;
}
static void on_free(const volatile void *p) {
  (void)p;
}
static void install(void) {
  __sanitizer_install_malloc_and_free_hooks(on_malloc, on_free);
}
#else
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
void *malloc(size_t n);
void *calloc(size_t a, size_t b);
void *realloc(void *p, size_t n);
void *malloc(size_t n) {
  if (armed)
    allocations++;
  return __libc_malloc(n);
}
void *calloc(size_t a, size_t b) {
  if (armed)
    allocations++;
  return __libc_calloc(a, b);
}
void *realloc(void *p, size_t n) {
  if (armed)
    allocations++;
  return __libc_realloc(p, n);
}
static void install(void) {}
#endif

Test(noalloc, feed_and_check_text) {
  install();
  ag_content_loop *d = new_default();
  char *prose = random_string(5000);
  char *r = rep_content(1, CHUNK);
  char text[CHUNK * 12 + 1] = "";
  for (int i = 0; i < 12; i++)
    strcat(text, r);
  char buf[64];
  armed = 1;
  for (int round = 0; round < 20; round++) {
    for (size_t i = 0; i < 5000; i += 37)
      ag_content_loop_feed(d, prose + i, 5000 - i < 37 ? 5000 - i : 37);
    ag_content_loop_feed(d, "```\ncode\n", 9);
    ag_content_loop_feed(d, "```\n", 4);
    for (int i = 0; i < 12; i++)
      ag_content_loop_feed(d, r, CHUNK);
    ag_content_loop_chunk(d, buf, sizeof(buf));
    ag_content_loop_reset(d);
    ag_content_loop_check_text(d, text, strlen(text));
  }
  armed = 0;
  cr_expect(ag_content_loop_found(d));
  cr_expect_eq(allocations, 0, "%ld allocations after ag_content_loop_new",
               allocations);
  free(prose);
  free(r);
  ag_content_loop_free(d);
}

/* ------------------------------------------------------------------------ */
/* Whole replies judged as the same text streamed                           */
/* ------------------------------------------------------------------------ */

/* Gemini's content cases with their deltas glued into one whole reply
 * (check_text): the same answer as streamed. `n` copies of `unit`,
 * optionally around a markdown element. */
static bool whole(const char *before, int nb, const char *mid,
                  const char *after, int na) {
  static char text[16384];
  text[0] = '\0';
  for (int i = 0; i < nb; i++)
    strcat(text, before);
  strcat(text, mid);
  for (int i = 0; i < na; i++)
    strcat(text, after);
  ag_content_loop *d = new_default();
  bool got = ag_content_loop_check_text(d, text, strlen(text));
  ag_content_loop_free(d);
  return got;
}

Test(whole, loops_trip_as_streamed) {
  char *r = rep_content(1, CHUNK);
  cr_expect(whole(r, THRESHOLD, "", "", 0), "a chunk repeated");
  char *l = rep_content(1, 150);
  cr_expect(whole(l, THRESHOLD + 20, "", "", 0), "a 150-byte pattern");
  cr_expect(whole("I will not output any text.\n  I will just end the turn.\n"
                  "  I am done.\n  I will not do anything else.\n  I will "
                  "wait for the user's next command.\n",
                  THRESHOLD + 20, "", "", 0),
            "the first user-provided example");
  cr_expect(whole("I have added all the requested logs and verified the test "
                  "file. I will now mark the task as complete.\n  ",
                  THRESHOLD + 20, "", "", 0),
            "the second user-provided example");
  cr_expect(whole("Thinking... Done. ", THRESHOLD * 10, "", "", 0));
  cr_expect(whole("I need to check the file. The file does not exist. I will "
                  "create the file. ",
                  THRESHOLD + 20, "", "", 0));
  free(l);
  free(r);
}

Test(whole, markdown_resets_as_streamed) {
  /* Gemini's negative cases: nine repeats, an element, nine repeats. */
  char *r = rep_content(1, CHUNK);
  static const char *const elements[] = {"| Column 1 | Column 2 |",
                                         "* List item",
                                         "## Heading",
                                         "> Quote text",
                                         "```",
                                         "\n- item",
                                         "\n+ item",
                                         "\n42. item"};
  for (size_t i = 0; i < sizeof elements / sizeof elements[0]; i++)
    cr_expect_not(whole(r, THRESHOLD - 1, elements[i], r, THRESHOLD - 1),
                  "reset by \"%s\"", elements[i]);
  /* prose around them does not reset: a dash, a plus, bold, C# */
  static const char *const prose[] = {" - ", " + ", " **bold** ", " C# "};
  for (size_t i = 0; i < sizeof prose / sizeof prose[0]; i++)
    cr_expect(whole(r, THRESHOLD - 1, prose[i], r, THRESHOLD - 1),
              "\"%s\" reset the tracking", prose[i]);
  free(r);
}
