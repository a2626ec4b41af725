/*
 * agentguard/base.h - what every layer needs and nothing decides: the
 * monotonic clock and cancellation tokens with deadlines (the base layer of
 * docs/layers.md; src/base/). Included by agentguard/exec.h, where these
 * declarations used to live, so code that includes exec.h is unchanged.
 *
 * Thread-safety: ag_cancel is safe from any thread, and ag_cancel_cancel()
 * also from a signal handler.
 */
#ifndef AGENTGUARD_BASE_H
#define AGENTGUARD_BASE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Milliseconds on the monotonic clock every deadline of this layer uses. */
AG_EXTERN int64_t ag_now_ms(void);

/* ------------------------------------------------------------------------ */
/* Cancellation                                                             */
/* ------------------------------------------------------------------------ */

typedef enum {
  AG_CANCEL_NONE = 0, /* not cancelled */
  AG_CANCEL_USER,     /* the caller cancelled (Ctrl-C, an API call) */
  AG_CANCEL_DEADLINE, /* the turn deadline passed */
  AG_CANCEL_TIMEOUT   /* the per-attempt timeout passed */
} ag_cancel_reason;

/* "none", "user", "deadline", "timeout"; a static string. */
AG_EXTERN const char *ag_cancel_reason_name(ag_cancel_reason r);

typedef struct ag_cancel ag_cancel;

/*
 * Creates a token. `parent` (may be NULL; borrowed, must outlive the token)
 * cancels this one too, with the parent's reason. `deadline_ms` is absolute
 * on ag_now_ms()'s clock (INT64_MAX: none); when it passes, the token is
 * cancelled with `deadline_reason` (AG_CANCEL_DEADLINE or AG_CANCEL_TIMEOUT).
 * A turn token: parent = the caller's token, the turn deadline. An attempt
 * token: parent = the turn token, the per-attempt timeout.
 * Returns AG_OK or AG_ENOMEM. No descriptor is made until something asks
 * for one (ag_cancel_fds, ag_cancel_wait).
 */
AG_EXTERN ag_err_t ag_cancel_new(ag_cancel **out, ag_cancel *parent,
                                 int64_t deadline_ms,
                                 ag_cancel_reason deadline_reason,
                                 ag_error_t *err);

/* Frees a token (no thread may still wait on it). NULL does nothing. */
AG_EXTERN void ag_cancel_free(ag_cancel *c);

/*
 * Cancels `c` with `reason` (AG_CANCEL_USER if NONE is given). Sticky: the
 * first reason wins and later calls do nothing. Safe from any thread and
 * from a signal handler (an atomic flag and a write to an eventfd).
 */
AG_EXTERN void ag_cancel_cancel(ag_cancel *c, ag_cancel_reason reason);

/*
 * Cancels `c` like ag_cancel_cancel(c, AG_CANCEL_USER) and also asks every
 * subprocess tool running under `c` (or under a token linked to it) to be
 * killed now: SIGKILL to all of its processes, without waiting out the
 * tool's SIGTERM grace period (within about 20 ms). For a second Ctrl-C.
 * Safe from any thread and from a signal handler.
 */
AG_EXTERN void ag_cancel_force(ag_cancel *c);

/*
 * Whether `c` is cancelled: by itself, by an ancestor, or by a deadline in
 * the chain that has passed (`now_ms`; pass ag_now_ms()). Returns the reason
 * of whichever fired first, or AG_CANCEL_NONE. Once non-NONE, always the same.
 */
AG_EXTERN ag_cancel_reason ag_cancel_check(ag_cancel *c, int64_t now_ms);

/*
 * Sleeps until `c` is cancelled or `timeout_ms` passes (-1: no timeout).
 * Returns the cancel reason, or AG_CANCEL_NONE when the time ran out. This
 * is the interruptible sleep of retry delays.
 */
AG_EXTERN ag_cancel_reason ag_cancel_wait(ag_cancel *c, int64_t timeout_ms);

/*
 * For code that polls: the earliest deadline in the chain (INT64_MAX: none)
 * and up to `cap` file descriptors, one per token in the chain, each readable
 * once that token is cancelled. Returns how many were written. A token's
 * descriptor (an eventfd) is made at the first call that asks for it and
 * lives until ag_cancel_free; a token whose descriptor cannot be made (out
 * of descriptors) is left out, so poll with a timeout and call
 * ag_cancel_check as ag_cancel_wait does.
 */
AG_EXTERN size_t ag_cancel_fds(ag_cancel *c, int *fds, size_t cap,
                               int64_t *deadline_ms);

#ifdef __cplusplus
}
#endif

#endif /* AGENTGUARD_BASE_H */
