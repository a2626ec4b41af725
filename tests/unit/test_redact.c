/*
 * tests/unit/test_redact.c - ag__redact and its helpers (src/core/redact.c):
 * secret values from an environment, "Bearer" tokens, "sk-" keys, a secret
 * cut by the end of the text, texts with nothing to hide, NUL bytes, the
 * snprintf contract and the size bound.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "core/internal.h"

#define KEY "sk-proj-AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"

static char *envp_default[] = {"OPENAI_API_KEY=" KEY,
                               "GITHUB_TOKEN=ghp_1234567890abcdefABCDEF",
                               "DB_PASSWORD=hunter2hunter2",
                               "FEATURE_KEY=1", /* too short to be a secret */
                               "PATH=/usr/bin:/bin",
                               "MONKEY=not-a-secret-name-value",
                               NULL};

/* Redacts `text` with the secrets of envp_default; caller frees. */
static char *redact(const char *text, size_t len) {
  ag__secret sec[AG__SECRETS_MAX];
  size_t n = ag__secrets_from_env(envp_default, sec, AG__SECRETS_MAX);
  size_t cap = ag__redact_bound(len);
  char *out = malloc(cap);
  cr_assert_not_null(out);
  size_t got = ag__redact(text, len, sec, n, out, cap);
  cr_assert_lt(got, cap, "the bound was too small: %zu >= %zu", got, cap);
  cr_assert_eq(strlen(out) <= got, true);
  return out;
}

#define EXPECT_REDACTED(in, want)                                              \
  do {                                                                         \
    char *got_ = redact((in), strlen(in));                                     \
    cr_expect_str_eq(got_, (want), "redact(\"%s\"): got \"%s\", want \"%s\"",  \
                     (in), got_, (want));                                      \
    free(got_);                                                                \
  } while (0)

Test(redact, secret_names) {
  cr_expect(ag__secret_name("OPENAI_API_KEY", 14));
  cr_expect(ag__secret_name("GITHUB_TOKEN", 12));
  cr_expect(ag__secret_name("AWS_SECRET", 10));
  cr_expect(ag__secret_name("DB_PASSWORD", 11));
  cr_expect(ag__secret_name("my_api_key", 10));
  cr_expect_not(ag__secret_name("MONKEY", 6));
  cr_expect_not(ag__secret_name("KEY", 3));
  cr_expect_not(ag__secret_name("PATH", 4));
  ag__secret sec[AG__SECRETS_MAX];
  size_t n = ag__secrets_from_env(envp_default, sec, AG__SECRETS_MAX);
  cr_expect_eq(n, 3, "OPENAI_API_KEY, GITHUB_TOKEN, DB_PASSWORD; got %zu", n);
  cr_expect_eq(ag__secrets_from_env(NULL, sec, 4), 0);
  cr_expect_eq(ag__secrets_from_env(envp_default, sec, 1), 1);
}

Test(redact, environment_values) {
  EXPECT_REDACTED("key is " KEY ".", "key is [REDACTED].");
  EXPECT_REDACTED("ghp_1234567890abcdefABCDEF", "[REDACTED]");
  EXPECT_REDACTED("pw=hunter2hunter2;", "pw=[REDACTED];");
  /* A value too short to be a secret, and a name that is not one. */
  EXPECT_REDACTED("FEATURE_KEY=1", "FEATURE_KEY=1");
  EXPECT_REDACTED("not-a-secret-name-value", "not-a-secret-name-value");
  /* A capped output cut the key: its prefix ending the text is hidden. */
  EXPECT_REDACTED("echo: sk-proj-AbCdE", "echo: [REDACTED]");
  /* Too short a prefix is left (it cannot be told from ordinary text). */
  EXPECT_REDACTED("x sk-pro", "x sk-pro");
}

Test(redact, bearer_and_sk_keys) {
  EXPECT_REDACTED("Authorization: Bearer abc.DEF-123_xyz/+=",
                  "Authorization: Bearer [REDACTED]");
  EXPECT_REDACTED("bearer    tok3n-tok3n", "bearer    [REDACTED]");
  EXPECT_REDACTED("the bearer token was wrong", "the bearer token was wrong");
  EXPECT_REDACTED("key sk-ant-api03-abcdefghijklmnop rest",
                  "key [REDACTED] rest");
  EXPECT_REDACTED("sk-short", "sk-short");
  EXPECT_REDACTED("task-abcdefghijklmnopqrstuvwxyz",
                  "task-abcdefghijklmnopqrstuvwxyz");
  EXPECT_REDACTED("nothing to hide here", "nothing to hide here");
  EXPECT_REDACTED("", "");
}

Test(redact, bytes_and_nuls) {
  const char in[] = "a\0" KEY "\0b";
  size_t len = sizeof(in) - 1;
  ag__secret sec[AG__SECRETS_MAX];
  size_t n = ag__secrets_from_env(envp_default, sec, AG__SECRETS_MAX);
  cr_expect(ag__redact_needed(in, len, sec, n));
  char out[128];
  size_t got = ag__redact(in, len, sec, n, out, sizeof(out));
  cr_assert_eq(got, 14, "got %zu bytes", got);
  cr_expect_eq(memcmp(out, "a\0[REDACTED]\0b", 14), 0);
  cr_expect_not(ag__redact_needed("plain \xff\xfe text", 13, sec, n));
}

Test(redact, snprintf_contract_and_bound) {
  /* Eight-byte secrets back to back: the worst growth there is. */
  char *env[] = {"X_KEY=12345678", NULL};
  ag__secret sec[1];
  cr_assert_eq(ag__secrets_from_env(env, sec, 1), 1);
  char in[8 * 50 + 1];
  for (int i = 0; i < 50; i++)
    memcpy(in + 8 * i, "12345678", 8);
  size_t len = 8 * 50;
  size_t bound = ag__redact_bound(len);
  char *out = malloc(bound);
  cr_assert_not_null(out);
  size_t got = ag__redact(in, len, sec, 1, out, bound);
  cr_expect_eq(got, 50 * 10);
  cr_expect_lt(got, bound);
  free(out);
  /* A small buffer: cut and terminated, the full length returned. */
  char small[8];
  got =
      ag__redact("key " KEY, strlen("key " KEY), sec, 0, small, sizeof(small));
  cr_expect_eq(got, 14);
  cr_expect_str_eq(small, "key [RE");
  cr_expect_eq(ag__redact("abc", 3, NULL, 0, NULL, 0), 3);
}
