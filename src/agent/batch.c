/*
 * src/agent/batch.c - one batch of tool calls (docs/agent.md steps 6 to
 * 8): the guard checks it (ag_guard_run_batch), the scheduler runs the
 * allowed calls with approvals and retries, one tool message per call joins
 * the history, and the verdict decides how the turn goes on.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* ---- the batch --------------------------------------------------------- */

/* snprintf's return value as the length written into `cap` bytes. */
static size_t fit(int n, size_t cap) {
  return n < 0 ? 0 : (size_t)n < cap ? (size_t)n : cap - 1;
}

/* "Not run: <why>", the tool message of a call that was never executed,
 * into buf; its length. */
static size_t not_run_text(char *buf, size_t cap, const char *why) {
  return fit(snprintf(buf, cap, "Not run: %s", why), cap);
}

/* A run's output text ("" when there is none) and its length. */
static const char *exec_text(const ag_exec_result *er, size_t *len) {
  *len = er->text != NULL ? er->text_len : 0;
  return er->text != NULL ? er->text : "";
}

typedef struct batch_ctx {
  turn_ctx *t;
  const call_ids *ids;
  ag_exec_call *ecalls;
  ag_exec_result *ers;
  bool sched_failed;
} batch_ctx;

static bool requires_approval(const ag_registry *r, const char *name) {
  const ag_tool_def *d = ag_registry_get(r, name);
  return d != NULL && d->requires_approval;
}

/* Executes the calls the guard allowed (ag_run_fn for ag_guard_run_batch). */
static int64_t run_cb(void *user, const ag_call *calls,
                      const ag_call_check *checks, size_t n,
                      ag_result *results) {
  batch_ctx *b = user;
  turn_ctx *t = b->t;
  ag_agent *a = t->a;

  for (size_t i = 0; i < n; i++) {
    ag__ev_tool_call(&a->ev, b->ids->ids[i], calls[i].name, calls[i].args,
                     calls[i].args_len, checks[i].valid ? checks[i].sig : NULL);
    if (checks[i].action == AG_NUDGE)
      ag__ev_nudge(&a->ev, ag_reason_name(checks[i].reason), checks[i].message);
  }
  for (size_t i = 0; i < n; i++) {
    b->ecalls[i].name = calls[i].name;
    b->ecalls[i].args = calls[i].args;
    b->ecalls[i].args_len = calls[i].args_len;
    b->ecalls[i].skip = !(checks[i].action == AG_ALLOW && checks[i].valid);
    /* the guard's signature: the scheduler groups approval questions by
     * it without signing the call a second time */
    b->ecalls[i].signature = checks[i].valid ? checks[i].sig : NULL;
  }
  a->batch_ids = b->ids->ids;
  a->batch_n = n;
  if (ag_scheduler_run(a->sched, b->ecalls, n, t->tt, b->ers, NULL) != AG_OK)
    b->sched_failed = true;
  a->batch_ids = NULL;
  a->batch_n = 0;

  for (size_t i = 0; i < n; i++) {
    const char *id = b->ids->ids[i];
    const char *name = calls[i].name;
    if (checks[i].action == AG_NUDGE)
      continue; /* held back: answered by its nudge */
    if (!checks[i].valid) {
      ag__ev_tool_result(&a->ev, id, name, false, 0,
                         ag_category_name(AG_CAT_VALIDATION), results[i].text,
                         results[i].text_len);
      continue;
    }
    ag_exec_result *er = &b->ers[i];
    size_t len;
    const char *text = exec_text(er, &len);
    if (requires_approval(a->reg, name) && er->status != AG_EXEC_NOT_FOUND &&
        er->status != AG_EXEC_INVALID && er->status != AG_EXEC_SKIPPED &&
        !(er->status == AG_EXEC_CANCELLED && er->attempts == 0))
      ag__ev_approval(&a->ev, id, name, er->status != AG_EXEC_DENIED);
    if (er->attempts > 0)
      t->out->tool_calls++;

    ag_result *r = &results[i];
    r->text = text;
    r->text_len = len;
    bool ok;
    const char *cat;
    switch (er->status) {
    case AG_EXEC_OK:
      r->outcome = AG_OUTCOME_OK;
      r->category = AG_CAT_AUTO; /* the guard checks the prefixes */
      ok = !ag_guard_is_error_text(a->guard, text, len);
      cat = ok ? NULL : ag_category_name(ag_classify(text, len));
      break;
    case AG_EXEC_DENIED:
      r->outcome = AG_OUTCOME_DENIED; /* not an error; mechanism 13 */
      r->category = er->category;
      ok = false;
      cat = ag_category_name(er->category);
      break;
    default:
      r->outcome = AG_OUTCOME_ERROR;
      r->category = er->category;
      ok = false;
      cat = ag_category_name(er->category);
      break;
    }
    ag__ev_tool_result(&a->ev, id, name, ok, er->attempts, cat, text, len);
  }
  return ag_now_ms();
}

/* A failed call's tool message per errors.feedback (malloc'd). */
static char *error_feedback(const ag_agent *a, const char *name,
                            ag_category cat, const char *text, size_t len,
                            size_t *out_len) {
  if (a->cfg.errors.feedback == AG_FEEDBACK_FULL) {
    *out_len = len;
    return ag__strndup(text, len);
  }
  if (a->cfg.errors.feedback == AG_FEEDBACK_GENERIC) {
    static const char generic[] = "Error: Function failed.";
    *out_len = sizeof(generic) - 1;
    return ag__strndup(generic, *out_len);
  }
  char one[1];
  size_t max = (size_t)a->cfg.errors.max_error_chars;
  size_t need =
      ag_format_compact_error(one, sizeof(one), name, cat, text, len, max);
  char *buf = malloc(need + 1);
  if (buf == NULL)
    return NULL;
  ag_format_compact_error(buf, need + 1, name, cat, text, len, max);
  *out_len = need;
  return buf;
}

static bool is_loop_breaking(const ag_config *cfg, const char *name) {
  const ag_str_list *l = &cfg->loop.loop_breaking_tools;
  for (int i = 0; i < l->count && i < AG_LIST_MAX; i++)
    if (strcmp(l->items[i], name) == 0)
      return true;
  return false;
}

/* Appends one tool message per call. `texts[i]` (lens[i]) is its content. */
static bool append_tool_messages(ag_agent *a, const call_ids *ids, size_t n,
                                 char **texts, const size_t *lens) {
  size_t before = a->n_msgs;
  for (size_t i = 0; i < n; i++) {
    const char *s = texts[i] != NULL ? texts[i] : "";
    size_t l = texts[i] != NULL ? lens[i] : 0;
    if (!ag__hist_append(a, ag__tool_message(ids->ids[i], s, l))) {
      ag__hist_truncate(a, before);
      return false;
    }
  }
  return true;
}

/* "Not run: <why>" for every call of a reply that was never executed. */
bool ag__answer_not_run(turn_ctx *t, const ag_reply *r, const call_ids *ids,
                        const char *reason_code, const char *why) {
  ag_agent *a = t->a;
  char text[AG_VERDICT_MSG_MAX + 16];
  size_t l = not_run_text(text, sizeof(text), why);
  size_t before = a->n_msgs;
  for (size_t i = 0; i < r->n_calls; i++) {
    size_t alen;
    const char *args = ag__call_args(&r->calls[i], &alen);
    uint8_t sig[AG_SIG_LEN];
    bool valid =
        ag__ev_on(&a->ev) && ag_signature(ag__call_name(&r->calls[i]), args,
                                          alen, sig, NULL) == AG_OK;
    ag__ev_tool_call(&a->ev, ids->ids[i], ag__call_name(&r->calls[i]), args,
                     alen, valid ? sig : NULL);
    ag__ev_tool_blocked(&a->ev, ids->ids[i], ag__call_name(&r->calls[i]),
                        reason_code);
    if (!ag__hist_append(a, ag__tool_message(ids->ids[i], text, l))) {
      ag__hist_truncate(a, before);
      return false;
    }
  }
  return true;
}

/* Out of memory after the assistant message joined the history: answer
 * every call with a fixed text (no allocation beyond the messages), or drop
 * the assistant message, so the history stays valid either way. */
static void answer_lost(ag_agent *a, const call_ids *ids, size_t n,
                        size_t base) {
  static const char lost[] = "No result: the agent ran out of memory.";
  for (size_t i = 0; i < n; i++) {
    if (!ag__hist_append(
            a, ag__tool_message(ids->ids[i], lost, sizeof(lost) - 1))) {
      ag__hist_truncate(a, base);
      return;
    }
  }
}

/* ---- one batch of tool calls (docs/agent.md steps 6 to 8) --------------- */

/* The per-call arrays of a batch, allocated together, freed together. */
typedef struct batch {
  size_t n;
  ag_call *calls;
  ag_call_check *checks;
  ag_result *results;
  ag_exec_call *ecalls;
  ag_exec_result *ers;
  char **texts; /* each call's tool message content (malloc'd) */
  size_t *lens;
} batch;

static bool batch_new(batch *b, const ag_reply *reply) {
  size_t n = reply->n_calls;
  b->n = n;
  b->calls = calloc(n, sizeof(*b->calls));
  b->checks = calloc(n, sizeof(*b->checks));
  b->results = calloc(n, sizeof(*b->results));
  b->ecalls = calloc(n, sizeof(*b->ecalls));
  b->ers = calloc(n, sizeof(*b->ers));
  b->texts = calloc(n, sizeof(*b->texts));
  b->lens = calloc(n, sizeof(*b->lens));
  if (b->calls == NULL || b->checks == NULL || b->results == NULL ||
      b->ecalls == NULL || b->ers == NULL || b->texts == NULL ||
      b->lens == NULL)
    return false;
  for (size_t i = 0; i < n; i++) {
    b->calls[i].name = ag__call_name(&reply->calls[i]);
    b->calls[i].args = ag__call_args(&reply->calls[i], &b->calls[i].args_len);
  }
  return true;
}

static void batch_free(batch *b) {
  for (size_t i = 0; b->ers != NULL && i < b->n; i++)
    ag_exec_result_clear(&b->ers[i]);
  for (size_t i = 0; b->texts != NULL && i < b->n; i++)
    free(b->texts[i]);
  free(b->calls);
  free(b->checks);
  free(b->results);
  free(b->ecalls);
  free(b->ers);
  free(b->texts);
  free(b->lens);
}

/* What a batch's tool messages tell the next steps. */
typedef struct batch_seen {
  bool any_error, not_found, invalid;
  bool have_breaking;        /* a loop-breaking tool succeeded: */
  const char *breaking_name; /* its name */
  char *breaking;            /* its result (malloc'd), the final text */
} batch_seen;

/* Sets the tool message of call i of a batch that ran (texts[i], lens[i])
 * and notes what it says in `seen`; false when out of memory. */
static bool call_message(ag_agent *a, batch *b, size_t i, batch_seen *seen) {
  const char *name = b->calls[i].name;
  char **out = &b->texts[i];
  size_t *out_len = &b->lens[i];
  if (b->checks[i].action == AG_NUDGE) { /* held back: its nudge */
    *out_len = strlen(b->checks[i].message);
    *out = ag__strndup(b->checks[i].message, *out_len);
    return *out != NULL;
  }
  if (!b->checks[i].valid) {
    seen->any_error = seen->invalid = true;
    *out = error_feedback(a, name, AG_CAT_VALIDATION, b->results[i].text,
                          b->results[i].text_len, out_len);
    return *out != NULL;
  }
  const ag_exec_result *er = &b->ers[i];
  size_t len;
  const char *text = exec_text(er, &len);
  switch (er->status) {
  case AG_EXEC_OK:
  case AG_EXEC_DENIED:
  case AG_EXEC_SKIPPED:
    *out_len = len;
    *out = ag__strndup(text, len);
    if (er->status != AG_EXEC_OK)
      break;
    if (ag_guard_is_error_text(a->guard, text, len)) {
      seen->any_error = true;
    } else if (!seen->have_breaking && a->cfg.loop.require_tool_call &&
               is_loop_breaking(&a->cfg, name)) {
      seen->have_breaking = true;
      seen->breaking_name = name;
      seen->breaking = ag__strndup(text, len);
      if (seen->breaking == NULL)
        return false;
    }
    break;
  case AG_EXEC_NOT_FOUND:
    seen->not_found = seen->any_error = true;
    if (a->cfg.errors.feedback == AG_FEEDBACK_GENERIC) {
      /* M.E.AI's own text for a function it does not have */
      char nf[AG_TOOL_NAME_MAX + 64];
      *out_len = fit(snprintf(nf, sizeof(nf),
                              "Error: Requested function \"%.*s\" not found.",
                              AG_TOOL_NAME_MAX, name),
                     sizeof(nf));
      *out = ag__strndup(nf, *out_len);
    } else {
      *out = error_feedback(a, name, er->category, text, len, out_len);
    }
    break;
  case AG_EXEC_INVALID:
    seen->invalid = true;
    /* fall through */
  default:
    seen->any_error = true;
    *out = error_feedback(a, name, er->category, text, len, out_len);
    break;
  }
  return *out != NULL;
}

/* A nudge after the results (call_and_result scope): the call ran, and
 * its tool message carries the nudge after its result. False on ENOMEM. */
static bool join_nudge(batch *b, const ag_verdict *v) {
  if (v->call_index < 0 || (size_t)v->call_index >= b->n)
    return true;
  size_t k = (size_t)v->call_index;
  size_t ml = strlen(v->message);
  char *joined = malloc(b->lens[k] + 2 + ml + 1);
  if (joined == NULL)
    return false;
  memcpy(joined, b->texts[k], b->lens[k]);
  memcpy(joined + b->lens[k], "\n\n", 2);
  memcpy(joined + b->lens[k] + 2, v->message, ml + 1);
  free(b->texts[k]);
  b->texts[k] = joined;
  b->lens[k] += 2 + ml;
  return true;
}

/* The guard stopped the batch before it ran: every call is answered
 * "Not run: <why>". False on ENOMEM. */
static bool blocked_messages(ag_agent *a, batch *b, const call_ids *ids,
                             const ag_verdict *v) {
  const char *code = ag_reason_name(v->reason);
  for (size_t i = 0; i < b->n; i++) {
    ag__ev_tool_call(&a->ev, ids->ids[i], b->calls[i].name, b->calls[i].args,
                     b->calls[i].args_len,
                     b->checks[i].valid ? b->checks[i].sig : NULL);
    ag__ev_tool_blocked(&a->ev, ids->ids[i], b->calls[i].name, code);
  }
  char text[AG_VERDICT_MSG_MAX + 16];
  size_t len = not_run_text(text, sizeof(text), v->message);
  for (size_t i = 0; i < b->n; i++) {
    b->lens[i] = len;
    b->texts[i] = ag__strndup(text, len);
    if (b->texts[i] == NULL)
      return false;
  }
  return true;
}

/* Step 7 after the tool messages joined the history: the batch's verdict
 * (a stop, an escalation with its human answer, a loop-breaking tool that
 * ends the turn) and, for step 8, the error context of the next request. */
static step batch_verdict(turn_ctx *t, ag_action act, const ag_verdict *v,
                          batch_seen *seen) {
  ag_cancel_reason why = ag__turn_fired(t);
  if (why != AG_CANCEL_NONE) {
    ag__turn_end_cancelled(t, why);
    return END_TURN;
  }
  switch (act) {
  case AG_STOP:
    ag__turn_end_stopped(t, v);
    return END_TURN;
  case AG_ESCALATE:
    if (!ag__turn_escalate(t, v))
      return END_TURN;
    break;
  case AG_ALLOW:
  case AG_NUDGE:
    if (seen->have_breaking) {
      ag__turn_outcome_set(t->out, AG_TURN_COMPLETED, "loop_breaking_tool",
                           "The model called %s, which ends the turn.",
                           seen->breaking_name);
      t->out->final_text = seen->breaking;
      seen->breaking = NULL;
      return END_TURN;
    }
    break;
  }
  if (seen->any_error)
    ag__after_errors(t, seen->not_found ? AG_RECOVER_UNKNOWN_TOOL
                        : seen->invalid ? AG_RECOVER_INVALID_JSON
                                        : AG_RECOVER_EXECUTION);
  return GO_ON;
}

/* A reply with tool calls, docs/agent.md steps 6 to 8: the batch through
 * ag_guard_run_batch, one tool message per call, the verdict. */
step ag__run_calls(turn_ctx *t, const ag_reply *reply, const call_ids *ids) {
  ag_agent *a = t->a;
  /* the reply's assistant message is the last entry of the history */
  size_t base = a->n_msgs - 1;

  ag_cancel_reason why = ag__turn_fired(t);
  if (why != AG_CANCEL_NONE) {
    ag__turn_end_cancelled(t, why);
    if (!ag__answer_not_run(t, reply, ids, t->out->reason, t->out->message)) {
      t->oom = true;
      ag__hist_truncate(a, base);
    }
    return END_TURN;
  }

  batch b;
  memset(&b, 0, sizeof(b));
  batch_seen seen;
  memset(&seen, 0, sizeof(seen));
  seen.breaking_name = "";
  step s = END_TURN;
  if (!batch_new(&b, reply)) {
    t->oom = true;
    answer_lost(a, ids, reply->n_calls, base);
    goto done;
  }

  batch_ctx bc = {t, ids, b.ecalls, b.ers, false};
  ag_verdict v;
  bool ran = false;
  ag_action act =
      ag_guard_run_batch(a->guard, b.calls, b.n, ag_now_ms(), run_cb, &bc,
                         b.checks, b.results, &v, &ran);

  bool ok = true; /* every tool message was built */
  if (!ran) {
    ok = blocked_messages(a, &b, ids, &v);
  } else {
    for (size_t i = 0; i < b.n && ok; i++)
      ok = call_message(a, &b, i, &seen);
    if (ok && act == AG_NUDGE) {
      ag__ev_nudge(&a->ev, ag_reason_name(v.reason), v.message);
      ok = join_nudge(&b, &v);
    }
  }
  if (!ok || !append_tool_messages(a, ids, b.n, b.texts, b.lens)) {
    t->oom = true;
    answer_lost(a, ids, b.n, base);
    goto done;
  }
  if (bc.sched_failed) {
    t->oom = true; /* the results were written; the turn still fails */
    goto done;
  }
  s = batch_verdict(t, act, &v, &seen);

done:
  batch_free(&b);
  free(seen.breaking);
  return s;
}
