/*
 * proxy_stored.c - a Responses request that continues a conversation the
 * upstream keeps (previous_response_id, conversation): the conversation
 * read back from the upstream and the turn decided from it (stored.c), or
 * the request relayed unguarded when it cannot be read (test_proxy's
 * cases; the fake upstream, the proxy under test and the client are
 * proxy_fixture.h's).
 */
#include "proxy_fixture.h"

/* The items of an agent's loop: the user's request, then call i (the same
 * failing read each time) and its output, for i in [from, to). */
static json_t *loop_items(int from, int to, bool user) {
  json_t *a = json_array();
  if (user)
    json_array_append_new(a, json_pack("{s:s, s:s, s:s, s:[{s:s, s:s}]}", "id",
                                       "msg_u", "type", "message", "role",
                                       "user", "content", "type", "input_text",
                                       "text", "Read notes.txt."));
  for (int i = from; i < to; i++) {
    char fc[32], fco[32], call[32];
    snprintf(fc, sizeof fc, "fc_%d", i);
    snprintf(fco, sizeof fco, "fco_%d", i);
    snprintf(call, sizeof call, "call_%d", i);
    json_array_append_new(a, json_pack("{s:s, s:s, s:s, s:s, s:s}", "id", fc,
                                       "type", "function_call", "call_id", call,
                                       "name", "read_file", "arguments",
                                       "{\"path\":\"notes.txt\"}"));
    json_array_append_new(a, json_pack("{s:s, s:s, s:s, s:s}", "id", fco,
                                       "type", "function_call_output",
                                       "call_id", call, "output",
                                       "Error: no such file: notes.txt"));
  }
  return a;
}

/* A list page: `items` (stolen) newest first, as the upstream lists them. */
static char *page(json_t *items, bool more) {
  json_t *rev = json_array();
  for (size_t i = json_array_size(items); i > 0; i--)
    json_array_append(rev, json_array_get(items, i - 1));
  json_decref(items);
  size_t n = json_array_size(rev);
  const char *last =
      n > 0
          ? json_string_value(json_object_get(json_array_get(rev, n - 1), "id"))
          : NULL;
  json_t *o = json_pack("{s:s, s:o, s:s?, s:b}", "object", "list", "data", rev,
                        "last_id", last, "has_more", more);
  char *t = json_dumps(o, JSON_COMPACT);
  json_decref(o);
  return t;
}

/* A stored response: its output is call i; `prev` the one before it. */
static char *stored_response(const char *id, int i, const char *prev) {
  json_t *out = loop_items(i, i + 1, false);
  json_array_remove(out, 1); /* its output holds the call only */
  json_t *o = json_pack("{s:s, s:s, s:s, s:s?, s:o}", "id", id, "object",
                        "response", "status", "completed",
                        "previous_response_id", prev, "output", out);
  char *t = json_dumps(o, JSON_COMPACT);
  json_decref(o);
  return t;
}

static const char *const failed = "Error: no such file: notes.txt";

/* The request continuing it: the output of call `i`, and tools. */
static char *continuing(const char *key, const char *id, int i,
                        const char *output) {
  char call[32];
  snprintf(call, sizeof call, "call_%d", i);
  json_t *o = json_pack(
      "{s:s, s:s, s:[{s:s, s:s, s:s}], s:[{s:s, s:s}]}", "model", "m", key, id,
      "input", "type", "function_call_output", "call_id", call, "output",
      output, "tools", "type", "function", "name", "read_file");
  char *t = json_dumps(o, JSON_COMPACT);
  json_decref(o);
  return t;
}

static void add_owned(int status, char *body) {
  canned_add(status, body);
  free(body);
}

static const char *const ok_reply =
    "{\"id\":\"resp_up\",\"object\":\"response\",\"status\":\"completed\","
    "\"output\":[{\"type\":\"message\",\"role\":\"assistant\",\"content\":[{"
    "\"type\":\"output_text\",\"text\":\"Done.\"}]}]}";

/* The loop's fifth failing read: the request holds only its output; what
 * came before is the upstream's, read back (the items that went into
 * resp_4, then resp_4's call) with the client's own key - and stopped. */
Test(proxy, previous_response_id_is_read_back_and_its_loop_stopped) {
  add_owned(200, page(loop_items(0, 4, true), false));
  add_owned(200, stored_response("resp_4", 4, "resp_3"));
  char *body = continuing("previous_response_id", "resp_4", 4, failed);
  resp *r = call(P, "POST", "/v1/responses", body, NULL);
  cr_expect_eq(r->status, 200, "%s", r->body);
  cr_expect_str_eq(r->stop, "identical_calls", "%s", r->body);
  cr_assert_eq(n_upstream(), 2, "two reads, no model request");
  pthread_mutex_lock(&U.mu);
  cr_expect_str_eq(U.reqs[0].url, "/v1/responses/resp_4/input_items");
  cr_expect_str_eq(U.reqs[0].order, "desc");
  cr_expect_null(U.reqs[0].after);
  cr_expect_str_eq(U.reqs[1].url, "/v1/responses/resp_4");
  cr_expect_str_eq(U.reqs[0].auth, "Bearer sk-client-secret");
  cr_expect_str_eq(U.reqs[1].auth, "Bearer sk-client-secret");
  pthread_mutex_unlock(&U.mu);
  free(body);
  free(r);
}

/* A healthy continuation goes upstream as the client sent it. */
Test(proxy, previous_response_id_continuation_goes_up_unchanged) {
  add_owned(200, page(loop_items(0, 1, true), false));
  add_owned(200, stored_response("resp_1", 1, "resp_0"));
  canned_add(200, ok_reply);
  char *body = continuing("previous_response_id", "resp_1", 1,
                          "notes.txt: remember the milk");
  resp *r = call(P, "POST", "/v1/responses", body, NULL);
  cr_expect_eq(r->status, 200, "%s", r->body);
  cr_expect_str_empty(r->stop);
  cr_expect_str_eq(r->body, ok_reply);
  cr_assert_eq(n_upstream(), 3);
  pthread_mutex_lock(&U.mu);
  cr_expect_str_eq(U.reqs[2].url, "/v1/responses");
  cr_expect_str_eq(U.reqs[2].body, body, "the client's body, unchanged");
  pthread_mutex_unlock(&U.mu);
  free(body);
  free(r);
}

/* Pages are read newest first, with `after`, until the turn's start. */
Test(proxy, stored_items_are_paged_until_the_turn_starts) {
  json_t *all = loop_items(0, 4, true); /* 9 items: two pages */
  json_t *older = json_array(), *newer = json_array();
  for (size_t i = 0; i < json_array_size(all); i++)
    json_array_append(i < 3 ? older : newer, json_array_get(all, i));
  json_decref(all);
  add_owned(200, page(newer, true));
  add_owned(200, page(older, false));
  add_owned(200, stored_response("resp_4", 4, "resp_3"));
  char *body = continuing("previous_response_id", "resp_4", 4, failed);
  resp *r = call(P, "POST", "/v1/responses", body, NULL);
  cr_expect_str_eq(r->stop, "identical_calls", "%s", r->body);
  cr_assert_eq(n_upstream(), 3);
  pthread_mutex_lock(&U.mu);
  cr_expect_null(U.reqs[0].after);
  cr_expect_str_eq(U.reqs[1].url, "/v1/responses/resp_4/input_items");
  cr_expect_str_eq(U.reqs[1].after, "fc_1", "the last item of page one");
  pthread_mutex_unlock(&U.mu);
  free(body);
  free(r);
}

/* A server that lists only a response's own inputs: the chain is walked
 * back through previous_response_id to the turn's start. */
Test(proxy, a_chain_of_own_inputs_is_walked_back) {
  /* resp_2: inputs [fco_1], output [fc_2]; resp_1: [fco_0] and [fc_1];
   * resp_0: [user] and [fc_0] */
  json_t *in2 = loop_items(1, 2, false), *in1 = loop_items(0, 1, false);
  json_array_remove(in2, 0);
  json_array_remove(in1, 0);
  add_owned(200, page(in2, false));
  add_owned(200, stored_response("resp_2", 2, "resp_1"));
  add_owned(200, page(in1, false));
  add_owned(200, stored_response("resp_1", 1, "resp_0"));
  add_owned(200, page(loop_items(0, 0, true), false));
  add_owned(200, stored_response("resp_0", 0, NULL));
  char *body = continuing("previous_response_id", "resp_2", 2, failed);
  resp *r = call(P, "POST", "/v1/responses", body, NULL);
  cr_expect_str_eq(r->stop, "identical_calls", "%s", r->body);
  cr_assert_eq(n_upstream(), 6);
  pthread_mutex_lock(&U.mu);
  cr_expect_str_eq(U.reqs[2].url, "/v1/responses/resp_1/input_items");
  cr_expect_str_eq(U.reqs[5].url, "/v1/responses/resp_0");
  pthread_mutex_unlock(&U.mu);
  free(body);
  free(r);
}

/* A conversation's items are read from the Conversations API. */
Test(proxy, conversation_items_are_read_back) {
  json_t *items = loop_items(0, 4, true);
  json_array_remove(items, json_array_size(items) - 1); /* the request's */
  add_owned(200, page(items, false));
  char *body = continuing("conversation", "conv_7", 3, failed);
  resp *r = call(P, "POST", "/v1/responses", body, NULL);
  cr_expect_str_eq(r->stop, "identical_calls", "%s", r->body);
  cr_assert_eq(n_upstream(), 1);
  pthread_mutex_lock(&U.mu);
  cr_expect_str_eq(U.reqs[0].url, "/v1/conversations/conv_7/items");
  pthread_mutex_unlock(&U.mu);
  free(body);
  free(r);
}

/* What cannot be read back (a 404: stored with store:false; an id that
 * is not one) leaves the request unguarded, as before, and says why. */
Test(proxy, a_conversation_not_read_back_is_relayed_unguarded) {
  ag_proxy_stop(P);
  FILE *ev = tmpfile();
  cr_assert_not_null(ev);
  ag_proxy_opts o = test_opts();
  o.events = ev;
  P = start_with(&o);
  canned_add(404, "{\"error\":{\"message\":\"not found\"}}");
  canned_add(200, ok_reply);
  char *body = continuing("previous_response_id", "resp_9", 4, failed);
  resp *r = call(P, "POST", "/v1/responses", body, NULL);
  cr_expect_str_eq(r->body, ok_reply);
  cr_expect_str_empty(r->stop);
  cr_expect_eq(n_upstream(), 2, "the read, then the request itself");
  free(body);
  free(r);
  canned_reset();
  canned_add(200, ok_reply);
  body = continuing("previous_response_id", "../../v1/files", 4, failed);
  r = call(P, "POST", "/v1/responses", body, NULL);
  cr_expect_str_eq(r->body, ok_reply);
  cr_expect_eq(n_upstream(), 1, "an id that is not one is not read");
  free(body);
  free(r);
  ag_proxy_stop(P);
  P = NULL;
  rewind(ev);
  char line[4096];
  int unguarded = 0;
  while (fgets(line, sizeof line, ev) != NULL) {
    if (strstr(line, "\"decision\":\"unguarded\"") == NULL)
      continue;
    unguarded++;
    if (unguarded == 1)
      cr_expect(strstr(line, "resp_9/input_items: HTTP 404") != NULL, "%s",
                line);
  }
  cr_expect_eq(unguarded, 2);
  fclose(ev);
}

/* An upstream whose list never ends is read FETCH_PAGES_MAX (10) pages
 * deep, then the response itself; the turn is decided from what was read
 * and the request goes up: 12 upstream requests, not more. */
Test(proxy, stored_reading_is_bounded) {
  for (int i = 0; i < 10; i++)
    add_owned(200, page(loop_items(1, 2, false), true));
  add_owned(200, stored_response("resp_2", 2, "resp_1"));
  canned_add(200, ok_reply);
  char *body = continuing("previous_response_id", "resp_2", 2,
                          "notes.txt: remember the milk");
  resp *r = call(P, "POST", "/v1/responses", body, NULL);
  cr_expect_eq(r->status, 200, "%s", r->body);
  cr_expect_str_eq(r->body, ok_reply);
  cr_assert_eq(n_upstream(), 12);
  pthread_mutex_lock(&U.mu);
  cr_expect_str_eq(U.reqs[9].url, "/v1/responses/resp_2/input_items");
  cr_expect_str_eq(U.reqs[9].after, "fc_1");
  cr_expect_str_eq(U.reqs[10].url, "/v1/responses/resp_2");
  cr_expect_str_eq(U.reqs[11].url, "/v1/responses");
  pthread_mutex_unlock(&U.mu);
  free(body);
  free(r);
}

/* A later page over the byte bound (--max-body) ends the reading there:
 * the turn is decided from the pages before it (stopped here), not left
 * unguarded. */
Test(proxy, a_page_past_the_byte_bound_ends_the_reading) {
  ag_proxy_stop(P);
  P = proxy_with(test_cfg(), 4000, NULL);
  add_owned(200, page(loop_items(1, 4, false), true));
  char big[5000];
  memset(big, 'x', sizeof big - 1);
  big[sizeof big - 1] = '\0';
  add_owned(200,
            page(json_pack("[{s:s, s:s, s:s, s:s}]", "id", "msg_big", "type",
                           "message", "role", "user", "content", big),
                 false));
  add_owned(200, stored_response("resp_4", 4, "resp_3"));
  char *body = continuing("previous_response_id", "resp_4", 4, failed);
  resp *r = call(P, "POST", "/v1/responses", body, NULL);
  cr_expect_str_eq(r->stop, "identical_calls", "%s", r->body);
  cr_expect_eq(n_upstream(), 3, "two pages and the response");
  free(body);
  free(r);
}

/* Ten pages of a loop whose steps straddle the pages: the oldest item
 * read is an output whose call was not read; it is left out, and the
 * loop is stopped (a reasoning model's three items a step do this). */
Test(proxy, an_output_whose_call_was_not_read_is_left_out) {
  for (int c = 20; c > 10; c--) {
    json_t *items = loop_items(c - 1, c, false);
    json_array_remove(items, 0); /* fco_{c-1} */
    json_t *step = loop_items(c, c + 1, false);
    json_array_extend(items, step);
    json_decref(step);
    add_owned(200, page(items, true));
  }
  add_owned(200, stored_response("resp_21", 21, "resp_20"));
  char *body = continuing("previous_response_id", "resp_21", 21, failed);
  resp *r = call(P, "POST", "/v1/responses", body, NULL);
  cr_expect_str_eq(r->stop, "identical_calls", "%s", r->body);
  cr_expect_eq(n_upstream(), 11);
  free(body);
  free(r);
}

/* A chain that comes back to a response read already ends there. */
Test(proxy, a_chain_that_loops_is_read_once) {
  add_owned(200, page(loop_items(0, 2, false), false));
  add_owned(200, stored_response("resp_2", 2, "resp_2"));
  char *body = continuing("previous_response_id", "resp_2", 2, failed);
  resp *r = call(P, "POST", "/v1/responses", body, NULL);
  cr_expect_str_eq(r->stop, "identical_calls", "%s", r->body);
  cr_expect_eq(n_upstream(), 2);
  free(body);
  free(r);
}
