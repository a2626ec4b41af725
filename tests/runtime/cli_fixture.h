/*
 * cli_fixture.h - what test_cli's cases share (cli_fixture.c): a temporary
 * directory DIR per test (the suite's init and fini), files written there,
 * the built program (BIN) run in DIR with its exit code, stdout and stderr
 * collected (a sanitizer report in its stderr fails the test), and the
 * check of a JSON Lines event log.
 */
#ifndef AG_TEST_CLI_FIXTURE_H
#define AG_TEST_CLI_FIXTURE_H

#include <criterion/criterion.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#define BIN AG_BINARY_DIR "/agentguard"

/* The test's temporary directory (setup, teardown). */
extern char dir[64];

void setup(void);
void teardown(void);

/* A run's outcome; result_free() frees its texts. */
typedef struct result {
  int status; /* exit code, or 128 + signal */
  char *out, *err;
} result;

/* Files in DIR: put writes one and returns its path (a ring of 8 static
 * buffers); slurp reads a whole file (caller frees). */
const char *put(const char *name, const char *text);
char *slurp(const char *path);
void result_free(result *r);

/* The program in DIR: spawn_prog starts it and collect waits for it;
 * run_full, run_sig and run start it and wait (see cli_fixture.c). */
pid_t spawn_prog(const char *const *args);
result collect(pid_t pid);
result run_full(const char *const *args, int interrupt_ms,
                const char *stdout_to);
result run_sig(const char *const *args, int interrupt_ms);
result run(const char *const *args);

#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})

/* Runs `simulate FILE` on `scenario`; expects exit 2 and `msg` in stderr. */
void refused(const char *scenario, const char *msg);

#define OK_TURN "\"turns\": [{\"user\": \"x\", \"model\": [{\"text\": \"a\"}]}]"

#define TOOL_T "\"tools\": {\"t\": {\"responses\": [{\"ok\": \"fine\"}]}}"

/* Every line a complete JSON object with the common fields; returns the
 * last one (caller decrefs), *lines their number. */
json_t *check_jsonl(const char *text, size_t *lines);

#endif
