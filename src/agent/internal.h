/*
 * src/agent/internal.h - declarations shared between the agent layer's files
 * (ag__ prefix). Not installed, not API.
 *
 * Files and what they own:
 *   agent.c   ag_agent_*: a session's construction and accessors
 *   history.c the stored history (text, capped by turns), call ids, the
 *             messages stored
 *   loop.c    ag_agent_run_turn: turns, iterations, model requests with
 *             network retries, the wrap-up, how a turn ends
 *   batch.c   one batch of tool calls: the guard, the scheduler, approvals,
 *             one tool message per call, the batch's verdict
 *   events.c  ag__events and ag__ev_*: building the event objects of
 *             DESIGN.md section 5 and handing them to on_event, serialised
 */
#ifndef AG_AGENT_INTERNAL_H
#define AG_AGENT_INTERNAL_H

#include <pthread.h>

#include "agentguard/agent.h"

#include "../core/internal.h"

/* ---- events.c ----------------------------------------------------------- */

/*
 * The event sink of one agent. `mu` serialises on_event (the loop thread and
 * scheduler pool threads both emit) and guards `turn` / `iteration`, the
 * position every event carries. With no callback every ag__ev_* returns at
 * once without building anything.
 */
typedef struct ag__events {
  pthread_mutex_t mu;
  ag_event_fn fn; /* may be NULL */
  void *user;
  int64_t t0; /* ag_now_ms() at creation: events carry t_ms = now - t0 */
  int turn;
  int iteration;
  unsigned long lost; /* events not delivered: out of memory (under mu) */
  /* Values of secret-named environment variables when the agent was
   * created (copies in secret_buf): every event text is redacted with them
   * (src/core/redact.c). Read-only after ag__ev_init. */
  ag__secret secrets[AG__SECRETS_MAX];
  size_t n_secrets;
  char *secret_buf;
} ag__events;

/* Also snapshots the secrets of the process's environment (AG_ENOMEM). */
ag_err_t ag__ev_init(ag__events *ev, ag_event_fn fn, void *user);
void ag__ev_destroy(ag__events *ev);
/* True when events are wanted (a callback is set). */
bool ag__ev_on(const ag__events *ev);
/* Sets the position stamped on the following events. */
void ag__ev_position(ag__events *ev, int turn, int iteration);

/*
 * A JSON string for `len` bytes of arbitrary text (new reference, NULL on
 * ENOMEM). Invalid UTF-8 bytes become U+FFFD, so tool output that is not
 * text still reaches the history and the events as valid JSON. NULL text
 * gives JSON null.
 */
json_t *ag__json_text(const char *text, size_t len);

/* Emits one event: `fields` (steals; may be NULL) gets "event", "turn",
 * "iteration" and "t_ms" put in front of its own keys. */
void ag__ev_emit(ag__events *ev, const char *name, json_t *fields);

void ag__ev_turn_start(ag__events *ev, const char *user);
/* The request about to be made: the message count (or, with `full`, the
 * messages themselves, parsed from their JSON text and redacted), the
 * history's size, whether the ephemeral error context is in it, and the
 * tools offered (none on the wrap-up request). */
void ag__ev_model_request(ag__events *ev, const char *messages_json,
                          size_t messages_len, size_t n_messages,
                          const char *const *tools, size_t n_tools,
                          bool error_context, size_t history_bytes, bool full);
void ag__ev_provider_retry(ag__events *ev, int attempt, int status,
                           const char *message, int64_t delay_ms);
void ag__ev_model_response(ag__events *ev, const ag_reply *r);
/* `sig` NULL: the arguments were invalid (signature null). */
void ag__ev_tool_call(ag__events *ev, const char *call_id, const char *name,
                      const char *args, size_t args_len, const uint8_t *sig);
void ag__ev_approval(ag__events *ev, const char *call_id, const char *name,
                     bool approved);
void ag__ev_tool_blocked(ag__events *ev, const char *call_id, const char *name,
                         const char *reason);
void ag__ev_tool_attempt(ag__events *ev, const char *call_id,
                         const ag_attempt *at);
void ag__ev_tool_result(ag__events *ev, const char *call_id, const char *name,
                        bool ok, int attempts, const char *category,
                        const char *text, size_t text_len);
void ag__ev_error_context(ag__events *ev, const char *text);
void ag__ev_nudge(ag__events *ev, const char *reason, const char *text);
void ag__ev_warning(ag__events *ev, const char *message);
/* `record`: the escalation record's JSON text (parsed into an object). */
void ag__ev_escalation(ag__events *ev, const char *record);
void ag__ev_human(ag__events *ev, const char *action, const char *message);
void ag__ev_turn_end(ag__events *ev, const ag_turn_outcome *o);

/* ---- the session and its turns (agent.c, history.c, loop.c, batch.c) ---- */

#define ECTX_CAP ((size_t)64 << 10)
/* The most the buffer ever holds beyond max_history_bytes: the current
 * iteration is never cut (docs/agent.md "History cap"), so the cap leaves
 * it room; past it an append fails like out of memory. */
#define HISTORY_OVER_CAP ((size_t)1 << 30)

typedef struct turn_span {
  size_t start;
  size_t bytes;
} turn_span;

/* One stored message: its compact JSON is text.p[off .. off + len). */
typedef struct hist_msg {
  size_t off;
  size_t len;
  bool tool; /* role "tool": answers the assistant message before it */
} hist_msg;

struct ag_agent {
  ag_config cfg;
  ag_provider *provider;  /* borrowed */
  const ag_registry *reg; /* borrowed, or own_reg */
  ag_registry *own_reg;   /* an empty registry when opts.tools is NULL */
  ag_human_fn human;
  void *human_user;
  ag_delta_fn on_delta; /* streaming text of model replies, or NULL */
  void *delta_user;
  size_t max_history_bytes;
  bool events_full; /* model_request events carry the messages */
  uint64_t rng;     /* xorshift64* state for network retry jitter */

  ag_guard *guard;
  ag_scheduler *sched;
  ag__events ev;

  /* The history as text ("History" below): the messages' compact JSON,
   * a ready array, and where each message is in it. */
  ag__buf text;
  size_t base; /* where the array starts in text.p (after a front drop) */
  hist_msg *msgs_mem; /* cap_msgs records allocated */
  hist_msg *msgs;     /* msgs_mem + a gap of records dropped at the front */
  size_t n_msgs, cap_msgs;
  /* Each stored turn: the history index of its user message and its size
   * as compact JSON (messages and their commas), measured once when it
   * ended, so capping the history never re-serializes it. */
  turn_span *turns;
  size_t n_turns, cap_turns;
  size_t stored_bytes; /* the history's compact JSON size */
  int turn;
  /* The turn in progress, bounded too (docs/agent.md "History cap"): its
   * messages' size as they are appended, where its current iteration
   * starts, and the first of its messages not yet compacted. */
  bool in_turn;
  size_t turn_bytes;
  size_t iter_start;
  size_t compact_from;

  char *ectx; /* ECTX_CAP bytes: the pending error context */

  /* The batch being executed: call ids by index, for on_attempt. */
  const char *const *batch_ids;
  size_t batch_n;
};

typedef struct turn_ctx {
  ag_agent *a;
  ag_cancel *tt; /* the turn token */
  ag_turn_outcome *out;
  json_t *tools_json; /* offered to the model, or NULL */
  const char **tool_names;
  size_t n_tools;
  int iterations; /* model requests made, the wrap-up included */
  bool has_ectx;  /* a->ectx goes into the next request */
  char *partial;  /* the turn's last assistant text, for stops */
  bool oom;
  /* the current reply's streamed text, checked for a content loop (14) */
  bool streamed;        /* a delta arrived */
  bool content_stop;    /* the check stopped the stream */
  ag_verdict content_v; /* its verdict */
  char *stream;         /* the reply's text so far, STREAM_CAP at most */
  size_t stream_len;
} turn_ctx;

/* The call ids of a reply: the model's, or generated "call_<t>_<i>_<k>". */
typedef struct call_ids {
  const char **ids;
  char (*gen)[48];
} call_ids;

typedef enum { GO_ON = 0, END_TURN } step;

/* agent.c */
void ag__turn_outcome_set(ag_turn_outcome *o, ag_turn_status st,
                          const char *reason, const char *fmt, ...)
    AG__PRINTF(4, 5);
/* {"role": role, "content": content} (new reference; NULL on ENOMEM). */
json_t *ag__msg(const char *role, const char *content);
ag_err_t ag__agent_nomem(ag_error_t *err);

/* history.c: appending steals m and is undone by truncating to the count
 * before; the cap drops whole stored turns (docs/agent.md "History cap"). */
bool ag__hist_push(ag_agent *a, const json_t *m, bool tool);
bool ag__hist_append(ag_agent *a, json_t *m);
void ag__hist_truncate(ag_agent *a, size_t len);
void ag__hist_cut(ag_agent *a, size_t from, size_t to);
void ag__hist_shrink(ag_agent *a);
void ag__hist_measure_turn(ag_agent *a);
void ag__hist_cap(ag_agent *a, size_t extra);
bool ag__hist_turn_start(ag_agent *a, size_t index);
bool ag__ids_make(call_ids *c, const ag_reply *r, int turn, int iter);
void ag__ids_free(call_ids *c);
const char *ag__call_name(const ag_tool_call *c);
const char *ag__call_args(const ag_tool_call *c, size_t *len);
json_t *ag__assistant_message(const ag_reply *r, const call_ids *ids);
json_t *ag__tool_message(const char *call_id, const char *text, size_t len);

/* loop.c: how a turn ends, and the error context for the next request. */
void ag__turn_end_cancelled(turn_ctx *t, ag_cancel_reason why);
ag_cancel_reason ag__turn_fired(turn_ctx *t);
void ag__turn_end_stopped(turn_ctx *t, const ag_verdict *v);
bool ag__turn_escalate(turn_ctx *t, const ag_verdict *v);
step ag__after_errors(turn_ctx *t, ag_recover_kind kind);

/* batch.c: a reply with tool calls; false from answer_not_run on ENOMEM. */
step ag__run_calls(turn_ctx *t, const ag_reply *reply, const call_ids *ids);
bool ag__answer_not_run(turn_ctx *t, const ag_reply *r, const call_ids *ids,
                        const char *reason, const char *why);

#endif /* AG_AGENT_INTERNAL_H */
