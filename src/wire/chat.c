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
#include <time.h>

#include "../core/internal.h"
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

static bool whole_tape(ag__asm *a, const char *body, size_t len);

void ag__openai_response(ag__asm *a, const char *body, size_t len) {
  if (whole_tape(a, body, len))
    return;
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

bool ag__wire_path_ends(const char *path, const char *tail) {
  size_t len = strlen(path), tl = strlen(tail);
  if (len > tl && path[len - 1] == '/')
    len--;
  return len >= tl && memcmp(path + len - tl, tail, tl) == 0;
}

const char *ag__wire_model_method(const char *path, const char **model) {
  size_t len = strlen(path);
  if (len > 1 && path[len - 1] == '/')
    len--;
  const char *m = path + len;
  while (m > path && m[-1] != '/')
    m--;
  /* the segment before the model's: a base model, a tuned one (the Gemini
   * API's /v1beta/tunedModels/{m}), a deployed one (Vertex AI's
   * .../endpoints/{id}, where tuned models are served) */
  static const char *const parents[] = {"/models/", "/tunedModels/",
                                        "/endpoints/"};
  size_t k = 0;
  for (; k < sizeof parents / sizeof parents[0]; k++) {
    size_t n = strlen(parents[k]);
    if ((size_t)(m - path) >= n && memcmp(m - n, parents[k], n) == 0)
      break;
  }
  if (k == sizeof parents / sizeof parents[0])
    return NULL;
  const char *colon = memchr(m, ':', (size_t)(path + len - m));
  if (colon == NULL || colon == m)
    return NULL;
  if (model != NULL)
    *model = m;
  return colon + 1;
}

/* Chat Completions under any prefix: "/v1/chat/completions", a base URL
 * without the version, Azure's deployments, OpenAI-compatible gateways. */
static bool chat_serves(const char *path) {
  return ag__wire_path_ends(path, "/chat/completions");
}

/* ---- for the proxy: the replies it writes, the streams it relays ------- */

/* One chat.completion.chunk with `delta` (stolen) and a finish reason. */
static void sse_chunk(ag__buf *b, const char *id, const char *model,
                      json_t *delta, const char *finish) {
  ag__sse_json(b,
               json_pack("{s:s, s:s, s:I, s:s, s:[{s:i, s:o, s:s?}]}", "id", id,
                         "object", "chat.completion.chunk", "created",
                         (json_int_t)time(NULL), "model", model, "choices",
                         "index", 0, "delta", delta, "finish_reason", finish));
}

/* A reply as chunks: its text, its calls (whole; rep may be NULL), its
 * end, [DONE]. */
static void sse_reply(ag__buf *b, const char *id, const char *model,
                      const char *text, const ag_reply *rep,
                      const char *finish) {
  sse_chunk(b, id, model,
            json_pack("{s:s, s:s}", "role", "assistant", "content",
                      text != NULL ? text : ""),
            NULL);
  if (rep != NULL && rep->n_calls > 0) {
    json_t *tcs = json_array();
    for (size_t i = 0; tcs != NULL && i < rep->n_calls; i++) {
      const ag_tool_call *tc = &rep->calls[i];
      json_t *one =
          json_pack("{s:i, s:s, s:s, s:{s:s, s:s%}}", "index", (int)i, "id",
                    tc->id, "type", "function", "function", "name", tc->name,
                    "arguments", tc->arguments, tc->arguments_len);
      if (one == NULL || json_array_append_new(tcs, one) != 0)
        b->cut = true;
    }
    sse_chunk(b, id, model,
              tcs != NULL ? json_pack("{s:o}", "tool_calls", tcs) : NULL, NULL);
  }
  sse_chunk(b, id, model, json_object(), finish);
  ag__sse_add(b, "data: [DONE]\n\n", 14);
}

/* The ids a stream's own chunks carry when the upstream sent none. */
static void relay_ids(ag__wire_relay *r) {
  if (r->id[0] == '\0') {
    snprintf(r->id, sizeof r->id, "chatcmpl-agentguard");
    snprintf(r->model, sizeof r->model, "agentguard");
  }
}

static void chat_relay_stop(ag__wire_relay *r, const char *text) {
  relay_ids(r);
  /* the stop goes on the text already relayed, after a blank line */
  size_t n = strlen(text);
  char *t = malloc(n + 3);
  if (t == NULL) {
    r->out.cut = true;
    return;
  }
  snprintf(t, n + 3, "%s%s", r->any_text ? "\n\n" : "", text);
  sse_reply(&r->out, r->id, r->model, t, NULL, "stop");
  free(t);
}

static void chat_relay_tail(ag__wire_relay *r, const ag_reply *rep) {
  relay_ids(r);
  sse_reply(&r->out, r->id, r->model, rep->text, rep,
            rep->n_calls > 0 ? "tool_calls" : "stop");
}

static void chat_relay_release(ag__wire_relay *r) {
  ag__sse_add(&r->out, r->held.p != NULL ? r->held.p : "", r->held.len);
  ag__sse_add(&r->out, "data: [DONE]\n\n", 14);
}

static void chat_relay_error(ag__wire_relay *r, const char *msg) {
  ag__buf_reset(&r->out); /* what was not flushed yet goes: the error ends */
  ag__sse_json(&r->out, json_pack("{s:{s:s, s:s, s:n, s:s}}", "error",
                                  "message", msg, "type", "upstream_error",
                                  "param", "code", "upstream_stream"));
}

/* A text chunk read from the tape instead of a tree: the chunks most
 * streams are made of, at the cost of a tape (the JCS tokenizer's, in the
 * relay's scratch), not a jansson tree. It does with a chunk exactly what
 * chat_relay_event's tree path does: the text to the assembler and the
 * text check, the chunk on to the client as it came. It takes only that
 * shape - after the stream's first chunk (whose id and model are kept),
 * "error" and "usage" absent or null, one choice with "index" 0 (or none),
 * "finish_reason" absent or null, a delta of "content" (a string or null),
 * "role" and a null "refusal" - and only a chunk the tape takes and jansson
 * would (no duplicate key, no "\u0000", no integer jansson cannot hold).
 * Anything else returns -1 and takes the tree path, whose effects are the
 * reference: tests/fuzz/fuzz_relay.c replays every input both ways
 * (AG_PROXY_REPLAY_TREE) and compares. */
#define CHUNK_TAPE_MAX 16384u
#define CHUNK_TAPE_DEPTH 64

struct ag__chunk_tape {
  ag__jcs *j;
  char buf[CHUNK_TAPE_MAX + 1]; /* the decoded text */
};

ag__chunk_tape *ag__chunk_tape_new(void) {
  ag__chunk_tape *ct = malloc(sizeof(*ct));
  if (ct != NULL && ag__jcs_tape_new(&ct->j, CHUNK_TAPE_MAX, CHUNK_TAPE_DEPTH,
                                     NULL) != AG_OK) {
    free(ct);
    ct = NULL;
  }
  return ct;
}

bool ag__chunk_tape_whole(ag__chunk_tape *ct, const char *body, size_t len,
                          ag__wtape *t) {
  size_t n;
  if (ct == NULL || len > CHUNK_TAPE_MAX ||
      ag__jcs_tape(ct->j, body, len, &n, NULL) != AG_OK ||
      ag__jcs_tok_type(ct->j, 0) != AG__JT_OBJ ||
      !ag__jcs_jansson_safe(ct->j, n))
    return false;
  /* a string decodes into at most its source's bytes, quotes included,
   * with its NUL: the strings of a body fit in len + 1 */
  *t = (ag__wtape){ct->j, body, len, n, ct->buf, 0, sizeof ct->buf};
  return true;
}

void ag__chunk_tape_free(ag__chunk_tape *ct) {
  if (ct != NULL) {
    ag__jcs_free(ct->j);
    free(ct);
  }
}

static bool tok_is(const ag__jcs *j, size_t i, int type) {
  return i != 0 && ag__jcs_tok_type(j, i) == type;
}

/* Whether member value token i is absent (0) or null. */
static bool tok_none(const ag__jcs *j, size_t i) {
  return i == 0 || tok_is(j, i, AG__JT_NULL);
}

/* Whether array token arr holds exactly one element. */
static bool tok_one(const ag__jcs *j, size_t arr) {
  return tok_is(j, arr, AG__JT_ARR) && ag__jcs_tok_next(j, arr) > arr + 1 &&
         ag__jcs_tok_next(j, arr + 1) == ag__jcs_tok_next(j, arr);
}

/* The delta's content token of a text chunk's one choice (0: none or
 * null), or SIZE_MAX when the chunk is not such a chunk. */
static size_t fast_content(const ag__jcs *j, const char *data, size_t len) {
  if (!tok_none(j, ag__jcs_get(j, 0, "error")) ||
      !tok_none(j, ag__jcs_get(j, 0, "usage")))
    return SIZE_MAX;
  size_t chs = ag__jcs_get(j, 0, "choices");
  if (!tok_one(j, chs) || !tok_is(j, chs + 1, AG__JT_OBJ))
    return SIZE_MAX;
  size_t ch = chs + 1, ix = ag__jcs_get(j, ch, "index");
  if (ix != 0) { /* the integer 0, written "0" */
    size_t off = ag__jcs_tok_off(j, ix);
    if (!tok_is(j, ix, AG__JT_NUM) || data[off] != '0' ||
        (off + 1 < len && memchr(".eE", data[off + 1], 3) != NULL))
      return SIZE_MAX;
  }
  size_t d = ag__jcs_get(j, ch, "delta");
  if (!tok_none(j, ag__jcs_get(j, ch, "finish_reason")) ||
      !tok_is(j, d, AG__JT_OBJ))
    return SIZE_MAX;
  size_t content = 0, end = ag__jcs_tok_next(j, d);
  for (size_t k = d + 1; k < end; k = ag__jcs_tok_next(j, k + 1)) {
    if (ag__jcs_key_is(j, k, "content", 7) &&
        (tok_is(j, k + 1, AG__JT_STR) || tok_is(j, k + 1, AG__JT_NULL)))
      content = tok_is(j, k + 1, AG__JT_STR) ? k + 1 : 0;
    else if (!ag__jcs_key_is(j, k, "role", 4) &&
             !(ag__jcs_key_is(j, k, "refusal", 7) &&
               tok_is(j, k + 1, AG__JT_NULL)))
      return SIZE_MAX;
  }
  return content;
}

/* 0 or 1 as chat_relay_event returns them; -1: for the tree path. The
 * stream's first chunk, which names the reply (its id and model are kept
 * for the proxy's own chunks), is taken too: it was one jansson tree, one
 * of the two a stream made (about 25 allocations). */
static int fast_chunk(ag__wire_relay *r, const char *data, size_t len) {
  ag__wtape t;
  if (!ag__chunk_tape_whole(r->ct, data, len, &t))
    return -1;
  size_t content = fast_content(t.j, data, len), cl = 0;
  if (content == SIZE_MAX)
    return -1;
  /* the tree path's order: the text to the assembler, the names, then the
   * text check (a stop writes its chunk with the names); the chunk's
   * strings fit in the scratch, so none of them comes back NULL */
  const char *text = NULL;
  if (content != 0) {
    if ((text = ag__wt_str(&t, content, &cl)) == NULL)
      return -1;
    if (!ag__asm_text(r->a, text, cl))
      return 1;
  }
  if (r->id[0] == '\0') { /* as the tree path: a string, else a default */
    const char *id = ag__wt_str(&t, ag__wt_get(&t, 0, "id"), NULL);
    const char *model = ag__wt_str(&t, ag__wt_get(&t, 0, "model"), NULL);
    snprintf(r->id, sizeof r->id, "%s", id != NULL ? id : "chatcmpl");
    snprintf(r->model, sizeof r->model, "%s",
             model != NULL ? model : "unknown");
  }
  if (cl > 0 && !ag__wire_relay_text(r, text, cl))
    return 1;
  ag__sse_data(&r->out, data, len);
  return r->out.cut || r->held.cut ? 1 : 0;
}

/* ---- a whole reply from the tape ---------------------------------------- */

/* Whether the tool_calls token tcs (absent or null: none) is what
 * read_call takes without a word: an array of objects whose "function" is
 * absent or an object, its "arguments" absent, null or a string (an
 * object, which the tree path writes out with jansson, goes there). */
static bool calls_plain(const ag__jcs *j, size_t tcs) {
  if (tok_none(j, tcs))
    return true;
  if (!tok_is(j, tcs, AG__JT_ARR))
    return false;
  size_t end = ag__jcs_tok_next(j, tcs);
  for (size_t tc = tcs + 1; tc < end; tc = ag__jcs_tok_next(j, tc)) {
    if (!tok_is(j, tc, AG__JT_OBJ))
      return false;
    size_t fn = ag__jcs_get(j, tc, "function");
    if (fn == 0)
      continue;
    if (!tok_is(j, fn, AG__JT_OBJ))
      return false;
    size_t args = ag__jcs_get(j, fn, "arguments");
    if (!tok_none(j, args) && !tok_is(j, args, AG__JT_STR))
      return false;
  }
  return true;
}

/* A whole chat.completion read from the tape (a->ct) instead of a jansson
 * tree: the replies most non-streamed requests get. It takes only a body
 * the tree path reads without a complaint - an object without a non-null
 * "error", a non-empty "choices" whose first element is an object with a
 * "message" object, its "content" absent, null or a string, its calls as
 * calls_plain says - and that jansson would take (ag__jcs_jansson_safe),
 * and then feeds the assembler exactly what ag__openai_response's tree
 * path feeds it, in the same order. Anything else returns false before it
 * has touched the assembler, and the tree path reads the body: its
 * effects, and its messages for a bad body, are the reference
 * (ag_proxy_read_whole in hooks.h; tests/fuzz/fuzz_relay.c compares the
 * two). */
static bool whole_tape(ag__asm *a, const char *body, size_t len) {
  ag__wtape tw, *tp = &tw;
  if (!ag__chunk_tape_whole(a->ct, body, len, tp))
    return false;
  const ag__jcs *j = tp->j;
  size_t chs = ag__jcs_get(j, 0, "choices");
  if (!tok_none(j, ag__jcs_get(j, 0, "error")) || !tok_is(j, chs, AG__JT_ARR) ||
      ag__jcs_tok_next(j, chs) == chs + 1 || !tok_is(j, chs + 1, AG__JT_OBJ))
    return false;
  size_t ch = chs + 1, m = ag__jcs_get(j, ch, "message");
  if (!tok_is(j, m, AG__JT_OBJ))
    return false;
  size_t content = ag__jcs_get(j, m, "content");
  size_t tcs = ag__jcs_get(j, m, "tool_calls");
  if ((!tok_none(j, content) && !tok_is(j, content, AG__JT_STR)) ||
      !calls_plain(j, tcs))
    return false;
  /* taken: the tree path's steps, in its order */
  size_t l = 0;
  const char *t;
  if (tok_is(j, content, AG__JT_STR) &&
      ((t = ag__wt_str(tp, content, &l)) == NULL || !ag__asm_text(a, t, l)))
    return ag__wt_full(a, t);
  size_t refusal = ag__jcs_get(j, m, "refusal");
  if (tok_is(j, refusal, AG__JT_STR) &&
      ((t = ag__wt_str(tp, refusal, &l)) == NULL || !ag__asm_refusal(a, t, l)))
    return ag__wt_full(a, t);
  int64_t index = 0;
  size_t end = tok_is(j, tcs, AG__JT_ARR) ? ag__jcs_tok_next(j, tcs) : 0;
  for (size_t tc = tcs + 1; tc < end; tc = ag__jcs_tok_next(j, tc), index++) {
    ag__part_call *c = ag__asm_call(a, index);
    if (c == NULL)
      return true;
    size_t id = ag__jcs_get(j, tc, "id"), fn = ag__jcs_get(j, tc, "function");
    if (tok_is(j, id, AG__JT_STR) && c->id == NULL &&
        ((t = ag__wt_str(tp, id, &l)) == NULL ||
         (l > 0 && !ag__asm_set(a, &c->id, t, l))))
      return ag__wt_full(a, t);
    size_t name = fn != 0 ? ag__jcs_get(j, fn, "name") : 0;
    if (tok_is(j, name, AG__JT_STR) && c->name == NULL &&
        ((t = ag__wt_str(tp, name, &l)) == NULL ||
         (l > 0 && !ag__asm_set(a, &c->name, t, l))))
      return ag__wt_full(a, t);
    size_t args = fn != 0 ? ag__jcs_get(j, fn, "arguments") : 0;
    if (tok_is(j, args, AG__JT_STR) &&
        ((t = ag__wt_str(tp, args, &l)) == NULL || !ag__asm_args(a, c, t, l)))
      return ag__wt_full(a, t);
  }
  size_t fr = ag__jcs_get(j, ch, "finish_reason");
  if ((t = ag__wt_str(tp, fr, &l)) != NULL)
    ag__asm_finish_reason(a, t, l);
  /* (ag__jcs_get of token 0 is the root's member: every object looked
   * into below is one) */
  size_t u = ag__jcs_get(j, 0, "usage");
  long long pt = 0, ctk = 0, cached = 0;
  bool has_pt = false, has_ct = false;
  if (tok_is(j, u, AG__JT_OBJ)) {
    has_pt = ag__wt_int(tp, ag__jcs_get(j, u, "prompt_tokens"), &pt);
    has_ct = ag__wt_int(tp, ag__jcs_get(j, u, "completion_tokens"), &ctk);
  }
  if (has_pt || has_ct) {
    size_t det = ag__jcs_get(j, u, "prompt_tokens_details");
    a->has_usage = true;
    a->usage.prompt_tokens = has_pt ? pt : 0;
    a->usage.completion_tokens = has_ct ? ctk : 0;
    a->usage.cached_tokens =
        tok_is(j, det, AG__JT_OBJ) &&
                ag__wt_int(tp, ag__jcs_get(j, det, "cached_tokens"), &cached)
            ? cached
            : 0;
  }
  a->done = true;
  return true;
}

/* A chunk that holds text and more (calls, the end): its text goes now, in
 * a copy without the rest, and the rest (d without "content") is held. */
static void split_chunk(ag__wire_relay *r, json_t *j, json_t *d) {
  json_t *now = json_deep_copy(j);
  json_t *c0 = json_array_get(json_object_get(now, "choices"), 0);
  json_object_del(json_object_get(c0, "delta"), "tool_calls");
  json_object_set_new(c0, "finish_reason", json_null());
  ag__sse_json(&r->out, now);
  json_object_del(d, "content");
}

/* One Chat Completions chunk through the relay: text chunks go on at once
 * (after the text check), chunks with tool-call fragments, the finish
 * reason or only usage are held until the calls are checked. A chunk
 * without a choice goes on at once too while nothing is held (Azure
 * OpenAI's first chunk, its prompt_filter_results): after something is
 * held (the usage after the finish), it is held behind it. */
static int chat_relay_event(ag__wire_relay *r, const char *event,
                            const char *data, size_t len, size_t pos) {
  if (len == 6 && memcmp(data, "[DONE]", 6) == 0) {
    r->a->done = true;
    return 0;
  }
  int fast = fast_chunk(r, data, len);
  if (fast >= 0)
    return fast;
  /* parsed once, for the assembler and for the relay */
  json_t *j = json_loadb(data, len, 0, NULL);
  if (j == NULL) {
    /* not JSON: the assembler's reader says where and why */
    ag__openai_event(r->a, event, data, len, pos);
    return 1;
  }
  if (ag__openai_chunk(r->a, j, pos + 6) != 0) {
    json_decref(j);
    return 1;
  }
  if (r->id[0] == '\0') {
    const char *id = json_string_value(json_object_get(j, "id"));
    const char *model = json_string_value(json_object_get(j, "model"));
    snprintf(r->id, sizeof r->id, "%s", id != NULL ? id : "chatcmpl");
    snprintf(r->model, sizeof r->model, "%s",
             model != NULL ? model : "unknown");
  }
  json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
  json_t *d = json_object_get(ch, "delta");
  size_t cl = 0;
  const char *content = ag__jstr(d, "content", &cl);
  json_t *fr = json_object_get(ch, "finish_reason");
  bool hold = (ch == NULL && r->held.len > 0) ||
              json_array_size(json_object_get(d, "tool_calls")) > 0 ||
              (fr != NULL && !json_is_null(fr));
  if (content != NULL && cl > 0 && !ag__wire_relay_text(r, content, cl)) {
    json_decref(j);
    return 1;
  }
  if (!hold) {
    ag__sse_data(&r->out, data, len);
  } else {
    if (content != NULL && cl > 0)
      split_chunk(r, j, d);
    ag__sse_json(&r->held, json_incref(j));
  }
  json_decref(j);
  return r->out.cut || r->held.cut ? 1 : 0;
}

/* The messages that answer the held-back calls: the assistant's message
 * with them, then a tool message each with its nudge. */
static json_t *chat_nudge_messages(const ag_reply *rep,
                                   const ag_call_check *checks) {
  json_t *tcs = json_array(), *out = json_array();
  if (tcs == NULL || out == NULL)
    goto fail;
  for (size_t i = 0; i < rep->n_calls; i++) {
    if (checks[i].action != AG_NUDGE)
      continue;
    const ag_tool_call *tc = &rep->calls[i];
    json_t *call = json_pack("{s:s, s:s, s:{s:s, s:s%}}", "id", tc->id, "type",
                             "function", "function", "name", tc->name,
                             "arguments", tc->arguments, tc->arguments_len);
    if (call == NULL || json_array_append_new(tcs, call) != 0)
      goto fail;
  }
  json_t *am = json_pack("{s:s, s:O, s:O}", "role", "assistant", "content",
                         json_null(), "tool_calls", tcs);
  if (am == NULL || json_array_append_new(out, am) != 0)
    goto fail;
  for (size_t i = 0; i < rep->n_calls; i++) {
    if (checks[i].action != AG_NUDGE)
      continue;
    json_t *tm = json_pack("{s:s, s:s, s:s}", "role", "tool", "tool_call_id",
                           rep->calls[i].id, "content", checks[i].message);
    if (tm == NULL || json_array_append_new(out, tm) != 0)
      goto fail;
  }
  json_decref(tcs);
  return out;
fail:
  json_decref(tcs);
  json_decref(out);
  return NULL;
}

static bool chat_strip_calls(json_t *reply, char *emsg, size_t cap) {
  json_t *ch = json_array_get(json_object_get(reply, "choices"), 0);
  json_t *m = json_object_get(ch, "message");
  if (!json_is_object(m)) {
    snprintf(emsg, cap, "choices[0].message is missing");
    return false;
  }
  json_object_del(m, "tool_calls");
  json_object_del(m, "function_call");
  json_object_set_new(ch, "finish_reason", json_string("stop"));
  return true;
}

static bool chat_whole_to_sse(const json_t *reply, ag__buf *out, char *emsg,
                              size_t cap) {
  const json_t *ch = json_array_get(json_object_get(reply, "choices"), 0);
  const json_t *m = json_object_get(ch, "message");
  if (!json_is_object(m)) {
    snprintf(emsg, cap, "choices[0].message is missing");
    return false;
  }
  const char *id = json_string_value(json_object_get(reply, "id"));
  const char *model = json_string_value(json_object_get(reply, "model"));
  const char *finish = json_string_value(json_object_get(ch, "finish_reason"));
  sse_reply(out, id != NULL ? id : "chatcmpl-agentguard",
            model != NULL ? model : "agentguard",
            json_string_value(json_object_get(m, "content")), NULL,
            finish != NULL ? finish : "stop");
  return true;
}

/* The form of the reply: as the request's "stream" says. */
static ag__reply_form chat_reply_form(const char *path, const char *query,
                                      const json_t *req) {
  (void)path;
  (void)query;
  return json_is_true(json_object_get(req, "stream")) ? AG__REPLY_SSE
                                                      : AG__REPLY_WHOLE;
}

/* A chat.completion with one assistant message saying `text`, whole or as
 * chunks. */
static char *chat_stop_body(ag__reply_form form, const char *id,
                            const char *model, const char *text,
                            long long created, size_t *len) {
  if (form == AG__REPLY_SSE) {
    ag__buf b;
    ag__buf_init(&b, AG__HTTP_BODY_MAX);
    sse_reply(&b, id, model, text, NULL, "stop");
    if (b.cut) {
      ag__buf_free(&b);
      return NULL;
    }
    *len = b.len;
    return b.p;
  }
  json_t *o = json_pack(
      "{s:s, s:s, s:I, s:s, s:[{s:i, s:{s:s, s:s}, s:s}], s:{s:i, s:i, s:i}}",
      "id", id, "object", "chat.completion", "created", (json_int_t)created,
      "model", model, "choices", "index", 0, "message", "role", "assistant",
      "content", text, "finish_reason", "stop", "usage", "prompt_tokens", 0,
      "completion_tokens", 0, "total_tokens", 0);
  char *t = o != NULL ? json_dumps(o, JSON_COMPACT) : NULL;
  json_decref(o);
  if (t != NULL)
    *len = strlen(t);
  return t;
}

/* ---- the turn read from the tape (for the proxy) ----------------------- */

/* One assistant message of the turn to the sink: its text, its calls. */
static bool tape_reply(ag__wtape *t, size_t m, const ag__turn_sink *k) {
  size_t content = ag__wt_get(t, m, "content");
  size_t tcs = ag__wt_get(t, m, "tool_calls");
  /* content: a string or null (an array of parts: no text, as the audit's
   * chat reader reads it) */
  if ((!ag__wt_is(t, content, AG__JT_STR) &&
       !ag__wt_is(t, content, AG__JT_NULL) &&
       !ag__wt_is(t, content, AG__JT_ARR)) ||
      ag__wt_get(t, m, "function_call") != 0 ||
      (tcs != 0 && !ag__wt_is(t, tcs, AG__JT_NULL) &&
       !ag__wt_is(t, tcs, AG__JT_ARR)))
    return false;
  size_t len = 0;
  const char *text = ag__wt_is(t, content, AG__JT_ARR) ? NULL : "";
  if (ag__wt_is(t, content, AG__JT_STR) &&
      (text = ag__wt_str(t, content, &len)) == NULL)
    return false;
  if (!k->step(k->user, text, len))
    return false;
  AG__WT_EACH(t, tcs, tc) {
    size_t fn = ag__wt_get(t, tc, "function"), args_len;
    const char *id = ag__wt_str(t, ag__wt_get(t, tc, "id"), NULL);
    const char *name = ag__wt_str(t, ag__wt_get(t, fn, "name"), NULL);
    const char *args = ag__wt_str(t, ag__wt_get(t, fn, "arguments"), &args_len);
    if (id == NULL || name == NULL || args == NULL ||
        !k->call(k->user, id, name, args, args_len))
      return false;
  }
  return true;
}

/* One tool message to the sink: its call's result. */
static bool tape_result(ag__wtape *t, size_t m, const ag__turn_sink *k) {
  size_t ie = ag__wt_get(t, m, "is_error"), len;
  if (ie != 0 && !ag__wt_is(t, ie, AG__JT_TRUE) &&
      !ag__wt_is(t, ie, AG__JT_FALSE))
    return false;
  const char *id = ag__wt_str(t, ag__wt_get(t, m, "tool_call_id"), NULL);
  const char *content = ag__wt_parts_text(t, ag__wt_get(t, m, "content"), &len);
  return id != NULL && content != NULL &&
         k->result(k->user, id, content, len, ag__wt_is(t, ie, AG__JT_TRUE));
}

/* The turn from the last user message (or the first message) on, in the
 * plain shape every client sends: assistant content a string, null or
 * parts, tool calls with string ids, names and arguments; tool messages
 * with a string tool_call_id, is_error absent or boolean; system and
 * developer messages; no "usage", no second user message. Anything else
 * is the tree's to read (the audit's chat reader, whose messages a broken
 * turn gets). */
static int chat_tape_turn(ag__wtape *t, size_t conv, const ag__turn_sink *k) {
  size_t start = 0, n_steps = 0, n_calls = 0;
  if (ag__wt_count(t, conv) == 0)
    return 0;
  AG__WT_EACH(t, conv, e) {
    size_t role = ag__wt_get(t, e, "role");
    if (!ag__wt_is(t, role, AG__JT_STR))
      return 0;
    if (ag__wt_eq(t, role, "user") || start == 0)
      start = e, n_steps = n_calls = 0;
    if (ag__wt_eq(t, role, "assistant")) {
      n_steps++;
      n_calls += ag__wt_count(t, ag__wt_get(t, e, "tool_calls"));
    }
  }
  if (k->begin(k->user, n_steps, n_calls) < 0)
    return -1;
  if (n_steps == 0)
    return 1; /* nothing replied yet: nothing to replay */
  size_t end = ag__jcs_tok_next(t->j, conv);
  for (size_t m = start; m < end; m = ag__jcs_tok_next(t->j, m)) {
    const size_t role = ag__wt_get(t, m, "role");
    bool ok;
    if (ag__wt_get(t, m, "usage") != 0)
      ok = false;
    else if (ag__wt_eq(t, role, "assistant"))
      ok = tape_reply(t, m, k);
    else if (ag__wt_eq(t, role, "tool"))
      ok = tape_result(t, m, k);
    else if (ag__wt_eq(t, role, "user"))
      ok = m == start;
    else
      ok = ag__wt_eq(t, role, "system") || ag__wt_eq(t, role, "developer");
    if (!ok)
      return 0;
  }
  return 1;
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
    .reply_form = chat_reply_form,
    .stop_body = chat_stop_body,
    .id_prefix = "chatcmpl-agentguard-",
    .conv_expect = "an array",
    .otel_provider = "openai",
    .otel_operation = "chat",
    .tape_turn = chat_tape_turn,
    .relay_event = chat_relay_event,
    .relay_release = chat_relay_release,
    .relay_stop = chat_relay_stop,
    .relay_tail = chat_relay_tail,
    .relay_error = chat_relay_error,
    .end_missing = "no finish_reason, no [DONE]",
    .nudge_messages = chat_nudge_messages,
    .strip_calls = chat_strip_calls,
    .whole_to_sse = chat_whole_to_sse,
};

const ag__wire *const ag__wire_all[] = {&ag__wire_chat,      &ag__wire_messages,
                                        &ag__wire_responses, &ag__wire_gemini,
                                        &ag__wire_ollama,    NULL};

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
