/*
 * test_proxy.c - the guard proxy (src/proxy/) in-process, in front of a
 * fake upstream (libmicrohttpd, canned replies in order), with libcurl as
 * the client: every decision path of docs/proxy.md.
 */
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
#include "relay.h" /* the proxy's event loop, tested alone below */

/* ------------------------------------------------------------------------ */
/* The fake upstream                                                        */
/* ------------------------------------------------------------------------ */

#define MAX_CANNED 16
#define MAX_SEEN 16

typedef struct canned {
  int status;
  char *body;
} canned;

typedef struct seen {
  char *url, *body, *auth, *agkey, *query, *alt;
  char *sess; /* x-agentguard-session, which must not come */
  char *team; /* x-team: an OTLP header */
  char *tp;   /* traceparent */
} seen;

static struct {
  struct MHD_Daemon *d;
  int port;
  pthread_mutex_t mu;
  canned replies[MAX_CANNED];
  int n_replies, next;
  seen reqs[MAX_SEEN];
  int n_reqs;
  int n_conns; /* connections the upstream accepted */
} U;

typedef struct conn {
  char *body;
  size_t len;
} conn;

static char *dupz(const char *s) {
  return s != NULL ? strdup(s) : NULL;
}

static enum MHD_Result up_handler(void *cls, struct MHD_Connection *c,
                                  const char *url, const char *method,
                                  const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls) {
  (void)cls;
  (void)method;
  (void)version;
  conn *k = *con_cls;
  if (k == NULL) {
    *con_cls = calloc(1, sizeof(conn));
    return MHD_YES;
  }
  if (*upload_size > 0) {
    k->body = realloc(k->body, k->len + *upload_size + 1);
    memcpy(k->body + k->len, upload, *upload_size);
    k->len += *upload_size;
    k->body[k->len] = '\0';
    *upload_size = 0;
    return MHD_YES;
  }
  pthread_mutex_lock(&U.mu);
  if (U.n_reqs < MAX_SEEN) {
    seen *s = &U.reqs[U.n_reqs++];
    s->url = dupz(url);
    s->body = dupz(k->body != NULL ? k->body : "");
    s->auth =
        dupz(MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization"));
    s->agkey = dupz(
        MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-agentguard-key"));
    s->query = dupz(MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "q"));
    s->alt = dupz(MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "alt"));
    s->sess = dupz(MHD_lookup_connection_value(c, MHD_HEADER_KIND,
                                               "x-agentguard-session"));
    s->team = dupz(MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-team"));
    s->tp =
        dupz(MHD_lookup_connection_value(c, MHD_HEADER_KIND, "traceparent"));
  }
  canned r = {500, "{\"error\":{\"message\":\"no canned reply left\"}}"};
  if (U.next < U.n_replies)
    r = U.replies[U.next++];
  else if (U.n_replies > 0)
    r = U.replies[U.n_replies - 1];
  struct MHD_Response *resp = MHD_create_response_from_buffer(
      strlen(r.body), r.body, MHD_RESPMEM_MUST_COPY);
  pthread_mutex_unlock(&U.mu);
  MHD_add_response_header(resp, "Content-Type",
                          strncmp(r.body, "data:", 5) == 0
                              ? "text/event-stream"
                              : "application/json");
  MHD_add_response_header(resp, "X-Upstream", "fake");
  enum MHD_Result ret = MHD_queue_response(c, (unsigned)r.status, resp);
  MHD_destroy_response(resp);
  return ret;
}

static void up_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
  (void)cls;
  (void)c;
  (void)toe;
  conn *k = *con_cls;
  if (k != NULL) {
    free(k->body);
    free(k);
  }
  *con_cls = NULL;
}

static void up_conn_notify(void *cls, struct MHD_Connection *c,
                           void **socket_ctx,
                           enum MHD_ConnectionNotificationCode code) {
  (void)cls, (void)c, (void)socket_ctx;
  if (code != MHD_CONNECTION_NOTIFY_STARTED)
    return;
  pthread_mutex_lock(&U.mu);
  U.n_conns++;
  pthread_mutex_unlock(&U.mu);
}

static void quiet(void *cls, const char *fmt, va_list ap) {
  (void)cls;
  (void)fmt;
  (void)ap;
}

static void canned_reset(void) {
  pthread_mutex_lock(&U.mu);
  for (int i = 0; i < U.n_replies; i++)
    free(U.replies[i].body);
  for (int i = 0; i < U.n_reqs; i++) {
    free(U.reqs[i].url);
    free(U.reqs[i].body);
    free(U.reqs[i].auth);
    free(U.reqs[i].agkey);
    free(U.reqs[i].query);
    free(U.reqs[i].alt);
    free(U.reqs[i].sess);
    free(U.reqs[i].team);
    free(U.reqs[i].tp);
  }
  U.n_replies = U.next = U.n_reqs = 0;
  pthread_mutex_unlock(&U.mu);
}

static void canned_add(int status, const char *body) {
  pthread_mutex_lock(&U.mu);
  cr_assert_lt(U.n_replies, MAX_CANNED);
  U.replies[U.n_replies].status = status;
  U.replies[U.n_replies].body = strdup(body);
  U.n_replies++;
  pthread_mutex_unlock(&U.mu);
}

/* A Chat Completions reply with one call, or text when name is NULL. */
static void canned_call(const char *name, const char *args) {
  json_t *msg =
      name != NULL
          ? json_pack("{s:s, s:n, s:[{s:s, s:s, s:{s:s, s:s}}]}", "role",
                      "assistant", "content", "tool_calls", "id", "call_up",
                      "type", "function", "function", "name", name, "arguments",
                      args)
          : json_pack("{s:s, s:s}", "role", "assistant", "content", args);
  json_t *o = json_pack(
      "{s:s, s:s, s:i, s:s, s:[{s:i, s:o, s:s}], s:{s:i, s:i, s:i}}", "id",
      "chatcmpl-up", "object", "chat.completion", "created", 1, "model", "m",
      "choices", "index", 0, "message", msg, "finish_reason",
      name != NULL ? "tool_calls" : "stop", "usage", "prompt_tokens", 10,
      "completion_tokens", 5, "total_tokens", 15);
  char *t = json_dumps(o, JSON_COMPACT);
  canned_add(200, t);
  free(t);
  json_decref(o);
}

static int n_upstream(void) {
  pthread_mutex_lock(&U.mu);
  int n = U.n_reqs;
  pthread_mutex_unlock(&U.mu);
  return n;
}

static void up_start(void) {
  memset(&U, 0, sizeof U);
  pthread_mutex_init(&U.mu, NULL);
  U.d = MHD_start_daemon(
      MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION |
          MHD_USE_ERROR_LOG,
      0, NULL, NULL, up_handler, NULL, MHD_OPTION_NOTIFY_COMPLETED,
      up_completed, NULL, MHD_OPTION_NOTIFY_CONNECTION, up_conn_notify, NULL,
      MHD_OPTION_EXTERNAL_LOGGER, quiet, NULL, MHD_OPTION_END);
  cr_assert_not_null(U.d);
  U.port = MHD_get_daemon_info(U.d, MHD_DAEMON_INFO_BIND_PORT)->port;
  setenv("NO_PROXY", "127.0.0.1,localhost", 1);
  setenv("no_proxy", "127.0.0.1,localhost", 1);
}

/* ------------------------------------------------------------------------ */
/* The proxy and the client                                                 */
/* ------------------------------------------------------------------------ */

static ag_proxy *P;
static char upstream_url[64];

static ag_config test_cfg(void) {
  ag_config c;
  cr_assert_eq(ag_config_preset(&c, "default", NULL), AG_OK);
  c.loop.identical_call_limit = 3;
  c.loop.nudge_before_stop = false;
  c.loop.final_request_without_tools = false;
  c.errors.max_consecutive_errors = 2;
  return c;
}

static ag_proxy *proxy_with(ag_config cfg, size_t max_body, const char *key) {
  ag_proxy_opts o;
  ag_proxy_opts_init(&o);
  o.port = 0;
  o.upstream = upstream_url;
  o.cfg = cfg;
  o.max_body = max_body;
  o.client_key = key;
  ag_proxy *p = NULL;
  ag_error_t err;
  cr_assert_eq(ag_proxy_start(&p, &o, &err), AG_OK, "%s", err.msg);
  return p;
}

/* The options proxy_with uses, for a test to change some before
 * start_with. */
static ag_proxy_opts test_opts(void) {
  ag_proxy_opts o;
  ag_proxy_opts_init(&o);
  o.port = 0;
  o.upstream = upstream_url;
  o.cfg = test_cfg();
  return o;
}

static ag_proxy *start_with(const ag_proxy_opts *o) {
  ag_proxy *p = NULL;
  ag_error_t err;
  cr_assert_eq(ag_proxy_start(&p, o, &err), AG_OK, "%s", err.msg);
  return p;
}

static void setup(void) {
  up_start();
  snprintf(upstream_url, sizeof upstream_url, "http://127.0.0.1:%d/v1", U.port);
  P = proxy_with(test_cfg(), 0, NULL);
}

static void teardown(void) {
  ag_proxy_stop(P);
  P = NULL;
  MHD_stop_daemon(U.d);
  canned_reset();
  pthread_mutex_destroy(&U.mu);
}

TestSuite(proxy, .init = setup, .fini = teardown, .timeout = 60);

typedef struct resp {
  long status;
  char body[65536];
  size_t len;
  char stop[64];
  char upstream_hdr[32];
} resp;

static size_t rbody(char *p, size_t s, size_t n, void *u) {
  resp *r = u;
  size_t k = s * n;
  if (r->len + k >= sizeof r->body)
    return 0;
  memcpy(r->body + r->len, p, k);
  r->len += k;
  r->body[r->len] = '\0';
  return k;
}

static size_t rhdr(char *p, size_t s, size_t n, void *u) {
  resp *r = u;
  size_t k = s * n;
  char line[256];
  snprintf(line, sizeof line, "%.*s", (int)(k < 255 ? k : 255), p);
  line[strcspn(line, "\r\n")] = '\0';
  if (strncasecmp(line, "x-agentguard-stop: ", 19) == 0)
    snprintf(r->stop, sizeof r->stop, "%.63s", line + 19);
  if (strncasecmp(line, "x-upstream: ", 12) == 0)
    snprintf(r->upstream_hdr, sizeof r->upstream_hdr, "%.31s", line + 12);
  return k;
}

/* A request on the client handle h (its connection kept for the next). */
static resp *call_on(CURL *h, const ag_proxy *p, const char *method,
                     const char *path, const char *body,
                     const char *extra_header) {
  resp *r = calloc(1, sizeof *r);
  char url[256];
  snprintf(url, sizeof url, "http://127.0.0.1:%u%s", (unsigned)ag_proxy_port(p),
           path);
  struct curl_slist *hs = curl_slist_append(NULL, "Authorization: Bearer "
                                                  "sk-client-secret");
  hs = curl_slist_append(hs, "Content-Type: application/json");
  if (extra_header != NULL)
    hs = curl_slist_append(hs, extra_header);
  curl_easy_setopt(h, CURLOPT_URL, url);
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, hs);
  curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
  if (body != NULL)
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
  else
    curl_easy_setopt(h, CURLOPT_HTTPGET,
                     1L); /* a used handle may have posted */
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, rbody);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, r);
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, rhdr);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, r);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 20000L);
  CURLcode cc = curl_easy_perform(h);
  cr_assert_eq(cc, CURLE_OK, "%s", curl_easy_strerror(cc));
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r->status);
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, NULL);
  curl_slist_free_all(hs);
  return r;
}

static resp *call(const ag_proxy *p, const char *method, const char *path,
                  const char *body, const char *extra_header) {
  CURL *h = curl_easy_init();
  resp *r = call_on(h, p, method, path, body, extra_header);
  curl_easy_cleanup(h);
  return r;
}

/* A conversation: a user message, then `n` rounds of the call name(args)
 * answered by `result`; tools offered. Caller frees. */
static char *conversation(int n, const char *name, const char *args,
                          const char *result) {
  json_t *msgs = json_pack("[{s:s, s:s}, {s:s, s:s}]", "role", "system",
                           "content", "You are helpful.", "role", "user",
                           "content", "Read the file.");
  for (int i = 0; i < n; i++) {
    char id[32];
    snprintf(id, sizeof id, "call_%d", i);
    json_array_append_new(
        msgs,
        json_pack("{s:s, s:n, s:[{s:s, s:s, s:{s:s, s:s}}]}", "role",
                  "assistant", "content", "tool_calls", "id", id, "type",
                  "function", "function", "name", name, "arguments", args));
    json_array_append_new(msgs,
                          json_pack("{s:s, s:s, s:s}", "role", "tool",
                                    "tool_call_id", id, "content", result));
  }
  json_t *o =
      json_pack("{s:s, s:o, s:[{s:s, s:{s:s, s:{s:s}}}]}", "model", "m",
                "messages", msgs, "tools", "type", "function", "function",
                "name", name, "parameters", "type", "object");
  char *t = json_dumps(o, JSON_COMPACT);
  json_decref(o);
  return t;
}

static json_t *message_of(const resp *r) {
  json_t *j = json_loads(r->body, 0, NULL);
  cr_assert_not_null(j, "not JSON: %s", r->body);
  json_t *m = json_object_get(json_array_get(json_object_get(j, "choices"), 0),
                              "message");
  cr_assert(json_is_object(m), "no message: %s", r->body);
  json_incref(m);
  json_decref(j);
  return m;
}

static const char *err_code(const resp *r, char *buf, size_t cap) {
  json_t *j = json_loads(r->body, 0, NULL);
  cr_assert_not_null(j, "not JSON: %s", r->body);
  json_t *e = json_object_get(j, "error");
  cr_assert(json_is_string(json_object_get(e, "message")), "%s", r->body);
  cr_assert(json_is_string(json_object_get(e, "type")), "%s", r->body);
  snprintf(buf, cap, "%s", json_string_value(json_object_get(e, "code")));
  json_decref(j);
  return buf;
}

/* ------------------------------------------------------------------------ */
/* Tests                                                                    */
/* ------------------------------------------------------------------------ */

Test(proxy, other_paths_pass_through_with_credentials) {
  canned_add(200, "{\"object\":\"list\",\"data\":[]}");
  resp *r = call(P, "GET", "/v1/models?q=a%20b", NULL, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect_str_eq(r->body, "{\"object\":\"list\",\"data\":[]}");
  cr_expect_str_eq(r->upstream_hdr, "fake");
  cr_expect_str_empty(r->stop);
  cr_assert_eq(n_upstream(), 1);
  cr_expect_str_eq(U.reqs[0].url, "/v1/models");
  cr_expect_str_eq(U.reqs[0].query, "a b");
  cr_expect_str_eq(U.reqs[0].auth, "Bearer sk-client-secret");
  free(r);
}

Test(proxy, allowed_reply_is_forwarded_unchanged) {
  canned_call("read", "{\"path\":\"b\"}");
  char *body = conversation(1, "read", "{\"path\":\"a\"}", "text of a");
  resp *r = call(P, "POST", "/v1/chat/completions", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect_str_eq(r->body, U.replies[0].body);
  cr_expect_str_empty(r->stop);
  cr_assert_eq(n_upstream(), 1);
  cr_expect_str_eq(U.reqs[0].body, body, "the body goes upstream as it came");
  cr_expect_str_eq(U.reqs[0].auth, "Bearer sk-client-secret");
  free(body);
  free(r);
}

Test(proxy, repeated_call_in_reply_is_replaced_by_stop) {
  /* two identical calls in the history, the reply asks for the third */
  canned_call("read", "{\"path\":\"a\"}");
  char *body = conversation(2, "read", "{\"path\":\"a\"}", "text of a");
  resp *r = call(P, "POST", "/v1/chat/completions", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect_str_eq(r->stop, "identical_calls");
  json_t *m = message_of(r);
  cr_expect_null(json_object_get(m, "tool_calls"), "no call reaches the "
                                                   "client");
  cr_expect(strstr(json_string_value(json_object_get(m, "content")),
                   "agentguard stopped this turn (identical_calls)") != NULL,
            "%s", r->body);
  json_decref(m);
  free(body);
  free(r);
}

Test(proxy, reordered_keys_are_still_the_same_call) {
  canned_call("read", "{\"b\":2,\"a\":1}");
  char *body = conversation(2, "read", "{\"a\":1,\"b\":2}", "same");
  resp *r = call(P, "POST", "/v1/chat/completions", body, NULL);
  cr_expect_str_eq(r->stop, "identical_calls");
  free(body);
  free(r);
}

Test(proxy, nudge_asks_upstream_again) {
  ag_proxy_stop(P);
  ag_config c = test_cfg();
  c.loop.nudge_before_stop = true;
  P = proxy_with(c, 0, NULL);
  canned_call("read", "{\"path\":\"a\"}");
  canned_call(NULL, "The file says: text of a.");
  char *body = conversation(2, "read", "{\"path\":\"a\"}", "text of a");
  resp *r = call(P, "POST", "/v1/chat/completions", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect_str_empty(r->stop);
  cr_expect_str_eq(r->body, U.replies[1].body, "the re-asked reply");
  cr_assert_eq(n_upstream(), 2);
  json_t *sent = json_loads(U.reqs[1].body, 0, NULL);
  json_t *msgs = json_object_get(sent, "messages");
  json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
  cr_expect_str_eq(json_string_value(json_object_get(last, "role")), "tool");
  cr_expect_str_eq(json_string_value(json_object_get(last, "tool_call_id")),
                   "call_up");
  cr_expect(strlen(json_string_value(json_object_get(last, "content"))) > 0);
  json_decref(sent);
  free(body);
  free(r);
}

Test(proxy, nudge_then_same_call_stops) {
  ag_proxy_stop(P);
  ag_config c = test_cfg();
  c.loop.nudge_before_stop = true;
  P = proxy_with(c, 0, NULL);
  canned_call("read", "{\"path\":\"a\"}");
  canned_call("read", "{\"path\":\"a\"}");
  char *body = conversation(2, "read", "{\"path\":\"a\"}", "text of a");
  resp *r = call(P, "POST", "/v1/chat/completions", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect_str_eq(r->stop, "identical_calls");
  cr_expect_eq(n_upstream(), 2);
  json_t *m = message_of(r);
  cr_expect_null(json_object_get(m, "tool_calls"));
  json_decref(m);
  free(body);
  free(r);
}

Test(proxy, replayed_errors_stop_before_forwarding) {
  /* max_consecutive_errors 2: the third failing iteration stops */
  ag_proxy_stop(P);
  ag_config c = test_cfg();
  c.loop.identical_call_limit = 0;
  P = proxy_with(c, 0, NULL);
  char *body =
      conversation(3, "read", "{\"path\":\"x\"}", "Error: no such file");
  resp *r = call(P, "POST", "/v1/chat/completions", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect_eq(n_upstream(), 0, "nothing goes upstream");
  cr_expect_str_eq(r->stop, "consecutive_errors");
  json_t *m = message_of(r);
  cr_expect(strstr(json_string_value(json_object_get(m, "content")),
                   "agentguard stopped this turn") != NULL);
  json_decref(m);
  free(body);
  free(r);
}

Test(proxy, replayed_stop_with_final_request_without_tools) {
  ag_proxy_stop(P);
  ag_config c = test_cfg();
  c.loop.final_request_without_tools = true;
  c.loop.identical_call_limit = 0;
  FILE *log = tmpfile();
  cr_assert_not_null(log);
  ag_proxy_opts o = test_opts();
  o.cfg = c;
  o.access_log = log;
  o.access_log_json = true;
  P = start_with(&o);
  canned_call(NULL, "I could not read x: it does not exist.");
  char *body =
      conversation(3, "read", "{\"path\":\"x\"}", "Error: no such file");
  resp *r = call(P, "POST", "/v1/chat/completions", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect_str_eq(r->stop, "consecutive_errors");
  cr_assert_eq(n_upstream(), 1);
  json_t *sent = json_loads(U.reqs[0].body, 0, NULL);
  cr_expect_null(json_object_get(sent, "tools"), "tools removed");
  json_t *msgs = json_object_get(sent, "messages");
  json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
  cr_expect(strstr(json_string_value(json_object_get(last, "content")),
                   "Do not call tools") != NULL);
  json_decref(sent);
  json_t *m = message_of(r);
  cr_expect_str_eq(json_string_value(json_object_get(m, "content")),
                   "I could not read x: it does not exist.");
  json_decref(m);
  free(body);
  free(r);
  /* the final request's upstream time and tokens are the request's */
  ag_proxy_stop(P);
  P = NULL;
  rewind(log);
  char line[2048] = "";
  cr_assert_not_null(fgets(line, sizeof line, log));
  json_t *l = json_loads(line, 0, NULL);
  cr_assert_not_null(l, "%s", line);
  cr_expect_str_eq(json_string_value(json_object_get(l, "decision")),
                   "final_request_without_tools");
  cr_expect_eq(json_integer_value(json_object_get(l, "input_tokens")), 10);
  cr_expect_eq(json_integer_value(json_object_get(l, "output_tokens")), 5);
  cr_expect(json_is_integer(json_object_get(l, "upstream_ms")), "%s", line);
  json_decref(l);
  fclose(log);
}

Test(proxy, malformed_json_is_400) {
  resp *r = call(P, "POST", "/v1/chat/completions", "{\"messages\": [", NULL);
  char code[64];
  cr_expect_eq(r->status, 400);
  cr_expect_str_eq(err_code(r, code, sizeof code), "invalid_json");
  cr_expect_eq(n_upstream(), 0);
  free(r);
  r = call(P, "POST", "/v1/chat/completions", "{\"model\":\"m\"}", NULL);
  cr_expect_eq(r->status, 400);
  cr_expect_str_eq(err_code(r, code, sizeof code), "invalid_request");
  cr_expect(strstr(r->body, "messages") != NULL);
  free(r);
  /* a tool reply without its call */
  r = call(P, "POST", "/v1/chat/completions",
           "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},"
           "{\"role\":\"assistant\",\"content\":\"x\"},"
           "{\"role\":\"tool\",\"tool_call_id\":\"nope\",\"content\":\"r\"}]}",
           NULL);
  cr_expect_eq(r->status, 400);
  cr_expect(strstr(r->body, "nope") != NULL, "%s", r->body);
  free(r);
}

Test(proxy, upstream_errors_pass_through) {
  canned_add(429, "{\"error\":{\"message\":\"slow down\",\"type\":\"rate\"}}");
  char *body = conversation(0, "read", "{}", "");
  resp *r = call(P, "POST", "/v1/chat/completions", body, NULL);
  cr_expect_eq(r->status, 429);
  cr_expect_str_eq(r->body,
                   "{\"error\":{\"message\":\"slow down\",\"type\":\"rate\"}}");
  free(body);
  free(r);
}

Test(proxy, upstream_down_is_502) {
  ag_proxy_stop(P);
  MHD_stop_daemon(U.d);
  U.d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD, 0, NULL, NULL,
                         up_handler, NULL, MHD_OPTION_END);
  int port = MHD_get_daemon_info(U.d, MHD_DAEMON_INFO_BIND_PORT)->port;
  MHD_stop_daemon(U.d); /* the port is now closed */
  U.d = NULL;
  snprintf(upstream_url, sizeof upstream_url, "http://127.0.0.1:%d", port);
  P = proxy_with(test_cfg(), 0, NULL);
  char *body = conversation(0, "read", "{}", "");
  resp *r = call(P, "POST", "/v1/chat/completions", body, NULL);
  char code[64];
  cr_expect_eq(r->status, 502);
  cr_expect_str_eq(err_code(r, code, sizeof code), "upstream_unreachable");
  cr_expect(strstr(r->body, upstream_url) != NULL, "%s", r->body);
  free(r);
  r = call(P, "GET", "/v1/models", NULL, NULL);
  cr_expect_eq(r->status, 502);
  free(r);
  free(body);
  U.d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD, 0, NULL, NULL,
                         up_handler, NULL, MHD_OPTION_END);
}

Test(proxy, body_cap_is_413) {
  ag_proxy_stop(P);
  P = proxy_with(test_cfg(), 1024, NULL);
  char *body = conversation(20, "read", "{\"path\":\"a long path name\"}",
                            "some result text that takes room");
  cr_assert_gt(strlen(body), 1024);
  resp *r = call(P, "POST", "/v1/chat/completions", body, NULL);
  char code[64];
  cr_expect_eq(r->status, 413);
  cr_expect_str_eq(err_code(r, code, sizeof code), "body_too_large");
  cr_expect_eq(n_upstream(), 0);
  free(r);
  free(body);
}

Test(proxy, client_key_required_and_not_forwarded) {
  ag_proxy_stop(P);
  P = proxy_with(test_cfg(), 0, "k3y");
  canned_add(200, "{}");
  resp *r = call(P, "GET", "/v1/models", NULL, NULL);
  cr_expect_eq(r->status, 401);
  cr_expect_eq(n_upstream(), 0);
  free(r);
  r = call(P, "GET", "/v1/models", NULL, "x-agentguard-key: wrong");
  cr_expect_eq(r->status, 401);
  free(r);
  r = call(P, "GET", "/v1/models", NULL, "x-agentguard-key: k3y");
  cr_expect_eq(r->status, 200);
  cr_assert_eq(n_upstream(), 1);
  cr_expect_null(U.reqs[0].agkey, "the proxy's key stays here");
  free(r);
}

Test(proxy, other_addresses_need_a_client_key) {
  ag_proxy_opts o;
  ag_proxy_opts_init(&o);
  o.listen_host = "0.0.0.0";
  o.port = 0;
  o.upstream = upstream_url;
  ag_proxy *p = NULL;
  ag_error_t err;
  cr_expect_eq(ag_proxy_start(&p, &o, &err), AG_EINVAL);
  cr_expect_null(p);
  cr_expect(strstr(err.msg, "--client-key-env") != NULL, "%s", err.msg);
  o.listen_host = "127.0.0.1";
  o.upstream = "ftp://x";
  cr_expect_eq(ag_proxy_start(&p, &o, &err), AG_EINVAL);
}

Test(proxy, max_connections_out_of_range_is_refused) {
  ag_proxy_opts o;
  ag_proxy_opts_init(&o);
  o.port = 0;
  o.upstream = upstream_url;
  const int bad[] = {-1, AG_PROXY_MAX_CONNECTIONS_LIMIT + 1};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ag_proxy *p = NULL;
    ag_error_t err;
    o.max_connections = bad[i];
    cr_expect_eq(ag_proxy_start(&p, &o, &err), AG_EINVAL, "%d", bad[i]);
    cr_expect_null(p);
    cr_expect(strstr(err.msg, "--max-connections") != NULL, "%s", err.msg);
    ag_proxy_stop(p);
  }
  ag_proxy *p = NULL;
  ag_error_t err;
  o.max_connections = AG_PROXY_MAX_CONNECTIONS_LIMIT;
  cr_expect_eq(ag_proxy_start(&p, &o, &err), AG_OK, "%s", err.msg);
  ag_proxy_stop(p);
}

/* The process's descriptor table, as /proc/self/status says (FDSize). */
static long fd_table_size(void) {
  FILE *f = fopen("/proc/self/status", "r");
  if (f == NULL)
    return -1;
  char line[256];
  long n = -1;
  while (fgets(line, sizeof line, f) != NULL)
    if (strncmp(line, "FDSize:", 7) == 0)
      n = strtol(line + 7, NULL, 10);
  fclose(f);
  return n;
}

/* ag_proxy_start grows the descriptor table for every connection it may
 * serve (two descriptors each), so that the kernel does not grow it (an
 * RCU grace period that stalls every loop opening a descriptor) while the
 * proxy serves; within the soft RLIMIT_NOFILE. */
Test(proxy, start_grows_the_descriptor_table) {
  long before = fd_table_size();
  if (before < 0)
    cr_skip_test("no /proc/self/status");
  /* more connections than the table holds now (the test process may have
   * grown it already), and a soft limit that allows them */
  int limit = (int)before;
  rlim_t need = 4 * (rlim_t)limit + 1024;
  struct rlimit rl;
  cr_assert_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need) {
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < need)
      cr_skip_test("RLIMIT_NOFILE's hard limit %lu is under %lu",
                   (unsigned long)rl.rlim_max, (unsigned long)need);
    rl.rlim_cur = need;
    cr_assert_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
  }
  ag_proxy_opts o;
  ag_proxy_opts_init(&o);
  o.port = 0;
  o.upstream = upstream_url;
  o.max_connections = limit;
  ag_proxy *p = NULL;
  ag_error_t err;
  cr_assert_eq(ag_proxy_start(&p, &o, &err), AG_OK, "%s", err.msg);
  long after = fd_table_size();
  cr_expect_geq(after, 2 * (long)limit, "FDSize %ld (before the proxy: %ld)",
                after, before);
  ag_proxy_stop(p);
}

/*
 * An agent loop in the test: ask, run every call (the same result each
 * time), ask again, until a reply without calls. The decisions (stop
 * header per request) of proxies[k % n] must equal one proxy's.
 */
static int run_loop(ag_proxy *const *proxies, int n, char stops[][64],
                    int max_steps) {
  char *first = conversation(0, "read", "{}", "");
  json_t *req = json_loads(first, 0, NULL);
  free(first);
  int steps = 0;
  for (; steps < max_steps; steps++) {
    char *body = json_dumps(req, JSON_COMPACT);
    resp *r =
        call(proxies[steps % n], "POST", "/v1/chat/completions", body, NULL);
    free(body);
    snprintf(stops[steps], 64, "%ld:%.40s", r->status, r->stop);
    json_t *m = message_of(r);
    free(r);
    json_t *tcs = json_object_get(m, "tool_calls");
    json_array_append(json_object_get(req, "messages"), m);
    if (json_array_size(tcs) == 0) {
      json_decref(m);
      steps++;
      break;
    }
    json_array_append_new(
        json_object_get(req, "messages"),
        json_pack("{s:s, s:O, s:s}", "role", "tool", "tool_call_id",
                  json_object_get(json_array_get(tcs, 0), "id"), "content",
                  "same result"));
    json_decref(m);
  }
  json_decref(req);
  return steps;
}

Test(proxy, stateless_replicas_decide_alike) {
  ag_proxy *q = proxy_with(test_cfg(), 0, NULL);
  char one[8][64], two[8][64];
  memset(one, 0, sizeof one);
  memset(two, 0, sizeof two);
  canned_call("read", "{\"path\":\"a\"}");
  ag_proxy *single[1] = {P};
  int n1 = run_loop(single, 1, one, 8);
  canned_reset();
  canned_call("read", "{\"path\":\"a\"}");
  ag_proxy *pair[2] = {P, q};
  int n2 = run_loop(pair, 2, two, 8);
  cr_expect_eq(n1, 3, "two calls run, the third is stopped");
  cr_expect_eq(n1, n2);
  for (int i = 0; i < n1; i++)
    cr_expect_str_eq(one[i], two[i], "request %d", i);
  cr_expect_str_eq(two[n2 - 1], "200:identical_calls");
  ag_proxy_stop(q);
}

/* ---- stream: true ------------------------------------------------------ */

/* An upstream stream: "Hello", " world", then a call read(args) in two
 * fragments, the finish reason, a usage chunk, [DONE]. */
static void canned_stream_call(const char *args) {
  size_t half = strlen(args) / 2;
  char *b = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&b, &n);
  const char *head = "{\"id\":\"chatcmpl-s\",\"object\":\"chat.completion."
                     "chunk\",\"created\":1,\"model\":\"m\",\"choices\":";
  fprintf(f,
          "data: %s[{\"index\":0,\"delta\":{\"role\":\"assistant\","
          "\"content\":\"Hello\"},\"finish_reason\":null}]}\n\n",
          head);
  fprintf(f,
          "data: %s[{\"index\":0,\"delta\":{\"content\":\" world\"},"
          "\"finish_reason\":null}]}\n\n",
          head);
  json_t *a1 = json_stringn(args, half), *a2 = json_string(args + half);
  char *s1 = json_dumps(a1, JSON_ENCODE_ANY),
       *s2 = json_dumps(a2, JSON_ENCODE_ANY);
  fprintf(f,
          "data: %s[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,"
          "\"id\":\"call_s\",\"type\":\"function\",\"function\":{\"name\":"
          "\"read\",\"arguments\":%s}}]},\"finish_reason\":null}]}\n\n",
          head, s1);
  fprintf(f,
          "data: %s[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,"
          "\"function\":{\"arguments\":%s}}]},\"finish_reason\":null}]}\n\n",
          head, s2);
  fprintf(f,
          "data: %s[{\"index\":0,\"delta\":{},\"finish_reason\":"
          "\"tool_calls\"}]}\n\n",
          head);
  fprintf(f,
          "data: %s[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":"
          "5,\"total_tokens\":15}}\n\ndata: [DONE]\n\n",
          head);
  fclose(f);
  canned_add(200, b);
  free(b);
  free(s1);
  free(s2);
  json_decref(a1);
  json_decref(a2);
}

static char *streaming(char *body) {
  json_t *j = json_loads(body, 0, NULL);
  free(body);
  json_object_set_new(j, "stream", json_true());
  char *t = json_dumps(j, JSON_COMPACT);
  json_decref(j);
  return t;
}

static bool ends_with_done(const resp *r) {
  return r->len >= 14 && strcmp(r->body + r->len - 14, "data: [DONE]\n\n") == 0;
}

Test(proxy, stream_allowed_relays_text_then_calls) {
  canned_stream_call("{\"path\":\"b\"}");
  char *body =
      streaming(conversation(1, "read", "{\"path\":\"a\"}", "text of a"));
  resp *r = call(P, "POST", "/v1/chat/completions", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect_str_empty(r->stop);
  char *hello = strstr(r->body, "Hello"), *calls = strstr(r->body, "call_s");
  cr_expect(hello != NULL && calls != NULL && hello < calls, "%s", r->body);
  cr_expect(strstr(r->body, "\"tool_calls\"}") != NULL, "finish reason kept");
  cr_expect(strstr(r->body, "\"usage\"") != NULL, "usage kept");
  cr_expect(ends_with_done(r), "%s", r->body);
  json_t *sent = json_loads(U.reqs[0].body, 0, NULL);
  cr_expect(json_is_true(json_object_get(sent, "stream")));
  json_decref(sent);
  free(body);
  free(r);
}

Test(proxy, stream_repeated_call_is_replaced) {
  canned_stream_call("{\"path\":\"a\"}");
  char *body =
      streaming(conversation(2, "read", "{\"path\":\"a\"}", "text of a"));
  resp *r = call(P, "POST", "/v1/chat/completions", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect(strstr(r->body, "Hello") != NULL, "the text went through");
  cr_expect(strstr(r->body, "call_s") == NULL, "the call is held back: %s",
            r->body);
  cr_expect(strstr(r->body, "agentguard stopped this turn (identical_calls)") !=
                NULL,
            "%s", r->body);
  cr_expect(strstr(r->body, "\"finish_reason\":\"stop\"") != NULL);
  cr_expect(ends_with_done(r));
  free(body);
  free(r);
}

/* A stream whose calls earn a nudge: the text went out as it came; at the
 * end the proxy asks again (not streamed, the nudge answering the held
 * call, from the client's own request) and the new reply is the
 * stream's end. */
Test(proxy, stream_nudge_asks_upstream_again) {
  ag_proxy_stop(P);
  ag_config c = test_cfg();
  c.loop.nudge_before_stop = true;
  P = proxy_with(c, 0, NULL);
  canned_stream_call("{\"path\":\"a\"}");
  canned_call(NULL, "The file says: text of a.");
  char *body =
      streaming(conversation(2, "read", "{\"path\":\"a\"}", "text of a"));
  resp *r = call(P, "POST", "/v1/chat/completions", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect(strstr(r->body, "call_s") == NULL, "the call is held back: %s",
            r->body);
  char *hello = strstr(r->body, "Hello");
  char *again = strstr(r->body, "The file says: text of a.");
  cr_expect(hello != NULL && again != NULL && hello < again, "%s", r->body);
  cr_expect(strstr(r->body, "\"finish_reason\":\"stop\"") != NULL, "%s",
            r->body);
  cr_expect(ends_with_done(r), "%s", r->body);
  cr_assert_eq(n_upstream(), 2);
  json_t *sent = json_loads(U.reqs[1].body, 0, NULL);
  cr_expect(json_is_false(json_object_get(sent, "stream")));
  json_t *msgs = json_object_get(sent, "messages");
  cr_expect_eq(json_array_size(msgs), 2 + 2 * 2 + 2,
               "the client's messages, the held call and the nudge");
  json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
  cr_expect_str_eq(json_string_value(json_object_get(last, "role")), "tool");
  cr_expect_str_eq(json_string_value(json_object_get(last, "tool_call_id")),
                   "call_s");
  json_decref(sent);
  free(body);
  free(r);
}

/* A streamed request is decided on its event loop when its body is small;
 * a larger one (here 100 KiB) goes to a worker, which hands the stream to
 * the loop: relayed the same way. */
Test(proxy, stream_with_a_large_body_is_relayed) {
  canned_stream_call("{\"path\":\"b\"}");
  char *small =
      streaming(conversation(1, "read", "{\"path\":\"a\"}", "text of a"));
  json_t *j = json_loads(small, 0, NULL);
  free(small);
  char *pad = malloc(100 * 1024 + 1);
  cr_assert_not_null(pad);
  memset(pad, 'x', 100 * 1024);
  pad[100 * 1024] = '\0';
  json_object_set_new(json_array_get(json_object_get(j, "messages"), 0),
                      "content", json_string(pad));
  free(pad);
  char *body = json_dumps(j, JSON_COMPACT);
  json_decref(j);
  cr_assert_gt(strlen(body), 100 * 1024);
  resp *r = call(P, "POST", "/v1/chat/completions", body, NULL);
  cr_expect_eq(r->status, 200);
  char *hello = strstr(r->body, "Hello"), *calls = strstr(r->body, "call_s");
  cr_expect(hello != NULL && calls != NULL && hello < calls, "%s", r->body);
  cr_expect(ends_with_done(r), "%s", r->body);
  cr_assert_eq(n_upstream(), 1);
  cr_expect_eq(strlen(U.reqs[0].body), strlen(body), "sent as it came");
  free(body);
  free(r);
}

/* A streamed request whose replayed turn stops, with the final request
 * without tools: that request waits for the upstream's whole reply, so
 * the loop leaves it to a worker; the client gets the answer as a
 * stream. */
Test(proxy, stream_replayed_stop_with_final_request_is_a_stream) {
  ag_proxy_stop(P);
  ag_config c = test_cfg();
  c.loop.final_request_without_tools = true;
  c.loop.identical_call_limit = 0;
  P = proxy_with(c, 0, NULL);
  canned_call(NULL, "I could not read x: it does not exist.");
  char *body = streaming(
      conversation(3, "read", "{\"path\":\"x\"}", "Error: no such file"));
  resp *r = call(P, "POST", "/v1/chat/completions", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect_str_eq(r->stop, "consecutive_errors");
  cr_assert_eq(n_upstream(), 1);
  json_t *sent = json_loads(U.reqs[0].body, 0, NULL);
  cr_expect_null(json_object_get(sent, "tools"), "tools removed");
  cr_expect(json_is_false(json_object_get(sent, "stream")), "asked whole");
  json_decref(sent);
  cr_expect(strncmp(r->body, "data: {", 7) == 0, "%s", r->body);
  cr_expect(strstr(r->body, "I could not read x: it does not exist.") != NULL,
            "%s", r->body);
  cr_expect(ends_with_done(r), "%s", r->body);
  free(body);
  free(r);
}

/* A streamed reply whose second tool call has no name: the stream ends
 * with an error event that says so (it said "out of memory", and the
 * first call's copy leaked). Run without a connection
 * (ag_proxy_relay_replay), the relayed stream's own code. */
Test(proxy, stream_call_without_a_name_is_an_error_event) {
  const char *up =
      "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":"
      "1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":"
      "[{\"index\":0,\"id\":\"call_a\",\"type\":\"function\",\"function\":{"
      "\"name\":\"read\",\"arguments\":\"{}\"}},{\"index\":1,\"id\":"
      "\"call_b\",\"type\":\"function\",\"function\":{\"arguments\":\"{}\"}}"
      "]},\"finish_reason\":\"tool_calls\"}]}\n\ndata: [DONE]\n\n";
  ag_config c = test_cfg();
  char *out = NULL;
  size_t n = 0;
  cr_assert_eq(
      ag_proxy_relay_replay(&c, false, up, strlen(up), 40, 0, &out, &n), 0);
  cr_expect(strstr(out, "\"error\"") != NULL, "%s", out);
  cr_expect(strstr(out, "no function name") != NULL, "%s", out);
  cr_expect(strstr(out, "call_a") == NULL, "the calls are held: %s", out);
  free(out);
}

/* SSE lets an event's data span several "data:" lines (joined with a line
 * break); the proxy sends such an event on several lines too. One line
 * holding the break ended the event early: the client's reader saw "{"
 * as the data and a stray field after it. */
Test(proxy, stream_event_of_two_data_lines_stays_two_lines) {
  const char *up =
      "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":"
      "1,\"model\":\"m\",\n"
      "data: \"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"},"
      "\"finish_reason\":null}]}\n\n"
      "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":"
      "1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},"
      "\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";
  ag_config c = test_cfg();
  char *out = NULL;
  size_t n = 0;
  cr_assert_eq(ag_proxy_relay_replay(&c, false, up, strlen(up), 0, 0, &out, &n),
               0);
  const char *two = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\","
                    "\"created\":1,\"model\":\"m\",\ndata: \"choices\":";
  cr_expect(strncmp(out, two, strlen(two)) == 0, "%s", out);
  cr_expect(strstr(out, "\n\n\n") == NULL, "no empty event: %s", out);
  cr_expect(strstr(out, "data: [DONE]\n\n") != NULL, "%s", out);
  free(out);
}

/* The chunks of a streamed Chat Completions reply, one "data:" event each,
 * then [DONE]: malloc'd. */
static char *chunk_stream(const char *const *chunks, size_t n) {
  char *b = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&b, &len);
  cr_assert_not_null(f);
  for (size_t i = 0; i < n; i++)
    fprintf(f, "data: %s\n\n", chunks[i]);
  fputs("data: [DONE]\n\n", f);
  fclose(f);
  return b;
}

/* What the client reads from `up`, replayed both ways, must be the same;
 * returns the tape's (malloc'd). */
static char *replay_both_ways(const char *up) {
  ag_config c = test_cfg();
  char *tape = NULL, *tree = NULL;
  size_t tn = 0, rn = 0;
  cr_assert_eq(
      ag_proxy_relay_replay(&c, false, up, strlen(up), 0, 0, &tape, &tn), 0);
  cr_assert_eq(ag_proxy_relay_replay(&c, false, up, strlen(up), 0,
                                     AG_PROXY_REPLAY_TREE, &tree, &rn),
               0);
  cr_expect(tn == rn && memcmp(tape, tree, tn) == 0, "tape:\n%s\ntree:\n%s",
            tape, tree);
  free(tree);
  return tape;
}

#define CHUNK_HEAD                                                             \
  "{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,"          \
  "\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{"
#define CHUNK_TAIL "},\"logprobs\":null,\"finish_reason\":null}]}"

/* A chunk that carries only text is read from the tokenizer's tape, not as
 * a jansson tree (fast_chunk); the client must get the same bytes either
 * way, for the shapes the tape takes and for the near misses it leaves to
 * the tree: a choice "index" other than the integer 0, a duplicate key, a
 * usage object, a refusal, an integer jansson cannot hold, "\u0000". */
Test(proxy, stream_text_chunks_read_from_the_tape_as_from_a_tree) {
  static const char *const chunks[] = {
      CHUNK_HEAD
      "\"role\":\"assistant\",\"content\":\"\",\"refusal\":null" CHUNK_TAIL,
      CHUNK_HEAD "\"content\":\"Hello\"" CHUNK_TAIL,
      CHUNK_HEAD
      "\"content\":\" w\\u00f6rld \\\"quoted\\\"\\n\\ud83d\\ude00\"" CHUNK_TAIL,
      CHUNK_HEAD "\"content\":null" CHUNK_TAIL,
      CHUNK_HEAD "\"content\":\"x\",\"content\":\"y\"" CHUNK_TAIL,
      CHUNK_HEAD "\"refusal\":\"no\"" CHUNK_TAIL,
      "{\"id\":\"c\",\"choices\":[{\"index\":1,\"delta\":{\"content\":"
      "\"second choice\"},\"finish_reason\":null}]}",
      "{\"id\":\"c\",\"choices\":[{\"index\":0.0,\"delta\":{\"content\":"
      "\" zero\"},\"finish_reason\":null}]}",
      "{\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":"
      "\" more\"},\"finish_reason\":null}],\"usage\":{\"prompt_tokens\":3,"
      "\"completion_tokens\":4}}",
      "{\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{},"
      "\"finish_reason\":\"stop\"}]}",
  };
  char *up = chunk_stream(chunks, sizeof chunks / sizeof chunks[0]);
  char *out = replay_both_ways(up);
  /* the text chunks went on as they came */
  cr_expect(strstr(out, chunks[1]) != NULL, "%s", out);
  cr_expect(strstr(out, chunks[2]) != NULL, "%s", out);
  cr_expect(strstr(out, "data: [DONE]\n\n") != NULL, "%s", out);
  free(out);
  free(up);
  /* what jansson refuses - "\u0000", an integer past 64 bits - ends the
   * stream with the same error event either way */
  static const char *const refused[][2] = {
      {CHUNK_HEAD "\"content\":\"Hi\"" CHUNK_TAIL,
       CHUNK_HEAD "\"content\":\"a\\u0000b\"" CHUNK_TAIL},
      {CHUNK_HEAD "\"content\":\"Hi\"" CHUNK_TAIL,
       "{\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":"
       "\" big\"},\"finish_reason\":null,\"n\":12345678901234567890}]}"},
  };
  for (size_t k = 0; k < 2; k++) {
    up = chunk_stream(refused[k], 2);
    out = replay_both_ways(up);
    cr_expect(strstr(out, "\"error\"") != NULL, "%s", out);
    cr_expect(strstr(out, "Hi") != NULL, "%s", out);
    free(out);
    free(up);
  }
}

Test(proxy, stream_content_loop_ends_the_stream) {
  char *b = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&b, &n);
  for (int i = 0; i < 60; i++)
    fprintf(f, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\","
               "\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,"
               "\"delta\":{\"content\":\"I will check the file again to be "
               "sure it is right. \"},\"finish_reason\":null}]}\n\n");
  fprintf(f, "data: [DONE]\n\n");
  fclose(f);
  canned_add(200, b);
  free(b);
  char *body = streaming(conversation(0, "read", "{}", ""));
  resp *r = call(P, "POST", "/v1/chat/completions", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect(strstr(r->body, "agentguard stopped this turn (content_loop)") !=
                NULL,
            "%s", r->body);
  int relayed = 0;
  for (const char *q = r->body; (q = strstr(q, "to be sure")) != NULL; q++)
    relayed++;
  cr_expect_lt(relayed, 60, "the loop was cut short");
  cr_expect(ends_with_done(r));
  free(body);
  free(r);
}

Test(proxy, stream_replayed_stop_is_a_stream) {
  ag_proxy_stop(P);
  ag_config c = test_cfg();
  c.loop.identical_call_limit = 0;
  P = proxy_with(c, 0, NULL);
  char *body = streaming(
      conversation(3, "read", "{\"path\":\"x\"}", "Error: no such file"));
  resp *r = call(P, "POST", "/v1/chat/completions", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect_eq(n_upstream(), 0);
  cr_expect_str_eq(r->stop, "consecutive_errors");
  cr_expect(strncmp(r->body, "data: {", 7) == 0, "%s", r->body);
  cr_expect(strstr(r->body, "chat.completion.chunk") != NULL);
  cr_expect(ends_with_done(r));
  free(body);
  free(r);
}

Test(proxy, stream_upstream_error_passes_through) {
  canned_add(401, "{\"error\":{\"message\":\"bad key\"}}");
  char *body = streaming(conversation(0, "read", "{}", ""));
  resp *r = call(P, "POST", "/v1/chat/completions", body, NULL);
  cr_expect_eq(r->status, 401);
  cr_expect_str_eq(r->body, "{\"error\":{\"message\":\"bad key\"}}");
  free(body);
  free(r);
}

/* A slow streaming upstream: SLOW_CHUNKS text chunks SLOW_GAP_MS apart
 * (each one's send time noted), then [DONE]. */
#define SLOW_CHUNKS 5
#define SLOW_GAP_MS 150

static double mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

typedef struct slow_up {
  int sent;
  double sent_ms[SLOW_CHUNKS];
  char pending[256];
  size_t plen, poff;
} slow_up;

static ssize_t slow_reader(void *cls, uint64_t pos, char *buf, size_t max) {
  (void)pos;
  slow_up *s = cls;
  if (s->poff == s->plen) {
    if (s->sent > SLOW_CHUNKS)
      return MHD_CONTENT_READER_END_OF_STREAM;
    if (s->sent > 0) {
      struct timespec ts = {0, SLOW_GAP_MS * 1000000L};
      nanosleep(&ts, NULL);
    }
    if (s->sent < SLOW_CHUNKS) {
      s->plen = (size_t)snprintf(
          s->pending, sizeof s->pending,
          "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\","
          "\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":"
          "{\"content\":\"<w%d>\"},\"finish_reason\":null}]}\n\n",
          s->sent);
      s->sent_ms[s->sent] = mono_ms();
    } else {
      s->plen = (size_t)snprintf(
          s->pending, sizeof s->pending,
          "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\","
          "\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":"
          "{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n");
    }
    s->sent++;
    s->poff = 0;
  }
  size_t n = s->plen - s->poff < max ? s->plen - s->poff : max;
  memcpy(buf, s->pending + s->poff, n);
  s->poff += n;
  return (ssize_t)n;
}

static slow_up SLOW;

static enum MHD_Result slow_handler(void *cls, struct MHD_Connection *c,
                                    const char *url, const char *method,
                                    const char *version, const char *upload,
                                    size_t *upload_size, void **con_cls) {
  (void)cls, (void)url, (void)method, (void)version, (void)upload;
  if (*con_cls == NULL) {
    *con_cls = c;
    return MHD_YES;
  }
  if (*upload_size > 0) {
    *upload_size = 0;
    return MHD_YES;
  }
  struct MHD_Response *r = MHD_create_response_from_callback(
      MHD_SIZE_UNKNOWN, 1024, slow_reader, &SLOW, NULL);
  MHD_add_response_header(r, "Content-Type", "text/event-stream");
  enum MHD_Result ret = MHD_queue_response(c, 200, r);
  MHD_destroy_response(r);
  return ret;
}

typedef struct timed_body {
  char text[8192];
  size_t len;
  double got_ms[SLOW_CHUNKS];
} timed_body;

static size_t timed_write(char *p, size_t s, size_t n, void *u) {
  timed_body *t = u;
  size_t k = s * n;
  if (t->len + k >= sizeof t->text)
    return 0;
  memcpy(t->text + t->len, p, k);
  t->len += k;
  t->text[t->len] = '\0';
  for (int i = 0; i < SLOW_CHUNKS; i++) {
    char tag[16];
    snprintf(tag, sizeof tag, "<w%d>", i);
    if (t->got_ms[i] == 0 && strstr(t->text, tag) != NULL)
      t->got_ms[i] = mono_ms();
  }
  return k;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Each chunk reaches the client as soon as the upstream sent it: the relay
 * never waits for the upstream's next event (before the fix every chunk
 * waited for the next one, up to 100 ms). */
Test(proxy, stream_chunks_are_relayed_as_they_arrive) {
  memset(&SLOW, 0, sizeof SLOW);
  struct MHD_Daemon *d = MHD_start_daemon(
      MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION, 0, NULL,
      NULL, slow_handler, NULL, MHD_OPTION_EXTERNAL_LOGGER, quiet, NULL,
      MHD_OPTION_END);
  cr_assert_not_null(d);
  ag_proxy_stop(P);
  snprintf(upstream_url, sizeof upstream_url, "http://127.0.0.1:%u",
           (unsigned)MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT)->port);
  P = proxy_with(test_cfg(), 0, NULL);
  char url[128];
  snprintf(url, sizeof url, "http://127.0.0.1:%u/v1/chat/completions",
           (unsigned)ag_proxy_port(P));
  char *body = streaming(conversation(0, "read", "{}", ""));
  timed_body *t = calloc(1, sizeof *t);
  CURL *h = curl_easy_init();
  curl_easy_setopt(h, CURLOPT_URL, url);
  curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, timed_write);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, t);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 20000L);
  CURLcode cc = curl_easy_perform(h);
  long status = 0;
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
  curl_easy_cleanup(h);
  MHD_stop_daemon(d);
  cr_assert_eq(cc, CURLE_OK, "%s", curl_easy_strerror(cc));
  cr_assert_eq(status, 200, "%s", t->text);
  cr_expect(strstr(t->text, "data: [DONE]") != NULL, "%s", t->text);
  double delay[SLOW_CHUNKS];
  for (int i = 0; i < SLOW_CHUNKS; i++) {
    cr_assert_gt(t->got_ms[i], 0, "chunk %d never came: %s", i, t->text);
    delay[i] = t->got_ms[i] - SLOW.sent_ms[i];
  }
  qsort(delay, SLOW_CHUNKS, sizeof delay[0], cmp_double);
  /* the median of five: one slow moment on a busy machine does not count */
  cr_expect_lt(delay[SLOW_CHUNKS / 2], 50.0,
               "a chunk reached the client %.1f ms (median) after the "
               "upstream sent it (%.1f .. %.1f)",
               delay[SLOW_CHUNKS / 2], delay[0], delay[SLOW_CHUNKS - 1]);
  free(t);
  free(body);
}

/* ---- Streams the client does not keep up with, leaves, or that the
 * proxy's stop cuts ------------------------------------------------------- */

/* An upstream that streams `chunks` text chunks of `bytes` random letters
 * (each tagged <k>), `gap_ms` apart, then [DONE]; it notes when its response is
 * let go of (the transfer ended, or the proxy closed the connection). */
typedef struct long_up {
  int chunks, bytes, gap_ms;
  int pad; /* bytes of padding in another field of each chunk */
  atomic_int sent;
  atomic_llong freed_ms; /* ag_now_ms(); 0 until freed */
} long_up;

typedef struct long_conn {
  long_up *u;
  int sent;
  unsigned long long rng;
  char *pending;
  size_t plen, poff;
} long_conn;

static void nap_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static ssize_t long_reader(void *cls, uint64_t pos, char *buf, size_t max) {
  (void)pos;
  long_conn *k = cls;
  if (k->poff == k->plen) {
    if (k->sent > k->u->chunks)
      return MHD_CONTENT_READER_END_OF_STREAM;
    if (k->sent > 0 && k->u->gap_ms > 0) {
      struct timespec ts = {0, k->u->gap_ms * 1000000L};
      nanosleep(&ts, NULL);
    }
    if (k->sent < k->u->chunks) {
      int n = snprintf(k->pending, 256,
                       "data: {\"id\":\"c\",\"object\":\"chat.completion."
                       "chunk\",\"created\":1,\"model\":\"m\",\"x_pad\":\"");
      memset(k->pending + n, 'p', (size_t)k->u->pad);
      n += k->u->pad;
      n += snprintf(k->pending + n, 256,
                    "\",\"choices\":[{\"index\":0,\"delta\":{\"content\":"
                    "\"<k>");
      /* letters that never repeat: the content-loop detector stays quiet */
      for (int i = 0; i < k->u->bytes; i++) {
        k->rng = k->rng * 6364136223846793005ULL + 1442695040888963407ULL;
        k->pending[n + i] = (char)('a' + (k->rng >> 33) % 26);
      }
      n += k->u->bytes;
      n += snprintf(k->pending + n, 64, "\"},\"finish_reason\":null}]}\n\n");
      k->plen = (size_t)n;
      atomic_fetch_add(&k->u->sent, 1);
    } else {
      k->plen = (size_t)snprintf(
          k->pending, 256,
          "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\","
          "\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,"
          "\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n");
    }
    k->sent++;
    k->poff = 0;
  }
  size_t n = k->plen - k->poff < max ? k->plen - k->poff : max;
  memcpy(buf, k->pending + k->poff, n);
  k->poff += n;
  return (ssize_t)n;
}

static void long_free(void *cls) {
  long_conn *k = cls;
  atomic_store(&k->u->freed_ms, (long long)ag_now_ms());
  free(k->pending);
  free(k);
}

static enum MHD_Result long_handler(void *cls, struct MHD_Connection *c,
                                    const char *url, const char *method,
                                    const char *version, const char *upload,
                                    size_t *upload_size, void **con_cls) {
  (void)url, (void)method, (void)version, (void)upload;
  if (*con_cls == NULL) {
    *con_cls = c;
    return MHD_YES;
  }
  if (*upload_size > 0) {
    *upload_size = 0;
    return MHD_YES;
  }
  long_conn *k = calloc(1, sizeof *k);
  k->u = cls;
  k->pending = malloc(768 + (size_t)k->u->bytes + (size_t)k->u->pad);
  struct MHD_Response *r = MHD_create_response_from_callback(
      MHD_SIZE_UNKNOWN, 16384, long_reader, k, long_free);
  MHD_add_response_header(r, "Content-Type", "text/event-stream");
  enum MHD_Result ret = MHD_queue_response(c, 200, r);
  MHD_destroy_response(r);
  return ret;
}

/* Starts a long_up upstream and a proxy in front of it (P replaced). */
static struct MHD_Daemon *long_start(long_up *u) {
  struct MHD_Daemon *d = MHD_start_daemon(
      MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION, 0, NULL,
      NULL, long_handler, u, MHD_OPTION_EXTERNAL_LOGGER, quiet, NULL,
      MHD_OPTION_END);
  cr_assert_not_null(d);
  ag_proxy_stop(P);
  snprintf(upstream_url, sizeof upstream_url, "http://127.0.0.1:%u",
           (unsigned)MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT)->port);
  P = proxy_with(test_cfg(), 0, NULL);
  return d;
}

typedef struct big_body {
  char *p;
  size_t len, cap;
  int stop_after;  /* > 0: the client leaves once it has this many bytes */
  atomic_int *got; /* if set: bytes read so far, for another thread */
} big_body;

static size_t big_write(char *p, size_t s, size_t n, void *u) {
  big_body *b = u;
  size_t k = s * n;
  if (b->stop_after > 0 && b->len >= (size_t)b->stop_after)
    return 0; /* the client goes away */
  if (b->len + k + 1 > b->cap) {
    b->cap = (b->len + k + 1) * 2;
    b->p = realloc(b->p, b->cap);
  }
  memcpy(b->p + b->len, p, k);
  b->len += k;
  b->p[b->len] = '\0';
  if (b->got != NULL)
    atomic_store(b->got, (int)b->len);
  return k;
}

/* A small receive buffer for a slow client: on loopback the kernel lets a
 * socket's buffer grow to tcp_rmem's maximum (32 MiB here), which held a
 * whole stream for the slow client, so the proxy never saw it was slow
 * (and the stop test saw [DONE] arrive from the buffer after the stop). */
static int small_rcvbuf(void *user, curl_socket_t fd, curlsocktype purpose) {
  (void)user;
  (void)purpose;
  int sz = 64 << 10;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz);
  return CURL_SOCKOPT_OK;
}

static CURLcode long_get(big_body *b, long max_recv_speed) {
  char url[128];
  snprintf(url, sizeof url, "http://127.0.0.1:%u/v1/chat/completions",
           (unsigned)ag_proxy_port(P));
  char *body = streaming(conversation(0, "read", "{}", ""));
  CURL *h = curl_easy_init();
  curl_easy_setopt(h, CURLOPT_URL, url);
  curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, big_write);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, b);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 30000L);
  if (max_recv_speed > 0) {
    curl_easy_setopt(h, CURLOPT_MAX_RECV_SPEED_LARGE,
                     (curl_off_t)max_recv_speed);
    curl_easy_setopt(h, CURLOPT_SOCKOPTFUNCTION, small_rcvbuf);
  }
  CURLcode cc = curl_easy_perform(h);
  curl_easy_cleanup(h);
  free(body);
  return cc;
}

static int count_of(const char *hay, const char *needle) {
  int n = 0;
  for (const char *p = hay; p != NULL && (p = strstr(p, needle)) != NULL;
       p += strlen(needle))
    n++;
  return n;
}

/* A client reading slower than the upstream sends: the relay pauses the
 * upstream while 1 MiB waits for the client and the stream arrives whole
 * (9 MB, 3 of them text: more than the proxy's socket buffer takes, 4
 * MiB at most here; without the pause the queue passes its 2 MiB cap and
 * the stream ends in an error). */
Test(proxy, stream_slow_client_gets_it_all) {
  long_up u = {.chunks = 3000, .bytes = 1000, .pad = 2000, .gap_ms = 0};
  struct MHD_Daemon *d = long_start(&u);
  big_body b = {.stop_after = 0};
  CURLcode cc = long_get(&b, 6L << 20); /* 6 MB/s: about 1.5 s */
  MHD_stop_daemon(d);
  cr_assert_eq(cc, CURLE_OK, "%s", curl_easy_strerror(cc));
  cr_expect_eq(count_of(b.p, "<k>"), 3000, "%d chunks of 3000; end: %s",
               count_of(b.p, "<k>"), b.len > 300 ? b.p + b.len - 300 : b.p);
  cr_expect(strstr(b.p, "data: [DONE]") != NULL);
  free(b.p);
}

/* A client that leaves mid-stream: the proxy ends its upstream transfer
 * at once (the upstream would otherwise stream for 4 more seconds). */
Test(proxy, stream_client_gone_ends_the_upstream_transfer) {
  long_up u = {.chunks = 200, .bytes = 10, .gap_ms = 20};
  struct MHD_Daemon *d = long_start(&u);
  big_body b = {.stop_after = 1};
  CURLcode cc = long_get(&b, 0);
  int64_t left = ag_now_ms();
  cr_expect_eq(cc, CURLE_WRITE_ERROR, "%s", curl_easy_strerror(cc));
  while (atomic_load(&u.freed_ms) == 0 && ag_now_ms() - left < 10000)
    nap_ms(10);
  int64_t freed = atomic_load(&u.freed_ms);
  int sent = atomic_load(&u.sent);
  MHD_stop_daemon(d);
  cr_assert_neq(freed, 0, "the upstream's response was never let go of");
  cr_expect_lt(freed - left, 1500,
               "the upstream transfer went on %.0f ms after the client left "
               "(%d of 200 chunks sent)",
               (double)(freed - left), sent);
  cr_expect_lt(sent, 150, "%d of 200 chunks sent", sent);
  free(b.p);
}

typedef struct stop_client {
  big_body b;
  CURLcode cc;
  long speed;     /* bytes a second the client reads at most; 0: any */
  atomic_int got; /* bytes read so far */
} stop_client;

static void *stop_client_main(void *arg) {
  stop_client *sc = arg;
  sc->b.got = &sc->got;
  sc->cc = long_get(&sc->b, sc->speed);
  return NULL;
}

/* The proxy stopped while a stream is relayed: the stop returns soon, the
 * client's stream ends (with an error event, not [DONE]), nothing hangs
 * and libmicrohttpd is not left with a suspended connection. */
Test(proxy, stop_with_a_stream_open_ends_it) {
  long_up u = {.chunks = 200, .bytes = 10, .gap_ms = 20};
  struct MHD_Daemon *d = long_start(&u);
  stop_client sc;
  memset(&sc, 0, sizeof sc);
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, stop_client_main, &sc), 0);
  int64_t t0 = ag_now_ms();
  while (atomic_load(&u.sent) < 3 && ag_now_ms() - t0 < 10000)
    nap_ms(5);
  cr_assert_geq(atomic_load(&u.sent), 3, "the stream never started");
  int64_t s0 = ag_now_ms();
  ag_proxy_stop(P);
  P = NULL;
  int64_t stopped = ag_now_ms() - s0;
  pthread_join(t, NULL);
  int64_t ended = ag_now_ms() - s0;
  int sent = atomic_load(&u.sent);
  MHD_stop_daemon(d);
  cr_expect_lt(stopped, 2000, "ag_proxy_stop took %lld ms", (long long)stopped);
  cr_expect_lt(ended, 2000, "the client's stream ended %lld ms after",
               (long long)ended);
  cr_expect_lt(sent, 150, "%d of 200 chunks sent", sent);
  cr_expect(sc.b.p != NULL && strstr(sc.b.p, "data: [DONE]") == NULL, "%s",
            sc.b.p != NULL ? sc.b.p : "(nothing)");
  free(sc.b.p);
}

/* 12 MB through to a client that keeps up: the queue keeps only what
 * waits (before, it was compacted only when the client had read it all,
 * and a stream ended with "too large" at 8 MB in total). */
Test(proxy, stream_of_12_mb_reaches_a_fast_client) {
  long_up u = {.chunks = 3000, .bytes = 10, .gap_ms = 0, .pad = 4000};
  struct MHD_Daemon *d = long_start(&u);
  big_body b = {.stop_after = 0};
  CURLcode cc = long_get(&b, 0);
  MHD_stop_daemon(d);
  cr_assert_eq(cc, CURLE_OK, "%s", curl_easy_strerror(cc));
  cr_expect_gt(b.len, (size_t)12000, "%zu bytes", b.len);
  cr_expect_eq(count_of(b.p, "<k>"), 3000, "%d chunks of 3000; end: %.300s",
               count_of(b.p, "<k>"), b.len > 300 ? b.p + b.len - 300 : b.p);
  cr_expect(strstr(b.p, "data: [DONE]") != NULL);
  free(b.p);
}

/* A reply whose text passes what the proxy keeps of it (the assembler's
 * cap, 4 MiB): the stream ends with an error event, not a clean end the
 * client would take for a whole reply. */
Test(proxy, stream_past_the_text_cap_ends_with_an_error_event) {
  long_up u = {.chunks = 5000, .bytes = 1000, .gap_ms = 0};
  struct MHD_Daemon *d = long_start(&u);
  big_body b = {.stop_after = 0};
  CURLcode cc = long_get(&b, 0);
  MHD_stop_daemon(d);
  cr_assert_eq(cc, CURLE_OK, "%s", curl_easy_strerror(cc));
  const char *tail = b.len > 400 ? b.p + b.len - 400 : b.p;
  cr_expect(strstr(tail, "\"error\"") != NULL, "end: %s", tail);
  cr_expect(strstr(b.p, "data: [DONE]") == NULL, "end: %s", tail);
  free(b.p);
}

/* The proxy stopped while a slow client's stream is paused: the paused
 * transfer is ended too (else the stop would wait for it), the client's
 * stream ends without [DONE], and nothing is left (ASan and LeakSanitizer
 * in CI's build). A review's stress harness also found that the client's
 * reads during the stop could queue an unpause on the relay already
 * freed; stream_read no longer asks for one once the transfer has ended
 * (this test does not reach that timing reliably; the harness did). */
Test(proxy, stop_while_a_slow_stream_is_paused) {
  long_up u = {.chunks = 3000, .bytes = 1000, .pad = 2000, .gap_ms = 0};
  struct MHD_Daemon *d = long_start(&u);
  stop_client sc;
  memset(&sc, 0, sizeof sc);
  sc.speed = 1L << 20; /* 1 MB/s: the upstream is paused at 1 MiB queued */
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, stop_client_main, &sc), 0);
  int64_t t0 = ag_now_ms();
  while (atomic_load(&sc.got) < (256 << 10) && ag_now_ms() - t0 < 10000)
    nap_ms(5);
  cr_assert_geq(atomic_load(&sc.got), 256 << 10, "the stream never got going");
  ag_proxy_stop(P);
  P = NULL;
  pthread_join(t, NULL);
  MHD_stop_daemon(d);
  cr_expect(sc.b.p != NULL && strstr(sc.b.p, "data: [DONE]") == NULL);
  free(sc.b.p);
}

/* Requests one after the other (plain, streamed, passed through) from one
 * client, on its kept connection as the SDKs keep theirs, reach the
 * upstream over one connection: the proxy keeps it between requests (in
 * the event loop that serves the client's connection; before, every
 * request opened a new one). */
Test(proxy, upstream_connection_is_used_again) {
  canned_call(NULL, "one");
  canned_call(NULL, "two");
  canned_stream_call("{\"path\":\"b\"}");
  canned_add(200, "{\"data\":[]}");
  char *body = conversation(0, "read", "{}", "");
  char *sbody =
      streaming(conversation(1, "read", "{\"path\":\"a\"}", "text of a"));
  CURL *h = curl_easy_init();
  resp *r = call_on(h, P, "POST", "/v1/chat/completions", body, NULL);
  cr_expect_eq(r->status, 200, "%s", r->body);
  free(r);
  r = call_on(h, P, "POST", "/v1/chat/completions", body, NULL);
  cr_expect_eq(r->status, 200, "%s", r->body);
  free(r);
  r = call_on(h, P, "POST", "/v1/chat/completions", sbody, NULL);
  cr_expect_eq(r->status, 200, "%s", r->body);
  cr_expect(ends_with_done(r), "%s", r->body);
  free(r);
  r = call_on(h, P, "GET", "/v1/models", NULL, NULL);
  cr_expect_eq(r->status, 200, "%s", r->body);
  free(r);
  curl_easy_cleanup(h);
  cr_expect_eq(n_upstream(), 4);
  pthread_mutex_lock(&U.mu);
  int conns = U.n_conns;
  pthread_mutex_unlock(&U.mu);
  cr_expect_eq(conns, 1, "4 requests, %d upstream connections", conns);
  free(body);
  free(sbody);
}

static double cpu_s(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 +
         (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
}

/* A kept upstream connection's socket stays in the loop's epoll set while
 * idle (relay.c). An upstream that closes it (here after 1 s idle) makes
 * it readable: the loop takes it out of the set then - no loop spinning on
 * it (the process's CPU over the idle 2.5 s stays small) - and the next
 * request goes over a new connection. */
Test(proxy, upstream_closing_an_idle_connection) {
  struct MHD_Daemon *d = MHD_start_daemon(
      MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION |
          MHD_USE_ERROR_LOG,
      0, NULL, NULL, up_handler, NULL, MHD_OPTION_NOTIFY_COMPLETED,
      up_completed, NULL, MHD_OPTION_NOTIFY_CONNECTION, up_conn_notify, NULL,
      MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)1, MHD_OPTION_EXTERNAL_LOGGER,
      quiet, NULL, MHD_OPTION_END);
  cr_assert_not_null(d);
  char url[64];
  snprintf(url, sizeof url, "http://127.0.0.1:%d/v1",
           MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT)->port);
  ag_proxy_opts o = test_opts();
  o.upstream = url;
  ag_proxy *p = start_with(&o);
  canned_call(NULL, "one");
  canned_call(NULL, "two");
  char *body = conversation(0, "read", "{}", "");
  CURL *h = curl_easy_init();
  resp *r = call_on(h, p, "POST", "/v1/chat/completions", body, NULL);
  cr_expect_eq(r->status, 200, "%s", r->body);
  free(r);
  double c0 = cpu_s();
  nap_ms(2500);
  double idle = cpu_s() - c0;
  cr_expect_lt(idle, 0.5, "%.2f s of CPU while the proxy was idle", idle);
  r = call_on(h, p, "POST", "/v1/chat/completions", body, NULL);
  cr_expect_eq(r->status, 200, "%s", r->body);
  cr_expect(strstr(r->body, "two") != NULL, "%s", r->body);
  free(r);
  curl_easy_cleanup(h);
  ag_proxy_stop(p);
  MHD_stop_daemon(d);
  pthread_mutex_lock(&U.mu);
  int conns = U.n_conns;
  pthread_mutex_unlock(&U.mu);
  cr_expect_eq(conns, 2, "%d upstream connections", conns);
  free(body);
}

/* --max-connections holds over every event loop: with a limit of 1, a
 * second client connection gets a 503 while the first one is open. */
/* An idle connection (kept open by its client after its request) gives
 * its slot to a new one: each new client is served, and the first one's
 * client reconnects and is served too. */
Test(proxy, idle_connection_gives_its_slot_to_a_new_one) {
  ag_proxy_stop(P);
  ag_proxy_opts o = test_opts();
  o.max_connections = 1;
  P = start_with(&o);
  canned_add(200, "{\"data\":[]}");
  CURL *first = curl_easy_init();
  resp *r = call_on(first, P, "GET", "/v1/models", NULL, NULL);
  cr_expect_eq(r->status, 200, "%s", r->body);
  free(r);
  /* each one kept open by its client, idle after its answer */
  CURL *more[4];
  for (int i = 0; i < 4; i++) {
    more[i] = curl_easy_init();
    r = call_on(more[i], P, "GET", "/v1/models", NULL, NULL);
    cr_expect_eq(r->status, 200, "%d: %s", i, r->body);
    free(r);
  }
  r = call_on(first, P, "GET", "/v1/models", NULL, NULL);
  cr_expect_eq(r->status, 200, "%s", r->body);
  free(r);
  curl_easy_cleanup(first);
  for (int i = 0; i < 4; i++)
    curl_easy_cleanup(more[i]);
}

/* ---- Anthropic Messages (/v1/messages) --------------------------------- */

/* A Messages conversation: a user message, then `n` rounds of the call
 * name(args) answered by `result` (is_error as given). Caller frees. */
static char *messages_conv(int n, const char *args, const char *result,
                           bool is_error, bool stream) {
  json_t *msgs =
      json_pack("[{s:s, s:s}]", "role", "user", "content", "Read the file.");
  for (int i = 0; i < n; i++) {
    char id[32];
    snprintf(id, sizeof id, "toolu_%d", i);
    json_array_append_new(
        msgs, json_pack("{s:s, s:[{s:s, s:s}, {s:s, s:s, s:s, s:o}]}", "role",
                        "assistant", "content", "type", "text", "text",
                        "Reading.", "type", "tool_use", "id", id, "name",
                        "read", "input", json_loads(args, 0, NULL)));
    json_array_append_new(
        msgs, json_pack("{s:s, s:[{s:s, s:s, s:s, s:b}]}", "role", "user",
                        "content", "type", "tool_result", "tool_use_id", id,
                        "content", result, "is_error", is_error));
  }
  json_t *o =
      json_pack("{s:s, s:i, s:o, s:b, s:[{s:s, s:{s:s}}]}", "model", "claude",
                "max_tokens", 1024, "messages", msgs, "stream", stream, "tools",
                "name", "read", "input_schema", "type", "object");
  char *t = json_dumps(o, JSON_COMPACT);
  json_decref(o);
  return t;
}

static void canned_message_call(const char *args) {
  json_t *o = json_pack(
      "{s:s, s:s, s:s, s:s, s:[{s:s, s:s}, {s:s, s:s, s:s, s:o}], s:s, "
      "s:n, s:{s:i, s:i}}",
      "id", "msg_up", "type", "message", "role", "assistant", "model", "claude",
      "content", "type", "text", "text", "Let me read it.", "type", "tool_use",
      "id", "toolu_up", "name", "read", "input", json_loads(args, 0, NULL),
      "stop_reason", "tool_use", "stop_sequence", "usage", "input_tokens", 10,
      "output_tokens", 5);
  char *t = json_dumps(o, JSON_COMPACT);
  canned_add(200, t);
  free(t);
  json_decref(o);
}

static json_t *text_of_message(const resp *r) {
  json_t *j = json_loads(r->body, 0, NULL);
  cr_assert_not_null(j, "not JSON: %s", r->body);
  cr_expect_str_eq(json_string_value(json_object_get(j, "type")), "message");
  return j;
}

Test(proxy, anthropic_allowed_reply_is_forwarded) {
  canned_message_call("{\"path\":\"b\"}");
  char *body = messages_conv(1, "{\"path\":\"a\"}", "text", false, false);
  resp *r = call(P, "POST", "/v1/messages", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect_str_eq(r->body, U.replies[0].body);
  cr_expect_str_empty(r->stop);
  free(body);
  free(r);
}

Test(proxy, anthropic_repeated_call_is_replaced) {
  canned_message_call("{\"path\":\"a\"}");
  char *body = messages_conv(2, "{\"path\":\"a\"}", "text", false, false);
  resp *r = call(P, "POST", "/v1/messages", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect_str_eq(r->stop, "identical_calls");
  json_t *j = text_of_message(r);
  json_t *content = json_object_get(j, "content");
  cr_expect_eq(json_array_size(content), 1);
  cr_expect_str_eq(
      json_string_value(json_object_get(json_array_get(content, 0), "type")),
      "text");
  cr_expect(strstr(json_string_value(
                       json_object_get(json_array_get(content, 0), "text")),
                   "agentguard stopped this turn (identical_calls)") != NULL);
  cr_expect_str_eq(json_string_value(json_object_get(j, "stop_reason")),
                   "end_turn");
  json_decref(j);
  free(body);
  free(r);
}

Test(proxy, anthropic_replayed_errors_stop) {
  ag_proxy_stop(P);
  ag_config c = test_cfg();
  c.loop.identical_call_limit = 0;
  P = proxy_with(c, 0, NULL);
  char *body =
      messages_conv(3, "{\"path\":\"x\"}", "no such file", true, false);
  resp *r = call(P, "POST", "/v1/messages", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect_eq(n_upstream(), 0);
  cr_expect_str_eq(r->stop, "consecutive_errors");
  json_decref(text_of_message(r));
  free(body);
  free(r);
}

Test(proxy, anthropic_nudge_answers_with_tool_result) {
  ag_proxy_stop(P);
  ag_config c = test_cfg();
  c.loop.nudge_before_stop = true;
  P = proxy_with(c, 0, NULL);
  canned_message_call("{\"path\":\"a\"}");
  canned_add(200, "{\"id\":\"msg_2\",\"type\":\"message\",\"role\":"
                  "\"assistant\",\"model\":\"claude\",\"content\":[{\"type\":"
                  "\"text\",\"text\":\"Done.\"}],\"stop_reason\":\"end_turn\","
                  "\"usage\":{\"input_tokens\":1,\"output_tokens\":1}}");
  char *body = messages_conv(2, "{\"path\":\"a\"}", "text", false, false);
  resp *r = call(P, "POST", "/v1/messages", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect_str_eq(r->body, U.replies[1].body);
  cr_assert_eq(n_upstream(), 2);
  json_t *sent = json_loads(U.reqs[1].body, 0, NULL);
  json_t *msgs = json_object_get(sent, "messages");
  json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
  json_t *blk = json_array_get(json_object_get(last, "content"), 0);
  cr_expect_str_eq(json_string_value(json_object_get(blk, "type")),
                   "tool_result");
  cr_expect_str_eq(json_string_value(json_object_get(blk, "tool_use_id")),
                   "toolu_up");
  json_decref(sent);
  free(body);
  free(r);
}

/* An Anthropic stream: a text block "Let me read it.", then a tool_use
 * read(args) in two input_json_delta fragments, message_delta, stop. */
static void canned_message_stream(const char *args) {
  size_t half = strlen(args) / 2;
  json_t *a1 = json_stringn(args, half), *a2 = json_string(args + half);
  char *s1 = json_dumps(a1, JSON_ENCODE_ANY);
  char *s2 = json_dumps(a2, JSON_ENCODE_ANY);
  char *b = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&b, &n);
  fprintf(f,
          "event: message_start\ndata: {\"type\":\"message_start\","
          "\"message\":{\"id\":\"msg_s\",\"type\":\"message\",\"role\":"
          "\"assistant\",\"model\":\"claude\",\"content\":[],\"stop_reason\":"
          "null,\"usage\":{\"input_tokens\":10,\"output_tokens\":1}}}\n\n"
          "event: content_block_start\ndata: {\"type\":\"content_block_start\","
          "\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n"
          "event: ping\ndata: {\"type\":\"ping\"}\n\n"
          "event: content_block_delta\ndata: {\"type\":\"content_block_delta\","
          "\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Let me "
          "read it.\"}}\n\n"
          "event: content_block_stop\ndata: {\"type\":\"content_block_stop\","
          "\"index\":0}\n\n"
          "event: content_block_start\ndata: {\"type\":\"content_block_start\","
          "\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":"
          "\"toolu_s\",\"name\":\"read\",\"input\":{}}}\n\n"
          "event: content_block_delta\ndata: {\"type\":\"content_block_delta\","
          "\"index\":1,\"delta\":{\"type\":\"input_json_delta\","
          "\"partial_json\":%s}}\n\n"
          "event: content_block_delta\ndata: {\"type\":\"content_block_delta\","
          "\"index\":1,\"delta\":{\"type\":\"input_json_delta\","
          "\"partial_json\":%s}}\n\n"
          "event: content_block_stop\ndata: {\"type\":\"content_block_stop\","
          "\"index\":1}\n\n"
          "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":"
          "{\"stop_reason\":\"tool_use\",\"stop_sequence\":null},\"usage\":"
          "{\"output_tokens\":9}}\n\n"
          "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
          s1, s2);
  fclose(f);
  canned_add(200, b);
  free(b);
  free(s1);
  free(s2);
  json_decref(a1);
  json_decref(a2);
}

static void expect_in_order(const resp *r, const char *const *parts, size_t n) {
  const char *at = r->body;
  for (size_t i = 0; i < n; i++) {
    const char *f = strstr(at, parts[i]);
    cr_expect_not_null(f, "'%s' missing or out of order: %s", parts[i],
                       r->body);
    if (f == NULL)
      return;
    at = f + strlen(parts[i]);
  }
}

Test(proxy, anthropic_stream_relayed_then_calls_released) {
  canned_message_stream("{\"path\":\"b\"}");
  char *body = messages_conv(1, "{\"path\":\"a\"}", "text", false, true);
  resp *r = call(P, "POST", "/v1/messages", body, NULL);
  cr_expect_eq(r->status, 200);
  const char *order[] = {
      "event: message_start",       "Let me read it.",
      "event: content_block_start", "toolu_s",
      "input_json_delta",           "\"stop_reason\":\"tool_use\"",
      "event: message_stop"};
  expect_in_order(r, order, sizeof order / sizeof order[0]);
  json_t *sent = json_loads(U.reqs[0].body, 0, NULL);
  cr_expect(json_is_true(json_object_get(sent, "stream")), "relayed");
  json_decref(sent);
  free(body);
  free(r);
}

Test(proxy, anthropic_stream_repeated_call_replaced) {
  canned_message_stream("{\"path\":\"a\"}");
  char *body = messages_conv(2, "{\"path\":\"a\"}", "text", false, true);
  resp *r = call(P, "POST", "/v1/messages", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect(strstr(r->body, "toolu_s") == NULL, "the call is held: %s",
            r->body);
  const char *order[] = {"Let me read it.", "\"index\":1",
                         "agentguard stopped this turn (identical_calls)",
                         "\"stop_reason\":\"end_turn\"", "event: message_stop"};
  expect_in_order(r, order, sizeof order / sizeof order[0]);
  free(body);
  free(r);
}

Test(proxy, anthropic_stream_nudge_answers_with_tool_result) {
  ag_proxy_stop(P);
  ag_config c = test_cfg();
  c.loop.nudge_before_stop = true;
  P = proxy_with(c, 0, NULL);
  canned_message_stream("{\"path\":\"a\"}");
  canned_add(200, "{\"id\":\"msg_2\",\"type\":\"message\",\"role\":"
                  "\"assistant\",\"model\":\"claude\",\"content\":[{\"type\":"
                  "\"text\",\"text\":\"Done.\"}],\"stop_reason\":\"end_turn\","
                  "\"usage\":{\"input_tokens\":1,\"output_tokens\":1}}");
  char *body = messages_conv(2, "{\"path\":\"a\"}", "text", false, true);
  resp *r = call(P, "POST", "/v1/messages", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect(strstr(r->body, "toolu_s") == NULL, "the call is held: %s",
            r->body);
  const char *order[] = {"Let me read it.", "Done.",
                         "\"stop_reason\":\"end_turn\"", "event: message_stop"};
  expect_in_order(r, order, sizeof order / sizeof order[0]);
  cr_assert_eq(n_upstream(), 2);
  json_t *sent = json_loads(U.reqs[1].body, 0, NULL);
  cr_expect(json_is_false(json_object_get(sent, "stream")));
  json_t *msgs = json_object_get(sent, "messages");
  json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
  json_t *blk = json_array_get(json_object_get(last, "content"), 0);
  cr_expect_str_eq(json_string_value(json_object_get(blk, "type")),
                   "tool_result");
  cr_expect_str_eq(json_string_value(json_object_get(blk, "tool_use_id")),
                   "toolu_s");
  json_decref(sent);
  free(body);
  free(r);
}

/* Held events with an "index" the stream never opened (a message_delta
 * carrying one, far out of range or negative): passed on as they came,
 * never used to index the proxy's block table (this read past it and
 * crashed the proxy). */
Test(proxy, anthropic_stream_odd_index_on_a_held_event) {
  const char *idx[] = {"100000", "-1", "300"};
  for (size_t k = 0; k < sizeof idx / sizeof idx[0]; k++) {
    canned_reset();
    char b[1024];
    snprintf(b, sizeof b,
             "event: message_start\ndata: {\"type\":\"message_start\","
             "\"message\":{\"id\":\"msg_s\",\"type\":\"message\",\"role\":"
             "\"assistant\",\"model\":\"claude\",\"content\":[],"
             "\"stop_reason\":null,\"usage\":{\"input_tokens\":1,"
             "\"output_tokens\":1}}}\n\n"
             "event: content_block_start\ndata: {\"type\":"
             "\"content_block_start\",\"index\":0,\"content_block\":{"
             "\"type\":\"text\",\"text\":\"\"}}\n\n"
             "event: content_block_delta\ndata: {\"type\":"
             "\"content_block_delta\",\"index\":0,\"delta\":{\"type\":"
             "\"text_delta\",\"text\":\"Done.\"}}\n\n"
             "event: content_block_stop\ndata: {\"type\":"
             "\"content_block_stop\",\"index\":0}\n\n"
             "event: message_delta\ndata: {\"type\":\"message_delta\","
             "\"index\":%s,\"delta\":{\"stop_reason\":\"end_turn\"},"
             "\"usage\":{\"output_tokens\":2}}\n\n"
             "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
             idx[k]);
    canned_add(200, b);
    char *body = messages_conv(1, "{\"path\":\"a\"}", "text", false, true);
    resp *r = call(P, "POST", "/v1/messages", body, NULL);
    cr_expect_eq(r->status, 200);
    char want[64];
    snprintf(want, sizeof want, "\"index\":%s", idx[k]);
    const char *order[] = {"Done.", want, "\"stop_reason\":\"end_turn\"",
                           "event: message_stop"};
    expect_in_order(r, order, sizeof order / sizeof order[0]);
    free(body);
    free(r);
  }
}

Test(proxy, anthropic_stream_stop_before_request_is_events) {
  ag_proxy_stop(P);
  ag_config c = test_cfg();
  c.loop.identical_call_limit = 0;
  P = proxy_with(c, 0, NULL);
  char *body = messages_conv(3, "{\"path\":\"x\"}", "no such file", true, true);
  resp *r = call(P, "POST", "/v1/messages", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect_eq(n_upstream(), 0);
  cr_expect_str_eq(r->stop, "consecutive_errors");
  const char *order[] = {"event: message_start", "event: content_block_start",
                         "agentguard stopped this turn", "event: message_stop"};
  expect_in_order(r, order, sizeof order / sizeof order[0]);
  free(body);
  free(r);
}

Test(proxy, anthropic_errors_have_anthropic_shape) {
  resp *r = call(P, "POST", "/v1/messages", "{\"messages\":[", NULL);
  cr_expect_eq(r->status, 400);
  json_t *j = json_loads(r->body, 0, NULL);
  cr_expect_str_eq(json_string_value(json_object_get(j, "type")), "error");
  cr_expect_str_eq(
      json_string_value(json_object_get(json_object_get(j, "error"), "type")),
      "invalid_request_error");
  json_decref(j);
  free(r);
  r = call(P, "POST", "/v1/messages",
           "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", NULL);
  cr_expect_eq(r->status, 400);
  cr_expect(strstr(r->body, "messages[0].content") != NULL, "%s", r->body);
  free(r);
}

Test(proxy, decide_alone_matches_the_served_decision) {
  ag_config c = test_cfg();
  c.loop.identical_call_limit = 0;
  char *body = conversation(3, "read", "{\"path\":\"x\"}", "Error: nope");
  ag_verdict v;
  ag_error_t err;
  cr_expect_eq(ag_proxy_decide(&c, body, strlen(body), false, &v, &err),
               AG_STOP);
  cr_expect_eq(v.reason, AG_REASON_CONSECUTIVE_ERRORS);
  free(body);
  body = conversation(2, "read", "{\"path\":\"x\"}", "Error: nope");
  cr_expect_eq(ag_proxy_decide(&c, body, strlen(body), false, &v, &err),
               AG_ALLOW);
  free(body);
  cr_expect_eq(ag_proxy_decide(&c, "{", 1, false, &v, &err), -1);
  cr_expect_eq(err.code, AG_EJSON);
}

Test(proxy, error_context_goes_with_the_request_only) {
  ag_proxy_stop(P);
  ag_config c = test_cfg();
  c.errors.error_context = true;
  P = proxy_with(c, 0, NULL);
  canned_call(NULL, "It does not exist.");
  char *body =
      conversation(1, "read", "{\"path\":\"x\"}", "Error: no such file x");
  resp *r = call(P, "POST", "/v1/chat/completions", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_assert_eq(n_upstream(), 1);
  json_t *sent = json_loads(U.reqs[0].body, 0, NULL);
  json_t *msgs = json_object_get(sent, "messages");
  json_t *orig_req = json_loads(body, 0, NULL);
  json_t *orig = json_object_get(orig_req, "messages");
  cr_expect_eq(json_array_size(msgs), json_array_size(orig) + 1);
  json_decref(orig_req);
  json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
  cr_expect_str_eq(json_string_value(json_object_get(last, "role")), "user");
  cr_expect(strstr(json_string_value(json_object_get(last, "content")),
                   "no such file x") != NULL,
            "%s", U.reqs[0].body);
  json_decref(sent);
  free(body);
  free(r);
}

Test(proxy, escalation_asks_the_user) {
  ag_proxy_stop(P);
  ag_config c = test_cfg();
  c.loop.identical_call_limit = 0;
  c.errors.on_trip = AG_TRIP_ESCALATE;
  P = proxy_with(c, 0, NULL);
  char *body = conversation(3, "read", "{\"path\":\"x\"}", "Error: nope");
  resp *r = call(P, "POST", "/v1/chat/completions", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect_str_eq(r->stop, "consecutive_errors");
  json_t *m = message_of(r);
  cr_expect(strstr(json_string_value(json_object_get(m, "content")),
                   "needs you") != NULL,
            "%s", r->body);
  cr_expect_null(json_object_get(m, "tool_calls"));
  json_decref(m);
  free(body);
  free(r);
}

/* ---- the command line -----------------------------------------------------
 */

/* Runs `agentguard proxy ARGS` (which must fail before serving); returns
 * the exit code, stderr in err. */
static int cli(const char *args, char *err, size_t cap) {
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "%s/agentguard proxy %s 2>&1 >/dev/null",
           AG_BINARY_DIR, args);
  FILE *f = popen(cmd, "r");
  cr_assert_not_null(f);
  size_t n = fread(err, 1, cap - 1, f);
  err[n] = '\0';
  int st = pclose(f);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

Test(proxy, cli_refuses_bad_options) {
  char err[4096];
  cr_expect_eq(cli("", err, sizeof err), 2);
  cr_expect(strstr(err, "--upstream URL is required") != NULL, "%s", err);
  cr_expect_eq(
      cli("--upstream http://127.0.0.1:1 --listen 0.0.0.0:0", err, sizeof err),
      2);
  cr_expect(strstr(err, "--client-key-env") != NULL, "%s", err);
  cr_expect_eq(
      cli("--upstream http://127.0.0.1:1 --listen nope", err, sizeof err), 2);
  cr_expect(strstr(err, "HOST:PORT") != NULL, "%s", err);
  cr_expect_eq(
      cli("--upstream http://127.0.0.1:1 --client-key-env AG_PROXY_TEST_UNSET",
          err, sizeof err),
      2);
  cr_expect(strstr(err, "AG_PROXY_TEST_UNSET") != NULL, "%s", err);
  cr_expect_eq(
      cli("--upstream http://127.0.0.1:1 --max-body -5", err, sizeof err), 2);
  cr_expect_eq(
      cli("--upstream http://127.0.0.1:1 --preset nosuch", err, sizeof err), 2);
  cr_expect_eq(cli("--upstream ftp://x", err, sizeof err), 2);
  cr_expect(strstr(err, "http://") != NULL, "%s", err);
  cr_expect_eq(
      cli("--upstream http://127.0.0.1:1 --header-timeout 0", err, sizeof err),
      2);
  cr_expect(strstr(err, "--header-timeout 0") != NULL, "%s", err);
  cr_expect_eq(cli("--upstream http://127.0.0.1:1 --max-connections 4 "
                   "--max-connections-per-client 9",
                   err, sizeof err),
               2);
  cr_expect(strstr(err, "--max-connections-per-client 9") != NULL, "%s", err);
}

Test(proxy, upstream_reply_of_wrong_shape_is_502) {
  canned_add(200, "{\"choices\":\"no\"}");
  char *body = conversation(0, "read", "{}", "");
  resp *r = call(P, "POST", "/v1/chat/completions", body, NULL);
  char code[64];
  cr_expect_eq(r->status, 502);
  cr_expect_str_eq(err_code(r, code, sizeof code), "upstream_bad_reply");
  cr_expect(strstr(r->body, "choices") != NULL, "%s", r->body);
  free(body);
  free(r);
}

/* ---- parity with the audit ------------------------------------------------
 */

static unsigned long rng_state = 12345;
static unsigned rnd(unsigned n) {
  rng_state = rng_state * 6364136223846793005UL + 1442695040888963407UL;
  return (unsigned)((rng_state >> 33) % n);
}

/* A random turn: rounds of 0-3 calls from a small set (so that repeats,
 * cycles and error runs happen), results ok, "Error: ..." or is_error. */
static json_t *random_turn(int rounds) {
  static const char *const names[] = {"read", "write", "run"};
  static const char *const args[] = {"{\"p\":1}", "{\"p\":2}", "{\"p\": 1}",
                                     "{\"q\":[1,2]}"};
  json_t *msgs = json_pack("[{s:s, s:s}, {s:s, s:s}]", "role", "system",
                           "content", "sys", "role", "user", "content", "go");
  int id = 0;
  for (int r = 0; r < rounds; r++) {
    unsigned nc = rnd(4);
    json_t *tcs = json_array();
    for (unsigned k = 0; k < nc; k++) {
      char cid[16];
      snprintf(cid, sizeof cid, "c%d", id + (int)k);
      json_array_append_new(tcs, json_pack("{s:s, s:s, s:{s:s, s:s}}", "id",
                                           cid, "type", "function", "function",
                                           "name", names[rnd(3)], "arguments",
                                           args[rnd(4)]));
    }
    json_t *am = json_pack("{s:s, s:s}", "role", "assistant", "content",
                           rnd(3) == 0 ? "thinking" : "");
    if (nc > 0)
      json_object_set_new(am, "tool_calls", tcs);
    else
      json_decref(tcs);
    json_array_append_new(msgs, am);
    for (unsigned k = 0; k < nc; k++) {
      char cid[16];
      snprintf(cid, sizeof cid, "c%d", id + (int)k);
      unsigned kind = rnd(4);
      json_t *tm = json_pack("{s:s, s:s, s:s}", "role", "tool", "tool_call_id",
                             cid, "content",
                             kind == 0   ? "Error: file not found"
                             : kind == 1 ? "failed hard"
                                         : "ok");
      if (kind == 1)
        json_object_set_new(tm, "is_error", json_true());
      json_array_append_new(msgs, tm);
    }
    id += (int)nc;
  }
  return msgs;
}

/* The audit of `transcript` and the proxy's decision on `body` (the same
 * turn) agree: both stop, for the same reason, or neither. Returns 1 when
 * they stop. */
static int audit_equals_decision(ag_auditor *a, const ag_config *cfg,
                                 const char *transcript, const char *body,
                                 bool anthropic, int c, int i) {
  ag_trajectory *t = NULL;
  ag_error_t err;
  cr_assert_eq(
      ag_trajectory_parse(&t, transcript, strlen(transcript), NULL, &err),
      AG_OK, "%s", err.msg);
  ag_audit_finding f;
  cr_assert_eq(ag_auditor_run(a, t, &f, &err), AG_OK);
  ag_trajectory_free(t);
  ag_verdict v;
  int act = ag_proxy_decide(cfg, body, strlen(body), anthropic, &v, &err);
  if (!f.stop.stopped) {
    cr_expect_eq(act, AG_ALLOW, "cfg %d run %d: %s (%s)", c, i,
                 ag_reason_name(v.reason), transcript);
    return 0;
  }
  cr_expect(act == AG_STOP || act == AG_ESCALATE, "cfg %d run %d: %s", c, i,
            transcript);
  cr_expect_eq(v.reason, f.stop.reason, "cfg %d run %d: %s vs %s: %s", c, i,
               ag_reason_name(v.reason), ag_reason_name(f.stop.reason),
               transcript);
  return 1;
}

Test(proxy, decisions_equal_the_audits) {
  ag_config cfgs[3];
  cfgs[0] = test_cfg();
  cr_assert_eq(ag_config_preset(&cfgs[1], "default", NULL), AG_OK);
  cfgs[2] = test_cfg();
  cfgs[2].loop.nudge_before_stop = true;
  cfgs[2].loop.cycle_limit = 2;
  int stops = 0;
  for (int c = 0; c < 3; c++) {
    cfgs[c].loop.max_iterations = 0; /* the coming request never trips */
    cfgs[c].loop.max_tokens_per_turn = 0;
    ag_auditor *a = NULL;
    cr_assert_eq(ag_auditor_new(&a, &cfgs[c], NULL, NULL), AG_OK);
    for (int i = 0; i < 200; i++) {
      json_t *msgs = random_turn(1 + (int)rnd(12));
      char *transcript = json_dumps(msgs, JSON_COMPACT);
      json_t *req = json_pack("{s:s, s:o}", "model", "m", "messages", msgs);
      char *body = json_dumps(req, JSON_COMPACT);
      json_decref(req);
      stops +=
          audit_equals_decision(a, &cfgs[c], transcript, body, false, c, i);
      free(transcript);
      free(body);
    }
    ag_auditor_free(a);
  }
  cr_expect_gt(stops, 50, "the random turns exercise stops (%d)", stops);
}

/* A random turn as a pair: Chat Completions messages and the same turn in
 * Anthropic's shape (text in one block or split over two, results as a
 * string or as text blocks, an earlier turn before it), so that the
 * Anthropic reading (fast_turn_anth, or the conversion) can be held to the
 * chat one. */
static void random_pair(int rounds, json_t **chat, json_t **anth) {
  static const char *const names[] = {"read", "write", "run"};
  static const char *const args[] = {"{\"p\":1}", "{\"p\":2}", "{\"q\":[1,2]}"};
  *chat = json_pack("[{s:s, s:s}, {s:s, s:s}]", "role", "system", "content",
                    "sys", "role", "user", "content", "go");
  /* an earlier turn (its call and result), then the user message that
   * starts this turn, with a late result of the earlier call beside it */
  *anth = json_pack(
      "[{s:s, s:s}, {s:s, s:[{s:s, s:s, s:s, s:{}}]}, {s:s, s:[{s:s, s:s, "
      "s:s}, {s:s, s:s}]}]",
      "role", "user", "content", "before", "role", "assistant", "content",
      "type", "tool_use", "id", "old", "name", "read", "input", "role", "user",
      "content", "type", "tool_result", "tool_use_id", "old", "content",
      "Error: old", "type", "text", "text", "go");
  int id = 0;
  for (int r = 0; r < rounds; r++) {
    unsigned nc = rnd(4);
    unsigned textk = rnd(3); /* no text, one block, two blocks */
    char text[64] = "";
    json_t *blocks = json_array();
    if (textk == 1) {
      snprintf(text, sizeof text, "thinking");
      json_array_append_new(
          blocks, json_pack("{s:s, s:s}", "type", "text", "text", "thinking"));
    } else if (textk == 2) {
      snprintf(text, sizeof text, "a\nb");
      json_array_append_new(
          blocks, json_pack("{s:s, s:s}", "type", "text", "text", "a"));
      json_array_append_new(
          blocks, json_pack("{s:s, s:s}", "type", "text", "text", "b"));
    }
    json_t *tcs = json_array(), *results = json_array();
    for (unsigned k = 0; k < nc; k++) {
      char cid[16];
      snprintf(cid, sizeof cid, "c%d", id + (int)k);
      const char *nm = names[rnd(3)], *ar = args[rnd(3)];
      json_array_append_new(tcs, json_pack("{s:s, s:s, s:{s:s, s:s}}", "id",
                                           cid, "type", "function", "function",
                                           "name", nm, "arguments", ar));
      json_array_append_new(
          blocks, json_pack("{s:s, s:s, s:s, s:o}", "type", "tool_use", "id",
                            cid, "name", nm, "input", json_loads(ar, 0, NULL)));
    }
    json_t *am = json_pack("{s:s, s:s}", "role", "assistant", "content", text);
    if (nc > 0)
      json_object_set_new(am, "tool_calls", tcs);
    else
      json_decref(tcs);
    json_array_append_new(*chat, am);
    json_array_append_new(
        *anth, json_pack("{s:s, s:o}", "role", "assistant", "content", blocks));
    for (unsigned k = 0; k < nc; k++) {
      char cid[16];
      snprintf(cid, sizeof cid, "c%d", id + (int)k);
      unsigned kind = rnd(4);
      const char *res = kind == 0   ? "Error: file not found"
                        : kind == 1 ? "failed hard"
                                    : "ok";
      json_t *tm = json_pack("{s:s, s:s, s:s}", "role", "tool", "tool_call_id",
                             cid, "content", res);
      if (kind == 1)
        json_object_set_new(tm, "is_error", json_true());
      json_array_append_new(*chat, tm);
      json_t *content =
          rnd(2) == 0 ? json_string(res)
                      : json_pack("[{s:s, s:s}]", "type", "text", "text", res);
      json_array_append_new(results, json_pack("{s:s, s:s, s:o, s:b}", "type",
                                               "tool_result", "tool_use_id",
                                               cid, "content", content,
                                               "is_error", kind == 1));
    }
    if (nc > 0)
      json_array_append_new(
          *anth, json_pack("{s:s, s:o}", "role", "user", "content", results));
    else
      json_decref(results);
    id += (int)nc;
  }
}

Test(proxy, anthropic_decisions_equal_the_chat_ones) {
  ag_config cfgs[2];
  cfgs[0] = test_cfg();
  cfgs[1] = test_cfg();
  cfgs[1].loop.nudge_before_stop = true;
  cfgs[1].loop.cycle_limit = 2;
  int stops = 0;
  for (int c = 0; c < 2; c++) {
    cfgs[c].loop.max_iterations = 0;
    cfgs[c].loop.max_tokens_per_turn = 0;
    for (int i = 0; i < 200; i++) {
      json_t *chat = NULL, *anth = NULL;
      random_pair(1 + (int)rnd(12), &chat, &anth);
      json_t *rc = json_pack("{s:s, s:o}", "model", "m", "messages", chat);
      json_t *ra = json_pack("{s:s, s:i, s:o}", "model", "m", "max_tokens", 10,
                             "messages", anth);
      char *bc = json_dumps(rc, JSON_COMPACT),
           *ba = json_dumps(ra, JSON_COMPACT);
      json_decref(rc);
      json_decref(ra);
      ag_verdict vc, va;
      ag_error_t err;
      int ac = ag_proxy_decide(&cfgs[c], bc, strlen(bc), false, &vc, &err);
      cr_assert_geq(ac, 0, "%s", err.msg);
      int aa = ag_proxy_decide(&cfgs[c], ba, strlen(ba), true, &va, &err);
      cr_assert_geq(aa, 0, "%s: %s", err.msg, ba);
      cr_expect_eq(aa, ac, "cfg %d run %d: %d vs %d: %s", c, i, aa, ac, ba);
      if (ac != AG_ALLOW) {
        stops++;
        cr_expect_eq(va.reason, vc.reason, "cfg %d run %d: %s vs %s: %s", c, i,
                     ag_reason_name(va.reason), ag_reason_name(vc.reason), ba);
      }
      free(bc);
      free(ba);
    }
  }
  cr_expect_gt(stops, 30, "the random turns exercise stops (%d)", stops);
}

/* ---- the tape's decision equals the tree's --------------------------------
 */

#define ODD "\xc3\xa9\xf0\x9f\x98\x80\n\"/" /* é, 😀, newline, quote, slash */

/* Escapes in every string the decision reads: arguments get an extra
 * member (the same for every call, so repeats stay repeats), results and
 * texts a suffix; dumped with JSON_ENSURE_ASCII they become \u00e9,
 * \ud83d\ude00, \n, \". */
static void add_escapes(json_t *msgs) {
  size_t i, k;
  json_t *m, *x;
  json_array_foreach(msgs, i, m) {
    json_array_foreach(json_object_get(m, "tool_calls"), k, x) {
      json_t *fn = json_object_get(x, "function");
      json_t *a = json_loads(
          json_string_value(json_object_get(fn, "arguments")), 0, NULL);
      json_object_set_new(a, "s", json_string(ODD));
      char *d = json_dumps(a, JSON_COMPACT);
      json_object_set_new(fn, "arguments", json_string(d));
      free(d);
      json_decref(a);
    }
    json_t *c = json_object_get(m, "content");
    if (json_is_string(c) && json_string_length(c) > 0) {
      char buf[256];
      snprintf(buf, sizeof buf, "%s" ODD, json_string_value(c));
      json_object_set_new(m, "content", json_string(buf));
    }
    json_array_foreach(c, k, x) {
      json_t *in = json_object_get(x, "input");
      if (json_is_object(in))
        json_object_set_new(in, "s", json_string(ODD));
      json_t *t = json_object_get(x, "text");
      json_t *rc = json_object_get(x, "content");
      if (json_is_string(rc)) {
        t = rc;
      } else {
        size_t q;
        json_t *y;
        json_array_foreach(rc, q, y) {
          char buf[256];
          snprintf(buf, sizeof buf, "%s" ODD,
                   json_string_value(json_object_get(y, "text")));
          json_object_set_new(y, "text", json_string(buf));
        }
      }
      if (json_is_string(t)) {
        char buf[256];
        snprintf(buf, sizeof buf, "%s" ODD, json_string_value(t));
        json_string_set(t, buf);
      }
    }
  }
}

/* Chat contents as arrays of parts, which the audit's parser reads (and
 * fast_turn leaves to it): a tool result as a text part and an image part,
 * the text of every second result in two parts, an assistant's text as a
 * text part. The same for the same text, so repeats stay repeats. */
static void to_parts(json_t *msgs) {
  size_t i;
  json_t *m;
  json_array_foreach(msgs, i, m) {
    const char *role = json_string_value(json_object_get(m, "role"));
    json_t *c = json_object_get(m, "content");
    if (!json_is_string(c) || json_string_length(c) == 0)
      continue;
    if (strcmp(role, "tool") == 0 && i % 2 == 0)
      json_object_set_new(m, "content",
                          json_pack("[{s:s, s:O}, {s:s, s:{s:s}}]", "type",
                                    "text", "text", c, "type", "image_url",
                                    "image_url", "url", "u"));
    else if (strcmp(role, "tool") == 0)
      json_object_set_new(
          m, "content",
          json_pack("[s, {s:s, s:O}]", "Result:", "type", "text", "text", c));
    else if (strcmp(role, "assistant") == 0)
      json_object_set_new(m, "content",
                          json_pack("[{s:s, s:O}]", "type", "text", "text", c));
  }
}

/* The body decided through the tape alone and through the tree alone:
 * the same action, reason, call, tool and message. Returns the action. */
static int expect_same_decision(const ag_config *cfg, const char *body,
                                bool anth, const char *what) {
  ag_verdict vt, vj;
  ag_error_t et, ej;
  size_t len = strlen(body);
  int at =
      ag_proxy_decide_read(cfg, body, len, anth, AG_PROXY_READ_TAPE, &vt, &et);
  int aj =
      ag_proxy_decide_read(cfg, body, len, anth, AG_PROXY_READ_TREE, &vj, &ej);
  cr_assert_geq(aj, 0, "%s: the tree refuses it: %s", what, ej.msg);
  cr_assert_neq(at, -2, "%s: the tape left it to the tree: %s", what, body);
  cr_assert_eq(at, aj, "%s: tape %d, tree %d: %s", what, at, aj, body);
  if (aj != AG_ALLOW) {
    cr_expect_eq(vt.reason, vj.reason, "%s: %s vs %s", what,
                 ag_reason_name(vt.reason), ag_reason_name(vj.reason));
    cr_expect_eq(vt.call_index, vj.call_index, "%s", what);
    cr_expect_str_eq(vt.tool, vj.tool, "%s", what);
    cr_expect_str_eq(vt.message, vj.message, "%s", what);
  }
  return aj;
}

Test(proxy, tape_decisions_equal_the_tree_ones) {
  ag_config cfgs[3];
  cfgs[0] = test_cfg();
  cr_assert_eq(ag_config_preset(&cfgs[1], "default", NULL), AG_OK);
  cfgs[2] = test_cfg();
  cfgs[2].loop.nudge_before_stop = true;
  cfgs[2].loop.cycle_limit = 2;
  int stops = 0;
  char what[64];
  for (int c = 0; c < 3; c++) {
    cfgs[c].loop.max_iterations = 0;
    cfgs[c].loop.max_tokens_per_turn = 0;
    for (int i = 0; i < 150; i++) {
      bool esc = i % 2 == 1; /* escapes, in \u form (ENSURE_ASCII) */
      size_t flags = JSON_COMPACT | (esc ? JSON_ENSURE_ASCII : 0) |
                     (i % 3 == 2 ? JSON_INDENT(1) : 0);
      json_t *msgs = random_turn(1 + (int)rnd(12));
      json_t *chat = NULL, *anth = NULL;
      random_pair(1 + (int)rnd(12), &chat, &anth);
      if (esc) {
        add_escapes(msgs);
        add_escapes(chat);
        add_escapes(anth);
      }
      if (i % 5 >= 3) {
        to_parts(msgs);
        to_parts(chat);
      }
      json_t *r1 = json_pack("{s:s, s:o}", "model", "m", "messages", msgs);
      json_t *r2 = json_pack("{s:s, s:o}", "model", "m", "messages", chat);
      json_t *r3 = json_pack("{s:s, s:i, s:o, s:b}", "model", "m", "max_tokens",
                             10, "messages", anth, "stream", i % 4 == 0);
      char *b1 = json_dumps(r1, flags), *b2 = json_dumps(r2, flags),
           *b3 = json_dumps(r3, flags);
      snprintf(what, sizeof what, "cfg %d run %d chat", c, i);
      stops += expect_same_decision(&cfgs[c], b1, false, what) != AG_ALLOW;
      snprintf(what, sizeof what, "cfg %d run %d pair chat", c, i);
      stops += expect_same_decision(&cfgs[c], b2, false, what) != AG_ALLOW;
      snprintf(what, sizeof what, "cfg %d run %d pair anthropic", c, i);
      stops += expect_same_decision(&cfgs[c], b3, true, what) != AG_ALLOW;
      json_decref(r1);
      json_decref(r2);
      json_decref(r3);
      free(b1);
      free(b2);
      free(b3);
    }
  }
  cr_expect_gt(stops, 100, "the random turns exercise stops (%d)", stops);
}

/* Escapes where the decision compares: in roles, keys and ids. */
Test(proxy, tape_reads_escaped_keys_and_roles) {
  ag_config cfg = test_cfg();
  const char *round =
      "{\"role\":\"assist\\u0061nt\",\"content\":null,\"tool_c\\u0061lls\":"
      "[{\"id\":\"c\\u0031\",\"type\":\"function\",\"function\":{\"name\":"
      "\"re\\u0061d\",\"arguments\":\"{\\\"p\\\":\\\"\\\\u00e9\\\"}\"}}]},"
      "{\"role\":\"tool\",\"tool_call_id\":\"\\u00631\",\"content\":"
      "\"Error: no \\\"x\\\"\"}";
  char body[2048];
  snprintf(
      body, sizeof body,
      "{\"model\":\"m\",\"messages\":[{\"role\":\"us\\u0065r\",\"content\":"
      "\"go\"},%s,%s,%s]}",
      round, round, round);
  cr_expect_eq(expect_same_decision(&cfg, body, false, "escaped"), AG_STOP);
  const char *anth_round =
      "{\"role\":\"assistant\",\"content\":[{\"type\":\"tool_\\u0075se\","
      "\"id\":\"t\\u0031\",\"name\":\"read\",\"input\":{ \"p\" : "
      "\"\\u00e9\", \"q\": [1, {\"r\": 2.50}] }}]},{\"role\":\"user\","
      "\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"t1\","
      "\"content\":[{\"type\":\"text\",\"text\":\"a\"},{\"type\":\"text\","
      "\"text\":\"b\\n\"}]}]}";
  snprintf(body, sizeof body,
           "{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\","
           "\"content\":\"go\"},%s,%s,%s]}",
           anth_round, anth_round, anth_round);
  cr_expect_eq(expect_same_decision(&cfg, body, true, "escaped anthropic"),
               AG_STOP);
  /* every byte of a compared word escaped: "tool_result", "assistant" */
  const char *full_round =
      "{\"role\":\"\\u0061\\u0073\\u0073\\u0069\\u0073\\u0074\\u0061"
      "\\u006e\\u0074\",\"content\":[{\"type\":\"tool_use\",\"id\":\"t1\","
      "\"name\":\"read\",\"input\":{}}]},{\"role\":\"user\",\"content\":[{"
      "\"type\":\"\\u0074\\u006f\\u006f\\u006c\\u005f\\u0072\\u0065"
      "\\u0073\\u0075\\u006c\\u0074\",\"tool_use_id\":\"t1\",\"content\":"
      "\"Error: x\",\"is_error\":true}]}";
  snprintf(body, sizeof body,
           "{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":\"user\","
           "\"content\":\"go\"},%s,%s,%s]}",
           full_round, full_round, full_round);
  cr_expect_eq(expect_same_decision(&cfg, body, true, "all escaped"), AG_STOP);
}

/* Bodies the tape does not take: each decided by the tree, as before. */
Test(proxy, tape_refusals_fall_back_to_the_tree) {
  ag_config cfg = test_cfg();
  char *stop = conversation(3, "read", "{\"p\":1}", "same");
  cr_assert_not_null(stop);
  /* the stopping conversation with something the tape refuses in front */
  static const char *const extras[] = {
      "\"model\":\"a\",\"model\":\"b\",", /* a duplicate key */
      "\"x\":1e400,",                     /* a number out of a double */
      "\"x\":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["
      "[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]"
      "]]]]]]]]],",                         /* deeper than the tape goes */
      "\"x\":123456789012345678901234567,", /* too big for jansson */
      "\"x\":\"a\\u0000b\",",               /* NUL: jansson refuses it */
      "\"x\":\"\xed\xa0\x80\",",            /* a surrogate in UTF-8 */
      "\"x\":\"\xc0\xaf\",",                /* an overlong encoding */
      "\"x\":[1,2,],",                      /* not JSON at all */
  };
  for (size_t i = 0; i < sizeof extras / sizeof extras[0]; i++) {
    char body[8192];
    snprintf(body, sizeof body, "{%s%s", extras[i], stop + 1);
    ag_verdict vt, vj, va;
    ag_error_t et, ej, ea;
    size_t len = strlen(body);
    cr_expect_eq(ag_proxy_decide_read(&cfg, body, len, false,
                                      AG_PROXY_READ_TAPE, &vt, &et),
                 -2, "%zu: the tape takes %s", i, body);
    int aj = ag_proxy_decide_read(&cfg, body, len, false, AG_PROXY_READ_TREE,
                                  &vj, &ej);
    int aa = ag_proxy_decide(&cfg, body, len, false, &va, &ea);
    cr_expect_eq(aa, aj, "%zu", i);
    if (aj < 0)
      cr_expect_str_eq(ea.msg, ej.msg, "%zu", i);
    else
      cr_expect_eq(va.reason, vj.reason, "%zu", i);
  }
  free(stop);
  /* malformed: the tree's message */
  ag_verdict v;
  ag_error_t e;
  cr_expect_eq(ag_proxy_decide(&cfg, "{\"messages\":[}", 14, false, &v, &e),
               -1);
  cr_expect_eq(e.code, AG_EJSON);
  cr_expect(strstr(e.msg, "not JSON") != NULL, "%s", e.msg);
}

/* ---- The relay (src/proxy/relay.c) alone -------------------------------- */

static const char relay_body[] = "0123456789abcdef0123456789abcdef";

static enum MHD_Result relay_up(void *cls, struct MHD_Connection *c,
                                const char *url, const char *method,
                                const char *version, const char *upload,
                                size_t *upload_size, void **con_cls) {
  (void)cls, (void)url, (void)method, (void)version, (void)upload;
  (void)upload_size, (void)con_cls;
  struct MHD_Response *r = MHD_create_response_from_buffer(
      sizeof relay_body - 1, (void *)relay_body, MHD_RESPMEM_PERSISTENT);
  enum MHD_Result ret = MHD_queue_response(c, 200, r);
  MHD_destroy_response(r);
  return ret;
}

typedef struct relay_probe {
  atomic_int calls;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool done;
  CURLcode cc;
} relay_probe;

static size_t relay_write(char *p, size_t s, size_t n, void *u) {
  (void)p, (void)s, (void)n;
  relay_probe *pr = u;
  if (atomic_fetch_add(&pr->calls, 1) == 0)
    return CURL_WRITEFUNC_PAUSE; /* a slow client */
  return 0; /* then the data is refused (a content loop, a bad event) */
}

static void relay_done(ag__relay_xfer *x, CURLcode cc) {
  relay_probe *pr = x->user;
  pthread_mutex_lock(&pr->mu);
  pr->done = true;
  pr->cc = cc;
  pthread_cond_signal(&pr->cv);
  pthread_mutex_unlock(&pr->mu);
}

/* A transfer whose write callback refuses the data an unpause hands it
 * ends at once with the error (libcurl reports it from curl_easy_pause
 * and stops watching the socket: before, the relay ignored it and the
 * transfer hung until its timeout, here 8 s). */
Test(proxy, relay_failed_unpause_ends_the_transfer) {
  struct MHD_Daemon *d = MHD_start_daemon(
      MHD_USE_INTERNAL_POLLING_THREAD, 0, NULL, NULL, relay_up, NULL,
      MHD_OPTION_EXTERNAL_LOGGER, quiet, NULL, MHD_OPTION_END);
  cr_assert_not_null(d);
  char url[64];
  snprintf(url, sizeof url, "http://127.0.0.1:%u/",
           (unsigned)MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT)->port);
  ag__relay *r = ag__relay_start(4, NULL);
  cr_assert_not_null(r);
  relay_probe pr;
  memset(&pr, 0, sizeof pr);
  pthread_mutex_init(&pr.mu, NULL);
  pthread_cond_init(&pr.cv, NULL);
  ag__relay_xfer x;
  memset(&x, 0, sizeof x);
  x.h = curl_easy_init();
  x.done = relay_done;
  x.user = &pr;
  curl_easy_setopt(x.h, CURLOPT_URL, url);
  curl_easy_setopt(x.h, CURLOPT_WRITEFUNCTION, relay_write);
  curl_easy_setopt(x.h, CURLOPT_WRITEDATA, &pr);
  curl_easy_setopt(x.h, CURLOPT_TIMEOUT_MS, 8000L);
  ag__relay_add(r, &x);
  int64_t t0 = ag_now_ms();
  while (atomic_load(&pr.calls) == 0 && ag_now_ms() - t0 < 10000)
    nap_ms(2);
  cr_assert_eq(atomic_load(&pr.calls), 1, "the transfer never paused");
  int64_t u0 = ag_now_ms();
  ag__relay_op op;
  memset(&op, 0, sizeof op);
  ag__relay_unpause(r, &x, &op);
  pthread_mutex_lock(&pr.mu);
  while (!pr.done)
    pthread_cond_wait(&pr.cv, &pr.mu);
  pthread_mutex_unlock(&pr.mu);
  int64_t took = ag_now_ms() - u0;
  ag__relay_stop(r);
  curl_easy_cleanup(x.h);
  MHD_stop_daemon(d);
  cr_expect_neq(pr.cc, CURLE_OK);
  cr_expect_lt(took, 3000,
               "the transfer ended %lld ms after the unpause "
               "(%s)",
               (long long)took, curl_easy_strerror(pr.cc));
  pthread_cond_destroy(&pr.cv);
  pthread_mutex_destroy(&pr.mu);
}

/* A server whose /hold requests wait for `release`; it counts the
 * connections made to it. */
static atomic_int hold_seen, hold_conns;
static atomic_bool hold_release;

static enum MHD_Result hold_up(void *cls, struct MHD_Connection *c,
                               const char *url, const char *method,
                               const char *version, const char *upload,
                               size_t *upload_size, void **state) {
  (void)cls, (void)method, (void)version, (void)upload, (void)upload_size;
  if (*state == NULL) {
    *state = c;
    return MHD_YES;
  }
  if (strcmp(url, "/hold") == 0) {
    atomic_fetch_add(&hold_seen, 1);
    int64_t t0 = ag_now_ms();
    while (!atomic_load(&hold_release) && ag_now_ms() - t0 < 20000)
      nap_ms(2);
  }
  struct MHD_Response *r =
      MHD_create_response_from_buffer(2, (void *)"ok", MHD_RESPMEM_PERSISTENT);
  enum MHD_Result ret = MHD_queue_response(c, 200, r);
  MHD_destroy_response(r);
  return ret;
}

static void hold_conn(void *cls, struct MHD_Connection *c, void **socket_ctx,
                      enum MHD_ConnectionNotificationCode code) {
  (void)cls, (void)c, (void)socket_ctx;
  if (code == MHD_CONNECTION_NOTIFY_STARTED)
    atomic_fetch_add(&hold_conns, 1);
}

static size_t discard(char *p, size_t s, size_t n, void *u) {
  (void)p, (void)u;
  return s * n;
}

/* With more transfers running than idle connections are kept, a transfer
 * that ends still leaves its connection for the next request (libcurl's
 * cache counts the connections in use: a cap of max_idle closed it, and
 * every request under load connected again). */
Test(proxy, relay_keeps_a_connection_while_many_transfers_run) {
  atomic_store(&hold_seen, 0);
  atomic_store(&hold_conns, 0);
  atomic_store(&hold_release, false);
  struct MHD_Daemon *d = MHD_start_daemon(
      MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION, 0, NULL,
      NULL, hold_up, NULL, MHD_OPTION_NOTIFY_CONNECTION, hold_conn, NULL,
      MHD_OPTION_EXTERNAL_LOGGER, quiet, NULL, MHD_OPTION_END);
  cr_assert_not_null(d);
  unsigned port =
      (unsigned)MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT)->port;
  char hold_url[64], quick_url[64];
  snprintf(hold_url, sizeof hold_url, "http://127.0.0.1:%u/hold", port);
  snprintf(quick_url, sizeof quick_url, "http://127.0.0.1:%u/quick", port);
  ag__relay *r = ag__relay_start(1, NULL); /* one idle connection kept */
  cr_assert_not_null(r);
  enum { HOLDS = 3 };
  relay_probe pr[HOLDS];
  ag__relay_xfer x[HOLDS];
  for (int i = 0; i < HOLDS; i++) {
    memset(&pr[i], 0, sizeof pr[i]);
    pthread_mutex_init(&pr[i].mu, NULL);
    pthread_cond_init(&pr[i].cv, NULL);
    memset(&x[i], 0, sizeof x[i]);
    x[i].h = curl_easy_init();
    x[i].done = relay_done;
    x[i].user = &pr[i];
    curl_easy_setopt(x[i].h, CURLOPT_URL, hold_url);
    curl_easy_setopt(x[i].h, CURLOPT_WRITEFUNCTION, discard);
    curl_easy_setopt(x[i].h, CURLOPT_TIMEOUT_MS, 30000L);
    ag__relay_add(r, &x[i]);
  }
  int64_t t0 = ag_now_ms();
  while (atomic_load(&hold_seen) < HOLDS && ag_now_ms() - t0 < 10000)
    nap_ms(2);
  cr_assert_eq(atomic_load(&hold_seen), HOLDS);
  CURLcode cc[2];
  for (int k = 0; k < 2; k++) {
    CURL *h = curl_easy_init();
    curl_easy_setopt(h, CURLOPT_URL, quick_url);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, discard);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 10000L);
    cc[k] = ag__relay_run(r, h);
    curl_easy_cleanup(h);
  }
  int conns = atomic_load(&hold_conns);
  atomic_store(&hold_release, true);
  for (int i = 0; i < HOLDS; i++) {
    pthread_mutex_lock(&pr[i].mu);
    while (!pr[i].done)
      pthread_cond_wait(&pr[i].cv, &pr[i].mu);
    pthread_mutex_unlock(&pr[i].mu);
  }
  ag__relay_stop(r);
  for (int i = 0; i < HOLDS; i++) {
    curl_easy_cleanup(x[i].h);
    cr_expect_eq(pr[i].cc, CURLE_OK);
    pthread_cond_destroy(&pr[i].cv);
    pthread_mutex_destroy(&pr[i].mu);
  }
  MHD_stop_daemon(d);
  cr_expect_eq(cc[0], CURLE_OK);
  cr_expect_eq(cc[1], CURLE_OK);
  cr_expect_eq(conns, HOLDS + 1,
               "%d connections: the second quick request connected again",
               conns);
}

/* ---- Hardening (docs/security.md, "The proxy") ------------------------- */

/* A request with the raw request-target `target` (CURLOPT_REQUEST_TARGET:
 * what no URL could make curl send). */
static resp *call_target(const ag_proxy *p, const char *method,
                         const char *target, const char *body) {
  CURL *h = curl_easy_init();
  curl_easy_setopt(h, CURLOPT_REQUEST_TARGET, target);
  resp *r = call_on(h, p, method, "/", body, NULL);
  curl_easy_cleanup(h);
  return r;
}

Test(proxy, request_target_not_a_path_is_400_and_goes_nowhere) {
  /* an upstream without a path, the documented form for Anthropic: the
   * target used to be appended to it as a string, so "@host:port/..."
   * made the upstream the userinfo of a URL to any host */
  ag_proxy_stop(P);
  snprintf(upstream_url, sizeof upstream_url, "http://127.0.0.1:%d", U.port);
  P = proxy_with(test_cfg(), 0, NULL);
  const char *targets[] = {
      "@127.0.0.1:%d/latest/meta-data", "//127.0.0.1:%d/latest/meta-data",
      "http://127.0.0.1:%d/v1/models", "127.0.0.1:%d", "*"};
  const char *methods[] = {"GET", "GET", "GET", "CONNECT", "OPTIONS"};
  for (size_t i = 0; i < sizeof targets / sizeof targets[0]; i++) {
    char t[128];
    snprintf(t, sizeof t, targets[i], U.port);
    resp *r = call_target(P, methods[i], t, NULL);
    char code[64];
    cr_expect_eq(r->status, 400, "%s %s: %ld %s", methods[i], t, r->status,
                 r->body);
    if (r->status == 400)
      cr_expect_str_eq(err_code(r, code, sizeof code), "bad_request_target");
    free(r);
  }
  cr_expect_eq(n_upstream(), 0, "nothing reached any host");
}

Test(proxy, dot_segments_and_escapes_cannot_pass_the_guard) {
  /* each of these is routed by the upstream as /v1/chat/completions (curl
   * removes dot segments, nginx merges slashes, servers decode %63): each
   * must be decided, and stopped, as that path is */
  ag_proxy_stop(P);
  ag_config c = test_cfg();
  c.loop.identical_call_limit = 0;
  P = proxy_with(c, 0, NULL);
  char *body =
      conversation(3, "read", "{\"path\":\"x\"}", "Error: no such file");
  const char *paths[] = {"/v1/./chat/completions",  "/v1/x/../chat/completions",
                         "/v1//chat/completions",   "/v1/%63hat/completions",
                         "/v1/chat/completions/",   "/v1/chat/%2E/completions",
                         "/v1/chat/completions?x=1"};
  for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
    resp *r = call_target(P, "POST", paths[i], body);
    cr_expect_eq(r->status, 200, "%s: %ld %s", paths[i], r->status, r->body);
    cr_expect_str_eq(r->stop, "consecutive_errors", "%s", paths[i]);
    free(r);
  }
  cr_expect_eq(n_upstream(), 0, "nothing went upstream unguarded");
  /* what cannot be normalised safely is refused */
  const char *bad[] = {"/v1/chat%2Fcompletions",  "/v1/chat%5ccompletions",
                       "/v1/chat/completions%00", "/v1/%zz",
                       "/../v1/chat/completions", "/v1/chat\\completions"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    resp *r = call_target(P, "POST", bad[i], body);
    cr_expect_eq(r->status, 400, "%s: %ld %s", bad[i], r->status, r->body);
    free(r);
  }
  cr_expect_eq(n_upstream(), 0);
  free(body);
}

Test(proxy, passed_through_paths_go_upstream_normalised) {
  canned_add(200, "{\"data\":[]}");
  resp *r = call_target(P, "GET", "/v1/x/../models/./m%2d1?q=a%20b", NULL);
  cr_expect_eq(r->status, 200, "%ld %s", r->status, r->body);
  cr_assert_eq(n_upstream(), 1);
  pthread_mutex_lock(&U.mu);
  cr_expect_str_eq(U.reqs[0].url, "/v1/models/m-1");
  cr_expect_str_eq(U.reqs[0].query, "a b");
  pthread_mutex_unlock(&U.mu);
  free(r);
}

/* The upstream's password planted in --upstream and in the environment,
 * looked for in everything the proxy writes. */
#define PLANTED "Planted-S3cret-9f2c1e"

Test(proxy, upstream_credentials_never_leave) {
  ag_proxy_stop(P);
  P = NULL; /* the proxy here is the program's */
  MHD_stop_daemon(U.d);
  U.d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD, 0, NULL, NULL,
                         up_handler, NULL, MHD_OPTION_END);
  int port = MHD_get_daemon_info(U.d, MHD_DAEMON_INFO_BIND_PORT)->port;
  MHD_stop_daemon(U.d); /* the port is now closed */
  U.d = NULL;
  setenv("AG_TEST_UPSTREAM_PASSWORD", PLANTED, 1);
  char ev_path[] = "/tmp/ag_proxy_events_XXXXXX";
  int efd = mkstemp(ev_path);
  cr_assert_geq(efd, 0);
  close(efd);
  char err_path[] = "/tmp/ag_proxy_stderr_XXXXXX";
  int sfd = mkstemp(err_path);
  cr_assert_geq(sfd, 0);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) {
    /* the test runner's signal dispositions are not the program's */
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    dup2(sfd, 2);
    int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 1);
    char up[128], bin[512];
    snprintf(up, sizeof up, "http://agent:%s@127.0.0.1:%d/v1", PLANTED, port);
    snprintf(bin, sizeof bin, "%s/agentguard", AG_BINARY_DIR);
    execl(bin, bin, "proxy", "--upstream", up, "--listen", "127.0.0.1:0",
          "--events", ev_path, (char *)NULL);
    _exit(127);
  }
  /* the port, from "listening on http://127.0.0.1:PORT" */
  unsigned pport = 0;
  for (int i = 0; i < 200 && pport == 0; i++) {
    nap_ms(25);
    char buf[1024] = {0};
    ssize_t n = pread(sfd, buf, sizeof buf - 1, 0);
    const char *at =
        n > 0 ? strstr(buf, "listening on http://127.0.0.1:") : NULL;
    if (at != NULL)
      pport = (unsigned)atoi(at + strlen("listening on http://127.0.0.1:"));
  }
  cr_assert_gt(pport, 0, "the proxy did not start");
  char bodies[3][65536];
  const char *paths[] = {"/v1/chat/completions", "/v1/models",
                         "/v1/chat/completions"};
  char *conv = conversation(0, "read", "{}", "");
  char *sconv = streaming(conversation(0, "read", "{}", ""));
  const char *posts[] = {conv, NULL, sconv};
  for (int i = 0; i < 3; i++) {
    CURL *h = curl_easy_init();
    char url[256];
    snprintf(url, sizeof url, "http://127.0.0.1:%u%s", pport, paths[i]);
    resp r;
    memset(&r, 0, sizeof r);
    curl_easy_setopt(h, CURLOPT_URL, url);
    if (posts[i] != NULL)
      curl_easy_setopt(h, CURLOPT_POSTFIELDS, posts[i]);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, rbody);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &r);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 20000L);
    cr_expect_eq(curl_easy_perform(h), CURLE_OK);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r.status);
    cr_expect_eq(r.status, 502, "%s: %ld %s", paths[i], r.status, r.body);
    char origin[64];
    snprintf(origin, sizeof origin, "http://127.0.0.1:%d", port);
    cr_expect(strstr(r.body, origin) != NULL, "names the upstream: %s", r.body);
    memcpy(bodies[i], r.body, sizeof bodies[i]);
    curl_easy_cleanup(h);
  }
  free(conv);
  free(sconv);
  kill(pid, SIGTERM);
  int st = 0;
  waitpid(pid, &st, 0);
  char all[1 << 16] = {0};
  ssize_t n = pread(sfd, all, sizeof all - 1, 0);
  close(sfd);
  cr_expect_gt(n, 0);
  FILE *f = fopen(ev_path, "r");
  cr_assert_not_null(f);
  char evs[1 << 16] = {0};
  size_t en = fread(evs, 1, sizeof evs - 1, f);
  fclose(f);
  (void)en;
  for (int i = 0; i < 3; i++) {
    cr_expect(strstr(bodies[i], PLANTED) == NULL, "body %d: %s", i, bodies[i]);
    cr_expect(strstr(bodies[i], "agent:") == NULL, "body %d: %s", i, bodies[i]);
  }
  cr_expect(strstr(all, PLANTED) == NULL, "stderr: %s", all);
  cr_expect(strstr(all, "agent:") == NULL, "stderr: %s", all);
  cr_expect(strstr(evs, PLANTED) == NULL, "events: %s", evs);
  unlink(ev_path);
  unlink(err_path);
  unsetenv("AG_TEST_UPSTREAM_PASSWORD");
  U.d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD, 0, NULL, NULL,
                         up_handler, NULL, MHD_OPTION_END);
}

Test(proxy, upstream_url_with_a_query_is_refused_without_its_password) {
  char err[4096];
  cr_expect_eq(cli("--upstream 'http://u:" PLANTED "@127.0.0.1:1/v1?x=1'", err,
                   sizeof err),
               2);
  cr_expect(strstr(err, "query") != NULL, "%s", err);
  cr_expect(strstr(err, PLANTED) == NULL, "%s", err);
  cr_expect_eq(cli("--upstream 'http://u:" PLANTED "@'", err, sizeof err), 2);
  cr_expect(strstr(err, PLANTED) == NULL, "%s", err);
}

Test(proxy, stream_cut_off_ends_with_an_error_not_done) {
  /* two text chunks, then the upstream closes: no finish_reason, no
   * [DONE] */
  const char *head = "{\"id\":\"chatcmpl-s\",\"object\":\"chat.completion."
                     "chunk\",\"created\":1,\"model\":\"m\",\"choices\":";
  char b[1024];
  snprintf(b, sizeof b,
           "data: %s[{\"index\":0,\"delta\":{\"content\":\"Hello\"},"
           "\"finish_reason\":null}]}\n\n"
           "data: %s[{\"index\":0,\"delta\":{\"content\":\" wor\"},"
           "\"finish_reason\":null}]}\n\n",
           head, head);
  canned_add(200, b);
  char *body = streaming(conversation(0, "read", "{}", ""));
  resp *r = call(P, "POST", "/v1/chat/completions", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect(strstr(r->body, "Hello") != NULL, "%s", r->body);
  cr_expect(!ends_with_done(r), "a cut stream is not made whole: %s", r->body);
  cr_expect(strstr(r->body, "\"error\"") != NULL, "%s", r->body);
  cr_expect(strstr(r->body, "cut off") != NULL, "%s", r->body);
  free(r);
  free(body);
  /* garbage instead of events: the same */
  canned_reset();
  canned_add(200, "data: {\"id\":\"x\",\"choices\":[{\"index\":0,\"delta\":"
                  "{\"content\":\"Hi\"}}]}\n\nthis is no event\n\n");
  body = streaming(conversation(0, "read", "{}", ""));
  r = call(P, "POST", "/v1/chat/completions", body, NULL);
  cr_expect(!ends_with_done(r), "%s", r->body);
  cr_expect(strstr(r->body, "\"error\"") != NULL, "%s", r->body);
  free(r);
  free(body);
}

Test(proxy, anthropic_stream_cut_off_ends_with_an_error_event) {
  canned_add(200, "event: message_start\ndata: {\"type\":\"message_start\","
                  "\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":"
                  "\"assistant\",\"model\":\"claude\",\"content\":[],"
                  "\"stop_reason\":null,\"usage\":{\"input_tokens\":1,"
                  "\"output_tokens\":1}}}\n\n"
                  "event: content_block_start\ndata: {\"type\":"
                  "\"content_block_start\",\"index\":0,\"content_block\":{"
                  "\"type\":\"text\",\"text\":\"\"}}\n\n"
                  "event: content_block_delta\ndata: {\"type\":"
                  "\"content_block_delta\",\"index\":0,\"delta\":{\"type\":"
                  "\"text_delta\",\"text\":\"Hello\"}}\n\n");
  char *body = messages_conv(0, "{}", "", false, true);
  resp *r = call(P, "POST", "/v1/messages", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect(strstr(r->body, "Hello") != NULL, "%s", r->body);
  cr_expect(strstr(r->body, "event: message_stop") == NULL, "%s", r->body);
  cr_expect(strstr(r->body, "event: error") != NULL, "%s", r->body);
  free(r);
  free(body);
}

/* An upstream that takes connections and never answers; it counts the
 * connections the proxy closes (read to their end). */
typedef struct silent_up {
  int lfd;
  int port;
  atomic_int accepted, closed;
  atomic_bool quit;
  pthread_t t;
} silent_up;

static void *silent_main(void *arg) {
  silent_up *s = arg;
  struct pollfd fds[33];
  int n = 1;
  fds[0] = (struct pollfd){.fd = s->lfd, .events = POLLIN};
  while (!atomic_load(&s->quit)) {
    if (poll(fds, (nfds_t)n, 50) <= 0)
      continue;
    for (int i = n - 1; i >= 1; i--) {
      if (fds[i].revents == 0)
        continue;
      char buf[4096];
      ssize_t r = read(fds[i].fd, buf, sizeof buf);
      if (r <= 0) {
        close(fds[i].fd);
        fds[i] = fds[--n];
        atomic_fetch_add(&s->closed, 1);
      }
    }
    if ((fds[0].revents & POLLIN) && n < 33) {
      int c = accept(s->lfd, NULL, NULL);
      if (c >= 0) {
        fds[n++] = (struct pollfd){.fd = c, .events = POLLIN};
        atomic_fetch_add(&s->accepted, 1);
      }
    }
  }
  for (int i = 0; i < n; i++)
    close(fds[i].fd);
  return NULL;
}

static void silent_start(silent_up *s) {
  memset(s, 0, sizeof *s);
  s->lfd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET,
                           .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  cr_assert_eq(bind(s->lfd, (struct sockaddr *)&sa, sizeof sa), 0);
  cr_assert_eq(listen(s->lfd, 64), 0);
  socklen_t sl = sizeof sa;
  getsockname(s->lfd, (struct sockaddr *)&sa, &sl);
  s->port = ntohs(sa.sin_port);
  pthread_create(&s->t, NULL, silent_main, s);
}

/* A silent upstream, and the test's proxy in front of it with
 * --max-connections max_conns (and per_client, 0: the default). */
static void silent_proxy(silent_up *s, int max_conns, int per_client) {
  silent_start(s);
  ag_proxy_stop(P);
  snprintf(upstream_url, sizeof upstream_url, "http://127.0.0.1:%d/v1",
           s->port);
  ag_proxy_opts o = test_opts();
  o.max_connections = max_conns;
  o.max_connections_per_client = per_client;
  P = start_with(&o);
}

static void silent_stop(silent_up *s) {
  atomic_store(&s->quit, true);
  pthread_join(s->t, NULL);
}

/* A client that sends `body` and gives up after `ms`. */
static CURLcode impatient(const ag_proxy *p, const char *body, long ms) {
  CURL *h = curl_easy_init();
  char url[128];
  snprintf(url, sizeof url, "http://127.0.0.1:%u/v1/chat/completions",
           (unsigned)ag_proxy_port(p));
  resp r;
  memset(&r, 0, sizeof r);
  curl_easy_setopt(h, CURLOPT_URL, url);
  curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, rbody);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &r);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, ms);
  CURLcode cc = curl_easy_perform(h);
  curl_easy_cleanup(h);
  return cc;
}

/* Clients that leave while the upstream has not answered: each one's
 * upstream transfer ends within about a second (libcurl's progress
 * callback watches the suspended client's socket), so its slot, worker
 * and upstream connection are free again - before, they waited for the
 * upstream or the 10-minute transfer limit, and --max-connections such
 * clients locked every later one out. Plain and streamed requests. */
Test(proxy, client_gone_while_upstream_silent_frees_everything) {
  silent_up s;
  silent_proxy(&s, 2, 0);
  char *plain = conversation(0, "read", "{}", "");
  char *streamed = streaming(conversation(0, "read", "{}", ""));
  for (int round = 0; round < 2; round++) {
    int before = atomic_load(&s.closed);
    cr_expect_eq(impatient(P, plain, 300), CURLE_OPERATION_TIMEDOUT);
    cr_expect_eq(impatient(P, streamed, 300), CURLE_OPERATION_TIMEDOUT);
    int64_t left = ag_now_ms();
    while (atomic_load(&s.closed) < before + 2 && ag_now_ms() - left < 5000)
      nap_ms(20);
    cr_expect_geq(atomic_load(&s.closed), before + 2,
                  "round %d: %d upstream transfers still open 5 s after "
                  "their clients left",
                  round, before + 2 - atomic_load(&s.closed));
  }
  cr_expect_eq(atomic_load(&s.accepted), 4);
  free(plain);
  free(streamed);
  ag_proxy_stop(P);
  P = NULL;
  silent_stop(&s);
}

typedef struct impatient_arg {
  const ag_proxy *p;
  const char *body;
  long ms;
  CURLcode cc;
} impatient_arg;

static void *impatient_main(void *arg) {
  impatient_arg *a = arg;
  a->cc = impatient(a->p, a->body, a->ms);
  return NULL;
}

/* A connection whose request is under way keeps its slot: past
 * --max-connections new ones get a 503 (and are closed); once the first
 * client leaves, the slot is free again. */
Test(proxy, connections_past_the_limit_get_503) {
  silent_up s;
  silent_proxy(&s, 1, 0);
  char *plain = conversation(0, "read", "{}", "");
  impatient_arg a = {P, plain, 1500, CURLE_OK};
  pthread_t t;
  pthread_create(&t, NULL, impatient_main, &a);
  while (atomic_load(&s.accepted) < 1)
    nap_ms(10);
  for (int i = 0; i < 4; i++) {
    resp *r = call(P, "GET", "/v1/models", NULL, NULL);
    cr_expect_eq(r->status, 503, "%s", r->body);
    cr_expect(strstr(r->body, "too_many_connections") != NULL, "%s", r->body);
    free(r);
  }
  pthread_join(t, NULL);
  cr_expect_eq(a.cc, CURLE_OPERATION_TIMEDOUT);
  /* the slot is free once the first client has left: a new request is
   * taken (it waits for the silent upstream: no 503) */
  bool taken = false;
  for (int i = 0; i < 50 && !taken; i++) {
    taken = impatient(P, plain, 200) == CURLE_OPERATION_TIMEDOUT;
    if (!taken)
      nap_ms(50);
  }
  cr_expect(taken, "no request was taken after the first client left");
  free(plain);
  ag_proxy_stop(P);
  P = NULL;
  silent_stop(&s);
}

/* A plain TCP connection to the proxy that sends `what` (may be NULL). */
static int raw_connect(const ag_proxy *p, const char *what) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET,
                           .sin_port = htons(ag_proxy_port(p)),
                           .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
    close(fd);
    return -1;
  }
  if (fd >= 0 && what != NULL)
    cr_expect_eq(write(fd, what, strlen(what)), (ssize_t)strlen(what));
  return fd;
}

/* Whether the proxy has closed fd (read gives its end or a reset). */
static bool closed_by_peer(int fd) {
  char b[256];
  struct pollfd pf = {.fd = fd, .events = POLLIN};
  if (poll(&pf, 1, 0) != 1)
    return false;
  ssize_t n = recv(fd, b, sizeof b, MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno == ECONNRESET);
}

/* Idle connections and slowloris clients (one header byte every 100 ms,
 * never done) hold every slot: a legitimate client is still served at
 * once (the one waiting longest gives way), and the slow ones are closed at
 * their deadlines (which a byte does not move). */
Test(proxy, idle_and_slowloris_connections_cannot_lock_clients_out) {
  ag_proxy_stop(P);
  ag_proxy_opts o = test_opts();
  o.max_connections = 8;
  o.header_timeout_ms = 600;
  o.idle_timeout_ms = 600;
  P = start_with(&o);
  canned_add(200, "{\"data\":[]}");
  enum { N_IDLE = 200, N_SLOW = 8 };
  int idle[N_IDLE], slow[N_SLOW];
  for (int i = 0; i < N_IDLE; i++)
    idle[i] = raw_connect(P, NULL);
  for (int i = 0; i < N_SLOW; i++)
    slow[i] = raw_connect(P, "GET /v1/models HTTP/1.1\r\nHost: x\r\n");
  nap_ms(100);
  int64_t t0 = ag_now_ms();
  resp *r = call(P, "GET", "/v1/models", NULL, NULL);
  int64_t took = ag_now_ms() - t0;
  cr_expect_eq(r->status, 200, "%s", r->body);
  cr_expect_lt(took, 1000, "served after %lld ms", (long long)took);
  free(r);
  /* the slow ones keep sending; their deadline holds */
  int gone = 0;
  for (int k = 0; k < 40 && gone < N_SLOW; k++) {
    nap_ms(100);
    gone = 0;
    for (int i = 0; i < N_SLOW; i++) {
      if (slow[i] >= 0 && closed_by_peer(slow[i])) {
        close(slow[i]);
        slow[i] = -1;
      }
      if (slow[i] < 0)
        gone++;
      else if (send(slow[i], "X", 1, MSG_NOSIGNAL) < 0) {
        close(slow[i]);
        slow[i] = -1;
      }
    }
  }
  cr_expect_eq(gone, N_SLOW, "%d of %d slow clients still connected",
               N_SLOW - gone, N_SLOW);
  for (int i = 0; i < N_IDLE; i++)
    if (idle[i] >= 0)
      close(idle[i]);
  for (int i = 0; i < N_SLOW; i++)
    if (slow[i] >= 0)
      close(slow[i]);
}

/* The client key is checked as soon as the headers are in: a client
 * without it is answered 401 before its body is read, and closed. */
Test(proxy, client_key_is_checked_before_the_body) {
  ag_proxy_stop(P);
  P = proxy_with(test_cfg(), 0, "k3y-for-clients");
  int fd = raw_connect(P, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                          "Content-Length: 1000000\r\n\r\n{");
  char buf[512] = {0};
  struct pollfd pf = {.fd = fd, .events = POLLIN};
  cr_assert_eq(poll(&pf, 1, 5000), 1, "no answer before the body");
  ssize_t n = read(fd, buf, sizeof buf - 1);
  cr_expect_gt(n, 12);
  cr_expect(strncmp(buf, "HTTP/1.1 401", 12) == 0, "%s", buf);
  close(fd);
  cr_expect_eq(n_upstream(), 0);
}

/* ---- The budget of bodies held whole (budget.c) ------------------------ */

#include "budget.h"

typedef struct budget_waiter {
  ag__budget *b;
  size_t n, held;
  atomic_bool got;
} budget_waiter;

static void *budget_waiter_main(void *arg) {
  budget_waiter *w = arg;
  ag__budget_wait(w->b, w->n, w->held);
  atomic_store(&w->got, true);
  return NULL;
}

Test(budget, bytes_past_the_cap_wait_for_a_release) {
  ag__budget *b = ag__budget_new(100);
  cr_assert_not_null(b);
  cr_expect(ag__budget_try(b, 80, 0));
  cr_expect(!ag__budget_try(b, 40, 0), "past the cap");
  /* B waits: A holds 80 and is not waiting, so A will give them back */
  budget_waiter w = {b, 50, 0, false};
  pthread_t t;
  pthread_create(&t, NULL, budget_waiter_main, &w);
  nap_ms(100);
  cr_expect(!atomic_load(&w.got), "took bytes that are not there");
  cr_expect(!ag__budget_try(b, 1, 0), "a newcomer overtook a waiter");
  ag__budget_release(b, 80, 0);
  pthread_join(t, NULL);
  cr_expect(atomic_load(&w.got));
  cr_expect_eq(ag__budget_used(b), 50);
  ag__budget_release(b, 50, 0);
  cr_expect_eq(ag__budget_used(b), 0);
  ag__budget_free(b);
}

Test(budget, a_lone_waiter_goes_past_the_cap) {
  /* A holds 80 and wants 40 more: no other body could give any back, so
   * waiting would be for ever; it goes past the cap */
  ag__budget *b = ag__budget_new(100);
  cr_expect(ag__budget_try(b, 80, 0));
  ag__budget_wait(b, 40, 80);
  cr_expect_eq(ag__budget_used(b), 120);
  /* while it holds them, a second waits (A is running, not waiting) */
  budget_waiter w = {b, 40, 0, false};
  pthread_t t;
  pthread_create(&t, NULL, budget_waiter_main, &w);
  nap_ms(100);
  cr_expect(!atomic_load(&w.got));
  ag__budget_release(b, 120, 0);
  pthread_join(t, NULL);
  cr_expect_eq(ag__budget_used(b), 40);
  ag__budget_release(b, 40, 0);
  ag__budget_free(b);
}

Test(budget, holders_all_waiting_let_the_oldest_through) {
  /* A and B each hold 50 (the cap) and both want more: no deadlock, the
   * one that waited first goes on, then the other once A is done */
  ag__budget *b = ag__budget_new(100);
  cr_expect(ag__budget_try(b, 50, 0));
  cr_expect(ag__budget_try(b, 50, 0));
  budget_waiter wa = {b, 50, 50, false}, wb = {b, 50, 50, false};
  pthread_t ta, tb;
  pthread_create(&ta, NULL, budget_waiter_main, &wa);
  nap_ms(50);
  pthread_create(&tb, NULL, budget_waiter_main, &wb);
  pthread_join(ta, NULL);
  nap_ms(50);
  cr_expect(!atomic_load(&wb.got), "two past the cap at once");
  ag__budget_release(b, 100, 0); /* A is done */
  pthread_join(tb, NULL);
  cr_expect_eq(ag__budget_used(b), 100);
  ag__budget_release(b, 100, 0);
  ag__budget_free(b);
}

typedef struct big_reply_client {
  const ag_proxy *p;
  const char *body;
  long status;
  size_t len;
} big_reply_client;

static void *big_reply_main(void *arg) {
  big_reply_client *c = arg;
  char url[128];
  snprintf(url, sizeof url, "http://127.0.0.1:%u/v1/chat/completions",
           (unsigned)ag_proxy_port(c->p));
  big_body b;
  memset(&b, 0, sizeof b);
  CURL *h = curl_easy_init();
  curl_easy_setopt(h, CURLOPT_URL, url);
  curl_easy_setopt(h, CURLOPT_POSTFIELDS, c->body);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, big_write);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 30000L);
  if (curl_easy_perform(h) == CURLE_OK)
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &c->status);
  c->len = b.len;
  curl_easy_cleanup(h);
  free(b.p);
  return NULL;
}

/* Guarded replies larger than the whole budget, six at once: each waits
 * its turn (or the lone one goes past the cap), none fails, none hangs. */
Test(proxy, replies_past_the_buffer_budget_wait_their_turn) {
  ag_proxy_stop(P);
  ag_proxy_opts o = test_opts();
  o.max_buffered = 128 << 10;
  P = start_with(&o);
  size_t tl = 300 << 10;
  char *text = malloc(tl + 16);
  /* varied text: a repeated one would be the content-loop detector's */
  size_t at = 0;
  for (unsigned long k = 1; at < tl; k++)
    at += (size_t)sprintf(text + at, "%lx ", k * 2654435761ul);
  text[tl] = '\0';
  canned_call(NULL, text);
  free(text);
  char *body = conversation(0, "read", "{}", "");
  enum { N = 6 };
  big_reply_client c[N];
  pthread_t t[N];
  for (int i = 0; i < N; i++) {
    c[i] = (big_reply_client){P, body, 0, 0};
    pthread_create(&t[i], NULL, big_reply_main, &c[i]);
  }
  for (int i = 0; i < N; i++) {
    pthread_join(t[i], NULL);
    cr_expect_eq(c[i].status, 200, "client %d", i);
    cr_expect_gt(c[i].len, tl, "client %d got %zu bytes", i, c[i].len);
  }
  free(body);
}

/* A passed-through body the upstream cuts short is not made whole: the
 * client sees the transfer fail, not a complete shorter body. */
Test(proxy, passed_through_body_cut_short_stays_cut) {
  int lfd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET,
                           .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  cr_assert_eq(bind(lfd, (struct sockaddr *)&sa, sizeof sa), 0);
  cr_assert_eq(listen(lfd, 4), 0);
  socklen_t sl = sizeof sa;
  getsockname(lfd, (struct sockaddr *)&sa, &sl);
  ag_proxy_stop(P);
  snprintf(upstream_url, sizeof upstream_url, "http://127.0.0.1:%d",
           ntohs(sa.sin_port));
  P = proxy_with(test_cfg(), 0, NULL);
  pid_t pid = fork();
  cr_assert_geq(pid, 0);
  if (pid == 0) { /* the upstream: promises 100000 bytes, sends 5000 */
    int c = accept(lfd, NULL, NULL);
    char req[4096];
    if (read(c, req, sizeof req) <= 0)
      _exit(1);
    const char *head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                       "Content-Length: 100000\r\n\r\n";
    char part[5000];
    memset(part, 'x', sizeof part);
    if (write(c, head, strlen(head)) < 0 || write(c, part, sizeof part) < 0)
      _exit(1);
    close(c);
    _exit(0);
  }
  close(lfd);
  char url[128];
  snprintf(url, sizeof url, "http://127.0.0.1:%u/v1/files/f1/content",
           (unsigned)ag_proxy_port(P));
  big_body b;
  memset(&b, 0, sizeof b);
  CURL *h = curl_easy_init();
  curl_easy_setopt(h, CURLOPT_URL, url);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, big_write);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &b);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 20000L);
  CURLcode cc = curl_easy_perform(h);
  curl_easy_cleanup(h);
  int st = 0;
  waitpid(pid, &st, 0);
  cr_expect_neq(cc, CURLE_OK,
                "a cut body reached the client as whole (%zu "
                "bytes)",
                b.len);
  cr_expect_leq(b.len, 5000);
  free(b.p);
}

static size_t count_bytes(char *p, size_t s, size_t n, void *u) {
  (void)p;
  *(size_t *)u += s * n;
  return s * n;
}

static ssize_t big_gen(void *cls, uint64_t pos, char *buf, size_t max) {
  uint64_t total = *(const uint64_t *)cls;
  if (pos >= total)
    return MHD_CONTENT_READER_END_OF_STREAM;
  size_t n = total - pos < max ? (size_t)(total - pos) : max;
  memset(buf, 'z', n);
  return (ssize_t)n;
}

static enum MHD_Result big_handler(void *cls, struct MHD_Connection *c,
                                   const char *url, const char *method,
                                   const char *version, const char *upload,
                                   size_t *upload_size, void **con_cls) {
  (void)url, (void)method, (void)version, (void)upload, (void)upload_size;
  (void)con_cls;
  uint64_t *total = cls;
  struct MHD_Response *r = MHD_create_response_from_callback(
      *total, 64 * 1024, big_gen, total, NULL);
  enum MHD_Result ret = MHD_queue_response(c, 200, r);
  MHD_destroy_response(r);
  return ret;
}

/* A passed-through body is relayed, not held: one larger than the cap on
 * a held reply (32 MiB) goes through whole (it used to be a 502). */
Test(proxy, passed_through_body_is_not_held_whole) {
  static uint64_t total = (uint64_t)AG_PROXY_UPSTREAM_MAX + (8u << 20);
  struct MHD_Daemon *d = MHD_start_daemon(
      MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION, 0, NULL,
      NULL, big_handler, &total, MHD_OPTION_EXTERNAL_LOGGER, quiet, NULL,
      MHD_OPTION_END);
  cr_assert_not_null(d);
  ag_proxy_stop(P);
  snprintf(upstream_url, sizeof upstream_url, "http://127.0.0.1:%u",
           (unsigned)MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT)->port);
  P = proxy_with(test_cfg(), 0, NULL);
  char url[128];
  snprintf(url, sizeof url, "http://127.0.0.1:%u/v1/files/f/content",
           (unsigned)ag_proxy_port(P));
  size_t got = 0;
  CURL *h = curl_easy_init();
  curl_easy_setopt(h, CURLOPT_URL, url);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, count_bytes);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &got);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 60000L);
  CURLcode cc = curl_easy_perform(h);
  long status = 0;
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
  curl_easy_cleanup(h);
  ag_proxy_stop(P);
  P = NULL;
  MHD_stop_daemon(d);
  cr_expect_eq(cc, CURLE_OK, "%s", curl_easy_strerror(cc));
  cr_expect_eq(status, 200);
  cr_expect_eq(got, (size_t)total);
}

/* One client address holds at most --max-connections-per-client: past it
 * a new connection gets a 503 when the address's own are all busy (an
 * idle one of its own would give way), while the proxy has slots left. */
Test(proxy, one_address_holds_at_most_its_share) {
  silent_up s;
  silent_proxy(&s, 8, 1); /* given: loopback too */
  char *plain = conversation(0, "read", "{}", "");
  impatient_arg a = {P, plain, 1500, CURLE_OK};
  pthread_t t;
  pthread_create(&t, NULL, impatient_main, &a);
  while (atomic_load(&s.accepted) < 1)
    nap_ms(10);
  resp *r = call(P, "GET", "/v1/models", NULL, NULL);
  cr_expect_eq(r->status, 503, "%s", r->body);
  cr_expect(strstr(r->body, "--max-connections-per-client") != NULL, "%s",
            r->body);
  free(r);
  pthread_join(t, NULL);
  free(plain);
  ag_proxy_stop(P);
  P = NULL;
  silent_stop(&s);
}

/* ---- The audit reads every shape the proxy guards ----------------------- */

/* A Messages conversation whose tool results fail four times in a row:
 * `agentguard audit` reports the stop the proxy makes of it (before, the
 * audit read it as five chat turns without calls and reported nothing). */
Test(proxy, audit_reads_a_messages_transcript_as_the_proxy_decides) {
  /* four different calls, each result a different error */
  char *conv =
      messages_conv(4, "{\"path\":\"x\"}", "Error: denied", true, false);
  json_t *req = json_loads(conv, 0, NULL);
  free(conv);
  size_t i;
  json_t *m;
  int k = 0;
  json_array_foreach(json_object_get(req, "messages"), i, m) {
    json_t *b = json_array_get(json_object_get(m, "content"), 1);
    json_t *r0 = json_array_get(json_object_get(m, "content"), 0);
    char text[64];
    snprintf(text, sizeof text, "Error: permission denied: /srv/f%d", k);
    if (json_is_object(b)) {
      json_object_set_new(b, "input", json_pack("{s:i}", "n", k));
    } else if (json_is_object(r0) &&
               json_object_get(r0, "tool_use_id") != NULL) {
      json_object_set_new(r0, "content", json_string(text));
      k++;
    }
  }
  char *body = json_dumps(req, JSON_COMPACT);
  json_decref(req);
  ag_config c;
  cr_assert_eq(ag_config_preset(&c, "default", NULL), AG_OK);
  ag_verdict v;
  ag_error_t err;
  int act = ag_proxy_decide(&c, body, strlen(body), true, &v, &err);
  cr_expect(act == AG_STOP || act == AG_ESCALATE, "%d: %s", act, body);
  cr_expect_str_eq(ag_reason_name(v.reason), "consecutive_errors");
  char path[] = "/tmp/ag_messages_XXXXXX";
  int fd = mkstemp(path);
  cr_assert_geq(fd, 0);
  cr_assert_eq(write(fd, body, strlen(body)), (ssize_t)strlen(body));
  close(fd);
  char cmd[512], out[8192];
  snprintf(cmd, sizeof cmd, "%s/agentguard audit --json %s 2>&1", AG_BINARY_DIR,
           path);
  FILE *f = popen(cmd, "r");
  cr_assert_not_null(f);
  size_t n = fread(out, 1, sizeof out - 1, f);
  out[n] = '\0';
  pclose(f);
  unlink(path);
  cr_expect(strstr(out, "\"format\":\"messages\"") != NULL, "%s", out);
  char want[64];
  snprintf(want, sizeof want, "\"reason\":\"%s\"", ag_reason_name(v.reason));
  cr_expect(strstr(out, want) != NULL, "the audit says otherwise: %s", out);
  free(body);
}

/* Random turns in Anthropic's shape: the audit of the transcript and the
 * proxy's decision on the same messages agree, stop for stop. */
Test(proxy, messages_decisions_equal_the_audits) {
  ag_config cfgs[2];
  cfgs[0] = test_cfg();
  cfgs[1] = test_cfg();
  cfgs[1].loop.nudge_before_stop = true;
  cfgs[1].loop.cycle_limit = 2;
  int stops = 0;
  for (int c = 0; c < 2; c++) {
    cfgs[c].loop.max_iterations = 0; /* the coming request never trips */
    cfgs[c].loop.max_tokens_per_turn = 0;
    ag_auditor *a = NULL;
    cr_assert_eq(ag_auditor_new(&a, &cfgs[c], NULL, NULL), AG_OK);
    for (int i = 0; i < 200; i++) {
      json_t *chat = NULL, *anth = NULL;
      random_pair(1 + (int)rnd(12), &chat, &anth);
      json_decref(chat);
      json_t *req = json_pack("{s:s, s:i, s:o}", "model", "m", "max_tokens", 10,
                              "messages", anth);
      char *body = json_dumps(req, JSON_COMPACT);
      json_decref(req);
      stops += audit_equals_decision(a, &cfgs[c], body, body, true, c, i);
      free(body);
    }
    ag_auditor_free(a);
  }
  cr_expect_gt(stops, 30, "the random turns exercise stops (%d)", stops);
}

/* A "system" message inside Messages' list (Claude Code sends them) is
 * context: no 400, the body goes upstream as it came, and it does not
 * come between repeated calls. */
Test(proxy, messages_with_system_messages_inside_are_guarded) {
  canned_message_call("{\"path\":\"b\"}");
  char *conv = messages_conv(2, "{\"path\":\"a\"}", "text of a", false, false);
  json_t *req = json_loads(conv, 0, NULL);
  free(conv);
  json_t *msgs = json_object_get(req, "messages");
  json_array_insert_new(
      msgs, 1,
      json_pack("{s:s, s:s}", "role", "system", "content",
                "<system-reminder>be brief</system-reminder>"));
  json_array_append_new(msgs, json_pack("{s:s, s:[{s:s, s:s}]}", "role",
                                        "system", "content", "type", "text",
                                        "text", "reminder"));
  char *body = json_dumps(req, JSON_COMPACT);
  json_decref(req);
  resp *r = call(P, "POST", "/v1/messages", body, NULL);
  cr_expect_eq(r->status, 200, "%s", r->body);
  cr_expect_eq(n_upstream(), 1, "forwarded");
  pthread_mutex_lock(&U.mu);
  cr_expect_str_eq(U.reqs[0].body, body, "the body goes as it came");
  pthread_mutex_unlock(&U.mu);
  free(r);
  free(body);
}

/* What Claude Code sends: system messages inside the list, thinking and
 * redacted_thinking blocks, server tools and their results, images and
 * tool references in tool results, cache_control everywhere. None of it
 * is a 400, and the same call three times in a row is still the same call
 * three times (identical_call_limit 3): stopped before it goes upstream. */
Test(proxy, messages_of_claude_code_are_read_and_guarded) {
  json_t *msgs =
      json_pack("[{s:s, s:[{s:s, s:s, s:{s:s}}]}, {s:s, s:s}]", "role", "user",
                "content", "type", "text", "text", "Fix the bug.",
                "cache_control", "type", "ephemeral", "role", "system",
                "content", "<system-reminder>Use the tools.</system-reminder>");
  for (int i = 0; i < 3; i++) {
    char id[16];
    snprintf(id, sizeof id, "toolu_%d", i);
    json_array_append_new(
        msgs,
        json_pack("{s:s, s:[{s:s, s:s, s:s}, {s:s, s:s}, {s:s, s:s, s:s, "
                  "s:{s:s}}, {s:s, s:s, s:o}, {s:s, s:s, s:s, s:{}, "
                  "s:{s:s}}]}",
                  "role", "assistant", "content", "type", "thinking",
                  "thinking", "Let me look.", "signature", "sig==", "type",
                  "redacted_thinking", "data", "EuYBCk==", "type",
                  "server_tool_use", "id", "srvtoolu_1", "name", "web_search",
                  "input", "query", "bug", "type", "web_search_tool_result",
                  "tool_use_id", "srvtoolu_1", "content", json_array(), "type",
                  "tool_use", "id", id, "name", "read", "input",
                  "cache_control", "type", "ephemeral"));
    json_array_append_new(
        msgs,
        json_pack("{s:s, s:[{s:s, s:s, s:[{s:s, s:s}, {s:s, s:{s:s, s:s, "
                  "s:s}}, {s:s, s:s}]}]}",
                  "role", "user", "content", "type", "tool_result",
                  "tool_use_id", id, "content", "type", "text", "text",
                  "file text", "type", "image", "source", "type", "base64",
                  "media_type", "image/png", "data", "iVBORw0KGgo=", "type",
                  "tool_reference", "tool_name", "read"));
    json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "system",
                                          "content", "<reminder/>"));
  }
  json_t *req = json_pack("{s:s, s:i, s:o, s:b, s:[{s:s, s:{s:s}}]}", "model",
                          "claude-opus-4-5", "max_tokens", 1024, "messages",
                          msgs, "stream", false, "tools", "name", "read",
                          "input_schema", "type", "object");
  char *body = json_dumps(req, JSON_COMPACT);
  json_decref(req);
  resp *r = call(P, "POST", "/v1/messages?beta=true", body, NULL);
  cr_expect_eq(r->status, 200, "%s", r->body);
  cr_expect_str_eq(r->stop, "identical_calls", "%s", r->body);
  cr_expect_eq(n_upstream(), 0, "stopped before going upstream");
  free(r);
  free(body);
}

/* A 400 the proxy answers itself leaves an event saying why. */
Test(proxy, bad_request_writes_an_event) {
  ag_proxy_stop(P);
  FILE *ev = tmpfile();
  cr_assert_not_null(ev);
  ag_proxy_opts o = test_opts();
  o.events = ev;
  P = start_with(&o);
  resp *r = call(P, "POST", "/v1/messages",
                 "{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":"
                 "\"robot\",\"content\":\"hi\"}]}",
                 NULL);
  cr_expect_eq(r->status, 400, "%s", r->body);
  free(r);
  ag_proxy_stop(P);
  P = NULL;
  rewind(ev);
  char line[2048] = "";
  cr_expect_not_null(fgets(line, sizeof line, ev));
  cr_expect(strstr(line, "\"decision\":\"bad_request\"") != NULL, "%s", line);
  cr_expect(strstr(line, "\"api\":\"anthropic\"") != NULL, "%s", line);
  cr_expect(strstr(line, "messages[0].role") != NULL, "%s", line);
  fclose(ev);
}

/* Attribution: each request answered writes one access-log line (JSON
 * here) naming its number, client, API, model, conversation, decision,
 * status, time and tokens, and the decision events carry the same ids.
 * A conversation keeps its id as it grows (the id is the hash of its
 * start); another conversation gets another; a client's
 * x-agentguard-session wins and is not forwarded; a query (it may hold a
 * key) is not logged. */
/* GET /metrics until its text holds `want` (2 s at most; the last answer
 * either way). A request is counted when its answer has gone
 * (libmicrohttpd's completion), which may come after the client has read
 * it, and /metrics may be answered by another loop first. */
static resp *metrics_with(const ag_proxy *p, const char *want) {
  for (int tries = 0;; tries++) {
    resp *r = call(p, "GET", "/metrics", NULL, NULL);
    if (tries == 200 || strstr(r->body, want) != NULL)
      return r;
    free(r);
    struct timespec ts = {0, 10 * 1000000};
    nanosleep(&ts, NULL);
  }
}

Test(proxy, every_request_is_logged_with_who_it_is_for) {
  ag_proxy_stop(P);
  FILE *ev = tmpfile(), *log = tmpfile();
  cr_assert(ev != NULL && log != NULL);
  ag_proxy_opts o = test_opts();
  o.events = ev;
  o.access_log = log;
  o.access_log_json = true;
  P = start_with(&o);
  canned_call("read", "{\"path\":\"b\"}");
  canned_call("read", "{\"path\":\"c\"}");
  char *one = conversation(0, "read", "{\"path\":\"a\"}", "text of a");
  char *two = conversation(1, "read", "{\"path\":\"a\"}", "text of a");
  char *stop = conversation(3, "read", "{\"path\":\"a\"}", "same");
  resp *r = call(P, "POST", "/v1/chat/completions", one, NULL);
  cr_expect_eq(r->status, 200);
  free(r);
  r = call(P, "POST", "/v1/chat/completions", two, NULL);
  cr_expect_eq(r->status, 200);
  free(r);
  r = call(P, "POST", "/v1/chat/completions", stop,
           "x-agentguard-session: team-a/run 7");
  cr_expect_str_eq(r->stop, "identical_calls");
  free(r);
  canned_add(200, "{\"object\":\"list\",\"data\":[]}");
  r = call(P, "GET", "/v1/models?key=sk-in-the-query", NULL,
           "x-agentguard-session: probe");
  free(r);
  /* a different first user message: another conversation */
  canned_call(NULL, "done");
  json_t *other = json_loads(one, 0, NULL);
  json_object_set_new(json_array_get(json_object_get(other, "messages"), 1),
                      "content", json_string("Read the other file."));
  char *three = json_dumps(other, JSON_COMPACT);
  json_decref(other);
  r = call(P, "POST", "/v1/chat/completions", three, NULL);
  free(r);
  /* the same in /metrics: the tokens read, the stop's estimated saving
   * (its body / 4), the upstream's time and the proxy's own, once the last
   * request is counted */
  r = metrics_with(P, "agentguard_proxy_added_latency_seconds_count 4\n");
  cr_expect(strstr(r->body, "agentguard_proxy_tokens_total{kind=\"input\"} "
                            "30\n") != NULL,
            "%s", r->body);
  cr_expect(strstr(r->body, "agentguard_proxy_tokens_total{kind=\"output\"} "
                            "15\n") != NULL,
            "%s", r->body);
  char want[96];
  snprintf(want, sizeof want,
           "agentguard_proxy_tokens_saved_estimate_total %zu\n",
           strlen(stop) / 4);
  cr_expect(strstr(r->body, want) != NULL, "%s\n%s", want, r->body);
  cr_expect(strstr(r->body, "agentguard_proxy_upstream_duration_seconds_count "
                            "4\n") != NULL,
            "%s", r->body);
  cr_expect(strstr(r->body, "agentguard_proxy_added_latency_seconds_count "
                            "4\n") != NULL,
            "%s", r->body);
  free(r);
  ag_proxy_stop(P);
  P = NULL;
  cr_expect_eq(n_upstream(), 4, "the stop went nowhere");
  pthread_mutex_lock(&U.mu);
  for (int i = 0; i < U.n_reqs; i++)
    cr_expect_null(U.reqs[i].sess, "x-agentguard-session went upstream");
  pthread_mutex_unlock(&U.mu);

  rewind(log);
  char line[4096];
  json_t *l[5] = {NULL};
  int n = 0;
  while (n < 5 && fgets(line, sizeof line, log) != NULL) {
    l[n] = json_loads(line, 0, NULL);
    cr_assert_not_null(l[n], "not JSON: %s", line);
    cr_expect(strstr(line, "sk-in-the-query") == NULL, "%s", line);
    n++;
  }
  cr_assert_eq(n, 5, "%d access-log lines", n);
  /* a line is written at the request's completion, on its connection's
   * loop: two loops may write theirs in either order - by request id */
  for (int i = 1; i < n; i++)
    for (int k = i;
         k > 0 && json_integer_value(json_object_get(l[k], "id")) <
                      json_integer_value(json_object_get(l[k - 1], "id"));
         k--) {
      json_t *t = l[k];
      l[k] = l[k - 1];
      l[k - 1] = t;
    }
#define F(i, k) json_object_get(l[i], k)
#define S(i, k) json_string_value(F(i, k))
  for (int i = 0; i < 5; i++) {
    cr_expect_eq(json_integer_value(F(i, "id")), i + 1);
    cr_expect_str_eq(S(i, "client"), "127.0.0.1");
    cr_expect_eq(json_integer_value(F(i, "status")), 200);
    cr_expect(json_integer_value(F(i, "ms")) >= 0);
    /* every request but the stop went upstream */
    cr_expect(i == 2 ? F(i, "upstream_ms") == NULL
                     : json_integer_value(F(i, "upstream_ms")) >= 0);
  }
  cr_expect_str_eq(S(0, "api"), "openai");
  cr_expect_str_eq(S(0, "model"), "m");
  cr_expect_str_eq(S(0, "decision"), "passed");
  cr_expect_eq(json_integer_value(F(0, "input_tokens")), 10);
  cr_expect_eq(json_integer_value(F(0, "output_tokens")), 5);
  cr_assert_not_null(S(0, "conversation"));
  cr_expect_eq(strlen(S(0, "conversation")), 16);
  cr_expect_str_eq(S(1, "conversation"), S(0, "conversation"),
                   "a conversation keeps its id as it grows");
  cr_expect_str_eq(S(2, "conversation"), "team-a/run_7");
  cr_expect_str_eq(S(2, "decision"), "stopped_before_request");
  cr_expect_str_eq(S(2, "reason"), "identical_calls");
  cr_expect_str_eq(S(3, "method"), "GET");
  cr_expect_str_eq(S(3, "path"), "/v1/models");
  cr_expect_str_eq(S(3, "decision"), "relayed");
  cr_expect_str_eq(S(3, "conversation"), "probe");
  cr_expect_null(F(3, "api"));
  cr_assert_not_null(S(4, "conversation"));
  cr_expect_str_neq(S(4, "conversation"), S(0, "conversation"),
                    "another conversation, another id");
#undef F
#undef S
  for (int i = 0; i < 5; i++)
    json_decref(l[i]);
  /* the stop's event names the same request */
  rewind(ev);
  cr_assert_not_null(fgets(line, sizeof line, ev));
  cr_expect(strstr(line, "\"request_id\":3") != NULL, "%s", line);
  cr_expect(strstr(line, "\"conversation\":\"team-a/run_7\"") != NULL, "%s",
            line);
  cr_expect(strstr(line, "\"model\":\"m\"") != NULL, "%s", line);
  cr_expect(strstr(line, "\"client\":\"127.0.0.1\"") != NULL, "%s", line);
  fclose(ev);
  fclose(log);
  free(one);
  free(two);
  free(three);
  free(stop);
}

/* The scratch a body is read with is kept for the next request and grows
 * for a larger one: small, large (120 KB: past what is kept), small again,
 * each decided and attributed as a request alone is, the large one's
 * tape read once for both. */
Test(proxy, kept_readers_read_bodies_of_any_size) {
  ag_proxy_stop(P);
  FILE *log = tmpfile();
  cr_assert_not_null(log);
  ag_proxy_opts o = test_opts();
  o.access_log = log;
  o.access_log_json = true;
  P = start_with(&o);
  char *big = malloc(40001);
  cr_assert_not_null(big);
  for (int i = 0; i < 40000; i++)
    big[i] = (char)('a' + i % 26);
  big[40000] = '\0';
  const char *want[] = {NULL, "identical_calls", NULL, "identical_calls"};
  for (int k = 0; k < 4; k++) {
    char *body = conversation(k % 2 ? 3 : 0, "read", "{\"path\":\"a\"}",
                              k == 1 ? big : "text of a");
    if (want[k] == NULL)
      canned_call(NULL, "done");
    resp *r = call(P, "POST", "/v1/chat/completions", body, NULL);
    cr_expect_eq(r->status, 200, "request %d: %s", k, r->body);
    if (want[k] != NULL)
      cr_expect_str_eq(r->stop, want[k], "request %d", k);
    else
      cr_expect_str_eq(r->stop, "", "request %d", k);
    free(r);
    free(body);
  }
  free(big);
  ag_proxy_stop(P);
  P = NULL;
  cr_expect_eq(n_upstream(), 2, "the stops went nowhere");
  rewind(log);
  char line[4096];
  int n = 0;
  while (fgets(line, sizeof line, log) != NULL) {
    json_t *l = json_loads(line, 0, NULL);
    cr_assert_not_null(l, "not JSON: %s", line);
    cr_expect_str_eq(json_string_value(json_object_get(l, "model")), "m", "%s",
                     line);
    cr_expect(json_is_string(json_object_get(l, "conversation")), "%s", line);
    json_decref(l);
    n++;
  }
  cr_expect_eq(n, 4, "%d access-log lines", n);
  fclose(log);
}

/* A stream's own decision reaches its access-log line (the stream is the
 * response's and may outlive the request, or the other way round). */
Test(proxy, a_streams_decision_is_in_its_log_line) {
  ag_proxy_stop(P);
  FILE *log = tmpfile();
  cr_assert_not_null(log);
  ag_proxy_opts o = test_opts();
  o.access_log = log;
  P = start_with(&o);
  canned_stream_call("{\"path\":\"a\"}");
  char *body =
      streaming(conversation(2, "read", "{\"path\":\"a\"}", "text of a"));
  resp *r = call(P, "POST", "/v1/chat/completions", body, NULL);
  cr_expect(strstr(r->body, "agentguard stopped this turn") != NULL, "%s",
            r->body);
  free(r);
  free(body);
  ag_proxy_stop(P);
  P = NULL;
  rewind(log);
  char line[2048] = "";
  cr_assert_not_null(fgets(line, sizeof line, log));
  cr_expect(strstr(line, " #1 127.0.0.1 POST /v1/chat/completions api=openai "
                         "model=m conv=") != NULL,
            "%s", line);
  cr_expect(strstr(line, " reply_replaced reason=identical_calls status=200 "
                         "ms=") != NULL,
            "%s", line);
  cr_expect(strstr(line, " upstream_ms=") != NULL &&
                strstr(line, " upstream_ms=-") == NULL,
            "%s", line);
  fclose(log);
}

/* The value of span attribute `key` (a string, or an int's decimal
 * text in buf), or NULL. */
static char span_int[32];
static const char *span_attr(const json_t *span, const char *key) {
  size_t i;
  json_t *a;
  json_array_foreach(json_object_get(span, "attributes"), i, a) {
    if (strcmp(json_string_value(json_object_get(a, "key")), key) != 0)
      continue;
    json_t *v = json_object_get(a, "value");
    json_t *s = json_object_get(v, "stringValue");
    if (s != NULL)
      return json_string_value(s);
    json_t *n = json_object_get(v, "intValue");
    if (!json_is_integer(n))
      return NULL;
    snprintf(span_int, sizeof span_int, "%lld",
             (long long)json_integer_value(n));
    return span_int;
  }
  return NULL;
}

static bool lower_hex(const char *s, size_t n) {
  if (s == NULL || strlen(s) != n)
    return false;
  for (size_t i = 0; i < n; i++)
    if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
      return false;
  return true;
}

/* OpenTelemetry: each guarded request is a span, posted as OTLP/HTTP JSON
 * with the headers given; a client's traceparent makes it a child in the
 * client's trace; the GenAI attributes and the decision are on it. The
 * spans queued when the proxy stops are sent then. */
Test(proxy, each_guarded_request_is_a_span_in_the_clients_trace) {
  ag_proxy_stop(P);
  char url[96];
  snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/traces", U.port);
  ag_proxy_opts o = test_opts();
  o.otlp_traces_url = url;
  o.otlp_headers = "x-team=blue, x-other = 2";
  o.otlp_service_name = "agents-gateway";
  P = start_with(&o);
  canned_call(NULL, "done");
  char *pass = conversation(0, "read", "{\"path\":\"a\"}", "x");
  char *stop = conversation(3, "read", "{\"path\":\"a\"}", "same");
  resp *r = call(P, "POST", "/v1/chat/completions", pass,
                 "traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-"
                 "00f067aa0ba902b7-01");
  cr_expect_eq(r->status, 200);
  free(r);
  r = call(P, "POST", "/v1/chat/completions", stop,
           "traceparent: 00-00000000000000000000000000000000-"
           "00f067aa0ba902b7-01"); /* invalid: a new trace */
  cr_expect_str_eq(r->stop, "identical_calls");
  free(r);
  canned_add(200, "{}"); /* the collector's answer */
  ag_proxy_stop(P);
  P = NULL;
  free(pass);
  free(stop);

  pthread_mutex_lock(&U.mu);
  int at = -1;
  for (int i = 0; i < U.n_reqs; i++)
    if (strcmp(U.reqs[i].url, "/v1/traces") == 0)
      at = i;
  cr_assert_geq(at, 0, "no export reached the collector");
  cr_expect_str_eq(U.reqs[at].team, "blue");
  char *up_tp = dupz(U.reqs[0].tp); /* the model request's traceparent */
  json_error_t je;
  json_t *req = json_loads(U.reqs[at].body, 0, &je);
  pthread_mutex_unlock(&U.mu);
  cr_assert_not_null(req, "the export is not JSON: %s", je.text);
  json_t *rs = json_array_get(json_object_get(req, "resourceSpans"), 0);
  json_t *res_attr = json_array_get(
      json_object_get(json_object_get(rs, "resource"), "attributes"), 0);
  cr_expect_str_eq(json_string_value(json_object_get(res_attr, "key")),
                   "service.name");
  cr_expect_str_eq(json_string_value(json_object_get(
                       json_object_get(res_attr, "value"), "stringValue")),
                   "agents-gateway");
  json_t *ss = json_array_get(json_object_get(rs, "scopeSpans"), 0);
  cr_expect_str_eq(
      json_string_value(json_object_get(json_object_get(ss, "scope"), "name")),
      "agentguard");
  json_t *spans = json_object_get(ss, "spans");
  cr_assert_eq(json_array_size(spans), 2, "%s", U.reqs[at].body);
  json_t *a = json_array_get(spans, 0), *b = json_array_get(spans, 1);
  /* A span is queued when its request completes (libmicrohttpd's callback,
   * after the answer is written), on the loop that served it: the second
   * request, on another loop, may be queued first. Spans are found by
   * their decision, not by their place in the batch. */
  if (span_attr(a, "agentguard.decision") != NULL &&
      strcmp(span_attr(a, "agentguard.decision"), "passed") != 0) {
    json_t *x = a;
    a = b;
    b = x;
  }
  /* the first joins the client's trace, under the client's span */
  cr_expect_str_eq(json_string_value(json_object_get(a, "traceId")),
                   "4bf92f3577b34da6a3ce929d0e0e4736");
  cr_expect_str_eq(json_string_value(json_object_get(a, "parentSpanId")),
                   "00f067aa0ba902b7");
  cr_expect(lower_hex(json_string_value(json_object_get(a, "spanId")), 16));
  cr_expect_str_eq(json_string_value(json_object_get(a, "name")), "chat m");
  /* and the upstream's request is the proxy span's child */
  char want_tp[80];
  snprintf(want_tp, sizeof want_tp, "00-4bf92f3577b34da6a3ce929d0e0e4736-%s-01",
           json_string_value(json_object_get(a, "spanId")));
  cr_expect_str_eq(up_tp, want_tp);
  free(up_tp);
  cr_expect_eq(json_integer_value(json_object_get(a, "kind")), 3);
  const char *t0 = json_string_value(json_object_get(a, "startTimeUnixNano"));
  const char *t1 = json_string_value(json_object_get(a, "endTimeUnixNano"));
  cr_assert(t0 != NULL && t1 != NULL && strlen(t0) == 19 && strlen(t1) == 19);
  cr_expect(strcmp(t0, t1) <= 0);
  cr_expect_str_eq(span_attr(a, "gen_ai.operation.name"), "chat");
  cr_expect_str_eq(span_attr(a, "gen_ai.provider.name"), "openai");
  cr_expect_str_eq(span_attr(a, "gen_ai.request.model"), "m");
  cr_expect_str_eq(span_attr(a, "gen_ai.usage.input_tokens"), "10");
  cr_expect_str_eq(span_attr(a, "gen_ai.usage.output_tokens"), "5");
  cr_expect_str_eq(span_attr(a, "http.response.status_code"), "200");
  cr_expect_str_eq(span_attr(a, "agentguard.decision"), "passed");
  cr_expect(lower_hex(span_attr(a, "gen_ai.conversation.id"), 16));
  /* the second: a new trace (the zero trace id is invalid), the stop */
  const char *tid = json_string_value(json_object_get(b, "traceId"));
  cr_expect(lower_hex(tid, 32) &&
                strcmp(tid, "4bf92f3577b34da6a3ce929d0e0e4736") != 0,
            "%s", tid);
  cr_expect_null(json_object_get(b, "parentSpanId"));
  cr_expect_str_eq(span_attr(b, "agentguard.decision"),
                   "stopped_before_request");
  cr_expect_str_eq(span_attr(b, "agentguard.reason"), "identical_calls");
  cr_expect_null(span_attr(b, "gen_ai.usage.input_tokens"));
  json_decref(req);
}

/* A collector that cannot be reached costs the requests nothing: they are
 * answered as before, and the lost spans are counted in /metrics. */
Test(proxy, an_unreachable_collector_drops_spans_and_counts_them) {
  ag_proxy_stop(P);
  int s = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET,
                           .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t sl = sizeof sa;
  cr_assert(bind(s, (struct sockaddr *)&sa, sizeof sa) == 0 &&
            getsockname(s, (struct sockaddr *)&sa, &sl) == 0);
  close(s); /* nothing listens there now: connections are refused */
  char url[96];
  snprintf(url, sizeof url, "http://127.0.0.1:%u/v1/traces",
           (unsigned)ntohs(sa.sin_port));
  ag_proxy_opts o = test_opts();
  o.otlp_traces_url = url;
  P = start_with(&o);
  canned_call(NULL, "done");
  char *pass = conversation(0, "read", "{\"path\":\"a\"}", "x");
  resp *r = call(P, "POST", "/v1/chat/completions", pass, NULL);
  cr_expect_eq(r->status, 200);
  free(r);
  free(pass);
  bool counted = false;
  for (int i = 0; i < 100 && !counted; i++) { /* the batch goes after 1 s */
    r = call(P, "GET", "/metrics", NULL, NULL);
    counted =
        strstr(r->body, "agentguard_proxy_spans_dropped_total 1\n") != NULL;
    if (!counted)
      nap_ms(50);
    else
      cr_expect(strstr(r->body, "agentguard_proxy_spans_exported_total 0\n") !=
                NULL);
    free(r);
  }
  cr_expect(counted, "the dropped span was not counted");
}

/* ------------------------------------------------------------------------ */
/* OpenAI Responses (/v1/responses)                                         */
/* ------------------------------------------------------------------------ */

/* A Responses request: a developer message, a user message, then `n` calls
 * shell(args) each answered by `output` (reasoning items between, as Codex
 * sends them). Caller frees. */
static char *responses_conv(int n, const char *output, bool stream,
                            const char *extra_key, const char *extra_value) {
  json_t *items = json_pack("[{s:s, s:s}, {s:s, s:s, s:[{s:s, s:s}]}]", "role",
                            "developer", "content", "You are a coding agent.",
                            "type", "message", "role", "user", "content",
                            "type", "input_text", "text", "Fix the test.");
  for (int i = 0; i < n; i++) {
    char id[32];
    snprintf(id, sizeof id, "call_%d", i);
    json_array_append_new(items, json_pack("{s:s, s:s, s:[], s:s}", "type",
                                           "reasoning", "id", "rs_1", "summary",
                                           "encrypted_content", "opaque"));
    json_array_append_new(
        items, json_pack("{s:s, s:s, s:s, s:s}", "type", "function_call",
                         "call_id", id, "name", "shell", "arguments",
                         "{\"command\":[\"bash\",\"-lc\",\"make test\"]}"));
    json_array_append_new(items, json_pack("{s:s, s:s, s:s}", "type",
                                           "function_call_output", "call_id",
                                           id, "output", output));
  }
  json_t *o = json_pack("{s:s, s:o, s:b, s:b, s:[{s:s, s:s}]}", "model", "m",
                        "input", items, "stream", stream, "store", false,
                        "tools", "type", "function", "name", "shell");
  if (extra_key != NULL)
    json_object_set_new(o, extra_key, json_string(extra_value));
  char *t = json_dumps(o, JSON_COMPACT);
  json_decref(o);
  return t;
}

/* a malfunction (docs/errors.md): the command does not exist */
static const char *const codex_failed =
    "Exit code: 127\nWall time: 0.0 seconds\nOutput:\nbash: line 1: pytets: "
    "command not found";

Test(proxy, responses_replayed_errors_stop_with_a_response) {
  ag_proxy_stop(P);
  ag_config c = test_cfg();
  c.loop.identical_call_limit = 0;
  c.loop.repeated_result_limit = 0;
  P = proxy_with(c, 0, NULL);
  char *body = responses_conv(3, codex_failed, false, NULL, NULL);
  resp *r = call(P, "POST", "/v1/responses", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect_eq(n_upstream(), 0, "nothing goes upstream");
  cr_expect_str_eq(r->stop, "consecutive_errors");
  json_t *j = json_loads(r->body, 0, NULL);
  cr_assert_not_null(j, "%s", r->body);
  cr_expect_str_eq(json_string_value(json_object_get(j, "object")), "response");
  cr_expect_str_eq(json_string_value(json_object_get(j, "status")),
                   "completed");
  json_t *out = json_object_get(j, "output");
  cr_assert_eq(json_array_size(out), 1, "%s", r->body);
  json_t *part =
      json_array_get(json_object_get(json_array_get(out, 0), "content"), 0);
  cr_expect_str_eq(json_string_value(json_object_get(part, "type")),
                   "output_text");
  cr_expect(strstr(json_string_value(json_object_get(part, "text")),
                   "agentguard stopped this turn (consecutive_errors)") !=
            NULL);
  json_decref(j);
  free(body);
  free(r);
}

Test(proxy, responses_exit_code_zero_is_a_success) {
  /* the same three calls, each passing: no error counted */
  ag_proxy_stop(P);
  ag_config c = test_cfg();
  c.loop.identical_call_limit = 0;
  c.loop.repeated_result_limit = 0;
  c.loop.cycle_limit = 0;
  P = proxy_with(c, 0, NULL);
  canned_add(200, "{\"id\":\"resp_up\",\"object\":\"response\",\"output\":[]}");
  char *body =
      responses_conv(3, "Exit code: 0\nWall time: 0.1 seconds\nOutput:\nok",
                     false, NULL, NULL);
  resp *r = call(P, "POST", "/v1/responses", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect_eq(n_upstream(), 1);
  cr_expect_str_eq(r->body,
                   "{\"id\":\"resp_up\",\"object\":\"response\",\"output\":[]}",
                   "the upstream's reply as it came");
  cr_expect_str_eq(r->stop, "");
  free(body);
  free(r);
}

Test(proxy, responses_stream_stop_is_the_events_in_order) {
  ag_proxy_stop(P);
  ag_config c = test_cfg();
  c.loop.identical_call_limit = 0;
  c.loop.repeated_result_limit = 0;
  P = proxy_with(c, 0, NULL);
  char *body = responses_conv(3, "Process exited with code 2\nno rule", true,
                              NULL, NULL);
  resp *r = call(P, "POST", "/v1/responses", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect_eq(n_upstream(), 0);
  cr_expect_str_eq(r->stop, "consecutive_errors");
  const char *order[] = {
      "event: response.created",           "event: response.output_item.added",
      "event: response.output_text.delta", "agentguard stopped this turn",
      "event: response.output_item.done",  "event: response.completed"};
  expect_in_order(r, order, sizeof order / sizeof order[0]);
  /* every event's data names its own type and numbers in order from 0 */
  int seq = 0;
  for (const char *d = strstr(r->body, "data: "); d != NULL;
       d = strstr(d + 1, "data: ")) {
    const char *end = strchr(d, '\n');
    cr_assert_not_null(end);
    json_t *ev = json_loadb(d + 6, (size_t)(end - d - 6), 0, NULL);
    cr_assert_not_null(ev, "%.*s", (int)(end - d), d);
    cr_expect_eq(json_integer_value(json_object_get(ev, "sequence_number")),
                 seq);
    char name[96];
    snprintf(name, sizeof name, "event: %s\ndata: ",
             json_string_value(json_object_get(ev, "type")));
    cr_expect(d - r->body >= (long)strlen(name) - 6 &&
                  strncmp(d - strlen(name) + 6, name, strlen(name)) == 0,
              "event %d's name is not its type", seq);
    json_decref(ev);
    seq++;
  }
  cr_expect_eq(seq, 9);
  free(body);
  free(r);
}

Test(proxy, responses_allowed_goes_up_with_the_error_context) {
  ag_proxy_stop(P);
  ag_config c = test_cfg();
  c.loop.identical_call_limit = 0;
  P = proxy_with(c, 0, NULL);
  const char *up = "event: response.completed\ndata: {\"type\":\"response."
                   "completed\",\"sequence_number\":0,\"response\":{}}\n\n";
  canned_add(200, up);
  char *body = responses_conv(1, codex_failed, true, NULL, NULL);
  resp *r = call(P, "POST", "/v1/responses", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect_str_eq(r->body, up, "the stream relayed as it came");
  cr_assert_eq(n_upstream(), 1);
  json_t *sent = json_loads(U.reqs[0].body, 0, NULL);
  cr_assert_not_null(sent);
  json_t *in = json_object_get(sent, "input");
  json_t *last = json_array_get(in, json_array_size(in) - 1);
  cr_expect_str_eq(json_string_value(json_object_get(last, "role")), "user");
  cr_expect(strstr(json_string_value(json_object_get(last, "content")),
                   "pytets: command not found") != NULL,
            "the error context names the failure: %s", U.reqs[0].body);
  cr_expect_eq(json_array_size(in), 6, "the client's 5 items and one more");
  json_decref(sent);
  free(body);
  free(r);
}

Test(proxy, responses_kept_upstream_is_relayed_unguarded) {
  ag_proxy_stop(P);
  ag_config c = test_cfg();
  c.loop.identical_call_limit = 0;
  P = proxy_with(c, 0, NULL);
  canned_add(200, "{\"id\":\"resp_up\",\"object\":\"response\",\"output\":[]}");
  char *body =
      responses_conv(3, codex_failed, false, "previous_response_id", "resp_9");
  resp *r = call(P, "POST", "/v1/responses", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect_eq(n_upstream(), 1, "a turn held upstream cannot be replayed");
  cr_expect_str_eq(r->stop, "");
  free(body);
  free(r);
}

Test(proxy, responses_bad_items_are_400_naming_the_item) {
  char code[64];
  resp *r = call(P, "POST", "/v1/responses",
                 "{\"model\":\"m\",\"tools\":[{\"type\":\"function\","
                 "\"name\":\"x\"}],\"input\":[{\"role\":\"user\",\"content\":"
                 "\"hi\"},{\"type\":\"function_call\",\"name\":\"x\"}]}",
                 NULL);
  cr_expect_eq(r->status, 400);
  cr_expect_str_eq(err_code(r, code, sizeof code), "invalid_request");
  cr_expect(strstr(r->body, "input[1]") != NULL, "%s", r->body);
  free(r);
  r = call(P, "POST", "/v1/responses",
           "{\"model\":\"m\",\"tools\":[{}],\"input\":7}", NULL);
  cr_expect_eq(r->status, 400);
  cr_expect(strstr(r->body, "input: expected a string or an array") != NULL,
            "%s", r->body);
  free(r);
  cr_expect_eq(n_upstream(), 0);
  /* a request without tools cannot make a call: relayed untouched */
  canned_add(200, "{\"object\":\"response\",\"output\":[]}");
  r = call(P, "POST", "/v1/responses",
           "{\"model\":\"m\",\"input\":[{\"type\":\"function_call\"}]}", NULL);
  cr_expect_eq(r->status, 200, "%s", r->body);
  cr_expect_eq(n_upstream(), 1);
  free(r);
}

/* The proxy's decision on random Responses conversations equals the
 * audit's reading of the same request body (one turn: the audit stops at
 * the first turn that trips, the proxy sees the last). */
Test(proxy, responses_decisions_equal_the_audits) {
  static const char *const names[] = {"shell", "apply_patch", "read"};
  static const char *const args[] = {"{\"p\":1}", "{\"p\":2}", "{\"q\":[1]}"};
  static const char *const outs[] = {"ok", "Exit code: 1\nOutput:\nboom",
                                     "Process exited with code 0\nfine",
                                     "Error: no such file"};
  ag_proxy_stop(P);
  ag_config cfg = test_cfg();
  cfg.loop.max_iterations = 0; /* the coming request never trips */
  cfg.loop.max_tokens_per_turn = 0;
  P = proxy_with(cfg, 0, NULL);
  ag_auditor *a = NULL;
  cr_assert_eq(ag_auditor_new(&a, &cfg, NULL, NULL), AG_OK);
  int stops = 0;
  for (int i = 0; i < 150; i++) {
    json_t *items = json_pack("[{s:s, s:s}]", "role", "user", "content", "go");
    int id = 0, rounds = 1 + (int)rnd(8);
    for (int r = 0; r < rounds; r++) {
      if (rnd(3) == 0)
        json_array_append_new(
            items, json_pack("{s:s, s:s, s:[{s:s, s:s}]}", "type", "message",
                             "role", "assistant", "content", "type",
                             "output_text", "text", "working"));
      unsigned nc = 1 + rnd(2);
      for (unsigned k = 0; k < nc; k++) {
        char cid[16];
        snprintf(cid, sizeof cid, "c%d", id + (int)k);
        json_array_append_new(items, json_pack("{s:s, s:s, s:s, s:s}", "type",
                                               "function_call", "call_id", cid,
                                               "name", names[rnd(3)],
                                               "arguments", args[rnd(3)]));
      }
      for (unsigned k = 0; k < nc; k++) {
        char cid[16];
        snprintf(cid, sizeof cid, "c%d", id + (int)k);
        json_array_append_new(
            items, json_pack("{s:s, s:s, s:s}", "type", "function_call_output",
                             "call_id", cid, "output", outs[rnd(4)]));
      }
      id += (int)nc;
    }
    json_t *req =
        json_pack("{s:s, s:o, s:[{s:s, s:s}]}", "model", "m", "input", items,
                  "tools", "type", "function", "name", "shell");
    char *body = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    ag_trajectory *t = NULL;
    ag_error_t err;
    cr_assert_eq(ag_trajectory_parse(&t, body, strlen(body), NULL, &err), AG_OK,
                 "%s", err.msg);
    ag_audit_finding f;
    cr_assert_eq(ag_auditor_run(a, t, &f, &err), AG_OK);
    ag_trajectory_free(t);
    canned_reset();
    if (!f.stop.stopped)
      canned_add(200, "{\"object\":\"response\",\"output\":[]}");
    resp *r = call(P, "POST", "/v1/responses", body, NULL);
    cr_expect_str_eq(r->stop,
                     f.stop.stopped ? ag_reason_name(f.stop.reason) : "",
                     "run %d: %s", i, body);
    stops += f.stop.stopped;
    free(r);
    free(body);
  }
  ag_auditor_free(a);
  cr_expect_gt(stops, 10, "the random turns exercise stops (%d)", stops);
}

/* ------------------------------------------------------------------------ */
/* Gemini (/v1beta/models/{model}:generateContent)                          */
/* ------------------------------------------------------------------------ */

#define GEMINI_PATH "/v1beta/models/gemini-2.5-pro:generateContent"
#define GEMINI_SSE "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse"

/* A Gemini request as Gemini CLI sends it: a user content, then `n` rounds
 * of a model content calling run_shell_command (with an id when `ids`,
 * a thought part and a thoughtSignature beside it) answered by a user
 * content with its functionResponse `response` (JSON); tools offered when
 * `tools`. Caller frees. */
static char *gemini_conv(int n, const char *response, bool ids, bool tools) {
  json_t *contents = json_pack("[{s:s, s:[{s:s}]}]", "role", "user", "parts",
                               "text", "Fix the failing test.");
  for (int i = 0; i < n; i++) {
    json_t *fc = json_pack("{s:s, s:{s:s}}", "name", "run_shell_command",
                           "args", "command", "make test");
    json_t *fr = json_pack("{s:s, s:o}", "name", "run_shell_command",
                           "response", json_loads(response, 0, NULL));
    if (ids) {
      char id[32];
      snprintf(id, sizeof id, "run_shell_command-%d", i);
      json_object_set_new(fc, "id", json_string(id));
      json_object_set_new(fr, "id", json_string(id));
    }
    json_array_append_new(
        contents,
        json_pack("{s:s, s:[{s:s, s:b}, {s:o, s:s}]}", "role", "model", "parts",
                  "text", "Let me run the tests.", "thought", 1, "functionCall",
                  fc, "thoughtSignature", "c2lnbmF0dXJl"));
    json_array_append_new(contents,
                          json_pack("{s:s, s:[{s:o}]}", "role", "user", "parts",
                                    "functionResponse", fr));
  }
  json_t *o =
      json_pack("{s:o, s:{s:[{s:s}]}}", "contents", contents,
                "systemInstruction", "parts", "text", "You are Gemini CLI.");
  if (tools)
    json_object_set_new(o, "tools",
                        json_pack("[{s:[{s:s, s:{s:s}}]}]",
                                  "functionDeclarations", "name",
                                  "run_shell_command", "parametersJsonSchema",
                                  "type", "object"));
  char *t = json_dumps(o, JSON_COMPACT);
  json_decref(o);
  return t;
}

static const char *const gemini_failed =
    "{\"error\":\"Command failed: make test\\nExit Code: 2\"}";

/* The text of a GenerateContentResponse's first candidate's first part. */
static const char *gemini_text(json_t *j) {
  json_t *cand = json_array_get(json_object_get(j, "candidates"), 0);
  cr_expect_str_eq(json_string_value(json_object_get(cand, "finishReason")),
                   "STOP");
  json_t *content = json_object_get(cand, "content");
  cr_expect_str_eq(json_string_value(json_object_get(content, "role")),
                   "model");
  return json_string_value(json_object_get(
      json_array_get(json_object_get(content, "parts"), 0), "text"));
}

Test(proxy, gemini_errors_stop_with_a_generate_content_response) {
  ag_proxy_stop(P);
  ag_config c = test_cfg();
  c.loop.identical_call_limit = 0;
  c.loop.repeated_result_limit = 0;
  P = proxy_with(c, 0, NULL);
  char *body = gemini_conv(3, gemini_failed, true, true);
  resp *r = call(P, "POST", GEMINI_PATH, body, NULL);
  cr_expect_eq(r->status, 200, "%s", r->body);
  cr_expect_eq(n_upstream(), 0, "nothing goes upstream");
  cr_expect_str_eq(r->stop, "consecutive_errors");
  json_t *j = json_loads(r->body, 0, NULL);
  cr_assert_not_null(j, "%s", r->body);
  const char *t = gemini_text(j);
  cr_expect(t != NULL &&
                strstr(t, "agentguard stopped this turn (consecutive_errors)"),
            "%s", r->body);
  cr_expect_str_eq(json_string_value(json_object_get(j, "modelVersion")),
                   "gemini-2.5-pro", "the model named in the path");
  json_decref(j);
  free(body);
  free(r);
}

Test(proxy, gemini_identical_calls_without_ids_stop_a_stream) {
  /* Gemini CLI's loop: one harmless call, the same answer, again and
   * again; the calls carry no id, their responses are matched by name */
  char *body = gemini_conv(3, "{\"output\":\"On branch main\"}", false, true);
  resp *r = call(P, "POST", GEMINI_SSE, body, NULL);
  cr_expect_eq(r->status, 200, "%s", r->body);
  cr_expect_eq(n_upstream(), 0);
  cr_expect_str_eq(r->stop, "identical_calls");
  cr_assert(strncmp(r->body, "data: {", 7) == 0, "one SSE event: %s", r->body);
  cr_expect(strstr(r->body, "\r\n\r\n") == r->body + r->len - 4,
            "the event ends the body: %s", r->body);
  json_t *j = json_loadb(r->body + 6, r->len - 10, 0, NULL);
  cr_assert_not_null(j, "%s", r->body);
  const char *t = gemini_text(j);
  cr_expect(t != NULL && strstr(t, "identical_calls"), "%s", r->body);
  json_decref(j);
  free(body);
  free(r);
}

Test(proxy, gemini_stream_without_alt_sse_is_a_json_array) {
  char *body = gemini_conv(3, "{\"output\":\"On branch main\"}", true, true);
  resp *r =
      call(P, "POST", "/v1beta/models/gemini-2.5-pro:streamGenerateContent",
           body, NULL);
  cr_expect_eq(r->status, 200);
  json_t *j = json_loads(r->body, 0, NULL);
  cr_assert(json_is_array(j) && json_array_size(j) == 1, "%s", r->body);
  cr_expect(strstr(gemini_text(json_array_get(j, 0)), "identical_calls"));
  json_decref(j);
  free(body);
  free(r);
}

Test(proxy, gemini_without_tools_is_relayed_untouched) {
  /* Gemini CLI's routing call: the history, no tools, JSON asked back */
  char *body = gemini_conv(3, "{\"output\":\"On branch main\"}", true, false);
  const char *up = "{\"candidates\":[{\"content\":{\"role\":\"model\","
                   "\"parts\":[{\"text\":\"{\\\"model_choice\\\":\\\"flash\\\""
                   "}\"}]},\"finishReason\":\"STOP\"}]}";
  canned_add(200, up);
  resp *r = call(P, "POST", GEMINI_PATH, body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect_str_eq(r->body, up);
  cr_assert_eq(n_upstream(), 1);
  cr_expect_str_eq(U.reqs[0].body, body, "the body unchanged");
  free(body);
  free(r);
}

Test(proxy, gemini_allowed_goes_up_with_the_error_context) {
  ag_proxy_stop(P);
  ag_config c = test_cfg();
  c.loop.identical_call_limit = 0;
  P = proxy_with(c, 0, NULL);
  const char *up = "data: {\"candidates\":[{\"content\":{\"role\":\"model\","
                   "\"parts\":[{\"text\":\"ok\"}]},\"finishReason\":\"STOP\"}"
                   "]}\r\n\r\n";
  canned_add(200, up);
  char *body = gemini_conv(1, gemini_failed, true, true);
  resp *r = call(P, "POST", GEMINI_SSE, body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect_str_eq(r->body, up, "the stream relayed as it came");
  cr_assert_eq(n_upstream(), 1);
  cr_expect_str_eq(U.reqs[0].url,
                   "/v1/v1beta/models/gemini-2.5-pro:streamGenerateContent",
                   "the upstream's path (/v1 here), then the client's");
  cr_expect_str_eq(U.reqs[0].alt, "sse", "the query kept");
  json_t *sent = json_loads(U.reqs[0].body, 0, NULL);
  cr_assert_not_null(sent);
  json_t *contents = json_object_get(sent, "contents");
  cr_expect_eq(json_array_size(contents), 3, "no content added");
  json_t *parts = json_object_get(json_array_get(contents, 2), "parts");
  cr_assert_eq(json_array_size(parts), 2,
               "a text part beside the functionResponse: %s", U.reqs[0].body);
  cr_expect(strstr(json_string_value(
                       json_object_get(json_array_get(parts, 1), "text")),
                   "Exit Code: 2") != NULL,
            "the error context names the failure: %s", U.reqs[0].body);
  json_decref(sent);
  free(body);
  free(r);
}

Test(proxy, gemini_bad_contents_are_400_in_googles_shape) {
  resp *r = call(P, "POST", GEMINI_PATH,
                 "{\"tools\":[{\"functionDeclarations\":[{\"name\":\"x\"}]}],"
                 "\"contents\":[{\"role\":\"user\",\"parts\":[{\"text\":\"hi\""
                 "}]},{\"role\":\"model\",\"parts\":[{\"functionCall\":{"
                 "\"args\":{}}}]}]}",
                 NULL);
  cr_expect_eq(r->status, 400);
  json_t *j = json_loads(r->body, 0, NULL);
  json_t *e = json_object_get(j, "error");
  cr_expect_eq(json_integer_value(json_object_get(e, "code")), 400, "%s",
               r->body);
  cr_expect_str_eq(json_string_value(json_object_get(e, "status")),
                   "INVALID_ARGUMENT");
  cr_expect(strstr(json_string_value(json_object_get(e, "message")),
                   "contents[1].parts[0].functionCall") != NULL,
            "%s", r->body);
  json_decref(j);
  free(r);
  cr_expect_eq(n_upstream(), 0);
  /* another method of the models path (countTokens) is not guarded */
  canned_add(200, "{\"totalTokens\":3}");
  r = call(P, "POST", "/v1beta/models/gemini-2.5-pro:countTokens", "{}", NULL);
  cr_expect_eq(r->status, 200);
  cr_expect_eq(n_upstream(), 1);
  free(r);
}

/* The proxy's decision on random Gemini conversations (ids or none,
 * parallel calls answered in any order) equals the audit's reading of the
 * same request body. */
Test(proxy, gemini_decisions_equal_the_audits) {
  static const char *const names[] = {"run_shell_command", "read_file",
                                      "replace"};
  static const char *const args[] = {"{\"p\":1}", "{\"p\":2}", "{\"q\":[1]}"};
  static const char *const outs[] = {
      "{\"output\":\"ok\"}", "{\"error\":\"Exit Code: 1\"}",
      "{\"output\":\"fine\",\"llmContent\":[1]}", "{\"error\":{\"code\":7}}"};
  ag_proxy_stop(P);
  ag_config cfg = test_cfg();
  cfg.loop.max_iterations = 0;
  cfg.loop.max_tokens_per_turn = 0;
  P = proxy_with(cfg, 0, NULL);
  ag_auditor *a = NULL;
  cr_assert_eq(ag_auditor_new(&a, &cfg, NULL, NULL), AG_OK);
  int stops = 0;
  for (int i = 0; i < 150; i++) {
    json_t *contents =
        json_pack("[{s:s, s:[{s:s}]}]", "role", "user", "parts", "text", "go");
    int rounds = 1 + (int)rnd(8);
    bool ids = rnd(2) == 0;
    for (int r = 0; r < rounds; r++) {
      json_t *calls = json_array(), *resps = json_array();
      if (rnd(3) == 0)
        json_array_append_new(calls, json_pack("{s:s}", "text", "working"));
      unsigned nc = 1 + rnd(2);
      for (unsigned k = 0; k < nc; k++) {
        const char *name = names[rnd(3)];
        json_t *fc = json_pack("{s:s, s:o}", "name", name, "args",
                               json_loads(args[rnd(3)], 0, NULL));
        json_t *fr = json_pack("{s:s, s:o}", "name", name, "response",
                               json_loads(outs[rnd(4)], 0, NULL));
        if (ids) {
          char cid[32];
          snprintf(cid, sizeof cid, "c%d_%u", r, k);
          json_object_set_new(fc, "id", json_string(cid));
          json_object_set_new(fr, "id", json_string(cid));
        }
        json_array_append_new(calls, json_pack("{s:o}", "functionCall", fc));
        json_array_append_new(resps,
                              json_pack("{s:o}", "functionResponse", fr));
      }
      json_array_append_new(
          contents, json_pack("{s:s, s:o}", "role", "model", "parts", calls));
      json_array_append_new(
          contents, json_pack("{s:s, s:o}", "role", "user", "parts", resps));
    }
    json_t *req =
        json_pack("{s:o, s:[{s:[{s:s}]}]}", "contents", contents, "tools",
                  "functionDeclarations", "name", "run_shell_command");
    char *body = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    ag_trajectory *t = NULL;
    ag_error_t err;
    cr_assert_eq(ag_trajectory_parse(&t, body, strlen(body), NULL, &err), AG_OK,
                 "%s", err.msg);
    ag_audit_finding f;
    cr_assert_eq(ag_auditor_run(a, t, &f, &err), AG_OK);
    ag_trajectory_free(t);
    canned_reset();
    if (!f.stop.stopped)
      canned_add(200, "{\"candidates\":[]}");
    resp *r = call(P, "POST", GEMINI_PATH, body, NULL);
    cr_expect_str_eq(r->stop,
                     f.stop.stopped ? ag_reason_name(f.stop.reason) : "",
                     "run %d: %s", i, body);
    stops += f.stop.stopped;
    free(r);
    free(body);
  }
  ag_auditor_free(a);
  cr_expect_gt(stops, 10, "the random turns exercise stops (%d)", stops);
}

/* The reply is held and checked: the call that makes the limit (3 here)
 * never reaches the client; the stop comes in the client's form. */
Test(proxy, gemini_reply_with_the_limits_call_is_replaced) {
  char *body = gemini_conv(2, "{\"output\":\"On branch main\"}", true, true);
  canned_add(200,
             "data: {\"candidates\":[{\"content\":{\"role\":\"model\","
             "\"parts\":[{\"text\":\"Again.\"}]}}]}\r\n\r\n"
             "data: {\"candidates\":[{\"content\":{\"role\":\"model\","
             "\"parts\":[{\"functionCall\":{\"name\":\"run_shell_command\","
             "\"args\":{\"command\":\"make test\"}}}]},"
             "\"finishReason\":\"STOP\"}]}\r\n\r\n");
  resp *r = call(P, "POST", GEMINI_SSE, body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect_eq(n_upstream(), 1, "asked once");
  cr_expect_str_eq(r->stop, "identical_calls");
  cr_expect(strstr(r->body, "functionCall") == NULL, "%s", r->body);
  cr_expect(strncmp(r->body, "data: {", 7) == 0 &&
                strstr(r->body, "agentguard stopped this turn") != NULL,
            "%s", r->body);
  free(r);
  /* a different call in the reply passes as it came */
  canned_reset();
  const char *other = "[{\"candidates\":[{\"content\":{\"role\":\"model\","
                      "\"parts\":[{\"functionCall\":{\"name\":\"read_file\","
                      "\"args\":{\"path\":\"a\"}}}]},\"finishReason\":"
                      "\"STOP\"}]}]";
  canned_add(200, other);
  r = call(P, "POST", "/v1beta/models/gemini-2.5-pro:streamGenerateContent",
           body, NULL);
  cr_expect_str_eq(r->body, other);
  cr_expect_str_eq(r->stop, "");
  free(r);
  /* a reply that is not the API's: a 502 in Google's shape */
  canned_reset();
  canned_add(200, "{\"choices\":7}");
  r = call(P, "POST", GEMINI_PATH, body, NULL);
  cr_expect_eq(r->status, 200, "no candidates: nothing to check (%s)", r->body);
  free(r);
  canned_reset();
  canned_add(200, "[1,2");
  r = call(P, "POST", GEMINI_PATH, body, NULL);
  cr_expect_eq(r->status, 502, "%s", r->body);
  cr_expect(strstr(r->body, "not a Gemini response") != NULL, "%s", r->body);
  cr_expect(strstr(r->body, "\"status\":\"INTERNAL\"") != NULL, "%s", r->body);
  free(r);
  free(body);
}

Test(proxy, responses_reply_with_the_limits_call_is_replaced) {
  ag_proxy_stop(P);
  ag_config c = test_cfg();
  c.errors.max_consecutive_errors = 0;
  P = proxy_with(c, 0, NULL);
  char *body = responses_conv(2, "ok", false, NULL, NULL);
  canned_add(200,
             "{\"object\":\"response\",\"status\":\"completed\",\"output\":"
             "[{\"type\":\"function_call\",\"call_id\":\"c9\",\"name\":"
             "\"shell\",\"arguments\":\"{\\\"command\\\":[\\\"bash\\\","
             "\\\"-lc\\\",\\\"make test\\\"]}\"}]}");
  resp *r = call(P, "POST", "/v1/responses", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect_eq(n_upstream(), 1);
  cr_expect_str_eq(r->stop, "identical_calls");
  cr_expect(strstr(r->body, "function_call") == NULL, "%s", r->body);
  cr_expect(strstr(r->body, "\"object\":\"response\"") != NULL, "%s", r->body);
  free(r);
  free(body);
}

/* ------------------------------------------------------------------------ */
/* Operating it: /healthz, /readyz, /metrics                                */
/* ------------------------------------------------------------------------ */

Test(proxy, health_and_metrics_are_the_proxys_own_without_a_key) {
  ag_proxy_stop(P);
  P = proxy_with(test_cfg(), 0, "k3y");
  resp *r = call(P, "GET", "/healthz", NULL, NULL);
  cr_expect_eq(r->status, 200, "no client key needed: %s", r->body);
  cr_expect_str_eq(r->body, "ok\n");
  free(r);
  r = call(P, "GET", "/readyz", NULL, NULL);
  cr_expect_eq(r->status, 200);
  free(r);
  r = call(P, "GET", "/metrics", NULL, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect(strstr(r->body, "# TYPE agentguard_proxy_requests_total counter") !=
                NULL,
            "%s", r->body);
  free(r);
  cr_expect_eq(n_upstream(), 0, "never forwarded");
  /* another path still needs the key; a POST to /metrics is no metrics */
  r = call(P, "GET", "/healthz/x", NULL, NULL);
  cr_expect_eq(r->status, 401);
  free(r);
  r = call(P, "POST", "/metrics", "{}", NULL);
  cr_expect_eq(r->status, 401);
  free(r);
}

Test(proxy, readyz_says_when_the_upstream_was_not_reached) {
  ag_proxy_stop(P);
  ag_proxy_opts o = test_opts();
  o.upstream = "http://127.0.0.1:9"; /* nothing listens on port 9 */
  P = start_with(&o);
  char *body = conversation(1, "read_file", "{\"path\":\"a\"}", "x");
  resp *r = call(P, "POST", "/v1/chat/completions", body, NULL);
  cr_expect_eq(r->status, 502);
  free(r);
  r = call(P, "GET", "/readyz", NULL, NULL);
  cr_expect_eq(r->status, 503, "%s", r->body);
  free(r);
  r = metrics_with(P, "agentguard_proxy_responses_total{code=\"5xx\"} 1\n");
  cr_expect(strstr(r->body, "agentguard_proxy_upstream_failures_total 1\n") !=
                NULL,
            "%s", r->body);
  cr_expect(
      strstr(r->body, "agentguard_proxy_responses_total{code=\"5xx\"} 1\n") !=
          NULL,
      "%s", r->body);
  free(r);
  free(body);
}

/* With no transfer in the last 30 s to go by, /readyz probes the
 * upstream itself: one connection (no request), its result kept for 10 s;
 * an upstream nobody listens at is named in the 503. */
Test(proxy, readyz_probes_the_upstream_when_no_transfer_says) {
  for (int i = 0; i < 3; i++) {
    resp *r = call(P, "GET", "/readyz", NULL, NULL);
    cr_expect_eq(r->status, 200, "%s", r->body);
    cr_expect_str_eq(r->body, "ok\n");
    free(r);
  }
  /* the probe connects and closes: the upstream's server may count the
   * connection after /readyz has answered - wait for it (then a little
   * more, for any second one) */
  int conns = 0, reqs = 0;
  for (int waited = 0; waited <= 2000; waited += 20) {
    pthread_mutex_lock(&U.mu);
    conns = U.n_conns;
    pthread_mutex_unlock(&U.mu);
    if (conns >= 1)
      break;
    nap_ms(20);
  }
  nap_ms(100);
  pthread_mutex_lock(&U.mu);
  conns = U.n_conns;
  reqs = U.n_reqs;
  pthread_mutex_unlock(&U.mu);
  cr_expect_eq(conns, 1, "%d probe connections for 3 /readyz", conns);
  cr_expect_eq(reqs, 0, "the probe sends no request");
  ag_proxy_stop(P);
  ag_proxy_opts o = test_opts();
  o.upstream = "http://127.0.0.1:9"; /* nothing listens on port 9 */
  P = start_with(&o);
  resp *r = call(P, "GET", "/readyz", NULL, NULL);
  cr_expect_eq(r->status, 503, "%s", r->body);
  cr_expect(strstr(r->body, "the upstream http://127.0.0.1:9 was not "
                            "reached: ") != NULL,
            "%s", r->body);
  free(r);
}

/* --listen takes a host name and an IPv6 address (skipped where the
 * machine has no IPv6 loopback). */
Test(proxy, listens_on_a_host_name_and_on_ipv6) {
  ag_proxy_stop(P);
  ag_proxy_opts o = test_opts();
  o.listen_host = "localhost";
  P = start_with(&o);
  resp *r = call(P, "GET", "/healthz", NULL, NULL);
  cr_expect_eq(r->status, 200, "localhost is 127.0.0.1: %s", r->body);
  free(r);
  ag_proxy_stop(P);
  P = NULL;
  o.listen_host = "::1";
  ag_error_t err;
  if (ag_proxy_start(&P, &o, &err) != AG_OK) {
    cr_expect(strstr(err.msg, "cannot listen") != NULL, "%s", err.msg);
    P = proxy_with(test_cfg(), 0, NULL);
    cr_skip_test("no IPv6 loopback here: %s", err.msg);
  }
  CURL *h = curl_easy_init();
  char url[64];
  snprintf(url, sizeof url, "http://[::1]:%u/healthz",
           (unsigned)ag_proxy_port(P));
  resp *got = calloc(1, sizeof *got);
  curl_easy_setopt(h, CURLOPT_URL, url);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, rbody);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, got);
  cr_expect_eq(curl_easy_perform(h), CURLE_OK);
  cr_expect_str_eq(got->body, "ok\n");
  free(got);
  long code = 0;
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
  cr_expect_eq(code, 200);
  curl_easy_cleanup(h);
  /* a name that resolves to nothing is refused with a clear error */
  ag_proxy *bad = NULL;
  o.listen_host = "nosuchhost.invalid";
  cr_expect_eq(ag_proxy_start(&bad, &o, &err), AG_EINVAL);
  cr_expect(strstr(err.msg, "nosuchhost.invalid") != NULL, "%s", err.msg);
}

/* ---- drain --------------------------------------------------------------- */

typedef struct drain_client {
  char url[128];
  char *body;
  timed_body *t;
  CURLcode cc;
  long status;
} drain_client;

static void *drain_client_main(void *arg) {
  drain_client *dc = arg;
  CURL *h = curl_easy_init();
  curl_easy_setopt(h, CURLOPT_URL, dc->url);
  curl_easy_setopt(h, CURLOPT_POSTFIELDS, dc->body);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, timed_write);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, dc->t);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 20000L);
  dc->cc = curl_easy_perform(h);
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &dc->status);
  curl_easy_cleanup(h);
  return NULL;
}

/* A drain lets a stream under way finish whole, while a new request and
 * the health checks get a 503. */
Test(proxy, drain_finishes_the_streams_under_way) {
  memset(&SLOW, 0, sizeof SLOW);
  struct MHD_Daemon *d = MHD_start_daemon(
      MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION, 0, NULL,
      NULL, slow_handler, NULL, MHD_OPTION_EXTERNAL_LOGGER, quiet, NULL,
      MHD_OPTION_END);
  cr_assert_not_null(d);
  ag_proxy_stop(P);
  snprintf(upstream_url, sizeof upstream_url, "http://127.0.0.1:%u",
           (unsigned)MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT)->port);
  P = proxy_with(test_cfg(), 0, NULL);
  drain_client dc = {0};
  snprintf(dc.url, sizeof dc.url, "http://127.0.0.1:%u/v1/chat/completions",
           (unsigned)ag_proxy_port(P));
  dc.body = streaming(conversation(0, "read", "{}", ""));
  dc.t = calloc(1, sizeof *dc.t);
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, drain_client_main, &dc), 0);
  /* the stream has begun (its first chunk is in) before the drain */
  for (int i = 0; i < 200 && SLOW.sent == 0; i++) {
    struct timespec ts = {0, 10 * 1000000L};
    nanosleep(&ts, NULL);
  }
  cr_assert(ag_proxy_drain(P, 10000), "the stream did not end in 10 s");
  pthread_join(th, NULL);
  cr_expect_eq(dc.cc, CURLE_OK, "%s", curl_easy_strerror(dc.cc));
  cr_expect_eq(dc.status, 200);
  cr_expect(strstr(dc.t->text, "<w4>") != NULL &&
                strstr(dc.t->text, "data: [DONE]") != NULL,
            "the stream was cut: %s", dc.t->text);
  resp *r = call(P, "GET", "/v1/models", NULL, NULL);
  cr_expect_eq(r->status, 503, "a new request while draining: %s", r->body);
  cr_expect(strstr(r->body, "shutting_down") != NULL, "%s", r->body);
  free(r);
  r = call(P, "GET", "/healthz", NULL, NULL);
  cr_expect_eq(r->status, 503);
  free(r);
  ag_proxy_stop(P);
  P = NULL;
  MHD_stop_daemon(d);
  free(dc.t);
  free(dc.body);
  P = proxy_with(test_cfg(), 0, NULL); /* for teardown */
}

/* ---- several upstreams ----------------------------------------------------
 */

static char second_url[256];

static enum MHD_Result second_handler(void *cls, struct MHD_Connection *c,
                                      const char *url, const char *method,
                                      const char *version, const char *upload,
                                      size_t *upload_size, void **con_cls) {
  (void)cls, (void)method, (void)version, (void)upload;
  if (*con_cls == NULL) {
    *con_cls = c;
    return MHD_YES;
  }
  if (*upload_size > 0) {
    *upload_size = 0;
    return MHD_YES;
  }
  snprintf(second_url, sizeof second_url, "%s", url);
  static const char body[] = "{\"from\":\"second\"}";
  struct MHD_Response *r = MHD_create_response_from_buffer(
      sizeof body - 1, (void *)body, MHD_RESPMEM_PERSISTENT);
  enum MHD_Result ret = MHD_queue_response(c, 200, r);
  MHD_destroy_response(r);
  return ret;
}

/* --anthropic-upstream: Anthropic's paths go there, every other path to
 * --upstream. */
Test(proxy, each_api_goes_to_its_own_upstream) {
  struct MHD_Daemon *d = MHD_start_daemon(
      MHD_USE_INTERNAL_POLLING_THREAD, 0, NULL, NULL, second_handler, NULL,
      MHD_OPTION_EXTERNAL_LOGGER, quiet, NULL, MHD_OPTION_END);
  cr_assert_not_null(d);
  char second[64];
  snprintf(second, sizeof second, "http://127.0.0.1:%u",
           (unsigned)MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT)->port);
  ag_proxy_stop(P);
  ag_proxy_opts o = test_opts();
  o.anthropic_upstream = second;
  P = start_with(&o);
  canned_add(200, "{\"data\":[]}");
  resp *r = call(P, "POST", "/v1/messages/count_tokens", "{}", NULL);
  cr_expect_str_eq(r->body, "{\"from\":\"second\"}");
  cr_expect_str_eq(second_url, "/v1/messages/count_tokens");
  cr_expect_eq(n_upstream(), 0, "not the default upstream");
  free(r);
  r = call(P, "GET", "/v1/models", NULL, NULL);
  cr_expect_str_eq(r->body, "{\"data\":[]}");
  cr_expect_eq(n_upstream(), 1, "every other path: --upstream");
  free(r);
  ag_proxy_stop(P);
  P = NULL;
  MHD_stop_daemon(d);
  /* a bad one is refused, named */
  o.anthropic_upstream = "ftp://x";
  ag_error_t err;
  cr_expect_eq(ag_proxy_start(&P, &o, &err), AG_EINVAL);
  cr_expect(strstr(err.msg, "--anthropic-upstream 'ftp://x'") != NULL, "%s",
            err.msg);
  P = proxy_with(test_cfg(), 0, NULL);
}
