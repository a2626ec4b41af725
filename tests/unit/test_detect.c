/*
 * tests/unit/test_detect.c - the detectors added for detection quality
 * (docs/detection.md): repeated call+result pairs (16), refused replies
 * (12), denied calls (13), empty replies (15), normalized errors (5), the
 * cycle detector in call_and_result scope, two strikes across the loop
 * mechanisms, and the identical-error nudge. Hand-made sequences, each
 * with what must trip and what must not. Time is an argument: no sleeps.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "agentguard.h"
#include "core/internal.h"

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

/* One iteration of one call with outcome `out`; returns the deciding
 * action (the check's when it did not allow the call). *ck gets the check. */
static ag_action call(ag_guard *g, const char *name, const char *args,
                      const char *text, ag_outcome out, ag_verdict *v,
                      ag_call_check *ck) {
  ag_call_check local;
  if (ck == NULL)
    ck = &local;
  ag_action a = ag_guard_begin_iteration(g, 0, v);
  if (a != AG_ALLOW)
    return a;
  ag_call c = {name, args, strlen(args)};
  a = ag_guard_check_calls(g, &c, 1, 0, ck, v);
  if (a != AG_ALLOW)
    return a;
  ag_result r = {name,
                 ck->valid ? ck->sig : NULL,
                 ck->action == AG_NUDGE ? AG_OUTCOME_SKIPPED
                 : !ck->valid           ? AG_OUTCOME_ERROR
                                        : out,
                 ck->action == AG_NUDGE || !ck->valid ? ck->message : text,
                 0,
                 AG_CAT__COUNT};
  r.text_len = strlen(r.text);
  ag_action rec = ag_guard_record_results(g, &r, 1, 0, v);
  if (ck->action == AG_NUDGE && rec == AG_ALLOW)
    return AG_NUDGE;
  return rec;
}

#define OK AG_OUTCOME_OK
#define ERR AG_OUTCOME_ERROR

/* ---- 16: the same call with the same result, anywhere in the turn ------- */

/* Progress (docs/detection.md): an edit between two runs of the same test
 * makes the second one new evidence, whatever the test prints; the same
 * failure again with nothing written in between is a repeat. */
Test(repeated, same_failing_test_between_edits_is_new_evidence) {
  ag_guard *g = make_json("{\"preset\": \"default\"}");
  ag_verdict v;
  /* the editor tool, sed -i and a heredoc into a file: each one an edit */
  const char *edits[][2] = {
      {"str_replace_editor",
       "{\"command\": \"str_replace\", \"path\": \"f.py\", \"n\": %d}"},
      {"bash", "{\"command\": \"sed -i 's/a/b%d/' f.py\"}"},
      {"bash", "{\"command\": \"cat > f.py <<'EOF'\\nx = %d\\nEOF\"}"}};
  for (int i = 1; i <= 12; i++) {
    char edit[128];
    snprintf(edit, sizeof(edit), edits[i % 3][1], i);
    cr_assert_eq(call(g, edits[i % 3][0], edit, "edited", OK, &v, NULL),
                 AG_ALLOW, "edit %d: %s", i, v.message);
    /* the runner's banner, then the same failure each time */
    ag_action a = call(g, "bash", "{\"command\": \"pytest t.py\"}",
                       "==== test session starts ====\nFAILED t.py::test_x - "
                       "AssertionError",
                       ERR, &v, NULL);
    cr_assert_eq(a, AG_ALLOW, "retest %d: %s", i, v.message);
  }
  ag_guard_free(g);
}

Test(repeated, same_failing_test_with_only_reads_between_stops_at_three) {
  ag_guard *g = make_json("{\"preset\": \"default\"}");
  ag_verdict v;
  const char *reads[][2] = {
      {"bash", "{\"command\": \"cat t.py | grep -n test_x 2>&1\"}"},
      {"str_replace_editor", "{\"command\": \"view\", \"path\": \"t.py\"}"},
      {"read_file", "{\"path\": \"t.py\"}"}};
  for (int i = 0; i < 3; i++) {
    cr_assert_eq(
        call(g, reads[i][0], reads[i][1], "def test_x(): ...", OK, &v, NULL),
        AG_ALLOW);
    ag_action a = call(g, "bash", "{\"command\": \"pytest t.py\"}",
                       "FAILED t.py::test_x - AssertionError", ERR, &v, NULL);
    if (i < 2) {
      cr_assert_eq(a, AG_ALLOW, "repeat %d", i);
    } else {
      cr_assert_eq(a, AG_STOP);
      cr_assert_eq(v.reason, AG_REASON_REPEATED_RESULTS);
      cr_assert_str_eq(v.tool, "bash");
      cr_assert(strstr(v.message, "bash failed 3 times in this turn") != NULL,
                "%s", v.message);
    }
  }
  ag_guard_free(g);
}

/* A turn's start forgets every pair of the turn before, whether the turn
 * took few slots (emptied one by one) or more than the guard remembers
 * (the whole table emptied). */
Test(repeated, a_new_turn_forgets_every_pair) {
  const int others[] = {5, 63, 64, 65, 300};
  for (size_t t = 0; t < sizeof(others) / sizeof(others[0]); t++) {
    ag_guard *g = make_json(
        "{\"preset\": \"default\", \"loop\": {\"max_iterations\": 0}}");
    ag_verdict v;
    for (int turn = 0; turn < 3; turn++) {
      if (turn > 0)
        ag_guard_begin_turn(g, 0);
      /* the same failure twice a turn: the third would stop a turn */
      for (int i = 0; i < 2; i++) {
        cr_assert_eq(call(g, "read_file", "{\"path\": \"t.py\"}",
                          "def test_x(): ...", OK, &v, NULL),
                     AG_ALLOW);
        cr_assert_eq(call(g, "bash", "{\"command\": \"pytest t.py\"}",
                          "FAILED t.py::test_x - AssertionError", ERR, &v,
                          NULL),
                     AG_ALLOW, "%d others, turn %d, failure %d: %s", others[t],
                     turn, i + 1, v.message);
      }
      for (int i = 0; i < others[t]; i++) { /* distinct pairs */
        char args[64];
        snprintf(args, sizeof args, "{\"path\": \"f%d.py\"}", i);
        cr_assert_eq(call(g, "read_file", args, "x = 1", OK, &v, NULL),
                     AG_ALLOW, "%d others, turn %d, read %d: %s", others[t],
                     turn, i, v.message);
      }
    }
    /* and the count still works in the last turn */
    cr_assert_eq(call(g, "bash", "{\"command\": \"pytest t.py\"}",
                      "FAILED t.py::test_x - AssertionError", ERR, &v, NULL),
                 AG_STOP, "%d others", others[t]);
    cr_assert_eq(v.reason, AG_REASON_REPEATED_RESULTS);
    ag_guard_free(g);
  }
}

Test(repeated, a_pass_in_between_starts_the_count_again) {
  ag_guard *g = make_json("{\"preset\": \"default\"}");
  ag_verdict v;
  const char *cmd = "{\"command\": \"pytest t.py\"}";
  const char *fail = "FAILED t.py::test_x - AssertionError";
  cr_assert_eq(call(g, "bash", cmd, fail, ERR, &v, NULL), AG_ALLOW);
  cr_assert_eq(call(g, "ls", "{}", "t.py", OK, &v, NULL), AG_ALLOW);
  cr_assert_eq(call(g, "bash", cmd, fail, ERR, &v, NULL), AG_ALLOW);
  cr_assert_eq(call(g, "bash", cmd, "1 passed", OK, &v, NULL), AG_ALLOW);
  cr_assert_eq(call(g, "bash", cmd, fail, ERR, &v, NULL), AG_ALLOW, "%s",
               v.message);
  cr_assert_eq(call(g, "ls", "{}", "t.py", OK, &v, NULL), AG_ALLOW);
  cr_assert_eq(call(g, "bash", cmd, fail, ERR, &v, NULL), AG_ALLOW, "%s",
               v.message);
  /* and from there the count goes on: the third since the pass stops */
  cr_assert_eq(call(g, "ls", "{}", "t.py", OK, &v, NULL), AG_ALLOW);
  cr_assert_eq(call(g, "bash", cmd, fail, ERR, &v, NULL), AG_STOP);
  ag_guard_free(g);
}

Test(repeated, edit_test_workflow_with_changing_results_never_stops) {
  ag_guard *g = make_json("{\"preset\": \"default\"}");
  ag_verdict v;
  for (int i = 1; i <= 40; i++) {
    char edit[64], out[96];
    snprintf(edit, sizeof(edit), "{\"line\": %d}", i);
    snprintf(out, sizeof(out), "FAILED test_%c - AssertionError",
             'a' + (i % 26));
    cr_assert_eq(call(g, "edit", edit, "edited", OK, &v, NULL), AG_ALLOW);
    cr_assert_eq(call(g, "bash", "{\"cmd\": \"pytest\"}", out, ERR, &v, NULL),
                 AG_ALLOW, "iteration %d: %s", i, v.message);
  }
  ag_guard_free(g);
}

Test(repeated, errors_differing_in_numbers_are_the_same_error) {
  ag_guard *g = make_json("{\"preset\": \"default\"}");
  ag_verdict v;
  const char *texts[] = {"/bin/bash: line 62215: javac: command not found",
                         "/bin/bash: line 62230: javac: command not found",
                         "/bin/bash: line 62245: javac: command not found"};
  for (int i = 0; i < 3; i++) {
    call(g, "ls", "{}", "a b", OK, &v, NULL); /* something in between */
    ag_action a =
        call(g, "bash", "{\"c\":\"javac x\"}", texts[i], ERR, &v, NULL);
    cr_assert_eq(a, i < 2 ? AG_ALLOW : AG_STOP, "call %d", i);
  }
  cr_assert_eq(v.reason, AG_REASON_REPEATED_RESULTS);
  ag_guard_free(g);
}

Test(repeated, different_words_are_different_errors) {
  ag_guard *g = make_json("{\"preset\": \"default\"}");
  ag_verdict v;
  const char *texts[] = {"No such file: alpha.py", "No such file: beta.py",
                         "No such file: gamma.py", "No such file: delta.py"};
  for (int i = 0; i < 4; i++) {
    call(g, "ls", "{}", "a b", OK, &v, NULL);
    cr_assert_eq(call(g, "cat", "{\"p\":1}", texts[i], ERR, &v, NULL), AG_ALLOW,
                 "call %d", i);
  }
  ag_guard_free(g);
}

Test(repeated, same_success_five_times_in_a_turn) {
  ag_guard *g = make_json("{\"preset\": \"default\"}");
  ag_verdict v;
  /* nothing new in between: the same few pairs in an irregular order (no
   * block repeats back to back, so the cycle detector sees nothing) */
  static const char *const seq[] = {"r", "t1", "r", "t2", "r",  "t1", "t2",
                                    "r", "t1", "r", "t2", "t2", "r",  "t1",
                                    "r", "t1", "r", "t2", "r"};
  int reads = 0;
  ag_action a = AG_ALLOW;
  for (size_t i = 0; i < sizeof(seq) / sizeof(seq[0]) && a == AG_ALLOW; i++) {
    if (strcmp(seq[i], "r") == 0) {
      reads++;
      a = call(g, "read", "{\"p\":\"a.txt\"}", "hello", OK, &v, NULL);
    } else {
      a = call(g, "think",
               strcmp(seq[i], "t1") == 0 ? "{\"n\":1}" : "{\"n\":2}", "", OK,
               &v, NULL);
    }
  }
  cr_assert_eq(a, AG_STOP);
  cr_assert_eq(v.reason, AG_REASON_REPEATED_RESULTS, "%s", v.message);
  /* reads 2 and 3 each follow a first sight (t1, t2) and restart at 1;
   * reads 3 to 7 are the five with nothing new in between */
  cr_assert_eq(reads, 7, "stopped at read %d", reads);
  ag_guard_free(g);
  /* something new in between each time: no stop */
  g = make_json("{\"preset\": \"default\"}");
  for (int i = 1; i <= 10; i++) {
    char other[32];
    snprintf(other, sizeof(other), "{\"n\": %d}", i);
    call(g, "think", other, "", OK, &v, NULL);
    cr_assert_eq(call(g, "read", "{\"p\":\"a.txt\"}", "hello", OK, &v, NULL),
                 AG_ALLOW, "read %d: %s", i, v.message);
  }
  ag_guard_free(g);
}

Test(repeated, successes_compare_exactly) {
  /* a number that changes in a successful result is progress, and so the
   * identical sleep between polls never adds up (call_and_result scope: in
   * call scope the poll-sleep alternation is a cycle of calls) */
  ag_guard *g = make_json("{\"preset\": \"default\", \"loop\": "
                          "{\"identical_call_scope\": \"call_and_result\"}}");
  ag_verdict v;
  for (int i = 1; i <= 12; i++) {
    char out[32];
    snprintf(out, sizeof(out), "job 42: %d%% done", i * 8);
    cr_assert_eq(call(g, "sleep", "{\"s\": 5}", "slept", OK, &v, NULL),
                 AG_ALLOW, "sleep %d: %s", i, v.message);
    cr_assert_eq(call(g, "poll", "{\"job\": 42}", out, OK, &v, NULL), AG_ALLOW,
                 "poll %d: %s", i, v.message);
  }
  ag_guard_free(g);
}

Test(repeated, new_turn_and_off) {
  ag_guard *g = make_json("{\"preset\": \"none\", \"loop\": "
                          "{\"repeated_failure_limit\": 2}}");
  ag_verdict v;
  cr_assert_eq(call(g, "t", "{}", "boom", ERR, &v, NULL), AG_ALLOW);
  ag_guard_begin_turn(g, 0);
  cr_assert_eq(call(g, "t", "{}", "boom", ERR, &v, NULL), AG_ALLOW);
  cr_assert_eq(call(g, "t", "{}", "boom", ERR, &v, NULL), AG_STOP);
  ag_guard_free(g);
  g = make_json("{\"preset\": \"none\"}");
  for (int i = 0; i < 20; i++)
    cr_assert_eq(call(g, "t", "{}", "boom", ERR, &v, NULL), AG_ALLOW);
  ag_guard_free(g);
}

/* ---- 5: identical errors compare normalized ----------------------------- */

Test(identical_errors, numbers_addresses_and_tmp_paths_are_noise) {
  ag_guard *g = make_json("{\"preset\": \"none\", \"errors\": "
                          "{\"max_identical_errors\": 4, "
                          "\"normalize_errors\": true}}");
  ag_verdict v;
  const char *texts[] = {
      "Segfault at 0x7ffd1234 in /tmp/tmpab12/run.py line 10 (pid 411)",
      "Segfault at 0x7ffd9999 in /tmp/tmpzz99/run.py line 11 (pid 412)",
      "Segfault  at 0xdeadbeef in /tmp/x/run.py line 12 (pid 5000)",
      "Segfault at 0x1 in /tmp/q/run.py line 999 (pid 1)"};
  for (int i = 0; i < 4; i++) {
    char args[32];
    snprintf(args, sizeof(args), "{\"try\": %d}", i);
    cr_assert_eq(call(g, "run", args, texts[i], ERR, &v, NULL),
                 i < 3 ? AG_ALLOW : AG_STOP, "error %d", i);
  }
  cr_assert_eq(v.reason, AG_REASON_IDENTICAL_ERRORS);
  ag_guard_free(g);
  /* without normalize_errors (the seeds' presets: Forge compares hashes of
   * the messages) a changed number is a different error */
  g = make_json("{\"preset\": \"forge\", \"errors\": "
                "{\"max_identical_errors\": 2}}");
  cr_assert_eq(call(g, "run", "{}", texts[0], ERR, &v, NULL), AG_ALLOW);
  cr_assert_eq(call(g, "run", "{}", texts[1], ERR, &v, NULL), AG_ALLOW);
  cr_assert_eq(call(g, "run", "{}", texts[1], ERR, &v, NULL), AG_STOP);
  ag_guard_free(g);
}

Test(identical_errors, a_changed_word_breaks_the_run) {
  ag_guard *g = make_json("{\"preset\": \"none\", \"errors\": "
                          "{\"max_identical_errors\": 2}}");
  ag_verdict v;
  cr_assert_eq(call(g, "run", "{\"a\":1}", "Error: file one", ERR, &v, NULL),
               AG_ALLOW);
  cr_assert_eq(call(g, "run", "{\"a\":2}", "Error: file two", ERR, &v, NULL),
               AG_ALLOW);
  cr_assert_eq(call(g, "run", "{\"a\":3}", "Error: file two", ERR, &v, NULL),
               AG_STOP);
  ag_guard_free(g);
}

/* ---- 12: refused replies ------------------------------------------------ */

Test(refused, counts_in_a_row_and_is_no_tools_error) {
  /* twelve-factor's tool budget (3) and total budget (10) never see them */
  ag_guard *g = make_json("{\"preset\": \"twelve-factor\", \"errors\": "
                          "{\"on_trip\": \"stop\"}, \"loop\": "
                          "{\"max_refused_replies\": 4}}");
  ag_verdict v;
  for (int i = 0; i < 3; i++) {
    cr_assert_eq(ag_guard_begin_iteration(g, 0, &v), AG_ALLOW);
    cr_assert_eq(ag_guard_record_refused(g, "found 2 actions", 15, 0, &v),
                 AG_ALLOW, "refused %d: %s", i, v.message);
  }
  /* a reply where a call ran resets the run */
  cr_assert_eq(call(g, "ls", "{}", "a", OK, &v, NULL), AG_ALLOW);
  for (int i = 0; i < 4; i++) {
    cr_assert_eq(ag_guard_begin_iteration(g, 0, &v), AG_ALLOW);
    ag_action a = ag_guard_record_refused(g, "found 0 actions", 15, 0, &v);
    cr_assert_eq(a, i < 3 ? AG_ALLOW : AG_STOP, "refused %d", i);
  }
  cr_assert_eq(v.reason, AG_REASON_REFUSED_REPLIES);
  cr_assert_str_eq(v.tool, "");
  cr_assert_str_eq(v.message, "4 replies in a row ran nothing (no usable tool "
                              "call)");
  ag_guard_free(g);
}

Test(refused, is_no_failing_iteration) {
  ag_guard *g = make_json("{\"preset\": \"hpd\"}");
  ag_verdict v;
  /* 3 failing iterations, then refused replies: the 4th failing iteration
   * would trip consecutive_errors; refused replies do not count */
  for (int i = 0; i < 3; i++)
    cr_assert_eq(call(g, "t", "{}", "boom", ERR, &v, NULL), AG_ALLOW);
  for (int i = 0; i < 5; i++) {
    ag_guard_begin_iteration(g, 0, &v);
    cr_assert_eq(ag_guard_record_refused(g, "no call", 7, 0, &v), AG_ALLOW);
  }
  ag_guard_free(g);
}

Test(refused, a_batch_with_no_json_arguments_ran_nothing) {
  ag_guard *g = make_json("{\"preset\": \"none\", \"loop\": "
                          "{\"max_refused_replies\": 2}, \"errors\": "
                          "{\"max_tool_errors\": 1}}");
  ag_verdict v;
  ag_call_check ck;
  /* arguments that are not JSON: not the tool's error (budget 1 untouched) */
  cr_assert_eq(call(g, "t", "{oops", "", OK, &v, &ck), AG_ALLOW, "%s",
               v.message);
  cr_assert(!ck.valid);
  cr_assert_eq(call(g, "t", "{oops", "", OK, &v, &ck), AG_STOP);
  cr_assert_eq(v.reason, AG_REASON_REFUSED_REPLIES);
  ag_guard_free(g);
}

Test(refused, the_error_context_still_says_no_tool_call) {
  ag_guard *g = make_json("{\"preset\": \"forge\"}");
  ag_verdict v;
  ag_guard_begin_iteration(g, 0, &v);
  ag_guard_record_refused(g, "Your response contained no tool call.", 37, 0,
                          &v);
  char buf[1024];
  cr_assert_gt(ag_guard_error_context(g, AG_RECOVER_NO_TOOL_CALL, NULL, 0, buf,
                                      sizeof(buf)),
               0);
  cr_assert(strstr(buf, "no tool call") != NULL, "%s", buf);
  /* forge: the fifth refused reply in a row stops, as its 5 identical
   * errors did */
  for (int i = 0; i < 4; i++) {
    ag_guard_begin_iteration(g, 0, &v);
    ag_guard_record_refused(g, "x", 1, 0, &v);
  }
  cr_assert_eq(v.action, AG_STOP);
  cr_assert_eq(v.reason, AG_REASON_REFUSED_REPLIES);
  ag_guard_free(g);
}

/* ---- 13: denied calls ---------------------------------------------------- */

Test(denied, three_in_a_row_stop_and_a_run_call_resets) {
  ag_guard *g = make_json("{\"preset\": \"default\"}");
  ag_verdict v;
  char args[32];
  for (int i = 0; i < 2; i++) {
    snprintf(args, sizeof(args), "{\"cmd\": %d}", i);
    cr_assert_eq(call(g, "rm", args, "Tool call rejected: no",
                      AG_OUTCOME_DENIED, &v, NULL),
                 AG_ALLOW);
  }
  cr_assert_eq(call(g, "ls", "{}", "a", OK, &v, NULL), AG_ALLOW);
  for (int i = 0; i < 3; i++) {
    snprintf(args, sizeof(args), "{\"cmd\": %d}", 10 + i);
    ag_action a = call(g, "rm", args, "Tool call rejected: no",
                       AG_OUTCOME_DENIED, &v, NULL);
    cr_assert_eq(a, i < 2 ? AG_ALLOW : AG_STOP, "denial %d", i);
  }
  cr_assert_eq(v.reason, AG_REASON_DENIED_CALLS);
  cr_assert(strstr(v.message, "3 tool calls in a row were denied") != NULL);
  ag_guard_free(g);
}

Test(denied, denials_are_no_errors) {
  ag_guard *g = make_json("{\"preset\": \"hpd\"}");
  ag_verdict v;
  for (int i = 0; i < 10; i++) {
    char args[32];
    snprintf(args, sizeof(args), "{\"f\": %d}", i);
    cr_assert_eq(call(g, "rm", args, "Tool call rejected: no",
                      AG_OUTCOME_DENIED, &v, NULL),
                 AG_ALLOW);
  }
  ag_guard_free(g);
}

/* ---- 15: empty replies -------------------------------------------------- */

Test(empty, first_nudges_second_stops_a_call_resets) {
  ag_guard *g = make_json("{\"preset\": \"default\"}");
  ag_verdict v;
  ag_guard_begin_iteration(g, 0, &v);
  cr_assert_eq(ag_guard_record_empty(g, 0, &v), AG_NUDGE);
  cr_assert_str_eq(v.message, AG_EMPTY_REPLY_NOTE);
  cr_assert_eq(call(g, "ls", "{}", "a", OK, &v, NULL), AG_ALLOW);
  ag_guard_begin_iteration(g, 0, &v);
  cr_assert_eq(ag_guard_record_empty(g, 0, &v), AG_NUDGE);
  ag_guard_begin_iteration(g, 0, &v);
  cr_assert_eq(ag_guard_record_empty(g, 0, &v), AG_STOP);
  cr_assert_eq(v.reason, AG_REASON_EMPTY_REPLY);
  ag_guard_free(g);
  g = make_json("{\"preset\": \"none\"}");
  cr_assert_eq(ag_guard_record_empty(g, 0, &v), AG_ALLOW);
  ag_guard_free(g);
}

/* ---- 4 in call_and_result scope ----------------------------------------- */

Test(cycles, polling_with_changing_status_is_no_cycle) {
  ag_guard *g = make_json("{\"preset\": \"default\", \"loop\": "
                          "{\"identical_call_scope\": \"call_and_result\"}}");
  ag_verdict v;
  for (int i = 0; i < 30; i++) {
    char st[32];
    snprintf(st, sizeof(st), "running, %d%%", i * 3);
    cr_assert_eq(call(g, "poll", "{\"job\":1}", st, OK, &v, NULL), AG_ALLOW,
                 "poll %d: %s", i, v.message);
    cr_assert_eq(call(g, "sleep", "{\"s\":1}", "", OK, &v, NULL), AG_ALLOW,
                 "sleep %d: %s", i, v.message);
  }
  ag_guard_free(g);
}

Test(cycles, repeating_results_make_a_cycle_in_that_scope) {
  ag_guard *g = make_json("{\"preset\": \"none\", \"loop\": "
                          "{\"identical_call_scope\": \"call_and_result\", "
                          "\"cycle_limit\": 3}}");
  ag_verdict v;
  ag_action a = AG_ALLOW;
  int calls = 0;
  while (a == AG_ALLOW && calls < 20) {
    a = call(g, "poll", "{\"job\":1}", "running", OK, &v, NULL);
    calls++;
    if (a == AG_ALLOW) {
      a = call(g, "sleep", "{\"s\":1}", "", OK, &v, NULL);
      calls++;
    }
  }
  cr_assert_eq(a, AG_STOP);
  cr_assert_eq(v.reason, AG_REASON_CYCLIC_CALLS);
  cr_assert_eq(calls, 6,
               "the call completing the 3rd repetition, after it ran");
  ag_guard_free(g);
}

/* ---- two strikes per turn across the loop mechanisms -------------------- */

Test(nudges, an_identical_call_nudge_then_a_cycle_stops) {
  ag_guard *g = make_json("{\"preset\": \"none\", \"loop\": "
                          "{\"identical_call_limit\": 3, \"cycle_limit\": 3, "
                          "\"nudge_before_stop\": true}}");
  ag_verdict v;
  ag_call_check ck;
  call(g, "a", "{}", "x", OK, &v, NULL);
  call(g, "a", "{}", "x", OK, &v, NULL);
  cr_assert_eq(call(g, "a", "{}", "x", OK, &v, &ck), AG_NUDGE);
  cr_assert_eq(ck.reason, AG_REASON_IDENTICAL_CALLS);
  /* now an A-B cycle: its first trip is the second strike */
  ag_action a = AG_ALLOW;
  for (int i = 0; i < 6 && a == AG_ALLOW; i++) {
    a = call(g, "b", "{}", "y", OK, &v, NULL);
    if (a == AG_ALLOW)
      a = call(g, "c", "{}", "z", OK, &v, NULL);
  }
  cr_assert_eq(a, AG_STOP, "a second nudge instead of a stop");
  cr_assert_eq(v.reason, AG_REASON_CYCLIC_CALLS);
  ag_guard_free(g);
}

Test(nudges, identical_errors_nudge_then_hold_the_same_call) {
  ag_guard *g = make_json("{\"preset\": \"none\", \"errors\": "
                          "{\"max_identical_errors\": 3}, \"loop\": "
                          "{\"nudge_before_stop\": true}}");
  ag_verdict v;
  ag_call_check ck;
  cr_assert_eq(call(g, "t", "{\"a\":1}", "boom", ERR, &v, NULL), AG_ALLOW);
  cr_assert_eq(call(g, "t", "{\"a\":2}", "boom", ERR, &v, NULL), AG_ALLOW);
  cr_assert_eq(call(g, "t", "{\"a\":3}", "boom", ERR, &v, NULL), AG_NUDGE);
  cr_assert_eq(v.reason, AG_REASON_IDENTICAL_ERRORS);
  cr_assert(strstr(v.message, "Potential loop detected") != NULL);
  /* the same call again is refused, not run */
  cr_assert_eq(call(g, "t", "{\"a\":3}", "boom", ERR, &v, &ck), AG_NUDGE);
  cr_assert_eq(ck.action, AG_NUDGE);
  cr_assert(strstr(ck.message, "This call was not run") != NULL, "%s",
            ck.message);
  /* the next identical error stops the turn */
  cr_assert_eq(call(g, "t", "{\"a\":4}", "boom", ERR, &v, NULL), AG_STOP);
  cr_assert_eq(v.reason, AG_REASON_IDENTICAL_ERRORS);
  ag_guard_free(g);
}

Test(nudges, resume_clears_the_strike) {
  ag_guard *g = make_json("{\"preset\": \"none\", \"loop\": "
                          "{\"identical_call_limit\": 2, "
                          "\"nudge_before_stop\": true}}");
  ag_verdict v;
  call(g, "a", "{}", "x", OK, &v, NULL);
  cr_assert_eq(call(g, "a", "{}", "x", OK, &v, NULL), AG_NUDGE);
  call(g, "a", "{}", "x", OK, &v, NULL);
  cr_assert_eq(call(g, "a", "{}", "x", OK, &v, NULL), AG_STOP);
  ag_guard_resume(g, AG_REASON_IDENTICAL_CALLS);
  call(g, "a", "{}", "x", OK, &v, NULL);
  cr_assert_eq(call(g, "a", "{}", "x", OK, &v, NULL), AG_NUDGE);
  ag_guard_free(g);
}

/* ---- the mechanism table ------------------------------------------------ */

Test(table, every_reason_has_a_distinct_name) {
  for (int a = 1; a < AG_REASON__COUNT; a++) {
    cr_assert_str_neq(ag_reason_name((ag_reason)a), "unknown");
    for (int b = a + 1; b < AG_REASON__COUNT; b++)
      cr_assert_str_neq(ag_reason_name((ag_reason)a),
                        ag_reason_name((ag_reason)b));
  }
  cr_assert_str_eq(ag_reason_name(AG_REASON_REPEATED_RESULTS),
                   "repeated_results");
}

Test(repeated, a_failure_is_remembered_across_a_hundred_other_pairs) {
  /* the table is bounded (512 pairs) but forgets the least recently seen
   * first: a failure repeated between 100 distinct successes still counts */
  ag_guard *g = make_json("{\"preset\": \"none\", \"loop\": "
                          "{\"repeated_failure_limit\": 3}}");
  ag_verdict v;
  ag_action a = AG_ALLOW;
  for (int round = 0; round < 3; round++) {
    for (int i = 0; i < 100; i++) {
      char args[32];
      snprintf(args, sizeof(args), "{\"r\": %d, \"i\": %d}", round, i);
      cr_assert_eq(call(g, "read", args, "text", OK, &v, NULL), AG_ALLOW);
    }
    a = call(g, "test", "{}", "FAILED", ERR, &v, NULL);
  }
  cr_assert_eq(a, AG_STOP);
  cr_assert_eq(v.reason, AG_REASON_REPEATED_RESULTS);
  ag_guard_free(g);
}

Test(dump, credentials_in_error_texts_are_redacted) {
  ag_guard *g = make_json("{\"preset\": \"default\"}");
  ag_verdict v;
  call(g, "curl", "{}",
       "401 for Authorization: Bearer abcdefghijklmnop0123456789 and key "
       "sk-proj-ABCDEFGHIJKLMNOPQRSTUV",
       ERR, &v, NULL);
  char *d = NULL;
  cr_assert_eq(ag_guard_dump(g, &d, NULL), AG_OK);
  cr_assert(strstr(d, "abcdefghijklmnop0123456789") == NULL, "%s", d);
  cr_assert(strstr(d, "ABCDEFGHIJKLMNOPQRSTUV") == NULL, "%s", d);
  cr_assert(strstr(d, "[REDACTED]") != NULL, "%s", d);
  json_t *parsed = json_loads(d, 0, NULL);
  cr_assert_not_null(parsed, "still JSON: %s", d);
  json_decref(parsed);
  ag_free(d);
  char *rec = NULL;
  cr_assert_eq(ag_guard_escalation_record(g, NULL, &rec, NULL), AG_OK);
  cr_assert(strstr(rec, "abcdefghijklmnop0123456789") == NULL, "%s", rec);
  ag_free(rec);
  ag_guard_free(g);
}

/* ---- progress: which calls change the world ----------------------------- */

Test(progress, calls_that_change_the_world) {
  static const struct {
    const char *name, *args;
    bool changes;
  } cases[] = {
      /* read-only by name, any case or spelling */
      {"read_file", "{\"path\":\"a\"}", false},
      {"Read", "{}", false},
      {"getUser", "{}", false},
      {"get_reservation_details", "{}", false},
      {"search_dir", "{}", false},
      {"find_file", "{}", false},
      {"open", "{}", false},
      {"scroll_down", "{}", false},
      {"think", "{}", false},
      /* an editor: view reads, every other command writes */
      {"str_replace_editor", "{\"command\":\"view\",\"path\":\"a\"}", false},
      {"str_replace_editor", "{\"command\":\"str_replace\"}", true},
      {"str_replace_based_edit_tool", "{\"command\":\"create\"}", true},
      {"edit", "{\"range\":\"1:2\"}", true},
      {"Edit", "{}", true},
      {"create", "{}", true},
      {"update_reservation_flights", "{}", true},
      {"checkout", "{}", true},     /* not "check": no read prefix */
      {"mystery_tool", "{}", true}, /* not known to be read-only */
      /* shells: reading commands */
      {"bash", "{\"command\":\"ls -la && cat a.py | grep -n foo\"}", false},
      {"bash", "{\"command\":\"cd /repo; git diff; git status\"}", false},
      {"bash", "{\"command\":\"pytest tests/test_a.py -x 2>&1 | tail -20\"}",
       false},
      {"bash", "{\"command\":\"python -m pytest -q\"}", false},
      {"bash", "{\"command\":\"./tests/runtests.py queries\"}", false},
      {"bash", "{\"command\":\"mvn -q test\"}", false},
      {"bash", "{\"command\":\"sed -n '1,20p' a.py\"}", false},
      {"bash", "{\"command\":\"find . -name '*.py' > /dev/null\"}", false},
      {"Bash", "{\"command\":\"timeout 10 grep -r x .\"}", false},
      /* shells: writing or unknown */
      {"bash", "{\"command\":\"sed -i 's/a/b/' a.py\"}", true},
      {"bash", "{\"command\":\"echo x > a.py\"}", true},
      {"bash", "{\"command\":\"cat >> a.py <<'EOF'\\nx\\nEOF\"}", true},
      {"bash", "{\"command\":\"git apply p.diff\"}", true},
      {"bash", "{\"command\":\"git checkout -- a.py\"}", true},
      {"bash", "{\"command\":\"ls | tee out.txt\"}", true},
      {"bash", "{\"command\":\"find . -name x -delete\"}", true},
      {"bash", "{\"command\":\"python reproduce.py\"}", true},
      {"bash", "{\"command\":\"rm -rf build\"}", true},
      {"bash", "{\"cmd\":\"pip install x\"}", true},
      {"bash", "{}", true},              /* no command: unknown */
      {"bash", "{\"command\":5}", true}, /* not a string */
      /* only the top level's command counts, spaced or not, escaped */
      {"bash", "{\"env\":{\"command\":\"ls\"},\"command\":\"rm x\"}", true},
      {"bash", "{\"env\":{\"command\":\"rm x\"},\"command\":\"ls\"}", false},
      {"bash", "{ \"timeout\" : 5 , \"command\" : \"cat a.py\" }", false},
      {"bash", "{\"command\":\"ls \\\"a b\\\" > \\\"c\\\"\"}", true},
      {"bash", "{\"command\":\"grep -n \\\"x > y\\\" a.py\"}",
       true}, /* a '>' counts even quoted: errs to change */
      {"str_replace_editor", "{\"path\":\"a\",\"command\":\"view\"}", false},
  };
  /* from the text, and from the tape the guard's signature leaves */
  ag__jcs *j = NULL;
  cr_assert_eq(ag__jcs_new(&j, 1 << 16, 1 << 12, 64, NULL), AG_OK);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const char *name = cases[i].name, *args = cases[i].args;
    cr_expect_eq(ag__call_changes_state(name, strlen(name), args, strlen(args)),
                 cases[i].changes, "%s %s", name, args);
    size_t nt;
    cr_assert_eq(ag__jcs_tape(j, args, strlen(args), &nt, NULL), AG_OK);
    cr_expect_eq(ag__args_change_state(ag__tool_kind_of(name, strlen(name)),
                                       args, strlen(args), j),
                 cases[i].changes, "%s %s (tape)", name, args);
  }
  ag__jcs_free(j);
}

/* ---- information and malfunctions (errors.counted_failures) ------------ */

static const char *const repro_fails =
    "Traceback (most recent call last):\n  File \"/workspace/repro.py\", "
    "line 4, in <module>\n    assert parse('1e3') == 1000.0\nAssertionError";

/* A reproduction script that fails on purpose, run twice, then the editor
 * misused twice (old_str missing, create on an existing file), then the
 * fix: four failing iterations in a row, two of them information. */
Test(information, a_failing_repro_then_editor_misuse_does_not_stop) {
  ag_guard *g = make_json("{\"preset\": \"default\"}");
  ag_verdict v;
  const char *run = "{\"command\": \"python repro.py\"}";
  cr_assert_eq(call(g, "bash", run, repro_fails, ERR, &v, NULL), AG_ALLOW);
  cr_assert_eq(call(g, "bash", "{\"command\": \"python -X dev repro.py\"}",
                    repro_fails, ERR, &v, NULL),
               AG_ALLOW);
  cr_assert_eq(call(g, "str_replace_editor",
                    "{\"command\": \"str_replace\", \"path\": \"p.py\"}",
                    "Parameter `old_str` is required for command: "
                    "str_replace.",
                    ERR, &v, NULL),
               AG_ALLOW, "%s", v.message);
  cr_assert_eq(call(g, "str_replace_editor",
                    "{\"command\": \"create\", \"path\": \"p.py\"}",
                    "Invalid `path` parameter: /workspace/p.py. File already "
                    "exists at: /workspace/p.py. Cannot overwrite files "
                    "using command `create`.",
                    ERR, &v, NULL),
               AG_ALLOW, "%s", v.message);
  cr_assert_eq(call(g, "str_replace_editor",
                    "{\"command\": \"str_replace\", \"path\": \"p.py\", "
                    "\"old_str\": \"a\", \"new_str\": \"b\"}",
                    "The file p.py has been edited.", OK, &v, NULL),
               AG_ALLOW);
  ag_guard_free(g);
}

/* The same four failing iterations, every one a malfunction: stopped, as
 * before. And the preset that counts every failure stops the repro run. */
Test(information, malfunctions_in_a_row_still_stop) {
  ag_guard *g = make_json("{\"preset\": \"default\"}");
  ag_verdict v;
  const char *texts[] = {"bash: line 1: pytets: command not found",
                         "Parameter `old_str` is required for command: "
                         "str_replace.",
                         "No replacement was performed, old_str `x` did not "
                         "appear verbatim in /workspace/p.py.",
                         "bash: line 1: mvn: command not found"};
  for (int i = 0; i < 4; i++) {
    char args[64];
    snprintf(args, sizeof args, "{\"try\": %d}", i);
    ag_action a = call(g, "bash", args, texts[i], ERR, &v, NULL);
    cr_assert_eq(a, i < 3 ? AG_ALLOW : AG_STOP, "%d: %s", i, v.message);
  }
  cr_assert_eq(v.reason, AG_REASON_CONSECUTIVE_ERRORS);
  ag_guard_free(g);
  g = make_json("{\"preset\": \"default\", \"errors\": {\"counted_failures\": "
                "\"all\"}}");
  for (int i = 0; i < 4; i++) {
    char args[64];
    snprintf(args, sizeof args, "{\"command\": \"python repro.py %d\"}", i);
    ag_action a = call(g, "bash", args, repro_fails, ERR, &v, NULL);
    cr_assert_eq(a, i < 3 ? AG_ALLOW : AG_STOP, "%d: %s", i, v.message);
  }
  ag_guard_free(g);
}

/* Information is no malfunction, but the same failure of the same call
 * with nothing changed in between is still a repeat (16). */
Test(information, the_same_failing_run_with_nothing_changed_stops) {
  ag_guard *g = make_json("{\"preset\": \"default\"}");
  ag_verdict v;
  const char *run = "{\"command\": \"python repro.py\"}";
  cr_assert_eq(call(g, "bash", run, repro_fails, ERR, &v, NULL), AG_ALLOW);
  cr_assert_eq(call(g, "bash", run, repro_fails, ERR, &v, NULL), AG_ALLOW);
  cr_assert_eq(call(g, "bash", run, repro_fails, ERR, &v, NULL), AG_STOP);
  cr_assert_eq(v.reason, AG_REASON_REPEATED_RESULTS);
  ag_guard_free(g);
}

/* What is information and what is a malfunction (src/core/failure.c). */
Test(information, categories_and_traces) {
  static const struct {
    const char *text;
    bool info;
  } cases[] = {
      {"FAILED tests/test_x.py::test_total - assert 19.99 == 20.0", true},
      {"Traceback (most recent call last):\n  File \"r.py\", line 2, in "
       "<module>\n    x = 1 + 'a'\nTypeError: unsupported operand",
       true},
      {"src/Foo.java:12: error: cannot find symbol\n  symbol: variable x",
       true},
      {"[ERROR] /repo/src/Foo.java:[12,5] cannot find symbol", true},
      {"x.c:3:5: error: expected ';' before 'return'", true},
      {"error[E0308]: mismatched types\n --> src/main.rs:4:9", true},
      {"Exception in thread \"main\" java.lang.NullPointerException\n\tat "
       "Foo.main(Foo.java:3)",
       true},
      {"bash: line 1: pytets: command not found", false},
      {"/bin/bash: line 4: syntax error: unexpected end of file", false},
      {"usage: grep [OPTION]... PATTERNS [FILE]...", false},
      {"Parameter `old_str` is required for command: str_replace.", false},
      {"No replacement was performed, old_str `x` did not appear verbatim "
       "in /w/p.py.",
       false},
      {"Unknown tool: serach_files", false},
      {"cat: notes.txt: No such file or directory", false},
      {"ERROR: Command timed out after 120 seconds", false},
      {"bash: /etc/hosts: Permission denied", false},
      {"Traceback (most recent call last):\n  File \"r.py\", line 1, in "
       "<module>\nModuleNotFoundError: No module named 'numpy'",
       false},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    size_t n = strlen(cases[i].text);
    ag_category c = ag_classify(cases[i].text, n);
    cr_expect_eq(ag__failure_is_information(c, cases[i].text, n), cases[i].info,
                 "%s (%s)", cases[i].text, ag_category_name(c));
  }
}
