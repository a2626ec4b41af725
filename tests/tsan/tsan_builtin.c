/*
 * tests/tsan/tsan_builtin.c - the built-in tools on the scheduler's pool
 * threads: batches of 8 calls (reads, listings, searches, writes and edits
 * of distinct files, and escape attempts) run in parallel over one shared
 * workdir state, under both resolvers, 20 rounds each. Checks every
 * result, that nothing outside the workdir changed and that no descriptor
 * leaked; under TSan, that the shared state is only read.
 */
#define _GNU_SOURCE

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "agentguard/exec.h"
#include "tsan_common.h"

static char T[PATH_MAX], WD[PATH_MAX + 8];

static void put(const char *rel, const char *text) {
  char p[PATH_MAX * 2];
  snprintf(p, sizeof(p), "%s/%s", T, rel);
  FILE *f = fopen(p, "wb");
  CHECK(f != NULL, "cannot create %s", p);
  fputs(text, f);
  fclose(f);
}

int main(void) {
  snprintf(T, sizeof(T), "/tmp/ag_tsan_builtin_XXXXXX");
  CHECK(mkdtemp(T) != NULL, "mkdtemp: errno %d", errno);
  snprintf(WD, sizeof(WD), "%s/wd", T);
  CHECK(mkdir(WD, 0755) == 0, "mkdir %s", WD);
  put("secret.txt", "TOP-SECRET\n");
  put("wd/a.txt", "alpha\nbeta\n");
  char link_path[PATH_MAX * 2];
  snprintf(link_path, sizeof(link_path), "%s/out", WD);
  CHECK(symlink("..", link_path) == 0, "symlink");
  int fds0 = tsan_count_fds();

  ag_config cfg;
  ag_config_init(&cfg);
  cfg.loop.parallel = true;
  cfg.loop.max_parallel = 4;
  const ag_resolve_mode modes[2] = {AG_RESOLVE_OPENAT2, AG_RESOLVE_WALK};
  for (int m = 0; m < 2; m++) {
    ag_registry *reg = NULL;
    ag_error_t err;
    CHECK(ag_registry_new(&reg, &err) == AG_OK, "%s", err.msg);
    ag_builtin_opts o;
    ag_builtin_opts_init(&o);
    o.workdir = WD;
    o.resolve = modes[m];
    CHECK(ag_builtin_register(reg, &o, &err) == AG_OK, "%s", err.msg);
    ag_scheduler *s = NULL;
    CHECK(ag_scheduler_new(&s, reg, &cfg, NULL, &err) == AG_OK, "%s", err.msg);
    for (int round = 0; round < 20; round++) {
      char w[4][128];
      for (int i = 0; i < 4; i++)
        snprintf(w[i], sizeof(w[i]),
                 "{\"path\": \"d%d/f.txt\", \"content\": \"r%d\\n\"}", i,
                 round);
      const char *args[8] = {w[0],
                             w[1],
                             w[2],
                             w[3],
                             "{\"path\": \"a.txt\"}",
                             "{}",
                             "{\"pattern\": \"beta\"}",
                             "{\"path\": \"out/secret.txt\"}"};
      const char *tools[8] = {"write_file",  "write_file", "write_file",
                              "write_file",  "read_file",  "list_dir",
                              "search_text", "read_file"};
      ag_exec_call calls[8];
      for (int i = 0; i < 8; i++)
        calls[i] =
            (ag_exec_call){tools[i], args[i], strlen(args[i]), false, NULL};
      ag_exec_result res[8];
      CHECK(ag_scheduler_run(s, calls, 8, NULL, res, &err) == AG_OK, "%s",
            err.msg);
      for (int i = 0; i < 7; i++)
        CHECK(res[i].status == AG_EXEC_OK, "call %d (%s): %s", i, tools[i],
              res[i].text);
      CHECK(strcmp(res[4].text, "alpha\nbeta\n") == 0, "read: %s", res[4].text);
      CHECK(strstr(res[6].text, "a.txt:2:beta") != NULL, "search: %s",
            res[6].text);
      CHECK(res[7].status == AG_EXEC_ERROR &&
                strstr(res[7].text, "escapes the workdir") != NULL,
            "escape: %s", res[7].text);
      for (int i = 0; i < 8; i++)
        ag_exec_result_clear(&res[i]);
    }
    ag_scheduler_free(s);
    ag_registry_free(reg);
  }
  CHECK(tsan_count_fds() == fds0, "descriptors leaked: %d before, %d after",
        fds0, tsan_count_fds());
  char cmd[PATH_MAX + 32];
  snprintf(cmd, sizeof(cmd), "%s/secret.txt", T);
  FILE *f = fopen(cmd, "rb");
  char buf[64] = "";
  CHECK(f != NULL && fgets(buf, sizeof(buf), f) != NULL, "secret gone");
  fclose(f);
  CHECK(strcmp(buf, "TOP-SECRET\n") == 0, "secret changed: %s", buf);
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", T);
  CHECK(system(cmd) == 0, "cleanup");
  printf("tsan_builtin: ok\n");
  return 0;
}
