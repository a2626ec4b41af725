/*
 * agentguard/audit.h - recorded agent runs ("trajectories") and the audit:
 * where would the guard have stopped them, and why.
 *
 * Two parts, both pure (no I/O, no clock, no threads, no globals):
 *
 *   - ag_trajectory: one recorded run in a neutral in-memory shape (turns of
 *     steps; a step is one model reply: the tool calls it asked for and the
 *     results they got), parsed from a memory buffer in any of five formats,
 *     detected automatically (ag_trajectory_parse).
 *   - ag_auditor: replays a trajectory through a guard built from a config,
 *     with exactly the calls the live agent loop makes (ag_guard_begin_turn,
 *     ag_guard_begin_iteration, ag_guard_run_batch), and reports the first
 *     step where the guard would have stopped the run (ag_auditor_run).
 *
 * The `agentguard audit` command is built on these; docs/audit.md describes
 * the formats, the replay rules and the output.
 *
 * Thread-safety: a parsed ag_trajectory is immutable and may be read from
 * any number of threads at once. An ag_auditor is not thread-safe: use one
 * per thread (they are cheap). ag_audit_summary is a plain value owned by the
 * caller. The functions without an object are safe from any thread.
 */
#ifndef AGENTGUARD_AUDIT_H
#define AGENTGUARD_AUDIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Trajectories                                                             */
/* ------------------------------------------------------------------------ */

/* The input formats ag_trajectory_parse recognises (docs/audit.md). */
typedef enum {
  AG_TRAJ_AUTO = 0,    /* detect (parse option only) */
  AG_TRAJ_NEUTRAL,     /* {"steps":[{"calls":[…],"results":[…]}], …} */
  AG_TRAJ_CHAT,        /* an OpenAI chat transcript: [message, …] */
  AG_TRAJ_CHAT_OBJECT, /* {"messages":[message, …], …} */
  AG_TRAJ_CHAT_JSONL,  /* JSON Lines, one chat message per line */
  AG_TRAJ_EVENTS,      /* JSON Lines of agentguard events (--events) */
  /* Anthropic Messages: {"messages":[message, …], …} or [message, …] whose
   * content blocks hold tool_use / tool_result (a request body, a saved
   * conversation); read as the proxy reads it (docs/audit.md) */
  AG_TRAJ_MESSAGES
} ag_traj_format;

/* "trajectory", "chat", "chat-object", "chat-jsonl", "events", "messages"
 * or "auto";
 * a static string. */
AG_EXTERN const char *ag_traj_format_name(ag_traj_format f);

/* How the recorded run ended, as its recording says (neutral "outcome", or
 * "outcome" beside "messages"); unknown when it does not say. */
typedef enum {
  AG_RUN_UNKNOWN = 0,
  AG_RUN_RESOLVED,
  AG_RUN_UNRESOLVED
} ag_run_outcome;

#define AG_RUN_OUTCOME_COUNT 3

/* "unknown", "resolved", "unresolved"; a static string. */
AG_EXTERN const char *ag_run_outcome_name(ag_run_outcome o);

/* One tool call the model asked for. */
typedef struct ag_traj_call {
  const char *name; /* NUL-terminated; never NULL */
  const char *args; /* the arguments' JSON text (may be invalid JSON) */
  size_t args_len;
} ag_traj_call;

/* What one call got back in the recording. */
typedef struct ag_traj_result {
  /* AG_OUTCOME_OK: the tool answered (errors.error_prefixes still make it an
   * error, as live); AG_OUTCOME_ERROR: it failed (neutral "ok": false, chat
   * "is_error": true, event "ok": false); AG_OUTCOME_SKIPPED: it did not run
   * in the recording (denied at approval, blocked). */
  ag_outcome outcome;
  ag_category category; /* AG_CAT_AUTO: let the guard classify the text */
  const char *text;     /* never NULL; may hold NUL bytes */
  size_t text_len;
} ag_traj_result;

/*
 * One step: one model request, the reply and what it led to.
 *   - A normal step: n_results == n_calls, results[i] answers calls[i].
 *   - rejected (neutral "rejected_by_harness"): the harness refused the reply
 *     and nothing ran; calls are what the reply proposed (informational),
 *     n_results is 1 and results[0] is the harness's observation.
 *   - no_reply (event logs): a model request that got no reply (it failed,
 *     or the guard refused it at the iteration cap); no calls, no results.
 *   - otherwise n_calls == 0: a reply without tool calls (a text answer).
 * Times are milliseconds on the recording's clock, -1 when unknown.
 */
typedef struct ag_traj_step {
  const ag_traj_call *calls;
  size_t n_calls;
  const ag_traj_result *results;
  size_t n_results;
  bool rejected;
  bool no_reply;
  int64_t t_request_ms;  /* the model request started */
  int64_t t_response_ms; /* the reply arrived (calls checked) */
  int64_t t_done_ms;     /* the last result arrived */
  /* The reply's text, when the recording keeps it (event logs'
   * model_response, chat assistant content, a neutral step's "text"), else
   * NULL. A reply with text "" and no call is an empty reply (mechanism
   * 15); the text is also what the content-loop detector (14) reads. */
  const char *text;
  size_t text_len;
  /* Prompt + completion tokens of the reply when the recording gives its
   * usage (event logs' model_response "usage", a neutral step's or a chat
   * message's "usage"), else -1. The replay adds them to the turn's tokens
   * (mechanism 11). */
  int64_t tokens;
} ag_traj_step;

/* One turn: a user message and the steps until the next one. Turns without
 * steps are never produced (two user messages in a row are one turn). */
typedef struct ag_traj_turn {
  const ag_traj_step *steps;
  size_t n_steps;
  int64_t t_start_ms; /* the user message arrived, or -1 */
} ag_traj_turn;

/*
 * A recorded run. Filled by ag_trajectory_parse (free with
 * ag_trajectory_free), or by hand: a caller may build one from its own
 * arrays and pass it to ag_auditor_run (set `priv` to NULL; never pass such
 * a struct to ag_trajectory_free). Every pointer stays valid while the
 * trajectory lives. n_steps and n_calls are the totals over all turns.
 */
typedef struct ag_trajectory {
  ag_traj_format format;
  ag_run_outcome outcome;
  const char *source; /* the recording's "source" or "id", or NULL */
  const ag_traj_turn *turns;
  size_t n_turns;
  size_t n_steps;
  size_t n_calls;
  /* every step has t_request_ms >= 0: the turn timeout can be judged */
  bool timed;
  void *priv; /* the parser's memory; NULL for a hand-built trajectory */
  /* JSON Lines only: the 1-based number of the last line when it was cut
   * off and left out, else 0. Such a line does not end with a newline and
   * is the beginning of a JSON value, not a whole one: its writer stopped
   * mid-line (a run killed while writing an event). Only the last line is
   * ever left out, and only after at least one whole value; a bad line
   * anywhere else fails the parse. Say so to the user when non-zero: the
   * run read is the recording without that line. ag_auditor_run does not
   * read it; a hand-built trajectory may leave it 0. */
  long cut_line;
} ag_trajectory;

/* Limits of the parser. Every one is a cap: going over is an error. */
typedef struct ag_traj_opts {
  /* AG_TRAJ_AUTO (default): detect; else the only format accepted (an
   * input of another shape is AG_EINVAL) */
  ag_traj_format format;
  size_t max_bytes; /* input size (default 64 MiB) */
  size_t max_steps; /* steps in one run (default 1,000,000) */
  size_t max_calls; /* calls in one step (default 4096) */
} ag_traj_opts;

/* Fills `opts` with the defaults. */
AG_EXTERN void ag_traj_opts_init(ag_traj_opts *opts);

/*
 * Parses one recorded run from `buf` (`len` bytes, need not be
 * NUL-terminated; a UTF-8 byte-order mark is skipped). `opts` may be NULL for
 * the defaults. The format is detected from the shape (docs/audit.md):
 *   an object with "steps"               neutral trajectory
 *   an array of objects with "role"      chat transcript
 *   an object with "messages"            chat transcript
 *   JSON Lines of objects with "role"    chat transcript
 *   JSON Lines of objects with "event"   agentguard event log
 * In JSON Lines, a last line cut off mid-line (no newline at its end, the
 * beginning of a value) is left out and named in (*out)->cut_line; when
 * the rest then fails, err->msg ends by saying that the line was left out.
 * Returns AG_OK and sets *out (caller-owns, free with ag_trajectory_free),
 * or, with *out NULL:
 *   AG_EJSON     not JSON (truncated, bad syntax); err has line, column, pos
 *                (for JSON Lines: the line of the bad value)
 *   AG_EINVAL    valid JSON of an unknown shape, or a run that does not hold
 *                together (a tool reply without its call, calls without
 *                replies, results that do not match the calls, a field of
 *                the wrong type, no steps at all); err->msg says where, e.g.
 *                "message 7: tool reply for call 'call_2' without its call"
 *   AG_ETOOBIG   past a cap of opts
 *   AG_ENOMEM
 * `buf` is only read during the call (the trajectory copies what it keeps).
 */
AG_EXTERN ag_err_t ag_trajectory_parse(ag_trajectory **out, const char *buf,
                                       size_t len, const ag_traj_opts *opts,
                                       ag_error_t *err);

/* Frees a parsed trajectory. NULL does nothing. */
AG_EXTERN void ag_trajectory_free(ag_trajectory *t);

/* ------------------------------------------------------------------------ */
/* The audit                                                                */
/* ------------------------------------------------------------------------ */

/*
 * Where a guard stops a run: a plain value. When `stopped` is false the run
 * went through and every other field is zero / empty.
 */
typedef struct ag_audit_stop {
  bool stopped;
  ag_action action; /* AG_STOP, or AG_ESCALATE (errors.on_trip escalate) */
  ag_reason reason;
  /* When: before the model request of `step` (max_iterations, turn_timeout),
   * before its calls ran (max_calls_per_turn, identical_calls,
   * cyclic_calls: the calls of that step would not have run), or after its
   * results (every other reason). */
  int step;         /* 1-based over the whole run */
  int turn;         /* 1-based */
  int step_in_turn; /* 1-based within the turn */
  int call_index;   /* the tripping call within the step (0-based), or -1 */
  int steps_after;  /* recorded steps after `step` (the run's whole rest) */
  char tool[AG_TOOL_NAME_MAX];
  char message[AG_VERDICT_MSG_MAX];
} ag_audit_stop;

/* What ag_auditor_run found for one run: a plain value. */
typedef struct ag_audit_finding {
  int turns, steps, calls; /* the run's size */
  /* Calls that ran in the recording but that the guard would have held back
   * with a nudge (loop.nudge_before_stop) before the stop (or the end). */
  int held_back;
  ag_audit_stop stop; /* the first stop under the whole config */
  /* With ag_audit_opts.all_stops: mechanism_on[r] says whether mechanism r
   * is enabled in the config, and by_mechanism[r] is its first stop when it
   * is the only mechanism on (indexed by ag_reason; [AG_REASON_NONE] unused).
   * Otherwise all false / zero. */
  bool all_stops;
  bool mechanism_on[AG_REASON__COUNT];
  ag_audit_stop by_mechanism[AG_REASON__COUNT];
} ag_audit_finding;

typedef struct ag_audit_opts {
  /* Also find every enabled mechanism's first stop: one more replay per
   * mechanism, with the others set to 0 (docs/audit.md). */
  bool all_stops;
  /* Capacity of the guards (NULL-equivalent: ag_guard_opts_init). */
  ag_guard_opts guard;
} ag_audit_opts;

/* Fills `opts`: all_stops false, the guard's default capacity. */
AG_EXTERN void ag_audit_opts_init(ag_audit_opts *opts);

typedef struct ag_auditor ag_auditor;

/*
 * Creates an auditor for `cfg` (copied). `opts` may be NULL for the
 * defaults. Returns AG_OK and sets *out (free with ag_auditor_free), or
 * AG_ECONFIG (err names the key), AG_EINVAL, AG_ENOMEM, AG_ECRYPTO; *out is
 * NULL on failure.
 */
AG_EXTERN ag_err_t ag_auditor_new(ag_auditor **out, const ag_config *cfg,
                                  const ag_audit_opts *opts, ag_error_t *err);

/* Frees an auditor. NULL does nothing. */
AG_EXTERN void ag_auditor_free(ag_auditor *a);

/* The auditor's config; borrowed until ag_auditor_free. */
AG_EXTERN const ag_config *ag_auditor_config(const ag_auditor *a);

/*
 * Replays `t` (borrowed for the call) through the auditor's guard and fills
 * *out. The replay, per turn: ag_guard_begin_turn; per step:
 * ag_guard_begin_iteration, then
 *   - a normal step: ag_guard_run_batch with the step's calls, whose run
 *     callback hands the guard the recorded results of the calls it allowed
 *     (a call held back by a nudge keeps the guard's skipped result: live it
 *     would not have run; a call with invalid arguments keeps the guard's
 *     validation error);
 *   - a rejected step: ag_guard_record_results with one error result, tool
 *     name "" and the harness's observation as text (like a reply without a
 *     tool call);
 *   - a step without calls: nothing more, or, with loop.require_tool_call,
 *     one error result with tool name "" (the live loop's rule);
 *   - a no_reply step: nothing more (only the iteration counts).
 * The replay ends at the first AG_STOP or AG_ESCALATE verdict. Time: the
 * recording's timestamps when t->timed, else time stands still within each
 * turn, so loop.max_turn_duration never trips on an untimed recording.
 * Returns AG_OK, AG_EINVAL (NULL arguments, or a step with more results than
 * its calls), AG_ENOMEM (scratch for a step with more calls than ever seen).
 */
AG_EXTERN ag_err_t ag_auditor_run(ag_auditor *a, const ag_trajectory *t,
                                  ag_audit_finding *out, ag_error_t *err);

/* ------------------------------------------------------------------------ */
/* Summary over many runs                                                   */
/* ------------------------------------------------------------------------ */

/* Totals over audited runs: a plain value; indexes are ag_run_outcome and
 * ag_reason. */
typedef struct ag_audit_summary {
  int runs;    /* audited */
  int skipped; /* inputs that could not be audited */
  int runs_by_outcome[AG_RUN_OUTCOME_COUNT];
  int stopped_by_outcome[AG_RUN_OUTCOME_COUNT];
  long steps_by_outcome[AG_RUN_OUTCOME_COUNT];
  long saved_by_outcome[AG_RUN_OUTCOME_COUNT]; /* sum of steps_after */
  int stops_by_reason[AG_REASON__COUNT];       /* first stops */
  int escalations;                             /* first stops that escalate */
  int held_back;
  /* with all_stops: the mechanisms enabled, and the runs each one alone
   * would stop */
  bool all_stops;
  bool mechanism_on[AG_REASON__COUNT];
  int mechanism_stops[AG_REASON__COUNT];
} ag_audit_summary;

/* Zeroes `s`. */
AG_EXTERN void ag_audit_summary_init(ag_audit_summary *s);

/* Adds one audited run (its outcome from `t`, borrowed for the call). */
AG_EXTERN void ag_audit_summary_add(ag_audit_summary *s, const ag_trajectory *t,
                                    const ag_audit_finding *f);

/* Counts one input that could not be audited. */
AG_EXTERN void ag_audit_summary_add_skipped(ag_audit_summary *s);

/* The share of recorded steps that stopping would have saved in runs of
 * outcome `o`: saved_by_outcome / steps_by_outcome, 0 when there are none. */
AG_EXTERN double ag_audit_summary_saved_share(const ag_audit_summary *s,
                                              ag_run_outcome o);

/* ------------------------------------------------------------------------ */
/* JSON output (docs/audit.md)                                              */
/* ------------------------------------------------------------------------ */

/*
 * One run as a one-line JSON object {"type":"run","file":…,"preset":…,…}.
 * `file` and `preset` may be NULL (then omitted). *out is caller-owns (free
 * with ag_free), NUL-terminated, without a newline. Returns AG_OK,
 * AG_EINVAL or AG_ENOMEM.
 */
AG_EXTERN ag_err_t ag_audit_finding_json(const char *file, const char *preset,
                                         const ag_trajectory *t,
                                         const ag_audit_finding *f, char **out,
                                         ag_error_t *err);

/* The summary as a one-line JSON object {"type":"summary",…}; as above. */
AG_EXTERN ag_err_t ag_audit_summary_json(const char *preset,
                                         const ag_audit_summary *s, char **out,
                                         ag_error_t *err);

#ifdef __cplusplus
}
#endif
#endif /* AGENTGUARD_AUDIT_H */
