/*
 * bench_proxy_load.c - many concurrent streaming requests through the proxy
 * (docs/benchmarks.md, docs/proxy.md). In one process:
 *   - a fake upstream (libmicrohttpd on one epoll thread; a stream waiting
 *     for its next chunk is suspended and resumed by a timer thread) that
 *     answers every POST /v1/chat/completions with a streamed Chat
 *     Completions reply: CHUNKS text deltas, GAP_MS apart, then a final
 *     chunk and [DONE];
 *   - the proxy (ag_proxy_start, loopback, an ephemeral port, the default
 *     preset, --max-connections above the stream count) in front of it;
 *   - one client thread driving STREAMS concurrent streaming requests with
 *     libcurl's multi interface (curl_multi_socket_action over epoll):
 *     first all of them directly against the upstream (the baseline), then
 *     all of them through the proxy.
 * The upstream and the client are event-driven so that, on a small
 * machine, the proxy is not measured waiting for the CPU behind them.
 * Per request: the time to the first byte and the total time; per text
 * chunk (each carries the upstream's write time): its delivery time, from
 * the upstream's write to the client's read - 60,000 samples a side at
 * the figure, the latency a streaming client sees on each token.
 * Printed: the failures (a transfer error, a status other than 200 or a
 * stream without its [DONE]: should be 0), the p50/p99 of both sides and
 * the latency the proxy adds (proxy's percentile minus the direct one),
 * the peak number of streams open at the upstream at once, the TCP
 * connections the proxy made to the upstream (it keeps them for the next
 * requests), how busy the machine's CPUs were during each side (every
 * process, from /proc/stat, with the share the hypervisor stole: the
 * client and upstream here share the cores with the proxy, and a busy
 * machine makes every side wait for a CPU), and the memory per open connection
 * (the process's peak RSS during the proxied run minus its peak during the
 * direct run, over STREAMS). Figures only: it never fails on speed; it exits 1
 * when something is broken (setup, or failures > 0).
 *
 * Arrivals: all at once (an instant burst, the default), or with
 * --ramp-ms MS spread evenly over MS (request i starts at i * MS / N):
 * with MS about the stream's length, the streams overlap so that nearly N
 * are open at once (the peak is printed), as when real model streams that
 * last seconds arrive over time. Both sides are run the same way: the
 * direct streams first, then the proxied ones; with --together both at
 * the same time (their requests alternating), so that both sides see the
 * same moments of a shared machine (2N streams: the machine's load
 * doubles; no memory figure). With --warm, the whole run is made once,
 * untimed, before the measured one: the proxy as it is once its threads'
 * heaps have grown, as in a proxy that has been serving for a while (no
 * memory figure). With --observe, the proxy runs as an operator runs
 * it: decision events and a JSON access log (to /dev/null) and OTLP
 * traces (posted to the fake upstream, as the collector), so that the
 * cost of attribution, logging and tracing shows in the figures.
 *
 *   build/bench_proxy_load [--streams N] [--chunks N] [--gap-ms MS]
 *                          [--ramp-ms MS] [--together] [--warm] [--observe]
 *   (defaults 200 streams, 20 chunks, 10 ms, ramp 0; the figure:
 *   1000 streams)
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <microhttpd.h>

#include "agentguard.h"
#include "agentguard/proxy.h"

#define STREAMS_MAX 10000

static int chunks = 20;
static int gap_ms = 10;
static int ramp_ms = 0;
static bool together = false;
static bool warm_first = false;
static bool observe = false;  /* --observe: events, access log, traces */
static atomic_int up_exports; /* OTLP posts the fake collector took */
static atomic_int up_open, up_peak;
static atomic_int up_conns; /* TCP connections the upstream accepted */

typedef struct up_conn {
  struct MHD_Connection *mc;
  int sent;       /* chunks sent so far */
  int64_t due_us; /* when the next chunk is due (CLOCK_MONOTONIC) */
  char pending[512];
  size_t plen, poff;
} up_conn;

static int64_t now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* The upstream's waiting streams: a connection whose next chunk is not due
 * yet is suspended and listed here; the timer thread resumes it when it
 * is. (The upstream used to sleep in a thread per connection: a thousand
 * threads waking 20,000 times a second on the same two cores as the proxy,
 * which then waited behind them for the CPU.) */
static struct {
  pthread_mutex_t mu;
  up_conn *list[2 * STREAMS_MAX + 16];
  int n;
  atomic_bool quit;
  pthread_t thread;
} W = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void *timer_main(void *arg) {
  (void)arg;
  pthread_setname_np(pthread_self(), "up-timer");
  while (!atomic_load(&W.quit)) {
    int64_t now = now_us();
    pthread_mutex_lock(&W.mu);
    for (int i = 0; i < W.n;) {
      if (W.list[i]->due_us <= now) {
        MHD_resume_connection(W.list[i]->mc);
        W.list[i] = W.list[--W.n];
      } else {
        i++;
      }
    }
    pthread_mutex_unlock(&W.mu);
    struct timespec ts = {0, 500000}; /* 0.5 ms: the resolution */
    nanosleep(&ts, NULL);
  }
  return NULL;
}

/* Fills the connection's next SSE event; 0 when the stream is over. */
static int next_event(up_conn *c) {
  if (c->sent < chunks) {
    c->plen = (size_t)snprintf(
        c->pending, sizeof c->pending,
        "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\","
        "\"created\":1,\"model\":\"fake\",\"choices\":[{\"index\":0,"
        "\"delta\":{\"content\":\"t%lld \"},\"finish_reason\":null}]}\n\n",
        (long long)now_us());
  } else if (c->sent == chunks) {
    c->plen = (size_t)snprintf(
        c->pending, sizeof c->pending,
        "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\","
        "\"created\":1,\"model\":\"fake\",\"choices\":[{\"index\":0,"
        "\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n");
  } else {
    return 0;
  }
  c->sent++;
  c->poff = 0;
  return 1;
}

static ssize_t up_reader(void *cls, uint64_t pos, char *buf, size_t max) {
  (void)pos;
  up_conn *c = cls;
  if (c->poff == c->plen) {
    /* the first chunk at once, then one every gap_ms (text chunks only:
     * the final chunk follows the last text at once) */
    if (c->sent > 0 && c->sent < chunks && now_us() < c->due_us) {
      pthread_mutex_lock(&W.mu);
      W.list[W.n++] = c;
      MHD_suspend_connection(c->mc);
      pthread_mutex_unlock(&W.mu);
      return 0;
    }
    if (!next_event(c))
      return MHD_CONTENT_READER_END_OF_STREAM;
    c->due_us = (c->sent == 1 ? now_us() : c->due_us) + gap_ms * 1000;
  }
  size_t n = c->plen - c->poff;
  if (n > max)
    n = max;
  memcpy(buf, c->pending + c->poff, n);
  c->poff += n;
  return (ssize_t)n;
}

static void up_conn_started(void *cls, struct MHD_Connection *c,
                            void **socket_ctx,
                            enum MHD_ConnectionNotificationCode code) {
  (void)cls, (void)c, (void)socket_ctx;
  if (code == MHD_CONNECTION_NOTIFY_STARTED)
    atomic_fetch_add(&up_conns, 1);
}

static void up_free(void *cls) {
  free(cls);
  atomic_fetch_sub(&up_open, 1);
}

static enum MHD_Result up_handler(void *cls, struct MHD_Connection *conn,
                                  const char *url, const char *method,
                                  const char *version, const char *upload,
                                  size_t *upload_size, void **state) {
  (void)cls, (void)method, (void)version, (void)upload;
  if (*state == NULL) {
    *state = conn; /* the request's first call: headers only */
    return MHD_YES;
  }
  if (*upload_size > 0) { /* the body: read and ignored */
    *upload_size = 0;
    return MHD_YES;
  }
  if (strcmp(url, "/v1/traces") == 0) { /* --observe: the OTLP collector */
    atomic_fetch_add(&up_exports, 1);
    struct MHD_Response *ok = MHD_create_response_from_buffer(
        2, (void *)"{}", MHD_RESPMEM_PERSISTENT);
    if (ok == NULL)
      return MHD_NO;
    enum MHD_Result rc = MHD_queue_response(conn, 200, ok);
    MHD_destroy_response(ok);
    return rc;
  }
  up_conn *c = calloc(1, sizeof *c);
  if (c == NULL)
    return MHD_NO;
  c->mc = conn;
  int open = atomic_fetch_add(&up_open, 1) + 1;
  int peak = atomic_load(&up_peak);
  while (open > peak && !atomic_compare_exchange_weak(&up_peak, &peak, open)) {
  }
  struct MHD_Response *r = MHD_create_response_from_callback(
      MHD_SIZE_UNKNOWN, 1024, up_reader, c, up_free);
  if (r == NULL) {
    up_free(c);
    return MHD_NO;
  }
  MHD_add_response_header(r, "Content-Type", "text/event-stream");
  enum MHD_Result ret = MHD_queue_response(conn, MHD_HTTP_OK, r);
  MHD_destroy_response(r);
  return ret;
}

/* The chunks' delivery times of one side (ms from the upstream's write to
 * the client's read), preallocated for every chunk. */
typedef struct lat {
  const char *name; /* the side's */
  double *v;
  size_t n, cap;
} lat;

typedef struct req {
  CURL *h;
  char tail[16]; /* the body's last bytes: ends with "[DONE]\n\n" */
  size_t got;
  double ttfb_ms, total_ms;
  int ok;
  lat *lat;
  char line[512]; /* the body's current line, for its stamp */
  size_t line_len;
} req;

/* A line of the body: a text chunk's content is "t<the upstream's
 * now_us() when it wrote it> ". */
static void take_stamp(req *r, const char *line, size_t len, int64_t now) {
  static const char key[] = "\"content\":\"t";
  const char *k = memmem(line, len, key, sizeof key - 1);
  if (k == NULL || r->lat->n == r->lat->cap)
    return;
  long long t = strtoll(k + sizeof key - 1, NULL, 10);
  if (t > 0)
    r->lat->v[r->lat->n++] = (double)(now - t) / 1000.0;
}

static size_t on_body(char *p, size_t sz, size_t n, void *ud) {
  req *r = ud;
  size_t len = sz * n;
  r->got += len;
  int64_t now = now_us();
  for (size_t i = 0; i < len;) {
    const char *nl = memchr(p + i, '\n', len - i);
    size_t k = nl != NULL ? (size_t)(nl - (p + i)) : len - i;
    if (r->line_len + k < sizeof r->line) {
      memcpy(r->line + r->line_len, p + i, k);
      r->line_len += k;
    } else {
      r->line_len = sizeof r->line; /* too long: not a chunk of ours */
    }
    i += k;
    if (nl != NULL) {
      if (r->line_len < sizeof r->line)
        take_stamp(r, r->line, r->line_len, now);
      r->line_len = 0;
      i++;
    }
  }
  if (len >= sizeof r->tail - 1) {
    memcpy(r->tail, p + len - (sizeof r->tail - 1), sizeof r->tail - 1);
  } else {
    size_t keep = sizeof r->tail - 1 - len;
    memmove(r->tail, r->tail + len, keep);
    memcpy(r->tail + keep, p, len);
  }
  r->tail[sizeof r->tail - 1] = '\0';
  return len;
}

static long rss_kib(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  long pages = 0, res = 0;
  if (f == NULL)
    return 0;
  if (fscanf(f, "%ld %ld", &pages, &res) != 2)
    res = 0;
  fclose(f);
  return res * (sysconf(_SC_PAGESIZE) / 1024);
}

/* The process's CPU time (user + system, all threads), in seconds. */
static double cpu_s(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

/* The machine's CPU time so far, from /proc/stat's "cpu" line (every
 * core, every process, in clock ticks): all of it, busy (neither idle nor
 * waiting for I/O) and stolen by the hypervisor. Zeros when unreadable. */
typedef struct mstat {
  double total, busy, steal;
} mstat;

static mstat machine_stat(void) {
  mstat m = {0, 0, 0};
  FILE *f = fopen("/proc/stat", "r");
  if (f == NULL)
    return m;
  unsigned long long v[10] = {0};
  if (fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0],
             &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7], &v[8],
             &v[9]) >= 8) {
    /* user nice system idle iowait irq softirq steal (guest: in user) */
    for (int i = 0; i < 8; i++)
      m.total += (double)v[i];
    m.busy = m.total - (double)v[3] - (double)v[4];
    m.steal = (double)v[7];
  }
  fclose(f);
  return m;
}

/* "busy X% (steal Y%)" of the machine's CPUs between a and b. */
static void print_machine(const char *side, mstat a, mstat b) {
  double t = b.total - a.total;
  if (t <= 0)
    return;
  printf(" %s %.0f%% busy (steal %.1f%%)", side, 100.0 * (b.busy - a.busy) / t,
         100.0 * (b.steal - a.steal) / t);
}

/* Waits until the upstream has closed what the last side's client left
 * (its connection count still for 100 ms; at most 10 s), so that a side
 * does not start while the upstream is still tearing down the one before:
 * closing a thousand connections keeps its thread busy for tens of ms, and
 * the first requests of the next side waited for it (a bench artifact
 * that showed as 4-20 ms time to first byte at the proxied side's start). */
static void settle(struct MHD_Daemon *up) {
  unsigned last = UINT_MAX;
  int still = 0;
  for (int i = 0; i < 1000 && still < 10; i++) {
    const union MHD_DaemonInfo *di =
        MHD_get_daemon_info(up, MHD_DAEMON_INFO_CURRENT_CONNECTIONS);
    unsigned now = di != NULL ? di->num_connections : 0;
    still = now == last ? still + 1 : 0;
    last = now;
    struct timespec ts = {0, 10000000};
    nanosleep(&ts, NULL);
  }
}

static double mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static const char BODY[] =
    "{\"model\":\"fake\",\"stream\":true,\"messages\":[{\"role\":\"user\","
    "\"content\":\"Say twenty words.\"}]}";

/* The client's event loop: libcurl's sockets in an epoll set, its timer
 * as a deadline (curl_multi_socket_action). A load generator that polled
 * every transfer on each event (curl_multi_poll) spent most of the two
 * cores itself at a thousand streams, and read /proc on every wake. */
typedef struct client {
  int ep;
  double deadline; /* ms since t0 for libcurl's timer; < 0: none */
  double t0;
} client;

static int cl_socket(CURL *e, curl_socket_t s, int what, void *userp,
                     void *socketp) {
  (void)e;
  (void)socketp;
  client *c = userp;
  if (what == CURL_POLL_REMOVE) {
    epoll_ctl(c->ep, EPOLL_CTL_DEL, s, NULL);
    return 0;
  }
  struct epoll_event ev;
  memset(&ev, 0, sizeof ev);
  ev.events = (what & CURL_POLL_IN ? EPOLLIN : 0u) |
              (what & CURL_POLL_OUT ? EPOLLOUT : 0u);
  ev.data.fd = s;
  if (epoll_ctl(c->ep, EPOLL_CTL_MOD, s, &ev) != 0 && errno == ENOENT)
    epoll_ctl(c->ep, EPOLL_CTL_ADD, s, &ev);
  return 0;
}

static int cl_timer(CURLM *m, long timeout_ms, void *userp) {
  (void)m;
  client *c = userp;
  c->deadline = timeout_ms < 0 ? -1 : mono_ms() - c->t0 + (double)timeout_ms;
  return 0;
}

/* A finished request's figures. Returns 1 when it failed. */
static int take_done(CURLMsg *msg, int *shown) {
  req *r = NULL;
  curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&r);
  long status = 0;
  curl_off_t ttfb = 0, total = 0;
  curl_easy_getinfo(msg->easy_handle, CURLINFO_RESPONSE_CODE, &status);
  curl_easy_getinfo(msg->easy_handle, CURLINFO_STARTTRANSFER_TIME_T, &ttfb);
  curl_easy_getinfo(msg->easy_handle, CURLINFO_TOTAL_TIME_T, &total);
  r->ttfb_ms = (double)ttfb / 1000.0;
  r->total_ms = (double)total / 1000.0;
  r->ok = msg->data.result == CURLE_OK && status == 200 &&
          strstr(r->tail, "[DONE]") != NULL;
  if (!r->ok && (*shown)++ < 5)
    fprintf(stderr, "bench_proxy_load: %s: %s, status %ld, %zu bytes\n",
            r->lat->name, curl_easy_strerror(msg->data.result), status, r->got);
  return !r->ok;
}

/* One side of the comparison: where its requests go, their figures. */
typedef struct side {
  const char *base;
  req *rs;
  lat *lt;
} side;

/* Runs n concurrent streams against each of the ns sides at the same time
 * (all at once, or spread over ramp_ms, the sides' requests alternating);
 * fills their rs; returns the failures and sets *peak_rss to the highest
 * RSS seen while they ran (sampled every 20 ms). */
static int run_sides(const side *sd, int ns, int n, long *peak_rss) {
  int total = n * ns;
  CURL **hs = calloc((size_t)total, sizeof *hs);
  if (hs == NULL) {
    fprintf(stderr, "bench_proxy_load: out of memory\n");
    exit(1);
  }
  CURLM *m = curl_multi_init();
  client cl = {epoll_create1(EPOLL_CLOEXEC), -1, 0};
  if (cl.ep < 0) {
    perror("bench_proxy_load: epoll_create1");
    exit(1);
  }
  curl_multi_setopt(m, CURLMOPT_SOCKETFUNCTION, cl_socket);
  curl_multi_setopt(m, CURLMOPT_SOCKETDATA, &cl);
  curl_multi_setopt(m, CURLMOPT_TIMERFUNCTION, cl_timer);
  curl_multi_setopt(m, CURLMOPT_TIMERDATA, &cl);
  struct curl_slist *hdr =
      curl_slist_append(NULL, "Content-Type: application/json");
  hdr = curl_slist_append(hdr, "Authorization: Bearer sk-bench");
  curl_multi_setopt(m, CURLMOPT_MAXCONNECTS, (long)total);
  for (int j = 0; j < total; j++) {
    const side *d = &sd[j % ns];
    req *rs = d->rs;
    int i = j / ns;
    char url[128];
    snprintf(url, sizeof url, "%s/v1/chat/completions", d->base);
    memset(&rs[i], 0, sizeof rs[i]);
    rs[i].lat = d->lt;
    CURL *h = curl_easy_init();
    rs[i].h = h;
    hs[j] = h;
    curl_easy_setopt(h, CURLOPT_URL, url); /* copied by libcurl */
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, BODY);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &rs[i]);
    curl_easy_setopt(h, CURLOPT_PRIVATE, &rs[i]);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, 120L);
    curl_easy_setopt(h, CURLOPT_FRESH_CONNECT, 1L);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  }
  int running = 0, added = 0, done = 0, failures = 0, shown = 0;
  *peak_rss = rss_kib();
  cl.t0 = mono_ms();
  double next_rss = 0;
  struct epoll_event evs[256];
  while (done < total) {
    /* the requests due by now join the transfer */
    double now = mono_ms() - cl.t0;
    while (added < total &&
           (ramp_ms == 0 || (double)added * ramp_ms / total <= now))
      curl_multi_add_handle(m, hs[added++]);
    if (now >= next_rss) {
      long r = rss_kib();
      if (r > *peak_rss)
        *peak_rss = r;
      next_rss = now + 20;
    }
    double until = next_rss;
    if (added < total && (double)added * ramp_ms / total < until)
      until = (double)added * ramp_ms / total;
    if (cl.deadline >= 0 && cl.deadline < until)
      until = cl.deadline;
    double w = until - (mono_ms() - cl.t0);
    int k = epoll_wait(cl.ep, evs, 256, w <= 0 ? 0 : (int)w + 1);
    for (int i = 0; i < k; i++) {
      int flags =
          (evs[i].events & EPOLLIN ? CURL_CSELECT_IN : 0) |
          (evs[i].events & EPOLLOUT ? CURL_CSELECT_OUT : 0) |
          (evs[i].events & (EPOLLERR | EPOLLHUP) ? CURL_CSELECT_ERR : 0);
      curl_multi_socket_action(m, evs[i].data.fd, flags, &running);
    }
    if (cl.deadline >= 0 && mono_ms() - cl.t0 >= cl.deadline) {
      cl.deadline = -1;
      curl_multi_socket_action(m, CURL_SOCKET_TIMEOUT, 0, &running);
    }
    CURLMsg *msg;
    int left;
    while ((msg = curl_multi_info_read(m, &left)) != NULL) {
      if (msg->msg != CURLMSG_DONE)
        continue;
      failures += take_done(msg, &shown);
      curl_multi_remove_handle(m, msg->easy_handle);
      done++;
    }
  }
  for (int j = 0; j < total; j++)
    curl_easy_cleanup(hs[j]);
  free(hs);
  curl_slist_free_all(hdr);
  curl_multi_cleanup(m);
  close(cl.ep);
  return failures;
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The q-th percentile (nearest rank) of v[0..n), sorted. */
static double pct_of(const double *v, size_t n, double q) {
  if (n == 0)
    return 0;
  size_t idx = (size_t)(q / 100.0 * (double)n + 0.999999);
  return v[idx == 0 ? 0 : (idx > n ? n - 1 : idx - 1)];
}

/* The q-th percentile (nearest rank) of the ok requests' field. */
static double pct(const req *rs, int n, int total_field, double q) {
  double *v = malloc((size_t)n * sizeof *v);
  if (v == NULL) {
    fprintf(stderr, "bench_proxy_load: out of memory\n");
    exit(1);
  }
  int k = 0;
  for (int i = 0; i < n; i++)
    if (rs[i].ok)
      v[k++] = total_field ? rs[i].total_ms : rs[i].ttfb_ms;
  qsort(v, (size_t)k, sizeof *v, cmp_d);
  double out = pct_of(v, (size_t)k, q);
  free(v);
  return out;
}

static int parse_int(const char *name, const char *s, int lo, int hi) {
  char *end = NULL;
  long v = strtol(s, &end, 10);
  if (end == s || *end != '\0' || v < lo || v > hi) {
    fprintf(stderr,
            "bench_proxy_load: %s %s: expected a number from %d to %d\n", name,
            s, lo, hi);
    exit(2);
  }
  return (int)v;
}

int main(int argc, char **argv) {
  int n = 200;
  for (int i = 1; i < argc; i++) {
    if (i + 1 < argc && strcmp(argv[i], "--streams") == 0)
      n = parse_int("--streams", argv[++i], 1, STREAMS_MAX);
    else if (i + 1 < argc && strcmp(argv[i], "--chunks") == 0)
      chunks = parse_int("--chunks", argv[++i], 1, 1000);
    else if (i + 1 < argc && strcmp(argv[i], "--gap-ms") == 0)
      gap_ms = parse_int("--gap-ms", argv[++i], 0, 1000);
    else if (i + 1 < argc && strcmp(argv[i], "--ramp-ms") == 0)
      ramp_ms = parse_int("--ramp-ms", argv[++i], 0, 600000);
    else if (strcmp(argv[i], "--together") == 0)
      together = true;
    else if (strcmp(argv[i], "--warm") == 0)
      warm_first = true;
    else if (strcmp(argv[i], "--observe") == 0)
      observe = true;
    else {
      fprintf(stderr,
              "usage: bench_proxy_load [--streams N] [--chunks N] "
              "[--gap-ms MS] [--ramp-ms MS] [--together] [--warm] "
              "[--observe]\n(unknown or "
              "incomplete "
              "argument '%s')\n",
              argv[i]);
      return 2;
    }
  }
  /* Per stream: the client's socket, the proxy's two, the upstream's one,
   * plus the proxy's and curl's own. */
  struct rlimit rl;
  rlim_t want = (rlim_t)n * 5 + 256;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < want) {
    rl.rlim_cur =
        rl.rlim_max == RLIM_INFINITY || rl.rlim_max > want ? want : rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    if (rl.rlim_cur < want)
      fprintf(stderr,
              "bench_proxy_load: warning: only %lu descriptors (hard limit), "
              "%lu wanted\n",
              (unsigned long)rl.rlim_cur, (unsigned long)want);
  }
  signal(SIGPIPE, SIG_IGN);
  curl_global_init(CURL_GLOBAL_DEFAULT);

  struct MHD_Daemon *up = MHD_start_daemon(
      MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL |
          MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG,
      0, NULL, NULL, up_handler, NULL, MHD_OPTION_CONNECTION_LIMIT,
      (unsigned)(2 * n + 16), MHD_OPTION_NOTIFY_CONNECTION, up_conn_started,
      NULL, MHD_OPTION_LISTEN_BACKLOG_SIZE, (unsigned)(n + 16), MHD_OPTION_END);
  if (up == NULL || pthread_create(&W.thread, NULL, timer_main, NULL) != 0) {
    fprintf(stderr, "bench_proxy_load: the fake upstream did not start\n");
    return 1;
  }
  char up_base[64], px_base[64];
  snprintf(up_base, sizeof up_base, "http://127.0.0.1:%u",
           (unsigned)MHD_get_daemon_info(up, MHD_DAEMON_INFO_BIND_PORT)->port);

  ag_proxy_opts o;
  ag_proxy_opts_init(&o);
  o.port = 0;
  o.upstream = up_base;
  o.max_connections = n + 64;
  /* --observe: everything an operator turns on - the decision events and
   * the access log (to /dev/null: the writes, not a disk, are measured)
   * and the traces, posted to the fake upstream as the collector */
  FILE *sink = observe ? fopen("/dev/null", "w") : NULL;
  char traces[96];
  snprintf(traces, sizeof traces, "%s/v1/traces", up_base);
  if (observe) {
    o.events = sink;
    o.access_log = sink;
    o.access_log_json = true;
    o.otlp_traces_url = traces;
  }
  ag_proxy *p = NULL;
  ag_error_t err;
  if (ag_proxy_start(&p, &o, &err) != AG_OK) {
    fprintf(stderr, "bench_proxy_load: ag_proxy_start: %s\n", err.msg);
    atomic_store(&W.quit, true);
    pthread_join(W.thread, NULL);
    MHD_stop_daemon(up);
    return 1;
  }
  snprintf(px_base, sizeof px_base, "http://127.0.0.1:%u",
           (unsigned)ag_proxy_port(p));

  req *direct = calloc((size_t)n, sizeof *direct);
  req *proxied = calloc((size_t)n, sizeof *proxied);
  if (direct == NULL || proxied == NULL) {
    fprintf(stderr, "bench_proxy_load: out of memory\n");
    return 1;
  }
  double load[3] = {0, 0, 0};
  getloadavg(load, 3);
  printf("proxy_load: %d concurrent streams, each %d chunks %d ms apart "
         "(upstream's own time ~%d ms), arriving %s%d ms; %s; load average "
         "%.2f %.2f %.2f\n",
         n, chunks, gap_ms, (chunks - 1) * gap_ms,
         ramp_ms > 0 ? "evenly over " : "at once (burst) ", ramp_ms,
         together ? "direct and proxied streams at the same time"
                  : "direct streams first, then proxied ones",
         load[0], load[1], load[2]);

  /* A short warm-up of both paths (first-use costs out of the figures). */
  long warm_rss = 0;
  req warm[8];
  int ramp = ramp_ms;
  ramp_ms = 0;
  lat lw = {"warm-up", calloc((size_t)8 * chunks, sizeof(double)), 0,
            (size_t)8 * chunks};
  lat ld = {"direct", calloc((size_t)n * chunks, sizeof(double)), 0,
            (size_t)n * chunks};
  lat lp = {"proxy", calloc((size_t)n * chunks, sizeof(double)), 0,
            (size_t)n * chunks};
  if (lw.v == NULL || ld.v == NULL || lp.v == NULL) {
    fprintf(stderr, "bench_proxy_load: out of memory\n");
    return 1;
  }
  side wu[2] = {{up_base, warm, &lw}, {px_base, warm + 4, &lw}};
  run_sides(&wu[0], 1, 4, &warm_rss);
  run_sides(&wu[1], 1, 4, &warm_rss);
  ramp_ms = ramp;
  settle(up);

  side sd = {up_base, direct, &ld}, sp = {px_base, proxied, &lp};
  if (warm_first) {
    /* the whole run once, untimed: the proxy as it is after its first
     * thousand streams (its threads' heaps grown), not fresh */
    long unused = 0;
    run_sides(&sd, 1, n, &unused);
    settle(up);
    run_sides(&sp, 1, n, &unused);
    settle(up);
    ld.n = lp.n = 0;
  }
  long base_rss = rss_kib(), direct_rss = 0, proxy_rss = 0;
  int f_direct = 0, f_proxy = 0, peak_direct = 0, peak_proxy = 0;
  int proxy_conns = -1;
  double c0 = 0, c1 = 0, c2 = 0;
  mstat m0 = machine_stat(), m1 = m0, m2 = m0;
  if (together) {
    /* both sides at once: each sees the same moments of the machine */
    side both[2] = {sd, sp};
    atomic_store(&up_peak, 0);
    c0 = cpu_s();
    f_proxy = run_sides(both, 2, n, &proxy_rss);
    c1 = c2 = cpu_s();
    m1 = m2 = machine_stat();
    peak_direct = peak_proxy = atomic_load(&up_peak);
    for (int i = 0; i < n; i++)
      f_direct += !direct[i].ok;
    f_proxy -= f_direct;
  } else {
    atomic_store(&up_peak, 0);
    c0 = cpu_s();
    f_direct = run_sides(&sd, 1, n, &direct_rss);
    peak_direct = atomic_load(&up_peak);
    settle(up);
    atomic_store(&up_peak, 0);
    c1 = cpu_s();
    m1 = machine_stat();
    int k0 = atomic_load(&up_conns);
    f_proxy = run_sides(&sp, 1, n, &proxy_rss);
    proxy_conns = atomic_load(&up_conns) - k0;
    peak_proxy = atomic_load(&up_peak);
    c2 = cpu_s();
    m2 = machine_stat();
  }
  getloadavg(load, 3);

  printf("failures: direct %d, proxy %d (of %d each)\n", f_direct, f_proxy, n);
  if (together) {
    printf("streams open at the upstream at once (peak, both sides): %d\n",
           peak_direct);
    printf("CPU seconds used by the process (client, upstream and proxy "
           "threads, both sides): %.2f\n",
           c1 - c0);
  } else {
    printf("streams open at the upstream at once (peak): direct %d, proxy "
           "%d\n",
           peak_direct, peak_proxy);
    printf("connections the proxy made to the upstream: %d (for %d "
           "requests)\n",
           proxy_conns, n);
    printf("CPU seconds used by the process (client, upstream and proxy "
           "threads): direct %.2f, proxy %.2f\n",
           c1 - c0, c2 - c1);
  }
  printf("the machine's %ld CPUs (every process) during the run:",
         sysconf(_SC_NPROCESSORS_ONLN));
  if (together) {
    print_machine("both sides", m0, m1);
  } else {
    print_machine("direct", m0, m1);
    printf(",");
    print_machine("proxy", m1, m2);
  }
  printf("\n");
  printf("%-22s %10s %10s %10s %10s\n", "ms", "p50", "p99", "max", "");
  const char *names[2] = {"time to first byte", "total"};
  for (int t = 0; t < 2; t++) {
    double d50 = pct(direct, n, t, 50), d99 = pct(direct, n, t, 99);
    double dmx = pct(direct, n, t, 100);
    double p50 = pct(proxied, n, t, 50), p99 = pct(proxied, n, t, 99);
    double pmx = pct(proxied, n, t, 100);
    printf("%-22s %10.2f %10.2f %10.2f   direct\n", names[t], d50, d99, dmx);
    printf("%-22s %10.2f %10.2f %10.2f   proxy\n", names[t], p50, p99, pmx);
    printf("%-22s %10.2f %10.2f %10s   added (proxy - direct)\n", names[t],
           p50 - d50, p99 - d99, "");
    printf("proxy_added_%s_ms p50=%.2f p99=%.2f\n", t ? "total" : "ttfb",
           p50 - d50, p99 - d99);
  }
  /* every text chunk's delivery: the latency a streaming client sees on
   * each token, tens of thousands of samples a side */
  qsort(ld.v, ld.n, sizeof *ld.v, cmp_d);
  qsort(lp.v, lp.n, sizeof *lp.v, cmp_d);
  printf("%-22s %10s %10s %10s %10s\n", "chunk delivery, ms", "p50", "p99",
         "p99.9", "max");
  const double qs[4] = {50, 99, 99.9, 100};
  double dq[4] = {0}, pq[4] = {0};
  for (int k = 0; k < 4; k++) {
    dq[k] = pct_of(ld.v, ld.n, qs[k]);
    pq[k] = pct_of(lp.v, lp.n, qs[k]);
  }
  printf("%-22s %10.2f %10.2f %10.2f %10.2f   direct (%zu chunks)\n", "", dq[0],
         dq[1], dq[2], dq[3], ld.n);
  printf("%-22s %10.2f %10.2f %10.2f %10.2f   proxy (%zu chunks)\n", "", pq[0],
         pq[1], pq[2], pq[3], lp.n);
  printf("%-22s %10.2f %10.2f %10.2f %10s   added (proxy - direct)\n", "",
         pq[0] - dq[0], pq[1] - dq[1], pq[2] - dq[2], "");
  printf("proxy_added_chunk_ms p50=%.2f p99=%.2f p99.9=%.2f\n", pq[0] - dq[0],
         pq[1] - dq[1], pq[2] - dq[2]);
  if (together || warm_first) {
    printf("RSS KiB: before %ld, peak %ld (memory per connection: run "
           "without --together or --warm)\n",
           base_rss, proxy_rss);
  } else {
    printf("RSS KiB: before %ld, peak direct %ld, peak proxy %ld\n", base_rss,
           direct_rss, proxy_rss);
    printf("proxy memory per open connection: %.1f KiB ((peak proxy - peak "
           "direct) / %d)\n",
           (double)(proxy_rss - direct_rss) / n, n);
  }
  printf("load average after: %.2f %.2f %.2f\n", load[0], load[1], load[2]);

  ag_proxy_stop(p);
  if (observe) {
    printf("observe: events, access log (JSON) and OTLP traces on; the "
           "collector took %d exports\n",
           atomic_load(&up_exports));
    fclose(sink);
  }
  atomic_store(&W.quit, true);
  pthread_join(W.thread, NULL);
  MHD_stop_daemon(up);
  free(direct);
  free(proxied);
  free(lw.v);
  free(ld.v);
  free(lp.v);
  curl_global_cleanup();
  if (f_direct + f_proxy > 0) {
    fprintf(stderr, "bench_proxy_load: %d failed requests\n",
            f_direct + f_proxy);
    return 1;
  }
  return 0;
}
