/*
 * agentguard/common.h - version, export macro, error codes and error details
 * shared by every layer of agentguard.
 *
 * Thread-safety: every function here is safe to call from any thread.
 */
#ifndef AGENTGUARD_COMMON_H
#define AGENTGUARD_COMMON_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(AG_BUILDING_LIBRARY) && defined(__GNUC__)
#define AG_EXTERN __attribute__((visibility("default")))
#else
#define AG_EXTERN
#endif

/*
 * The version, in this one place: CMakeLists.txt reads these three lines for
 * project(VERSION), the shared library's SOVERSION and agentguard.pc, and
 * everything else is derived from them. The macros say which header a
 * program was compiled against; ag_version() and ag_version_number() say
 * which library it runs with.
 */
#define AG_VERSION_MAJOR 0
#define AG_VERSION_MINOR 1
#define AG_VERSION_PATCH 0

#define AG__STR(x) #x
#define AG__XSTR(x) AG__STR(x)
/* "MAJOR.MINOR.PATCH", e.g. "0.1.0". */
#define AG_VERSION_STRING                                                      \
  AG__XSTR(AG_VERSION_MAJOR)                                                   \
  "." AG__XSTR(AG_VERSION_MINOR) "." AG__XSTR(AG_VERSION_PATCH)
/* MAJOR * 1000000 + MINOR * 1000 + PATCH (0.1.0 is 1000, 1.2.3 is 1002003),
 * so versions compare as integers: #if AG_VERSION_NUMBER >= 1000. */
#define AG_VERSION_NUMBER                                                      \
  ((AG_VERSION_MAJOR)*1000000 + (AG_VERSION_MINOR)*1000 + (AG_VERSION_PATCH))

/* The library's version as "MAJOR.MINOR.PATCH"; a static string, never
 * NULL. Safe from any thread. */
AG_EXTERN const char *ag_version(void);

/* The library's version as AG_VERSION_NUMBER computes it, for a run-time
 * check that the library is at least the header's version:
 * ag_version_number() >= AG_VERSION_NUMBER. Safe from any thread. */
AG_EXTERN int ag_version_number(void);

/*
 * Error codes. Produced from one X-macro table: codes are only ever appended,
 * never renumbered or removed. AG_OK is 0; every error is positive.
 */
#define AG_ERRNO_MAP(X)                                                        \
  X(OK, "success")                                                             \
  X(NOMEM, "out of memory")                                                    \
  X(INVAL, "invalid argument")                                                 \
  X(CONFIG, "invalid configuration")                                           \
  X(JSON, "invalid JSON")                                                      \
  X(DUPKEY, "duplicate key in a JSON object")                                  \
  X(TOOBIG, "input exceeds a size limit")                                      \
  X(DEPTH, "JSON nesting too deep")                                            \
  X(UTF8, "invalid UTF-8 or lone surrogate")                                   \
  X(NUMBER, "number out of range")                                             \
  X(CRYPTO, "cryptographic library failure")                                   \
  X(NOSPACE, "output buffer too small")                                        \
  X(STATE, "call made in the wrong state")                                     \
  X(IO, "input/output error")                                                  \
  X(NOTFOUND, "not found")                                                     \
  X(CANCELLED, "cancelled")                                                    \
  X(PROVIDER, "model request failed")

typedef enum {
#define AG__ERR_ENUM(name, msg) AG_E##name,
  AG_ERRNO_MAP(AG__ERR_ENUM)
#undef AG__ERR_ENUM
      AG_E__COUNT
} ag_err_t;

#define AG_OK AG_EOK

/* A short English description of `code`; a static string, never NULL. */
AG_EXTERN const char *ag_strerror(ag_err_t code);
/* The code's name without prefix ("NOMEM"); a static string, never NULL. */
AG_EXTERN const char *ag_err_name(ag_err_t code);

#define AG_ERROR_MSG_MAX 512

/*
 * Optional caller-owned error details, passed last to functions that can fail.
 * Passing NULL is always allowed. On failure the function fills it: `code`
 * equals the return value, `msg` is a NUL-terminated message that names what
 * is wrong and where (a config key path, a byte position, a file name).
 * Fields that do not apply are 0 / -1.
 */
typedef struct ag_error_t {
  ag_err_t code;
  int sys_errno;   /* errno behind the failure, or 0 */
  int http_status; /* HTTP status behind the failure, or 0 */
  long pos;        /* byte offset into the input, or -1 */
  int line;        /* 1-based line for text input, or 0 */
  int column;      /* 1-based column for text input, or 0 */
  char msg[AG_ERROR_MSG_MAX];
} ag_error_t;

/* Resets `err` (may be NULL) to AG_OK with an empty message. */
AG_EXTERN void ag_error_clear(ag_error_t *err);

/*
 * Frees memory that an agentguard function handed to the caller with the
 * words "caller-owns (free with ag_free)". NULL does nothing.
 */
AG_EXTERN void ag_free(void *p);

#ifdef __cplusplus
}
#endif
#endif /* AGENTGUARD_COMMON_H */
