/*
 * src/wire/chat.c - the Chat Completions shape (OpenAI and the
 * servers that speak it: Azure OpenAI, Ollama, vLLM, llama.cpp's server,
 * LM Studio, OpenRouter, Groq, DeepSeek, ...).
 *
 * The loop's history is already Chat Completions messages, kept as compact
 * JSON text, so the request body is that text spliced as it is into the
 * small object of options (see ag__openai_request); a request that carries
 * only a tree (a caller of ag_provider_complete) is written by jansson.
 * (The proxy sends its client's body as it came, or rewritten with
 * jansson: it never builds a request here.) A reply is read into the
 * shared assembler (reply.c): text, refusal, tool calls by
 * index, finish reason and usage. Streamed chunks carry the same parts as
 * fragments; tool call fragments are joined by their `index`, a call's id
 * and name come in its first fragment.
 *
 * Rejected: `max_completion_tokens` (OpenAI's newer name) in place of
 * `max_tokens`: most compatible servers know only the older name, and
 * OpenAI still accepts it for chat models; a user who needs the new one
 * sets it through extra_body.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wire.h"

static bool set_new(json_t *o, const char *k, json_t *v) {
  return v != NULL && json_object_set_new(o, k, v) == 0;
}

/* Appends `,"key":<v, vl bytes of JSON text>` to *buf. */
static bool splice_text(char **buf, size_t *len, const char *key, const char *v,
                        size_t vl) {
  size_t kl = strlen(key);
  char *g = realloc(*buf, *len + kl + vl + 5);
  if (g == NULL)
    return false;
  *buf = g;
  g[(*len)++] = ',';
  g[(*len)++] = '"';
  memcpy(g + *len, key, kl);
  *len += kl;
  g[(*len)++] = '"';
  g[(*len)++] = ':';
  memcpy(g + *len, v, vl);
  *len += vl;
  g[*len] = '\0';
  return true;
}

/* Appends `,"key":<value as compact JSON>` to *buf. */
static bool splice(char **buf, size_t *len, const char *key,
                   const json_t *value) {
  char *v = json_dumps(value, JSON_COMPACT);
  if (v == NULL)
    return false;
  bool ok = splice_text(buf, len, key, v, strlen(v));
  free(v);
  return ok;
}

/* The messages as text: ag_request.messages_json when set (the agent
 * loop's history, spliced as it is), else NULL. */
static bool messages_text(const ag_request *req) {
  return req->messages_json != NULL && req->messages_json_len >= 2 &&
         req->messages_json[0] == '[' &&
         req->messages_json[req->messages_json_len - 1] == ']';
}

/*
 * The body is our small object (model, stream, options, extra_body) written
 * by jansson, then the caller's messages (their text when the request has
 * it, else the tree written by jansson) and tools written by jansson, spliced
 * in before the closing brace: they are borrowed, and setting them into our
 * object would change their reference counts, which is not safe when the caller
 * shares them between threads (ThreadSanitizer sees jansson's json_incref read
 * the count without an atomic).
 */
char *ag__openai_request(const ag__wire_opts *o, const ag_request *req,
                         size_t *len, ag_err_t *rc, char *msg, size_t cap) {
  *rc = AG_ENOMEM;
  bool as_text = messages_text(req);
  if (!as_text && !json_is_array(req->messages)) {
    *rc = AG_EINVAL;
    snprintf(msg, cap, "messages: expected an array (or its JSON text)");
    return NULL;
  }
  json_t *body = json_object();
  if (body == NULL)
    return NULL;
  bool tools = json_is_array(req->tools) && json_array_size(req->tools) > 0;
  bool ok = set_new(body, "model", json_string(o->model)) &&
            set_new(body, "stream", json_boolean(o->stream));
  if (ok && o->stream)
    ok =
        set_new(body, "stream_options", json_pack("{s:b}", "include_usage", 1));
  if (ok && tools) {
    ok = set_new(body, "tool_choice", json_string("auto")) &&
         set_new(body, "parallel_tool_calls",
                 json_boolean(o->parallel_tool_calls));
  }
  if (ok && o->temperature >= 0)
    ok = set_new(body, "temperature", json_real(o->temperature));
  if (ok && o->max_tokens > 0)
    ok = set_new(body, "max_tokens", json_integer(o->max_tokens));
  if (ok && o->extra_body != NULL)
    ok = json_object_update(body, (json_t *)o->extra_body) == 0;
  /* extra_body's keys win, "messages" and "tools" included. */
  bool own_messages = json_object_get(body, "messages") == NULL;
  bool own_tools = tools && json_object_get(body, "tools") == NULL;
  char *text = ok ? json_dumps(body, JSON_COMPACT) : NULL;
  json_decref(body);
  if (text == NULL)
    return NULL;
  size_t n = strlen(text) - 1; /* drop the closing brace */
  text[n] = '\0';
  bool spliced =
      !own_messages ||
      (as_text ? splice_text(&text, &n, "messages", req->messages_json,
                             req->messages_json_len)
               : splice(&text, &n, "messages", req->messages));
  if (!spliced || (own_tools && !splice(&text, &n, "tools", req->tools))) {
    free(text);
    return NULL;
  }
  char *g = realloc(text, n + 2);
  if (g == NULL) {
    free(text);
    return NULL;
  }
  g[n++] = '}';
  g[n] = '\0';
  *len = n;
  *rc = AG_OK;
  return g;
}

static void read_usage(ag__asm *a, const json_t *u) {
  if (!json_is_object(u))
    return;
  json_t *pt = json_object_get(u, "prompt_tokens");
  json_t *ct = json_object_get(u, "completion_tokens");
  if (!json_is_integer(pt) && !json_is_integer(ct))
    return;
  a->has_usage = true;
  a->usage.prompt_tokens = json_is_integer(pt) ? json_integer_value(pt) : 0;
  a->usage.completion_tokens = json_is_integer(ct) ? json_integer_value(ct) : 0;
  json_t *cached = json_object_get(json_object_get(u, "prompt_tokens_details"),
                                   "cached_tokens");
  a->usage.cached_tokens =
      json_is_integer(cached) ? json_integer_value(cached) : 0;
}

static void read_finish(ag__asm *a, const json_t *choice) {
  const char *fr = ag__jstr(choice, "finish_reason", NULL);
  if (fr != NULL)
    snprintf(a->finish_reason, sizeof(a->finish_reason), "%s", fr);
}

/* One call object, whole or a fragment, into slot `index`. */
static bool read_call(ag__asm *a, const json_t *tc, int64_t index) {
  ag__part_call *c = ag__asm_call(a, index);
  if (c == NULL)
    return false;
  size_t l;
  const char *id = ag__jstr(tc, "id", &l);
  if (id != NULL && l > 0 && c->id == NULL && !ag__asm_set(a, &c->id, id, l))
    return false;
  json_t *fn = json_object_get(tc, "function");
  if (fn != NULL && !json_is_object(fn))
    return ag__asm_bad(a, -1, "tool_calls[%lld].function is not an object",
                       (long long)index);
  const char *name = ag__jstr(fn, "name", &l);
  if (name != NULL && l > 0 && c->name == NULL &&
      !ag__asm_set(a, &c->name, name, l))
    return false;
  json_t *args = json_object_get(fn, "arguments");
  if (json_is_string(args))
    return ag__asm_args(a, c, json_string_value(args),
                        json_string_length(args));
  if (json_is_object(args)) {
    /* Some servers send the arguments as an object, not as text. */
    char *t = json_dumps(args, JSON_COMPACT);
    if (t == NULL)
      return ag__asm_bad(a, -1, "tool call arguments could not be written");
    bool ok = ag__asm_args(a, c, t, strlen(t));
    free(t);
    return ok;
  }
  if (args != NULL && !json_is_null(args))
    return ag__asm_bad(a, -1,
                       "tool_calls[%lld].function.arguments is not "
                       "a string",
                       (long long)index);
  return true;
}

void ag__openai_response(ag__asm *a, const char *body, size_t len) {
  json_error_t je;
  json_t *j = json_loadb(body, len, 0, &je);
  if (j == NULL) {
    ag__asm_bad(a, (long)je.position, "not JSON (%s)", je.text);
    return;
  }
  if (!json_is_object(j)) {
    ag__asm_bad(a, 0, "expected a JSON object");
    goto done;
  }
  json_t *err = json_object_get(j, "error");
  if (err != NULL && !json_is_null(err)) {
    ag__asm_stream_error(a, err);
    goto done;
  }
  json_t *choices = json_object_get(j, "choices");
  if (!json_is_array(choices) || json_array_size(choices) == 0) {
    ag__asm_bad(a, -1, "no \"choices\" array");
    goto done;
  }
  json_t *choice = json_array_get(choices, 0);
  json_t *m = json_object_get(choice, "message");
  if (!json_is_object(m)) {
    ag__asm_bad(a, -1, "choices[0].message is not an object");
    goto done;
  }
  size_t l;
  const char *content = ag__jstr(m, "content", &l);
  if (content != NULL && !ag__asm_text(a, content, l))
    goto done;
  json_t *cv = json_object_get(m, "content");
  if (cv != NULL && !json_is_null(cv) && !json_is_string(cv)) {
    ag__asm_bad(a, -1, "choices[0].message.content is not a string");
    goto done;
  }
  const char *refusal = ag__jstr(m, "refusal", &l);
  if (refusal != NULL && !ag__asm_refusal(a, refusal, l))
    goto done;
  json_t *calls = json_object_get(m, "tool_calls");
  if (calls != NULL && !json_is_null(calls) && !json_is_array(calls)) {
    ag__asm_bad(a, -1, "choices[0].message.tool_calls is not an array");
    goto done;
  }
  size_t i;
  json_t *tc;
  json_array_foreach(calls, i, tc) {
    if (!json_is_object(tc)) {
      ag__asm_bad(a, -1, "choices[0].message.tool_calls[%zu] is not an object",
                  i);
      goto done;
    }
    if (!read_call(a, tc, (int64_t)i))
      goto done;
  }
  read_finish(a, choice);
  read_usage(a, json_object_get(j, "usage"));
  a->done = true;
done:
  json_decref(j);
}

int ag__openai_event(ag__asm *a, const char *event, const char *data,
                     size_t len, size_t pos) {
  (void)event; /* Chat Completions streams name no events */
  if (len == 6 && memcmp(data, "[DONE]", 6) == 0) {
    a->done = true;
    return 0;
  }
  /* The data begins after "data: " on the event's first line. */
  size_t at = pos + 6;
  json_error_t je;
  json_t *j = json_loadb(data, len, 0, &je);
  if (j == NULL) {
    ag__asm_bad(a, (long)(at + (size_t)je.position),
                "a stream chunk is not JSON (%s)", je.text);
    return 1;
  }
  int rc = ag__openai_chunk(a, j, at);
  json_decref(j);
  return rc;
}

int ag__openai_chunk(ag__asm *a, json_t *j, size_t at) {
  bool ok = true;
  if (!json_is_object(j)) {
    ok = ag__asm_bad(a, (long)at, "a stream chunk is not a JSON object");
    goto done;
  }
  json_t *err = json_object_get(j, "error");
  if (err != NULL && !json_is_null(err)) {
    ok = ag__asm_stream_error(a, err);
    goto done;
  }
  json_t *choices = json_object_get(j, "choices");
  if (choices != NULL && !json_is_array(choices)) {
    ok = ag__asm_bad(a, (long)at, "a chunk's \"choices\" is not an array");
    goto done;
  }
  size_t i;
  json_t *choice;
  json_array_foreach(choices, i, choice) {
    json_t *ix = json_object_get(choice, "index");
    if (json_is_integer(ix) && json_integer_value(ix) != 0)
      continue; /* n > 1 is not asked for; only the first choice counts */
    json_t *d = json_object_get(choice, "delta");
    if (d != NULL && !json_is_object(d)) {
      ok = ag__asm_bad(a, (long)at, "a chunk's delta is not an object");
      goto done;
    }
    size_t l;
    const char *content = ag__jstr(d, "content", &l);
    if (content != NULL && !ag__asm_text(a, content, l)) {
      ok = false;
      goto done;
    }
    const char *refusal = ag__jstr(d, "refusal", &l);
    if (refusal != NULL && !ag__asm_refusal(a, refusal, l)) {
      ok = false;
      goto done;
    }
    json_t *calls = json_object_get(d, "tool_calls");
    size_t k;
    json_t *tc;
    json_array_foreach(calls, k, tc) {
      json_t *tix = json_object_get(tc, "index");
      int64_t index =
          json_is_integer(tix) ? json_integer_value(tix) : (int64_t)k;
      if (!json_is_object(tc)) {
        ok = ag__asm_bad(a, (long)at, "a tool call fragment is not an object");
        goto done;
      }
      if (!read_call(a, tc, index)) {
        ok = false;
        goto done;
      }
    }
    read_finish(a, choice);
  }
  read_usage(a, json_object_get(j, "usage"));
done:
  return ok ? 0 : 1;
}

json_t *ag__openai_error_body(unsigned status, const char *type,
                              const char *code, const char *msg) {
  (void)status;
  return json_pack("{s:{s:s, s:s, s:n, s:s}}", "error", "message", msg, "type",
                   type, "param", "code", code);
}

bool ag__wire_path_is(const char *path, const char *want) {
  size_t len = strlen(path), wl = strlen(want);
  if (len == wl + 1 && path[wl] == '/')
    len = wl;
  return len == wl && memcmp(path, want, wl) == 0;
}

static bool chat_serves(const char *path) {
  return ag__wire_path_is(path, "/v1/chat/completions") ||
         ag__wire_path_is(path, "/chat/completions");
}

const ag__wire ag__wire_chat = {
    .name = "openai",
    .api = "Chat Completions",
    .path = "/v1/chat/completions",
    .base_url = "https://api.openai.com/v1",
    .suffix = "/chat/completions",
    .key_env = "OPENAI_API_KEY",
    .key_header = "Authorization: Bearer ",
    .extra_header = NULL,
    .end_marker = "[DONE]",
    .request = ag__openai_request,
    .response = ag__openai_response,
    .event = ag__openai_event,
    .to_chat = NULL, /* its messages are chat already */
    .looks_like = NULL,
    .conv_key = "messages",
    .serves = chat_serves,
    .error_body = ag__openai_error_body,
};

const ag__wire *const ag__wire_all[] = {&ag__wire_chat, &ag__wire_messages,
                                        &ag__wire_responses, &ag__wire_gemini,
                                        NULL};

const ag__wire *ag__wire_serving(const char *path) {
  for (size_t i = 0; ag__wire_all[i] != NULL; i++)
    if (ag__wire_all[i]->serves != NULL && ag__wire_all[i]->serves(path))
      return ag__wire_all[i];
  return NULL;
}

const ag__wire *ag__wire_named(const char *name) {
  for (size_t i = 0; name != NULL && ag__wire_all[i] != NULL; i++)
    if (strcmp(ag__wire_all[i]->name, name) == 0)
      return ag__wire_all[i];
  return NULL;
}

void ag__wire_names(char *buf, size_t cap) {
  size_t n = 0;
  if (cap > 0)
    buf[0] = '\0';
  for (size_t i = 0; ag__wire_all[i] != NULL && n < cap; i++)
    n += (size_t)snprintf(buf + n, cap - n, "%s%s", i > 0 ? ", " : "",
                          ag__wire_all[i]->name);
}
