/*
 * bench_proxy_flood.c - a legitimate client's wait while idle and
 * slowloris connections try to take every slot of the proxy
 * (docs/security.md, "The proxy"; docs/benchmarks.md). In one process:
 *   - a fake upstream (libmicrohttpd) that answers GET /v1/models at once;
 *   - the proxy (ag_proxy_start, loopback) with --max-connections SLOTS;
 *   - IDLE connections that connect and send nothing, and SLOW slowloris
 *     clients that send a request line and then one header byte every
 *     GAP_MS, never ending their headers (each reconnects when the proxy
 *     closes it, so the flood goes on for the whole run);
 *   - a legitimate client that makes a request on a new connection every
 *     100 ms for SECONDS, each with a 10 s limit.
 * Printed: how many legitimate requests were served (200) and their times
 * (p50, p99, max), how many flood connections the proxy closed or
 * refused. The figure: --max-connections 64, 5,000 idle and 64
 * slowloris clients, every request served within 1 s. Figures only: it
 * exits 1 when something is broken (setup), never on the figures.
 *
 *   build/bench_proxy_flood [--slots N] [--idle N] [--slow N]
 *                           [--gap-ms MS] [--seconds S]
 *   (defaults: 64 slots, 5000 idle, 64 slow, 2000 ms, 10 s)
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <microhttpd.h>

#include "agentguard.h"
#include "agentguard/proxy.h"

static enum MHD_Result up_handler(void *cls, struct MHD_Connection *c,
                                  const char *url, const char *method,
                                  const char *version, const char *upload,
                                  size_t *upload_size, void **con_cls) {
  (void)cls, (void)url, (void)method, (void)version, (void)upload;
  (void)upload_size, (void)con_cls;
  static const char body[] = "{\"object\":\"list\",\"data\":[]}";
  struct MHD_Response *r = MHD_create_response_from_buffer(
      sizeof body - 1, (void *)body, MHD_RESPMEM_PERSISTENT);
  enum MHD_Result ret = MHD_queue_response(c, 200, r);
  MHD_destroy_response(r);
  return ret;
}

static void quiet(void *cls, const char *fmt, va_list ap) {
  (void)cls, (void)fmt, (void)ap;
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int connect_to(unsigned port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  if (fd < 0)
    return -1;
  struct sockaddr_in sa = {.sin_family = AF_INET,
                           .sin_port = htons((uint16_t)port),
                           .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0 &&
      errno != EINPROGRESS) {
    close(fd);
    return -1;
  }
  return fd;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static size_t discard(char *p, size_t s, size_t n, void *u) {
  (void)p, (void)u;
  return s * n;
}

int main(int argc, char **argv) {
  int slots = 64, n_idle = 5000, n_slow = 64, gap_ms = 2000, seconds = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    int v = atoi(argv[i + 1]);
    if (strcmp(argv[i], "--slots") == 0)
      slots = v;
    else if (strcmp(argv[i], "--idle") == 0)
      n_idle = v;
    else if (strcmp(argv[i], "--slow") == 0)
      n_slow = v;
    else if (strcmp(argv[i], "--gap-ms") == 0)
      gap_ms = v;
    else if (strcmp(argv[i], "--seconds") == 0)
      seconds = v;
  }
  if (argc % 2 == 0 || slots < 1 || n_idle < 0 || n_slow < 0 || gap_ms < 1 ||
      seconds < 1 || n_idle + n_slow > 60000) {
    fprintf(stderr, "usage: bench_proxy_flood [--slots N] [--idle N] [--slow "
                    "N] [--gap-ms MS] [--seconds S]\n");
    return 2;
  }
  struct rlimit rl;
  getrlimit(RLIMIT_NOFILE, &rl);
  rl.rlim_cur = rl.rlim_max;
  setrlimit(RLIMIT_NOFILE, &rl);
  if (rl.rlim_cur < (rlim_t)(2 * (n_idle + n_slow) + 4 * slots + 512)) {
    fprintf(stderr, "bench_proxy_flood: RLIMIT_NOFILE %llu is too small\n",
            (unsigned long long)rl.rlim_cur);
    return 1;
  }
  curl_global_init(CURL_GLOBAL_DEFAULT);
  struct MHD_Daemon *d =
      MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL, 0, NULL,
                       NULL, up_handler, NULL, MHD_OPTION_EXTERNAL_LOGGER,
                       quiet, NULL, MHD_OPTION_END);
  if (d == NULL) {
    fprintf(stderr, "bench_proxy_flood: cannot start the upstream\n");
    return 1;
  }
  char up[64];
  snprintf(up, sizeof up, "http://127.0.0.1:%u",
           (unsigned)MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT)->port);
  ag_proxy_opts o;
  ag_proxy_opts_init(&o);
  o.port = 0;
  o.upstream = up;
  o.max_connections = slots;
  ag_proxy *p = NULL;
  ag_error_t err;
  if (ag_proxy_start(&p, &o, &err) != AG_OK) {
    fprintf(stderr, "bench_proxy_flood: %s\n", err.msg);
    return 1;
  }
  unsigned port = ag_proxy_port(p);
  int n = n_idle + n_slow;
  struct pollfd *fds = calloc((size_t)n, sizeof *fds);
  double *next = calloc((size_t)n, sizeof *next);
  char *begun = calloc((size_t)n, 1); /* the request line is out */
  long closed = 0;
  for (int i = 0; i < n; i++) {
    fds[i].fd = connect_to(port);
    fds[i].events = POLLIN;
    next[i] = i >= n_idle ? now_ms() : 0;
  }
  const char *line = "GET /v1/models HTTP/1.1\r\nHost: flood\r\n";
  int legit_max = seconds * 10 + 1;
  double *took = calloc((size_t)legit_max, sizeof *took);
  int served = 0, asked = 0;
  double t_end = now_ms() + seconds * 1000.0, t_next_legit = now_ms() + 500;
  char url[128];
  snprintf(url, sizeof url, "http://127.0.0.1:%u/v1/models", port);
  while (now_ms() < t_end) {
    poll(fds, (nfds_t)n, 20);
    double t = now_ms();
    for (int i = 0; i < n; i++) {
      if (fds[i].fd >= 0 && (fds[i].revents & (POLLIN | POLLHUP | POLLERR))) {
        char b[512];
        ssize_t r = recv(fds[i].fd, b, sizeof b, MSG_DONTWAIT);
        if (r <= 0 && !(r < 0 && errno == EAGAIN)) {
          close(fds[i].fd); /* closed (or refused) by the proxy: again */
          closed++;
          fds[i].fd = connect_to(port);
          next[i] = i >= n_idle ? t : 0;
          begun[i] = 0;
        }
      }
      if (i >= n_idle && fds[i].fd >= 0 && t >= next[i]) {
        /* the request line first, then one header byte each gap */
        const char *what = begun[i] ? "X" : line;
        ssize_t w = send(fds[i].fd, what, strlen(what), MSG_NOSIGNAL);
        if (w < 0 && errno != EAGAIN && errno != ENOTCONN) {
          close(fds[i].fd);
          closed++;
          fds[i].fd = connect_to(port);
          begun[i] = 0;
        } else if (w > 0) {
          begun[i] = 1;
        }
        next[i] = t + gap_ms;
      }
    }
    if (t >= t_next_legit && asked < legit_max) {
      t_next_legit = t + 100;
      CURL *h = curl_easy_init();
      curl_easy_setopt(h, CURLOPT_URL, url);
      curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, discard);
      curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 10000L);
      double t0 = now_ms();
      CURLcode cc = curl_easy_perform(h);
      long status = 0;
      curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
      curl_easy_cleanup(h);
      took[asked++] = now_ms() - t0;
      if (cc == CURLE_OK && status == 200)
        served++;
    }
  }
  qsort(took, (size_t)asked, sizeof *took, cmp_double);
  printf("bench_proxy_flood: --max-connections %d, %d idle + %d slowloris "
         "(a byte every %d ms), %d s\n",
         slots, n_idle, n_slow, gap_ms, seconds);
  printf("legitimate requests: %d of %d served; time p50 %.1f ms, p99 %.1f "
         "ms, max %.1f ms\n",
         served, asked, asked ? took[asked / 2] : 0.0,
         asked ? took[(asked * 99) / 100] : 0.0, asked ? took[asked - 1] : 0.0);
  printf("flood connections closed or refused by the proxy: %ld\n", closed);
  for (int i = 0; i < n; i++)
    if (fds[i].fd >= 0)
      close(fds[i].fd);
  ag_proxy_stop(p);
  MHD_stop_daemon(d);
  free(fds);
  free(next);
  free(begun);
  free(took);
  curl_global_cleanup();
  return 0;
}
