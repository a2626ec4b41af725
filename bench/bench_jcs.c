/*
 * bench/bench_jcs.c - cost of a call signature (RFC 8785 canonicalization
 * streamed into SHA-256, src/core/jcs.c) against SHA-256 alone over the same
 * canonical bytes, for ~64 B and ~1 KiB of realistic tool arguments.
 *
 * The SHA-256 baseline hashes through ag__sha256 (src/core/sha256.c), the
 * same code and the same re-initialised context the signature uses, so
 * "sig/SHA" is the cost of canonicalizing alone.
 *
 * Prints figures; never fails on speed. Each figure is the median of 7
 * runs, with the fastest and slowest run beside it. The variants of one
 * sample take turns within each run (sig, JCS, SHA, sig, JCS, SHA, ...), so
 * a slow spell of the machine hits them alike.
 * Targets (DESIGN.md, section 3): the whole per-call check under ~280 ns at
 * ~64 B, and a signature within 2x of SHA-256 alone at 1 KiB.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/internal.h"

static double now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

typedef struct buf {
  char p[1 << 16];
  size_t len;
} buf;

static int buf_sink(void *user, const char *data, size_t len) {
  buf *b = user;
  if (b->len + len > sizeof(b->p))
    return 1;
  memcpy(b->p + b->len, data, len);
  b->len += len;
  return 0;
}

static int null_sink(void *user, const char *data, size_t len) {
  (void)data;
  *(size_t *)user += len;
  return 0;
}

static volatile uint8_t g_sink; /* keeps results alive */

typedef struct sample {
  const char *label;
  const char *name;
  const char *args;
} sample;

#define RUNS 7

typedef double (*bench_fn)(const sample *, void *, int);

/* One figure: the median of RUNS runs, and the fastest and slowest. */
typedef struct figure {
  double med, lo, hi;
} figure;

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Runs the n variants in turn, RUNS times, and fills out[0..n). */
static void interleaved(int n, const bench_fn *fns, void *const *ctxs,
                        const int *iters, const sample *s, figure *out) {
  double t[8][RUNS];
  for (int r = 0; r < RUNS; r++)
    for (int k = 0; k < n; k++)
      t[k][r] = fns[k](s, ctxs[k], iters[k]);
  for (int k = 0; k < n; k++) {
    qsort(t[k], RUNS, sizeof(double), cmp_double);
    out[k].med = t[k][RUNS / 2];
    out[k].lo = t[k][0];
    out[k].hi = t[k][RUNS - 1];
  }
}

static double run_sig(const sample *s, void *ctx, int iters) {
  ag__jcs *j = ctx;
  uint8_t sig[AG_SIG_LEN];
  size_t nl = strlen(s->name), al = strlen(s->args);
  double t0 = now_ns();
  for (int i = 0; i < iters; i++) {
    if (ag__jcs_signature(j, s->name, nl, s->args, al, sig, NULL) != AG_OK)
      abort();
    g_sink ^= sig[0];
  }
  return (now_ns() - t0) / iters;
}

static double run_canon(const sample *s, void *ctx, int iters) {
  ag__jcs *j = ctx;
  size_t al = strlen(s->args), total = 0;
  double t0 = now_ns();
  for (int i = 0; i < iters; i++)
    if (ag__jcs_write(j, s->args, al, null_sink, &total, NULL) != AG_OK)
      abort();
  g_sink ^= (uint8_t)total;
  return (now_ns() - t0) / iters;
}

typedef struct sha_ctx {
  ag__sha256 *h;    /* the guard's own SHA-256 path */
  const char *text; /* name ":" canonical */
  size_t len;
} sha_ctx;

static double run_sha(const sample *s, void *ctx, int iters) {
  sha_ctx *c = ctx;
  uint8_t out[AG_SIG_LEN];
  (void)s;
  double t0 = now_ns();
  for (int i = 0; i < iters; i++) {
    ag__sha256_init(c->h);
    ag__sha256_update(c->h, c->text, c->len);
    if (!ag__sha256_final(c->h, out))
      abort();
    g_sink ^= out[0];
  }
  return (now_ns() - t0) / iters;
}

static double run_convenience(const sample *s, void *ctx, int iters) {
  uint8_t sig[AG_SIG_LEN];
  size_t al = strlen(s->args);
  (void)ctx;
  double t0 = now_ns();
  for (int i = 0; i < iters; i++) {
    if (ag_signature(s->name, s->args, al, sig, NULL) != AG_OK)
      abort();
    g_sink ^= sig[0];
  }
  return (now_ns() - t0) / iters;
}

/* ~1 KiB: a file write with source text, options, tags and numbers. */
static const char *const args_1k =
    "{\"path\":\"src/services/billing/"
    "invoice_renderer.py\",\"content\":\"import "
    "os\\nimport json\\nfrom decimal import Decimal\\n\\n\\nclass "
    "InvoiceRenderer:\\n    \\\"\\\"\\\"Renders invoices as plain text for "
    "the e-mail digest.\\\"\\\"\\\"\\n\\n    def __init__(self, "
    "currency=\\\"EUR"
    "\\\", width=72):\\n        self.currency = currency\\n        self.width "
    "= width\\n\\n    def line(self, label, amount):\\n        text = "
    "f\\\"{label:<40}{amount:>12.2f} {self.currency}\\\"\\n        return "
    "text[: self.width]\\n\\n    def render(self, invoice):\\n        rows = "
    "[self.line(item[\\\"name\\\"], Decimal(item[\\\"price\\\"])) for item in "
    "invoice[\\\"items\\\"]]\\n        total = "
    "sum(Decimal(item[\\\"price\\\"]) "
    "for item in invoice[\\\"items\\\"])\\n        rows.append(\\\"-\\\" * "
    "self.width)\\n        rows.append(self.line(\\\"Total\\\", total))\\n     "
    "   return \\\"\\\\n\\\".join(rows)\\n\\n\\nif __name__ == "
    "\\\"__main__\\\":\\n    data = json.load(open(os.environ.get(\\\"INVOICE"
    "\\\", \\\"invoice.json\\\")))\\n    print(InvoiceRenderer().render(data))"
    "\\n\",\"options\":{\"overwrite\":true,\"mode\":420,\"encoding\":\"utf-8\","
    "\"create_dirs\":false,\"backup\":{\"keep\":3,\"suffix\":\".bak\"}},"
    "\"tags\":[\"billing\",\"python\",\"render\"],\"line_range\":[1,33],"
    "\"temperature\":0.7,\"reason\":\"Fix rounding of totals in the e-mail "
    "digest and widen the label column so long product names are not cut "
    "off.\"}";

/* `in` with a space after every ',' and ':' outside strings, as many models
 * write their arguments; caller frees. */
static char *spaced(const char *in) {
  char *out = malloc(strlen(in) * 2 + 1), *o = out;
  int in_str = 0;
  for (const char *p = in; *p; p++) {
    *o++ = *p;
    if (in_str) {
      if (*p == '\\')
        *o++ = *++p;
      else if (*p == '"')
        in_str = 0;
    } else if (*p == '"') {
      in_str = 1;
    } else if (*p == ',' || *p == ':') {
      *o++ = ' ';
    }
  }
  *o = '\0';
  return out;
}

/* A fixed sequence (an LCG), so every run hashes the same texts. */
static unsigned long long rng = 12345;

static unsigned below(unsigned n) {
  rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
  return (unsigned)((rng >> 33) % n);
}

enum { ROWS, ROWS_SORTED, NUMBERS, EXPONENTS };

/* Structured arguments of about `target` bytes (caller frees): ROWS, an
 * array of records whose keys come in a schema's order (as a model writes
 * them: not sorted); ROWS_SORTED, the same with sorted keys (already
 * canonical); NUMBERS, an array of decimals; EXPONENTS, an array of
 * numbers with an exponent, which the canonical form writes out. */
static char *structured(int shape, size_t target) {
  static const char *const words[] = {"alpha", "beta",  "gamma", "delta",
                                      "cache", "error", "user",  "order"};
  char *o = malloc(target + 256);
  size_t n = 0;
  if (o == NULL)
    abort();
  if (shape == NUMBERS || shape == EXPONENTS) {
    n += (size_t)sprintf(o, "{\"values\":[");
    for (int i = 0; n + 24 < target; i++) {
      unsigned a = below(10000), b = 1 + below(9);
      if (shape == NUMBERS)
        n += (size_t)sprintf(o + n, "%s%u.%u", i ? "," : "", a, b);
      else /* 1.5e3, 2.0E-2: rewritten by JCS (1500, 0.02) */
        n += (size_t)sprintf(o + n, "%s%u.%u%s%u", i ? "," : "", 1 + a % 9,
                             b % 10, a & 1 ? "e" : "E-", a % 6);
    }
    strcpy(o + n, "]}");
    return o;
  }
  n += (size_t)sprintf(o, "{\"table\":\"orders\",\"rows\":[");
  for (int id = 1; n + 128 < target; id++) {
    const char *w = words[below(8)], *paid = below(2) ? "true" : "false";
    unsigned amount = below(1000), cents = 1 + below(99), qty = below(20);
    if (shape == ROWS_SORTED)
      n += (size_t)sprintf(o + n,
                           "%s{\"amount\":%u.%02u,\"customer\":\"%s\","
                           "\"id\":%d,\"paid\":%s,\"qty\":%u}",
                           id > 1 ? "," : "", amount, cents, w, id, paid, qty);
    else
      n += (size_t)sprintf(o + n,
                           "%s{\"id\":%d,\"customer\":\"%s\",\"amount\":"
                           "%u.%02u,\"qty\":%u,\"paid\":%s}",
                           id > 1 ? "," : "", id, w, amount, cents, qty, paid);
  }
  strcpy(o + n, "]}");
  return o;
}

int main(void) {
  char *spaced_1k = spaced(args_1k);
  char *gen[8] = {structured(ROWS, 1024),        structured(ROWS, 16384),
                  structured(ROWS_SORTED, 1024), structured(ROWS_SORTED, 16384),
                  structured(NUMBERS, 1024),     structured(NUMBERS, 16384),
                  structured(EXPONENTS, 1024),   structured(EXPONENTS, 16384)};
  const sample samples[] = {
      {"~64 B", "run_shell",
       "{\"command\":\"ls -la src/core\",\"timeout\":30,\"cwd\":\"/work\"}"},
      {"~1 KiB", "write_file", args_1k},
      {"1K sp.", "write_file", spaced_1k},
      {"rows 1K", "insert_rows", gen[0]},
      {"rows16K", "insert_rows", gen[1]},
      {"sort 1K", "insert_rows", gen[2]},
      {"sort16K", "insert_rows", gen[3]},
      {"nums 1K", "plot", gen[4]},
      {"nums16K", "plot", gen[5]},
      {"exps 1K", "plot", gen[6]},
      {"exps16K", "plot", gen[7]},
  };
  ag__jcs *j;
  if (ag__jcs_new(&j, 1 << 20, 65536, 64, NULL) != AG_OK)
    return 1;
  sha_ctx sc = {NULL, NULL, 0};
  if (ag__sha256_new(&sc.h) != AG_OK)
    return 1;

  printf("bench_jcs: signature = SHA-256(name \":\" JCS(args)); median of %d "
         "runs [fastest-slowest]\n",
         RUNS);
  printf("%-7s %5s %5s %22s %22s %22s %7s %9s\n", "args", "bytes", "canon",
         "sig ns", "JCS ns", "SHA ns", "sig/SHA", "ag_sig ns");
  for (size_t k = 0; k < sizeof(samples) / sizeof(samples[0]); k++) {
    const sample *s = &samples[k];
    static buf text;
    text.len = 0;
    buf_sink(&text, s->name, strlen(s->name));
    buf_sink(&text, ":", 1);
    size_t head = text.len;
    if (ag__jcs_write(j, s->args, strlen(s->args), buf_sink, &text, NULL) !=
        AG_OK)
      return 1;
    sc.text = text.p;
    sc.len = text.len;
    size_t al = strlen(s->args);
    int iters = al > 4096 ? 4000 : al > 256 ? 100000 : 400000;
    const bench_fn fns[4] = {run_sig, run_canon, run_sha, run_convenience};
    void *const ctxs[4] = {j, j, &sc, NULL};
    const int its[4] = {iters, iters, iters, iters / 10};
    figure f[4];
    interleaved(4, fns, ctxs, its, s, f);
    char cell[3][64];
    for (int c = 0; c < 3; c++)
      snprintf(cell[c], sizeof(cell[c]), "%.1f [%.1f-%.1f]", f[c].med, f[c].lo,
               f[c].hi);
    printf("%-7s %5zu %5zu %22s %22s %22s %7.2f %9.1f\n", s->label, al,
           text.len - head, cell[0], cell[1], cell[2], f[0].med / f[2].med,
           f[3].med);
  }
  printf("sig: ag__jcs_signature (reused scratch, no allocation); JCS: "
         "canonicalization alone\n(ag__jcs_write to a null sink); SHA: "
         "ag__sha256 init+update+final (src/core/sha256.c,\nthe signature's "
         "own SHA-256) over the same name:canonical bytes; ag_sig: "
         "ag_signature,\nwhich allocates its scratch.\n");
  printf("1K sp.: the ~1 KiB arguments with a space after each ',' and ':' "
         "(nothing can be\ncopied in one piece). rows: records with keys in a "
         "schema's order; sort: the same\nalready canonical; nums: an array "
         "of decimals; exps: an array of numbers with an\nexponent "
         "(rewritten).\n");
  free(spaced_1k);
  for (int k = 0; k < 8; k++)
    free(gen[k]);
  ag__sha256_free(sc.h);
  ag__jcs_free(j);
  return 0;
}
