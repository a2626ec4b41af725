/*
 * bench/bench_content.c - what the content-loop detector costs per streamed
 * byte (include/agentguard/content.h; target: under 50 ns per byte).
 *
 * Streams, generated with a fixed seed, cut into replies (the detector is
 * reset at each reply, as the agent does at each model request):
 *   prose        replies of about 4 KB of sentences from a word list, with
 *                paragraphs, no loop; fed in deltas of 1 to 8 bytes (about
 *                the size of a streamed token), and again in deltas of 64
 *   loop         replies of about 300 bytes of prose, then one sentence
 *                repeated until the detector trips (then the next reply)
 *   code         replies of prose with fenced code blocks of 40 lines each;
 *                lines are fed in deltas of 1 to 8 bytes, fences whole (a
 *                streamed fence is one token)
 *   lists        replies of numbered and bulleted list items (a reset at
 *                almost every line), deltas of 1 to 8 bytes
 *   check_text   the prose replies through ag_content_loop_check_text
 * For each, the median over the rounds of (CPU time of the thread for the
 * whole stream) / (bytes fed).
 *
 * Output: a readable report and machine-readable lines
 *   <metric> [key=value ...] value=<number>
 * Never fails on speed; exits 1 when something is broken (a detector that
 * cannot be created, a loop found in the prose or the code, a loop stream
 * that never trips).
 *
 * Options: --rounds N (default 15), --quick or AG_BENCH_QUICK=1 (3 rounds,
 * a smaller stream).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "agentguard.h"

static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("bench_content: error: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  exit(1);
}

/* CPU time of this thread: the machines this runs on are shared and
 * loaded, and the detector is single-threaded CPU work, so wall time would
 * mostly measure the neighbours. */
static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;
static uint64_t rng(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

/* A growing text buffer (the bench may allocate; the detector does not). */
typedef struct text {
  char *p;
  size_t len, cap;
} text;

static void put(text *t, const char *s, size_t n) {
  if (t->len + n > t->cap) {
    size_t c = t->cap ? t->cap * 2 : 1 << 16;
    while (c < t->len + n)
      c *= 2;
    t->p = realloc(t->p, c);
    if (t->p == NULL)
      die("out of memory");
    t->cap = c;
  }
  memcpy(t->p + t->len, s, n);
  t->len += n;
}

static void puts_(text *t, const char *s) {
  put(t, s, strlen(s));
}

/* Pieces: offsets into a text, and where each reply starts. */
typedef struct pieces {
  size_t *off; /* piece i is [off[i], off[i+1]) */
  bool *reply; /* piece i starts a reply */
  size_t n, cap;
} pieces;

static void cut(pieces *p, size_t off, bool reply) {
  if (p->n + 2 > p->cap) {
    p->cap = p->cap ? p->cap * 2 : 4096;
    p->off = realloc(p->off, p->cap * sizeof(*p->off));
    p->reply = realloc(p->reply, p->cap * sizeof(*p->reply));
    if (p->off == NULL || p->reply == NULL)
      die("out of memory");
  }
  p->off[p->n] = off;
  p->reply[p->n] = reply;
  p->n++;
}

static const char *words[] = {
    "the",     "model",  "file",      "function", "returns",  "value",
    "error",   "test",   "change",    "because",  "when",     "config",
    "should",  "we",     "update",    "parser",   "handles",  "input",
    "output",  "before", "after",     "this",     "that",     "which",
    "a",       "an",     "is",        "are",      "not",      "with",
    "without", "buffer", "length",    "request",  "response", "server",
    "client",  "path",   "directory", "module",   "import",   "build",
    "fails",   "passes", "now",       "then",     "also",     "only",
    "first",   "second", "line",      "column",   "check",    "result"};
#define N_WORDS (sizeof(words) / sizeof(words[0]))

static void sentence(text *t) {
  int n = 6 + (int)(rng() % 14);
  for (int i = 0; i < n; i++) {
    const char *w = words[rng() % N_WORDS];
    char buf[32];
    snprintf(buf, sizeof(buf), "%s%c%s", i == 0 ? "" : " ",
             i == 0 ? (char)(w[0] - 32) : w[0], w + 1);
    puts_(t, buf);
  }
  puts_(t, rng() % 5 == 0 ? ", and so on. " : ". ");
}

/* Cuts t[from, to) into deltas of 1..max bytes (max 64: fixed 64). */
static void deltas(pieces *p, size_t from, size_t to, size_t max, bool reply) {
  size_t i = from;
  while (i < to) {
    cut(p, i, reply && i == from);
    size_t n = max == 64 ? 64 : 1 + rng() % max;
    i += n;
  }
}

static void finish(pieces *p, size_t end) {
  cut(p, end, false);
  p->n--; /* the sentinel is off[n] */
}

/* prose: replies of about 4 KB. */
static void make_prose(text *t, size_t total) {
  while (t->len < total) {
    size_t start = t->len;
    while (t->len - start < 4000) {
      sentence(t);
      if (rng() % 6 == 0)
        puts_(t, "\n\n");
    }
    puts_(t, "\n");
  }
}

static void prose_pieces(const text *t, pieces *p, size_t max) {
  /* reply boundaries: after each "\n" that ends a reply ("\n" then not
   * "\n" after a >= 4000-byte run): recompute by scanning. */
  size_t start = 0;
  for (size_t i = 0; i < t->len; i++) {
    if (t->p[i] == '\n' && i + 1 - start >= 4000 &&
        (i + 1 == t->len || t->p[i + 1] != '\n')) {
      deltas(p, start, i + 1, max, true);
      start = i + 1;
    }
  }
  if (start < t->len)
    deltas(p, start, t->len, max, true);
  finish(p, t->len);
}

/* loop: prose, then one sentence repeated 40 times (more than enough). */
static void make_loop(text *t, pieces *p, size_t total) {
  static const char *loops[] = {
      "I will now run the tests again to verify the fix. ",
      "Let me check the file again. ",
      "I apologize for the confusion, let me try a different approach. ",
      "Done. "};
  while (t->len < total) {
    size_t start = t->len;
    while (t->len - start < 300)
      sentence(t);
    const char *l = loops[rng() % 4];
    for (int i = 0; i < 40; i++)
      puts_(t, l);
    deltas(p, start, t->len, 8, true);
  }
  finish(p, t->len);
}

/* code: prose, a fenced block of 40 lines, prose, another block. */
static void make_code(text *t, pieces *p, size_t total) {
  while (t->len < total) {
    bool reply = true;
    for (int block = 0; block < 2; block++) {
      size_t s = t->len;
      sentence(t);
      sentence(t);
      puts_(t, "Here is the code:\n");
      deltas(p, s, t->len, 8, reply);
      reply = false;
      s = t->len;
      puts_(t, "```c\n");
      cut(p, s, false);
      for (int i = 0; i < 40; i++) {
        char line[128];
        snprintf(line, sizeof(line),
                 "    if (buf[%d] == '\\n') { lines++; total += len; }\n",
                 i % 7);
        s = t->len;
        puts_(t, line);
        deltas(p, s, t->len, 8, false);
      }
      s = t->len;
      puts_(t, "```\n");
      cut(p, s, false);
    }
  }
  finish(p, t->len);
}

/* lists: replies of a sentence and 20 list items ("- ", "1. ") of a
 * sentence each: a reset at almost every line. */
static void make_lists(text *t, pieces *p, size_t total) {
  while (t->len < total) {
    size_t start = t->len;
    sentence(t);
    puts_(t, "\n");
    for (int i = 0; i < 20; i++) {
      char marker[16];
      snprintf(marker, sizeof(marker), i % 2 ? "- " : "%d. ", i + 1);
      puts_(t, marker);
      sentence(t);
      puts_(t, "\n");
    }
    deltas(p, start, t->len, 8, true);
  }
  finish(p, t->len);
}

typedef struct run {
  double ns;
  long loops;
} run;

static run stream(ag_content_loop *d, const text *t, const pieces *p) {
  long loops = 0;
  double t0 = now_ns();
  for (size_t i = 0; i < p->n; i++) {
    if (p->reply[i])
      ag_content_loop_reset(d);
    if (ag_content_loop_found(d))
      continue; /* stopped: the rest of this reply is never fed */
    if (ag_content_loop_feed(d, t->p + p->off[i], p->off[i + 1] - p->off[i]))
      loops++;
  }
  double t1 = now_ns();
  return (run){t1 - t0, loops};
}

/* Bytes actually fed (a tripped reply is not fed further). */
static size_t fed_bytes(ag_content_loop *d, const text *t, const pieces *p) {
  size_t n = 0;
  for (size_t i = 0; i < p->n; i++) {
    if (p->reply[i])
      ag_content_loop_reset(d);
    if (ag_content_loop_found(d))
      continue;
    ag_content_loop_feed(d, t->p + p->off[i], p->off[i + 1] - p->off[i]);
    n += p->off[i + 1] - p->off[i];
  }
  return n;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof(*v), cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void report(const char *name, const char *what, double ns_per_byte,
                   size_t bytes, size_t n_pieces, long loops) {
  printf("%-12s %-46s %7.2f ns/byte  (%zu bytes, %zu pieces, %ld loops)\n",
         name, what, ns_per_byte, bytes, n_pieces, loops);
  printf("content_ns_per_byte stream=%s value=%.2f\n", name, ns_per_byte);
}

int main(int argc, char **argv) {
  int rounds = 15;
  bool quick =
      getenv("AG_BENCH_QUICK") && strcmp(getenv("AG_BENCH_QUICK"), "1") == 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--quick") == 0)
      quick = true;
    else if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc)
      rounds = atoi(argv[++i]);
    else
      die("unknown argument %s (use --rounds N, --quick)", argv[i]);
  }
  if (quick)
    rounds = 3;
  if (rounds < 1)
    die("--rounds must be at least 1");
  size_t total = quick ? 256 * 1024 : 4 * 1024 * 1024;

  ag_content_loop *d = NULL;
  ag_error_t err;
  if (ag_content_loop_new(&d, NULL, &err) != AG_OK)
    die("ag_content_loop_new: %s", err.msg);

  text prose = {0}, loop = {0}, code = {0}, lists = {0};
  pieces prose8 = {0}, prose64 = {0}, loopp = {0}, codep = {0}, listp = {0};
  make_prose(&prose, total);
  prose_pieces(&prose, &prose8, 8);
  prose_pieces(&prose, &prose64, 64);
  make_loop(&loop, &loopp, total / 4);
  make_code(&code, &codep, total);
  make_lists(&lists, &listp, total);

  struct {
    const char *name, *what;
    const text *t;
    const pieces *p;
  } cases[] = {
      {"prose", "prose, deltas of 1-8 bytes", &prose, &prose8},
      {"prose64", "prose, deltas of 64 bytes", &prose, &prose64},
      {"loop", "prose then a repeated sentence, deltas 1-8", &loop, &loopp},
      {"code", "prose and fenced code blocks, deltas 1-8", &code, &codep},
      {"lists", "list items, deltas 1-8", &lists, &listp},
  };
  double *v = malloc((size_t)rounds * sizeof(*v));
  if (v == NULL)
    die("out of memory");
  ag_content_loop_opts o;
  ag_content_loop_opts_init(&o);
  printf("content-loop detector (defaults: chunk %zu, threshold %zu, history "
         "%zu); median of %d rounds\n",
         o.chunk_size, o.threshold, o.max_history, rounds);
  for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
    size_t bytes = fed_bytes(d, cases[c].t, cases[c].p);
    long loops = 0;
    stream(d, cases[c].t, cases[c].p); /* warm-up */
    for (int r = 0; r < rounds; r++) {
      run x = stream(d, cases[c].t, cases[c].p);
      v[r] = x.ns / (double)bytes;
      loops = x.loops;
    }
    bool is_loop = strcmp(cases[c].name, "loop") == 0;
    size_t replies = 0;
    for (size_t i = 0; i < cases[c].p->n; i++)
      replies += cases[c].p->reply[i];
    if (!is_loop && loops != 0)
      die("%s: %ld loops found in a stream without loops", cases[c].name,
          loops);
    if (is_loop && (size_t)loops != replies)
      die("loop: %ld loops found in %zu looping replies", loops, replies);
    report(cases[c].name, cases[c].what, median(v, rounds), bytes,
           cases[c].p->n, loops);
  }
  /* check_text over the prose replies. */
  {
    size_t bytes = prose.len;
    for (int r = 0; r < rounds; r++) {
      double t0 = now_ns();
      size_t start = 0;
      for (size_t i = 0; i < prose8.n; i++) {
        if (prose8.reply[i] && prose8.off[i] > start) {
          if (ag_content_loop_check_text(d, prose.p + start,
                                         prose8.off[i] - start))
            die("check_text: a loop in the prose");
          start = prose8.off[i];
        }
      }
      if (ag_content_loop_check_text(d, prose.p + start, prose.len - start))
        die("check_text: a loop in the prose");
      v[r] = (now_ns() - t0) / (double)bytes;
    }
    report("check_text", "prose replies, whole (line by line)",
           median(v, rounds), bytes, (size_t)0, 0L);
  }
  printf("target: under 50 ns per streamed byte (figures only)\n");
  free(v);
  free(prose.p);
  free(loop.p);
  free(code.p);
  free(prose8.off);
  free(prose8.reply);
  free(prose64.off);
  free(prose64.reply);
  free(loopp.off);
  free(loopp.reply);
  free(codep.off);
  free(codep.reply);
  free(lists.p);
  free(listp.off);
  free(listp.reply);
  ag_content_loop_free(d);
  return 0;
}
