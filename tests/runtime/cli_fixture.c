/*
 * cli_fixture.c - test_cli's fixture: a temporary directory per test, files
 * written there, the built program run in it (exit code, stdout, stderr
 * collected; a sanitizer report fails the test) and the check of a JSON
 * Lines event log (cli_fixture.h).
 */
#include "cli_fixture.h"

char dir[64];

void setup(void) {
  strcpy(dir, "/tmp/ag_test_cli_XXXXXX");
  cr_assert_not_null(mkdtemp(dir));
}

void teardown(void) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  cr_expect_eq(system(cmd), 0);
}

/* Writes `text` to DIR/name and returns the path (static buffer ring). */
const char *put(const char *name, const char *text) {
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

char *slurp(const char *path) {
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

void result_free(result *r) {
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

pid_t spawn_prog(const char *const *args) {
  return spawn_to(args, NULL);
}

result collect(pid_t pid) {
  return collect_to(pid, NULL);
}

/*
 * Runs the program with `args` (NULL-terminated, without the program name),
 * in DIR, stdout to `stdout_to` (NULL: captured). When interrupt_ms >= 0,
 * sends SIGINT after that many ms.
 */
result run_full(const char *const *args, int interrupt_ms,
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

result run_sig(const char *const *args, int interrupt_ms) {
  return run_full(args, interrupt_ms, NULL);
}

result run(const char *const *args) {
  return run_sig(args, -1);
}

/* Runs `simulate FILE` on `scenario`; expects exit 2 and `msg` in stderr. */
void refused(const char *scenario, const char *msg) {
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

/* Every line a complete JSON object with the common fields. */
json_t *check_jsonl(const char *text, size_t *lines) {
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
