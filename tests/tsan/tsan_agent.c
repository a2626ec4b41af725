/*
 * tests/tsan/tsan_agent.c - the agentic loop with parallel tools, as a plain
 * program for ThreadSanitizer (test_agent, tests/runtime/test_agent.c and
 * agent_*.c, holds the loop's behaviour):
 *   1. three turns, each a batch of 6 parallel calls (one of them failing
 *      once and retried) then a final answer; tool_attempt events arrive
 *      from pool threads and on_event must never run concurrently;
 *   2. a caller cancel from another thread while 4 tools hang on the pool;
 *   3. the turn deadline while 4 tools hang on the pool;
 *   4. the session answers again after both.
 * The provider is written here and is stateless: at the start of a turn
 * (the last message is the user's, "<tool>:<count>") it asks for <count>
 * parallel calls of <tool>; after tool results it answers "done".
 * Exits 0 when every check holds; the first failed check prints both sides
 * and exits 1.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agentguard.h"
#include "tsan_common.h"

/* ---- provider ----------------------------------------------------------- */

static ag_err_t fake_complete(void *self, const ag_request *req,
                              ag_cancel *cancel, ag_delta_fn on_delta,
                              void *delta_user, ag_reply *out,
                              ag_provider_error *perr) {
  (void)self;
  (void)cancel;
  (void)on_delta;
  (void)delta_user;
  (void)perr;
  size_t n = json_array_size(req->messages);
  json_t *last = json_array_get(req->messages, n - 1);
  const char *role = json_string_value(json_object_get(last, "role"));
  const char *content = json_string_value(json_object_get(last, "content"));
  if (strcmp(role, "user") != 0 || content == NULL) {
    out->text = strdup("done");
    return out->text != NULL ? AG_OK : AG_ENOMEM;
  }
  char tool[32];
  int count = 0;
  if (sscanf(content, "%31[a-z]:%d", tool, &count) != 2)
    count = 0;
  for (int i = 0; i < count; i++) {
    char args[32];
    int len = snprintf(args, sizeof(args), "{\"i\":%d}", i);
    if (ag_reply_add_call(out, NULL, tool, args, (size_t)len) != AG_OK)
      return AG_ENOMEM;
  }
  return AG_OK;
}

static const ag_provider_vtable fake_vt = {sizeof(ag_provider_vtable), "fake",
                                           fake_complete, NULL, 0};

/* ---- tools -------------------------------------------------------------- */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int flaky_seen[64]; /* per turn * 8 + i: attempts so far */
static int turn_no;

/* Waits 5 ms on its token, then answers; call i == 2 fails once. */
static ag_tool_status work_tool(void *user, const json_t *args,
                                ag_cancel *cancel, ag_output *out) {
  (void)user;
  int i = (int)json_integer_value(json_object_get(args, "i"));
  if (ag_cancel_wait(cancel, 5) != AG_CANCEL_NONE)
    return AG_TOOL_CANCELLED;
  if (i == 2) {
    pthread_mutex_lock(&mu);
    int k = turn_no * 8 + i;
    int seen = k >= 0 && k < 64 ? flaky_seen[k]++ : 1;
    pthread_mutex_unlock(&mu);
    if (seen == 0) {
      ag_output_printf(out, "Connection reset by peer");
      ag_output_set_transient(out, true);
      return AG_TOOL_ERROR;
    }
  }
  ag_output_printf(out, "worked %d", i);
  return AG_TOOL_OK;
}

static ag_tool_status hang_tool(void *user, const json_t *args,
                                ag_cancel *cancel, ag_output *out) {
  (void)user;
  (void)args;
  (void)out;
  ag_cancel_reason r = ag_cancel_wait(cancel, 20000);
  return r == AG_CANCEL_TIMEOUT ? AG_TOOL_TIMEOUT : AG_TOOL_CANCELLED;
}

/* ---- events ------------------------------------------------------------- */

static atomic_int inside;
static atomic_int events, attempts, turn_ends;
static atomic_int max_inside;

static void on_event(void *user, const json_t *ev) {
  (void)user;
  int now = atomic_fetch_add(&inside, 1) + 1;
  if (now > atomic_load(&max_inside))
    atomic_store(&max_inside, now);
  const char *name = json_string_value(json_object_get(ev, "event"));
  CHECK(name != NULL, "event without a name");
  CHECK(json_is_integer(json_object_get(ev, "turn")) &&
            json_is_integer(json_object_get(ev, "iteration")) &&
            json_is_integer(json_object_get(ev, "t_ms")),
        "%s lacks a common field", name);
  char *line = json_dumps(ev, JSON_COMPACT);
  CHECK(line != NULL, "%s does not serialize", name);
  free(line);
  if (strcmp(name, "tool_attempt") == 0)
    atomic_fetch_add(&attempts, 1);
  if (strcmp(name, "turn_end") == 0)
    atomic_fetch_add(&turn_ends, 1);
  atomic_fetch_add(&events, 1);
  tsan_sleep_us(50); /* widen the window a concurrent call would hit */
  atomic_fetch_sub(&inside, 1);
}

/* ---- helpers ------------------------------------------------------------ */

typedef struct canceller {
  ag_cancel *token;
  long after_ms;
} canceller;

static void *cancel_later(void *arg) {
  canceller *c = arg;
  tsan_sleep_ms(c->after_ms);
  ag_cancel_cancel(c->token, AG_CANCEL_USER);
  return NULL;
}

static void add_tool(ag_registry *reg, const char *name, ag_tool_fn fn) {
  ag_tool_def d;
  ag_tool_def_init(&d);
  d.name = name;
  d.fn = fn;
  ag_error_t err;
  ag_error_clear(&err);
  ag_err_t rc = ag_registry_add(reg, &d, &err);
  CHECK(rc == AG_OK, "ag_registry_add %s: %s", name, err.msg);
}

static ag_turn_outcome run(ag_agent *a, const char *msg, ag_cancel *cancel) {
  ag_turn_outcome o;
  ag_error_t err;
  ag_error_clear(&err);
  ag_err_t rc = ag_agent_run_turn(a, msg, cancel, &o, &err);
  CHECK(rc == AG_OK, "run_turn: %s (%s)", ag_err_name(rc), err.msg);
  return o;
}

#define CHECK_STATUS(o, want)                                                  \
  CHECK((o).status == (want), "status %s (%s: %s), want %s",                   \
        ag_turn_status_name((o).status), (o).reason, (o).message,              \
        ag_turn_status_name(want))

int main(void) {
  ag_error_t err;
  ag_error_clear(&err);
  ag_provider *p = NULL;
  CHECK(ag_provider_new(&p, &fake_vt, NULL, &err) == AG_OK, "%s", err.msg);
  ag_registry *reg = NULL;
  CHECK(ag_registry_new(&reg, &err) == AG_OK, "%s", err.msg);
  add_tool(reg, "work", work_tool);
  add_tool(reg, "hang", hang_tool);

  ag_agent_opts o;
  ag_agent_opts_init(&o);
  CHECK(ag_config_preset(&o.config, "default", &err) == AG_OK, "%s", err.msg);
  o.config.loop.parallel = true;
  o.config.loop.max_parallel = 4;
  o.config.retry.max_retries = 2;
  o.config.retry.delay_ms = 1;
  o.config.retry.max_delay_ms = 2;
  o.config.loop.max_turn_duration_ms = 0;
  o.provider = p;
  o.tools = reg;
  o.system_prompt = "tsan";
  o.on_event = on_event;
  o.seed = 7;
  ag_agent *a = NULL;
  CHECK(ag_agent_new(&a, &o, &err) == AG_OK, "%s", err.msg);

  /* 1. parallel batches with a retry, three turns */
  for (int t = 0; t < 3; t++) {
    pthread_mutex_lock(&mu);
    turn_no = t;
    pthread_mutex_unlock(&mu);
    ag_turn_outcome out = run(a, "work:6", NULL);
    CHECK_STATUS(out, AG_TURN_COMPLETED);
    CHECK(out.tool_calls == 6, "turn %d: %d tool calls, want 6", t + 1,
          out.tool_calls);
    CHECK(out.iterations == 2, "turn %d: %d iterations, want 2", t + 1,
          out.iterations);
    CHECK(strcmp(out.final_text, "done") == 0, "final text %s", out.final_text);
    ag_turn_outcome_clear(&out);
  }
  CHECK(atomic_load(&attempts) == 3 * 7, "%d tool_attempt events, want 21",
        atomic_load(&attempts));
  CHECK(atomic_load(&turn_ends) == 3, "%d turn_end events",
        atomic_load(&turn_ends));

  /* 2. a caller cancel from another thread during a parallel batch */
  ag_cancel *tok = NULL;
  CHECK(ag_cancel_new(&tok, NULL, INT64_MAX, AG_CANCEL_DEADLINE, &err) == AG_OK,
        "%s", err.msg);
  canceller c = {tok, 30};
  pthread_t th;
  CHECK(pthread_create(&th, NULL, cancel_later, &c) == 0, "pthread_create");
  long long t0 = tsan_now_ms();
  ag_turn_outcome out = run(a, "hang:4", tok);
  long long took = tsan_now_ms() - t0;
  pthread_join(th, NULL);
  CHECK_STATUS(out, AG_TURN_CANCELLED);
  CHECK(strcmp(out.reason, "cancelled") == 0, "reason %s", out.reason);
  CHECK(took < 30 + 2000, "cancel took %lld ms", took);
  ag_turn_outcome_clear(&out);
  ag_cancel_free(tok);

  ag_agent_free(a);

  /* 3. the turn deadline during a parallel batch */
  o.config.loop.max_turn_duration_ms = 60;
  CHECK(ag_agent_new(&a, &o, &err) == AG_OK, "%s", err.msg);
  t0 = tsan_now_ms();
  out = run(a, "hang:4", NULL);
  took = tsan_now_ms() - t0;
  CHECK_STATUS(out, AG_TURN_TIMED_OUT);
  CHECK(strcmp(out.reason, "turn_timeout") == 0, "reason %s", out.reason);
  CHECK(took >= 55 && took < 60 + 2000, "deadline took %lld ms", took);
  ag_turn_outcome_clear(&out);

  /* 4. the session goes on */
  pthread_mutex_lock(&mu);
  turn_no = 5;
  pthread_mutex_unlock(&mu);
  out = run(a, "work:3", NULL);
  CHECK_STATUS(out, AG_TURN_COMPLETED);
  ag_turn_outcome_clear(&out);

  CHECK(atomic_load(&max_inside) == 1, "on_event ran %d at once",
        atomic_load(&max_inside));
  CHECK(atomic_load(&turn_ends) == 6, "%d turn_end events, want 6",
        atomic_load(&turn_ends));

  /* the history stays valid JSON with every call answered */
  json_t *h = ag_agent_history(a);
  CHECK(h != NULL, "history does not parse");
  char *dump = json_dumps(h, JSON_COMPACT);
  CHECK(dump != NULL, "history does not serialize");
  free(dump);
  size_t i;
  json_t *m;
  size_t want_tools = 0, tools = 0;
  json_array_foreach(h, i, m) {
    want_tools += json_array_size(json_object_get(m, "tool_calls"));
    const char *role = json_string_value(json_object_get(m, "role"));
    if (strcmp(role, "tool") == 0)
      tools++;
  }
  CHECK(tools == want_tools, "%zu tool messages for %zu calls", tools,
        want_tools);
  json_decref(h);

  ag_agent_free(a);
  ag_registry_free(reg);
  ag_provider_free(p);
  printf("tsan_agent: ok (%d events)\n", atomic_load(&events));
  return 0;
}
