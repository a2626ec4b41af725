/*
 * src/exec/schema.c - a call's arguments validated against a compiled
 * parameter schema (schema_node.h has the design: the tree, threading,
 * regexes, bounds and the order of checks; schema_compile.c builds it).
 */
#include "schema_node.h"

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
      ag__sch_sb_token(&b, v->path[i].key, v->path[i].len);
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
    return (types & T_INTEGER) && ag__sch_integral(d);
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
    ag__buf_addstr_cut(b, ag__sch_type_names[t]);
    n++;
  }
}

static const prop *find_prop(const ag__schema *s, const char *k, size_t kl) {
  size_t lo = 0, hi = s->n_props;
  prop key = {{(char *)k, kl}, NULL};
  const prop *kp = &key;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int r = ag__sch_prop_cmp(&kp, &s->sorted[mid]);
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
      ag__sch_sb_quoted(&b, k, kl);
      /* Suggest the closest declared property the arguments lack. */
      const prop *near = NULL;
      int best = 3;
      for (size_t i = 0; i < s->n_props; i++) {
        const prop *p = &s->props[i];
        int d = ag__sch_close_enough(k, kl, p->name.s, p->name.len);
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
      ag__sch_sb_quoted(&b, near->name.s, near->name.len);
      return vfail(v, "unexpected property %s; did you mean %s?", q, nq);
    }
  }
  for (size_t i = 0; i < s->n_required; i++) {
    if (json_object_getn(x, s->required[i].s, s->required[i].len) == NULL) {
      char q[MAX_SHOWN * 2 + 8];
      ag__buf b;
      ag__buf_init_fixed(&b, q, sizeof(q));
      ag__sch_sb_quoted(&b, s->required[i].s, s->required[i].len);
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
  if (s->const_value != NULL && !ag__sch_json_eq(x, s->const_value))
    return vfail(v, "must equal %s", s->const_text);
  if (s->enum_values != NULL) {
    bool found = false;
    for (size_t i = 0; i < json_array_size(s->enum_values) && !found; i++)
      found = ag__sch_json_eq(x, json_array_get(s->enum_values, i));
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
    if (s->has_min && ag__sch_cmp_num(x, &s->minimum) < 0)
      return vfail(v, "must be >= %s", s->minimum.text);
    if (s->has_max && ag__sch_cmp_num(x, &s->maximum) > 0)
      return vfail(v, "must be <= %s", s->maximum.text);
    if (s->has_xmin && ag__sch_cmp_num(x, &s->xmin) <= 0)
      return vfail(v, "must be > %s", s->xmin.text);
    if (s->has_xmax && ag__sch_cmp_num(x, &s->xmax) >= 0)
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
