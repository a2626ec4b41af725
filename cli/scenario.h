/*
 * cli/scenario.h - loading a scenario file for `agentguard simulate`: the
 * whole file is read, parsed and checked before anything runs, and turned
 * into what the agent needs (a config, a tool registry with scripted and
 * subprocess tools, a scripted provider, approval and human callbacks) plus
 * the per-turn expectations of --check. docs/scenarios.md is the format.
 */
#ifndef AG_CLI_SCENARIO_H
#define AG_CLI_SCENARIO_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "agentguard.h"

/* The largest scenario file read. */
#define CLI_SCENARIO_MAX_BYTES (4 * 1024 * 1024)

/* What --check compares after a turn. Strings are borrowed from the
 * scenario document. */
typedef struct cli_expect {
  bool present;                    /* the turn has an "expect" */
  const char *status;              /* required when present */
  const char *reason;              /* NULL: not checked */
  const char *final_text_contains; /* NULL: not checked */
  const char *message_contains;    /* NULL: not checked */
  int iterations;                  /* -1: not checked */
  int tool_calls;                  /* -1: not checked */
  const json_t *events; /* array of event patterns (borrowed), or NULL */
} cli_expect;

/* One turn: the user message and its expectations. */
typedef struct cli_turn {
  const char *user; /* borrowed from the document */
  cli_expect expect;
} cli_turn;

typedef struct cli_scenario cli_scenario;

/* Where the config comes from, besides the scenario itself. */
typedef struct cli_scenario_opts {
  const char *path;        /* the scenario file; required */
  const char *preset;      /* --preset NAME, or NULL */
  const char *config_path; /* --config FILE, or NULL */
} cli_scenario_opts;

/*
 * Reads and checks the scenario. On success returns 0 and sets *out. On any
 * problem prints one message to `errf` naming the file and the place
 * ("FILE:LINE:COL: ..." for JSON syntax, "FILE: tools.x.responses[2]: ..."
 * otherwise), sets *out to NULL and returns the exit code: AG_EXIT_USAGE for
 * bad input, AG_EXIT_FAILURE for out of memory or a system failure.
 */
int cli_scenario_load(cli_scenario **out, const cli_scenario_opts *opts,
                      FILE *errf);

/* Frees a scenario (after the agent that used it). NULL does nothing. */
void cli_scenario_free(cli_scenario *s);

/* The effective config: scenario, then --preset, then --config FILE. */
const ag_config *cli_scenario_config(const cli_scenario *s);

/* The tools (borrowed until cli_scenario_free). */
const ag_registry *cli_scenario_registry(const cli_scenario *s);

/*
 * Hands over the scripted provider built from "turns" (caller-owns: free
 * with ag_provider_free). Returns NULL when it was already taken.
 */
ag_provider *cli_scenario_take_provider(cli_scenario *s);

/* Turns, in order (borrowed until cli_scenario_free). */
size_t cli_scenario_turn_count(const cli_scenario *s);
const cli_turn *cli_scenario_turn(const cli_scenario *s, size_t i);

/* The scenario's "description" (borrowed), or NULL. */
const char *cli_scenario_description(const cli_scenario *s);

/* Whether any turn has an "expect". */
bool cli_scenario_has_expect(const cli_scenario *s);

/*
 * Fills the callbacks of `o` that the scenario scripts: approve (always: the
 * "approvals" answers, default true) and human (only when the scenario has a
 * "human" list; otherwise NULL, so escalations end the turn escalated).
 */
void cli_scenario_callbacks(cli_scenario *s, ag_agent_opts *o);

/*
 * Helpers shared by the CLI's files.
 */

/* A JSON value's type for messages: "object", "integer", "boolean", ... */
const char *cli_json_type(const json_t *v);

/*
 * Reads a whole file of at most `cap` bytes into *buf (malloc'd,
 * NUL-terminated; free it). Returns 0, or -1 with a message naming the file
 * and the errno text (or the size limit) in msg.
 */
int cli_read_file(const char *path, size_t cap, char **buf, size_t *len,
                  char *msg, size_t msg_cap);

#endif /* AG_CLI_SCENARIO_H */
