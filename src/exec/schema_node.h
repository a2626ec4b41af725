/*
 * src/exec/schema_node.h - what the parts of the JSON Schema subset share
 * (schema.c: validation; schema_compile.c: compilation; schema_util.c:
 * messages, numbers and values): the compiled node, its bounds, and the
 * helpers. Not installed, not API; ag__schema_* in internal.h is the
 * interface.
 *
 * The JSON Schema subset that tool parameters use: compiled once when a
 * tool is registered, then validated against every call's arguments.
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
#ifndef AG_EXEC_SCHEMA_NODE_H
#define AG_EXEC_SCHEMA_NODE_H

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
extern const char *const ag__sch_type_names[N_TYPES];

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

/* ---- schema_util.c ------------------------------------------------------ */

/* Messages: s quoted, JSON-style, cut to MAX_SHOWN bytes; "/" and one RFC
 * 6901 token; the distance of input to cand when close enough to suggest,
 * else -1. */
void ag__sch_sb_quoted(ag__buf *b, const char *s, size_t n);
void ag__sch_sb_token(ag__buf *b, const char *s, size_t n);
int ag__sch_close_enough(const char *input, size_t li, const char *cand,
                         size_t lc);
/* Numbers, exactly for integers: whether d has no fraction; a value
 * against a bound (<0, 0, >0); a bound read from a schema value. */
bool ag__sch_integral(double d);
int ag__sch_cmp_nums(const num *a, const num *b);
int ag__sch_cmp_num(const json_t *v, const num *b);
void ag__sch_num_from(num *n, const json_t *v);
/* Values as JSON Schema compares them (1 equals 1.0); nesting past limit;
 * a non-negative whole number (a count keyword); two properties by name
 * (qsort and bsearch over `sorted`). */
bool ag__sch_json_eq(const json_t *a, const json_t *b);
bool ag__sch_deeper_than(const json_t *v, int limit);
bool ag__sch_as_count(const json_t *v, size_t *out);
int ag__sch_prop_cmp(const void *a, const void *b);

#endif /* AG_EXEC_SCHEMA_NODE_H */
