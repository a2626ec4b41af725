/*
 * proxy_apis.c - the proxy in front of every API besides Chat Completions:
 * Anthropic Messages, OpenAI Responses, Gemini; and its command line
 * (test_proxy's cases; the fake upstream, the proxy under test and the
 * client are proxy_fixture.h's).
 */
#include "proxy_fixture.h"

/* ---- Anthropic Messages (/v1/messages) --------------------------------- */

static json_t *text_of_message(const resp *r) {
  json_t *j = json_loads(r->body, 0, NULL);
  cr_assert_not_null(j, "not JSON: %s", r->body);
  cr_expect_str_eq(json_string_value(json_object_get(j, "type")), "message");
  return j;
}

Test(proxy, anthropic_allowed_reply_is_forwarded) {
  canned_message_call("{\"path\":\"b\"}");
  char *body = messages_conv(1, "{\"path\":\"a\"}", "text", false, false);
  resp *r = call(P, "POST", "/v1/messages", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect_str_eq(r->body, U.replies[0].body);
  cr_expect_str_empty(r->stop);
  free(body);
  free(r);
}

Test(proxy, anthropic_repeated_call_is_replaced) {
  canned_message_call("{\"path\":\"a\"}");
  char *body = messages_conv(2, "{\"path\":\"a\"}", "text", false, false);
  resp *r = call(P, "POST", "/v1/messages", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect_str_eq(r->stop, "identical_calls");
  json_t *j = text_of_message(r);
  json_t *content = json_object_get(j, "content");
  cr_expect_eq(json_array_size(content), 1);
  cr_expect_str_eq(
      json_string_value(json_object_get(json_array_get(content, 0), "type")),
      "text");
  cr_expect(strstr(json_string_value(
                       json_object_get(json_array_get(content, 0), "text")),
                   "agentguard stopped this turn (identical_calls)") != NULL);
  cr_expect_str_eq(json_string_value(json_object_get(j, "stop_reason")),
                   "end_turn");
  json_decref(j);
  free(body);
  free(r);
}

Test(proxy, anthropic_replayed_errors_stop) {
  ag_proxy_stop(P);
  ag_config c = test_cfg();
  c.loop.identical_call_limit = 0;
  P = proxy_with(c, 0, NULL);
  char *body =
      messages_conv(3, "{\"path\":\"x\"}", "no such file", true, false);
  resp *r = call(P, "POST", "/v1/messages", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect_eq(n_upstream(), 0);
  cr_expect_str_eq(r->stop, "consecutive_errors");
  json_decref(text_of_message(r));
  free(body);
  free(r);
}

Test(proxy, anthropic_nudge_answers_with_tool_result) {
  ag_proxy_stop(P);
  ag_config c = test_cfg();
  c.loop.nudge_before_stop = true;
  P = proxy_with(c, 0, NULL);
  canned_message_call("{\"path\":\"a\"}");
  canned_add(200, "{\"id\":\"msg_2\",\"type\":\"message\",\"role\":"
                  "\"assistant\",\"model\":\"claude\",\"content\":[{\"type\":"
                  "\"text\",\"text\":\"Done.\"}],\"stop_reason\":\"end_turn\","
                  "\"usage\":{\"input_tokens\":1,\"output_tokens\":1}}");
  char *body = messages_conv(2, "{\"path\":\"a\"}", "text", false, false);
  resp *r = call(P, "POST", "/v1/messages", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect_str_eq(r->body, U.replies[1].body);
  cr_assert_eq(n_upstream(), 2);
  json_t *sent = json_loads(U.reqs[1].body, 0, NULL);
  json_t *msgs = json_object_get(sent, "messages");
  json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
  json_t *blk = json_array_get(json_object_get(last, "content"), 0);
  cr_expect_str_eq(json_string_value(json_object_get(blk, "type")),
                   "tool_result");
  cr_expect_str_eq(json_string_value(json_object_get(blk, "tool_use_id")),
                   "toolu_up");
  json_decref(sent);
  free(body);
  free(r);
}

/* An Anthropic stream: a text block "Let me read it.", then a tool_use
 * read(args) in two input_json_delta fragments, message_delta, stop. */
static void canned_message_stream(const char *args) {
  size_t half = strlen(args) / 2;
  json_t *a1 = json_stringn(args, half), *a2 = json_string(args + half);
  char *s1 = json_dumps(a1, JSON_ENCODE_ANY);
  char *s2 = json_dumps(a2, JSON_ENCODE_ANY);
  char *b = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&b, &n);
  fprintf(f,
          "event: message_start\ndata: {\"type\":\"message_start\","
          "\"message\":{\"id\":\"msg_s\",\"type\":\"message\",\"role\":"
          "\"assistant\",\"model\":\"claude\",\"content\":[],\"stop_reason\":"
          "null,\"usage\":{\"input_tokens\":10,\"output_tokens\":1}}}\n\n"
          "event: content_block_start\ndata: {\"type\":\"content_block_start\","
          "\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n"
          "event: ping\ndata: {\"type\":\"ping\"}\n\n"
          "event: content_block_delta\ndata: {\"type\":\"content_block_delta\","
          "\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Let me "
          "read it.\"}}\n\n"
          "event: content_block_stop\ndata: {\"type\":\"content_block_stop\","
          "\"index\":0}\n\n"
          "event: content_block_start\ndata: {\"type\":\"content_block_start\","
          "\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":"
          "\"toolu_s\",\"name\":\"read\",\"input\":{}}}\n\n"
          "event: content_block_delta\ndata: {\"type\":\"content_block_delta\","
          "\"index\":1,\"delta\":{\"type\":\"input_json_delta\","
          "\"partial_json\":%s}}\n\n"
          "event: content_block_delta\ndata: {\"type\":\"content_block_delta\","
          "\"index\":1,\"delta\":{\"type\":\"input_json_delta\","
          "\"partial_json\":%s}}\n\n"
          "event: content_block_stop\ndata: {\"type\":\"content_block_stop\","
          "\"index\":1}\n\n"
          "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":"
          "{\"stop_reason\":\"tool_use\",\"stop_sequence\":null},\"usage\":"
          "{\"output_tokens\":9}}\n\n"
          "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
          s1, s2);
  fclose(f);
  canned_add(200, b);
  free(b);
  free(s1);
  free(s2);
  json_decref(a1);
  json_decref(a2);
}

static void expect_in_order(const resp *r, const char *const *parts, size_t n) {
  const char *at = r->body;
  for (size_t i = 0; i < n; i++) {
    const char *f = strstr(at, parts[i]);
    cr_expect_not_null(f, "'%s' missing or out of order: %s", parts[i],
                       r->body);
    if (f == NULL)
      return;
    at = f + strlen(parts[i]);
  }
}

Test(proxy, anthropic_stream_relayed_then_calls_released) {
  canned_message_stream("{\"path\":\"b\"}");
  char *body = messages_conv(1, "{\"path\":\"a\"}", "text", false, true);
  resp *r = call(P, "POST", "/v1/messages", body, NULL);
  cr_expect_eq(r->status, 200);
  const char *order[] = {
      "event: message_start",       "Let me read it.",
      "event: content_block_start", "toolu_s",
      "input_json_delta",           "\"stop_reason\":\"tool_use\"",
      "event: message_stop"};
  expect_in_order(r, order, sizeof order / sizeof order[0]);
  json_t *sent = json_loads(U.reqs[0].body, 0, NULL);
  cr_expect(json_is_true(json_object_get(sent, "stream")), "relayed");
  json_decref(sent);
  free(body);
  free(r);
}

Test(proxy, anthropic_stream_repeated_call_replaced) {
  canned_message_stream("{\"path\":\"a\"}");
  char *body = messages_conv(2, "{\"path\":\"a\"}", "text", false, true);
  resp *r = call(P, "POST", "/v1/messages", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect(strstr(r->body, "toolu_s") == NULL, "the call is held: %s",
            r->body);
  const char *order[] = {"Let me read it.", "\"index\":1",
                         "agentguard stopped this turn (identical_calls)",
                         "\"stop_reason\":\"end_turn\"", "event: message_stop"};
  expect_in_order(r, order, sizeof order / sizeof order[0]);
  free(body);
  free(r);
}

Test(proxy, anthropic_stream_nudge_answers_with_tool_result) {
  ag_proxy_stop(P);
  ag_config c = test_cfg();
  c.loop.nudge_before_stop = true;
  P = proxy_with(c, 0, NULL);
  canned_message_stream("{\"path\":\"a\"}");
  canned_add(200, "{\"id\":\"msg_2\",\"type\":\"message\",\"role\":"
                  "\"assistant\",\"model\":\"claude\",\"content\":[{\"type\":"
                  "\"text\",\"text\":\"Done.\"}],\"stop_reason\":\"end_turn\","
                  "\"usage\":{\"input_tokens\":1,\"output_tokens\":1}}");
  char *body = messages_conv(2, "{\"path\":\"a\"}", "text", false, true);
  resp *r = call(P, "POST", "/v1/messages", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect(strstr(r->body, "toolu_s") == NULL, "the call is held: %s",
            r->body);
  const char *order[] = {"Let me read it.", "Done.",
                         "\"stop_reason\":\"end_turn\"", "event: message_stop"};
  expect_in_order(r, order, sizeof order / sizeof order[0]);
  cr_assert_eq(n_upstream(), 2);
  json_t *sent = json_loads(U.reqs[1].body, 0, NULL);
  cr_expect(json_is_false(json_object_get(sent, "stream")));
  json_t *msgs = json_object_get(sent, "messages");
  json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
  json_t *blk = json_array_get(json_object_get(last, "content"), 0);
  cr_expect_str_eq(json_string_value(json_object_get(blk, "type")),
                   "tool_result");
  cr_expect_str_eq(json_string_value(json_object_get(blk, "tool_use_id")),
                   "toolu_s");
  json_decref(sent);
  free(body);
  free(r);
}

/* Held events with an "index" the stream never opened (a message_delta
 * carrying one, far out of range or negative): passed on as they came,
 * never used to index the proxy's block table (this read past it and
 * crashed the proxy). */
Test(proxy, anthropic_stream_odd_index_on_a_held_event) {
  const char *idx[] = {"100000", "-1", "300"};
  for (size_t k = 0; k < sizeof idx / sizeof idx[0]; k++) {
    canned_reset();
    char b[1024];
    snprintf(b, sizeof b,
             "event: message_start\ndata: {\"type\":\"message_start\","
             "\"message\":{\"id\":\"msg_s\",\"type\":\"message\",\"role\":"
             "\"assistant\",\"model\":\"claude\",\"content\":[],"
             "\"stop_reason\":null,\"usage\":{\"input_tokens\":1,"
             "\"output_tokens\":1}}}\n\n"
             "event: content_block_start\ndata: {\"type\":"
             "\"content_block_start\",\"index\":0,\"content_block\":{"
             "\"type\":\"text\",\"text\":\"\"}}\n\n"
             "event: content_block_delta\ndata: {\"type\":"
             "\"content_block_delta\",\"index\":0,\"delta\":{\"type\":"
             "\"text_delta\",\"text\":\"Done.\"}}\n\n"
             "event: content_block_stop\ndata: {\"type\":"
             "\"content_block_stop\",\"index\":0}\n\n"
             "event: message_delta\ndata: {\"type\":\"message_delta\","
             "\"index\":%s,\"delta\":{\"stop_reason\":\"end_turn\"},"
             "\"usage\":{\"output_tokens\":2}}\n\n"
             "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
             idx[k]);
    canned_add(200, b);
    char *body = messages_conv(1, "{\"path\":\"a\"}", "text", false, true);
    resp *r = call(P, "POST", "/v1/messages", body, NULL);
    cr_expect_eq(r->status, 200);
    char want[64];
    snprintf(want, sizeof want, "\"index\":%s", idx[k]);
    const char *order[] = {"Done.", want, "\"stop_reason\":\"end_turn\"",
                           "event: message_stop"};
    expect_in_order(r, order, sizeof order / sizeof order[0]);
    free(body);
    free(r);
  }
}

Test(proxy, anthropic_stream_stop_before_request_is_events) {
  ag_proxy_stop(P);
  ag_config c = test_cfg();
  c.loop.identical_call_limit = 0;
  P = proxy_with(c, 0, NULL);
  char *body = messages_conv(3, "{\"path\":\"x\"}", "no such file", true, true);
  resp *r = call(P, "POST", "/v1/messages", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect_eq(n_upstream(), 0);
  cr_expect_str_eq(r->stop, "consecutive_errors");
  const char *order[] = {"event: message_start", "event: content_block_start",
                         "agentguard stopped this turn", "event: message_stop"};
  expect_in_order(r, order, sizeof order / sizeof order[0]);
  free(body);
  free(r);
}

Test(proxy, anthropic_errors_have_anthropic_shape) {
  resp *r = call(P, "POST", "/v1/messages", "{\"messages\":[", NULL);
  cr_expect_eq(r->status, 400);
  json_t *j = json_loads(r->body, 0, NULL);
  cr_expect_str_eq(json_string_value(json_object_get(j, "type")), "error");
  cr_expect_str_eq(
      json_string_value(json_object_get(json_object_get(j, "error"), "type")),
      "invalid_request_error");
  json_decref(j);
  free(r);
  r = call(P, "POST", "/v1/messages",
           "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", NULL);
  cr_expect_eq(r->status, 400);
  cr_expect(strstr(r->body, "messages[0].content") != NULL, "%s", r->body);
  free(r);
}

Test(proxy, decide_alone_matches_the_served_decision) {
  ag_config c = test_cfg();
  c.loop.identical_call_limit = 0;
  char *body = conversation(3, "read", "{\"path\":\"x\"}", "Error: nope");
  ag_verdict v;
  ag_error_t err;
  cr_expect_eq(ag_proxy_decide(&c, body, strlen(body), false, &v, &err),
               AG_STOP);
  cr_expect_eq(v.reason, AG_REASON_CONSECUTIVE_ERRORS);
  free(body);
  body = conversation(2, "read", "{\"path\":\"x\"}", "Error: nope");
  cr_expect_eq(ag_proxy_decide(&c, body, strlen(body), false, &v, &err),
               AG_ALLOW);
  free(body);
  cr_expect_eq(ag_proxy_decide(&c, "{", 1, false, &v, &err), -1);
  cr_expect_eq(err.code, AG_EJSON);
}

Test(proxy, error_context_goes_with_the_request_only) {
  ag_proxy_stop(P);
  ag_config c = test_cfg();
  c.errors.error_context = true;
  P = proxy_with(c, 0, NULL);
  canned_call(NULL, "It does not exist.");
  char *body =
      conversation(1, "read", "{\"path\":\"x\"}", "Error: no such file x");
  resp *r = call(P, "POST", "/v1/chat/completions", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_assert_eq(n_upstream(), 1);
  json_t *sent = json_loads(U.reqs[0].body, 0, NULL);
  json_t *msgs = json_object_get(sent, "messages");
  json_t *orig_req = json_loads(body, 0, NULL);
  json_t *orig = json_object_get(orig_req, "messages");
  cr_expect_eq(json_array_size(msgs), json_array_size(orig) + 1);
  json_decref(orig_req);
  json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
  cr_expect_str_eq(json_string_value(json_object_get(last, "role")), "user");
  cr_expect(strstr(json_string_value(json_object_get(last, "content")),
                   "no such file x") != NULL,
            "%s", U.reqs[0].body);
  json_decref(sent);
  free(body);
  free(r);
}

Test(proxy, escalation_asks_the_user) {
  ag_proxy_stop(P);
  ag_config c = test_cfg();
  c.loop.identical_call_limit = 0;
  c.errors.on_trip = AG_TRIP_ESCALATE;
  P = proxy_with(c, 0, NULL);
  char *body = conversation(3, "read", "{\"path\":\"x\"}", "Error: nope");
  resp *r = call(P, "POST", "/v1/chat/completions", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect_str_eq(r->stop, "consecutive_errors");
  json_t *m = message_of(r);
  cr_expect(strstr(json_string_value(json_object_get(m, "content")),
                   "needs you") != NULL,
            "%s", r->body);
  cr_expect_null(json_object_get(m, "tool_calls"));
  json_decref(m);
  free(body);
  free(r);
}

/* ---- the command line -----------------------------------------------------
 */

Test(proxy, cli_refuses_bad_options) {
  char err[4096];
  cr_expect_eq(cli("", err, sizeof err), 2);
  cr_expect(strstr(err, "--upstream URL is required") != NULL, "%s", err);
  cr_expect_eq(
      cli("--upstream http://127.0.0.1:1 --listen 0.0.0.0:0", err, sizeof err),
      2);
  cr_expect(strstr(err, "--client-key-env") != NULL, "%s", err);
  cr_expect_eq(
      cli("--upstream http://127.0.0.1:1 --listen nope", err, sizeof err), 2);
  cr_expect(strstr(err, "HOST:PORT") != NULL, "%s", err);
  cr_expect_eq(
      cli("--upstream http://127.0.0.1:1 --client-key-env AG_PROXY_TEST_UNSET",
          err, sizeof err),
      2);
  cr_expect(strstr(err, "AG_PROXY_TEST_UNSET") != NULL, "%s", err);
  cr_expect_eq(
      cli("--upstream http://127.0.0.1:1 --max-body -5", err, sizeof err), 2);
  cr_expect_eq(
      cli("--upstream http://127.0.0.1:1 --preset nosuch", err, sizeof err), 2);
  cr_expect_eq(cli("--upstream ftp://x", err, sizeof err), 2);
  cr_expect(strstr(err, "http://") != NULL, "%s", err);
  cr_expect_eq(
      cli("--upstream http://127.0.0.1:1 --header-timeout 0", err, sizeof err),
      2);
  cr_expect(strstr(err, "--header-timeout 0") != NULL, "%s", err);
  cr_expect_eq(cli("--upstream http://127.0.0.1:1 --max-connections 4 "
                   "--max-connections-per-client 9",
                   err, sizeof err),
               2);
  cr_expect(strstr(err, "--max-connections-per-client 9") != NULL, "%s", err);
}

Test(proxy, upstream_reply_of_wrong_shape_is_502) {
  canned_add(200, "{\"choices\":\"no\"}");
  char *body = conversation(0, "read", "{}", "");
  resp *r = call(P, "POST", "/v1/chat/completions", body, NULL);
  char code[64];
  cr_expect_eq(r->status, 502);
  cr_expect_str_eq(err_code(r, code, sizeof code), "upstream_bad_reply");
  cr_expect(strstr(r->body, "choices") != NULL, "%s", r->body);
  free(body);
  free(r);
}

/* ------------------------------------------------------------------------ */
/* OpenAI Responses (/v1/responses)                                         */
/* ------------------------------------------------------------------------ */

/* A Responses request: a developer message, a user message, then `n` calls
 * shell(args) each answered by `output` (reasoning items between, as Codex
 * sends them). Caller frees. */
static char *responses_conv(int n, const char *output, bool stream,
                            const char *extra_key, const char *extra_value) {
  json_t *items = json_pack("[{s:s, s:s}, {s:s, s:s, s:[{s:s, s:s}]}]", "role",
                            "developer", "content", "You are a coding agent.",
                            "type", "message", "role", "user", "content",
                            "type", "input_text", "text", "Fix the test.");
  for (int i = 0; i < n; i++) {
    char id[32];
    snprintf(id, sizeof id, "call_%d", i);
    json_array_append_new(items, json_pack("{s:s, s:s, s:[], s:s}", "type",
                                           "reasoning", "id", "rs_1", "summary",
                                           "encrypted_content", "opaque"));
    json_array_append_new(
        items, json_pack("{s:s, s:s, s:s, s:s}", "type", "function_call",
                         "call_id", id, "name", "shell", "arguments",
                         "{\"command\":[\"bash\",\"-lc\",\"make test\"]}"));
    json_array_append_new(items, json_pack("{s:s, s:s, s:s}", "type",
                                           "function_call_output", "call_id",
                                           id, "output", output));
  }
  json_t *o = json_pack("{s:s, s:o, s:b, s:b, s:[{s:s, s:s}]}", "model", "m",
                        "input", items, "stream", stream, "store", false,
                        "tools", "type", "function", "name", "shell");
  if (extra_key != NULL)
    json_object_set_new(o, extra_key, json_string(extra_value));
  char *t = json_dumps(o, JSON_COMPACT);
  json_decref(o);
  return t;
}

/* a malfunction (docs/errors.md): the command does not exist */
static const char *const codex_failed =
    "Exit code: 127\nWall time: 0.0 seconds\nOutput:\nbash: line 1: pytets: "
    "command not found";

Test(proxy, responses_replayed_errors_stop_with_a_response) {
  ag_proxy_stop(P);
  ag_config c = test_cfg();
  c.loop.identical_call_limit = 0;
  c.loop.repeated_result_limit = 0;
  P = proxy_with(c, 0, NULL);
  char *body = responses_conv(3, codex_failed, false, NULL, NULL);
  resp *r = call(P, "POST", "/v1/responses", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect_eq(n_upstream(), 0, "nothing goes upstream");
  cr_expect_str_eq(r->stop, "consecutive_errors");
  json_t *j = json_loads(r->body, 0, NULL);
  cr_assert_not_null(j, "%s", r->body);
  cr_expect_str_eq(json_string_value(json_object_get(j, "object")), "response");
  cr_expect_str_eq(json_string_value(json_object_get(j, "status")),
                   "completed");
  json_t *out = json_object_get(j, "output");
  cr_assert_eq(json_array_size(out), 1, "%s", r->body);
  json_t *part =
      json_array_get(json_object_get(json_array_get(out, 0), "content"), 0);
  cr_expect_str_eq(json_string_value(json_object_get(part, "type")),
                   "output_text");
  cr_expect(strstr(json_string_value(json_object_get(part, "text")),
                   "agentguard stopped this turn (consecutive_errors)") !=
            NULL);
  json_decref(j);
  free(body);
  free(r);
}

Test(proxy, responses_exit_code_zero_is_a_success) {
  /* the same three calls, each passing: no error counted */
  ag_proxy_stop(P);
  ag_config c = test_cfg();
  c.loop.identical_call_limit = 0;
  c.loop.repeated_result_limit = 0;
  c.loop.cycle_limit = 0;
  P = proxy_with(c, 0, NULL);
  canned_add(200, "{\"id\":\"resp_up\",\"object\":\"response\",\"output\":[]}");
  char *body =
      responses_conv(3, "Exit code: 0\nWall time: 0.1 seconds\nOutput:\nok",
                     false, NULL, NULL);
  resp *r = call(P, "POST", "/v1/responses", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect_eq(n_upstream(), 1);
  cr_expect_str_eq(r->body,
                   "{\"id\":\"resp_up\",\"object\":\"response\",\"output\":[]}",
                   "the upstream's reply as it came");
  cr_expect_str_eq(r->stop, "");
  free(body);
  free(r);
}

Test(proxy, responses_stream_stop_is_the_events_in_order) {
  ag_proxy_stop(P);
  ag_config c = test_cfg();
  c.loop.identical_call_limit = 0;
  c.loop.repeated_result_limit = 0;
  P = proxy_with(c, 0, NULL);
  char *body = responses_conv(3, "Process exited with code 2\nno rule", true,
                              NULL, NULL);
  resp *r = call(P, "POST", "/v1/responses", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect_eq(n_upstream(), 0);
  cr_expect_str_eq(r->stop, "consecutive_errors");
  const char *order[] = {
      "event: response.created",           "event: response.output_item.added",
      "event: response.output_text.delta", "agentguard stopped this turn",
      "event: response.output_item.done",  "event: response.completed"};
  expect_in_order(r, order, sizeof order / sizeof order[0]);
  /* every event's data names its own type and numbers in order from 0 */
  int seq = 0;
  for (const char *d = strstr(r->body, "data: "); d != NULL;
       d = strstr(d + 1, "data: ")) {
    const char *end = strchr(d, '\n');
    cr_assert_not_null(end);
    json_t *ev = json_loadb(d + 6, (size_t)(end - d - 6), 0, NULL);
    cr_assert_not_null(ev, "%.*s", (int)(end - d), d);
    cr_expect_eq(json_integer_value(json_object_get(ev, "sequence_number")),
                 seq);
    char name[96];
    snprintf(name, sizeof name, "event: %s\ndata: ",
             json_string_value(json_object_get(ev, "type")));
    cr_expect(d - r->body >= (long)strlen(name) - 6 &&
                  strncmp(d - strlen(name) + 6, name, strlen(name)) == 0,
              "event %d's name is not its type", seq);
    json_decref(ev);
    seq++;
  }
  cr_expect_eq(seq, 9);
  free(body);
  free(r);
}

Test(proxy, responses_allowed_goes_up_with_the_error_context) {
  ag_proxy_stop(P);
  ag_config c = test_cfg();
  c.loop.identical_call_limit = 0;
  P = proxy_with(c, 0, NULL);
  const char *up = "event: response.completed\ndata: {\"type\":\"response."
                   "completed\",\"sequence_number\":0,\"response\":{}}\n\n";
  canned_add(200, up);
  char *body = responses_conv(1, codex_failed, true, NULL, NULL);
  resp *r = call(P, "POST", "/v1/responses", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect_str_eq(r->body, up, "the stream relayed as it came");
  cr_assert_eq(n_upstream(), 1);
  json_t *sent = json_loads(U.reqs[0].body, 0, NULL);
  cr_assert_not_null(sent);
  json_t *in = json_object_get(sent, "input");
  json_t *last = json_array_get(in, json_array_size(in) - 1);
  cr_expect_str_eq(json_string_value(json_object_get(last, "role")), "user");
  cr_expect(strstr(json_string_value(json_object_get(last, "content")),
                   "pytets: command not found") != NULL,
            "the error context names the failure: %s", U.reqs[0].body);
  cr_expect_eq(json_array_size(in), 6, "the client's 5 items and one more");
  json_decref(sent);
  free(body);
  free(r);
}

Test(proxy, responses_bad_items_are_400_naming_the_item) {
  char code[64];
  resp *r = call(P, "POST", "/v1/responses",
                 "{\"model\":\"m\",\"tools\":[{\"type\":\"function\","
                 "\"name\":\"x\"}],\"input\":[{\"role\":\"user\",\"content\":"
                 "\"hi\"},{\"type\":\"function_call\",\"name\":\"x\"}]}",
                 NULL);
  cr_expect_eq(r->status, 400);
  cr_expect_str_eq(err_code(r, code, sizeof code), "invalid_request");
  cr_expect(strstr(r->body, "input[1]") != NULL, "%s", r->body);
  free(r);
  r = call(P, "POST", "/v1/responses",
           "{\"model\":\"m\",\"tools\":[{}],\"input\":7}", NULL);
  cr_expect_eq(r->status, 400);
  cr_expect(strstr(r->body, "input: expected a string or an array") != NULL,
            "%s", r->body);
  free(r);
  cr_expect_eq(n_upstream(), 0);
  /* a request without tools cannot make a call: relayed untouched */
  canned_add(200, "{\"object\":\"response\",\"output\":[]}");
  r = call(P, "POST", "/v1/responses",
           "{\"model\":\"m\",\"input\":[{\"type\":\"function_call\"}]}", NULL);
  cr_expect_eq(r->status, 200, "%s", r->body);
  cr_expect_eq(n_upstream(), 1);
  free(r);
}

/* The proxy's decision on random Responses conversations equals the
 * audit's reading of the same request body (one turn: the audit stops at
 * the first turn that trips, the proxy sees the last). */
Test(proxy, responses_decisions_equal_the_audits) {
  static const char *const names[] = {"shell", "apply_patch", "read"};
  static const char *const args[] = {"{\"p\":1}", "{\"p\":2}", "{\"q\":[1]}"};
  static const char *const outs[] = {"ok", "Exit code: 1\nOutput:\nboom",
                                     "Process exited with code 0\nfine",
                                     "Error: no such file"};
  ag_proxy_stop(P);
  ag_config cfg = test_cfg();
  cfg.loop.max_iterations = 0; /* the coming request never trips */
  cfg.loop.max_tokens_per_turn = 0;
  P = proxy_with(cfg, 0, NULL);
  ag_auditor *a = NULL;
  cr_assert_eq(ag_auditor_new(&a, &cfg, NULL, NULL), AG_OK);
  int stops = 0;
  for (int i = 0; i < 150; i++) {
    json_t *items = json_pack("[{s:s, s:s}]", "role", "user", "content", "go");
    int id = 0, rounds = 1 + (int)rnd(8);
    for (int r = 0; r < rounds; r++) {
      if (rnd(3) == 0)
        json_array_append_new(
            items, json_pack("{s:s, s:s, s:[{s:s, s:s}]}", "type", "message",
                             "role", "assistant", "content", "type",
                             "output_text", "text", "working"));
      unsigned nc = 1 + rnd(2);
      for (unsigned k = 0; k < nc; k++) {
        char cid[16];
        snprintf(cid, sizeof cid, "c%d", id + (int)k);
        json_array_append_new(items, json_pack("{s:s, s:s, s:s, s:s}", "type",
                                               "function_call", "call_id", cid,
                                               "name", names[rnd(3)],
                                               "arguments", args[rnd(3)]));
      }
      for (unsigned k = 0; k < nc; k++) {
        char cid[16];
        snprintf(cid, sizeof cid, "c%d", id + (int)k);
        json_array_append_new(
            items, json_pack("{s:s, s:s, s:s}", "type", "function_call_output",
                             "call_id", cid, "output", outs[rnd(4)]));
      }
      id += (int)nc;
    }
    json_t *req =
        json_pack("{s:s, s:o, s:[{s:s, s:s}]}", "model", "m", "input", items,
                  "tools", "type", "function", "name", "shell");
    char *body = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    ag_trajectory *t = NULL;
    ag_error_t err;
    cr_assert_eq(ag_trajectory_parse(&t, body, strlen(body), NULL, &err), AG_OK,
                 "%s", err.msg);
    ag_audit_finding f;
    cr_assert_eq(ag_auditor_run(a, t, &f, &err), AG_OK);
    ag_trajectory_free(t);
    canned_reset();
    if (!f.stop.stopped)
      canned_add(200, "{\"object\":\"response\",\"output\":[]}");
    resp *r = call(P, "POST", "/v1/responses", body, NULL);
    cr_expect_str_eq(r->stop,
                     f.stop.stopped ? ag_reason_name(f.stop.reason) : "",
                     "run %d: %s", i, body);
    stops += f.stop.stopped;
    free(r);
    free(body);
  }
  ag_auditor_free(a);
  cr_expect_gt(stops, 10, "the random turns exercise stops (%d)", stops);
}

/* ------------------------------------------------------------------------ */
/* Gemini (/v1beta/models/{model}:generateContent)                          */
/* ------------------------------------------------------------------------ */

#define GEMINI_PATH "/v1beta/models/gemini-2.5-pro:generateContent"
#define GEMINI_SSE "/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse"

/* A Gemini request as Gemini CLI sends it: a user content, then `n` rounds
 * of a model content calling run_shell_command (with an id when `ids`,
 * a thought part and a thoughtSignature beside it) answered by a user
 * content with its functionResponse `response` (JSON); tools offered when
 * `tools`. Caller frees. */
static char *gemini_conv(int n, const char *response, bool ids, bool tools) {
  json_t *contents = json_pack("[{s:s, s:[{s:s}]}]", "role", "user", "parts",
                               "text", "Fix the failing test.");
  for (int i = 0; i < n; i++) {
    json_t *fc = json_pack("{s:s, s:{s:s}}", "name", "run_shell_command",
                           "args", "command", "make test");
    json_t *fr = json_pack("{s:s, s:o}", "name", "run_shell_command",
                           "response", json_loads(response, 0, NULL));
    if (ids) {
      char id[32];
      snprintf(id, sizeof id, "run_shell_command-%d", i);
      json_object_set_new(fc, "id", json_string(id));
      json_object_set_new(fr, "id", json_string(id));
    }
    json_array_append_new(
        contents,
        json_pack("{s:s, s:[{s:s, s:b}, {s:o, s:s}]}", "role", "model", "parts",
                  "text", "Let me run the tests.", "thought", 1, "functionCall",
                  fc, "thoughtSignature", "c2lnbmF0dXJl"));
    json_array_append_new(contents,
                          json_pack("{s:s, s:[{s:o}]}", "role", "user", "parts",
                                    "functionResponse", fr));
  }
  json_t *o =
      json_pack("{s:o, s:{s:[{s:s}]}}", "contents", contents,
                "systemInstruction", "parts", "text", "You are Gemini CLI.");
  if (tools)
    json_object_set_new(o, "tools",
                        json_pack("[{s:[{s:s, s:{s:s}}]}]",
                                  "functionDeclarations", "name",
                                  "run_shell_command", "parametersJsonSchema",
                                  "type", "object"));
  char *t = json_dumps(o, JSON_COMPACT);
  json_decref(o);
  return t;
}

static const char *const gemini_failed =
    "{\"error\":\"Command failed: make test\\nExit Code: 2\"}";

/* The text of a GenerateContentResponse's first candidate's first part. */
static const char *gemini_text(json_t *j) {
  json_t *cand = json_array_get(json_object_get(j, "candidates"), 0);
  cr_expect_str_eq(json_string_value(json_object_get(cand, "finishReason")),
                   "STOP");
  json_t *content = json_object_get(cand, "content");
  cr_expect_str_eq(json_string_value(json_object_get(content, "role")),
                   "model");
  return json_string_value(json_object_get(
      json_array_get(json_object_get(content, "parts"), 0), "text"));
}

Test(proxy, gemini_errors_stop_with_a_generate_content_response) {
  ag_proxy_stop(P);
  ag_config c = test_cfg();
  c.loop.identical_call_limit = 0;
  c.loop.repeated_result_limit = 0;
  P = proxy_with(c, 0, NULL);
  char *body = gemini_conv(3, gemini_failed, true, true);
  resp *r = call(P, "POST", GEMINI_PATH, body, NULL);
  cr_expect_eq(r->status, 200, "%s", r->body);
  cr_expect_eq(n_upstream(), 0, "nothing goes upstream");
  cr_expect_str_eq(r->stop, "consecutive_errors");
  json_t *j = json_loads(r->body, 0, NULL);
  cr_assert_not_null(j, "%s", r->body);
  const char *t = gemini_text(j);
  cr_expect(t != NULL &&
                strstr(t, "agentguard stopped this turn (consecutive_errors)"),
            "%s", r->body);
  cr_expect_str_eq(json_string_value(json_object_get(j, "modelVersion")),
                   "gemini-2.5-pro", "the model named in the path");
  json_decref(j);
  free(body);
  free(r);
}

Test(proxy, gemini_identical_calls_without_ids_stop_a_stream) {
  /* Gemini CLI's loop: one harmless call, the same answer, again and
   * again; the calls carry no id, their responses are matched by name */
  char *body = gemini_conv(3, "{\"output\":\"On branch main\"}", false, true);
  resp *r = call(P, "POST", GEMINI_SSE, body, NULL);
  cr_expect_eq(r->status, 200, "%s", r->body);
  cr_expect_eq(n_upstream(), 0);
  cr_expect_str_eq(r->stop, "identical_calls");
  cr_assert(strncmp(r->body, "data: {", 7) == 0, "one SSE event: %s", r->body);
  cr_expect(strstr(r->body, "\r\n\r\n") == r->body + r->len - 4,
            "the event ends the body: %s", r->body);
  json_t *j = json_loadb(r->body + 6, r->len - 10, 0, NULL);
  cr_assert_not_null(j, "%s", r->body);
  const char *t = gemini_text(j);
  cr_expect(t != NULL && strstr(t, "identical_calls"), "%s", r->body);
  json_decref(j);
  free(body);
  free(r);
}

Test(proxy, gemini_stream_without_alt_sse_is_a_json_array) {
  char *body = gemini_conv(3, "{\"output\":\"On branch main\"}", true, true);
  resp *r =
      call(P, "POST", "/v1beta/models/gemini-2.5-pro:streamGenerateContent",
           body, NULL);
  cr_expect_eq(r->status, 200);
  json_t *j = json_loads(r->body, 0, NULL);
  cr_assert(json_is_array(j) && json_array_size(j) == 1, "%s", r->body);
  cr_expect(strstr(gemini_text(json_array_get(j, 0)), "identical_calls"));
  json_decref(j);
  free(body);
  free(r);
}

Test(proxy, gemini_without_tools_is_relayed_untouched) {
  /* Gemini CLI's routing call: the history, no tools, JSON asked back */
  char *body = gemini_conv(3, "{\"output\":\"On branch main\"}", true, false);
  const char *up = "{\"candidates\":[{\"content\":{\"role\":\"model\","
                   "\"parts\":[{\"text\":\"{\\\"model_choice\\\":\\\"flash\\\""
                   "}\"}]},\"finishReason\":\"STOP\"}]}";
  canned_add(200, up);
  resp *r = call(P, "POST", GEMINI_PATH, body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect_str_eq(r->body, up);
  cr_assert_eq(n_upstream(), 1);
  cr_expect_str_eq(U.reqs[0].body, body, "the body unchanged");
  free(body);
  free(r);
}

Test(proxy, gemini_allowed_goes_up_with_the_error_context) {
  ag_proxy_stop(P);
  ag_config c = test_cfg();
  c.loop.identical_call_limit = 0;
  P = proxy_with(c, 0, NULL);
  const char *up = "data: {\"candidates\":[{\"content\":{\"role\":\"model\","
                   "\"parts\":[{\"text\":\"ok\"}]},\"finishReason\":\"STOP\"}"
                   "]}\r\n\r\n";
  canned_add(200, up);
  char *body = gemini_conv(1, gemini_failed, true, true);
  resp *r = call(P, "POST", GEMINI_SSE, body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect_str_eq(r->body, up, "the stream relayed as it came");
  cr_assert_eq(n_upstream(), 1);
  cr_expect_str_eq(U.reqs[0].url,
                   "/v1/v1beta/models/gemini-2.5-pro:streamGenerateContent",
                   "the upstream's path (/v1 here), then the client's");
  cr_expect_str_eq(U.reqs[0].alt, "sse", "the query kept");
  json_t *sent = json_loads(U.reqs[0].body, 0, NULL);
  cr_assert_not_null(sent);
  json_t *contents = json_object_get(sent, "contents");
  cr_expect_eq(json_array_size(contents), 3, "no content added");
  json_t *parts = json_object_get(json_array_get(contents, 2), "parts");
  cr_assert_eq(json_array_size(parts), 2,
               "a text part beside the functionResponse: %s", U.reqs[0].body);
  cr_expect(strstr(json_string_value(
                       json_object_get(json_array_get(parts, 1), "text")),
                   "Exit Code: 2") != NULL,
            "the error context names the failure: %s", U.reqs[0].body);
  json_decref(sent);
  free(body);
  free(r);
}

Test(proxy, gemini_bad_contents_are_400_in_googles_shape) {
  resp *r = call(P, "POST", GEMINI_PATH,
                 "{\"tools\":[{\"functionDeclarations\":[{\"name\":\"x\"}]}],"
                 "\"contents\":[{\"role\":\"user\",\"parts\":[{\"text\":\"hi\""
                 "}]},{\"role\":\"model\",\"parts\":[{\"functionCall\":{"
                 "\"args\":{}}}]}]}",
                 NULL);
  cr_expect_eq(r->status, 400);
  json_t *j = json_loads(r->body, 0, NULL);
  json_t *e = json_object_get(j, "error");
  cr_expect_eq(json_integer_value(json_object_get(e, "code")), 400, "%s",
               r->body);
  cr_expect_str_eq(json_string_value(json_object_get(e, "status")),
                   "INVALID_ARGUMENT");
  cr_expect(strstr(json_string_value(json_object_get(e, "message")),
                   "contents[1].parts[0].functionCall") != NULL,
            "%s", r->body);
  json_decref(j);
  free(r);
  cr_expect_eq(n_upstream(), 0);
  /* another method of the models path (countTokens) is not guarded */
  canned_add(200, "{\"totalTokens\":3}");
  r = call(P, "POST", "/v1beta/models/gemini-2.5-pro:countTokens", "{}", NULL);
  cr_expect_eq(r->status, 200);
  cr_expect_eq(n_upstream(), 1);
  free(r);
}

/* The proxy's decision on random Gemini conversations (ids or none,
 * parallel calls answered in any order) equals the audit's reading of the
 * same request body. */
Test(proxy, gemini_decisions_equal_the_audits) {
  static const char *const names[] = {"run_shell_command", "read_file",
                                      "replace"};
  static const char *const args[] = {"{\"p\":1}", "{\"p\":2}", "{\"q\":[1]}"};
  static const char *const outs[] = {
      "{\"output\":\"ok\"}", "{\"error\":\"Exit Code: 1\"}",
      "{\"output\":\"fine\",\"llmContent\":[1]}", "{\"error\":{\"code\":7}}"};
  ag_proxy_stop(P);
  ag_config cfg = test_cfg();
  cfg.loop.max_iterations = 0;
  cfg.loop.max_tokens_per_turn = 0;
  P = proxy_with(cfg, 0, NULL);
  ag_auditor *a = NULL;
  cr_assert_eq(ag_auditor_new(&a, &cfg, NULL, NULL), AG_OK);
  int stops = 0;
  for (int i = 0; i < 150; i++) {
    json_t *contents =
        json_pack("[{s:s, s:[{s:s}]}]", "role", "user", "parts", "text", "go");
    int rounds = 1 + (int)rnd(8);
    bool ids = rnd(2) == 0;
    for (int r = 0; r < rounds; r++) {
      json_t *calls = json_array(), *resps = json_array();
      if (rnd(3) == 0)
        json_array_append_new(calls, json_pack("{s:s}", "text", "working"));
      unsigned nc = 1 + rnd(2);
      for (unsigned k = 0; k < nc; k++) {
        const char *name = names[rnd(3)];
        json_t *fc = json_pack("{s:s, s:o}", "name", name, "args",
                               json_loads(args[rnd(3)], 0, NULL));
        json_t *fr = json_pack("{s:s, s:o}", "name", name, "response",
                               json_loads(outs[rnd(4)], 0, NULL));
        if (ids) {
          char cid[32];
          snprintf(cid, sizeof cid, "c%d_%u", r, k);
          json_object_set_new(fc, "id", json_string(cid));
          json_object_set_new(fr, "id", json_string(cid));
        }
        json_array_append_new(calls, json_pack("{s:o}", "functionCall", fc));
        json_array_append_new(resps,
                              json_pack("{s:o}", "functionResponse", fr));
      }
      json_array_append_new(
          contents, json_pack("{s:s, s:o}", "role", "model", "parts", calls));
      json_array_append_new(
          contents, json_pack("{s:s, s:o}", "role", "user", "parts", resps));
    }
    json_t *req =
        json_pack("{s:o, s:[{s:[{s:s}]}]}", "contents", contents, "tools",
                  "functionDeclarations", "name", "run_shell_command");
    char *body = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    ag_trajectory *t = NULL;
    ag_error_t err;
    cr_assert_eq(ag_trajectory_parse(&t, body, strlen(body), NULL, &err), AG_OK,
                 "%s", err.msg);
    ag_audit_finding f;
    cr_assert_eq(ag_auditor_run(a, t, &f, &err), AG_OK);
    ag_trajectory_free(t);
    canned_reset();
    if (!f.stop.stopped)
      canned_add(200, "{\"candidates\":[]}");
    resp *r = call(P, "POST", GEMINI_PATH, body, NULL);
    cr_expect_str_eq(r->stop,
                     f.stop.stopped ? ag_reason_name(f.stop.reason) : "",
                     "run %d: %s", i, body);
    stops += f.stop.stopped;
    free(r);
    free(body);
  }
  ag_auditor_free(a);
  cr_expect_gt(stops, 10, "the random turns exercise stops (%d)", stops);
}

/* The reply is held and checked: the call that makes the limit (3 here)
 * never reaches the client; the stop comes in the client's form. */
Test(proxy, gemini_reply_with_the_limits_call_is_replaced) {
  char *body = gemini_conv(2, "{\"output\":\"On branch main\"}", true, true);
  canned_add(200,
             "data: {\"candidates\":[{\"content\":{\"role\":\"model\","
             "\"parts\":[{\"text\":\"Again.\"}]}}]}\r\n\r\n"
             "data: {\"candidates\":[{\"content\":{\"role\":\"model\","
             "\"parts\":[{\"functionCall\":{\"name\":\"run_shell_command\","
             "\"args\":{\"command\":\"make test\"}}}]},"
             "\"finishReason\":\"STOP\"}]}\r\n\r\n");
  resp *r = call(P, "POST", GEMINI_SSE, body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect_eq(n_upstream(), 1, "asked once");
  cr_expect_str_eq(r->stop, "identical_calls");
  cr_expect(strstr(r->body, "functionCall") == NULL, "%s", r->body);
  cr_expect(strncmp(r->body, "data: {", 7) == 0 &&
                strstr(r->body, "agentguard stopped this turn") != NULL,
            "%s", r->body);
  free(r);
  /* a different call in the reply passes as it came */
  canned_reset();
  const char *other = "[{\"candidates\":[{\"content\":{\"role\":\"model\","
                      "\"parts\":[{\"functionCall\":{\"name\":\"read_file\","
                      "\"args\":{\"path\":\"a\"}}}]},\"finishReason\":"
                      "\"STOP\"}]}]";
  canned_add(200, other);
  r = call(P, "POST", "/v1beta/models/gemini-2.5-pro:streamGenerateContent",
           body, NULL);
  cr_expect_str_eq(r->body, other);
  cr_expect_str_eq(r->stop, "");
  free(r);
  /* a reply that is not the API's: a 502 in Google's shape */
  canned_reset();
  canned_add(200, "{\"choices\":7}");
  r = call(P, "POST", GEMINI_PATH, body, NULL);
  cr_expect_eq(r->status, 200, "no candidates: nothing to check (%s)", r->body);
  free(r);
  canned_reset();
  canned_add(200, "[1,2");
  r = call(P, "POST", GEMINI_PATH, body, NULL);
  cr_expect_eq(r->status, 502, "%s", r->body);
  cr_expect(strstr(r->body, "not a Gemini response") != NULL, "%s", r->body);
  cr_expect(strstr(r->body, "\"status\":\"INTERNAL\"") != NULL, "%s", r->body);
  free(r);
  free(body);
}

Test(proxy, responses_reply_with_the_limits_call_is_replaced) {
  ag_proxy_stop(P);
  ag_config c = test_cfg();
  c.errors.max_consecutive_errors = 0;
  P = proxy_with(c, 0, NULL);
  char *body = responses_conv(2, "ok", false, NULL, NULL);
  canned_add(200,
             "{\"object\":\"response\",\"status\":\"completed\",\"output\":"
             "[{\"type\":\"function_call\",\"call_id\":\"c9\",\"name\":"
             "\"shell\",\"arguments\":\"{\\\"command\\\":[\\\"bash\\\","
             "\\\"-lc\\\",\\\"make test\\\"]}\"}]}");
  resp *r = call(P, "POST", "/v1/responses", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect_eq(n_upstream(), 1);
  cr_expect_str_eq(r->stop, "identical_calls");
  cr_expect(strstr(r->body, "function_call") == NULL, "%s", r->body);
  cr_expect(strstr(r->body, "\"object\":\"response\"") != NULL, "%s", r->body);
  free(r);
  free(body);
}

/* Chat Completions and Responses are guarded under any prefix: Azure
 * OpenAI's deployments and its /openai/responses, Gemini's
 * OpenAI-compatible path, a gateway's /openai/v1; the path (after the
 * upstream's base) and query go upstream as they came. A path that only looks
 * alike passes through. */
Test(proxy, chat_and_responses_under_any_prefix_are_guarded) {
  static const char *const chat_paths[] = {
      "/openai/deployments/gpt-4o/chat/completions?api-version=2024-10-21&q=az",
      "/v1beta/openai/chat/completions", "/openai/v1/chat/completions/"};
  char *body = conversation(2, "read", "{\"path\":\"a\"}", "text of a");
  canned_reset();
  for (int i = 0; i < 3; i++)
    canned_call("read", "{\"path\":\"a\"}");
  for (int i = 0; i < 3; i++) {
    resp *r = call(P, "POST", chat_paths[i], body, NULL);
    cr_expect_eq(r->status, 200, "%s: %s", chat_paths[i], r->body);
    cr_expect_str_eq(r->stop, "identical_calls", "%s", chat_paths[i]);
    free(r);
  }
  pthread_mutex_lock(&U.mu);
  cr_assert_eq(U.n_reqs, 3);
  /* U's base URL ends in /v1: the client's path is appended to it */
  cr_expect_str_eq(U.reqs[0].url,
                   "/v1/openai/deployments/gpt-4o/chat/completions");
  cr_expect_str_eq(U.reqs[0].query, "az");
  cr_expect_str_eq(U.reqs[1].url, "/v1/v1beta/openai/chat/completions");
  pthread_mutex_unlock(&U.mu);
  /* alike, not the same path: the reply comes back as the upstream sent it */
  static const char *const other_paths[] = {"/v1/xchat/completions",
                                            "/v1/chat/completions/x",
                                            "/v1/chat/completionsx"};
  for (int i = 0; i < 3; i++) {
    canned_reset();
    canned_call("read", "{\"path\":\"a\"}");
    resp *r = call(P, "POST", other_paths[i], body, NULL);
    cr_expect_eq(r->status, 200, "%s", other_paths[i]);
    cr_expect_str_empty(r->stop, "%s", other_paths[i]);
    cr_expect_str_eq(r->body, U.replies[0].body, "%s", other_paths[i]);
    free(r);
  }
  free(body);
  ag_proxy_stop(P);
  ag_config c = test_cfg();
  c.loop.identical_call_limit = 0;
  c.loop.repeated_result_limit = 0;
  P = proxy_with(c, 0, NULL);
  canned_reset();
  body = responses_conv(3, codex_failed, false, NULL, NULL);
  resp *r = call(P, "POST", "/openai/responses?api-version=2025-04-01-preview",
                 body, NULL);
  cr_expect_eq(r->status, 200, "%s", r->body);
  cr_expect_str_eq(r->stop, "consecutive_errors");
  cr_expect_eq(n_upstream(), 0, "nothing goes upstream");
  free(r);
  free(body);
}

/* Gemini on Vertex AI (/v1/projects/{p}/locations/{l}/publishers/google/
 * models/{model}:...) and under a gateway's prefix is guarded as the
 * Gemini API is; a model path that names no method, or another one,
 * passes through. */
Test(proxy, gemini_on_vertex_and_under_a_prefix_is_guarded) {
  /* the first two ask for SSE (alt=sse) */
  static const char *const paths[] = {
      "/v1/projects/p1/locations/us-central1/publishers/google/models/"
      "gemini-2.5-pro:streamGenerateContent?alt=sse",
      "/v1/projects/p1/locations/us-central1/endpoints/4812:"
      "streamGenerateContent?alt=sse",
      "/v1beta1/projects/p1/locations/global/publishers/google/models/"
      "gemini-2.5-pro:generateContent/",
      "/gemini/v1beta/models/gemini-2.5-pro:generateContent",
      "/v1beta/tunedModels/my-tuned-model:generateContent",
      /* an encoded ':' is routed as ':' by Google's servers */
      "/v1beta/models/gemini-2.5-pro%3AgenerateContent",
      "/v1beta/models/gemini-2.5-pro%3astreamGenerateContent"};
  size_t n_paths = sizeof paths / sizeof paths[0];
  char *body = gemini_conv(3, "{\"output\":\"On branch main\"}", false, true);
  for (size_t i = 0; i < n_paths; i++) {
    resp *r = call(P, "POST", paths[i], body, NULL);
    cr_expect_eq(r->status, 200, "%s: %s", paths[i], r->body);
    cr_expect_str_eq(r->stop, "identical_calls", "%s", paths[i]);
    cr_expect_eq(n_upstream(), 0, "%s", paths[i]);
    cr_expect_eq(strncmp(r->body, "data: {", 7) == 0, i < 2,
                 "an SSE event only for alt=sse: %s", r->body);
    free(r);
  }
  static const char *const other[] = {
      "/v1/projects/p1/locations/l/publishers/google/models/gemini-2.5-pro",
      "/v1beta/models/gemini-2.5-pro:countTokens",
      "/v1beta/xmodels/gemini-2.5-pro:generateContent",
      "/v1/projects/p1/locations/l/endpoints/4812:predict"};
  for (size_t i = 0; i < sizeof other / sizeof other[0]; i++) {
    canned_reset();
    canned_add(200, "{\"passed\":true}");
    resp *r = call(P, "POST", other[i], body, NULL);
    cr_expect_str_eq(r->body, "{\"passed\":true}", "%s", other[i]);
    cr_expect_str_empty(r->stop, "%s", other[i]);
    free(r);
  }
  free(body);
}

/* Claude on Vertex AI: .../publishers/anthropic/models/{model}:rawPredict
 * and :streamRawPredict take a Messages body without "model" (it is in
 * the path) and with "anthropic_version"; guarded as /v1/messages is. A
 * Vertex path of another publisher's or another method passes through. */
Test(proxy, anthropic_on_vertex_is_guarded) {
  static const char *const base =
      "/v1/projects/p1/locations/us-east5/publishers/anthropic/models/"
      "claude-sonnet-4@20250514";
  char path[256];
  for (int v = 0; v < 3; v++) { /* rawPredict, streamed, ':' encoded */
    int stream = v == 1;
    char *conv = messages_conv(2, "{\"path\":\"a\"}", "text", false, stream);
    json_t *b = json_loads(conv, 0, NULL);
    free(conv);
    cr_assert_not_null(b);
    json_object_del(b, "model");
    json_object_set_new(b, "anthropic_version",
                        json_string("vertex-2023-10-16"));
    char *body = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    canned_reset();
    if (stream)
      canned_message_stream("{\"path\":\"a\"}");
    else
      canned_message_call("{\"path\":\"a\"}");
    snprintf(path, sizeof path, "%s%s%s", base, v == 2 ? "%3A" : ":",
             stream ? "streamRawPredict" : "rawPredict");
    resp *r = call(P, "POST", path, body, NULL);
    cr_expect_eq(r->status, 200, "%s: %s", path, r->body);
    if (!stream) /* a stream's stop is said in its text only */
      cr_expect_str_eq(r->stop, "identical_calls", "%s: %s", path, r->body);
    cr_expect(strstr(r->body,
                     "agentguard stopped this turn (identical_calls)") != NULL,
              "%s", r->body);
    cr_expect_eq(strncmp(r->body, "event: ", 7) == 0, stream,
                 "events when streamed: %s", r->body);
    free(r);
    if (stream) { /* another method passes through */
      canned_reset();
      canned_add(200, "{\"passed\":true}");
      snprintf(path, sizeof path, "%s:countTokens", base);
      r = call(P, "POST", path, body, NULL);
      cr_expect_str_eq(r->body, "{\"passed\":true}");
      free(r);
    }
    free(body);
  }
}
