/*
 * tests/unit/audit_fixture.h - what test_audit's cases share (they are in
 * test_audit.c, audit_formats.c and audit_replay.c; audit_fixture.c holds
 * what is declared here): reading a file, parsing a trajectory that must
 * parse or must fail, a preset or a JSON config, auditing a run, and a
 * neutral run of one repeated call.
 */
#ifndef AG_TESTS_AUDIT_FIXTURE_H
#define AG_TESTS_AUDIT_FIXTURE_H

#include <criterion/criterion.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agentguard.h"
#include "agentguard/audit.h"

/* The file at `path`, whole (malloc'd; its length in *len). */
char *read_all(const char *path, size_t *len);
/* Parses text that must parse. */
ag_trajectory *parse_ok(const char *text);
/* Parses text that must fail with `code`; returns the message (static). */
const char *parse_fail(const char *text, ag_err_t code);
ag_config preset(const char *name);
ag_config config_json(const char *json);
/* The audit of `t` under `cfg` (all_stops: also each enabled mechanism's
 * first stop alone). */
ag_audit_finding audit_cfg(const ag_trajectory *t, const ag_config *cfg,
                           bool all_stops);
/* The audit of `t` under the preset `name`. */
ag_audit_finding audit(const ag_trajectory *t, const char *name);
/* A neutral run of `n` steps, each one call of `name` with `args` giving
 * `text` (ok `ok`). Caller frees. */
char *repeat_run(int n, const char *name, const char *args, const char *text,
                 bool ok);

#endif
