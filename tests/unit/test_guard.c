/*
 * tests/unit/test_guard.c - the guard against every worked example of the
 * seeds, each under the preset of its seed, and the edge cases.
 * Core tests never sleep: time is an argument.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agentguard.h"
#include "core/internal.h" /* ag__guard_renew, ag__stops */

/* ---- helpers ------------------------------------------------------------ */

static ag_guard *make(const char *preset) {
  ag_config cfg;
  ag_error_t err;
  cr_assert_eq(ag_config_preset(&cfg, preset, &err), AG_OK, "preset %s: %s",
               preset, err.msg);
  ag_guard *g = NULL;
  cr_assert_eq(ag_guard_new(&g, &cfg, NULL, &err), AG_OK, "guard: %s", err.msg);
  ag_guard_begin_turn(g, 0);
  return g;
}

static ag_guard *make_json(const char *json) {
  ag_config cfg;
  ag_error_t err;
  cr_assert_eq(ag_config_parse(&cfg, json, strlen(json), &err), AG_OK,
               "config: %s", err.msg);
  ag_guard *g = NULL;
  cr_assert_eq(ag_guard_new(&g, &cfg, NULL, &err), AG_OK, "guard: %s", err.msg);
  ag_guard_begin_turn(g, 0);
  return g;
}

typedef struct step {
  const char *name, *args, *result;
  bool failed;
} step;

typedef struct batch_out {
  ag_action check;  /* batch verdict before execution */
  ag_action record; /* verdict after results (AG_ALLOW if not run) */
  ag_verdict v;     /* the deciding verdict */
  ag_call_check checks[16];
} batch_out;

/* One iteration: begin, check the batch, and when allowed record results
 * (held-back calls are reported as skipped). */
static batch_out iterate(ag_guard *g, const step *s, size_t n, int64_t now) {
  batch_out o;
  memset(&o, 0, sizeof(o));
  ag_call calls[16];
  ag_result res[16];
  cr_assert(n <= 16);
  ag_action a = ag_guard_begin_iteration(g, now, &o.v);
  if (a != AG_ALLOW) {
    o.check = a;
    return o;
  }
  for (size_t i = 0; i < n; i++) {
    calls[i].name = s[i].name;
    calls[i].args = s[i].args;
    calls[i].args_len = strlen(s[i].args);
  }
  o.check = ag_guard_check_calls(g, calls, n, now, o.checks, &o.v);
  if (o.check != AG_ALLOW)
    return o;
  for (size_t i = 0; i < n; i++) {
    res[i].name = s[i].name;
    res[i].sig = o.checks[i].valid ? o.checks[i].sig : NULL;
    res[i].outcome = o.checks[i].action == AG_NUDGE ? AG_OUTCOME_SKIPPED
                     : !o.checks[i].valid           ? AG_OUTCOME_ERROR
                     : s[i].failed                  ? AG_OUTCOME_ERROR
                                                    : AG_OUTCOME_OK;
    res[i].text = !o.checks[i].valid ? o.checks[i].message : s[i].result;
    res[i].text_len = strlen(res[i].text);
    res[i].category = AG_CAT__COUNT;
  }
  o.record = ag_guard_record_results(g, res, n, now, &o.v);
  return o;
}

static batch_out one(ag_guard *g, const char *name, const char *args,
                     const char *result, bool failed) {
  step s = {name, args, result, failed};
  return iterate(g, &s, 1, 0);
}

static json_t *dump(ag_guard *g) {
  char *s = NULL;
  ag_error_t err;
  cr_assert_eq(ag_guard_dump(g, &s, &err), AG_OK, "%s", err.msg);
  json_error_t je;
  json_t *j = json_loads(s, 0, &je);
  cr_assert_not_null(j, "dump is not JSON: %s", je.text);
  ag_free(s);
  return j;
}

static int tool_run(ag_guard *g, const char *name) {
  json_t *j = dump(g);
  json_t *tools = json_object_get(j, "tools");
  size_t i;
  json_t *t;
  int run = -1;
  json_array_foreach(tools, i, t) {
    if (strcmp(json_string_value(json_object_get(t, "name")), name) == 0)
      run = (int)json_integer_value(json_object_get(t, "identical_run"));
  }
  json_decref(j);
  return run;
}

/* ---- seed 000: consecutive error tracking (preset hpd) -------------------
 */

Test(seed000, scenario1_infinite_loop_prevention) {
  ag_guard *g = make("hpd");
  for (int i = 1; i <= 3; i++) {
    batch_out o = one(g, "ReadFile", "{\"path\":\"missing.txt\"}",
                      "Error: File not found", false);
    cr_assert_eq(o.check, AG_ALLOW);
    cr_assert_eq(o.record, AG_ALLOW, "iteration %d stopped early: %s", i,
                 o.v.message);
  }
  batch_out o = one(g, "ReadFile", "{\"path\":\"missing.txt\"}",
                    "Error: File not found", false);
  cr_assert_eq(o.record, AG_STOP);
  cr_assert_eq(o.v.reason, AG_REASON_CONSECUTIVE_ERRORS, "reason %s",
               ag_reason_name(o.v.reason));
  cr_assert_str_eq(o.v.message, "Exceeded maximum consecutive errors (3)");
  cr_assert_str_eq(o.v.warning,
                   "\xe2\x9a\xa0\xef\xb8\x8f Maximum consecutive errors (3) "
                   "exceeded. Stopping execution to prevent infinite error "
                   "loop.");
  ag_guard_free(g);
}

Test(seed000, scenario2_recovery_after_success) {
  ag_guard *g = make("hpd");
  step s[] = {
      {"ReadFile", "{\"p\":\"missing.txt\"}", "Error: File not found", false},
      {"WriteFile", "{\"p\":\"missing.txt\"}", "written", false},
      {"ReadFile", "{\"p\":\"missing.txt\"}", "contents", false},
      {"DeleteFile", "{\"p\":\"wrong.txt\"}", "Error: File not found", false},
      {"DeleteFile", "{\"p\":\"missing.txt\"}", "deleted", false}};
  for (size_t i = 0; i < 5; i++) {
    batch_out o = iterate(g, &s[i], 1, 0);
    cr_assert_eq(o.check, AG_ALLOW);
    cr_assert_eq(o.record, AG_ALLOW);
  }
  json_t *j = dump(g);
  cr_assert_eq(
      json_integer_value(json_object_get(json_object_get(j, "errors"),
                                         "consecutive_failing_iterations")),
      0);
  json_decref(j);
  ag_guard_free(g);
}

Test(seed000, scenario3_mixed_parallel_resets) {
  ag_guard *g = make("hpd");
  /* three failing iterations, then a mixed batch resets the count */
  for (int i = 0; i < 3; i++)
    one(g, "B", "{}", "Error: boom", false);
  step s[] = {{"A", "{}", "ok", false},
              {"B", "{}", "Error: boom", false},
              {"C", "{}", "ok", false}};
  batch_out o = iterate(g, s, 3, 0);
  cr_assert_eq(o.record, AG_ALLOW);
  for (int i = 0; i < 3; i++) {
    o = one(g, "B", "{\"n\":1}", "Error: boom", false);
    cr_assert_eq(o.record, AG_ALLOW, "count was not reset by the batch");
  }
  ag_guard_free(g);
}

Test(seed000, any_failed_mode_counts_mixed_batch) {
  ag_guard *g = make("meai");
  step s[] = {{"A", "{}", "ok", false}, {"B", "{}", "failed", true}};
  for (int i = 0; i < 3; i++)
    cr_assert_eq(iterate(g, s, 2, 0).record, AG_ALLOW);
  batch_out o = iterate(g, s, 2, 0);
  cr_assert_eq(o.record, AG_STOP);
  cr_assert_eq(o.v.reason, AG_REASON_CONSECUTIVE_ERRORS);
  ag_guard_free(g);
}

/* ---- seed 001: HPD safety architecture (preset hpd) ---------------------- */

Test(seed001, stuck_loop_trips_on_fifth_identical_call) {
  ag_guard *g = make("hpd");
  for (int i = 1; i <= 4; i++) {
    batch_out o =
        one(g, "ReadFile", "{\"path\":\"data.txt\"}", "contents", false);
    cr_assert_eq(o.check, AG_ALLOW, "call %d", i);
  }
  batch_out o =
      one(g, "ReadFile", "{\"path\":\"data.txt\"}", "contents", false);
  cr_assert_eq(o.check, AG_STOP);
  cr_assert_eq(o.v.reason, AG_REASON_IDENTICAL_CALLS);
  cr_assert_eq(o.v.call_index, 0);
  cr_assert_str_eq(o.v.tool, "ReadFile");
  cr_assert(strstr(o.v.message, "5 times") != NULL, "%s", o.v.message);
  ag_guard_free(g);
}

Test(seed001, fifty_files_is_progress) {
  ag_guard *g = make("hpd");
  for (int i = 1; i <= 50; i++) {
    char args[64];
    snprintf(args, sizeof(args), "{\"path\":\"file%d.txt\"}", i);
    batch_out o = one(g, "ReadFile", args, "ok", false);
    cr_assert_eq(o.check, AG_ALLOW);
    cr_assert_eq(o.record, AG_ALLOW);
  }
  ag_guard_free(g);
}

Test(seed001, parallel_spam_counted_across_batches) {
  ag_guard *g = make("hpd");
  const char *files[] = {"a", "b", "c", "d", "e"};
  for (int i = 0; i < 5; i++) {
    char args[32];
    snprintf(args, sizeof(args), "{\"path\":\"%s.txt\"}", files[i]);
    step s[] = {{"ReadFile", args, "ok", false},
                {"SpamFunction", "{\"x\":\"x\"}", "ok", false}};
    batch_out o = iterate(g, s, 2, 0);
    if (i < 4) {
      cr_assert_eq(o.check, AG_ALLOW, "batch %d", i + 1);
    } else {
      cr_assert_eq(o.check, AG_STOP);
      cr_assert_eq(o.v.reason, AG_REASON_IDENTICAL_CALLS);
      cr_assert_eq(o.v.call_index, 1);
      cr_assert_str_eq(o.v.tool, "SpamFunction");
    }
  }
  ag_guard_free(g);
}

Test(seed001, parallel_nuance_per_tool_counts) {
  ag_guard *g = make("hpd");
  const char *w[] = {"b", "c", "d"};
  for (int i = 0; i < 3; i++) {
    char args[32];
    snprintf(args, sizeof(args), "{\"path\":\"%s.txt\"}", w[i]);
    step s[] = {{"ReadFile", "{\"path\":\"a.txt\"}", "ok", false},
                {"WriteFile", args, "ok", false}};
    cr_assert_eq(iterate(g, s, 2, 0).check, AG_ALLOW);
    cr_assert_eq(tool_run(g, "ReadFile"), i + 1);
    cr_assert_eq(tool_run(g, "WriteFile"), 1);
  }
  ag_guard_free(g);
}

Test(seed001, error_spiral_different_functions) {
  ag_guard *g = make("hpd");
  const char *fns[] = {"GetWeather", "GetNews", "GetStocks", "GetSports"};
  for (int i = 0; i < 4; i++) {
    batch_out o = one(g, fns[i], "{}", "Error: API unavailable", false);
    cr_assert_eq(o.check, AG_ALLOW);
    if (i < 3)
      cr_assert_eq(o.record, AG_ALLOW);
    else {
      cr_assert_eq(o.record, AG_STOP);
      cr_assert_eq(o.v.reason, AG_REASON_CONSECUTIVE_ERRORS);
    }
  }
  ag_guard_free(g);
}

Test(seed001, legitimate_fallback_is_not_a_loop) {
  ag_guard *g = make("hpd");
  cr_assert_eq(one(g, "GetWeather",
                   "{\"city\":\"SF\",\"provider\":\"primary\"}", "503", true)
                   .record,
               AG_ALLOW);
  for (int i = 0; i < 2; i++)
    cr_assert_eq(one(g, "GetWeather",
                     "{\"provider\":\"fallback\",\"city\":\"SF\"}", "503", true)
                     .record,
                 AG_ALLOW);
  batch_out o =
      one(g, "GetWeather", "{\"city\":\"SF\",\"provider\":\"fallback\"}",
          "sunny", false);
  cr_assert_eq(o.check, AG_ALLOW);
  cr_assert_eq(o.record, AG_ALLOW);
  cr_assert_eq(tool_run(g, "GetWeather"), 3);
  ag_guard_free(g);
}

Test(seed001, retry_success_resets_error_count) {
  /* retries happen before the guard: a call whose retry succeeded is a
   * success */
  ag_guard *g = make("hpd");
  for (int i = 0; i < 3; i++)
    one(g, "Api", "{\"i\":1}", "Error after 4 attempts: 503", false);
  cr_assert_eq(one(g, "Api", "{\"i\":2}", "200 OK", false).record, AG_ALLOW);
  for (int i = 0; i < 3; i++)
    cr_assert_eq(one(g, "Api", "{\"i\":3}", "failed", true).record, AG_ALLOW);
  ag_guard_free(g);
}

Test(seed001, turn_timeout) {
  ag_guard *g = make("hpd");
  ag_guard_begin_turn(g, 1000);
  cr_assert_eq(ag_guard_deadline(g), 1000 + 5 * 60 * 1000);
  ag_verdict v;
  cr_assert_eq(ag_guard_begin_iteration(g, 1000 + 299999, &v), AG_ALLOW);
  cr_assert_eq(ag_guard_begin_iteration(g, 1000 + 300000, &v), AG_STOP);
  cr_assert_eq(v.reason, AG_REASON_TURN_TIMEOUT);
  cr_assert(strstr(v.message, "5m") != NULL, "%s", v.message);
  ag_call c = {"x", "{}", 2};
  ag_call_check ck;
  cr_assert_eq(ag_guard_check_calls(g, &c, 1, 1000 + 400000, &ck, &v), AG_STOP);
  cr_assert_eq(v.reason, AG_REASON_TURN_TIMEOUT);
  ag_guard_free(g);
}

Test(seed001, development_preset_is_more_aggressive) {
  ag_guard *g = make("development");
  cr_assert_eq(one(g, "R", "{}", "ok", false).check, AG_ALLOW);
  cr_assert_eq(one(g, "R", "{}", "ok", false).check, AG_ALLOW);
  batch_out o = one(g, "R", "{}", "ok", false);
  cr_assert_eq(o.check, AG_STOP);
  cr_assert_eq(o.v.reason, AG_REASON_IDENTICAL_CALLS);
  ag_guard_free(g);
}

/* ---- seed 002: Forge error recovery (preset forge) ----------------------- */

Test(seed002, five_identical_errors_trip) {
  ag_guard *g = make("forge");
  for (int i = 1; i <= 4; i++) {
    char args[32];
    snprintf(args, sizeof(args), "{\"i\":%d}", i); /* different calls */
    cr_assert_eq(one(g, "calc", args, "division by zero", true).record,
                 AG_ALLOW);
  }
  batch_out o = one(g, "calc", "{\"i\":5}", "division  by\nzero ", true);
  cr_assert_eq(o.record, AG_STOP);
  cr_assert_eq(o.v.reason, AG_REASON_IDENTICAL_ERRORS);
  cr_assert_str_eq(o.v.tool, "calc");
  ag_guard_free(g);
}

Test(seed002, requires_all_five_slots) {
  ag_guard *g = make("forge");
  for (int i = 1; i <= 4; i++)
    cr_assert_eq(one(g, "calc", "{}", "boom", true).record, AG_ALLOW);
  ag_guard_free(g);
}

Test(seed002, different_error_breaks_the_run) {
  ag_guard *g = make("forge");
  for (int i = 0; i < 4; i++)
    one(g, "calc", "{}", "boom", true);
  cr_assert_eq(one(g, "calc", "{}", "bang", true).record, AG_ALLOW);
  for (int i = 0; i < 3; i++)
    cr_assert_eq(one(g, "calc", "{}", "boom", true).record, AG_ALLOW);
  ag_guard_free(g);
}

Test(seed002, success_resets) {
  ag_guard *g = make("forge");
  for (int i = 0; i < 4; i++)
    one(g, "calc", "{}", "boom", true);
  cr_assert_eq(one(g, "other", "{}", "fine", false).record, AG_ALLOW);
  for (int i = 0; i < 4; i++)
    cr_assert_eq(one(g, "calc", "{}", "boom", true).record, AG_ALLOW);
  ag_guard_free(g);
}

Test(seed002, same_message_other_tool_is_different) {
  ag_guard *g = make("forge");
  const char *tools[] = {"a", "b", "a", "b", "a", "b"};
  for (int i = 0; i < 6; i++)
    cr_assert_eq(one(g, tools[i], "{}", "boom", true).record, AG_ALLOW);
  ag_guard_free(g);
}

Test(seed002, error_context_forge_texts) {
  ag_guard *g = make("forge");
  one(g, "calculator", "{\"a\":100,\"b\":0}", "division by zero", true);
  char buf[2048];
  size_t n = ag_guard_error_context(g, AG_RECOVER_EXECUTION, NULL, 0, buf,
                                    sizeof(buf));
  cr_assert(n > 0 && n < sizeof(buf));
  cr_assert(strncmp(buf,
                    "The previous iteration failed with the following "
                    "error:\n\n<error>\ntool: calculator\n",
                    70) == 0,
            "%s", buf);
  cr_assert(strstr(buf, "\n\nPlease analyze what went wrong and try a "
                        "different approach. The error was: division by "
                        "zero") != NULL,
            "%s", buf);
  const char *tools[] = {"calculator", "ask_question"};
  ag_guard_error_context(g, AG_RECOVER_UNKNOWN_TOOL, tools, 2, buf,
                         sizeof(buf));
  cr_assert(strstr(buf, "try a different approach. Use one of the available "
                        "tools: [calculator, ask_question]") != NULL,
            "%s", buf);
  ag_guard_error_context(g, AG_RECOVER_INVALID_JSON, NULL, 0, buf, sizeof(buf));
  cr_assert(strstr(buf, "Ensure your tool call JSON is properly formatted.") !=
            NULL);
  /* a success of the tool resolves its error: no context any more */
  one(g, "calculator", "{\"a\":1,\"b\":1}", "1", false);
  cr_assert_eq(ag_guard_error_context(g, AG_RECOVER_EXECUTION, NULL, 0, buf,
                                      sizeof(buf)),
               0);
  /* no tool call: always has a context */
  n = ag_guard_error_context(g, AG_RECOVER_NO_TOOL_CALL, NULL, 0, buf,
                             sizeof(buf));
  cr_assert(n > 0);
  cr_assert(strstr(buf, "You must provide a tool call in your response.") !=
            NULL);
  ag_guard_free(g);
}

/* ---- seed 003: compact errors, budgets, escalation (twelve-factor) ------- */

Test(seed003, tool_error_budget_escalates) {
  ag_guard *g = make("twelve-factor");
  cr_assert_eq(
      one(g, "deploy", "{\"v\":1}", "timeout talking to cluster", true).record,
      AG_ALLOW);
  cr_assert_eq(one(g, "deploy", "{\"v\":2}", "auth failed: 401", true).record,
               AG_ALLOW);
  batch_out o = one(g, "deploy", "{\"v\":3}", "validation: bad manifest", true);
  cr_assert_eq(o.record, AG_ESCALATE);
  cr_assert_eq(o.v.reason, AG_REASON_TOOL_ERROR_BUDGET);
  char *rec = NULL;
  cr_assert_eq(ag_guard_escalation_record(g, &o.v, &rec, NULL), AG_OK);
  json_t *j = json_loads(rec, 0, NULL);
  cr_assert_not_null(j, "%s", rec);
  cr_assert_str_eq(json_string_value(json_object_get(j, "status")),
                   "escalated");
  cr_assert_str_eq(json_string_value(json_object_get(j, "reason")),
                   "Too many errors with deploy");
  cr_assert_str_eq(json_string_value(json_object_get(j, "last_error")),
                   "validation: bad manifest");
  json_t *h = json_object_get(j, "error_history");
  cr_assert_eq(json_array_size(h), 3);
  cr_assert(strncmp(json_string_value(json_array_get(h, 0)),
                    "<error>\ntool: deploy\ntype: timeout\nmessage: timeout",
                    48) == 0,
            "%s", json_string_value(json_array_get(h, 0)));
  json_decref(j);
  ag_free(rec);
  /* continue: only that mechanism's counters reset */
  ag_guard_resume(g, AG_REASON_TOOL_ERROR_BUDGET);
  cr_assert_eq(one(g, "deploy", "{\"v\":4}", "boom", true).record, AG_ALLOW);
  ag_guard_free(g);
}

Test(seed003, success_resets_per_tool_count) {
  ag_guard *g = make("twelve-factor");
  one(g, "deploy", "{\"v\":1}", "x", true);
  one(g, "deploy", "{\"v\":2}", "x", true);
  one(g, "deploy", "{\"v\":3}", "done", false);
  cr_assert_eq(one(g, "deploy", "{\"v\":4}", "x", true).record, AG_ALLOW);
  cr_assert_eq(one(g, "deploy", "{\"v\":5}", "x", true).record, AG_ALLOW);
  ag_guard_free(g);
}

Test(seed003, total_error_budget) {
  ag_guard *g = make("twelve-factor");
  const char *tools[] = {"a", "b", "c"};
  for (int i = 1; i <= 10; i++) {
    char args[16];
    snprintf(args, sizeof(args), "{\"i\":%d}", i);
    one(g, "ok_tool", args, "fine", false); /* successes in between */
    char tool[16];
    snprintf(tool, sizeof(tool), "%s%d", tools[i % 3], i); /* no tool fails
                                                               twice */
    batch_out o = one(g, tool, args, "err", true);
    if (i < 10)
      cr_assert_eq(o.record, AG_ALLOW, "error %d", i);
    else {
      cr_assert_eq(o.record, AG_ESCALATE);
      cr_assert_eq(o.v.reason, AG_REASON_TOTAL_ERROR_BUDGET);
    }
  }
  ag_guard_free(g);
}

Test(seed003, context_compaction_hides_old_and_resolved) {
  ag_guard *g = make_json("{\"preset\":\"twelve-factor\",\"errors\":"
                          "{\"max_tool_errors\":0,\"max_total_errors\":0}}");
  one(g, "fetch", "{\"i\":1}", "not found: a", true);
  one(g, "parse", "{\"i\":1}", "invalid input 1", true);
  one(g, "parse", "{\"i\":2}", "invalid input 2", true);
  one(g, "parse", "{\"i\":3}", "invalid input 3", true);
  one(g, "store", "{\"i\":1}", "permission denied", true);
  char buf[4096];
  ag_guard_error_context(g, AG_RECOVER_EXECUTION, NULL, 0, buf, sizeof(buf));
  cr_assert(strstr(buf, "<error_summary>\n2 older errors hidden\n"
                        "</error_summary>\n\n<error>\ntool: parse") != NULL,
            "%s", buf);
  cr_assert(strstr(buf, "invalid input 1") == NULL);
  cr_assert(strstr(buf, "permission denied") != NULL);
  /* parse succeeds: its three errors (one shown... two shown, one hidden)
   * are resolved */
  one(g, "parse", "{\"i\":4}", "parsed", false);
  ag_guard_error_context(g, AG_RECOVER_EXECUTION, NULL, 0, buf, sizeof(buf));
  cr_assert(strstr(buf, "parse") == NULL, "%s", buf);
  cr_assert(strstr(buf, "<error>\ntool: store") != NULL, "%s", buf);
  cr_assert(strstr(buf, "<error_summary>\n1 older errors hidden") != NULL,
            "the fetch error is still unresolved but no longer held: %s", buf);
  ag_guard_free(g);
}

Test(seed003, compact_message_cut_on_utf8_boundary) {
  ag_guard *g = make("twelve-factor");
  char msg[600];
  size_t k = 0;
  while (k + 3 < sizeof(msg) - 1) { /* U+20AC EURO SIGN, 3 bytes */
    msg[k++] = (char)0xe2;
    msg[k++] = (char)0x82;
    msg[k++] = (char)0xac;
  }
  msg[k] = '\0';
  one(g, "t", "{}", msg, true);
  char buf[4096];
  ag_guard_error_context(g, AG_RECOVER_EXECUTION, NULL, 0, buf, sizeof(buf));
  const char *m = strstr(buf, "message: ");
  cr_assert_not_null(m);
  m += 9;
  const char *end = strchr(m, '\n');
  size_t len = (size_t)(end - m);
  cr_assert(len >= 3 && strncmp(end - 3, "...", 3) == 0, "%.*s", (int)len, m);
  cr_assert_eq((len - 3) % 3, 0, "cut inside a character");
  cr_assert(len - 3 <= 200);
  ag_guard_free(g);
}

/* ---- seed 004: Monadic (preset monadic) ---------------------------------- */

Test(seed004, error_pattern_three_similar) {
  ag_guard *g = make("monadic");
  cr_assert_eq(one(g, "run", "{\"i\":1}",
                   "ModuleNotFoundError: No module named 'numpy'", true)
                   .record,
               AG_ALLOW);
  cr_assert_eq(one(g, "run", "{\"i\":2}", "all good", false).record, AG_ALLOW);
  cr_assert_eq(one(g, "run", "{\"i\":3}",
                   "ModuleNotFoundError: No module named 'pandas'", true)
                   .record,
               AG_ALLOW);
  batch_out o = one(g, "run2", "{\"i\":4}",
                    "ImportError: No module named matplotlib", true);
  cr_assert_eq(o.record, AG_STOP);
  cr_assert_eq(o.v.reason, AG_REASON_ERROR_PATTERN);
  cr_assert(strstr(o.v.message, "missing_module") != NULL, "%s", o.v.message);
  ag_guard_free(g);
}

Test(seed004, unknown_category_never_trips_and_breaks) {
  ag_guard *g = make("monadic");
  one(g, "run", "{\"i\":1}", "No module named 'a'", true);
  one(g, "run", "{\"i\":2}", "No module named 'b'", true);
  cr_assert_eq(one(g, "run", "{\"i\":3}", "it went sideways", true).record,
               AG_ALLOW);
  cr_assert_eq(one(g, "run", "{\"i\":4}", "No module named 'c'", true).record,
               AG_ALLOW);
  for (int i = 0; i < 5; i++) {
    char a[16];
    snprintf(a, sizeof(a), "{\"u\":%d}", i);
    cr_assert_eq(one(g, "run", a, "it went sideways", true).record, AG_ALLOW);
  }
  ag_guard_free(g);
}

Test(seed004, per_turn_call_cap_and_reset) {
  ag_guard *g = make("monadic");
  for (int i = 0; i < 20; i++) {
    char a[16];
    snprintf(a, sizeof(a), "{\"i\":%d}", i);
    cr_assert_eq(one(g, "gen", a, "ok", false).check, AG_ALLOW, "call %d",
                 i + 1);
  }
  batch_out o = one(g, "gen", "{\"i\":21}", "ok", false);
  cr_assert_eq(o.check, AG_STOP);
  cr_assert_eq(o.v.reason, AG_REASON_MAX_CALLS_PER_TURN);
  ag_guard_begin_turn(g, 0); /* each user message resets */
  cr_assert_eq(one(g, "gen", "{\"i\":21}", "ok", false).check, AG_ALLOW);
  ag_guard_free(g);
}

Test(seed004, cap_inside_one_batch_blocks_whole_batch) {
  ag_guard *g = make_json("{\"preset\":\"none\",\"loop\":"
                          "{\"max_calls_per_turn\":2}}");
  step s[] = {{"a", "{}", "ok", false},
              {"b", "{}", "ok", false},
              {"c", "{}", "ok", false}};
  batch_out o = iterate(g, s, 3, 0);
  cr_assert_eq(o.check, AG_STOP);
  cr_assert_eq(o.v.call_index, 2);
  cr_assert_eq(o.record, AG_ALLOW, "nothing of the batch was recorded");
  ag_guard_free(g);
}

/* ---- meai: iteration cap ------------------------------------------------- */

Test(meai, iteration_cap_at_41) {
  ag_guard *g = make("meai");
  ag_verdict v;
  for (int i = 0; i < 40; i++)
    cr_assert_eq(ag_guard_begin_iteration(g, 0, &v), AG_ALLOW);
  cr_assert_eq(ag_guard_begin_iteration(g, 0, &v), AG_STOP);
  cr_assert_eq(v.reason, AG_REASON_MAX_ITERATIONS);
  cr_assert(ag_guard_config(g)->loop.final_request_without_tools);
  ag_guard_free(g);
}

/* ---- cycle detector (default preset) ------------------------------------- */

Test(cycle, abab_trips_at_tenth_call) {
  ag_guard *g = make("default");
  for (int i = 1; i <= 9; i++) {
    const char *name = i % 2 ? "A" : "B";
    cr_assert_eq(one(g, name, "{}", "ok", false).check, AG_ALLOW, "call %d", i);
  }
  batch_out o = one(g, "B", "{}", "ok", false);
  cr_assert_eq(o.check, AG_STOP);
  cr_assert_eq(o.v.reason, AG_REASON_CYCLIC_CALLS);
  cr_assert(strstr(o.v.message, "2 calls") != NULL, "%s", o.v.message);
  ag_guard_free(g);
}

Test(cycle, abc_across_batches) {
  /* batches [A,B] and [C] alternate: the call sequence is A B C A B C ...;
   * each call repeats two iterations apart, so this is the cycle detector's
   * catch, at the 15th call */
  ag_guard *g = make("default");
  step ab[] = {{"A", "{\"x\":1}", "ok", false},
               {"B", "{\"y\":[1,2]}", "ok", false}};
  step c[] = {{"C", "{}", "ok", false}};
  for (int i = 0; i < 4; i++) {
    cr_assert_eq(iterate(g, ab, 2, 0).check, AG_ALLOW);
    cr_assert_eq(iterate(g, c, 1, 0).check, AG_ALLOW);
  }
  cr_assert_eq(iterate(g, ab, 2, 0).check, AG_ALLOW);
  batch_out o = iterate(g, c, 1, 0);
  cr_assert_eq(o.check, AG_STOP);
  cr_assert_eq(o.v.reason, AG_REASON_CYCLIC_CALLS, "reason %s",
               ag_reason_name(o.v.reason));
  cr_assert(strstr(o.v.message, "3 calls") != NULL, "%s", o.v.message);
  ag_guard_free(g);
}

Test(cycle, identical_parallel_batches_trip_the_breaker_first) {
  /* the same batch [A,B,C] every iteration: A repeats in consecutive
   * iterations, so the identical-call breaker trips at the 5th batch, before
   * the 15-call cycle completes */
  ag_guard *g = make("default");
  step s[] = {{"A", "{\"x\":1}", "ok", false},
              {"B", "{\"y\":[1,2]}", "ok", false},
              {"C", "{}", "ok", false}};
  for (int i = 0; i < 4; i++)
    cr_assert_eq(iterate(g, s, 3, 0).check, AG_ALLOW);
  batch_out o = iterate(g, s, 3, 0);
  cr_assert_eq(o.check, AG_STOP);
  cr_assert_eq(o.v.reason, AG_REASON_IDENTICAL_CALLS);
  cr_assert_eq(o.v.call_index, 0);
  ag_guard_free(g);
}

Test(cycle, edit_test_with_changing_edits_is_work) {
  ag_guard *g = make_json("{\"loop\":{\"max_iterations\":0}}");
  for (int i = 0; i < 30; i++) {
    char a[64];
    snprintf(a, sizeof(a), "{\"file\":\"x.c\",\"patch\":\"v%d\"}", i);
    cr_assert_eq(one(g, "edit", a, "ok", false).check, AG_ALLOW);
    cr_assert_eq(one(g, "run_tests", "{}", "1 failed", false).check, AG_ALLOW,
                 "round %d", i);
  }
  ag_guard_free(g);
}

Test(cycle, identical_calls_are_not_a_cycle) {
  ag_guard *g = make_json("{\"loop\":{\"identical_call_limit\":0}}");
  for (int i = 0; i < 30; i++)
    cr_assert_eq(one(g, "A", "{}", "ok", false).check, AG_ALLOW);
  ag_guard_free(g);
}

/* ---- nudges, progress-aware mode, escalation ---------------------------- */

Test(nudge, two_strikes) {
  ag_guard *g = make_json("{\"loop\":{\"nudge_before_stop\":true}}");
  for (int i = 0; i < 4; i++)
    one(g, "R", "{\"p\":1}", "same", false);
  step s[] = {{"R", "{\"p\":1}", "same", false}, {"W", "{}", "ok", false}};
  batch_out o = iterate(g, s, 2, 0);
  cr_assert_eq(o.check, AG_ALLOW);
  cr_assert_eq(o.checks[0].action, AG_NUDGE);
  cr_assert_eq(o.checks[1].action, AG_ALLOW);
  cr_assert(strncmp(o.checks[0].message, "Potential loop detected: ", 25) == 0,
            "%s", o.checks[0].message);
  o = one(g, "R", "{\"p\":1}", "same", false);
  cr_assert_eq(o.check, AG_STOP);
  cr_assert_eq(o.v.reason, AG_REASON_IDENTICAL_CALLS);
  ag_guard_free(g);
}

Test(progress, polling_with_changing_status_is_not_a_loop) {
  ag_guard *g = make_json("{\"loop\":{\"identical_call_scope\":"
                          "\"call_and_result\"}}");
  for (int i = 0; i < 12; i++) {
    char r[32];
    snprintf(r, sizeof(r), "running: %d%%", i * 8);
    batch_out o = one(g, "job_status", "{\"id\":7}", r, false);
    cr_assert_eq(o.check, AG_ALLOW);
    cr_assert_eq(o.record, AG_ALLOW, "poll %d", i);
  }
  for (int i = 1; i <= 4; i++)
    cr_assert_eq(one(g, "job_status", "{\"id\":7}", "stuck", false).record,
                 AG_ALLOW);
  batch_out o = one(g, "job_status", "{\"id\":7}", "stuck", false);
  cr_assert_eq(o.check, AG_ALLOW, "the call that trips has run");
  cr_assert_eq(o.record, AG_STOP);
  cr_assert_eq(o.v.reason, AG_REASON_IDENTICAL_CALLS);
  ag_guard_free(g);
}

Test(escalate, loop_trip_escalates_and_resumes) {
  ag_guard *g = make_json("{\"errors\":{\"on_trip\":\"escalate\"}}");
  for (int i = 0; i < 4; i++)
    one(g, "R", "{}", "x", false);
  batch_out o = one(g, "R", "{}", "x", false);
  cr_assert_eq(o.check, AG_ESCALATE);
  char *rec = NULL;
  cr_assert_eq(ag_guard_escalation_record(g, &o.v, &rec, NULL), AG_OK);
  cr_assert(strstr(rec, "\"reason\":\"Repeated calls to R\"") != NULL, "%s",
            rec);
  ag_free(rec);
  ag_guard_resume(g, AG_REASON_IDENTICAL_CALLS);
  for (int i = 0; i < 4; i++)
    cr_assert_eq(one(g, "R", "{}", "x", false).check, AG_ALLOW);
  ag_guard_free(g);
}

/* ---- signatures and edge cases ------------------------------------------ */

Test(edge, reordered_keys_and_number_forms_are_identical) {
  ag_guard *g = make("hpd");
  const char *forms[] = {"{\"a\":1,\"b\":[1.0,\"x\"]}",
                         "{\"b\":[1e0,\"x\"],\"a\":1.0}",
                         " { \"b\" : [ 10e-1 , \"\\u0078\" ] , \"a\" : 1 } ",
                         "{\"a\":1,\"b\":[1,\"x\"]}"};
  for (int i = 0; i < 4; i++)
    cr_assert_eq(one(g, "T", forms[i], "ok", false).check, AG_ALLOW);
  batch_out o = one(g, "T", "{\"b\":[1,\"x\"],\"a\":1}", "ok", false);
  cr_assert_eq(o.check, AG_STOP, "all five forms must share one signature");
  ag_guard_free(g);
}

Test(edge, invalid_json_is_an_invalid_call) {
  ag_guard *g = make("hpd");
  const char *bad[] = {"{\"a\":", "{\"a\":1,}", "{'a':1}", "{\"a\":1}x",
                       "{\"a\":1,\"a\":2}"};
  for (int i = 0; i < 5; i++) {
    ag_call c = {"T", bad[i], strlen(bad[i])};
    ag_call_check ck;
    ag_verdict v;
    ag_guard_begin_iteration(g, 0, &v);
    cr_assert_eq(ag_guard_check_calls(g, &c, 1, 0, &ck, &v), AG_ALLOW);
    cr_assert(!ck.valid, "%s accepted", bad[i]);
    cr_assert(ck.invalid_pos >= 0, "%s: no position", bad[i]);
    cr_assert(strstr(ck.message, "invalid arguments") != NULL);
  }
  ag_call c = {"T", "{\"a\":1,\"a\":2}", 13};
  ag_call_check ck;
  ag_verdict v;
  ag_guard_check_calls(g, &c, 1, 0, &ck, &v);
  cr_assert_eq(ck.invalid_code, AG_EDUPKEY);
  ag_guard_free(g);
}

Test(edge, invalid_calls_break_identical_runs) {
  ag_guard *g = make("hpd");
  for (int i = 0; i < 4; i++)
    one(g, "T", "{}", "ok", false);
  one(g, "T", "{", "x", false);
  for (int i = 0; i < 4; i++)
    cr_assert_eq(one(g, "T", "{}", "ok", false).check, AG_ALLOW);
  ag_guard_free(g);
}

Test(edge, huge_arguments) {
  ag_guard *g = make("hpd");
  size_t big = (1u << 20) + 100;
  char *a = malloc(big + 1);
  memset(a, 'x', big);
  memcpy(a, "{\"s\":\"", 6);
  memcpy(a + big - 2, "\"}", 2);
  a[big] = '\0';
  ag_call c = {"T", a, big};
  ag_call_check ck;
  ag_verdict v;
  cr_assert_eq(ag_guard_check_calls(g, &c, 1, 0, &ck, &v), AG_ALLOW);
  cr_assert(!ck.valid);
  cr_assert_eq(ck.invalid_code, AG_ETOOBIG);
  /* just under the cap is fine */
  size_t ok = (1u << 20) - 16;
  memcpy(a + ok - 2, "\"}", 2);
  c.args_len = ok;
  ag_guard_check_calls(g, &c, 1, 0, &ck, &v);
  cr_assert(ck.valid, "%s", ck.message);
  free(a);
  ag_guard_free(g);
}

Test(edge, batch_over_cap_marks_rest_invalid) {
  ag_config cfg;
  ag_config_preset(&cfg, "none", NULL);
  ag_guard_opts o;
  ag_guard_opts_init(&o);
  o.max_batch = 2;
  ag_guard *g = NULL;
  cr_assert_eq(ag_guard_new(&g, &cfg, &o, NULL), AG_OK);
  ag_call c[3] = {{"a", "{}", 2}, {"b", "{}", 2}, {"c", "{}", 2}};
  ag_call_check ck[3];
  ag_verdict v;
  cr_assert_eq(ag_guard_check_calls(g, c, 3, 0, ck, &v), AG_ALLOW);
  cr_assert(ck[0].valid && ck[1].valid && !ck[2].valid);
  cr_assert_eq(ck[2].invalid_code, AG_ETOOBIG);
  ag_guard_free(g);
}

Test(edge, new_turn_resets_every_counter) {
  ag_guard *g = make("default");
  json_t *fresh = dump(g);
  for (int i = 0; i < 4; i++)
    one(g, "R", "{}", "Error: x", false);
  one(g, "A", "{}", "ok", false);
  one(g, "A", "{}", "ok", false);
  one(g, "B", "{}", "boom", true);
  ag_guard_begin_turn(g, 0);
  json_t *after = dump(g);
  json_object_set_new(after, "turn", json_integer(1)); /* turn number moves */
  char *a = json_dumps(fresh, JSON_SORT_KEYS),
       *b = json_dumps(after, JSON_SORT_KEYS);
  cr_assert_str_eq(b, a);
  free(a);
  free(b);
  json_decref(fresh);
  json_decref(after);
  /* 4 + 2 identical errors would trip 5, and 2 more failures of R would
   * trip 16, were anything carried over */
  for (int i = 0; i < 2; i++)
    cr_assert_eq(one(g, "R", "{}", "Error: x", false).record, AG_ALLOW);
  ag_guard_free(g);
}

Test(edge, million_calls_in_constant_memory) {
  ag_guard *g = make("default");
  ag_config cfg = *ag_guard_config(g);
  (void)cfg;
  ag_verdict v;
  ag_call_check ck;
  char args[64];
  size_t heap_at_1k = 0;
  for (int i = 0; i < 1000000; i++) {
    if (i % 40 == 0)
      ag_guard_begin_turn(g, 0);
    snprintf(args, sizeof(args), "{\"path\":\"f%d\",\"n\":%d}", i % 977, i);
    ag_call c = {i % 3 ? "read" : "write", args, strlen(args)};
    ag_guard_begin_iteration(g, 0, &v);
    ag_guard_check_calls(g, &c, 1, 0, &ck, &v);
    ag_result r = {c.name, ck.sig, i % 7 ? AG_OUTCOME_OK : AG_OUTCOME_ERROR,
                   "text", 4,      AG_CAT__COUNT};
    ag_guard_record_results(g, &r, 1, 0, &v);
    if (i == 1000)
      heap_at_1k = mallinfo2().uordblks;
  }
  size_t heap_at_1m = mallinfo2().uordblks;
  cr_assert(heap_at_1m <= heap_at_1k + 4096, "heap grew from %zu to %zu",
            heap_at_1k, heap_at_1m);
  ag_guard_free(g);
}

Test(edge, tool_table_eviction_is_bounded) {
  ag_guard *g = make("default");
  for (int i = 0; i < 500; i++) {
    char name[32];
    snprintf(name, sizeof(name), "tool_%d", i);
    cr_assert_eq(one(g, name, "{}", "ok", false).check, AG_ALLOW);
    if (i % 30 == 0)
      ag_guard_begin_turn(g, 0);
  }
  json_t *j = dump(g);
  cr_assert(json_integer_value(json_object_get(j, "tools_tracked")) <= 64);
  json_decref(j);
  ag_guard_free(g);
}

Test(edge, dump_is_complete_json) {
  ag_guard *g = make("default");
  one(g, "A", "{\"x\":1}", "boom", true);
  json_t *j = dump(g);
  const char *keys[] = {"preset",        "turn",   "iteration",
                        "calls_in_turn", "tools",  "cycle",
                        "errors",        "nudged", "last_trip"};
  for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
    cr_assert_not_null(json_object_get(j, keys[i]), "missing %s", keys[i]);
  json_t *e = json_object_get(j, "errors");
  cr_assert_eq(json_array_size(json_object_get(e, "history")), 1);
  cr_assert_eq(json_integer_value(json_object_get(e, "total")), 1);
  json_decref(j);
  ag_guard_free(g);
}

Test(edge, none_preset_never_stops) {
  ag_guard *g = make("none");
  for (int i = 0; i < 200; i++) {
    batch_out o = one(g, "R", "{}", "Error: same", true);
    cr_assert_eq(o.check, AG_ALLOW);
    cr_assert_eq(o.record, AG_ALLOW);
  }
  ag_guard_free(g);
}

Test(edge, invalid_config_is_refused) {
  ag_config cfg;
  ag_config_init(&cfg);
  cfg.loop.cycle_max_length = 99;
  ag_guard *g = (ag_guard *)1;
  ag_error_t err;
  cr_assert_eq(ag_guard_new(&g, &cfg, NULL, &err), AG_ECONFIG);
  cr_assert_null(g);
  cr_assert(strstr(err.msg, "loop.cycle_max_length") != NULL, "%s", err.msg);
}

/* ---- ag_guard_run_batch: the shared path of the loop and audit ----------- */

typedef struct replay {
  const char *text;
  ag_outcome outcome;
  int calls_run;
} replay;

static ag_action iteration(ag_guard *g, const ag_call *calls, size_t n,
                           replay *r, ag_call_check *ck, ag_result *res,
                           ag_verdict *v, bool *ran);

static int64_t run_recorded(void *user, const ag_call *calls,
                            const ag_call_check *checks, size_t n,
                            ag_result *results) {
  replay *r = user;
  (void)calls;
  for (size_t i = 0; i < n; i++) {
    if (checks[i].action != AG_ALLOW || !checks[i].valid)
      continue;
    results[i].outcome = r->outcome;
    results[i].text = r->text;
    results[i].text_len = strlen(r->text);
    r->calls_run++;
  }
  return 7;
}

static ag_action iteration(ag_guard *g, const ag_call *calls, size_t n,
                           replay *r, ag_call_check *ck, ag_result *res,
                           ag_verdict *v, bool *ran) {
  *ran = false;
  ag_action a = ag_guard_begin_iteration(g, 0, v);
  if (a != AG_ALLOW)
    return a;
  return ag_guard_run_batch(g, calls, n, 0, run_recorded, r, ck, res, v, ran);
}

Test(iteration, same_stop_as_the_step_by_step_calls) {
  ag_guard *g = make("hpd");
  replay r = {"Error: File not found", AG_OUTCOME_OK, 0};
  ag_call c = {"ReadFile", "{\"path\":\"missing.txt\"}", 22};
  ag_call_check ck;
  ag_result res;
  ag_verdict v;
  bool ran;
  for (int i = 0; i < 3; i++)
    cr_assert_eq(iteration(g, &c, 1, &r, &ck, &res, &v, &ran), AG_ALLOW);
  cr_assert_eq(iteration(g, &c, 1, &r, &ck, &res, &v, &ran), AG_STOP);
  cr_assert(ran);
  cr_assert_eq(v.reason, AG_REASON_CONSECUTIVE_ERRORS);
  cr_assert_eq(r.calls_run, 4);
  ag_guard_free(g);
}

Test(iteration, stopped_batch_never_runs_and_invalid_calls_are_errors) {
  ag_guard *g = make("hpd");
  replay r = {"fine", AG_OUTCOME_OK, 0};
  ag_call c[2] = {{"T", "{}", 2}, {"T", "{oops", 5}};
  ag_call_check ck[2];
  ag_result res[2];
  ag_verdict v;
  bool ran;
  cr_assert_eq(iteration(g, c, 2, &r, ck, res, &v, &ran), AG_ALLOW);
  cr_assert_eq(r.calls_run, 1);
  cr_assert_eq(res[1].outcome, AG_OUTCOME_ERROR);
  cr_assert_eq(res[1].category, AG_CAT_VALIDATION);
  /* the invalid call ended T's run: four more calls of T({}) pass */
  for (int i = 0; i < 4; i++)
    cr_assert_eq(iteration(g, c, 1, &r, ck, res, &v, &ran), AG_ALLOW);
  cr_assert_eq(iteration(g, c, 1, &r, ck, res, &v, &ran), AG_STOP);
  cr_assert(!ran, "a stopped batch must not run");
  cr_assert_eq(v.reason, AG_REASON_IDENTICAL_CALLS);
  ag_guard_free(g);
}

/* Whether s[0..n) is valid UTF-8 (a cut that split no character). */
static bool whole_utf8(const char *s, size_t n) {
  json_t *j = json_stringn(s, n); /* jansson refuses invalid UTF-8 */
  json_decref(j);
  return j != NULL;
}

/* Like snprintf: every buffer size gets the full length back and a prefix of
 * the full text, cut on a character boundary (never half of "é"). */
Test(context, small_buffers_get_a_prefix_cut_on_a_character) {
  ag_guard *g = make("default");
  one(g, "fetch", "{\"i\":1}", "é\xC3\xA9\xC3\xA9 not found \xC3\xA9\xC3\xA9",
      true);
  char full[4096];
  size_t n = ag_guard_error_context(g, AG_RECOVER_EXECUTION, NULL, 0, full,
                                    sizeof(full));
  cr_assert_lt(n, sizeof(full));
  cr_assert_eq(strlen(full), n);
  for (size_t cap = 0; cap <= n + 1; cap++) {
    char small[4096];
    memset(small, 'x', sizeof(small));
    size_t m = ag_guard_error_context(g, AG_RECOVER_EXECUTION, NULL, 0,
                                      cap > 0 ? small : NULL, cap);
    cr_assert_eq(m, n, "cap %zu: %zu", cap, m);
    if (cap == 0)
      continue;
    size_t k = strlen(small);
    cr_assert_lt(k, cap);
    cr_assert(k + 4 > cap || k == n, "cap %zu: only %zu bytes kept", cap, k);
    cr_assert(memcmp(small, full, k) == 0, "cap %zu: not a prefix", cap);
    cr_assert(whole_utf8(small, k), "cap %zu: a character was split", cap);
  }
  ag_guard_free(g);
}

/* ---- a guard renewed for reuse (the proxy's pool) ----------------------- */

/* A turn that leaves something in every table: errors (identical, per
 * tool, a pattern), a cycle, repeated pairs, successes, a nudge, a held
 * call, tokens, refused and empty replies, and a content-loop text. Each
 * step's verdicts are written to `out` (one line per step). */
static void busy_turn(ag_guard *g, char *out, size_t cap) {
  size_t len = 0;
  static const step steps[] = {
      {"read_file", "{\"path\":\"a.c\"}", "int main(void) {}", false},
      {"run_tests", "{}", "FAILED test_a: assertion failed", true},
      {"edit_file", "{\"path\":\"a.c\",\"text\":\"x\"}", "ok", false},
      {"run_tests", "{}", "FAILED test_a: assertion failed", true},
      {"search", "{\"q\":\"foo\"}", "no results", false},
      {"fetch", "{\"url\":\"http://x/1\"}", "HTTP 503 Service Unavailable",
       true},
      {"search", "{\"q\":\"foo\"}", "no results", false},
      {"fetch", "{\"url\":\"http://x/1\"}", "HTTP 503 Service Unavailable",
       true},
      {"search", "{\"q\":\"foo\"}", "no results", false},
      {"fetch", "{\"url\":\"http://x/1\"}", "HTTP 503 Service Unavailable",
       true},
      {"search", "{\"q\":\"foo\"}", "no results", false},
      {"fetch", "{\"url\":\"http://x/1\"}", "HTTP 503 Service Unavailable",
       true},
      {"search", "{\"q\":\"foo\"}", "no results", false},
      {"fetch", "{\"url\":\"http://x/1\"}", "HTTP 503 Service Unavailable",
       true},
  };
  ag_verdict v;
  ag_guard_record_tokens(g, 1234);
  for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
    batch_out o = iterate(g, &steps[i], 1, (int64_t)i);
    len +=
        (size_t)snprintf(out + len, cap - len, "%zu %d %d %s %s\n", i, o.check,
                         o.record, ag_reason_name(o.v.reason), o.v.message);
    cr_assert_lt(len, cap);
    if (ag__stops(o.check) || ag__stops(o.record))
      break;
  }
  ag_action a =
      ag_guard_record_refused(g, "I cannot help with that.", 24, 100, &v);
  len += (size_t)snprintf(out + len, cap - len, "refused %d %s\n", a,
                          ag_reason_name(v.reason));
  a = ag_guard_record_empty(g, 101, &v);
  len += (size_t)snprintf(out + len, cap - len, "empty %d %s\n", a,
                          ag_reason_name(v.reason));
  char text[2048];
  size_t n = 0;
  for (int i = 0; i < 40; i++)
    n += (size_t)snprintf(text + n, sizeof text - n,
                          "The answer is in the file. ");
  a = ag_guard_check_text(g, text, n, false, &v);
  len +=
      (size_t)snprintf(out + len, cap - len, "text %d %s tokens %lld\n", a,
                       ag_reason_name(v.reason), (long long)ag_guard_tokens(g));
  cr_assert_lt(len, cap);
}

/* A renewed guard decides exactly as a new one: the same verdicts for the
 * same turn, and the same dump before and after it. */
Test(renew, decides_as_a_new_guard) {
  static const char *const presets[] = {"default", "development", "hpd",
                                        "forge"};
  for (size_t k = 0; k < sizeof presets / sizeof presets[0]; k++) {
    ag_guard *used = make(presets[k]);
    char first[8192], again[8192], fresh_out[8192];
    busy_turn(used, first, sizeof first);
    ag__guard_renew(used);
    ag_config cfg;
    ag_error_t err;
    cr_assert_eq(ag_config_preset(&cfg, presets[k], &err), AG_OK);
    ag_guard *fresh = NULL; /* as ag_guard_new leaves it: no turn begun */
    cr_assert_eq(ag_guard_new(&fresh, &cfg, NULL, &err), AG_OK);
    json_t *du = dump(used), *df = dump(fresh);
    cr_assert(json_equal(du, df), "%s: the renewed guard's dump differs",
              presets[k]);
    json_decref(du);
    json_decref(df);
    ag_guard_begin_turn(used, 0);
    ag_guard_begin_turn(fresh, 0);
    busy_turn(used, again, sizeof again);
    busy_turn(fresh, fresh_out, sizeof fresh_out);
    cr_assert_str_eq(again, fresh_out, "%s: a renewed guard decided otherwise",
                     presets[k]);
    cr_assert_str_eq(again, first, "%s", presets[k]);
    du = dump(used);
    df = dump(fresh);
    cr_assert(json_equal(du, df), "%s: the dumps after the turn differ",
              presets[k]);
    json_decref(du);
    json_decref(df);
    ag_guard_free(used);
    ag_guard_free(fresh);
  }
}
