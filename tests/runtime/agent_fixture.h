/*
 * tests/runtime/agent_fixture.h - the fixture of test_agent (its cases are
 * in test_agent.c, agent_session.c and agent_history.c; agent_fixture.c
 * holds what is declared here): a fake provider (a script of replies per
 * turn, provider errors with status and Retry-After, replies that hang
 * until cancelled; every request it receives is recorded), native tools,
 * and the harness around one agent: its events, approvals and human, a
 * turn run, and checks on the events and the history.
 */
#ifndef AG_TESTS_AGENT_FIXTURE_H
#define AG_TESTS_AGENT_FIXTURE_H

#include <criterion/criterion.h>
#include <jansson.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agentguard.h"

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

extern harness H;

/* How many times the tools ran (each tool counts its runs). */
extern int tool_runs;

/* The test config: `preset` with fast retries and no tool retries. */
ag_config preset(const char *name);

typedef struct setup_opts {
  bool with_human;
  size_t max_history_bytes;
  bool no_tools;
} setup_opts;

/* A fresh H: the fake provider with the script `turns`, every tool, an
 * agent; teardown frees it all. */
void setup_with(const ag_config *cfg, const char *turns, setup_opts so);
void setup(const ag_config *cfg, const char *turns);
void teardown(void);
ag_turn_outcome run(const char *user);

#define ASSERT_OUTCOME(o, st, why)                                             \
  do {                                                                         \
    cr_assert_eq((o).status, (st), "status %s (%s: %s), want %s",              \
                 ag_turn_status_name((o).status), (o).reason, (o).message,     \
                 ag_turn_status_name(st));                                     \
    cr_assert_str_eq((o).reason, (why), "reason %s (%s), want %s", (o).reason, \
                     (o).message, (why));                                      \
  } while (0)

/* Events named `name`, in order (borrowed from H.events, new array). */
json_t *events_named(const char *name);
size_t count_events(const char *name);
const char *str(const json_t *o, const char *key);
/* The history as a tree (new each call, kept until teardown). */
const json_t *history(void);
/* Every assistant tool call has exactly one tool message, right after its
 * assistant message, in order. */
void assert_history_well_formed(void);
size_t count_role(const char *role);
/* The content of the last message with `role`. */
const char *last_content(const char *role);
/* The fake provider's request `i` (from 0), as recorded. */
json_t *request(size_t i);

/* A model reply that calls echo with the same arguments every time. */
#define STUCK_ECHO                                                             \
  "{\"tool_calls\": [{\"name\": \"echo\", \"arguments\": {\"q\": 1}}]}"

#endif
