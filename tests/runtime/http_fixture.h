/*
 * tests/runtime/http_fixture.h - the fixture of test_http_provider (its
 * cases are in test_http_provider.c and http_apis.c): a fake model server
 * on 127.0.0.1 (libmicrohttpd, one thread per connection) that answers
 * from tests/fixtures/ as a plan says and records what the client sent,
 * and the client side: a provider of each kind pointed at it, a history,
 * tools, a request asked.
 */
#ifndef AG_TESTS_HTTP_FIXTURE_H
#define AG_TESTS_HTTP_FIXTURE_H

#include <criterion/criterion.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agentguard.h"

#define SECRET "sk-agentguard-SECRET-0123456789abcdef"

/* How the fake server answers the next request. */
typedef struct plan {
  int status;
  const char *content_type;
  char *body; /* owned */
  size_t body_len;
  size_t chunk;      /* bytes per write (0: all at once) */
  int chunk_ms;      /* pause between writes */
  long cut_at;       /* close the connection after this many bytes (-1) */
  long stall_at;     /* stop sending after this many bytes until stopped */
  bool never_answer; /* accept the request and never answer */
  const char *hdr_name, *hdr_value;
} plan;

typedef struct server {
  struct MHD_Daemon *d;
  int port;
  atomic_bool stop;
  pthread_mutex_t mu;
  plan p;
  int n_requests;
  char *last_body, *last_url, *last_auth, *last_xkey, *last_version,
      *last_accept, *last_custom, *last_alt;
} server;

extern server S;

/* What on_delta gathers of a streamed reply. */
typedef struct deltas {
  char buf[4096];
  size_t len;
  int n;
  bool bad_utf8;
  int stop_after; /* return non-zero at this delta (0: never) */
} deltas;

/* The server's request handler (a test starts a daemon of its own with
 * it). */
enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url,
                        const char *method, const char *version,
                        const char *upload, size_t *upload_size,
                        void **con_cls);
void sleep_ms(int ms);
/* tests/fixtures/REL, read whole (malloc'd). */
char *read_fixture(const char *rel, size_t *len);
/* The suite's init and fini: the server started and stopped. */
void server_start(void);
void server_stop(void);
/* The next answer: a fixture in chunks of `chunk` bytes `chunk_ms` apart
 * (0: at once), or a text with a status. */
void serve_fixture(const char *rel, const char *ctype, size_t chunk,
                   int chunk_ms);
void serve_text(int status, const char *ctype, const char *body);
/* A provider of `kind` pointed at the server (edit: more options, or
 * NULL). */
ag_provider *provider(const char *kind, bool stream,
                      void (*edit)(ag_http_provider_opts *));
void edit_options(ag_http_provider_opts *o);
/* A conversation with two tool calls and their results; two tools. */
json_t *history(void);
json_t *tools(void);
int on_delta(void *user, const char *text, size_t len);
ag_err_t ask(ag_provider *p, const json_t *msgs, const json_t *tl,
             ag_cancel *cancel, deltas *d, ag_reply *r, ag_provider_error *pe);
/* The last request's body, parsed (the caller frees). */
json_t *sent_body(void);
/* The key is in nothing the caller can see, nor in the body sent. */
void no_secret(const ag_provider_error *pe);

#endif
