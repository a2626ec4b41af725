/*
 * agentguard/proxy.h - the OpenAI- and Anthropic-compatible guard proxy
 * (`agentguard proxy`, docs/proxy.md): the proxy layer's public header, for
 * the program, the tests and the bench. Not installed, and not in the
 * agentguard.h umbrella: the library `agentguard_proxy` (src/proxy/, linked
 * with libmicrohttpd) is built for the program and the tests only, so that
 * the installed libagentguard does not depend on an HTTP server.
 *
 * The proxy serves HTTP with libmicrohttpd and talks to the upstream with
 * libcurl, both on event loops, two per core (src/proxy/relay.c: a
 * daemon's epoll set and its connections' upstream transfers through
 * curl_multi_socket_action), so a relayed chunk wakes no thread but its
 * loop's. A streamed request with a small body (64 KiB) is decided on its
 * loop; any other request's decision and its blocking upstream requests
 * run on a worker thread while its connection is suspended. A stream is
 * its loop's once started: the loop checks its calls at its end; only a
 * nudge there, which waits for the upstream, gets a thread. Connections are
 * capped; up to 64 idle upstream connections per loop are kept between
 * requests.
 *   - POST /v1/chat/completions and POST /v1/messages (Anthropic, its
 *     messages read as chat form) are guarded: the request's turn (everything
 *     after the last user message) is read into a trajectory - from the
 *     tokenizer's tape, or from the jansson tree, and only in rare shapes
 *     written out and read by the audit's parser (ag_trajectory_parse) - and
 *     replayed through a fresh guard with the audit's own replay (src/audit/
 *     internal.h); a turn that already stops is answered
 *     without tool calls (directly, or by the upstream without tools under
 *     loop.final_request_without_tools); the upstream's reply has its tool
 *     calls checked before the client sees them.
 *   - Every other path is passed through: method, headers (minus hop-by-hop
 *     ones) and body; the upstream's status, headers and body come back.
 * Nothing is kept between requests: replicas decide alike.
 *
 * Thread-safety: ag_proxy_start and ag_proxy_stop from one thread. The
 * proxy's own threads (the loops, and one per request being decided or
 * waiting for the upstream, or per stream being nudged) share the events file
 * and each stream's queue, each under its mutex. ag_proxy_stop answers new
 * requests with 503, ends every upstream transfer (a relayed stream ends with
 * an error event), waits for the requests' threads and then stops the loops.
 */
#ifndef AG_PROXY_H
#define AG_PROXY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common.h"
#include "core.h"

/* 32 MiB: Anthropic's own request limit; a conversation that carries a
 * few screenshots (base64) passes 8 MiB long before a model's context is
 * full */
#define AG_PROXY_MAX_BODY_DEFAULT (32u << 20)
#define AG_PROXY_MAX_CONNECTIONS 512
#define AG_PROXY_IDLE_TIMEOUT_MS 120000
#define AG_PROXY_HEADER_TIMEOUT_MS 10000
#define AG_PROXY_REQUEST_TIMEOUT_MS 120000
/* The highest max_connections accepted: one thread and one descriptor (two
 * with the upstream's) each, so the process's RLIMIT_NOFILE must allow it. */
#define AG_PROXY_MAX_CONNECTIONS_LIMIT 65536
/* A guarded reply that is not streamed is read whole before it is checked:
 * past this size, 502. Passed-through bodies and streams are relayed as
 * they come, never held whole. */
#define AG_PROXY_UPSTREAM_MAX (32u << 20)
/* The bytes of such replies held at once, over every connection
 * (max_buffered); past it a reply waits for another to be sent. */
#define AG_PROXY_MAX_BUFFERED_DEFAULT ((size_t)256 << 20)

typedef struct ag_proxy_opts {
  const char *listen_host; /* an IPv4 or IPv6 address (no brackets) or a
                              host name (its first IPv4 address, else its
                              first IPv6 one); NULL: 127.0.0.1 */
  uint16_t port;           /* 0: any free port (ag_proxy_port says which) */
  /* Where requests go: the upstream's origin and path prefix, to which the
   * client's path is appended ("http://127.0.0.1:8080" + "/v1/chat/
   * completions"). A trailing "/v1" is dropped when the client's path
   * starts with "/v1/" ("https://api.openai.com/v1" works too). http or
   * https, no query or fragment; a user and password in it go to the
   * upstream with every request and are never shown (ag_proxy_upstream).
   * The client supplies only a path and query (docs/security.md, "The
   * proxy"). Required. */
  const char *upstream;
  /* Upstreams of their own for Anthropic's paths (/v1/messages and below)
   * and Gemini's (/v1beta/..., a model's :generateContent), read and kept
   * as `upstream` is; NULL: those paths go to `upstream` too. */
  const char *anthropic_upstream;
  const char *gemini_upstream;
  ag_config cfg;   /* the guard's config */
  size_t max_body; /* request body cap; 0: AG_PROXY_MAX_BODY_DEFAULT */
  /* Open client connections served at once (--max-connections), 1 to
   * AG_PROXY_MAX_CONNECTIONS_LIMIT; past it new ones are refused. 0:
   * AG_PROXY_MAX_CONNECTIONS. Anything else: AG_EINVAL. ag_proxy_start
   * grows the process's descriptor table for them at once (two
   * descriptors each, within the soft RLIMIT_NOFILE): growing it later,
   * under load, stalls every thread that opens a descriptor for an RCU
   * grace period (about 10 ms). */
  int max_connections;
  /* Connections one client address may hold (--max-connections-per-
   * client), 0 to max_connections. 0: a quarter of max_connections (at
   * least 1) for addresses off this machine, and no cap for loopback
   * addresses (every local client shares one: the cap would be on the proxy
   * itself); given, it applies to every address. Past it the address's own
   * oldest idle connection gives way, or the new one gets a 503. */
  int max_connections_per_client;
  /* Deadlines that do not move with each byte (a client sending one byte a
   * second would otherwise hold its slot for ever), in ms; 0: the default.
   * idle: a connection with no request under way, before the request line
   * (default 120000); header: from the request line to the end of the
   * headers (default 10000); request: from the request line to the end of
   * the body (default 120000). A connection past one is closed. When every
   * slot is taken, the connection waiting longest without a request under
   * way gives its slot to a new one (docs/security.md, "The proxy"). */
  int64_t idle_timeout_ms, header_timeout_ms, request_timeout_ms;
  /* The key clients must send in "x-agentguard-key" (never forwarded), or
   * NULL: none. Required when listen_host is not a loopback address. */
  const char *client_key;
  FILE *events; /* JSON Lines of the proxy's decisions, or NULL */
  int64_t upstream_timeout_ms; /* whole upstream request; 0: 600000 */
  /* The bytes of guarded replies held whole at once (--max-buffered):
   * a reply that would take more waits (its transfer paused) until
   * another has been sent, except when no other could give bytes back:
   * then one goes past it, so memory for them stays under max_buffered +
   * AG_PROXY_UPSTREAM_MAX. 0: AG_PROXY_MAX_BUFFERED_DEFAULT. */
  size_t max_buffered;
  /* The access log: one line per request the proxy relays (not its own
   * /healthz, /readyz, /metrics), written when it is answered - time,
   * request number, client, method, path (no query), API, model,
   * conversation id, decision and reason, status, milliseconds, tokens
   * (docs/proxy.md, "Operating it"). NULL: none. `access_log_json`: one
   * JSON object per line instead of text. The model and the conversation
   * (as in the events) are read from each guarded request when either this
   * or `events` is set. */
  FILE *access_log;
  bool access_log_json;
  /* OpenTelemetry traces (docs/proxy.md, "Traces"): one span per guarded
   * request, posted as OTLP/HTTP JSON to this URL - the whole traces URL,
   * such as "http://127.0.0.1:4318/v1/traces" - in batches by a thread of
   * the proxy's own; a full queue drops spans (counted in /metrics), it
   * never slows a request. `otlp_headers`: extra headers in
   * OTEL_EXPORTER_OTLP_HEADERS' form ("k=v,k2=v2"); `otlp_service_name`:
   * the resource's service.name (NULL: "agentguard-proxy"). NULL URL: no
   * traces. */
  const char *otlp_traces_url;
  const char *otlp_headers;
  const char *otlp_service_name;
} ag_proxy_opts;

/* Fills the defaults (loopback, port 8787, the default preset). */
void ag_proxy_opts_init(ag_proxy_opts *o);

typedef struct ag_proxy ag_proxy;

/* Starts serving. AG_OK and *out, or AG_EINVAL (bad options: err says
 * which), AG_EIO (cannot listen: the address is taken or not ours),
 * AG_ECONFIG (the guard's config), AG_ENOMEM. Strings are copied. */
ag_err_t ag_proxy_start(ag_proxy **out, const ag_proxy_opts *o,
                        ag_error_t *err);
/* The port it listens on. */
uint16_t ag_proxy_port(const ag_proxy *p);
/* The upstream as the proxy names it in messages: "scheme://host:port",
 * never its user or password. Owned by p. */
const char *ag_proxy_upstream(const ag_proxy *p);
/*
 * The decision before forwarding, alone (for benchmarks and tests): parses
 * the request body (`len` bytes; Chat Completions, or Messages when
 * `anthropic`), replays its turn through a fresh guard for `cfg` and counts
 * the coming request, exactly as a served request does. Returns the action
 * (AG_ALLOW: it would be forwarded; AG_STOP / AG_ESCALATE with v filled),
 * or -1 with err filled (AG_EJSON, AG_EINVAL: the 400 the client would get;
 * AG_ENOMEM; AG_ECONFIG).
 */
int ag_proxy_decide(const ag_config *cfg, const char *body, size_t len,
                    bool anthropic, ag_verdict *v, ag_error_t *err);
/*
 * Drains the proxy before a stop (a rolling update): new requests get a
 * 503 `shutting_down` and GET /healthz and /readyz a 503, while the
 * requests under way - streams included - go on to their end. Returns true
 * once none is left, false when `timeout_ms` passed first (ag_proxy_stop
 * then ends what is left). Call it from a thread of the caller's, not from
 * a hook the proxy runs.
 */
bool ag_proxy_drain(ag_proxy *p, int64_t timeout_ms);
/* Stops serving (waits for the connections' threads) and frees. NULL does
 * nothing. */
void ag_proxy_stop(ag_proxy *p);

/*
 * The proxy's OpenTelemetry trace exporter on its own (for `agentguard
 * run`'s spans, docs/run.md "Traces"): spans - each an OTLP JSON Span
 * object's text - are queued without I/O and posted in batches as
 * OTLP/HTTP JSON to `traces_url` (the whole URL) by a thread of the
 * exporter's own, with `headers` ("k=v,k2=v2"; may be NULL) under the
 * resource `service_name` (NULL: "agentguard-proxy"). A full queue (4096)
 * drops spans; ag_otlp_stop sends what is queued, for at most timeout_ms.
 */
typedef struct ag__otlp ag_otlp;
ag_err_t ag_otlp_start(ag_otlp **out, const char *traces_url,
                       const char *headers, const char *service_name,
                       ag_error_t *err);
/* Queues one span (malloc'd JSON text, taken in every case); false when it
 * was dropped. */
bool ag_otlp_push(ag_otlp *o, char *span_json);
/* Spans the collector took, and spans dropped. */
unsigned long long ag_otlp_exported(const ag_otlp *o);
unsigned long long ag_otlp_dropped(const ag_otlp *o);
/* Sends what is queued (for at most timeout_ms), stops and frees; returns
 * the spans dropped over the exporter's life (0 for NULL). */
unsigned long long ag_otlp_stop(ag_otlp *o, int64_t timeout_ms);
/* A random id in lower-case hex (bytes 16: a trace id, 8: a span id;
 * out holds 2 * bytes + 1); false when the random source failed. */
bool ag_otlp_random_id(char *out, size_t bytes);

#endif /* AG_PROXY_H */
