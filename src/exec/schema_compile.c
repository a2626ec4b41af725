/*
 * src/exec/schema_compile.c - a tool's parameter schema compiled into the
 * tree of ag__schema nodes (schema_node.h): one function per keyword, the
 * $ref targets compiled once, every bound checked here so that validation
 * (schema.c) only reads.
 */
#include "schema_node.h"

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
  ag__sch_sb_token(&c->pb, s, n);
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
      size_t tl = strlen(ag__sch_type_names[t]);
      if (tl == len && memcmp(ag__sch_type_names[t], name, len) == 0)
        idx = t;
      else if (near == NULL &&
               ag__sch_close_enough(name, len, ag__sch_type_names[t], tl) >= 0)
        near = ag__sch_type_names[t];
    }
    if (idx < 0) {
      char q[MAX_SHOWN * 2 + 8];
      ag__buf b;
      ag__buf_init_fixed(&b, q, sizeof(q));
      ag__sch_sb_quoted(&b, name, len);
      if (near != NULL)
        return cfail(c, "unknown type %s; did you mean \"%s\"?", q, near);
      return cfail(c,
                   "unknown type %s; use object, array, string, number, "
                   "integer, boolean or null",
                   q);
    }
    unsigned bit = 1u << idx;
    if (s->types & bit)
      return cfail(c, "type \"%s\" is listed twice", ag__sch_type_names[idx]);
    s->types |= bit;
  }
  return AG_OK;
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
  qsort(s->sorted, s->n_props, sizeof(*s->sorted), ag__sch_prop_cmp);
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
        ag__sch_sb_quoted(&b, name, len);
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
  if (!ag__sch_as_count(v, out))
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
  ag__sch_num_from(&s->minimum, v);
  return AG_OK;
}
static ag_err_t kw_maximum(cctx *c, ag__schema *s, const json_t *v, int depth) {
  (void)depth;
  if (!json_is_number(v))
    return cfail(c, "must be a number");
  s->has_max = true;
  ag__sch_num_from(&s->maximum, v);
  return AG_OK;
}

static ag_err_t kw_xminimum(cctx *c, ag__schema *s, const json_t *v,
                            int depth) {
  (void)depth;
  if (!json_is_number(v))
    return cfail(c, "must be a number (the draft 6 and later form)");
  s->has_xmin = true;
  ag__sch_num_from(&s->xmin, v);
  return AG_OK;
}
static ag_err_t kw_xmaximum(cctx *c, ag__schema *s, const json_t *v,
                            int depth) {
  (void)depth;
  if (!json_is_number(v))
    return cfail(c, "must be a number (the draft 6 and later form)");
  s->has_xmax = true;
  ag__sch_num_from(&s->xmax, v);
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
  if (ag__sch_deeper_than(v, MAX_DEPTH + 1))
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
  if (ag__sch_deeper_than(v, MAX_DEPTH))
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
  if (s->has_min && s->has_max &&
      ag__sch_cmp_nums(&s->minimum, &s->maximum) > 0)
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
        ag__sch_sb_quoted(&b, s->required[i].s, s->required[i].len);
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
      ag__sch_sb_quoted(&b, k, kl);
      const char *near = NULL;
      int best = 3;
      for (size_t i = 0; i < N_KEYWORDS; i++) {
        int d = ag__sch_close_enough(k, kl, keywords[i].name,
                                     strlen(keywords[i].name));
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
