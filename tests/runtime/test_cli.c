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
 * object with the common fields, ending with turn_end); Ctrl-C (SIGINT)
 * ending the turn cancelled with exit 4 and turn_end written; presets and
 * check-config.
 *
 * The child's stdout and stderr go to files (no pipe can fill up and
 * deadlock), and a sanitizer report in the child's stderr fails the test:
 * the child is built with the same sanitizers as the test.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#define BIN AG_BINARY_DIR "/agentguard"

static char dir[64];

static void setup(void) {
  strcpy(dir, "/tmp/ag_test_cli_XXXXXX");
  cr_assert_not_null(mkdtemp(dir));
}

static void teardown(void) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  cr_expect_eq(system(cmd), 0);
}

TestSuite(cli, .init = setup, .fini = teardown, .timeout = 60);

/* Writes `text` to DIR/name and returns the path (static buffer ring). */
static const char *put(const char *name, const char *text) {
  static char paths[8][256];
  static int next;
  char *p = paths[next++ % 8];
  snprintf(p, 256, "%s/%s", dir, name);
  FILE *f = fopen(p, "w");
  cr_assert_not_null(f, "cannot create %s", p);
  fputs(text, f);
  fclose(f);
  return p;
}

static char *slurp(const char *path) {
  FILE *f = fopen(path, "r");
  cr_assert_not_null(f);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = malloc((size_t)n + 1);
  cr_assert_not_null(s);
  size_t got = fread(s, 1, (size_t)n, f);
  s[got] = '\0';
  fclose(f);
  return s;
}

typedef struct result {
  int status; /* exit code, or 128 + signal */
  char *out, *err;
} result;

static void result_free(result *r) {
  free(r->out);
  free(r->err);
}

static void no_sanitizer_report(const result *r) {
  const char *marks[] = {"ERROR: AddressSanitizer", "ERROR: LeakSanitizer",
                         "runtime error: ", "WARNING: ThreadSanitizer"};
  for (size_t i = 0; i < sizeof marks / sizeof marks[0]; i++)
    if (strstr(r->err, marks[i]) != NULL) {
      fprintf(stderr, "%s", r->err);
      cr_assert_fail("sanitizer report in the program's stderr");
    }
}

/*
 * Runs the program with `args` (NULL-terminated, without the program name),
 * in DIR. When interrupt_ms >= 0, sends SIGINT after that many ms.
 */
static result run_sig(const char *const *args, int interrupt_ms) {
  char out_path[128], err_path[128];
  snprintf(out_path, sizeof out_path, "%s/.stdout", dir);
  snprintf(err_path, sizeof err_path, "%s/.stderr", dir);
  const char *argv[32];
  size_t n = 0;
  argv[n++] = BIN;
  for (size_t i = 0; args[i] != NULL && n < 31; i++)
    argv[n++] = args[i];
  argv[n] = NULL;
  fflush(NULL);
  pid_t pid = fork();
  cr_assert(pid >= 0);
  if (pid == 0) {
    int o = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int e = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int in = open("/dev/null", O_RDONLY);
    if (o < 0 || e < 0 || in < 0 || chdir(dir) != 0)
      _exit(127);
    dup2(in, 0);
    dup2(o, 1);
    dup2(e, 2);
    signal(SIGINT, SIG_DFL);
    execv(BIN, (char *const *)argv);
    _exit(127);
  }
  if (interrupt_ms >= 0) {
    struct timespec ts = {interrupt_ms / 1000,
                          (long)(interrupt_ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    kill(pid, SIGINT);
  }
  int st;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  result r;
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  r.out = slurp(out_path);
  r.err = slurp(err_path);
  no_sanitizer_report(&r);
  return r;
}

static result run(const char *const *args) {
  return run_sig(args, -1);
}

#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})

/* Runs `simulate FILE` on `scenario`; expects exit 2 and `msg` in stderr. */
static void refused(const char *scenario, const char *msg) {
  const char *path = put("s.json", scenario);
  result r = run(ARGS("simulate", path));
  cr_expect_eq(r.status, 2, "exit %d for %s\nstderr: %s", r.status, scenario,
               r.err);
  cr_expect(strstr(r.err, msg) != NULL,
            "expected \"%s\" in stderr, got: %s\n(scenario %s)", msg, r.err,
            scenario);
  cr_expect(strstr(r.err, "turn 1:") == NULL, "something ran: %s", r.err);
  result_free(&r);
}

#define OK_TURN "\"turns\": [{\"user\": \"x\", \"model\": [{\"text\": \"a\"}]}]"

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
  cr_expect(strstr(r.err, "unknown option '--bogus'") != NULL, "%s", r.err);
  cr_expect(strstr(r.err, "usage: agentguard simulate") != NULL, "%s", r.err);
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

/* ------------------------------------------------------------------------ */
/* Running                                                                  */
/* ------------------------------------------------------------------------ */

#define TOOL_T "\"tools\": {\"t\": {\"responses\": [{\"ok\": \"fine\"}]}}"

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

/* Every line a complete JSON object with the common fields. */
static json_t *check_jsonl(const char *text, size_t *lines) {
  json_t *last = NULL;
  *lines = 0;
  const char *p = text;
  while (*p != '\0') {
    const char *nl = strchr(p, '\n');
    cr_assert_not_null(nl, "the last line is not complete: %s", p);
    json_error_t jerr;
    json_t *ev = json_loadb(p, (size_t)(nl - p), 0, &jerr);
    cr_assert_not_null(ev, "not JSON: %.*s (%s)", (int)(nl - p), p, jerr.text);
    cr_assert(json_is_string(json_object_get(ev, "event")));
    cr_assert(json_is_integer(json_object_get(ev, "turn")));
    cr_assert(json_is_integer(json_object_get(ev, "iteration")));
    cr_assert(json_is_integer(json_object_get(ev, "t_ms")));
    json_decref(last);
    last = ev;
    (*lines)++;
    p = nl + 1;
  }
  return last;
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
}
