/*
 * tests/runtime/agent_fixture.c - the fake provider, the tools and the
 * harness of test_agent (agent_fixture.h).
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent_fixture.h"

/* ------------------------------------------------------------------------ */
/* The fake provider                                                        */
/* ------------------------------------------------------------------------ */

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
int tool_runs;

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

harness H;

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
ag_config preset(const char *name) {
  ag_config cfg;
  ag_error_t err;
  cr_assert_eq(ag_config_preset(&cfg, name, &err), AG_OK, "%s", err.msg);
  cfg.retry.max_retries = 0;
  cfg.network.delay_ms = 1;
  cfg.network.max_delay_ms = 5;
  return cfg;
}

void setup_with(const ag_config *cfg, const char *turns, setup_opts so) {
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

void setup(const ag_config *cfg, const char *turns) {
  setup_opts so = {0};
  setup_with(cfg, turns, so);
}

void teardown(void) {
  ag_agent_free(H.agent);
  ag_provider_free(H.provider);
  ag_registry_free(H.reg);
  json_decref(H.events);
  json_decref(H.hists);
  pthread_mutex_destroy(&H.mu);
}

ag_turn_outcome run(const char *user) {
  ag_turn_outcome out;
  ag_error_t err;
  cr_assert_eq(ag_agent_run_turn(H.agent, user, NULL, &out, &err), AG_OK, "%s",
               err.msg);
  return out;
}

/* Events named `name`, in order (borrowed from H.events, new array). */
json_t *events_named(const char *name) {
  json_t *r = json_array();
  size_t i;
  json_t *e;
  json_array_foreach(H.events, i, e) {
    if (strcmp(json_string_value(json_object_get(e, "event")), name) == 0)
      json_array_append(r, e);
  }
  return r;
}

size_t count_events(const char *name) {
  json_t *a = events_named(name);
  size_t n = json_array_size(a);
  json_decref(a);
  return n;
}

const char *str(const json_t *o, const char *key) {
  const char *s = json_string_value(json_object_get(o, key));
  return s != NULL ? s : "(null)";
}

/* The history as a tree (new each call, kept until teardown). Checks on
 * the way that the stored text is exactly the tree's compact dump. */
const json_t *history(void) {
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
void assert_history_well_formed(void) {
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

size_t count_role(const char *role) {
  size_t n = 0, i;
  json_t *m;
  json_array_foreach(history(), i, m) {
    if (strcmp(str(m, "role"), role) == 0)
      n++;
  }
  return n;
}

/* The content of the last message with `role`. */
const char *last_content(const char *role) {
  const json_t *h = history();
  for (size_t i = json_array_size(h); i-- > 0;) {
    json_t *m = json_array_get(h, i);
    if (strcmp(str(m, "role"), role) == 0)
      return str(m, "content");
  }
  return "(none)";
}

json_t *request(size_t i) {
  return json_array_get(H.fake->requests, i);
}
