/*
 * agentguard/content.h - the content-loop detector (mechanism 14,
 * docs/content-loop.md): a model that repeats the same text over and over in
 * one reply. Part of the pure core: no I/O, no clock, no threads, no globals;
 * every allocation happens in ag_content_loop_new(), and its memory is fixed
 * from then on (it does not grow with the text fed to it).
 *
 * The algorithm is Gemini CLI's content-loop detector
 * (packages/core/src/services/loopDetectionService.ts, its current
 * version: a 5000-character history, a 5 x chunk-size distance and a
 * period check): the text of one reply is kept in a sliding history of at
 * most `max_history` bytes; every chunk of `chunk_size` bytes that starts
 * in it is looked up by content, and a loop is found when one chunk has
 * occurred `threshold` times, its last `threshold` occurrences are on
 * average no more than 5 x `chunk_size` bytes apart, and the texts between
 * consecutive ones are themselves repetitive (at most threshold / 2
 * distinct). Each streamed piece is first checked for markdown structure:
 * a code fence, a table row, a list item, a heading or a blockquote resets
 * the history (structured output repeats by nature), text inside a code
 * block is never analysed, and a piece that is only a divider is skipped.
 * docs/content-loop.md gives every rule, where it follows Gemini CLI and
 * where it deliberately does not, and the measured speed.
 *
 * Units: bytes of UTF-8, not characters. Gemini CLI counts UTF-16 code units
 * of JavaScript strings; for ASCII text (almost all model prose about code)
 * the two are the same, and counting bytes keeps the hot path a plain byte
 * loop (a rolling hash over a byte window, no decoding) at a fixed memory
 * cost. For other scripts a chunk of 50 bytes is 16 to 25 characters and
 * the history holds fewer characters than Gemini's, so a loop of non-ASCII
 * text is found after fewer characters, never later. The markdown checks do
 * decode UTF-8 (JavaScript's \s includes U+00A0, U+3000 and friends; the
 * divider set includes box drawing U+2500-U+257F), and so that they always
 * see whole characters, a piece that ends inside a UTF-8 sequence has that
 * incomplete sequence (at most 3 bytes) held back and put in front of the
 * next piece, just as Gemini CLI's pieces are always whole JavaScript
 * strings. Invalid UTF-8 is analysed as the bytes it is.
 *
 * Thread-safety: an ag_content_loop is not thread-safe; use one per stream
 * (per session) from one thread at a time. Distinct detectors are
 * independent.
 */
#ifndef AGENTGUARD_CONTENT_H
#define AGENTGUARD_CONTENT_H

#include <stdbool.h>
#include <stddef.h>

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ag_content_loop ag_content_loop;

/* Limits of the options (inclusive). */
#define AG_CONTENT_MAX_HISTORY_LIMIT 65536 /* largest max_history */

/*
 * Options of a detector, fixed at construction. Fill with
 * ag_content_loop_opts_init(), then edit.
 */
typedef struct ag_content_loop_opts {
  size_t chunk_size;  /* bytes per compared chunk (default 50); 1 .. max_history
                       */
  size_t threshold;   /* occurrences of one chunk that make a loop (default
                         10); 2 .. max_history */
  size_t max_history; /* bytes of the reply kept for analysis (default 5000);
                         chunk_size .. AG_CONTENT_MAX_HISTORY_LIMIT */
} ag_content_loop_opts;

/* Fills `opts` with the defaults (Gemini CLI's: 50, 10, 5000). */
AG_EXTERN void ag_content_loop_opts_init(ag_content_loop_opts *opts);

/*
 * Creates a detector. `opts` is copied; NULL means the defaults. All memory
 * the detector will ever use is allocated here, in one block: about 87
 * bytes per byte of max_history (text, chunk index and per-position links;
 * 434 KB with the defaults, of which only the 128 KB index is written now,
 * the rest as a reply grows), whatever the length of the text fed later.
 *
 * Returns AG_OK and sets *out (caller-owns, free with ag_content_loop_free);
 * on failure sets *out to NULL and returns AG_EINVAL (out is NULL, or an
 * option is out of range: err->msg names the option, its value and the
 * allowed range) or AG_ENOMEM.
 */
AG_EXTERN ag_err_t ag_content_loop_new(ag_content_loop **out,
                                       const ag_content_loop_opts *opts,
                                       ag_error_t *err);

/* Frees a detector; NULL does nothing. */
AG_EXTERN void ag_content_loop_free(ag_content_loop *d);

/*
 * Forgets everything: the history, the chunk index, the code-block state,
 * a held-back partial UTF-8 sequence and a found loop. Call it when a new
 * reply starts (a new model request, a tool call in between, a new turn).
 * NULL does nothing.
 */
AG_EXTERN void ag_content_loop_reset(ag_content_loop *d);

/*
 * Feeds one streamed piece of the reply's text (a delta as the provider
 * sent it): text[0..len) is borrowed for the call only, need not be
 * NUL-terminated and may cut a UTF-8 sequence anywhere (see above). The
 * piece boundaries matter, as in Gemini CLI: the markdown checks look at
 * each piece on its own ("start of line" is the start of the piece or the
 * byte after a newline).
 *
 * Returns true once a loop has been found; the answer is sticky: after a
 * loop every later call returns true at once, without looking at the text,
 * until ag_content_loop_reset(). Returns false for a NULL detector; a NULL
 * `text` is an empty piece. Never allocates.
 */
AG_EXTERN bool ag_content_loop_feed(ag_content_loop *d, const char *text,
                                    size_t len);

/*
 * Checks a whole reply text at once (a reply recorded without stream
 * boundaries: `audit`, `simulate`, a non-streaming provider). Resets the
 * detector, then feeds the text line by line: each line without its
 * newline is one piece and each newline is a piece of its own, so every
 * line is seen at the start of a piece, as the markdown checks expect, and
 * a divider line is seen alone. Stops at the first loop. Returns what
 * ag_content_loop_feed() would return after the last piece; the detector is
 * left in that state (ag_content_loop_chunk() describes the loop). A line
 * longer than max_history is, as a single piece is in Gemini CLI, analysed
 * only on its last max_history bytes. Never allocates.
 */
AG_EXTERN bool ag_content_loop_check_text(ag_content_loop *d, const char *text,
                                          size_t len);

/* True when a loop has been found since the last reset; false for NULL. */
AG_EXTERN bool ag_content_loop_found(const ag_content_loop *d);

/*
 * Describes the repeated chunk for a stop message: writes the chunk that
 * completed the loop into buf[0..cap) as one line, NUL-terminated: partial
 * UTF-8 sequences at its two ends are dropped, leading and trailing
 * whitespace is trimmed, and each run of whitespace or control bytes inside
 * becomes one space; when longer than cap - 1 bytes it is cut on a UTF-8
 * boundary. Returns the bytes written (NUL excluded): 0 with buf "" when no
 * loop has been found, and 0 when cap is 0 (buf untouched). `buf` may be
 * NULL only when cap is 0.
 */
AG_EXTERN size_t ag_content_loop_chunk(const ag_content_loop *d, char *buf,
                                       size_t cap);

#ifdef __cplusplus
}
#endif
#endif /* AGENTGUARD_CONTENT_H */
