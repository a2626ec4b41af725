/*
 * src/agent/events.c - the event stream of DESIGN.md section 5: one JSON
 * object per event, each with "event", "turn", "iteration" and "t_ms" (ms
 * since the agent was created) in front of the event's own fields.
 *
 * Threading. Events come from the thread running the turn and, for
 * tool_attempt, from the scheduler's pool threads. One mutex per agent
 * serialises the callback, so on_event is never called concurrently, and
 * guards the position (turn, iteration) stamped on each event. The object
 * is built outside the lock and only stamped and delivered inside it.
 *
 * Memory. An event is built, handed over borrowed, and freed: nothing is
 * kept. With no callback nothing is built at all.
 *
 * Text. Tool output need not be UTF-8 (a subprocess can print anything) and
 * jansson refuses invalid UTF-8, so every text goes through ag__json_text,
 * which replaces invalid bytes with U+FFFD. The same helper builds the
 * history's messages in history.c.
 *
 * Secrets. Every text of every event is passed through ag__redact
 * (docs/security.md#secrets) with the values of the secret-named
 * environment variables as they were when the agent was created, copied
 * here; a text with nothing to hide costs one scan and no copy.
 *
 * Rejected: formatting JSON Lines here (the sink is the caller's: the CLI
 * writes lines, an embedding application may keep objects); a queue drained
 * by the loop thread (tool_attempt events would arrive late, after the
 * batch, and the queue would need a cap).
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

extern char **environ;

/* Most bytes of secret values kept for redaction. */
#define SECRET_BYTES_MAX (256 * 1024)

/* Copies the secret values of the environment into ev (bounded). */
static ag_err_t snapshot_secrets(ag__events *ev) {
  ag__secret found[AG__SECRETS_MAX];
  size_t n = ag__secrets_from_env(environ, found, AG__SECRETS_MAX);
  size_t bytes = 0, keep = 0;
  while (keep < n && found[keep].len <= SECRET_BYTES_MAX - bytes)
    bytes += found[keep++].len;
  if (keep == 0)
    return AG_OK;
  ev->secret_buf = malloc(bytes);
  if (ev->secret_buf == NULL)
    return AG_ENOMEM;
  char *p = ev->secret_buf;
  for (size_t i = 0; i < keep; i++) {
    memcpy(p, found[i].s, found[i].len);
    ev->secrets[i].s = p;
    ev->secrets[i].len = found[i].len;
    p += found[i].len;
  }
  ev->n_secrets = keep;
  return AG_OK;
}

ag_err_t ag__ev_init(ag__events *ev, ag_event_fn fn, void *user) {
  memset(ev, 0, sizeof(*ev));
  if (snapshot_secrets(ev) != AG_OK)
    return AG_ENOMEM;
  if (pthread_mutex_init(&ev->mu, NULL) != 0) {
    free(ev->secret_buf);
    ev->secret_buf = NULL;
    return AG_ENOMEM;
  }
  ev->fn = fn;
  ev->user = user;
  ev->t0 = ag_now_ms();
  return AG_OK;
}

void ag__ev_destroy(ag__events *ev) {
  pthread_mutex_destroy(&ev->mu);
  free(ev->secret_buf);
  ev->secret_buf = NULL;
  ev->n_secrets = 0;
}

bool ag__ev_on(const ag__events *ev) {
  return ev->fn != NULL;
}

void ag__ev_position(ag__events *ev, int turn, int iteration) {
  pthread_mutex_lock(&ev->mu);
  ev->turn = turn;
  ev->iteration = iteration;
  pthread_mutex_unlock(&ev->mu);
}

/* ------------------------------------------------------------------------ */
/* Text                                                                     */
/* ------------------------------------------------------------------------ */

json_t *ag__json_text(const char *text, size_t len) {
  if (text == NULL)
    return json_null();
  const unsigned char *s = (const unsigned char *)text;
  size_t i = 0;
  while (i < len) {
    size_t k = ag__utf8_seq(s + i, len - i);
    if (k == 0)
      break;
    i += k;
  }
  if (i == len)
    return json_stringn(text, len);

  /* Worst case every byte becomes the 3-byte U+FFFD. */
  if (len > (SIZE_MAX - 1) / 3)
    return NULL;
  char *buf = malloc(len * 3 + 1);
  if (buf == NULL)
    return NULL;
  size_t o = 0;
  memcpy(buf, text, i);
  o = i;
  while (i < len) {
    size_t k = ag__utf8_seq(s + i, len - i);
    if (k == 0) {
      memcpy(buf + o, "\xEF\xBF\xBD", 3);
      o += 3;
      i++;
    } else {
      memcpy(buf + o, s + i, k);
      o += k;
      i += k;
    }
  }
  json_t *j = json_stringn(buf, o);
  free(buf);
  return j;
}

/* An event's text: credentials redacted (src/core/redact.c), then made
 * valid UTF-8. */
static json_t *rtext(const ag__events *ev, const char *s, size_t len) {
  if (s == NULL)
    return json_null();
  if (!ag__redact_needed(s, len, ev->secrets, ev->n_secrets))
    return ag__json_text(s, len);
  size_t cap = ag__redact_bound(len);
  char *buf = malloc(cap);
  if (buf == NULL)
    return NULL;
  size_t n = ag__redact(s, len, ev->secrets, ev->n_secrets, buf, cap);
  json_t *j = ag__json_text(buf, n < cap ? n : cap - 1);
  free(buf);
  return j;
}

static json_t *text0(const ag__events *ev, const char *s) {
  return rtext(ev, s, s != NULL ? strlen(s) : 0);
}

/* ------------------------------------------------------------------------ */
/* Emission                                                                 */
/* ------------------------------------------------------------------------ */

/* Counts an event that could not be built whole (out of memory). */
static void lost(ag__events *ev) {
  pthread_mutex_lock(&ev->mu);
  ev->lost++;
  pthread_mutex_unlock(&ev->mu);
}

void ag__ev_emit(ag__events *ev, const char *name, json_t *fields) {
  if (ev->fn == NULL) {
    json_decref(fields);
    return;
  }
  json_t *e = json_object();
  if (e == NULL) {
    json_decref(fields);
    lost(ev);
    return;
  }
  /* The common fields go first, so a line reads "event" first. An event
   * that cannot have them all (out of memory) is not delivered but counted
   * (turn_end's events_lost). */
  bool ok = json_object_set_new(e, "event", json_string(name)) == 0;
  pthread_mutex_lock(&ev->mu);
  ok =
      ok && json_object_set_new(e, "turn", json_integer(ev->turn)) == 0 &&
      json_object_set_new(e, "iteration", json_integer(ev->iteration)) == 0 &&
      json_object_set_new(e, "t_ms", json_integer(ag_now_ms() - ev->t0)) == 0 &&
      (fields == NULL || json_object_update(e, fields) == 0);
  if (ok)
    ev->fn(ev->user, e);
  else
    ev->lost++;
  pthread_mutex_unlock(&ev->mu);
  json_decref(fields);
  json_decref(e);
}

/*
 * An event's own fields while they are built: `ok` turns false at the first
 * field that could not be made or set (out of memory), and such an event is
 * never delivered with a field missing (a reader would take the missing
 * field for a fact): fields_emit counts it as lost instead.
 */
typedef struct fields {
  json_t *o;
  bool ok;
} fields;

static fields fields_new(void) {
  fields f;
  f.o = json_object();
  f.ok = f.o != NULL;
  return f;
}

/* Sets `k` to `v` (steals `v`; NULL is a failure). */
static void put(fields *f, const char *k, json_t *v) {
  if (!f->ok) {
    json_decref(v);
    return;
  }
  /* json_object_set_new releases v when it fails */
  if (v == NULL || json_object_set_new(f->o, k, v) != 0)
    f->ok = false;
}

static void fields_emit(ag__events *ev, const char *name, fields f) {
  if (!f.ok) {
    json_decref(f.o);
    lost(ev);
    return;
  }
  ag__ev_emit(ev, name, f.o);
}

/* ------------------------------------------------------------------------ */
/* One builder per event                                                    */
/* ------------------------------------------------------------------------ */

void ag__ev_turn_start(ag__events *ev, const char *user) {
  if (ev->fn == NULL)
    return;
  fields f = fields_new();
  put(&f, "user", text0(ev, user));
  fields_emit(ev, "turn_start", f);
}

/* A copy of `v` with every string redacted (full model_request events), or
 * NULL when out of memory. */
static json_t *redact_tree(const ag__events *ev, const json_t *v) {
  if (json_is_string(v))
    return rtext(ev, json_string_value(v), json_string_length(v));
  if (json_is_array(v)) {
    json_t *a = json_array();
    for (size_t i = 0; a != NULL && i < json_array_size(v); i++)
      if (json_array_append_new(a, redact_tree(ev, json_array_get(v, i))) !=
          0) {
        json_decref(a);
        return NULL;
      }
    return a;
  }
  if (json_is_object(v)) {
    json_t *o = json_object();
    const char *k;
    json_t *x;
    json_object_foreach((json_t *)v, k, x) {
      if (o != NULL && json_object_set_new(o, k, redact_tree(ev, x)) != 0) {
        json_decref(o);
        return NULL;
      }
    }
    return o;
  }
  return json_deep_copy(v);
}

/* An array of the names, redacted, or NULL when out of memory. */
static json_t *names_array(const ag__events *ev, const char *const *names,
                           size_t n) {
  json_t *a = json_array();
  for (size_t i = 0; a != NULL && i < n; i++)
    if (json_array_append_new(a, text0(ev, names[i])) != 0) {
      json_decref(a);
      return NULL;
    }
  return a;
}

void ag__ev_model_request(ag__events *ev, const char *messages_json,
                          size_t messages_len, size_t n_messages,
                          const char *const *tools, size_t n_tools,
                          bool error_context, size_t history_bytes, bool full) {
  if (ev->fn == NULL)
    return;
  json_t *msgs;
  if (full) {
    /* a debugging option: the tree is built from the text for the event */
    json_t *tree =
        json_loadb(messages_json, messages_len, JSON_ALLOW_NUL, NULL);
    msgs = tree != NULL ? redact_tree(ev, tree) : NULL;
    json_decref(tree);
  } else {
    msgs = json_integer((json_int_t)n_messages);
  }
  fields f = fields_new();
  put(&f, "messages", msgs);
  put(&f, "history_bytes", json_integer((json_int_t)history_bytes));
  put(&f, "error_context", json_boolean(error_context));
  put(&f, "tools", names_array(ev, tools, n_tools));
  fields_emit(ev, "model_request", f);
}

void ag__ev_provider_retry(ag__events *ev, int attempt, int status,
                           const char *message, int64_t delay_ms) {
  if (ev->fn == NULL)
    return;
  fields f = fields_new();
  put(&f, "attempt", json_integer(attempt));
  put(&f, "status", json_integer(status));
  put(&f, "message", text0(ev, message));
  put(&f, "delay_ms", json_integer(delay_ms));
  fields_emit(ev, "provider_retry", f);
}

/* One call of a model_response event, or NULL when out of memory. */
static json_t *call_object(const ag__events *ev, const ag_tool_call *c) {
  fields o = fields_new();
  put(&o, "id", text0(ev, c->id));
  put(&o, "name", text0(ev, c->name != NULL ? c->name : ""));
  put(&o, "arguments",
      rtext(ev, c->arguments != NULL ? c->arguments : "",
            c->arguments != NULL ? c->arguments_len : 0));
  if (o.ok)
    return o.o;
  json_decref(o.o);
  return NULL;
}

void ag__ev_model_response(ag__events *ev, const ag_reply *r) {
  if (ev->fn == NULL)
    return;
  fields f = fields_new();
  put(&f, "text", text0(ev, r->text));
  json_t *calls = json_array();
  for (size_t i = 0; calls != NULL && i < r->n_calls; i++)
    if (json_array_append_new(calls, call_object(ev, &r->calls[i])) != 0) {
      json_decref(calls);
      calls = NULL;
    }
  put(&f, "tool_calls", calls);
  if (r->has_usage)
    put(&f, "usage",
        json_pack("{s:I, s:I, s:I}", "prompt_tokens",
                  (json_int_t)r->usage.prompt_tokens, "completion_tokens",
                  (json_int_t)r->usage.completion_tokens, "cached_tokens",
                  (json_int_t)r->usage.cached_tokens));
  fields_emit(ev, "model_response", f);
}

void ag__ev_tool_call(ag__events *ev, const char *call_id, const char *name,
                      const char *args, size_t args_len, const uint8_t *sig) {
  if (ev->fn == NULL)
    return;
  fields f = fields_new();
  put(&f, "call_id", text0(ev, call_id));
  put(&f, "name", text0(ev, name));
  put(&f, "arguments",
      rtext(ev, args != NULL ? args : "", args != NULL ? args_len : 0));
  if (sig != NULL) {
    char hex[65];
    ag_sig_hex(sig, hex);
    put(&f, "signature", json_string(hex));
  } else {
    put(&f, "signature", json_null());
  }
  fields_emit(ev, "tool_call", f);
}

void ag__ev_approval(ag__events *ev, const char *call_id, const char *name,
                     bool approved) {
  if (ev->fn == NULL)
    return;
  fields f = fields_new();
  put(&f, "call_id", text0(ev, call_id));
  put(&f, "name", text0(ev, name));
  put(&f, "approved", json_boolean(approved));
  fields_emit(ev, "approval", f);
}

void ag__ev_tool_blocked(ag__events *ev, const char *call_id, const char *name,
                         const char *reason) {
  if (ev->fn == NULL)
    return;
  fields f = fields_new();
  put(&f, "call_id", text0(ev, call_id));
  put(&f, "name", text0(ev, name));
  put(&f, "reason", text0(ev, reason));
  fields_emit(ev, "tool_blocked", f);
}

/* The turn's status names (agent.h) live beside the events that write
 * them, so that the events never call back into the loop. */
AG_EXTERN const char *ag_turn_status_name(ag_turn_status s) {
  switch (s) {
  case AG_TURN_COMPLETED:
    return "completed";
  case AG_TURN_STOPPED:
    return "stopped";
  case AG_TURN_ESCALATED:
    return "escalated";
  case AG_TURN_TIMED_OUT:
    return "timed_out";
  case AG_TURN_CANCELLED:
    return "cancelled";
  case AG_TURN_FAILED:
    return "failed";
  }
  return "unknown";
}

static const char *tool_status_name(ag_tool_status s) {
  switch (s) {
  case AG_TOOL_OK:
    return "ok";
  case AG_TOOL_ERROR:
    return "error";
  case AG_TOOL_TIMEOUT:
    return "timeout";
  case AG_TOOL_CANCELLED:
    return "cancelled";
  }
  return "error";
}

void ag__ev_tool_attempt(ag__events *ev, const char *call_id,
                         const ag_attempt *at) {
  if (ev->fn == NULL)
    return;
  fields f = fields_new();
  put(&f, "call_id", text0(ev, call_id));
  put(&f, "name", text0(ev, at->name));
  put(&f, "attempt", json_integer(at->attempt));
  put(&f, "outcome", json_string(tool_status_name(at->outcome)));
  /* With its length: a tool's stderr may hold NUL bytes, and this text
   * must read the same as the tool_result's. */
  put(&f, "message",
      at->message != NULL ? rtext(ev, at->message, at->message_len)
                          : json_string(""));
  put(&f, "retry_in_ms",
      at->retry_in_ms >= 0 ? json_integer(at->retry_in_ms) : json_null());
  fields_emit(ev, "tool_attempt", f);
}

void ag__ev_tool_result(ag__events *ev, const char *call_id, const char *name,
                        bool ok, int attempts, const char *category,
                        const char *text, size_t text_len) {
  if (ev->fn == NULL)
    return;
  fields f = fields_new();
  put(&f, "call_id", text0(ev, call_id));
  put(&f, "name", text0(ev, name));
  put(&f, "ok", json_boolean(ok));
  put(&f, "attempts", json_integer(attempts));
  put(&f, "category", category != NULL ? json_string(category) : json_null());
  put(&f, "text",
      rtext(ev, text != NULL ? text : "", text != NULL ? text_len : 0));
  fields_emit(ev, "tool_result", f);
}

void ag__ev_error_context(ag__events *ev, const char *text) {
  if (ev->fn == NULL)
    return;
  fields f = fields_new();
  put(&f, "text", text0(ev, text));
  fields_emit(ev, "error_context", f);
}

void ag__ev_nudge(ag__events *ev, const char *reason, const char *text) {
  if (ev->fn == NULL)
    return;
  fields f = fields_new();
  put(&f, "reason", text0(ev, reason));
  put(&f, "text", text0(ev, text));
  fields_emit(ev, "nudge", f);
}

void ag__ev_warning(ag__events *ev, const char *message) {
  if (ev->fn == NULL)
    return;
  fields f = fields_new();
  put(&f, "message", text0(ev, message));
  fields_emit(ev, "warning", f);
}

/* The escalation record redacted as text first ("[REDACTED]" is valid
 * inside a JSON string), then parsed; JSON null for no record; NULL when
 * out of memory. */
static json_t *record_value(const ag__events *ev, const char *record) {
  if (record == NULL)
    return json_null();
  size_t rl = strlen(record);
  size_t cap = ag__redact_bound(rl);
  char *red = malloc(cap);
  if (red == NULL)
    return NULL;
  ag__redact(record, rl, ev->secrets, ev->n_secrets, red, cap);
  json_t *rec = json_loads(red, 0, NULL);
  free(red);
  return rec;
}

void ag__ev_escalation(ag__events *ev, const char *record) {
  if (ev->fn == NULL)
    return;
  fields f = fields_new();
  put(&f, "record", record_value(ev, record));
  fields_emit(ev, "escalation", f);
}

void ag__ev_human(ag__events *ev, const char *action, const char *message) {
  if (ev->fn == NULL)
    return;
  fields f = fields_new();
  put(&f, "action", text0(ev, action));
  put(&f, "message", text0(ev, message != NULL ? message : ""));
  fields_emit(ev, "human", f);
}

void ag__ev_turn_end(ag__events *ev, const ag_turn_outcome *o) {
  if (ev->fn == NULL)
    return;
  fields f = fields_new();
  put(&f, "status", json_string(ag_turn_status_name(o->status)));
  put(&f, "reason", text0(ev, o->reason));
  put(&f, "message", text0(ev, o->message));
  put(&f, "iterations", json_integer(o->iterations));
  put(&f, "tool_calls", json_integer(o->tool_calls));
  put(&f, "tokens", json_integer((json_int_t)o->tokens));
  put(&f, "final_text", text0(ev, o->final_text));
  /* Events of this turn that could not be built (out of memory) and so
   * were not delivered; present only when there were any. */
  pthread_mutex_lock(&ev->mu);
  unsigned long n_lost = ev->lost;
  ev->lost = 0;
  pthread_mutex_unlock(&ev->mu);
  if (n_lost > 0)
    put(&f, "events_lost", json_integer((json_int_t)n_lost));
  fields_emit(ev, "turn_end", f);
}
