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

static void report(ag_attempt_fn cb, void *user, int call_index,
                   const char *name, int attempt, ag_tool_status outcome,
                   int64_t duration, int64_t retry_in, const char *message,
                   size_t message_len) {
  if (cb == NULL)
    return;
  ag_attempt a;
  a.call_index = call_index;
  a.name = name;
  a.attempt = attempt;
  a.outcome = outcome;
  a.duration_ms = duration;
  a.retry_in_ms = retry_in;
  a.message = message != NULL ? message : "";
  a.message_len = message != NULL ? message_len : 0;
  cb(user, &a);
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

ag_err_t ag__exec_call(const ag__tool *tool, const ag_config *cfg,
                       const char *args, size_t args_len, const json_t *parsed,
                       ag_cancel *turn, int call_index,
                       ag_attempt_fn on_attempt, void *attempt_user,
                       uint64_t *rng, ag_exec_result *out) {
  if (out == NULL)
    return AG_EINVAL;
  memset(out, 0, sizeof(*out));
  out->category = AG_CAT_UNKNOWN;
  if (tool == NULL || cfg == NULL)
    return AG_EINVAL;

  const ag_tool_def *def = &tool->def;
  const char *name = def->name != NULL ? def->name : "";
  int64_t t0 = ag_now_ms();
  int max_retries =
      def->max_retries >= 0 ? def->max_retries : cfg->retry.max_retries;
  if (max_retries < 0)
    max_retries = 0;
  int max_attempts = max_retries == INT_MAX ? max_retries : max_retries + 1;
  int64_t timeout =
      def->timeout_ms >= 0 ? def->timeout_ms : cfg->retry.function_timeout_ms;
  if (timeout < 0)
    timeout = 0;
  size_t cap = def->max_output > 0 ? def->max_output : DEFAULT_MAX_OUTPUT;
  int64_t grace =
      def->kill_grace_ms > 0 ? def->kill_grace_ms : DEFAULT_KILL_GRACE_MS;
  bool subprocess = tool->argv_copy != NULL;

  ag_output o, e;
  memset(&e, 0, sizeof(e));
  if (ag__output_init(&o, cap) != AG_OK)
    return AG_ENOMEM;
  if (subprocess && ag__output_init(&e, cap) != AG_OK) {
    ag__output_free(&o);
    return AG_ENOMEM;
  }

  /* The tool's environment, built once per call (docs/security.md). */
  char **envp = NULL;
  if (subprocess && ag__env_build(def->env, def->inherit_env, &envp) != AG_OK) {
    ag__output_free(&o);
    ag__output_free(&e);
    return AG_ENOMEM;
  }

  ag_err_t rc = AG_OK;
  attempt_result last = {AG_TOOL_OK, AG_CANCEL_NONE};
  /* The last failed attempt's message: in o or e, or in synth. */
  char synth[160] = "";
  const char *mtext = synth;
  size_t mlen = 0;
  bool mtrunc = false;
  int made = 0;

  for (;;) {
    /* A turn that is already over runs nothing more. */
    ag_cancel_reason pre = ag_cancel_check(turn, ag_now_ms());
    if (pre != AG_CANCEL_NONE) {
      last.status = AG_TOOL_CANCELLED;
      last.cancel = pre;
      break;
    }

    int64_t a0 = ag_now_ms();
    int64_t deadline = INT64_MAX;
    if (timeout > 0)
      deadline = timeout > INT64_MAX - a0 ? INT64_MAX : a0 + timeout;
    ag_cancel *tok = NULL;
    ag_error_t cerr;
    ag_err_t crc =
        ag_cancel_new(&tok, turn, deadline, AG_CANCEL_TIMEOUT, &cerr);
    if (crc == AG_ENOMEM) {
      rc = AG_ENOMEM;
      break;
    }
    if (crc != AG_OK) {
      /* No token, no attempt: report it as this call's error. */
      snprintf(synth, sizeof(synth), "Error: %.140s", cerr.msg);
      mtext = synth;
      mlen = strlen(synth);
      mtrunc = false;
      last.status = AG_TOOL_ERROR;
      break;
    }

    ag__output_reset(&o);
    ag_tool_status st;
    if (subprocess) {
      ag__output_reset(&e);
      ag__proc_info info;
      memset(&info, 0, sizeof(info));
      st = ag__subprocess_run_env((const char *const *)tool->argv_copy,
                                  &def->limits, envp, grace, args, args_len,
                                  tok, &o, &e, &info);
    } else if (def->fn != NULL) {
      st = def->fn(def->user, parsed, tok, &o);
    } else {
      ag_output_printf(&o, "Error: tool '%s' has no implementation", name);
      ag_output_set_transient(&o, false);
      st = AG_TOOL_ERROR;
    }
    int returned = (int)st;
    last = settle(st, tok, turn);
    ag_cancel_free(tok);
    made++;
    int64_t dur = ag_now_ms() - a0;

    if (last.status == AG_TOOL_OK) {
      report(on_attempt, attempt_user, call_index, name, made, AG_TOOL_OK, dur,
             -1, "", 0);
      break;
    }
    if (last.status == AG_TOOL_CANCELLED) {
      const char *ct = cancel_text(last.cancel);
      report(on_attempt, attempt_user, call_index, name, made,
             AG_TOOL_CANCELLED, dur, -1, ct, strlen(ct));
      break;
    }

    /* An error or a timeout: its message, then whether to try again. */
    if (last.status == AG_TOOL_TIMEOUT) {
      if (timeout > 0) {
        char d[32];
        ag_format_duration(timeout, d, sizeof(d));
        snprintf(synth, sizeof(synth), "Function timed out after %s", d);
      } else {
        snprintf(synth, sizeof(synth), "Function timed out");
      }
      mtext = synth;
      mlen = strlen(synth);
      mtrunc = false;
    } else {
      ag_output *m = subprocess ? &e : &o;
      rtrim(m);
      mtext = m->buf;
      mlen = m->len;
      mtrunc = m->truncated;
      if (mlen == 0) {
        if (!valid_status(returned))
          snprintf(synth, sizeof(synth),
                   "Error: tool '%.60s' returned an invalid status %d", name,
                   returned);
        else if (returned == AG_TOOL_CANCELLED)
          snprintf(synth, sizeof(synth),
                   "Error: tool '%.60s' reported a cancellation nobody asked "
                   "for",
                   name);
        else
          snprintf(synth, sizeof(synth),
                   "Error: tool '%.60s' failed without a message", name);
        mtext = synth;
        mlen = strlen(synth);
      }
    }
    bool again = made < max_attempts &&
                 retryable(tool, cfg, last.status, o.transient, mtext, mlen);
    int64_t delay = again ? ag__retry_delay(cfg, made - 1, rng) : -1;
    report(on_attempt, attempt_user, call_index, name, made, last.status, dur,
           delay, mtext, mlen);
    if (!again)
      break;
    ag_cancel_reason w = ag_cancel_wait(turn, delay);
    if (w != AG_CANCEL_NONE) {
      last.status = AG_TOOL_CANCELLED;
      last.cancel = w;
      break;
    }
  }

  if (rc == AG_OK) {
    out->attempts = made;
    switch (last.status) {
    case AG_TOOL_OK: {
      out->status = AG_EXEC_OK;
      out->ok = true;
      out->truncated = o.truncated;
      size_t len = 0;
      char *t = ag__output_take(&o, &len);
      if (t == NULL) {
        rc = AG_ENOMEM;
        break;
      }
      out->text = t;
      out->text_len = len;
      break;
    }
    case AG_TOOL_CANCELLED: {
      out->status = AG_EXEC_CANCELLED;
      out->category =
          last.cancel == AG_CANCEL_USER ? AG_CAT_UNKNOWN : AG_CAT_TIMEOUT;
      const char *t = cancel_text(last.cancel);
      rc = set_text(out, "", t, strlen(t));
      break;
    }
    case AG_TOOL_TIMEOUT:
    case AG_TOOL_ERROR:
    default: {
      bool timed_out = last.status == AG_TOOL_TIMEOUT;
      out->status = timed_out ? AG_EXEC_TIMEOUT : AG_EXEC_ERROR;
      out->category = timed_out ? AG_CAT_TIMEOUT : ag_classify(mtext, mlen);
      out->truncated = mtrunc;
      char prefix[64] = "";
      if (made > 1)
        snprintf(prefix, sizeof(prefix), "Error after %d attempts: ", made);
      rc = set_text(out, prefix, mtext, mlen);
      break;
    }
    }
  }
  out->duration_ms = ag_now_ms() - t0;
  free(envp);
  ag__output_free(&o);
  ag__output_free(&e);
  if (rc != AG_OK) {
    free(out->text);
    out->text = NULL;
    out->text_len = 0;
  }
  return rc;
}
