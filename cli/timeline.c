/*
 * cli/timeline.c - the human-readable timeline of `agentguard simulate`.
 *
 * It is written purely from the event stream (the same JSON objects that
 * --events writes), so what people see and what tools read can never tell
 * different stories. One line per thing that happened, in this shape:
 *
 *      TIME  #ITER model → tool {args}            a model reply
 *      TIME        ✓ tool: result                 a tool result
 *      TIME        ↻ / ? / ■ / ⚠ / ↳ ...          retries, approvals, guard
 *      TIME  ■ stopped · reason · counts          the turn's outcome
 *
 * State is tiny (the current turn and iteration, and whether the model
 * reply already listed its calls), so events of any length cost nothing to
 * keep. Every text is cut to one line of bounded length: a tool that prints
 * a megabyte shows as one line. Colours (ANSI) only when asked for.
 *
 * Rejected: printing tool_call events as their own lines when the reply
 * already listed them (doubles every line of the common case), and
 * buffering a whole iteration to lay it out (a hanging tool would show
 * nothing until it ended; here each line appears as it happens).
 */
#include "timeline.h"

#include <stdlib.h>
#include <string.h>

struct cli_timeline {
  FILE *out;
  bool color;
  long long turn;
  long long iteration;
  bool calls_shown; /* the model_response line listed this reply's calls */
  bool any_turn;
  bool omit_final; /* cli_timeline_omit_final_text */
};

#define C_RESET "\x1b[0m"
#define C_BOLD "\x1b[1m"
#define C_DIM "\x1b[2m"
#define C_RED "\x1b[31m"
#define C_GREEN "\x1b[32m"
#define C_YELLOW "\x1b[33m"
#define C_BLUE "\x1b[34m"
#define C_MAGENTA "\x1b[35m"
#define C_CYAN "\x1b[36m"

#define W_ARGS 60
#define W_TEXT 90
#define W_MSG 160

cli_timeline *cli_timeline_new(FILE *out, bool color) {
  cli_timeline *t = calloc(1, sizeof *t);
  if (t == NULL)
    return NULL;
  t->out = out;
  t->color = color;
  return t;
}

void cli_timeline_omit_final_text(cli_timeline *t, bool omit) {
  if (t != NULL)
    t->omit_final = omit;
}

void cli_timeline_free(cli_timeline *t) {
  free(t);
}

void cli_put_oneline(FILE *out, const char *s, size_t len, size_t max) {
  size_t keep = len;
  if (len > max)
    keep = ag_utf8_truncate(s, len, max);
  for (size_t i = 0; i < keep; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == '\n' || c == '\r' || c == '\t')
      fputc(' ', out);
    else if (c < 0x20 || c == 0x7f)
      fputc('?', out);
    else
      fputc(c, out);
  }
  if (keep < len)
    fputs("...", out);
}

static void put_str(FILE *out, const char *s, size_t max) {
  cli_put_oneline(out, s, strlen(s), max);
}

static void on(cli_timeline *t, const char *code) {
  if (t->color)
    fputs(code, t->out);
}

static void off(cli_timeline *t) {
  if (t->color)
    fputs(C_RESET, t->out);
}

static const char *get_str(const json_t *ev, const char *key) {
  return json_string_value(json_object_get(ev, key));
}

static long long get_int(const json_t *ev, const char *key, long long dflt) {
  json_t *v = json_object_get(ev, key);
  if (json_is_integer(v))
    return (long long)json_integer_value(v);
  if (json_is_real(v))
    return (long long)json_real_value(v);
  return dflt;
}

/* Any value as one line: strings as themselves, the rest as compact JSON. */
static void put_value(FILE *out, const json_t *v, size_t max) {
  if (v == NULL)
    return;
  if (json_is_string(v)) {
    cli_put_oneline(out, json_string_value(v), json_string_length(v), max);
    return;
  }
  char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
  if (s != NULL) {
    put_str(out, s, max);
    free(s);
  }
}

/* "  12ms  " - the time column, then `indent` spaces. */
static void lead(cli_timeline *t, const json_t *ev, int indent) {
  long long ms = get_int(ev, "t_ms", -1);
  on(t, C_DIM);
  if (ms < 0)
    fprintf(t->out, "%7s", "");
  else if (ms < 100000)
    fprintf(t->out, "%5lldms", ms);
  else
    fprintf(t->out, "%6.1fs", (double)ms / 1000.0);
  off(t);
  fprintf(t->out, "  %*s", indent, "");
}

#define SUB 5 /* indent of lines under an iteration */

/* One call as  name {args} . */
static void put_call(cli_timeline *t, const json_t *call) {
  const char *name = get_str(call, "name");
  on(t, C_BOLD);
  put_str(t->out, name ? name : "?", 64);
  off(t);
  json_t *args = json_object_get(call, "arguments");
  if (args != NULL) {
    fputc(' ', t->out);
    put_value(t->out, args, W_ARGS);
  }
}

static void model_response(cli_timeline *t, const json_t *ev) {
  const char *text = get_str(ev, "text");
  json_t *calls = json_object_get(ev, "tool_calls");
  size_t n = json_is_array(calls) ? json_array_size(calls) : 0;
  lead(t, ev, 0);
  on(t, C_CYAN);
  fprintf(t->out, "#%lld model", t->iteration);
  off(t);
  if (text != NULL && text[0] != '\0') {
    fputs(": \"", t->out);
    put_str(t->out, text, W_TEXT);
    fputc('"', t->out);
  }
  if (n > 0) {
    fputs(" → ", t->out);
    if (n <= 3) {
      for (size_t i = 0; i < n; i++) {
        if (i)
          fputs(", ", t->out);
        put_call(t, json_array_get(calls, i));
      }
    } else {
      /* Many calls: count them per tool name, in order of appearance. */
      fprintf(t->out, "%zu calls:", n);
      size_t shown = 0;
      for (size_t i = 0; i < n && shown < 6; i++) {
        const char *name = get_str(json_array_get(calls, i), "name");
        if (name == NULL)
          continue;
        bool seen = false;
        for (size_t j = 0; j < i && !seen; j++) {
          const char *o = get_str(json_array_get(calls, j), "name");
          seen = o != NULL && strcmp(o, name) == 0;
        }
        if (seen)
          continue;
        size_t count = 0;
        for (size_t j = i; j < n; j++) {
          const char *o = get_str(json_array_get(calls, j), "name");
          count += o != NULL && strcmp(o, name) == 0;
        }
        fputc(' ', t->out);
        put_str(t->out, name, 64);
        if (count > 1)
          fprintf(t->out, " ×%zu", count);
        shown++;
      }
    }
    t->calls_shown = true;
  } else if (text == NULL || text[0] == '\0') {
    fputs(": (empty reply)", t->out);
  }
  json_t *usage = json_object_get(ev, "usage");
  if (json_is_object(usage))
    fprintf(t->out, "  [%lld+%lld tokens]", get_int(usage, "prompt_tokens", 0),
            get_int(usage, "completion_tokens", 0));
  fputc('\n', t->out);
}

static void tool_call(cli_timeline *t, const json_t *ev) {
  if (t->calls_shown)
    return;
  lead(t, ev, SUB);
  fputs("→ ", t->out);
  put_call(t, ev);
  fputc('\n', t->out);
}

static void tool_attempt(cli_timeline *t, const json_t *ev) {
  long long retry_in = get_int(ev, "retry_in_ms", -1);
  const char *outcome = get_str(ev, "outcome");
  if (retry_in < 0 || outcome == NULL || strcmp(outcome, "ok") == 0)
    return; /* the tool_result line tells the rest */
  const char *name = get_str(ev, "name");
  const char *msg = get_str(ev, "message");
  lead(t, ev, SUB);
  on(t, C_YELLOW);
  fputs("↻ ", t->out);
  off(t);
  put_str(t->out, name ? name : "?", 64);
  fprintf(t->out, " attempt %lld ", get_int(ev, "attempt", 0));
  if (strcmp(outcome, "timeout") == 0)
    fputs("timed out", t->out);
  else
    fputs("failed", t->out);
  if (msg != NULL && msg[0] != '\0') {
    fputs(": ", t->out);
    put_str(t->out, msg, W_TEXT);
  }
  fprintf(t->out, " - retry in %lldms\n", retry_in);
}

static void tool_result(cli_timeline *t, const json_t *ev) {
  bool ok = json_is_true(json_object_get(ev, "ok"));
  const char *name = get_str(ev, "name");
  long long attempts = get_int(ev, "attempts", 0);
  lead(t, ev, SUB);
  on(t, ok ? C_GREEN : C_RED);
  fputs(ok ? "✓ " : "✗ ", t->out);
  off(t);
  put_str(t->out, name ? name : "?", 64);
  fputs(": ", t->out);
  put_value(t->out, json_object_get(ev, "text"), W_TEXT);
  const char *cat = get_str(ev, "category");
  if (!ok && cat != NULL) {
    on(t, C_DIM);
    fprintf(t->out, " [%s]", cat);
    off(t);
  }
  if (attempts > 1) {
    on(t, C_DIM);
    fprintf(t->out, " (%lld attempts)", attempts);
    off(t);
  }
  fputc('\n', t->out);
}

static void approval(cli_timeline *t, const json_t *ev) {
  bool yes = json_is_true(json_object_get(ev, "approved"));
  const char *name = get_str(ev, "name");
  lead(t, ev, SUB);
  on(t, C_MAGENTA);
  fputs("? ", t->out);
  off(t);
  put_str(t->out, name ? name : "?", 64);
  fputs(" needs approval: ", t->out);
  on(t, yes ? C_GREEN : C_RED);
  fputs(yes ? "approved" : "denied", t->out);
  off(t);
  fputc('\n', t->out);
}

static void tool_blocked(cli_timeline *t, const json_t *ev) {
  const char *name = get_str(ev, "name");
  const char *reason = get_str(ev, "reason");
  lead(t, ev, SUB);
  on(t, C_RED);
  fputs("■ guard blocked ", t->out);
  off(t);
  put_str(t->out, name ? name : "?", 64);
  if (reason != NULL) {
    fputs(": ", t->out);
    put_str(t->out, reason, W_MSG);
  }
  fputc('\n', t->out);
}

static void error_context(cli_timeline *t, const json_t *ev) {
  const char *text = get_str(ev, "text");
  if (text == NULL)
    return;
  /* The instruction is the last non-blank line; the errors are above. */
  size_t n = strlen(text);
  while (n > 0 && (text[n - 1] == '\n' || text[n - 1] == ' '))
    n--;
  size_t start = n;
  while (start > 0 && text[start - 1] != '\n')
    start--;
  int errors = 0;
  for (const char *p = text; (p = strstr(p, "<error>")) != NULL; p += 7)
    errors++;
  lead(t, ev, SUB);
  on(t, C_BLUE);
  fputs("↳ error context for the next request", t->out);
  off(t);
  if (errors > 0)
    fprintf(t->out, " (%d error%s)", errors, errors == 1 ? "" : "s");
  fputs(": ", t->out);
  cli_put_oneline(t->out, text + start, n - start, W_MSG);
  fputc('\n', t->out);
}

static void nudge(cli_timeline *t, const json_t *ev) {
  const char *reason = get_str(ev, "reason");
  const char *text = get_str(ev, "text");
  lead(t, ev, SUB);
  on(t, C_YELLOW);
  fprintf(t->out, "⚠ nudge");
  off(t);
  if (reason != NULL) {
    fputs(" (", t->out);
    put_str(t->out, reason, 40);
    fputc(')', t->out);
  }
  if (text != NULL) {
    fputs(": ", t->out);
    put_str(t->out, text, W_MSG);
  }
  fputc('\n', t->out);
}

static void warning(cli_timeline *t, const json_t *ev) {
  const char *msg = get_str(ev, "message");
  lead(t, ev, SUB);
  on(t, C_YELLOW);
  fputs("warning: ", t->out);
  off(t);
  put_str(t->out, msg ? msg : "", W_MSG);
  fputc('\n', t->out);
}

static void escalation(cli_timeline *t, const json_t *ev) {
  json_t *rec = json_object_get(ev, "record");
  json_t *parsed = NULL;
  if (json_is_string(rec)) {
    parsed = json_loads(json_string_value(rec), 0, NULL);
    if (json_is_object(parsed))
      rec = parsed;
  }
  lead(t, ev, SUB);
  on(t, C_MAGENTA);
  fputs("⇪ escalated to a human", t->out);
  off(t);
  if (json_is_object(rec)) {
    const char *reason = get_str(rec, "reason");
    json_t *last = json_object_get(rec, "last_error");
    if (reason != NULL) {
      fputs(": ", t->out);
      put_str(t->out, reason, W_MSG);
    }
    if (last != NULL) {
      fputs("; last error: ", t->out);
      put_value(t->out, last, W_TEXT);
    }
  } else if (rec != NULL) {
    fputs(": ", t->out);
    put_value(t->out, rec, W_MSG);
  }
  fputc('\n', t->out);
  json_decref(parsed);
}

static void human(cli_timeline *t, const json_t *ev) {
  const char *action = get_str(ev, "action");
  const char *msg = get_str(ev, "message");
  lead(t, ev, SUB);
  on(t, C_MAGENTA);
  fputs("☞ human: ", t->out);
  off(t);
  put_str(t->out, action ? action : "?", 32);
  if (msg != NULL && msg[0] != '\0') {
    fputs(" - \"", t->out);
    put_str(t->out, msg, W_MSG);
    fputc('"', t->out);
  }
  fputc('\n', t->out);
}

static void provider_retry(cli_timeline *t, const json_t *ev) {
  const char *msg = get_str(ev, "message");
  long long status = get_int(ev, "status", 0);
  lead(t, ev, SUB);
  on(t, C_YELLOW);
  fputs("↻ ", t->out);
  off(t);
  fputs("model request failed", t->out);
  if (status > 0)
    fprintf(t->out, " (%lld)", status);
  if (msg != NULL && msg[0] != '\0') {
    fputs(": ", t->out);
    put_str(t->out, msg, W_TEXT);
  }
  fprintf(t->out, " - retry %lld in %lldms\n", get_int(ev, "attempt", 0),
          get_int(ev, "delay_ms", 0));
}

static const char *status_color(const char *status) {
  if (strcmp(status, "completed") == 0)
    return C_GREEN;
  if (strcmp(status, "escalated") == 0 || strcmp(status, "timed_out") == 0 ||
      strcmp(status, "cancelled") == 0)
    return C_YELLOW;
  return C_RED;
}

static const char *status_mark(const char *status) {
  if (strcmp(status, "completed") == 0)
    return "✓";
  if (strcmp(status, "failed") == 0)
    return "✗";
  return "■";
}

static void turn_end(cli_timeline *t, const json_t *ev) {
  const char *status = get_str(ev, "status");
  const char *reason = get_str(ev, "reason");
  const char *msg = get_str(ev, "message");
  const char *final = get_str(ev, "final_text");
  if (status == NULL)
    status = "?";
  long long it = get_int(ev, "iterations", -1);
  long long calls = get_int(ev, "tool_calls", -1);
  lead(t, ev, 0);
  on(t, C_BOLD);
  on(t, status_color(status));
  fprintf(t->out, "%s %s", status_mark(status), status);
  off(t);
  if (reason != NULL)
    fprintf(t->out, " · %s", reason);
  if (it >= 0)
    fprintf(t->out, " · %lld iteration%s", it, it == 1 ? "" : "s");
  if (calls >= 0)
    fprintf(t->out, " · %lld tool call%s", calls, calls == 1 ? "" : "s");
  long long tokens = get_int(ev, "tokens", 0);
  if (tokens > 0)
    fprintf(t->out, " · %lld tokens", tokens);
  fputc('\n', t->out);
  if (msg != NULL && msg[0] != '\0') {
    lead(t, NULL, 2);
    put_str(t->out, msg, 2 * W_MSG);
    fputc('\n', t->out);
  }
  if (final != NULL && final[0] != '\0' && !t->omit_final) {
    lead(t, NULL, 2);
    fputs("final text: \"", t->out);
    put_str(t->out, final, 2 * W_MSG);
    fputs("\"\n", t->out);
  }
}

static void turn_start(cli_timeline *t, const json_t *ev) {
  const char *user = get_str(ev, "user");
  if (t->any_turn)
    fputc('\n', t->out);
  t->any_turn = true;
  on(t, C_BOLD);
  fprintf(t->out, "── turn %lld ", t->turn);
  off(t);
  if (user != NULL) {
    fputs("user: \"", t->out);
    put_str(t->out, user, W_MSG);
    fputc('"', t->out);
  }
  fputc('\n', t->out);
}

void cli_timeline_event(cli_timeline *t, const json_t *ev) {
  const char *name = get_str(ev, "event");
  if (t == NULL || name == NULL)
    return;
  t->turn = get_int(ev, "turn", t->turn);
  long long it = get_int(ev, "iteration", t->iteration);
  if (it != t->iteration)
    t->calls_shown = false;
  t->iteration = it;

  if (strcmp(name, "turn_start") == 0)
    turn_start(t, ev);
  else if (strcmp(name, "model_request") == 0)
    t->calls_shown = false;
  else if (strcmp(name, "model_response") == 0)
    model_response(t, ev);
  else if (strcmp(name, "tool_call") == 0)
    tool_call(t, ev);
  else if (strcmp(name, "tool_attempt") == 0)
    tool_attempt(t, ev);
  else if (strcmp(name, "tool_result") == 0)
    tool_result(t, ev);
  else if (strcmp(name, "approval") == 0)
    approval(t, ev);
  else if (strcmp(name, "tool_blocked") == 0)
    tool_blocked(t, ev);
  else if (strcmp(name, "error_context") == 0)
    error_context(t, ev);
  else if (strcmp(name, "nudge") == 0)
    nudge(t, ev);
  else if (strcmp(name, "warning") == 0)
    warning(t, ev);
  else if (strcmp(name, "escalation") == 0)
    escalation(t, ev);
  else if (strcmp(name, "human") == 0)
    human(t, ev);
  else if (strcmp(name, "provider_retry") == 0)
    provider_retry(t, ev);
  else if (strcmp(name, "turn_end") == 0)
    turn_end(t, ev);
  fflush(t->out);
}

void cli_timeline_header(cli_timeline *t, const char *file, const char *preset,
                         const char *description) {
  on(t, C_BOLD);
  fputs("▶ ", t->out);
  put_str(t->out, file, 200);
  off(t);
  if (preset != NULL && preset[0] != '\0') {
    fputs(" (preset ", t->out);
    put_str(t->out, preset, 64);
    fputc(')', t->out);
  }
  fputc('\n', t->out);
  if (description != NULL) {
    /* Greedy wrap at 78 columns (bytes; close enough for prose), indented,
     * at most 12 lines. */
    const char *p = description;
    int lines = 0;
    on(t, C_DIM);
    while (*p != '\0' && lines < 12) {
      while (*p == ' ' || *p == '\n')
        p++;
      size_t n = strlen(p), take = n;
      if (n > 76) {
        take = 76;
        while (take > 0 && p[take] != ' ')
          take--;
        if (take == 0)
          take = ag_utf8_truncate(p, n, 76);
      }
      fputs("  ", t->out);
      cli_put_oneline(t->out, p, take, take);
      fputc('\n', t->out);
      p += take;
      lines++;
    }
    off(t);
  }
  fflush(t->out);
}

void cli_outcome_line(FILE *out, size_t turn, const ag_turn_outcome *o,
                      const json_t *turn_end) {
  /* The texts come from the turn_end event when there is one: events are
   * redacted (docs/security.md#secrets), the outcome is not. */
  const char *message = o->message;
  const char *final_text = o->final_text;
  if (turn_end != NULL) {
    const json_t *m = json_object_get(turn_end, "message");
    const json_t *f = json_object_get(turn_end, "final_text");
    message = json_is_string(m) ? json_string_value(m) : "";
    final_text = json_is_string(f) ? json_string_value(f) : NULL;
  }
  fprintf(out, "turn %zu: %s (%s) after %d iteration%s, %d tool call%s", turn,
          ag_turn_status_name(o->status), o->reason, o->iterations,
          o->iterations == 1 ? "" : "s", o->tool_calls,
          o->tool_calls == 1 ? "" : "s");
  if (message[0] != '\0') {
    fputs(": ", out);
    put_str(out, message, 2 * W_MSG);
  }
  fputc('\n', out);
  if (final_text != NULL && final_text[0] != '\0') {
    fputs("  final text: \"", out);
    put_str(out, final_text, 2 * W_MSG);
    fputs("\"\n", out);
  }
  fflush(out);
}
