/*
 * src/agent/agent.c - a session (ag_agent): its construction from the
 * options, its guard, scheduler and event sink, and what it lets callers
 * read (history, guard). The turn is loop.c's, the history history.c's.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define DEFAULT_HISTORY_BYTES ((size_t)8 << 20)

/* ------------------------------------------------------------------------ */
/* Small helpers                                                            */
/* ------------------------------------------------------------------------ */

AG_EXTERN void ag_turn_outcome_clear(ag_turn_outcome *o) {
  if (o == NULL)
    return;
  free(o->final_text);
  memset(o, 0, sizeof(*o));
}

void ag__turn_outcome_set(ag_turn_outcome *o, ag_turn_status st,
                          const char *reason, const char *fmt, ...)
    AG__PRINTF(4, 5);
void ag__turn_outcome_set(ag_turn_outcome *o, ag_turn_status st,
                          const char *reason, const char *fmt, ...) {
  o->status = st;
  ag__scopy(o->reason, sizeof(o->reason), reason);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(o->message, sizeof(o->message), fmt, ap);
  va_end(ap);
}

ag_err_t ag__agent_nomem(ag_error_t *err) {
  return ag__set_error(err, AG_ENOMEM, -1, "agent: out of memory");
}

/* ------------------------------------------------------------------------ */
/* Session                                                                  */
/* ------------------------------------------------------------------------ */

AG_EXTERN void ag_agent_opts_init(ag_agent_opts *o) {
  if (o == NULL)
    return;
  memset(o, 0, sizeof(*o));
  o->size = sizeof(*o);
  ag_config_init(&o->config);
  o->max_history_bytes = DEFAULT_HISTORY_BYTES;
}

static void on_attempt(void *user, const ag_attempt *at) {
  ag_agent *a = user;
  const char *id = "";
  if (a->batch_ids != NULL && at->call_index >= 0 &&
      (size_t)at->call_index < a->batch_n)
    id = a->batch_ids[at->call_index];
  ag__ev_tool_attempt(&a->ev, id, at);
}

json_t *ag__msg(const char *role, const char *content) {
  json_t *m = json_object();
  if (m == NULL)
    return NULL;
  if (json_object_set_new(m, "role", json_string(role)) != 0 ||
      json_object_set_new(
          m, "content",
          ag__json_text(content, content != NULL ? strlen(content) : 0)) != 0) {
    json_decref(m);
    return NULL;
  }
  return m;
}

AG_EXTERN ag_err_t ag_agent_new(ag_agent **out, const ag_agent_opts *opts,
                                ag_error_t *err) {
  if (out != NULL)
    *out = NULL;
  if (out == NULL || opts == NULL || opts->provider == NULL)
    return ag__set_error(err, AG_EINVAL, -1,
                         "ag_agent_new: out, opts and opts->provider are "
                         "required");
  ag_agent_opts vopts;
  ag_agent_opts_init(&vopts);
  /* this layout is the first versioned one: its size is the minimum */
  if (ag__opts_read(&vopts, sizeof(vopts), opts, sizeof(vopts),
                    "ag_agent_new: opts", err) != AG_OK)
    return AG_EINVAL;
  opts = &vopts;
  ag_agent *a = calloc(1, sizeof(*a));
  if (a == NULL)
    return ag__agent_nomem(err);
  a->cfg = opts->config;
  a->provider = opts->provider;
  a->human = opts->human;
  a->human_user = opts->human_user;
  a->on_delta = opts->on_delta;
  a->delta_user = opts->delta_user;
  a->max_history_bytes = opts->max_history_bytes > 0 ? opts->max_history_bytes
                                                     : DEFAULT_HISTORY_BYTES;
  a->events_full = opts->events_full;
  a->rng = opts->seed != 0 ? opts->seed
                           : (uint64_t)ag_now_ms() * 0x9E3779B97F4A7C15ull;
  if (a->rng == 0)
    a->rng = 0x2545F4914F6CDD1Dull;

  ag_err_t rc = ag__ev_init(&a->ev, opts->on_event, opts->event_user);
  if (rc != AG_OK) {
    free(a);
    return ag__agent_nomem(err);
  }
  rc = ag_guard_new(&a->guard, &a->cfg, NULL, err);
  if (rc != AG_OK)
    goto fail;

  a->reg = opts->tools;
  if (a->reg == NULL) {
    rc = ag_registry_new(&a->own_reg, err);
    if (rc != AG_OK)
      goto fail;
    a->reg = a->own_reg;
  }
  ag_scheduler_opts so;
  ag_scheduler_opts_init(&so);
  so.approve = opts->approve;
  so.approve_user = opts->approve_user;
  so.on_attempt = on_attempt;
  so.attempt_user = a;
  so.jitter_seed = opts->seed;
  rc = ag_scheduler_new(&a->sched, a->reg, &a->cfg, &so, err);
  if (rc != AG_OK)
    goto fail;

  rc = AG_ENOMEM;
  ag__buf_init(&a->text, a->max_history_bytes < SIZE_MAX - HISTORY_OVER_CAP
                             ? a->max_history_bytes + HISTORY_OVER_CAP
                             : SIZE_MAX);
  a->ectx = malloc(ECTX_CAP);
  if (ag__buf_add(&a->text, "[]", 2) != AG_OK || a->ectx == NULL)
    goto fail_nomem;
  if (opts->system_prompt != NULL) {
    /* the history's system message is the only copy of the prompt */
    json_t *m = ag__msg("system", opts->system_prompt);
    bool ok = m != NULL && ag__hist_push(a, m, false);
    json_decref(m);
    if (!ok)
      goto fail_nomem;
  }
  a->stored_bytes = a->text.len; /* brackets and system message */
  *out = a;
  return AG_OK;

fail_nomem:
  ag__agent_nomem(err);
fail:
  ag_agent_free(a);
  return rc;
}

AG_EXTERN void ag_agent_free(ag_agent *a) {
  if (a == NULL)
    return;
  ag_scheduler_free(a->sched);
  ag_registry_free(a->own_reg);
  ag_guard_free(a->guard);
  ag__buf_free(&a->text);
  free(a->msgs_mem);
  free(a->turns);
  free(a->ectx);
  ag__ev_destroy(&a->ev);
  free(a);
}

AG_EXTERN json_t *ag_agent_history(const ag_agent *a) {
  if (a == NULL)
    return NULL;
  return json_loadb(a->text.p + a->base, a->text.len - a->base, JSON_ALLOW_NUL,
                    NULL);
}

AG_EXTERN const char *ag_agent_history_json(const ag_agent *a, size_t *len) {
  if (len != NULL)
    *len = a != NULL ? a->text.len - a->base : 0;
  return a != NULL ? a->text.p + a->base : NULL;
}

AG_EXTERN const ag_guard *ag_agent_guard(const ag_agent *a) {
  return a != NULL ? a->guard : NULL;
}

/* ------------------------------------------------------------------------ */
