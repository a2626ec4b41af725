/*
 * bench_proxy_memory.c - the proxy's memory with many large replies at
 * once (docs/proxy.md, "Memory"; docs/benchmarks.md). In one process:
 *   - a fake upstream (libmicrohttpd, a thread per connection) that
 *     answers GET /v1/files/f/content with SIZE bytes and POST
 *     /v1/chat/completions with a Chat Completions reply whose text is
 *     SIZE bytes, both generated as they are sent (the upstream holds none
 *     of it);
 *   - the proxy (ag_proxy_start, loopback, the default preset and
 *     --max-buffered unless --max-buffered is given);
 *   - CLIENTS client threads, each one request at once, reading as fast as
 *     they can and keeping nothing.
 * The guarded replies are at most 3,500,000 bytes (a guarded reply's text
 * is capped at 4 MiB: a larger one gets a 502, as the providers refuse
 * it). Printed per kind of reply (passed through, guarded whole): the
 * statuses,
 * the seconds it took, the process's peak RSS over its RSS before the run
 * (VmHWM - VmRSS, /proc/self/status: the proxy's share, the rest of the
 * process holding no reply), and the bound docs/proxy.md gives. Figures
 * only: it exits 1 when something is broken (setup, a status other than
 * 200 or a short body), never on the figures.
 *
 *   build/bench_proxy_memory [--clients N] [--size BYTES]
 *                            [--max-buffered BYTES] [--no-mallopt]
 *   (--no-mallopt: glibc's default, a mmap threshold that rises with each
 *   large free, instead of the fixed one `agentguard proxy` sets)
 *   (defaults: 40 clients, 30,000,000 bytes: the figure)
 */
#define _GNU_SOURCE
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <curl/curl.h>
#include <microhttpd.h>

#include "agentguard.h"
#include "agentguard/proxy.h"

static size_t body_size = 30000000;

/* ---- The upstream: bodies generated as they are sent ------------------ */

typedef struct gen {
  bool json; /* a chat.completion around the text */
} gen;

static const char json_head[] =
    "{\"id\":\"chatcmpl-big\",\"object\":\"chat.completion\",\"created\":1,"
    "\"model\":\"m\",\"choices\":[{\"index\":0,\"message\":{\"role\":"
    "\"assistant\",\"content\":\"";
static const char json_tail[] =
    "\"},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":1,"
    "\"completion_tokens\":1,\"total_tokens\":2}}";

/* Varied text (a repeated one would be stopped as a content loop): the
 * byte at `pos` of a stream of words, the same wherever a read begins. */
static char text_at(uint64_t pos) {
  uint64_t word = pos / 8, k = pos % 8;
  if (k == 7)
    return ' ';
  uint64_t h = (word + 1) * 0x9E3779B97F4A7C15ull;
  return (char)('a' + (h >> (k * 5 + 20)) % 26);
}

static ssize_t gen_read(void *cls, uint64_t pos, char *buf, size_t max) {
  gen *g = cls;
  uint64_t hl = g->json ? sizeof json_head - 1 : 0;
  uint64_t tl = g->json ? sizeof json_tail - 1 : 0;
  uint64_t total = hl + body_size + tl;
  if (pos >= total)
    return MHD_CONTENT_READER_END_OF_STREAM;
  size_t n = 0;
  while (n < max && pos + n < total) {
    uint64_t at = pos + n;
    buf[n++] = at < hl               ? json_head[at]
               : at < hl + body_size ? text_at(at - hl)
                                     : json_tail[at - hl - body_size];
  }
  return (ssize_t)n;
}

static enum MHD_Result up_handler(void *cls, struct MHD_Connection *c,
                                  const char *url, const char *method,
                                  const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls) {
  (void)cls, (void)method, (void)version, (void)upload;
  static int mark;
  if (*con_cls == NULL) {
    *con_cls = &mark;
    return MHD_YES;
  }
  if (*upload_size > 0) {
    *upload_size = 0;
    return MHD_YES;
  }
  static gen json_gen = {true}, raw_gen = {false};
  bool json = strstr(url, "chat/completions") != NULL;
  uint64_t size =
      body_size + (json ? sizeof json_head + sizeof json_tail - 2 : 0);
  struct MHD_Response *r = MHD_create_response_from_callback(
      size, 64 * 1024, gen_read, json ? &json_gen : &raw_gen, NULL);
  MHD_add_response_header(r, "Content-Type",
                          json ? "application/json"
                               : "application/octet-stream");
  enum MHD_Result ret = MHD_queue_response(c, 200, r);
  MHD_destroy_response(r);
  return ret;
}

static void quiet(void *cls, const char *fmt, va_list ap) {
  (void)cls, (void)fmt, (void)ap;
}

/* ---- Clients ------------------------------------------------------------- */

typedef struct client {
  const char *url;
  bool post;
  long status;
  size_t got;
  CURLcode cc;
} client;

static size_t discard(char *p, size_t s, size_t n, void *u) {
  (void)p;
  ((client *)u)->got += s * n;
  return s * n;
}

static void *client_main(void *arg) {
  client *c = arg;
  CURL *h = curl_easy_init();
  curl_easy_setopt(h, CURLOPT_URL, c->url);
  if (c->post)
    curl_easy_setopt(h, CURLOPT_POSTFIELDS,
                     "{\"model\":\"m\",\"messages\":[{\"role\":\"user\","
                     "\"content\":\"hi\"}]}");
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, discard);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, c);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 300000L);
  c->cc = curl_easy_perform(h);
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &c->status);
  curl_easy_cleanup(h);
  return NULL;
}

/* ---- Memory -------------------------------------------------------------- */

static long status_kb(const char *key) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  long kb = -1;
  size_t kl = strlen(key);
  while (f != NULL && fgets(line, sizeof line, f) != NULL)
    if (strncmp(line, key, kl) == 0)
      kb = strtol(line + kl, NULL, 10);
  if (f != NULL)
    fclose(f);
  return kb;
}

/* Sets the peak (VmHWM) back to the present RSS (Linux 4.0+). */
static void reset_peak(void) {
  FILE *f = fopen("/proc/self/clear_refs", "w");
  if (f != NULL) {
    fputs("5", f);
    fclose(f);
  }
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static int run(const char *what, unsigned port, const char *path, bool post,
               int n) {
  char url[128];
  snprintf(url, sizeof url, "http://127.0.0.1:%u%s", port, path);
  client *cs = calloc((size_t)n, sizeof *cs);
  pthread_t *ts = calloc((size_t)n, sizeof *ts);
  reset_peak();
  long before = status_kb("VmRSS:");
  double t0 = now_s();
  for (int i = 0; i < n; i++) {
    cs[i] = (client){url, post, 0, 0, CURLE_OK};
    pthread_create(&ts[i], NULL, client_main, &cs[i]);
  }
  int bad = 0;
  for (int i = 0; i < n; i++) {
    pthread_join(ts[i], NULL);
    if (cs[i].cc != CURLE_OK || cs[i].status != 200 || cs[i].got < body_size)
      bad++;
  }
  double took = now_s() - t0;
  long peak = status_kb("VmHWM:");
  printf("%-22s %3d clients x %zu bytes: %d failed, %.1f s, peak RSS over "
         "the start %.1f MiB (%.0f KiB a client)\n",
         what, n, body_size, bad, took, (double)(peak - before) / 1024,
         (double)(peak - before) / n);
  free(cs);
  free(ts);
  return bad;
}

int main(int argc, char **argv) {
  int clients = 40;
  size_t max_buffered = 0;
  bool use_mallopt = true;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--clients") == 0 && i + 1 < argc)
      clients = atoi(argv[++i]);
    else if (strcmp(argv[i], "--size") == 0 && i + 1 < argc)
      body_size = strtoull(argv[++i], NULL, 10);
    else if (strcmp(argv[i], "--no-mallopt") == 0)
      use_mallopt = false;
    else if (strcmp(argv[i], "--max-buffered") == 0 && i + 1 < argc)
      max_buffered = strtoull(argv[++i], NULL, 10);
    else {
      fprintf(stderr, "usage: bench_proxy_memory [--clients N] [--size "
                      "BYTES] [--max-buffered BYTES] [--no-mallopt]\n");
      return 2;
    }
  }
  if (clients < 1 || clients > 1000 || body_size < 1 ||
      body_size > (size_t)AG_PROXY_UPSTREAM_MAX - 512) {
    fprintf(stderr, "bench_proxy_memory: --clients 1..1000, --size 1..%u\n",
            (unsigned)AG_PROXY_UPSTREAM_MAX - 512);
    return 2;
  }
  /* as `agentguard proxy` does; --no-mallopt shows what it is for */
  if (use_mallopt) {
    mallopt(M_MMAP_THRESHOLD, 1024 * 1024);
    mallopt(M_TRIM_THRESHOLD, 1024 * 1024);
  }
  curl_global_init(CURL_GLOBAL_DEFAULT);
  struct MHD_Daemon *d = MHD_start_daemon(
      MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION, 0, NULL,
      NULL, up_handler, NULL, MHD_OPTION_EXTERNAL_LOGGER, quiet, NULL,
      MHD_OPTION_CONNECTION_LIMIT, 2000u, MHD_OPTION_END);
  if (d == NULL) {
    fprintf(stderr, "bench_proxy_memory: cannot start the upstream\n");
    return 1;
  }
  char up[64];
  snprintf(up, sizeof up, "http://127.0.0.1:%u",
           (unsigned)MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT)->port);
  ag_proxy_opts o;
  ag_proxy_opts_init(&o);
  o.port = 0;
  o.upstream = up;
  o.max_buffered = max_buffered;
  ag_proxy *p = NULL;
  ag_error_t err;
  if (ag_proxy_start(&p, &o, &err) != AG_OK) {
    fprintf(stderr, "bench_proxy_memory: %s\n", err.msg);
    return 1;
  }
  size_t budget =
      max_buffered > 0 ? max_buffered : AG_PROXY_MAX_BUFFERED_DEFAULT;
  printf("bench_proxy_memory: --max-buffered %.0f MiB; the bound for replies "
         "held whole: %.0f MiB (it + one reply of at most %u MiB, three "
         "times: bytes, tree, text)\n",
         (double)budget / (1 << 20),
         (double)(budget + 3 * (size_t)AG_PROXY_UPSTREAM_MAX) / (1 << 20),
         (unsigned)(AG_PROXY_UPSTREAM_MAX >> 20));
  int bad = run("passed through (GET)", ag_proxy_port(p), "/v1/files/f/content",
                false, clients);
  /* a guarded reply's text is capped at 4 MiB (larger ones get a 502) */
  size_t all = body_size;
  if (body_size > 3500000)
    body_size = 3500000;
  bad += run("guarded, held whole", ag_proxy_port(p), "/v1/chat/completions",
             true, clients);
  body_size = all;
  ag_proxy_stop(p);
  MHD_stop_daemon(d);
  curl_global_cleanup();
  return bad > 0 ? 1 : 0;
}
