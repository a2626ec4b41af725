/*
 * src/core/guard_state.h - the guard's state (struct ag_guard) and what the
 * guard's files share (ag__guard_ prefix). Not installed, not API.
 *
 *   guard.c         state, construction, turn, mechanism 1, shared helpers
 *   guard_check.c   mechanisms 2, 3, 4 before execution (check_calls)
 *   guard_record.c  mechanisms 3 (call_and_result), 5-16 after results
 *   guard_dump.c    error context, escalation record, dump
 */
#ifndef AG_CORE_GUARD_STATE_H
#define AG_CORE_GUARD_STATE_H

#include <string.h>

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
/* The slots of a table taken since it was last emptied, up to DIRTY_MAX
 * of them (past it, n counts on and the whole table is emptied): emptying
 * it then costs the slots a turn took, not the table (guard.c,
 * guard_record.c). */
#define DIRTY_MAX 64

typedef struct slot_marks {
  uint16_t at[DIRTY_MAX];
  unsigned n;
} slot_marks;

/* Slot i of the table was empty and is taken now. */
static inline void marks_note(slot_marks *m, size_t i) {
  if (m->n++ < DIRTY_MAX)
    m->at[m->n - 1] = (uint16_t)i;
}

/* Empties the slots noted in m of `table` (table_size bytes, slots of
 * slot_size), or all of it. */
static inline void marks_empty(slot_marks *m, void *table, size_t table_size,
                               size_t slot_size) {
  if (m->n > DIRTY_MAX) {
    memset(table, 0, table_size);
  } else {
    for (unsigned k = 0; k < m->n; k++)
      memset((char *)table + m->at[k] * slot_size, 0, slot_size);
  }
  m->n = 0;
}

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
  /* the slots of repeat / oks taken since they were last emptied: a
   * turn's start empties those alone, not 18 KB and 2.5 KB (the proxy
   * renews a guard per request, after a turn of a few calls) */
  slot_marks repeat_taken, oks_taken;
  /* progress: the world's epoch (one more per successful call that
   * changes state), the batch's changing calls, successes per call */
  uint32_t world;
  uint8_t changing[CHANGING_MAX][REPEAT_KEY];
  int n_changing;
  bool changing_all;
  /* the call of the batch whose arguments jcs's tape holds (the last one
   * signed), or NULL: progress reads that one's members from the tape */
  const ag_call *tape_call;
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
/* Shared by the guard's files (guard.c)                                    */
/* ------------------------------------------------------------------------ */

/* A verdict with nothing decided (AG_ALLOW, no reason, no call). */
void ag__guard_verdict_reset(ag_verdict *v);
/* The state of tool `name`, made when new (never fails: when the table is
 * full, the least recently used entry is forgotten); or only if tracked. */
tool_state *ag__guard_tool_get(ag_guard *g, const char *name);
tool_state *ag__guard_tool_find(ag_guard *g, const char *name);
/* SHA-256 of `name` NUL `text`, exactly. */
void ag__guard_digest_text(ag_guard *g, const char *name, const char *text,
                           size_t len, uint8_t out[AG_SIG_LEN]);
/* SHA-256 of `name` NUL `pre` and `text`, whitespace collapsed and, with
 * errors.normalize_errors, volatile tokens replaced (guard.c says which). */
void ag__guard_digest_norm(ag_guard *g, const char *name, const uint8_t *pre,
                           size_t pre_len, const char *text, size_t len,
                           uint8_t out[AG_SIG_LEN]);
/* Past the turn's deadline: `v` is the turn_timeout stop, true. */
bool ag__guard_past_deadline(ag_guard *g, int64_t now, ag_verdict *v);
/* The action for a trip of mechanisms 2-9: stop, or escalate by config. */
ag_action ag__guard_trip_action(const ag_guard *g);
/* Entry i (0: the oldest) of a ring; appending forgets the oldest when full. */
err_entry *ag__guard_ring_at(const err_ring *r, int i);
void ag__guard_ring_push(ag_guard *g, err_ring *r, const char *tool,
                         ag_category cat, const char *text, size_t len);
/* The loop mechanisms (3, 4, 5, 16): a first trip nudges under
 * loop.nudge_before_stop. */
bool ag__guard_is_loop(ag_reason r);
/* The suggestion a trip of `r` carries. */
const char *ag__guard_suggestion(ag_reason r);

/* guard_check.c: the cycle detector (mechanism 4), the two strikes of the
 * loop mechanisms, the calls of the batch that change the world. */
int ag__guard_cycle_push(ag_guard *g, bool valid, const uint8_t *sig);
bool ag__guard_nudge_first(ag_guard *g);
bool ag__guard_is_changing(const ag_guard *g, const uint8_t *sig);

#endif
