/*
 * proxy_fixture.c - test_proxy's fixture: a fake upstream (libmicrohttpd,
 * canned replies in order), the proxy under test and a libcurl client
 * (proxy_fixture.h).
 */
#include "proxy_fixture.h"

/* ------------------------------------------------------------------------ */
/* The fake upstream                                                        */
/* ------------------------------------------------------------------------ */

fake_upstream U;

typedef struct conn {
  char *body;
  size_t len;
} conn;

char *dupz(const char *s) {
  return s != NULL ? strdup(s) : NULL;
}

/* Counts the traceparent headers and those named x-h-... of a request. */
static enum MHD_Result count_header(void *cls, enum MHD_ValueKind kind,
                                    const char *key, const char *value) {
  (void)kind;
  (void)value;
  seen *s = cls;
  s->n_tp += strcasecmp(key, "traceparent") == 0;
  s->n_xh += strncasecmp(key, "x-h-", 4) == 0;
  return MHD_YES;
}

enum MHD_Result up_handler(void *cls, struct MHD_Connection *c, const char *url,
                           const char *method, const char *version,
                           const char *upload, size_t *upload_size,
                           void **con_cls) {
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
    s->n_tp = s->n_xh = 0;
    MHD_get_connection_values(c, MHD_HEADER_KIND, count_header, s);
    s->url = dupz(url);
    s->body = dupz(k->body != NULL ? k->body : "");
    s->auth =
        dupz(MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization"));
    s->agkey = dupz(
        MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-agentguard-key"));
    s->query = dupz(MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "q"));
    s->alt = dupz(MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "alt"));
    s->order =
        dupz(MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "order"));
    s->after =
        dupz(MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "after"));
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
  struct MHD_Response *answer = MHD_create_response_from_buffer(
      strlen(r.body), r.body, MHD_RESPMEM_MUST_COPY);
  pthread_mutex_unlock(&U.mu);
  MHD_add_response_header(answer, "Content-Type",
                          strncmp(r.body, "data:", 5) == 0
                              ? "text/event-stream"
                              : "application/json");
  MHD_add_response_header(answer, "X-Upstream", "fake");
  enum MHD_Result ret = MHD_queue_response(c, (unsigned)r.status, answer);
  MHD_destroy_response(answer);
  return ret;
}

void up_completed(void *cls, struct MHD_Connection *c, void **con_cls,
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

void up_conn_notify(void *cls, struct MHD_Connection *c, void **socket_ctx,
                    enum MHD_ConnectionNotificationCode code) {
  (void)cls, (void)c, (void)socket_ctx;
  if (code != MHD_CONNECTION_NOTIFY_STARTED)
    return;
  pthread_mutex_lock(&U.mu);
  U.n_conns++;
  pthread_mutex_unlock(&U.mu);
}

void quiet(void *cls, const char *fmt, va_list ap) {
  (void)cls;
  (void)fmt;
  (void)ap;
}

void canned_reset(void) {
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
    free(U.reqs[i].order);
    free(U.reqs[i].after);
  }
  U.n_replies = U.next = U.n_reqs = 0;
  pthread_mutex_unlock(&U.mu);
}

void canned_add(int status, const char *body) {
  pthread_mutex_lock(&U.mu);
  cr_assert_lt(U.n_replies, MAX_CANNED);
  U.replies[U.n_replies].status = status;
  U.replies[U.n_replies].body = strdup(body);
  U.n_replies++;
  pthread_mutex_unlock(&U.mu);
}

/* A Chat Completions reply with one call, or text when name is NULL. */
void canned_call(const char *name, const char *args) {
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

int n_upstream(void) {
  pthread_mutex_lock(&U.mu);
  int n = U.n_reqs;
  pthread_mutex_unlock(&U.mu);
  return n;
}

void up_start(void) {
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

ag_proxy *P;
char upstream_url[64];

ag_config test_cfg(void) {
  ag_config c;
  cr_assert_eq(ag_config_preset(&c, "default", NULL), AG_OK);
  c.loop.identical_call_limit = 3;
  c.loop.nudge_before_stop = false;
  c.loop.final_request_without_tools = false;
  c.errors.max_consecutive_errors = 2;
  return c;
}

ag_proxy *proxy_with(ag_config cfg, size_t max_body, const char *key) {
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
ag_proxy_opts test_opts(void) {
  ag_proxy_opts o;
  ag_proxy_opts_init(&o);
  o.port = 0;
  o.upstream = upstream_url;
  o.cfg = test_cfg();
  return o;
}

ag_proxy *start_with(const ag_proxy_opts *o) {
  ag_proxy *p = NULL;
  ag_error_t err;
  cr_assert_eq(ag_proxy_start(&p, o, &err), AG_OK, "%s", err.msg);
  return p;
}

void setup(void) {
  up_start();
  snprintf(upstream_url, sizeof upstream_url, "http://127.0.0.1:%d/v1", U.port);
  P = proxy_with(test_cfg(), 0, NULL);
}

void teardown(void) {
  ag_proxy_stop(P);
  P = NULL;
  MHD_stop_daemon(U.d);
  canned_reset();
  pthread_mutex_destroy(&U.mu);
}

size_t rbody(char *p, size_t s, size_t n, void *u) {
  resp *r = u;
  size_t k = s * n;
  if (r->len + k >= sizeof r->body)
    return 0;
  memcpy(r->body + r->len, p, k);
  r->len += k;
  r->body[r->len] = '\0';
  return k;
}

size_t rhdr(char *p, size_t s, size_t n, void *u) {
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
resp *call_on(CURL *h, const ag_proxy *p, const char *method, const char *path,
              const char *body, const char *extra_header) {
  resp *r = calloc(1, sizeof *r);
  char url[256];
  snprintf(url, sizeof url, "http://127.0.0.1:%u%s", (unsigned)ag_proxy_port(p),
           path);
  struct curl_slist *hs = curl_slist_append(NULL, "Authorization: Bearer "
                                                  "sk-client-secret");
  hs = curl_slist_append(hs, "Content-Type: application/json");
  for (const char *e = extra_header; e != NULL && *e != '\0';) {
    size_t n = strcspn(e, "\n");
    char line[512];
    snprintf(line, sizeof line, "%.*s", (int)(n < 511 ? n : 511), e);
    hs = curl_slist_append(hs, line);
    e += n + (e[n] == '\n');
  }
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

resp *call(const ag_proxy *p, const char *method, const char *path,
           const char *body, const char *extra_header) {
  CURL *h = curl_easy_init();
  resp *r = call_on(h, p, method, path, body, extra_header);
  curl_easy_cleanup(h);
  return r;
}

/* A conversation: a user message, then `n` rounds of the call name(args)
 * answered by `result`; tools offered. Caller frees. */
char *conversation(int n, const char *name, const char *args,
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

json_t *message_of(const resp *r) {
  json_t *j = json_loads(r->body, 0, NULL);
  cr_assert_not_null(j, "not JSON: %s", r->body);
  json_t *m = json_object_get(json_array_get(json_object_get(j, "choices"), 0),
                              "message");
  cr_assert(json_is_object(m), "no message: %s", r->body);
  json_incref(m);
  json_decref(j);
  return m;
}

const char *err_code(const resp *r, char *buf, size_t cap) {
  json_t *j = json_loads(r->body, 0, NULL);
  cr_assert_not_null(j, "not JSON: %s", r->body);
  json_t *e = json_object_get(j, "error");
  cr_assert(json_is_string(json_object_get(e, "message")), "%s", r->body);
  cr_assert(json_is_string(json_object_get(e, "type")), "%s", r->body);
  snprintf(buf, cap, "%s", json_string_value(json_object_get(e, "code")));
  json_decref(j);
  return buf;
}

size_t big_write(char *p, size_t s, size_t n, void *u) {
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

void nap_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

bool ends_with_done(const resp *r) {
  return r->len >= 14 && strcmp(r->body + r->len - 14, "data: [DONE]\n\n") == 0;
}

char *streaming(char *body) {
  json_t *j = json_loads(body, 0, NULL);
  free(body);
  json_object_set_new(j, "stream", json_true());
  char *t = json_dumps(j, JSON_COMPACT);
  json_decref(j);
  return t;
}

/* An upstream stream: "Hello", " world", then a call read(args) in two
 * fragments, the finish reason, a usage chunk, [DONE]. */
void canned_stream_call(const char *args) {
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

/* A Messages conversation: a user message, then `n` rounds of the call
 * name(args) answered by `result` (is_error as given). Caller frees. */
char *messages_conv(int n, const char *args, const char *result, bool is_error,
                    bool stream) {
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

void canned_message_call(const char *args) {
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

/* Runs `agentguard proxy ARGS` (which must fail before serving); returns
 * the exit code, stderr in err. */
int cli(const char *args, char *err, size_t cap) {
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

/* the random turns' generator (proxy_parity.c, proxy_apis.c): a fixed
 * seed, so every run draws the same */
unsigned long rng_state = 12345;

unsigned rnd(unsigned n) {
  rng_state = rng_state * 6364136223846793005UL + 1442695040888963407UL;
  return (unsigned)((rng_state >> 33) % n);
}

/* A slow streaming upstream: SLOW_CHUNKS text chunks SLOW_GAP_MS apart
 * (each one's send time noted), then [DONE]. */

double mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

ssize_t slow_reader(void *cls, uint64_t pos, char *buf, size_t max) {
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

slow_up SLOW; /* the one slow upstream at a time */

enum MHD_Result slow_handler(void *cls, struct MHD_Connection *c,
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

size_t timed_write(char *p, size_t s, size_t n, void *u) {
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
