/*
 * tests/unit/test_audit.c - trajectories and the audit (agentguard/audit.h):
 * the 31 bundled real runs (every one parses; where each preset stops them;
 * the traps of shared/data/README.md; skipped, saying so, when ../shared is
 * not beside the project), the project's own runs in tests/fixtures/runs/
 * (the same rules, always run), and --all-stops. Each input format against
 * its neutral equivalent, bad inputs, a cut last line of JSON Lines (left
 * out, only when last and without its newline) and the summary are in
 * audit_formats.c; the replay rules (nudges, escalation, rejected replies,
 * replies without tool calls, time) in audit_replay.c; the shared helpers
 * in audit_fixture.h.
 * Core tests never sleep: time comes from the recordings.
 */
#include <unistd.h>

#include "audit_fixture.h"

#define TRAJ_DIR AG_SHARED_DIR "/data/trajectories"

/* ---- helpers ------------------------------------------------------------ */

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
