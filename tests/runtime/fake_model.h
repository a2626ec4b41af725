/*
 * tests/runtime/fake_model.h - a fake OpenAI-compatible model server for the
 * `agentguard run` tests (test_run.c, test_run_tty.c): libmicrohttpd on
 * 127.0.0.1, a thread per connection, in the test's own process.
 *
 * Request k gets reply k of the script (the last one repeats), after
 * delay_ms[k] milliseconds if that is set (a slow model; fake_stop ends the
 * wait at once). When if_body_has is set and a request's body contains it,
 * that request gets then_reply instead (a model that reacts to what it was
 * told). The server keeps every body it received.
 *
 * The state is one global, F, set by the test before it starts the program
 * and read after (n_requests and the bodies under F.mu while the program
 * still runs; fake_wait_requests and fake_body take it).
 */
#ifndef AG_TEST_FAKE_MODEL_H
#define AG_TEST_FAKE_MODEL_H

#include <microhttpd.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

#define MAX_REPLIES 8
#define FAKE_MAX_REQUESTS 64 /* bodies kept one by one (all in `bodies`) */

typedef struct fake_model {
  struct MHD_Daemon *d;
  int port;
  pthread_mutex_t mu;
  pthread_cond_t cv; /* a request arrived, or fake_stop began */
  const char *replies[MAX_REPLIES];
  int n_replies;
  int delay_ms[MAX_REPLIES]; /* request k waits this long before replying */
  const char *if_body_has, *then_reply;
  int n_requests;
  char *bodies; /* every request body, concatenated, each ended by '\n' */
  size_t bodies_len;
  size_t body_start[FAKE_MAX_REQUESTS + 1]; /* body k: [start[k], start[k+1]) */
  bool stopping;
} fake_model;

extern fake_model F;

/* Starts the server on a free port (F.port); asserts it started. */
void fake_start(void);
/* Ends every delayed reply, stops the server, frees the bodies. A second
 * call does nothing. */
void fake_stop(void);
/* Waits until at least n requests arrived or timeout_ms passed; returns
 * F.n_requests at that point. */
int fake_wait_requests(int n, int timeout_ms);
/* A copy of request k's body (caller frees), or NULL when there is none. */
char *fake_body(int k);

#define CALL_REPLY(name, args_json)                                            \
  "{\"id\":\"x\",\"object\":\"chat.completion\",\"created\":1,\"model\":"      \
  "\"fake-model\",\"choices\":[{\"index\":0,\"message\":{\"role\":"            \
  "\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":"    \
  "\"function\",\"function\":{\"name\":\"" name "\",\"arguments\":" args_json  \
  "}}]},\"finish_reason\":\"tool_calls\"}],\"usage\":{\"prompt_tokens\":"      \
  "100,\"completion_tokens\":10,\"total_tokens\":110}}"
#define TEXT_REPLY(text)                                                       \
  "{\"id\":\"y\",\"object\":\"chat.completion\",\"created\":1,\"model\":"      \
  "\"fake-model\",\"choices\":[{\"index\":0,\"message\":{\"role\":"            \
  "\"assistant\",\"content\":\"" text "\"},\"finish_reason\":\"stop\"}],"      \
  "\"usage\":{\"prompt_tokens\":120,\"completion_tokens\":5,"                  \
  "\"total_tokens\":125}}"

#endif
