/*
 * cli_output.c - output never lost silently and inputs never overwritten
 * (issue 10), events written as whole lines and the audit of a log cut by a
 * crash (issue 25) (test_cli's cases; the directory, the files and the runs
 * are cli_fixture.h's).
 */
#include "cli_fixture.h"

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
