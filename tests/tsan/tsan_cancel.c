/*
 * tests/tsan/tsan_cancel.c - cancellation tokens across threads, as a plain
 * program for ThreadSanitizer (tests/runtime/test_cancel.c holds the
 * single-threaded semantics):
 *   1. many threads waiting on (and polling) a linked chain root -> turn
 *      (deadline) -> attempt (timeout) while another thread cancels the root;
 *   2. a cancel from a signal handler: SIGUSR1 sent with pthread_kill to one
 *      waiting thread while others wait on the same chain;
 *   3. ag_cancel_check from 8 threads while deadlines in the chain expire;
 *   4. create/free churn on 4 threads under a shared root that another
 *      thread cancels halfway, with no descriptor leaked.
 * Exits 0 when every check holds; the first failed check prints both sides
 * and exits 1.
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "exec/internal.h"
#include "tsan_common.h"

static ag_cancel *new_token(ag_cancel *parent, int64_t deadline,
                            ag_cancel_reason why) {
  ag_cancel *c = NULL;
  ag_error_t err;
  ag_error_clear(&err);
  ag_err_t rc = ag_cancel_new(&c, parent, deadline, why, &err);
  CHECK(rc == AG_OK && c != NULL, "ag_cancel_new: %s (%s)", ag_err_name(rc),
        err.msg);
  return c;
}

static void start(pthread_t *th, void *(*fn)(void *), void *arg) {
  int rc = pthread_create(th, NULL, fn, arg);
  CHECK(rc == 0, "pthread_create: %d", rc);
}

#define CHECK_REASON(got, want, what)                                          \
  do {                                                                         \
    ag_cancel_reason g_ = (got), w_ = (want);                                  \
    CHECK(g_ == w_, "%s: got %s, want %s", (what), ag_cancel_reason_name(g_),  \
          ag_cancel_reason_name(w_));                                          \
  } while (0)

/* ------------------------------------------------------------------------ */
/* 1. Waiters on a chain, the root cancelled from another thread           */
/* ------------------------------------------------------------------------ */

/* One root, two turns under it, two attempts under each turn. */
typedef struct tree {
  ag_cancel *root, *turn[2], *attempt[4];
} tree;

typedef struct waiter {
  ag_cancel *token;
  bool poll; /* spin on ag_cancel_check instead of ag_cancel_wait */
  atomic_int *returned;
  ag_cancel_reason got;
  long long took_ms;
} waiter;

static void *wait_on(void *arg) {
  waiter *w = arg;
  long long t0 = tsan_now_ms();
  if (w->poll) {
    w->got = AG_CANCEL_NONE;
    while (w->got == AG_CANCEL_NONE && tsan_now_ms() - t0 < 10000) {
      w->got = ag_cancel_check(w->token, ag_now_ms());
      if (w->got == AG_CANCEL_NONE)
        tsan_sleep_us(500);
    }
  } else {
    w->got = ag_cancel_wait(w->token, 10000);
  }
  w->took_ms = tsan_now_ms() - t0;
  atomic_fetch_add(w->returned, 1);
  return NULL;
}

typedef struct root_canceller {
  ag_cancel *root;
  atomic_int *returned;
  int early; /* waiters that had returned before the cancel */
} root_canceller;

static void *cancel_root(void *arg) {
  root_canceller *k = arg;
  tsan_sleep_ms(50);
  k->early = atomic_load(k->returned);
  ag_cancel_cancel(k->root, AG_CANCEL_USER);
  return NULL;
}

static void chain_waiters(void) {
  enum { N = 14 };
  for (int round = 0; round < 5; round++) {
    int64_t now = ag_now_ms();
    tree t;
    t.root = new_token(NULL, INT64_MAX, AG_CANCEL_DEADLINE);
    for (int i = 0; i < 2; i++)
      t.turn[i] = new_token(t.root, now + 60000, AG_CANCEL_DEADLINE);
    for (int i = 0; i < 4; i++)
      t.attempt[i] = new_token(t.turn[i / 2], now + 30000, AG_CANCEL_TIMEOUT);

    /* 8 on the attempts, 4 on the turns, 2 on the root; every other one
     * polls, the rest sleep in ag_cancel_wait. */
    atomic_int returned;
    atomic_init(&returned, 0);
    waiter w[N];
    pthread_t th[N];
    for (int i = 0; i < N; i++) {
      ag_cancel *tok = i < 8    ? t.attempt[i % 4]
                       : i < 12 ? t.turn[i % 2]
                                : t.root;
      w[i] = (waiter){tok, i % 2 == 1, &returned, AG_CANCEL_NONE, 0};
      start(&th[i], wait_on, &w[i]);
    }
    root_canceller k = {t.root, &returned, 0};
    pthread_t kt;
    start(&kt, cancel_root, &k);
    pthread_join(kt, NULL);
    for (int i = 0; i < N; i++)
      pthread_join(th[i], NULL);

    CHECK(k.early == 0, "round %d: %d waiter(s) returned before the cancel",
          round, k.early);
    for (int i = 0; i < N; i++) {
      CHECK(w[i].got == AG_CANCEL_USER,
            "round %d waiter %d (%s): got %s, want user", round, i,
            w[i].poll ? "polling" : "waiting", ag_cancel_reason_name(w[i].got));
      CHECK(w[i].took_ms < 5000,
            "round %d waiter %d: woke %lld ms after it started, the cancel "
            "came after 50 ms",
            round, i, w[i].took_ms);
    }
    /* the whole tree agrees, now and later */
    int64_t later = ag_now_ms() + 120000;
    for (int i = 0; i < 4; i++)
      CHECK_REASON(ag_cancel_check(t.attempt[i], later), AG_CANCEL_USER,
                   "attempt after the cancel");
    for (int i = 0; i < 2; i++)
      CHECK_REASON(ag_cancel_check(t.turn[i], later), AG_CANCEL_USER,
                   "turn after the cancel");
    for (int i = 0; i < 4; i++)
      ag_cancel_free(t.attempt[i]);
    for (int i = 0; i < 2; i++)
      ag_cancel_free(t.turn[i]);
    ag_cancel_free(t.root);
  }
}

/* ------------------------------------------------------------------------ */
/* 2. Cancel from a signal handler on one of the waiting threads           */
/* ------------------------------------------------------------------------ */

/* A handler has no other way in than a global; set before the threads
 * start, so pthread_create orders it before every read. */
static ag_cancel *sig_target;
static volatile sig_atomic_t sig_handled;

static void on_sigusr1(int sig) {
  (void)sig;
  ag_cancel_cancel(sig_target, AG_CANCEL_USER);
  sig_handled = 1;
}

static void signal_cancel(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = on_sigusr1;
  sigemptyset(&sa.sa_mask);
  CHECK(sigaction(SIGUSR1, &sa, NULL) == 0, "sigaction: errno %d", errno);
  sigset_t usr1;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  CHECK(pthread_sigmask(SIG_UNBLOCK, &usr1, NULL) == 0, "pthread_sigmask");

  for (int round = 0; round < 5; round++) {
    int64_t now = ag_now_ms();
    ag_cancel *user = new_token(NULL, INT64_MAX, AG_CANCEL_DEADLINE);
    ag_cancel *turn = new_token(user, now + 60000, AG_CANCEL_DEADLINE);
    ag_cancel *att[3];
    for (int i = 0; i < 3; i++)
      att[i] = new_token(turn, now + 30000, AG_CANCEL_TIMEOUT);
    sig_target = turn;
    sig_handled = 0;

    enum { N = 6 };
    atomic_int returned;
    atomic_init(&returned, 0);
    waiter w[N];
    pthread_t th[N];
    for (int i = 0; i < N; i++) {
      ag_cancel *tok = i < 3 ? att[i] : i < 5 ? turn : att[0];
      w[i] = (waiter){tok, i == 4, &returned, AG_CANCEL_NONE, 0};
      start(&th[i], wait_on, &w[i]);
    }
    tsan_sleep_ms(30);
    int early = atomic_load(&returned);
    /* the handler runs on waiter 0, which sleeps in ag_cancel_wait */
    int rc = pthread_kill(th[0], SIGUSR1);
    CHECK(rc == 0, "pthread_kill: %d", rc);
    for (int i = 0; i < N; i++)
      pthread_join(th[i], NULL);

    CHECK(early == 0, "round %d: %d waiter(s) returned before the signal",
          round, early);
    CHECK(sig_handled == 1, "round %d: the handler did not run", round);
    for (int i = 0; i < N; i++) {
      CHECK(w[i].got == AG_CANCEL_USER, "round %d waiter %d: got %s, want user",
            round, i, ag_cancel_reason_name(w[i].got));
      CHECK(w[i].took_ms < 5000, "round %d waiter %d: woke after %lld ms",
            round, i, w[i].took_ms);
    }
    /* the handler cancelled the turn, not its parent */
    CHECK_REASON(ag_cancel_check(user, ag_now_ms()), AG_CANCEL_NONE,
                 "the caller's token above the cancelled turn");
    for (int i = 0; i < 3; i++)
      ag_cancel_free(att[i]);
    ag_cancel_free(turn);
    ag_cancel_free(user);
  }
  signal(SIGUSR1, SIG_DFL);
}

/* ------------------------------------------------------------------------ */
/* 3. Concurrent checks while the chain's deadlines expire                  */
/* ------------------------------------------------------------------------ */

typedef struct checker {
  ag_cancel *token;
  int64_t deadline; /* the earliest deadline in the token's chain */
  ag_cancel_reason first;
  int64_t first_at;       /* ag_now_ms() right after the first non-NONE */
  int changed;            /* answers that differed from the first */
  long long before_first; /* checks that said NONE */
} checker;

static void *check_until_fired(void *arg) {
  checker *c = arg;
  long long t0 = tsan_now_ms();
  c->first = AG_CANCEL_NONE;
  while (c->first == AG_CANCEL_NONE && tsan_now_ms() - t0 < 10000) {
    ag_cancel_reason r = ag_cancel_check(c->token, ag_now_ms());
    if (r != AG_CANCEL_NONE) {
      c->first = r;
      c->first_at = ag_now_ms();
    } else {
      c->before_first++;
      tsan_sleep_us(200);
    }
  }
  /* sticky: later checks, with any clock value, keep the answer */
  for (int i = 0; i < 200; i++) {
    int64_t now = i % 2 ? ag_now_ms() : INT64_MAX - 1;
    if (ag_cancel_check(c->token, now) != c->first)
      c->changed++;
  }
  return NULL;
}

static void concurrent_checks(void) {
  for (int round = 0; round < 5; round++) {
    int64_t now = ag_now_ms();
    /* The attempt's timeout comes 200 ms before the turn's deadline, so a
     * check whose clock value went stale while it was descheduled cannot
     * see the turn's deadline first. */
    int64_t att_deadline = now + 50, turn_deadline = now + 250;
    ag_cancel *user = new_token(NULL, INT64_MAX, AG_CANCEL_DEADLINE);
    ag_cancel *turn = new_token(user, turn_deadline, AG_CANCEL_DEADLINE);
    ag_cancel *att = new_token(turn, att_deadline, AG_CANCEL_TIMEOUT);
    enum { N = 8 };
    checker c[N];
    pthread_t th[N];
    for (int i = 0; i < N; i++) {
      bool on_attempt = i % 2 == 0;
      c[i] = (checker){on_attempt ? att : turn,
                       on_attempt ? att_deadline : turn_deadline,
                       AG_CANCEL_NONE,
                       0,
                       0,
                       0};
      start(&th[i], check_until_fired, &c[i]);
    }
    for (int i = 0; i < N; i++)
      pthread_join(th[i], NULL);

    for (int i = 0; i < N; i++) {
      bool on_attempt = c[i].token == att;
      ag_cancel_reason want =
          on_attempt ? AG_CANCEL_TIMEOUT : AG_CANCEL_DEADLINE;
      CHECK(c[i].first == want,
            "round %d checker %d on the %s: got %s, want %s", round, i,
            on_attempt ? "attempt" : "turn", ag_cancel_reason_name(c[i].first),
            ag_cancel_reason_name(want));
      CHECK(c[i].first_at >= c[i].deadline,
            "round %d checker %d: fired at %lld, %lld ms before its deadline",
            round, i, (long long)c[i].first_at,
            (long long)(c[i].deadline - c[i].first_at));
      CHECK(c[i].changed == 0, "round %d checker %d: %d later answers differ",
            round, i, c[i].changed);
    }
    CHECK_REASON(ag_cancel_check(user, INT64_MAX - 1), AG_CANCEL_NONE,
                 "the caller's token has no deadline");
    ag_cancel_free(att);
    ag_cancel_free(turn);
    ag_cancel_free(user);
  }
}

/* ------------------------------------------------------------------------ */
/* 4. Create/free churn under a shared root cancelled halfway              */
/* ------------------------------------------------------------------------ */

typedef struct churner {
  ag_cancel *root;
  atomic_bool *root_cancelled; /* set right after the root's cancel */
  int index;
  int iterations; /* at least this many chains, and 20 checked after */
  int after;      /* chains created after the cancel (and so checked) */
} churner;

static void *churn(void *arg) {
  churner *c = arg;
  for (int i = 0; i < c->iterations || c->after < 20; i++) {
    bool after = atomic_load(c->root_cancelled);
    int64_t now = ag_now_ms();
    ag_cancel *turn = new_token(c->root, now + 60000, AG_CANCEL_DEADLINE);
    /* every third attempt's timeout has passed already, every fifth turn
     * is cancelled on its own: those answer for themselves */
    ag_cancel *att =
        new_token(turn, i % 3 == 0 ? now - 1 : now + 60000, AG_CANCEL_TIMEOUT);
    if (i % 5 == 0)
      ag_cancel_cancel(turn, AG_CANCEL_USER);
    ag_cancel_reason r = ag_cancel_check(att, ag_now_ms());
    if (i % 3 == 0)
      CHECK(r == AG_CANCEL_TIMEOUT || r == AG_CANCEL_USER,
            "churner %d: a passed timeout gave %s", c->index,
            ag_cancel_reason_name(r));
    else if (i % 5 == 0 || after)
      CHECK(r == AG_CANCEL_USER, "churner %d chain %d: got %s, want user",
            c->index, i, ag_cancel_reason_name(r));
    if (after && i % 3 != 0 && i % 5 != 0)
      c->after++;
    int fds[4];
    size_t n = ag_cancel_fds(att, fds, 4, NULL);
    CHECK(n == 3, "churner %d: a chain of 3 gave %zu fds", c->index, n);
    ag_cancel_free(att);
    ag_cancel_free(turn);
    if (after && i % 16 == 0)
      tsan_sleep_us(100); /* let the other churners run */
  }
  return NULL;
}

static void churn_tokens(void) {
  int fds_before = tsan_count_fds();
  ag_cancel *root = new_token(NULL, INT64_MAX, AG_CANCEL_DEADLINE);
  atomic_bool cancelled;
  atomic_init(&cancelled, false);
  enum { N = 4 };
  churner c[N];
  pthread_t th[N];
  for (int i = 0; i < N; i++) {
    c[i] = (churner){root, &cancelled, i, 400, 0};
    start(&th[i], churn, &c[i]);
  }
  tsan_sleep_ms(20);
  ag_cancel_cancel(root, AG_CANCEL_USER);
  atomic_store(&cancelled, true);
  for (int i = 0; i < N; i++)
    pthread_join(th[i], NULL);
  ag_cancel_free(root);
  int fds_after = tsan_count_fds();
  CHECK(fds_after == fds_before, "open fds: %d before the churn, %d after",
        fds_before, fds_after);
}

int main(void) {
  chain_waiters();
  signal_cancel();
  concurrent_checks();
  churn_tokens();
  printf("tsan_cancel: ok\n");
  return 0;
}
