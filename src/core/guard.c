/*
 * src/core/guard.c - the guard: every detector and counter of DESIGN.md
 * section 3 that is not execution. This file: the state's construction,
 * the turn, mechanism 1 and the helpers the parts share (guard_state.h).
 *
 * Design. A guard is one session's decision state. The caller drives it with
 * four calls per iteration: begin_iteration (mechanism 1 and the deadline),
 * check_calls (2, 3, 4 before anything runs), record_results (3 in
 * call_and_result scope, 5-9 after the results) and, at a new user message,
 * begin_turn (everything resets; nothing trips across turns).
 *
 * Data structures, all sized in ag_guard_new and never grown:
 *   - tools[max_tools]: per tool name, the identical-call run (last
 *     signature, run length, iteration of the last call, last result digest)
 *     and the per-tool error counters. Looked up by a 64-bit FNV-1a of the
 *     name plus its stored prefix; when full, the least recently used entry
 *     is forgotten (more than max_tools distinct names in one turn).
 *   - the cycle detector: the last cycle_max_length signatures and, for each
 *     period p, how many positions in a row satisfy s[i] == s[i-p]. A block
 *     of p calls repeated N times back to back is exactly run[p] >= p*(N-1);
 *     blocks made of one repeated call are left to mechanism 3.
 *   - errors: the identical-error run (a SHA-256 of tool and collapsed
 *     message), the category run of the pattern detector, the ring of the
 *     last error_history errors (escalation record, dump), and the ring of
 *     the last max_errors_in_context unresolved errors (error context) with a
 *     count of the unresolved ones no longer held.
 * Trips during record_results are noted per mechanism as they happen; the
 * lowest-numbered mechanism decides the reason (DESIGN.md: "checks run in
 * the order of this table").
 *
 * Threading: none. Allocation: only in ag_guard_new and in the JSON
 * producing functions (escalation record, dump), never on the check path.
 * Rejected: keying breaker state by signature alone (HPD's single "last
 * signature") - it misses SpamFunction in parallel batches that also hold
 * other calls; counting per tool without the iteration window - it stops
 * edit/test/edit/test work (DESIGN.md "Breaker state").
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "guard_state.h"

/* ------------------------------------------------------------------------ */
/* Names                                                                    */
/* ------------------------------------------------------------------------ */

static const char *const reason_names[] = {
#define X(id, name) name,
    AG_REASON_MAP(X)
#undef X
};

AG_EXTERN const char *ag_reason_name(ag_reason reason) {
  if ((int)reason < 0 || reason >= AG_REASON__COUNT)
    return "unknown";
  return reason_names[reason];
}

bool ag__mechanism_on(const ag_config *c, ag_reason r) {
  switch (r) {
#define X(id, k1, k2)                                                          \
  case AG_REASON_##id:                                                         \
    return c->k1 > 0 || c->k2 > 0;
    AG__MECHANISMS(X)
#undef X
  default:
    return false;
  }
}

void ag__mechanism_off(ag_config *c, ag_reason r) {
  switch (r) {
#define X(id, k1, k2)                                                          \
  case AG_REASON_##id:                                                         \
    c->k1 = 0;                                                                 \
    c->k2 = 0;                                                                 \
    break;
    AG__MECHANISMS(X)
#undef X
  default:
    break;
  }
}

AG_EXTERN void ag_guard_opts_init(ag_guard_opts *opts) {
  memset(opts, 0, sizeof(*opts));
  opts->max_args_bytes = 1u << 20;
  opts->max_args_tokens = 65536;
  opts->max_depth = 64;
  opts->max_tools = 64;
  opts->max_batch = 256;
}

/* ------------------------------------------------------------------------ */
/* Construction                                                             */
/* ------------------------------------------------------------------------ */

/* The entries and their messages in one block (entries first, then cap
 * messages of msg_cap bytes): two allocations per ring were 1 + cap. */
static ag_err_t ring_init(err_ring *r, int cap, size_t msg_cap) {
  r->cap = cap;
  r->count = r->head = 0;
  size_t head = (size_t)cap * sizeof(*r->e);
  if (msg_cap != 0 && (size_t)cap > (SIZE_MAX - head) / msg_cap)
    return AG_ENOMEM;
  r->e = malloc(head + (size_t)cap * msg_cap);
  if (r->e == NULL)
    return AG_ENOMEM;
  memset(r->e, 0, head);
  char *msgs = (char *)r->e + head;
  for (int i = 0; i < cap; i++)
    r->e[i].msg = msgs + (size_t)i * msg_cap;
  return AG_OK;
}

static void ring_free(err_ring *r) {
  free(r->e); /* the messages too (ring_init) */
  r->e = NULL;
}

err_entry *ag__guard_ring_at(const err_ring *r, int i) {
  return &r->e[(r->head + i) % r->cap];
}

AG_EXTERN ag_err_t ag_guard_new(ag_guard **out, const ag_config *cfg,
                                const ag_guard_opts *opts, ag_error_t *err) {
  ag_err_t rc;
  if (out == NULL)
    return ag__set_error(err, AG_EINVAL, -1, "ag_guard_new: out is NULL");
  *out = NULL;
  if (cfg == NULL)
    return ag__set_error(err, AG_EINVAL, -1, "ag_guard_new: config is NULL");
  if ((rc = ag_config_validate(cfg, err)) != AG_OK)
    return rc;
  ag_guard_opts o;
  if (opts != NULL)
    o = *opts;
  else
    ag_guard_opts_init(&o);
  if (o.max_args_bytes == 0 || o.max_args_tokens == 0 || o.max_depth < 1 ||
      o.max_tools < 1 || o.max_batch < 1)
    return ag__set_error(err, AG_EINVAL, -1,
                         "ag_guard_new: every guard option must be positive");

  ag_guard *g = calloc(1, sizeof(*g));
  if (g == NULL)
    return ag__set_error(err, AG_ENOMEM, -1, "ag_guard_new: out of memory");
  g->cfg = *cfg;
  g->opts = o;
  /* A stored message keeps a few bytes past max_error_chars so that
   * formatting it later cuts (and marks) exactly as the full text would. */
  g->msg_cap = (size_t)cfg->errors.max_error_chars + 8;

  rc = ag__jcs_new(&g->jcs, o.max_args_bytes, o.max_args_tokens, o.max_depth,
                   err);
  if (rc != AG_OK)
    goto fail;
  rc = ag__sha256_new(&g->sha);
  if (rc != AG_OK) {
    rc = ag__set_error(err, rc, -1,
                       rc == AG_ENOMEM ? "ag_guard_new: out of memory"
                                       : "ag_guard_new: SHA-256 unavailable");
    goto fail;
  }
  g->tools = calloc((size_t)o.max_tools, sizeof(*g->tools));
  if (g->tools == NULL ||
      ring_init(&g->history, cfg->errors.error_history, g->msg_cap) != AG_OK ||
      ring_init(&g->unresolved, cfg->errors.max_errors_in_context,
                g->msg_cap) != AG_OK) {
    rc = ag__set_error(err, AG_ENOMEM, -1, "ag_guard_new: out of memory");
    goto fail;
  }
  g->cyc_len = cfg->loop.cycle_max_length;
  ag_guard_begin_turn(g, 0);
  g->turn = 0;
  *out = g;
  return AG_OK;
fail:
  ag_guard_free(g);
  return rc;
}

AG_EXTERN void ag_guard_free(ag_guard *g) {
  if (g == NULL)
    return;
  ag__jcs_free(g->jcs);
  ag__sha256_free(g->sha);
  ag_content_loop_free(g->content);
  free(g->tools);
  ring_free(&g->history);
  ring_free(&g->unresolved);
  free(g);
}

void ag__guard_renew(ag_guard *g) {
  ag_guard_begin_turn(g, 0);
  g->turn = 0;
  ag_content_loop_free(g->content);
  g->content = NULL;
  ag__jcs_trim(g->jcs);
}

AG_EXTERN const ag_config *ag_guard_config(const ag_guard *g) {
  return &g->cfg;
}

AG_EXTERN int64_t ag_guard_deadline(const ag_guard *g) {
  return g->deadline;
}

AG_EXTERN void ag_guard_begin_turn(ag_guard *g, int64_t now_ms) {
  g->turn++;
  g->turn_start = now_ms;
  g->deadline = g->cfg.loop.max_turn_duration_ms > 0
                    ? now_ms + g->cfg.loop.max_turn_duration_ms
                    : INT64_MAX;
  g->iteration = 0;
  g->calls_in_turn = 0;
  g->stamp = 0;
  /* tools past n_tools were never used: zero since the guard was made */
  memset(g->tools, 0, (size_t)g->n_tools * sizeof(*g->tools));
  g->n_tools = 0;
  g->cyc_n = 0;
  memset(g->cyc_valid, 0, sizeof(g->cyc_valid));
  memset(g->cyc_run, 0, sizeof(g->cyc_run));
  g->ident_run = 0;
  g->failing_iters = 0;
  g->total_errors = 0;
  g->pattern_run = 0;
  g->pattern_cat = AG_CAT_UNKNOWN;
  g->refused_run = g->denied_run = g->empty_run = 0;
  g->tokens = 0;
  marks_empty(&g->repeat_taken, g->repeat, sizeof(g->repeat),
              sizeof(g->repeat[0]));
  g->novel = 0;
  g->repeat_clock = 0;
  g->world = 0;
  g->n_changing = 0;
  g->changing_all = false;
  marks_empty(&g->oks_taken, g->oks, sizeof(g->oks), sizeof(g->oks[0]));
  g->ok_clock = 0;
  g->hold_armed = false;
  g->nudged = false;
  g->last_trip = AG_REASON_NONE;
  g->trips = 0;
  g->history.count = g->history.head = 0;
  g->unresolved.count = g->unresolved.head = 0;
  g->unresolved_total = 0;
}

/* ------------------------------------------------------------------------ */
/* Helpers                                                                  */
/* ------------------------------------------------------------------------ */

static uint64_t fnv1a(const char *s, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) {
    h ^= (unsigned char)s[i];
    h *= 1099511628211ull;
  }
  return h;
}

void ag__guard_verdict_reset(ag_verdict *v) {
  v->action = AG_ALLOW;
  v->reason = AG_REASON_NONE;
  v->call_index = -1;
  v->tool[0] = '\0';
  v->message[0] = '\0';
  v->warning[0] = '\0';
  v->suggestion = NULL;
}

/* The index of tool `name` in tools[0..n_tools), or -1. */
static int tool_index(const ag_guard *g, const char *name, size_t n,
                      uint64_t h) {
  size_t keep = n < AG_TOOL_NAME_MAX - 1 ? n : AG_TOOL_NAME_MAX - 1;
  for (int i = 0; i < g->n_tools; i++) {
    const tool_state *t = &g->tools[i];
    if (t->name_hash == h && t->name_len == n &&
        memcmp(t->name, name, keep) == 0)
      return i;
  }
  return -1;
}

/* Finds or creates the state of tool `name` (never fails: when the table is
 * full, the least recently used entry is forgotten and reused). */
tool_state *ag__guard_tool_get(ag_guard *g, const char *name) {
  size_t n = strlen(name);
  uint64_t h = fnv1a(name, n);
  int i = tool_index(g, name, n, h);
  if (i >= 0) {
    g->tools[i].last_used = ++g->stamp;
    return &g->tools[i];
  }
  tool_state *t;
  if (g->n_tools < g->opts.max_tools) {
    t = &g->tools[g->n_tools++];
  } else {
    t = &g->tools[0];
    for (int k = 1; k < g->n_tools; k++)
      if (g->tools[k].last_used < t->last_used)
        t = &g->tools[k];
  }
  size_t keep = n < AG_TOOL_NAME_MAX - 1 ? n : AG_TOOL_NAME_MAX - 1;
  memset(t, 0, sizeof(*t));
  t->used = true;
  t->name_hash = h;
  t->name_len = n;
  memcpy(t->name, name, keep);
  t->name[keep] = '\0';
  t->last_used = ++g->stamp;
  return t;
}

/* SHA-256 of `name` NUL `text`, exactly. */
void ag__guard_digest_text(ag_guard *g, const char *name, const char *text,
                           size_t len, uint8_t out[AG_SIG_LEN]) {
  ag__sha256_init(g->sha);
  ag__sha256_update(g->sha, name, strlen(name) + 1);
  ag__sha256_update(g->sha, text, len);
  if (!ag__sha256_final(g->sha, out))
    memset(out, 0, AG_SIG_LEN); /* cannot happen with OpenSSL's SHA-256 */
}

static bool is_digit(unsigned char c) {
  return c >= '0' && c <= '9';
}

static bool is_hex(unsigned char c) {
  return is_digit(c) || ((c | 0x20) >= 'a' && (c | 0x20) <= 'f');
}

static bool is_alnum(unsigned char c) {
  return is_digit(c) || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z');
}

static bool is_space(unsigned char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' ||
         c == '\v';
}

/* The end of a volatile token at text[i] (a number, a hex address or id, a
 * temporary path), or i when there is none. */
static size_t volatile_end(const char *text, size_t len, size_t i) {
  const unsigned char *t = (const unsigned char *)text;
  if (t[i] == '/' && len - i > 5 && memcmp(t + i, "/tmp/", 5) == 0) {
    size_t j = i + 5;
    while (j < len && !is_space(t[j]) && t[j] != '\'' && t[j] != '"' &&
           t[j] != ':' && t[j] != ',' && t[j] != ')')
      j++;
    return j;
  }
  if (t[i] == '0' && i + 2 < len && (t[i + 1] | 0x20) == 'x' &&
      is_hex(t[i + 2])) {
    size_t j = i + 2;
    while (j < len && is_hex(t[j]))
      j++;
    return j;
  }
  if (is_hex(t[i]) && (i == 0 || !is_alnum(t[i - 1]))) {
    size_t j = i;
    bool digit = false;
    while (j < len && is_hex(t[j]))
      digit |= is_digit(t[j++]);
    if (j - i >= 8 && digit && (j == len || !is_alnum(t[j])))
      return j; /* a hash, an address, a uuid part */
  }
  if (is_digit(t[i])) {
    size_t j = i;
    while (j < len && (is_digit(t[j]) ||
                       (t[j] == '.' && j + 1 < len && is_digit(t[j + 1]))))
      j++;
    return j;
  }
  return i;
}

/*
 * SHA-256 of `name` NUL, `pre` (pre_len bytes; may be NULL) and `text` with
 * whitespace runs collapsed and, with errors.normalize_errors, numbers, hex
 * addresses, long hex ids and temporary paths each replaced by '#'. Two
 * error messages that differ only in a line number, a process id, an
 * address, a timestamp or a temporary file name are then the same error
 * (mechanisms 5 and 16).
 */
void ag__guard_digest_norm(ag_guard *g, const char *name, const uint8_t *pre,
                           size_t pre_len, const char *text, size_t len,
                           uint8_t out[AG_SIG_LEN]) {
  const bool volatiles = g->cfg.errors.normalize_errors;
  char buf[1024];
  size_t used = 0;
  bool pending_space = false, started = false;
  ag__sha256_init(g->sha);
  ag__sha256_update(g->sha, name, strlen(name) + 1);
  if (pre != NULL)
    ag__sha256_update(g->sha, pre, pre_len);
  for (size_t i = 0; i < len;) {
    unsigned char c = (unsigned char)text[i];
    if (is_space(c)) {
      pending_space = started;
      i++;
      continue;
    }
    if (used + 2 > sizeof(buf)) {
      ag__sha256_update(g->sha, buf, used);
      used = 0;
    }
    if (pending_space)
      buf[used++] = ' ';
    pending_space = false;
    started = true;
    size_t j = volatiles ? volatile_end(text, len, i) : i;
    if (j > i) {
      buf[used++] = '#';
      i = j;
    } else {
      buf[used++] = (char)c;
      i++;
    }
  }
  ag__sha256_update(g->sha, buf, used);
  if (!ag__sha256_final(g->sha, out))
    memset(out, 0, AG_SIG_LEN); /* cannot happen with OpenSSL's SHA-256 */
}

AG_EXTERN bool ag_guard_is_error_text(const ag_guard *g, const char *text,
                                      size_t len) {
  const ag_str_list *p = &g->cfg.errors.error_prefixes;
  for (int i = 0; i < p->count; i++) {
    size_t n = strlen(p->items[i]);
    if (n > 0 && n <= len && memcmp(text, p->items[i], n) == 0)
      return true;
  }
  return false;
}

bool ag__guard_past_deadline(ag_guard *g, int64_t now, ag_verdict *v) {
  if (now < g->deadline)
    return false;
  char d[32];
  ag_format_duration(g->cfg.loop.max_turn_duration_ms, d, sizeof(d));
  v->action = AG_STOP;
  v->reason = AG_REASON_TURN_TIMEOUT;
  snprintf(v->message, sizeof(v->message),
           "Turn exceeded the maximum duration of %s", d);
  v->suggestion = "Split the task into smaller requests or raise "
                  "loop.max_turn_duration.";
  g->last_trip = AG_REASON_TURN_TIMEOUT;
  return true;
}

/* The action for a trip of mechanisms 2-9: stop, or escalate by config. */
ag_action ag__guard_trip_action(const ag_guard *g) {
  return g->cfg.errors.on_trip == AG_TRIP_ESCALATE ? AG_ESCALATE : AG_STOP;
}

/* The state of `name` if tracked, without creating it. */
tool_state *ag__guard_tool_find(ag_guard *g, const char *name) {
  size_t n = strlen(name);
  int i = tool_index(g, name, n, fnv1a(name, n));
  return i >= 0 ? &g->tools[i] : NULL;
}

void ag__guard_ring_push(ag_guard *g, err_ring *r, const char *tool,
                         ag_category cat, const char *text, size_t len) {
  if (r->cap <= 0)
    return;
  err_entry *e;
  if (r->count < r->cap) {
    e = ag__guard_ring_at(r, r->count);
    r->count++;
  } else {
    e = ag__guard_ring_at(r, 0);
    r->head = (r->head + 1) % r->cap;
  }
  ag__scopy(e->tool, sizeof(e->tool), tool);
  e->cat = cat;
  e->iteration = g->iteration;
  bool cut;
  e->len = ag__collapse_ws(e->msg, g->msg_cap, text, len, g->msg_cap - 1, &cut);
}

/* The loop mechanisms: a first trip nudges under loop.nudge_before_stop. */
bool ag__guard_is_loop(ag_reason r) {
  return r == AG_REASON_IDENTICAL_CALLS || r == AG_REASON_CYCLIC_CALLS ||
         r == AG_REASON_IDENTICAL_ERRORS || r == AG_REASON_REPEATED_RESULTS;
}

const char *ag__guard_suggestion(ag_reason r) {
  switch (r) {
  case AG_REASON_IDENTICAL_CALLS:
  case AG_REASON_REPEATED_RESULTS:
    return "Stop repeating this call: use its earlier result, change the "
           "arguments, "
           "or try a different approach.";
  case AG_REASON_CYCLIC_CALLS:
    return "The same sequence of calls keeps repeating: step back and try a "
           "different approach.";
  case AG_REASON_REFUSED_REPLIES:
    return "Answer with exactly one well-formed tool call, or with the final "
           "answer.";
  case AG_REASON_DENIED_CALLS:
    return "The user keeps refusing these calls: ask the user how to go on "
           "instead of proposing more of them.";
  default:
    return "Stop retrying the failing approach: explain the problem to the "
           "user or ask for help.";
  }
}

/* ------------------------------------------------------------------------ */
/* Mechanism 1: iterations                                                  */
/* ------------------------------------------------------------------------ */

AG_EXTERN ag_action ag_guard_begin_iteration(ag_guard *g, int64_t now_ms,
                                             ag_verdict *v) {
  ag__guard_verdict_reset(v);
  ag__jcs_trim(g->jcs);              /* a large call's scratch goes back */
  ag_content_loop_reset(g->content); /* a new reply */
  if (ag__guard_past_deadline(g, now_ms, v))
    return v->action;
  int budget = g->cfg.loop.max_tokens_per_turn;
  if (budget > 0 && g->tokens > budget) {
    v->action = AG_STOP;
    v->reason = AG_REASON_TOKEN_BUDGET;
    snprintf(v->message, sizeof(v->message),
             "The turn used %lld tokens, over its budget of %d "
             "(loop.max_tokens_per_turn)",
             (long long)g->tokens, budget);
    v->suggestion = "Answer with what is known so far, or split the task.";
    g->last_trip = v->reason;
    g->trips++;
    return v->action;
  }
  int max = g->cfg.loop.max_iterations;
  if (max > 0 && g->iteration >= max) {
    v->action = AG_STOP;
    v->reason = AG_REASON_MAX_ITERATIONS;
    snprintf(v->message, sizeof(v->message),
             "Reached the maximum of %d iterations in one turn", max);
    v->suggestion = "Answer with what is known so far, or split the task.";
    g->last_trip = v->reason;
    g->trips++;
    return v->action;
  }
  g->iteration++;
  return AG_ALLOW;
}

AG_EXTERN ag_action ag_guard_check_text(ag_guard *g, const char *text,
                                        size_t len, bool piece, ag_verdict *v) {
  ag__guard_verdict_reset(v);
  int repeats = g->cfg.loop.content_loop_repeats;
  if (repeats <= 0 || text == NULL || len == 0)
    return AG_ALLOW;
  if (g->content == NULL) {
    ag_content_loop_opts o;
    ag_content_loop_opts_init(&o);
    /* A whole text shorter than one chunk holds no chunk to repeat, and the
     * check of a whole text starts afresh: the detector (a 434 KB block)
     * is made only for a text that may trip it - a guard made per request
     * (the proxy's) seldom needs one. */
    if (!piece && len < o.chunk_size)
      return AG_ALLOW;
    o.threshold = (size_t)repeats;
    if (ag_content_loop_new(&g->content, &o, NULL) != AG_OK)
      return AG_ALLOW; /* out of memory: unchecked, tried again next time */
  }
  bool found = piece ? ag_content_loop_feed(g->content, text, len)
                     : ag_content_loop_check_text(g->content, text, len);
  if (!found)
    return AG_ALLOW;
  char chunk[96];
  ag_content_loop_chunk(g->content, chunk, sizeof(chunk));
  v->action = ag__guard_trip_action(g);
  v->reason = AG_REASON_CONTENT_LOOP;
  snprintf(v->message, sizeof(v->message),
           "The model's reply repeats itself: \"%s\" came %d times close "
           "together",
           chunk, repeats);
  v->suggestion = "The model is stuck repeating text: stop it and ask again, "
                  "or rephrase the request.";
  g->last_trip = v->reason;
  g->trips++;
  return v->action;
}

AG_EXTERN void ag_guard_record_tokens(ag_guard *g, int64_t tokens) {
  if (tokens > 0)
    g->tokens = tokens > INT64_MAX - g->tokens ? INT64_MAX : g->tokens + tokens;
}

AG_EXTERN int64_t ag_guard_tokens(const ag_guard *g) {
  return g->tokens;
}

AG_EXTERN void ag_guard_resume(ag_guard *g, ag_reason reason) {
  switch (reason) {
  case AG_REASON_MAX_ITERATIONS:
    g->iteration = 0;
    break;
  case AG_REASON_MAX_CALLS_PER_TURN:
    g->calls_in_turn = 0;
    break;
  case AG_REASON_IDENTICAL_CALLS:
    for (int i = 0; i < g->opts.max_tools; i++) {
      g->tools[i].run = 0;
      g->tools[i].has_sig = false;
    }
    break;
  case AG_REASON_CYCLIC_CALLS:
    memset(g->cyc_run, 0, sizeof(g->cyc_run));
    memset(g->cyc_valid, 0, sizeof(g->cyc_valid));
    g->cyc_n = 0;
    break;
  case AG_REASON_IDENTICAL_ERRORS:
    g->ident_run = 0;
    break;
  case AG_REASON_TOOL_ERROR_BUDGET:
    for (int i = 0; i < g->opts.max_tools; i++)
      g->tools[i].failures = 0;
    break;
  case AG_REASON_CONSECUTIVE_ERRORS:
    g->failing_iters = 0;
    break;
  case AG_REASON_TOTAL_ERROR_BUDGET:
    g->total_errors = 0;
    break;
  case AG_REASON_ERROR_PATTERN:
    g->pattern_run = 0;
    break;
  case AG_REASON_REFUSED_REPLIES:
    g->refused_run = 0;
    break;
  case AG_REASON_DENIED_CALLS:
    g->denied_run = 0;
    break;
  case AG_REASON_EMPTY_REPLY:
    g->empty_run = 0;
    break;
  case AG_REASON_REPEATED_RESULTS:
    marks_empty(&g->repeat_taken, g->repeat, sizeof(g->repeat),
                sizeof(g->repeat[0]));
    break;
  case AG_REASON_TOKEN_BUDGET:
    g->tokens = 0;
    break;
  default:
    break;
  }
  if (ag__guard_is_loop(reason)) {
    g->nudged = false;
    g->hold_armed = false;
  }
}
