/*
 * bench/bench_memory.c - what a guard costs a server with many sessions
 * (issue "house in order", targets in docs/benchmarks.md):
 *   - an idle guard, resident and virtual: 10,000 guards in one process;
 *   - creating and freeing one;
 *   - the heap after a 1 MiB call, and at the next iteration.
 * Prints figures; never fails on them. Exits 1 only when the library fails.
 */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "agentguard.h"

static long status_kb(const char *key) {
  FILE *f = fopen("/proc/self/status", "r");
  if (f == NULL)
    return -1;
  char line[256];
  long v = -1;
  size_t kl = strlen(key);
  while (fgets(line, sizeof(line), f) != NULL)
    if (strncmp(line, key, kl) == 0 && line[kl] == ':') {
      v = strtol(line + kl + 1, NULL, 10);
      break;
    }
  fclose(f);
  return v;
}

/* Heap in use: small blocks plus blocks malloc mapped on their own. */
static size_t heap_bytes(void) {
  struct mallinfo2 m = mallinfo2();
  return m.uordblks + m.hblkhd;
}

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static ag_guard *make(const ag_config *c) {
  ag_guard *g = NULL;
  ag_error_t err;
  if (ag_guard_new(&g, c, NULL, &err) != AG_OK) {
    fprintf(stderr, "bench_memory: ag_guard_new: %s\n", err.msg);
    exit(1);
  }
  return g;
}

/* One iteration of one call; returns the batch verdict. */
static ag_action one_call(ag_guard *g, const char *args, size_t len) {
  ag_verdict v;
  ag_guard_begin_iteration(g, 0, &v);
  ag_call c = {"write_file", args, len};
  ag_call_check ck;
  ag_action a = ag_guard_check_calls(g, &c, 1, 0, &ck, &v);
  if (a != AG_ALLOW)
    return a;
  ag_result r = {
      "write_file", ck.valid ? ck.sig : NULL, AG_OUTCOME_OK, "written", 7,
      AG_CAT_AUTO};
  return ag_guard_record_results(g, &r, 1, 0, &v);
}

int main(void) {
  ag_config cfg;
  ag_config_init(&cfg);
  printf("agentguard %s: a guard's memory, default preset\n", ag_version());

  /* 1. Idle guards. */
  enum { N = 10000 };
  ag_guard **gs = calloc(N, sizeof(*gs));
  if (gs == NULL)
    return 1;
  long rss0 = status_kb("VmRSS"), vsz0 = status_kb("VmSize");
  size_t heap0 = heap_bytes();
  for (int i = 0; i < N; i++)
    gs[i] = make(&cfg);
  long rss1 = status_kb("VmRSS"), vsz1 = status_kb("VmSize");
  size_t heap1 = heap_bytes();
  printf("10,000 idle guards: RSS +%.1f MB, virtual +%.1f MB, heap +%.1f MB\n",
         (double)(rss1 - rss0) / 1024, (double)(vsz1 - vsz0) / 1024,
         (double)(heap1 - heap0) / 1e6);
  printf("  per guard: %.1f KiB resident, %.1f KiB virtual (target <= 64 KiB "
         "both)\n",
         (double)(rss1 - rss0) / N, (double)(vsz1 - vsz0) / N);
  printf("guards_rss_mb value=%.1f\n", (double)(rss1 - rss0) / 1024);
  for (int i = 0; i < N; i++)
    ag_guard_free(gs[i]);
  free(gs);

  /* 2. Creating and freeing one: the median of 7 rounds. */
  enum { ROUNDS = 7, CYCLES = 20000 };
  double per[ROUNDS];
  for (int r = 0; r < ROUNDS; r++) {
    double t0 = now_us();
    for (int i = 0; i < CYCLES; i++)
      ag_guard_free(make(&cfg));
    per[r] = (now_us() - t0) / CYCLES;
  }
  qsort(per, ROUNDS, sizeof(per[0]), cmp_double);
  printf("create + free: %.2f us median (%.2f-%.2f over %d rounds of %d; "
         "target <= 20 us)\n",
         per[ROUNDS / 2], per[0], per[ROUNDS - 1], ROUNDS, CYCLES);
  printf("create_free_us value=%.2f\n", per[ROUNDS / 2]);

  /* 3. A 1 MiB call, then the next iteration. */
  size_t big_len = (1u << 20) - 64;
  char *big = malloc(big_len + 1);
  if (big == NULL)
    return 1;
  /* {"content":"xxx...","n":[0,1,2,...]} : one long string, many values */
  size_t p = 0;
  p += (size_t)sprintf(big + p, "{\"content\":\"");
  while (p < big_len / 2)
    big[p++] = 'x';
  p += (size_t)sprintf(big + p, "\",\"n\":[0");
  for (int k = 1; p + 16 < big_len && k < 65000; k++)
    p += (size_t)sprintf(big + p, ",%d", k % 10);
  p += (size_t)sprintf(big + p, "]}");
  ag_guard *g = make(&cfg);
  one_call(g, "{\"path\":\"a\"}", 12);
  size_t idle = heap_bytes();
  ag_action a = one_call(g, big, p);
  size_t after = heap_bytes();
  one_call(g, "{\"path\":\"b\"}", 12);
  size_t next = heap_bytes();
  printf("a %zu-byte call (%s; the heap counts its 1 MiB text too): heap "
         "%.1f KiB before, %.1f KiB after it, "
         "%.1f KiB at the next iteration (target: back to the idle size)\n",
         p, a == AG_ALLOW ? "allowed" : "refused", (double)idle / 1024,
         (double)after / 1024, (double)next / 1024);
  printf("heap_after_big_call_kib value=%.1f\n", (double)next / 1024);
  ag_guard_free(g);
  free(big);
  return 0;
}
