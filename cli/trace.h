/*
 * cli/trace.h - OpenTelemetry spans of `agentguard run`'s turns, made from
 * the agent's events (docs/events.md) and handed to the proxy library's
 * exporter (ag_otlp_*, agentguard/proxy.h). Per turn, as the GenAI
 * semantic conventions name them: an `invoke_agent` span from turn_start
 * to turn_end, and under it a `chat` span per model request (model_request
 * to model_response, with the tokens) and an `execute_tool` span per call
 * (tool_call to tool_result or tool_blocked). docs/run.md, "Traces".
 */
#ifndef AG_CLI_TRACE_H
#define AG_CLI_TRACE_H

#include <stdint.h>

#include "agentguard.h"
#include "agentguard/proxy.h"

typedef struct cli_trace cli_trace;

/* Spans to `exp` (borrowed) for a session with `model` from `provider`
 * (its kind: openai, anthropic, gemini, ...), the session having started
 * at `start_wall_ns` (the events' t_ms count from there). `traceparent`
 * (the TRACEPARENT variable; may be NULL) makes each turn a child of that
 * span. NULL when out of memory. */
cli_trace *cli_trace_new(ag_otlp *exp, const char *model, const char *provider,
                         const char *traceparent, int64_t start_wall_ns);

/* Takes one event (borrowed). */
void cli_trace_event(cli_trace *t, const json_t *ev);

/* Frees (spans still open are dropped). */
void cli_trace_free(cli_trace *t);

#endif /* AG_CLI_TRACE_H */
