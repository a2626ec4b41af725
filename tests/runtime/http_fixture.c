/*
 * tests/runtime/http_fixture.c - the fake model server and the client
 * helpers of test_http_provider (http_fixture.h).
 */
#include <criterion/criterion.h>
#include <criterion/hooks.h>
#include <dirent.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "http_fixture.h"

void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0)
    ;
}

char *read_fixture(const char *rel, size_t *len) {
  char path[1024];
  snprintf(path, sizeof(path), "%s/tests/fixtures/%s", AG_SOURCE_DIR, rel);
  FILE *f = fopen(path, "rb");
  cr_assert_not_null(f, "fixture %s missing", path);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = malloc((size_t)n + 1);
  cr_assert_not_null(b);
  cr_assert_eq(fread(b, 1, (size_t)n, f), (size_t)n);
  b[n] = '\0';
  fclose(f);
  *len = (size_t)n;
  return b;
}

/* ------------------------------------------------------------------------ */
/* The fake server                                                          */
/* ------------------------------------------------------------------------ */

server S;

typedef struct conn {
  char *body;
  size_t len;
} conn;

typedef struct reader {
  const plan *p;
  size_t sent;
} reader;

static ssize_t read_cb(void *cls, uint64_t pos, char *buf, size_t max) {
  reader *r = cls;
  const plan *p = r->p;
  (void)pos;
  if (p->cut_at >= 0 && r->sent >= (size_t)p->cut_at)
    return MHD_CONTENT_READER_END_WITH_ERROR;
  if (p->stall_at >= 0 && r->sent >= (size_t)p->stall_at) {
    for (int i = 0; i < 500 && !atomic_load(&S.stop); i++)
      sleep_ms(10);
    return MHD_CONTENT_READER_END_WITH_ERROR;
  }
  if (r->sent >= p->body_len)
    return MHD_CONTENT_READER_END_OF_STREAM;
  if (r->sent > 0 && p->chunk_ms > 0)
    sleep_ms(p->chunk_ms);
  size_t n = p->body_len - r->sent;
  if (p->chunk > 0 && n > p->chunk)
    n = p->chunk;
  if (p->cut_at >= 0 && r->sent + n > (size_t)p->cut_at)
    n = (size_t)p->cut_at - r->sent;
  if (p->stall_at >= 0 && r->sent + n > (size_t)p->stall_at)
    n = (size_t)p->stall_at - r->sent;
  if (n > max)
    n = max;
  memcpy(buf, p->body + r->sent, n);
  r->sent += n;
  return (ssize_t)n;
}

static char *dupz(const char *s) {
  return s != NULL ? strdup(s) : NULL;
}

static void dump_request(const char *body, size_t len, int n) {
  char dir[1024], path[1100];
  snprintf(dir, sizeof(dir), "%s/http-requests", AG_BINARY_DIR);
  mkdir(dir, 0777);
  /* named by API: the schema check reads the openai-* ones */
  const char *api = strstr(S.last_url, "/v1/messages") != NULL ? "anthropic"
                    : strstr(S.last_url, "/responses") != NULL ? "responses"
                    : strstr(S.last_url, "/models/") != NULL   ? "gemini"
                    : strstr(S.last_url, "/api/chat") != NULL  ? "ollama"
                                                               : "openai";
  snprintf(path, sizeof(path), "%s/%s-%d-%d.json", dir, api, (int)getpid(), n);
  FILE *f = fopen(path, "wb");
  if (f != NULL) {
    fwrite(body, 1, len, f);
    fclose(f);
  }
}

/* Each run starts with no request dumps of an earlier one. */
ReportHook(PRE_ALL)(struct criterion_test_set *set) {
  (void)set;
  char dir[1024];
  snprintf(dir, sizeof(dir), "%s/http-requests", AG_BINARY_DIR);
  DIR *d = opendir(dir);
  if (d == NULL)
    return;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (strncmp(e->d_name, "openai-", 7) == 0 ||
        strncmp(e->d_name, "anthropic-", 10) == 0) {
      char path[1400];
      snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
      unlink(path);
    }
  }
  closedir(d);
}

enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url,
                        const char *method, const char *version,
                        const char *upload, size_t *upload_size,
                        void **con_cls) {
  (void)cls;
  (void)method;
  (void)version;
  conn *k = *con_cls;
  if (k == NULL) {
    k = calloc(1, sizeof(*k));
    *con_cls = k;
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
  pthread_mutex_lock(&S.mu);
  S.n_requests++;
  free(S.last_body);
  free(S.last_url);
  free(S.last_auth);
  free(S.last_xkey);
  free(S.last_alt);
  free(S.last_version);
  free(S.last_accept);
  free(S.last_custom);
  S.last_body = dupz(k->body != NULL ? k->body : "");
  S.last_url = dupz(url);
  S.last_auth =
      dupz(MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization"));
  const char *xk = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key");
  S.last_xkey = dupz(xk != NULL ? xk
                                : MHD_lookup_connection_value(
                                      c, MHD_HEADER_KIND, "x-goog-api-key"));
  S.last_alt =
      dupz(MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "alt"));
  S.last_version = dupz(
      MHD_lookup_connection_value(c, MHD_HEADER_KIND, "anthropic-version"));
  S.last_accept =
      dupz(MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Accept"));
  S.last_custom =
      dupz(MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Test"));
  dump_request(S.last_body, strlen(S.last_body), S.n_requests);
  pthread_mutex_unlock(&S.mu);

  const plan *p = &S.p;
  if (p->never_answer) {
    for (int i = 0; i < 1000 && !atomic_load(&S.stop); i++)
      sleep_ms(10);
    return MHD_NO;
  }
  reader *r = calloc(1, sizeof(*r));
  r->p = p;
  struct MHD_Response *resp = MHD_create_response_from_callback(
      MHD_SIZE_UNKNOWN, 64 * 1024, read_cb, r, free);
  if (p->content_type != NULL)
    MHD_add_response_header(resp, "Content-Type", p->content_type);
  if (p->hdr_name != NULL)
    MHD_add_response_header(resp, p->hdr_name, p->hdr_value);
  enum MHD_Result ret = MHD_queue_response(c, (unsigned)p->status, resp);
  MHD_destroy_response(resp);
  return ret;
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
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

static void quiet_log(void *cls, const char *fmt, va_list ap) {
  (void)cls;
  (void)fmt;
  (void)ap;
}

void server_start(void) {
  memset(&S, 0, sizeof(S));
  pthread_mutex_init(&S.mu, NULL);
  S.p.status = 200;
  S.p.cut_at = -1;
  S.p.stall_at = -1;
  S.d = MHD_start_daemon(
      MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION |
          MHD_USE_ERROR_LOG,
      0, NULL, NULL, handler, NULL, MHD_OPTION_NOTIFY_COMPLETED, completed,
      NULL, MHD_OPTION_EXTERNAL_LOGGER, quiet_log, NULL, MHD_OPTION_END);
  cr_assert_not_null(S.d, "the fake server did not start");
  const union MHD_DaemonInfo *info =
      MHD_get_daemon_info(S.d, MHD_DAEMON_INFO_BIND_PORT);
  S.port = info->port;
  /* Loopback only: no proxy from the environment. */
  setenv("NO_PROXY", "127.0.0.1,localhost", 1);
  setenv("no_proxy", "127.0.0.1,localhost", 1);
  setenv("TEST_KEY", SECRET, 1);
  unsetenv("TEST_NO_KEY");
  unsetenv("AGENTGUARD_BASE_URL");
  unsetenv("AGENTGUARD_MODEL");
}

void server_stop(void) {
  atomic_store(&S.stop, true);
  MHD_stop_daemon(S.d);
  free(S.p.body);
  free(S.last_body);
  free(S.last_url);
  free(S.last_auth);
  free(S.last_xkey);
  free(S.last_alt);
  free(S.last_version);
  free(S.last_accept);
  free(S.last_custom);
  pthread_mutex_destroy(&S.mu);
}

void serve_fixture(const char *rel, const char *ctype, size_t chunk,
                   int chunk_ms) {
  free(S.p.body);
  S.p.body = read_fixture(rel, &S.p.body_len);
  S.p.content_type = ctype;
  S.p.chunk = chunk;
  S.p.chunk_ms = chunk_ms;
}

void serve_text(int status, const char *ctype, const char *body) {
  free(S.p.body);
  S.p.status = status;
  S.p.body = strdup(body);
  S.p.body_len = strlen(body);
  S.p.content_type = ctype;
}

/* ------------------------------------------------------------------------ */
/* Client side helpers                                                      */
/* ------------------------------------------------------------------------ */

static char base_url[64];

ag_provider *provider(const char *kind, bool stream,
                      void (*edit)(ag_http_provider_opts *)) {
  ag_http_provider_opts o;
  ag_http_provider_opts_init(&o);
  o.kind = kind;
  bool openai = strncmp(kind, "openai", 6) == 0; /* and openai-responses */
  bool gemini = strcmp(kind, "gemini") == 0;
  bool ollama = strcmp(kind, "ollama") == 0;
  snprintf(base_url, sizeof(base_url),
           openai   ? "http://127.0.0.1:%d/v1"
           : gemini ? "http://127.0.0.1:%d/v1beta"
                    : "http://127.0.0.1:%d",
           S.port);
  o.base_url = base_url;
  o.model = openai   ? "gpt-4o-mini"
            : gemini ? "gemini-2.5-flash"
            : ollama ? "qwen3:8b"
                     : "claude-sonnet-4-5";
  o.api_key_env = "TEST_KEY";
  o.stream = stream;
  if (edit != NULL)
    edit(&o);
  ag_provider *p = NULL;
  ag_error_t err;
  cr_assert_eq(ag_provider_http_new(&p, &o, &err), AG_OK, "%s", err.msg);
  cr_assert_str_eq(ag_provider_kind(p), kind);
  return p;
}

json_t *history(void) {
  json_error_t je;
  json_t *m = json_loads(
      "[{\"role\":\"system\",\"content\":\"You are terse.\"},"
      "{\"role\":\"user\",\"content\":\"Read notes.txt, then list src.\"},"
      "{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":["
      "{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":"
      "\"read_file\",\"arguments\":\"{\\\"path\\\":\\\"notes.txt\\\"}\"}},"
      "{\"id\":\"call_2\",\"type\":\"function\",\"function\":{\"name\":"
      "\"list_dir\",\"arguments\":\"{bad json\"}}]},"
      "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"milk, "
      "eggs\"},"
      "{\"role\":\"tool\",\"tool_call_id\":\"call_2\",\"content\":\"<error>\\n"
      "tool: list_dir\\ntype: validation\\n</error>\"},"
      "{\"role\":\"user\",\"content\":\"The previous iteration failed.\"}]",
      0, &je);
  cr_assert_not_null(m, "%s", je.text);
  return m;
}

json_t *tools(void) {
  json_error_t je;
  json_t *t = json_loads(
      "[{\"type\":\"function\",\"function\":{\"name\":\"read_file\","
      "\"description\":\"Read a file\",\"parameters\":{\"type\":\"object\","
      "\"properties\":{\"path\":{\"type\":\"string\"}},\"required\":[\"path\"]"
      "}}},{\"type\":\"function\",\"function\":{\"name\":\"list_dir\","
      "\"parameters\":{\"type\":\"object\"}}}]",
      0, &je);
  cr_assert_not_null(t, "%s", je.text);
  return t;
}

static bool utf8_complete(const char *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    unsigned char c = (unsigned char)s[i];
    size_t k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : 4;
    if (i + k > n)
      return false;
    for (size_t j = 1; j < k; j++)
      if (((unsigned char)s[i + j] >> 6) != 2)
        return false;
    i += k;
  }
  return true;
}

int on_delta(void *user, const char *text, size_t len) {
  deltas *d = user;
  if (!utf8_complete(text, len))
    d->bad_utf8 = true;
  if (d->len + len < sizeof(d->buf)) {
    memcpy(d->buf + d->len, text, len);
    d->len += len;
    d->buf[d->len] = '\0';
  }
  d->n++;
  return d->stop_after > 0 && d->n >= d->stop_after;
}

ag_err_t ask(ag_provider *p, const json_t *msgs, const json_t *tl,
             ag_cancel *cancel, deltas *d, ag_reply *r, ag_provider_error *pe) {
  ag_request req = {msgs, tl, 1, 1, NULL, 0};
  return ag_provider_complete(p, &req, cancel, d != NULL ? on_delta : NULL, d,
                              r, pe);
}

json_t *sent_body(void) {
  json_error_t je;
  json_t *b = json_loads(S.last_body, 0, &je);
  cr_assert_not_null(b, "the client sent no JSON: %s", S.last_body);
  return b;
}

/* The key must not be in anything the caller can see. */
void no_secret(const ag_provider_error *pe) {
  cr_expect(strstr(pe->message, SECRET) == NULL, "key in message: %s",
            pe->message);
  cr_expect(strstr(pe->details, SECRET) == NULL, "key in details: %s",
            pe->details);
  cr_expect(strstr(pe->service, SECRET) == NULL);
  /* Nor in the body sent (the fake server's dumps). */
  cr_expect(S.last_body == NULL || strstr(S.last_body, SECRET) == NULL);
}

/* Options a test sets besides the defaults: sampling, headers, a body
 * extra. */
void edit_options(ag_http_provider_opts *o) {
  static const char *const headers[] = {"X-Test: yes", NULL};
  o->temperature = 0.25;
  o->max_tokens = 300;
  o->parallel_tool_calls = false;
  o->headers = headers;
  o->extra_body_json = "{\"seed\": 7, \"user\": \"agentguard-test\"}";
}
