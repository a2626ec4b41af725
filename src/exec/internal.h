/*
 * src/exec/internal.h - declarations shared between the exec layer's files
 * (ag__ prefix). Not installed, not API.
 *
 * Files and what they own:
 *   output.c     ag_output_* and ag__output_* (bounded buffers)
 *   retry.c      ag__retry_delay, ag__exec_call (the retry executor),
 *                ag_exec_status_name, ag_exec_result_clear
 *   scheduler.c  ag_scheduler_* (approvals, thread pool, batches)
 *   registry.c   ag_registry_*, ag_tool_def_init, ag__registry_find
 *   schema*.c    ag__schema_* (JSON Schema subset: schema_compile.c
 *                compiles, schema.c validates, schema_util.c shares;
 *                schema_node.h is their node)
 *   subprocess.c ag__subprocess_run, ag__subprocess_run_in (spawning,
 *                pipes, the wait loop, captured output), ag__env_build
 *   subprocess_supervisor.c
 *                ag__supervisor_run (after the fork: the supervisor and the
 *                tool, process groups, killing the tool's tree)
 *   workdir.c    ag__wd_* (paths confined beneath a directory)
 *   builtin.c    ag_builtin_* (the built-in file and command tools)
 *   toolsfile.c  ag_registry_add_json, ag_tools_file_load (TOOL objects)
 *   configfile.c ag_config_load_file (declared in core.h; the core reads no
 *                files)
 */
#ifndef AG_EXEC_INTERNAL_H
#define AG_EXEC_INTERNAL_H

#include <sys/types.h>

#include "agentguard/exec.h"

#include "../core/internal.h"

/* ---- output.c ----------------------------------------------------------- */

/* A bounded buffer: at most `cap` bytes are kept (plus a NUL); the rest is
 * counted in `dropped` and `truncated` is set. */
struct ag_output {
  char *buf;
  size_t cap, len;
  size_t dropped;
  bool truncated;
  int transient; /* -1: not said; 0: permanent; 1: transient */
};

ag_err_t ag__output_init(ag_output *o, size_t cap);
void ag__output_free(ag_output *o);
void ag__output_reset(ag_output *o); /* empty again, same cap */

/* Hands the buffer over (NUL-terminated, caller-owns) and leaves `o` empty
 * with no buffer; returns NULL on ENOMEM when a fresh buffer was needed. */
char *ag__output_take(ag_output *o, size_t *len);

/* ---- schema.c ----------------------------------------------------------- */

typedef struct ag__schema ag__schema;

/*
 * Compiles a JSON Schema (subset listed in exec.h ag_registry_add) from
 * `schema` (borrowed). Unsupported keywords and malformed values are
 * AG_ECONFIG: "tools.<tool>.parameters/properties/path: unsupported keyword
 * \"format\"". `pattern`s are compiled with PCRE2 (ECMA-like options, match
 * limits: the note in schema.c).
 */
ag_err_t ag__schema_compile(ag__schema **out, const json_t *schema,
                            const char *tool, ag_error_t *err);
/* The same for a schema of any value, not only of a tool's arguments (the
 * root may be false or exclude objects): the JSON Schema Test Suite's
 * cases (tests/runtime/test_schema.c). */
ag_err_t ag__schema_compile_value(ag__schema **out, const json_t *schema,
                                  ag_error_t *err);
void ag__schema_free(ag__schema *s);

/* AG_OK or AG_EINVAL with "<json pointer>: <what>" ("/items/2/path: expected
 * string"); at the root the message is just "<what>". Thread-safe on a
 * compiled schema. */
ag_err_t ag__schema_validate(const ag__schema *s, const json_t *value,
                             ag_error_t *err);

/* ---- registry.c ---------------------------------------------------------- */

/* A registered tool: the copied definition and its compiled schema. */
typedef struct ag__tool {
  ag_tool_def def;    /* strings and argv point into this struct's copies */
  char **argv_copy;   /* NULL-terminated, or NULL for native tools */
  char **env_copy;    /* NULL-terminated, or NULL: no extra variables */
  ag__schema *schema; /* NULL: any object */
  json_t *parameters; /* parsed schema (own reference), or NULL */
} ag__tool;

const ag__tool *ag__registry_find(const ag_registry *r, const char *name);

/* Hands `p` to the registry: ag_registry_free calls free_fn(p) after every
 * tool is gone (the state native tools share, e.g. the built-in tools'
 * workdir). AG_OK, or AG_ENOMEM with `p` not taken. */
ag_err_t ag__registry_own(ag_registry *r, void *p, void (*free_fn)(void *));

/* ---- subprocess.c ------------------------------------------------------- */

typedef struct ag__proc_info {
  int exit_code;    /* when exited normally, else -1 */
  int term_signal;  /* when killed by a signal, else 0 */
  bool exec_failed; /* argv[0] could not be executed */
  int exec_errno;
  bool killed; /* we sent SIGTERM/SIGKILL (timeout or cancel) */
} ag__proc_info;

/*
 * Runs argv (argv[0] searched in PATH) in its own process group, under a
 * per-call supervisor process, with `input` on stdin, capturing stdout into
 * `out` and stderr into `err` (each bounded by its cap), watching `cancel`
 * (and its deadlines). On cancel: SIGTERM to the group, SIGKILL to every
 * process of the tool after kill_grace_ms (at once when the token chain
 * was forced, ag_cancel_force). When the tool exits, whatever it left
 * running - in its group or not - is killed; the call returns only when
 * every process of the tool is reaped, and if the calling process dies the
 * supervisor kills them (docs/security.md).
 * Returns AG_TOOL_OK for exit 0; AG_TOOL_ERROR for a non-zero exit, a
 * signal or an exec failure (and writes a readable message into `err` when
 * stderr was empty: "exited with status 3", "killed by signal 11
 * (Segmentation fault)", "cannot run 'x': No such file or directory");
 * AG_TOOL_TIMEOUT when cancel fired with AG_CANCEL_TIMEOUT; AG_TOOL_CANCELLED
 * for the other cancel reasons. Never leaves an fd or a zombie behind.
 */
ag_tool_status ag__subprocess_run(const char *const *argv,
                                  const ag_rlimits *limits,
                                  int64_t kill_grace_ms, const char *input,
                                  size_t input_len, ag_cancel *cancel,
                                  ag_output *out, ag_output *err,
                                  ag__proc_info *info);

/* Most entries a tool's env list may have, and the longest name. */
#define AG__ENV_MAX 256
#define AG__ENV_NAME_MAX 128

/* Whether `entry` is "NAME" or "NAME=value" with a valid NAME; *name_len
 * gets NAME's length. */
bool ag__env_entry_valid(const char *entry, size_t *name_len);

/*
 * Builds a tool's environment (docs/security.md): PATH, HOME, LANG, TERM,
 * TMPDIR from the process's environment, or all of it when `inherit`; then
 * `extra` (may be NULL; "NAME" passes the process's NAME when set,
 * "NAME=value" sets it; later wins). *out gets one allocation (free() it):
 * a NULL-terminated "NAME=value" array and its strings. Reads environ
 * (getenv's thread-safety: no concurrent setenv). AG_OK or AG_ENOMEM.
 */
ag_err_t ag__env_build(const char *const *extra, bool inherit, char ***out);

/* The same with the tool's environment: envp (borrowed, NULL-terminated
 * "NAME=value" strings) replaces the process's environment; NULL inherits
 * it (ag__subprocess_run). argv[0] is looked up in the process's PATH. */
ag_tool_status ag__subprocess_run_env(const char *const *argv,
                                      const ag_rlimits *limits,
                                      char *const *envp, int64_t kill_grace_ms,
                                      const char *input, size_t input_len,
                                      ag_cancel *cancel, ag_output *out,
                                      ag_output *err, ag__proc_info *info);

/* The same with the tool started in the directory `cwd_fd` (the
 * supervisor fchdir()s to it before forking the tool; -1: the caller's) and
 * the environment envp as in ag__subprocess_run_env. A failure to enter it
 * is an exec failure: "cannot enter the working directory for 'x':
 * <strerror>". The descriptor is borrowed and must stay open for the call. */
ag_tool_status ag__subprocess_run_in(int cwd_fd, const char *const *argv,
                                     const ag_rlimits *limits,
                                     char *const *envp, int64_t kill_grace_ms,
                                     const char *input, size_t input_len,
                                     ag_cancel *cancel, ag_output *out,
                                     ag_output *err, ag__proc_info *info);

/* ---- subprocess_supervisor.c -------------------------------------------- */

/*
 * Messages on the status pipe, {kind, value} as two ints (8 bytes, atomic on
 * a pipe). The tool writes a stage and errno when it fails before exec; the
 * supervisor writes AG__STAGE_SUPERVISOR when it cannot start the tool,
 * AG__MSG_PID once the tool is forked and AG__MSG_EXIT with the tool's wait
 * status at the end.
 */
enum {
  AG__STAGE_PGID = 1,
  AG__STAGE_STDIO,
  AG__STAGE_RLIMIT,
  AG__STAGE_EXEC,
  AG__STAGE_SUPERVISOR,
  AG__STAGE_CWD
};
enum { AG__MSG_PID = 16, AG__MSG_EXIT = 17 };

/* Commands on the lifeline, from the runner to the supervisor. EOF (the
 * runner's process died) means AG__CMD_KILL. */
#define AG__CMD_TERM 'T' /* SIGTERM to the tool's process group */
#define AG__CMD_KILL 'K' /* SIGKILL to every process of the tool, then exit */

/*
 * The supervisor, in the child of spawn_child's fork (subprocess.c): forks
 * the tool (argv, limits, envp, started in cwd_fd unless -1) with stdio[]
 * as its stdin, stdout and stderr, reports on status_fd, takes commands
 * from life_fd, kills and reaps the tool's tree and _exit()s; never
 * returns. `runner` is the pid of the process that forked it. Makes only
 * async-signal-safe calls.
 */
void ag__supervisor_run(const char *const *argv, const ag_rlimits *limits,
                        char *const *envp, int cwd_fd, int stdio[3],
                        int status_fd, int life_fd, pid_t runner);

/* ---- workdir.c ---------------------------------------------------------- */

/* Longest path a tool may name, in bytes (Linux's PATH_MAX less the NUL). */
#define AG__WD_PATH_MAX 4095

/* A directory that paths are confined beneath (the note in workdir.c). */
typedef struct ag__wd {
  int root;  /* O_PATH | O_DIRECTORY descriptor, or -1 */
  bool walk; /* resolve by walking instead of openat2 */
} ag__wd;

/* Opens `dir` (AG_OK; AG_ENOTFOUND, AG_EIO naming it). AG_RESOLVE_AUTO
 * probes openat2 and walks when it is missing (ENOSYS, EPERM);
 * AG_RESOLVE_OPENAT2 fails with AG_EIO when it is. */
ag_err_t ag__wd_open_root(ag__wd *wd, const char *dir, ag_resolve_mode mode,
                          ag_error_t *err);
void ag__wd_close(ag__wd *wd);

/*
 * Opens `path` beneath the workdir with open(2)'s `flags` (O_CLOEXEC is
 * added) and `mode` (for O_CREAT). Symlinks inside are followed; "..",
 * absolute paths and symlinks that lead outside are refused. Returns the
 * descriptor (the caller closes it), or -1 with errno set and a message in
 * msg[0..msg_cap): "path escapes the workdir: ../x", "no such file or
 * directory: x", "not a directory: x", ...
 */
int ag__wd_open(const ag__wd *wd, const char *path, int flags, mode_t mode,
                char *msg, size_t msg_cap);

/* Creates the directory `dir` and its missing parents beneath the workdir
 * (like mkdir -p, each step confined as ag__wd_open). 0, or -1 with errno
 * and a message. */
int ag__wd_mkdirs(const ag__wd *wd, const char *dir, char *msg, size_t msg_cap);

/* ---- retry.c ------------------------------------------------------------ */

/* The delay before retry number `attempt` + 1 (attempt is 0-based: the
 * attempt that just failed), per retry.backoff, capped at retry.max_delay,
 * with jitter when retry.jitter (rng: caller's xorshift state). */
int64_t ag__retry_delay(const ag_config *cfg, int attempt, uint64_t *rng);

/* One call for ag__exec_call; every pointer is borrowed for the call. */
typedef struct ag__call {
  const ag__tool *tool;     /* the validated tool; not NULL */
  const ag_config *cfg;     /* retry.* and the function timeout; not NULL */
  const char *args;         /* the arguments as JSON text (subprocess stdin) */
  size_t args_len;          /* bytes of args */
  const json_t *parsed;     /* the same arguments parsed (native tools) */
  ag_cancel *turn;          /* the turn's token; NULL: none */
  int call_index;           /* ag_attempt.call_index */
  ag_attempt_fn on_attempt; /* every attempt, on the calling thread; NULL */
  void *attempt_user;       /* on_attempt's first argument */
  uint64_t *rng;            /* xorshift state for jitter; NULL: a local one */
} ag__call;

/*
 * Runs one validated call of call->tool with DESIGN.md's retry rules:
 * per-attempt timeout (an attempt token linked to call->turn), retries per
 * retry.retry_on and the classifier, timeouts retried only for idempotent
 * tools, cancellable waits; reports every attempt through call->on_attempt;
 * fills `out` with the final status, category, attempts, duration and text
 * ("Error after 4 attempts: <message>", "Function timed out after 30s").
 * Returns AG_OK, AG_ENOMEM, or AG_EINVAL when out, call, its tool or its
 * cfg is NULL.
 */
ag_err_t ag__exec_call(const ag__call *call, ag_exec_result *out);

#endif /* AG_EXEC_INTERNAL_H */
