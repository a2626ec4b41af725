/*
 * src/base/cancel.c - cancellation tokens: linked chains, deadlines, eventfds.
 *
 * What it is for. One token per turn (parent: the caller's token; deadline:
 * the turn deadline, reason DEADLINE) and one per tool attempt (parent: the
 * turn token; deadline: the per-attempt timeout, reason TIMEOUT). Everything
 * that runs during a turn watches a token: native tools poll it, subprocess
 * runners and retry waits poll(2) its file descriptors. Seed 001's linked
 * CancellationTokenSource, in C.
 *
 * Data structures. A token holds
 *   - `state`: one lock-free atomic 64-bit word packing the latched reason
 *     (low 3 bits) and the time it happened (ms on ag_now_ms()'s clock, the
 *     high bits). NONE until a reason is latched; then never changes again
 *     (compare-exchange from 0: the first reason wins). Reason and time are
 *     one word so that a reader never sees a reason without its time.
 *   - `fd`: an eventfd (EFD_CLOEXEC | EFD_NONBLOCK), written once by whoever
 *     latches the state, never read: it stays readable for good. Made only
 *     when something first asks for the token's descriptors
 *     (ag_cancel_fds, ag_cancel_wait): most tool attempts finish without
 *     anyone polling their token, and an eventfd costs two system calls
 *     (3-4 us on these machines). Publishing it races with a cancel: the
 *     canceller latches the state then reads the fd, the creator publishes
 *     the fd then reads the state, both sequentially consistent, so at
 *     least one of them sees the other and signals (twice is harmless).
 *   - `parent` (borrowed), its own `deadline` and `deadline_reason`.
 * A child never writes to its parents and parents do not know their
 * children, so cancelling is one CAS and one write(2) on one token: no
 * locks, no lists, nothing a signal handler could deadlock on.
 *
 * Which reason fired. ag_cancel_check() looks at the token's own state, then
 * (read-only) its parent chain, then its own deadline (it fired when
 * now >= deadline), and latches the earliest cause into the token: a
 * deadline "happened" at its deadline time, an explicit cancel at the time
 * ag_cancel_cancel() stamped on it. On equal times the ancestor wins (the
 * broader cause: a turn deadline equal to an attempt timeout is a turn
 * deadline). Latching makes the answer sticky: once a token says TIMEOUT it
 * says TIMEOUT forever, even after its parent is cancelled. ag_cancel_cancel()
 * applies the same rule: cancelling a token whose deadline already passed
 * latches the deadline, because that happened first.
 *
 * Forcing. ag_cancel_force() (a second Ctrl-C) also sets `forced`, an
 * atomic flag of its own: subprocess runs that are in their SIGTERM grace
 * period look at it along the chain (ag__cancel_forced) at a short interval
 * and kill their tools at once instead of waiting the grace out.
 *
 * Threading. Every function may be called from any thread on the same token
 * at once, except ag_cancel_free. ag_cancel_cancel() and ag_cancel_force()
 * are async-signal-safe:
 * clock_gettime(2), atomic loads, one CAS and write(2) (errno is saved and
 * restored). The atomics need 64-bit lock-free CAS, asserted at compile
 * time; every platform agentguard targets (x86-64, AArch64) has it.
 *
 * Waiting. ag_cancel_wait() polls the fds of the whole chain with a timeout
 * that ends at the earliest of its own timeout and every deadline in the
 * chain, looping on EINTR and spurious wakeups; the answer always comes
 * from ag_cancel_check(), so the fds are only a wake-up signal.
 *
 * Rejected: a condition variable per token (not async-signal-safe, and a
 * parent would have to broadcast to its children, i.e. keep a child list
 * under a lock); a timer thread or timerfd per deadline (a thread or an fd
 * per token for something a poll timeout already does); a self-pipe (two
 * fds per token where eventfd needs one; Linux is the target).
 */
#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

#if ATOMIC_LLONG_LOCK_FREE != 2 || ATOMIC_INT_LOCK_FREE != 2
#error "ag_cancel needs lock-free atomics (async-signal-safe cancel)"
#endif

#define REASON_BITS 3
#define REASON_MASK ((unsigned long long)((1u << REASON_BITS) - 1))
/* Times are clamped to what fits above the reason bits. */
#define TIME_MAX ((int64_t)(ULLONG_MAX >> (REASON_BITS + 1)))

/* fds polled at once by ag_cancel_wait; deeper chains are still correct,
 * their extra tokens are only checked at a short poll interval. */
#define WAIT_FDS 16
#define DEEP_CHAIN_POLL_MS 10

struct ag_cancel {
  atomic_ullong state; /* 0, or (time << REASON_BITS) | reason */
  atomic_int fd;       /* the eventfd, -1 until something waits on it */
  atomic_int forced;   /* ag_cancel_force: kill subprocesses without grace */
  ag_cancel *parent;
  int64_t deadline;
  ag_cancel_reason deadline_reason;
};

AG_EXTERN const char *ag_cancel_reason_name(ag_cancel_reason r) {
  switch (r) {
  case AG_CANCEL_NONE:
    return "none";
  case AG_CANCEL_USER:
    return "user";
  case AG_CANCEL_DEADLINE:
    return "deadline";
  case AG_CANCEL_TIMEOUT:
    return "timeout";
  }
  return "unknown";
}

static bool valid_reason(int r) {
  return r == AG_CANCEL_USER || r == AG_CANCEL_DEADLINE ||
         r == AG_CANCEL_TIMEOUT;
}

static unsigned long long pack(ag_cancel_reason r, int64_t at) {
  if (at < 0)
    at = 0;
  if (at > TIME_MAX)
    at = TIME_MAX;
  return ((unsigned long long)at << REASON_BITS) | (unsigned long long)r;
}

static ag_cancel_reason state_reason(unsigned long long s) {
  return (ag_cancel_reason)(s & REASON_MASK);
}

static int64_t state_time(unsigned long long s) {
  return (int64_t)(s >> REASON_BITS);
}

/* Async-signal-safe: write(2) only, errno preserved. */
static void signal_fd(int fd) {
  int saved = errno;
  uint64_t one = 1;
  ssize_t n;
  do {
    n = write(fd, &one, sizeof(one));
  } while (n < 0 && errno == EINTR);
  /* EAGAIN would mean the counter is full; it never is: one write per
   * token. Nothing else can fail on a valid eventfd. */
  errno = saved;
}

/*
 * The cause that applies to `c` at `now` without latching anything: its own
 * latched state, else the earliest of the parent chain's cause and its own
 * passed deadline (ties go to the ancestor). *at gets the cause's time.
 * Read-only, so it may look at ancestors; async-signal-safe.
 */
static ag_cancel_reason observe(ag_cancel *c, int64_t now, int64_t *at) {
  unsigned long long s = atomic_load_explicit(&c->state, memory_order_acquire);
  if (s != 0) {
    *at = state_time(s);
    return state_reason(s);
  }
  ag_cancel_reason best = AG_CANCEL_NONE;
  int64_t best_at = INT64_MAX;
  if (c->parent != NULL) {
    int64_t pat;
    ag_cancel_reason pr = observe(c->parent, now, &pat);
    if (pr != AG_CANCEL_NONE) {
      best = pr;
      best_at = pat;
    }
  }
  if (c->deadline != INT64_MAX && now >= c->deadline &&
      (best == AG_CANCEL_NONE || c->deadline < best_at)) {
    best = c->deadline_reason;
    best_at = c->deadline;
  }
  *at = best_at;
  return best;
}

/* Latches (reason, at) unless something is latched already; returns the
 * reason that is latched afterwards. The winner signals the fd. */
static ag_cancel_reason latch(ag_cancel *c, ag_cancel_reason r, int64_t at) {
  unsigned long long expected = 0;
  unsigned long long desired = pack(r, at);
  if (atomic_compare_exchange_strong(&c->state, &expected, desired)) {
    int fd = atomic_load(&c->fd); /* seq_cst: see the note on `fd` */
    if (fd >= 0)
      signal_fd(fd);
    return r;
  }
  return state_reason(expected);
}

AG_EXTERN ag_err_t ag_cancel_new(ag_cancel **out, ag_cancel *parent,
                                 int64_t deadline_ms,
                                 ag_cancel_reason deadline_reason,
                                 ag_error_t *err) {
  if (out == NULL)
    return ag__set_error(err, AG_EINVAL, -1, "ag_cancel_new: out is NULL");
  *out = NULL;
  ag_cancel *c = malloc(sizeof(*c));
  if (c == NULL)
    return ag__set_error(err, AG_ENOMEM, -1, "cancellation token: %s",
                         ag_strerror(AG_ENOMEM));
  atomic_init(&c->state, 0);
  atomic_init(&c->forced, 0);
  atomic_init(&c->fd, -1);
  c->parent = parent;
  c->deadline = deadline_ms;
  /* A deadline needs a reason to report; NONE would read "not cancelled". */
  c->deadline_reason =
      valid_reason((int)deadline_reason) ? deadline_reason : AG_CANCEL_DEADLINE;
  *out = c;
  return AG_OK;
}

AG_EXTERN void ag_cancel_free(ag_cancel *c) {
  if (c == NULL)
    return;
  /* Not retried on EINTR: on Linux the fd is gone either way. */
  int fd = atomic_load(&c->fd);
  if (fd >= 0)
    close(fd);
  free(c);
}

AG_EXTERN void ag_cancel_cancel(ag_cancel *c, ag_cancel_reason reason) {
  if (c == NULL)
    return;
  if (!valid_reason((int)reason))
    reason = AG_CANCEL_USER;
  int saved = errno; /* clock_gettime may not touch it, but be sure */
  int64_t now = ag_now_ms();
  errno = saved;
  int64_t at;
  ag_cancel_reason earlier = observe(c, now, &at);
  if (earlier != AG_CANCEL_NONE && at <= now)
    latch(c, earlier, at); /* already cancelled by something earlier */
  else
    latch(c, reason, now);
}

AG_EXTERN void ag_cancel_force(ag_cancel *c) {
  if (c == NULL)
    return;
  /* The flag first, so whoever wakes up on the cancel sees it. */
  atomic_store_explicit(&c->forced, 1, memory_order_release);
  ag_cancel_cancel(c, AG_CANCEL_USER);
}

bool ag__cancel_forced(ag_cancel *c) {
  for (ag_cancel *t = c; t != NULL; t = t->parent) {
    if (atomic_load_explicit(&t->forced, memory_order_acquire) != 0)
      return true;
  }
  return false;
}

AG_EXTERN ag_cancel_reason ag_cancel_check(ag_cancel *c, int64_t now_ms) {
  if (c == NULL)
    return AG_CANCEL_NONE;
  int64_t at;
  ag_cancel_reason r = observe(c, now_ms, &at);
  if (r == AG_CANCEL_NONE)
    return r;
  return latch(c, r, at);
}

/* The token's eventfd, made at the first call; -1 when it cannot be made
 * (out of descriptors: the token is then seen by polling with timeouts). */
static int token_fd(ag_cancel *c) {
  int fd = atomic_load(&c->fd);
  if (fd >= 0)
    return fd;
  int made = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (made < 0)
    return -1;
  int expected = -1;
  if (!atomic_compare_exchange_strong(&c->fd, &expected, made)) {
    close(made); /* another thread published one first */
    return expected;
  }
  /* A cancel latched before the fd was published signalled nothing. */
  if (atomic_load(&c->state) != 0)
    signal_fd(made);
  return made;
}

AG_EXTERN size_t ag_cancel_fds(ag_cancel *c, int *fds, size_t cap,
                               int64_t *deadline_ms) {
  size_t n = 0;
  int64_t earliest = INT64_MAX;
  for (ag_cancel *t = c; t != NULL; t = t->parent) {
    if (fds != NULL && n < cap) {
      int fd = token_fd(t);
      if (fd >= 0)
        fds[n++] = fd;
    }
    if (t->deadline < earliest)
      earliest = t->deadline;
  }
  if (deadline_ms != NULL)
    *deadline_ms = earliest;
  return n;
}

/* Milliseconds from now to `until` as a poll(2) timeout (-1: forever). */
static int poll_timeout(int64_t now, int64_t until) {
  if (until == INT64_MAX)
    return -1;
  if (until <= now)
    return 0;
  int64_t d = until - now;
  return d > INT_MAX ? INT_MAX : (int)d;
}

AG_EXTERN ag_cancel_reason ag_cancel_wait(ag_cancel *c, int64_t timeout_ms) {
  int64_t start = ag_now_ms();
  int64_t end = INT64_MAX;
  if (timeout_ms >= 0)
    end = timeout_ms > INT64_MAX - start ? INT64_MAX : start + timeout_ms;
  int chain_fds[WAIT_FDS];
  struct pollfd pfd[WAIT_FDS];
  for (;;) {
    int64_t now = ag_now_ms();
    ag_cancel_reason r = ag_cancel_check(c, now);
    if (r != AG_CANCEL_NONE)
      return r;
    if (now >= end)
      return AG_CANCEL_NONE;
    int64_t deadline = INT64_MAX;
    size_t n = ag_cancel_fds(c, chain_fds, WAIT_FDS, &deadline);
    /* A chain deeper than WAIT_FDS: the tokens past it are seen by
     * ag_cancel_check at a short interval instead of by poll. */
    size_t depth = 0;
    for (ag_cancel *t = c; t != NULL && depth <= WAIT_FDS; t = t->parent)
      depth++;
    int64_t until = end < deadline ? end : deadline;
    if (depth > WAIT_FDS && until - now > DEEP_CHAIN_POLL_MS)
      until = now + DEEP_CHAIN_POLL_MS;
    for (size_t i = 0; i < n; i++) {
      pfd[i].fd = chain_fds[i];
      pfd[i].events = POLLIN;
      pfd[i].revents = 0;
    }
    /* Readiness, EINTR and timeouts all lead back to the check above. */
    (void)poll(pfd, (nfds_t)n, poll_timeout(now, until));
  }
}
