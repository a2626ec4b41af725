/*
 * src/audit/traj_events.c - the reader of agentguard's own event logs
 * (JSON Lines, DESIGN.md section 5): turns, requests, calls and results
 * put back together by turn, iteration and call id.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "builder.h"

/* ------------------------------------------------------------------------ */
/* agentguard event logs                                                    */
/* ------------------------------------------------------------------------ */

static int ev_int(const json_t *e, const char *key) {
  const json_t *v = json_object_get(e, key);
  if (!json_is_number(v))
    return -1;
  double d = json_number_value(v);
  return d >= 0 && d < 2147483647.0 ? (int)d : -1;
}

/* The current step for an event of `iteration`, opened when needed. */
static ag_err_t ev_step(builder *b, int iteration, bool fresh) {
  bstep *s = ag__tb_cur_step(b);
  bool same_turn =
      b->n_turns > 0 && !b->new_turn && b->turns[b->n_turns - 1].n_steps > 0;
  if (!fresh && s != NULL && same_turn && s->iteration == iteration)
    return AG_OK;
  return ag__tb_step(b, iteration);
}

/* The call of the current turn whose call_id is `id`, searching the newest
 * steps first; SIZE_MAX when none. */
static size_t ev_find(builder *b, const char *id) {
  if (id == NULL || b->n_turns == 0)
    return SIZE_MAX;
  const bturn *t = &b->turns[b->n_turns - 1];
  for (size_t si = t->step0 + t->n_steps; si-- > t->step0;) {
    const bstep *s = &b->steps[si];
    for (size_t k = 0; k < s->n_calls; k++) {
      const char *cid = b->ids[s->call0 + k];
      if (cid != NULL && strcmp(cid, id) == 0)
        return s->call0 + k;
    }
  }
  return SIZE_MAX;
}

static ag_traj_result *ev_result_of(builder *b, size_t ci) {
  /* Event steps always give every call its result slot, in order. */
  for (size_t si = b->n_steps; si-- > 0;) {
    const bstep *s = &b->steps[si];
    if (ci >= s->call0 && ci < s->call0 + s->n_calls)
      return &b->results[s->res0 + (ci - s->call0)];
  }
  return NULL;
}

/* A model request that never got a reply (the request failed: model_error,
 * or the turn was cancelled while waiting) stays a step, marked no_reply:
 * live it counted as an iteration, but the model said nothing to judge. */
static void ev_close(builder *b) {
  bstep *s = ag__tb_cur_step(b);
  if (s != NULL && !s->has_response && s->n_calls == 0)
    s->no_reply = true;
}

/*
 * A turn stopped at the iteration cap of N: live, the guard refused request
 * N+1. With loop.final_request_without_tools the loop then made that
 * request without tools (the wrap-up), so it is in the log as step N+1;
 * without it, the log holds only N steps, and the refused request is added
 * here as a no_reply step so that the replay asks the guard about it too.
 * Which case it was: turn_end's message names the cap ("Reached the maximum
 * of N iterations ...", the guard's text), so iterations == N means no
 * wrap-up. A message without the number falls back to the log's shape: a
 * last step whose calls ran was a normal step, not a wrap-up.
 */
static ag_err_t ev_turn_end(builder *b, const json_t *e, int64_t t) {
  ev_close(b);
  const char *status = json_string_value(json_object_get(e, "status"));
  const char *reason = json_string_value(json_object_get(e, "reason"));
  int iterations = ev_int(e, "iterations");
  if (status == NULL || reason == NULL || strcmp(status, "stopped") != 0 ||
      b->n_turns == 0 || b->new_turn || iterations < 1)
    return AG_OK;
  const bturn *turn = &b->turns[b->n_turns - 1];
  if ((size_t)iterations != turn->n_steps)
    return AG_OK;
  /* The token budget (mechanism 11) refuses the next request the same way,
   * and never makes a wrap-up request. */
  bool refused_missing = strcmp(reason, "token_budget") == 0;
  if (!refused_missing && strcmp(reason, "max_iterations") != 0)
    return AG_OK;
  const char *msg = json_string_value(json_object_get(e, "message"));
  const char *num = msg != NULL ? strstr(msg, "maximum of ") : NULL;
  long cap = num != NULL ? strtol(num + 11, NULL, 10) : -1;
  if (refused_missing) {
    /* token_budget */
  } else if (cap > 0) {
    refused_missing = cap == iterations;
  } else {
    const bstep *last = ag__tb_cur_step(b);
    refused_missing = false;
    for (size_t k = 0; last != NULL && k < last->n_calls; k++)
      if (b->answered[last->res0 + k] &&
          b->results[last->res0 + k].outcome != AG_OUTCOME_SKIPPED)
        refused_missing = true;
  }
  if (!refused_missing)
    return AG_OK;
  ag_err_t rc = ag__tb_step(b, iterations + 1);
  if (rc != AG_OK)
    return rc;
  bstep *s = ag__tb_cur_step(b);
  s->no_reply = true;
  s->t_req = s->t_resp = s->t_done = t;
  return AG_OK;
}

ag_err_t ag__tb_parse_events(builder *b, const json_t *evs, const long *lines) {
  ag_err_t rc;
  b->unit = "event";
  for (size_t i = 0; i < json_array_size(evs); i++) {
    const json_t *e = json_array_get(evs, i);
    b->unit_no = i + 1;
    b->line = lines != NULL ? lines[i] : 0;
    if (!json_is_object(e))
      return ag__tb_fail(b, AG_EINVAL, "an event must be an object, got %s",
                         ag__json_kind(e));
    const char *name = json_string_value(json_object_get(e, "event"));
    if (name == NULL)
      return ag__tb_fail(b, AG_EINVAL,
                         "not an agentguard event (no \"event\")");
    int iteration = ev_int(e, "iteration");
    int64_t t;
    if ((rc = ag__tb_time(b, e, "t_ms", &t)) != AG_OK)
      return rc;
    /* The loop writes t_ms under one lock from one monotonic clock, so it
     * never decreases; and nothing of a turn follows its turn_end. */
    if (t >= 0 && b->last_t > t)
      return ag__tb_fail(
          b, AG_EINVAL,
          "\"t_ms\" goes back in time (%lld after %lld); events must "
          "be in the order they were written",
          (long long)t, (long long)b->last_t);
    if (t >= 0)
      b->last_t = t;
    if (b->turn_ended && strcmp(name, "turn_start") != 0 &&
        (strncmp(name, "tool_", 5) == 0 || strncmp(name, "model_", 6) == 0 ||
         strcmp(name, "approval") == 0 || strcmp(name, "turn_end") == 0))
      return ag__tb_fail(b, AG_EINVAL,
                         "%.40s after turn_end; a turn's events end with its "
                         "turn_end, and the next turn begins with turn_start",
                         name);

    if (strcmp(name, "turn_start") == 0) {
      b->turn_ended = false;
      ev_close(b);
      /* A new user message: the next step opens a new turn. */
      b->new_turn = true;
      b->new_turn_t = t;
    } else if (strcmp(name, "model_request") == 0) {
      /* A new model request is a new step, unless the current step of this
       * iteration has no reply yet (then it is the same request again). */
      bstep *s = ag__tb_cur_step(b);
      bool retry = s != NULL && !b->new_turn && s->iteration == iteration &&
                   !s->has_response && s->n_calls == 0;
      if (!retry && (rc = ev_step(b, iteration, true)) != AG_OK)
        return rc;
      if (ag__tb_cur_step(b)->t_req < 0)
        ag__tb_cur_step(b)->t_req = t;
    } else if (strcmp(name, "model_response") == 0) {
      if ((rc = ev_step(b, iteration, false)) != AG_OK)
        return rc;
      bstep *s = ag__tb_cur_step(b);
      s->has_response = true;
      s->t_resp = t;
      if ((rc = ag__tb_text(b, json_object_get(e, "text"), "text", &s->text,
                            &s->text_len)) != AG_OK ||
          (rc = ag__tb_usage(b, e, &s->tokens)) != AG_OK)
        return rc;
      s->has_text = true;
      if (s->t_req < 0)
        s->t_req = t;
      if (s->t_done < 0)
        s->t_done = t;
    } else if (strcmp(name, "tool_call") == 0) {
      if ((rc = ev_step(b, iteration, false)) != AG_OK)
        return rc;
      const json_t *nm = json_object_get(e, "name");
      if (!json_is_string(nm))
        return ag__tb_fail(b, AG_EINVAL, "tool_call without a \"name\"");
      const char *a;
      size_t al;
      if ((rc = ag__tb_args(b, json_object_get(e, "arguments"), &a, &al)) !=
          AG_OK)
        return rc;
      const char *id = json_string_value(json_object_get(e, "call_id"));
      if ((rc = ag__tb_call(b, json_string_value(nm), a, al, id, true)) !=
          AG_OK)
        return rc;
      bstep *s = ag__tb_cur_step(b);
      if (s->t_req < 0)
        s->t_req = t;
      if (s->t_resp < 0)
        s->t_resp = t;
      if (s->t_done < t)
        s->t_done = t;
    } else if (strcmp(name, "tool_result") == 0 ||
               strcmp(name, "tool_blocked") == 0 ||
               strcmp(name, "approval") == 0) {
      const char *id = json_string_value(json_object_get(e, "call_id"));
      size_t ci = ev_find(b, id);
      if (ci == SIZE_MAX)
        return ag__tb_fail(b, AG_EINVAL,
                           "%s for call '%.80s' without its tool_call", name,
                           id != NULL ? id : "(no call_id)");
      ag_traj_result *r = ev_result_of(b, ci);
      size_t ri = (size_t)(r - b->results);
      if (name[5] == 'r') { /* tool_result */
        const json_t *ok = json_object_get(e, "ok");
        if (!json_is_boolean(ok))
          return ag__tb_fail(b, AG_EINVAL,
                             "tool_result: \"ok\" must be true or "
                             "false");
        if ((rc = ag__tb_text(b, json_object_get(e, "text"), "text", &r->text,
                              &r->text_len)) != AG_OK)
          return rc;
        /* A denied call (approval false came first) stays skipped: a
         * denial is not an error. Otherwise "ok" is what the loop decided,
         * error prefixes included, and "category" what it passed on. */
        if (!(b->answered[ri] && (r->outcome == AG_OUTCOME_SKIPPED ||
                                  r->outcome == AG_OUTCOME_DENIED))) {
          r->outcome = json_is_true(ok) ? AG_OUTCOME_OK : AG_OUTCOME_ERROR;
          r->category = json_is_false(ok)
                            ? ag_category_from_name(json_string_value(
                                  json_object_get(e, "category")))
                            : AG_CAT__COUNT;
        }
        b->answered[ri] = true;
        bstep *s = ag__tb_cur_step(b);
        if (s != NULL && s->t_done < t)
          s->t_done = t;
      } else if (name[5] == 'b' ||
                 json_is_false(json_object_get(e, "approved"))) { /* not run */
        if (!b->answered[ri]) {
          /* denied at approval (mechanism 13 counts it) or blocked */
          r->outcome = name[5] == 'b' ? AG_OUTCOME_SKIPPED : AG_OUTCOME_DENIED;
          b->answered[ri] = true;
        }
      }
    } else if (strcmp(name, "turn_end") == 0) {
      if ((rc = ev_turn_end(b, e, t)) != AG_OK)
        return rc;
      b->turn_ended = true;
    }
    /* model retries, attempts, nudges, warnings, escalations, error
     * context and unknown events carry nothing the replay needs */
  }
  ev_close(b);
  b->line = 0;
  b->unit = NULL;
  /* Calls that never got a result did not run in the recording (the live
   * guard stopped their batch): they stay AG_OUTCOME_SKIPPED. */
  return AG_OK;
}
