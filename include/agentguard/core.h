/*
 * agentguard/core.h - the guard: configuration and presets, call signatures,
 * error classification, compact errors, and the loop/error detectors.
 *
 * The core is pure: it does no I/O. ag_config_load_file, declared here
 * beside ag_config_parse, is built in the exec layer (src/exec/configfile.c),
 * which reads the file and hands its bytes to the core. The core never reads
 * the clock (time is an argument, in milliseconds on any monotonic scale the
 * caller picks), starts no threads and keeps no mutable globals (the
 * classifier's pattern index is a constant built at compile time). After
 * ag_guard_new() the check path (ag_guard_begin_iteration,
 * ag_guard_check_calls, ag_guard_record_results) never allocates.
 *
 * Thread-safety: an ag_guard is not thread-safe; use one guard per session
 * and call it from one thread at a time. Distinct guards are independent.
 * Config functions and the classifier are safe from any thread on distinct
 * objects. See docs/c-api.md for a walk-through.
 */
#ifndef AGENTGUARD_CORE_H
#define AGENTGUARD_CORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Configuration                                                            */
/* ------------------------------------------------------------------------ */

#define AG_LIST_MAX 16      /* entries in a string-list config key */
#define AG_LIST_ITEM_MAX 64 /* bytes per entry, NUL included */

typedef struct ag_str_list {
  int count;
  char items[AG_LIST_MAX][AG_LIST_ITEM_MAX];
} ag_str_list;

typedef enum { AG_SCOPE_CALL = 0, AG_SCOPE_CALL_AND_RESULT } ag_call_scope;
typedef enum {
  AG_FAIL_ALL_FAILED = 0,
  AG_FAIL_ANY_FAILED
} ag_failing_iteration;
/* Which failures the error counters (5 identical errors, 6 a tool's
 * failures, 7 failing iterations, 8 the total) count: every failure, or
 * only malfunctions of the tool loop - not information such as a failing
 * test or a program's traceback (docs/errors.md). */
typedef enum { AG_COUNT_ALL = 0, AG_COUNT_MALFUNCTIONS } ag_counted_failures;
typedef enum { AG_TRIP_STOP = 0, AG_TRIP_ESCALATE } ag_on_trip;
/* What the model is told of a failed call: the compact record, the full
 * text, or only "Error: Function failed." (M.E.AI without detailed errors). */
typedef enum {
  AG_FEEDBACK_COMPACT = 0,
  AG_FEEDBACK_FULL,
  AG_FEEDBACK_GENERIC
} ag_feedback;
typedef enum {
  AG_BACKOFF_LINEAR = 0,
  AG_BACKOFF_EXPONENTIAL,
  AG_BACKOFF_CONSTANT
} ag_backoff;
typedef enum {
  AG_RETRY_ON_TRANSIENT = 0,
  AG_RETRY_ON_ALL,
  AG_RETRY_ON_NONE
} ag_retry_on;

/*
 * A complete configuration: a plain value (copy it freely, nothing to free).
 * Every key of docs/configuration.md. Limits are counts; 0 turns the
 * mechanism off. Durations are milliseconds; 0 means "no limit".
 * docs/configuration.md lists every key with its default and preset values.
 */
typedef struct ag_config {
  char preset[AG_LIST_ITEM_MAX]; /* the preset it was built from */
  struct {
    int max_iterations;       /* 1: iteration cap */
    int max_calls_per_turn;   /* 2: per-turn call cap */
    int identical_call_limit; /* 3: identical-call breaker */
    ag_call_scope identical_call_scope;
    int cycle_limit;              /* 4: repetitions of a block */
    int cycle_max_length;         /* 4: longest block (2..16) */
    int64_t max_turn_duration_ms; /* 10: turn timeout */
    int max_refused_replies;      /* 12: replies in a row that ran nothing */
    int max_denied_calls;         /* 13: calls in a row denied at approval */
    int content_loop_repeats;     /* 14: repetitions of a text chunk */
    int max_empty_replies;        /* 15: empty replies in a row */
    int repeated_result_limit;    /* 16: same call, same result, in a turn */
    int repeated_failure_limit;   /* 16: same call, same error, in a turn */
    int max_tokens_per_turn;      /* 11: token budget of a turn */
    bool nudge_before_stop;
    bool final_request_without_tools;
    bool require_tool_call;
    ag_str_list loop_breaking_tools;
    bool parallel;
    int max_parallel;
  } loop;
  struct {
    int max_identical_errors;   /* 5 */
    int max_tool_errors;        /* 6 */
    int max_consecutive_errors; /* 7 */
    ag_failing_iteration failing_iteration;
    ag_counted_failures counted_failures; /* 5-8 */
    int max_total_errors;                 /* 8 */
    int similar_error_limit;              /* 9 */
    int error_history;                    /* 9: errors remembered (1..256) */
    ag_str_list error_prefixes;
    ag_on_trip on_trip;
    ag_feedback feedback;
    int max_error_chars; /* 1..65536 */
    bool error_context;
    int max_errors_in_context; /* 1..64 */
    bool normalize_errors;     /* 5, 16: numbers, addresses, temp paths */
    bool normalize_provider_errors;
    bool include_provider_details;
  } errors;
  struct {
    int max_retries;
    int64_t delay_ms;
    ag_backoff backoff;
    int64_t max_delay_ms;
    bool jitter;
    int64_t function_timeout_ms;
    ag_retry_on retry_on;
  } retry;
  struct {
    int max_retries;
    int64_t delay_ms;
    int64_t max_delay_ms;
    int64_t timeout_ms;
  } network;
} ag_config;

/* Fills `cfg` with the `default` preset. Never fails. */
AG_EXTERN void ag_config_init(ag_config *cfg);

/*
 * Fills `cfg` with the preset `name` (see ag_preset_names). Returns AG_OK,
 * AG_ENOTFOUND (cfg untouched, err names the preset and suggests a near one
 * or lists the known ones), or AG_EINVAL for NULL arguments.
 */
AG_EXTERN ag_err_t ag_config_preset(ag_config *cfg, const char *name,
                                    ag_error_t *err);

/* The preset names, NULL-terminated; static storage. */
AG_EXTERN const char *const *ag_preset_names(void);

/*
 * Parses a JSON config document (`json`, `len` bytes, not necessarily
 * NUL-terminated) into `cfg`: its "preset" (default "default") first, then
 * every other key on top. On error returns AG_EJSON (err has line, column
 * and pos; a repeated key is a JSON error too) or AG_ECONFIG (err->msg names
 * the key path, e.g. "errors.max_tol_errors: unknown key; did you mean
 * max_tool_errors?"), AG_EINVAL for NULL arguments; on any error `cfg` is
 * left untouched. `cfg` is borrowed for the call. docs/configuration.md has
 * every key and the duration syntax.
 */
AG_EXTERN ag_err_t ag_config_parse(ag_config *cfg, const char *json, size_t len,
                                   ag_error_t *err);

/*
 * As ag_config_parse, reading the file at `path`; messages start with the
 * path. Also AG_EIO (err->sys_errno set) when it cannot be read, and
 * AG_ETOOBIG past 1 MiB.
 */
AG_EXTERN ag_err_t ag_config_load_file(ag_config *cfg, const char *path,
                                       ag_error_t *err);

/*
 * Checks ranges and cross-key rules of a config filled by hand (enums and
 * bools in range, list items terminated and valid UTF-8, error_history >=
 * similar_error_limit, preset empty or known). Returns AG_OK, AG_ECONFIG with
 * the key path in err->msg, or AG_EINVAL for NULL.
 */
AG_EXTERN ag_err_t ag_config_validate(const ag_config *cfg, ag_error_t *err);

/*
 * Writes `cfg` as a complete JSON config (every key, durations as strings,
 * sorted keys, indented; "preset" omitted when cfg->preset is empty) to
 * *out, which parses back to an identical struct. *out is caller-owns (free
 * with ag_free). Returns AG_OK, AG_ENOMEM, AG_ECONFIG (cfg is invalid, as
 * ag_config_validate) or AG_EINVAL for NULL arguments.
 */
AG_EXTERN ag_err_t ag_config_to_json(const ag_config *cfg, char **out,
                                     ag_error_t *err);

/*
 * Parses a duration: a number and one unit ("250ms", "30s", "1.5s", "5m",
 * "1h") or "0"; at most 168h, a whole number of milliseconds. Returns AG_OK
 * and sets *ms, or AG_EINVAL. Used for config keys; exposed for the CLI.
 */
AG_EXTERN ag_err_t ag_parse_duration(const char *text, int64_t *ms);

/* Formats a duration in the largest exact unit ("5m", "250ms", "0"). */
AG_EXTERN void ag_format_duration(int64_t ms, char *buf, size_t cap);

/* ------------------------------------------------------------------------ */
/* Error classification and compact errors                                  */
/* ------------------------------------------------------------------------ */

#define AG_CATEGORY_MAP(X)                                                     \
  X(UNKNOWN, "unknown", 0)                                                     \
  X(TIMEOUT, "timeout", 1)                                                     \
  X(RATE_LIMIT, "rate_limit", 1)                                               \
  X(NETWORK, "network", 1)                                                     \
  X(BUSY, "busy", 1)                                                           \
  X(AUTH, "auth", 0)                                                           \
  X(PERMISSION, "permission", 0)                                               \
  X(VALIDATION, "validation", 0)                                               \
  X(NOT_FOUND, "not_found", 0)                                                 \
  X(MISSING_MODULE, "missing_module", 0)                                       \
  X(RESOURCE, "resource", 0)                                                   \
  X(FILE_IO, "file_io", 0)                                                     \
  X(FONT, "font", 0)                                                           \
  X(PLOTTING, "plotting", 0)                                                   \
  X(CRASH, "crash", 0)

/*
 * Categories keep their numbers: new ones are only ever appended to the
 * list, so AG_CAT__COUNT grows between versions and is not a stable value.
 * AG_CAT_AUTO is: a fixed number (256) that is never a category and means
 * "classify the text for me" where a category is an input (ag_result,
 * ag_traj_result). Any other value that is not a category (AG_CAT__COUNT
 * included, as older code passed) is read the same way.
 */
typedef enum {
#define AG__CAT_ENUM(id, name, transient) AG_CAT_##id,
  AG_CATEGORY_MAP(AG__CAT_ENUM)
#undef AG__CAT_ENUM
      AG_CAT__COUNT,
  AG_CAT_AUTO = 256
} ag_category;

/* "timeout", "not_found", ...; a static string, never NULL: "unknown" for
 * AG_CAT_AUTO and any other value that is not a category. */
AG_EXTERN const char *ag_category_name(ag_category cat);
/* Parses a name back ("timeout"; exact, case-sensitive). Returns
 * AG_CAT__COUNT when `name` is unknown or NULL. */
AG_EXTERN ag_category ag_category_from_name(const char *name);
/* Values are only ever appended (before AG_CAT__COUNT), so the numbers of
 * existing categories never change. */
/* True for timeout, rate_limit, network and busy; false for every other
 * value, AG_CAT_AUTO included. */
AG_EXTERN bool ag_category_transient(ag_category cat);
/* A one-sentence suggestion for the model; a static string, never NULL
 * (unknown's for a value that is not a category). */
AG_EXTERN const char *ag_category_suggestion(ag_category cat);

/*
 * Classifies an error text (`len` bytes, any content) into a category.
 * Case-insensitive pattern table, first match wins (docs/errors.md).
 * `text` may be NULL only when len is 0 (then AG_CAT_UNKNOWN). Never returns
 * AG_CAT_AUTO. Pure and allocation-free; safe from any thread.
 */
AG_EXTERN ag_category ag_classify(const char *text, size_t len);

/*
 * Returns the largest n <= max_bytes such that text[0..n) does not end in the
 * middle of a UTF-8 sequence. Invalid bytes count as one character each.
 */
AG_EXTERN size_t ag_utf8_truncate(const char *text, size_t len,
                                  size_t max_bytes);

/*
 * The candidate nearest to `word`, for a "did you mean", or NULL: the rule
 * of every suggestion the library makes (config keys, presets, schema
 * properties, tool names): an edit distance (ASCII case-insensitive, an
 * adjacent transposition counts one) of at most 1 for a word under 6
 * bytes, else 2; the first of the nearest wins; names over 64 bytes are
 * never near. `candidates` is NULL-terminated. Pure; safe from any thread.
 */
AG_EXTERN const char *ag_suggest(const char *word,
                                 const char *const *candidates);

/*
 * Writes the compact error record
 *   <error>\ntool: T\ntype: C\nmessage: M\nsuggestion: S\n</error>
 * into buf (cap bytes, always NUL-terminated when cap > 0). The message has
 * whitespace runs collapsed to one space and is cut to max_chars bytes on a
 * UTF-8 boundary, with "..." appended when cut (max_chars 0: no cut).
 * Returns the length the full record needs (like snprintf): a value >= cap
 * means the record itself was cut. Never allocates; safe from any thread.
 */
AG_EXTERN size_t ag_format_compact_error(char *buf, size_t cap,
                                         const char *tool, ag_category cat,
                                         const char *msg, size_t msg_len,
                                         size_t max_chars);

/* ------------------------------------------------------------------------ */
/* Signatures                                                               */
/* ------------------------------------------------------------------------ */

#define AG_SIG_LEN 32

/*
 * A call signature: SHA-256 over  name ":" JCS(arguments)  (RFC 8785).
 * The guard computes these itself; ag_signature() is the same code, for
 * callers that want a signature without a guard.
 * Empty argument text (args_len 0; args may then be NULL) counts as {}; text
 * of only whitespace is AG_EJSON. Returns AG_OK, AG_EINVAL (NULL name or
 * sig), or for arguments that are not canonicalizable JSON: AG_EJSON,
 * AG_EDUPKEY, AG_EUTF8, AG_ENUMBER or AG_EDEPTH (nesting over 256), with
 * err->pos the byte offset of the first problem in `args`. Allocates scratch
 * proportional to the input (no token cap); a guard is the allocation-free
 * path, with its own caps (ag_guard_opts: depth 64, 65,536 tokens, 1 MiB by
 * default), so very deep or large arguments can be valid here and invalid
 * for a guard.
 */
AG_EXTERN ag_err_t ag_signature(const char *name, const char *args,
                                size_t args_len, uint8_t sig[AG_SIG_LEN],
                                ag_error_t *err);

/*
 * Writes the RFC 8785 canonical form of `json` to *out (caller-owns, free
 * with ag_free; NUL-terminated, length in *out_len). Errors as ag_signature,
 * plus AG_ENOMEM.
 */
AG_EXTERN ag_err_t ag_canonicalize(const char *json, size_t len, char **out,
                                   size_t *out_len, ag_error_t *err);

/* Lower-case hex of a signature into hex[65]. */
AG_EXTERN void ag_sig_hex(const uint8_t sig[AG_SIG_LEN], char hex[65]);

/* ------------------------------------------------------------------------ */
/* The guard                                                                */
/* ------------------------------------------------------------------------ */

/*
 * NULL rules for the guard's functions: `g` and every output pointer (v,
 * checks, results, out) must not be NULL unless the function says otherwise;
 * only ag_guard_free accepts a NULL guard. Inside ag_call and ag_result a
 * NULL name or text counts as empty ("", length 0); a NULL ag_call.args
 * counts as empty arguments ({}).
 */
typedef struct ag_guard ag_guard;

/* Capacity options of a guard: fixed at construction, never grown. */
typedef struct ag_guard_opts {
  size_t max_args_bytes;  /* largest argument text (default 1 MiB) */
  size_t max_args_tokens; /* JSON values+keys in one argument (default 65536) */
  int max_depth;          /* JSON nesting (default 64) */
  int max_tools;          /* distinct tool names tracked per turn (64) */
  int max_batch;          /* calls in one batch (default 256) */
} ag_guard_opts;

/* Fills `opts` (not NULL) with the defaults. */
AG_EXTERN void ag_guard_opts_init(ag_guard_opts *opts);

/* What the guard says about a turn, a batch or a call. */
typedef enum {
  AG_ALLOW = 0, /* go on */
  AG_NUDGE,     /* hold this call back with a nudge; the rest goes on */
  AG_STOP,      /* end the turn (status stopped / timed_out) */
  AG_ESCALATE   /* ask the human (errors.on_trip = escalate) */
} ag_action;

#define AG_REASON_MAP(X)                                                       \
  X(NONE, "none")                                                              \
  X(MAX_ITERATIONS, "max_iterations")                                          \
  X(MAX_CALLS_PER_TURN, "max_calls_per_turn")                                  \
  X(IDENTICAL_CALLS, "identical_calls")                                        \
  X(CYCLIC_CALLS, "cyclic_calls")                                              \
  X(IDENTICAL_ERRORS, "identical_errors")                                      \
  X(TOOL_ERROR_BUDGET, "tool_error_budget")                                    \
  X(CONSECUTIVE_ERRORS, "consecutive_errors")                                  \
  X(TOTAL_ERROR_BUDGET, "total_error_budget")                                  \
  X(ERROR_PATTERN, "error_pattern")                                            \
  X(TURN_TIMEOUT, "turn_timeout")                                              \
  X(REFUSED_REPLIES, "refused_replies")                                        \
  X(DENIED_CALLS, "denied_calls")                                              \
  X(CONTENT_LOOP, "content_loop")                                              \
  X(EMPTY_REPLY, "empty_reply")                                                \
  X(REPEATED_RESULTS, "repeated_results")                                      \
  X(TOKEN_BUDGET, "token_budget")

typedef enum {
#define AG__REASON_ENUM(id, name) AG_REASON_##id,
  AG_REASON_MAP(AG__REASON_ENUM)
#undef AG__REASON_ENUM
      AG_REASON__COUNT
} ag_reason;

/* "identical_calls", ...; a static string. */
AG_EXTERN const char *ag_reason_name(ag_reason reason);

#define AG_VERDICT_MSG_MAX 512
#define AG_TOOL_NAME_MAX 128

/* A verdict: a plain value the guard fills. */
typedef struct ag_verdict {
  ag_action action;
  ag_reason reason;
  int call_index;                   /* the call that tripped, or -1 */
  char tool[AG_TOOL_NAME_MAX];      /* the tool involved, or "" */
  char message[AG_VERDICT_MSG_MAX]; /* what happened, for people and logs */
  char warning[AG_VERDICT_MSG_MAX]; /* warning to emit before stopping, or "" */
  const char *suggestion; /* static text for the model/user, or NULL */
} ag_verdict;

/* One tool call the model asked for. All pointers borrowed for the call. */
typedef struct ag_call {
  const char *name;
  const char *args; /* the arguments' JSON text as the model sent it */
  size_t args_len;
} ag_call;

/* What the guard says about one call of a batch. */
typedef struct ag_call_check {
  ag_action action; /* AG_ALLOW, AG_NUDGE (hold back), AG_STOP/ESCALATE */
  ag_reason reason;
  bool valid;                       /* arguments canonicalized; sig is set */
  uint8_t sig[AG_SIG_LEN];          /* when valid */
  ag_err_t invalid_code;            /* when !valid: why */
  long invalid_pos;                 /* when !valid: byte offset in args */
  char message[AG_VERDICT_MSG_MAX]; /* nudge text, or why invalid */
} ag_call_check;

typedef enum {
  AG_OUTCOME_OK = 0,  /* the tool answered (may still be an error by prefix) */
  AG_OUTCOME_ERROR,   /* the tool failed: error, timeout, crash, not found,
                         invalid arguments, no tool call (Forge) */
  AG_OUTCOME_SKIPPED, /* not run and not an error: held back, or denied
                         when the caller does not say which */
  AG_OUTCOME_DENIED   /* not run: denied at approval (mechanism 13 counts) */
} ag_outcome;

/* One executed call's result. All pointers borrowed for the call. */
typedef struct ag_result {
  const char *name;
  const uint8_t *sig; /* the call's signature, or NULL when it had none */
  ag_outcome outcome;
  const char *text; /* result or error text */
  size_t text_len;
  ag_category category; /* AG_CAT_AUTO: the guard classifies `text` */
} ag_result;

/*
 * Creates a guard for `cfg` (copied; required). `opts` may be NULL for the
 * defaults. Returns AG_OK and sets *out, or AG_ECONFIG (invalid config, err
 * names the key), AG_EINVAL (out or cfg NULL, or bad opts), AG_ENOMEM,
 * AG_ECRYPTO; *out is NULL on failure (when out is not NULL). The new guard
 * is at the start of a turn at time 0. `err` may be NULL.
 */
AG_EXTERN ag_err_t ag_guard_new(ag_guard **out, const ag_config *cfg,
                                const ag_guard_opts *opts, ag_error_t *err);

/* Frees a guard. NULL does nothing. */
AG_EXTERN void ag_guard_free(ag_guard *g);

/* The guard's config; borrowed until ag_guard_free. */
AG_EXTERN const ag_config *ag_guard_config(const ag_guard *g);

/*
 * Starts a new turn (a new user message) at time `now_ms`: every counter,
 * ring and history is reset. Nothing trips across turns.
 */
AG_EXTERN void ag_guard_begin_turn(ag_guard *g, int64_t now_ms);

/*
 * The turn deadline on the caller's clock, or INT64_MAX when
 * loop.max_turn_duration is 0.
 */
AG_EXTERN int64_t ag_guard_deadline(const ag_guard *g);

/*
 * Call before each model request. Counts the iteration unless a mechanism
 * trips: max_iterations (the request would be number N+1), token_budget (the
 * turn's tokens exceed loop.max_tokens_per_turn) or turn_timeout.
 * Fills `v`; returns v->action. A verdict of AG_STOP with max_iterations
 * does not count the iteration; with loop.final_request_without_tools the
 * caller may then make one last request without tools.
 */
AG_EXTERN ag_action ag_guard_begin_iteration(ag_guard *g, int64_t now_ms,
                                             ag_verdict *v);

/*
 * Checks a batch of `n` calls before any runs, in batch order, mechanisms
 * 2 (call cap), 3 (identical calls) and 4 (cycles), plus the turn timeout.
 * Fills checks[0..n) and `v`. When v->action is AG_STOP or AG_ESCALATE no
 * call of the batch may run; v->call_index names the tripping call. With
 * loop.nudge_before_stop, a first trip of 3 or 4 sets that call's action to
 * AG_NUDGE (do not run it; answer it with checks[i].message) and the batch
 * verdict stays AG_ALLOW. Calls whose arguments are invalid get valid=false;
 * they must not run and should be reported back as AG_OUTCOME_ERROR with
 * category validation. Calls past opts.max_batch are not checked: they get
 * valid=false with invalid_code AG_ETOOBIG. `checks` must have n entries.
 * Returns v->action.
 */
AG_EXTERN ag_action ag_guard_check_calls(ag_guard *g, const ag_call *calls,
                                         size_t n, int64_t now_ms,
                                         ag_call_check *checks, ag_verdict *v);

/*
 * Records the results of one iteration (`n` results, the model's call
 * order), then checks mechanisms 3 (call_and_result scope), 5, 6, 7, 8 and 9
 * and the turn timeout. Fills `v`; returns v->action. An iteration whose
 * results are all AG_OUTCOME_SKIPPED (or n = 0) does not change the
 * failing-iteration count.
 */
AG_EXTERN ag_action ag_guard_record_results(ag_guard *g,
                                            const ag_result *results, size_t n,
                                            int64_t now_ms, ag_verdict *v);

/*
 * Executes the calls that the guard allowed: fill results[i] for every i with
 * checks[i].action == AG_ALLOW && checks[i].valid (name, sig, text, len and
 * category are preset; set outcome, text, text_len, category). Results of
 * other calls are already filled (held back: AG_OUTCOME_SKIPPED with the
 * nudge text; invalid arguments: AG_OUTCOME_ERROR, category validation, the
 * message). The callback may set outcome AG_OUTCOME_SKIPPED for a call it
 * did not run (denied at approval). Text pointers must stay valid until
 * ag_guard_run_batch returns. Returns the time after execution (now_ms).
 */
typedef int64_t (*ag_run_fn)(void *user, const ag_call *calls,
                             const ag_call_check *checks, size_t n,
                             ag_result *results);

/*
 * One batch through the guard, the way the agent loop and `agentguard audit`
 * both drive it after ag_guard_begin_iteration (and, live, the model
 * request): ag_guard_check_calls, then `run` for the calls that may run
 * (not called when the batch is stopped or escalated), then
 * ag_guard_record_results. Sharing this path is what makes a recorded run
 * stop at the same step as a live one. checks and results must have n
 * entries. `run` may be NULL: the allowed calls are then recorded as they
 * were preset (AG_OUTCOME_OK, empty text). Returns the deciding verdict's
 * action; v->reason says why and, for a stop before execution,
 * v->call_index which call. *ran (may be NULL) is set when `run` was called.
 */
AG_EXTERN ag_action ag_guard_run_batch(ag_guard *g, const ag_call *calls,
                                       size_t n, int64_t now_ms, ag_run_fn run,
                                       void *user, ag_call_check *checks,
                                       ag_result *results, ag_verdict *v,
                                       bool *ran);

/*
 * Adds `tokens` (a reply's prompt + completion tokens, as the provider
 * reports them; negative counts as 0) to the turn's total. Mechanism 11:
 * the next ag_guard_begin_iteration stops the turn (token_budget) once the
 * total exceeds loop.max_tokens_per_turn. Never trips by itself.
 */
AG_EXTERN void ag_guard_record_tokens(ag_guard *g, int64_t tokens);

/* The tokens recorded in the current turn. */
AG_EXTERN int64_t ag_guard_tokens(const ag_guard *g);

/*
 * Records a model reply that ran nothing and is not a final answer: the
 * harness refused it (no usable call, several calls where one is allowed),
 * or it had no tool call under loop.require_tool_call. `text` (len bytes,
 * may be NULL) is what the model is told; it joins the error context as an
 * error of no tool. Counts mechanism 12 (refused_replies, N in a row; any
 * reply where a call ran resets it) and nothing else: a refused reply is no
 * tool's error and no failing iteration. Fills `v`; returns v->action
 * (AG_ALLOW, or AG_STOP / AG_ESCALATE with refused_replies, or the turn
 * timeout). A batch whose every call has arguments that are not JSON counts
 * the same way inside ag_guard_record_results.
 */
AG_EXTERN ag_action ag_guard_record_refused(ag_guard *g, const char *text,
                                            size_t len, int64_t now_ms,
                                            ag_verdict *v);

/*
 * Mechanism 14, the content loop (Gemini CLI's detector, agentguard/
 * content.h): checks the model's text for a chunk repeated
 * loop.content_loop_repeats times close together. `piece` true: text[0..len)
 * is one streamed delta of the current reply (feed every delta in order);
 * false: it is a whole reply's text, checked line by line. The detector
 * starts afresh at each ag_guard_begin_iteration (a new reply). Returns
 * AG_STOP with reason content_loop once a loop is found (v->message quotes
 * the repeated text), else AG_ALLOW; with the mechanism off, AG_ALLOW. The
 * detector (about 87 KB) is allocated at the first call; if that fails the
 * text goes unchecked (AG_ALLOW) until an allocation succeeds.
 */
AG_EXTERN ag_action ag_guard_check_text(ag_guard *g, const char *text,
                                        size_t len, bool piece, ag_verdict *v);

/* The note the model gets after a first empty reply (mechanism 15). */
#define AG_EMPTY_REPLY_NOTE                                                    \
  "Your last reply was empty: no text and no tool call. Continue the task: "   \
  "call a tool, or give your final answer."

/*
 * Records a model reply with no text and no tool call (mechanism 15). With
 * loop.max_empty_replies N > 0: returns AG_NUDGE (v->message is
 * AG_EMPTY_REPLY_NOTE: add it to the conversation and ask again) until the
 * Nth empty reply in a row, which returns AG_STOP with reason empty_reply.
 * Any other reply (calls checked, a refused reply) resets the run. With N = 0
 * returns AG_ALLOW: the empty reply is the final answer.
 */
AG_EXTERN ag_action ag_guard_record_empty(ag_guard *g, int64_t now_ms,
                                          ag_verdict *v);

/*
 * After an escalation the human chose "continue": resets only the counters of
 * the mechanism `reason`, so the turn goes on.
 */
AG_EXTERN void ag_guard_resume(ag_guard *g, ag_reason reason);

/* Whether a result text counts as an error by errors.error_prefixes. */
AG_EXTERN bool ag_guard_is_error_text(const ag_guard *g, const char *text,
                                      size_t len);

/*
 * Kinds of recoverable error, for the instruction line of the error context
 * (Forge's four texts).
 */
typedef enum {
  AG_RECOVER_EXECUTION = 0, /* a tool failed */
  AG_RECOVER_NO_TOOL_CALL,
  AG_RECOVER_INVALID_JSON,
  AG_RECOVER_UNKNOWN_TOOL
} ag_recover_kind;

/*
 * Writes the ephemeral error-context message for the next model request
 * (docs/errors.md) into buf: Forge's
 * template around the last errors.max_errors_in_context unresolved errors as
 * compact records (with an <error_summary> when older ones are hidden), and
 * the instruction for `kind`. `tools` (n_tools names, may be NULL) is listed
 * for AG_RECOVER_UNKNOWN_TOOL. Returns the length needed (like snprintf), or
 * 0 when there is no unresolved error and kind is not NO_TOOL_CALL.
 */
AG_EXTERN size_t ag_guard_error_context(const ag_guard *g, ag_recover_kind kind,
                                        const char *const *tools,
                                        size_t n_tools, char *buf, size_t cap);

/*
 * The escalation record {"status":"escalated","reason":...,"last_error":...,
 * "error_history":[...]} for the trip `v` describes (v may be NULL: the
 * guard's last trip), as compact JSON in *out (caller-owns, free with
 * ag_free). Returns AG_OK or AG_ENOMEM. `err` may be NULL.
 */
AG_EXTERN ag_err_t ag_guard_escalation_record(const ag_guard *g,
                                              const ag_verdict *v, char **out,
                                              ag_error_t *err);

/*
 * The guard's whole state as JSON (counters, per-tool breaker state, rings,
 * error history, nudge flags) in *out (caller-owns, free with ag_free).
 * Returns AG_OK or AG_ENOMEM. `err` may be NULL.
 */
AG_EXTERN ag_err_t ag_guard_dump(const ag_guard *g, char **out,
                                 ag_error_t *err);

#ifdef __cplusplus
}
#endif
#endif /* AGENTGUARD_CORE_H */
