/*
 * agentguard.h - the public API of agentguard, a tool-loop safety runtime.
 *
 * One header per layer:
 *   agentguard/common.h  version, error codes, ag_error_t, ag_free
 *   agentguard/base.h    the clock and cancellation tokens (deadlines)
 *   agentguard/core.h    the guard: config and presets, signatures,
 *                        classifier, compact errors, detectors (pure)
 *   agentguard/content.h the content-loop detector over a reply's text (pure)
 *   agentguard/exec.h    cancellation, retries, tool registry, native and
 *                        subprocess tools, the two-phase scheduler
 *   agentguard/providers.h  model clients: the interface, scripted provider
 *   agentguard/agent.h   the agentic loop: sessions, turns, events
 *   agentguard/audit.h   recorded runs (trajectories, transcripts, event
 *                        logs) replayed through the guard
 *
 * Library-wide thread-safety: functions without an object are safe from any
 * thread; an object is used from one thread at a time unless its header says
 * otherwise. Nothing outside include/ is API.
 */
#ifndef AGENTGUARD_H
#define AGENTGUARD_H

#include "agentguard/common.h"
#include "agentguard/base.h"
#include "agentguard/core.h"
#include "agentguard/content.h"
#include "agentguard/exec.h"
#include "agentguard/providers.h"
#include "agentguard/agent.h"
#include "agentguard/audit.h"

#endif /* AGENTGUARD_H */
