/*
 * tests/unit/audit_replay.c - the audit's replay rules: nudges,
 * escalation, rejected replies, replies without tool calls, time
 * (test_audit's cases; the helpers are audit_fixture.h's).
 */
#include "audit_fixture.h"

/* ---- replay rules ------------------------------------------------------- */

Test(replay, identical_calls_stop_before_the_call_runs) {
  char *run = repeat_run(8, "read", "{\"p\":1}", "same", true);
  ag_trajectory *t = parse_ok(run);
  ag_audit_finding f = audit(t, "default");
  cr_assert(f.stop.stopped);
  cr_assert_eq(f.stop.reason, AG_REASON_IDENTICAL_CALLS);
  cr_assert_eq(f.stop.step, 5);
  cr_assert_eq(f.stop.call_index, 0);
  cr_assert_str_eq(f.stop.tool, "read");
  cr_assert_eq(f.stop.steps_after, 3);
  ag_trajectory_free(t);
  free(run);
}

Test(replay, nudged_call_is_held_back_then_stopped) {
  char *run = repeat_run(8, "read", "{\"p\":1}", "same", true);
  ag_trajectory *t = parse_ok(run);
  ag_config cfg = config_json("{\"loop\": {\"nudge_before_stop\": true}}");
  ag_audit_finding f = audit_cfg(t, &cfg, false);
  cr_assert_eq(f.held_back, 1, "the 5th call is held back");
  cr_assert(f.stop.stopped);
  cr_assert_eq(f.stop.reason, AG_REASON_IDENTICAL_CALLS);
  cr_assert_eq(f.stop.step, 6, "the next repetition stops");
  ag_trajectory_free(t);
  free(run);
}

Test(replay, escalation_counts_as_a_stop) {
  char *run = repeat_run(6, "pay", "{\"n\":1}", "Error: card declined", false);
  ag_trajectory *t = parse_ok(run);
  ag_audit_finding f = audit(t, "twelve-factor");
  cr_assert(f.stop.stopped);
  cr_assert_eq(f.stop.action, AG_ESCALATE);
  cr_assert_eq(f.stop.reason, AG_REASON_TOOL_ERROR_BUDGET);
  cr_assert_eq(f.stop.step, 3);
  char *json = NULL;
  cr_assert_eq(
      ag_audit_finding_json("x.json", "twelve-factor", t, &f, &json, NULL),
      AG_OK);
  cr_assert(strstr(json, "\"action\":\"escalate\""), "%s", json);
  ag_free(json);
  ag_trajectory_free(t);
  free(run);
}

Test(replay, ok_false_is_an_error_without_a_prefix) {
  char *run =
      repeat_run(5, "sh", "{\"c\":\"make\"}", "make: *** failed", false);
  ag_trajectory *t = parse_ok(run);
  ag_audit_finding f = audit(t, "hpd");
  cr_assert(f.stop.stopped);
  cr_assert_eq(f.stop.reason, AG_REASON_CONSECUTIVE_ERRORS);
  cr_assert_eq(f.stop.step, 4);
  ag_trajectory_free(t);
  free(run);
  /* ok true with an error prefix: the guard's prefixes decide */
  run = repeat_run(5, "sh", "{\"c\":\"x\"}", "Error: no", true);
  t = parse_ok(run);
  f = audit(t, "hpd");
  cr_assert_eq(f.stop.reason, AG_REASON_CONSECUTIVE_ERRORS);
  ag_trajectory_free(t);
  free(run);
  /* ok true without one: fine */
  run = repeat_run(4, "sh", "{\"c\":\"x\"}", "ERROR processing", true);
  t = parse_ok(run);
  f = audit(t, "hpd");
  cr_assert(!f.stop.stopped);
  ag_trajectory_free(t);
  free(run);
}

Test(replay, rejected_replies_are_refused_replies) {
  static const char run[] =
      "{\"steps\":["
      "{\"calls\":[{\"name\":\"bash\",\"args\":{\"command\":\"ls\"},"
      "\"rejected_by_harness\":true},{\"name\":\"bash\",\"args\":{\"command\":"
      "\"ls\"},\"rejected_by_harness\":true}],"
      "\"results\":[{\"ok\":false,\"text\":\"one action please\"}]},"
      "{\"rejected_by_harness\":true,\"calls\":[],\"results\":[{\"ok\":false,"
      "\"text\":\"one action please\"}]},"
      "{\"calls\":[{\"name\":\"bash\",\"args\":{\"command\":\"ls\"},"
      "\"rejected_by_harness\":true}],\"results\":[]},"
      "{\"calls\":[{\"name\":\"bash\",\"args\":{\"command\":\"ls\"},"
      "\"rejected_by_harness\":true}],\"results\":[{\"ok\":false,"
      "\"text\":\"one action please\"}]}]}";
  ag_trajectory *t = parse_ok(run);
  cr_assert(t->turns[0].steps[1].rejected);
  cr_assert_eq(t->turns[0].steps[2].n_results, 1, "an observation slot");
  /* nothing ran: no tool's error and no failing iteration (hpd's 3
   * consecutive errors never see them), but refused replies in a row */
  ag_audit_finding f = audit(t, "hpd");
  cr_assert(!f.stop.stopped);
  ag_config cfg = config_json("{\"preset\": \"hpd\", \"loop\": "
                              "{\"max_refused_replies\": 4}}");
  f = audit_cfg(t, &cfg, false);
  cr_assert(f.stop.stopped);
  cr_assert_eq(f.stop.reason, AG_REASON_REFUSED_REPLIES);
  cr_assert_eq(f.stop.step, 4);
  cr_assert_str_eq(f.stop.tool, "");
  /* the proposed calls never reach the identical-call breaker */
  cfg = config_json("{\"preset\": \"none\", \"loop\": "
                    "{\"identical_call_limit\": 2}}");
  f = audit_cfg(t, &cfg, false);
  cr_assert(!f.stop.stopped);
  /* twelve-factor's per-tool budget (3) does not count them under a tool
   * with no name (it did: " failed 3 times in a row") */
  f = audit(t, "twelve-factor");
  cr_assert(!f.stop.stopped, "stopped: %s", f.stop.message);
  ag_trajectory_free(t);
}

Test(replay, a_step_with_no_call_and_one_result_is_a_refused_reply) {
  /* mini-swe-agent's format errors recorded without rejected_by_harness:
   * the run used to be skipped ("0 calls but 1 results") */
  static const char run[] =
      "{\"outcome\":\"resolved\",\"steps\":["
      "{\"calls\":[{\"name\":\"bash\",\"args\":{\"command\":\"ls\"}}],"
      "\"results\":[{\"ok\":true,\"text\":\"a\"}]},"
      "{\"calls\":[],\"results\":[{\"ok\":false,\"text\":\"Please always "
      "provide EXACTLY ONE action, found 0 actions.\"}]},"
      "{\"calls\":[{\"name\":\"bash\",\"args\":{\"command\":\"ls\"}}],"
      "\"results\":[{\"ok\":true,\"text\":\"a\"}]}]}";
  ag_trajectory *t = parse_ok(run);
  cr_assert_eq(t->n_steps, 3);
  cr_assert(t->turns[0].steps[1].rejected);
  cr_assert_eq(t->turns[0].steps[1].n_results, 1);
  ag_config cfg = config_json("{\"preset\": \"none\", \"loop\": "
                              "{\"max_refused_replies\": 1}}");
  ag_audit_finding f = audit_cfg(t, &cfg, false);
  cr_assert(f.stop.stopped);
  cr_assert_eq(f.stop.reason, AG_REASON_REFUSED_REPLIES);
  cr_assert_eq(f.stop.step, 2);
  ag_trajectory_free(t);
  /* two results for no call is still an error */
  parse_fail("{\"steps\":[{\"calls\":[],\"results\":[{\"ok\":false},"
             "{\"ok\":false}]}]}",
             AG_EINVAL);
}

Test(replay, a_run_with_no_steps_is_a_run_not_stopped) {
  ag_trajectory *t = parse_ok("{\"outcome\":\"unresolved\",\"steps\":[]}");
  cr_assert_eq(t->n_steps, 0);
  cr_assert_eq(t->n_turns, 0);
  cr_assert_eq(t->outcome, AG_RUN_UNRESOLVED);
  ag_audit_finding f = audit(t, "default");
  cr_assert(!f.stop.stopped);
  cr_assert_eq(f.steps, 0);
  ag_trajectory_free(t);
  t = parse_ok("{\"messages\":[]}");
  cr_assert_eq(t->n_steps, 0);
  ag_trajectory_free(t);
}

Test(replay, replies_without_tool_calls_under_require_tool_call) {
  static const char chat[] = "[{\"role\":\"user\",\"content\":\"x\"},"
                             "{\"role\":\"assistant\",\"content\":\"hmm\"},"
                             "{\"role\":\"assistant\",\"content\":\"hmm\"},"
                             "{\"role\":\"assistant\",\"content\":\"hmm\"},"
                             "{\"role\":\"assistant\",\"content\":\"hmm\"},"
                             "{\"role\":\"assistant\",\"content\":\"hmm\"},"
                             "{\"role\":\"assistant\",\"content\":\"hmm\"}]";
  ag_trajectory *t = parse_ok(chat);
  cr_assert_eq(t->n_steps, 6);
  /* refused replies (forge: 5 in a row, as its 5 identical errors) */
  ag_audit_finding f = audit(t, "forge");
  cr_assert(f.stop.stopped);
  cr_assert_eq(f.stop.reason, AG_REASON_REFUSED_REPLIES);
  cr_assert_eq(f.stop.step, 5);
  f = audit(t, "default");
  cr_assert(!f.stop.stopped, "without require_tool_call a text reply is an "
                             "answer, not an error");
  ag_trajectory_free(t);
}

Test(replay, iteration_cap_counts_every_reply) {
  /* with every other mechanism off, only the cap can stop it */
  char *run = repeat_run(12, "step", "{}", "ok", true);
  ag_trajectory *t = parse_ok(run);
  ag_config cfg = config_json("{\"preset\": \"none\", \"loop\": "
                              "{\"max_iterations\": 10}}");
  ag_audit_finding f = audit_cfg(t, &cfg, false);
  cr_assert(f.stop.stopped);
  cr_assert_eq(f.stop.reason, AG_REASON_MAX_ITERATIONS);
  cr_assert_eq(f.stop.step, 11);
  cr_assert_eq(f.stop.call_index, -1);
  cr_assert_eq(f.stop.steps_after, 1);
  ag_trajectory_free(t);
  free(run);
}

Test(replay, turn_timeout_needs_timestamps) {
  static const char timed[] =
      "{\"steps\":["
      "{\"t_ms\":0,\"calls\":[{\"name\":\"a\",\"args\":{\"i\":1}}],"
      "\"results\":[{\"ok\":true,\"text\":\"\"}]},"
      "{\"t_ms\":4000,\"calls\":[{\"name\":\"a\",\"args\":{\"i\":2}}],"
      "\"results\":[{\"ok\":true,\"text\":\"\"}]},"
      "{\"t_ms\":9000,\"calls\":[{\"name\":\"a\",\"args\":{\"i\":3}}],"
      "\"results\":[{\"ok\":true,\"text\":\"\"}]},"
      "{\"user_msg_before\":\"next\",\"t_ms\":9500,\"calls\":[{\"name\":\"a\","
      "\"args\":{\"i\":4}}],\"results\":[{\"ok\":true,\"text\":\"\"}]}]}";
  ag_config cfg = config_json("{\"loop\": {\"max_turn_duration\": \"5s\"}}");
  ag_trajectory *t = parse_ok(timed);
  cr_assert(t->timed);
  ag_audit_finding f = audit_cfg(t, &cfg, false);
  cr_assert(f.stop.stopped);
  cr_assert_eq(f.stop.reason, AG_REASON_TURN_TIMEOUT);
  cr_assert_eq(f.stop.step, 3);
  ag_trajectory_free(t);
  /* the same run without timestamps: time stands still, no timeout */
  char *untimed = strdup(timed);
  for (char *p = strstr(untimed, "\"t_ms\""); p != NULL;
       p = strstr(p, "\"t_ms\""))
    memcpy(p, "\"x_ms\"", 6);
  t = parse_ok(untimed);
  cr_assert(!t->timed);
  f = audit_cfg(t, &cfg, false);
  cr_assert(!f.stop.stopped);
  ag_trajectory_free(t);
  free(untimed);
}

Test(replay, invalid_arguments_are_refused_replies) {
  /* A chat transcript whose arguments are not JSON: the call would not
   * have run live, whatever the recording says; a reply where nothing
   * could run is a refused reply, not a failing iteration. */
  static const char chat[] =
      "[{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"a\",\"function\":"
      "{\"name\":\"f\",\"arguments\":\"{oops\"}}]},"
      "{\"role\":\"tool\",\"tool_call_id\":\"a\",\"content\":\"fine\"},"
      "{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"b\",\"function\":"
      "{\"name\":\"f\",\"arguments\":\"{oops\"}}]},"
      "{\"role\":\"tool\",\"tool_call_id\":\"b\",\"content\":\"fine\"},"
      "{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c\",\"function\":"
      "{\"name\":\"f\",\"arguments\":\"{oops\"}}]},"
      "{\"role\":\"tool\",\"tool_call_id\":\"c\",\"content\":\"fine\"},"
      "{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"d\",\"function\":"
      "{\"name\":\"f\",\"arguments\":\"{oops\"}}]},"
      "{\"role\":\"tool\",\"tool_call_id\":\"d\",\"content\":\"fine\"}]";
  ag_trajectory *t = parse_ok(chat);
  ag_audit_finding f = audit(t, "hpd");
  cr_assert(!f.stop.stopped);
  ag_config cfg = config_json("{\"preset\": \"hpd\", \"loop\": "
                              "{\"max_refused_replies\": 4}}");
  f = audit_cfg(t, &cfg, false);
  cr_assert(f.stop.stopped);
  cr_assert_eq(f.stop.reason, AG_REASON_REFUSED_REPLIES);
  cr_assert_eq(f.stop.step, 4);
  ag_trajectory_free(t);
}
