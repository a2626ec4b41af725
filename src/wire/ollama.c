/*
 * src/wire/ollama.c - Ollama's own chat API (POST /api/chat: what the
 * `ollama` client libraries, LangChain's ChatOllama, aider's ollama_chat/
 * models and other local agents speak), for the HTTP provider
 * (`provider.kind` "ollama") and the proxy.
 *
 * Request. {"model", "messages", "tools", "stream", "options", "think",
 * "format", "keep_alive"}. The messages are Chat Completions' but for
 * calls: an assistant's "tool_calls" are [{"function": {"name",
 * "arguments"}}], the arguments an object (newer servers add "id" and
 * "index"), and a tool message says which tool answered with "tool_name"
 * (older clients: by its place after the calls). Tools are Chat
 * Completions' tools. `stream` is true unless the request says false.
 *
 * Reply. {"model", "created_at", "message": {"role": "assistant",
 * "content", "thinking", "tool_calls"}, "done", "done_reason",
 * "prompt_eval_count", "eval_count", ...}. Streamed, the same object once
 * per line (NDJSON, application/x-ndjson), each with the new text, a call
 * whole in the line that has it, the last with "done": true and the
 * counts. An error is {"error": "text"}, as a body or as a line.
 *
 * Read as turns (the proxy, the audit): the messages as Chat Completions
 * messages; a call without an id is named by its place ("ollama_<message>_
 * <call>"), a tool message answers the call its tool_call_id names, else
 * the oldest unanswered call its tool_name names, else the oldest
 * unanswered call; a tool message with every call answered is not read
 * (Ollama does not pair them).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "wire.h"

static bool set_new(json_t *o, const char *key, json_t *v) {
  return v != NULL && json_object_set_new(o, key, v) == 0;
}

/* ---- requests (the provider) ------------------------------------------- */

/* A call's arguments (JSON text) as the object Ollama wants: the object
 * itself, anything else wrapped as {"input": value}. */
static json_t *call_args(const char *args) {
  json_t *v = json_loads(args != NULL && args[0] != '\0' ? args : "{}",
                         JSON_DECODE_ANY, NULL);
  if (v == NULL)
    return json_pack("{s:s}", "input", args);
  if (json_is_object(v))
    return v;
  return json_pack("{s:o}", "input", v);
}

/* The name of the call `id` in the assistant messages before messages[i],
 * or NULL. */
static const char *call_name(const json_t *messages, size_t i, const char *id) {
  while (id != NULL && i-- > 0) {
    size_t k;
    const json_t *tc;
    json_array_foreach(
        json_object_get(json_array_get(messages, i), "tool_calls"), k, tc) {
      const char *cid = ag__jstr(tc, "id", NULL);
      if (cid != NULL && strcmp(cid, id) == 0)
        return ag__jstr(json_object_get(tc, "function"), "name", NULL);
    }
  }
  return NULL;
}

/* One chat message as Ollama's. */
static json_t *message_out(const json_t *messages, size_t i, char *msg,
                           size_t cap) {
  const json_t *m = json_array_get(messages, i);
  const char *role = ag__jstr(m, "role", NULL);
  if (role == NULL) {
    snprintf(msg, cap, "messages[%zu].role: expected a string", i);
    return NULL;
  }
  const json_t *content = json_object_get(m, "content");
  json_t *text = content == NULL || json_is_null(content)
                     ? json_string("")
                     : ag__blocks_text(content);
  if (strcmp(role, "developer") == 0)
    role = "system";
  json_t *o = json_pack("{s:s, s:o}", "role", role, "content", text);
  if (o == NULL)
    return NULL;
  if (strcmp(role, "tool") == 0) {
    const char *name =
        call_name(messages, i, ag__jstr(m, "tool_call_id", NULL));
    if (name != NULL && !set_new(o, "tool_name", json_string(name)))
      goto fail;
  }
  size_t k;
  const json_t *tc;
  json_t *calls = NULL;
  json_array_foreach(json_object_get(m, "tool_calls"), k, tc) {
    const json_t *fn = json_object_get(tc, "function");
    const char *name = ag__jstr(fn, "name", NULL);
    if (name == NULL) {
      snprintf(msg, cap, "messages[%zu].tool_calls[%zu]: no function name", i,
               k);
      goto fail;
    }
    if (calls == NULL &&
        (!set_new(o, "tool_calls", calls = json_array()) || calls == NULL))
      goto fail;
    if (json_array_append_new(
            calls,
            json_pack("{s:{s:s, s:o}}", "function", "name", name, "arguments",
                      call_args(ag__jstr(fn, "arguments", NULL)))) != 0)
      goto fail;
  }
  return o;
fail:
  json_decref(o);
  return NULL;
}

static char *ollama_request(const ag__wire_opts *o, const ag_request *req,
                            size_t *len, ag_err_t *rc, char *msg, size_t cap) {
  *rc = AG_ENOMEM;
  msg[0] = '\0';
  json_t *parsed = NULL;
  const json_t *messages = req->messages;
  if (req->messages_json != NULL) {
    parsed = json_loadb(req->messages_json, req->messages_json_len, 0, NULL);
    messages = parsed;
  }
  if (!json_is_array(messages)) {
    json_decref(parsed);
    *rc = AG_EINVAL;
    snprintf(msg, cap, "messages: expected an array (or its JSON text)");
    return NULL;
  }
  /* never streamed: the reply is read whole (the provider's streams are
   * server-sent events; Ollama's are lines of JSON) */
  json_t *body = json_pack("{s:s, s:[], s:b}", "model", o->model, "messages",
                           "stream", false);
  json_t *out = json_object_get(body, "messages"), *opts = json_object();
  char *text = NULL;
  bool ok = body != NULL && opts != NULL;
  for (size_t i = 0; ok && i < json_array_size(messages); i++) {
    json_t *m = message_out(messages, i, msg, cap);
    ok = m != NULL && json_array_append_new(out, m) == 0;
    if (!ok && msg[0] != '\0')
      *rc = AG_EINVAL;
  }
  if (ok && json_is_array(req->tools) && json_array_size(req->tools) > 0)
    ok = json_object_set(body, "tools", (json_t *)req->tools) == 0;
  if (ok && o->temperature >= 0)
    ok = set_new(opts, "temperature", json_real(o->temperature));
  if (ok && o->max_tokens > 0)
    ok = set_new(opts, "num_predict", json_integer(o->max_tokens));
  if (ok && json_object_size(opts) > 0)
    ok = json_object_set(body, "options", opts) == 0;
  if (ok && o->extra_body != NULL)
    ok = json_object_update(body, (json_t *)o->extra_body) == 0;
  if (ok && (text = json_dumps(body, JSON_COMPACT)) != NULL) {
    *len = strlen(text);
    *rc = AG_OK;
  }
  json_decref(opts);
  json_decref(body);
  json_decref(parsed);
  return text;
}

/* ---- replies (the provider, the proxy's held replies) ------------------ */

/* One call of message.tool_calls into the next call slot (its id, or one
 * from its slot when it has none). */
static bool read_call(ag__asm *a, const json_t *tc) {
  const json_t *fn = json_object_get(tc, "function");
  size_t l;
  const char *name = ag__jstr(fn, "name", &l);
  if (name == NULL || l == 0)
    return ag__asm_bad(a, -1, "a tool call without a function name");
  ag__part_call *c = ag__asm_call(a, a->n_slots);
  if (c == NULL)
    return false;
  const char *id = ag__jstr(tc, "id", &l);
  char made[32];
  if (id == NULL || l == 0) {
    l = (size_t)snprintf(made, sizeof made, "ollama_call_%d", a->n_slots - 1);
    id = made;
  }
  if (!ag__asm_set(a, &c->id, id, l) ||
      !ag__asm_set(a, &c->name, name, strlen(name)))
    return false;
  const json_t *args = json_object_get(fn, "arguments");
  char *text = json_is_string(args) ? ag__strdup(json_string_value(args))
               : args != NULL ? json_dumps(args, JSON_COMPACT | JSON_ENCODE_ANY)
                              : ag__strdup("{}");
  bool ok = text != NULL && ag__asm_args(a, c, text, strlen(text));
  if (text == NULL)
    a->failed = AG_ENOMEM;
  free(text);
  return ok;
}

/* One reply object (whole, or a line of a stream). */
static bool read_chunk(ag__asm *a, const json_t *j) {
  if (!json_is_object(j))
    return ag__asm_bad(a, 0, "expected a JSON object");
  const json_t *err = json_object_get(j, "error");
  if (err != NULL && !json_is_null(err))
    return ag__asm_stream_error(a, err);
  const json_t *m = json_object_get(j, "message");
  size_t l, k;
  const char *t = ag__jstr(m, "content", &l);
  if (t != NULL && l > 0 && !ag__asm_text(a, t, l))
    return false;
  const json_t *tc;
  json_array_foreach(json_object_get(m, "tool_calls"), k, tc) {
    if (!read_call(a, tc))
      return false;
  }
  json_t *in = json_object_get(j, "prompt_eval_count");
  json_t *out = json_object_get(j, "eval_count");
  if (json_is_integer(in) || json_is_integer(out)) {
    a->has_usage = true;
    a->usage.prompt_tokens = json_is_integer(in) ? json_integer_value(in) : 0;
    a->usage.completion_tokens =
        json_is_integer(out) ? json_integer_value(out) : 0;
  }
  if (json_is_true(json_object_get(j, "done"))) {
    const char *why = ag__jstr(j, "done_reason", NULL);
    snprintf(a->finish_reason, sizeof(a->finish_reason), "%s",
             a->n_slots > 0                  ? "tool_calls"
             : why == NULL || why[0] == '\0' ? "stop"
             : strcmp(why, "load") == 0      ? "stop"
                                             : why);
    a->done = true;
  }
  return true;
}

static void ollama_response(ag__asm *a, const char *body, size_t len) {
  json_error_t je;
  json_t *j = json_loadb(body, len, 0, &je);
  if (j == NULL) {
    ag__asm_bad(a, (long)je.position, "not JSON (%s)", je.text);
    return;
  }
  if (read_chunk(a, j) && a->finish_reason[0] == '\0')
    snprintf(a->finish_reason, sizeof(a->finish_reason), "%s",
             a->n_slots > 0 ? "tool_calls" : "stop");
  json_decref(j);
}

/* One line of a stream (NDJSON; `event` is ""). */
static int ollama_event(ag__asm *a, const char *event, const char *data,
                        size_t len, size_t pos) {
  (void)event;
  json_error_t je;
  json_t *j = json_loadb(data, len, 0, &je);
  if (j == NULL) {
    ag__asm_bad(a, (long)(pos + (size_t)je.position),
                "a line of the stream is not JSON (%s)", je.text);
    return 1;
  }
  bool ok = read_chunk(a, j);
  json_decref(j);
  return ok ? 0 : 1;
}

/* ---- requests read as turns (the proxy, the audit) --------------------- */

/* The calls of the last assistant message: which are answered. */
typedef struct open_calls {
  const json_t *calls; /* its chat tool_calls, borrowed */
  bool answered[AG__CALLS_MAX];
} open_calls;

/* The id of the call a tool message answers: the one its tool_call_id
 * names, else the oldest unanswered one named tool_name, else the oldest
 * unanswered one (a tool_call_id that names no call, as a client that
 * dropped the call's id but writes OpenAI's field sends, included); NULL
 * when every call is answered. */
static const char *answered_id(const json_t *m, open_calls *oc) {
  const char *id = ag__jstr(m, "tool_call_id", NULL);
  const char *name = ag__jstr(m, "tool_name", NULL);
  for (int pass = 0; pass < 3; pass++) {
    size_t k;
    const json_t *tc;
    json_array_foreach(oc->calls, k, tc) {
      const char *cid = ag__jstr(tc, "id", NULL);
      const char *cname =
          ag__jstr(json_object_get(tc, "function"), "name", NULL);
      bool match = pass == 0   ? id != NULL && strcmp(cid, id) == 0
                   : pass == 1 ? !oc->answered[k] && name != NULL &&
                                     strcmp(cname, name) == 0
                               : !oc->answered[k];
      if (match) {
        oc->answered[k] = true;
        return cid;
      }
    }
  }
  return NULL;
}

/* An assistant message as Chat Completions': its calls with ids and their
 * arguments as JSON text. */
static json_t *assistant_chat(const json_t *m, size_t i, open_calls *oc,
                              char *emsg, size_t cap) {
  json_t *o = json_deep_copy(m), *calls = json_array();
  size_t k;
  const json_t *tc;
  bool ok = o != NULL && calls != NULL;
  json_array_foreach(json_object_get(m, "tool_calls"), k, tc) {
    const json_t *fn = json_object_get(tc, "function");
    const char *name = ag__jstr(fn, "name", NULL);
    if (!ok)
      break;
    if (name == NULL || json_array_size(calls) >= AG__CALLS_MAX) {
      snprintf(emsg, cap, "messages[%zu].tool_calls[%zu]: %s", i, k,
               name == NULL ? "expected a function \"name\""
                            : "too many calls");
      ok = false;
      break;
    }
    const char *id = ag__jstr(tc, "id", NULL);
    char made[64];
    if (id == NULL) {
      snprintf(made, sizeof made, "ollama_%zu_%zu", i, k);
      id = made;
    }
    const json_t *args = json_object_get(fn, "arguments");
    char *a = json_is_string(args) ? ag__strdup(json_string_value(args))
              : args != NULL ? json_dumps(args, JSON_COMPACT | JSON_ENCODE_ANY)
                             : ag__strdup("{}");
    ok = a != NULL && json_array_append_new(
                          calls, json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", id,
                                           "type", "function", "function",
                                           "name", name, "arguments", a)) == 0;
    free(a);
  }
  if (ok && json_array_size(calls) > 0)
    ok = json_object_set(o, "tool_calls", calls) == 0;
  else if (ok)
    json_object_del(o, "tool_calls"); /* absent is fine */
  json_decref(calls);
  if (!ok) {
    json_decref(o);
    return NULL;
  }
  json_object_del(o, "thinking");
  json_object_del(o, "images");
  memset(oc, 0, sizeof *oc);
  oc->calls = json_object_get(o, "tool_calls");
  return o;
}

/*
 * Ollama messages as Chat Completions messages (ag__wire.to_chat): every
 * message checked (an object with a string role), an assistant's calls
 * given ids and their arguments as text, a tool message the id of the call
 * it answers. `from` is not used: the whole list is converted (SIZE_MAX:
 * checked only).
 */
static json_t *ollama_to_chat(const json_t *messages, size_t from, char *emsg,
                              size_t cap) {
  emsg[0] = '\0';
  if (!json_is_array(messages)) {
    snprintf(emsg, cap, "messages: expected an array");
    return NULL;
  }
  json_t *out = json_array();
  open_calls oc;
  memset(&oc, 0, sizeof oc);
  size_t i;
  const json_t *m;
  json_array_foreach(messages, i, m) {
    if (out == NULL)
      return NULL;
    const char *role = ag__jstr(m, "role", NULL);
    if (!json_is_object(m) || role == NULL) {
      snprintf(emsg, cap, "messages[%zu]: expected an object with a \"role\"",
               i);
      goto bad;
    }
    json_t *c = NULL;
    if (strcmp(role, "assistant") == 0) {
      c = assistant_chat(m, i, &oc, emsg, cap);
    } else if (strcmp(role, "tool") == 0) {
      const char *id = answered_id(m, &oc);
      const json_t *content = json_object_get(m, "content");
      if (id == NULL) /* a result with no call left to answer: as Ollama, */
        continue;     /* which does not pair them, it is not read */
      /* a result that is not text is read as its JSON */
      char *d = json_is_string(content) || content == NULL
                    ? NULL
                    : json_dumps(content, JSON_COMPACT | JSON_ENCODE_ANY);
      c = json_is_string(content)
              ? json_pack("{s:s, s:s, s:O}", "role", "tool", "tool_call_id", id,
                          "content", content)
              : json_pack("{s:s, s:s, s:s}", "role", "tool", "tool_call_id", id,
                          "content", d != NULL ? d : "");
      free(d);
    } else {
      c = json_deep_copy(m);
      json_object_del(c, "images");
      if (strcmp(role, "user") == 0)
        memset(&oc, 0, sizeof oc);
    }
    if (c == NULL || json_array_append_new(out, c) != 0)
      goto bad;
  }
  if (from == SIZE_MAX) {
    json_decref(out);
    out = json_array();
  }
  return out;
bad:
  json_decref(out);
  return NULL;
}

/* ---- the proxy --------------------------------------------------------- */

/* Ollama's /api/chat, under any prefix (Open WebUI's /ollama/api/chat). */
static bool ollama_serves(const char *path) {
  return ag__wire_path_ends(path, "/api/chat");
}

static ag__reply_form ollama_reply_form(const char *path, const char *query,
                                        const json_t *req) {
  (void)path;
  (void)query;
  return json_is_false(json_object_get(req, "stream")) ? AG__REPLY_WHOLE
                                                       : AG__REPLY_NDJSON;
}

/* A reply object: `text` and done (with `done`). */
static char *reply_line(const char *model, const char *text, bool done,
                        const char *at) {
  json_t *o = json_pack("{s:s, s:s, s:{s:s, s:s}, s:b}", "model", model,
                        "created_at", at, "message", "role", "assistant",
                        "content", text, "done", done);
  if (o != NULL && done &&
      (!set_new(o, "done_reason", json_string("stop")) ||
       !set_new(o, "prompt_eval_count", json_integer(0)) ||
       !set_new(o, "eval_count", json_integer(0)))) {
    json_decref(o);
    o = NULL;
  }
  char *j = o != NULL ? json_dumps(o, JSON_COMPACT) : NULL;
  json_decref(o);
  return j;
}

static char *ollama_stop_body(ag__reply_form form, const char *id,
                              const char *model, const char *text,
                              long long created, size_t *len) {
  (void)id;
  char at[32];
  time_t t = (time_t)created;
  struct tm tm;
  if (gmtime_r(&t, &tm) == NULL ||
      strftime(at, sizeof at, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0)
    snprintf(at, sizeof at, "1970-01-01T00:00:00Z");
  if (form != AG__REPLY_NDJSON) {
    char *j = reply_line(model, text, true, at);
    if (j != NULL)
      *len = strlen(j);
    return j;
  }
  char *a = reply_line(model, text, false, at);
  char *b = reply_line(model, "", true, at);
  char *out = a != NULL && b != NULL ? malloc(strlen(a) + strlen(b) + 3) : NULL;
  if (out != NULL)
    *len = (size_t)sprintf(out, "%s\n%s\n", a, b);
  free(a);
  free(b);
  return out;
}

static bool ollama_add_user_text(json_t *req, const char *text) {
  json_t *messages = json_object_get(req, "messages");
  return json_is_array(messages) &&
         json_array_append_new(messages, json_pack("{s:s, s:s}", "role", "user",
                                                   "content", text)) == 0;
}

/* Ollama's error shape: {"error": "text"}; the code joins the text. */
static json_t *ollama_error_body(unsigned status, const char *type,
                                 const char *code, const char *msg) {
  (void)status;
  (void)type;
  char full[1024];
  snprintf(full, sizeof full, "%s [%s]", msg, code);
  return json_pack("{s:s}", "error", full);
}

const ag__wire ag__wire_ollama = {
    .name = "ollama",
    .api = "Ollama chat",
    .path = "/api/chat",
    .base_url = "http://localhost:11434",
    .suffix = "/api/chat",
    .key_env = "OLLAMA_API_KEY",
    .key_header = "Authorization: Bearer ",
    .extra_header = NULL,
    .end_marker = "\"done\":true",
    .request = ollama_request,
    .response = ollama_response,
    .event = ollama_event,
    .to_chat = ollama_to_chat,
    .conv_key = "messages",
    .serves = ollama_serves,
    .error_body = ollama_error_body,
    .reply_form = ollama_reply_form,
    .stop_body = ollama_stop_body,
    .add_user_text = ollama_add_user_text,
    .id_prefix = "ollama_agentguard_",
    .conv_expect = "an array",
    .otel_provider = "ollama",
    .otel_operation = "chat",
};
