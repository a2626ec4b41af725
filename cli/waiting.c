/*
 * cli/waiting.c - the "waiting for the model" line (cli/waiting.h).
 *
 * One thread per indicator sleeps on a condition variable (monotonic
 * clock): without a wait until one starts; during one until the next whole
 * second, when it redraws the line ("\r", the text, erase to the end).
 * Everything the line's state holds, and every write of the line, is under
 * the mutex, so clearing it from the turn's thread cannot interleave with a
 * redraw.
 */
#define _GNU_SOURCE
#include "waiting.h"

#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

struct cli_waiting {
  FILE *out;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int64_t since_ms; /* the wait began (monotonic ms), or -1: no wait */
  bool shown;       /* the line is on the terminal */
  bool quit;
};

static int64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void erase_locked(cli_waiting *w) {
  if (w->shown) {
    fputs("\r\033[K", w->out);
    fflush(w->out);
    w->shown = false;
  }
}

static void *ticker(void *arg) {
  cli_waiting *w = arg;
  pthread_mutex_lock(&w->mu);
  while (!w->quit) {
    if (w->since_ms < 0) {
      pthread_cond_wait(&w->cv, &w->mu);
      continue;
    }
    int64_t elapsed = mono_ms() - w->since_ms;
    if (elapsed >= 1000) {
      fprintf(w->out, "\r\033[Kwaiting for the model (%lld s, Ctrl-C cancels)",
              (long long)(elapsed / 1000));
      fflush(w->out);
      w->shown = true;
    }
    /* until the next whole second of the wait */
    int64_t next = w->since_ms + (elapsed / 1000 + 1) * 1000;
    struct timespec ts = {(time_t)(next / 1000), (long)(next % 1000) * 1000000};
    pthread_cond_timedwait(&w->cv, &w->mu, &ts);
  }
  erase_locked(w);
  pthread_mutex_unlock(&w->mu);
  return NULL;
}

cli_waiting *cli_waiting_new(FILE *out) {
  cli_waiting *w = calloc(1, sizeof *w);
  if (w == NULL)
    return NULL;
  w->out = out;
  w->since_ms = -1;
  pthread_condattr_t ca;
  bool ok = pthread_condattr_init(&ca) == 0;
  if (ok) {
    ok = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0 &&
         pthread_cond_init(&w->cv, &ca) == 0;
    pthread_condattr_destroy(&ca);
  }
  if (!ok) {
    free(w);
    return NULL;
  }
  if (pthread_mutex_init(&w->mu, NULL) != 0) {
    pthread_cond_destroy(&w->cv);
    free(w);
    return NULL;
  }
  /* The thread takes no signal: a Ctrl-C must reach the thread that waits
   * for it in ppoll (run's prompt and questions), not wake this one. */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int rc = pthread_create(&w->thread, NULL, ticker, w);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc != 0) {
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w);
    return NULL;
  }
  return w;
}

void cli_waiting_start(cli_waiting *w) {
  if (w == NULL)
    return;
  pthread_mutex_lock(&w->mu);
  erase_locked(w);
  w->since_ms = mono_ms();
  pthread_cond_signal(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

void cli_waiting_clear(cli_waiting *w) {
  if (w == NULL)
    return;
  pthread_mutex_lock(&w->mu);
  erase_locked(w);
  w->since_ms = -1;
  pthread_mutex_unlock(&w->mu);
}

void cli_waiting_free(cli_waiting *w) {
  if (w == NULL)
    return;
  pthread_mutex_lock(&w->mu);
  w->quit = true;
  pthread_cond_signal(&w->cv);
  pthread_mutex_unlock(&w->mu);
  pthread_join(w->thread, NULL);
  pthread_mutex_destroy(&w->mu);
  pthread_cond_destroy(&w->cv);
  free(w);
}
