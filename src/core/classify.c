/*
 * src/core/classify.c - error categories, the error classifier, UTF-8-safe
 * truncation and the compact error record.
 *
 * Design note.
 *
 * What: an error text (a tool's failure, a provider error, a traceback) is
 * mapped to one of the categories of AG_CATEGORY_MAP. The category decides
 * whether the error is retried (transient), which suggestion the model gets in
 * the compact record, and what the error pattern detector counts as "the same
 * kind of error".
 *
 * Data structure: one static table, `rules`, of (category, flags, pattern)
 * rows. A pattern is lower-case ASCII matched case-insensitively as a
 * substring; `*` inside a pattern stands for any run of bytes on the same line
 * ("file '*' already exists"). Flags: W = whole word (no letter, digit or '_'
 * on either side), L = at the start of a line (after blanks), H = an HTTP
 * status code (see http_context()). The first row that matches wins, so the
 * table runs from specific to general in three tiers: distinctive phrases,
 * exception names / errno names / status codes, then generic words.
 *
 * Where to look: the most specific tier that matches anywhere in the text
 * decides. Within that tier the last line with a match decides (the salient
 * part of an error is usually at its end: the last line of a traceback, the
 * last message of a log); within that line the first row wins. Tier 3 words
 * are weak evidence, so they count only on the last non-blank line:
 * "timeout=timeout" in a traceback's source line must not make an
 * AssertionError a timeout. No pattern spans lines. Texts over 64 KiB are
 * read through their first 16 KiB and last 48 KiB only, which bounds the
 * cost on megabyte outputs.
 *
 * Measured on the 265 texts of shared/data/errors.jsonl (agreement with
 * label_guess or label_alt): this scheme 92.8%; first row over the whole
 * text 92.8%; last non-blank line first, then the whole text 92.5%; last
 * matching line from the end with no tiers 90.9%. The data do not separate
 * the schemes (their labels were mostly set by rules on one salient line);
 * the tiers were kept because they fail safe on long outputs: data printed
 * on the way (lint messages, source lines, test names) cannot outvote the
 * error unless it holds a more specific pattern.
 *
 * Why a substring table and not regular expressions: POSIX regcomp()
 * allocates and compiles at run time (the core must not allocate on the check
 * path), PCRE would be a new dependency, and nearly every useful pattern is a
 * fixed phrase. The few places that need more (a gap, a word boundary, the
 * context of a status code) are handled by the three flags and `*`.
 *
 * Matching: the table stays the one place that says what matches; an index
 * built from it once (see rule_index) buckets the rows by a hash of the
 * first three bytes of their pattern, so each position of the text is tried
 * only against the few rows that start like it, and is read once. One pass
 * over the lines, in order, finds for tiers 1 and 2 the last line with a
 * match and its first row; tier 3 then needs only the last non-blank line.
 * Rejected: a first-byte index built at each call (the previous version:
 * about 17 candidate rows per byte, each measuring its pattern with
 * strcspn, and a second pass over the lines from the end; 80 ns per byte),
 * and an Aho-Corasick automaton (one step per byte, but hundreds of KB of
 * tables for a gain the data do not need). Two guards keep long lines
 * linear, with the same results: a row whose piece after a `*` is missing
 * from the rest of a line is not tried again on that line (it would fail
 * from any later start too), and a status code looks for the word before it
 * only in the 40 bytes where an announcing word must be anyway.
 * Measured (bench/bench_classify, the 265 texts of errors.jsonl, mean 1.2 KB):
 * 3.6 microseconds per text on average, 0.9 median, about 3 ns per byte
 * (the previous version: 92 and 33 microseconds); at most about 1.5 ms for
 * any 10 MB text tried, including single lines built to defeat the index
 * (up to 0.5 s before the guards above).
 *
 * Extending: add a row in the right tier (see the comment above `rules`);
 * earlier rows win. Patterns should start with at least three literal
 * bytes: the index keys on the shortest leading piece of any pattern (up to
 * three), so one shorter pattern stays correct but slows every text. Add a
 * test case to tests/unit/test_classify.c and update the table in
 * docs/errors.md.
 *
 * Thread-safety: every function here is safe from any thread, allocates
 * nothing and does no I/O. The index is a constant built at compile time
 * (see "The index" below): no mutable globals.
 */
#include <stdint.h>
#include <string.h>

#include "internal.h"

/* ------------------------------------------------------------------------ */
/* Categories                                                               */
/* ------------------------------------------------------------------------ */

static const char *const cat_names[] = {
#define X(id, name, transient) name,
    AG_CATEGORY_MAP(X)
#undef X
};

static const bool cat_transient[] = {
#define X(id, name, transient) (transient) != 0,
    AG_CATEGORY_MAP(X)
#undef X
};

/* One action-oriented sentence each; the first five are seed 003's table. */
static const char *const cat_suggestions[AG_CAT__COUNT] = {
    [AG_CAT_UNKNOWN] = "Read the error message and try a different approach "
                       "instead of repeating the same call",
    [AG_CAT_TIMEOUT] = "Try a simpler query or a smaller dataset",
    [AG_CAT_RATE_LIMIT] = "Wait and retry, or use an alternative API",
    [AG_CAT_NETWORK] = "Check the URL or host and that the service is "
                       "running, then retry; the failure may be temporary",
    [AG_CAT_BUSY] = "Wait for the other process to release the file or "
                    "resource, then retry",
    [AG_CAT_AUTH] = "Check credentials or request human approval",
    [AG_CAT_PERMISSION] = "Use a path or action you are allowed to use, or "
                          "ask a human to grant access",
    [AG_CAT_VALIDATION] = "Check input format against the schema",
    [AG_CAT_NOT_FOUND] = "Verify the resource exists or list available "
                         "options",
    [AG_CAT_MISSING_MODULE] = "Install the missing module or package, or use "
                              "one that is already available",
    [AG_CAT_RESOURCE] = "Use less memory, disk or context: process the data "
                        "in smaller pieces or ask for shorter output",
    [AG_CAT_FILE_IO] = "Check the path, the file type and its current state "
                       "(re-read it if it changed), then retry the operation",
    [AG_CAT_FONT] = "Use a font that is installed (for example DejaVu Sans) "
                    "or avoid characters the font lacks",
    [AG_CAT_PLOTTING] = "Check the plot data and arguments, and save figures "
                        "to a file with a non-interactive backend such as Agg",
    [AG_CAT_CRASH] = "The tool crashed (killed by a signal): check its input "
                     "or report a bug in the tool; do not retry the same "
                     "call unchanged",
};

static bool cat_valid(ag_category cat) {
  return (int)cat >= 0 && cat < AG_CAT__COUNT;
}

AG_EXTERN const char *ag_category_name(ag_category cat) {
  return cat_valid(cat) ? cat_names[cat] : cat_names[AG_CAT_UNKNOWN];
}

AG_EXTERN ag_category ag_category_from_name(const char *name) {
  if (name == NULL)
    return AG_CAT__COUNT;
  for (int i = 0; i < AG_CAT__COUNT; i++)
    if (strcmp(name, cat_names[i]) == 0)
      return (ag_category)i;
  return AG_CAT__COUNT;
}

AG_EXTERN bool ag_category_transient(ag_category cat) {
  return cat_valid(cat) && cat_transient[cat];
}

AG_EXTERN const char *ag_category_suggestion(ag_category cat) {
  return cat_suggestions[cat_valid(cat) ? cat : AG_CAT_UNKNOWN];
}

/* ------------------------------------------------------------------------ */
/* The pattern table                                                        */
/* ------------------------------------------------------------------------ */

enum { M_WORD = 1, M_BOL = 2, M_HTTP = 4 };

typedef struct rule {
  ag_category cat;
  unsigned flags;
  const char *pat; /* lower-case ASCII; must not start with '*' */
} rule;

/* Row constructors: P a substring, W a whole word, L at the start of a line
 * (after blanks), HTTP an HTTP status code; TIER_END closes a tier. */
/* clang-format off */
#define P(c, s) {AG_CAT_##c, 0, s}
#define W(c, s) {AG_CAT_##c, M_WORD, s}
#define L(c, s) {AG_CAT_##c, M_BOL, s}
#define HTTP(c, s) {AG_CAT_##c, M_HTTP, s}
#define TIER_END {AG_CAT_UNKNOWN, 0, NULL}
/* clang-format on */

/*
 * To extend: put a distinctive phrase in tier 1, an exception, errno or
 * status name in tier 2, a single common word in tier 3. Within a tier, a row
 * that must beat another (e.g. "disk quota exceeded" before "quota exceeded")
 * goes first. Patterns are lower case; `*` is a gap within one line.
 */
static const rule rules[] = {
    /* ---- tier 1: distinctive phrases --------------------------------- */

    /* Phrases that contain another category's words. */
    P(VALIDATION, "to replace not found"), /* Claude Code Edit */
    /* the text editor tool's str_replace (Anthropic's, OpenHands',
     * SWE-agent's): old_str absent or not unique - a misused call */
    P(VALIDATION, "no replacement was performed"),
    P(AUTH, "permission denied (publickey"),
    P(BUSY, "resource temporarily unavailable"),
    P(RESOURCE, "disk quota exceeded"),
    P(NETWORK, "connection timed out"),
    P(NETWORK, "connect etimedout"),
    P(NETWORK, "gateway timeout"),
    P(NETWORK, "gateway time-out"),
    P(TIMEOUT, "timed out and has been killed"),
    P(FILE_IO, "file '*' already exists"),
    P(FILE_IO, "file \"*\" already exists"),
    /* A process killed by a signal (the subprocess runner's "killed by
     * signal N (Description)", a shell's report, a runtime's abort). SIGKILL
     * nobody asked for is most often the OOM killer, and SIGXCPU / SIGXFSZ
     * are limits: those stay resource. */
    P(RESOURCE, "killed by signal 9 ("),
    P(RESOURCE, "killed by signal 24 ("),
    P(RESOURCE, "killed by signal 25 ("),
    P(CRASH, "killed by signal"),
    P(CRASH, "segmentation fault"),
    P(CRASH, "core dumped"),
    P(CRASH, "stack smashing detected"),
    P(CRASH, "double free or corruption"),
    P(CRASH, "free(): invalid"),
    P(CRASH, "fatal python error"),
    P(CRASH, "illegal instruction"),
    P(CRASH, "floating point exception"),
    P(CRASH, "addresssanitizer"),

    /* font */
    P(FONT, "findfont"),
    P(FONT, "font family*not found"),
    P(FONT, "font not found"),
    P(FONT, "cannot find font"),
    P(FONT, "could not find font"),
    P(FONT, "unable to find font"),
    P(FONT, "missing font"),
    P(FONT, "font*not available"),
    P(FONT, "missing from current font"),
    P(FONT, "missing glyph"),
    P(FONT, "glyph*missing"),
    P(FONT, "fontnotfound"),
    P(FONT, "unknown font"),
    P(FONT, "no such font"),
    P(FONT, "fontconfig error"),

    /* missing_module */
    P(MISSING_MODULE, "modulenotfounderror"),
    P(MISSING_MODULE, "no module named"),
    P(MISSING_MODULE, "module_not_found"),
    P(MISSING_MODULE, "cannot find module"),
    P(MISSING_MODULE, "importerror"),
    P(MISSING_MODULE, "cannot import name"),
    P(MISSING_MODULE, "error while loading shared libraries"),
    P(MISSING_MODULE, "cannot open shared object file"),
    P(MISSING_MODULE, "error: package * does not exist"),
    P(MISSING_MODULE, "could not find a version that satisfies"),
    P(MISSING_MODULE, "no matching distribution found"),
    P(MISSING_MODULE, "unable to locate package"),
    P(MISSING_MODULE, "there is no package called"),
    P(MISSING_MODULE, "can't locate * in @inc"),
    P(MISSING_MODULE, "cannot find package"),
    P(MISSING_MODULE, "no required module provides package"),
    P(MISSING_MODULE, "not installed"),

    /* resource */
    P(RESOURCE, "no space left on device"),
    P(RESOURCE, "disk full"),
    P(RESOURCE, "disk is full"),
    P(RESOURCE, "out of memory"),
    P(RESOURCE, "cannot allocate memory"),
    P(RESOURCE, "insufficient memory"),
    P(RESOURCE, "not enough memory"),
    P(RESOURCE, "not enough space"),
    P(RESOURCE, "not enough disk"),
    P(RESOURCE, "insufficient storage"),
    P(RESOURCE, "allocation failed"),
    P(RESOURCE, "too many open files"),
    P(RESOURCE, "maximum context length"),
    P(RESOURCE, "context length*exceed"),
    P(RESOURCE, "exceed*context length"),
    P(RESOURCE, "context window*exceed"),
    P(RESOURCE, "exceed*context window"),
    P(RESOURCE, "prompt is too long"),
    P(RESOURCE, "maximum recursion depth"),
    P(RESOURCE, "maximum call stack size"),
    P(RESOURCE, "stack overflow"),
    P(RESOURCE, "output of your last command was too long"),
    P(RESOURCE, "exceeds maximum allowed"),
    P(RESOURCE, "argument list too long"),
    P(RESOURCE, "payload too large"),
    P(RESOURCE, "entity too large"),
    P(RESOURCE, "file too large"),
    P(RESOURCE, "memory limit"),

    /* rate_limit */
    P(RATE_LIMIT, "rate limit"),
    P(RATE_LIMIT, "rate-limit"),
    P(RATE_LIMIT, "ratelimit"),
    P(RATE_LIMIT, "rate_limit"),
    P(RATE_LIMIT, "too many requests"),
    P(RATE_LIMIT, "resource_exhausted"),
    P(RATE_LIMIT, "resource exhausted"),
    P(RATE_LIMIT, "exceeded your current quota"),
    P(RATE_LIMIT, "insufficient_quota"),
    P(RATE_LIMIT, "quota exceeded"),
    P(RATE_LIMIT, "quota_exceeded"),
    P(RATE_LIMIT, "tokens per min"),
    P(RATE_LIMIT, "requests per min"),
    P(RATE_LIMIT, "throttled"),
    P(RATE_LIMIT, "throttling"),
    P(RATE_LIMIT, "overloaded_error"),
    P(RATE_LIMIT, "overloadederror"),
    P(RATE_LIMIT, "is overloaded"),
    P(RATE_LIMIT, "are overloaded"),
    P(RATE_LIMIT, "retry-after"),

    /* busy */
    P(BUSY, "database is locked"),
    P(BUSY, "table is locked"),
    P(BUSY, "text file busy"),
    P(BUSY, "device or resource busy"),
    P(BUSY, "resource busy"),
    P(BUSY, "file is locked"),
    P(BUSY, "locked by another"),
    P(BUSY, "used by another process"),
    P(BUSY, "could not get lock"),
    P(BUSY, "unable to acquire lock"),
    P(BUSY, "could not acquire lock"),
    P(BUSY, "another git process"),
    P(BUSY, "index.lock"),
    P(BUSY, "waiting for cache lock"),
    P(BUSY, "address already in use"),

    /* auth */
    P(AUTH, "unauthorized"),
    P(AUTH, "unauthorised"),
    P(AUTH, "unauthenticated"),
    P(AUTH, "authenticationerror"),
    P(AUTH, "authentication failed"),
    P(AUTH, "authentication error"),
    P(AUTH, "authentication required"),
    P(AUTH, "authentication credentials"),
    P(AUTH, "failed to authenticate"),
    P(AUTH, "not authenticated"),
    P(AUTH, "invalid api key"),
    P(AUTH, "incorrect api key"),
    P(AUTH, "invalid_api_key"),
    P(AUTH, "api key not valid"),
    P(AUTH, "invalid x-api-key"),
    P(AUTH, "missing api key"),
    P(AUTH, "no api key"),
    P(AUTH, "invalid token"),
    P(AUTH, "invalid_token"),
    P(AUTH, "token expired"),
    P(AUTH, "token has expired"),
    P(AUTH, "expired token"),
    P(AUTH, "invalid credentials"),
    P(AUTH, "bad credentials"),
    P(AUTH, "invalid_grant"),
    P(AUTH, "login required"),
    P(AUTH, "not logged in"),
    P(AUTH, "could not read username"),
    P(AUTH, "could not read password"),

    /* permission */
    P(PERMISSION, "permission denied"),
    P(PERMISSION, "operation not permitted"),
    P(PERMISSION, "access denied"),
    P(PERMISSION, "access is denied"),
    P(PERMISSION, "insufficient permission"),
    P(PERMISSION, "insufficient privilege"),
    P(PERMISSION, "have permission"),
    P(PERMISSION, "have the permissions"),
    P(PERMISSION, "not authorized"),
    P(PERMISSION, "read-only file system"),
    P(PERMISSION, "must be root"),
    P(PERMISSION, "must be run as root"),
    P(PERMISSION, "are you root"),
    P(PERMISSION, "requires root"),
    P(PERMISSION, "tool use was rejected"),
    P(PERMISSION, "doesn't want to proceed"),
    P(PERMISSION, "rejected by the user"),
    P(PERMISSION, "denied by the user"),

    /* network */
    P(NETWORK, "connection refused"),
    P(NETWORK, "connection reset"),
    P(NETWORK, "reset by peer"),
    P(NETWORK, "connection aborted"),
    P(NETWORK, "connection closed"),
    P(NETWORK, "connection error"),
    P(NETWORK, "connection failed"),
    P(NETWORK, "connection broken"),
    P(NETWORK, "failed to connect"),
    P(NETWORK, "could not connect"),
    P(NETWORK, "couldn't connect"),
    P(NETWORK, "unable to connect"),
    P(NETWORK, "cannot connect"),
    P(NETWORK, "failed to establish a new connection"),
    P(NETWORK, "max retries exceeded with url"),
    P(NETWORK, "network is unreachable"),
    P(NETWORK, "network unreachable"),
    P(NETWORK, "no route to host"),
    P(NETWORK, "host is unreachable"),
    P(NETWORK, "name or service not known"),
    P(NETWORK, "failure in name resolution"),
    P(NETWORK, "temporary failure resolving"),
    P(NETWORK, "nodename nor servname"),
    P(NETWORK, "could not resolve"),
    P(NETWORK, "failed to resolve"),
    P(NETWORK, "name resolution"),
    P(NETWORK, "unknown host"),
    P(NETWORK, "upstream connect error"),
    P(NETWORK, "reset before headers"),
    P(NETWORK, "bad gateway"),
    P(NETWORK, "service unavailable"),
    P(NETWORK, "service temporarily unavailable"),
    P(NETWORK, "socket hang up"),
    P(NETWORK, "remote end closed connection"),
    P(NETWORK, "server disconnected"),
    P(NETWORK, "fetch failed"),
    P(NETWORK, "failed to fetch"),
    P(NETWORK, "network error"),
    P(NETWORK, "network is down"),
    P(NETWORK, "certificate verify failed"),
    P(NETWORK, "ssl certificate problem"),
    P(NETWORK, "tls handshake"),
    P(NETWORK, "proxy error"),

    /* timeout */
    P(TIMEOUT, "timed out"),
    P(TIMEOUT, "deadline exceeded"),
    P(TIMEOUT, "took too long"),
    P(TIMEOUT, "time limit exceeded"),
    P(TIMEOUT, "timeout expired"),

    /* validation */
    P(VALIDATION, "no such option"),
    P(VALIDATION, "unrecognized option"),
    P(VALIDATION, "unrecognized argument"),
    P(VALIDATION, "unrecognised"),
    P(VALIDATION, "invalid option"),
    P(VALIDATION, "illegal option"),
    P(VALIDATION, "unknown option"),
    P(VALIDATION, "unknown argument"),
    P(VALIDATION, "unexpected argument"),
    P(VALIDATION, "unexpected keyword argument"),
    P(VALIDATION, "required positional argument"),
    P(VALIDATION, "missing required"),
    P(VALIDATION, "required argument"),
    P(VALIDATION, "required property"),
    P(VALIDATION, "required field"),
    P(VALIDATION, "is a required"),
    P(VALIDATION, "is required"),
    P(VALIDATION, "invalid syntax"),
    P(VALIDATION, "syntax error"),
    P(VALIDATION, "parse error"),
    P(VALIDATION, "unexpected token"),
    P(VALIDATION, "unexpected eof"),
    P(VALIDATION, "unexpected end of"),
    P(VALIDATION, "unterminated"),
    P(VALIDATION, "expecting value"),
    P(VALIDATION, "expecting property name"),
    P(VALIDATION, "invalid json"),
    P(VALIDATION, "validation error"),
    P(VALIDATION, "validation failed"),
    P(VALIDATION, "failed validation"),
    P(VALIDATION, "invalid argument"),
    P(VALIDATION, "invalid parameter"),
    P(VALIDATION, "invalid value"),
    P(VALIDATION, "invalid input"),
    P(VALIDATION, "invalid request"),
    P(VALIDATION, "invalid type"),
    P(VALIDATION, "invalid choice"),
    P(VALIDATION, "bad request"),
    P(VALIDATION, "unprocessable"),
    P(VALIDATION, "hunk #"),
    P(VALIDATION, "patch failed"),
    P(VALIDATION, "patch does not apply"),
    P(VALIDATION, "constraint failed"),
    P(VALIDATION, "cannot find symbol"),
    P(VALIDATION, "incompatible types"),
    P(VALIDATION, "exactly one action"),
    P(VALIDATION, "wrong number of arguments"),
    L(VALIDATION, "usage:"),

    /* not_found */
    P(NOT_FOUND, "no such file or directory"),
    P(NOT_FOUND, "command not found"),
    P(NOT_FOUND, "no such table"),
    P(NOT_FOUND, "no such column"),
    P(NOT_FOUND, "no such tool"),
    P(NOT_FOUND, "unknown tool"),
    P(NOT_FOUND, "tool not found"),
    P(NOT_FOUND, "unknown function"),
    P(NOT_FOUND, "not a git repository"),
    P(NOT_FOUND, "did not match any file"),
    P(NOT_FOUND, "unknown revision"),
    P(NOT_FOUND, "can't open file"),
    P(NOT_FOUND, "in your path"),
    P(NOT_FOUND, "no matches found"),
    P(NOT_FOUND, "is not a git command"),
    P(NOT_FOUND, "unknown command"),
    P(NOT_FOUND, "no such command"),

    /* file_io */
    P(FILE_IO, "is a directory"),
    P(FILE_IO, "not a directory"),
    P(FILE_IO, "directory not empty"),
    P(FILE_IO, ": file exists"),
    P(FILE_IO, "file already exists"),
    P(FILE_IO, "input/output error"),
    P(FILE_IO, "i/o error"),
    P(FILE_IO, "broken pipe"),
    P(FILE_IO, "bad file descriptor"),
    P(FILE_IO, "codec can't decode"),
    P(FILE_IO, "codec can't encode"),
    P(FILE_IO, "modified since read"),
    P(FILE_IO, "has not been read yet"),
    P(FILE_IO, "illegal operation on a directory"),

    /* plotting */
    P(PLOTTING, "no display name and no $display"),
    P(PLOTTING, "cannot connect to x server"),
    P(PLOTTING, "could not connect to display"),
    P(PLOTTING, "qt platform plugin"),
    P(PLOTTING, "non-gui backend"),
    P(PLOTTING, "cannot show the figure"),
    P(PLOTTING, "figures have been opened"),
    P(PLOTTING, "x and y must have same first dimension"),
    P(PLOTTING, "x and y must be the same size"),
    P(PLOTTING, "image size of * is too large"),
    P(PLOTTING, "invalid rgba argument"),
    P(PLOTTING, "is not a valid color"),
    P(PLOTTING, "unknown projection"),
    P(PLOTTING, "kaleido"),

    TIER_END,

    /* ---- tier 2: exception, errno and status names ------------------- */

    P(MISSING_MODULE, "classnotfoundexception"),
    P(MISSING_MODULE, "noclassdeffounderror"),
    P(RESOURCE, "memoryerror"),
    P(RESOURCE, "outofmemory"),
    P(RESOURCE, "recursionerror"),
    P(RESOURCE, "stackoverflowerror"),
    W(RESOURCE, "enospc"),
    W(RESOURCE, "enomem"),
    W(RESOURCE, "emfile"),
    W(RESOURCE, "edquot"),
    P(RESOURCE, "context_length_exceeded"),
    W(RESOURCE, "oomkilled"),
    W(RESOURCE, "oom"),
    W(RESOURCE, "bad_alloc"),
    W(CRASH, "sigsegv"),
    W(CRASH, "sigabrt"),
    W(CRASH, "sigbus"),
    W(CRASH, "sigill"),
    W(CRASH, "sigfpe"),
    W(CRASH, "segfault"),
    W(BUSY, "eagain"),
    W(BUSY, "ewouldblock"),
    W(BUSY, "ebusy"),
    W(BUSY, "etxtbsy"),
    W(BUSY, "eaddrinuse"),
    W(PERMISSION, "eacces"),
    W(PERMISSION, "eperm"),
    W(PERMISSION, "erofs"),
    P(PERMISSION, "permissionerror"),
    P(PERMISSION, "accessdenied"),
    P(PERMISSION, "forbidden"),
    W(NETWORK, "econnrefused"),
    W(NETWORK, "econnreset"),
    W(NETWORK, "econnaborted"),
    W(NETWORK, "enetunreach"),
    W(NETWORK, "ehostunreach"),
    W(NETWORK, "enotfound"),
    W(NETWORK, "eai_again"),
    P(NETWORK, "nameresolutionerror"),
    P(NETWORK, "newconnectionerror"),
    P(NETWORK, "connectionerror"),
    P(NETWORK, "connecterror"),
    P(NETWORK, "remotedisconnected"),
    P(NETWORK, "unknownhostexception"),
    P(NETWORK, "getaddrinfo"),
    P(NETWORK, "sslerror"),
    P(NETWORK, "serviceunavailable"),
    W(TIMEOUT, "etimedout"),
    W(TIMEOUT, "esockettimedout"),
    P(TIMEOUT, "timeouterror"),
    P(TIMEOUT, "timeoutexception"),
    P(TIMEOUT, "deadline_exceeded"),
    P(NOT_FOUND, "filenotfounderror"),
    P(NOT_FOUND, "filenotfoundexception"),
    P(NOT_FOUND, "nosuchfile"),
    P(NOT_FOUND, "nosuchkey"),
    W(NOT_FOUND, "enoent"),
    P(FILE_IO, "isadirectoryerror"),
    P(FILE_IO, "notadirectoryerror"),
    P(FILE_IO, "fileexistserror"),
    P(FILE_IO, "unicodedecodeerror"),
    P(FILE_IO, "unicodeencodeerror"),
    W(FILE_IO, "eisdir"),
    W(FILE_IO, "enotdir"),
    W(FILE_IO, "eexist"),
    W(FILE_IO, "enotempty"),
    W(FILE_IO, "eio"),
    W(FILE_IO, "ebadf"),
    P(FILE_IO, "brokenpipeerror"),
    P(FILE_IO, "ioerror"),
    P(FILE_IO, "ioexception"),
    P(FILE_IO, "oserror"),
    P(VALIDATION, "syntaxerror"),
    P(VALIDATION, "indentationerror"),
    P(VALIDATION, "taberror"),
    P(VALIDATION, "jsondecodeerror"),
    P(VALIDATION, "parseerror"),
    P(VALIDATION, "validationerror"),
    P(VALIDATION, "typeerror"),
    P(VALIDATION, "valueerror"),
    P(VALIDATION, "attributeerror"),
    P(VALIDATION, "nameerror"),
    P(VALIDATION, "referenceerror"),
    P(VALIDATION, "keyerror"),
    P(VALIDATION, "indexerror"),
    P(VALIDATION, "lookuperror"),
    P(VALIDATION, "zerodivisionerror"),
    P(VALIDATION, "integrityerror"),
    P(VALIDATION, "illegalargumentexception"),
    P(VALIDATION, "numberformatexception"),
    W(VALIDATION, "einval"),
    P(PLOTTING, "tclerror"),
    HTTP(RATE_LIMIT, "429"),
    HTTP(RATE_LIMIT, "529"),
    HTTP(AUTH, "401"),
    HTTP(AUTH, "407"),
    HTTP(PERMISSION, "403"),
    HTTP(NETWORK, "502"),
    HTTP(NETWORK, "503"),
    HTTP(NETWORK, "504"),
    HTTP(TIMEOUT, "408"),
    HTTP(RESOURCE, "413"),
    HTTP(RESOURCE, "507"),
    HTTP(BUSY, "423"),
    HTTP(NOT_FOUND, "404"),
    HTTP(NOT_FOUND, "410"),
    HTTP(VALIDATION, "400"),
    HTTP(VALIDATION, "405"),
    HTTP(VALIDATION, "415"),
    HTTP(VALIDATION, "422"),

    TIER_END,

    /* ---- tier 3: common words ---------------------------------------- */

    P(RATE_LIMIT, "quota"),
    W(BUSY, "locked"),
    W(BUSY, "busy"),
    P(AUTH, "credentials"),
    P(AUTH, "api key"),
    P(AUTH, "api_key"),
    W(PERMISSION, "denied"),
    P(NETWORK, "unreachable"),
    W(NETWORK, "dns"),
    P(TIMEOUT, "timeout"),
    P(TIMEOUT, "timed-out"),
    P(RESOURCE, "too large"),
    P(RESOURCE, "too big"),
    P(RESOURCE, "exceeds the maximum"),
    P(RESOURCE, "exceeds maximum"),
    L(RESOURCE, "killed"),
    P(NOT_FOUND, "not found"),
    P(NOT_FOUND, "notfound"),
    P(NOT_FOUND, "no such"),
    P(NOT_FOUND, "does not exist"),
    P(NOT_FOUND, "doesn't exist"),
    P(NOT_FOUND, "cannot find"),
    P(NOT_FOUND, "could not find"),
    P(NOT_FOUND, "couldn't find"),
    P(NOT_FOUND, "can't find"),
    P(NOT_FOUND, "unable to find"),
    P(NOT_FOUND, "cannot access"),
    P(NOT_FOUND, "cannot stat"),
    P(NOT_FOUND, "cannot open"),
    P(NOT_FOUND, "can't open"),
    P(FILE_IO, "could not read"),
    P(FILE_IO, "could not write"),
    P(FILE_IO, "cannot write"),
    P(FILE_IO, "failed to read"),
    P(FILE_IO, "failed to write"),
    P(FILE_IO, "read error"),
    P(FILE_IO, "write error"),
    P(FILE_IO, "error reading"),
    P(FILE_IO, "error writing"),
    P(FILE_IO, "cannot create"),
    P(FILE_IO, "can't create"),
    P(VALIDATION, "already exists"),
    P(VALIDATION, "is not defined"),
    P(VALIDATION, "does not match"),
    P(VALIDATION, "doesn't match"),
    P(VALIDATION, "expected * got"),
    P(VALIDATION, "expected * but"),
    P(VALIDATION, "invalid"),
    P(VALIDATION, "malformed"),
    P(VALIDATION, "illegal"),
    P(VALIDATION, "unsupported"),
    P(VALIDATION, "not supported"),
    P(VALIDATION, "not enough"),
    P(VALIDATION, "not available"),
    P(VALIDATION, "cannot be used"),
    P(VALIDATION, "must be"),
    P(VALIDATION, "schema"),
    TIER_END,
};

#undef P
#undef W
#undef L
#undef HTTP
#undef TIER_END

#define NRULES (sizeof(rules) / sizeof(rules[0]))
#define NO_RULE 0xFFFFu

/* Texts longer than WHOLE_MAX are read through HEAD_MAX and TAIL_MAX. */
#define WHOLE_MAX ((size_t)64 * 1024)
#define HEAD_MAX ((size_t)16 * 1024)
#define TAIL_MAX ((size_t)48 * 1024)

/* ------------------------------------------------------------------------ */
/* Matching                                                                 */
/* ------------------------------------------------------------------------ */

static unsigned char fold(unsigned char c) {
  return (c >= 'A' && c <= 'Z') ? (unsigned char)(c + ('a' - 'A')) : c;
}

static bool is_alpha(unsigned char c) {
  c = fold(c);
  return c >= 'a' && c <= 'z';
}

static bool is_digit(unsigned char c) {
  return c >= '0' && c <= '9';
}

static bool is_word(unsigned char c) {
  return is_alpha(c) || is_digit(c) || c == '_';
}

static bool is_blank(unsigned char c) {
  return c == ' ' || c == '\t';
}

static bool is_ws(unsigned char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' ||
         c == '\v';
}

/* One line of the text, or the part of a line inside a window: bytes
 * [lo, hi) of s, with no '\n' inside. Matches never leave it. */
typedef struct region {
  const unsigned char *s;
  size_t lo, hi;
} region;

/* Does the folded literal p[0..n) occur at s[i..]? */
static bool lit_at(const region *r, size_t i, const unsigned char *p,
                   size_t n) {
  if (r->hi - i < n)
    return false;
  for (size_t k = 0; k < n; k++)
    if (fold(r->s[i + k]) != fold(p[k]))
      return false;
  return true;
}

static bool token_is(const unsigned char *s, size_t a, size_t b,
                     const char *w) {
  size_t n = strlen(w);
  if (b - a != n)
    return false;
  for (size_t k = 0; k < n; k++)
    if (fold(s[a + k]) != (unsigned char)w[k])
      return false;
  return true;
}

/*
 * A number is taken as an HTTP status when it stands alone (not part of a
 * longer number, identifier, path or version) and the same line shows, in
 * the 40 bytes before it, a word that announces a status ("http", "status",
 * "code", "error", "api", "response", "returned", "responded", "server",
 * "request"), unless the word right before it says it is something else
 * ("line 404", "port 503"). So "Error code: 429", "HTTP/1.1 503",
 * "GitHub API 403" count; 'File "x.py", line 404' and "id 4040" do not.
 */
static bool http_context(const region *r, size_t pos, size_t end) {
  const unsigned char *s = r->s;
  if (pos > r->lo) {
    unsigned char b = s[pos - 1];
    if (!(is_ws(b) || b == '(' || b == '[' || b == '{' || b == '"' ||
          b == '\'' || b == ':' || b == '=' || b == '`'))
      return false;
  }
  if (end < r->hi) {
    unsigned char a = s[end];
    if (is_word(a) || a == '/')
      return false;
    if ((a == '.' || a == ',') && end + 1 < r->hi && is_digit(s[end + 1]))
      return false;
  }
  size_t ls = r->lo; /* the region is one line */
  size_t w0 = pos - ls > 40 ? pos - 40 : ls;
  /* The word right before the number. With no letter in [w0, pos) there is
   * no announcing word either: no need to look further back. */
  size_t b = pos;
  while (b > w0 && !is_alpha(s[b - 1]))
    b--;
  if (b == w0)
    return false;
  size_t a = b;
  while (a > ls && is_alpha(s[a - 1]))
    a--;
  static const char *const not_status[] = {
      "line",   "lines", "port", "pid", "row", "col", "column",
      "offset", "page",  "char", "at",  "id",  "in",  "of"};
  for (size_t k = 0; k < sizeof(not_status) / sizeof(not_status[0]); k++)
    if (token_is(s, a, b, not_status[k]))
      return false;
  static const char *const announce[] = {
      "http",     "status",   "code",      "error",  "api",
      "response", "returned", "responded", "server", "request"};
  for (size_t k = 0; k < sizeof(announce) / sizeof(announce[0]); k++) {
    const unsigned char *p = (const unsigned char *)announce[k];
    size_t n = strlen(announce[k]);
    for (size_t i = w0; i + n <= pos; i++)
      if (lit_at(r, i, p, n))
        return true;
  }
  return false;
}

/* Length of the literal piece at p: the bytes before the next '*' or the
 * end of the pattern. */
static size_t piece_len(const unsigned char *p) {
  size_t n = 0;
  while (p[n] != '\0' && p[n] != '*')
    n++;
  return n;
}

/* What rule_at() found. NOT_ON_LINE: the leading piece matched but a piece
 * after a `*` is missing from the rest of the line; it is then missing after
 * any later start too (a match from a later start would give one from this
 * start: each piece could be found at the same place or earlier), so scan()
 * stops trying the row on this line. */
typedef enum { NO_MATCH, MATCH, NOT_ON_LINE } match;

/* Does rule `ru` match at s[pos..]? The leading piece is compared as it is
 * read, so a candidate that differs early costs a comparison or two; the
 * pieces after a `*`, reached only when the leading one matched, are
 * measured first. */
static match rule_at(const region *r, const rule *ru, size_t pos) {
  const unsigned char *p = (const unsigned char *)ru->pat;
  size_t i = pos;
  for (; *p != '\0' && *p != '*'; p++, i++)
    if (i == r->hi || fold(r->s[i]) != fold(*p))
      return NO_MATCH;
  while (*p == '*') {
    p++;
    size_t n = piece_len(p);
    if (n == 0)
      continue;
    /* Leftmost occurrence of the next piece (the region is one line). */
    size_t j = i;
    for (;; j++) {
      if (r->hi - j < n)
        return NOT_ON_LINE;
      if (lit_at(r, j, p, n))
        break;
    }
    i = j + n;
    p += n;
  }
  if (ru->flags & M_WORD) {
    if (pos > r->lo && is_word(r->s[pos - 1]))
      return NO_MATCH;
    if (i < r->hi && is_word(r->s[i]))
      return NO_MATCH;
  }
  if (ru->flags & M_BOL) {
    for (size_t k = pos; k > r->lo; k--)
      if (!is_blank(r->s[k - 1]))
        return NO_MATCH;
  }
  if ((ru->flags & M_HTTP) && !http_context(r, pos, i))
    return NO_MATCH;
  return MATCH;
}

/*
 * The index: rows bucketed by a hash of the first key_len bytes of their
 * pattern (folded), each bucket in table order. A position of the text is
 * tried only against the rows of its own bucket. key_len is the shortest
 * leading piece of any pattern, at most KEY_MAX: 3 with today's table, where
 * a position of a real error text meets about a quarter of a row on average
 * (17 rows with buckets by first byte alone). A pattern with a shorter leading
 * piece stays correct but makes every bucket less selective.
 *
 * Built at compile time: the build compiles this file once more with
 * AG_CLASSIFY_GEN_INDEX into a small program (ag_classify_index_gen) that
 * runs index_build() and prints the result as a C initializer,
 * classify_index.inc, which the library's copy includes as a constant. So
 * the library holds no mutable global and needs no pthread_once; the index
 * is exactly what index_build() computes from `rules`, rebuilt whenever this
 * file changes.
 */
#define KEY_MAX 3
#define HASH_BITS 12

typedef struct rule_index {
  size_t tier1_end; /* the TIER_END rows closing tiers 1 and 2 */
  size_t tier2_end;
  size_t key_len;    /* bytes in a key, 1..KEY_MAX */
  uint32_t key_mask; /* the low key_len bytes */
  uint16_t head[1u << HASH_BITS];
  uint16_t next[NRULES];
  /* One bit for each of the first 64 rows with a `*`, 0 for other rows:
   * the bit scan() sets when the row cannot match on the current line. */
  uint64_t gap_bit[NRULES];
} rule_index;

_Static_assert(NRULES < NO_RULE, "row numbers must fit below NO_RULE");

#ifdef AG_CLASSIFY_GEN_INDEX
static rule_index the_index;
#else
static const rule_index the_index =
#include "classify_index.inc"
    ;
#endif

/* Fibonacci hashing of a key of up to KEY_MAX folded bytes. */
static size_t key_hash(uint32_t key) {
  return (size_t)((key * 2654435761u) >> (32 - HASH_BITS));
}

#ifdef AG_CLASSIFY_GEN_INDEX
/* The index of the TIER_END row that closes row k's tier. */
static size_t tier_end(size_t k) {
  while (k < NRULES && rules[k].pat != NULL)
    k++;
  return k;
}

static void index_build(void) {
  rule_index *ix = &the_index;
  ix->tier1_end = tier_end(0);
  ix->tier2_end = tier_end(ix->tier1_end + 1);
  size_t kl = KEY_MAX, gaps = 0;
  for (size_t i = 0; i < NRULES; i++) {
    const char *pat = rules[i].pat;
    ix->gap_bit[i] = 0;
    if (pat == NULL)
      continue;
    size_t n = piece_len((const unsigned char *)pat);
    if (n < kl)
      kl = n > 0 ? n : 1; /* patterns never start with '*' */
    if (strchr(pat, '*') != NULL && gaps < 64)
      ix->gap_bit[i] = (uint64_t)1 << gaps++;
  }
  ix->key_len = kl;
  ix->key_mask = (uint32_t)(((uint64_t)1 << (8 * kl)) - 1);
  for (size_t h = 0; h < (1u << HASH_BITS); h++)
    ix->head[h] = NO_RULE;
  for (size_t i = NRULES; i-- > 0;) {
    if (rules[i].pat == NULL)
      continue;
    uint32_t key = 0;
    for (size_t k = 0; k < kl; k++)
      key = key << 8 | fold((unsigned char)rules[i].pat[k]);
    size_t h = key_hash(key);
    ix->next[i] = ix->head[h];
    ix->head[h] = (uint16_t)i;
  }
}
#endif

static const rule_index *index_get(void) {
  return &the_index;
}

/* The first row (index < limit) that matches anywhere in the line r, or
 * limit. The key of each position is rolled from the previous one. */
static size_t scan(const rule_index *ix, const region *r, size_t limit) {
  const unsigned char *s = r->s;
  size_t kl = ix->key_len, best = limit;
  uint64_t given_up = 0; /* gap_bit of the rows NOT_ON_LINE */
  if (r->hi - r->lo < kl)
    return best;
  uint32_t key = 0;
  for (size_t i = r->lo; i + 1 < r->lo + kl; i++)
    key = key << 8 | fold(s[i]);
  for (size_t pos = r->lo; pos + kl <= r->hi && best > 0; pos++) {
    key = (key << 8 | fold(s[pos + kl - 1])) & ix->key_mask;
    /* NO_RULE ends a bucket: it is above any limit. */
    for (size_t k = ix->head[key_hash(key)]; k < best; k = ix->next[k]) {
      if (given_up & ix->gap_bit[k])
        continue;
      match m = rule_at(r, &rules[k], pos);
      if (m == MATCH) {
        best = k;
        break;
      }
      if (m == NOT_ON_LINE)
        given_up |= ix->gap_bit[k];
    }
  }
  return best;
}

/*
 * Lines of [lo, hi) in order. Each is scanned for the rows of tiers 1 and 2
 * (of tier 1 only once a tier 1 row has matched, on this line or an earlier
 * one); last[t] becomes the first row of the last line so far whose first
 * row is in tier t + 1.
 */
static void scan_lines(const rule_index *ix, const unsigned char *s, size_t lo,
                       size_t hi, size_t last[2]) {
  size_t start = lo;
  while (start < hi) {
    const unsigned char *nl = memchr(s + start, '\n', hi - start);
    size_t end = nl != NULL ? (size_t)(nl - s) : hi;
    size_t limit = last[0] < NRULES ? ix->tier1_end : ix->tier2_end;
    region r = {s, start, end};
    size_t k = scan(ix, &r, limit);
    if (k < limit)
      last[k < ix->tier1_end ? 0 : 1] = k;
    start = end + 1;
  }
}

/* Non-blank lines at the end of a text where tier 3 words count. */
#define TAIL_LINES 1

/* The last TAIL_LINES non-blank lines of [lo, hi), from the last one up:
 * the first row matching in the last of them that has a match, or NRULES. */
static size_t scan_tail_lines(const rule_index *ix, const unsigned char *s,
                              size_t lo, size_t hi) {
  size_t end = hi, seen = 0;
  while (end > lo && seen < TAIL_LINES) {
    size_t start = end;
    bool blank = true;
    while (start > lo && s[start - 1] != '\n') {
      start--;
      if (!is_ws(s[start]))
        blank = false;
    }
    if (!blank) {
      region r = {s, start, end};
      size_t k = scan(ix, &r, NRULES);
      if (k < NRULES)
        return k;
      seen++;
    }
    end = start > lo ? start - 1 : lo;
  }
  return NRULES;
}

/*
 * Tiers 1 and 2 are looked for anywhere: the most specific tier that matches
 * decides, then the last line with a match in that tier, then the first row
 * in that line. One pass over the lines finds all three. Tier 3 words count
 * only in the last TAIL_LINES non-blank lines, where they describe the
 * failure rather than data printed on the way. A long text is read as its
 * head window, then its tail window, so a line of the tail is "later".
 */
AG_EXTERN ag_category ag_classify(const char *text, size_t len) {
  if (text == NULL || len == 0)
    return AG_CAT_UNKNOWN;
  const unsigned char *s = (const unsigned char *)text;
  const rule_index *ix = index_get();
  size_t last[2] = {NRULES, NRULES};
  size_t lo = 0;
  if (len > WHOLE_MAX) {
    scan_lines(ix, s, 0, HEAD_MAX, last);
    lo = len - TAIL_MAX;
  }
  scan_lines(ix, s, lo, len, last);
  size_t k = last[0] < NRULES   ? last[0]
             : last[1] < NRULES ? last[1]
                                : scan_tail_lines(ix, s, lo, len);
  return k < NRULES ? rules[k].cat : AG_CAT_UNKNOWN;
}

/* ------------------------------------------------------------------------ */
/* UTF-8 boundaries                                                         */
/* ------------------------------------------------------------------------ */

/*
 * w[0..wn) is a window of the text and k a cut inside it. Returns how many
 * bytes (0..3) the cut must move back so as not to split a valid sequence.
 * A byte that is not part of a valid sequence is a character of its own.
 */
static size_t cut_back(const unsigned char *w, size_t wn, size_t k) {
  for (size_t back = 1; back <= 3 && back <= k; back++) {
    size_t p = k - back;
    if ((w[p] & 0xC0) != 0x80)
      return ag__utf8_seq(w + p, wn - p) > back ? back : 0;
  }
  return 0;
}

AG_EXTERN size_t ag_utf8_truncate(const char *text, size_t len,
                                  size_t max_bytes) {
  if (text == NULL || max_bytes >= len)
    return text == NULL ? 0 : len;
  size_t n = max_bytes;
  size_t start = n >= 3 ? n - 3 : 0;
  size_t stop = len - n > 3 ? n + 3 : len;
  return n -
         cut_back((const unsigned char *)text + start, stop - start, n - start);
}

/* ------------------------------------------------------------------------ */
/* Whitespace collapsing and the compact record                             */
/* ------------------------------------------------------------------------ */

/* Reads a text as its collapsed form: runs of whitespace become one space,
 * none at either end. */
typedef struct ws_iter {
  const unsigned char *s;
  size_t len, pos;
  bool space; /* a space is due before the next byte */
} ws_iter;

static void wi_init(ws_iter *it, const char *s, size_t len) {
  it->s = (const unsigned char *)s;
  it->len = s == NULL ? 0 : len;
  it->pos = 0;
  it->space = false;
  while (it->pos < it->len && is_ws(it->s[it->pos]))
    it->pos++;
}

static int wi_next(ws_iter *it) {
  if (it->space) {
    it->space = false;
    return ' ';
  }
  if (it->pos >= it->len)
    return -1;
  unsigned char c = it->s[it->pos++];
  size_t p = it->pos;
  while (p < it->len && is_ws(it->s[p]))
    p++;
  it->space = p > it->pos && p < it->len;
  it->pos = p;
  return c;
}

/*
 * How many bytes of the collapsed text to keep so that it fits in `limit`
 * (SIZE_MAX: everything) without splitting a UTF-8 sequence or ending in a
 * space. *cut tells whether anything was dropped. Reads at most limit + 4
 * collapsed bytes when the limit bites; counts the whole text otherwise.
 */
static size_t collapsed_keep(const char *msg, size_t len, size_t limit,
                             bool *cut) {
  ws_iter it;
  wi_init(&it, msg, len);
  unsigned char w[8]; /* collapsed bytes [wstart, wstart + 8) */
  size_t wstart = limit >= 4 ? limit - 4 : 0;
  size_t total = 0;
  int c;
  while ((c = wi_next(&it)) >= 0) {
    if (total >= wstart && total - wstart < sizeof(w))
      w[total - wstart] = (unsigned char)c;
    total++;
    if (limit != SIZE_MAX && total >= wstart + sizeof(w))
      break;
  }
  if (total <= limit) {
    *cut = false;
    return total;
  }
  *cut = true;
  size_t wn = total - wstart;
  size_t m = limit - cut_back(w, wn, limit - wstart);
  if (m > wstart && w[m - 1 - wstart] == ' ')
    m--;
  return m;
}

size_t ag__collapse_ws(char *dst, size_t cap, const char *msg, size_t len,
                       size_t max_chars, bool *cut) {
  bool c = false;
  size_t m = 0;
  if (cap == 0) {
    collapsed_keep(msg, len, 0, &c);
  } else {
    size_t limit = cap - 1;
    if (max_chars > 0 && max_chars < limit)
      limit = max_chars;
    m = collapsed_keep(msg, len, limit, &c);
    ws_iter it;
    wi_init(&it, msg, len);
    for (size_t i = 0; i < m; i++)
      dst[i] = (char)wi_next(&it);
    dst[m] = '\0';
  }
  if (cut != NULL)
    *cut = c;
  return m;
}

/* snprintf-style output: copies what fits (keeping room for the NUL) and
 * counts everything. */
typedef struct out {
  char *buf;
  size_t cap, n;
} out;

static size_t out_room(const out *o) {
  return o->cap > 0 && o->n < o->cap - 1 ? o->cap - 1 - o->n : 0;
}

static void out_put(out *o, const char *s, size_t len) {
  size_t k = out_room(o);
  if (k > len)
    k = len;
  if (k > 0)
    memcpy(o->buf + o->n, s, k);
  o->n += len;
}

static void out_str(out *o, const char *s) {
  out_put(o, s, strlen(s));
}

AG_EXTERN size_t ag_format_compact_error(char *buf, size_t cap,
                                         const char *tool, ag_category cat,
                                         const char *msg, size_t msg_len,
                                         size_t max_chars) {
  out o = {buf, buf == NULL ? 0 : cap, 0};
  bool cut = false;
  size_t m =
      collapsed_keep(msg, msg_len, max_chars > 0 ? max_chars : SIZE_MAX, &cut);
  const char *sugg = ag_category_suggestion(cat);

  out_str(&o, "<error>\ntool: ");
  out_str(&o, tool != NULL ? tool : "");
  out_str(&o, "\ntype: ");
  out_str(&o, ag_category_name(cat));
  out_str(&o, "\nmessage: ");
  ws_iter it;
  wi_init(&it, msg, msg_len);
  size_t k = out_room(&o);
  if (k > m)
    k = m;
  for (size_t i = 0; i < k; i++)
    o.buf[o.n + i] = (char)wi_next(&it);
  o.n += m;
  if (cut)
    out_str(&o, "...");
  if (sugg != NULL && sugg[0] != '\0') {
    out_str(&o, "\nsuggestion: ");
    out_str(&o, sugg);
  }
  out_str(&o, "\n</error>");
  if (o.cap > 0)
    o.buf[o.n < o.cap ? o.n : o.cap - 1] = '\0';
  return o.n;
}

#ifdef AG_CLASSIFY_GEN_INDEX
#include <inttypes.h>
#include <stdio.h>

/* ag_classify_index_gen: prints the_index as a C initializer (stdout). */
int main(void) {
  index_build();
  const rule_index *ix = &the_index;
  printf("/* Generated by ag_classify_index_gen from src/core/classify.c. */\n"
         "{%zu, %zu, %zu, 0x%" PRIx32 "u,\n {",
         ix->tier1_end, ix->tier2_end, ix->key_len, ix->key_mask);
  for (size_t i = 0; i < (1u << HASH_BITS); i++)
    printf("%s%u", i == 0 ? "" : i % 16 == 0 ? ",\n  " : ", ", ix->head[i]);
  printf("},\n {");
  for (size_t i = 0; i < NRULES; i++)
    printf("%s%u", i == 0 ? "" : i % 16 == 0 ? ",\n  " : ", ", ix->next[i]);
  printf("},\n {");
  for (size_t i = 0; i < NRULES; i++)
    printf("%s0x%" PRIx64 "ull",
           i == 0       ? ""
           : i % 8 == 0 ? ",\n  "
                        : ", ",
           ix->gap_bit[i]);
  printf("}}\n");
  return ferror(stdout) ? 1 : 0;
}
#endif
