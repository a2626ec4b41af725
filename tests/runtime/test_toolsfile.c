/*
 * tests/runtime/test_toolsfile.c - tools defined in JSON (src/exec/
 * toolsfile.c): one TOOL object through ag_registry_add_json (the code the
 * scenario loader shares) and whole tools files through ag_tools_file_load:
 * what is read, every error with its key path, all-or-nothing loading, and
 * a loaded subprocess tool run through the scheduler.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <string.h>

#include "agentguard/exec.h"

static ag_registry *new_reg(void) {
  ag_registry *r = NULL;
  cr_assert_eq(ag_registry_new(&r, NULL), AG_OK);
  return r;
}

/* Loads `text` into a fresh registry; returns the code, message in err. */
static ag_err_t load(const char *text, ag_registry **out, ag_error_t *err) {
  ag_registry *r = new_reg();
  ag_err_t rc = ag_tools_file_load(r, text, strlen(text), err);
  if (out != NULL)
    *out = r;
  else
    ag_registry_free(r);
  return rc;
}

#define EXPECT_LOAD_ERR(code, text, want)                                      \
  do {                                                                         \
    ag_error_t e_;                                                             \
    ag_err_t rc_ = load(text, NULL, &e_);                                      \
    cr_assert_eq(rc_, code, "%s -> %s (%s)", text, ag_err_name(rc_), e_.msg);  \
    cr_assert_str_eq(e_.msg, want, "%s -> %s", text, e_.msg);                  \
  } while (0)

Test(toolsfile, reads_every_key) {
  ag_registry *r = NULL;
  ag_error_t err;
  const char *text =
      "{\"grep\": {\"description\": \"Search files\", \"command\": "
      "[\"grep\", \"-rn\"], \"parameters\": {\"type\": \"object\", "
      "\"properties\": {\"q\": {\"type\": \"string\"}}, \"required\": "
      "[\"q\"]}, \"requires_approval\": true, \"idempotent\": false},"
      " \"echo\": {\"command\": [\"cat\"]}}";
  cr_assert_eq(load(text, &r, &err), AG_OK, "%s", err.msg);
  cr_assert_eq(ag_registry_count(r), 2);
  const ag_tool_def *d = ag_registry_get(r, "grep");
  cr_assert_not_null(d);
  cr_assert_str_eq(d->description, "Search files");
  cr_assert_str_eq(d->argv[0], "grep");
  cr_assert_str_eq(d->argv[1], "-rn");
  cr_assert_null(d->argv[2]);
  cr_assert(d->requires_approval);
  cr_assert_not(d->idempotent);
  cr_assert_null(d->fn);
  json_t *bad = json_loads("{\"q\": 3}", 0, NULL);
  cr_assert_eq(ag_registry_validate(r, "grep", bad, &err), AG_EINVAL);
  cr_assert_str_eq(err.msg, "/q: expected string, got integer");
  json_decref(bad);
  d = ag_registry_get(r, "echo");
  cr_assert(d->idempotent, "the default");
  cr_assert_not(d->requires_approval);
  ag_registry_free(r);

  cr_assert_eq(load("{}", &r, &err), AG_OK);
  cr_assert_eq(ag_registry_count(r), 0);
  ag_registry_free(r);
}

Test(toolsfile, errors_name_the_key_path) {
  EXPECT_LOAD_ERR(AG_EJSON, "{\"t\": {\"command\": [\"x\"]},}",
                  "line 1, column 26: string or '}' expected near '}'");
  EXPECT_LOAD_ERR(AG_EJSON,
                  "{\"t\": {\"command\": [\"x\"]},\n \"t\": {\"command\": "
                  "[\"y\"]}}",
                  "line 2, column 4: duplicate object key near '\"t\"'");
  EXPECT_LOAD_ERR(AG_EINVAL, "[]",
                  "tools file: expected an object {\"NAME\": TOOL, ...}, got "
                  "array");
  EXPECT_LOAD_ERR(AG_EINVAL, "{\"t\": 3}",
                  "tools.t: expected a tool object, got integer");
  EXPECT_LOAD_ERR(AG_EINVAL, "{\"t\": {\"comand\": [\"x\"]}}",
                  "tools.t.comand: unknown key; did you mean command?");
  EXPECT_LOAD_ERR(AG_EINVAL, "{\"t\": {\"command\": [\"x\"], \"zzz\": 1}}",
                  "tools.t.zzz: unknown key (expected one of: description, "
                  "parameters, requires_approval, idempotent, command, env)");
  /* the environment a command tool gets (docs/security.md) */
  EXPECT_LOAD_ERR(AG_EINVAL,
                  "{\"t\": {\"command\": [\"x\"], \"env\": [\"A=B\"]}}",
                  "tools.t.env[0]: \"A=B\" is not a variable name (letters, "
                  "digits and _, not starting with a digit)");
  EXPECT_LOAD_ERR(AG_EINVAL, "{\"t\": {\"responses\": [{\"ok\": \"x\"}]}}",
                  "tools.t.responses: unknown key (expected one of: "
                  "description, parameters, requires_approval, idempotent, "
                  "command, env)");
  EXPECT_LOAD_ERR(AG_EINVAL, "{\"t\": {\"description\": \"d\"}}",
                  "tools.t: needs \"command\" (the program to run, as an "
                  "argv array of strings)");
  EXPECT_LOAD_ERR(AG_EINVAL, "{\"t\": {\"command\": \"ls -l\"}}",
                  "tools.t.command: expected an array of strings (argv), got "
                  "string");
  EXPECT_LOAD_ERR(AG_EINVAL, "{\"t\": {\"command\": []}}",
                  "tools.t.command: needs 1 to 256 strings (argv), got 0");
  EXPECT_LOAD_ERR(AG_EINVAL, "{\"t\": {\"command\": [\"ls\", 2]}}",
                  "tools.t.command[1]: expected a string, got integer");
  EXPECT_LOAD_ERR(AG_EINVAL, "{\"t\": {\"command\": [\"\"]}}",
                  "tools.t: argv is empty; argv[0] must name the program");
  EXPECT_LOAD_ERR(AG_EINVAL,
                  "{\"t\": {\"command\": [\"x\"], \"idempotent\": \"yes\"}}",
                  "tools.t.idempotent: expected true or false, got string");
  EXPECT_LOAD_ERR(AG_EINVAL,
                  "{\"t\": {\"command\": [\"x\"], \"description\": 1.5}}",
                  "tools.t.description: expected a string, got number");
  EXPECT_LOAD_ERR(AG_EINVAL,
                  "{\"t\": {\"command\": [\"x\"], \"parameters\": []}}",
                  "tools.t.parameters: expected a JSON Schema object, got "
                  "array");
  EXPECT_LOAD_ERR(AG_ECONFIG,
                  "{\"t\": {\"command\": [\"x\"], \"parameters\": "
                  "{\"properties\": {\"p\": {\"type\": \"strng\"}}}}}",
                  "tools.t.parameters/properties/p/type: unknown type "
                  "\"strng\"; did you mean \"string\"?");
  EXPECT_LOAD_ERR(AG_EINVAL, "{\"bad name\": {\"command\": [\"x\"]}}",
                  "tools: invalid tool name \"bad name\": use 1 to 64 of A-Z "
                  "a-z 0-9 _ -");
}

Test(toolsfile, all_or_nothing_and_names_already_taken) {
  ag_registry *r = new_reg();
  ag_error_t err;
  const char *bad = "{\"a\": {\"command\": [\"x\"]}, \"b\": {\"command\": 1}}";
  cr_assert_eq(ag_tools_file_load(r, bad, strlen(bad), &err), AG_EINVAL);
  cr_assert_eq(ag_registry_count(r), 0, "nothing added on an error");

  const char *one = "{\"a\": {\"command\": [\"x\"]}}";
  cr_assert_eq(ag_tools_file_load(r, one, strlen(one), &err), AG_OK);
  const char *two = "{\"c\": {\"command\": [\"x\"]}, \"a\": {\"command\": "
                    "[\"y\"]}}";
  cr_assert_eq(ag_tools_file_load(r, two, strlen(two), &err), AG_EINVAL);
  cr_assert_str_eq(err.msg,
                   "tools.a: a tool with this name is already registered");
  cr_assert_eq(ag_registry_count(r), 1);
  cr_assert_null(ag_registry_get(r, "c"));
  ag_registry_free(r);
}

static ag_tool_status native(void *user, const json_t *args, ag_cancel *c,
                             ag_output *out) {
  (void)user;
  (void)args;
  (void)c;
  ag_output_printf(out, "native");
  return AG_TOOL_OK;
}

Test(toolsfile, one_object_with_a_native_implementation) {
  ag_registry *r = new_reg();
  ag_error_t err;
  json_t *t = json_loads("{\"description\": \"d\", \"responses\": [], "
                         "\"requires_approval\": true}",
                         0, NULL);
  static const char *const extra[] = {"responses", "by_args", NULL};
  ag_tool_json_opts o;
  ag_tool_json_opts_init(&o);
  o.extra_keys = extra;
  o.fn = native;
  cr_assert_eq(ag_registry_add_json(r, "n", t, &o, &err), AG_OK, "%s", err.msg);
  const ag_tool_def *d = ag_registry_get(r, "n");
  cr_assert_eq(d->fn, native);
  cr_assert(d->requires_approval);
  /* A typo near an extra key is suggested too. */
  json_t *t2 = json_loads("{\"respones\": []}", 0, NULL);
  o.path = "scenario.tools.m";
  cr_assert_eq(ag_registry_add_json(r, "m", t2, &o, &err), AG_EINVAL);
  cr_assert_str_eq(err.msg, "scenario.tools.m.respones: unknown key; did you "
                            "mean responses?");
  /* With an implementation, "command" is refused. */
  json_t *t3 = json_loads("{\"command\": [\"x\"]}", 0, NULL);
  cr_assert_eq(ag_registry_add_json(r, "k", t3, &o, &err), AG_EINVAL);
  cr_assert(strstr(err.msg, "\"command\" given") != NULL, "%s", err.msg);
  cr_assert_eq(ag_registry_count(r), 1);
  json_decref(t);
  json_decref(t2);
  json_decref(t3);
  ag_registry_free(r);
}

Test(toolsfile, a_loaded_tool_runs) {
  ag_registry *r = NULL;
  ag_error_t err;
  cr_assert_eq(
      load("{\"up\": {\"command\": [\"tr\", \"a-z\", \"A-Z\"]}}", &r, &err),
      AG_OK, "%s", err.msg);
  ag_config cfg;
  ag_config_init(&cfg);
  ag_scheduler *s = NULL;
  cr_assert_eq(ag_scheduler_new(&s, r, &cfg, NULL, &err), AG_OK);
  const char *args = "{\"x\": \"hi\"}";
  ag_exec_call call = {"up", args, strlen(args), false, NULL};
  ag_exec_result res;
  cr_assert_eq(ag_scheduler_run(s, &call, 1, NULL, &res, &err), AG_OK);
  cr_assert_eq(res.status, AG_EXEC_OK, "%s", res.text);
  cr_assert_str_eq(res.text, "{\"X\": \"HI\"}");
  ag_exec_result_clear(&res);
  ag_scheduler_free(s);
  ag_registry_free(r);
}
