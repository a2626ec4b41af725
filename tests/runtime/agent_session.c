/*
 * tests/runtime/agent_session.c - the agentic loop's model requests
 * (network retries and failures), the turn deadline and caller
 * cancellation, feedback forms and approvals, the event stream, and
 * sessions (test_agent's cases; the fixture is agent_fixture.h's).
 *
 * Timings use tens of milliseconds with generous margins: the suite runs on
 * shared cores and under sanitizers.
 */
#include "agent_fixture.h"

/* ------------------------------------------------------------------------ */
/* Model requests: retries and failures                                     */
/* ------------------------------------------------------------------------ */

Test(agent, rate_limit_with_retry_after_then_success) {
  ag_config cfg = preset("default");
  setup(&cfg, "[{\"model\": [{\"error\": {\"status\": 429, "
              "\"retry_after_ms\": 40, \"message\": \"slow down\"}},"
              "{\"text\": \"ok now\"}]}]");
  int64_t t0 = ag_now_ms();
  ag_turn_outcome o = run("hi");
  int64_t took = ag_now_ms() - t0;
  ASSERT_OUTCOME(o, AG_TURN_COMPLETED, "final_answer");
  cr_assert_eq(o.iterations, 1, "a retried request is not an iteration");
  cr_assert_eq(json_array_size(H.fake->requests), 2);
  cr_assert_geq(took, 40, "Retry-After honoured (took %lld ms)",
                (long long)took);
  json_t *r = events_named("provider_retry");
  cr_assert_eq(json_array_size(r), 1);
  json_t *e = json_array_get(r, 0);
  cr_assert_eq(json_integer_value(json_object_get(e, "attempt")), 1);
  cr_assert_eq(json_integer_value(json_object_get(e, "status")), 429);
  cr_assert_geq(json_integer_value(json_object_get(e, "delay_ms")), 40);
  cr_assert_str_eq(str(e, "message"), "slow down");
  json_decref(r);
  cr_assert_eq(count_events("model_request"), 1);
  ag_turn_outcome_clear(&o);
  teardown();
}

Test(agent, unauthorized_is_not_retried) {
  ag_config cfg = preset("default");
  setup(&cfg, "[{\"model\": [{\"error\": {\"status\": 401, \"message\": "
              "\"invalid api key\"}}, {\"text\": \"never\"}]}]");
  ag_turn_outcome o = run("hi");
  ASSERT_OUTCOME(o, AG_TURN_FAILED, "model_error");
  cr_assert_eq(json_array_size(H.fake->requests), 1);
  cr_assert_eq(count_events("provider_retry"), 0);
  cr_assert(strstr(o.message, "The model service fake answered HTTP 401 "
                              "(Unauthorized)") != NULL,
            "%s", o.message);
  cr_assert(strstr(o.message, "not retried") != NULL, "%s", o.message);
  cr_assert(strstr(o.message, "invalid api key") != NULL, "%s", o.message);
  cr_assert(strstr(o.message, "raw") == NULL, "no details by default: %s",
            o.message);
  cr_assert_eq(count_events("turn_end"), 1);
  ag_turn_outcome_clear(&o);
  teardown();
}

Test(agent, retries_exhausted) {
  ag_config cfg = preset("default");
  cfg.network.max_retries = 2;
  cfg.errors.include_provider_details = true;
  setup(&cfg, "[{\"model\": [{\"error\": {\"status\": 503}}], "
              "\"repeat_last\": true}]");
  ag_turn_outcome o = run("hi");
  ASSERT_OUTCOME(o, AG_TURN_FAILED, "model_error");
  cr_assert_eq(json_array_size(H.fake->requests), 3);
  cr_assert_eq(count_events("provider_retry"), 2);
  cr_assert(strstr(o.message, "The model service fake answered HTTP 503 "
                              "(Service Unavailable) 3 times over ") != NULL,
            "%s", o.message);
  cr_assert(strstr(o.message, "giving up.") != NULL, "%s", o.message);
  /* the scripted reply said nothing of its own: its reason phrase is not
   * repeated as "The last answer: Service Unavailable" */
  cr_assert(strstr(o.message, "The last answer") == NULL, "%s", o.message);
  cr_assert(strstr(o.message, "Details: {\"raw\":\"body\"}") != NULL, "%s",
            o.message);
  cr_assert_eq(o.iterations, 1);
  ag_turn_outcome_clear(&o);
  teardown();
}

Test(agent, script_exhausted) {
  ag_config cfg = preset("default");
  setup(&cfg, "[{\"model\": [{\"tool_calls\": [{\"name\": \"echo\", "
              "\"arguments\": {}}]}]}]");
  ag_turn_outcome o = run("hi");
  ASSERT_OUTCOME(o, AG_TURN_FAILED, "script_exhausted");
  cr_assert_eq(o.iterations, 2);
  ag_turn_outcome_clear(&o);
  teardown();
}

/* ------------------------------------------------------------------------ */
/* Deadline and cancellation                                                */
/* ------------------------------------------------------------------------ */

Test(agent, turn_deadline_while_a_tool_hangs) {
  ag_config cfg = preset("default");
  cfg.loop.max_turn_duration_ms = 100;
  setup(&cfg, "[{\"model\": [{\"tool_calls\": [{\"name\": \"hang\", "
              "\"arguments\": {}}]}, {\"text\": \"never\"}]},"
              " {\"model\": [{\"text\": \"after\"}]}]");
  int64_t t0 = ag_now_ms();
  ag_turn_outcome o = run("hang");
  int64_t took = ag_now_ms() - t0;
  ASSERT_OUTCOME(o, AG_TURN_TIMED_OUT, "turn_timeout");
  cr_assert_geq(took, 95);
  cr_assert_lt(took, 100 + 400, "took %lld ms", (long long)took);
  assert_history_well_formed();
  json_t *end = json_array_get(H.events, json_array_size(H.events) - 1);
  cr_assert_str_eq(str(end, "event"), "turn_end");
  cr_assert_str_eq(str(end, "status"), "timed_out");
  ag_turn_outcome_clear(&o);

  ag_turn_outcome o2 = run("again");
  ASSERT_OUTCOME(o2, AG_TURN_COMPLETED, "final_answer");
  ag_turn_outcome_clear(&o2);
  teardown();
}

Test(agent, turn_deadline_while_the_model_hangs) {
  ag_config cfg = preset("default");
  cfg.loop.max_turn_duration_ms = 60;
  setup(&cfg, "[{\"model\": [{\"hang\": true}]}]");
  int64_t t0 = ag_now_ms();
  ag_turn_outcome o = run("hi");
  ASSERT_OUTCOME(o, AG_TURN_TIMED_OUT, "turn_timeout");
  cr_assert_lt(ag_now_ms() - t0, 60 + 400);
  ag_turn_outcome_clear(&o);
  teardown();
}

typedef struct canceller {
  ag_cancel *token;
  int after_ms;
} canceller;

static void *cancel_later(void *arg) {
  canceller *c = arg;
  struct timespec ts = {0, (long)c->after_ms * 1000000L};
  nanosleep(&ts, NULL);
  ag_cancel_cancel(c->token, AG_CANCEL_USER);
  return NULL;
}

Test(agent, caller_cancel_from_another_thread) {
  ag_config cfg = preset("default");
  setup(&cfg, "[{\"model\": [{\"tool_calls\": [{\"name\": \"hang\", "
              "\"arguments\": {}}, {\"name\": \"hang\", \"arguments\": "
              "{\"b\": 1}}]}]}]");
  ag_cancel *tok = NULL;
  cr_assert_eq(ag_cancel_new(&tok, NULL, INT64_MAX, AG_CANCEL_DEADLINE, NULL),
               AG_OK);
  canceller c = {tok, 50};
  pthread_t th;
  pthread_create(&th, NULL, cancel_later, &c);
  int64_t t0 = ag_now_ms();
  ag_turn_outcome o;
  cr_assert_eq(ag_agent_run_turn(H.agent, "hang", tok, &o, NULL), AG_OK);
  int64_t took = ag_now_ms() - t0;
  pthread_join(th, NULL);
  ASSERT_OUTCOME(o, AG_TURN_CANCELLED, "cancelled");
  cr_assert_lt(took, 50 + 400, "took %lld ms", (long long)took);
  assert_history_well_formed();
  cr_assert_eq(count_events("turn_end"), 1);
  cr_assert_eq(H.max_concurrent, 1, "on_event is never concurrent");
  ag_turn_outcome_clear(&o);
  ag_cancel_free(tok);
  teardown();
}

Test(agent, cancel_during_network_retry_wait) {
  ag_config cfg = preset("default");
  cfg.network.delay_ms = 10000;
  cfg.network.max_delay_ms = 10000;
  setup(&cfg, "[{\"model\": [{\"error\": {\"status\": 503, "
              "\"retry_after_ms\": 10000}}], \"repeat_last\": true}]");
  ag_cancel *tok = NULL;
  cr_assert_eq(ag_cancel_new(&tok, NULL, INT64_MAX, AG_CANCEL_DEADLINE, NULL),
               AG_OK);
  canceller c = {tok, 50};
  pthread_t th;
  pthread_create(&th, NULL, cancel_later, &c);
  int64_t t0 = ag_now_ms();
  ag_turn_outcome o;
  cr_assert_eq(ag_agent_run_turn(H.agent, "hi", tok, &o, NULL), AG_OK);
  pthread_join(th, NULL);
  ASSERT_OUTCOME(o, AG_TURN_CANCELLED, "cancelled");
  cr_assert_lt(ag_now_ms() - t0, 50 + 400);
  cr_assert_eq(count_events("provider_retry"), 1);
  ag_turn_outcome_clear(&o);
  ag_cancel_free(tok);
  teardown();
}

/* ------------------------------------------------------------------------ */
/* Feedback forms and approvals                                             */
/* ------------------------------------------------------------------------ */

#define ONE_FAIL_THEN_TEXT                                                     \
  "[{\"model\": [{\"tool_calls\": [{\"name\": \"fail\", \"arguments\": "       \
  "{\"path\": \"/etc/x\"}}]}, {\"text\": \"gave up\"}]}]"

Test(agent, compact_feedback_in_history) {
  ag_config cfg = preset("default");
  cr_assert_eq(cfg.errors.feedback, AG_FEEDBACK_COMPACT);
  setup(&cfg, ONE_FAIL_THEN_TEXT);
  ag_turn_outcome o = run("read");
  ASSERT_OUTCOME(o, AG_TURN_COMPLETED, "final_answer");
  const char *t = last_content("tool");
  cr_assert(strncmp(t, "<error>\ntool: fail\ntype: ", 25) == 0, "%s", t);
  cr_assert(strstr(t, "message: Error: cannot open /etc/x") != NULL, "%s", t);
  cr_assert(strstr(t, "</error>") != NULL, "%s", t);
  ag_turn_outcome_clear(&o);
  teardown();
}

Test(agent, full_feedback_in_history) {
  ag_config cfg = preset("default");
  cfg.errors.feedback = AG_FEEDBACK_FULL;
  setup(&cfg, ONE_FAIL_THEN_TEXT);
  ag_turn_outcome o = run("read");
  ASSERT_OUTCOME(o, AG_TURN_COMPLETED, "final_answer");
  cr_assert_str_eq(last_content("tool"),
                   "Error: cannot open /etc/x: no such file or directory");
  ag_turn_outcome_clear(&o);
  teardown();
}

Test(agent, denied_approval_is_not_an_error) {
  ag_config cfg = preset("default");
  cfg.errors.max_consecutive_errors = 1;
  setup(&cfg, "[{\"model\": ["
              "{\"tool_calls\": [{\"name\": \"danger\", \"arguments\": {}}]},"
              "{\"tool_calls\": [{\"name\": \"danger\", \"arguments\": "
              "{\"x\": 1}}]},"
              "{\"text\": \"I will not do that\"}]}]");
  H.deny = true;
  ag_turn_outcome o = run("delete it");
  ASSERT_OUTCOME(o, AG_TURN_COMPLETED, "final_answer");
  cr_assert_eq(H.approvals_asked, 2);
  cr_assert_eq(tool_runs, 0);
  cr_assert_eq(o.tool_calls, 0);
  cr_assert_str_eq(last_content("tool"),
                   "Tool call rejected: the user said no");
  json_t *ap = events_named("approval");
  cr_assert_eq(json_array_size(ap), 2);
  cr_assert(json_is_false(json_object_get(json_array_get(ap, 0), "approved")));
  json_decref(ap);
  cr_assert_eq(count_events("error_context"), 0);
  ag_turn_outcome_clear(&o);
  teardown();
}

Test(agent, approved_call_runs) {
  ag_config cfg = preset("default");
  setup(&cfg, "[{\"model\": [{\"tool_calls\": [{\"name\": \"danger\", "
              "\"arguments\": {}}]}, {\"text\": \"done\"}]}]");
  ag_turn_outcome o = run("delete it");
  ASSERT_OUTCOME(o, AG_TURN_COMPLETED, "final_answer");
  cr_assert_eq(tool_runs, 1);
  json_t *ap = events_named("approval");
  cr_assert_eq(json_array_size(ap), 1);
  cr_assert(json_is_true(json_object_get(json_array_get(ap, 0), "approved")));
  json_decref(ap);
  ag_turn_outcome_clear(&o);
  teardown();
}

/* ------------------------------------------------------------------------ */
/* Events                                                                   */
/* ------------------------------------------------------------------------ */

static void assert_events_well_formed(int turns) {
  size_t i;
  json_t *e;
  int turn_ends = 0;
  long long last_t = -1;
  json_array_foreach(H.events, i, e) {
    cr_assert(json_is_string(json_object_get(e, "event")), "event %zu", i);
    cr_assert(json_is_integer(json_object_get(e, "turn")), "event %zu", i);
    cr_assert(json_is_integer(json_object_get(e, "iteration")), "event %zu", i);
    cr_assert(json_is_integer(json_object_get(e, "t_ms")), "event %zu", i);
    long long t = json_integer_value(json_object_get(e, "t_ms"));
    cr_assert_geq(t, last_t, "t_ms never goes back (event %zu)", i);
    last_t = t;
    if (strcmp(str(e, "event"), "turn_end") == 0) {
      turn_ends++;
      for (const char *const *k =
               (const char *const[]){"status", "reason", "message",
                                     "iterations", "tool_calls", "final_text",
                                     NULL};
           *k != NULL; k++)
        cr_assert_not_null(json_object_get(e, *k), "turn_end lacks %s", *k);
    }
    /* every line serializes */
    char *s = json_dumps(e, JSON_COMPACT);
    cr_assert_not_null(s);
    free(s);
  }
  cr_assert_eq(turn_ends, turns);
  json_t *last = json_array_get(H.events, json_array_size(H.events) - 1);
  cr_assert_str_eq(str(last, "event"), "turn_end", "turn_end is last");
}

Test(agent, every_event_has_common_fields_and_turn_end_is_last) {
  ag_config cfg = preset("default");
  cfg.retry.max_retries = 1;
  cfg.retry.delay_ms = 1;
  setup(&cfg,
        "[{\"model\": [{\"tool_calls\": [{\"name\": \"echo\", \"arguments\": "
        "{\"a\": 1}}, {\"name\": \"fail\", \"arguments\": {\"path\": \"p\"}},"
        " {\"name\": \"danger\", \"arguments\": {}}]}, {\"text\": \"ok\"}]},"
        " {\"model\": [" STUCK_ECHO "], \"repeat_last\": true},"
        " {\"model\": [{\"error\": {\"status\": 400}}]}]");
  ag_turn_outcome o = run("one");
  ASSERT_OUTCOME(o, AG_TURN_COMPLETED, "final_answer");
  cr_assert_eq(o.tool_calls, 3);
  ag_turn_outcome_clear(&o);
  /* tool_attempt events carry their call */
  json_t *att = events_named("tool_attempt");
  cr_assert_geq(json_array_size(att), 3);
  size_t i;
  json_t *e;
  json_array_foreach(att, i, e) {
    cr_assert(strlen(str(e, "call_id")) > 0);
    cr_assert(json_is_integer(json_object_get(e, "attempt")));
    const char *oc = str(e, "outcome");
    cr_assert(strcmp(oc, "ok") == 0 || strcmp(oc, "error") == 0, "%s", oc);
  }
  json_decref(att);
  o = run("two");
  ASSERT_OUTCOME(o, AG_TURN_STOPPED, "identical_calls");
  ag_turn_outcome_clear(&o);
  o = run("three");
  ASSERT_OUTCOME(o, AG_TURN_FAILED, "model_error");
  ag_turn_outcome_clear(&o);
  assert_events_well_formed(3);
  teardown();
}

/* Issue 10, finding 11: the attempt's message was cut at the first NUL
 * while the result kept the whole text. */
Test(agent, tool_attempt_message_keeps_nul_bytes_like_tool_result) {
  ag_config cfg = preset("default");
  setup(&cfg, "[{\"model\": [{\"tool_calls\": [{\"name\": \"nul_error\", "
              "\"arguments\": {}}]}, {\"text\": \"ok\"}]}]");
  ag_turn_outcome o = run("x");
  ASSERT_OUTCOME(o, AG_TURN_COMPLETED, "final_answer");
  ag_turn_outcome_clear(&o);
  json_t *att = events_named("tool_attempt");
  json_t *res = events_named("tool_result");
  cr_assert_eq(json_array_size(att), 1);
  cr_assert_eq(json_array_size(res), 1);
  json_t *msg = json_object_get(json_array_get(att, 0), "message");
  json_t *text = json_object_get(json_array_get(res, 0), "text");
  cr_assert_eq(json_string_length(text), 12, "tool_result.text is %zu bytes",
               json_string_length(text));
  cr_expect_eq(json_string_length(msg), 12,
               "tool_attempt.message is %zu bytes, tool_result.text %zu",
               json_string_length(msg), json_string_length(text));
  cr_expect(json_equal(msg, text), "message and text differ");
  json_decref(att);
  json_decref(res);
  teardown();
}

Test(agent, invalid_utf8_tool_output_stays_valid_json) {
  ag_config cfg = preset("default");
  setup(&cfg, "[{\"model\": [{\"tool_calls\": [{\"name\": \"bytes\", "
              "\"arguments\": {}}]}, {\"text\": \"ok\"}]}]");
  ag_turn_outcome o = run("x");
  ASSERT_OUTCOME(o, AG_TURN_COMPLETED, "final_answer");
  cr_assert_str_eq(last_content("tool"),
                   "ok \xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd end");
  char *dump = json_dumps(history(), JSON_COMPACT);
  cr_assert_not_null(dump);
  free(dump);
  json_t *res = events_named("tool_result");
  cr_assert_str_eq(str(json_array_get(res, 0), "text"),
                   "ok \xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd end");
  json_decref(res);
  ag_turn_outcome_clear(&o);
  teardown();
}

/* ------------------------------------------------------------------------ */
/* Sessions                                                                 */
/* ------------------------------------------------------------------------ */

Test(agent, no_registry_means_no_tools) {
  ag_config cfg = preset("default");
  setup_opts so = {.no_tools = true};
  setup_with(&cfg,
             "[{\"model\": [{\"tool_calls\": [{\"name\": \"echo\", "
             "\"arguments\": {}}]}, {\"text\": \"fine\"}]}]",
             so);
  ag_turn_outcome o = run("x");
  ASSERT_OUTCOME(o, AG_TURN_COMPLETED, "final_answer");
  cr_assert(json_is_false(json_object_get(request(0), "tools")));
  cr_assert(strstr(last_content("tool"), "unknown tool") != NULL, "%s",
            last_content("tool"));
  assert_history_well_formed();
  ag_turn_outcome_clear(&o);
  teardown();
}

Test(agent, bad_arguments_and_config) {
  ag_agent *a = NULL;
  ag_agent_opts o;
  ag_agent_opts_init(&o);
  ag_error_t err;
  cr_assert_eq(ag_agent_new(&a, &o, &err), AG_EINVAL);
  cr_assert_null(a);
  cr_assert_eq(ag_agent_new(NULL, &o, NULL), AG_EINVAL);

  ag_config cfg = preset("default");
  setup(&cfg, "[]");
  o.provider = H.provider;
  o.config.errors.max_error_chars = 0; /* out of range */
  cr_assert_eq(ag_agent_new(&a, &o, &err), AG_ECONFIG);
  cr_assert_null(a);
  cr_assert(strstr(err.msg, "max_error_chars") != NULL, "%s", err.msg);

  ag_turn_outcome out;
  cr_assert_eq(ag_agent_run_turn(H.agent, NULL, NULL, &out, NULL), AG_EINVAL);
  cr_assert_eq(ag_agent_run_turn(NULL, "x", NULL, &out, NULL), AG_EINVAL);
  ag_agent_free(NULL);
  cr_assert_str_eq(ag_turn_status_name(AG_TURN_TIMED_OUT), "timed_out");
  cr_assert_null(ag_agent_history(NULL));
  cr_assert_not_null(ag_agent_guard(H.agent));
  teardown();
}

/* Streaming text reaches opts.on_delta (the scripted provider sends each
 * reply's text as one delta). */
typedef struct delta_sink {
  char text[256];
  int calls;
} delta_sink;

static int on_delta_cb(void *user, const char *text, size_t len) {
  delta_sink *d = user;
  size_t have = strlen(d->text);
  if (have + len < sizeof(d->text)) {
    memcpy(d->text + have, text, len);
    d->text[have + len] = '\0';
  }
  d->calls++;
  return 0;
}

Test(agent, streaming_deltas_reach_the_caller) {
  json_error_t je;
  json_t *turns = json_loads(
      "[{\"user\": \"hi\", \"model\": [{\"text\": \"hello there\"}]}]", 0, &je);
  cr_assert_not_null(turns, "%s", je.text);
  ag_provider *p = NULL;
  ag_error_t err;
  cr_assert_eq(ag_provider_scripted_new(&p, turns, &err), AG_OK, "%s", err.msg);
  json_decref(turns);
  ag_agent_opts o;
  ag_agent_opts_init(&o);
  ag_config_preset(&o.config, "default", NULL);
  o.provider = p;
  delta_sink d = {"", 0};
  o.on_delta = on_delta_cb;
  o.delta_user = &d;
  ag_agent *a = NULL;
  cr_assert_eq(ag_agent_new(&a, &o, &err), AG_OK, "%s", err.msg);
  ag_turn_outcome out;
  cr_assert_eq(ag_agent_run_turn(a, "hi", NULL, &out, &err), AG_OK);
  cr_assert_eq(out.status, AG_TURN_COMPLETED);
  cr_assert_str_eq(d.text, "hello there");
  cr_assert_eq(d.calls, 1);
  ag_turn_outcome_clear(&out);
  ag_agent_free(a);
  ag_provider_free(p);
}

/* A scripted provider error without a message of its own: the reason phrase
 * is said once, in the agent's "HTTP 503 (Service Unavailable)", and not
 * again as "The last answer: Service Unavailable". A message of its own is
 * still quoted. */
Test(agent, provider_reason_phrase_said_once) {
  static const struct {
    const char *error, *want, *unwanted;
  } cases[] = {
      {"{\"status\": 503}", "answered HTTP 503 (Service Unavailable)",
       "The last answer"},
      {"{\"status\": 503, \"message\": \"overloaded\"}",
       "(Service Unavailable); giving up. The last answer: "
       "overloaded",
       NULL},
  };
  for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
    char text[256];
    snprintf(text, sizeof(text),
             "[{\"user\": \"hi\", \"model\": [{\"provider_error\": %s}]}]",
             cases[i].error);
    json_error_t je;
    json_t *turns = json_loads(text, 0, &je);
    cr_assert_not_null(turns, "%s", je.text);
    ag_provider *p = NULL;
    ag_error_t err;
    cr_assert_eq(ag_provider_scripted_new(&p, turns, &err), AG_OK, "%s",
                 err.msg);
    json_decref(turns);
    ag_agent_opts o;
    ag_agent_opts_init(&o);
    ag_config_preset(&o.config, "default", NULL);
    o.config.network.max_retries = 0;
    o.provider = p;
    ag_agent *a = NULL;
    cr_assert_eq(ag_agent_new(&a, &o, &err), AG_OK, "%s", err.msg);
    ag_turn_outcome out;
    cr_assert_eq(ag_agent_run_turn(a, "hi", NULL, &out, &err), AG_OK);
    cr_assert_eq(out.status, AG_TURN_FAILED);
    cr_expect(strstr(out.message, cases[i].want) != NULL, "%s", out.message);
    if (cases[i].unwanted != NULL)
      cr_expect(strstr(out.message, cases[i].unwanted) == NULL, "%s",
                out.message);
    ag_turn_outcome_clear(&out);
    ag_agent_free(a);
    ag_provider_free(p);
  }
}
