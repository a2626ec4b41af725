/*
 * bench/bench_guard.c - the cost of one guard check per tool call.
 *
 * What it measures, on four deterministic streams of realistic tool calls:
 * arguments of ~64 bytes ("64"), of ~1 KiB ("1k": nested objects, code-like
 * text, a quarter with non-ASCII text), the same shapes in ASCII only
 * ("ascii"), and ~1 KiB of token-dense structured data ("dense": arrays of
 * objects full of numbers, as in a tool that inserts rows or plots series):
 *   guard        ag_guard_begin_iteration + ag_guard_check_calls (a batch of
 *                one) + ag_guard_record_results (one ok result): everything
 *                the guard does for one call, signature and every detector of
 *                the default preset included. This is the main figure, the
 *                counterpart of one LoopDetectionService.addAndCheck() of
 *                Gemini CLI (bench/gemini/bench.mjs).
 *   guard_check  the same without ag_guard_record_results.
 *   sha256       SHA-256 alone over  name ":" canonical-arguments  through
 *                ag__sha256 (src/core/sha256.c), the very code the guard
 *                hashes with, the canonical bytes computed up front with
 *                ag_canonicalize: the floor any signature-based check pays.
 * and the process heap in use (mallinfo2 uordblks + hblkhd) and RSS after
 * 1,000 and after 1,000,000 checks on one guard. --only LABEL times one
 * stream (to profile it with perf).
 *
 * Method: each stream is generated once from a fixed seed, so every run and
 * the Node side (which reads it from --write-stream FILE) see the same calls.
 * bench/run.sh runs this program and the Node side in turn, several times
 * (--no-memory), so that a slow spell of the machine hits both, and reports
 * the median and range over those runs; the memory figures come from one
 * run of their own (--memory-only).
 * One pass = the whole stream, with a fresh turn at its start. After warm-up
 * passes, each round times one pass of every variant back to back (so noise
 * from other processes hits them alike), and the median over rounds is
 * reported. The config is the default preset with max_iterations,
 * max_turn_duration and max_calls_per_turn set to 0, so the long stream does
 * not end the turn; when a detector does stop the turn (the stream contains a
 * few stuck episodes on purpose) the turn is begun again and counted.
 *
 * Output: a human-readable report, plus machine-readable lines
 *   <metric> size=<64|1k> value=<number>
 * that bench/run.sh collects. Never fails on speed; exits non-zero when the
 * guard misbehaves (rejects valid arguments, signature mismatch, a stop where
 * none is possible).
 */
#include <errno.h>
#include <malloc.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <openssl/evp.h>

#include "agentguard.h"
#include "core/internal.h" /* ag__sha256: the guard's own SHA-256 path */

/* ------------------------------------------------------------------------ */
/* Small helpers                                                            */
/* ------------------------------------------------------------------------ */

static void die(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("bench_guard: error: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  exit(1);
}

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p)
    die("out of memory");
  return p;
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* splitmix64: small, fast, and the same sequence on every platform. */
static uint64_t rng_state;

static uint64_t rng_next(void) {
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15u);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
  return z ^ (z >> 31);
}

static unsigned rng_below(unsigned n) {
  return (unsigned)(rng_next() % n);
}

static double rng_unit(void) {
  return (double)(rng_next() >> 11) / 9007199254740992.0;
}

#define PICK(arr) (arr)[rng_below(sizeof(arr) / sizeof((arr)[0]))]

/* A growable string. */
typedef struct sbuf {
  char *p;
  size_t len, cap;
} sbuf;

static void sb_reserve(sbuf *s, size_t extra) {
  if (s->len + extra + 1 <= s->cap)
    return;
  size_t cap = s->cap ? s->cap : 256;
  while (cap < s->len + extra + 1)
    cap *= 2;
  char *p = realloc(s->p, cap);
  if (!p)
    die("out of memory");
  s->p = p;
  s->cap = cap;
}

static void sb_putn(sbuf *s, const char *text, size_t n) {
  sb_reserve(s, n);
  memcpy(s->p + s->len, text, n);
  s->len += n;
  s->p[s->len] = '\0';
}

static void sb_puts(sbuf *s, const char *text) {
  sb_putn(s, text, strlen(text));
}

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static void
sb_printf(sbuf *s, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char tmp[512];
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (n < 0 || (size_t)n >= sizeof tmp)
    die("sb_printf overflow");
  sb_putn(s, tmp, (size_t)n);
}

/* ------------------------------------------------------------------------ */
/* The call stream                                                          */
/* ------------------------------------------------------------------------ */

typedef struct call {
  const char *name;
  char *args; /* JSON text as the model sent it */
  size_t args_len;
  char *canon; /* RFC 8785 form, from ag_canonicalize */
  size_t canon_len;
} call;

typedef struct stream {
  const char *label; /* "64", "1k", "ascii" or "dense" */
  call *calls;
  size_t n;
  size_t args_bytes, canon_bytes;
  int episodes; /* stuck episodes planted (each should stop the turn once) */
} stream;

/* Per-call JSON style: models differ; some emit ", " and ": " separators,
 * some escape every non-ASCII character as \uXXXX (Python's ensure_ascii). */
typedef struct style {
  int spaced;
  int ascii;
} style;

/* Decodes one UTF-8 sequence (input is our own valid UTF-8). */
static unsigned utf8_decode(const unsigned char *p, int *len) {
  if (p[0] < 0x80) {
    *len = 1;
    return p[0];
  }
  if ((p[0] & 0xe0) == 0xc0) {
    *len = 2;
    return ((p[0] & 0x1fu) << 6) | (p[1] & 0x3fu);
  }
  if ((p[0] & 0xf0) == 0xe0) {
    *len = 3;
    return ((p[0] & 0x0fu) << 12) | ((p[1] & 0x3fu) << 6) | (p[2] & 0x3fu);
  }
  *len = 4;
  return ((p[0] & 0x07u) << 18) | ((p[1] & 0x3fu) << 12) |
         ((p[2] & 0x3fu) << 6) | (p[3] & 0x3fu);
}

/* Appends `text` JSON-escaped (without quotes) to `s`. */
static void sb_escape(sbuf *s, const char *text, const style *st) {
  const unsigned char *p = (const unsigned char *)text;
  while (*p) {
    unsigned char c = *p;
    if (c == '"') {
      sb_puts(s, "\\\"");
    } else if (c == '\\') {
      sb_puts(s, "\\\\");
    } else if (c == '\n') {
      sb_puts(s, "\\n");
    } else if (c == '\t') {
      sb_puts(s, "\\t");
    } else if (c < 0x20) {
      sb_printf(s, "\\u%04x", c);
    } else if (c >= 0x80 && st->ascii) {
      int len;
      unsigned cp = utf8_decode(p, &len);
      if (cp >= 0x10000) {
        cp -= 0x10000;
        sb_printf(s, "\\u%04x\\u%04x", 0xd800 + (cp >> 10),
                  0xdc00 + (cp & 0x3ff));
      } else {
        sb_printf(s, "\\u%04x", cp);
      }
      p += len;
      continue;
    } else {
      sb_putn(s, (const char *)p, 1);
    }
    p++;
  }
}

static size_t escaped_len(const char *text, const style *st) {
  sbuf t = {0};
  sb_escape(&t, text, st);
  size_t n = t.len;
  free(t.p);
  return n;
}

/* Vocabulary. */
static const char *const k_dirs[] = {
    "src",   "src/core", "src/exec", "include", "tests/unit", "docs",
    "lib",   "app",      "pkg/api",  "scripts", "internal",   "cmd/server",
    "utils", "web/ui",   "config",   "build"};
static const char *const k_words[] = {
    "guard",  "parser", "config", "session", "token",  "retry",   "buffer",
    "client", "server", "cache",  "index",   "schema", "handler", "queue",
    "worker", "report", "user",   "order",   "event",  "stream",  "limit",
    "error",  "state",  "model",  "loop",    "result", "batch",   "update"};
static const char *const k_exts[] = {".c",  ".h",    ".py", ".ts",
                                     ".go", ".json", ".md", ".rs"};
static const char *const k_cmds[] = {
    "make -j2",      "git status",      "git diff --stat", "npm test --",
    "pytest -x -q",  "cargo build",     "ls -la",          "grep -rn",
    "go test ./...", "cmake --build .", "python3 -m",      "cat"};
static const char *const k_unicode[] = {"café",  "naïve",  "日本語", "→",
                                        "✓",     "Größe",  "😀",      "€",
                                        "ñandú", "Привет", "µs",     "—"};
static const char *const k_code[] = {
    "int",   "return", "if (",   ") {",  "}",    "for (",   "static",
    "const", "char *", "size_t", "NULL", "0;",   "= ",      "+= 1;",
    "while", "break;", "->",     "&&",   "||",   "printf(", "\"%s\"",
    "def",   "self.",  "import", "from", "True", "None",    "async",
    "await", "fn",     "let",    "mut",  "pub",  "impl",    "match",
    "=>",    "//",     "#",      "/* ",  " */",  "'x'",     "\"ok\"",
    "0x1f",  "42",     "3.14",   "[]",   "{}",   "C:\\tmp", "\\n"};

typedef enum { FILL_PATH, FILL_CMD, FILL_QUERY, FILL_TEXT } fill_kind;

/*
 * Whether the call being generated may contain non-ASCII text. A quarter of
 * calls do: most agent traffic is ASCII source and commands, some is prose
 * or identifiers in other scripts. The share matters: V8 stores strings with
 * non-ASCII characters two bytes per character, and JSON.stringify (inside
 * Gemini's detector) is about twice as slow on them.
 */
static int g_unicode;

/* Set while the "ascii" stream is generated: no call gets non-ASCII text. */
static int g_ascii_only;

/* One token of filler text of the given kind. */
static void fill_token(sbuf *t, fill_kind kind, int first) {
  switch (kind) {
  case FILL_PATH:
    if (first)
      sb_puts(t, PICK(k_dirs));
    else if (rng_below(3) == 0)
      sb_printf(t, "/%s%s", PICK(k_words), PICK(k_exts));
    else
      sb_printf(t, "/%s_%u", PICK(k_words), rng_below(100));
    break;
  case FILL_CMD:
    if (first)
      sb_puts(t, PICK(k_cmds));
    else {
      unsigned r = rng_below(10);
      if (r == 0)
        sb_puts(t, " | head -n 50");
      else if (r == 1)
        sb_puts(t, " && ");
      else if (r == 2)
        sb_printf(t, " \"%s %s\"", PICK(k_words), PICK(k_words));
      else if (r == 3)
        sb_printf(t, " --%s=%u", PICK(k_words), rng_below(1000));
      else if (r == 4)
        sb_puts(t, " 2>&1");
      else
        sb_printf(t, " %s/%s", PICK(k_dirs), PICK(k_words));
    }
    break;
  case FILL_QUERY:
    if (!first)
      sb_puts(t, " ");
    if (g_unicode && rng_below(6) == 0)
      sb_puts(t, PICK(k_unicode));
    else
      sb_puts(t, PICK(k_words));
    break;
  case FILL_TEXT: {
    unsigned r = rng_below(20);
    if (r < 3)
      sb_puts(t, "\n");
    else if (r == 3)
      sb_puts(t, "\n    ");
    else if (r == 4 && g_unicode)
      sb_printf(t, " %s", PICK(k_unicode));
    else if (r == 5)
      sb_puts(t, "\t");
    else if (r < 12)
      sb_printf(t, " %s", PICK(k_code));
    else
      sb_printf(t, " %s", PICK(k_words));
    break;
  }
  }
}

/*
 * Appends a JSON string (quotes included) of filler text of `kind` whose
 * escaped form is exactly `budget` bytes (at least 1).
 */
static void put_fill(sbuf *s, fill_kind kind, size_t budget, const style *st) {
  sbuf text = {0};
  size_t used = 0;
  sb_putn(&text, "", 0);
  for (int first = 1;; first = 0) {
    sbuf tok = {0};
    fill_token(&tok, kind, first);
    size_t n = escaped_len(tok.p, st);
    if (used + n > budget) {
      free(tok.p);
      break;
    }
    sb_putn(&text, tok.p, tok.len);
    used += n;
    free(tok.p);
  }
  static const char pad[] = "abcdefghijklmnopqrstuvwxyz";
  while (used < budget) {
    sb_putn(&text, &pad[rng_below(26)], 1);
    used++;
  }
  sb_puts(s, "\"");
  sb_escape(s, text.p, st);
  sb_puts(s, "\"");
  free(text.p);
}

static void key(sbuf *s, const style *st, int first, const char *name) {
  if (!first)
    sb_puts(s, st->spaced ? ", " : ",");
  sb_printf(s, "\"%s\"%s", name, st->spaced ? ": " : ":");
}

/* A string value built from words (not filler). */
static void put_word_str(sbuf *s, const style *st, const char *text) {
  sb_puts(s, "\"");
  sb_escape(s, text, st);
  sb_puts(s, "\"");
}

/*
 * Builds one call's arguments: `pre` + filler string + `post`, with the
 * filler sized so the whole text is `target` bytes (or a little more when
 * the fixed part alone is longer).
 */
static char *assemble(const sbuf *pre, const sbuf *post, fill_kind kind,
                      size_t target, const style *st, size_t *len) {
  size_t fixed = pre->len + post->len + 2;
  size_t budget = target > fixed + 4 ? target - fixed : 4;
  sbuf s = {0};
  sb_putn(&s, pre->p, pre->len);
  put_fill(&s, kind, budget, st);
  sb_putn(&s, post->p, post->len);
  *len = s.len;
  return s.p;
}

static const char *const k_tools64[] = {"read_file", "list_dir", "run_shell",
                                        "search",    "grep",     "write_file",
                                        "web_fetch", "edit_file"};

/* A fresh ~64-byte call. */
static call gen_call64(void) {
  style st = {rng_below(4) == 0, rng_below(5) == 0};
  g_unicode = rng_below(4) == 0;
  size_t target = 48 + rng_below(33); /* 48..80, mean 64 */
  sbuf pre = {0}, post = {0};
  call c = {0};
  fill_kind kind = FILL_PATH;
  c.name = PICK(k_tools64);
  sb_puts(&pre, "{");
  if (!strcmp(c.name, "read_file")) {
    key(&pre, &st, 1, "path");
    key(&post, &st, 0, "offset");
    sb_printf(&post, "%u", rng_below(50) * 100);
    key(&post, &st, 0, "limit");
    sb_puts(&post, "200");
  } else if (!strcmp(c.name, "list_dir")) {
    key(&pre, &st, 1, "path");
    key(&post, &st, 0, "depth");
    sb_printf(&post, "%u", 1 + rng_below(3));
  } else if (!strcmp(c.name, "run_shell")) {
    kind = FILL_CMD;
    key(&pre, &st, 1, "command");
    key(&post, &st, 0, "timeout_ms");
    sb_puts(&post, rng_below(4) ? "30000" : "3e4");
  } else if (!strcmp(c.name, "search")) {
    kind = FILL_QUERY;
    key(&pre, &st, 1, "query");
    key(&post, &st, 0, "max_results");
    sb_puts(&post, "20");
  } else if (!strcmp(c.name, "grep")) {
    kind = FILL_QUERY;
    key(&pre, &st, 1, "pattern");
    key(&post, &st, 0, "ignore_case");
    sb_puts(&post, rng_below(2) ? "true" : "false");
  } else if (!strcmp(c.name, "write_file")) {
    kind = FILL_TEXT;
    key(&pre, &st, 1, "path");
    put_word_str(&pre, &st, PICK(k_words));
    key(&pre, &st, 0, "content");
  } else if (!strcmp(c.name, "web_fetch")) {
    key(&pre, &st, 1, "url");
    sb_puts(&pre, "\"https://example.com/");
    /* the path filler continues the URL inside one string */
    sbuf tail = {0};
    put_fill(&tail, FILL_PATH, target > 40 ? target - 40 : 8, &st);
    sb_putn(&pre, tail.p + 1, tail.len - 1); /* drop its opening quote */
    free(tail.p);
    sb_puts(&pre, "}");
    c.args = pre.p;
    c.args_len = pre.len;
    free(post.p);
    return c;
  } else { /* edit_file */
    kind = FILL_QUERY;
    key(&pre, &st, 1, "path");
    put_word_str(&pre, &st, "main.c");
    key(&pre, &st, 0, "old");
    put_word_str(&pre, &st, PICK(k_words));
    key(&pre, &st, 0, "new");
  }
  sb_puts(&post, "}");
  c.args = assemble(&pre, &post, kind, target, &st, &c.args_len);
  free(pre.p);
  free(post.p);
  return c;
}

static const char *const k_tools1k[] = {"write_file", "edit_file", "run_shell",
                                        "search", "web_fetch"};

/* A fresh ~1 KiB call: nested objects, arrays, numbers, multi-line text. */
static call gen_call1k(void) {
  style st = {rng_below(4) == 0, rng_below(5) == 0};
  g_unicode = rng_below(4) == 0 && !g_ascii_only;
  size_t target = 896 + rng_below(257); /* 896..1152, mean 1024 */
  sbuf pre = {0}, post = {0}, path = {0};
  call c = {0};
  c.name = PICK(k_tools1k);
  put_fill(&path, FILL_PATH, 14 + rng_below(20), &st);
  sb_puts(&pre, "{");
  if (!strcmp(c.name, "write_file")) {
    key(&pre, &st, 1, "path");
    sb_putn(&pre, path.p, path.len);
    key(&pre, &st, 0, "content");
    key(&post, &st, 0, "create_dirs");
    sb_puts(&post, "true");
    key(&post, &st, 0, "mode");
    sb_puts(&post, "420");
  } else if (!strcmp(c.name, "edit_file")) {
    key(&pre, &st, 1, "path");
    sb_putn(&pre, path.p, path.len);
    key(&pre, &st, 0, "edits");
    sb_puts(&pre, "[{");
    key(&pre, &st, 1, "old_text");
    put_fill(&pre, FILL_TEXT, 120 + rng_below(120), &st);
    key(&pre, &st, 0, "new_text");
    put_fill(&pre, FILL_TEXT, 120 + rng_below(120), &st);
    key(&pre, &st, 0, "line");
    sb_printf(&pre, "%u", 1 + rng_below(900));
    sb_puts(&pre, "}, {");
    key(&pre, &st, 1, "old_text");
    put_fill(&pre, FILL_TEXT, 60 + rng_below(60), &st);
    key(&pre, &st, 0, "new_text");
    sb_puts(&post, "}]");
    key(&post, &st, 0, "dry_run");
    sb_puts(&post, "false");
  } else if (!strcmp(c.name, "run_shell")) {
    key(&pre, &st, 1, "command");
    put_fill(&pre, FILL_CMD, 200 + rng_below(200), &st);
    key(&pre, &st, 0, "cwd");
    sb_putn(&pre, path.p, path.len);
    key(&pre, &st, 0, "env");
    sb_puts(&pre, "{");
    key(&pre, &st, 1, "CC");
    put_word_str(&pre, &st, "gcc");
    key(&pre, &st, 0, "CFLAGS");
    put_word_str(&pre, &st, "-O2 -g -Wall");
    key(&pre, &st, 0, "LANG");
    put_word_str(&pre, &st, "C.UTF-8");
    sb_puts(&pre, "}");
    key(&pre, &st, 0, "stdin");
    key(&post, &st, 0, "timeout_ms");
    sb_puts(&post, rng_below(3) ? "120000" : "1.2e5");
  } else if (!strcmp(c.name, "search")) {
    key(&pre, &st, 1, "query");
    put_fill(&pre, FILL_QUERY, 30 + rng_below(40), &st);
    key(&pre, &st, 0, "paths");
    sb_puts(&pre, "[");
    for (unsigned i = 0, n = 2 + rng_below(4); i < n; i++) {
      if (i)
        sb_puts(&pre, st.spaced ? ", " : ",");
      put_word_str(&pre, &st, PICK(k_dirs));
    }
    sb_puts(&pre, "]");
    key(&pre, &st, 0, "options");
    sb_puts(&pre, "{");
    key(&pre, &st, 1, "case_sensitive");
    sb_puts(&pre, "false");
    key(&pre, &st, 0, "max_results");
    sb_printf(&pre, "%u", 10 + rng_below(90));
    key(&pre, &st, 0, "context_lines");
    sb_puts(&pre, "3");
    key(&pre, &st, 0, "score_threshold");
    sb_puts(&pre, rng_below(2) ? "0.75" : "7.5e-1");
    key(&pre, &st, 0, "exclude");
    sb_puts(&pre, "[\"node_modules\", \"*.min.js\", \"build/**\"]");
    sb_puts(&pre, "}");
    key(&pre, &st, 0, "reason");
  } else { /* web_fetch */
    key(&pre, &st, 1, "url");
    sb_puts(&pre, "\"https://docs.example.org/api/v2/");
    sb_putn(&pre, path.p + 1, path.len - 1);
    key(&pre, &st, 0, "headers");
    sb_puts(&pre, "{");
    key(&pre, &st, 1, "Accept");
    put_word_str(&pre, &st, "text/html, application/json;q=0.9");
    key(&pre, &st, 0, "User-Agent");
    put_word_str(&pre, &st, "agent/1.0 (+https://example.org/bot)");
    sb_puts(&pre, "}");
    key(&pre, &st, 0, "max_bytes");
    sb_puts(&pre, "65536");
    key(&pre, &st, 0, "prompt");
  }
  sb_puts(&post, "}");
  c.args = assemble(&pre, &post, FILL_TEXT, target, &st, &c.args_len);
  free(pre.p);
  free(post.p);
  free(path.p);
  return c;
}

/* A ~1 KiB call of the "1k" shapes with ASCII text only. */
static call gen_call_ascii(void) {
  g_ascii_only = 1;
  call c = gen_call1k();
  g_ascii_only = 0;
  return c;
}

/* One JSON number in one of the ways models write them: integers, ids and
 * timestamps, negative and decimal values, and now and then an exponent
 * (which JCS rewrites: 1.5e3 is 1500, 2.5E-4 is 0.00025). */
static void put_number(sbuf *s) {
  switch (rng_below(10)) {
  case 0:
  case 1:
    sb_printf(s, "%u", rng_below(1000));
    break;
  case 2:
    sb_printf(s, "%u", 1700000000u + rng_below(100000000));
    break;
  case 3:
    sb_printf(s, "-%u.%u", rng_below(100), rng_below(1000));
    break;
  case 4:
    sb_printf(s, "%u.%02u", rng_below(10000), rng_below(100));
    break;
  case 5:
    sb_printf(s, "0.%03u", 1 + rng_below(999));
    break;
  case 6:
    sb_printf(s, "%u.%ue%u", 1 + rng_below(9), rng_below(10), rng_below(6));
    break;
  case 7:
    sb_printf(s, "%u.%uE-%u", 1 + rng_below(9), rng_below(10),
              1 + rng_below(5));
    break;
  default:
    sb_printf(s, "%u.%u", rng_below(100), 1 + rng_below(9));
    break;
  }
}

static const char *const k_tools_dense[] = {"insert_rows", "plot_series",
                                            "update_records", "write_table"};
static const char *const k_fields[] = {"id",  "ts",    "value", "min",
                                       "max", "count", "x",     "y",
                                       "lat", "lon",   "score", "weight"};

/*
 * A ~1 KiB call of token-dense structured data: an array of small objects of
 * numbers (with a short string, a boolean and a nested array of numbers),
 * about one JSON token every 4-5 bytes, where "1k" has long strings.
 */
static call gen_call_dense(void) {
  style st = {rng_below(4) == 0, 0};
  size_t target = 896 + rng_below(257); /* 896..1152, mean 1024 */
  call c = {0};
  sbuf s = {0};
  c.name = PICK(k_tools_dense);
  sb_puts(&s, "{");
  key(&s, &st, 1, "table");
  put_word_str(&s, &st, PICK(k_words));
  key(&s, &st, 0, "rows");
  sb_puts(&s, "[");
  unsigned nf = 3 + rng_below(4); /* fields per row */
  for (int row = 0; s.len + 80 < target; row++) {
    if (row)
      sb_puts(&s, st.spaced ? ", " : ",");
    sb_puts(&s, "{");
    for (unsigned f = 0; f < nf; f++) {
      key(&s, &st, f == 0, k_fields[(f * 5 + (unsigned)row) % 12]);
      put_number(&s);
    }
    if (rng_below(3) == 0) {
      key(&s, &st, 0, "ok");
      sb_puts(&s, rng_below(2) ? "true" : "false");
    }
    if (rng_below(3) == 0) {
      key(&s, &st, 0, "label");
      put_word_str(&s, &st, PICK(k_words));
    }
    if (rng_below(4) == 0) {
      key(&s, &st, 0, "series");
      sb_puts(&s, "[");
      for (unsigned k = 0, n = 2 + rng_below(4); k < n; k++) {
        if (k)
          sb_puts(&s, st.spaced ? ", " : ",");
        put_number(&s);
      }
      sb_puts(&s, "]");
    }
    sb_puts(&s, "}");
  }
  sb_puts(&s, "]");
  key(&s, &st, 0, "upsert");
  sb_puts(&s, rng_below(2) ? "true" : "false");
  sb_puts(&s, "}");
  c.args = s.p;
  c.args_len = s.len;
  return c;
}

static call call_copy(const call *c) {
  call d = *c;
  d.args = xmalloc(c->args_len + 1);
  memcpy(d.args, c->args, c->args_len + 1);
  return d;
}

/*
 * The mix an agent produces: mostly distinct calls; some repeat a recent call
 * or the previous one (re-reading a file, re-running a test); and, rarely, a
 * stuck episode that every loop detector should catch once: the same call 6
 * times in a row (trips at the 5th), or two calls alternating 6 times (trips
 * at the 10th call, the 5th repetition of the block). Now and then the random
 * repeats line up into a real loop as well; both sides see it alike.
 */
static void build_stream(stream *s, const char *label, size_t n,
                         call (*gen)(void), uint64_t seed) {
  rng_state = seed;
  s->label = label;
  s->calls = xmalloc(n * sizeof *s->calls);
  s->n = 0;
  s->episodes = 0;
  while (s->n < n) {
    double r = rng_unit();
    call *out = s->calls;
    size_t i = s->n;
    if (r < 0.004 && i + 6 <= n) {
      call a = gen();
      out[i] = a;
      for (int k = 1; k < 6; k++)
        out[i + k] = call_copy(&a);
      s->n += 6;
      s->episodes++;
    } else if (r < 0.006 && i + 12 <= n) {
      call a = gen(), b = gen();
      out[i] = a;
      out[i + 1] = b;
      for (int k = 2; k < 12; k++)
        out[i + k] = call_copy(k % 2 ? &b : &a);
      s->n += 12;
      s->episodes++;
    } else if (r < 0.10 && i >= 16) {
      out[i] = call_copy(&out[i - 2 - rng_below(14)]);
      s->n++;
    } else if (r < 0.14 && i >= 1) {
      out[i] = call_copy(&out[i - 1]);
      s->n++;
    } else {
      out[i] = gen();
      s->n++;
    }
  }
  s->args_bytes = s->canon_bytes = 0;
  for (size_t i = 0; i < s->n; i++) {
    call *c = &s->calls[i];
    ag_error_t err;
    ag_err_t rc =
        ag_canonicalize(c->args, c->args_len, &c->canon, &c->canon_len, &err);
    if (rc != AG_OK)
      die("ag_canonicalize rejected valid arguments (%s at byte %ld: %s): "
          "%s %s",
          ag_err_name(rc), err.pos, err.msg, c->name, c->args);
    s->args_bytes += c->args_len;
    s->canon_bytes += c->canon_len;
  }
}

static void free_stream(stream *s) {
  for (size_t i = 0; i < s->n; i++) {
    free(s->calls[i].args);
    ag_free(s->calls[i].canon);
  }
  free(s->calls);
}

static void write_stream(FILE *f, const stream *s) {
  for (size_t i = 0; i < s->n; i++)
    fprintf(f, "{\"set\":\"%s\",\"name\":\"%s\",\"args\":%s}\n", s->label,
            s->calls[i].name, s->calls[i].args);
}

/* ------------------------------------------------------------------------ */
/* Measured operations                                                      */
/* ------------------------------------------------------------------------ */

typedef struct runner {
  ag_guard *g;
  int64_t now; /* fake clock: 1 ms per call */
  long stops;  /* turns stopped (and begun again) */
  long nudges;
  long invalid;
  ag_verdict v;
  ag_call_check check;
} runner;

static void runner_init(runner *r) {
  ag_config cfg;
  ag_error_t err;
  ag_config_init(&cfg);
  cfg.loop.max_iterations = 0;
  cfg.loop.max_turn_duration_ms = 0;
  cfg.loop.max_calls_per_turn = 0;
  memset(r, 0, sizeof *r);
  ag_err_t rc = ag_guard_new(&r->g, &cfg, NULL, &err);
  if (rc != AG_OK)
    die("ag_guard_new: %s: %s", ag_err_name(rc), err.msg);
}

/* One call: what the guard does for a tool call the model asked for. */
static inline void guard_one(runner *r, const call *c, int record) {
  ag_call in = {c->name, c->args, c->args_len};
  r->now++;
  if (ag_guard_begin_iteration(r->g, r->now, &r->v) != AG_ALLOW) {
    r->stops++;
    ag_guard_begin_turn(r->g, r->now);
    return;
  }
  if (ag_guard_check_calls(r->g, &in, 1, r->now, &r->check, &r->v) !=
      AG_ALLOW) {
    r->stops++;
    ag_guard_begin_turn(r->g, r->now);
    return;
  }
  if (!r->check.valid) {
    r->invalid++;
    return;
  }
  if (!record)
    return;
  ag_result res = {c->name, r->check.sig, AG_OUTCOME_OK, "ok", 2, AG_CAT_AUTO};
  if (r->check.action == AG_NUDGE) {
    r->nudges++;
    res.outcome = AG_OUTCOME_SKIPPED;
  }
  if (ag_guard_record_results(r->g, &res, 1, r->now, &r->v) != AG_ALLOW) {
    r->stops++;
    ag_guard_begin_turn(r->g, r->now);
  }
}

/* One pass over the stream in a fresh turn; returns elapsed ns. */
static uint64_t guard_pass(runner *r, const stream *s, int record) {
  uint64_t t0 = now_ns();
  ag_guard_begin_turn(r->g, r->now);
  for (size_t i = 0; i < s->n; i++)
    guard_one(r, &s->calls[i], record);
  return now_ns() - t0;
}

static volatile unsigned char g_sink;

/*
 * The SHA-256 method, fetched once, for the signature cross-check below: an
 * independent implementation (EVP) to check the guard's against. Timing
 * uses ag__sha256 (src/core/sha256.c), the one context the guard hashes
 * through, re-initialised per call as the guard does: the floor is the
 * guard's own SHA-256, not a different one.
 */
static EVP_MD *g_sha256;

static uint64_t sha_pass(ag__sha256 *h, const stream *s) {
  uint8_t md[AG_SIG_LEN];
  unsigned char acc = 0;
  uint64_t t0 = now_ns();
  for (size_t i = 0; i < s->n; i++) {
    const call *c = &s->calls[i];
    ag__sha256_init(h);
    ag__sha256_update(h, c->name, strlen(c->name));
    ag__sha256_update(h, ":", 1);
    ag__sha256_update(h, c->canon, c->canon_len);
    if (!ag__sha256_final(h, md))
      die("SHA-256 failed");
    acc ^= md[0];
  }
  uint64_t dt = now_ns() - t0;
  g_sink ^= acc;
  return dt;
}

/*
 * Checks that the guard's signature for each call is SHA-256 over
 * name ":" canonical bytes, as DESIGN.md section 3 says. Run once, untimed.
 */
static void verify_signatures(const stream *s) {
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  runner r;
  if (!ctx)
    die("EVP_MD_CTX_new failed");
  runner_init(&r);
  for (size_t i = 0; i < s->n; i++) {
    const call *c = &s->calls[i];
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned mdlen = 0;
    ag_call in = {c->name, c->args, c->args_len};
    ag_guard_begin_turn(r.g, 0);
    ag_guard_check_calls(r.g, &in, 1, 0, &r.check, &r.v);
    if (!r.check.valid)
      die("guard rejected valid arguments (%s at byte %ld: %s): %s %s",
          ag_err_name(r.check.invalid_code), r.check.invalid_pos,
          r.check.message, c->name, c->args);
    EVP_DigestInit_ex2(ctx, g_sha256, NULL);
    EVP_DigestUpdate(ctx, c->name, strlen(c->name));
    EVP_DigestUpdate(ctx, ":", 1);
    EVP_DigestUpdate(ctx, c->canon, c->canon_len);
    EVP_DigestFinal_ex(ctx, md, &mdlen);
    if (mdlen != AG_SIG_LEN || memcmp(md, r.check.sig, AG_SIG_LEN) != 0)
      die("guard signature differs from SHA-256(name \":\" "
          "ag_canonicalize(args)) for %s %s",
          c->name, c->args);
  }
  ag_guard_free(r.g);
  EVP_MD_CTX_free(ctx);
}

/* ------------------------------------------------------------------------ */
/* Memory                                                                   */
/* ------------------------------------------------------------------------ */

/* Bytes malloc has handed out: from the heap (uordblks) and as separate
 * mmaps (hblkhd, blocks past the mmap threshold: a guard's scratch is). */
static size_t heap_in_use(void) {
  struct mallinfo2 mi = mallinfo2();
  return mi.uordblks + mi.hblkhd;
}

static long rss_kib(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  long size = 0, resident = 0;
  if (!f)
    return -1;
  if (fscanf(f, "%ld %ld", &size, &resident) != 2)
    resident = -1;
  fclose(f);
  return resident < 0 ? -1 : resident * 4; /* 4 KiB pages on x86-64/arm64 */
}

static void memory_report(const stream *a, const stream *b, long total) {
  /* the probes themselves (fopen, stdio) allocate on first use: prime them
   * so that what they keep is not counted as the guard's */
  (void)rss_kib();
  printf("\nmemory (one guard, whole passes alternating between the two "
         "streams)\n");
  fflush(stdout);
  size_t heap_before = heap_in_use();
  long rss_before = rss_kib();
  runner r;
  runner_init(&r);
  size_t heap_guard = heap_in_use();
  long rss_guard = rss_kib();
  printf("  ag_guard_new: %zu bytes of heap; RSS %ld KiB before, %ld KiB "
         "after\n",
         heap_guard - heap_before, rss_before, rss_guard);
  printf("guard_new_heap_bytes value=%zu\n", heap_guard - heap_before);
  printf("guard_rss_before_new_kib value=%ld\n", rss_before);
  printf("guard_new_rss_kib value=%ld\n", rss_guard);
  ag_guard_begin_turn(r.g, 0);
  long done = 0;
  const long marks[2] = {1000, total};
  for (int m = 0; m < 2; m++) {
    for (; done < marks[m]; done++) {
      /* whole passes, alternating streams, so stuck episodes stay intact */
      size_t pass = (size_t)done / a->n;
      const stream *s = (pass & 1) ? b : a;
      guard_one(&r, &s->calls[(size_t)done % a->n], 1);
    }
    size_t heap = heap_in_use();
    long rss = rss_kib();
    printf("  after %8ld checks: process heap in use %zu bytes (the guard "
           "and all since it: %+ld), RSS %ld KiB\n",
           done, heap, (long)heap - (long)heap_before, rss);
    printf("guard_heap_bytes checks=%ld value=%zu\n", done, heap);
    printf("guard_heap_delta_bytes checks=%ld value=%ld\n", done,
           (long)heap - (long)heap_before);
    printf("guard_rss_kib checks=%ld value=%ld\n", done, rss);
  }
  printf("  turns stopped and begun again: %ld\n", r.stops);
  ag_guard_free(r.g);
}

/* ------------------------------------------------------------------------ */
/* Main                                                                     */
/* ------------------------------------------------------------------------ */

typedef struct figures {
  double guard, check, sha;
} figures;

static figures measure(const stream *s, int warmup, int rounds) {
  runner full, chk;
  ag__sha256 *ctx = NULL;
  if (ag__sha256_new(&ctx) != AG_OK)
    die("ag__sha256_new failed");
  double *tf = xmalloc((size_t)rounds * sizeof *tf);
  double *tc = xmalloc((size_t)rounds * sizeof *tc);
  double *ts = xmalloc((size_t)rounds * sizeof *ts);
  runner_init(&full);
  runner_init(&chk);
  for (int i = 0; i < warmup; i++) {
    guard_pass(&full, s, 1);
    guard_pass(&chk, s, 0);
    sha_pass(ctx, s);
  }
  full.stops = full.nudges = full.invalid = 0;
  for (int i = 0; i < rounds; i++) {
    tf[i] = (double)guard_pass(&full, s, 1) / (double)s->n;
    tc[i] = (double)guard_pass(&chk, s, 0) / (double)s->n;
    ts[i] = (double)sha_pass(ctx, s) / (double)s->n;
  }
  figures f = {median(tf, rounds), median(tc, rounds), median(ts, rounds)};
  double per_pass = (double)full.stops / rounds;
  printf("\nstream %s: %zu calls, arguments %.0f bytes on average "
         "(canonical %.0f)\n",
         s->label, s->n, (double)s->args_bytes / (double)s->n,
         (double)s->canon_bytes / (double)s->n);
  printf("  guard (iteration + check + record): %8.1f ns/call "
         "(min %.1f, max %.1f over %d rounds)\n",
         f.guard, tf[0], tf[rounds - 1], rounds);
  printf("  guard check only (iteration + check): %6.1f ns/call\n", f.check);
  printf("  SHA-256 alone over name:canonical:   %6.1f ns/call\n", f.sha);
  printf("  guard / SHA-256 alone: %.2fx\n", f.guard / f.sha);
  printf("  turns stopped per pass: %.1f (%d stuck episodes planted; "
         "nudges %ld)\n",
         per_pass, s->episodes, full.nudges / rounds);
  printf("guard_ns_per_call size=%s value=%.1f\n", s->label, f.guard);
  printf("guard_check_ns_per_call size=%s value=%.1f\n", s->label, f.check);
  printf("sha256_ns_per_call size=%s value=%.1f\n", s->label, f.sha);
  printf("guard_over_sha256 size=%s value=%.3f\n", s->label, f.guard / f.sha);
  printf("guard_stops_per_pass size=%s value=%.0f\n", s->label, per_pass);
  printf("stream_calls size=%s value=%zu\n", s->label, s->n);
  printf("stream_args_bytes_mean size=%s value=%.1f\n", s->label,
         (double)s->args_bytes / (double)s->n);
  if (full.invalid || chk.invalid)
    die("the guard marked valid arguments invalid during the run");
  if (full.stops % rounds != 0)
    die("%ld stops over %d passes of the same stream: the guard does not "
        "decide the same way on every pass",
        full.stops, rounds);
  ag_guard_free(full.g);
  ag_guard_free(chk.g);
  ag__sha256_free(ctx);
  free(tf);
  free(tc);
  free(ts);
  return f;
}

static void usage(void) {
  fputs("usage: bench_guard [--write-stream FILE] [--stream-only] "
        "[--no-memory | --memory-only] [--calls N] [--rounds N] "
        "[--warmup N] [--mem-checks N] [--quick] [--only 64|1k|ascii|dense]\n",
        stderr);
  exit(2);
}

static long parse_long(const char *s) {
  char *end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || *end || v <= 0)
    usage();
  return v;
}

enum { N_STREAMS = 4 };

int main(int argc, char **argv) {
  const char *stream_file = NULL, *only = NULL;
  int stream_only = 0, no_memory = 0, memory_only = 0;
  long calls = 4096, rounds = 31, warmup = 3, mem_checks = 1000000;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--write-stream") && i + 1 < argc)
      stream_file = argv[++i];
    else if (!strcmp(argv[i], "--stream-only"))
      stream_only = 1;
    else if (!strcmp(argv[i], "--no-memory"))
      no_memory = 1;
    else if (!strcmp(argv[i], "--memory-only"))
      memory_only = 1;
    else if (!strcmp(argv[i], "--calls") && i + 1 < argc)
      calls = parse_long(argv[++i]);
    else if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
      rounds = parse_long(argv[++i]);
    else if (!strcmp(argv[i], "--warmup") && i + 1 < argc)
      warmup = parse_long(argv[++i]);
    else if (!strcmp(argv[i], "--mem-checks") && i + 1 < argc)
      mem_checks = parse_long(argv[++i]);
    else if (!strcmp(argv[i], "--only") && i + 1 < argc)
      only = argv[++i];
    else if (!strcmp(argv[i], "--quick")) {
      calls = 1024;
      rounds = 3;
      warmup = 1;
      mem_checks = 20000;
    } else
      usage();
  }
  if (no_memory && memory_only)
    usage();
  if (only != NULL && strcmp(only, "64") && strcmp(only, "1k") &&
      strcmp(only, "ascii") && strcmp(only, "dense"))
    die("--only: unknown stream '%s' (64, 1k, ascii or dense)", only);
  if (mem_checks < 1000)
    mem_checks = 1000;

  g_sha256 = EVP_MD_fetch(NULL, "SHA256", NULL);
  if (!g_sha256)
    die("EVP_MD_fetch(SHA256) failed");

  /* the seeds of "64" and "1k" are those of earlier versions of this bench,
   * so their streams (and figures) stay comparable */
  stream st[N_STREAMS];
  build_stream(&st[0], "64", (size_t)calls, gen_call64, 0x61677561726430ull);
  build_stream(&st[1], "1k", (size_t)calls, gen_call1k, 0x61677561726431ull);
  build_stream(&st[2], "ascii", (size_t)calls, gen_call_ascii,
               0x61677561726432ull);
  build_stream(&st[3], "dense", (size_t)calls, gen_call_dense,
               0x61677561726433ull);

  if (stream_file) {
    FILE *f = fopen(stream_file, "w");
    if (!f)
      die("cannot write %s: %s", stream_file, strerror(errno));
    for (int k = 0; k < N_STREAMS; k++)
      write_stream(f, &st[k]);
    if (fclose(f) != 0)
      die("cannot write %s: %s", stream_file, strerror(errno));
  }
  if (!stream_only) {
    printf("agentguard %s: guard check per call, default preset "
           "(max_iterations, max_turn_duration, max_calls_per_turn = 0)\n",
           ag_version());
    if (!memory_only) {
      printf("medians of %ld rounds after %ld warm-up passes; "
             "one call = one iteration with a batch of one\n",
             rounds, warmup);
      for (int k = 0; k < N_STREAMS; k++)
        verify_signatures(&st[k]);
      for (int k = 0; k < N_STREAMS; k++)
        if (only == NULL || !strcmp(only, st[k].label))
          measure(&st[k], (int)warmup, (int)rounds);
    }
    if (!no_memory)
      memory_report(&st[0], &st[1], mem_checks);
  }
  for (int k = 0; k < N_STREAMS; k++)
    free_stream(&st[k]);
  EVP_MD_free(g_sha256);
  return 0;
}
