/*
 * src/core/guard_record.c - the checks after the results: mechanisms 3
 * (call_and_result scope), 4 on results, 5-9 (errors), 12, 13, 15, 16 and
 * the progress a changing call makes. The state and the design are in
 * guard_state.h and guard.c.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "guard_state.h"

/* ------------------------------------------------------------------------ */
/* Mechanisms 3 (call_and_result), 5-9: after the results                   */
/* ------------------------------------------------------------------------ */

/* A success of tool `t` resolves its errors, and the errors with no tool
 * (a reply without a tool call), which any success resolves. Errors no longer
 * held in the ring are only counted, through each tool's `unresolved`. */
static void resolve(ag_guard *g, tool_state *t) {
  tool_state *none = t->name[0] != '\0' ? ag__guard_tool_find(g, "") : NULL;
  if (t->unresolved == 0 && (none == NULL || none->unresolved == 0))
    return;
  err_ring *r = &g->unresolved;
  int kept = 0;
  for (int i = 0; i < r->count; i++) {
    err_entry *e = ag__guard_ring_at(r, i);
    if (strcmp(e->tool, t->name) == 0 || e->tool[0] == '\0')
      continue;
    if (kept != i) {
      err_entry *dst = ag__guard_ring_at(r, kept);
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
  if (victim->epoch == 0)
    marks_note(&g->oks_taken, (size_t)(victim - g->oks));
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
  if (r == NULL && victim->count == 0)
    marks_note(&g->repeat_taken, (size_t)(victim - g->repeat));
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
  tool_state *t = ag__guard_tool_get(g, name);
  if (cat >= AG_CAT__COUNT)
    cat = AG_CAT_VALIDATION;
  ag__guard_ring_push(g, &g->history, name, cat, text, len);
  ag__guard_ring_push(g, &g->unresolved, name, cat, text, len);
  g->unresolved_total++;
  t->unresolved++;
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
    if (ag__guard_is_loop(r) && ag__guard_nudge_first(g)) {
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
                 LOOP_CAUSE_WIDTH, tn[r].message,
                 ag__guard_suggestion(AG_REASON_IDENTICAL_CALLS));
        snprintf(v->message, sizeof(v->message),
                 "Potential loop detected: %.*s. The same call will not be "
                 "run again. %s",
                 LOOP_CAUSE_WIDTH, tn[r].message,
                 ag__guard_suggestion(AG_REASON_IDENTICAL_CALLS));
      } else {
        snprintf(v->message, sizeof(v->message),
                 "Potential loop detected: %.*s. %s", LOOP_CAUSE_WIDTH,
                 tn[r].message, ag__guard_suggestion(r));
      }
      return v->action;
    }
    v->action = ag__guard_trip_action(g);
    ag__scopy(v->message, sizeof(v->message), tn[r].message);
    v->suggestion = ag__guard_suggestion(r);
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
  tool_state *t = ag__guard_tool_get(g, it->name);
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
  ag__guard_digest_text(g, "", it->text, it->len, rh);
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
  int p = ag__guard_cycle_push(g, true, pk);
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
    ag__guard_digest_norm(g, "\x01", it->r->sig, AG_SIG_LEN, it->text, it->len,
                          pk);
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
  ag__guard_digest_norm(g, it->name, NULL, 0, it->text, it->len, key);
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

/* A failed call: kept for the error context, then, when it counts (a
 * malfunction, or every failure with counted_failures "all"), 5, 6, 8, 9.
 * `shown`: scratch. */
static void record_error(ag_guard *g, trip_note *tn, const rec_item *it,
                         ag_category cat, bool counts, char *shown,
                         size_t shown_cap) {
  bool cut;
  ag__collapse_ws(shown, shown_cap, it->text, it->len, SHOWN_ERROR_CHARS, &cut);
  const char *ell = cut ? "..." : "";
  ag__guard_ring_push(g, &g->history, it->name, cat, it->text, it->len);
  ag__guard_ring_push(g, &g->unresolved, it->name, cat, it->text, it->len);
  g->unresolved_total++;
  it->t->unresolved++;
  if (!counts) {
    /* information (a failing test, a program's traceback): the tool did
     * its job, so the malfunction counters see a call that worked; it
     * stays in the error context, and 16 counts its repeats */
    g->ident_run = 0;
    it->t->failures = 0;
    return;
  }
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
  it.t = ag__guard_tool_get(g, it.name);
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
      if (ag__guard_is_changing(g, r->sig))
        g->world++;
    }
    return;
  }
  ag_category cat =
      r->category < AG_CAT__COUNT ? r->category : ag_classify(it.text, it.len);
  bool counts = cfg->errors.counted_failures != AG_COUNT_MALFUNCTIONS ||
                !ag__failure_is_information(cat, it.text, it.len);
  if (counts)
    tally->failed++; /* information is no failing iteration (7) */
  record_error(g, tn, &it, cat, counts, shown, shown_cap);
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
  ag__guard_verdict_reset(v);
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
  ag__guard_past_deadline(g, now_ms, v);
  return v->action;
}

AG_EXTERN ag_action ag_guard_record_refused(ag_guard *g, const char *text,
                                            size_t len, int64_t now_ms,
                                            ag_verdict *v) {
  ag__guard_verdict_reset(v);
  const ag_config *cfg = &g->cfg;
  g->empty_run = 0;
  remember_error(g, "", AG_CAT_VALIDATION, text != NULL ? text : "",
                 text != NULL ? len : 0);
  g->refused_run++;
  int lim = cfg->loop.max_refused_replies;
  if (lim > 0 && g->refused_run >= lim) {
    v->action = ag__guard_trip_action(g);
    v->reason = AG_REASON_REFUSED_REPLIES;
    snprintf(v->message, sizeof(v->message),
             "%d replies in a row ran nothing (no usable tool call)",
             g->refused_run);
    v->suggestion = ag__guard_suggestion(v->reason);
    g->last_trip = v->reason;
    g->trips++;
    return v->action;
  }
  ag__guard_past_deadline(g, now_ms, v);
  return v->action;
}

AG_EXTERN ag_action ag_guard_record_empty(ag_guard *g, int64_t now_ms,
                                          ag_verdict *v) {
  ag__guard_verdict_reset(v);
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
  if (ag__guard_past_deadline(g, now_ms, v))
    return v->action;
  v->action = AG_NUDGE;
  v->reason = AG_REASON_EMPTY_REPLY;
  ag__scopy(v->message, sizeof(v->message), AG_EMPTY_REPLY_NOTE);
  return v->action;
}
