/*
 * bench/bench_memory.c - what a guard costs a server with many sessions
 * (issue "house in order", targets in docs/benchmarks.md):
 *   - an idle guard, resident and virtual: 10,000 guards in one process;
 *   - creating and freeing one;
 *   - the heap after a 1 MiB call, and at the next iteration;
 *   - the stored history of an agent session: heap per byte of its compact
 *     JSON (issue 9: <= 3), after turns of a realistic mix (user texts,
 *     assistant texts with one to three tool calls, tool results from 60
 *     bytes to 15 KB with quotes, newlines and non-ASCII text).
 * Prints figures; never fails on them. Exits 1 only when the library fails.
 */
#include <malloc.h>
#include <stdatomic.h>
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

/* ---- 4. the stored history ------------------------------------------- */

/* Deterministic text of `len` bytes: words, quotes, newlines, accents. */
static void fill_text(char *buf, size_t len, unsigned seed) {
  static const char *const words[] = {
      "the",    "file",  "\"quoted\"", "line\n", "données", "value:",
      "return", "{key}", "path/to/x",  "résumé", "42",      "tab\t"};
  size_t p = 0;
  unsigned k = seed;
  while (p < len) {
    const char *w = words[k++ % (sizeof(words) / sizeof(words[0]))];
    size_t wl = strlen(w);
    if (p + wl + 1 > len)
      break;
    memcpy(buf + p, w, wl);
    p += wl;
    buf[p++] = ' ';
  }
  while (p < len)
    buf[p++] = '.';
  buf[len] = '\0';
}

/* The mix: large (results up to 15 KB) or small (every text under 100
 * bytes, as bench_agent's session: where a tree costs the most). */
static bool mix_small;

typedef struct mix_model {
  unsigned requests;
} mix_model;

/* Four iterations per turn: three with text and tool calls, then the
 * final answer. */
static ag_err_t mix_complete(void *self, const ag_request *req,
                             ag_cancel *cancel, ag_delta_fn on_delta,
                             void *delta_user, ag_reply *out,
                             ag_provider_error *perr) {
  (void)cancel;
  (void)on_delta;
  (void)delta_user;
  (void)perr;
  mix_model *m = self;
  unsigned n = ++m->requests;
  size_t tl = mix_small             ? 10 + n % 40
              : req->iteration >= 4 ? 500
                                    : 80 + (n * 37) % 300;
  out->text = malloc(tl + 1);
  if (out->text == NULL)
    return AG_ENOMEM;
  fill_text(out->text, tl, n);
  if (req->iteration >= 4)
    return AG_OK;
  for (unsigned c = 0; c < 1 + n % 3; c++) {
    char path[48], note[600];
    snprintf(path, sizeof(path), "src/f%u_%u.c", n, c);
    fill_text(note, mix_small ? n % 30 : (n * 13 + c * 101) % 500, n + c);
    json_t *obj = json_pack("{s:s, s:s}", "path", path, "note", note);
    char *args = obj != NULL ? json_dumps(obj, JSON_COMPACT) : NULL;
    json_decref(obj);
    if (args == NULL)
      return AG_ENOMEM;
    char id[32];
    snprintf(id, sizeof(id), "call_%u_%u", n, c);
    ag_err_t rc = ag_reply_add_call(out, id, "read_file", args, strlen(args));
    free(args);
    if (rc != AG_OK)
      return rc;
  }
  return AG_OK;
}

static const ag_provider_vtable mix_vtable = {sizeof(ag_provider_vtable), "mix",
                                              mix_complete, NULL,
                                              AG_PROVIDER_MESSAGES_TEXT};

/* The result's size and text follow from the call's path ("src/f<n>_<c>.c"),
 * so the history is the same whatever order the pool runs a batch in. */
static ag_tool_status mix_tool(void *user, const json_t *args,
                               ag_cancel *cancel, ag_output *out) {
  (void)cancel;
  atomic_uint *calls = user;
  atomic_fetch_add(calls, 1);
  static const size_t sizes[] = {60, 700, 3000, 15000, 240, 1200};
  const char *path = json_string_value(json_object_get(args, "path"));
  unsigned n = 0, c = 0;
  if (path == NULL || sscanf(path, "src/f%u_%u.c", &n, &c) != 2)
    return AG_TOOL_ERROR;
  unsigned k = n * 3 + c;
  size_t len =
      mix_small ? 40 + k % 50 : sizes[k % (sizeof(sizes) / sizeof(sizes[0]))];
  char *buf = malloc(len + 1);
  if (buf == NULL)
    return AG_TOOL_ERROR;
  int h = snprintf(buf, len + 1, "%s #%u: ", path, k);
  fill_text(buf + h, len - (size_t)h, k);
  ag_output_write(out, buf, len);
  free(buf);
  return AG_TOOL_OK;
}

/* Heap per byte of the history's compact JSON after filling a session. */
static void history_memory(bool small) {
  mix_small = small;
  ag_error_t err;
  ag_registry *reg = NULL;
  atomic_uint tool_calls = 0;
  if (ag_registry_new(&reg, &err) != AG_OK) {
    fprintf(stderr, "bench_memory: ag_registry_new: %s\n", err.msg);
    exit(1);
  }
  ag_tool_def d;
  ag_tool_def_init(&d);
  d.name = "read_file";
  d.description = "Reads a file";
  d.fn = mix_tool;
  d.user = &tool_calls;
  mix_model model = {0};
  ag_provider *prov = NULL;
  ag_agent *a = NULL;
  ag_agent_opts o;
  ag_agent_opts_init(&o);
  o.config.loop.max_turn_duration_ms = 0;
  o.system_prompt = "You are a careful assistant. Read the files you are "
                    "asked to read, then answer.";
  o.seed = 1;
  o.tools = reg;
  if (ag_registry_add(reg, &d, &err) != AG_OK ||
      ag_provider_new(&prov, &mix_vtable, &model, &err) != AG_OK ||
      (o.provider = prov, ag_agent_new(&a, &o, &err)) != AG_OK) {
    fprintf(stderr, "bench_memory: history session: %s\n", err.msg);
    exit(1);
  }
  size_t bytes0 = 0;
  ag_agent_history_json(a, &bytes0);
  size_t heap0 = heap_bytes();
  size_t bytes = bytes0, target = (size_t)6 << 20; /* under the 8 MiB cap */
  int turns = 0;
  while (bytes < target) {
    char user[256];
    fill_text(user, mix_small ? 30 : 60 + (size_t)(turns * 29) % 180,
              (unsigned)turns);
    ag_turn_outcome out;
    if (ag_agent_run_turn(a, user, NULL, &out, &err) != AG_OK ||
        out.status != AG_TURN_COMPLETED) {
      fprintf(stderr, "bench_memory: history turn %d: %s / %s: %s\n", turns,
              ag_turn_status_name(out.status), out.reason, out.message);
      exit(1);
    }
    ag_turn_outcome_clear(&out);
    turns++;
    ag_agent_history_json(a, &bytes);
  }
  size_t heap1 = heap_bytes();
  double per = (double)(heap1 - heap0) / (double)(bytes - bytes0);
  json_t *h = ag_agent_history(a);
  size_t msgs = json_array_size(h);
  json_decref(h);
  printf("history (%s mix): %d turns, %u tool calls, %zu messages, %.2f MB of "
         "compact "
         "JSON: heap +%.2f MB, %.2f bytes of heap per byte of JSON (target "
         "<= 3)\n",
         small ? "small" : "large", turns, atomic_load(&tool_calls), msgs,
         (double)(bytes - bytes0) / 1e6, (double)(heap1 - heap0) / 1e6, per);
  printf("history_heap_per_json_byte mix=%s value=%.2f\n",
         small ? "small" : "large", per);
  ag_agent_free(a);
  ag_provider_free(prov);
  ag_registry_free(reg);
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

  /* 4. The stored history of an agent session. */
  history_memory(false);
  history_memory(true);
  return 0;
}
