/*
 * test_proxy.c - the guard proxy (src/proxy/) in-process, in front of a
 * fake upstream (libmicrohttpd, canned replies in order), with libcurl as
 * the client: every decision path of docs/proxy.md. This file has Chat
 * Completions, whole and streamed, and streams' clients and connections;
 * the test_proxy program also runs proxy_apis.c (the other APIs, the
 * command line), proxy_parity.c, proxy_hardening.c and proxy_ops.c, around
 * proxy_fixture.h. The suite's init and fini are here.
 */
#include "proxy_fixture.h"

TestSuite(proxy, .init = setup, .fini = teardown, .timeout = 60);

/* ------------------------------------------------------------------------ */
/* Tests                                                                    */
/* ------------------------------------------------------------------------ */

Test(proxy, other_paths_pass_through_with_credentials) {
  canned_add(200, "{\"object\":\"list\",\"data\":[]}");
  resp *r = call(P, "GET", "/v1/models?q=a%20b", NULL, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect_str_eq(r->body, "{\"object\":\"list\",\"data\":[]}");
  cr_expect_str_eq(r->upstream_hdr, "fake");
  cr_expect_str_empty(r->stop);
  cr_assert_eq(n_upstream(), 1);
  cr_expect_str_eq(U.reqs[0].url, "/v1/models");
  cr_expect_str_eq(U.reqs[0].query, "a b");
  cr_expect_str_eq(U.reqs[0].auth, "Bearer sk-client-secret");
  free(r);
}

Test(proxy, allowed_reply_is_forwarded_unchanged) {
  canned_call("read", "{\"path\":\"b\"}");
  char *body = conversation(1, "read", "{\"path\":\"a\"}", "text of a");
  resp *r = call(P, "POST", "/v1/chat/completions", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect_str_eq(r->body, U.replies[0].body);
  cr_expect_str_empty(r->stop);
  cr_assert_eq(n_upstream(), 1);
  cr_expect_str_eq(U.reqs[0].body, body, "the body goes upstream as it came");
  cr_expect_str_eq(U.reqs[0].auth, "Bearer sk-client-secret");
  free(body);
  free(r);
}

Test(proxy, repeated_call_in_reply_is_replaced_by_stop) {
  /* two identical calls in the history, the reply asks for the third */
  canned_call("read", "{\"path\":\"a\"}");
  char *body = conversation(2, "read", "{\"path\":\"a\"}", "text of a");
  resp *r = call(P, "POST", "/v1/chat/completions", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect_str_eq(r->stop, "identical_calls");
  json_t *m = message_of(r);
  cr_expect_null(json_object_get(m, "tool_calls"), "no call reaches the "
                                                   "client");
  cr_expect(strstr(json_string_value(json_object_get(m, "content")),
                   "agentguard stopped this turn (identical_calls)") != NULL,
            "%s", r->body);
  json_decref(m);
  free(body);
  free(r);
}

Test(proxy, reordered_keys_are_still_the_same_call) {
  canned_call("read", "{\"b\":2,\"a\":1}");
  char *body = conversation(2, "read", "{\"a\":1,\"b\":2}", "same");
  resp *r = call(P, "POST", "/v1/chat/completions", body, NULL);
  cr_expect_str_eq(r->stop, "identical_calls");
  free(body);
  free(r);
}

Test(proxy, nudge_asks_upstream_again) {
  ag_proxy_stop(P);
  ag_config c = test_cfg();
  c.loop.nudge_before_stop = true;
  P = proxy_with(c, 0, NULL);
  canned_call("read", "{\"path\":\"a\"}");
  canned_call(NULL, "The file says: text of a.");
  char *body = conversation(2, "read", "{\"path\":\"a\"}", "text of a");
  resp *r = call(P, "POST", "/v1/chat/completions", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect_str_empty(r->stop);
  cr_expect_str_eq(r->body, U.replies[1].body, "the re-asked reply");
  cr_assert_eq(n_upstream(), 2);
  json_t *sent = json_loads(U.reqs[1].body, 0, NULL);
  json_t *msgs = json_object_get(sent, "messages");
  json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
  cr_expect_str_eq(json_string_value(json_object_get(last, "role")), "tool");
  cr_expect_str_eq(json_string_value(json_object_get(last, "tool_call_id")),
                   "call_up");
  cr_expect(strlen(json_string_value(json_object_get(last, "content"))) > 0);
  json_decref(sent);
  free(body);
  free(r);
}

Test(proxy, nudge_then_same_call_stops) {
  ag_proxy_stop(P);
  ag_config c = test_cfg();
  c.loop.nudge_before_stop = true;
  P = proxy_with(c, 0, NULL);
  canned_call("read", "{\"path\":\"a\"}");
  canned_call("read", "{\"path\":\"a\"}");
  char *body = conversation(2, "read", "{\"path\":\"a\"}", "text of a");
  resp *r = call(P, "POST", "/v1/chat/completions", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect_str_eq(r->stop, "identical_calls");
  cr_expect_eq(n_upstream(), 2);
  json_t *m = message_of(r);
  cr_expect_null(json_object_get(m, "tool_calls"));
  json_decref(m);
  free(body);
  free(r);
}

Test(proxy, replayed_errors_stop_before_forwarding) {
  /* max_consecutive_errors 2: the third failing iteration stops */
  ag_proxy_stop(P);
  ag_config c = test_cfg();
  c.loop.identical_call_limit = 0;
  P = proxy_with(c, 0, NULL);
  char *body =
      conversation(3, "read", "{\"path\":\"x\"}", "Error: no such file");
  resp *r = call(P, "POST", "/v1/chat/completions", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect_eq(n_upstream(), 0, "nothing goes upstream");
  cr_expect_str_eq(r->stop, "consecutive_errors");
  json_t *m = message_of(r);
  cr_expect(strstr(json_string_value(json_object_get(m, "content")),
                   "agentguard stopped this turn") != NULL);
  json_decref(m);
  free(body);
  free(r);
}

Test(proxy, replayed_stop_with_final_request_without_tools) {
  ag_proxy_stop(P);
  ag_config c = test_cfg();
  c.loop.final_request_without_tools = true;
  c.loop.identical_call_limit = 0;
  FILE *log = tmpfile();
  cr_assert_not_null(log);
  ag_proxy_opts o = test_opts();
  o.cfg = c;
  o.access_log = log;
  o.access_log_json = true;
  P = start_with(&o);
  canned_call(NULL, "I could not read x: it does not exist.");
  char *body =
      conversation(3, "read", "{\"path\":\"x\"}", "Error: no such file");
  resp *r = call(P, "POST", "/v1/chat/completions", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect_str_eq(r->stop, "consecutive_errors");
  cr_assert_eq(n_upstream(), 1);
  json_t *sent = json_loads(U.reqs[0].body, 0, NULL);
  cr_expect_null(json_object_get(sent, "tools"), "tools removed");
  json_t *msgs = json_object_get(sent, "messages");
  json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
  cr_expect(strstr(json_string_value(json_object_get(last, "content")),
                   "Do not call tools") != NULL);
  json_decref(sent);
  json_t *m = message_of(r);
  cr_expect_str_eq(json_string_value(json_object_get(m, "content")),
                   "I could not read x: it does not exist.");
  json_decref(m);
  free(body);
  free(r);
  /* the final request's upstream time and tokens are the request's */
  ag_proxy_stop(P);
  P = NULL;
  rewind(log);
  char line[2048] = "";
  cr_assert_not_null(fgets(line, sizeof line, log));
  json_t *l = json_loads(line, 0, NULL);
  cr_assert_not_null(l, "%s", line);
  cr_expect_str_eq(json_string_value(json_object_get(l, "decision")),
                   "final_request_without_tools");
  cr_expect_eq(json_integer_value(json_object_get(l, "input_tokens")), 10);
  cr_expect_eq(json_integer_value(json_object_get(l, "output_tokens")), 5);
  cr_expect(json_is_integer(json_object_get(l, "upstream_ms")), "%s", line);
  json_decref(l);
  fclose(log);
}

Test(proxy, malformed_json_is_400) {
  resp *r = call(P, "POST", "/v1/chat/completions", "{\"messages\": [", NULL);
  char code[64];
  cr_expect_eq(r->status, 400);
  cr_expect_str_eq(err_code(r, code, sizeof code), "invalid_json");
  cr_expect_eq(n_upstream(), 0);
  free(r);
  r = call(P, "POST", "/v1/chat/completions", "{\"model\":\"m\"}", NULL);
  cr_expect_eq(r->status, 400);
  cr_expect_str_eq(err_code(r, code, sizeof code), "invalid_request");
  cr_expect(strstr(r->body, "messages") != NULL);
  free(r);
  /* a tool reply without its call */
  r = call(P, "POST", "/v1/chat/completions",
           "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},"
           "{\"role\":\"assistant\",\"content\":\"x\"},"
           "{\"role\":\"tool\",\"tool_call_id\":\"nope\",\"content\":\"r\"}]}",
           NULL);
  cr_expect_eq(r->status, 400);
  cr_expect(strstr(r->body, "nope") != NULL, "%s", r->body);
  free(r);
}

Test(proxy, upstream_errors_pass_through) {
  canned_add(429, "{\"error\":{\"message\":\"slow down\",\"type\":\"rate\"}}");
  char *body = conversation(0, "read", "{}", "");
  resp *r = call(P, "POST", "/v1/chat/completions", body, NULL);
  cr_expect_eq(r->status, 429);
  cr_expect_str_eq(r->body,
                   "{\"error\":{\"message\":\"slow down\",\"type\":\"rate\"}}");
  free(body);
  free(r);
}

Test(proxy, upstream_down_is_502) {
  ag_proxy_stop(P);
  MHD_stop_daemon(U.d);
  U.d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD, 0, NULL, NULL,
                         up_handler, NULL, MHD_OPTION_END);
  int port = MHD_get_daemon_info(U.d, MHD_DAEMON_INFO_BIND_PORT)->port;
  MHD_stop_daemon(U.d); /* the port is now closed */
  U.d = NULL;
  snprintf(upstream_url, sizeof upstream_url, "http://127.0.0.1:%d", port);
  P = proxy_with(test_cfg(), 0, NULL);
  char *body = conversation(0, "read", "{}", "");
  resp *r = call(P, "POST", "/v1/chat/completions", body, NULL);
  char code[64];
  cr_expect_eq(r->status, 502);
  cr_expect_str_eq(err_code(r, code, sizeof code), "upstream_unreachable");
  cr_expect(strstr(r->body, upstream_url) != NULL, "%s", r->body);
  free(r);
  r = call(P, "GET", "/v1/models", NULL, NULL);
  cr_expect_eq(r->status, 502);
  free(r);
  free(body);
  U.d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD, 0, NULL, NULL,
                         up_handler, NULL, MHD_OPTION_END);
}

Test(proxy, body_cap_is_413) {
  ag_proxy_stop(P);
  P = proxy_with(test_cfg(), 1024, NULL);
  char *body = conversation(20, "read", "{\"path\":\"a long path name\"}",
                            "some result text that takes room");
  cr_assert_gt(strlen(body), 1024);
  resp *r = call(P, "POST", "/v1/chat/completions", body, NULL);
  char code[64];
  cr_expect_eq(r->status, 413);
  cr_expect_str_eq(err_code(r, code, sizeof code), "body_too_large");
  cr_expect_eq(n_upstream(), 0);
  free(r);
  free(body);
}

/* By default a body well past 8 MiB (a conversation that carries a few
 * screenshots) is read and guarded, not refused: the default cap is 32
 * MiB, Anthropic's own request limit. */
Test(proxy, a_body_of_9_mib_is_guarded_by_default) {
  char *conv = conversation(3, "read", "{\"path\":\"a\"}", "hello");
  json_t *b = json_loads(conv, 0, NULL);
  free(conv);
  cr_assert_not_null(b);
  size_t n = (size_t)9 << 20;
  char *big = malloc(n + 1);
  cr_assert_not_null(big);
  memset(big, 'A', n);
  big[n] = '\0';
  json_t *m = json_object_get(b, "messages");
  json_array_insert_new(
      m, 0, json_pack("{s:s, s:s}", "role", "system", "content", big));
  free(big);
  char *body = json_dumps(b, JSON_COMPACT);
  json_decref(b);
  resp *r = call(P, "POST", "/v1/chat/completions", body, NULL);
  cr_expect_eq(r->status, 200, "%ld %.200s", r->status, r->body);
  cr_expect_str_eq(r->stop, "identical_calls", "decided, not refused");
  free(r);
  free(body);
}

Test(proxy, client_key_required_and_not_forwarded) {
  ag_proxy_stop(P);
  P = proxy_with(test_cfg(), 0, "k3y");
  canned_add(200, "{}");
  resp *r = call(P, "GET", "/v1/models", NULL, NULL);
  cr_expect_eq(r->status, 401);
  cr_expect_eq(n_upstream(), 0);
  free(r);
  r = call(P, "GET", "/v1/models", NULL, "x-agentguard-key: wrong");
  cr_expect_eq(r->status, 401);
  free(r);
  r = call(P, "GET", "/v1/models", NULL, "x-agentguard-key: k3y");
  cr_expect_eq(r->status, 200);
  cr_assert_eq(n_upstream(), 1);
  cr_expect_null(U.reqs[0].agkey, "the proxy's key stays here");
  free(r);
}

Test(proxy, other_addresses_need_a_client_key) {
  ag_proxy_opts o;
  ag_proxy_opts_init(&o);
  o.listen_host = "0.0.0.0";
  o.port = 0;
  o.upstream = upstream_url;
  ag_proxy *p = NULL;
  ag_error_t err;
  cr_expect_eq(ag_proxy_start(&p, &o, &err), AG_EINVAL);
  cr_expect_null(p);
  cr_expect(strstr(err.msg, "--client-key-env") != NULL, "%s", err.msg);
  o.listen_host = "127.0.0.1";
  o.upstream = "ftp://x";
  cr_expect_eq(ag_proxy_start(&p, &o, &err), AG_EINVAL);
}

Test(proxy, max_connections_out_of_range_is_refused) {
  ag_proxy_opts o;
  ag_proxy_opts_init(&o);
  o.port = 0;
  o.upstream = upstream_url;
  const int bad[] = {-1, AG_PROXY_MAX_CONNECTIONS_LIMIT + 1};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ag_proxy *p = NULL;
    ag_error_t err;
    o.max_connections = bad[i];
    cr_expect_eq(ag_proxy_start(&p, &o, &err), AG_EINVAL, "%d", bad[i]);
    cr_expect_null(p);
    cr_expect(strstr(err.msg, "--max-connections") != NULL, "%s", err.msg);
    ag_proxy_stop(p);
  }
  ag_proxy *p = NULL;
  ag_error_t err;
  o.max_connections = AG_PROXY_MAX_CONNECTIONS_LIMIT;
  cr_expect_eq(ag_proxy_start(&p, &o, &err), AG_OK, "%s", err.msg);
  ag_proxy_stop(p);
}

/* The process's descriptor table, as /proc/self/status says (FDSize). */
static long fd_table_size(void) {
  FILE *f = fopen("/proc/self/status", "r");
  if (f == NULL)
    return -1;
  char line[256];
  long n = -1;
  while (fgets(line, sizeof line, f) != NULL)
    if (strncmp(line, "FDSize:", 7) == 0)
      n = strtol(line + 7, NULL, 10);
  fclose(f);
  return n;
}

/* ag_proxy_start grows the descriptor table for every connection it may
 * serve (two descriptors each), so that the kernel does not grow it (an
 * RCU grace period that stalls every loop opening a descriptor) while the
 * proxy serves; within the soft RLIMIT_NOFILE. */
Test(proxy, start_grows_the_descriptor_table) {
  long before = fd_table_size();
  if (before < 0)
    cr_skip_test("no /proc/self/status");
  /* more connections than the table holds now (the test process may have
   * grown it already), and a soft limit that allows them */
  int limit = (int)before;
  rlim_t need = 4 * (rlim_t)limit + 1024;
  struct rlimit rl;
  cr_assert_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < need) {
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < need)
      cr_skip_test("RLIMIT_NOFILE's hard limit %lu is under %lu",
                   (unsigned long)rl.rlim_max, (unsigned long)need);
    rl.rlim_cur = need;
    cr_assert_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
  }
  ag_proxy_opts o;
  ag_proxy_opts_init(&o);
  o.port = 0;
  o.upstream = upstream_url;
  o.max_connections = limit;
  ag_proxy *p = NULL;
  ag_error_t err;
  cr_assert_eq(ag_proxy_start(&p, &o, &err), AG_OK, "%s", err.msg);
  long after = fd_table_size();
  cr_expect_geq(after, 2 * (long)limit, "FDSize %ld (before the proxy: %ld)",
                after, before);
  ag_proxy_stop(p);
}

/*
 * An agent loop in the test: ask, run every call (the same result each
 * time), ask again, until a reply without calls. The decisions (stop
 * header per request) of proxies[k % n] must equal one proxy's.
 */
static int run_loop(ag_proxy *const *proxies, int n, char stops[][64],
                    int max_steps) {
  char *first = conversation(0, "read", "{}", "");
  json_t *req = json_loads(first, 0, NULL);
  free(first);
  int steps = 0;
  for (; steps < max_steps; steps++) {
    char *body = json_dumps(req, JSON_COMPACT);
    resp *r =
        call(proxies[steps % n], "POST", "/v1/chat/completions", body, NULL);
    free(body);
    snprintf(stops[steps], 64, "%ld:%.40s", r->status, r->stop);
    json_t *m = message_of(r);
    free(r);
    json_t *tcs = json_object_get(m, "tool_calls");
    json_array_append(json_object_get(req, "messages"), m);
    if (json_array_size(tcs) == 0) {
      json_decref(m);
      steps++;
      break;
    }
    json_array_append_new(
        json_object_get(req, "messages"),
        json_pack("{s:s, s:O, s:s}", "role", "tool", "tool_call_id",
                  json_object_get(json_array_get(tcs, 0), "id"), "content",
                  "same result"));
    json_decref(m);
  }
  json_decref(req);
  return steps;
}

Test(proxy, stateless_replicas_decide_alike) {
  ag_proxy *q = proxy_with(test_cfg(), 0, NULL);
  char one[8][64], two[8][64];
  memset(one, 0, sizeof one);
  memset(two, 0, sizeof two);
  canned_call("read", "{\"path\":\"a\"}");
  ag_proxy *single[1] = {P};
  int n1 = run_loop(single, 1, one, 8);
  canned_reset();
  canned_call("read", "{\"path\":\"a\"}");
  ag_proxy *pair[2] = {P, q};
  int n2 = run_loop(pair, 2, two, 8);
  cr_expect_eq(n1, 3, "two calls run, the third is stopped");
  cr_expect_eq(n1, n2);
  for (int i = 0; i < n1; i++)
    cr_expect_str_eq(one[i], two[i], "request %d", i);
  cr_expect_str_eq(two[n2 - 1], "200:identical_calls");
  ag_proxy_stop(q);
}

/* ---- stream: true ------------------------------------------------------ */

Test(proxy, stream_allowed_relays_text_then_calls) {
  canned_stream_call("{\"path\":\"b\"}");
  char *body =
      streaming(conversation(1, "read", "{\"path\":\"a\"}", "text of a"));
  resp *r = call(P, "POST", "/v1/chat/completions", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect_str_empty(r->stop);
  char *hello = strstr(r->body, "Hello"), *calls = strstr(r->body, "call_s");
  cr_expect(hello != NULL && calls != NULL && hello < calls, "%s", r->body);
  cr_expect(strstr(r->body, "\"tool_calls\"}") != NULL, "finish reason kept");
  cr_expect(strstr(r->body, "\"usage\"") != NULL, "usage kept");
  cr_expect(ends_with_done(r), "%s", r->body);
  json_t *sent = json_loads(U.reqs[0].body, 0, NULL);
  cr_expect(json_is_true(json_object_get(sent, "stream")));
  json_decref(sent);
  free(body);
  free(r);
}

Test(proxy, stream_repeated_call_is_replaced) {
  canned_stream_call("{\"path\":\"a\"}");
  char *body =
      streaming(conversation(2, "read", "{\"path\":\"a\"}", "text of a"));
  resp *r = call(P, "POST", "/v1/chat/completions", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect(strstr(r->body, "Hello") != NULL, "the text went through");
  cr_expect(strstr(r->body, "call_s") == NULL, "the call is held back: %s",
            r->body);
  cr_expect(strstr(r->body, "agentguard stopped this turn (identical_calls)") !=
                NULL,
            "%s", r->body);
  cr_expect(strstr(r->body, "\"finish_reason\":\"stop\"") != NULL);
  cr_expect(ends_with_done(r));
  free(body);
  free(r);
}

/* A stream whose calls earn a nudge: the text went out as it came; at the
 * end the proxy asks again (not streamed, the nudge answering the held
 * call, from the client's own request) and the new reply is the
 * stream's end. */
Test(proxy, stream_nudge_asks_upstream_again) {
  ag_proxy_stop(P);
  ag_config c = test_cfg();
  c.loop.nudge_before_stop = true;
  P = proxy_with(c, 0, NULL);
  canned_stream_call("{\"path\":\"a\"}");
  canned_call(NULL, "The file says: text of a.");
  char *body =
      streaming(conversation(2, "read", "{\"path\":\"a\"}", "text of a"));
  resp *r = call(P, "POST", "/v1/chat/completions", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect(strstr(r->body, "call_s") == NULL, "the call is held back: %s",
            r->body);
  char *hello = strstr(r->body, "Hello");
  char *again = strstr(r->body, "The file says: text of a.");
  cr_expect(hello != NULL && again != NULL && hello < again, "%s", r->body);
  cr_expect(strstr(r->body, "\"finish_reason\":\"stop\"") != NULL, "%s",
            r->body);
  cr_expect(ends_with_done(r), "%s", r->body);
  cr_assert_eq(n_upstream(), 2);
  json_t *sent = json_loads(U.reqs[1].body, 0, NULL);
  cr_expect(json_is_false(json_object_get(sent, "stream")));
  json_t *msgs = json_object_get(sent, "messages");
  cr_expect_eq(json_array_size(msgs), 2 + 2 * 2 + 2,
               "the client's messages, the held call and the nudge");
  json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
  cr_expect_str_eq(json_string_value(json_object_get(last, "role")), "tool");
  cr_expect_str_eq(json_string_value(json_object_get(last, "tool_call_id")),
                   "call_s");
  json_decref(sent);
  free(body);
  free(r);
}

/* A streamed request is decided on its event loop when its body is small;
 * a larger one (here 100 KiB) goes to a worker, which hands the stream to
 * the loop: relayed the same way. */
Test(proxy, stream_with_a_large_body_is_relayed) {
  canned_stream_call("{\"path\":\"b\"}");
  char *small =
      streaming(conversation(1, "read", "{\"path\":\"a\"}", "text of a"));
  json_t *j = json_loads(small, 0, NULL);
  free(small);
  char *pad = malloc(100 * 1024 + 1);
  cr_assert_not_null(pad);
  memset(pad, 'x', 100 * 1024);
  pad[100 * 1024] = '\0';
  json_object_set_new(json_array_get(json_object_get(j, "messages"), 0),
                      "content", json_string(pad));
  free(pad);
  char *body = json_dumps(j, JSON_COMPACT);
  json_decref(j);
  cr_assert_gt(strlen(body), 100 * 1024);
  resp *r = call(P, "POST", "/v1/chat/completions", body, NULL);
  cr_expect_eq(r->status, 200);
  char *hello = strstr(r->body, "Hello"), *calls = strstr(r->body, "call_s");
  cr_expect(hello != NULL && calls != NULL && hello < calls, "%s", r->body);
  cr_expect(ends_with_done(r), "%s", r->body);
  cr_assert_eq(n_upstream(), 1);
  cr_expect_eq(strlen(U.reqs[0].body), strlen(body), "sent as it came");
  free(body);
  free(r);
}

/* A streamed request whose replayed turn stops, with the final request
 * without tools: that request waits for the upstream's whole reply, so
 * the loop leaves it to a worker; the client gets the answer as a
 * stream. */
Test(proxy, stream_replayed_stop_with_final_request_is_a_stream) {
  ag_proxy_stop(P);
  ag_config c = test_cfg();
  c.loop.final_request_without_tools = true;
  c.loop.identical_call_limit = 0;
  P = proxy_with(c, 0, NULL);
  canned_call(NULL, "I could not read x: it does not exist.");
  char *body = streaming(
      conversation(3, "read", "{\"path\":\"x\"}", "Error: no such file"));
  resp *r = call(P, "POST", "/v1/chat/completions", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect_str_eq(r->stop, "consecutive_errors");
  cr_assert_eq(n_upstream(), 1);
  json_t *sent = json_loads(U.reqs[0].body, 0, NULL);
  cr_expect_null(json_object_get(sent, "tools"), "tools removed");
  cr_expect(json_is_false(json_object_get(sent, "stream")), "asked whole");
  json_decref(sent);
  cr_expect(strncmp(r->body, "data: {", 7) == 0, "%s", r->body);
  cr_expect(strstr(r->body, "I could not read x: it does not exist.") != NULL,
            "%s", r->body);
  cr_expect(ends_with_done(r), "%s", r->body);
  free(body);
  free(r);
}

/* A streamed reply whose second tool call has no name: the stream ends
 * with an error event that says so (it said "out of memory", and the
 * first call's copy leaked). Run without a connection
 * (ag_proxy_relay_replay), the relayed stream's own code. */
Test(proxy, stream_call_without_a_name_is_an_error_event) {
  const char *up =
      "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":"
      "1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":"
      "[{\"index\":0,\"id\":\"call_a\",\"type\":\"function\",\"function\":{"
      "\"name\":\"read\",\"arguments\":\"{}\"}},{\"index\":1,\"id\":"
      "\"call_b\",\"type\":\"function\",\"function\":{\"arguments\":\"{}\"}}"
      "]},\"finish_reason\":\"tool_calls\"}]}\n\ndata: [DONE]\n\n";
  ag_config c = test_cfg();
  char *out = NULL;
  size_t n = 0;
  cr_assert_eq(
      ag_proxy_relay_replay(&c, false, up, strlen(up), 40, 0, &out, &n), 0);
  cr_expect(strstr(out, "\"error\"") != NULL, "%s", out);
  cr_expect(strstr(out, "no function name") != NULL, "%s", out);
  cr_expect(strstr(out, "call_a") == NULL, "the calls are held: %s", out);
  free(out);
}

/* SSE lets an event's data span several "data:" lines (joined with a line
 * break); the proxy sends such an event on several lines too. One line
 * holding the break ended the event early: the client's reader saw "{"
 * as the data and a stray field after it. */
Test(proxy, stream_event_of_two_data_lines_stays_two_lines) {
  const char *up =
      "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":"
      "1,\"model\":\"m\",\n"
      "data: \"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"},"
      "\"finish_reason\":null}]}\n\n"
      "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":"
      "1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},"
      "\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";
  ag_config c = test_cfg();
  char *out = NULL;
  size_t n = 0;
  cr_assert_eq(ag_proxy_relay_replay(&c, false, up, strlen(up), 0, 0, &out, &n),
               0);
  const char *two = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\","
                    "\"created\":1,\"model\":\"m\",\ndata: \"choices\":";
  cr_expect(strncmp(out, two, strlen(two)) == 0, "%s", out);
  cr_expect(strstr(out, "\n\n\n") == NULL, "no empty event: %s", out);
  cr_expect(strstr(out, "data: [DONE]\n\n") != NULL, "%s", out);
  free(out);
}

/* The chunks of a streamed Chat Completions reply, one "data:" event each,
 * then [DONE]: malloc'd. */
static char *chunk_stream(const char *const *chunks, size_t n) {
  char *b = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&b, &len);
  cr_assert_not_null(f);
  for (size_t i = 0; i < n; i++)
    fprintf(f, "data: %s\n\n", chunks[i]);
  fputs("data: [DONE]\n\n", f);
  fclose(f);
  return b;
}

/* What the client reads from `up`, replayed both ways, must be the same;
 * returns the tape's (malloc'd). */
static char *replay_both_ways(const char *up) {
  ag_config c = test_cfg();
  char *tape = NULL, *tree = NULL;
  size_t tn = 0, rn = 0;
  cr_assert_eq(
      ag_proxy_relay_replay(&c, false, up, strlen(up), 0, 0, &tape, &tn), 0);
  cr_assert_eq(ag_proxy_relay_replay(&c, false, up, strlen(up), 0,
                                     AG_PROXY_REPLAY_TREE, &tree, &rn),
               0);
  cr_expect(tn == rn && memcmp(tape, tree, tn) == 0, "tape:\n%s\ntree:\n%s",
            tape, tree);
  free(tree);
  return tape;
}

#define CHUNK_HEAD                                                             \
  "{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,"          \
  "\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{"
#define CHUNK_TAIL "},\"logprobs\":null,\"finish_reason\":null}]}"

/* A chunk that carries only text is read from the tokenizer's tape, not as
 * a jansson tree (fast_chunk); the client must get the same bytes either
 * way, for the shapes the tape takes and for the near misses it leaves to
 * the tree: a choice "index" other than the integer 0, a duplicate key, a
 * usage object, a refusal, an integer jansson cannot hold, "\u0000". */
Test(proxy, stream_text_chunks_read_from_the_tape_as_from_a_tree) {
  static const char *const chunks[] = {
      CHUNK_HEAD
      "\"role\":\"assistant\",\"content\":\"\",\"refusal\":null" CHUNK_TAIL,
      CHUNK_HEAD "\"content\":\"Hello\"" CHUNK_TAIL,
      CHUNK_HEAD
      "\"content\":\" w\\u00f6rld \\\"quoted\\\"\\n\\ud83d\\ude00\"" CHUNK_TAIL,
      CHUNK_HEAD "\"content\":null" CHUNK_TAIL,
      CHUNK_HEAD "\"content\":\"x\",\"content\":\"y\"" CHUNK_TAIL,
      CHUNK_HEAD "\"refusal\":\"no\"" CHUNK_TAIL,
      "{\"id\":\"c\",\"choices\":[{\"index\":1,\"delta\":{\"content\":"
      "\"second choice\"},\"finish_reason\":null}]}",
      "{\"id\":\"c\",\"choices\":[{\"index\":0.0,\"delta\":{\"content\":"
      "\" zero\"},\"finish_reason\":null}]}",
      "{\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":"
      "\" more\"},\"finish_reason\":null}],\"usage\":{\"prompt_tokens\":3,"
      "\"completion_tokens\":4}}",
      "{\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{},"
      "\"finish_reason\":\"stop\"}]}",
  };
  char *up = chunk_stream(chunks, sizeof chunks / sizeof chunks[0]);
  char *out = replay_both_ways(up);
  /* the text chunks went on as they came */
  cr_expect(strstr(out, chunks[1]) != NULL, "%s", out);
  cr_expect(strstr(out, chunks[2]) != NULL, "%s", out);
  cr_expect(strstr(out, "data: [DONE]\n\n") != NULL, "%s", out);
  free(out);
  free(up);
  /* what jansson refuses - "\u0000", an integer past 64 bits - ends the
   * stream with the same error event either way */
  static const char *const refused[][2] = {
      {CHUNK_HEAD "\"content\":\"Hi\"" CHUNK_TAIL,
       CHUNK_HEAD "\"content\":\"a\\u0000b\"" CHUNK_TAIL},
      {CHUNK_HEAD "\"content\":\"Hi\"" CHUNK_TAIL,
       "{\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":"
       "\" big\"},\"finish_reason\":null,\"n\":12345678901234567890}]}"},
  };
  for (size_t k = 0; k < 2; k++) {
    up = chunk_stream(refused[k], 2);
    out = replay_both_ways(up);
    cr_expect(strstr(out, "\"error\"") != NULL, "%s", out);
    cr_expect(strstr(out, "Hi") != NULL, "%s", out);
    free(out);
    free(up);
  }
}

/* The digits of every "created" the proxy wrote (its own chunks carry the
 * clock's second) as 0s, so two replays compare. */
static void no_created(char *s) {
  for (char *q = s; (q = strstr(q, "\"created\":")) != NULL;)
    for (q += 10; *q >= '0' && *q <= '9'; q++)
      *q = '0';
}

/* The stream's first chunk names the reply, and the proxy's own chunks (a
 * content loop's stop, here) carry its id and model, read from the
 * tape as from a tree: decoded, cut to 95 bytes, or "chatcmpl" and
 * "unknown" when they are not strings. */
Test(proxy, stream_first_chunk_names_the_proxys_chunks_alike_both_ways) {
  char model[128];
  memset(model, 'M', 120);
  model[120] = '\0';
  char first[512];
  snprintf(first, sizeof first,
           "{\"id\":\"c\\u00e9\\\"x\",\"object\":\"chat.completion.chunk\","
           "\"created\":1,\"model\":\"%s\",\"choices\":[{\"index\":0,"
           "\"delta\":{\"role\":\"assistant\",\"content\":\"\"},"
           "\"finish_reason\":null}]}",
           model);
  const char *firsts[] = {first,
                          "{\"id\":7,\"choices\":[{\"index\":0,\"delta\""
                          ":{\"content\":\"\"},\"finish_reason\":null}]}"};
  char named[2][160];
  snprintf(named[0], sizeof named[0], "\"id\":\"c\xc3\xa9\\\"x\"");
  snprintf(named[1], sizeof named[1], "\"id\":\"chatcmpl\"");
  char cut[128] = "\"model\":\"";
  memset(cut + 9, 'M', 95);
  strcpy(cut + 104, "\"");
  const char *models[] = {cut, "\"model\":\"unknown\""};
  const char *loop = "{\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{"
                     "\"content\":\"I will check the file again to be sure "
                     "it is right. \"},\"finish_reason\":null}]}";
  const char *chunks[61];
  for (int i = 1; i < 61; i++)
    chunks[i] = loop;
  ag_config c = test_cfg();
  for (int k = 0; k < 2; k++) {
    chunks[0] = firsts[k];
    char *up = chunk_stream(chunks, 61), *tape = NULL, *tree = NULL;
    size_t tn = 0, rn = 0;
    cr_assert_eq(
        ag_proxy_relay_replay(&c, false, up, strlen(up), 0, 0, &tape, &tn), 0);
    cr_assert_eq(ag_proxy_relay_replay(&c, false, up, strlen(up), 0,
                                       AG_PROXY_REPLAY_TREE, &tree, &rn),
                 0);
    no_created(tape);
    no_created(tree);
    cr_expect(tn == rn && strcmp(tape, tree) == 0, "tape:\n%s\ntree:\n%s", tape,
              tree);
    /* the stop's chunk, written by the proxy, with the names */
    const char *stop = strstr(tape, "agentguard stopped this turn");
    cr_assert_not_null(stop, "%s", tape);
    const char *ev = stop;
    while (ev > tape && strncmp(ev, "data: ", 6) != 0)
      ev--;
    char *line = strndup(ev, (size_t)(strchr(stop, '\n') - ev));
    cr_expect(strstr(line, named[k]) != NULL, "%s", line);
    cr_expect(strstr(line, models[k]) != NULL, "%s", line);
    free(line);
    free(tape);
    free(tree);
    free(up);
  }
}

Test(proxy, stream_content_loop_ends_the_stream) {
  char *b = NULL;
  size_t n = 0;
  FILE *f = open_memstream(&b, &n);
  for (int i = 0; i < 60; i++)
    fprintf(f, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\","
               "\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,"
               "\"delta\":{\"content\":\"I will check the file again to be "
               "sure it is right. \"},\"finish_reason\":null}]}\n\n");
  fprintf(f, "data: [DONE]\n\n");
  fclose(f);
  canned_add(200, b);
  free(b);
  char *body = streaming(conversation(0, "read", "{}", ""));
  resp *r = call(P, "POST", "/v1/chat/completions", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect(strstr(r->body, "agentguard stopped this turn (content_loop)") !=
                NULL,
            "%s", r->body);
  int relayed = 0;
  for (const char *q = r->body; (q = strstr(q, "to be sure")) != NULL; q++)
    relayed++;
  cr_expect_lt(relayed, 60, "the loop was cut short");
  cr_expect(ends_with_done(r));
  free(body);
  free(r);
}

Test(proxy, stream_replayed_stop_is_a_stream) {
  ag_proxy_stop(P);
  ag_config c = test_cfg();
  c.loop.identical_call_limit = 0;
  P = proxy_with(c, 0, NULL);
  char *body = streaming(
      conversation(3, "read", "{\"path\":\"x\"}", "Error: no such file"));
  resp *r = call(P, "POST", "/v1/chat/completions", body, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect_eq(n_upstream(), 0);
  cr_expect_str_eq(r->stop, "consecutive_errors");
  cr_expect(strncmp(r->body, "data: {", 7) == 0, "%s", r->body);
  cr_expect(strstr(r->body, "chat.completion.chunk") != NULL);
  cr_expect(ends_with_done(r));
  free(body);
  free(r);
}

Test(proxy, stream_upstream_error_passes_through) {
  canned_add(401, "{\"error\":{\"message\":\"bad key\"}}");
  char *body = streaming(conversation(0, "read", "{}", ""));
  resp *r = call(P, "POST", "/v1/chat/completions", body, NULL);
  cr_expect_eq(r->status, 401);
  cr_expect_str_eq(r->body, "{\"error\":{\"message\":\"bad key\"}}");
  free(body);
  free(r);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Each chunk reaches the client as soon as the upstream sent it: the relay
 * never waits for the upstream's next event (before the fix every chunk
 * waited for the next one, up to 100 ms). */
Test(proxy, stream_chunks_are_relayed_as_they_arrive) {
  memset(&SLOW, 0, sizeof SLOW);
  struct MHD_Daemon *d = MHD_start_daemon(
      MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION, 0, NULL,
      NULL, slow_handler, NULL, MHD_OPTION_EXTERNAL_LOGGER, quiet, NULL,
      MHD_OPTION_END);
  cr_assert_not_null(d);
  ag_proxy_stop(P);
  snprintf(upstream_url, sizeof upstream_url, "http://127.0.0.1:%u",
           (unsigned)MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT)->port);
  P = proxy_with(test_cfg(), 0, NULL);
  char url[128];
  snprintf(url, sizeof url, "http://127.0.0.1:%u/v1/chat/completions",
           (unsigned)ag_proxy_port(P));
  char *body = streaming(conversation(0, "read", "{}", ""));
  timed_body *t = calloc(1, sizeof *t);
  CURL *h = curl_easy_init();
  curl_easy_setopt(h, CURLOPT_URL, url);
  curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, timed_write);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, t);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 20000L);
  CURLcode cc = curl_easy_perform(h);
  long status = 0;
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
  curl_easy_cleanup(h);
  MHD_stop_daemon(d);
  cr_assert_eq(cc, CURLE_OK, "%s", curl_easy_strerror(cc));
  cr_assert_eq(status, 200, "%s", t->text);
  cr_expect(strstr(t->text, "data: [DONE]") != NULL, "%s", t->text);
  double delay[SLOW_CHUNKS];
  for (int i = 0; i < SLOW_CHUNKS; i++) {
    cr_assert_gt(t->got_ms[i], 0, "chunk %d never came: %s", i, t->text);
    delay[i] = t->got_ms[i] - SLOW.sent_ms[i];
  }
  qsort(delay, SLOW_CHUNKS, sizeof delay[0], cmp_double);
  /* the median of five: one slow moment on a busy machine does not count */
  cr_expect_lt(delay[SLOW_CHUNKS / 2], 50.0,
               "a chunk reached the client %.1f ms (median) after the "
               "upstream sent it (%.1f .. %.1f)",
               delay[SLOW_CHUNKS / 2], delay[0], delay[SLOW_CHUNKS - 1]);
  free(t);
  free(body);
}

/* ---- Streams the client does not keep up with, leaves, or that the
 * proxy's stop cuts ------------------------------------------------------- */

/* An upstream that streams `chunks` text chunks of `bytes` random letters
 * (each tagged <k>), `gap_ms` apart, then [DONE]; it notes when its response is
 * let go of (the transfer ended, or the proxy closed the connection). */
typedef struct long_up {
  int chunks, bytes, gap_ms;
  int pad; /* bytes of padding in another field of each chunk */
  atomic_int sent;
  atomic_llong freed_ms; /* ag_now_ms(); 0 until freed */
} long_up;

typedef struct long_conn {
  long_up *u;
  int sent;
  unsigned long long rng;
  char *pending;
  size_t plen, poff;
} long_conn;

static ssize_t long_reader(void *cls, uint64_t pos, char *buf, size_t max) {
  (void)pos;
  long_conn *k = cls;
  if (k->poff == k->plen) {
    if (k->sent > k->u->chunks)
      return MHD_CONTENT_READER_END_OF_STREAM;
    if (k->sent > 0 && k->u->gap_ms > 0) {
      struct timespec ts = {0, k->u->gap_ms * 1000000L};
      nanosleep(&ts, NULL);
    }
    if (k->sent < k->u->chunks) {
      int n = snprintf(k->pending, 256,
                       "data: {\"id\":\"c\",\"object\":\"chat.completion."
                       "chunk\",\"created\":1,\"model\":\"m\",\"x_pad\":\"");
      memset(k->pending + n, 'p', (size_t)k->u->pad);
      n += k->u->pad;
      n += snprintf(k->pending + n, 256,
                    "\",\"choices\":[{\"index\":0,\"delta\":{\"content\":"
                    "\"<k>");
      /* letters that never repeat: the content-loop detector stays quiet */
      for (int i = 0; i < k->u->bytes; i++) {
        k->rng = k->rng * 6364136223846793005ULL + 1442695040888963407ULL;
        k->pending[n + i] = (char)('a' + (k->rng >> 33) % 26);
      }
      n += k->u->bytes;
      n += snprintf(k->pending + n, 64, "\"},\"finish_reason\":null}]}\n\n");
      k->plen = (size_t)n;
      atomic_fetch_add(&k->u->sent, 1);
    } else {
      k->plen = (size_t)snprintf(
          k->pending, 256,
          "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\","
          "\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,"
          "\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n");
    }
    k->sent++;
    k->poff = 0;
  }
  size_t n = k->plen - k->poff < max ? k->plen - k->poff : max;
  memcpy(buf, k->pending + k->poff, n);
  k->poff += n;
  return (ssize_t)n;
}

static void long_free(void *cls) {
  long_conn *k = cls;
  atomic_store(&k->u->freed_ms, (long long)ag_now_ms());
  free(k->pending);
  free(k);
}

static enum MHD_Result long_handler(void *cls, struct MHD_Connection *c,
                                    const char *url, const char *method,
                                    const char *version, const char *upload,
                                    size_t *upload_size, void **con_cls) {
  (void)url, (void)method, (void)version, (void)upload;
  if (*con_cls == NULL) {
    *con_cls = c;
    return MHD_YES;
  }
  if (*upload_size > 0) {
    *upload_size = 0;
    return MHD_YES;
  }
  long_conn *k = calloc(1, sizeof *k);
  k->u = cls;
  k->pending = malloc(768 + (size_t)k->u->bytes + (size_t)k->u->pad);
  struct MHD_Response *r = MHD_create_response_from_callback(
      MHD_SIZE_UNKNOWN, 16384, long_reader, k, long_free);
  MHD_add_response_header(r, "Content-Type", "text/event-stream");
  enum MHD_Result ret = MHD_queue_response(c, 200, r);
  MHD_destroy_response(r);
  return ret;
}

/* Starts a long_up upstream and a proxy in front of it (P replaced). */
static struct MHD_Daemon *long_start(long_up *u) {
  struct MHD_Daemon *d = MHD_start_daemon(
      MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION, 0, NULL,
      NULL, long_handler, u, MHD_OPTION_EXTERNAL_LOGGER, quiet, NULL,
      MHD_OPTION_END);
  cr_assert_not_null(d);
  ag_proxy_stop(P);
  snprintf(upstream_url, sizeof upstream_url, "http://127.0.0.1:%u",
           (unsigned)MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT)->port);
  P = proxy_with(test_cfg(), 0, NULL);
  return d;
}

/* A small receive buffer for a slow client: on loopback the kernel lets a
 * socket's buffer grow to tcp_rmem's maximum (32 MiB here), which held a
 * whole stream for the slow client, so the proxy never saw it was slow
 * (and the stop test saw [DONE] arrive from the buffer after the stop). */
static int small_rcvbuf(void *user, curl_socket_t fd, curlsocktype purpose) {
  (void)user;
  (void)purpose;
  int sz = 64 << 10;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sz, sizeof sz);
  return CURL_SOCKOPT_OK;
}

static CURLcode long_get(big_body *b, long max_recv_speed) {
  char url[128];
  snprintf(url, sizeof url, "http://127.0.0.1:%u/v1/chat/completions",
           (unsigned)ag_proxy_port(P));
  char *body = streaming(conversation(0, "read", "{}", ""));
  CURL *h = curl_easy_init();
  curl_easy_setopt(h, CURLOPT_URL, url);
  curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, big_write);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, b);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 30000L);
  if (max_recv_speed > 0) {
    curl_easy_setopt(h, CURLOPT_MAX_RECV_SPEED_LARGE,
                     (curl_off_t)max_recv_speed);
    curl_easy_setopt(h, CURLOPT_SOCKOPTFUNCTION, small_rcvbuf);
  }
  CURLcode cc = curl_easy_perform(h);
  curl_easy_cleanup(h);
  free(body);
  return cc;
}

static int count_of(const char *hay, const char *needle) {
  int n = 0;
  for (const char *p = hay; p != NULL && (p = strstr(p, needle)) != NULL;
       p += strlen(needle))
    n++;
  return n;
}

/* A client reading slower than the upstream sends: the relay pauses the
 * upstream while 1 MiB waits for the client and the stream arrives whole
 * (9 MB, 3 of them text: more than the proxy's socket buffer takes, 4
 * MiB at most here; without the pause the queue passes its 2 MiB cap and
 * the stream ends in an error). */
Test(proxy, stream_slow_client_gets_it_all) {
  long_up u = {.chunks = 3000, .bytes = 1000, .pad = 2000, .gap_ms = 0};
  struct MHD_Daemon *d = long_start(&u);
  big_body b = {.stop_after = 0};
  CURLcode cc = long_get(&b, 6L << 20); /* 6 MB/s: about 1.5 s */
  MHD_stop_daemon(d);
  cr_assert_eq(cc, CURLE_OK, "%s", curl_easy_strerror(cc));
  cr_expect_eq(count_of(b.p, "<k>"), 3000, "%d chunks of 3000; end: %s",
               count_of(b.p, "<k>"), b.len > 300 ? b.p + b.len - 300 : b.p);
  cr_expect(strstr(b.p, "data: [DONE]") != NULL);
  free(b.p);
}

/* A client that leaves mid-stream: the proxy ends its upstream transfer
 * at once (the upstream would otherwise stream for 4 more seconds). */
Test(proxy, stream_client_gone_ends_the_upstream_transfer) {
  long_up u = {.chunks = 200, .bytes = 10, .gap_ms = 20};
  struct MHD_Daemon *d = long_start(&u);
  big_body b = {.stop_after = 1};
  CURLcode cc = long_get(&b, 0);
  int64_t left = ag_now_ms();
  cr_expect_eq(cc, CURLE_WRITE_ERROR, "%s", curl_easy_strerror(cc));
  while (atomic_load(&u.freed_ms) == 0 && ag_now_ms() - left < 10000)
    nap_ms(10);
  int64_t freed = atomic_load(&u.freed_ms);
  int sent = atomic_load(&u.sent);
  MHD_stop_daemon(d);
  cr_assert_neq(freed, 0, "the upstream's response was never let go of");
  cr_expect_lt(freed - left, 1500,
               "the upstream transfer went on %.0f ms after the client left "
               "(%d of 200 chunks sent)",
               (double)(freed - left), sent);
  cr_expect_lt(sent, 150, "%d of 200 chunks sent", sent);
  free(b.p);
}

typedef struct stop_client {
  big_body b;
  CURLcode cc;
  long speed;     /* bytes a second the client reads at most; 0: any */
  atomic_int got; /* bytes read so far */
} stop_client;

static void *stop_client_main(void *arg) {
  stop_client *sc = arg;
  sc->b.got = &sc->got;
  sc->cc = long_get(&sc->b, sc->speed);
  return NULL;
}

/* The proxy stopped while a stream is relayed: the stop returns soon, the
 * client's stream ends (with an error event, not [DONE]), nothing hangs
 * and libmicrohttpd is not left with a suspended connection. */
Test(proxy, stop_with_a_stream_open_ends_it) {
  long_up u = {.chunks = 200, .bytes = 10, .gap_ms = 20};
  struct MHD_Daemon *d = long_start(&u);
  stop_client sc;
  memset(&sc, 0, sizeof sc);
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, stop_client_main, &sc), 0);
  int64_t t0 = ag_now_ms();
  while (atomic_load(&u.sent) < 3 && ag_now_ms() - t0 < 10000)
    nap_ms(5);
  cr_assert_geq(atomic_load(&u.sent), 3, "the stream never started");
  int64_t s0 = ag_now_ms();
  ag_proxy_stop(P);
  P = NULL;
  int64_t stopped = ag_now_ms() - s0;
  pthread_join(t, NULL);
  int64_t ended = ag_now_ms() - s0;
  int sent = atomic_load(&u.sent);
  MHD_stop_daemon(d);
  cr_expect_lt(stopped, 2000, "ag_proxy_stop took %lld ms", (long long)stopped);
  cr_expect_lt(ended, 2000, "the client's stream ended %lld ms after",
               (long long)ended);
  cr_expect_lt(sent, 150, "%d of 200 chunks sent", sent);
  cr_expect(sc.b.p != NULL && strstr(sc.b.p, "data: [DONE]") == NULL, "%s",
            sc.b.p != NULL ? sc.b.p : "(nothing)");
  free(sc.b.p);
}

/* 12 MB through to a client that keeps up: the queue keeps only what
 * waits (before, it was compacted only when the client had read it all,
 * and a stream ended with "too large" at 8 MB in total). */
Test(proxy, stream_of_12_mb_reaches_a_fast_client) {
  long_up u = {.chunks = 3000, .bytes = 10, .gap_ms = 0, .pad = 4000};
  struct MHD_Daemon *d = long_start(&u);
  big_body b = {.stop_after = 0};
  CURLcode cc = long_get(&b, 0);
  MHD_stop_daemon(d);
  cr_assert_eq(cc, CURLE_OK, "%s", curl_easy_strerror(cc));
  cr_expect_gt(b.len, (size_t)12000, "%zu bytes", b.len);
  cr_expect_eq(count_of(b.p, "<k>"), 3000, "%d chunks of 3000; end: %.300s",
               count_of(b.p, "<k>"), b.len > 300 ? b.p + b.len - 300 : b.p);
  cr_expect(strstr(b.p, "data: [DONE]") != NULL);
  free(b.p);
}

/* A reply whose text passes what the proxy keeps of it (the assembler's
 * cap, 4 MiB): the stream ends with an error event, not a clean end the
 * client would take for a whole reply. */
Test(proxy, stream_past_the_text_cap_ends_with_an_error_event) {
  long_up u = {.chunks = 5000, .bytes = 1000, .gap_ms = 0};
  struct MHD_Daemon *d = long_start(&u);
  big_body b = {.stop_after = 0};
  CURLcode cc = long_get(&b, 0);
  MHD_stop_daemon(d);
  cr_assert_eq(cc, CURLE_OK, "%s", curl_easy_strerror(cc));
  const char *tail = b.len > 400 ? b.p + b.len - 400 : b.p;
  cr_expect(strstr(tail, "\"error\"") != NULL, "end: %s", tail);
  cr_expect(strstr(b.p, "data: [DONE]") == NULL, "end: %s", tail);
  free(b.p);
}

/* The proxy stopped while a slow client's stream is paused: the paused
 * transfer is ended too (else the stop would wait for it), the client's
 * stream ends without [DONE], and nothing is left (ASan and LeakSanitizer
 * in CI's build). A review's stress harness also found that the client's
 * reads during the stop could queue an unpause on the relay already
 * freed; stream_read no longer asks for one once the transfer has ended
 * (this test does not reach that timing reliably; the harness did). */
Test(proxy, stop_while_a_slow_stream_is_paused) {
  long_up u = {.chunks = 3000, .bytes = 1000, .pad = 2000, .gap_ms = 0};
  struct MHD_Daemon *d = long_start(&u);
  stop_client sc;
  memset(&sc, 0, sizeof sc);
  sc.speed = 1L << 20; /* 1 MB/s: the upstream is paused at 1 MiB queued */
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, stop_client_main, &sc), 0);
  int64_t t0 = ag_now_ms();
  while (atomic_load(&sc.got) < (256 << 10) && ag_now_ms() - t0 < 10000)
    nap_ms(5);
  cr_assert_geq(atomic_load(&sc.got), 256 << 10, "the stream never got going");
  ag_proxy_stop(P);
  P = NULL;
  pthread_join(t, NULL);
  MHD_stop_daemon(d);
  cr_expect(sc.b.p != NULL && strstr(sc.b.p, "data: [DONE]") == NULL);
  free(sc.b.p);
}

/* Requests one after the other (plain, streamed, passed through) from one
 * client, on its kept connection as the SDKs keep theirs, reach the
 * upstream over one connection: the proxy keeps it between requests (in
 * the event loop that serves the client's connection; before, every
 * request opened a new one). */
Test(proxy, upstream_connection_is_used_again) {
  canned_call(NULL, "one");
  canned_call(NULL, "two");
  canned_stream_call("{\"path\":\"b\"}");
  canned_add(200, "{\"data\":[]}");
  char *body = conversation(0, "read", "{}", "");
  char *sbody =
      streaming(conversation(1, "read", "{\"path\":\"a\"}", "text of a"));
  CURL *h = curl_easy_init();
  resp *r = call_on(h, P, "POST", "/v1/chat/completions", body, NULL);
  cr_expect_eq(r->status, 200, "%s", r->body);
  free(r);
  r = call_on(h, P, "POST", "/v1/chat/completions", body, NULL);
  cr_expect_eq(r->status, 200, "%s", r->body);
  free(r);
  r = call_on(h, P, "POST", "/v1/chat/completions", sbody, NULL);
  cr_expect_eq(r->status, 200, "%s", r->body);
  cr_expect(ends_with_done(r), "%s", r->body);
  free(r);
  r = call_on(h, P, "GET", "/v1/models", NULL, NULL);
  cr_expect_eq(r->status, 200, "%s", r->body);
  free(r);
  curl_easy_cleanup(h);
  cr_expect_eq(n_upstream(), 4);
  pthread_mutex_lock(&U.mu);
  int conns = U.n_conns;
  pthread_mutex_unlock(&U.mu);
  cr_expect_eq(conns, 1, "4 requests, %d upstream connections", conns);
  free(body);
  free(sbody);
}

static double cpu_s(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 +
         (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
}

/* A kept upstream connection's socket stays in the loop's epoll set while
 * idle (relay.c). An upstream that closes it (here after 1 s idle) makes
 * it readable: the loop takes it out of the set then - no loop spinning on
 * it (the process's CPU over the idle 2.5 s stays small) - and the next
 * request goes over a new connection. */
Test(proxy, upstream_closing_an_idle_connection) {
  struct MHD_Daemon *d = MHD_start_daemon(
      MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION |
          MHD_USE_ERROR_LOG,
      0, NULL, NULL, up_handler, NULL, MHD_OPTION_NOTIFY_COMPLETED,
      up_completed, NULL, MHD_OPTION_NOTIFY_CONNECTION, up_conn_notify, NULL,
      MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)1, MHD_OPTION_EXTERNAL_LOGGER,
      quiet, NULL, MHD_OPTION_END);
  cr_assert_not_null(d);
  char url[64];
  snprintf(url, sizeof url, "http://127.0.0.1:%d/v1",
           MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT)->port);
  ag_proxy_opts o = test_opts();
  o.upstream = url;
  ag_proxy *p = start_with(&o);
  canned_call(NULL, "one");
  canned_call(NULL, "two");
  char *body = conversation(0, "read", "{}", "");
  CURL *h = curl_easy_init();
  resp *r = call_on(h, p, "POST", "/v1/chat/completions", body, NULL);
  cr_expect_eq(r->status, 200, "%s", r->body);
  free(r);
  double c0 = cpu_s();
  nap_ms(2500);
  double idle = cpu_s() - c0;
  cr_expect_lt(idle, 0.5, "%.2f s of CPU while the proxy was idle", idle);
  r = call_on(h, p, "POST", "/v1/chat/completions", body, NULL);
  cr_expect_eq(r->status, 200, "%s", r->body);
  cr_expect(strstr(r->body, "two") != NULL, "%s", r->body);
  free(r);
  curl_easy_cleanup(h);
  ag_proxy_stop(p);
  MHD_stop_daemon(d);
  pthread_mutex_lock(&U.mu);
  int conns = U.n_conns;
  pthread_mutex_unlock(&U.mu);
  cr_expect_eq(conns, 2, "%d upstream connections", conns);
  free(body);
}

/* --max-connections holds over every event loop: with a limit of 1, a
 * second client connection gets a 503 while the first one is open. */
/* An idle connection (kept open by its client after its request) gives
 * its slot to a new one: each new client is served, and the first one's
 * client reconnects and is served too. */
Test(proxy, idle_connection_gives_its_slot_to_a_new_one) {
  ag_proxy_stop(P);
  ag_proxy_opts o = test_opts();
  o.max_connections = 1;
  P = start_with(&o);
  canned_add(200, "{\"data\":[]}");
  CURL *first = curl_easy_init();
  resp *r = call_on(first, P, "GET", "/v1/models", NULL, NULL);
  cr_expect_eq(r->status, 200, "%s", r->body);
  free(r);
  /* each one kept open by its client, idle after its answer */
  CURL *more[4];
  for (int i = 0; i < 4; i++) {
    more[i] = curl_easy_init();
    r = call_on(more[i], P, "GET", "/v1/models", NULL, NULL);
    cr_expect_eq(r->status, 200, "%d: %s", i, r->body);
    free(r);
  }
  r = call_on(first, P, "GET", "/v1/models", NULL, NULL);
  cr_expect_eq(r->status, 200, "%s", r->body);
  free(r);
  curl_easy_cleanup(first);
  for (int i = 0; i < 4; i++)
    curl_easy_cleanup(more[i]);
}

/* A chunk without a choice before anything is held (Azure OpenAI's first
 * one, with its prompt_filter_results) reaches the client first, where it
 * came; the usage chunk after the finish stays behind it. */
Test(proxy, stream_chunk_without_a_choice_goes_on_in_its_place) {
  const char *azure_first = "{\"choices\":[],\"created\":0,\"id\":\"\","
                            "\"model\":\"\",\"object\":\"\","
                            "\"prompt_filter_results\":[{\"prompt_index\":0,"
                            "\"content_filter_results\":{}}]}";
  const char *head = "{\"id\":\"chatcmpl-az\",\"object\":\"chat.completion."
                     "chunk\",\"created\":1,\"model\":\"m\",\"choices\":";
  char up[2048];
  snprintf(
      up, sizeof up,
      "data: %s\n\n"
      "data: %s[{\"index\":0,\"delta\":{\"role\":\"assistant\","
      "\"content\":\"Hello\"},\"finish_reason\":null,"
      "\"content_filter_results\":{}}]}\n\n"
      "data: %s[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n"
      "data: %s[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":1,"
      "\"total_tokens\":6}}\n\n"
      "data: [DONE]\n\n",
      azure_first, head, head, head);
  canned_add(200, up);
  char *body =
      streaming(conversation(1, "read", "{\"path\":\"a\"}", "text of a"));
  resp *r = call(P, "POST", "/openai/deployments/gpt-4o/chat/completions", body,
                 NULL);
  cr_expect_eq(r->status, 200);
  cr_expect_str_empty(r->stop);
  const char *first = strstr(r->body, "prompt_filter_results"),
             *hello = strstr(r->body, "Hello"),
             *stop = strstr(r->body, "\"finish_reason\":\"stop\""),
             *usage = strstr(r->body, "\"usage\"");
  cr_assert(first != NULL && hello != NULL && stop != NULL && usage != NULL,
            "%s", r->body);
  cr_expect(strncmp(r->body + 6, azure_first, strlen(azure_first)) == 0,
            "the first chunk first, as it came: %s", r->body);
  cr_expect(first < hello && hello < stop && stop < usage, "%s", r->body);
  cr_expect(ends_with_done(r), "%s", r->body);
  free(body);
  free(r);
}
