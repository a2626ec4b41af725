/*
 * tests/fuzz/fuzz_schema.c - libFuzzer target for tool registration and
 * argument validation: the JSON Schema subset of src/exec/schema.c behind
 * ag_registry_add and ag_registry_validate. Built by CMake with clang
 * (AG_FUZZ); scripts/fuzz.sh runs it with tests/fuzz/corpus/schema/ and
 * tests/fuzz/schema.dict.
 *
 * Input: a schema, then a line "---", then an instance:
 *     {"type":"object","properties":{"n":{"type":"integer"}}}
 *     ---
 *     {"n": 3}
 * (no "---": the instance is {}). The schema is registered as a native
 * tool's parameters; when that succeeds and the instance is JSON, the
 * instance is validated.
 *
 * Properties checked on every input:
 *  - registration succeeds or fails with AG_ECONFIG / AG_EINVAL and a
 *    message, and a failed registration adds no tool;
 *  - validation returns AG_OK or AG_EINVAL with a message, the same answer
 *    twice (validation keeps no state);
 *  - the registry's tools array is built.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agentguard.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok, const char *what) {
  if (!ok) {
    fprintf(stderr, "fuzz_schema: property failed: %s\n", what);
    abort();
  }
}

static ag_tool_status never_runs(void *user, const json_t *args,
                                 ag_cancel *cancel, ag_output *out) {
  (void)user;
  (void)args;
  (void)cancel;
  (void)out;
  abort();
}

static const char *find_sep(const char *s, size_t n) {
  for (size_t i = 0; i + 5 <= n; i++)
    if (memcmp(s + i, "\n---\n", 5) == 0)
      return s + i;
  return NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *in = (const char *)data;
  const char *sep = find_sep(in, size);
  size_t schema_len = sep != NULL ? (size_t)(sep - in) : size;
  const char *inst = sep != NULL ? sep + 5 : "{}";
  size_t inst_len = sep != NULL ? size - schema_len - 5 : 2;

  /* ag_tool_def.parameters is a C string. */
  char *schema = malloc(schema_len + 1);
  check(schema != NULL, "malloc");
  memcpy(schema, in, schema_len);
  schema[schema_len] = '\0';

  ag_registry *r = NULL;
  check(ag_registry_new(&r, NULL) == AG_OK, "ag_registry_new");
  ag_tool_def d;
  ag_tool_def_init(&d);
  d.name = "tool";
  d.parameters = schema;
  d.fn = never_runs;
  ag_error_t err;
  ag_err_t rc = ag_registry_add(r, &d, &err);
  if (rc != AG_OK) {
    check(rc == AG_ECONFIG || rc == AG_EINVAL, "documented error code");
    check(err.code == rc && err.msg[0] != '\0', "a message says why");
    check(ag_registry_count(r) == 0, "a failed registration adds no tool");
    goto done;
  }
  check(ag_registry_count(r) == 1, "one tool registered");

  json_error_t jerr;
  json_t *args =
      json_loadb(inst, inst_len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &jerr);
  if (args != NULL) {
    rc = ag_registry_validate(r, "tool", args, &err);
    check(rc == AG_OK || rc == AG_EINVAL, "validation: documented code");
    char first[AG_ERROR_MSG_MAX];
    memcpy(first, err.msg, sizeof first);
    if (rc == AG_EINVAL)
      check(err.msg[0] != '\0', "a violation is named");
    ag_err_t rc2 = ag_registry_validate(r, "tool", args, &err);
    check(rc2 == rc && strcmp(first, err.msg) == 0,
          "validation gives the same answer twice");
    json_decref(args);
  }
  json_t *tools = ag_registry_tools_json(r);
  check(tools != NULL && json_array_size(tools) == 1, "the tools array");
  json_decref(tools);
done:
  ag_registry_free(r);
  free(schema);
  return 0;
}
