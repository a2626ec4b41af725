/*
 * src/agent/internal.h - declarations shared between the agent layer's files
 * (ag__ prefix). Not installed, not API.
 *
 * Files and what they own:
 *   loop.c    ag_agent_*, ag_turn_*: sessions, history, turns, iterations,
 *             network retries, the guard and the scheduler on every batch
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

#endif /* AG_AGENT_INTERNAL_H */
