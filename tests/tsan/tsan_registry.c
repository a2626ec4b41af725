/*
 * tests/tsan/tsan_registry.c - concurrent reads of one tool registry, as a
 * plain program for ThreadSanitizer (Criterion cannot start under TSan).
 *
 * Four threads validate good and bad arguments (patterns, enum/const with
 * numeric equality, nested arrays, additionalProperties with suggestions),
 * look tools up, ask for unknown ones and build the tools array, all against
 * one registry filled beforehand. Exits 0 when every answer was right; TSan
 * makes it fail on any data race.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "exec/internal.h"

#define THREADS 4
#define ROUNDS 2000

static ag_tool_status noop(void *user, const json_t *args, ag_cancel *cancel,
                           ag_output *out) {
  (void)user;
  (void)args;
  (void)cancel;
  (void)out;
  return AG_TOOL_OK;
}

typedef struct shared {
  const ag_registry *r;
  json_t *good, *bad_nested, *bad_typo;
} shared;

static int expect(ag_err_t rc, ag_err_t want, const ag_error_t *err,
                  const char *msg) {
  if (rc != want)
    return 1;
  return msg != NULL && strcmp(err->msg, msg) != 0;
}

static void *reader(void *p) {
  shared *sh = p;
  intptr_t failures = 0;
  for (int i = 0; i < ROUNDS; i++) {
    ag_error_t err;
    failures += expect(ag_registry_validate(sh->r, "edit", sh->good, &err),
                       AG_OK, &err, NULL);
    failures +=
        expect(ag_registry_validate(sh->r, "edit", sh->bad_nested, &err),
               AG_EINVAL, &err, "/files/1/path: must match pattern \"^/\"");
    failures += expect(ag_registry_validate(sh->r, "edit", sh->bad_typo, &err),
                       AG_EINVAL, &err,
                       "unexpected property \"mdoe\"; did you mean \"mode\"?");
    failures += expect(ag_registry_validate(sh->r, "edti", sh->good, &err),
                       AG_ENOTFOUND, &err,
                       "unknown tool \"edti\"; did you mean \"edit\"?");
    failures += ag_registry_get(sh->r, "list") == NULL;
    failures += ag__registry_find(sh->r, "nope") != NULL;
    if (i % 100 == 0) {
      json_t *tools = ag_registry_tools_json(sh->r);
      failures += json_array_size(tools) != 3;
      json_decref(tools);
    }
  }
  return (void *)failures;
}

static json_t *parse(const char *text) {
  json_t *v = json_loads(text, 0, NULL);
  if (v == NULL) {
    fprintf(stderr, "bad test JSON: %s\n", text);
    return NULL;
  }
  return v;
}

int main(void) {
  ag_registry *r = NULL;
  ag_error_t err;
  if (ag_registry_new(&r, &err) != AG_OK)
    return 1;
  static const char *const defs[][2] = {
      {"edit",
       "{\"type\":\"object\",\"properties\":{\"files\":{\"type\":\"array\","
       "\"minItems\":1,\"items\":{\"type\":\"object\",\"properties\":{"
       "\"path\":{\"type\":\"string\",\"pattern\":\"^/\",\"maxLength\":256},"
       "\"n\":{\"type\":\"integer\",\"enum\":[1,2,3]}},\"required\":"
       "[\"path\"]}},\"mode\":{\"const\":{\"k\":[1,\"w\"]}}},\"required\":"
       "[\"files\"],\"additionalProperties\":false}"},
      {"list", NULL},
      {"search", "{\"properties\":{\"q\":{\"pattern\":\"^[\\\\w.-]+$\"}}}"},
  };
  for (size_t i = 0; i < sizeof(defs) / sizeof(defs[0]); i++) {
    ag_tool_def d;
    ag_tool_def_init(&d);
    d.name = defs[i][0];
    d.parameters = defs[i][1];
    d.fn = noop;
    if (ag_registry_add(r, &d, &err) != AG_OK) {
      fprintf(stderr, "add %s: %s\n", d.name, err.msg);
      return 1;
    }
  }
  shared sh = {r,
               parse("{\"files\":[{\"path\":\"/a\",\"n\":2.0}],\"mode\":{"
                     "\"k\":[1.0,\"w\"]}}"),
               parse("{\"files\":[{\"path\":\"/a\"},{\"path\":\"b\"}]}"),
               parse("{\"files\":[{\"path\":\"/a\"}],\"mdoe\":1}")};
  if (sh.good == NULL || sh.bad_nested == NULL || sh.bad_typo == NULL)
    return 1;
  pthread_t t[THREADS];
  for (int i = 0; i < THREADS; i++)
    if (pthread_create(&t[i], NULL, reader, &sh) != 0)
      return 1;
  intptr_t failures = 0;
  for (int i = 0; i < THREADS; i++) {
    void *res;
    pthread_join(t[i], &res);
    failures += (intptr_t)res;
  }
  json_decref(sh.good);
  json_decref(sh.bad_nested);
  json_decref(sh.bad_typo);
  ag_registry_free(r);
  if (failures != 0) {
    fprintf(stderr, "tsan_registry: %ld wrong answers\n", (long)failures);
    return 1;
  }
  printf("tsan_registry: ok (%d threads x %d rounds)\n", THREADS, ROUNDS);
  return 0;
}
