/*
 * tests/unit/test_audit.c - trajectories and the audit (agentguard/audit.h):
 * the 31 bundled real runs (every one parses; where each preset stops them;
 * the traps of shared/data/README.md; skipped, saying so, when ../shared is
 * not beside the project), the project's own runs in tests/fixtures/runs/
 * (the same rules, always run), each input format against its
 * neutral equivalent, bad inputs, a cut last line of JSON Lines (left out,
 * only when last and without its newline), --all-stops, and the replay
 * rules (nudges, escalation, rejected replies, replies without tool calls,
 * time).
 * Core tests never sleep: time comes from the recordings.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agentguard.h"
#include "agentguard/audit.h"

#define TRAJ_DIR AG_SHARED_DIR "/data/trajectories"

/* ---- helpers ------------------------------------------------------------ */

static char *read_all(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  cr_assert_not_null(f, "cannot open %s", path);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)n + 1);
  cr_assert_not_null(buf);
  cr_assert_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
  buf[n] = '\0';
  fclose(f);
  *len = (size_t)n;
  return buf;
}

static ag_trajectory *parse_ok(const char *text) {
  ag_trajectory *t = NULL;
  ag_error_t err;
  ag_err_t rc = ag_trajectory_parse(&t, text, strlen(text), NULL, &err);
  cr_assert_eq(rc, AG_OK, "parse failed (%s): %s", ag_err_name(rc), err.msg);
  cr_assert_not_null(t);
  return t;
}

/* Parses text that must fail with `code`; returns the message (static). */
static const char *parse_fail(const char *text, ag_err_t code) {
  static ag_error_t err;
  ag_trajectory *t = (ag_trajectory *)1;
  ag_err_t rc = ag_trajectory_parse(&t, text, strlen(text), NULL, &err);
  cr_assert_eq(rc, code, "expected %s, got %s (%s) for: %.200s",
               ag_err_name(code), ag_err_name(rc), err.msg, text);
  cr_assert_null(t, "out must be NULL on failure");
  cr_assert_eq(err.code, code);
  cr_assert(err.msg[0] != '\0', "an error needs a message");
  return err.msg;
}

/* Skips the running test, saying so on stderr (`make test` lists these
 * lines) and to Criterion, when `path` is missing: ../shared is not beside
 * a clone of the project alone. */
static void skip_without(const char *path, const char *instead) {
  if (access(path, R_OK) == 0)
    return;
  fprintf(stderr,
          "skipped: %s::%s: %s not found (../shared is not beside the "
          "project); %s runs instead\n",
          criterion_current_test->category, criterion_current_test->name, path,
          instead);
  cr_skip_test("skipped: %s not found (../shared is not beside the project); "
               "%s runs instead",
               path, instead);
}

/* The bundled runs live in ../shared: the tests that need them skip when it
 * is not there (the "fixtures" suite covers the same rules on runs written
 * for the project). */
static void need_bundled(void) {
  skip_without(TRAJ_DIR, "the fixtures suite");
}

static ag_trajectory *bundled(const char *name) {
  need_bundled();
  char path[1024];
  snprintf(path, sizeof(path), "%s/%s.json", TRAJ_DIR, name);
  size_t len;
  char *buf = read_all(path, &len);
  ag_trajectory *t = NULL;
  ag_error_t err;
  cr_assert_eq(ag_trajectory_parse(&t, buf, len, NULL, &err), AG_OK, "%s: %s",
               name, err.msg);
  free(buf);
  return t;
}

static ag_config preset(const char *name) {
  ag_config cfg;
  ag_error_t err;
  cr_assert_eq(ag_config_preset(&cfg, name, &err), AG_OK, "%s", err.msg);
  return cfg;
}

static ag_config config_json(const char *json) {
  ag_config cfg;
  ag_error_t err;
  cr_assert_eq(ag_config_parse(&cfg, json, strlen(json), &err), AG_OK, "%s",
               err.msg);
  return cfg;
}

static ag_audit_finding audit_cfg(const ag_trajectory *t, const ag_config *cfg,
                                  bool all_stops) {
  ag_audit_opts o;
  ag_audit_opts_init(&o);
  o.all_stops = all_stops;
  ag_auditor *a = NULL;
  ag_error_t err;
  cr_assert_eq(ag_auditor_new(&a, cfg, &o, &err), AG_OK, "%s", err.msg);
  ag_audit_finding f;
  cr_assert_eq(ag_auditor_run(a, t, &f, &err), AG_OK, "%s", err.msg);
  ag_auditor_free(a);
  return f;
}

static ag_audit_finding audit(const ag_trajectory *t, const char *name) {
  ag_config cfg = preset(name);
  return audit_cfg(t, &cfg, false);
}

static const char *stop_str(const ag_audit_stop *s, char *buf, size_t cap) {
  if (!s->stopped)
    snprintf(buf, cap, "-");
  else
    snprintf(buf, cap, "%d %s%s", s->step, ag_reason_name(s->reason),
             s->action == AG_ESCALATE ? " (escalate)" : "");
  return buf;
}

/* The bundled runs, sorted, with their annotation. */
typedef struct bundled_run {
  char name[256];
  bool loop_visible;
  int loop_first_step; /* 0 when none */
  int steps;
  char outcome[16];
} bundled_run;

static int cmp_run(const void *a, const void *b) {
  return strcmp(((const bundled_run *)a)->name, ((const bundled_run *)b)->name);
}

static size_t list_bundled(bundled_run *out, size_t cap) {
  static const char *const names[] = {
      "mini__django__django-11299",
      "mini__django__django-14140",
      "mini__django__django-14349",
      "mini__django__django-15987",
      "mini__mwaskom__seaborn-3069",
      "mini__pylint-dev__pylint-8898",
      "mini__pytest-dev__pytest-5840",
      "mini__sphinx-doc__sphinx-10466",
      "mini__sympy__sympy-13480",
      "mini__sympy__sympy-19040",
      "swea_java__deepseek-chat-v2__apache__dubbo-7041",
      "swea_java__deepseek-chat-v2__fasterxml__jackson-databind-4219",
      "swea_java__deepseek-chat-v2__google__gson-1391",
      "swea_java__deepseek-chat-v2__googlecontainertools__jib-4035",
      "swea_java__deepseek-coder-v2__fasterxml__jackson-databind-4249",
      "swea_java__deepseek-coder-v2__google__gson-1093",
      "swea_java__doubao-pro-128k__apache__dubbo-9187",
      "swea_java__doubao-pro-128k__fasterxml__jackson-core-370",
      "swea_java__doubao-pro-128k__fasterxml__jackson-databind-1113",
      "swea_java__gpt-4o-2024-05-13__fasterxml__jackson-core-1309",
      "swea_java__gpt-4o-2024-05-13__fasterxml__jackson-databind-4087",
      "swea_java__gpt-4o-mini-2024-07-18__fasterxml__jackson-databind-3701",
      "swea_java__gpt-4o-mini-2024-07-18__fasterxml__jackson-databind-4230",
      "swea_java__gpt-4o-mini-2024-07-18__fasterxml__jackson-databind-4426",
      "tau_airline__task13_trial0",
      "tau_airline__task13_trial2",
      "tau_airline__task13_trial3",
      "tau_airline__task20_trial1",
      "tau_airline__task23_trial3",
      "tau_airline__task3_trial0",
      "tau_airline__task9_trial2",
  };
  size_t n = sizeof(names) / sizeof(names[0]);
  need_bundled();
  cr_assert(n <= cap);
  for (size_t i = 0; i < n; i++) {
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s.json", TRAJ_DIR, names[i]);
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    cr_assert_not_null(j, "%s: %s", path, je.text);
    bundled_run *r = &out[i];
    memset(r, 0, sizeof(*r));
    snprintf(r->name, sizeof(r->name), "%s", names[i]);
    json_t *an = json_object_get(j, "annotation");
    r->loop_visible = json_is_true(json_object_get(an, "loop_visible"));
    json_t *lfs = json_object_get(an, "loop_first_step");
    r->loop_first_step =
        json_is_integer(lfs) ? (int)json_integer_value(lfs) : 0;
    r->steps = (int)json_array_size(json_object_get(j, "steps"));
    snprintf(r->outcome, sizeof(r->outcome), "%s",
             json_string_value(json_object_get(j, "outcome")));
    json_decref(j);
  }
  qsort(out, n, sizeof(*out), cmp_run);
  return n;
}

/* ---- the bundled trajectories ------------------------------------------- */

Test(bundled, every_run_parses_with_its_shape) {
  bundled_run runs[64];
  size_t n = list_bundled(runs, 64);
  cr_assert_eq(n, 31);
  int looping = 0;
  for (size_t i = 0; i < n; i++) {
    ag_trajectory *t = bundled(runs[i].name);
    cr_assert_eq(t->format, AG_TRAJ_NEUTRAL, "%s", runs[i].name);
    cr_assert_eq((int)t->n_steps, runs[i].steps, "%s: %zu steps, file has %d",
                 runs[i].name, t->n_steps, runs[i].steps);
    cr_assert_str_eq(ag_run_outcome_name(t->outcome), runs[i].outcome, "%s",
                     runs[i].name);
    cr_assert_not_null(t->source);
    cr_assert(!t->timed);
    /* mini-swe-agent and SWE-agent runs are one task: one turn; tau-bench
     * runs start a turn at each user message. */
    if (strncmp(runs[i].name, "tau_", 4) != 0)
      cr_assert_eq(t->n_turns, 1, "%s", runs[i].name);
    else
      cr_assert_gt(t->n_turns, 1, "%s", runs[i].name);
    size_t steps = 0;
    for (size_t k = 0; k < t->n_turns; k++) {
      cr_assert_gt(t->turns[k].n_steps, 0);
      steps += t->turns[k].n_steps;
    }
    cr_assert_eq(steps, t->n_steps);
    looping += runs[i].loop_visible;
    ag_trajectory_free(t);
  }
  cr_assert_eq(looping, 18, "the README says 18 of 31 visibly loop");
}

Test(bundled, rejected_replies_are_one_observation) {
  /* django-11299 step 16: the harness refused a reply with two actions */
  ag_trajectory *t = bundled("mini__django__django-11299");
  const ag_traj_step *s = &t->turns[0].steps[15];
  cr_assert(s->rejected);
  cr_assert_eq(s->n_calls, 2);
  cr_assert_eq(s->n_results, 1);
  cr_assert_eq(s->results[0].outcome, AG_OUTCOME_ERROR);
  cr_assert(strncmp(s->results[0].text, "Please always provide EXACTLY ONE",
                    33) == 0);
  cr_assert(!t->turns[0].steps[0].rejected);
  ag_trajectory_free(t);
}

Test(bundled, per_preset_table) {
  /* Printed for people (not asserted beyond sanity): where every preset
   * stops every bundled run. */
  bundled_run runs[64];
  size_t n = list_bundled(runs, 64);
  const char *const *names = ag_preset_names();
  printf("\nper-preset first stops on the bundled runs (step reason):\n");
  for (size_t p = 0; names[p] != NULL; p++) {
    int stopped = 0;
    ag_audit_summary sum;
    ag_audit_summary_init(&sum);
    ag_config cfg = preset(names[p]);
    ag_audit_opts o;
    ag_audit_opts_init(&o);
    ag_auditor *a = NULL;
    cr_assert_eq(ag_auditor_new(&a, &cfg, &o, NULL), AG_OK);
    for (size_t i = 0; i < n; i++) {
      ag_trajectory *t = bundled(runs[i].name);
      ag_audit_finding f;
      cr_assert_eq(ag_auditor_run(a, t, &f, NULL), AG_OK);
      if (f.stop.stopped) {
        stopped++;
        cr_assert(f.stop.step >= 1 && f.stop.step <= f.steps);
        cr_assert_eq(f.stop.steps_after, f.steps - f.stop.step);
        cr_assert(f.stop.turn >= 1 && f.stop.turn <= f.turns);
        cr_assert(f.stop.reason > AG_REASON_NONE);
        cr_assert(f.stop.message[0] != '\0');
      }
      ag_audit_summary_add(&sum, t, &f);
      ag_trajectory_free(t);
    }
    printf("  %-14s stops %2d of 31; resolved cut short %d; saved in "
           "unresolved runs %.1f%%\n",
           names[p], stopped, sum.stopped_by_outcome[AG_RUN_RESOLVED],
           100 * ag_audit_summary_saved_share(&sum, AG_RUN_UNRESOLVED));
    if (strcmp(names[p], "none") == 0)
      cr_assert_eq(stopped, 0, "preset none stops nothing");
    ag_auditor_free(a);
  }
}

/* The table the brief asks for: run, annotated loop_first_step, where
 * default and hpd stop. */
Test(bundled, looping_runs_stop_near_their_annotation) {
  bundled_run runs[64];
  size_t n = list_bundled(runs, 64);
  int loops = 0, caught = 0, false_stops = 0;
  printf("\n%-68s %5s | %-24s | %-24s\n", "run", "loop", "default", "hpd");
  for (size_t i = 0; i < n; i++) {
    ag_trajectory *t = bundled(runs[i].name);
    ag_audit_finding d = audit(t, "default"), h = audit(t, "hpd");
    char a[64], b[64], c[16];
    snprintf(c, sizeof(c), "%d", runs[i].loop_first_step);
    printf("%-68s %5s | %-24s | %-24s\n", runs[i].name,
           runs[i].loop_visible ? c : "-", stop_str(&d.stop, a, sizeof(a)),
           stop_str(&h.stop, b, sizeof(b)));
    if (runs[i].loop_visible) {
      loops++;
      if (d.stop.stopped) {
        caught++;
        /* near the annotation: a reviewer's judgement, so only loosely */
        cr_assert(d.stop.step >= runs[i].loop_first_step - 8 &&
                      d.stop.step <= runs[i].loop_first_step + 15,
                  "%s: stop at %d, annotated loop from %d", runs[i].name,
                  d.stop.step, runs[i].loop_first_step);
      }
    } else if (d.stop.stopped && d.stop.reason != AG_REASON_MAX_ITERATIONS) {
      /* the one documented trap it falls into (docs/detection.md): every
       * pylint call exits non-zero behind a harmless error prefix */
      if (strcmp(runs[i].name, "mini__pylint-dev__pylint-8898") != 0 ||
          d.stop.reason != AG_REASON_CONSECUTIVE_ERRORS)
        false_stops++;
      printf("  ^ a run that does not loop, stopped by a detector\n");
    }
    ag_trajectory_free(t);
  }
  printf("default stops %d of the %d looping runs\n", caught, loops);
  fflush(stdout);
  cr_assert_eq(loops, 18);
  cr_assert_geq(caught, 12, "only %d of 18 looping runs stop under default",
                caught);
  cr_assert_eq(false_stops, 0,
               "no run without a visible loop may be stopped by a loop or "
               "error detector under default");
}

/* ---- the traps (shared/data/README.md) ---------------------------------- */

Test(traps, user_requested_abab_does_not_stop) {
  /* tau_airline__task23_trial3: A-B-A-B the user asked for; each
   * user_msg_before starts a new turn, which resets the cycle detector. */
  ag_trajectory *t = bundled("tau_airline__task23_trial3");
  cr_assert_gt(t->n_turns, 5);
  ag_audit_finding f = audit(t, "default");
  char b[64];
  cr_assert(!f.stop.stopped, "stopped: %s: %s", stop_str(&f.stop, b, 64),
            f.stop.message);
  ag_trajectory_free(t);
}

Test(traps, repeated_error_in_a_resolved_run_does_not_stop) {
  ag_trajectory *t = bundled("tau_airline__task13_trial2");
  cr_assert_eq(t->outcome, AG_RUN_RESOLVED);
  ag_audit_finding f = audit(t, "default");
  char b[64];
  cr_assert(!f.stop.stopped, "stopped: %s: %s", stop_str(&f.stop, b, 64),
            f.stop.message);
  ag_trajectory_free(t);
}

Test(traps, repeated_timeouts_then_recovery) {
  /* mini__sympy__sympy-19040: 132 steps in one turn (one task), resolved.
   * No loop or error detector stops it, and default's iteration cap (150, a
   * budget) lets it finish; meai's 40 stops it at step 41, as it would any
   * 41-step turn. */
  ag_trajectory *t = bundled("mini__sympy__sympy-19040");
  ag_audit_finding f = audit(t, "default");
  char b[64];
  cr_assert(!f.stop.stopped, "default stopped: %s", stop_str(&f.stop, b, 64));
  ag_config cfg = config_json("{\"loop\": {\"max_iterations\": 40}}");
  f = audit_cfg(t, &cfg, false);
  cr_assert(f.stop.stopped);
  cr_assert_eq(f.stop.reason, AG_REASON_MAX_ITERATIONS, "reason %s: %s",
               ag_reason_name(f.stop.reason), f.stop.message);
  cr_assert_eq(f.stop.step, 41);
  ag_trajectory_free(t);
}

Test(traps, harmless_error_prefix_is_not_an_error) {
  /* mini__pylint-dev__pylint-8898: most steps print "Error processing line
   * 1 of ...pth" and still succeed (ok true). Those are not errors: the
   * default prefix is "Error:", and ok is authoritative. So nothing stops
   * in steps 3-44. What does stop it, precisely: steps 45-49 are recorded
   * ok=false (pylint exits 16, "convention messages issued", with the same
   * 714-byte output) and trip consecutive_errors at 48 (identical_errors
   * would at 49). That is the recording's ok (shell return code), not the
   * prefix; the one false alarm of default (docs/detection.md). */
  ag_trajectory *t = bundled("mini__pylint-dev__pylint-8898");
  ag_audit_finding f = audit(t, "default");
  ag_config cfg = config_json("{\"loop\": {\"max_iterations\": 0}}");
  cr_assert_eq(f.stop.step, audit_cfg(t, &cfg, false).stop.step,
               "the cap (150) plays no part");
  f = audit_cfg(t, &cfg, true);
  cr_assert(f.stop.stopped);
  cr_assert_geq(f.stop.step, 45, "stopped at %d by %s: the prefix counted",
                f.stop.step, ag_reason_name(f.stop.reason));
  cr_assert_eq(f.stop.reason, AG_REASON_CONSECUTIVE_ERRORS);
  cr_assert_eq(f.stop.step, 48);
  cr_assert_eq(f.by_mechanism[AG_REASON_IDENTICAL_ERRORS].step, 49);
  ag_trajectory_free(t);
}

/* ---- all stops and the classifier shortcut ------------------------------ */

Test(all_stops, each_mechanism_alone) {
  ag_trajectory *t = bundled("swea_java__deepseek-chat-v2__apache__dubbo-7041");
  ag_config cfg = preset("default");
  ag_audit_finding f = audit_cfg(t, &cfg, true);
  cr_assert(f.all_stops);
  cr_assert(f.stop.stopped);
  cr_assert_eq(f.stop.reason, AG_REASON_CONSECUTIVE_ERRORS);
  cr_assert_eq(f.stop.step, 14);
  /* default enables 1, 3, 4, 5, 7, 10, 12, 13, 14, 15 and 16 */
  static const ag_reason on[] = {
      AG_REASON_MAX_ITERATIONS,     AG_REASON_IDENTICAL_CALLS,
      AG_REASON_CYCLIC_CALLS,       AG_REASON_IDENTICAL_ERRORS,
      AG_REASON_CONSECUTIVE_ERRORS, AG_REASON_TURN_TIMEOUT,
      AG_REASON_REFUSED_REPLIES,    AG_REASON_DENIED_CALLS,
      AG_REASON_CONTENT_LOOP,       AG_REASON_EMPTY_REPLY,
      AG_REASON_REPEATED_RESULTS};
  const size_t n_want = sizeof(on) / sizeof(on[0]);
  size_t n_on = 0;
  for (int r = 1; r < AG_REASON__COUNT; r++)
    n_on += f.mechanism_on[r];
  cr_assert_eq(n_on, n_want);
  for (size_t i = 0; i < n_want; i++)
    cr_assert(f.mechanism_on[on[i]], "%s should be on", ag_reason_name(on[i]));
  cr_assert_eq(f.by_mechanism[AG_REASON_CONSECUTIVE_ERRORS].step, 14);
  cr_assert_eq(f.by_mechanism[AG_REASON_IDENTICAL_CALLS].step, 17);
  cr_assert_eq(f.by_mechanism[AG_REASON_IDENTICAL_ERRORS].step, 17);
  cr_assert(!f.by_mechanism[AG_REASON_MAX_ITERATIONS].stopped);
  for (int r = 1; r < AG_REASON__COUNT; r++)
    if (f.by_mechanism[r].stopped)
      cr_assert_eq(f.by_mechanism[r].reason, (ag_reason)r,
                   "a mechanism alone stops only for its own reason");
  /* The first stop is the earliest of the mechanisms' own stops here. */
  ag_trajectory_free(t);
}

Test(all_stops, first_stop_never_later_than_any_mechanism_alone) {
  bundled_run runs[64];
  size_t n = list_bundled(runs, 64);
  ag_config cfg = preset("default");
  for (size_t i = 0; i < n; i++) {
    ag_trajectory *t = bundled(runs[i].name);
    ag_audit_finding f = audit_cfg(t, &cfg, true);
    for (int r = 1; r < AG_REASON__COUNT; r++) {
      if (!f.by_mechanism[r].stopped)
        continue;
      cr_assert(f.stop.stopped, "%s: %s alone stops but the config does not",
                runs[i].name, ag_reason_name((ag_reason)r));
      cr_assert_leq(f.stop.step, f.by_mechanism[r].step, "%s: %s", runs[i].name,
                    ag_reason_name((ag_reason)r));
    }
    ag_trajectory_free(t);
  }
}

Test(classifier, shortcut_changes_no_finding) {
  /* With mechanism 9 off the replay does not classify error texts (the
   * category cannot change a verdict). Check that claim on every bundled
   * run: default with 9 on at a limit that never trips must find the same
   * stops. */
  bundled_run runs[64];
  size_t n = list_bundled(runs, 64);
  ag_config off = preset("default");
  ag_config on = config_json("{\"errors\": {\"similar_error_limit\": 256, "
                             "\"error_history\": 256}}");
  for (size_t i = 0; i < n; i++) {
    ag_trajectory *t = bundled(runs[i].name);
    ag_audit_finding a = audit_cfg(t, &off, false),
                     b = audit_cfg(t, &on, false);
    cr_assert_eq(a.stop.stopped, b.stop.stopped, "%s", runs[i].name);
    cr_assert_eq(a.stop.step, b.stop.step, "%s", runs[i].name);
    cr_assert_eq(a.stop.reason, b.stop.reason, "%s", runs[i].name);
    cr_assert_str_eq(a.stop.message, b.stop.message, "%s", runs[i].name);
    ag_trajectory_free(t);
  }
}

/* ---- the project's own runs (tests/fixtures/runs/) ---------------------- */

/* Runs written for agentguard in the neutral format, one per rule the
 * bundled runs check: they need nothing beside the project. */
#define FIXTURE_RUNS AG_SOURCE_DIR "/tests/fixtures/runs"

static ag_trajectory *fixture_run(const char *name) {
  char path[1024];
  snprintf(path, sizeof(path), "%s/%s.json", FIXTURE_RUNS, name);
  size_t len;
  char *buf = read_all(path, &len);
  ag_trajectory *t = NULL;
  ag_error_t err;
  cr_assert_eq(ag_trajectory_parse(&t, buf, len, NULL, &err), AG_OK, "%s: %s",
               name, err.msg);
  free(buf);
  return t;
}

Test(fixtures, every_run_parses_with_its_shape) {
  static const struct {
    const char *name;
    size_t turns, steps;
    ag_run_outcome outcome;
  } runs[] = {
      {"harmless_error_prefix", 1, 17, AG_RUN_UNRESOLVED},
      {"looping_unresolved", 1, 13, AG_RUN_UNRESOLVED},
      {"resolved_with_repeated_error", 2, 10, AG_RUN_RESOLVED},
      {"timeouts_then_recovery", 1, 45, AG_RUN_RESOLVED},
      {"user_requested_abab", 6, 18, AG_RUN_RESOLVED},
  };
  for (size_t i = 0; i < sizeof(runs) / sizeof(runs[0]); i++) {
    ag_trajectory *t = fixture_run(runs[i].name);
    cr_assert_eq(t->format, AG_TRAJ_NEUTRAL, "%s", runs[i].name);
    cr_assert_eq(t->n_turns, runs[i].turns, "%s: %zu turns", runs[i].name,
                 t->n_turns);
    cr_assert_eq(t->n_steps, runs[i].steps, "%s: %zu steps", runs[i].name,
                 t->n_steps);
    cr_assert_eq(t->outcome, runs[i].outcome, "%s", runs[i].name);
    cr_assert_not_null(t->source);
    cr_assert(!t->timed);
    ag_trajectory_free(t);
  }
}

Test(fixtures, rejected_reply_is_one_observation) {
  /* looping_unresolved step 5: the harness refused a reply with two
   * actions. */
  ag_trajectory *t = fixture_run("looping_unresolved");
  const ag_traj_step *s = &t->turns[0].steps[4];
  cr_assert(s->rejected);
  cr_assert_eq(s->n_calls, 2);
  cr_assert_eq(s->n_results, 1);
  cr_assert_eq(s->results[0].outcome, AG_OUTCOME_ERROR);
  cr_assert(strncmp(s->results[0].text, "Please always provide EXACTLY ONE",
                    33) == 0);
  cr_assert(!t->turns[0].steps[3].rejected);
  ag_trajectory_free(t);
}

Test(fixtures, user_requested_abab_does_not_stop) {
  /* Six user messages each ask for the same two lookups: six turns, and a
   * new turn resets the cycle detector. */
  ag_trajectory *t = fixture_run("user_requested_abab");
  ag_audit_finding f = audit(t, "default");
  char b[64];
  cr_assert(!f.stop.stopped, "stopped: %s: %s", stop_str(&f.stop, b, 64),
            f.stop.message);
  ag_trajectory_free(t);
  /* The same calls in one turn are a cycle: the 5th A-B completes at 14. */
  size_t len;
  char *text = read_all(FIXTURE_RUNS "/user_requested_abab.json", &len);
  json_t *doc = json_loadb(text, len, 0, NULL);
  free(text);
  cr_assert_not_null(doc);
  json_t *steps = json_object_get(doc, "steps");
  for (size_t i = 1; i < json_array_size(steps); i++)
    json_object_del(json_array_get(steps, i), "user_msg_before");
  char *one_turn = json_dumps(doc, 0);
  json_decref(doc);
  t = parse_ok(one_turn);
  free(one_turn);
  cr_assert_eq(t->n_turns, 1);
  f = audit(t, "default");
  cr_assert(f.stop.stopped);
  cr_assert_eq(f.stop.reason, AG_REASON_CYCLIC_CALLS, "reason %s",
               ag_reason_name(f.stop.reason));
  cr_assert_eq(f.stop.step, 14);
  ag_trajectory_free(t);
}

Test(fixtures, repeated_error_in_a_resolved_run_does_not_stop) {
  ag_trajectory *t = fixture_run("resolved_with_repeated_error");
  cr_assert_eq(t->outcome, AG_RUN_RESOLVED);
  ag_config cfg = preset("default");
  ag_audit_finding f = audit_cfg(t, &cfg, true);
  char b[64];
  cr_assert(!f.stop.stopped, "stopped: %s: %s", stop_str(&f.stop, b, 64),
            f.stop.message);
  for (int r = 1; r < AG_REASON__COUNT; r++)
    cr_assert(!f.by_mechanism[r].stopped, "%s alone stops it",
              ag_reason_name((ag_reason)r));
  ag_trajectory_free(t);
}

Test(fixtures, repeated_timeouts_then_recovery) {
  /* 45 steps in one turn; timeouts come three at a time with different
   * commands. No detector stops it, and default's cap (150, a budget) lets
   * it finish; a cap of 40 model requests stops it at 41. */
  ag_trajectory *t = fixture_run("timeouts_then_recovery");
  ag_audit_finding f = audit(t, "default");
  char b[64];
  cr_assert(!f.stop.stopped, "default stopped: %s", stop_str(&f.stop, b, 64));
  ag_config cfg = config_json("{\"loop\": {\"max_iterations\": 40}}");
  f = audit_cfg(t, &cfg, false);
  cr_assert(f.stop.stopped);
  cr_assert_eq(f.stop.reason, AG_REASON_MAX_ITERATIONS, "reason %s: %s",
               ag_reason_name(f.stop.reason), f.stop.message);
  cr_assert_eq(f.stop.step, 41);
  ag_trajectory_free(t);
}

Test(fixtures, harmless_error_prefix_is_not_an_error) {
  /* Steps 1-12 succeed with text that starts "Error processing line ...":
   * not the "Error:" prefix, and ok is authoritative. Steps 13-17 fail (ok
   * false) with one output: the third identical failure (15) trips
   * repeated_results, the 4th failing iteration (16) consecutive_errors;
   * identical calls and errors alone trip at 17. */
  ag_trajectory *t = fixture_run("harmless_error_prefix");
  ag_config cfg = preset("default");
  ag_audit_finding f = audit_cfg(t, &cfg, true);
  cr_assert(f.stop.stopped);
  cr_assert_eq(f.stop.reason, AG_REASON_REPEATED_RESULTS, "reason %s at %d",
               ag_reason_name(f.stop.reason), f.stop.step);
  cr_assert_eq(f.stop.step, 15);
  cr_assert_eq(f.by_mechanism[AG_REASON_CONSECUTIVE_ERRORS].step, 16);
  cr_assert_eq(f.by_mechanism[AG_REASON_IDENTICAL_ERRORS].step, 17);
  cr_assert_eq(f.by_mechanism[AG_REASON_IDENTICAL_CALLS].step, 17);
  /* With "Error" as a prefix every step is an error: stopped at once. */
  cfg = config_json("{\"errors\": {\"error_prefixes\": [\"Error\"]}}");
  f = audit_cfg(t, &cfg, false);
  cr_assert(f.stop.stopped);
  cr_assert_eq(f.stop.step, 4, "a prefix that matches counts: stop at %d",
               f.stop.step);
  ag_trajectory_free(t);
}

Test(fixtures, each_mechanism_alone) {
  /* looping_unresolved: a failing test (4), a refused reply (5), the same
   * failing call at 6-11. The third identical failure (7) trips
   * repeated_results. A failing test is information, not a malfunction
   * (errors.counted_failures), so under default neither consecutive_errors
   * nor identical errors count it; counting every failure, consecutive
   * errors alone trip at 8 (4, 6, 7, 8: a refused reply is neither a failing
   * iteration nor an error) and identical errors at 9 (4, 6-9). The
   * identical-call run needs consecutive iterations, so it restarts at 6
   * and trips at 10. */
  ag_trajectory *t = fixture_run("looping_unresolved");
  ag_config cfg = preset("default");
  ag_audit_finding f = audit_cfg(t, &cfg, true);
  cr_assert(f.all_stops);
  cr_assert(f.stop.stopped);
  cr_assert_eq(f.stop.reason, AG_REASON_REPEATED_RESULTS);
  cr_assert_eq(f.stop.step, 7);
  cr_assert_eq(f.stop.steps_after, 6);
  cr_assert_eq(f.by_mechanism[AG_REASON_REPEATED_RESULTS].step, 7);
  cr_assert(!f.by_mechanism[AG_REASON_CONSECUTIVE_ERRORS].stopped);
  cr_assert(!f.by_mechanism[AG_REASON_IDENTICAL_ERRORS].stopped);
  cr_assert_eq(f.by_mechanism[AG_REASON_IDENTICAL_CALLS].step, 10);
  ag_config all = cfg;
  all.errors.counted_failures = AG_COUNT_ALL;
  ag_audit_finding fa = audit_cfg(t, &all, true);
  cr_assert_eq(fa.by_mechanism[AG_REASON_CONSECUTIVE_ERRORS].step, 8);
  cr_assert_eq(fa.by_mechanism[AG_REASON_IDENTICAL_ERRORS].step, 9);
  cr_assert(!f.by_mechanism[AG_REASON_MAX_ITERATIONS].stopped);
  cr_assert(!f.by_mechanism[AG_REASON_CYCLIC_CALLS].stopped);
  for (int r = 1; r < AG_REASON__COUNT; r++) {
    if (!f.by_mechanism[r].stopped)
      continue;
    cr_assert_eq(f.by_mechanism[r].reason, (ag_reason)r,
                 "a mechanism alone stops only for its own reason");
    cr_assert_leq(f.stop.step, f.by_mechanism[r].step,
                  "the first stop is never later than %s alone",
                  ag_reason_name((ag_reason)r));
  }
  ag_trajectory_free(t);
}

/* ---- one run in every format -------------------------------------------- */

/*
 * Turn 1: get_weather(Paris) -> sunny, then a text answer.
 * Turn 2: book(7) fails four times ("Error: service unavailable"), then
 * lookup succeeds. Under default the third identical failure stops the run
 * (repeated_results): step 5 (turn 2, step 3), two steps after it.
 */
static const char sample_neutral[] =
    "{\"source\": \"sample\", \"outcome\": \"unresolved\", \"steps\": [\n"
    " {\"user_msg_before\": \"weather?\", \"calls\": [{\"name\": "
    "\"get_weather\", \"args\": {\"city\": \"Paris\"}}], \"results\": "
    "[{\"ok\": true, \"text\": \"sunny\"}]},\n"
    " {\"calls\": [], \"results\": []},\n"
    " {\"user_msg_before\": \"book it\", \"calls\": [{\"name\": \"book\", "
    "\"args\": {\"id\": 7}}], \"results\": [{\"ok\": false, \"text\": "
    "\"Error: service unavailable\"}]},\n"
    " {\"calls\": [{\"name\": \"book\", \"args\": {\"id\": 7}}], \"results\": "
    "[{\"ok\": false, \"text\": \"Error: service unavailable\"}]},\n"
    " {\"calls\": [{\"name\": \"book\", \"args\": {\"id\": 7}}], \"results\": "
    "[{\"ok\": false, \"text\": \"Error: service unavailable\"}]},\n"
    " {\"calls\": [{\"name\": \"book\", \"args\": {\"id\": 7}}], \"results\": "
    "[{\"ok\": false, \"text\": \"Error: service unavailable\"}]},\n"
    " {\"calls\": [{\"name\": \"lookup\", \"args\": {\"q\": \"x\"}}], "
    "\"results\": [{\"ok\": true, \"text\": \"found\"}]}\n"
    "]}\n";

#define CHAT_MESSAGES                                                          \
  "{\"role\": \"system\", \"content\": \"You book trips.\"}",                  \
      "{\"role\": \"user\", \"content\": \"weather?\"}",                       \
      "{\"role\": \"assistant\", \"content\": null, \"tool_calls\": "          \
      "[{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": "    \
      "\"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Paris\\\"}\"}}]}", \
      "{\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": "           \
      "\"sunny\"}",                                                            \
      "{\"role\": \"assistant\", \"content\": \"It is sunny.\"}",              \
      "{\"role\": \"user\", \"content\": \"book it\"}",                        \
      "{\"role\": \"assistant\", \"tool_calls\": [{\"id\": \"c2\", "           \
      "\"type\": \"function\", \"function\": {\"name\": \"book\", "            \
      "\"arguments\": \"{\\\"id\\\": 7}\"}}]}",                                \
      "{\"role\": \"tool\", \"tool_call_id\": \"c2\", \"content\": "           \
      "\"Error: service unavailable\"}",                                       \
      "{\"role\": \"assistant\", \"tool_calls\": [{\"id\": \"c3\", "           \
      "\"type\": \"function\", \"function\": {\"name\": \"book\", "            \
      "\"arguments\": \"{\\\"id\\\":7}\"}}]}",                                 \
      "{\"role\": \"tool\", \"tool_call_id\": \"c3\", \"content\": "           \
      "[{\"type\": \"text\", \"text\": \"Error: service unavailable\"}]}",     \
      "{\"role\": \"assistant\", \"tool_calls\": [{\"id\": \"c4\", "           \
      "\"type\": \"function\", \"function\": {\"name\": \"book\", "            \
      "\"arguments\": \"{\\\"id\\\": 7.0}\"}}]}",                              \
      "{\"role\": \"tool\", \"tool_call_id\": \"c4\", \"content\": \"Error: "  \
      "service unavailable\"}",                                                \
      "{\"role\": \"assistant\", \"tool_calls\": [{\"id\": \"c5\", "           \
      "\"type\": \"function\", \"function\": {\"name\": \"book\", "            \
      "\"arguments\": \"{\\\"id\\\": 7}\"}}]}",                                \
      "{\"role\": \"tool\", \"tool_call_id\": \"c5\", \"content\": \"Error: "  \
      "service unavailable\"}",                                                \
      "{\"role\": \"assistant\", \"tool_calls\": [{\"id\": \"c6\", "           \
      "\"type\": \"function\", \"function\": {\"name\": \"lookup\", "          \
      "\"arguments\": \"{\\\"q\\\": \\\"x\\\"}\"}}]}",                         \
      "{\"role\": \"tool\", \"tool_call_id\": \"c6\", \"content\": "           \
      "\"found\"}"

static const char *const chat_lines[] = {CHAT_MESSAGES};
#define N_CHAT (sizeof(chat_lines) / sizeof(chat_lines[0]))

/* The same run as agentguard's event log (what simulate --events writes). */
static const char *const event_lines[] = {
    "{\"event\":\"turn_start\",\"turn\":1,\"iteration\":0,\"t_ms\":0,"
    "\"user\":\"weather?\"}",
    "{\"event\":\"model_request\",\"turn\":1,\"iteration\":1,\"t_ms\":1}",
    "{\"event\":\"model_response\",\"turn\":1,\"iteration\":1,\"t_ms\":2,"
    "\"text\":null,\"tool_calls\":[{\"id\":\"t1\",\"name\":\"get_weather\","
    "\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}]}",
    "{\"event\":\"tool_call\",\"turn\":1,\"iteration\":1,\"t_ms\":2,"
    "\"call_id\":\"t1\",\"name\":\"get_weather\",\"arguments\":"
    "\"{\\\"city\\\":\\\"Paris\\\"}\",\"signature\":null}",
    "{\"event\":\"tool_attempt\",\"turn\":1,\"iteration\":1,\"t_ms\":3,"
    "\"call_id\":\"t1\",\"name\":\"get_weather\",\"attempt\":1,\"outcome\":"
    "\"ok\",\"message\":\"\",\"retry_in_ms\":null}",
    "{\"event\":\"tool_result\",\"turn\":1,\"iteration\":1,\"t_ms\":3,"
    "\"call_id\":\"t1\",\"name\":\"get_weather\",\"ok\":true,\"attempts\":1,"
    "\"category\":null,\"text\":\"sunny\"}",
    "{\"event\":\"model_request\",\"turn\":1,\"iteration\":2,\"t_ms\":4}",
    "{\"event\":\"model_response\",\"turn\":1,\"iteration\":2,\"t_ms\":5,"
    "\"text\":\"It is sunny.\",\"tool_calls\":[]}",
    "{\"event\":\"turn_end\",\"turn\":1,\"iteration\":2,\"t_ms\":5,\"status\":"
    "\"completed\",\"reason\":\"final_answer\",\"message\":\"\","
    "\"iterations\":2,\"tool_calls\":1,\"final_text\":\"It is sunny.\"}",
    "{\"event\":\"turn_start\",\"turn\":2,\"iteration\":0,\"t_ms\":6,"
    "\"user\":\"book it\"}",
#define BOOK(it, t)                                                            \
  "{\"event\":\"model_request\",\"turn\":2,\"iteration\":" #it ",\"t_ms\":" #t \
  "}",                                                                         \
      "{\"event\":\"model_response\",\"turn\":2,\"iteration\":" #it            \
      ",\"t_ms\":" #t ",\"text\":null,\"tool_calls\":[]}",                     \
      "{\"event\":\"tool_call\",\"turn\":2,\"iteration\":" #it ",\"t_ms\":" #t \
      ",\"call_id\":\"b" #it "\",\"name\":\"book\",\"arguments\":"             \
      "\"{\\\"id\\\":7}\",\"signature\":null}",                                \
      "{\"event\":\"tool_result\",\"turn\":2,\"iteration\":" #it               \
      ",\"t_ms\":" #t ",\"call_id\":\"b" #it "\",\"name\":\"book\","           \
      "\"ok\":false,\"attempts\":4,\"category\":\"network\",\"text\":"         \
      "\"Error: service unavailable\"}"
    BOOK(1, 7),
    BOOK(2, 8),
    BOOK(3, 9),
    BOOK(4, 10),
#undef BOOK
    "{\"event\":\"model_request\",\"turn\":2,\"iteration\":5,\"t_ms\":11}",
    "{\"event\":\"model_response\",\"turn\":2,\"iteration\":5,\"t_ms\":11,"
    "\"text\":null,\"tool_calls\":[]}",
    "{\"event\":\"tool_call\",\"turn\":2,\"iteration\":5,\"t_ms\":11,"
    "\"call_id\":\"l1\",\"name\":\"lookup\",\"arguments\":"
    "\"{\\\"q\\\":\\\"x\\\"}\",\"signature\":null}",
    "{\"event\":\"tool_result\",\"turn\":2,\"iteration\":5,\"t_ms\":12,"
    "\"call_id\":\"l1\",\"name\":\"lookup\",\"ok\":true,\"attempts\":1,"
    "\"category\":null,\"text\":\"found\"}",
    "{\"event\":\"turn_end\",\"turn\":2,\"iteration\":5,\"t_ms\":12,\"status\":"
    "\"completed\",\"reason\":\"final_answer\",\"message\":\"\","
    "\"iterations\":5,\"tool_calls\":5,\"final_text\":\"\"}",
};
#define N_EVENTS (sizeof(event_lines) / sizeof(event_lines[0]))

/* Joins lines with `sep`, wrapped in `open` / `close`. */
static char *join(const char *const *lines, size_t n, const char *open,
                  const char *sep, const char *close) {
  size_t len = strlen(open) + strlen(close) + 1;
  for (size_t i = 0; i < n; i++)
    len += strlen(lines[i]) + strlen(sep);
  char *s = malloc(len);
  cr_assert_not_null(s);
  strcpy(s, open);
  for (size_t i = 0; i < n; i++) {
    if (i > 0)
      strcat(s, sep);
    strcat(s, lines[i]);
  }
  strcat(s, close);
  return s;
}

static bool counts_as_error(const ag_traj_result *r) {
  return r->outcome == AG_OUTCOME_ERROR || strncmp(r->text, "Error:", 6) == 0;
}

/* The same run: turns, steps, calls (names and canonical arguments) and
 * results (text, error or not). */
static void assert_same_run(const ag_trajectory *a, const ag_trajectory *b,
                            const char *what) {
  cr_assert_eq(a->n_turns, b->n_turns, "%s: turns %zu vs %zu", what, a->n_turns,
               b->n_turns);
  cr_assert_eq(a->n_steps, b->n_steps, "%s: steps %zu vs %zu", what, a->n_steps,
               b->n_steps);
  for (size_t ti = 0; ti < a->n_turns; ti++) {
    cr_assert_eq(a->turns[ti].n_steps, b->turns[ti].n_steps, "%s: turn %zu",
                 what, ti + 1);
    for (size_t si = 0; si < a->turns[ti].n_steps; si++) {
      const ag_traj_step *x = &a->turns[ti].steps[si],
                         *y = &b->turns[ti].steps[si];
      cr_assert_eq(x->n_calls, y->n_calls, "%s: turn %zu step %zu", what,
                   ti + 1, si + 1);
      cr_assert_eq(x->n_results, y->n_results);
      for (size_t k = 0; k < x->n_calls; k++) {
        cr_assert_str_eq(x->calls[k].name, y->calls[k].name);
        char *cx, *cy;
        size_t lx, ly;
        cr_assert_eq(ag_canonicalize(x->calls[k].args, x->calls[k].args_len,
                                     &cx, &lx, NULL),
                     AG_OK);
        cr_assert_eq(ag_canonicalize(y->calls[k].args, y->calls[k].args_len,
                                     &cy, &ly, NULL),
                     AG_OK);
        cr_assert_str_eq(cx, cy, "%s: arguments", what);
        ag_free(cx);
        ag_free(cy);
        cr_assert_eq(x->results[k].text_len, y->results[k].text_len);
        cr_assert(memcmp(x->results[k].text, y->results[k].text,
                         x->results[k].text_len) == 0);
        cr_assert_eq(counts_as_error(&x->results[k]),
                     counts_as_error(&y->results[k]), "%s: turn %zu step %zu",
                     what, ti + 1, si + 1);
      }
    }
  }
}

static void assert_sample_finding(const ag_trajectory *t, const char *what) {
  /* the third identical failing call stops it (mechanism 16), one step
   * before the fourth failing iteration would (mechanism 7) */
  ag_audit_finding f = audit(t, "default");
  cr_assert(f.stop.stopped, "%s: not stopped", what);
  cr_assert_eq(f.stop.reason, AG_REASON_REPEATED_RESULTS, "%s: %s", what,
               ag_reason_name(f.stop.reason));
  cr_assert_eq(f.stop.step, 5, "%s: step %d", what, f.stop.step);
  cr_assert_eq(f.stop.turn, 2, "%s", what);
  cr_assert_eq(f.stop.step_in_turn, 3, "%s", what);
  cr_assert_eq(f.stop.steps_after, 2, "%s", what);
  cr_assert_eq(f.stop.action, AG_STOP);
  cr_assert_str_eq(f.stop.message,
                   "book failed 3 times in this turn with the same arguments "
                   "and the same error: Error: service unavailable");
}

Test(formats, neutral_sample) {
  ag_trajectory *t = parse_ok(sample_neutral);
  cr_assert_eq(t->format, AG_TRAJ_NEUTRAL);
  cr_assert_str_eq(t->source, "sample");
  cr_assert_eq(t->outcome, AG_RUN_UNRESOLVED);
  cr_assert_eq(t->n_turns, 2);
  cr_assert_eq(t->n_steps, 7);
  cr_assert_eq(t->n_calls, 6);
  assert_sample_finding(t, "neutral");
  ag_trajectory_free(t);
}

Test(formats, chat_array_object_and_jsonl) {
  ag_trajectory *ref = parse_ok(sample_neutral);
  char *arr = join(chat_lines, N_CHAT, "[", ",\n", "]");
  char *obj = join(chat_lines, N_CHAT,
                   "{\"outcome\": \"unresolved\", \"id\": \"sample\", "
                   "\"messages\": [",
                   ",", "]}");
  char *jsonl = join(chat_lines, N_CHAT, "", "\n", "\n");
  struct {
    const char *text;
    ag_traj_format format;
  } cases[] = {{arr, AG_TRAJ_CHAT},
               {obj, AG_TRAJ_CHAT_OBJECT},
               {jsonl, AG_TRAJ_CHAT_JSONL}};
  for (size_t i = 0; i < 3; i++) {
    ag_trajectory *t = parse_ok(cases[i].text);
    const char *name = ag_traj_format_name(cases[i].format);
    cr_assert_eq(t->format, cases[i].format, "%s: detected %s", name,
                 ag_traj_format_name(t->format));
    assert_same_run(ref, t, name);
    assert_sample_finding(t, name);
    ag_trajectory_free(t);
  }
  ag_trajectory *o = parse_ok(obj);
  cr_assert_eq(o->outcome, AG_RUN_UNRESOLVED);
  cr_assert_str_eq(o->source, "sample");
  ag_trajectory_free(o);
  free(arr);
  free(obj);
  free(jsonl);
  ag_trajectory_free(ref);
}

Test(formats, event_log) {
  ag_trajectory *ref = parse_ok(sample_neutral);
  char *log = join(event_lines, N_EVENTS, "", "\n", "\n");
  ag_trajectory *t = parse_ok(log);
  cr_assert_eq(t->format, AG_TRAJ_EVENTS);
  cr_assert(t->timed, "event logs carry t_ms");
  assert_same_run(ref, t, "events");
  assert_sample_finding(t, "events");
  cr_assert_eq(t->turns[1].t_start_ms, 6);
  cr_assert_eq(t->turns[1].steps[0].t_request_ms, 7);
  cr_assert_eq(t->turns[1].steps[0].results[0].category, AG_CAT_NETWORK);
  ag_trajectory_free(t);
  free(log);
  ag_trajectory_free(ref);
}

Test(formats, events_blocked_nudged_and_denied_calls_did_not_run) {
  static const char log[] =
      "{\"event\":\"turn_start\",\"turn\":1,\"iteration\":0,\"t_ms\":0}\n"
      "{\"event\":\"model_request\",\"turn\":1,\"iteration\":1,\"t_ms\":0}\n"
      "{\"event\":\"model_response\",\"turn\":1,\"iteration\":1,\"t_ms\":0}\n"
      "{\"event\":\"tool_call\",\"turn\":1,\"iteration\":1,\"t_ms\":0,"
      "\"call_id\":\"a\",\"name\":\"rm\",\"arguments\":\"{}\"}\n"
      "{\"event\":\"tool_call\",\"turn\":1,\"iteration\":1,\"t_ms\":0,"
      "\"call_id\":\"b\",\"name\":\"ls\",\"arguments\":\"{}\"}\n"
      "{\"event\":\"nudge\",\"turn\":1,\"iteration\":1,\"t_ms\":0,"
      "\"reason\":\"identical_calls\",\"text\":\"Potential loop\"}\n"
      "{\"event\":\"tool_call\",\"turn\":1,\"iteration\":1,\"t_ms\":0,"
      "\"call_id\":\"c\",\"name\":\"cat\",\"arguments\":\"{}\"}\n"
      "{\"event\":\"approval\",\"turn\":1,\"iteration\":1,\"t_ms\":0,"
      "\"call_id\":\"a\",\"name\":\"rm\",\"approved\":false}\n"
      "{\"event\":\"tool_result\",\"turn\":1,\"iteration\":1,\"t_ms\":1,"
      "\"call_id\":\"a\",\"name\":\"rm\",\"ok\":false,\"attempts\":0,"
      "\"category\":\"permission\",\"text\":\"Tool call rejected\"}\n"
      "{\"event\":\"tool_result\",\"turn\":1,\"iteration\":1,\"t_ms\":1,"
      "\"call_id\":\"c\",\"name\":\"cat\",\"ok\":true,\"attempts\":1,"
      "\"category\":null,\"text\":\"meow\"}\n"
      "{\"event\":\"model_request\",\"turn\":1,\"iteration\":2,\"t_ms\":2}\n"
      "{\"event\":\"model_response\",\"turn\":1,\"iteration\":2,\"t_ms\":2}\n"
      "{\"event\":\"tool_call\",\"turn\":1,\"iteration\":2,\"t_ms\":2,"
      "\"call_id\":\"d\",\"name\":\"ls\",\"arguments\":\"{}\"}\n"
      "{\"event\":\"tool_blocked\",\"turn\":1,\"iteration\":2,\"t_ms\":2,"
      "\"call_id\":\"d\",\"name\":\"ls\",\"reason\":\"identical_calls\"}\n"
      "{\"event\":\"turn_end\",\"turn\":1,\"iteration\":2,\"t_ms\":2,"
      "\"status\":\"stopped\",\"reason\":\"identical_calls\"}\n";
  ag_trajectory *t = parse_ok(log);
  cr_assert_eq(t->n_steps, 2);
  const ag_traj_step *s = &t->turns[0].steps[0];
  cr_assert_eq(s->n_calls, 3);
  cr_assert_eq(s->results[0].outcome, AG_OUTCOME_DENIED, "denied");
  cr_assert_eq(s->results[1].outcome, AG_OUTCOME_SKIPPED, "held back");
  cr_assert_eq(s->results[2].outcome, AG_OUTCOME_OK);
  cr_assert_eq(t->turns[0].steps[1].results[0].outcome, AG_OUTCOME_SKIPPED,
               "blocked");
  cr_assert_eq(s->t_done_ms, 1);
  ag_trajectory_free(t);
}

Test(formats, events_keep_a_request_without_reply) {
  static const char log[] =
      "{\"event\":\"turn_start\",\"turn\":1,\"iteration\":0,\"t_ms\":0}\n"
      "{\"event\":\"model_request\",\"turn\":1,\"iteration\":1,\"t_ms\":0}\n"
      "{\"event\":\"model_response\",\"turn\":1,\"iteration\":1,\"t_ms\":0}\n"
      "{\"event\":\"tool_call\",\"turn\":1,\"iteration\":1,\"t_ms\":0,"
      "\"call_id\":\"a\",\"name\":\"ls\",\"arguments\":\"{}\"}\n"
      "{\"event\":\"tool_result\",\"turn\":1,\"iteration\":1,\"t_ms\":1,"
      "\"call_id\":\"a\",\"name\":\"ls\",\"ok\":true,\"text\":\"x\"}\n"
      "{\"event\":\"model_request\",\"turn\":1,\"iteration\":2,\"t_ms\":2}\n"
      "{\"event\":\"provider_retry\",\"turn\":1,\"iteration\":2,\"t_ms\":3}\n"
      "{\"event\":\"turn_end\",\"turn\":1,\"iteration\":2,\"t_ms\":9,"
      "\"status\":\"failed\",\"reason\":\"model_error\"}\n"
      "{\"event\":\"turn_start\",\"turn\":2,\"iteration\":0,\"t_ms\":10}\n"
      "{\"event\":\"model_request\",\"turn\":2,\"iteration\":1,\"t_ms\":11}\n"
      "{\"event\":\"model_response\",\"turn\":2,\"iteration\":1,\"t_ms\":12,"
      "\"text\":\"done\",\"tool_calls\":[]}\n";
  ag_trajectory *t = parse_ok(log);
  cr_assert_eq(t->n_turns, 2);
  cr_assert_eq(t->turns[0].n_steps, 2, "the failed request still counted");
  cr_assert(!t->turns[0].steps[0].no_reply);
  cr_assert(t->turns[0].steps[1].no_reply);
  cr_assert_eq(t->turns[0].steps[1].n_calls, 0);
  cr_assert_eq(t->turns[1].n_steps, 1);
  cr_assert_eq(t->turns[1].steps[0].n_calls, 0);
  cr_assert(!t->turns[1].steps[0].no_reply);
  /* under require_tool_call a reply without a call is an error, a request
   * without a reply is not */
  ag_config cfg = config_json("{\"preset\": \"none\", \"loop\": "
                              "{\"require_tool_call\": true, "
                              "\"max_refused_replies\": 1}}");
  ag_audit_finding f = audit_cfg(t, &cfg, false);
  cr_assert(f.stop.stopped);
  cr_assert_eq(f.stop.step, 3, "stopped at %d", f.stop.step);
  ag_trajectory_free(t);
}

Test(formats, chat_details) {
  /* legacy function_call, parallel calls answered out of order, replies
   * without ids matched in order, is_error, arguments as an object, a BOM
   * and a single JSON Lines message. */
  static const char chat[] =
      "\xEF\xBB\xBF  [{\"role\": \"user\", \"content\": \"go\"},"
      " {\"role\": \"assistant\", \"function_call\": {\"name\": \"f\", "
      "\"arguments\": \"{}\"}},"
      " {\"role\": \"function\", \"name\": \"f\", \"content\": \"ok\"},"
      " {\"role\": \"assistant\", \"tool_calls\": ["
      "  {\"id\": \"x\", \"function\": {\"name\": \"a\", \"arguments\": "
      "{\"k\": 1}}},"
      "  {\"id\": \"y\", \"function\": {\"name\": \"b\", \"arguments\": "
      "\"{}\"}}]},"
      " {\"role\": \"tool\", \"tool_call_id\": \"y\", \"content\": \"B\", "
      "\"is_error\": true},"
      " {\"role\": \"tool\", \"tool_call_id\": \"x\", \"content\": \"A\"},"
      " {\"role\": \"assistant\", \"tool_calls\": ["
      "  {\"function\": {\"name\": \"c\", \"arguments\": \"\"}},"
      "  {\"function\": {\"name\": \"d\", \"arguments\": \"\"}}]},"
      " {\"role\": \"tool\", \"content\": \"C\"},"
      " {\"role\": \"tool\", \"content\": null}]";
  ag_trajectory *t = parse_ok(chat);
  cr_assert_eq(t->format, AG_TRAJ_CHAT);
  cr_assert_eq(t->n_turns, 1);
  cr_assert_eq(t->n_steps, 3);
  const ag_traj_step *s = t->turns[0].steps;
  cr_assert_str_eq(s[0].calls[0].name, "f");
  cr_assert_str_eq(s[0].results[0].text, "ok");
  cr_assert_str_eq(s[1].calls[0].args, "{\"k\":1.0}"); /* dumped; JCS: 1 */
  cr_assert_str_eq(s[1].results[0].text, "A");
  cr_assert_eq(s[1].results[0].outcome, AG_OUTCOME_OK);
  cr_assert_str_eq(s[1].results[1].text, "B");
  cr_assert_eq(s[1].results[1].outcome, AG_OUTCOME_ERROR);
  cr_assert_str_eq(s[2].results[0].text, "C");
  cr_assert_str_eq(s[2].results[1].text, "");
  ag_trajectory_free(t);

  t = parse_ok("{\"role\": \"assistant\", \"content\": \"hi\"}");
  cr_assert_eq(t->format, AG_TRAJ_CHAT_JSONL);
  cr_assert_eq(t->n_steps, 1);
  ag_trajectory_free(t);
}

/* Found by fuzz_trajectory: one message written over two lines is detected
 * as a one-line chat log, and forcing that format must read it the same
 * way (it used to fail line by line with "':' expected"). */
Test(formats, one_record_over_lines_forced) {
  static const char two_lines[] = "{\"role\": \"user\", \"content\": null, "
                                  "\"tool_callt\"\n: \"x\"}\n";
  ag_trajectory *t = parse_ok(two_lines);
  cr_assert_eq(t->format, AG_TRAJ_CHAT_JSONL);
  ag_traj_opts o;
  ag_traj_opts_init(&o);
  o.format = AG_TRAJ_CHAT_JSONL;
  ag_trajectory *t2 = NULL;
  ag_error_t err;
  cr_assert_eq(ag_trajectory_parse(&t2, two_lines, strlen(two_lines), &o, &err),
               AG_OK, "%s", err.msg);
  cr_assert_eq(t2->format, t->format);
  cr_assert_eq(t2->n_steps, t->n_steps);
  ag_trajectory_free(t2);
  o.format = AG_TRAJ_EVENTS;
  cr_assert_eq(ag_trajectory_parse(&t2, two_lines, strlen(two_lines), &o, &err),
               AG_EINVAL, "a chat message is not an event");
  cr_assert(strstr(err.msg, "among agentguard events") != NULL, "%s", err.msg);
  /* a broken second line of a forced log is still reported by its line */
  static const char broken[] = "{\"role\": \"user\", \"content\": \"a\"}\n"
                               "{\"role\": \"assistant\"\n";
  o.format = AG_TRAJ_CHAT_JSONL;
  cr_assert_neq(ag_trajectory_parse(&t2, broken, strlen(broken), &o, &err),
                AG_OK);
  cr_assert(strstr(err.msg, "line 2") != NULL, "%s", err.msg);
  ag_trajectory_free(t);
}

Test(formats, forced_format) {
  ag_traj_opts o;
  ag_traj_opts_init(&o);
  o.format = AG_TRAJ_EVENTS;
  ag_trajectory *t = NULL;
  ag_error_t err;
  cr_assert_eq(
      ag_trajectory_parse(&t, sample_neutral, strlen(sample_neutral), &o, &err),
      AG_EINVAL, "a trajectory object is not an event");
  cr_assert(strstr(err.msg, "nor an agentguard event") != NULL, "%s", err.msg);
  o.format = AG_TRAJ_NEUTRAL;
  cr_assert_eq(
      ag_trajectory_parse(&t, sample_neutral, strlen(sample_neutral), &o, &err),
      AG_OK, "%s", err.msg);
  ag_trajectory_free(t);
  char *arr = join(chat_lines, N_CHAT, "[", ",", "]");
  cr_assert_eq(ag_trajectory_parse(&t, arr, strlen(arr), &o, &err), AG_EINVAL);
  cr_assert(strstr(err.msg, "not a trajectory input: it reads as chat"), "%s",
            err.msg);
  o.format = AG_TRAJ_CHAT;
  cr_assert_eq(ag_trajectory_parse(&t, arr, strlen(arr), &o, &err), AG_OK);
  ag_trajectory_free(t);
  free(arr);
}

Test(formats, events_iteration_cap_without_wrap_up) {
  /* loop.final_request_without_tools false: the refused request is not in
   * the log; turn_end says max_iterations after 2 iterations. */
  static const char log[] =
      "{\"event\":\"turn_start\",\"turn\":1,\"iteration\":0,\"t_ms\":0}\n"
      "{\"event\":\"model_request\",\"turn\":1,\"iteration\":1,\"t_ms\":0}\n"
      "{\"event\":\"model_response\",\"turn\":1,\"iteration\":1,\"t_ms\":0}\n"
      "{\"event\":\"tool_call\",\"turn\":1,\"iteration\":1,\"t_ms\":0,"
      "\"call_id\":\"a\",\"name\":\"ls\",\"arguments\":\"{\\\"p\\\":1}\"}\n"
      "{\"event\":\"tool_result\",\"turn\":1,\"iteration\":1,\"t_ms\":1,"
      "\"call_id\":\"a\",\"name\":\"ls\",\"ok\":true,\"text\":\"x\"}\n"
      "{\"event\":\"model_request\",\"turn\":1,\"iteration\":2,\"t_ms\":2}\n"
      "{\"event\":\"model_response\",\"turn\":1,\"iteration\":2,\"t_ms\":2}\n"
      "{\"event\":\"tool_call\",\"turn\":1,\"iteration\":2,\"t_ms\":2,"
      "\"call_id\":\"b\",\"name\":\"ls\",\"arguments\":\"{\\\"p\\\":2}\"}\n"
      "{\"event\":\"tool_result\",\"turn\":1,\"iteration\":2,\"t_ms\":3,"
      "\"call_id\":\"b\",\"name\":\"ls\",\"ok\":true,\"text\":\"y\"}\n"
      "{\"event\":\"turn_end\",\"turn\":1,\"iteration\":2,\"t_ms\":3,"
      "\"status\":\"stopped\",\"reason\":\"max_iterations\","
      "\"message\":\"Reached the maximum of 2 iterations in one turn\","
      "\"iterations\":2}\n";
  ag_trajectory *t = parse_ok(log);
  cr_assert_eq(t->n_steps, 3);
  cr_assert(t->turns[0].steps[2].no_reply);
  ag_config cfg = config_json("{\"loop\": {\"max_iterations\": 2}}");
  ag_audit_finding f = audit_cfg(t, &cfg, false);
  cr_assert(f.stop.stopped);
  cr_assert_eq(f.stop.reason, AG_REASON_MAX_ITERATIONS);
  cr_assert_eq(f.stop.step_in_turn, 3);
  f = audit(t, "default");
  cr_assert(!f.stop.stopped);
  ag_trajectory_free(t);
  /* with the wrap-up in the log (iterations = cap + 1) nothing is added */
  char *wrapped = strdup(log);
  char *m = strstr(wrapped, "maximum of 2");
  m[11] = '1';
  t = parse_ok(wrapped);
  cr_assert_eq(t->n_steps, 2);
  ag_trajectory_free(t);
  /* without a message: the last step's calls ran, so no wrap-up */
  char *bare = strdup(log);
  m = strstr(bare, "\"message\"");
  memcpy(m, "\"massage\"", 9);
  t = parse_ok(bare);
  cr_assert_eq(t->n_steps, 3);
  ag_trajectory_free(t);
  free(wrapped);
  free(bare);
}

/* ---- bad inputs --------------------------------------------------------- */

Test(bad_inputs, truncated_json) {
  size_t n = strlen(sample_neutral) / 2;
  char *cut = strndup(sample_neutral, n);
  ag_trajectory *t = NULL;
  ag_error_t err;
  cr_assert_eq(ag_trajectory_parse(&t, cut, n, NULL, &err), AG_EJSON);
  cr_assert_null(t);
  cr_assert_gt(err.line, 0);
  cr_assert(strstr(err.msg, "invalid JSON") != NULL, "%s", err.msg);
  free(cut);
  /* JSON Lines cut in a line that ends with its newline: that line is
   * named (a cut last line without one: cut_lines below) */
  char *jsonl = join(chat_lines, N_CHAT, "", "\n", "\n");
  jsonl[strlen(jsonl) - 6] = '\n';
  jsonl[strlen(jsonl) - 5] = '\0';
  const char *msg = parse_fail(jsonl, AG_EJSON);
  char want[32];
  snprintf(want, sizeof(want), "line %zu", N_CHAT);
  cr_assert(strstr(msg, want) != NULL, "%s (wanted %s)", msg, want);
  free(jsonl);
}

/* ---- a last line cut off mid-line (issue 25) ----------------------------- */

/* `head` then the first `keep` bytes of `line`, without a newline. */
static char *cut_after(const char *head, const char *line, size_t keep) {
  size_t n = strlen(head);
  char *s = malloc(n + keep + 1);
  cr_assert_not_null(s);
  memcpy(s, head, n);
  memcpy(s + n, line, keep);
  s[n + keep] = '\0';
  return s;
}

/* A writer killed mid-line leaves the beginning of its last line: however
 * short, that line is left out, named in cut_line, and the rest is the run
 * without it, detected or forced. */
Test(cut_lines, a_cut_last_line_is_left_out) {
  char *all = join(event_lines, N_EVENTS, "", "\n", "\n");
  char *but_last = join(event_lines, N_EVENTS - 1, "", "\n", "\n");
  /* the last event of the log, and a line after the whole log whose text
   * has two- and three-byte characters (cut inside them too) */
  const struct {
    const char *head, *line;
    long line_no;
  } cases[] = {
      {but_last, event_lines[N_EVENTS - 1], (long)N_EVENTS},
      {all,
       "{\"event\":\"turn_start\",\"turn\":3,\"iteration\":0,\"t_ms\":13,"
       "\"user\":\"caf\xC3\xA9 \xE2\x98\x80?\"}",
       (long)N_EVENTS + 1},
  };
  ag_traj_opts forced;
  ag_traj_opts_init(&forced);
  forced.format = AG_TRAJ_EVENTS;
  for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
    ag_trajectory *ref = parse_ok(cases[c].head);
    cr_assert_eq(ref->cut_line, 0);
    size_t len = strlen(cases[c].line);
    for (size_t keep = 1; keep < len; keep++) {
      char *text = cut_after(cases[c].head, cases[c].line, keep);
      ag_trajectory *t = parse_ok(text);
      cr_assert_eq(t->cut_line, cases[c].line_no,
                   "case %zu, %zu of %zu bytes: cut_line %ld", c, keep, len,
                   t->cut_line);
      assert_same_run(ref, t, "the log without its cut line");
      ag_trajectory_free(t);
      ag_error_t err;
      cr_assert_eq(ag_trajectory_parse(&t, text, strlen(text), &forced, &err),
                   AG_OK, "forced, case %zu, %zu bytes: %s", c, keep, err.msg);
      cr_assert_eq(t->cut_line, cases[c].line_no);
      ag_trajectory_free(t);
      free(text);
    }
    /* the whole line without its newline is a line, not a cut */
    char *text = cut_after(cases[c].head, cases[c].line, len);
    ag_trajectory *t = parse_ok(text);
    cr_assert_eq(t->cut_line, 0, "case %zu: cut_line %ld", c, t->cut_line);
    ag_trajectory_free(t);
    free(text);
    ag_trajectory_free(ref);
  }
  /* a sample finding with the log's last line cut: the same stop */
  char *text = cut_after(but_last, event_lines[N_EVENTS - 1], 20);
  ag_trajectory *t = parse_ok(text);
  assert_sample_finding(t, "cut events");
  ag_trajectory_free(t);
  free(text);
  free(all);
  free(but_last);
}

Test(cut_lines, only_a_cut_last_line_is_left_out) {
  char *head = join(event_lines, 3, "", "\n", "\n");
  const char *last = event_lines[3];
  size_t half = strlen(last) / 2;
  char *cut = cut_after(head, last, half);
  char want[32];
  /* with its newline: the writer finished the line; what is there is bad */
  char *ended = cut_after(cut, "\n", 1);
  const char *msg = parse_fail(ended, AG_EJSON);
  cr_assert(strstr(msg, "line 4,") != NULL, "%s", msg);
  free(ended);
  /* cut in the middle: an error that names it, as ever */
  char *middle = cut_after(cut, "\n", 1);
  char *rest = join(event_lines + 4, N_EVENTS - 4, middle, "\n", "\n");
  msg = parse_fail(rest, AG_EJSON);
  cr_assert(strstr(msg, "line 4,") != NULL, "%s", msg);
  free(rest);
  free(middle);
  /* a last line that goes wrong before its end is bad, not cut */
  static const char *const bad[] = {
      "{\"event\":x,\"turn\":1",          /* a bad token first */
      "{\"event\":\"turn_end\"}}",        /* a whole value, then more */
      "{\"event\":\"a\xFF\xFF\xFF\xFF\"", /* bad UTF-8, not a cut one */
      "{\"event\":\"a\",\"event\":\"b\"", /* a duplicate key */
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    char *text = cut_after(head, bad[i], strlen(bad[i]));
    msg = parse_fail(text, AG_EJSON);
    cr_assert(strstr(msg, "line 4,") != NULL, "bad %zu: %s", i, msg);
    free(text);
  }
  /* a cut first line has nothing before it: not a run */
  msg = parse_fail("{\"event\":\"turn_start\",\"turn", AG_EJSON);
  cr_assert(strstr(msg, "line 1,") != NULL, "%s", msg);
  /* a chat transcript cut in its last message, the reply to the last call:
   * the rest misses that reply, and the error says which line was left out */
  char *chat = join(chat_lines, N_CHAT, "", "\n", "");
  chat[strlen(chat) - 5] = '\0';
  msg = parse_fail(chat, AG_EINVAL);
  snprintf(want, sizeof(want), "(line %zu, the last, was cut off", N_CHAT);
  cr_assert(strstr(msg, want) != NULL, "%s (wanted %s)", msg, want);
  free(chat);
  free(cut);
  free(head);
}

Test(bad_inputs, unknown_shapes) {
  cr_assert(strstr(parse_fail("{\"foo\": 1}", AG_EINVAL), "unknown shape"));
  cr_assert(strstr(parse_fail("[1, 2]", AG_EINVAL), "unknown shape"));
  cr_assert(strstr(parse_fail("42", AG_EINVAL), "unknown shape"));
  cr_assert(strstr(parse_fail("[]", AG_EINVAL), "empty"));
  cr_assert(strstr(parse_fail("", AG_EINVAL), "empty"));
  cr_assert(strstr(parse_fail("  \n", AG_EINVAL), "empty"));
  parse_fail("{\"a\":1}\n{\"b\":2}\n", AG_EINVAL);
  parse_fail("nonsense", AG_EJSON);
  cr_assert(strstr(parse_fail("{\"steps\": {}}", AG_EINVAL), "array"));
  /* a chat line among events */
  const char *msg = parse_fail("{\"event\":\"turn_start\",\"turn\":1}\n"
                               "{\"role\":\"user\",\"content\":\"x\"}\n",
                               AG_EINVAL);
  cr_assert(strstr(msg, "line 2") != NULL, "%s", msg);
  cr_assert(
      strstr(parse_fail("[{\"role\": \"robot\"}]", AG_EINVAL), "unknown role"));
}

Test(bad_inputs, tool_reply_without_its_call) {
  const char *msg = parse_fail(
      "[{\"role\":\"user\",\"content\":\"x\"},"
      "{\"role\":\"tool\",\"tool_call_id\":\"zz\",\"content\":\"r\"}]",
      AG_EINVAL);
  cr_assert(strstr(msg, "message 2") != NULL, "%s", msg);
  cr_assert(strstr(msg, "'zz' without its call") != NULL, "%s", msg);
  msg = parse_fail(
      "[{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"a\","
      "\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},"
      "{\"role\":\"tool\",\"tool_call_id\":\"a\",\"content\":\"1\"},"
      "{\"role\":\"tool\",\"tool_call_id\":\"a\",\"content\":\"2\"}]",
      AG_EINVAL);
  cr_assert(strstr(msg, "second tool reply") != NULL, "%s", msg);
  msg = parse_fail("{\"event\":\"tool_result\",\"turn\":1,\"call_id\":\"q\","
                   "\"ok\":true}\n{\"event\":\"turn_end\"}\n",
                   AG_EINVAL);
  cr_assert(strstr(msg, "without its tool_call") != NULL, "%s", msg);
}

Test(bad_inputs, tool_calls_without_replies) {
  const char *msg =
      parse_fail("[{\"role\":\"user\",\"content\":\"x\"},"
                 "{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"a\","
                 "\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}]",
                 AG_EINVAL);
  cr_assert(strstr(msg, "message 2: tool call 'a' (f)") != NULL, "%s", msg);
  cr_assert(strstr(msg, "transcript ends") != NULL, "%s", msg);
  msg = parse_fail("[{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"a\","
                   "\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},"
                   "{\"role\":\"user\",\"content\":\"x\"}]",
                   AG_EINVAL);
  cr_assert(strstr(msg, "before the next user message") != NULL, "%s", msg);
  cr_assert(strstr(msg, "message 1:") != NULL, "%s", msg);
}

Test(bad_inputs, neutral_mismatches_and_types) {
  const char *msg = parse_fail(
      "{\"steps\":[{\"calls\":[{\"name\":\"a\",\"args\":{}}],\"results\":[]}]}",
      AG_EINVAL);
  cr_assert(strstr(msg, "step 1") && strstr(msg, "1 calls but 0 results"), "%s",
            msg);
  msg = parse_fail("{\"steps\":[{\"calls\":[{\"args\":{}}],\"results\":[{}]}]}",
                   AG_EINVAL);
  cr_assert(strstr(msg, "\"name\""), "%s", msg);
  msg = parse_fail("{\"steps\":[{\"calls\":[{\"name\":\"a\"}],"
                   "\"results\":[{\"ok\":\"yes\"}]}]}",
                   AG_EINVAL);
  cr_assert(strstr(msg, "\"ok\""), "%s", msg);
  msg = parse_fail("{\"steps\":[{\"calls\":[{\"name\":\"a\","
                   "\"rejected_by_harness\":true},{\"name\":\"b\"}],"
                   "\"results\":[{\"ok\":false}]}]}",
                   AG_EINVAL);
  cr_assert(strstr(msg, "rejected_by_harness"), "%s", msg);
  parse_fail("{\"steps\":[42]}", AG_EINVAL);
  parse_fail("{\"steps\":[{}]}", AG_EINVAL);
  parse_fail("{\"steps\":[{\"calls\":[],\"results\":[],\"t_ms\":\"x\"}]}",
             AG_EINVAL);
}

Test(bad_inputs, caps) {
  ag_traj_opts o;
  ag_traj_opts_init(&o);
  ag_trajectory *t = NULL;
  ag_error_t err;
  o.max_bytes = 100;
  cr_assert_eq(
      ag_trajectory_parse(&t, sample_neutral, strlen(sample_neutral), &o, &err),
      AG_ETOOBIG);
  ag_traj_opts_init(&o);
  o.max_steps = 3;
  cr_assert_eq(
      ag_trajectory_parse(&t, sample_neutral, strlen(sample_neutral), &o, &err),
      AG_ETOOBIG);
  cr_assert(strstr(err.msg, "more than 3 steps"), "%s", err.msg);
  ag_traj_opts_init(&o);
  o.max_calls = 1;
  static const char two[] =
      "{\"steps\":[{\"calls\":[{\"name\":\"a\"},{\"name\":\"b\"}],"
      "\"results\":[{\"ok\":true},{\"ok\":true}]}]}";
  cr_assert_eq(ag_trajectory_parse(&t, two, strlen(two), &o, &err), AG_ETOOBIG);
  cr_assert_null(t);
  cr_assert_eq(ag_trajectory_parse(NULL, two, strlen(two), NULL, &err),
               AG_EINVAL);
  ag_trajectory_free(NULL);
}

/* Issue 10, finding 8: a tool_call after turn_end built a step outside any
 * turn's events, and time could run backwards. */
Test(bad_inputs, events_out_of_order) {
  const char *msg = parse_fail(
      "{\"event\":\"turn_start\",\"turn\":1,\"iteration\":0,\"t_ms\":0}\n"
      "{\"event\":\"model_request\",\"turn\":1,\"iteration\":1,\"t_ms\":1}\n"
      "{\"event\":\"turn_end\",\"turn\":1,\"iteration\":1,\"t_ms\":2,"
      "\"status\":\"completed\",\"reason\":\"final_answer\"}\n"
      "{\"event\":\"tool_call\",\"turn\":1,\"iteration\":1,\"t_ms\":3,"
      "\"call_id\":\"c\",\"name\":\"f\",\"arguments\":\"{}\"}\n",
      AG_EINVAL);
  cr_assert(strstr(msg, "line 4 (event 4): tool_call after turn_end") != NULL,
            "%s", msg);
  msg = parse_fail(
      "{\"event\":\"turn_start\",\"turn\":1,\"iteration\":0,\"t_ms\":0}\n"
      "{\"event\":\"model_request\",\"turn\":1,\"iteration\":1,\"t_ms\":50}\n"
      "{\"event\":\"model_response\",\"turn\":1,\"iteration\":1,\"t_ms\":20,"
      "\"text\":\"x\"}\n",
      AG_EINVAL);
  cr_assert(strstr(msg, "line 3 (event 3): \"t_ms\" goes back in time (20 "
                        "after 50)") != NULL,
            "%s", msg);
  /* a new turn after turn_end is fine, and so are equal times */
  ag_trajectory *t = parse_ok(
      "{\"event\":\"turn_start\",\"turn\":1,\"iteration\":0,\"t_ms\":0}\n"
      "{\"event\":\"model_request\",\"turn\":1,\"iteration\":1,\"t_ms\":0}\n"
      "{\"event\":\"model_response\",\"turn\":1,\"iteration\":1,\"t_ms\":1,"
      "\"text\":\"x\"}\n"
      "{\"event\":\"turn_end\",\"turn\":1,\"iteration\":1,\"t_ms\":1}\n"
      "{\"event\":\"turn_start\",\"turn\":2,\"iteration\":0,\"t_ms\":2}\n"
      "{\"event\":\"model_request\",\"turn\":2,\"iteration\":1,\"t_ms\":2}\n"
      "{\"event\":\"model_response\",\"turn\":2,\"iteration\":1,\"t_ms\":3,"
      "\"text\":\"y\"}\n"
      "{\"event\":\"turn_end\",\"turn\":2,\"iteration\":1,\"t_ms\":3}\n");
  cr_assert_eq(t->n_turns, 2);
  ag_trajectory_free(t);
}

/* Issue 10, finding 8: the last of two "ok" keys won, flipping a result. */
Test(bad_inputs, duplicate_keys_are_rejected) {
  const char *msg =
      parse_fail("{\"steps\":[{\"calls\":[{\"name\":\"a\",\"args\":{}}],\n"
                 "\"results\":[{\"ok\":true,\"ok\":false,\"text\":\"x\"}]}]}",
                 AG_EJSON);
  cr_assert(strstr(msg, "line 2, column 26: duplicate object key near "
                        "'\"ok\"'") != NULL,
            "%s", msg);
  /* in JSON Lines, the line is the file's */
  msg = parse_fail("{\"role\":\"user\",\"content\":\"x\"}\n"
                   "{\"role\":\"assistant\",\"content\":\"a\","
                   "\"content\":\"b\"}\n",
                   AG_EJSON);
  cr_assert(strstr(msg, "line 2, column") != NULL, "%s", msg);
  cr_assert(strstr(msg, "duplicate object key near '\"content\"'") != NULL,
            "%s", msg);
}

/* Issue 10, finding 9: a number beyond a double's range is a clear error at
 * its place (jansson cannot read it; docs/audit.md says so). */
Test(bad_inputs, number_out_of_range) {
  const char *msg = parse_fail(
      "{\"steps\":[{\"calls\":[{\"name\":\"a\",\"args\":{\"n\":1e999}}],"
      "\"results\":[{\"ok\":true}]}]}",
      AG_EJSON);
  cr_assert(strstr(msg, "line 1, column 49: number out of range (beyond "
                        "+-1.8e308) near '1e999'") != NULL,
            "%s", msg);
  /* within range, however written, it is accepted */
  ag_trajectory *t =
      parse_ok("{\"steps\":[{\"calls\":[{\"name\":\"a\",\"args\":{\"n\":1e308,"
               "\"m\":-1.5E-320,\"k\":123456789012345678901234567890}}],"
               "\"results\":[{\"ok\":true}]}]}");
  ag_trajectory_free(t);
}

Test(bad_inputs, hand_built_runs_are_checked) {
  ag_traj_call call = {"a", "{}", 2};
  ag_traj_step step;
  memset(&step, 0, sizeof(step));
  step.calls = &call;
  step.n_calls = 1; /* and no result */
  step.t_request_ms = -1;
  ag_traj_turn turn = {&step, 1, -1};
  ag_trajectory t;
  memset(&t, 0, sizeof(t));
  t.turns = &turn;
  t.n_turns = 1;
  t.n_steps = 1;
  ag_config cfg = preset("default");
  ag_auditor *a = NULL;
  cr_assert_eq(ag_auditor_new(&a, &cfg, NULL, NULL), AG_OK);
  ag_audit_finding f;
  ag_error_t err;
  cr_assert_eq(ag_auditor_run(a, &t, &f, &err), AG_EINVAL);
  cr_assert(strstr(err.msg, "1 calls but 0 results"), "%s", err.msg);
  ag_traj_result res = {AG_OUTCOME_OK, AG_CAT__COUNT, "fine", 4};
  step.results = &res;
  step.n_results = 1;
  cr_assert_eq(ag_auditor_run(a, &t, &f, &err), AG_OK, "%s", err.msg);
  cr_assert(!f.stop.stopped);
  cr_assert_eq(f.steps, 1);
  t.n_steps = 2;
  cr_assert_eq(ag_auditor_run(a, &t, &f, &err), AG_EINVAL);
  ag_auditor_free(a);
}

/* ---- replay rules ------------------------------------------------------- */

/* A neutral run of `n` steps, each one call of `name` with `args` giving
 * `text` (ok `ok`). Caller frees. */
static char *repeat_run(int n, const char *name, const char *args,
                        const char *text, bool ok) {
  size_t cap =
      256 + (size_t)n * (strlen(name) + strlen(args) + strlen(text) + 96);
  char *s = malloc(cap);
  cr_assert_not_null(s);
  size_t used = (size_t)snprintf(s, cap, "{\"steps\":[");
  for (int i = 0; i < n; i++)
    used += (size_t)snprintf(
        s + used, cap - used,
        "%s{\"calls\":[{\"name\":\"%s\",\"args\":%s}],\"results\":[{\"ok\":%s,"
        "\"text\":\"%s\"}]}",
        i ? "," : "", name, args, ok ? "true" : "false", text);
  snprintf(s + used, cap - used, "]}");
  return s;
}

Test(replay, identical_calls_stop_before_the_call_runs) {
  char *run = repeat_run(8, "read", "{\"p\":1}", "same", true);
  ag_trajectory *t = parse_ok(run);
  ag_audit_finding f = audit(t, "default");
  cr_assert(f.stop.stopped);
  cr_assert_eq(f.stop.reason, AG_REASON_IDENTICAL_CALLS);
  cr_assert_eq(f.stop.step, 5);
  cr_assert_eq(f.stop.call_index, 0);
  cr_assert_str_eq(f.stop.tool, "read");
  cr_assert_eq(f.stop.steps_after, 3);
  ag_trajectory_free(t);
  free(run);
}

Test(replay, nudged_call_is_held_back_then_stopped) {
  char *run = repeat_run(8, "read", "{\"p\":1}", "same", true);
  ag_trajectory *t = parse_ok(run);
  ag_config cfg = config_json("{\"loop\": {\"nudge_before_stop\": true}}");
  ag_audit_finding f = audit_cfg(t, &cfg, false);
  cr_assert_eq(f.held_back, 1, "the 5th call is held back");
  cr_assert(f.stop.stopped);
  cr_assert_eq(f.stop.reason, AG_REASON_IDENTICAL_CALLS);
  cr_assert_eq(f.stop.step, 6, "the next repetition stops");
  ag_trajectory_free(t);
  free(run);
}

Test(replay, escalation_counts_as_a_stop) {
  char *run = repeat_run(6, "pay", "{\"n\":1}", "Error: card declined", false);
  ag_trajectory *t = parse_ok(run);
  ag_audit_finding f = audit(t, "twelve-factor");
  cr_assert(f.stop.stopped);
  cr_assert_eq(f.stop.action, AG_ESCALATE);
  cr_assert_eq(f.stop.reason, AG_REASON_TOOL_ERROR_BUDGET);
  cr_assert_eq(f.stop.step, 3);
  char *json = NULL;
  cr_assert_eq(
      ag_audit_finding_json("x.json", "twelve-factor", t, &f, &json, NULL),
      AG_OK);
  cr_assert(strstr(json, "\"action\":\"escalate\""), "%s", json);
  ag_free(json);
  ag_trajectory_free(t);
  free(run);
}

Test(replay, ok_false_is_an_error_without_a_prefix) {
  char *run =
      repeat_run(5, "sh", "{\"c\":\"make\"}", "make: *** failed", false);
  ag_trajectory *t = parse_ok(run);
  ag_audit_finding f = audit(t, "hpd");
  cr_assert(f.stop.stopped);
  cr_assert_eq(f.stop.reason, AG_REASON_CONSECUTIVE_ERRORS);
  cr_assert_eq(f.stop.step, 4);
  ag_trajectory_free(t);
  free(run);
  /* ok true with an error prefix: the guard's prefixes decide */
  run = repeat_run(5, "sh", "{\"c\":\"x\"}", "Error: no", true);
  t = parse_ok(run);
  f = audit(t, "hpd");
  cr_assert_eq(f.stop.reason, AG_REASON_CONSECUTIVE_ERRORS);
  ag_trajectory_free(t);
  free(run);
  /* ok true without one: fine */
  run = repeat_run(4, "sh", "{\"c\":\"x\"}", "ERROR processing", true);
  t = parse_ok(run);
  f = audit(t, "hpd");
  cr_assert(!f.stop.stopped);
  ag_trajectory_free(t);
  free(run);
}

Test(replay, rejected_replies_are_refused_replies) {
  static const char run[] =
      "{\"steps\":["
      "{\"calls\":[{\"name\":\"bash\",\"args\":{\"command\":\"ls\"},"
      "\"rejected_by_harness\":true},{\"name\":\"bash\",\"args\":{\"command\":"
      "\"ls\"},\"rejected_by_harness\":true}],"
      "\"results\":[{\"ok\":false,\"text\":\"one action please\"}]},"
      "{\"rejected_by_harness\":true,\"calls\":[],\"results\":[{\"ok\":false,"
      "\"text\":\"one action please\"}]},"
      "{\"calls\":[{\"name\":\"bash\",\"args\":{\"command\":\"ls\"},"
      "\"rejected_by_harness\":true}],\"results\":[]},"
      "{\"calls\":[{\"name\":\"bash\",\"args\":{\"command\":\"ls\"},"
      "\"rejected_by_harness\":true}],\"results\":[{\"ok\":false,"
      "\"text\":\"one action please\"}]}]}";
  ag_trajectory *t = parse_ok(run);
  cr_assert(t->turns[0].steps[1].rejected);
  cr_assert_eq(t->turns[0].steps[2].n_results, 1, "an observation slot");
  /* nothing ran: no tool's error and no failing iteration (hpd's 3
   * consecutive errors never see them), but refused replies in a row */
  ag_audit_finding f = audit(t, "hpd");
  cr_assert(!f.stop.stopped);
  ag_config cfg = config_json("{\"preset\": \"hpd\", \"loop\": "
                              "{\"max_refused_replies\": 4}}");
  f = audit_cfg(t, &cfg, false);
  cr_assert(f.stop.stopped);
  cr_assert_eq(f.stop.reason, AG_REASON_REFUSED_REPLIES);
  cr_assert_eq(f.stop.step, 4);
  cr_assert_str_eq(f.stop.tool, "");
  /* the proposed calls never reach the identical-call breaker */
  cfg = config_json("{\"preset\": \"none\", \"loop\": "
                    "{\"identical_call_limit\": 2}}");
  f = audit_cfg(t, &cfg, false);
  cr_assert(!f.stop.stopped);
  /* twelve-factor's per-tool budget (3) does not count them under a tool
   * with no name (it did: " failed 3 times in a row") */
  f = audit(t, "twelve-factor");
  cr_assert(!f.stop.stopped, "stopped: %s", f.stop.message);
  ag_trajectory_free(t);
}

Test(replay, a_step_with_no_call_and_one_result_is_a_refused_reply) {
  /* mini-swe-agent's format errors recorded without rejected_by_harness:
   * the run used to be skipped ("0 calls but 1 results") */
  static const char run[] =
      "{\"outcome\":\"resolved\",\"steps\":["
      "{\"calls\":[{\"name\":\"bash\",\"args\":{\"command\":\"ls\"}}],"
      "\"results\":[{\"ok\":true,\"text\":\"a\"}]},"
      "{\"calls\":[],\"results\":[{\"ok\":false,\"text\":\"Please always "
      "provide EXACTLY ONE action, found 0 actions.\"}]},"
      "{\"calls\":[{\"name\":\"bash\",\"args\":{\"command\":\"ls\"}}],"
      "\"results\":[{\"ok\":true,\"text\":\"a\"}]}]}";
  ag_trajectory *t = parse_ok(run);
  cr_assert_eq(t->n_steps, 3);
  cr_assert(t->turns[0].steps[1].rejected);
  cr_assert_eq(t->turns[0].steps[1].n_results, 1);
  ag_config cfg = config_json("{\"preset\": \"none\", \"loop\": "
                              "{\"max_refused_replies\": 1}}");
  ag_audit_finding f = audit_cfg(t, &cfg, false);
  cr_assert(f.stop.stopped);
  cr_assert_eq(f.stop.reason, AG_REASON_REFUSED_REPLIES);
  cr_assert_eq(f.stop.step, 2);
  ag_trajectory_free(t);
  /* two results for no call is still an error */
  parse_fail("{\"steps\":[{\"calls\":[],\"results\":[{\"ok\":false},"
             "{\"ok\":false}]}]}",
             AG_EINVAL);
}

Test(replay, a_run_with_no_steps_is_a_run_not_stopped) {
  ag_trajectory *t = parse_ok("{\"outcome\":\"unresolved\",\"steps\":[]}");
  cr_assert_eq(t->n_steps, 0);
  cr_assert_eq(t->n_turns, 0);
  cr_assert_eq(t->outcome, AG_RUN_UNRESOLVED);
  ag_audit_finding f = audit(t, "default");
  cr_assert(!f.stop.stopped);
  cr_assert_eq(f.steps, 0);
  ag_trajectory_free(t);
  t = parse_ok("{\"messages\":[]}");
  cr_assert_eq(t->n_steps, 0);
  ag_trajectory_free(t);
}

Test(replay, replies_without_tool_calls_under_require_tool_call) {
  static const char chat[] = "[{\"role\":\"user\",\"content\":\"x\"},"
                             "{\"role\":\"assistant\",\"content\":\"hmm\"},"
                             "{\"role\":\"assistant\",\"content\":\"hmm\"},"
                             "{\"role\":\"assistant\",\"content\":\"hmm\"},"
                             "{\"role\":\"assistant\",\"content\":\"hmm\"},"
                             "{\"role\":\"assistant\",\"content\":\"hmm\"},"
                             "{\"role\":\"assistant\",\"content\":\"hmm\"}]";
  ag_trajectory *t = parse_ok(chat);
  cr_assert_eq(t->n_steps, 6);
  /* refused replies (forge: 5 in a row, as its 5 identical errors) */
  ag_audit_finding f = audit(t, "forge");
  cr_assert(f.stop.stopped);
  cr_assert_eq(f.stop.reason, AG_REASON_REFUSED_REPLIES);
  cr_assert_eq(f.stop.step, 5);
  f = audit(t, "default");
  cr_assert(!f.stop.stopped, "without require_tool_call a text reply is an "
                             "answer, not an error");
  ag_trajectory_free(t);
}

Test(replay, iteration_cap_counts_every_reply) {
  /* with every other mechanism off, only the cap can stop it */
  char *run = repeat_run(12, "step", "{}", "ok", true);
  ag_trajectory *t = parse_ok(run);
  ag_config cfg = config_json("{\"preset\": \"none\", \"loop\": "
                              "{\"max_iterations\": 10}}");
  ag_audit_finding f = audit_cfg(t, &cfg, false);
  cr_assert(f.stop.stopped);
  cr_assert_eq(f.stop.reason, AG_REASON_MAX_ITERATIONS);
  cr_assert_eq(f.stop.step, 11);
  cr_assert_eq(f.stop.call_index, -1);
  cr_assert_eq(f.stop.steps_after, 1);
  ag_trajectory_free(t);
  free(run);
}

Test(replay, turn_timeout_needs_timestamps) {
  static const char timed[] =
      "{\"steps\":["
      "{\"t_ms\":0,\"calls\":[{\"name\":\"a\",\"args\":{\"i\":1}}],"
      "\"results\":[{\"ok\":true,\"text\":\"\"}]},"
      "{\"t_ms\":4000,\"calls\":[{\"name\":\"a\",\"args\":{\"i\":2}}],"
      "\"results\":[{\"ok\":true,\"text\":\"\"}]},"
      "{\"t_ms\":9000,\"calls\":[{\"name\":\"a\",\"args\":{\"i\":3}}],"
      "\"results\":[{\"ok\":true,\"text\":\"\"}]},"
      "{\"user_msg_before\":\"next\",\"t_ms\":9500,\"calls\":[{\"name\":\"a\","
      "\"args\":{\"i\":4}}],\"results\":[{\"ok\":true,\"text\":\"\"}]}]}";
  ag_config cfg = config_json("{\"loop\": {\"max_turn_duration\": \"5s\"}}");
  ag_trajectory *t = parse_ok(timed);
  cr_assert(t->timed);
  ag_audit_finding f = audit_cfg(t, &cfg, false);
  cr_assert(f.stop.stopped);
  cr_assert_eq(f.stop.reason, AG_REASON_TURN_TIMEOUT);
  cr_assert_eq(f.stop.step, 3);
  ag_trajectory_free(t);
  /* the same run without timestamps: time stands still, no timeout */
  char *untimed = strdup(timed);
  for (char *p = strstr(untimed, "\"t_ms\""); p != NULL;
       p = strstr(p, "\"t_ms\""))
    memcpy(p, "\"x_ms\"", 6);
  t = parse_ok(untimed);
  cr_assert(!t->timed);
  f = audit_cfg(t, &cfg, false);
  cr_assert(!f.stop.stopped);
  ag_trajectory_free(t);
  free(untimed);
}

Test(replay, invalid_arguments_are_refused_replies) {
  /* A chat transcript whose arguments are not JSON: the call would not
   * have run live, whatever the recording says; a reply where nothing
   * could run is a refused reply, not a failing iteration. */
  static const char chat[] =
      "[{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"a\",\"function\":"
      "{\"name\":\"f\",\"arguments\":\"{oops\"}}]},"
      "{\"role\":\"tool\",\"tool_call_id\":\"a\",\"content\":\"fine\"},"
      "{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"b\",\"function\":"
      "{\"name\":\"f\",\"arguments\":\"{oops\"}}]},"
      "{\"role\":\"tool\",\"tool_call_id\":\"b\",\"content\":\"fine\"},"
      "{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"c\",\"function\":"
      "{\"name\":\"f\",\"arguments\":\"{oops\"}}]},"
      "{\"role\":\"tool\",\"tool_call_id\":\"c\",\"content\":\"fine\"},"
      "{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"d\",\"function\":"
      "{\"name\":\"f\",\"arguments\":\"{oops\"}}]},"
      "{\"role\":\"tool\",\"tool_call_id\":\"d\",\"content\":\"fine\"}]";
  ag_trajectory *t = parse_ok(chat);
  ag_audit_finding f = audit(t, "hpd");
  cr_assert(!f.stop.stopped);
  ag_config cfg = config_json("{\"preset\": \"hpd\", \"loop\": "
                              "{\"max_refused_replies\": 4}}");
  f = audit_cfg(t, &cfg, false);
  cr_assert(f.stop.stopped);
  cr_assert_eq(f.stop.reason, AG_REASON_REFUSED_REPLIES);
  cr_assert_eq(f.stop.step, 4);
  ag_trajectory_free(t);
}

/* ---- summary and JSON --------------------------------------------------- */

Test(summary, counts_and_json) {
  ag_audit_summary s;
  ag_audit_summary_init(&s);
  ag_trajectory *a = parse_ok(sample_neutral); /* unresolved, stops at 5/7 */
  ag_audit_finding fa = audit(a, "default");
  ag_audit_summary_add(&s, a, &fa);
  char *run = repeat_run(3, "x", "{}", "y", true);
  ag_trajectory *b = parse_ok(run); /* unknown, no stop */
  ag_audit_finding fb = audit(b, "default");
  ag_audit_summary_add(&s, b, &fb);
  ag_audit_summary_add_skipped(&s);
  cr_assert_eq(s.runs, 2);
  cr_assert_eq(s.skipped, 1);
  cr_assert_eq(s.runs_by_outcome[AG_RUN_UNRESOLVED], 1);
  cr_assert_eq(s.stopped_by_outcome[AG_RUN_UNRESOLVED], 1);
  cr_assert_eq(s.steps_by_outcome[AG_RUN_UNRESOLVED], 7);
  cr_assert_eq(s.saved_by_outcome[AG_RUN_UNRESOLVED], 2);
  cr_assert_float_eq(ag_audit_summary_saved_share(&s, AG_RUN_UNRESOLVED),
                     2.0 / 7.0, 1e-12);
  cr_assert_eq(s.stops_by_reason[AG_REASON_REPEATED_RESULTS], 1);
  cr_assert_eq(s.runs_by_outcome[AG_RUN_UNKNOWN], 1);
  cr_assert_eq(ag_audit_summary_saved_share(&s, AG_RUN_RESOLVED), 0.0);

  char *js = NULL;
  cr_assert_eq(ag_audit_summary_json("default", &s, &js, NULL), AG_OK);
  json_error_t je;
  json_t *j = json_loads(js, 0, &je);
  cr_assert_not_null(j, "%s: %s", js, je.text);
  cr_assert_str_eq(json_string_value(json_object_get(j, "type")), "summary");
  cr_assert_eq(json_integer_value(json_object_get(j, "runs")), 2);
  cr_assert_eq(json_integer_value(json_object_get(j, "skipped")), 1);
  json_t *u = json_object_get(json_object_get(j, "by_outcome"), "unresolved");
  cr_assert_eq(json_integer_value(json_object_get(u, "saved_steps")), 2);
  cr_assert_eq(json_integer_value(json_object_get(
                   json_object_get(j, "stops_by_reason"), "repeated_results")),
               1);
  json_decref(j);
  ag_free(js);

  cr_assert_eq(ag_audit_finding_json("a.json", "default", a, &fa, &js, NULL),
               AG_OK);
  j = json_loads(js, 0, &je);
  cr_assert_not_null(j, "%s", js);
  cr_assert(strchr(js, '\n') == NULL, "one line");
  cr_assert_str_eq(json_string_value(json_object_get(j, "type")), "run");
  cr_assert_str_eq(json_string_value(json_object_get(j, "format")),
                   "trajectory");
  cr_assert(json_is_true(json_object_get(j, "stopped")));
  json_t *st = json_object_get(j, "stop");
  cr_assert_eq(json_integer_value(json_object_get(st, "step")), 5);
  cr_assert_str_eq(json_string_value(json_object_get(st, "reason")),
                   "repeated_results");
  cr_assert_eq(json_integer_value(json_object_get(st, "steps_after")), 2);
  cr_assert_null(json_object_get(j, "all_stops"));
  json_decref(j);
  ag_free(js);

  cr_assert_eq(ag_audit_finding_json(NULL, NULL, b, &fb, &js, NULL), AG_OK);
  j = json_loads(js, 0, &je);
  cr_assert(json_is_null(json_object_get(j, "stop")));
  cr_assert_null(json_object_get(j, "file"));
  json_decref(j);
  ag_free(js);

  ag_trajectory_free(a);
  ag_trajectory_free(b);
  free(run);
}
