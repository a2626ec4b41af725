/*
 * tests/runtime/test_http_provider.c - the HTTP providers against a fake
 * server on 127.0.0.1 that answers from tests/fixtures/ and records what
 * the client sent (http_fixture.h): OpenAI Chat Completions, whole and
 * streamed, and the faults; the other APIs' cases are in http_apis.c.
 *
 * Replies are delivered in small chunks (a few bytes, with a pause between
 * them) so that SSE lines, JSON values and multi-byte UTF-8 characters are
 * split across reads. Faults: statuses with Retry-After, error bodies,
 * garbage, a body cut off, a server that never answers, a trickle that
 * stops, connection refused, a redirect. Timing assertions are "well under
 * a second" style; the cancel test measures from the cancel to the return.
 *
 * Every request body the fake server receives is also written to
 * $AG_BINARY_DIR/http-requests/ for the schema check (tests/schema/).
 */
#include "http_fixture.h"

TestSuite(http, .init = server_start, .fini = server_stop, .timeout = 60);

/* ------------------------------------------------------------------------ */
/* OpenAI, not streamed                                                     */
/* ------------------------------------------------------------------------ */

Test(http, openai_text_usage_and_what_was_sent) {
  serve_fixture("openai/chat_text.json", "application/json", 0, 0);
  ag_provider *p = provider("openai", false, NULL);
  json_t *msgs = history();
  ag_reply r;
  ag_provider_error pe;
  cr_assert_eq(ask(p, msgs, NULL, NULL, NULL, &r, &pe), AG_OK, "%s",
               pe.message);
  cr_expect_str_eq(r.text, "Hello! Café ☕ 日本語 🙂");
  cr_expect_eq(r.n_calls, 0);
  cr_expect_str_eq(r.finish_reason, "stop");
  cr_expect_null(r.refusal);
  cr_expect(r.has_usage);
  cr_expect_eq(r.usage.prompt_tokens, 25);
  cr_expect_eq(r.usage.completion_tokens, 9);
  cr_expect_eq(r.usage.cached_tokens, 16);

  cr_expect_str_eq(S.last_url, "/v1/chat/completions");
  cr_expect_str_eq(S.last_auth, "Bearer " SECRET);
  cr_expect_str_eq(S.last_accept, "application/json");
  json_t *b = sent_body();
  cr_expect_str_eq(json_string_value(json_object_get(b, "model")),
                   "gpt-4o-mini");
  cr_expect(json_is_false(json_object_get(b, "stream")));
  cr_expect(json_equal(json_object_get(b, "messages"), msgs),
            "messages were changed: %s", S.last_body);
  /* No tools offered: no tool keys, and nothing unset is sent. */
  cr_expect_null(json_object_get(b, "tools"));
  cr_expect_null(json_object_get(b, "tool_choice"));
  cr_expect_null(json_object_get(b, "parallel_tool_calls"));
  cr_expect_null(json_object_get(b, "temperature"));
  cr_expect_null(json_object_get(b, "max_tokens"));
  cr_expect_null(json_object_get(b, "stream_options"));
  json_decref(b);
  ag_reply_clear(&r);
  json_decref(msgs);
  ag_provider_free(p);
}

Test(http, openai_tool_calls_and_options_sent) {
  serve_fixture("openai/chat_tool_calls.json",
                "application/json; charset=utf-8", 0, 0);
  ag_provider *p = provider("openai", false, edit_options);
  json_t *msgs = history(), *tl = tools();
  ag_reply r;
  ag_provider_error pe;
  cr_assert_eq(ask(p, msgs, tl, NULL, NULL, &r, &pe), AG_OK, "%s", pe.message);
  cr_expect_null(r.text);
  cr_assert_eq(r.n_calls, 2);
  cr_expect_str_eq(r.calls[0].id, "call_Rd1");
  cr_expect_str_eq(r.calls[0].name, "read_file");
  cr_expect_str_eq(r.calls[0].arguments,
                   "{\"path\": \"notes.txt\", \"start\": 1}");
  cr_expect_eq(r.calls[0].arguments_len, strlen(r.calls[0].arguments));
  cr_expect_str_eq(r.calls[1].id, "call_Ls2");
  cr_expect_str_eq(r.calls[1].arguments, "{\"path\":\"src\"}");
  cr_expect_str_eq(r.finish_reason, "tool_calls");
  cr_expect_eq(r.usage.cached_tokens, 0);

  json_t *b = sent_body();
  cr_expect(json_equal(json_object_get(b, "tools"), tl));
  cr_expect_str_eq(json_string_value(json_object_get(b, "tool_choice")),
                   "auto");
  cr_expect(json_is_false(json_object_get(b, "parallel_tool_calls")));
  cr_expect_float_eq(json_real_value(json_object_get(b, "temperature")), 0.25,
                     1e-9);
  cr_expect_eq(json_integer_value(json_object_get(b, "max_tokens")), 300);
  cr_expect_eq(json_integer_value(json_object_get(b, "seed")), 7);
  cr_expect_str_eq(json_string_value(json_object_get(b, "user")),
                   "agentguard-test");
  cr_expect_str_eq(S.last_custom, "yes");
  json_decref(b);
  ag_reply_clear(&r);
  json_decref(msgs);
  json_decref(tl);
  ag_provider_free(p);
}

Test(http, openai_refusal_is_the_text) {
  serve_fixture("openai/chat_refusal.json", "application/json", 0, 0);
  ag_provider *p = provider("openai", false, NULL);
  json_t *msgs = history();
  ag_reply r;
  ag_provider_error pe;
  cr_assert_eq(ask(p, msgs, NULL, NULL, NULL, &r, &pe), AG_OK, "%s",
               pe.message);
  cr_expect_str_eq(r.refusal, "I'm sorry, I can't help with that.");
  cr_expect_str_eq(r.text, "I'm sorry, I can't help with that.");
  ag_reply_clear(&r);
  json_decref(msgs);
  ag_provider_free(p);
}

/* A 2xx body that is not what the API promises: an error naming the byte,
 * never a crash; not retried. */
Test(http, openai_garbage_body_names_the_byte) {
  static const char *const bodies[] = {
      "{\"choices\": [ {\"message\": oops } ]}",
      "<html>Bad gateway</html>",
      "{\"id\": 1}",
      "{\"choices\": [{\"message\": {\"content\": 5}}]}",
      "{\"choices\": [{\"message\": {\"tool_calls\": [{\"function\": "
      "{\"arguments\": \"{}\"}}]}}]}",
      ""};
  ag_provider *p = provider("openai", false, NULL);
  json_t *msgs = history();
  for (size_t i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++) {
    serve_text(200, "application/json", bodies[i]);
    ag_reply r;
    ag_provider_error pe;
    cr_assert_eq(ask(p, msgs, NULL, NULL, NULL, &r, &pe), AG_EPROVIDER,
                 "body %zu accepted", i);
    cr_expect(!pe.transient, "body %zu: %s", i, pe.message);
    cr_expect(strstr(pe.message, "not what the API promises") != NULL,
              "body %zu: %s", i, pe.message);
    cr_expect_eq(pe.http_status, 200, "body %zu: %s", i, pe.message);
    no_secret(&pe);
  }
  serve_text(200, "application/json",
             "{\"choices\": [ {\"message\": oops } ]}");
  ag_reply r;
  ag_provider_error pe;
  cr_assert_eq(ask(p, msgs, NULL, NULL, NULL, &r, &pe), AG_EPROVIDER);
  cr_expect(strstr(pe.message, "at byte 30") != NULL, "%s", pe.message);
  json_decref(msgs);
  ag_provider_free(p);
}

/* ------------------------------------------------------------------------ */
/* OpenAI, streamed                                                         */
/* ------------------------------------------------------------------------ */

/* 3-byte writes split every multi-byte character of the fixture somewhere;
 * each delta must still be whole UTF-8 and all of them the reply's text. */
Test(http, openai_stream_text_split_everywhere) {
  serve_fixture("openai/stream_text.sse", "text/event-stream", 3, 1);
  ag_provider *p = provider("openai", true, NULL);
  json_t *msgs = history();
  deltas d = {0};
  ag_reply r;
  ag_provider_error pe;
  cr_assert_eq(ask(p, msgs, NULL, NULL, &d, &r, &pe), AG_OK, "%s", pe.message);
  cr_expect_str_eq(r.text, "Café ☕ 日本語 🙂 done.");
  cr_expect_str_eq(d.buf, r.text);
  cr_expect_eq(d.n, 4, "one delta per non-empty content fragment");
  cr_expect(!d.bad_utf8, "a delta ended inside a character");
  cr_expect_str_eq(r.finish_reason, "stop");
  cr_expect(r.has_usage);
  cr_expect_eq(r.usage.prompt_tokens, 21);
  cr_expect_eq(r.usage.completion_tokens, 7);

  cr_expect_str_eq(S.last_accept, "text/event-stream");
  json_t *b = sent_body();
  cr_expect(json_is_true(json_object_get(b, "stream")));
  cr_expect(json_is_true(
      json_object_get(json_object_get(b, "stream_options"), "include_usage")));
  json_decref(b);
  ag_reply_clear(&r);
  json_decref(msgs);
  ag_provider_free(p);
}

Test(http, openai_stream_tool_calls_from_fragments) {
  serve_fixture("openai/stream_tool_calls.sse", "text/event-stream", 7, 1);
  ag_provider *p = provider("openai", true, NULL);
  json_t *msgs = history(), *tl = tools();
  deltas d = {0};
  ag_reply r;
  ag_provider_error pe;
  cr_assert_eq(ask(p, msgs, tl, NULL, &d, &r, &pe), AG_OK, "%s", pe.message);
  cr_expect_eq(d.n, 0);
  cr_assert_eq(r.n_calls, 2);
  cr_expect_str_eq(r.calls[0].id, "call_Aa1");
  cr_expect_str_eq(r.calls[0].name, "read_file");
  cr_expect_str_eq(r.calls[0].arguments, "{\"path\": \"notes.txt\"}");
  cr_expect_str_eq(r.calls[1].id, "call_Bb2");
  cr_expect_str_eq(r.calls[1].name, "list_dir");
  cr_expect_str_eq(r.calls[1].arguments, "{\"path\": \"é/\"}");
  cr_expect_str_eq(r.finish_reason, "tool_calls");
  cr_expect_eq(r.usage.prompt_tokens, 200);
  cr_expect_eq(r.usage.cached_tokens, 128);
  ag_reply_clear(&r);
  json_decref(msgs);
  json_decref(tl);
  ag_provider_free(p);
}

Test(http, openai_stream_error_event) {
  serve_fixture("openai/fault_stream_error.sse", "text/event-stream", 16, 1);
  ag_provider *p = provider("openai", true, NULL);
  json_t *msgs = history();
  deltas d = {0};
  ag_reply r;
  ag_provider_error pe;
  cr_assert_eq(ask(p, msgs, NULL, NULL, &d, &r, &pe), AG_EPROVIDER);
  cr_expect_str_eq(d.buf, "Partial ");
  cr_expect(strstr(pe.message, "The server had an error while processing") !=
                NULL,
            "%s", pe.message);
  cr_expect(strstr(pe.message, "mid-stream") != NULL, "%s", pe.message);
  cr_expect(pe.transient, "a server_error mid-stream is transient");
  cr_expect_null(r.text);
  json_decref(msgs);
  ag_provider_free(p);
}

/* on_delta asks to stop: AG_ECANCELLED, nothing half-built. */
Test(http, openai_stream_stopped_by_delta) {
  serve_fixture("openai/stream_text.sse", "text/event-stream", 0, 0);
  ag_provider *p = provider("openai", true, NULL);
  json_t *msgs = history();
  deltas d = {.stop_after = 2};
  ag_reply r;
  ag_provider_error pe;
  cr_assert_eq(ask(p, msgs, NULL, NULL, &d, &r, &pe), AG_ECANCELLED);
  cr_expect_eq(d.n, 2);
  cr_expect_null(r.text);
  json_decref(msgs);
  ag_provider_free(p);
}

/* A server that ignores "stream": true and answers with one JSON body. */
Test(http, openai_stream_asked_json_answered) {
  serve_fixture("openai/chat_text.json", "application/json", 0, 0);
  ag_provider *p = provider("openai", true, NULL);
  json_t *msgs = history();
  ag_reply r;
  ag_provider_error pe;
  cr_assert_eq(ask(p, msgs, NULL, NULL, NULL, &r, &pe), AG_OK, "%s",
               pe.message);
  cr_expect_str_eq(r.text, "Hello! Café ☕ 日本語 🙂");
  ag_reply_clear(&r);
  json_decref(msgs);
  ag_provider_free(p);
}

Test(http, openai_stream_garbage_chunk_names_the_byte) {
  serve_text(200, "text/event-stream",
             "data: {\"choices\":[]}\n\ndata: {\"choices\": nope}\n\n");
  ag_provider *p = provider("openai", true, NULL);
  json_t *msgs = history();
  ag_reply r;
  ag_provider_error pe;
  cr_assert_eq(ask(p, msgs, NULL, NULL, NULL, &r, &pe), AG_EPROVIDER);
  cr_expect(!pe.transient);
  /* The second event starts at byte 22; its data at 28; "nope" ends at 44. */
  cr_expect(strstr(pe.message, "not JSON") != NULL, "%s", pe.message);
  cr_expect(strstr(pe.message, "at byte 44") != NULL, "%s", pe.message);
  json_decref(msgs);
  ag_provider_free(p);
}

/* ------------------------------------------------------------------------ */
/* Faults                                                                   */
/* ------------------------------------------------------------------------ */

static ag_err_t fail_once(ag_provider *p, ag_provider_error *pe) {
  json_t *msgs = history();
  ag_reply r;
  ag_err_t rc = ask(p, msgs, NULL, NULL, NULL, &r, pe);
  if (rc == AG_OK)
    ag_reply_clear(&r);
  json_decref(msgs);
  no_secret(pe);
  return rc;
}

static const char openai_429[] =
    "{\"error\":{\"message\":\"Rate limit reached for gpt-4o-mini in "
    "organization org-x on requests per min (RPM): Limit 3, Used 3.\","
    "\"type\":\"requests\",\"param\":null,\"code\":\"rate_limit_exceeded\"}}";

Test(http, status_429_retry_after_seconds) {
  serve_text(429, "application/json", openai_429);
  S.p.hdr_name = "Retry-After";
  S.p.hdr_value = "2";
  ag_provider *p = provider("openai", true, NULL);
  ag_provider_error pe;
  cr_assert_eq(fail_once(p, &pe), AG_EPROVIDER);
  cr_expect(pe.transient);
  cr_expect_eq(pe.http_status, 429);
  cr_expect_eq(pe.retry_after_ms, 2000);
  cr_expect_str_eq(pe.service, "127.0.0.1");
  cr_expect(strstr(pe.message, "HTTP 429 from 127.0.0.1: Rate limit reached") ==
                pe.message,
            "%s", pe.message);
  cr_expect(strstr(pe.message, "(type requests, code rate_limit_exceeded)") !=
                NULL,
            "%s", pe.message);
  cr_expect(strstr(pe.details, "rate_limit_exceeded") != NULL);
  ag_provider_free(p);
}

Test(http, status_429_retry_after_http_date) {
  static char date[64];
  time_t t = time(NULL) + 5;
  struct tm tm;
  gmtime_r(&t, &tm);
  strftime(date, sizeof(date), "%a, %d %b %Y %H:%M:%S GMT", &tm);
  serve_text(429, "application/json", openai_429);
  S.p.hdr_name = "Retry-After";
  S.p.hdr_value = date;
  ag_provider *p = provider("openai", false, NULL);
  ag_provider_error pe;
  cr_assert_eq(fail_once(p, &pe), AG_EPROVIDER);
  cr_expect(pe.retry_after_ms >= 3000 && pe.retry_after_ms <= 6000,
            "Retry-After %s read as %lld ms", date,
            (long long)pe.retry_after_ms);
  ag_provider_free(p);
}

Test(http, status_429_retry_after_ms) {
  serve_text(429, "application/json", openai_429);
  S.p.hdr_name = "retry-after-ms";
  S.p.hdr_value = "1500";
  ag_provider *p = provider("openai", false, NULL);
  ag_provider_error pe;
  cr_assert_eq(fail_once(p, &pe), AG_EPROVIDER);
  cr_expect_eq(pe.retry_after_ms, 1500);
  ag_provider_free(p);
}

/* Which statuses are worth a retry, and the message of each. */
Test(http, statuses_transient_or_not) {
  static const struct {
    int status;
    bool transient;
    const char *body;
    const char *want;
  } cases[] = {
      {500, true,
       "{\"error\":{\"message\":\"boom\",\"type\":\"server_error\"}}",
       "HTTP 500 from 127.0.0.1: boom (type server_error)"},
      {503, true, "upstream connect error",
       "HTTP 503 from 127.0.0.1: upstream "
       "connect error"},
      {502, true, "", "HTTP 502 from 127.0.0.1"},
      {408, true, "", "HTTP 408 from 127.0.0.1"},
      {409, true, "", "HTTP 409 from 127.0.0.1"},
      {400, false,
       "{\"error\":{\"message\":\"Invalid value for 'tool_choice'\","
       "\"type\":\"invalid_request_error\",\"param\":\"tool_choice\","
       "\"code\":null}}",
       "HTTP 400 from 127.0.0.1: Invalid value for 'tool_choice' (type "
       "invalid_request_error)"},
      {404, false,
       "{\"error\":\"model \\\"llama9\\\" not found, try pulling "
       "it first\"}",
       "HTTP 404 from 127.0.0.1: not found: check provider.base_url and "
       "provider.model: model \"llama9\" not found, try pulling it first"},
      {422, false, "{\"detail\":\"bad\"}",
       "HTTP 422 from 127.0.0.1: "
       "{\"detail\":\"bad\"}"},
  };
  ag_provider *p = provider("openai", false, NULL);
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    serve_text(cases[i].status, "application/json", cases[i].body);
    ag_provider_error pe;
    cr_assert_eq(fail_once(p, &pe), AG_EPROVIDER);
    cr_expect_eq(pe.http_status, cases[i].status);
    cr_expect_eq(pe.transient, cases[i].transient, "%d", cases[i].status);
    cr_expect_str_eq(pe.message, cases[i].want);
    cr_expect_eq(pe.retry_after_ms, -1);
  }
  ag_provider_free(p);
}

static void edit_no_key(ag_http_provider_opts *o) {
  o->api_key_env = "TEST_NO_KEY";
}

/* 401 and 403 name the variable; a body that echoes the key is scrubbed. */
Test(http, auth_failures_name_the_variable_never_the_key) {
  char body[256];
  snprintf(body, sizeof(body),
           "{\"error\":{\"message\":\"Incorrect API key provided: %s. You can "
           "find your API key at https://example.test\",\"type\":"
           "\"invalid_request_error\",\"code\":\"invalid_api_key\"}}",
           SECRET);
  serve_text(401, "application/json", body);
  ag_provider *p = provider("openai", false, NULL);
  ag_provider_error pe;
  cr_assert_eq(fail_once(p, &pe), AG_EPROVIDER);
  cr_expect(!pe.transient);
  cr_expect(strstr(pe.message, "the API key in the environment variable "
                               "TEST_KEY was refused") != NULL,
            "%s", pe.message);
  cr_expect(strstr(pe.message, "[redacted]") != NULL, "%s", pe.message);
  cr_expect(strstr(pe.details, "[redacted]") != NULL, "%s", pe.details);
  ag_provider_free(p);

  serve_text(401, "application/json",
             "{\"type\":\"error\",\"error\":{\"type\":\"authentication_error\","
             "\"message\":\"x-api-key header is required\"}}");
  p = provider("anthropic", false, edit_no_key);
  cr_assert_eq(fail_once(p, &pe), AG_EPROVIDER);
  cr_expect_null(S.last_xkey, "no key header without a key");
  cr_expect_str_eq(pe.message,
                   "HTTP 401 from 127.0.0.1: the API key is missing: set the "
                   "environment variable TEST_NO_KEY: x-api-key header is "
                   "required (type authentication_error)");
  ag_provider_free(p);

  serve_text(403, "application/json", "{\"error\":{\"message\":\"nope\"}}");
  p = provider("openai", false, NULL);
  cr_assert_eq(fail_once(p, &pe), AG_EPROVIDER);
  cr_expect(strstr(pe.message, "TEST_KEY was refused for this request") != NULL,
            "%s", pe.message);
  ag_provider_free(p);
}

/* A key echoed where the kept part of the body is cut: no prefix of it may
 * survive in details or the message. */
Test(http, echoed_key_at_the_cut_is_not_left_half) {
  for (size_t pad = 960; pad <= 1010; pad += 2) {
    char body[2048];
    int n = snprintf(body, sizeof(body), "{\"error\":{\"message\":\"");
    memset(body + n, 'x', pad);
    snprintf(body + n + pad, sizeof(body) - (size_t)n - pad, "%s\"}}", SECRET);
    serve_text(401, "application/json", body);
    ag_provider *p = provider("openai", false, NULL);
    ag_provider_error pe;
    cr_assert_eq(fail_once(p, &pe), AG_EPROVIDER);
    cr_expect(strstr(pe.details, "sk-ag") == NULL,
              "pad %zu: details end with %s", pad,
              pe.details + strlen(pe.details) - 20);
    cr_expect(strstr(pe.message, "sk-ag") == NULL, "pad %zu", pad);
    ag_provider_free(p);
  }
}

/* A tool offered without parameters still gets an input_schema. */
Test(http, anthropic_tool_without_parameters) {
  serve_fixture("anthropic/message_tool_use.json", "application/json", 0, 0);
  ag_provider *p = provider("anthropic", false, NULL);
  json_t *msgs = history();
  json_t *tl = json_loads("[{\"type\":\"function\",\"function\":{\"name\":"
                          "\"now\"}}]",
                          0, NULL);
  ag_reply r;
  ag_provider_error pe;
  cr_assert_eq(ask(p, msgs, tl, NULL, NULL, &r, &pe), AG_OK, "%s", pe.message);
  json_t *b = sent_body();
  json_t *want = json_loads("[{\"name\":\"now\",\"input_schema\":{\"type\":"
                            "\"object\"}}]",
                            0, NULL);
  cr_expect(json_equal(json_object_get(b, "tools"), want), "%s", S.last_body);
  json_decref(want);
  json_decref(b);
  ag_reply_clear(&r);
  json_decref(tl);
  json_decref(msgs);
  ag_provider_free(p);
}

Test(http, redirect_not_followed) {
  serve_text(302, "text/plain", "moved");
  S.p.hdr_name = "Location";
  S.p.hdr_value = "http://127.0.0.1:1/elsewhere";
  ag_provider *p = provider("openai", false, NULL);
  ag_provider_error pe;
  cr_assert_eq(fail_once(p, &pe), AG_EPROVIDER);
  cr_expect(!pe.transient);
  cr_expect_eq(pe.http_status, 302);
  cr_expect(strstr(pe.message, "redirects to http://127.0.0.1:1/elsewhere; "
                               "redirects are not followed") != NULL,
            "%s", pe.message);
  cr_expect_eq(S.n_requests, 1);
  ag_provider_free(p);
}

Test(http, body_cut_mid_stream_is_transient) {
  serve_fixture("openai/stream_text.sse", "text/event-stream", 50, 1);
  S.p.cut_at = 400;
  ag_provider *p = provider("openai", true, NULL);
  ag_provider_error pe;
  cr_assert_eq(fail_once(p, &pe), AG_EPROVIDER);
  cr_expect(pe.transient, "%s", pe.message);
  cr_expect_eq(pe.http_status, 0);
  cr_expect(strstr(pe.message, "cut off") != NULL ||
                strstr(pe.message, "ended before") != NULL,
            "%s", pe.message);
  ag_provider_free(p);
}

/* A stream that ends cleanly but early (no [DONE], no finish reason). */
Test(http, stream_ended_early_is_transient) {
  serve_text(200, "text/event-stream",
             "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}"
             "}]}\n\n");
  ag_provider *p = provider("openai", true, NULL);
  ag_provider_error pe;
  cr_assert_eq(fail_once(p, &pe), AG_EPROVIDER);
  cr_expect(pe.transient);
  cr_expect(strstr(pe.message, "ended before the reply was complete") != NULL,
            "%s", pe.message);
  ag_provider_free(p);
}

typedef struct canceller {
  ag_cancel *c;
  int after_ms;
  int64_t fired_at;
} canceller;

static void *cancel_later(void *arg) {
  canceller *k = arg;
  sleep_ms(k->after_ms);
  k->fired_at = ag_now_ms();
  ag_cancel_cancel(k->c, AG_CANCEL_USER);
  return NULL;
}

/* A server that accepts and never answers: a cancel from another thread
 * ends the request within 100 ms (asserted with a wide margin). */
Test(http, never_answers_cancel_is_prompt) {
  S.p.never_answer = true;
  ag_provider *p = provider("openai", false, NULL);
  ag_cancel *c;
  cr_assert_eq(ag_cancel_new(&c, NULL, INT64_MAX, AG_CANCEL_DEADLINE, NULL),
               AG_OK);
  canceller k = {c, 200, 0};
  pthread_t th;
  pthread_create(&th, NULL, cancel_later, &k);
  json_t *msgs = history();
  ag_reply r;
  ag_provider_error pe;
  int64_t t0 = ag_now_ms();
  cr_expect_eq(ask(p, msgs, NULL, c, NULL, &r, &pe), AG_ECANCELLED);
  int64_t done = ag_now_ms();
  pthread_join(th, NULL);
  cr_expect(done - t0 >= 150, "returned before the cancel");
  cr_expect(done - k.fired_at < 500, "cancel took %lld ms",
            (long long)(done - k.fired_at));
  fprintf(stderr, "cancel to return: %lld ms\n",
          (long long)(done - k.fired_at));
  json_decref(msgs);
  ag_cancel_free(c);
  ag_provider_free(p);
}

/* The turn deadline (a token's own deadline) ends it the same way. */
Test(http, never_answers_deadline) {
  S.p.never_answer = true;
  ag_provider *p = provider("openai", false, NULL);
  ag_cancel *c;
  cr_assert_eq(
      ag_cancel_new(&c, NULL, ag_now_ms() + 200, AG_CANCEL_DEADLINE, NULL),
      AG_OK);
  ag_provider_error pe;
  int64_t t0 = ag_now_ms();
  json_t *msgs = history();
  ag_reply r;
  cr_expect_eq(ask(p, msgs, NULL, c, NULL, &r, &pe), AG_ECANCELLED);
  cr_expect(ag_now_ms() - t0 < 700, "took %lld ms",
            (long long)(ag_now_ms() - t0));
  cr_expect_eq(ag_cancel_check(c, ag_now_ms()), AG_CANCEL_DEADLINE);
  json_decref(msgs);
  ag_cancel_free(c);
  ag_provider_free(p);
}

static void edit_timeout(ag_http_provider_opts *o) {
  o->timeout_ms = 300;
}

Test(http, never_answers_total_timeout) {
  S.p.never_answer = true;
  ag_provider *p = provider("openai", false, edit_timeout);
  ag_provider_error pe;
  int64_t t0 = ag_now_ms();
  cr_assert_eq(fail_once(p, &pe), AG_EPROVIDER);
  int64_t took = ag_now_ms() - t0;
  cr_expect(took >= 250 && took < 2000, "took %lld ms", (long long)took);
  cr_expect(pe.transient);
  cr_expect_str_eq(pe.message, "the request to 127.0.0.1 timed out after 300 "
                               "ms (provider.timeout)");
  ag_provider_free(p);
}

static void edit_idle(ag_http_provider_opts *o) {
  o->idle_timeout_ms = 300;
}

/* A stream that sends a little, then nothing: the idle limit. */
Test(http, trickle_then_silence_idle_limit) {
  serve_fixture("openai/stream_text.sse", "text/event-stream", 20, 30);
  /* Silence once "Caf" and "é ☕ " have been sent. */
  S.p.stall_at = strstr(S.p.body, "日本語") - S.p.body;
  ag_provider *p = provider("openai", true, edit_idle);
  deltas d = {0};
  json_t *msgs = history();
  ag_reply r;
  ag_provider_error pe;
  int64_t t0 = ag_now_ms();
  cr_assert_eq(ask(p, msgs, NULL, NULL, &d, &r, &pe), AG_EPROVIDER);
  int64_t took = ag_now_ms() - t0;
  cr_expect(pe.transient);
  cr_expect_str_eq(pe.message, "127.0.0.1 sent nothing for 300 ms "
                               "(provider.idle_timeout)");
  cr_expect(took < 3000, "took %lld ms", (long long)took);
  cr_expect_gt(d.n, 0, "the first deltas arrived before the silence");
  json_decref(msgs);
  ag_provider_free(p);
}

/* A slow but steady trickle (a write every 30 ms, 3 bytes each) is not
 * idle. */
Test(http, slow_steady_trickle_is_fine) {
  serve_fixture("openai/stream_text.sse", "text/event-stream", 40, 20);
  ag_provider *p = provider("openai", true, edit_idle);
  json_t *msgs = history();
  ag_reply r;
  ag_provider_error pe;
  cr_assert_eq(ask(p, msgs, NULL, NULL, NULL, &r, &pe), AG_OK, "%s",
               pe.message);
  cr_expect_str_eq(r.text, "Café ☕ 日本語 🙂 done.");
  ag_reply_clear(&r);
  json_decref(msgs);
  ag_provider_free(p);
}

static int closed_port(void) {
  /* A port nothing listens on: the fake server's, after it stops. */
  int port = S.port;
  atomic_store(&S.stop, true);
  MHD_stop_daemon(S.d);
  S.d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD, 0, NULL, NULL,
                         handler, NULL, MHD_OPTION_END);
  return port;
}

Test(http, connection_refused) {
  int port = closed_port();
  ag_http_provider_opts o;
  ag_http_provider_opts_init(&o);
  char url[64];
  snprintf(url, sizeof(url), "http://127.0.0.1:%d/v1", port);
  o.base_url = url;
  o.model = "m";
  o.api_key_env = "TEST_KEY";
  ag_provider *p;
  ag_error_t err;
  cr_assert_eq(ag_provider_http_new(&p, &o, &err), AG_OK, "%s", err.msg);
  ag_provider_error pe;
  cr_assert_eq(fail_once(p, &pe), AG_EPROVIDER);
  cr_expect(pe.transient);
  cr_expect_eq(pe.http_status, 0);
  cr_expect(strstr(pe.message, "could not reach 127.0.0.1") == pe.message, "%s",
            pe.message);
  ag_provider_free(p);
}

/* ------------------------------------------------------------------------ */
/* Options and the config section                                           */
/* ------------------------------------------------------------------------ */

static ag_err_t new_with(ag_http_provider_opts *o, ag_error_t *err) {
  ag_provider *p = NULL;
  ag_err_t rc = ag_provider_http_new(&p, o, err);
  ag_provider_free(p);
  cr_expect(strstr(err->msg, SECRET) == NULL, "%s", err->msg);
  return rc;
}

Test(http, bad_options_are_named) {
  ag_http_provider_opts o;
  ag_error_t err;
  ag_http_provider_opts_init(&o);
  cr_expect_eq(new_with(&o, &err), AG_ECONFIG);
  cr_expect_str_eq(err.msg, "provider.model: missing; name the model to use "
                            "(or set AGENTGUARD_MODEL)");
  o.model = "m";
  o.kind = "vertex";
  cr_expect_eq(new_with(&o, &err), AG_ECONFIG);
  cr_expect_str_eq(err.msg, "provider.kind: \"vertex\" is not a provider kind "
                            "(openai, anthropic, openai-responses, gemini, "
                            "ollama)");
  o.kind = "gemini";
  o.model = "models/gemini 2.5?";
  cr_expect_eq(new_with(&o, &err), AG_ECONFIG);
  cr_expect_str_eq(err.msg,
                   "provider.model: \"models/gemini 2.5?\" cannot be put in a "
                   "Gemini URL (letters, digits, '-', '.' and '_' only)");
  o.model = "m";
  o.kind = "openai";
  o.base_url = "ftp://example.test/v1";
  cr_expect_eq(new_with(&o, &err), AG_ECONFIG);
  cr_expect_str_eq(err.msg, "provider.base_url: \"ftp://example.test/v1\" is "
                            "not an http:// or https:// URL");
  o.base_url = NULL;
  o.extra_body_json = "[1]";
  cr_expect_eq(new_with(&o, &err), AG_ECONFIG);
  cr_expect_str_eq(err.msg, "provider.extra_body: expected an object");
  o.extra_body_json = NULL;
  static const char *const bad_header[] = {"Authorization Bearer " SECRET,
                                           NULL};
  o.headers = bad_header;
  cr_expect_eq(new_with(&o, &err), AG_ECONFIG);
  cr_expect(strstr(err.msg, "provider.headers[0]: expected") == err.msg, "%s",
            err.msg);
  o.headers = NULL;
  o.size = 8;
  cr_expect_eq(new_with(&o, &err), AG_EINVAL);
  cr_expect(strstr(err.msg, "opts.size") != NULL, "%s", err.msg);
}

static ag_provider_config *cfg(const char *text, ag_err_t want,
                               const char *want_msg) {
  ag_provider_config *c = (ag_provider_config *)&c;
  ag_error_t err;
  ag_err_t rc = ag_provider_config_parse(&c, text, strlen(text), &err);
  cr_expect_eq(rc, want, "%s: %s", text, err.msg);
  if (want_msg != NULL)
    cr_expect_str_eq(err.msg, want_msg);
  if (rc != AG_OK)
    cr_expect_null(c);
  cr_expect(strstr(err.msg, SECRET) == NULL);
  return rc == AG_OK ? c : NULL;
}

Test(http, config_section_keys_and_errors) {
  ag_provider_config *c = cfg(
      "{\"kind\": \"anthropic\", \"model\": \"claude-x\", \"base_url\": "
      "\"http://h:1\", \"api_key_env\": \"MY_KEY\", \"headers\": "
      "{\"X-Test\": \"yes\"}, \"timeout\": \"90s\", \"connect_timeout\": "
      "\"2s\", \"idle_timeout\": \"0\", \"stream\": false, \"temperature\": "
      "0.5, \"max_tokens\": 100, \"parallel_tool_calls\": false, "
      "\"extra_body\": {\"top_k\": 5}}",
      AG_OK, NULL);
  cr_assert_not_null(c);
  bool tset = false;
  const ag_http_provider_opts *o = ag_provider_config_opts(c, &tset);
  cr_expect(tset);
  cr_expect_str_eq(o->kind, "anthropic");
  cr_expect_str_eq(o->model, "claude-x");
  cr_expect_str_eq(o->base_url, "http://h:1");
  cr_expect_str_eq(o->api_key_env, "MY_KEY");
  cr_expect_str_eq(o->headers[0], "X-Test: yes");
  cr_expect_null(o->headers[1]);
  cr_expect_eq(o->timeout_ms, 90000);
  cr_expect_eq(o->connect_timeout_ms, 2000);
  cr_expect_eq(o->idle_timeout_ms, 0);
  cr_expect(!o->stream);
  cr_expect(!o->parallel_tool_calls);
  cr_expect_float_eq(o->temperature, 0.5, 1e-9);
  cr_expect_eq(o->max_tokens, 100);
  cr_expect_str_eq(o->extra_body_json, "{\"top_k\":5}");
  ag_provider_config_free(c);

  c = cfg("{}", AG_OK, NULL);
  o = ag_provider_config_opts(c, &tset);
  cr_expect(!tset);
  cr_expect_str_eq(o->kind, "openai");
  cr_expect(o->stream);
  cr_expect_null(o->model);
  ag_provider_config_free(c);

  cfg("{\"modle\": \"x\"}", AG_ECONFIG,
      "provider.modle: unknown key; did you mean model?");
  cfg("{\"base_ur\": \"x\"}", AG_ECONFIG,
      "provider.base_ur: unknown key; did you mean base_url?");
  cfg("{\"zzz\": 1}", AG_ECONFIG, "provider.zzz: unknown key");
  cfg("{\"api_key\": \"" SECRET "\"}", AG_ECONFIG,
      "provider.api_key: API keys are not read from config files; put the "
      "key in an environment variable and name it in provider.api_key_env");
  cfg("{\"timeout\": 30}", AG_ECONFIG,
      "provider.timeout: expected a duration such as \"30s\", \"250ms\" or "
      "\"0\" (no limit)");
  cfg("{\"kind\": \"azure\"}", AG_ECONFIG,
      "provider.kind: \"azure\" is not a provider kind (openai, anthropic, "
      "openai-responses, gemini, ollama)");
  cfg("{\"stream\": \"yes\"}", AG_ECONFIG,
      "provider.stream: expected true or false");
  cfg("{\"temperature\": 3}", AG_ECONFIG,
      "provider.temperature: expected a number 0..2");
  cfg("{\"headers\": {\"X\": 1}}", AG_ECONFIG,
      "provider.headers.X: expected a string");
  cfg("{\"model\": 1, }", AG_EJSON, NULL);
  cfg("[]", AG_ECONFIG, "provider: expected an object");
}

Test(http, config_env_overrides) {
  setenv("AGENTGUARD_BASE_URL", "http://127.0.0.1:9/v1", 1);
  setenv("AGENTGUARD_MODEL", "qwen3:8b", 1);
  ag_provider_config *c =
      cfg("{\"model\": \"gpt-4o\", \"base_url\": \"https://x\"}", AG_OK, NULL);
  const ag_http_provider_opts *o = ag_provider_config_opts(c, NULL);
  cr_expect_str_eq(o->model, "qwen3:8b");
  cr_expect_str_eq(o->base_url, "http://127.0.0.1:9/v1");
  ag_provider_config_free(c);
  setenv("AGENTGUARD_MODEL", "", 1);
  c = cfg("{\"model\": \"gpt-4o\"}", AG_OK, NULL);
  cr_expect_str_eq(ag_provider_config_opts(c, NULL)->model, "gpt-4o",
                   "an empty variable does not override");
  ag_provider_config_free(c);
  ag_provider_config_free(NULL);
}

/* The options from a config reach the wire: headers, key variable. */
Test(http, config_to_provider_end_to_end) {
  serve_fixture("openai/chat_text.json", "application/json", 0, 0);
  setenv("MY_KEY", SECRET, 1);
  char text[256];
  snprintf(text, sizeof(text),
           "{\"model\": \"llama3\", \"base_url\": \"http://127.0.0.1:%d/v1/\", "
           "\"api_key_env\": \"MY_KEY\", \"stream\": false, \"headers\": "
           "{\"X-Test\": \"from-config\"}}",
           S.port);
  ag_provider_config *c = cfg(text, AG_OK, NULL);
  ag_provider *p;
  ag_error_t err;
  cr_assert_eq(ag_provider_http_new(&p, ag_provider_config_opts(c, NULL), &err),
               AG_OK, "%s", err.msg);
  ag_provider_config_free(c); /* the provider copied what it needs */
  json_t *msgs = history();
  ag_reply r;
  ag_provider_error pe;
  cr_assert_eq(ask(p, msgs, NULL, NULL, NULL, &r, &pe), AG_OK, "%s",
               pe.message);
  cr_expect_str_eq(S.last_url, "/v1/chat/completions");
  cr_expect_str_eq(S.last_custom, "from-config");
  cr_expect_str_eq(S.last_auth, "Bearer " SECRET);
  ag_reply_clear(&r);
  json_decref(msgs);
  ag_provider_free(p);
}

/* ------------------------------------------------------------------------ */
/* Inside the agent loop                                                    */
/* ------------------------------------------------------------------------ */

typedef struct ev_log {
  char *text;
  size_t len;
  int retries;
} ev_log;

static void on_event(void *user, const json_t *ev) {
  ev_log *l = user;
  char *s = json_dumps(ev, JSON_COMPACT);
  cr_assert_not_null(s);
  size_t n = strlen(s);
  l->text = realloc(l->text, l->len + n + 2);
  memcpy(l->text + l->len, s, n);
  l->len += n;
  l->text[l->len++] = '\n';
  l->text[l->len] = '\0';
  const char *name = json_string_value(json_object_get(ev, "event"));
  if (name != NULL && strcmp(name, "provider_retry") == 0)
    l->retries++;
  free(s);
}

static ag_agent *agent_with(ag_provider *p, ev_log *log) {
  ag_agent_opts o;
  ag_agent_opts_init(&o);
  o.provider = p;
  o.on_event = on_event;
  o.event_user = log;
  o.config.network.max_retries = 1;
  o.config.network.delay_ms = 10;
  o.config.network.max_delay_ms = 10;
  ag_agent *a;
  ag_error_t err;
  cr_assert_eq(ag_agent_new(&a, &o, &err), AG_OK, "%s", err.msg);
  return a;
}

/* A real turn over HTTP: the reply's text is the final answer. */
Test(http, agent_turn_over_http) {
  serve_fixture("openai/stream_text.sse", "text/event-stream", 11, 0);
  ag_provider *p = provider("openai", true, NULL);
  ev_log log = {0};
  ag_agent *a = agent_with(p, &log);
  ag_turn_outcome out;
  cr_assert_eq(ag_agent_run_turn(a, "Say hi", NULL, &out, NULL), AG_OK);
  cr_expect_eq(out.status, AG_TURN_COMPLETED, "%s: %s", out.reason,
               out.message);
  cr_expect_str_eq(out.final_text, "Café ☕ 日本語 🙂 done.");
  json_t *b = sent_body();
  json_t *last =
      json_array_get(json_object_get(b, "messages"),
                     json_array_size(json_object_get(b, "messages")) - 1);
  cr_expect_str_eq(json_string_value(json_object_get(last, "content")),
                   "Say hi");
  json_decref(b);
  ag_turn_outcome_clear(&out);
  ag_agent_free(a);
  free(log.text);
  ag_provider_free(p);
}

/* Failures the loop retries and reports: the key, echoed by the server,
 * is in no event and not in the outcome. */
Test(http, agent_events_never_carry_the_key) {
  char body[256];
  snprintf(body, sizeof(body),
           "{\"error\":{\"message\":\"overloaded; your key %s is fine\","
           "\"type\":\"server_error\"}}",
           SECRET);
  serve_text(503, "application/json", body);
  S.p.hdr_name = "Retry-After";
  S.p.hdr_value = "0";
  ag_provider *p = provider("openai", true, NULL);
  ev_log log = {0};
  ag_agent *a = agent_with(p, &log);
  ag_turn_outcome out;
  cr_assert_eq(ag_agent_run_turn(a, "Hi", NULL, &out, NULL), AG_OK);
  cr_expect_eq(out.status, AG_TURN_FAILED);
  cr_expect_str_eq(out.reason, "model_error");
  cr_expect_eq(log.retries, 1, "%s", log.text);
  cr_expect_eq(S.n_requests, 2);
  cr_expect(strstr(log.text, "[redacted]") != NULL, "%s", log.text);
  cr_expect(strstr(log.text, SECRET) == NULL, "%s", log.text);
  cr_expect(strstr(out.message, SECRET) == NULL, "%s", out.message);
  ag_turn_outcome_clear(&out);
  ag_agent_free(a);
  free(log.text);
  ag_provider_free(p);
}

/* Every growing buffer has a cap: an SSE line over 1 MiB is an error naming
 * the byte, not growth. */
Test(http, stream_line_over_the_cap) {
  size_t n = (1u << 20) + 100;
  char *body = malloc(n + 16);
  memcpy(body, "data: {\"x\":\"", 12);
  memset(body + 12, 'a', n - 12);
  memcpy(body + n, "\"}\n\n", 5);
  serve_text(200, "text/event-stream", body);
  free(body);
  ag_provider *p = provider("openai", true, NULL);
  ag_provider_error pe;
  cr_assert_eq(fail_once(p, &pe), AG_EPROVIDER);
  cr_expect(!pe.transient);
  cr_expect(strstr(pe.message, "exceeds 1048576 bytes at byte") != NULL, "%s",
            pe.message);
  ag_provider_free(p);
}

/* Messages sent as text only (ag_request.messages_json, as the agent loop
 * sends them): both wire formats send the body they send for the tree. */
static void text_body_equals_tree_body(const char *kind, const char *fixture) {
  json_t *msgs = history(), *tl = tools();
  char *text = json_dumps(msgs, JSON_COMPACT);
  cr_assert_not_null(text);
  json_t *bodies[2];
  for (int k = 0; k < 2; k++) {
    serve_fixture(fixture, "application/json", 0, 0);
    ag_provider *p = provider(kind, false, edit_options);
    ag_request req = {k == 0 ? msgs : NULL,     tl, 1, 1, k == 0 ? NULL : text,
                      k == 0 ? 0 : strlen(text)};
    ag_reply r;
    ag_provider_error pe;
    cr_assert_eq(ag_provider_complete(p, &req, NULL, NULL, NULL, &r, &pe),
                 AG_OK, "%s: %s", kind, pe.message);
    bodies[k] = sent_body();
    ag_reply_clear(&r);
    ag_provider_free(p);
  }
  cr_expect(json_equal(bodies[0], bodies[1]), "%s: the text request sent %s",
            kind, S.last_body);
  /* the history itself went out: spliced as it is (Chat Completions), or
   * converted (Messages' "system" and blocks, Responses' "input" items) */
  if (strcmp(kind, "openai") == 0)
    cr_expect(json_equal(json_object_get(bodies[1], "messages"), msgs));
  else if (strcmp(kind, "anthropic") == 0)
    cr_expect(json_equal(json_object_get(bodies[1], "system"),
                         json_object_get(bodies[0], "system")));
  else
    cr_expect_eq(json_array_size(json_object_get(bodies[1], "input")), 7, "%s",
                 S.last_body);
  json_decref(bodies[0]);
  json_decref(bodies[1]);
  free(text);
  json_decref(msgs);
  json_decref(tl);
}

Test(http, messages_as_text_send_the_same_body) {
  text_body_equals_tree_body("openai", "openai/chat_tool_calls.json");
  text_body_equals_tree_body("anthropic", "anthropic/message_tool_use.json");
  text_body_equals_tree_body("openai-responses",
                             "responses/response_tool_calls.json");
}
