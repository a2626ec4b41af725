/*
 * tests/runtime/agent_history.c - the agentic loop's history: the cap on
 * its size, and the history kept as text (byte for byte the tree it
 * replaced; providers that read text or a tree) (test_agent's cases; the
 * fixture is agent_fixture.h's).
 */
#include "agent_fixture.h"

/* ------------------------------------------------------------------------ */
/* The history cap                                                          */
/* ------------------------------------------------------------------------ */

Test(agent, history_cap_drops_oldest_turns) {
  ag_config cfg = preset("default");
  setup_opts so = {.max_history_bytes = 700};
  char script[2048] = "[";
  for (int i = 0; i < 6; i++)
    snprintf(script + strlen(script), sizeof(script) - strlen(script),
             "%s{\"model\": [{\"text\": \"answer %d\"}]}", i ? "," : "", i);
  strcat(script, "]");
  setup_with(&cfg, script, so);
  char user[256];
  for (int i = 0; i < 6; i++) {
    memset(user, 'a' + i, 150);
    user[150] = '\0';
    ag_turn_outcome o = run(user);
    ASSERT_OUTCOME(o, AG_TURN_COMPLETED, "final_answer");
    ag_turn_outcome_clear(&o);
    char *d = json_dumps(history(), JSON_COMPACT);
    cr_assert_leq(strlen(d), 700, "history is %zu bytes after turn %d",
                  strlen(d), i + 1);
    free(d);
  }
  const json_t *h = history();
  cr_assert_str_eq(str(json_array_get(h, 0), "role"), "system");
  cr_assert_str_eq(str(json_array_get(h, 0), "content"), "You are a test.");
  /* the oldest turns went, whole: user then assistant after the system */
  size_t n = json_array_size(h);
  cr_assert_lt(n, 13);
  cr_assert_eq((n - 1) % 2, 0, "whole turns only");
  cr_assert_str_eq(str(json_array_get(h, 1), "role"), "user");
  cr_assert_str_eq(str(json_array_get(h, n - 1), "content"), "answer 5");
  /* No more than needed was dropped: a turn here is about 230 bytes, the
   * system message and brackets about 45, so two turns fit in 700 and three
   * do not. */
  cr_assert_eq(n, 5, "expected two whole turns kept, got %zu messages", n);
  teardown();
}

Test(agent, history_cap_keeps_the_current_turn) {
  ag_config cfg = preset("default");
  setup_opts so = {.max_history_bytes = 100};
  setup_with(&cfg,
             "[{\"model\": [{\"text\": \"a\"}]}, {\"model\": [{\"text\": "
             "\"b\"}]}]",
             so);
  char big[300];
  memset(big, 'x', 299);
  big[299] = '\0';
  ag_turn_outcome o = run(big);
  ag_turn_outcome_clear(&o);
  cr_assert_eq(json_array_size(history()), 3);
  o = run(big);
  ag_turn_outcome_clear(&o);
  cr_assert_eq(json_array_size(history()), 3, "only the last turn is kept");
  cr_assert_str_eq(last_content("assistant"), "b");
  teardown();
}

Test(agent, meai_tells_the_model_only_that_a_function_failed) {
  ag_config cfg = preset("meai");
  cr_assert_eq(cfg.errors.feedback, AG_FEEDBACK_GENERIC);
  setup(&cfg, "[{\"model\": ["
              "{\"tool_calls\": [{\"name\": \"fail\", \"arguments\": "
              "{\"path\": \"/secret/x\"}}]},"
              "{\"tool_calls\": [{\"name\": \"nope\", \"arguments\": {}}]},"
              "{\"text\": \"done\"}]}]");
  ag_turn_outcome o = run("go");
  ASSERT_OUTCOME(o, AG_TURN_COMPLETED, "final_answer");
  ag_turn_outcome_clear(&o);
  const json_t *h = history();
  size_t tools = 0;
  for (size_t i = 0; i < json_array_size(h); i++) {
    const json_t *m = json_array_get(h, i);
    if (strcmp(str(m, "role"), "tool") != 0)
      continue;
    tools++;
    if (tools == 1)
      cr_assert_str_eq(str(m, "content"), "Error: Function failed.");
    else
      cr_assert_str_eq(str(m, "content"),
                       "Error: Requested function \"nope\" not found.");
  }
  cr_assert_eq(tools, 2);
  teardown();
}

Test(agent, history_cap_bounds_a_long_turn) {
  /* a model that loops for 300 iterations with 2 KB arguments and results:
   * the turn itself stays under the cap (issue: 770 MB after 30 s) */
  ag_config cfg = preset("none");
  cfg.loop.max_iterations = 300;
  cfg.loop.final_request_without_tools = false;
  setup_opts so = {.max_history_bytes = 32768};
  char big[2100];
  memset(big, 'q', 2048);
  big[2048] = '\0';
  char *script = malloc(4096);
  snprintf(script, 4096,
           "[{\"model\": [{\"tool_calls\": [{\"name\": \"echo\", "
           "\"arguments\": {\"s\": \"%s\"}}]}], \"repeat_last\": true}]",
           big);
  setup_with(&cfg, script, so);
  free(script);
  ag_turn_outcome o = run("loop");
  ASSERT_OUTCOME(o, AG_TURN_STOPPED, "max_iterations");
  cr_assert_eq(o.iterations, 300);
  ag_turn_outcome_clear(&o);
  char *d = json_dumps(history(), JSON_COMPACT);
  /* the cap, plus at most the iteration in progress (about 4.3 KB) */
  cr_assert_leq(strlen(d), 32768 + 8192, "history is %zu bytes", strlen(d));
  free(d);
  assert_history_well_formed();
  const json_t *h = history();
  cr_assert_str_eq(str(json_array_get(h, 1), "role"), "user");
  cr_assert_str_eq(str(json_array_get(h, 1), "content"), "loop");
  /* the last iteration is whole */
  cr_assert(strstr(last_content("tool"), "qqqqqqqq") != NULL);
  teardown();
}

/* ------------------------------------------------------------------------ */
/* The history as text                                                      */
/* ------------------------------------------------------------------------ */

/* A session through every way the history changes: a tool call, a denied
 * call, a failed call (its error context rides in the next request only),
 * a nudge and a stop, a turn larger than the cap (its oldest results and
 * arguments compacted, older turns dropped), invalid UTF-8 output. */
#define HIST_TURNS 6
static const char *const hist_users[HIST_TURNS] = {"first", "second", "third",
                                                   "loop",  "big",    "after"};

static void hist_scenario_setup(void) {
  ag_config cfg = preset("default");
  cfg.loop.nudge_before_stop = true;
  setup_opts so = {.max_history_bytes = 3000};
  char big[4][700];
  for (int i = 0; i < 4; i++) {
    memset(big[i], 'k' + i, 600);
    big[i][600] = '\0';
  }
  char *script = malloc(16384);
  snprintf(
      script, 16384,
      "[{\"model\": [{\"tool_calls\": [{\"name\": \"echo\", \"arguments\": "
      "{\"s\": \"a\"}}]}, {\"text\": \"one\"}]},"
      " {\"model\": [{\"tool_calls\": [{\"name\": \"danger\", \"arguments\": "
      "{}}]}, {\"text\": \"two\"}]},"
      " {\"model\": [{\"tool_calls\": [{\"name\": \"fail\", \"arguments\": "
      "{\"path\": \"x.c\"}}]}, {\"text\": \"three\"}]},"
      " {\"model\": [" STUCK_ECHO "], \"repeat_last\": true},"
      " {\"model\": ["
      "{\"text\": \"reading\", \"tool_calls\": [{\"name\": \"echo\", "
      "\"arguments\": {\"s\": \"%s\"}}]},"
      "{\"tool_calls\": [{\"name\": \"echo\", \"arguments\": {\"s\": "
      "\"%s\"}}]},"
      "{\"tool_calls\": [{\"name\": \"echo\", \"arguments\": {\"s\": "
      "\"%s\"}}]},"
      "{\"tool_calls\": [{\"name\": \"echo\", \"arguments\": {\"s\": "
      "\"%s\"}}]},"
      "{\"text\": \"five\"}]},"
      " {\"model\": [{\"tool_calls\": [{\"name\": \"bytes\", \"arguments\": "
      "{}}]}, {\"text\": \"six\"}]}]",
      big[0], big[1], big[2], big[3]);
  setup_with(&cfg, script, so);
  free(script);
  H.deny = true;
}

/* What the jansson tree history dumped after each turn of the scenario
 * (recorded with the tree implementation, commit 4d4b847). */
static const char *const hist_golden[HIST_TURNS][2] = {
    {"completed final_answer",
     "[{\"role\":\"system\",\"content\":\"You are a test.\"},{\"role\":\"u"
     "ser\",\"content\":\"first\"},{\"role\":\"assistant\",\"content\":nul"
     "l,\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\",\"functio"
     "n\":{\"name\":\"echo\",\"arguments\":\"{\\\"s\\\":\\\"a\\\"}\"}}]},{"
     "\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"echo {\\"
     "\"s\\\":\\\"a\\\"}\"},{\"role\":\"assistant\",\"content\":\"one\"}]"},
    {"completed final_answer",
     "[{\"role\":\"system\",\"content\":\"You are a test.\"},{\"role\":\"u"
     "ser\",\"content\":\"first\"},{\"role\":\"assistant\",\"content\":nul"
     "l,\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\",\"functio"
     "n\":{\"name\":\"echo\",\"arguments\":\"{\\\"s\\\":\\\"a\\\"}\"}}]},{"
     "\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"echo {\\"
     "\"s\\\":\\\"a\\\"}\"},{\"role\":\"assistant\",\"content\":\"one\"},{"
     "\"role\":\"user\",\"content\":\"second\"},{\"role\":\"assistant\",\""
     "content\":null,\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"functio"
     "n\",\"function\":{\"name\":\"danger\",\"arguments\":\"{}\"}}]},{\"ro"
     "le\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"Tool call re"
     "jected: the user said no\"},{\"role\":\"assistant\",\"content\":\"tw"
     "o\"}]"},
    {"completed final_answer",
     "[{\"role\":\"system\",\"content\":\"You are a test.\"},{\"role\":\"u"
     "ser\",\"content\":\"first\"},{\"role\":\"assistant\",\"content\":nul"
     "l,\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\",\"functio"
     "n\":{\"name\":\"echo\",\"arguments\":\"{\\\"s\\\":\\\"a\\\"}\"}}]},{"
     "\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"echo {\\"
     "\"s\\\":\\\"a\\\"}\"},{\"role\":\"assistant\",\"content\":\"one\"},{"
     "\"role\":\"user\",\"content\":\"second\"},{\"role\":\"assistant\",\""
     "content\":null,\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"functio"
     "n\",\"function\":{\"name\":\"danger\",\"arguments\":\"{}\"}}]},{\"ro"
     "le\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"Tool call re"
     "jected: the user said no\"},{\"role\":\"assistant\",\"content\":\"tw"
     "o\"},{\"role\":\"user\",\"content\":\"third\"},{\"role\":\"assistant"
     "\",\"content\":null,\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"fu"
     "nction\",\"function\":{\"name\":\"fail\",\"arguments\":\"{\\\"path\\"
     "\":\\\"x.c\\\"}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"call_1\""
     ",\"content\":\"<error>\\ntool: fail\\ntype: not_found\\nmessage: Err"
     "or: cannot open x.c: no such file or directory\\nsuggestion: Verify "
     "the resource exists or list available options\\n</error>\"},{\"role"
     "\":\"assistant\",\"content\":\"three\"}]"},
    {"stopped identical_calls",
     "[{\"role\":\"system\",\"content\":\"You are a test.\"},{\"role\":\"u"
     "ser\",\"content\":\"first\"},{\"role\":\"assistant\",\"content\":nul"
     "l,\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\",\"functio"
     "n\":{\"name\":\"echo\",\"arguments\":\"{\\\"s\\\":\\\"a\\\"}\"}}]},{"
     "\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"echo {\\"
     "\"s\\\":\\\"a\\\"}\"},{\"role\":\"assistant\",\"content\":\"one\"},{"
     "\"role\":\"user\",\"content\":\"second\"},{\"role\":\"assistant\",\""
     "content\":null,\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"functio"
     "n\",\"function\":{\"name\":\"danger\",\"arguments\":\"{}\"}}]},{\"ro"
     "le\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"Tool call re"
     "jected: the user said no\"},{\"role\":\"assistant\",\"content\":\"tw"
     "o\"},{\"role\":\"user\",\"content\":\"third\"},{\"role\":\"assistant"
     "\",\"content\":null,\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"fu"
     "nction\",\"function\":{\"name\":\"fail\",\"arguments\":\"{\\\"path\\"
     "\":\\\"x.c\\\"}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"call_1\""
     ",\"content\":\"<error>\\ntool: fail\\ntype: not_found\\nmessage: Err"
     "or: cannot open x.c: no such file or directory\\nsuggestion: Verify "
     "the resource exists or list available options\\n</error>\"},{\"role"
     "\":\"assistant\",\"content\":\"three\"},{\"role\":\"user\",\"content"
     "\":\"loop\"},{\"role\":\"assistant\",\"content\":null,\"tool_calls\""
     ":[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\""
     "echo\",\"arguments\":\"{\\\"q\\\":1}\"}}]},{\"role\":\"tool\",\"tool"
     "_call_id\":\"call_1\",\"content\":\"echo {\\\"q\\\":1}\"},{\"role\":"
     "\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_1\",\""
     "type\":\"function\",\"function\":{\"name\":\"echo\",\"arguments\":\""
     "{\\\"q\\\":1}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"call_1\","
     "\"content\":\"echo {\\\"q\\\":1}\"},{\"role\":\"assistant\",\"conten"
     "t\":null,\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\",\""
     "function\":{\"name\":\"echo\",\"arguments\":\"{\\\"q\\\":1}\"}}]},{"
     "\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"echo {\\"
     "\"q\\\":1}\"},{\"role\":\"assistant\",\"content\":null,\"tool_calls"
     "\":[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":"
     "\"echo\",\"arguments\":\"{\\\"q\\\":1}\"}}]},{\"role\":\"tool\",\"to"
     "ol_call_id\":\"call_1\",\"content\":\"echo {\\\"q\\\":1}\"},{\"role"
     "\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_1\""
     ",\"type\":\"function\",\"function\":{\"name\":\"echo\",\"arguments\""
     ":\"{\\\"q\\\":1}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"call_1"
     "\",\"content\":\"Potential loop detected: echo was called 5 times in"
     " a row with the same arguments. This call was not run. Stop repeatin"
     "g this call: use its earlier result, change the arguments, or try a "
     "different approach.\"},{\"role\":\"assistant\",\"content\":null,\"to"
     "ol_calls\":[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{"
     "\"name\":\"echo\",\"arguments\":\"{\\\"q\\\":1}\"}}]},{\"role\":\"to"
     "ol\",\"tool_call_id\":\"call_1\",\"content\":\"Not run: echo was cal"
     "led 6 times in a row with the same arguments\"}]"},
    {"completed final_answer",
     "[{\"role\":\"system\",\"content\":\"You are a test.\"},{\"role\":\"u"
     "ser\",\"content\":\"big\"},{\"role\":\"assistant\",\"content\":\"rea"
     "ding\",\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\",\"fu"
     "nction\":{\"name\":\"echo\",\"arguments\":\"{\\\"dropped\\\":\\\"608"
     " bytes of arguments (size cap)\\\"}\"}}]},{\"role\":\"tool\",\"tool_"
     "call_id\":\"call_1\",\"content\":\"[613 bytes dropped from this mess"
     "age to keep the conversation under its size cap]\"},{\"role\":\"assi"
     "stant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_1\",\"type\""
     ":\"function\",\"function\":{\"name\":\"echo\",\"arguments\":\"{\\\"d"
     "ropped\\\":\\\"608 bytes of arguments (size cap)\\\"}\"}}]},{\"role"
     "\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"[613 bytes dro"
     "pped from this message to keep the conversation under its size cap]"
     "\"},{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\""
     ":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"echo\",\""
     "arguments\":\"{\\\"dropped\\\":\\\"608 bytes of arguments (size cap)"
     "\\\"}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content"
     "\":\"[613 bytes dropped from this message to keep the conversation u"
     "nder its size cap]\"},{\"role\":\"assistant\",\"content\":null,\"too"
     "l_calls\":[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\""
     "name\":\"echo\",\"arguments\":\"{\\\"s\\\":\\\"nnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn\\\"}\"}}]},{\"role\":\"tool\",\""
     "tool_call_id\":\"call_1\",\"content\":\"echo {\\\"s\\\":\\\"nnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn\\\"}\"},{\"role\":"
     "\"assistant\",\"content\":\"five\"}]"},
    {"completed final_answer",
     "[{\"role\":\"system\",\"content\":\"You are a test.\"},{\"role\":\"u"
     "ser\",\"content\":\"big\"},{\"role\":\"assistant\",\"content\":\"rea"
     "ding\",\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\",\"fu"
     "nction\":{\"name\":\"echo\",\"arguments\":\"{\\\"dropped\\\":\\\"608"
     " bytes of arguments (size cap)\\\"}\"}}]},{\"role\":\"tool\",\"tool_"
     "call_id\":\"call_1\",\"content\":\"[613 bytes dropped from this mess"
     "age to keep the conversation under its size cap]\"},{\"role\":\"assi"
     "stant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_1\",\"type\""
     ":\"function\",\"function\":{\"name\":\"echo\",\"arguments\":\"{\\\"d"
     "ropped\\\":\\\"608 bytes of arguments (size cap)\\\"}\"}}]},{\"role"
     "\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"[613 bytes dro"
     "pped from this message to keep the conversation under its size cap]"
     "\"},{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\""
     ":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"echo\",\""
     "arguments\":\"{\\\"dropped\\\":\\\"608 bytes of arguments (size cap)"
     "\\\"}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content"
     "\":\"[613 bytes dropped from this message to keep the conversation u"
     "nder its size cap]\"},{\"role\":\"assistant\",\"content\":null,\"too"
     "l_calls\":[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\""
     "name\":\"echo\",\"arguments\":\"{\\\"s\\\":\\\"nnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn\\\"}\"}}]},{\"role\":\"tool\",\""
     "tool_call_id\":\"call_1\",\"content\":\"echo {\\\"s\\\":\\\"nnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn\\\"}\"},{\"role\":"
     "\"assistant\",\"content\":\"five\"},{\"role\":\"user\",\"content\":"
     "\"after\"},{\"role\":\"assistant\",\"content\":null,\"tool_calls\":["
     "{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"by"
     "tes\",\"arguments\":\"{}\"}}]},{\"role\":\"tool\",\"tool_call_id\":"
     "\"call_1\",\"content\":\"ok \357\277\275\357\277\275\357\277\275 end"
     "\"},{\"role\":\"assistant\",\"content\":\"six\"}]"},
};

/* The stored text is, byte for byte, what the tree history dumped, after
 * every turn; every request a tree-reading provider got carried the same
 * messages as text. */
Test(agent, history_text_is_the_tree_it_replaced) {
  hist_scenario_setup();
  for (int i = 0; i < HIST_TURNS; i++) {
    ag_turn_outcome o = run(hist_users[i]);
    char st[64];
    snprintf(st, sizeof(st), "%s %s", ag_turn_status_name(o.status), o.reason);
    cr_assert_str_eq(st, hist_golden[i][0], "turn %d", i + 1);
    size_t len = 0;
    const char *text = ag_agent_history_json(H.agent, &len);
    cr_assert_eq(len, strlen(hist_golden[i][1]), "turn %d: %zu bytes, want %zu",
                 i + 1, len, strlen(hist_golden[i][1]));
    cr_assert_str_eq(text, hist_golden[i][1], "turn %d", i + 1);
    assert_history_well_formed();
    ag_turn_outcome_clear(&o);
  }
  /* the scenario went where it should: a nudge, a denial, an error
   * context, a compaction */
  cr_assert_eq(count_events("nudge"), 1);
  cr_assert_eq(count_events("error_context"), 1);
  cr_assert(strstr(hist_golden[4][1], "bytes of arguments (size cap)") != NULL);
  size_t i;
  json_t *rq;
  size_t with_ectx = 0;
  json_array_foreach(H.fake->requests, i, rq) {
    cr_assert(json_is_true(json_object_get(rq, "text_matches")),
              "request %zu: messages_json is not the tree's dump", i);
    json_t *msgs = json_object_get(rq, "messages");
    json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
    if (strstr(str(last, "content"), "x.c") != NULL &&
        strcmp(str(last, "role"), "user") == 0)
      with_ectx++;
  }
  cr_assert_eq(with_ectx, 1, "the error context rode in one request");
  teardown();
}

/* A provider that reads text: messages_json only, no tree. */
typedef struct text_model {
  int requests;
  bool tree_seen;
  bool text_valid;
} text_model;

static ag_err_t text_complete(void *self, const ag_request *req,
                              ag_cancel *cancel, ag_delta_fn on_delta,
                              void *delta_user, ag_reply *out,
                              ag_provider_error *perr) {
  (void)cancel;
  (void)on_delta;
  (void)delta_user;
  (void)perr;
  text_model *m = self;
  m->requests++;
  if (req->messages != NULL)
    m->tree_seen = true;
  json_t *j =
      req->messages_json != NULL
          ? json_loadb(req->messages_json, req->messages_json_len, 0, NULL)
          : NULL;
  m->text_valid = json_is_array(j) && json_array_size(j) == 2 &&
                  req->messages_json[req->messages_json_len] == '\0';
  json_decref(j);
  out->text = malloc(3);
  if (out->text != NULL)
    memcpy(out->text, "hi", 3);
  return out->text != NULL ? AG_OK : AG_ENOMEM;
}

static const ag_provider_vtable text_vt = {sizeof(ag_provider_vtable), "text",
                                           text_complete, NULL,
                                           AG_PROVIDER_MESSAGES_TEXT};
/* The layout before `flags`: such a provider reads the tree. */
static const ag_provider_vtable old_vt = {
    offsetof(ag_provider_vtable, flags), "old", text_complete, NULL,
    AG_PROVIDER_MESSAGES_TEXT /* not read: the size leaves it out */};

static void one_turn_with(const ag_provider_vtable *vt, text_model *m) {
  ag_provider *p = NULL;
  ag_agent *a = NULL;
  ag_error_t err;
  cr_assert_eq(ag_provider_new(&p, vt, m, &err), AG_OK, "%s", err.msg);
  ag_agent_opts o;
  ag_agent_opts_init(&o);
  o.provider = p;
  o.system_prompt = "s";
  cr_assert_eq(ag_agent_new(&a, &o, &err), AG_OK, "%s", err.msg);
  ag_turn_outcome out;
  cr_assert_eq(ag_agent_run_turn(a, "u", NULL, &out, &err), AG_OK);
  ASSERT_OUTCOME(out, AG_TURN_COMPLETED, "final_answer");
  ag_turn_outcome_clear(&out);
  size_t len = 0;
  cr_assert_str_eq(ag_agent_history_json(a, &len),
                   "[{\"role\":\"system\",\"content\":\"s\"},{\"role\":"
                   "\"user\",\"content\":\"u\"},{\"role\":\"assistant\","
                   "\"content\":\"hi\"}]");
  json_t *h = ag_agent_history(a);
  cr_assert_eq(json_array_size(h), 3);
  json_decref(h);
  ag_agent_free(a);
  ag_provider_free(p);
}

Test(agent, text_provider_gets_text_not_tree) {
  text_model m = {0};
  one_turn_with(&text_vt, &m);
  cr_assert_eq(m.requests, 1);
  cr_assert_not(m.tree_seen, "a MESSAGES_TEXT provider got a tree");
  cr_assert(m.text_valid, "messages_json is not the 2-message array");
}

Test(agent, provider_without_the_flag_gets_a_tree) {
  text_model m = {0};
  one_turn_with(&old_vt, &m);
  cr_assert(m.tree_seen, "an older vtable got no tree");
  cr_assert(m.text_valid);
}

Test(agent, history_api_null_and_fresh_trees) {
  size_t len = 7;
  cr_assert_null(ag_agent_history_json(NULL, &len));
  cr_assert_eq(len, 0);
  cr_assert_null(ag_agent_history_json(NULL, NULL));
  ag_config cfg = preset("default");
  setup(&cfg, "[{\"model\": [{\"text\": \"ok\"}]}]");
  json_t *a = ag_agent_history(H.agent);
  json_t *b = ag_agent_history(H.agent);
  cr_assert(a != b, "each call is a new tree");
  cr_assert(json_equal(a, b));
  cr_assert_eq(json_array_size(a), 1, "the system prompt");
  json_array_clear(a); /* the caller's to change */
  json_t *c = ag_agent_history(H.agent);
  cr_assert_eq(json_array_size(b), 1);
  cr_assert_eq(json_array_size(c), 1, "the session's history is untouched");
  json_decref(c);
  json_decref(a);
  json_decref(b);
  teardown();
}
