/*
 * src/proxy/relay.c - one event loop for every upstream transfer (relay.h).
 *
 * The loop: epoll_wait on the transfers' sockets (registered by libcurl's
 * socket callback) and on an eventfd that says other threads queued
 * requests, with libcurl's timer as the timeout; curl_multi_socket_action
 * for each ready socket or an expired timer; then every finished transfer
 * is taken out of the multi handle and told (`done`), the hook runs, and
 * what the round's callbacks queued on this thread is taken.
 *
 * Rejected: curl_multi_perform / curl_multi_poll (what the proxy did with
 * a multi handle per stream, on a thread per connection): both walk every
 * transfer on each call, which with a thousand streams open is a thousand
 * checks per chunk. Rejected: a thread per stream waiting on its own
 * socket (the same design before): each chunk then wakes a thread of its
 * own, and the proxy spent about 38 us of CPU per relayed chunk.
 */
#define _GNU_SOURCE
#include "relay.h"

#include "agentguard/base.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/eventfd.h>
#include <unistd.h>

enum { OP_ADD, OP_CANCEL, OP_UNPAUSE };

#define EVENTS_MAX 128
#define FD_TRACKED 65536 /* descriptors whose place in the set is kept */

struct ag__relay {
  pthread_t thread;
  CURLM *multi;
  int ep, efd;
  int64_t deadline; /* libcurl's timer, ms on CLOCK_MONOTONIC; -1: none */
  ag__relay_xfer *active;
  long n_active;      /* transfers in the multi handle */
  long max_idle;      /* idle connections kept at most */
  pthread_mutex_t mu; /* the queue, `closing` and `quit` */
  ag__relay_op *head, *tail;
  ag__relay_hook hook;
  bool has_hook;
  bool closing;     /* every transfer ends, new ones too */
  bool quit;        /* the thread ends */
  bool queued_here; /* the loop's own thread queued requests this round */
  uint8_t *fds;     /* FD_TRACKED states (on_socket); NULL: none kept */
};

/*
 * The epoll set follows libcurl's socket callback, with one difference: a
 * kept connection's socket stays in the set while it is idle. libcurl
 * says CURL_POLL_REMOVE when a transfer gives its connection back to the
 * cache and CURL_POLL_IN when the next request on it waits for the reply;
 * taking the socket out and putting it back was two epoll_ctl calls per
 * request, a tenth of the proxy's system calls. So `fds` keeps, per
 * descriptor below FD_TRACKED, what the set holds for it: a socket that
 * waits for input only when libcurl lets go of it is "parked" and left in
 * the set; when libcurl wants it again for input, nothing is to be done.
 * A parked socket that becomes readable (the upstream closed an idle
 * connection, or sent something unasked) is taken out of the set then,
 * and libcurl, which checks a connection before it reuses it, finds out
 * itself. libcurl opens and closes its sockets through on_open and
 * on_close (set on every transfer, start_xfer), which forget a
 * descriptor's state: the kernel drops a closed socket from the set, and
 * a new socket under the same number is not in it.
 * Descriptors at or above FD_TRACKED take the plain way: out of the set
 * at CURL_POLL_REMOVE, one ADD (libcurl gives such a socket no socketp
 * yet; curl_multi_assign) or MOD per change.
 */
enum { FD_IN = 1, FD_OUT = 2, FD_SET = 4, FD_PARKED = 8 };

static uint8_t *fd_state(ag__relay *r, curl_socket_t s) {
  return s >= 0 && s < FD_TRACKED && r->fds != NULL ? &r->fds[s] : NULL;
}

static int on_socket(CURL *e, curl_socket_t s, int what, void *userp,
                     void *socketp) {
  (void)e;
  ag__relay *r = userp;
  uint8_t *st = fd_state(r, s);
  if (what == CURL_POLL_REMOVE) {
    if (st != NULL && (*st & FD_SET) && (*st & (FD_IN | FD_OUT)) == FD_IN) {
      *st |= FD_PARKED;
      return 0;
    }
    epoll_ctl(r->ep, EPOLL_CTL_DEL, s, NULL); /* may be closed already */
    if (st != NULL)
      *st = 0;
    return 0;
  }
  uint8_t want =
      (what & CURL_POLL_IN ? FD_IN : 0) | (what & CURL_POLL_OUT ? FD_OUT : 0);
  struct epoll_event ev;
  memset(&ev, 0, sizeof ev);
  ev.events = (want & FD_IN ? EPOLLIN : 0u) | (want & FD_OUT ? EPOLLOUT : 0u);
  ev.data.fd = s;
  bool in_set = st != NULL ? (*st & FD_SET) != 0 : socketp != NULL;
  if (st != NULL && in_set && (*st & (FD_IN | FD_OUT)) == want) {
    /* a parked socket wanted again as it was: already in the set */
  } else if (in_set) {
    if (epoll_ctl(r->ep, EPOLL_CTL_MOD, s, &ev) != 0 && errno == ENOENT)
      epoll_ctl(r->ep, EPOLL_CTL_ADD, s, &ev);
  } else {
    if (epoll_ctl(r->ep, EPOLL_CTL_ADD, s, &ev) != 0 && errno == EEXIST)
      epoll_ctl(r->ep, EPOLL_CTL_MOD, s, &ev);
  }
  if (st != NULL)
    *st = (uint8_t)(FD_SET | want);
  else if (socketp == NULL)
    curl_multi_assign(r->multi, s, r); /* any non-NULL: "added" */
  return 0;
}

/* A socket libcurl opens: not in the set, whatever its number was. */
static curl_socket_t on_open(void *user, curlsocktype purpose,
                             struct curl_sockaddr *a) {
  (void)purpose;
  ag__relay *r = user;
  curl_socket_t s = socket(a->family, a->socktype | SOCK_CLOEXEC, a->protocol);
  uint8_t *st = fd_state(r, s);
  if (st != NULL)
    *st = 0;
  return s;
}

/* A socket libcurl closes (the kernel takes it out of the set). */
static int on_close(void *user, curl_socket_t s) {
  uint8_t *st = fd_state(user, s);
  if (st != NULL)
    *st = 0;
  return close(s);
}

/* An event on a socket libcurl has let go of: out of the set (true). */
static bool unpark(ag__relay *r, int fd) {
  uint8_t *st = fd_state(r, fd);
  if (st == NULL || !(*st & FD_PARKED))
    return false;
  epoll_ctl(r->ep, EPOLL_CTL_DEL, fd, NULL);
  *st = 0;
  return true;
}

static int on_timer(CURLM *m, long timeout_ms, void *userp) {
  (void)m;
  ag__relay *r = userp;
  r->deadline = timeout_ms < 0 ? -1 : ag_now_ms() + timeout_ms;
  return 0;
}

static void unlink_xfer(ag__relay *r, ag__relay_xfer *x) {
  if (x->prev != NULL)
    x->prev->next = x->next;
  else
    r->active = x->next;
  if (x->next != NULL)
    x->next->prev = x->prev;
  x->prev = x->next = NULL;
  x->active = false;
}

/* libcurl's connection cache counts the connections in use too (7.88:
 * when a transfer gives its connection back to a cache holding more than
 * CURLMOPT_MAXCONNECTS, the oldest idle one is closed - often that one).
 * A fixed cap of max_idle would close nearly every connection while more
 * transfers than that run, and each next request would connect (against
 * a real API: a TLS handshake) again. The cap follows the transfers:
 * those running, plus max_idle idle. */
static void set_cap(ag__relay *r) {
  curl_multi_setopt(r->multi, CURLMOPT_MAXCONNECTS, r->n_active + r->max_idle);
}

/* Takes x out of the multi handle and tells its owner; x is not touched
 * after `done` (its owner may free it there or at once on another thread). */
static void end_xfer(ag__relay *r, ag__relay_xfer *x, CURLcode cc) {
  curl_multi_remove_handle(r->multi, x->h);
  unlink_xfer(r, x);
  r->n_active--;
  set_cap(r);
  x->done(x, cc);
}

static void start_xfer(ag__relay *r, ag__relay_xfer *x, bool stopping) {
  x->prev = x->next = NULL;
  x->active = false;
  if (stopping) {
    x->done(x, CURLE_ABORTED_BY_CALLBACK);
    return;
  }
  curl_easy_setopt(x->h, CURLOPT_PRIVATE, x);
  curl_easy_setopt(x->h, CURLOPT_OPENSOCKETFUNCTION, on_open);
  curl_easy_setopt(x->h, CURLOPT_OPENSOCKETDATA, r);
  curl_easy_setopt(x->h, CURLOPT_CLOSESOCKETFUNCTION, on_close);
  curl_easy_setopt(x->h, CURLOPT_CLOSESOCKETDATA, r);
  if (curl_multi_add_handle(r->multi, x->h) != CURLM_OK) {
    x->done(x, CURLE_FAILED_INIT);
    return;
  }
  x->active = true;
  x->next = r->active;
  if (r->active != NULL)
    r->active->prev = x;
  r->active = x;
  r->n_active++;
  set_cap(r);
}

/* Carries out the queued requests. */
static void take_ops(ag__relay *r) {
  pthread_mutex_lock(&r->mu);
  ag__relay_op *op = r->head;
  r->head = r->tail = NULL;
  bool stopping = r->closing;
  pthread_mutex_unlock(&r->mu);
  while (op != NULL) {
    ag__relay_op *next = op->next;
    ag__relay_xfer *x = op->x;
    op->next = NULL;
    if (op->kind == OP_ADD) {
      start_xfer(r, x, stopping);
    } else {
      if (x->active && op->kind == OP_CANCEL) {
        end_xfer(r, x, CURLE_ABORTED_BY_CALLBACK);
      } else if (x->active) {
        /* libcurl hands the held data to the write callback in this call;
         * when that fails it says so here and no longer watches the
         * socket: the transfer ends now, not at its timeout */
        CURLcode cc = curl_easy_pause(x->h, CURLPAUSE_CONT);
        if (cc != CURLE_OK)
          end_xfer(r, x, cc);
      }
      if (op->taken != NULL)
        op->taken(op->user);
    }
    op = next;
  }
}

/* The eventfd said other threads queued requests. */
static void take_queue(ag__relay *r) {
  uint64_t n;
  if (read(r->efd, &n, sizeof n) < 0 && errno != EAGAIN)
    return;
  take_ops(r);
}

static void take_finished(ag__relay *r) {
  int left = 0;
  CURLMsg *m;
  while ((m = curl_multi_info_read(r->multi, &left)) != NULL) {
    if (m->msg != CURLMSG_DONE)
      continue;
    CURL *h = m->easy_handle;
    CURLcode cc = m->data.result;
    ag__relay_xfer *x = NULL;
    curl_easy_getinfo(h, CURLINFO_PRIVATE, (char **)&x);
    if (x != NULL && x->active)
      end_xfer(r, x, cc);
  }
}

static void *relay_main(void *arg) {
  ag__relay *r = arg;
  struct epoll_event evs[EVENTS_MAX];
  pthread_setname_np(pthread_self(), "ag-loop"); /* for top -H, perf */
  int running = 0;
  for (;;) {
    int wait = -1;
    if (r->deadline >= 0) {
      int64_t d = r->deadline - ag_now_ms();
      wait = d < 0 ? 0 : d > 60000 ? 60000 : (int)d;
    }
    if (r->has_hook && r->hook.timeout_ms != NULL) {
      long h = r->hook.timeout_ms(r->hook.user);
      if (h >= 0 && (wait < 0 || h < wait))
        wait = h > 60000 ? 60000 : (int)h;
    }
    int n = epoll_wait(r->ep, evs, EVENTS_MAX, wait);
    if (n < 0 && errno != EINTR)
      break; /* not expected: the descriptors are ours */
    for (int i = 0; i < n; i++) {
      if (evs[i].data.fd == r->efd) {
        take_queue(r);
        continue;
      }
      if (r->has_hook && evs[i].data.fd == r->hook.fd)
        continue; /* run below, every round */
      if (unpark(r, evs[i].data.fd))
        continue;
      int flags =
          (evs[i].events & EPOLLIN ? CURL_CSELECT_IN : 0) |
          (evs[i].events & EPOLLOUT ? CURL_CSELECT_OUT : 0) |
          (evs[i].events & (EPOLLERR | EPOLLHUP) ? CURL_CSELECT_ERR : 0);
      curl_multi_socket_action(r->multi, evs[i].data.fd, flags, &running);
    }
    if (r->deadline >= 0 && ag_now_ms() >= r->deadline) {
      r->deadline = -1;
      curl_multi_socket_action(r->multi, CURL_SOCKET_TIMEOUT, 0, &running);
    }
    take_finished(r);
    if (r->has_hook)
      r->hook.run(r->hook.user);
    /* what this round's callbacks queued (a request decided on this
     * thread starts its transfer here, without an eventfd round trip);
     * taking it may queue more */
    while (r->queued_here) {
      r->queued_here = false;
      take_ops(r);
      take_finished(r);
    }
    pthread_mutex_lock(&r->mu);
    bool closing = r->closing;
    bool quit = r->quit && r->head == NULL;
    pthread_mutex_unlock(&r->mu);
    while (closing && r->active != NULL)
      end_xfer(r, r->active, CURLE_ABORTED_BY_CALLBACK);
    if (quit)
      break;
  }
  while (r->active != NULL)
    end_xfer(r, r->active, CURLE_ABORTED_BY_CALLBACK);
  return NULL;
}

static void wake(ag__relay *r);

static void push(ag__relay *r, ag__relay_op *op) {
  op->next = NULL;
  pthread_mutex_lock(&r->mu);
  if (r->tail != NULL)
    r->tail->next = op;
  else
    r->head = op;
  r->tail = op;
  pthread_mutex_unlock(&r->mu);
  if (pthread_equal(pthread_self(), r->thread))
    r->queued_here = true; /* taken at the end of this round */
  else
    wake(r);
}

ag__relay *ag__relay_start(long max_idle, const ag__relay_hook *hook) {
  ag__relay *r = calloc(1, sizeof(*r));
  if (r == NULL)
    return NULL;
  r->deadline = -1;
  r->max_idle = max_idle;
  if (hook != NULL) {
    r->hook = *hook;
    r->has_hook = true;
  }
  r->ep = epoll_create1(EPOLL_CLOEXEC);
  r->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  r->multi = curl_multi_init();
  r->fds = calloc(FD_TRACKED, 1); /* none kept without it (on_socket) */
  pthread_mutex_init(&r->mu, NULL);
  struct epoll_event ev;
  memset(&ev, 0, sizeof ev);
  ev.events = EPOLLIN;
  ev.data.fd = r->efd;
  bool ok = r->ep >= 0 && r->efd >= 0 && r->multi != NULL &&
            epoll_ctl(r->ep, EPOLL_CTL_ADD, r->efd, &ev) == 0;
  if (ok && r->has_hook) {
    ev.data.fd = r->hook.fd;
    ok = epoll_ctl(r->ep, EPOLL_CTL_ADD, r->hook.fd, &ev) == 0;
  }
  if (ok) {
    curl_multi_setopt(r->multi, CURLMOPT_SOCKETFUNCTION, on_socket);
    curl_multi_setopt(r->multi, CURLMOPT_SOCKETDATA, r);
    curl_multi_setopt(r->multi, CURLMOPT_TIMERFUNCTION, on_timer);
    curl_multi_setopt(r->multi, CURLMOPT_TIMERDATA, r);
    set_cap(r);
    ok = pthread_create(&r->thread, NULL, relay_main, r) == 0;
  }
  if (!ok) {
    if (r->multi != NULL)
      curl_multi_cleanup(r->multi);
    if (r->ep >= 0)
      close(r->ep);
    if (r->efd >= 0)
      close(r->efd);
    pthread_mutex_destroy(&r->mu);
    free(r->fds);
    free(r);
    return NULL;
  }
  return r;
}

static void wake(ag__relay *r) {
  uint64_t one = 1;
  while (write(r->efd, &one, sizeof one) < 0 && errno == EINTR)
    ;
}

void ag__relay_wake(ag__relay *r) {
  /* on its own thread the loop goes round anyway: the hook runs after
   * every callback of the round */
  if (!pthread_equal(pthread_self(), r->thread))
    wake(r);
}

void ag__relay_close(ag__relay *r) {
  if (r == NULL)
    return;
  pthread_mutex_lock(&r->mu);
  r->closing = true;
  pthread_mutex_unlock(&r->mu);
  wake(r);
}

void ag__relay_stop(ag__relay *r) {
  if (r == NULL)
    return;
  pthread_mutex_lock(&r->mu);
  r->closing = true;
  r->quit = true;
  pthread_mutex_unlock(&r->mu);
  wake(r);
  pthread_join(r->thread, NULL);
  curl_multi_cleanup(r->multi); /* closes the kept connections */
  close(r->ep);
  close(r->efd);
  pthread_mutex_destroy(&r->mu);
  free(r->fds);
  free(r);
}

void ag__relay_add(ag__relay *r, ag__relay_xfer *x) {
  x->add.x = x;
  x->add.kind = OP_ADD;
  x->add.taken = NULL;
  push(r, &x->add);
}

void ag__relay_cancel(ag__relay *r, ag__relay_xfer *x, ag__relay_op *op) {
  op->x = x;
  op->kind = OP_CANCEL;
  push(r, op);
}

void ag__relay_unpause(ag__relay *r, ag__relay_xfer *x, ag__relay_op *op) {
  op->x = x;
  op->kind = OP_UNPAUSE;
  push(r, op);
}

typedef struct waiter {
  ag__relay_xfer x;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool done;
  CURLcode cc;
} waiter;

static void waiter_done(ag__relay_xfer *x, CURLcode cc) {
  waiter *w = x->user;
  pthread_mutex_lock(&w->mu);
  w->cc = cc;
  w->done = true;
  pthread_cond_signal(&w->cv);
  pthread_mutex_unlock(&w->mu); /* w may be gone from here on */
}

CURLcode ag__relay_run(ag__relay *r, CURL *h) {
  waiter w;
  memset(&w, 0, sizeof w);
  w.x.h = h;
  w.x.done = waiter_done;
  w.x.user = &w;
  pthread_mutex_init(&w.mu, NULL);
  pthread_cond_init(&w.cv, NULL);
  ag__relay_add(r, &w.x);
  pthread_mutex_lock(&w.mu);
  while (!w.done)
    pthread_cond_wait(&w.cv, &w.mu);
  pthread_mutex_unlock(&w.mu);
  pthread_cond_destroy(&w.cv);
  pthread_mutex_destroy(&w.mu);
  return w.cc;
}
