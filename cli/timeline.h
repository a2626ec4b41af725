/*
 * cli/timeline.h - a readable account of a run, written from the agent's
 * events (docs/events.md): per iteration what the model asked for, the
 * attempts and retries, approvals, what the guard decided and why, and the
 * outcome of each turn. docs/cli.md shows an example.
 */
#ifndef AG_CLI_TIMELINE_H
#define AG_CLI_TIMELINE_H

#include <stdbool.h>
#include <stdio.h>

#include "agentguard.h"

typedef struct cli_timeline cli_timeline;

/*
 * A timeline writing to `out` (borrowed; flushed after every event), with
 * ANSI colours when `color`. Returns NULL when out of memory.
 */
cli_timeline *cli_timeline_new(FILE *out, bool color);
void cli_timeline_free(cli_timeline *t);

/* Leaves the final text out of each turn's outcome: for `run` when the
 * answer is already on the same terminal (stdout), so it shows once. */
void cli_timeline_omit_final_text(cli_timeline *t, bool omit);

/* Writes what `event` (borrowed) adds to the story. Unknown events and
 * missing fields are skipped, never fatal. */
void cli_timeline_event(cli_timeline *t, const json_t *event);

/*
 * The header of a timeline: the scenario file and its preset, then its
 * description (may be NULL) wrapped to the terminal's usual 80 columns.
 */
void cli_timeline_header(cli_timeline *t, const char *file, const char *preset,
                         const char *description);

/*
 * The one-line outcome of a turn (1-based `turn`) for runs without a
 * timeline: "turn 1: stopped (identical_calls) after 5 iterations, 4 tool
 * calls: MESSAGE", and the final text on a second line when there is one.
 * MESSAGE and the final text are taken from `turn_end` (the turn's turn_end
 * event, whose texts are redacted) when it is not NULL.
 */
void cli_outcome_line(FILE *out, size_t turn, const ag_turn_outcome *o,
                      const json_t *turn_end);

/*
 * Writes `s` (`len` bytes) on one line: newlines and tabs become spaces,
 * other control characters '?', cut to about `max` bytes on a UTF-8
 * boundary with "..." when longer.
 */
void cli_put_oneline(FILE *out, const char *s, size_t len, size_t max);

#endif /* AG_CLI_TIMELINE_H */
