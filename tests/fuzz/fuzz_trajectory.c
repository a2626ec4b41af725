/*
 * tests/fuzz/fuzz_trajectory.c - libFuzzer target for the readers of
 * recorded runs (ag_trajectory_parse, src/audit/trajectory.c): neutral
 * trajectories, OpenAI chat transcripts (array, object, JSON Lines) and
 * agentguard event logs, and for their replay (ag_auditor_run). Built by
 * CMake with clang (AG_FUZZ); scripts/fuzz.sh runs it with
 * tests/fuzz/corpus/trajectory/ and tests/fuzz/trajectory.dict.
 *
 * Properties checked on every input:
 *  - the parser returns AG_OK with a trajectory, or one of its documented
 *    codes with no trajectory and a message;
 *  - a parsed trajectory holds audit.h's invariants: a detected format,
 *    turns with steps, totals that add up, results that answer the calls
 *    (rejected: one observation; no_reply: nothing), names and texts never
 *    NULL, every step timed when `timed`;
 *  - parsing again with the detected format forced gives the same shape
 *    (and leaves out the same cut last line, only ever one that does not
 *    end with a newline);
 *  - the replay through the default preset succeeds and reports the run's
 *    size, and a stop lies inside the run;
 *  - the reading from jansson's tree alone (ag__trajectory_parse_with,
 *    tape off) gives the same code and message, or the same run: the
 *    neutral format's tape reader (traj_tape.c) is the tree's equal.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agentguard.h"
#include "audit/internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static ag_auditor *auditor;

static void check(int ok, const char *what) {
  if (!ok) {
    fprintf(stderr, "fuzz_trajectory: property failed: %s\n", what);
    abort();
  }
}

static void check_shape(const ag_trajectory *t) {
  check(t->format != AG_TRAJ_AUTO && t->format <= AG_TRAJ_MESSAGES,
        "a detected format");
  check(t->outcome <= AG_RUN_UNRESOLVED, "outcome in range");
  /* a run with no steps is a run (not stopped); else turns hold them */
  check(t->n_turns == 0 ? t->n_steps == 0 && t->n_calls == 0 : t->turns != NULL,
        "turns, or none for an empty run");
  size_t steps = 0, calls = 0;
  for (size_t i = 0; i < t->n_turns; i++) {
    const ag_traj_turn *u = &t->turns[i];
    check(u->n_steps > 0 && u->steps != NULL, "no turn without steps");
    for (size_t j = 0; j < u->n_steps; j++) {
      const ag_traj_step *s = &u->steps[j];
      steps++;
      calls += s->n_calls;
      if (s->no_reply)
        check(s->n_calls == 0 && s->n_results == 0 && !s->rejected,
              "a no_reply step has no calls and no results");
      else if (s->rejected)
        check(s->n_results == 1, "a rejected step has one observation");
      else
        check(s->n_results == s->n_calls, "results answer the calls");
      for (size_t k = 0; k < s->n_calls; k++)
        check(s->calls[k].name != NULL &&
                  (s->calls[k].args != NULL || s->calls[k].args_len == 0),
              "call name and arguments");
      for (size_t k = 0; k < s->n_results; k++) {
        const ag_traj_result *r = &s->results[k];
        check(r->text != NULL, "result text never NULL");
        check(r->outcome <= AG_OUTCOME_SKIPPED, "result outcome in range");
        check(r->category <= AG_CAT__COUNT, "result category in range");
      }
      if (t->timed)
        check(s->t_request_ms >= 0, "a timed run has every request time");
    }
  }
  check(steps == t->n_steps, "n_steps is the total");
  check(calls == t->n_calls, "n_calls is the total");
}

static int same_bytes(const char *a, size_t al, const char *b, size_t bl) {
  return al == bl && (al == 0 || memcmp(a, b, al) == 0);
}

/* The tape's reading (t, rc, msg) against the tree's. */
static void check_tree(const uint8_t *data, size_t size, ag_err_t rc,
                       const char *msg, const ag_trajectory *t) {
  ag_trajectory *r = NULL;
  ag_error_t err;
  ag_err_t rr = ag__trajectory_parse_with(&r, (const char *)data, size, NULL,
                                          &err, false);
  check(rr == rc, "the tree path gives the same code");
  if (rc != AG_OK) {
    check(strcmp(err.msg, msg) == 0, "the tree path gives the same message");
    return;
  }
  check(r->format == t->format && r->outcome == t->outcome &&
            r->n_turns == t->n_turns && r->n_steps == t->n_steps &&
            r->n_calls == t->n_calls && r->timed == t->timed,
        "the tree path reads the same run");
  for (size_t i = 0; i < t->n_turns; i++)
    for (size_t j = 0; j < t->turns[i].n_steps; j++) {
      const ag_traj_step *a = &t->turns[i].steps[j], *b = &r->turns[i].steps[j];
      check(a->n_calls == b->n_calls && a->n_results == b->n_results &&
                a->tokens == b->tokens && a->t_request_ms == b->t_request_ms &&
                a->t_done_ms == b->t_done_ms && a->rejected == b->rejected,
            "the tree path reads the same steps");
      for (size_t k = 0; k < a->n_calls; k++)
        check(strcmp(a->calls[k].name, b->calls[k].name) == 0 &&
                  same_bytes(a->calls[k].args, a->calls[k].args_len,
                             b->calls[k].args, b->calls[k].args_len),
              "the tree path reads the same calls");
      for (size_t k = 0; k < a->n_results; k++)
        check(a->results[k].outcome == b->results[k].outcome &&
                  same_bytes(a->results[k].text, a->results[k].text_len,
                             b->results[k].text, b->results[k].text_len),
              "the tree path reads the same results");
    }
  ag_trajectory_free(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (auditor == NULL) {
    ag_config cfg;
    ag_config_init(&cfg);
    if (ag_auditor_new(&auditor, &cfg, NULL, NULL) != AG_OK)
      abort();
  }
  ag_trajectory *t = (ag_trajectory *)1;
  ag_error_t err;
  ag_err_t rc = ag_trajectory_parse(&t, (const char *)data, size, NULL, &err);
  check_tree(data, size, rc, err.msg, rc == AG_OK ? t : NULL);
  if (rc != AG_OK) {
    check(rc == AG_EJSON || rc == AG_EINVAL || rc == AG_ETOOBIG,
          "documented error code");
    check(t == NULL, "no trajectory on error");
    check(err.code == rc && err.msg[0] != '\0', "a message says why");
    return 0;
  }
  check(t != NULL, "a trajectory on success");
  check_shape(t);

  ag_traj_opts o;
  ag_traj_opts_init(&o);
  o.format = t->format;
  ag_trajectory *t2 = NULL;
  rc = ag_trajectory_parse(&t2, (const char *)data, size, &o, &err);
  if (rc != AG_OK)
    fprintf(stderr, "fuzz_trajectory: %s\n", err.msg);
  check(rc == AG_OK, "parses again with its format forced");
  check(t2->format == t->format && t2->n_turns == t->n_turns &&
            t2->n_steps == t->n_steps && t2->n_calls == t->n_calls &&
            t2->cut_line == t->cut_line,
        "the same shape with the format forced");
  check(t->cut_line >= 0 &&
            (t->cut_line == 0 || (size > 0 && data[size - 1] != '\n')),
        "only a last line without its newline is left out");
  ag_trajectory_free(t2);

  ag_audit_finding *f = malloc(sizeof *f);
  check(f != NULL, "malloc");
  rc = ag_auditor_run(auditor, t, f, &err);
  if (rc != AG_OK)
    fprintf(stderr, "fuzz_trajectory: %s\n", err.msg);
  check(rc == AG_OK, "the replay succeeds");
  check(f->turns == (int)t->n_turns && f->steps == (int)t->n_steps &&
            f->calls == (int)t->n_calls,
        "the finding reports the run's size");
  if (f->stop.stopped)
    check(f->stop.step >= 1 && (size_t)f->stop.step <= t->n_steps &&
              f->stop.turn >= 1 && (size_t)f->stop.turn <= t->n_turns &&
              f->stop.steps_after >= 0 &&
              (size_t)(f->stop.step + f->stop.steps_after) == t->n_steps,
          "the stop lies inside the run");
  free(f);
  ag_trajectory_free(t);
  return 0;
}
