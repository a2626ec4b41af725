/*
 * src/proxy/serve.c - serving (internal.h): libmicrohttpd's handler on each
 * event loop, the connections' admission and deadlines, the workers that
 * decide requests and wait for the upstream.
 */
#define _GNU_SOURCE /* memmem */
#include "internal.h"

/* ------------------------------------------------------------------------ */
/* Serving (libmicrohttpd)                                                  */
/* ------------------------------------------------------------------------ */

/* Whether a normalised path (target.c) is one the guard decides: a path
 * one of the wire table's shapes serves. */
static bool guarded_path(const char *path) {
  return ag__wire_serving(path) != NULL;
}

/* The paths the proxy answers itself, never forwarded (docs/proxy.md,
 * "Operating it"): GET /healthz, /readyz, /metrics. */
static bool own_path(const char *method, const char *path) {
  return strcmp(method, "GET") == 0 &&
         (strcmp(path, "/healthz") == 0 || strcmp(path, "/readyz") == 0 ||
          strcmp(path, "/metrics") == 0);
}

/* The answer to one of own_path's requests. */
static void answer_own(ag_proxy *p, const char *path, reply *r) {
  r->ctype = "text/plain; charset=utf-8";
  if (strcmp(path, "/metrics") == 0) {
    size_t len = 0;
    char *text = ag__px_metrics_text(
        &p->metrics, ag__conns_count(p->conns), ag__budget_used(p->budget),
        (unsigned)atomic_load(&p->streams), p->otlp != NULL,
        ag__otlp_exported(p->otlp), ag__otlp_dropped(p->otlp), &len);
    if (text == NULL) {
      ag__px_set_error(r, 500, "server_error", "out_of_memory",
                       "out of memory");
      return;
    }
    r->status = 200;
    r->body = text;
    r->len = len;
    r->ctype = "text/plain; version=0.0.4; charset=utf-8";
    return;
  }
  pthread_mutex_lock(&p->jobs_mu);
  bool stopping = p->stopping || atomic_load(&p->draining);
  pthread_mutex_unlock(&p->jobs_mu);
  int ready = stopping ? 0
              : strcmp(path, "/healthz") == 0
                  ? 1
                  : ag__px_metrics_ready(&p->metrics, ag__px_mono_ms());
  if (ready < 0) { /* no transfer says: the probe's answer */
    r->status = 0;
    return;
  }
  r->status = ready ? 200 : 503;
  r->body = ag__px_dupz(ready      ? "ok\n"
                        : stopping ? "stopping\n"
                                   : "the upstream was not reached by the "
                                     "last transfer\n");
  r->len = r->body != NULL ? strlen(r->body) : 0;
}

/* Whether the upstreams answer, by a connection to each (TLS included, no
 * request; 2 s at most), when no transfer in the last 30 s said so. The
 * result is kept for 10 s, so a load balancer polling every second makes
 * one connection in ten seconds; probes are one at a time (probe_mu), and
 * a /readyz that waits for one takes its result. On a worker's thread. */
static void readyz_probe(ag_proxy *p, reply *r) {
  pthread_mutex_lock(&p->probe_mu);
  int64_t now = ag__px_mono_ms();
  if (p->probe_at == 0 || now - p->probe_at > 10000) {
    bool ok = true;
    char why[512] = "";
    for (int k = 0; k < PX_UPS && ok; k++) {
      if (p->ups[k].up == NULL)
        continue;
      char *scheme = NULL, *host = NULL, *port = NULL, url[600];
      curl_url_get(p->ups[k].up, CURLUPART_SCHEME, &scheme, 0);
      curl_url_get(p->ups[k].up, CURLUPART_HOST, &host, 0);
      curl_url_get(p->ups[k].up, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT);
      snprintf(url, sizeof url, "%s://%s:%s/", scheme ? scheme : "http",
               host ? host : "", port ? port : "");
      curl_free(scheme);
      curl_free(host);
      curl_free(port);
      CURL *h = curl_easy_init();
      char errbuf[CURL_ERROR_SIZE] = "";
      CURLcode cc = CURLE_OUT_OF_MEMORY;
      if (h != NULL) {
        curl_easy_setopt(h, CURLOPT_URL, url);
        curl_easy_setopt(h, CURLOPT_CONNECT_ONLY, 1L);
        curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 2000L);
        curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 2000L);
        curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
        ag__px_proxy_opts(p, h);
        cc = curl_easy_perform(h);
        curl_easy_cleanup(h);
      }
      if (cc != CURLE_OK) {
        ok = false;
        char red[CURL_ERROR_SIZE + 64];
        snprintf(why, sizeof why, "the upstream %s was not reached: %s\n",
                 p->ups[k].shown,
                 ag__px_scrub(p, errbuf[0] ? errbuf : curl_easy_strerror(cc),
                              red, sizeof red));
      }
    }
    p->probe_ok = ok;
    snprintf(p->probe_why, sizeof p->probe_why, "%s", ok ? "ok\n" : why);
    p->probe_at = ag__px_mono_ms();
  }
  r->status = p->probe_ok ? 200 : 503;
  r->body = ag__px_dupz(p->probe_why);
  pthread_mutex_unlock(&p->probe_mu);
  r->len = r->body != NULL ? strlen(r->body) : 0;
  r->ctype = "text/plain; charset=utf-8";
}

/* Headers "Name: value" onto a response. */
static void add_headers(struct MHD_Response *resp, const ag__buf *h) {
  for (size_t at = 0; at < h->len; at += strlen(h->p + at) + 1) {
    const char *line = h->p + at;
    const char *colon = strchr(line, ':');
    if (colon == NULL || colon == line)
      continue;
    char name[256];
    size_t nl = (size_t)(colon - line);
    if (nl >= sizeof name)
      continue; /* no header of an API is named that long */
    memcpy(name, line, nl);
    name[nl] = '\0';
    const char *val = colon + 1;
    while (*val == ' ' || *val == '\t')
      val++;
    MHD_add_response_header(resp, name, val);
  }
}

/* A body handed to libmicrohttpd with what it holds of the budget, given
 * back when the client has it (or has gone). */
typedef struct held_body {
  char *body;
  ag__budget *bud;
  size_t held;
} held_body;

static void held_body_free(void *cls) {
  held_body *hb = cls;
  free(hb->body);
  ag__budget_release(hb->bud, hb->held, 0);
  free(hb);
}

static enum MHD_Result send_reply(struct MHD_Connection *c, reply *r) {
  struct MHD_Response *resp = NULL;
  held_body *hb = r->held > 0 ? malloc(sizeof(*hb)) : NULL;
  if (hb != NULL) {
    /* an upstream's body goes as it is, not copied again */
    *hb = (held_body){r->body, r->bud, r->held};
    resp = MHD_create_response_from_buffer_with_free_callback_cls(
        r->len, r->body, held_body_free, hb);
    if (resp != NULL) {
      r->body = NULL;
      r->held = 0;
    } else {
      free(hb);
    }
  } else {
    resp = MHD_create_response_from_buffer(
        r->len, r->body != NULL ? r->body : (void *)"", MHD_RESPMEM_MUST_COPY);
  }
  if (resp == NULL)
    return MHD_NO;
  add_headers(resp, &r->headers);
  if (r->ctype != NULL)
    MHD_add_response_header(resp, "Content-Type", r->ctype);
  if (r->stop != NULL)
    MHD_add_response_header(resp, "x-agentguard-stop", r->stop);
  if (r->close)
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
  enum MHD_Result ret = MHD_queue_response(c, r->status, resp);
  MHD_destroy_response(resp);
  return ret;
}

static bool key_ok(const ag_proxy *p, struct MHD_Connection *c) {
  if (p->client_key == NULL)
    return true;
  const char *k =
      MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-agentguard-key");
  size_t n = strlen(p->client_key);
  return k != NULL && strlen(k) == n && CRYPTO_memcmp(k, p->client_key, n) == 0;
}

/* Every loop's client connections go into one table (conns.c): each
 * daemon may hold --max-connections itself, so the limit over all of them,
 * the cap per client address and the deadlines are kept there. A
 * connection refused a slot (or that the table cannot hold) gets a 503 on
 * its first request and is closed. */
void ag__px_on_connection(void *cls, struct MHD_Connection *c,
                          void **socket_ctx,
                          enum MHD_ConnectionNotificationCode code) {
  ag_proxy *p = ((shard *)cls)->p;
  if (code != MHD_CONNECTION_NOTIFY_STARTED) {
    ag__conns_close(p->conns, *socket_ctx); /* before its socket closes */
    *socket_ctx = NULL;
    return;
  }
  const union MHD_ConnectionInfo *fi =
      MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
  const union MHD_ConnectionInfo *ai =
      MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
  ag__conn_refusal why = AG__CONN_OVER_MAX;
  *socket_ctx = fi == NULL ? NULL
                           : ag__conns_open(p->conns, fi->connect_fd,
                                            ai != NULL ? ai->client_addr : NULL,
                                            ag__px_mono_ms(), &why);
}

void *ag__px_on_uri(void *cls, const char *uri, struct MHD_Connection *c) {
  (void)cls;
  req_ctx *q = calloc(1, sizeof(*q));
  if (q != NULL) {
    q->client_fd = -1;
    q->uri = ag__px_dupz(uri != NULL ? uri : "/");
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    q->conn = ci != NULL ? ci->socket_context : NULL;
    q->too_many = ag__conn_refused(q->conn);
    ag__conns_state(q->conn, AG__CONN_HEADERS, ag__px_mono_ms());
  }
  return q;
}

/* The path of a request's URI, without its query. */
static void uri_path(const char *uri, char *path, size_t cap) {
  size_t pl = strcspn(uri, "?");
  snprintf(path, cap, "%.*s", (int)(pl < cap ? pl : 0), uri);
}

/* Counts one more request's thread or job for ag_proxy_stop to wait
 * for; false (nothing counted) once the proxy is stopping. */
static bool job_begin(ag_proxy *p) {
  pthread_mutex_lock(&p->jobs_mu);
  bool ok = !p->stopping;
  if (ok)
    p->jobs++;
  pthread_mutex_unlock(&p->jobs_mu);
  return ok;
}

static void job_end(ag_proxy *p) {
  pthread_mutex_lock(&p->jobs_mu);
  if (--p->jobs == 0)
    pthread_cond_broadcast(&p->jobs_cv);
  pthread_mutex_unlock(&p->jobs_mu);
}

/* A request's thread: the decision and every upstream request it needs,
 * while the connection is suspended; then the connection is resumed (the
 * handler sends the answer) - or, for a relayed stream, the transfer is
 * handed to the connection's loop, which answers. `q` belongs to the
 * connection again once it is resumed. */
void *ag__px_job_main(void *arg) {
  req_ctx *q = arg;
  shard *sh = q->sh;
  ag_proxy *p = sh->p;
  struct MHD_Connection *c = q->c;
  char path[2048];
  uri_path(q->uri, path, sizeof path);
  bool started = false;
  if (q->readyz)
    readyz_probe(p, &q->r);
  else
    ag__px_guarded(p, c, q, path, &q->r, &started,
                   NULL); /* only guarded ones come */
  if (!started) {         /* else the stream's loop answers the request */
    atomic_store(&q->answered, true);
    ag__px_resume(sh, c);
  }
  job_end(p);
  return NULL;
}

static bool spawn_detached(void *(*fn)(void *), void *arg);

void ag__px_job_end(ag_proxy *p) {
  job_end(p);
}

bool ag__px_spawn_job(ag_proxy *p, void *(*fn)(void *), void *arg) {
  if (!job_begin(p))
    return false;
  if (spawn_detached(fn, arg))
    return true;
  job_end(p);
  return false;
}

/* Starts fn(arg) on a detached thread with a request's stack. */
static bool spawn_detached(void *(*fn)(void *), void *arg) {
  pthread_attr_t at;
  if (pthread_attr_init(&at) != 0)
    return false;
  pthread_t t;
  pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
  pthread_attr_setstacksize(&at, JOB_STACK);
  bool ok = pthread_create(&t, &at, fn, arg) == 0;
  pthread_attr_destroy(&at);
  return ok;
}

/* A stream's nudge, on a thread of its own (start_nudge): it asks the
 * upstream again and waits, which the loop may not. */
void *ag__px_nudge_main(void *arg) {
  nudge_job *nj = arg;
  pthread_setname_np(pthread_self(), "ag-nudge");
  stream_st *st = nj->st;
  ag_proxy *p = st->p;
  ag__px_stream_nudge(st, nj);
  ag__px_flush(st, true);
  ag_reply_clear(&nj->rep);
  free(nj);
  ag__px_stream_release(st, true);
  job_end(p);
  return NULL;
}

/* Starts nj's thread, which takes the stream's end (its reference) from
 * the loop; false when it cannot (the stream ends with an error event). A
 * nudge is rare and waits for the upstream, so it does not take a worker
 * from the requests: a thread is made for it. */
static bool start_nudge(nudge_job *nj) {
  stream_st *st = nj->st;
  ag_proxy *p = st->p;
  bool stopping = !job_begin(p);
  if (!stopping && spawn_detached(ag__px_nudge_main, nj))
    return true;
  if (!stopping)
    job_end(p);
  ag__px_nudge_fail(nj, stopping
                            ? "agentguard proxy: shutting down"
                            : "agentguard proxy: cannot start a thread to ask "
                              "the upstream again");
  return false;
}

/* The end of a relayed stream whose client is still there, on its loop
 * (ag__px_on_stream_done): the calls checked and the end written, or a nudge
 * handed to its own thread; lets go of the end's reference. */
void ag__px_stream_end(stream_st *st) {
  nudge_job *nj = NULL;
  ag__px_stream_finish(st, &nj);
  if (nj != NULL && start_nudge(nj))
    return;
  ag__px_flush(st, true);
  ag__px_stream_release(st, true);
}

/* Idle workers kept at most; more end when their request is done. */
#define WORKERS_IDLE_MAX 64u

static void *worker_main(void *arg);

/* Makes one worker (the caller holds jobs_mu); false when it cannot. */
static bool spawn_worker(ag_proxy *p) {
  bool ok = spawn_detached(worker_main, p);
  if (ok) {
    p->workers++;
    p->spawning++;
  }
  return ok;
}

/* Requests queued with no worker coming for them (none could be made)
 * are answered 503 (the caller holds jobs_mu; it is released and taken
 * again). */
static void refuse_queued(ag_proxy *p) {
  req_ctx *ag__px_refused = NULL;
  while (p->queue != NULL && p->queued > p->idle + p->spawning) {
    req_ctx *q = p->queue;
    p->queue = q->next_job;
    if (p->queue == NULL)
      p->queue_tail = NULL;
    p->queued--;
    q->next_job = ag__px_refused;
    ag__px_refused = q;
  }
  pthread_mutex_unlock(&p->jobs_mu);
  while (ag__px_refused != NULL) {
    req_ctx *q = ag__px_refused;
    ag__px_refused = q->next_job;
    ag__px_set_error(&q->r, 503, "server_error", "no_thread",
                     "agentguard proxy: cannot start a thread for the request");
    shard *sh = q->sh;
    struct MHD_Connection *c = q->c;
    atomic_store(&q->answered, true);
    ag__px_resume(sh, c); /* q is the connection's again */
    job_end(p);
  }
  pthread_mutex_lock(&p->jobs_mu);
}

/* A worker: takes queued requests one after the other (job_main) and
 * waits for the next one, so that a request seldom waits for a thread to
 * be made. A relayed stream does not keep its worker: the worker is free
 * once the transfer is on the loop. Workers are made by workers: the loop makes
 * one at a time (start_job), and a worker that takes a request makes up to two
 * more while requests wait with none coming, so a burst does not hold the
 * loop's thread in pthread_create. */
static void *worker_main(void *arg) {
  pthread_setname_np(pthread_self(), "ag-worker");
  ag_proxy *p = arg;
  pthread_mutex_lock(&p->jobs_mu);
  p->spawning--;
  for (;;) {
    p->idle++;
    while (p->queue == NULL && !p->quit)
      pthread_cond_wait(&p->work_cv, &p->jobs_mu);
    p->idle--;
    req_ctx *q = p->queue;
    if (q == NULL)
      break; /* quit */
    p->queue = q->next_job;
    if (p->queue == NULL)
      p->queue_tail = NULL;
    p->queued--;
    bool made = true;
    for (int k = 0; k < 2 && made && p->queued > p->idle + p->spawning; k++)
      made = spawn_worker(p);
    if (!made && p->spawning == 0)
      refuse_queued(p); /* no thread can be made: no worker is coming */
    pthread_mutex_unlock(&p->jobs_mu);
    ag__px_job_main(q);
    pthread_mutex_lock(&p->jobs_mu);
    if (p->idle >= WORKERS_IDLE_MAX && p->queue == NULL)
      break;
  }
  if (--p->workers == 0)
    pthread_cond_broadcast(&p->jobs_cv);
  pthread_mutex_unlock(&p->jobs_mu);
  return NULL;
}

/* The request's answer, once its thread has given it. */
enum MHD_Result ag__px_send_answer(struct MHD_Connection *c, req_ctx *q) {
  if (!atomic_load(&q->answered))
    return MHD_YES; /* not expected: the connection was suspended */
  stream_st *st = q->st;
  q->st = NULL;
  if (st == NULL) {
    q->sent_status = q->r.status;
    enum MHD_Result ret = send_reply(c, &q->r);
    ag__px_reply_free(&q->r);
    return ret;
  }
  struct MHD_Response *resp = MHD_create_response_from_callback(
      MHD_SIZE_UNKNOWN, 16 * 1024, ag__px_stream_read, st, ag__px_stream_free);
  if (resp == NULL) {
    ag__px_stream_free(st);
    return MHD_NO;
  }
  unsigned status = 200;
  if (st->raw) {
    /* the upstream's status and headers (st->u is the loop's: it was
     * filled on this thread before the answer) */
    status = (unsigned)st->status;
    add_headers(resp, &st->u.headers);
  } else {
    MHD_add_response_header(resp, "Content-Type", "text/event-stream");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
  }
  q->sent_status = status;
  enum MHD_Result ret = MHD_queue_response(c, status, resp);
  MHD_destroy_response(resp);
  return ret;
}

/* Puts a suspended request in the workers' queue (its job counted): false
 * with a 503 in q->r when no worker can take it. */
static bool enqueue(ag_proxy *p, req_ctx *q) {
  pthread_mutex_lock(&p->jobs_mu);
  q->next_job = NULL;
  if (p->queue_tail != NULL)
    p->queue_tail->next_job = q;
  else
    p->queue = q;
  p->queue_tail = q;
  p->queued++;
  bool ok = true;
  if (p->queued > p->idle + p->spawning) {
    /* no worker is coming for it: make one, unless one is being made
     * (it makes more, see worker_main) */
    if (p->spawning == 0)
      ok = spawn_worker(p);
    if (!ok) { /* take it back out: it is the last one */
      req_ctx **pp = &p->queue;
      while (*pp != q)
        pp = &(*pp)->next_job;
      *pp = NULL;
      p->queue_tail = NULL;
      for (req_ctx *k = p->queue; k != NULL; k = k->next_job)
        p->queue_tail = k;
      p->queued--;
    }
  } else {
    pthread_cond_signal(&p->work_cv);
  }
  pthread_mutex_unlock(&p->jobs_mu);
  if (!ok) {
    job_end(p);
    ag__px_set_error(&q->r, 503, "server_error", "no_thread",
                     "agentguard proxy: cannot start a thread for the request");
  }
  return ok;
}

/* Hands the request to its own thread (job_main) and suspends the
 * connection; false with q->r filled when that cannot be done. */
static bool start_job(shard *sh, struct MHD_Connection *c, req_ctx *q) {
  ag_proxy *p = sh->p;
  if (!job_begin(p)) {
    ag__px_set_error(&q->r, 503, "server_error", "shutting_down",
                     "agentguard proxy: shutting down");
    return false;
  }
  q->job = true;
  MHD_suspend_connection(c);
  if (!enqueue(p, q)) {
    atomic_store(&q->answered, true);
    ag__px_resume(sh, c); /* the handler is called again: ag__px_send_answer */
  }
  return true;
}

bool ag__px_requeue(req_ctx *q) {
  if (!job_begin(q->sh->p)) {
    ag__px_set_error(&q->r, 503, "server_error", "shutting_down",
                     "agentguard proxy: shutting down");
    return false;
  }
  return enqueue(q->sh->p, q);
}

/* Bodies the loop decides itself at most (decide_here): the decision of
 * a turn this size takes well under 0.1 ms, which the loop's other
 * streams can wait; larger ones (a 500-message turn: 0.3 ms) go to a
 * worker. */
#define HERE_BODY_MAX (64u * 1024)

static const char *skip_ws(const char *v, const char *end) {
  while (v < end && (*v == ' ' || *v == '\t' || *v == '\n' || *v == '\r'))
    v++;
  return v;
}

/* Whether the body has a "stream" key whose value starts with `t` (true):
 * a cheap look, so that a request of a shape decided on the request alone
 * (request_only.c: its held reply waits on a worker) that is not streamed
 * goes straight to a worker instead of being decided twice; the decision
 * reads the body properly. */
static bool says_stream(const char *b, size_t len) {
  const char *end = b + len;
  const char *k = memmem(b, len, "\"stream\"", 8);
  while (k != NULL) {
    const char *v = skip_ws(k + 8, end);
    if (v < end && *v == ':') {
      v = skip_ws(v + 1, end);
      if (v < end && *v == 't')
        return true;
    }
    k += 8;
    k = memmem(k, (size_t)(end - k), "\"stream\"", 8);
  }
  return false;
}

/* A guarded request decided on the loop's own thread, without the two
 * thread hand-offs of a worker (there and back): 1 when its transfer
 * started - a stream relayed, or (Chat Completions, Messages) a reply held
 * whole and checked on the loop (ag__px_whole_start) - and the connection
 * is suspended until the loop answers; 0 when q->r is the answer (a stop,
 * a bad request); -1 when it is a worker's: a body over HERE_BODY_MAX, the
 * final request without tools, a shape decided on the request alone whose
 * reply is held (request_only.c), or a reply the loop's check hands on (a
 * stop, a nudge: ag__px_requeue). */
static int decide_here(shard *sh, struct MHD_Connection *c, req_ctx *q,
                       const char *path) {
  ag_proxy *p = sh->p;
  if (strcmp(q->method, "POST") != 0 || !guarded_path(path) ||
      q->len > HERE_BODY_MAX || q->body == NULL ||
      (q->r.shape->relay_event == NULL && !says_stream(q->body, q->len)))
    return -1;
  pthread_mutex_lock(&p->jobs_mu);
  bool stopping = p->stopping;
  pthread_mutex_unlock(&p->jobs_mu);
  if (stopping)
    return -1; /* start_job answers it */
  bool started = false, later = false;
  ag__px_guarded(p, c, q, path, &q->r, &started, &later);
  if (later)
    return -1;
  if (!started)
    return 0;
  /* the transfer is queued on this loop: its answer (ag__px_answer_stream or
   * ag__px_answer_reply) comes in a later round, after this suspension */
  q->job = true;
  MHD_suspend_connection(c);
  return 1;
}

/* The checks made as soon as a request's headers are in: its connection
 * past --max-connections (503, closed), the client key (401), the
 * request-target (400 unless origin-form; normalised in place, so that
 * every later look - the guarded paths, the upstream's URL - sees the path
 * the upstream will route). true with q->r set when the request is
 * refused. */
bool ag__px_refused(ag_proxy *p, struct MHD_Connection *c, req_ctx *q,
                    const char *method) {
  const char *why = NULL;
  bool ok = ag__target_normalise(q->uri, q->uri, strlen(q->uri) + 1, &why);
  char path[2048];
  uri_path(ok ? q->uri : "/", path, sizeof path);
  q->r.shape = ag__wire_serving(path);
  if (!own_path(method, path)) { /* the proxy's own are not counted */
    q->t0_ms = ag__px_mono_ms();
    ag__px_metrics_request(&p->metrics, q->r.shape);
    const union MHD_ConnectionInfo *ai =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    ag__px_attr_begin(&q->attr, atomic_fetch_add(&p->req_ids, 1) + 1,
                      ai != NULL ? ai->client_addr : NULL,
                      q->r.shape != NULL ? q->r.shape->name : NULL,
                      MHD_lookup_connection_value(c, MHD_HEADER_KIND,
                                                  "x-agentguard-session"));
    snprintf(q->attr.method, sizeof q->attr.method, "%s", method);
    if (p->otlp != NULL && q->r.shape != NULL) /* a span: its ids now */
      ag__px_attr_trace(&q->attr, MHD_lookup_connection_value(
                                      c, MHD_HEADER_KIND, "traceparent"));
  }
  if (q->too_many == AG__CONN_OVER_PER_CLIENT) {
    ag__px_set_error(
        &q->r, 503, "server_error", "too_many_connections",
        "agentguard proxy: this address has %u connections open, each "
        "serving a request (--max-connections-per-client)",
        p->per_client);
    q->r.close = true;
  } else if (q->too_many != AG__CONN_ADMITTED) {
    ag__px_set_error(
        &q->r, 503, "server_error", "too_many_connections",
        "agentguard proxy: more than %u client connections are open, "
        "each serving a request (--max-connections)",
        p->max_conns);
    q->r.close = true;
  } else if (atomic_load(&p->draining) && !(ok && own_path(method, path))) {
    ag__px_set_error(&q->r, 503, "server_error", "shutting_down",
                     "agentguard proxy: shutting down; send the request "
                     "again (to another replica)");
    q->r.close = true;
  } else if (!(ok && own_path(method, path)) && !key_ok(p, c)) {
    /* the health and metrics paths are for load balancers and scrapers,
     * which hold no client key; they show counts only */
    ag__px_set_error(&q->r, 401, "invalid_request_error", "agentguard_key",
                     "agentguard proxy: this proxy needs its client key in the "
                     "x-agentguard-key header");
    q->r.close = true;
  } else if (!ok) {
    ag__px_set_error(&q->r, 400, "invalid_request_error", "bad_request_target",
                     "agentguard proxy: %s", why);
    q->r.close = true;
    ag__px_event(p, &q->attr, "bad_request_target", "", NULL, why);
  } else {
    return false;
  }
  return true;
}

/* With traces on, the upstream's request carries the proxy's span as its
 * parent (W3C Trace Context), in the client's trace when it sent one. */
static bool traceparent_up(req_ctx *q) {
  if (q->attr.trace_id[0] == '\0' || q->attr.span_id[0] == '\0')
    return true;
  char tp[64];
  snprintf(tp, sizeof tp, "00-%s-%s-01", q->attr.trace_id, q->attr.span_id);
  return ag__px_set_traceparent(&q->client_hdrs, tp);
}

enum MHD_Result ag__px_handler(void *cls, struct MHD_Connection *c,
                               const char *url, const char *method,
                               const char *version, const char *upload,
                               size_t *upload_size, void **con_cls) {
  (void)version;
  (void)url;
  shard *sh = cls;
  ag_proxy *p = sh->p;
  req_ctx *q = *con_cls;
  if (q == NULL || q->uri == NULL)
    return MHD_NO; /* out of memory at the start */
  if (q->job)
    return ag__px_send_answer(c, q);
  if (!q->begun) {
    /* The headers are in, the body comes next: whatever can refuse the
     * request is checked now, before a byte of the body is read. */
    q->begun = true;
    ag__conns_state(q->conn, AG__CONN_BODY, ag__px_mono_ms());
    if (!ag__px_refused(p, c, q, method))
      return MHD_YES;
    enum MHD_Result ret = send_reply(c, &q->r);
    ag__px_reply_free(&q->r);
    return ret;
  }
  if (*upload_size > 0) {
    size_t n = *upload_size;
    *upload_size = 0;
    if (q->too_big || q->len + n > p->max_body) {
      q->too_big = true;
      free(q->body);
      q->body = NULL;
      q->len = q->cap = 0;
      return MHD_YES;
    }
    if (q->len + n + 1 > q->cap) {
      size_t cap = q->cap ? q->cap : 8192;
      while (cap < q->len + n + 1)
        cap *= 2;
      char *g = realloc(q->body, cap);
      if (g == NULL)
        return MHD_NO;
      q->body = g;
      q->cap = cap;
    }
    memcpy(q->body + q->len, upload, n);
    q->len += n;
    q->body[q->len] = '\0';
    return MHD_YES;
  }
  char path[2048];
  uri_path(q->uri, path, sizeof path);
  ag__conns_state(q->conn, AG__CONN_BUSY, ag__px_mono_ms());
  if (q->too_big) {
    ag__px_set_error(
        &q->r, 413, "invalid_request_error", "body_too_large",
        "agentguard proxy: the request body is larger than %zu bytes "
        "(--max-body)",
        p->max_body);
  } else if ((q->method = ag__px_dupz(method)) == NULL ||
             !ag__px_client_headers(c, &q->client_hdrs) || !traceparent_up(q)) {
    ag__px_set_error(&q->r, 500, "server_error", "out_of_memory",
                     "out of memory");
  } else {
    q->sh = sh;
    q->c = c;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    q->client_fd = ci != NULL ? ci->connect_fd : -1;
    if (own_path(method, path)) {
      answer_own(p, path, &q->r);
      if (q->r.status == 0) { /* /readyz: the probe, on a worker */
        q->readyz = true;
        if (start_job(sh, c, q))
          return MHD_YES;
      }
    } else if (strcmp(method, "POST") != 0 || !guarded_path(path)) {
      if (ag__px_relay_start(p, c, q, path, &q->r)) {
        /* answered by the loop once the upstream's status is in */
        q->job = true;
        MHD_suspend_connection(c);
        return MHD_YES;
      }
    } else {
      if (p->attr_on) /* the model and the conversation, for the logs */
        ag__px_attr_body(p, q, path, q->r.shape->conv_key);
      int here = decide_here(sh, c, q, path);
      if (here == 1)
        return MHD_YES; /* a stream: suspended, answered by the loop */
      if (here < 0 && start_job(sh, c, q))
        return MHD_YES; /* suspended: answered by the request's thread */
    }
  }
  q->sent_status = q->r.status;
  enum MHD_Result ret = send_reply(c, &q->r);
  ag__px_reply_free(&q->r);
  return ret;
}

void ag__px_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode toe) {
  ag_proxy *p = cls;
  (void)c;
  (void)toe;
  req_ctx *q = *con_cls;
  if (q != NULL && q->t0_ms > 0 && p != NULL) {
    if (q->st_ab != NULL) /* what its stream decided and read */
      ag__px_attr_merge(&q->attr, &q->st_ab->a);
    const ag__px_attr *a = &q->attr;
    int64_t us = ag__px_attr_now_us() - a->t0_us, ms = us / 1000;
    /* a request stopped before it went upstream saved at least its own
     * input tokens: about a token per 4 bytes of JSON and text */
    bool saved = a->decision != NULL &&
                 strcmp(a->decision, "stopped_before_request") == 0;
    ag__px_metrics_done(&p->metrics, q->sent_status, us, a->upstream_us,
                        a->in_tokens, a->out_tokens, saved ? q->len / 4 : 0);
    if (p->access_log != NULL || p->otlp != NULL) {
      char path[2048]; /* no query: it may hold a key (Gemini's ?key=) */
      uri_path(q->uri != NULL ? q->uri : "/", path, sizeof path);
      struct timespec now;
      clock_gettime(CLOCK_REALTIME, &now);
      if (p->access_log != NULL)
        ag__px_attr_log(a, p->access_log, p->log_json, path, q->sent_status, ms,
                        (int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000);
      if (p->otlp != NULL && a->api != NULL)
        ag__otlp_push(
            p->otlp,
            ag__px_attr_span(a, path, q->sent_status,
                             (int64_t)now.tv_sec * 1000000000 + now.tv_nsec));
    }
  }
  if (q != NULL) {
    ag__conns_state(q->conn, AG__CONN_IDLE, ag__px_mono_ms());
    ag__px_reply_free(&q->r);
    ag__px_attr_unshare(q->st_ab);
    if (q->st != NULL)
      ag__px_stream_free(q->st);
    ag__px_hdrs_free(q->client_hdrs);
    ag__px_body_tape_free(p, q);
    if (q->prefetched != NULL) /* not taken: the worker answered otherwise */
      ag__px_upstream_free(q->prefetched);
    free(q->prefetched);
    free(q->method);
    free(q->uri);
    free(q->body);
    free(q);
  }
  *con_cls = NULL;
}
