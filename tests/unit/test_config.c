/*
 * tests/unit/test_config.c - presets, config parsing and its error messages,
 * validation, JSON round trips, durations, file loading, and the preset table
 * in docs/configuration.md.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <criterion/criterion.h>
#include <jansson.h>

#include "agentguard/core.h"

#define N_PRESETS 10

static ag_config preset(const char *name) {
  ag_config c;
  ag_error_t err;
  memset(&c, 0xAB, sizeof(c)); /* the preset must not leave junk behind */
  cr_assert_eq(ag_config_preset(&c, name, &err), AG_OK, "preset %s: %s", name,
               err.msg);
  return c;
}

/* Parses `json` into a default config; asserts success. */
static ag_config parse_ok(const char *json) {
  ag_config c;
  ag_error_t err;
  ag_config_init(&c);
  ag_err_t rc = ag_config_parse(&c, json, strlen(json), &err);
  cr_assert_eq(rc, AG_OK, "parse %s: %s (%s)", json, ag_err_name(rc), err.msg);
  return c;
}

/* Parses `json`, expects failure with `code` and exactly `msg`, and checks
 * that the config was not touched. */
static void parse_fails(const char *json, ag_err_t code, const char *msg) {
  ag_config c, before;
  ag_error_t err;
  c = preset("monadic");
  memcpy(&before, &c, sizeof(c));
  ag_err_t rc = ag_config_parse(&c, json, strlen(json), &err);
  cr_assert_eq(rc, code, "parse %s: got %s, want %s (%s)", json,
               ag_err_name(rc), ag_err_name(code), err.msg);
  cr_assert_eq(err.code, code);
  if (msg != NULL)
    cr_assert_str_eq(err.msg, msg, "parse %s", json);
  cr_assert(memcmp(&c, &before, sizeof(c)) == 0,
            "config changed by a failed parse of %s", json);
}

/* ------------------------------------------------------------------------ */
/* Presets                                                                  */
/* ------------------------------------------------------------------------ */

Test(config, preset_names_in_order) {
  static const char *want[] = {
      "default",      "none",  "hpd",           "development", "production",
      "long-running", "forge", "twelve-factor", "monadic",     "meai"};
  const char *const *names = ag_preset_names();
  for (int i = 0; i < N_PRESETS; i++) {
    cr_assert_not_null(names[i]);
    cr_assert_str_eq(names[i], want[i]);
  }
  cr_assert_null(names[N_PRESETS]);
}

Test(config, every_preset_loads_and_validates) {
  for (const char *const *n = ag_preset_names(); *n != NULL; n++) {
    ag_config c = preset(*n);
    ag_error_t err;
    cr_assert_eq(ag_config_validate(&c, &err), AG_OK, "%s: %s", *n, err.msg);
    cr_assert_str_eq(c.preset, *n);
    /* zero-filled: building twice over different junk gives equal bytes */
    ag_config d;
    memset(&d, 0x5A, sizeof(d));
    cr_assert_eq(ag_config_preset(&d, *n, NULL), AG_OK);
    cr_assert(memcmp(&c, &d, sizeof(c)) == 0, "%s not deterministic", *n);
  }
}

Test(config, init_is_default) {
  ag_config a, b = preset("default");
  memset(&a, 0x11, sizeof(a));
  ag_config_init(&a);
  cr_assert(memcmp(&a, &b, sizeof(a)) == 0);
  cr_assert_str_eq(a.preset, "default");
}

Test(config, unknown_preset) {
  ag_config c = preset("hpd"), before = c;
  ag_error_t err;
  cr_assert_eq(ag_config_preset(&c, "hdp", &err), AG_ENOTFOUND);
  cr_assert_str_eq(err.msg,
                   "preset: \"hdp\" is not a preset; did you mean hpd? "
                   "(known: default, none, hpd, development, production, "
                   "long-running, forge, twelve-factor, monadic, meai)");
  cr_assert(memcmp(&c, &before, sizeof(c)) == 0);
  cr_assert_eq(ag_config_preset(&c, NULL, &err), AG_EINVAL);
  cr_assert_eq(ag_config_preset(NULL, "hpd", NULL), AG_EINVAL);
}

Test(config, default_values) {
  ag_config c = preset("default");
  cr_assert_eq(c.loop.max_iterations, 150);
  cr_assert_eq(c.loop.max_calls_per_turn, 0);
  cr_assert_eq(c.loop.max_refused_replies, 10);
  cr_assert_eq(c.loop.max_denied_calls, 3);
  cr_assert_eq(c.loop.content_loop_repeats, 10);
  cr_assert_eq(c.loop.max_empty_replies, 2);
  cr_assert_eq(c.loop.repeated_result_limit, 5);
  cr_assert_eq(c.loop.repeated_failure_limit, 3);
  cr_assert_eq(c.loop.identical_call_limit, 5);
  cr_assert_eq(c.loop.identical_call_scope, AG_SCOPE_CALL);
  cr_assert_eq(c.loop.cycle_limit, 5);
  cr_assert_eq(c.loop.cycle_max_length, 5);
  cr_assert_eq(c.loop.max_turn_duration_ms, 300000);
  cr_assert_eq(c.loop.nudge_before_stop, false);
  cr_assert_eq(c.loop.final_request_without_tools, true);
  cr_assert_eq(c.loop.require_tool_call, false);
  cr_assert_eq(c.loop.loop_breaking_tools.count, 0);
  cr_assert_eq(c.loop.parallel, true);
  cr_assert_eq(c.loop.max_parallel, 8);
  cr_assert_eq(c.errors.max_identical_errors, 5);
  cr_assert_eq(c.errors.max_tool_errors, 0);
  cr_assert_eq(c.errors.max_consecutive_errors, 3);
  cr_assert_eq(c.errors.failing_iteration, AG_FAIL_ALL_FAILED);
  cr_assert_eq(c.errors.max_total_errors, 0);
  cr_assert_eq(c.errors.similar_error_limit, 0);
  cr_assert_eq(c.errors.error_history, 10);
  cr_assert_eq(c.errors.error_prefixes.count, 1);
  cr_assert_str_eq(c.errors.error_prefixes.items[0], "Error:");
  cr_assert_eq(c.errors.on_trip, AG_TRIP_STOP);
  cr_assert_eq(c.errors.feedback, AG_FEEDBACK_COMPACT);
  cr_assert_eq(c.errors.max_error_chars, 200);
  cr_assert_eq(c.errors.error_context, true);
  cr_assert_eq(c.errors.max_errors_in_context, 3);
  cr_assert_eq(c.errors.normalize_provider_errors, true);
  cr_assert_eq(c.errors.include_provider_details, false);
  cr_assert_eq(c.retry.max_retries, 3);
  cr_assert_eq(c.retry.delay_ms, 1000);
  cr_assert_eq(c.retry.backoff, AG_BACKOFF_LINEAR);
  cr_assert_eq(c.retry.max_delay_ms, 30000);
  cr_assert_eq(c.retry.jitter, false);
  cr_assert_eq(c.retry.function_timeout_ms, 30000);
  cr_assert_eq(c.retry.retry_on, AG_RETRY_ON_TRANSIENT);
  cr_assert_eq(c.network.max_retries, 3);
  cr_assert_eq(c.network.delay_ms, 1000);
  cr_assert_eq(c.network.max_delay_ms, 30000);
  cr_assert_eq(c.network.timeout_ms, 120000);
}

Test(config, none_values) {
  ag_config c = preset("none");
  cr_assert_eq(c.loop.max_iterations, 0);
  cr_assert_eq(c.loop.max_calls_per_turn, 0);
  cr_assert_eq(c.loop.identical_call_limit, 0);
  cr_assert_eq(c.loop.cycle_limit, 0);
  cr_assert_eq(c.loop.cycle_max_length, 5);
  cr_assert_eq(c.loop.max_turn_duration_ms, 0);
  cr_assert_eq(c.loop.final_request_without_tools, false);
  cr_assert_eq(c.loop.parallel, true);
  cr_assert_eq(c.loop.max_parallel, 8);
  cr_assert_eq(c.errors.max_identical_errors, 0);
  cr_assert_eq(c.errors.max_tool_errors, 0);
  cr_assert_eq(c.errors.max_consecutive_errors, 0);
  cr_assert_eq(c.errors.max_total_errors, 0);
  cr_assert_eq(c.errors.similar_error_limit, 0);
  cr_assert_eq(c.errors.error_history, 10);
  cr_assert_eq(c.errors.feedback, AG_FEEDBACK_FULL);
  cr_assert_eq(c.errors.error_context, false);
  /* "Error:" is seed 000's rule: hpd's and default's, not every seed's */
  cr_assert_eq(c.errors.error_prefixes.count, 0);
  cr_assert_eq(c.errors.normalize_errors, false);
  cr_assert_eq(c.errors.normalize_provider_errors, true);
  cr_assert_eq(c.retry.max_retries, 0);
  cr_assert_eq(c.retry.function_timeout_ms, 0);
  cr_assert_eq(c.retry.delay_ms, 1000);
  cr_assert_eq(c.retry.max_delay_ms, 30000);
  cr_assert_eq(c.network.max_retries, 0);
  cr_assert_eq(c.network.timeout_ms, 0);
}

Test(config, hpd_family_values) {
  ag_config h = preset("hpd");
  cr_assert_eq(h.loop.identical_call_limit, 5);
  cr_assert_eq(h.errors.max_consecutive_errors, 3);
  cr_assert_eq(h.errors.failing_iteration, AG_FAIL_ALL_FAILED);
  cr_assert_eq(h.retry.max_retries, 3);
  cr_assert_eq(h.retry.backoff, AG_BACKOFF_LINEAR);
  cr_assert_eq(h.retry.delay_ms, 1000);
  cr_assert_eq(h.retry.function_timeout_ms, 30000);
  cr_assert_eq(h.loop.max_turn_duration_ms, 300000);
  cr_assert_eq(h.loop.max_iterations, 0);
  cr_assert_eq(h.errors.feedback, AG_FEEDBACK_FULL);

  ag_config d = preset("development");
  cr_assert_eq(d.loop.max_turn_duration_ms, 120000);
  cr_assert_eq(d.loop.identical_call_limit, 3);
  cr_assert_eq(d.retry.max_retries, 2);
  cr_assert_eq(d.errors.max_consecutive_errors, 2);
  cr_assert_eq(d.retry.function_timeout_ms, 10000);
  cr_assert_eq(d.retry.delay_ms, 1000);

  ag_config p = preset("production");
  cr_assert_eq(p.loop.max_turn_duration_ms, 600000);
  cr_assert_eq(p.loop.identical_call_limit, 5);
  cr_assert_eq(p.retry.max_retries, 3);
  cr_assert_eq(p.errors.max_consecutive_errors, 3);
  cr_assert_eq(p.retry.function_timeout_ms, 60000);
  cr_assert_eq(p.retry.delay_ms, 2000);

  ag_config l = preset("long-running");
  cr_assert_eq(l.loop.max_turn_duration_ms, 1800000);
  cr_assert_eq(l.loop.identical_call_limit, 10);
  cr_assert_eq(l.retry.max_retries, 5);
  cr_assert_eq(l.errors.max_consecutive_errors, 5);
  cr_assert_eq(l.retry.function_timeout_ms, 300000);
  cr_assert_eq(l.retry.delay_ms, 3000);
  cr_assert_eq(l.retry.backoff, AG_BACKOFF_LINEAR);
}

Test(config, seed_preset_values) {
  ag_config f = preset("forge");
  cr_assert_eq(f.errors.max_identical_errors, 5);
  cr_assert_eq(f.loop.require_tool_call, true);
  cr_assert_eq(f.loop.loop_breaking_tools.count, 2);
  cr_assert_str_eq(f.loop.loop_breaking_tools.items[0], "task_complete");
  cr_assert_str_eq(f.loop.loop_breaking_tools.items[1], "ask_question");
  cr_assert_eq(f.errors.error_context, true);
  cr_assert_eq(f.loop.identical_call_limit, 0);
  cr_assert_eq(f.retry.max_retries, 0);

  ag_config t = preset("twelve-factor");
  cr_assert_eq(t.errors.max_tool_errors, 3);
  cr_assert_eq(t.errors.max_total_errors, 10);
  cr_assert_eq(t.errors.on_trip, AG_TRIP_ESCALATE);
  cr_assert_eq(t.errors.feedback, AG_FEEDBACK_COMPACT);
  cr_assert_eq(t.errors.max_errors_in_context, 3);
  cr_assert_eq(t.errors.max_error_chars, 200);
  cr_assert_eq(t.errors.error_context, true);
  cr_assert_eq(t.errors.max_consecutive_errors, 0);

  ag_config m = preset("monadic");
  cr_assert_eq(m.errors.similar_error_limit, 3);
  cr_assert_eq(m.errors.error_history, 10);
  cr_assert_eq(m.loop.max_calls_per_turn, 20);
  cr_assert_eq(m.network.max_retries, 5);
  cr_assert_eq(m.network.delay_ms, 1000);
  cr_assert_eq(m.network.max_delay_ms, 30000);
  cr_assert_eq(m.network.timeout_ms, 120000);
  cr_assert_eq(m.retry.max_retries, 0);

  ag_config e = preset("meai");
  cr_assert_eq(e.loop.max_iterations, 40);
  cr_assert_eq(e.loop.final_request_without_tools, true);
  cr_assert_eq(e.errors.max_consecutive_errors, 3);
  cr_assert_eq(e.errors.failing_iteration, AG_FAIL_ANY_FAILED);
  cr_assert_eq(e.loop.identical_call_limit, 0);
  /* M.E.AI: AllowConcurrentInvocation false, IncludeDetailedErrors false */
  cr_assert_eq(e.loop.parallel, false);
  cr_assert_eq(e.errors.feedback, AG_FEEDBACK_GENERIC);
  cr_assert_eq(e.loop.max_refused_replies, 0);

  ag_config fo = preset("forge");
  cr_assert_eq(fo.loop.max_refused_replies, 5);
}

/* ------------------------------------------------------------------------ */
/* Parsing                                                                  */
/* ------------------------------------------------------------------------ */

Test(config, design_example_overrides_preset) {
  ag_config want = preset("hpd");
  want.retry.max_retries = 5;
  ag_config got =
      parse_ok("{\"preset\": \"hpd\", \"retry\": {\"max_retries\": 5}}");
  cr_assert(memcmp(&got, &want, sizeof(got)) == 0);
  cr_assert_str_eq(got.preset, "hpd");
  /* the preset applies first wherever it stands */
  got = parse_ok("{\"retry\": {\"max_retries\": 5}, \"preset\": \"hpd\"}");
  cr_assert(memcmp(&got, &want, sizeof(got)) == 0);
}

Test(config, empty_object_is_default) {
  ag_config got = parse_ok("{}"), want = preset("default");
  cr_assert(memcmp(&got, &want, sizeof(got)) == 0);
  /* from any starting point */
  ag_config c = preset("forge");
  cr_assert_eq(ag_config_parse(&c, "{}", 2, NULL), AG_OK);
  cr_assert(memcmp(&c, &want, sizeof(c)) == 0);
}

Test(config, every_kind_of_key) {
  ag_config c = parse_ok(
      "{\"preset\": \"none\",\n"
      " \"loop\": {\"max_iterations\": 7, \"identical_call_scope\": "
      "\"call_and_result\", \"max_turn_duration\": \"1.5m\", "
      "\"nudge_before_stop\": true, \"loop_breaking_tools\": [\"done\", "
      "\"ask\"], \"parallel\": false, \"max_parallel\": 256, "
      "\"cycle_max_length\": 2},\n"
      " \"errors\": {\"error_prefixes\": [], \"on_trip\": \"escalate\", "
      "\"feedback\": \"compact\", \"similar_error_limit\": 4, "
      "\"error_history\": 4, \"max_error_chars\": 65536},\n"
      " \"retry\": {\"delay\": \"250ms\", \"backoff\": \"exponential\", "
      "\"jitter\": true, \"retry_on\": \"none\", \"max_retries\": 100},\n"
      " \"network\": {\"timeout\": \"168h\", \"max_delay\": \"0\"}}");
  cr_assert_eq(c.loop.max_iterations, 7);
  cr_assert_eq(c.loop.identical_call_scope, AG_SCOPE_CALL_AND_RESULT);
  cr_assert_eq(c.loop.max_turn_duration_ms, 90000);
  cr_assert_eq(c.loop.nudge_before_stop, true);
  cr_assert_eq(c.loop.loop_breaking_tools.count, 2);
  cr_assert_str_eq(c.loop.loop_breaking_tools.items[1], "ask");
  cr_assert_eq(c.loop.parallel, false);
  cr_assert_eq(c.loop.max_parallel, 256);
  cr_assert_eq(c.loop.cycle_max_length, 2);
  cr_assert_eq(c.errors.error_prefixes.count, 0);
  cr_assert_eq(c.errors.on_trip, AG_TRIP_ESCALATE);
  cr_assert_eq(c.errors.feedback, AG_FEEDBACK_COMPACT);
  cr_assert_eq(c.errors.similar_error_limit, 4);
  cr_assert_eq(c.errors.max_error_chars, 65536);
  cr_assert_eq(c.retry.delay_ms, 250);
  cr_assert_eq(c.retry.backoff, AG_BACKOFF_EXPONENTIAL);
  cr_assert_eq(c.retry.jitter, true);
  cr_assert_eq(c.retry.retry_on, AG_RETRY_ON_NONE);
  cr_assert_eq(c.retry.max_retries, 100);
  cr_assert_eq(c.network.timeout_ms, 7LL * 24 * 3600 * 1000);
  cr_assert_eq(c.network.max_delay_ms, 0);
  cr_assert_str_eq(c.preset, "none");
}

Test(config, list_replaces_whole_list) {
  ag_config c = parse_ok("{\"preset\": \"forge\", \"loop\": "
                         "{\"loop_breaking_tools\": [\"finish\"]}}");
  cr_assert_eq(c.loop.loop_breaking_tools.count, 1);
  cr_assert_str_eq(c.loop.loop_breaking_tools.items[0], "finish");
  /* the unused slot was cleared, so the struct compares equal */
  ag_config want = preset("forge");
  memset(&want.loop.loop_breaking_tools, 0, sizeof(ag_str_list));
  want.loop.loop_breaking_tools.count = 1;
  strcpy(want.loop.loop_breaking_tools.items[0], "finish");
  cr_assert(memcmp(&c, &want, sizeof(c)) == 0);
}

Test(config, provider_section_is_left_to_the_model_client) {
  ag_config c, d;
  ag_config_init(&d);
  const char *j = "{\"provider\": {\"model\": \"m\", \"anything\": 1}, "
                  "\"loop\": {\"max_iterations\": 9}}";
  ag_error_t err;
  cr_assert_eq(ag_config_parse(&c, j, strlen(j), &err), AG_OK, "%s", err.msg);
  cr_assert_eq(c.loop.max_iterations, 9);
  d.loop.max_iterations = 9;
  cr_assert(memcmp(&c, &d, sizeof(c)) == 0, "nothing else changed");
}

Test(config, error_unknown_key) {
  parse_fails("{\"errors\": {\"max_tol_errors\": 3}}", AG_ECONFIG,
              "errors.max_tol_errors: unknown key; did you mean "
              "max_tool_errors?");
  parse_fails("{\"loop\": {\"max_iter\": 3}}", AG_ECONFIG,
              "loop.max_iter: unknown key; did you mean max_iterations?");
  parse_fails("{\"retry\": {\"delay_ms\": \"1s\"}}", AG_ECONFIG,
              "retry.delay_ms: unknown key; did you mean delay?");
  parse_fails("{\"loop\": {\"Max_Iterations\": 3}}", AG_ECONFIG,
              "loop.Max_Iterations: unknown key; did you mean "
              "max_iterations?");
  parse_fails("{\"network\": {\"timeuot\": \"1s\"}}", AG_ECONFIG,
              "network.timeuot: unknown key; did you mean timeout?");
  /* the keys of mechanisms 12-16 */
  parse_fails("{\"loop\": {\"max_refused_replys\": 3}}", AG_ECONFIG,
              "loop.max_refused_replys: unknown key; did you mean "
              "max_refused_replies?");
  parse_fails("{\"loop\": {\"max_denied_call\": 3}}", AG_ECONFIG,
              "loop.max_denied_call: unknown key; did you mean "
              "max_denied_calls?");
  parse_fails("{\"loop\": {\"content_loop_repeat\": 3}}", AG_ECONFIG,
              "loop.content_loop_repeat: unknown key; did you mean "
              "content_loop_repeats?");
  parse_fails("{\"loop\": {\"max_empty_replys\": 3}}", AG_ECONFIG,
              "loop.max_empty_replys: unknown key; did you mean "
              "max_empty_replies?");
  parse_fails("{\"loop\": {\"repeated_failures_limit\": 3}}", AG_ECONFIG,
              "loop.repeated_failures_limit: unknown key; did you mean "
              "repeated_failure_limit?");
  parse_fails("{\"errors\": {\"feedback\": \"generik\"}}", AG_ECONFIG, NULL);
  /* far away, or ambiguous: no suggestion */
  parse_fails("{\"loop\": {\"xyz\": 1}}", AG_ECONFIG, "loop.xyz: unknown key");
  parse_fails("{\"loop\": {\"max\": 1}}", AG_ECONFIG, "loop.max: unknown key");
  parse_fails("{\"errors\": {\"completely_different\": 1}}", AG_ECONFIG,
              "errors.completely_different: unknown key");
  /* a key of another section is unknown here */
  parse_fails("{\"network\": {\"jitter\": true}}", AG_ECONFIG,
              "network.jitter: unknown key");
}

Test(config, error_unknown_section) {
  parse_fails("{\"lop\": {}}", AG_ECONFIG,
              "lop: unknown key; did you mean loop?");
  parse_fails("{\"netwrok\": {}}", AG_ECONFIG,
              "netwrok: unknown key; did you mean network?");
  parse_fails("{\"presets\": \"hpd\"}", AG_ECONFIG,
              "presets: unknown key; did you mean preset?");
  parse_fails("{\"banana\": {}}", AG_ECONFIG, "banana: unknown key");
  /* control characters never reach the message raw */
  parse_fails("{\"a\\nb\": {}}", AG_ECONFIG, "a?b: unknown key");
}

Test(config, error_wrong_type) {
  parse_fails("{\"loop\": {\"max_iterations\": \"5\"}}", AG_ECONFIG,
              "loop.max_iterations: expected an integer, got string");
  parse_fails("{\"loop\": {\"max_iterations\": 5.0}}", AG_ECONFIG,
              "loop.max_iterations: expected an integer, got number");
  parse_fails("{\"loop\": {\"parallel\": 1}}", AG_ECONFIG,
              "loop.parallel: expected a boolean, got integer");
  parse_fails("{\"retry\": {\"delay\": 30}}", AG_ECONFIG,
              "retry.delay: expected a duration string (e.g. \"30s\"), got "
              "integer");
  parse_fails("{\"errors\": {\"on_trip\": null}}", AG_ECONFIG,
              "errors.on_trip: expected a string, got null");
  parse_fails("{\"errors\": {\"error_prefixes\": \"Error:\"}}", AG_ECONFIG,
              "errors.error_prefixes: expected an array of strings, got "
              "string");
  parse_fails("{\"loop\": [1]}", AG_ECONFIG,
              "loop: expected an object, got array");
}

Test(config, error_out_of_range) {
  parse_fails("{\"loop\": {\"cycle_max_length\": 40}}", AG_ECONFIG,
              "loop.cycle_max_length: 40 is out of range (2..16)");
  parse_fails("{\"loop\": {\"cycle_max_length\": 1}}", AG_ECONFIG,
              "loop.cycle_max_length: 1 is out of range (2..16)");
  parse_fails("{\"loop\": {\"max_iterations\": -1}}", AG_ECONFIG,
              "loop.max_iterations: -1 is out of range (0..1000000)");
  parse_fails("{\"loop\": {\"max_iterations\": 1000001}}", AG_ECONFIG,
              "loop.max_iterations: 1000001 is out of range (0..1000000)");
  parse_fails("{\"loop\": {\"max_parallel\": 0}}", AG_ECONFIG,
              "loop.max_parallel: 0 is out of range (1..256)");
  parse_fails("{\"retry\": {\"max_retries\": 101}}", AG_ECONFIG,
              "retry.max_retries: 101 is out of range (0..100)");
  parse_fails("{\"errors\": {\"max_error_chars\": 65537}}", AG_ECONFIG,
              "errors.max_error_chars: 65537 is out of range (1..65536)");
  parse_fails("{\"errors\": {\"max_errors_in_context\": 0}}", AG_ECONFIG,
              "errors.max_errors_in_context: 0 is out of range (1..64)");
  parse_fails("{\"errors\": {\"error_history\": 257}}", AG_ECONFIG,
              "errors.error_history: 257 is out of range (1..256)");
  parse_fails("{\"network\": {\"timeout\": \"169h\"}}", AG_ECONFIG,
              "network.timeout: \"169h\" is out of range (0..168h)");
  parse_fails("{\"loop\": {\"max_iterations\": 9223372036854775807}}",
              AG_ECONFIG,
              "loop.max_iterations: 9223372036854775807 is out of range "
              "(0..1000000)");
  /* past the largest JSON integer jansson holds: a JSON error */
  parse_fails("{\"loop\": {\"max_iterations\": 99999999999999999999}}",
              AG_EJSON, NULL);
}

Test(config, error_cross_key) {
  parse_fails("{\"errors\": {\"similar_error_limit\": 20}}", AG_ECONFIG,
              "errors.error_history: 10 is less than "
              "errors.similar_error_limit (20)");
  parse_ok("{\"errors\": {\"similar_error_limit\": 20, \"error_history\": "
           "20}}");
  /* off: any history length is fine */
  parse_ok("{\"errors\": {\"similar_error_limit\": 0, \"error_history\": 1}}");
}

Test(config, error_bad_duration) {
  parse_fails("{\"retry\": {\"delay\": \"5 sec\"}}", AG_ECONFIG,
              "retry.delay: \"5 sec\" is not a duration (use e.g. \"250ms\", "
              "\"30s\", \"5m\")");
  parse_fails("{\"retry\": {\"delay\": \"-1s\"}}", AG_ECONFIG,
              "retry.delay: \"-1s\" is not a duration (use e.g. \"250ms\", "
              "\"30s\", \"5m\")");
  parse_fails("{\"retry\": {\"delay\": \"5\"}}", AG_ECONFIG,
              "retry.delay: \"5\" is not a duration (use e.g. \"250ms\", "
              "\"30s\", \"5m\")");
  parse_fails("{\"retry\": {\"delay\": \"say \\\"hi\\\"\"}}", AG_ECONFIG,
              "retry.delay: \"say \\\"hi\\\"\" is not a duration (use e.g. "
              "\"250ms\", \"30s\", \"5m\")");
}

Test(config, error_bad_enum) {
  parse_fails("{\"errors\": {\"on_trip\": \"halt\"}}", AG_ECONFIG,
              "errors.on_trip: \"halt\" is not one of \"stop\", \"escalate\"");
  parse_fails("{\"retry\": {\"backoff\": \"Linear\"}}", AG_ECONFIG,
              "retry.backoff: \"Linear\" is not one of \"linear\", "
              "\"exponential\", \"constant\"");
  parse_fails("{\"errors\": {\"failing_iteration\": \"some_failed\"}}",
              AG_ECONFIG,
              "errors.failing_iteration: \"some_failed\" is not one of "
              "\"all_failed\", \"any_failed\"");
}

Test(config, error_top_level_and_preset) {
  parse_fails("[1, 2]", AG_ECONFIG,
              "config: expected an object at the top level, got array");
  parse_fails("\"hpd\"", AG_ECONFIG,
              "config: expected an object at the top level, got string");
  parse_fails("{\"preset\": 3}", AG_ECONFIG,
              "preset: expected a string, got integer");
  parse_fails("{\"preset\": \"hdp\"}", AG_ECONFIG,
              "preset: \"hdp\" is not a preset; did you mean hpd?");
  parse_fails("{\"preset\": \"long_running\"}", AG_ECONFIG,
              "preset: \"long_running\" is not a preset; did you mean "
              "long-running?");
  parse_fails("{\"preset\": \"prod\"}", AG_ECONFIG,
              "preset: \"prod\" is not a preset; did you mean production?");
  parse_fails("{\"preset\": \"zzz\"}", AG_ECONFIG,
              "preset: \"zzz\" is not a preset (known: default, none, hpd, "
              "development, production, long-running, forge, twelve-factor, "
              "monadic, meai)");
  /* a bad preset is reported even when it comes last */
  parse_fails("{\"loop\": {\"max_iterations\": 3}, \"preset\": \"hdp\"}",
              AG_ECONFIG, "preset: \"hdp\" is not a preset; did you mean hpd?");
}

Test(config, error_list_items) {
  parse_fails("{\"errors\": {\"error_prefixes\": [\"Error:\", \"Fatal:\", "
              "7]}}",
              AG_ECONFIG,
              "errors.error_prefixes[2]: expected a string, got integer");
  parse_fails("{\"loop\": {\"loop_breaking_tools\": [\"\"]}}", AG_ECONFIG,
              "loop.loop_breaking_tools[0]: must not be empty");
  char json[512], msg[128];
  char long_item[AG_LIST_ITEM_MAX + 1];
  memset(long_item, 'x', AG_LIST_ITEM_MAX);
  long_item[AG_LIST_ITEM_MAX] = '\0';
  snprintf(json, sizeof(json), "{\"errors\": {\"error_prefixes\": [\"%s\"]}}",
           long_item);
  snprintf(msg, sizeof(msg),
           "errors.error_prefixes[0]: %d bytes, at most %d allowed",
           AG_LIST_ITEM_MAX, AG_LIST_ITEM_MAX - 1);
  parse_fails(json, AG_ECONFIG, msg);
  /* exactly AG_LIST_ITEM_MAX-1 bytes is fine */
  long_item[AG_LIST_ITEM_MAX - 1] = '\0';
  snprintf(json, sizeof(json), "{\"errors\": {\"error_prefixes\": [\"%s\"]}}",
           long_item);
  ag_config c = parse_ok(json);
  cr_assert_str_eq(c.errors.error_prefixes.items[0], long_item);

  /* AG_LIST_MAX entries fine, one more not */
  char list[256] = "";
  for (int i = 0; i <= AG_LIST_MAX; i++)
    strcat(list, i ? ",\"t\"" : "\"t\"");
  snprintf(json, sizeof(json), "{\"loop\": {\"loop_breaking_tools\": [%s]}}",
           list);
  snprintf(msg, sizeof(msg),
           "loop.loop_breaking_tools: %d entries, at most %d allowed",
           AG_LIST_MAX + 1, AG_LIST_MAX);
  parse_fails(json, AG_ECONFIG, msg);
  *strrchr(list, ',') = '\0';
  snprintf(json, sizeof(json), "{\"loop\": {\"loop_breaking_tools\": [%s]}}",
           list);
  c = parse_ok(json);
  cr_assert_eq(c.loop.loop_breaking_tools.count, AG_LIST_MAX);
}

Test(config, error_json_syntax) {
  const char *doc = "{\n"
                    "  \"loop\": {\n"
                    "    \"max_iterations\": 5,\n"
                    "  }\n"
                    "}\n";
  ag_config c = preset("hpd"), before = c;
  ag_error_t err;
  cr_assert_eq(ag_config_parse(&c, doc, strlen(doc), &err), AG_EJSON);
  cr_assert_eq(err.code, AG_EJSON);
  cr_assert_eq(err.line, 4, "line %d", err.line);
  cr_assert_eq(err.column, 3, "column %d", err.column);
  cr_assert_eq(err.pos, (long)(strstr(doc, "}\n}") - doc + 1), "pos %ld",
               err.pos);
  cr_assert(strncmp(err.msg, "config: line 4, column 3: ", 26) == 0, "%s",
            err.msg);
  cr_assert_gt(strlen(err.msg), 26);
  cr_assert(memcmp(&c, &before, sizeof(c)) == 0);

  /* duplicate keys are a JSON error too */
  parse_fails("{\"loop\": {\"max_iterations\": 1, \"max_iterations\": 2}}",
              AG_EJSON, NULL);
  parse_fails("{\"preset\": \"hpd\", \"preset\": \"none\"}", AG_EJSON, NULL);
  /* empty input, trailing garbage, a NUL in a string */
  parse_fails("", AG_EJSON, NULL);
  parse_fails("{} x", AG_EJSON, NULL);
  parse_fails("{\"preset\": \"hp\\u0000d\"}", AG_EJSON, NULL);
}

Test(config, parse_is_length_bounded) {
  /* not NUL-terminated: only `len` bytes are read */
  const char doc[] = "{\"loop\": {\"max_iterations\": 3}}GARBAGE";
  ag_config c;
  ag_config_init(&c);
  cr_assert_eq(ag_config_parse(&c, doc, strlen(doc) - 7, NULL), AG_OK);
  cr_assert_eq(c.loop.max_iterations, 3);
  cr_assert_eq(ag_config_parse(NULL, doc, 2, NULL), AG_EINVAL);
  cr_assert_eq(ag_config_parse(&c, NULL, 2, NULL), AG_EINVAL);
}

Test(config, nothing_changes_on_late_error) {
  /* valid keys first, then a bad one: none of them is applied */
  parse_fails("{\"preset\": \"none\", \"loop\": {\"max_iterations\": 3}, "
              "\"retry\": {\"max_retries\": 9, \"delay\": \"soon\"}}",
              AG_ECONFIG, NULL);
}

/* ------------------------------------------------------------------------ */
/* Durations                                                                */
/* ------------------------------------------------------------------------ */

Test(config, parse_duration_table) {
  static const struct {
    const char *text;
    int64_t ms;
  } good[] = {
      {"0", 0},
      {"0ms", 0},
      {"0s", 0},
      {"0h", 0},
      {"1ms", 1},
      {"250ms", 250},
      {"30s", 30000},
      {"5m", 300000},
      {"1h", 3600000},
      {"90s", 90000},
      {"1.5s", 1500},
      {"0.25s", 250},
      {"1.500s", 1500},
      {"1.5m", 90000},
      {"0.001s", 1},
      {"0.0001h", 360},
      {"1.05s", 1050},
      {"007s", 7000},
      {"168h", 604800000},
      {"10080m", 604800000},
      {"604800000ms", 604800000},
      {"604800s", 604800000},
  };
  for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
    int64_t ms = -42;
    cr_assert_eq(ag_parse_duration(good[i].text, &ms), AG_OK, "%s",
                 good[i].text);
    cr_assert_eq(ms, good[i].ms, "%s: got %lld, want %lld", good[i].text,
                 (long long)ms, (long long)good[i].ms);
  }
  static const char *bad[] = {"",
                              "5",
                              "-1s",
                              "+1s",
                              " 1s",
                              "1s ",
                              "5 sec",
                              "1S",
                              "1d",
                              "1sec",
                              "1.5ms",
                              "0.0001s",
                              ".5s",
                              "5.s",
                              "1e3ms",
                              "1m30s",
                              "s",
                              "ms",
                              "00",
                              "-0",
                              "168h1ms",
                              "169h",
                              "604800001ms",
                              "99999999999999999999999h",
                              "1.0000000001s",
                              "0x10s",
                              "inf",
                              "1,5s"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    int64_t ms = -42;
    cr_assert_eq(ag_parse_duration(bad[i], &ms), AG_EINVAL, "%s accepted",
                 bad[i]);
    cr_assert_eq(ms, -42, "%s changed *ms", bad[i]);
  }
  int64_t ms;
  cr_assert_eq(ag_parse_duration(NULL, &ms), AG_EINVAL);
  cr_assert_eq(ag_parse_duration("1s", NULL), AG_EINVAL);
}

Test(config, format_duration_table) {
  static const struct {
    int64_t ms;
    const char *text;
  } cases[] = {
      {0, "0"},
      {1, "1ms"},
      {250, "250ms"},
      {1000, "1s"},
      {1500, "1500ms"},
      {30000, "30s"},
      {60000, "1m"},
      {90000, "90s"},
      {300000, "5m"},
      {3600000, "1h"},
      {5400000, "90m"},
      {604800000, "168h"},
      {-5000, "-5s"},
      {INT64_MAX, "9223372036854775807ms"},
      {INT64_MIN, "-9223372036854775808ms"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    char buf[32];
    ag_format_duration(cases[i].ms, buf, sizeof(buf));
    cr_assert_str_eq(buf, cases[i].text);
    int64_t back;
    if (cases[i].ms >= 0 && cases[i].ms <= 604800000) {
      cr_assert_eq(ag_parse_duration(buf, &back), AG_OK, "%s", buf);
      cr_assert_eq(back, cases[i].ms);
    }
  }
  /* small buffers are cut and terminated; cap 0 writes nothing */
  char small[4] = "zzz";
  ag_format_duration(250, small, sizeof(small));
  cr_assert_str_eq(small, "250");
  ag_format_duration(250, small, 0);
  cr_assert_str_eq(small, "250");
}

/* ------------------------------------------------------------------------ */
/* Validation and JSON output                                               */
/* ------------------------------------------------------------------------ */

static void validate_fails(const ag_config *c, const char *msg) {
  ag_error_t err;
  cr_assert_eq(ag_config_validate(c, &err), AG_ECONFIG);
  cr_assert_str_eq(err.msg, msg);
  char *out = (char *)"untouched";
  cr_assert_eq(ag_config_to_json(c, &out, &err), AG_ECONFIG);
  cr_assert_null(out);
  cr_assert_str_eq(err.msg, msg);
}

Test(config, validate_hand_filled) {
  ag_config c;
  ag_config_init(&c);
  c.loop.max_iterations = -3;
  validate_fails(&c, "loop.max_iterations: -3 is out of range (0..1000000)");

  ag_config_init(&c);
  c.loop.max_turn_duration_ms = -5000;
  validate_fails(&c, "loop.max_turn_duration: -5s is out of range (0..168h)");

  ag_config_init(&c);
  c.network.timeout_ms = 604800001;
  validate_fails(&c, "network.timeout: 604800001ms is out of range (0..168h)");

  ag_config_init(&c);
  c.errors.on_trip = (ag_on_trip)7;
  validate_fails(&c, "errors.on_trip: 7 is not a valid value (0..1)");

  ag_config_init(&c);
  c.errors.error_prefixes.count = 17;
  validate_fails(&c, "errors.error_prefixes: 17 entries, at most 16 allowed");

  ag_config_init(&c);
  c.errors.error_prefixes.count = 2;
  validate_fails(&c, "errors.error_prefixes[1]: must not be empty");

  ag_config_init(&c);
  memset(c.errors.error_prefixes.items[0], 'x', AG_LIST_ITEM_MAX);
  validate_fails(&c, "errors.error_prefixes[0]: longer than 63 bytes");

  ag_config_init(&c);
  strcpy(c.loop.loop_breaking_tools.items[0], "bad\xC3");
  c.loop.loop_breaking_tools.count = 1;
  validate_fails(&c, "loop.loop_breaking_tools[0]: not valid UTF-8");

  ag_config_init(&c);
  c.errors.similar_error_limit = 11;
  validate_fails(&c, "errors.error_history: 10 is less than "
                     "errors.similar_error_limit (11)");

  ag_config_init(&c);
  strcpy(c.preset, "hdp");
  validate_fails(&c, "preset: \"hdp\" is not a preset; did you mean hpd?");

  ag_config_init(&c);
  memset(c.preset, 'p', sizeof(c.preset));
  validate_fails(&c, "preset: longer than 63 bytes");

  /* a bool holding junk is caught through its byte */
  ag_config_init(&c);
  unsigned char junk = 2;
  memcpy(&c.loop.parallel, &junk, 1);
  validate_fails(&c, "loop.parallel: not a boolean (byte value 2)");

  cr_assert_eq(ag_config_validate(NULL, NULL), AG_EINVAL);
}

Test(config, validate_clears_err_on_success) {
  ag_config c;
  ag_error_t err;
  ag_config_init(&c);
  err.code = AG_ECONFIG;
  strcpy(err.msg, "stale");
  cr_assert_eq(ag_config_validate(&c, &err), AG_OK);
  cr_assert_eq(err.code, AG_OK);
  cr_assert_str_eq(err.msg, "");
}

Test(config, round_trip_every_preset) {
  for (const char *const *n = ag_preset_names(); *n != NULL; n++) {
    ag_config c = preset(*n), back;
    char *json = NULL;
    ag_error_t err;
    cr_assert_eq(ag_config_to_json(&c, &json, &err), AG_OK, "%s: %s", *n,
                 err.msg);
    cr_assert_not_null(json);
    memset(&back, 0, sizeof(back));
    ag_config_init(&back);
    cr_assert_eq(ag_config_parse(&back, json, strlen(json), &err), AG_OK,
                 "%s: %s\n%s", *n, err.msg, json);
    cr_assert(memcmp(&c, &back, sizeof(c)) == 0, "%s differs after\n%s", *n,
              json);
    /* parsing on top of any other preset gives the same, as every key is
     * written */
    ag_config other = preset("none");
    cr_assert_eq(ag_config_parse(&other, json, strlen(json), NULL), AG_OK);
    cr_assert(memcmp(&c, &other, sizeof(c)) == 0);
    ag_free(json);
  }
}

Test(config, round_trip_custom) {
  ag_config c = parse_ok(
      "{\"preset\": \"twelve-factor\", \"loop\": {\"loop_breaking_tools\": "
      "[\"d\\u00e9j\\u00e0\", \"x\\\"y\"], \"max_turn_duration\": "
      "\"1.5h\"}, \"errors\": {\"error_prefixes\": []}, \"retry\": "
      "{\"delay\": \"1234ms\"}}");
  char *json = NULL;
  cr_assert_eq(ag_config_to_json(&c, &json, NULL), AG_OK);
  ag_config back;
  ag_config_init(&back);
  cr_assert_eq(ag_config_parse(&back, json, strlen(json), NULL), AG_OK);
  cr_assert(memcmp(&c, &back, sizeof(c)) == 0, "%s", json);
  cr_assert(strstr(json, "\"max_turn_duration\": \"90m\"") != NULL, "%s", json);
  cr_assert(strstr(json, "\"delay\": \"1234ms\"") != NULL, "%s", json);
  ag_free(json);
}

Test(config, to_json_shape) {
  ag_config c = preset("default");
  char *json = NULL;
  cr_assert_eq(ag_config_to_json(&c, &json, NULL), AG_OK);
  /* sorted keys, two-space indent */
  const char *e = strstr(json, "\n  \"errors\": {");
  const char *l = strstr(json, "\n  \"loop\": {");
  const char *n = strstr(json, "\n  \"network\": {");
  const char *p = strstr(json, "\n  \"preset\": \"default\"");
  const char *r = strstr(json, "\n  \"retry\": {");
  cr_assert(e && l && n && p && r, "%s", json);
  cr_assert(e < l && l < n && n < p && p < r, "%s", json);
  cr_assert(strstr(json, "\n    \"max_turn_duration\": \"5m\"") != NULL);
  cr_assert(strstr(json, "\"error_prefixes\": [\n      \"Error:\"\n    ]") !=
                NULL,
            "%s", json);
  cr_assert(strstr(json, "\"feedback\": \"compact\"") != NULL);
  cr_assert(strstr(json, "\"function_timeout\": \"30s\"") != NULL);
  cr_assert(strstr(json, "\"timeout\": \"2m\"") != NULL);

  /* every key of every section is there: 13 + 15 + 7 + 4 */
  json_t *root = json_loads(json, 0, NULL);
  cr_assert_not_null(root);
  cr_assert_eq(json_object_size(root), 5);
  cr_assert_eq(json_object_size(json_object_get(root, "loop")), 20);
  cr_assert_eq(json_object_size(json_object_get(root, "errors")), 17);
  cr_assert_eq(json_object_size(json_object_get(root, "retry")), 7);
  cr_assert_eq(json_object_size(json_object_get(root, "network")), 4);
  json_decref(root);
  ag_free(json);

  /* a hand-built config without a preset name writes none */
  c.preset[0] = '\0';
  cr_assert_eq(ag_config_to_json(&c, &json, NULL), AG_OK);
  cr_assert_null(strstr(json, "\"preset\""));
  ag_free(json);
  cr_assert_eq(ag_config_to_json(NULL, &json, NULL), AG_EINVAL);
  cr_assert_null(json);
  cr_assert_eq(ag_config_to_json(&c, NULL, NULL), AG_EINVAL);
}

/* ------------------------------------------------------------------------ */
/* Files                                                                    */
/* ------------------------------------------------------------------------ */

/* Writes `len` bytes of `data` to a new temp file; returns its path
 * (static buffer per slot). */
static const char *temp_file(int slot, const char *data, size_t len) {
  static char paths[4][64];
  snprintf(paths[slot], sizeof(paths[slot]), "/tmp/ag_test_config_XXXXXX");
  int fd = mkstemp(paths[slot]);
  cr_assert_geq(fd, 0);
  size_t off = 0;
  while (off < len) {
    ssize_t w = write(fd, data + off, len - off);
    cr_assert_gt(w, 0);
    off += (size_t)w;
  }
  close(fd);
  return paths[slot];
}

Test(config, load_file_ok) {
  const char *doc = "{\"preset\": \"production\",\n"
                    " \"errors\": {\"on_trip\": \"escalate\"}}\n";
  const char *path = temp_file(0, doc, strlen(doc));
  ag_config c;
  ag_error_t err;
  ag_config_init(&c);
  cr_assert_eq(ag_config_load_file(&c, path, &err), AG_OK, "%s", err.msg);
  cr_assert_str_eq(c.preset, "production");
  cr_assert_eq(c.retry.delay_ms, 2000);
  cr_assert_eq(c.errors.on_trip, AG_TRIP_ESCALATE);
  unlink(path);
}

Test(config, load_file_errors_name_the_file) {
  const char *doc = "{\n  \"loop\": {\"max_iterations\": }\n}\n";
  const char *path = temp_file(0, doc, strlen(doc));
  ag_config c = preset("hpd"), before = c;
  ag_error_t err;
  char want[256];
  cr_assert_eq(ag_config_load_file(&c, path, &err), AG_EJSON);
  snprintf(want, sizeof(want), "%s: line 2, column ", path);
  cr_assert(strncmp(err.msg, want, strlen(want)) == 0, "%s", err.msg);
  cr_assert_eq(err.line, 2);
  cr_assert(memcmp(&c, &before, sizeof(c)) == 0);
  unlink(path);

  doc = "{\"errors\": {\"max_tol_errors\": 3}}";
  path = temp_file(1, doc, strlen(doc));
  cr_assert_eq(ag_config_load_file(&c, path, &err), AG_ECONFIG);
  snprintf(want, sizeof(want),
           "%s: errors.max_tol_errors: unknown key; did you mean "
           "max_tool_errors?",
           path);
  cr_assert_str_eq(err.msg, want);
  unlink(path);

  doc = "[]";
  path = temp_file(1, doc, strlen(doc));
  cr_assert_eq(ag_config_load_file(&c, path, &err), AG_ECONFIG);
  snprintf(want, sizeof(want),
           "%s: expected an object at the top level, got array", path);
  cr_assert_str_eq(err.msg, want);
  unlink(path);
  cr_assert(memcmp(&c, &before, sizeof(c)) == 0);
}

Test(config, load_file_missing) {
  ag_config c = preset("hpd"), before = c;
  ag_error_t err;
  cr_assert_eq(ag_config_load_file(&c, "/nonexistent/agentguard.json", &err),
               AG_EIO);
  cr_assert_eq(err.code, AG_EIO);
  cr_assert_eq(err.sys_errno, ENOENT);
  cr_assert_str_eq(err.msg, "/nonexistent/agentguard.json: cannot open: No "
                            "such file or directory");
  cr_assert(memcmp(&c, &before, sizeof(c)) == 0);

  /* a directory opens but cannot be read */
  cr_assert_eq(ag_config_load_file(&c, "/tmp", &err), AG_EIO);
  cr_assert_eq(err.sys_errno, EISDIR);
  cr_assert_eq(ag_config_load_file(&c, NULL, NULL), AG_EINVAL);
}

Test(config, load_file_size_cap) {
  const size_t cap = 1024 * 1024;
  char *big = malloc(cap + 1);
  cr_assert_not_null(big);
  /* exactly 1 MiB: "{}" padded with spaces is accepted */
  memset(big, ' ', cap + 1);
  big[0] = '{';
  big[cap - 1] = '}';
  const char *path = temp_file(2, big, cap);
  ag_config c;
  ag_error_t err;
  ag_config_init(&c);
  cr_assert_eq(ag_config_load_file(&c, path, &err), AG_OK, "%s", err.msg);
  unlink(path);

  /* one byte more is refused, naming the file */
  big[cap - 1] = ' ';
  big[cap] = '}';
  path = temp_file(2, big, cap + 1);
  ag_config before = c;
  cr_assert_eq(ag_config_load_file(&c, path, &err), AG_ETOOBIG);
  cr_assert(strncmp(err.msg, path, strlen(path)) == 0, "%s", err.msg);
  cr_assert(strstr(err.msg, "larger than 1 MiB") != NULL, "%s", err.msg);
  cr_assert(memcmp(&c, &before, sizeof(c)) == 0);
  unlink(path);
  free(big);
}

/* ------------------------------------------------------------------------ */
/* docs/configuration.md                                                    */
/* ------------------------------------------------------------------------ */

/* The value of section.key in `root` as the docs' preset table writes it. */
static void cell_text(json_t *root, const char *section, const char *key,
                      char *buf, size_t cap) {
  json_t *v = json_object_get(json_object_get(root, section), key);
  cr_assert_not_null(v, "%s.%s missing from to_json", section, key);
  if (json_is_string(v)) {
    snprintf(buf, cap, "%s", json_string_value(v));
  } else {
    char *t = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    snprintf(buf, cap, "%s", t);
    free(t);
  }
}

/*
 * Every key appears in the docs' preset table, as "| `section.key` | v1 |
 * ... |" with one column per preset in ag_preset_names() order, and every
 * value matches what the code builds.
 */
Test(config, docs_preset_table_matches) {
  FILE *f = fopen(AG_SOURCE_DIR "/docs/configuration.md", "r");
  cr_assert_not_null(f, "docs/configuration.md: %s", strerror(errno));
  static char doc[256 * 1024];
  size_t n = fread(doc, 1, sizeof(doc) - 1, f);
  doc[n] = '\0';
  fclose(f);

  json_t *roots[N_PRESETS];
  const char *const *names = ag_preset_names();
  for (int i = 0; i < N_PRESETS; i++) {
    ag_config c = preset(names[i]);
    char *json;
    cr_assert_eq(ag_config_to_json(&c, &json, NULL), AG_OK);
    roots[i] = json_loads(json, 0, NULL);
    ag_free(json);
  }

  int rows = 0;
  const char *secs[] = {"loop", "errors", "retry", "network"};
  for (int s = 0; s < 4; s++) {
    const char *key;
    json_t *v;
    json_object_foreach(json_object_get(roots[0], secs[s]), key, v) {
      char head[96];
      snprintf(head, sizeof(head), "\n| `%s.%s` |", secs[s], key);
      const char *row = strstr(doc, head);
      cr_assert_not_null(row, "docs preset table has no row %s", head + 1);
      const char *p = row + strlen(head);
      for (int i = 0; i < N_PRESETS; i++) {
        const char *bar = strchr(p, '|');
        cr_assert_not_null(bar);
        char cell[128], want[128];
        size_t len = (size_t)(bar - p);
        cr_assert_lt(len, sizeof(cell));
        memcpy(cell, p, len);
        cell[len] = '\0';
        /* trim spaces */
        char *c0 = cell;
        while (*c0 == ' ')
          c0++;
        char *end = c0 + strlen(c0);
        while (end > c0 && end[-1] == ' ')
          *--end = '\0';
        cell_text(roots[i], secs[s], key, want, sizeof(want));
        cr_assert_str_eq(c0, want, "docs: %s.%s for %s", secs[s], key,
                         names[i]);
        p = bar + 1;
      }
      rows++;
    }
  }
  cr_assert_eq(rows, 48);
  for (int i = 0; i < N_PRESETS; i++)
    json_decref(roots[i]);
}
