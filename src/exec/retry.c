/*
 * src/exec/retry.c - the retry executor: one validated tool call, run with
 * DESIGN.md section 3's rules for retries, per-attempt timeouts and
 * cancellation (seed 001's ExecuteWithRetryAsync).
 *
 * Shape of a call. Up to max_retries + 1 attempts. Each attempt gets its own
 * token, a child of the turn token with the per-attempt timeout as deadline
 * (reason TIMEOUT), so the turn deadline, the caller's cancel and the
 * attempt timeout all reach the tool through one token, and afterwards the
 * tokens say which of them fired: the attempt token's TIMEOUT (while the
 * turn is still alive) is this attempt's timeout; anything the turn token
 * reports is a cancel that ends the call at once, never retried. Between
 * attempts the executor sleeps in ag_cancel_wait(turn, delay), so a retry
 * wait ends as soon as the turn does.
 *
 * An attempt's outcome is decided after the tool returns: a tool that
 * returns (even "ok") after its token fired counts as timed out or
 * cancelled, the same rule a subprocess tool gets from being killed. A
 * native tool cannot be killed: one that ignores its token is waited for.
 *
 * What is retried (retry.retry_on):
 *   transient  errors the tool marked transient (ag_output_set_transient),
 *              or, when it said nothing, whose text the classifier puts in
 *              a transient category (timeout, rate_limit, network, busy);
 *   all        every error;
 *   none       nothing.
 * Under transient and all, a timeout is retried only for an idempotent tool
 * (it may have done its work), and an error the tool marked permanent is
 * never retried. A subprocess crash is an error like any other.
 *
 * Texts. Success: the tool's output. One failed attempt: its message. More:
 * "Error after N attempts: <last message>". Timeout: "Function timed out
 * after 30s". Cancel: "Cancelled: turn deadline passed" or "Cancelled by the
 * caller". Error messages lose trailing whitespace (a subprocess's stderr
 * ends in a newline that would otherwise sit inside every derived text).
 *
 * Backoff (ag__retry_delay over the base layer's ag__backoff, which the
 * agent's model retries share): linear delay*(attempt+1) (seed 001: 1s, 2s,
 * 3s), exponential delay*2^attempt, constant delay; saturating arithmetic,
 * capped at retry.max_delay (0: no cap). Jitter is "equal jitter": half the
 * delay plus a uniform random part of the other half, so a delay never
 * drops below half of its nominal value (retries stay spaced out) while
 * concurrent callers spread over the other half. The random numbers come
 * from xorshift64* (Vigna 2016) on the caller's state: no global state, no
 * locks; the small modulo bias of reducing a 64-bit value is irrelevant for
 * spreading retries.
 *
 * Threading: ag__exec_call runs on whichever thread calls it (the caller's
 * for a batch of one, a pool thread otherwise) and holds no lock, also not
 * while calling the tool or on_attempt.
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define DEFAULT_MAX_OUTPUT ((size_t)1 << 20)
#define DEFAULT_KILL_GRACE_MS 500

#define MSG_DEADLINE "Cancelled: turn deadline passed"
#define MSG_USER "Cancelled by the caller"

/* Widths (%.*s) that keep a tool's name and a token's error inside the
 * 160-byte message buffer of a call (call_state.synth) with their words. */
#define MSG_NAME_WIDTH 60
#define MSG_CAUSE_WIDTH 140

/* ------------------------------------------------------------------------ */
/* Names and results                                                        */
/* ------------------------------------------------------------------------ */

AG_EXTERN const char *ag_exec_status_name(ag_exec_status s) {
  switch (s) {
  case AG_EXEC_OK:
    return "ok";
  case AG_EXEC_ERROR:
    return "error";
  case AG_EXEC_TIMEOUT:
    return "timeout";
  case AG_EXEC_CANCELLED:
    return "cancelled";
  case AG_EXEC_DENIED:
    return "denied";
  case AG_EXEC_NOT_FOUND:
    return "not_found";
  case AG_EXEC_INVALID:
    return "invalid";
  case AG_EXEC_SKIPPED:
    return "skipped";
  }
  return "unknown";
}

AG_EXTERN void ag_exec_result_clear(ag_exec_result *r) {
  if (r == NULL)
    return;
  free(r->text);
  memset(r, 0, sizeof(*r));
}

/* ------------------------------------------------------------------------ */
/* Backoff                                                                  */
/* ------------------------------------------------------------------------ */

int64_t ag__retry_delay(const ag_config *cfg, int attempt, uint64_t *rng) {
  if (cfg == NULL)
    return 0;
  ag__backoff_kind kind;
  switch (cfg->retry.backoff) {
  case AG_BACKOFF_EXPONENTIAL:
    kind = AG__BACKOFF_EXPONENTIAL;
    break;
  case AG_BACKOFF_CONSTANT:
    kind = AG__BACKOFF_CONSTANT;
    break;
  case AG_BACKOFF_LINEAR:
  default:
    kind = AG__BACKOFF_LINEAR;
    break;
  }
  uint64_t local = 0;
  if (rng == NULL && cfg->retry.jitter)
    local = (uint64_t)ag_now_ms() ^ 0xD1B54A32D192ED03ull;
  return ag__backoff(cfg->retry.delay_ms, attempt, kind,
                     cfg->retry.max_delay_ms,
                     cfg->retry.jitter ? AG__JITTER_EQUAL : AG__JITTER_NONE,
                     rng != NULL ? rng : &local);
}

/* ------------------------------------------------------------------------ */
/* One attempt                                                              */
/* ------------------------------------------------------------------------ */

typedef struct attempt_result {
  ag_tool_status status;
  ag_cancel_reason cancel; /* for AG_TOOL_CANCELLED: the turn's reason */
} attempt_result;

static bool valid_status(int s) {
  return s == AG_TOOL_OK || s == AG_TOOL_ERROR || s == AG_TOOL_TIMEOUT ||
         s == AG_TOOL_CANCELLED;
}

/* Drops trailing whitespace from an error message kept in `o`. */
static void rtrim(ag_output *o) {
  while (o->len > 0) {
    char ch = o->buf[o->len - 1];
    if (ch != ' ' && ch != '\t' && ch != '\n' && ch != '\r' && ch != '\v' &&
        ch != '\f')
      break;
    o->len--;
  }
  if (o->buf != NULL)
    o->buf[o->len] = '\0';
}

/*
 * Settles an attempt's status from what the tool returned and what the
 * tokens say now: the turn's cancel wins over anything, except that an
 * attempt token that latched its own TIMEOUT first stays a timeout.
 */
static attempt_result settle(ag_tool_status returned, ag_cancel *tok,
                             ag_cancel *turn) {
  attempt_result ar = {returned, AG_CANCEL_NONE};
  int64_t now = ag_now_ms();
  ag_cancel_reason rt = ag_cancel_check(tok, now);
  ag_cancel_reason rturn = ag_cancel_check(turn, now);
  if (rt == AG_CANCEL_TIMEOUT && rturn != AG_CANCEL_TIMEOUT) {
    ar.status = AG_TOOL_TIMEOUT; /* our own timeout; the turn may be alive */
  } else if (rturn != AG_CANCEL_NONE) {
    ar.status = AG_TOOL_CANCELLED;
    ar.cancel = rturn;
  } else if (rt != AG_CANCEL_NONE) {
    ar.status = AG_TOOL_CANCELLED; /* not reachable: only we cancel tok */
    ar.cancel = rt;
  } else if (!valid_status((int)returned) || returned == AG_TOOL_CANCELLED) {
    /* A tool that says "cancelled" when nothing was, or returns garbage:
     * an error (with its text, or one saying what happened). */
    ar.status = AG_TOOL_ERROR;
  }
  return ar;
}

static const char *cancel_text(ag_cancel_reason r) {
  return r == AG_CANCEL_USER ? MSG_USER : MSG_DEADLINE;
}

/* `transient`: what the tool said (-1 nothing, 0 permanent, 1 transient). */
static bool retryable(const ag__tool *tool, const ag_config *cfg,
                      ag_tool_status st, int transient, const char *msg,
                      size_t msg_len) {
  if (cfg->retry.retry_on == AG_RETRY_ON_NONE)
    return false;
  if (st == AG_TOOL_TIMEOUT)
    return tool->def.idempotent;
  if (st != AG_TOOL_ERROR)
    return false;
  if (transient == 0)
    return false; /* the tool said permanent: never retried */
  if (cfg->retry.retry_on == AG_RETRY_ON_ALL || transient == 1)
    return true;
  return ag_category_transient(ag_classify(msg, msg_len));
}

/* ------------------------------------------------------------------------ */
/* The call                                                                 */
/* ------------------------------------------------------------------------ */

/* Reports one attempt to the call's on_attempt, if it has one. */
static void report(const ag__call *call, const char *name, int attempt,
                   ag_tool_status outcome, int64_t duration, int64_t retry_in,
                   const char *message, size_t message_len) {
  if (call->on_attempt == NULL)
    return;
  ag_attempt a;
  a.call_index = call->call_index;
  a.name = name;
  a.attempt = attempt;
  a.outcome = outcome;
  a.duration_ms = duration;
  a.retry_in_ms = retry_in;
  a.message = message != NULL ? message : "";
  a.message_len = message != NULL ? message_len : 0;
  call->on_attempt(call->attempt_user, &a);
}

/* out->text = prefix + body (malloc'ed). Returns AG_OK or AG_ENOMEM. */
static ag_err_t set_text(ag_exec_result *out, const char *prefix,
                         const char *body, size_t body_len) {
  size_t plen = strlen(prefix);
  if (body_len > SIZE_MAX - plen - 1)
    return AG_ENOMEM;
  char *t = malloc(plen + body_len + 1);
  if (t == NULL)
    return AG_ENOMEM;
  memcpy(t, prefix, plen);
  if (body_len > 0)
    memcpy(t + plen, body, body_len);
  t[plen + body_len] = '\0';
  free(out->text);
  out->text = t;
  out->text_len = plen + body_len;
  return AG_OK;
}

/* One call in progress: its limits, its buffers and what the last attempt
 * left. */
typedef struct call_state {
  const ag__call *call;
  const char *name; /* the tool's name, "" when it has none */
  bool subprocess;
  int max_attempts;
  int64_t timeout; /* per attempt, 0: none */
  int64_t grace;   /* SIGTERM to SIGKILL, subprocess tools */
  ag_output o, e;  /* the tool's output; e: a subprocess's stderr */
  char **envp;     /* a subprocess tool's environment */
  attempt_result last;
  /* The last failed attempt's message: in o or e, or in synth. */
  char synth[160];
  const char *mtext;
  size_t mlen;
  bool mtrunc;
  int made; /* attempts made */
} call_state;

/* Works out the call's limits and makes its buffers and environment.
 * Returns AG_OK or AG_ENOMEM (then nothing is left to free). */
static ag_err_t call_prepare(call_state *cs, const ag__call *call) {
  const ag__tool *tool = call->tool;
  const ag_config *cfg = call->cfg;
  const ag_tool_def *def = &tool->def;
  memset(cs, 0, sizeof(*cs));
  cs->call = call;
  cs->name = def->name != NULL ? def->name : "";
  int max_retries =
      def->max_retries >= 0 ? def->max_retries : cfg->retry.max_retries;
  if (max_retries < 0)
    max_retries = 0;
  cs->max_attempts = max_retries == INT_MAX ? max_retries : max_retries + 1;
  cs->timeout =
      def->timeout_ms >= 0 ? def->timeout_ms : cfg->retry.function_timeout_ms;
  if (cs->timeout < 0)
    cs->timeout = 0;
  size_t cap = def->max_output > 0 ? def->max_output : DEFAULT_MAX_OUTPUT;
  cs->grace =
      def->kill_grace_ms > 0 ? def->kill_grace_ms : DEFAULT_KILL_GRACE_MS;
  cs->subprocess = tool->argv_copy != NULL;
  cs->last = (attempt_result){AG_TOOL_OK, AG_CANCEL_NONE};
  cs->mtext = cs->synth;

  if (ag__output_init(&cs->o, cap) != AG_OK)
    return AG_ENOMEM;
  if (cs->subprocess && ag__output_init(&cs->e, cap) != AG_OK) {
    ag__output_free(&cs->o);
    return AG_ENOMEM;
  }
  /* The tool's environment, built once per call (docs/security.md). */
  if (cs->subprocess &&
      ag__env_build(def->env, def->inherit_env, &cs->envp) != AG_OK) {
    ag__output_free(&cs->o);
    ag__output_free(&cs->e);
    return AG_ENOMEM;
  }
  return AG_OK;
}

static void call_release(call_state *cs) {
  free(cs->envp);
  ag__output_free(&cs->o);
  ag__output_free(&cs->e);
}

/* The message of the attempt is synth's text. */
static void use_synth(call_state *cs) {
  cs->mtext = cs->synth;
  cs->mlen = strlen(cs->synth);
  cs->mtrunc = false;
}

/* Runs the tool once under `tok`; returns what the tool returned. */
static ag_tool_status attempt_run(call_state *cs, ag_cancel *tok) {
  const ag__call *call = cs->call;
  const ag_tool_def *def = &call->tool->def;
  ag__output_reset(&cs->o);
  if (cs->subprocess) {
    ag__output_reset(&cs->e);
    ag__proc_info info;
    memset(&info, 0, sizeof(info));
    return ag__subprocess_run_env((const char *const *)call->tool->argv_copy,
                                  &def->limits, cs->envp, cs->grace, call->args,
                                  call->args_len, tok, &cs->o, &cs->e, &info);
  }
  if (def->fn != NULL)
    return def->fn(def->user, call->parsed, tok, &cs->o);
  ag_output_printf(&cs->o, "Error: tool '%s' has no implementation", cs->name);
  ag_output_set_transient(&cs->o, false);
  return AG_TOOL_ERROR;
}

/* Points mtext at a failed attempt's message: the timeout text, the tool's
 * own message, or, when it gave none, one saying what it returned. */
static void attempt_message(call_state *cs, int returned) {
  if (cs->last.status == AG_TOOL_TIMEOUT) {
    if (cs->timeout > 0) {
      char d[32];
      ag_format_duration(cs->timeout, d, sizeof(d));
      snprintf(cs->synth, sizeof(cs->synth), "Function timed out after %s", d);
    } else {
      snprintf(cs->synth, sizeof(cs->synth), "Function timed out");
    }
    use_synth(cs);
    return;
  }
  ag_output *m = cs->subprocess ? &cs->e : &cs->o;
  rtrim(m);
  cs->mtext = m->buf;
  cs->mlen = m->len;
  cs->mtrunc = m->truncated;
  if (cs->mlen > 0)
    return;
  if (!valid_status(returned))
    snprintf(cs->synth, sizeof(cs->synth),
             "Error: tool '%.*s' returned an invalid status %d", MSG_NAME_WIDTH,
             cs->name, returned);
  else if (returned == AG_TOOL_CANCELLED)
    snprintf(cs->synth, sizeof(cs->synth),
             "Error: tool '%.*s' reported a cancellation nobody asked for",
             MSG_NAME_WIDTH, cs->name);
  else
    snprintf(cs->synth, sizeof(cs->synth),
             "Error: tool '%.*s' failed without a message", MSG_NAME_WIDTH,
             cs->name);
  cs->mtext = cs->synth;
  cs->mlen = strlen(cs->synth);
}

/* What one attempt decided. */
typedef enum { STEP_RETRY, STEP_DONE, STEP_ENOMEM } step;

/* Makes one attempt: its token, the tool, the settled outcome, its report
 * and, after a retryable failure, the backoff wait. */
static step attempt_once(call_state *cs) {
  const ag__call *call = cs->call;
  /* A turn that is already over runs nothing more. */
  ag_cancel_reason pre = ag_cancel_check(call->turn, ag_now_ms());
  if (pre != AG_CANCEL_NONE) {
    cs->last = (attempt_result){AG_TOOL_CANCELLED, pre};
    return STEP_DONE;
  }

  int64_t a0 = ag_now_ms();
  int64_t deadline = INT64_MAX;
  if (cs->timeout > 0)
    deadline = cs->timeout > INT64_MAX - a0 ? INT64_MAX : a0 + cs->timeout;
  ag_cancel *tok = NULL;
  ag_error_t cerr;
  ag_err_t crc =
      ag_cancel_new(&tok, call->turn, deadline, AG_CANCEL_TIMEOUT, &cerr);
  if (crc == AG_ENOMEM)
    return STEP_ENOMEM;
  if (crc != AG_OK) {
    /* No token, no attempt: report it as this call's error. */
    snprintf(cs->synth, sizeof(cs->synth), "Error: %.*s", MSG_CAUSE_WIDTH,
             cerr.msg);
    use_synth(cs);
    cs->last.status = AG_TOOL_ERROR;
    return STEP_DONE;
  }

  ag_tool_status st = attempt_run(cs, tok);
  int returned = (int)st;
  cs->last = settle(st, tok, call->turn);
  ag_cancel_free(tok);
  cs->made++;
  int64_t dur = ag_now_ms() - a0;

  if (cs->last.status == AG_TOOL_OK) {
    report(call, cs->name, cs->made, AG_TOOL_OK, dur, -1, "", 0);
    return STEP_DONE;
  }
  if (cs->last.status == AG_TOOL_CANCELLED) {
    const char *ct = cancel_text(cs->last.cancel);
    report(call, cs->name, cs->made, AG_TOOL_CANCELLED, dur, -1, ct,
           strlen(ct));
    return STEP_DONE;
  }

  /* An error or a timeout: its message, then whether to try again. */
  attempt_message(cs, returned);
  bool again = cs->made < cs->max_attempts &&
               retryable(call->tool, call->cfg, cs->last.status,
                         cs->o.transient, cs->mtext, cs->mlen);
  int64_t delay =
      again ? ag__retry_delay(call->cfg, cs->made - 1, call->rng) : -1;
  report(call, cs->name, cs->made, cs->last.status, dur, delay, cs->mtext,
         cs->mlen);
  if (!again)
    return STEP_DONE;
  ag_cancel_reason w = ag_cancel_wait(call->turn, delay);
  if (w != AG_CANCEL_NONE) {
    cs->last = (attempt_result){AG_TOOL_CANCELLED, w};
    return STEP_DONE;
  }
  return STEP_RETRY;
}

/* Fills `out` from the last attempt: the output on success, the cancel
 * text, or the error ("Error after N attempts: ..."). Returns AG_OK or
 * AG_ENOMEM. */
static ag_err_t call_record(call_state *cs, ag_exec_result *out) {
  out->attempts = cs->made;
  switch (cs->last.status) {
  case AG_TOOL_OK: {
    out->status = AG_EXEC_OK;
    out->ok = true;
    out->truncated = cs->o.truncated;
    size_t len = 0;
    char *t = ag__output_take(&cs->o, &len);
    if (t == NULL)
      return AG_ENOMEM;
    out->text = t;
    out->text_len = len;
    return AG_OK;
  }
  case AG_TOOL_CANCELLED: {
    out->status = AG_EXEC_CANCELLED;
    out->category =
        cs->last.cancel == AG_CANCEL_USER ? AG_CAT_UNKNOWN : AG_CAT_TIMEOUT;
    const char *t = cancel_text(cs->last.cancel);
    return set_text(out, "", t, strlen(t));
  }
  case AG_TOOL_TIMEOUT:
  case AG_TOOL_ERROR:
  default: {
    bool timed_out = cs->last.status == AG_TOOL_TIMEOUT;
    out->status = timed_out ? AG_EXEC_TIMEOUT : AG_EXEC_ERROR;
    out->category =
        timed_out ? AG_CAT_TIMEOUT : ag_classify(cs->mtext, cs->mlen);
    out->truncated = cs->mtrunc;
    char prefix[64] = "";
    if (cs->made > 1)
      snprintf(prefix, sizeof(prefix), "Error after %d attempts: ", cs->made);
    return set_text(out, prefix, cs->mtext, cs->mlen);
  }
  }
}

ag_err_t ag__exec_call(const ag__call *call, ag_exec_result *out) {
  if (out == NULL)
    return AG_EINVAL;
  memset(out, 0, sizeof(*out));
  out->category = AG_CAT_UNKNOWN;
  if (call == NULL || call->tool == NULL || call->cfg == NULL)
    return AG_EINVAL;

  int64_t t0 = ag_now_ms();
  call_state cs;
  if (call_prepare(&cs, call) != AG_OK)
    return AG_ENOMEM;
  step s;
  do
    s = attempt_once(&cs);
  while (s == STEP_RETRY);
  ag_err_t rc = s == STEP_ENOMEM ? AG_ENOMEM : call_record(&cs, out);
  out->duration_ms = ag_now_ms() - t0;
  call_release(&cs);
  if (rc != AG_OK) {
    free(out->text);
    out->text = NULL;
    out->text_len = 0;
  }
  return rc;
}
