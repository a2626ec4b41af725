/*
 * tests/runtime/test_registry.c - the tool registry (src/exec/registry.c):
 * defaults, copying, what registration rejects and its messages, lookup,
 * argument validation through the registry, the OpenAI tools array, the cap
 * on the number of tools, and concurrent reads.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>
#include <jansson.h>

#include "exec/internal.h"

static ag_tool_status noop(void *user, const json_t *args, ag_cancel *cancel,
                           ag_output *out) {
  (void)user;
  (void)args;
  (void)cancel;
  (void)out;
  return AG_TOOL_OK;
}

static ag_registry *new_registry(void) {
  ag_registry *r = NULL;
  ag_error_t err;
  cr_assert_eq(ag_registry_new(&r, &err), AG_OK, "%s", err.msg);
  cr_assert_not_null(r);
  return r;
}

static ag_tool_def native(const char *name, const char *params) {
  ag_tool_def d;
  ag_tool_def_init(&d);
  d.name = name;
  d.parameters = params;
  d.fn = noop;
  return d;
}

static void add_ok(ag_registry *r, const ag_tool_def *d) {
  ag_error_t err;
  ag_err_t rc = ag_registry_add(r, d, &err);
  cr_assert_eq(rc, AG_OK, "add %s: %s (%s)", d->name ? d->name : "(null)",
               ag_err_name(rc), err.msg);
}

/* Expects `code` and exactly `msg`, and that nothing was added. */
static void add_fails(ag_registry *r, const ag_tool_def *d, ag_err_t code,
                      const char *msg) {
  size_t before = ag_registry_count(r);
  ag_error_t err;
  ag_err_t rc = ag_registry_add(r, d, &err);
  cr_assert_eq(rc, code, "add: got %s, want %s (%s)", ag_err_name(rc),
               ag_err_name(code), err.msg);
  cr_assert_eq(err.code, code);
  if (msg != NULL)
    cr_assert_str_eq(err.msg, msg);
  cr_assert_eq(ag_registry_count(r), before, "a failed add changed the count");
}

static json_t *parse(const char *text) {
  json_error_t je;
  json_t *v = json_loads(text, JSON_DECODE_ANY, &je);
  cr_assert_not_null(v, "test JSON %s: %s", text, je.text);
  return v;
}

static void validate_is(const ag_registry *r, const char *name,
                        const char *args, ag_err_t code, const char *msg) {
  json_t *v = parse(args);
  ag_error_t err;
  ag_err_t rc = ag_registry_validate(r, name, v, &err);
  cr_assert_eq(rc, code, "validate %s %s: got %s, want %s (%s)", name, args,
               ag_err_name(rc), ag_err_name(code), err.msg);
  if (msg != NULL)
    cr_assert_str_eq(err.msg, msg, "validate %s %s", name, args);
  json_decref(v);
}

/* ------------------------------------------------------------------------ */
/* Definitions                                                              */
/* ------------------------------------------------------------------------ */

Test(registry, def_init_defaults) {
  ag_tool_def d;
  memset(&d, 0xAB, sizeof(d));
  ag_tool_def_init(&d);
  cr_assert_null(d.name);
  cr_assert_null(d.description);
  cr_assert_null(d.parameters);
  cr_assert_eq(d.requires_approval, false);
  cr_assert_eq(d.idempotent, true);
  cr_assert_eq(d.timeout_ms, -1);
  cr_assert_eq(d.max_retries, -1);
  cr_assert_null(d.fn);
  cr_assert_null(d.user);
  cr_assert_null(d.argv);
  cr_assert_eq(d.max_output, 0);
  cr_assert_eq(d.kill_grace_ms, 0);
  cr_assert_eq(d.limits.cpu_seconds, 0);
  cr_assert_eq(d.limits.address_space_bytes, 0);
  cr_assert_eq(d.limits.open_files, 0);
  ag_tool_def_init(NULL);
}

Test(registry, add_copies_everything) {
  ag_registry *r = new_registry();
  char name[] = "read_file", desc[] = "Reads a file",
       params[] = "{\"type\":\"object\",\"properties\":{\"path\":{\"type\":"
                  "\"string\"}},\"required\":[\"path\"]}";
  int user = 7;
  ag_tool_def d = native(name, params);
  d.description = desc;
  d.user = &user;
  d.requires_approval = true;
  d.idempotent = false;
  d.timeout_ms = 1500;
  d.max_retries = 2;
  add_ok(r, &d);

  char a0[] = "cat", a1[] = "-n";
  const char *argv[] = {a0, a1, NULL};
  ag_tool_def s;
  ag_tool_def_init(&s);
  s.name = "cat";
  s.argv = argv;
  s.max_output = 4096;
  s.kill_grace_ms = 100;
  s.limits.open_files = 64;
  add_ok(r, &s);

  /* The caller's buffers may change or go away. */
  memset(name, 'x', sizeof(name) - 1);
  memset(desc, 'y', sizeof(desc) - 1);
  memset(params, ' ', sizeof(params) - 1);
  a0[0] = 'X';
  a1[1] = 'X';

  const ag_tool_def *g = ag_registry_get(r, "read_file");
  cr_assert_not_null(g);
  cr_assert_str_eq(g->name, "read_file");
  cr_assert_str_eq(g->description, "Reads a file");
  cr_assert(strstr(g->parameters, "\"required\"") != NULL);
  cr_assert_eq(g->user, &user);
  cr_assert_eq(g->fn, noop);
  cr_assert_eq(g->requires_approval, true);
  cr_assert_eq(g->idempotent, false);
  cr_assert_eq(g->timeout_ms, 1500);
  cr_assert_eq(g->max_retries, 2);
  cr_assert_null(g->argv);

  g = ag_registry_get(r, "cat");
  cr_assert_not_null(g);
  cr_assert_null(g->fn);
  cr_assert_str_eq(g->argv[0], "cat");
  cr_assert_str_eq(g->argv[1], "-n");
  cr_assert_null(g->argv[2]);
  cr_assert_neq((const void *)g->argv, (const void *)argv);
  cr_assert_eq(g->max_output, 4096);
  cr_assert_eq(g->kill_grace_ms, 100);
  cr_assert_eq(g->limits.open_files, 64);
  cr_assert_null(g->description);
  cr_assert_null(g->parameters);

  const ag__tool *t = ag__registry_find(r, "cat");
  cr_assert_not_null(t);
  cr_assert_eq(&t->def, g);
  cr_assert_null(t->schema);
  cr_assert_null(t->parameters);
  cr_assert_str_eq(t->argv_copy[0], "cat");
  t = ag__registry_find(r, "read_file");
  cr_assert_not_null(t->schema);
  cr_assert(json_is_object(t->parameters));

  validate_is(r, "read_file", "{}", AG_EINVAL,
              "missing required property \"path\"");
  ag_registry_free(r);
}

Test(registry, count_and_names_in_insertion_order) {
  ag_registry *r = new_registry();
  const char *names[] = {"zeta", "alpha", "Mid-1", "b_2"};
  for (size_t i = 0; i < 4; i++) {
    ag_tool_def d = native(names[i], NULL);
    add_ok(r, &d);
  }
  cr_assert_eq(ag_registry_count(r), 4);
  for (size_t i = 0; i < 4; i++)
    cr_assert_str_eq(ag_registry_name(r, i), names[i]);
  cr_assert_null(ag_registry_name(r, 4));
  cr_assert_null(ag_registry_get(r, "ZETA"), "names are case-sensitive");
  cr_assert_null(ag_registry_get(r, NULL));
  cr_assert_eq(ag_registry_count(NULL), 0);
  cr_assert_null(ag_registry_name(NULL, 0));
  cr_assert_null(ag_registry_get(NULL, "zeta"));
  cr_assert_null(ag__registry_find(NULL, "zeta"));
  ag_registry_free(r);
  ag_registry_free(NULL);
}

/* ------------------------------------------------------------------------ */
/* What registration rejects                                                */
/* ------------------------------------------------------------------------ */

Test(registry, duplicate_name) {
  ag_registry *r = new_registry();
  ag_tool_def d = native("grep", NULL);
  add_ok(r, &d);
  add_fails(r, &d, AG_EINVAL,
            "tools.grep: a tool with this name is already registered");
  ag_registry_free(r);
}

Test(registry, invalid_names) {
  ag_registry *r = new_registry();
  ag_tool_def d = native(NULL, NULL);
  add_fails(r, &d, AG_EINVAL, "tools: a tool needs a name");
  d.name = "";
  add_fails(r, &d, AG_EINVAL, "tools: a tool needs a name");
  d.name = "read file";
  add_fails(r, &d, AG_EINVAL,
            "tools: invalid tool name \"read file\": use 1 to 64 of A-Z a-z "
            "0-9 _ -");
  d.name = "r\xC3\xA9sum\xC3\xA9";
  add_fails(r, &d, AG_EINVAL, NULL);
  d.name = "a.b";
  add_fails(r, &d, AG_EINVAL, NULL);
  d.name = "a/b";
  add_fails(r, &d, AG_EINVAL, NULL);
  char name[80];
  memset(name, 'n', 65);
  name[65] = '\0';
  d.name = name;
  add_fails(
      r, &d, AG_EINVAL,
      "tools: invalid tool name "
      "\"nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn."
      "..\": use 1 to 64 of A-Z a-z 0-9 _ -");
  name[64] = '\0'; /* 64 bytes: fine */
  add_ok(r, &d);
  d.name = "Az09_-";
  add_ok(r, &d);
  ag_registry_free(r);
}

Test(registry, native_or_subprocess_exactly_one) {
  ag_registry *r = new_registry();
  const char *argv[] = {"true", NULL};
  ag_tool_def d = native("both", NULL);
  d.argv = argv;
  add_fails(r, &d, AG_EINVAL,
            "tools.both: set exactly one of fn (a native tool) and argv (a "
            "subprocess tool)");
  ag_tool_def_init(&d);
  d.name = "neither";
  add_fails(r, &d, AG_EINVAL,
            "tools.neither: set exactly one of fn (a native tool) and argv (a "
            "subprocess tool)");
  const char *empty[] = {NULL};
  d.argv = empty;
  add_fails(r, &d, AG_EINVAL,
            "tools.neither: argv is empty; argv[0] must name the program");
  const char *blank[] = {"", NULL};
  d.argv = blank;
  add_fails(r, &d, AG_EINVAL,
            "tools.neither: argv is empty; argv[0] must name the program");
  d.argv = argv;
  add_ok(r, &d);
  ag_registry_free(r);
}

Test(registry, numeric_fields_checked) {
  ag_registry *r = new_registry();
  ag_tool_def d = native("t", NULL);
  d.timeout_ms = -2;
  add_fails(r, &d, AG_EINVAL, "tools.t: timeout_ms must be -1 or >= 0");
  d.timeout_ms = 0;
  d.max_retries = -5;
  add_fails(r, &d, AG_EINVAL, "tools.t: max_retries must be -1 or >= 0");
  d.max_retries = 0;
  d.kill_grace_ms = -1;
  add_fails(r, &d, AG_EINVAL, "tools.t: kill_grace_ms must be >= 0");
  d.kill_grace_ms = 0;
  d.limits.cpu_seconds = -1;
  add_fails(r, &d, AG_EINVAL, "tools.t: limits must be >= 0 (0: not set)");
  d.limits.cpu_seconds = 0;
  d.description = "bad \xFF utf-8";
  add_fails(r, &d, AG_EINVAL, "tools.t: description is not valid UTF-8");
  d.description = "caf\xC3\xA9 \xF0\x9F\x98\x80";
  add_ok(r, &d);
  ag_registry_free(r);
}

Test(registry, bad_parameters_json) {
  ag_registry *r = new_registry();
  ag_tool_def d = native("t", "{\"type\": }");
  ag_error_t err;
  cr_assert_eq(ag_registry_add(r, &d, &err), AG_ECONFIG);
  cr_assert_str_eq(err.msg, "tools.t.parameters: line 1, column 10: "
                            "unexpected token near '}'");
  cr_assert_eq(err.line, 1);
  cr_assert_eq(err.column, 10);
  cr_assert_eq(err.pos, 10);

  d.parameters = "{\n  \"type\": \"object\",\n  \"type\": \"object\"\n}";
  cr_assert_eq(ag_registry_add(r, &d, &err), AG_ECONFIG);
  cr_assert(strncmp(err.msg, "tools.t.parameters: line 3, column ", 35) == 0,
            "%s", err.msg);
  cr_assert(strstr(err.msg, "duplicate object key") != NULL, "%s", err.msg);
  cr_assert_eq(err.line, 3);

  d.parameters = "[]";
  add_fails(r, &d, AG_ECONFIG,
            "tools.t.parameters: must be a JSON Schema object");
  d.parameters = "{\"type\":\"object\"} x";
  add_fails(r, &d, AG_ECONFIG, NULL);
  cr_assert_eq(ag_registry_count(r), 0);
  ag_registry_free(r);
}

Test(registry, schema_errors_name_the_tool) {
  ag_registry *r = new_registry();
  ag_tool_def d =
      native("read_file", "{\"type\":\"object\",\"properties\":{\"path\":{"
                          "\"type\":\"string\",\"uniqueItems\":true}}}");
  add_fails(r, &d, AG_ECONFIG,
            "tools.read_file.parameters/properties/path: unsupported keyword "
            "\"uniqueItems\"");
  d.parameters = "{\"properties\":{\"p\":{\"pattern\":\"[a-\"}}}";
  add_fails(r, &d, AG_ECONFIG, NULL);
  d.parameters = "{\"type\":\"string\"}";
  add_fails(r, &d, AG_ECONFIG,
            "tools.read_file.parameters/type: must allow \"object\": tool "
            "arguments are always objects");
  cr_assert_null(ag_registry_get(r, "read_file"));
  /* the name is still free after the failures */
  d.parameters = "{\"type\":\"object\"}";
  add_ok(r, &d);
  ag_registry_free(r);
}

Test(registry, empty_parameters_mean_any_object) {
  ag_registry *r = new_registry();
  ag_tool_def d = native("a", NULL);
  add_ok(r, &d);
  d = native("b", "");
  add_ok(r, &d);
  d = native("c", " \n\t");
  add_ok(r, &d);
  const char *names[] = {"a", "b", "c"};
  for (int i = 0; i < 3; i++) {
    validate_is(r, names[i], "{}", AG_OK, NULL);
    validate_is(r, names[i], "{\"anything\":[1,{}]}", AG_OK, NULL);
    validate_is(r, names[i], "[]", AG_EINVAL, "expected object, got array");
    validate_is(r, names[i], "\"x\"", AG_EINVAL, "expected object, got string");
    validate_is(r, names[i], "null", AG_EINVAL, "expected object, got null");
  }
  ag_registry_free(r);
}

/* ------------------------------------------------------------------------ */
/* Validation                                                               */
/* ------------------------------------------------------------------------ */

Test(registry, validate_through_the_schema) {
  ag_registry *r = new_registry();
  ag_tool_def d = native(
      "edit", "{\"type\":\"object\",\"properties\":{\"items\":{\"type\":"
              "\"array\",\"items\":{\"type\":\"object\",\"properties\":{"
              "\"path\":{\"type\":\"string\"}},\"required\":[\"path\"],"
              "\"additionalProperties\":false}}},\"required\":[\"items\"]}");
  add_ok(r, &d);
  validate_is(r, "edit", "{\"items\":[{\"path\":\"a\"}]}", AG_OK, NULL);
  validate_is(r, "edit",
              "{\"items\":[{\"path\":\"a\"},{\"path\":\"b\"},{\"path\":7}]}",
              AG_EINVAL, "/items/2/path: expected string, got integer");
  validate_is(r, "edit", "{\"items\":[{\"pth\":\"a\"}]}", AG_EINVAL,
              "/items/0: unexpected property \"pth\"; did you mean \"path\"?");
  validate_is(r, "edit", "{}", AG_EINVAL,
              "missing required property \"items\"");
  validate_is(r, "edit", "[1]", AG_EINVAL, "expected object, got array");
  ag_error_t err;
  cr_assert_eq(ag_registry_validate(r, "edit", NULL, &err), AG_EINVAL);
  cr_assert_str_eq(err.msg, "expected object, got nothing");
  cr_assert_eq(ag_registry_validate(NULL, "edit", NULL, &err), AG_EINVAL);
  cr_assert_eq(ag_registry_validate(r, NULL, NULL, NULL), AG_EINVAL);
  ag_registry_free(r);
}

Test(registry, unknown_tool_with_suggestion) {
  ag_registry *r = new_registry();
  const char *names[] = {"read_file", "write_file", "ls", "search"};
  for (int i = 0; i < 4; i++) {
    ag_tool_def d = native(names[i], NULL);
    add_ok(r, &d);
  }
  validate_is(r, "read_fiel", "{}", AG_ENOTFOUND,
              "unknown tool \"read_fiel\"; did you mean \"read_file\"?");
  validate_is(r, "Write_File", "{}", AG_ENOTFOUND,
              "unknown tool \"Write_File\"; did you mean \"write_file\"?");
  validate_is(r, "lss", "{}", AG_ENOTFOUND,
              "unknown tool \"lss\"; did you mean \"ls\"?");
  validate_is(r, "delete_everything", "{}", AG_ENOTFOUND,
              "unknown tool \"delete_everything\"");
  validate_is(r, "x", "[]", AG_ENOTFOUND, "unknown tool \"x\"");
  ag_registry_free(r);
  r = new_registry();
  validate_is(r, "ls", "{}", AG_ENOTFOUND, "unknown tool \"ls\"");
  ag_registry_free(r);
}

/* ------------------------------------------------------------------------ */
/* tools_json                                                               */
/* ------------------------------------------------------------------------ */

Test(registry, tools_json_shape) {
  ag_registry *r = new_registry();
  ag_tool_def d = native("read_file", "{\"type\":\"object\",\"properties\":{"
                                      "\"path\":{\"type\":\"string\"}}}");
  d.description = "Read a file";
  add_ok(r, &d);
  d = native("now", NULL);
  add_ok(r, &d);
  d = native("untyped", "{\"properties\":{\"a\":{}}}");
  d.description = "";
  add_ok(r, &d);

  json_t *tools = ag_registry_tools_json(r);
  cr_assert(json_is_array(tools));
  cr_assert_eq(json_array_size(tools), 3);
  char *got = json_dumps(tools, JSON_COMPACT | JSON_SORT_KEYS);
  cr_assert_str_eq(
      got,
      "[{\"function\":{\"description\":\"Read a file\",\"name\":\"read_file\","
      "\"parameters\":{\"properties\":{\"path\":{\"type\":\"string\"}},"
      "\"type\":\"object\"}},\"type\":\"function\"},"
      "{\"function\":{\"name\":\"now\",\"parameters\":{\"type\":\"object\"}},"
      "\"type\":\"function\"},"
      "{\"function\":{\"description\":\"\",\"name\":\"untyped\","
      "\"parameters\":{\"properties\":{\"a\":{}},\"type\":\"object\"}},"
      "\"type\":\"function\"}]");
  free(got);

  /* A new reference the caller may change without touching the registry. */
  json_object_set_new(
      json_object_get(json_object_get(json_array_get(tools, 0), "function"),
                      "parameters"),
      "type", json_string("array"));
  json_decref(tools);
  tools = ag_registry_tools_json(r);
  cr_assert_str_eq(
      json_string_value(json_object_get(
          json_object_get(json_object_get(json_array_get(tools, 0), "function"),
                          "parameters"),
          "type")),
      "object");
  json_decref(tools);
  validate_is(r, "read_file", "{\"path\":1}", AG_EINVAL,
              "/path: expected string, got integer");

  ag_registry_free(r);
  r = new_registry();
  tools = ag_registry_tools_json(r);
  cr_assert(json_is_array(tools));
  cr_assert_eq(json_array_size(tools), 0);
  json_decref(tools);
  ag_registry_free(r);
}

/* ------------------------------------------------------------------------ */
/* Capacity                                                                 */
/* ------------------------------------------------------------------------ */

Test(registry, at_most_1024_tools) {
  ag_registry *r = new_registry();
  char name[32];
  for (int i = 0; i < 1024; i++) {
    snprintf(name, sizeof(name), "tool_%04d", i);
    ag_tool_def d = native(name, i % 2 ? "{\"required\":[\"x\"]}" : NULL);
    add_ok(r, &d);
  }
  cr_assert_eq(ag_registry_count(r), 1024);
  ag_tool_def d = native("one_too_many", NULL);
  add_fails(r, &d, AG_ETOOBIG,
            "tools.one_too_many: too many tools (at most 1024)");
  /* a duplicate is still reported as a duplicate */
  d.name = "tool_0001";
  add_fails(r, &d, AG_EINVAL, NULL);
  for (int i = 0; i < 1024; i++) {
    snprintf(name, sizeof(name), "tool_%04d", i);
    cr_assert_str_eq(ag_registry_name(r, (size_t)i), name);
    const ag_tool_def *g = ag_registry_get(r, name);
    cr_assert_not_null(g, "%s", name);
    cr_assert_str_eq(g->name, name);
  }
  validate_is(r, "tool_0001", "{}", AG_EINVAL,
              "missing required property \"x\"");
  validate_is(r, "tool_0002", "{}", AG_OK, NULL);
  validate_is(r, "tool_99", "{}", AG_ENOTFOUND, NULL);
  json_t *tools = ag_registry_tools_json(r);
  cr_assert_eq(json_array_size(tools), 1024);
  json_decref(tools);
  ag_registry_free(r);
}

/* ------------------------------------------------------------------------ */
/* Threads                                                                  */
/* ------------------------------------------------------------------------ */

typedef struct shared {
  const ag_registry *r;
  json_t *good, *bad;
} shared;

static void *reader(void *p) {
  shared *sh = p;
  intptr_t failures = 0;
  for (int i = 0; i < 1000; i++) {
    ag_error_t err;
    if (ag_registry_validate(sh->r, "write", sh->good, &err) != AG_OK)
      failures++;
    if (ag_registry_validate(sh->r, "write", sh->bad, &err) != AG_EINVAL ||
        strcmp(err.msg,
               "unexpected property \"contnt\"; did you mean \"content\"?") !=
            0)
      failures++;
    if (ag_registry_validate(sh->r, "wrte", sh->good, &err) != AG_ENOTFOUND ||
        strcmp(err.msg, "unknown tool \"wrte\"; did you mean \"write\"?") != 0)
      failures++;
    if (ag_registry_get(sh->r, "read") == NULL)
      failures++;
    if (i % 50 == 0) {
      json_t *t = ag_registry_tools_json(sh->r);
      if (json_array_size(t) != 3)
        failures++;
      json_decref(t);
    }
  }
  return (void *)failures;
}

Test(registry, concurrent_reads) {
  ag_registry *r = new_registry();
  ag_tool_def d =
      native("write", "{\"type\":\"object\",\"properties\":{\"path\":{\"type\":"
                      "\"string\",\"pattern\":\"^/\"},\"content\":{\"type\":"
                      "\"string\",\"maxLength\":100}},\"required\":[\"path\"],"
                      "\"additionalProperties\":false}");
  add_ok(r, &d);
  d = native("read", NULL);
  add_ok(r, &d);
  d = native("list", "{\"properties\":{\"n\":{\"enum\":[1,2]}}}");
  add_ok(r, &d);
  shared sh = {r, parse("{\"path\":\"/a\",\"content\":\"hi\"}"),
               parse("{\"path\":\"/a\",\"contnt\":\"hi\"}")};
  pthread_t t[4];
  for (int i = 0; i < 4; i++)
    cr_assert_eq(pthread_create(&t[i], NULL, reader, &sh), 0);
  intptr_t total = 0;
  for (int i = 0; i < 4; i++) {
    void *res;
    pthread_join(t[i], &res);
    total += (intptr_t)res;
  }
  cr_assert_eq(total, 0, "%ld failed checks", (long)total);
  json_decref(sh.good);
  json_decref(sh.bad);
  ag_registry_free(r);
}

Test(registry, new_rejects_null_out) {
  ag_error_t err;
  cr_assert_eq(ag_registry_new(NULL, &err), AG_EINVAL);
  ag_registry *r = new_registry();
  cr_assert_eq(ag_registry_add(r, NULL, &err), AG_EINVAL);
  cr_assert_eq(ag_registry_add(NULL, NULL, NULL), AG_EINVAL);
  ag_registry_free(r);
}

/* A subprocess tool's env list is checked and copied (docs/tools.md). */
Test(registry, env_checked_and_copied) {
  ag_registry *r = new_registry();
  char e0[] = "MY_TOKEN", e1[] = "GREETING=hello world";
  const char *env[] = {e0, e1, NULL};
  const char *argv[] = {"env", NULL};
  ag_tool_def d;
  ag_tool_def_init(&d);
  cr_expect_null(d.env);
  cr_expect_not(d.inherit_env);
  d.name = "envtool";
  d.argv = argv;
  d.env = env;
  add_ok(r, &d);
  e0[0] = 'X';
  e1[0] = 'X';
  const ag_tool_def *got = ag_registry_get(r, "envtool");
  cr_assert_not_null(got->env);
  cr_expect_str_eq(got->env[0], "MY_TOKEN");
  cr_expect_str_eq(got->env[1], "GREETING=hello world");
  cr_expect_null(got->env[2]);

  const char *bad[] = {"GOOD", "1BAD", NULL};
  d.name = "bad";
  d.env = bad;
  add_fails(r, &d, AG_EINVAL,
            "tools.bad: env[1]: \"1BAD\" is not NAME or NAME=value (NAME: "
            "letters, digits and _, not starting with a digit, at most 128)");
  const char *empty[] = {"=x", NULL};
  d.env = empty;
  add_fails(r, &d, AG_EINVAL, NULL);
  /* Only subprocess tools have an environment. */
  ag_tool_def n = native("native_env", NULL);
  n.env = env;
  add_fails(r, &n, AG_EINVAL,
            "tools.native_env: env and inherit_env are for subprocess tools "
            "(argv)");
  ag_registry_free(r);
}
