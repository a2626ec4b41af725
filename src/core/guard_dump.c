/*
 * src/core/guard_dump.c - what the guard tells: the error context for the
 * model, the escalation record for a human, the state dump for debugging.
 * Allocates (jansson) only here and in construction.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "guard_state.h"

/* ------------------------------------------------------------------------ */
/* Error context, escalation record, dump                                   */
/* ------------------------------------------------------------------------ */

/* Appends the compact record of `e`; `o->want` counts all of it. */
static void out_compact(ag__buf *o, const ag_guard *g, const err_entry *e) {
  const char *tool = e->tool[0] ? e->tool : "none";
  size_t max = (size_t)g->cfg.errors.max_error_chars;
  char small[1];
  size_t need = ag_format_compact_error(small, sizeof(small), tool, e->cat,
                                        e->msg, e->len, max);
  if (!o->cut && o->alloc > 0 && need <= o->cap - o->len) {
    ag_format_compact_error(o->p + o->len, o->cap - o->len + 1, tool, e->cat,
                            e->msg, e->len, max);
    o->len += need;
    o->want += need;
  } else {
    /* not enough room: count it, copy what fits via a bounded format */
    char tmp[512];
    ag_format_compact_error(tmp, sizeof(tmp), tool, e->cat, e->msg, e->len,
                            max);
    size_t have = need < sizeof(tmp) ? need : sizeof(tmp) - 1;
    ag__buf_add_cut(o, tmp, have);
    o->want += need - have;
  }
}

/* Appends the unresolved errors, oldest first, with the hidden summary. */
static void out_unresolved(ag__buf *o, const ag_guard *g) {
  const err_ring *r = &g->unresolved;
  int hidden = g->unresolved_total - r->count;
  if (hidden > 0) {
    char s[96];
    snprintf(s, sizeof(s),
             "<error_summary>\n%d older errors hidden\n</error_summary>\n\n",
             hidden);
    ag__buf_addstr_cut(o, s);
  }
  for (int i = 0; i < r->count; i++) {
    if (i > 0)
      ag__buf_addstr_cut(o, "\n\n");
    out_compact(o, g, ag__guard_ring_at(r, i));
  }
}

AG_EXTERN size_t ag_guard_error_context(const ag_guard *g, ag_recover_kind kind,
                                        const char *const *tools,
                                        size_t n_tools, char *buf, size_t cap) {
  ag__buf o;
  ag__buf_init_fixed(&o, buf, cap);
  if (g->unresolved.count == 0) {
    if (kind != AG_RECOVER_NO_TOOL_CALL)
      return 0;
  }
  ag__buf_addstr_cut(
      &o, "The previous iteration failed with the following error:\n\n");
  if (g->unresolved.count > 0)
    out_unresolved(&o, g);
  else
    ag__buf_addstr_cut(&o, AG__NO_TOOL_CALL_TEXT);
  ag__buf_addstr_cut(&o,
                     "\n\nPlease analyze what went wrong and try a different "
                     "approach.");
  switch (kind) {
  case AG_RECOVER_NO_TOOL_CALL:
    ag__buf_addstr_cut(&o, " You must provide a tool call in your response.");
    break;
  case AG_RECOVER_INVALID_JSON:
    ag__buf_addstr_cut(&o,
                       " Ensure your tool call JSON is properly formatted.");
    break;
  case AG_RECOVER_UNKNOWN_TOOL:
    ag__buf_addstr_cut(&o, " Use one of the available tools: [");
    for (size_t i = 0; tools != NULL && i < n_tools; i++) {
      if (i > 0)
        ag__buf_addstr_cut(&o, ", ");
      ag__buf_addstr_cut(&o, tools[i]);
    }
    ag__buf_addstr_cut(&o, "]");
    break;
  case AG_RECOVER_EXECUTION:
  default:
    if (g->unresolved.count > 0) {
      const err_entry *e =
          ag__guard_ring_at(&g->unresolved, g->unresolved.count - 1);
      char m[AG_VERDICT_MSG_MAX];
      bool cut;
      size_t max = (size_t)g->cfg.errors.max_error_chars;
      ag__collapse_ws(m, sizeof(m), e->msg, e->len,
                      max < sizeof(m) - 4 ? max : sizeof(m) - 4, &cut);
      ag__buf_addstr_cut(&o, " The error was: ");
      ag__buf_addstr_cut(&o, m);
      if (cut)
        ag__buf_addstr_cut(&o, "...");
    }
    break;
  }
  return o.want;
}

static char *compact_dup(const ag_guard *g, const err_entry *e) {
  char one[1];
  size_t need = ag_format_compact_error(one, 1, e->tool[0] ? e->tool : "none",
                                        e->cat, e->msg, e->len,
                                        (size_t)g->cfg.errors.max_error_chars);
  char *s = malloc(need + 1);
  if (s != NULL)
    ag_format_compact_error(s, need + 1, e->tool[0] ? e->tool : "none", e->cat,
                            e->msg, e->len,
                            (size_t)g->cfg.errors.max_error_chars);
  return s;
}

static ag_err_t dump_json(json_t *root, char **out, ag_error_t *err,
                          size_t flags) {
  if (root == NULL)
    return ag__set_error(err, AG_ENOMEM, -1, "out of memory");
  *out = json_dumps(root, flags);
  json_decref(root);
  if (*out == NULL)
    return ag__set_error(err, AG_ENOMEM, -1, "out of memory");
  return AG_OK;
}

/* jansson owns its allocations; hand the caller memory ag_free can free. */
/* jansson owns its allocations; hand the caller memory ag_free can free,
 * with credentials ("Bearer ...", "sk-...") redacted: error texts in the
 * dump and the escalation record come from tools, which may echo them (the
 * core reads no environment, so secret values by name are the caller's to
 * redact, as the agent's events do). */
static ag_err_t to_malloc(char **out, ag_error_t *err) {
  size_t n = strlen(*out);
  size_t cap = ag__redact_bound(n);
  char *m = malloc(cap);
  if (m == NULL) {
    free(*out);
    *out = NULL;
    return ag__set_error(err, AG_ENOMEM, -1, "out of memory");
  }
  ag__redact(*out, n, NULL, 0, m, cap);
  free(*out);
  *out = m;
  return AG_OK;
}

/* The error history, or NULL when out of memory (never a shorter one). */
static json_t *history_json(const ag_guard *g, bool compact) {
  json_t *arr = json_array();
  for (int i = 0; arr != NULL && i < g->history.count; i++) {
    const err_entry *e = ag__guard_ring_at(&g->history, i);
    json_t *v;
    if (compact) {
      char *s = compact_dup(g, e);
      v = s != NULL ? json_string(s) : NULL;
      free(s);
    } else {
      v = json_pack("{s:s, s:s, s:i, s:s%}", "tool", e->tool, "category",
                    ag_category_name(e->cat), "iteration", e->iteration,
                    "message", e->msg, e->len);
    }
    if (json_array_append_new(arr, v) != 0) {
      json_decref(arr);
      return NULL;
    }
  }
  return arr;
}

AG_EXTERN ag_err_t ag_guard_escalation_record(const ag_guard *g,
                                              const ag_verdict *v, char **out,
                                              ag_error_t *err) {
  *out = NULL;
  char reason[AG_TOOL_NAME_MAX + 64];
  const char *tool = v != NULL && v->tool[0] ? v->tool : "the tools";
  ag_reason r = v != NULL ? v->reason : g->last_trip;
  if (r == AG_REASON_IDENTICAL_CALLS || r == AG_REASON_CYCLIC_CALLS)
    snprintf(reason, sizeof(reason), "Repeated calls to %s", tool);
  else if (r == AG_REASON_MAX_CALLS_PER_TURN)
    snprintf(reason, sizeof(reason), "Too many tool calls in one turn");
  else
    snprintf(reason, sizeof(reason), "Too many errors with %s", tool);
  json_t *last = json_null();
  if (g->history.count > 0) {
    const err_entry *e = ag__guard_ring_at(&g->history, g->history.count - 1);
    json_decref(last);
    last = json_stringn(e->msg, e->len);
  }
  json_t *root =
      json_pack("{s:s, s:s, s:o, s:o}", "status", "escalated", "reason", reason,
                "last_error", last, "error_history", history_json(g, true));
  ag_err_t rc = dump_json(root, out, err, JSON_COMPACT | JSON_PRESERVE_ORDER);
  return rc == AG_OK ? to_malloc(out, err) : rc;
}

AG_EXTERN ag_err_t ag_guard_dump(const ag_guard *g, char **out,
                                 ag_error_t *err) {
  *out = NULL;
  bool ok = true; /* every element made: a dump is whole or not given */
  json_t *tools = json_array();
  for (int i = 0; tools != NULL && i < g->opts.max_tools; i++) {
    const tool_state *t = &g->tools[i];
    if (!t->used)
      continue;
    char hex[65] = "";
    if (t->has_sig)
      ag_sig_hex(t->sig, hex);
    ok &=
        json_array_append_new(
            tools, json_pack("{s:s, s:s?, s:i, s:i, s:i, s:i}", "name", t->name,
                             "last_signature", t->has_sig ? hex : NULL,
                             "identical_run", t->run, "run_iteration",
                             t->run_iter, "consecutive_failures", t->failures,
                             "unresolved_errors", t->unresolved)) == 0;
  }
  json_t *ring = json_array();
  uint64_t have =
      g->cyc_n < (uint64_t)g->cyc_len ? g->cyc_n : (uint64_t)g->cyc_len;
  for (uint64_t k = 0; ring != NULL && g->cyc_len > 0 && k < have; k++) {
    int idx = (int)((g->cyc_n - have + k) % (uint64_t)g->cyc_len);
    char hex[65];
    ag_sig_hex(g->cyc_sig[idx], hex);
    ok &= json_array_append_new(ring, g->cyc_valid[idx] ? json_string(hex)
                                                        : json_null()) == 0;
  }
  json_t *runs = json_object();
  for (int p = 1; runs != NULL && p <= g->cyc_len; p++) {
    char k[16];
    snprintf(k, sizeof(k), "%d", p);
    ok &= json_object_set_new(runs, k, json_integer(g->cyc_run[p])) == 0;
  }
  int repeated_max = 0;
  for (int k = 0; k < REPEAT_SLOTS; k++)
    if (g->repeat[k].count > repeated_max)
      repeated_max = g->repeat[k].count;
  char ident_hex[65] = "";
  if (g->ident_run > 0)
    ag_sig_hex(g->ident_key, ident_hex);
  json_t *unres = json_array();
  for (int i = 0; unres != NULL && i < g->unresolved.count; i++) {
    const err_entry *e = ag__guard_ring_at(&g->unresolved, i);
    ok &= json_array_append_new(unres,
                                json_pack("{s:s, s:s, s:s%}", "tool", e->tool,
                                          "category", ag_category_name(e->cat),
                                          "message", e->msg, e->len)) == 0;
  }
  json_t *root = json_pack(
      "{s:s, s:i, s:i, s:I, s:I, s:i, s:i, s:o, s:{s:I, s:o, s:o}, "
      "s:{s:i, s:s, s:i, s:i, s:i, s:s, s:o, s:i, s:o}, s:o, s:s, s:i, "
      "s:{s:i, s:i, s:i, s:i}, s:I}",
      "preset", g->cfg.preset, "turn", g->turn, "iteration", g->iteration,
      "turn_start_ms", (json_int_t)g->turn_start, "deadline_ms",
      (json_int_t)(g->deadline == INT64_MAX ? -1 : g->deadline),
      "calls_in_turn", g->calls_in_turn, "tools_tracked",
      (int)json_array_size(tools), "tools", tools, "cycle", "calls",
      (json_int_t)g->cyc_n, "recent_signatures", ring, "runs_by_period", runs,
      "errors", "identical_run", g->ident_run, "identical_key", ident_hex,
      "consecutive_failing_iterations", g->failing_iters, "total",
      g->total_errors, "pattern_run", g->pattern_run, "pattern_category",
      ag_category_name(g->pattern_cat), "history", history_json(g, false),
      "unresolved_total", g->unresolved_total, "unresolved", unres, "nudged",
      json_boolean(g->nudged), "last_trip", ag_reason_name(g->last_trip),
      "trips", g->trips, "replies", "refused_run", g->refused_run, "denied_run",
      g->denied_run, "empty_run", g->empty_run, "repeated_max", repeated_max,
      "tokens", (json_int_t)g->tokens);
  if (!ok) {
    json_decref(root);
    root = NULL;
  }
  ag_err_t rc = dump_json(root, out, err, JSON_INDENT(2) | JSON_SORT_KEYS);
  return rc == AG_OK ? to_malloc(out, err) : rc;
}
