/*
 * src/core/internal.h - declarations shared between the core's files (ag__
 * prefix). Not installed, not API.
 */
#ifndef AG_CORE_INTERNAL_H
#define AG_CORE_INTERNAL_H

#include <stdarg.h>

#include "agentguard/core.h"

#include "../base/internal.h"

/* ------------------------------------------------------------------------ */
/* Config from bytes (src/core/config.c), for ag_config_load_file          */
/* ------------------------------------------------------------------------ */

/* ag_config_parse with every message prefixed "<source>: " (source may be
 * NULL: as ag_config_parse). json must not be NULL. */
ag_err_t ag__config_parse_from(ag_config *cfg, const char *json, size_t len,
                               const char *source, ag_error_t *err);

/* Copies `e` into `err` (may be NULL) as "<source>: <e's message>"; returns
 * e's code. */
ag_err_t ag__config_error_from(ag_error_t *err, const ag_error_t *e,
                               const char *source);

/* Whether a json_load* that returned NULL ran out of memory (`je`: its
 * json_error_t *): jansson's out-of-memory code, or no error text at all -
 * jansson 2.14 says nothing when its lexer cannot be set up, and every
 * other failure names what is wrong. tests/oom/ checks the callers. */
#define AG__JSON_NOMEM(je)                                                     \
  (json_error_code(je) == json_error_out_of_memory || (je)->text[0] == '\0')

/* ------------------------------------------------------------------------ */
/* Suggestions (src/core/suggest.c)                                         */
/* ------------------------------------------------------------------------ */

#define AG__SUGGEST_MAX 64 /* longest name compared, in bytes */

/* Optimal string alignment distance (Levenshtein plus adjacent
 * transpositions), ASCII case-insensitive; -1 when either input is longer
 * than AG__SUGGEST_MAX bytes. */
int ag__edit_distance(const char *a, size_t la, const char *b, size_t lb);

/* The largest distance worth a "did you mean": 1 for inputs shorter than 6
 * bytes, else 2. */
int ag__suggest_limit(size_t input_len);

/* ------------------------------------------------------------------------ */
/* SHA-256 (src/core/sha256.c)                                              */
/* ------------------------------------------------------------------------ */

/* A reusable SHA-256 context: init/update/final never allocate. Not
 * thread-safe: one per owner. */
typedef struct ag__sha256 ag__sha256;

ag_err_t ag__sha256_new(ag__sha256 **out); /* AG_ENOMEM, AG_ECRYPTO */
void ag__sha256_free(ag__sha256 *s);
void ag__sha256_init(ag__sha256 *s);
void ag__sha256_update(ag__sha256 *s, const void *data, size_t len);
/* false when the library reported a failure anywhere since init. */
bool ag__sha256_final(ag__sha256 *s, uint8_t out[AG_SIG_LEN]);

/* ------------------------------------------------------------------------ */
/* JCS canonicalizer feeding SHA-256 (src/core/jcs*.c)                      */
/* ------------------------------------------------------------------------ */

/*
 * Reusable scratch for canonicalizing and hashing. Everything it needs is
 * allocated by ag__jcs_new; ag__jcs_signature never allocates. Not
 * thread-safe: one per guard.
 */
typedef struct ag__jcs ag__jcs;

/* max_bytes <= UINT32_MAX-1, max_tokens and max_depth >= 1 (else AG_EINVAL);
 * AG_ENOMEM, AG_ECRYPTO. Starts with about 12 KiB of scratch and grows with
 * the arguments it meets, up to about 44 x max_tokens + max_bytes bytes;
 * growth is the only allocation of a signature (AG_ENOMEM when it fails). */
ag_err_t ag__jcs_new(ag__jcs **out, size_t max_bytes, size_t max_tokens,
                     int max_depth, ag_error_t *err);
void ag__jcs_free(ag__jcs *j);

/* Returns scratch grown past its retained size (a large call's) to the
 * system; the guard calls it at each iteration. */
void ag__jcs_trim(ag__jcs *j);

/* The bytes of scratch j holds now (what keeping it for reuse costs). */
size_t ag__jcs_held(const ag__jcs *j);

/*
 * sig = SHA-256(name ":" JCS(args)). On invalid arguments returns the code
 * (AG_EJSON, AG_EDUPKEY, AG_EUTF8, AG_ENUMBER, AG_EDEPTH, AG_ETOOBIG) and
 * fills err with the byte offset in `args` (err->pos) and a message.
 */
ag_err_t ag__jcs_signature(ag__jcs *j, const char *name, size_t name_len,
                           const char *args, size_t args_len,
                           uint8_t sig[AG_SIG_LEN], ag_error_t *err);

/*
 * Writes JCS(args) through `sink` in chunks (no allocation). Input errors are
 * found before the sink gets any byte. `sink` returns 0 to go on, non-zero
 * to stop (then AG_ENOSPACE is returned and the sink has a prefix).
 */
typedef int (*ag__sink_fn)(void *user, const char *data, size_t len);
ag_err_t ag__jcs_write(ag__jcs *j, const char *args, size_t args_len,
                       ag__sink_fn sink, void *user, ag_error_t *err);

/*
 * The tokenizer's tape as a read-only JSON reader (the proxy's decision,
 * src/proxy/proxy.c): ag__jcs_tape validates `text` (RFC 8259, plus: no
 * duplicate keys, nesting at most max_depth, well-formed surrogate escapes)
 * and writes one token per value or key in source order; an object's
 * members follow it as key, value subtree, key, ... Nothing is allocated
 * but growth of the scratch. The text must outlive the accessors' use;
 * token indices are < *n_tokens. A scratch made by ag__jcs_tape_new (no
 * SHA-256) serves ag__jcs_tape only; a guard's may serve both.
 */
enum {
  AG__JT_OBJ = 1,
  AG__JT_ARR,
  AG__JT_STR,
  AG__JT_KEY,
  AG__JT_NUM,
  AG__JT_TRUE,
  AG__JT_FALSE,
  AG__JT_NULL
};
/* A scratch for texts of up to max_bytes (<= UINT32_MAX - 2; no token cap
 * beyond one per byte). AG_ETOOBIG, AG_EINVAL, AG_ENOMEM. */
ag_err_t ag__jcs_tape_new(ag__jcs **out, size_t max_bytes, int max_depth,
                          ag_error_t *err);
/* AG_EJSON (also for len 0), AG_EDUPKEY, AG_EUTF8, AG_ENUMBER (a number out
 * of the range of a double), AG_EDEPTH, AG_ETOOBIG, AG_ENOMEM; err->pos is
 * the byte. */
ag_err_t ag__jcs_tape(ag__jcs *j, const char *text, size_t len,
                      size_t *n_tokens, ag_error_t *err);
int ag__jcs_tok_type(const ag__jcs *j, size_t i); /* AG__JT_* */
/* The index just past token i's subtree (i + 1 for all but containers). */
size_t ag__jcs_tok_next(const ag__jcs *j, size_t i);
/* Strings and keys: the first content byte; numbers, literals, arrays: the
 * first byte. */
size_t ag__jcs_tok_off(const ag__jcs *j, size_t i);
/* Whether key token i, decoded, is s[0..n). */
bool ag__jcs_key_is(const ag__jcs *j, size_t i, const char *s, size_t n);
/* A string or key token's source content (between the quotes, escapes as
 * written): *s and the length. */
size_t ag__jcs_str_raw(const ag__jcs *j, size_t i, const char **s);
/* Whether that content holds any escape. */
bool ag__jcs_str_escaped(const ag__jcs *j, size_t i);
/* Decodes string or key token i into out (room for its raw length + 1: the
 * decoded text is never longer) and NUL-terminates it; returns the decoded
 * length (a \u0000 escape decodes to a NUL byte inside it). */
size_t ag__jcs_str_decode(const ag__jcs *j, size_t i, char *out);
/* The value token of member `key` of object token `obj`, or 0 (not an
 * object, no such member; the root is nobody's member). */
size_t ag__jcs_get(const ag__jcs *j, size_t obj, const char *key);
/* Whether jansson (json_loadb, flags 0) takes every value of the tape of
 * n tokens: it refuses "\u0000" in strings and integers outside
 * json_int_t, which the tokenizer allows. Conservative: any "\u0000" and
 * any integer literal of more than 18 digits say no. */
bool ag__jcs_jansson_safe(const ag__jcs *j, size_t n);
/* The source text of the value of the member whose key is token `key`:
 * *start and the length. */
size_t ag__jcs_member_span(const ag__jcs *j, size_t key, size_t *start);
/* Whether the value at token v (its source text s[0..n), from
 * ag__jcs_member_span) is written exactly as jansson writes it compact
 * (json_dumpb, JSON_COMPACT, numbers read as reals): no whitespace between
 * tokens, no number, no escape in a key, and in strings only the escapes
 * jansson writes the same way (\" \\ \b \f \n \r \t). Conservative:
 * false sends the caller to jansson. */
bool ag__jcs_as_jansson_writes(const ag__jcs *j, size_t v, const char *s,
                               size_t n);

/* ------------------------------------------------------------------------ */
/* Classifier helpers (src/core/classify.c)                                 */
/* ------------------------------------------------------------------------ */

/*
 * Copies `msg` into dst (cap bytes, NUL-terminated) with whitespace runs
 * collapsed to one space and leading/trailing whitespace removed, cut at a
 * UTF-8 boundary to at most max_chars bytes (0 = no cut other than cap).
 * Returns the bytes written; *cut is set when anything was dropped.
 */
size_t ag__collapse_ws(char *dst, size_t cap, const char *msg, size_t len,
                       size_t max_chars, bool *cut);

/* Whether a failure of category `cat` is information - the work failing,
 * the tool doing its job - rather than a malfunction of the tool loop
 * (src/core/failure.c, docs/errors.md). Pure. */
bool ag__failure_is_information(ag_category cat, const char *text, size_t len);

/* ------------------------------------------------------------------------ */
/* The mechanism table                                                      */
/* ------------------------------------------------------------------------ */

/*
 * Every mechanism of DESIGN.md section 3 with the config limits that turn it
 * on (any > 0) or off (all 0): X(REASON, key1, key2), key2 repeating key1
 * when a mechanism has one key. The guard's trip order, the audit's
 * --all-stops and `only` (one mechanism alone) are written over this table,
 * so adding a mechanism means a row here, its check in guard.c, its tests
 * and its docs.
 */
#define AG__MECHANISMS(X)                                                      \
  X(MAX_ITERATIONS, loop.max_iterations, loop.max_iterations)                  \
  X(MAX_CALLS_PER_TURN, loop.max_calls_per_turn, loop.max_calls_per_turn)      \
  X(IDENTICAL_CALLS, loop.identical_call_limit, loop.identical_call_limit)     \
  X(CYCLIC_CALLS, loop.cycle_limit, loop.cycle_limit)                          \
  X(IDENTICAL_ERRORS, errors.max_identical_errors,                             \
    errors.max_identical_errors)                                               \
  X(TOOL_ERROR_BUDGET, errors.max_tool_errors, errors.max_tool_errors)         \
  X(CONSECUTIVE_ERRORS, errors.max_consecutive_errors,                         \
    errors.max_consecutive_errors)                                             \
  X(TOTAL_ERROR_BUDGET, errors.max_total_errors, errors.max_total_errors)      \
  X(ERROR_PATTERN, errors.similar_error_limit, errors.similar_error_limit)     \
  X(TURN_TIMEOUT, loop.max_turn_duration_ms, loop.max_turn_duration_ms)        \
  X(REFUSED_REPLIES, loop.max_refused_replies, loop.max_refused_replies)       \
  X(DENIED_CALLS, loop.max_denied_calls, loop.max_denied_calls)                \
  X(CONTENT_LOOP, loop.content_loop_repeats, loop.content_loop_repeats)        \
  X(EMPTY_REPLY, loop.max_empty_replies, loop.max_empty_replies)               \
  X(REPEATED_RESULTS, loop.repeated_result_limit, loop.repeated_failure_limit) \
  X(TOKEN_BUDGET, loop.max_tokens_per_turn, loop.max_tokens_per_turn)

/* Whether mechanism `r` is on in `c`. */
bool ag__mechanism_on(const ag_config *c, ag_reason r);

/* Turns mechanism `r` off in `c`. */
void ag__mechanism_off(ag_config *c, ag_reason r);

/* ------------------------------------------------------------------------ */
/* Redaction of credentials (src/core/redact.c)                             */
/* ------------------------------------------------------------------------ */

/* A secret value to hide: `len` bytes at `s` (borrowed). */
typedef struct ag__secret {
  const char *s;
  size_t len;
} ag__secret;

#define AG__SECRET_MIN 8 /* shorter secret values are not redacted */
#define AG__SECRETS_MAX 64

/* Whether an environment variable's name (len bytes) marks its value as a
 * secret: it ends in _KEY, _TOKEN, _SECRET or _PASSWORD, any case. */
bool ag__secret_name(const char *name, size_t len);

/* Puts into out[0..cap) the values (borrowed from envp) of the variables in
 * envp (NULL-terminated "NAME=value", e.g. environ; may be NULL) whose names
 * mark secrets and which are at least AG__SECRET_MIN bytes; returns how
 * many. Reads nothing but envp. */
size_t ag__secrets_from_env(char *const *envp, ag__secret *out, size_t cap);

/* The output size (NUL included) that ag__redact never needs to exceed for
 * an input of `len` bytes. */
size_t ag__redact_bound(size_t len);

/* Whether in[0..len) holds anything ag__redact would replace. */
bool ag__redact_needed(const char *in, size_t len, const ag__secret *secrets,
                       size_t n);

/*
 * Copies in[0..len) (any bytes) to out[0..cap) with every credential
 * replaced by "[REDACTED]": the secrets[0..n) values (and a prefix of at
 * least AG__SECRET_MIN bytes of one that ends the text), "Bearer <token>"
 * (the word kept) and "sk-..." keys; docs/security.md lists the rules.
 * Like snprintf: returns the length of the whole result, writes at most
 * cap - 1 bytes and a NUL (when cap > 0). With cap >= ag__redact_bound(len)
 * nothing is cut. Pure, no allocation, thread-safe.
 */
size_t ag__redact(const char *in, size_t len, const ag__secret *secrets,
                  size_t n, char *out, size_t cap);

/* Whether a call changes the world, from its tool's name and its
 * arguments' JSON text alone (src/core/progress.c; docs/detection.md,
 * "Progress"): a tool not known to be read-only, an editor command other
 * than "view", a shell command that is not made only of reading programs
 * without a redirection into a file. Pure, allocation-free. */
bool ag__call_changes_state(const char *name, size_t name_len, const char *args,
                            size_t args_len);

/* The same in two halves, so that the tool's half is looked at once per
 * tool (the guard keeps it with the tool): what the name says, then what
 * the arguments of a call of that kind say. `tape`, when not NULL, is a
 * scratch holding the arguments' tape (the guard's, just signed): their
 * members are then found by token instead of by scanning the text (a key
 * is compared as written, escapes and all, either way). */
typedef enum {
  AG__TOOL_UNSEEN = 0, /* not looked at yet (the guard's own mark) */
  AG__TOOL_READS,      /* read-only by its name */
  AG__TOOL_SHELL,      /* runs a shell command */
  AG__TOOL_EDITOR,     /* an editor: "view" reads */
  AG__TOOL_OTHER       /* not known to be read-only */
} ag__tool_kind;
ag__tool_kind ag__tool_kind_of(const char *name, size_t name_len);
bool ag__args_change_state(ag__tool_kind kind, const char *args,
                           size_t args_len, const ag__jcs *tape);

/* What a reply without a tool call records when loop.require_tool_call is
 * on, and what the error context says of it: one text for the loop, the
 * guard, the audit's replay and the proxy's, so repeated ones are
 * identical errors everywhere. */
#define AG__NO_TOOL_CALL_TEXT "Your response contained no tool call."

/* Puts a guard back in the state ag_guard_new left it in, keeping its
 * memory (the proxy reuses the guards it makes per request): a new turn
 * (begin_turn clears everything a turn wrote, as it does between turns)
 * numbered 0, no content-loop detector, the scratch trimmed. */
void ag__guard_renew(ag_guard *g);

/* Whether an action ends the turn: a stop, or a question to a human. */
static inline bool ag__stops(ag_action a) {
  return a == AG_STOP || a == AG_ESCALATE;
}

#endif /* AG_CORE_INTERNAL_H */
