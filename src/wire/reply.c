/*
 * src/wire/reply.c - the reply being assembled from any shape's reply or
 * stream (ag__asm: text, refusal, tool calls by the wire's index, usage,
 * the finish; every part capped), and the JSON helpers the shapes share
 * (wire.h).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../core/internal.h"
#include "wire.h"

/* Widths of outside text quoted in a message. */
#define SHOWN_TOKEN 40        /* an API's error type or code */
#define API_MESSAGE_CHARS 400 /* the API's own error message */
#define MAX_CALL_NAME 4096    /* bytes of a tool call's id or name */

void ag__perr_set(ag_provider_error *perr, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(perr->message, sizeof(perr->message), fmt, ap);
  va_end(ap);
}

/* Hands over a heap buffer's text (NULL before its first append) and
 * leaves the buffer empty, with its cap. */
static char *buf_take(ag__buf *b) {
  char *p = b->p;
  size_t cap = b->cap;
  b->p = NULL;
  ag__buf_init(b, cap);
  return p;
}

void ag__asm_finish_reason(ag__asm *a, const char *s, size_t len) {
  size_t n = strnlen(s, len); /* "%s" stops at a NUL */
  if (n > sizeof(a->finish_reason) - 1)
    n = sizeof(a->finish_reason) - 1;
  memcpy(a->finish_reason, s, n);
  a->finish_reason[n] = '\0';
}

const char *ag__jstr(const json_t *obj, const char *key, size_t *len) {
  json_t *v = json_object_get(obj, key);
  if (!json_is_string(v))
    return NULL;
  if (len != NULL)
    *len = json_string_length(v);
  return json_string_value(v);
}

/* Copies text with control characters shown as spaces and whitespace runs
 * collapsed, cut on a UTF-8 boundary. */
void ag__readable(char *dst, size_t cap, const char *s, size_t n, size_t max) {
  bool cut = false;
  ag__collapse_ws(dst, cap, s, n, max, &cut);
  for (char *p = dst; *p; p++)
    if ((unsigned char)*p < 0x20 || *p == 0x7f)
      *p = ' ';
}

bool ag__api_error_message(const json_t *error, char *buf, size_t cap) {
  if (json_is_string(error)) {
    ag__readable(buf, cap, json_string_value(error), json_string_length(error),
                 API_MESSAGE_CHARS);
    return buf[0] != '\0';
  }
  if (!json_is_object(error))
    return false;
  size_t ml = 0;
  const char *m = ag__jstr(error, "message", &ml);
  const char *type = ag__jstr(error, "type", NULL);
  json_t *code = json_object_get(error, "code");
  char msg[420] = "";
  if (m != NULL)
    ag__readable(msg, sizeof(msg), m, ml, API_MESSAGE_CHARS);
  char extra[128] = "";
  char codebuf[48] = "";
  if (json_is_string(code))
    snprintf(codebuf, sizeof(codebuf), "%.*s", SHOWN_TOKEN,
             json_string_value(code));
  else if (json_is_integer(code))
    snprintf(codebuf, sizeof(codebuf), "%lld",
             (long long)json_integer_value(code));
  if (type != NULL && codebuf[0] != '\0')
    snprintf(extra, sizeof(extra), " (type %.*s, code %s)", SHOWN_TOKEN, type,
             codebuf);
  else if (type != NULL)
    snprintf(extra, sizeof(extra), " (type %.*s)", SHOWN_TOKEN, type);
  else if (codebuf[0] != '\0')
    snprintf(extra, sizeof(extra), " (code %s)", codebuf);
  if (msg[0] == '\0' && extra[0] == '\0')
    return false;
  snprintf(buf, cap, "%s%s", msg[0] != '\0' ? msg : "no message", extra);
  return true;
}

/* ------------------------------------------------------------------------ */
/* The reply assembler                                                      */
/* ------------------------------------------------------------------------ */

void ag__asm_init(ag__asm *a, ag_delta_fn on_delta, void *delta_user,
                  ag_provider_error *perr, const char *service) {
  memset(a, 0, sizeof(*a));
  a->on_delta = on_delta;
  a->delta_user = delta_user;
  a->perr = perr;
  a->service = service;
  a->failed = AG_OK;
  ag__buf_init(&a->text, AG__REPLY_TEXT_MAX);
  ag__buf_init(&a->refusal, AG__REPLY_TEXT_MAX);
}

void ag__asm_free(ag__asm *a) {
  ag__buf_free(&a->text);
  ag__buf_free(&a->refusal);
  for (int i = 0; i < a->n_slots; i++) {
    free(a->calls[i].id);
    free(a->calls[i].name);
    ag__buf_free(&a->calls[i].args);
  }
  free(a->calls);
  memset(a, 0, sizeof(*a));
}

static bool asm_fail(ag__asm *a, ag_err_t rc) {
  if (a->failed == AG_OK)
    a->failed = rc;
  return false;
}

bool ag__asm_bad(ag__asm *a, long pos, const char *fmt, ...) {
  if (a->failed != AG_OK)
    return false;
  char what[300];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof(what), fmt, ap);
  va_end(ap);
  a->failed = AG_EPROVIDER;
  if (a->perr != NULL) {
    a->perr->transient = false;
    if (pos >= 0)
      ag__perr_set(a->perr,
                   "the reply from %s is not what the API promises: %s at byte "
                   "%ld",
                   a->service, what, pos);
    else
      ag__perr_set(a->perr,
                   "the reply from %s is not what the API promises: %s",
                   a->service, what);
  }
  return false;
}

bool ag__asm_stream_error(ag__asm *a, const json_t *error) {
  if (a->failed != AG_OK)
    return false;
  a->failed = AG_EPROVIDER;
  if (a->perr == NULL)
    return false;
  char m[440];
  if (!ag__api_error_message(error, m, sizeof(m)))
    snprintf(m, sizeof(m), "an error without a message");
  const char *type =
      json_is_object(error) ? ag__jstr(error, "type", NULL) : NULL;
  /* A server that fails mid-stream is as transient as its status would
   * be; the type names what the status would have been. */
  int status = 0;
  if (type != NULL) {
    if (strcmp(type, "overloaded_error") == 0)
      status = 529;
    else if (strcmp(type, "rate_limit_error") == 0 ||
             strcmp(type, "rate_limit_exceeded") == 0)
      status = 429;
    else if (strcmp(type, "api_error") == 0 ||
             strcmp(type, "server_error") == 0)
      status = 500;
    else if (strcmp(type, "timeout_error") == 0)
      status = 504;
  }
  a->perr->http_status = status;
  a->perr->transient = status != 0;
  ag__perr_set(a->perr, "%s reported an error mid-stream: %s", a->service, m);
  return false;
}

bool ag__asm_text(ag__asm *a, const char *s, size_t len) {
  ag_err_t rc = ag__buf_add(&a->text, s, len);
  if (rc == AG_ETOOBIG)
    return ag__asm_bad(a, -1, "the reply's text exceeds %u bytes",
                       AG__REPLY_TEXT_MAX);
  if (rc != AG_OK)
    return asm_fail(a, rc);
  if (a->on_delta != NULL && len > 0 && !a->delta_stopped &&
      a->on_delta(a->delta_user, s, len) != 0) {
    a->delta_stopped = true;
    return false;
  }
  return true;
}

bool ag__asm_refusal(ag__asm *a, const char *s, size_t len) {
  ag_err_t rc = ag__buf_add(&a->refusal, s, len);
  if (rc == AG_ETOOBIG)
    return ag__asm_bad(a, -1, "the refusal exceeds %u bytes",
                       AG__REPLY_TEXT_MAX);
  return rc == AG_OK ? true : asm_fail(a, rc);
}

ag__part_call *ag__asm_call(ag__asm *a, int64_t index) {
  if (index < 0 || index >= AG__CALLS_MAX) {
    ag__asm_bad(a, -1, "tool call index %lld is outside 0..%d",
                (long long)index, AG__CALLS_MAX - 1);
    return NULL;
  }
  /* The slots: allocated whole with the first call (never moved: a slot
   * is held across calls), made up to the index as it is reached. A reply
   * without calls - most are text - neither allocates nor zeroes them
   * (9 KB, which were zeroed twice a proxied request). */
  if (a->calls == NULL &&
      (a->calls = malloc(AG__CALLS_MAX * sizeof(*a->calls))) == NULL) {
    asm_fail(a, AG_ENOMEM);
    return NULL;
  }
  for (; a->n_slots <= index; a->n_slots++) { /* the slots up to it made */
    ag__part_call *m = &a->calls[a->n_slots];
    memset(m, 0, sizeof(*m));
    ag__buf_init(&m->args, AG__CALL_ARGS_MAX);
  }
  ag__part_call *c = &a->calls[index];
  c->used = true;
  return c;
}

bool ag__asm_set(ag__asm *a, char **dst, const char *s, size_t len) {
  if (len > MAX_CALL_NAME)
    return ag__asm_bad(a, -1, "a tool call's id or name exceeds %d bytes",
                       MAX_CALL_NAME);
  char *d = ag__strndup(s, len);
  if (d == NULL)
    return asm_fail(a, AG_ENOMEM);
  free(*dst);
  *dst = d;
  return true;
}

bool ag__asm_args(ag__asm *a, ag__part_call *c, const char *s, size_t len) {
  ag_err_t rc = ag__buf_add(&c->args, s, len);
  if (rc == AG_ETOOBIG)
    return ag__asm_bad(a, -1, "a tool call's arguments exceed %u bytes",
                       AG__CALL_ARGS_MAX);
  return rc == AG_OK ? true : asm_fail(a, rc);
}

ag_err_t ag__asm_finish(ag__asm *a, ag_reply *out) {
  for (int i = 0; i < a->n_slots; i++) {
    ag__part_call *c = &a->calls[i];
    if (!c->used)
      continue;
    if (c->name == NULL || c->name[0] == '\0') {
      ag__asm_bad(a, -1, "tool call %d has no function name", i);
      return AG_EPROVIDER;
    }
    /* A call with no arguments at all is a call with none: "{}". */
    const char *args = c->args.len > 0 ? c->args.p : "{}";
    size_t alen = c->args.len > 0 ? c->args.len : 2;
    ag_err_t rc = ag_reply_add_call(out, c->id, c->name, args, alen);
    if (rc != AG_OK)
      return rc;
  }
  if (a->text.p != NULL)
    out->text = buf_take(&a->text);
  if (a->refusal.p != NULL) {
    out->refusal = buf_take(&a->refusal);
    if (out->text == NULL || out->text[0] == '\0') {
      free(out->text);
      out->text = ag__strdup(out->refusal);
      if (out->text == NULL)
        return AG_ENOMEM;
    }
  }
  out->has_usage = a->has_usage;
  out->usage = a->usage;
  ag__scopy(out->finish_reason, sizeof(out->finish_reason), a->finish_reason);
  return AG_OK;
}

/* ---- a stream relayed (wire.h) ------------------------------------------ */

bool ag__wire_relay_init(ag__wire_relay *r, ag__asm *a, size_t cap) {
  memset(r, 0, sizeof(*r));
  r->a = a;
  ag__buf_init(&r->out, cap);
  ag__buf_init(&r->held, cap);
  for (size_t k = 0; k < AG__RELAY_BLOCKS; k++)
    r->map[k] = -1;
  r->held_ev = json_array();
  return r->held_ev != NULL;
}

void ag__wire_relay_free(ag__wire_relay *r) {
  ag__buf_free(&r->out);
  ag__buf_free(&r->held);
  json_decref(r->held_ev);
  r->held_ev = NULL;
}

bool ag__wire_relay_text(ag__wire_relay *r, const char *text, size_t len) {
  if (r->on_text != NULL && !r->on_text(r->user, text, len)) {
    r->looped = true;
    return false;
  }
  r->any_text = true;
  return true;
}
