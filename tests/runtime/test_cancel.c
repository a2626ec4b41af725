/*
 * tests/runtime/test_cancel.c - cancellation tokens: sticky reasons, linked
 * chains (user -> turn deadline -> attempt timeout), interruptible waits
 * (from another thread and from a signal handler), fds, no fd leaks.
 *
 * Real waits are tens of milliseconds; assertions only ever say "well under
 * a second" or "at least roughly the timeout", never a tight figure.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "exec/internal.h"

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0)
    ;
}

static ag_cancel *new_token(ag_cancel *parent, int64_t deadline,
                            ag_cancel_reason why) {
  ag_cancel *c = NULL;
  ag_error_t err;
  ag_err_t rc = ag_cancel_new(&c, parent, deadline, why, &err);
  cr_assert_eq(rc, AG_OK, "ag_cancel_new: %s (%s)", ag_err_name(rc), err.msg);
  cr_assert_not_null(c);
  return c;
}

#define EXPECT_REASON(got, want)                                               \
  do {                                                                         \
    ag_cancel_reason g_ = (got), w_ = (want);                                  \
    cr_expect_eq(g_, w_, "%s: got %s, want %s", #got,                          \
                 ag_cancel_reason_name(g_), ag_cancel_reason_name(w_));        \
  } while (0)

/* ------------------------------------------------------------------------ */
/* Basics                                                                   */
/* ------------------------------------------------------------------------ */

Test(cancel, names) {
  cr_expect_str_eq(ag_cancel_reason_name(AG_CANCEL_NONE), "none");
  cr_expect_str_eq(ag_cancel_reason_name(AG_CANCEL_USER), "user");
  cr_expect_str_eq(ag_cancel_reason_name(AG_CANCEL_DEADLINE), "deadline");
  cr_expect_str_eq(ag_cancel_reason_name(AG_CANCEL_TIMEOUT), "timeout");
}

Test(cancel, clock_is_monotonic) {
  int64_t a = ag_now_ms();
  sleep_ms(5);
  int64_t b = ag_now_ms();
  cr_expect_geq(b - a, 4, "slept 5 ms, clock moved %lld", (long long)(b - a));
}

Test(cancel, fresh_token_is_not_cancelled) {
  ag_cancel *c = new_token(NULL, INT64_MAX, AG_CANCEL_DEADLINE);
  EXPECT_REASON(ag_cancel_check(c, ag_now_ms()), AG_CANCEL_NONE);
  ag_cancel_free(c);
  ag_cancel_free(NULL);
}

Test(cancel, first_reason_is_sticky) {
  ag_cancel *c = new_token(NULL, INT64_MAX, AG_CANCEL_DEADLINE);
  ag_cancel_cancel(c, AG_CANCEL_DEADLINE);
  ag_cancel_cancel(c, AG_CANCEL_USER);
  ag_cancel_cancel(c, AG_CANCEL_TIMEOUT);
  EXPECT_REASON(ag_cancel_check(c, ag_now_ms()), AG_CANCEL_DEADLINE);
  EXPECT_REASON(ag_cancel_check(c, INT64_MAX - 1), AG_CANCEL_DEADLINE);
  ag_cancel_free(c);
}

Test(cancel, none_means_user) {
  ag_cancel *c = new_token(NULL, INT64_MAX, AG_CANCEL_DEADLINE);
  ag_cancel_cancel(c, AG_CANCEL_NONE);
  EXPECT_REASON(ag_cancel_check(c, ag_now_ms()), AG_CANCEL_USER);
  ag_cancel_free(c);
}

Test(cancel, deadline_is_checked_against_now) {
  ag_cancel *c = new_token(NULL, 1000, AG_CANCEL_TIMEOUT);
  EXPECT_REASON(ag_cancel_check(c, 999), AG_CANCEL_NONE);
  EXPECT_REASON(ag_cancel_check(c, 1000), AG_CANCEL_TIMEOUT);
  /* latched: a later explicit cancel does not change the answer */
  ag_cancel_cancel(c, AG_CANCEL_USER);
  EXPECT_REASON(ag_cancel_check(c, 0), AG_CANCEL_TIMEOUT);
  ag_cancel_free(c);
}

Test(cancel, cancel_after_a_passed_deadline_reports_the_deadline) {
  /* the deadline passed before anyone looked; it still happened first */
  ag_cancel *c = new_token(NULL, ag_now_ms() - 10, AG_CANCEL_DEADLINE);
  ag_cancel_cancel(c, AG_CANCEL_USER);
  EXPECT_REASON(ag_cancel_check(c, ag_now_ms()), AG_CANCEL_DEADLINE);
  ag_cancel_free(c);
}

/* ------------------------------------------------------------------------ */
/* Linked chains: user -> turn (deadline) -> attempt (timeout)             */
/* ------------------------------------------------------------------------ */

typedef struct chain {
  ag_cancel *user, *turn, *attempt;
} chain;

static chain make_chain(int64_t turn_deadline, int64_t attempt_deadline) {
  chain ch;
  ch.user = new_token(NULL, INT64_MAX, AG_CANCEL_DEADLINE);
  ch.turn = new_token(ch.user, turn_deadline, AG_CANCEL_DEADLINE);
  ch.attempt = new_token(ch.turn, attempt_deadline, AG_CANCEL_TIMEOUT);
  return ch;
}

static void free_chain(chain *ch) {
  ag_cancel_free(ch->attempt);
  ag_cancel_free(ch->turn);
  ag_cancel_free(ch->user);
}

Test(cancel, chain_root_cancel_reaches_the_attempt_as_user) {
  int64_t now = ag_now_ms();
  chain ch = make_chain(now + 60000, now + 30000);
  EXPECT_REASON(ag_cancel_check(ch.attempt, now), AG_CANCEL_NONE);
  ag_cancel_cancel(ch.user, AG_CANCEL_USER);
  EXPECT_REASON(ag_cancel_check(ch.attempt, ag_now_ms()), AG_CANCEL_USER);
  EXPECT_REASON(ag_cancel_check(ch.turn, ag_now_ms()), AG_CANCEL_USER);
  free_chain(&ch);
}

Test(cancel, chain_turn_deadline_reaches_the_attempt_as_deadline) {
  chain ch = make_chain(1000, 2000);
  EXPECT_REASON(ag_cancel_check(ch.attempt, 999), AG_CANCEL_NONE);
  EXPECT_REASON(ag_cancel_check(ch.attempt, 1500), AG_CANCEL_DEADLINE);
  /* still the deadline after the attempt's own timeout passed too */
  EXPECT_REASON(ag_cancel_check(ch.attempt, 2500), AG_CANCEL_DEADLINE);
  free_chain(&ch);
}

Test(cancel, chain_attempt_timeout_is_timeout) {
  chain ch = make_chain(2000, 1000);
  EXPECT_REASON(ag_cancel_check(ch.attempt, 1500), AG_CANCEL_TIMEOUT);
  /* the parent is not touched by a child's timeout */
  EXPECT_REASON(ag_cancel_check(ch.turn, 1500), AG_CANCEL_NONE);
  /* sticky: the turn deadline passing later does not rewrite it */
  EXPECT_REASON(ag_cancel_check(ch.attempt, 2500), AG_CANCEL_TIMEOUT);
  EXPECT_REASON(ag_cancel_check(ch.turn, 2500), AG_CANCEL_DEADLINE);
  free_chain(&ch);
}

Test(cancel, chain_earliest_cause_wins_when_both_apply_at_one_check) {
  /* Both deadlines have passed when first checked: the one that passed
   * first is the answer, whichever token it belongs to. */
  chain a = make_chain(1000, 2000);
  EXPECT_REASON(ag_cancel_check(a.attempt, 5000), AG_CANCEL_DEADLINE);
  free_chain(&a);
  chain b = make_chain(2000, 1000);
  EXPECT_REASON(ag_cancel_check(b.attempt, 5000), AG_CANCEL_TIMEOUT);
  free_chain(&b);
  /* equal times: the ancestor (the turn deadline) */
  chain c = make_chain(1000, 1000);
  EXPECT_REASON(ag_cancel_check(c.attempt, 1000), AG_CANCEL_DEADLINE);
  free_chain(&c);
}

Test(cancel, chain_user_cancel_after_attempt_timeout_passed) {
  /* the attempt's timeout passed (unobserved) before the user cancelled */
  int64_t now = ag_now_ms();
  chain ch = make_chain(INT64_MAX, now - 5);
  ag_cancel_cancel(ch.user, AG_CANCEL_USER);
  EXPECT_REASON(ag_cancel_check(ch.attempt, ag_now_ms()), AG_CANCEL_TIMEOUT);
  EXPECT_REASON(ag_cancel_check(ch.turn, ag_now_ms()), AG_CANCEL_USER);
  free_chain(&ch);
}

Test(cancel, fds_lists_the_chain_and_the_earliest_deadline) {
  chain ch = make_chain(5000, 7000);
  int fds[8];
  int64_t dl = 0;
  size_t n = ag_cancel_fds(ch.attempt, fds, 8, &dl);
  cr_expect_eq(n, 3, "chain of 3: got %zu fds", n);
  cr_expect_eq(dl, 5000, "earliest deadline: got %lld", (long long)dl);
  for (size_t i = 0; i < n; i++)
    for (size_t j = i + 1; j < n; j++)
      cr_expect_neq(fds[i], fds[j]);
  /* cap respected, deadline still over the whole chain */
  n = ag_cancel_fds(ch.attempt, fds, 1, &dl);
  cr_expect_eq(n, 1);
  cr_expect_eq(dl, 5000);
  /* self first */
  int self[1];
  ag_cancel_fds(ch.user, self, 1, NULL);
  size_t m = ag_cancel_fds(ch.attempt, fds, 8, NULL);
  cr_expect_eq(fds[m - 1], self[0], "the root's fd comes last");
  free_chain(&ch);
}

Test(cancel, fds_become_readable_on_cancel) {
  chain ch = make_chain(INT64_MAX, INT64_MAX);
  int fds[3];
  size_t n = ag_cancel_fds(ch.attempt, fds, 3, NULL);
  cr_assert_eq(n, 3);
  struct pollfd p[3];
  for (size_t i = 0; i < n; i++)
    p[i] = (struct pollfd){.fd = fds[i], .events = POLLIN};
  cr_expect_eq(poll(p, 3, 0), 0, "nothing readable before a cancel");
  ag_cancel_cancel(ch.user, AG_CANCEL_USER);
  int r = poll(p, 3, 0);
  cr_expect_eq(r, 1, "the root's fd is readable: poll gave %d", r);
  cr_expect(p[2].revents & POLLIN);
  /* and stays readable */
  cr_expect_eq(poll(p, 3, 0), 1);
  free_chain(&ch);
}

/* ------------------------------------------------------------------------ */
/* Waiting                                                                  */
/* ------------------------------------------------------------------------ */

Test(cancel, wait_times_out_with_none) {
  ag_cancel *c = new_token(NULL, INT64_MAX, AG_CANCEL_DEADLINE);
  int64_t t0 = ag_now_ms();
  EXPECT_REASON(ag_cancel_wait(c, 30), AG_CANCEL_NONE);
  int64_t took = ag_now_ms() - t0;
  cr_expect_geq(took, 29, "waited %lld ms for a 30 ms timeout",
                (long long)took);
  EXPECT_REASON(ag_cancel_wait(c, 0), AG_CANCEL_NONE);
  ag_cancel_free(c);
}

Test(cancel, wait_returns_at_once_when_cancelled) {
  ag_cancel *c = new_token(NULL, INT64_MAX, AG_CANCEL_DEADLINE);
  ag_cancel_cancel(c, AG_CANCEL_USER);
  int64_t t0 = ag_now_ms();
  EXPECT_REASON(ag_cancel_wait(c, 10000), AG_CANCEL_USER);
  cr_expect_lt(ag_now_ms() - t0, 1000);
  ag_cancel_free(c);
}

Test(cancel, wait_ends_at_a_deadline_in_the_chain) {
  int64_t now = ag_now_ms();
  chain ch = make_chain(now + 30, INT64_MAX);
  EXPECT_REASON(ag_cancel_wait(ch.attempt, 10000), AG_CANCEL_DEADLINE);
  int64_t took = ag_now_ms() - now;
  cr_expect_geq(took, 29, "the deadline was 30 ms away; took %lld",
                (long long)took);
  cr_expect_lt(took, 1000, "took %lld ms", (long long)took);
  free_chain(&ch);
}

Test(cancel, wait_on_null_just_sleeps) {
  int64_t t0 = ag_now_ms();
  EXPECT_REASON(ag_cancel_wait(NULL, 10), AG_CANCEL_NONE);
  cr_expect_geq(ag_now_ms() - t0, 9);
}

typedef struct canceller {
  ag_cancel *target;
  int after_ms;
  ag_cancel_reason reason;
} canceller;

static void *cancel_later(void *arg) {
  canceller *k = arg;
  sleep_ms(k->after_ms);
  ag_cancel_cancel(k->target, k->reason);
  return NULL;
}

Test(cancel, wait_wakes_on_cancel_from_another_thread) {
  chain ch = make_chain(INT64_MAX, INT64_MAX);
  canceller k = {ch.user, 30, AG_CANCEL_USER};
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, cancel_later, &k), 0);
  int64_t t0 = ag_now_ms();
  EXPECT_REASON(ag_cancel_wait(ch.attempt, 10000), AG_CANCEL_USER);
  int64_t took = ag_now_ms() - t0;
  pthread_join(th, NULL);
  cr_expect_lt(took, 2000, "woke after %lld ms", (long long)took);
  free_chain(&ch);
}

/* The signal tests hand the token to the handler through a global: a
 * handler has no other way in. */
static ag_cancel *volatile sig_target;

static void on_sigusr1(int sig) {
  (void)sig;
  ag_cancel_cancel(sig_target, AG_CANCEL_USER);
}

static void install_handler(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = on_sigusr1;
  sigemptyset(&sa.sa_mask);
  cr_assert_eq(sigaction(SIGUSR1, &sa, NULL), 0);
}

static void *raise_later(void *arg) {
  (void)arg;
  sleep_ms(30);
  raise(SIGUSR1); /* runs the handler on this thread */
  return NULL;
}

Test(cancel, wait_wakes_on_cancel_from_a_signal_handler) {
  chain ch = make_chain(INT64_MAX, INT64_MAX);
  sig_target = ch.turn;
  install_handler();
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, raise_later, NULL), 0);
  int64_t t0 = ag_now_ms();
  EXPECT_REASON(ag_cancel_wait(ch.attempt, 10000), AG_CANCEL_USER);
  int64_t took = ag_now_ms() - t0;
  pthread_join(th, NULL);
  cr_expect_lt(took, 2000, "woke after %lld ms", (long long)took);
  EXPECT_REASON(ag_cancel_check(ch.user, ag_now_ms()), AG_CANCEL_NONE);
  free_chain(&ch);
}

typedef struct interrupter {
  pthread_t waiter;
} interrupter;

static void *interrupt_later(void *arg) {
  interrupter *in = arg;
  sleep_ms(30);
  pthread_kill(in->waiter, SIGUSR1); /* handler on the waiting thread */
  return NULL;
}

Test(cancel, wait_survives_eintr_and_sees_the_handlers_cancel) {
  ag_cancel *c = new_token(NULL, INT64_MAX, AG_CANCEL_DEADLINE);
  sig_target = c;
  install_handler();
  interrupter in = {pthread_self()};
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, interrupt_later, &in), 0);
  EXPECT_REASON(ag_cancel_wait(c, 10000), AG_CANCEL_USER);
  pthread_join(th, NULL);
  ag_cancel_free(c);
}

static void ignore_signal(int sig) {
  (void)sig;
}

Test(cancel, wait_is_not_ended_by_an_unrelated_signal) {
  ag_cancel *c = new_token(NULL, INT64_MAX, AG_CANCEL_DEADLINE);
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = ignore_signal;
  sigemptyset(&sa.sa_mask);
  cr_assert_eq(sigaction(SIGUSR1, &sa, NULL), 0);
  interrupter in = {pthread_self()};
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, interrupt_later, &in), 0);
  int64_t t0 = ag_now_ms();
  EXPECT_REASON(ag_cancel_wait(c, 80), AG_CANCEL_NONE);
  int64_t took = ag_now_ms() - t0;
  pthread_join(th, NULL);
  cr_expect_geq(took, 79, "EINTR must not cut the wait short (%lld ms)",
                (long long)took);
  ag_cancel_free(c);
}

/* Many threads race to cancel with different reasons: exactly one wins and
 * every reader agrees. */
typedef struct racer {
  ag_cancel *c;
  ag_cancel_reason reason;
  ag_cancel_reason seen;
} racer;

static void *race(void *arg) {
  racer *r = arg;
  ag_cancel_cancel(r->c, r->reason);
  r->seen = ag_cancel_check(r->c, ag_now_ms());
  return NULL;
}

Test(cancel, concurrent_cancels_agree) {
  for (int round = 0; round < 20; round++) {
    ag_cancel *c = new_token(NULL, INT64_MAX, AG_CANCEL_DEADLINE);
    racer rs[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
      rs[i] = (racer){c, (ag_cancel_reason)(1 + i % 3), AG_CANCEL_NONE};
      cr_assert_eq(pthread_create(&th[i], NULL, race, &rs[i]), 0);
    }
    for (int i = 0; i < 4; i++)
      pthread_join(th[i], NULL);
    ag_cancel_reason final = ag_cancel_check(c, ag_now_ms());
    cr_expect_neq(final, AG_CANCEL_NONE);
    for (int i = 0; i < 4; i++)
      EXPECT_REASON(rs[i].seen, final);
    ag_cancel_free(c);
  }
}

/* ------------------------------------------------------------------------ */
/* Resources                                                                */
/* ------------------------------------------------------------------------ */

static int count_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  cr_assert_not_null(d);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL)
    if (e->d_name[0] != '.')
      n++;
  closedir(d);
  return n;
}

Test(cancel, no_fd_leak) {
  int before = count_fds();
  for (int i = 0; i < 1000; i++) {
    ag_cancel *turn = new_token(NULL, INT64_MAX, AG_CANCEL_DEADLINE);
    ag_cancel *att = new_token(turn, 0, AG_CANCEL_TIMEOUT);
    if (i % 2)
      ag_cancel_cancel(turn, AG_CANCEL_USER);
    (void)ag_cancel_check(att, ag_now_ms());
    ag_cancel_free(att);
    ag_cancel_free(turn);
  }
  int after = count_fds();
  cr_expect_eq(after, before, "open fds: %d before, %d after", before, after);
}

Test(cancel, a_token_nobody_polls_holds_no_descriptor) {
  int before = count_fds();
  ag_cancel *t[100];
  for (int i = 0; i < 100; i++) {
    t[i] = new_token(i ? t[i - 1] : NULL, INT64_MAX, AG_CANCEL_DEADLINE);
    ag_cancel_cancel(t[i], AG_CANCEL_USER);
  }
  cr_expect_eq(count_fds(), before, "tokens made eventfds nobody waits on");
  /* asked for, a descriptor exists; freed, it is closed */
  int fds[4];
  cr_assert_eq(ag_cancel_fds(t[99], fds, 4, NULL), 4);
  cr_expect_eq(count_fds(), before + 4);
  for (int i = 99; i >= 0; i--)
    ag_cancel_free(t[i]);
  cr_expect_eq(count_fds(), before);
}

Test(cancel, cancelled_before_its_descriptor_is_made_it_is_readable) {
  ag_cancel *c = new_token(NULL, INT64_MAX, AG_CANCEL_DEADLINE);
  ag_cancel_cancel(c, AG_CANCEL_USER);
  int fd;
  cr_assert_eq(ag_cancel_fds(c, &fd, 1, NULL), 1);
  struct pollfd p = {fd, POLLIN, 0};
  cr_expect_eq(poll(&p, 1, 0), 1, "the late descriptor missed the cancel");
  cr_expect_eq(ag_cancel_wait(c, 5000), AG_CANCEL_USER);
  ag_cancel_free(c);
}

Test(cancel, tokens_are_close_on_exec) {
  ag_cancel *c = new_token(NULL, INT64_MAX, AG_CANCEL_DEADLINE);
  int fd;
  ag_cancel_fds(c, &fd, 1, NULL);
  char path[64], link[128];
  snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", fd);
  FILE *f = fopen(path, "r");
  cr_assert_not_null(f);
  unsigned flags = 0;
  while (fgets(link, sizeof(link), f) != NULL)
    if (sscanf(link, "flags: %o", &flags) == 1)
      break;
  fclose(f);
  cr_expect(flags & 02000000, "O_CLOEXEC not set: flags %o", flags);
  cr_expect(flags & 04000, "O_NONBLOCK not set: flags %o", flags);
  ag_cancel_free(c);
}
