/*
 * src/proxy/attr.c - a request's attribution and its access-log line
 * (attr.h). The body's part (the model, the conversation id) is read from
 * the JCS tokenizer's tape, in tape.c.
 */
#define _GNU_SOURCE
#include "attr.h"

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "agentguard/providers.h"
#include "../wire/wire.h"
#include "otlp.h"

/* `in` cut to cap - 1 bytes, anything but printable ASCII as '_': one word
 * in a text line, valid UTF-8 for JSON (a client's path, header). */
static void ascii_word(const char *in, char *out, size_t cap) {
  size_t k = 0;
  for (const char *c = in != NULL ? in : ""; *c != '\0' && k + 1 < cap; c++)
    out[k++] = (*c > 0x20 && *c < 0x7f) ? *c : '_';
  out[k] = '\0';
}

void ag__px_attr_begin(ag__px_attr *a, unsigned long long id,
                       const struct sockaddr *client, const char *api,
                       const char *session_header) {
  memset(a, 0, sizeof *a);
  a->id = id;
  a->api = api;
  a->in_tokens = a->out_tokens = -1;
  a->upstream_us = -1;
  a->t0_us = ag__px_attr_now_us();
  if (client != NULL && client->sa_family == AF_INET) {
    const struct sockaddr_in *s4 = (const struct sockaddr_in *)client;
    inet_ntop(AF_INET, &s4->sin_addr, a->client, sizeof a->client);
  } else if (client != NULL && client->sa_family == AF_INET6) {
    const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)client;
    inet_ntop(AF_INET6, &s6->sin6_addr, a->client, sizeof a->client);
  }
  if (session_header != NULL) /* the client's own id, 64 bytes at most */
    ascii_word(session_header, a->conv, 65);
}

ag__px_attr_box *ag__px_attr_share(const ag__px_attr *a) {
  ag__px_attr_box *b = malloc(sizeof *b);
  if (b != NULL) {
    b->a = *a;
    atomic_init(&b->refs, 2);
  }
  return b;
}

void ag__px_attr_unshare(ag__px_attr_box *b) {
  if (b != NULL && atomic_fetch_sub(&b->refs, 1) == 1)
    free(b);
}

int64_t ag__px_attr_now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

void ag__px_attr_upstream(ag__px_attr *a, int64_t us) {
  if (a == NULL || us < 0)
    return;
  a->upstream_us = (a->upstream_us > 0 ? a->upstream_us : 0) + us;
}

void ag__px_attr_usage_json(ag__px_attr *a, const json_t *reply) {
  const json_t *u = json_object_get(reply, "usage");
  if (a == NULL || !json_is_object(u))
    return;
  const json_t *in = json_object_get(u, "prompt_tokens");
  const json_t *out = json_object_get(u, "completion_tokens");
  if (in == NULL && out == NULL) { /* Messages */
    in = json_object_get(u, "input_tokens");
    out = json_object_get(u, "output_tokens");
  }
  if (json_is_integer(in) && json_integer_value(in) >= 0)
    a->in_tokens = (long long)json_integer_value(in);
  if (json_is_integer(out) && json_integer_value(out) >= 0)
    a->out_tokens = (long long)json_integer_value(out);
}

void ag__px_attr_usage(ag__px_attr *a, const struct ag_reply *rep) {
  if (a == NULL || rep == NULL || !rep->has_usage)
    return;
  a->in_tokens = rep->usage.prompt_tokens;
  a->out_tokens = rep->usage.completion_tokens;
}

/* n lower-case hex digits, not all zero when `nonzero`. */
static bool hex_ok(const char *s, size_t n, bool nonzero) {
  bool any = false;
  for (size_t i = 0; i < n; i++) {
    if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
      return false;
    any = any || s[i] != '0';
  }
  return any || !nonzero;
}

void ag__px_attr_trace(ag__px_attr *a, const char *tp) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  a->start_ns = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
  a->parent_id[0] = '\0';
  /* "00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>" (version 00;
   * a later version may add fields after the flags) */
  if (tp != NULL && strlen(tp) >= 55 && tp[2] == '-' && tp[35] == '-' &&
      tp[52] == '-' && hex_ok(tp, 2, false) && strncmp(tp, "ff", 2) != 0 &&
      hex_ok(tp + 3, 32, true) && hex_ok(tp + 36, 16, true) &&
      hex_ok(tp + 53, 2, false) &&
      (tp[55] == '\0' || (tp[55] == '-' && strncmp(tp, "00", 2) != 0))) {
    memcpy(a->trace_id, tp + 3, 32);
    a->trace_id[32] = '\0';
    memcpy(a->parent_id, tp + 36, 16);
    a->parent_id[16] = '\0';
  } else if (!ag__otlp_random_hex(a->trace_id, 16)) {
    a->trace_id[0] = '\0';
  }
  if (!ag__otlp_random_hex(a->span_id, 8))
    a->trace_id[0] = '\0'; /* no span without ids */
}

/* {"key": k, "value": {"stringValue": v}} onto arr. */
static void attr_str(json_t *arr, const char *k, const char *v) {
  if (v != NULL && v[0] != '\0')
    json_array_append_new(
        arr, json_pack("{s:s, s:{s:s}}", "key", k, "value", "stringValue", v));
}

/* An int64 as the official JSON serializer writes it: a number (proto3's
 * JSON mapping takes a number or a string). */
static void attr_int(json_t *arr, const char *k, long long v) {
  json_array_append_new(arr, json_pack("{s:s, s:{s:I}}", "key", k, "value",
                                       "intValue", (json_int_t)v));
}

char *ag__px_attr_span(const ag__px_attr *a, const char *path, unsigned status,
                       int64_t end_ns) {
  if (a->trace_id[0] == '\0')
    return NULL;
  /* the GenAI conventions: the operation and the provider by API */
  const ag__wire *w = ag__wire_named(a->api != NULL ? a->api : "");
  const char *op = w != NULL ? w->otel_operation : "chat";
  const char *provider = w != NULL ? w->otel_provider : "openai";
  json_t *at = json_array();
  if (at == NULL)
    return NULL;
  attr_str(at, "gen_ai.operation.name", op);
  attr_str(at, "gen_ai.provider.name", provider);
  attr_str(at, "gen_ai.system", provider);
  attr_str(at, "gen_ai.request.model", a->model);
  attr_str(at, "gen_ai.conversation.id", a->conv);
  if (a->in_tokens >= 0)
    attr_int(at, "gen_ai.usage.input_tokens", a->in_tokens);
  if (a->out_tokens >= 0)
    attr_int(at, "gen_ai.usage.output_tokens", a->out_tokens);
  attr_str(at, "http.request.method", a->method);
  char shown[151];
  ascii_word(path, shown, sizeof shown);
  attr_str(at, "url.path", shown);
  attr_int(at, "http.response.status_code", (long long)status);
  attr_str(at, "client.address", a->client);
  attr_str(at, "agentguard.api", a->api);
  attr_str(at, "agentguard.decision",
           a->decision != NULL ? a->decision : "passed");
  attr_str(at, "agentguard.reason", a->reason);
  attr_int(at, "agentguard.request_id", (long long)a->id);
  if (a->upstream_us >= 0)
    attr_int(at, "agentguard.upstream_ms", a->upstream_us / 1000);
  char name[AG__PX_MODEL_MAX + 32], t0[24], t1[24], msg[32];
  snprintf(name, sizeof name, "%s%s%s", op, a->model[0] ? " " : "", a->model);
  snprintf(t0, sizeof t0, "%lld", (long long)a->start_ns);
  snprintf(t1, sizeof t1, "%lld",
           (long long)(end_ns > a->start_ns ? end_ns : a->start_ns));
  snprintf(msg, sizeof msg, "HTTP %u", status);
  /* kind 3: a client span (the call to the model); status 2 (error) for
   * an answer of 400 or more, else 0 (unset) */
  json_t *s = json_pack(
      "{s:s, s:s, s:s, s:i, s:s, s:s, s:o, s:o}", "traceId", a->trace_id,
      "spanId", a->span_id, "name", name, "kind", 3, "startTimeUnixNano", t0,
      "endTimeUnixNano", t1, "attributes", at, "status",
      status >= 400 ? json_pack("{s:i, s:s}", "code", 2, "message", msg)
                    : json_pack("{s:i}", "code", 0));
  if (s != NULL && a->parent_id[0] != '\0')
    json_object_set_new(s, "parentSpanId", json_string(a->parent_id));
  char *text = s != NULL ? json_dumps(s, JSON_COMPACT) : NULL;
  json_decref(s);
  if (text != NULL && strlen(text) > AG__OTLP_SPAN_MAX) {
    free(text); /* a span has a bounded size: a long model name, cut */
    text = NULL;
  }
  return text;
}

void ag__px_attr_decision(ag__px_attr *a, const char *decision,
                          const ag_verdict *v) {
  if (a == NULL)
    return;
  a->decision = decision;
  snprintf(a->reason, sizeof a->reason, "%s",
           v != NULL ? ag_reason_name(v->reason) : "");
}

/* Writes all of buf to out's descriptor, past what the FILE buffers. */
static void write_whole(FILE *out, const char *buf, size_t n) {
  fflush(out);
  int fd = fileno(out);
  for (size_t off = 0; fd >= 0 && off < n;) {
    ssize_t w = write(fd, buf + off, n - off);
    if (w < 0 && errno == EINTR)
      continue;
    if (w <= 0)
      break;
    off += (size_t)w;
  }
}

void ag__px_attr_merge(ag__px_attr *a, const ag__px_attr *from) {
  if (from->decision != NULL) {
    a->decision = from->decision;
    memcpy(a->reason, from->reason, sizeof a->reason);
  }
  if (from->in_tokens >= 0)
    a->in_tokens = from->in_tokens;
  if (from->out_tokens >= 0)
    a->out_tokens = from->out_tokens;
  if (from->upstream_us >= 0) /* the stream's copy began with a's */
    a->upstream_us = from->upstream_us;
}

void ag__px_attr_log(const ag__px_attr *a, FILE *out, bool json,
                     const char *path, unsigned status, int64_t ms,
                     int64_t wall_ms) {
  const char *method = a->method[0] != '\0' ? a->method : NULL;
  char ts[32];
  time_t sec = (time_t)(wall_ms / 1000);
  struct tm tm;
  gmtime_r(&sec, &tm);
  size_t tl = strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(ts + tl, sizeof ts - tl, ".%03dZ", (int)(wall_ms % 1000));
  const char *decision = a->decision != NULL ? a->decision
                         : a->api != NULL    ? "passed"
                                             : "relayed";
  /* a path is the client's: cut, printable ASCII only (one word in a text
   * line, valid UTF-8 for JSON) */
  char shown[151];
  ascii_word(path, shown, sizeof shown);
  if (json) {
    json_t *o = json_pack(
        "{s:s, s:I, s:s, s:s, s:s, s:s*, s:s*, s:s*, s:s, s:s*, s:i, s:I}",
        "ts", ts, "id", (json_int_t)a->id, "client", a->client, "method",
        method != NULL ? method : "", "path", shown, "api", a->api, "model",
        a->model[0] ? a->model : NULL, "conversation",
        a->conv[0] ? a->conv : NULL, "decision", decision, "reason",
        a->reason[0] ? a->reason : NULL, "status", (int)status, "ms",
        (json_int_t)ms);
    if (o != NULL && a->upstream_us >= 0)
      json_object_set_new(o, "upstream_ms",
                          json_integer((json_int_t)(a->upstream_us / 1000)));
    if (o != NULL && a->in_tokens >= 0)
      json_object_set_new(o, "input_tokens", json_integer(a->in_tokens));
    if (o != NULL && a->out_tokens >= 0)
      json_object_set_new(o, "output_tokens", json_integer(a->out_tokens));
    char *line = o != NULL ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (line != NULL) {
      size_t n = strlen(line);
      char *whole = realloc(line, n + 2);
      if (whole != NULL) {
        whole[n] = '\n';
        write_whole(out, whole, n + 1);
        line = whole;
      }
    }
    free(line);
    return;
  }
  char up[32] = "-";
  if (a->upstream_us >= 0)
    snprintf(up, sizeof up, "%lld", (long long)(a->upstream_us / 1000));
  char tokens[48] = "-";
  if (a->in_tokens >= 0 || a->out_tokens >= 0)
    snprintf(tokens, sizeof tokens, "%lld+%lld",
             a->in_tokens >= 0 ? a->in_tokens : 0,
             a->out_tokens >= 0 ? a->out_tokens : 0);
  char line[1024];
  int n = snprintf(
      line, sizeof line,
      "%s #%llu %s %s %s api=%s model=%s conv=%s %s%s%s status=%u ms=%lld "
      "upstream_ms=%s tokens=%s\n",
      ts, a->id, a->client[0] ? a->client : "-", method != NULL ? method : "-",
      shown, a->api != NULL ? a->api : "-", a->model[0] ? a->model : "-",
      a->conv[0] ? a->conv : "-", decision, a->reason[0] ? " reason=" : "",
      a->reason, status, (long long)ms, up, tokens);
  if (n <= 0)
    return;
  size_t len = (size_t)n < sizeof line ? (size_t)n : sizeof line - 1;
  line[len - 1] = '\n'; /* a cut line still ends */
  write_whole(out, line, len);
}
