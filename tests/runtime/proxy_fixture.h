/*
 * proxy_fixture.h - what test_proxy's cases share (proxy_fixture.c): a
 * fake upstream U (libmicrohttpd on a free port; it answers each request
 * with the next canned reply and records what it was sent), the proxy
 * under test P (started by the suite's setup), and a libcurl client.
 */
#ifndef AG_TEST_PROXY_FIXTURE_H
#define AG_TEST_PROXY_FIXTURE_H

#include <criterion/criterion.h>
#include <errno.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>
#include <curl/curl.h>
#include <jansson.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>

#include "agentguard.h"
#include "agentguard/proxy.h"
#include "hooks.h" /* the decision and the relay without a connection */
#include "relay.h" /* the proxy's event loop, tested alone (proxy_hardening.c) */

#define MAX_CANNED 16
#define MAX_SEEN 16

typedef struct canned {
  int status;
  char *body;
} canned;

/* A request the fake upstream was sent. */
typedef struct seen {
  char *url, *body, *auth, *agkey, *query, *alt;
  char *sess;          /* x-agentguard-session, which must not come */
  char *team;          /* x-team: an OTLP header */
  char *tp;            /* traceparent */
  char *order, *after; /* a list's paging (order=, after=) */
  int n_tp;            /* traceparent headers */
  int n_xh;            /* headers whose name starts with x-h- */
} seen;

typedef struct fake_upstream {
  struct MHD_Daemon *d;
  int port;
  pthread_mutex_t mu;
  canned replies[MAX_CANNED];
  int n_replies, next;
  seen reqs[MAX_SEEN];
  int n_reqs;
  int n_conns; /* connections the upstream accepted */
} fake_upstream;

extern fake_upstream U;
extern ag_proxy *P;           /* the proxy under test (setup, teardown) */
extern char upstream_url[64]; /* U's base URL */

/* A client's answer. */
typedef struct resp {
  long status;
  char body[65536];
  size_t len;
  char stop[64];
  char upstream_hdr[32];
} resp;

/* The fake upstream: its handler and callbacks (for a daemon of a test's
 * own), its canned replies (canned_call: a reply with one call of `name`,
 * or text when name is NULL), the requests it was sent. */
char *dupz(const char *s);
enum MHD_Result up_handler(void *cls, struct MHD_Connection *c, const char *url,
                           const char *method, const char *version,
                           const char *upload, size_t *upload_size,
                           void **con_cls);
void up_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                  enum MHD_RequestTerminationCode toe);
void up_conn_notify(void *cls, struct MHD_Connection *c, void **socket_ctx,
                    enum MHD_ConnectionNotificationCode code);
void quiet(void *cls, const char *fmt, va_list ap);
void canned_reset(void);
void canned_add(int status, const char *body);
void canned_call(const char *name, const char *args);
int n_upstream(void);
void up_start(void);
/* The proxy under test: the suite's config and options, a proxy started
 * with them; the suite's init and fini. */
ag_config test_cfg(void);
ag_proxy *proxy_with(ag_config cfg, size_t max_body, const char *key);
ag_proxy_opts test_opts(void);
ag_proxy *start_with(const ag_proxy_opts *o);
void setup(void);
void teardown(void);
/* The client: a request to p (call_on: on a handle the caller keeps;
 * extra_header: NULL, one header line or several separated by '\n'), a
 * conversation of n identical calls of `name` each answered by `result`,
 * the message of a Chat Completions answer, the code of an error. */
size_t rbody(char *p, size_t s, size_t n, void *u);
size_t rhdr(char *p, size_t s, size_t n, void *u);
resp *call_on(CURL *h, const ag_proxy *p, const char *method, const char *path,
              const char *body, const char *extra_header);
resp *call(const ag_proxy *p, const char *method, const char *path,
           const char *body, const char *extra_header);
char *conversation(int n, const char *name, const char *args,
                   const char *result);
json_t *message_of(const resp *r);
const char *err_code(const resp *r, char *buf, size_t cap);

/* A large body read by the client (big_write), optionally leaving early. */
typedef struct big_body {
  char *p;
  size_t len, cap;
  int stop_after;  /* > 0: the client leaves once it has this many bytes */
  atomic_int *got; /* if set: bytes read so far, for another thread */
} big_body;
size_t big_write(char *p, size_t s, size_t n, void *u);
/* Waits ms; streams: an answer ends with [DONE], a request asks for a
 * stream, a canned streamed reply with one call; Anthropic Messages: a
 * conversation and a canned reply with one call; the command line
 * (agentguard proxy ARGS, its exit code and stderr); the random turns'
 * generator. */
void nap_ms(long ms);
bool ends_with_done(const resp *r);
char *streaming(char *body);
void canned_stream_call(const char *args);
char *messages_conv(int n, const char *args, const char *result, bool is_error,
                    bool stream);
void canned_message_call(const char *args);
int cli(const char *args, char *err, size_t cap);
extern unsigned long rng_state;
unsigned rnd(unsigned n);

/* A slow streaming upstream (slow_handler): SLOW_CHUNKS text chunks
 * SLOW_GAP_MS apart (each one's send time noted in SLOW), then [DONE];
 * timed_write notes when each chunk reached the client. */
#define SLOW_CHUNKS 5
#define SLOW_GAP_MS 150

typedef struct slow_up {
  int sent;
  double sent_ms[SLOW_CHUNKS];
  char pending[256];
  size_t plen, poff;
} slow_up;

typedef struct timed_body {
  char text[8192];
  size_t len;
  double got_ms[SLOW_CHUNKS];
} timed_body;

extern slow_up SLOW;
double mono_ms(void);
ssize_t slow_reader(void *cls, uint64_t pos, char *buf, size_t max);
enum MHD_Result slow_handler(void *cls, struct MHD_Connection *c,
                             const char *url, const char *method,
                             const char *version, const char *upload,
                             size_t *upload_size, void **con_cls);
size_t timed_write(char *p, size_t s, size_t n, void *u);

#endif
