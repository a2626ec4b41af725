/*
 * tests/runtime/test_providers.c - the provider handle (ag_provider_new and
 * friends over a vtable written here), replies (ag_reply_add_call/clear) and
 * the scripted provider: every shape error with its exact message, replies
 * in order per turn, arguments, ids, provider errors, delays and their
 * cancellation, exhaustion.
 *
 * Scenario texts are written with single quotes for readability; `load`
 * turns them into double quotes before parsing. Real waits are a few tens of
 * ms; timing assertions only ever say "well under a second" or "at least
 * the delay".
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "agentguard.h"

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0)
    ;
}

/* ------------------------------------------------------------------------ */
/* Helpers                                                                  */
/* ------------------------------------------------------------------------ */

static json_t *parse(const char *text) {
  char *s = strdup(text);
  cr_assert_not_null(s);
  for (char *c = s; *c != '\0'; c++)
    if (*c == '\'')
      *c = '"';
  json_error_t je;
  json_t *j = json_loads(s, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
  cr_assert_not_null(j, "test scenario does not parse: %s\n%s", je.text, s);
  free(s);
  return j;
}

/* A scripted provider over `text`; the json is released before returning,
 * so every test also checks that the provider kept no reference to it. */
static ag_provider *load(const char *text) {
  json_t *j = parse(text);
  ag_provider *p = NULL;
  ag_error_t err;
  ag_err_t rc = ag_provider_scripted_new(&p, j, &err);
  json_decref(j);
  cr_assert_eq(rc, AG_OK, "ag_provider_scripted_new: %s (%s)", err.msg,
               ag_err_name(rc));
  cr_assert_not_null(p);
  return p;
}

static void expect_shape_error(const char *text, const char *want) {
  json_t *j = parse(text);
  ag_provider *p = (ag_provider *)&p; /* must be reset to NULL */
  ag_error_t err;
  ag_err_t rc = ag_provider_scripted_new(&p, j, &err);
  json_decref(j);
  cr_expect_eq(rc, AG_ECONFIG, "for %s: got %s, want CONFIG", text,
               ag_err_name(rc));
  cr_expect_eq(err.code, AG_ECONFIG);
  cr_expect_null(p, "for %s: out not reset", text);
  cr_expect_str_eq(err.msg, want, "for %s:\n got: %s\nwant: %s", text, err.msg,
                   want);
  if (rc == AG_OK)
    ag_provider_free(p);
}

static ag_err_t ask_c(ag_provider *p, int turn, ag_cancel *cancel,
                      ag_reply *out, ag_provider_error *perr) {
  ag_request req = {NULL, NULL, turn, 1, NULL, 0};
  return ag_provider_complete(p, &req, cancel, NULL, NULL, out, perr);
}

static ag_err_t ask(ag_provider *p, int turn, ag_reply *out,
                    ag_provider_error *perr) {
  return ask_c(p, turn, NULL, out, perr);
}

/* Asks for turn `turn` and expects a text-only reply `text`. */
static void expect_text(ag_provider *p, int turn, const char *text) {
  ag_reply r;
  ag_provider_error pe;
  ag_err_t rc = ask(p, turn, &r, &pe);
  cr_assert_eq(rc, AG_OK, "turn %d: got %s (%s), want OK", turn,
               ag_err_name(rc), pe.message);
  cr_assert_not_null(r.text, "turn %d: no text, want \"%s\"", turn, text);
  cr_expect_str_eq(r.text, text, "turn %d: got \"%s\", want \"%s\"", turn,
                   r.text, text);
  cr_expect_eq(r.n_calls, 0);
  ag_reply_clear(&r);
}

/* Asks and expects AG_EPROVIDER; returns perr. */
static ag_provider_error expect_perr(ag_provider *p, int turn) {
  ag_reply r;
  ag_provider_error pe;
  ag_err_t rc = ask(p, turn, &r, &pe);
  cr_assert_eq(rc, AG_EPROVIDER, "turn %d: got %s, want PROVIDER", turn,
               ag_err_name(rc));
  cr_expect_null(r.text);
  cr_expect_eq(r.n_calls, 0);
  cr_expect_str_eq(pe.service, "scripted");
  return pe;
}

/* ------------------------------------------------------------------------ */
/* Shape errors                                                             */
/* ------------------------------------------------------------------------ */

#define T0 "[{'user':'u','model':[%s]}]"

static void expect_reply_error(const char *reply, const char *want) {
  char text[1024];
  snprintf(text, sizeof(text), T0, reply);
  expect_shape_error(text, want);
}

Test(scripted_shape, turns_and_turn_objects) {
  expect_shape_error("{}", "turns: expected an array");
  expect_shape_error("'turns'", "turns: expected an array");
  expect_shape_error("[1]", "turns[0]: expected an object");
  expect_shape_error("[{'user':'a','model':[]}, []]",
                     "turns[1]: expected an object");
  expect_shape_error("[{'model':[]}]", "turns[0].user: missing; expected a "
                                       "string");
  expect_shape_error("[{'user':1,'model':[]}]",
                     "turns[0].user: expected a string");
  expect_shape_error("[{'user':'u'}]",
                     "turns[0].model: missing; expected an array");
  expect_shape_error("[{'user':'u','model':{}}]",
                     "turns[0].model: expected an array");
  expect_shape_error("[{'user':'u','model':[],'repeat_last':1}]",
                     "turns[0].repeat_last: expected true or false");
  expect_shape_error("[{'user':'u','model':[],'expect':[]}]",
                     "turns[0].expect: expected an object");
  expect_shape_error("[{'user':'u','model':[],'usr':'x'}]",
                     "turns[0].usr: unknown key; did you mean user?");
  expect_shape_error("[{'user':'u','model':[],'repeat':true}]",
                     "turns[0].repeat: unknown key; did you mean repeat_last?");
  expect_shape_error("[{'user':'u','model':[],'bogus':1}]",
                     "turns[0].bogus: unknown key (known: user, model, "
                     "repeat_last, expect)");
}

Test(scripted_shape, null_turns) {
  ag_provider *p = NULL;
  ag_error_t err;
  cr_expect_eq(ag_provider_scripted_new(&p, NULL, &err), AG_ECONFIG);
  cr_expect_str_eq(err.msg, "turns: expected an array");
  cr_expect_null(p);
  cr_expect_eq(ag_provider_scripted_new(NULL, NULL, NULL), AG_EINVAL);
}

Test(scripted_shape, replies) {
  expect_shape_error("[{'user':'u','model':['hi']}]",
                     "turns[0].model[0]: expected an object");
  expect_shape_error("[{'user':'u','model':[{'text':'a'},{'txt':'b'}]}]",
                     "turns[0].model[1].txt: unknown key; did you mean text?");
  expect_reply_error("{'delay':5,'text':'a'}",
                     "turns[0].model[0].delay: unknown key; did you mean "
                     "delay_ms?");
  expect_reply_error("{'toolcalls':[]}",
                     "turns[0].model[0].toolcalls: unknown key; did you "
                     "mean tool_calls?");
  expect_reply_error("{'x':1}",
                     "turns[0].model[0].x: unknown key (known: text, "
                     "tool_calls, provider_error, delay_ms, usage)");
  expect_reply_error("{}", "turns[0].model[0]: a reply needs \"text\", "
                           "\"tool_calls\" or \"provider_error\"");
  expect_reply_error("{'delay_ms':5}",
                     "turns[0].model[0]: a reply needs \"text\", "
                     "\"tool_calls\" or \"provider_error\"");
  expect_reply_error("{'text':5}", "turns[0].model[0].text: expected a string");
  expect_reply_error("{'text':null}",
                     "turns[0].model[0].text: expected a string");
  expect_reply_error("{'text':'a','delay_ms':-1}",
                     "turns[0].model[0].delay_ms: expected an integer >= 0");
  expect_reply_error("{'text':'a','delay_ms':1.5}",
                     "turns[0].model[0].delay_ms: expected an integer >= 0");
  expect_reply_error("{'text':'a','delay_ms':'10ms'}",
                     "turns[0].model[0].delay_ms: expected an integer >= 0");
}

Test(scripted_shape, tool_calls) {
  expect_reply_error("{'tool_calls':{}}",
                     "turns[0].model[0].tool_calls: expected a non-empty "
                     "array");
  expect_reply_error("{'text':'a','tool_calls':[]}",
                     "turns[0].model[0].tool_calls: expected a non-empty "
                     "array");
  expect_reply_error("{'tool_calls':[1]}",
                     "turns[0].model[0].tool_calls[0]: expected an object");
  expect_reply_error("{'tool_calls':[{'arguments':{}}]}",
                     "turns[0].model[0].tool_calls[0].name: missing; expected "
                     "a string");
  expect_reply_error("{'tool_calls':[{'name':'a'},{'name':'b','id':7}]}",
                     "turns[0].model[0].tool_calls[1].id: expected a string");
  expect_reply_error("{'tool_calls':[{'name':'a','arguments':5}]}",
                     "turns[0].model[0].tool_calls[0].arguments: expected an "
                     "object, an array or a string");
  expect_reply_error("{'tool_calls':[{'name':'a','arguments':null}]}",
                     "turns[0].model[0].tool_calls[0].arguments: expected an "
                     "object, an array or a string");
  expect_reply_error("{'tool_calls':[{'name':'a','argument':{}}]}",
                     "turns[0].model[0].tool_calls[0].argument: unknown key; "
                     "did you mean arguments?");
  /* The brief's example, deep in the second turn. */
  expect_shape_error("[{'user':'a','model':[{'text':'x'}]},"
                     " {'user':'b','model':[{'text':'x'},{'text':'y'},"
                     "  {'tool_calls':[{'name':5}]}]}]",
                     "turns[1].model[2].tool_calls[0].name: expected a string");
}

Test(scripted_shape, provider_errors) {
  const char *status_msg = "turns[0].model[0].provider_error.status: expected "
                           "an integer 100..599 (or 0 for a connection "
                           "failure)";
  expect_reply_error("{'provider_error':'429'}",
                     "turns[0].model[0].provider_error: expected an object");
  expect_reply_error("{'provider_error':{}}",
                     "turns[0].model[0].provider_error.status: missing; "
                     "expected an integer 100..599 (or 0 for a connection "
                     "failure)");
  expect_reply_error("{'provider_error':{'status':600}}", status_msg);
  expect_reply_error("{'provider_error':{'status':99}}", status_msg);
  expect_reply_error("{'provider_error':{'status':-1}}", status_msg);
  expect_reply_error("{'provider_error':{'status':'429'}}", status_msg);
  expect_reply_error("{'provider_error':{'status':429.0}}", status_msg);
  expect_reply_error(
      "{'provider_error':{'status':429,'retry_after_ms':-5}}",
      "turns[0].model[0].provider_error.retry_after_ms: expected an integer "
      ">= 0");
  expect_reply_error("{'provider_error':{'status':429,'message':3}}",
                     "turns[0].model[0].provider_error.message: expected a "
                     "string");
  expect_reply_error("{'provider_error':{'status':429,'retry_after':5}}",
                     "turns[0].model[0].provider_error.retry_after: unknown "
                     "key; did you mean retry_after_ms?");
  expect_reply_error("{'provider_error':{'status':429},'text':'a'}",
                     "turns[0].model[0]: \"provider_error\" cannot be "
                     "combined with \"text\" (a failed request has no "
                     "reply)");
  expect_reply_error("{'provider_error':{'status':429},"
                     "'tool_calls':[{'name':'a'}]}",
                     "turns[0].model[0]: \"provider_error\" cannot be "
                     "combined with \"tool_calls\" (a failed request has no "
                     "reply)");
}

/* The first problem in document order is reported. */
Test(scripted_shape, first_problem_wins) {
  expect_shape_error("[{'user':'a','model':[{'text':1}]},"
                     " {'user':2,'model':[]}]",
                     "turns[0].model[0].text: expected a string");
}

Test(scripted_shape, valid_shapes_load) {
  ag_provider *p = load(
      "[{'user':'a','model':[],'repeat_last':false,"
      "  'expect':{'status':'completed','anything':[1,2]}},"
      " {'user':'b','model':[{'text':'t','tool_calls':[{'name':'n',"
      "   'arguments':[1],'id':'i'}],'delay_ms':0},"
      "  {'provider_error':{'status':0}},"
      "  {'provider_error':{'status':599,'retry_after_ms':0,'message':''}}]}]");
  cr_expect_str_eq(ag_provider_kind(p), "scripted");
  ag_provider_free(p);
  /* No turns at all is a valid (if useless) script. */
  p = load("[]");
  ag_provider_error pe = expect_perr(p, 1);
  cr_expect(pe.exhausted);
  ag_provider_free(p);
}

/* ------------------------------------------------------------------------ */
/* Answers                                                                  */
/* ------------------------------------------------------------------------ */

Test(scripted, replies_in_order_per_turn) {
  ag_provider *p = load("[{'user':'a','model':[{'text':'1a'},{'text':'1b'},"
                        "                     {'text':'1c'}]},"
                        " {'user':'b','model':[{'text':'2a'},{'text':'2b'}]},"
                        " {'user':'c','model':[{'text':'3a'}]}]");
  expect_text(p, 1, "1a");
  expect_text(p, 1, "1b");
  /* Each turn has its own position. */
  expect_text(p, 3, "3a");
  expect_text(p, 2, "2a");
  expect_text(p, 1, "1c");
  expect_text(p, 2, "2b");
  ag_provider_free(p);
}

Test(scripted, text_and_tool_calls_together) {
  ag_provider *p = load("[{'user':'a','model':[{'text':'let me look',"
                        " 'tool_calls':[{'name':'read','arguments':{'p':1}},"
                        "               {'name':'list'}]}]}]");
  ag_reply r;
  ag_provider_error pe;
  cr_assert_eq(ask(p, 1, &r, &pe), AG_OK);
  cr_expect_str_eq(r.text, "let me look");
  cr_assert_eq(r.n_calls, 2);
  cr_expect_str_eq(r.calls[0].name, "read");
  cr_expect_str_eq(r.calls[0].arguments, "{\"p\":1}");
  cr_expect_str_eq(r.calls[1].name, "list");
  /* A call without arguments gets an empty object. */
  cr_expect_str_eq(r.calls[1].arguments, "{}");
  cr_expect_eq(r.calls[1].arguments_len, 2);
  ag_reply_clear(&r);
  ag_provider_free(p);
}

Test(scripted, tool_calls_only_has_no_text) {
  ag_provider *p = load("[{'user':'a','model':[{'tool_calls':[{'name':'x'}]},"
                        "                     {'text':''}]}]");
  ag_reply r;
  ag_provider_error pe;
  cr_assert_eq(ask(p, 1, &r, &pe), AG_OK);
  cr_expect_null(r.text);
  cr_expect_eq(r.n_calls, 1);
  ag_reply_clear(&r);
  /* An empty text is a reply with empty text, not a missing one. */
  expect_text(p, 1, "");
  ag_provider_free(p);
}

Test(scripted, raw_string_arguments_verbatim) {
  ag_provider *p =
      load("[{'user':'a','model':[{'tool_calls':["
           "  {'name':'a','arguments':'{bad json'},"
           "  {'name':'b','arguments':'{ \\'z\\' : 1 ,  \\'a\\':2 }'},"
           "  {'name':'c','arguments':''},"
           "  {'name':'d','arguments':'a\\u0000b'}]}]}]");
  ag_reply r;
  ag_provider_error pe;
  cr_assert_eq(ask(p, 1, &r, &pe), AG_OK);
  cr_assert_eq(r.n_calls, 4);
  cr_expect_str_eq(r.calls[0].arguments, "{bad json");
  cr_expect_eq(r.calls[0].arguments_len, strlen("{bad json"));
  cr_expect_str_eq(r.calls[1].arguments, "{ \"z\" : 1 ,  \"a\":2 }");
  cr_expect_str_eq(r.calls[2].arguments, "");
  cr_expect_eq(r.calls[2].arguments_len, 0);
  /* Embedded NUL: the length says it all. */
  cr_expect_eq(r.calls[3].arguments_len, 3);
  cr_expect(memcmp(r.calls[3].arguments, "a\0b", 3) == 0);
  ag_reply_clear(&r);
  ag_provider_free(p);
}

Test(scripted, object_arguments_serialized_in_order) {
  ag_provider *p =
      load("[{'user':'a','model':[{'tool_calls':["
           "  {'name':'a','arguments':{'z':1,'a':[1,2,{'y':null,'b':true}],"
           "                           's':'h\\u00e9\\n','n':-2.5}},"
           "  {'name':'b','arguments':[1,'two']},"
           "  {'name':'c','arguments':{}}]}]}]");
  ag_reply r;
  ag_provider_error pe;
  cr_assert_eq(ask(p, 1, &r, &pe), AG_OK);
  cr_assert_eq(r.n_calls, 3);
  const char *want0 =
      "{\"z\":1,\"a\":[1,2,{\"y\":null,\"b\":true}],\"s\":\"h\xc3\xa9\\n\","
      "\"n\":-2.5}";
  cr_expect_str_eq(r.calls[0].arguments, want0, "got  %s\nwant %s",
                   r.calls[0].arguments, want0);
  cr_expect_eq(r.calls[0].arguments_len, strlen(want0));
  cr_expect_str_eq(r.calls[1].arguments, "[1,\"two\"]");
  cr_expect_str_eq(r.calls[2].arguments, "{}");
  ag_reply_clear(&r);
  ag_provider_free(p);
}

Test(scripted, ids_generated_or_kept) {
  ag_provider *p = load("[{'user':'a','model':["
                        "  {'tool_calls':[{'name':'a'},{'name':'b'},"
                        "                 {'name':'c'}]},"
                        "  {'tool_calls':[{'name':'a','id':'call_abc'},"
                        "                 {'name':'b'},"
                        "                 {'name':'c','id':''}]}]}]");
  ag_reply r;
  ag_provider_error pe;
  cr_assert_eq(ask(p, 1, &r, &pe), AG_OK);
  cr_assert_eq(r.n_calls, 3);
  cr_expect_str_eq(r.calls[0].id, "call_1");
  cr_expect_str_eq(r.calls[1].id, "call_2");
  cr_expect_str_eq(r.calls[2].id, "call_3");
  ag_reply_clear(&r);
  /* Numbering is the index within the reply, whatever ids the others have. */
  cr_assert_eq(ask(p, 1, &r, &pe), AG_OK);
  cr_assert_eq(r.n_calls, 3);
  cr_expect_str_eq(r.calls[0].id, "call_abc");
  cr_expect_str_eq(r.calls[1].id, "call_2");
  cr_expect_str_eq(r.calls[2].id, "call_3");
  ag_reply_clear(&r);
  ag_provider_free(p);
}

/* ------------------------------------------------------------------------ */
/* Provider errors                                                          */
/* ------------------------------------------------------------------------ */

typedef struct perr_case {
  const char *error;
  int status;
  bool transient;
  int64_t retry_after_ms;
  const char *message;
} perr_case;

Test(scripted, provider_errors_classified) {
  static const perr_case cases[] = {
      {"{'status':429,'retry_after_ms':10}", 429, true, 10,
       "Too Many Requests"},
      {"{'status':503}", 503, true, -1, "Service Unavailable"},
      {"{'status':500}", 500, true, -1, "Internal Server Error"},
      {"{'status':502}", 502, true, -1, "Bad Gateway"},
      {"{'status':504}", 504, true, -1, "Gateway Timeout"},
      {"{'status':599}", 599, true, -1, "Server Error"},
      {"{'status':408}", 408, true, -1, "Request Timeout"},
      {"{'status':0}", 0, true, -1, "Connection failed"},
      {"{'status':400}", 400, false, -1, "Bad Request"},
      {"{'status':401}", 401, false, -1, "Unauthorized"},
      {"{'status':403}", 403, false, -1, "Forbidden"},
      {"{'status':404}", 404, false, -1, "Not Found"},
      {"{'status':422}", 422, false, -1, "Unprocessable Content"},
      {"{'status':418}", 418, false, -1, "Client Error"},
      {"{'status':429,'retry_after_ms':0,'message':'slow down'}", 429, true, 0,
       "slow down"},
      {"{'status':400,'retry_after_ms':2500}", 400, false, 2500, "Bad Request"},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    const perr_case *c = &cases[i];
    char text[512];
    snprintf(text, sizeof(text),
             "[{'user':'u','model':[{'provider_error':%s}]}]", c->error);
    ag_provider *p = load(text);
    ag_provider_error pe = expect_perr(p, 1);
    cr_expect_eq(pe.http_status, c->status, "%s: status %d", c->error,
                 pe.http_status);
    cr_expect_eq(pe.transient, c->transient, "%s: transient %d", c->error,
                 pe.transient);
    cr_expect_eq(pe.retry_after_ms, c->retry_after_ms,
                 "%s: retry_after_ms %lld", c->error,
                 (long long)pe.retry_after_ms);
    cr_expect_str_eq(pe.message, c->message, "%s: message \"%s\"", c->error,
                     pe.message);
    cr_expect_not(pe.exhausted);
    cr_expect_str_eq(pe.details, "");
    ag_provider_free(p);
  }
}

Test(scripted, provider_error_consumes_its_reply) {
  ag_provider *p = load("[{'user':'u','model':["
                        "  {'provider_error':{'status':429}},"
                        "  {'provider_error':{'status':503}},"
                        "  {'text':'finally'}]}]");
  cr_expect_eq(expect_perr(p, 1).http_status, 429);
  cr_expect_eq(expect_perr(p, 1).http_status, 503);
  expect_text(p, 1, "finally");
  ag_provider_free(p);
}

/* A provider error quoting a key, a token or the environment's secret is
 * redacted before anyone sees it (issue 10, finding 14). */
Test(scripted, provider_error_messages_are_redacted) {
  cr_assert_eq(setenv("AG_TEST_PROVIDER_TOKEN", "tok-0123456789abcdef", 1), 0);
  ag_provider *p = load("[{'user':'u','model':[{'provider_error':{'status':401,"
                        "'message':'Incorrect API key provided: "
                        "sk-abcdefghijklmnopqrstuvwxyz0123 (sent: Bearer "
                        "tok-0123456789abcdef)'}}]}]");
  ag_provider_error pe = expect_perr(p, 1);
  cr_expect_str_eq(pe.message,
                   "Incorrect API key provided: [REDACTED] (sent: Bearer "
                   "[REDACTED])",
                   "got \"%s\"", pe.message);
  ag_provider_free(p);
  unsetenv("AG_TEST_PROVIDER_TOKEN");
}

Test(scripted, long_message_cut_on_utf8_boundary) {
  /* 300 two-byte characters: 600 bytes, more than perr->message holds. */
  char text[2048];
  size_t n = (size_t)snprintf(
      text, sizeof(text),
      "[{'user':'u','model':[{'provider_error':{'status':500,'message':'");
  for (int i = 0; i < 300; i++)
    n += (size_t)snprintf(text + n, sizeof(text) - n, "\xc3\xa9");
  snprintf(text + n, sizeof(text) - n, "'}}]}]");
  ag_provider *p = load(text);
  ag_provider_error pe = expect_perr(p, 1);
  size_t len = strlen(pe.message);
  cr_expect_lt(len, sizeof(pe.message));
  cr_expect_eq(len % 2, 0, "cut inside a character: %zu bytes", len);
  cr_expect_geq(len, sizeof(pe.message) - 2);
  ag_provider_free(p);
}

/* ------------------------------------------------------------------------ */
/* Exhaustion and turn numbers                                              */
/* ------------------------------------------------------------------------ */

Test(scripted, exhausted_without_repeat_last) {
  ag_provider *p = load("[{'user':'a','model':[{'text':'x'}]},"
                        " {'user':'b','model':[{'text':'1'},{'text':'2'},"
                        "                     {'text':'3'}]}]");
  expect_text(p, 2, "1");
  expect_text(p, 2, "2");
  expect_text(p, 2, "3");
  ag_provider_error pe = expect_perr(p, 2);
  cr_expect(pe.exhausted);
  cr_expect_not(pe.transient);
  cr_expect_eq(pe.http_status, 0);
  cr_expect_eq(pe.retry_after_ms, -1);
  cr_expect_str_eq(pe.message, "the scenario has no more model replies for "
                               "turn 2 (it has 3)");
  /* And it stays exhausted. */
  cr_expect(expect_perr(p, 2).exhausted);
  /* Other turns are unaffected. */
  expect_text(p, 1, "x");
  ag_provider_free(p);
}

Test(scripted, repeat_last_repeats) {
  ag_provider *p = load("[{'user':'a','repeat_last':true,"
                        "  'model':[{'text':'1'},{'tool_calls':[{'name':'t',"
                        "            'arguments':{'q':1}}]}]},"
                        " {'user':'b','repeat_last':true,"
                        "  'model':[{'provider_error':{'status':503,"
                        "            'retry_after_ms':7}}]}]");
  expect_text(p, 1, "1");
  for (int i = 0; i < 5; i++) {
    ag_reply r;
    ag_provider_error pe;
    cr_assert_eq(ask(p, 1, &r, &pe), AG_OK);
    cr_assert_eq(r.n_calls, 1);
    cr_expect_str_eq(r.calls[0].name, "t");
    cr_expect_str_eq(r.calls[0].arguments, "{\"q\":1}");
    cr_expect_str_eq(r.calls[0].id, "call_1");
    ag_reply_clear(&r);
  }
  /* A repeated provider error fails every time. */
  for (int i = 0; i < 3; i++) {
    ag_provider_error pe = expect_perr(p, 2);
    cr_expect_not(pe.exhausted);
    cr_expect_eq(pe.http_status, 503);
    cr_expect_eq(pe.retry_after_ms, 7);
  }
  ag_provider_free(p);
}

/* repeat_last has an end: after 1000 repeats the script is exhausted,
 * saying that nothing stopped the turn (a preset with no caps would
 * otherwise loop until killed). */
Test(scripted, repeat_last_ends_after_1000_repeats) {
  ag_provider *p = load("[{'user':'a','repeat_last':true,"
                        "  'model':[{'text':'again'}]}]");
  expect_text(p, 1, "again");
  for (int i = 0; i < 1000; i++)
    expect_text(p, 1, "again");
  ag_provider_error pe = expect_perr(p, 1);
  cr_expect(pe.exhausted);
  cr_expect(strstr(pe.message, "repeated 1000 times (repeat_last) and "
                               "nothing stopped the turn") != NULL,
            "%s", pe.message);
  ag_provider_free(p);
}

Test(scripted, repeat_last_with_no_replies_is_exhausted) {
  ag_provider *p = load("[{'user':'a','repeat_last':true,'model':[]}]");
  ag_provider_error pe = expect_perr(p, 1);
  cr_expect(pe.exhausted);
  cr_expect_str_eq(pe.message, "the scenario has no more model replies for "
                               "turn 1 (it has 0)");
  ag_provider_free(p);
}

Test(scripted, turn_past_the_script) {
  ag_provider *p = load("[{'user':'a','model':[{'text':'x'}]},"
                        " {'user':'b','model':[{'text':'y'}]}]");
  ag_provider_error pe = expect_perr(p, 3);
  cr_expect(pe.exhausted);
  cr_expect_str_eq(pe.message, "the scenario has no model replies for turn 3 "
                               "(it has 2 turns)");
  cr_expect(expect_perr(p, 1000000).exhausted);
  expect_text(p, 2, "y");
  expect_text(p, 1, "x");
  ag_provider_free(p);
}

Test(scripted, turns_are_numbered_from_one) {
  ag_provider *p = load("[{'user':'a','model':[{'text':'x'}]}]");
  ag_reply r;
  ag_provider_error pe;
  cr_expect_eq(ask(p, 0, &r, &pe), AG_EINVAL);
  cr_expect_eq(ask(p, -3, &r, &pe), AG_EINVAL);
  cr_expect_null(r.text);
  /* Nothing was consumed. */
  expect_text(p, 1, "x");
  ag_provider_free(p);
}

Test(scripted, iteration_does_not_pick_the_reply) {
  ag_provider *p =
      load("[{'user':'a','model':[{'text':'first'},{'text':'second'}]}]");
  ag_request req = {NULL, NULL, 1, 7, NULL, 0};
  ag_reply r;
  ag_provider_error pe;
  cr_assert_eq(ag_provider_complete(p, &req, NULL, NULL, NULL, &r, &pe), AG_OK);
  cr_expect_str_eq(r.text, "first");
  ag_reply_clear(&r);
  /* A retry of the same iteration gets the next reply. */
  cr_assert_eq(ag_provider_complete(p, &req, NULL, NULL, NULL, &r, &pe), AG_OK);
  cr_expect_str_eq(r.text, "second");
  ag_reply_clear(&r);
  ag_provider_free(p);
}

/* ------------------------------------------------------------------------ */
/* Streaming deltas                                                         */
/* ------------------------------------------------------------------------ */

typedef struct deltas {
  char buf[256];
  int calls;
  int stop;
} deltas;

static int on_delta(void *user, const char *text, size_t len) {
  deltas *d = user;
  d->calls++;
  size_t used = strlen(d->buf);
  if (used + len < sizeof(d->buf)) {
    memcpy(d->buf + used, text, len);
    d->buf[used + len] = '\0';
  }
  return d->stop;
}

Test(scripted, text_is_streamed_once) {
  ag_provider *p = load("[{'user':'a','model':[{'text':'hello world'},"
                        " {'tool_calls':[{'name':'x'}]},{'text':'stop me'},"
                        " {'text':'after'}]}]");
  ag_request req = {NULL, NULL, 1, 1, NULL, 0};
  deltas d = {"", 0, 0};
  ag_reply r;
  ag_provider_error pe;
  cr_assert_eq(ag_provider_complete(p, &req, NULL, on_delta, &d, &r, &pe),
               AG_OK);
  cr_expect_eq(d.calls, 1);
  cr_expect_str_eq(d.buf, "hello world");
  cr_expect_str_eq(r.text, "hello world");
  ag_reply_clear(&r);
  /* No text: no delta. */
  cr_assert_eq(ag_provider_complete(p, &req, NULL, on_delta, &d, &r, &pe),
               AG_OK);
  cr_expect_eq(d.calls, 1);
  ag_reply_clear(&r);
  /* A callback that asks to stop ends the request. */
  d.stop = 1;
  cr_expect_eq(ag_provider_complete(p, &req, NULL, on_delta, &d, &r, &pe),
               AG_ECANCELLED);
  cr_expect_null(r.text);
  cr_expect_eq(d.calls, 2);
  d.stop = 0;
  cr_assert_eq(ag_provider_complete(p, &req, NULL, on_delta, &d, &r, &pe),
               AG_OK);
  cr_expect_str_eq(r.text, "after");
  ag_reply_clear(&r);
  ag_provider_free(p);
}

/* ------------------------------------------------------------------------ */
/* Delays and cancellation                                                  */
/* ------------------------------------------------------------------------ */

Test(scripted, delay_is_honoured) {
  ag_provider *p = load("[{'user':'a','model':[{'text':'slow','delay_ms':40},"
                        " {'provider_error':{'status':503},'delay_ms':30},"
                        " {'text':'fast'}]}]");
  int64_t t0 = ag_now_ms();
  expect_text(p, 1, "slow");
  int64_t t1 = ag_now_ms();
  cr_expect_geq(t1 - t0, 40, "answered after %lld ms, want >= 40",
                (long long)(t1 - t0));
  cr_expect_eq(expect_perr(p, 1).http_status, 503);
  int64_t t2 = ag_now_ms();
  cr_expect_geq(t2 - t1, 30, "failed after %lld ms, want >= 30",
                (long long)(t2 - t1));
  expect_text(p, 1, "fast");
  cr_expect_lt(ag_now_ms() - t2, 1000);
  ag_provider_free(p);
}

typedef struct canceller {
  ag_cancel *token;
  int after_ms;
} canceller;

static void *cancel_later(void *arg) {
  canceller *c = arg;
  sleep_ms(c->after_ms);
  ag_cancel_cancel(c->token, AG_CANCEL_USER);
  return NULL;
}

Test(scripted, delay_cancelled_from_another_thread) {
  ag_provider *p = load("[{'user':'a','model':[{'text':'never',"
                        " 'delay_ms':10000},{'text':'next'}]}]");
  ag_cancel *tok = NULL;
  cr_assert_eq(ag_cancel_new(&tok, NULL, INT64_MAX, AG_CANCEL_DEADLINE, NULL),
               AG_OK);
  canceller c = {tok, 20};
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, cancel_later, &c), 0);
  int64_t t0 = ag_now_ms();
  ag_reply r;
  ag_provider_error pe;
  ag_err_t rc = ask_c(p, 1, tok, &r, &pe);
  int64_t took = ag_now_ms() - t0;
  pthread_join(th, NULL);
  cr_expect_eq(rc, AG_ECANCELLED, "got %s", ag_err_name(rc));
  cr_expect_null(r.text);
  cr_expect_lt(took, 2000, "cancel took %lld ms", (long long)took);
  cr_expect_eq(ag_cancel_check(tok, ag_now_ms()), AG_CANCEL_USER);
  /* The cancelled request used its reply; an already-cancelled token gets
   * no answer and consumes nothing. */
  cr_expect_eq(ask_c(p, 1, tok, &r, &pe), AG_ECANCELLED);
  ag_cancel_free(tok);
  expect_text(p, 1, "next");
  ag_provider_free(p);
}

Test(scripted, delay_cut_by_a_timeout_token) {
  ag_provider *p = load("[{'user':'a','model':[{'text':'late',"
                        " 'delay_ms':5000},{'text':'retried'}]}]");
  ag_cancel *tok = NULL;
  cr_assert_eq(
      ag_cancel_new(&tok, NULL, ag_now_ms() + 20, AG_CANCEL_TIMEOUT, NULL),
      AG_OK);
  ag_reply r;
  ag_provider_error pe;
  int64_t t0 = ag_now_ms();
  cr_expect_eq(ask_c(p, 1, tok, &r, &pe), AG_ECANCELLED);
  cr_expect_lt(ag_now_ms() - t0, 2000);
  cr_expect_eq(ag_cancel_check(tok, ag_now_ms()), AG_CANCEL_TIMEOUT);
  ag_cancel_free(tok);
  /* The loop's retry of a timed-out request gets the next reply. */
  expect_text(p, 1, "retried");
  ag_provider_free(p);
}

/* ------------------------------------------------------------------------ */
/* ag_provider_new with a vtable of our own                                 */
/* ------------------------------------------------------------------------ */

typedef enum {
  MODE_REPLY,       /* text "ok" and one call */
  MODE_BARE_ERROR,  /* AG_EPROVIDER, perr untouched */
  MODE_HALF_REPLY,  /* fills *out then fails: the wrapper frees it */
  MODE_BAD_PERR,    /* unterminated buffers, retry_after_ms -7 */
  MODE_NOMEM,       /* AG_ENOMEM after scribbling on perr */
  MODE_CANCEL_FAIL, /* cancels the token, then reports a connection error */
} fake_mode;

typedef struct fake {
  int *destroyed;
  int completes;
  fake_mode mode;
  const ag_request *seen_req;
  ag_cancel *seen_cancel;
  void *seen_delta_user;
  int64_t perr_retry_at_entry;
  int out_zero_at_entry;
} fake;

static ag_err_t fake_complete(void *self, const ag_request *req,
                              ag_cancel *cancel, ag_delta_fn delta,
                              void *delta_user, ag_reply *out,
                              ag_provider_error *perr) {
  fake *f = self;
  f->completes++;
  f->seen_req = req;
  f->seen_cancel = cancel;
  f->seen_delta_user = delta_user;
  f->perr_retry_at_entry = perr->retry_after_ms;
  f->out_zero_at_entry = out->text == NULL && out->calls == NULL &&
                         out->n_calls == 0 && perr->service[0] == '\0' &&
                         !perr->exhausted && !perr->transient;
  switch (f->mode) {
  case MODE_REPLY:
    if (delta != NULL)
      delta(delta_user, "ok", 2);
    out->text = strdup("ok");
    return ag_reply_add_call(out, NULL, "t", "{}", 2);
  case MODE_BARE_ERROR:
    return AG_EPROVIDER;
  case MODE_HALF_REPLY:
    out->text = strdup("partial");
    ag_reply_add_call(out, "id", "t", "{", 1);
    perr->http_status = 502;
    perr->transient = true;
    return AG_EPROVIDER;
  case MODE_BAD_PERR:
    memset(perr->service, 'S', sizeof(perr->service));
    memset(perr->message, 'M', sizeof(perr->message));
    memset(perr->details, 'D', sizeof(perr->details));
    perr->retry_after_ms = -7;
    return AG_EPROVIDER;
  case MODE_NOMEM:
    perr->http_status = 500;
    return AG_ENOMEM;
  case MODE_CANCEL_FAIL:
    ag_cancel_cancel(cancel, AG_CANCEL_USER);
    perr->transient = true;
    return AG_EPROVIDER;
  }
  return AG_EINVAL;
}

static void fake_destroy(void *self) {
  fake *f = self;
  (*f->destroyed)++;
}

static const ag_provider_vtable fake_vt = {sizeof(ag_provider_vtable), "fake",
                                           fake_complete, fake_destroy, 0};

static ag_provider *new_fake(fake *f, int *destroyed, fake_mode mode) {
  memset(f, 0, sizeof(*f));
  f->destroyed = destroyed;
  f->mode = mode;
  ag_provider *p = NULL;
  ag_error_t err;
  cr_assert_eq(ag_provider_new(&p, &fake_vt, f, &err), AG_OK, "%s", err.msg);
  return p;
}

Test(provider, custom_vtable_round_trip) {
  int destroyed = 0;
  fake f;
  ag_provider *p = new_fake(&f, &destroyed, MODE_REPLY);
  cr_expect_str_eq(ag_provider_kind(p), "fake");
  ag_request req = {NULL, NULL, 2, 3, NULL, 0};
  deltas d = {"", 0, 0};
  ag_reply r;
  ag_provider_error pe;
  memset(&r, 0x5a, sizeof(r)); /* garbage in: the wrapper zeroes it */
  memset(&pe, 0x5a, sizeof(pe));
  cr_assert_eq(ag_provider_complete(p, &req, NULL, on_delta, &d, &r, &pe),
               AG_OK);
  cr_expect_eq(f.completes, 1);
  cr_expect_eq(f.seen_req, &req);
  cr_expect_eq(f.seen_delta_user, &d);
  cr_expect(f.out_zero_at_entry, "out/perr not zeroed before the call");
  cr_expect_eq(f.perr_retry_at_entry, -1);
  cr_expect_str_eq(d.buf, "ok");
  cr_expect_str_eq(r.text, "ok");
  cr_assert_eq(r.n_calls, 1);
  cr_expect_str_eq(r.calls[0].id, "call_1");
  ag_reply_clear(&r);
  cr_expect_eq(destroyed, 0);
  ag_provider_free(p);
  cr_expect_eq(destroyed, 1, "destroy called %d times", destroyed);
  ag_provider_free(NULL);
}

Test(provider, perr_defaults_filled) {
  int destroyed = 0;
  fake f;
  ag_provider *p = new_fake(&f, &destroyed, MODE_BARE_ERROR);
  ag_reply r;
  ag_provider_error pe;
  cr_assert_eq(ask(p, 1, &r, &pe), AG_EPROVIDER);
  cr_expect_str_eq(pe.service, "fake");
  cr_expect_str_eq(pe.message, "model request failed");
  cr_expect_eq(pe.retry_after_ms, -1);
  cr_expect_eq(pe.http_status, 0);
  cr_expect_not(pe.transient);
  /* perr may be NULL. */
  cr_expect_eq(ask(p, 1, &r, NULL), AG_EPROVIDER);
  ag_provider_free(p);
  cr_expect_eq(destroyed, 1);
}

Test(provider, failure_frees_a_half_built_reply) {
  int destroyed = 0;
  fake f;
  ag_provider *p = new_fake(&f, &destroyed, MODE_HALF_REPLY);
  ag_reply r;
  ag_provider_error pe;
  cr_assert_eq(ask(p, 1, &r, &pe), AG_EPROVIDER);
  cr_expect_null(r.text);
  cr_expect_null(r.calls);
  cr_expect_eq(r.n_calls, 0);
  cr_expect_eq(pe.http_status, 502);
  cr_expect(pe.transient);
  cr_expect_str_eq(pe.message, "HTTP status 502");
  ag_provider_free(p);
}

Test(provider, unterminated_perr_buffers_are_terminated) {
  int destroyed = 0;
  fake f;
  ag_provider *p = new_fake(&f, &destroyed, MODE_BAD_PERR);
  ag_reply r;
  ag_provider_error pe;
  cr_assert_eq(ask(p, 1, &r, &pe), AG_EPROVIDER);
  cr_expect_eq(strlen(pe.service), sizeof(pe.service) - 1);
  cr_expect_eq(strlen(pe.message), sizeof(pe.message) - 1);
  cr_expect_eq(strlen(pe.details), sizeof(pe.details) - 1);
  cr_expect_eq(pe.retry_after_ms, -1);
  ag_provider_free(p);
}

Test(provider, other_failures_leave_perr_clean) {
  int destroyed = 0;
  fake f;
  ag_provider *p = new_fake(&f, &destroyed, MODE_NOMEM);
  ag_reply r;
  ag_provider_error pe;
  cr_assert_eq(ask(p, 1, &r, &pe), AG_ENOMEM);
  cr_expect_eq(pe.http_status, 0);
  cr_expect_eq(pe.retry_after_ms, -1);
  ag_provider_free(p);
}

Test(provider, cancelled_wins_over_a_provider_error) {
  int destroyed = 0;
  fake f;
  ag_provider *p = new_fake(&f, &destroyed, MODE_CANCEL_FAIL);
  ag_cancel *tok = NULL;
  cr_assert_eq(ag_cancel_new(&tok, NULL, INT64_MAX, AG_CANCEL_DEADLINE, NULL),
               AG_OK);
  ag_reply r;
  ag_provider_error pe;
  cr_expect_eq(ask_c(p, 1, tok, &r, &pe), AG_ECANCELLED);
  cr_expect_eq(f.completes, 1);
  cr_expect_eq(f.seen_cancel, tok);
  /* Already cancelled: complete() is not called at all. */
  cr_expect_eq(ask_c(p, 1, tok, &r, &pe), AG_ECANCELLED);
  cr_expect_eq(f.completes, 1);
  ag_cancel_free(tok);
  ag_provider_free(p);
}

Test(provider, bad_arguments) {
  int destroyed = 0;
  fake f;
  ag_provider *p = new_fake(&f, &destroyed, MODE_REPLY);
  ag_request req = {NULL, NULL, 1, 1, NULL, 0};
  ag_reply r;
  ag_provider_error pe;
  cr_expect_eq(ag_provider_complete(NULL, &req, NULL, NULL, NULL, &r, &pe),
               AG_EINVAL);
  cr_expect_eq(ag_provider_complete(p, NULL, NULL, NULL, NULL, &r, &pe),
               AG_EINVAL);
  cr_expect_eq(ag_provider_complete(p, &req, NULL, NULL, NULL, NULL, &pe),
               AG_EINVAL);
  cr_expect_eq(f.completes, 0);
  ag_provider_free(p);
  cr_expect_eq(destroyed, 1);
  cr_expect_str_eq(ag_provider_kind(NULL), "custom");
}

Test(provider, new_rejects_bad_vtables_and_steals_self) {
  int destroyed = 0;
  fake f = {.destroyed = &destroyed};
  ag_provider *p = (ag_provider *)&p;
  ag_error_t err;
  cr_expect_eq(ag_provider_new(&p, NULL, &f, &err), AG_EINVAL);
  cr_expect_null(p);
  cr_expect_str_eq(err.msg, "ag_provider_new: vtable is NULL");

  static const ag_provider_vtable no_complete = {sizeof(ag_provider_vtable),
                                                 "x", NULL, fake_destroy, 0};
  p = (ag_provider *)&p;
  cr_expect_eq(ag_provider_new(&p, &no_complete, &f, &err), AG_EINVAL);
  cr_expect_null(p);
  cr_expect_eq(destroyed, 1, "self not destroyed on failure");

  cr_expect_eq(ag_provider_new(NULL, &fake_vt, &f, &err), AG_EINVAL);
  cr_expect_eq(destroyed, 2);

  /* No kind, no destroy: allowed. */
  static const ag_provider_vtable bare = {sizeof(ag_provider_vtable), NULL,
                                          fake_complete, NULL, 0};
  cr_assert_eq(ag_provider_new(&p, &bare, &f, NULL), AG_OK);
  cr_expect_str_eq(ag_provider_kind(p), "custom");
  ag_provider_free(p);
  cr_expect_eq(destroyed, 2);
}

/* ------------------------------------------------------------------------ */
/* Replies                                                                  */
/* ------------------------------------------------------------------------ */

Test(reply, add_call_and_clear) {
  ag_reply r = {0};
  cr_assert_eq(ag_reply_add_call(&r, NULL, "a", "{\"x\":1}", 7), AG_OK);
  cr_assert_eq(ag_reply_add_call(&r, "mine", "b", "[]", 2), AG_OK);
  cr_assert_eq(ag_reply_add_call(&r, "", "c", NULL, 0), AG_OK);
  char args[] = {'{', '\0', '}'};
  cr_assert_eq(ag_reply_add_call(&r, NULL, "d", args, 3), AG_OK);
  /* Only a prefix of the buffer is copied. */
  cr_assert_eq(ag_reply_add_call(&r, NULL, "e", "{}garbage", 2), AG_OK);
  cr_assert_eq(r.n_calls, 5);
  cr_expect_str_eq(r.calls[0].id, "call_1");
  cr_expect_str_eq(r.calls[0].name, "a");
  cr_expect_str_eq(r.calls[0].arguments, "{\"x\":1}");
  cr_expect_eq(r.calls[0].arguments_len, 7);
  cr_expect_str_eq(r.calls[1].id, "mine");
  cr_expect_str_eq(r.calls[2].id, "call_3");
  cr_expect_str_eq(r.calls[2].arguments, "");
  cr_expect_eq(r.calls[2].arguments_len, 0);
  cr_expect_eq(r.calls[3].arguments_len, 3);
  cr_expect(memcmp(r.calls[3].arguments, args, 3) == 0);
  cr_expect_str_eq(r.calls[4].arguments, "{}");
  cr_expect_str_eq(r.calls[4].id, "call_5");

  /* Strings are copied, not kept. */
  char name[] = "tool";
  cr_assert_eq(ag_reply_add_call(&r, NULL, name, "{}", 2), AG_OK);
  name[0] = 'X';
  cr_expect_str_eq(r.calls[5].name, "tool");

  r.text = strdup("hello");
  ag_reply_clear(&r);
  cr_expect_null(r.text);
  cr_expect_null(r.calls);
  cr_expect_eq(r.n_calls, 0);
  ag_reply_clear(&r); /* twice is fine */
  ag_reply_clear(NULL);
}

Test(reply, add_call_bad_arguments) {
  ag_reply r = {0};
  cr_expect_eq(ag_reply_add_call(NULL, NULL, "a", "{}", 2), AG_EINVAL);
  cr_expect_eq(ag_reply_add_call(&r, NULL, NULL, "{}", 2), AG_EINVAL);
  cr_expect_eq(ag_reply_add_call(&r, NULL, "a", NULL, 3), AG_EINVAL);
  cr_expect_eq(r.n_calls, 0);
  cr_expect_null(r.calls);
}

/* The vtable's size field guards the ABI: a size the library does not know
 * (0: a vtable from before the field existed, or one from a newer header) is
 * refused, and `self` is still destroyed. */
Test(provider, new_checks_vtable_size) {
  int destroyed = 0;
  fake f = {.destroyed = &destroyed};
  ag_provider *p = (ag_provider *)&p;
  ag_error_t err;
  static const ag_provider_vtable zero = {0, "x", fake_complete, fake_destroy,
                                          0};
  cr_expect_eq(ag_provider_new(&p, &zero, &f, &err), AG_EINVAL);
  cr_expect_null(p);
  cr_expect_eq(destroyed, 1);
  cr_expect(strstr(err.msg, "size 0") != NULL, "%s", err.msg);
  static const ag_provider_vtable big = {sizeof(ag_provider_vtable) + 8, "x",
                                         fake_complete, fake_destroy, 0};
  cr_expect_eq(ag_provider_new(&p, &big, &f, &err), AG_EINVAL);
  cr_expect_eq(destroyed, 2);
  cr_expect(strstr(err.msg, "newer") != NULL, "%s", err.msg);
}
