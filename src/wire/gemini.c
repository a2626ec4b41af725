/*
 * src/wire/gemini.c - the Gemini API's shape (POST
 * /v1beta/models/{model}:generateContent and :streamGenerateContent: what
 * Gemini CLI and the google-genai clients speak), for the HTTP provider
 * (`provider.kind` "gemini") and the proxy.
 *
 * Request. The conversation is `contents`: {"role": "user" | "model",
 * "parts": [...]}, a part being {"text"}, {"functionCall": {"id", "name",
 * "args"}} (args an object) or {"functionResponse": {"id", "name",
 * "response"}} (an object: Gemini CLI sends {"output": text} or
 * {"error": text}). System text is `systemInstruction`, tools are
 * `tools[].functionDeclarations`. The model and the stream are in the
 * path, not the body (":streamGenerateContent?alt=sse" streams as
 * server-sent events; without alt=sse the chunks come as one JSON array).
 *
 * Reply. A GenerateContentResponse: candidates[0].content.parts (text,
 * thought text - left out -, functionCall), its finishReason ("STOP" also
 * for calls, "MAX_TOKENS", "SAFETY", ...) and usageMetadata. A stream is
 * a sequence of whole responses, each with its new parts; calls arrive
 * whole, and the last chunk has the finishReason.
 *
 * Read as turns (the proxy, the audit): a model content's text is the
 * assistant's text and its calls are its tool calls (a call without an id
 * gets one from its place: "gemini_<content>_<part>", so that every reader
 * names it alike); a functionResponse answers the call it names by id, or
 * else the oldest unanswered call of that name, and is an error when its
 * response holds an "error"; user text is the user's.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wire.h"

static bool set_new(json_t *o, const char *key, json_t *v) {
  return v != NULL && json_object_set_new(o, key, v) == 0;
}

/* ---- requests (the provider) ------------------------------------------- */

/* A chat message's content as text. */
static json_t *content_text(const json_t *content) {
  if (content == NULL || json_is_null(content))
    return json_string("");
  return ag__blocks_text(content);
}

/* A call's arguments (JSON text) as the object functionCall.args wants:
 * the object itself, or anything else wrapped as {"input": value}. */
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

/* The content to add parts of `role` to: the last one when it has that
 * role, else a new one. NULL when out of memory. */
static json_t *content_for(json_t *contents, const char *role) {
  json_t *last = json_array_get(contents, json_array_size(contents) - 1);
  const char *r = ag__jstr(last, "role", NULL);
  if (r != NULL && strcmp(r, role) == 0)
    return json_object_get(last, "parts");
  json_t *c = json_pack("{s:s, s:[]}", "role", role, "parts");
  if (c == NULL || json_array_append_new(contents, c) != 0)
    return NULL;
  return json_object_get(c, "parts");
}

/* The model's calls of one assistant message as functionCall parts. */
static bool call_parts(const json_t *m, size_t i, json_t *parts, char *msg,
                       size_t cap) {
  size_t k;
  const json_t *tc;
  json_array_foreach(json_object_get(m, "tool_calls"), k, tc) {
    const json_t *fn = json_object_get(tc, "function");
    const char *name = ag__jstr(fn, "name", NULL);
    if (name == NULL) {
      snprintf(msg, cap, "messages[%zu].tool_calls[%zu]: no function name", i,
               k);
      return false;
    }
    json_t *fc = json_pack("{s:s, s:o}", "name", name, "args",
                           call_args(ag__jstr(fn, "arguments", NULL)));
    const char *id = ag__jstr(tc, "id", NULL);
    if (fc == NULL || (id != NULL && !set_new(fc, "id", json_string(id))) ||
        json_array_append_new(parts, json_pack("{s:o}", "functionCall", fc)) !=
            0) {
      json_decref(fc);
      return false;
    }
  }
  return true;
}

/* One chat message into `contents` (system text into *system). */
static bool message_content(const json_t *messages, size_t i, json_t *contents,
                            json_t *system, char *msg, size_t cap) {
  const json_t *m = json_array_get(messages, i);
  const char *role = ag__jstr(m, "role", NULL);
  if (role == NULL) {
    snprintf(msg, cap, "messages[%zu].role: expected a string", i);
    return false;
  }
  json_t *text = content_text(json_object_get(m, "content"));
  if (text == NULL)
    return false;
  bool ok = true;
  if (strcmp(role, "system") == 0 || strcmp(role, "developer") == 0) {
    ok = json_array_append_new(system, json_pack("{s:o}", "text", text)) == 0;
  } else if (strcmp(role, "tool") == 0) {
    const char *id = ag__jstr(m, "tool_call_id", NULL);
    const char *name = call_name(messages, i, id);
    json_t *fr =
        json_pack("{s:s, s:{s:o}}", "name", name != NULL ? name : "tool",
                  "response", "output", text);
    json_t *parts = content_for(contents, "user");
    ok = fr != NULL && parts != NULL &&
         (id == NULL || set_new(fr, "id", json_string(id))) &&
         json_array_append_new(parts,
                               json_pack("{s:O}", "functionResponse", fr)) == 0;
    json_decref(fr);
  } else {
    bool model = strcmp(role, "assistant") == 0;
    json_t *parts = content_for(contents, model ? "model" : "user");
    ok =
        parts != NULL &&
        (json_string_length(text) == 0 ||
         json_array_append_new(parts, json_pack("{s:O}", "text", text)) == 0) &&
        (!model || call_parts(m, i, parts, msg, cap));
    json_decref(text);
  }
  return ok;
}

/* Chat tools as one {"functionDeclarations": [...]} tool; the parameters
 * as JSON Schema (parametersJsonSchema takes it whole). */
static json_t *declarations(const json_t *tools) {
  json_t *decls = json_array();
  size_t i;
  const json_t *t;
  json_array_foreach(tools, i, t) {
    const json_t *fn = json_object_get(t, "function");
    json_t *d =
        json_pack("{s:O?, s:O?, s:O?}", "name", json_object_get(fn, "name"),
                  "description", json_object_get(fn, "description"),
                  "parametersJsonSchema", json_object_get(fn, "parameters"));
    if (decls == NULL || d == NULL || json_array_append_new(decls, d) != 0) {
      json_decref(d);
      json_decref(decls);
      return NULL;
    }
  }
  return json_pack("[{s:o}]", "functionDeclarations", decls);
}

static char *gemini_request(const ag__wire_opts *o, const ag_request *req,
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
  json_t *body = json_object(), *contents = json_array(),
         *system = json_array(), *gen = json_object();
  char *text = NULL;
  bool ok = body != NULL && contents != NULL && system != NULL && gen != NULL;
  for (size_t i = 0; ok && i < json_array_size(messages); i++) {
    if (!message_content(messages, i, contents, system, msg, cap)) {
      ok = false;
      if (msg[0] != '\0')
        *rc = AG_EINVAL;
    }
  }
  ok = ok && json_object_set(body, "contents", contents) == 0;
  if (ok && json_array_size(system) > 0)
    ok =
        set_new(body, "systemInstruction", json_pack("{s:O}", "parts", system));
  if (ok && json_is_array(req->tools) && json_array_size(req->tools) > 0)
    ok = set_new(body, "tools", declarations(req->tools));
  if (ok && o->temperature >= 0)
    ok = set_new(gen, "temperature", json_real(o->temperature));
  if (ok && o->max_tokens > 0)
    ok = set_new(gen, "maxOutputTokens", json_integer(o->max_tokens));
  if (ok && json_object_size(gen) > 0)
    ok = json_object_set(body, "generationConfig", gen) == 0;
  if (ok && o->extra_body != NULL)
    ok = json_object_update(body, (json_t *)o->extra_body) == 0;
  if (ok && (text = json_dumps(body, JSON_COMPACT)) != NULL) {
    *len = strlen(text);
    *rc = AG_OK;
  }
  json_decref(gen);
  json_decref(system);
  json_decref(contents);
  json_decref(body);
  json_decref(parsed);
  return text;
}

/* The path after the base URL: the model and the method ("streamGenerate
 * Content?alt=sse" when streamed); false when the model's name has a
 * character a path segment cannot hold as it is. */
static bool gemini_url_path(const char *model, bool stream, char *buf,
                            size_t cap) {
  const char *m = strncmp(model, "models/", 7) == 0 ? model + 7 : model;
  if (m[0] == '\0')
    return false;
  for (const char *c = m; *c != '\0'; c++)
    if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
          (*c >= '0' && *c <= '9') || *c == '-' || *c == '.' || *c == '_'))
      return false;
  int n =
      snprintf(buf, cap, "/models/%s:%s", m,
               stream ? "streamGenerateContent?alt=sse" : "generateContent");
  return n > 0 && (size_t)n < cap;
}

/* ---- replies (the provider) -------------------------------------------- */

static void read_usage(ag__asm *a, const json_t *u) {
  json_t *in = json_object_get(u, "promptTokenCount");
  json_t *out = json_object_get(u, "candidatesTokenCount");
  if (!json_is_integer(in) && !json_is_integer(out))
    return;
  a->has_usage = true;
  a->usage.prompt_tokens = json_is_integer(in) ? json_integer_value(in) : 0;
  a->usage.completion_tokens =
      json_is_integer(out) ? json_integer_value(out) : 0;
  json_t *cached = json_object_get(u, "cachedContentTokenCount");
  a->usage.cached_tokens =
      json_is_integer(cached) ? json_integer_value(cached) : 0;
}

/* A functionCall part into the next call slot (its id, or one from its
 * slot when it has none). */
static bool read_call(ag__asm *a, const json_t *fc) {
  ag__part_call *c = ag__asm_call(a, a->n_slots);
  if (c == NULL)
    return false;
  size_t l;
  const char *name = ag__jstr(fc, "name", &l);
  if (name == NULL || l == 0)
    return ag__asm_bad(a, -1, "a functionCall without a name");
  const char *id = ag__jstr(fc, "id", &l);
  char made[32];
  if (id == NULL || l == 0) {
    l = (size_t)snprintf(made, sizeof made, "gemini_call_%d", a->n_slots - 1);
    id = made;
  }
  if (!ag__asm_set(a, &c->id, id, l) ||
      !ag__asm_set(a, &c->name, name, strlen(name)))
    return false;
  const json_t *args = json_object_get(fc, "args");
  char *text = args != NULL ? json_dumps(args, JSON_COMPACT | JSON_ENCODE_ANY)
                            : ag__strdup("{}");
  bool ok = text != NULL && ag__asm_args(a, c, text, strlen(text));
  if (text == NULL)
    a->failed = AG_ENOMEM;
  free(text);
  return ok;
}

/* One GenerateContentResponse (whole, or a chunk of a stream). */
static bool read_chunk(ag__asm *a, const json_t *j) {
  const json_t *err = json_object_get(j, "error");
  if (!json_is_object(j))
    return ag__asm_bad(a, 0, "expected a JSON object");
  if (err != NULL && !json_is_null(err))
    return ag__asm_stream_error(a, err);
  read_usage(a, json_object_get(j, "usageMetadata"));
  const json_t *cand = json_array_get(json_object_get(j, "candidates"), 0);
  const char *block =
      ag__jstr(json_object_get(j, "promptFeedback"), "blockReason", NULL);
  if (cand == NULL && block != NULL) {
    snprintf(a->finish_reason, sizeof(a->finish_reason), "content_filter");
    return ag__asm_refusal(a, block, strlen(block));
  }
  size_t k, l;
  const json_t *part;
  json_array_foreach(json_object_get(json_object_get(cand, "content"), "parts"),
                     k, part) {
    const char *t = ag__jstr(part, "text", &l);
    const json_t *fc = json_object_get(part, "functionCall");
    if (t != NULL && !json_is_true(json_object_get(part, "thought")) &&
        !ag__asm_text(a, t, l))
      return false;
    if (json_is_object(fc) && !read_call(a, fc))
      return false;
  }
  const char *fr = ag__jstr(cand, "finishReason", NULL);
  if (fr != NULL && strcmp(fr, "FINISH_REASON_UNSPECIFIED") != 0) {
    bool any_call = a->n_slots > 0;
    const char *why = any_call                        ? "tool_calls"
                      : strcmp(fr, "STOP") == 0       ? "stop"
                      : strcmp(fr, "MAX_TOKENS") == 0 ? "length"
                                                      : fr;
    snprintf(a->finish_reason, sizeof(a->finish_reason), "%s", why);
    a->done = true;
  }
  return true;
}

static void gemini_response(ag__asm *a, const char *body, size_t len) {
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

static int gemini_event(ag__asm *a, const char *event, const char *data,
                        size_t len, size_t pos) {
  json_error_t je;
  json_t *j = json_loadb(data, len, 0, &je);
  if (j == NULL) {
    size_t at = pos + (event[0] != '\0' ? strlen(event) + 8 : 0) + 6;
    ag__asm_bad(a, (long)(at + (size_t)je.position),
                "a stream event is not JSON (%s)", je.text);
    return 1;
  }
  bool ok = read_chunk(a, j);
  json_decref(j);
  return ok ? 0 : 1;
}

/* ---- requests read as turns (the proxy, the audit) --------------------- */

/* The unanswered calls of the last model content: their ids, names and
 * whether answered, for functionResponses that name no id. */
typedef struct open_calls {
  json_t *calls; /* the assistant message's tool_calls, borrowed */
  bool answered[AG__CALLS_MAX];
} open_calls;

/* A model content as one assistant message: text parts joined (thoughts
 * left out), each functionCall a tool call. */
static bool model_content(const json_t *parts, size_t i, json_t *out,
                          open_calls *oc, char *emsg, size_t cap) {
  json_t *calls = json_array();
  char *acc = NULL;
  size_t len = 0, k;
  const json_t *p;
  bool ok = calls != NULL;
  json_array_foreach(parts, k, p) {
    size_t l;
    const char *t = ag__jstr(p, "text", &l);
    const json_t *fc = json_object_get(p, "functionCall");
    if (ok && t != NULL && !json_is_true(json_object_get(p, "thought"))) {
      char *g = realloc(acc, len + l + 2);
      ok = g != NULL;
      if (ok) {
        acc = g;
        if (len > 0)
          acc[len++] = '\n';
        memcpy(acc + len, t, l);
        len += l;
      }
    }
    if (!ok || fc == NULL)
      continue;
    const char *name = ag__jstr(fc, "name", NULL);
    if (name == NULL || json_array_size(calls) >= AG__CALLS_MAX) {
      snprintf(emsg, cap, "contents[%zu].parts[%zu].functionCall: %s", i, k,
               name == NULL ? "expected a \"name\"" : "too many calls");
      ok = false;
      continue;
    }
    const char *id = ag__jstr(fc, "id", NULL);
    char made[64];
    if (id == NULL) {
      snprintf(made, sizeof made, "gemini_%zu_%zu", i, k);
      id = made;
    }
    const json_t *args = json_object_get(fc, "args");
    char *a = args != NULL ? json_dumps(args, JSON_COMPACT | JSON_ENCODE_ANY)
                           : ag__strdup("{}");
    ok = a != NULL && json_array_append_new(
                          calls, json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", id,
                                           "type", "function", "function",
                                           "name", name, "arguments", a)) == 0;
    free(a);
  }
  json_t *m = ok ? json_pack("{s:s, s:s%}", "role", "assistant", "content",
                             acc != NULL ? acc : "", len)
                 : NULL;
  free(acc);
  if (m != NULL && json_array_size(calls) > 0)
    ok = json_object_set(m, "tool_calls", calls) == 0;
  ok = ok && m != NULL && json_array_append(out, m) == 0;
  memset(oc, 0, sizeof *oc);
  oc->calls = json_object_get(m, "tool_calls");
  json_decref(m);
  json_decref(calls);
  return ok;
}

/* The id of the call a functionResponse answers: its own, else the oldest
 * unanswered call of its name, else its name. */
static const char *answered_id(const json_t *fr, open_calls *oc) {
  const char *id = ag__jstr(fr, "id", NULL);
  const char *name = ag__jstr(fr, "name", NULL);
  size_t k;
  const json_t *tc;
  json_array_foreach(oc->calls, k, tc) {
    const char *cid = ag__jstr(tc, "id", NULL);
    const char *cname = ag__jstr(json_object_get(tc, "function"), "name", NULL);
    bool match = id != NULL ? strcmp(cid, id) == 0
                            : !oc->answered[k] && name != NULL &&
                                  strcmp(cname, name) == 0;
    if (match) {
      oc->answered[k] = true;
      return cid;
    }
  }
  return id != NULL ? id : name;
}

/* A functionResponse as a tool message: its output (a string as it is,
 * else the response's JSON), an error when the response has "error". */
static bool function_response(const json_t *fr, size_t i, size_t k, json_t *out,
                              open_calls *oc, char *emsg, size_t cap) {
  const char *id = answered_id(fr, oc);
  if (id == NULL) {
    snprintf(emsg, cap,
             "contents[%zu].parts[%zu].functionResponse: expected an \"id\" "
             "or a \"name\"",
             i, k);
    return false;
  }
  const json_t *resp = json_object_get(fr, "response");
  const json_t *error = json_object_get(resp, "error");
  const json_t *output = json_object_get(resp, "output");
  bool failed = error != NULL && !json_is_null(error) && !json_is_false(error);
  const json_t *shown = json_is_string(error)               ? error
                        : json_is_string(output) && !failed ? output
                                                            : NULL;
  json_t *text = shown != NULL ? json_incref((json_t *)shown) : NULL;
  if (text == NULL) {
    char *d = resp != NULL ? json_dumps(resp, JSON_COMPACT | JSON_ENCODE_ANY)
                           : ag__strdup("{}");
    text = d != NULL ? json_string(d) : NULL;
    free(d);
  }
  json_t *m = text != NULL ? json_pack("{s:s, s:s, s:o, s:b}", "role", "tool",
                                       "tool_call_id", id, "content", text,
                                       "is_error", failed)
                           : NULL;
  return m != NULL && json_array_append_new(out, m) == 0;
}

/* A user content: its functionResponses as tool messages, then its text
 * (if any) as one user message. */
static bool user_content(const json_t *parts, size_t i, json_t *out,
                         open_calls *oc, char *emsg, size_t cap) {
  size_t k;
  const json_t *p;
  bool any_text = false;
  json_array_foreach(parts, k, p) {
    const json_t *fr = json_object_get(p, "functionResponse");
    if (json_is_object(fr) && !function_response(fr, i, k, out, oc, emsg, cap))
      return false;
    any_text = any_text || ag__jstr(p, "text", NULL) != NULL;
  }
  if (!any_text)
    return true;
  json_t *text = ag__blocks_text(parts);
  json_t *m = text != NULL
                  ? json_pack("{s:s, s:o}", "role", "user", "content", text)
                  : NULL;
  memset(oc, 0, sizeof *oc);
  return m != NULL && json_array_append_new(out, m) == 0;
}

/*
 * Gemini contents as Chat Completions messages (ag__wire.to_chat): every
 * content checked (an object with an array of parts), a model content an
 * assistant message, a user (or function) content its tool messages and
 * its text. `from` is not used: the whole list is converted (SIZE_MAX:
 * checked only).
 */
static json_t *gemini_to_chat(const json_t *contents, size_t from, char *emsg,
                              size_t cap) {
  emsg[0] = '\0';
  if (!json_is_array(contents)) {
    snprintf(emsg, cap, "contents: expected an array");
    return NULL;
  }
  json_t *out = json_array();
  open_calls oc;
  memset(&oc, 0, sizeof oc);
  size_t i;
  const json_t *c;
  json_array_foreach(contents, i, c) {
    if (out == NULL)
      return NULL;
    const json_t *parts = json_object_get(c, "parts");
    const char *role = ag__jstr(c, "role", NULL);
    if (!json_is_object(c) || !json_is_array(parts)) {
      snprintf(emsg, cap, "contents[%zu]: expected an object with \"parts\"",
               i);
      goto bad;
    }
    bool ok = role != NULL && strcmp(role, "model") == 0
                  ? model_content(parts, i, out, &oc, emsg, cap)
                  : user_content(parts, i, out, &oc, emsg, cap);
    if (!ok)
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

/* Whether a list is Gemini contents: a part with a functionCall or a
 * functionResponse. */
static bool gemini_looks_like(const json_t *contents) {
  size_t i, k;
  const json_t *c, *p;
  json_array_foreach(contents, i, c) {
    json_array_foreach(json_object_get(c, "parts"), k, p) {
      if (json_object_get(p, "functionCall") != NULL ||
          json_object_get(p, "functionResponse") != NULL)
        return true;
    }
  }
  return false;
}

/* ---- the proxy --------------------------------------------------------- */

/* The Gemini API's /v1beta/models/{model}:... (and tunedModels/{model}),
 * Vertex AI's /v1/projects/{p}/locations/{l}/publishers/google/models/
 * {model}:... (and endpoints/{id}, a tuned model's), any under a gateway's
 * prefix (ag__wire_model_method). */
static bool gemini_serves(const char *path) {
  const char *m = ag__wire_model_method(path, NULL);
  return m != NULL && (ag__wire_path_is(m, "generateContent") ||
                       ag__wire_path_is(m, "streamGenerateContent"));
}

static ag__reply_form gemini_reply_form(const char *path, const char *query,
                                        const json_t *req) {
  (void)req;
  const char *m = ag__wire_model_method(path, NULL);
  if (m == NULL || !ag__wire_path_is(m, "streamGenerateContent"))
    return AG__REPLY_WHOLE;
  for (const char *q = query; q != NULL && *q != '\0';) {
    size_t n = strcspn(q, "&");
    if (n == 7 && strncmp(q, "alt=sse", 7) == 0)
      return AG__REPLY_SSE;
    q += n + (q[n] == '&');
  }
  return AG__REPLY_JSON_ARRAY;
}

static char *gemini_stop_body(ag__reply_form form, const char *id,
                              const char *model, const char *text,
                              long long created, size_t *len) {
  (void)created;
  json_t *o = json_pack(
      "{s:[{s:{s:s, s:[{s:s}]}, s:s, s:i}], s:{s:i, s:i, s:i}, s:s, s:s}",
      "candidates", "content", "role", "model", "parts", "text", text,
      "finishReason", "STOP", "index", 0, "usageMetadata", "promptTokenCount",
      0, "candidatesTokenCount", 0, "totalTokenCount", 0, "modelVersion", model,
      "responseId", id);
  char *j = o != NULL ? json_dumps(o, JSON_COMPACT) : NULL;
  json_decref(o);
  if (j == NULL)
    return NULL;
  size_t n = strlen(j);
  const char *pre = form == AG__REPLY_SSE          ? "data: "
                    : form == AG__REPLY_JSON_ARRAY ? "["
                                                   : "";
  const char *post = form == AG__REPLY_SSE          ? "\r\n\r\n"
                     : form == AG__REPLY_JSON_ARRAY ? "]"
                                                    : "";
  char *out = malloc(strlen(pre) + n + strlen(post) + 1);
  if (out != NULL) {
    *len = (size_t)sprintf(out, "%s%s%s", pre, j, post);
  }
  free(j);
  return out;
}

/* The text as a part of the last content when it is the user's (beside
 * its functionResponses, as Gemini CLI sends them), else a new user
 * content. */
static bool gemini_add_user_text(json_t *req, const char *text) {
  json_t *contents = json_object_get(req, "contents");
  if (!json_is_array(contents))
    return false;
  json_t *last = json_array_get(contents, json_array_size(contents) - 1);
  const char *role = ag__jstr(last, "role", NULL);
  json_t *parts = json_object_get(last, "parts");
  json_t *part = json_pack("{s:s}", "text", text);
  if (role != NULL && strcmp(role, "user") == 0 && json_is_array(parts))
    return json_array_append_new(parts, part) == 0;
  return json_array_append_new(contents, json_pack("{s:s, s:[o]}", "role",
                                                   "user", "parts", part)) == 0;
}

/* Google's error shape: {"error": {"code", "message", "status"}}. */
static json_t *gemini_error_body(unsigned status, const char *type,
                                 const char *code, const char *msg) {
  (void)type;
  const char *st = status == 401   ? "UNAUTHENTICATED"
                   : status == 403 ? "PERMISSION_DENIED"
                   : status == 404 ? "NOT_FOUND"
                   : status == 429 ? "RESOURCE_EXHAUSTED"
                   : status == 503 ? "UNAVAILABLE"
                   : status == 504 ? "DEADLINE_EXCEEDED"
                   : status < 500  ? "INVALID_ARGUMENT"
                                   : "INTERNAL";
  char full[1024];
  snprintf(full, sizeof full, "%s [%s]", msg, code);
  return json_pack("{s:{s:i, s:s, s:s}}", "error", "code", (int)status,
                   "message", full, "status", st);
}

const ag__wire ag__wire_gemini = {
    .name = "gemini",
    .api = "Gemini",
    .path = "/v1beta/models/{model}:generateContent",
    .base_url = "https://generativelanguage.googleapis.com/v1beta",
    .suffix = NULL, /* url_path: the model is in the path */
    .key_env = "GEMINI_API_KEY",
    .key_header = "x-goog-api-key: ",
    .extra_header = NULL,
    .end_marker = "finishReason",
    .request = gemini_request,
    .response = gemini_response,
    .event = gemini_event,
    .url_path = gemini_url_path,
    .to_chat = gemini_to_chat,
    .looks_like = gemini_looks_like,
    .conv_key = "contents",
    .serves = gemini_serves,
    .error_body = gemini_error_body,
    .reply_form = gemini_reply_form,
    .stop_body = gemini_stop_body,
    .add_user_text = gemini_add_user_text,
    .id_prefix = "gen_agentguard_",
    .conv_expect = "an array",
    .otel_provider = "gcp.gemini",
    .otel_operation = "generate_content",
    .route_prefix = "/v1beta/",
};
