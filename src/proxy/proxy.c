/*
 * src/proxy/proxy.c - the guard proxy (proxy.h; docs/proxy.md).
 *
 * One request, guarded (POST /v1/chat/completions; POST /v1/messages the
 * same way in Anthropic's shapes, its turn read by fast_turn_anth or, on
 * the slow path, converted to chat form by ag__wire_messages.to_chat, its
 * streams relayed by on_anth_event):
 *   1. the body is read (capped) and tokenized once by the core's JCS
 *      tokenizer (tape_decide: a flat tape, no jansson tree); for the plain
 *      shape the turn is read from the tape (t_turn_chat, t_turn_anth) and
 *      decided as in step 2, and the body is parsed with jansson only when
 *      the decision needs it (a stop reply, the error context, a stream, a
 *      reply to replace or nudge). Any other body - one the tape refuses,
 *      an unusual shape, one that gets a 400 - takes the jansson path:
 *      parsed, its shape checked (400 in the API's error shape otherwise);
 *   2. the turn (the last user message and everything after it) becomes
 *      an ag_trajectory - built straight from the parsed request for the
 *      plain shape (fast_turn), else written out and read by
 *      ag_trajectory_parse, the audit's parser - and is replayed through a
 *      fresh guard with the audit's sequence of calls (replay_turn), then
 *      the coming model request is counted (ag_guard_begin_iteration);
 *   3. a stop there is answered without tool calls: directly (a synthetic
 *      chat.completion whose message says why), or, with
 *      loop.final_request_without_tools, by the upstream asked without
 *      tools and told to answer with what it has;
 *   4. otherwise the body goes upstream unchanged; the reply is read with
 *      the OpenAI provider's own parser (ag__openai_response) and its tool
 *      calls checked (ag_guard_check_calls): a stop replaces it, a nudge
 *      asks the upstream once more with the held-back calls answered by
 *      the nudge text.
 * Every stop sets `x-agentguard-stop: REASON` and writes an event.
 *
 * Serving: event loops, two per core (shard: a libmicrohttpd daemon run
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
#include "agentguard/proxy.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <jansson.h>
#include <microhttpd.h>
#include <openssl/crypto.h>

#include "../audit/internal.h"
#include "../core/internal.h"
#include "budget.h"
#include "conns.h"
#include "relay.h"
#include "target.h"
#include "../wire/wire.h"
#include "agentguard/audit.h"
#include "agentguard/providers.h"

#define FINAL_INSTRUCTION                                                      \
  "The tool loop was stopped by agentguard (%s: %s). Do not call tools. "      \
  "Answer now with what you have: say what you found, what is left, and why "  \
  "you stopped."
#define ERR_MSG_MAX 1024

/* Idle upstream connections kept by the relay (each one saves a new
 * connection, and against a real API a TLS handshake, for the next
 * request). */
#define UP_POOL_MAX 64

/* The stack of a request's thread (job_main): the deepest is a decision's
 * replay and a reply's check, well under this; ASan builds need more. */
#define JOB_STACK (2u << 20)

/* One event loop: a libmicrohttpd daemon and the relay whose thread runs
 * it (and the transfers of its connections' streams). */
typedef struct chunk_tape chunk_tape;

typedef struct shard {
  struct ag_proxy *p;
  struct MHD_Daemon *d;
  ag__relay *relay;
  chunk_tape *ct; /* the loop's scratch for text chunks, or NULL */
} shard;

/* Event loops: two per core (start_shards), at most SHARDS_MAX, so that
 * relaying uses every core; a connection stays with the loop that
 * accepted it. Two rather than one: a loop waiting for the CPU (behind
 * another process, or its own long round) holds up only its own streams,
 * and libmicrohttpd walks every suspended connection of a daemon each time
 * one is resumed (0.9.75: about 9% of a loop's CPU with 500 streams
 * waiting on it), so fewer per loop cost less. Measured on 2 cores, 1,000
 * streams: added p99 per chunk 0.29-3.81 ms (median 0.61) with four
 * loops, 0.37-3.71 (median 1.16) with two (docs/benchmarks.md). */
#define SHARDS_MAX 8
#define SHARDS_PER_CORE 2

/* Connections a loop takes past --max-connections, to answer them with a
 * 503 (on_connection) rather than leave them in the listening socket's
 * queue, as libmicrohttpd does at its own limit. */
#define CONN_SLACK 16u

struct ag_proxy {
  shard sh[SHARDS_MAX];
  unsigned n_sh;
  unsigned max_conns;      /* --max-connections, over every loop */
  unsigned per_client;     /* --max-connections-per-client */
  ag__conns *conns;        /* every client connection (conns.h) */
  atomic_llong next_sweep; /* when a loop next sweeps conns (mono_ms) */
  ag__budget *budget;      /* bytes of bodies held whole (budget.h) */
  pthread_mutex_t jobs_mu; /* the requests' threads (worker_main) */
  pthread_cond_t jobs_cv;  /* jobs or workers down to 0 */
  pthread_cond_t work_cv;  /* a request queued for an idle worker */
  struct req_ctx *queue, *queue_tail;
  unsigned queued, idle, workers;
  unsigned spawning; /* workers made that have not taken a request yet */
  bool quit;         /* the workers end */
  unsigned jobs;     /* request threads running */
  bool stopping;     /* under jobs_mu: ag_proxy_stop has begun */
  CURLU *up;         /* the upstream's URL, credentials included */
  char *up_path;     /* its path, without a trailing slash ("" for none) */
  bool upstream_v1;  /* up_path ends in "/v1" */
  char *up_shown;    /* scheme://host:port: what messages name, never
                        credentials */
  /* what no text of the proxy's may show (scrub): the secret values of the
   * environment at start, and the upstream's user and password */
  ag__secret secrets[AG__SECRETS_MAX];
  size_t n_secrets;
  char *secret_buf;
  ag_config cfg;
  size_t max_body;
  char *client_key;
  FILE *events;
  pthread_mutex_t ev_mu;
  int64_t timeout_ms;
  uint16_t port;
  atomic_ulong ids;
};

/* What goes back to the client. */
typedef struct reply {
  unsigned status;
  char *body; /* owned */
  size_t len;
  ag__budget *bud; /* `held` bytes of it are taken from bud (budget.h) */
  size_t held;
  const char *ctype;          /* static */
  struct curl_slist *headers; /* "Name: value" from the upstream, or NULL */
  const char *stop;           /* x-agentguard-stop, or NULL */
  bool anthropic;             /* errors in Anthropic's shape (/v1/messages) */
  bool close;                 /* the connection is closed after it */
} reply;

/* One request: read, then answered by its own thread (job_main) while
 * the connection is suspended, then sent. */
typedef struct req_ctx {
  char *uri; /* as the client sent it: path and query */
  char *body;
  size_t len, cap;
  bool too_big;
  bool begun;                /* the handler has seen the headers */
  ag__conn *conn;            /* its connection's entry (conns.h), or NULL */
  ag__conn_refusal too_many; /* its connection is refused a slot */
  /* from the handler's last call on: */
  bool job;                 /* the request went to a worker */
  struct req_ctx *next_job; /* in the workers' queue */
  atomic_bool answered;     /* it has set `r` or `st` */
  shard *sh;                /* the connection's loop */
  struct MHD_Connection *c;
  struct curl_slist *client_hdrs; /* the client's headers, hop-by-hop out */
  int client_fd; /* its socket, watched while it is suspended (on_progress) */
  char *method;
  reply r;              /* the answer, unless `st` */
  struct stream_st *st; /* a relayed stream, or NULL */
} req_ctx;

/* ------------------------------------------------------------------------ */
/* Small helpers                                                            */
/* ------------------------------------------------------------------------ */

static char *dupz(const char *s) {
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

static void set_json(reply *r, unsigned status, json_t *o) {
  reply_drop_body(r);
  r->status = status;
  r->ctype = "application/json";
  r->body = o != NULL ? json_dumps(o, JSON_COMPACT) : NULL;
  r->len = r->body != NULL ? strlen(r->body) : 0;
  json_decref(o);
  if (r->body == NULL) {
    r->status = 500;
    r->body = dupz("{\"error\":{\"message\":\"out of memory\",\"type\":"
                   "\"server_error\",\"code\":\"out_of_memory\"}}");
    r->len = r->body != NULL ? strlen(r->body) : 0;
  }
}

/* An error in OpenAI's shape: {"error":{"message","type","param","code"}}. */
static void set_error(reply *r, unsigned status, const char *type,
                      const char *code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 5, 6)))
#endif
    ;
static void set_error(reply *r, unsigned status, const char *type,
                      const char *code, const char *fmt, ...) {
  char msg[ERR_MSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (r->anthropic) {
    /* {"type":"error","error":{"type","message"}}; the code joins the
     * message, Anthropic's errors have no code field */
    const char *at = status == 401   ? "authentication_error"
                     : status == 413 ? "request_too_large"
                     : status < 500  ? "invalid_request_error"
                                     : "api_error";
    char full[ERR_MSG_MAX + 64];
    snprintf(full, sizeof full, "%s [%s]", msg, code);
    set_json(r, status,
             json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type",
                       at, "message", full));
    return;
  }
  set_json(r, status,
           json_pack("{s:{s:s, s:s, s:n, s:s}}", "error", "message", msg,
                     "type", type, "param", "code", code));
}

static ag_err_t fail(ag_error_t *err, ag_err_t code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

static void reply_free(reply *r) {
  reply_drop_body(r);
  curl_slist_free_all(r->headers);
  memset(r, 0, sizeof(*r));
}

static int64_t mono_ms(void) {
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
static const char *scrub(const ag_proxy *p, const char *in, char *out,
                         size_t cap) {
  size_t len = strlen(in);
  if (!ag__redact_needed(in, len, p->secrets, p->n_secrets))
    return in;
  ag__redact(in, len, p->secrets, p->n_secrets, out, cap);
  return out;
}

/* One event line: {"event":"proxy_decision","ts_ms",...}. Never holds a
 * header: credentials cannot reach the log. */
static void event(ag_proxy *p, const char *decision, const char *path,
                  const ag_verdict *v, const char *detail) {
  if (p->events == NULL)
    return;
  json_t *o =
      json_pack("{s:s, s:I, s:s, s:s}", "event", "proxy_decision", "ts_ms",
                (json_int_t)wall_ms(), "decision", decision, "path", path);
  if (o == NULL)
    return;
  if (v != NULL) {
    json_object_set_new(o, "action",
                        json_string(v->action == AG_ESCALATE ? "escalate"
                                    : v->action == AG_NUDGE  ? "nudge"
                                                             : "stop"));
    json_object_set_new(o, "reason", json_string(ag_reason_name(v->reason)));
    char red[AG_VERDICT_MSG_MAX + AG_VERDICT_MSG_MAX / 4 + 16];
    json_object_set_new(o, "message",
                        json_string(scrub(p, v->message, red, sizeof red)));
    if (v->tool[0] != '\0')
      json_object_set_new(o, "tool", json_string(v->tool));
  }
  if (detail != NULL) {
    char red[ERR_MSG_MAX + ERR_MSG_MAX / 4 + 16];
    json_object_set_new(o, "detail",
                        json_string(scrub(p, detail, red, sizeof red)));
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

/* ------------------------------------------------------------------------ */
/* The upstream (libcurl)                                                   */
/* ------------------------------------------------------------------------ */

typedef struct upstream {
  long status;
  char *body;
  size_t len, cap;
  bool too_big;
  struct curl_slist *headers; /* the final response's, hop-by-hop removed */
  bool hdr_end;               /* the final response's headers are in */
  CURLcode cc;
  char errbuf[CURL_ERROR_SIZE];
  /* the socket of the client waiting for this transfer while its
   * connection is suspended, watched by on_progress; -1: none */
  int client_fd;
  bool client_left; /* it closed: the transfer was ended for that */
  /* the body's bytes taken from the budget (budget.h): `held`; when the
   * budget is spent, a transfer run by send_upstream pauses with `want`
   * set and its thread waits for the bytes (sync); any other one ends
   * with `no_budget` */
  ag__budget *bud;
  size_t held, want;
  struct sync_run *sync;
  bool no_budget;
} upstream;

/* A transfer run to its end for a thread that waits (send_upstream): its
 * done, and a paused body's wait for the budget, handed to that thread. */
typedef struct sync_run {
  ag__relay_xfer x;
  ag__relay_op op; /* the unpause once the budget's bytes are taken */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool done, op_out;
  CURLcode cc;
} sync_run;

/* Bodies take the budget in steps of this many bytes. */
#define BUDGET_STEP (64u << 10)

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
                                         "x-agentguard-key"};

static bool is_hop(const char *name, size_t n) {
  for (size_t i = 0; i < sizeof(hop_by_hop) / sizeof(hop_by_hop[0]); i++)
    if (strlen(hop_by_hop[i]) == n && strncasecmp(name, hop_by_hop[i], n) == 0)
      return true;
  return false;
}

static size_t on_body(char *ptr, size_t size, size_t nmemb, void *user) {
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

static size_t on_header(char *ptr, size_t size, size_t nmemb, void *user) {
  upstream *u = user;
  size_t n = size * nmemb;
  if (n >= 5 && memcmp(ptr, "HTTP/", 5) == 0) {
    /* a new response (after a 100 Continue): its headers only */
    curl_slist_free_all(u->headers);
    u->headers = NULL;
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
  char line[8192];
  if (l >= sizeof line)
    return n; /* an absurd header is dropped, not truncated */
  memcpy(line, ptr, l);
  line[l] = '\0';
  struct curl_slist *s = curl_slist_append(u->headers, line);
  if (s != NULL)
    u->headers = s;
  return n;
}

typedef struct hdr_walk {
  struct curl_slist *list;
  bool failed;
} hdr_walk;

static enum MHD_Result collect_header(void *cls, enum MHD_ValueKind kind,
                                      const char *key, const char *value) {
  (void)kind;
  hdr_walk *w = cls;
  if (key == NULL || is_hop(key, strlen(key)))
    return MHD_YES;
  if (value == NULL)
    value = "";
  size_t n = strlen(key) + strlen(value) + 3;
  char *line = malloc(n);
  if (line == NULL) {
    w->failed = true;
    return MHD_NO;
  }
  snprintf(line, n, "%s: %s", key, value);
  struct curl_slist *s = curl_slist_append(w->list, line);
  free(line);
  if (s == NULL) {
    w->failed = true;
    return MHD_NO;
  }
  w->list = s;
  return MHD_YES;
}

/* The client's headers, hop-by-hop ones removed; false when out of
 * memory. Read once, on the connection's thread. */
static bool client_headers(struct MHD_Connection *c, struct curl_slist **out) {
  hdr_walk w = {NULL, false};
  MHD_get_connection_values(c, MHD_HEADER_KIND, collect_header, &w);
  if (w.failed) {
    curl_slist_free_all(w.list);
    return false;
  }
  *out = w.list;
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

/* libcurl's progress callback, on the relay's thread: on every read and,
 * while the upstream is silent, about once a second. A client that has
 * left ends the transfer (and so frees its worker, its slot and its
 * upstream connection) instead of leaving it to wait for the upstream or
 * the transfer's time limit. libmicrohttpd does not watch a suspended
 * connection's socket, so this does. */
static int on_progress(void *user, curl_off_t dltotal, curl_off_t dlnow,
                       curl_off_t ultotal, curl_off_t ulnow) {
  (void)dltotal, (void)dlnow, (void)ultotal, (void)ulnow;
  upstream *u = user;
  if (u->client_fd < 0 || !peer_gone(u->client_fd))
    return 0;
  u->client_left = true;
  return 1; /* CURLE_ABORTED_BY_CALLBACK */
}

/* The URL of a request upstream, from parts (libcurl's URL API): the
 * upstream's scheme, host, port and credentials, never the client's; the
 * upstream's path followed by the client's (`target`, normalised by
 * ag__target_normalise in the handler: origin-form, so it cannot name
 * another host), and the client's query. A "/v1/" the upstream's path
 * already ends with is not doubled. NULL when out of memory. */
static char *upstream_url(const ag_proxy *p, const char *target) {
  const char *path = target;
  if (p->upstream_v1 && strncmp(path, "/v1/", 4) == 0)
    path += 3;
  size_t pl = strcspn(path, "?");
  size_t bl = strlen(p->up_path);
  CURLU *cu = curl_url_dup(p->up);
  char *full = malloc(bl + pl + 1);
  char *got = NULL, *url = NULL;
  if (cu != NULL && full != NULL) {
    memcpy(full, p->up_path, bl);
    memcpy(full + bl, path, pl);
    full[bl + pl] = '\0';
    if (curl_url_set(cu, CURLUPART_PATH, full, 0) == CURLUE_OK &&
        curl_url_set(cu, CURLUPART_QUERY,
                     path[pl] == '?' && path[pl + 1] != '\0' ? path + pl + 1
                                                             : NULL,
                     0) == CURLUE_OK &&
        curl_url_get(cu, CURLUPART_URL, &got, 0) == CURLUE_OK)
      url = dupz(got);
  }
  curl_free(got);
  free(full);
  curl_url_cleanup(cu);
  return url;
}

/* Sets `h` up for a transfer to the upstream with the client's headers
 * `ch` (credentials go as they came). `json_body`: the body is ours
 * (rewritten), sent as application/json. false when out of memory; the
 * caller frees *hdrs and *url after the transfer. */
static bool upstream_handle(ag_proxy *p, const struct curl_slist *ch, CURL *h,
                            const char *method, const char *uri,
                            const char *body, size_t len, bool json_body,
                            int client_fd, upstream *u,
                            struct curl_slist **hdrs, char **url) {
  memset(u, 0, sizeof(*u));
  u->cc = CURLE_OUT_OF_MEMORY;
  u->client_fd = client_fd;
  u->bud = p->budget;
  *url = upstream_url(p, uri);
  struct curl_slist *list = NULL;
  bool failed = false;
  for (; ch != NULL && !failed; ch = ch->next) {
    struct curl_slist *s = curl_slist_append(list, ch->data);
    failed = s == NULL;
    if (s != NULL)
      list = s;
  }
  if (json_body && !failed) {
    struct curl_slist *s = curl_slist_append(list, "Content-Type: "
                                                   "application/json");
    failed = s == NULL;
    if (s != NULL)
      list = s;
  }
  if (!failed) {
    /* no "Expect: 100-continue" wait, no compressed body to read */
    struct curl_slist *s = curl_slist_append(list, "Expect:");
    failed = s == NULL;
    if (s != NULL)
      list = s;
  }
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
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, u);
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, u);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, u->errbuf);
  curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
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

/* The relay of the request this thread serves (job_main): its transfers
 * run in its loop, whose connection cache its client's earlier requests
 * filled. */
static _Thread_local ag__relay *tl_relay;

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

/* One whole request upstream (see upstream_handle), run on the relay while
 * this thread waits. */
static void send_upstream(ag_proxy *p, const struct curl_slist *ch,
                          const char *method, const char *uri, const char *body,
                          size_t len, bool json_body, int client_fd,
                          upstream *u) {
  struct curl_slist *hdrs = NULL;
  char *url = NULL;
  CURL *h = curl_easy_init();
  if (h == NULL) {
    memset(u, 0, sizeof(*u));
    u->cc = CURLE_OUT_OF_MEMORY;
    return;
  }
  if (upstream_handle(p, ch, h, method, uri, body, len, json_body, client_fd, u,
                      &hdrs, &url)) {
    u->cc = sync_run_xfer(tl_relay != NULL ? tl_relay : p->sh[0].relay, h, u);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &u->status);
  }
  curl_easy_cleanup(h);
  curl_slist_free_all(hdrs);
  free(url);
}

static void upstream_free(upstream *u) {
  ag__budget_release(u->bud, u->held, 0);
  free(u->body);
  curl_slist_free_all(u->headers);
  memset(u, 0, sizeof(*u));
}

/* A failed transfer as a 502, else false. */
static bool upstream_failed(ag_proxy *p, const upstream *u, reply *r) {
  if (u->no_budget) {
    set_error(r, 503, "server_error", "proxy_memory_full",
              "agentguard proxy: the replies held whole take all of "
              "--max-buffered; ask again");
    return true;
  }
  if (u->too_big) {
    set_error(r, 502, "upstream_error", "upstream_too_large",
              "agentguard proxy: the upstream's response is larger than %u "
              "bytes",
              (unsigned)AG_PROXY_UPSTREAM_MAX);
    return true;
  }
  if (u->cc == CURLE_OK)
    return false;
  char why[CURL_ERROR_SIZE + 64];
  set_error(r, 502, "upstream_error", "upstream_unreachable",
            "agentguard proxy: the upstream %s did not answer: %s", p->up_shown,
            scrub(p,
                  u->errbuf[0] != '\0' ? u->errbuf : curl_easy_strerror(u->cc),
                  why, sizeof why));
  return true;
}

/* The upstream's answer as it came: status, headers, body. */
static void pass_back(upstream *u, reply *r) {
  r->status = (unsigned)u->status;
  r->body = u->body;
  r->len = u->len;
  r->headers = u->headers;
  r->ctype = NULL;
  r->bud = u->bud;
  r->held = u->held;
  u->body = NULL;
  u->headers = NULL;
  u->held = 0;
}

/* ------------------------------------------------------------------------ */
/* The replay: the turn through a fresh guard, as ag_auditor_run does it    */
/* ------------------------------------------------------------------------ */

static const char *role_of(const json_t *m) {
  return json_string_value(json_object_get(m, "role"));
}

/*
 * The turn msgs[start..n) as a hand-built ag_trajectory (audit.h allows
 * them), read straight from the parsed request: no second parse. Only the
 * plain shape every client sends is taken: assistant content a string or
 * null, tool calls with string ids, names and arguments; tool messages with
 * a string tool_call_id and content, is_error absent or boolean; system
 * and developer messages; no "usage". Anything else, and every broken turn,
 * returns 0: the caller then uses ag_trajectory_parse, whose reading (and
 * error message) is the audit's. On this shape both give the same steps
 * (test_proxy's parity test replays both). Returns 1 and fills *t (free
 * t->turns' arrays with fast_free), or 0, or -1 when out of memory.
 */
typedef struct fast_traj {
  ag_trajectory t;
  ag_traj_turn turn;
  ag_traj_step *steps;
  ag_traj_call *calls;
  ag_traj_result *results;
  const char **ids;
  bool *answered;
  char **owned; /* strings made for the turn (Anthropic's), n_owned */
  size_t n_owned;
} fast_traj;

static void fast_free(fast_traj *f) {
  free(f->steps);
  free(f->calls);
  free(f->results);
  free(f->ids);
  free(f->answered);
  for (size_t i = 0; i < f->n_owned; i++)
    free(f->owned[i]);
  free(f->owned);
}

/* Zeroes `f` and sizes its arrays for a turn of n_steps replies and n_calls
 * calls: 0, or -1 (out of memory, nothing kept). */
static int t_alloc(fast_traj *f, size_t n_steps, size_t n_calls) {
  memset(f, 0, sizeof(*f));
  f->steps = calloc(n_steps + 1, sizeof(*f->steps));
  f->calls = calloc(n_calls + 1, sizeof(*f->calls));
  f->results = calloc(n_calls + 1, sizeof(*f->results));
  f->ids = calloc(n_calls + 1, sizeof(*f->ids));
  f->answered = calloc(n_calls + 1, sizeof(*f->answered));
  if (f->steps == NULL || f->calls == NULL || f->results == NULL ||
      f->ids == NULL || f->answered == NULL) {
    fast_free(f);
    return -1;
  }
  return 0;
}

/* The result slot of the step's call (calls step0..ci) whose id is `id`,
 * marked answered; NULL when no call of the step has it or it was answered
 * already (the caller then takes the slow path). */
static ag_traj_result *t_answer(fast_traj *f, size_t step0, size_t ci,
                                const char *id) {
  size_t q = step0;
  while (q < ci && strcmp(f->ids[q], id) != 0)
    q++;
  if (q == ci || f->answered[q])
    return NULL;
  f->answered[q] = true;
  return &f->results[q];
}

/* Makes `f` the one-turn trajectory of its si steps and ci calls. */
static void t_done(fast_traj *f, size_t si, size_t ci) {
  f->turn.steps = f->steps;
  f->turn.n_steps = si;
  f->turn.t_start_ms = -1;
  f->t.format = AG_TRAJ_CHAT;
  f->t.turns = &f->turn;
  f->t.n_turns = 1;
  f->t.n_steps = si;
  f->t.n_calls = ci;
}

/* A new step whose calls and results start at call ci, untimed. */
static void t_step(ag_traj_step *st, fast_traj *f, size_t ci) {
  st->tokens = -1;
  st->t_request_ms = st->t_response_ms = st->t_done_ms = -1;
  st->calls = &f->calls[ci];
  st->results = &f->results[ci];
}

static int fast_turn(const json_t *msgs, size_t start, fast_traj *f) {
  memset(f, 0, sizeof(*f));
  size_t n = json_array_size(msgs), n_calls = 0, n_steps = 0;
  for (size_t i = start; i < n; i++) {
    const json_t *m = json_array_get(msgs, i);
    if (strcmp(role_of(m), "assistant") == 0) {
      n_steps++;
      n_calls += json_array_size(json_object_get(m, "tool_calls"));
    }
  }
  if (t_alloc(f, n_steps, n_calls) < 0)
    return -1;
  size_t si = 0, ci = 0, step0 = 0; /* step0: first call of the step */
  bool in_step = false;
  for (size_t i = start; i < n; i++) {
    const json_t *m = json_array_get(msgs, i);
    const char *role = role_of(m);
    if (json_object_get(m, "usage") != NULL)
      goto slow;
    if (strcmp(role, "assistant") == 0) {
      for (size_t k = step0; in_step && k < ci; k++)
        if (!f->answered[k])
          goto slow;
      const json_t *content = json_object_get(m, "content");
      const json_t *tcs = json_object_get(m, "tool_calls");
      if ((!json_is_string(content) && !json_is_null(content)) ||
          json_object_get(m, "function_call") != NULL ||
          (tcs != NULL && !json_is_null(tcs) && !json_is_array(tcs)))
        goto slow;
      ag_traj_step *st = &f->steps[si++];
      in_step = true;
      step0 = ci;
      st->text = json_is_string(content) ? json_string_value(content) : "";
      st->text_len = json_is_string(content) ? json_string_length(content) : 0;
      t_step(st, f, ci);
      size_t k;
      const json_t *tc;
      json_array_foreach(tcs, k, tc) {
        const json_t *fn = json_object_get(tc, "function");
        const json_t *id = json_object_get(tc, "id");
        const json_t *name = json_object_get(fn, "name");
        const json_t *args = json_object_get(fn, "arguments");
        if (!json_is_string(id) || !json_is_string(name) ||
            !json_is_string(args))
          goto slow;
        for (size_t q = step0; q < ci; q++)
          if (strcmp(f->ids[q], json_string_value(id)) == 0)
            goto slow; /* a repeated id */
        f->ids[ci] = json_string_value(id);
        f->calls[ci].name = json_string_value(name);
        f->calls[ci].args = json_string_value(args);
        f->calls[ci].args_len = json_string_length(args);
        f->results[ci].text = "";
        ci++;
      }
      st->n_calls = st->n_results = ci - step0;
    } else if (strcmp(role, "tool") == 0) {
      const json_t *id = json_object_get(m, "tool_call_id");
      const json_t *content = json_object_get(m, "content");
      const json_t *ie = json_object_get(m, "is_error");
      if (!in_step || !json_is_string(id) || !json_is_string(content) ||
          (ie != NULL && !json_is_boolean(ie)))
        goto slow;
      ag_traj_result *res = t_answer(f, step0, ci, json_string_value(id));
      if (res == NULL)
        goto slow;
      res->outcome = json_is_true(ie) ? AG_OUTCOME_ERROR : AG_OUTCOME_OK;
      res->category = AG_CAT_AUTO;
      res->text = json_string_value(content);
      res->text_len = json_string_length(content);
    } else if (strcmp(role, "user") == 0) {
      if (i != start)
        goto slow;
    } else if (strcmp(role, "system") != 0 && strcmp(role, "developer") != 0) {
      goto slow;
    }
  }
  for (size_t k = step0; in_step && k < ci; k++)
    if (!f->answered[k])
      goto slow;
  t_done(f, si, ci);
  return 1;
slow:
  fast_free(f);
  return 0;
}

/* The trajectory `f` replayed (then freed): the action, or -2. */
static int replay_fast(ag_guard *g, fast_traj *f, ag_verdict *v) {
  int act = ag__replay_untimed(g, &f->t, v);
  fast_free(f);
  return act < 0 ? -2 : act;
}

static int replay_slow(ag_guard *g, const json_t *msgs, size_t start,
                       size_t shown, ag_verdict *v, char *emsg, size_t cap);

/*
 * Replays the turn of `msgs` (the last user message and what follows)
 * through `g`. Returns the action (v filled), or -1 with a 400 message in
 * `emsg` when the turn cannot be read, or -2 when out of memory. `shown`:
 * the index the turn's first message has in the client's own messages, for
 * that message, or SIZE_MAX: its index in `msgs`.
 */
static int replay_turn(ag_guard *g, const json_t *msgs, size_t shown,
                       ag_verdict *v, char *emsg, size_t cap) {
  size_t n = json_array_size(msgs), start = 0;
  for (size_t i = n; i-- > 0;)
    if (strcmp(role_of(json_array_get(msgs, i)), "user") == 0) {
      start = i;
      break;
    }
  bool has_steps = false;
  for (size_t i = start; i < n && !has_steps; i++)
    has_steps = strcmp(role_of(json_array_get(msgs, i)), "assistant") == 0;
  memset(v, 0, sizeof(*v));
  v->call_index = -1;
  ag_guard_begin_turn(g, 0);
  if (!has_steps)
    return AG_ALLOW;
  fast_traj f;
  int fr = fast_turn(msgs, start, &f);
  if (fr < 0)
    return -2;
  if (fr > 0)
    return replay_fast(g, &f, v);
  return replay_slow(g, msgs, start, shown == SIZE_MAX ? start : shown, v, emsg,
                     cap);
}

/* The turn msgs[start..] written out and read by ag_trajectory_parse, the
 * audit's parser (whose error message a broken turn gets), then replayed. */
static int replay_slow(ag_guard *g, const json_t *msgs, size_t start,
                       size_t shown, ag_verdict *v, char *emsg, size_t cap) {
  size_t n = json_array_size(msgs);
  json_t *turn = json_array();
  int rc = -2;
  if (turn == NULL)
    return rc;
  for (size_t i = start; i < n; i++)
    if (json_array_append(turn, json_array_get(msgs, i)) != 0)
      goto out;
  char *text = json_dumps(turn, JSON_COMPACT);
  if (text == NULL)
    goto out;
  ag_traj_opts o;
  ag_traj_opts_init(&o);
  o.format = AG_TRAJ_CHAT;
  ag_trajectory *t = NULL;
  ag_error_t err;
  ag_err_t pr = ag_trajectory_parse(&t, text, strlen(text), &o, &err);
  free(text);
  if (pr == AG_ENOMEM)
    goto out;
  if (pr != AG_OK) {
    snprintf(emsg, cap,
             "messages: the turn (messages[%zu..], numbered from there) is not "
             "a tool conversation agentguard can read: %s",
             shown, err.msg);
    rc = -1;
    goto out;
  }
  rc = ag__replay_untimed(g, t, v);
  if (rc < 0)
    rc = -2;
  ag_trajectory_free(t);
out:
  json_decref(turn);
  return rc;
}

/* ------------------------------------------------------------------------ */
/* Chat Completions                                                         */
/* ------------------------------------------------------------------------ */

static void stop_text(const ag_verdict *v, char *buf, size_t cap) {
  size_t ml = strlen(v->message);
  const char *dot =
      ml > 0 && strchr(".!?", v->message[ml - 1]) == NULL ? "." : "";
  const char *sp = v->suggestion != NULL ? " " : "";
  const char *sg = v->suggestion != NULL ? v->suggestion : "";
  if (v->action == AG_ESCALATE)
    snprintf(buf, cap,
             "agentguard paused this turn and needs you (%s): %s%s%s%s Reply "
             "to say how to go on.",
             ag_reason_name(v->reason), v->message, dot, sp, sg);
  else
    snprintf(buf, cap, "agentguard stopped this turn (%s): %s%s%s%s",
             ag_reason_name(v->reason), v->message, dot, sp, sg);
}

/* ---- Server-Sent Events for stream: true ------------------------------ */

#define SSE_OUT_MAX (8u << 20) /* bytes queued for the client at once */

typedef struct sbuf {
  char *p;
  size_t len, cap;
  bool failed;
} sbuf;

static void sb_add(sbuf *b, const char *s, size_t n) {
  if (b->failed)
    return;
  if (b->len + n + 1 > SSE_OUT_MAX) {
    b->failed = true;
    return;
  }
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 1024;
    while (cap < b->len + n + 1)
      cap *= 2;
    char *g = realloc(b->p, cap);
    if (g == NULL) {
      b->failed = true;
      return;
    }
    b->p = g;
    b->cap = cap;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = '\0';
}

/* One SSE event of `data`: a "data:" line per line of it (the upstream's
 * event may have come in several, which its reader joined with "\n"; one
 * line holding a "\n" would end the event early). */
static void sb_event(sbuf *b, const char *data, size_t n) {
  for (;;) {
    const char *nl = memchr(data, '\n', n);
    size_t k = nl != NULL ? (size_t)(nl - data) : n;
    sb_add(b, "data: ", 6);
    sb_add(b, data, k);
    sb_add(b, "\n", 1);
    if (nl == NULL)
      break;
    data += k + 1;
    n -= k + 1;
  }
  sb_add(b, "\n", 1);
}

static void sb_json(sbuf *b, json_t *o) {
  char *t = o != NULL ? json_dumps(o, JSON_COMPACT) : NULL;
  json_decref(o);
  if (t == NULL) {
    b->failed = true;
    return;
  }
  sb_event(b, t, strlen(t));
  free(t);
}

/* One chat.completion.chunk with `delta` (stolen) and a finish reason. */
static void sb_chunk(sbuf *b, const char *id, const char *model, json_t *delta,
                     const char *finish) {
  sb_json(b, json_pack("{s:s, s:s, s:I, s:s, s:[{s:i, s:o, s:s?}]}", "id", id,
                       "object", "chat.completion.chunk", "created",
                       (json_int_t)time(NULL), "model", model, "choices",
                       "index", 0, "delta", delta, "finish_reason", finish));
}

/* A reply as chunks: its text, its calls (whole), its end, [DONE]. */
static void sb_reply(sbuf *b, const char *id, const char *model,
                     const char *text, const ag_reply *rep,
                     const char *finish) {
  sb_chunk(b, id, model,
           json_pack("{s:s, s:s}", "role", "assistant", "content",
                     text != NULL ? text : ""),
           NULL);
  if (rep != NULL && rep->n_calls > 0) {
    json_t *tcs = json_array();
    for (size_t i = 0; tcs != NULL && i < rep->n_calls; i++) {
      const ag_tool_call *tc = &rep->calls[i];
      json_t *one =
          json_pack("{s:i, s:s, s:s, s:{s:s, s:s%}}", "index", (int)i, "id",
                    tc->id, "type", "function", "function", "name", tc->name,
                    "arguments", tc->arguments, tc->arguments_len);
      if (one == NULL || json_array_append_new(tcs, one) != 0)
        b->failed = true;
    }
    sb_chunk(b, id, model,
             tcs != NULL ? json_pack("{s:o}", "tool_calls", tcs) : NULL, NULL);
  }
  sb_chunk(b, id, model, json_object(), finish);
  sb_add(b, "data: [DONE]\n\n", 14);
}

/* `b` as the reply's body (an event stream). */
static void set_sse(reply *r, sbuf *b) {
  if (b->failed) {
    free(b->p);
    set_error(r, 500, "server_error", "out_of_memory", "out of memory");
    return;
  }
  r->status = 200;
  r->ctype = "text/event-stream";
  r->body = b->p;
  r->len = b->len;
}

/* A chat.completion with one assistant message saying why the turn ended. */
static void set_stop_reply(ag_proxy *p, const json_t *req, const ag_verdict *v,
                           reply *r) {
  char text[AG_VERDICT_MSG_MAX * 2 + 128];
  stop_text(v, text, sizeof text);
  char id[64];
  snprintf(id, sizeof id, "chatcmpl-agentguard-%lu",
           (unsigned long)atomic_fetch_add(&p->ids, 1));
  const char *model = json_string_value(json_object_get(req, "model"));
  if (r->anthropic) {
    snprintf(id, sizeof id, "msg_agentguard_%lu",
             (unsigned long)atomic_fetch_add(&p->ids, 1));
    set_json(r, 200,
             json_pack("{s:s, s:s, s:s, s:s, s:[{s:s, s:s}], s:s, s:n, "
                       "s:{s:i, s:i}}",
                       "id", id, "type", "message", "role", "assistant",
                       "model", model != NULL ? model : "agentguard", "content",
                       "type", "text", "text", text, "stop_reason", "end_turn",
                       "stop_sequence", "usage", "input_tokens", 0,
                       "output_tokens", 0));
    if (r->status == 200)
      r->stop = ag_reason_name(v->reason);
    return;
  }
  if (json_is_true(json_object_get(req, "stream"))) {
    sbuf b = {NULL, 0, 0, false};
    sb_reply(&b, id, model != NULL ? model : "agentguard", text, NULL, "stop");
    set_sse(r, &b);
    if (r->status == 200)
      r->stop = ag_reason_name(v->reason);
    return;
  }
  set_json(r, 200,
           json_pack("{s:s, s:s, s:I, s:s, s:[{s:i, s:{s:s, s:s}, s:s}], "
                     "s:{s:i, s:i, s:i}}",
                     "id", id, "object", "chat.completion", "created",
                     (json_int_t)time(NULL), "model",
                     model != NULL ? model : "agentguard", "choices", "index",
                     0, "message", "role", "assistant", "content", text,
                     "finish_reason", "stop", "usage", "prompt_tokens", 0,
                     "completion_tokens", 0, "total_tokens", 0));
  if (r->status == 200)
    r->stop = ag_reason_name(v->reason);
}

/* A copy of the request (shallow at the top) with tools taken away. */
static json_t *without_tools(const json_t *req) {
  json_t *b = json_copy((json_t *)req);
  if (b == NULL)
    return NULL;
  json_object_del(b, "tools");
  json_object_del(b, "tool_choice");
  json_object_del(b, "parallel_tool_calls");
  json_object_del(b, "functions");
  json_object_del(b, "function_call");
  return b;
}

/* The request with `extra` messages appended (new body, caller frees). */
static char *with_messages(const json_t *body, const json_t *extra,
                           size_t *len) {
  json_t *b = json_copy((json_t *)body);
  json_t *m = b != NULL ? json_copy(json_object_get(b, "messages")) : NULL;
  char *text = NULL;
  if (m != NULL && json_array_extend(m, (json_t *)extra) == 0 &&
      json_object_set_new(b, "messages", m) == 0) {
    m = NULL;
    text = json_dumps(b, JSON_COMPACT);
  }
  json_decref(m);
  json_decref(b);
  if (text != NULL)
    *len = strlen(text);
  return text;
}

/* The upstream's reply read by the OpenAI provider's parser. false with a
 * 502 in `r` when it is not a Chat Completions response. */
static bool read_reply(upstream *u, ag_reply *out, reply *r) {
  ag_provider_error perr;
  memset(&perr, 0, sizeof perr);
  ag__asm a;
  ag__asm_init(&a, NULL, NULL, &perr, "upstream");
  /* the parse holds about twice the body again (jansson's tree, the text
   * copied out of it into `out`): taken from the budget with the body and
   * given back with it (this is a request's thread: it may wait) */
  size_t parse = u->bud != NULL ? 2 * u->len : 0;
  if (parse > 0) {
    ag__budget_wait(u->bud, parse, u->held);
    u->held += parse;
  }
  if (r->anthropic)
    ag__anthropic_response(&a, u->body != NULL ? u->body : "", u->len);
  else
    ag__openai_response(&a, u->body != NULL ? u->body : "", u->len);
  ag_err_t rc = a.failed != AG_OK ? a.failed : ag__asm_finish(&a, out);
  ag__asm_free(&a);
  if (rc == AG_OK)
    return true;
  ag_reply_clear(out);
  set_error(r, 502, "upstream_error", "upstream_bad_reply",
            "agentguard proxy: the upstream's reply is not a %s response: %s",
            r->anthropic ? "Messages" : "Chat Completions",
            rc == AG_EPROVIDER ? perr.message : ag_strerror(rc));
  return false;
}

/* The final request without tools: the reply, tool calls stripped. */
static void final_without_tools(ag_proxy *p, const struct curl_slist *hdrs,
                                const char *uri, int client_fd,
                                const json_t *req, const ag_verdict *v,
                                reply *r) {
  json_t *b = without_tools(req);
  const bool stream =
      !r->anthropic && json_is_true(json_object_get(req, "stream"));
  if (b != NULL && (stream || r->anthropic)) {
    /* asked whole; the client still gets a stream */
    json_object_set_new(b, "stream", json_false());
    json_object_del(b, "stream_options");
  }
  char note[AG_VERDICT_MSG_MAX + 256];
  snprintf(note, sizeof note, FINAL_INSTRUCTION, ag_reason_name(v->reason),
           v->message);
  json_t *extra = json_pack("[{s:s, s:s}]", "role", "user", "content", note);
  size_t len = 0;
  char *body =
      b != NULL && extra != NULL ? with_messages(b, extra, &len) : NULL;
  json_decref(b);
  json_decref(extra);
  if (body == NULL) {
    set_error(r, 500, "server_error", "out_of_memory", "out of memory");
    return;
  }
  upstream u;
  send_upstream(p, hdrs, "POST", uri, body, len, true, client_fd, &u);
  free(body);
  if (upstream_failed(p, &u, r)) {
    upstream_free(&u);
    return;
  }
  if (u.status < 200 || u.status >= 300) {
    pass_back(&u, r);
    upstream_free(&u);
    return;
  }
  json_t *j = json_loadb(u.body != NULL ? u.body : "", u.len, 0, NULL);
  if (r->anthropic) {
    json_t *content = json_object_get(j, "content");
    if (!json_is_array(content)) {
      json_decref(j);
      set_error(r, 502, "upstream_error", "upstream_bad_reply",
                "agentguard proxy: the upstream's reply is not a Messages "
                "response: no content array");
      upstream_free(&u);
      return;
    }
    for (size_t k = json_array_size(content); k-- > 0;) {
      const char *bt = json_string_value(
          json_object_get(json_array_get(content, k), "type"));
      if (bt != NULL && strcmp(bt, "tool_use") == 0)
        json_array_remove(content, k);
    }
    json_object_set_new(j, "stop_reason", json_string("end_turn"));
    set_json(r, 200, j);
    upstream_free(&u);
    if (r->status == 200)
      r->stop = ag_reason_name(v->reason);
    return;
  }
  json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
  json_t *m = json_object_get(ch, "message");
  if (!json_is_object(m)) {
    json_decref(j);
    set_error(r, 502, "upstream_error", "upstream_bad_reply",
              "agentguard proxy: the upstream's reply is not a Chat "
              "Completions response: choices[0].message is missing");
    upstream_free(&u);
    return;
  }
  /* A server that ignores the missing tools still gets no call through. */
  json_object_del(m, "tool_calls");
  json_object_del(m, "function_call");
  json_object_set_new(ch, "finish_reason", json_string("stop"));
  if (stream) {
    sbuf sb = {NULL, 0, 0, false};
    const char *id = json_string_value(json_object_get(j, "id"));
    const char *model = json_string_value(json_object_get(j, "model"));
    sb_reply(&sb, id != NULL ? id : "chatcmpl-agentguard",
             model != NULL ? model : "agentguard",
             json_string_value(json_object_get(m, "content")), NULL, "stop");
    json_decref(j);
    set_sse(r, &sb);
  } else {
    set_json(r, 200, j);
  }
  upstream_free(&u);
  if (r->status == 200)
    r->stop = ag_reason_name(v->reason);
}

/* Checks a reply: its tokens, text and calls. Returns the action; with
 * AG_NUDGE, checks[i].action says which calls are held back. */
static ag_action check_reply(ag_guard *g, const ag_reply *rep,
                             bool text_checked, ag_call_check *checks,
                             ag_verdict *v) {
  if (rep->has_usage)
    ag_guard_record_tokens(g, rep->usage.prompt_tokens +
                                  rep->usage.completion_tokens);
  ag_action act = AG_ALLOW;
  if (!text_checked && rep->text != NULL && rep->text[0] != '\0')
    act = ag_guard_check_text(g, rep->text, strlen(rep->text), false, v);
  if (act != AG_ALLOW || rep->n_calls == 0)
    return act;
  ag_call calls[AG__CALLS_MAX];
  for (size_t i = 0; i < rep->n_calls; i++) {
    calls[i].name = rep->calls[i].name != NULL ? rep->calls[i].name : "";
    calls[i].args = rep->calls[i].arguments;
    calls[i].args_len = rep->calls[i].arguments_len;
  }
  act = ag_guard_check_calls(g, calls, rep->n_calls, 0, checks, v);
  if (act != AG_ALLOW)
    return act;
  for (size_t i = 0; i < rep->n_calls; i++)
    if (checks[i].action == AG_NUDGE) {
      v->action = AG_NUDGE;
      v->reason = checks[i].reason;
      v->call_index = (int)i;
      snprintf(v->tool, sizeof v->tool, "%s", calls[i].name);
      snprintf(v->message, sizeof v->message, "%s", checks[i].message);
      return AG_NUDGE;
    }
  return AG_ALLOW;
}

/* The messages that answer the held-back calls with their nudge text. */
static json_t *nudge_messages_anthropic(const ag_reply *rep,
                                        const ag_call_check *checks) {
  json_t *uses = json_array(), *results = json_array();
  json_t *out = NULL;
  for (size_t i = 0; uses != NULL && results != NULL && i < rep->n_calls; i++) {
    if (checks[i].action != AG_NUDGE)
      continue;
    const ag_tool_call *tc = &rep->calls[i];
    json_t *input = json_loadb(tc->arguments, tc->arguments_len, 0, NULL);
    if (!json_is_object(input)) {
      json_decref(input);
      input = json_object();
    }
    if (json_array_append_new(uses, json_pack("{s:s, s:s, s:s, s:o}", "type",
                                              "tool_use", "id", tc->id, "name",
                                              tc->name, "input", input)) != 0 ||
        json_array_append_new(results,
                              json_pack("{s:s, s:s, s:s}", "type",
                                        "tool_result", "tool_use_id", tc->id,
                                        "content", checks[i].message)) != 0)
      goto done;
  }
  if (uses != NULL && results != NULL)
    out = json_pack("[{s:s, s:O}, {s:s, s:O}]", "role", "assistant", "content",
                    uses, "role", "user", "content", results);
done:
  json_decref(uses);
  json_decref(results);
  return out;
}

static json_t *nudge_messages(const ag_reply *rep,
                              const ag_call_check *checks) {
  json_t *tcs = json_array(), *out = json_array();
  if (tcs == NULL || out == NULL)
    goto fail;
  for (size_t i = 0; i < rep->n_calls; i++) {
    if (checks[i].action != AG_NUDGE)
      continue;
    const ag_tool_call *tc = &rep->calls[i];
    json_t *call = json_pack("{s:s, s:s, s:{s:s, s:s%}}", "id", tc->id, "type",
                             "function", "function", "name", tc->name,
                             "arguments", tc->arguments, tc->arguments_len);
    if (call == NULL || json_array_append_new(tcs, call) != 0)
      goto fail;
  }
  json_t *am = json_pack("{s:s, s:O, s:O}", "role", "assistant", "content",
                         json_null(), "tool_calls", tcs);
  if (am == NULL || json_array_append_new(out, am) != 0)
    goto fail;
  for (size_t i = 0; i < rep->n_calls; i++) {
    if (checks[i].action != AG_NUDGE)
      continue;
    json_t *tm = json_pack("{s:s, s:s, s:s}", "role", "tool", "tool_call_id",
                           rep->calls[i].id, "content", checks[i].message);
    if (tm == NULL || json_array_append_new(out, tm) != 0)
      goto fail;
  }
  json_decref(tcs);
  return out;
fail:
  json_decref(tcs);
  json_decref(out);
  return NULL;
}

/* Records the nudged batch (nothing ran: every call skipped) so that the
 * re-asked reply is checked with the nudge already spent. */
static ag_action record_nudged(ag_guard *g, const ag_reply *rep,
                               const ag_call_check *checks, ag_verdict *v) {
  ag_result res[AG__CALLS_MAX];
  for (size_t i = 0; i < rep->n_calls; i++) {
    res[i].name = rep->calls[i].name != NULL ? rep->calls[i].name : "";
    res[i].sig = checks[i].valid ? checks[i].sig : NULL;
    res[i].outcome = AG_OUTCOME_SKIPPED;
    res[i].text = checks[i].message;
    res[i].text_len = strlen(checks[i].message);
    res[i].category = AG_CAT_UNKNOWN;
  }
  ag_action act = ag_guard_record_results(g, res, rep->n_calls, 0, v);
  if (!ag__stops(act))
    act = ag_guard_begin_iteration(g, 0, v);
  return act;
}

/* ---- A streamed reply, relayed ---------------------------------------- */

/*
 * The upstream's stream relayed as it comes: text deltas go to the client
 * at once (after the content-loop detector has seen them); chunks with
 * tool-call fragments, the finish reason or only usage are held until the
 * stream ends and the calls are checked.
 *
 * The request's thread (job_main) decides and starts the transfer on the
 * connection's loop (stream_start), and is done with it. From then on the
 * loop's thread runs the stream, and shares it with other threads only
 * through `mu`:
 * - the transfer's callbacks (relay.c) parse the events, write what the
 *   client gets into `out` and move it to `q` (flush); at the transfer's
 *   end (on_stream_done) the calls are checked and the end is written and
 *   flushed with `finished`, on the same thread - unless the check asks
 *   for a nudge, which waits for the upstream: then a thread of its own
 *   (nudge_main) asks again and writes the end;
 * - the connection's side (libmicrohttpd, run by the same loop) reads `q`
 *   (stream_read); when it is empty it suspends the connection
 *   (`reader_waits`) and a flush resumes it.
 * `out` has one writer at a time: the loop, then the nudge's thread if
 * there is one. The stream is freed when its end (`refs`: the loop's, or
 * the nudge's thread) and the response have let go of it, and no request
 * to the relay is queued (`ops`).
 */
typedef struct stream_st {
  chunk_tape *ct; /* its loop's (fast_chunk), or NULL: every chunk a tree */
  ag_proxy *p;
  shard *sh; /* the connection's loop: it runs the transfer too */
  struct MHD_Connection *c;
  char *uri, *path;
  struct curl_slist *ch; /* the client's headers, for a nudge's request */
  char *body;            /* what goes upstream (CURLOPT_POSTFIELDS) */
  char *orig;            /* the client's request, if not `body`: a nudge's */
  ag_guard *g;
  ag__relay_xfer x; /* the transfer; x.h is its easy handle */
  struct curl_slist *hdrs;
  char *url;
  upstream u;
  ag__sse sse;
  ag__asm asmb;
  ag_provider_error perr;
  bool finished; /* the last bytes are queued */
  /* a passed-through response (relay_start): the upstream's bytes go to
   * the client as they come, whatever its status, with its headers */
  bool raw;
  ag__conn *conn; /* the connection's entry (conns.h), or NULL */
  bool looped;    /* the content-loop detector stopped the reply */
  bool any_text;  /* text was relayed */
  ag_verdict loop_v;
  sbuf out, held;
  char id[96], model[96];
  /* Anthropic: blocks are renumbered for the client (held tool_use blocks
   * take their numbers when released); map[upstream index] is the client's
   * index, -1 while held or unseen */
  bool anth;
  int next_index;
  int map[256];
  json_t *held_ev; /* [[event name, data object], ...] held back */
  /* under mu */
  pthread_mutex_t mu;
  sbuf q; /* for the client, from q_pos on */
  size_t q_pos;
  long status;       /* the upstream's, once its headers are in */
  int answer;        /* 0 not yet, ANSWER_STREAM or ANSWER_REPLY */
  req_ctx *req_q;    /* the request, until it is answered (answer_*) */
  bool up;           /* the transfer has ended (its `done` ran) */
  bool reader_waits; /* the connection is suspended in stream_read */
  bool paused;       /* the transfer is paused: `q` is full */
  bool client_gone;  /* the response was freed */
  bool cut;          /* raw: the transfer broke; the response ends in error */
  bool unpause_queued;
  int refs, ops;
  ag__relay_op op_cancel, op_unpause;
} stream_st;

enum { ANSWER_STREAM = 1, ANSWER_REPLY = 2 };

/* Bytes waiting for the client past which the upstream is paused (it is
 * resumed below half of it), and the most that may wait: one write
 * callback's events past the mark (libcurl hands at most 16 KiB at once;
 * a held reply's calls are capped by AG__CALLS_MAX and AG__CALL_ARGS_MAX
 * but released in the end's flush, which may go past it). */
#define STREAM_Q_HIGH (1u << 20)
#define STREAM_Q_MAX (2u << 20)
/* The same mark for a passed-through body: bytes no reader waits for are
 * held back at the upstream (TCP) instead of here. */
#define RAW_Q_HIGH (128u << 10)

static void stream_destroy(stream_st *st) {
  curl_easy_cleanup(st->x.h);
  curl_slist_free_all(st->hdrs);
  curl_slist_free_all(st->ch);
  free(st->url);
  upstream_free(&st->u);
  ag__sse_free(&st->sse);
  ag__asm_free(&st->asmb);
  free(st->out.p);
  free(st->q.p);
  free(st->held.p);
  json_decref(st->held_ev);
  ag_guard_free(st->g);
  free(st->body);
  free(st->orig);
  free(st->uri);
  free(st->path);
  pthread_mutex_destroy(&st->mu);
  free(st);
}

/* Lets go of one reference (refs) or one finished relay request (ops). */
static void stream_release(stream_st *st, bool ref) {
  pthread_mutex_lock(&st->mu);
  if (ref)
    st->refs--;
  else
    st->ops--;
  bool last = st->refs == 0 && st->ops == 0;
  pthread_mutex_unlock(&st->mu);
  if (last)
    stream_destroy(st);
}

static void on_cancel_taken(void *user) {
  stream_release(user, false);
}

static void on_unpause_taken(void *user) {
  stream_st *st = user;
  pthread_mutex_lock(&st->mu);
  st->unpause_queued = false;
  pthread_mutex_unlock(&st->mu);
  stream_release(st, false);
}

/* The response's free callback: the client has it all, or has gone. A
 * transfer still running is ended. */
static void stream_free(void *cls) {
  stream_st *st = cls;
  if (st == NULL)
    return;
  pthread_mutex_lock(&st->mu);
  st->client_gone = true;
  /* the response exists only once the transfer is on the relay (see
   * answer_stream), and it is freed once: one cancel at most */
  bool cancel = !st->up;
  if (cancel)
    st->ops++;
  pthread_mutex_unlock(&st->mu);
  if (cancel)
    ag__relay_cancel(st->sh->relay, &st->x, &st->op_cancel);
  stream_release(st, true);
}

/* Resumes a suspended connection: libmicrohttpd (run by the relay's
 * thread, without an inter-thread channel of its own) takes it up at the
 * relay's next round, which this wakes. */
static void resume(shard *sh, struct MHD_Connection *c) {
  MHD_resume_connection(c);
  ag__relay_wake(sh->relay);
}

/* Moves what `out` holds to the client's queue (`last`: and it is all),
 * and wakes the connection if it waits. */
static void flush(stream_st *st, bool last) {
  bool wake = false;
  pthread_mutex_lock(&st->mu);
  if (st->out.len > 0) {
    /* what was read goes: q holds only what waits (its cap is on that) */
    if (st->q_pos > 0) {
      memmove(st->q.p, st->q.p + st->q_pos, st->q.len - st->q_pos);
      st->q.len -= st->q_pos;
      st->q_pos = 0;
    }
    if (!last && st->q.len - st->q_pos + st->out.len > STREAM_Q_MAX)
      st->q.failed = true; /* the pause did not hold it back */
    if (last)
      st->q.failed = false; /* the end (an error event, if it failed) */
    sb_add(&st->q, st->out.p, st->out.len);
    if (st->q.failed)
      st->out.failed = true;
    st->out.len = 0;
  }
  if (last)
    st->finished = true;
  if (st->reader_waits && (st->q_pos < st->q.len || st->finished)) {
    st->reader_waits = false;
    wake = true;
  }
  pthread_mutex_unlock(&st->mu);
  /* The connection stays suspended until this call (nobody else resumes
   * it), so it and the stream are still there. */
  if (wake)
    resume(st->sh, st->c);
}

static int fast_chunk(stream_st *st, const char *data, size_t len);
static chunk_tape *chunk_tape_new(void);
static void chunk_tape_free(chunk_tape *ct);

static int on_sse_event(void *user, const char *event_name, const char *data,
                        size_t len, size_t pos) {
  stream_st *st = user;
  if (len == 6 && memcmp(data, "[DONE]", 6) == 0) {
    st->asmb.done = true;
    return 0;
  }
  int fast = fast_chunk(st, data, len);
  if (fast >= 0)
    return fast;
  /* parsed once, for the assembler and for the relay */
  json_t *j = json_loadb(data, len, 0, NULL);
  if (j == NULL) {
    /* not JSON: the assembler's reader says where and why */
    ag__openai_event(&st->asmb, event_name, data, len, pos);
    return 1;
  }
  if (ag__openai_chunk(&st->asmb, j, pos + 6) != 0) {
    json_decref(j);
    return 1;
  }
  if (st->id[0] == '\0') {
    const char *id = json_string_value(json_object_get(j, "id"));
    const char *model = json_string_value(json_object_get(j, "model"));
    snprintf(st->id, sizeof st->id, "%s", id != NULL ? id : "chatcmpl");
    snprintf(st->model, sizeof st->model, "%s",
             model != NULL ? model : "unknown");
  }
  json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
  json_t *d = json_object_get(ch, "delta");
  size_t cl = 0;
  const char *content = ag__jstr(d, "content", &cl);
  json_t *fr = json_object_get(ch, "finish_reason");
  bool hold = ch == NULL ||
              json_array_size(json_object_get(d, "tool_calls")) > 0 ||
              (fr != NULL && !json_is_null(fr));
  if (content != NULL && cl > 0) {
    ag_verdict v;
    if (ag_guard_check_text(st->g, content, cl, true, &v) != AG_ALLOW) {
      st->looped = true;
      st->loop_v = v;
      json_decref(j);
      return 1;
    }
    st->any_text = true;
  }
  if (!hold) {
    sb_event(&st->out, data, len);
  } else {
    if (content != NULL && cl > 0) {
      /* the text now, the rest of the chunk later */
      json_t *now = json_deep_copy(j);
      json_t *nd = json_object_get(
          json_array_get(json_object_get(now, "choices"), 0), "delta");
      json_object_del(nd, "tool_calls");
      json_object_set_new(json_array_get(json_object_get(now, "choices"), 0),
                          "finish_reason", json_null());
      sb_json(&st->out, now);
      json_object_del(d, "content");
    }
    sb_json(&st->held, json_incref(j));
  }
  json_decref(j);
  return st->out.failed || st->held.failed ? 1 : 0;
}

/* The stream's request is answered, on its loop (the transfer's callbacks
 * run there), as soon as the upstream's status is known: with the stream
 * (2xx) or with the upstream's error or failure. The connection is
 * resumed; the handler (send_answer) queues the response. */
static void answer_stream(stream_st *st, req_ctx *q) {
  q->st = st;
  atomic_store(&q->answered, true);
  resume(st->sh, st->c);
}

static void answer_reply(stream_st *st, req_ctx *q, long status) {
  if (status == 0 && (st->u.cc != CURLE_OK || st->u.too_big)) {
    upstream_failed(st->p, &st->u, &q->r);
  } else {
    st->u.status = status;
    if (!upstream_failed(st->p, &st->u, &q->r))
      pass_back(&st->u, &q->r);
  }
  atomic_store(&q->answered, true);
  resume(st->sh, st->c);
}

/* A relayed stream's bytes from the upstream: parsed (the events write
 * what the client gets into `out`) and moved to the client's queue; false
 * when the stream cannot go on (the transfer is then ended). */
static bool stream_feed(stream_st *st, const char *b, size_t n) {
  if (st->raw) {
    sb_add(&st->out, b, n);
    flush(st, false);
    return !st->out.failed;
  }
  ag_err_t why = AG_OK;
  int r = ag__sse_feed(&st->sse, b, n, &why);
  if (r < 0 && st->asmb.failed == AG_OK)
    st->asmb.failed = why;
  flush(st, false);
  return r == 0 && !st->out.failed;
}

static size_t on_stream_body(char *ptr, size_t size, size_t nmemb, void *user) {
  stream_st *st = user;
  long status = 0;
  curl_easy_getinfo(st->x.h, CURLINFO_RESPONSE_CODE, &status);
  if (!st->raw && (status < 200 || status >= 300))
    return on_body(ptr, size, nmemb, &st->u);
  pthread_mutex_lock(&st->mu);
  bool full = st->q.len - st->q_pos > (st->raw ? RAW_Q_HIGH : STREAM_Q_HIGH);
  if (full)
    st->paused = true; /* stream_read asks for the rest when q drains */
  pthread_mutex_unlock(&st->mu);
  if (full)
    return CURL_WRITEFUNC_PAUSE;
  size_t n = size * nmemb;
  return stream_feed(st, ptr, n) ? n : 0;
}

/* The relay's headers: the status is known once they are in. */
static size_t on_stream_header(char *ptr, size_t size, size_t nmemb,
                               void *user) {
  stream_st *st = user;
  size_t n = on_header(ptr, size, nmemb, &st->u);
  if (st->u.hdr_end) {
    long status = 0;
    curl_easy_getinfo(st->x.h, CURLINFO_RESPONSE_CODE, &status);
    if (status >= 200) {
      pthread_mutex_lock(&st->mu);
      req_ctx *q = NULL;
      if (st->status == 0) {
        st->status = status;
        if ((status < 300 || st->raw) && st->answer == 0) {
          st->answer = ANSWER_STREAM;
          st->refs++; /* the response's */
          q = st->req_q;
          st->req_q = NULL;
        }
      }
      pthread_mutex_unlock(&st->mu);
      if (q != NULL) {
        /* libmicrohttpd watches the connection from now on: a client
         * that leaves frees the response (stream_free) */
        st->u.client_fd = -1;
        answer_stream(st, q);
      }
    }
  }
  return n;
}

static void stream_end(stream_st *st);

/* The transfer has ended (on the relay's thread): the last events parsed;
 * then the request answered if it was not yet, or the stream's end
 * written (stream_end). */
static void on_stream_done(ag__relay_xfer *x, CURLcode cc) {
  stream_st *st = x->user;
  long status = 0;
  curl_easy_getinfo(st->x.h, CURLINFO_RESPONSE_CODE, &status);
  st->u.cc = cc;
  st->u.status = status;
  if (cc == CURLE_OK && status >= 200 && status < 300 && !st->raw) {
    ag_err_t why = AG_OK;
    if (ag__sse_finish(&st->sse, &why) < 0 && st->asmb.failed == AG_OK)
      st->asmb.failed = why;
    flush(st, false);
  }
  pthread_mutex_lock(&st->mu);
  req_ctx *q = NULL;
  if (st->answer == 0) {
    st->answer = ANSWER_REPLY;
    q = st->req_q;
    st->req_q = NULL;
  }
  long seen = st->status;
  pthread_mutex_unlock(&st->mu);
  if (q != NULL)
    answer_reply(st, q, seen); /* before `up`: st->u is this thread's */
  pthread_mutex_lock(&st->mu);
  st->up = true;
  st->paused = false; /* nothing to resume: no request to the relay now */
  if (st->status == 0)
    st->status = status;
  bool relayed = st->answer == ANSWER_STREAM && !st->client_gone;
  if (st->raw)
    st->cut = cc != CURLE_OK;
  pthread_mutex_unlock(&st->mu);
  if (relayed && !st->raw) {
    stream_end(st);
    return;
  }
  if (relayed)
    flush(st, true); /* raw: nothing to check, the end is the upstream's */
  stream_release(st, true);
}

/* The end of a relayed stream that was stopped: the stop message as text,
 * a final chunk, [DONE]. */
static void stream_stop(stream_st *st, const ag_verdict *v) {
  char text[AG_VERDICT_MSG_MAX * 2 + 128];
  stop_text(v, text + 2, sizeof text - 2);
  text[0] = text[1] = '\n';
  const char *t = st->any_text ? text : text + 2;
  sb_chunk(&st->out, st->id, st->model,
           json_pack("{s:s, s:s}", "role", "assistant", "content", t), NULL);
  sb_chunk(&st->out, st->id, st->model, json_object(), "stop");
  sb_add(&st->out, "data: [DONE]\n\n", 14);
}

static void stream_error(stream_st *st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static void stream_error(stream_st *st, const char *fmt, ...) {
  char msg[ERR_MSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  char red[ERR_MSG_MAX + ERR_MSG_MAX / 4 + 16];
  st->out.failed = false;
  st->out.len = 0;
  sb_json(&st->out,
          json_pack("{s:{s:s, s:s, s:n, s:s}}", "error", "message",
                    scrub(st->p, msg, red, sizeof red), "type",
                    "upstream_error", "param", "code", "upstream_stream"));
}

/* ---- Anthropic streams ------------------------------------------------- */

static void sb_named(sbuf *b, const char *name, json_t *o) {
  sb_add(b, "event: ", 7);
  sb_add(b, name, strlen(name));
  sb_add(b, "\n", 1);
  sb_json(b, o);
}

/* The client's index for upstream block `idx` (assigned on first use). */
static int client_index(stream_st *st, json_int_t idx) {
  if (idx < 0 || idx >= (json_int_t)(sizeof(st->map) / sizeof(st->map[0])))
    return -1;
  if (st->map[idx] < 0)
    st->map[idx] = st->next_index++;
  return st->map[idx];
}

static bool is_held_index(const stream_st *st, json_int_t idx) {
  return idx >= 0 && idx < (json_int_t)(sizeof(st->map) / sizeof(st->map[0])) &&
         st->map[idx] == -2;
}

/* Whether s can be an SSE event's name: no control character (a line
 * break in it would end the "event:" line and start another field). */
static bool name_ok(const char *s) {
  for (; *s != '\0'; s++)
    if ((unsigned char)*s < 0x20 || *s == 0x7f)
      return false;
  return true;
}

static int on_anth_event(void *user, const char *event_name, const char *data,
                         size_t len, size_t pos) {
  stream_st *st = user;
  if (ag__anthropic_event(&st->asmb, event_name, data, len, pos) != 0)
    return 1;
  json_t *j = json_loadb(data, len, 0, NULL);
  if (j == NULL)
    return 1;
  const char *type = json_string_value(json_object_get(j, "type"));
  /* an event without a name line is named by its type, unless the type
   * would break the event's line (a control character in it) */
  const char *name = event_name[0] != '\0'           ? event_name
                     : type != NULL && name_ok(type) ? type
                                                     : "message";
  json_t *ix = json_object_get(j, "index");
  json_int_t idx = json_is_integer(ix) ? json_integer_value(ix) : -1;
  bool hold = false;
  if (type == NULL) {
    /* forwarded as it came */
  } else if (strcmp(type, "message_start") == 0) {
    json_t *m = json_object_get(j, "message");
    const char *id = json_string_value(json_object_get(m, "id"));
    const char *model = json_string_value(json_object_get(m, "model"));
    snprintf(st->id, sizeof st->id, "%s", id != NULL ? id : "msg");
    snprintf(st->model, sizeof st->model, "%s",
             model != NULL ? model : "unknown");
  } else if (strcmp(type, "content_block_start") == 0) {
    const char *bt = json_string_value(
        json_object_get(json_object_get(j, "content_block"), "type"));
    if (idx < 0 || idx >= (json_int_t)(sizeof(st->map) / sizeof(st->map[0]))) {
      json_decref(j);
      ag__asm_bad(&st->asmb, (long)pos, "a content block index out of range");
      return 1;
    }
    if (bt != NULL && strstr(bt, "tool_use") != NULL) {
      st->map[idx] = -2; /* held until the calls are checked */
      hold = true;
    }
  } else if (strcmp(type, "content_block_delta") == 0 ||
             strcmp(type, "content_block_stop") == 0) {
    hold = is_held_index(st, idx);
    json_t *d = json_object_get(j, "delta");
    size_t tl = 0;
    const char *text = ag__jstr(d, "text", &tl);
    if (!hold && text != NULL && tl > 0) {
      ag_verdict v;
      if (ag_guard_check_text(st->g, text, tl, true, &v) != AG_ALLOW) {
        st->looped = true;
        st->loop_v = v;
        json_decref(j);
        return 1;
      }
      st->any_text = true;
    }
  } else if (strcmp(type, "message_delta") == 0 ||
             strcmp(type, "message_stop") == 0) {
    hold = true;
  }
  if (hold) {
    json_t *pair = json_pack("[s, O]", name, j);
    if (pair == NULL || json_array_append_new(st->held_ev, pair) != 0)
      st->held.failed = true;
  } else {
    if (idx >= 0 && type != NULL && strncmp(type, "content_block", 13) == 0)
      json_object_set_new(j, "index", json_integer(client_index(st, idx)));
    sb_named(&st->out, name, json_incref(j));
  }
  json_decref(j);
  return st->out.failed || st->held.failed ? 1 : 0;
}

/* A text block with `text` at the client's next index. */
static void anth_text_block(stream_st *st, const char *text) {
  int ci = st->next_index++;
  sb_named(&st->out, "content_block_start",
           json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_start",
                     "index", ci, "content_block", "type", "text", "text", ""));
  sb_named(&st->out, "content_block_delta",
           json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_delta",
                     "index", ci, "delta", "type", "text_delta", "text", text));
  sb_named(&st->out, "content_block_stop",
           json_pack("{s:s, s:i}", "type", "content_block_stop", "index", ci));
}

static void anth_end(stream_st *st, const char *stop_reason) {
  sb_named(&st->out, "message_delta",
           json_pack("{s:s, s:{s:s, s:n}, s:{s:i}}", "type", "message_delta",
                     "delta", "stop_reason", stop_reason, "stop_sequence",
                     "usage", "output_tokens", 0));
  sb_named(&st->out, "message_stop",
           json_pack("{s:s}", "type", "message_stop"));
}

static void anth_stop(stream_st *st, const ag_verdict *v) {
  char text[AG_VERDICT_MSG_MAX * 2 + 128];
  stop_text(v, text, sizeof text);
  anth_text_block(st, text);
  anth_end(st, "end_turn");
}

static void anth_error(stream_st *st, const char *msg) {
  char red[ERR_MSG_MAX + ERR_MSG_MAX / 4 + 16];
  st->out.failed = false;
  sb_named(&st->out, "error",
           json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type",
                     "api_error", "message",
                     scrub(st->p, msg, red, sizeof red)));
}

/* ---- The end of a relayed stream ------------------------------------- */

/* A nudge at a stream's end: the reply whose calls were held back and
 * what the check said, for the thread that asks again (nudge_main). */
typedef struct nudge_job {
  stream_st *st;
  ag_reply rep;
  ag_verdict v;
  ag_call_check checks[AG__CALLS_MAX];
} nudge_job;

/* Takes *rep (it is left empty) and copies the rest; NULL when out of
 * memory. */
static nudge_job *nudge_new(stream_st *st, ag_reply *rep,
                            const ag_call_check *checks, const ag_verdict *v) {
  nudge_job *nj = malloc(sizeof(*nj));
  if (nj == NULL)
    return NULL;
  nj->st = st;
  nj->rep = *rep;
  memset(rep, 0, sizeof *rep);
  nj->v = *v;
  memcpy(nj->checks, checks, sizeof nj->checks);
  return nj;
}

/* A nudge that cannot be asked: the stream ends with an error event that
 * says why; nj is freed. */
static void nudge_fail(nudge_job *nj, const char *msg) {
  if (nj->st->anth)
    anth_error(nj->st, msg);
  else
    stream_error(nj->st, "%s", msg);
  ag_reply_clear(&nj->rep);
  free(nj);
}

/* The client's request as a tree, for a nudge's request (it is parsed
 * only then: most streams never need it). NULL if it cannot be. */
static json_t *stream_request(const stream_st *st) {
  const char *b = st->orig != NULL ? st->orig : st->body;
  return json_loads(b != NULL ? b : "", 0, NULL);
}

/* Whether the upstream's stream ended as its API ends one: [DONE] or a
 * finish_reason (Chat Completions), message_stop or a stop_reason
 * (Messages) - the rule the providers apply to their own streams. A
 * stream cut off without it (the upstream died, a proxy in between timed
 * out, it sent something else) is relayed as cut, with an error event,
 * never with an end the upstream did not send: the agent must not take a
 * truncated answer as whole. */
static bool stream_complete(const stream_st *st) {
  return st->asmb.done || st->asmb.finish_reason[0] != '\0';
}

/* The end of a relayed Anthropic stream (stream_finish's counterpart). */
static void stream_finish_anth(stream_st *st, nudge_job **nj) {
  char msg[ERR_MSG_MAX];
  if (st->looped) {
    event(st->p, "stream_stopped", st->path, &st->loop_v, NULL);
    anth_stop(st, &st->loop_v);
    return;
  }
  if (st->u.too_big || st->out.failed || st->held.failed ||
      st->u.cc != CURLE_OK || st->asmb.failed != AG_OK) {
    snprintf(msg, sizeof msg,
             "agentguard proxy: the upstream's stream broke: %s",
             st->u.too_big || st->out.failed || st->held.failed ? "too large"
             : st->u.cc != CURLE_OK
                 ? (st->u.errbuf[0] != '\0' ? st->u.errbuf
                                            : curl_easy_strerror(st->u.cc))
             : st->asmb.failed == AG_EPROVIDER ? st->perr.message
                                               : ag_strerror(st->asmb.failed));
    anth_error(st, msg);
    return;
  }
  if (!stream_complete(st)) {
    anth_error(st, "agentguard proxy: the upstream's stream ended before "
                   "the reply was complete (no message_stop): the reply "
                   "is cut off");
    return;
  }
  ag_reply rep;
  memset(&rep, 0, sizeof rep);
  ag_err_t fin = ag__asm_finish(&st->asmb, &rep);
  if (fin != AG_OK) { /* rep may hold the calls before the bad one */
    ag_reply_clear(&rep);
    snprintf(msg, sizeof msg,
             "agentguard proxy: the upstream's stream broke: %s",
             fin == AG_EPROVIDER ? st->perr.message : ag_strerror(fin));
    anth_error(st, msg);
    return;
  }
  ag_call_check checks[AG__CALLS_MAX];
  ag_verdict v;
  ag_action act = check_reply(st->g, &rep, true, checks, &v);
  if (act == AG_ALLOW) {
    size_t i;
    json_t *pair;
    json_array_foreach(st->held_ev, i, pair) {
      json_t *o = json_array_get(pair, 1);
      json_t *ix = json_object_get(o, "index");
      /* a held block takes the client's next number; a block the client
       * has seen keeps its own; an index the stream never opened (on a
       * message_delta, or out of range) is left as the upstream sent it */
      json_int_t idx = json_is_integer(ix) ? json_integer_value(ix) : -1;
      if (is_held_index(st, idx))
        st->map[idx] = st->next_index++;
      if (idx >= 0 &&
          idx < (json_int_t)(sizeof(st->map) / sizeof(st->map[0])) &&
          st->map[idx] >= 0)
        json_object_set_new(o, "index", json_integer(st->map[idx]));
      sb_named(&st->out, json_string_value(json_array_get(pair, 0)),
               json_incref(o));
    }
    goto out;
  }
  if (act != AG_NUDGE) {
    event(st->p, "reply_replaced", st->path, &v, NULL);
    anth_stop(st, &v);
    goto out;
  }
  *nj = nudge_new(st, &rep, checks, &v);
  if (*nj == NULL)
    anth_error(st, "agentguard proxy: out of memory");
out:
  ag_reply_clear(&rep);
}

/* stream_nudge's counterpart for a relayed Anthropic stream. */
static void stream_nudge_anth(stream_st *st, nudge_job *nj) {
  char msg[ERR_MSG_MAX];
  ag_reply rep2;
  memset(&rep2, 0, sizeof rep2);
  ag_call_check *checks = nj->checks;
  ag_verdict v = nj->v;
  event(st->p, "nudge", st->path, &v, NULL);
  json_t *b = stream_request(st);
  json_t *extra = nudge_messages_anthropic(&nj->rep, checks);
  size_t len = 0;
  char *body = NULL;
  if (b != NULL && extra != NULL) {
    json_object_set_new(b, "stream", json_false());
    body = with_messages(b, extra, &len);
  }
  json_decref(b);
  json_decref(extra);
  if (body == NULL) {
    anth_error(st, "agentguard proxy: out of memory");
    goto out;
  }
  ag_action act = record_nudged(st->g, &nj->rep, checks, &v);
  upstream u;
  memset(&u, 0, sizeof u);
  reply r;
  memset(&r, 0, sizeof r);
  r.anthropic = true;
  if (!ag__stops(act))
    send_upstream(st->p, st->ch, "POST", st->uri, body, len, true, -1, &u);
  free(body);
  if (ag__stops(act)) {
    /* v says why */
  } else if (upstream_failed(st->p, &u, &r) || u.status < 200 ||
             u.status >= 300 || !read_reply(&u, &rep2, &r)) {
    snprintf(msg, sizeof msg,
             "agentguard proxy: asking the upstream again failed: %s",
             r.body != NULL ? r.body : (u.body != NULL ? u.body : ""));
    anth_error(st, msg);
    reply_free(&r);
    upstream_free(&u);
    goto out;
  } else {
    act = check_reply(st->g, &rep2, false, checks, &v);
  }
  upstream_free(&u);
  if (act == AG_ALLOW) {
    if (rep2.text != NULL && rep2.text[0] != '\0')
      anth_text_block(st, rep2.text);
    for (size_t k = 0; k < rep2.n_calls; k++) {
      const ag_tool_call *tc = &rep2.calls[k];
      int ci = st->next_index++;
      sb_named(&st->out, "content_block_start",
               json_pack("{s:s, s:i, s:{s:s, s:s, s:s, s:{}}}", "type",
                         "content_block_start", "index", ci, "content_block",
                         "type", "tool_use", "id", tc->id, "name", tc->name,
                         "input"));
      sb_named(&st->out, "content_block_delta",
               json_pack("{s:s, s:i, s:{s:s, s:s%}}", "type",
                         "content_block_delta", "index", ci, "delta", "type",
                         "input_json_delta", "partial_json", tc->arguments,
                         tc->arguments_len));
      sb_named(
          &st->out, "content_block_stop",
          json_pack("{s:s, s:i}", "type", "content_block_stop", "index", ci));
    }
    anth_end(st, rep2.n_calls > 0 ? "tool_use" : "end_turn");
    goto out;
  }
  if (act == AG_NUDGE)
    v.action = AG_STOP; /* one nudge per request */
  event(st->p, "reply_replaced", st->path, &v, NULL);
  anth_stop(st, &v);
out:
  ag_reply_clear(&rep2);
}

/* The end of a relayed Chat Completions stream, on its loop: the calls
 * checked, then released or replaced; a nudge is left in *nj for its own
 * thread (nudge_main), which asks again. */
static void stream_finish(stream_st *st, nudge_job **nj) {
  if (st->anth) {
    stream_finish_anth(st, nj);
    return;
  }
  if (st->id[0] == '\0') {
    snprintf(st->id, sizeof st->id, "chatcmpl-agentguard");
    snprintf(st->model, sizeof st->model, "agentguard");
  }
  if (st->looped) {
    event(st->p, "stream_stopped", st->path, &st->loop_v, NULL);
    stream_stop(st, &st->loop_v);
    return;
  }
  if (st->u.too_big || st->out.failed || st->held.failed) {
    stream_error(st, "agentguard proxy: the upstream's stream is too large");
    return;
  }
  if (st->u.cc != CURLE_OK || st->asmb.failed != AG_OK) {
    stream_error(st, "agentguard proxy: the upstream's stream broke: %s",
                 st->u.cc != CURLE_OK
                     ? (st->u.errbuf[0] != '\0' ? st->u.errbuf
                                                : curl_easy_strerror(st->u.cc))
                 : st->asmb.failed == AG_EPROVIDER
                     ? st->perr.message
                     : ag_strerror(st->asmb.failed));
    return;
  }
  if (!stream_complete(st)) {
    stream_error(st, "agentguard proxy: the upstream's stream ended before "
                     "the reply was complete (no finish_reason, no [DONE]): "
                     "the reply is cut off");
    return;
  }
  ag_reply rep;
  memset(&rep, 0, sizeof rep);
  ag_err_t fin = ag__asm_finish(&st->asmb, &rep);
  if (fin != AG_OK) { /* rep may hold the calls before the bad one */
    ag_reply_clear(&rep);
    stream_error(st, "agentguard proxy: the upstream's stream broke: %s",
                 fin == AG_EPROVIDER ? st->perr.message : ag_strerror(fin));
    return;
  }
  ag_call_check checks[AG__CALLS_MAX];
  ag_verdict v;
  ag_action act = check_reply(st->g, &rep, true, checks, &v);
  if (act == AG_ALLOW) {
    sb_add(&st->out, st->held.p != NULL ? st->held.p : "", st->held.len);
    sb_add(&st->out, "data: [DONE]\n\n", 14);
    goto out;
  }
  if (act != AG_NUDGE) {
    event(st->p, "reply_replaced", st->path, &v, NULL);
    stream_stop(st, &v);
    goto out;
  }
  *nj = nudge_new(st, &rep, checks, &v);
  if (*nj == NULL)
    stream_error(st, "agentguard proxy: out of memory");
out:
  ag_reply_clear(&rep);
}

/* A relayed Chat Completions stream's nudge, on its own thread: the
 * held-back calls answered by the nudge, asked once more (not streamed),
 * and the new reply, checked, written as the stream's end. */
static void stream_nudge(stream_st *st, nudge_job *nj) {
  ag_reply rep2;
  memset(&rep2, 0, sizeof rep2);
  ag_call_check *checks = nj->checks;
  ag_verdict v = nj->v;
  event(st->p, "nudge", st->path, &v, NULL);
  json_t *b = stream_request(st);
  json_t *extra = nudge_messages(&nj->rep, checks);
  size_t len = 0;
  char *body = NULL;
  if (b != NULL && extra != NULL) {
    json_object_set_new(b, "stream", json_false());
    json_object_del(b, "stream_options");
    body = with_messages(b, extra, &len);
  }
  json_decref(b);
  json_decref(extra);
  if (body == NULL) {
    stream_error(st, "agentguard proxy: out of memory");
    goto out;
  }
  ag_action act = record_nudged(st->g, &nj->rep, checks, &v);
  upstream u;
  memset(&u, 0, sizeof u);
  if (!ag__stops(act))
    send_upstream(st->p, st->ch, "POST", st->uri, body, len, true, -1, &u);
  free(body);
  reply r;
  memset(&r, 0, sizeof r);
  if (ag__stops(act)) {
    /* v says why */
  } else if (upstream_failed(st->p, &u, &r) || u.status < 200 ||
             u.status >= 300 || !read_reply(&u, &rep2, &r)) {
    stream_error(st, "agentguard proxy: asking the upstream again failed: %s",
                 r.body != NULL ? r.body : (u.body != NULL ? u.body : ""));
    reply_free(&r);
    upstream_free(&u);
    goto out;
  } else {
    act = check_reply(st->g, &rep2, false, checks, &v);
  }
  upstream_free(&u);
  if (act == AG_ALLOW) {
    sb_reply(&st->out, st->id, st->model, rep2.text, &rep2,
             rep2.n_calls > 0 ? "tool_calls" : "stop");
    goto out;
  }
  if (act == AG_NUDGE)
    v.action = AG_STOP; /* one nudge per request */
  event(st->p, "reply_replaced", st->path, &v, NULL);
  stream_stop(st, &v);
out:
  ag_reply_clear(&rep2);
}

/* The response's content reader, on the connection's thread: what the
 * queue holds, or the end, or nothing yet - then the connection waits,
 * suspended, until a flush resumes it. */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
  (void)pos;
  stream_st *st = cls;
  bool unpause = false;
  ssize_t ret;
  pthread_mutex_lock(&st->mu);
  if (st->q_pos < st->q.len) {
    size_t n = st->q.len - st->q_pos;
    if (n > max)
      n = max;
    memcpy(buf, st->q.p + st->q_pos, n);
    st->q_pos += n;
    if (st->paused && !st->up && !st->unpause_queued &&
        st->q.len - st->q_pos < STREAM_Q_HIGH / 2) {
      st->paused = false;
      st->unpause_queued = true;
      st->ops++;
      unpause = true;
    }
    ret = (ssize_t)n;
  } else if (st->finished) {
    /* a passed-through body the upstream did not finish is not made to
     * look whole: the connection is closed without the last chunk */
    ret = st->cut ? MHD_CONTENT_READER_END_WITH_ERROR
                  : MHD_CONTENT_READER_END_OF_STREAM;
    /* nothing is under way on the connection any more: it may give way
     * to a new one from now on (before libmicrohttpd's completion) */
    ag__conns_state(st->conn, AG__CONN_IDLE, mono_ms());
  } else {
    st->reader_waits = true;
    MHD_suspend_connection(st->c);
    ret = 0;
  }
  pthread_mutex_unlock(&st->mu);
  if (unpause)
    ag__relay_unpause(st->sh->relay, &st->x, &st->op_unpause);
  return ret;
}

/* A stream's state with its readers set up for the API shape; the end's
 * reference (stream_end) is its only one. NULL when out of memory. */
static stream_st *stream_new(ag_proxy *p, bool anth, const char *path) {
  stream_st *st = calloc(1, sizeof(*st));
  if (st == NULL)
    return NULL;
  pthread_mutex_init(&st->mu, NULL);
  st->refs = 1;
  st->p = p;
  st->anth = anth;
  for (size_t k = 0; k < sizeof(st->map) / sizeof(st->map[0]); k++)
    st->map[k] = -1;
  ag__sse_init(&st->sse, anth ? on_anth_event : on_sse_event, st);
  ag__asm_init(&st->asmb, NULL, NULL, &st->perr, "upstream");
  st->path = dupz(path);
  st->held_ev = json_array();
  if (st->path == NULL || st->held_ev == NULL) {
    stream_destroy(st);
    return NULL;
  }
  return st;
}

/* The stream's transfer, set up (st->x.h), handed to its loop with its
 * callbacks; the loop answers q once the upstream's status is in. */
static void stream_launch(stream_st *st, req_ctx *q) {
  curl_easy_setopt(st->x.h, CURLOPT_WRITEFUNCTION, on_stream_body);
  curl_easy_setopt(st->x.h, CURLOPT_WRITEDATA, st);
  curl_easy_setopt(st->x.h, CURLOPT_HEADERFUNCTION, on_stream_header);
  curl_easy_setopt(st->x.h, CURLOPT_HEADERDATA, st);
  st->u.cc = CURLE_OK;
  st->x.done = on_stream_done;
  st->x.user = st;
  st->op_cancel.taken = on_cancel_taken;
  st->op_cancel.user = st;
  st->op_unpause.taken = on_unpause_taken;
  st->op_unpause.user = st;
  st->req_q = q;
  ag__relay_add(st->sh->relay, &st->x);
}

/* Starts relaying: hands the transfer to the connection's loop, which
 * answers the request (q) when the upstream's status is known and sees
 * the stream to its end. `*fwd` (may be NULL) is the body to send instead
 * of the client's (with the error context); it, the guard and the stream
 * are the loop's now, and q is not this thread's any more. Returns false
 * with `r` filled (500) when it could not start. */
static bool stream_start(ag_proxy *p, struct MHD_Connection *c, req_ctx *q,
                         char **fwd, size_t fwd_len, bool anth,
                         const char *path, ag_guard **g, reply *r) {
  stream_st *st = stream_new(p, anth, path);
  if (st == NULL) {
    set_error(r, 500, "server_error", "out_of_memory", "out of memory");
    return false;
  }
  st->sh = q->sh;
  st->ct = q->sh->ct;
  st->c = c;
  st->uri = dupz(q->uri);
  /* the client's body, kept for a nudge (and sent, unless *fwd is) */
  char *copy = malloc(q->len + 1);
  if (copy != NULL) {
    if (q->len > 0)
      memcpy(copy, q->body, q->len);
    copy[q->len] = '\0';
  }
  size_t len = q->len;
  if (*fwd != NULL) {
    st->body = *fwd;
    st->orig = copy;
    len = fwd_len;
    *fwd = NULL;
  } else {
    st->body = copy;
  }
  st->x.h = curl_easy_init();
  bool set = st->x.h != NULL && copy != NULL &&
             upstream_handle(p, q->client_hdrs, st->x.h, "POST", q->uri,
                             st->body, len, st->orig != NULL, q->client_fd,
                             &st->u, &st->hdrs, &st->url);
  for (const struct curl_slist *s = q->client_hdrs; set && s != NULL;
       s = s->next) {
    struct curl_slist *n = curl_slist_append(st->ch, s->data);
    set = n != NULL;
    if (n != NULL)
      st->ch = n;
  }
  if (!set || st->uri == NULL) {
    stream_release(st, true);
    set_error(r, 500, "server_error", "out_of_memory", "out of memory");
    return false;
  }
  st->g = *g;
  *g = NULL;
  /* from here on q is the loop's: it answers the request (answer_stream,
   * answer_reply) once the upstream's status is known */
  stream_launch(st, q);
  return true;
}

/* A request the guard does not decide, passed through on the connection's
 * loop: its transfer started here, and its answer - the upstream's
 * status, headers and body - relayed as it comes (a raw stream: nothing
 * is parsed, nothing is held whole; a client that reads slowly pauses the
 * upstream). The request's body goes with the transfer. Returns false
 * with `r` filled (500) when it could not start; else q is the loop's. */
static bool relay_start(ag_proxy *p, struct MHD_Connection *c, req_ctx *q,
                        const char *path, reply *r) {
  stream_st *st = stream_new(p, false, path);
  if (st == NULL) {
    set_error(r, 500, "server_error", "out_of_memory", "out of memory");
    return false;
  }
  st->raw = true;
  st->conn = q->conn;
  st->sh = q->sh;
  st->c = c;
  st->uri = dupz(q->uri);
  st->body = q->body; /* the transfer's from here on */
  q->body = NULL;
  st->x.h = curl_easy_init();
  if (st->x.h == NULL || st->uri == NULL ||
      !upstream_handle(p, q->client_hdrs, st->x.h, q->method, q->uri, st->body,
                       q->len, false, q->client_fd, &st->u, &st->hdrs,
                       &st->url)) {
    stream_release(st, true);
    set_error(r, 500, "server_error", "out_of_memory", "out of memory");
    return false;
  }
  stream_launch(st, q);
  return true;
}

int ag_proxy_relay_replay(const ag_config *cfg, bool anthropic,
                          const char *stream, size_t len, size_t split,
                          unsigned flags, char **out, size_t *out_len) {
  *out = NULL;
  *out_len = 0;
  ag_proxy *p = calloc(1, sizeof(*p)); /* no events file: none written */
  if (p == NULL)
    return -1;
  p->cfg = *cfg;
  stream_st *st = stream_new(
      p, anthropic, anthropic ? "/v1/messages" : "/v1/chat/completions");
  chunk_tape *ct = (flags & AG_PROXY_REPLAY_TREE) ? NULL : chunk_tape_new();
  ag_error_t err;
  if (st == NULL || ag_guard_new(&st->g, cfg, NULL, &err) != AG_OK ||
      (ct == NULL && !(flags & AG_PROXY_REPLAY_TREE))) {
    if (st != NULL)
      stream_destroy(st);
    chunk_tape_free(ct);
    free(p);
    return -1;
  }
  st->ct = ct;
  ag_verdict v0; /* a turn with no history: its first request goes */
  (void)ag_guard_begin_iteration(st->g, 0, &v0);
  st->answer = ANSWER_STREAM;
  st->status = 200;
  st->u.cc = CURLE_OK;
  if (split > len)
    split = len;
  /* the transfer: its writes, then its end (on_stream_done) */
  if ((split > 0 && !stream_feed(st, stream, split)) ||
      (len > split && !stream_feed(st, stream + split, len - split))) {
    st->u.cc = CURLE_WRITE_ERROR;
  } else {
    ag_err_t why = AG_OK;
    if (ag__sse_finish(&st->sse, &why) < 0 && st->asmb.failed == AG_OK)
      st->asmb.failed = why;
    flush(st, false);
  }
  st->up = true;
  nudge_job *nj = NULL;
  stream_finish(st, &nj);
  if (nj != NULL)
    nudge_fail(nj, "agentguard proxy: asking the upstream again failed: "
                   "no upstream (ag_proxy_relay_replay)");
  flush(st, true);
  int rc = 0;
  size_t n = st->q.len - st->q_pos;
  *out = malloc(n + 1);
  if (*out == NULL) {
    rc = -1;
  } else {
    if (n > 0)
      memcpy(*out, st->q.p + st->q_pos, n);
    (*out)[n] = '\0';
    *out_len = n;
  }
  stream_release(st, true);
  chunk_tape_free(ct);
  free(p);
  return rc;
}

/* ---- Anthropic Messages (/v1/messages) -------------------------------- */

/* The text of a content value: a string, or the text blocks of an array. */
/* Whether an Anthropic message has text (a string, or a text block): a
 * user message with text starts a turn. */
static bool anth_has_text(const json_t *m) {
  const json_t *content = json_object_get(m, "content");
  if (json_is_string(content))
    return true;
  size_t k;
  const json_t *b;
  json_array_foreach(content, k, b) {
    const char *bt = json_string_value(json_object_get(b, "type"));
    if (bt != NULL && strcmp(bt, "text") == 0)
      return true;
  }
  return false;
}

/* The text ag__blocks_text makes of `content`, without a copy when it is a
 * string or a single text block; a joined one is owned by f. NULL when out
 * of memory. */
static const char *anth_text(const json_t *content, fast_traj *f, size_t *len) {
  if (json_is_string(content)) {
    *len = json_string_length(content);
    return json_string_value(content);
  }
  const char *one = "";
  size_t n = 0, i;
  const json_t *b;
  *len = 0;
  json_array_foreach(content, i, b) {
    size_t l = 0;
    const char *t = ag__jstr(b, "text", &l);
    if (t == NULL)
      continue;
    if (n++ == 0) {
      one = t;
      *len = l;
    }
  }
  if (n <= 1)
    return one;
  json_t *joined = ag__blocks_text(content);
  char *copy = joined != NULL ? malloc(json_string_length(joined) + 1) : NULL;
  if (copy != NULL) {
    *len = json_string_length(joined);
    memcpy(copy, json_string_value(joined), *len + 1);
    f->owned[f->n_owned++] = copy;
  }
  json_decref(joined);
  return copy;
}

/*
 * fast_turn for Anthropic messages (already checked by
 * ag__wire_messages.to_chat): the turn that starts at msgs[from] (a user
 * message with text) read straight from the parsed request into the steps that
 * ag__wire_messages.to_chat then fast_turn would give, without building the
 * chat messages. Anything fast_turn would leave to the slow path (a result
 * before any call, an unknown or repeated id, an unanswered call, a tool_result
 * in an assistant message) returns 0 here too. 1, 0 or -1 (out of memory) as
 * fast_turn.
 */
static int fast_turn_anth(const json_t *msgs, size_t from, fast_traj *f) {
  memset(f, 0, sizeof(*f));
  size_t n = json_array_size(msgs), n_calls = 0, n_steps = 0, n_blocks = 0;
  for (size_t i = from + 1; i < n; i++) {
    const json_t *m = json_array_get(msgs, i);
    const json_t *content = json_object_get(m, "content");
    n_blocks += json_array_size(content);
    if (strcmp(role_of(m), "assistant") != 0)
      continue;
    n_steps++;
    size_t k;
    const json_t *b;
    json_array_foreach(content, k, b) {
      const char *bt = json_string_value(json_object_get(b, "type"));
      n_calls += bt != NULL && strcmp(bt, "tool_use") == 0;
    }
  }
  if (t_alloc(f, n_steps, n_calls) < 0)
    return -1;
  f->owned = calloc(n_steps + n_calls + n_blocks + 1, sizeof(*f->owned));
  if (f->owned == NULL)
    goto oom;
  size_t si = 0, ci = 0, step0 = 0;
  bool in_step = false;
  for (size_t i = from + 1; i < n; i++) {
    const json_t *m = json_array_get(msgs, i);
    const json_t *content = json_object_get(m, "content");
    size_t k;
    const json_t *b;
    if (strcmp(role_of(m), "assistant") == 0) {
      for (size_t q = step0; in_step && q < ci; q++)
        if (!f->answered[q])
          goto slow;
      ag_traj_step *st = &f->steps[si++];
      in_step = true;
      step0 = ci;
      st->text = anth_text(content, f, &st->text_len);
      if (st->text == NULL)
        goto oom;
      t_step(st, f, ci);
      json_array_foreach(content, k, b) {
        const char *bt = json_string_value(json_object_get(b, "type"));
        if (strcmp(bt, "tool_result") == 0)
          goto slow;
        if (strcmp(bt, "tool_use") != 0)
          continue;
        const char *id = json_string_value(json_object_get(b, "id"));
        for (size_t q = step0; q < ci; q++)
          if (strcmp(f->ids[q], id) == 0)
            goto slow; /* a repeated id */
        const json_t *input = json_object_get(b, "input");
        char *args = input != NULL
                         ? json_dumps(input, JSON_COMPACT | JSON_ENCODE_ANY)
                         : dupz("{}");
        if (args == NULL)
          goto oom;
        f->owned[f->n_owned++] = args;
        f->ids[ci] = id;
        f->calls[ci].name = json_string_value(json_object_get(b, "name"));
        f->calls[ci].args = args;
        f->calls[ci].args_len = strlen(args);
        f->results[ci].text = "";
        ci++;
      }
      st->n_calls = st->n_results = ci - step0;
      continue;
    }
    /* a user message after the turn's first: tool results only (one with
     * text would start a later turn) */
    json_array_foreach(content, k, b) {
      const char *bt = json_string_value(json_object_get(b, "type"));
      if (strcmp(bt, "tool_result") != 0)
        continue;
      if (!in_step)
        goto slow;
      const char *id = json_string_value(json_object_get(b, "tool_use_id"));
      ag_traj_result *res = t_answer(f, step0, ci, id);
      if (res == NULL)
        goto slow;
      res->outcome = json_is_true(json_object_get(b, "is_error"))
                         ? AG_OUTCOME_ERROR
                         : AG_OUTCOME_OK;
      res->category = AG_CAT_AUTO;
      res->text = anth_text(json_object_get(b, "content"), f, &res->text_len);
      if (res->text == NULL)
        goto oom;
    }
  }
  for (size_t q = step0; in_step && q < ci; q++)
    if (!f->answered[q])
      goto slow;
  t_done(f, si, ci);
  return 1;
slow:
  fast_free(f);
  return 0;
oom:
  fast_free(f);
  return -1;
}

/*
 * replay_turn for Anthropic messages: every message checked (a 400 names
 * the first bad one), then the turn (from the last user message with text)
 * read by fast_turn_anth, or, when it leaves it to the slow path, converted
 * by ag__wire_messages.to_chat from there and replayed as chat. Only the turn
 * is converted: the history before it costs the check alone. Returns as
 * replay_turn.
 */
static int replay_turn_anth(ag_guard *g, const json_t *msgs, ag_verdict *v,
                            char *emsg, size_t cap) {
  json_t *checked = ag__wire_messages.to_chat(msgs, SIZE_MAX, emsg, cap);
  if (checked == NULL)
    return emsg[0] != '\0' ? -1 : -2;
  json_decref(checked);
  size_t from = SIZE_MAX;
  for (size_t i = json_array_size(msgs); i-- > 0;) {
    const json_t *m = json_array_get(msgs, i);
    if (strcmp(role_of(m), "user") == 0 && anth_has_text(m)) {
      from = i;
      break;
    }
  }
  if (from != SIZE_MAX) {
    memset(v, 0, sizeof(*v));
    v->call_index = -1;
    ag_guard_begin_turn(g, 0);
    fast_traj f;
    int fr = fast_turn_anth(msgs, from, &f);
    if (fr < 0)
      return -2;
    if (fr > 0)
      return replay_fast(g, &f, v);
  }
  json_t *chat =
      ag__wire_messages.to_chat(msgs, from == SIZE_MAX ? 0 : from, emsg, cap);
  if (chat == NULL)
    return emsg[0] != '\0' ? -1 : -2;
  int act = replay_turn(g, chat, from, v, emsg, cap);
  json_decref(chat);
  return act;
}

/* ------------------------------------------------------------------------ */
/* The decision from the tape: no jansson tree                              */
/* ------------------------------------------------------------------------ */

/*
 * jansson builds a tree at about 60 MB/s here: 1.2 ms for a 500-message
 * (76 KB) request, more than the whole decision may take. The JCS
 * tokenizer (src/core/jcs.c) validates the same text and writes a flat
 * tape several times faster, so the decision reads the request from the
 * tape: the turn is found and turned into the fast_traj that fast_turn /
 * fast_turn_anth would build from the tree, with the strings decoded into
 * one buffer. The shape those two take is read here, and one more: chat
 * contents given as arrays of parts, read as the audit's parser reads them
 * (fast_turn leaves those to it; AG_CAT_AUTO and the parser's unjudged
 * category replay alike). Anything else - a body the tape refuses (a duplicate
 * key, nesting past TAPE_DEPTH, a number outside a double, "\u0000", an integer
 * jansson cannot hold), a shape fast_turn leaves to the slow path, a message
 * the tree path answers with 400 - returns TAPE_FALLBACK, and the caller takes
 * the jansson path, whose decisions and messages are the reference (the
 * parity tests in tests/runtime/test_proxy.c replay both).
 */
#define TAPE_FALLBACK (-3)
#define TAPE_DEPTH 64

typedef struct tape {
  ag__jcs *j;
  const char *s;
  size_t len, n;
  char *buf; /* decoded strings, NUL-terminated, back to back */
  size_t used, cap;
} tape;

/* The value of member `key` of object token `obj`, or 0 (the root is
 * nobody's member). */
static size_t t_get(const tape *t, size_t obj, const char *key) {
  if (ag__jcs_tok_type(t->j, obj) != AG__JT_OBJ)
    return 0;
  size_t n = strlen(key), end = ag__jcs_tok_next(t->j, obj);
  for (size_t i = obj + 1; i < end; i = ag__jcs_tok_next(t->j, i + 1))
    if (ag__jcs_key_is(t->j, i, key, n))
      return i + 1;
  return 0;
}

static bool t_is(const tape *t, size_t i, int type) {
  return i != 0 && ag__jcs_tok_type(t->j, i) == type;
}

/* String token i decoded into the buffer (NUL-terminated), or NULL when it
 * is no string or the buffer is full. */
static const char *t_str(tape *t, size_t i, size_t *len) {
  if (!t_is(t, i, AG__JT_STR))
    return NULL;
  const char *raw;
  size_t n = ag__jcs_str_raw(t->j, i, &raw);
  if (t->cap - t->used < n + 1)
    return NULL;
  char *o = t->buf + t->used;
  if (ag__jcs_str_escaped(t->j, i)) {
    n = ag__jcs_str_decode(t->j, i, o);
  } else {
    memcpy(o, raw, n);
    o[n] = '\0';
  }
  t->used += n + 1;
  if (len != NULL)
    *len = n;
  return o;
}

/* Whether token i is a string equal to `lit` (decoded; at most 20 bytes).
 * A decoded byte takes at most 6 bytes of source ("\u0061"), so a string
 * whose source is longer than 6 x 20 cannot be equal to one. */
static bool t_eq(const tape *t, size_t i, const char *lit) {
  if (!t_is(t, i, AG__JT_STR))
    return false;
  const char *raw;
  size_t n = ag__jcs_str_raw(t->j, i, &raw), l = strlen(lit);
  if (!ag__jcs_str_escaped(t->j, i))
    return n == l && memcmp(raw, lit, l) == 0;
  char tmp[6 * 20 + 1];
  return n < sizeof tmp && ag__jcs_str_decode(t->j, i, tmp) == l &&
         memcmp(tmp, lit, l) == 0;
}

/* The elements of array token `arr` (0: not an array). */
static size_t t_count(const tape *t, size_t arr) {
  if (!t_is(t, arr, AG__JT_ARR))
    return 0;
  size_t n = 0, end = ag__jcs_tok_next(t->j, arr);
  for (size_t i = arr + 1; i < end; i = ag__jcs_tok_next(t->j, i))
    n++;
  return n;
}

/* Iterates the elements e of array token a. */
#define T_EACH(t, a, e)                                                        \
  for (size_t e = t_is(t, a, AG__JT_ARR) ? (a) + 1 : 0,                        \
              e##_end = t_is(t, a, AG__JT_ARR) ? ag__jcs_tok_next((t)->j, a)   \
                                               : 0;                            \
       e < e##_end; e = ag__jcs_tok_next((t)->j, e))

/* Whether jansson (json_loadb, flags 0) takes every value of the tape:
 * it refuses "\u0000" in strings and integers outside json_int_t, which
 * the tokenizer allows. Conservative: any "\u0000" and any integer literal
 * of more than 18 digits send the body to jansson. */
static bool t_jansson_safe(const tape *t) {
  if (memmem(t->s, t->len, "\\u0000", 6) != NULL)
    return false;
  for (size_t i = 0; i < t->n; i++) {
    if (ag__jcs_tok_type(t->j, i) != AG__JT_NUM)
      continue;
    size_t p = ag__jcs_tok_off(t->j, i), d;
    p += t->s[p] == '-';
    for (d = 0; p + d < t->len && t->s[p + d] >= '0' && t->s[p + d] <= '9';)
      d++;
    if (d > 18 && (p + d >= t->len ||
                   (t->s[p + d] != '.' && (t->s[p + d] | 0x20) != 'e')))
      return false;
  }
  return true;
}

/* The text ag__blocks_text / anth_text make of Anthropic content token c: a
 * string, or the "text" strings of an array's blocks joined by "\n"; ""
 * for anything else. NULL when the buffer is full. */
static const char *t_anth_text(tape *t, size_t c, size_t *len) {
  *len = 0;
  if (t_is(t, c, AG__JT_STR))
    return t_str(t, c, len);
  char *out = t->buf + t->used;
  size_t n = 0;
  T_EACH(t, c, b) {
    size_t tx = t_get(t, b, "text"), l;
    if (!t_is(t, tx, AG__JT_STR))
      continue;
    if (n++ > 0) /* the separator takes the previous string's NUL */
      t->buf[t->used - 1] = '\n';
    if (t_str(t, tx, &l) == NULL)
      return NULL;
  }
  if (n == 0) {
    if (t->used >= t->cap)
      return NULL;
    t->buf[t->used++] = '\0';
  }
  *len = (size_t)(t->buf + t->used - 1 - out);
  return out;
}

/* A tool message's content as ag_trajectory_parse reads it (b_text in
 * src/audit/trajectory.c): a string; null or absent: ""; an array of parts
 * (strings, or objects with a "text" string; others skipped) or a single
 * part object, joined by "\n". NULL for any other value (the audit's
 * parser refuses it) or when the buffer is full. */
static const char *t_chat_text(tape *t, size_t c, size_t *len) {
  *len = 0;
  if (c == 0 || t_is(t, c, AG__JT_NULL))
    return "";
  if (t_is(t, c, AG__JT_STR))
    return t_str(t, c, len);
  if (!t_is(t, c, AG__JT_ARR) && !t_is(t, c, AG__JT_OBJ))
    return NULL;
  char *out = t->buf + t->used;
  size_t n = 0, one_end = ag__jcs_tok_next(t->j, c);
  bool arr = t_is(t, c, AG__JT_ARR);
  for (size_t p = arr ? c + 1 : c; p < (arr ? one_end : c + 1);
       p = ag__jcs_tok_next(t->j, p)) {
    size_t tx = t_is(t, p, AG__JT_STR) ? p : t_get(t, p, "text"), l;
    if (!t_is(t, tx, AG__JT_STR))
      continue; /* images, audio: no text to judge */
    if (n++ > 0)
      t->buf[t->used - 1] = '\n';
    if (t_str(t, tx, &l) == NULL)
      return NULL;
  }
  if (n == 0) {
    if (t->used >= t->cap)
      return NULL;
    t->buf[t->used++] = '\0';
  }
  *len = (size_t)(t->buf + t->used - 1 - out);
  return out;
}

/* fast_turn over the tape: the messages' tokens msg[start..n). 1 (f
 * filled), 0 (fall back), -1 (out of memory). */
static int t_turn_chat(tape *t, const size_t *msg, size_t n, size_t start,
                       fast_traj *f) {
  size_t n_calls = 0, n_steps = 0;
  for (size_t i = start; i < n; i++)
    if (t_eq(t, t_get(t, msg[i], "role"), "assistant")) {
      n_steps++;
      n_calls += t_count(t, t_get(t, msg[i], "tool_calls"));
    }
  if (t_alloc(f, n_steps, n_calls) < 0)
    return -1;
  size_t si = 0, ci = 0, step0 = 0;
  bool in_step = false;
  for (size_t i = start; i < n; i++) {
    const size_t m = msg[i], role = t_get(t, m, "role");
    if (t_get(t, m, "usage") != 0)
      goto slow;
    if (t_eq(t, role, "assistant")) {
      for (size_t k = step0; in_step && k < ci; k++)
        if (!f->answered[k])
          goto slow;
      size_t content = t_get(t, m, "content"), tcs = t_get(t, m, "tool_calls");
      /* content: a string or null (an array of parts: no text, as the
       * audit's parser reads it) */
      if ((!t_is(t, content, AG__JT_STR) && !t_is(t, content, AG__JT_NULL) &&
           !t_is(t, content, AG__JT_ARR)) ||
          t_get(t, m, "function_call") != 0 ||
          (tcs != 0 && !t_is(t, tcs, AG__JT_NULL) && !t_is(t, tcs, AG__JT_ARR)))
        goto slow;
      ag_traj_step *st = &f->steps[si++];
      in_step = true;
      step0 = ci;
      st->text = t_is(t, content, AG__JT_ARR) ? NULL : "";
      if (t_is(t, content, AG__JT_STR) &&
          (st->text = t_str(t, content, &st->text_len)) == NULL)
        goto slow;
      t_step(st, f, ci);
      T_EACH(t, tcs, tc) {
        size_t fn = t_get(t, tc, "function");
        const char *id = t_str(t, t_get(t, tc, "id"), NULL);
        const char *name = t_str(t, t_get(t, fn, "name"), NULL);
        size_t args_len;
        const char *args = t_str(t, t_get(t, fn, "arguments"), &args_len);
        if (id == NULL || name == NULL || args == NULL)
          goto slow;
        for (size_t q = step0; q < ci; q++)
          if (strcmp(f->ids[q], id) == 0)
            goto slow; /* a repeated id */
        f->ids[ci] = id;
        f->calls[ci].name = name;
        f->calls[ci].args = args;
        f->calls[ci].args_len = args_len;
        f->results[ci].text = "";
        ci++;
      }
      st->n_calls = st->n_results = ci - step0;
    } else if (t_eq(t, role, "tool")) {
      size_t ie = t_get(t, m, "is_error"), len;
      if (!in_step ||
          (ie != 0 && !t_is(t, ie, AG__JT_TRUE) && !t_is(t, ie, AG__JT_FALSE)))
        goto slow;
      const char *id = t_str(t, t_get(t, m, "tool_call_id"), NULL);
      const char *content = t_chat_text(t, t_get(t, m, "content"), &len);
      if (id == NULL || content == NULL)
        goto slow;
      ag_traj_result *res = t_answer(f, step0, ci, id);
      if (res == NULL)
        goto slow;
      res->outcome =
          t_is(t, ie, AG__JT_TRUE) ? AG_OUTCOME_ERROR : AG_OUTCOME_OK;
      res->category = AG_CAT_AUTO;
      res->text = content;
      res->text_len = len;
    } else if (t_eq(t, role, "user")) {
      if (i != start)
        goto slow;
    } else if (!t_eq(t, role, "system") && !t_eq(t, role, "developer")) {
      goto slow;
    }
  }
  for (size_t k = step0; in_step && k < ci; k++)
    if (!f->answered[k])
      goto slow;
  t_done(f, si, ci);
  return 1;
slow:
  fast_free(f);
  return 0;
}

/* Whether ag__wire_messages.to_chat passes message token m (its 400s are the
 * jansson path's to give). */
static bool t_anth_ok(const tape *t, size_t m) {
  size_t role = t_get(t, m, "role"), content = t_get(t, m, "content");
  if (!t_eq(t, role, "user") && !t_eq(t, role, "assistant"))
    return false;
  if (!t_is(t, content, AG__JT_STR) && !t_is(t, content, AG__JT_ARR))
    return false;
  T_EACH(t, content, b) {
    size_t bt = t_get(t, b, "type");
    if (!t_is(t, bt, AG__JT_STR))
      return false;
    if (t_eq(t, bt, "tool_use") && (!t_is(t, t_get(t, b, "id"), AG__JT_STR) ||
                                    !t_is(t, t_get(t, b, "name"), AG__JT_STR)))
      return false;
    if (t_eq(t, bt, "tool_result") &&
        !t_is(t, t_get(t, b, "tool_use_id"), AG__JT_STR))
      return false;
  }
  return true;
}

/* anth_has_text over the tape. */
static bool t_anth_has_text(const tape *t, size_t m) {
  size_t content = t_get(t, m, "content");
  if (t_is(t, content, AG__JT_STR))
    return true;
  T_EACH(t, content, b) {
    if (t_eq(t, t_get(t, b, "type"), "text"))
      return true;
  }
  return false;
}

/* fast_turn_anth over the tape: the turn from msg[from] (a user message
 * with text). Returns as t_turn_chat. */
static int t_turn_anth(tape *t, const size_t *msg, size_t n, size_t from,
                       fast_traj *f) {
  size_t n_calls = 0, n_steps = 0;
  for (size_t i = from + 1; i < n; i++) {
    if (!t_eq(t, t_get(t, msg[i], "role"), "assistant"))
      continue;
    n_steps++;
    T_EACH(t, t_get(t, msg[i], "content"), b) {
      n_calls += t_eq(t, t_get(t, b, "type"), "tool_use");
    }
  }
  if (t_alloc(f, n_steps, n_calls) < 0)
    return -1;
  size_t si = 0, ci = 0, step0 = 0;
  bool in_step = false;
  for (size_t i = from + 1; i < n; i++) {
    const size_t m = msg[i], content = t_get(t, m, "content");
    if (t_eq(t, t_get(t, m, "role"), "assistant")) {
      for (size_t q = step0; in_step && q < ci; q++)
        if (!f->answered[q])
          goto slow;
      ag_traj_step *st = &f->steps[si++];
      in_step = true;
      step0 = ci;
      if ((st->text = t_anth_text(t, content, &st->text_len)) == NULL)
        goto slow;
      t_step(st, f, ci);
      T_EACH(t, content, b) {
        size_t bt = t_get(t, b, "type");
        if (t_eq(t, bt, "tool_result"))
          goto slow;
        if (!t_eq(t, bt, "tool_use"))
          continue;
        const char *id = t_str(t, t_get(t, b, "id"), NULL);
        const char *name = t_str(t, t_get(t, b, "name"), NULL);
        if (id == NULL || name == NULL)
          goto slow;
        for (size_t q = step0; q < ci; q++)
          if (strcmp(f->ids[q], id) == 0)
            goto slow; /* a repeated id */
        /* The arguments: the input's own text. fast_turn_anth gives
         * jansson's compact dump of it; the guard reads arguments only
         * through their JCS form (the call signature), the same for both
         * (duplicate keys and numbers jansson reads differently fall back
         * above). */
        size_t input = t_get(t, b, "input"), at = 0, al = 2;
        const char *args = "{}";
        if (input != 0) {
          al = ag__jcs_member_span(t->j, input - 1, &at);
          args = t->s + at;
        }
        f->ids[ci] = id;
        f->calls[ci].name = name;
        f->calls[ci].args = args;
        f->calls[ci].args_len = al;
        f->results[ci].text = "";
        ci++;
      }
      st->n_calls = st->n_results = ci - step0;
      continue;
    }
    T_EACH(t, content, b) {
      if (!t_eq(t, t_get(t, b, "type"), "tool_result"))
        continue;
      if (!in_step)
        goto slow;
      const char *id = t_str(t, t_get(t, b, "tool_use_id"), NULL);
      if (id == NULL)
        goto slow;
      ag_traj_result *res = t_answer(f, step0, ci, id);
      if (res == NULL)
        goto slow;
      res->outcome = t_is(t, t_get(t, b, "is_error"), AG__JT_TRUE)
                         ? AG_OUTCOME_ERROR
                         : AG_OUTCOME_OK;
      res->category = AG_CAT_AUTO;
      res->text = t_anth_text(t, t_get(t, b, "content"), &res->text_len);
      if (res->text == NULL)
        goto slow;
    }
  }
  for (size_t q = step0; in_step && q < ci; q++)
    if (!f->answered[q])
      goto slow;
  t_done(f, si, ci);
  return 1;
slow:
  fast_free(f);
  return 0;
}

/* ---- A relayed text chunk read from the tape ---------------------------
 *
 * Nearly every chunk of a Chat Completions stream carries only text:
 * {"id":..., "choices":[{"index":0, "delta":{"content":"..."},
 * "finish_reason":null}]}. Read as a jansson tree, each one cost about a
 * tenth of a loop's CPU at 20,000 chunks a second (perf: json_loadb with
 * what it calls 4.2% of every sample, jansson's own code 2.2%, the loops
 * 40%). fast_chunk reads such a chunk from the
 * tokenizer's tape, on a scratch kept by the loop (chunk_tape), and does
 * what on_sse_event's tree path does with it: the text to the assembler
 * and the content-loop detector, the chunk on to the client as it came.
 * It takes only that shape - after the stream's first chunk (whose id and
 * model are kept), "error" and "usage" absent or null, one choice with
 * "index" 0 (or none), "finish_reason" absent or null, a delta of
 * "content" (a string or null), "role" and a null "refusal" - and only a
 * chunk the tape takes and jansson would (no duplicate key, no "\u0000",
 * no integer jansson cannot hold). Anything else returns -1 and takes the
 * tree path, whose effects are the reference: tests/fuzz/fuzz_relay.c
 * replays every input both ways (AG_PROXY_REPLAY_TREE) and compares. */
#define CHUNK_TAPE_MAX 16384u

struct chunk_tape {
  ag__jcs *j;
  char buf[CHUNK_TAPE_MAX + 1]; /* the decoded text */
};

static chunk_tape *chunk_tape_new(void) {
  chunk_tape *ct = malloc(sizeof(*ct));
  if (ct != NULL &&
      ag__jcs_tape_new(&ct->j, CHUNK_TAPE_MAX, TAPE_DEPTH, NULL) != AG_OK) {
    free(ct);
    ct = NULL;
  }
  return ct;
}

static void chunk_tape_free(chunk_tape *ct) {
  if (ct != NULL) {
    ag__jcs_free(ct->j);
    free(ct);
  }
}

/* Whether member i's value (i + 1) is absent (i == 0) or null. */
static bool t_none(const tape *t, size_t i) {
  return i == 0 || t_is(t, i, AG__JT_NULL);
}

/* 0 or 1 as on_sse_event returns them; -1: not a text chunk (or the tape
 * refuses it), for the tree path. */
static int fast_chunk(stream_st *st, const char *data, size_t len) {
  chunk_tape *ct = st->ct;
  if (ct == NULL || st->id[0] == '\0' || len > CHUNK_TAPE_MAX)
    return -1;
  tape t = {ct->j, data, len, 0, ct->buf, 0, sizeof ct->buf};
  if (ag__jcs_tape(t.j, data, len, &t.n, NULL) != AG_OK ||
      ag__jcs_tok_type(t.j, 0) != AG__JT_OBJ || !t_jansson_safe(&t))
    return -1;
  if (!t_none(&t, t_get(&t, 0, "error")) || !t_none(&t, t_get(&t, 0, "usage")))
    return -1;
  size_t chs = t_get(&t, 0, "choices");
  if (t_count(&t, chs) != 1 || !t_is(&t, chs + 1, AG__JT_OBJ))
    return -1;
  size_t ch = chs + 1, ix = t_get(&t, ch, "index");
  if (ix != 0) { /* the integer 0, written "0" */
    size_t off = ag__jcs_tok_off(t.j, ix);
    if (!t_is(&t, ix, AG__JT_NUM) || data[off] != '0' ||
        (off + 1 < len && memchr(".eE", data[off + 1], 3) != NULL))
      return -1;
  }
  size_t d = t_get(&t, ch, "delta");
  if (!t_none(&t, t_get(&t, ch, "finish_reason")) || !t_is(&t, d, AG__JT_OBJ))
    return -1;
  size_t content = 0;
  size_t end = ag__jcs_tok_next(t.j, d);
  for (size_t k = d + 1; k < end; k = ag__jcs_tok_next(t.j, k + 1)) {
    if (ag__jcs_key_is(t.j, k, "content", 7) &&
        (t_is(&t, k + 1, AG__JT_STR) || t_is(&t, k + 1, AG__JT_NULL)))
      content = k + 1;
    else if (!ag__jcs_key_is(t.j, k, "role", 4) &&
             !(ag__jcs_key_is(t.j, k, "refusal", 7) &&
               t_is(&t, k + 1, AG__JT_NULL)))
      return -1;
  }
  size_t cl = 0;
  const char *text = t_str(&t, content, &cl); /* NULL: none, or null */
  if (text != NULL && !ag__asm_text(&st->asmb, text, cl))
    return 1;
  if (text != NULL && cl > 0) {
    ag_verdict v;
    if (ag_guard_check_text(st->g, text, cl, true, &v) != AG_ALLOW) {
      st->looped = true;
      st->loop_v = v;
      return 1;
    }
    st->any_text = true;
  }
  sb_event(&st->out, data, len);
  return st->out.failed || st->held.failed ? 1 : 0;
}

/*
 * The decision before forwarding, from the tape: the turn replayed through
 * a new guard (*g, which the caller frees), then the coming request
 * counted - what the jansson path decides for the same body. Returns the
 * action (v filled; *stream: the body's "stream" is true), -2 when out of
 * memory, or TAPE_FALLBACK (*g NULL): take the jansson path.
 */
static int tape_decide(const ag_config *cfg, const char *body, size_t len,
                       bool anth, ag_guard **g, ag_verdict *v, bool *stream) {
  *g = NULL;
  tape t = {NULL, body, len, 0, NULL, 0, 0};
  size_t *msg = NULL;
  int act = TAPE_FALLBACK;
  ag_error_t err;
  if (body == NULL || len == 0)
    return TAPE_FALLBACK;
  ag_err_t rc = ag__jcs_tape_new(&t.j, len, TAPE_DEPTH, &err);
  if (rc == AG_OK)
    rc = ag__jcs_tape(t.j, body, len, &t.n, &err);
  if (rc == AG_ENOMEM) {
    act = -2;
    goto out;
  }
  /* the root is token 0 (which t_is refuses: it is nobody's member) */
  if (rc != AG_OK || !t_jansson_safe(&t) ||
      ag__jcs_tok_type(t.j, 0) != AG__JT_OBJ)
    goto out;
  size_t msgs = t_get(&t, 0, "messages"), n = t_count(&t, msgs);
  if (n == 0)
    goto out;
  *stream = t_is(&t, t_get(&t, 0, "stream"), AG__JT_TRUE);
  msg = malloc(n * sizeof(*msg));
  t.cap = 2 * len + 16; /* decoded strings fit in 2x their source */
  t.buf = malloc(t.cap);
  if (msg == NULL || t.buf == NULL) {
    act = -2;
    goto out;
  }
  size_t k = 0;
  T_EACH(&t, msgs, e) {
    if (!t_is(&t, t_get(&t, e, "role"), AG__JT_STR) ||
        (anth && !t_anth_ok(&t, e)))
      goto out;
    msg[k++] = e;
  }
  size_t start = SIZE_MAX;
  for (size_t i = n; i-- > 0 && start == SIZE_MAX;)
    if (t_eq(&t, t_get(&t, msg[i], "role"), "user") &&
        (!anth || t_anth_has_text(&t, msg[i])))
      start = i;
  bool has_steps = false;
  if (start == SIZE_MAX) {
    if (anth)
      goto out; /* the jansson path converts every message then */
    start = 0;
  }
  for (size_t i = start; i < n && !has_steps; i++)
    has_steps = t_eq(&t, t_get(&t, msg[i], "role"), "assistant");
  fast_traj f;
  int fr = 0;
  if (has_steps || anth)
    fr = anth ? t_turn_anth(&t, msg, n, start, &f)
              : t_turn_chat(&t, msg, n, start, &f);
  if (fr < 0) {
    act = -2;
    goto out;
  }
  if (fr == 0 && (has_steps || anth))
    goto out;
  if (ag_guard_new(g, cfg, NULL, &err) != AG_OK) {
    if (fr > 0)
      fast_free(&f);
    act = err.code == AG_ENOMEM ? -2 : TAPE_FALLBACK;
    goto out;
  }
  memset(v, 0, sizeof(*v));
  v->call_index = -1;
  ag_guard_begin_turn(*g, 0);
  act = fr > 0 ? replay_fast(*g, &f, v) : AG_ALLOW;
  if (act >= 0 && !ag__stops((ag_action)act))
    act = ag_guard_begin_iteration(*g, 0, v);
out:
  if (act == TAPE_FALLBACK || act == -2) {
    ag_guard_free(*g);
    *g = NULL;
  }
  free(msg);
  free(t.buf);
  ag__jcs_free(t.j);
  return act;
}

/* An Anthropic message object as the events of a stream. */
static void anthropic_sse(reply *r) {
  json_t *msg = json_loadb(r->body != NULL ? r->body : "", r->len, 0, NULL);
  sbuf b = {NULL, 0, 0, false};
  json_t *content = json_object_get(msg, "content");
  if (!json_is_array(content)) {
    json_decref(msg);
    set_error(r, 502, "upstream_error", "upstream_bad_reply",
              "agentguard proxy: the upstream's reply is not a Messages "
              "response: no content array");
    return;
  }
  json_t *usage = json_object_get(msg, "usage");
  json_t *start = json_deep_copy(msg);
  json_object_set_new(start, "content", json_array());
  json_object_set_new(start, "stop_reason", json_null());
#define EV(name, obj)                                                          \
  do {                                                                         \
    sb_add(&b, "event: " name "\n", sizeof("event: " name "\n") - 1);          \
    sb_json(&b, obj);                                                          \
  } while (0)
  EV("message_start",
     json_pack("{s:s, s:o}", "type", "message_start", "message", start));
  size_t i;
  json_t *blk;
  json_array_foreach(content, i, blk) {
    const char *bt = json_string_value(json_object_get(blk, "type"));
    json_t *head = json_deep_copy(blk);
    json_t *delta = NULL;
    if (bt != NULL && strcmp(bt, "text") == 0) {
      json_object_set_new(head, "text", json_string(""));
      delta = json_pack("{s:s, s:O}", "type", "text_delta", "text",
                        json_object_get(blk, "text"));
    } else if (bt != NULL && strcmp(bt, "tool_use") == 0) {
      char *in = json_dumps(json_object_get(blk, "input"),
                            JSON_COMPACT | JSON_ENCODE_ANY);
      json_object_set_new(head, "input", json_object());
      delta = json_pack("{s:s, s:s}", "type", "input_json_delta",
                        "partial_json", in != NULL ? in : "{}");
      free(in);
    }
    EV("content_block_start",
       json_pack("{s:s, s:i, s:o}", "type", "content_block_start", "index",
                 (int)i, "content_block", head));
    if (delta != NULL)
      EV("content_block_delta",
         json_pack("{s:s, s:i, s:o}", "type", "content_block_delta", "index",
                   (int)i, "delta", delta));
    EV("content_block_stop",
       json_pack("{s:s, s:i}", "type", "content_block_stop", "index", (int)i));
  }
  json_t *out_tokens = json_object_get(usage, "output_tokens");
  EV("message_delta",
     json_pack("{s:s, s:{s:O, s:n}, s:{s:I}}", "type", "message_delta", "delta",
               "stop_reason", json_object_get(msg, "stop_reason"),
               "stop_sequence", "usage", "output_tokens",
               (json_int_t)(json_is_integer(out_tokens)
                                ? json_integer_value(out_tokens)
                                : 0)));
  EV("message_stop", json_pack("{s:s}", "type", "message_stop"));
#undef EV
  json_decref(msg);
  free(r->body);
  r->body = NULL;
  curl_slist_free_all(r->headers);
  r->headers = NULL;
  set_sse(r, &b);
}

/* The request as a jansson tree (*req), parsed now if the decision came
 * from the tape; false with a 400 in r if jansson refuses it. */
static bool load_req(const req_ctx *q, json_t **req, reply *r) {
  if (*req != NULL)
    return true;
  json_error_t je;
  *req = json_loadb(q->body != NULL ? q->body : "", q->len, 0, &je);
  if (*req == NULL)
    set_error(r, 400, "invalid_request_error", "invalid_json",
              "agentguard proxy: the request body is not JSON: %s (line %d, "
              "column %d)",
              je.text, je.line, je.column);
  return *req != NULL;
}

/* Decides a guarded request and acts on it: r is the answer, or
 * *started says a stream was handed to the loop (stream_start). With
 * `later` (on the loop's thread, which may not wait), a request whose
 * answer needs a whole upstream reply (not a stream, or the final request
 * without tools) is left untouched for a worker, with *later set. */
static void chat(ag_proxy *p, struct MHD_Connection *c, req_ctx *q,
                 const char *path, reply *r, bool *started, bool *later) {
  const bool anth = r->anthropic;
  bool anth_stream = false;
  char *fwd = NULL;
  size_t fwd_len = 0;
  json_error_t je;
  json_t *req = NULL;
  ag_guard *g = NULL;
  ag_reply rep, rep2;
  memset(&rep, 0, sizeof rep);
  memset(&rep2, 0, sizeof rep2);
  upstream u;
  memset(&u, 0, sizeof u);
  ag_verdict v;
  bool stream = false;
  /* the decision from the tape; the tree is parsed only when needed */
  int act = tape_decide(&p->cfg, q->body, q->len, anth, &g, &v, &stream);
  if (act == -2) {
    set_error(r, 500, "server_error", "out_of_memory", "out of memory");
    return;
  }
  if (act != TAPE_FALLBACK) {
    anth_stream = anth && stream;
    if (ag__stops((ag_action)act) && !load_req(q, &req, r))
      goto out;
    goto decided;
  }
  req = json_loadb(q->body != NULL ? q->body : "", q->len, 0, &je);
  if (req == NULL) {
    set_error(r, 400, "invalid_request_error", "invalid_json",
              "agentguard proxy: the request body is not JSON: %s (line %d, "
              "column %d)",
              je.text, je.line, je.column);
    return;
  }
  json_t *msgs = json_object_get(req, "messages");
  if (!json_is_object(req) || !json_is_array(msgs) ||
      json_array_size(msgs) == 0) {
    set_error(r, 400, "invalid_request_error", "invalid_request",
              "agentguard proxy: %s",
              !json_is_object(req) ? "the request body must be a JSON object"
                                   : "messages: expected a non-empty array");
    goto out;
  }
  size_t i;
  json_t *m;
  json_array_foreach(msgs, i, m) {
    if (!json_is_string(json_object_get(m, "role"))) {
      set_error(r, 400, "invalid_request_error", "invalid_request",
                "agentguard proxy: messages[%zu].role: expected a string", i);
      goto out;
    }
  }
  char emsg[ERR_MSG_MAX];
  /* an Anthropic stream is relayed (stream_start); a reply the proxy makes
   * itself is told as a stream at the end (anthropic_sse) */
  stream = json_is_true(json_object_get(req, "stream"));
  anth_stream = anth && stream;
  ag_error_t err;
  if (ag_guard_new(&g, &p->cfg, NULL, &err) != AG_OK) {
    set_error(r, 500, "server_error", "guard", "agentguard proxy: %s", err.msg);
    goto out;
  }
  act = anth ? replay_turn_anth(g, msgs, &v, emsg, sizeof emsg)
             : replay_turn(g, msgs, SIZE_MAX, &v, emsg, sizeof emsg);
  if (act == -1) {
    set_error(r, 400, "invalid_request_error", "invalid_request",
              "agentguard proxy: %s", emsg);
    goto out;
  }
  if (act == -2) {
    set_error(r, 500, "server_error", "out_of_memory", "out of memory");
    goto out;
  }
  if (!ag__stops((ag_action)act))
    act = ag_guard_begin_iteration(g, 0, &v);
decided:
  if (later != NULL &&
      (ag__stops((ag_action)act)
           ? p->cfg.loop.final_request_without_tools && v.action == AG_STOP
           : !stream)) {
    *later = true; /* nothing said or sent yet: the worker decides again */
    goto out;
  }
  if (ag__stops((ag_action)act)) {
    bool final = p->cfg.loop.final_request_without_tools && v.action == AG_STOP;
    event(p, final ? "final_request_without_tools" : "stopped_before_request",
          path, &v, NULL);
    if (final)
      final_without_tools(p, q->client_hdrs, q->uri, q->client_fd, req, &v, r);
    else
      set_stop_reply(p, req, &v, r);
    goto out;
  }
  /* The error context of the replayed errors, for this request only (the
   * loop's rule: it never enters the conversation the client keeps). */
  if (p->cfg.errors.error_context) {
    char ectx[8192];
    size_t need = ag_guard_error_context(g, AG_RECOVER_EXECUTION, NULL, 0, ectx,
                                         sizeof ectx);
    if (need > 0 && ectx[0] != '\0') {
      if (!load_req(q, &req, r))
        goto out;
      json_t *extra =
          json_pack("[{s:s, s:s}]", "role", "user", "content", ectx);
      free(fwd);
      fwd = extra != NULL ? with_messages(req, extra, &fwd_len) : NULL;
      json_decref(extra);
      if (fwd == NULL) {
        set_error(r, 500, "server_error", "out_of_memory", "out of memory");
        goto out;
      }
      event(p, "error_context", path, NULL, NULL);
    }
  }
  if (stream) {
    *started = stream_start(p, c, q, &fwd, fwd_len, anth, path, &g, r);
    if (*started)
      anth_stream = false; /* q and r are the loop's now: not touched */
    goto out;
  }
  send_upstream(p, q->client_hdrs, "POST", q->uri, fwd != NULL ? fwd : q->body,
                fwd != NULL ? fwd_len : q->len, fwd != NULL, q->client_fd, &u);
  if (upstream_failed(p, &u, r))
    goto out;
  if (u.status < 200 || u.status >= 300) {
    pass_back(&u, r);
    goto out;
  }
  if (!read_reply(&u, &rep, r))
    goto out;
  ag_call_check checks[AG__CALLS_MAX];
  act = check_reply(g, &rep, false, checks, &v);
  if (act == AG_ALLOW) {
    pass_back(&u, r);
    goto out;
  }
  if (!load_req(q, &req, r))
    goto out;
  if (ag__stops((ag_action)act)) {
    event(p, "reply_replaced", path, &v, NULL);
    set_stop_reply(p, req, &v, r);
    goto out;
  }
  /* A nudge: the held-back calls answered by the nudge, asked once more. */
  event(p, "nudge", path, &v, NULL);
  json_t *extra = anth ? nudge_messages_anthropic(&rep, checks)
                       : nudge_messages(&rep, checks);
  size_t len = 0;
  char *body = extra != NULL ? with_messages(req, extra, &len) : NULL;
  json_decref(extra);
  if (body == NULL) {
    set_error(r, 500, "server_error", "out_of_memory", "out of memory");
    goto out;
  }
  act = record_nudged(g, &rep, checks, &v);
  if (ag__stops((ag_action)act)) {
    free(body);
    event(p, "reply_replaced", path, &v, NULL);
    set_stop_reply(p, req, &v, r);
    goto out;
  }
  upstream_free(&u);
  send_upstream(p, q->client_hdrs, "POST", q->uri, body, len, true,
                q->client_fd, &u);
  free(body);
  if (upstream_failed(p, &u, r))
    goto out;
  if (u.status < 200 || u.status >= 300) {
    pass_back(&u, r);
    goto out;
  }
  if (!read_reply(&u, &rep2, r))
    goto out;
  act = check_reply(g, &rep2, false, checks, &v);
  if (act == AG_ALLOW) {
    pass_back(&u, r);
    goto out;
  }
  /* One nudge per request: a second one stops. */
  if (act == AG_NUDGE)
    v.action = AG_STOP;
  event(p, "reply_replaced", path, &v, NULL);
  set_stop_reply(p, req, &v, r);
out:
  if (anth_stream && r->status == 200)
    anthropic_sse(r);
  ag_reply_clear(&rep);
  ag_reply_clear(&rep2);
  upstream_free(&u);
  ag_guard_free(g);
  json_decref(req);
  free(fwd);
}

int ag_proxy_decide(const ag_config *cfg, const char *body, size_t len,
                    bool anthropic, ag_verdict *v, ag_error_t *err) {
  return ag_proxy_decide_read(cfg, body, len, anthropic, AG_PROXY_READ_ANY, v,
                              err);
}

int ag_proxy_decide_read(const ag_config *cfg, const char *body, size_t len,
                         bool anthropic, ag_proxy_read how, ag_verdict *v,
                         ag_error_t *err) {
  if (how != AG_PROXY_READ_TREE) {
    ag_guard *tg = NULL;
    bool stream = false;
    int tact = tape_decide(cfg, body, len, anthropic, &tg, v, &stream);
    ag_guard_free(tg);
    if (tact == -2) {
      fail(err, AG_ENOMEM, "out of memory");
      return -1;
    }
    if (tact != TAPE_FALLBACK)
      return tact;
    if (how == AG_PROXY_READ_TAPE)
      return -2;
  }
  json_error_t je;
  json_t *req = json_loadb(body, len, 0, &je);
  if (req == NULL) {
    fail(err, AG_EJSON, "the request body is not JSON: %s (line %d, column %d)",
         je.text, je.line, je.column);
    return -1;
  }
  json_t *msgs = json_object_get(req, "messages");
  ag_guard *g = NULL;
  char emsg[ERR_MSG_MAX];
  int act = -1;
  if (!json_is_array(msgs) || json_array_size(msgs) == 0) {
    fail(err, AG_EINVAL, "messages: expected a non-empty array");
    goto out;
  }
  size_t i;
  json_t *m;
  json_array_foreach(msgs, i, m) {
    if (!json_is_string(json_object_get(m, "role"))) {
      fail(err, AG_EINVAL, "messages[%zu].role: expected a string", i);
      goto out;
    }
  }
  if (ag_guard_new(&g, cfg, NULL, err) != AG_OK)
    goto out;
  act = anthropic ? replay_turn_anth(g, msgs, v, emsg, sizeof emsg)
                  : replay_turn(g, msgs, SIZE_MAX, v, emsg, sizeof emsg);
  if (act == -1)
    fail(err, AG_EINVAL, "%s", emsg);
  else if (act == -2)
    fail(err, AG_ENOMEM, "out of memory");
  else if (!ag__stops((ag_action)act))
    act = ag_guard_begin_iteration(g, 0, v);
  if (act < 0)
    act = -1;
out:
  ag_guard_free(g);
  json_decref(req);
  return act;
}

/* ------------------------------------------------------------------------ */
/* Serving (libmicrohttpd)                                                  */
/* ------------------------------------------------------------------------ */

/* Whether a normalised path (target.c) is one the guard decides. */
static bool guarded_path(const char *path) {
  size_t n = strlen(path);
  return ag__target_is(path, n, "/v1/chat/completions") ||
         ag__target_is(path, n, "/chat/completions") ||
         ag__target_is(path, n, "/v1/messages");
}

/* Whether a normalised path is Anthropic's Messages API. */
static bool anthropic_path(const char *path) {
  return ag__target_is(path, strlen(path), "/v1/messages");
}

/* Headers "Name: value" onto a response. */
static void add_headers(struct MHD_Response *resp,
                        const struct curl_slist *list) {
  for (const struct curl_slist *s = list; s != NULL; s = s->next) {
    const char *colon = strchr(s->data, ':');
    if (colon == NULL || colon == s->data)
      continue;
    char name[256];
    size_t nl = (size_t)(colon - s->data);
    if (nl >= sizeof name)
      continue; /* no header of an API is named that long */
    memcpy(name, s->data, nl);
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
  add_headers(resp, r->headers);
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
static void on_connection(void *cls, struct MHD_Connection *c,
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
                                            mono_ms(), &why);
}

static void *on_uri(void *cls, const char *uri, struct MHD_Connection *c) {
  (void)cls;
  req_ctx *q = calloc(1, sizeof(*q));
  if (q != NULL) {
    q->client_fd = -1;
    q->uri = dupz(uri != NULL ? uri : "/");
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    q->conn = ci != NULL ? ci->socket_context : NULL;
    q->too_many = ag__conn_refused(q->conn);
    ag__conns_state(q->conn, AG__CONN_HEADERS, mono_ms());
  }
  return q;
}

/* The path of a request's URI, without its query. */
static void uri_path(const char *uri, char *path, size_t cap) {
  size_t pl = strcspn(uri, "?");
  snprintf(path, cap, "%.*s", (int)(pl < cap ? pl : 0), uri);
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
static void *job_main(void *arg) {
  req_ctx *q = arg;
  shard *sh = q->sh;
  ag_proxy *p = sh->p;
  struct MHD_Connection *c = q->c;
  tl_relay = sh->relay;
  char path[2048];
  uri_path(q->uri, path, sizeof path);
  bool started = false;
  chat(p, c, q, path, &q->r, &started, NULL); /* only guarded ones come */
  if (!started) { /* else the stream's loop answers the request */
    atomic_store(&q->answered, true);
    resume(sh, c);
  }
  job_end(p);
  return NULL;
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
static void *nudge_main(void *arg) {
  nudge_job *nj = arg;
  pthread_setname_np(pthread_self(), "ag-nudge");
  stream_st *st = nj->st;
  ag_proxy *p = st->p;
  tl_relay = st->sh->relay;
  if (st->anth)
    stream_nudge_anth(st, nj);
  else
    stream_nudge(st, nj);
  flush(st, true);
  ag_reply_clear(&nj->rep);
  free(nj);
  stream_release(st, true);
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
  pthread_mutex_lock(&p->jobs_mu);
  bool stopping = p->stopping;
  if (!stopping)
    p->jobs++; /* ag_proxy_stop waits for it */
  pthread_mutex_unlock(&p->jobs_mu);
  if (!stopping && spawn_detached(nudge_main, nj))
    return true;
  if (!stopping)
    job_end(p);
  nudge_fail(nj, stopping ? "agentguard proxy: shutting down"
                          : "agentguard proxy: cannot start a thread to ask "
                            "the upstream again");
  return false;
}

/* The end of a relayed stream whose client is still there, on its loop
 * (on_stream_done): the calls checked and the end written, or a nudge
 * handed to its own thread; lets go of the end's reference. */
static void stream_end(stream_st *st) {
  nudge_job *nj = NULL;
  stream_finish(st, &nj);
  if (nj != NULL && start_nudge(nj))
    return;
  flush(st, true);
  stream_release(st, true);
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
  req_ctx *refused = NULL;
  while (p->queue != NULL && p->queued > p->idle + p->spawning) {
    req_ctx *q = p->queue;
    p->queue = q->next_job;
    if (p->queue == NULL)
      p->queue_tail = NULL;
    p->queued--;
    q->next_job = refused;
    refused = q;
  }
  pthread_mutex_unlock(&p->jobs_mu);
  while (refused != NULL) {
    req_ctx *q = refused;
    refused = q->next_job;
    set_error(&q->r, 503, "server_error", "no_thread",
              "agentguard proxy: cannot start a thread for the request");
    shard *sh = q->sh;
    struct MHD_Connection *c = q->c;
    atomic_store(&q->answered, true);
    resume(sh, c); /* q is the connection's again */
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
    job_main(q);
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
static enum MHD_Result send_answer(struct MHD_Connection *c, req_ctx *q) {
  if (!atomic_load(&q->answered))
    return MHD_YES; /* not expected: the connection was suspended */
  stream_st *st = q->st;
  q->st = NULL;
  if (st == NULL) {
    enum MHD_Result ret = send_reply(c, &q->r);
    reply_free(&q->r);
    return ret;
  }
  struct MHD_Response *resp = MHD_create_response_from_callback(
      MHD_SIZE_UNKNOWN, 16 * 1024, stream_read, st, stream_free);
  if (resp == NULL) {
    stream_free(st);
    return MHD_NO;
  }
  unsigned status = 200;
  if (st->raw) {
    /* the upstream's status and headers (st->u is the loop's: it was
     * filled on this thread before the answer) */
    status = (unsigned)st->status;
    add_headers(resp, st->u.headers);
  } else {
    MHD_add_response_header(resp, "Content-Type", "text/event-stream");
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
  }
  enum MHD_Result ret = MHD_queue_response(c, status, resp);
  MHD_destroy_response(resp);
  return ret;
}

/* Hands the request to its own thread (job_main) and suspends the
 * connection; false with q->r filled when that cannot be done. */
static bool start_job(shard *sh, struct MHD_Connection *c, req_ctx *q) {
  ag_proxy *p = sh->p;
  pthread_mutex_lock(&p->jobs_mu);
  bool stopping = p->stopping;
  if (!stopping)
    p->jobs++;
  pthread_mutex_unlock(&p->jobs_mu);
  if (stopping) {
    set_error(&q->r, 503, "server_error", "shutting_down",
              "agentguard proxy: shutting down");
    return false;
  }
  q->job = true;
  MHD_suspend_connection(c);
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
    set_error(&q->r, 503, "server_error", "no_thread",
              "agentguard proxy: cannot start a thread for the request");
    atomic_store(&q->answered, true);
    resume(sh, c); /* the handler is called again: send_answer */
  }
  return true;
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
 * a cheap look, so that a request that is not streamed goes straight to a
 * worker instead of being decided twice; the decision reads the body
 * properly. */
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

/* A streamed guarded request decided on the loop's own thread, without
 * the two thread hand-offs of a worker (there and back) before its first
 * byte: 1 when its stream started (the connection is suspended until the
 * loop answers), 0 when q->r is the answer (a stop, a bad request), -1
 * when it is a worker's: not a stream (its answer waits for the upstream's
 * whole reply), a body over HERE_BODY_MAX, or the final request without
 * tools. */
static int decide_here(shard *sh, struct MHD_Connection *c, req_ctx *q,
                       const char *path) {
  ag_proxy *p = sh->p;
  if (strcmp(q->method, "POST") != 0 || !guarded_path(path) ||
      q->len > HERE_BODY_MAX || q->body == NULL ||
      !says_stream(q->body, q->len))
    return -1;
  pthread_mutex_lock(&p->jobs_mu);
  bool stopping = p->stopping;
  pthread_mutex_unlock(&p->jobs_mu);
  if (stopping)
    return -1; /* start_job answers it */
  bool started = false, later = false;
  chat(p, c, q, path, &q->r, &started, &later);
  if (later)
    return -1;
  if (!started)
    return 0;
  /* the transfer is queued on this loop: its answer (answer_stream or
   * answer_reply) comes in a later round, after this suspension */
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
static bool refused(ag_proxy *p, struct MHD_Connection *c, req_ctx *q) {
  const char *why = NULL;
  bool ok = ag__target_normalise(q->uri, q->uri, strlen(q->uri) + 1, &why);
  char path[2048];
  uri_path(ok ? q->uri : "/", path, sizeof path);
  q->r.anthropic = anthropic_path(path);
  if (q->too_many == AG__CONN_OVER_PER_CLIENT) {
    set_error(&q->r, 503, "server_error", "too_many_connections",
              "agentguard proxy: this address has %u connections open, each "
              "serving a request (--max-connections-per-client)",
              p->per_client);
    q->r.close = true;
  } else if (q->too_many != AG__CONN_ADMITTED) {
    set_error(&q->r, 503, "server_error", "too_many_connections",
              "agentguard proxy: more than %u client connections are open, "
              "each serving a request (--max-connections)",
              p->max_conns);
    q->r.close = true;
  } else if (!key_ok(p, c)) {
    set_error(&q->r, 401, "invalid_request_error", "agentguard_key",
              "agentguard proxy: this proxy needs its client key in the "
              "x-agentguard-key header");
    q->r.close = true;
  } else if (!ok) {
    set_error(&q->r, 400, "invalid_request_error", "bad_request_target",
              "agentguard proxy: %s", why);
    q->r.close = true;
    event(p, "bad_request_target", "", NULL, why);
  } else {
    return false;
  }
  return true;
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c,
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
    return send_answer(c, q);
  if (!q->begun) {
    /* The headers are in, the body comes next: whatever can refuse the
     * request is checked now, before a byte of the body is read. */
    q->begun = true;
    ag__conns_state(q->conn, AG__CONN_BODY, mono_ms());
    if (!refused(p, c, q))
      return MHD_YES;
    enum MHD_Result ret = send_reply(c, &q->r);
    reply_free(&q->r);
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
  ag__conns_state(q->conn, AG__CONN_BUSY, mono_ms());
  if (q->too_big) {
    set_error(&q->r, 413, "invalid_request_error", "body_too_large",
              "agentguard proxy: the request body is larger than %zu bytes "
              "(--max-body)",
              p->max_body);
  } else if ((q->method = dupz(method)) == NULL ||
             !client_headers(c, &q->client_hdrs)) {
    set_error(&q->r, 500, "server_error", "out_of_memory", "out of memory");
  } else {
    q->sh = sh;
    q->c = c;
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    q->client_fd = ci != NULL ? ci->connect_fd : -1;
    if (strcmp(method, "POST") != 0 || !guarded_path(path)) {
      if (relay_start(p, c, q, path, &q->r)) {
        /* answered by the loop once the upstream's status is in */
        q->job = true;
        MHD_suspend_connection(c);
        return MHD_YES;
      }
    } else {
      int here = decide_here(sh, c, q, path);
      if (here == 1)
        return MHD_YES; /* a stream: suspended, answered by the loop */
      if (here < 0 && start_job(sh, c, q))
        return MHD_YES; /* suspended: answered by the request's thread */
    }
  }
  enum MHD_Result ret = send_reply(c, &q->r);
  reply_free(&q->r);
  return ret;
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode toe) {
  (void)cls;
  (void)c;
  (void)toe;
  req_ctx *q = *con_cls;
  if (q != NULL) {
    ag__conns_state(q->conn, AG__CONN_IDLE, mono_ms());
    reply_free(&q->r);
    if (q->st != NULL)
      stream_free(q->st);
    curl_slist_free_all(q->client_hdrs);
    free(q->method);
    free(q->uri);
    free(q->body);
    free(q);
  }
  *con_cls = NULL;
}

/* The relay's hook: the daemon's work, on the relay's thread; and, when
 * it is due, the sweep of every loop's connections past their deadlines
 * (conns.h), by whichever loop comes first. */
static void mhd_run(void *user) {
  shard *sh = user;
  ag_proxy *p = sh->p;
  MHD_run(sh->d);
  int64_t now = mono_ms();
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

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_rc = CURLE_OK;
static void curl_init(void) {
  curl_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

/* The listening socket, shared by every loop (each daemon takes a
 * duplicate): bound once, so a port in use is refused as it should be. */
static int listen_on(const struct sockaddr_in *sa, int *e) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int one = 1;
  if (fd < 0 ||
      setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
      bind(fd, (const struct sockaddr *)sa, sizeof(*sa)) != 0 ||
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

/* The event loops, two per core (at most SHARDS_MAX), each a daemon (no
 * threads of its own, its epoll set served by the relay's loop: a chunk
 * read from the upstream is checked and written to the client on one
 * thread) and a relay, on the shared listening socket (the kernel wakes
 * the loops for new connections; one accepts). Each daemon may hold
 * `limit` + CONN_SLACK connections; on_connection keeps the limit over all
 * of them.
 * false on failure (errno). */
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
    int fd = dup(lfd);
    if (fd < 0)
      return false;
    sh->d = MHD_start_daemon(
        MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG, 0, NULL,
        NULL, handler, sh, MHD_OPTION_LISTEN_SOCKET, fd,
        MHD_OPTION_CONNECTION_LIMIT, limit + CONN_SLACK,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)120,
        MHD_OPTION_URI_LOG_CALLBACK, on_uri, NULL, MHD_OPTION_NOTIFY_COMPLETED,
        completed, NULL, MHD_OPTION_NOTIFY_CONNECTION, on_connection, sh,
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
      sh->ct = sh->relay != NULL ? chunk_tape_new() : NULL;
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
    chunk_tape_free(sh->ct);
  }
  p->n_sh = 0;
}

static ag_err_t fail(ag_error_t *err, ag_err_t code, const char *fmt, ...) {
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
  size_t n = ag__secrets_from_env(environ, found, AG__SECRETS_MAX - 4);
  char *parts[4] = {NULL, NULL, NULL, NULL};
  curl_url_get(p->up, CURLUPART_USER, &parts[0], 0);
  curl_url_get(p->up, CURLUPART_USER, &parts[1], CURLU_URLDECODE);
  curl_url_get(p->up, CURLUPART_PASSWORD, &parts[2], 0);
  curl_url_get(p->up, CURLUPART_PASSWORD, &parts[3], CURLU_URLDECODE);
  for (int i = 0; i < 4; i++)
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
  for (int i = 0; i < 4; i++)
    curl_free(parts[i]);
  return rc;
}

/* --upstream, read once with libcurl's URL API: http or https, a host, no
 * query or fragment. Fills p->up (kept whole: the credentials go with
 * every request), up_path, upstream_v1, up_shown and the secrets. */
static ag_err_t parse_upstream(ag_proxy *p, const char *url, ag_error_t *err) {
  char shown[512];
  url_shown(url, shown, sizeof shown);
  char *scheme = NULL, *host = NULL, *port = NULL, *path = NULL, *q = NULL,
       *frag = NULL;
  ag_err_t rc = AG_OK;
  CURLUcode uc = CURLUE_OUT_OF_MEMORY;
  if ((p->up = curl_url()) != NULL)
    uc = curl_url_set(p->up, CURLUPART_URL, url, 0);
  if (uc == CURLUE_OK)
    uc = curl_url_get(p->up, CURLUPART_SCHEME, &scheme, 0);
  if (uc == CURLUE_OK)
    uc = curl_url_get(p->up, CURLUPART_HOST, &host, 0);
  if (uc == CURLUE_OK)
    uc = curl_url_get(p->up, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT);
  if (uc == CURLUE_OK)
    uc = curl_url_get(p->up, CURLUPART_PATH, &path, 0);
  if (uc == CURLUE_OUT_OF_MEMORY)
    rc = fail(err, AG_ENOMEM, "out of memory");
  else if (uc != CURLUE_OK)
    rc = fail(err, AG_EINVAL,
              "--upstream '%s': expected an http:// or https:// URL: %s", shown,
              curl_url_strerror(uc));
  else if (strcmp(scheme, "http") != 0 && strcmp(scheme, "https") != 0)
    rc = fail(err, AG_EINVAL,
              "--upstream '%s': expected an http:// or https:// URL, not %s",
              shown, scheme);
  else if (curl_url_get(p->up, CURLUPART_QUERY, &q, 0) == CURLUE_OK ||
           curl_url_get(p->up, CURLUPART_FRAGMENT, &frag, 0) == CURLUE_OK)
    rc = fail(err, AG_EINVAL,
              "--upstream '%s': a query or fragment cannot be kept (the "
              "client's request supplies them)",
              shown);
  if (rc == AG_OK) {
    size_t pl = strlen(path);
    while (pl > 0 && path[pl - 1] == '/')
      path[--pl] = '\0';
    p->upstream_v1 = pl >= 3 && strcmp(path + pl - 3, "/v1") == 0;
    p->up_path = dupz(path);
    size_t sl = strlen(scheme) + strlen(host) + strlen(port) + 5;
    if ((p->up_shown = malloc(sl)) != NULL)
      snprintf(p->up_shown, sl, "%s://%s:%s", scheme, host, port);
    if (p->up_path == NULL || p->up_shown == NULL || keep_secrets(p) != AG_OK)
      rc = fail(err, AG_ENOMEM, "out of memory");
  }
  curl_free(scheme);
  curl_free(host);
  curl_free(port);
  curl_free(path);
  curl_free(q);
  curl_free(frag);
  return rc;
}

/* Frees what ag_proxy_start allocated for p, and p. */
static void proxy_free(ag_proxy *p) {
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
  curl_url_cleanup(p->up);
  ag__conns_free(p->conns);
  ag__budget_free(p->budget);
  free(p->up_path);
  free(p->up_shown);
  free(p);
}

const char *ag_proxy_upstream(const ag_proxy *p) {
  return p != NULL ? p->up_shown : NULL;
}

ag_err_t ag_proxy_start(ag_proxy **out, const ag_proxy_opts *o,
                        ag_error_t *err) {
  if (out == NULL || o == NULL)
    return fail(err, AG_EINVAL, "ag_proxy_start: NULL argument");
  *out = NULL;
  const char *host = o->listen_host != NULL ? o->listen_host : "127.0.0.1";
  struct sockaddr_in sa;
  memset(&sa, 0, sizeof sa);
  sa.sin_family = AF_INET;
  sa.sin_port = htons(o->port);
  if (inet_pton(AF_INET, host, &sa.sin_addr) != 1)
    return fail(err, AG_EINVAL,
                "--listen: '%s' is not an IPv4 address (e.g. 127.0.0.1)", host);
  bool loopback = (ntohl(sa.sin_addr.s_addr) >> 24) == 127;
  if (!loopback && (o->client_key == NULL || o->client_key[0] == '\0'))
    return fail(err, AG_EINVAL,
                "--listen %s is not a loopback address: give --client-key-env "
                "NAME (clients then send that key in x-agentguard-key)",
                host);
  if (o->upstream == NULL)
    return fail(err, AG_EINVAL,
                "--upstream: expected an http:// or https:// URL, got none");
  if (o->max_connections < 0 ||
      o->max_connections > AG_PROXY_MAX_CONNECTIONS_LIMIT)
    return fail(err, AG_EINVAL,
                "--max-connections %d: expected a number from 1 to %d",
                o->max_connections, AG_PROXY_MAX_CONNECTIONS_LIMIT);
  unsigned limit = o->max_connections > 0 ? (unsigned)o->max_connections
                                          : AG_PROXY_MAX_CONNECTIONS;
  if (o->max_connections_per_client < 0 ||
      (unsigned)o->max_connections_per_client > limit)
    return fail(err, AG_EINVAL,
                "--max-connections-per-client %d: expected a number from 1 to "
                "%u (--max-connections)",
                o->max_connections_per_client, limit);
  if (o->idle_timeout_ms < 0 || o->header_timeout_ms < 0 ||
      o->request_timeout_ms < 0)
    return fail(err, AG_EINVAL,
                "a connection timeout is negative (idle %lld, header %lld, "
                "request %lld ms)",
                (long long)o->idle_timeout_ms, (long long)o->header_timeout_ms,
                (long long)o->request_timeout_ms);
  ag_guard *probe = NULL;
  ag_err_t grc = ag_guard_new(&probe, &o->cfg, NULL, err);
  ag_guard_free(probe);
  if (grc != AG_OK)
    return grc;
  pthread_once(&curl_once, curl_init);
  if (curl_rc != CURLE_OK)
    return fail(err, AG_ENOMEM, "libcurl: %s", curl_easy_strerror(curl_rc));
  ag_proxy *p = calloc(1, sizeof(*p));
  if (p == NULL)
    return fail(err, AG_ENOMEM, "out of memory");
  p->client_key = o->client_key != NULL ? dupz(o->client_key) : NULL;
  ag_err_t urc = o->client_key != NULL && p->client_key == NULL
                     ? fail(err, AG_ENOMEM, "out of memory")
                     : parse_upstream(p, o->upstream, err);
  if (urc != AG_OK) {
    proxy_free(p);
    return urc;
  }
  p->cfg = o->cfg;
  p->max_body = o->max_body > 0 ? o->max_body : AG_PROXY_MAX_BODY_DEFAULT;
  p->events = o->events;
  p->timeout_ms = o->upstream_timeout_ms > 0 ? o->upstream_timeout_ms : 600000;
  pthread_mutex_init(&p->ev_mu, NULL);
  pthread_mutex_init(&p->jobs_mu, NULL);
  pthread_cond_init(&p->jobs_cv, NULL);
  pthread_cond_init(&p->work_cv, NULL);
  atomic_init(&p->ids, 1);
  ag__conns_limits cl = {
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
  p->per_client = cl.per_client;
  p->conns = ag__conns_new(&cl, shard_count() * (limit + CONN_SLACK));
  p->budget = ag__budget_new(
      o->max_buffered > 0 ? o->max_buffered : AG_PROXY_MAX_BUFFERED_DEFAULT);
  if (p->conns == NULL || p->budget == NULL) {
    pthread_mutex_destroy(&p->ev_mu);
    pthread_mutex_destroy(&p->jobs_mu);
    pthread_cond_destroy(&p->jobs_cv);
    pthread_cond_destroy(&p->work_cv);
    proxy_free(p);
    return fail(err, AG_ENOMEM, "out of memory");
  }
  int e = 0;
  int lfd = listen_on(&sa, &e);
  if (lfd >= 0)
    reserve_fds(lfd, limit, shard_count());
  if (lfd < 0 || !start_shards(p, lfd, limit)) {
    if (lfd >= 0)
      e = errno;
    stop_shards(p);
    if (lfd >= 0)
      close(lfd);
    pthread_mutex_destroy(&p->ev_mu);
    pthread_mutex_destroy(&p->jobs_mu);
    pthread_cond_destroy(&p->jobs_cv);
    pthread_cond_destroy(&p->work_cv);
    proxy_free(p);
    if (lfd >= 0)
      return fail(err, AG_ENOMEM, "cannot start the proxy's event loops%s%s",
                  e != 0 ? ": " : "", e != 0 ? strerror(e) : "");
    return fail(err, AG_EIO, "cannot listen on %s:%u: %s", host,
                (unsigned)o->port, strerror(e));
  }
  struct sockaddr_in bound;
  socklen_t bl = sizeof bound;
  p->port = getsockname(lfd, (struct sockaddr *)&bound, &bl) == 0
                ? ntohs(bound.sin_port)
                : o->port;
  close(lfd); /* each daemon has its own duplicate */
  *out = p;
  return AG_OK;
}

uint16_t ag_proxy_port(const ag_proxy *p) {
  return p != NULL ? p->port : 0;
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
  pthread_mutex_destroy(&p->ev_mu);
  pthread_mutex_destroy(&p->jobs_mu);
  pthread_cond_destroy(&p->jobs_cv);
  pthread_cond_destroy(&p->work_cv);
  proxy_free(p);
}
