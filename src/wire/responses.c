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

/* ---- a reply made by the proxy (a stop) ----------------------------------
 */

/* The response object of a reply that is one assistant message saying
 * `text` (status "completed" or, for response.created, "in_progress"
 * with no output yet). */
static json_t *stop_response(const char *id, const char *msg_id,
                             const char *model, const char *text,
                             long long created, bool done) {
  json_t *output = json_array();
  if (done && output != NULL)
    json_array_append_new(
        output, json_pack("{s:s, s:s, s:s, s:s, s:[{s:s, s:s, s:[]}]}", "id",
                          msg_id, "type", "message", "status", "completed",
                          "role", "assistant", "content", "type", "output_text",
                          "text", text, "annotations"));
  return json_pack(
      "{s:s, s:s, s:I, s:s, s:n, s:n, s:n, s:s, s:o, s:b, s:s, s:[], "
      "s:{s:i, s:{s:i}, s:i, s:{s:i}, s:i}}",
      "id", id, "object", "response", "created_at", (json_int_t)created,
      "status", done ? "completed" : "in_progress", "error",
      "incomplete_details", "instructions", "model", model, "output", output,
      "parallel_tool_calls", 1, "tool_choice", "auto", "tools", "usage",
      "input_tokens", 0, "input_tokens_details", "cached_tokens", 0,
      "output_tokens", 0, "output_tokens_details", "reasoning_tokens", 0,
      "total_tokens", 0);
}

json_t *ag__responses_stop(const char *id, const char *model, const char *text,
                           long long created, bool stream) {
  char msg_id[96];
  snprintf(msg_id, sizeof msg_id, "msg_%s", id);
  if (!stream)
    return stop_response(id, msg_id, model, text, created, true);
  json_t *part = json_pack("{s:s, s:s, s:[]}", "type", "output_text", "text",
                           text, "annotations");
  json_t *evs = json_pack(
      "[{s:s, s:o}, {s:s, s:o},"
      " {s:s, s:i, s:{s:s, s:s, s:s, s:s, s:[]}},"
      " {s:s, s:s, s:i, s:i, s:{s:s, s:s, s:[]}},"
      " {s:s, s:s, s:i, s:i, s:s, s:[]},"
      " {s:s, s:s, s:i, s:i, s:s, s:[]},"
      " {s:s, s:s, s:i, s:i, s:O},"
      " {s:s, s:i, s:{s:s, s:s, s:s, s:s, s:[O]}},"
      " {s:s, s:o}]",
      "type", "response.created", "response",
      stop_response(id, msg_id, model, text, created, false), "type",
      "response.in_progress", "response",
      stop_response(id, msg_id, model, text, created, false), "type",
      "response.output_item.added", "output_index", 0, "item", "id", msg_id,
      "type", "message", "status", "in_progress", "role", "assistant",
      "content", "type", "response.content_part.added", "item_id", msg_id,
      "output_index", 0, "content_index", 0, "part", "type", "output_text",
      "text", "", "annotations", "type", "response.output_text.delta",
      "item_id", msg_id, "output_index", 0, "content_index", 0, "delta", text,
      "logprobs", "type", "response.output_text.done", "item_id", msg_id,
      "output_index", 0, "content_index", 0, "text", text, "logprobs", "type",
      "response.content_part.done", "item_id", msg_id, "output_index", 0,
      "content_index", 0, "part", part, "type", "response.output_item.done",
      "output_index", 0, "item", "id", msg_id, "type", "message", "status",
      "completed", "role", "assistant", "content", part, "type",
      "response.completed", "response",
      stop_response(id, msg_id, model, text, created, true));
  json_decref(part);
  size_t i;
  json_t *ev;
  json_array_foreach(evs, i, ev) {
    if (json_object_set_new(ev, "sequence_number",
                            json_integer((json_int_t)i)) != 0) {
      json_decref(evs);
      return NULL;
    }
  }
  return evs;
}

/* ---- requests read as turns (the proxy, the audit) ----------------------
 */

/* Whether a command's output says it failed by its exit status, the way
 * agents that speak Responses report a shell call's result inside the
 * output text (there is no error flag in function_call_output): a line
 * "Process exited with code N" (Codex's exec tools) or "Exit code: N"
 * (Codex's shell tool), or a JSON object whose metadata.exit_code is N
 * (Codex's older shell tool), with N not 0. */
static bool failed_by_exit(const char *t, size_t n) {
  static const char *const marks[] = {"Process exited with code ",
                                      "Exit code: "};
  for (size_t k = 0; k < sizeof marks / sizeof marks[0]; k++) {
    size_t ml = strlen(marks[k]);
    for (const char *s = t; s != NULL && (size_t)(s - t) + ml <= n;) {
      if ((s == t || s[-1] == '\n') && memcmp(s, marks[k], ml) == 0) {
        const char *d = s + ml;
        bool zero = (size_t)(d - t) < n && *d == '0' &&
                    ((size_t)(d + 1 - t) >= n || d[1] < '0' || d[1] > '9');
        bool digit =
            (size_t)(d - t) < n && ((*d >= '0' && *d <= '9') || *d == '-');
        return digit && !zero;
      }
      s = memchr(s, '\n', n - (size_t)(s - t));
      if (s != NULL)
        s++;
    }
  }
  if (n > 0 && t[0] == '{' && n <= AG__HTTP_BODY_MAX) {
    json_t *j = json_loadb(t, n, 0, NULL);
    json_t *ec = json_object_get(json_object_get(j, "metadata"), "exit_code");
    bool failed = json_is_integer(ec) && json_integer_value(ec) != 0;
    json_decref(j);
    return failed;
  }
  return false;
}

/* An input item's text content: a string, or its parts' texts joined
 * (input_text, output_text; images and files carry none). */
static json_t *item_text(const json_t *content) {
  if (content == NULL || json_is_null(content))
    return json_string("");
  return ag__blocks_text(content);
}

/* The assistant message a call joins: the last message when it is an
 * assistant's and no tool result or user text came after it, else a new
 * one (content ""). NULL when out of memory. */
static json_t *call_holder(json_t *out, json_t **open) {
  if (*open != NULL) {
    if (json_object_get(*open, "tool_calls") == NULL &&
        json_object_set_new(*open, "tool_calls", json_array()) != 0)
      return NULL;
    return *open;
  }
  json_t *m = json_pack("{s:s, s:s, s:[]}", "role", "assistant", "content", "",
                        "tool_calls");
  if (m == NULL || json_array_append_new(out, m) != 0)
    return NULL;
  *open = m;
  return m;
}

/* One call item (function_call, custom_tool_call, local_shell_call) as a
 * chat tool call; false with emsg set (or "" when out of memory). */
static bool call_item(const json_t *it, const char *type, size_t i, json_t *out,
                      json_t **open, char *emsg, size_t cap) {
  const char *id = ag__jstr(it, "call_id", NULL);
  const char *name = ag__jstr(it, "name", NULL);
  char *dumped = NULL;
  const char *args;
  if (strcmp(type, "local_shell_call") == 0) {
    name = "local_shell";
    const json_t *action = json_object_get(it, "action");
    dumped = action != NULL ? json_dumps(action, JSON_COMPACT | JSON_ENCODE_ANY)
                            : ag__strdup("{}");
    args = dumped;
  } else if (strcmp(type, "custom_tool_call") == 0) {
    json_t *in = json_pack("{s:O?}", "input", json_object_get(it, "input"));
    dumped = in != NULL ? json_dumps(in, JSON_COMPACT) : NULL;
    json_decref(in);
    args = dumped;
  } else {
    args = ag__jstr(it, "arguments", NULL);
    if (args == NULL)
      args = "{}";
  }
  if (id == NULL || name == NULL) {
    free(dumped);
    snprintf(emsg, cap, "input[%zu]: a %s item needs a call_id and a name", i,
             type);
    return false;
  }
  json_t *m = call_holder(out, open);
  json_t *tc =
      m != NULL && args != NULL
          ? json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", id, "type", "function",
                      "function", "name", name, "arguments", args)
          : NULL;
  free(dumped);
  return tc != NULL &&
         json_array_append_new(json_object_get(m, "tool_calls"), tc) == 0;
}

/* One output item (function_call_output, custom_tool_call_output,
 * local_shell_call_output) as a chat tool message, is_error by
 * failed_by_exit. */
static bool output_item(const json_t *it, const char *type, size_t i,
                        json_t *out, char *emsg, size_t cap) {
  const char *id = ag__jstr(it, "call_id", NULL);
  if (id == NULL && strcmp(type, "local_shell_call_output") == 0)
    id = ag__jstr(it, "id", NULL);
  if (id == NULL) {
    snprintf(emsg, cap, "input[%zu]: a %s item needs a call_id", i, type);
    return false;
  }
  json_t *text = item_text(json_object_get(it, "output"));
  if (text == NULL)
    return false;
  bool failed =
      failed_by_exit(json_string_value(text), json_string_length(text));
  json_t *m = json_pack("{s:s, s:s, s:o, s:b}", "role", "tool", "tool_call_id",
                        id, "content", text, "is_error", failed);
  return m != NULL && json_array_append_new(out, m) == 0;
}

/*
 * Responses input items as Chat Completions messages (ag__wire.to_chat):
 * message items by role (system and developer as context, user and
 * assistant with their text parts joined), each call item joining the
 * assistant message before it (several in a row are one parallel batch),
 * each call output a tool message. Codex's custom tools (apply_patch:
 * {"input": text}) and the local shell ({"action": ...}) are calls too.
 * Reasoning, web searches, item references and every other item carry no
 * call the client ran and are left out. `from` is not used: the whole
 * input is converted (SIZE_MAX: checked only).
 */
static json_t *responses_to_chat(const json_t *items, size_t from, char *emsg,
                                 size_t cap) {
  emsg[0] = '\0';
  if (!json_is_array(items)) {
    snprintf(emsg, cap, "input: expected a string or an array of items");
    return NULL;
  }
  json_t *out = json_array();
  json_t *open = NULL; /* the assistant message calls join */
  size_t i;
  const json_t *it;
  json_array_foreach(items, i, it) {
    if (out == NULL)
      return NULL;
    if (!json_is_object(it)) {
      snprintf(emsg, cap, "input[%zu]: expected an object", i);
      goto bad;
    }
    const char *type = ag__jstr(it, "type", NULL);
    const char *role = ag__jstr(it, "role", NULL);
    if (type == NULL && role != NULL)
      type = "message";
    if (type == NULL) {
      snprintf(emsg, cap, "input[%zu]: expected a \"type\" or a \"role\"", i);
      goto bad;
    }
    bool ok = true;
    if (strcmp(type, "message") == 0) {
      if (role == NULL) {
        snprintf(emsg, cap, "input[%zu].role: expected a string", i);
        goto bad;
      }
      json_t *text = item_text(json_object_get(it, "content"));
      bool assistant = strcmp(role, "assistant") == 0;
      const char *r = assistant || strcmp(role, "user") == 0 ? role : "system";
      json_t *m = text != NULL
                      ? json_pack("{s:s, s:o}", "role", r, "content", text)
                      : NULL;
      ok = m != NULL && json_array_append_new(out, m) == 0;
      open = assistant ? m : NULL;
    } else if (strcmp(type, "function_call") == 0 ||
               strcmp(type, "custom_tool_call") == 0 ||
               strcmp(type, "local_shell_call") == 0) {
      ok = call_item(it, type, i, out, &open, emsg, cap);
    } else if (strcmp(type, "function_call_output") == 0 ||
               strcmp(type, "custom_tool_call_output") == 0 ||
               strcmp(type, "local_shell_call_output") == 0) {
      ok = output_item(it, type, i, out, emsg, cap);
      open = NULL;
    }
    /* reasoning, web_search_call, item_reference, ...: nothing to read */
    if (!ok)
      goto bad;
  }
  if (from == SIZE_MAX) {
    json_decref(out);
    out = json_array(); /* checked only: an empty list, not NULL */
  }
  return out;
bad:
  json_decref(out);
  return NULL;
}

/* Whether a list is Responses input items: an item of a call or of its
 * output, which neither chat nor Messages transcripts have. */
static bool responses_looks_like(const json_t *items) {
  size_t i;
  const json_t *it;
  json_array_foreach(items, i, it) {
    const char *type = ag__jstr(it, "type", NULL);
    if (type != NULL && (strcmp(type, "function_call") == 0 ||
                         strcmp(type, "function_call_output") == 0 ||
                         strcmp(type, "custom_tool_call") == 0 ||
                         strcmp(type, "custom_tool_call_output") == 0))
      return true;
  }
  return false;
}

/* ---- the proxy ----------------------------------------------------------
 */

/* Responses under any prefix: "/v1/responses", Azure's "/openai/responses"
 * and "/openai/v1/responses" (its other paths, a response's id and
 * below, pass through). */
static bool responses_serves(const char *path) {
  return ag__wire_path_ends(path, "/responses");
}

static ag__reply_form responses_reply_form(const char *path, const char *query,
                                           const json_t *req) {
  (void)path;
  (void)query;
  return json_is_true(json_object_get(req, "stream")) ? AG__REPLY_SSE
                                                      : AG__REPLY_WHOLE;
}

/* The stop reply as text: the response object, or each event of a stream
 * as "event: <type>" and its data. */
static char *responses_stop_body(ag__reply_form form, const char *id,
                                 const char *model, const char *text,
                                 long long created, size_t *len) {
  json_t *o =
      ag__responses_stop(id, model, text, created, form == AG__REPLY_SSE);
  if (o == NULL)
    return NULL;
  if (form != AG__REPLY_SSE) {
    char *j = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    if (j != NULL)
      *len = strlen(j);
    return j;
  }
  ag__buf b;
  ag__buf_init(&b, SIZE_MAX);
  bool ok = true;
  size_t i;
  json_t *ev;
  json_array_foreach(o, i, ev) {
    char *j = json_dumps(ev, JSON_COMPACT);
    const char *type = ag__jstr(ev, "type", NULL);
    ok = ok && j != NULL && ag__buf_addstr(&b, "event: ") == AG_OK &&
         ag__buf_addstr(&b, type) == AG_OK &&
         ag__buf_addstr(&b, "\ndata: ") == AG_OK &&
         ag__buf_addstr(&b, j) == AG_OK && ag__buf_addstr(&b, "\n\n") == AG_OK;
    free(j);
  }
  json_decref(o);
  if (!ok) {
    ag__buf_free(&b);
    return NULL;
  }
  *len = b.len;
  return b.p; /* a heap buffer's text, now the caller's */
}

/* The text as one more user message item at the end of `input` (a string
 * input becomes its user message first). */
static bool responses_add_user_text(json_t *req, const char *text) {
  const json_t *in = json_object_get(req, "input");
  json_t *items = json_is_array(in) ? json_copy((json_t *)in) : json_array();
  bool ok =
      items != NULL &&
      (!json_is_string(in) ||
       json_array_append_new(items, json_pack("{s:s, s:O}", "role", "user",
                                              "content", in)) == 0) &&
      json_array_append_new(items, json_pack("{s:s, s:s}", "role", "user",
                                             "content", text)) == 0 &&
      json_object_set(req, "input", items) == 0;
  json_decref(items);
  return ok;
}

/* A request whose conversation the upstream keeps holds only its newest
 * items: its turn cannot be replayed from it. */
static const char *responses_unguarded(const json_t *req) {
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

/* An id the proxy may put in a path: OpenAI's "resp_..." and "conv_..." and
 * what compatible servers use; anything else is not read back. */
static bool stored_id_ok(const char *id) {
  size_t n = id != NULL ? strlen(id) : 0;
  if (n == 0 || n > 200)
    return false;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)id[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
          (c >= '0' && c <= '9') || c == '_' || c == '-'))
      return false;
  }
  return true;
}

/* Where the conversation a request continues is kept (wire.h, stored):
 * a previous_response_id's items that went into that response
 * (GET .../responses/{id}/input_items) and the response itself, whose
 * output follows them; a conversation's items (GET
 * .../conversations/{id}/items; "conversation" is its id or {"id"}). */
static bool responses_stored(const json_t *req, const char *id, char *list,
                             char *object, size_t cap) {
  const json_t *conv = json_object_get(req, "conversation");
  const char *cid = json_is_string(conv) ? json_string_value(conv)
                                         : ag__jstr(conv, "id", NULL);
  const char *prev = ag__jstr(req, "previous_response_id", NULL);
  int n = -1, m = 0;
  object[0] = '\0';
  if (id == NULL && prev == NULL && cid != NULL) {
    if (!stored_id_ok(cid))
      return false;
    n = snprintf(list, cap, "/conversations/%s/items", cid);
  } else {
    id = id != NULL ? id : prev;
    if (!stored_id_ok(id))
      return false;
    n = snprintf(list, cap, "/responses/%s/input_items", id);
    m = snprintf(object, cap, "/responses/%s", id);
  }
  return n > 0 && (size_t)n < cap && m >= 0 && (size_t)m < cap;
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
    .to_chat = responses_to_chat,
    .looks_like = responses_looks_like,
    .conv_key = "input",
    .serves = responses_serves,
    .error_body = ag__openai_error_body,
    .reply_form = responses_reply_form,
    .stop_body = responses_stop_body,
    .add_user_text = responses_add_user_text,
    .id_prefix = "resp_agentguard_",
    .unguarded = responses_unguarded,
    .stored = responses_stored,
    .conv_expect = "a string or an array of items",
    .otel_provider = "openai",
    .otel_operation = "chat",
};
