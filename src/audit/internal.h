/*
 * src/audit/internal.h - what the audit layer shares with the layers above
 * it (ag__ prefix; not installed, not API): the replay of one recorded
 * step, the one sequence of guard calls that ag_auditor_run and the proxy's
 * decision both make (audit.c).
 */
#ifndef AG_AUDIT_INTERNAL_H
#define AG_AUDIT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "agentguard/audit.h"

/* ag_trajectory_parse, with the tape reader of the neutral format on or
 * off (`tape` false: jansson's tree only; for the tests that hold the two
 * readings equal). */
ag_err_t ag__trajectory_parse_with(ag_trajectory **out, const char *buf,
                                   size_t len, const ag_traj_opts *opts,
                                   ag_error_t *err, bool tape);

/* A batch's arrays, grown to the largest step replayed. `lent`: the
 * arrays are the caller's (cap of each), never freed; a larger batch
 * moves to allocated ones. Their contents do not outlive a step. */
typedef struct ag__replay_scratch {
  size_t cap;
  ag_call *calls;
  ag_call_check *checks;
  ag_result *results;
  bool lent;
} ag__replay_scratch;

void ag__replay_scratch_free(ag__replay_scratch *s);

/*
 * One recorded step through g as the live loop would have met it:
 * ag_guard_begin_iteration, the reply's tokens, its text (the content
 * loop), then the empty-reply, refused-reply or no-call rules, or
 * ag_guard_run_batch with the recorded results standing in for the tools.
 * t_req, t_resp, t_done: the step's request, response and done times (all
 * 0 when the run is untimed: time stands still). *nudged (may be NULL)
 * counts the calls held back with a nudge. Returns the deciding action, v
 * filled when it is not AG_ALLOW, or -1 when the scratch cannot grow (out
 * of memory).
 */
int ag__replay_step(ag_guard *g, const ag_traj_step *st, int64_t t_req,
                    int64_t t_resp, int64_t t_done, ag__replay_scratch *s,
                    ag_verdict *v, int *nudged);

/* Every turn of t through g, untimed, each begun with ag_guard_begin_turn,
 * until a stop or escalation: the decision on a turn built in memory (the
 * proxy's). Returns the last action (v filled), or -1 when out of memory. */
int ag__replay_untimed(ag_guard *g, const ag_trajectory *t, ag_verdict *v);

#endif /* AG_AUDIT_INTERNAL_H */
