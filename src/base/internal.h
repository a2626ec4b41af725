/*
 * src/base/internal.h - the base layer (DESIGN.md section 1): what every
 * layer needs and nothing decides. ag__ prefix; not installed, not API.
 * Depends on libc and pthreads only (and jansson's types for ag__json_kind).
 *
 * Files and what they own:
 *   common.c  version, error table, ag__set_error, ag__scopy, ag__opts_read
 *   text.c    ag__strndup/ag__strdup, the UTF-8 helpers, ag__json_kind,
 *             ag__http_reason
 *   buf.c     ag__buf, the one capped growable buffer
 *   rand.c    ag__rand_next (xorshift64*), ag__backoff (retry delays)
 *   clock.c   ag_now_ms
 *   cancel.c  ag_cancel_* (tokens, deadlines, eventfds), ag__cancel_forced
 */
#ifndef AG_BASE_INTERNAL_H
#define AG_BASE_INTERNAL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "agentguard/base.h"
#include "agentguard/common.h"

#if defined(__GNUC__)
#define AG__PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define AG__PRINTF(a, b)
#endif

/* ---- common.c ----------------------------------------------------------- */

/*
 * Fills `err` (may be NULL) with `code`, byte position `pos` (-1 for none)
 * and a formatted message; returns `code` so callers can write
 * `return ag__set_error(err, AG_EJSON, pos, "...")`.
 */
ag_err_t ag__set_error(ag_error_t *err, ag_err_t code, long pos,
                       const char *fmt, ...) AG__PRINTF(4, 5);

/* snprintf that never overruns and tolerates cap 0; returns bytes written
 * (excluding NUL), i.e. min(needed, cap-1). */
size_t ag__scopy(char *dst, size_t cap, const char *src);

/*
 * Reads a caller's options struct whose first member is `size_t size`
 * (docs/c-api.md, "Options structs"). `dst` (dst_size bytes) holds the
 * defaults; the first `src->size` bytes of `src` are copied over them, so a
 * caller built against an older, shorter struct gets defaults for the
 * fields it does not know. A size below `min_size` (the struct's first
 * versioned size; 0 means the caller never called the _init function) or
 * above AG__OPTS_SIZE_MAX, or a larger struct with any byte past dst_size
 * set (fields this library does not know), is AG_EINVAL with a message that
 * starts with `what`. On success dst's size member is dst_size.
 */
#define AG__OPTS_SIZE_MAX 65536 /* larger sizes are refused as garbage */
ag_err_t ag__opts_read(void *dst, size_t dst_size, const void *src,
                       size_t min_size, const char *what, ag_error_t *err);

/* ---- text.c ------------------------------------------------------------- */

/* A NUL-terminated copy of s[0..n) (s need not be NUL-terminated; it may
 * contain NULs, which are copied). NULL when out of memory. */
char *ag__strndup(const char *s, size_t n);

/* A copy of the string s; NULL for NULL or when out of memory. */
char *ag__strdup(const char *s);

/* Length (1 to 4) of the valid UTF-8 sequence at s[0..n), or 0 when it is
 * not one (truncated, overlong forms, surrogates, past U+10FFFF: jansson's
 * rules). ASCII is 1. n must be at least 1. */
size_t ag__utf8_seq(const unsigned char *s, size_t n);

/* Length of the UTF-8 sequence a lead byte starts (1 to 4); 0 for a byte
 * that cannot start one. Inline: the content-loop scan calls it per byte. */
static inline size_t ag__utf8_lead_len(unsigned char b) {
  if (b < 0x80)
    return 1;
  if (b >= 0xc2 && b <= 0xdf)
    return 2;
  if (b >= 0xe0 && b <= 0xef)
    return 3;
  if (b >= 0xf0 && b <= 0xf4)
    return 4;
  return 0;
}

/* Whether b continues a UTF-8 sequence (10xxxxxx). */
static inline bool ag__utf8_is_cont(unsigned char b) {
  return (b & 0xc0) == 0x80;
}

/* Whether s[0..n) is all valid UTF-8 (NUL bytes included as ASCII). */
bool ag__utf8_valid(const char *s, size_t n);

/* The largest m <= n where s[m] does not continue a UTF-8 sequence: where a
 * string whose byte s[n] exists may be cut without splitting a character. */
size_t ag__utf8_back(const char *s, size_t n);

/* A user's text (NUL-terminated) for a message, in buf (cap >= 4 bytes):
 * control bytes shown as '?', cut at `max` bytes (and to fit) on a UTF-8
 * boundary with "..." after. Returns buf. */
const char *ag__shown(const char *s, size_t max, char *buf, size_t cap);

/* Bytes at the end of buf[0..len) that start a UTF-8 sequence but do not
 * finish it (0 when the end is complete, or when no lead byte is within
 * reach: not ours to fix). len - that is a cut that splits no character. */
size_t ag__utf8_incomplete_tail(const char *buf, size_t len);

/* The JSON Schema name of a value's type, for every user-facing message:
 * "object", "array", "string", "integer", "number", "boolean" or "null";
 * "nothing" for NULL (a missing value). The CLI, which may use only the
 * public API, keeps its own copy with the same words (cli_json_type). */
const char *ag__json_kind(const json_t *v);

/* The reason phrase of an HTTP status (RFC 9110: "Service Unavailable");
 * "Server Error", "Client Error" or "Unexpected Status" for codes the
 * table does not name. A static string. */
const char *ag__http_reason(int status);

/* ---- buf.c -------------------------------------------------------------- */

/*
 * The one capped growable buffer (curl's dynbuf). `cap` is the most content
 * bytes it ever holds (a NUL always follows them). Every append checks the
 * cap: ag__buf_add refuses what does not fit whole (AG_ETOOBIG, nothing
 * appended) and ag__buf_add_cut keeps what fits, cut on a UTF-8 boundary,
 * and sets `cut`; after a cut, cut appends add nothing (the text stays a
 * prefix of everything asked for) but still count in `want`, like
 * snprintf's return value. A buffer made with ag__buf_init_fixed writes into
 * the caller's array and never allocates; ag__buf_init's grows on the heap.
 */
typedef struct ag__buf {
  char *p;      /* the text, NUL-terminated; NULL before the first append */
  size_t len;   /* content bytes */
  size_t alloc; /* bytes allocated at p (0: none yet) */
  size_t cap;   /* the most content bytes */
  bool fixed;   /* p is the caller's array of cap + 1 bytes */
  bool cut;     /* an append was cut or refused */
  size_t want;  /* bytes the cut appends asked for, kept or not */
} ag__buf;

void ag__buf_init(ag__buf *b, size_t cap);
/* Writes into `storage` (size bytes, size >= 1; holds size - 1 content
 * bytes and the NUL), which is emptied now. */
void ag__buf_init_fixed(ag__buf *b, char *storage, size_t size);
/* Allocates room for n content bytes (at most cap) now: one allocation
 * when the caller knows the size. AG_OK, AG_ENOMEM, or AG_ETOOBIG for a
 * fixed buffer that is smaller. */
ag_err_t ag__buf_reserve(ag__buf *b, size_t n);
ag_err_t ag__buf_add(ag__buf *b, const void *s, size_t n);
ag_err_t ag__buf_addstr(ag__buf *b, const char *s);
void ag__buf_add_cut(ag__buf *b, const char *s, size_t n);
void ag__buf_addstr_cut(ag__buf *b, const char *s);
void ag__buf_addc_cut(ag__buf *b, char c);
/* printf, cut like ag__buf_add_cut. */
void ag__buf_printf_cut(ag__buf *b, const char *fmt, ...) AG__PRINTF(2, 3);
void ag__buf_vprintf_cut(ag__buf *b, const char *fmt, va_list ap);
/* The text ("" before the first append). */
const char *ag__buf_str(const ag__buf *b);
/* Empty again, same cap; keeps the memory. */
void ag__buf_reset(ag__buf *b);
/* Frees a heap buffer (a fixed one is only emptied). */
void ag__buf_free(ag__buf *b);

/* ---- curl.c ------------------------------------------------------------- */

/* libcurl's global initialisation, once for the whole library (thread-
 * safe); its CURLcode (0: CURLE_OK). Call before a first curl handle. */
int ag__curl_init(void);

/* ---- rand.c ------------------------------------------------------------- */

/* xorshift64* (Vigna 2016) on the caller's state; a zero state is reseeded
 * first (it would stay zero). */
uint64_t ag__rand_next(uint64_t *state);

typedef enum {
  AG__BACKOFF_LINEAR = 0, /* base * (attempt + 1) */
  AG__BACKOFF_CONSTANT,   /* base */
  AG__BACKOFF_EXPONENTIAL /* base * 2^attempt */
} ag__backoff_kind;

typedef enum {
  AG__JITTER_NONE = 0,
  AG__JITTER_EQUAL, /* uniform in [d/2, d] */
  AG__JITTER_FULL   /* uniform in [0, d] */
} ag__jitter_kind;

/*
 * The one backoff calculation: the wait before retry `attempt` + 1
 * (0-based) from `base_ms` (negative: 0), saturating instead of
 * overflowing, capped at `cap_ms` (0 or less: no cap), then jittered from
 * `rng` (a xorshift64* state; with EQUAL jitter only a d of at least 2 is
 * jittered).
 */
int64_t ag__backoff(int64_t base_ms, int attempt, ag__backoff_kind kind,
                    int64_t cap_ms, ag__jitter_kind jitter, uint64_t *rng);

/* ---- cancel.c ----------------------------------------------------------- */

/* Whether ag_cancel_force was called on `c` or an ancestor. Async-signal-safe
 * (atomic loads). */
bool ag__cancel_forced(ag_cancel *c);

#endif /* AG_BASE_INTERNAL_H */
