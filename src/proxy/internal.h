/*
 * src/proxy/internal.h - what the proxy's parts share (not installed, not
 * API; functions shared between parts carry the ag__px_ prefix).
 *
 *   proxy.c     start and stop: options, the upstream's URL and secrets,
 *               the event loops; small helpers (errors, events)
 *   serve.c     serving: libmicrohttpd's handler, connections, workers
 *   upstream.c  the upstream: libcurl transfers, run on a loop's relay
 *   decide.c    the decision on a request: the turn replayed (tree), the
 *               stop reply, the final request, a whole reply checked
 *   tape.c      the decision read from the JCS tokenizer's tape (the
 *               shape's tape_turn), and the attribution read the same way
 *   stream.c    a streamed reply relayed (the shape's relay_* hooks):
 *               events parsed, calls held and checked at the end, nudges
 *   request_only.c  OpenAI Responses and Gemini: decided on the request,
 *               a stop answered in the API's shape, the reply relayed as it
 *               comes
 *   relay.c     one event loop for every upstream transfer (relay.h)
 *   conns.c     the connection table (conns.h)
 *   budget.c    the budget of replies held whole (budget.h)
 *   target.c    the request-target normalised (target.h)
 */
#ifndef AG_PROXY_INTERNAL_H
#define AG_PROXY_INTERNAL_H

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
#include "metrics.h"
#include "attr.h"
#include "otlp.h"
#include "budget.h"
#include "conns.h"
#include "hooks.h"
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

/* The bytes of an upstream response's header lines kept to pass back (a
 * line past it is dropped; one over 8 KB always is). */
#define UP_HEADERS_MAX (64u << 10)

/* The stack of a request's thread (job_main): the deepest is a decision's
 * replay and a reply's check, well under this; ASan builds need more. */
#define JOB_STACK (2u << 20)

/* A bounded stack of objects kept for reuse and shared by threads: the
 * easy handles of a loop's finished transfers, the guards of the proxy's
 * finished requests, the scratch of their readers (a guard is about 40 KB
 * - its tables and first scratch - and making one, allocations and
 * zeroing, was a twentieth of a small request's CPU; each request in
 * flight holds one until its reply is checked: with 64 at once a pool of
 * 8 still missed about every other time, one of 32 one time in five).
 * 64 of each: 2.6 MB of guards at most, and READER_RETAIN bytes a
 * reader. */
#define PX_POOL_MAX 64
/* A request reader's scratch (the tape of its body) is kept when it holds
 * at most this much: a 12 KB one for an ordinary request, grown with the
 * bodies it read, up to about a 20 KB body's. */
#define READER_RETAIN (64u << 10)

typedef struct px_pool {
  pthread_mutex_t mu;
  bool on; /* made (ag__px_pool_init): a zeroed pool keeps nothing */
  int n;
  void *item[PX_POOL_MAX];
} px_pool;

void ag__px_pool_init(px_pool *pl);
/* An item kept, or NULL. */
void *ag__px_pool_take(px_pool *pl);
/* Keeps `item`: false when the pool is full or not made (the caller frees
 * it then). */
bool ag__px_pool_give(px_pool *pl, void *item);
/* Every item kept to free_item, and the pool's mutex destroyed. */
void ag__px_pool_drain(px_pool *pl, void (*free_item)(void *));

/* One event loop: a libmicrohttpd daemon and the relay whose thread runs
 * it (and the transfers of its connections' streams). */
typedef struct shard {
  struct ag_proxy *p;
  struct MHD_Daemon *d;
  ag__relay *relay;
  ag__chunk_tape *ct; /* the loop's scratch for text chunks, or NULL */
  /* the easy handles of its streams' finished transfers, reset: a new one
   * is a 6 KB calloc and a dozen allocations, its cleanup as many frees,
   * per request. A pool: a stream may end on another thread (a nudge's, a
   * budget waiter's). */
  px_pool easy;
} shard;

/* An easy handle for a transfer of a stream of loop sh (sh NULL: a new
 * one), NULL when out of memory; ag__px_easy_put gives it back, out of
 * any multi handle, to be reset and kept (or cleaned up when the pool is
 * full). */
CURL *ag__px_easy_get(shard *sh);
void ag__px_easy_put(shard *sh, CURL *h);

/* Event loops: one per core (start_shards), at most SHARDS_MAX, so that
 * relaying uses every core; a connection stays with the loop that
 * accepted it. Two per core were tried for a while (a loop waiting for the
 * CPU holds up only its own streams; libmicrohttpd 0.9.75 walks a daemon's
 * suspended connections at each resume): on 2 cores, 1,000 streams, one
 * per core measured within the noise of two (added p99 per chunk
 * 0.25-0.52 ms in five runs, two per core 0.25-0.41), and under wrk's 64
 * connections two more threads for the scheduler to share the cores with
 * cost every figure: added p99 3.3-4.2 ms against -0.4-0.2, requests/s
 * 0.33-0.34 of the direct path's against 0.37, CPU per request 36 against
 * 33-34 us; a stream's CPU 190-210 against 158-164 us (docs/benchmarks.md,
 * 2026-11-29). */
#define SHARDS_MAX 8
#define SHARDS_PER_CORE 1

/* Connections a loop takes past --max-connections, to answer them with a
 * 503 (on_connection) rather than leave them in the listening socket's
 * queue, as libmicrohttpd does at its own limit. */
#define CONN_SLACK 16u

/* One upstream, read once at start (parse_upstream). */
typedef struct px_up {
  CURLU *up;           /* its URL, credentials included; NULL: not given */
  char *path;          /* its path, without a trailing slash ("" for none) */
  size_t version_len;  /* path ends in a version ("/v1", "/v1beta"): its
                        * length with the '/', else 0 */
  char *shown;         /* scheme://host:port: what messages name, never
                          credentials */
  char *origin;        /* `up` without its path, credentials included: a
                        * request's URL is this, path and query */
  const ag__wire *api; /* the API whose paths go here (its route_prefix
                        * and the paths it serves); NULL: every other */
} px_up;

enum { PX_UP_DEFAULT, PX_UP_ANTHROPIC, PX_UP_GEMINI, PX_UPS };

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
  unsigned spawning;    /* workers made that have not taken a request yet */
  bool quit;            /* the workers end */
  unsigned jobs;        /* request threads running */
  bool stopping;        /* under jobs_mu: ag_proxy_stop has begun */
  atomic_bool draining; /* ag_proxy_drain: new requests get a 503 */
  /* the upstreams: [PX_UP_DEFAULT] (--upstream: every path not routed
   * elsewhere), [PX_UP_ANTHROPIC] and [PX_UP_GEMINI] when given (their
   * paths go there: ag__px_route) */
  px_up ups[PX_UPS];
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
  /* a proxy for the upstream is named in the environment (curl's
   * variables, read at start: ag__px_env_proxy); when none is, libcurl is
   * told so and does not read them again for every transfer */
  bool env_proxy;
  uint16_t port;
  atomic_ulong ids;
  ag__px_metrics metrics; /* GET /metrics (metrics.h) */
  /* attribution (attr.h): read from each guarded request when something
   * shows it (events, the access log) */
  bool attr_on;
  FILE *access_log;      /* one line per request answered, or NULL */
  bool log_json;         /* the access log's lines are JSON */
  atomic_ullong req_ids; /* requests numbered, from 1 */
  atomic_int streams;    /* responses relayed as they come, open now */
  ag__otlp *otlp;        /* the trace exporter (otlp.h), or NULL */
  /* GET /readyz's own probe of the upstreams (readyz_probe in serve.c),
   * its result kept for 10 s; probe_mu is held for a probe (2 s at most) */
  pthread_mutex_t probe_mu;
  int64_t probe_at; /* mono ms of the last probe, 0: none */
  bool probe_ok;
  char probe_why[512];
  /* guards of finished requests, renewed for the next ones
   * (ag__px_guard_get; a stand-in proxy's is not made) */
  px_pool guards;
  /* the scratch of finished requests' readers (tape.c), each at most
   * READER_RETAIN bytes */
  px_pool readers;
};

/* What goes back to the client. */
typedef struct reply {
  unsigned status;
  char *body; /* owned */
  size_t len;
  ag__budget *bud; /* `held` bytes of it are taken from bud (budget.h) */
  size_t held;
  const char *ctype;     /* static */
  ag__buf headers;       /* the upstream's, as upstream.headers */
  const char *stop;      /* x-agentguard-stop, or NULL */
  const ag__wire *shape; /* the API of a guarded path (its error
                          * shape), else NULL */
  bool close;            /* the connection is closed after it */
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
  reply r; /* the answer, unless `st` */
  /* the upstream's whole reply, asked on the loop (ag__px_whole_start) and
   * handed to a worker with it, which decides again and does not ask the
   * upstream a second time; NULL: none */
  struct upstream *prefetched;
  struct stream_st *st;   /* a relayed stream, or NULL */
  int64_t t0_ms;          /* when its headers were in (mono), for /metrics */
  unsigned sent_status;   /* the status answered, once it is */
  bool readyz;            /* GET /readyz, answered by a worker's probe */
  ag__px_attr attr;       /* who it is for (attr.h) */
  ag__px_attr_box *st_ab; /* its stream's copy (stream_st.ab), or NULL */
  /* the body read once as a JSON tape (ag__px_body_tape), for its
   * attribution and its decision: `tape` (a reader of p's pool) holds
   * tape_n tokens when tape_rc is AG_OK */
  bool tape_read;
  ag_err_t tape_rc;
  struct ag__jcs *tape;
  size_t tape_n;
} req_ctx;

typedef struct upstream {
  const char *shown; /* the upstream it went to (px_up.shown), for messages */
  long status;
  char *body;
  size_t len, cap;
  bool too_big;
  /* the final response's header lines, hop-by-hop removed: "Name: value"
   * each ended by a NUL, in one buffer (UP_HEADERS_MAX; ag__px_on_header) */
  ag__buf headers;
  bool hdr_end; /* the final response's headers are in */
  CURLcode cc;
  int64_t total_us; /* the transfer's time (ag__px_send_upstream) */
  char errbuf[CURL_ERROR_SIZE];
  /* the socket of the client waiting for this transfer while its
   * connection is suspended, watched by on_progress; -1: none */
  int client_fd;
  int64_t peer_next_ms; /* on_progress looks at client_fd from then on */
  bool client_left;     /* it closed: the transfer was ended for that */
  /* the body's bytes taken from the budget (budget.h): `held`; when the
   * budget is spent, a transfer run by ag__px_send_upstream pauses with `want`
   * set and its thread waits for the bytes (sync); any other one ends
   * with `no_budget` */
  ag__budget *bud;
  size_t held, want;
  struct sync_run *sync;
  bool no_budget;
  /* a transfer no thread waits for whose body is held whole (a stream_st
   * in `whole` mode): when the budget is spent it pauses with `want` set
   * and this is called (on the loop) to wait for the bytes elsewhere */
  bool (*budget_short)(struct upstream *u); /* false: cannot wait */
  void *budget_user;
  bool parse_taken; /* the parse's bytes (2 x len) are in `held` already */
} upstream;

/* A transfer run to its end for a thread that waits (ag__px_send_upstream): its
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
 * t->turns' arrays with ag__px_fast_free), or 0, or -1 when out of memory.
 */
typedef struct fast_traj {
  ag_trajectory t;
  ag_traj_turn turn;
  ag_traj_step *steps;
  ag_traj_call *calls;
  ag_traj_result *results;
  const char **ids;
  bool *answered;
} fast_traj;

#define SSE_OUT_MAX (8u << 20) /* bytes queued for the client at once */

/*
 * The upstream's stream relayed as it comes: text deltas go to the client
 * at once (after the content-loop detector has seen them); chunks with
 * tool-call fragments, the finish reason or only usage are held until the
 * stream ends and the calls are checked.
 *
 * The request's thread (job_main) decides and starts the transfer on the
 * connection's loop (ag__px_stream_start), and is done with it. From then on
 * the loop's thread runs the stream, and shares it with other threads only
 * through `mu`:
 * - the transfer's callbacks (relay.c) parse the events, write what the
 *   client gets into `out` and move it to `q` (flush); at the transfer's
 *   end (ag__px_on_stream_done) the calls are checked and the end is written
 * and flushed with `finished`, on the same thread - unless the check asks for a
 * nudge, which waits for the upstream: then a thread of its own
 *   (ag__px_nudge_main) asks again and writes the end;
 * - the connection's side (libmicrohttpd, run by the same loop) reads `q`
 *   (ag__px_stream_read); when it is empty it suspends the connection
 *   (`reader_waits`) and a flush resumes it.
 * `out` has one writer at a time: the loop, then the nudge's thread if
 * there is one. The stream is freed when its end (`refs`: the loop's, or
 * the nudge's thread) and the response have let go of it, and no request
 * to the relay is queued (`ops`).
 */
typedef struct stream_st {
  ag_proxy *p;
  const ag__wire *w; /* the API: its relay reads and writes the events */
  shard *sh;         /* the connection's loop: it runs the transfer too */
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
  /* a passed-through response (ag__px_relay_start): the upstream's bytes go to
   * the client as they come, whatever its status, with its headers */
  bool raw;
  /* a guarded request whose reply is held whole (ag__px_whole_start): the
   * body goes into `u` under the budget, and the end checks it */
  bool whole;
  ag__conn *conn;    /* the connection's entry (conns.h), or NULL */
  ag_verdict loop_v; /* why the content-loop detector stopped it (rl.looped) */
  /* its request's attribution (req_ctx.attr), shared with the request,
   * which reads what the stream added when it ends; NULL: none */
  ag__px_attr_box *ab;
  /* the shape's relay (wire.h): rl.out is what the client gets next, and
   * rl.ct its loop's scratch (or NULL: every chunk a tree) */
  ag__wire_relay rl;
  /* under mu */
  pthread_mutex_t mu;
  ag__buf q; /* for the client, from q_pos on; cut: it overflowed */
  size_t q_pos;
  long status;       /* the upstream's, once its headers are in */
  int answer;        /* 0 not yet, ANSWER_STREAM or ANSWER_REPLY */
  req_ctx *req_q;    /* the request, until it is answered (answer_*) */
  bool up;           /* the transfer has ended (its `done` ran) */
  bool reader_waits; /* the connection is suspended in ag__px_stream_read */
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

/* A nudge at a stream's end: the reply whose calls were held back and
 * what the check said, for the thread that asks again (ag__px_nudge_main). */
typedef struct nudge_job {
  stream_st *st;
  ag_reply rep;
  ag_verdict v;
  ag_call_check checks[AG__CALLS_MAX];
} nudge_job;

#define TAPE_DEPTH 64

void ag__px_answer_reply(stream_st *st, req_ctx *q, long status);
void ag__px_answer_stream(stream_st *st, req_ctx *q);
void ag__px_guarded(ag_proxy *p, struct MHD_Connection *c, req_ctx *q,
                    const char *path, reply *r, bool *started, bool *later);
/* A request of a shape decided on the request (r->shape's stop_body:
 * Responses, Gemini) decided and answered (request_only.c): r is the
 * answer, or *started says its relay was handed to the loop. With `later`
 * (the loop's thread), a request whose reply must be held is left for a
 * worker, *later set. */
void ag__px_request_only(ag_proxy *p, struct MHD_Connection *c, req_ctx *q,
                         const char *path, reply *r, bool *started,
                         bool *later);
/* A request that continues a conversation the upstream keeps (its shape's
 * `stored` says where), with that conversation read back from the
 * upstream (stored.c; it waits: a worker's thread): a new object, the
 * client's with "input" holding every item, oldest first, and without
 * previous_response_id and conversation - or NULL with why[cap] saying
 * what failed. `path`: the request's path, without its query. */
json_t *ag__px_stored_request(ag_proxy *p, req_ctx *q, const json_t *req,
                              const char *path, char *why, size_t cap);
/* The turn of chat `msgs` (from its last user message) replayed through a
 * fresh turn of g: AG_OK with *act (v filled), AG_EINVAL with a 400's
 * message in emsg (the turn cannot be read), AG_ENOMEM. `shown`: the index
 * the turn's first message has in the client's own messages, for that
 * message, or SIZE_MAX: its index in msgs. */
ag_err_t ag__px_replay_turn(ag_guard *g, const json_t *msgs, size_t shown,
                            ag_verdict *v, char *emsg, size_t cap,
                            ag_action *act);
/* b's events as r's body (text/event-stream; b is taken), or a 500 when b
 * was cut. */
void ag__px_set_sse(reply *r, ag__buf *b);
/* The stop reply (v says why) in the request's API (r->shape) and in the
 * form the client asked for. */
void ag__px_stop_reply(ag_proxy *p, const req_ctx *q, const json_t *req,
                       const char *path, const ag_verdict *v, reply *r);
/* The event of a 400 the proxy answers itself (r's error message). */
void ag__px_bad_request(ag_proxy *p, ag__px_attr *a, const char *path,
                        const reply *r);
ag_action ag__px_check_reply(ag_guard *g, const ag_reply *rep,
                             bool text_checked, ag_call_check *checks,
                             ag_verdict *v);
/* Header lists for libcurl made in one allocation each (upstream.c): freed
 * with ag__px_hdrs_free, never curl_slist_free_all. The client's headers,
 * hop-by-hop ones out (false when out of memory); a copy of `src` without
 * the lines that start with `skip` (any case; NULL: none), with up to two
 * lines more (NULL: none) - NULL when empty, *failed set when out of
 * memory. */
bool ag__px_client_headers(struct MHD_Connection *c, struct curl_slist **out);
struct curl_slist *ag__px_hdrs_copy(const struct curl_slist *src,
                                    const char *skip, const char *extra1,
                                    const char *extra2, bool *failed);
void ag__px_hdrs_free(struct curl_slist *list);
/* Replaces the client's traceparent headers in *list with one of `value`
 * (W3C: "00-TRACE-SPAN-01"); false when out of memory (*list unchanged). */
bool ag__px_set_traceparent(struct curl_slist **list, const char *value);
void ag__px_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode toe);
char *ag__px_dupz(const char *s);
/* A decision event (docs/events.md, "The proxy's events"), attributed to
 * request `a` (may be NULL: none) and recorded in it for the access log. */
void ag__px_event(ag_proxy *p, ag__px_attr *a, const char *decision,
                  const char *path, const ag_verdict *v, const char *detail);
ag_err_t ag__px_fail(ag_error_t *err, ag_err_t code, const char *fmt, ...)
    AG__PRINTF(3, 4);
void ag__px_fast_free(fast_traj *f);
int ag__px_fast_turn(const json_t *msgs, size_t start, fast_traj *f);
void ag__px_flush(stream_st *st, bool last);
enum MHD_Result ag__px_handler(void *cls, struct MHD_Connection *c,
                               const char *url, const char *method,
                               const char *version, const char *upload,
                               size_t *upload_size, void **con_cls);
void *ag__px_job_main(void *arg);
int64_t ag__px_mono_ms(void);
void ag__px_nudge_fail(nudge_job *nj, const char *msg);
void *ag__px_nudge_main(void *arg);
size_t ag__px_on_body(char *ptr, size_t size, size_t nmemb, void *user);
void ag__px_on_connection(void *cls, struct MHD_Connection *c,
                          void **socket_ctx,
                          enum MHD_ConnectionNotificationCode code);
size_t ag__px_on_header(char *ptr, size_t size, size_t nmemb, void *user);
void ag__px_on_stream_done(ag__relay_xfer *x, CURLcode cc);
void *ag__px_on_uri(void *cls, const char *uri, struct MHD_Connection *c);
void ag__px_pass_back(upstream *u, reply *r);
/* The upstream a request-target goes to: Anthropic's paths (/v1/messages
 * and below) to PX_UP_ANTHROPIC and Gemini's (/v1beta/..., a model's
 * :generateContent) to PX_UP_GEMINI when those were given, every other to
 * PX_UP_DEFAULT. */
const px_up *ag__px_route(const ag_proxy *p, const char *target);
bool ag__px_read_reply(upstream *u, ag_reply *out, reply *r);
/* The upstream's reply held whole, read by shape w's readers as the
 * client asked for it (whole JSON, SSE, a JSON array of chunks); false
 * with a 502 in `r` when it is not such a reply. `ct`: the loop's scratch
 * tape for a shape's fast reader (a plain chat.completion), or NULL. */
bool ag__px_read_reply_as(upstream *u, const ag__wire *w, ag__reply_form form,
                          ag__chunk_tape *ct, ag_reply *out, reply *r);
ag_action ag__px_record_nudged(ag_guard *g, const ag_reply *rep,
                               const ag_call_check *checks, ag_verdict *v);
bool ag__px_refused(ag_proxy *p, struct MHD_Connection *c, req_ctx *q,
                    const char *method);
bool ag__px_relay_start(ag_proxy *p, struct MHD_Connection *c, req_ctx *q,
                        const char *path, reply *r);
/* The trajectory `f` replayed (then freed): AG_OK with *act, or
 * AG_ENOMEM. */
ag_err_t ag__px_replay_fast(ag_guard *g, fast_traj *f, ag_verdict *v,
                            ag_action *act);
void ag__px_reply_free(reply *r);
void ag__px_resume(shard *sh, struct MHD_Connection *c);
const char *ag__px_scrub(const ag_proxy *p, const char *in, char *out,
                         size_t cap);
enum MHD_Result ag__px_send_answer(struct MHD_Connection *c, req_ctx *q);
void ag__px_send_upstream(ag__relay *relay, ag_proxy *p,
                          const struct curl_slist *ch, const char *method,
                          const char *uri, const char *body, size_t len,
                          bool json_body, int client_fd, upstream *u);
void ag__px_set_error(reply *r, unsigned status, const char *type,
                      const char *code, const char *fmt, ...);
void ag__px_set_json(reply *r, unsigned status, json_t *o);
void ag__px_stop_text(const ag_verdict *v, char *buf, size_t cap);
void ag__px_stream_end(stream_st *st);
void ag__px_stream_finish(stream_st *st, nudge_job **nj);
void ag__px_stream_free(void *cls);
void ag__px_stream_nudge(stream_st *st, nudge_job *nj);
ssize_t ag__px_stream_read(void *cls, uint64_t pos, char *buf, size_t max);
void ag__px_stream_release(stream_st *st, bool ref);
/* A guarded request that is not streamed, sent upstream from the loop
 * that decided it (no worker): its reply is held whole under the budget
 * and checked at the end, on the loop; a reply that passes is answered
 * there, any other (a stop, a nudge, no budget for the parse) goes to a
 * worker with the reply in hand (req_ctx.prefetched), which decides again
 * and answers. Takes *fwd and *g as ag__px_stream_start does; false with
 * `r` filled (500) when it could not start. */
bool ag__px_whole_start(ag_proxy *p, struct MHD_Connection *c, req_ctx *q,
                        char **fwd, size_t fwd_len, const ag__wire *w,
                        const char *path, ag_guard **g, reply *r);
/* Hands a suspended request to a worker (serve.c): false when it cannot
 * (q->r then holds a 503). */
bool ag__px_requeue(req_ctx *q);
/* Runs fn(arg) on a thread of its own, counted as a job (ag_proxy_stop
 * waits for it; fn ends with ag__px_job_end): false when the proxy is
 * stopping or no thread can be made. */
bool ag__px_spawn_job(ag_proxy *p, void *(*fn)(void *), void *arg);
void ag__px_job_end(ag_proxy *p);
bool ag__px_stream_start(ag_proxy *p, struct MHD_Connection *c, req_ctx *q,
                         char **fwd, size_t fwd_len, const ag__wire *w,
                         const char *path, ag_guard **g, reply *r);
int ag__px_t_alloc(fast_traj *f, size_t n_steps, size_t n_calls);
ag_traj_result *ag__px_t_answer(fast_traj *f, size_t step0, size_t ci,
                                const char *id);
void ag__px_t_done(fast_traj *f, size_t si, size_t ci);
void ag__px_t_step(ag_traj_step *st, fast_traj *f, size_t ci);
/* The decision before forwarding, from the request's tape (no jansson
 * tree): the turn read by shape w's tape_turn and replayed through a new
 * guard (*g, from ag__px_guard_get(p, cfg): the caller gives it back with
 * ag__px_guard_put(p)), then the coming request counted -
 * what the tree path decides for the same body. AG_OK with *act (v filled;
 * *stream: the body's "stream" is true), AG_ENOMEM, or AG_ENOTFOUND (*g
 * NULL): no turn the tape reader takes - a body the tape refuses (a
 * duplicate key, nesting past TAPE_DEPTH, a number outside a double,
 * "\u0000", an integer jansson cannot hold) or a shape the reader leaves
 * to the tree: take the tree path, whose decisions and messages are the
 * reference (the parity tests in tests/runtime/test_proxy.c replay both). */
ag_err_t ag__px_tape_decide(ag_proxy *p, req_ctx *q, const ag_config *cfg,
                            const char *body, size_t len, const ag__wire *w,
                            ag_guard **g, ag_verdict *v, bool *stream,
                            ag_action *act);
/* q's body as a JSON tape, read at the first call (q->tape, q->tape_n);
 * the reading's code: AG_OK, AG_ENOMEM, or the JSON error's.
 * ag__px_body_tape_free gives the reader back to p's pool. With
 * ag__px_tape_decide (q given) the body is read once for both. */
ag_err_t ag__px_body_tape(ag_proxy *p, req_ctx *q);
void ag__px_body_tape_free(ag_proxy *p, req_ctx *q);
/* A guard for p's config (cfg is used only when p is NULL): one kept from
 * a finished request, renewed (as ag_guard_new makes it), or a new one.
 * ag__px_guard_put gives it back (or frees it: the pool full, p NULL). */
ag_err_t ag__px_guard_get(ag_proxy *p, const ag_config *cfg, ag_guard **g,
                          ag_error_t *err);
void ag__px_guard_put(ag_proxy *p, ag_guard *g);
bool ag__px_upstream_failed(ag_proxy *p, const upstream *u, reply *r);
void ag__px_upstream_free(upstream *u);
/* Whether the environment names a proxy for the upstream: any of curl's
 * http_proxy, HTTPS_PROXY, https_proxy, ALL_PROXY, all_proxy not empty
 * (NO_PROXY only matters when one is). ag__px_proxy_opts tells h to use
 * none when p's environment named none at start. */
bool ag__px_env_proxy(void);
void ag__px_proxy_opts(const ag_proxy *p, CURL *h);
bool ag__px_upstream_handle(ag_proxy *p, const struct curl_slist *ch, CURL *h,
                            const char *method, const char *uri,
                            const char *body, size_t len, bool json_body,
                            int client_fd, upstream *u,
                            struct curl_slist **hdrs, char **url);
char *ag__px_with_messages(const json_t *body, const json_t *extra,
                           size_t *len);

#endif /* AG_PROXY_INTERNAL_H */
