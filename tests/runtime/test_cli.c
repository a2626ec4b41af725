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
 */
#include <criterion/criterion.h>
#include <ctype.h>
#include <dirent.h>
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

/* Starts the program with `args` (NULL-terminated, without the program
 * name) in DIR, stdout to `stdout_to` (NULL: a file) and stderr to a file;
 * collect_to() waits for it. */
static pid_t spawn_to(const char *const *args, const char *stdout_to) {
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
    int o = stdout_to != NULL
                ? open(stdout_to, O_WRONLY)
                : open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int e = open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int in = open("/dev/null", O_RDONLY);
    if (o < 0 || e < 0 || in < 0 || chdir(dir) != 0)
      _exit(127);
    dup2(in, 0);
    dup2(o, 1);
    dup2(e, 2);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    execv(BIN, (char *const *)argv);
    _exit(127);
  }
  return pid;
}

static result collect_to(pid_t pid, const char *stdout_to) {
  char out_path[128], err_path[128];
  snprintf(out_path, sizeof out_path, "%s/.stdout", dir);
  snprintf(err_path, sizeof err_path, "%s/.stderr", dir);
  int st;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  result r;
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  r.out = stdout_to != NULL ? strdup("") : slurp(out_path);
  r.err = slurp(err_path);
  no_sanitizer_report(&r);
  return r;
}

static pid_t spawn_prog(const char *const *args) {
  return spawn_to(args, NULL);
}

static result collect(pid_t pid) {
  return collect_to(pid, NULL);
}

/*
 * Runs the program with `args` (NULL-terminated, without the program name),
 * in DIR, stdout to `stdout_to` (NULL: captured). When interrupt_ms >= 0,
 * sends SIGINT after that many ms.
 */
static result run_full(const char *const *args, int interrupt_ms,
                       const char *stdout_to) {
  pid_t pid = spawn_to(args, stdout_to);
  if (interrupt_ms >= 0) {
    struct timespec ts = {interrupt_ms / 1000,
                          (long)(interrupt_ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
    kill(pid, SIGINT);
  }
  return collect_to(pid, stdout_to);
}

static result run_sig(const char *const *args, int interrupt_ms) {
  return run_full(args, interrupt_ms, NULL);
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

/* ------------------------------------------------------------------------ */
/* Issue 10: output never lost silently, inputs never overwritten           */
/* ------------------------------------------------------------------------ */

#define ONE_STEP                                                               \
  "{\"steps\":[{\"calls\":[{\"name\":\"a\",\"args\":{}}],\"results\":[{"       \
  "\"ok\":true,\"text\":\"x\"}]}]}"

/* Runs with stdout on /dev/full: exit 1 and "cannot write" on stderr. */
static void full_fails(const char *const *args) {
  result r = run_full(args, -1, "/dev/full");
  cr_expect_eq(r.status, 1, "%s %s: exit %d, stderr: %s", args[0],
               args[1] ? args[1] : "", r.status, r.err);
  cr_expect(strstr(r.err, "cannot write") != NULL, "%s: stderr: %s", args[0],
            r.err);
  result_free(&r);
}

Test(cli, writes_to_a_full_disk_fail) {
  const char *t = put("t.json", ONE_STEP);
  full_fails(ARGS("audit", t));
  full_fails(ARGS("audit", "--json", t));
  full_fails(ARGS("audit", "--quiet", t));
  full_fails(ARGS("presets"));
  full_fails(ARGS("presets", "hpd"));
  full_fails(ARGS("presets", "--help"));
  full_fails(ARGS("check-config", put("c.json", "{\"preset\": \"hpd\"}")));
  full_fails(ARGS("--help"));
  const char *s = put("s.json", "{" OK_TURN "}");
  full_fails(ARGS("simulate", "-q", "--events", "-", s));
}

Test(cli, simulate_never_writes_over_an_input) {
  static const char scenario[] = "{" OK_TURN "}";
  const char *s = put("s.json", scenario);
  const char *c = put("c.json", "{\"preset\": \"hpd\"}");
  const char *const *cases[] = {
      ARGS("simulate", "s.json", "--events", "s.json"),
      ARGS("simulate", s, "--events", "./s.json"),
      ARGS("simulate", "--events=s.json", s),
      ARGS("simulate", s, "--config", c, "--events", "c.json"),
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    result r = run(cases[i]);
    cr_expect_eq(r.status, 2, "case %zu: exit %d, stderr: %s", i, r.status,
                 r.err);
    cr_expect(strstr(r.err, "is also an input") != NULL, "case %zu: %s", i,
              r.err);
    result_free(&r);
  }
  /* a hard link is the same file under another name */
  char link_path[256];
  snprintf(link_path, sizeof link_path, "%s/h.json", dir);
  cr_assert_eq(link(s, link_path), 0);
  result r = run(ARGS("simulate", s, "--events", "h.json"));
  cr_expect_eq(r.status, 2, "hard link: exit %d, stderr: %s", r.status, r.err);
  result_free(&r);
  char *now = slurp(s);
  cr_expect_str_eq(now, scenario, "the scenario was changed");
  free(now);
  now = slurp(c);
  cr_expect_str_eq(now, "{\"preset\": \"hpd\"}", "the config was changed");
  free(now);
  /* a new file is fine */
  r = run(ARGS("simulate", "-q", s, "--events", "ev.jsonl"));
  cr_expect_eq(r.status, 0, "%s", r.err);
  result_free(&r);
}

Test(cli, audit_of_an_empty_folder) {
  char empty[256];
  snprintf(empty, sizeof empty, "%s/empty", dir);
  cr_assert_eq(mkdir(empty, 0700), 0);
  result r = run(ARGS("audit", "empty"));
  cr_expect_eq(r.status, 2, "%s", r.err);
  cr_expect(strstr(r.err, "no *.json") != NULL, "%s", r.err);
  result_free(&r);
}

Test(cli, audit_names_and_tool_names_are_shown_safely) {
  /* a file name that is not UTF-8 keeps its "file" in --json */
  put("bad\xff.json", ONE_STEP);
  put("worse\xfe.json", "{\"steps\": ");
  result r = run(ARGS("audit", "--json", "bad\xff.json", "worse\xfe.json"));
  cr_expect_eq(r.status, 1, "%s", r.err);
  char *line = r.out;
  int files = 0;
  while (line != NULL && *line != '\0') {
    char *nl = strchr(line, '\n');
    json_error_t je;
    json_t *j = json_loadb(
        line, nl != NULL ? (size_t)(nl - line) : strlen(line), 0, &je);
    cr_assert_not_null(j, "not JSON: %s (%s)", line, je.text);
    const char *type = json_string_value(json_object_get(j, "type"));
    const char *file = json_string_value(json_object_get(j, "file"));
    if (type != NULL && strcmp(type, "summary") != 0) {
      cr_expect_not_null(file, "no \"file\" in %.200s", line);
      if (file != NULL) {
        cr_expect(strstr(file, "\xEF\xBF\xBD.json") != NULL, "%s", file);
        files++;
      }
    }
    json_decref(j);
    line = nl != NULL ? nl + 1 : NULL;
  }
  cr_expect_eq(files, 2, "%s", r.out);
  result_free(&r);

  /* terminal escapes in a tool name and a file name are not printed raw */
  char traj[2048] = "{\"steps\":[";
  for (int i = 0; i < 6; i++) {
    if (i > 0)
      strcat(traj, ",");
    strcat(traj, "{\"calls\":[{\"name\":\"ev\\u001b[2Jil\",\"args\":{}}],"
                 "\"results\":[{\"ok\":true,\"text\":\"x\"}]}");
  }
  strcat(traj, "],\"outcome\":\"resolved\"}");
  put("esc\x1b[1m.json", traj);
  r = run(ARGS("audit", "--preset", "hpd", "esc\x1b[1m.json"));
  cr_expect_eq(r.status, 0, "%s", r.err);
  cr_expect(strchr(r.out, '\x1b') == NULL, "raw escape in: %s", r.out);
  cr_expect(strstr(r.out, "ev?[2Jil") != NULL, "%s", r.out);
  cr_expect(strstr(r.out, "esc?[1m") != NULL, "%s", r.out);
  result_free(&r);
}

/* Issue 10, finding 5: a small file of tiny JSON values made jansson take
 * about 80 times its size; now the tree is capped at 8 times the input (at
 * least 16 MiB) and such an input is skipped with a clear reason. Values
 * the tape copies as they are (arguments already in jansson's form, here
 * 500,000 empty objects) build no tree and are audited; numbers (read as
 * reals) still go through jansson, under the cap. */
static void tiny_values(const char *file, const char *first, const char *more,
                        size_t n) {
  size_t fl = strlen(first), ml = strlen(more);
  char *text = malloc(n * ml + 200);
  cr_assert_not_null(text);
  size_t o = (size_t)sprintf(text, "{\"steps\":[{\"calls\":[{\"name\":\"a\","
                                   "\"args\":[");
  for (size_t i = 0; i < n; i++) {
    memcpy(text + o, i ? more : first, i ? ml : fl);
    o += i ? ml : fl;
  }
  strcpy(text + o, "]}],\"results\":[{\"ok\":true}]}]}");
  put(file, text);
  free(text);
}

Test(cli, audit_caps_the_memory_of_one_input) {
  tiny_values("tiny.json", "1", ",1", 1000000);     /* 2 MB of reals */
  tiny_values("objects.json", "{}", ",{}", 500000); /* copied: no tree */
  put("fine.json", ONE_STEP);
  result r =
      run(ARGS("audit", "--quiet", "tiny.json", "objects.json", "fine.json"));
  cr_expect_eq(r.status, 1, "%s", r.err);
  cr_expect(strstr(r.err, "tiny.json: skipped: needs more than 16 MiB to "
                          "parse (8 times its size") != NULL,
            "%s", r.err);
  cr_expect(strstr(r.err, "objects.json") == NULL, "%s", r.err);
  cr_expect(strstr(r.out, "2 runs audited, 1 skipped") != NULL, "%s", r.out);
  result_free(&r);
}

/* ------------------------------------------------------------------------ */
/* Events: whole lines, and a last line cut by a crash (issue 25)           */
/* ------------------------------------------------------------------------ */

/* Whether `log` (strace -s 0 -o) has a write of exactly `n` bytes that
 * wrote them all: 'PID write(3, ""..., 20065)     = 20065'. */
static bool one_write_of(const char *log, size_t n) {
  for (const char *p = log; (p = strstr(p, "write(")) != NULL; p++) {
    const char *args = strstr(p, "..., ");
    size_t asked;
    long done;
    if (args != NULL && sscanf(args + 5, "%zu ) = %ld", &asked, &done) == 2 &&
        asked == n && done == (long)n)
      return true;
  }
  return false;
}

/* stdio wrote a line longer than its buffer (4 KiB for a file) in several
 * write(2) calls, so a kill -9 between them left a cut line. An event of
 * 20 KB is one whole line; under strace (when it is installed and may trace
 * here) it is one write, the check that fails with the stdio writer. */
Test(cli, a_long_event_is_one_line_in_one_write) {
  size_t n = 20000;
  char *scenario = malloc(n + 100);
  cr_assert_not_null(scenario);
  int o = sprintf(scenario, "{\"turns\": [{\"user\": \"");
  for (size_t i = 0; i < n; i++)
    scenario[o++] = (char)('a' + i % 26);
  strcpy(scenario + o, "\", \"model\": [{\"text\": \"done\"}]}]}");
  put("big.json", scenario);
  result r = run(ARGS("simulate", "-q", "--events", "ev.jsonl", "big.json"));
  cr_expect_eq(r.status, 0, "%s", r.err);
  result_free(&r);
  char path[128];
  snprintf(path, sizeof path, "%s/ev.jsonl", dir);
  char *text = slurp(path);
  size_t lines;
  json_decref(check_jsonl(text, &lines));
  cr_expect_eq(lines, 4, "%s", text);
  size_t first = (size_t)(strchr(text, '\n') - text);
  cr_expect_gt(first, 8192);
  json_t *ev = json_loadb(text, first, 0, NULL);
  cr_assert_not_null(ev);
  const char *user = json_string_value(json_object_get(ev, "user"));
  cr_expect(user != NULL && strlen(user) == n &&
                strncmp(user, scenario + o - n, n) == 0,
            "the user message is not whole");
  json_decref(ev);
  free(scenario);

  if (system("strace -qq -o /dev/null true >/dev/null 2>&1") != 0) {
    fprintf(stderr, "skipped: cli::a_long_event_is_one_line_in_one_write: "
                    "the one-write check (strace missing or not allowed)\n");
    free(text);
    return;
  }
  /* LeakSanitizer cannot run under ptrace */
  char cmd[512];
  snprintf(cmd, sizeof cmd,
           "cd '%s' && ASAN_OPTIONS=detect_leaks=0 strace -f -qq -e "
           "trace=write -s 0 -o writes.log '%s' simulate -q --events "
           "ev2.jsonl big.json >/dev/null 2>&1",
           dir, BIN);
  cr_assert_eq(system(cmd), 0, "%s", cmd);
  snprintf(path, sizeof path, "%s/writes.log", dir);
  char *log = slurp(path);
  cr_expect(one_write_of(log, first + 1),
            "no single write of the %zu-byte line:\n%s", first + 1, log);
  free(log);
  free(text);
}

/* The log of a stopped run, written by simulate; *last is where its last
 * line (turn_end) starts. Caller frees. */
static char *stopped_run_log(size_t *last) {
  const char *s =
      put("s.json", "{" TOOL_T ", \"turns\": [{\"user\": \"x\", \"model\": "
                    "[{\"tool_calls\": [{\"name\": \"t\", \"arguments\": "
                    "{}}]}], \"repeat_last\": true}]}");
  result r = run(ARGS("simulate", "-q", "--events", "ev.jsonl", s));
  cr_expect_eq(r.status, 3, "%s", r.err);
  result_free(&r);
  char path[128];
  snprintf(path, sizeof path, "%s/ev.jsonl", dir);
  char *text = slurp(path);
  size_t len = strlen(text);
  cr_assert(len > 2 && text[len - 1] == '\n');
  size_t i = len - 1;
  while (i > 0 && text[i - 1] != '\n')
    i--;
  *last = i;
  return text;
}

static size_t count_lines(const char *text, size_t len) {
  size_t n = 0;
  for (size_t i = 0; i < len; i++)
    n += text[i] == '\n';
  return n;
}

/* A run killed mid-line leaves its last line cut: audit reads the rest,
 * says which line it left out, and finds what it finds without that line. */
Test(cli, audit_reads_a_log_without_its_cut_last_line) {
  size_t last;
  char *text = stopped_run_log(&last);
  size_t len = strlen(text);
  /* the reference: the log without its last line */
  char first = text[last];
  text[last] = '\0';
  put("ev.jsonl", text);
  result r = run(ARGS("audit", "--json", "ev.jsonl"));
  cr_expect_eq(r.status, 0, "%s", r.err);
  cr_expect_str_eq(r.err, "");
  char *ref = strdup(r.out);
  *strchr(ref, '\n') = '\0'; /* the run's line */
  result_free(&r);
  /* the same log with half of its last line */
  text[last] = first;
  text[last + (len - last) / 2] = '\0';
  put("ev.jsonl", text);
  char want[128];
  snprintf(want, sizeof want,
           "agentguard audit: ev.jsonl: line %zu is cut off (the writer "
           "stopped mid-line); read without it\n",
           count_lines(text, last) + 1);
  r = run(ARGS("audit", "--json", "ev.jsonl"));
  cr_expect_eq(r.status, 0, "%s", r.err);
  cr_expect_str_eq(r.err, want);
  cr_expect(strncmp(r.out, ref, strlen(ref)) == 0 && r.out[strlen(ref)] == '\n',
            "not the same finding:\n%s\nwanted:\n%s", r.out, ref);
  result_free(&r);
  r = run(ARGS("audit", "ev.jsonl"));
  cr_expect_eq(r.status, 0, "%s", r.err);
  cr_expect_str_eq(r.err, want);
  cr_expect(strstr(r.out, "1 run audited, 0 skipped") != NULL, "%s", r.out);
  result_free(&r);
  free(ref);
  free(text);
}

/* --jobs: inputs read and replayed by several threads, printed in input
 * order - the output, the warnings and the exit code are those of one job,
 * for good, looping and broken inputs and event logs mixed. */
Test(cli, audit_jobs_keep_the_output_in_input_order) {
  char sub[300];
  snprintf(sub, sizeof sub, "%s/runs", dir);
  cr_assert_eq(mkdir(sub, 0700), 0);
  size_t last;
  char *log = stopped_run_log(&last);
  for (int i = 0; i < 24; i++) {
    char name[64], text[2048];
    snprintf(name, sizeof name, "runs/r%02d.json", i);
    if (i % 6 == 1) {
      put(name, "{not json");
    } else if (i % 6 == 3) {
      snprintf(name, sizeof name, "runs/r%02d.jsonl", i);
      put(name, log);
    } else {
      /* a conversation with i % 4 + 2 identical calls */
      int n = 0;
      n += snprintf(text + n, sizeof text - (size_t)n,
                    "[{\"role\":\"user\",\"content\":\"task %d\"}", i);
      for (int k = 0; k < i % 4 + 2; k++)
        n += snprintf(text + n, sizeof text - (size_t)n,
                      ",{\"role\":\"assistant\",\"content\":null,"
                      "\"tool_calls\":[{\"id\":\"c%d\",\"type\":"
                      "\"function\",\"function\":{\"name\":\"read\","
                      "\"arguments\":\"{}\"}}]},{\"role\":\"tool\","
                      "\"tool_call_id\":\"c%d\",\"content\":\"same\"}",
                      k, k);
      snprintf(text + n, sizeof text - (size_t)n, "]");
      put(name, text);
    }
  }
  free(log);
  result one =
      run(ARGS("audit", "--json", "--preset", "hpd", "--jobs", "1", "runs"));
  cr_expect_eq(one.status, 1, "the broken inputs are skipped: %s", one.err);
  cr_expect(strstr(one.out, "\"type\":\"skipped\"") != NULL, "%s", one.out);
  for (int rounds = 0; rounds < 3; rounds++) {
    result many =
        run(ARGS("audit", "--json", "--preset", "hpd", "--jobs", "4", "runs"));
    cr_expect_eq(many.status, one.status);
    cr_expect_str_eq(many.out, one.out);
    cr_expect_str_eq(many.err, one.err);
    result_free(&many);
  }
  result_free(&one);
  result bad = run(ARGS("audit", "--jobs", "0", "runs"));
  cr_expect_eq(bad.status, 2);
  cr_expect(strstr(bad.err, "--jobs 0: expected a number from 1 to 64") != NULL,
            "%s", bad.err);
  result_free(&bad);
}

/* Only the last line, and only without its newline: a cut line with lines
 * after it (another writer appended) is a bad input, skipped as before. */
Test(cli, audit_refuses_a_cut_line_in_the_middle) {
  size_t last;
  char *text = stopped_run_log(&last);
  size_t len = strlen(text);
  size_t cut_line = count_lines(text, last) + 1;
  /* line `cut_line` cut in half, then the whole line again */
  char *both = malloc(len * 2);
  cr_assert_not_null(both);
  size_t half = last + (len - last) / 2;
  memcpy(both, text, half);
  both[half] = '\n';
  strcpy(both + half + 1, text + last);
  put("ev.jsonl", both);
  result r = run(ARGS("audit", "--quiet", "ev.jsonl"));
  cr_expect_eq(r.status, 1, "%s", r.err);
  char want[128];
  snprintf(want, sizeof want, "ev.jsonl: skipped: invalid JSON at line %zu,",
           cut_line);
  cr_expect(strstr(r.err, want) != NULL, "wanted %s in: %s", want, r.err);
  cr_expect(strstr(r.err, "cut off") == NULL, "%s", r.err);
  cr_expect(strstr(r.out, "0 runs audited, 1 skipped") != NULL, "%s", r.out);
  result_free(&r);
  /* the cut line with its newline, last: the writer finished it */
  both[half + 1] = '\0';
  put("ev.jsonl", both);
  r = run(ARGS("audit", "--quiet", "ev.jsonl"));
  cr_expect_eq(r.status, 1, "%s", r.err);
  cr_expect(strstr(r.err, want) != NULL, "wanted %s in: %s", want, r.err);
  result_free(&r);
  free(both);
  free(text);
}

/* The proxy's options from a config's "proxy" section and from
 * AGENTGUARD_PROXY_*: a flag wins over the variable, the variable over the
 * file. */
Test(cli, proxy_options_from_the_config_and_the_environment) {
  const char *c =
      put("p.json", "{\"preset\": \"hpd\", \"proxy\": {\"upstream\": "
                    "\"http://127.0.0.1:9\", \"listen\": "
                    "\"127.0.0.1:0\", \"drain_timeout\": 0}}");
  result r = run_sig(ARGS("proxy", "--config", c), 700);
  cr_expect(strstr(r.err, "listening on http://127.0.0.1:") != NULL &&
                strstr(r.err, "(upstream http://127.0.0.1:9, preset hpd)") !=
                    NULL,
            "%s", r.err);
  result_free(&r);
  setenv("AGENTGUARD_PROXY_UPSTREAM", "http://127.0.0.1:7", 1);
  r = run_sig(ARGS("proxy", "--config", c), 700);
  cr_expect(strstr(r.err, "(upstream http://127.0.0.1:7,") != NULL,
            "the variable wins over the file: %s", r.err);
  result_free(&r);
  r = run_sig(ARGS("proxy", "--config", c, "--upstream", "http://127.0.0.1:5"),
              700);
  cr_expect(strstr(r.err, "(upstream http://127.0.0.1:5,") != NULL,
            "the flag wins: %s", r.err);
  result_free(&r);
  unsetenv("AGENTGUARD_PROXY_UPSTREAM");
  r = run(ARGS("proxy", "--config",
               put("p2.json", "{\"proxy\": {\"listne\": \"127.0.0.1:0\"}}")));
  cr_expect_eq(r.status, 2);
  cr_expect(strstr(r.err, "proxy.listne: unknown key; did you mean listen?") !=
                NULL,
            "%s", r.err);
  result_free(&r);
  r = run(ARGS("proxy", "--config",
               put("p3.json", "{\"proxy\": {\"max_body\": [1]}}")));
  cr_expect_eq(r.status, 2);
  cr_expect(strstr(r.err, "proxy.max_body: expected a string or a whole "
                          "number") != NULL,
            "%s", r.err);
  result_free(&r);
  r = run(ARGS("proxy"));
  cr_expect_eq(r.status, 2);
  cr_expect(strstr(r.err, "--upstream URL is required") != NULL, "%s", r.err);
  result_free(&r);
  /* traces: the standard variables, as the OpenTelemetry SDKs read them */
  setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9/", 1);
  r = run_sig(ARGS("proxy", "--config", c), 700);
  cr_expect(strstr(r.err, "traces to http://127.0.0.1:9/v1/traces (OTLP/HTTP, "
                          "JSON)") != NULL,
            "%s", r.err);
  result_free(&r);
  setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:8/t", 1);
  r = run_sig(ARGS("proxy", "--config", c), 700);
  cr_expect(strstr(r.err, "traces to http://127.0.0.1:8/t (") != NULL, "%s",
            r.err);
  result_free(&r);
  r = run_sig(ARGS("proxy", "--config", c, "--otlp-endpoint",
                   "http://127.0.0.1:7/v1/traces"),
              700);
  cr_expect(strstr(r.err, "traces to http://127.0.0.1:7/v1/traces (") != NULL,
            "the flag wins, /v1/traces not added twice: %s", r.err);
  result_free(&r);
  setenv("OTEL_SDK_DISABLED", "true", 1);
  r = run_sig(ARGS("proxy", "--config", c), 700);
  cr_expect(strstr(r.err, "listening on") != NULL &&
                strstr(r.err, "traces to") == NULL,
            "%s", r.err);
  result_free(&r);
  unsetenv("OTEL_SDK_DISABLED");
  setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc", 1);
  r = run(ARGS("proxy", "--config", c));
  cr_expect_eq(r.status, 2);
  cr_expect(strstr(r.err, "OTEL_EXPORTER_OTLP_PROTOCOL=grpc: agentguard "
                          "exports traces over OTLP/HTTP") != NULL,
            "%s", r.err);
  result_free(&r);
  unsetenv("OTEL_EXPORTER_OTLP_PROTOCOL");
  setenv("OTEL_EXPORTER_OTLP_HEADERS", "no-equals-sign", 1);
  r = run(ARGS("proxy", "--config", c));
  cr_expect_eq(r.status, 2);
  cr_expect(strstr(r.err, "OTLP headers: expected name=value pairs") != NULL,
            "%s", r.err);
  result_free(&r);
  unsetenv("OTEL_EXPORTER_OTLP_HEADERS");
  unsetenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
  unsetenv("OTEL_EXPORTER_OTLP_ENDPOINT");
  setenv("AGENTGUARD_PROXY_LOG_FORMAT", "yaml", 1);
  r = run(ARGS("proxy", "--config", c));
  unsetenv("AGENTGUARD_PROXY_LOG_FORMAT");
  cr_expect_eq(r.status, 2);
  cr_expect(strstr(r.err, "--log-format yaml: expected text or json") != NULL,
            "%s", r.err);
  result_free(&r);
}

/* No --config: ./agentguard.json, then $XDG_CONFIG_HOME/agentguard/
 * config.json, each said on stderr; --config wins; AGENTGUARD_NO_CONFIG
 * turns the lookup off. */
Test(cli, a_default_config_file_is_looked_for) {
  const char *here = put("agentguard.json",
                         "{\"preset\": \"hpd\", \"proxy\": {\"upstream\": "
                         "\"http://127.0.0.1:9\", \"listen\": \"127.0.0.1:0\", "
                         "\"drain_timeout\": 0}}");
  result r = run_sig(ARGS("proxy"), 700);
  cr_expect(
      strstr(r.err, "agentguard proxy: config from agentguard.json") != NULL &&
          strstr(r.err, "(upstream http://127.0.0.1:9, preset hpd)") != NULL,
      "%s", r.err);
  result_free(&r);
  r = run_sig(
      ARGS("proxy", "--config",
           put("other.json", "{\"proxy\": {\"upstream\": "
                             "\"http://127.0.0.1:8\", \"listen\": "
                             "\"127.0.0.1:0\", \"drain_timeout\": 0}}")),
      700);
  cr_expect(strstr(r.err, "config from") == NULL &&
                strstr(r.err, "(upstream http://127.0.0.1:8,") != NULL,
            "--config wins over the default file: %s", r.err);
  result_free(&r);

  char xdg[256], sub[300], moved[320];
  snprintf(xdg, sizeof xdg, "%s/xdg", dir);
  snprintf(sub, sizeof sub, "%s/agentguard", xdg);
  snprintf(moved, sizeof moved, "%s/config.json", sub);
  cr_assert_eq(mkdir(xdg, 0700), 0);
  cr_assert_eq(mkdir(sub, 0700), 0);
  cr_assert_eq(rename(here, moved), 0);
  setenv("XDG_CONFIG_HOME", xdg, 1);
  r = run_sig(ARGS("proxy"), 700);
  cr_expect(strstr(r.err, "config from ") != NULL &&
                strstr(r.err, "/xdg/agentguard/config.json") != NULL &&
                strstr(r.err, "(upstream http://127.0.0.1:9, preset hpd)") !=
                    NULL,
            "%s", r.err);
  result_free(&r);
  setenv("AGENTGUARD_NO_CONFIG", "1", 1);
  r = run(ARGS("proxy"));
  cr_expect_eq(r.status, 2);
  cr_expect(strstr(r.err, "config from") == NULL &&
                strstr(r.err, "--upstream URL is required") != NULL,
            "%s", r.err);
  result_free(&r);
  unsetenv("AGENTGUARD_NO_CONFIG");
  /* a default file that is broken is named, not skipped */
  FILE *f = fopen(moved, "w");
  cr_assert_not_null(f);
  fputs("preset: hpd\n", f);
  fclose(f);
  put("x.json", "{\"messages\": []}");
  r = run(ARGS("audit", "x.json"));
  cr_expect_eq(r.status, 2);
  cr_expect(strstr(r.err, "/xdg/agentguard/config.json") != NULL &&
                strstr(r.err, "YAML") != NULL,
            "%s", r.err);
  result_free(&r);
  unsetenv("XDG_CONFIG_HOME");
}
