/*
 * src/wire/responses.c - the OpenAI Responses shape (POST /v1/responses:
 * what Codex CLI, the OpenAI Agents SDK by default and newer OpenAI
 * clients speak), for the HTTP provider (`provider.kind` "openai-responses").
 *
 * Request. The loop's history (Chat Completions messages) becomes the
 * `input` items: system, developer, user and assistant text as message
 * items ({"role", "content": text}), each tool call an item
 * {"type": "function_call", "call_id", "name", "arguments"} and each tool
 * message {"type": "function_call_output", "call_id", "output"}; the tools
 * are flat ({"type": "function", "name", "description", "parameters"}).
 * `store` is false: the conversation stays the loop's, nothing is kept by
 * the API between requests (no previous_response_id).
 *
 * Reply. The `output` items: message items give their output_text (and
 * refusal) parts, function_call items the calls (their `arguments` text as
 * it is), reasoning and other items carry nothing the loop uses. Streams
 * are named events whose data repeats the name in "type":
 * response.output_text.delta (text), response.output_item.added (a call's
 * id and name, at its output_index), response.function_call_arguments
 * .delta (its arguments), response.output_item.done (a call whole, for a
 * server that sent no deltas), response.completed / response.incomplete
 * (usage, the end), response.failed and error (an error). The reply's
 * finish reason is "tool_calls" when it has calls, "stop" when it is
 * complete, else the API's incomplete reason ("max_output_tokens").
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wire.h"

static bool set_new(json_t *o, const char *key, json_t *v) {
  return v != NULL && json_object_set_new(o, key, v) == 0;
}

/* A chat message's content as text: a string, or its text parts joined. */
static json_t *content_text(const json_t *content) {
  if (json_is_string(content) || content == NULL || json_is_null(content))
    return json_string(json_is_string(content) ? json_string_value(content)
                                               : "");
  return ag__blocks_text(content);
}

/* One chat message as input items appended to `items`; false with msg
 * set (or msg "" when out of memory). */
static bool message_items(const json_t *m, size_t i, json_t *items, char *msg,
                          size_t cap) {
  const char *role = ag__jstr(m, "role", NULL);
  if (role == NULL) {
    snprintf(msg, cap, "messages[%zu].role: expected a string", i);
    return false;
  }
  const json_t *content = json_object_get(m, "content");
  if (strcmp(role, "tool") == 0) {
    const char *id = ag__jstr(m, "tool_call_id", NULL);
    json_t *out = content_text(content);
    return out != NULL &&
           json_array_append_new(
               items,
               json_pack("{s:s, s:s, s:o}", "type", "function_call_output",
                         "call_id", id != NULL ? id : "", "output", out)) == 0;
  }
  json_t *text = content_text(content);
  if (text == NULL)
    return false;
  bool assistant = strcmp(role, "assistant") == 0;
  if (!assistant || json_string_length(text) > 0) {
    if (json_array_append_new(
            items, json_pack("{s:s, s:o}", "role", role, "content", text)) != 0)
      return false;
  } else {
    json_decref(text);
  }
  size_t k;
  const json_t *tc;
  json_array_foreach(json_object_get(m, "tool_calls"), k, tc) {
    const json_t *fn = json_object_get(tc, "function");
    const char *id = ag__jstr(tc, "id", NULL),
               *name = ag__jstr(fn, "name", NULL);
    const char *args = ag__jstr(fn, "arguments", NULL);
    if (name == NULL) {
      snprintf(msg, cap, "messages[%zu].tool_calls[%zu]: no function name", i,
               k);
      return false;
    }
    if (json_array_append_new(
            items, json_pack("{s:s, s:s, s:s, s:s}", "type", "function_call",
                             "call_id", id != NULL ? id : "", "name", name,
                             "arguments", args != NULL ? args : "{}")) != 0)
      return false;
  }
  return true;
}

/* Chat tools ({"type":"function","function":{...}}) as flat ones. */
static json_t *flat_tools(const json_t *tools) {
  json_t *out = json_array();
  size_t i;
  const json_t *t;
  json_array_foreach(tools, i, t) {
    const json_t *fn = json_object_get(t, "function");
    json_t *f = json_object();
    if (out == NULL || f == NULL ||
        !set_new(f, "type", json_string("function")))
      goto oom;
    const char *keys[] = {"name", "description", "parameters", "strict"};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
      json_t *v = json_object_get(fn, keys[k]);
      if (v != NULL && json_object_set(f, keys[k], v) != 0)
        goto oom;
    }
    if (json_array_append_new(out, f) != 0) {
      f = NULL;
      goto oom;
    }
    continue;
  oom:
    json_decref(f);
    json_decref(out);
    return NULL;
  }
  return out;
}

char *ag__responses_request(const ag__wire_opts *o, const ag_request *req,
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
  json_t *body = json_object(), *items = json_array();
  char *text = NULL;
  bool ok = body != NULL && items != NULL;
  size_t i;
  const json_t *m;
  json_array_foreach(messages, i, m) {
    if (ok && !message_items(m, i, items, msg, cap)) {
      ok = false;
      if (msg[0] != '\0')
        *rc = AG_EINVAL;
    }
  }
  ok = ok && set_new(body, "model", json_string(o->model)) &&
       json_object_set(body, "input", items) == 0 &&
       set_new(body, "stream", json_boolean(o->stream)) &&
       set_new(body, "store", json_false());
  if (ok && json_is_array(req->tools) && json_array_size(req->tools) > 0)
    ok = set_new(body, "tools", flat_tools(req->tools)) &&
         set_new(body, "tool_choice", json_string("auto")) &&
         set_new(body, "parallel_tool_calls",
                 json_boolean(o->parallel_tool_calls));
  if (ok && o->temperature >= 0)
    ok = set_new(body, "temperature", json_real(o->temperature));
  if (ok && o->max_tokens > 0)
    ok = set_new(body, "max_output_tokens", json_integer(o->max_tokens));
  if (ok && o->extra_body != NULL)
    ok = json_object_update(body, (json_t *)o->extra_body) == 0;
  if (ok && (text = json_dumps(body, JSON_COMPACT)) != NULL) {
    *len = strlen(text);
    *rc = AG_OK;
  }
  json_decref(items);
  json_decref(body);
  json_decref(parsed);
  return text;
}

/* ---- replies --------------------------------------------------------------
 */

static void read_usage(ag__asm *a, const json_t *u) {
  json_t *in = json_object_get(u, "input_tokens");
  json_t *out = json_object_get(u, "output_tokens");
  if (!json_is_integer(in) && !json_is_integer(out))
    return;
  a->has_usage = true;
  a->usage.prompt_tokens = json_is_integer(in) ? json_integer_value(in) : 0;
  a->usage.completion_tokens =
      json_is_integer(out) ? json_integer_value(out) : 0;
  json_t *cached = json_object_get(json_object_get(u, "input_tokens_details"),
                                   "cached_tokens");
  a->usage.cached_tokens =
      json_is_integer(cached) ? json_integer_value(cached) : 0;
}

/* The end of a response object: its usage, its finish, done. */
static void read_end(ag__asm *a, const json_t *resp, bool any_call) {
  read_usage(a, json_object_get(resp, "usage"));
  const char *status = ag__jstr(resp, "status", NULL);
  const char *why =
      ag__jstr(json_object_get(resp, "incomplete_details"), "reason", NULL);
  const char *fr = any_call ? "tool_calls"
                   : status == NULL || strcmp(status, "completed") == 0 ? "stop"
                   : why != NULL                                        ? why
                                 : status;
  snprintf(a->finish_reason, sizeof(a->finish_reason), "%s", fr);
  a->done = true;
}

/* A function_call item (whole, or as added) into call slot `index`. */
static bool read_call_item(ag__asm *a, const json_t *item, int64_t index,
                           bool with_args) {
  ag__part_call *c = ag__asm_call(a, index);
  if (c == NULL)
    return false;
  size_t l;
  const char *id = ag__jstr(item, "call_id", &l);
  if (id != NULL && l > 0 && c->id == NULL && !ag__asm_set(a, &c->id, id, l))
    return false;
  const char *name = ag__jstr(item, "name", &l);
  if (name != NULL && l > 0 && c->name == NULL &&
      !ag__asm_set(a, &c->name, name, l))
    return false;
  const char *args = ag__jstr(item, "arguments", &l);
  if (with_args && args != NULL && c->args.len == 0 && l > 0)
    return ag__asm_args(a, c, args, l);
  return true;
}

/* A message item's text and refusal parts. */
static bool read_message_item(ag__asm *a, const json_t *item) {
  size_t k, l;
  const json_t *part;
  json_array_foreach(json_object_get(item, "content"), k, part) {
    const char *type = ag__jstr(part, "type", NULL);
    if (type == NULL)
      continue;
    const char *t = NULL;
    if (strcmp(type, "output_text") == 0 &&
        (t = ag__jstr(part, "text", &l)) != NULL && !ag__asm_text(a, t, l))
      return false;
    if (strcmp(type, "refusal") == 0 &&
        (t = ag__jstr(part, "refusal", &l)) != NULL &&
        !ag__asm_refusal(a, t, l))
      return false;
  }
  return true;
}

/* A response object's output items; whether any was a call. */
static bool read_output(ag__asm *a, const json_t *output, bool *any_call) {
  size_t i;
  const json_t *item;
  json_array_foreach(output, i, item) {
    const char *type = ag__jstr(item, "type", NULL);
    if (type == NULL)
      return ag__asm_bad(a, -1, "output[%zu] has no type", i);
    if (strcmp(type, "message") == 0 && !read_message_item(a, item))
      return false;
    if (strcmp(type, "function_call") == 0) {
      *any_call = true;
      if (!read_call_item(a, item, (int64_t)i, true))
        return false;
    }
    /* reasoning, web search and other items: nothing the loop uses */
  }
  return true;
}

void ag__responses_response(ag__asm *a, const char *body, size_t len) {
  json_error_t je;
  json_t *j = json_loadb(body, len, 0, &je);
  if (j == NULL) {
    ag__asm_bad(a, (long)je.position, "not JSON (%s)", je.text);
    return;
  }
  json_t *err = json_object_get(j, "error");
  bool any_call = false;
  if (!json_is_object(j)) {
    ag__asm_bad(a, 0, "expected a JSON object");
  } else if (err != NULL && !json_is_null(err)) {
    ag__asm_stream_error(a, err);
  } else if (!json_is_array(json_object_get(j, "output"))) {
    ag__asm_bad(a, -1, "no \"output\" array");
  } else if (read_output(a, json_object_get(j, "output"), &any_call)) {
    read_end(a, j, any_call);
  }
  json_decref(j);
}

/* The output_index of a stream event as a call slot. */
static int64_t event_index(const json_t *j) {
  json_t *ix = json_object_get(j, "output_index");
  return json_is_integer(ix) ? json_integer_value(ix) : 0;
}

int ag__responses_event(ag__asm *a, const char *event, const char *data,
                        size_t len, size_t pos) {
  json_error_t je;
  json_t *j = json_loadb(data, len, 0, &je);
  if (j == NULL) {
    size_t at = pos + (event[0] != '\0' ? strlen(event) + 8 : 0) + 6;
    ag__asm_bad(a, (long)(at + (size_t)je.position),
                "a stream event is not JSON (%s)", je.text);
    return 1;
  }
  const char *type = ag__jstr(j, "type", NULL);
  if (type == NULL)
    type = event;
  bool ok = true;
  size_t l;
  const char *delta = ag__jstr(j, "delta", &l);
  const json_t *item = json_object_get(j, "item");
  const char *item_type = ag__jstr(item, "type", NULL);
  bool call_item = item_type != NULL && strcmp(item_type, "function_call") == 0;
  if (strcmp(type, "response.output_text.delta") == 0 && delta != NULL) {
    ok = ag__asm_text(a, delta, l);
  } else if (strcmp(type, "response.refusal.delta") == 0 && delta != NULL) {
    ok = ag__asm_refusal(a, delta, l);
  } else if (strcmp(type, "response.output_item.added") == 0 && call_item) {
    ok = read_call_item(a, item, event_index(j), false);
  } else if (strcmp(type, "response.function_call_arguments.delta") == 0 &&
             delta != NULL) {
    ag__part_call *c = ag__asm_call(a, event_index(j));
    ok = c != NULL && ag__asm_args(a, c, delta, l);
  } else if (strcmp(type, "response.output_item.done") == 0 && call_item) {
    ok = read_call_item(a, item, event_index(j), true);
  } else if (strcmp(type, "response.completed") == 0 ||
             strcmp(type, "response.incomplete") == 0) {
    bool any_call = false;
    for (int i = 0; i < a->n_slots && !any_call; i++)
      any_call = a->calls[i].used;
    read_end(a, json_object_get(j, "response"), any_call);
  } else if (strcmp(type, "response.failed") == 0) {
    const json_t *e = json_object_get(json_object_get(j, "response"), "error");
    ok = ag__asm_stream_error(a, e != NULL ? e : j);
  } else if (strcmp(type, "error") == 0) {
    ok = ag__asm_stream_error(a, j);
  }
  /* response.created, .in_progress, content parts, reasoning: nothing */
  json_decref(j);
  return ok ? 0 : 1;
}

const ag__wire ag__wire_responses = {
    .name = "openai-responses",
    .api = "Responses",
    .path = "/v1/responses",
    .base_url = "https://api.openai.com/v1",
    .suffix = "/responses",
    .key_env = "OPENAI_API_KEY",
    .key_header = "Authorization: Bearer ",
    .extra_header = NULL,
    .end_marker = "response.completed",
    .request = ag__responses_request,
    .response = ag__responses_response,
    .event = ag__responses_event,
    .to_chat = NULL, /* requests are not read as turns yet (the proxy) */
    .looks_like = NULL,
};
