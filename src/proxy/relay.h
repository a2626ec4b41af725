/*
 * src/proxy/relay.h - one event loop for every upstream transfer of the
 * proxy (relay.c).
 *
 * A relay is one thread that drives one libcurl multi handle with
 * curl_multi_socket_action over epoll: every upstream transfer of the
 * proxy runs in it, so a relayed chunk wakes no other thread;
 * connections to the upstream stay in the multi handle's cache between
 * transfers. The same thread can serve one more event source (a hook: the
 * proxy's libmicrohttpd daemon), so that a chunk read from the upstream is
 * written to the client without waking another thread.
 *
 * Other threads hand it work through a queue (an eventfd wakes the loop):
 * ag__relay_add starts a transfer, ag__relay_cancel ends one early,
 * ag__relay_unpause resumes one whose write callback paused it. A
 * transfer's callbacks (write, header, done) run on the relay's thread, one
 * at a time, and must not block. ag__relay_run is the blocking form for
 * threads that wait for a whole transfer.
 *
 * Each request node (ag__relay_op) is owned by its caller and may be in the
 * queue once at a time; the caller keeps it, and the transfer, alive until
 * the relay has taken it (its `done`, or for a cancel or an unpause the
 * `taken` callback).
 */
#ifndef AG_PROXY_RELAY_H
#define AG_PROXY_RELAY_H

#include <stdbool.h>

#include <curl/curl.h>

typedef struct ag__relay ag__relay;
typedef struct ag__relay_xfer ag__relay_xfer;

/* A queued request. `taken` (may be NULL) runs on the relay's thread once
 * the request has been carried out, with `user`. */
typedef struct ag__relay_op {
  struct ag__relay_op *next;
  ag__relay_xfer *x;
  int kind;
  void (*taken)(void *user);
  void *user;
} ag__relay_op;

/* One transfer: an easy handle set up by the caller, and what to call when
 * it ends (CURLE_OK, its error, or CURLE_ABORTED_BY_CALLBACK when cancelled
 * or when the relay stops). `done` runs on the relay's thread after the
 * handle has left the multi handle: from then on the caller may free both. */
struct ag__relay_xfer {
  CURL *h;
  void (*done)(ag__relay_xfer *x, CURLcode cc);
  void *user;
  ag__relay_op add;
  /* the relay's own */
  bool active;
  ag__relay_xfer *prev, *next;
};

/* Something else the relay's thread serves besides the transfers (the
 * proxy's HTTP server): `fd` is watched for reading; `run` is called when
 * it is ready and after every round of the loop (whatever the transfers'
 * callbacks did may have given it work); `timeout_ms` says how long it may
 * wait at most (-1: no limit). */
typedef struct ag__relay_hook {
  int fd;
  void (*run)(void *user);
  long (*timeout_ms)(void *user);
  void *user;
} ag__relay_hook;

/* Starts the relay's thread. NULL when out of memory or descriptors.
 * `max_idle` is the number of idle upstream connections kept; `hook` (may
 * be NULL) is copied, and its `run` is called only on the relay's
 * thread until ag__relay_stop returns. */
ag__relay *ag__relay_start(long max_idle, const ag__relay_hook *hook);

/* Ends every transfer (each one's `done` with CURLE_ABORTED_BY_CALLBACK)
 * soon, on the relay's thread; transfers added from now on end the same
 * way at once. The relay still takes requests. NULL does nothing. */
void ag__relay_close(ag__relay *r);

/* ag__relay_close, then waits for the thread and frees the relay: nothing
 * may use it after this. NULL does nothing. */
void ag__relay_stop(ag__relay *r);

/* Starts x->h. Its `done` always runs, once, on the relay's thread. */
void ag__relay_add(ag__relay *r, ag__relay_xfer *x);

/* Ends x early (`done` with CURLE_ABORTED_BY_CALLBACK) if it is still
 * running; `op` is the caller's node for the request (op->taken and
 * op->user set by the caller). */
void ag__relay_cancel(ag__relay *r, ag__relay_xfer *x, ag__relay_op *op);

/* Resumes x after its write callback returned CURL_WRITEFUNC_PAUSE. */
void ag__relay_unpause(ag__relay *r, ag__relay_xfer *x, ag__relay_op *op);

/* Makes the relay's thread go round its loop once more soon (its hook's
 * `run` included): for work given to the hook from another thread. On the
 * relay's own thread it does nothing (the round's end runs the hook). */
void ag__relay_wake(ag__relay *r);

/* Runs h to its end on the relay and waits for it: CURLE_OK or the error.
 * For threads that may block; never on the relay's own thread. */
CURLcode ag__relay_run(ag__relay *r, CURL *h);

#endif
