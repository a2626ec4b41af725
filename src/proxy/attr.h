/*
 * src/proxy/attr.h - who a guarded request belongs to (docs/proxy.md,
 * "Attribution"): its number, the client's address, the API, the model,
 * the conversation, and - as it goes - the decision, the upstream's status
 * and the tokens of the reply. Every decision event names them, and the
 * access log writes one line per request from them when it is answered.
 *
 * The conversation id is computed without keeping state: the client's
 * `x-agentguard-session` header when it sends one, else a hash of what
 * stays the same for a whole conversation - the system prompt (the
 * request's "system", "instructions" or "systemInstruction") and the
 * texts of the conversation up to its first user message. Only texts are
 * hashed, so markers that move from request to request (Anthropic's
 * cache_control) do not change it.
 */
#ifndef AG_PROXY_ATTR_H
#define AG_PROXY_ATTR_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/socket.h>

#include <jansson.h>

#include "agentguard/core.h"

#define AG__PX_MODEL_MAX 128
#define AG__PX_CONV_MAX 72 /* a header's value is cut to 64 bytes */

typedef struct ag__px_attr {
  unsigned long long id;           /* the request's number, from 1 */
  char client[64];                 /* the client's address */
  char method[16];                 /* the request's method */
  char model[AG__PX_MODEL_MAX];    /* "" when not known */
  char conv[AG__PX_CONV_MAX];      /* "" when not known */
  const char *api;                 /* the wire shape's name, or NULL */
  const char *decision;            /* the last decision event, or NULL */
  char reason[32];                 /* its reason, or "" */
  long long in_tokens, out_tokens; /* the reply's usage, -1: not seen */
  int64_t t0_us;                   /* its headers were in (monotonic) */
  /* its span (otlp.h), when traces are exported: ids in hex, the parent
   * from the client's traceparent ("" for none), the start (wall ns) */
  char trace_id[33], span_id[17], parent_id[17];
  int64_t start_ns;
  int64_t upstream_us; /* its upstream transfers, -1: none */
} ag__px_attr;

/* An attribution shared by a request and its stream, which may outlive
 * one another (the stream is the response's): each holds a reference, and
 * the request reads what the stream added when it ends. */
typedef struct ag__px_attr_box {
  ag__px_attr a;
  atomic_int refs;
} ag__px_attr_box;

/* A copy of `a` with two references, or NULL when out of memory. */
ag__px_attr_box *ag__px_attr_share(const ag__px_attr *a);
/* Lets go of one reference (NULL: nothing). */
void ag__px_attr_unshare(ag__px_attr_box *b);

/* The attribution known when a request's headers are in. */
void ag__px_attr_begin(ag__px_attr *a, unsigned long long id,
                       const struct sockaddr *client, const char *api,
                       const char *session_header);

/* The request will have a span: its ids, joining the client's trace when
 * `traceparent` (W3C Trace Context) is valid, else a new trace. */
void ag__px_attr_trace(ag__px_attr *a, const char *traceparent);

/* The request's span as OTLP JSON (a Span object; malloc'd), with the
 * GenAI semantic conventions' attributes and agentguard's decision; NULL
 * when it has no trace id or out of memory. */
char *ag__px_attr_span(const ag__px_attr *a, const char *path, unsigned status,
                       int64_t end_ns);

/* Into q->attr: the model and, without a session header, the conversation
 * id, read from the body of guarded request q (path: for a model named in
 * it, as Gemini's). `conv_key` is the API's conversation member
 * ("messages", "input", "contents"). Anything unreadable is left unknown.
 * The body's tape is q's (ag__px_body_tape: read once, the decision reads
 * the same). */
struct ag_proxy;
struct req_ctx;
void ag__px_attr_body(struct ag_proxy *p, struct req_ctx *q, const char *path,
                      const char *conv_key);

/* A decision made for the request (the event's name, static). */
void ag__px_attr_decision(ag__px_attr *a, const char *decision,
                          const ag_verdict *v);

/* The monotonic clock in microseconds. */
int64_t ag__px_attr_now_us(void);

/* An upstream transfer made for the request took `us`. */
void ag__px_attr_upstream(ag__px_attr *a, int64_t us);

/* The tokens of a reply the proxy read as JSON (Chat Completions' or
 * Messages' "usage"), when it says. */
void ag__px_attr_usage_json(ag__px_attr *a, const json_t *reply);

/* The tokens of a reply the proxy read (ag_reply), when it says. */
struct ag_reply;
void ag__px_attr_usage(ag__px_attr *a, const struct ag_reply *rep);

/* One access-log line for the answered request, in text or JSON, written
 * whole with one write(2) to `out`'s descriptor. */
void ag__px_attr_log(const ag__px_attr *a, FILE *out, bool json,
                     const char *path, unsigned status, int64_t ms,
                     int64_t wall_ms);

/* What `from` (a stream's copy) added to `a`: its decision and tokens. */
void ag__px_attr_merge(ag__px_attr *a, const ag__px_attr *from);

#endif /* AG_PROXY_ATTR_H */
