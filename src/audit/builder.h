/*
 * src/audit/builder.h - what the readers of recorded runs share
 * (trajectory.c, traj_*.c; ag__tb_ prefix): the trajectory's allocation,
 * the builder every reader fills, and the readers. Not installed, not API.
 */
#ifndef AG_AUDIT_BUILDER_H
#define AG_AUDIT_BUILDER_H

#include <stdbool.h>
#include <stdint.h>

#include <jansson.h>

#include "agentguard/audit.h"
#include "../core/internal.h"
#include "../wire/wire.h"

#define JFLAGS                                                                 \
  (JSON_DECODE_INT_AS_REAL | JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES)

typedef struct achunk {
  struct achunk *next;
  size_t used, cap;
  char data[];
} achunk;

/* What ag_trajectory.priv points at: the public struct comes first, so one
 * allocation holds both. */
typedef struct traj_full {
  ag_trajectory pub;
  json_t *root; /* every borrowed string lives in here */
  json_t *chat; /* or here: another shape's messages as chat (wire.h) */
  achunk *chunks;
  ag_traj_turn *turns;
  ag_traj_step *steps;
  ag_traj_call *calls;
  ag_traj_result *results;
} traj_full;

typedef struct bstep {
  size_t call0, n_calls, res0, n_results;
  bool rejected;
  bool has_response; /* events: a model_response was seen */
  bool no_reply;     /* events: a request that got no reply */
  bool has_text;     /* the recording gives the reply's text */
  int64_t tokens;    /* the reply's usage, or -1 */
  const char *text;  /* the reply's text (jansson-owned), when has_text */
  size_t text_len;
  int iteration;    /* events: the "iteration" it belongs to, else 0 */
  size_t origin;    /* the message / step / event that opened it */
  long origin_line; /* its line in JSON Lines, else 0 */
  int64_t t_req, t_resp, t_done;
} bstep;

typedef struct bturn {
  size_t step0, n_steps;
  int64_t t_start;
} bturn;

typedef struct builder {
  const ag_traj_opts *o;
  ag_error_t *err;
  traj_full *f;
  /* calls and the results that answer them; ids and `answered` run
   * parallel to them */
  ag_traj_call *calls;
  const char **ids;
  size_t n_calls, cap_calls;
  ag_traj_result *results;
  bool *answered;
  size_t n_results, cap_results;
  bstep *steps;
  size_t n_steps, cap_steps;
  bturn *turns;
  size_t n_turns, cap_turns;
  bool new_turn;      /* a user message arrived: the next step opens a turn */
  int64_t new_turn_t; /* when it arrived, or -1 */
  bool turn_ended;    /* events: turn_end came, turn_start did not yet */
  int64_t last_t;     /* events: the latest t_ms so far, or -1 */
  /* where we are, for messages: "message 7", "line 12", "step 3" */
  const char *unit;
  size_t unit_no;
  long line; /* JSON Lines: the line of the current value, else 0 */
  bool tape; /* the neutral format may be read from the tape first */
} builder;

/* An error at the current place in the input: "message 7: ...". */
ag_err_t ag__tb_fail(builder *b, ag_err_t code, const char *fmt, ...)
    AG__PRINTF(3, 4);
ag_err_t ag__tb_nomem(builder *b);
/* A user message arrived at `t`: the next step opens a new turn. */
void ag__tb_user(builder *b, int64_t t);
/* Opens a step (events: of `iteration`); the current step, or NULL. */
ag_err_t ag__tb_step(builder *b, int iteration);
bstep *ag__tb_cur_step(builder *b);
/* Appends a result (unanswered, skipped, text "") to the current step; a
 * call to the current step, with `with_result` also the slot answering it. */
ag_err_t ag__tb_result(builder *b);
ag_err_t ag__tb_call(builder *b, const char *name, const char *args,
                     size_t args_len, const char *id, bool with_result);
/* A call's arguments: a string as the model sent it, any other value
 * dumped compact, missing or null "". */
ag_err_t ag__tb_args(builder *b, const json_t *v, const char **out,
                     size_t *len);
/* The "usage" in `obj`: OpenAI's prompt + completion tokens or Anthropic's
 * input + output tokens; -1 when absent. */
ag_err_t ag__tb_usage(builder *b, const json_t *obj, int64_t *tokens);
/* A string, null/missing (""), or an array of content parts joined by
 * newlines. */
ag_err_t ag__tb_text(builder *b, const json_t *v, const char *what,
                     const char **out, size_t *len);
/* A timestamp field: a number >= 0, or -1 when absent. */
ag_err_t ag__tb_time(builder *b, const json_t *obj, const char *key,
                     int64_t *out);
ag_run_outcome ag__tb_outcome(const json_t *obj);
const char *ag__tb_source(const json_t *obj);
bool ag__tb_truthy(const json_t *v);

/* n bytes in the trajectory's arena (lives as long as it), or NULL. */
char *ag__tb_alloc(builder *b, size_t n);

/* What ag__tb_parse_neutral_tape returns for an input it leaves to the
 * tree path (jansson): nothing it read counts. */
#define AG__TB_FALLBACK ((ag_err_t)-1000)

/* The readers, one per format (traj_*.c). */
ag_err_t ag__tb_parse_neutral(builder *b, const json_t *root);
/* The neutral format from the JCS tape (traj_tape.c): AG_OK, an allocation
 * failure, or AG__TB_FALLBACK. */
ag_err_t ag__tb_parse_neutral_tape(builder *b, const char *buf, size_t len);
ag_err_t ag__tb_parse_chat(builder *b, const json_t *msgs, const long *lines);
ag_err_t ag__tb_parse_events(builder *b, const json_t *evs, const long *lines);

#endif /* AG_AUDIT_BUILDER_H */
