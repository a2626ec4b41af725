/*
 * tests/unit/audit_formats.c - one run in every input format against its
 * neutral equivalent, bad inputs, a cut last line of JSON Lines (left out,
 * only when last and without its newline), and the summary (test_audit's
 * cases; the helpers are audit_fixture.h's).
 */
#include "audit_fixture.h"

/* ---- one run in every format -------------------------------------------- */

/*
 * Turn 1: get_weather(Paris) -> sunny, then a text answer.
 * Turn 2: book(7) fails four times ("Error: service unavailable"), then
 * lookup succeeds. Under default the third identical failure stops the run
 * (repeated_results): step 5 (turn 2, step 3), two steps after it.
 */
static const char sample_neutral[] =
    "{\"source\": \"sample\", \"outcome\": \"unresolved\", \"steps\": [\n"
    " {\"user_msg_before\": \"weather?\", \"calls\": [{\"name\": "
    "\"get_weather\", \"args\": {\"city\": \"Paris\"}}], \"results\": "
    "[{\"ok\": true, \"text\": \"sunny\"}]},\n"
    " {\"calls\": [], \"results\": []},\n"
    " {\"user_msg_before\": \"book it\", \"calls\": [{\"name\": \"book\", "
    "\"args\": {\"id\": 7}}], \"results\": [{\"ok\": false, \"text\": "
    "\"Error: service unavailable\"}]},\n"
    " {\"calls\": [{\"name\": \"book\", \"args\": {\"id\": 7}}], \"results\": "
    "[{\"ok\": false, \"text\": \"Error: service unavailable\"}]},\n"
    " {\"calls\": [{\"name\": \"book\", \"args\": {\"id\": 7}}], \"results\": "
    "[{\"ok\": false, \"text\": \"Error: service unavailable\"}]},\n"
    " {\"calls\": [{\"name\": \"book\", \"args\": {\"id\": 7}}], \"results\": "
    "[{\"ok\": false, \"text\": \"Error: service unavailable\"}]},\n"
    " {\"calls\": [{\"name\": \"lookup\", \"args\": {\"q\": \"x\"}}], "
    "\"results\": [{\"ok\": true, \"text\": \"found\"}]}\n"
    "]}\n";

#define CHAT_MESSAGES                                                          \
  "{\"role\": \"system\", \"content\": \"You book trips.\"}",                  \
      "{\"role\": \"user\", \"content\": \"weather?\"}",                       \
      "{\"role\": \"assistant\", \"content\": null, \"tool_calls\": "          \
      "[{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": "    \
      "\"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Paris\\\"}\"}}]}", \
      "{\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": "           \
      "\"sunny\"}",                                                            \
      "{\"role\": \"assistant\", \"content\": \"It is sunny.\"}",              \
      "{\"role\": \"user\", \"content\": \"book it\"}",                        \
      "{\"role\": \"assistant\", \"tool_calls\": [{\"id\": \"c2\", "           \
      "\"type\": \"function\", \"function\": {\"name\": \"book\", "            \
      "\"arguments\": \"{\\\"id\\\": 7}\"}}]}",                                \
      "{\"role\": \"tool\", \"tool_call_id\": \"c2\", \"content\": "           \
      "\"Error: service unavailable\"}",                                       \
      "{\"role\": \"assistant\", \"tool_calls\": [{\"id\": \"c3\", "           \
      "\"type\": \"function\", \"function\": {\"name\": \"book\", "            \
      "\"arguments\": \"{\\\"id\\\":7}\"}}]}",                                 \
      "{\"role\": \"tool\", \"tool_call_id\": \"c3\", \"content\": "           \
      "[{\"type\": \"text\", \"text\": \"Error: service unavailable\"}]}",     \
      "{\"role\": \"assistant\", \"tool_calls\": [{\"id\": \"c4\", "           \
      "\"type\": \"function\", \"function\": {\"name\": \"book\", "            \
      "\"arguments\": \"{\\\"id\\\": 7.0}\"}}]}",                              \
      "{\"role\": \"tool\", \"tool_call_id\": \"c4\", \"content\": \"Error: "  \
      "service unavailable\"}",                                                \
      "{\"role\": \"assistant\", \"tool_calls\": [{\"id\": \"c5\", "           \
      "\"type\": \"function\", \"function\": {\"name\": \"book\", "            \
      "\"arguments\": \"{\\\"id\\\": 7}\"}}]}",                                \
      "{\"role\": \"tool\", \"tool_call_id\": \"c5\", \"content\": \"Error: "  \
      "service unavailable\"}",                                                \
      "{\"role\": \"assistant\", \"tool_calls\": [{\"id\": \"c6\", "           \
      "\"type\": \"function\", \"function\": {\"name\": \"lookup\", "          \
      "\"arguments\": \"{\\\"q\\\": \\\"x\\\"}\"}}]}",                         \
      "{\"role\": \"tool\", \"tool_call_id\": \"c6\", \"content\": "           \
      "\"found\"}"

static const char *const chat_lines[] = {CHAT_MESSAGES};
#define N_CHAT (sizeof(chat_lines) / sizeof(chat_lines[0]))

/* The same run as agentguard's event log (what simulate --events writes). */
static const char *const event_lines[] = {
    "{\"event\":\"turn_start\",\"turn\":1,\"iteration\":0,\"t_ms\":0,"
    "\"user\":\"weather?\"}",
    "{\"event\":\"model_request\",\"turn\":1,\"iteration\":1,\"t_ms\":1}",
    "{\"event\":\"model_response\",\"turn\":1,\"iteration\":1,\"t_ms\":2,"
    "\"text\":null,\"tool_calls\":[{\"id\":\"t1\",\"name\":\"get_weather\","
    "\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}]}",
    "{\"event\":\"tool_call\",\"turn\":1,\"iteration\":1,\"t_ms\":2,"
    "\"call_id\":\"t1\",\"name\":\"get_weather\",\"arguments\":"
    "\"{\\\"city\\\":\\\"Paris\\\"}\",\"signature\":null}",
    "{\"event\":\"tool_attempt\",\"turn\":1,\"iteration\":1,\"t_ms\":3,"
    "\"call_id\":\"t1\",\"name\":\"get_weather\",\"attempt\":1,\"outcome\":"
    "\"ok\",\"message\":\"\",\"retry_in_ms\":null}",
    "{\"event\":\"tool_result\",\"turn\":1,\"iteration\":1,\"t_ms\":3,"
    "\"call_id\":\"t1\",\"name\":\"get_weather\",\"ok\":true,\"attempts\":1,"
    "\"category\":null,\"text\":\"sunny\"}",
    "{\"event\":\"model_request\",\"turn\":1,\"iteration\":2,\"t_ms\":4}",
    "{\"event\":\"model_response\",\"turn\":1,\"iteration\":2,\"t_ms\":5,"
    "\"text\":\"It is sunny.\",\"tool_calls\":[]}",
    "{\"event\":\"turn_end\",\"turn\":1,\"iteration\":2,\"t_ms\":5,\"status\":"
    "\"completed\",\"reason\":\"final_answer\",\"message\":\"\","
    "\"iterations\":2,\"tool_calls\":1,\"final_text\":\"It is sunny.\"}",
    "{\"event\":\"turn_start\",\"turn\":2,\"iteration\":0,\"t_ms\":6,"
    "\"user\":\"book it\"}",
#define BOOK(it, t)                                                            \
  "{\"event\":\"model_request\",\"turn\":2,\"iteration\":" #it ",\"t_ms\":" #t \
  "}",                                                                         \
      "{\"event\":\"model_response\",\"turn\":2,\"iteration\":" #it            \
      ",\"t_ms\":" #t ",\"text\":null,\"tool_calls\":[]}",                     \
      "{\"event\":\"tool_call\",\"turn\":2,\"iteration\":" #it ",\"t_ms\":" #t \
      ",\"call_id\":\"b" #it "\",\"name\":\"book\",\"arguments\":"             \
      "\"{\\\"id\\\":7}\",\"signature\":null}",                                \
      "{\"event\":\"tool_result\",\"turn\":2,\"iteration\":" #it               \
      ",\"t_ms\":" #t ",\"call_id\":\"b" #it "\",\"name\":\"book\","           \
      "\"ok\":false,\"attempts\":4,\"category\":\"network\",\"text\":"         \
      "\"Error: service unavailable\"}"
    BOOK(1, 7),
    BOOK(2, 8),
    BOOK(3, 9),
    BOOK(4, 10),
#undef BOOK
    "{\"event\":\"model_request\",\"turn\":2,\"iteration\":5,\"t_ms\":11}",
    "{\"event\":\"model_response\",\"turn\":2,\"iteration\":5,\"t_ms\":11,"
    "\"text\":null,\"tool_calls\":[]}",
    "{\"event\":\"tool_call\",\"turn\":2,\"iteration\":5,\"t_ms\":11,"
    "\"call_id\":\"l1\",\"name\":\"lookup\",\"arguments\":"
    "\"{\\\"q\\\":\\\"x\\\"}\",\"signature\":null}",
    "{\"event\":\"tool_result\",\"turn\":2,\"iteration\":5,\"t_ms\":12,"
    "\"call_id\":\"l1\",\"name\":\"lookup\",\"ok\":true,\"attempts\":1,"
    "\"category\":null,\"text\":\"found\"}",
    "{\"event\":\"turn_end\",\"turn\":2,\"iteration\":5,\"t_ms\":12,\"status\":"
    "\"completed\",\"reason\":\"final_answer\",\"message\":\"\","
    "\"iterations\":5,\"tool_calls\":5,\"final_text\":\"\"}",
};
#define N_EVENTS (sizeof(event_lines) / sizeof(event_lines[0]))

/* Joins lines with `sep`, wrapped in `open` / `close`. */
static char *join(const char *const *lines, size_t n, const char *open,
                  const char *sep, const char *close) {
  size_t len = strlen(open) + strlen(close) + 1;
  for (size_t i = 0; i < n; i++)
    len += strlen(lines[i]) + strlen(sep);
  char *s = malloc(len);
  cr_assert_not_null(s);
  strcpy(s, open);
  for (size_t i = 0; i < n; i++) {
    if (i > 0)
      strcat(s, sep);
    strcat(s, lines[i]);
  }
  strcat(s, close);
  return s;
}

static bool counts_as_error(const ag_traj_result *r) {
  return r->outcome == AG_OUTCOME_ERROR || strncmp(r->text, "Error:", 6) == 0;
}

/* The same run: turns, steps, calls (names and canonical arguments) and
 * results (text, error or not). */
static void assert_same_run(const ag_trajectory *a, const ag_trajectory *b,
                            const char *what) {
  cr_assert_eq(a->n_turns, b->n_turns, "%s: turns %zu vs %zu", what, a->n_turns,
               b->n_turns);
  cr_assert_eq(a->n_steps, b->n_steps, "%s: steps %zu vs %zu", what, a->n_steps,
               b->n_steps);
  for (size_t ti = 0; ti < a->n_turns; ti++) {
    cr_assert_eq(a->turns[ti].n_steps, b->turns[ti].n_steps, "%s: turn %zu",
                 what, ti + 1);
    for (size_t si = 0; si < a->turns[ti].n_steps; si++) {
      const ag_traj_step *x = &a->turns[ti].steps[si],
                         *y = &b->turns[ti].steps[si];
      cr_assert_eq(x->n_calls, y->n_calls, "%s: turn %zu step %zu", what,
                   ti + 1, si + 1);
      cr_assert_eq(x->n_results, y->n_results);
      for (size_t k = 0; k < x->n_calls; k++) {
        cr_assert_str_eq(x->calls[k].name, y->calls[k].name);
        char *cx, *cy;
        size_t lx, ly;
        cr_assert_eq(ag_canonicalize(x->calls[k].args, x->calls[k].args_len,
                                     &cx, &lx, NULL),
                     AG_OK);
        cr_assert_eq(ag_canonicalize(y->calls[k].args, y->calls[k].args_len,
                                     &cy, &ly, NULL),
                     AG_OK);
        cr_assert_str_eq(cx, cy, "%s: arguments", what);
        ag_free(cx);
        ag_free(cy);
        cr_assert_eq(x->results[k].text_len, y->results[k].text_len);
        cr_assert(memcmp(x->results[k].text, y->results[k].text,
                         x->results[k].text_len) == 0);
        cr_assert_eq(counts_as_error(&x->results[k]),
                     counts_as_error(&y->results[k]), "%s: turn %zu step %zu",
                     what, ti + 1, si + 1);
      }
    }
  }
}

static void assert_sample_finding(const ag_trajectory *t, const char *what) {
  /* the third identical failing call stops it (mechanism 16), one step
   * before the fourth failing iteration would (mechanism 7) */
  ag_audit_finding f = audit(t, "default");
  cr_assert(f.stop.stopped, "%s: not stopped", what);
  cr_assert_eq(f.stop.reason, AG_REASON_REPEATED_RESULTS, "%s: %s", what,
               ag_reason_name(f.stop.reason));
  cr_assert_eq(f.stop.step, 5, "%s: step %d", what, f.stop.step);
  cr_assert_eq(f.stop.turn, 2, "%s", what);
  cr_assert_eq(f.stop.step_in_turn, 3, "%s", what);
  cr_assert_eq(f.stop.steps_after, 2, "%s", what);
  cr_assert_eq(f.stop.action, AG_STOP);
  cr_assert_str_eq(f.stop.message,
                   "book failed 3 times in this turn with the same arguments "
                   "and the same error: Error: service unavailable");
}

Test(formats, neutral_sample) {
  ag_trajectory *t = parse_ok(sample_neutral);
  cr_assert_eq(t->format, AG_TRAJ_NEUTRAL);
  cr_assert_str_eq(t->source, "sample");
  cr_assert_eq(t->outcome, AG_RUN_UNRESOLVED);
  cr_assert_eq(t->n_turns, 2);
  cr_assert_eq(t->n_steps, 7);
  cr_assert_eq(t->n_calls, 6);
  assert_sample_finding(t, "neutral");
  ag_trajectory_free(t);
}

Test(formats, chat_array_object_and_jsonl) {
  ag_trajectory *ref = parse_ok(sample_neutral);
  char *arr = join(chat_lines, N_CHAT, "[", ",\n", "]");
  char *obj = join(chat_lines, N_CHAT,
                   "{\"outcome\": \"unresolved\", \"id\": \"sample\", "
                   "\"messages\": [",
                   ",", "]}");
  char *jsonl = join(chat_lines, N_CHAT, "", "\n", "\n");
  struct {
    const char *text;
    ag_traj_format format;
  } cases[] = {{arr, AG_TRAJ_CHAT},
               {obj, AG_TRAJ_CHAT_OBJECT},
               {jsonl, AG_TRAJ_CHAT_JSONL}};
  for (size_t i = 0; i < 3; i++) {
    ag_trajectory *t = parse_ok(cases[i].text);
    const char *name = ag_traj_format_name(cases[i].format);
    cr_assert_eq(t->format, cases[i].format, "%s: detected %s", name,
                 ag_traj_format_name(t->format));
    assert_same_run(ref, t, name);
    assert_sample_finding(t, name);
    ag_trajectory_free(t);
  }
  ag_trajectory *o = parse_ok(obj);
  cr_assert_eq(o->outcome, AG_RUN_UNRESOLVED);
  cr_assert_str_eq(o->source, "sample");
  ag_trajectory_free(o);
  free(arr);
  free(obj);
  free(jsonl);
  ag_trajectory_free(ref);
}

Test(formats, event_log) {
  ag_trajectory *ref = parse_ok(sample_neutral);
  char *log = join(event_lines, N_EVENTS, "", "\n", "\n");
  ag_trajectory *t = parse_ok(log);
  cr_assert_eq(t->format, AG_TRAJ_EVENTS);
  cr_assert(t->timed, "event logs carry t_ms");
  assert_same_run(ref, t, "events");
  assert_sample_finding(t, "events");
  cr_assert_eq(t->turns[1].t_start_ms, 6);
  cr_assert_eq(t->turns[1].steps[0].t_request_ms, 7);
  cr_assert_eq(t->turns[1].steps[0].results[0].category, AG_CAT_NETWORK);
  ag_trajectory_free(t);
  free(log);
  ag_trajectory_free(ref);
}

Test(formats, events_blocked_nudged_and_denied_calls_did_not_run) {
  static const char log[] =
      "{\"event\":\"turn_start\",\"turn\":1,\"iteration\":0,\"t_ms\":0}\n"
      "{\"event\":\"model_request\",\"turn\":1,\"iteration\":1,\"t_ms\":0}\n"
      "{\"event\":\"model_response\",\"turn\":1,\"iteration\":1,\"t_ms\":0}\n"
      "{\"event\":\"tool_call\",\"turn\":1,\"iteration\":1,\"t_ms\":0,"
      "\"call_id\":\"a\",\"name\":\"rm\",\"arguments\":\"{}\"}\n"
      "{\"event\":\"tool_call\",\"turn\":1,\"iteration\":1,\"t_ms\":0,"
      "\"call_id\":\"b\",\"name\":\"ls\",\"arguments\":\"{}\"}\n"
      "{\"event\":\"nudge\",\"turn\":1,\"iteration\":1,\"t_ms\":0,"
      "\"reason\":\"identical_calls\",\"text\":\"Potential loop\"}\n"
      "{\"event\":\"tool_call\",\"turn\":1,\"iteration\":1,\"t_ms\":0,"
      "\"call_id\":\"c\",\"name\":\"cat\",\"arguments\":\"{}\"}\n"
      "{\"event\":\"approval\",\"turn\":1,\"iteration\":1,\"t_ms\":0,"
      "\"call_id\":\"a\",\"name\":\"rm\",\"approved\":false}\n"
      "{\"event\":\"tool_result\",\"turn\":1,\"iteration\":1,\"t_ms\":1,"
      "\"call_id\":\"a\",\"name\":\"rm\",\"ok\":false,\"attempts\":0,"
      "\"category\":\"permission\",\"text\":\"Tool call rejected\"}\n"
      "{\"event\":\"tool_result\",\"turn\":1,\"iteration\":1,\"t_ms\":1,"
      "\"call_id\":\"c\",\"name\":\"cat\",\"ok\":true,\"attempts\":1,"
      "\"category\":null,\"text\":\"meow\"}\n"
      "{\"event\":\"model_request\",\"turn\":1,\"iteration\":2,\"t_ms\":2}\n"
      "{\"event\":\"model_response\",\"turn\":1,\"iteration\":2,\"t_ms\":2}\n"
      "{\"event\":\"tool_call\",\"turn\":1,\"iteration\":2,\"t_ms\":2,"
      "\"call_id\":\"d\",\"name\":\"ls\",\"arguments\":\"{}\"}\n"
      "{\"event\":\"tool_blocked\",\"turn\":1,\"iteration\":2,\"t_ms\":2,"
      "\"call_id\":\"d\",\"name\":\"ls\",\"reason\":\"identical_calls\"}\n"
      "{\"event\":\"turn_end\",\"turn\":1,\"iteration\":2,\"t_ms\":2,"
      "\"status\":\"stopped\",\"reason\":\"identical_calls\"}\n";
  ag_trajectory *t = parse_ok(log);
  cr_assert_eq(t->n_steps, 2);
  const ag_traj_step *s = &t->turns[0].steps[0];
  cr_assert_eq(s->n_calls, 3);
  cr_assert_eq(s->results[0].outcome, AG_OUTCOME_DENIED, "denied");
  cr_assert_eq(s->results[1].outcome, AG_OUTCOME_SKIPPED, "held back");
  cr_assert_eq(s->results[2].outcome, AG_OUTCOME_OK);
  cr_assert_eq(t->turns[0].steps[1].results[0].outcome, AG_OUTCOME_SKIPPED,
               "blocked");
  cr_assert_eq(s->t_done_ms, 1);
  ag_trajectory_free(t);
}

Test(formats, events_keep_a_request_without_reply) {
  static const char log[] =
      "{\"event\":\"turn_start\",\"turn\":1,\"iteration\":0,\"t_ms\":0}\n"
      "{\"event\":\"model_request\",\"turn\":1,\"iteration\":1,\"t_ms\":0}\n"
      "{\"event\":\"model_response\",\"turn\":1,\"iteration\":1,\"t_ms\":0}\n"
      "{\"event\":\"tool_call\",\"turn\":1,\"iteration\":1,\"t_ms\":0,"
      "\"call_id\":\"a\",\"name\":\"ls\",\"arguments\":\"{}\"}\n"
      "{\"event\":\"tool_result\",\"turn\":1,\"iteration\":1,\"t_ms\":1,"
      "\"call_id\":\"a\",\"name\":\"ls\",\"ok\":true,\"text\":\"x\"}\n"
      "{\"event\":\"model_request\",\"turn\":1,\"iteration\":2,\"t_ms\":2}\n"
      "{\"event\":\"provider_retry\",\"turn\":1,\"iteration\":2,\"t_ms\":3}\n"
      "{\"event\":\"turn_end\",\"turn\":1,\"iteration\":2,\"t_ms\":9,"
      "\"status\":\"failed\",\"reason\":\"model_error\"}\n"
      "{\"event\":\"turn_start\",\"turn\":2,\"iteration\":0,\"t_ms\":10}\n"
      "{\"event\":\"model_request\",\"turn\":2,\"iteration\":1,\"t_ms\":11}\n"
      "{\"event\":\"model_response\",\"turn\":2,\"iteration\":1,\"t_ms\":12,"
      "\"text\":\"done\",\"tool_calls\":[]}\n";
  ag_trajectory *t = parse_ok(log);
  cr_assert_eq(t->n_turns, 2);
  cr_assert_eq(t->turns[0].n_steps, 2, "the failed request still counted");
  cr_assert(!t->turns[0].steps[0].no_reply);
  cr_assert(t->turns[0].steps[1].no_reply);
  cr_assert_eq(t->turns[0].steps[1].n_calls, 0);
  cr_assert_eq(t->turns[1].n_steps, 1);
  cr_assert_eq(t->turns[1].steps[0].n_calls, 0);
  cr_assert(!t->turns[1].steps[0].no_reply);
  /* under require_tool_call a reply without a call is an error, a request
   * without a reply is not */
  ag_config cfg = config_json("{\"preset\": \"none\", \"loop\": "
                              "{\"require_tool_call\": true, "
                              "\"max_refused_replies\": 1}}");
  ag_audit_finding f = audit_cfg(t, &cfg, false);
  cr_assert(f.stop.stopped);
  cr_assert_eq(f.stop.step, 3, "stopped at %d", f.stop.step);
  ag_trajectory_free(t);
}

Test(formats, chat_details) {
  /* legacy function_call, parallel calls answered out of order, replies
   * without ids matched in order, is_error, arguments as an object, a BOM
   * and a single JSON Lines message. */
  static const char chat[] =
      "\xEF\xBB\xBF  [{\"role\": \"user\", \"content\": \"go\"},"
      " {\"role\": \"assistant\", \"function_call\": {\"name\": \"f\", "
      "\"arguments\": \"{}\"}},"
      " {\"role\": \"function\", \"name\": \"f\", \"content\": \"ok\"},"
      " {\"role\": \"assistant\", \"tool_calls\": ["
      "  {\"id\": \"x\", \"function\": {\"name\": \"a\", \"arguments\": "
      "{\"k\": 1}}},"
      "  {\"id\": \"y\", \"function\": {\"name\": \"b\", \"arguments\": "
      "\"{}\"}}]},"
      " {\"role\": \"tool\", \"tool_call_id\": \"y\", \"content\": \"B\", "
      "\"is_error\": true},"
      " {\"role\": \"tool\", \"tool_call_id\": \"x\", \"content\": \"A\"},"
      " {\"role\": \"assistant\", \"tool_calls\": ["
      "  {\"function\": {\"name\": \"c\", \"arguments\": \"\"}},"
      "  {\"function\": {\"name\": \"d\", \"arguments\": \"\"}}]},"
      " {\"role\": \"tool\", \"content\": \"C\"},"
      " {\"role\": \"tool\", \"content\": null}]";
  ag_trajectory *t = parse_ok(chat);
  cr_assert_eq(t->format, AG_TRAJ_CHAT);
  cr_assert_eq(t->n_turns, 1);
  cr_assert_eq(t->n_steps, 3);
  const ag_traj_step *s = t->turns[0].steps;
  cr_assert_str_eq(s[0].calls[0].name, "f");
  cr_assert_str_eq(s[0].results[0].text, "ok");
  cr_assert_str_eq(s[1].calls[0].args, "{\"k\":1.0}"); /* dumped; JCS: 1 */
  cr_assert_str_eq(s[1].results[0].text, "A");
  cr_assert_eq(s[1].results[0].outcome, AG_OUTCOME_OK);
  cr_assert_str_eq(s[1].results[1].text, "B");
  cr_assert_eq(s[1].results[1].outcome, AG_OUTCOME_ERROR);
  cr_assert_str_eq(s[2].results[0].text, "C");
  cr_assert_str_eq(s[2].results[1].text, "");
  ag_trajectory_free(t);

  t = parse_ok("{\"role\": \"assistant\", \"content\": \"hi\"}");
  cr_assert_eq(t->format, AG_TRAJ_CHAT_JSONL);
  cr_assert_eq(t->n_steps, 1);
  ag_trajectory_free(t);
}

/* Found by fuzz_trajectory: one message written over two lines is detected
 * as a one-line chat log, and forcing that format must read it the same
 * way (it used to fail line by line with "':' expected"). */
Test(formats, one_record_over_lines_forced) {
  static const char two_lines[] = "{\"role\": \"user\", \"content\": null, "
                                  "\"tool_callt\"\n: \"x\"}\n";
  ag_trajectory *t = parse_ok(two_lines);
  cr_assert_eq(t->format, AG_TRAJ_CHAT_JSONL);
  ag_traj_opts o;
  ag_traj_opts_init(&o);
  o.format = AG_TRAJ_CHAT_JSONL;
  ag_trajectory *t2 = NULL;
  ag_error_t err;
  cr_assert_eq(ag_trajectory_parse(&t2, two_lines, strlen(two_lines), &o, &err),
               AG_OK, "%s", err.msg);
  cr_assert_eq(t2->format, t->format);
  cr_assert_eq(t2->n_steps, t->n_steps);
  ag_trajectory_free(t2);
  o.format = AG_TRAJ_EVENTS;
  cr_assert_eq(ag_trajectory_parse(&t2, two_lines, strlen(two_lines), &o, &err),
               AG_EINVAL, "a chat message is not an event");
  cr_assert(strstr(err.msg, "among agentguard events") != NULL, "%s", err.msg);
  /* a broken second line of a forced log is still reported by its line */
  static const char broken[] = "{\"role\": \"user\", \"content\": \"a\"}\n"
                               "{\"role\": \"assistant\"\n";
  o.format = AG_TRAJ_CHAT_JSONL;
  cr_assert_neq(ag_trajectory_parse(&t2, broken, strlen(broken), &o, &err),
                AG_OK);
  cr_assert(strstr(err.msg, "line 2") != NULL, "%s", err.msg);
  ag_trajectory_free(t);
}

Test(formats, forced_format) {
  ag_traj_opts o;
  ag_traj_opts_init(&o);
  o.format = AG_TRAJ_EVENTS;
  ag_trajectory *t = NULL;
  ag_error_t err;
  cr_assert_eq(
      ag_trajectory_parse(&t, sample_neutral, strlen(sample_neutral), &o, &err),
      AG_EINVAL, "a trajectory object is not an event");
  cr_assert(strstr(err.msg, "nor an agentguard event") != NULL, "%s", err.msg);
  o.format = AG_TRAJ_NEUTRAL;
  cr_assert_eq(
      ag_trajectory_parse(&t, sample_neutral, strlen(sample_neutral), &o, &err),
      AG_OK, "%s", err.msg);
  ag_trajectory_free(t);
  char *arr = join(chat_lines, N_CHAT, "[", ",", "]");
  cr_assert_eq(ag_trajectory_parse(&t, arr, strlen(arr), &o, &err), AG_EINVAL);
  cr_assert(strstr(err.msg, "not a trajectory input: it reads as chat"), "%s",
            err.msg);
  o.format = AG_TRAJ_CHAT;
  cr_assert_eq(ag_trajectory_parse(&t, arr, strlen(arr), &o, &err), AG_OK);
  ag_trajectory_free(t);
  free(arr);
}

Test(formats, events_iteration_cap_without_wrap_up) {
  /* loop.final_request_without_tools false: the refused request is not in
   * the log; turn_end says max_iterations after 2 iterations. */
  static const char log[] =
      "{\"event\":\"turn_start\",\"turn\":1,\"iteration\":0,\"t_ms\":0}\n"
      "{\"event\":\"model_request\",\"turn\":1,\"iteration\":1,\"t_ms\":0}\n"
      "{\"event\":\"model_response\",\"turn\":1,\"iteration\":1,\"t_ms\":0}\n"
      "{\"event\":\"tool_call\",\"turn\":1,\"iteration\":1,\"t_ms\":0,"
      "\"call_id\":\"a\",\"name\":\"ls\",\"arguments\":\"{\\\"p\\\":1}\"}\n"
      "{\"event\":\"tool_result\",\"turn\":1,\"iteration\":1,\"t_ms\":1,"
      "\"call_id\":\"a\",\"name\":\"ls\",\"ok\":true,\"text\":\"x\"}\n"
      "{\"event\":\"model_request\",\"turn\":1,\"iteration\":2,\"t_ms\":2}\n"
      "{\"event\":\"model_response\",\"turn\":1,\"iteration\":2,\"t_ms\":2}\n"
      "{\"event\":\"tool_call\",\"turn\":1,\"iteration\":2,\"t_ms\":2,"
      "\"call_id\":\"b\",\"name\":\"ls\",\"arguments\":\"{\\\"p\\\":2}\"}\n"
      "{\"event\":\"tool_result\",\"turn\":1,\"iteration\":2,\"t_ms\":3,"
      "\"call_id\":\"b\",\"name\":\"ls\",\"ok\":true,\"text\":\"y\"}\n"
      "{\"event\":\"turn_end\",\"turn\":1,\"iteration\":2,\"t_ms\":3,"
      "\"status\":\"stopped\",\"reason\":\"max_iterations\","
      "\"message\":\"Reached the maximum of 2 iterations in one turn\","
      "\"iterations\":2}\n";
  ag_trajectory *t = parse_ok(log);
  cr_assert_eq(t->n_steps, 3);
  cr_assert(t->turns[0].steps[2].no_reply);
  ag_config cfg = config_json("{\"loop\": {\"max_iterations\": 2}}");
  ag_audit_finding f = audit_cfg(t, &cfg, false);
  cr_assert(f.stop.stopped);
  cr_assert_eq(f.stop.reason, AG_REASON_MAX_ITERATIONS);
  cr_assert_eq(f.stop.step_in_turn, 3);
  f = audit(t, "default");
  cr_assert(!f.stop.stopped);
  ag_trajectory_free(t);
  /* with the wrap-up in the log (iterations = cap + 1) nothing is added */
  char *wrapped = strdup(log);
  char *m = strstr(wrapped, "maximum of 2");
  m[11] = '1';
  t = parse_ok(wrapped);
  cr_assert_eq(t->n_steps, 2);
  ag_trajectory_free(t);
  /* without a message: the last step's calls ran, so no wrap-up */
  char *bare = strdup(log);
  m = strstr(bare, "\"message\"");
  memcpy(m, "\"massage\"", 9);
  t = parse_ok(bare);
  cr_assert_eq(t->n_steps, 3);
  ag_trajectory_free(t);
  free(wrapped);
  free(bare);
}

/* ---- bad inputs --------------------------------------------------------- */

Test(bad_inputs, truncated_json) {
  size_t n = strlen(sample_neutral) / 2;
  char *cut = strndup(sample_neutral, n);
  ag_trajectory *t = NULL;
  ag_error_t err;
  cr_assert_eq(ag_trajectory_parse(&t, cut, n, NULL, &err), AG_EJSON);
  cr_assert_null(t);
  cr_assert_gt(err.line, 0);
  cr_assert(strstr(err.msg, "invalid JSON") != NULL, "%s", err.msg);
  free(cut);
  /* JSON Lines cut in a line that ends with its newline: that line is
   * named (a cut last line without one: cut_lines below) */
  char *jsonl = join(chat_lines, N_CHAT, "", "\n", "\n");
  jsonl[strlen(jsonl) - 6] = '\n';
  jsonl[strlen(jsonl) - 5] = '\0';
  const char *msg = parse_fail(jsonl, AG_EJSON);
  char want[32];
  snprintf(want, sizeof(want), "line %zu", N_CHAT);
  cr_assert(strstr(msg, want) != NULL, "%s (wanted %s)", msg, want);
  free(jsonl);
}

/* ---- a last line cut off mid-line (issue 25) ----------------------------- */

/* `head` then the first `keep` bytes of `line`, without a newline. */
static char *cut_after(const char *head, const char *line, size_t keep) {
  size_t n = strlen(head);
  char *s = malloc(n + keep + 1);
  cr_assert_not_null(s);
  memcpy(s, head, n);
  memcpy(s + n, line, keep);
  s[n + keep] = '\0';
  return s;
}

/* A writer killed mid-line leaves the beginning of its last line: however
 * short, that line is left out, named in cut_line, and the rest is the run
 * without it, detected or forced. */
Test(cut_lines, a_cut_last_line_is_left_out) {
  char *all = join(event_lines, N_EVENTS, "", "\n", "\n");
  char *but_last = join(event_lines, N_EVENTS - 1, "", "\n", "\n");
  /* the last event of the log, and a line after the whole log whose text
   * has two- and three-byte characters (cut inside them too) */
  const struct {
    const char *head, *line;
    long line_no;
  } cases[] = {
      {but_last, event_lines[N_EVENTS - 1], (long)N_EVENTS},
      {all,
       "{\"event\":\"turn_start\",\"turn\":3,\"iteration\":0,\"t_ms\":13,"
       "\"user\":\"caf\xC3\xA9 \xE2\x98\x80?\"}",
       (long)N_EVENTS + 1},
  };
  ag_traj_opts forced;
  ag_traj_opts_init(&forced);
  forced.format = AG_TRAJ_EVENTS;
  for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
    ag_trajectory *ref = parse_ok(cases[c].head);
    cr_assert_eq(ref->cut_line, 0);
    size_t len = strlen(cases[c].line);
    for (size_t keep = 1; keep < len; keep++) {
      char *text = cut_after(cases[c].head, cases[c].line, keep);
      ag_trajectory *t = parse_ok(text);
      cr_assert_eq(t->cut_line, cases[c].line_no,
                   "case %zu, %zu of %zu bytes: cut_line %ld", c, keep, len,
                   t->cut_line);
      assert_same_run(ref, t, "the log without its cut line");
      ag_trajectory_free(t);
      ag_error_t err;
      cr_assert_eq(ag_trajectory_parse(&t, text, strlen(text), &forced, &err),
                   AG_OK, "forced, case %zu, %zu bytes: %s", c, keep, err.msg);
      cr_assert_eq(t->cut_line, cases[c].line_no);
      ag_trajectory_free(t);
      free(text);
    }
    /* the whole line without its newline is a line, not a cut */
    char *text = cut_after(cases[c].head, cases[c].line, len);
    ag_trajectory *t = parse_ok(text);
    cr_assert_eq(t->cut_line, 0, "case %zu: cut_line %ld", c, t->cut_line);
    ag_trajectory_free(t);
    free(text);
    ag_trajectory_free(ref);
  }
  /* a sample finding with the log's last line cut: the same stop */
  char *text = cut_after(but_last, event_lines[N_EVENTS - 1], 20);
  ag_trajectory *t = parse_ok(text);
  assert_sample_finding(t, "cut events");
  ag_trajectory_free(t);
  free(text);
  free(all);
  free(but_last);
}

Test(cut_lines, only_a_cut_last_line_is_left_out) {
  char *head = join(event_lines, 3, "", "\n", "\n");
  const char *last = event_lines[3];
  size_t half = strlen(last) / 2;
  char *cut = cut_after(head, last, half);
  char want[32];
  /* with its newline: the writer finished the line; what is there is bad */
  char *ended = cut_after(cut, "\n", 1);
  const char *msg = parse_fail(ended, AG_EJSON);
  cr_assert(strstr(msg, "line 4,") != NULL, "%s", msg);
  free(ended);
  /* cut in the middle: an error that names it, as ever */
  char *middle = cut_after(cut, "\n", 1);
  char *rest = join(event_lines + 4, N_EVENTS - 4, middle, "\n", "\n");
  msg = parse_fail(rest, AG_EJSON);
  cr_assert(strstr(msg, "line 4,") != NULL, "%s", msg);
  free(rest);
  free(middle);
  /* a last line that goes wrong before its end is bad, not cut */
  static const char *const bad[] = {
      "{\"event\":x,\"turn\":1",          /* a bad token first */
      "{\"event\":\"turn_end\"}}",        /* a whole value, then more */
      "{\"event\":\"a\xFF\xFF\xFF\xFF\"", /* bad UTF-8, not a cut one */
      "{\"event\":\"a\",\"event\":\"b\"", /* a duplicate key */
  };
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    char *text = cut_after(head, bad[i], strlen(bad[i]));
    msg = parse_fail(text, AG_EJSON);
    cr_assert(strstr(msg, "line 4,") != NULL, "bad %zu: %s", i, msg);
    free(text);
  }
  /* a cut first line has nothing before it: not a run */
  msg = parse_fail("{\"event\":\"turn_start\",\"turn", AG_EJSON);
  cr_assert(strstr(msg, "line 1,") != NULL, "%s", msg);
  /* a chat transcript cut in its last message, the reply to the last call:
   * the rest misses that reply, and the error says which line was left out */
  char *chat = join(chat_lines, N_CHAT, "", "\n", "");
  chat[strlen(chat) - 5] = '\0';
  msg = parse_fail(chat, AG_EINVAL);
  snprintf(want, sizeof(want), "(line %zu, the last, was cut off", N_CHAT);
  cr_assert(strstr(msg, want) != NULL, "%s (wanted %s)", msg, want);
  free(chat);
  free(cut);
  free(head);
}

Test(bad_inputs, unknown_shapes) {
  cr_assert(strstr(parse_fail("{\"foo\": 1}", AG_EINVAL), "unknown shape"));
  cr_assert(strstr(parse_fail("[1, 2]", AG_EINVAL), "unknown shape"));
  cr_assert(strstr(parse_fail("42", AG_EINVAL), "unknown shape"));
  cr_assert(strstr(parse_fail("[]", AG_EINVAL), "empty"));
  cr_assert(strstr(parse_fail("", AG_EINVAL), "empty"));
  cr_assert(strstr(parse_fail("  \n", AG_EINVAL), "empty"));
  parse_fail("{\"a\":1}\n{\"b\":2}\n", AG_EINVAL);
  parse_fail("nonsense", AG_EJSON);
  cr_assert(strstr(parse_fail("{\"steps\": {}}", AG_EINVAL), "array"));
  /* a chat line among events */
  const char *msg = parse_fail("{\"event\":\"turn_start\",\"turn\":1}\n"
                               "{\"role\":\"user\",\"content\":\"x\"}\n",
                               AG_EINVAL);
  cr_assert(strstr(msg, "line 2") != NULL, "%s", msg);
  cr_assert(
      strstr(parse_fail("[{\"role\": \"robot\"}]", AG_EINVAL), "unknown role"));
}

Test(bad_inputs, tool_reply_without_its_call) {
  const char *msg = parse_fail(
      "[{\"role\":\"user\",\"content\":\"x\"},"
      "{\"role\":\"tool\",\"tool_call_id\":\"zz\",\"content\":\"r\"}]",
      AG_EINVAL);
  cr_assert(strstr(msg, "message 2") != NULL, "%s", msg);
  cr_assert(strstr(msg, "'zz' without its call") != NULL, "%s", msg);
  msg = parse_fail(
      "[{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"a\","
      "\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},"
      "{\"role\":\"tool\",\"tool_call_id\":\"a\",\"content\":\"1\"},"
      "{\"role\":\"tool\",\"tool_call_id\":\"a\",\"content\":\"2\"}]",
      AG_EINVAL);
  cr_assert(strstr(msg, "second tool reply") != NULL, "%s", msg);
  msg = parse_fail("{\"event\":\"tool_result\",\"turn\":1,\"call_id\":\"q\","
                   "\"ok\":true}\n{\"event\":\"turn_end\"}\n",
                   AG_EINVAL);
  cr_assert(strstr(msg, "without its tool_call") != NULL, "%s", msg);
}

Test(bad_inputs, tool_calls_without_replies) {
  const char *msg =
      parse_fail("[{\"role\":\"user\",\"content\":\"x\"},"
                 "{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"a\","
                 "\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}]",
                 AG_EINVAL);
  cr_assert(strstr(msg, "message 2: tool call 'a' (f)") != NULL, "%s", msg);
  cr_assert(strstr(msg, "transcript ends") != NULL, "%s", msg);
  msg = parse_fail("[{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"a\","
                   "\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},"
                   "{\"role\":\"user\",\"content\":\"x\"}]",
                   AG_EINVAL);
  cr_assert(strstr(msg, "before the next user message") != NULL, "%s", msg);
  cr_assert(strstr(msg, "message 1:") != NULL, "%s", msg);
}

Test(bad_inputs, neutral_mismatches_and_types) {
  const char *msg = parse_fail(
      "{\"steps\":[{\"calls\":[{\"name\":\"a\",\"args\":{}}],\"results\":[]}]}",
      AG_EINVAL);
  cr_assert(strstr(msg, "step 1") && strstr(msg, "1 calls but 0 results"), "%s",
            msg);
  msg = parse_fail("{\"steps\":[{\"calls\":[{\"args\":{}}],\"results\":[{}]}]}",
                   AG_EINVAL);
  cr_assert(strstr(msg, "\"name\""), "%s", msg);
  msg = parse_fail("{\"steps\":[{\"calls\":[{\"name\":\"a\"}],"
                   "\"results\":[{\"ok\":\"yes\"}]}]}",
                   AG_EINVAL);
  cr_assert(strstr(msg, "\"ok\""), "%s", msg);
  msg = parse_fail("{\"steps\":[{\"calls\":[{\"name\":\"a\","
                   "\"rejected_by_harness\":true},{\"name\":\"b\"}],"
                   "\"results\":[{\"ok\":false}]}]}",
                   AG_EINVAL);
  cr_assert(strstr(msg, "rejected_by_harness"), "%s", msg);
  parse_fail("{\"steps\":[42]}", AG_EINVAL);
  parse_fail("{\"steps\":[{}]}", AG_EINVAL);
  parse_fail("{\"steps\":[{\"calls\":[],\"results\":[],\"t_ms\":\"x\"}]}",
             AG_EINVAL);
}

Test(bad_inputs, caps) {
  ag_traj_opts o;
  ag_traj_opts_init(&o);
  ag_trajectory *t = NULL;
  ag_error_t err;
  o.max_bytes = 100;
  cr_assert_eq(
      ag_trajectory_parse(&t, sample_neutral, strlen(sample_neutral), &o, &err),
      AG_ETOOBIG);
  ag_traj_opts_init(&o);
  o.max_steps = 3;
  cr_assert_eq(
      ag_trajectory_parse(&t, sample_neutral, strlen(sample_neutral), &o, &err),
      AG_ETOOBIG);
  cr_assert(strstr(err.msg, "more than 3 steps"), "%s", err.msg);
  ag_traj_opts_init(&o);
  o.max_calls = 1;
  static const char two[] =
      "{\"steps\":[{\"calls\":[{\"name\":\"a\"},{\"name\":\"b\"}],"
      "\"results\":[{\"ok\":true},{\"ok\":true}]}]}";
  cr_assert_eq(ag_trajectory_parse(&t, two, strlen(two), &o, &err), AG_ETOOBIG);
  cr_assert_null(t);
  cr_assert_eq(ag_trajectory_parse(NULL, two, strlen(two), NULL, &err),
               AG_EINVAL);
  ag_trajectory_free(NULL);
}

/* Issue 10, finding 8: a tool_call after turn_end built a step outside any
 * turn's events, and time could run backwards. */
Test(bad_inputs, events_out_of_order) {
  const char *msg = parse_fail(
      "{\"event\":\"turn_start\",\"turn\":1,\"iteration\":0,\"t_ms\":0}\n"
      "{\"event\":\"model_request\",\"turn\":1,\"iteration\":1,\"t_ms\":1}\n"
      "{\"event\":\"turn_end\",\"turn\":1,\"iteration\":1,\"t_ms\":2,"
      "\"status\":\"completed\",\"reason\":\"final_answer\"}\n"
      "{\"event\":\"tool_call\",\"turn\":1,\"iteration\":1,\"t_ms\":3,"
      "\"call_id\":\"c\",\"name\":\"f\",\"arguments\":\"{}\"}\n",
      AG_EINVAL);
  cr_assert(strstr(msg, "line 4 (event 4): tool_call after turn_end") != NULL,
            "%s", msg);
  msg = parse_fail(
      "{\"event\":\"turn_start\",\"turn\":1,\"iteration\":0,\"t_ms\":0}\n"
      "{\"event\":\"model_request\",\"turn\":1,\"iteration\":1,\"t_ms\":50}\n"
      "{\"event\":\"model_response\",\"turn\":1,\"iteration\":1,\"t_ms\":20,"
      "\"text\":\"x\"}\n",
      AG_EINVAL);
  cr_assert(strstr(msg, "line 3 (event 3): \"t_ms\" goes back in time (20 "
                        "after 50)") != NULL,
            "%s", msg);
  /* a new turn after turn_end is fine, and so are equal times */
  ag_trajectory *t = parse_ok(
      "{\"event\":\"turn_start\",\"turn\":1,\"iteration\":0,\"t_ms\":0}\n"
      "{\"event\":\"model_request\",\"turn\":1,\"iteration\":1,\"t_ms\":0}\n"
      "{\"event\":\"model_response\",\"turn\":1,\"iteration\":1,\"t_ms\":1,"
      "\"text\":\"x\"}\n"
      "{\"event\":\"turn_end\",\"turn\":1,\"iteration\":1,\"t_ms\":1}\n"
      "{\"event\":\"turn_start\",\"turn\":2,\"iteration\":0,\"t_ms\":2}\n"
      "{\"event\":\"model_request\",\"turn\":2,\"iteration\":1,\"t_ms\":2}\n"
      "{\"event\":\"model_response\",\"turn\":2,\"iteration\":1,\"t_ms\":3,"
      "\"text\":\"y\"}\n"
      "{\"event\":\"turn_end\",\"turn\":2,\"iteration\":1,\"t_ms\":3}\n");
  cr_assert_eq(t->n_turns, 2);
  ag_trajectory_free(t);
}

/* Issue 10, finding 8: the last of two "ok" keys won, flipping a result. */
Test(bad_inputs, duplicate_keys_are_rejected) {
  const char *msg =
      parse_fail("{\"steps\":[{\"calls\":[{\"name\":\"a\",\"args\":{}}],\n"
                 "\"results\":[{\"ok\":true,\"ok\":false,\"text\":\"x\"}]}]}",
                 AG_EJSON);
  cr_assert(strstr(msg, "line 2, column 26: duplicate object key near "
                        "'\"ok\"'") != NULL,
            "%s", msg);
  /* in JSON Lines, the line is the file's */
  msg = parse_fail("{\"role\":\"user\",\"content\":\"x\"}\n"
                   "{\"role\":\"assistant\",\"content\":\"a\","
                   "\"content\":\"b\"}\n",
                   AG_EJSON);
  cr_assert(strstr(msg, "line 2, column") != NULL, "%s", msg);
  cr_assert(strstr(msg, "duplicate object key near '\"content\"'") != NULL,
            "%s", msg);
}

/* Issue 10, finding 9: a number beyond a double's range is a clear error at
 * its place (jansson cannot read it; docs/audit.md says so). */
Test(bad_inputs, number_out_of_range) {
  const char *msg = parse_fail(
      "{\"steps\":[{\"calls\":[{\"name\":\"a\",\"args\":{\"n\":1e999}}],"
      "\"results\":[{\"ok\":true}]}]}",
      AG_EJSON);
  cr_assert(strstr(msg, "line 1, column 49: number out of range (beyond "
                        "+-1.8e308) near '1e999'") != NULL,
            "%s", msg);
  /* within range, however written, it is accepted */
  ag_trajectory *t =
      parse_ok("{\"steps\":[{\"calls\":[{\"name\":\"a\",\"args\":{\"n\":1e308,"
               "\"m\":-1.5E-320,\"k\":123456789012345678901234567890}}],"
               "\"results\":[{\"ok\":true}]}]}");
  ag_trajectory_free(t);
}

Test(bad_inputs, hand_built_runs_are_checked) {
  ag_traj_call call = {"a", "{}", 2};
  ag_traj_step step;
  memset(&step, 0, sizeof(step));
  step.calls = &call;
  step.n_calls = 1; /* and no result */
  step.t_request_ms = -1;
  ag_traj_turn turn = {&step, 1, -1};
  ag_trajectory t;
  memset(&t, 0, sizeof(t));
  t.turns = &turn;
  t.n_turns = 1;
  t.n_steps = 1;
  ag_config cfg = preset("default");
  ag_auditor *a = NULL;
  cr_assert_eq(ag_auditor_new(&a, &cfg, NULL, NULL), AG_OK);
  ag_audit_finding f;
  ag_error_t err;
  cr_assert_eq(ag_auditor_run(a, &t, &f, &err), AG_EINVAL);
  cr_assert(strstr(err.msg, "1 calls but 0 results"), "%s", err.msg);
  ag_traj_result res = {AG_OUTCOME_OK, AG_CAT__COUNT, "fine", 4};
  step.results = &res;
  step.n_results = 1;
  cr_assert_eq(ag_auditor_run(a, &t, &f, &err), AG_OK, "%s", err.msg);
  cr_assert(!f.stop.stopped);
  cr_assert_eq(f.steps, 1);
  t.n_steps = 2;
  cr_assert_eq(ag_auditor_run(a, &t, &f, &err), AG_EINVAL);
  ag_auditor_free(a);
}

/* ---- summary and JSON --------------------------------------------------- */

Test(summary, counts_and_json) {
  ag_audit_summary s;
  ag_audit_summary_init(&s);
  ag_trajectory *a = parse_ok(sample_neutral); /* unresolved, stops at 5/7 */
  ag_audit_finding fa = audit(a, "default");
  ag_audit_summary_add(&s, a, &fa);
  char *run = repeat_run(3, "x", "{}", "y", true);
  ag_trajectory *b = parse_ok(run); /* unknown, no stop */
  ag_audit_finding fb = audit(b, "default");
  ag_audit_summary_add(&s, b, &fb);
  ag_audit_summary_add_skipped(&s);
  cr_assert_eq(s.runs, 2);
  cr_assert_eq(s.skipped, 1);
  cr_assert_eq(s.runs_by_outcome[AG_RUN_UNRESOLVED], 1);
  cr_assert_eq(s.stopped_by_outcome[AG_RUN_UNRESOLVED], 1);
  cr_assert_eq(s.steps_by_outcome[AG_RUN_UNRESOLVED], 7);
  cr_assert_eq(s.saved_by_outcome[AG_RUN_UNRESOLVED], 2);
  cr_assert_float_eq(ag_audit_summary_saved_share(&s, AG_RUN_UNRESOLVED),
                     2.0 / 7.0, 1e-12);
  cr_assert_eq(s.stops_by_reason[AG_REASON_REPEATED_RESULTS], 1);
  cr_assert_eq(s.runs_by_outcome[AG_RUN_UNKNOWN], 1);
  cr_assert_eq(ag_audit_summary_saved_share(&s, AG_RUN_RESOLVED), 0.0);

  char *js = NULL;
  cr_assert_eq(ag_audit_summary_json("default", &s, &js, NULL), AG_OK);
  json_error_t je;
  json_t *j = json_loads(js, 0, &je);
  cr_assert_not_null(j, "%s: %s", js, je.text);
  cr_assert_str_eq(json_string_value(json_object_get(j, "type")), "summary");
  cr_assert_eq(json_integer_value(json_object_get(j, "runs")), 2);
  cr_assert_eq(json_integer_value(json_object_get(j, "skipped")), 1);
  json_t *u = json_object_get(json_object_get(j, "by_outcome"), "unresolved");
  cr_assert_eq(json_integer_value(json_object_get(u, "saved_steps")), 2);
  cr_assert_eq(json_integer_value(json_object_get(
                   json_object_get(j, "stops_by_reason"), "repeated_results")),
               1);
  json_decref(j);
  ag_free(js);

  cr_assert_eq(ag_audit_finding_json("a.json", "default", a, &fa, &js, NULL),
               AG_OK);
  j = json_loads(js, 0, &je);
  cr_assert_not_null(j, "%s", js);
  cr_assert(strchr(js, '\n') == NULL, "one line");
  cr_assert_str_eq(json_string_value(json_object_get(j, "type")), "run");
  cr_assert_str_eq(json_string_value(json_object_get(j, "format")),
                   "trajectory");
  cr_assert(json_is_true(json_object_get(j, "stopped")));
  json_t *st = json_object_get(j, "stop");
  cr_assert_eq(json_integer_value(json_object_get(st, "step")), 5);
  cr_assert_str_eq(json_string_value(json_object_get(st, "reason")),
                   "repeated_results");
  cr_assert_eq(json_integer_value(json_object_get(st, "steps_after")), 2);
  cr_assert_null(json_object_get(j, "all_stops"));
  json_decref(j);
  ag_free(js);

  cr_assert_eq(ag_audit_finding_json(NULL, NULL, b, &fb, &js, NULL), AG_OK);
  j = json_loads(js, 0, &je);
  cr_assert(json_is_null(json_object_get(j, "stop")));
  cr_assert_null(json_object_get(j, "file"));
  json_decref(j);
  ag_free(js);

  ag_trajectory_free(a);
  ag_trajectory_free(b);
  free(run);
}
