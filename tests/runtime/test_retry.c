/*
 * tests/runtime/test_retry.c - the retry executor (ag__exec_call) with
 * native tools written here and with `sh -c` subprocess tools, the backoff
 * function (pure, no sleeping), and the bounded output buffers the tools
 * write into.
 *
 * Real waits use delays and timeouts of a few to a few tens of ms; timing
 * assertions only ever say "well under a second".
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "exec/internal.h"

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0)
    ;
}

/* ------------------------------------------------------------------------ */
/* Fixtures: configs, tools, an attempt recorder                            */
/* ------------------------------------------------------------------------ */

/* The "none" preset with retries switched on: max_retries, a constant
 * delay of `delay_ms`, no timeout. */
static ag_config retry_config(int max_retries, int64_t delay_ms) {
  ag_config cfg;
  ag_error_t err;
  cr_assert_eq(ag_config_preset(&cfg, "none", &err), AG_OK, "%s", err.msg);
  cfg.retry.max_retries = max_retries;
  cfg.retry.delay_ms = delay_ms;
  cfg.retry.backoff = AG_BACKOFF_CONSTANT;
  cfg.retry.max_delay_ms = 0;
  cfg.retry.jitter = false;
  cfg.retry.function_timeout_ms = 0;
  cfg.retry.retry_on = AG_RETRY_ON_TRANSIENT;
  return cfg;
}

/* A scripted native tool: answer i is used for attempt i (the last one
 * repeats). */
typedef struct step {
  ag_tool_status status;
  const char *text;
  int transient;   /* -1: say nothing; 0/1: ag_output_set_transient */
  int sleep_ms;    /* before answering, ignoring the token */
  bool wait_token; /* wait on the token and answer by its reason */
} step;

typedef struct script {
  const step *steps;
  int n;
  int calls;
} script;

static ag_tool_status scripted(void *user, const json_t *args,
                               ag_cancel *cancel, ag_output *out) {
  (void)args;
  script *s = user;
  const step *st = &s->steps[s->calls < s->n ? s->calls : s->n - 1];
  s->calls++;
  if (st->sleep_ms > 0)
    sleep_ms(st->sleep_ms);
  if (st->wait_token) {
    ag_cancel_reason r = ag_cancel_wait(cancel, 10000);
    if (r == AG_CANCEL_TIMEOUT)
      return AG_TOOL_TIMEOUT;
    if (r != AG_CANCEL_NONE)
      return AG_TOOL_CANCELLED;
  }
  if (st->text != NULL)
    ag_output_printf(out, "%s", st->text);
  if (st->transient >= 0)
    ag_output_set_transient(out, st->transient == 1);
  return st->status;
}

static ag__tool make_tool(const char *name, script *s) {
  ag__tool t;
  memset(&t, 0, sizeof(t));
  t.def.name = name;
  t.def.idempotent = true;
  t.def.timeout_ms = -1;
  t.def.max_retries = -1;
  t.def.fn = scripted;
  t.def.user = s;
  return t;
}

#define MAX_SEEN 16

typedef struct seen_attempt {
  int call_index, attempt;
  ag_tool_status outcome;
  int64_t duration_ms, retry_in_ms;
  char name[32], message[256];
} seen_attempt;

typedef struct recorder {
  int n;
  seen_attempt a[MAX_SEEN];
} recorder;

static void record(void *user, const ag_attempt *a) {
  recorder *r = user;
  cr_assert_lt(r->n, MAX_SEEN);
  seen_attempt *s = &r->a[r->n++];
  s->call_index = a->call_index;
  s->attempt = a->attempt;
  s->outcome = a->outcome;
  s->duration_ms = a->duration_ms;
  s->retry_in_ms = a->retry_in_ms;
  cr_assert_not_null(a->name);
  cr_assert_not_null(a->message);
  snprintf(s->name, sizeof(s->name), "%s", a->name);
  snprintf(s->message, sizeof(s->message), "%s", a->message);
}

static ag_exec_result run(const ag__tool *t, const ag_config *cfg,
                          ag_cancel *turn, recorder *rec) {
  ag_exec_result r;
  uint64_t rng = 42;
  ag_err_t rc =
      ag__exec_call(&(ag__call){.tool = t,
                                .cfg = cfg,
                                .args = "{}",
                                .args_len = 2,
                                .turn = turn,
                                .call_index = 7,
                                .on_attempt = rec != NULL ? record : NULL,
                                .attempt_user = rec,
                                .rng = &rng},
                    &r);
  cr_assert_eq(rc, AG_OK, "ag__exec_call: %s", ag_err_name(rc));
  cr_assert_not_null(r.text);
  cr_expect_eq(r.text_len, strlen(r.text));
  return r;
}

#define EXPECT_STATUS(r, want)                                                 \
  cr_expect_eq((r).status, (want), "status: got %s, want %s (text \"%s\")",    \
               ag_exec_status_name((r).status), ag_exec_status_name(want),     \
               (r).text)

#define EXPECT_TEXT(r, want)                                                   \
  cr_expect_str_eq((r).text, (want), "text: got \"%s\", want \"%s\"",          \
                   (r).text, (want))

/* ------------------------------------------------------------------------ */
/* Success and retried success                                              */
/* ------------------------------------------------------------------------ */

Test(retry, a_missing_call_tool_or_config_is_einval) {
  ag_config cfg = retry_config(0, 0);
  ag_exec_result r;
  cr_expect_eq(ag__exec_call(NULL, &r), AG_EINVAL);
  cr_expect_null(r.text);
  cr_expect_eq(ag__exec_call(&(ag__call){.tool = NULL, .cfg = &cfg}, &r),
               AG_EINVAL);
  cr_expect_eq(ag__exec_call(&(ag__call){.tool = NULL, .cfg = NULL}, NULL),
               AG_EINVAL);
}

Test(retry, success_first_time) {
  step steps[] = {{AG_TOOL_OK, "hello", -1, 0, false}};
  script s = {steps, 1, 0};
  ag__tool t = make_tool("greet", &s);
  ag_config cfg = retry_config(3, 1);
  recorder rec = {0};
  ag_exec_result r = run(&t, &cfg, NULL, &rec);
  EXPECT_STATUS(r, AG_EXEC_OK);
  cr_expect(r.ok);
  EXPECT_TEXT(r, "hello");
  cr_expect_eq(r.attempts, 1);
  cr_expect_eq(r.category, AG_CAT_UNKNOWN);
  cr_expect_not(r.truncated);
  cr_assert_eq(rec.n, 1);
  cr_expect_eq(rec.a[0].call_index, 7);
  cr_expect_str_eq(rec.a[0].name, "greet");
  cr_expect_eq(rec.a[0].attempt, 1);
  cr_expect_eq(rec.a[0].outcome, AG_TOOL_OK);
  cr_expect_eq(rec.a[0].retry_in_ms, -1);
  cr_expect_str_eq(rec.a[0].message, "");
  ag_exec_result_clear(&r);
  cr_expect_null(r.text);
  cr_expect_eq(r.attempts, 0);
}

Test(retry, flaky_tool_succeeds_on_its_third_attempt) {
  step steps[] = {{AG_TOOL_ERROR, "Connection refused", -1, 0, false},
                  {AG_TOOL_ERROR, "Connection refused", -1, 0, false},
                  {AG_TOOL_OK, "file contents", -1, 0, false}};
  script s = {steps, 3, 0};
  ag__tool t = make_tool("read_file", &s);
  ag_config cfg = retry_config(3, 2);
  recorder rec = {0};
  ag_exec_result r = run(&t, &cfg, NULL, &rec);
  EXPECT_STATUS(r, AG_EXEC_OK);
  EXPECT_TEXT(r, "file contents");
  cr_expect_eq(r.attempts, 3);
  cr_expect_eq(s.calls, 3);
  cr_assert_eq(rec.n, 3);
  for (int i = 0; i < 2; i++) {
    cr_expect_eq(rec.a[i].attempt, i + 1);
    cr_expect_eq(rec.a[i].outcome, AG_TOOL_ERROR);
    cr_expect_eq(rec.a[i].retry_in_ms, 2, "attempt %d: retry_in %lld", i + 1,
                 (long long)rec.a[i].retry_in_ms);
    cr_expect_str_eq(rec.a[i].message, "Connection refused");
  }
  cr_expect_eq(rec.a[2].attempt, 3);
  cr_expect_eq(rec.a[2].outcome, AG_TOOL_OK);
  cr_expect_eq(rec.a[2].retry_in_ms, -1);
  cr_expect_geq(r.duration_ms, 4, "two 2 ms waits; duration %lld",
                (long long)r.duration_ms);
  ag_exec_result_clear(&r);
}

/* ------------------------------------------------------------------------ */
/* Failures                                                                 */
/* ------------------------------------------------------------------------ */

Test(retry, permanent_errors_fail_at_once) {
  const char *texts[] = {"No such file or directory", "Permission denied",
                         "file not found: a.txt"};
  for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
    step steps[] = {{AG_TOOL_ERROR, texts[i], -1, 0, false}};
    script s = {steps, 1, 0};
    ag__tool t = make_tool("read_file", &s);
    ag_config cfg = retry_config(3, 1);
    recorder rec = {0};
    ag_exec_result r = run(&t, &cfg, NULL, &rec);
    EXPECT_STATUS(r, AG_EXEC_ERROR);
    cr_expect_not(r.ok);
    EXPECT_TEXT(r, texts[i]);
    cr_expect_eq(r.attempts, 1, "\"%s\" ran %d times", texts[i], r.attempts);
    cr_expect_eq(r.category, ag_classify(texts[i], strlen(texts[i])));
    cr_expect_not(ag_category_transient(r.category));
    cr_assert_eq(rec.n, 1);
    cr_expect_eq(rec.a[0].retry_in_ms, -1);
    cr_expect_str_eq(rec.a[0].message, texts[i]);
    ag_exec_result_clear(&r);
  }
}

Test(retry, error_after_four_attempts_exact_text) {
  step steps[] = {{AG_TOOL_ERROR, "Service unavailable (503)\n", -1, 0, false}};
  script s = {steps, 1, 0};
  ag__tool t = make_tool("fetch", &s);
  ag_config cfg = retry_config(3, 1);
  recorder rec = {0};
  ag_exec_result r = run(&t, &cfg, NULL, &rec);
  EXPECT_STATUS(r, AG_EXEC_ERROR);
  EXPECT_TEXT(r, "Error after 4 attempts: Service unavailable (503)");
  cr_expect_eq(r.attempts, 4);
  cr_expect_eq(s.calls, 4);
  cr_expect_eq(r.category, AG_CAT_NETWORK);
  cr_assert_eq(rec.n, 4);
  for (int i = 0; i < 3; i++)
    cr_expect_geq(rec.a[i].retry_in_ms, 0);
  cr_expect_eq(rec.a[3].retry_in_ms, -1, "no retry after the last attempt");
  ag_exec_result_clear(&r);
}

Test(retry, tool_max_retries_overrides_the_config) {
  step steps[] = {{AG_TOOL_ERROR, "Connection reset by peer", -1, 0, false}};
  script s = {steps, 1, 0};
  ag__tool t = make_tool("fetch", &s);
  t.def.max_retries = 1;
  ag_config cfg = retry_config(3, 1);
  ag_exec_result r = run(&t, &cfg, NULL, NULL);
  EXPECT_TEXT(r, "Error after 2 attempts: Connection reset by peer");
  ag_exec_result_clear(&r);

  s.calls = 0;
  t.def.max_retries = 0;
  r = run(&t, &cfg, NULL, NULL);
  EXPECT_TEXT(r, "Connection reset by peer");
  cr_expect_eq(r.attempts, 1);
  ag_exec_result_clear(&r);
}

Test(retry, error_without_a_message_gets_one) {
  step steps[] = {{AG_TOOL_ERROR, NULL, -1, 0, false}};
  script s = {steps, 1, 0};
  ag__tool t = make_tool("mute", &s);
  ag_config cfg = retry_config(0, 1);
  ag_exec_result r = run(&t, &cfg, NULL, NULL);
  EXPECT_STATUS(r, AG_EXEC_ERROR);
  EXPECT_TEXT(r, "Error: tool 'mute' failed without a message");
  ag_exec_result_clear(&r);
}

Test(retry, cancelled_answer_without_a_cancel_is_an_error) {
  step steps[] = {{AG_TOOL_CANCELLED, "stopped", -1, 0, false}};
  script s = {steps, 1, 0};
  ag__tool t = make_tool("liar", &s);
  ag_config cfg = retry_config(0, 1);
  ag_exec_result r = run(&t, &cfg, NULL, NULL);
  EXPECT_STATUS(r, AG_EXEC_ERROR);
  EXPECT_TEXT(r, "stopped");
  ag_exec_result_clear(&r);
}

/* ------------------------------------------------------------------------ */
/* retry_on and the tool's own transient mark                               */
/* ------------------------------------------------------------------------ */

Test(retry, retry_on_none_retries_nothing) {
  step steps[] = {{AG_TOOL_ERROR, "Connection refused", -1, 0, false}};
  script s = {steps, 1, 0};
  ag__tool t = make_tool("fetch", &s);
  ag_config cfg = retry_config(3, 1);
  cfg.retry.retry_on = AG_RETRY_ON_NONE;
  ag_exec_result r = run(&t, &cfg, NULL, NULL);
  EXPECT_TEXT(r, "Connection refused");
  cr_expect_eq(r.attempts, 1);
  ag_exec_result_clear(&r);

  /* not even a timeout of an idempotent tool */
  step hang[] = {{AG_TOOL_OK, "late", -1, 0, true}};
  script h = {hang, 1, 0};
  ag__tool t2 = make_tool("hang", &h);
  t2.def.timeout_ms = 10;
  r = run(&t2, &cfg, NULL, NULL);
  EXPECT_STATUS(r, AG_EXEC_TIMEOUT);
  cr_expect_eq(r.attempts, 1);
  ag_exec_result_clear(&r);
}

Test(retry, retry_on_all_retries_permanent_errors) {
  step steps[] = {{AG_TOOL_ERROR, "Permission denied", -1, 0, false}};
  script s = {steps, 1, 0};
  ag__tool t = make_tool("write", &s);
  ag_config cfg = retry_config(2, 1);
  cfg.retry.retry_on = AG_RETRY_ON_ALL;
  ag_exec_result r = run(&t, &cfg, NULL, NULL);
  EXPECT_TEXT(r, "Error after 3 attempts: Permission denied");
  cr_expect_eq(r.category, AG_CAT_PERMISSION);
  ag_exec_result_clear(&r);
}

Test(retry, tool_marked_permanent_is_never_retried) {
  step steps[] = {{AG_TOOL_ERROR, "Connection refused", 0, 0, false}};
  script s = {steps, 1, 0};
  ag__tool t = make_tool("fetch", &s);
  ag_config cfg = retry_config(3, 1);
  for (int mode = AG_RETRY_ON_TRANSIENT; mode <= AG_RETRY_ON_ALL; mode++) {
    cfg.retry.retry_on = (ag_retry_on)mode;
    s.calls = 0;
    ag_exec_result r = run(&t, &cfg, NULL, NULL);
    cr_expect_eq(r.attempts, 1, "retry_on %d: %d attempts", mode, r.attempts);
    EXPECT_TEXT(r, "Connection refused");
    ag_exec_result_clear(&r);
  }
}

Test(retry, tool_marked_transient_is_retried_whatever_the_text) {
  step steps[] = {{AG_TOOL_ERROR, "Permission denied", 1, 0, false},
                  {AG_TOOL_OK, "granted", -1, 0, false}};
  script s = {steps, 2, 0};
  ag__tool t = make_tool("acquire", &s);
  ag_config cfg = retry_config(3, 1);
  ag_exec_result r = run(&t, &cfg, NULL, NULL);
  EXPECT_STATUS(r, AG_EXEC_OK);
  EXPECT_TEXT(r, "granted");
  cr_expect_eq(r.attempts, 2);
  ag_exec_result_clear(&r);
}

Test(retry, unknown_errors_are_not_transient) {
  step steps[] = {{AG_TOOL_ERROR, "boom", -1, 0, false}};
  script s = {steps, 1, 0};
  ag__tool t = make_tool("x", &s);
  ag_config cfg = retry_config(3, 1);
  ag_exec_result r = run(&t, &cfg, NULL, NULL);
  cr_expect_eq(r.attempts, 1);
  EXPECT_TEXT(r, "boom");
  ag_exec_result_clear(&r);
}

/* ------------------------------------------------------------------------ */
/* Timeouts                                                                 */
/* ------------------------------------------------------------------------ */

Test(retry, timeout_text) {
  step steps[] = {{AG_TOOL_OK, "never", -1, 0, true}};
  script s = {steps, 1, 0};
  ag__tool t = make_tool("slow", &s);
  t.def.timeout_ms = 20;
  ag_config cfg = retry_config(0, 1);
  recorder rec = {0};
  ag_exec_result r = run(&t, &cfg, NULL, &rec);
  EXPECT_STATUS(r, AG_EXEC_TIMEOUT);
  EXPECT_TEXT(r, "Function timed out after 20ms");
  cr_expect_eq(r.category, AG_CAT_TIMEOUT);
  cr_expect_eq(r.attempts, 1);
  cr_assert_eq(rec.n, 1);
  cr_expect_eq(rec.a[0].outcome, AG_TOOL_TIMEOUT);
  cr_expect_str_eq(rec.a[0].message, "Function timed out after 20ms");
  cr_expect_geq(rec.a[0].duration_ms, 19);
  cr_expect_lt(r.duration_ms, 1000);
  ag_exec_result_clear(&r);
}

Test(retry, timeout_comes_from_the_config_in_seconds) {
  /* only the formatting is about seconds: 1s would be too slow a test, so
   * the tool returns TIMEOUT itself after seeing nothing */
  ag_config cfg = retry_config(0, 1);
  cfg.retry.function_timeout_ms = 30000;
  step steps[] = {{AG_TOOL_TIMEOUT, NULL, -1, 0, false}};
  script s = {steps, 1, 0};
  ag__tool t = make_tool("slow", &s);
  ag_exec_result r = run(&t, &cfg, NULL, NULL);
  EXPECT_STATUS(r, AG_EXEC_TIMEOUT);
  EXPECT_TEXT(r, "Function timed out after 30s");
  ag_exec_result_clear(&r);
}

Test(retry, timeout_retried_for_an_idempotent_tool) {
  step steps[] = {{AG_TOOL_OK, "never", -1, 0, true}};
  script s = {steps, 1, 0};
  ag__tool t = make_tool("slow", &s);
  t.def.timeout_ms = 15;
  ag_config cfg = retry_config(2, 1);
  recorder rec = {0};
  ag_exec_result r = run(&t, &cfg, NULL, &rec);
  EXPECT_STATUS(r, AG_EXEC_TIMEOUT);
  EXPECT_TEXT(r, "Error after 3 attempts: Function timed out after 15ms");
  cr_expect_eq(r.attempts, 3);
  cr_expect_eq(r.category, AG_CAT_TIMEOUT);
  cr_assert_eq(rec.n, 3);
  cr_expect_eq(rec.a[0].outcome, AG_TOOL_TIMEOUT);
  cr_expect_geq(rec.a[0].retry_in_ms, 0);
  ag_exec_result_clear(&r);
}

Test(retry, timeout_not_retried_for_a_non_idempotent_tool) {
  step steps[] = {{AG_TOOL_OK, "never", -1, 0, true}};
  script s = {steps, 1, 0};
  ag__tool t = make_tool("charge_card", &s);
  t.def.timeout_ms = 15;
  t.def.idempotent = false;
  ag_config cfg = retry_config(3, 1);
  cfg.retry.retry_on = AG_RETRY_ON_ALL;
  ag_exec_result r = run(&t, &cfg, NULL, NULL);
  EXPECT_STATUS(r, AG_EXEC_TIMEOUT);
  EXPECT_TEXT(r, "Function timed out after 15ms");
  cr_expect_eq(r.attempts, 1);
  cr_expect_eq(s.calls, 1);
  ag_exec_result_clear(&r);
}

Test(retry, retried_timeout_then_success) {
  step steps[] = {{AG_TOOL_OK, "never", -1, 0, true},
                  {AG_TOOL_OK, "fast now", -1, 0, false}};
  script s = {steps, 2, 0};
  ag__tool t = make_tool("api", &s);
  t.def.timeout_ms = 15;
  ag_config cfg = retry_config(3, 1);
  ag_exec_result r = run(&t, &cfg, NULL, NULL);
  EXPECT_STATUS(r, AG_EXEC_OK);
  EXPECT_TEXT(r, "fast now");
  cr_expect_eq(r.attempts, 2);
  ag_exec_result_clear(&r);
}

Test(retry, answer_after_the_timeout_counts_as_a_timeout) {
  /* a tool that ignores its token and answers "ok" too late */
  step steps[] = {{AG_TOOL_OK, "too late", -1, 40, false}};
  script s = {steps, 1, 0};
  ag__tool t = make_tool("deaf", &s);
  t.def.timeout_ms = 10;
  ag_config cfg = retry_config(0, 1);
  ag_exec_result r = run(&t, &cfg, NULL, NULL);
  EXPECT_STATUS(r, AG_EXEC_TIMEOUT);
  EXPECT_TEXT(r, "Function timed out after 10ms");
  ag_exec_result_clear(&r);
}

/* ------------------------------------------------------------------------ */
/* Cancellation                                                             */
/* ------------------------------------------------------------------------ */

typedef struct canceller {
  ag_cancel *target;
  int after_ms;
} canceller;

static void *cancel_later(void *arg) {
  canceller *k = arg;
  sleep_ms(k->after_ms);
  ag_cancel_cancel(k->target, AG_CANCEL_USER);
  return NULL;
}

Test(retry, cancel_during_a_retry_wait) {
  step steps[] = {{AG_TOOL_ERROR, "Connection refused", -1, 0, false}};
  script s = {steps, 1, 0};
  ag__tool t = make_tool("fetch", &s);
  ag_config cfg = retry_config(3, 10000); /* 10 s between attempts */
  ag_cancel *turn = NULL;
  cr_assert_eq(ag_cancel_new(&turn, NULL, INT64_MAX, AG_CANCEL_DEADLINE, NULL),
               AG_OK);
  canceller k = {turn, 50};
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, cancel_later, &k), 0);
  recorder rec = {0};
  int64_t t0 = ag_now_ms();
  ag_exec_result r = run(&t, &cfg, turn, &rec);
  int64_t took = ag_now_ms() - t0;
  pthread_join(th, NULL);
  EXPECT_STATUS(r, AG_EXEC_CANCELLED);
  EXPECT_TEXT(r, "Cancelled by the caller");
  cr_expect_eq(r.attempts, 1);
  cr_expect_lt(took, 1000, "the 10 s wait was cancelled after %lld ms",
               (long long)took);
  cr_assert_eq(rec.n, 1);
  cr_expect_eq(rec.a[0].retry_in_ms, 10000);
  ag_exec_result_clear(&r);
  ag_cancel_free(turn);
}

Test(retry, turn_deadline_expires_during_an_attempt) {
  step steps[] = {{AG_TOOL_OK, "never", -1, 0, true}};
  script s = {steps, 1, 0};
  ag__tool t = make_tool("slow", &s);
  ag_config cfg = retry_config(3, 1);
  cfg.retry.function_timeout_ms = 10000;
  ag_cancel *turn = NULL;
  cr_assert_eq(
      ag_cancel_new(&turn, NULL, ag_now_ms() + 30, AG_CANCEL_DEADLINE, NULL),
      AG_OK);
  recorder rec = {0};
  ag_exec_result r = run(&t, &cfg, turn, &rec);
  EXPECT_STATUS(r, AG_EXEC_CANCELLED);
  EXPECT_TEXT(r, "Cancelled: turn deadline passed");
  cr_expect_eq(r.attempts, 1, "a cancelled attempt is never retried");
  cr_expect_lt(r.duration_ms, 1000);
  cr_assert_eq(rec.n, 1);
  cr_expect_eq(rec.a[0].outcome, AG_TOOL_CANCELLED);
  cr_expect_eq(rec.a[0].retry_in_ms, -1);
  cr_expect_str_eq(rec.a[0].message, "Cancelled: turn deadline passed");
  ag_exec_result_clear(&r);
  ag_cancel_free(turn);
}

Test(retry, caller_cancel_reaches_the_tool_through_the_turn) {
  step steps[] = {{AG_TOOL_OK, "never", -1, 0, true}};
  script s = {steps, 1, 0};
  ag__tool t = make_tool("slow", &s);
  ag_config cfg = retry_config(3, 1);
  ag_cancel *user = NULL, *turn = NULL;
  cr_assert_eq(ag_cancel_new(&user, NULL, INT64_MAX, AG_CANCEL_DEADLINE, NULL),
               AG_OK);
  cr_assert_eq(
      ag_cancel_new(&turn, user, ag_now_ms() + 60000, AG_CANCEL_DEADLINE, NULL),
      AG_OK);
  canceller k = {user, 30};
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, cancel_later, &k), 0);
  ag_exec_result r = run(&t, &cfg, turn, NULL);
  pthread_join(th, NULL);
  EXPECT_STATUS(r, AG_EXEC_CANCELLED);
  EXPECT_TEXT(r, "Cancelled by the caller");
  cr_expect_eq(r.attempts, 1);
  ag_exec_result_clear(&r);
  ag_cancel_free(turn);
  ag_cancel_free(user);
}

Test(retry, answer_after_a_cancel_is_cancelled) {
  /* the tool ignores its token and returns "ok" after the turn was
   * cancelled: the turn is over, so is the call */
  step steps[] = {{AG_TOOL_OK, "late", -1, 60, false}};
  script s = {steps, 1, 0};
  ag__tool t = make_tool("deaf", &s);
  ag_config cfg = retry_config(3, 1);
  ag_cancel *turn = NULL;
  cr_assert_eq(ag_cancel_new(&turn, NULL, INT64_MAX, AG_CANCEL_DEADLINE, NULL),
               AG_OK);
  canceller k = {turn, 10};
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, cancel_later, &k), 0);
  ag_exec_result r = run(&t, &cfg, turn, NULL);
  pthread_join(th, NULL);
  EXPECT_STATUS(r, AG_EXEC_CANCELLED);
  ag_exec_result_clear(&r);
  ag_cancel_free(turn);
}

Test(retry, a_cancelled_turn_runs_nothing) {
  step steps[] = {{AG_TOOL_OK, "x", -1, 0, false}};
  script s = {steps, 1, 0};
  ag__tool t = make_tool("x", &s);
  ag_config cfg = retry_config(3, 1);
  ag_cancel *turn = NULL;
  cr_assert_eq(ag_cancel_new(&turn, NULL, INT64_MAX, AG_CANCEL_DEADLINE, NULL),
               AG_OK);
  ag_cancel_cancel(turn, AG_CANCEL_USER);
  recorder rec = {0};
  ag_exec_result r = run(&t, &cfg, turn, &rec);
  EXPECT_STATUS(r, AG_EXEC_CANCELLED);
  cr_expect_eq(r.attempts, 0);
  cr_expect_eq(s.calls, 0);
  cr_expect_eq(rec.n, 0);
  ag_exec_result_clear(&r);
  ag_cancel_free(turn);
}

/* ------------------------------------------------------------------------ */
/* Output cap                                                               */
/* ------------------------------------------------------------------------ */

static ag_tool_status chatty(void *user, const json_t *args, ag_cancel *cancel,
                             ag_output *out) {
  (void)user, (void)args, (void)cancel;
  for (int i = 0; i < 100; i++)
    ag_output_printf(out, "line %d\n", i);
  return AG_TOOL_OK;
}

Test(retry, output_is_capped_and_flagged) {
  ag__tool t;
  memset(&t, 0, sizeof(t));
  t.def.name = "chatty";
  t.def.idempotent = true;
  t.def.timeout_ms = -1;
  t.def.max_retries = -1;
  t.def.fn = chatty;
  t.def.max_output = 100;
  ag_config cfg = retry_config(0, 1);
  ag_exec_result r = run(&t, &cfg, NULL, NULL);
  EXPECT_STATUS(r, AG_EXEC_OK);
  cr_expect(r.truncated);
  cr_expect_eq(r.text_len, 100);
  cr_expect(strncmp(r.text, "line 0\nline 1\n", 14) == 0);
  ag_exec_result_clear(&r);
}

/* ------------------------------------------------------------------------ */
/* Backoff (pure)                                                           */
/* ------------------------------------------------------------------------ */

static ag_config backoff_config(ag_backoff b, int64_t delay, int64_t cap) {
  ag_config cfg = retry_config(3, delay);
  cfg.retry.backoff = b;
  cfg.retry.max_delay_ms = cap;
  return cfg;
}

#define EXPECT_DELAY(cfg, attempt, want)                                       \
  do {                                                                         \
    int64_t got_ = ag__retry_delay(&(cfg), (attempt), NULL);                   \
    cr_expect_eq(got_, (int64_t)(want), "attempt %d: got %lld, want %lld",     \
                 (attempt), (long long)got_, (long long)(want));               \
  } while (0)

Test(backoff, linear_is_the_seeds_formula) {
  ag_config cfg = backoff_config(AG_BACKOFF_LINEAR, 1000, 0);
  EXPECT_DELAY(cfg, 0, 1000);
  EXPECT_DELAY(cfg, 1, 2000);
  EXPECT_DELAY(cfg, 2, 3000);
  EXPECT_DELAY(cfg, 9, 10000);
}

Test(backoff, exponential_doubles) {
  ag_config cfg = backoff_config(AG_BACKOFF_EXPONENTIAL, 100, 0);
  EXPECT_DELAY(cfg, 0, 100);
  EXPECT_DELAY(cfg, 1, 200);
  EXPECT_DELAY(cfg, 2, 400);
  EXPECT_DELAY(cfg, 10, 102400);
}

Test(backoff, constant_stays) {
  ag_config cfg = backoff_config(AG_BACKOFF_CONSTANT, 750, 0);
  EXPECT_DELAY(cfg, 0, 750);
  EXPECT_DELAY(cfg, 5, 750);
}

Test(backoff, capped_at_max_delay) {
  ag_config cfg = backoff_config(AG_BACKOFF_EXPONENTIAL, 1000, 30000);
  EXPECT_DELAY(cfg, 4, 16000);
  EXPECT_DELAY(cfg, 5, 30000);
  EXPECT_DELAY(cfg, 40, 30000);
  cfg = backoff_config(AG_BACKOFF_LINEAR, 1000, 2500);
  EXPECT_DELAY(cfg, 1, 2000);
  EXPECT_DELAY(cfg, 2, 2500);
}

Test(backoff, no_overflow) {
  ag_config cfg = backoff_config(AG_BACKOFF_EXPONENTIAL, 1000, 0);
  EXPECT_DELAY(cfg, 62, INT64_MAX);
  EXPECT_DELAY(cfg, 1000, INT64_MAX);
  EXPECT_DELAY(cfg, 2147483647, INT64_MAX);
  cfg.retry.max_delay_ms = 30000;
  EXPECT_DELAY(cfg, 1000, 30000);
  cfg = backoff_config(AG_BACKOFF_LINEAR, INT64_MAX / 2, 0);
  EXPECT_DELAY(cfg, 0, INT64_MAX / 2);
  EXPECT_DELAY(cfg, 2, INT64_MAX);
  cfg = backoff_config(AG_BACKOFF_LINEAR, 1000, 0);
  EXPECT_DELAY(cfg, 2147483647, 2147483648LL * 1000);
}

Test(backoff, zero_delay_and_negative_attempts) {
  ag_config cfg = backoff_config(AG_BACKOFF_EXPONENTIAL, 0, 0);
  EXPECT_DELAY(cfg, 5, 0);
  cfg = backoff_config(AG_BACKOFF_LINEAR, 100, 0);
  EXPECT_DELAY(cfg, -3, 100);
}

Test(backoff, equal_jitter_stays_in_the_upper_half) {
  ag_config cfg = backoff_config(AG_BACKOFF_LINEAR, 1000, 0);
  cfg.retry.jitter = true;
  uint64_t rng = 12345;
  int64_t lo = INT64_MAX, hi = 0;
  for (int i = 0; i < 2000; i++) {
    int64_t d = ag__retry_delay(&cfg, 1, &rng); /* nominal 2000 */
    cr_assert(d >= 1000 && d <= 2000, "jittered delay %lld out of [1000, 2000]",
              (long long)d);
    lo = d < lo ? d : lo;
    hi = d > hi ? d : hi;
  }
  cr_expect_lt(lo, 1100, "lowest of 2000 draws: %lld", (long long)lo);
  cr_expect_gt(hi, 1900, "highest of 2000 draws: %lld", (long long)hi);
  /* jitter applies after the cap */
  cfg.retry.max_delay_ms = 1500;
  for (int i = 0; i < 200; i++) {
    int64_t d = ag__retry_delay(&cfg, 5, &rng);
    cr_assert(d >= 750 && d <= 1500, "capped jittered delay %lld",
              (long long)d);
  }
  /* the same seed gives the same sequence; NULL rng still works */
  uint64_t a = 7, b = 7;
  for (int i = 0; i < 10; i++)
    cr_expect_eq(ag__retry_delay(&cfg, 0, &a), ag__retry_delay(&cfg, 0, &b));
  int64_t d = ag__retry_delay(&cfg, 0, NULL);
  cr_expect(d >= 500 && d <= 1000);
  uint64_t zero = 0;
  d = ag__retry_delay(&cfg, 0, &zero);
  cr_expect(d >= 500 && d <= 1000);
}

/* ------------------------------------------------------------------------ */
/* Names                                                                    */
/* ------------------------------------------------------------------------ */

Test(retry, status_names) {
  cr_expect_str_eq(ag_exec_status_name(AG_EXEC_OK), "ok");
  cr_expect_str_eq(ag_exec_status_name(AG_EXEC_ERROR), "error");
  cr_expect_str_eq(ag_exec_status_name(AG_EXEC_TIMEOUT), "timeout");
  cr_expect_str_eq(ag_exec_status_name(AG_EXEC_CANCELLED), "cancelled");
  cr_expect_str_eq(ag_exec_status_name(AG_EXEC_DENIED), "denied");
  cr_expect_str_eq(ag_exec_status_name(AG_EXEC_NOT_FOUND), "not_found");
  cr_expect_str_eq(ag_exec_status_name(AG_EXEC_INVALID), "invalid");
  cr_expect_str_eq(ag_exec_status_name(AG_EXEC_SKIPPED), "skipped");
  ag_exec_result_clear(NULL);
}

/* ------------------------------------------------------------------------ */
/* Bounded output                                                           */
/* ------------------------------------------------------------------------ */

Test(output, write_keeps_at_most_cap) {
  ag_output o;
  cr_assert_eq(ag__output_init(&o, 10), AG_OK);
  cr_expect_eq(ag_output_write(&o, "hello", 5), 0);
  cr_expect_eq(ag_output_write(&o, " world!", 7), 1);
  cr_expect_eq(o.len, 10);
  cr_expect_str_eq(o.buf, "hello worl");
  cr_expect(o.truncated);
  cr_expect_eq(o.dropped, 2);
  cr_expect_eq(ag_output_write(&o, "more", 4), 1);
  cr_expect_eq(o.dropped, 6);
  ag__output_reset(&o);
  cr_expect_eq(o.len, 0);
  cr_expect_not(o.truncated);
  cr_expect_str_eq(o.buf, "");
  ag__output_free(&o);
}

Test(output, grows_past_the_initial_size_up_to_cap) {
  ag_output o;
  cr_assert_eq(ag__output_init(&o, 100000), AG_OK);
  char chunk[1000];
  memset(chunk, 'x', sizeof(chunk));
  for (int i = 0; i < 150; i++)
    ag_output_write(&o, chunk, sizeof(chunk));
  cr_expect_eq(o.len, 100000);
  cr_expect_eq(o.dropped, 50000);
  cr_expect_eq(strlen(o.buf), 100000);
  size_t len = 0;
  char *t = ag__output_take(&o, &len);
  cr_expect_eq(len, 100000);
  cr_expect_null(o.buf);
  free(t);
  /* usable again after take */
  cr_expect_eq(ag_output_printf(&o, "%d", 42), 0);
  cr_expect_str_eq(o.buf, "42");
  cr_expect_eq(ag_output_write(&o, "!", 1), 0);
  cr_expect_str_eq(o.buf, "42!");
  cr_expect_not(o.truncated);
  ag__output_free(&o);
}

Test(output, printf_formats_into_the_room_left) {
  ag_output o;
  cr_assert_eq(ag__output_init(&o, 12), AG_OK);
  cr_expect_eq(ag_output_printf(&o, "%s=%d", "abc", 12345), 0);
  cr_expect_str_eq(o.buf, "abc=12345");
  cr_expect_eq(ag_output_printf(&o, "%s", "tail-long"), 1);
  cr_expect_str_eq(o.buf, "abc=12345tai");
  cr_expect_eq(o.dropped, 6);
  ag__output_free(&o);

  /* a long format into a large cap grows the buffer once */
  cr_assert_eq(ag__output_init(&o, 5000), AG_OK);
  ag_output_printf(&o, "%3000d|", 7);
  cr_expect_eq(o.len, 3001);
  cr_expect_eq(o.buf[3000], '|');
  cr_expect_not(o.truncated);
  ag_output_printf(&o, "%3000d", 8);
  cr_expect_eq(o.len, 5000);
  cr_expect_eq(o.dropped, 1001);
  ag__output_free(&o);
}

Test(output, zero_cap_keeps_nothing) {
  ag_output o;
  cr_assert_eq(ag__output_init(&o, 0), AG_OK);
  cr_expect_eq(ag_output_write(&o, "x", 1), 1);
  cr_expect_eq(ag_output_printf(&o, "%s", "yz"), 1);
  cr_expect_eq(o.len, 0);
  cr_expect_eq(o.dropped, 3);
  cr_expect_str_eq(o.buf, "");
  ag__output_free(&o);
}

Test(output, transient_mark) {
  ag_output o;
  cr_assert_eq(ag__output_init(&o, 16), AG_OK);
  cr_expect_eq(o.transient, -1);
  ag_output_set_transient(&o, true);
  cr_expect_eq(o.transient, 1);
  ag_output_set_transient(&o, false);
  cr_expect_eq(o.transient, 0);
  ag__output_reset(&o);
  cr_expect_eq(o.transient, -1);
  ag__output_free(&o);
}

/* ------------------------------------------------------------------------ */
/* Subprocess tools                                                         */
/* ------------------------------------------------------------------------ */

/* A subprocess tool running `sh -c script` (argv borrowed by the tool). */
typedef struct sh_tool {
  char *argv[4];
  ag__tool t;
} sh_tool;

static void make_sh_tool(sh_tool *s, const char *name, const char *cmd) {
  s->argv[0] = (char *)"sh";
  s->argv[1] = (char *)"-c";
  s->argv[2] = (char *)cmd;
  s->argv[3] = NULL;
  memset(&s->t, 0, sizeof(s->t));
  s->t.def.name = name;
  s->t.def.idempotent = true;
  s->t.def.timeout_ms = -1;
  s->t.def.max_retries = -1;
  s->t.def.argv = (const char *const *)s->argv;
  s->t.def.kill_grace_ms = 50;
  s->t.argv_copy = s->argv;
}

Test(subprocess_retry, stdout_is_the_result_and_stdin_the_arguments) {
  sh_tool s;
  make_sh_tool(&s, "cat", "cat");
  ag_config cfg = retry_config(3, 1);
  ag_exec_result r;
  cr_assert_eq(ag__exec_call(&(ag__call){.tool = &s.t,
                                         .cfg = &cfg,
                                         .args = "{\"a\":1}",
                                         .args_len = 7},
                             &r),
               AG_OK);
  EXPECT_STATUS(r, AG_EXEC_OK);
  EXPECT_TEXT(r, "{\"a\":1}");
  cr_expect_eq(r.attempts, 1);
  ag_exec_result_clear(&r);
}

Test(subprocess_retry, transient_stderr_is_retried_with_the_exact_text) {
  sh_tool s;
  make_sh_tool(&s, "fetch", "echo 'Connection refused' >&2; exit 1");
  ag_config cfg = retry_config(2, 1);
  recorder rec = {0};
  ag_exec_result r = run(&s.t, &cfg, NULL, &rec);
  EXPECT_STATUS(r, AG_EXEC_ERROR);
  EXPECT_TEXT(r, "Error after 3 attempts: Connection refused");
  cr_expect_eq(r.category, AG_CAT_NETWORK);
  cr_expect_eq(rec.n, 3);
  cr_expect_str_eq(rec.a[0].message, "Connection refused");
  ag_exec_result_clear(&r);
}

Test(subprocess_retry, flaky_command_succeeds_on_its_third_attempt) {
  char dir[] = "/tmp/ag_retry_XXXXXX";
  cr_assert_not_null(mkdtemp(dir));
  char cmd[512];
  snprintf(cmd, sizeof(cmd),
           "f=%s/n; n=$(cat $f 2>/dev/null || echo 0); n=$((n+1)); "
           "echo $n > $f; if [ $n -lt 3 ]; then "
           "echo 'Connection reset by peer' >&2; exit 1; fi; printf done",
           dir);
  sh_tool s;
  make_sh_tool(&s, "flaky", cmd);
  ag_config cfg = retry_config(3, 1);
  ag_exec_result r = run(&s.t, &cfg, NULL, NULL);
  EXPECT_STATUS(r, AG_EXEC_OK);
  EXPECT_TEXT(r, "done");
  cr_expect_eq(r.attempts, 3);
  ag_exec_result_clear(&r);
  char path[600];
  snprintf(path, sizeof(path), "%s/n", dir);
  unlink(path);
  rmdir(dir);
}

Test(subprocess_retry, permanent_stderr_fails_at_once) {
  sh_tool s;
  make_sh_tool(&s, "write",
               "echo 'open /etc/x: Permission denied' >&2; "
               "exit 2");
  ag_config cfg = retry_config(3, 1);
  ag_exec_result r = run(&s.t, &cfg, NULL, NULL);
  EXPECT_STATUS(r, AG_EXEC_ERROR);
  EXPECT_TEXT(r, "open /etc/x: Permission denied");
  cr_expect_eq(r.attempts, 1);
  cr_expect_eq(r.category, AG_CAT_PERMISSION);
  ag_exec_result_clear(&r);
}

Test(subprocess_retry, crash_is_an_error_retried_only_under_all) {
  sh_tool s;
  make_sh_tool(&s, "crash", "kill -SEGV $$");
  ag_config cfg = retry_config(2, 1);
  ag_exec_result r = run(&s.t, &cfg, NULL, NULL);
  EXPECT_STATUS(r, AG_EXEC_ERROR);
  cr_expect_eq(r.attempts, 1, "a crash is not transient: %d attempts",
               r.attempts);
  cr_expect(strstr(r.text, "signal 11") != NULL, "text: %s", r.text);
  ag_exec_result_clear(&r);

  cfg.retry.retry_on = AG_RETRY_ON_ALL;
  r = run(&s.t, &cfg, NULL, NULL);
  EXPECT_STATUS(r, AG_EXEC_ERROR);
  cr_expect_eq(r.attempts, 3);
  cr_expect(strncmp(r.text, "Error after 3 attempts: ", 24) == 0, "text: %s",
            r.text);
  ag_exec_result_clear(&r);
}

Test(subprocess_retry, exec_failure_is_a_permanent_error) {
  static char *argv[] = {"ag-no-such-program-here", NULL};
  sh_tool s;
  make_sh_tool(&s, "missing", "");
  s.t.argv_copy = argv;
  s.t.def.argv = (const char *const *)argv;
  ag_config cfg = retry_config(3, 1);
  ag_exec_result r = run(&s.t, &cfg, NULL, NULL);
  EXPECT_STATUS(r, AG_EXEC_ERROR);
  cr_expect_eq(r.attempts, 1);
  cr_expect(strstr(r.text, "ag-no-such-program-here") != NULL, "text: %s",
            r.text);
  ag_exec_result_clear(&r);
}

Test(subprocess_retry, hanging_command_times_out_and_is_killed) {
  sh_tool s;
  make_sh_tool(&s, "hang", "sleep 10");
  s.t.def.timeout_ms = 50;
  s.t.def.idempotent = false;
  ag_config cfg = retry_config(3, 1);
  int64_t t0 = ag_now_ms();
  ag_exec_result r = run(&s.t, &cfg, NULL, NULL);
  int64_t took = ag_now_ms() - t0;
  EXPECT_STATUS(r, AG_EXEC_TIMEOUT);
  EXPECT_TEXT(r, "Function timed out after 50ms");
  cr_expect_eq(r.attempts, 1);
  cr_expect_lt(took, 3000, "a 50 ms timeout took %lld ms", (long long)took);
  ag_exec_result_clear(&r);
}

Test(subprocess_retry, turn_cancel_kills_the_command) {
  sh_tool s;
  make_sh_tool(&s, "hang", "sleep 10");
  ag_config cfg = retry_config(3, 1);
  ag_cancel *turn = NULL;
  cr_assert_eq(ag_cancel_new(&turn, NULL, INT64_MAX, AG_CANCEL_DEADLINE, NULL),
               AG_OK);
  canceller k = {turn, 50};
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, cancel_later, &k), 0);
  int64_t t0 = ag_now_ms();
  ag_exec_result r = run(&s.t, &cfg, turn, NULL);
  int64_t took = ag_now_ms() - t0;
  pthread_join(th, NULL);
  EXPECT_STATUS(r, AG_EXEC_CANCELLED);
  EXPECT_TEXT(r, "Cancelled by the caller");
  cr_expect_eq(r.attempts, 1);
  cr_expect_lt(took, 3000, "cancelled after 50 ms, took %lld ms",
               (long long)took);
  ag_exec_result_clear(&r);
  ag_cancel_free(turn);
}
