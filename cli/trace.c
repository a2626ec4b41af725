/*
 * cli/trace.c - the spans of `agentguard run`'s turns (cli/trace.h).
 *
 * A span opens when its first event comes and is queued, as OTLP JSON,
 * when its last does; open tool spans are kept by call id (at most
 * TOOLS_OPEN at once: a reply has at most that many calls in flight). A
 * span's times are the session's start plus the events' t_ms.
 */
#define _GNU_SOURCE
#include "trace.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOOLS_OPEN 64

typedef struct span {
  bool open;
  char id[17];
  int64_t start_ms;
  json_t *attrs; /* the attributes so far (an array) */
  char name[160];
  char call_id[128]; /* execute_tool: the call */
} span;

struct cli_trace {
  ag_otlp *exp;
  char model[128], provider[32];
  char parent_trace[33], parent_span[17]; /* from TRACEPARENT, or "" */
  char conv[17];                          /* the session's id */
  int64_t start_ns;
  char trace_id[33]; /* the turn's */
  span turn, chat, tools[TOOLS_OPEN];
};

static bool hex(const char *s, size_t n) {
  bool nonzero = false;
  for (size_t i = 0; i < n; i++) {
    if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
      return false;
    nonzero = nonzero || s[i] != '0';
  }
  return nonzero;
}

cli_trace *cli_trace_new(ag_otlp *exp, const char *model, const char *provider,
                         const char *tp, int64_t start_wall_ns) {
  cli_trace *t = calloc(1, sizeof *t);
  if (t == NULL)
    return NULL;
  t->exp = exp;
  t->start_ns = start_wall_ns;
  snprintf(t->model, sizeof t->model, "%s", model != NULL ? model : "");
  /* the GenAI conventions' provider names */
  const char *k = provider != NULL ? provider : "openai";
  snprintf(t->provider, sizeof t->provider, "%s",
           strcmp(k, "anthropic") == 0 ? "anthropic"
           : strcmp(k, "gemini") == 0  ? "gcp.gemini"
                                       : "openai");
  /* W3C traceparent, version 00: 00-<32 hex>-<16 hex>-<2 hex> */
  if (tp != NULL && strlen(tp) == 55 && strncmp(tp, "00-", 3) == 0 &&
      tp[35] == '-' && tp[52] == '-' && hex(tp + 3, 32) && hex(tp + 36, 16)) {
    memcpy(t->parent_trace, tp + 3, 32);
    memcpy(t->parent_span, tp + 36, 16);
  }
  if (!ag_otlp_random_id(t->conv, 8))
    t->conv[0] = '\0';
  return t;
}

static void put_str(json_t *a, const char *k, const char *v) {
  if (a != NULL && v != NULL && v[0] != '\0')
    json_array_append_new(
        a, json_pack("{s:s, s:{s:s}}", "key", k, "value", "stringValue", v));
}

static void put_int(json_t *a, const char *k, long long v) {
  if (a != NULL)
    json_array_append_new(a, json_pack("{s:s, s:{s:I}}", "key", k, "value",
                                       "intValue", (json_int_t)v));
}

static long long ev_int(const json_t *ev, const char *k, long long dflt) {
  const json_t *v = json_object_get(ev, k);
  return json_is_integer(v) ? (long long)json_integer_value(v) : dflt;
}

static const char *ev_str(const json_t *ev, const char *k) {
  return json_string_value(json_object_get(ev, k));
}

static void open_span(span *s, const char *name, int64_t t_ms) {
  json_decref(s->attrs);
  memset(s, 0, sizeof *s);
  s->attrs = json_array();
  s->open = s->attrs != NULL && ag_otlp_random_id(s->id, 8);
  s->start_ms = t_ms;
  snprintf(s->name, sizeof s->name, "%s", name);
}

/* Queues span s (kind 1 internal, 3 client), child of `parent` (NULL: of
 * the TRACEPARENT's span, or a root), ended at t_ms; closes it. */
static void close_span(cli_trace *t, span *s, const span *parent, int kind,
                       int64_t t_ms, bool error, const char *message) {
  if (!s->open)
    return;
  s->open = false;
  char t0[24], t1[24];
  snprintf(t0, sizeof t0, "%lld",
           (long long)(t->start_ns + s->start_ms * 1000000));
  snprintf(t1, sizeof t1, "%lld",
           (long long)(t->start_ns +
                       (t_ms > s->start_ms ? t_ms : s->start_ms) * 1000000));
  json_t *st = error ? json_pack("{s:i, s:s}", "code", 2, "message",
                                 message != NULL ? message : "")
                     : json_pack("{s:i}", "code", 0);
  json_t *o = json_pack("{s:s, s:s, s:s, s:i, s:s, s:s, s:O, s:o}", "traceId",
                        t->trace_id, "spanId", s->id, "name", s->name, "kind",
                        kind, "startTimeUnixNano", t0, "endTimeUnixNano", t1,
                        "attributes", s->attrs, "status", st);
  const char *pid = parent != NULL              ? parent->id
                    : t->parent_span[0] != '\0' ? t->parent_span
                                                : NULL;
  if (o != NULL && pid != NULL)
    json_object_set_new(o, "parentSpanId", json_string(pid));
  char *text = o != NULL ? json_dumps(o, JSON_COMPACT) : NULL;
  json_decref(o);
  json_decref(s->attrs);
  s->attrs = NULL;
  ag_otlp_push(t->exp, text); /* takes it; NULL is dropped */
}

static span *tool_span(cli_trace *t, const char *call_id, bool make) {
  span *free_slot = NULL;
  for (size_t i = 0; i < TOOLS_OPEN; i++) {
    if (t->tools[i].open && call_id != NULL &&
        strcmp(t->tools[i].call_id, call_id) == 0)
      return &t->tools[i];
    if (!t->tools[i].open && free_slot == NULL)
      free_slot = &t->tools[i];
  }
  return make ? free_slot : NULL;
}

void cli_trace_event(cli_trace *t, const json_t *ev) {
  const char *name = ev_str(ev, "event");
  if (t == NULL || name == NULL)
    return;
  int64_t now = ev_int(ev, "t_ms", 0);
  char label[192];
  if (strcmp(name, "turn_start") == 0) {
    if (t->parent_trace[0] != '\0')
      memcpy(t->trace_id, t->parent_trace, sizeof t->trace_id);
    else if (!ag_otlp_random_id(t->trace_id, 16))
      return;
    open_span(&t->turn, "invoke_agent agentguard", now);
    put_str(t->turn.attrs, "gen_ai.operation.name", "invoke_agent");
    put_str(t->turn.attrs, "gen_ai.agent.name", "agentguard");
    put_str(t->turn.attrs, "gen_ai.provider.name", t->provider);
    put_str(t->turn.attrs, "gen_ai.request.model", t->model);
    put_str(t->turn.attrs, "gen_ai.conversation.id", t->conv);
    put_int(t->turn.attrs, "agentguard.turn", ev_int(ev, "turn", 0));
  } else if (!t->turn.open) {
    return; /* no turn: nothing to hang it on */
  } else if (strcmp(name, "model_request") == 0) {
    snprintf(label, sizeof label, "chat %s", t->model);
    open_span(&t->chat, label, now);
    put_str(t->chat.attrs, "gen_ai.operation.name", "chat");
    put_str(t->chat.attrs, "gen_ai.provider.name", t->provider);
    put_str(t->chat.attrs, "gen_ai.request.model", t->model);
    put_str(t->chat.attrs, "gen_ai.conversation.id", t->conv);
    put_int(t->chat.attrs, "agentguard.iteration", ev_int(ev, "iteration", 0));
  } else if (strcmp(name, "model_response") == 0) {
    const json_t *u = json_object_get(ev, "usage");
    if (u != NULL) {
      put_int(t->chat.attrs, "gen_ai.usage.input_tokens",
              ev_int(u, "prompt_tokens", 0));
      put_int(t->chat.attrs, "gen_ai.usage.output_tokens",
              ev_int(u, "completion_tokens", 0));
    }
    close_span(t, &t->chat, &t->turn, 3, now, false, NULL);
  } else if (strcmp(name, "tool_call") == 0) {
    span *s = tool_span(t, ev_str(ev, "call_id"), true);
    if (s == NULL)
      return;
    const char *tool = ev_str(ev, "name");
    snprintf(label, sizeof label, "execute_tool %s", tool ? tool : "");
    open_span(s, label, now);
    snprintf(s->call_id, sizeof s->call_id, "%s",
             ev_str(ev, "call_id") ? ev_str(ev, "call_id") : "");
    put_str(s->attrs, "gen_ai.operation.name", "execute_tool");
    put_str(s->attrs, "gen_ai.tool.name", tool);
    put_str(s->attrs, "gen_ai.tool.call.id", s->call_id);
  } else if (strcmp(name, "tool_result") == 0 ||
             strcmp(name, "tool_blocked") == 0) {
    span *s = tool_span(t, ev_str(ev, "call_id"), false);
    if (s == NULL)
      return;
    bool blocked = strcmp(name, "tool_blocked") == 0;
    bool ok = !blocked && json_is_true(json_object_get(ev, "ok"));
    const char *cat = ev_str(ev, "category");
    if (blocked)
      put_str(s->attrs, "agentguard.blocked", ev_str(ev, "reason"));
    else
      put_int(s->attrs, "agentguard.attempts", ev_int(ev, "attempts", 0));
    if (!ok)
      put_str(s->attrs, "error.type",
              blocked       ? "blocked"
              : cat != NULL ? cat
                            : "error");
    close_span(t, s, &t->turn, 1, now, !ok,
               blocked ? ev_str(ev, "reason") : cat);
  } else if (strcmp(name, "turn_end") == 0) {
    close_span(t, &t->chat, &t->turn, 3, now, true, "the turn ended first");
    for (size_t i = 0; i < TOOLS_OPEN; i++)
      close_span(t, &t->tools[i], &t->turn, 1, now, true,
                 "the turn ended first");
    const char *status = ev_str(ev, "status");
    put_str(t->turn.attrs, "agentguard.status", status);
    put_str(t->turn.attrs, "agentguard.reason", ev_str(ev, "reason"));
    put_int(t->turn.attrs, "agentguard.iterations",
            ev_int(ev, "iterations", 0));
    put_int(t->turn.attrs, "agentguard.tool_calls",
            ev_int(ev, "tool_calls", 0));
    bool failed = status != NULL && strcmp(status, "completed") != 0 &&
                  strcmp(status, "stopped") != 0 &&
                  strcmp(status, "escalated") != 0 &&
                  strcmp(status, "cancelled") != 0;
    close_span(t, &t->turn, NULL, 1, now, failed, status);
  }
}

void cli_trace_free(cli_trace *t) {
  if (t == NULL)
    return;
  json_decref(t->turn.attrs);
  json_decref(t->chat.attrs);
  for (size_t i = 0; i < TOOLS_OPEN; i++)
    json_decref(t->tools[i].attrs);
  free(t);
}
