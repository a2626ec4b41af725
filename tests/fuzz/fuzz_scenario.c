/*
 * tests/fuzz/fuzz_scenario.c - libFuzzer target for the scenario reader of
 * `agentguard simulate` (cli_scenario_load, cli/scenario.c, built into this
 * target beside the library). Built by CMake with clang (AG_FUZZ);
 * scripts/fuzz.sh runs it with tests/fuzz/corpus/scenario/ and
 * tests/fuzz/scenario.dict.
 *
 * The reader takes a path, so each input is written to one memory file
 * (memfd_create, read back through /proc/self/fd/N: a file in /tmp would
 * cost a disk write per input, 15 times slower). Nothing is run: the
 * scenario is loaded, inspected and freed.
 *
 * Properties checked on every input:
 *  - the reader returns 0 with a scenario, or AG_EXIT_USAGE with no
 *    scenario and exactly one message, which starts with the file's path
 *    and ends the line;
 *  - a loaded scenario has a valid config, at least one turn, a registry,
 *    and hands its provider over exactly once.
 */
#define _GNU_SOURCE /* memfd_create */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cli.h"
#include "scenario.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char path[64];
static int fd = -1;

static void check(int ok, const char *what) {
  if (!ok) {
    fprintf(stderr, "fuzz_scenario: property failed: %s\n", what);
    abort();
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (fd < 0) {
    fd = memfd_create("scenario", MFD_CLOEXEC);
    check(fd >= 0, "memfd_create");
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  }
  check(ftruncate(fd, 0) == 0, "ftruncate");
  check(size == 0 || pwrite(fd, data, size, 0) == (ssize_t)size, "pwrite");

  char *msg = NULL;
  size_t msg_len = 0;
  FILE *errf = open_memstream(&msg, &msg_len);
  check(errf != NULL, "open_memstream");
  cli_scenario_opts o = {.path = path, .preset = NULL, .config_path = NULL};
  cli_scenario *s = (cli_scenario *)1;
  int rc = cli_scenario_load(&s, &o, errf);
  check(fclose(errf) == 0, "fclose");

  if (rc != 0) {
    check(rc == AG_EXIT_USAGE, "bad input is a usage error");
    check(s == NULL, "no scenario on error");
    size_t plen = strlen(path);
    check(msg_len > plen + 1 && memcmp(msg, path, plen) == 0 &&
              (msg[plen] == ':' || msg[plen] == ' '),
          "the message starts with the file's path");
    check(msg[msg_len - 1] == '\n', "the message ends the line");
    check(memchr(msg, '\n', msg_len) == msg + msg_len - 1,
          "exactly one message line");
    free(msg);
    return 0;
  }
  check(msg_len == 0, "nothing printed on success");
  free(msg);
  check(s != NULL, "a scenario on success");
  ag_error_t err;
  check(ag_config_validate(cli_scenario_config(s), &err) == AG_OK,
        "the effective config is valid");
  check(cli_scenario_turn_count(s) > 0, "at least one turn");
  for (size_t i = 0; i < cli_scenario_turn_count(s); i++)
    check(cli_scenario_turn(s, i)->user != NULL, "every turn has a user text");
  check(cli_scenario_registry(s) != NULL, "a registry");
  ag_provider *p = cli_scenario_take_provider(s);
  check(p != NULL, "the provider is handed over");
  check(cli_scenario_take_provider(s) == NULL, "only once");
  ag_provider_free(p);
  cli_scenario_free(s);
  return 0;
}
