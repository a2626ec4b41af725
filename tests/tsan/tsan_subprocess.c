/*
 * tests/tsan/tsan_subprocess.c - ag__subprocess_run from 4 threads at once,
 * as a plain program for ThreadSanitizer (tests/runtime/test_subprocess.c
 * holds the single-run behaviour). Each thread, several times over, runs:
 *   - cat with input on stdin (the output must be exactly the input);
 *   - a process group (a shell and two background sleeps) that times out
 *     and must be killed as a whole;
 *   - `sleep 10` cancelled by the user from yet another thread;
 *   - a program that does not exist (exec failure);
 *   - a shell that ignores SIGTERM and starts a setsid escapee, cancelled
 *     from one thread and forced (ag_cancel_force) from another: nothing
 *     of it may be left when the run returns.
 * Afterwards the process must hold the same descriptors as before and have
 * no child left to reap. Exits 0 when every check holds; the first failed
 * check prints both sides and exits 1.
 */
#include <ctype.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "exec/internal.h"
#include "tsan_common.h"

#define THREADS 4
#define ROUNDS 3

static const char *status_name(ag_tool_status s) {
  switch (s) {
  case AG_TOOL_OK:
    return "ok";
  case AG_TOOL_ERROR:
    return "error";
  case AG_TOOL_TIMEOUT:
    return "timeout";
  case AG_TOOL_CANCELLED:
    return "cancelled";
  }
  return "?";
}

static ag_cancel *new_token(int64_t deadline, ag_cancel_reason why) {
  ag_cancel *c = NULL;
  ag_error_t err;
  ag_error_clear(&err);
  ag_err_t rc = ag_cancel_new(&c, NULL, deadline, why, &err);
  CHECK(rc == AG_OK, "ag_cancel_new: %s (%s)", ag_err_name(rc), err.msg);
  return c;
}

typedef struct run {
  ag_tool_status st;
  ag__proc_info info;
  ag_output out, err;
  long long took_ms;
} run;

static void run_argv(run *r, const char *const *argv, const char *input,
                     size_t input_len, ag_cancel *cancel, int64_t grace_ms) {
  memset(r, 0, sizeof(*r));
  CHECK(ag__output_init(&r->out, 1 << 20) == AG_OK, "output init");
  CHECK(ag__output_init(&r->err, 1 << 20) == AG_OK, "output init");
  long long t0 = tsan_now_ms();
  r->st = ag__subprocess_run(argv, NULL, grace_ms, input, input_len, cancel,
                             &r->out, &r->err, &r->info);
  r->took_ms = tsan_now_ms() - t0;
}

static void run_done(run *r) {
  ag__output_free(&r->out);
  ag__output_free(&r->err);
}

static const char *text(const ag_output *o) {
  return o->buf != NULL ? o->buf : "";
}

#define CHECK_STATUS(r, want, what)                                            \
  CHECK((r)->st == (want), "%s: status %s, want %s (stderr \"%s\")", (what),   \
        status_name((r)->st), status_name(want), text(&(r)->err))

/* True while a process that is not a zombie has process group `pgid`.
 * Zombies are ignored: orphaned grandchildren are reparented to PID 1,
 * which in a container may never reap them, and a zombie runs nothing. */
static bool group_alive(pid_t pgid) {
  DIR *d = opendir("/proc");
  CHECK(d != NULL, "opendir /proc: errno %d", errno);
  bool alive = false;
  struct dirent *e;
  while (!alive && (e = readdir(d)) != NULL) {
    if (!isdigit((unsigned char)e->d_name[0]))
      continue;
    char path[300], line[1024];
    snprintf(path, sizeof(path), "/proc/%s/stat", e->d_name);
    FILE *f = fopen(path, "r");
    if (f == NULL)
      continue;
    size_t n = fread(line, 1, sizeof(line) - 1, f);
    fclose(f);
    line[n] = '\0';
    char *rp = strrchr(line, ')'); /* comm may hold spaces and parens */
    char state;
    int ppid, pgrp;
    if (rp != NULL && sscanf(rp + 1, " %c %d %d", &state, &ppid, &pgrp) == 3 &&
        pgrp == pgid && state != 'Z')
      alive = true;
  }
  closedir(d);
  return alive;
}

typedef struct canceller {
  ag_cancel *token;
  int after_ms;
} canceller;

static void *cancel_later(void *arg) {
  canceller *k = arg;
  tsan_sleep_ms(k->after_ms);
  ag_cancel_cancel(k->token, AG_CANCEL_USER);
  return NULL;
}

/* cat with input: what goes in comes out, byte for byte. */
static void cat_round(int id, int round) {
  size_t n = 64 * 1024 + (size_t)(id * 1000 + round);
  char *in = malloc(n);
  CHECK(in != NULL, "malloc %zu", n);
  for (size_t i = 0; i < n; i++)
    in[i] = (char)('a' + (i * 7 + (size_t)id + (size_t)round) % 26);
  const char *argv[] = {"cat", NULL};
  ag_cancel *t = new_token(ag_now_ms() + 30000, AG_CANCEL_TIMEOUT);
  run r;
  run_argv(&r, argv, in, n, t, 100);
  CHECK_STATUS(&r, AG_TOOL_OK, "cat");
  CHECK(r.out.len == n && memcmp(r.out.buf, in, n) == 0,
        "thread %d round %d: cat gave back %zu bytes%s, want the %zu sent", id,
        round, r.out.len, r.out.len == n ? " that differ" : "", n);
  CHECK(r.info.exit_code == 0 && !r.info.killed,
        "cat: exit code %d, killed %d, want 0 and 0", r.info.exit_code,
        (int)r.info.killed);
  run_done(&r);
  ag_cancel_free(t);
  free(in);
}

/* A shell with two background sleeps times out: the whole group goes. The
 * timeout leaves the shell a second to print its pid: under TSan on a loaded
 * machine 150 ms was sometimes not enough to start it (about 1 run in 3 at
 * load 4-20). */
static void group_timeout_round(int id, int round) {
  const char *argv[] = {"sh", "-c", "echo $$; sleep 30 & sleep 30 & wait",
                        NULL};
  ag_cancel *t = new_token(ag_now_ms() + 1000, AG_CANCEL_TIMEOUT);
  run r;
  run_argv(&r, argv, NULL, 0, t, 200);
  CHECK_STATUS(&r, AG_TOOL_TIMEOUT, "group timeout");
  CHECK(r.info.killed, "thread %d round %d: timed out but not killed", id,
        round);
  CHECK(r.took_ms < 8000,
        "thread %d round %d: a 1 s timeout (200 ms grace) took %lld ms", id,
        round, r.took_ms);
  int pgid = atoi(text(&r.out));
  CHECK(pgid > 1, "thread %d round %d: the shell printed \"%s\", want its pid",
        id, round, text(&r.out));
  bool gone = false;
  for (int waited = 0; waited <= 3000 && !gone; waited += 20) {
    gone = !group_alive((pid_t)pgid);
    if (!gone)
      tsan_sleep_ms(20);
  }
  CHECK(gone,
        "thread %d round %d: process group %d still alive 3 s after "
        "the run returned",
        id, round, pgid);
  run_done(&r);
  ag_cancel_free(t);
}

/* `sleep 10`, cancelled by the user from another thread after 60 ms. */
static void user_cancel_round(int id, int round) {
  ag_cancel *t = new_token(INT64_MAX, AG_CANCEL_TIMEOUT);
  canceller k = {t, 60};
  pthread_t th;
  int rc = pthread_create(&th, NULL, cancel_later, &k);
  CHECK(rc == 0, "pthread_create: %d", rc);
  const char *argv[] = {"sleep", "10", NULL};
  run r;
  run_argv(&r, argv, NULL, 0, t, 2000);
  pthread_join(th, NULL);
  CHECK_STATUS(&r, AG_TOOL_CANCELLED, "user cancel");
  CHECK(r.info.killed, "thread %d round %d: cancelled but not killed", id,
        round);
  CHECK(r.took_ms < 5000,
        "thread %d round %d: a cancel after 60 ms returned after %lld ms", id,
        round, r.took_ms);
  run_done(&r);
  ag_cancel_free(t);
}

static void exec_failure_round(int id, int round) {
  const char *argv[] = {"agentguard-no-such-program-tsan", "x", NULL};
  ag_cancel *t = new_token(ag_now_ms() + 30000, AG_CANCEL_TIMEOUT);
  run r;
  run_argv(&r, argv, "{}", 2, t, 100);
  CHECK_STATUS(&r, AG_TOOL_ERROR, "exec failure");
  CHECK(r.info.exec_failed && r.info.exec_errno == ENOENT,
        "thread %d round %d: exec_failed %d, errno %d, want 1 and ENOENT (%d)",
        id, round, (int)r.info.exec_failed, r.info.exec_errno, ENOENT);
  const char *want = "cannot run 'agentguard-no-such-program-tsan': No such "
                     "file or directory";
  CHECK(strcmp(text(&r.err), want) == 0, "stderr \"%s\", want \"%s\"",
        text(&r.err), want);
  CHECK(r.out.len == 0, "stdout \"%s\", want nothing", text(&r.out));
  run_done(&r);
  ag_cancel_free(t);
}

static void *force_later(void *arg) {
  canceller *k = arg;
  tsan_sleep_ms(k->after_ms);
  ag_cancel_force(k->token);
  return NULL;
}

/* Whether `pid` runs (exists and is not a zombie). */
static bool pid_runs(int pid) {
  char path[64], line[512];
  snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  FILE *f = fopen(path, "r");
  if (f == NULL)
    return false;
  size_t n = fread(line, 1, sizeof(line) - 1, f);
  fclose(f);
  line[n] = '\0';
  char *rp = strrchr(line, ')');
  return rp != NULL && rp[1] == ' ' && rp[2] != 'Z';
}

/* Cancelled, then forced while it ignores SIGTERM: all gone at once. */
static void forced_round(int id, int round) {
  ag_cancel *t = new_token(INT64_MAX, AG_CANCEL_TIMEOUT);
  /* wide margins: the shell must have printed both pids first, on a
   * loaded machine under a sanitizer */
  canceller k1 = {t, 600}, k2 = {t, 1200};
  pthread_t th1, th2;
  int rc = pthread_create(&th1, NULL, cancel_later, &k1);
  CHECK(rc == 0, "pthread_create: %d", rc);
  rc = pthread_create(&th2, NULL, force_later, &k2);
  CHECK(rc == 0, "pthread_create: %d", rc);
  const char *argv[] = {"sh", "-c",
                        "trap '' TERM; echo $$; (setsid sleep 30 </dev/null "
                        ">/dev/null 2>&1 & echo $!); sleep 30",
                        NULL};
  run r;
  run_argv(&r, argv, NULL, 0, t, 20000);
  pthread_join(th1, NULL);
  pthread_join(th2, NULL);
  CHECK_STATUS(&r, AG_TOOL_CANCELLED, "forced");
  CHECK(r.took_ms < 5000,
        "thread %d round %d: forced after 1200 ms, returned after %lld ms "
        "(grace 20 s)",
        id, round, r.took_ms);
  int sh = 0, escapee = 0;
  CHECK(sscanf(text(&r.out), "%d %d", &sh, &escapee) == 2,
        "thread %d round %d: stdout \"%s\", want two pids", id, round,
        text(&r.out));
  CHECK(!pid_runs(sh) && !pid_runs(escapee),
        "thread %d round %d: shell %d or escapee %d left running", id, round,
        sh, escapee);
  run_done(&r);
  ag_cancel_free(t);
}

static void *spawner(void *arg) {
  int id = (int)(intptr_t)arg;
  for (int round = 0; round < ROUNDS; round++) {
    /* each thread starts the cycle at a different kind of run */
    for (int k = 0; k < 4; k++) {
      switch ((k + id) % 4) {
      case 0:
        cat_round(id, round);
        break;
      case 1:
        group_timeout_round(id, round);
        break;
      case 2:
        user_cancel_round(id, round);
        break;
      default:
        exec_failure_round(id, round);
        break;
      }
    }
    forced_round(id, round);
  }
  return NULL;
}

int main(void) {
  int fds_before = tsan_count_fds();
  long long t0 = tsan_now_ms();
  pthread_t th[THREADS];
  for (int i = 0; i < THREADS; i++) {
    int rc = pthread_create(&th[i], NULL, spawner, (void *)(intptr_t)i);
    CHECK(rc == 0, "pthread_create: %d", rc);
  }
  for (int i = 0; i < THREADS; i++)
    pthread_join(th[i], NULL);
  int fds_after = tsan_count_fds();
  CHECK(fds_after == fds_before, "open fds: %d before, %d after", fds_before,
        fds_after);
  errno = 0;
  pid_t w = waitpid(-1, NULL, WNOHANG);
  int e = errno;
  CHECK(w == -1 && e == ECHILD,
        "a child was left behind: waitpid(-1) = %d (errno %d), want -1 "
        "(ECHILD %d)",
        (int)w, e, ECHILD);
  printf("tsan_subprocess: ok (%d threads x %d rounds x 5 runs in %lld ms)\n",
         THREADS, ROUNDS, tsan_now_ms() - t0);
  return 0;
}
