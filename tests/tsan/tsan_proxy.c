/*
 * tests/tsan/tsan_proxy.c - the guard proxy under concurrent clients: 32
 * threads, each sending plain and streaming Chat Completions requests and a
 * pass-through request through one proxy (events written to one file) in
 * front of a fake upstream that streams its reply in delayed chunks. The
 * looping requests' replies repeat a call: the proxy nudges (for a stream,
 * on a thread of its own at the stream's end), asks again, and stops.
 * The held replies share a budget of two (so they wait for each other)
 * and the connection table is swept every 75 ms. Every request must
 * succeed with its whole reply, every stop must be decided, and under
 * ThreadSanitizer nothing may race.
 */
#define _GNU_SOURCE /* memmem */
#include <curl/curl.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "agentguard.h"
#include "agentguard/proxy.h"
#include "tsan_common.h"

#define THREADS 32
#define ROUNDS 4

static const char chunk_fmt[] =
    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,"
    "\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":"
    "\"part %d \"},\"finish_reason\":null}]}\n\n";
static const char call_chunks[] =
    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,"
    "\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{"
    "\"index\":0,\"id\":\"call_s\",\"type\":\"function\",\"function\":{"
    "\"name\":\"read\",\"arguments\":\"{\\\"path\\\":\\\"a\\\"}\"}}]},"
    "\"finish_reason\":null}]}\n\n"
    "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,"
    "\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},"
    "\"finish_reason\":\"tool_calls\"}]}\n\n";
static const char plain_reply[] =
    "{\"id\":\"x\",\"object\":\"chat.completion\",\"created\":1,\"model\":"
    "\"m\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\","
    "\"content\":null,\"tool_calls\":[{\"id\":\"call_up\",\"type\":"
    "\"function\",\"function\":{\"name\":\"read\",\"arguments\":"
    "\"{\\\"path\\\":\\\"a\\\"}\"}}]},\"finish_reason\":\"tool_calls\"}]}";

typedef struct up_conn {
  int begun;
  int streaming;
  int calls; /* a looping request: the reply repeats the call */
} up_conn;

typedef struct chunks {
  int sent;
  int calls;
} chunks;

static ssize_t stream_cb(void *cls, uint64_t pos, char *buf, size_t max) {
  (void)pos;
  chunks *c = cls;
  if (c->sent == 4)
    return MHD_CONTENT_READER_END_OF_STREAM;
  tsan_sleep_ms(5); /* a model thinking */
  int n = c->sent < 2    ? snprintf(buf, max, chunk_fmt, c->sent)
          : c->sent == 3 ? snprintf(buf, max, "data: [DONE]\n\n")
          : c->calls     ? snprintf(buf, max, "%s", call_chunks)
                         : snprintf(buf, max, chunk_fmt, c->sent);
  c->sent++;
  return n;
}

static enum MHD_Result up_handler(void *cls, struct MHD_Connection *c,
                                  const char *url, const char *method,
                                  const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls) {
  (void)cls;
  (void)url;
  (void)method;
  (void)version;
  up_conn *k = *con_cls;
  if (k == NULL) {
    *con_cls = calloc(1, sizeof(up_conn));
    return MHD_YES;
  }
  if (*upload_size > 0) {
    if (memmem(upload, *upload_size, "\"stream\":true", 13) != NULL)
      k->streaming = 1;
    if (memmem(upload, *upload_size, "\"c2\"", 4) != NULL)
      k->calls = 1;
    *upload_size = 0;
    return MHD_YES;
  }
  struct MHD_Response *r;
  if (k->streaming) {
    chunks *ch = calloc(1, sizeof *ch);
    ch->calls = k->calls;
    r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 1024, stream_cb, ch,
                                          free);
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
  } else {
    r = MHD_create_response_from_buffer(
        strlen(plain_reply), (void *)plain_reply, MHD_RESPMEM_PERSISTENT);
    MHD_add_response_header(r, "Content-Type", "application/json");
  }
  enum MHD_Result ret = MHD_queue_response(c, 200, r);
  MHD_destroy_response(r);
  return ret;
}

static void up_done(void *cls, struct MHD_Connection *c, void **con_cls,
                    enum MHD_RequestTerminationCode toe) {
  (void)cls;
  (void)c;
  (void)toe;
  free(*con_cls);
  *con_cls = NULL;
}

static uint16_t proxy_port;

typedef struct buf {
  char data[16384];
  size_t len;
} buf;

static size_t on_data(char *p, size_t s, size_t n, void *u) {
  buf *b = u;
  size_t k = s * n;
  if (b->len + k >= sizeof b->data)
    return 0;
  memcpy(b->data + b->len, p, k);
  b->len += k;
  b->data[b->len] = '\0';
  return k;
}

static long request(const char *path, const char *body, buf *out) {
  char url[128];
  snprintf(url, sizeof url, "http://127.0.0.1:%u%s", (unsigned)proxy_port,
           path);
  CURL *h = curl_easy_init();
  CHECK(h != NULL, "curl_easy_init");
  struct curl_slist *hs =
      curl_slist_append(NULL, "Content-Type: application/json");
  curl_easy_setopt(h, CURLOPT_URL, url);
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, hs);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  if (body != NULL)
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, out);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 60000L);
  out->len = 0;
  out->data[0] = '\0';
  CURLcode cc = curl_easy_perform(h);
  long status = 0;
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
  curl_slist_free_all(hs);
  curl_easy_cleanup(h);
  CHECK(cc == CURLE_OK, "%s %s", path, curl_easy_strerror(cc));
  return status;
}

/* two identical calls in the history: the reply's third is stopped */
#define LOOPING_MESSAGES                                                       \
  "\"messages\":[{\"role\":\"user\",\"content\":\"go\"},{\"role\":"            \
  "\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":"    \
  "\"function\",\"function\":{\"name\":\"read\",\"arguments\":\"{"             \
  "\\\"path\\\":"                                                              \
  "\\\"a\\\"}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":"   \
  "\"x\"},{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":"   \
  "\"c2\",\"type\":\"function\",\"function\":{\"name\":\"read\","              \
  "\"arguments\":\"{\\\"path\\\":\\\"a\\\"}\"}}]},{\"role\":\"tool\","         \
  "\"tool_call_id\":\"c2\",\"content\":\"x\"}]}"
static const char looping[] = "{\"model\":\"m\"," LOOPING_MESSAGES;
/* the same as a stream: its reply's call is the third */
static const char looping_stream[] =
    "{\"model\":\"m\",\"stream\":true," LOOPING_MESSAGES;
static const char streaming[] =
    "{\"model\":\"m\",\"stream\":true,\"messages\":[{\"role\":\"user\","
    "\"content\":\"go\"}]}";

static void *client(void *arg) {
  (void)arg;
  buf *b = malloc(sizeof *b);
  CHECK(b != NULL, "malloc");
  for (int i = 0; i < ROUNDS; i++) {
    long st = request("/v1/chat/completions", looping, b);
    CHECK(st == 200, "status %ld: %s", st, b->data);
    CHECK(strstr(b->data, "agentguard stopped this turn (identical_calls)") !=
              NULL,
          "%s", b->data);
    st = request("/v1/chat/completions", streaming, b);
    CHECK(st == 200, "status %ld", st);
    CHECK(strstr(b->data, "part 2") != NULL &&
              strstr(b->data, "data: [DONE]") != NULL,
          "%s", b->data);
    st = request("/v1/chat/completions", looping_stream, b);
    CHECK(st == 200, "status %ld", st);
    CHECK(strstr(b->data, "part 1") != NULL &&
              strstr(b->data, "call_s") == NULL &&
              strstr(b->data, "agentguard stopped this turn "
                              "(identical_calls)") != NULL &&
              strstr(b->data, "data: [DONE]") != NULL,
          "%s", b->data);
    st = request("/v1/models", NULL, b);
    CHECK(st == 200, "pass-through status %ld", st);
  }
  free(b);
  return NULL;
}

int main(void) {
  setenv("NO_PROXY", "127.0.0.1", 1);
  setenv("no_proxy", "127.0.0.1", 1);
  struct MHD_Daemon *up = MHD_start_daemon(
      MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION, 0, NULL,
      NULL, up_handler, NULL, MHD_OPTION_NOTIFY_COMPLETED, up_done, NULL,
      MHD_OPTION_END);
  CHECK(up != NULL, "fake upstream");
  char upstream[64];
  snprintf(upstream, sizeof upstream, "http://127.0.0.1:%u/v1",
           (unsigned)MHD_get_daemon_info(up, MHD_DAEMON_INFO_BIND_PORT)->port);
  FILE *events = tmpfile(), *log = tmpfile();
  CHECK(events != NULL && log != NULL, "tmpfile");
  ag_proxy_opts o;
  ag_proxy_opts_init(&o);
  o.port = 0;
  o.upstream = upstream;
  o.cfg.loop.identical_call_limit = 3;
  o.cfg.loop.nudge_before_stop = true;
  o.events = events;
  o.access_log = log; /* and attribution: shared by requests and streams */
  o.access_log_json = true;
  /* and traces, to a collector that refuses: the spans are pushed from
   * every loop while the exporter's thread drops them */
  o.otlp_traces_url = "http://127.0.0.1:9/v1/traces";
  /* a budget of two held replies: the plain requests wait their turn
   * (their transfers paused, their threads in the budget's queue); short
   * deadlines: the loops sweep the connection table every 75 ms */
  o.max_buffered = 128 << 10;
  o.idle_timeout_ms = 300;
  o.header_timeout_ms = 2000;
  ag_proxy *p = NULL;
  ag_error_t err;
  CHECK(ag_proxy_start(&p, &o, &err) == AG_OK, "%s", err.msg);
  proxy_port = ag_proxy_port(p);
  pthread_t t[THREADS];
  for (int i = 0; i < THREADS; i++)
    CHECK(pthread_create(&t[i], NULL, client, NULL) == 0, "thread %d", i);
  for (int i = 0; i < THREADS; i++)
    pthread_join(t[i], NULL);
  ag_proxy_stop(p);
  MHD_stop_daemon(up);
  rewind(events);
  int lines = 0, ch;
  while ((ch = fgetc(events)) != EOF)
    lines += ch == '\n';
  fclose(events);
  /* each looping request: a nudge, then its reply replaced */
  CHECK(lines == THREADS * ROUNDS * 4, "%d event lines, want %d", lines,
        THREADS * ROUNDS * 4);
  rewind(log);
  int logged = 0;
  while ((ch = fgetc(log)) != EOF)
    logged += ch == '\n';
  fclose(log);
  /* one access-log line per request */
  CHECK(logged == THREADS * ROUNDS * 4, "%d log lines, want %d", logged,
        THREADS * ROUNDS * 4);
  printf("tsan_proxy: %d requests from %d threads, all answered\n",
         THREADS * ROUNDS * 4, THREADS);
  return 0;
}
