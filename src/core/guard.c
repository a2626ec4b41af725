/*
 * src/core/guard.c - the guard: every detector and counter of DESIGN.md
 * section 3 that is not execution.
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

#include <jansson.h>

#include "agentguard/content.h"
#include "internal.h"

#define CYCLE_MAX 16
#define UNRESOLVED_MAX 64
/* Mechanism 16: call+result pairs remembered per turn in an open-addressed
 * table; a pair is looked for in REPEAT_PROBE slots from its hash, and when
 * none is free the least recently seen of them is forgotten (a turn with
 * hundreds of distinct pairs forgets the oldest first). */
#define REPEAT_SLOTS 512
#define REPEAT_PROBE 8
#define REPEAT_KEY 16 /* bytes of the key kept: collisions are moot */
/* Widths (%.*s) that keep quoted text inside a 512-byte verdict message
 * (AG_VERDICT_MSG_MAX) with the words around it: a parser's error in
 * "invalid arguments: ...", a trip's message in "Potential loop detected:
 * ... This call was not run. <suggestion>". */
#define INVALID_ARGS_WIDTH 480
#define LOOP_CAUSE_WIDTH 300
/* Characters of a tool's error quoted in a trip message ("...: <error>"). */
#define SHOWN_ERROR_CHARS 80

typedef struct repeat_slot {
  uint8_t key[REPEAT_KEY];
  int count;         /* 0: empty */
  uint32_t novel_at; /* g->novel when the pair was last seen */
  uint32_t seen;     /* g->repeat_clock when it was last seen */
  uint32_t world_at; /* g->world when it was last counted (a failure) */
  uint32_t ok_at;    /* its call's success epoch then (a failure) */
} repeat_slot;

/* Progress (docs/detection.md): calls of the batch being checked that
 * change the world (ag__call_changes_state), by signature prefix; past
 * CHANGING_MAX, every call of the batch that succeeds counts as one. */
#define CHANGING_MAX 32
/* The last success of each call (by signature), for "a success of the
 * same call resets its failures": open-addressed like the pairs, the least
 * recent forgotten first. */
#define OK_SLOTS 128

typedef struct ok_slot {
  uint8_t key[REPEAT_KEY]; /* the call's signature (its prefix) */
  uint32_t epoch;          /* 0: empty; else g->ok_clock at its success */
} ok_slot;

typedef struct tool_state {
  bool used;
  uint64_t name_hash;
  size_t name_len;
  char name[AG_TOOL_NAME_MAX];
  uint64_t last_used; /* LRU stamp */
  /* mechanism 3 */
  bool has_sig;
  uint8_t sig[AG_SIG_LEN];
  int run;
  int run_iter;
  bool has_result;
  uint8_t result[AG_SIG_LEN];
  /* mechanism 6 */
  int failures;
  /* progress: what its name says (progress.c), looked at once */
  ag__tool_kind kind;
  /* error context */
  int unresolved;
} tool_state;

typedef struct err_entry {
  char tool[AG_TOOL_NAME_MAX];
  ag_category cat;
  int iteration;
  size_t len;
  char *msg; /* collapsed message, cap: msg_cap bytes */
} err_entry;

typedef struct err_ring {
  int cap, count, head; /* head: index of the oldest entry */
  err_entry *e;
} err_ring;

struct ag_guard {
  ag_config cfg;
  ag_guard_opts opts;
  ag__jcs *jcs;
  ag__sha256 *sha; /* error keys and result digests */
  size_t msg_cap;

  /* turn */
  int turn;
  int64_t turn_start;
  int64_t deadline;
  int iteration;
  int calls_in_turn;
  uint64_t stamp;

  tool_state *tools;
  int n_tools; /* tools[0..n_tools) are in use (a prefix: never freed) */

  /* mechanism 4 */
  int cyc_len;    /* ring capacity = cycle_max_length */
  uint64_t cyc_n; /* calls appended this turn */
  bool cyc_valid[CYCLE_MAX];
  uint8_t cyc_sig[CYCLE_MAX][AG_SIG_LEN];
  int cyc_run[CYCLE_MAX + 1]; /* run[p], p = 1..cyc_len */

  /* mechanism 5 */
  int ident_run;
  uint8_t ident_key[AG_SIG_LEN];
  /* mechanism 7 */
  int failing_iters;
  /* mechanism 8 */
  int total_errors;
  /* mechanism 9 */
  int pattern_run;
  ag_category pattern_cat;
  /* mechanism 11 */
  int64_t tokens;
  /* mechanism 14: allocated at the first text checked */
  ag_content_loop *content;
  /* mechanisms 12, 13, 15 */
  int refused_run;
  int denied_run;
  int empty_run;
  /* mechanism 16 */
  repeat_slot repeat[REPEAT_SLOTS];
  uint32_t novel;        /* pairs seen for the first time in the turn */
  uint32_t repeat_clock; /* pairs recorded in the turn */
  /* progress: the world's epoch (one more per successful call that
   * changes state), the batch's changing calls, successes per call */
  uint32_t world;
  uint8_t changing[CHANGING_MAX][REPEAT_KEY];
  int n_changing;
  bool changing_all;
  ok_slot oks[OK_SLOTS];
  uint32_t ok_clock;
  /* mechanism 5's nudge: the next call with this signature is held back */
  bool hold_armed;
  uint8_t hold_sig[AG_SIG_LEN];
  char hold_msg[AG_VERDICT_MSG_MAX];

  bool nudged; /* a loop mechanism (3, 4, 5, 16) has nudged in this turn */
  ag_reason last_trip;
  int trips;

  err_ring history;    /* last error_history errors */
  err_ring unresolved; /* last max_errors_in_context unresolved errors */
  int unresolved_total;
};

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

static ag_err_t ring_init(err_ring *r, int cap, size_t msg_cap) {
  r->cap = cap;
  r->count = r->head = 0;
  r->e = calloc((size_t)cap, sizeof(*r->e));
  if (r->e == NULL)
    return AG_ENOMEM;
  for (int i = 0; i < cap; i++) {
    r->e[i].msg = malloc(msg_cap);
    if (r->e[i].msg == NULL)
      return AG_ENOMEM;
  }
  return AG_OK;
}

static void ring_free(err_ring *r) {
  if (r->e == NULL)
    return;
  for (int i = 0; i < r->cap; i++)
    free(r->e[i].msg);
  free(r->e);
  r->e = NULL;
}

static err_entry *ring_at(const err_ring *r, int i) {
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
  memset(g->tools, 0, (size_t)g->opts.max_tools * sizeof(*g->tools));
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
  memset(g->repeat, 0, sizeof(g->repeat));
  g->novel = 0;
  g->repeat_clock = 0;
  g->world = 0;
  g->n_changing = 0;
  g->changing_all = false;
  memset(g->oks, 0, sizeof(g->oks));
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

static void verdict_reset(ag_verdict *v) {
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
static tool_state *tool_get(ag_guard *g, const char *name) {
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
static void digest_text(ag_guard *g, const char *name, const char *text,
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
static void digest_norm(ag_guard *g, const char *name, const uint8_t *pre,
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

static bool past_deadline(ag_guard *g, int64_t now, ag_verdict *v) {
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
static ag_action trip_action(const ag_guard *g) {
  return g->cfg.errors.on_trip == AG_TRIP_ESCALATE ? AG_ESCALATE : AG_STOP;
}

/* ------------------------------------------------------------------------ */
/* Mechanism 1: iterations                                                  */
/* ------------------------------------------------------------------------ */

AG_EXTERN ag_action ag_guard_begin_iteration(ag_guard *g, int64_t now_ms,
                                             ag_verdict *v) {
  verdict_reset(v);
  ag__jcs_trim(g->jcs);              /* a large call's scratch goes back */
  ag_content_loop_reset(g->content); /* a new reply */
  if (past_deadline(g, now_ms, v))
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

/* ------------------------------------------------------------------------ */
/* Mechanisms 2, 3, 4: before execution                                     */
/* ------------------------------------------------------------------------ */

static const char *const identical_suggestion =
    "Stop repeating this call: use its earlier result, change the arguments, "
    "or try a different approach.";
static const char *const cycle_suggestion =
    "The same sequence of calls keeps repeating: step back and try a "
    "different approach.";

/* Appends a call to the cycle detector; returns the block length that now
 * repeats cycle_limit times back to back, or 0. */
static int cycle_push(ag_guard *g, bool valid, const uint8_t *sig) {
  int L = g->cyc_len;
  if (L < 1)
    return 0;
  for (int p = 1; p <= L; p++) {
    bool eq = false;
    if (valid && g->cyc_n >= (uint64_t)p) {
      int idx = (int)((g->cyc_n - (uint64_t)p) % (uint64_t)L);
      eq = g->cyc_valid[idx] && memcmp(g->cyc_sig[idx], sig, AG_SIG_LEN) == 0;
    }
    g->cyc_run[p] = eq ? g->cyc_run[p] + 1 : 0;
  }
  int idx = (int)(g->cyc_n % (uint64_t)L);
  g->cyc_valid[idx] = valid;
  if (valid)
    memcpy(g->cyc_sig[idx], sig, AG_SIG_LEN);
  g->cyc_n++;
  int N = g->cfg.loop.cycle_limit;
  if (N < 2)
    return 0; /* a block seen once is no cycle */
  for (int p = 2; p <= L; p++) {
    if (g->cyc_run[p] >= p * (N - 1) && g->cyc_run[1] < p * N - 1)
      return p;
  }
  return 0;
}

/* With nudge_before_stop, the first trip in a turn of any loop mechanism
 * (3, 4, 5, 16) nudges; the next trip of any of them stops (Gemini CLI's two
 * strikes, counted across the mechanisms). */
static bool nudge_first(ag_guard *g) {
  if (!g->cfg.loop.nudge_before_stop || g->nudged)
    return false;
  g->nudged = true;
  return true;
}

/* Gives every call of the batch its check: a signature, or why it has none
 * (past opts.max_batch, arguments that are not JSON). Done for the whole
 * batch even when it stops, so callers can report each call. */
/* Remembers a call of the batch (its tool t) that changes the world, by
 * signature, for when its result comes (record_one). */
static void note_changing(ag_guard *g, tool_state *t, const ag_call *call,
                          const ag_call_check *c) {
  if (t->kind == AG__TOOL_UNSEEN)
    t->kind = ag__tool_kind_of(t->name, t->name_len);
  if (!ag__args_change_state(t->kind, call->args != NULL ? call->args : "",
                             call->args != NULL ? call->args_len : 0))
    return;
  if (g->n_changing == CHANGING_MAX)
    g->changing_all = true;
  else
    memcpy(g->changing[g->n_changing++], c->sig, REPEAT_KEY);
}

/* Whether a call of the batch, by signature, changes the world. */
static bool is_changing(const ag_guard *g, const uint8_t *sig) {
  if (g->changing_all)
    return true;
  for (int i = 0; i < g->n_changing; i++)
    if (memcmp(g->changing[i], sig, REPEAT_KEY) == 0)
      return true;
  return false;
}

static void sign_calls(ag_guard *g, const ag_call *calls, size_t n,
                       ag_call_check *checks) {
  for (size_t i = 0; i < n; i++) {
    ag_call_check *c = &checks[i];
    c->action = AG_ALLOW;
    c->reason = AG_REASON_NONE;
    c->message[0] = '\0';
    c->invalid_code = AG_OK;
    c->invalid_pos = -1;
    if (i >= (size_t)g->opts.max_batch) {
      c->valid = false;
      c->invalid_code = AG_ETOOBIG;
      snprintf(c->message, sizeof(c->message),
               "more than %d tool calls in one reply; this one was not run",
               g->opts.max_batch);
      continue;
    }
    const char *name = calls[i].name != NULL ? calls[i].name : "";
    ag_error_t e;
    ag_err_t rc = ag__jcs_signature(
        g->jcs, name, strlen(name), calls[i].args,
        calls[i].args != NULL ? calls[i].args_len : 0, c->sig, &e);
    c->valid = rc == AG_OK;
    if (!c->valid) {
      c->invalid_code = rc;
      c->invalid_pos = e.pos;
      snprintf(c->message, sizeof(c->message), "invalid arguments: %.*s",
               INVALID_ARGS_WIDTH, e.msg);
    }
  }
}

/* What one of the checks before execution decided for a call. */
typedef enum {
  CHECK_PASS, /* on to the next check */
  CHECK_HELD, /* held back by an armed nudge; the batch goes on */
  CHECK_NUDGE,
  CHECK_TRIP
} check_step;

/* 2: the per-turn call cap; a call that passes is counted. */
static check_step check_call_cap(ag_guard *g, ag_call_check *c, ag_verdict *v) {
  int cap = g->cfg.loop.max_calls_per_turn;
  if (cap > 0 && g->calls_in_turn >= cap) {
    c->action = trip_action(g);
    c->reason = AG_REASON_MAX_CALLS_PER_TURN;
    snprintf(c->message, sizeof(c->message),
             "Maximum function call depth exceeded: more than %d tool calls "
             "in one turn",
             cap);
    v->suggestion = "Finish with what is known, or ask the user to "
                    "continue in a new message.";
    return CHECK_TRIP;
  }
  g->calls_in_turn++;
  return CHECK_PASS;
}

/* 5's nudge: the call after an identical error's trip, if it is the same
 * call again, is held back once. */
static check_step check_held(ag_guard *g, ag_call_check *c) {
  if (!g->hold_armed || !c->valid ||
      memcmp(c->sig, g->hold_sig, AG_SIG_LEN) != 0)
    return CHECK_PASS;
  g->hold_armed = false;
  c->action = AG_NUDGE;
  c->reason = AG_REASON_IDENTICAL_ERRORS;
  memcpy(c->message, g->hold_msg, sizeof(c->message));
  return CHECK_HELD;
}

/* 3: the identical-call breaker in scope "call". */
static check_step check_identical(ag_guard *g, const ag_call *call,
                                  const char *name, ag_call_check *c,
                                  bool cycles_now, ag_verdict *v) {
  const ag_config *cfg = &g->cfg;
  tool_state *t = tool_get(g, name);
  if (!c->valid) {
    t->has_sig = false;
    t->run = 0;
    return CHECK_PASS;
  }
  note_changing(g, t, call, c);
  if (cfg->loop.identical_call_scope != AG_SCOPE_CALL)
    return CHECK_PASS;
  if (t->has_sig && t->run_iter >= g->iteration - 1 &&
      memcmp(t->sig, c->sig, AG_SIG_LEN) == 0)
    t->run++;
  else
    t->run = 1;
  t->has_sig = true;
  memcpy(t->sig, c->sig, AG_SIG_LEN);
  t->run_iter = g->iteration;
  int lim = cfg->loop.identical_call_limit;
  if (lim <= 0 || t->run < lim)
    return CHECK_PASS;
  c->reason = AG_REASON_IDENTICAL_CALLS;
  snprintf(c->message, sizeof(c->message),
           "%s was called %d times in a row with the same arguments", name,
           t->run);
  v->suggestion = identical_suggestion;
  if (nudge_first(g)) {
    if (cycles_now) /* the detector keeps its count */
      cycle_push(g, c->valid, c->sig);
    return CHECK_NUDGE;
  }
  c->action = trip_action(g);
  return CHECK_TRIP;
}

/* 4: the cycle detector, in scope "call" (in call_and_result scope a
 * repetition is judged on results too: record_results runs it). */
static check_step check_cycle(ag_guard *g, const char *name, ag_call_check *c,
                              bool cycles_now, ag_verdict *v) {
  int p = cycles_now ? cycle_push(g, c->valid, c->sig) : 0;
  if (p <= 0 || g->cfg.loop.cycle_limit <= 0)
    return CHECK_PASS;
  c->reason = AG_REASON_CYCLIC_CALLS;
  snprintf(c->message, sizeof(c->message),
           "A sequence of %d calls ending with %s repeated %d times in a "
           "row",
           p, name, g->cfg.loop.cycle_limit);
  v->suggestion = cycle_suggestion;
  if (nudge_first(g))
    return CHECK_NUDGE;
  c->action = trip_action(g);
  return CHECK_TRIP;
}

/* Turns a call's trip message into its nudge: the call is held back and
 * told why; the batch goes on. */
static void nudge_call(ag_call_check *c, ag_verdict *v) {
  char tmp[AG_VERDICT_MSG_MAX];
  memcpy(tmp, c->message, sizeof(tmp));
  c->action = AG_NUDGE;
  snprintf(c->message, sizeof(c->message),
           "Potential loop detected: %.*s. This call was not run. %s",
           LOOP_CAUSE_WIDTH, tmp, v->suggestion);
  v->suggestion = NULL;
}

/* The batch's verdict from call i's trip. */
static ag_action trip_call(ag_guard *g, const ag_call_check *c, size_t i,
                           const char *name, ag_verdict *v) {
  v->action = c->action;
  v->reason = c->reason;
  v->call_index = (int)i;
  ag__scopy(v->tool, sizeof(v->tool), name);
  memcpy(v->message, c->message, sizeof(v->message));
  g->last_trip = v->reason;
  g->trips++;
  return v->action;
}

AG_EXTERN ag_action ag_guard_check_calls(ag_guard *g, const ag_call *calls,
                                         size_t n, int64_t now_ms,
                                         ag_call_check *checks, ag_verdict *v) {
  verdict_reset(v);
  sign_calls(g, calls, n, checks);
  g->n_changing = 0;
  g->changing_all = false;
  if (past_deadline(g, now_ms, v))
    return v->action;
  if (n > 0)
    g->empty_run = 0;

  const bool cycles_now = g->cfg.loop.identical_call_scope == AG_SCOPE_CALL;
  size_t checked =
      n < (size_t)g->opts.max_batch ? n : (size_t)g->opts.max_batch;
  for (size_t i = 0; i < checked; i++) {
    ag_call_check *c = &checks[i];
    const char *name = calls[i].name != NULL ? calls[i].name : "";
    check_step s = check_call_cap(g, c, v);
    if (s == CHECK_PASS)
      s = check_held(g, c);
    if (s == CHECK_PASS)
      s = check_identical(g, &calls[i], name, c, cycles_now, v);
    if (s == CHECK_PASS)
      s = check_cycle(g, name, c, cycles_now, v);
    if (s == CHECK_NUDGE)
      nudge_call(c, v);
    else if (s == CHECK_TRIP)
      return trip_call(g, c, i, name, v);
  }
  return v->action;
}

/* ------------------------------------------------------------------------ */
/* Mechanisms 3 (call_and_result), 5-9: after the results                   */
/* ------------------------------------------------------------------------ */

static void ring_push(ag_guard *g, err_ring *r, const char *tool,
                      ag_category cat, const char *text, size_t len) {
  if (r->cap <= 0)
    return;
  err_entry *e;
  if (r->count < r->cap) {
    e = ring_at(r, r->count);
    r->count++;
  } else {
    e = ring_at(r, 0);
    r->head = (r->head + 1) % r->cap;
  }
  ag__scopy(e->tool, sizeof(e->tool), tool);
  e->cat = cat;
  e->iteration = g->iteration;
  bool cut;
  e->len = ag__collapse_ws(e->msg, g->msg_cap, text, len, g->msg_cap - 1, &cut);
}

/* The state of `name` if tracked, without creating it. */
static tool_state *tool_find(ag_guard *g, const char *name) {
  size_t n = strlen(name);
  int i = tool_index(g, name, n, fnv1a(name, n));
  return i >= 0 ? &g->tools[i] : NULL;
}

/* A success of tool `t` resolves its errors, and the errors with no tool
 * (a reply without a tool call), which any success resolves. Errors no longer
 * held in the ring are only counted, through each tool's `unresolved`. */
static void resolve(ag_guard *g, tool_state *t) {
  tool_state *none = t->name[0] != '\0' ? tool_find(g, "") : NULL;
  if (t->unresolved == 0 && (none == NULL || none->unresolved == 0))
    return;
  err_ring *r = &g->unresolved;
  int kept = 0;
  for (int i = 0; i < r->count; i++) {
    err_entry *e = ring_at(r, i);
    if (strcmp(e->tool, t->name) == 0 || e->tool[0] == '\0')
      continue;
    if (kept != i) {
      err_entry *dst = ring_at(r, kept);
      err_entry tmp = *dst;
      *dst = *e;
      *e = tmp; /* a swap keeps every buffer owned exactly once */
    }
    kept++;
  }
  r->count = kept;
  g->unresolved_total -= t->unresolved;
  t->unresolved = 0;
  if (none != NULL) {
    g->unresolved_total -= none->unresolved;
    none->unresolved = 0;
  }
  /* A forgotten (evicted) tool can leave the count high; never below what
   * the ring holds. */
  if (g->unresolved_total < r->count)
    g->unresolved_total = r->count;
}

typedef struct trip_note {
  bool tripped;
  int index;
  char tool[AG_TOOL_NAME_MAX];
  char message[AG_VERDICT_MSG_MAX];
} trip_note;

static void note(trip_note *tn, int index, const char *tool, const char *fmt,
                 ...) AG__PRINTF(4, 5);
static void note(trip_note *tn, int index, const char *tool, const char *fmt,
                 ...) {
  if (tn->tripped)
    return; /* the first event of a mechanism is its trip */
  tn->tripped = true;
  tn->index = index;
  ag__scopy(tn->tool, sizeof(tn->tool), tool);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(tn->message, sizeof(tn->message), fmt, ap);
  va_end(ap);
}

/*
 * Mechanism 16: counts one more (call, result) pair in the turn and returns
 * the count. A failure counts every time the turn sees it, whatever happened
 * in between (edit, then the same failing test, again and again). A success
 * counts only while nothing new happened since its last occurrence: any pair
 * seen for the first time in between (a poll whose status changed, a file
 * that now reads differently) is progress and restarts the count at 1, so a
 * `sleep` between polls of a moving job never adds up.
 */
/* The slot of a call's last success (sig), or with `make` the one it
 * takes (an empty one, or the least recent of its window); NULL when it
 * has none and `make` is false. */
static ok_slot *ok_find(ag_guard *g, const uint8_t *sig, bool make) {
  uint32_t h;
  memcpy(&h, sig, sizeof(h));
  ok_slot *victim = NULL;
  for (unsigned k = 0; k < REPEAT_PROBE; k++) {
    ok_slot *c = &g->oks[(h + k) % OK_SLOTS];
    if (c->epoch != 0 && memcmp(c->key, sig, REPEAT_KEY) == 0)
      return c;
    if (c->epoch == 0) {
      victim = c;
      break;
    }
    if (victim == NULL || c->epoch < victim->epoch)
      victim = c;
  }
  if (!make)
    return NULL;
  memcpy(victim->key, sig, REPEAT_KEY);
  return victim;
}

/* When the call `sig` last succeeded in the turn (0: not yet). */
static uint32_t ok_epoch(ag_guard *g, const uint8_t *sig) {
  const ok_slot *o = ok_find(g, sig, false);
  return o != NULL ? o->epoch : 0;
}

static int repeat_count(ag_guard *g, const uint8_t key[AG_SIG_LEN],
                        bool failure, const uint8_t *sig) {
  uint32_t h;
  memcpy(&h, key, sizeof(h));
  repeat_slot *r = NULL, *victim = NULL;
  /* Slots only empty at a turn's start, and a pair goes into the first
   * empty slot of its window: an empty slot ends the search. */
  for (unsigned k = 0; k < REPEAT_PROBE; k++) {
    repeat_slot *c = &g->repeat[(h + k) % REPEAT_SLOTS];
    if (c->count == 0) {
      victim = c;
      break;
    }
    if (memcmp(c->key, key, REPEAT_KEY) == 0) {
      r = c;
      break;
    }
    if (victim == NULL || c->seen < victim->seen)
      victim = c;
  }
  g->repeat_clock++;
  const uint32_t ok = ok_epoch(g, sig);
  if (r != NULL) {
    /* a failure repeats while the world stayed as it was and the call did
     * not succeed meanwhile (an edit, or a pass, is new evidence); a
     * success while nothing new was seen at all */
    bool same = failure ? r->world_at == g->world && r->ok_at == ok
                        : r->novel_at == g->novel;
    r->count = same ? r->count + 1 : 1;
  } else {
    r = victim;
    memcpy(r->key, key, REPEAT_KEY);
    r->count = 1;
    g->novel++;
  }
  r->world_at = g->world;
  r->ok_at = ok;
  r->novel_at = g->novel;
  r->seen = g->repeat_clock;
  return r->count;
}

static uint64_t rotl64(uint64_t x, int r) {
  return (x << r) | (x >> (64 - r));
}

static uint64_t fmix64(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdull;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ull;
  k ^= k >> 33;
  return k;
}

/*
 * A (call, result) key for a success (mechanism 16): two 64-bit lanes of a
 * multiply-rotate hash (MurmurHash3's mixing) over `text`, seeded with the
 * call's signature, into key[0..16). Successes are every call's common case,
 * so this avoids a SHA-256 per result (about 100 ns); collisions are not a
 * security matter here, at worst one repeat is miscounted.
 */
static void fast_key(const uint8_t *sig, const char *text, size_t len,
                     uint8_t key[AG_SIG_LEN]) {
  uint64_t h1, h2;
  memcpy(&h1, sig, 8);
  memcpy(&h2, sig + 8, 8);
  const unsigned char *p = (const unsigned char *)text;
  size_t i = 0;
  for (; i + 16 <= len; i += 16) {
    uint64_t k1, k2;
    memcpy(&k1, p + i, 8);
    memcpy(&k2, p + i + 8, 8);
    h1 ^= rotl64(k1 * 0x87c37b91114253d5ull, 31) * 0x4cf5ad432745937full;
    h1 = rotl64(h1, 27) + h2;
    h1 = h1 * 5 + 0x52dce729;
    h2 ^= rotl64(k2 * 0x4cf5ad432745937full, 33) * 0x87c37b91114253d5ull;
    h2 = rotl64(h2, 31) + h1;
    h2 = h2 * 5 + 0x38495ab5;
  }
  uint64_t t1 = 0, t2 = 0;
  size_t rest = len - i;
  memcpy(&t1, p + i, rest < 8 ? rest : 8);
  if (rest > 8)
    memcpy(&t2, p + i + 8, rest - 8);
  h1 ^= rotl64(t1 * 0x87c37b91114253d5ull, 31) * 0x4cf5ad432745937full;
  h2 ^= rotl64(t2 * 0x4cf5ad432745937full, 33) * 0x87c37b91114253d5ull;
  h1 ^= (uint64_t)len;
  h2 ^= (uint64_t)len;
  h1 += h2;
  h2 += h1;
  h1 = fmix64(h1);
  h2 = fmix64(h2);
  h1 += h2;
  h2 += h1;
  memcpy(key, &h1, 8);
  memcpy(key + 8, &h2, 8);
  memset(key + 16, 0, AG_SIG_LEN - 16);
}

/* SHA-256 of two digests, for a (call, result) pair. */
static void pair_key(ag_guard *g, const uint8_t *a, const uint8_t *b,
                     uint8_t out[AG_SIG_LEN]) {
  ag__sha256_init(g->sha);
  ag__sha256_update(g->sha, a, AG_SIG_LEN);
  ag__sha256_update(g->sha, b, AG_SIG_LEN);
  if (!ag__sha256_final(g->sha, out))
    memset(out, 0, AG_SIG_LEN);
}

/* An error that is no tool's failure (a refused reply, arguments that are
 * not JSON): kept for the error context and the escalation record only. */
static void remember_error(ag_guard *g, const char *name, ag_category cat,
                           const char *text, size_t len) {
  tool_state *t = tool_get(g, name);
  if (cat >= AG_CAT__COUNT)
    cat = AG_CAT_VALIDATION;
  ring_push(g, &g->history, name, cat, text, len);
  ring_push(g, &g->unresolved, name, cat, text, len);
  g->unresolved_total++;
  t->unresolved++;
}

/* The loop mechanisms: a first trip nudges under loop.nudge_before_stop. */
static bool is_loop_mechanism(ag_reason r) {
  return r == AG_REASON_IDENTICAL_CALLS || r == AG_REASON_CYCLIC_CALLS ||
         r == AG_REASON_IDENTICAL_ERRORS || r == AG_REASON_REPEATED_RESULTS;
}

static const char *trip_suggestion(ag_reason r) {
  switch (r) {
  case AG_REASON_IDENTICAL_CALLS:
  case AG_REASON_REPEATED_RESULTS:
    return identical_suggestion;
  case AG_REASON_CYCLIC_CALLS:
    return cycle_suggestion;
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

/* Decides the verdict of record_results from the noted trips, in the order
 * of DESIGN.md's table. */
static ag_action decide(ag_guard *g, const trip_note *tn,
                        const ag_result *results, size_t n, ag_verdict *v) {
  static const ag_reason order[] = {
      AG_REASON_IDENTICAL_CALLS,    AG_REASON_CYCLIC_CALLS,
      AG_REASON_IDENTICAL_ERRORS,   AG_REASON_TOOL_ERROR_BUDGET,
      AG_REASON_CONSECUTIVE_ERRORS, AG_REASON_TOTAL_ERROR_BUDGET,
      AG_REASON_ERROR_PATTERN,      AG_REASON_REFUSED_REPLIES,
      AG_REASON_DENIED_CALLS,       AG_REASON_REPEATED_RESULTS};
  for (size_t k = 0; k < sizeof(order) / sizeof(order[0]); k++) {
    ag_reason r = order[k];
    if (!tn[r].tripped)
      continue;
    v->reason = r;
    v->call_index = tn[r].index;
    ag__scopy(v->tool, sizeof(v->tool), tn[r].tool);
    if (r != AG_REASON_CONSECUTIVE_ERRORS)
      v->warning[0] = '\0';
    if (is_loop_mechanism(r) && nudge_first(g)) {
      v->action = AG_NUDGE;
      const ag_result *res = tn[r].index >= 0 && (size_t)tn[r].index < n
                                 ? &results[tn[r].index]
                                 : NULL;
      if (r == AG_REASON_IDENTICAL_ERRORS && res != NULL && res->sig != NULL) {
        /* goose's way: the next identical failing call is refused */
        g->hold_armed = true;
        memcpy(g->hold_sig, res->sig, AG_SIG_LEN);
        snprintf(g->hold_msg, sizeof(g->hold_msg),
                 "Potential loop detected: %.*s. This call was not run. %s",
                 LOOP_CAUSE_WIDTH, tn[r].message, identical_suggestion);
        snprintf(v->message, sizeof(v->message),
                 "Potential loop detected: %.*s. The same call will not be "
                 "run again. %s",
                 LOOP_CAUSE_WIDTH, tn[r].message, identical_suggestion);
      } else {
        snprintf(v->message, sizeof(v->message),
                 "Potential loop detected: %.*s. %s", LOOP_CAUSE_WIDTH,
                 tn[r].message, trip_suggestion(r));
      }
      return v->action;
    }
    v->action = trip_action(g);
    ag__scopy(v->message, sizeof(v->message), tn[r].message);
    v->suggestion = trip_suggestion(r);
    g->last_trip = r;
    g->trips++;
    return v->action;
  }
  v->warning[0] = '\0';
  return AG_ALLOW;
}

/* One result being recorded: what its phases share. */
typedef struct rec_item {
  const ag_result *r;
  int index; /* in the batch */
  const char *name, *text;
  size_t len;
  tool_state *t;
  bool is_err;
} rec_item;

/* A batch's tallies, for mechanisms 7 and 12. */
typedef struct rec_tally {
  int counted; /* results of calls that ran */
  int failed;  /* of them, failures */
  int invalid; /* calls whose arguments were not JSON */
} rec_tally;

/* 13: one more denied call in a row. */
static void record_denied(ag_guard *g, trip_note *tn, const rec_item *it) {
  g->denied_run++;
  if (g->cfg.loop.max_denied_calls > 0 &&
      g->denied_run >= g->cfg.loop.max_denied_calls)
    note(&tn[AG_REASON_DENIED_CALLS], it->index, it->name,
         "%d tool calls in a row were denied at approval; last: %s",
         g->denied_run, it->name);
}

/* Arguments that are not JSON: nothing ran, so it is no tool's failure
 * (mechanism 12 counts a reply where nothing ran). */
static void record_invalid(ag_guard *g, const rec_item *it) {
  remember_error(g, it->name, it->r->category, it->text, it->len);
  tool_state *t = tool_get(g, it->name);
  t->has_sig = t->has_result = false;
  t->run = 0;
}

/* 3 and 4 in call_and_result scope: counted once the result is known. */
static void record_by_result(ag_guard *g, trip_note *tn, const rec_item *it) {
  const ag_config *cfg = &g->cfg;
  tool_state *t = it->t;
  const uint8_t *sig = it->r->sig;
  if (sig == NULL) {
    t->has_sig = false;
    t->run = 0;
    return;
  }
  uint8_t rh[AG_SIG_LEN];
  digest_text(g, "", it->text, it->len, rh);
  if (t->has_sig && t->has_result && t->run_iter >= g->iteration - 1 &&
      memcmp(t->sig, sig, AG_SIG_LEN) == 0 &&
      memcmp(t->result, rh, AG_SIG_LEN) == 0)
    t->run++;
  else
    t->run = 1;
  t->has_sig = t->has_result = true;
  memcpy(t->sig, sig, AG_SIG_LEN);
  memcpy(t->result, rh, AG_SIG_LEN);
  t->run_iter = g->iteration;
  int lim = cfg->loop.identical_call_limit;
  if (lim > 0 && t->run >= lim)
    note(&tn[AG_REASON_IDENTICAL_CALLS], it->index, it->name,
         "%s was called %d times in a row with the same arguments and "
         "got the same result",
         it->name, t->run);
  uint8_t pk[AG_SIG_LEN];
  pair_key(g, sig, rh, pk);
  int p = cycle_push(g, true, pk);
  if (p > 0 && cfg->loop.cycle_limit > 0)
    note(&tn[AG_REASON_CYCLIC_CALLS], it->index, it->name,
         "A sequence of %d calls ending with %s repeated %d times in a "
         "row with the same results",
         p, it->name, cfg->loop.cycle_limit);
}

/* 16: the same call with the same result, anywhere in the turn; an error is
 * compared normalized (numbers, addresses, temporary paths), a success
 * exactly (changing numbers there are progress). `shown`: scratch. */
static void record_repeat(ag_guard *g, trip_note *tn, const rec_item *it,
                          char *shown, size_t shown_cap) {
  uint8_t pk[AG_SIG_LEN];
  int lim;
  if (it->is_err) {
    digest_norm(g, "\x01", it->r->sig, AG_SIG_LEN, it->text, it->len, pk);
    lim = g->cfg.loop.repeated_failure_limit;
  } else {
    /* every successful result is hashed: a fast 128-bit hash seeded
     * with the signature (a collision only miscounts a repeat) */
    fast_key(it->r->sig, it->text, it->len, pk);
    lim = g->cfg.loop.repeated_result_limit;
  }
  int cnt = repeat_count(g, pk, it->is_err, it->r->sig);
  if (lim <= 0 || cnt < lim)
    return;
  bool cut;
  ag__collapse_ws(shown, shown_cap, it->text, it->len, SHOWN_ERROR_CHARS, &cut);
  if (it->is_err)
    note(&tn[AG_REASON_REPEATED_RESULTS], it->index, it->name,
         "%s failed %d times in this turn with the same arguments and "
         "the same error: %s%s",
         it->name, cnt, shown, cut ? "..." : "");
  else
    note(&tn[AG_REASON_REPEATED_RESULTS], it->index, it->name,
         "%s was called %d times with the same arguments and got the "
         "same result, with nothing new in between",
         it->name, cnt);
}

/* 5: identical errors (normalized) in a row. */
static void count_identical_error(ag_guard *g, trip_note *tn,
                                  const rec_item *it, const char *shown,
                                  const char *ell) {
  uint8_t key[AG_SIG_LEN];
  digest_norm(g, it->name, NULL, 0, it->text, it->len, key);
  if (g->ident_run > 0 && memcmp(key, g->ident_key, AG_SIG_LEN) == 0)
    g->ident_run++;
  else
    g->ident_run = 1;
  memcpy(g->ident_key, key, AG_SIG_LEN);
  int lim = g->cfg.errors.max_identical_errors;
  if (lim > 0 && g->ident_run >= lim)
    note(&tn[AG_REASON_IDENTICAL_ERRORS], it->index, it->name,
         "%s failed %d times in a row with the same error: %s%s", it->name,
         g->ident_run, shown, ell);
}

/* 6: the tool's consecutive failures. */
static void count_tool_error(ag_guard *g, trip_note *tn, const rec_item *it,
                             const char *shown, const char *ell) {
  tool_state *t = it->t;
  t->failures++;
  int lim = g->cfg.errors.max_tool_errors;
  if (lim > 0 && t->failures >= lim)
    note(&tn[AG_REASON_TOOL_ERROR_BUDGET], it->index, it->name,
         "%s failed %d times in a row (budget %d): %s%s", it->name, t->failures,
         lim, shown, ell);
}

/* 8: the turn's failed calls. */
static void count_total_error(ag_guard *g, trip_note *tn, const rec_item *it,
                              const char *shown, const char *ell) {
  g->total_errors++;
  int lim = g->cfg.errors.max_total_errors;
  if (lim > 0 && g->total_errors >= lim)
    note(&tn[AG_REASON_TOTAL_ERROR_BUDGET], it->index, it->name,
         "%d tool calls failed in this turn (budget %d); last: %s: %s%s",
         g->total_errors, lim, it->name, shown, ell);
}

/* 9: errors of one recognised category in a row (unknown breaks the run). */
static void count_error_pattern(ag_guard *g, trip_note *tn, const rec_item *it,
                                ag_category cat, const char *shown,
                                const char *ell) {
  if (cat == AG_CAT_UNKNOWN) {
    g->pattern_run = 0;
  } else if (g->pattern_run > 0 && cat == g->pattern_cat) {
    g->pattern_run++;
  } else {
    g->pattern_run = 1;
    g->pattern_cat = cat;
  }
  int lim = g->cfg.errors.similar_error_limit;
  if (lim > 0 && g->pattern_run >= lim)
    note(&tn[AG_REASON_ERROR_PATTERN], it->index, it->name,
         "%d %s errors in a row; last from %s: %s%s", g->pattern_run,
         ag_category_name(cat), it->name, shown, ell);
}

/* A failed call: kept for the error context, then mechanisms 5, 6, 8, 9.
 * `shown`: scratch. */
static void record_error(ag_guard *g, trip_note *tn, const rec_item *it,
                         char *shown, size_t shown_cap) {
  const ag_result *r = it->r;
  ag_category cat = r->category < AG_CAT__COUNT
                        ? r->category
                        : ag_classify(it->text, it->len);
  bool cut;
  ag__collapse_ws(shown, shown_cap, it->text, it->len, SHOWN_ERROR_CHARS, &cut);
  const char *ell = cut ? "..." : "";
  ring_push(g, &g->history, it->name, cat, it->text, it->len);
  ring_push(g, &g->unresolved, it->name, cat, it->text, it->len);
  g->unresolved_total++;
  it->t->unresolved++;

  count_identical_error(g, tn, it, shown, ell);
  count_tool_error(g, tn, it, shown, ell);
  count_total_error(g, tn, it, shown, ell);
  count_error_pattern(g, tn, it, cat, shown, ell);
}

/* Records result i of a batch: every mechanism that looks at one result. */
static void record_one(ag_guard *g, trip_note *tn, const ag_result *r, size_t i,
                       rec_tally *tally, char *shown, size_t shown_cap) {
  const ag_config *cfg = &g->cfg;
  rec_item it = {r,
                 (int)i,
                 r->name != NULL ? r->name : "",
                 r->text != NULL ? r->text : "",
                 r->text != NULL ? r->text_len : 0,
                 NULL,
                 false};
  if (r->outcome == AG_OUTCOME_DENIED) {
    record_denied(g, tn, &it);
    return;
  }
  g->denied_run = 0; /* any call that ran breaks 13's run */
  if (r->sig == NULL && r->outcome == AG_OUTCOME_ERROR) {
    tally->invalid++;
    record_invalid(g, &it);
    return;
  }

  it.is_err = r->outcome == AG_OUTCOME_ERROR ||
              ag_guard_is_error_text(g, it.text, it.len);
  it.t = tool_get(g, it.name);
  tally->counted++;
  if (cfg->loop.identical_call_scope == AG_SCOPE_CALL_AND_RESULT)
    record_by_result(g, tn, &it);
  if ((cfg->loop.repeated_result_limit > 0 ||
       cfg->loop.repeated_failure_limit > 0) &&
      r->sig != NULL)
    record_repeat(g, tn, &it, shown, shown_cap);
  if (!it.is_err) {
    /* success: empties the identical-error run, resets the tool's
     * failures, resolves its errors; its call's failures start again
     * (16), and a call that changes state changes the world */
    g->ident_run = 0;
    it.t->failures = 0;
    resolve(g, it.t);
    if (r->sig != NULL) {
      ok_find(g, r->sig, true)->epoch = ++g->ok_clock;
      if (is_changing(g, r->sig))
        g->world++;
    }
    return;
  }
  tally->failed++;
  record_error(g, tn, &it, shown, shown_cap);
}

/* 12: a reply none of whose calls could run is a refused reply. */
static void record_refused(ag_guard *g, trip_note *tn, const rec_tally *ty) {
  if (ty->counted > 0) {
    g->refused_run = 0;
  } else if (ty->invalid > 0) {
    g->refused_run++;
    if (g->cfg.loop.max_refused_replies > 0 &&
        g->refused_run >= g->cfg.loop.max_refused_replies)
      note(&tn[AG_REASON_REFUSED_REPLIES], -1, "",
           "%d replies in a row ran nothing (arguments that are not JSON)",
           g->refused_run);
  }
}

/* 7: failing iterations in a row; its trip also writes the verdict's
 * warning. */
static void record_failing_iteration(ag_guard *g, trip_note *tn,
                                     const rec_tally *ty,
                                     const ag_result *results, size_t n,
                                     ag_verdict *v) {
  const ag_config *cfg = &g->cfg;
  if (ty->counted == 0)
    return;
  bool failing = cfg->errors.failing_iteration == AG_FAIL_ALL_FAILED
                     ? ty->failed == ty->counted
                     : ty->failed > 0;
  g->failing_iters = failing ? g->failing_iters + 1 : 0;
  int lim = cfg->errors.max_consecutive_errors;
  if (lim <= 0 || g->failing_iters <= lim)
    return;
  trip_note *c = &tn[AG_REASON_CONSECUTIVE_ERRORS];
  c->tripped = true;
  c->index = -1;
  c->tool[0] = '\0';
  for (size_t i = n; i-- > 0;) {
    if (results[i].outcome != AG_OUTCOME_SKIPPED &&
        results[i].outcome != AG_OUTCOME_DENIED) {
      ag__scopy(c->tool, sizeof(c->tool),
                results[i].name != NULL ? results[i].name : "");
      break;
    }
  }
  snprintf(c->message, sizeof(c->message),
           "Exceeded maximum consecutive errors (%d)", lim);
  snprintf(v->warning, sizeof(v->warning),
           "\xe2\x9a\xa0\xef\xb8\x8f Maximum consecutive errors (%d) "
           "exceeded. Stopping execution to prevent infinite error loop.",
           lim);
}

AG_EXTERN ag_action ag_guard_record_results(ag_guard *g,
                                            const ag_result *results, size_t n,
                                            int64_t now_ms, ag_verdict *v) {
  verdict_reset(v);
  /* Only the flags are cleared: a note's text is written when it trips, and
   * clearing the whole array (7 KB) was a third of a call's cost. */
  trip_note tn[AG_REASON__COUNT];
  for (int r = 0; r < AG_REASON__COUNT; r++)
    tn[r].tripped = false;
  rec_tally tally = {0, 0, 0};
  char shown[96];
  for (size_t i = 0; i < n; i++) {
    if (results[i].outcome != AG_OUTCOME_SKIPPED)
      record_one(g, tn, &results[i], i, &tally, shown, sizeof(shown));
  }
  record_refused(g, tn, &tally);
  record_failing_iteration(g, tn, &tally, results, n, v);

  if (decide(g, tn, results, n, v) != AG_ALLOW)
    return v->action;
  /* The deadline is checked last: results that arrived are still recorded. */
  past_deadline(g, now_ms, v);
  return v->action;
}

AG_EXTERN ag_action ag_guard_check_text(ag_guard *g, const char *text,
                                        size_t len, bool piece, ag_verdict *v) {
  verdict_reset(v);
  int repeats = g->cfg.loop.content_loop_repeats;
  if (repeats <= 0 || text == NULL || len == 0)
    return AG_ALLOW;
  if (g->content == NULL) {
    ag_content_loop_opts o;
    ag_content_loop_opts_init(&o);
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
  v->action = trip_action(g);
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

AG_EXTERN ag_action ag_guard_record_refused(ag_guard *g, const char *text,
                                            size_t len, int64_t now_ms,
                                            ag_verdict *v) {
  verdict_reset(v);
  const ag_config *cfg = &g->cfg;
  g->empty_run = 0;
  remember_error(g, "", AG_CAT_VALIDATION, text != NULL ? text : "",
                 text != NULL ? len : 0);
  g->refused_run++;
  int lim = cfg->loop.max_refused_replies;
  if (lim > 0 && g->refused_run >= lim) {
    v->action = trip_action(g);
    v->reason = AG_REASON_REFUSED_REPLIES;
    snprintf(v->message, sizeof(v->message),
             "%d replies in a row ran nothing (no usable tool call)",
             g->refused_run);
    v->suggestion = trip_suggestion(v->reason);
    g->last_trip = v->reason;
    g->trips++;
    return v->action;
  }
  past_deadline(g, now_ms, v);
  return v->action;
}

AG_EXTERN ag_action ag_guard_record_empty(ag_guard *g, int64_t now_ms,
                                          ag_verdict *v) {
  verdict_reset(v);
  int lim = g->cfg.loop.max_empty_replies;
  if (lim <= 0)
    return AG_ALLOW;
  g->empty_run++;
  if (g->empty_run >= lim) {
    v->action = AG_STOP;
    v->reason = AG_REASON_EMPTY_REPLY;
    snprintf(v->message, sizeof(v->message),
             "The model sent %d empty replies in a row (no text, no tool call)",
             g->empty_run);
    v->suggestion = "Check the model server: it answers with nothing.";
    g->last_trip = v->reason;
    g->trips++;
    return v->action;
  }
  if (past_deadline(g, now_ms, v))
    return v->action;
  v->action = AG_NUDGE;
  v->reason = AG_REASON_EMPTY_REPLY;
  ag__scopy(v->message, sizeof(v->message), AG_EMPTY_REPLY_NOTE);
  return v->action;
}

AG_EXTERN ag_action ag_guard_run_batch(ag_guard *g, const ag_call *calls,
                                       size_t n, int64_t now_ms, ag_run_fn run,
                                       void *user, ag_call_check *checks,
                                       ag_result *results, ag_verdict *v,
                                       bool *ran) {
  if (ran != NULL)
    *ran = false;
  ag_action a = ag_guard_check_calls(g, calls, n, now_ms, checks, v);
  if (a != AG_ALLOW)
    return a;
  for (size_t i = 0; i < n; i++) {
    ag_result *r = &results[i];
    r->name = calls[i].name != NULL ? calls[i].name : "";
    r->sig = checks[i].valid ? checks[i].sig : NULL;
    r->category = AG_CAT__COUNT;
    if (checks[i].action == AG_NUDGE) {
      r->outcome = AG_OUTCOME_SKIPPED;
      r->text = checks[i].message;
    } else if (!checks[i].valid) {
      r->outcome = AG_OUTCOME_ERROR;
      r->category = AG_CAT_VALIDATION;
      r->text = checks[i].message;
    } else {
      r->outcome = AG_OUTCOME_OK;
      r->text = "";
    }
    r->text_len = strlen(r->text);
  }
  int64_t after = now_ms;
  if (run != NULL) {
    after = run(user, calls, checks, n, results);
    if (ran != NULL)
      *ran = true;
  }
  return ag_guard_record_results(g, results, n, after, v);
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
    memset(g->repeat, 0, sizeof(g->repeat));
    break;
  case AG_REASON_TOKEN_BUDGET:
    g->tokens = 0;
    break;
  default:
    break;
  }
  if (is_loop_mechanism(reason)) {
    g->nudged = false;
    g->hold_armed = false;
  }
}

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
    out_compact(o, g, ring_at(r, i));
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
      const err_entry *e = ring_at(&g->unresolved, g->unresolved.count - 1);
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
    const err_entry *e = ring_at(&g->history, i);
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
    const err_entry *e = ring_at(&g->history, g->history.count - 1);
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
    const err_entry *e = ring_at(&g->unresolved, i);
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
