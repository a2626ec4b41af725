/*
 * src/proxy/conns.c - the proxy's client connections (conns.h says what
 * and why).
 *
 * One list in accept order and one open-addressing table of connections
 * per client address (linear probing, deletion by backward shift; at most
 * `max` addresses hold a counted connection, and the table has twice that
 * many slots), both under one mutex, taken when a connection opens or
 * closes, when one must give way, and by the sweep. A connection's state
 * and times are atomics its own loop stores without the mutex.
 *
 * "Counted" connections hold a slot: admitted and not yet shut down. A
 * connection that is shut (past a deadline, or giving way) stops counting
 * at once, so the next arrival does not make another give way for it
 * while its loop has not closed it yet.
 */
#include "conns.h"

#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define ADDR_LEN 16 /* IPv6, or IPv4 as ::ffff:a.b.c.d */

struct ag__conn {
  ag__conn *prev, *next;
  int fd;
  unsigned char addr[ADDR_LEN];
  bool has_addr, loopback;
  bool counted, shut; /* under the table's mutex */
  ag__conn_refusal refusal;
  atomic_int state;
  atomic_llong since;     /* the state's start */
  atomic_llong req_since; /* the request line's arrival */
};

typedef struct addr_slot {
  unsigned char addr[ADDR_LEN];
  unsigned n; /* 0: free */
} addr_slot;

struct ag__conns {
  pthread_mutex_t mu;
  ag__conns_limits l;
  ag__conn *head, *tail;
  unsigned open, counted, cap;
  atomic_uint n_open; /* `open`, for ag__conns_count without the mutex */
  addr_slot *slots;
  size_t mask; /* slots - 1 */
};

ag__conns *ag__conns_new(const ag__conns_limits *l, unsigned cap) {
  ag__conns *t = calloc(1, sizeof(*t));
  if (t == NULL)
    return NULL;
  t->l = *l;
  t->cap = cap;
  size_t n = 64;
  while (n < 2 * (size_t)l->max)
    n *= 2;
  t->slots = calloc(n, sizeof(*t->slots));
  t->mask = n - 1;
  if (t->slots == NULL || pthread_mutex_init(&t->mu, NULL) != 0) {
    free(t->slots);
    free(t);
    return NULL;
  }
  return t;
}

void ag__conns_free(ag__conns *t) {
  if (t == NULL)
    return;
  ag__conn *c = t->head;
  while (c != NULL) {
    ag__conn *n = c->next;
    free(c);
    c = n;
  }
  pthread_mutex_destroy(&t->mu);
  free(t->slots);
  free(t);
}

/* ---- connections per address (under mu) -------------------------------- */

static size_t addr_hash(const unsigned char *a) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (int i = 0; i < ADDR_LEN; i++)
    h = (h ^ a[i]) * 1099511628211ull;
  return (size_t)(h ^ (h >> 29));
}

/* The slot of `a`: its own, or the free one where it would go. */
static size_t addr_find(const ag__conns *t, const unsigned char *a) {
  size_t i = addr_hash(a) & t->mask;
  while (t->slots[i].n != 0 && memcmp(t->slots[i].addr, a, ADDR_LEN) != 0)
    i = (i + 1) & t->mask;
  return i;
}

static unsigned addr_count(const ag__conns *t, const unsigned char *a) {
  return t->slots[addr_find(t, a)].n;
}

static void addr_add(ag__conns *t, const unsigned char *a) {
  addr_slot *s = &t->slots[addr_find(t, a)];
  if (s->n == 0)
    memcpy(s->addr, a, ADDR_LEN);
  s->n++;
}

static void addr_remove(ag__conns *t, const unsigned char *a) {
  size_t i = addr_find(t, a);
  if (t->slots[i].n == 0 || --t->slots[i].n > 0)
    return;
  /* backward shift: later entries of the run move up if they may */
  size_t j = i;
  for (;;) {
    j = (j + 1) & t->mask;
    if (t->slots[j].n == 0)
      break;
    size_t home = addr_hash(t->slots[j].addr) & t->mask;
    /* j may move to i when its home is not in (i, j] (cyclically) */
    bool stays = i <= j ? (home > i && home <= j) : (home > i || home <= j);
    if (stays)
      continue;
    t->slots[i] = t->slots[j];
    t->slots[j].n = 0;
    i = j;
  }
}

/* ---- slots (under mu) ---------------------------------------------------- */

static bool capped(const ag__conns *t, const ag__conn *c) {
  return t->l.per_client > 0 && c->has_addr &&
         (!c->loopback || t->l.per_client_loopback);
}

/* c stops holding a slot. */
static void uncount(ag__conns *t, ag__conn *c) {
  if (!c->counted)
    return;
  c->counted = false;
  t->counted--;
  if (capped(t, c))
    addr_remove(t, c->addr);
}

static void shut(ag__conns *t, ag__conn *c) {
  if (c->shut)
    return;
  c->shut = true;
  uncount(t, c);
  shutdown(c->fd, SHUT_RDWR);
}

/* The counted connection with no request under way that has waited
 * longest, of address `a` when not NULL; NULL if none. */
static ag__conn *oldest_waiting(const ag__conns *t, const unsigned char *a) {
  ag__conn *best = NULL;
  long long best_since = 0;
  for (ag__conn *c = t->head; c != NULL; c = c->next) {
    if (!c->counted || (a != NULL && memcmp(c->addr, a, ADDR_LEN) != 0))
      continue;
    int s = atomic_load_explicit(&c->state, memory_order_relaxed);
    if (s != AG__CONN_IDLE && s != AG__CONN_HEADERS)
      continue;
    long long since = atomic_load_explicit(&c->since, memory_order_relaxed);
    if (best == NULL || since < best_since) {
      best = c;
      best_since = since;
    }
  }
  return best;
}

static void read_addr(ag__conn *c, const struct sockaddr *sa) {
  if (sa != NULL && sa->sa_family == AF_INET) {
    const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
    memset(c->addr, 0, 10);
    c->addr[10] = c->addr[11] = 0xff;
    memcpy(c->addr + 12, &in->sin_addr, 4);
    c->has_addr = true;
    c->loopback = c->addr[12] == 127;
  } else if (sa != NULL && sa->sa_family == AF_INET6) {
    const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
    memcpy(c->addr, &in6->sin6_addr, ADDR_LEN);
    c->has_addr = true;
    static const unsigned char v4map[12] = {0, 0, 0, 0, 0,    0,
                                            0, 0, 0, 0, 0xff, 0xff};
    c->loopback = IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr) ||
                  (memcmp(c->addr, v4map, 12) == 0 && c->addr[12] == 127);
  }
}

ag__conn *ag__conns_open(ag__conns *t, int fd, const struct sockaddr *sa,
                         int64_t now_ms, ag__conn_refusal *why) {
  ag__conn *c = calloc(1, sizeof(*c));
  if (c == NULL)
    return NULL;
  c->fd = fd;
  read_addr(c, sa);
  atomic_init(&c->state, AG__CONN_IDLE);
  atomic_init(&c->since, now_ms);
  atomic_init(&c->req_since, now_ms);
  pthread_mutex_lock(&t->mu);
  if (t->open >= t->cap) {
    pthread_mutex_unlock(&t->mu);
    free(c);
    return NULL;
  }
  ag__conn_refusal r = AG__CONN_ADMITTED;
  if (capped(t, c) && addr_count(t, c->addr) >= t->l.per_client) {
    ag__conn *give = oldest_waiting(t, c->addr);
    if (give != NULL)
      shut(t, give);
    else
      r = AG__CONN_OVER_PER_CLIENT;
  }
  if (r == AG__CONN_ADMITTED && t->counted >= t->l.max) {
    ag__conn *give = oldest_waiting(t, NULL);
    if (give != NULL)
      shut(t, give);
    else
      r = AG__CONN_OVER_MAX;
  }
  c->refusal = r;
  if (r == AG__CONN_ADMITTED) {
    c->counted = true;
    t->counted++;
    if (capped(t, c))
      addr_add(t, c->addr);
  }
  c->prev = t->tail;
  if (t->tail != NULL)
    t->tail->next = c;
  else
    t->head = c;
  t->tail = c;
  t->open++;
  atomic_store_explicit(&t->n_open, t->open, memory_order_relaxed);
  pthread_mutex_unlock(&t->mu);
  *why = r;
  return c;
}

void ag__conns_close(ag__conns *t, ag__conn *c) {
  if (c == NULL)
    return;
  pthread_mutex_lock(&t->mu);
  uncount(t, c);
  if (c->prev != NULL)
    c->prev->next = c->next;
  else
    t->head = c->next;
  if (c->next != NULL)
    c->next->prev = c->prev;
  else
    t->tail = c->prev;
  t->open--;
  atomic_store_explicit(&t->n_open, t->open, memory_order_relaxed);
  pthread_mutex_unlock(&t->mu);
  free(c);
}

void ag__conns_state(ag__conn *c, ag__conn_state s, int64_t now_ms) {
  if (c == NULL)
    return;
  if (s == AG__CONN_HEADERS)
    atomic_store_explicit(&c->req_since, now_ms, memory_order_relaxed);
  atomic_store_explicit(&c->since, now_ms, memory_order_relaxed);
  atomic_store_explicit(&c->state, (int)s, memory_order_relaxed);
}

ag__conn_refusal ag__conn_refused(const ag__conn *c) {
  return c != NULL ? c->refusal : AG__CONN_OVER_MAX;
}

unsigned ag__conns_sweep(ag__conns *t, int64_t now_ms) {
  unsigned n = 0;
  pthread_mutex_lock(&t->mu);
  for (ag__conn *c = t->head; c != NULL; c = c->next) {
    if (c->shut)
      continue;
    int s = atomic_load_explicit(&c->state, memory_order_relaxed);
    long long since = atomic_load_explicit(&c->since, memory_order_relaxed);
    long long req = atomic_load_explicit(&c->req_since, memory_order_relaxed);
    bool late = (s == AG__CONN_IDLE && now_ms - since > t->l.idle_ms) ||
                (s == AG__CONN_HEADERS && now_ms - req > t->l.header_ms) ||
                (s == AG__CONN_BODY && now_ms - req > t->l.request_ms);
    if (late) {
      shut(t, c);
      n++;
    }
  }
  pthread_mutex_unlock(&t->mu);
  return n;
}

long ag__conns_period_ms(const ag__conns *t) {
  int64_t m = t->l.idle_ms;
  if (t->l.header_ms < m)
    m = t->l.header_ms;
  if (t->l.request_ms < m)
    m = t->l.request_ms;
  m /= 4;
  return m < 20 ? 20 : m > 1000 ? 1000 : (long)m;
}

unsigned ag__conns_count(ag__conns *t) {
  return atomic_load_explicit(&t->n_open, memory_order_relaxed);
}

unsigned ag__conns_busy(ag__conns *t) {
  unsigned n = 0;
  pthread_mutex_lock(&t->mu);
  for (ag__conn *c = t->head; c != NULL; c = c->next) {
    int st = atomic_load_explicit(&c->state, memory_order_relaxed);
    n += st == AG__CONN_BODY || st == AG__CONN_BUSY;
  }
  pthread_mutex_unlock(&t->mu);
  return n;
}
