/*
 * tests/unit/audit_fixture.c - the helpers test_audit's cases share
 * (audit_fixture.h).
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "audit_fixture.h"

/* ---- helpers ------------------------------------------------------------ */

char *read_all(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  cr_assert_not_null(f, "cannot open %s", path);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)n + 1);
  cr_assert_not_null(buf);
  cr_assert_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
  buf[n] = '\0';
  fclose(f);
  *len = (size_t)n;
  return buf;
}

ag_trajectory *parse_ok(const char *text) {
  ag_trajectory *t = NULL;
  ag_error_t err;
  ag_err_t rc = ag_trajectory_parse(&t, text, strlen(text), NULL, &err);
  cr_assert_eq(rc, AG_OK, "parse failed (%s): %s", ag_err_name(rc), err.msg);
  cr_assert_not_null(t);
  return t;
}

/* Parses text that must fail with `code`; returns the message (static). */
const char *parse_fail(const char *text, ag_err_t code) {
  static ag_error_t err;
  ag_trajectory *t = (ag_trajectory *)1;
  ag_err_t rc = ag_trajectory_parse(&t, text, strlen(text), NULL, &err);
  cr_assert_eq(rc, code, "expected %s, got %s (%s) for: %.200s",
               ag_err_name(code), ag_err_name(rc), err.msg, text);
  cr_assert_null(t, "out must be NULL on failure");
  cr_assert_eq(err.code, code);
  cr_assert(err.msg[0] != '\0', "an error needs a message");
  return err.msg;
}

ag_config preset(const char *name) {
  ag_config cfg;
  ag_error_t err;
  cr_assert_eq(ag_config_preset(&cfg, name, &err), AG_OK, "%s", err.msg);
  return cfg;
}

ag_config config_json(const char *json) {
  ag_config cfg;
  ag_error_t err;
  cr_assert_eq(ag_config_parse(&cfg, json, strlen(json), &err), AG_OK, "%s",
               err.msg);
  return cfg;
}

ag_audit_finding audit_cfg(const ag_trajectory *t, const ag_config *cfg,
                           bool all_stops) {
  ag_audit_opts o;
  ag_audit_opts_init(&o);
  o.all_stops = all_stops;
  ag_auditor *a = NULL;
  ag_error_t err;
  cr_assert_eq(ag_auditor_new(&a, cfg, &o, &err), AG_OK, "%s", err.msg);
  ag_audit_finding f;
  cr_assert_eq(ag_auditor_run(a, t, &f, &err), AG_OK, "%s", err.msg);
  ag_auditor_free(a);
  return f;
}

ag_audit_finding audit(const ag_trajectory *t, const char *name) {
  ag_config cfg = preset(name);
  return audit_cfg(t, &cfg, false);
}

/* A neutral run of `n` steps, each one call of `name` with `args` giving
 * `text` (ok `ok`). Caller frees. */
char *repeat_run(int n, const char *name, const char *args, const char *text,
                 bool ok) {
  size_t cap =
      256 + (size_t)n * (strlen(name) + strlen(args) + strlen(text) + 96);
  char *s = malloc(cap);
  cr_assert_not_null(s);
  size_t used = (size_t)snprintf(s, cap, "{\"steps\":[");
  for (int i = 0; i < n; i++)
    used += (size_t)snprintf(
        s + used, cap - used,
        "%s{\"calls\":[{\"name\":\"%s\",\"args\":%s}],\"results\":[{\"ok\":%s,"
        "\"text\":\"%s\"}]}",
        i ? "," : "", name, args, ok ? "true" : "false", text);
  snprintf(s + used, cap - used, "]}");
  return s;
}
