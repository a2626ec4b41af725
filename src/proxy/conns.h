/*
 * src/proxy/conns.h - the proxy's client connections: who may hold a slot,
 * for how long, and who gives one up when all are taken (conns.c;
 * docs/security.md, "The proxy").
 *
 * Every client connection is in one table, over all event loops, with its
 * state and since when:
 *
 *   state    from                       until               deadline
 *   IDLE     accept, or its last        the request line    idle_ms
 *            request's end              is in
 *   HEADERS  the request line           the headers are in  header_ms
 *   BODY     the headers (the key       the body is in      request_ms, from
 *            checked, the target too)                       the request line
 *   BUSY     the body                   the answer is sent  none (the
 *                                                           upstream's limit)
 *
 * A connection past its deadline is shut down (shutdown(2): its loop then
 * reads the end and closes it) by ag__conns_sweep, which any loop runs.
 * libmicrohttpd's own timeout starts again on every byte, so a client that
 * sends one header byte a second would hold its slot for ever; these
 * deadlines do not move.
 *
 * Slots: at most `max` connections are served. A new one past it takes the
 * slot of the connection that has waited longest without a request under
 * way (IDLE or HEADERS: nothing is lost but an idle keep-alive or a
 * request not yet sent, which clients retry on a new connection), so idle
 * and slow connections cannot lock a client out; only when every slot is
 * BODY or BUSY is the new one refused (503). A client address may hold at
 * most `per_client` connections (0: no cap); past it the address's own
 * oldest waiting connection gives way, or the new one is refused. The cap
 * leaves loopback addresses alone unless `per_client_loopback`: every local
 * client shares 127.0.0.1, so there it would cap the proxy itself.
 *
 * Thread-safety: the table has one mutex; ag__conns_state is a store on the
 * connection alone (atomics). A connection is shut down only while it is
 * in the table, and its loop takes it out (ag__conns_close, from
 * libmicrohttpd's "closed" notification, which comes before the socket is
 * closed) under the same mutex, so a shut socket is never another's.
 */
#ifndef AG_PROXY_CONNS_H
#define AG_PROXY_CONNS_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

typedef enum ag__conn_state {
  AG__CONN_IDLE,
  AG__CONN_HEADERS,
  AG__CONN_BODY,
  AG__CONN_BUSY
} ag__conn_state;

/* Why a connection was refused. */
typedef enum ag__conn_refusal {
  AG__CONN_ADMITTED,
  AG__CONN_OVER_MAX,       /* every slot is serving a request */
  AG__CONN_OVER_PER_CLIENT /* its address holds per_client, all busy */
} ag__conn_refusal;

typedef struct ag__conns_limits {
  unsigned max;             /* connections served at once, >= 1 */
  unsigned per_client;      /* per client address; 0: no cap */
  bool per_client_loopback; /* the cap applies to loopback addresses too */
  int64_t idle_ms;          /* each > 0 */
  int64_t header_ms;
  int64_t request_ms;
} ag__conns_limits;

typedef struct ag__conns ag__conns;
typedef struct ag__conn ag__conn;

/* A table for at most `cap` connections open at once (admitted or being
 * refused; the caller's event loops hold no more). NULL when out of
 * memory. */
ag__conns *ag__conns_new(const ag__conns_limits *l, unsigned cap);
void ag__conns_free(ag__conns *t);

/* A new connection (its socket, its peer address, may be NULL), IDLE from
 * `now_ms` (monotonic). *why says whether it was admitted; a refused one
 * is still in the table until ag__conns_close. NULL when out of memory
 * or past `cap` (refuse the connection). */
ag__conn *ag__conns_open(ag__conns *t, int fd, const struct sockaddr *sa,
                         int64_t now_ms, ag__conn_refusal *why);
/* The connection is closing (its loop's thread): out of the table, freed. */
void ag__conns_close(ag__conns *t, ag__conn *c);
/* The connection moves to `s` at now_ms; BODY keeps the time HEADERS
 * began (request_ms counts from the request line). */
void ag__conns_state(ag__conn *c, ag__conn_state s, int64_t now_ms);
ag__conn_refusal ag__conn_refused(const ag__conn *c);

/* Shuts down every connection past its deadline; returns how many. */
unsigned ag__conns_sweep(ag__conns *t, int64_t now_ms);
/* How often ag__conns_sweep should run, in ms. */
long ag__conns_period_ms(const ag__conns *t);
/* Connections with a request under way (BODY or BUSY), under the mutex. */
unsigned ag__conns_busy(ag__conns *t);

/* Connections in the table (open, counted or not); no lock taken. */
unsigned ag__conns_count(ag__conns *t);

#endif
