/*
 * proxy_ops.c - operating the proxy: events, the access log, traces, health,
 * readiness, drain, several upstreams (test_proxy's cases; the fake upstream,
 * the proxy under test and the client are proxy_fixture.h's).
 */
#include "proxy_fixture.h"

Test(proxy, bad_request_writes_an_event) {
  ag_proxy_stop(P);
  FILE *ev = tmpfile();
  cr_assert_not_null(ev);
  ag_proxy_opts o = test_opts();
  o.events = ev;
  P = start_with(&o);
  resp *r = call(P, "POST", "/v1/messages",
                 "{\"model\":\"m\",\"max_tokens\":5,\"messages\":[{\"role\":"
                 "\"robot\",\"content\":\"hi\"}]}",
                 NULL);
  cr_expect_eq(r->status, 400, "%s", r->body);
  free(r);
  ag_proxy_stop(P);
  P = NULL;
  rewind(ev);
  char line[2048] = "";
  cr_expect_not_null(fgets(line, sizeof line, ev));
  cr_expect(strstr(line, "\"decision\":\"bad_request\"") != NULL, "%s", line);
  cr_expect(strstr(line, "\"api\":\"anthropic\"") != NULL, "%s", line);
  cr_expect(strstr(line, "messages[0].role") != NULL, "%s", line);
  fclose(ev);
}

/* Attribution: each request answered writes one access-log line (JSON
 * here) naming its number, client, API, model, conversation, decision,
 * status, time and tokens, and the decision events carry the same ids.
 * A conversation keeps its id as it grows (the id is the hash of its
 * start); another conversation gets another; a client's
 * x-agentguard-session wins and is not forwarded; a query (it may hold a
 * key) is not logged. */
/* GET /metrics until its text holds `want` (2 s at most; the last answer
 * either way). A request is counted when its answer has gone
 * (libmicrohttpd's completion), which may come after the client has read
 * it, and /metrics may be answered by another loop first. */
static resp *metrics_with(const ag_proxy *p, const char *want) {
  for (int tries = 0;; tries++) {
    resp *r = call(p, "GET", "/metrics", NULL, NULL);
    if (tries == 200 || strstr(r->body, want) != NULL)
      return r;
    free(r);
    struct timespec ts = {0, 10 * 1000000};
    nanosleep(&ts, NULL);
  }
}

Test(proxy, every_request_is_logged_with_who_it_is_for) {
  ag_proxy_stop(P);
  FILE *ev = tmpfile(), *log = tmpfile();
  cr_assert(ev != NULL && log != NULL);
  ag_proxy_opts o = test_opts();
  o.events = ev;
  o.access_log = log;
  o.access_log_json = true;
  P = start_with(&o);
  canned_call("read", "{\"path\":\"b\"}");
  canned_call("read", "{\"path\":\"c\"}");
  char *one = conversation(0, "read", "{\"path\":\"a\"}", "text of a");
  char *two = conversation(1, "read", "{\"path\":\"a\"}", "text of a");
  char *stop = conversation(3, "read", "{\"path\":\"a\"}", "same");
  resp *r = call(P, "POST", "/v1/chat/completions", one, NULL);
  cr_expect_eq(r->status, 200);
  free(r);
  r = call(P, "POST", "/v1/chat/completions", two, NULL);
  cr_expect_eq(r->status, 200);
  free(r);
  r = call(P, "POST", "/v1/chat/completions", stop,
           "x-agentguard-session: team-a/run 7");
  cr_expect_str_eq(r->stop, "identical_calls");
  free(r);
  canned_add(200, "{\"object\":\"list\",\"data\":[]}");
  r = call(P, "GET", "/v1/models?key=sk-in-the-query", NULL,
           "x-agentguard-session: probe");
  free(r);
  /* a different first user message: another conversation */
  canned_call(NULL, "done");
  json_t *other = json_loads(one, 0, NULL);
  json_object_set_new(json_array_get(json_object_get(other, "messages"), 1),
                      "content", json_string("Read the other file."));
  char *three = json_dumps(other, JSON_COMPACT);
  json_decref(other);
  r = call(P, "POST", "/v1/chat/completions", three, NULL);
  free(r);
  /* the same in /metrics: the tokens read, the stop's estimated saving
   * (its body / 4), the upstream's time and the proxy's own, once the last
   * request is counted */
  r = metrics_with(P, "agentguard_proxy_added_latency_seconds_count 4\n");
  cr_expect(strstr(r->body, "agentguard_proxy_tokens_total{kind=\"input\"} "
                            "30\n") != NULL,
            "%s", r->body);
  cr_expect(strstr(r->body, "agentguard_proxy_tokens_total{kind=\"output\"} "
                            "15\n") != NULL,
            "%s", r->body);
  char want[96];
  snprintf(want, sizeof want,
           "agentguard_proxy_tokens_saved_estimate_total %zu\n",
           strlen(stop) / 4);
  cr_expect(strstr(r->body, want) != NULL, "%s\n%s", want, r->body);
  cr_expect(strstr(r->body, "agentguard_proxy_upstream_duration_seconds_count "
                            "4\n") != NULL,
            "%s", r->body);
  cr_expect(strstr(r->body, "agentguard_proxy_added_latency_seconds_count "
                            "4\n") != NULL,
            "%s", r->body);
  free(r);
  ag_proxy_stop(P);
  P = NULL;
  cr_expect_eq(n_upstream(), 4, "the stop went nowhere");
  pthread_mutex_lock(&U.mu);
  for (int i = 0; i < U.n_reqs; i++)
    cr_expect_null(U.reqs[i].sess, "x-agentguard-session went upstream");
  pthread_mutex_unlock(&U.mu);

  rewind(log);
  char line[4096];
  json_t *l[5] = {NULL};
  int n = 0;
  while (n < 5 && fgets(line, sizeof line, log) != NULL) {
    l[n] = json_loads(line, 0, NULL);
    cr_assert_not_null(l[n], "not JSON: %s", line);
    cr_expect(strstr(line, "sk-in-the-query") == NULL, "%s", line);
    n++;
  }
  cr_assert_eq(n, 5, "%d access-log lines", n);
  /* a line is written at the request's completion, on its connection's
   * loop: two loops may write theirs in either order - by request id */
  for (int i = 1; i < n; i++)
    for (int k = i;
         k > 0 && json_integer_value(json_object_get(l[k], "id")) <
                      json_integer_value(json_object_get(l[k - 1], "id"));
         k--) {
      json_t *t = l[k];
      l[k] = l[k - 1];
      l[k - 1] = t;
    }
#define F(i, k) json_object_get(l[i], k)
#define S(i, k) json_string_value(F(i, k))
  for (int i = 0; i < 5; i++) {
    cr_expect_eq(json_integer_value(F(i, "id")), i + 1);
    cr_expect_str_eq(S(i, "client"), "127.0.0.1");
    cr_expect_eq(json_integer_value(F(i, "status")), 200);
    cr_expect(json_integer_value(F(i, "ms")) >= 0);
    /* every request but the stop went upstream */
    cr_expect(i == 2 ? F(i, "upstream_ms") == NULL
                     : json_integer_value(F(i, "upstream_ms")) >= 0);
  }
  cr_expect_str_eq(S(0, "api"), "openai");
  cr_expect_str_eq(S(0, "model"), "m");
  cr_expect_str_eq(S(0, "decision"), "passed");
  cr_expect_eq(json_integer_value(F(0, "input_tokens")), 10);
  cr_expect_eq(json_integer_value(F(0, "output_tokens")), 5);
  cr_assert_not_null(S(0, "conversation"));
  cr_expect_eq(strlen(S(0, "conversation")), 16);
  cr_expect_str_eq(S(1, "conversation"), S(0, "conversation"),
                   "a conversation keeps its id as it grows");
  cr_expect_str_eq(S(2, "conversation"), "team-a/run_7");
  cr_expect_str_eq(S(2, "decision"), "stopped_before_request");
  cr_expect_str_eq(S(2, "reason"), "identical_calls");
  cr_expect_str_eq(S(3, "method"), "GET");
  cr_expect_str_eq(S(3, "path"), "/v1/models");
  cr_expect_str_eq(S(3, "decision"), "relayed");
  cr_expect_str_eq(S(3, "conversation"), "probe");
  cr_expect_null(F(3, "api"));
  cr_assert_not_null(S(4, "conversation"));
  cr_expect_str_neq(S(4, "conversation"), S(0, "conversation"),
                    "another conversation, another id");
#undef F
#undef S
  for (int i = 0; i < 5; i++)
    json_decref(l[i]);
  /* the stop's event names the same request */
  rewind(ev);
  cr_assert_not_null(fgets(line, sizeof line, ev));
  cr_expect(strstr(line, "\"request_id\":3") != NULL, "%s", line);
  cr_expect(strstr(line, "\"conversation\":\"team-a/run_7\"") != NULL, "%s",
            line);
  cr_expect(strstr(line, "\"model\":\"m\"") != NULL, "%s", line);
  cr_expect(strstr(line, "\"client\":\"127.0.0.1\"") != NULL, "%s", line);
  fclose(ev);
  fclose(log);
  free(one);
  free(two);
  free(three);
  free(stop);
}

/* The scratch a body is read with is kept for the next request and grows
 * for a larger one: small, large (120 KB: past what is kept), small again,
 * each decided and attributed as a request alone is. */
Test(proxy, kept_readers_read_bodies_of_any_size) {
  ag_proxy_stop(P);
  FILE *log = tmpfile();
  cr_assert_not_null(log);
  ag_proxy_opts o = test_opts();
  o.access_log = log;
  o.access_log_json = true;
  P = start_with(&o);
  char *big = malloc(40001);
  cr_assert_not_null(big);
  for (int i = 0; i < 40000; i++)
    big[i] = (char)('a' + i % 26);
  big[40000] = '\0';
  const char *want[] = {NULL, "identical_calls", NULL, "identical_calls"};
  for (int k = 0; k < 4; k++) {
    char *body = conversation(k % 2 ? 3 : 0, "read", "{\"path\":\"a\"}",
                              k == 1 ? big : "text of a");
    if (want[k] == NULL)
      canned_call(NULL, "done");
    resp *r = call(P, "POST", "/v1/chat/completions", body, NULL);
    cr_expect_eq(r->status, 200, "request %d: %s", k, r->body);
    if (want[k] != NULL)
      cr_expect_str_eq(r->stop, want[k], "request %d", k);
    else
      cr_expect_str_eq(r->stop, "", "request %d", k);
    free(r);
    free(body);
  }
  free(big);
  ag_proxy_stop(P);
  P = NULL;
  cr_expect_eq(n_upstream(), 2, "the stops went nowhere");
  rewind(log);
  char line[4096];
  int n = 0;
  while (fgets(line, sizeof line, log) != NULL) {
    json_t *l = json_loads(line, 0, NULL);
    cr_assert_not_null(l, "not JSON: %s", line);
    cr_expect_str_eq(json_string_value(json_object_get(l, "model")), "m", "%s",
                     line);
    cr_expect(json_is_string(json_object_get(l, "conversation")), "%s", line);
    json_decref(l);
    n++;
  }
  cr_expect_eq(n, 4, "%d access-log lines", n);
  fclose(log);
}

/* A stream's own decision reaches its access-log line (the stream is the
 * response's and may outlive the request, or the other way round). */
Test(proxy, a_streams_decision_is_in_its_log_line) {
  ag_proxy_stop(P);
  FILE *log = tmpfile();
  cr_assert_not_null(log);
  ag_proxy_opts o = test_opts();
  o.access_log = log;
  P = start_with(&o);
  canned_stream_call("{\"path\":\"a\"}");
  char *body =
      streaming(conversation(2, "read", "{\"path\":\"a\"}", "text of a"));
  resp *r = call(P, "POST", "/v1/chat/completions", body, NULL);
  cr_expect(strstr(r->body, "agentguard stopped this turn") != NULL, "%s",
            r->body);
  free(r);
  free(body);
  ag_proxy_stop(P);
  P = NULL;
  rewind(log);
  char line[2048] = "";
  cr_assert_not_null(fgets(line, sizeof line, log));
  cr_expect(strstr(line, " #1 127.0.0.1 POST /v1/chat/completions api=openai "
                         "model=m conv=") != NULL,
            "%s", line);
  cr_expect(strstr(line, " reply_replaced reason=identical_calls status=200 "
                         "ms=") != NULL,
            "%s", line);
  cr_expect(strstr(line, " upstream_ms=") != NULL &&
                strstr(line, " upstream_ms=-") == NULL,
            "%s", line);
  fclose(log);
}

/* The value of span attribute `key` (a string, or an int's decimal
 * text in buf), or NULL. */
static char span_int[32];
static const char *span_attr(const json_t *span, const char *key) {
  size_t i;
  json_t *a;
  json_array_foreach(json_object_get(span, "attributes"), i, a) {
    if (strcmp(json_string_value(json_object_get(a, "key")), key) != 0)
      continue;
    json_t *v = json_object_get(a, "value");
    json_t *s = json_object_get(v, "stringValue");
    if (s != NULL)
      return json_string_value(s);
    json_t *n = json_object_get(v, "intValue");
    if (!json_is_integer(n))
      return NULL;
    snprintf(span_int, sizeof span_int, "%lld",
             (long long)json_integer_value(n));
    return span_int;
  }
  return NULL;
}

static bool lower_hex(const char *s, size_t n) {
  if (s == NULL || strlen(s) != n)
    return false;
  for (size_t i = 0; i < n; i++)
    if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
      return false;
  return true;
}

/* A client's headers go upstream in one list (one allocation, however
 * many): all of them, hop-by-hop ones and the proxy's own out, and with
 * traces on the client's traceparent headers replaced by the proxy's one. */
Test(proxy, every_client_header_reaches_the_upstream_in_one_list) {
  ag_proxy_stop(P);
  char url[96], hs[4096];
  snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/traces", U.port);
  ag_proxy_opts o = test_opts();
  o.otlp_traces_url = url;
  P = start_with(&o);
  canned_call(NULL, "done");
  size_t n =
      (size_t)snprintf(hs, sizeof hs,
                       "traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-"
                       "00f067aa0ba902b7-01\nx-team: red\n"
                       "Proxy-Connection: keep-alive\n"
                       "x-agentguard-session: s1\nTraceparent: 00-"
                       "4bf92f3577b34da6a3ce929d0e0e4736-"
                       "00f067aa0ba902b8-01");
  for (int i = 0; i < 40; i++)
    n += (size_t)snprintf(hs + n, sizeof hs - n, "\nx-h-%d: value %d", i, i);
  cr_assert_lt(n, sizeof hs);
  char *pass = conversation(0, "read", "{\"path\":\"a\"}", "x");
  resp *r = call(P, "POST", "/v1/chat/completions", pass, hs);
  cr_expect_eq(r->status, 200);
  free(r);
  free(pass);
  pthread_mutex_lock(&U.mu);
  cr_assert_geq(U.n_reqs, 1);
  seen *s = &U.reqs[0];
  cr_expect_eq(s->n_xh, 40);
  cr_expect_str_eq(s->team, "red");
  cr_expect_str_eq(s->auth, "Bearer sk-client-secret");
  cr_expect_null(s->sess);
  cr_expect_eq(s->n_tp, 1, "%d traceparent headers upstream", s->n_tp);
  /* the proxy's span, a child in the client's trace */
  cr_expect(s->tp != NULL &&
                strncmp(s->tp, "00-4bf92f3577b34da6a3ce929d0e0e4736-", 36) ==
                    0 &&
                strncmp(s->tp + 36, "00f067aa0ba902b", 15) != 0,
            "%s", s->tp != NULL ? s->tp : "(none)");
  pthread_mutex_unlock(&U.mu);
}

/* OpenTelemetry: each guarded request is a span, posted as OTLP/HTTP JSON
 * with the headers given; a client's traceparent makes it a child in the
 * client's trace; the GenAI attributes and the decision are on it. The
 * spans queued when the proxy stops are sent then. */
Test(proxy, each_guarded_request_is_a_span_in_the_clients_trace) {
  ag_proxy_stop(P);
  char url[96];
  snprintf(url, sizeof url, "http://127.0.0.1:%d/v1/traces", U.port);
  ag_proxy_opts o = test_opts();
  o.otlp_traces_url = url;
  o.otlp_headers = "x-team=blue, x-other = 2";
  o.otlp_service_name = "agents-gateway";
  P = start_with(&o);
  canned_call(NULL, "done");
  char *pass = conversation(0, "read", "{\"path\":\"a\"}", "x");
  char *stop = conversation(3, "read", "{\"path\":\"a\"}", "same");
  resp *r = call(P, "POST", "/v1/chat/completions", pass,
                 "traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-"
                 "00f067aa0ba902b7-01");
  cr_expect_eq(r->status, 200);
  free(r);
  r = call(P, "POST", "/v1/chat/completions", stop,
           "traceparent: 00-00000000000000000000000000000000-"
           "00f067aa0ba902b7-01"); /* invalid: a new trace */
  cr_expect_str_eq(r->stop, "identical_calls");
  free(r);
  canned_add(200, "{}"); /* the collector's answer */
  ag_proxy_stop(P);
  P = NULL;
  free(pass);
  free(stop);

  pthread_mutex_lock(&U.mu);
  int at = -1;
  for (int i = 0; i < U.n_reqs; i++)
    if (strcmp(U.reqs[i].url, "/v1/traces") == 0)
      at = i;
  cr_assert_geq(at, 0, "no export reached the collector");
  cr_expect_str_eq(U.reqs[at].team, "blue");
  char *up_tp = dupz(U.reqs[0].tp); /* the model request's traceparent */
  json_error_t je;
  json_t *req = json_loads(U.reqs[at].body, 0, &je);
  pthread_mutex_unlock(&U.mu);
  cr_assert_not_null(req, "the export is not JSON: %s", je.text);
  json_t *rs = json_array_get(json_object_get(req, "resourceSpans"), 0);
  json_t *res_attr = json_array_get(
      json_object_get(json_object_get(rs, "resource"), "attributes"), 0);
  cr_expect_str_eq(json_string_value(json_object_get(res_attr, "key")),
                   "service.name");
  cr_expect_str_eq(json_string_value(json_object_get(
                       json_object_get(res_attr, "value"), "stringValue")),
                   "agents-gateway");
  json_t *ss = json_array_get(json_object_get(rs, "scopeSpans"), 0);
  cr_expect_str_eq(
      json_string_value(json_object_get(json_object_get(ss, "scope"), "name")),
      "agentguard");
  json_t *spans = json_object_get(ss, "spans");
  cr_assert_eq(json_array_size(spans), 2, "%s", U.reqs[at].body);
  json_t *a = json_array_get(spans, 0), *b = json_array_get(spans, 1);
  /* A span is queued when its request completes (libmicrohttpd's callback,
   * after the answer is written), on the loop that served it: the second
   * request, on another loop, may be queued first. Spans are found by
   * their decision, not by their place in the batch. */
  if (span_attr(a, "agentguard.decision") != NULL &&
      strcmp(span_attr(a, "agentguard.decision"), "passed") != 0) {
    json_t *x = a;
    a = b;
    b = x;
  }
  /* the first joins the client's trace, under the client's span */
  cr_expect_str_eq(json_string_value(json_object_get(a, "traceId")),
                   "4bf92f3577b34da6a3ce929d0e0e4736");
  cr_expect_str_eq(json_string_value(json_object_get(a, "parentSpanId")),
                   "00f067aa0ba902b7");
  cr_expect(lower_hex(json_string_value(json_object_get(a, "spanId")), 16));
  cr_expect_str_eq(json_string_value(json_object_get(a, "name")), "chat m");
  /* and the upstream's request is the proxy span's child */
  char want_tp[80];
  snprintf(want_tp, sizeof want_tp, "00-4bf92f3577b34da6a3ce929d0e0e4736-%s-01",
           json_string_value(json_object_get(a, "spanId")));
  cr_expect_str_eq(up_tp, want_tp);
  free(up_tp);
  cr_expect_eq(json_integer_value(json_object_get(a, "kind")), 3);
  const char *t0 = json_string_value(json_object_get(a, "startTimeUnixNano"));
  const char *t1 = json_string_value(json_object_get(a, "endTimeUnixNano"));
  cr_assert(t0 != NULL && t1 != NULL && strlen(t0) == 19 && strlen(t1) == 19);
  cr_expect(strcmp(t0, t1) <= 0);
  cr_expect_str_eq(span_attr(a, "gen_ai.operation.name"), "chat");
  cr_expect_str_eq(span_attr(a, "gen_ai.provider.name"), "openai");
  cr_expect_str_eq(span_attr(a, "gen_ai.request.model"), "m");
  cr_expect_str_eq(span_attr(a, "gen_ai.usage.input_tokens"), "10");
  cr_expect_str_eq(span_attr(a, "gen_ai.usage.output_tokens"), "5");
  cr_expect_str_eq(span_attr(a, "http.response.status_code"), "200");
  cr_expect_str_eq(span_attr(a, "agentguard.decision"), "passed");
  cr_expect(lower_hex(span_attr(a, "gen_ai.conversation.id"), 16));
  /* the second: a new trace (the zero trace id is invalid), the stop */
  const char *tid = json_string_value(json_object_get(b, "traceId"));
  cr_expect(lower_hex(tid, 32) &&
                strcmp(tid, "4bf92f3577b34da6a3ce929d0e0e4736") != 0,
            "%s", tid);
  cr_expect_null(json_object_get(b, "parentSpanId"));
  cr_expect_str_eq(span_attr(b, "agentguard.decision"),
                   "stopped_before_request");
  cr_expect_str_eq(span_attr(b, "agentguard.reason"), "identical_calls");
  cr_expect_null(span_attr(b, "gen_ai.usage.input_tokens"));
  json_decref(req);
}

/* A collector that cannot be reached costs the requests nothing: they are
 * answered as before, and the lost spans are counted in /metrics. */
Test(proxy, an_unreachable_collector_drops_spans_and_counts_them) {
  ag_proxy_stop(P);
  int s = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET,
                           .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t sl = sizeof sa;
  cr_assert(bind(s, (struct sockaddr *)&sa, sizeof sa) == 0 &&
            getsockname(s, (struct sockaddr *)&sa, &sl) == 0);
  close(s); /* nothing listens there now: connections are refused */
  char url[96];
  snprintf(url, sizeof url, "http://127.0.0.1:%u/v1/traces",
           (unsigned)ntohs(sa.sin_port));
  ag_proxy_opts o = test_opts();
  o.otlp_traces_url = url;
  P = start_with(&o);
  canned_call(NULL, "done");
  char *pass = conversation(0, "read", "{\"path\":\"a\"}", "x");
  resp *r = call(P, "POST", "/v1/chat/completions", pass, NULL);
  cr_expect_eq(r->status, 200);
  free(r);
  free(pass);
  bool counted = false;
  for (int i = 0; i < 100 && !counted; i++) { /* the batch goes after 1 s */
    r = call(P, "GET", "/metrics", NULL, NULL);
    counted =
        strstr(r->body, "agentguard_proxy_spans_dropped_total 1\n") != NULL;
    if (!counted)
      nap_ms(50);
    else
      cr_expect(strstr(r->body, "agentguard_proxy_spans_exported_total 0\n") !=
                NULL);
    free(r);
  }
  cr_expect(counted, "the dropped span was not counted");
}

/* ------------------------------------------------------------------------ */
/* Operating it: /healthz, /readyz, /metrics                                */
/* ------------------------------------------------------------------------ */

Test(proxy, health_and_metrics_are_the_proxys_own_without_a_key) {
  ag_proxy_stop(P);
  P = proxy_with(test_cfg(), 0, "k3y");
  resp *r = call(P, "GET", "/healthz", NULL, NULL);
  cr_expect_eq(r->status, 200, "no client key needed: %s", r->body);
  cr_expect_str_eq(r->body, "ok\n");
  free(r);
  r = call(P, "GET", "/readyz", NULL, NULL);
  cr_expect_eq(r->status, 200);
  free(r);
  r = call(P, "GET", "/metrics", NULL, NULL);
  cr_expect_eq(r->status, 200);
  cr_expect(strstr(r->body, "# TYPE agentguard_proxy_requests_total counter") !=
                NULL,
            "%s", r->body);
  free(r);
  cr_expect_eq(n_upstream(), 0, "never forwarded");
  /* another path still needs the key; a POST to /metrics is no metrics */
  r = call(P, "GET", "/healthz/x", NULL, NULL);
  cr_expect_eq(r->status, 401);
  free(r);
  r = call(P, "POST", "/metrics", "{}", NULL);
  cr_expect_eq(r->status, 401);
  free(r);
}

Test(proxy, readyz_says_when_the_upstream_was_not_reached) {
  ag_proxy_stop(P);
  ag_proxy_opts o = test_opts();
  o.upstream = "http://127.0.0.1:9"; /* nothing listens on port 9 */
  P = start_with(&o);
  char *body = conversation(1, "read_file", "{\"path\":\"a\"}", "x");
  resp *r = call(P, "POST", "/v1/chat/completions", body, NULL);
  cr_expect_eq(r->status, 502);
  free(r);
  r = call(P, "GET", "/readyz", NULL, NULL);
  cr_expect_eq(r->status, 503, "%s", r->body);
  free(r);
  r = metrics_with(P, "agentguard_proxy_responses_total{code=\"5xx\"} 1\n");
  cr_expect(strstr(r->body, "agentguard_proxy_upstream_failures_total 1\n") !=
                NULL,
            "%s", r->body);
  cr_expect(
      strstr(r->body, "agentguard_proxy_responses_total{code=\"5xx\"} 1\n") !=
          NULL,
      "%s", r->body);
  free(r);
  free(body);
}

/* With no transfer in the last 30 s to go by, /readyz probes the
 * upstream itself: one connection (no request), its result kept for 10 s;
 * an upstream nobody listens at is named in the 503. */
Test(proxy, readyz_probes_the_upstream_when_no_transfer_says) {
  for (int i = 0; i < 3; i++) {
    resp *r = call(P, "GET", "/readyz", NULL, NULL);
    cr_expect_eq(r->status, 200, "%s", r->body);
    cr_expect_str_eq(r->body, "ok\n");
    free(r);
  }
  /* the probe connects and closes: the upstream's server may count the
   * connection after /readyz has answered - wait for it (then a little
   * more, for any second one) */
  int conns = 0, reqs = 0;
  for (int waited = 0; waited <= 2000; waited += 20) {
    pthread_mutex_lock(&U.mu);
    conns = U.n_conns;
    pthread_mutex_unlock(&U.mu);
    if (conns >= 1)
      break;
    nap_ms(20);
  }
  nap_ms(100);
  pthread_mutex_lock(&U.mu);
  conns = U.n_conns;
  reqs = U.n_reqs;
  pthread_mutex_unlock(&U.mu);
  cr_expect_eq(conns, 1, "%d probe connections for 3 /readyz", conns);
  cr_expect_eq(reqs, 0, "the probe sends no request");
  ag_proxy_stop(P);
  ag_proxy_opts o = test_opts();
  o.upstream = "http://127.0.0.1:9"; /* nothing listens on port 9 */
  P = start_with(&o);
  resp *r = call(P, "GET", "/readyz", NULL, NULL);
  cr_expect_eq(r->status, 503, "%s", r->body);
  cr_expect(strstr(r->body, "the upstream http://127.0.0.1:9 was not "
                            "reached: ") != NULL,
            "%s", r->body);
  free(r);
}

/* --listen takes a host name and an IPv6 address (skipped where the
 * machine has no IPv6 loopback). */
Test(proxy, listens_on_a_host_name_and_on_ipv6) {
  ag_proxy_stop(P);
  ag_proxy_opts o = test_opts();
  o.listen_host = "localhost";
  P = start_with(&o);
  resp *r = call(P, "GET", "/healthz", NULL, NULL);
  cr_expect_eq(r->status, 200, "localhost is 127.0.0.1: %s", r->body);
  free(r);
  ag_proxy_stop(P);
  P = NULL;
  o.listen_host = "::1";
  ag_error_t err;
  if (ag_proxy_start(&P, &o, &err) != AG_OK) {
    cr_expect(strstr(err.msg, "cannot listen") != NULL, "%s", err.msg);
    P = proxy_with(test_cfg(), 0, NULL);
    cr_skip_test("no IPv6 loopback here: %s", err.msg);
  }
  CURL *h = curl_easy_init();
  char url[64];
  snprintf(url, sizeof url, "http://[::1]:%u/healthz",
           (unsigned)ag_proxy_port(P));
  resp *got = calloc(1, sizeof *got);
  curl_easy_setopt(h, CURLOPT_URL, url);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, rbody);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, got);
  cr_expect_eq(curl_easy_perform(h), CURLE_OK);
  cr_expect_str_eq(got->body, "ok\n");
  free(got);
  long code = 0;
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
  cr_expect_eq(code, 200);
  curl_easy_cleanup(h);
  /* a name that resolves to nothing is refused with a clear error */
  ag_proxy *bad = NULL;
  o.listen_host = "nosuchhost.invalid";
  cr_expect_eq(ag_proxy_start(&bad, &o, &err), AG_EINVAL);
  cr_expect(strstr(err.msg, "nosuchhost.invalid") != NULL, "%s", err.msg);
}

/* ---- drain --------------------------------------------------------------- */

typedef struct drain_client {
  char url[128];
  char *body;
  timed_body *t;
  CURLcode cc;
  long status;
} drain_client;

static void *drain_client_main(void *arg) {
  drain_client *dc = arg;
  CURL *h = curl_easy_init();
  curl_easy_setopt(h, CURLOPT_URL, dc->url);
  curl_easy_setopt(h, CURLOPT_POSTFIELDS, dc->body);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, timed_write);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, dc->t);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 20000L);
  dc->cc = curl_easy_perform(h);
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &dc->status);
  curl_easy_cleanup(h);
  return NULL;
}

/* A drain lets a stream under way finish whole, while a new request and
 * the health checks get a 503. */
Test(proxy, drain_finishes_the_streams_under_way) {
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
  drain_client dc = {0};
  snprintf(dc.url, sizeof dc.url, "http://127.0.0.1:%u/v1/chat/completions",
           (unsigned)ag_proxy_port(P));
  dc.body = streaming(conversation(0, "read", "{}", ""));
  dc.t = calloc(1, sizeof *dc.t);
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, drain_client_main, &dc), 0);
  /* the stream has begun (its first chunk is in) before the drain */
  for (int i = 0; i < 200 && SLOW.sent == 0; i++) {
    struct timespec ts = {0, 10 * 1000000L};
    nanosleep(&ts, NULL);
  }
  cr_assert(ag_proxy_drain(P, 10000), "the stream did not end in 10 s");
  pthread_join(th, NULL);
  cr_expect_eq(dc.cc, CURLE_OK, "%s", curl_easy_strerror(dc.cc));
  cr_expect_eq(dc.status, 200);
  cr_expect(strstr(dc.t->text, "<w4>") != NULL &&
                strstr(dc.t->text, "data: [DONE]") != NULL,
            "the stream was cut: %s", dc.t->text);
  resp *r = call(P, "GET", "/v1/models", NULL, NULL);
  cr_expect_eq(r->status, 503, "a new request while draining: %s", r->body);
  cr_expect(strstr(r->body, "shutting_down") != NULL, "%s", r->body);
  free(r);
  r = call(P, "GET", "/healthz", NULL, NULL);
  cr_expect_eq(r->status, 503);
  free(r);
  ag_proxy_stop(P);
  P = NULL;
  MHD_stop_daemon(d);
  free(dc.t);
  free(dc.body);
  P = proxy_with(test_cfg(), 0, NULL); /* for teardown */
}

/* ---- several upstreams ----------------------------------------------------
 */

static char second_url[256];

static enum MHD_Result second_handler(void *cls, struct MHD_Connection *c,
                                      const char *url, const char *method,
                                      const char *version, const char *upload,
                                      size_t *upload_size, void **con_cls) {
  (void)cls, (void)method, (void)version, (void)upload;
  if (*con_cls == NULL) {
    *con_cls = c;
    return MHD_YES;
  }
  if (*upload_size > 0) {
    *upload_size = 0;
    return MHD_YES;
  }
  snprintf(second_url, sizeof second_url, "%s", url);
  static const char body[] = "{\"from\":\"second\"}";
  struct MHD_Response *r = MHD_create_response_from_buffer(
      sizeof body - 1, (void *)body, MHD_RESPMEM_PERSISTENT);
  enum MHD_Result ret = MHD_queue_response(c, 200, r);
  MHD_destroy_response(r);
  return ret;
}

/* --anthropic-upstream: Anthropic's paths go there, every other path to
 * --upstream. */
Test(proxy, each_api_goes_to_its_own_upstream) {
  struct MHD_Daemon *d = MHD_start_daemon(
      MHD_USE_INTERNAL_POLLING_THREAD, 0, NULL, NULL, second_handler, NULL,
      MHD_OPTION_EXTERNAL_LOGGER, quiet, NULL, MHD_OPTION_END);
  cr_assert_not_null(d);
  char second[64];
  snprintf(second, sizeof second, "http://127.0.0.1:%u",
           (unsigned)MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT)->port);
  ag_proxy_stop(P);
  ag_proxy_opts o = test_opts();
  o.anthropic_upstream = second;
  P = start_with(&o);
  canned_add(200, "{\"data\":[]}");
  resp *r = call(P, "POST", "/v1/messages/count_tokens", "{}", NULL);
  cr_expect_str_eq(r->body, "{\"from\":\"second\"}");
  cr_expect_str_eq(second_url, "/v1/messages/count_tokens");
  cr_expect_eq(n_upstream(), 0, "not the default upstream");
  free(r);
  r = call(P, "GET", "/v1/models", NULL, NULL);
  cr_expect_str_eq(r->body, "{\"data\":[]}");
  cr_expect_eq(n_upstream(), 1, "every other path: --upstream");
  free(r);
  ag_proxy_stop(P);
  P = NULL;
  MHD_stop_daemon(d);
  /* a bad one is refused, named */
  o.anthropic_upstream = "ftp://x";
  ag_error_t err;
  cr_expect_eq(ag_proxy_start(&P, &o, &err), AG_EINVAL);
  cr_expect(strstr(err.msg, "--anthropic-upstream 'ftp://x'") != NULL, "%s",
            err.msg);
  P = proxy_with(test_cfg(), 0, NULL);
}

/* A proxy for the upstream named in the environment (curl's http_proxy,
 * https_proxy, ALL_PROXY...) is used, as curl uses it; the environment is
 * read when the proxy starts. Here U plays the environment's proxy: the
 * request for an upstream nobody listens at reaches it in absolute form.
 * The client's own handle is told to use no proxy, and the upstream is on
 * 127.0.0.2: the fixture's NO_PROXY names 127.0.0.1. */
Test(proxy, the_upstream_is_reached_through_the_environments_proxy) {
  char via[64], *body = conversation(1, "read_file", "{\"path\":\"a\"}", "x");
  snprintf(via, sizeof via, "http://127.0.0.1:%d", U.port);
  CURL *h = curl_easy_init();
  cr_assert_not_null(h);
  curl_easy_setopt(h, CURLOPT_PROXY, "");
  ag_proxy_stop(P);
  ag_proxy_opts o = test_opts();
  o.upstream = "http://127.0.0.2:9/v1"; /* nothing listens on port 9 */
  setenv("http_proxy", via, 1);
  P = start_with(&o);
  canned_add(200, "{\"id\":\"c\",\"object\":\"chat.completion\",\"choices\":[{"
                  "\"index\":0,\"message\":{\"role\":\"assistant\","
                  "\"content\":\"done\"},\"finish_reason\":\"stop\"}]}");
  resp *r = call_on(h, P, "POST", "/v1/chat/completions", body, NULL);
  cr_expect_eq(r->status, 200, "%s", r->body);
  cr_expect_eq(n_upstream(), 1);
  pthread_mutex_lock(&U.mu);
  cr_expect_str_eq(U.reqs[0].url, "http://127.0.0.2:9/v1/chat/completions");
  pthread_mutex_unlock(&U.mu);
  free(r);
  unsetenv("http_proxy");
  /* a proxy started with none in its environment looks for none later */
  ag_proxy_stop(P);
  P = start_with(&o);
  setenv("http_proxy", via, 1);
  r = call_on(h, P, "POST", "/v1/chat/completions", body, NULL);
  unsetenv("http_proxy");
  cr_expect_eq(r->status, 502, "%s", r->body);
  cr_expect_eq(n_upstream(), 1, "not through the proxy");
  free(r);
  curl_easy_cleanup(h);
  free(body);
}
