/*
 * tests/runtime/test_run.c - `agentguard run` end to end: the built program
 * against a fake OpenAI-compatible server on 127.0.0.1 (fake_model.c:
 * libmicrohttpd, in this process), with the built-in tools in a temporary
 * workdir.
 *
 * The server answers request k with reply k of the script (the last one
 * repeats) and keeps what the client sent. Covered: a task that writes a
 * file with the built-in tools and finishes (exit 0); a looping model the
 * guard stops (exit 3); escapes from the workdir refused; the API key in no
 * output; bad invocations refused before anything runs (exit 2).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <microhttpd.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agentguard.h"
#include "fake_model.h"

#define BIN AG_BINARY_DIR "/agentguard"
#define KEY "sk-run-test-KEY-0123456789abcdef"

static char workdir[256];

static void start(void) {
  fake_start();
  snprintf(workdir, sizeof(workdir), "/tmp/ag-run-XXXXXX");
  cr_assert_not_null(mkdtemp(workdir));
}

static void stop(void) {
  fake_stop();
  char cmd[1600]; /* the workdir and run_task's files beside it */
  snprintf(cmd, sizeof(cmd),
           "rm -rf '%s' '%s'.config.json '%s'.events.jsonl "
           "'%s'.out '%s'.err",
           workdir, workdir, workdir, workdir, workdir);
  if (system(cmd) != 0)
    fprintf(stderr, "could not remove %s\n", workdir);
}

TestSuite(run, .init = start, .fini = stop, .timeout = 60);

/* ---- running the program ------------------------------------------------ */

typedef struct result {
  int status;
  char *out, *err, *events;
} result;

static char *slurp(const char *path) {
  FILE *f = fopen(path, "rb");
  if (f == NULL)
    return strdup("");
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *s = malloc((size_t)n + 1);
  size_t got = fread(s, 1, (size_t)n, f);
  s[got] = '\0';
  fclose(f);
  return s;
}

/* Runs `agentguard run` with `extra` args (NULL-terminated) and TASK, with
 * the server's URL, a non-streaming config and the key in the
 * environment. */
/* run_task writes the events to stdout ("--events -") when set. */
static bool events_on_stdout;

static result run_task(const char *const *extra, const char *task) {
  char url[64], cfg[320], ev[320], out[320], errp[320];
  snprintf(url, sizeof(url), "http://127.0.0.1:%d/v1", F.port);
  snprintf(cfg, sizeof(cfg), "%s.config.json", workdir);
  snprintf(ev, sizeof(ev), "%s.events.jsonl", workdir);
  snprintf(out, sizeof(out), "%s.out", workdir);
  snprintf(errp, sizeof(errp), "%s.err", workdir);
  FILE *f = fopen(cfg, "w");
  cr_assert_not_null(f);
  fputs("{\"provider\": {\"stream\": false}}", f);
  fclose(f);
  const char *argv[32];
  size_t n = 0;
  argv[n++] = BIN;
  argv[n++] = "run";
  argv[n++] = "--model";
  argv[n++] = "fake-model";
  argv[n++] = "--base-url";
  argv[n++] = url;
  argv[n++] = "--workdir";
  argv[n++] = workdir;
  argv[n++] = "--config";
  argv[n++] = cfg;
  argv[n++] = "--events";
  argv[n++] = events_on_stdout ? "-" : ev;
  for (size_t i = 0; extra != NULL && extra[i] != NULL && n < 28; i++)
    argv[n++] = extra[i];
  if (task != NULL)
    argv[n++] = task;
  argv[n] = NULL;
  fflush(NULL);
  pid_t pid = fork();
  cr_assert(pid >= 0);
  if (pid == 0) {
    int o = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int e = open(errp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int in = open("/dev/null", O_RDONLY);
    dup2(in, 0);
    dup2(o, 1);
    dup2(e, 2);
    setsid(); /* no controlling terminal: approvals cannot be asked */
    setenv("OPENAI_API_KEY", KEY, 1);
    setenv("NO_PROXY", "127.0.0.1", 1);
    unsetenv("AGENTGUARD_MODEL");
    unsetenv("AGENTGUARD_BASE_URL");
    execv(BIN, (char *const *)argv);
    _exit(127);
  }
  int st;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  result r;
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  r.out = slurp(out);
  r.err = slurp(errp);
  r.events = slurp(ev);
  for (const char *m = "ERROR: AddressSanitizer"; m != NULL; m = NULL)
    cr_assert(strstr(r.err, m) == NULL, "%s", r.err);
  return r;
}

static void result_free(result *r) {
  free(r->out);
  free(r->err);
  free(r->events);
}

static void no_key_anywhere(const result *r) {
  cr_assert(strstr(r->out, KEY) == NULL);
  cr_assert(strstr(r->err, KEY) == NULL);
  cr_assert(strstr(r->events, KEY) == NULL);
}

/* ---- the tests ---------------------------------------------------------- */

Test(run, a_task_with_the_built_in_tools_completes) {
  F.replies[0] = CALL_REPLY(
      "write_file", "\"{\\\"path\\\":\\\"notes/hello.txt\\\",\\\"content\\\":"
                    "\\\"hello from the model\\\"}\"");
  F.replies[1] =
      CALL_REPLY("read_file", "\"{\\\"path\\\":\\\"notes/hello.txt\\\"}\"");
  F.replies[2] = TEXT_REPLY("I wrote notes/hello.txt.");
  F.n_replies = 3;
  const char *const full[] = {"--events-detail", "full", NULL};
  result r = run_task(full, "Write hello into notes/hello.txt");
  cr_assert_eq(r.status, 0, "exit %d\nstderr: %s", r.status, r.err);
  char path[400];
  snprintf(path, sizeof(path), "%s/notes/hello.txt", workdir);
  char *content = slurp(path);
  cr_assert_str_eq(content, "hello from the model");
  free(content);
  const char *answer = strstr(r.out, "I wrote notes/hello.txt.");
  cr_assert(answer != NULL, "%s", r.out);
  /* once: the provider (not streaming) hands the text to on_delta too */
  cr_assert(strstr(answer + 1, "I wrote notes/hello.txt.") == NULL,
            "the answer is on stdout twice: %s", r.out);
  cr_assert_eq(F.n_requests, 3);
  /* what the model saw: the tools offered, the read's result */
  cr_assert(strstr(F.bodies, "\"read_file\"") != NULL);
  cr_assert(strstr(F.bodies, "hello from the model") != NULL);
  cr_assert(strstr(r.events, "\"turn_end\"") != NULL);
  cr_assert(strstr(r.events, "\"tokens\":345") != NULL, "%s", r.events);
  /* what the model saw, in the events (--events-detail full): the messages
   * sent and the tools offered */
  cr_assert(strstr(r.events, "\"messages\":[{\"role\":\"system\"") != NULL,
            "%s", r.events);
  cr_assert(strstr(r.events, "\"tools\":[\"read_file\"") != NULL ||
                strstr(r.events, "\"read_file\",") != NULL,
            "%s", r.events);
  no_key_anywhere(&r);
  result_free(&r);
}

Test(run, events_on_stdout_leave_stdout_json_lines_only) {
  F.replies[0] = TEXT_REPLY("pong");
  F.n_replies = 1;
  events_on_stdout = true;
  result r = run_task(NULL, "Say pong");
  events_on_stdout = false;
  cr_assert_eq(r.status, 0, "exit %d\nstderr: %s", r.status, r.err);
  int lines = 0;
  for (char *line = strtok(r.out, "\n"); line != NULL;
       line = strtok(NULL, "\n"), lines++) {
    json_t *j = json_loads(line, 0, NULL);
    cr_assert(json_is_object(j) && json_object_get(j, "event") != NULL,
              "stdout line %d is no event: %s", lines + 1, line);
    json_decref(j);
  }
  cr_assert_gt(lines, 2);
  cr_assert(strstr(r.err, "pong") != NULL, "the answer on stderr: %s", r.err);
  result_free(&r);
}

Test(run, output_format_json_is_one_result_object) {
  F.replies[0] = TEXT_REPLY("pong");
  F.n_replies = 1;
  const char *const json[] = {"--output-format", "json", NULL};
  result r = run_task(json, "Say pong");
  cr_assert_eq(r.status, 0, "exit %d\nstderr: %s", r.status, r.err);
  json_error_t je;
  json_t *j = json_loads(r.out, 0, &je);
  cr_assert_not_null(j, "stdout is not one JSON value (%s): %s", je.text,
                     r.out);
  cr_expect_str_eq(json_string_value(json_object_get(j, "status")),
                   "completed");
  cr_expect_str_eq(json_string_value(json_object_get(j, "final_text")), "pong");
  cr_expect_eq(json_integer_value(json_object_get(j, "iterations")), 1);
  cr_expect_eq(json_integer_value(json_object_get(j, "exit_code")), 0);
  json_decref(j);
  result_free(&r);
  const char *const bad[] = {"--output-format", "yaml", NULL};
  r = run_task(bad, "x");
  cr_expect_eq(r.status, 2);
  cr_expect(strstr(r.err, "--output-format yaml: expected text, json or "
                          "stream-json") != NULL,
            "%s", r.err);
  result_free(&r);
}

/* stream-json: every event on stdout as it happens, then the turn's result
 * as a "result" event; each line parses, the text is on stderr. With
 * --events FILE as well it is refused (the events would go twice). */
Test(run, output_format_stream_json_is_the_events_then_the_result) {
  F.replies[0] = TEXT_REPLY("pong");
  F.n_replies = 1;
  events_on_stdout = true;
  const char *const sj[] = {"--output-format", "stream-json", NULL};
  result r = run_task(sj, "Say pong");
  events_on_stdout = false;
  cr_assert_eq(r.status, 0, "exit %d\nstderr: %s", r.status, r.err);
  int lines = 0;
  bool turn_end = false, result_last = false;
  for (char *line = strtok(r.out, "\n"); line != NULL;
       line = strtok(NULL, "\n"), lines++) {
    json_t *j = json_loads(line, 0, NULL);
    const char *ev = json_string_value(json_object_get(j, "event"));
    cr_assert(ev != NULL, "stdout line %d is no event: %s", lines + 1, line);
    turn_end = turn_end || strcmp(ev, "turn_end") == 0;
    result_last = strcmp(ev, "result") == 0;
    if (result_last) {
      cr_expect(turn_end, "the result came before the turn's end");
      cr_expect_str_eq(json_string_value(json_object_get(j, "final_text")),
                       "pong");
      cr_expect_eq(json_integer_value(json_object_get(j, "exit_code")), 0);
    }
    json_decref(j);
  }
  cr_assert_gt(lines, 3);
  cr_assert(result_last, "the last line is not the result");
  cr_assert(strstr(r.err, "pong") != NULL, "the answer on stderr: %s", r.err);
  result_free(&r);
  r = run_task(sj, "x"); /* with --events FILE */
  cr_expect_eq(r.status, 2);
  cr_expect(strstr(r.err, "--output-format stream-json writes the events to "
                          "stdout") != NULL,
            "%s", r.err);
  result_free(&r);
}

/* The attribute `key` of an OTLP span: a string, or an int as decimal
 * text in buf. */
static const char *span_attr(const json_t *span, const char *key, char *buf,
                             size_t cap) {
  size_t i;
  json_t *a;
  json_array_foreach(json_object_get(span, "attributes"), i, a) {
    if (strcmp(json_string_value(json_object_get(a, "key")), key) != 0)
      continue;
    json_t *v = json_object_get(a, "value");
    if (json_is_string(json_object_get(v, "stringValue")))
      return json_string_value(json_object_get(v, "stringValue"));
    snprintf(buf, cap, "%lld",
             (long long)json_integer_value(json_object_get(v, "intValue")));
    return buf;
  }
  return NULL;
}

/* --otlp-endpoint: a turn is an invoke_agent span, with a chat span per
 * model request and an execute_tool span per call under it, posted when
 * the program ends (here to the fake model's server, which keeps the body);
 * TRACEPARENT puts the turn in the caller's trace. */
Test(run, a_turn_is_traced_as_genai_spans) {
  F.replies[0] =
      CALL_REPLY("read_file", "\"{\\\"path\\\":\\\"missing.txt\\\"}\"");
  F.replies[1] = TEXT_REPLY("No such file.");
  F.n_replies = 2;
  char endpoint[64];
  snprintf(endpoint, sizeof endpoint, "http://127.0.0.1:%d", F.port);
  const char *const extra[] = {"--otlp-endpoint", endpoint, NULL};
  setenv("TRACEPARENT",
         "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", 1);
  result r = run_task(extra, "Read missing.txt");
  unsetenv("TRACEPARENT");
  cr_assert_eq(r.status, 0, "exit %d\nstderr: %s", r.status, r.err);
  cr_assert_eq(F.n_requests, 3, "two model requests and the export");
  char *body = fake_body(2);
  json_t *j = json_loads(body, 0, NULL);
  cr_assert_not_null(j, "the export is not JSON: %s", body);
  json_t *spans = json_object_get(
      json_array_get(json_object_get(
                         json_array_get(json_object_get(j, "resourceSpans"), 0),
                         "scopeSpans"),
                     0),
      "spans");
  cr_assert_eq(json_array_size(spans), 4, "%s", body);
  json_t *turn = NULL, *tool = NULL;
  int chats = 0;
  size_t i;
  json_t *s;
  json_array_foreach(spans, i, s) {
    const char *name = json_string_value(json_object_get(s, "name"));
    cr_expect_str_eq(json_string_value(json_object_get(s, "traceId")),
                     "4bf92f3577b34da6a3ce929d0e0e4736");
    if (strcmp(name, "invoke_agent agentguard") == 0)
      turn = s;
    else if (strcmp(name, "execute_tool read_file") == 0)
      tool = s;
    else
      chats += strcmp(name, "chat fake-model") == 0;
  }
  cr_assert(turn != NULL && tool != NULL && chats == 2, "%s", body);
  cr_expect_str_eq(json_string_value(json_object_get(turn, "parentSpanId")),
                   "00f067aa0ba902b7");
  const char *turn_id = json_string_value(json_object_get(turn, "spanId"));
  char buf[32];
  json_array_foreach(spans, i, s) {
    if (s == turn)
      continue;
    cr_expect_str_eq(json_string_value(json_object_get(s, "parentSpanId")),
                     turn_id, "every span is the turn's child");
    if (strstr(json_string_value(json_object_get(s, "name")), "chat ") == NULL)
      continue;
    /* each request's own usage: 100 + 10 (the call), 120 + 5 (the text) */
    char in[32], out[32];
    const char *ti = span_attr(s, "gen_ai.usage.input_tokens", in, sizeof in);
    const char *to =
        span_attr(s, "gen_ai.usage.output_tokens", out, sizeof out);
    cr_assert(ti != NULL && to != NULL);
    cr_expect(strcmp(ti, "100") == 0
                  ? strcmp(to, "10") == 0
                  : strcmp(ti, "120") == 0 && strcmp(to, "5") == 0,
              "tokens %s + %s", ti, to);
  }
  cr_expect_str_eq(span_attr(turn, "gen_ai.operation.name", buf, sizeof buf),
                   "invoke_agent");
  cr_expect_str_eq(span_attr(turn, "agentguard.status", buf, sizeof buf),
                   "completed");
  cr_expect_str_eq(span_attr(tool, "gen_ai.tool.name", buf, sizeof buf),
                   "read_file");
  cr_expect_str_eq(span_attr(tool, "error.type", buf, sizeof buf), "not_found");
  cr_expect_eq(json_integer_value(
                   json_object_get(json_object_get(tool, "status"), "code")),
               2);
  json_decref(j);
  free(body);
  result_free(&r);
}

Test(run, model_requests_carry_counts_by_default) {
  F.replies[0] = TEXT_REPLY("Hello.");
  F.n_replies = 1;
  result r = run_task(NULL, "Say hello");
  cr_assert_eq(r.status, 0, "exit %d\nstderr: %s", r.status, r.err);
  cr_assert(strstr(r.events, "\"messages\":2,") != NULL, "%s", r.events);
  cr_assert(strstr(r.events, "Say hello\"") == NULL ||
                strstr(r.events, "\"turn_start\"") != NULL,
            "%s", r.events);
  result_free(&r);
}

Test(run, a_looping_model_is_stopped) {
  F.replies[0] =
      CALL_REPLY("list_dir", "\"{\\\"path\\\":\\\".\\\"}\""); /* forever */
  F.n_replies = 1;
  result r = run_task(NULL, "List the files");
  cr_assert_eq(r.status, 3, "exit %d\nstderr: %s", r.status, r.err);
  cr_assert(strstr(r.events, "\"reason\":\"identical_calls\"") != NULL ||
                strstr(r.events, "\"reason\":\"repeated_results\"") != NULL,
            "%s", r.events);
  cr_assert_leq(F.n_requests, 6, "stopped early: %d requests", F.n_requests);
  no_key_anywhere(&r);
  result_free(&r);
}

Test(run, escapes_from_the_workdir_are_refused) {
  F.replies[0] =
      CALL_REPLY("read_file", "\"{\\\"path\\\":\\\"../../etc/passwd\\\"}\"");
  F.replies[1] =
      CALL_REPLY("read_file", "\"{\\\"path\\\":\\\"/etc/passwd\\\"}\"");
  F.replies[2] = TEXT_REPLY("I cannot read it.");
  F.n_replies = 3;
  result r = run_task(NULL, "Read /etc/passwd");
  cr_assert_eq(r.status, 0, "exit %d\nstderr: %s", r.status, r.err);
  cr_assert(strstr(r.events, "escapes the workdir") != NULL, "%s", r.events);
  cr_assert(strstr(F.bodies, "root:x:0:0") == NULL, "a file outside leaked");
  cr_assert(strstr(r.events, "root:x:0:0") == NULL);
  result_free(&r);
}

Test(run, commands_need_approval_and_there_is_no_terminal) {
  F.replies[0] =
      CALL_REPLY("run_command", "\"{\\\"command\\\":\\\"touch ran.txt\\\"}\"");
  F.replies[1] = TEXT_REPLY("It was not allowed.");
  F.n_replies = 2;
  const char *const extra[] = {"--allow-commands", NULL};
  result r = run_task(extra, "Touch a file");
  cr_assert_eq(r.status, 0, "exit %d\nstderr: %s", r.status, r.err);
  cr_assert(strstr(r.events, "--yes") != NULL, "%s", r.events);
  char path[400];
  snprintf(path, sizeof(path), "%s/ran.txt", workdir);
  cr_assert_neq(access(path, F_OK), 0, "the command ran without approval");
  result_free(&r);
  /* with --yes it runs */
  F.n_requests = 0;
  const char *const yes[] = {"--allow-commands", "--yes", NULL};
  r = run_task(yes, "Touch a file");
  cr_assert_eq(r.status, 0, "exit %d\nstderr: %s", r.status, r.err);
  cr_assert_eq(access(path, F_OK), 0, "the approved command did not run");
  result_free(&r);
}

Test(run, bad_invocations_run_nothing) {
  F.replies[0] = TEXT_REPLY("never");
  F.n_replies = 1;
  const char *const bad_kind[] = {"--provider", "vertex", NULL};
  result r = run_task(bad_kind, "x");
  cr_assert_eq(r.status, 2);
  cr_assert(strstr(r.err, "--provider vertex: unknown kind") != NULL, "%s",
            r.err);
  result_free(&r);
  const char *const bad_preset[] = {"--preset", "defualt", NULL};
  r = run_task(bad_preset, "x");
  cr_assert_eq(r.status, 2);
  cr_assert(strstr(r.err, "did you mean default") != NULL, "%s", r.err);
  result_free(&r);
  r = run_task(NULL, NULL); /* no task, no terminal */
  cr_assert_eq(r.status, 2);
  cr_assert(strstr(r.err, "no TASK and no terminal") != NULL, "%s", r.err);
  result_free(&r);
  cr_assert_eq(F.n_requests, 0, "a bad invocation reached the model");
}
