/*
 * cli/audit.c - `agentguard audit [options] PATH...`: replays recorded agent
 * runs through the guard and reports where each would have stopped, how
 * many steps that would have saved, and which successful runs it would have
 * cut short. docs/audit.md is the user's page.
 *
 * Design. This file does the I/O the core must not do: it reads files and
 * folders (a folder's own files named *.json, *.jsonl or *.ndjson, sorted,
 * hidden ones skipped, subfolders not entered; a file named on the command
 * line is read whatever its name; "-" is standard input), caps each input at
 * 64 MiB, and prints. Parsing and the replay are ag_trajectory_parse and
 * ag_auditor_run (include/agentguard/audit.h), the summary and the JSON are
 * the core's too, so an embedding program gets the same numbers.
 *
 * Each input is read, parsed, audited, printed and freed in turn, so memory
 * does not grow with the number of files; --jobs threads do the reading,
 * parsing and replay of the next inputs meanwhile (the pool below), while
 * the main thread prints in input order. Within one input, jansson's
 * tree is most of it: 3 to 4 times the input for real recordings, but up to
 * about 80 times for a document of tiny values ("[{},{},...]", every "{}"
 * an object with its own hash table). So jansson allocates through a
 * counter here (json_set_alloc_funcs) and, while an input is parsed, may
 * hold at most JSON_BUDGET_FACTOR times the input's size: past that the
 * parse fails and the input is skipped as too large to parse. Figures in
 * docs/audit.md (Memory). A bad input
 * (unreadable, too big, not JSON, unknown shape, a tool reply without its
 * call, ...) is reported with its reason and skipped; the others still run.
 * A JSON Lines input whose last line was cut off mid-line (a writer killed
 * while writing it) is audited without that line, with a warning naming it
 * (ag_trajectory.cut_line): it does not count as skipped.
 *
 * Names and texts from the inputs (file names, tool names inside stop
 * messages) are shown safely: in the table through cli_put_oneline (control
 * characters become '?', as in the timeline), in --json with bytes that are
 * not UTF-8 replaced by U+FFFD (jansson writes only valid UTF-8).
 *
 * Exit codes (audit's own, documented in docs/audit.md): 0 every input was
 * audited, whatever the guard found; 1 some inputs were skipped; 2 bad
 * invocation (unknown option, bad preset or config, a PATH that does not
 * exist, no input files): nothing ran. Stops are findings, not failures,
 * so they never change the exit code (unlike simulate's 3).
 */
#include <dirent.h>
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "agentguard/audit.h"
#include "args.h"
#include "cli.h"
#include "timeline.h"

#define MAX_INPUT_BYTES ((size_t)64 << 20)
#define MAX_CONFIG_BYTES ((size_t)1 << 20)
#define JSON_BUDGET_FACTOR 8 /* jansson's memory per byte of input, at most */
#define JSON_BUDGET_MIN ((size_t)16 << 20)

static const char usage_text[] =
    "usage: agentguard audit [options] PATH...\n"
    "\n"
    "Replays recorded agent runs through the guard: where would it have "
    "stopped\neach run, for which reason, and how many steps would that "
    "have saved?\n"
    "\n"
    "PATH is a file, a folder (its *.json, *.jsonl and *.ndjson files, not\n"
    "subfolders) or - for standard input. Formats are detected: agentguard\n"
    "trajectories ({\"steps\": ...}), conversations as the model APIs send\n"
    "them (Chat Completions or Anthropic Messages: an array of messages,\n"
    "{\"messages\": [...]} or JSON Lines of messages; OpenAI Responses:\n"
    "{\"input\": [...]}; Gemini: {\"contents\": [...]}) and agentguard event\n"
    "logs (simulate --events).\n"
    "\n"
    "options:\n"
    "  --preset NAME   the preset to audit with (default: default)\n"
    "  --config FILE   a config file; with --preset, its keys go on top of "
    "NAME;\n"
    "                  default ./agentguard.json, then\n"
    "                  $XDG_CONFIG_HOME/agentguard/config.json\n"
    "  --all-stops     also show each mechanism's first stop when it is the\n"
    "                  only one on\n"
    "  --json          JSON Lines on stdout: one object per run or skipped\n"
    "                  input, then a summary (docs/audit.md)\n"
    "  --quiet, -q     the summary only (table output)\n"
    "  --jobs N        inputs read and replayed at once, 1 to 64 (default:\n"
    "                  the number of cores); output stays in input order\n"
    "  -h, --help      this text\n"
    "\n"
    "Exit codes: 0 every input audited (whatever the guard found), 1 some\n"
    "inputs were skipped, 2 invalid invocation (nothing ran).\n";

typedef struct opts {
  const char *preset;
  const char *config;
  bool all_stops;
  bool json;
  bool quiet;
  int jobs; /* --jobs: threads reading and replaying inputs; 0: the cores */
} opts;

#define JOBS_MAX 64

/* ---- jansson's memory ---------------------------------------------------- */

/* Live bytes jansson holds (malloc_usable_size of what it allocated and has
 * not freed), and the most it may hold above `json_base` while an input is
 * parsed. A block jansson allocated but someone frees with free() (a
 * json_dumps result) is never subtracted; counting from `json_base`, taken
 * just before each parse, keeps such drift out of the budget. Each thread
 * counts its own (an input is parsed by one thread; a block freed by
 * another thread only makes that thread's count drift, which the base
 * taken before each parse keeps out of the budget too). */
static _Thread_local size_t json_live, json_base, json_budget = SIZE_MAX;
static _Thread_local bool json_over;

static void *json_counted_malloc(size_t n) {
  size_t used = json_live > json_base ? json_live - json_base : 0;
  if (json_budget != SIZE_MAX && used + n > json_budget) {
    json_over = true;
    return NULL;
  }
  void *p = malloc(n);
  if (p != NULL)
    json_live += malloc_usable_size(p);
  return p;
}

static void json_counted_free(void *p) {
  if (p == NULL)
    return;
  size_t n = malloc_usable_size(p);
  json_live = json_live >= n ? json_live - n : 0;
  free(p);
}

/* ---- small helpers ------------------------------------------------------ */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static char *xstrdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *p = malloc(n);
  if (p == NULL) {
    fprintf(stderr, "agentguard audit: out of memory\n");
    exit(AG_EXIT_FAILURE);
  }
  memcpy(p, s, n);
  return p;
}

static bool ends_with(const char *s, const char *suffix) {
  size_t n = strlen(s), k = strlen(suffix);
  if (k > n)
    return false;
  for (size_t i = 0; i < k; i++) {
    char a = s[n - k + i], b = suffix[i];
    if (a >= 'A' && a <= 'Z')
      a = (char)(a - 'A' + 'a');
    if (a != b)
      return false;
  }
  return true;
}

/* Length of the valid UTF-8 sequence that starts s[0..n) (1 to 4 bytes), or
 * 0 when it is not one: jansson's rules (no overlong forms, no surrogates,
 * nothing above U+10FFFF). */
static size_t utf8_seq(const unsigned char *s, size_t n) {
  unsigned c = s[0], cp, min;
  size_t k;
  if (c < 0x80)
    return 1;
  if (c >= 0xC2 && c <= 0xDF) {
    k = 2;
    cp = c & 0x1F;
    min = 0x80;
  } else if ((c & 0xF0) == 0xE0) {
    k = 3;
    cp = c & 0x0F;
    min = 0x800;
  } else if (c >= 0xF0 && c <= 0xF4) {
    k = 4;
    cp = c & 0x07;
    min = 0x10000;
  } else {
    return 0;
  }
  if (n < k)
    return 0;
  for (size_t i = 1; i < k; i++) {
    if ((s[i] & 0xC0) != 0x80)
      return 0;
    cp = (cp << 6) | (s[i] & 0x3Fu);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
    return 0;
  return k;
}

/* A copy of `s` (caller frees) where every byte that is not part of valid
 * UTF-8 is U+FFFD, so that jansson keeps the text (it drops invalid UTF-8). */
static char *utf8_clean(const char *s) {
  size_t n = strlen(s);
  char *out = malloc(n * 3 + 1);
  if (out == NULL) {
    fprintf(stderr, "agentguard audit: out of memory\n");
    exit(AG_EXIT_FAILURE);
  }
  size_t o = 0;
  for (size_t i = 0; i < n;) {
    size_t k = utf8_seq((const unsigned char *)s + i, n - i);
    if (k == 0) {
      memcpy(out + o, "\xEF\xBF\xBD", 3);
      o += 3;
      i++;
    } else {
      memcpy(out + o, s + i, k);
      o += k;
      i += k;
    }
  }
  out[o] = '\0';
  return out;
}

/* The name shown for an input: its base name without the extension. */
static void run_label(const char *path, char *buf, size_t cap) {
  if (strcmp(path, "-") == 0) {
    snprintf(buf, cap, "(stdin)");
    return;
  }
  const char *base = strrchr(path, '/');
  base = base != NULL ? base + 1 : path;
  snprintf(buf, cap, "%s", base);
  static const char *const exts[] = {".json", ".jsonl", ".ndjson"};
  for (size_t i = 0; i < sizeof(exts) / sizeof(exts[0]); i++) {
    if (ends_with(buf, exts[i]) && strlen(buf) > strlen(exts[i])) {
      buf[strlen(buf) - strlen(exts[i])] = '\0';
      break;
    }
  }
}

/* Reads a whole file (or stdin for "-") up to `cap` bytes. Returns 0 and a
 * malloc'd buffer, or -1 with a reason in why. */
static int read_input(const char *path, size_t cap, char **out, size_t *len,
                      char *why, size_t why_cap) {
  *out = NULL;
  *len = 0;
  FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
  if (f == NULL) {
    snprintf(why, why_cap, "cannot open: %s", strerror(errno));
    return -1;
  }
  size_t bcap = 65536, n = 0;
  struct stat st;
  if (fstat(fileno(f), &st) == 0 && S_ISREG(st.st_mode)) {
    if ((uintmax_t)st.st_size > (uintmax_t)cap) {
      snprintf(why, why_cap,
               "larger than %zu MiB (%jd bytes); split it or audit a part",
               cap >> 20, (intmax_t)st.st_size);
      if (f != stdin)
        fclose(f);
      return -1;
    }
    bcap = (size_t)st.st_size + 1;
  }
  char *buf = malloc(bcap);
  if (buf == NULL) {
    snprintf(why, why_cap, "out of memory");
    if (f != stdin)
      fclose(f);
    return -1;
  }
  for (;;) {
    if (n == bcap) {
      if (bcap > cap) {
        snprintf(why, why_cap, "larger than %zu MiB", cap >> 20);
        free(buf);
        if (f != stdin)
          fclose(f);
        return -1;
      }
      size_t nc = bcap * 2 > cap + 1 ? cap + 1 : bcap * 2;
      char *q = realloc(buf, nc);
      if (q == NULL) {
        snprintf(why, why_cap, "out of memory");
        free(buf);
        if (f != stdin)
          fclose(f);
        return -1;
      }
      buf = q;
      bcap = nc;
    }
    size_t got = fread(buf + n, 1, bcap - n, f);
    n += got;
    if (got == 0)
      break;
  }
  bool failed = ferror(f) != 0;
  int e = errno;
  if (f != stdin)
    fclose(f);
  if (failed) {
    snprintf(why, why_cap, "read error: %s", strerror(e));
    free(buf);
    return -1;
  }
  if (n > cap) {
    snprintf(why, why_cap, "larger than %zu MiB", cap >> 20);
    free(buf);
    return -1;
  }
  *out = buf;
  *len = n;
  return 0;
}

/* ---- the input list ----------------------------------------------------- */

typedef struct inputs {
  char **paths;
  size_t n, cap;
} inputs;

static void inputs_add(inputs *in, char *path) {
  if (in->n == in->cap) {
    size_t nc = in->cap ? in->cap * 2 : 64;
    char **p = realloc(in->paths, nc * sizeof(*p));
    if (p == NULL) {
      fprintf(stderr, "agentguard audit: out of memory\n");
      exit(AG_EXIT_FAILURE);
    }
    in->paths = p;
    in->cap = nc;
  }
  in->paths[in->n++] = path;
}

static void inputs_free(inputs *in) {
  for (size_t i = 0; i < in->n; i++)
    free(in->paths[i]);
  free(in->paths);
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Adds the files of folder `dir`; returns -1 (message printed) when it
 * cannot be listed. */
static int add_folder(inputs *in, const char *dir) {
  DIR *d = opendir(dir);
  if (d == NULL) {
    fprintf(stderr, "agentguard audit: %s: cannot list: %s\n", dir,
            strerror(errno));
    return -1;
  }
  size_t first = in->n;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    const char *name = e->d_name;
    if (name[0] == '.')
      continue; /* hidden files, "." and ".." */
    if (!ends_with(name, ".json") && !ends_with(name, ".jsonl") &&
        !ends_with(name, ".ndjson"))
      continue;
    size_t need = strlen(dir) + 1 + strlen(name) + 1;
    char *p = malloc(need);
    if (p == NULL) {
      closedir(d);
      fprintf(stderr, "agentguard audit: out of memory\n");
      exit(AG_EXIT_FAILURE);
    }
    bool slash = dir[0] != '\0' && dir[strlen(dir) - 1] == '/';
    snprintf(p, need, "%s%s%s", dir, slash ? "" : "/", name);
    struct stat st;
    if (stat(p, &st) != 0 || !S_ISREG(st.st_mode)) {
      free(p); /* subfolders and special files are not entered */
      continue;
    }
    inputs_add(in, p);
  }
  closedir(d);
  if (in->n > first) /* paths is NULL while nothing was added */
    qsort(in->paths + first, in->n - first, sizeof(*in->paths), cmp_str);
  return 0;
}

/* ---- the config --------------------------------------------------------- */

/* --config FILE on top of --preset NAME: the file's keys over the preset.
 * A file that names another preset is a conflict. */
static int load_config(const opts *o, ag_config *cfg) {
  ag_error_t err;
  if (o->config == NULL) {
    const char *name = o->preset != NULL ? o->preset : "default";
    if (ag_config_preset(cfg, name, &err) != AG_OK) {
      fprintf(stderr, "agentguard audit: %s\n", err.msg);
      return -1;
    }
    return 0;
  }
  if (o->preset == NULL) {
    if (ag_config_load_file(cfg, o->config, &err) != AG_OK) {
      fprintf(stderr, "agentguard audit: %s\n", err.msg);
      return -1;
    }
    return 0;
  }
  char *buf;
  size_t len;
  char why[256];
  if (read_input(o->config, MAX_CONFIG_BYTES, &buf, &len, why, sizeof(why))) {
    fprintf(stderr, "agentguard audit: %s: %s\n", o->config, why);
    return -1;
  }
  json_error_t je;
  json_t *root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
  free(buf);
  if (!json_is_object(root)) {
    if (root == NULL)
      fprintf(stderr, "agentguard audit: %s: line %d, column %d: %s\n",
              o->config, je.line, je.column, je.text);
    else
      fprintf(stderr, "agentguard audit: %s: a config must be a JSON object\n",
              o->config);
    json_decref(root);
    return -1;
  }
  const char *named = json_string_value(json_object_get(root, "preset"));
  if (named != NULL && strcmp(named, o->preset) != 0) {
    fprintf(stderr,
            "agentguard audit: --preset %s conflicts with \"preset\": \"%s\" "
            "in %s; give one\n",
            o->preset, named, o->config);
    json_decref(root);
    return -1;
  }
  json_object_set_new(root, "preset", json_string(o->preset));
  char *text = json_dumps(root, JSON_COMPACT);
  json_decref(root);
  if (text == NULL) {
    fprintf(stderr, "agentguard audit: out of memory\n");
    return -1;
  }
  ag_err_t rc = ag_config_parse(cfg, text, strlen(text), &err);
  free(text);
  if (rc != AG_OK) {
    fprintf(stderr, "agentguard audit: %s: %s\n", o->config, err.msg);
    return -1;
  }
  return 0;
}

/* ---- output ------------------------------------------------------------- */

#define LABEL_MIN 12
#define LABEL_MAX 72
#define MSG_W 64

/* Prints `s` on one line, control characters as '?' (cli_put_oneline),
 * cut to about `w` bytes; then pads with spaces to `pad` bytes. */
static void put_safe(const char *s, size_t w, size_t pad) {
  size_t n = strlen(s);
  size_t keep = n > w ? ag_utf8_truncate(s, n, w > 3 ? w - 3 : w) : n;
  cli_put_oneline(stdout, s, keep, keep);
  size_t shown = keep;
  if (keep < n) {
    fputs("...", stdout);
    shown += 3;
  }
  for (; shown < pad; shown++)
    putchar(' ');
}

static void print_header(int w) {
  printf("%-*s %-10s %5s %5s %4s %-18s %5s  %s\n", w, "RUN", "OUTCOME", "STEPS",
         "STOP", "TURN", "REASON", "SAVED", "MESSAGE");
}

static void print_row(int w, const char *label, const ag_trajectory *t,
                      const ag_audit_finding *f) {
  put_safe(label, LABEL_MAX, (size_t)w);
  printf(" %-10s %5d ", ag_run_outcome_name(t->outcome), f->steps);
  if (!f->stop.stopped) {
    printf("%5s %4s %-18s %5s\n", "-", "-", "-", "-");
  } else {
    char reason[40];
    snprintf(reason, sizeof(reason), "%s%s", ag_reason_name(f->stop.reason),
             f->stop.action == AG_ESCALATE ? "*" : "");
    printf("%5d %4d %-18s %5d  ", f->stop.step, f->stop.turn, reason,
           f->stop.steps_after);
    put_safe(f->stop.message, MSG_W, 0);
    putchar('\n');
  }
  if (f->all_stops) {
    printf("%*s alone:", w, "");
    bool any = false;
    for (int r = 1; r < AG_REASON__COUNT; r++) {
      if (!f->mechanism_on[r])
        continue;
      const ag_audit_stop *s = &f->by_mechanism[r];
      if (s->stopped)
        printf(" %s@%d", ag_reason_name((ag_reason)r), s->step);
      else
        printf(" %s -", ag_reason_name((ag_reason)r));
      any = true;
    }
    if (!any)
      printf(" (no mechanism enabled)");
    putchar('\n');
  }
}

typedef struct cut_short {
  char *label;
  int step, steps;
  ag_reason reason;
} cut_short;

static void print_summary(const opts *o, const ag_config *cfg,
                          const ag_audit_summary *s, const cut_short *cs,
                          size_t n_cs, double secs) {
  printf("\nsummary: preset %s%s%s, %d run%s audited, %d skipped, "
         "%.3f s\n",
         cfg->preset[0] ? cfg->preset : "(custom)",
         o->config != NULL ? " + " : "", o->config != NULL ? o->config : "",
         s->runs, s->runs == 1 ? "" : "s", s->skipped, secs);
  printf("  %-11s %5s %8s %7s %7s %7s\n", "outcome", "runs", "stopped", "steps",
         "saved", "share");
  static const ag_run_outcome order[] = {AG_RUN_RESOLVED, AG_RUN_UNRESOLVED,
                                         AG_RUN_UNKNOWN};
  for (size_t k = 0; k < 3; k++) {
    int i = (int)order[k];
    printf("  %-11s %5d %8d %7ld %7ld %6.1f%%\n", ag_run_outcome_name(order[k]),
           s->runs_by_outcome[i], s->stopped_by_outcome[i],
           s->steps_by_outcome[i], s->saved_by_outcome[i],
           100.0 * ag_audit_summary_saved_share(s, order[k]));
  }
  printf("  steps saved in unresolved runs: %.1f%%\n",
         100.0 * ag_audit_summary_saved_share(s, AG_RUN_UNRESOLVED));
  printf("  stops by reason:");
  bool any = false;
  for (int r = 1; r < AG_REASON__COUNT; r++) {
    if (s->stops_by_reason[r] == 0)
      continue;
    printf(" %s %d", ag_reason_name((ag_reason)r), s->stops_by_reason[r]);
    any = true;
  }
  printf("%s\n", any ? "" : " none");
  if (s->escalations > 0)
    printf("  escalations (counted as stops, marked *): %d\n", s->escalations);
  if (s->held_back > 0)
    printf("  calls a nudge would have held back: %d\n", s->held_back);
  if (s->all_stops) {
    printf("  runs each mechanism alone would stop:");
    for (int r = 1; r < AG_REASON__COUNT; r++)
      if (s->mechanism_on[r])
        printf(" %s %d", ag_reason_name((ag_reason)r), s->mechanism_stops[r]);
    putchar('\n');
  }
  if (n_cs == 0) {
    printf("  resolved runs cut short: none\n");
  } else {
    printf("  resolved runs cut short (%zu):\n", n_cs);
    for (size_t i = 0; i < n_cs; i++) {
      fputs("    ", stdout);
      put_safe(cs[i].label, LABEL_MAX, 0);
      printf(" at step %d of %d (%s)\n", cs[i].step, cs[i].steps,
             ag_reason_name(cs[i].reason));
    }
  }
}

/* ---- the inputs, read and replayed by a pool of threads ----------------- */

/*
 * `--jobs N` threads read, parse and replay inputs (each with an auditor of
 * its own: an ag_auditor is one thread's); the main thread prints and adds
 * to the summary in input order, as each input's turn comes. A thread takes
 * input i only while i < consumed + window (window = 2 x jobs), so at most
 * that many parsed inputs wait for their turn: memory stays that of 2 x jobs
 * inputs, whatever their number.
 */
typedef struct job_result {
  bool done, ok;
  ag_trajectory *t;
  ag_audit_finding f;
  char why[AG_ERROR_MSG_MAX + 64];
} job_result;

typedef struct pool {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  const inputs *in;
  const ag_config *cfg;
  const ag_audit_opts *ao;
  job_result *res;
  size_t next, consumed, window;
  pthread_t threads[JOBS_MAX];
  int n_threads;
} pool;

static int cores(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n < 1 ? 1 : n > JOBS_MAX ? JOBS_MAX : (int)n;
}

/* Reads, parses and replays input i into r (r->ok, or r->why). */
static void run_one(const char *path, ag_auditor *aud, job_result *r) {
  char *buf = NULL;
  size_t len = 0;
  ag_error_t err;
  r->ok = read_input(path, MAX_INPUT_BYTES, &buf, &len, r->why,
                     sizeof(r->why)) == 0;
  if (r->ok) {
    ag_traj_opts to;
    ag_traj_opts_init(&to);
    to.max_bytes = MAX_INPUT_BYTES;
    size_t budget = len * JSON_BUDGET_FACTOR;
    json_base = json_live;
    json_budget = budget > JSON_BUDGET_MIN ? budget : JSON_BUDGET_MIN;
    json_over = false;
    r->ok = ag_trajectory_parse(&r->t, buf, len, &to, &err) == AG_OK;
    json_budget = SIZE_MAX;
    if (!r->ok && json_over)
      snprintf(r->why, sizeof(r->why),
               "needs more than %zu MiB to parse (%d times its size: its "
               "JSON has very many small values); split it or audit a part",
               (budget > JSON_BUDGET_MIN ? budget : JSON_BUDGET_MIN) >> 20,
               JSON_BUDGET_FACTOR);
    else if (!r->ok)
      snprintf(r->why, sizeof(r->why), "%s", err.msg);
  }
  free(buf);
  if (r->ok) {
    r->ok = ag_auditor_run(aud, r->t, &r->f, &err) == AG_OK;
    if (!r->ok)
      snprintf(r->why, sizeof(r->why), "%s", err.msg);
  }
}

static void *pool_main(void *arg) {
  pool *P = arg;
  ag_auditor *aud = NULL;
  ag_error_t err;
  bool made = ag_auditor_new(&aud, P->cfg, P->ao, &err) == AG_OK;
  pthread_mutex_lock(&P->mu);
  for (;;) {
    while (P->next < P->in->n && P->next >= P->consumed + P->window)
      pthread_cond_wait(&P->cv, &P->mu);
    if (P->next >= P->in->n)
      break;
    size_t i = P->next++;
    pthread_mutex_unlock(&P->mu);
    job_result *r = &P->res[i];
    if (made)
      run_one(P->in->paths[i], aud, r);
    else
      snprintf(r->why, sizeof r->why, "%s", err.msg);
    pthread_mutex_lock(&P->mu);
    r->done = true;
    pthread_cond_broadcast(&P->cv);
  }
  pthread_mutex_unlock(&P->mu);
  ag_auditor_free(aud);
  return NULL;
}

/* Starts `jobs` threads (fewer for fewer inputs); 0, or -1 with err. */
static int pool_start(pool *P, const inputs *in, const ag_config *cfg,
                      const ag_audit_opts *ao, int jobs, ag_error_t *err) {
  memset(P, 0, sizeof *P);
  P->in = in;
  P->cfg = cfg;
  P->ao = ao;
  P->res = calloc(in->n, sizeof *P->res);
  if (jobs > (int)in->n)
    jobs = (int)in->n;
  P->window = 2 * (size_t)jobs;
  pthread_mutex_init(&P->mu, NULL);
  pthread_cond_init(&P->cv, NULL);
  for (int k = 0; P->res != NULL && k < jobs; k++) {
    if (pthread_create(&P->threads[k], NULL, pool_main, P) != 0)
      break;
    P->n_threads++;
  }
  if (P->n_threads == 0) {
    free(P->res);
    pthread_mutex_destroy(&P->mu);
    pthread_cond_destroy(&P->cv);
    snprintf(err->msg, sizeof err->msg, "%s",
             P->res == NULL ? "out of memory" : "cannot start a thread");
    return -1;
  }
  return 0;
}

/* Input i's result, once a thread has it. */
static job_result *pool_take(pool *P, size_t i) {
  pthread_mutex_lock(&P->mu);
  while (!P->res[i].done)
    pthread_cond_wait(&P->cv, &P->mu);
  pthread_mutex_unlock(&P->mu);
  return &P->res[i];
}

/* Input i is printed: its trajectory goes, and a thread may take one more. */
static void pool_done(pool *P, size_t i) {
  ag_trajectory_free(P->res[i].t);
  P->res[i].t = NULL;
  pthread_mutex_lock(&P->mu);
  P->consumed = i + 1;
  pthread_cond_broadcast(&P->cv);
  pthread_mutex_unlock(&P->mu);
}

static void pool_stop(pool *P) {
  for (int k = 0; k < P->n_threads; k++)
    pthread_join(P->threads[k], NULL);
  pthread_mutex_destroy(&P->mu);
  pthread_cond_destroy(&P->cv);
  free(P->res);
}

/* ---- the command -------------------------------------------------------- */

static int parse_args(int argc, char **argv, opts *o, inputs *in) {
  bool done_opts = false;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!done_opts && strcmp(a, "--") == 0) {
      done_opts = true;
    } else if (!done_opts &&
               (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0)) {
      fputs(usage_text, stdout);
      return 1;
    } else if (!done_opts &&
               (strcmp(a, "--preset") == 0 || strcmp(a, "--config") == 0)) {
      if (i + 1 >= argc) {
        fprintf(stderr, "agentguard audit: %s needs a value\n", a);
        return -1;
      }
      if (a[2] == 'p')
        o->preset = argv[++i];
      else
        o->config = argv[++i];
    } else if (!done_opts && strncmp(a, "--preset=", 9) == 0) {
      o->preset = a + 9;
    } else if (!done_opts && strncmp(a, "--config=", 9) == 0) {
      o->config = a + 9;
    } else if (!done_opts && strcmp(a, "--all-stops") == 0) {
      o->all_stops = true;
    } else if (!done_opts && strcmp(a, "--json") == 0) {
      o->json = true;
    } else if (!done_opts &&
               (strcmp(a, "--quiet") == 0 || strcmp(a, "-q") == 0)) {
      o->quiet = true;
    } else if (!done_opts && strcmp(a, "--jobs") == 0) {
      char *end = NULL;
      long v = i + 1 < argc ? strtol(argv[i + 1], &end, 10) : 0;
      if (i + 1 >= argc || end == argv[i + 1] || *end != '\0' || v < 1 ||
          v > JOBS_MAX) {
        cli_usage_error("audit", "--jobs %s: expected a number from 1 to %d",
                        i + 1 < argc ? argv[i + 1] : "(none)", JOBS_MAX);
        return -1;
      }
      o->jobs = (int)v;
      i++;
    } else if (!done_opts && a[0] == '-' && a[1] != '\0') {
      cli_usage_error("audit", "unknown option '%s'", a);
      return -1;
    } else {
      struct stat st;
      if (strcmp(a, "-") == 0) {
        inputs_add(in, xstrdup(a));
      } else if (stat(a, &st) != 0) {
        fprintf(stderr, "agentguard audit: %s: %s\n", a, strerror(errno));
        return -1;
      } else if (S_ISDIR(st.st_mode)) {
        size_t before = in->n;
        if (add_folder(in, a) != 0)
          return -1;
        if (in->n == before)
          fprintf(stderr,
                  "agentguard audit: %s: no *.json, *.jsonl or *.ndjson "
                  "files in this folder\n",
                  a);
      } else {
        inputs_add(in, xstrdup(a));
      }
    }
  }
  return 0;
}

int cli_audit(int argc, char **argv) {
  /* Before any jansson value exists: everything jansson allocates from
   * here on is counted (see the top of this file). */
  json_set_alloc_funcs(json_counted_malloc, json_counted_free);
  opts o;
  memset(&o, 0, sizeof(o));
  inputs in;
  memset(&in, 0, sizeof(in));
  int pr = parse_args(argc, argv, &o, &in);
  if (pr != 0) {
    inputs_free(&in);
    return pr > 0 ? AG_EXIT_OK : AG_EXIT_USAGE;
  }
  if (in.n == 0) {
    fprintf(stderr, "agentguard audit: no input files (give files or "
                    "folders of recorded runs; --help)\n");
    inputs_free(&in);
    return AG_EXIT_USAGE;
  }
  char defcfg[4096];
  cli_use_default_config("audit", &o.config, defcfg, sizeof defcfg);
  ag_config cfg;
  if (load_config(&o, &cfg) != 0) {
    inputs_free(&in);
    return AG_EXIT_USAGE;
  }
  ag_audit_opts ao;
  ag_audit_opts_init(&ao);
  ao.all_stops = o.all_stops;
  ag_auditor *aud = NULL;
  ag_error_t err;
  if (ag_auditor_new(&aud, &cfg, &ao, &err) != AG_OK) {
    fprintf(stderr, "agentguard audit: %s\n", err.msg);
    inputs_free(&in);
    return AG_EXIT_USAGE;
  }
  const char *preset = cfg.preset[0] ? cfg.preset : NULL;

  ag_audit_summary sum;
  ag_audit_summary_init(&sum);
  cut_short *cs = NULL;
  size_t n_cs = 0;
  int width = LABEL_MIN;
  for (size_t i = 0; i < in.n; i++) {
    char label[512];
    run_label(in.paths[i], label, sizeof(label));
    int l = (int)strlen(label);
    if (l > width)
      width = l > LABEL_MAX ? LABEL_MAX : l;
  }
  double t0 = now_s();
  bool header = false;
  int jobs = o.jobs > 0 ? o.jobs : cores();
  pool P;
  if (pool_start(&P, &in, &cfg, &ao, jobs, &err) != 0) {
    fprintf(stderr, "agentguard audit: %s\n", err.msg);
    ag_auditor_free(aud);
    inputs_free(&in);
    return AG_EXIT_FAILURE;
  }
  for (size_t i = 0; i < in.n; i++) {
    const char *path = in.paths[i];
    char label[512];
    run_label(path, label, sizeof(label));
    job_result *res = pool_take(&P, i);
    bool ok = res->ok;
    ag_trajectory *t = res->t;
    ag_audit_finding f = res->f;
    const char *why = res->why;
    if (ok && t->cut_line > 0) {
      fputs("agentguard audit: ", stderr);
      cli_put_oneline(stderr, path, strlen(path), strlen(path));
      fprintf(stderr,
              ": line %ld is cut off (the writer stopped mid-line); read "
              "without it\n",
              t->cut_line);
    }
    if (!ok) {
      ag_audit_summary_add_skipped(&sum);
      fputs("agentguard audit: ", stderr);
      cli_put_oneline(stderr, path, strlen(path), strlen(path));
      fputs(": skipped: ", stderr);
      cli_put_oneline(stderr, why, strlen(why), strlen(why));
      fputc('\n', stderr);
      if (o.json) {
        char *file = utf8_clean(path), *error = utf8_clean(why);
        json_t *j = json_object();
        json_object_set_new(j, "type", json_string("skipped"));
        json_object_set_new(j, "file", json_string(file));
        json_object_set_new(j, "error", json_string(error));
        free(file);
        free(error);
        char *line = json_dumps(j, JSON_COMPACT);
        if (line != NULL)
          puts(line);
        free(line);
        json_decref(j);
      }
      pool_done(&P, i);
      continue;
    }
    ag_audit_summary_add(&sum, t, &f);
    if (f.stop.stopped && t->outcome == AG_RUN_RESOLVED) {
      cut_short *q = realloc(cs, (n_cs + 1) * sizeof(*cs));
      if (q != NULL) {
        cs = q;
        cs[n_cs].label = xstrdup(label);
        cs[n_cs].step = f.stop.step;
        cs[n_cs].steps = f.steps;
        cs[n_cs].reason = f.stop.reason;
        n_cs++;
      }
    }
    if (o.json) {
      char *line = NULL, *file = utf8_clean(path);
      if (ag_audit_finding_json(file, preset, t, &f, &line, &err) == AG_OK)
        puts(line);
      ag_free(line);
      free(file);
    } else if (!o.quiet) {
      if (!header)
        print_header(width);
      header = true;
      print_row(width, label, t, &f);
    }
    pool_done(&P, i);
  }
  pool_stop(&P);
  double secs = now_s() - t0;

  if (o.json) {
    char *line = NULL;
    if (ag_audit_summary_json(preset, &sum, &line, &err) == AG_OK)
      puts(line);
    ag_free(line);
  } else {
    print_summary(&o, &cfg, &sum, cs, n_cs, secs);
  }
  fflush(stdout);
  for (size_t i = 0; i < n_cs; i++)
    free(cs[i].label);
  free(cs);
  ag_auditor_free(aud);
  inputs_free(&in);
  return sum.skipped > 0 ? AG_EXIT_FAILURE : AG_EXIT_OK;
}
