/*
 * tests/unit/test_abi.c - the stable parts of the C ABI (docs/c-api.md,
 * "ABI"): the numeric version beside the string, AG_CAT_AUTO as the one
 * fixed "classify for me" value, constructors that check `out` before
 * writing it, and the README's example calls being right about their
 * lengths.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agentguard.h"

/* ---- the version -------------------------------------------------------- */

Test(abi, version_number_matches_the_string_and_the_header) {
  cr_expect_eq(ag_version_number(), AG_VERSION_NUMBER, "library %d, header %d",
               ag_version_number(), AG_VERSION_NUMBER);
  cr_expect_eq(AG_VERSION_NUMBER, AG_VERSION_MAJOR * 1000000 +
                                      AG_VERSION_MINOR * 1000 +
                                      AG_VERSION_PATCH);
  char want[32];
  snprintf(want, sizeof(want), "%d.%d.%d", AG_VERSION_MAJOR, AG_VERSION_MINOR,
           AG_VERSION_PATCH);
  cr_expect_str_eq(AG_VERSION_STRING, want);
  cr_expect_str_eq(ag_version(), want);
}

/* ---- AG_CAT_AUTO -------------------------------------------------------- */

Test(abi, category_numbers_are_stable_and_auto_is_not_the_count) {
  /* the numbers callers may have stored */
  cr_expect_eq(AG_CAT_UNKNOWN, 0);
  cr_expect_eq(AG_CAT_TIMEOUT, 1);
  cr_expect_eq(AG_CAT_NOT_FOUND, 8);
  cr_expect_eq(AG_CAT_PLOTTING, 13);
  cr_expect_eq(AG_CAT_AUTO, 256);
  cr_expect_neq((int)AG_CAT_AUTO, (int)AG_CAT__COUNT);
  cr_expect_str_eq(ag_category_name(AG_CAT_AUTO), "unknown");
  cr_expect_not(ag_category_transient(AG_CAT_AUTO));
  cr_expect_str_eq(ag_category_suggestion(AG_CAT_AUTO),
                   ag_category_suggestion(AG_CAT_UNKNOWN));
}

/* Two failing calls with different timeout texts: with the error pattern
 * detector at 2, they trip it only when the guard classifies them. */
static ag_action two_timeouts(ag_category cat, ag_verdict *v) {
  ag_config cfg;
  ag_error_t err;
  ag_config_init(&cfg);
  cfg.errors.similar_error_limit = 2;
  ag_guard *g = NULL;
  cr_assert_eq(ag_guard_new(&g, &cfg, NULL, &err), AG_OK, "%s", err.msg);
  ag_guard_begin_turn(g, 0);
  const char *texts[2] = {"Error: read timed out after 30s",
                          "Error: the request timed out"};
  const char *args[2] = {"{\"q\":1}", "{\"q\":2}"};
  ag_action last = AG_ALLOW;
  for (int i = 0; i < 2 && last == AG_ALLOW; i++) {
    cr_assert_eq(ag_guard_begin_iteration(g, i, v), AG_ALLOW);
    ag_call call = {"fetch", args[i], strlen(args[i])};
    ag_call_check check;
    cr_assert_eq(ag_guard_check_calls(g, &call, 1, i, &check, v), AG_ALLOW);
    ag_result res = {"fetch",  check.sig,        AG_OUTCOME_ERROR,
                     texts[i], strlen(texts[i]), cat};
    last = ag_guard_record_results(g, &res, 1, i, v);
  }
  ag_guard_free(g);
  return last;
}

Test(abi, auto_category_makes_the_guard_classify) {
  ag_verdict v;
  cr_expect_eq(ag_classify("Error: the request timed out", 28), AG_CAT_TIMEOUT);
  cr_expect_eq(two_timeouts(AG_CAT_AUTO, &v), AG_STOP, "%s", v.message);
  cr_expect_eq(v.reason, AG_REASON_ERROR_PATTERN, "reason %s",
               ag_reason_name(v.reason));
  /* the caller's own category wins: unknown never trips the detector */
  cr_expect_eq(two_timeouts(AG_CAT_UNKNOWN, &v), AG_ALLOW, "%s", v.message);
  /* code written for AG_CAT__COUNT keeps its meaning */
  cr_expect_eq(two_timeouts(AG_CAT__COUNT, &v), AG_STOP, "%s", v.message);
}

/* ---- constructors check `out` before writing it ------------------------- */

Test(abi, guard_new_with_null_out_is_einval) {
  ag_config cfg;
  ag_error_t err;
  ag_config_init(&cfg);
  cr_expect_eq(ag_guard_new(NULL, &cfg, NULL, &err), AG_EINVAL);
  cr_expect(strstr(err.msg, "out") != NULL, "message: %s", err.msg);
  cr_expect_eq(ag_guard_new(NULL, NULL, NULL, NULL), AG_EINVAL);
  ag_guard *g = (ag_guard *)&cfg; /* not NULL: must come back NULL */
  cr_expect_eq(ag_guard_new(&g, NULL, NULL, &err), AG_EINVAL);
  cr_expect_null(g);
}

/* ---- the README's example ----------------------------------------------- */

/* Decodes the C string literal starting at *p (just past its opening quote)
 * and returns its length in bytes; *p ends past the closing quote. Handles
 * the escapes the README uses (\" \\ \n \t). Returns -1 on anything else. */
static long c_literal_len(const char **p) {
  long n = 0;
  const char *s = *p;
  while (*s != '\0' && *s != '"') {
    if (*s == '\\') {
      s++;
      if (*s != '"' && *s != '\\' && *s != 'n' && *s != 't')
        return -1;
    }
    s++;
    n++;
  }
  if (*s != '"')
    return -1;
  *p = s + 1;
  return n;
}

Test(abi, readme_example_lengths_match_their_strings) {
  char path[4096];
  snprintf(path, sizeof(path), "%s/README.md", AG_SOURCE_DIR);
  FILE *f = fopen(path, "rb");
  cr_assert_not_null(f, "cannot open %s", path);
  static char text[1 << 16];
  size_t len = fread(text, 1, sizeof(text) - 1, f);
  fclose(f);
  text[len] = '\0';
  /* every ag_call initializer in the README: {"name", "args", LEN} */
  int seen = 0;
  for (const char *q = strstr(text, "ag_call "); q != NULL;
       q = strstr(q + 1, "ag_call ")) {
    const char *open = strstr(q, "{{\"");
    const char *eol = strchr(q, '\n');
    if (open == NULL || eol == NULL || open > eol)
      continue;
    const char *p = open + 3;
    cr_assert_geq(c_literal_len(&p), 0, "tool name literal at %.40s", open);
    p = strchr(p, '"');
    cr_assert_not_null(p);
    p++;
    const char *args = p;
    long n = c_literal_len(&p);
    cr_assert_geq(n, 0, "arguments literal at %.40s", args);
    long given = strtol(p + 1, NULL, 10);
    cr_expect_eq(given, n,
                 "README: the length given is %ld, the literal %.*s "
                 "is %ld bytes",
                 given, (int)(p - args - 1), args, n);
    seen++;
  }
  cr_expect_gt(seen, 0, "no ag_call example found in %s", path);
}
