/*
 * src/audit/audit.c - the audit: replays a recorded run (ag_trajectory)
 * through a guard and reports where it would have stopped, plus the summary
 * over many runs and both as JSON.
 *
 * Design. The replay drives the guard exactly as the live agent loop does:
 * ag_guard_begin_turn at each turn, ag_guard_begin_iteration before each
 * step (the model request), then ag_guard_run_batch for the step's calls,
 * the shared driver of src/agent/batch.c. Its run callback does not execute
 * anything: it copies the recorded results into the results of the calls the
 * guard let run. A call the guard held back with a nudge keeps the skipped
 * result the guard prefilled (live it would not have run, so later counters
 * see what the live loop would have seen); a call with invalid arguments
 * keeps the guard's validation error (live it never reaches the tool). A
 * harness-rejected reply and, with loop.require_tool_call, a reply without
 * a tool call are recorded as one error result with tool name "", as the
 * loop does for a reply without a tool call. The replay ends at the first
 * stop or escalation. Because the recording continues past that point, what
 * the model would have done after a nudge cannot be known: a nudge is only
 * counted (held_back), the recording goes on as it was.
 *
 * Time. The guard uses time only for the turn deadline. With timestamps
 * (every step has t_request_ms) they are passed as they are; without, time
 * stands still within each turn, so loop.max_turn_duration cannot trip on a
 * recording that cannot tell how long anything took.
 *
 * All stops. A mechanism's first stop depends on the others (a stop ends
 * the replay; a nudge changes what later counters see), so "every
 * mechanism's first stop" is defined as its stop when it is the only
 * mechanism on: one more guard per enabled mechanism, built from the config
 * with every other limit set to 0, each replaying the run once. Rejected:
 * one replay with escalations resumed (ag_guard_resume) after each trip - a
 * stop before execution would still drop the calls that the recording
 * shows as run, and the iteration cap and turn timeout never escalate.
 *
 * Memory. An auditor owns its guards and the scratch arrays of one batch
 * (grown to the largest step seen, never shrunk); ag_auditor_run allocates
 * nothing else. Threading: none; one auditor per thread.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "agentguard/audit.h"
#include "../core/internal.h"
#include "internal.h"

struct ag_auditor {
  ag_config cfg;
  ag_audit_opts opts;
  ag_guard *main;
  ag_guard *mech[AG_REASON__COUNT]; /* all_stops: one per enabled mechanism */
  ag__replay_scratch scratch;       /* for one batch */
};

AG_EXTERN void ag_audit_opts_init(ag_audit_opts *opts) {
  memset(opts, 0, sizeof(*opts));
  opts->all_stops = false;
  ag_guard_opts_init(&opts->guard);
}

/* Whether mechanism `r` can trip under `c`. */
static bool mechanism_on(const ag_config *c, ag_reason r) {
  return ag__mechanism_on(c, r);
}

/* `c` with every mechanism but `keep` turned off. */
static ag_config only(const ag_config *c, ag_reason keep) {
  ag_config o = *c;
  for (int r = 1; r < AG_REASON__COUNT; r++)
    if (r != (int)keep)
      ag__mechanism_off(&o, (ag_reason)r);
  return o;
}

AG_EXTERN void ag_auditor_free(ag_auditor *a) {
  if (a == NULL)
    return;
  ag_guard_free(a->main);
  for (int r = 0; r < AG_REASON__COUNT; r++)
    ag_guard_free(a->mech[r]);
  ag__replay_scratch_free(&a->scratch);
  free(a);
}

AG_EXTERN ag_err_t ag_auditor_new(ag_auditor **out, const ag_config *cfg,
                                  const ag_audit_opts *opts, ag_error_t *err) {
  if (out == NULL || cfg == NULL)
    return ag__set_error(err, AG_EINVAL, -1,
                         "ag_auditor_new: out and cfg must not be NULL");
  *out = NULL;
  ag_auditor *a = calloc(1, sizeof(*a));
  if (a == NULL)
    return ag__set_error(err, AG_ENOMEM, -1, "ag_auditor_new: out of memory");
  a->cfg = *cfg;
  if (opts != NULL)
    a->opts = *opts;
  else
    ag_audit_opts_init(&a->opts);
  ag_err_t rc = ag_guard_new(&a->main, cfg, &a->opts.guard, err);
  for (int r = 1; rc == AG_OK && a->opts.all_stops && r < AG_REASON__COUNT;
       r++) {
    if (!mechanism_on(cfg, (ag_reason)r))
      continue;
    ag_config c = only(cfg, (ag_reason)r);
    rc = ag_guard_new(&a->mech[r], &c, &a->opts.guard, err);
  }
  if (rc != AG_OK) {
    ag_auditor_free(a);
    return rc;
  }
  *out = a;
  return AG_OK;
}

AG_EXTERN const ag_config *ag_auditor_config(const ag_auditor *a) {
  return &a->cfg;
}

void ag__replay_scratch_free(ag__replay_scratch *s) {
  if (!s->lent) {
    free(s->calls);
    free(s->checks);
    free(s->results);
  }
  memset(s, 0, sizeof(*s));
}

/* Room for a batch of n calls; false when out of memory. */
static bool reserve(ag__replay_scratch *s, size_t n) {
  if (n <= s->cap)
    return true;
  if (s->lent) /* the caller's arrays: keep them, grow from nothing */
    *s = (ag__replay_scratch){0};
  size_t cap = s->cap ? s->cap : 8;
  while (cap < n)
    cap *= 2;
  ag_call *c = realloc(s->calls, cap * sizeof(*c));
  if (c != NULL)
    s->calls = c;
  ag_call_check *k = realloc(s->checks, cap * sizeof(*k));
  if (k != NULL)
    s->checks = k;
  ag_result *r = realloc(s->results, cap * sizeof(*r));
  if (r != NULL)
    s->results = r;
  if (c == NULL || k == NULL || r == NULL)
    return false;
  s->cap = cap;
  return true;
}

/* ---- the replay --------------------------------------------------------- */

typedef struct run_ctx {
  const ag_traj_step *step;
  int64_t done_ms;
  ag_category unjudged; /* the category of a result the recording leaves
                           unclassified (see category_for) */
} run_ctx;

/*
 * The category the replay passes for an error the recording did not
 * classify. The guard classifies a result whose category is AG_CAT__COUNT;
 * it uses the category for the error-pattern detector (mechanism 9), to
 * tell information from malfunctions (errors.counted_failures
 * "malfunctions"), and for the error context and escalation record, which
 * the audit never produces. So with both off the category cannot change a
 * verdict, and the replay passes AG_CAT_UNKNOWN instead of paying for the
 * classifier (about 70% of a replay's time on the bundled runs). test_audit
 * checks on every bundled run that the findings are the same either way.
 */
static ag_category category_for(const ag_config *c) {
  return c->errors.similar_error_limit > 0 ||
                 c->errors.counted_failures == AG_COUNT_MALFUNCTIONS
             ? AG_CAT__COUNT
             : AG_CAT_UNKNOWN;
}

/* The "execution" of a replayed batch: the recorded results of the calls
 * the guard allowed. Everything else keeps what ag_guard_run_batch
 * prefilled (held back: skipped; invalid arguments: validation error). */
static int64_t replay_run(void *user, const ag_call *calls,
                          const ag_call_check *checks, size_t n,
                          ag_result *results) {
  (void)calls;
  const run_ctx *c = user;
  for (size_t i = 0; i < n && i < c->step->n_results; i++) {
    if (checks[i].action != AG_ALLOW || !checks[i].valid)
      continue;
    const ag_traj_result *r = &c->step->results[i];
    results[i].outcome = r->outcome;
    results[i].text = r->text != NULL ? r->text : "";
    results[i].text_len = r->text != NULL ? r->text_len : 0;
    results[i].category =
        r->category < AG_CAT__COUNT ? r->category : c->unjudged;
  }
  return c->done_ms;
}

static void set_stop(ag_audit_stop *s, const ag_verdict *v, int step, int turn,
                     int step_in_turn, int total) {
  s->stopped = true;
  s->action = v->action;
  s->reason = v->reason;
  s->step = step;
  s->turn = turn;
  s->step_in_turn = step_in_turn;
  s->call_index = v->call_index;
  s->steps_after = total - step;
  ag__scopy(s->tool, sizeof(s->tool), v->tool);
  ag__scopy(s->message, sizeof(s->message), v->message);
}

/* One replay of `t` through `g`; fills *stop, adds nudged calls to *held
 * (may be NULL). */
static ag_err_t replay(ag_auditor *a, ag_guard *g, const ag_trajectory *t,
                       ag_audit_stop *stop, int *held, ag_error_t *err) {
  memset(stop, 0, sizeof(*stop));
  stop->call_index = -1;
  int global = 0, total = (int)t->n_steps;
  for (size_t ti = 0; ti < t->n_turns; ti++) {
    const ag_traj_turn *turn = &t->turns[ti];
    int64_t t0 = 0;
    if (t->timed)
      t0 = turn->t_start_ms >= 0 ? turn->t_start_ms
           : turn->n_steps > 0   ? turn->steps[0].t_request_ms
                                 : 0;
    ag_guard_begin_turn(g, t0);
    for (size_t si = 0; si < turn->n_steps; si++) {
      const ag_traj_step *st = &turn->steps[si];
      global++;
      int64_t t_req = t0, t_resp = t0, t_done = t0;
      if (t->timed) {
        t_req = st->t_request_ms;
        t_resp = st->t_response_ms >= t_req ? st->t_response_ms : t_req;
        t_done = st->t_done_ms >= t_resp ? st->t_done_ms : t_resp;
      }
      ag_verdict v;
      int act =
          ag__replay_step(g, st, t_req, t_resp, t_done, &a->scratch, &v, held);
      if (act < 0)
        return ag__set_error(err, AG_ENOMEM, -1,
                             "ag_auditor_run: out of memory for a step of "
                             "%zu calls",
                             st->n_calls);
      if (ag__stops((ag_action)act)) {
        set_stop(stop, &v, global, (int)ti + 1, (int)si + 1, total);
        return AG_OK;
      }
    }
  }
  return AG_OK;
}

int ag__replay_step(ag_guard *g, const ag_traj_step *st, int64_t t_req,
                    int64_t t_resp, int64_t t_done, ag__replay_scratch *s,
                    ag_verdict *v, int *nudged) {
  const ag_config *cfg = ag_guard_config(g);
  ag_action act = ag_guard_begin_iteration(g, t_req, v);
  if (act == AG_ALLOW && st->tokens > 0) /* the reply's usage */
    ag_guard_record_tokens(g, st->tokens);
  if (act == AG_ALLOW && st->text != NULL && st->text_len > 0)
    act = ag_guard_check_text(g, st->text, st->text_len, false, v);
  if (act != AG_ALLOW || (st->no_reply && !st->rejected))
    return (int)act; /* no reply: only the iteration counted */
  if (!st->rejected && st->n_calls == 0 && st->text != NULL &&
      st->text_len == 0) /* an empty reply: asked again, or stopped */
    return (int)ag_guard_record_empty(g, t_done, v);
  if (st->rejected) { /* refused (mechanism 12): no tool's error */
    bool has = st->n_results > 0 && st->results[0].text != NULL;
    return (int)ag_guard_record_refused(g, has ? st->results[0].text : "",
                                        has ? st->results[0].text_len : 0,
                                        t_done, v);
  }
  if (st->n_calls == 0) /* an answer, unless a call is required */
    return cfg->loop.require_tool_call
               ? (int)ag_guard_record_refused(g, AG__NO_TOOL_CALL_TEXT,
                                              sizeof(AG__NO_TOOL_CALL_TEXT) - 1,
                                              t_done, v)
               : (int)AG_ALLOW;
  if (!reserve(s, st->n_calls))
    return -1;
  for (size_t k = 0; k < st->n_calls; k++) {
    s->calls[k].name = st->calls[k].name != NULL ? st->calls[k].name : "";
    s->calls[k].args = st->calls[k].args;
    s->calls[k].args_len = st->calls[k].args_len;
  }
  run_ctx ctx = {st, t_done, category_for(cfg)};
  bool ran = false;
  act = ag_guard_run_batch(g, s->calls, st->n_calls, t_resp, replay_run, &ctx,
                           s->checks, s->results, v, &ran);
  for (size_t k = 0; ran && nudged != NULL && k < st->n_calls; k++)
    if (s->checks[k].action == AG_NUDGE)
      (*nudged)++;
  return (int)act;
}

int ag__replay_untimed(ag_guard *g, const ag_trajectory *t, ag_verdict *v) {
  /* a proxy's request replays its turn once: batches of up to 8 calls on
   * the stack, no allocation */
  ag_call calls[8];
  ag_call_check checks[8];
  ag_result results[8];
  ag__replay_scratch s = {8, calls, checks, results, true};
  memset(v, 0, sizeof(*v));
  v->call_index = -1;
  int act = AG_ALLOW;
  for (size_t ti = 0; ti < t->n_turns && act >= 0; ti++) {
    const ag_traj_turn *turn = &t->turns[ti];
    ag_guard_begin_turn(g, 0);
    act = AG_ALLOW;
    for (size_t si = 0;
         si < turn->n_steps && act >= 0 && !ag__stops((ag_action)act); si++)
      act = ag__replay_step(g, &turn->steps[si], 0, 0, 0, &s, v, NULL);
  }
  ag__replay_scratch_free(&s);
  return act;
}

static ag_err_t check_trajectory(const ag_trajectory *t, ag_error_t *err) {
  if (t->n_turns > 0 && t->turns == NULL)
    return ag__set_error(err, AG_EINVAL, -1,
                         "ag_auditor_run: turns is NULL but n_turns > 0");
  size_t steps = 0;
  for (size_t ti = 0; ti < t->n_turns; ti++) {
    const ag_traj_turn *turn = &t->turns[ti];
    if (turn->n_steps > 0 && turn->steps == NULL)
      return ag__set_error(err, AG_EINVAL, -1,
                           "ag_auditor_run: turn %zu has no steps array",
                           ti + 1);
    for (size_t si = 0; si < turn->n_steps; si++) {
      const ag_traj_step *s = &turn->steps[si];
      steps++;
      if ((s->n_calls > 0 && s->calls == NULL) ||
          (s->n_results > 0 && s->results == NULL))
        return ag__set_error(err, AG_EINVAL, -1,
                             "ag_auditor_run: step %zu has a NULL array",
                             steps);
      if (!s->rejected && s->n_results != s->n_calls)
        return ag__set_error(err, AG_EINVAL, -1,
                             "ag_auditor_run: step %zu has %zu calls but %zu "
                             "results",
                             steps, s->n_calls, s->n_results);
    }
  }
  if (steps != t->n_steps || steps > (size_t)0x7fffffff)
    return ag__set_error(err, AG_EINVAL, -1,
                         "ag_auditor_run: n_steps is %zu but the turns hold "
                         "%zu steps",
                         t->n_steps, steps);
  return AG_OK;
}

AG_EXTERN ag_err_t ag_auditor_run(ag_auditor *a, const ag_trajectory *t,
                                  ag_audit_finding *out, ag_error_t *err) {
  if (a == NULL || t == NULL || out == NULL)
    return ag__set_error(err, AG_EINVAL, -1, "ag_auditor_run: NULL argument");
  memset(out, 0, sizeof(*out));
  ag_err_t rc = check_trajectory(t, err);
  if (rc != AG_OK)
    return rc;
  out->turns = (int)t->n_turns;
  out->steps = (int)t->n_steps;
  out->calls = t->n_calls > (size_t)0x7fffffff ? 0x7fffffff : (int)t->n_calls;
  if ((rc = replay(a, a->main, t, &out->stop, &out->held_back, err)) != AG_OK)
    return rc;
  if (!a->opts.all_stops)
    return AG_OK;
  out->all_stops = true;
  for (int r = 1; r < AG_REASON__COUNT; r++) {
    if (a->mech[r] == NULL)
      continue;
    out->mechanism_on[r] = true;
    rc = replay(a, a->mech[r], t, &out->by_mechanism[r], NULL, err);
    if (rc != AG_OK)
      return rc;
  }
  return AG_OK;
}

/* ---- summary ------------------------------------------------------------ */

AG_EXTERN void ag_audit_summary_init(ag_audit_summary *s) {
  memset(s, 0, sizeof(*s));
}

static int outcome_index(ag_run_outcome o) {
  return (int)o >= 0 && (int)o < AG_RUN_OUTCOME_COUNT ? (int)o : 0;
}

AG_EXTERN void ag_audit_summary_add(ag_audit_summary *s, const ag_trajectory *t,
                                    const ag_audit_finding *f) {
  int o = outcome_index(t != NULL ? t->outcome : AG_RUN_UNKNOWN);
  s->runs++;
  s->runs_by_outcome[o]++;
  s->steps_by_outcome[o] += f->steps;
  s->held_back += f->held_back;
  if (f->stop.stopped) {
    s->stopped_by_outcome[o]++;
    s->saved_by_outcome[o] += f->stop.steps_after;
    if ((int)f->stop.reason > 0 && f->stop.reason < AG_REASON__COUNT)
      s->stops_by_reason[f->stop.reason]++;
    if (f->stop.action == AG_ESCALATE)
      s->escalations++;
  }
  if (f->all_stops) {
    s->all_stops = true;
    for (int r = 1; r < AG_REASON__COUNT; r++) {
      if (!f->mechanism_on[r])
        continue;
      s->mechanism_on[r] = true;
      if (f->by_mechanism[r].stopped)
        s->mechanism_stops[r]++;
    }
  }
}

AG_EXTERN void ag_audit_summary_add_skipped(ag_audit_summary *s) {
  s->skipped++;
}

AG_EXTERN double ag_audit_summary_saved_share(const ag_audit_summary *s,
                                              ag_run_outcome o) {
  int i = outcome_index(o);
  return s->steps_by_outcome[i] > 0
             ? (double)s->saved_by_outcome[i] / (double)s->steps_by_outcome[i]
             : 0.0;
}

/* ---- JSON --------------------------------------------------------------- */

/* A JSON string for text that should be UTF-8 but might not be (a verdict
 * cut mid-way, a hand-built trajectory): invalid bytes become '?'. */
static json_t *jstr(const char *s) {
  if (s == NULL)
    return json_null();
  json_t *j = json_string(s);
  if (j != NULL)
    return j;
  size_t n = strlen(s);
  char *c = malloc(n + 1);
  if (c == NULL)
    return NULL;
  for (size_t i = 0; i < n; i++)
    c[i] = (unsigned char)s[i] < 0x80 ? s[i] : '?';
  c[n] = '\0';
  j = json_string(c);
  free(c);
  return j;
}

static const char *action_name(ag_action a) {
  return a == AG_ESCALATE ? "escalate" : "stop";
}

/* json_object_set_new, true when it worked (it steals `v`, also NULL). */
static bool put(json_t *o, const char *key, json_t *v) {
  return json_object_set_new(o, key, v) == 0;
}

static json_t *stop_json(const ag_audit_stop *s) {
  if (!s->stopped)
    return json_null();
  json_t *o = json_object();
  if (o == NULL)
    return NULL;
  bool ok = true;
  ok &= put(o, "step", json_integer(s->step));
  ok &= put(o, "turn", json_integer(s->turn));
  ok &= put(o, "step_in_turn", json_integer(s->step_in_turn));
  ok &= put(o, "action", json_string(action_name(s->action)));
  ok &= put(o, "reason", json_string(ag_reason_name(s->reason)));
  ok &= put(o, "call_index", json_integer(s->call_index));
  ok &= put(o, "tool", jstr(s->tool));
  ok &= put(o, "message", jstr(s->message));
  ok &= put(o, "steps_after", json_integer(s->steps_after));
  if (!ok) {
    json_decref(o);
    return NULL;
  }
  return o;
}

/* Reports built with `ok` false (a value or key that could not be made)
 * are out of memory, never a report with a member missing. */
static ag_err_t dump(json_t *o, bool ok, char **out, ag_error_t *err) {
  *out = NULL;
  if (o == NULL || !ok) {
    json_decref(o);
    return ag__set_error(err, AG_ENOMEM, -1, "out of memory");
  }
  *out = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(6));
  json_decref(o);
  if (*out == NULL)
    return ag__set_error(err, AG_ENOMEM, -1, "out of memory");
  return AG_OK;
}

AG_EXTERN ag_err_t ag_audit_finding_json(const char *file, const char *preset,
                                         const ag_trajectory *t,
                                         const ag_audit_finding *f, char **out,
                                         ag_error_t *err) {
  if (t == NULL || f == NULL || out == NULL)
    return ag__set_error(err, AG_EINVAL, -1,
                         "ag_audit_finding_json: NULL argument");
  bool ok = true;
  json_t *o = json_object();
  if (o != NULL) {
    ok &= put(o, "type", json_string("run"));
    if (file != NULL)
      ok &= put(o, "file", jstr(file));
    if (preset != NULL)
      ok &= put(o, "preset", jstr(preset));
    ok &= put(o, "format", json_string(ag_traj_format_name(t->format)));
    ok &= put(o, "source", jstr(t->source));
    ok &= put(o, "outcome", json_string(ag_run_outcome_name(t->outcome)));
    ok &= put(o, "turns", json_integer(f->turns));
    ok &= put(o, "steps", json_integer(f->steps));
    ok &= put(o, "calls", json_integer(f->calls));
    ok &= put(o, "timed", json_boolean(t->timed));
    ok &= put(o, "held_back", json_integer(f->held_back));
    ok &= put(o, "stopped", json_boolean(f->stop.stopped));
    ok &= put(o, "stop", stop_json(&f->stop));
    if (f->all_stops) {
      json_t *all = json_object();
      for (int r = 1; all != NULL && r < AG_REASON__COUNT; r++)
        if (f->mechanism_on[r])
          ok &= put(all, ag_reason_name((ag_reason)r),
                    stop_json(&f->by_mechanism[r]));
      ok &= put(o, "all_stops", all);
    }
  }
  return dump(o, ok, out, err);
}

AG_EXTERN ag_err_t ag_audit_summary_json(const char *preset,
                                         const ag_audit_summary *s, char **out,
                                         ag_error_t *err) {
  if (s == NULL || out == NULL)
    return ag__set_error(err, AG_EINVAL, -1,
                         "ag_audit_summary_json: NULL argument");
  bool ok = true;
  json_t *o = json_object();
  if (o != NULL) {
    ok &= put(o, "type", json_string("summary"));
    if (preset != NULL)
      ok &= put(o, "preset", jstr(preset));
    ok &= put(o, "runs", json_integer(s->runs));
    ok &= put(o, "skipped", json_integer(s->skipped));
    int stopped = 0;
    long steps = 0, saved = 0;
    json_t *by = json_object();
    static const ag_run_outcome order[] = {AG_RUN_RESOLVED, AG_RUN_UNRESOLVED,
                                           AG_RUN_UNKNOWN};
    for (size_t k = 0; by != NULL && k < 3; k++) {
      int i = (int)order[k];
      json_t *e = json_object();
      if (e == NULL) {
        ok = false;
        continue;
      }
      ok &= put(e, "runs", json_integer(s->runs_by_outcome[i]));
      ok &= put(e, "stopped", json_integer(s->stopped_by_outcome[i]));
      ok &= put(e, "steps", json_integer(s->steps_by_outcome[i]));
      ok &= put(e, "saved_steps", json_integer(s->saved_by_outcome[i]));
      ok &= put(e, "saved_share",
                json_real(ag_audit_summary_saved_share(s, order[k])));
      ok &= put(by, ag_run_outcome_name(order[k]), e);
      stopped += s->stopped_by_outcome[i];
      steps += s->steps_by_outcome[i];
      saved += s->saved_by_outcome[i];
    }
    ok &= put(o, "stopped", json_integer(stopped));
    ok &= put(o, "steps", json_integer(steps));
    ok &= put(o, "saved_steps", json_integer(saved));
    ok &= put(o, "by_outcome", by);
    ok &= put(o, "saved_share_unresolved",
              json_real(ag_audit_summary_saved_share(s, AG_RUN_UNRESOLVED)));
    json_t *reasons = json_object();
    for (int r = 1; reasons != NULL && r < AG_REASON__COUNT; r++)
      if (s->stops_by_reason[r] > 0)
        ok &= put(reasons, ag_reason_name((ag_reason)r),
                  json_integer(s->stops_by_reason[r]));
    ok &= put(o, "stops_by_reason", reasons);
    ok &= put(o, "escalations", json_integer(s->escalations));
    ok &= put(o, "held_back", json_integer(s->held_back));
    if (s->all_stops) {
      json_t *m = json_object();
      for (int r = 1; m != NULL && r < AG_REASON__COUNT; r++)
        if (s->mechanism_on[r])
          ok &= put(m, ag_reason_name((ag_reason)r),
                    json_integer(s->mechanism_stops[r]));
      ok &= put(o, "mechanism_stops", m);
    }
  }
  return dump(o, ok, out, err);
}
