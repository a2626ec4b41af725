/*
 * tests/runtime/http_apis.c - the Anthropic, OpenAI Responses and Gemini
 * providers against the fake server (test_http_provider's cases; the
 * fixture is http_fixture.h's).
 */
#include "http_fixture.h"

/* ------------------------------------------------------------------------ */
/* Anthropic                                                                */
/* ------------------------------------------------------------------------ */

Test(http, anthropic_history_converted_and_reply_read) {
  serve_fixture("anthropic/message_tool_use.json", "application/json", 0, 0);
  ag_provider *p = provider("anthropic", false, edit_options);
  json_t *msgs = history(), *tl = tools();
  ag_reply r;
  ag_provider_error pe;
  cr_assert_eq(ask(p, msgs, tl, NULL, NULL, &r, &pe), AG_OK, "%s", pe.message);
  cr_expect_str_eq(r.text, "Let me read it — ok.");
  cr_assert_eq(r.n_calls, 1);
  cr_expect_str_eq(r.calls[0].id, "toolu_01A09q90qw90lq917835lq9");
  cr_expect_str_eq(r.calls[0].name, "read_file");
  cr_expect_str_eq(r.calls[0].arguments,
                   "{\"path\":\"notes.txt\",\"lines\":[1,5]}");
  cr_expect_str_eq(r.finish_reason, "tool_use");
  cr_expect(r.has_usage);
  cr_expect_eq(r.usage.prompt_tokens, 150);
  cr_expect_eq(r.usage.cached_tokens, 30);
  cr_expect_eq(r.usage.completion_tokens, 40);

  cr_expect_str_eq(S.last_url, "/v1/messages");
  cr_expect_str_eq(S.last_xkey, SECRET);
  cr_expect_null(S.last_auth);
  cr_expect_str_eq(S.last_version, "2023-06-01");
  json_error_t je;
  json_t *want = json_loads(
      "{\"model\":\"claude-sonnet-4-5\",\"max_tokens\":300,"
      "\"system\":\"You are terse.\",\"stream\":false,\"temperature\":0.25,"
      "\"seed\":7,\"user\":\"agentguard-test\","
      "\"tool_choice\":{\"type\":\"auto\",\"disable_parallel_tool_use\":true},"
      "\"tools\":[{\"name\":\"read_file\",\"description\":\"Read a file\","
      "\"input_schema\":{\"type\":\"object\",\"properties\":{\"path\":{"
      "\"type\":\"string\"}},\"required\":[\"path\"]}},"
      "{\"name\":\"list_dir\",\"input_schema\":{\"type\":\"object\"}}],"
      "\"messages\":["
      "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":"
      "\"Read notes.txt, then list src.\"}]},"
      "{\"role\":\"assistant\",\"content\":["
      "{\"type\":\"tool_use\",\"id\":\"call_1\",\"name\":\"read_file\","
      "\"input\":{\"path\":\"notes.txt\"}},"
      "{\"type\":\"tool_use\",\"id\":\"call_2\",\"name\":\"list_dir\","
      "\"input\":{}}]},"
      "{\"role\":\"user\",\"content\":["
      "{\"type\":\"tool_result\",\"tool_use_id\":\"call_1\",\"content\":"
      "\"milk, eggs\",\"is_error\":false},"
      "{\"type\":\"tool_result\",\"tool_use_id\":\"call_2\",\"content\":"
      "\"<error>\\ntool: list_dir\\ntype: validation\\n</error>\","
      "\"is_error\":true},"
      "{\"type\":\"text\",\"text\":\"The previous iteration failed.\"}]}]}",
      0, &je);
  cr_assert_not_null(want, "%s", je.text);
  json_t *b = sent_body();
  cr_expect(json_equal(b, want), "sent:\n%s", S.last_body);
  json_decref(b);
  json_decref(want);
  ag_reply_clear(&r);
  json_decref(msgs);
  json_decref(tl);
  ag_provider_free(p);
}

Test(http, anthropic_stream_text_and_tool_use) {
  serve_fixture("anthropic/stream_tool_use.sse", "text/event-stream", 5, 1);
  ag_provider *p = provider("anthropic", true, NULL);
  json_t *msgs = history(), *tl = tools();
  deltas d = {0};
  ag_reply r;
  ag_provider_error pe;
  cr_assert_eq(ask(p, msgs, tl, NULL, &d, &r, &pe), AG_OK, "%s", pe.message);
  cr_expect_str_eq(r.text, "Okay, checking the wéather 🌦 now.");
  cr_expect_str_eq(d.buf, r.text);
  cr_expect(!d.bad_utf8);
  cr_assert_eq(r.n_calls, 1);
  cr_expect_str_eq(r.calls[0].id, "toolu_01T1x1fJ34qAmk2tNTrN7Up6");
  cr_expect_str_eq(r.calls[0].name, "get_weather");
  cr_expect_str_eq(r.calls[0].arguments,
                   "{\"location\": \"San Francisco, CA\", \"unit\": "
                   "\"fahrenheit\"}");
  cr_expect_str_eq(r.finish_reason, "tool_use");
  cr_expect_eq(r.usage.prompt_tokens, 536);
  cr_expect_eq(r.usage.cached_tokens, 64);
  cr_expect_eq(r.usage.completion_tokens, 89);
  json_t *b = sent_body();
  cr_expect(json_is_true(json_object_get(b, "stream")));
  cr_expect_eq(json_integer_value(json_object_get(b, "max_tokens")), 4096);
  cr_expect(json_is_false(json_object_get(json_object_get(b, "tool_choice"),
                                          "disable_parallel_tool_use")));
  json_decref(b);
  ag_reply_clear(&r);
  json_decref(msgs);
  json_decref(tl);
  ag_provider_free(p);
}

/* ---- OpenAI Responses -------------------------------------------------- */

/* The input item of `items` with "type" (or, NULL, "role") `what`, at the
 * k-th place of its kind. */
static json_t *item_of(json_t *items, const char *key, const char *what,
                       int k) {
  size_t i;
  json_t *it;
  json_array_foreach(items, i, it) {
    const char *v = json_string_value(json_object_get(it, key));
    if (v != NULL && strcmp(v, what) == 0 && k-- == 0)
      return it;
  }
  return NULL;
}

Test(http, responses_history_converted_and_reply_read) {
  serve_fixture("responses/response_tool_calls.json", "application/json", 0, 0);
  ag_provider *p = provider("openai-responses", false, edit_options);
  json_t *msgs = history(), *tl = tools();
  ag_reply r;
  ag_provider_error pe;
  cr_assert_eq(ask(p, msgs, tl, NULL, NULL, &r, &pe), AG_OK, "%s", pe.message);
  cr_expect_str_eq(r.text, "Let me read it — ok.");
  cr_assert_eq(r.n_calls, 2);
  cr_expect_str_eq(r.calls[0].id, "call_abc");
  cr_expect_str_eq(r.calls[0].name, "read_file");
  cr_expect_str_eq(r.calls[0].arguments,
                   "{\"path\":\"notes.txt\",\"lines\":[1,5]}");
  cr_expect_str_eq(r.calls[1].name, "list_dir");
  cr_expect_str_eq(r.finish_reason, "tool_calls");
  cr_expect_eq(r.usage.prompt_tokens, 150);
  cr_expect_eq(r.usage.cached_tokens, 30);
  cr_expect_eq(r.usage.completion_tokens, 40);
  cr_expect_str_eq(S.last_url, "/v1/responses");
  cr_expect_str_eq(S.last_auth, "Bearer " SECRET);
  json_t *b = sent_body();
  cr_expect_str_eq(json_string_value(json_object_get(b, "model")),
                   "gpt-4o-mini");
  cr_expect(json_is_false(json_object_get(b, "store")), "%s", S.last_body);
  cr_expect(json_is_false(json_object_get(b, "stream")));
  cr_expect_eq(json_integer_value(json_object_get(b, "max_output_tokens")),
               300);
  cr_expect(json_is_false(json_object_get(b, "parallel_tool_calls")));
  cr_expect_eq(json_integer_value(json_object_get(b, "seed")), 7);
  json_t *in = json_object_get(b, "input");
  json_t *sys = item_of(in, "role", "system", 0);
  cr_expect_str_eq(json_string_value(json_object_get(sys, "content")),
                   "You are terse.");
  json_t *c1 = item_of(in, "type", "function_call", 0);
  cr_expect_str_eq(json_string_value(json_object_get(c1, "call_id")), "call_1");
  cr_expect_str_eq(json_string_value(json_object_get(c1, "arguments")),
                   "{\"path\":\"notes.txt\"}");
  json_t *o2 = item_of(in, "type", "function_call_output", 1);
  cr_expect_str_eq(json_string_value(json_object_get(o2, "call_id")), "call_2");
  cr_expect(strstr(json_string_value(json_object_get(o2, "output")),
                   "type: validation") != NULL,
            "%s", S.last_body);
  cr_expect_null(item_of(in, "role", "assistant", 0),
                 "an assistant turn of calls only has no message item");
  json_t *t0 = json_array_get(json_object_get(b, "tools"), 0);
  cr_expect_str_eq(json_string_value(json_object_get(t0, "type")), "function");
  cr_expect_str_eq(json_string_value(json_object_get(t0, "name")), "read_file");
  cr_expect(json_is_object(json_object_get(t0, "parameters")));
  json_decref(b);
  ag_reply_clear(&r);
  json_decref(msgs);
  json_decref(tl);
  ag_provider_free(p);
}

Test(http, responses_stream_text_and_function_call) {
  serve_fixture("responses/stream_tool_call.sse", "text/event-stream", 7, 1);
  ag_provider *p = provider("openai-responses", true, NULL);
  json_t *msgs = history(), *tl = tools();
  deltas d = {0};
  ag_reply r;
  ag_provider_error pe;
  cr_assert_eq(ask(p, msgs, tl, NULL, &d, &r, &pe), AG_OK, "%s", pe.message);
  cr_expect_str_eq(r.text, "Okay, checking the wéather 🌦 now.");
  cr_expect_str_eq(d.buf, r.text);
  cr_expect(!d.bad_utf8);
  cr_assert_eq(r.n_calls, 1);
  cr_expect_str_eq(r.calls[0].id, "call_w1");
  cr_expect_str_eq(r.calls[0].name, "get_weather");
  cr_expect_str_eq(r.calls[0].arguments,
                   "{\"location\": \"San Francisco, CA\", \"unit\": "
                   "\"fahrenheit\"}");
  cr_expect_str_eq(r.finish_reason, "tool_calls");
  cr_expect_eq(r.usage.prompt_tokens, 536);
  cr_expect_eq(r.usage.cached_tokens, 64);
  cr_expect_eq(r.usage.completion_tokens, 89);
  json_t *b = sent_body();
  cr_expect(json_is_true(json_object_get(b, "stream")));
  json_decref(b);
  ag_reply_clear(&r);
  json_decref(msgs);
  json_decref(tl);
  ag_provider_free(p);
}

Test(http, responses_stream_cut_before_completed_is_transient) {
  serve_fixture("responses/fault_stream_cut.sse", "text/event-stream", 0, 0);
  ag_provider *p = provider("openai-responses", true, NULL);
  json_t *msgs = history();
  ag_reply r;
  ag_provider_error pe;
  cr_assert_eq(ask(p, msgs, NULL, NULL, NULL, &r, &pe), AG_EPROVIDER);
  cr_expect(pe.transient);
  cr_expect(strstr(pe.message, "response.completed") != NULL, "%s", pe.message);
  ag_reply_clear(&r);
  json_decref(msgs);
  ag_provider_free(p);
}

Test(http, gemini_history_converted_and_reply_read) {
  serve_fixture("gemini/response_tool_calls.json", "application/json", 0, 0);
  ag_provider *p = provider("gemini", false, edit_options);
  json_t *msgs = history(), *tl = tools();
  ag_reply r;
  ag_provider_error pe;
  cr_assert_eq(ask(p, msgs, tl, NULL, NULL, &r, &pe), AG_OK, "%s", pe.message);
  cr_expect_str_eq(r.text, "Let me read it — ok.", "thoughts left out");
  cr_assert_eq(r.n_calls, 2);
  cr_expect_str_eq(r.calls[0].id, "fc_abc");
  cr_expect_str_eq(r.calls[0].name, "read_file");
  cr_expect_str_eq(r.calls[0].arguments,
                   "{\"path\":\"notes.txt\",\"lines\":[1,5]}");
  cr_expect_str_eq(r.calls[1].id, "gemini_call_1", "an id made from its slot");
  cr_expect_str_eq(r.calls[1].name, "list_dir");
  cr_expect_str_eq(r.finish_reason, "tool_calls");
  cr_expect_eq(r.usage.prompt_tokens, 150);
  cr_expect_eq(r.usage.cached_tokens, 30);
  cr_expect_eq(r.usage.completion_tokens, 40);
  cr_expect_str_eq(S.last_url,
                   "/v1beta/models/gemini-2.5-flash:generateContent");
  cr_expect_str_eq(S.last_xkey, SECRET, "the key in x-goog-api-key");
  cr_expect_null(S.last_auth);
  json_t *b = sent_body();
  cr_expect_null(json_object_get(b, "model"), "the model is in the path");
  json_t *gen = json_object_get(b, "generationConfig");
  cr_expect_eq(json_integer_value(json_object_get(gen, "maxOutputTokens")),
               300);
  cr_expect_eq(json_integer_value(json_object_get(b, "seed")), 7);
  json_t *sys = json_object_get(b, "systemInstruction");
  cr_expect_str_eq(
      json_string_value(json_object_get(
          json_array_get(json_object_get(sys, "parts"), 0), "text")),
      "You are terse.");
  json_t *contents = json_object_get(b, "contents");
  json_t *model = json_array_get(contents, 1);
  cr_expect_str_eq(json_string_value(json_object_get(model, "role")), "model");
  json_t *fc = json_object_get(
      json_array_get(json_object_get(model, "parts"), 0), "functionCall");
  cr_expect_str_eq(json_string_value(json_object_get(fc, "id")), "call_1");
  cr_expect_str_eq(
      json_string_value(json_object_get(json_object_get(fc, "args"), "path")),
      "notes.txt");
  fc = json_object_get(json_array_get(json_object_get(model, "parts"), 1),
                       "functionCall");
  cr_expect_str_eq(
      json_string_value(json_object_get(json_object_get(fc, "args"), "input")),
      "{bad json", "arguments that are not JSON kept as text");
  json_t *answers = json_array_get(contents, 2);
  cr_expect_str_eq(json_string_value(json_object_get(answers, "role")), "user");
  json_t *fr = json_object_get(
      json_array_get(json_object_get(answers, "parts"), 1), "functionResponse");
  cr_expect_str_eq(json_string_value(json_object_get(fr, "id")), "call_2");
  cr_expect_str_eq(json_string_value(json_object_get(fr, "name")), "list_dir",
                   "the name of the call it answers");
  json_t *decl = json_array_get(
      json_object_get(json_array_get(json_object_get(b, "tools"), 0),
                      "functionDeclarations"),
      0);
  cr_expect_str_eq(json_string_value(json_object_get(decl, "name")),
                   "read_file");
  cr_expect(json_is_object(json_object_get(decl, "parametersJsonSchema")));
  json_decref(b);
  ag_reply_clear(&r);
  json_decref(msgs);
  json_decref(tl);
  ag_provider_free(p);
}

/* Ollama's /api/chat: never streamed (its streams are lines of JSON, not
 * events), the calls' arguments as objects, a tool message named after
 * its call; the reply's thinking left out, a call without an id named by
 * its slot. */
Test(http, ollama_history_converted_and_reply_read) {
  serve_fixture("ollama/response_tool_calls.json", "application/json", 0, 0);
  ag_provider *p = provider("ollama", true, edit_options);
  json_t *msgs = history(), *tl = tools();
  ag_reply r;
  ag_provider_error pe;
  cr_assert_eq(ask(p, msgs, tl, NULL, NULL, &r, &pe), AG_OK, "%s", pe.message);
  cr_expect_str_eq(r.text, "Let me read it.", "thinking left out");
  cr_assert_eq(r.n_calls, 2);
  cr_expect_str_eq(r.calls[0].id, "call_x1");
  cr_expect_str_eq(r.calls[0].name, "read_file");
  cr_expect_str_eq(r.calls[0].arguments,
                   "{\"path\":\"notes.txt\",\"lines\":[1,5]}");
  cr_expect_str_eq(r.calls[1].id, "ollama_call_1", "an id made from its slot");
  cr_expect_str_eq(r.calls[1].arguments, "{}");
  cr_expect_str_eq(r.finish_reason, "tool_calls");
  cr_expect_eq(r.usage.prompt_tokens, 150);
  cr_expect_eq(r.usage.completion_tokens, 40);
  cr_expect_str_eq(S.last_url, "/api/chat");
  json_t *b = sent_body();
  cr_expect_str_eq(json_string_value(json_object_get(b, "model")), "qwen3:8b");
  cr_expect(json_is_false(json_object_get(b, "stream")),
            "asked whole even when streaming is on");
  json_t *opts = json_object_get(b, "options");
  cr_expect_eq(json_integer_value(json_object_get(opts, "num_predict")), 300);
  cr_expect_eq(json_integer_value(json_object_get(b, "seed")), 7);
  json_t *m = json_object_get(b, "messages");
  cr_expect_str_eq(
      json_string_value(json_object_get(json_array_get(m, 0), "role")),
      "system");
  json_t *calls = json_object_get(json_array_get(m, 2), "tool_calls");
  json_t *fn = json_object_get(json_array_get(calls, 0), "function");
  cr_expect_str_eq(json_string_value(json_object_get(
                       json_object_get(fn, "arguments"), "path")),
                   "notes.txt", "arguments as an object");
  fn = json_object_get(json_array_get(calls, 1), "function");
  cr_expect_str_eq(json_string_value(json_object_get(
                       json_object_get(fn, "arguments"), "input")),
                   "{bad json", "arguments that are not JSON kept as text");
  cr_expect_str_eq(
      json_string_value(json_object_get(json_array_get(m, 4), "tool_name")),
      "list_dir", "a tool message named after its call");
  cr_expect(json_is_array(json_object_get(b, "tools")));
  json_decref(b);
  ag_reply_clear(&r);
  json_decref(msgs);
  json_decref(tl);
  ag_provider_free(p);
}

Test(http, gemini_stream_text_and_function_call) {
  serve_fixture("gemini/stream_tool_call.sse", "text/event-stream", 7, 1);
  ag_provider *p = provider("gemini", true, NULL);
  json_t *msgs = history(), *tl = tools();
  deltas d = {0};
  ag_reply r;
  ag_provider_error pe;
  cr_assert_eq(ask(p, msgs, tl, NULL, &d, &r, &pe), AG_OK, "%s", pe.message);
  cr_expect_str_eq(r.text, "Okay, checking the wéather 🌦 now.");
  cr_expect_str_eq(d.buf, r.text);
  cr_expect(!d.bad_utf8);
  cr_assert_eq(r.n_calls, 1);
  cr_expect_str_eq(r.calls[0].name, "get_weather");
  cr_expect_str_eq(r.calls[0].arguments,
                   "{\"location\":\"San Francisco, CA\",\"unit\":"
                   "\"fahrenheit\"}");
  cr_expect_str_eq(r.finish_reason, "tool_calls");
  cr_expect_eq(r.usage.prompt_tokens, 536);
  cr_expect_eq(r.usage.cached_tokens, 64);
  cr_expect_eq(r.usage.completion_tokens, 89);
  cr_expect_str_eq(S.last_url,
                   "/v1beta/models/gemini-2.5-flash:streamGenerateContent");
  cr_expect_str_eq(S.last_alt, "sse");
  ag_reply_clear(&r);
  json_decref(msgs);
  json_decref(tl);
  ag_provider_free(p);
}

Test(http, gemini_stream_cut_before_finish_is_transient) {
  serve_fixture("gemini/fault_stream_cut.sse", "text/event-stream", 0, 0);
  ag_provider *p = provider("gemini", true, NULL);
  json_t *msgs = history();
  ag_reply r;
  ag_provider_error pe;
  cr_assert_eq(ask(p, msgs, NULL, NULL, NULL, &r, &pe), AG_EPROVIDER);
  cr_expect(pe.transient);
  cr_expect(strstr(pe.message, "finishReason") != NULL, "%s", pe.message);
  ag_reply_clear(&r);
  json_decref(msgs);
  ag_provider_free(p);
}

Test(http, anthropic_stream_error_event_overloaded) {
  serve_fixture("anthropic/fault_stream_error.sse", "text/event-stream", 0, 0);
  ag_provider *p = provider("anthropic", true, NULL);
  json_t *msgs = history();
  ag_reply r;
  ag_provider_error pe;
  cr_assert_eq(ask(p, msgs, NULL, NULL, NULL, &r, &pe), AG_EPROVIDER);
  cr_expect(pe.transient);
  cr_expect_eq(pe.http_status, 529);
  cr_expect(strstr(pe.message, "Overloaded (type overloaded_error)") != NULL,
            "%s", pe.message);
  json_decref(msgs);
  ag_provider_free(p);
}

/* An input_json_delta must follow its tool_use block's start: one for a
 * block never started (past every call slot made so far) and one for a
 * text block are the provider's errors, named, not arguments of some
 * call. */
Test(http, anthropic_args_for_a_block_that_is_no_tool_use) {
  static const char *const bodies[] = {
      /* block 7, never started, after a tool_use at 0 */
      "event: content_block_start\ndata: {\"type\":\"content_block_start\","
      "\"index\":0,\"content_block\":{\"type\":\"tool_use\",\"id\":"
      "\"t1\",\"name\":\"read\",\"input\":{}}}\n\n"
      "event: content_block_delta\ndata: {\"type\":\"content_block_delta\","
      "\"index\":7,\"delta\":{\"type\":\"input_json_delta\","
      "\"partial_json\":\"{}\"}}\n\n",
      /* block 0 is text, block 1 a tool_use (the slot of 0 made, unused) */
      "event: content_block_start\ndata: {\"type\":\"content_block_start\","
      "\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}"
      "\n\nevent: content_block_start\ndata: {\"type\":"
      "\"content_block_start\",\"index\":1,\"content_block\":{\"type\":"
      "\"tool_use\",\"id\":\"t1\",\"name\":\"read\",\"input\":{}}}\n\n"
      "event: content_block_delta\ndata: {\"type\":"
      "\"content_block_delta\",\"index\":0,\"delta\":{\"type\":"
      "\"input_json_delta\",\"partial_json\":\"{}\"}}\n\n"};
  static const char *const named[] = {"block 7", "block 0"};
  for (int i = 0; i < 2; i++) {
    serve_text(200, "text/event-stream", bodies[i]);
    ag_provider *p = provider("anthropic", true, NULL);
    json_t *msgs = history();
    ag_reply r;
    ag_provider_error pe;
    cr_assert_eq(ask(p, msgs, NULL, NULL, NULL, &r, &pe), AG_EPROVIDER,
                 "body %d", i);
    cr_expect(strstr(pe.message, "not a tool_use block") != NULL &&
                  strstr(pe.message, named[i]) != NULL,
              "body %d: %s", i, pe.message);
    json_decref(msgs);
    ag_provider_free(p);
  }
}

Test(http, anthropic_529_error_body) {
  serve_text(529, "application/json",
             "{\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\","
             "\"message\":\"Overloaded\"},\"request_id\":\"req_1\"}");
  ag_provider *p = provider("anthropic", true, NULL);
  json_t *msgs = history();
  ag_reply r;
  ag_provider_error pe;
  cr_assert_eq(ask(p, msgs, NULL, NULL, NULL, &r, &pe), AG_EPROVIDER);
  cr_expect(pe.transient);
  cr_expect_eq(pe.http_status, 529);
  cr_expect_str_eq(pe.message, "HTTP 529 from 127.0.0.1: Overloaded (type "
                               "overloaded_error)");
  cr_expect(strstr(pe.details, "req_1") != NULL);
  json_decref(msgs);
  ag_provider_free(p);
}
