/*
 * src/core/guard_check.c - the checks before execution: mechanisms 2 (calls
 * per turn), 3 (identical calls, scope "call") and 4 (cycles), the held
 * call of mechanism 5's nudge, and ag_guard_run_batch around them.
 * The state and the design are in guard_state.h and guard.c.
 */
#include <stdio.h>
#include <string.h>

#include "guard_state.h"

/* ------------------------------------------------------------------------ */
/* Mechanisms 2, 3, 4: before execution                                     */
/* ------------------------------------------------------------------------ */

/* Appends a call to the cycle detector; returns the block length that now
 * repeats cycle_limit times back to back, or 0. */
int ag__guard_cycle_push(ag_guard *g, bool valid, const uint8_t *sig) {
  int L = g->cyc_len;
  if (L < 1)
    return 0;
  for (int p = 1; p <= L; p++) {
    bool eq = false;
    if (valid && g->cyc_n >= (uint64_t)p) {
      int idx = (int)((g->cyc_n - (uint64_t)p) % (uint64_t)L);
      eq = g->cyc_valid[idx] && memcmp(g->cyc_sig[idx], sig, AG_SIG_LEN) == 0;
    }
    g->cyc_run[p] = eq ? g->cyc_run[p] + 1 : 0;
  }
  int idx = (int)(g->cyc_n % (uint64_t)L);
  g->cyc_valid[idx] = valid;
  if (valid)
    memcpy(g->cyc_sig[idx], sig, AG_SIG_LEN);
  g->cyc_n++;
  int N = g->cfg.loop.cycle_limit;
  if (N < 2)
    return 0; /* a block seen once is no cycle */
  for (int p = 2; p <= L; p++) {
    if (g->cyc_run[p] >= p * (N - 1) && g->cyc_run[1] < p * N - 1)
      return p;
  }
  return 0;
}

/* With nudge_before_stop, the first trip in a turn of any loop mechanism
 * (3, 4, 5, 16) nudges; the next trip of any of them stops (Gemini CLI's two
 * strikes, counted across the mechanisms). */
bool ag__guard_nudge_first(ag_guard *g) {
  if (!g->cfg.loop.nudge_before_stop || g->nudged)
    return false;
  g->nudged = true;
  return true;
}

/* Gives every call of the batch its check: a signature, or why it has none
 * (past opts.max_batch, arguments that are not JSON). Done for the whole
 * batch even when it stops, so callers can report each call. */
/* Remembers a call of the batch (its tool t) that changes the world, by
 * signature, for when its result comes (record_one). */
static void note_changing(ag_guard *g, tool_state *t, const ag_call *call,
                          const ag_call_check *c) {
  if (t->kind == AG__TOOL_UNSEEN)
    t->kind = ag__tool_kind_of(t->name, t->name_len);
  size_t len = call->args != NULL ? call->args_len : 0;
  /* empty arguments ("{}") leave no tape */
  const ag__jcs *tape = call == g->tape_call && len > 0 ? g->jcs : NULL;
  if (!ag__args_change_state(t->kind, call->args != NULL ? call->args : "", len,
                             tape))
    return;
  if (g->n_changing == CHANGING_MAX)
    g->changing_all = true;
  else
    memcpy(g->changing[g->n_changing++], c->sig, REPEAT_KEY);
}

/* Whether a call of the batch, by signature, changes the world. */
bool ag__guard_is_changing(const ag_guard *g, const uint8_t *sig) {
  if (g->changing_all)
    return true;
  for (int i = 0; i < g->n_changing; i++)
    if (memcmp(g->changing[i], sig, REPEAT_KEY) == 0)
      return true;
  return false;
}

static void sign_calls(ag_guard *g, const ag_call *calls, size_t n,
                       ag_call_check *checks) {
  g->tape_call = NULL;
  for (size_t i = 0; i < n; i++) {
    ag_call_check *c = &checks[i];
    c->action = AG_ALLOW;
    c->reason = AG_REASON_NONE;
    c->message[0] = '\0';
    c->invalid_code = AG_OK;
    c->invalid_pos = -1;
    if (i >= (size_t)g->opts.max_batch) {
      c->valid = false;
      c->invalid_code = AG_ETOOBIG;
      snprintf(c->message, sizeof(c->message),
               "more than %d tool calls in one reply; this one was not run",
               g->opts.max_batch);
      continue;
    }
    const char *name = calls[i].name != NULL ? calls[i].name : "";
    ag_error_t e;
    ag_err_t rc = ag__jcs_signature(
        g->jcs, name, strlen(name), calls[i].args,
        calls[i].args != NULL ? calls[i].args_len : 0, c->sig, &e);
    c->valid = rc == AG_OK;
    g->tape_call = c->valid ? &calls[i] : NULL;
    if (!c->valid) {
      c->invalid_code = rc;
      c->invalid_pos = e.pos;
      snprintf(c->message, sizeof(c->message), "invalid arguments: %.*s",
               INVALID_ARGS_WIDTH, e.msg);
    }
  }
}

/* What one of the checks before execution decided for a call. */
typedef enum {
  CHECK_PASS, /* on to the next check */
  CHECK_HELD, /* held back by an armed nudge; the batch goes on */
  CHECK_NUDGE,
  CHECK_TRIP
} check_step;

/* 2: the per-turn call cap; a call that passes is counted. */
static check_step check_call_cap(ag_guard *g, ag_call_check *c, ag_verdict *v) {
  int cap = g->cfg.loop.max_calls_per_turn;
  if (cap > 0 && g->calls_in_turn >= cap) {
    c->action = ag__guard_trip_action(g);
    c->reason = AG_REASON_MAX_CALLS_PER_TURN;
    snprintf(c->message, sizeof(c->message),
             "Maximum function call depth exceeded: more than %d tool calls "
             "in one turn",
             cap);
    v->suggestion = "Finish with what is known, or ask the user to "
                    "continue in a new message.";
    return CHECK_TRIP;
  }
  g->calls_in_turn++;
  return CHECK_PASS;
}

/* 5's nudge: the call after an identical error's trip, if it is the same
 * call again, is held back once. */
static check_step check_held(ag_guard *g, ag_call_check *c) {
  if (!g->hold_armed || !c->valid ||
      memcmp(c->sig, g->hold_sig, AG_SIG_LEN) != 0)
    return CHECK_PASS;
  g->hold_armed = false;
  c->action = AG_NUDGE;
  c->reason = AG_REASON_IDENTICAL_ERRORS;
  memcpy(c->message, g->hold_msg, sizeof(c->message));
  return CHECK_HELD;
}

/* 3: the identical-call breaker in scope "call". */
static check_step check_identical(ag_guard *g, const ag_call *call,
                                  const char *name, ag_call_check *c,
                                  bool cycles_now, ag_verdict *v) {
  const ag_config *cfg = &g->cfg;
  tool_state *t = ag__guard_tool_get(g, name);
  if (!c->valid) {
    t->has_sig = false;
    t->run = 0;
    return CHECK_PASS;
  }
  note_changing(g, t, call, c);
  if (cfg->loop.identical_call_scope != AG_SCOPE_CALL)
    return CHECK_PASS;
  if (t->has_sig && t->run_iter >= g->iteration - 1 &&
      memcmp(t->sig, c->sig, AG_SIG_LEN) == 0)
    t->run++;
  else
    t->run = 1;
  t->has_sig = true;
  memcpy(t->sig, c->sig, AG_SIG_LEN);
  t->run_iter = g->iteration;
  int lim = cfg->loop.identical_call_limit;
  if (lim <= 0 || t->run < lim)
    return CHECK_PASS;
  c->reason = AG_REASON_IDENTICAL_CALLS;
  snprintf(c->message, sizeof(c->message),
           "%s was called %d times in a row with the same arguments", name,
           t->run);
  v->suggestion = ag__guard_suggestion(AG_REASON_IDENTICAL_CALLS);
  if (ag__guard_nudge_first(g)) {
    if (cycles_now) /* the detector keeps its count */
      ag__guard_cycle_push(g, c->valid, c->sig);
    return CHECK_NUDGE;
  }
  c->action = ag__guard_trip_action(g);
  return CHECK_TRIP;
}

/* 4: the cycle detector, in scope "call" (in call_and_result scope a
 * repetition is judged on results too: record_results runs it). */
static check_step check_cycle(ag_guard *g, const char *name, ag_call_check *c,
                              bool cycles_now, ag_verdict *v) {
  int p = cycles_now ? ag__guard_cycle_push(g, c->valid, c->sig) : 0;
  if (p <= 0 || g->cfg.loop.cycle_limit <= 0)
    return CHECK_PASS;
  c->reason = AG_REASON_CYCLIC_CALLS;
  snprintf(c->message, sizeof(c->message),
           "A sequence of %d calls ending with %s repeated %d times in a "
           "row",
           p, name, g->cfg.loop.cycle_limit);
  v->suggestion = ag__guard_suggestion(AG_REASON_CYCLIC_CALLS);
  if (ag__guard_nudge_first(g))
    return CHECK_NUDGE;
  c->action = ag__guard_trip_action(g);
  return CHECK_TRIP;
}

/* Turns a call's trip message into its nudge: the call is held back and
 * told why; the batch goes on. */
static void nudge_call(ag_call_check *c, ag_verdict *v) {
  char tmp[AG_VERDICT_MSG_MAX];
  memcpy(tmp, c->message, sizeof(tmp));
  c->action = AG_NUDGE;
  snprintf(c->message, sizeof(c->message),
           "Potential loop detected: %.*s. This call was not run. %s",
           LOOP_CAUSE_WIDTH, tmp, v->suggestion);
  v->suggestion = NULL;
}

/* The batch's verdict from call i's trip. */
static ag_action trip_call(ag_guard *g, const ag_call_check *c, size_t i,
                           const char *name, ag_verdict *v) {
  v->action = c->action;
  v->reason = c->reason;
  v->call_index = (int)i;
  ag__scopy(v->tool, sizeof(v->tool), name);
  memcpy(v->message, c->message, sizeof(v->message));
  g->last_trip = v->reason;
  g->trips++;
  return v->action;
}

AG_EXTERN ag_action ag_guard_check_calls(ag_guard *g, const ag_call *calls,
                                         size_t n, int64_t now_ms,
                                         ag_call_check *checks, ag_verdict *v) {
  ag__guard_verdict_reset(v);
  sign_calls(g, calls, n, checks);
  g->n_changing = 0;
  g->changing_all = false;
  if (ag__guard_past_deadline(g, now_ms, v))
    return v->action;
  if (n > 0)
    g->empty_run = 0;

  const bool cycles_now = g->cfg.loop.identical_call_scope == AG_SCOPE_CALL;
  size_t checked =
      n < (size_t)g->opts.max_batch ? n : (size_t)g->opts.max_batch;
  for (size_t i = 0; i < checked; i++) {
    ag_call_check *c = &checks[i];
    const char *name = calls[i].name != NULL ? calls[i].name : "";
    check_step s = check_call_cap(g, c, v);
    if (s == CHECK_PASS)
      s = check_held(g, c);
    if (s == CHECK_PASS)
      s = check_identical(g, &calls[i], name, c, cycles_now, v);
    if (s == CHECK_PASS)
      s = check_cycle(g, name, c, cycles_now, v);
    if (s == CHECK_NUDGE)
      nudge_call(c, v);
    else if (s == CHECK_TRIP)
      return trip_call(g, c, i, name, v);
  }
  return v->action;
}

AG_EXTERN ag_action ag_guard_run_batch(ag_guard *g, const ag_call *calls,
                                       size_t n, int64_t now_ms, ag_run_fn run,
                                       void *user, ag_call_check *checks,
                                       ag_result *results, ag_verdict *v,
                                       bool *ran) {
  if (ran != NULL)
    *ran = false;
  ag_action a = ag_guard_check_calls(g, calls, n, now_ms, checks, v);
  if (a != AG_ALLOW)
    return a;
  for (size_t i = 0; i < n; i++) {
    ag_result *r = &results[i];
    r->name = calls[i].name != NULL ? calls[i].name : "";
    r->sig = checks[i].valid ? checks[i].sig : NULL;
    r->category = AG_CAT__COUNT;
    if (checks[i].action == AG_NUDGE) {
      r->outcome = AG_OUTCOME_SKIPPED;
      r->text = checks[i].message;
    } else if (!checks[i].valid) {
      r->outcome = AG_OUTCOME_ERROR;
      r->category = AG_CAT_VALIDATION;
      r->text = checks[i].message;
    } else {
      r->outcome = AG_OUTCOME_OK;
      r->text = "";
    }
    r->text_len = strlen(r->text);
  }
  int64_t after = now_ms;
  if (run != NULL) {
    after = run(user, calls, checks, n, results);
    if (ran != NULL)
      *ran = true;
  }
  return ag_guard_record_results(g, results, n, after, v);
}
