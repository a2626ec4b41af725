/*
 * bench/bench_classify.c - how long ag_classify takes per error text.
 *
 * What it measures, on the real error texts of shared/data/errors.jsonl (265
 * texts, about 300 KB), all read into memory first:
 *   1. per text  for each text, the median over the rounds of the mean time
 *                of a batch of calls on that text (batches last about 20
 *                microseconds so the clock's cost does not count); then the
 *                mean and the median of those figures over the texts, and
 *                the mean cost per byte. The mean is the main figure,
 *                `classify_ns_per_text`.
 *   2. 10 MB     one call on a 10 MB text (lines of letters, "Permission
 *                denied" at the end), which takes the head/tail path: the
 *                worst case bounded by the classifier's 64 KiB window.
 *
 * Output: a readable report and machine-readable lines
 *   <metric> [key=value ...] value=<number>
 * Never fails on speed; exits 1 when something is broken (a file given with
 * --data is missing, a line does not parse). When no file is given and
 * ../shared is not beside the project, prints "skipped: ../shared not
 * found ..." and exits 0.
 *
 * Where the texts are: --data PATH (the .jsonl file), else
 * $AG_SHARED_DIR/data/errors.jsonl, else shared/data/errors.jsonl beside the
 * project, found from the executable's folder (build/bench_classify ->
 * ../../shared) or the working directory. --rounds N (default 30),
 * --quick or AG_BENCH_QUICK=1 (5 rounds).
 */
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "agentguard.h"

#define MAX_TEXTS 100000
#define BATCH_NS 20000.0 /* target length of one timed batch */

static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("bench_classify: error: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  exit(1);
}

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

typedef struct text {
  char *buf; /* exactly len bytes, so a sanitizer catches over-reads */
  size_t len;
  long reps;     /* calls per timed batch */
  double *ns;    /* per round: mean ns per call in the batch */
  double median; /* median of ns over the rounds */
} text;

static text texts[MAX_TEXTS];
static size_t n_texts;
static size_t total_bytes;
static volatile unsigned sink; /* keeps the calls from being optimized out */

static bool is_file(const char *p) {
  struct stat st;
  return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* errors.jsonl: see the header comment. */
static const char *find_data(const char *given, char *buf, size_t cap) {
  if (given != NULL)
    return given;
  const char *env = getenv("AG_SHARED_DIR");
  if (env != NULL) {
    snprintf(buf, cap, "%s/data/errors.jsonl", env);
    if (is_file(buf))
      return buf;
  }
  char exe[2048];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) {
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash != NULL)
      *slash = '\0';
    static const char *const rel[] = {"/../../shared/data/errors.jsonl",
                                      "/../shared/data/errors.jsonl"};
    for (size_t i = 0; i < 2; i++) {
      snprintf(buf, cap, "%s%s", exe, rel[i]);
      if (is_file(buf))
        return buf;
    }
  }
  static const char *const cwd[] = {"../shared/data/errors.jsonl",
                                    "../../shared/data/errors.jsonl",
                                    "shared/data/errors.jsonl"};
  for (size_t i = 0; i < 3; i++)
    if (is_file(cwd[i]))
      return cwd[i];
  return NULL;
}

static void load(const char *path) {
  FILE *f = fopen(path, "r");
  if (f == NULL)
    die("cannot open %s", path);
  char *line = NULL;
  size_t cap = 0;
  ssize_t got;
  long lineno = 0;
  while ((got = getline(&line, &cap, f)) > 0) {
    lineno++;
    json_error_t jerr;
    json_t *row = json_loadb(line, (size_t)got, 0, &jerr);
    if (row == NULL)
      die("%s:%ld: %s", path, lineno, jerr.text);
    json_t *t = json_object_get(row, "text");
    if (!json_is_string(t))
      die("%s:%ld: no \"text\" string", path, lineno);
    if (n_texts == MAX_TEXTS)
      die("more than %d texts in %s", MAX_TEXTS, path);
    text *x = &texts[n_texts++];
    x->len = json_string_length(t);
    x->buf = malloc(x->len > 0 ? x->len : 1);
    if (x->buf == NULL)
      die("out of memory");
    memcpy(x->buf, json_string_value(t), x->len);
    total_bytes += x->len;
    json_decref(row);
  }
  free(line);
  fclose(f);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, size_t n) {
  qsort(v, n, sizeof(*v), cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static double batch(const text *x) {
  unsigned acc = 0;
  double t0 = now_ns();
  for (long r = 0; r < x->reps; r++)
    acc += (unsigned)ag_classify(x->buf, x->len);
  double t = now_ns() - t0;
  sink += acc;
  return t / (double)x->reps;
}

int main(int argc, char **argv) {
  const char *data_arg = NULL;
  int rounds = 30;
  const char *quick = getenv("AG_BENCH_QUICK");
  if (quick != NULL && strcmp(quick, "1") == 0)
    rounds = 5;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--data") == 0 && i + 1 < argc)
      data_arg = argv[++i];
    else if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc)
      rounds = atoi(argv[++i]);
    else if (strcmp(argv[i], "--quick") == 0)
      rounds = 5;
    else
      die("usage: bench_classify [--data PATH] [--rounds N] [--quick]");
  }
  if (rounds < 1)
    die("--rounds must be positive");
  char buf[4096];
  const char *path = find_data(data_arg, buf, sizeof(buf));
  if (path == NULL) {
    /* A clone of the project alone: nothing to measure, and not a failure
     * of `make bench`. */
    printf("skipped: ../shared not found (shared/data/errors.jsonl; pass "
           "--data PATH or set AG_SHARED_DIR)\n");
    return 0;
  }
  load(path);
  if (n_texts == 0)
    die("no texts in %s", path);

  /* Calibrate: enough calls per batch to last about BATCH_NS. */
  size_t per_cat[AG_CAT__COUNT] = {0};
  for (size_t i = 0; i < n_texts; i++) {
    text *x = &texts[i];
    per_cat[ag_classify(x->buf, x->len)]++;
    x->reps = 1;
    double one = batch(x);
    x->reps = one > 0 ? (long)(BATCH_NS / one) : 1000;
    if (x->reps < 1)
      x->reps = 1;
    x->ns = malloc((size_t)rounds * sizeof(double));
    if (x->ns == NULL)
      die("out of memory");
  }
  /* Rounds interleave the texts so a slow moment hits all of them alike. */
  for (int r = 0; r < rounds; r++)
    for (size_t i = 0; i < n_texts; i++)
      texts[i].ns[r] = batch(&texts[i]);

  double *per_text = malloc(n_texts * sizeof(double));
  if (per_text == NULL)
    die("out of memory");
  double sum = 0, max = 0;
  size_t max_i = 0;
  for (size_t i = 0; i < n_texts; i++) {
    texts[i].median = median(texts[i].ns, (size_t)rounds);
    per_text[i] = texts[i].median;
    sum += per_text[i];
    if (per_text[i] > max) {
      max = per_text[i];
      max_i = i;
    }
  }
  double mean = sum / (double)n_texts;
  double med = median(per_text, n_texts);
  double per_byte = sum / (double)total_bytes;

  printf("errors.jsonl: %zu texts, %zu bytes (mean %.0f), %d rounds\n", n_texts,
         total_bytes, (double)total_bytes / (double)n_texts, rounds);
  printf("  categories:");
  for (int c = 0; c < AG_CAT__COUNT; c++)
    if (per_cat[c] > 0)
      printf(" %s %zu", ag_category_name((ag_category)c), per_cat[c]);
  printf("\n");
  printf("  ns per text: mean %.0f, median %.0f, slowest %.0f (%zu bytes)\n",
         mean, med, max, texts[max_i].len);
  printf("  ns per byte over all texts: %.2f\n", per_byte);
  printf("classify_ns_per_text value=%.1f\n", mean);
  printf("classify_ns_per_text stat=median value=%.1f\n", med);
  printf("classify_ns_per_byte value=%.3f\n", per_byte);

  /* The 10 MB worst case (head/tail windows). */
  size_t big_n = (size_t)10 << 20;
  char *big = malloc(big_n);
  if (big == NULL)
    die("out of memory");
  for (size_t i = 0; i < big_n; i++)
    big[i] = (i % 61 == 60) ? '\n' : (char)('a' + i % 26);
  static const char tail[] = "\nPermission denied";
  memcpy(big + big_n - (sizeof(tail) - 1), tail, sizeof(tail) - 1);
  double big_ns[9];
  for (int r = 0; r < 9; r++) {
    double t0 = now_ns();
    sink += (unsigned)ag_classify(big, big_n);
    big_ns[r] = now_ns() - t0;
  }
  double big_med = median(big_ns, 9);
  printf("10 MB text: %.3f ms (median of 9)\n", big_med / 1e6);
  printf("classify_10mb_ms value=%.3f\n", big_med / 1e6);

  free(big);
  free(per_text);
  for (size_t i = 0; i < n_texts; i++) {
    free(texts[i].buf);
    free(texts[i].ns);
  }
  return 0;
}
