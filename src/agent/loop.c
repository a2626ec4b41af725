/*
 * src/agent/loop.c - the agentic loop: a session (ag_agent, agent.c) holds
 * a history in the OpenAI chat shape (history.c) and runs turns; a turn runs
 * iterations (one model request and the tool calls it returned) until a final
 * answer, a loop breaking tool, a guard stop or escalation, the deadline, a
 * cancel or a model error. docs/agent.md describes every step for users.
 *
 * One iteration:
 *   1. ag_guard_begin_iteration (iteration cap, deadline); at the cap, one
 *      wrap-up request without tools (loop.final_request_without_tools);
 *   2. the model request: history + the ephemeral error context (an extra
 *      user message for this request only, never stored), retried per
 *      network.* with exponential backoff, full jitter and Retry-After, the
 *      waits on the turn token;
 *   3. the assistant message joins the history;
 *   4. the batch through ag_guard_run_batch, the driver shared with
 *      `agentguard audit`: the guard checks every call, run_cb executes the
 *      allowed ones through the scheduler (approvals, retries, the pool),
 *      the guard records the results; one tool message per call joins the
 *      history whatever happened to it (run, denied, held back, blocked);
 *   5. the verdict: go on, stop, nudge, or escalate to the human.
 *
 * Data structures. The session: the config, the guard, the scheduler, the
 * history (compact JSON text in one capped buffer, laid out as a ready
 * array, with a record per message: "History" below) with the index where
 * each stored turn starts (for the history cap), the event sink, and one
 * 64 KiB buffer for the error context. A turn: a turn_ctx on the stack (its
 * cancel token, the tools array offered to the model, the pending error context
 * flag, the partial answer). A batch: per-call arrays allocated for the batch
 * and freed after it (calls, guard checks and results, exec calls and results,
 * call ids). Memory grows only with the stored history, which is capped after
 * each turn by dropping the oldest complete turns.
 *
 * Threading. A turn runs on the caller's thread, and so do the provider,
 * the approval and the human callbacks. The scheduler runs tools on its pool
 * threads; their tool_attempt events go through the event sink's mutex
 * (events.c) and read the batch's call ids, which the loop thread writes
 * before ag_scheduler_run posts the batch (the scheduler's mutex orders the
 * two). Cancellation: the turn token links the caller's token and the turn
 * deadline; the provider, the scheduler (running tools and retry waits) and
 * the network retry waits all watch it, and the loop checks it between
 * steps, so a cancel ends the turn promptly and says which cause fired.
 *
 * Rejected:
 *   - Keeping the history as a jansson tree: about 8 bytes of heap per byte
 *     of JSON for short messages (hashtables, one allocation per string;
 *     bench_memory), and every request dumped it again. The text is
 *     spliced into an OpenAI body as it is; a provider that wants a tree
 *     gets one parsed per request (providers.h, AG_PROVIDER_MESSAGES_TEXT).
 *   - Copying the history into a request buffer to add the error context:
 *     a copy of up to the whole cap per request. The context message is
 *     appended to the stored text for the request (its retries included)
 *     and cut off as soon as complete() ends it, before anything else is
 *     appended, in the same function, so a stop or an out-of-memory cannot
 *     leave it there.
 *   - Counting retried model requests as iterations (DESIGN.md: they do not
 *     count again) or emitting model_request per retry: a reader counting
 *     model_request events gets the iterations; provider_retry tells the
 *     retries.
 *   - Capping the history by messages instead of whole turns: cutting inside
 *     a turn can separate an assistant tool call from its tool messages,
 *     which the chat API rejects.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* ------------------------------------------------------------------------ */
/* A turn                                                                   */
/* ------------------------------------------------------------------------ */

/* The streamed text kept for a reply cut by the content-loop check: it goes
 * into the history and the model_response event. */
#define STREAM_CAP (256 * 1024)
#define HINT_CAP 4096
#define MAX_WAIT_MS ((int64_t)5 * 60 * 1000) /* bound of any retry wait */

/* "350ms", "1.2s", "2m5s": elapsed times in messages for people. */
static void fmt_elapsed(int64_t ms, char *buf, size_t cap) {
  if (ms < 1000)
    snprintf(buf, cap, "%lldms", (long long)ms);
  else if (ms < 60000)
    snprintf(buf, cap, "%.1fs", (double)ms / 1000.0);
  else
    snprintf(buf, cap, "%lldm%llds", (long long)(ms / 60000),
             (long long)(ms % 60000 / 1000));
}

static void remember_text(turn_ctx *t, const char *text) {
  if (text == NULL || text[0] == '\0')
    return;
  char *d = ag__strdup(text);
  if (d == NULL)
    return;
  free(t->partial);
  t->partial = d;
}

/* Ends the turn for a fired turn token. */
void ag__turn_end_cancelled(turn_ctx *t, ag_cancel_reason why) {
  if (why == AG_CANCEL_USER || why == AG_CANCEL_NONE) {
    ag__turn_outcome_set(t->out, AG_TURN_CANCELLED, "cancelled",
                         "The turn was cancelled by the caller.");
    return;
  }
  int64_t d = t->a->cfg.loop.max_turn_duration_ms;
  if (d > 0 && ag_now_ms() >= ag_guard_deadline(t->a->guard)) {
    char s[32];
    ag_format_duration(d, s, sizeof(s));
    ag__turn_outcome_set(t->out, AG_TURN_TIMED_OUT, "turn_timeout",
                         "Turn exceeded the maximum duration of %s", s);
  } else {
    ag__turn_outcome_set(t->out, AG_TURN_TIMED_OUT, "turn_timeout",
                         "The caller's deadline for the turn passed.");
  }
}

ag_cancel_reason ag__turn_fired(turn_ctx *t) {
  return ag_cancel_check(t->tt, ag_now_ms());
}

/* A STOP verdict: the warning first, then the outcome. */
void ag__turn_end_stopped(turn_ctx *t, const ag_verdict *v) {
  if (v->warning[0] != '\0')
    ag__ev_warning(&t->a->ev, v->warning);
  ag__turn_outcome_set(t->out,
                       v->reason == AG_REASON_TURN_TIMEOUT ? AG_TURN_TIMED_OUT
                                                           : AG_TURN_STOPPED,
                       ag_reason_name(v->reason), "%s", v->message);
}

/*
 * An ESCALATE verdict: the record goes to the human. Returns true when the
 * human said continue (the hint joined the history and the tripped
 * mechanism was reset), false when the turn ends escalated.
 */
bool ag__turn_escalate(turn_ctx *t, const ag_verdict *v) {
  ag_agent *a = t->a;
  char *rec = NULL;
  if (ag_guard_escalation_record(a->guard, v, &rec, NULL) != AG_OK)
    rec = NULL;
  ag__ev_escalation(&a->ev, rec);
  bool go_on = false;
  if (a->human != NULL) {
    char hint[HINT_CAP];
    hint[0] = '\0';
    ag_human_action act =
        a->human(a->human_user, rec != NULL ? rec : "{}", hint, sizeof(hint));
    hint[sizeof(hint) - 1] = '\0';
    go_on = act == AG_HUMAN_CONTINUE;
    ag__ev_human(&a->ev, go_on ? "continue" : "stop", hint);
    if (go_on) {
      if (hint[0] != '\0' && !ag__hist_append(a, ag__msg("user", hint)))
        t->oom = true;
      ag_guard_resume(a->guard, v->reason);
    }
  }
  ag_free(rec);
  if (!go_on)
    ag__turn_outcome_set(t->out, AG_TURN_ESCALATED, ag_reason_name(v->reason),
                         "%s", v->message);
  return go_on;
}

/* ---- model requests -------------------------------------------------- */

typedef enum { REQ_OK = 0, REQ_CANCELLED, REQ_FAILED, REQ_NOMEM } req_status;

/* The message of a failed model request, for people. */
static void provider_failure(turn_ctx *t, const ag_provider_error *pe,
                             int tries, int64_t elapsed, bool gave_up) {
  ag_agent *a = t->a;
  const char *service =
      pe->service[0] != '\0' ? pe->service : ag_provider_kind(a->provider);
  if (service == NULL || service[0] == '\0')
    service = "model";
  char msg[sizeof(t->out->message)];
  ag__buf m;
  ag__buf_init_fixed(&m, msg, sizeof(msg));
  if (!a->cfg.errors.normalize_provider_errors) {
    ag__buf_addstr_cut(&m, service);
    ag__buf_addstr_cut(&m, ": ");
    ag__buf_addstr_cut(&m, pe->message[0] ? pe->message : "request failed");
  } else {
    char span[32];
    ag__buf_addstr_cut(&m, "The model service ");
    ag__buf_addstr_cut(&m, service);
    if (pe->http_status > 0)
      ag__buf_printf_cut(&m, " answered HTTP %d (%s)", pe->http_status,
                         ag__http_reason(pe->http_status));
    else
      ag__buf_addstr_cut(&m, " could not be reached");
    if (tries > 1) {
      fmt_elapsed(elapsed, span, sizeof(span));
      ag__buf_printf_cut(&m, " %d times over %s", tries, span);
    }
    ag__buf_addstr_cut(&m, gave_up ? "; giving up."
                                   : "; this error is not retried.");
    /* the provider's own words, unless they only repeat the status */
    if (pe->message[0] != '\0' && !pe->message_is_default) {
      ag__buf_addstr_cut(&m, " The last answer: ");
      ag__buf_addstr_cut(&m, pe->message);
    }
  }
  if (a->cfg.errors.include_provider_details && pe->details[0] != '\0') {
    ag__buf_addstr_cut(&m, " Details: ");
    ag__buf_addstr_cut(&m, pe->details);
  }
  ag__turn_outcome_set(t->out, AG_TURN_FAILED, "model_error", "%s", msg);
}

/* The wait before retry number `retry` + 1 (0-based): exponential from
 * network.delay, capped at network.max_delay (0: no cap) and MAX_WAIT_MS,
 * full jitter, and never shorter than the server's Retry-After. */
static int64_t retry_wait(ag_agent *a, int retry, int64_t retry_after) {
  int64_t cap = a->cfg.network.max_delay_ms > 0 ? a->cfg.network.max_delay_ms
                                                : MAX_WAIT_MS;
  if (cap > MAX_WAIT_MS)
    cap = MAX_WAIT_MS;
  int64_t d =
      ag__backoff(a->cfg.network.delay_ms, retry, AG__BACKOFF_EXPONENTIAL, cap,
                  AG__JITTER_FULL, &a->rng);
  if (retry_after >= 0) {
    int64_t ra = retry_after < MAX_WAIT_MS ? retry_after : MAX_WAIT_MS;
    if (ra > d)
      d = ra;
  }
  return d;
}

/*
 * Each streamed delta of a reply: checked for a content loop (mechanism 14),
 * then passed to the caller's on_delta. A loop stops the stream (the turn
 * then ends stopped / content_loop).
 */
static int on_delta(void *user, const char *text, size_t len) {
  turn_ctx *t = user;
  ag_agent *a = t->a;
  t->streamed = true;
  if (t->stream == NULL)
    t->stream = malloc(STREAM_CAP + 1);
  if (t->stream != NULL && t->stream_len < STREAM_CAP) {
    size_t n =
        len < STREAM_CAP - t->stream_len ? len : STREAM_CAP - t->stream_len;
    memcpy(t->stream + t->stream_len, text, n);
    t->stream_len += n;
    t->stream[t->stream_len] = '\0';
  }
  if (ag_guard_check_text(a->guard, text, len, true, &t->content_v) !=
      AG_ALLOW) {
    t->content_stop = true;
    return 1;
  }
  return a->on_delta != NULL ? a->on_delta(a->delta_user, text, len) : 0;
}

/*
 * One model request with DESIGN.md's network retries. On REQ_OK `reply` is
 * filled. Otherwise the outcome is set (cancelled / timed_out / failed)
 * except for REQ_NOMEM.
 */
static req_status request_model(turn_ctx *t, const json_t *tools,
                                bool with_ectx, ag_reply *reply) {
  ag_agent *a = t->a;
  /* The error context joins the text for this request only and is cut off
   * again before anything else is appended (ectx_cut). */
  size_t n_stored = a->n_msgs;
  if (with_ectx) {
    json_t *m = ag__msg("user", a->ectx);
    bool ok = m != NULL && ag__hist_push(a, m, false);
    json_decref(m);
    if (!ok)
      return REQ_NOMEM;
  }
  ag_request req;
  memset(&req, 0, sizeof(req));
  req.tools = tools;
  req.turn = a->turn;
  req.iteration = t->iterations;
  req.messages_json = a->text.p + a->base;
  req.messages_json_len = a->text.len - a->base;
  t->streamed = t->content_stop = false;
  ag__ev_model_request(&a->ev, req.messages_json, req.messages_json_len,
                       a->n_msgs, tools != NULL ? t->tool_names : NULL,
                       tools != NULL ? t->n_tools : 0, with_ectx,
                       a->stored_bytes + a->turn_bytes, a->events_full);
  t->stream_len = 0;

  int64_t first = ag_now_ms();
  int retries = 0;
  req_status st;
  for (;;) {
    ag_cancel_reason why = ag__turn_fired(t);
    if (why != AG_CANCEL_NONE) {
      ag__turn_end_cancelled(t, why);
      st = REQ_CANCELLED;
      break;
    }
    ag_provider_error pe;
    memset(&pe, 0, sizeof(pe));
    pe.retry_after_ms = -1;
    memset(reply, 0, sizeof(*reply));
    ag_err_t rc =
        ag_provider_complete(a->provider, &req, t->tt, on_delta, t, reply, &pe);
    if (rc != AG_EPROVIDER)
      ag__hist_cut(a, n_stored, a->n_msgs); /* no retry: the context goes */
    if (rc == AG_OK) {
      st = REQ_OK;
      break;
    }
    ag_reply_clear(reply);
    if (rc == AG_ECANCELLED && t->content_stop) {
      /* the content-loop check ended the stream: what came is the reply */
      ag_reply part;
      memset(&part, 0, sizeof(part));
      part.text = t->stream != NULL ? t->stream : (char *)"";
      ag__ev_model_response(&a->ev, &part);
      remember_text(t, part.text);
      if (!ag__hist_append(a, ag__msg("assistant", part.text)))
        t->oom = true;
      ag__turn_end_stopped(t, &t->content_v);
      st = REQ_CANCELLED;
      break;
    }
    if (rc == AG_ECANCELLED) {
      ag__turn_end_cancelled(t, ag__turn_fired(t));
      st = REQ_CANCELLED;
      break;
    }
    if (rc == AG_ENOMEM) {
      st = REQ_NOMEM;
      break;
    }
    if (rc != AG_EPROVIDER) {
      memset(&pe, 0, sizeof(pe));
      snprintf(pe.message, sizeof(pe.message), "%s", ag_strerror(rc));
    }
    pe.service[sizeof(pe.service) - 1] = '\0';
    pe.message[sizeof(pe.message) - 1] = '\0';
    pe.details[sizeof(pe.details) - 1] = '\0';
    if (pe.exhausted) {
      ag__turn_outcome_set(t->out, AG_TURN_FAILED, "script_exhausted",
                           "The model script ran out of replies: %s.",
                           pe.message[0] != '\0'
                               ? pe.message
                               : "no reply left for this request");
      st = REQ_FAILED;
      break;
    }
    if (!pe.transient || retries >= a->cfg.network.max_retries) {
      provider_failure(t, &pe, retries + 1, ag_now_ms() - first, pe.transient);
      st = REQ_FAILED;
      break;
    }
    int64_t wait = retry_wait(a, retries, pe.retry_after_ms);
    ag__ev_provider_retry(&a->ev, retries + 1, pe.http_status, pe.message,
                          wait);
    why = ag_cancel_wait(t->tt, wait);
    if (why != AG_CANCEL_NONE) {
      ag__turn_end_cancelled(t, why);
      st = REQ_CANCELLED;
      break;
    }
    retries++;
  }
  ag__hist_cut(a, n_stored, a->n_msgs);
  return st;
}

step ag__after_errors(turn_ctx *t, ag_recover_kind kind) {
  ag_agent *a = t->a;
  if (!a->cfg.errors.error_context)
    return GO_ON;
  size_t need = ag_guard_error_context(a->guard, kind, t->tool_names,
                                       t->n_tools, a->ectx, ECTX_CAP);
  if (need > 0 && a->ectx[0] != '\0') {
    t->has_ectx = true;
    ag__ev_error_context(&a->ev, a->ectx);
  }
  return GO_ON;
}

/* Step 5 under loop.require_tool_call: a reply without a tool call is a
 * recoverable error. */
static step no_tool_call(turn_ctx *t) {
  ag_agent *a = t->a;
  ag_verdict v;
  ag_action act = ag_guard_record_refused(a->guard, AG__NO_TOOL_CALL_TEXT,
                                          sizeof(AG__NO_TOOL_CALL_TEXT) - 1,
                                          ag_now_ms(), &v);
  ag_cancel_reason why = ag__turn_fired(t);
  if (why != AG_CANCEL_NONE) {
    ag__turn_end_cancelled(t, why);
    return END_TURN;
  }
  if (act == AG_STOP) {
    ag__turn_end_stopped(t, &v);
    return END_TURN;
  }
  if (act == AG_ESCALATE && !ag__turn_escalate(t, &v))
    return END_TURN;
  return ag__after_errors(t, AG_RECOVER_NO_TOOL_CALL);
}

/* A reply with no text and no tool call (mechanism 15): under
 * loop.max_empty_replies the model is asked again with a short note (in the
 * next request only, like the error context), and the Nth empty reply in a
 * row stops the turn. With the mechanism off it is the (empty) final
 * answer. */
static step empty_reply(turn_ctx *t) {
  ag_agent *a = t->a;
  ag_verdict v;
  ag_action act = ag_guard_record_empty(a->guard, ag_now_ms(), &v);
  switch (act) {
  case AG_NUDGE:
    ag__ev_nudge(&a->ev, ag_reason_name(v.reason), v.message);
    ag__scopy(a->ectx, ECTX_CAP, v.message);
    t->has_ectx = true;
    return GO_ON;
  case AG_STOP:
  case AG_ESCALATE:
    ag__turn_end_stopped(t, &v);
    return END_TURN;
  case AG_ALLOW:
  default:
    ag__turn_outcome_set(t->out, AG_TURN_COMPLETED, "final_answer",
                         "The model answered.");
    t->out->final_text = ag__strdup("");
    if (t->out->final_text == NULL)
      t->oom = true;
    return END_TURN;
  }
}

/* The reply's token usage joins the turn's count (mechanism 11). */
static void note_usage(turn_ctx *t, const ag_reply *reply) {
  if (!reply->has_usage)
    return;
  ag_guard_record_tokens(t->a->guard, reply->usage.prompt_tokens +
                                          reply->usage.completion_tokens);
  t->out->tokens = ag_guard_tokens(t->a->guard);
}

/* Appends the assistant message of `reply`; false on ENOMEM. */
static bool append_assistant(turn_ctx *t, const ag_reply *reply,
                             const call_ids *ids) {
  t->a->iter_start = t->a->n_msgs; /* kept whole */
  return ag__hist_append(t->a, ag__assistant_message(reply, ids));
}

/*
 * At the iteration cap with loop.final_request_without_tools: one more
 * request with no tools offered, so the user gets an answer. The turn ends
 * stopped / max_iterations with that answer as final_text. Tool calls in
 * the reply (a model may still send some) are answered "Not run".
 */
static void wrap_up(turn_ctx *t, const ag_verdict *v) {
  ag_agent *a = t->a;
  t->iterations++;
  ag__ev_position(&a->ev, a->turn, t->iterations);
  ag_reply reply;
  memset(&reply, 0, sizeof(reply));
  /* No error context: its instructions ask for tool calls, and none are
   * offered here. */
  req_status st = request_model(t, NULL, false, &reply);
  if (st == REQ_CANCELLED)
    return;
  if (st == REQ_NOMEM) {
    t->oom = true;
    ag__turn_end_stopped(t, v);
    return;
  }
  if (st == REQ_FAILED) {
    char why[sizeof(t->out->message)];
    ag__scopy(why, sizeof(why), t->out->message);
    ag__turn_outcome_set(t->out, AG_TURN_STOPPED, ag_reason_name(v->reason),
                         "%s. The final request without tools failed: %.700s",
                         v->message, why);
    return;
  }
  note_usage(t, &reply);
  ag__ev_model_response(&a->ev, &reply);
  call_ids ids;
  if (!ag__ids_make(&ids, &reply, a->turn, t->iterations) ||
      !append_assistant(t, &reply, &ids)) {
    t->oom = true;
  } else if (reply.n_calls > 0) {
    size_t base = a->n_msgs - 1;
    if (!ag__answer_not_run(t, &reply, &ids, ag_reason_name(v->reason),
                            v->message)) {
      t->oom = true;
      ag__hist_truncate(a, base);
    }
  }
  ag__ids_free(&ids);
  remember_text(t, reply.text);
  ag__turn_end_stopped(t, v);
  if (reply.text != NULL) {
    t->out->final_text = ag__strdup(reply.text);
    if (t->out->final_text == NULL)
      t->oom = true;
  }
  ag_reply_clear(&reply);
}

/* The tools offered to the model and their names, for this turn. */
static bool turn_tools(turn_ctx *t) {
  const ag_registry *reg = t->a->reg;
  size_t n = ag_registry_count(reg);
  if (n == 0)
    return true;
  t->tools_json = ag_registry_tools_json(reg);
  t->tool_names = calloc(n, sizeof(*t->tool_names));
  if (t->tools_json == NULL || t->tool_names == NULL)
    return false;
  for (size_t i = 0; i < n; i++)
    t->tool_names[i] = ag_registry_name(reg, i);
  t->n_tools = n;
  return true;
}

static void iterate(turn_ctx *t) {
  ag_agent *a = t->a;
  for (;;) {
    ag_cancel_reason why = ag__turn_fired(t);
    if (why != AG_CANCEL_NONE) {
      ag__turn_end_cancelled(t, why);
      return;
    }
    ag_verdict v;
    if (ag_guard_begin_iteration(a->guard, ag_now_ms(), &v) == AG_STOP) {
      if (v.reason == AG_REASON_MAX_ITERATIONS &&
          a->cfg.loop.final_request_without_tools)
        wrap_up(t, &v);
      else
        ag__turn_end_stopped(t, &v);
      return;
    }
    t->iterations++;
    ag__ev_position(&a->ev, a->turn, t->iterations);

    ag_reply reply;
    memset(&reply, 0, sizeof(reply));
    bool with_ectx = t->has_ectx;
    t->has_ectx = false; /* the error context goes into this request only */
    req_status st = request_model(t, t->tools_json, with_ectx, &reply);
    if (st != REQ_OK) {
      if (st == REQ_NOMEM)
        t->oom = true;
      return;
    }
    note_usage(t, &reply);
    ag__ev_model_response(&a->ev, &reply);
    remember_text(t, reply.text);
    /* A reply that came whole (no stream): its text checked at once. */
    ag_verdict cv;
    bool looped = !t->streamed && reply.text != NULL &&
                  ag_guard_check_text(a->guard, reply.text, strlen(reply.text),
                                      false, &cv) != AG_ALLOW;

    call_ids ids;
    step s = END_TURN;
    if (!ag__ids_make(&ids, &reply, a->turn, t->iterations) ||
        !append_assistant(t, &reply, &ids)) {
      t->oom = true;
    } else if (looped) {
      size_t base = a->n_msgs - 1;
      if (reply.n_calls > 0 &&
          !ag__answer_not_run(t, &reply, &ids, ag_reason_name(cv.reason),
                              cv.message)) {
        t->oom = true;
        ag__hist_truncate(a, base);
      }
      ag__turn_end_stopped(t, &cv);
    } else if (reply.n_calls == 0 &&
               (reply.text == NULL || reply.text[0] == '\0')) {
      s = empty_reply(t);
    } else if (reply.n_calls == 0) {
      if (!a->cfg.loop.require_tool_call) {
        ag__turn_outcome_set(t->out, AG_TURN_COMPLETED, "final_answer",
                             "The model answered.");
        t->out->final_text = ag__strdup(reply.text != NULL ? reply.text : "");
        if (t->out->final_text == NULL)
          t->oom = true;
      } else {
        s = no_tool_call(t);
      }
    } else {
      s = ag__run_calls(t, &reply, &ids);
    }
    ag__ids_free(&ids);
    ag_reply_clear(&reply);
    if (s == END_TURN || t->oom)
      return;
  }
}

AG_EXTERN ag_err_t ag_agent_run_turn(ag_agent *a, const char *user_message,
                                     ag_cancel *cancel, ag_turn_outcome *out,
                                     ag_error_t *err) {
  if (out != NULL)
    memset(out, 0, sizeof(*out));
  if (a == NULL || user_message == NULL || out == NULL)
    return ag__set_error(err, AG_EINVAL, -1,
                         "ag_agent_run_turn: a, user_message and out are "
                         "required");

  int64_t now = ag_now_ms();
  int64_t d = a->cfg.loop.max_turn_duration_ms;
  ag_cancel *tt = NULL;
  ag_err_t rc = ag_cancel_new(&tt, cancel, d > 0 ? now + d : INT64_MAX,
                              AG_CANCEL_DEADLINE, err);
  if (rc != AG_OK) {
    /* Nothing ran and no event was sent: there is no reason code. */
    ag__turn_outcome_set(out, AG_TURN_FAILED, "",
                         "The turn could not start: %s", ag_strerror(rc));
    return rc;
  }
  a->turn++;
  ag_guard_begin_turn(a->guard, now);
  ag__ev_position(&a->ev, a->turn, 0);

  turn_ctx t;
  memset(&t, 0, sizeof(t));
  t.a = a;
  t.tt = tt;
  t.out = out;

  ag__ev_turn_start(&a->ev, user_message);
  size_t start = a->n_msgs;
  bool stored = false; /* the turn's user message is in the history */
  a->in_turn = true;
  a->turn_bytes = 0;
  a->iter_start = a->compact_from = start + 1; /* the user message stays */
  if (!ag__hist_turn_start(a, start)) {
    t.oom = true;
  } else if (!ag__hist_append(a, ag__msg("user", user_message))) {
    a->n_turns--;
    t.oom = true;
  } else if ((stored = true, !turn_tools(&t))) {
    t.oom = true;
  } else {
    iterate(&t);
  }
  out->iterations = t.iterations;

  if (t.oom) {
    /* Out of memory: the turn fails, the session stays usable. */
    ag__turn_outcome_set(out, AG_TURN_FAILED, "out_of_memory",
                         "The turn ran out of memory.");
    rc = ag__agent_nomem(err);
  }
  if (out->status != AG_TURN_COMPLETED && out->final_text == NULL &&
      t.partial != NULL) {
    out->final_text = t.partial; /* the partial answer */
    t.partial = NULL;
  }

  a->in_turn = false;
  /* measured once, whatever the in-turn cap dropped */
  if (stored)
    ag__hist_measure_turn(a);
  ag__hist_cap(a, 0);
  ag__hist_shrink(a);
  ag__ev_turn_end(&a->ev, out);

  free(t.partial);
  free(t.stream);
  free(t.tool_names);
  json_decref(t.tools_json);
  ag_cancel_free(tt);
  return rc;
}
