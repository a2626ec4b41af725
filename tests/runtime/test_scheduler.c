/*
 * tests/runtime/test_scheduler.c - the two-phase scheduler: the pre-phase
 * (skip, unknown tool, invalid arguments), approvals (one question per
 * distinct signature, in order, on the caller's thread; "for the session"),
 * parallel execution on the pool (results in the model's order, real
 * parallelism, sequential mode, a batch of one on the caller's thread),
 * cancellation (turn deadline, the caller), retries inside a parallel batch,
 * on_attempt from several threads and subprocess tools.
 *
 * Timings use short sleeps (tools waiting on their cancel token) and
 * generous margins: the suite runs on two shared cores and under TSan.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agentguard/exec.h"
#include "exec/internal.h"

/* ------------------------------------------------------------------------ */
/* Helpers                                                                  */
/* ------------------------------------------------------------------------ */

/* Shared state of the test tools, guarded by `mu`. */
typedef struct probe {
  pthread_mutex_t mu;
  int runs;              /* tool executions (attempts) */
  char order[64];        /* tags in completion order */
  pthread_t threads[64]; /* the thread of each execution */
  int flaky_attempts[16];
} probe;

static probe P = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void probe_reset(void) {
  pthread_mutex_lock(&P.mu);
  P.runs = 0;
  memset(P.order, 0, sizeof(P.order));
  memset(P.flaky_attempts, 0, sizeof(P.flaky_attempts));
  pthread_mutex_unlock(&P.mu);
}

static int probe_runs(void) {
  pthread_mutex_lock(&P.mu);
  int n = P.runs;
  pthread_mutex_unlock(&P.mu);
  return n;
}

/* {"ms": N, "tag": "x"}: waits N ms on its token (-1: until cancelled), then
 * answers the tag. Records the completion order and its thread. */
static ag_tool_status sleep_tool(void *user, const json_t *args,
                                 ag_cancel *cancel, ag_output *out) {
  (void)user;
  json_int_t ms = json_integer_value(json_object_get(args, "ms"));
  const char *tag = json_string_value(json_object_get(args, "tag"));
  pthread_mutex_lock(&P.mu);
  if (P.runs < 64)
    P.threads[P.runs] = pthread_self();
  P.runs++;
  pthread_mutex_unlock(&P.mu);
  ag_cancel_reason r = ag_cancel_wait(cancel, ms < 0 ? -1 : (int64_t)ms);
  if (r == AG_CANCEL_TIMEOUT)
    return AG_TOOL_TIMEOUT;
  if (r != AG_CANCEL_NONE)
    return AG_TOOL_CANCELLED;
  pthread_mutex_lock(&P.mu);
  if (tag != NULL && strlen(P.order) + strlen(tag) < sizeof(P.order))
    strcat(P.order, tag);
  pthread_mutex_unlock(&P.mu);
  ag_output_printf(out, "%s", tag != NULL ? tag : "done");
  return AG_TOOL_OK;
}

/* Answers its arguments' JSON text (compact, sorted keys). */
static ag_tool_status echo_tool(void *user, const json_t *args,
                                ag_cancel *cancel, ag_output *out) {
  (void)user;
  (void)cancel;
  pthread_mutex_lock(&P.mu);
  P.runs++;
  pthread_mutex_unlock(&P.mu);
  char *s = json_dumps(args, JSON_COMPACT | JSON_SORT_KEYS);
  if (s == NULL)
    return AG_TOOL_ERROR;
  ag_output_write(out, s, strlen(s));
  free(s);
  return AG_TOOL_OK;
}

/* {"id": K}: fails with a transient error on its first two attempts for
 * that id, then succeeds. */
static ag_tool_status flaky_tool(void *user, const json_t *args,
                                 ag_cancel *cancel, ag_output *out) {
  (void)user;
  (void)cancel;
  json_int_t id = json_integer_value(json_object_get(args, "id"));
  if (id < 0 || id >= 16)
    return AG_TOOL_ERROR;
  pthread_mutex_lock(&P.mu);
  int attempt = ++P.flaky_attempts[id];
  P.runs++;
  pthread_mutex_unlock(&P.mu);
  ag_cancel_wait(cancel, 5);
  if (attempt < 3) {
    ag_output_printf(out, "Connection refused (attempt %d)", attempt);
    ag_output_set_transient(out, true);
    return AG_TOOL_ERROR;
  }
  ag_output_printf(out, "ok on attempt %d", attempt);
  return AG_TOOL_OK;
}

static ag_config test_config(void) {
  ag_config cfg;
  ag_config_init(&cfg);
  cfg.loop.parallel = true;
  cfg.loop.max_parallel = 8;
  cfg.retry.max_retries = 3;
  cfg.retry.delay_ms = 1;
  cfg.retry.max_delay_ms = 5;
  cfg.retry.function_timeout_ms = 10000;
  return cfg;
}

static const char *path_schema =
    "{\"type\":\"object\",\"properties\":{\"path\":{\"type\":\"string\"}},"
    "\"required\":[\"path\"]}";

/* Tools added in alphabetical order, so the "Available tools" list reads
 * the same whether the registry keeps insertion or sorted order. */
static ag_registry *make_registry(void) {
  ag_registry *reg = NULL;
  ag_error_t err;
  cr_assert_eq(ag_registry_new(&reg, &err), AG_OK, "%s", err.msg);

  ag_tool_def d;
  ag_tool_def_init(&d);
  d.name = "danger";
  d.fn = echo_tool;
  d.requires_approval = true;
  cr_assert_eq(ag_registry_add(reg, &d, &err), AG_OK, "%s", err.msg);

  ag_tool_def_init(&d);
  d.name = "echo";
  d.fn = echo_tool;
  cr_assert_eq(ag_registry_add(reg, &d, &err), AG_OK, "%s", err.msg);

  ag_tool_def_init(&d);
  d.name = "flaky";
  d.fn = flaky_tool;
  cr_assert_eq(ag_registry_add(reg, &d, &err), AG_OK, "%s", err.msg);

  ag_tool_def_init(&d);
  d.name = "read";
  d.fn = echo_tool;
  d.parameters = path_schema;
  cr_assert_eq(ag_registry_add(reg, &d, &err), AG_OK, "%s", err.msg);

  ag_tool_def_init(&d);
  d.name = "sleep";
  d.fn = sleep_tool;
  cr_assert_eq(ag_registry_add(reg, &d, &err), AG_OK, "%s", err.msg);
  return reg;
}

static ag_scheduler *make_scheduler(const ag_registry *reg,
                                    const ag_config *cfg,
                                    const ag_scheduler_opts *opts) {
  ag_scheduler *s = NULL;
  ag_error_t err;
  ag_error_clear(&err);
  cr_assert_eq(ag_scheduler_new(&s, reg, cfg, opts, &err), AG_OK, "%s",
               err.msg);
  cr_assert_not_null(s);
  return s;
}

static ag_exec_call call(const char *name, const char *args) {
  ag_exec_call c = {name, args, args != NULL ? strlen(args) : 0, false, NULL};
  return c;
}

static void clear_all(ag_exec_result *r, size_t n) {
  for (size_t i = 0; i < n; i++)
    ag_exec_result_clear(&r[i]);
}

static ag_err_t run(ag_scheduler *s, const ag_exec_call *calls, size_t n,
                    ag_cancel *turn, ag_exec_result *results) {
  ag_error_t err;
  ag_error_clear(&err);
  ag_err_t rc = ag_scheduler_run(s, calls, n, turn, results, &err);
  cr_assert_eq(rc, AG_OK, "ag_scheduler_run: %s (%s)", ag_err_name(rc),
               err.msg);
  return rc;
}

#define EXPECT_TEXT(res, want)                                                 \
  do {                                                                         \
    const char *got_ = (res).text != NULL ? (res).text : "(null)";             \
    cr_expect_str_eq(got_, (want), "text: got \"%s\", want \"%s\"", got_,      \
                     (want));                                                  \
    cr_expect_eq((res).text_len, strlen(got_));                                \
  } while (0)

#define EXPECT_STATUS(res, want)                                               \
  cr_expect_eq((res).status, (want), "status: got %s, want %s (text \"%s\")",  \
               ag_exec_status_name((res).status), ag_exec_status_name(want),   \
               (res).text != NULL ? (res).text : "(null)")

/* ------------------------------------------------------------------------ */
/* Construction                                                             */
/* ------------------------------------------------------------------------ */

Test(scheduler, opts_init_defaults) {
  ag_scheduler_opts o;
  memset(&o, 0xAB, sizeof(o));
  ag_scheduler_opts_init(&o);
  cr_expect_null(o.approve);
  cr_expect_null(o.approve_user);
  cr_expect_null(o.on_attempt);
  cr_expect_null(o.attempt_user);
  cr_expect_eq(o.jitter_seed, 0);
}

Test(scheduler, new_free_idle) {
  ag_registry *reg = make_registry();
  ag_config cfg = test_config();
  for (int par = 1; par <= 64; par *= 4) {
    cfg.loop.max_parallel = par;
    ag_scheduler *s = make_scheduler(reg, &cfg, NULL);
    ag_scheduler_free(s);
  }
  cfg.loop.parallel = false;
  ag_scheduler_free(make_scheduler(reg, &cfg, NULL));
  ag_scheduler_free(NULL);
  ag_scheduler *s = (ag_scheduler *)0x1;
  cr_expect_eq(ag_scheduler_new(&s, NULL, &cfg, NULL, NULL), AG_EINVAL);
  cr_expect_null(s);
  ag_registry_free(reg);
}

Test(scheduler, empty_batch) {
  ag_registry *reg = make_registry();
  ag_config cfg = test_config();
  ag_scheduler *s = make_scheduler(reg, &cfg, NULL);
  cr_expect_eq(ag_scheduler_run(s, NULL, 0, NULL, NULL, NULL), AG_OK);
  ag_scheduler_free(s);
  ag_registry_free(reg);
}

/* ------------------------------------------------------------------------ */
/* Pre-phase                                                                */
/* ------------------------------------------------------------------------ */

Test(scheduler, skip_unknown_invalid_never_run) {
  probe_reset();
  ag_registry *reg = make_registry();
  ag_config cfg = test_config();
  ag_scheduler *s = make_scheduler(reg, &cfg, NULL);

  ag_exec_call calls[7] = {
      call("echo", "{\"a\":1}"),    call("nope", "{}"),
      call("echo", "{\"a\":"),      call("echo", "{\"a\":1,\"a\":2}"),
      call("read", "{\"path\":3}"), call("echo", "[1,2]"),
      call("echo", "{}"),
  };
  calls[6].skip = true;
  ag_exec_result r[7];
  run(s, calls, 7, NULL, r);

  EXPECT_STATUS(r[0], AG_EXEC_OK);
  EXPECT_TEXT(r[0], "{\"a\":1}");
  cr_expect(r[0].ok);
  cr_expect_eq(r[0].attempts, 1);

  EXPECT_STATUS(r[1], AG_EXEC_NOT_FOUND);
  EXPECT_TEXT(r[1], "Error: unknown tool \"nope\". Available tools: danger, "
                    "echo, flaky, read, sleep");
  cr_expect_eq(r[1].category, AG_CAT_NOT_FOUND);

  EXPECT_STATUS(r[2], AG_EXEC_INVALID);
  cr_expect(strncmp(r[2].text, "Error: invalid arguments for echo: ",
                    strlen("Error: invalid arguments for echo: ")) == 0,
            "%s", r[2].text);
  cr_expect(strstr(r[2].text, " at position ") != NULL, "%s", r[2].text);

  EXPECT_STATUS(r[3], AG_EXEC_INVALID);
  cr_expect(strstr(r[3].text, "duplicate") != NULL, "%s", r[3].text);

  EXPECT_STATUS(r[4], AG_EXEC_INVALID);
  /* the validator may say more after this ("..., got integer") */
  const char *want4 =
      "Error: invalid arguments for read: /path: expected string";
  cr_expect(strncmp(r[4].text, want4, strlen(want4)) == 0, "%s", r[4].text);

  EXPECT_STATUS(r[5], AG_EXEC_INVALID);

  EXPECT_STATUS(r[6], AG_EXEC_SKIPPED);
  EXPECT_TEXT(r[6], "");

  for (int i = 1; i < 7; i++) {
    cr_expect_not(r[i].ok, "call %d", i);
    cr_expect_eq(r[i].attempts, 0, "call %d attempts %d", i, r[i].attempts);
    if (i >= 2 && i <= 5)
      cr_expect_eq(r[i].category, AG_CAT_VALIDATION, "call %d: %s", i,
                   ag_category_name(r[i].category));
  }
  cr_expect_eq(probe_runs(), 1, "only the valid call ran, got %d runs",
               probe_runs());
  clear_all(r, 7);
  ag_scheduler_free(s);
  ag_registry_free(reg);
}

Test(scheduler, empty_arguments_are_an_empty_object) {
  ag_registry *reg = make_registry();
  ag_config cfg = test_config();
  ag_scheduler *s = make_scheduler(reg, &cfg, NULL);
  ag_exec_call calls[2] = {call("echo", ""), call("echo", "  \n")};
  calls[0].args = NULL;
  ag_exec_result r[2];
  run(s, calls, 2, NULL, r);
  for (int i = 0; i < 2; i++) {
    EXPECT_STATUS(r[i], AG_EXEC_OK);
    EXPECT_TEXT(r[i], "{}");
  }
  clear_all(r, 2);
  ag_scheduler_free(s);
  ag_registry_free(reg);
}

/* ------------------------------------------------------------------------ */
/* Approvals                                                                */
/* ------------------------------------------------------------------------ */

typedef struct asked {
  int count;
  char args[8][64];
  pthread_t thread[8];
  ag_approval answer;
  const char *reason;
} asked;

static ag_approval approve_cb(void *user, const char *tool, const char *args,
                              size_t args_len, char *reason,
                              size_t reason_cap) {
  asked *a = user;
  cr_assert_str_eq(tool, "danger");
  if (a->count < 8) {
    snprintf(a->args[a->count], sizeof(a->args[0]), "%.*s", (int)args_len,
             args);
    a->thread[a->count] = pthread_self();
  }
  a->count++;
  if (a->reason != NULL)
    snprintf(reason, reason_cap, "%s", a->reason);
  return a->answer;
}

Test(scheduler, approval_once_per_distinct_signature) {
  probe_reset();
  ag_registry *reg = make_registry();
  ag_config cfg = test_config();
  asked a = {.answer = AG_APPROVE_ONCE};
  ag_scheduler_opts o;
  ag_scheduler_opts_init(&o);
  o.approve = approve_cb;
  o.approve_user = &a;
  ag_scheduler *s = make_scheduler(reg, &cfg, &o);

  /* the first two are the same call: key order and whitespace differ */
  ag_exec_call calls[4] = {
      call("danger", "{\"x\":1,\"y\":2}"),
      call("danger", "{ \"y\": 2, \"x\": 1.0 }"),
      call("echo", "{\"free\":true}"),
      call("danger", "{\"x\":2}"),
  };
  ag_exec_result r[4];
  run(s, calls, 4, NULL, r);
  cr_expect_eq(a.count, 2, "questions: got %d, want 2", a.count);
  cr_expect_str_eq(a.args[0], "{\"x\":1,\"y\":2}");
  cr_expect_str_eq(a.args[1], "{\"x\":2}");
  for (int i = 0; i < 2; i++)
    cr_expect(pthread_equal(a.thread[i], pthread_self()),
              "question %d not on the caller's thread", i);
  for (int i = 0; i < 4; i++)
    EXPECT_STATUS(r[i], AG_EXEC_OK);
  cr_expect_eq(probe_runs(), 4);
  clear_all(r, 4);

  /* a new batch asks again: ONCE is not remembered */
  run(s, calls, 1, NULL, r);
  cr_expect_eq(a.count, 3);
  clear_all(r, 1);
  ag_scheduler_free(s);
  ag_registry_free(reg);
}

/* A signature the caller passes (the agent passes the guard's) is the one
 * the questions are grouped by: two calls given the same one are asked once
 * even though their arguments differ, and a call without one is signed by
 * the scheduler as before. */
Test(scheduler, approval_uses_the_callers_signature) {
  probe_reset();
  ag_registry *reg = make_registry();
  ag_config cfg = test_config();
  asked a = {.answer = AG_APPROVE_ONCE};
  ag_scheduler_opts o;
  ag_scheduler_opts_init(&o);
  o.approve = approve_cb;
  o.approve_user = &a;
  ag_scheduler *s = make_scheduler(reg, &cfg, &o);

  uint8_t same[AG_SIG_LEN];
  memset(same, 0xab, sizeof(same));
  ag_exec_call calls[3] = {
      call("danger", "{\"x\":1}"),
      call("danger", "{\"x\":2}"),
      call("danger", "{\"x\":1}"),
  };
  calls[0].signature = same;
  calls[1].signature = same;
  ag_exec_result r[3];
  run(s, calls, 3, NULL, r);
  /* calls 0 and 1 share the given signature; call 2 is signed here, and
   * its real signature is not 0xab... */
  cr_expect_eq(a.count, 2, "questions: got %d, want 2", a.count);
  cr_expect_str_eq(a.args[0], "{\"x\":1}");
  cr_expect_str_eq(a.args[1], "{\"x\":1}");
  for (int i = 0; i < 3; i++)
    EXPECT_STATUS(r[i], AG_EXEC_OK);
  clear_all(r, 3);
  ag_scheduler_free(s);
  ag_registry_free(reg);
}

Test(scheduler, approval_for_the_session) {
  probe_reset();
  ag_registry *reg = make_registry();
  ag_config cfg = test_config();
  asked a = {.answer = AG_APPROVE_SESSION};
  ag_scheduler_opts o;
  ag_scheduler_opts_init(&o);
  o.approve = approve_cb;
  o.approve_user = &a;
  ag_scheduler *s = make_scheduler(reg, &cfg, &o);

  ag_exec_call calls[2] = {call("danger", "{\"x\":1}"),
                           call("danger", "{\"x\":2}")};
  ag_exec_result r[2];
  run(s, calls, 2, NULL, r);
  cr_expect_eq(a.count, 1, "the session answer covers the batch: %d asked",
               a.count);
  EXPECT_STATUS(r[0], AG_EXEC_OK);
  EXPECT_STATUS(r[1], AG_EXEC_OK);
  clear_all(r, 2);

  ag_exec_call other = call("danger", "{\"x\":3}");
  run(s, &other, 1, NULL, r);
  cr_expect_eq(a.count, 1, "remembered across batches: %d asked", a.count);
  EXPECT_STATUS(r[0], AG_EXEC_OK);
  clear_all(r, 1);

  ag_scheduler_reset_approvals(s);
  a.answer = AG_APPROVE_ONCE;
  run(s, &other, 1, NULL, r);
  cr_expect_eq(a.count, 2, "asked again after reset: %d asked", a.count);
  clear_all(r, 1);
  ag_scheduler_free(s);
  ag_registry_free(reg);
}

Test(scheduler, denial_text) {
  probe_reset();
  ag_registry *reg = make_registry();
  ag_config cfg = test_config();
  asked a = {.answer = AG_APPROVE_DENY, .reason = "too risky"};
  ag_scheduler_opts o;
  ag_scheduler_opts_init(&o);
  o.approve = approve_cb;
  o.approve_user = &a;
  ag_scheduler *s = make_scheduler(reg, &cfg, &o);

  ag_exec_call calls[3] = {call("danger", "{\"x\":1}"), call("echo", "{}"),
                           call("danger", "{\"x\":1}")};
  ag_exec_result r[3];
  run(s, calls, 3, NULL, r);
  cr_expect_eq(a.count, 1);
  EXPECT_STATUS(r[0], AG_EXEC_DENIED);
  EXPECT_TEXT(r[0], "Tool call rejected: too risky");
  cr_expect_not(r[0].ok);
  cr_expect_eq(r[0].attempts, 0);
  EXPECT_STATUS(r[1], AG_EXEC_OK);
  EXPECT_STATUS(r[2], AG_EXEC_DENIED);
  EXPECT_TEXT(r[2], "Tool call rejected: too risky");
  cr_expect_eq(probe_runs(), 1, "denied calls never run");
  clear_all(r, 3);

  a.reason = NULL;
  run(s, calls, 1, NULL, r);
  EXPECT_TEXT(r[0], "Tool call rejected: denied by the user");
  clear_all(r, 1);
  ag_scheduler_free(s);
  ag_registry_free(reg);
}

Test(scheduler, no_callback_approves_everything) {
  probe_reset();
  ag_registry *reg = make_registry();
  ag_config cfg = test_config();
  ag_scheduler *s = make_scheduler(reg, &cfg, NULL);
  ag_exec_call c = call("danger", "{}");
  ag_exec_result r;
  run(s, &c, 1, NULL, &r);
  EXPECT_STATUS(r, AG_EXEC_OK);
  ag_exec_result_clear(&r);
  ag_scheduler_free(s);
  ag_registry_free(reg);
}

/* ------------------------------------------------------------------------ */
/* Phase 2: parallelism and order                                           */
/* ------------------------------------------------------------------------ */

Test(scheduler, results_in_call_order) {
  probe_reset();
  ag_registry *reg = make_registry();
  ag_config cfg = test_config();
  ag_scheduler *s = make_scheduler(reg, &cfg, NULL);
  ag_exec_call calls[3] = {
      call("sleep", "{\"ms\":50,\"tag\":\"a\"}"),
      call("sleep", "{\"ms\":10,\"tag\":\"b\"}"),
      call("sleep", "{\"ms\":30,\"tag\":\"c\"}"),
  };
  ag_exec_result r[3];
  run(s, calls, 3, NULL, r);
  EXPECT_TEXT(r[0], "a");
  EXPECT_TEXT(r[1], "b");
  EXPECT_TEXT(r[2], "c");
  pthread_mutex_lock(&P.mu);
  cr_expect_str_eq(P.order, "bca", "completion order %s", P.order);
  pthread_mutex_unlock(&P.mu);
  for (int i = 0; i < 3; i++) {
    EXPECT_STATUS(r[i], AG_EXEC_OK);
    cr_expect_eq(r[i].attempts, 1);
  }
  clear_all(r, 3);
  ag_scheduler_free(s);
  ag_registry_free(reg);
}

static int64_t run_sleepers(int n, int ms, bool parallel, int max_parallel) {
  probe_reset();
  ag_registry *reg = make_registry();
  ag_config cfg = test_config();
  cfg.loop.parallel = parallel;
  cfg.loop.max_parallel = max_parallel;
  ag_scheduler *s = make_scheduler(reg, &cfg, NULL);
  ag_exec_call calls[16];
  char args[16][48];
  for (int i = 0; i < n; i++) {
    snprintf(args[i], sizeof(args[i]), "{\"ms\":%d,\"tag\":\"%c\"}", ms,
             'a' + i);
    calls[i] = call("sleep", args[i]);
  }
  ag_exec_result r[16];
  int64_t t0 = ag_now_ms();
  run(s, calls, (size_t)n, NULL, r);
  int64_t took = ag_now_ms() - t0;
  for (int i = 0; i < n; i++) {
    EXPECT_STATUS(r[i], AG_EXEC_OK);
    char want[2] = {(char)('a' + i), 0};
    EXPECT_TEXT(r[i], want);
  }
  clear_all(r, (size_t)n);
  ag_scheduler_free(s);
  ag_registry_free(reg);
  return took;
}

Test(scheduler, parallel_is_real) {
  int64_t took = run_sleepers(8, 50, true, 8);
  cr_expect_lt(took, 300, "8 x 50 ms on 8 threads took %lld ms",
               (long long)took);
}

Test(scheduler, max_parallel_bounds_concurrency) {
  /* 8 x 40 ms on 2 threads: at least 4 rounds */
  int64_t took = run_sleepers(8, 40, true, 2);
  cr_expect_geq(took, 4 * 40, "took %lld ms", (long long)took);
  cr_expect_lt(took, 8 * 40, "took %lld ms", (long long)took);
}

Test(scheduler, sequential_when_parallel_is_off) {
  int64_t took = run_sleepers(8, 20, false, 8);
  cr_expect_geq(took, 8 * 20, "8 x 20 ms sequentially took %lld ms",
                (long long)took);
  pthread_mutex_lock(&P.mu);
  for (int i = 0; i < 8; i++)
    cr_expect(pthread_equal(P.threads[i], pthread_self()),
              "call %d not on the caller's thread", i);
  pthread_mutex_unlock(&P.mu);
}

Test(scheduler, batch_of_one_on_callers_thread) {
  probe_reset();
  ag_registry *reg = make_registry();
  ag_config cfg = test_config();
  ag_scheduler *s = make_scheduler(reg, &cfg, NULL);

  /* one runnable call among calls that never run still counts as one */
  ag_exec_call calls[3] = {call("sleep", "{\"ms\":0,\"tag\":\"a\"}"),
                           call("nope", "{}"), call("echo", "{")};
  ag_exec_result r[3];
  run(s, calls, 3, NULL, r);
  EXPECT_STATUS(r[0], AG_EXEC_OK);
  pthread_mutex_lock(&P.mu);
  cr_expect_eq(P.runs, 1);
  cr_expect(pthread_equal(P.threads[0], pthread_self()),
            "a batch of one ran on a pool thread");
  pthread_mutex_unlock(&P.mu);
  clear_all(r, 3);

  /* two runnable calls go to the pool */
  probe_reset();
  ag_exec_call two[2] = {call("sleep", "{\"ms\":0,\"tag\":\"a\"}"),
                         call("sleep", "{\"ms\":0,\"tag\":\"b\"}")};
  run(s, two, 2, NULL, r);
  pthread_mutex_lock(&P.mu);
  cr_expect_eq(P.runs, 2);
  for (int i = 0; i < 2; i++)
    cr_expect_not(pthread_equal(P.threads[i], pthread_self()),
                  "call %d of a parallel batch on the caller's thread", i);
  pthread_mutex_unlock(&P.mu);
  clear_all(r, 2);
  ag_scheduler_free(s);
  ag_registry_free(reg);
}

Test(scheduler, many_batches_reuse_the_pool) {
  ag_registry *reg = make_registry();
  ag_config cfg = test_config();
  cfg.loop.max_parallel = 4;
  ag_scheduler *s = make_scheduler(reg, &cfg, NULL);
  ag_exec_call calls[40];
  char args[40][24];
  for (int i = 0; i < 40; i++) {
    snprintf(args[i], sizeof(args[i]), "{\"i\":%d}", i);
    calls[i] = call("echo", args[i]);
  }
  ag_exec_result r[40];
  for (int round = 0; round < 50; round++) {
    size_t n = (size_t)(round % 40) + 1;
    run(s, calls, n, NULL, r);
    for (size_t i = 0; i < n; i++) {
      EXPECT_STATUS(r[i], AG_EXEC_OK);
      EXPECT_TEXT(r[i], args[i]);
    }
    clear_all(r, n);
  }
  ag_scheduler_free(s);
  ag_registry_free(reg);
}

/* ------------------------------------------------------------------------ */
/* Cancellation                                                             */
/* ------------------------------------------------------------------------ */

static void expect_all_cancelled(ag_exec_result *r, size_t n) {
  for (size_t i = 0; i < n; i++) {
    EXPECT_STATUS(r[i], AG_EXEC_CANCELLED);
    cr_expect_not(r[i].ok);
  }
}

Test(scheduler, turn_deadline_cancels_parallel_calls) {
  probe_reset();
  ag_registry *reg = make_registry();
  ag_config cfg = test_config();
  ag_scheduler *s = make_scheduler(reg, &cfg, NULL);
  ag_cancel *turn = NULL;
  int64_t t0 = ag_now_ms();
  cr_assert_eq(ag_cancel_new(&turn, NULL, t0 + 100, AG_CANCEL_DEADLINE, NULL),
               AG_OK);
  ag_exec_call calls[4];
  for (int i = 0; i < 4; i++)
    calls[i] = call("sleep", "{\"ms\":-1}");
  ag_exec_result r[4];
  run(s, calls, 4, turn, r);
  int64_t took = ag_now_ms() - t0;
  expect_all_cancelled(r, 4);
  cr_expect_eq(probe_runs(), 4, "each ran once, not retried: %d runs",
               probe_runs());
  cr_expect_geq(took, 95, "returned before the deadline: %lld ms",
                (long long)took);
  cr_expect_lt(took, 100 + 200, "returned %lld ms after the start",
               (long long)took);
  clear_all(r, 4);
  ag_cancel_free(turn);
  ag_scheduler_free(s);
  ag_registry_free(reg);
}

typedef struct canceller {
  ag_cancel *turn;
  int after_ms;
} canceller;

static void *cancel_later(void *arg) {
  canceller *c = arg;
  ag_cancel *sleeper = NULL;
  if (ag_cancel_new(&sleeper, NULL, INT64_MAX, AG_CANCEL_DEADLINE, NULL) ==
      AG_OK) {
    ag_cancel_wait(sleeper, c->after_ms);
    ag_cancel_free(sleeper);
  }
  ag_cancel_cancel(c->turn, AG_CANCEL_USER);
  return NULL;
}

Test(scheduler, caller_cancel_from_another_thread) {
  probe_reset();
  ag_registry *reg = make_registry();
  ag_config cfg = test_config();
  ag_scheduler *s = make_scheduler(reg, &cfg, NULL);
  ag_cancel *turn = NULL;
  cr_assert_eq(ag_cancel_new(&turn, NULL, INT64_MAX, AG_CANCEL_DEADLINE, NULL),
               AG_OK);
  canceller c = {turn, 80};
  pthread_t th;
  int64_t t0 = ag_now_ms();
  cr_assert_eq(pthread_create(&th, NULL, cancel_later, &c), 0);
  ag_exec_call calls[4];
  for (int i = 0; i < 4; i++)
    calls[i] = call("sleep", "{\"ms\":-1}");
  ag_exec_result r[4];
  run(s, calls, 4, turn, r);
  int64_t took = ag_now_ms() - t0;
  pthread_join(th, NULL);
  expect_all_cancelled(r, 4);
  cr_expect_lt(took, 80 + 200, "returned %lld ms after the start",
               (long long)took);
  clear_all(r, 4);

  /* the token stays cancelled: the next batch starts nothing */
  probe_reset();
  ag_exec_call two[2] = {call("echo", "{}"), call("echo", "{}")};
  run(s, two, 2, turn, r);
  expect_all_cancelled(r, 2);
  cr_expect_eq(probe_runs(), 0);
  cr_expect_eq(r[0].attempts, 0);
  clear_all(r, 2);
  ag_cancel_free(turn);
  ag_scheduler_free(s);
  ag_registry_free(reg);
}

static ag_approval cancel_while_asking(void *user, const char *tool,
                                       const char *args, size_t args_len,
                                       char *reason, size_t reason_cap) {
  (void)tool;
  (void)args;
  (void)args_len;
  (void)reason;
  (void)reason_cap;
  ag_cancel_cancel(user, AG_CANCEL_USER);
  return AG_APPROVE_ONCE;
}

Test(scheduler, cancelled_during_approval_runs_nothing) {
  probe_reset();
  ag_registry *reg = make_registry();
  ag_config cfg = test_config();
  ag_cancel *turn = NULL;
  cr_assert_eq(ag_cancel_new(&turn, NULL, INT64_MAX, AG_CANCEL_DEADLINE, NULL),
               AG_OK);
  ag_scheduler_opts o;
  ag_scheduler_opts_init(&o);
  o.approve = cancel_while_asking;
  o.approve_user = turn;
  ag_scheduler *s = make_scheduler(reg, &cfg, &o);
  ag_exec_call calls[3] = {call("danger", "{\"x\":1}"), call("echo", "{}"),
                           call("danger", "{\"x\":2}")};
  ag_exec_result r[3];
  run(s, calls, 3, turn, r);
  expect_all_cancelled(r, 3);
  cr_expect_eq(probe_runs(), 0);
  clear_all(r, 3);
  ag_cancel_free(turn);
  ag_scheduler_free(s);
  ag_registry_free(reg);
}

/* ------------------------------------------------------------------------ */
/* Retries and attempt events                                               */
/* ------------------------------------------------------------------------ */

typedef struct events {
  pthread_mutex_t mu;
  int count;
  int per_call[16];
  int ok;
  pthread_t threads[64];
  int n_threads;
} events;

static void on_attempt(void *user, const ag_attempt *a) {
  events *e = user;
  pthread_mutex_lock(&e->mu);
  e->count++;
  if (a->call_index >= 0 && a->call_index < 16)
    e->per_call[a->call_index]++;
  if (a->outcome == AG_TOOL_OK)
    e->ok++;
  bool seen = false;
  for (int i = 0; i < e->n_threads; i++)
    seen = seen || pthread_equal(e->threads[i], pthread_self());
  if (!seen && e->n_threads < 64)
    e->threads[e->n_threads++] = pthread_self();
  pthread_mutex_unlock(&e->mu);
}

Test(scheduler, flaky_tool_in_a_parallel_batch) {
  probe_reset();
  ag_registry *reg = make_registry();
  ag_config cfg = test_config();
  events e = {.mu = PTHREAD_MUTEX_INITIALIZER};
  ag_scheduler_opts o;
  ag_scheduler_opts_init(&o);
  o.on_attempt = on_attempt;
  o.attempt_user = &e;
  o.jitter_seed = 42;
  ag_scheduler *s = make_scheduler(reg, &cfg, &o);
  ag_exec_call calls[4] = {
      call("sleep", "{\"ms\":20,\"tag\":\"a\"}"),
      call("flaky", "{\"id\":1}"),
      call("sleep", "{\"ms\":20,\"tag\":\"b\"}"),
      call("flaky", "{\"id\":2}"),
  };
  ag_exec_result r[4];
  run(s, calls, 4, NULL, r);
  for (int i = 0; i < 4; i++)
    EXPECT_STATUS(r[i], AG_EXEC_OK);
  EXPECT_TEXT(r[1], "ok on attempt 3");
  EXPECT_TEXT(r[3], "ok on attempt 3");
  cr_expect_eq(r[1].attempts, 3, "attempts %d", r[1].attempts);
  cr_expect_eq(r[3].attempts, 3, "attempts %d", r[3].attempts);
  cr_expect_eq(r[0].attempts, 1);
  pthread_mutex_lock(&e.mu);
  cr_expect_eq(e.count, 1 + 3 + 1 + 3, "attempt events %d", e.count);
  cr_expect_eq(e.per_call[1], 3);
  cr_expect_eq(e.per_call[3], 3);
  cr_expect_eq(e.ok, 4);
  pthread_mutex_unlock(&e.mu);
  clear_all(r, 4);
  ag_scheduler_free(s);
  ag_registry_free(reg);
}

Test(scheduler, attempt_events_from_several_threads) {
  probe_reset();
  ag_registry *reg = make_registry();
  ag_config cfg = test_config();
  events e = {.mu = PTHREAD_MUTEX_INITIALIZER};
  ag_scheduler_opts o;
  ag_scheduler_opts_init(&o);
  o.on_attempt = on_attempt;
  o.attempt_user = &e;
  ag_scheduler *s = make_scheduler(reg, &cfg, &o);
  ag_exec_call calls[8];
  for (int i = 0; i < 8; i++)
    calls[i] = call("sleep", "{\"ms\":30,\"tag\":\"x\"}");
  ag_exec_result r[8];
  run(s, calls, 8, NULL, r);
  pthread_mutex_lock(&e.mu);
  cr_expect_eq(e.count, 8, "events %d", e.count);
  for (int i = 0; i < 8; i++)
    cr_expect_eq(e.per_call[i], 1, "call %d: %d events", i, e.per_call[i]);
  cr_expect_geq(e.n_threads, 2, "events came from %d thread(s)", e.n_threads);
  for (int i = 0; i < e.n_threads; i++)
    cr_expect_not(pthread_equal(e.threads[i], pthread_self()));
  pthread_mutex_unlock(&e.mu);
  clear_all(r, 8);
  ag_scheduler_free(s);
  ag_registry_free(reg);
}

/* ------------------------------------------------------------------------ */
/* Subprocess tools                                                         */
/* ------------------------------------------------------------------------ */

Test(scheduler, subprocess_tools_in_a_parallel_batch) {
  probe_reset();
  ag_registry *reg = make_registry();
  ag_error_t err;
  const char *cat_argv[] = {"cat", NULL};
  const char *slow_argv[] = {"sh", "-c", "sleep 0.05; echo slow", NULL};
  const char *fail_argv[] = {"sh", "-c", "echo 'bad input' >&2; exit 3", NULL};
  ag_tool_def d;
  ag_tool_def_init(&d);
  d.name = "sp_cat";
  d.argv = cat_argv;
  cr_assert_eq(ag_registry_add(reg, &d, &err), AG_OK, "%s", err.msg);
  ag_tool_def_init(&d);
  d.name = "sp_slow";
  d.argv = slow_argv;
  cr_assert_eq(ag_registry_add(reg, &d, &err), AG_OK, "%s", err.msg);
  ag_tool_def_init(&d);
  d.name = "sp_fail";
  d.argv = fail_argv;
  d.max_retries = 0;
  cr_assert_eq(ag_registry_add(reg, &d, &err), AG_OK, "%s", err.msg);

  ag_config cfg = test_config();
  ag_scheduler *s = make_scheduler(reg, &cfg, NULL);
  ag_exec_call calls[5] = {
      call("sp_slow", "{}"),
      call("sp_cat", "{\"q\": \"hello\"}"),
      call("sleep", "{\"ms\":10,\"tag\":\"n\"}"),
      call("sp_fail", "{}"),
      call("sp_slow", "{}"),
  };
  ag_exec_result r[5];
  int64_t t0 = ag_now_ms();
  run(s, calls, 5, NULL, r);
  int64_t took = ag_now_ms() - t0;
  EXPECT_STATUS(r[0], AG_EXEC_OK);
  EXPECT_TEXT(r[0], "slow\n");
  EXPECT_STATUS(r[1], AG_EXEC_OK);
  EXPECT_TEXT(r[1], "{\"q\": \"hello\"}");
  EXPECT_STATUS(r[2], AG_EXEC_OK);
  EXPECT_STATUS(r[3], AG_EXEC_ERROR);
  cr_expect(r[3].text != NULL && strstr(r[3].text, "bad input") != NULL, "%s",
            r[3].text);
  EXPECT_STATUS(r[4], AG_EXEC_OK);
  cr_expect_lt(took, 2000, "took %lld ms", (long long)took);
  clear_all(r, 5);
  ag_scheduler_free(s);
  ag_registry_free(reg);
}

/* Pool threads block signals; a command they start must still get SIGTERM
 * (the child resets its mask): with a 3 s grace before SIGKILL, a timed-out
 * `sleep` that ignored SIGTERM would hold the batch for 3 s. */
Test(scheduler, subprocess_timeout_on_the_pool_is_terminated) {
  ag_registry *reg = make_registry();
  ag_error_t err;
  const char *sleep_argv[] = {"sleep", "10", NULL};
  ag_tool_def d;
  ag_tool_def_init(&d);
  d.name = "sp_sleep";
  d.argv = sleep_argv;
  d.timeout_ms = 50;
  d.max_retries = 0;
  d.kill_grace_ms = 3000;
  cr_assert_eq(ag_registry_add(reg, &d, &err), AG_OK, "%s", err.msg);
  ag_config cfg = test_config();
  ag_scheduler *s = make_scheduler(reg, &cfg, NULL);
  ag_exec_call calls[3] = {call("sp_sleep", "{}"), call("sp_sleep", "{}"),
                           call("sp_sleep", "{}")};
  ag_exec_result r[3];
  int64_t t0 = ag_now_ms();
  run(s, calls, 3, NULL, r);
  int64_t took = ag_now_ms() - t0;
  for (int i = 0; i < 3; i++) {
    EXPECT_STATUS(r[i], AG_EXEC_TIMEOUT);
    EXPECT_TEXT(r[i], "Function timed out after 50ms");
    cr_expect_eq(r[i].category, AG_CAT_TIMEOUT);
  }
  cr_expect_lt(took, 1000, "took %lld ms: SIGTERM did not end the commands",
               (long long)took);
  clear_all(r, 3);
  ag_scheduler_free(s);
  ag_registry_free(reg);
}
