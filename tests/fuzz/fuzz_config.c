/*
 * tests/fuzz/fuzz_config.c - libFuzzer target for the config reader
 * (ag_config_parse, src/core/config.c). Built by CMake with clang
 * (AG_FUZZ); scripts/fuzz.sh builds and runs it with its seed corpus
 * (tests/fuzz/corpus/config/) and dictionary (tests/fuzz/config.dict).
 *
 * Properties checked on every input:
 *  - ag_config_parse either succeeds or fails with AG_EJSON or AG_ECONFIG
 *    and a non-empty message, leaving the config untouched;
 *  - an accepted config passes ag_config_validate, and its JSON form
 *    (ag_config_to_json) parses back to a config with the same JSON form.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agentguard.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int ok, const char *what) {
  if (!ok) {
    fprintf(stderr, "fuzz_config: property failed: %s\n", what);
    abort();
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ag_config cfg, before;
  ag_config_init(&cfg);
  memcpy(&before, &cfg, sizeof cfg);
  ag_error_t err;
  ag_err_t rc = ag_config_parse(&cfg, (const char *)data, size, &err);
  if (rc != AG_OK) {
    check(rc == AG_EJSON || rc == AG_ECONFIG, "documented error code");
    check(err.code == rc, "err.code is the returned code");
    check(err.msg[0] != '\0', "a message says what is wrong");
    check(memchr(err.msg, '\0', sizeof err.msg) != NULL,
          "the message is terminated");
    check(memcmp(&before, &cfg, sizeof cfg) == 0,
          "the config is untouched on error");
    return 0;
  }
  check(ag_config_validate(&cfg, &err) == AG_OK,
        "an accepted config validates");

  char *json = NULL;
  check(ag_config_to_json(&cfg, &json, &err) == AG_OK, "ag_config_to_json");
  ag_config again;
  ag_config_init(&again);
  if (ag_config_parse(&again, json, strlen(json), &err) != AG_OK) {
    fprintf(stderr, "fuzz_config: %s\n%s\n", err.msg, json);
    check(0, "the JSON form of an accepted config parses back");
  }
  char *json2 = NULL;
  check(ag_config_to_json(&again, &json2, &err) == AG_OK,
        "ag_config_to_json (again)");
  if (strcmp(json, json2) != 0) {
    fprintf(stderr, "fuzz_config: first:\n%s\nsecond:\n%s\n", json, json2);
    check(0, "the JSON form is a fixed point");
  }
  ag_free(json);
  ag_free(json2);
  return 0;
}
