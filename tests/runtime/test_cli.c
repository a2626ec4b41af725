/*
 * tests/runtime/test_cli.c - the agentguard program as a user meets it: the
 * built binary (AG_BINARY_DIR "/agentguard") is run on scenario and config
 * files written to a temporary directory, and its exit code, stdout and
 * stderr are checked.
 *
 * What is covered: bad input of every kind is refused with exit 2 and a
 * message naming the file and the place (JSON syntax with line and column,
 * unknown keys with did-you-mean, wrong types and values, config, tool
 * schemas, approvals, human answers, turns, options) and nothing runs; the
 * exit codes of each turn status; --check passing, failing and refusing a
 * scenario without "expect"; the JSON Lines events (every line a complete
 * object with the common fields, ending with turn_end; a 20 KB event one
 * line in one write); audit of a log whose last line was cut (read without
 * it, saying so) and of one cut in the middle (skipped); Ctrl-C (SIGINT)
 * ending the turn cancelled with exit 4 and turn_end written; presets and
 * check-config.
 *
 * The child's stdout and stderr go to files (no pipe can fill up and
 * deadlock), and a sanitizer report in the child's stderr fails the test:
 * the child is built with the same sanitizers as the test.
 *
 * This file has the bad input; the test_cli program also runs cli_run.c
 * (running: exit codes, --check, events, signals, secrets, presets, help),
 * cli_output.c (output never lost, inputs never overwritten, whole event
 * lines, audit of cut logs) and cli_config.c (the proxy's options, the
 * default config file), around cli_fixture.h. The suite's init and fini are
 * here.
 */
#include "cli_fixture.h"

TestSuite(cli, .init = setup, .fini = teardown, .timeout = 60);

/* ------------------------------------------------------------------------ */
/* Bad input: refused before anything runs                                  */
/* ------------------------------------------------------------------------ */

Test(cli, json_syntax_error_has_line_and_column) {
  refused("{\n  \"turns\": [\n    {\"user\": \"x\",, }\n  ]\n}",
          "s.json:3:18: ");
}

Test(cli, duplicate_key_is_a_json_error) {
  refused("{\"turns\": [], \"turns\": []}", "duplicate object key");
}

Test(cli, top_level_must_be_an_object) {
  refused("[1, 2]", "expected a scenario object at the top level, got array");
}

Test(cli, unknown_keys_get_did_you_mean) {
  refused("{\"tols\": {}, " OK_TURN "}",
          "tols: unknown key; did you mean tools?");
  refused(
      "{\"tools\": {\"read_file\": {\"respones\": [{\"ok\": \"x\"}]}}, " OK_TURN
      "}",
      "tools.read_file.respones: unknown key; did you mean responses?");
  refused("{\"turns\": [{\"usr\": \"x\", \"model\": []}]}",
          "turns[0].usr: unknown key; did you mean user?");
  refused("{\"tools\": {\"t\": {\"responses\": [{\"ok\": \"x\", \"dealy_ms\": "
          "1}]}}, " OK_TURN "}",
          "tools.t.responses[0].dealy_ms: unknown key; did you mean delay_ms?");
}

Test(cli, tool_definitions) {
  refused("{\"tools\": {\"t\": {\"description\": \"x\"}}, " OK_TURN "}",
          "tools.t: needs \"command\"");
  refused(
      "{\"tools\": {\"t\": {\"command\": [\"sh\"], \"responses\": [{\"ok\": "
      "\"x\"}]}}, " OK_TURN "}",
      "not both");
  refused("{\"tools\": {\"t\": {\"command\": \"sh -c cat\"}}, " OK_TURN "}",
          "tools.t.command: expected an array of strings (argv), got string");
  refused("{\"tools\": {\"t\": {\"command\": [\"sh\", 1]}}, " OK_TURN "}",
          "tools.t.command[1]: expected a string, got integer");
  refused("{\"tools\": {\"t\": {\"responses\": []}}, " OK_TURN "}",
          "tools.t.responses: must not be empty");
  refused("{\"tools\": {\"t\": {\"responses\": [{\"ok\": \"x\", \"error\": "
          "\"y\"}]}}, " OK_TURN "}",
          "tools.t.responses[0]: give exactly one of");
  refused("{\"tools\": {\"t\": {\"responses\": [{\"hang\": false}]}}, " OK_TURN
          "}",
          "tools.t.responses[0].hang: must be true");
  refused("{\"tools\": {\"t\": {\"responses\": [{\"ok\": 3}]}}, " OK_TURN "}",
          "tools.t.responses[0].ok: expected a string, got integer");
  refused("{\"tools\": {\"t\": {\"responses\": [{\"ok\": \"x\", \"delay_ms\": "
          "-1}]}}, " OK_TURN "}",
          "tools.t.responses[0].delay_ms: -1 is out of range");
  refused("{\"tools\": {\"t\": {\"requires_approval\": 1, \"responses\": "
          "[{\"ok\": \"x\"}]}}, " OK_TURN "}",
          "tools.t.requires_approval: expected true or false, got integer");
  refused("{\"tools\": {\"t\": {\"by_args\": [{\"args\": [1], \"responses\": "
          "[{\"ok\": \"x\"}]}]}}, " OK_TURN "}",
          "tools.t.by_args[0].args: expected an object");
  refused("{\"tools\": {\"t\": {\"by_args\": [{\"args\": {\"a\": 1}, "
          "\"responses\": [{\"ok\": \"x\"}]}, {\"args\": {\"a\": 1.0}, "
          "\"responses\": [{\"ok\": \"y\"}]}]}}, " OK_TURN "}",
          "tools.t.by_args[1].args: the same arguments as by_args[0]");
  refused("{\"tools\": {\"read file\": {\"responses\": [{\"ok\": "
          "\"x\"}]}}, " OK_TURN "}",
          "invalid tool name");
}

Test(cli, tool_env_is_checked) {
  refused(
      "{\"tools\": {\"t\": {\"command\": [\"env\"], \"envs\": []}}, " OK_TURN
      "}",
      "tools.t.envs: unknown key; did you mean env?");
  refused("{\"tools\": {\"t\": {\"command\": [\"env\"], \"env\": 3}}, " OK_TURN
          "}",
          "tools.t.env: expected an array of variable names or an object");
  refused("{\"tools\": {\"t\": {\"command\": [\"env\"], \"env\": "
          "[\"A=B\"]}}, " OK_TURN "}",
          "tools.t.env[0]: \"A=B\" is not a variable name");
  refused(
      "{\"tools\": {\"t\": {\"command\": [\"env\"], \"env\": [true]}}, " OK_TURN
      "}",
      "tools.t.env[0]: expected a variable name, got boolean");
  refused("{\"tools\": {\"t\": {\"command\": [\"env\"], \"env\": {\"1X\": "
          "\"v\"}}}, " OK_TURN "}",
          "tools.t.env: \"1X\" is not a variable name");
  refused("{\"tools\": {\"t\": {\"command\": [\"env\"], \"env\": {\"X\": "
          "1}}}, " OK_TURN "}",
          "tools.t.env.X: expected a string value, got");
  refused("{\"tools\": {\"t\": {\"responses\": [{\"ok\": \"a\"}], \"env\": "
          "[\"X\"]}}, " OK_TURN "}",
          "tools.t.env: only a \"command\" tool has an environment");
}

Test(cli, tool_schema_errors_come_from_the_registry) {
  refused("{\"tools\": {\"t\": {\"parameters\": {\"type\": \"object\", "
          "\"properties\": {\"p\": {\"type\": \"strng\"}}}, \"responses\": "
          "[{\"ok\": \"x\"}]}}, " OK_TURN "}",
          "tools.t.parameters/properties/p/type: unknown type \"strng\"");
  refused("{\"tools\": {\"t\": {\"parameters\": [], \"responses\": [{\"ok\": "
          "\"x\"}]}}, " OK_TURN "}",
          "tools.t.parameters: expected a JSON Schema object, got array");
}

/* Found by tests/fuzz/fuzz_scenario.c: a key or tool name holding a
 * newline or a terminal escape was printed as it is (by the registry's and
 * the schema compiler's messages), splitting the message or driving the
 * terminal. Control characters are shown as '?'. */
Test(cli, control_characters_in_names_stay_out_of_messages) {
  static const struct {
    const char *scenario, *msg;
  } cases[] = {
      {"{\"tools\": {\"a\\nb\\u001b[2J\": {\"responses\": [{\"ok\": "
       "\"x\"}]}}, " OK_TURN "}",
       "invalid tool name \"a?b?[2J\""},
      {"{\"tools\": {\"t\": {\"parameters\": {\"type\": \"object\", "
       "\"properties\": {\"x\\ny\": {\"type\": \"strin\"}}}, "
       "\"responses\": [{\"ok\": \"x\"}]}}, " OK_TURN "}",
       "tools.t.parameters/properties/x?y/type: unknown type"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    refused(cases[i].scenario, cases[i].msg);
    result r = run(ARGS("simulate", put("s.json", cases[i].scenario)));
    const char *nl = strchr(r.err, '\n');
    cr_expect(nl != NULL && nl[1] == '\0', "not one line: %s", r.err);
    cr_expect(strchr(r.err, 0x1b) == NULL, "an escape reached stderr");
    result_free(&r);
  }
}

Test(cli, approvals_and_human) {
  refused("{\"tools\": {\"read_file\": {\"requires_approval\": true, "
          "\"responses\": [{\"ok\": \"x\"}]}}, \"approvals\": {\"read_fil\": "
          "true}, " OK_TURN "}",
          "approvals.read_fil: no such tool; did you mean read_file?");
  refused("{\"tools\": {\"t\": {\"responses\": [{\"ok\": \"x\"}]}}, "
          "\"approvals\": {\"t\": true}, " OK_TURN "}",
          "approvals.t: the tool does not set \"requires_approval\"");
  refused("{\"tools\": {\"t\": {\"requires_approval\": true, \"responses\": "
          "[{\"ok\": \"x\"}]}}, \"approvals\": {\"t\": \"yes\"}, " OK_TURN "}",
          "approvals.t: expected true or false, got string");
  refused("{\"human\": [{\"action\": \"contine\"}], " OK_TURN "}",
          "human[0].action: \"contine\" is not \"continue\" or \"stop\"; did "
          "you mean continue?");
  refused("{\"human\": [{\"message\": \"hi\"}], " OK_TURN "}",
          "human[0].action: missing");
  refused("{\"human\": [{\"action\": \"stop\", \"message\": \"x\"}], " OK_TURN
          "}",
          "human[0].message: only a \"continue\" answer carries a message");
  refused("{\"human\": {\"action\": \"stop\"}, " OK_TURN "}",
          "human: expected an array of answers, got object");
}

Test(cli, config_and_preset) {
  refused("{\"preset\": \"hdp\", " OK_TURN "}",
          "preset: \"hdp\" is not a preset; did you mean hpd?");
  refused("{\"config\": {\"errors\": {\"max_tol_errors\": 3}}, " OK_TURN "}",
          "config.errors.max_tol_errors: unknown key; did you mean "
          "max_tool_errors?");
  refused("{\"config\": {\"retry\": {\"delay\": \"5 sec\"}}, " OK_TURN "}",
          "config.retry.delay: \"5 sec\" is not a duration");
  refused("{\"config\": [], " OK_TURN "}",
          "config: expected an object, got array");
  refused("{\"preset\": \"hpd\", \"config\": {\"preset\": \"forge\"}, " OK_TURN
          "}",
          "config.preset: the preset is also given at the top level");
}

Test(cli, turns_and_expect) {
  refused("{}", "turns: missing");
  refused("{\"turns\": []}", "turns: must have at least one turn");
  refused("{\"turns\": [{\"model\": []}]}", "turns[0].user: missing");
  refused("{\"turns\": [{\"user\": \"x\", \"model\": [{\"txt\": \"a\"}]}]}",
          "s.json: turns[0].model[0].txt: unknown key; did you mean text?");
  refused("{\"turns\": [{\"user\": \"x\", \"model\": [{\"text\": \"a\"}], "
          "\"expect\": {\"status\": \"stoped\"}}]}",
          "turns[0].expect.status: \"stoped\" is not a turn status; did you "
          "mean stopped?");
  refused("{\"turns\": [{\"user\": \"x\", \"model\": [{\"text\": \"a\"}], "
          "\"expect\": {\"reason\": \"final_answer\"}}]}",
          "turns[0].expect.status: missing");
  refused("{\"turns\": [{\"user\": \"x\", \"model\": [{\"text\": \"a\"}], "
          "\"expect\": {\"status\": \"completed\", \"reason\": "
          "\"identical_call\"}}]}",
          "did you mean identical_calls?");
  refused("{\"turns\": [{\"user\": \"x\", \"model\": [{\"text\": \"a\"}], "
          "\"expect\": {\"status\": \"completed\", \"events\": [{\"event\": "
          "\"nudges\"}]}}]}",
          "turns[0].expect.events[0].event: \"nudges\" is not an event; did "
          "you mean nudge?");
}

Test(cli, files) {
  result r = run(ARGS("simulate", "/nonexistent/s.json"));
  cr_expect_eq(r.status, 2);
  cr_expect(strstr(r.err, "/nonexistent/s.json: cannot open: No such file or "
                          "directory") != NULL,
            "%s", r.err);
  result_free(&r);

  r = run(ARGS("simulate", "/"));
  cr_expect_eq(r.status, 2);
  cr_expect(strstr(r.err, "Is a directory") != NULL, "%s", r.err);
  result_free(&r);

  /* Over 4 MiB: refused without parsing. */
  char big[256];
  snprintf(big, sizeof big, "%s/big.json", dir);
  FILE *f = fopen(big, "w");
  cr_assert_not_null(f);
  fputs("{\"description\": \"", f);
  for (int i = 0; i < 4 * 1024 + 1; i++)
    for (int j = 0; j < 1024; j++)
      fputc('x', f);
  fputs("\"}", f);
  fclose(f);
  r = run(ARGS("simulate", big));
  cr_expect_eq(r.status, 2);
  cr_expect(strstr(r.err, "larger than 4 MiB") != NULL, "%s", r.err);
  result_free(&r);
}

Test(cli, options) {
  const char *s = put("ok.json", "{" OK_TURN "}");
  result r = run(ARGS("simulate"));
  cr_expect_eq(r.status, 2);
  cr_expect(strstr(r.err, "a scenario FILE is required") != NULL, "%s", r.err);
  result_free(&r);

  r = run(ARGS("simulate", "--bogus", s));
  cr_expect_eq(r.status, 2);
  cr_expect(strstr(r.err, "agentguard simulate: unknown option '--bogus'\n"
                          "(see 'agentguard help simulate')") != NULL,
            "%s", r.err);
  result_free(&r);

  r = run(ARGS("simulate", s, "--preset"));
  cr_expect_eq(r.status, 2);
  cr_expect(strstr(r.err, "option '--preset' needs a value") != NULL, "%s",
            r.err);
  result_free(&r);

  r = run(ARGS("simulate", s, s));
  cr_expect_eq(r.status, 2);
  result_free(&r);

  r = run(ARGS("simulate", "--preset", "hdp", s));
  cr_expect_eq(r.status, 2);
  cr_expect(strstr(r.err, "--preset: \"hdp\" is not a preset; did you mean "
                          "hpd?") != NULL,
            "%s", r.err);
  result_free(&r);

  const char *c = put("c.json", "{\"loop\": {\"max_iteratons\": 3}}");
  r = run(ARGS("simulate", "--config", c, s));
  cr_expect_eq(r.status, 2);
  cr_expect(strstr(r.err, "c.json: loop.max_iteratons: unknown key; did you "
                          "mean max_iterations?") != NULL,
            "%s", r.err);
  result_free(&r);

  /* Each source valid alone, invalid together. */
  const char *c2 = put("c2.json", "{\"errors\": {\"similar_error_limit\": 8}}");
  const char *s2 =
      put("s2.json", "{\"config\": {\"errors\": {\"error_history\": "
                     "5}}, " OK_TURN "}");
  r = run(ARGS("simulate", "--config", c2, s2));
  cr_expect_eq(r.status, 2);
  cr_expect(strstr(r.err, "errors.error_history: 5 is less than") != NULL, "%s",
            r.err);
  result_free(&r);

  r = run(ARGS("simulate", "--events", "/nonexistent/ev.jsonl", s));
  cr_expect_eq(r.status, 2);
  cr_expect(strstr(r.err, "cannot open") != NULL, "%s", r.err);
  result_free(&r);

  r = run(ARGS("simulate", "--help"));
  cr_expect_eq(r.status, 0);
  cr_expect(strstr(r.out, "usage: agentguard simulate") != NULL);
  result_free(&r);
}
