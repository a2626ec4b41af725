/*
 * tests/runtime/test_opts.c - versioned options structs (docs/c-api.md,
 * "Options structs"): ag_scheduler_opts and ag_agent_opts start with a
 * `size` that their _init function sets; a constructor refuses a struct
 * that was never initialised, accepts a longer one from a newer header
 * while its extra bytes are zero, and refuses it when they are not.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdint.h>
#include <string.h>

#include "agentguard.h"

/* ---- the scheduler ------------------------------------------------------ */

/* What a newer header might look like: the same struct, a field appended. */
typedef struct newer_scheduler_opts {
  ag_scheduler_opts v1;
  uint64_t future_field;
} newer_scheduler_opts;

static ag_err_t new_scheduler(const ag_scheduler_opts *o, ag_error_t *err) {
  ag_registry *reg = NULL;
  cr_assert_eq(ag_registry_new(&reg, err), AG_OK);
  ag_config cfg;
  ag_config_init(&cfg);
  ag_scheduler *s = (ag_scheduler *)&cfg; /* must come back NULL on error */
  ag_err_t rc = ag_scheduler_new(&s, reg, &cfg, o, err);
  if (rc != AG_OK)
    cr_expect_null(s);
  ag_scheduler_free(s);
  ag_registry_free(reg);
  return rc;
}

Test(opts, scheduler_opts_init_sets_the_size) {
  ag_scheduler_opts o;
  memset(&o, 0xAB, sizeof(o));
  ag_scheduler_opts_init(&o);
  cr_expect_eq(o.size, sizeof(ag_scheduler_opts));
  ag_error_t err;
  cr_expect_eq(new_scheduler(&o, &err), AG_OK, "%s", err.msg);
  cr_expect_eq(new_scheduler(NULL, &err), AG_OK, "%s", err.msg);
}

Test(opts, scheduler_refuses_opts_that_were_never_initialised) {
  ag_scheduler_opts o;
  memset(&o, 0, sizeof(o));
  ag_error_t err;
  cr_expect_eq(new_scheduler(&o, &err), AG_EINVAL);
  cr_expect(strstr(err.msg, "ag_scheduler_new: opts: size is 0") != NULL,
            "message: %s", err.msg);
  cr_expect(strstr(err.msg, "_init") != NULL, "message: %s", err.msg);
  /* garbage, as an uninitialised struct holds: refused, never read */
  memset(&o, 0xAB, sizeof(o));
  cr_expect_eq(new_scheduler(&o, &err), AG_EINVAL);
  cr_expect(strstr(err.msg, "size is") != NULL, "message: %s", err.msg);
}

Test(opts, scheduler_takes_a_newer_struct_whose_new_fields_are_zero) {
  newer_scheduler_opts n;
  memset(&n, 0, sizeof(n));
  ag_scheduler_opts_init(&n.v1);
  n.v1.size = sizeof(n);
  ag_error_t err;
  cr_expect_eq(new_scheduler(&n.v1, &err), AG_OK, "%s", err.msg);
  n.future_field = 7;
  cr_expect_eq(new_scheduler(&n.v1, &err), AG_EINVAL);
  cr_expect(strstr(err.msg, "past the") != NULL, "message: %s", err.msg);
}

/* ---- the agent ---------------------------------------------------------- */

typedef struct newer_agent_opts {
  ag_agent_opts v1;
  uint64_t future_field;
} newer_agent_opts;

static ag_provider *scripted(void) {
  json_error_t je;
  json_t *turns = json_loads(
      "[{\"user\": \"hi\", \"model\": [{\"text\": \"hello\"}]}]", 0, &je);
  cr_assert_not_null(turns, "%s", je.text);
  ag_provider *p = NULL;
  ag_error_t err;
  cr_assert_eq(ag_provider_scripted_new(&p, turns, &err), AG_OK, "%s", err.msg);
  json_decref(turns);
  return p;
}

/* Creates an agent from `o` and, when that works, runs one turn with it. */
static ag_err_t new_agent(ag_agent_opts *o, ag_error_t *err) {
  ag_provider *p = scripted();
  o->provider = p;
  ag_agent *a = (ag_agent *)o; /* must come back NULL on error */
  ag_err_t rc = ag_agent_new(&a, o, err);
  if (rc != AG_OK) {
    cr_expect_null(a);
  } else {
    ag_turn_outcome out;
    cr_expect_eq(ag_agent_run_turn(a, "hi", NULL, &out, err), AG_OK);
    cr_expect_eq(out.status, AG_TURN_COMPLETED, "%s", out.message);
    cr_expect_str_eq(out.final_text, "hello");
    ag_turn_outcome_clear(&out);
  }
  ag_agent_free(a);
  ag_provider_free(p);
  return rc;
}

Test(opts, agent_opts_init_sets_the_size) {
  ag_agent_opts o;
  memset(&o, 0xAB, sizeof(o));
  ag_agent_opts_init(&o);
  cr_expect_eq(o.size, sizeof(ag_agent_opts));
  ag_error_t err;
  cr_expect_eq(new_agent(&o, &err), AG_OK, "%s", err.msg);
}

Test(opts, agent_refuses_opts_that_were_never_initialised) {
  ag_agent_opts o;
  memset(&o, 0, sizeof(o));
  ag_config_init(&o.config);
  ag_error_t err;
  cr_expect_eq(new_agent(&o, &err), AG_EINVAL);
  cr_expect(strstr(err.msg, "ag_agent_new: opts: size is 0") != NULL,
            "message: %s", err.msg);
}

Test(opts, agent_takes_a_newer_struct_whose_new_fields_are_zero) {
  newer_agent_opts n;
  memset(&n, 0, sizeof(n));
  ag_agent_opts_init(&n.v1);
  n.v1.size = sizeof(n);
  ag_error_t err;
  cr_expect_eq(new_agent(&n.v1, &err), AG_OK, "%s", err.msg);
  n.future_field = 1;
  cr_expect_eq(new_agent(&n.v1, &err), AG_EINVAL);
  cr_expect(strstr(err.msg, "past the") != NULL, "message: %s", err.msg);
}
