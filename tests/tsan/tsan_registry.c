/*
 * tests/tsan/tsan_registry.c - concurrent reads of one tool registry, as a
 * plain program for ThreadSanitizer (Criterion cannot start under TSan;
 * tests/runtime/test_registry.c holds the single-threaded behaviour).
 *
 * Eight threads, released together by a barrier, validate good and bad
 * arguments (patterns, enum/const with numeric equality, nested arrays,
 * additionalProperties with suggestions) - some shared between threads,
 * some parsed by the thread itself - look tools up by name and by index,
 * ask for unknown ones and build the tools array, all against one registry
 * filled beforehand. A registry is read-only once tools are added (exec.h),
 * so none of this may race. Exits 0 when every answer was right; the first
 * wrong one is printed with what was expected, and exits 1.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "exec/internal.h"
#include "tsan_common.h"

#define THREADS 8
#define ROUNDS 500

static ag_tool_status noop(void *user, const json_t *args, ag_cancel *cancel,
                           ag_output *out) {
  (void)user;
  (void)args;
  (void)cancel;
  (void)out;
  return AG_TOOL_OK;
}

static json_t *parse(const char *text) {
  json_error_t je;
  json_t *v = json_loads(text, 0, &je);
  CHECK(v != NULL, "test JSON %s: %s", text, je.text);
  return v;
}

typedef struct shared {
  const ag_registry *r;
  pthread_barrier_t go;
  json_t *good, *bad_nested, *bad_typo;
} shared;

typedef struct reader_arg {
  shared *sh;
  int id;
} reader_arg;

/* One validation: the code, and the message when `msg` is not NULL. */
static void validate_is(const ag_registry *r, const char *tool,
                        const json_t *args, ag_err_t want, const char *msg,
                        int id, int round) {
  ag_error_t err;
  ag_error_clear(&err);
  ag_err_t rc = ag_registry_validate(r, tool, args, &err);
  CHECK(rc == want, "thread %d round %d, validate %s: got %s (\"%s\"), want %s",
        id, round, tool, ag_err_name(rc), err.msg, ag_err_name(want));
  if (msg != NULL)
    CHECK(strcmp(err.msg, msg) == 0,
          "thread %d round %d, validate %s: message \"%s\", want \"%s\"", id,
          round, tool, err.msg, msg);
}

static const char *const names[] = {"edit", "list", "search", "grep"};

static void *reader(void *p) {
  reader_arg *a = p;
  shared *sh = a->sh;
  const ag_registry *r = sh->r;
  int id = a->id;
  /* arguments of this thread's own, parsed concurrently with the others */
  char text[128];
  snprintf(text, sizeof(text), "{\"q\":\"file-%d.c\"}", id);
  json_t *mine = parse(text);
  snprintf(text, sizeof(text), "{\"q\":\"two words %d\"}", id);
  json_t *mine_bad = parse(text);

  pthread_barrier_wait(&sh->go);
  for (int i = 0; i < ROUNDS; i++) {
    validate_is(r, "edit", sh->good, AG_OK, NULL, id, i);
    validate_is(r, "edit", sh->bad_nested, AG_EINVAL,
                "/files/1/path: must match pattern \"^/\"", id, i);
    validate_is(r, "edit", sh->bad_typo, AG_EINVAL,
                "unexpected property \"mdoe\"; did you mean \"mode\"?", id, i);
    validate_is(r, "edti", sh->good, AG_ENOTFOUND,
                "unknown tool \"edti\"; did you mean \"edit\"?", id, i);
    validate_is(r, "search", mine, AG_OK, NULL, id, i);
    validate_is(r, "search", mine_bad, AG_EINVAL, NULL, id, i);
    validate_is(r, "list", mine, AG_OK, NULL, id, i);

    const char *name = names[(i + id) % 4];
    const ag_tool_def *d = ag_registry_get(r, name);
    CHECK(d != NULL && strcmp(d->name, name) == 0,
          "thread %d: ag_registry_get(%s) gave %s", id, name,
          d != NULL ? d->name : "NULL");
    const ag__tool *t = ag__registry_find(r, name);
    CHECK(t != NULL && &t->def == d,
          "thread %d: ag__registry_find(%s) and ag_registry_get disagree", id,
          name);
    CHECK(ag_registry_get(r, "nope") == NULL, "thread %d: found \"nope\"", id);
    size_t n = ag_registry_count(r);
    CHECK(n == 4, "thread %d: %zu tools, want 4", id, n);
    const char *nth = ag_registry_name(r, (size_t)(i % 4));
    CHECK(nth != NULL && strcmp(nth, names[i % 4]) == 0,
          "thread %d: tool %d is %s, want %s", id, i % 4,
          nth != NULL ? nth : "NULL", names[i % 4]);
    const ag_tool_def *grep = ag_registry_get(r, "grep");
    CHECK(grep != NULL && grep->argv != NULL &&
              strcmp(grep->argv[0], "grep") == 0 && grep->argv[2] == NULL,
          "thread %d: the subprocess tool's argv was not kept", id);

    if (i % 50 == id % 50) {
      json_t *tools = ag_registry_tools_json(r);
      CHECK(json_array_size(tools) == 4,
            "thread %d: tools array of %zu, "
            "want 4",
            id, json_array_size(tools));
      for (size_t k = 0; k < 4; k++) {
        const char *got = json_string_value(json_object_get(
            json_object_get(json_array_get(tools, k), "function"), "name"));
        CHECK(got != NULL && strcmp(got, names[k]) == 0,
              "thread %d: tools[%zu].function.name is %s, want %s", id, k,
              got != NULL ? got : "NULL", names[k]);
      }
      /* the caller owns the array: changing it must not reach the registry
       * or the other threads' copies */
      json_object_set_new(json_object_get(json_array_get(tools, 0), "function"),
                          "name", json_string("changed"));
      json_decref(tools);
    }
  }
  json_decref(mine);
  json_decref(mine_bad);
  return NULL;
}

int main(void) {
  ag_registry *r = NULL;
  ag_error_t err;
  ag_error_clear(&err);
  ag_err_t rc = ag_registry_new(&r, &err);
  CHECK(rc == AG_OK, "ag_registry_new: %s (%s)", ag_err_name(rc), err.msg);
  static const char *const defs[][2] = {
      {"edit",
       "{\"type\":\"object\",\"properties\":{\"files\":{\"type\":\"array\","
       "\"minItems\":1,\"items\":{\"type\":\"object\",\"properties\":{"
       "\"path\":{\"type\":\"string\",\"pattern\":\"^/\",\"maxLength\":256},"
       "\"n\":{\"type\":\"integer\",\"enum\":[1,2,3]}},\"required\":"
       "[\"path\"]}},\"mode\":{\"const\":{\"k\":[1,\"w\"]}}},\"required\":"
       "[\"files\"],\"additionalProperties\":false}"},
      {"list", NULL},
      {"search",
       "{\"properties\":{\"q\":{\"pattern\":\"^[[:alnum:]_.-]+$\"}}}"},
  };
  for (size_t i = 0; i < sizeof(defs) / sizeof(defs[0]); i++) {
    ag_tool_def d;
    ag_tool_def_init(&d);
    d.name = defs[i][0];
    d.description = "a tool";
    d.parameters = defs[i][1];
    d.fn = noop;
    rc = ag_registry_add(r, &d, &err);
    CHECK(rc == AG_OK, "add %s: %s (%s)", d.name, ag_err_name(rc), err.msg);
  }
  const char *grep_argv[] = {"grep", "-n", NULL};
  ag_tool_def d;
  ag_tool_def_init(&d);
  d.name = "grep";
  d.argv = grep_argv;
  rc = ag_registry_add(r, &d, &err);
  CHECK(rc == AG_OK, "add grep: %s (%s)", ag_err_name(rc), err.msg);

  shared sh;
  sh.r = r;
  sh.good = parse("{\"files\":[{\"path\":\"/a\",\"n\":2.0}],\"mode\":{"
                  "\"k\":[1.0,\"w\"]}}");
  sh.bad_nested = parse("{\"files\":[{\"path\":\"/a\"},{\"path\":\"b\"}]}");
  sh.bad_typo = parse("{\"files\":[{\"path\":\"/a\"}],\"mdoe\":1}");
  CHECK(pthread_barrier_init(&sh.go, NULL, THREADS) == 0,
        "pthread_barrier_init");
  pthread_t th[THREADS];
  reader_arg args[THREADS];
  for (int i = 0; i < THREADS; i++) {
    args[i] = (reader_arg){&sh, i};
    int e = pthread_create(&th[i], NULL, reader, &args[i]);
    CHECK(e == 0, "pthread_create: %d", e);
  }
  for (int i = 0; i < THREADS; i++)
    pthread_join(th[i], NULL);
  pthread_barrier_destroy(&sh.go);

  /* nothing the threads did changed the registry */
  json_t *tools = ag_registry_tools_json(r);
  const char *first = json_string_value(json_object_get(
      json_object_get(json_array_get(tools, 0), "function"), "name"));
  CHECK(first != NULL && strcmp(first, "edit") == 0,
        "tools[0].function.name is %s after the threads, want edit",
        first != NULL ? first : "NULL");
  json_decref(tools);
  json_decref(sh.good);
  json_decref(sh.bad_nested);
  json_decref(sh.bad_typo);
  ag_registry_free(r);
  printf("tsan_registry: ok (%d threads x %d rounds)\n", THREADS, ROUNDS);
  return 0;
}
