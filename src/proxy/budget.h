/*
 * src/proxy/budget.h - the bytes of upstream bodies the proxy holds whole
 * at once, over every connection, under one cap (budget.c; docs/proxy.md,
 * "Memory").
 *
 * A guarded reply that is not streamed must be read whole before the guard
 * can check its calls, and it is then handed to the client whole: each one
 * takes its bytes from the budget as it grows (in steps), twice as many
 * again when it is parsed (the tree and the text the check reads), and
 * gives them all back when the client has it (or the reply is replaced). When
 * the budget is spent, a reply that wants more waits (its transfer paused: the
 * upstream's TCP window holds the rest) until another gives bytes back -
 * back-pressure, not a failure. So that waiting can never be for ever, a
 * waiter may go past the cap when no other body that holds bytes could
 * give any back (every one of them waits too): the longest waiting goes
 * first, and only one at a time. The bytes taken are then at most the cap
 * plus one reply's (three times AG_PROXY_UPSTREAM_MAX).
 *
 * Thread-safety: one mutex; ag__budget_wait blocks (never on a loop's
 * thread), the others do not.
 */
#ifndef AG_PROXY_BUDGET_H
#define AG_PROXY_BUDGET_H

#include <stdbool.h>
#include <stddef.h>

typedef struct ag__budget ag__budget;

/* A budget of `cap` bytes. NULL when out of memory. */
ag__budget *ag__budget_new(size_t cap);
void ag__budget_free(ag__budget *b);

/* Takes n more bytes for a body that holds `held` already, if they are
 * there now: true when taken. */
bool ag__budget_try(ag__budget *b, size_t n, size_t held);
/* Takes n more bytes for a body that holds `held`, waiting as long as it
 * must (see above). */
void ag__budget_wait(ag__budget *b, size_t n, size_t held);
/* Gives back n of a body's bytes; `left` is what it holds after (0: it
 * holds none any more). NULL or n 0: nothing. */
void ag__budget_release(ag__budget *b, size_t n, size_t left);
/* Bytes taken now. */
size_t ag__budget_used(ag__budget *b);

#endif
