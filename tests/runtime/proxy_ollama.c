/*
 * proxy_ollama.c - Ollama's own chat API (POST /api/chat) through the
 * proxy: decided on the request, its reply (whole, or a stream of JSON
 * lines, Ollama's default) held and checked (test_proxy's cases; the fake
 * upstream, the proxy under test and the client are proxy_fixture.h's).
 */
#include "proxy_fixture.h"

/* A conversation of n calls of read_file, each answered with `result`;
 * `named`: the tool messages say tool_name; `stream`: NULL (Ollama's
 * default, a stream), "true" or "false". */
static char *ollama_conv(int n, const char *result, bool named,
                         const char *stream) {
  json_t *m = json_pack("[{s:s, s:s}, {s:s, s:s}]", "role", "system", "content",
                        "You read files.", "role", "user", "content",
                        "What does notes.txt say?");
  for (int i = 0; i < n; i++) {
    json_array_append_new(
        m, json_pack("{s:s, s:s, s:[{s:{s:s, s:{s:s}}}]}", "role", "assistant",
                     "content", "", "tool_calls", "function", "name",
                     "read_file", "arguments", "path", "notes.txt"));
    json_t *t = json_pack("{s:s, s:s}", "role", "tool", "content", result);
    if (named)
      json_object_set_new(t, "tool_name", json_string("read_file"));
    json_array_append_new(m, t);
  }
  json_t *o =
      json_pack("{s:s, s:o, s:[{s:s, s:{s:s, s:{s:s}}}]}", "model", "qwen3:8b",
                "messages", m, "tools", "type", "function", "function", "name",
                "read_file", "parameters", "type", "object");
  if (stream != NULL)
    json_object_set_new(o, "stream", json_boolean(strcmp(stream, "true") == 0));
  char *t = json_dumps(o, JSON_COMPACT);
  json_decref(o);
  return t;
}

/* The upstream's reply: one call of read_file, whole or as three lines. */
static const char *const whole_call =
    "{\"model\":\"qwen3:8b\",\"created_at\":\"2026-11-29T10:00:00Z\","
    "\"message\":{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{"
    "\"function\":{\"name\":\"read_file\",\"arguments\":{\"path\":\"notes."
    "txt\"}}}]},\"done\":true,\"done_reason\":\"stop\"}";
static const char *const stream_call =
    "{\"model\":\"qwen3:8b\",\"created_at\":\"2026-11-29T10:00:00Z\","
    "\"message\":{\"role\":\"assistant\",\"content\":\"Reading. \"},"
    "\"done\":false}\n"
    "{\"model\":\"qwen3:8b\",\"created_at\":\"2026-11-29T10:00:00Z\","
    "\"message\":{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":[{"
    "\"function\":{\"name\":\"read_file\",\"arguments\":{\"path\":\"notes."
    "txt\"}}}]},\"done\":false}\n"
    "{\"model\":\"qwen3:8b\",\"created_at\":\"2026-11-29T10:00:00Z\","
    "\"message\":{\"role\":\"assistant\",\"content\":\"\"},\"done\":true,"
    "\"done_reason\":\"stop\",\"prompt_eval_count\":10,\"eval_count\":5}\n";

/* The lines of an NDJSON body, each parsed: the caller frees the array. */
static json_t *lines_of(const char *body) {
  json_t *a = json_array();
  for (const char *p = body; *p != '\0';) {
    const char *nl = strchr(p, '\n');
    size_t n = nl != NULL ? (size_t)(nl - p) : strlen(p);
    json_t *j = json_loadb(p, n, 0, NULL);
    cr_assert_not_null(j, "not a JSON line: %.*s", (int)n, p);
    json_array_append_new(a, j);
    p += n + (nl != NULL);
  }
  return a;
}

static const char *msg_text(const json_t *reply) {
  return json_string_value(
      json_object_get(json_object_get(reply, "message"), "content"));
}

Test(proxy, ollama_loop_stopped_before_the_request_in_its_own_forms) {
  /* test_cfg: the 3rd identical call stops; the turn here has 3 */
  for (int form = 0; form < 2; form++) {
    char *body = ollama_conv(3, "milk, eggs", form == 0, form ? "false" : NULL);
    resp *r = call(P, "POST", "/api/chat", body, NULL);
    cr_expect_eq(r->status, 200, "%s", r->body);
    cr_expect_str_eq(r->stop, "identical_calls");
    cr_expect_eq(n_upstream(), 0);
    if (form == 0) { /* streamed: a line of text, then done */
      json_t *l = lines_of(r->body);
      cr_assert_eq(json_array_size(l), 2, "%s", r->body);
      cr_expect(strstr(msg_text(json_array_get(l, 0)),
                       "agentguard stopped this turn (identical_calls)") !=
                NULL);
      cr_expect(json_is_true(json_object_get(json_array_get(l, 1), "done")));
      json_decref(l);
    } else {
      json_t *j = json_loads(r->body, 0, NULL);
      cr_assert_not_null(j, "%s", r->body);
      cr_expect(json_is_true(json_object_get(j, "done")));
      cr_expect_str_eq(json_string_value(json_object_get(j, "model")),
                       "qwen3:8b");
      cr_expect(strstr(msg_text(j), "agentguard stopped this turn") != NULL);
      json_decref(j);
    }
    free(body);
    free(r);
  }
}

/* A call that trips in the upstream's reply (the 3rd identical one) has
 * the reply replaced, in the form asked; a reply that passes comes back as
 * it came, a stream line for line. */
Test(proxy, ollama_reply_checked_and_passed_or_replaced) {
  canned_add(200, stream_call);
  char *body = ollama_conv(1, "milk, eggs", true, NULL);
  resp *r = call(P, "POST", "/api/chat", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect_str_empty(r->stop);
  cr_expect_str_eq(r->body, stream_call, "passed on as it came");
  free(body);
  free(r);
  for (int form = 0; form < 2; form++) {
    canned_reset();
    canned_add(200, form == 0 ? stream_call : whole_call);
    body = ollama_conv(2, "milk, eggs", false, form ? "false" : "true");
    r = call(P, "POST", "/api/chat", body, NULL);
    cr_expect_eq(r->status, 200, "%s", r->body);
    cr_expect_str_eq(r->stop, "identical_calls", "%s", r->body);
    cr_expect_eq(n_upstream(), 1);
    cr_expect(strstr(r->body, "tool_calls") == NULL, "the call held back");
    cr_expect(strstr(r->body, "agentguard stopped this turn") != NULL);
    free(body);
    free(r);
  }
}

/* Under a prefix (Open WebUI's /ollama/api/chat) too; a conversation the
 * proxy cannot read is a 400 in Ollama's shape; other paths pass. */
Test(proxy, ollama_under_a_prefix_and_its_errors) {
  char *body = ollama_conv(3, "milk, eggs", true, "false");
  resp *r = call(P, "POST", "/ollama/api/chat", body, NULL);
  cr_expect_str_eq(r->stop, "identical_calls");
  free(r);
  free(body);
  r = call(P, "POST", "/api/chat",
           "{\"model\":\"m\",\"messages\":[{\"content\":\"hi\"}],\"tools\":[{"
           "\"type\":\"function\",\"function\":{\"name\":\"f\"}}]}",
           NULL);
  cr_expect_eq(r->status, 400, "%s", r->body);
  json_t *j = json_loads(r->body, 0, NULL);
  cr_expect(json_is_string(json_object_get(j, "error")), "%s", r->body);
  cr_expect(strstr(r->body, "messages[0]") != NULL, "%s", r->body);
  json_decref(j);
  free(r);
  canned_add(200, "{\"models\":[]}");
  r = call(P, "GET", "/api/tags", NULL, NULL);
  cr_expect_str_eq(r->body, "{\"models\":[]}");
  free(r);
}

/* A tool_call_id that names no call (a client that dropped the calls' ids
 * but writes OpenAI's field) answers the oldest unanswered call, and a
 * result with no call left is not read: Ollama takes both, so does the
 * proxy. */
Test(proxy, ollama_results_pair_with_calls_as_ollama_takes_them) {
  char *body = ollama_conv(3, "milk, eggs", false, "false");
  json_t *o = json_loads(body, 0, NULL);
  free(body);
  json_t *m = json_object_get(o, "messages");
  size_t i;
  json_t *msg;
  json_array_foreach(m, i, msg) {
    if (strcmp(json_string_value(json_object_get(msg, "role")), "tool") == 0)
      json_object_set_new(msg, "tool_call_id", json_string("call_abc"));
  }
  /* one more result after the last one: no call left for it */
  json_array_append_new(
      m, json_pack("{s:s, s:s}", "role", "tool", "content", "extra"));
  body = json_dumps(o, JSON_COMPACT);
  json_decref(o);
  resp *r = call(P, "POST", "/api/chat", body, NULL);
  cr_expect_eq(r->status, 200, "%s", r->body);
  cr_expect_str_eq(r->stop, "identical_calls", "%s", r->body);
  free(body);
  free(r);
}
