/*
 * src/proxy/upstream.c - the upstream (internal.h): the URL built from
 * parts, libcurl transfers set up and run on a loop's relay, bodies held
 * under the budget, a waiting client watched.
 */
#define _GNU_SOURCE /* memmem */
#include "internal.h"

/* ------------------------------------------------------------------------ */
/* The upstream (libcurl)                                                   */
/* ------------------------------------------------------------------------ */

static const char *const hop_by_hop[] = {"connection",
                                         "keep-alive",
                                         "proxy-authenticate",
                                         "proxy-authorization",
                                         "proxy-connection",
                                         "te",
                                         "trailer",
                                         "transfer-encoding",
                                         "upgrade",
                                         "host",
                                         "content-length",
                                         "expect",
                                         "accept-encoding",
                                         "x-agentguard-key",
                                         "x-agentguard-session"};

static bool is_hop(const char *name, size_t n) {
  for (size_t i = 0; i < sizeof(hop_by_hop) / sizeof(hop_by_hop[0]); i++)
    if (strlen(hop_by_hop[i]) == n && strncasecmp(name, hop_by_hop[i], n) == 0)
      return true;
  return false;
}

size_t ag__px_on_body(char *ptr, size_t size, size_t nmemb, void *user) {
  upstream *u = user;
  size_t n = size * nmemb;
  if (u->len + n > AG_PROXY_UPSTREAM_MAX) {
    u->too_big = true;
    return 0; /* ends the transfer */
  }
  size_t need = u->len + n + 1;
  if (u->bud != NULL && need > u->held) {
    size_t want =
        (need + BUDGET_STEP - 1) / BUDGET_STEP * BUDGET_STEP - u->held;
    if (!ag__budget_try(u->bud, want, u->held)) {
      if (u->sync == NULL && u->budget_short != NULL) {
        u->want = want; /* paused until budget_short's thread has them */
        if (u->budget_short(u))
          return CURL_WRITEFUNC_PAUSE;
        u->no_budget = true;
        return 0;
      }
      if (u->sync == NULL) {
        u->no_budget = true;
        return 0;
      }
      /* paused: libcurl hands the same bytes again after the unpause */
      pthread_mutex_lock(&u->sync->mu);
      u->want = want;
      pthread_cond_signal(&u->sync->cv);
      pthread_mutex_unlock(&u->sync->mu);
      return CURL_WRITEFUNC_PAUSE;
    }
    u->held += want;
  }
  if (u->len + n + 1 > u->cap) {
    size_t cap = u->cap ? u->cap : 4096;
    while (cap < u->len + n + 1)
      cap *= 2;
    char *g = realloc(u->body, cap);
    if (g == NULL)
      return 0;
    u->body = g;
    u->cap = cap;
  }
  memcpy(u->body + u->len, ptr, n);
  u->len += n;
  u->body[u->len] = '\0';
  return n;
}

size_t ag__px_on_header(char *ptr, size_t size, size_t nmemb, void *user) {
  upstream *u = user;
  size_t n = size * nmemb;
  if (n >= 5 && memcmp(ptr, "HTTP/", 5) == 0) {
    /* a new response (after a 100 Continue): its headers only */
    ag__buf_reset(&u->headers);
    u->hdr_end = false;
    return n;
  }
  if (n <= 2 && (n == 0 || ptr[0] == '\r' || ptr[0] == '\n')) {
    u->hdr_end = true;
    return n;
  }
  const char *colon = memchr(ptr, ':', n);
  if (colon == NULL || is_hop(ptr, (size_t)(colon - ptr)))
    return n;
  size_t l = n;
  while (l > 0 && (ptr[l - 1] == '\r' || ptr[l - 1] == '\n'))
    l--;
  if (l >= 8192 || memchr(ptr, '\0', l) != NULL)
    return n;                /* an absurd header is dropped, not truncated */
  if (u->headers.cap == 0) { /* the first: room for a usual set at once */
    ag__buf_init(&u->headers, UP_HEADERS_MAX);
    (void)ag__buf_reserve(&u->headers, 512);
  }
  /* the line and its NUL whole, or not at all (past UP_HEADERS_MAX, or
   * out of memory): with the room reserved, neither append can fail */
  if (l + 1 <= u->headers.cap - u->headers.len &&
      ag__buf_reserve(&u->headers, u->headers.len + l + 1) == AG_OK) {
    (void)ag__buf_add(&u->headers, ptr, l);
    (void)ag__buf_add(&u->headers, "", 1);
  }
  return n;
}

/* ---- Header lists in one block ---------------------------------------- */

/*
 * A header list for libcurl (CURLOPT_HTTPHEADER reads a chain of struct
 * curl_slist, which curl.h defines) made in one allocation: the nodes, then
 * their NUL-terminated lines. curl_slist_append makes a node and a copy of
 * its line a header, and a request's list was made twice (the client's
 * headers, then the upstream's): about 15 of the 90 allocations of a
 * proxied request. A producer is run twice, to count and to fill; the
 * second run is held to the first's size.
 */
typedef struct hdrs_make {
  struct curl_slist *node; /* the next node to fill; NULL while counting */
  char *text;              /* where its line goes */
  size_t lines, bytes;     /* so far */
  size_t cap_lines, cap_bytes;
  bool over; /* the filling run produced more than the counting one */
} hdrs_make;

/* One line: `k`, or `k` ": " `v` when v is not NULL. */
static void hm_add(hdrs_make *m, const char *k, size_t kn, const char *v,
                   size_t vn) {
  size_t n = kn + (v != NULL ? 2 + vn : 0) + 1;
  if (m->node != NULL) {
    if (m->lines + 1 > m->cap_lines || n > m->cap_bytes - m->bytes) {
      m->over = true;
      return;
    }
    char *t = m->text;
    memcpy(t, k, kn);
    if (v != NULL) {
      memcpy(t + kn, ": ", 2);
      memcpy(t + kn + 2, v, vn);
    }
    t[n - 1] = '\0';
    m->node->data = t;
    m->node->next = m->node + 1;
    m->node++;
    m->text += n;
  }
  m->lines++;
  m->bytes += n;
}

typedef void (*hdrs_fn)(hdrs_make *m, const void *arg);

/* The list `fn` produces; NULL when it is empty, or with *failed set when
 * out of memory (or when the two runs differ). Freed with ag__px_hdrs_free. */
static struct curl_slist *hdrs_build(hdrs_fn fn, const void *arg,
                                     bool *failed) {
  hdrs_make m = {0};
  fn(&m, arg);
  if (m.lines == 0)
    return NULL;
  struct curl_slist *block = m.lines <= (SIZE_MAX - m.bytes) / sizeof(*block)
                                 ? malloc(m.lines * sizeof(*block) + m.bytes)
                                 : NULL;
  if (block == NULL) {
    *failed = true;
    return NULL;
  }
  m = (hdrs_make){block, (char *)(block + m.lines), 0, 0, m.lines, m.bytes,
                  false};
  fn(&m, arg);
  if (m.over || m.lines == 0) {
    free(block);
    *failed = m.over;
    return NULL;
  }
  block[m.lines - 1].next = NULL;
  return block;
}

void ag__px_hdrs_free(struct curl_slist *list) {
  free(list);
}

static enum MHD_Result collect_header(void *cls, enum MHD_ValueKind kind,
                                      const char *key, const char *value) {
  (void)kind;
  size_t kn = key != NULL ? strlen(key) : 0;
  if (key == NULL || is_hop(key, kn))
    return MHD_YES;
  if (value == NULL)
    value = "";
  hm_add(cls, key, kn, value, strlen(value));
  return MHD_YES;
}

static void client_lines(hdrs_make *m, const void *arg) {
  MHD_get_connection_values((struct MHD_Connection *)arg, MHD_HEADER_KIND,
                            collect_header, m);
}

/* The client's headers, hop-by-hop ones removed; false when out of
 * memory. Read once, on the connection's thread. */
bool ag__px_client_headers(struct MHD_Connection *c, struct curl_slist **out) {
  bool failed = false;
  *out = hdrs_build(client_lines, c, &failed);
  return !failed;
}

typedef struct copy_spec {
  const struct curl_slist *src;
  const char *skip; /* lines that start with it (any case) are left out */
  const char *extra[2];
} copy_spec;

static void copy_lines(hdrs_make *m, const void *arg) {
  const copy_spec *c = arg;
  size_t sn = c->skip != NULL ? strlen(c->skip) : 0;
  for (const struct curl_slist *s = c->src; s != NULL; s = s->next)
    if (sn == 0 || strncasecmp(s->data, c->skip, sn) != 0)
      hm_add(m, s->data, strlen(s->data), NULL, 0);
  for (int i = 0; i < 2; i++)
    if (c->extra[i] != NULL)
      hm_add(m, c->extra[i], strlen(c->extra[i]), NULL, 0);
}

struct curl_slist *ag__px_hdrs_copy(const struct curl_slist *src,
                                    const char *skip, const char *extra1,
                                    const char *extra2, bool *failed) {
  copy_spec c = {src, skip, {extra1, extra2}};
  return hdrs_build(copy_lines, &c, failed);
}

bool ag__px_set_traceparent(struct curl_slist **list, const char *value) {
  char line[96];
  bool failed = false;
  snprintf(line, sizeof line, "traceparent: %s", value);
  /* the client's traceparent out: the proxy's span is the parent now */
  struct curl_slist *out =
      ag__px_hdrs_copy(*list, "traceparent:", line, NULL, &failed);
  if (failed)
    return false;
  ag__px_hdrs_free(*list);
  *list = out;
  return true;
}

/* Whether the peer of socket `fd` has gone: closed (or shut its side
 * down), reset, or the socket failed. A client does not half-close an
 * HTTP/1.1 connection while it waits for the answer, so a hang-up means
 * nobody reads the answer. */
static bool peer_gone(int fd) {
  struct pollfd pf = {.fd = fd, .events = POLLIN | POLLRDHUP};
  if (poll(&pf, 1, 0) != 1)
    return false;
  return (pf.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

/* How often on_progress looks at the client's socket: a client that
 * leaves is seen within this (plus the one second of a silent upstream),
 * and a transfer of a few milliseconds makes no poll(2) at all - libcurl
 * calls the callback a dozen times in one. */
#define PEER_CHECK_MS 50

/* libcurl's progress callback, on the relay's thread: on every read and,
 * while the upstream is silent, about once a second. A client that has
 * left ends the transfer (and so frees its worker, its slot and its
 * upstream connection) instead of leaving it to wait for the upstream or
 * the transfer's time limit. libmicrohttpd does not watch a suspended
 * connection's socket, so this does, every PEER_CHECK_MS at most. */
static int on_progress(void *user, curl_off_t dltotal, curl_off_t dlnow,
                       curl_off_t ultotal, curl_off_t ulnow) {
  (void)dltotal, (void)dlnow, (void)ultotal, (void)ulnow;
  upstream *u = user;
  if (u->client_fd < 0)
    return 0;
  int64_t now = ag_now_ms();
  if (now < u->peer_next_ms)
    return 0;
  u->peer_next_ms = now + PEER_CHECK_MS;
  if (!peer_gone(u->client_fd))
    return 0;
  u->client_left = true;
  return 1; /* CURLE_ABORTED_BY_CALLBACK */
}

/* The URL of a request upstream, from parts (libcurl's URL API): the
 * upstream's scheme, host, port and credentials, never the client's; the
 * upstream's path followed by the client's (`target`, normalised by
 * ag__target_normalise in the handler: origin-form, so it cannot name
 * another host), and the client's query. A version the upstream's path
 * already ends with ("/v1", "/v1beta") is not doubled when the client's
 * path starts with it. NULL when out of memory. */
const px_up *ag__px_route(const ag_proxy *p, const char *target) {
  char path[2048];
  size_t pl = strcspn(target, "?");
  snprintf(path, sizeof path, "%.*s", (int)(pl < sizeof path ? pl : 0), target);
  const ag__wire *serving = ag__wire_serving(path);
  for (int k = 0; k < PX_UPS; k++) {
    const px_up *u = &p->ups[k];
    if (u->up == NULL || u->api == NULL)
      continue;
    /* under the prefix: "/v1/messages" and "/v1/messages/count_tokens",
     * not "/v1/messagesx"; a prefix ending in '/' takes all below it */
    const char *pre = u->api->route_prefix;
    size_t n = pre != NULL ? strlen(pre) : 0;
    if (serving == u->api ||
        (n > 0 && strncmp(path, pre, n) == 0 &&
         (pre[n - 1] == '/' || path[n] == '\0' || path[n] == '/')))
      return u;
  }
  return &p->ups[PX_UP_DEFAULT];
}

bool ag__px_env_proxy(void) {
  /* the names libcurl reads for an http or https URL (HTTP_PROXY it does
   * not: a CGI program's client could set it) */
  static const char *const names[] = {"http_proxy", "https_proxy",
                                      "HTTPS_PROXY", "all_proxy", "ALL_PROXY"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    const char *v = getenv(names[i]);
    if (v != NULL && v[0] != '\0')
      return true;
  }
  return false;
}

/* With no proxy in the environment, libcurl would still look for one in
 * it for every transfer (six getenv calls and the NO_PROXY check, about 1%
 * of a request's instructions): "" for both says there is none. */
void ag__px_proxy_opts(const ag_proxy *p, CURL *h) {
  if (p->env_proxy)
    return;
  curl_easy_setopt(h, CURLOPT_PROXY, "");
  curl_easy_setopt(h, CURLOPT_NOPROXY, "");
}

static char *upstream_url(const px_up *to, const char *target) {
  const char *path = target;
  size_t vl = to->version_len;
  if (vl > 0 && strncmp(path, to->path + strlen(to->path) - vl, vl) == 0 &&
      path[vl] == '/')
    path += vl;
  size_t pl = strcspn(path, "?");
  const char *query =
      path[pl] == '?' && path[pl + 1] != '\0' ? path + pl + 1 : NULL;
  size_t ol = strlen(to->origin), bl = strlen(to->path);
  size_t ql = query != NULL ? strlen(query) + 1 : 0;
  /* what libcurl's URL API wrote from the same parts, without its parse
   * (two of the 40 us a request took) */
  char *url = malloc(ol + bl + pl + ql + 1);
  if (url == NULL)
    return NULL;
  memcpy(url, to->origin, ol);
  memcpy(url + ol, to->path, bl);
  memcpy(url + ol + bl, path, pl);
  if (query != NULL) {
    url[ol + bl + pl] = '?';
    memcpy(url + ol + bl + pl + 1, query, ql - 1);
  }
  url[ol + bl + pl + ql] = '\0';
  return url;
}

/* Sets `h` up for a transfer to the upstream with the client's headers
 * `ch` (credentials go as they came). `json_body`: the body is ours
 * (rewritten), sent as application/json. false when out of memory; the
 * caller frees *hdrs and *url after the transfer. */
bool ag__px_upstream_handle(ag_proxy *p, const struct curl_slist *ch, CURL *h,
                            const char *method, const char *uri,
                            const char *body, size_t len, bool json_body,
                            int client_fd, upstream *u,
                            struct curl_slist **hdrs, char **url) {
  memset(u, 0, sizeof(*u));
  u->cc = CURLE_OUT_OF_MEMORY;
  u->client_fd = client_fd;
  /* the client was there when its request was read */
  u->peer_next_ms = client_fd >= 0 ? ag_now_ms() + PEER_CHECK_MS : 0;
  u->bud = p->budget;
  const px_up *to = ag__px_route(p, uri);
  u->shown = to->shown;
  *url = upstream_url(to, uri);
  bool failed = false;
  /* no "Expect: 100-continue" wait, no compressed body to read */
  struct curl_slist *list = ag__px_hdrs_copy(
      ch, NULL, json_body ? "Content-Type: application/json" : NULL,
      "Expect:", &failed);
  *hdrs = list;
  if (*url == NULL || h == NULL || failed)
    return false;
  curl_easy_setopt(h, CURLOPT_URL, *url);
  /* the path is normalised already (target.c): sent as it is */
  curl_easy_setopt(h, CURLOPT_PATH_AS_IS, 1L);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)p->timeout_ms);
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, list);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, ag__px_on_body);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, u);
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, ag__px_on_header);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, u);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, u->errbuf);
  curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
  ag__px_proxy_opts(p, h);
  if (client_fd >= 0) {
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(h, CURLOPT_XFERINFODATA, u);
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    /* a speed check arms libcurl's one-second timer, which is what calls
     * the progress callback while the upstream sends nothing (in the
     * multi interface, nothing else runs a silent transfer); 1 byte a
     * second over the whole transfer's time limit never ends one */
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME,
                     (long)(p->timeout_ms / 1000 + 1));
  }
  if (strcmp(method, "HEAD") == 0) {
    curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
  } else {
    if (len > 0 || strcmp(method, "POST") == 0 || strcmp(method, "PUT") == 0 ||
        strcmp(method, "PATCH") == 0) {
      curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
      curl_easy_setopt(h, CURLOPT_POSTFIELDS, body != NULL ? body : "");
    }
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
  }
  return true;
}

static void sync_done(ag__relay_xfer *x, CURLcode cc) {
  sync_run *sr = x->user;
  pthread_mutex_lock(&sr->mu);
  sr->cc = cc;
  sr->done = true;
  pthread_cond_signal(&sr->cv);
  pthread_mutex_unlock(&sr->mu);
}

static void sync_op_taken(void *user) {
  sync_run *sr = user;
  pthread_mutex_lock(&sr->mu);
  sr->op_out = false;
  pthread_cond_signal(&sr->cv);
  pthread_mutex_unlock(&sr->mu);
}

/* Runs h on the relay and waits for its end (ag__relay_run's way), taking
 * the budget's bytes here, on this thread, when its body pauses for them:
 * the loop never waits. Returns when the transfer has ended and no
 * request for it is left in the relay's queue. */
static CURLcode sync_run_xfer(ag__relay *r, CURL *h, upstream *u) {
  sync_run sr;
  memset(&sr, 0, sizeof sr);
  sr.x.h = h;
  sr.x.done = sync_done;
  sr.x.user = &sr;
  sr.op.taken = sync_op_taken;
  sr.op.user = &sr;
  pthread_mutex_init(&sr.mu, NULL);
  pthread_cond_init(&sr.cv, NULL);
  u->sync = &sr;
  ag__relay_add(r, &sr.x);
  pthread_mutex_lock(&sr.mu);
  while (!sr.done || sr.op_out) {
    if (u->want > 0 && !sr.done && !sr.op_out) {
      size_t want = u->want;
      pthread_mutex_unlock(&sr.mu);
      ag__budget_wait(u->bud, want, u->held);
      pthread_mutex_lock(&sr.mu);
      u->held += want;
      u->want = 0;
      sr.op_out = true;
      pthread_mutex_unlock(&sr.mu);
      ag__relay_unpause(r, &sr.x, &sr.op);
      pthread_mutex_lock(&sr.mu);
      continue;
    }
    pthread_cond_wait(&sr.cv, &sr.mu);
  }
  pthread_mutex_unlock(&sr.mu);
  u->sync = NULL;
  pthread_cond_destroy(&sr.cv);
  pthread_mutex_destroy(&sr.mu);
  return sr.cc;
}

/* One whole request upstream (see ag__px_upstream_handle), run on `relay`
 * - the loop of the client's connection, whose connection cache its earlier
 * requests filled - while this thread waits. */
void ag__px_send_upstream(ag__relay *relay, ag_proxy *p,
                          const struct curl_slist *ch, const char *method,
                          const char *uri, const char *body, size_t len,
                          bool json_body, int client_fd, upstream *u) {
  struct curl_slist *hdrs = NULL;
  char *url = NULL;
  CURL *h = curl_easy_init();
  if (h == NULL) {
    memset(u, 0, sizeof(*u));
    u->cc = CURLE_OUT_OF_MEMORY;
    return;
  }
  if (ag__px_upstream_handle(p, ch, h, method, uri, body, len, json_body,
                             client_fd, u, &hdrs, &url)) {
    u->cc = sync_run_xfer(relay, h, u);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &u->status);
    curl_off_t us = 0;
    if (curl_easy_getinfo(h, CURLINFO_TOTAL_TIME_T, &us) == CURLE_OK)
      u->total_us = (int64_t)us;
  }
  curl_easy_cleanup(h);
  ag__px_hdrs_free(hdrs);
  free(url);
}

void ag__px_upstream_free(upstream *u) {
  ag__budget_release(u->bud, u->held, 0);
  free(u->body);
  ag__buf_free(&u->headers);
  memset(u, 0, sizeof(*u));
}

/* A failed transfer as a 502, else false. */
bool ag__px_upstream_failed(ag_proxy *p, const upstream *u, reply *r) {
  if (u->no_budget) {
    ag__px_set_error(r, 503, "server_error", "proxy_memory_full",
                     "agentguard proxy: the replies held whole take all of "
                     "--max-buffered; ask again");
    return true;
  }
  if (u->too_big) {
    ag__px_set_error(
        r, 502, "upstream_error", "upstream_too_large",
        "agentguard proxy: the upstream's response is larger than %u "
        "bytes",
        (unsigned)AG_PROXY_UPSTREAM_MAX);
    return true;
  }
  ag__px_metrics_upstream(&p->metrics, u->cc == CURLE_OK, ag__px_mono_ms());
  if (u->cc == CURLE_OK)
    return false;
  char why[CURL_ERROR_SIZE + 64];
  ag__px_set_error(
      r, 502, "upstream_error", "upstream_unreachable",
      "agentguard proxy: the upstream %s did not answer: %s",
      u->shown != NULL ? u->shown : p->ups[PX_UP_DEFAULT].shown,
      ag__px_scrub(p,
                   u->errbuf[0] != '\0' ? u->errbuf : curl_easy_strerror(u->cc),
                   why, sizeof why));
  return true;
}

/* The upstream's answer as it came: status, headers, body. */
void ag__px_pass_back(upstream *u, reply *r) {
  r->status = (unsigned)u->status;
  r->body = u->body;
  r->len = u->len;
  r->headers = u->headers;
  r->ctype = NULL;
  r->bud = u->bud;
  r->held = u->held;
  u->body = NULL;
  memset(&u->headers, 0, sizeof(u->headers));
  u->held = 0;
}
