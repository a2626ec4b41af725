/*
 * agentguard/agent.h - the agentic loop: sessions with a history, turns and
 * iterations (docs/agent.md), the guard on every batch, approvals and
 * execution through the scheduler, the ephemeral error context, nudges, the
 * wrap-up request at the iteration cap, escalation to a human, the turn
 * deadline and caller cancellation, and the event stream (section 5).
 *
 * Thread-safety: an ag_agent (a session) runs one turn at a time, on the
 * caller's thread. Callbacks: approve and human run on that thread; on_event
 * runs on that thread or on scheduler pool threads (tool_attempt), never
 * concurrently (the agent serialises it). The caller's cancel token may be
 * fired from any thread or a signal handler.
 */
#ifndef AGENTGUARD_AGENT_H
#define AGENTGUARD_AGENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "common.h"
#include "core.h"
#include "exec.h"
#include "providers.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  AG_TURN_COMPLETED = 0,
  AG_TURN_STOPPED,
  AG_TURN_ESCALATED,
  AG_TURN_TIMED_OUT,
  AG_TURN_CANCELLED,
  AG_TURN_FAILED
} ag_turn_status;

/* "completed", "stopped", "escalated", "timed_out", "cancelled", "failed". */
AG_EXTERN const char *ag_turn_status_name(ag_turn_status s);

/* The outcome of a turn. Release with ag_turn_outcome_clear. */
typedef struct ag_turn_outcome {
  ag_turn_status status;
  /* a mechanism's reason code (docs/configuration.md), or final_answer,
   * loop_breaking_tool, cancelled, model_error, script_exhausted (and
   * out_of_memory, the one failure the design does not name) */
  char reason[32];
  char message[1024]; /* for people: what happened and why */
  char *final_text;   /* the answer or partial answer (caller-owns), or NULL */
  int iterations;     /* model requests in the turn, the final one included */
  int tool_calls;     /* calls executed (denied, held and blocked excluded) */
  int64_t tokens;     /* prompt + completion tokens the provider reported in
                         the turn (0 when it reports none) */
} ag_turn_outcome;

/* Frees o->final_text and zeroes the outcome, ready for the next turn.
 * NULL does nothing. */
AG_EXTERN void ag_turn_outcome_clear(ag_turn_outcome *o);

typedef enum { AG_HUMAN_STOP = 0, AG_HUMAN_CONTINUE } ag_human_action;

/*
 * Escalation (errors.on_trip = escalate): `record` is the escalation record
 * JSON (borrowed for the call). Return AG_HUMAN_CONTINUE, optionally with a
 * hint in hint[0..hint_cap) that joins the history as a user message, or
 * AG_HUMAN_STOP. With no human callback the turn ends escalated.
 */
typedef ag_human_action (*ag_human_fn)(void *user, const char *record,
                                       char *hint, size_t hint_cap);

/*
 * One event of docs/events.md (an object with "event", "turn",
 * "iteration", "t_ms" and the event's fields), borrowed for the call.
 */
typedef void (*ag_event_fn)(void *user, const json_t *event);

/*
 * Options of a session. Versioned like ag_scheduler_opts: `size` comes first
 * and ag_agent_opts_init sets it (docs/c-api.md, "Options structs"). Always
 * start from ag_agent_opts_init. The embedded ag_config is a plain value
 * whose size is part of the ABI of this version.
 */
typedef struct ag_agent_opts {
  size_t size;               /* set by ag_agent_opts_init; do not change */
  ag_config config;          /* copied */
  ag_provider *provider;     /* borrowed; required */
  const ag_registry *tools;  /* borrowed; may be NULL (no tools) */
  const char *system_prompt; /* copied; may be NULL */
  ag_approve_fn approve;     /* NULL: approve everything */
  void *approve_user;
  ag_human_fn human; /* NULL: escalations end the turn */
  void *human_user;
  ag_event_fn on_event; /* may be NULL */
  void *event_user;
  ag_delta_fn on_delta; /* streaming text of model replies as it arrives,
                           on the turn's thread; may be NULL */
  void *delta_user;
  size_t max_history_bytes; /* cap of the stored history (default 8 MiB):
                               oldest turns are dropped first, never the
                               system prompt or the current turn */
  uint64_t seed;            /* jitter of retries; 0: from the clock */
  bool events_full;         /* model_request events carry the messages
                               sent (redacted), not only their count */
} ag_agent_opts;

/* Fills `o` with the defaults: the `default` preset, no tools, no
 * callbacks, the 8 MiB history cap, seed 0; sets o->size. NULL does
 * nothing. */
AG_EXTERN void ag_agent_opts_init(ag_agent_opts *o);

typedef struct ag_agent ag_agent;

/*
 * Creates a session: its guard and scheduler. `opts` is required and copied
 * (its strings too); opts->provider is required. Returns AG_OK and sets
 * *out, or AG_EINVAL (out, opts or opts->provider NULL, or opts->size not set
 * by ag_agent_opts_init), AG_ECONFIG, AG_ENOMEM, AG_ECRYPTO, AG_EIO; *out is
 * NULL on failure (when out is not NULL). `err` may be NULL.
 */
AG_EXTERN ag_err_t ag_agent_new(ag_agent **out, const ag_agent_opts *opts,
                                ag_error_t *err);
/* Frees a session: its history, guard and scheduler (joining the pool
 * threads). Not while a turn runs. NULL does nothing. */
AG_EXTERN void ag_agent_free(ag_agent *a);

/*
 * Runs one turn for `user_message` (copied) until a final answer, a loop
 * breaking tool, a guard stop or escalation, the deadline, a cancel, or a
 * model error. `cancel` (may be NULL) is the caller's token. Always fills
 * *out (also when the turn stops: nothing is lost) and leaves the session
 * ready for the next message. Returns AG_OK (the turn ran, whatever its
 * status), AG_EINVAL, AG_ENOMEM, or AG_EIO (no cancellation token could be
 * made: nothing ran, *out is failed). Out of memory in the middle of a turn
 * ends it failed with reason "out_of_memory".
 */
AG_EXTERN ag_err_t ag_agent_run_turn(ag_agent *a, const char *user_message,
                                     ag_cancel *cancel, ag_turn_outcome *out,
                                     ag_error_t *err);

/*
 * The history in the OpenAI chat shape, as a NEW array parsed from the
 * stored text (the caller json_decref's it), or NULL when `a` is NULL or
 * out of memory. The session keeps its history as compact JSON text (about
 * one byte of heap per byte of JSON): this builds a tree each call.
 */
AG_EXTERN json_t *ag_agent_history(const ag_agent *a);

/*
 * The history as compact JSON text, "[...]" (borrowed: valid until the next
 * run_turn or free; NUL-terminated), its length in *len (may be NULL), or
 * NULL when `a` is NULL. No copy, no allocation.
 */
AG_EXTERN const char *ag_agent_history_json(const ag_agent *a, size_t *len);

/* The session's guard (borrowed), e.g. for ag_guard_dump. */
AG_EXTERN const ag_guard *ag_agent_guard(const ag_agent *a);

#ifdef __cplusplus
}
#endif
#endif /* AGENTGUARD_AGENT_H */
