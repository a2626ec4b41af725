/*
 * cli_run.c - the program running scenarios: exit codes, --check, the JSON
 * Lines events, Ctrl-C, signals and what they leave behind, the tools'
 * environment and secrets, scripted responses, presets, check-config and
 * help (test_cli's cases; the directory, the files and the runs are
 * cli_fixture.h's).
 */
#include "cli_fixture.h"

/* ------------------------------------------------------------------------ */
/* Running                                                                  */
/* ------------------------------------------------------------------------ */

Test(cli, exit_codes_follow_the_last_turn) {
  struct {
    const char *scenario;
    int status;
  } cases[] = {
      {"{" OK_TURN "}", 0},
      /* stopped: identical calls */
      {"{" TOOL_T
       ", \"turns\": [{\"user\": \"x\", \"model\": [{\"tool_calls\": "
       "[{\"name\": \"t\", \"arguments\": {}}]}], \"repeat_last\": true}]}",
       3},
      /* timed out */
      {"{\"config\": {\"loop\": {\"max_turn_duration\": \"100ms\"}, \"retry\": "
       "{\"function_timeout\": \"0\"}}, \"tools\": {\"t\": {\"responses\": "
       "[{\"hang\": true}]}}, \"turns\": [{\"user\": \"x\", \"model\": "
       "[{\"tool_calls\": [{\"name\": \"t\", \"arguments\": {}}]}]}]}",
       4},
      /* failed: the script runs out */
      {"{" TOOL_T
       ", \"turns\": [{\"user\": \"x\", \"model\": [{\"tool_calls\": "
       "[{\"name\": \"t\", \"arguments\": {}}]}]}]}",
       1},
      /* only the last turn counts */
      {"{" TOOL_T
       ", \"turns\": [{\"user\": \"x\", \"model\": [{\"tool_calls\": "
       "[{\"name\": \"t\", \"arguments\": {}}]}], \"repeat_last\": true}, "
       "{\"user\": \"y\", \"model\": [{\"text\": \"done\"}]}]}",
       0},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const char *s = put("s.json", cases[i].scenario);
    result r = run(ARGS("simulate", "-q", s));
    cr_expect_eq(r.status, cases[i].status, "case %zu: exit %d, want %d\n%s", i,
                 r.status, cases[i].status, r.err);
    result_free(&r);
  }
}

Test(cli, check_compares_expectations) {
  const char *s = put(
      "s.json", "{" TOOL_T ", \"turns\": [{\"user\": \"x\", \"model\": "
                "[{\"tool_calls\": [{\"name\": \"t\", \"arguments\": {}}]}], "
                "\"repeat_last\": true, \"expect\": {\"status\": \"stopped\", "
                "\"reason\": \"identical_calls\", \"tool_calls\": 4, "
                "\"events\": [{\"event\": \"tool_blocked\", \"name\": "
                "\"t\"}]}}]}");
  result r = run(ARGS("simulate", "--check", s));
  cr_expect_eq(r.status, 0, "%s", r.err);
  cr_expect(strstr(r.err, "check passed") != NULL, "%s", r.err);
  result_free(&r);

  s = put("bad.json",
          "{" TOOL_T ", \"turns\": [{\"user\": \"x\", \"model\": "
          "[{\"tool_calls\": [{\"name\": \"t\", \"arguments\": {}}]}], "
          "\"repeat_last\": true, \"expect\": {\"status\": \"completed\", "
          "\"tool_calls\": 3, \"events\": [{\"event\": \"nudge\"}]}}]}");
  r = run(ARGS("simulate", "--check", s));
  cr_expect_eq(r.status, 1, "%s", r.err);
  cr_expect(strstr(r.err, "turn 1: expected completed, got stopped "
                          "(identical_calls)") != NULL,
            "%s", r.err);
  cr_expect(strstr(r.err, "expected 3 tool calls, got 4") != NULL, "%s", r.err);
  cr_expect(strstr(r.err, "no event matched expect.events[0]") != NULL, "%s",
            r.err);
  result_free(&r);

  s = put("none.json", "{" OK_TURN "}");
  r = run(ARGS("simulate", "--check", s));
  cr_expect_eq(r.status, 2, "%s", r.err);
  cr_expect(strstr(r.err, "no turn has an \"expect\"") != NULL, "%s", r.err);
  result_free(&r);
}

Test(cli, events_are_json_lines) {
  const char *s =
      put("s.json", "{" TOOL_T ", \"turns\": [{\"user\": \"x\", \"model\": "
                    "[{\"tool_calls\": [{\"name\": \"t\", \"arguments\": "
                    "{}}]}], \"repeat_last\": true}]}");
  result r = run(ARGS("simulate", "-q", "--events", "-", s));
  cr_expect_eq(r.status, 3);
  size_t lines;
  json_t *last = check_jsonl(r.out, &lines);
  cr_expect_gt(lines, 10);
  cr_expect_str_eq(json_string_value(json_object_get(last, "event")),
                   "turn_end");
  cr_expect_str_eq(json_string_value(json_object_get(last, "status")),
                   "stopped");
  json_decref(last);
  result_free(&r);

  r = run(ARGS("simulate", "-q", "--events", "ev.jsonl", s));
  cr_expect_eq(r.status, 3);
  char path[128];
  snprintf(path, sizeof path, "%s/ev.jsonl", dir);
  char *text = slurp(path);
  last = check_jsonl(text, &lines);
  cr_expect_str_eq(json_string_value(json_object_get(last, "event")),
                   "turn_end");
  json_decref(last);
  free(text);
  result_free(&r);
}

Test(cli, sigint_cancels_the_turn) {
  const char *s = put(
      "s.json",
      "{\"preset\": \"none\", \"tools\": {\"wait\": {\"responses\": "
      "[{\"hang\": "
      "true}]}, \"sleeper\": {\"command\": [\"sleep\", \"30\"]}}, \"turns\": "
      "[{\"user\": \"x\", \"model\": [{\"tool_calls\": [{\"name\": \"wait\", "
      "\"arguments\": {}}, {\"name\": \"sleeper\", \"arguments\": {}}]}]}, "
      "{\"user\": \"y\", \"model\": [{\"text\": \"never\"}]}]}");
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  result r =
      run_sig(ARGS("simulate", "--timeline", "--events", "ev.jsonl", s), 300);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double secs =
      (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
  cr_expect_eq(r.status, 4, "exit %d\n%s", r.status, r.err);
  cr_expect_lt(secs, 10.0, "took %.1fs: the sleeper was not cancelled", secs);
  cr_expect(strstr(r.err, "cancelled") != NULL, "%s", r.err);
  cr_expect(strstr(r.err, "1 turn not run") != NULL, "%s", r.err);
  char path[128];
  snprintf(path, sizeof path, "%s/ev.jsonl", dir);
  char *text = slurp(path);
  size_t lines;
  json_t *last = check_jsonl(text, &lines);
  cr_expect_str_eq(json_string_value(json_object_get(last, "event")),
                   "turn_end");
  cr_expect_str_eq(json_string_value(json_object_get(last, "status")),
                   "cancelled");
  json_decref(last);
  free(text);
  result_free(&r);
}

/* ---- signals and what they leave behind (issue 10, finding 1) ---------- */

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

static long long now_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* Processes, not zombies, that have `arg` as one of their arguments. */
static int procs_with_arg(const char *arg) {
  DIR *d = opendir("/proc");
  cr_assert_not_null(d);
  int found = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (!isdigit((unsigned char)e->d_name[0]))
      continue;
    char path[300], buf[4096];
    snprintf(path, sizeof path, "/proc/%s/cmdline", e->d_name);
    FILE *f = fopen(path, "r");
    if (f == NULL)
      continue;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    bool hit = false;
    for (size_t i = 0; i < n; i += strlen(buf + i) + 1)
      if (strcmp(buf + i, arg) == 0)
        hit = true;
    if (!hit)
      continue;
    snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
    f = fopen(path, "r");
    if (f == NULL)
      continue;
    n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *rp = strrchr(buf, ')');
    if (rp != NULL && rp[1] == ' ' && rp[2] != 'Z')
      found++;
  }
  closedir(d);
  return found;
}

/*
 * A scenario whose one tool ignores SIGTERM, SIGHUP and SIGINT, keeps a job
 * in its process group (sleep u2) and starts one that leaves the group and
 * the session (setsid sleep u1), then writes DIR/started. Returns its path.
 */
static const char *stubborn_scenario(char *u1, char *u2, size_t cap) {
  static int n;
  snprintf(u1, cap, "1010.%06d%d", (int)(getpid() % 1000000), n++);
  snprintf(u2, cap, "1010.%06d%d", (int)(getpid() % 1000000), n++);
  char text[1024];
  snprintf(text, sizeof text,
           "{\"preset\": \"none\", \"tools\": {\"stubborn\": {\"command\": "
           "[\"sh\", \"-c\", \"trap '' TERM HUP INT; (setsid sleep %s "
           "</dev/null >/dev/null 2>&1 &); sleep %s & echo $$ > started; "
           "wait\"]}}, \"turns\": [{\"user\": \"x\", \"model\": "
           "[{\"tool_calls\": [{\"name\": \"stubborn\", \"arguments\": {}}]}, "
           "{\"text\": \"done\"}]}]}",
           u1, u2);
  char started[128];
  snprintf(started, sizeof started, "%s/started", dir);
  unlink(started);
  return put("s.json", text);
}

static void wait_started(const char *u1, const char *u2) {
  char started[128];
  snprintf(started, sizeof started, "%s/started", dir);
  struct stat st;
  for (int i = 0; i < 1000; i++) {
    if (stat(started, &st) == 0 && st.st_size > 0 && procs_with_arg(u1) == 1 &&
        procs_with_arg(u2) == 1)
      return;
    sleep_ms(10);
  }
  cr_assert_fail("the tool did not start");
}

/* The event log ends with turn_end, status cancelled. */
static void expect_cancelled_turn_end(void) {
  char path[128];
  snprintf(path, sizeof path, "%s/ev.jsonl", dir);
  char *text = slurp(path);
  size_t lines;
  json_t *last = check_jsonl(text, &lines);
  cr_expect_str_eq(json_string_value(json_object_get(last, "event")),
                   "turn_end", "the last event");
  cr_expect_str_eq(json_string_value(json_object_get(last, "status")),
                   "cancelled");
  json_decref(last);
  free(text);
}

Test(cli, sighup_cancels_like_sigterm_and_leaves_nothing) {
  char u1[32], u2[32];
  const char *s = stubborn_scenario(u1, u2, sizeof u1);
  pid_t pid = spawn_prog(ARGS("simulate", "--events", "ev.jsonl", s));
  wait_started(u1, u2);
  kill(pid, SIGHUP);
  result r = collect(pid);
  cr_expect_eq(r.status, 4, "exit %d\n%s", r.status, r.err);
  expect_cancelled_turn_end();
  /* The program returned only after every process of the tool was reaped. */
  cr_expect_eq(procs_with_arg(u2), 0, "the tool's job 'sleep %s' is left", u2);
  cr_expect_eq(procs_with_arg(u1), 0, "'setsid sleep %s' is left", u1);
  result_free(&r);
}

Test(cli, second_signal_kills_the_tools_and_still_writes_turn_end) {
  const int sigs[][2] = {{SIGINT, SIGINT}, {SIGTERM, SIGHUP}};
  for (size_t k = 0; k < 2; k++) {
    char u1[32], u2[32];
    const char *s = stubborn_scenario(u1, u2, sizeof u1);
    pid_t pid = spawn_prog(ARGS("simulate", "--events", "ev.jsonl", s));
    wait_started(u1, u2);
    kill(pid, sigs[k][0]);
    sleep_ms(20);
    long long t0 = now_ms();
    kill(pid, sigs[k][1]);
    result r = collect(pid);
    long long took = now_ms() - t0;
    cr_expect_eq(r.status, 4, "signals %d, %d: exit %d\n%s", sigs[k][0],
                 sigs[k][1], r.status, r.err);
    expect_cancelled_turn_end();
    cr_expect_eq(procs_with_arg(u2), 0, "'sleep %s' is left", u2);
    cr_expect_eq(procs_with_arg(u1), 0, "'setsid sleep %s' is left", u1);
    cr_log_info("second signal to exit: %lld ms", took);
    result_free(&r);
  }
}

Test(cli, sigkill_of_agentguard_leaves_no_tool_running) {
  char u1[32], u2[32];
  const char *s = stubborn_scenario(u1, u2, sizeof u1);
  pid_t pid = spawn_prog(ARGS("simulate", "--events", "ev.jsonl", s));
  wait_started(u1, u2);
  long long t0 = now_ms();
  kill(pid, SIGKILL);
  result r = collect(pid);
  cr_expect_eq(r.status, 128 + SIGKILL);
  long long gone = -1;
  while (now_ms() - t0 < 5000) {
    if (procs_with_arg(u1) == 0 && procs_with_arg(u2) == 0) {
      gone = now_ms() - t0;
      break;
    }
    sleep_ms(1);
  }
  cr_expect_geq(gone, 0, "the tool outlived a SIGKILL of agentguard by 5 s");
  cr_log_info("SIGKILL of agentguard: the tool's processes gone after %lld ms",
              gone);
  result_free(&r);
}

/* ---- secrets (issue 10, finding 14) ------------------------------------ */

#define SECRET_KEY "sk-test-0123456789abcdefghijklmnopqrstuv"

Test(cli, tools_get_a_minimal_environment) {
  cr_assert_eq(setenv("OPENAI_API_KEY", SECRET_KEY, 1), 0);
  cr_assert_eq(setenv("AG_TEST_PLAIN", "plain-value", 1), 0);
  const char *s = put(
      "s.json",
      "{\"preset\": \"none\", \"tools\": {\"envdump\": {\"command\": "
      "[\"env\"]}, \"named\": {\"command\": [\"env\"], \"env\": "
      "[\"AG_TEST_PLAIN\"]}, \"set\": {\"command\": [\"env\"], \"env\": "
      "{\"GREETING\": \"hello\"}}}, \"turns\": [{\"user\": \"x\", \"model\": "
      "[{\"tool_calls\": [{\"name\": \"envdump\", \"arguments\": {}}, "
      "{\"name\": \"named\", \"arguments\": {}}, {\"name\": \"set\", "
      "\"arguments\": {}}]}, {\"text\": \"done\"}]}]}");
  result r = run(ARGS("simulate", "-q", "--events", "ev.jsonl", s));
  cr_expect_eq(r.status, 0, "exit %d\n%s", r.status, r.err);
  char path[128];
  snprintf(path, sizeof path, "%s/ev.jsonl", dir);
  char *text = slurp(path);
  json_error_t je;
  const char *line = text;
  int results = 0;
  while (line != NULL && *line != '\0') {
    json_t *ev = json_loadb(line, strcspn(line, "\n"), 0, &je);
    cr_assert_not_null(ev);
    if (strcmp(json_string_value(json_object_get(ev, "event")),
               "tool_result") == 0) {
      const char *name = json_string_value(json_object_get(ev, "name"));
      const char *out = json_string_value(json_object_get(ev, "text"));
      results++;
      cr_expect(strstr(out, "PATH=") != NULL, "%s: no PATH:\n%s", name, out);
      cr_expect(strstr(out, "OPENAI_API_KEY") == NULL,
                "%s got OPENAI_API_KEY:\n%s", name, out);
      bool named = strcmp(name, "named") == 0;
      cr_expect_eq(strstr(out, "AG_TEST_PLAIN=plain-value") != NULL, named,
                   "%s: AG_TEST_PLAIN %s:\n%s", name,
                   named ? "missing" : "passed", out);
      bool set = strcmp(name, "set") == 0;
      cr_expect_eq(strstr(out, "GREETING=hello") != NULL, set,
                   "%s: GREETING:\n%s", name, out);
    }
    json_decref(ev);
    line = strchr(line, '\n');
    if (line != NULL)
      line++;
  }
  cr_expect_eq(results, 3);
  free(text);
  result_free(&r);
}

Test(cli, a_key_a_tool_echoes_never_reaches_events_or_the_terminal) {
  cr_assert_eq(setenv("OPENAI_API_KEY", SECRET_KEY, 1), 0);
  /* The tool is given the key on purpose and prints it on stdout and, as
   * its error, on stderr; the model repeats it in its answer. */
  const char *s = put(
      "s.json",
      "{\"preset\": \"none\", \"tools\": {\"leak\": {\"command\": [\"sh\", "
      "\"-c\", \"echo key=$OPENAI_API_KEY; echo Authorization: Bearer "
      "$OPENAI_API_KEY >&2; exit 1\"], \"env\": [\"OPENAI_API_KEY\"]}, "
      "\"ok\": {\"command\": [\"sh\", \"-c\", \"echo $OPENAI_API_KEY\"], "
      "\"env\": [\"OPENAI_API_KEY\"]}}, \"turns\": [{\"user\": \"x\", "
      "\"model\": [{\"tool_calls\": [{\"name\": \"leak\", \"arguments\": {}}, "
      "{\"name\": \"ok\", \"arguments\": {}}]}, {\"text\": \"the key "
      "is " SECRET_KEY "\"}]}]}");
  result r = run(ARGS("simulate", "--events", "ev.jsonl", s));
  cr_expect_eq(r.status, 0, "exit %d\n%s", r.status, r.err);
  char path[128];
  snprintf(path, sizeof path, "%s/ev.jsonl", dir);
  char *text = slurp(path);
  cr_expect(strstr(text, "0123456789abcdefghij") == NULL,
            "the key is in the events:\n%s", text);
  cr_expect(strstr(text, "[REDACTED]") != NULL, "%s", text);
  cr_expect(strstr(r.err, "0123456789abcdefghij") == NULL,
            "the key is on stderr:\n%s", r.err);
  cr_expect(strstr(r.err, "the key is [REDACTED]") != NULL, "%s", r.err);
  free(text);
  result_free(&r);
}

Test(cli, scripted_responses_walk_per_signature) {
  /* Key order and number spelling do not make a new argument set. */
  const char *s = put(
      "s.json",
      "{\"preset\": \"none\", \"tools\": {\"t\": {\"responses\": [{\"ok\": "
      "\"first\"}, {\"ok\": \"second\"}], \"by_args\": [{\"args\": {\"a\": 1, "
      "\"b\": 2}, \"responses\": [{\"ok\": \"special\"}]}]}}, \"turns\": "
      "[{\"user\": \"x\", \"model\": ["
      "{\"tool_calls\": [{\"name\": \"t\", \"arguments\": {\"x\": 1}}]}, "
      "{\"tool_calls\": [{\"name\": \"t\", \"arguments\": {\"x\": 1.0}}]}, "
      "{\"tool_calls\": [{\"name\": \"t\", \"arguments\": {\"x\": 1}}]}, "
      "{\"tool_calls\": [{\"name\": \"t\", \"arguments\": {\"x\": 2}}]}, "
      "{\"tool_calls\": [{\"name\": \"t\", \"arguments\": \"{\\\"b\\\": 2, "
      "\\\"a\\\": 1.0}\"}]}, "
      "{\"text\": \"done\"}], \"expect\": {\"status\": \"completed\", "
      "\"events\": ["
      "{\"event\": \"tool_result\", \"iteration\": 1, \"text\": \"first\"}, "
      "{\"event\": \"tool_result\", \"iteration\": 2, \"text\": \"second\"}, "
      "{\"event\": \"tool_result\", \"iteration\": 3, \"text\": \"second\"}, "
      "{\"event\": \"tool_result\", \"iteration\": 4, \"text\": \"first\"}, "
      "{\"event\": \"tool_result\", \"iteration\": 5, \"text\": "
      "\"special\"}]}}]}");
  result r = run(ARGS("simulate", "--check", s));
  cr_expect_eq(r.status, 0, "%s", r.err);
  result_free(&r);
}

Test(cli, presets_and_check_config) {
  result r = run(ARGS("presets"));
  cr_expect_eq(r.status, 0);
  cr_expect(strstr(r.out, "hpd ") != NULL, "%s", r.out);
  cr_expect(strstr(r.out, "twelve-factor ") != NULL, "%s", r.out);
  result_free(&r);

  r = run(ARGS("presets", "hpd"));
  cr_expect_eq(r.status, 0);
  json_t *cfg = json_loads(r.out, 0, NULL);
  cr_expect(json_is_object(cfg), "%s", r.out);
  cr_expect_eq(json_integer_value(json_object_get(json_object_get(cfg, "loop"),
                                                  "identical_call_limit")),
               5);
  json_decref(cfg);
  result_free(&r);

  r = run(ARGS("presets", "hdp"));
  cr_expect_eq(r.status, 2);
  cr_expect(strstr(r.err, "did you mean hpd?") != NULL, "%s", r.err);
  result_free(&r);

  const char *c = put("c.json", "{\"preset\": \"hpd\", \"errors\": "
                                "{\"max_tol_errors\": 3}}");
  r = run(ARGS("check-config", c));
  cr_expect_eq(r.status, 2);
  cr_expect(strstr(r.err, "errors.max_tol_errors: unknown key; did you mean "
                          "max_tool_errors?") != NULL,
            "%s", r.err);
  result_free(&r);

  c = put("c.json", "{\"preset\": \"hpd\", \"retry\": {\"max_retries\": 5}}");
  r = run(ARGS("check-config", c));
  cr_expect_eq(r.status, 0, "%s", r.err);
  cfg = json_loads(r.out, 0, NULL);
  cr_expect_eq(json_integer_value(json_object_get(json_object_get(cfg, "retry"),
                                                  "max_retries")),
               5);
  cr_expect_str_eq(json_string_value(json_object_get(cfg, "preset")), "hpd");
  json_decref(cfg);
  result_free(&r);

  r = run(ARGS("check-config"));
  cr_expect_eq(r.status, 2);
  result_free(&r);

  /* a config that is not JSON says what a config is */
  r = run(ARGS("check-config", put("c.yaml", "preset: hpd\n")));
  cr_expect_eq(r.status, 2);
  cr_expect(strstr(r.err, "line 1, column 6: ") != NULL &&
                strstr(r.err, "(a config is a JSON object such as "
                              "{\"preset\": \"default\"}; YAML and other "
                              "formats are not read)") != NULL,
            "%s", r.err);
  result_free(&r);
  r = run(ARGS("check-config",
               put("c.json", "{\"preset\": \"hpd\", // the seed\n}")));
  cr_expect_eq(r.status, 2);
  cr_expect(strstr(r.err, "(JSON has no comments)") != NULL, "%s", r.err);
  result_free(&r);
}

Test(cli, help_names_a_command) {
  result r = run(ARGS("help", "audit"));
  cr_expect_eq(r.status, 0, "%s", r.err);
  cr_expect(strncmp(r.out, "usage: agentguard audit", 23) == 0, "%s", r.out);
  result_free(&r);
  r = run(ARGS("help", "adit"));
  cr_expect_eq(r.status, 2);
  cr_expect(strstr(r.err, "agentguard help: unknown command 'adit'") != NULL,
            "%s", r.err);
  result_free(&r);
}
