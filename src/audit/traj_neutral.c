/*
 * src/audit/traj_neutral.c - the reader of agentguard's neutral trajectory
 * ({"steps": [...]}, docs/audit.md "Formats").
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "builder.h"

/* ------------------------------------------------------------------------ */
/* Neutral trajectories                                                     */
/* ------------------------------------------------------------------------ */

ag_err_t ag__tb_parse_neutral(builder *b, const json_t *root) {
  ag_err_t rc;
  const json_t *steps = json_object_get(root, "steps");
  if (!json_is_array(steps))
    return ag__tb_fail(b, AG_EINVAL, "\"steps\" must be an array, got %s",
                       ag__json_kind(steps));
  b->f->pub.outcome = ag__tb_outcome(root);
  b->f->pub.source = ag__tb_source(root);
  b->unit = "step";
  for (size_t i = 0; i < json_array_size(steps); i++) {
    const json_t *st = json_array_get(steps, i);
    b->unit_no = i + 1;
    if (!json_is_object(st))
      return ag__tb_fail(b, AG_EINVAL, "must be an object, got %s",
                         ag__json_kind(st));
    const json_t *calls = json_object_get(st, "calls");
    const json_t *results = json_object_get(st, "results");
    if (calls != NULL && !json_is_array(calls))
      return ag__tb_fail(b, AG_EINVAL, "\"calls\" must be an array, got %s",
                         ag__json_kind(calls));
    if (results != NULL && !json_is_array(results))
      return ag__tb_fail(b, AG_EINVAL, "\"results\" must be an array, got %s",
                         ag__json_kind(results));
    if (calls == NULL && results == NULL)
      return ag__tb_fail(b, AG_EINVAL, "has neither \"calls\" nor \"results\"");
    size_t nc = json_array_size(calls), nr = json_array_size(results);

    if (i > 0 && ag__tb_truthy(json_object_get(st, "user_msg_before")))
      ag__tb_user(b, -1);
    if ((rc = ag__tb_step(b, 0)) != AG_OK)
      return rc;
    bstep *s = ag__tb_cur_step(b);
    if ((rc = ag__tb_usage(b, st, &s->tokens)) != AG_OK)
      return rc;
    const json_t *say = json_object_get(st, "text");
    if (say != NULL) { /* the reply's text, when the recording keeps it */
      if ((rc = ag__tb_text(b, say, "text", &s->text, &s->text_len)) != AG_OK)
        return rc;
      s->has_text = true;
    }
    if ((rc = ag__tb_time(b, st, "t_ms", &s->t_req)) != AG_OK ||
        (rc = ag__tb_time(b, st, "t_done_ms", &s->t_done)) != AG_OK)
      return rc;
    s->t_resp = s->t_req;
    if (s->t_done < 0)
      s->t_done = s->t_req;

    size_t n_rejected = 0;
    for (size_t k = 0; k < nc; k++) {
      const json_t *c = json_array_get(calls, k);
      if (!json_is_object(c))
        return ag__tb_fail(b, AG_EINVAL, "call %zu must be an object, got %s",
                           k + 1, ag__json_kind(c));
      const json_t *name = json_object_get(c, "name");
      if (!json_is_string(name))
        return ag__tb_fail(b, AG_EINVAL, "call %zu: \"name\" must be a string",
                           k + 1);
      const json_t *args = json_object_get(c, "args");
      if (args == NULL)
        args = json_object_get(c, "arguments");
      const char *a;
      size_t al;
      if ((rc = ag__tb_args(b, args, &a, &al)) != AG_OK)
        return rc;
      if (ag__tb_truthy(json_object_get(c, "rejected_by_harness")))
        n_rejected++;
      if ((rc = ag__tb_call(b, json_string_value(name), a, al, NULL, false)) !=
          AG_OK)
        return rc;
      s = ag__tb_cur_step(b);
    }
    bool rejected = ag__tb_truthy(json_object_get(st, "rejected_by_harness"));
    if (n_rejected > 0 && n_rejected < nc && !rejected)
      return ag__tb_fail(
          b, AG_EINVAL,
          "%zu of its %zu calls are rejected_by_harness: a rejected "
          "reply ran nothing, so all or none must be",
          n_rejected, nc);
    /* No call and one result: the harness answered a reply it refused
     * (mini-swe-agent's format errors), as rejected_by_harness says. */
    rejected = rejected || (nc > 0 && n_rejected == nc) || (nc == 0 && nr == 1);
    s->rejected = rejected;
    if (!rejected && nr != nc)
      return ag__tb_fail(
          b, AG_EINVAL,
          "%zu calls but %zu results (each call needs its result)", nc, nr);

    size_t keep = rejected ? 1 : nr; /* a rejection has one observation */
    for (size_t k = 0; k < keep; k++) {
      if ((rc = ag__tb_result(b)) != AG_OK)
        return rc;
      ag_traj_result *r = &b->results[b->n_results - 1];
      b->answered[b->n_results - 1] = true;
      const json_t *rv = json_array_get(results, k);
      if (rv == NULL) { /* a rejection recorded without its observation */
        r->outcome = AG_OUTCOME_ERROR;
        continue;
      }
      if (!json_is_object(rv))
        return ag__tb_fail(b, AG_EINVAL, "result %zu must be an object, got %s",
                           k + 1, ag__json_kind(rv));
      const json_t *ok = json_object_get(rv, "ok");
      if (ok != NULL && !json_is_boolean(ok))
        return ag__tb_fail(b, AG_EINVAL,
                           "result %zu: \"ok\" must be true or false", k + 1);
      const json_t *text = json_object_get(rv, "text");
      if (text != NULL && !json_is_string(text) && !json_is_null(text))
        return ag__tb_fail(b, AG_EINVAL,
                           "result %zu: \"text\" must be a string", k + 1);
      /* ok is authoritative: false is an error even without an error
       * prefix; true (or absent) lets the guard apply its prefixes. */
      r->outcome =
          rejected || json_is_false(ok) ? AG_OUTCOME_ERROR : AG_OUTCOME_OK;
      if (json_is_string(text)) {
        r->text = json_string_value(text);
        r->text_len = json_string_length(text);
      }
    }
  }
  return AG_OK;
}
