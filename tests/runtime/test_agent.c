/*
 * tests/runtime/test_agent.c - the agentic loop (ag_agent_run_turn) end to
 * end with a fake provider (agent_fixture.h: a script of replies per turn,
 * provider errors with status and Retry-After, replies that hang until
 * cancelled; every request it receives is recorded) and native tools:
 * final answers, each guard stop as the loop reports it (blocked calls,
 * warnings, nudges, call_and_result polling), Forge's required tool call,
 * loop-breaking tools and the ephemeral error context, escalation to a
 * human, the wrap-up request at the iteration cap. Network retries, the
 * turn deadline and caller cancellation, feedback forms, approvals, the
 * event stream and sessions are in agent_session.c; the history cap and
 * the history as text in agent_history.c.
 *
 * Timings use tens of milliseconds with generous margins: the suite runs on
 * shared cores and under sanitizers.
 */
#include "agent_fixture.h"

/* ------------------------------------------------------------------------ */
/* Final answers and the history shape                                      */
/* ------------------------------------------------------------------------ */

Test(agent, final_answer) {
  ag_config cfg = preset("default");
  setup(&cfg, "[{\"model\": [{\"text\": \"Hello there\"}]}]");
  ag_turn_outcome o = run("hi");
  ASSERT_OUTCOME(o, AG_TURN_COMPLETED, "final_answer");
  cr_assert_str_eq(o.final_text, "Hello there");
  cr_assert_eq(o.iterations, 1);
  cr_assert_eq(o.tool_calls, 0);

  const json_t *h = history();
  cr_assert_eq(json_array_size(h), 3);
  cr_assert_str_eq(str(json_array_get(h, 0), "role"), "system");
  cr_assert_str_eq(str(json_array_get(h, 0), "content"), "You are a test.");
  cr_assert_str_eq(str(json_array_get(h, 1), "role"), "user");
  cr_assert_str_eq(str(json_array_get(h, 1), "content"), "hi");
  cr_assert_str_eq(str(json_array_get(h, 2), "role"), "assistant");
  cr_assert_str_eq(str(json_array_get(h, 2), "content"), "Hello there");
  cr_assert_null(json_object_get(json_array_get(h, 2), "tool_calls"));

  /* the request offered the tools */
  cr_assert(json_is_true(json_object_get(request(0), "tools")));
  cr_assert_eq(json_array_size(json_object_get(request(0), "messages")), 2);

  const char *want[] = {"turn_start", "model_request", "model_response",
                        "turn_end"};
  cr_assert_eq(json_array_size(H.events), 4);
  for (size_t i = 0; i < 4; i++)
    cr_assert_str_eq(str(json_array_get(H.events, i), "event"), want[i]);
  json_t *end = json_array_get(H.events, 3);
  cr_assert_str_eq(str(end, "status"), "completed");
  cr_assert_str_eq(str(end, "final_text"), "Hello there");
  cr_assert_eq(json_integer_value(json_object_get(end, "iterations")), 1);
  ag_turn_outcome_clear(&o);
  cr_assert_null(o.final_text);
  teardown();
}

Test(agent, tool_call_then_answer_history_shape) {
  ag_config cfg = preset("default");
  setup(&cfg, "[{\"model\": [{\"text\": \"Let me look.\", \"tool_calls\": ["
              "{\"id\": \"c1\", \"name\": \"echo\", \"arguments\": "
              "\"{\\\"b\\\": 2, \\\"a\\\": 1}\"}, {\"name\": \"echo\", "
              "\"arguments\": {\"x\": true}}]}, {\"text\": \"Done.\"}]}]");
  ag_turn_outcome o = run("go");
  ASSERT_OUTCOME(o, AG_TURN_COMPLETED, "final_answer");
  cr_assert_eq(o.iterations, 2);
  cr_assert_eq(o.tool_calls, 2);
  const json_t *h = history();
  cr_assert_eq(json_array_size(h), 6);
  json_t *as = json_array_get(h, 2);
  cr_assert_str_eq(str(as, "content"), "Let me look.");
  json_t *c0 = json_array_get(json_object_get(as, "tool_calls"), 0);
  cr_assert_str_eq(str(c0, "id"), "c1");
  cr_assert_str_eq(str(c0, "type"), "function");
  /* the raw argument text, as the model sent it */
  cr_assert_str_eq(str(json_object_get(c0, "function"), "arguments"),
                   "{\"b\": 2, \"a\": 1}");
  cr_assert_str_eq(str(json_object_get(c0, "function"), "name"), "echo");
  cr_assert_str_eq(str(json_array_get(h, 3), "content"),
                   "echo {\"a\":1,\"b\":2}");
  cr_assert_str_eq(str(json_array_get(h, 4), "content"), "echo {\"x\":true}");
  assert_history_well_formed();
  /* the second request saw the tool messages */
  cr_assert_eq(json_array_size(json_object_get(request(1), "messages")), 5);
  ag_turn_outcome_clear(&o);
  teardown();
}

/* ------------------------------------------------------------------------ */
/* Guard stops                                                              */
/* ------------------------------------------------------------------------ */

Test(agent, stuck_identical_calls_stop_and_next_turn_works) {
  ag_config cfg = preset("default");
  setup(&cfg, "[{\"model\": [" STUCK_ECHO "], \"repeat_last\": true},"
              " {\"model\": [{\"text\": \"fresh\"}]}]");
  ag_turn_outcome o = run("loop please");
  ASSERT_OUTCOME(o, AG_TURN_STOPPED, "identical_calls");
  cr_assert_eq(o.iterations, 5);
  cr_assert_eq(o.tool_calls, 4, "the 5th call is not executed");
  cr_assert_eq(tool_runs, 4);
  cr_assert(strstr(o.message, "echo was called 5 times") != NULL, "%s",
            o.message);

  json_t *blocked = events_named("tool_blocked");
  cr_assert_eq(json_array_size(blocked), 1);
  cr_assert_str_eq(str(json_array_get(blocked, 0), "reason"),
                   "identical_calls");
  cr_assert_str_eq(str(json_array_get(blocked, 0), "name"), "echo");
  json_decref(blocked);
  cr_assert_eq(count_events("tool_call"), 5);
  cr_assert_eq(count_events("tool_result"), 4);

  assert_history_well_formed();
  cr_assert_eq(count_role("tool"), 5);
  const char *last = last_content("tool");
  cr_assert(strncmp(last, "Not run: ", 9) == 0, "%s", last);

  /* The session goes on: a fresh turn, nothing carried over. */
  ag_turn_outcome o2 = run("something else");
  ASSERT_OUTCOME(o2, AG_TURN_COMPLETED, "final_answer");
  cr_assert_str_eq(o2.final_text, "fresh");
  cr_assert_eq(o2.iterations, 1);
  json_t *last_ev = json_array_get(H.events, json_array_size(H.events) - 1);
  cr_assert_eq(json_integer_value(json_object_get(last_ev, "turn")), 2);
  ag_turn_outcome_clear(&o);
  ag_turn_outcome_clear(&o2);
  teardown();
}

Test(agent, consecutive_errors_exact_warning) {
  ag_config cfg = preset("default");
  setup(&cfg, "[{\"model\": ["
              "{\"tool_calls\": [{\"name\": \"fail\", \"arguments\": "
              "{\"path\": \"a\"}}]},"
              "{\"tool_calls\": [{\"name\": \"fail\", \"arguments\": "
              "{\"path\": \"b\"}}]},"
              "{\"tool_calls\": [{\"name\": \"fail\", \"arguments\": "
              "{\"path\": \"c\"}}]},"
              "{\"tool_calls\": [{\"name\": \"fail\", \"arguments\": "
              "{\"path\": \"d\"}}]},"
              "{\"text\": \"never\"}]}]");
  ag_turn_outcome o = run("read");
  ASSERT_OUTCOME(o, AG_TURN_STOPPED, "consecutive_errors");
  cr_assert_str_eq(o.message, "Exceeded maximum consecutive errors (3)");
  cr_assert_eq(o.iterations, 4);
  cr_assert_eq(o.tool_calls, 4, "every failing call ran");

  json_t *w = events_named("warning");
  cr_assert_eq(json_array_size(w), 1);
  cr_assert_str_eq(str(json_array_get(w, 0), "message"),
                   "\xe2\x9a\xa0\xef\xb8\x8f Maximum consecutive errors (3) "
                   "exceeded. Stopping execution to prevent infinite error "
                   "loop.");
  json_decref(w);
  size_t n = json_array_size(H.events);
  cr_assert_str_eq(str(json_array_get(H.events, n - 2), "event"), "warning");
  cr_assert_str_eq(str(json_array_get(H.events, n - 1), "event"), "turn_end");
  assert_history_well_formed();
  ag_turn_outcome_clear(&o);
  teardown();
}

Test(agent, nudge_then_stop) {
  ag_config cfg = preset("default");
  cfg.loop.nudge_before_stop = true;
  setup(&cfg, "[{\"model\": [" STUCK_ECHO "], \"repeat_last\": true}]");
  ag_turn_outcome o = run("loop");
  ASSERT_OUTCOME(o, AG_TURN_STOPPED, "identical_calls");
  cr_assert_eq(o.iterations, 6, "the nudge holds the 5th call; the 6th stops");
  cr_assert_eq(o.tool_calls, 4);

  json_t *nudges = events_named("nudge");
  cr_assert_eq(json_array_size(nudges), 1);
  cr_assert_str_eq(str(json_array_get(nudges, 0), "reason"), "identical_calls");
  const char *text = str(json_array_get(nudges, 0), "text");
  cr_assert(strncmp(text, "Potential loop detected: ", 25) == 0, "%s", text);
  json_decref(nudges);

  /* the held-back call's tool message is the nudge text */
  const json_t *h = history();
  bool found = false;
  size_t i;
  json_t *m;
  json_array_foreach(h, i, m) {
    if (strcmp(str(m, "role"), "tool") == 0 &&
        strncmp(str(m, "content"), "Potential loop detected: ", 25) == 0)
      found = true;
  }
  cr_assert(found, "a tool message holds the nudge");
  assert_history_well_formed();
  cr_assert_eq(count_role("tool"), 6);
  ag_turn_outcome_clear(&o);
  teardown();
}

Test(agent, call_and_result_polling_is_not_a_loop) {
  ag_config cfg = preset("default");
  cfg.loop.identical_call_scope = AG_SCOPE_CALL_AND_RESULT;
  setup(&cfg,
        "[{\"model\": ["
        "{\"tool_calls\": [{\"name\": \"poll\", \"arguments\": {}}]},"
        "{\"tool_calls\": [{\"name\": \"poll\", \"arguments\": {}}]},"
        "{\"tool_calls\": [{\"name\": \"poll\", \"arguments\": {}}]},"
        "{\"tool_calls\": [{\"name\": \"poll\", \"arguments\": {}}]},"
        "{\"tool_calls\": [{\"name\": \"poll\", \"arguments\": {}}]},"
        "{\"tool_calls\": [{\"name\": \"poll\", \"arguments\": {}}]},"
        "{\"tool_calls\": [{\"name\": \"poll\", \"arguments\": {}}]},"
        "{\"text\": \"job finished\"}]},"
        " {\"model\": [{\"tool_calls\": [{\"name\": \"same\", \"arguments\": "
        "{}}]}], \"repeat_last\": true}]");
  ag_turn_outcome o = run("wait for the job");
  ASSERT_OUTCOME(o, AG_TURN_COMPLETED, "final_answer");
  cr_assert_eq(o.tool_calls, 7);

  /* the same call with the same result is a loop; the tripping call ran */
  ag_turn_outcome o2 = run("wait again");
  ASSERT_OUTCOME(o2, AG_TURN_STOPPED, "identical_calls");
  cr_assert_eq(o2.tool_calls, 5);
  cr_assert(strstr(o2.message, "same result") != NULL, "%s", o2.message);
  cr_assert_eq(count_events("tool_blocked"), 0);
  assert_history_well_formed();
  ag_turn_outcome_clear(&o);
  ag_turn_outcome_clear(&o2);
  teardown();
}

Test(agent, call_and_result_nudge_is_appended_to_the_call) {
  ag_config cfg = preset("default");
  cfg.loop.identical_call_scope = AG_SCOPE_CALL_AND_RESULT;
  cfg.loop.nudge_before_stop = true;
  setup(&cfg, "[{\"model\": [{\"tool_calls\": [{\"name\": \"same\", "
              "\"arguments\": {}}]}], \"repeat_last\": true}]");
  ag_turn_outcome o = run("wait");
  ASSERT_OUTCOME(o, AG_TURN_STOPPED, "identical_calls");
  cr_assert_eq(o.tool_calls, 6);
  cr_assert_eq(count_events("nudge"), 1);
  /* the 5th tool message: the result, then the nudge */
  const json_t *h = history();
  int k = 0;
  const char *fifth = NULL;
  size_t i;
  json_t *m;
  json_array_foreach(h, i, m) {
    if (strcmp(str(m, "role"), "tool") == 0 && ++k == 5)
      fifth = str(m, "content");
  }
  cr_assert_not_null(fifth);
  cr_assert(strncmp(fifth, "job running\n\nPotential loop detected: ", 38) == 0,
            "%s", fifth);
  ag_turn_outcome_clear(&o);
  teardown();
}

/* ------------------------------------------------------------------------ */
/* Forge: required tool calls, loop-breaking tools, the error context       */
/* ------------------------------------------------------------------------ */

Test(agent, forge_loop_breaking_tool_completes) {
  ag_config cfg = preset("forge");
  setup(&cfg,
        "[{\"model\": ["
        "{\"tool_calls\": [{\"name\": \"echo\", \"arguments\": {}}]},"
        "{\"text\": \"wrapping up\", \"tool_calls\": [{\"name\": "
        "\"task_complete\", \"arguments\": {\"summary\": \"all done\"}}]},"
        "{\"text\": \"never\"}]}]");
  ag_turn_outcome o = run("work");
  ASSERT_OUTCOME(o, AG_TURN_COMPLETED, "loop_breaking_tool");
  cr_assert_str_eq(o.final_text, "Task complete: all done");
  cr_assert_eq(o.iterations, 2);
  cr_assert(strstr(o.message, "task_complete") != NULL, "%s", o.message);
  assert_history_well_formed();
  ag_turn_outcome_clear(&o);
  teardown();
}

Test(agent, forge_no_tool_call_feeds_ephemeral_error_context) {
  ag_config cfg = preset("forge");
  setup(&cfg, "[{\"model\": [{\"text\": \"I think I am done\"},"
              "{\"tool_calls\": [{\"name\": \"task_complete\", "
              "\"arguments\": {\"summary\": \"ok\"}}]}]}]");
  ag_turn_outcome o = run("work");
  ASSERT_OUTCOME(o, AG_TURN_COMPLETED, "loop_breaking_tool");
  cr_assert_eq(o.iterations, 2);

  json_t *msgs = json_object_get(request(1), "messages");
  json_t *lastm = json_array_get(msgs, json_array_size(msgs) - 1);
  cr_assert_str_eq(str(lastm, "role"), "user");
  const char *ctx = str(lastm, "content");
  static const char head[] =
      "The previous iteration failed with the following error:\n\n";
  cr_assert(strncmp(ctx, head, sizeof(head) - 1) == 0, "%s", ctx);
  cr_assert(strstr(ctx, "You must provide a tool call in your response.") !=
                NULL,
            "%s", ctx);
  cr_assert_eq(count_events("error_context"), 1);

  /* never stored in history */
  size_t i;
  json_t *m;
  json_array_foreach(history(), i, m) {
    cr_assert(strstr(str(m, "content"), "The previous iteration failed") ==
                  NULL,
              "history message %zu holds the error context", i);
  }
  /* history: system, user, assistant (text), assistant (call), tool */
  cr_assert_eq(json_array_size(history()), 5);
  /* the first request had no error context */
  cr_assert_eq(json_array_size(json_object_get(request(0), "messages")), 2);
  ag_turn_outcome_clear(&o);
  teardown();
}

Test(agent, error_context_goes_into_the_next_request_only) {
  ag_config cfg = preset("default");
  setup(&cfg, "[{\"model\": [{\"tool_calls\": [{\"name\": \"fail\", "
              "\"arguments\": {\"path\": \"x\"}}]}, {\"tool_calls\": "
              "[{\"name\": \"echo\", \"arguments\": {}}]}, {\"text\": "
              "\"ok\"}]}]");
  ag_turn_outcome o = run("x");
  ASSERT_OUTCOME(o, AG_TURN_COMPLETED, "final_answer");
  cr_assert_eq(json_array_size(H.fake->requests), 3);
  /* request 2: history (system, user, assistant, tool) + the context */
  json_t *m1 = json_object_get(request(1), "messages");
  cr_assert_eq(json_array_size(m1), 5);
  const char *ctx = str(json_array_get(m1, 4), "content");
  cr_assert(strstr(ctx, "The error was: Error: cannot open x") != NULL, "%s",
            ctx);
  /* request 3: the history alone */
  json_t *m2 = json_object_get(request(2), "messages");
  cr_assert_eq(json_array_size(m2), 6);
  cr_assert_str_eq(str(json_array_get(m2, 5), "role"), "tool");
  cr_assert_eq(json_array_size(history()), 7);
  ag_turn_outcome_clear(&o);
  teardown();
}

Test(agent, unknown_tool_error_context_lists_tools) {
  ag_config cfg = preset("default");
  setup(&cfg, "[{\"model\": [{\"tool_calls\": [{\"name\": \"nope\", "
              "\"arguments\": {}}]}, {\"text\": \"sorry\"}]}]");
  ag_turn_outcome o = run("x");
  ASSERT_OUTCOME(o, AG_TURN_COMPLETED, "final_answer");
  json_t *msgs = json_object_get(request(1), "messages");
  const char *ctx =
      str(json_array_get(msgs, json_array_size(msgs) - 1), "content");
  cr_assert(strstr(ctx, "Use one of the available tools: [") != NULL, "%s",
            ctx);
  cr_assert(strstr(ctx, "task_complete") != NULL, "%s", ctx);
  json_t *res = events_named("tool_result");
  cr_assert_eq(json_array_size(res), 1);
  cr_assert(json_is_false(json_object_get(json_array_get(res, 0), "ok")));
  cr_assert_str_eq(str(json_array_get(res, 0), "category"), "not_found");
  json_decref(res);
  cr_assert_eq(count_events("tool_attempt"), 0);
  cr_assert_eq(o.tool_calls, 0);
  ag_turn_outcome_clear(&o);
  teardown();
}

Test(agent, invalid_arguments_never_run) {
  ag_config cfg = preset("default");
  setup(&cfg, "[{\"model\": [{\"tool_calls\": [{\"name\": \"echo\", "
              "\"arguments\": \"{not json\"}]}, {\"text\": \"ok\"}]}]");
  ag_turn_outcome o = run("x");
  ASSERT_OUTCOME(o, AG_TURN_COMPLETED, "final_answer");
  cr_assert_eq(tool_runs, 0);
  json_t *calls = events_named("tool_call");
  cr_assert(
      json_is_null(json_object_get(json_array_get(calls, 0), "signature")));
  json_decref(calls);
  json_t *msgs = json_object_get(request(1), "messages");
  const char *ctx =
      str(json_array_get(msgs, json_array_size(msgs) - 1), "content");
  cr_assert(strstr(ctx, "Ensure your tool call JSON is properly formatted.") !=
                NULL,
            "%s", ctx);
  assert_history_well_formed();
  ag_turn_outcome_clear(&o);
  teardown();
}

/* ------------------------------------------------------------------------ */
/* Escalation                                                               */
/* ------------------------------------------------------------------------ */

#define FAIL3                                                                  \
  "{\"tool_calls\": [{\"name\": \"fail\", \"arguments\": {\"path\": "          \
  "\"a\"}}]},"                                                                 \
  "{\"tool_calls\": [{\"name\": \"fail\", \"arguments\": {\"path\": "          \
  "\"b\"}}]},"                                                                 \
  "{\"tool_calls\": [{\"name\": \"fail\", \"arguments\": {\"path\": "          \
  "\"c\"}}]},"

Test(agent, escalation_human_continues_with_hint) {
  ag_config cfg = preset("twelve-factor");
  setup_opts so = {.with_human = true};
  setup_with(&cfg, "[{\"model\": [" FAIL3 "{\"text\": \"used the backup\"}]}]",
             so);
  H.human_action = AG_HUMAN_CONTINUE;
  H.human_hint = "Try the backup file instead.";
  ag_turn_outcome o = run("read the files");
  ASSERT_OUTCOME(o, AG_TURN_COMPLETED, "final_answer");
  cr_assert_str_eq(o.final_text, "used the backup");
  cr_assert_eq(o.iterations, 4, "the same turn went on");
  cr_assert_eq(H.human_calls, 1);

  json_t *rec = json_loads(H.last_record, 0, NULL);
  cr_assert_not_null(rec, "%s", H.last_record);
  cr_assert_str_eq(str(rec, "status"), "escalated");
  cr_assert_str_eq(str(rec, "reason"), "Too many errors with fail");
  json_decref(rec);

  json_t *esc = events_named("escalation");
  cr_assert_eq(json_array_size(esc), 1);
  cr_assert(json_is_object(json_object_get(json_array_get(esc, 0), "record")));
  json_decref(esc);
  json_t *hum = events_named("human");
  cr_assert_eq(json_array_size(hum), 1);
  cr_assert_str_eq(str(json_array_get(hum, 0), "action"), "continue");
  cr_assert_str_eq(str(json_array_get(hum, 0), "message"),
                   "Try the backup file instead.");
  json_decref(hum);

  /* the hint is a user message in the history, seen by the next request */
  cr_assert_str_eq(last_content("user"), "Try the backup file instead.");
  json_t *msgs = json_object_get(request(3), "messages");
  bool seen = false;
  size_t i;
  json_t *m;
  json_array_foreach(msgs, i, m) {
    if (strcmp(str(m, "content"), "Try the backup file instead.") == 0)
      seen = true;
  }
  cr_assert(seen);
  cr_assert_eq(count_events("turn_end"), 1);
  assert_history_well_formed();
  ag_turn_outcome_clear(&o);
  teardown();
}

Test(agent, escalation_human_stops) {
  ag_config cfg = preset("twelve-factor");
  setup_opts so = {.with_human = true};
  setup_with(&cfg, "[{\"model\": [" FAIL3 "{\"text\": \"never\"}]}]", so);
  H.human_action = AG_HUMAN_STOP;
  ag_turn_outcome o = run("read");
  ASSERT_OUTCOME(o, AG_TURN_ESCALATED, "tool_error_budget");
  cr_assert_eq(o.iterations, 3);
  cr_assert_eq(H.human_calls, 1);
  json_t *hum = events_named("human");
  cr_assert_str_eq(str(json_array_get(hum, 0), "action"), "stop");
  json_decref(hum);
  assert_history_well_formed();
  ag_turn_outcome_clear(&o);
  teardown();
}

Test(agent, escalation_without_human_ends_escalated) {
  ag_config cfg = preset("twelve-factor");
  setup(&cfg, "[{\"model\": [" FAIL3 "{\"text\": \"never\"}]}]");
  ag_turn_outcome o = run("read");
  ASSERT_OUTCOME(o, AG_TURN_ESCALATED, "tool_error_budget");
  cr_assert_eq(count_events("escalation"), 1);
  cr_assert_eq(count_events("human"), 0);
  ag_turn_outcome_clear(&o);
  teardown();
}

/* ------------------------------------------------------------------------ */
/* The iteration cap and the wrap-up request                                */
/* ------------------------------------------------------------------------ */

Test(agent, max_iterations_wrap_up_without_tools) {
  ag_config cfg = preset("default");
  cfg.loop.max_iterations = 2;
  setup(&cfg, "[{\"model\": ["
              "{\"tool_calls\": [{\"name\": \"echo\", \"arguments\": "
              "{\"n\": 1}}]},"
              "{\"tool_calls\": [{\"name\": \"echo\", \"arguments\": "
              "{\"n\": 2}}]},"
              "{\"text\": \"Here is what I found so far.\"}]}]");
  ag_turn_outcome o = run("dig");
  ASSERT_OUTCOME(o, AG_TURN_STOPPED, "max_iterations");
  cr_assert_str_eq(o.final_text, "Here is what I found so far.");
  cr_assert_eq(o.iterations, 3, "the wrap-up request counts");
  cr_assert_eq(json_array_size(H.fake->requests), 3);
  cr_assert(json_is_true(json_object_get(request(1), "tools")));
  cr_assert(json_is_false(json_object_get(request(2), "tools")),
            "the wrap-up request offers no tools");
  cr_assert_eq(count_events("model_request"), 3);
  ag_turn_outcome_clear(&o);
  teardown();
}

Test(agent, max_iterations_without_wrap_up) {
  ag_config cfg = preset("default");
  cfg.loop.max_iterations = 2;
  cfg.loop.final_request_without_tools = false;
  setup(&cfg, "[{\"model\": ["
              "{\"tool_calls\": [{\"name\": \"echo\", \"arguments\": "
              "{\"n\": 1}}]},"
              "{\"text\": \"partial\", \"tool_calls\": [{\"name\": \"echo\", "
              "\"arguments\": {\"n\": 2}}]}]}]");
  ag_turn_outcome o = run("dig");
  ASSERT_OUTCOME(o, AG_TURN_STOPPED, "max_iterations");
  cr_assert_eq(o.iterations, 2);
  cr_assert_eq(json_array_size(H.fake->requests), 2);
  cr_assert_str_eq(o.final_text, "partial", "the partial answer is kept");
  ag_turn_outcome_clear(&o);
  teardown();
}

Test(agent, wrap_up_reply_with_tool_calls_is_answered) {
  ag_config cfg = preset("default");
  cfg.loop.max_iterations = 1;
  setup(&cfg, "[{\"model\": [{\"tool_calls\": [{\"name\": \"echo\", "
              "\"arguments\": {\"n\": 1}}]}, {\"text\": \"still\", "
              "\"tool_calls\": [{\"name\": \"echo\", \"arguments\": "
              "{\"n\": 3}}]}]}]");
  ag_turn_outcome o = run("dig");
  ASSERT_OUTCOME(o, AG_TURN_STOPPED, "max_iterations");
  cr_assert_str_eq(o.final_text, "still");
  assert_history_well_formed();
  cr_assert_eq(o.tool_calls, 1);
  cr_assert_eq(count_events("tool_blocked"), 1);
  ag_turn_outcome_clear(&o);
  teardown();
}
