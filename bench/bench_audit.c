/*
 * bench/bench_audit.c - how many recorded runs `agentguard audit` gets
 * through per second on one core.
 *
 * What it measures, on the bundled trajectories (shared/data/trajectories,
 * 31 real runs, about 1 MB), all read into memory first (file reading is
 * not measured):
 *   1. end to end  ag_trajectory_parse + ag_auditor_run (default preset) +
 *                  ag_trajectory_free for every run, round after round: the
 *                  main figure, `audit_runs_per_second`;
 *   2. parse       ag_trajectory_parse + free only;
 *   3. replay      ag_auditor_run only, on runs parsed once;
 *   4. all stops   end to end with ag_audit_opts.all_stops (one more replay
 *                  per enabled mechanism).
 * Each figure is the median of the rounds (a round = every run once), as
 * runs per second and as MB of input per second.
 *
 * Output: a readable report and machine-readable lines
 *   <metric> [key=value ...] value=<number>
 * Never fails on speed; exits 1 when something is broken (a folder given
 * with --dir is missing, a bundled run does not parse or replay). When no
 * folder is given and ../shared is not beside the project, prints
 * "skipped: ../shared not found ..." and exits 0.
 *
 * Where the runs are: --dir DIR, else $AG_SHARED_DIR/data/trajectories, else
 * shared/data/trajectories beside the project, found from the executable's
 * folder (build/bench_audit -> ../../shared) or the working directory.
 * --rounds N (default 200), --quick or AG_BENCH_QUICK=1 (20 rounds).
 */
#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "agentguard.h"
#include "agentguard/audit.h"

#define MAX_RUNS 4096

static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("bench_audit: error: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  exit(1);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

typedef struct input {
  char *name;
  char *buf;
  size_t len;
} input;

static input runs[MAX_RUNS];
static size_t n_runs;
static size_t total_bytes;

static bool is_dir(const char *p) {
  struct stat st;
  return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static char *read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (f == NULL)
    return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  if (n < 0) {
    fclose(f);
    return NULL;
  }
  char *buf = malloc((size_t)n + 1);
  if (buf != NULL && fread(buf, 1, (size_t)n, f) != (size_t)n) {
    free(buf);
    buf = NULL;
  }
  fclose(f);
  *len = (size_t)n;
  return buf;
}

static int cmp_input(const void *a, const void *b) {
  return strcmp(((const input *)a)->name, ((const input *)b)->name);
}

static void load_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (d == NULL)
    die("cannot list %s", dir);
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    size_t nl = strlen(e->d_name);
    if (e->d_name[0] == '.' || nl < 6 ||
        strcmp(e->d_name + nl - 5, ".json") != 0)
      continue;
    if (n_runs == MAX_RUNS)
      die("more than %d files in %s", MAX_RUNS, dir);
    char path[8192];
    int pn = snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
    if (pn < 0 || (size_t)pn >= sizeof(path))
      die("path too long in %s", dir);
    input *in = &runs[n_runs];
    in->buf = read_file(path, &in->len);
    if (in->buf == NULL)
      die("cannot read %s", path);
    in->name = strdup(e->d_name);
    total_bytes += in->len;
    n_runs++;
  }
  closedir(d);
  qsort(runs, n_runs, sizeof(runs[0]), cmp_input);
}

/* The trajectories folder: see the header comment. */
static const char *find_dir(const char *given, char *buf, size_t cap) {
  if (given != NULL)
    return given;
  const char *env = getenv("AG_SHARED_DIR");
  if (env != NULL) {
    snprintf(buf, cap, "%s/data/trajectories", env);
    if (is_dir(buf))
      return buf;
  }
  char exe[2048];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) {
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash != NULL)
      *slash = '\0';
    static const char *const rel[] = {"/../../shared/data/trajectories",
                                      "/../shared/data/trajectories"};
    for (size_t i = 0; i < 2; i++) {
      snprintf(buf, cap, "%s%s", exe, rel[i]);
      if (is_dir(buf))
        return buf;
    }
  }
  static const char *const cwd[] = {"../shared/data/trajectories",
                                    "../../shared/data/trajectories",
                                    "shared/data/trajectories"};
  for (size_t i = 0; i < 3; i++)
    if (is_dir(cwd[i]))
      return cwd[i];
  return NULL;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof(*v), cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

typedef enum { END_TO_END, PARSE, REPLAY } mode;

/* One round: every run once. Returns seconds. */
static double round_once(mode m, ag_auditor *aud, ag_trajectory **parsed,
                         long *stops) {
  ag_error_t err;
  ag_audit_finding f;
  double t0 = now_s();
  for (size_t i = 0; i < n_runs; i++) {
    ag_trajectory *t = parsed != NULL ? parsed[i] : NULL;
    if (m != REPLAY &&
        ag_trajectory_parse(&t, runs[i].buf, runs[i].len, NULL, &err) != AG_OK)
      die("%s: %s", runs[i].name, err.msg);
    if (m != PARSE) {
      if (ag_auditor_run(aud, t, &f, &err) != AG_OK)
        die("%s: replay: %s", runs[i].name, err.msg);
      *stops += f.stop.stopped;
    }
    if (m != REPLAY)
      ag_trajectory_free(t);
  }
  return now_s() - t0;
}

static void measure(const char *label, const char *metric, mode m,
                    ag_auditor *aud, ag_trajectory **parsed, int rounds) {
  double *secs = malloc((size_t)rounds * sizeof(*secs));
  if (secs == NULL)
    die("out of memory");
  long stops = 0;
  for (int w = 0; w < 3; w++) /* warm-up: caches, allocator */
    round_once(m, aud, parsed, &stops);
  stops = 0;
  for (int r = 0; r < rounds; r++)
    secs[r] = round_once(m, aud, parsed, &stops);
  double med = median(secs, rounds);
  double rps = (double)n_runs / med;
  double mbps = (double)total_bytes / 1e6 / med;
  printf("%-34s %10.0f runs/s  %8.1f MB/s  %7.3f ms per round of %zu", label,
         rps, mbps, med * 1e3, n_runs);
  if (m != PARSE)
    printf("  (%ld stops per round)", stops / rounds);
  putchar('\n');
  printf("%s value=%.0f\n", metric, rps);
  free(secs);
}

int main(int argc, char **argv) {
  const char *dir_arg = NULL;
  int rounds = 200;
  const char *quick = getenv("AG_BENCH_QUICK");
  if (quick != NULL && strcmp(quick, "1") == 0)
    rounds = 20;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--dir") == 0 && i + 1 < argc)
      dir_arg = argv[++i];
    else if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc)
      rounds = atoi(argv[++i]);
    else if (strcmp(argv[i], "--quick") == 0)
      rounds = 20;
    else
      die("usage: bench_audit [--dir DIR] [--rounds N] [--quick]");
  }
  if (rounds < 1)
    die("--rounds must be positive");
  char buf[4096];
  const char *dir = find_dir(dir_arg, buf, sizeof(buf));
  if (dir == NULL) {
    /* A clone of the project alone: nothing to measure, and not a failure
     * of `make bench`. */
    printf("skipped: ../shared not found (the bundled trajectories, "
           "shared/data/trajectories; pass --dir DIR or set AG_SHARED_DIR)\n");
    return 0;
  }
  load_dir(dir);
  if (n_runs == 0)
    die("no *.json files in %s", dir);

  ag_config cfg;
  ag_config_init(&cfg);
  ag_error_t err;
  ag_auditor *aud = NULL, *all = NULL;
  ag_audit_opts ao;
  ag_audit_opts_init(&ao);
  if (ag_auditor_new(&aud, &cfg, &ao, &err) != AG_OK)
    die("auditor: %s", err.msg);
  ao.all_stops = true;
  if (ag_auditor_new(&all, &cfg, &ao, &err) != AG_OK)
    die("auditor: %s", err.msg);

  ag_trajectory **parsed = calloc(n_runs, sizeof(*parsed));
  if (parsed == NULL)
    die("out of memory");
  size_t steps = 0, calls = 0;
  for (size_t i = 0; i < n_runs; i++) {
    if (ag_trajectory_parse(&parsed[i], runs[i].buf, runs[i].len, NULL, &err) !=
        AG_OK)
      die("%s: %s", runs[i].name, err.msg);
    steps += parsed[i]->n_steps;
    calls += parsed[i]->n_calls;
  }

  printf("bench_audit: %zu runs from %s (%.2f MB, %zu steps, %zu calls), "
         "preset default, one thread, median of %d rounds\n\n",
         n_runs, dir, (double)total_bytes / 1e6, steps, calls, rounds);
  measure("end to end (parse + replay)", "audit_runs_per_second", END_TO_END,
          aud, NULL, rounds);
  measure("parse only", "audit_parse_runs_per_second", PARSE, NULL, NULL,
          rounds);
  measure("replay only", "audit_replay_runs_per_second", REPLAY, aud, parsed,
          rounds);
  measure("end to end, --all-stops", "audit_all_stops_runs_per_second",
          END_TO_END, all, NULL, rounds);
  printf("\ntarget: >= 2000 runs per second end to end (figures only)\n");

  for (size_t i = 0; i < n_runs; i++) {
    ag_trajectory_free(parsed[i]);
    free(runs[i].buf);
    free(runs[i].name);
  }
  free(parsed);
  ag_auditor_free(aud);
  ag_auditor_free(all);
  return 0;
}
