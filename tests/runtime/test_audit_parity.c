/*
 * tests/runtime/test_audit_parity.c - a run replayed by `agentguard audit`
 * stops at the same step, for the same reason, as the same run played live.
 *
 * For every scenario in examples/scenarios/ the live run is
 * `agentguard simulate --events LOG SCENARIO` (the agent loop, the
 * scheduler, retries, approvals: src/agent/loop.c). Its event log is then
 * audited with the scenario's own preset and config
 * (`agentguard audit --json --config CFG LOG`). The live stop is the first
 * escalation event, or else the first turn that ended stopped, escalated or
 * timed out: turn T after I iterations. The audit must report its first stop
 * at turn T, step I of that turn, with the same reason (an escalation: the
 * action "escalate"); a live run that never stopped must audit without a
 * stop.
 *
 * Scenarios that set loop.max_turn_duration are left out: a turn timeout is
 * judged from the log's millisecond timestamps, and the live deadline and
 * the turn_start event can fall on either side of a millisecond boundary,
 * so their parity would depend on the clock (it holds in practice; a test
 * must not flake).
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define BIN AG_BINARY_DIR "/agentguard"
#define SCENARIOS AG_SOURCE_DIR "/examples/scenarios"

/* Runs argv in `dir` with stdout to `out_path` (NULL: /dev/null); returns
 * the exit status, or -1. */
static int run(const char *dir, char *const argv[], const char *out_path) {
  pid_t pid = fork();
  cr_assert_neq(pid, -1, "fork: %s", strerror(errno));
  if (pid == 0) {
    if (chdir(dir) != 0)
      _exit(126);
    int fd = open(out_path != NULL ? out_path : "/dev/null",
                  O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int null = open("/dev/null", O_WRONLY);
    if (fd < 0 || null < 0)
      _exit(126);
    dup2(fd, 1);
    dup2(null, 2);
    execv(argv[0], argv);
    _exit(127);
  }
  int st;
  while (waitpid(pid, &st, 0) < 0)
    cr_assert_eq(errno, EINTR);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

typedef struct stop_point {
  bool stopped;
  bool escalated;
  int turn, step;
  char reason[64];
} stop_point;

/* The live stop point from the event log. */
static stop_point live_stop(const char *log) {
  stop_point p;
  memset(&p, 0, sizeof(p));
  FILE *f = fopen(log, "r");
  cr_assert_not_null(f, "%s: %s", log, strerror(errno));
  char *line = NULL;
  size_t cap = 0;
  bool escalation_seen = false;
  while (getline(&line, &cap, f) > 0) {
    json_t *e = json_loads(line, 0, NULL);
    cr_assert_not_null(e, "%s: a line is not JSON: %s", log, line);
    const char *ev = json_string_value(json_object_get(e, "event"));
    int turn = (int)json_integer_value(json_object_get(e, "turn"));
    if (!p.stopped && ev != NULL && strcmp(ev, "escalation") == 0) {
      p.stopped = p.escalated = escalation_seen = true;
      p.turn = turn;
      p.step = (int)json_integer_value(json_object_get(e, "iteration"));
    } else if (ev != NULL && strcmp(ev, "turn_end") == 0) {
      const char *status = json_string_value(json_object_get(e, "status"));
      const char *reason = json_string_value(json_object_get(e, "reason"));
      bool stop = strcmp(status, "stopped") == 0 ||
                  strcmp(status, "escalated") == 0 ||
                  strcmp(status, "timed_out") == 0;
      if (!p.stopped && stop) {
        p.stopped = true;
        p.turn = turn;
        p.step = (int)json_integer_value(json_object_get(e, "iterations"));
        snprintf(p.reason, sizeof(p.reason), "%s", reason);
        /* At the iteration cap N the stop is the refused request N+1
         * (made without tools or not at all). */
        const char *msg = json_string_value(json_object_get(e, "message"));
        const char *num = msg != NULL ? strstr(msg, "maximum of ") : NULL;
        if (strcmp(reason, "max_iterations") == 0 && num != NULL)
          p.step = atoi(num + 11) + 1;
        /* The token budget refuses request I+1 the same way. */
        if (strcmp(reason, "token_budget") == 0)
          p.step++;
      } else if (escalation_seen && p.turn == turn && p.reason[0] == '\0' &&
                 strcmp(status, "escalated") == 0) {
        snprintf(p.reason, sizeof(p.reason), "%s", reason);
      }
    }
    json_decref(e);
  }
  free(line);
  fclose(f);
  return p;
}

/* The audit's first stop from its JSON Lines output. */
static stop_point audit_stop(const char *out, const char *name) {
  stop_point p;
  memset(&p, 0, sizeof(p));
  FILE *f = fopen(out, "r");
  cr_assert_not_null(f);
  char *line = NULL;
  size_t cap = 0;
  bool seen = false;
  while (getline(&line, &cap, f) > 0) {
    json_t *o = json_loads(line, 0, NULL);
    cr_assert_not_null(o, "%s: audit printed a line that is not JSON: %s", name,
                       line);
    const char *type = json_string_value(json_object_get(o, "type"));
    cr_assert(type != NULL && strcmp(type, "skipped") != 0,
              "%s: the event log was skipped: %s", name, line);
    if (strcmp(type, "run") == 0) {
      seen = true;
      cr_assert_str_eq(json_string_value(json_object_get(o, "format")),
                       "events");
      json_t *st = json_object_get(o, "stop");
      if (json_is_object(st)) {
        p.stopped = true;
        p.turn = (int)json_integer_value(json_object_get(st, "turn"));
        p.step = (int)json_integer_value(json_object_get(st, "step_in_turn"));
        p.escalated = strcmp(json_string_value(json_object_get(st, "action")),
                             "escalate") == 0;
        snprintf(p.reason, sizeof(p.reason), "%s",
                 json_string_value(json_object_get(st, "reason")));
      }
    }
    json_decref(o);
  }
  free(line);
  fclose(f);
  cr_assert(seen, "%s: audit printed no run", name);
  return p;
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

typedef struct tally {
  int compared, stopped, mismatches;
} tally;

/* Plays scenario `path` live and audits its event log; prints one row and
 * counts it. Temporary files go to `tmp`. */
static void compare(const char *path, const char *label, const char *tmp,
                    tally *tl) {
  char log[1024], cfg[1024], out[1024];
  json_error_t je;
  json_t *sc = json_load_file(path, 0, &je);
  cr_assert_not_null(sc, "%s: %s", path, je.text);
  json_t *config = json_object_get(sc, "config");
  if (json_object_get(json_object_get(config, "loop"), "max_turn_duration") !=
      NULL) {
    printf("%-36s (left out: judged from wall-clock timestamps)\n", label);
    json_decref(sc);
    return;
  }
  /* The scenario's preset and config, as a config file for audit. */
  json_t *c = json_is_object(config) ? json_deep_copy(config) : json_object();
  const char *preset = json_string_value(json_object_get(sc, "preset"));
  if (json_object_get(c, "preset") == NULL)
    json_object_set_new(c, "preset",
                        json_string(preset != NULL ? preset : "default"));
  snprintf(log, sizeof(log), "%s/%d.events.jsonl", tmp, tl->compared);
  snprintf(cfg, sizeof(cfg), "%s/%d.config.json", tmp, tl->compared);
  snprintf(out, sizeof(out), "%s/%d.audit.jsonl", tmp, tl->compared);
  cr_assert_eq(json_dump_file(c, cfg, 0), 0);
  json_decref(c);
  json_decref(sc);

  char *sim[] = {BIN, "simulate", "-q", "--events", log, (char *)path, NULL};
  int rc = run(SCENARIOS, sim, NULL);
  cr_assert(rc == 0 || rc == 1 || rc == 3 || rc == 4, "%s: simulate exited %d",
            label, rc);
  char *aud[] = {BIN, "audit", "--json", "--config", cfg, log, NULL};
  rc = run(SCENARIOS, aud, out);
  cr_assert_eq(rc, 0, "%s: audit exited %d", label, rc);

  stop_point live = live_stop(log), got = audit_stop(out, label);
  char a[128] = "-", b[128] = "-";
  if (live.stopped)
    snprintf(a, sizeof(a), "%d %d %s%s", live.turn, live.step, live.reason,
             live.escalated ? " (escalated)" : "");
  if (got.stopped)
    snprintf(b, sizeof(b), "%d %d %s%s", got.turn, got.step, got.reason,
             got.escalated ? " (escalate)" : "");
  bool same =
      live.stopped == got.stopped &&
      (!live.stopped ||
       (live.turn == got.turn && live.step == got.step &&
        live.escalated == got.escalated &&
        (live.reason[0] == '\0' || strcmp(live.reason, got.reason) == 0)));
  printf("%-36s %-30s %-30s%s\n", label, a, b, same ? "" : "  MISMATCH");
  tl->compared++;
  tl->stopped += live.stopped;
  tl->mismatches += !same;
  unlink(log);
  unlink(cfg);
  unlink(out);
}

static void header(void) {
  printf("\n%-36s %-30s %-30s\n", "scenario", "live (turn step reason)",
         "audit");
}

Test(parity, every_example_scenario) {
  struct stat st;
  cr_assert_eq(stat(BIN, &st), 0, "%s is not built", BIN);
  char tmp[] = "/tmp/ag-audit-parity.XXXXXX";
  cr_assert_not_null(mkdtemp(tmp));

  DIR *d = opendir(SCENARIOS);
  cr_assert_not_null(d);
  char *names[256];
  size_t n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL && n < 256) {
    size_t l = strlen(e->d_name);
    if (l > 5 && strcmp(e->d_name + l - 5, ".json") == 0)
      names[n++] = strdup(e->d_name);
  }
  closedir(d);
  qsort(names, n, sizeof(names[0]), cmp_str);
  cr_assert_geq(n, 5, "too few scenarios in %s", SCENARIOS);

  tally tl = {0, 0, 0};
  header();
  for (size_t i = 0; i < n; i++) {
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", SCENARIOS, names[i]);
    compare(path, names[i], tmp, &tl);
    free(names[i]);
  }
  fflush(stdout);
  rmdir(tmp);
  cr_assert_eq(tl.mismatches, 0,
               "%d of %d scenarios audit differently from their live run "
               "(table above)",
               tl.mismatches, tl.compared);
  cr_assert_geq(tl.stopped, 5, "too few scenarios stop: the test shows little");
}

/* The iteration cap, with and without the wrap-up request, over two turns
 * (the second turn starts fresh: only it reaches the cap). */
Test(parity, iteration_cap) {
  char tmp[] = "/tmp/ag-audit-parity.XXXXXX";
  cr_assert_not_null(mkdtemp(tmp));
  tally tl = {0, 0, 0};
  header();
  for (int wrap = 0; wrap < 2; wrap++) {
    char path[1024];
    snprintf(path, sizeof(path), "%s/cap_%s.json", tmp,
             wrap ? "wrap_up" : "no_wrap_up");
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fprintf(f,
            "{\"preset\": \"default\", \"config\": {\"loop\": "
            "{\"max_iterations\": 3, \"final_request_without_tools\": %s}},\n"
            " \"tools\": {\"step\": {\"description\": \"one step\", "
            "\"responses\": [{\"ok\": \"done\"}]}},\n"
            " \"turns\": [\n"
            "  {\"user\": \"short\", \"model\": [{\"tool_calls\": "
            "[{\"name\": \"step\", \"arguments\": {\"i\": 1}}]}, "
            "{\"text\": \"ok\"}]},\n"
            "  {\"user\": \"long\", \"model\": [\n"
            "   {\"tool_calls\": [{\"name\": \"step\", \"arguments\": "
            "{\"i\": 1}}]},\n"
            "   {\"tool_calls\": [{\"name\": \"step\", \"arguments\": "
            "{\"i\": 2}}]},\n"
            "   {\"tool_calls\": [{\"name\": \"step\", \"arguments\": "
            "{\"i\": 3}}]},\n"
            "   {\"text\": \"all done\"}]}]}\n",
            wrap ? "true" : "false");
    fclose(f);
    compare(path, wrap ? "iteration cap, wrap-up" : "iteration cap, no wrap-up",
            tmp, &tl);
    unlink(path);
  }
  fflush(stdout);
  rmdir(tmp);
  cr_assert_eq(tl.mismatches, 0, "see the table above");
  cr_assert_eq(tl.stopped, 2);
}
