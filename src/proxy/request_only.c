/*
 * src/proxy/request_only.c - the APIs decided on the request alone: OpenAI
 * Responses (POST /v1/responses: Codex CLI, the OpenAI Agents SDK by
 * default) and Gemini (POST /v1beta/models/{model}:generateContent and
 * :streamGenerateContent: Gemini CLI, the google-genai clients). Every
 * shape-specific step is the wire table's (src/wire/): the conversation's
 * key (conv_key), its reading as a turn (to_chat), the form the client
 * wants its reply in (reply_form), the stop reply (stop_body) and the
 * error context added as the user's text (add_user_text).
 *
 * The conversation the client sends is read by the wire layer and its
 * last turn replayed through a fresh guard. A stop is answered by the
 * proxy in the API's shape - one assistant message saying why, as JSON,
 * as the events of a stream, or as Gemini's JSON array of chunks - and
 * the upstream is not asked. Otherwise the request goes upstream, with the
 * error context as the user's text when errors.error_context asks for it;
 * the upstream's reply is held whole (under the held-reply budget), read
 * by the shape's own reader in the form the client asked for, and checked:
 * a call that trips a mechanism has the reply replaced by the stop, any
 * other reply is passed back as it came.
 *
 * What differs from Chat Completions and Messages (docs/proxy.md):
 *   - a streamed reply reaches the client at once when it is whole, not
 *     event by event;
 *   - no nudge: a call the guard would nudge is passed back, and the next
 *     request (its result in) is decided again;
 *   - a request without tools (Gemini CLI's routing call, a JSON-output
 *     request) cannot make a call: it is relayed untouched;
 *   - a Responses request that continues a conversation the upstream keeps
 *     (`previous_response_id`, `conversation`) holds only its newest
 *     items: that conversation is read back from the upstream (stored.c,
 *     on a worker) and the turn decided from it; when it cannot be read,
 *     the request is relayed unguarded, with an `unguarded` event that
 *     says why;
 *   - a stop is never the final request without tools: the stop reply is
 *     the answer.
 */
#include "internal.h"

/* The turn in `req` replayed through *g: true with *act (v filled), or
 * false with r the answer (a 400, a 500). */
static bool decide(ag_proxy *p, const json_t *req, ag_guard **g, ag_verdict *v,
                   reply *r, ag_action *act) {
  const ag__wire *w = r->shape;
  const json_t *conv = json_object_get(req, w->conv_key);
  char emsg[ERR_MSG_MAX];
  json_t *chat = w->to_chat(conv, 0, emsg, sizeof emsg);
  if (chat == NULL) {
    if (emsg[0] != '\0')
      ag__px_set_error(r, 400, "invalid_request_error", "invalid_request",
                       "agentguard proxy: %s", emsg);
    else
      ag__px_set_error(r, 500, "server_error", "out_of_memory",
                       "out of memory");
    return false;
  }
  ag_error_t err;
  ag_err_t rc = AG_ECONFIG;
  if (ag_guard_new(g, &p->cfg, NULL, &err) != AG_OK) {
    ag__px_set_error(r, 500, "server_error", "guard", "agentguard proxy: %s",
                     err.msg);
  } else {
    rc = ag__px_replay_turn(*g, chat, SIZE_MAX, v, emsg, sizeof emsg, act);
    if (rc == AG_EINVAL)
      ag__px_set_error(r, 400, "invalid_request_error", "invalid_request",
                       "agentguard proxy: %s: %s", w->conv_key, emsg);
    else if (rc != AG_OK)
      ag__px_set_error(r, 500, "server_error", "out_of_memory",
                       "out of memory");
    else if (!ag__stops(*act))
      *act = ag_guard_begin_iteration(*g, 0, v);
  }
  json_decref(chat);
  return rc == AG_OK;
}

/* The body the upstream gets: the client's, or with the error context
 * (*ours set). */
static bool add_context(ag_proxy *p, req_ctx *q, const json_t *req, ag_guard *g,
                        const char *path, reply *r, bool *ours) {
  char ectx[8192];
  size_t need = ag_guard_error_context(g, AG_RECOVER_EXECUTION, NULL, 0, ectx,
                                       sizeof ectx);
  if (need == 0 || ectx[0] == '\0')
    return true;
  *ours = true;
  json_t *b = json_copy((json_t *)req);
  char *body = b != NULL && r->shape->add_user_text(b, ectx)
                   ? json_dumps(b, JSON_COMPACT)
                   : NULL;
  json_decref(b);
  if (body == NULL) {
    ag__px_set_error(r, 500, "server_error", "out_of_memory", "out of memory");
    return false;
  }
  ag__px_body_tape_free(p, q); /* it reads the old body */
  free(q->body);
  q->body = body;
  q->len = strlen(body);
  ag__px_event(p, &q->attr, "error_context", path, NULL, NULL);
  return true;
}

/* The request goes upstream (the client's body, or `body` when the error
 * context rewrote it) and its reply is held whole and checked as the
 * guard checks a model's reply: a call that trips a mechanism (the 5th
 * identical call) has the reply replaced by the stop, in the client's
 * form; any other reply, or an upstream error, is passed back as it came.
 * On a request's thread (it waits). */
static void answer_held(ag_proxy *p, req_ctx *q, const json_t *req,
                        const char *path, bool ours, ag_guard *g, ag_verdict *v,
                        reply *r) {
  upstream u;
  memset(&u, 0, sizeof u);
  ag_reply rep;
  memset(&rep, 0, sizeof rep);
  ag__px_send_upstream(q->sh->relay, p, q->client_hdrs, "POST", q->uri, q->body,
                       q->len, ours, q->client_fd, &u);
  ag__px_attr_upstream(&q->attr, u.total_us);
  const char *query = strchr(q->uri, '?');
  ag__reply_form form =
      r->shape->reply_form(path, query != NULL ? query + 1 : "", req);
  if (ag__px_upstream_failed(p, &u, r)) {
    /* r holds the 502 or 504 */
  } else if (u.status < 200 || u.status >= 300) {
    ag__px_pass_back(&u, r);
  } else if (ag__px_read_reply_as(&u, r->shape, form, NULL, &rep, r)) {
    ag__px_attr_usage(&q->attr, &rep);
    ag_call_check checks[AG__CALLS_MAX];
    ag_action act = ag__px_check_reply(g, &rep, false, checks, v);
    if (ag__stops(act)) {
      ag__px_event(p, &q->attr, "reply_replaced", path, v, NULL);
      ag__px_stop_reply(p, q, req, path, v, r);
    } else {
      ag__px_pass_back(&u, r); /* a nudge: the next request decides */
    }
  }
  ag_reply_clear(&rep);
  ag__px_upstream_free(&u);
}

/* Whether a request offers the model no tool (nothing it can call). */
static bool no_tools(const json_t *req) {
  const json_t *tools = json_object_get(req, "tools");
  return tools == NULL || json_is_null(tools) ||
         (json_is_array(tools) && json_array_size(tools) == 0);
}

/* What to do with a parsed request before its turn. */
typedef enum {
  TRIAGE_ANSWERED, /* r is the answer (a 400) */
  TRIAGE_RELAY,    /* relayed untouched: nothing to guard */
  TRIAGE_DECIDE,   /* its turn is decided */
  TRIAGE_STORED    /* decided from the conversation the upstream keeps */
} triage_t;

static triage_t triage(ag_proxy *p, req_ctx *q, const json_t *req,
                       const char *path, reply *r) {
  const ag__wire *w = r->shape;
  const json_t *conv = json_object_get(req, w->conv_key);
  const char *unguarded = w->unguarded != NULL ? w->unguarded(req) : NULL;
  if (unguarded != NULL && no_tools(req))
    return TRIAGE_RELAY; /* no call possible: nothing to read back */
  if (unguarded != NULL) {
    char list[320], object[320];
    if (w->stored != NULL && w->stored(req, NULL, list, object, sizeof list))
      return TRIAGE_STORED;
    ag__px_event(p, &q->attr, "unguarded", path, NULL, unguarded);
    return TRIAGE_RELAY;
  }
  if (conv == NULL || json_is_string(conv) || no_tools(req))
    return TRIAGE_RELAY; /* a new turn, or no call possible */
  if (!json_is_array(conv)) {
    ag__px_set_error(r, 400, "invalid_request_error", "invalid_request",
                     "agentguard proxy: %s: expected %s", w->conv_key,
                     w->conv_expect);
    return TRIAGE_ANSWERED;
  }
  return TRIAGE_DECIDE;
}

/* A request continuing a conversation the upstream keeps: its turn
 * decided from that conversation, read back (this thread waits), as
 * decide() does; when it cannot be read or read as a turn, the request is
 * relayed unguarded (true, *g NULL) with an `unguarded` event saying why. */
static bool decide_stored(ag_proxy *p, req_ctx *q, const json_t *req,
                          const char *path, ag_guard **g, ag_verdict *v,
                          reply *r, ag_action *act) {
  char why[512], detail[1024];
  json_t *whole = ag__px_stored_request(p, q, req, path, why, sizeof why);
  bool ok = whole != NULL && decide(p, whole, g, v, r, act);
  json_decref(whole);
  if (ok)
    return true;
  if (whole != NULL) { /* the items read back are not a turn it reads */
    const ag__wire *w = r->shape;
    snprintf(why, sizeof why, "the conversation read back: %.400s",
             r->body != NULL ? r->body : "not readable");
    ag__px_reply_free(r);
    r->shape = w;
    ag_guard_free(*g);
    *g = NULL;
  }
  snprintf(detail, sizeof detail, "%s; reading it back failed: %s",
           r->shape->unguarded(req), why);
  ag__px_event(p, &q->attr, "unguarded", path, NULL, detail);
  return true;
}

void ag__px_request_only(ag_proxy *p, struct MHD_Connection *c, req_ctx *q,
                         const char *path, reply *r, bool *started,
                         bool *later) {
  json_error_t je;
  json_t *req = json_loadb(q->body != NULL ? q->body : "", q->len, 0, &je);
  ag_guard *g = NULL;
  ag_verdict v;
  memset(&v, 0, sizeof v);
  ag_action act = AG_ALLOW;
  bool decided = false, deferred = false;
  if (req == NULL) {
    ag__px_set_error(
        r, 400, "invalid_request_error", "invalid_json",
        "agentguard proxy: the request body is not JSON: %s (line %d, "
        "column %d)",
        je.text, je.line, je.column);
  } else if (!json_is_object(req)) {
    ag__px_set_error(r, 400, "invalid_request_error", "invalid_request",
                     "agentguard proxy: the request body must be a JSON "
                     "object");
  } else {
    triage_t tr = triage(p, q, req, path, r);
    /* reading the conversation back waits: on the loop, a worker does */
    deferred = tr == TRIAGE_STORED && later != NULL;
    decided = tr == TRIAGE_RELAY || /* relayed untouched, g NULL */
              (tr == TRIAGE_DECIDE && decide(p, req, &g, &v, r, &act)) ||
              (tr == TRIAGE_STORED && !deferred &&
               decide_stored(p, q, req, path, &g, &v, r, &act));
  }
  if (deferred) {
    *later = true; /* nothing said or sent yet: a worker reads it back */
  } else if (!decided) {
    /* r holds the answer */
  } else if (ag__stops(act)) {
    ag__px_event(p, &q->attr, "stopped_before_request", path, &v, NULL);
    ag__px_stop_reply(p, q, req, path, &v, r);
  } else if (g == NULL) {
    *started = ag__px_relay_start(p, c, q, path, r);
  } else if (later != NULL) {
    *later = true; /* nothing said or sent yet: a worker decides again */
  } else {
    bool ours = false;
    if (!p->cfg.errors.error_context ||
        add_context(p, q, req, g, path, r, &ours))
      answer_held(p, q, req, path, ours, g, &v, r);
  }
  /* once the relay started, q (and r in it) is the loop's: it may be
   * answered and freed already */
  if (!*started && r->status == 400)
    ag__px_bad_request(p, &q->attr, path, r);
  ag_guard_free(g);
  json_decref(req);
}
