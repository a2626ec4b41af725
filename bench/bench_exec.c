/*
 * bench/bench_exec.c - the cost of running tool calls through the
 * scheduler: dispatch overhead on the pool, how close a batch of sleeping
 * calls gets to ideal parallelism, and how promptly a timed-out subprocess
 * tool is stopped.
 *
 * What it measures:
 *   1. dispatch   64 calls of an empty native tool in one batch, on the pool
 *                 (loop.max_parallel 8), many rounds; the median round over
 *                 64 is the cost per call (target < 20 us). For reference,
 *                 the same batch with loop.parallel false (every call on the
 *                 caller's thread, so no pool at all): what the retry
 *                 executor itself costs per call (attempt token with its
 *                 eventfd, output buffer, result). With more than one core
 *                 the pool can beat it, since its threads share that work.
 *   2. parallel   64 calls that each wait 20 ms on their cancel token, with
 *                 loop.max_parallel 64: wall time against the ideal 20 ms
 *                 (target <= 1.25x).
 *   3. timeout    a subprocess tool `sleep 10` with a 50 ms function timeout
 *                 and no retries, run 20 times: how long after its deadline
 *                 the call returns, median and worst (target < 10 ms). Then
 *                 the same through `sh -c 'sleep 10 & sleep 10; wait'` on
 *                 the pool, so a grandchild shares the process group. After
 *                 every run the bench (a child subreaper, so orphans would
 *                 become its children) counts live child processes: any is
 *                 a process left behind.
 *
 * Output: a readable report and machine-readable lines
 *   <metric> [key=value ...] value=<number>
 * Never fails on speed; exits 1 when something is broken (a call fails that
 * cannot fail, a process is left behind).
 *
 * AG_BENCH_QUICK=1 in the environment: fewer rounds.
 */
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "agentguard.h"

static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("bench_exec: error: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  exit(1);
}

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Sorts v. */
static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static ag_tool_status noop_tool(void *user, const json_t *args,
                                ag_cancel *cancel, ag_output *out) {
  (void)user;
  (void)args;
  (void)cancel;
  (void)out;
  return AG_TOOL_OK;
}

static ag_tool_status wait20_tool(void *user, const json_t *args,
                                  ag_cancel *cancel, ag_output *out) {
  (void)user;
  (void)args;
  (void)out;
  ag_cancel_reason r = ag_cancel_wait(cancel, 20);
  return r == AG_CANCEL_NONE ? AG_TOOL_OK : AG_TOOL_CANCELLED;
}

static ag_config bench_config(void) {
  ag_config cfg;
  ag_config_init(&cfg);
  cfg.loop.parallel = true;
  cfg.loop.max_parallel = 8;
  cfg.retry.max_retries = 0;
  cfg.retry.function_timeout_ms = 30000;
  return cfg;
}

static ag_registry *registry(void) {
  ag_registry *reg = NULL;
  ag_error_t err;
  if (ag_registry_new(&reg, &err) != AG_OK)
    die("ag_registry_new: %s", err.msg);
  ag_tool_def d;
  ag_tool_def_init(&d);
  d.name = "noop";
  d.fn = noop_tool;
  if (ag_registry_add(reg, &d, &err) != AG_OK)
    die("ag_registry_add: %s", err.msg);
  ag_tool_def_init(&d);
  d.name = "wait20";
  d.fn = wait20_tool;
  if (ag_registry_add(reg, &d, &err) != AG_OK)
    die("ag_registry_add: %s", err.msg);

  static const char *const sleep_argv[] = {"sleep", "10", NULL};
  ag_tool_def_init(&d);
  d.name = "sleep10";
  d.argv = sleep_argv;
  d.timeout_ms = 50;
  d.max_retries = 0;
  if (ag_registry_add(reg, &d, &err) != AG_OK)
    die("ag_registry_add: %s", err.msg);

  static const char *const group_argv[] = {"sh", "-c",
                                           "sleep 10 & sleep 10; wait", NULL};
  ag_tool_def_init(&d);
  d.name = "group10";
  d.argv = group_argv;
  d.timeout_ms = 50;
  d.max_retries = 0;
  if (ag_registry_add(reg, &d, &err) != AG_OK)
    die("ag_registry_add: %s", err.msg);
  return reg;
}

static ag_scheduler *scheduler(const ag_registry *reg, const ag_config *cfg) {
  ag_scheduler *s = NULL;
  ag_error_t err;
  ag_error_clear(&err);
  if (ag_scheduler_new(&s, reg, cfg, NULL, &err) != AG_OK)
    die("ag_scheduler_new: %s", err.msg);
  return s;
}

/* Runs a batch; every call must end with `want`. Returns the wall time in
 * microseconds. */
static double run_batch(ag_scheduler *s, const ag_exec_call *calls, size_t n,
                        ag_exec_result *r, ag_exec_status want) {
  ag_error_t err;
  ag_error_clear(&err);
  double t0 = now_us();
  ag_err_t rc = ag_scheduler_run(s, calls, n, NULL, r, &err);
  double took = now_us() - t0;
  if (rc != AG_OK)
    die("ag_scheduler_run: %s", err.msg);
  for (size_t i = 0; i < n; i++) {
    if (r[i].status != want)
      die("call %zu (%s): status %s, want %s: %s", i, calls[i].name,
          ag_exec_status_name(r[i].status), ag_exec_status_name(want),
          r[i].text != NULL ? r[i].text : "");
    ag_exec_result_clear(&r[i]);
  }
  return took;
}

#define BATCH 64

static void fill_calls(ag_exec_call *calls, size_t n, const char *name) {
  for (size_t i = 0; i < n; i++) {
    calls[i].name = name;
    calls[i].args = "{}";
    calls[i].args_len = 2;
    calls[i].skip = false;
  }
}

/* 1. Median microseconds per call of a 64-call batch of the empty tool. */
static double dispatch_us(const ag_registry *reg, bool parallel, int rounds) {
  ag_config cfg = bench_config();
  cfg.loop.parallel = parallel;
  ag_scheduler *s = scheduler(reg, &cfg);
  ag_exec_call calls[BATCH];
  ag_exec_result r[BATCH];
  fill_calls(calls, BATCH, "noop");
  for (int i = 0; i < rounds / 10 + 1; i++)
    run_batch(s, calls, BATCH, r, AG_EXEC_OK);
  double *t = malloc((size_t)rounds * sizeof(*t));
  if (t == NULL)
    die("out of memory");
  for (int i = 0; i < rounds; i++)
    t[i] = run_batch(s, calls, BATCH, r, AG_EXEC_OK) / BATCH;
  double m = median(t, rounds);
  free(t);
  ag_scheduler_free(s);
  return m;
}

/* 2. Median wall milliseconds of 64 x 20 ms on 64 threads. */
static double parallel_ms(const ag_registry *reg, int rounds, double *worst) {
  ag_config cfg = bench_config();
  cfg.loop.max_parallel = BATCH;
  ag_scheduler *s = scheduler(reg, &cfg);
  ag_exec_call calls[BATCH];
  ag_exec_result r[BATCH];
  fill_calls(calls, BATCH, "wait20");
  run_batch(s, calls, BATCH, r, AG_EXEC_OK); /* warm-up */
  double *t = malloc((size_t)rounds * sizeof(*t));
  if (t == NULL)
    die("out of memory");
  *worst = 0;
  for (int i = 0; i < rounds; i++) {
    t[i] = run_batch(s, calls, BATCH, r, AG_EXEC_OK) / 1e3;
    if (t[i] > *worst)
      *worst = t[i];
  }
  double m = median(t, rounds);
  free(t);
  ag_scheduler_free(s);
  return m;
}

/* Live processes whose parent is this one; zombies are reaped on the way.
 * As a child subreaper, orphaned grandchildren count too. */
static int live_children(void) {
  while (waitpid(-1, NULL, WNOHANG) > 0)
    ;
  DIR *d = opendir("/proc");
  if (d == NULL)
    return -1;
  pid_t me = getpid();
  int live = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9')
      continue;
    char path[300];
    snprintf(path, sizeof(path), "/proc/%s/stat", e->d_name);
    FILE *f = fopen(path, "r");
    if (f == NULL)
      continue;
    char buf[512];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* pid (comm) state ppid ...; comm may hold spaces and parentheses */
    char *close = strrchr(buf, ')');
    char state;
    int ppid;
    if (close == NULL || sscanf(close + 1, " %c %d", &state, &ppid) != 2)
      continue;
    if (ppid == (int)me && state != 'Z' && state != 'X')
      live++;
  }
  closedir(d);
  return live;
}

/* Waits up to 200 ms for the children to be gone; returns how many are
 * still alive. */
static int left_behind(void) {
  int live = 0;
  for (int i = 0; i < 40; i++) {
    live = live_children();
    if (live == 0)
      return 0;
    struct timespec ts = {0, 5 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  return live;
}

/* 3. Lateness after the 50 ms deadline, in ms, of `n` calls of `tool` per
 * batch (1: the caller's thread; more: the pool). */
static void timeout_lateness(const ag_registry *reg, const char *tool, size_t n,
                             int runs, double *med, double *worst,
                             int *leftover) {
  ag_config cfg = bench_config();
  ag_scheduler *s = scheduler(reg, &cfg);
  ag_exec_call calls[4];
  ag_exec_result r[4];
  fill_calls(calls, n, tool);
  double *late = malloc((size_t)runs * sizeof(*late));
  if (late == NULL)
    die("out of memory");
  *worst = 0;
  *leftover = 0;
  for (int i = 0; i < runs; i++) {
    ag_error_t err;
    ag_error_clear(&err);
    double t0 = now_us();
    if (ag_scheduler_run(s, calls, n, NULL, r, &err) != AG_OK)
      die("ag_scheduler_run: %s", err.msg);
    late[i] = (now_us() - t0) / 1e3 - 50.0;
    if (late[i] > *worst)
      *worst = late[i];
    for (size_t k = 0; k < n; k++) {
      if (r[k].status != AG_EXEC_TIMEOUT)
        die("%s: status %s, want timeout: %s", tool,
            ag_exec_status_name(r[k].status),
            r[k].text != NULL ? r[k].text : "");
      ag_exec_result_clear(&r[k]);
    }
    int left = left_behind();
    if (left < 0)
      die("cannot read /proc");
    *leftover += left;
  }
  *med = median(late, runs);
  free(late);
  ag_scheduler_free(s);
}

int main(void) {
  bool quick = getenv("AG_BENCH_QUICK") != NULL &&
               strcmp(getenv("AG_BENCH_QUICK"), "1") == 0;
  int rounds = quick ? 50 : 500;
  long cores = sysconf(_SC_NPROCESSORS_ONLN);

  if (prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0)
    fprintf(stderr,
            "bench_exec: warning: PR_SET_CHILD_SUBREAPER: %s; "
            "orphaned grandchildren would be missed\n",
            strerror(errno));
  ag_registry *reg = registry();

  printf("exec benchmarks (%ld online cores%s)\n\n", cores,
         quick ? ", quick" : "");

  double pool = dispatch_us(reg, true, rounds);
  double caller = dispatch_us(reg, false, rounds);
  printf("1. dispatch: 64 empty native calls per batch, median of %d rounds\n",
         rounds);
  printf("   on the pool (max_parallel 8)        %8.2f us per call "
         "(target < 20 us: %s)\n",
         pool, pool < 20 ? "met" : "NOT met");
  printf("   on the caller's thread (no pool)    %8.2f us per call\n", caller);
  printf("   pool / caller's thread              %8.2fx (below 1: the pool's "
         "threads\n"
         "   share the executor's own per-call work across cores)\n\n",
         pool / caller);
  printf("exec_dispatch_us_per_call value=%.3f\n", pool);
  printf("exec_sequential_us_per_call value=%.3f\n\n", caller);

  int prounds = quick ? 5 : 20;
  double worst_par;
  double par = parallel_ms(reg, prounds, &worst_par);
  printf("2. parallel: 64 calls x 20 ms, max_parallel 64, median of %d "
         "rounds\n",
         prounds);
  printf("   wall %.2f ms (worst %.2f ms) against the ideal 20 ms: %.3fx "
         "(target <= 1.25x: %s)\n\n",
         par, worst_par, par / 20.0, par / 20.0 <= 1.25 ? "met" : "NOT met");
  printf("exec_parallel64_wall_ms value=%.3f\n", par);
  printf("exec_parallel64_ratio value=%.3f\n\n", par / 20.0);

  int truns = quick ? 5 : 20;
  double med, worst;
  int left;
  timeout_lateness(reg, "sleep10", 1, truns, &med, &worst, &left);
  printf("3. timeout: subprocess `sleep 10`, 50 ms function timeout, no "
         "retries, %d runs\n",
         truns);
  printf("   returned after the deadline: median %.2f ms, worst %.2f ms "
         "(target < 10 ms: %s)\n",
         med, worst,
         worst < 10 ? "met"
         : med < 10 ? "met by the median"
                    : "NOT met");
  printf("   processes left behind: %d (%s)\n", left, left ? "BROKEN" : "ok");
  printf("exec_timeout_late_ms stat=median value=%.3f\n", med);
  printf("exec_timeout_late_ms stat=worst value=%.3f\n", worst);
  printf("exec_timeout_leftover_processes value=%d\n\n", left);
  int left_total = left;

  timeout_lateness(reg, "group10", 4, truns, &med, &worst, &left);
  printf("   4 x `sh -c 'sleep 10 & sleep 10; wait'` on the pool, %d runs\n",
         truns);
  printf("   returned after the deadline: median %.2f ms, worst %.2f ms\n", med,
         worst);
  printf("   processes left behind (grandchildren included): %d (%s)\n", left,
         left ? "BROKEN" : "ok");
  printf("exec_timeout_late_ms tool=group batch=4 stat=median value=%.3f\n",
         med);
  printf("exec_timeout_late_ms tool=group batch=4 stat=worst value=%.3f\n",
         worst);
  printf("exec_timeout_leftover_processes tool=group value=%d\n", left);
  left_total += left;

  ag_registry_free(reg);
  if (left_total > 0)
    die("%d subprocess(es) outlived their call", left_total);
  return 0;
}
