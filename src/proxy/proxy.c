/*
 * src/proxy/proxy.c - the guard proxy (proxy.h; docs/proxy.md): its start
 * and stop, and what the other parts share (internal.h lists the parts:
 * serve.c, upstream.c, decide.c, tape.c, stream.c).
 *
 * Every API shape is the wire layer's (src/wire/wire.h: one file and one
 * row of ag__wire_all each); the proxy asks the request's shape
 * (reply.shape, from the path) and never which one it holds. One request,
 * guarded - Chat Completions or Messages, whose replies are relayed event
 * by event (the shapes with relay_event; Responses and Gemini are decided
 * on the request and their replies held whole: request_only.c):
 *   1. the body is read (capped) and tokenized once by the core's JCS
 *      tokenizer (ag__px_tape_decide: a flat tape, no jansson tree); the
 *      shape's tape_turn reads the turn from the tape and decides it as in
 *      step 2, and the body is parsed with jansson only when the decision
 *      needs it (a stop reply, the error context, a stream, a reply to
 *      replace or nudge). Any other body - one the tape refuses, an unusual
 *      shape, one that gets a 400 - takes the jansson path: parsed, its
 *      shape checked (a 400 in the API's error shape otherwise), its
 *      messages converted to chat form by the shape's to_chat (the audit's
 *      reading);
 *   2. the turn (the last user message and everything after it) becomes
 *      an ag_trajectory and is replayed through a fresh guard with the
 *      audit's replay (ag__replay_untimed), then the coming model request
 *      is counted (ag_guard_begin_iteration);
 *   3. a stop there is answered without tool calls: directly (the shape's
 *      stop_body: one assistant message saying why, whole or as events),
 *      or, with loop.final_request_without_tools, by the upstream asked
 *      without tools and told to answer with what it has (strip_calls,
 *      whole_to_sse);
 *   4. otherwise the body goes upstream unchanged; the reply is read by
 *      the shape's own reader (the providers' parser) and its tool calls
 *      checked (ag_guard_check_calls): a stop replaces it, a nudge asks the
 *      upstream once more with the held-back calls answered by the nudge
 *      text (nudge_messages). A stream is relayed as it comes (stream.c,
 *      the shape's relay_* hooks): text at once, calls held to the end.
 * Every stop sets `x-agentguard-stop: REASON` and writes an event.
 *
 * Serving: event loops, one per core (shard: a libmicrohttpd daemon run
 * by a relay's thread, relay.c), share the listening socket; the handler
 * reads a request on its loop. A streamed request with a small body is
 * decided there and its transfer started (decide_here); any other is
 * handed, its connection suspended, to a worker thread (job_main) for the
 * decision and the upstream requests it waits for whole. A stream's
 * transfer and its chunks run on the connection's loop (stream_st says
 * who touches what).
 *
 * Rejected: keeping sessions keyed by conversation. The whole decision for
 * a 500-message turn, read from the tape, costs about 0.3 ms of CPU
 * (bench/bench_proxy.c; jansson alone took 1.2 ms to parse that body), and
 * replaying makes every replica decide alike behind any load balancer.
 * Rejected: a JSON reader of the proxy's own (the tape is the core's
 * tokenizer, already validating every call's arguments), and reading every
 * body from the tape (the shapes it leaves to jansson are rare, and the
 * jansson path's decisions and 400 messages stay the reference).
 */
#define _GNU_SOURCE /* memmem */
#include "internal.h"

#include <netdb.h>

/* ------------------------------------------------------------------------ */
/* Small helpers                                                            */
/* ------------------------------------------------------------------------ */

char *ag__px_dupz(const char *s) {
  if (s == NULL)
    return NULL;
  size_t n = strlen(s);
  char *d = malloc(n + 1);
  if (d != NULL)
    memcpy(d, s, n + 1);
  return d;
}

/* The reply's body let go of, and what it held of the budget. */
static void reply_drop_body(reply *r) {
  free(r->body);
  r->body = NULL;
  ag__budget_release(r->bud, r->held, 0);
  r->held = 0;
}

void ag__px_set_json(reply *r, unsigned status, json_t *o) {
  reply_drop_body(r);
  r->status = status;
  r->ctype = "application/json";
  r->body = o != NULL ? json_dumps(o, JSON_COMPACT) : NULL;
  r->len = r->body != NULL ? strlen(r->body) : 0;
  json_decref(o);
  if (r->body == NULL) {
    r->status = 500;
    r->body = ag__px_dupz("{\"error\":{\"message\":\"out of memory\",\"type\":"
                          "\"server_error\",\"code\":\"out_of_memory\"}}");
    r->len = r->body != NULL ? strlen(r->body) : 0;
  }
}

/* An error in the API's own shape (r->shape: wire.h error_body). */
void ag__px_set_error(reply *r, unsigned status, const char *type,
                      const char *code, const char *fmt, ...) {
  char msg[ERR_MSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  /* the API's own error shape; OpenAI's for a path that is not guarded */
  const ag__wire *w = r->shape != NULL ? r->shape : &ag__wire_chat;
  ag__px_set_json(r, status, w->error_body(status, type, code, msg));
}

void ag__px_reply_free(reply *r) {
  reply_drop_body(r);
  ag__buf_free(&r->headers);
  memset(r, 0, sizeof(*r));
}

int64_t ag__px_mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int64_t wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* `in`, or its copy in out[0..cap) with every credential the proxy knows
 * of replaced (docs/security.md#secrets): for every text of the proxy's
 * own that names something it did not make (an upstream's or libcurl's
 * error, a client's path). */
const char *ag__px_scrub(const ag_proxy *p, const char *in, char *out,
                         size_t cap) {
  size_t len = strlen(in);
  if (!ag__redact_needed(in, len, p->secrets, p->n_secrets))
    return in;
  ag__redact(in, len, p->secrets, p->n_secrets, out, cap);
  return out;
}

/* One event line: {"event":"proxy_decision","ts_ms",...}. Never holds a
 * header: credentials cannot reach the log. */
void ag__px_event(ag_proxy *p, ag__px_attr *a, const char *decision,
                  const char *path, const ag_verdict *v, const char *detail) {
  ag__px_metrics_decision(&p->metrics, decision, v);
  ag__px_attr_decision(a, decision, v);
  if (p->events == NULL)
    return;
  json_t *o =
      json_pack("{s:s, s:I, s:s, s:s}", "event", "proxy_decision", "ts_ms",
                (json_int_t)wall_ms(), "decision", decision, "path", path);
  if (o == NULL)
    return;
  const ag__wire *api = ag__wire_serving(path);
  if (api != NULL) /* attribution: which API (the path says it) */
    json_object_set_new(o, "api", json_string(api->name));
  if (a != NULL && a->id > 0) { /* and whose request (attr.h) */
    json_object_set_new(o, "request_id", json_integer((json_int_t)a->id));
    if (a->client[0] != '\0')
      json_object_set_new(o, "client", json_string(a->client));
    if (a->model[0] != '\0')
      json_object_set_new(o, "model", json_string(a->model));
    if (a->conv[0] != '\0')
      json_object_set_new(o, "conversation", json_string(a->conv));
  }
  if (v != NULL) {
    json_object_set_new(o, "action",
                        json_string(v->action == AG_ESCALATE ? "escalate"
                                    : v->action == AG_NUDGE  ? "nudge"
                                                             : "stop"));
    json_object_set_new(o, "reason", json_string(ag_reason_name(v->reason)));
    char red[AG_VERDICT_MSG_MAX + AG_VERDICT_MSG_MAX / 4 + 16];
    json_object_set_new(
        o, "message",
        json_string(ag__px_scrub(p, v->message, red, sizeof red)));
    if (v->tool[0] != '\0')
      json_object_set_new(o, "tool", json_string(v->tool));
  }
  if (detail != NULL) {
    char red[ERR_MSG_MAX + ERR_MSG_MAX / 4 + 16];
    json_object_set_new(o, "detail",
                        json_string(ag__px_scrub(p, detail, red, sizeof red)));
  }
  char *line = json_dumps(o, JSON_COMPACT);
  json_decref(o);
  size_t n = line != NULL ? strlen(line) : 0;
  char *whole = line != NULL ? realloc(line, n + 1) : NULL;
  if (whole == NULL) {
    free(line);
    return;
  }
  whole[n++] = '\n';
  /* the line and its newline in one write(2), past anything the FILE
   * still buffers: a crash loses at most the line being written, never
   * cuts one that a reader already sees (docs/events.md) */
  pthread_mutex_lock(&p->ev_mu);
  fflush(p->events);
  int fd = fileno(p->events);
  for (size_t off = 0; fd >= 0 && off < n;) {
    ssize_t w = write(fd, whole + off, n - off);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      break;
    off += (size_t)w;
  }
  pthread_mutex_unlock(&p->ev_mu);
  free(whole);
}

/* The relay's hook: the daemon's work, on the relay's thread; and, when
 * it is due, the sweep of every loop's connections past their deadlines
 * (conns.h), by whichever loop comes first. */
static void mhd_run(void *user) {
  shard *sh = user;
  ag_proxy *p = sh->p;
  MHD_run(sh->d);
  int64_t now = ag__px_mono_ms();
  long long due = atomic_load(&p->next_sweep);
  if (now >= due &&
      atomic_compare_exchange_strong(&p->next_sweep, &due,
                                     now + ag__conns_period_ms(p->conns)))
    ag__conns_sweep(p->conns, now);
}

/* How long the loop may wait: libmicrohttpd's next timeout, and while
 * connections are open, no longer than the sweep's period. */
static long mhd_timeout(void *user) {
  shard *sh = user;
  MHD_UNSIGNED_LONG_LONG t = 0;
  long ms = MHD_get_timeout(sh->d, &t) != MHD_YES ? -1
            : t > 60000                           ? 60000
                                                  : (long)t;
  if (ag__conns_count(sh->p->conns) > 0) {
    long period = ag__conns_period_ms(sh->p->conns);
    if (ms < 0 || ms > period)
      ms = period;
  }
  return ms;
}

static void quiet_log(void *cls, const char *fmt, va_list ap) {
  (void)cls;
  (void)fmt;
  (void)ap;
}

void ag_proxy_opts_init(ag_proxy_opts *o) {
  memset(o, 0, sizeof(*o));
  o->listen_host = "127.0.0.1";
  o->port = 8787;
  ag_config_preset(&o->cfg, "default", NULL);
}

/* The listening socket, shared by every loop (each daemon takes a
 * duplicate): bound once, so a port in use is refused as it should be. */
static int listen_on(const struct sockaddr_storage *sa, socklen_t len, int *e) {
  int fd = socket(sa->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int one = 1;
  if (fd < 0 ||
      setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
      bind(fd, (const struct sockaddr *)sa, len) != 0 ||
      listen(fd, SOMAXCONN) != 0) {
    *e = errno;
    if (fd >= 0)
      close(fd);
    return -1;
  }
  return fd;
}

/* Grows the process's descriptor table now to hold every descriptor the
 * proxy may have open at once: two per client connection (its own and its
 * upstream request's), the idle upstream connections each loop keeps, and
 * a few more. The kernel grows the table when a new descriptor does not
 * fit, and in a process with threads each growth waits for an RCU grace
 * period (synchronize_rcu, about 10 ms here) while every thread that opens
 * a descriptor - every loop accepting a client or connecting upstream -
 * waits behind it. Measured with perf (sched_switch): each loop stalled
 * 11-14 ms in accept4 the first time 2,048 descriptors were passed; the
 * first 2,000 connections cross five such sizes. The table never shrinks,
 * so growing it once at start moves those stalls out of the serving time.
 * Kept under the soft RLIMIT_NOFILE; a failure costs only the stalls. The
 * table: 8 bytes a descriptor (16 KiB for the default 512 connections).
 * Called before the loops start (fd: the listening socket, the lowest free
 * descriptor then, so what the process has open already is kept apart). */
static void reserve_fds(int fd, unsigned limit, unsigned loops) {
  uint64_t want =
      (uint64_t)fd + 2 * (uint64_t)limit + (uint64_t)loops * UP_POOL_MAX + 64;
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
    return;
  if (rl.rlim_cur != RLIM_INFINITY && want >= rl.rlim_cur)
    want = rl.rlim_cur > 0 ? rl.rlim_cur - 1 : 0;
  if (want > INT_MAX)
    want = INT_MAX;
  int high = fcntl(fd, F_DUPFD_CLOEXEC, (int)want);
  if (high >= 0)
    close(high);
}

/* Pools of kept objects (internal.h: px_pool): the loops' easy handles,
 * the proxy's guards. */
void ag__px_pool_init(px_pool *pl) {
  pthread_mutex_init(&pl->mu, NULL);
  pl->n = 0;
  pl->on = true;
}

void *ag__px_pool_take(px_pool *pl) {
  void *item = NULL;
  if (!pl->on)
    return NULL;
  pthread_mutex_lock(&pl->mu);
  if (pl->n > 0)
    item = pl->item[--pl->n];
  pthread_mutex_unlock(&pl->mu);
  return item;
}

bool ag__px_pool_give(px_pool *pl, void *item) {
  if (!pl->on)
    return false;
  pthread_mutex_lock(&pl->mu);
  bool kept = pl->n < PX_POOL_MAX;
  if (kept)
    pl->item[pl->n++] = item;
  pthread_mutex_unlock(&pl->mu);
  return kept;
}

void ag__px_pool_drain(px_pool *pl, void (*free_item)(void *)) {
  if (!pl->on)
    return;
  while (pl->n > 0)
    free_item(pl->item[--pl->n]);
  pthread_mutex_destroy(&pl->mu);
  pl->on = false;
}

static void guard_free(void *g) {
  ag_guard_free(g);
}

static void reader_free(void *j) {
  ag__jcs_free(j);
}

static void easy_free(void *h) {
  curl_easy_cleanup(h);
}

/* The event loops, one per core (at most SHARDS_MAX), each a daemon (no
 * threads of its own, its epoll set served by the relay's loop: a chunk
 * read from the upstream is checked and written to the client on one
 * thread) and a relay, on the shared listening socket (the kernel wakes
 * the loops for new connections; one accepts). Each daemon may hold
 * `limit` + CONN_SLACK connections; ag__px_on_connection keeps the limit over
 * all of them. false on failure (errno). */
static unsigned shard_count(void) {
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  long want = cpus < 1 ? 1 : cpus * SHARDS_PER_CORE;
  return want > SHARDS_MAX ? SHARDS_MAX : (unsigned)want;
}

static bool start_shards(ag_proxy *p, int lfd, unsigned limit) {
  unsigned n = shard_count();
  p->max_conns = limit;
  for (p->n_sh = 0; p->n_sh < n; p->n_sh++) {
    shard *sh = &p->sh[p->n_sh];
    sh->p = p;
    ag__px_pool_init(&sh->easy);
    int fd = dup(lfd);
    if (fd < 0)
      return false;
    sh->d = MHD_start_daemon(
        MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG, 0, NULL,
        NULL, ag__px_handler, sh, MHD_OPTION_LISTEN_SOCKET, fd,
        MHD_OPTION_CONNECTION_LIMIT, limit + CONN_SLACK,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)120,
        MHD_OPTION_URI_LOG_CALLBACK, ag__px_on_uri, NULL,
        MHD_OPTION_NOTIFY_COMPLETED, ag__px_completed, sh->p,
        MHD_OPTION_NOTIFY_CONNECTION, ag__px_on_connection, sh,
        MHD_OPTION_EXTERNAL_LOGGER, quiet_log, NULL, MHD_OPTION_END);
    if (sh->d == NULL)
      return false; /* fd: whether MHD closed it is not said; not closed
                       again here */
    const union MHD_DaemonInfo *ep =
        MHD_get_daemon_info(sh->d, MHD_DAEMON_INFO_EPOLL_FD);
    if (ep != NULL) {
      ag__relay_hook hook = {ep->epoll_fd, mhd_run, mhd_timeout, sh};
      sh->relay = ag__relay_start(UP_POOL_MAX, &hook);
      /* NULL when out of memory: every chunk is then read as a tree */
      sh->ct = sh->relay != NULL ? ag__chunk_tape_new() : NULL;
    }
    if (sh->relay == NULL) {
      MHD_stop_daemon(sh->d);
      sh->d = NULL;
      return false;
    }
  }
  return true;
}

/* Stops the loops started (no request's thread may be left). */
static void stop_shards(ag_proxy *p) {
  for (unsigned i = 0; i < p->n_sh; i++) {
    shard *sh = &p->sh[i];
    ag__relay_stop(sh->relay); /* the daemon is this thread's from here on */
    /* the connections resumed last are taken off the suspended list */
    MHD_run(sh->d);
    MHD_run(sh->d);
    MHD_stop_daemon(sh->d);
    ag__chunk_tape_free(sh->ct);
    ag__px_pool_drain(&sh->easy, easy_free);
  }
  p->n_sh = 0;
}

ag_err_t ag__px_fail(ag_error_t *err, ag_err_t code, const char *fmt, ...) {
  if (err != NULL) {
    ag_error_clear(err);
    err->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
  }
  return code;
}

/* `url` with its userinfo left out ("scheme://" kept, everything up to
 * the authority's last '@' dropped), for a message about an upstream URL
 * that libcurl could not read. */
static void url_shown(const char *url, char *out, size_t cap) {
  const char *s = strstr(url, "://");
  const char *auth = s != NULL ? s + 3 : url;
  size_t alen = strcspn(auth, "/?#");
  const char *at = NULL;
  for (size_t i = 0; i < alen; i++)
    if (auth[i] == '@')
      at = auth + i;
  if (at == NULL)
    snprintf(out, cap, "%s", url);
  else
    snprintf(out, cap, "%.*s%s", (int)(auth - url), url, at + 1);
}

/* Most bytes of secret values the proxy keeps for scrub(). */
#define SECRET_BYTES_MAX (64u * 1024)

/* The secrets scrub() hides: the environment's secret values now, and the
 * upstream's user and password (each as written and decoded) when they
 * are AG__SECRET_MIN bytes or more (shorter ones are never shown anyway:
 * no message names the upstream with its userinfo). */
static ag_err_t keep_secrets(ag_proxy *p) {
  ag__secret found[AG__SECRETS_MAX];
  size_t n = ag__secrets_from_env(environ, found, AG__SECRETS_MAX - 4 * PX_UPS);
  char *parts[4 * PX_UPS] = {NULL};
  for (int k = 0; k < PX_UPS; k++) {
    CURLU *up = p->ups[k].up;
    if (up == NULL)
      continue;
    curl_url_get(up, CURLUPART_USER, &parts[4 * k], 0);
    curl_url_get(up, CURLUPART_USER, &parts[4 * k + 1], CURLU_URLDECODE);
    curl_url_get(up, CURLUPART_PASSWORD, &parts[4 * k + 2], 0);
    curl_url_get(up, CURLUPART_PASSWORD, &parts[4 * k + 3], CURLU_URLDECODE);
  }
  for (int i = 0; i < 4 * PX_UPS; i++)
    if (parts[i] != NULL && strlen(parts[i]) >= AG__SECRET_MIN)
      found[n++] = (ag__secret){parts[i], strlen(parts[i])};
  size_t bytes = 0, keep = 0;
  while (keep < n && found[keep].len <= SECRET_BYTES_MAX - bytes)
    bytes += found[keep++].len;
  ag_err_t rc = AG_OK;
  if (keep > 0 && (p->secret_buf = malloc(bytes)) == NULL)
    rc = AG_ENOMEM;
  for (size_t i = 0, at = 0; rc == AG_OK && i < keep; i++) {
    memcpy(p->secret_buf + at, found[i].s, found[i].len);
    p->secrets[i] = (ag__secret){p->secret_buf + at, found[i].len};
    at += found[i].len;
  }
  p->n_secrets = rc == AG_OK ? keep : 0;
  for (int i = 0; i < 4 * PX_UPS; i++)
    curl_free(parts[i]);
  return rc;
}

/* The URL up without its path, as libcurl writes it: "scheme://" and the
 * credentials, host and port as given (upstream_url puts a request's path
 * and query after it). NULL when out of memory. */
static char *url_origin(CURLU *up) {
  CURLU *cu = curl_url_dup(up);
  char *got = NULL, *o = NULL;
  if (cu != NULL && curl_url_set(cu, CURLUPART_PATH, "", 0) == CURLUE_OK &&
      curl_url_get(cu, CURLUPART_URL, &got, 0) == CURLUE_OK) {
    size_t n = strlen(got);
    if (n > 0 && got[n - 1] == '/')
      got[--n] = '\0';
    o = ag__px_dupz(got);
  }
  curl_free(got);
  curl_url_cleanup(cu);
  return o;
}

/* An upstream option (`opt`: its name, for messages), read once with
 * libcurl's URL API: http or https, a host, no query or fragment. Fills
 * *to: the URL (kept whole: the credentials go with every request), its
 * path, version length and the shown form. */
static ag_err_t parse_upstream(px_up *to, const char *opt, const char *url,
                               ag_error_t *err) {
  char shown[512];
  url_shown(url, shown, sizeof shown);
  char *scheme = NULL, *host = NULL, *port = NULL, *path = NULL, *q = NULL,
       *frag = NULL;
  ag_err_t rc = AG_OK;
  CURLUcode uc = CURLUE_OUT_OF_MEMORY;
  if ((to->up = curl_url()) != NULL)
    uc = curl_url_set(to->up, CURLUPART_URL, url, 0);
  if (uc == CURLUE_OK)
    uc = curl_url_get(to->up, CURLUPART_SCHEME, &scheme, 0);
  if (uc == CURLUE_OK)
    uc = curl_url_get(to->up, CURLUPART_HOST, &host, 0);
  if (uc == CURLUE_OK)
    uc = curl_url_get(to->up, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT);
  if (uc == CURLUE_OK)
    uc = curl_url_get(to->up, CURLUPART_PATH, &path, 0);
  if (uc == CURLUE_OUT_OF_MEMORY)
    rc = ag__px_fail(err, AG_ENOMEM, "out of memory");
  else if (uc != CURLUE_OK)
    rc = ag__px_fail(err, AG_EINVAL,
                     "%s '%s': expected an http:// or https:// URL: %s", opt,
                     shown, curl_url_strerror(uc));
  else if (strcmp(scheme, "http") != 0 && strcmp(scheme, "https") != 0)
    rc = ag__px_fail(err, AG_EINVAL,
                     "%s '%s': expected an http:// or https:// URL, not %s",
                     opt, shown, scheme);
  else if (curl_url_get(to->up, CURLUPART_QUERY, &q, 0) == CURLUE_OK ||
           curl_url_get(to->up, CURLUPART_FRAGMENT, &frag, 0) == CURLUE_OK)
    rc = ag__px_fail(err, AG_EINVAL,
                     "%s '%s': a query or fragment cannot be kept (the "
                     "client's request supplies them)",
                     opt, shown);
  if (rc == AG_OK) {
    size_t pl = strlen(path);
    while (pl > 0 && path[pl - 1] == '/')
      path[--pl] = '\0';
    const char *last = strrchr(path, '/');
    to->version_len =
        last != NULL && last[1] == 'v' && last[2] >= '0' && last[2] <= '9'
            ? strlen(last)
            : 0;
    to->path = ag__px_dupz(path);
    size_t sl = strlen(scheme) + strlen(host) + strlen(port) + 5;
    if ((to->shown = malloc(sl)) != NULL)
      snprintf(to->shown, sl, "%s://%s:%s", scheme, host, port);
    to->origin = url_origin(to->up);
    if (to->path == NULL || to->shown == NULL || to->origin == NULL)
      rc = ag__px_fail(err, AG_ENOMEM, "out of memory");
  }
  curl_free(scheme);
  curl_free(host);
  curl_free(port);
  curl_free(path);
  curl_free(q);
  curl_free(frag);
  return rc;
}

/* Frees what proxy_new made of p, and p. */
static void proxy_free(ag_proxy *p) {
  ag__px_pool_drain(&p->guards, guard_free);
  ag__px_pool_drain(&p->readers, reader_free);
  pthread_mutex_destroy(&p->ev_mu);
  pthread_mutex_destroy(&p->probe_mu);
  pthread_mutex_destroy(&p->jobs_mu);
  pthread_cond_destroy(&p->jobs_cv);
  pthread_cond_destroy(&p->work_cv);
  if (p->client_key != NULL)
    OPENSSL_cleanse(p->client_key, strlen(p->client_key));
  free(p->client_key);
  if (p->secret_buf != NULL) {
    size_t n = 0;
    for (size_t i = 0; i < p->n_secrets; i++)
      n += p->secrets[i].len;
    OPENSSL_cleanse(p->secret_buf, n);
  }
  free(p->secret_buf);
  for (int k = 0; k < PX_UPS; k++) {
    curl_url_cleanup(p->ups[k].up);
    free(p->ups[k].path);
    free(p->ups[k].shown);
    free(p->ups[k].origin);
  }
  ag__conns_free(p->conns);
  ag__budget_free(p->budget);
  /* the spans of the requests answered go out now, for at most 2 s */
  ag__otlp_stop(p->otlp, 2000);
  free(p);
}

const char *ag_proxy_upstream(const ag_proxy *p) {
  return p != NULL ? p->ups[PX_UP_DEFAULT].shown : NULL;
}

/* The address to listen on: an IPv4 or IPv6 address, or a host name
 * (its first IPv4 address, else its first IPv6 one). *len set; false when
 * the name resolves to neither. Whether it is a loopback address in
 * *loopback. */
static bool listen_addr(const char *host, uint16_t port,
                        struct sockaddr_storage *sa, socklen_t *len,
                        bool *loopback) {
  struct addrinfo hints, *res = NULL;
  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(host, NULL, &hints, &res) != 0)
    return false;
  const struct addrinfo *pick = NULL;
  for (const struct addrinfo *a = res; a != NULL && pick == NULL;
       a = a->ai_next)
    if (a->ai_family == AF_INET)
      pick = a;
  for (const struct addrinfo *a = res; a != NULL && pick == NULL;
       a = a->ai_next)
    if (a->ai_family == AF_INET6)
      pick = a;
  bool ok = pick != NULL && pick->ai_addrlen <= sizeof(*sa);
  if (ok) {
    memset(sa, 0, sizeof(*sa));
    memcpy(sa, pick->ai_addr, pick->ai_addrlen);
    *len = pick->ai_addrlen;
    if (sa->ss_family == AF_INET) {
      struct sockaddr_in *in = (struct sockaddr_in *)sa;
      in->sin_port = htons(port);
      *loopback = (ntohl(in->sin_addr.s_addr) >> 24) == 127;
    } else {
      struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)sa;
      in6->sin6_port = htons(port);
      *loopback = IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr) ||
                  (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr) &&
                   in6->sin6_addr.s6_addr[12] == 127);
    }
  }
  freeaddrinfo(res);
  return ok;
}

/* The options checked: the address to listen on (*sa, *sa_len), the
 * connections (*limit), the guard's config. */
static ag_err_t check_opts(const ag_proxy_opts *o, struct sockaddr_storage *sa,
                           socklen_t *sa_len, unsigned *limit,
                           ag_error_t *err) {
  const char *host = o->listen_host != NULL ? o->listen_host : "127.0.0.1";
  bool loopback = false;
  if (!listen_addr(host, o->port, sa, sa_len, &loopback))
    return ag__px_fail(err, AG_EINVAL,
                       "--listen: '%s' is neither an IPv4 or IPv6 address nor "
                       "a host name this machine resolves",
                       host);
  if (!loopback && (o->client_key == NULL || o->client_key[0] == '\0'))
    return ag__px_fail(
        err, AG_EINVAL,
        "--listen %s is not a loopback address: give --client-key-env "
        "NAME (clients then send that key in x-agentguard-key)",
        host);
  if (o->upstream == NULL)
    return ag__px_fail(
        err, AG_EINVAL,
        "--upstream: expected an http:// or https:// URL, got none");
  if (o->max_connections < 0 ||
      o->max_connections > AG_PROXY_MAX_CONNECTIONS_LIMIT)
    return ag__px_fail(err, AG_EINVAL,
                       "--max-connections %d: expected a number from 1 to %d",
                       o->max_connections, AG_PROXY_MAX_CONNECTIONS_LIMIT);
  *limit = o->max_connections > 0 ? (unsigned)o->max_connections
                                  : AG_PROXY_MAX_CONNECTIONS;
  if (o->max_connections_per_client < 0 ||
      (unsigned)o->max_connections_per_client > *limit)
    return ag__px_fail(
        err, AG_EINVAL,
        "--max-connections-per-client %d: expected a number from 1 to "
        "%u (--max-connections)",
        o->max_connections_per_client, *limit);
  if (o->idle_timeout_ms < 0 || o->header_timeout_ms < 0 ||
      o->request_timeout_ms < 0)
    return ag__px_fail(
        err, AG_EINVAL,
        "a connection timeout is negative (idle %lld, header %lld, "
        "request %lld ms)",
        (long long)o->idle_timeout_ms, (long long)o->header_timeout_ms,
        (long long)o->request_timeout_ms);
  ag_guard *probe = NULL;
  ag_err_t grc = ag_guard_new(&probe, &o->cfg, NULL, err);
  ag_guard_free(probe);
  return grc;
}

/* The connection table's limits from the options (conns.h). */
static ag__conns_limits conns_limits(const ag_proxy_opts *o, unsigned limit) {
  return (ag__conns_limits){
      .max = limit,
      .per_client = o->max_connections_per_client > 0
                        ? (unsigned)o->max_connections_per_client
                        : (limit / 4 > 0 ? limit / 4 : 1),
      .per_client_loopback = o->max_connections_per_client > 0,
      .idle_ms = o->idle_timeout_ms > 0 ? o->idle_timeout_ms
                                        : AG_PROXY_IDLE_TIMEOUT_MS,
      .header_ms = o->header_timeout_ms > 0 ? o->header_timeout_ms
                                            : AG_PROXY_HEADER_TIMEOUT_MS,
      .request_ms = o->request_timeout_ms > 0 ? o->request_timeout_ms
                                              : AG_PROXY_REQUEST_TIMEOUT_MS};
}

/* The proxy's state from the options in *out (nothing serves yet). */
static ag_err_t proxy_new(ag_proxy **out, const ag_proxy_opts *o,
                          unsigned limit, ag_error_t *err) {
  ag_proxy *p = calloc(1, sizeof(*p));
  if (p == NULL)
    return ag__px_fail(err, AG_ENOMEM, "out of memory");
  pthread_mutex_init(&p->ev_mu, NULL);
  pthread_mutex_init(&p->probe_mu, NULL);
  pthread_mutex_init(&p->jobs_mu, NULL);
  ag__px_pool_init(&p->guards);
  ag__px_pool_init(&p->readers);
  pthread_cond_init(&p->jobs_cv, NULL);
  pthread_cond_init(&p->work_cv, NULL);
  atomic_init(&p->ids, 1);
  ag__px_metrics_init(&p->metrics, wall_ms());
  p->cfg = o->cfg;
  p->max_body = o->max_body > 0 ? o->max_body : AG_PROXY_MAX_BODY_DEFAULT;
  p->events = o->events;
  p->access_log = o->access_log;
  p->log_json = o->access_log_json;
  p->attr_on =
      o->events != NULL || o->access_log != NULL || o->otlp_traces_url != NULL;
  p->timeout_ms = o->upstream_timeout_ms > 0 ? o->upstream_timeout_ms : 600000;
  p->env_proxy = ag__px_env_proxy();
  p->client_key = o->client_key != NULL ? ag__px_dupz(o->client_key) : NULL;
  ag_err_t rc = o->client_key != NULL && p->client_key == NULL
                    ? ag__px_fail(err, AG_ENOMEM, "out of memory")
                    : parse_upstream(&p->ups[PX_UP_DEFAULT], "--upstream",
                                     o->upstream, err);
  p->ups[PX_UP_ANTHROPIC].api = ag__wire_named("anthropic");
  p->ups[PX_UP_GEMINI].api = ag__wire_named("gemini");
  if (rc == AG_OK && o->anthropic_upstream != NULL)
    rc = parse_upstream(&p->ups[PX_UP_ANTHROPIC], "--anthropic-upstream",
                        o->anthropic_upstream, err);
  if (rc == AG_OK && o->gemini_upstream != NULL)
    rc = parse_upstream(&p->ups[PX_UP_GEMINI], "--gemini-upstream",
                        o->gemini_upstream, err);
  if (rc == AG_OK && keep_secrets(p) != AG_OK)
    rc = ag__px_fail(err, AG_ENOMEM, "out of memory");
  if (rc == AG_OK && o->otlp_traces_url != NULL)
    rc = ag__otlp_start(&p->otlp, o->otlp_traces_url, o->otlp_headers,
                        o->otlp_service_name, err);
  if (rc == AG_OK) {
    ag__conns_limits cl = conns_limits(o, limit);
    p->per_client = cl.per_client;
    p->conns = ag__conns_new(&cl, shard_count() * (limit + CONN_SLACK));
    p->budget = ag__budget_new(
        o->max_buffered > 0 ? o->max_buffered : AG_PROXY_MAX_BUFFERED_DEFAULT);
    if (p->conns == NULL || p->budget == NULL)
      rc = ag__px_fail(err, AG_ENOMEM, "out of memory");
  }
  if (rc != AG_OK)
    proxy_free(p);
  else
    *out = p;
  return rc;
}

ag_err_t ag_proxy_start(ag_proxy **out, const ag_proxy_opts *o,
                        ag_error_t *err) {
  if (out == NULL || o == NULL)
    return ag__px_fail(err, AG_EINVAL, "ag_proxy_start: NULL argument");
  *out = NULL;
  struct sockaddr_storage sa;
  socklen_t sa_len = 0;
  unsigned limit = 0;
  ag_err_t rc = check_opts(o, &sa, &sa_len, &limit, err);
  if (rc != AG_OK)
    return rc;
  CURLcode curl_rc = (CURLcode)ag__curl_init(); /* src/base/curl.c */
  if (curl_rc != CURLE_OK)
    return ag__px_fail(err, AG_ENOMEM, "libcurl: %s",
                       curl_easy_strerror(curl_rc));
  ag_proxy *p = NULL;
  if ((rc = proxy_new(&p, o, limit, err)) != AG_OK)
    return rc;
  int e = 0;
  int lfd = listen_on(&sa, sa_len, &e);
  if (lfd >= 0)
    reserve_fds(lfd, limit, shard_count());
  if (lfd < 0 || !start_shards(p, lfd, limit)) {
    if (lfd >= 0)
      e = errno;
    stop_shards(p);
    if (lfd >= 0)
      close(lfd);
    proxy_free(p);
    if (lfd >= 0)
      return ag__px_fail(err, AG_ENOMEM,
                         "cannot start the proxy's event loops%s%s",
                         e != 0 ? ": " : "", e != 0 ? strerror(e) : "");
    return ag__px_fail(err, AG_EIO, "cannot listen on %s:%u: %s",
                       o->listen_host != NULL ? o->listen_host : "127.0.0.1",
                       (unsigned)o->port, strerror(e));
  }
  struct sockaddr_storage bound;
  socklen_t bl = sizeof bound;
  p->port = o->port;
  if (getsockname(lfd, (struct sockaddr *)&bound, &bl) == 0)
    p->port = ntohs(bound.ss_family == AF_INET6
                        ? ((struct sockaddr_in6 *)&bound)->sin6_port
                        : ((struct sockaddr_in *)&bound)->sin_port);
  close(lfd); /* each daemon has its own duplicate */
  *out = p;
  return AG_OK;
}

uint16_t ag_proxy_port(const ag_proxy *p) {
  return p != NULL ? p->port : 0;
}

bool ag_proxy_drain(ag_proxy *p, int64_t timeout_ms) {
  if (p == NULL)
    return true;
  atomic_store(&p->draining, true);
  int64_t end = ag__px_mono_ms() + (timeout_ms > 0 ? timeout_ms : 0);
  for (;;) {
    /* the request that asked for the drain (a signal) is none of them */
    if (ag__conns_busy(p->conns) == 0)
      return true;
    if (ag__px_mono_ms() >= end)
      return false;
    struct timespec ts = {0, 20 * 1000000L};
    nanosleep(&ts, NULL);
  }
}

void ag_proxy_stop(ag_proxy *p) {
  if (p == NULL)
    return;
  /* New requests get a 503; every upstream transfer ends (streams end
   * with an error event); then no request's thread is left and no
   * connection is suspended, which MHD_stop_daemon needs. */
  pthread_mutex_lock(&p->jobs_mu);
  p->stopping = true;
  pthread_mutex_unlock(&p->jobs_mu);
  for (unsigned i = 0; i < p->n_sh; i++)
    ag__relay_close(p->sh[i].relay);
  pthread_mutex_lock(&p->jobs_mu);
  while (p->jobs > 0)
    pthread_cond_wait(&p->jobs_cv, &p->jobs_mu);
  p->quit = true;
  pthread_cond_broadcast(&p->work_cv);
  while (p->workers > 0)
    pthread_cond_wait(&p->jobs_cv, &p->jobs_mu);
  pthread_mutex_unlock(&p->jobs_mu);
  stop_shards(p);
  proxy_free(p);
}
