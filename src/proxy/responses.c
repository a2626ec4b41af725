/*
 * src/proxy/responses.c - the OpenAI Responses API guarded (POST
 * /v1/responses: Codex CLI, the OpenAI Agents SDK by default, clients of
 * the `openai` packages' responses.create).
 *
 * The decision is made on the request, as for the other shapes: the
 * conversation the client sends in `input` is read by the wire layer
 * (ag__wire_responses.to_chat: call items, their outputs, a shell's exit
 * status in the output text) and its last turn replayed through a fresh
 * guard. A stop is answered by the proxy with a response in the API's
 * shape - one assistant message saying why, as JSON or as the events of
 * a stream (response.created ... response.completed, sequence numbers in
 * order) - and the upstream is not asked. Otherwise the request goes
 * upstream, with the error context as one more user message item when
 * errors.error_context asks for it, and the upstream's reply is relayed
 * as it comes, streamed or not.
 *
 * What differs from Chat Completions and Messages (docs/proxy.md):
 *   - the reply is not held and checked: a call the model repeats reaches
 *     the client, and the guard sees it when its output comes back in the
 *     next request (one call later than with the other shapes);
 *   - a request that continues a conversation the upstream keeps
 *     (`previous_response_id`, `conversation`) holds only its newest items:
 *     the turn cannot be replayed, so it is relayed unguarded, with an
 *     `unguarded` event that says why;
 *   - a stop is never the final request without tools: the stop reply is
 *     the answer.
 */
#include "internal.h"

/* The stop reply in the Responses shape (stream: the events). */
static void stop_reply(ag_proxy *p, const json_t *req, const ag_verdict *v,
                       bool stream, reply *r) {
  char text[AG_VERDICT_MSG_MAX * 2 + 128];
  ag__px_stop_text(v, text, sizeof text);
  char id[64];
  snprintf(id, sizeof id, "resp_agentguard_%lu",
           (unsigned long)atomic_fetch_add(&p->ids, 1));
  const char *model = json_string_value(json_object_get(req, "model"));
  json_t *o = ag__responses_stop(id, model != NULL ? model : "agentguard", text,
                                 (long long)time(NULL), stream);
  if (!stream) {
    ag__px_set_json(r, 200, o);
  } else {
    sbuf b = {NULL, 0, 0, false};
    size_t i;
    json_t *ev;
    b.failed = o == NULL;
    json_array_foreach(o, i, ev) {
      const char *type = json_string_value(json_object_get(ev, "type"));
      ag__px_sb_add(&b, "event: ", 7);
      ag__px_sb_add(&b, type, strlen(type));
      ag__px_sb_add(&b, "\n", 1);
      ag__px_sb_json(&b, json_incref(ev));
    }
    json_decref(o);
    ag__px_set_sse(r, &b);
  }
  if (r->status == 200)
    r->stop = ag_reason_name(v->reason);
}

/* The request with the error context as a user message item at the end of
 * `input` (a string input becomes its user message first): the new body,
 * or NULL when out of memory. */
static char *with_context(const json_t *req, const char *ectx, size_t *len) {
  json_t *b = json_copy((json_t *)req);
  const json_t *in = json_object_get(req, "input");
  json_t *items = json_is_array(in) ? json_copy((json_t *)in) : json_array();
  char *text = NULL;
  if (b != NULL && items != NULL &&
      (!json_is_string(in) ||
       json_array_append_new(items, json_pack("{s:s, s:O}", "role", "user",
                                              "content", in)) == 0) &&
      json_array_append_new(items, json_pack("{s:s, s:s}", "role", "user",
                                             "content", ectx)) == 0 &&
      json_object_set(b, "input", items) == 0)
    text = json_dumps(b, JSON_COMPACT);
  json_decref(items);
  json_decref(b);
  if (text != NULL)
    *len = strlen(text);
  return text;
}

/* Why a request cannot be replayed from itself, or NULL. */
static const char *held_upstream(const json_t *req) {
  const json_t *prev = json_object_get(req, "previous_response_id");
  if (json_is_string(prev))
    return "previous_response_id: the conversation is kept by the upstream; "
           "the request holds only its newest items";
  const json_t *conv = json_object_get(req, "conversation");
  if (conv != NULL && !json_is_null(conv))
    return "conversation: the conversation is kept by the upstream; the "
           "request holds only its newest items";
  return NULL;
}

/* The turn in `req` replayed through *g: the action (v filled), or -1 with
 * r the answer (a 400, a 500). */
static int decide(ag_proxy *p, const json_t *req, ag_guard **g, ag_verdict *v,
                  reply *r) {
  const json_t *input = json_object_get(req, "input");
  char emsg[ERR_MSG_MAX];
  json_t *chat = ag__wire_responses.to_chat(input, 0, emsg, sizeof emsg);
  if (chat == NULL) {
    if (emsg[0] != '\0')
      ag__px_set_error(r, 400, "invalid_request_error", "invalid_request",
                       "agentguard proxy: %s", emsg);
    else
      ag__px_set_error(r, 500, "server_error", "out_of_memory",
                       "out of memory");
    return -1;
  }
  ag_error_t err;
  int act = -1;
  if (ag_guard_new(g, &p->cfg, NULL, &err) != AG_OK) {
    ag__px_set_error(r, 500, "server_error", "guard", "agentguard proxy: %s",
                     err.msg);
  } else {
    act = ag__px_replay_turn(*g, chat, SIZE_MAX, v, emsg, sizeof emsg);
    if (act == -1)
      ag__px_set_error(r, 400, "invalid_request_error", "invalid_request",
                       "agentguard proxy: input: %s", emsg);
    else if (act == -2)
      ag__px_set_error(r, 500, "server_error", "out_of_memory",
                       "out of memory");
    if (act >= 0 && !ag__stops((ag_action)act))
      act = ag_guard_begin_iteration(*g, 0, v);
  }
  json_decref(chat);
  return act < 0 ? -1 : act;
}

/* The body the upstream gets: the client's, or with the error context. */
static bool add_context(ag_proxy *p, req_ctx *q, const json_t *req, ag_guard *g,
                        const char *path, reply *r) {
  char ectx[8192];
  size_t need = ag_guard_error_context(g, AG_RECOVER_EXECUTION, NULL, 0, ectx,
                                       sizeof ectx);
  if (need == 0 || ectx[0] == '\0')
    return true;
  size_t len = 0;
  char *body = with_context(req, ectx, &len);
  if (body == NULL) {
    ag__px_set_error(r, 500, "server_error", "out_of_memory", "out of memory");
    return false;
  }
  free(q->body);
  q->body = body;
  q->len = len;
  ag__px_event(p, "error_context", path, NULL, NULL);
  return true;
}

void ag__px_responses(ag_proxy *p, struct MHD_Connection *c, req_ctx *q,
                      const char *path, reply *r, bool *started) {
  json_error_t je;
  json_t *req = json_loadb(q->body != NULL ? q->body : "", q->len, 0, &je);
  ag_guard *g = NULL;
  ag_verdict v;
  memset(&v, 0, sizeof v);
  const json_t *input = json_object_get(req, "input");
  const char *unguarded = req != NULL ? held_upstream(req) : NULL;
  int act = AG_ALLOW;
  if (req == NULL) {
    ag__px_set_error(
        r, 400, "invalid_request_error", "invalid_json",
        "agentguard proxy: the request body is not JSON: %s (line %d, "
        "column %d)",
        je.text, je.line, je.column);
    act = -1;
  } else if (!json_is_object(req)) {
    ag__px_set_error(r, 400, "invalid_request_error", "invalid_request",
                     "agentguard proxy: the request body must be a JSON "
                     "object");
    act = -1;
  } else if (unguarded != NULL) {
    ag__px_event(p, "unguarded", path, NULL, unguarded);
  } else if (json_is_array(input)) {
    act = decide(p, req, &g, &v, r);
  } else if (input != NULL && !json_is_string(input)) {
    ag__px_set_error(r, 400, "invalid_request_error", "invalid_request",
                     "agentguard proxy: input: expected a string or an array "
                     "of items");
    act = -1;
  } /* a string input (or none) is a new turn: nothing to replay */
  if (act < 0) {
    /* r holds the answer */
  } else if (ag__stops((ag_action)act)) {
    ag__px_event(p, "stopped_before_request", path, &v, NULL);
    stop_reply(p, req, &v, json_is_true(json_object_get(req, "stream")), r);
  } else if (g == NULL || !p->cfg.errors.error_context ||
             add_context(p, q, req, g, path, r)) {
    *started = ag__px_relay_start(p, c, q, path, r);
  }
  if (r->status == 400)
    ag__px_bad_request(p, path, r);
  ag_guard_free(g);
  json_decref(req);
}
