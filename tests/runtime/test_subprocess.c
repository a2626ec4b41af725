/*
 * tests/runtime/test_subprocess.c - ag__subprocess_run: exit statuses and
 * messages, exec failures, output caps, stdin feeding without deadlock,
 * timeouts and cancellation of whole process groups, rlimits, and the
 * promises "no fd left open, no zombie left, no descriptor inherited".
 *
 * Every test ends with check_clean(): the same number of entries in
 * /proc/self/fd as before and no child left to reap. Process-group checks
 * ignore zombies: orphaned grandchildren are reparented to PID 1, which in a
 * container may never reap them, and a zombie runs nothing.
 *
 * Durations are short (tens to hundreds of ms) with generous upper bounds;
 * measured latencies are printed, never asserted tightly (that is bench/'s
 * job).
 */
#define _GNU_SOURCE /* memmem */

#include <criterion/criterion.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "exec/internal.h"

/* ------------------------------------------------------------------------ */
/* Helpers                                                                  */
/* ------------------------------------------------------------------------ */

static int count_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  cr_assert_not_null(d);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] != '.')
      n++;
  }
  closedir(d);
  return n;
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* True while a process that is not a zombie has process group `pgid`. */
static bool group_alive(pid_t pgid) {
  DIR *d = opendir("/proc");
  cr_assert_not_null(d);
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

/* Waits up to `ms` for the group to be gone (signals take a moment). */
static bool group_gone_within(pid_t pgid, int ms) {
  for (int waited = 0; waited <= ms; waited += 10) {
    if (!group_alive(pgid))
      return true;
    sleep_ms(10);
  }
  return false;
}

static void check_clean(int fds_before) {
  int fds_after = count_fds();
  cr_expect_eq(fds_after, fds_before, "fds: %d before, %d after", fds_before,
               fds_after);
  errno = 0;
  pid_t w = waitpid(-1, NULL, WNOHANG);
  int e = errno;
  cr_expect(w == -1 && e == ECHILD,
            "a child was left behind: waitpid(-1) = %d (errno %d)", (int)w, e);
}

typedef struct run_result {
  ag_tool_status st;
  ag__proc_info info;
  ag_output out, err;
  int64_t elapsed_ms;
} run_result;

typedef struct run_opts {
  const ag_rlimits *limits;
  int64_t grace_ms;
  const char *input;
  size_t input_len;
  ag_cancel *cancel; /* NULL: a token with timeout_ms */
  int64_t timeout_ms;
  size_t cap;
} run_opts;

static void run_opts_init(run_opts *o) {
  memset(o, 0, sizeof(*o));
  o->grace_ms = 100;
  o->timeout_ms = 20000;
  o->cap = 1 << 20;
}

static void run_with(run_result *r, const char *const *argv,
                     const run_opts *o) {
  memset(r, 0, sizeof(*r));
  cr_assert_eq(ag__output_init(&r->out, o->cap), AG_OK);
  cr_assert_eq(ag__output_init(&r->err, o->cap), AG_OK);
  ag_cancel *own = NULL;
  ag_cancel *c = o->cancel;
  if (c == NULL) {
    cr_assert_eq(ag_cancel_new(&own, NULL, ag_now_ms() + o->timeout_ms,
                               AG_CANCEL_TIMEOUT, NULL),
                 AG_OK);
    c = own;
  }
  int64_t t0 = ag_now_ms();
  r->st = ag__subprocess_run(argv, o->limits, o->grace_ms, o->input,
                             o->input_len, c, &r->out, &r->err, &r->info);
  r->elapsed_ms = ag_now_ms() - t0;
  ag_cancel_free(own);
}

static void run(run_result *r, const char *const *argv) {
  run_opts o;
  run_opts_init(&o);
  run_with(r, argv, &o);
}

static void run_done(run_result *r) {
  ag__output_free(&r->out);
  ag__output_free(&r->err);
}

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

#define EXPECT_STATUS(r, want)                                                 \
  cr_expect_eq((r)->st, (want), "status: got %s, want %s (stderr: \"%s\")",    \
               status_name((r)->st), status_name(want),                        \
               (r)->err.buf ? (r)->err.buf : "")

#define EXPECT_TEXT(o, want)                                                   \
  cr_expect_str_eq((o).buf ? (o).buf : "", (want), "got \"%s\", want \"%s\"",  \
                   (o).buf ? (o).buf : "", (want))

/* ------------------------------------------------------------------------ */
/* Exit statuses and messages                                               */
/* ------------------------------------------------------------------------ */

Test(subprocess, echoes_stdin_to_stdout) {
  int fds = count_fds();
  const char *argv[] = {"cat", NULL};
  run_opts o;
  run_opts_init(&o);
  o.input = "hello, tool\n";
  o.input_len = strlen(o.input);
  run_result r;
  run_with(&r, argv, &o);
  EXPECT_STATUS(&r, AG_TOOL_OK);
  EXPECT_TEXT(r.out, "hello, tool\n");
  EXPECT_TEXT(r.err, "");
  cr_expect_eq(r.info.exit_code, 0);
  cr_expect_eq(r.info.term_signal, 0);
  cr_expect_not(r.info.exec_failed);
  cr_expect_not(r.info.killed);
  cr_expect_not(r.out.truncated);
  run_done(&r);
  check_clean(fds);
}

Test(subprocess, no_input_gives_eof_on_stdin) {
  int fds = count_fds();
  const char *argv[] = {"sh", "-c", "cat; echo end", NULL};
  run_result r;
  run(&r, argv);
  EXPECT_STATUS(&r, AG_TOOL_OK);
  EXPECT_TEXT(r.out, "end\n");
  run_done(&r);
  check_clean(fds);
}

Test(subprocess, nonzero_exit_uses_stderr_as_message) {
  int fds = count_fds();
  const char *argv[] = {"sh", "-c", "echo partial; echo oops >&2; exit 3",
                        NULL};
  run_result r;
  run(&r, argv);
  EXPECT_STATUS(&r, AG_TOOL_ERROR);
  EXPECT_TEXT(r.err, "oops\n");
  EXPECT_TEXT(r.out, "partial\n");
  cr_expect_eq(r.info.exit_code, 3);
  cr_expect_eq(r.info.term_signal, 0);
  run_done(&r);
  check_clean(fds);
}

Test(subprocess, nonzero_exit_with_empty_stderr_says_status) {
  int fds = count_fds();
  const char *argv[] = {"sh", "-c", "exit 3", NULL};
  run_result r;
  run(&r, argv);
  EXPECT_STATUS(&r, AG_TOOL_ERROR);
  EXPECT_TEXT(r.err, "exited with status 3");
  cr_expect_eq(r.info.exit_code, 3);
  run_done(&r);
  check_clean(fds);
}

Test(subprocess, crash_by_signal_is_an_error) {
  int fds = count_fds();
  const char *argv[] = {"sh", "-c", "kill -SEGV $$", NULL};
  run_result r;
  run(&r, argv);
  EXPECT_STATUS(&r, AG_TOOL_ERROR);
  EXPECT_TEXT(r.err, "killed by signal 11 (Segmentation fault)");
  cr_expect_eq(r.info.term_signal, SIGSEGV);
  cr_expect_eq(r.info.exit_code, -1);
  cr_expect_not(r.info.killed, "we did not kill it");
  run_done(&r);
  check_clean(fds);
}

Test(subprocess, missing_program_in_path) {
  int fds = count_fds();
  const char *argv[] = {"agentguard-no-such-program-e3", "x", NULL};
  run_result r;
  run(&r, argv);
  EXPECT_STATUS(&r, AG_TOOL_ERROR);
  cr_expect(r.info.exec_failed);
  cr_expect_eq(r.info.exec_errno, ENOENT);
  EXPECT_TEXT(r.err, "cannot run 'agentguard-no-such-program-e3': No such "
                     "file or directory");
  EXPECT_TEXT(r.out, "");
  run_done(&r);
  check_clean(fds);
}

Test(subprocess, missing_program_by_path) {
  int fds = count_fds();
  const char *argv[] = {"/nonexistent-e3/prog", NULL};
  run_result r;
  run(&r, argv);
  EXPECT_STATUS(&r, AG_TOOL_ERROR);
  cr_expect(r.info.exec_failed);
  EXPECT_TEXT(r.err,
              "cannot run '/nonexistent-e3/prog': No such file or directory");
  run_done(&r);
  check_clean(fds);
}

Test(subprocess, file_without_exec_permission) {
  char dir[] = "/tmp/ag-subprocess-XXXXXX";
  cr_assert_not_null(mkdtemp(dir));
  char path[128];
  snprintf(path, sizeof(path), "%s/tool.sh", dir);
  FILE *f = fopen(path, "w");
  cr_assert_not_null(f);
  fputs("#!/bin/sh\necho hi\n", f);
  fclose(f);
  chmod(path, 0644);
  int fds = count_fds();
  const char *argv[] = {path, NULL};
  run_result r;
  run(&r, argv);
  EXPECT_STATUS(&r, AG_TOOL_ERROR);
  cr_expect(r.info.exec_failed);
  cr_expect_eq(r.info.exec_errno, EACCES, "errno %d", r.info.exec_errno);
  cr_expect(strstr(r.err.buf, "Permission denied") != NULL, "\"%s\"",
            r.err.buf);
  run_done(&r);
  check_clean(fds);

  /* With the bit set the same script runs. */
  chmod(path, 0755);
  run(&r, argv);
  EXPECT_STATUS(&r, AG_TOOL_OK);
  EXPECT_TEXT(r.out, "hi\n");
  run_done(&r);
  unlink(path);
  rmdir(dir);
  check_clean(fds);
}

Test(subprocess, empty_argv_is_an_error) {
  const char *argv[] = {NULL};
  run_result r;
  run(&r, argv);
  EXPECT_STATUS(&r, AG_TOOL_ERROR);
  cr_expect(r.info.exec_failed);
  run_done(&r);
}

Test(subprocess, already_cancelled_token_starts_nothing) {
  int fds = count_fds();
  ag_cancel *t = NULL;
  cr_assert_eq(ag_cancel_new(&t, NULL, INT64_MAX, AG_CANCEL_TIMEOUT, NULL),
               AG_OK);
  ag_cancel_cancel(t, AG_CANCEL_USER);
  const char *argv[] = {"sh", "-c", "echo ran", NULL};
  run_opts o;
  run_opts_init(&o);
  o.cancel = t;
  run_result r;
  run_with(&r, argv, &o);
  EXPECT_STATUS(&r, AG_TOOL_CANCELLED);
  EXPECT_TEXT(r.out, "");
  cr_expect_not(r.info.killed);
  cr_expect_eq(r.info.exit_code, -1);
  run_done(&r);
  ag_cancel_free(t);
  check_clean(fds);
}

/* ------------------------------------------------------------------------ */
/* The child's environment                                                  */
/* ------------------------------------------------------------------------ */

Test(subprocess, child_leads_its_own_process_group) {
  int fds = count_fds();
  const char *argv[] = {"cat", "/proc/self/stat", NULL};
  run_result r;
  run(&r, argv);
  EXPECT_STATUS(&r, AG_TOOL_OK);
  int pid = 0, pgrp = 0;
  char *rp = strrchr(r.out.buf, ')');
  cr_assert_not_null(rp);
  cr_assert_eq(sscanf(r.out.buf, "%d", &pid), 1);
  cr_assert_eq(sscanf(rp + 1, " %*c %*d %d", &pgrp), 1);
  cr_expect_eq(pgrp, pid, "pgrp %d, pid %d", pgrp, pid);
  cr_expect_neq(pgrp, (int)getpgrp());
  run_done(&r);
  check_clean(fds);
}

static unsigned long long status_mask(const char *status, const char *key) {
  const char *p = strstr(status, key);
  cr_assert_not_null(p, "%s missing", key);
  return strtoull(p + strlen(key), NULL, 16);
}

Test(subprocess, signals_reset_and_unblocked_in_child) {
  /* This test process ignores SIGUSR1 and SIGPIPE and blocks SIGUSR2; none
   * of that may reach the tool. */
  signal(SIGUSR1, SIG_IGN);
  signal(SIGPIPE, SIG_IGN);
  sigset_t set, old;
  sigemptyset(&set);
  sigaddset(&set, SIGUSR2);
  pthread_sigmask(SIG_BLOCK, &set, &old);
  int fds = count_fds();
  const char *argv[] = {"cat", "/proc/self/status", NULL};
  run_result r;
  run(&r, argv);
  EXPECT_STATUS(&r, AG_TOOL_OK);
  /* Signals 32 and 33 are glibc's own (thread cancellation, setxid):
   * sigaction refuses them, and a sanitizer runtime may leave 32 ignored.
   * Every other signal must reach the tool with its default action. */
  const unsigned long long glibc_reserved = (1ULL << 31) | (1ULL << 32);
  unsigned long long ign = status_mask(r.out.buf, "SigIgn:");
  unsigned long long blk = status_mask(r.out.buf, "SigBlk:");
  cr_expect_eq(ign & ~glibc_reserved, 0ULL, "SigIgn %llx", ign);
  cr_expect_eq(blk & ~glibc_reserved, 0ULL, "SigBlk %llx", blk);
  run_done(&r);
  /* The caller's own mask and dispositions are untouched. */
  sigset_t now;
  pthread_sigmask(SIG_BLOCK, NULL, &now);
  cr_expect(sigismember(&now, SIGUSR2));
  struct sigaction sa;
  sigaction(SIGUSR1, NULL, &sa);
  cr_expect(sa.sa_handler == SIG_IGN);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  check_clean(fds);
}

/* Runs `ls /proc/self/fd` and checks the tool saw only 0, 1, 2 and the
 * directory ls itself opened (3, the lowest free number). */
static void expect_only_stdio(void) {
  const char *argv[] = {"ls", "/proc/self/fd", NULL};
  run_result r;
  run(&r, argv);
  EXPECT_STATUS(&r, AG_TOOL_OK);
  int seen[4] = {0};
  char *save = NULL;
  for (char *tok = strtok_r(r.out.buf, "\n", &save); tok != NULL;
       tok = strtok_r(NULL, "\n", &save)) {
    int fd = atoi(tok);
    cr_expect(fd >= 0 && fd <= 3, "the tool inherited fd %d", fd);
    if (fd >= 0 && fd <= 3)
      seen[fd]++;
  }
  for (int i = 0; i < 3; i++)
    cr_expect_eq(seen[i], 1, "fd %d seen %d times", i, seen[i]);
  run_done(&r);
}

Test(subprocess, tool_inherits_only_stdio) {
  /* A descriptor opened without O_CLOEXEC elsewhere in the application. */
  int leaky = open("/dev/null", O_RDONLY);
  cr_assert_geq(leaky, 0);
  int fds = count_fds();
  expect_only_stdio();
  close(leaky);
  check_clean(fds - 1);
}

static void *spawner(void *arg) {
  (void)arg;
  for (int i = 0; i < 10; i++)
    expect_only_stdio();
  return NULL;
}

Test(subprocess, concurrent_spawns_do_not_leak_into_each_other) {
  int fds = count_fds();
  pthread_t th[4];
  for (int i = 0; i < 4; i++)
    cr_assert_eq(pthread_create(&th[i], NULL, spawner, NULL), 0);
  for (int i = 0; i < 4; i++)
    pthread_join(th[i], NULL);
  check_clean(fds);
}

Test(subprocess, rlimits_are_applied) {
  int fds = count_fds();
  ag_rlimits lim = {
      .cpu_seconds = 7, .address_space_bytes = 512LL << 20, .open_files = 17};
  const char *argv[] = {"sh", "-c", "ulimit -t; ulimit -v; ulimit -n", NULL};
  run_opts o;
  run_opts_init(&o);
  o.limits = &lim;
  run_result r;
  run_with(&r, argv, &o);
  EXPECT_STATUS(&r, AG_TOOL_OK);
  EXPECT_TEXT(r.out, "7\n524288\n17\n");
  run_done(&r);

  /* Zero means not set: the inherited limits stay. */
  ag_rlimits none = {0};
  o.limits = &none;
  const char *argv2[] = {"sh", "-c", "ulimit -n", NULL};
  run_with(&r, argv2, &o);
  struct rlimit rl;
  getrlimit(RLIMIT_NOFILE, &rl);
  char want[32];
  if (rl.rlim_cur == RLIM_INFINITY)
    snprintf(want, sizeof(want), "unlimited\n");
  else
    snprintf(want, sizeof(want), "%llu\n", (unsigned long long)rl.rlim_cur);
  EXPECT_TEXT(r.out, want);
  run_done(&r);
  check_clean(fds);
}

Test(subprocess, rlimit_open_files_small) {
  int fds = count_fds();
  /* 4: the shell (and its dynamic loader) get fd 3, but not fd 4. */
  ag_rlimits lim = {.open_files = 4};
  const char *argv[] = {
      "sh", "-c", "exec 3</dev/null; echo a; exec 4</dev/null; echo b", NULL};
  run_opts o;
  run_opts_init(&o);
  o.limits = &lim;
  run_result r;
  run_with(&r, argv, &o);
  EXPECT_STATUS(&r, AG_TOOL_ERROR);
  EXPECT_TEXT(r.out, "a\n");
  cr_expect(strstr(r.err.buf, "Too many open files") != NULL, "stderr \"%s\"",
            r.err.buf);
  run_done(&r);
  check_clean(fds);
}

Test(subprocess, rlimit_cpu_ends_a_busy_loop) {
  int fds = count_fds();
  ag_rlimits lim = {.cpu_seconds = 1};
  const char *argv[] = {"sh", "-c", "while :; do :; done", NULL};
  run_opts o;
  run_opts_init(&o);
  o.limits = &lim;
  o.timeout_ms = 60000;
  run_result r;
  run_with(&r, argv, &o);
  EXPECT_STATUS(&r, AG_TOOL_ERROR);
  cr_expect(r.info.term_signal == SIGXCPU || r.info.term_signal == SIGKILL,
            "signal %d", r.info.term_signal);
  cr_expect_not(r.info.killed);
  cr_expect(strstr(r.err.buf, "killed by signal") != NULL, "\"%s\"", r.err.buf);
  cr_log_info("RLIMIT_CPU 1s: ended after %lld ms: %s", (long long)r.elapsed_ms,
              r.err.buf);
  run_done(&r);
  check_clean(fds);
}

/* ------------------------------------------------------------------------ */
/* Input and output                                                         */
/* ------------------------------------------------------------------------ */

static char *pattern(size_t n) {
  char *p = malloc(n);
  cr_assert_not_null(p);
  for (size_t i = 0; i < n; i++)
    p[i] = (char)('a' + (i * 7 + i / 26) % 26);
  return p;
}

Test(subprocess, large_input_to_cat) {
  int fds = count_fds();
  size_t n = 1000000;
  char *in = pattern(n);
  const char *argv[] = {"cat", NULL};
  run_opts o;
  run_opts_init(&o);
  o.input = in;
  o.input_len = n;
  o.cap = 4u << 20;
  run_result r;
  run_with(&r, argv, &o);
  EXPECT_STATUS(&r, AG_TOOL_OK);
  cr_expect_eq(r.out.len, n, "got %zu bytes", r.out.len);
  cr_expect(r.out.len == n && memcmp(r.out.buf, in, n) == 0);
  run_done(&r);
  free(in);
  check_clean(fds);
}

Test(subprocess, child_writing_before_reading_does_not_deadlock) {
  int fds = count_fds();
  size_t n = 1000000;
  char *in = pattern(n);
  /* 1 MB out before reading a byte in: both pipes fill unless we
   * interleave. */
  const char *argv[] = {"sh", "-c", "head -c 1000000 /dev/zero; cat", NULL};
  run_opts o;
  run_opts_init(&o);
  o.input = in;
  o.input_len = n;
  o.cap = 4u << 20;
  run_result r;
  run_with(&r, argv, &o);
  EXPECT_STATUS(&r, AG_TOOL_OK);
  cr_assert_eq(r.out.len, 2 * n, "got %zu bytes", r.out.len);
  cr_expect_eq(r.out.buf[0], '\0');
  cr_expect_eq(r.out.buf[n - 1], '\0');
  cr_expect(memcmp(r.out.buf + n, in, n) == 0);
  run_done(&r);
  free(in);
  check_clean(fds);
}

Test(subprocess, input_not_read_is_not_an_error) {
  int fds = count_fds();
  size_t n = 1000000;
  char *in = pattern(n);
  const char *argv[] = {"true", NULL};
  run_opts o;
  run_opts_init(&o);
  o.input = in;
  o.input_len = n;
  run_result r;
  run_with(&r, argv, &o);
  EXPECT_STATUS(&r, AG_TOOL_OK);
  /* The SIGPIPE our write raised was consumed and the mask restored. */
  sigset_t pending, mask;
  sigpending(&pending);
  cr_expect_not(sigismember(&pending, SIGPIPE));
  pthread_sigmask(SIG_BLOCK, NULL, &mask);
  cr_expect_not(sigismember(&mask, SIGPIPE));
  run_done(&r);
  free(in);
  check_clean(fds);
}

Test(subprocess, huge_output_is_capped_and_marked) {
  int fds = count_fds();
  struct rusage ru0, ru1;
  getrusage(RUSAGE_SELF, &ru0);
  const char *argv[] = {"head", "-c", "100000000", "/dev/zero", NULL};
  run_opts o;
  run_opts_init(&o);
  o.cap = 65536;
  o.timeout_ms = 60000;
  run_result r;
  run_with(&r, argv, &o);
  getrusage(RUSAGE_SELF, &ru1);
  EXPECT_STATUS(&r, AG_TOOL_OK);
  cr_expect(r.out.truncated);
  cr_expect_leq(r.out.len, o.cap);
  const char *mark =
      memmem(r.out.buf, r.out.len,
             "\n[output truncated: ", strlen("\n[output truncated: "));
  cr_assert_not_null(mark, "no truncation mark");
  size_t kept = (size_t)(mark - r.out.buf);
  unsigned long long dropped = 0;
  cr_assert_eq(
      sscanf(mark, "\n[output truncated: %llu bytes dropped]", &dropped), 1);
  cr_expect_eq(kept + dropped, 100000000ULL, "kept %zu + dropped %llu", kept,
               dropped);
  cr_expect_eq(r.out.dropped, (size_t)dropped);
  cr_expect_eq(r.out.buf[r.out.len - 1], ']');
  long grew_kb = ru1.ru_maxrss - ru0.ru_maxrss;
  cr_expect_lt(grew_kb, 32 * 1024, "max RSS grew by %ld KiB", grew_kb);
  cr_expect_lt(r.elapsed_ms, 30000);
  cr_log_info("100 MB of output read and dropped in %lld ms",
              (long long)r.elapsed_ms);
  run_done(&r);
  check_clean(fds);
}

Test(subprocess, stderr_is_capped_too) {
  int fds = count_fds();
  const char *argv[] = {"sh", "-c", "head -c 100000 /dev/zero >&2; exit 1",
                        NULL};
  run_opts o;
  run_opts_init(&o);
  o.cap = 1024;
  run_result r;
  run_with(&r, argv, &o);
  EXPECT_STATUS(&r, AG_TOOL_ERROR);
  cr_expect(r.err.truncated);
  cr_expect_leq(r.err.len, 1024u);
  const char *tail = "\n[output truncated: 99040 bytes dropped]";
  cr_expect(
      r.err.len > strlen(tail) &&
          memcmp(r.err.buf + r.err.len - strlen(tail), tail, strlen(tail)) == 0,
      "stderr ends \"%s\"", r.err.buf + 960);
  run_done(&r);
  check_clean(fds);
}

static bool valid_utf8(const unsigned char *s, size_t n) {
  size_t i = 0;
  while (i < n) {
    size_t len = s[i] < 0x80 ? 1 : s[i] >= 0xF0 ? 4 : s[i] >= 0xE0 ? 3 : 2;
    if (i + len > n)
      return false;
    for (size_t k = 1; k < len; k++) {
      if ((s[i + k] & 0xC0) != 0x80)
        return false;
    }
    i += len;
  }
  return true;
}

Test(subprocess, truncation_keeps_utf8_whole) {
  int fds = count_fds();
  /* "a" then 200 x "é" (2 bytes): with a 256-byte cap the kept text ends
   * in the middle of a character unless it is cut back. */
  const char *argv[] = {
      "sh", "-c",
      "printf a; i=0; while [ $i -lt 200 ]; do printf '\\303\\251'; "
      "i=$((i+1)); done",
      NULL};
  run_opts o;
  run_opts_init(&o);
  o.cap = 256;
  run_result r;
  run_with(&r, argv, &o);
  EXPECT_STATUS(&r, AG_TOOL_OK);
  cr_expect(r.out.truncated);
  cr_expect(valid_utf8((const unsigned char *)r.out.buf, r.out.len), "\"%s\"",
            r.out.buf);
  const char *mark = strstr(r.out.buf, "\n[output truncated: ");
  cr_assert_not_null(mark);
  size_t kept = (size_t)(mark - r.out.buf);
  unsigned long long dropped = 0;
  cr_assert_eq(
      sscanf(mark, "\n[output truncated: %llu bytes dropped]", &dropped), 1);
  cr_expect_eq(kept + dropped, 401ULL);
  cr_expect_eq(kept % 2, 1u, "kept %zu bytes", kept);
  run_done(&r);
  check_clean(fds);
}

/* ------------------------------------------------------------------------ */
/* Timeouts, cancellation, process groups                                   */
/* ------------------------------------------------------------------------ */

/* Reads the pid the tool's shell printed as its first line. */
static pid_t first_line_pid(const run_result *r) {
  cr_assert_not_null(r->out.buf);
  int pid = atoi(r->out.buf);
  cr_assert_gt(pid, 1, "stdout \"%s\"", r->out.buf);
  return (pid_t)pid;
}

Test(subprocess, timeout_of_a_process_that_dies_on_sigterm) {
  int fds = count_fds();
  const char *argv[] = {"sleep", "10", NULL};
  int64_t late[5];
  for (int i = 0; i < 5; i++) {
    ag_cancel *t = NULL;
    int64_t deadline = ag_now_ms() + 100;
    cr_assert_eq(ag_cancel_new(&t, NULL, deadline, AG_CANCEL_TIMEOUT, NULL),
                 AG_OK);
    run_opts o;
    run_opts_init(&o);
    o.cancel = t;
    o.grace_ms = 5000;
    run_result r;
    run_with(&r, argv, &o);
    late[i] = ag_now_ms() - deadline;
    EXPECT_STATUS(&r, AG_TOOL_TIMEOUT);
    cr_expect(r.info.killed);
    cr_expect_eq(r.info.term_signal, SIGTERM);
    cr_expect_lt(late[i], 2000, "returned %lld ms after the deadline",
                 (long long)late[i]);
    run_done(&r);
    ag_cancel_free(t);
  }
  cr_log_info("lateness after the deadline (ms): %lld %lld %lld %lld %lld",
              (long long)late[0], (long long)late[1], (long long)late[2],
              (long long)late[3], (long long)late[4]);
  check_clean(fds);
}

Test(subprocess, sigterm_ignored_then_sigkill_after_grace) {
  int fds = count_fds();
  const char *argv[] = {"sh", "-c", "trap '' TERM; echo $$; sleep 10", NULL};
  run_opts o;
  run_opts_init(&o);
  o.timeout_ms = 100;
  o.grace_ms = 100;
  run_result r;
  run_with(&r, argv, &o);
  EXPECT_STATUS(&r, AG_TOOL_TIMEOUT);
  cr_expect(r.info.killed);
  cr_expect_eq(r.info.term_signal, SIGKILL);
  cr_expect_geq(r.elapsed_ms, 190, "elapsed %lld", (long long)r.elapsed_ms);
  cr_expect_lt(r.elapsed_ms, 2000, "elapsed %lld", (long long)r.elapsed_ms);
  pid_t pgid = first_line_pid(&r);
  cr_expect(group_gone_within(pgid, 1000), "group %d still has processes",
            (int)pgid);
  cr_log_info("SIGTERM ignored: returned after %lld ms (timeout 100 + grace "
              "100)",
              (long long)r.elapsed_ms);
  run_done(&r);
  check_clean(fds);
}

Test(subprocess, grandchildren_are_killed_with_the_group) {
  int fds = count_fds();
  const char *argv[] = {"sh", "-c", "echo $$; sleep 30 & sleep 30 & wait",
                        NULL};
  run_opts o;
  run_opts_init(&o);
  o.timeout_ms = 100;
  o.grace_ms = 3000;
  run_result r;
  run_with(&r, argv, &o);
  EXPECT_STATUS(&r, AG_TOOL_TIMEOUT);
  cr_expect_lt(r.elapsed_ms, 2000, "elapsed %lld", (long long)r.elapsed_ms);
  pid_t pgid = first_line_pid(&r);
  cr_expect(group_gone_within(pgid, 1000), "group %d still has processes",
            (int)pgid);
  run_done(&r);
  check_clean(fds);
}

Test(subprocess, grandchild_ignoring_sigterm_does_not_hold_us) {
  int fds = count_fds();
  /* The shell dies on SIGTERM; its child ignores it and keeps the pipes.
   * We must not wait out the 5 s grace for it. */
  const char *argv[] = {
      "sh", "-c", "echo $$; (trap '' TERM; sleep 30; echo late) & wait", NULL};
  run_opts o;
  run_opts_init(&o);
  o.timeout_ms = 100;
  o.grace_ms = 5000;
  run_result r;
  run_with(&r, argv, &o);
  EXPECT_STATUS(&r, AG_TOOL_TIMEOUT);
  cr_expect_lt(r.elapsed_ms, 2000, "elapsed %lld", (long long)r.elapsed_ms);
  pid_t pgid = first_line_pid(&r);
  cr_expect(group_gone_within(pgid, 1000), "group %d still has processes",
            (int)pgid);
  run_done(&r);
  check_clean(fds);
}

Test(subprocess, background_process_holding_pipes_after_exit) {
  int fds = count_fds();
  const char *argv[] = {"sh", "-c", "echo $$; sleep 30 & echo done", NULL};
  run_result r;
  run(&r, argv);
  EXPECT_STATUS(&r, AG_TOOL_OK);
  cr_expect(strstr(r.out.buf, "done\n") != NULL, "\"%s\"", r.out.buf);
  cr_expect_lt(r.elapsed_ms, 2000, "elapsed %lld", (long long)r.elapsed_ms);
  cr_expect_not(r.info.killed);
  pid_t pgid = first_line_pid(&r);
  cr_expect(group_gone_within(pgid, 1000), "group %d still has processes",
            (int)pgid);
  run_done(&r);
  check_clean(fds);
}

Test(subprocess, child_closing_its_output_still_times_out) {
  int fds = count_fds();
  const char *argv[] = {"sh", "-c", "exec >&- 2>&-; sleep 10", NULL};
  run_opts o;
  run_opts_init(&o);
  o.timeout_ms = 150;
  run_result r;
  run_with(&r, argv, &o);
  EXPECT_STATUS(&r, AG_TOOL_TIMEOUT);
  cr_expect_lt(r.elapsed_ms, 2000, "elapsed %lld", (long long)r.elapsed_ms);
  run_done(&r);
  check_clean(fds);
}

typedef struct canceller {
  ag_cancel *token;
  int after_ms;
} canceller;

static void *cancel_later(void *arg) {
  canceller *c = arg;
  sleep_ms(c->after_ms);
  ag_cancel_cancel(c->token, AG_CANCEL_USER);
  return NULL;
}

Test(subprocess, user_cancel_from_another_thread) {
  int fds = count_fds();
  ag_cancel *t = NULL;
  cr_assert_eq(ag_cancel_new(&t, NULL, INT64_MAX, AG_CANCEL_TIMEOUT, NULL),
               AG_OK);
  canceller c = {t, 100};
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, cancel_later, &c), 0);
  const char *argv[] = {"sleep", "10", NULL};
  run_opts o;
  run_opts_init(&o);
  o.cancel = t;
  run_result r;
  run_with(&r, argv, &o);
  pthread_join(th, NULL);
  EXPECT_STATUS(&r, AG_TOOL_CANCELLED);
  cr_expect(r.info.killed);
  cr_expect_geq(r.elapsed_ms, 90, "elapsed %lld", (long long)r.elapsed_ms);
  cr_expect_lt(r.elapsed_ms, 2000, "elapsed %lld", (long long)r.elapsed_ms);
  run_done(&r);
  ag_cancel_free(t);
  check_clean(fds);
}

Test(subprocess, parent_token_cancel_reaches_the_run) {
  int fds = count_fds();
  ag_cancel *turn = NULL, *attempt = NULL;
  cr_assert_eq(ag_cancel_new(&turn, NULL, INT64_MAX, AG_CANCEL_DEADLINE, NULL),
               AG_OK);
  cr_assert_eq(ag_cancel_new(&attempt, turn, ag_now_ms() + 10000,
                             AG_CANCEL_TIMEOUT, NULL),
               AG_OK);
  canceller c = {turn, 100};
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, cancel_later, &c), 0);
  const char *argv[] = {"sleep", "10", NULL};
  run_opts o;
  run_opts_init(&o);
  o.cancel = attempt;
  run_result r;
  run_with(&r, argv, &o);
  pthread_join(th, NULL);
  EXPECT_STATUS(&r, AG_TOOL_CANCELLED);
  cr_expect_lt(r.elapsed_ms, 2000, "elapsed %lld", (long long)r.elapsed_ms);
  run_done(&r);
  ag_cancel_free(attempt);
  ag_cancel_free(turn);
  check_clean(fds);
}

/* A chain longer than the 16 eventfds a run watches: the root's token is
 * not among them, and its cancel is still seen (LONG_CHAIN_POLL_MS). */
Test(subprocess, cancel_at_the_root_of_a_long_chain_reaches_the_run) {
  int fds = count_fds();
  enum { DEPTH = 20 };
  ag_cancel *chain[DEPTH];
  for (int i = 0; i < DEPTH; i++) {
    chain[i] = NULL;
    cr_assert_eq(ag_cancel_new(&chain[i], i > 0 ? chain[i - 1] : NULL,
                               INT64_MAX, AG_CANCEL_DEADLINE, NULL),
                 AG_OK);
  }
  canceller c = {chain[0], 100};
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, cancel_later, &c), 0);
  const char *argv[] = {"sleep", "10", NULL};
  run_opts o;
  run_opts_init(&o);
  o.cancel = chain[DEPTH - 1];
  run_result r;
  run_with(&r, argv, &o);
  pthread_join(th, NULL);
  EXPECT_STATUS(&r, AG_TOOL_CANCELLED);
  cr_expect_lt(r.elapsed_ms, 2000, "elapsed %lld", (long long)r.elapsed_ms);
  run_done(&r);
  for (int i = DEPTH; i-- > 0;)
    ag_cancel_free(chain[i]);
  check_clean(fds);
}

Test(subprocess, turn_deadline_is_cancelled_not_timeout) {
  int fds = count_fds();
  ag_cancel *turn = NULL;
  cr_assert_eq(
      ag_cancel_new(&turn, NULL, ag_now_ms() + 100, AG_CANCEL_DEADLINE, NULL),
      AG_OK);
  const char *argv[] = {"sleep", "10", NULL};
  run_opts o;
  run_opts_init(&o);
  o.cancel = turn;
  run_result r;
  run_with(&r, argv, &o);
  EXPECT_STATUS(&r, AG_TOOL_CANCELLED);
  cr_expect_lt(r.elapsed_ms, 2000, "elapsed %lld", (long long)r.elapsed_ms);
  run_done(&r);
  ag_cancel_free(turn);
  check_clean(fds);
}

Test(subprocess, output_before_timeout_is_kept) {
  int fds = count_fds();
  const char *argv[] = {"sh", "-c", "echo started; echo warn >&2; sleep 10",
                        NULL};
  run_opts o;
  run_opts_init(&o);
  o.timeout_ms = 200;
  run_result r;
  run_with(&r, argv, &o);
  EXPECT_STATUS(&r, AG_TOOL_TIMEOUT);
  EXPECT_TEXT(r.out, "started\n");
  EXPECT_TEXT(r.err, "warn\n");
  run_done(&r);
  check_clean(fds);
}

Test(subprocess, null_cancel_token_runs_to_completion) {
  int fds = count_fds();
  ag_output out, err;
  cr_assert_eq(ag__output_init(&out, 1024), AG_OK);
  cr_assert_eq(ag__output_init(&err, 1024), AG_OK);
  ag__proc_info info;
  const char *argv[] = {"echo", "plain", NULL};
  ag_tool_status st =
      ag__subprocess_run(argv, NULL, 100, NULL, 0, NULL, &out, &err, &info);
  cr_expect_eq(st, AG_TOOL_OK);
  EXPECT_TEXT(out, "plain\n");
  ag__output_free(&out);
  ag__output_free(&err);
  check_clean(fds);
}

/* ------------------------------------------------------------------------ */
/* Containment: nothing of a tool outlives its call (issue 10, findings 1  */
/* and 2). Checked with the kernel: /proc and kill(pid, 0).                */
/* ------------------------------------------------------------------------ */

/* A sleep duration no other process on the machine uses: "1004.<pid><n>". */
static void unique_arg(char *buf, size_t cap, int base) {
  static int n;
  snprintf(buf, cap, "%d.%06d%d", base, (int)(getpid() % 1000000), n++);
}

/* Processes that are not zombies and have `arg` as one of their arguments. */
static int procs_with_arg(const char *arg) {
  DIR *d = opendir("/proc");
  cr_assert_not_null(d);
  int found = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (!isdigit((unsigned char)e->d_name[0]))
      continue;
    char path[300], buf[4096];
    snprintf(path, sizeof(path), "/proc/%s/cmdline", e->d_name);
    FILE *f = fopen(path, "r");
    if (f == NULL)
      continue;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    bool hit = false;
    for (size_t i = 0; i < n; i += strlen(buf + i) + 1)
      if (strcmp(buf + i, arg) == 0)
        hit = true;
    if (!hit)
      continue;
    snprintf(path, sizeof(path), "/proc/%s/stat", e->d_name);
    f = fopen(path, "r");
    if (f == NULL)
      continue;
    n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *rp = strrchr(buf, ')');
    if (rp != NULL && rp[1] == ' ' && rp[2] != 'Z')
      found++;
  }
  closedir(d);
  return found;
}

/* Whether pid runs (kill(pid, 0) and not a zombie). */
static bool pid_runs(pid_t pid) {
  if (kill(pid, 0) != 0)
    return false;
  char path[64], buf[512];
  snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (f == NULL)
    return false;
  size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  buf[n] = '\0';
  char *rp = strrchr(buf, ')');
  return rp != NULL && rp[1] == ' ' && rp[2] != 'Z';
}

Test(subprocess, background_job_that_let_go_of_the_pipes_dies_with_the_tool) {
  int fds = count_fds();
  char u[32], script[160];
  unique_arg(u, sizeof(u), 1004);
  snprintf(script, sizeof(script),
           "(sleep %s >/dev/null 2>&1 & echo $! >&2); echo started", u);
  const char *argv[] = {"sh", "-c", script, NULL};
  run_result r;
  run(&r, argv);
  EXPECT_STATUS(&r, AG_TOOL_OK);
  EXPECT_TEXT(r.out, "started\n");
  cr_expect_not(r.info.killed);
  pid_t bg = (pid_t)atoi(r.err.buf != NULL ? r.err.buf : "0");
  cr_assert_gt(bg, 1, "stderr \"%s\"", r.err.buf);
  /* At once: the run returns only when the whole tree is reaped. */
  cr_expect_not(pid_runs(bg), "the background sleep %d outlived the tool",
                (int)bg);
  cr_expect_eq(procs_with_arg(u), 0, "a 'sleep %s' is still running", u);
  run_done(&r);
  check_clean(fds);
}

Test(subprocess, setsid_escapees_die_with_the_tool) {
  int fds = count_fds();
  char u1[32], u2[32], script[256];
  unique_arg(u1, sizeof(u1), 1005);
  unique_arg(u2, sizeof(u2), 1005);
  /* One leaves the group and the session; one also double-forks, so its
   * parent is gone before the tool exits. */
  snprintf(script, sizeof(script),
           "setsid sleep %s </dev/null >/dev/null 2>&1 & "
           "(setsid sleep %s </dev/null >/dev/null 2>&1 &); sleep 0.2; "
           "echo started",
           u1, u2);
  const char *argv[] = {"sh", "-c", script, NULL};
  run_result r;
  run(&r, argv);
  EXPECT_STATUS(&r, AG_TOOL_OK);
  EXPECT_TEXT(r.out, "started\n");
  cr_expect_eq(procs_with_arg(u1), 0, "'setsid sleep %s' outlived the tool",
               u1);
  cr_expect_eq(procs_with_arg(u2), 0, "'(setsid sleep %s &)' outlived the tool",
               u2);
  run_done(&r);
  check_clean(fds);
}

Test(subprocess, setsid_escapees_die_on_timeout) {
  int fds = count_fds();
  char u[32], script[200];
  unique_arg(u, sizeof(u), 1006);
  snprintf(script, sizeof(script),
           "trap '' TERM; (setsid sleep %s </dev/null >/dev/null 2>&1 &); "
           "sleep 10",
           u);
  const char *argv[] = {"sh", "-c", script, NULL};
  run_opts o;
  run_opts_init(&o);
  o.timeout_ms = 300;
  o.grace_ms = 100;
  run_result r;
  run_with(&r, argv, &o);
  EXPECT_STATUS(&r, AG_TOOL_TIMEOUT);
  cr_expect_lt(r.elapsed_ms, 3000, "elapsed %lld", (long long)r.elapsed_ms);
  cr_expect_eq(procs_with_arg(u), 0, "'setsid sleep %s' outlived the timeout",
               u);
  run_done(&r);
  check_clean(fds);
}

static void *force_later(void *arg) {
  canceller *c = arg;
  sleep_ms(c->after_ms);
  ag_cancel_force(c->token);
  return NULL;
}

Test(subprocess, force_kills_without_waiting_out_the_grace) {
  int fds = count_fds();
  ag_cancel *t = NULL;
  cr_assert_eq(ag_cancel_new(&t, NULL, INT64_MAX, AG_CANCEL_TIMEOUT, NULL),
               AG_OK);
  const char *argv[] = {"sh", "-c", "trap '' TERM; echo $$; sleep 30", NULL};
  /* First an ordinary cancel (SIGTERM, ignored), then the force. */
  canceller c1 = {t, 100};
  pthread_t th1;
  cr_assert_eq(pthread_create(&th1, NULL, cancel_later, &c1), 0);
  ag_cancel *child_tok = NULL;
  cr_assert_eq(ag_cancel_new(&child_tok, t, INT64_MAX, AG_CANCEL_TIMEOUT, NULL),
               AG_OK);
  canceller c2 = {t, 300};
  pthread_t th2;
  cr_assert_eq(pthread_create(&th2, NULL, force_later, &c2), 0);
  run_opts o;
  run_opts_init(&o);
  o.cancel = child_tok; /* the force is seen through the chain */
  o.grace_ms = 20000;
  run_result r;
  run_with(&r, argv, &o);
  pthread_join(th1, NULL);
  pthread_join(th2, NULL);
  EXPECT_STATUS(&r, AG_TOOL_CANCELLED);
  cr_expect_eq(r.info.term_signal, SIGKILL);
  cr_expect_lt(r.elapsed_ms, 5000, "elapsed %lld: the 20 s grace was waited",
               (long long)r.elapsed_ms);
  pid_t sh = first_line_pid(&r);
  cr_expect_not(pid_runs(sh));
  cr_log_info("forced after SIGTERM was ignored: returned after %lld ms",
              (long long)r.elapsed_ms);
  run_done(&r);
  ag_cancel_free(child_tok);
  ag_cancel_free(t);
  check_clean(fds);
}

static bool file_has_data(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && st.st_size > 0;
}

Test(subprocess, sigkill_of_the_runner_leaves_nothing) {
  int fds = count_fds();
  char u1[32], u2[32], marker[64], script[400];
  unique_arg(u1, sizeof(u1), 1007);
  unique_arg(u2, sizeof(u2), 1007);
  snprintf(marker, sizeof(marker), "/tmp/ag_test_sub_%d.started",
           (int)getpid());
  unlink(marker);
  /* A tool that ignores every polite signal, with a job in its group and a
   * process that left the group and the session. */
  snprintf(script, sizeof(script),
           "trap '' TERM HUP INT; (setsid sleep %s </dev/null >/dev/null "
           "2>&1 &); sleep %s & echo $$ > %s; wait",
           u1, u2, marker);
  fflush(NULL);
  pid_t runner = fork();
  cr_assert_geq(runner, 0);
  if (runner == 0) {
    const char *argv[] = {"sh", "-c", script, NULL};
    ag_output out, err;
    ag__output_init(&out, 4096);
    ag__output_init(&err, 4096);
    ag__subprocess_run(argv, NULL, 100, NULL, 0, NULL, &out, &err, NULL);
    _exit(0);
  }
  for (int waited = 0; waited < 10000 && !file_has_data(marker); waited += 10)
    sleep_ms(10);
  cr_assert(file_has_data(marker), "the tool did not start");
  sleep_ms(100); /* let the setsid one get going */
  cr_assert_eq(procs_with_arg(u1), 1, "setsid sleep %s not running", u1);
  cr_assert_eq(procs_with_arg(u2), 1, "sleep %s not running", u2);
  int64_t t0 = ag_now_ms();
  cr_assert_eq(kill(runner, SIGKILL), 0);
  int ws;
  cr_assert_eq(waitpid(runner, &ws, 0), runner);
  int64_t gone_ms = -1;
  while (ag_now_ms() - t0 < 5000) {
    if (procs_with_arg(u1) == 0 && procs_with_arg(u2) == 0) {
      gone_ms = ag_now_ms() - t0;
      break;
    }
    sleep_ms(1);
  }
  cr_expect_geq(gone_ms, 0,
                "the tool's processes outlived a SIGKILL of "
                "the runner by 5 s");
  cr_log_info("SIGKILL of the runner: every process of the tool gone after "
              "%lld ms",
              (long long)gone_ms);
  unlink(marker);
  check_clean(fds);
}
