/*
 * src/exec/schema.c - the JSON Schema subset that tool parameters use:
 * compiled once when a tool is registered, then validated against every call's
 * arguments.
 *
 * Data structures. A compiled schema is a tree of `ag__schema` nodes, one per
 * (sub)schema in the source document. Each node holds only what its keywords
 * said: a type bit mask, its declared properties (in declared order, plus an
 * array of pointers sorted by name for binary search), the required names,
 * additionalProperties (any / none / a node), deep copies of enum and const
 * values with their message text rendered at compile time, numeric bounds, and
 * a compiled regex. Nothing refers back to the source json_t, which stays
 * borrowed.
 *
 * Threading. Compilation happens once, on one thread. Validation only reads
 * the tree: no caches, no static buffers, no allocation except a pattern's
 * match data (see Regexes). The JSON pointer of a
 * failure is kept as a stack of (key | index) references in the validator's
 * frame and only rendered into err->msg on failure, so success costs nothing
 * for it. Recursion follows the compiled tree, whose depth is capped at
 * MAX_DEPTH (enum/const values too). `$ref` makes the tree a graph: each
 * target (a JSON pointer into the same document) is compiled once, owned
 * by the root's `refs`, and referred to (not owned) by every node that
 * names it, so a recursive definition is a cycle. Validation then follows
 * the arguments: descending into a value stops at MAX_DEPTH levels, and
 * entering schemas for one value without descending ($ref, allOf, anyOf,
 * oneOf, not) stops at MAX_HOPS, so a reference to itself ends with an
 * error, never a stack overflow.
 *
 * Regexes. `pattern` is compiled with PCRE2 (8-bit, UTF mode) when the tool
 * is registered, with the options closest to ECMA-262, the syntax JSON
 * Schema names: PCRE2_ALT_BSUX and PCRE2_EXTRA_ALT_BSUX (\uHHHH, \u{H...},
 * \xHH as in JavaScript), PCRE2_DOLLAR_ENDONLY ("$" only at the very end),
 * PCRE2_MATCH_UNSET_BACKREF (a reference to an unset group matches the empty
 * string), PCRE2_ALLOW_EMPTY_CLASS ("[]" matches nothing, "[^]" anything),
 * newlines CR and LF (so "." matches neither), no PCRE2_UCP (\d \w \b are
 * ASCII as in ECMA). docs/tools.md lists what still differs.
 *
 * Bounds: a pattern is at most MAX_PATTERN bytes and nests at most
 * MAX_PARENS parentheses, and PCRE2's compiled form is capped by its link
 * size (64 KiB with Debian's build), so compiling costs microseconds and
 * kilobytes whatever the pattern. A model's argument can still make a
 * backtracking match exponential (`^(a|a?)+\1$`), so every match runs with
 * a match limit, a depth limit and a heap limit (the MATCH_* constants): a
 * match that reaches one stops within milliseconds and is a validation
 * error ("too costly to match"), never a stuck loop. A match cannot watch a
 * cancellation token; the limits bound it far below any turn deadline
 * instead. The JIT is used when PCRE2 has it; a JIT match that runs out of
 * its 32 KiB stack is run again by the interpreter, under the same limits.
 *
 * Validation allocates one PCRE2 match data block per pattern match (PCRE2
 * keeps its backtracking frames there); the compiled code and its match
 * context are only read, which PCRE2 allows from any number of threads.
 *
 * Order of checks (what "the first violation" means): $ref, allOf, anyOf,
 * oneOf, not (a failing branch of anyOf/oneOf is tried with a scratch
 * error), then type, const, enum, then
 * the type's own keywords: minLength, maxLength, pattern; minimum, maximum;
 * minItems, maxItems, then items by index; for objects, unexpected properties
 * first (a misspelt name is the most useful thing to report), then required
 * names in listed order, then property values in the arguments' order.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "internal.h"

#define MAX_DEPTH 64        /* schema nesting levels; the root is level 1 */
#define MAX_SHOWN 64        /* bytes of a key or name quoted in a message */
#define MAX_VALUES_TEXT 200 /* bytes of enum/const values in a message */
#define MAX_PATTERN 1000    /* bytes of one pattern */
#define MAX_PARENS 64       /* nested parentheses in one pattern */
/* Per match: at most about 5 ms of backtracking on a 2020s server core
 * (docs/tools.md has the figures), and far more steps than a pattern that
 * does not backtrack exponentially needs on any argument. */
#define MATCH_LIMIT 200000u
#define MATCH_DEPTH 100000u
#define MATCH_HEAP_KIB 8192u

enum {
  T_OBJECT = 1u << 0,
  T_ARRAY = 1u << 1,
  T_STRING = 1u << 2,
  T_NUMBER = 1u << 3,
  T_INTEGER = 1u << 4,
  T_BOOLEAN = 1u << 5,
  T_NULL = 1u << 6
};
#define N_TYPES 7
static const char *const type_names[N_TYPES] = {
    "object", "array", "string", "number", "integer", "boolean", "null"};

enum { ADD_ANY, ADD_NONE, ADD_SCHEMA };

/* A bound from the schema, exact for integers, with its text for messages. */
typedef struct num {
  bool is_int;
  json_int_t i;
  double d;
  char text[40];
} num;

typedef struct sname {
  char *s;
  size_t len;
} sname;

typedef struct prop {
  sname name;
  ag__schema *schema;
} prop;

typedef struct pattern {
  pcre2_code *code;
  pcre2_match_context *mctx; /* the limits; only read while matching */
  bool jit;                  /* the JIT compiled it */
  char *text;                /* as written in the schema, for messages */
} pattern;

struct ag__schema {
  bool never;     /* the boolean schema false */
  unsigned types; /* T_* mask; 0: any type */
  prop *props;    /* declared order */
  prop **sorted;  /* the same, sorted by name */
  size_t n_props;
  sname *required;
  size_t n_required;
  int additional;
  ag__schema *additional_schema;
  json_t *enum_values; /* own deep copy */
  char *enum_text;
  json_t *const_value; /* own deep copy */
  char *const_text;
  ag__schema *items;
  bool has_min_items, has_max_items;
  size_t min_items, max_items;
  bool has_min, has_max;
  num minimum, maximum;
  bool has_min_len, has_max_len;
  size_t min_len, max_len;
  bool has_xmin, has_xmax; /* exclusiveMinimum, exclusiveMaximum */
  num xmin, xmax;
  pattern *pattern;
  /* composition: each list owns its schemas */
  ag__schema **all_of, **any_of, **one_of;
  size_t n_all_of, n_any_of, n_one_of;
  ag__schema *not_schema;
  ag__schema *ref; /* $ref: borrowed from the root's refs */
  /* the root only: every schema a $ref names, compiled once (a recursive
   * reference points back into this list) */
  ag__schema **refs;
  size_t n_refs;
};

/* ------------------------------------------------------------------------ */
/* Bounded text buffers for messages                                        */
/* ------------------------------------------------------------------------ */

/* At most `max` bytes of s[0..n), cut at a character start. */
static size_t shown_len(const char *s, size_t n, size_t max) {
  return n <= max ? n : ag__utf8_back(s, max);
}

/* s as a JSON-style quoted string, cut to MAX_SHOWN bytes with "...". */
static void sb_quoted(ag__buf *b, const char *s, size_t n) {
  size_t m = shown_len(s, n, MAX_SHOWN);
  ag__buf_addc_cut(b, '"');
  for (size_t i = 0; i < m; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c == '"' || c == '\\') {
      ag__buf_addc_cut(b, '\\');
      ag__buf_addc_cut(b, (char)c);
    } else if (c < 0x20) {
      ag__buf_printf_cut(b, "\\u%04x", c);
    } else {
      ag__buf_addc_cut(b, (char)c);
    }
  }
  if (m < n)
    ag__buf_addstr_cut(b, "...");
  ag__buf_addc_cut(b, '"');
}

/* "/" and one RFC 6901 reference token: "~" is "~0", "/" is "~1". Keys over
 * MAX_SHOWN bytes are cut and marked "...". */
static void sb_token(ag__buf *b, const char *s, size_t n) {
  size_t m = shown_len(s, n, MAX_SHOWN);
  ag__buf_addc_cut(b, '/');
  size_t start = 0;
  for (size_t i = 0; i < m; i++) {
    if (s[i] == '~' || s[i] == '/' || s[i] == '\0') {
      ag__buf_add_cut(b, s + start, i - start);
      if (s[i] == '~')
        ag__buf_addstr_cut(b, "~0");
      else if (s[i] == '/')
        ag__buf_addstr_cut(b, "~1");
      start = i + 1; /* a NUL byte is dropped: it cannot be shown */
    }
  }
  ag__buf_add_cut(b, s + start, m - start);
  if (m < n)
    ag__buf_addstr_cut(b, "...");
}

/* ------------------------------------------------------------------------ */
/* Suggestions                                                              */
/* ------------------------------------------------------------------------ */

/* Distance of `input` to `cand` if it is close enough to suggest (at most 1
 * for inputs shorter than 6 bytes, else 2, as the config's suggestions), else
 * -1. */
static int close_enough(const char *input, size_t li, const char *cand,
                        size_t lc) {
  if (li > MAX_SHOWN || lc > MAX_SHOWN)
    return -1;
  int dist = ag__edit_distance(input, li, cand, lc);
  return dist >= 0 && dist <= ag__suggest_limit(li) ? dist : -1;
}

/* ------------------------------------------------------------------------ */
/* JSON helpers                                                             */
/* ------------------------------------------------------------------------ */

/* Whether d has no fraction. Every double of magnitude 2^52 or more is an
 * integer; below that the cast to an integer is exact. (No libm: the library
 * does not link it.) */
static bool integral(double d) {
  if (d >= 4503599627370496.0 || d <= -4503599627370496.0)
    return true;
  return (double)(json_int_t)d == d;
}

/* Compares an integer with a double exactly (no rounding of either). */
static int cmp_int_real(json_int_t i, double d) {
  if (d >= 9223372036854775808.0)
    return -1;
  if (d < -9223372036854775808.0)
    return 1;
  json_int_t fl = (json_int_t)d; /* toward zero, exact in this range */
  if ((double)fl > d)
    fl--; /* floor of a negative non-integer */
  if (i != fl)
    return i < fl ? -1 : 1;
  return integral(d) ? 0 : -1; /* i == floor(d) < d */
}

static void num_of(num *n, const json_t *v) {
  n->is_int = json_is_integer(v);
  n->i = n->is_int ? json_integer_value(v) : 0;
  n->d = n->is_int ? (double)n->i : json_real_value(v);
}

static int cmp_nums(const num *a, const num *b) {
  if (a->is_int && b->is_int)
    return (a->i > b->i) - (a->i < b->i);
  if (a->is_int)
    return cmp_int_real(a->i, b->d);
  if (b->is_int)
    return -cmp_int_real(b->i, a->d);
  return (a->d > b->d) - (a->d < b->d);
}

static int cmp_num(const json_t *v, const num *b) {
  num a;
  num_of(&a, v);
  return cmp_nums(&a, b);
}

static void num_from(num *n, const json_t *v) {
  num_of(n, v);
  if (n->is_int) {
    snprintf(n->text, sizeof(n->text), "%" JSON_INTEGER_FORMAT, n->i);
    return;
  }
  /* The shortest of %.15g..%.17g that reads back as the same double. */
  for (int prec = 15; prec <= 17; prec++) {
    snprintf(n->text, sizeof(n->text), "%.*g", prec, n->d);
    if (strtod(n->text, NULL) == n->d)
      break;
  }
}

static bool num_eq(const json_t *a, const json_t *b) {
  num n;
  num_of(&n, b);
  return cmp_num(a, &n) == 0;
}

/* Deep equality where numbers compare by value (1 == 1.0). Recursion is
 * bounded by the depth of the schema side, capped at compile time. */
static bool json_eq(const json_t *a, const json_t *b) {
  if (json_is_number(a) && json_is_number(b))
    return num_eq(a, b);
  if (json_typeof(a) != json_typeof(b))
    return false;
  switch (json_typeof(a)) {
  case JSON_STRING:
    return json_string_length(a) == json_string_length(b) &&
           memcmp(json_string_value(a), json_string_value(b),
                  json_string_length(a)) == 0;
  case JSON_ARRAY: {
    size_t n = json_array_size(a);
    if (n != json_array_size(b))
      return false;
    for (size_t i = 0; i < n; i++)
      if (!json_eq(json_array_get(a, i), json_array_get(b, i)))
        return false;
    return true;
  }
  case JSON_OBJECT: {
    if (json_object_size(a) != json_object_size(b))
      return false;
    const char *k;
    size_t kl;
    json_t *va;
    json_object_keylen_foreach((json_t *)a, k, kl, va) {
      const json_t *vb = json_object_getn(b, k, kl);
      if (vb == NULL || !json_eq(va, vb))
        return false;
    }
    return true;
  }
  default: /* true, false, null: the type is the value */
    return true;
  }
}

/* Whether v nests containers more than `limit` levels deep; recurses at most
 * limit + 1 levels. */
static bool deeper_than(const json_t *v, int limit) {
  if (!json_is_array(v) && !json_is_object(v))
    return false;
  if (limit <= 0)
    return true;
  if (json_is_array(v)) {
    for (size_t i = 0; i < json_array_size(v); i++)
      if (deeper_than(json_array_get(v, i), limit - 1))
        return true;
    return false;
  }
  const char *k;
  json_t *x;
  json_object_foreach((json_t *)v, k, x) {
    if (deeper_than(x, limit - 1))
      return true;
  }
  return false;
}

/* Non-negative integral numbers (JSON Schema: 3.0 is an integer). */
static bool as_count(const json_t *v, size_t *out) {
  if (json_is_integer(v)) {
    if (json_integer_value(v) < 0)
      return false;
    *out = (unsigned long long)json_integer_value(v) > SIZE_MAX
               ? SIZE_MAX
               : (size_t)json_integer_value(v);
    return true;
  }
  if (json_is_real(v)) {
    double d = json_real_value(v);
    if (d < 0 || !integral(d))
      return false;
    *out = d >= 18446744073709551615.0 ? SIZE_MAX : (size_t)d;
    return true;
  }
  return false;
}

/* ------------------------------------------------------------------------ */
/* Compilation                                                              */
/* ------------------------------------------------------------------------ */

#define MAX_REFS 64 /* distinct $ref targets in one schema */

typedef struct cctx {
  const char *tool;
  ag_error_t *err;
  char path[AG_ERROR_MSG_MAX]; /* JSON pointer from the schema root */
  ag__buf pb;
  const json_t *root; /* the document, for $ref */
  struct {
    const json_t *target;
    ag__schema *node;
  } refs[MAX_REFS];
  size_t n_refs;
} cctx;

static ag_err_t cfail(cctx *c, const char *fmt, ...) AG__PRINTF(2, 3);
static ag_err_t cfail(cctx *c, const char *fmt, ...) {
  char msg[AG_ERROR_MSG_MAX];
  ag__buf b;
  ag__buf_init_fixed(&b, msg, sizeof(msg));
  if (c->tool != NULL)
    ag__buf_printf_cut(&b, "tools.%s.", c->tool);
  ag__buf_printf_cut(&b, "parameters%s: ", c->path);
  va_list ap;
  va_start(ap, fmt);
  ag__buf_vprintf_cut(&b, fmt, ap);
  va_end(ap);
  return ag__set_error(c->err, AG_ECONFIG, -1, "%s", msg);
}

static ag_err_t cnomem(cctx *c) {
  return ag__set_error(c->err, AG_ENOMEM, -1, "out of memory");
}

/* Pushes one pointer token on the schema path; returns the length to pop
 * back to. */
static size_t cpush(cctx *c, const char *s, size_t n) {
  size_t mark = c->pb.len;
  sb_token(&c->pb, s, n);
  return mark;
}

static void cpop(cctx *c, size_t mark) {
  c->pb.len = mark;
  c->pb.cut = false; /* what was cut is popped */
  c->path[mark] = '\0';
}

static ag_err_t compile_node(cctx *c, ag__schema **out, const json_t *js,
                             int depth);

typedef ag_err_t (*kw_fn)(cctx *c, ag__schema *s, const json_t *v, int depth);

static ag_err_t kw_type(cctx *c, ag__schema *s, const json_t *v, int depth) {
  (void)depth;
  const json_t *one = v;
  size_t n = 1;
  if (json_is_array(v)) {
    n = json_array_size(v);
    if (n == 0)
      return cfail(c, "must not be an empty array");
  } else if (!json_is_string(v)) {
    return cfail(c, "must be a type name or an array of type names");
  }
  for (size_t i = 0; i < n; i++) {
    if (json_is_array(v))
      one = json_array_get(v, i);
    if (!json_is_string(one))
      return cfail(c, "must be a type name or an array of type names");
    const char *name = json_string_value(one);
    size_t len = json_string_length(one);
    int idx = -1;
    const char *near = NULL;
    for (int t = 0; t < N_TYPES; t++) {
      size_t tl = strlen(type_names[t]);
      if (tl == len && memcmp(type_names[t], name, len) == 0)
        idx = t;
      else if (near == NULL && close_enough(name, len, type_names[t], tl) >= 0)
        near = type_names[t];
    }
    if (idx < 0) {
      char q[MAX_SHOWN * 2 + 8];
      ag__buf b;
      ag__buf_init_fixed(&b, q, sizeof(q));
      sb_quoted(&b, name, len);
      if (near != NULL)
        return cfail(c, "unknown type %s; did you mean \"%s\"?", q, near);
      return cfail(c,
                   "unknown type %s; use object, array, string, number, "
                   "integer, boolean or null",
                   q);
    }
    unsigned bit = 1u << idx;
    if (s->types & bit)
      return cfail(c, "type \"%s\" is listed twice", type_names[idx]);
    s->types |= bit;
  }
  return AG_OK;
}

static int prop_cmp(const void *a, const void *b) {
  const prop *pa = *(const prop *const *)a, *pb = *(const prop *const *)b;
  size_t n = pa->name.len < pb->name.len ? pa->name.len : pb->name.len;
  int r = memcmp(pa->name.s, pb->name.s, n);
  if (r != 0)
    return r;
  return (pa->name.len > pb->name.len) - (pa->name.len < pb->name.len);
}

static ag_err_t kw_properties(cctx *c, ag__schema *s, const json_t *v,
                              int depth) {
  if (!json_is_object(v))
    return cfail(c, "must be an object mapping names to schemas");
  size_t n = json_object_size(v);
  if (n == 0)
    return AG_OK;
  s->props = calloc(n, sizeof(*s->props));
  s->sorted = calloc(n, sizeof(*s->sorted));
  if (s->props == NULL || s->sorted == NULL)
    return cnomem(c);
  const char *k;
  size_t kl;
  json_t *sub;
  json_object_keylen_foreach((json_t *)v, k, kl, sub) {
    prop *p = &s->props[s->n_props];
    p->name.s = malloc(kl + 1);
    if (p->name.s == NULL)
      return cnomem(c);
    memcpy(p->name.s, k, kl);
    p->name.s[kl] = '\0';
    p->name.len = kl;
    s->sorted[s->n_props] = p;
    s->n_props++;
    size_t mark = cpush(c, k, kl);
    ag_err_t rc = compile_node(c, &p->schema, sub, depth + 1);
    if (rc != AG_OK)
      return rc;
    cpop(c, mark);
  }
  qsort(s->sorted, s->n_props, sizeof(*s->sorted), prop_cmp);
  return AG_OK;
}

static ag_err_t kw_required(cctx *c, ag__schema *s, const json_t *v,
                            int depth) {
  (void)depth;
  if (!json_is_array(v))
    return cfail(c, "must be an array of property names");
  size_t n = json_array_size(v);
  if (n == 0)
    return AG_OK;
  s->required = calloc(n, sizeof(*s->required));
  if (s->required == NULL)
    return cnomem(c);
  for (size_t i = 0; i < n; i++) {
    const json_t *e = json_array_get(v, i);
    if (!json_is_string(e))
      return cfail(c, "must be an array of property names (item %zu is %s)", i,
                   ag__json_kind(e));
    const char *name = json_string_value(e);
    size_t len = json_string_length(e);
    for (size_t j = 0; j < s->n_required; j++) {
      if (s->required[j].len == len &&
          memcmp(s->required[j].s, name, len) == 0) {
        char q[MAX_SHOWN * 2 + 8];
        ag__buf b;
        ag__buf_init_fixed(&b, q, sizeof(q));
        sb_quoted(&b, name, len);
        return cfail(c, "%s is listed twice", q);
      }
    }
    sname *r = &s->required[s->n_required];
    r->s = ag__strndup(name, len);
    if (r->s == NULL)
      return cnomem(c);
    r->len = len;
    s->n_required++;
  }
  return AG_OK;
}

static ag_err_t kw_additional(cctx *c, ag__schema *s, const json_t *v,
                              int depth) {
  if (json_is_boolean(v)) {
    s->additional = json_is_true(v) ? ADD_ANY : ADD_NONE;
    return AG_OK;
  }
  if (!json_is_object(v))
    return cfail(c, "must be true, false or a schema");
  s->additional = ADD_SCHEMA;
  return compile_node(c, &s->additional_schema, v, depth + 1);
}

static ag_err_t kw_items(cctx *c, ag__schema *s, const json_t *v, int depth) {
  if (json_is_array(v))
    return cfail(c, "an array of schemas (tuple form) is not supported; "
                    "give one schema for every item");
  if (!json_is_object(v) && !json_is_boolean(v))
    return cfail(c, "must be a schema");
  return compile_node(c, &s->items, v, depth + 1);
}

static ag_err_t kw_count(cctx *c, const json_t *v, bool *has, size_t *out) {
  if (!as_count(v, out))
    return cfail(c, "must be a non-negative integer");
  *has = true;
  return AG_OK;
}

static ag_err_t kw_min_items(cctx *c, ag__schema *s, const json_t *v,
                             int depth) {
  (void)depth;
  return kw_count(c, v, &s->has_min_items, &s->min_items);
}
static ag_err_t kw_max_items(cctx *c, ag__schema *s, const json_t *v,
                             int depth) {
  (void)depth;
  return kw_count(c, v, &s->has_max_items, &s->max_items);
}
static ag_err_t kw_min_len(cctx *c, ag__schema *s, const json_t *v, int depth) {
  (void)depth;
  return kw_count(c, v, &s->has_min_len, &s->min_len);
}
static ag_err_t kw_max_len(cctx *c, ag__schema *s, const json_t *v, int depth) {
  (void)depth;
  return kw_count(c, v, &s->has_max_len, &s->max_len);
}

static ag_err_t kw_minimum(cctx *c, ag__schema *s, const json_t *v, int depth) {
  (void)depth;
  if (!json_is_number(v))
    return cfail(c, "must be a number");
  s->has_min = true;
  num_from(&s->minimum, v);
  return AG_OK;
}
static ag_err_t kw_maximum(cctx *c, ag__schema *s, const json_t *v, int depth) {
  (void)depth;
  if (!json_is_number(v))
    return cfail(c, "must be a number");
  s->has_max = true;
  num_from(&s->maximum, v);
  return AG_OK;
}

static ag_err_t kw_xminimum(cctx *c, ag__schema *s, const json_t *v,
                            int depth) {
  (void)depth;
  if (!json_is_number(v))
    return cfail(c, "must be a number (the draft 6 and later form)");
  s->has_xmin = true;
  num_from(&s->xmin, v);
  return AG_OK;
}
static ag_err_t kw_xmaximum(cctx *c, ag__schema *s, const json_t *v,
                            int depth) {
  (void)depth;
  if (!json_is_number(v))
    return cfail(c, "must be a number (the draft 6 and later form)");
  s->has_xmax = true;
  num_from(&s->xmax, v);
  return AG_OK;
}

/* allOf, anyOf, oneOf: a non-empty array of schemas, each compiled. */
static ag_err_t kw_list(cctx *c, ag__schema ***list, size_t *n, const json_t *v,
                        int depth) {
  if (!json_is_array(v) || json_array_size(v) == 0)
    return cfail(c, "must be a non-empty array of schemas");
  *list = calloc(json_array_size(v), sizeof(**list));
  if (*list == NULL)
    return cnomem(c);
  for (size_t i = 0; i < json_array_size(v); i++) {
    char idx[24];
    int il = snprintf(idx, sizeof idx, "%zu", i);
    size_t mark = cpush(c, idx, (size_t)il);
    ag_err_t rc = compile_node(c, &(*list)[i], json_array_get(v, i), depth + 1);
    (*n)++; /* owned from here on, freed with the node */
    if (rc != AG_OK)
      return rc;
    cpop(c, mark);
  }
  return AG_OK;
}
static ag_err_t kw_all_of(cctx *c, ag__schema *s, const json_t *v, int depth) {
  return kw_list(c, &s->all_of, &s->n_all_of, v, depth);
}
static ag_err_t kw_any_of(cctx *c, ag__schema *s, const json_t *v, int depth) {
  return kw_list(c, &s->any_of, &s->n_any_of, v, depth);
}
static ag_err_t kw_one_of(cctx *c, ag__schema *s, const json_t *v, int depth) {
  return kw_list(c, &s->one_of, &s->n_one_of, v, depth);
}
static ag_err_t kw_not(cctx *c, ag__schema *s, const json_t *v, int depth) {
  if (!json_is_object(v) && !json_is_boolean(v))
    return cfail(c, "must be a schema");
  return compile_node(c, &s->not_schema, v, depth + 1);
}

static int hexval(char c) {
  return c >= '0' && c <= '9'   ? c - '0'
         : c >= 'a' && c <= 'f' ? c - 'a' + 10
         : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                : -1;
}

/* The schema a local JSON pointer ("#", "#/$defs/Name") names in the
 * document, or NULL. The fragment is percent-decoded (%25 is "%") and
 * its tokens unescaped (~1 is "/", ~0 is "~"). */
static const json_t *resolve_pointer(const json_t *root, const char *ref) {
  const json_t *at = root;
  const char *p = ref + 1; /* after '#' */
  while (*p == '/' && at != NULL) {
    p++;
    char tok[256];
    size_t n = 0;
    while (*p != '\0' && *p != '/') {
      char ch = *p++;
      if (ch == '%' && hexval(p[0]) >= 0 && hexval(p[1]) >= 0) {
        ch = (char)(hexval(p[0]) * 16 + hexval(p[1])); /* a URI fragment */
        p += 2;
      } else if (ch == '~' && (*p == '0' || *p == '1')) {
        ch = *p++ == '0' ? '~' : '/';
      }
      if (n + 1 >= sizeof tok)
        return NULL;
      tok[n++] = ch;
    }
    tok[n] = '\0';
    if (json_is_object(at)) {
      at = json_object_getn(at, tok, n);
    } else if (json_is_array(at)) {
      char *end = NULL;
      unsigned long i = strtoul(tok, &end, 10);
      at = n > 0 && *end == '\0' ? json_array_get(at, i) : NULL;
    } else {
      at = NULL;
    }
  }
  return *p == '\0' ? at : NULL;
}

/* $ref to a place in the same document; each target is compiled once and
 * shared, so a recursive definition (a tree of nodes) is a cycle in the
 * compiled graph, not an endless compile. */
static ag_err_t kw_ref(cctx *c, ag__schema *s, const json_t *v, int depth) {
  const char *ref = json_string_value(v);
  if (ref == NULL)
    return cfail(c, "must be a string");
  if (ref[0] != '#')
    return cfail(c,
                 "\"%.*s\": only references inside the schema (\"#/$defs/"
                 "Name\") are supported, not other documents",
                 MAX_SHOWN, ref);
  const json_t *target = resolve_pointer(c->root, ref);
  if (target == NULL)
    return cfail(c, "\"%.*s\" names nothing in this schema", MAX_SHOWN, ref);
  for (size_t i = 0; i < c->n_refs; i++)
    if (c->refs[i].target == target) {
      s->ref = c->refs[i].node;
      return AG_OK;
    }
  if (c->n_refs == MAX_REFS)
    return cfail(c, "more than %d distinct $ref targets", MAX_REFS);
  size_t k = c->n_refs++;
  c->refs[k].target = target;
  c->refs[k].node = NULL;
  /* compile_node stores the new node in refs[k] before reading its
   * keywords, so a reference back to it inside finds it */
  ag_err_t rc = compile_node(c, &c->refs[k].node, target, depth + 1);
  s->ref = c->refs[k].node;
  return rc;
}

static ag_err_t kw_defs(cctx *c, ag__schema *s, const json_t *v, int depth) {
  (void)s;
  (void)depth;
  /* compiled where a $ref names them */
  return json_is_object(v) ? AG_OK : cfail(c, "must be an object of schemas");
}

static ag_err_t kw_bool(cctx *c, ag__schema *s, const json_t *v, int depth) {
  (void)s;
  (void)depth;
  return json_is_boolean(v) ? AG_OK : cfail(c, "must be true or false");
}

/* Renders values as compact JSON joined by ", ", cut near MAX_VALUES_TEXT
 * with "...". Returns a malloc'd string or NULL on ENOMEM. */
static char *values_text(const json_t *const *vals, size_t n) {
  char *text = malloc(MAX_VALUES_TEXT + 8);
  if (text == NULL)
    return NULL;
  ag__buf b;
  ag__buf_init_fixed(&b, text, MAX_VALUES_TEXT + 1);
  for (size_t i = 0; i < n; i++) {
    char *one = json_dumps(vals[i], JSON_COMPACT | JSON_ENCODE_ANY);
    if (one == NULL) {
      free(text);
      return NULL;
    }
    if (i > 0)
      ag__buf_addstr_cut(&b, ", ");
    ag__buf_addstr_cut(&b, one);
    free(one);
    if (b.cut)
      break;
  }
  if (b.cut)
    strcpy(text + b.len, "..."); /* the +8 spare bytes */
  return text;
}

static ag_err_t kw_enum(cctx *c, ag__schema *s, const json_t *v, int depth) {
  (void)depth;
  if (!json_is_array(v) || json_array_size(v) == 0)
    return cfail(c, "must be a non-empty array of values");
  if (deeper_than(v, MAX_DEPTH + 1))
    return cfail(c, "values nest deeper than %d levels", MAX_DEPTH);
  s->enum_values = json_deep_copy(v);
  if (s->enum_values == NULL)
    return cnomem(c);
  size_t n = json_array_size(v);
  const json_t **vals = malloc(n * sizeof(*vals));
  if (vals == NULL)
    return cnomem(c);
  for (size_t i = 0; i < n; i++)
    vals[i] = json_array_get(v, i);
  s->enum_text = values_text(vals, n);
  free(vals);
  return s->enum_text == NULL ? cnomem(c) : AG_OK;
}

static ag_err_t kw_const(cctx *c, ag__schema *s, const json_t *v, int depth) {
  (void)depth;
  if (deeper_than(v, MAX_DEPTH))
    return cfail(c, "value nests deeper than %d levels", MAX_DEPTH);
  s->const_value = json_deep_copy(v);
  if (s->const_value == NULL)
    return cnomem(c);
  s->const_text = values_text(&v, 1);
  return s->const_text == NULL ? cnomem(c) : AG_OK;
}

/* The options closest to ECMA-262 (see the note at the top). */
#define PATTERN_OPTIONS                                                        \
  (PCRE2_UTF | PCRE2_ALT_BSUX | PCRE2_DOLLAR_ENDONLY |                         \
   PCRE2_MATCH_UNSET_BACKREF | PCRE2_ALLOW_EMPTY_CLASS |                       \
   PCRE2_NEVER_BACKSLASH_C)

static ag_err_t kw_pattern(cctx *c, ag__schema *s, const json_t *v, int depth) {
  (void)depth;
  if (!json_is_string(v))
    return cfail(c, "must be a string (a regular expression)");
  const char *src = json_string_value(v);
  size_t n = json_string_length(v);
  if (strlen(src) != n)
    return cfail(c, "must not contain a NUL character");
  if (n > MAX_PATTERN)
    return cfail(c, "is %zu bytes long; a pattern may have at most %d", n,
                 MAX_PATTERN);
  s->pattern = calloc(1, sizeof(*s->pattern));
  if (s->pattern == NULL)
    return cnomem(c);
  pattern *p = s->pattern;
  p->text = ag__strdup(src);
  if (p->text == NULL)
    return cnomem(c);
  pcre2_compile_context *cc = pcre2_compile_context_create(NULL);
  if (cc == NULL)
    return cnomem(c);
  pcre2_set_max_pattern_length(cc, MAX_PATTERN);
  pcre2_set_parens_nest_limit(cc, MAX_PARENS);
  pcre2_set_newline(cc, PCRE2_NEWLINE_ANYCRLF);
  pcre2_set_compile_extra_options(cc, PCRE2_EXTRA_ALT_BSUX);
  int code;
  PCRE2_SIZE off;
  p->code = pcre2_compile((PCRE2_SPTR)src, n, PATTERN_OPTIONS, &code, &off, cc);
  pcre2_compile_context_free(cc);
  if (p->code == NULL) {
    if (code == PCRE2_ERROR_NOMEMORY)
      return cnomem(c);
    PCRE2_UCHAR why[160];
    if (pcre2_get_error_message(code, why, sizeof(why)) < 0)
      snprintf((char *)why, sizeof(why), "PCRE2 error %d", code);
    return cfail(c, "invalid regular expression \"%s\": %s at offset %zu", src,
                 (const char *)why, (size_t)off);
  }
  /* Without the JIT (not built, or no executable memory) the interpreter
   * matches, under the same limits. */
  p->jit = pcre2_jit_compile(p->code, PCRE2_JIT_COMPLETE) == 0;
  p->mctx = pcre2_match_context_create(NULL);
  if (p->mctx == NULL)
    return cnomem(c);
  pcre2_set_match_limit(p->mctx, MATCH_LIMIT);
  pcre2_set_depth_limit(p->mctx, MATCH_DEPTH);
  pcre2_set_heap_limit(p->mctx, MATCH_HEAP_KIB);
  return AG_OK;
}

static ag_err_t kw_text(cctx *c, ag__schema *s, const json_t *v, int depth) {
  (void)s;
  (void)depth;
  return json_is_string(v) ? AG_OK : cfail(c, "must be a string");
}

static ag_err_t kw_examples(cctx *c, ag__schema *s, const json_t *v,
                            int depth) {
  (void)s;
  (void)depth;
  return json_is_array(v) ? AG_OK : cfail(c, "must be an array");
}

static ag_err_t kw_any(cctx *c, ag__schema *s, const json_t *v, int depth) {
  (void)c;
  (void)s;
  (void)v;
  (void)depth;
  return AG_OK;
}

static const struct keyword {
  const char *name;
  kw_fn fn;
} keywords[] = {
    {"type", kw_type},
    {"properties", kw_properties},
    {"required", kw_required},
    {"additionalProperties", kw_additional},
    {"enum", kw_enum},
    {"const", kw_const},
    {"items", kw_items},
    {"minItems", kw_min_items},
    {"maxItems", kw_max_items},
    {"minimum", kw_minimum},
    {"maximum", kw_maximum},
    {"minLength", kw_min_len},
    {"maxLength", kw_max_len},
    {"pattern", kw_pattern},
    {"exclusiveMinimum", kw_xminimum},
    {"exclusiveMaximum", kw_xmaximum},
    {"allOf", kw_all_of},
    {"anyOf", kw_any_of},
    {"oneOf", kw_one_of},
    {"not", kw_not},
    {"$ref", kw_ref},
    {"$defs", kw_defs},
    {"definitions", kw_defs},
    /* annotations: accepted, checked for shape, ignored */
    {"format", kw_text},
    {"readOnly", kw_bool},
    {"writeOnly", kw_bool},
    {"deprecated", kw_bool},
    {"description", kw_text},
    {"title", kw_text},
    {"$comment", kw_text},
    {"$schema", kw_text},
    {"$id", kw_text},
    {"default", kw_any},
    {"examples", kw_examples},
};
#define N_KEYWORDS (sizeof(keywords) / sizeof(keywords[0]))

/* Checks between keywords of one node, once all are read. */
static ag_err_t check_node(cctx *c, const ag__schema *s) {
  if (s->has_min_items && s->has_max_items && s->min_items > s->max_items)
    return cfail(c, "minItems (%zu) is greater than maxItems (%zu)",
                 s->min_items, s->max_items);
  if (s->has_min_len && s->has_max_len && s->min_len > s->max_len)
    return cfail(c, "minLength (%zu) is greater than maxLength (%zu)",
                 s->min_len, s->max_len);
  if (s->has_min && s->has_max && cmp_nums(&s->minimum, &s->maximum) > 0)
    return cfail(c, "minimum (%s) is greater than maximum (%s)",
                 s->minimum.text, s->maximum.text);
  if (s->additional == ADD_NONE) {
    for (size_t i = 0; i < s->n_required; i++) {
      bool found = false;
      for (size_t j = 0; j < s->n_props && !found; j++)
        found = s->props[j].name.len == s->required[i].len &&
                memcmp(s->props[j].name.s, s->required[i].s,
                       s->required[i].len) == 0;
      if (!found) {
        char q[MAX_SHOWN * 2 + 8];
        ag__buf b;
        ag__buf_init_fixed(&b, q, sizeof(q));
        sb_quoted(&b, s->required[i].s, s->required[i].len);
        return cfail(c,
                     "required property %s is not in properties and "
                     "additionalProperties is false",
                     q);
      }
    }
  }
  return AG_OK;
}

static ag_err_t compile_node(cctx *c, ag__schema **out, const json_t *js,
                             int depth) {
  if (depth > MAX_DEPTH)
    return cfail(c, "schemas nest deeper than %d levels", MAX_DEPTH);
  ag__schema *s = calloc(1, sizeof(*s));
  if (s == NULL)
    return cnomem(c);
  *out = s; /* owned by the parent from here on, freed with it */
  if (json_is_boolean(js)) {
    s->never = json_is_false(js);
    return AG_OK;
  }
  if (!json_is_object(js))
    return cfail(c, "a schema must be an object or a boolean, not %s",
                 ag__json_kind(js));
  const char *k;
  size_t kl;
  json_t *v;
  json_object_keylen_foreach((json_t *)js, k, kl, v) {
    const struct keyword *kw = NULL;
    for (size_t i = 0; i < N_KEYWORDS && kw == NULL; i++)
      if (strlen(keywords[i].name) == kl &&
          memcmp(keywords[i].name, k, kl) == 0)
        kw = &keywords[i];
    if (kw == NULL) {
      char q[MAX_SHOWN * 2 + 8];
      ag__buf b;
      ag__buf_init_fixed(&b, q, sizeof(q));
      sb_quoted(&b, k, kl);
      const char *near = NULL;
      int best = 3;
      for (size_t i = 0; i < N_KEYWORDS; i++) {
        int d = close_enough(k, kl, keywords[i].name, strlen(keywords[i].name));
        if (d >= 0 && d < best) {
          best = d;
          near = keywords[i].name;
        }
      }
      if (near != NULL)
        return cfail(c, "unsupported keyword %s; did you mean \"%s\"?", q,
                     near);
      return cfail(c, "unsupported keyword %s", q);
    }
    size_t mark = cpush(c, k, kl);
    ag_err_t rc = kw->fn(c, s, v, depth);
    if (rc != AG_OK)
      return rc;
    cpop(c, mark);
  }
  return check_node(c, s);
}

void ag__schema_free(ag__schema *s) {
  if (s == NULL)
    return;
  for (size_t i = 0; i < s->n_props; i++) {
    free(s->props[i].name.s);
    ag__schema_free(s->props[i].schema);
  }
  free(s->props);
  free(s->sorted);
  for (size_t i = 0; i < s->n_required; i++)
    free(s->required[i].s);
  free(s->required);
  ag__schema_free(s->additional_schema);
  ag__schema_free(s->items);
  json_decref(s->enum_values);
  free(s->enum_text);
  json_decref(s->const_value);
  free(s->const_text);
  for (size_t i = 0; i < s->n_all_of; i++)
    ag__schema_free(s->all_of[i]);
  for (size_t i = 0; i < s->n_any_of; i++)
    ag__schema_free(s->any_of[i]);
  for (size_t i = 0; i < s->n_one_of; i++)
    ag__schema_free(s->one_of[i]);
  free(s->all_of);
  free(s->any_of);
  free(s->one_of);
  ag__schema_free(s->not_schema);
  for (size_t i = 0; i < s->n_refs; i++)
    ag__schema_free(s->refs[i]);
  free(s->refs);
  if (s->pattern != NULL) {
    pcre2_match_context_free(s->pattern->mctx);
    pcre2_code_free(s->pattern->code);
    free(s->pattern->text);
    free(s->pattern);
  }
  free(s);
}

static ag_err_t compile_root(ag__schema **out, const json_t *schema,
                             const char *tool, bool args, ag_error_t *err) {
  if (out == NULL)
    return ag__set_error(err, AG_EINVAL, -1, "schema: no output pointer");
  *out = NULL;
  if (schema == NULL)
    return ag__set_error(err, AG_EINVAL, -1, "schema: no schema given");
  cctx *c = malloc(sizeof(*c));
  if (c == NULL)
    return ag__set_error(err, AG_ENOMEM, -1, "out of memory");
  c->tool = tool;
  c->err = err;
  c->root = schema;
  c->n_refs = 0;
  ag__buf_init_fixed(&c->pb, c->path, sizeof(c->path));
  ag__schema *s = NULL;
  ag_err_t rc = compile_node(c, &s, schema, 1);
  if (c->n_refs > 0) {
    /* the root owns every $ref target, whatever happened */
    ag__schema **refs = calloc(c->n_refs, sizeof(*refs));
    if (refs == NULL || s == NULL) {
      for (size_t i = 0; i < c->n_refs; i++)
        ag__schema_free(c->refs[i].node);
      free(refs);
      if (rc == AG_OK)
        rc = cnomem(c);
    } else {
      for (size_t i = 0; i < c->n_refs; i++)
        refs[i] = c->refs[i].node;
      s->refs = refs;
      s->n_refs = c->n_refs;
    }
  }
  if (rc == AG_OK && args && s->never)
    rc = cfail(c, "false rejects every call; use true or {} for any object");
  if (rc == AG_OK && args && s->types != 0 && !(s->types & T_OBJECT)) {
    cpush(c, "type", 4);
    rc = cfail(c, "must allow \"object\": tool arguments are always objects");
  }
  free(c);
  if (rc != AG_OK) {
    ag__schema_free(s);
    return rc;
  }
  *out = s;
  return AG_OK;
}

ag_err_t ag__schema_compile(ag__schema **out, const json_t *schema,
                            const char *tool, ag_error_t *err) {
  return compile_root(out, schema, tool, true, err);
}

ag_err_t ag__schema_compile_value(ag__schema **out, const json_t *schema,
                                  ag_error_t *err) {
  return compile_root(out, schema, NULL, false, err);
}

/* ------------------------------------------------------------------------ */
/* Validation                                                               */
/* ------------------------------------------------------------------------ */

typedef struct seg {
  const char *key; /* NULL: an array index */
  size_t len;
  size_t index;
} seg;

/* Schemas entered for one value without descending into it ($ref, allOf,
 * anyOf, ...): a reference that leads back to itself ends here. */
#define MAX_HOPS 64

typedef struct vctx {
  ag_error_t *err;
  int depth;
  int hops;
  seg path[MAX_DEPTH];
} vctx;

/* "<pointer>: <what>", or just "<what>" at the root (see docs/tools.md). */
static ag_err_t vfail(vctx *v, const char *fmt, ...) AG__PRINTF(2, 3);
static ag_err_t vfail(vctx *v, const char *fmt, ...) {
  if (v->err == NULL)
    return AG_EINVAL;
  char msg[AG_ERROR_MSG_MAX];
  ag__buf b;
  ag__buf_init_fixed(&b, msg, sizeof(msg));
  for (int i = 0; i < v->depth; i++) {
    if (v->path[i].key != NULL)
      sb_token(&b, v->path[i].key, v->path[i].len);
    else
      ag__buf_printf_cut(&b, "/%zu", v->path[i].index);
  }
  if (v->depth > 0)
    ag__buf_addstr_cut(&b, ": ");
  va_list ap;
  va_start(ap, fmt);
  ag__buf_vprintf_cut(&b, fmt, ap);
  va_end(ap);
  return ag__set_error(v->err, AG_EINVAL, -1, "%s", msg);
}

static bool type_ok(unsigned types, const json_t *x) {
  switch (json_typeof(x)) {
  case JSON_OBJECT:
    return types & T_OBJECT;
  case JSON_ARRAY:
    return types & T_ARRAY;
  case JSON_STRING:
    return types & T_STRING;
  case JSON_INTEGER:
    return types & (T_NUMBER | T_INTEGER);
  case JSON_REAL: {
    if (types & T_NUMBER)
      return true;
    double d = json_real_value(x);
    return (types & T_INTEGER) && integral(d);
  }
  case JSON_TRUE:
  case JSON_FALSE:
    return types & T_BOOLEAN;
  default:
    return types & T_NULL;
  }
}

/* "string", "string or null", "string, number or null". */
static void types_text(ag__buf *b, unsigned types) {
  int n = 0, total = 0;
  for (int t = 0; t < N_TYPES; t++)
    total += (types >> t) & 1u;
  for (int t = 0; t < N_TYPES; t++) {
    if (!(types & (1u << t)))
      continue;
    if (n > 0)
      ag__buf_addstr_cut(b, n == total - 1 ? " or " : ", ");
    ag__buf_addstr_cut(b, type_names[t]);
    n++;
  }
}

static const prop *find_prop(const ag__schema *s, const char *k, size_t kl) {
  size_t lo = 0, hi = s->n_props;
  prop key = {{(char *)k, kl}, NULL};
  const prop *kp = &key;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int r = prop_cmp(&kp, &s->sorted[mid]);
    if (r == 0)
      return s->sorted[mid];
    if (r < 0)
      hi = mid;
    else
      lo = mid + 1;
  }
  return NULL;
}

static size_t code_points(const char *s, size_t n) {
  size_t cp = 0;
  for (size_t i = 0; i < n; i++)
    cp += ((unsigned char)s[i] & 0xC0) != 0x80;
  return cp;
}

static ag_err_t validate(vctx *v, const ag__schema *s, const json_t *x);

/* Matches a string against a pattern under the limits (see the note at the
 * top): AG_OK, or AG_EINVAL naming the pattern and why. */
static ag_err_t match_pattern(vctx *v, const pattern *p, const json_t *x) {
  pcre2_match_data *md = pcre2_match_data_create(1, NULL);
  if (md == NULL)
    return ag__set_error(v->err, AG_ENOMEM, -1, "out of memory");
  PCRE2_SPTR subj = (PCRE2_SPTR)json_string_value(x);
  PCRE2_SIZE len = json_string_length(x);
  int rc = pcre2_match(p->code, subj, len, 0, p->jit ? 0 : PCRE2_NO_JIT, md,
                       p->mctx);
  if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
    rc = pcre2_match(p->code, subj, len, 0, PCRE2_NO_JIT, md, p->mctx);
  pcre2_match_data_free(md);
  if (rc >= 0)
    return AG_OK;
  if (rc == PCRE2_ERROR_NOMATCH)
    return vfail(v, "must match pattern \"%s\"", p->text);
  if (rc == PCRE2_ERROR_NOMEMORY)
    return ag__set_error(v->err, AG_ENOMEM, -1, "out of memory");
  if (rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_DEPTHLIMIT ||
      rc == PCRE2_ERROR_HEAPLIMIT || rc == PCRE2_ERROR_JIT_STACKLIMIT)
    return vfail(v,
                 "pattern \"%s\" is too costly to match against this value "
                 "(the regular expression's match limit was reached); send a "
                 "shorter or simpler value",
                 p->text);
  PCRE2_UCHAR why[160];
  if (pcre2_get_error_message(rc, why, sizeof(why)) < 0)
    snprintf((char *)why, sizeof(why), "PCRE2 error %d", rc);
  return vfail(v, "cannot match pattern \"%s\": %s", p->text,
               (const char *)why);
}

static ag_err_t descend(vctx *v, const ag__schema *s, const json_t *x,
                        const char *key, size_t len, size_t index) {
  /* The compiled tree is at most MAX_DEPTH deep, but a recursive $ref
   * follows the arguments as deep as they go. */
  if (v->depth >= MAX_DEPTH)
    return vfail(v, "nested deeper than %d levels", MAX_DEPTH);
  v->path[v->depth].key = key;
  v->path[v->depth].len = len;
  v->path[v->depth].index = index;
  v->depth++;
  ag_err_t rc = validate(v, s, x);
  v->depth--;
  return rc;
}

static ag_err_t validate_object(vctx *v, const ag__schema *s, const json_t *x) {
  const char *k;
  size_t kl;
  json_t *val;
  if (s->additional == ADD_NONE) {
    json_object_keylen_foreach((json_t *)x, k, kl, val) {
      if (find_prop(s, k, kl) != NULL)
        continue;
      char q[MAX_SHOWN * 2 + 8];
      ag__buf b;
      ag__buf_init_fixed(&b, q, sizeof(q));
      sb_quoted(&b, k, kl);
      /* Suggest the closest declared property the arguments lack. */
      const prop *near = NULL;
      int best = 3;
      for (size_t i = 0; i < s->n_props; i++) {
        const prop *p = &s->props[i];
        int d = close_enough(k, kl, p->name.s, p->name.len);
        if (d >= 0 && d < best &&
            json_object_getn(x, p->name.s, p->name.len) == NULL) {
          best = d;
          near = p;
        }
      }
      if (near == NULL)
        return vfail(v, "unexpected property %s", q);
      char nq[MAX_SHOWN * 2 + 8];
      ag__buf_init_fixed(&b, nq, sizeof(nq));
      sb_quoted(&b, near->name.s, near->name.len);
      return vfail(v, "unexpected property %s; did you mean %s?", q, nq);
    }
  }
  for (size_t i = 0; i < s->n_required; i++) {
    if (json_object_getn(x, s->required[i].s, s->required[i].len) == NULL) {
      char q[MAX_SHOWN * 2 + 8];
      ag__buf b;
      ag__buf_init_fixed(&b, q, sizeof(q));
      sb_quoted(&b, s->required[i].s, s->required[i].len);
      return vfail(v, "missing required property %s", q);
    }
  }
  if (s->n_props == 0 && s->additional != ADD_SCHEMA)
    return AG_OK;
  json_object_keylen_foreach((json_t *)x, k, kl, val) {
    const prop *p = find_prop(s, k, kl);
    const ag__schema *sub = p != NULL                     ? p->schema
                            : s->additional == ADD_SCHEMA ? s->additional_schema
                                                          : NULL;
    if (sub == NULL)
      continue;
    ag_err_t rc = descend(v, sub, val, k, kl, 0);
    if (rc != AG_OK)
      return rc;
  }
  return AG_OK;
}

/* One subschema of a composition on the same value; the error (into
 * *err, scratch) only matters to the caller. */
static ag_err_t try_sub(vctx *v, const ag__schema *s, const json_t *x,
                        ag_error_t *err) {
  ag_error_t *keep = v->err;
  v->err = err;
  ag_err_t rc = validate(v, s, x); /* depth and hops come back as they were */
  v->err = keep;
  return rc;
}

/* anyOf / oneOf: how many of `list` the value matches (oneOf stops at
 * two). With none, the error to report: the value's type is none of the
 * branches' ("expected string or null, got integer"), or the error of the
 * first branch that takes its type. */
static ag_err_t match_some(vctx *v, ag__schema *const *list, size_t n,
                           const json_t *x, bool one, const char *kw) {
  size_t matched = 0, first = n;
  unsigned types = 0;
  ag_error_t scratch;
  for (size_t i = 0; i < n && matched < (one ? 2u : 1u); i++) {
    types |= list[i]->types != 0 ? list[i]->types : ~0u;
    ag_err_t rc = try_sub(v, list[i], x, &scratch);
    if (rc == AG_ENOMEM)
      return ag__set_error(v->err, AG_ENOMEM, -1, "out of memory");
    if (rc == AG_OK)
      matched++;
    else if (first == n && (list[i]->types == 0 || type_ok(list[i]->types, x)))
      first = i;
  }
  if (matched == 1 || (matched > 1 && !one))
    return AG_OK;
  if (matched > 1)
    return vfail(v, "matches more than one of the %zu schemas of %s", n, kw);
  if ((types & 0x7fu) != 0x7fu && !type_ok(types, x)) {
    char want[96];
    ag__buf b;
    ag__buf_init_fixed(&b, want, sizeof(want));
    types_text(&b, types);
    return vfail(v, "expected %s, got %s", want, ag__json_kind(x));
  }
  if (first < n)
    return try_sub(v, list[first], x, v->err);
  return vfail(v, "matches none of the %zu schemas of %s", n, kw);
}

/* $ref, allOf, anyOf, oneOf, not. */
static ag_err_t validate_composition(vctx *v, const ag__schema *s,
                                     const json_t *x) {
  ag_err_t rc = AG_OK;
  if (s->ref != NULL)
    rc = validate(v, s->ref, x);
  for (size_t i = 0; rc == AG_OK && i < s->n_all_of; i++)
    rc = validate(v, s->all_of[i], x);
  if (rc == AG_OK && s->n_any_of > 0)
    rc = match_some(v, s->any_of, s->n_any_of, x, false, "anyOf");
  if (rc == AG_OK && s->n_one_of > 0)
    rc = match_some(v, s->one_of, s->n_one_of, x, true, "oneOf");
  if (rc == AG_OK && s->not_schema != NULL) {
    ag_error_t scratch;
    ag_err_t nr = try_sub(v, s->not_schema, x, &scratch);
    if (nr == AG_OK)
      rc = vfail(v, "must not match the schema of \"not\"");
    else if (nr == AG_ENOMEM)
      rc = ag__set_error(v->err, AG_ENOMEM, -1, "out of memory");
  }
  return rc;
}

static ag_err_t validate(vctx *v, const ag__schema *s, const json_t *x) {
  if (s->never)
    return vfail(v, "not allowed");
  if (s->ref != NULL || s->n_all_of > 0 || s->n_any_of > 0 || s->n_one_of > 0 ||
      s->not_schema != NULL) {
    if (++v->hops > MAX_HOPS) {
      v->hops--;
      return vfail(v,
                   "the schema refers to itself without end (more than "
                   "%d references for one value)",
                   MAX_HOPS);
    }
    ag_err_t rc = validate_composition(v, s, x);
    v->hops--;
    if (rc != AG_OK)
      return rc;
  }
  if (s->types != 0 && !type_ok(s->types, x)) {
    char want[96];
    ag__buf b;
    ag__buf_init_fixed(&b, want, sizeof(want));
    types_text(&b, s->types);
    return vfail(v, "expected %s, got %s", want, ag__json_kind(x));
  }
  if (s->const_value != NULL && !json_eq(x, s->const_value))
    return vfail(v, "must equal %s", s->const_text);
  if (s->enum_values != NULL) {
    bool found = false;
    for (size_t i = 0; i < json_array_size(s->enum_values) && !found; i++)
      found = json_eq(x, json_array_get(s->enum_values, i));
    if (!found)
      return vfail(v, "must be one of %s", s->enum_text);
  }
  switch (json_typeof(x)) {
  case JSON_STRING: {
    if (s->has_min_len || s->has_max_len) {
      size_t cp = code_points(json_string_value(x), json_string_length(x));
      if (s->has_min_len && cp < s->min_len)
        return vfail(v, "must be at least %zu character%s", s->min_len,
                     s->min_len == 1 ? "" : "s");
      if (s->has_max_len && cp > s->max_len)
        return vfail(v, "must be at most %zu character%s", s->max_len,
                     s->max_len == 1 ? "" : "s");
    }
    if (s->pattern != NULL)
      return match_pattern(v, s->pattern, x);
    return AG_OK;
  }
  case JSON_INTEGER:
  case JSON_REAL:
    if (s->has_min && cmp_num(x, &s->minimum) < 0)
      return vfail(v, "must be >= %s", s->minimum.text);
    if (s->has_max && cmp_num(x, &s->maximum) > 0)
      return vfail(v, "must be <= %s", s->maximum.text);
    if (s->has_xmin && cmp_num(x, &s->xmin) <= 0)
      return vfail(v, "must be > %s", s->xmin.text);
    if (s->has_xmax && cmp_num(x, &s->xmax) >= 0)
      return vfail(v, "must be < %s", s->xmax.text);
    return AG_OK;
  case JSON_ARRAY: {
    size_t n = json_array_size(x);
    if (s->has_min_items && n < s->min_items)
      return vfail(v, "must have at least %zu item%s", s->min_items,
                   s->min_items == 1 ? "" : "s");
    if (s->has_max_items && n > s->max_items)
      return vfail(v, "must have at most %zu item%s", s->max_items,
                   s->max_items == 1 ? "" : "s");
    if (s->items != NULL) {
      for (size_t i = 0; i < n; i++) {
        ag_err_t rc = descend(v, s->items, json_array_get(x, i), NULL, 0, i);
        if (rc != AG_OK)
          return rc;
      }
    }
    return AG_OK;
  }
  case JSON_OBJECT:
    return validate_object(v, s, x);
  default:
    return AG_OK;
  }
}

ag_err_t ag__schema_validate(const ag__schema *s, const json_t *value,
                             ag_error_t *err) {
  if (value == NULL)
    return ag__set_error(err, AG_EINVAL, -1, "no value to validate");
  if (s == NULL)
    return AG_OK;
  vctx v;
  v.err = err;
  v.depth = 0;
  v.hops = 0;
  return validate(&v, s, value);
}
