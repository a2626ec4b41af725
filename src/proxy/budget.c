/*
 * src/proxy/budget.c - the cap on the bytes of bodies held whole (budget.h
 * says what and why).
 *
 * `holders` counts the bodies holding bytes, `waiting_holders` those of
 * them that wait for more: when the two are equal no body will give bytes
 * back by itself, and the oldest waiter may go past the cap. Waiters are
 * a FIFO list of their stack nodes; one condition variable wakes them all
 * when something changes (a release, or a waiter leaving the head).
 */
#include "budget.h"

#include <pthread.h>
#include <stdlib.h>

typedef struct waiter {
  struct waiter *next;
  bool holder;
} waiter;

struct ag__budget {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  size_t cap, used;
  size_t holders, waiting_holders;
  waiter *head, *tail;
};

ag__budget *ag__budget_new(size_t cap) {
  ag__budget *b = calloc(1, sizeof(*b));
  if (b == NULL)
    return NULL;
  b->cap = cap;
  if (pthread_mutex_init(&b->mu, NULL) != 0) {
    free(b);
    return NULL;
  }
  if (pthread_cond_init(&b->cv, NULL) != 0) {
    pthread_mutex_destroy(&b->mu);
    free(b);
    return NULL;
  }
  return b;
}

void ag__budget_free(ag__budget *b) {
  if (b == NULL)
    return;
  pthread_cond_destroy(&b->cv);
  pthread_mutex_destroy(&b->mu);
  free(b);
}

/* n bytes taken by a body that held `held` (under mu). */
static void take(ag__budget *b, size_t n, size_t held) {
  b->used += n;
  if (held == 0 && n > 0)
    b->holders++;
}

bool ag__budget_try(ag__budget *b, size_t n, size_t held) {
  pthread_mutex_lock(&b->mu);
  /* waiters first: a newcomer does not overtake them */
  bool ok = b->head == NULL && b->used + n <= b->cap;
  if (ok)
    take(b, n, held);
  pthread_mutex_unlock(&b->mu);
  return ok;
}

void ag__budget_wait(ag__budget *b, size_t n, size_t held) {
  waiter w = {NULL, held > 0};
  pthread_mutex_lock(&b->mu);
  if (b->tail != NULL)
    b->tail->next = &w;
  else
    b->head = &w;
  b->tail = &w;
  if (w.holder) {
    /* the head may go past the cap now that this one waits too */
    b->waiting_holders++;
    pthread_cond_broadcast(&b->cv);
  }
  for (;;) {
    bool first = b->head == &w;
    if (first && (b->used + n <= b->cap || b->holders == b->waiting_holders))
      break;
    pthread_cond_wait(&b->cv, &b->mu);
  }
  b->head = w.next;
  if (b->head == NULL)
    b->tail = NULL;
  if (w.holder)
    b->waiting_holders--;
  take(b, n, held);
  pthread_cond_broadcast(&b->cv); /* the next one is first now */
  pthread_mutex_unlock(&b->mu);
}

void ag__budget_release(ag__budget *b, size_t n, size_t left) {
  if (b == NULL || n == 0)
    return;
  pthread_mutex_lock(&b->mu);
  b->used -= n;
  if (left == 0)
    b->holders--;
  pthread_cond_broadcast(&b->cv);
  pthread_mutex_unlock(&b->mu);
}

size_t ag__budget_used(ag__budget *b) {
  pthread_mutex_lock(&b->mu);
  size_t n = b->used;
  pthread_mutex_unlock(&b->mu);
  return n;
}
