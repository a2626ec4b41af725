/*
 * tests/runtime/test_agent.c - the agentic loop (ag_agent_run_turn) end to
 * end with a fake provider written here (a script of replies per turn,
 * provider errors with status and Retry-After, replies that hang until
 * cancelled; every request it receives is recorded) and native tools:
 * final answers, each guard stop as the loop reports it (blocked calls,
 * warnings, nudges, call_and_result polling), Forge's required tool call,
 * loop-breaking tools and the ephemeral error context, escalation to a
 * human, the wrap-up request at the iteration cap, network retries, the
 * turn deadline and caller cancellation, feedback forms, approvals, the
 * event stream and the history cap.
 *
 * Timings use tens of milliseconds with generous margins: the suite runs on
 * shared cores and under sanitizers.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agentguard.h"

/* ------------------------------------------------------------------------ */
/* The fake provider                                                        */
/* ------------------------------------------------------------------------ */

/*
 * turns: [{"model": [REPLY...], "repeat_last": bool}]. REPLY: {"text": S}
 * and/or {"tool_calls": [{"name", "arguments": OBJECT or raw STRING,
 * "id"}]}, or {"error": {"status": N, "retry_after_ms": M, "message": S}},
 * or {"hang": true}; optional "delay_ms". Requests are recorded as
 * {"turn", "iteration", "tools": bool, "messages": [...]}.
 */
typedef struct fake {
  json_t *turns;
  json_t *requests;
  int cur_turn;
  size_t next;
} fake;

static ag_err_t fake_complete(void *self, const ag_request *req,
                              ag_cancel *cancel, ag_delta_fn on_delta,
                              void *delta_user, ag_reply *out,
                              ag_provider_error *perr) {
  (void)on_delta;
  (void)delta_user;
  fake *f = self;
  /* the text the request carries is the tree's compact dump */
  char *dump =
      req->messages != NULL ? json_dumps(req->messages, JSON_COMPACT) : NULL;
  bool text_matches = dump != NULL && req->messages_json != NULL &&
                      strlen(dump) == req->messages_json_len &&
                      memcmp(dump, req->messages_json, strlen(dump)) == 0;
  free(dump);
  json_t *rec =
      json_pack("{s:i, s:i, s:b, s:O, s:b}", "turn", req->turn, "iteration",
                req->iteration, "tools", req->tools != NULL, "messages",
                req->messages, "text_matches", text_matches);
  /* a deep copy: the history changes after the request */
  json_t *copy = json_deep_copy(rec);
  json_decref(rec);
  json_array_append_new(f->requests, copy);

  if (req->turn != f->cur_turn) {
    f->cur_turn = req->turn;
    f->next = 0;
  }
  json_t *turn = json_array_get(f->turns, (size_t)req->turn - 1);
  json_t *model = json_object_get(turn, "model");
  size_t n = json_array_size(model);
  size_t k = f->next++;
  if (k >= n) {
    if (!json_is_true(json_object_get(turn, "repeat_last")) || n == 0) {
      perr->exhausted = true;
      snprintf(perr->message, sizeof(perr->message), "no reply %zu", k + 1);
      return AG_EPROVIDER;
    }
    k = n - 1;
  }
  json_t *r = json_array_get(model, k);
  json_int_t delay = json_integer_value(json_object_get(r, "delay_ms"));
  if (json_is_true(json_object_get(r, "hang")))
    delay = -1;
  if (delay != 0 && ag_cancel_wait(cancel, delay) != AG_CANCEL_NONE)
    return AG_ECANCELLED;

  json_t *e = json_object_get(r, "error");
  if (e != NULL) {
    int status = (int)json_integer_value(json_object_get(e, "status"));
    perr->http_status = status;
    perr->transient =
        status == 0 || status == 408 || status == 429 || status >= 500;
    json_t *ra = json_object_get(e, "retry_after_ms");
    perr->retry_after_ms = ra != NULL ? json_integer_value(ra) : -1;
    snprintf(perr->service, sizeof(perr->service), "fake");
    const char *m = json_string_value(json_object_get(e, "message"));
    snprintf(perr->message, sizeof(perr->message), "%s", m ? m : "");
    snprintf(perr->details, sizeof(perr->details), "{\"raw\":\"body\"}");
    return AG_EPROVIDER;
  }
  const char *text = json_string_value(json_object_get(r, "text"));
  if (text != NULL)
    out->text = strdup(text);
  size_t i;
  json_t *c;
  json_array_foreach(json_object_get(r, "tool_calls"), i, c) {
    json_t *args = json_object_get(c, "arguments");
    char *a =
        json_is_string(args)
            ? strdup(json_string_value(args))
            : json_dumps(args != NULL ? args : json_object(), JSON_COMPACT);
    ag_reply_add_call(out, json_string_value(json_object_get(c, "id")),
                      json_string_value(json_object_get(c, "name")), a,
                      strlen(a));
    free(a);
  }
  return AG_OK;
}

static void fake_destroy(void *self) {
  fake *f = self;
  json_decref(f->turns);
  json_decref(f->requests);
  free(f);
}

static const ag_provider_vtable fake_vt = {sizeof(ag_provider_vtable), "fake",
                                           fake_complete, fake_destroy, 0};

/* ------------------------------------------------------------------------ */
/* Tools                                                                    */
/* ------------------------------------------------------------------------ */

static pthread_mutex_t tool_mu = PTHREAD_MUTEX_INITIALIZER;
static int poll_count;
static int tool_runs;

static void count_run(void) {
  pthread_mutex_lock(&tool_mu);
  tool_runs++;
  pthread_mutex_unlock(&tool_mu);
}

static ag_tool_status echo_tool(void *user, const json_t *args,
                                ag_cancel *cancel, ag_output *out) {
  (void)user;
  (void)cancel;
  count_run();
  char *s = json_dumps(args, JSON_COMPACT | JSON_SORT_KEYS);
  ag_output_printf(out, "echo %s", s);
  free(s);
  return AG_TOOL_OK;
}

static ag_tool_status fail_tool(void *user, const json_t *args,
                                ag_cancel *cancel, ag_output *out) {
  (void)user;
  (void)cancel;
  count_run();
  const char *p = json_string_value(json_object_get(args, "path"));
  ag_output_printf(out, "Error: cannot open %s: no such file or directory",
                   p != NULL ? p : "?");
  ag_output_set_transient(out, false);
  return AG_TOOL_ERROR;
}

static ag_tool_status hang_tool(void *user, const json_t *args,
                                ag_cancel *cancel, ag_output *out) {
  (void)user;
  (void)args;
  (void)out;
  count_run();
  ag_cancel_reason r = ag_cancel_wait(cancel, 10000);
  return r == AG_CANCEL_TIMEOUT ? AG_TOOL_TIMEOUT : AG_TOOL_CANCELLED;
}

/* A job whose status changes each time it is polled. */
static ag_tool_status poll_tool(void *user, const json_t *args,
                                ag_cancel *cancel, ag_output *out) {
  (void)user;
  (void)args;
  (void)cancel;
  pthread_mutex_lock(&tool_mu);
  int n = ++poll_count;
  tool_runs++;
  pthread_mutex_unlock(&tool_mu);
  ag_output_printf(out, "job running: step %d", n);
  return AG_TOOL_OK;
}

/* A job that never changes. */
static ag_tool_status same_tool(void *user, const json_t *args,
                                ag_cancel *cancel, ag_output *out) {
  (void)user;
  (void)args;
  (void)cancel;
  count_run();
  ag_output_printf(out, "job running");
  return AG_TOOL_OK;
}

static ag_tool_status complete_tool(void *user, const json_t *args,
                                    ag_cancel *cancel, ag_output *out) {
  (void)user;
  (void)cancel;
  count_run();
  const char *s = json_string_value(json_object_get(args, "summary"));
  ag_output_printf(out, "Task complete: %s", s != NULL ? s : "");
  return AG_TOOL_OK;
}

static ag_tool_status danger_tool(void *user, const json_t *args,
                                  ag_cancel *cancel, ag_output *out) {
  (void)user;
  (void)args;
  (void)cancel;
  count_run();
  ag_output_printf(out, "deleted everything");
  return AG_TOOL_OK;
}

/* Output that is not UTF-8. */
static ag_tool_status bytes_tool(void *user, const json_t *args,
                                 ag_cancel *cancel, ag_output *out) {
  (void)user;
  (void)args;
  (void)cancel;
  count_run();
  ag_output_write(out, "ok \xff\xfe\xc3 end", 10);
  return AG_TOOL_OK;
}

/* An error whose text holds a NUL byte. */
static ag_tool_status nul_error_tool(void *user, const json_t *args,
                                     ag_cancel *cancel, ag_output *out) {
  (void)user;
  (void)args;
  (void)cancel;
  count_run();
  ag_output_write(out, "before\0after", 12);
  return AG_TOOL_ERROR;
}

static void add_tool(ag_registry *reg, const char *name, ag_tool_fn fn,
                     bool approval) {
  ag_tool_def d;
  ag_tool_def_init(&d);
  d.name = name;
  d.description = name;
  d.fn = fn;
  d.requires_approval = approval;
  ag_error_t err;
  cr_assert_eq(ag_registry_add(reg, &d, &err), AG_OK, "%s", err.msg);
}

/* ------------------------------------------------------------------------ */
/* The harness                                                              */
/* ------------------------------------------------------------------------ */

typedef struct harness {
  ag_agent *agent;
  ag_provider *provider;
  ag_registry *reg;
  fake *fake;
  json_t *events; /* every event, in order */
  pthread_mutex_t mu;
  int concurrent, max_concurrent; /* on_event calls at once */
  /* approvals */
  bool deny;
  int approvals_asked;
  /* human */
  int human_calls;
  ag_human_action human_action;
  const char *human_hint;
  char last_record[4096];
  json_t *hists; /* the trees history() returned, freed at teardown */
} harness;

static harness H;

static void on_event(void *user, const json_t *ev) {
  harness *h = user;
  pthread_mutex_lock(&h->mu);
  h->concurrent++;
  if (h->concurrent > h->max_concurrent)
    h->max_concurrent = h->concurrent;
  pthread_mutex_unlock(&h->mu);
  json_t *copy = json_deep_copy(ev);
  pthread_mutex_lock(&h->mu);
  json_array_append_new(h->events, copy);
  h->concurrent--;
  pthread_mutex_unlock(&h->mu);
}

static ag_approval approve(void *user, const char *tool, const char *args,
                           size_t args_len, char *reason, size_t cap) {
  (void)tool;
  (void)args;
  (void)args_len;
  harness *h = user;
  h->approvals_asked++;
  if (h->deny) {
    snprintf(reason, cap, "the user said no");
    return AG_APPROVE_DENY;
  }
  return AG_APPROVE_ONCE;
}

static ag_human_action human(void *user, const char *record, char *hint,
                             size_t cap) {
  harness *h = user;
  h->human_calls++;
  snprintf(h->last_record, sizeof(h->last_record), "%s", record);
  if (h->human_hint != NULL)
    snprintf(hint, cap, "%s", h->human_hint);
  return h->human_action;
}

/* The test config: `preset` with fast retries and no tool retries. */
static ag_config preset(const char *name) {
  ag_config cfg;
  ag_error_t err;
  cr_assert_eq(ag_config_preset(&cfg, name, &err), AG_OK, "%s", err.msg);
  cfg.retry.max_retries = 0;
  cfg.network.delay_ms = 1;
  cfg.network.max_delay_ms = 5;
  return cfg;
}

typedef struct setup_opts {
  bool with_human;
  size_t max_history_bytes;
  bool no_tools;
} setup_opts;

static void setup_with(const ag_config *cfg, const char *turns, setup_opts so) {
  memset(&H, 0, sizeof(H));
  pthread_mutex_init(&H.mu, NULL);
  H.events = json_array();
  H.hists = json_array();
  ag_error_t err;

  json_error_t jerr;
  H.fake = calloc(1, sizeof(*H.fake));
  H.fake->turns = json_loads(turns, 0, &jerr);
  cr_assert_not_null(H.fake->turns, "script: %s", jerr.text);
  H.fake->requests = json_array();
  cr_assert_eq(ag_provider_new(&H.provider, &fake_vt, H.fake, &err), AG_OK);

  if (!so.no_tools) {
    cr_assert_eq(ag_registry_new(&H.reg, &err), AG_OK);
    add_tool(H.reg, "bytes", bytes_tool, false);
    add_tool(H.reg, "danger", danger_tool, true);
    add_tool(H.reg, "echo", echo_tool, false);
    add_tool(H.reg, "fail", fail_tool, false);
    add_tool(H.reg, "hang", hang_tool, false);
    add_tool(H.reg, "nul_error", nul_error_tool, false);
    add_tool(H.reg, "poll", poll_tool, false);
    add_tool(H.reg, "same", same_tool, false);
    add_tool(H.reg, "task_complete", complete_tool, false);
  }

  ag_agent_opts o;
  ag_agent_opts_init(&o);
  o.config = *cfg;
  o.provider = H.provider;
  o.tools = H.reg;
  o.system_prompt = "You are a test.";
  o.approve = approve;
  o.approve_user = &H;
  if (so.with_human) {
    o.human = human;
    o.human_user = &H;
  }
  o.on_event = on_event;
  o.event_user = &H;
  o.seed = 42;
  if (so.max_history_bytes > 0)
    o.max_history_bytes = so.max_history_bytes;
  cr_assert_eq(ag_agent_new(&H.agent, &o, &err), AG_OK, "%s", err.msg);
}

static void setup(const ag_config *cfg, const char *turns) {
  setup_opts so = {0};
  setup_with(cfg, turns, so);
}

static void teardown(void) {
  ag_agent_free(H.agent);
  ag_provider_free(H.provider);
  ag_registry_free(H.reg);
  json_decref(H.events);
  json_decref(H.hists);
  pthread_mutex_destroy(&H.mu);
}

static ag_turn_outcome run(const char *user) {
  ag_turn_outcome out;
  ag_error_t err;
  cr_assert_eq(ag_agent_run_turn(H.agent, user, NULL, &out, &err), AG_OK, "%s",
               err.msg);
  return out;
}

#define ASSERT_OUTCOME(o, st, why)                                             \
  do {                                                                         \
    cr_assert_eq((o).status, (st), "status %s (%s: %s), want %s",              \
                 ag_turn_status_name((o).status), (o).reason, (o).message,     \
                 ag_turn_status_name(st));                                     \
    cr_assert_str_eq((o).reason, (why), "reason %s (%s), want %s", (o).reason, \
                     (o).message, (why));                                      \
  } while (0)

/* Events named `name`, in order (borrowed from H.events, new array). */
static json_t *events_named(const char *name) {
  json_t *r = json_array();
  size_t i;
  json_t *e;
  json_array_foreach(H.events, i, e) {
    if (strcmp(json_string_value(json_object_get(e, "event")), name) == 0)
      json_array_append(r, e);
  }
  return r;
}

static size_t count_events(const char *name) {
  json_t *a = events_named(name);
  size_t n = json_array_size(a);
  json_decref(a);
  return n;
}

static const char *str(const json_t *o, const char *key) {
  const char *s = json_string_value(json_object_get(o, key));
  return s != NULL ? s : "(null)";
}

/* The history as a tree (new each call, kept until teardown). Checks on
 * the way that the stored text is exactly the tree's compact dump. */
static const json_t *history(void) {
  size_t len = 0;
  const char *text = ag_agent_history_json(H.agent, &len);
  cr_assert_not_null(text);
  cr_assert_eq(strlen(text), len);
  json_t *h = ag_agent_history(H.agent);
  cr_assert_not_null(h);
  char *dump = json_dumps(h, JSON_COMPACT);
  cr_assert_str_eq(dump, text);
  free(dump);
  json_array_append_new(H.hists, h);
  return h;
}

/* Every assistant tool call has exactly one tool message, right after its
 * assistant message, in order. */
static void assert_history_well_formed(void) {
  const json_t *h = history();
  size_t n = json_array_size(h);
  for (size_t i = 0; i < n; i++) {
    json_t *m = json_array_get(h, i);
    json_t *calls = json_object_get(m, "tool_calls");
    if (calls == NULL)
      continue;
    size_t k;
    json_t *c;
    json_array_foreach(calls, k, c) {
      json_t *t = json_array_get(h, i + 1 + k);
      cr_assert_not_null(t, "tool call %zu of message %zu has no answer", k, i);
      cr_assert_str_eq(str(t, "role"), "tool", "message %zu", i + 1 + k);
      cr_assert_str_eq(str(t, "tool_call_id"), str(c, "id"));
      cr_assert(json_is_string(json_object_get(t, "content")));
    }
  }
}

static size_t count_role(const char *role) {
  size_t n = 0, i;
  json_t *m;
  json_array_foreach(history(), i, m) {
    if (strcmp(str(m, "role"), role) == 0)
      n++;
  }
  return n;
}

/* The content of the last message with `role`. */
static const char *last_content(const char *role) {
  const json_t *h = history();
  for (size_t i = json_array_size(h); i-- > 0;) {
    json_t *m = json_array_get(h, i);
    if (strcmp(str(m, "role"), role) == 0)
      return str(m, "content");
  }
  return "(none)";
}

static json_t *request(size_t i) {
  return json_array_get(H.fake->requests, i);
}

/* ------------------------------------------------------------------------ */
/* Final answers and the history shape                                      */
/* ------------------------------------------------------------------------ */

Test(agent, final_answer) {
  ag_config cfg = preset("default");
  setup(&cfg, "[{\"model\": [{\"text\": \"Hello there\"}]}]");
  ag_turn_outcome o = run("hi");
  ASSERT_OUTCOME(o, AG_TURN_COMPLETED, "final_answer");
  cr_assert_str_eq(o.final_text, "Hello there");
  cr_assert_eq(o.iterations, 1);
  cr_assert_eq(o.tool_calls, 0);

  const json_t *h = history();
  cr_assert_eq(json_array_size(h), 3);
  cr_assert_str_eq(str(json_array_get(h, 0), "role"), "system");
  cr_assert_str_eq(str(json_array_get(h, 0), "content"), "You are a test.");
  cr_assert_str_eq(str(json_array_get(h, 1), "role"), "user");
  cr_assert_str_eq(str(json_array_get(h, 1), "content"), "hi");
  cr_assert_str_eq(str(json_array_get(h, 2), "role"), "assistant");
  cr_assert_str_eq(str(json_array_get(h, 2), "content"), "Hello there");
  cr_assert_null(json_object_get(json_array_get(h, 2), "tool_calls"));

  /* the request offered the tools */
  cr_assert(json_is_true(json_object_get(request(0), "tools")));
  cr_assert_eq(json_array_size(json_object_get(request(0), "messages")), 2);

  const char *want[] = {"turn_start", "model_request", "model_response",
                        "turn_end"};
  cr_assert_eq(json_array_size(H.events), 4);
  for (size_t i = 0; i < 4; i++)
    cr_assert_str_eq(str(json_array_get(H.events, i), "event"), want[i]);
  json_t *end = json_array_get(H.events, 3);
  cr_assert_str_eq(str(end, "status"), "completed");
  cr_assert_str_eq(str(end, "final_text"), "Hello there");
  cr_assert_eq(json_integer_value(json_object_get(end, "iterations")), 1);
  ag_turn_outcome_clear(&o);
  cr_assert_null(o.final_text);
  teardown();
}

Test(agent, tool_call_then_answer_history_shape) {
  ag_config cfg = preset("default");
  setup(&cfg, "[{\"model\": [{\"text\": \"Let me look.\", \"tool_calls\": ["
              "{\"id\": \"c1\", \"name\": \"echo\", \"arguments\": "
              "\"{\\\"b\\\": 2, \\\"a\\\": 1}\"}, {\"name\": \"echo\", "
              "\"arguments\": {\"x\": true}}]}, {\"text\": \"Done.\"}]}]");
  ag_turn_outcome o = run("go");
  ASSERT_OUTCOME(o, AG_TURN_COMPLETED, "final_answer");
  cr_assert_eq(o.iterations, 2);
  cr_assert_eq(o.tool_calls, 2);
  const json_t *h = history();
  cr_assert_eq(json_array_size(h), 6);
  json_t *as = json_array_get(h, 2);
  cr_assert_str_eq(str(as, "content"), "Let me look.");
  json_t *c0 = json_array_get(json_object_get(as, "tool_calls"), 0);
  cr_assert_str_eq(str(c0, "id"), "c1");
  cr_assert_str_eq(str(c0, "type"), "function");
  /* the raw argument text, as the model sent it */
  cr_assert_str_eq(str(json_object_get(c0, "function"), "arguments"),
                   "{\"b\": 2, \"a\": 1}");
  cr_assert_str_eq(str(json_object_get(c0, "function"), "name"), "echo");
  cr_assert_str_eq(str(json_array_get(h, 3), "content"),
                   "echo {\"a\":1,\"b\":2}");
  cr_assert_str_eq(str(json_array_get(h, 4), "content"), "echo {\"x\":true}");
  assert_history_well_formed();
  /* the second request saw the tool messages */
  cr_assert_eq(json_array_size(json_object_get(request(1), "messages")), 5);
  ag_turn_outcome_clear(&o);
  teardown();
}

/* ------------------------------------------------------------------------ */
/* Guard stops                                                              */
/* ------------------------------------------------------------------------ */

#define STUCK_ECHO                                                             \
  "{\"tool_calls\": [{\"name\": \"echo\", \"arguments\": {\"q\": 1}}]}"

Test(agent, stuck_identical_calls_stop_and_next_turn_works) {
  ag_config cfg = preset("default");
  setup(&cfg, "[{\"model\": [" STUCK_ECHO "], \"repeat_last\": true},"
              " {\"model\": [{\"text\": \"fresh\"}]}]");
  ag_turn_outcome o = run("loop please");
  ASSERT_OUTCOME(o, AG_TURN_STOPPED, "identical_calls");
  cr_assert_eq(o.iterations, 5);
  cr_assert_eq(o.tool_calls, 4, "the 5th call is not executed");
  cr_assert_eq(tool_runs, 4);
  cr_assert(strstr(o.message, "echo was called 5 times") != NULL, "%s",
            o.message);

  json_t *blocked = events_named("tool_blocked");
  cr_assert_eq(json_array_size(blocked), 1);
  cr_assert_str_eq(str(json_array_get(blocked, 0), "reason"),
                   "identical_calls");
  cr_assert_str_eq(str(json_array_get(blocked, 0), "name"), "echo");
  json_decref(blocked);
  cr_assert_eq(count_events("tool_call"), 5);
  cr_assert_eq(count_events("tool_result"), 4);

  assert_history_well_formed();
  cr_assert_eq(count_role("tool"), 5);
  const char *last = last_content("tool");
  cr_assert(strncmp(last, "Not run: ", 9) == 0, "%s", last);

  /* The session goes on: a fresh turn, nothing carried over. */
  ag_turn_outcome o2 = run("something else");
  ASSERT_OUTCOME(o2, AG_TURN_COMPLETED, "final_answer");
  cr_assert_str_eq(o2.final_text, "fresh");
  cr_assert_eq(o2.iterations, 1);
  json_t *last_ev = json_array_get(H.events, json_array_size(H.events) - 1);
  cr_assert_eq(json_integer_value(json_object_get(last_ev, "turn")), 2);
  ag_turn_outcome_clear(&o);
  ag_turn_outcome_clear(&o2);
  teardown();
}

Test(agent, consecutive_errors_exact_warning) {
  ag_config cfg = preset("default");
  setup(&cfg, "[{\"model\": ["
              "{\"tool_calls\": [{\"name\": \"fail\", \"arguments\": "
              "{\"path\": \"a\"}}]},"
              "{\"tool_calls\": [{\"name\": \"fail\", \"arguments\": "
              "{\"path\": \"b\"}}]},"
              "{\"tool_calls\": [{\"name\": \"fail\", \"arguments\": "
              "{\"path\": \"c\"}}]},"
              "{\"tool_calls\": [{\"name\": \"fail\", \"arguments\": "
              "{\"path\": \"d\"}}]},"
              "{\"text\": \"never\"}]}]");
  ag_turn_outcome o = run("read");
  ASSERT_OUTCOME(o, AG_TURN_STOPPED, "consecutive_errors");
  cr_assert_str_eq(o.message, "Exceeded maximum consecutive errors (3)");
  cr_assert_eq(o.iterations, 4);
  cr_assert_eq(o.tool_calls, 4, "every failing call ran");

  json_t *w = events_named("warning");
  cr_assert_eq(json_array_size(w), 1);
  cr_assert_str_eq(str(json_array_get(w, 0), "message"),
                   "\xe2\x9a\xa0\xef\xb8\x8f Maximum consecutive errors (3) "
                   "exceeded. Stopping execution to prevent infinite error "
                   "loop.");
  json_decref(w);
  size_t n = json_array_size(H.events);
  cr_assert_str_eq(str(json_array_get(H.events, n - 2), "event"), "warning");
  cr_assert_str_eq(str(json_array_get(H.events, n - 1), "event"), "turn_end");
  assert_history_well_formed();
  ag_turn_outcome_clear(&o);
  teardown();
}

Test(agent, nudge_then_stop) {
  ag_config cfg = preset("default");
  cfg.loop.nudge_before_stop = true;
  setup(&cfg, "[{\"model\": [" STUCK_ECHO "], \"repeat_last\": true}]");
  ag_turn_outcome o = run("loop");
  ASSERT_OUTCOME(o, AG_TURN_STOPPED, "identical_calls");
  cr_assert_eq(o.iterations, 6, "the nudge holds the 5th call; the 6th stops");
  cr_assert_eq(o.tool_calls, 4);

  json_t *nudges = events_named("nudge");
  cr_assert_eq(json_array_size(nudges), 1);
  cr_assert_str_eq(str(json_array_get(nudges, 0), "reason"), "identical_calls");
  const char *text = str(json_array_get(nudges, 0), "text");
  cr_assert(strncmp(text, "Potential loop detected: ", 25) == 0, "%s", text);
  json_decref(nudges);

  /* the held-back call's tool message is the nudge text */
  const json_t *h = history();
  bool found = false;
  size_t i;
  json_t *m;
  json_array_foreach(h, i, m) {
    if (strcmp(str(m, "role"), "tool") == 0 &&
        strncmp(str(m, "content"), "Potential loop detected: ", 25) == 0)
      found = true;
  }
  cr_assert(found, "a tool message holds the nudge");
  assert_history_well_formed();
  cr_assert_eq(count_role("tool"), 6);
  ag_turn_outcome_clear(&o);
  teardown();
}

Test(agent, call_and_result_polling_is_not_a_loop) {
  ag_config cfg = preset("default");
  cfg.loop.identical_call_scope = AG_SCOPE_CALL_AND_RESULT;
  setup(&cfg,
        "[{\"model\": ["
        "{\"tool_calls\": [{\"name\": \"poll\", \"arguments\": {}}]},"
        "{\"tool_calls\": [{\"name\": \"poll\", \"arguments\": {}}]},"
        "{\"tool_calls\": [{\"name\": \"poll\", \"arguments\": {}}]},"
        "{\"tool_calls\": [{\"name\": \"poll\", \"arguments\": {}}]},"
        "{\"tool_calls\": [{\"name\": \"poll\", \"arguments\": {}}]},"
        "{\"tool_calls\": [{\"name\": \"poll\", \"arguments\": {}}]},"
        "{\"tool_calls\": [{\"name\": \"poll\", \"arguments\": {}}]},"
        "{\"text\": \"job finished\"}]},"
        " {\"model\": [{\"tool_calls\": [{\"name\": \"same\", \"arguments\": "
        "{}}]}], \"repeat_last\": true}]");
  ag_turn_outcome o = run("wait for the job");
  ASSERT_OUTCOME(o, AG_TURN_COMPLETED, "final_answer");
  cr_assert_eq(o.tool_calls, 7);

  /* the same call with the same result is a loop; the tripping call ran */
  ag_turn_outcome o2 = run("wait again");
  ASSERT_OUTCOME(o2, AG_TURN_STOPPED, "identical_calls");
  cr_assert_eq(o2.tool_calls, 5);
  cr_assert(strstr(o2.message, "same result") != NULL, "%s", o2.message);
  cr_assert_eq(count_events("tool_blocked"), 0);
  assert_history_well_formed();
  ag_turn_outcome_clear(&o);
  ag_turn_outcome_clear(&o2);
  teardown();
}

Test(agent, call_and_result_nudge_is_appended_to_the_call) {
  ag_config cfg = preset("default");
  cfg.loop.identical_call_scope = AG_SCOPE_CALL_AND_RESULT;
  cfg.loop.nudge_before_stop = true;
  setup(&cfg, "[{\"model\": [{\"tool_calls\": [{\"name\": \"same\", "
              "\"arguments\": {}}]}], \"repeat_last\": true}]");
  ag_turn_outcome o = run("wait");
  ASSERT_OUTCOME(o, AG_TURN_STOPPED, "identical_calls");
  cr_assert_eq(o.tool_calls, 6);
  cr_assert_eq(count_events("nudge"), 1);
  /* the 5th tool message: the result, then the nudge */
  const json_t *h = history();
  int k = 0;
  const char *fifth = NULL;
  size_t i;
  json_t *m;
  json_array_foreach(h, i, m) {
    if (strcmp(str(m, "role"), "tool") == 0 && ++k == 5)
      fifth = str(m, "content");
  }
  cr_assert_not_null(fifth);
  cr_assert(strncmp(fifth, "job running\n\nPotential loop detected: ", 38) == 0,
            "%s", fifth);
  ag_turn_outcome_clear(&o);
  teardown();
}

/* ------------------------------------------------------------------------ */
/* Forge: required tool calls, loop-breaking tools, the error context       */
/* ------------------------------------------------------------------------ */

Test(agent, forge_loop_breaking_tool_completes) {
  ag_config cfg = preset("forge");
  setup(&cfg,
        "[{\"model\": ["
        "{\"tool_calls\": [{\"name\": \"echo\", \"arguments\": {}}]},"
        "{\"text\": \"wrapping up\", \"tool_calls\": [{\"name\": "
        "\"task_complete\", \"arguments\": {\"summary\": \"all done\"}}]},"
        "{\"text\": \"never\"}]}]");
  ag_turn_outcome o = run("work");
  ASSERT_OUTCOME(o, AG_TURN_COMPLETED, "loop_breaking_tool");
  cr_assert_str_eq(o.final_text, "Task complete: all done");
  cr_assert_eq(o.iterations, 2);
  cr_assert(strstr(o.message, "task_complete") != NULL, "%s", o.message);
  assert_history_well_formed();
  ag_turn_outcome_clear(&o);
  teardown();
}

Test(agent, forge_no_tool_call_feeds_ephemeral_error_context) {
  ag_config cfg = preset("forge");
  setup(&cfg, "[{\"model\": [{\"text\": \"I think I am done\"},"
              "{\"tool_calls\": [{\"name\": \"task_complete\", "
              "\"arguments\": {\"summary\": \"ok\"}}]}]}]");
  ag_turn_outcome o = run("work");
  ASSERT_OUTCOME(o, AG_TURN_COMPLETED, "loop_breaking_tool");
  cr_assert_eq(o.iterations, 2);

  json_t *msgs = json_object_get(request(1), "messages");
  json_t *lastm = json_array_get(msgs, json_array_size(msgs) - 1);
  cr_assert_str_eq(str(lastm, "role"), "user");
  const char *ctx = str(lastm, "content");
  static const char head[] =
      "The previous iteration failed with the following error:\n\n";
  cr_assert(strncmp(ctx, head, sizeof(head) - 1) == 0, "%s", ctx);
  cr_assert(strstr(ctx, "You must provide a tool call in your response.") !=
                NULL,
            "%s", ctx);
  cr_assert_eq(count_events("error_context"), 1);

  /* never stored in history */
  size_t i;
  json_t *m;
  json_array_foreach(history(), i, m) {
    cr_assert(strstr(str(m, "content"), "The previous iteration failed") ==
                  NULL,
              "history message %zu holds the error context", i);
  }
  /* history: system, user, assistant (text), assistant (call), tool */
  cr_assert_eq(json_array_size(history()), 5);
  /* the first request had no error context */
  cr_assert_eq(json_array_size(json_object_get(request(0), "messages")), 2);
  ag_turn_outcome_clear(&o);
  teardown();
}

Test(agent, error_context_goes_into_the_next_request_only) {
  ag_config cfg = preset("default");
  setup(&cfg, "[{\"model\": [{\"tool_calls\": [{\"name\": \"fail\", "
              "\"arguments\": {\"path\": \"x\"}}]}, {\"tool_calls\": "
              "[{\"name\": \"echo\", \"arguments\": {}}]}, {\"text\": "
              "\"ok\"}]}]");
  ag_turn_outcome o = run("x");
  ASSERT_OUTCOME(o, AG_TURN_COMPLETED, "final_answer");
  cr_assert_eq(json_array_size(H.fake->requests), 3);
  /* request 2: history (system, user, assistant, tool) + the context */
  json_t *m1 = json_object_get(request(1), "messages");
  cr_assert_eq(json_array_size(m1), 5);
  const char *ctx = str(json_array_get(m1, 4), "content");
  cr_assert(strstr(ctx, "The error was: Error: cannot open x") != NULL, "%s",
            ctx);
  /* request 3: the history alone */
  json_t *m2 = json_object_get(request(2), "messages");
  cr_assert_eq(json_array_size(m2), 6);
  cr_assert_str_eq(str(json_array_get(m2, 5), "role"), "tool");
  cr_assert_eq(json_array_size(history()), 7);
  ag_turn_outcome_clear(&o);
  teardown();
}

Test(agent, unknown_tool_error_context_lists_tools) {
  ag_config cfg = preset("default");
  setup(&cfg, "[{\"model\": [{\"tool_calls\": [{\"name\": \"nope\", "
              "\"arguments\": {}}]}, {\"text\": \"sorry\"}]}]");
  ag_turn_outcome o = run("x");
  ASSERT_OUTCOME(o, AG_TURN_COMPLETED, "final_answer");
  json_t *msgs = json_object_get(request(1), "messages");
  const char *ctx =
      str(json_array_get(msgs, json_array_size(msgs) - 1), "content");
  cr_assert(strstr(ctx, "Use one of the available tools: [") != NULL, "%s",
            ctx);
  cr_assert(strstr(ctx, "task_complete") != NULL, "%s", ctx);
  json_t *res = events_named("tool_result");
  cr_assert_eq(json_array_size(res), 1);
  cr_assert(json_is_false(json_object_get(json_array_get(res, 0), "ok")));
  cr_assert_str_eq(str(json_array_get(res, 0), "category"), "not_found");
  json_decref(res);
  cr_assert_eq(count_events("tool_attempt"), 0);
  cr_assert_eq(o.tool_calls, 0);
  ag_turn_outcome_clear(&o);
  teardown();
}

Test(agent, invalid_arguments_never_run) {
  ag_config cfg = preset("default");
  setup(&cfg, "[{\"model\": [{\"tool_calls\": [{\"name\": \"echo\", "
              "\"arguments\": \"{not json\"}]}, {\"text\": \"ok\"}]}]");
  ag_turn_outcome o = run("x");
  ASSERT_OUTCOME(o, AG_TURN_COMPLETED, "final_answer");
  cr_assert_eq(tool_runs, 0);
  json_t *calls = events_named("tool_call");
  cr_assert(
      json_is_null(json_object_get(json_array_get(calls, 0), "signature")));
  json_decref(calls);
  json_t *msgs = json_object_get(request(1), "messages");
  const char *ctx =
      str(json_array_get(msgs, json_array_size(msgs) - 1), "content");
  cr_assert(strstr(ctx, "Ensure your tool call JSON is properly formatted.") !=
                NULL,
            "%s", ctx);
  assert_history_well_formed();
  ag_turn_outcome_clear(&o);
  teardown();
}

/* ------------------------------------------------------------------------ */
/* Escalation                                                               */
/* ------------------------------------------------------------------------ */

#define FAIL3                                                                  \
  "{\"tool_calls\": [{\"name\": \"fail\", \"arguments\": {\"path\": "          \
  "\"a\"}}]},"                                                                 \
  "{\"tool_calls\": [{\"name\": \"fail\", \"arguments\": {\"path\": "          \
  "\"b\"}}]},"                                                                 \
  "{\"tool_calls\": [{\"name\": \"fail\", \"arguments\": {\"path\": "          \
  "\"c\"}}]},"

Test(agent, escalation_human_continues_with_hint) {
  ag_config cfg = preset("twelve-factor");
  setup_opts so = {.with_human = true};
  setup_with(&cfg, "[{\"model\": [" FAIL3 "{\"text\": \"used the backup\"}]}]",
             so);
  H.human_action = AG_HUMAN_CONTINUE;
  H.human_hint = "Try the backup file instead.";
  ag_turn_outcome o = run("read the files");
  ASSERT_OUTCOME(o, AG_TURN_COMPLETED, "final_answer");
  cr_assert_str_eq(o.final_text, "used the backup");
  cr_assert_eq(o.iterations, 4, "the same turn went on");
  cr_assert_eq(H.human_calls, 1);

  json_t *rec = json_loads(H.last_record, 0, NULL);
  cr_assert_not_null(rec, "%s", H.last_record);
  cr_assert_str_eq(str(rec, "status"), "escalated");
  cr_assert_str_eq(str(rec, "reason"), "Too many errors with fail");
  json_decref(rec);

  json_t *esc = events_named("escalation");
  cr_assert_eq(json_array_size(esc), 1);
  cr_assert(json_is_object(json_object_get(json_array_get(esc, 0), "record")));
  json_decref(esc);
  json_t *hum = events_named("human");
  cr_assert_eq(json_array_size(hum), 1);
  cr_assert_str_eq(str(json_array_get(hum, 0), "action"), "continue");
  cr_assert_str_eq(str(json_array_get(hum, 0), "message"),
                   "Try the backup file instead.");
  json_decref(hum);

  /* the hint is a user message in the history, seen by the next request */
  cr_assert_str_eq(last_content("user"), "Try the backup file instead.");
  json_t *msgs = json_object_get(request(3), "messages");
  bool seen = false;
  size_t i;
  json_t *m;
  json_array_foreach(msgs, i, m) {
    if (strcmp(str(m, "content"), "Try the backup file instead.") == 0)
      seen = true;
  }
  cr_assert(seen);
  cr_assert_eq(count_events("turn_end"), 1);
  assert_history_well_formed();
  ag_turn_outcome_clear(&o);
  teardown();
}

Test(agent, escalation_human_stops) {
  ag_config cfg = preset("twelve-factor");
  setup_opts so = {.with_human = true};
  setup_with(&cfg, "[{\"model\": [" FAIL3 "{\"text\": \"never\"}]}]", so);
  H.human_action = AG_HUMAN_STOP;
  ag_turn_outcome o = run("read");
  ASSERT_OUTCOME(o, AG_TURN_ESCALATED, "tool_error_budget");
  cr_assert_eq(o.iterations, 3);
  cr_assert_eq(H.human_calls, 1);
  json_t *hum = events_named("human");
  cr_assert_str_eq(str(json_array_get(hum, 0), "action"), "stop");
  json_decref(hum);
  assert_history_well_formed();
  ag_turn_outcome_clear(&o);
  teardown();
}

Test(agent, escalation_without_human_ends_escalated) {
  ag_config cfg = preset("twelve-factor");
  setup(&cfg, "[{\"model\": [" FAIL3 "{\"text\": \"never\"}]}]");
  ag_turn_outcome o = run("read");
  ASSERT_OUTCOME(o, AG_TURN_ESCALATED, "tool_error_budget");
  cr_assert_eq(count_events("escalation"), 1);
  cr_assert_eq(count_events("human"), 0);
  ag_turn_outcome_clear(&o);
  teardown();
}

/* ------------------------------------------------------------------------ */
/* The iteration cap and the wrap-up request                                */
/* ------------------------------------------------------------------------ */

Test(agent, max_iterations_wrap_up_without_tools) {
  ag_config cfg = preset("default");
  cfg.loop.max_iterations = 2;
  setup(&cfg, "[{\"model\": ["
              "{\"tool_calls\": [{\"name\": \"echo\", \"arguments\": "
              "{\"n\": 1}}]},"
              "{\"tool_calls\": [{\"name\": \"echo\", \"arguments\": "
              "{\"n\": 2}}]},"
              "{\"text\": \"Here is what I found so far.\"}]}]");
  ag_turn_outcome o = run("dig");
  ASSERT_OUTCOME(o, AG_TURN_STOPPED, "max_iterations");
  cr_assert_str_eq(o.final_text, "Here is what I found so far.");
  cr_assert_eq(o.iterations, 3, "the wrap-up request counts");
  cr_assert_eq(json_array_size(H.fake->requests), 3);
  cr_assert(json_is_true(json_object_get(request(1), "tools")));
  cr_assert(json_is_false(json_object_get(request(2), "tools")),
            "the wrap-up request offers no tools");
  cr_assert_eq(count_events("model_request"), 3);
  ag_turn_outcome_clear(&o);
  teardown();
}

Test(agent, max_iterations_without_wrap_up) {
  ag_config cfg = preset("default");
  cfg.loop.max_iterations = 2;
  cfg.loop.final_request_without_tools = false;
  setup(&cfg, "[{\"model\": ["
              "{\"tool_calls\": [{\"name\": \"echo\", \"arguments\": "
              "{\"n\": 1}}]},"
              "{\"text\": \"partial\", \"tool_calls\": [{\"name\": \"echo\", "
              "\"arguments\": {\"n\": 2}}]}]}]");
  ag_turn_outcome o = run("dig");
  ASSERT_OUTCOME(o, AG_TURN_STOPPED, "max_iterations");
  cr_assert_eq(o.iterations, 2);
  cr_assert_eq(json_array_size(H.fake->requests), 2);
  cr_assert_str_eq(o.final_text, "partial", "the partial answer is kept");
  ag_turn_outcome_clear(&o);
  teardown();
}

Test(agent, wrap_up_reply_with_tool_calls_is_answered) {
  ag_config cfg = preset("default");
  cfg.loop.max_iterations = 1;
  setup(&cfg, "[{\"model\": [{\"tool_calls\": [{\"name\": \"echo\", "
              "\"arguments\": {\"n\": 1}}]}, {\"text\": \"still\", "
              "\"tool_calls\": [{\"name\": \"echo\", \"arguments\": "
              "{\"n\": 3}}]}]}]");
  ag_turn_outcome o = run("dig");
  ASSERT_OUTCOME(o, AG_TURN_STOPPED, "max_iterations");
  cr_assert_str_eq(o.final_text, "still");
  assert_history_well_formed();
  cr_assert_eq(o.tool_calls, 1);
  cr_assert_eq(count_events("tool_blocked"), 1);
  ag_turn_outcome_clear(&o);
  teardown();
}

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
/* The history cap                                                          */
/* ------------------------------------------------------------------------ */

Test(agent, history_cap_drops_oldest_turns) {
  ag_config cfg = preset("default");
  setup_opts so = {.max_history_bytes = 700};
  char script[2048] = "[";
  for (int i = 0; i < 6; i++)
    snprintf(script + strlen(script), sizeof(script) - strlen(script),
             "%s{\"model\": [{\"text\": \"answer %d\"}]}", i ? "," : "", i);
  strcat(script, "]");
  setup_with(&cfg, script, so);
  char user[256];
  for (int i = 0; i < 6; i++) {
    memset(user, 'a' + i, 150);
    user[150] = '\0';
    ag_turn_outcome o = run(user);
    ASSERT_OUTCOME(o, AG_TURN_COMPLETED, "final_answer");
    ag_turn_outcome_clear(&o);
    char *d = json_dumps(history(), JSON_COMPACT);
    cr_assert_leq(strlen(d), 700, "history is %zu bytes after turn %d",
                  strlen(d), i + 1);
    free(d);
  }
  const json_t *h = history();
  cr_assert_str_eq(str(json_array_get(h, 0), "role"), "system");
  cr_assert_str_eq(str(json_array_get(h, 0), "content"), "You are a test.");
  /* the oldest turns went, whole: user then assistant after the system */
  size_t n = json_array_size(h);
  cr_assert_lt(n, 13);
  cr_assert_eq((n - 1) % 2, 0, "whole turns only");
  cr_assert_str_eq(str(json_array_get(h, 1), "role"), "user");
  cr_assert_str_eq(str(json_array_get(h, n - 1), "content"), "answer 5");
  /* No more than needed was dropped: a turn here is about 230 bytes, the
   * system message and brackets about 45, so two turns fit in 700 and three
   * do not. */
  cr_assert_eq(n, 5, "expected two whole turns kept, got %zu messages", n);
  teardown();
}

Test(agent, history_cap_keeps_the_current_turn) {
  ag_config cfg = preset("default");
  setup_opts so = {.max_history_bytes = 100};
  setup_with(&cfg,
             "[{\"model\": [{\"text\": \"a\"}]}, {\"model\": [{\"text\": "
             "\"b\"}]}]",
             so);
  char big[300];
  memset(big, 'x', 299);
  big[299] = '\0';
  ag_turn_outcome o = run(big);
  ag_turn_outcome_clear(&o);
  cr_assert_eq(json_array_size(history()), 3);
  o = run(big);
  ag_turn_outcome_clear(&o);
  cr_assert_eq(json_array_size(history()), 3, "only the last turn is kept");
  cr_assert_str_eq(last_content("assistant"), "b");
  teardown();
}

Test(agent, meai_tells_the_model_only_that_a_function_failed) {
  ag_config cfg = preset("meai");
  cr_assert_eq(cfg.errors.feedback, AG_FEEDBACK_GENERIC);
  setup(&cfg, "[{\"model\": ["
              "{\"tool_calls\": [{\"name\": \"fail\", \"arguments\": "
              "{\"path\": \"/secret/x\"}}]},"
              "{\"tool_calls\": [{\"name\": \"nope\", \"arguments\": {}}]},"
              "{\"text\": \"done\"}]}]");
  ag_turn_outcome o = run("go");
  ASSERT_OUTCOME(o, AG_TURN_COMPLETED, "final_answer");
  ag_turn_outcome_clear(&o);
  const json_t *h = history();
  size_t tools = 0;
  for (size_t i = 0; i < json_array_size(h); i++) {
    const json_t *m = json_array_get(h, i);
    if (strcmp(str(m, "role"), "tool") != 0)
      continue;
    tools++;
    if (tools == 1)
      cr_assert_str_eq(str(m, "content"), "Error: Function failed.");
    else
      cr_assert_str_eq(str(m, "content"),
                       "Error: Requested function \"nope\" not found.");
  }
  cr_assert_eq(tools, 2);
  teardown();
}

Test(agent, history_cap_bounds_a_long_turn) {
  /* a model that loops for 300 iterations with 2 KB arguments and results:
   * the turn itself stays under the cap (issue: 770 MB after 30 s) */
  ag_config cfg = preset("none");
  cfg.loop.max_iterations = 300;
  cfg.loop.final_request_without_tools = false;
  setup_opts so = {.max_history_bytes = 32768};
  char big[2100];
  memset(big, 'q', 2048);
  big[2048] = '\0';
  char *script = malloc(4096);
  snprintf(script, 4096,
           "[{\"model\": [{\"tool_calls\": [{\"name\": \"echo\", "
           "\"arguments\": {\"s\": \"%s\"}}]}], \"repeat_last\": true}]",
           big);
  setup_with(&cfg, script, so);
  free(script);
  ag_turn_outcome o = run("loop");
  ASSERT_OUTCOME(o, AG_TURN_STOPPED, "max_iterations");
  cr_assert_eq(o.iterations, 300);
  ag_turn_outcome_clear(&o);
  char *d = json_dumps(history(), JSON_COMPACT);
  /* the cap, plus at most the iteration in progress (about 4.3 KB) */
  cr_assert_leq(strlen(d), 32768 + 8192, "history is %zu bytes", strlen(d));
  free(d);
  assert_history_well_formed();
  const json_t *h = history();
  cr_assert_str_eq(str(json_array_get(h, 1), "role"), "user");
  cr_assert_str_eq(str(json_array_get(h, 1), "content"), "loop");
  /* the last iteration is whole */
  cr_assert(strstr(last_content("tool"), "qqqqqqqq") != NULL);
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

/* ------------------------------------------------------------------------ */
/* The history as text                                                      */
/* ------------------------------------------------------------------------ */

/* A session through every way the history changes: a tool call, a denied
 * call, a failed call (its error context rides in the next request only),
 * a nudge and a stop, a turn larger than the cap (its oldest results and
 * arguments compacted, older turns dropped), invalid UTF-8 output. */
#define HIST_TURNS 6
static const char *const hist_users[HIST_TURNS] = {"first", "second", "third",
                                                   "loop",  "big",    "after"};

static void hist_scenario_setup(void) {
  ag_config cfg = preset("default");
  cfg.loop.nudge_before_stop = true;
  setup_opts so = {.max_history_bytes = 3000};
  char big[4][700];
  for (int i = 0; i < 4; i++) {
    memset(big[i], 'k' + i, 600);
    big[i][600] = '\0';
  }
  char *script = malloc(16384);
  snprintf(
      script, 16384,
      "[{\"model\": [{\"tool_calls\": [{\"name\": \"echo\", \"arguments\": "
      "{\"s\": \"a\"}}]}, {\"text\": \"one\"}]},"
      " {\"model\": [{\"tool_calls\": [{\"name\": \"danger\", \"arguments\": "
      "{}}]}, {\"text\": \"two\"}]},"
      " {\"model\": [{\"tool_calls\": [{\"name\": \"fail\", \"arguments\": "
      "{\"path\": \"x.c\"}}]}, {\"text\": \"three\"}]},"
      " {\"model\": [" STUCK_ECHO "], \"repeat_last\": true},"
      " {\"model\": ["
      "{\"text\": \"reading\", \"tool_calls\": [{\"name\": \"echo\", "
      "\"arguments\": {\"s\": \"%s\"}}]},"
      "{\"tool_calls\": [{\"name\": \"echo\", \"arguments\": {\"s\": "
      "\"%s\"}}]},"
      "{\"tool_calls\": [{\"name\": \"echo\", \"arguments\": {\"s\": "
      "\"%s\"}}]},"
      "{\"tool_calls\": [{\"name\": \"echo\", \"arguments\": {\"s\": "
      "\"%s\"}}]},"
      "{\"text\": \"five\"}]},"
      " {\"model\": [{\"tool_calls\": [{\"name\": \"bytes\", \"arguments\": "
      "{}}]}, {\"text\": \"six\"}]}]",
      big[0], big[1], big[2], big[3]);
  setup_with(&cfg, script, so);
  free(script);
  H.deny = true;
}

/* What the jansson tree history dumped after each turn of the scenario
 * (recorded with the tree implementation, commit 4d4b847). */
static const char *const hist_golden[HIST_TURNS][2] = {
    {"completed final_answer",
     "[{\"role\":\"system\",\"content\":\"You are a test.\"},{\"role\":\"u"
     "ser\",\"content\":\"first\"},{\"role\":\"assistant\",\"content\":nul"
     "l,\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\",\"functio"
     "n\":{\"name\":\"echo\",\"arguments\":\"{\\\"s\\\":\\\"a\\\"}\"}}]},{"
     "\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"echo {\\"
     "\"s\\\":\\\"a\\\"}\"},{\"role\":\"assistant\",\"content\":\"one\"}]"},
    {"completed final_answer",
     "[{\"role\":\"system\",\"content\":\"You are a test.\"},{\"role\":\"u"
     "ser\",\"content\":\"first\"},{\"role\":\"assistant\",\"content\":nul"
     "l,\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\",\"functio"
     "n\":{\"name\":\"echo\",\"arguments\":\"{\\\"s\\\":\\\"a\\\"}\"}}]},{"
     "\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"echo {\\"
     "\"s\\\":\\\"a\\\"}\"},{\"role\":\"assistant\",\"content\":\"one\"},{"
     "\"role\":\"user\",\"content\":\"second\"},{\"role\":\"assistant\",\""
     "content\":null,\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"functio"
     "n\",\"function\":{\"name\":\"danger\",\"arguments\":\"{}\"}}]},{\"ro"
     "le\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"Tool call re"
     "jected: the user said no\"},{\"role\":\"assistant\",\"content\":\"tw"
     "o\"}]"},
    {"completed final_answer",
     "[{\"role\":\"system\",\"content\":\"You are a test.\"},{\"role\":\"u"
     "ser\",\"content\":\"first\"},{\"role\":\"assistant\",\"content\":nul"
     "l,\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\",\"functio"
     "n\":{\"name\":\"echo\",\"arguments\":\"{\\\"s\\\":\\\"a\\\"}\"}}]},{"
     "\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"echo {\\"
     "\"s\\\":\\\"a\\\"}\"},{\"role\":\"assistant\",\"content\":\"one\"},{"
     "\"role\":\"user\",\"content\":\"second\"},{\"role\":\"assistant\",\""
     "content\":null,\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"functio"
     "n\",\"function\":{\"name\":\"danger\",\"arguments\":\"{}\"}}]},{\"ro"
     "le\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"Tool call re"
     "jected: the user said no\"},{\"role\":\"assistant\",\"content\":\"tw"
     "o\"},{\"role\":\"user\",\"content\":\"third\"},{\"role\":\"assistant"
     "\",\"content\":null,\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"fu"
     "nction\",\"function\":{\"name\":\"fail\",\"arguments\":\"{\\\"path\\"
     "\":\\\"x.c\\\"}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"call_1\""
     ",\"content\":\"<error>\\ntool: fail\\ntype: not_found\\nmessage: Err"
     "or: cannot open x.c: no such file or directory\\nsuggestion: Verify "
     "the resource exists or list available options\\n</error>\"},{\"role"
     "\":\"assistant\",\"content\":\"three\"}]"},
    {"stopped identical_calls",
     "[{\"role\":\"system\",\"content\":\"You are a test.\"},{\"role\":\"u"
     "ser\",\"content\":\"first\"},{\"role\":\"assistant\",\"content\":nul"
     "l,\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\",\"functio"
     "n\":{\"name\":\"echo\",\"arguments\":\"{\\\"s\\\":\\\"a\\\"}\"}}]},{"
     "\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"echo {\\"
     "\"s\\\":\\\"a\\\"}\"},{\"role\":\"assistant\",\"content\":\"one\"},{"
     "\"role\":\"user\",\"content\":\"second\"},{\"role\":\"assistant\",\""
     "content\":null,\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"functio"
     "n\",\"function\":{\"name\":\"danger\",\"arguments\":\"{}\"}}]},{\"ro"
     "le\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"Tool call re"
     "jected: the user said no\"},{\"role\":\"assistant\",\"content\":\"tw"
     "o\"},{\"role\":\"user\",\"content\":\"third\"},{\"role\":\"assistant"
     "\",\"content\":null,\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"fu"
     "nction\",\"function\":{\"name\":\"fail\",\"arguments\":\"{\\\"path\\"
     "\":\\\"x.c\\\"}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"call_1\""
     ",\"content\":\"<error>\\ntool: fail\\ntype: not_found\\nmessage: Err"
     "or: cannot open x.c: no such file or directory\\nsuggestion: Verify "
     "the resource exists or list available options\\n</error>\"},{\"role"
     "\":\"assistant\",\"content\":\"three\"},{\"role\":\"user\",\"content"
     "\":\"loop\"},{\"role\":\"assistant\",\"content\":null,\"tool_calls\""
     ":[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\""
     "echo\",\"arguments\":\"{\\\"q\\\":1}\"}}]},{\"role\":\"tool\",\"tool"
     "_call_id\":\"call_1\",\"content\":\"echo {\\\"q\\\":1}\"},{\"role\":"
     "\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_1\",\""
     "type\":\"function\",\"function\":{\"name\":\"echo\",\"arguments\":\""
     "{\\\"q\\\":1}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"call_1\","
     "\"content\":\"echo {\\\"q\\\":1}\"},{\"role\":\"assistant\",\"conten"
     "t\":null,\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\",\""
     "function\":{\"name\":\"echo\",\"arguments\":\"{\\\"q\\\":1}\"}}]},{"
     "\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"echo {\\"
     "\"q\\\":1}\"},{\"role\":\"assistant\",\"content\":null,\"tool_calls"
     "\":[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":"
     "\"echo\",\"arguments\":\"{\\\"q\\\":1}\"}}]},{\"role\":\"tool\",\"to"
     "ol_call_id\":\"call_1\",\"content\":\"echo {\\\"q\\\":1}\"},{\"role"
     "\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_1\""
     ",\"type\":\"function\",\"function\":{\"name\":\"echo\",\"arguments\""
     ":\"{\\\"q\\\":1}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"call_1"
     "\",\"content\":\"Potential loop detected: echo was called 5 times in"
     " a row with the same arguments. This call was not run. Stop repeatin"
     "g this call: use its earlier result, change the arguments, or try a "
     "different approach.\"},{\"role\":\"assistant\",\"content\":null,\"to"
     "ol_calls\":[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{"
     "\"name\":\"echo\",\"arguments\":\"{\\\"q\\\":1}\"}}]},{\"role\":\"to"
     "ol\",\"tool_call_id\":\"call_1\",\"content\":\"Not run: echo was cal"
     "led 6 times in a row with the same arguments\"}]"},
    {"completed final_answer",
     "[{\"role\":\"system\",\"content\":\"You are a test.\"},{\"role\":\"u"
     "ser\",\"content\":\"big\"},{\"role\":\"assistant\",\"content\":\"rea"
     "ding\",\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\",\"fu"
     "nction\":{\"name\":\"echo\",\"arguments\":\"{\\\"dropped\\\":\\\"608"
     " bytes of arguments (size cap)\\\"}\"}}]},{\"role\":\"tool\",\"tool_"
     "call_id\":\"call_1\",\"content\":\"[613 bytes dropped from this mess"
     "age to keep the conversation under its size cap]\"},{\"role\":\"assi"
     "stant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_1\",\"type\""
     ":\"function\",\"function\":{\"name\":\"echo\",\"arguments\":\"{\\\"d"
     "ropped\\\":\\\"608 bytes of arguments (size cap)\\\"}\"}}]},{\"role"
     "\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"[613 bytes dro"
     "pped from this message to keep the conversation under its size cap]"
     "\"},{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\""
     ":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"echo\",\""
     "arguments\":\"{\\\"dropped\\\":\\\"608 bytes of arguments (size cap)"
     "\\\"}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content"
     "\":\"[613 bytes dropped from this message to keep the conversation u"
     "nder its size cap]\"},{\"role\":\"assistant\",\"content\":null,\"too"
     "l_calls\":[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\""
     "name\":\"echo\",\"arguments\":\"{\\\"s\\\":\\\"nnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn\\\"}\"}}]},{\"role\":\"tool\",\""
     "tool_call_id\":\"call_1\",\"content\":\"echo {\\\"s\\\":\\\"nnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn\\\"}\"},{\"role\":"
     "\"assistant\",\"content\":\"five\"}]"},
    {"completed final_answer",
     "[{\"role\":\"system\",\"content\":\"You are a test.\"},{\"role\":\"u"
     "ser\",\"content\":\"big\"},{\"role\":\"assistant\",\"content\":\"rea"
     "ding\",\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\",\"fu"
     "nction\":{\"name\":\"echo\",\"arguments\":\"{\\\"dropped\\\":\\\"608"
     " bytes of arguments (size cap)\\\"}\"}}]},{\"role\":\"tool\",\"tool_"
     "call_id\":\"call_1\",\"content\":\"[613 bytes dropped from this mess"
     "age to keep the conversation under its size cap]\"},{\"role\":\"assi"
     "stant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_1\",\"type\""
     ":\"function\",\"function\":{\"name\":\"echo\",\"arguments\":\"{\\\"d"
     "ropped\\\":\\\"608 bytes of arguments (size cap)\\\"}\"}}]},{\"role"
     "\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"[613 bytes dro"
     "pped from this message to keep the conversation under its size cap]"
     "\"},{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\""
     ":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"echo\",\""
     "arguments\":\"{\\\"dropped\\\":\\\"608 bytes of arguments (size cap)"
     "\\\"}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content"
     "\":\"[613 bytes dropped from this message to keep the conversation u"
     "nder its size cap]\"},{\"role\":\"assistant\",\"content\":null,\"too"
     "l_calls\":[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\""
     "name\":\"echo\",\"arguments\":\"{\\\"s\\\":\\\"nnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn\\\"}\"}}]},{\"role\":\"tool\",\""
     "tool_call_id\":\"call_1\",\"content\":\"echo {\\\"s\\\":\\\"nnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn"
     "nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn\\\"}\"},{\"role\":"
     "\"assistant\",\"content\":\"five\"},{\"role\":\"user\",\"content\":"
     "\"after\"},{\"role\":\"assistant\",\"content\":null,\"tool_calls\":["
     "{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"by"
     "tes\",\"arguments\":\"{}\"}}]},{\"role\":\"tool\",\"tool_call_id\":"
     "\"call_1\",\"content\":\"ok \357\277\275\357\277\275\357\277\275 end"
     "\"},{\"role\":\"assistant\",\"content\":\"six\"}]"},
};

/* The stored text is, byte for byte, what the tree history dumped, after
 * every turn; every request a tree-reading provider got carried the same
 * messages as text. */
Test(agent, history_text_is_the_tree_it_replaced) {
  hist_scenario_setup();
  for (int i = 0; i < HIST_TURNS; i++) {
    ag_turn_outcome o = run(hist_users[i]);
    char st[64];
    snprintf(st, sizeof(st), "%s %s", ag_turn_status_name(o.status), o.reason);
    cr_assert_str_eq(st, hist_golden[i][0], "turn %d", i + 1);
    size_t len = 0;
    const char *text = ag_agent_history_json(H.agent, &len);
    cr_assert_eq(len, strlen(hist_golden[i][1]), "turn %d: %zu bytes, want %zu",
                 i + 1, len, strlen(hist_golden[i][1]));
    cr_assert_str_eq(text, hist_golden[i][1], "turn %d", i + 1);
    assert_history_well_formed();
    ag_turn_outcome_clear(&o);
  }
  /* the scenario went where it should: a nudge, a denial, an error
   * context, a compaction */
  cr_assert_eq(count_events("nudge"), 1);
  cr_assert_eq(count_events("error_context"), 1);
  cr_assert(strstr(hist_golden[4][1], "bytes of arguments (size cap)") != NULL);
  size_t i;
  json_t *rq;
  size_t with_ectx = 0;
  json_array_foreach(H.fake->requests, i, rq) {
    cr_assert(json_is_true(json_object_get(rq, "text_matches")),
              "request %zu: messages_json is not the tree's dump", i);
    json_t *msgs = json_object_get(rq, "messages");
    json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
    if (strstr(str(last, "content"), "x.c") != NULL &&
        strcmp(str(last, "role"), "user") == 0)
      with_ectx++;
  }
  cr_assert_eq(with_ectx, 1, "the error context rode in one request");
  teardown();
}

/* A provider that reads text: messages_json only, no tree. */
typedef struct text_model {
  int requests;
  bool tree_seen;
  bool text_valid;
} text_model;

static ag_err_t text_complete(void *self, const ag_request *req,
                              ag_cancel *cancel, ag_delta_fn on_delta,
                              void *delta_user, ag_reply *out,
                              ag_provider_error *perr) {
  (void)cancel;
  (void)on_delta;
  (void)delta_user;
  (void)perr;
  text_model *m = self;
  m->requests++;
  if (req->messages != NULL)
    m->tree_seen = true;
  json_t *j =
      req->messages_json != NULL
          ? json_loadb(req->messages_json, req->messages_json_len, 0, NULL)
          : NULL;
  m->text_valid = json_is_array(j) && json_array_size(j) == 2 &&
                  req->messages_json[req->messages_json_len] == '\0';
  json_decref(j);
  out->text = malloc(3);
  if (out->text != NULL)
    memcpy(out->text, "hi", 3);
  return out->text != NULL ? AG_OK : AG_ENOMEM;
}

static const ag_provider_vtable text_vt = {sizeof(ag_provider_vtable), "text",
                                           text_complete, NULL,
                                           AG_PROVIDER_MESSAGES_TEXT};
/* The layout before `flags`: such a provider reads the tree. */
static const ag_provider_vtable old_vt = {
    offsetof(ag_provider_vtable, flags), "old", text_complete, NULL,
    AG_PROVIDER_MESSAGES_TEXT /* not read: the size leaves it out */};

static void one_turn_with(const ag_provider_vtable *vt, text_model *m) {
  ag_provider *p = NULL;
  ag_agent *a = NULL;
  ag_error_t err;
  cr_assert_eq(ag_provider_new(&p, vt, m, &err), AG_OK, "%s", err.msg);
  ag_agent_opts o;
  ag_agent_opts_init(&o);
  o.provider = p;
  o.system_prompt = "s";
  cr_assert_eq(ag_agent_new(&a, &o, &err), AG_OK, "%s", err.msg);
  ag_turn_outcome out;
  cr_assert_eq(ag_agent_run_turn(a, "u", NULL, &out, &err), AG_OK);
  ASSERT_OUTCOME(out, AG_TURN_COMPLETED, "final_answer");
  ag_turn_outcome_clear(&out);
  size_t len = 0;
  cr_assert_str_eq(ag_agent_history_json(a, &len),
                   "[{\"role\":\"system\",\"content\":\"s\"},{\"role\":"
                   "\"user\",\"content\":\"u\"},{\"role\":\"assistant\","
                   "\"content\":\"hi\"}]");
  json_t *h = ag_agent_history(a);
  cr_assert_eq(json_array_size(h), 3);
  json_decref(h);
  ag_agent_free(a);
  ag_provider_free(p);
}

Test(agent, text_provider_gets_text_not_tree) {
  text_model m = {0};
  one_turn_with(&text_vt, &m);
  cr_assert_eq(m.requests, 1);
  cr_assert_not(m.tree_seen, "a MESSAGES_TEXT provider got a tree");
  cr_assert(m.text_valid, "messages_json is not the 2-message array");
}

Test(agent, provider_without_the_flag_gets_a_tree) {
  text_model m = {0};
  one_turn_with(&old_vt, &m);
  cr_assert(m.tree_seen, "an older vtable got no tree");
  cr_assert(m.text_valid);
}

Test(agent, history_api_null_and_fresh_trees) {
  size_t len = 7;
  cr_assert_null(ag_agent_history_json(NULL, &len));
  cr_assert_eq(len, 0);
  cr_assert_null(ag_agent_history_json(NULL, NULL));
  ag_config cfg = preset("default");
  setup(&cfg, "[{\"model\": [{\"text\": \"ok\"}]}]");
  json_t *a = ag_agent_history(H.agent);
  json_t *b = ag_agent_history(H.agent);
  cr_assert(a != b, "each call is a new tree");
  cr_assert(json_equal(a, b));
  cr_assert_eq(json_array_size(a), 1, "the system prompt");
  json_array_clear(a); /* the caller's to change */
  json_t *c = ag_agent_history(H.agent);
  cr_assert_eq(json_array_size(b), 1);
  cr_assert_eq(json_array_size(c), 1, "the session's history is untouched");
  json_decref(c);
  json_decref(a);
  json_decref(b);
  teardown();
}
