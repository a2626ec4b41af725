/*
 * agentguard/exec.h - running tool calls for real: cancellation tokens and
 * deadlines, the retry executor, the tool registry with JSON Schema argument
 * validation, native and subprocess tools, and the two-phase scheduler.
 *
 * The exec layer applies the rules (docs/execution.md) for retries, timeouts,
 * approvals, two-phase execution and cancellation. It uses the core's
 * classifier and config; it never decides loop verdicts (that is the guard).
 *
 * Thread-safety: ag_cancel is safe from any thread, and ag_cancel_cancel()
 * also from a signal handler. A registry is read-only once tools are added
 * and may then be shared by threads. A scheduler is used by one thread at a
 * time; it runs tools on its own pool threads.
 */
#ifndef AGENTGUARD_EXEC_H
#define AGENTGUARD_EXEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "base.h"
#include "common.h"
#include "core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Tools                                                                    */
/* ------------------------------------------------------------------------ */

/* A bounded result buffer handed to native tools. */
typedef struct ag_output ag_output;

/*
 * Appends `len` bytes of `data` to the result; past the buffer's cap the
 * rest is dropped and the result is marked truncated. Returns 0, or 1 once
 * truncated. `data` NULL or `len` 0 appends nothing; `o` NULL returns 1.
 */
AG_EXTERN int ag_output_write(ag_output *o, const char *data, size_t len);
/* As ag_output_write, for printf-style text. `o` or `fmt` NULL returns 1. */
AG_EXTERN int ag_output_printf(ag_output *o, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* Marks an AG_TOOL_ERROR as transient (retry it) or permanent, overriding
 * the classifier. `o` NULL does nothing. */
AG_EXTERN void ag_output_set_transient(ag_output *o, bool transient);

typedef enum {
  AG_TOOL_OK = 0,
  AG_TOOL_ERROR,    /* the output holds the error text */
  AG_TOOL_TIMEOUT,  /* the attempt timed out */
  AG_TOOL_CANCELLED /* the turn or the caller cancelled */
} ag_tool_status;

/*
 * A native tool. Runs on a scheduler pool thread (or the caller's thread for
 * a batch of one). `args` is borrowed for the call and already validated
 * against the tool's schema. It must watch `cancel` (ag_cancel_check or
 * ag_cancel_fds) and return AG_TOOL_CANCELLED promptly when it fires.
 */
typedef ag_tool_status (*ag_tool_fn)(void *user, const json_t *args,
                                     ag_cancel *cancel, ag_output *out);

/* Optional limits for a subprocess tool; 0 = not set. */
typedef struct ag_rlimits {
  int64_t cpu_seconds;
  int64_t address_space_bytes;
  int64_t open_files;
} ag_rlimits;

typedef struct ag_tool_def {
  const char *name;        /* required; copied */
  const char *description; /* copied; may be NULL */
  const char *parameters;  /* JSON Schema text; NULL: any object */
  bool requires_approval;
  bool idempotent;    /* may be retried after a timeout (default true) */
  int64_t timeout_ms; /* per attempt; -1: retry.function_timeout */
  int max_retries;    /* -1: retry.max_retries */
  /* native: */
  ag_tool_fn fn;
  void *user;
  /* or subprocess: NULL-terminated argv, copied; argv[0] looked up in PATH */
  const char *const *argv;
  size_t max_output;     /* captured bytes per stream; 0: 1 MiB */
  int64_t kill_grace_ms; /* SIGTERM then SIGKILL after this; 0: 500 ms */
  ag_rlimits limits;
  /* The environment of a subprocess tool. By default it gets only PATH,
   * HOME, LANG, TERM and TMPDIR from agentguard's environment (those that
   * are set), never the rest: API keys stay out of tools. `env` adds to
   * that (NULL-terminated, at most 256 entries, copied): "NAME" passes
   * NAME from agentguard's environment when it is set there, "NAME=value"
   * sets it; a later entry for the same name wins. NAME is
   * [A-Za-z_][A-Za-z0-9_]*. `inherit_env` passes the whole environment
   * instead (then `env` still adds and overrides). */
  const char *const *env;
  bool inherit_env;
} ag_tool_def;

/* Fills `d` with the defaults (idempotent, timeout and retries from the
 * config). */
AG_EXTERN void ag_tool_def_init(ag_tool_def *d);

typedef struct ag_registry ag_registry;

/* Creates an empty registry. Returns AG_OK and sets *out, AG_EINVAL (out
 * NULL) or AG_ENOMEM (*out NULL). `err` may be NULL. */
AG_EXTERN ag_err_t ag_registry_new(ag_registry **out, ag_error_t *err);
/* Frees a registry and its copies of the definitions; no scheduler or agent
 * may still use it. NULL does nothing. */
AG_EXTERN void ag_registry_free(ag_registry *r);

/*
 * Adds a tool (copied). Exactly one of fn and argv must be set. The schema is
 * parsed and checked now: supported keywords are type, properties, required,
 * additionalProperties, enum, const, items, minItems, maxItems, minimum,
 * maximum, minLength, maxLength, pattern (PCRE2 with ECMA-262-like options,
 * at most 1000 bytes; a match that reaches PCRE2's match limit is a
 * validation error, docs/tools.md), and the annotations description, title,
 * default, examples, $schema, $id, $comment; anything else is AG_ECONFIG naming
 * the keyword and its path, as is parameters text that is not JSON (with line
 * and column). Problems with the definition itself (name not
 * [A-Za-z0-9_-]{1,64}, both or neither of fn and argv, a duplicate name,
 * out-of-range numbers, an env entry that is not NAME or NAME=value, env
 * on a native tool) are AG_EINVAL; more than 1024 tools is AG_ETOOBIG.
 * docs/tools.md has every rule and message.
 */
AG_EXTERN ag_err_t ag_registry_add(ag_registry *r, const ag_tool_def *def,
                                   ag_error_t *err);

/* Number of tools in the order they were added; 0 for NULL. */
AG_EXTERN size_t ag_registry_count(const ag_registry *r);
/* The i-th tool's name (borrowed until ag_registry_free), or NULL when `r`
 * is NULL or i >= ag_registry_count(r). */
AG_EXTERN const char *ag_registry_name(const ag_registry *r, size_t i);

/* The tool's definition (borrowed until ag_registry_free), or NULL: no such
 * tool, or `r` or `name` NULL. */
AG_EXTERN const ag_tool_def *ag_registry_get(const ag_registry *r,
                                             const char *name);

/*
 * Validates `args` against the tool's schema. Returns AG_OK, AG_ENOTFOUND
 * (no such tool) or AG_EINVAL with the first violation in err->msg as
 * "<json pointer>: <what>", e.g. "/items/2/path: expected string".
 */
AG_EXTERN ag_err_t ag_registry_validate(const ag_registry *r, const char *name,
                                        const json_t *args, ag_error_t *err);

/* The tools as an OpenAI "tools" array (new reference), or NULL on ENOMEM. */
AG_EXTERN json_t *ag_registry_tools_json(const ag_registry *r);

/* ------------------------------------------------------------------------ */
/* Running calls: retries and the two-phase scheduler                      */
/* ------------------------------------------------------------------------ */

/* One execution attempt, reported as it ends. */
typedef struct ag_attempt {
  int call_index;         /* the call's index in the batch */
  const char *name;       /* the tool */
  int attempt;            /* 1-based */
  ag_tool_status outcome; /* ok, error, timeout, cancelled */
  int64_t duration_ms;
  int64_t retry_in_ms; /* delay before the next attempt, or -1: no retry */
  const char *message; /* error text (borrowed for the callback), or "";
                          NUL-terminated, but may hold NUL bytes itself */
  size_t message_len;  /* bytes of message: read it with this length */
} ag_attempt;

/* Called after every attempt, from the thread that ran it; must be
 * thread-safe. */
typedef void (*ag_attempt_fn)(void *user, const ag_attempt *a);

typedef enum {
  AG_EXEC_OK = 0,
  AG_EXEC_ERROR,     /* failed after its attempts */
  AG_EXEC_TIMEOUT,   /* the last attempt timed out */
  AG_EXEC_CANCELLED, /* the turn deadline or the caller cancelled */
  AG_EXEC_DENIED,    /* refused at approval: "Tool call rejected: ..." */
  AG_EXEC_NOT_FOUND, /* unknown tool: never ran */
  AG_EXEC_INVALID,   /* arguments broke the schema: never ran */
  AG_EXEC_SKIPPED    /* the caller asked not to run it (held by the guard) */
} ag_exec_status;

/* "ok", "error", ...; a static string. */
AG_EXTERN const char *ag_exec_status_name(ag_exec_status s);

/* A call's final result. `text` is caller-owns: release with
 * ag_exec_result_clear. */
typedef struct ag_exec_result {
  ag_exec_status status;
  bool ok;              /* status == AG_EXEC_OK */
  ag_category category; /* of the error; AG_CAT_UNKNOWN when ok */
  int attempts;         /* 0 when it never ran */
  bool truncated;       /* output went past the tool's cap */
  int64_t duration_ms;  /* all attempts and waits */
  char *text;           /* result, or the final error text */
  size_t text_len;
} ag_exec_result;

/* Frees r->text and zeroes the result. NULL does nothing. */
AG_EXTERN void ag_exec_result_clear(ag_exec_result *r);

/* One call of a batch. Pointers borrowed for the run. */
typedef struct ag_exec_call {
  const char *name;
  const char *args; /* JSON text */
  size_t args_len;
  bool skip; /* do not run (result AG_EXEC_SKIPPED) */
  /* The call's signature (ag_signature: AG_SIG_LEN bytes) when the caller
   * has it already - the agent passes the guard's - or NULL: the scheduler
   * then computes it itself, and only for a call that needs an approval
   * question (one question per distinct signature). Borrowed. */
  const uint8_t *signature;
} ag_exec_call;

typedef enum {
  AG_APPROVE_DENY = 0,
  AG_APPROVE_ONCE,
  AG_APPROVE_SESSION /* allow this tool for the rest of the session */
} ag_approval;

/*
 * Approval callback: phase 1, on the caller's thread, one question at a time,
 * once per distinct signature in a batch. It may write a reason for a denial
 * into reason[0..reason_cap).
 */
typedef ag_approval (*ag_approve_fn)(void *user, const char *tool,
                                     const char *args, size_t args_len,
                                     char *reason, size_t reason_cap);

/*
 * Options of a scheduler. Versioned: `size` comes first and
 * ag_scheduler_opts_init sets it to sizeof(ag_scheduler_opts) of the header
 * the caller compiled against, so fields appended in later versions keep
 * older callers working (docs/c-api.md, "Options structs"). Always start
 * from ag_scheduler_opts_init; a struct whose size is 0 is AG_EINVAL.
 */
typedef struct ag_scheduler_opts {
  size_t size;           /* set by ag_scheduler_opts_init; do not change */
  ag_approve_fn approve; /* NULL: approve everything */
  void *approve_user;
  ag_attempt_fn on_attempt; /* may be NULL */
  void *attempt_user;
  uint64_t jitter_seed; /* for retry jitter; 0: from the clock */
} ag_scheduler_opts;

/* Fills `o` with the defaults (every callback NULL, jitter_seed 0) and sets
 * o->size. NULL does nothing. */
AG_EXTERN void ag_scheduler_opts_init(ag_scheduler_opts *o);

typedef struct ag_scheduler ag_scheduler;

/*
 * Creates a scheduler over `reg` (borrowed; must outlive it) with `cfg`
 * (copied: retry.*, loop.parallel, loop.max_parallel) and `opts` (copied;
 * NULL: the defaults). Starts loop.max_parallel pool threads (none when
 * loop.parallel is false or max_parallel is 1: then every call runs on the
 * caller's thread). Returns AG_OK and sets *out, AG_EINVAL (out, reg or cfg
 * NULL, or opts->size not set by ag_scheduler_opts_init), AG_ENOMEM, AG_EIO
 * (thread creation failed; err->sys_errno). *out is NULL on failure (when
 * out is not NULL). `err` may be NULL.
 */
AG_EXTERN ag_err_t ag_scheduler_new(ag_scheduler **out, const ag_registry *reg,
                                    const ag_config *cfg,
                                    const ag_scheduler_opts *opts,
                                    ag_error_t *err);

/* Stops and joins the pool threads, then frees. NULL does nothing. */
AG_EXTERN void ag_scheduler_free(ag_scheduler *s);

/*
 * Runs a batch: phase 1 asks approvals sequentially (remembering "allow for
 * the session"); phase 2 runs the approved calls - a batch of one on the
 * caller's thread, more on the pool (at most loop.max_parallel at once, or
 * one at a time when loop.parallel is false), each through the retry
 * executor. `turn` (may be NULL) reaches every running call, retry wait and
 * subprocess. results[0..n) come back in the calls' order; every one must be
 * released with ag_exec_result_clear. Returns AG_OK (per-call failures are in
 * the results) or AG_ENOMEM.
 */
AG_EXTERN ag_err_t ag_scheduler_run(ag_scheduler *s, const ag_exec_call *calls,
                                    size_t n, ag_cancel *turn,
                                    ag_exec_result *results, ag_error_t *err);

/* Forgets the "allow for the session" answers. */
AG_EXTERN void ag_scheduler_reset_approvals(ag_scheduler *s);

/* ------------------------------------------------------------------------ */
/* Built-in tools (docs/tools.md, "Built-in tools")                         */
/* ------------------------------------------------------------------------ */

/* How paths are confined beneath the workdir. */
typedef enum {
  AG_RESOLVE_AUTO = 0, /* openat2 where the kernel has it, else the walk */
  AG_RESOLVE_OPENAT2,  /* openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS) */
  AG_RESOLVE_WALK      /* openat(O_NOFOLLOW) one component at a time */
} ag_resolve_mode;

typedef struct ag_builtin_opts {
  const char *workdir;   /* required; opened once by ag_builtin_register */
  bool allow_commands;   /* register run_command (default false) */
  bool yes;              /* run_command runs without approval (default false) */
  size_t max_read_bytes; /* read_file, edit_file; 0: 256 KiB */
  size_t max_write_bytes;  /* write_file content, edit_file result; 0: 1 MiB */
  size_t max_list_entries; /* list_dir; 0: 1000 */
  size_t max_matches;      /* search_text; 0: 200 */
  size_t max_search_bytes; /* search_text skips larger files; 0: 1 MiB */
  size_t max_output;       /* run_command: bytes kept per stream; 0: 64 KiB */
  int64_t command_timeout_ms; /* run_command per run; -1 (default):
                                 retry.function_timeout */
  const char *shell; /* run_command's "command" strings; NULL: /bin/sh */
  ag_resolve_mode resolve;
} ag_builtin_opts;

/* Fills `o` with the defaults above (workdir NULL). */
AG_EXTERN void ag_builtin_opts_init(ag_builtin_opts *o);

/*
 * Registers the built-in tools in `reg`: read_file, write_file, edit_file,
 * list_dir, search_text, and run_command when opts->allow_commands. Every
 * path a tool is given is resolved beneath opts->workdir (opened now and
 * held by the registry until ag_registry_free): "..", absolute paths and
 * symlinks that lead outside are refused ("path escapes the workdir: ../x").
 * run_command runs in the workdir through the subprocess machinery
 * (timeout, SIGTERM then SIGKILL to its group, capped output); it requires
 * approval unless opts->yes, and is never retried. opts and its strings are
 * copied. Returns AG_OK; AG_EINVAL (no workdir, a tool of the same name is
 * already registered); AG_ENOTFOUND (the workdir does not exist); AG_EIO
 * (it cannot be opened, or AG_RESOLVE_OPENAT2 on a kernel without openat2);
 * AG_ETOOBIG (the registry's tool limit); AG_ENOMEM. On failure no tool
 * has been added, except after AG_ENOMEM or AG_ETOOBIG, when some may have
 * been: free the registry. Single-threaded, like ag_registry_add.
 */
AG_EXTERN ag_err_t ag_builtin_register(ag_registry *reg,
                                       const ag_builtin_opts *opts,
                                       ag_error_t *err);

/* ------------------------------------------------------------------------ */
/* Tools defined in JSON: a TOOL object, a tools file                       */
/* ------------------------------------------------------------------------ */

typedef struct ag_tool_json_opts {
  const char *path; /* names the object in messages; NULL: "tools.NAME" */
  const char *const *extra_keys; /* NULL-terminated keys the caller reads
                                    itself (accepted here); NULL: none */
  ag_tool_fn fn; /* NULL: the object must have "command"; else the native
                    implementation of an object without it */
  void *user;    /* for fn; borrowed, must outlive the registry */
} ag_tool_json_opts;

/* Fills `o` with the defaults above. */
AG_EXTERN void ag_tool_json_opts_init(ag_tool_json_opts *o);

/*
 * Adds the tool `name` from a TOOL object (`tool`, borrowed) in the format
 * of a scenario's "tools" (docs/scenarios.md): "description" (string),
 * "parameters" (a JSON Schema object), "requires_approval", "idempotent"
 * (booleans) and "command" (1 to 256 strings: the argv of a subprocess
 * tool that gets the arguments as JSON on stdin). `opts` may be NULL.
 * Errors name the key path: "tools.grep.comand: unknown key; did you mean
 * command?", "tools.grep.command[1]: expected a string, got integer", and
 * the registry's own (ag_registry_add). Returns AG_OK, AG_EINVAL,
 * AG_ECONFIG (the schema), AG_ETOOBIG, AG_ENOMEM; on failure nothing is
 * added. Single-threaded, like ag_registry_add.
 */
AG_EXTERN ag_err_t ag_registry_add_json(ag_registry *r, const char *name,
                                        const json_t *tool,
                                        const ag_tool_json_opts *opts,
                                        ag_error_t *err);

/*
 * Adds the tools of a tools file: `json` (len bytes, at most 4 MiB;
 * borrowed) is one object {"NAME": TOOL, ...}, each TOOL as for
 * ag_registry_add_json with a "command". All or nothing: when any tool is
 * wrong, or a name is already registered, nothing is added. Returns AG_OK;
 * AG_EJSON (not JSON, or a duplicate key: "line L, column C: ...", with
 * err->line, column and pos); AG_EINVAL, AG_ECONFIG (a tool, its key path
 * named); AG_ETOOBIG; AG_ENOMEM (then the registry may hold some of the
 * tools: free it).
 */
AG_EXTERN ag_err_t ag_tools_file_load(ag_registry *r, const char *json,
                                      size_t len, ag_error_t *err);

#ifdef __cplusplus
}
#endif
#endif /* AGENTGUARD_EXEC_H */
