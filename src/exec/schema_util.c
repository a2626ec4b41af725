/*
 * src/exec/schema_util.c - the JSON Schema subset's shared helpers
 * (schema_node.h): bounded message text, suggestions, numbers compared
 * exactly, values compared as JSON Schema compares them.
 */
#include "schema_node.h"

const char *const ag__sch_type_names[N_TYPES] = {
    "object", "array", "string", "number", "integer", "boolean", "null"};

/* ------------------------------------------------------------------------ */
/* Bounded text buffers for messages                                        */
/* ------------------------------------------------------------------------ */

/* At most `max` bytes of s[0..n), cut at a character start. */
static size_t shown_len(const char *s, size_t n, size_t max) {
  return n <= max ? n : ag__utf8_back(s, max);
}

/* s as a JSON-style quoted string, cut to MAX_SHOWN bytes with "...". */
void ag__sch_sb_quoted(ag__buf *b, const char *s, size_t n) {
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
void ag__sch_sb_token(ag__buf *b, const char *s, size_t n) {
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
int ag__sch_close_enough(const char *input, size_t li, const char *cand,
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
bool ag__sch_integral(double d) {
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
  return ag__sch_integral(d) ? 0 : -1; /* i == floor(d) < d */
}

static void num_of(num *n, const json_t *v) {
  n->is_int = json_is_integer(v);
  n->i = n->is_int ? json_integer_value(v) : 0;
  n->d = n->is_int ? (double)n->i : json_real_value(v);
}

int ag__sch_cmp_nums(const num *a, const num *b) {
  if (a->is_int && b->is_int)
    return (a->i > b->i) - (a->i < b->i);
  if (a->is_int)
    return cmp_int_real(a->i, b->d);
  if (b->is_int)
    return -cmp_int_real(b->i, a->d);
  return (a->d > b->d) - (a->d < b->d);
}

int ag__sch_cmp_num(const json_t *v, const num *b) {
  num a;
  num_of(&a, v);
  return ag__sch_cmp_nums(&a, b);
}

void ag__sch_num_from(num *n, const json_t *v) {
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
  return ag__sch_cmp_num(a, &n) == 0;
}

/* Deep equality where numbers compare by value (1 == 1.0). Recursion is
 * bounded by the depth of the schema side, capped at compile time. */
bool ag__sch_json_eq(const json_t *a, const json_t *b) {
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
      if (!ag__sch_json_eq(json_array_get(a, i), json_array_get(b, i)))
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
      if (vb == NULL || !ag__sch_json_eq(va, vb))
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
bool ag__sch_deeper_than(const json_t *v, int limit) {
  if (!json_is_array(v) && !json_is_object(v))
    return false;
  if (limit <= 0)
    return true;
  if (json_is_array(v)) {
    for (size_t i = 0; i < json_array_size(v); i++)
      if (ag__sch_deeper_than(json_array_get(v, i), limit - 1))
        return true;
    return false;
  }
  const char *k;
  json_t *x;
  json_object_foreach((json_t *)v, k, x) {
    if (ag__sch_deeper_than(x, limit - 1))
      return true;
  }
  return false;
}

/* Non-negative ag__sch_integral numbers (JSON Schema: 3.0 is an integer). */
bool ag__sch_as_count(const json_t *v, size_t *out) {
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
    if (d < 0 || !ag__sch_integral(d))
      return false;
    *out = d >= 18446744073709551615.0 ? SIZE_MAX : (size_t)d;
    return true;
  }
  return false;
}

/* Two properties (pointers to them) by name, bytewise: the order of a
 * node's `sorted`, and of the search in it. */
int ag__sch_prop_cmp(const void *a, const void *b) {
  const prop *pa = *(const prop *const *)a, *pb = *(const prop *const *)b;
  size_t n = pa->name.len < pb->name.len ? pa->name.len : pb->name.len;
  int r = memcmp(pa->name.s, pb->name.s, n);
  if (r != 0)
    return r;
  return (pa->name.len > pb->name.len) - (pa->name.len < pb->name.len);
}
