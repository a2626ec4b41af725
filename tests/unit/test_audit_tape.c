/*
 * tests/unit/test_audit_tape.c - the neutral trajectory read from the JCS
 * tape (src/audit/traj_tape.c) equals its reading from jansson's tree, the
 * reference: every field of every step, call and result, and the audit's
 * findings under every preset, on every run the project has (the runs of
 * examples/, tests/fixtures/, and the development runs of ../shared when
 * it is beside the project) and on generated runs that walk the format's
 * corners (escapes, NUL bytes, numbers, argument values of every kind,
 * rejections, user messages, timing) and its bad inputs (the same error
 * from both).
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agentguard.h"
#include "agentguard/audit.h"
#include "audit/internal.h"

static char *read_all(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  cr_assert_not_null(f, "cannot open %s", path);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)n + 1);
  cr_assert_not_null(buf);
  cr_assert_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  buf[n] = '\0';
  *len = (size_t)n;
  return buf;
}

static bool same_text(const char *a, size_t al, const char *b, size_t bl) {
  if (al != bl)
    return false;
  return al == 0 || (a != NULL && b != NULL && memcmp(a, b, al) == 0);
}

/* The two readings, field by field. */
static void same_run(const char *what, const ag_trajectory *a,
                     const ag_trajectory *b) {
  cr_assert_eq(a->format, b->format, "%s: format", what);
  cr_assert_eq(a->outcome, b->outcome, "%s: outcome", what);
  cr_assert((a->source == NULL) == (b->source == NULL) &&
                (a->source == NULL || strcmp(a->source, b->source) == 0),
            "%s: source", what);
  cr_assert_eq(a->n_turns, b->n_turns, "%s: turns", what);
  cr_assert_eq(a->n_steps, b->n_steps, "%s: steps", what);
  cr_assert_eq(a->n_calls, b->n_calls, "%s: calls", what);
  cr_assert_eq(a->timed, b->timed, "%s: timed", what);
  for (size_t u = 0; u < a->n_turns; u++) {
    const ag_traj_turn *ta = &a->turns[u], *tb = &b->turns[u];
    cr_assert_eq(ta->n_steps, tb->n_steps, "%s: turn %zu", what, u);
    cr_assert_eq(ta->t_start_ms, tb->t_start_ms, "%s: turn %zu", what, u);
    for (size_t i = 0; i < ta->n_steps; i++) {
      const ag_traj_step *sa = &ta->steps[i], *sb = &tb->steps[i];
      cr_assert(sa->n_calls == sb->n_calls && sa->n_results == sb->n_results &&
                    sa->rejected == sb->rejected &&
                    sa->no_reply == sb->no_reply && sa->tokens == sb->tokens &&
                    sa->t_request_ms == sb->t_request_ms &&
                    sa->t_response_ms == sb->t_response_ms &&
                    sa->t_done_ms == sb->t_done_ms &&
                    (sa->text == NULL) == (sb->text == NULL) &&
                    same_text(sa->text, sa->text_len, sb->text, sb->text_len),
                "%s: step %zu of turn %zu", what, i + 1, u + 1);
      for (size_t k = 0; k < sa->n_calls; k++)
        cr_assert(strcmp(sa->calls[k].name, sb->calls[k].name) == 0 &&
                      same_text(sa->calls[k].args, sa->calls[k].args_len,
                                sb->calls[k].args, sb->calls[k].args_len),
                  "%s: step %zu call %zu: %s(%.*s) / %s(%.*s)", what, i + 1,
                  k + 1, sa->calls[k].name, (int)sa->calls[k].args_len,
                  sa->calls[k].args, sb->calls[k].name,
                  (int)sb->calls[k].args_len, sb->calls[k].args);
      for (size_t k = 0; k < sa->n_results; k++)
        cr_assert(sa->results[k].outcome == sb->results[k].outcome &&
                      same_text(sa->results[k].text, sa->results[k].text_len,
                                sb->results[k].text, sb->results[k].text_len),
                  "%s: step %zu result %zu", what, i + 1, k + 1);
    }
  }
}

static void same_findings(const char *what, const ag_trajectory *a,
                          const ag_trajectory *b) {
  static const char *const presets[] = {"default", "hpd", "forge",
                                        "twelve_factor", "monadic"};
  for (size_t p = 0; p < sizeof presets / sizeof presets[0]; p++) {
    ag_config cfg;
    if (ag_config_preset(&cfg, presets[p], NULL) != AG_OK)
      continue;
    ag_audit_opts ao;
    ag_audit_opts_init(&ao);
    ao.all_stops = true;
    ag_auditor *aud = NULL;
    ag_error_t err;
    cr_assert_eq(ag_auditor_new(&aud, &cfg, &ao, &err), AG_OK, "%s", err.msg);
    ag_audit_finding fa, fb;
    cr_assert_eq(ag_auditor_run(aud, a, &fa, &err), AG_OK, "%s", err.msg);
    cr_assert_eq(ag_auditor_run(aud, b, &fb, &err), AG_OK, "%s", err.msg);
    char *ja = NULL, *jb = NULL;
    cr_assert_eq(ag_audit_finding_json("x", presets[p], a, &fa, &ja, &err),
                 AG_OK);
    cr_assert_eq(ag_audit_finding_json("x", presets[p], b, &fb, &jb, &err),
                 AG_OK);
    cr_assert_str_eq(ja, jb, "%s under %s", what, presets[p]);
    ag_free(ja);
    ag_free(jb);
    ag_auditor_free(aud);
  }
}

/* Both readings of `text`: equal runs and findings, or the same error. */
static void check_both(const char *what, const char *text, size_t len) {
  ag_trajectory *a = NULL, *b = NULL;
  ag_error_t ea, eb;
  memset(&ea, 0, sizeof ea);
  memset(&eb, 0, sizeof eb);
  ag_err_t ra = ag__trajectory_parse_with(&a, text, len, NULL, &ea, true);
  ag_err_t rb = ag__trajectory_parse_with(&b, text, len, NULL, &eb, false);
  cr_assert_eq(ra, rb, "%s: %s / %s", what, ea.msg, eb.msg);
  if (ra != AG_OK) {
    cr_assert_str_eq(ea.msg, eb.msg, "%s", what);
  } else {
    same_run(what, a, b);
    same_findings(what, a, b);
  }
  ag_trajectory_free(a);
  ag_trajectory_free(b);
}

static int check_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (d == NULL)
    return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    size_t l = strlen(e->d_name);
    if (l < 6 || strcmp(e->d_name + l - 5, ".json") != 0)
      continue;
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    size_t len;
    char *buf = read_all(path, &len);
    check_both(path, buf, len);
    free(buf);
    n++;
  }
  closedir(d);
  return n;
}

Test(audit_tape, the_projects_runs_read_alike) {
  int a = check_dir(AG_SOURCE_DIR "/examples/runs");
  int b = check_dir(AG_SOURCE_DIR "/tests/fixtures/runs");
  cr_assert(a > 0 && b > 0, "%d + %d runs", a, b);
}

Test(audit_tape, the_development_runs_read_alike) {
  int n = check_dir(AG_SHARED_DIR "/data/runs");
  if (n < 0)
    cr_skip_test("%s/data/runs not found (../shared is not beside the "
                 "project); the project's runs are checked instead",
                 AG_SHARED_DIR);
  cr_assert_gt(n, 100);
}

/* Generated runs: each corner of the format, then random mixtures. */
Test(audit_tape, corners_and_bad_inputs_read_alike) {
  static const char *const cases[] = {
      "{\"steps\":[]}",
      "{\"outcome\":\"resolved\",\"source\":\"s\\u00e9\",\"steps\":[{\"calls\":"
      "[{\"name\":\"read\",\"args\":{\"p\":1,\"q\":[1.5,-2e3,true,null]}}],"
      "\"results\":[{\"ok\":true,\"text\":\"a\\nb\\u0000c\\ud83d\\ude00\"}]}]}",
      "{\"id\":\"x\",\"steps\":[{\"calls\":[{\"name\":\"t\",\"arguments\":"
      "\"{\\\"a\\\": 1}\"}],\"results\":[{\"ok\":false}]},{\"user_msg_before\":"
      "true,\"calls\":[],\"results\":[{\"text\":\"refused\"}]}]}",
      "{\"steps\":[{\"text\":\"hi\",\"usage\":{\"prompt_tokens\":5,"
      "\"completion_tokens\":2.0},\"t_ms\":10,\"t_done_ms\":30,\"calls\":"
      "[{\"name\":\"t\",\"args\":null}],\"results\":[{\"ok\":true,\"text\":"
      "null}]}]}",
      "{\"steps\":[{\"rejected_by_harness\":true,\"calls\":[{\"name\":\"t\","
      "\"args\":\"x\"}],\"results\":[]}]}",
      "{\"steps\":[{\"calls\":[{\"name\":\"a\",\"rejected_by_harness\":1},"
      "{\"name\":\"b\",\"rejected_by_harness\":\"\"}],\"results\":[{},{}]}]}",
      "{\"steps\":[{\"text\":[{\"type\":\"text\",\"text\":\"parts\"}],"
      "\"calls\":[],\"results\":[]}]}",
      /* arguments the tape copies as they are (jansson would write them
       * so) and ones it leaves to jansson: spaces between tokens, a
       * number, a \u or \/ escape, an escaped key */
      "{\"steps\":[{\"calls\":[{\"name\":\"a\",\"args\":{\"cmd\":\"echo "
      "\\\"hi\\\" b\\n\\tc \\\\ d \xc3\xa9\",\"f\":[true,null,false],"
      "\"o\":{},\"e\":[]}},{\"name\":\"b\",\"args\":[\"x\",\"y\"]},{\"name\":"
      "\"c\",\"args\":true}],\"results\":[{},{},{}]}]}",
      "{\"steps\":[{\"calls\":[{\"name\":\"a\",\"args\":{\"cmd\": \"ls\"}},"
      "{\"name\":\"b\",\"args\":{\"c\":\"\\u00e9\\/\"}},{\"name\":\"c\","
      "\"args\":{\"a\\\"b\":\"x\"}},{\"name\":\"d\",\"args\":[ 1 ]}],"
      "\"results\":[{},{},{},{}]}]}",
      /* bad inputs: the same error from both */
      "{\"steps\":{}}",
      "{\"steps\":[{\"calls\":[{\"name\":1}],\"results\":[{}]}]}",
      "{\"steps\":[{\"calls\":[{\"name\":\"a\"}],\"results\":[]}]}",
      "{\"steps\":[{\"usage\":{\"prompt_tokens\":-1},\"calls\":[],"
      "\"results\":[]}]}",
      "{\"steps\":[{\"t_ms\":\"soon\",\"calls\":[],\"results\":[]}]}",
      "{\"steps\":[{\"calls\":[],\"results\":[{\"ok\":\"yes\"}]}]}",
      "{\"steps\":[1]}",
      "{\"steps\":[],\"steps\":[]}",
      "{\"steps\":[{\"calls\":[]}]} trailing",
      "{\"steps\":[{\"calls\":[{\"name\":\"a\",\"args\":1e999}],"
      "\"results\":[{}]}]}",
      /* jansson refuses a NUL in a key (found by fuzz_trajectory) */
      "{\"steps\":[{\"calls\":[],\"results\":[{\"t\\u0000ext\":\"x\"}]}]}",
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char what[32];
    snprintf(what, sizeof what, "case %zu", i);
    check_both(what, cases[i], strlen(cases[i]));
  }
  /* random runs: a loop of the same call now and then, texts with
   * escapes, arguments as strings or objects */
  srand(7);
  char *buf = malloc(1 << 16);
  cr_assert_not_null(buf);
  for (int r = 0; r < 200; r++) {
    size_t n = 0;
    n += (size_t)snprintf(buf + n, 1024, "{\"outcome\":\"%s\",\"steps\":[",
                          r % 2 ? "resolved" : "unresolved");
    int steps = rand() % 30;
    for (int s = 0; s < steps; s++) {
      int call = rand() % 4;
      n += (size_t)snprintf(
          buf + n, 2048,
          "%s{\"calls\":[{\"name\":\"tool%d\",\"args\":%s}],\"results\":"
          "[{\"ok\":%s,\"text\":\"out %d\\t\\\"q\\\" \\u00fc\"}]}",
          s ? "," : "", call,
          rand() % 2 ? "{\"cmd\":\"ls -la\",\"n\":3}" : "\"{\\\"k\\\":2}\"",
          rand() % 3 ? "true" : "false", rand() % 3);
    }
    n += (size_t)snprintf(buf + n, 16, "]}");
    char what[32];
    snprintf(what, sizeof what, "random run %d", r);
    check_both(what, buf, n);
  }
  free(buf);
}
