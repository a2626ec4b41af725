/*
 * src/audit/traj_tape.c - the neutral trajectory ({"steps": [...]}) read
 * from the JCS tokenizer's tape (src/core/jcs.c) instead of a jansson tree.
 *
 * jansson builds a tree of every value and was most of an audit's time; the
 * tokenizer validates the same text several times faster and writes one
 * flat tape, from which the run is read here and its texts copied once into
 * the trajectory's arena. The reading is the same as traj_neutral.c's on
 * every input it takes: anything it is not sure of - a body the tape
 * refuses (a duplicate key, a number beyond a double, bad UTF-8, nesting
 * past TAPE_DEPTH, data after the value), a shape traj_neutral.c would
 * refuse or read through a path not written here (content parts as a
 * step's text, a "\u0000" anywhere) - returns AG__TB_FALLBACK and the caller
 * reads the input with jansson, whose messages and results are the reference. A
 * call's arguments given as a JSON value (not a string) are handed to jansson
 * alone (they are small), so their text is byte for byte the tree path's.
 * The test `audit_tape::*` holds the two readings equal on every bundled
 * run and on generated ones.
 */
#define _GNU_SOURCE /* memmem */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "builder.h"

#define TAPE_DEPTH 256 /* jansson takes 2048; deeper inputs fall back */

typedef struct tape {
  ag__jcs *j;
  const char *s;
  size_t n;
} tape;

static bool t_is(const tape *t, size_t i, int type) {
  return i != 0 && ag__jcs_tok_type(t->j, i) == type;
}

/* The value of member `key` of object token `obj`, or 0. */
static size_t t_get(const tape *t, size_t obj, const char *key) {
  return ag__jcs_get(t->j, obj, key);
}

/* String token i copied (decoded) into the arena, NUL-terminated. */
static const char *t_str(builder *b, const tape *t, size_t i, size_t *len) {
  const char *raw;
  size_t n = ag__jcs_str_raw(t->j, i, &raw);
  char *o = ag__tb_alloc(b, n + 1);
  if (o == NULL)
    return NULL;
  if (ag__jcs_str_escaped(t->j, i)) {
    n = ag__jcs_str_decode(t->j, i, o);
  } else {
    memcpy(o, raw, n);
    o[n] = '\0';
  }
  *len = n;
  return o;
}

/* Whether string token i equals lit (decoded). */
static bool t_eq(const tape *t, size_t i, const char *lit) {
  if (!t_is(t, i, AG__JT_STR))
    return false;
  const char *raw;
  size_t n = ag__jcs_str_raw(t->j, i, &raw), l = strlen(lit);
  return !ag__jcs_str_escaped(t->j, i) && n == l && memcmp(raw, lit, l) == 0;
}

/* A number token's value, read as jansson reads it here (a double). */
static bool t_num(const tape *t, size_t i, double *out) {
  if (!t_is(t, i, AG__JT_NUM))
    return false;
  size_t off = ag__jcs_tok_off(t->j, i), k = off;
  char buf[64];
  while (k < t->n && k - off < sizeof buf - 1 &&
         strchr("0123456789+-.eE", t->s[k]) != NULL)
    k++;
  if (k - off >= sizeof buf - 1)
    return false;
  memcpy(buf, t->s + off, k - off);
  buf[k - off] = '\0';
  char *end = NULL;
  *out = strtod(buf, &end);
  return end != buf && *end == '\0';
}

/* ag__tb_truthy on a token: not absent, null, false or "". */
static bool t_truthy(const tape *t, size_t i) {
  if (i == 0)
    return false;
  int ty = ag__jcs_tok_type(t->j, i);
  if (ty == AG__JT_NULL || ty == AG__JT_FALSE)
    return false;
  if (ty == AG__JT_STR) {
    const char *raw;
    return ag__jcs_str_raw(t->j, i, &raw) > 0;
  }
  return true;
}

/* ag__tb_usage's sum, or -1; false for anything it would refuse. */
static bool t_usage(const tape *t, size_t st, int64_t *tokens) {
  size_t u = t_get(t, st, "usage");
  if (u == 0 || t_is(t, u, AG__JT_NULL))
    return true;
  if (!t_is(t, u, AG__JT_OBJ))
    return false;
  static const char *const names[] = {"prompt_tokens", "completion_tokens",
                                      "input_tokens", "output_tokens"};
  int64_t sum = 0;
  bool any = false;
  for (size_t k = 0; k < 4; k++) {
    size_t v = t_get(t, u, names[k]);
    if (v == 0 || t_is(t, v, AG__JT_NULL))
      continue;
    double d;
    if (!t_num(t, v, &d) || d < 0 || d != (double)(int64_t)d || d > 1e15)
      return false;
    sum += (int64_t)d;
    any = true;
  }
  if (any)
    *tokens = sum;
  return true;
}

/* ag__tb_time: -1 when absent; false for anything it would refuse. */
static bool t_time(const tape *t, size_t st, const char *key, int64_t *out) {
  size_t v = t_get(t, st, key);
  *out = -1;
  if (v == 0 || t_is(t, v, AG__JT_NULL))
    return true;
  double d;
  if (!t_num(t, v, &d) || !(d >= 0 && d < 9.0e15))
    return false;
  *out = (int64_t)d;
  return true;
}

/* A call's arguments: a string decoded, null or absent "", any other value
 * as the tree path writes it (jansson, compact). */
static ag_err_t t_args(builder *b, const tape *t, size_t call, size_t v,
                       const char **out, size_t *len) {
  if (v == 0 || t_is(t, v, AG__JT_NULL)) {
    *out = "";
    *len = 0;
    return AG_OK;
  }
  if (t_is(t, v, AG__JT_STR))
    return (*out = t_str(b, t, v, len)) != NULL ? AG_OK : ag__tb_nomem(b);
  size_t start, n = ag__jcs_member_span(t->j, v - 1, &start);
  (void)call;
  if (ag__jcs_as_jansson_writes(t->j, v, t->s + start, n)) {
    /* the source is the tree path's text already: copied, not parsed */
    char *o = ag__tb_alloc(b, n + 1);
    if (o == NULL)
      return ag__tb_nomem(b);
    memcpy(o, t->s + start, n);
    o[n] = '\0';
    *out = o;
    *len = n;
    return AG_OK;
  }
  json_t *val = json_loadb(t->s + start, n, JFLAGS | JSON_DECODE_ANY, NULL);
  if (val == NULL)
    return AG__TB_FALLBACK;
  ag_err_t rc = ag__tb_args(b, val, out, len); /* dumped into the arena */
  json_decref(val);
  return rc;
}

/* One step; AG_OK, AG__TB_FALLBACK or an allocation failure. */
static ag_err_t t_step(builder *b, const tape *t, size_t st, size_t i) {
  ag_err_t rc;
  size_t calls = t_get(t, st, "calls"), results = t_get(t, st, "results");
  if ((calls != 0 && !t_is(t, calls, AG__JT_ARR)) ||
      (results != 0 && !t_is(t, results, AG__JT_ARR)) ||
      (calls == 0 && results == 0))
    return AG__TB_FALLBACK;
  size_t nc = 0, nr = 0;
  for (size_t c = calls ? calls + 1 : 0,
              e = calls ? ag__jcs_tok_next(t->j, calls) : 0;
       c < e; c = ag__jcs_tok_next(t->j, c))
    nc++;
  for (size_t c = results ? results + 1 : 0,
              e = results ? ag__jcs_tok_next(t->j, results) : 0;
       c < e; c = ag__jcs_tok_next(t->j, c))
    nr++;
  if (i > 0 && t_truthy(t, t_get(t, st, "user_msg_before")))
    ag__tb_user(b, -1);
  if ((rc = ag__tb_step(b, 0)) != AG_OK)
    return rc;
  bstep *s = ag__tb_cur_step(b);
  int64_t tokens = s->tokens;
  if (!t_usage(t, st, &tokens))
    return AG__TB_FALLBACK;
  s->tokens = tokens;
  size_t say = t_get(t, st, "text");
  if (say != 0) {
    if (t_is(t, say, AG__JT_NULL)) {
      s->text = "";
      s->text_len = 0;
    } else if (t_is(t, say, AG__JT_STR)) {
      if ((s->text = t_str(b, t, say, &s->text_len)) == NULL)
        return ag__tb_nomem(b);
    } else {
      return AG__TB_FALLBACK; /* content parts: the tree path joins them */
    }
    s->has_text = true;
  }
  int64_t t_req, t_done;
  if (!t_time(t, st, "t_ms", &t_req) || !t_time(t, st, "t_done_ms", &t_done))
    return AG__TB_FALLBACK;
  s->t_req = t_req;
  s->t_resp = t_req;
  s->t_done = t_done < 0 ? t_req : t_done;

  size_t n_rejected = 0;
  for (size_t c = calls ? calls + 1 : 0,
              e = calls ? ag__jcs_tok_next(t->j, calls) : 0;
       c < e; c = ag__jcs_tok_next(t->j, c)) {
    if (!t_is(t, c, AG__JT_OBJ))
      return AG__TB_FALLBACK;
    size_t name = t_get(t, c, "name");
    if (!t_is(t, name, AG__JT_STR))
      return AG__TB_FALLBACK;
    size_t args = t_get(t, c, "args");
    if (args == 0)
      args = t_get(t, c, "arguments");
    const char *a, *nm;
    size_t al, nl;
    if ((rc = t_args(b, t, c, args, &a, &al)) != AG_OK)
      return rc;
    if ((nm = t_str(b, t, name, &nl)) == NULL)
      return ag__tb_nomem(b);
    if (memchr(nm, '\0', nl) != NULL)
      return AG__TB_FALLBACK; /* a name the tree path reads up to its NUL */
    if (t_truthy(t, t_get(t, c, "rejected_by_harness")))
      n_rejected++;
    if ((rc = ag__tb_call(b, nm, a, al, NULL, false)) != AG_OK)
      return rc;
    s = ag__tb_cur_step(b);
  }
  bool rejected = t_truthy(t, t_get(t, st, "rejected_by_harness"));
  if (n_rejected > 0 && n_rejected < nc && !rejected)
    return AG__TB_FALLBACK;
  rejected = rejected || (nc > 0 && n_rejected == nc) || (nc == 0 && nr == 1);
  s->rejected = rejected;
  if (!rejected && nr != nc)
    return AG__TB_FALLBACK;

  size_t keep = rejected ? 1 : nr, k = 0;
  size_t rv = results ? results + 1 : 0,
         re = results ? ag__jcs_tok_next(t->j, results) : 0;
  for (; k < keep; k++, rv = rv < re ? ag__jcs_tok_next(t->j, rv) : rv) {
    if ((rc = ag__tb_result(b)) != AG_OK)
      return rc;
    ag_traj_result *r = &b->results[b->n_results - 1];
    b->answered[b->n_results - 1] = true;
    if (rv >= re) { /* a rejection recorded without its observation */
      r->outcome = AG_OUTCOME_ERROR;
      continue;
    }
    if (!t_is(t, rv, AG__JT_OBJ))
      return AG__TB_FALLBACK;
    size_t ok = t_get(t, rv, "ok"), text = t_get(t, rv, "text");
    if (ok != 0 && !t_is(t, ok, AG__JT_TRUE) && !t_is(t, ok, AG__JT_FALSE))
      return AG__TB_FALLBACK;
    if (text != 0 && !t_is(t, text, AG__JT_STR) && !t_is(t, text, AG__JT_NULL))
      return AG__TB_FALLBACK;
    r->outcome = rejected || t_is(t, ok, AG__JT_FALSE) ? AG_OUTCOME_ERROR
                                                       : AG_OUTCOME_OK;
    if (t_is(t, text, AG__JT_STR) &&
        (r->text = t_str(b, t, text, &r->text_len)) == NULL)
      return ag__tb_nomem(b);
  }
  return AG_OK;
}

ag_err_t ag__tb_parse_neutral_tape(builder *b, const char *buf, size_t len) {
  tape t = {NULL, buf, len};
  ag_error_t err;
  size_t ntok = 0;
  ag_err_t rc = AG__TB_FALLBACK;
  /* jansson takes "\u0000" in string values but not in keys: any input
   * that spells it is the tree's to read */
  if (len == 0 || buf[0] != '{' || memmem(buf, len, "\\u0000", 6) != NULL ||
      ag__jcs_tape_new(&t.j, len, TAPE_DEPTH, &err) != AG_OK)
    return AG__TB_FALLBACK;
  if (ag__jcs_tape(t.j, buf, len, &ntok, &err) != AG_OK ||
      ag__jcs_tok_type(t.j, 0) != AG__JT_OBJ)
    goto out;
  size_t steps = t_get(&t, 0, "steps");
  if (!t_is(&t, steps, AG__JT_ARR))
    goto out;
  /* the run's outcome and source, as ag__tb_outcome and ag__tb_source */
  size_t oc = t_get(&t, 0, "outcome");
  b->f->pub.outcome = t_eq(&t, oc, "resolved")     ? AG_RUN_RESOLVED
                      : t_eq(&t, oc, "unresolved") ? AG_RUN_UNRESOLVED
                                                   : AG_RUN_UNKNOWN;
  if (t_is(&t, oc, AG__JT_STR) && ag__jcs_str_escaped(t.j, oc))
    goto out; /* an escaped spelling: the tree path decides */
  static const char *const keys[] = {"source", "id", "instance_id"};
  for (size_t k = 0; k < 3 && b->f->pub.source == NULL; k++) {
    size_t v = t_get(&t, 0, keys[k]);
    size_t n;
    if (t_is(&t, v, AG__JT_STR) &&
        (b->f->pub.source = t_str(b, &t, v, &n)) == NULL) {
      rc = ag__tb_nomem(b);
      goto out;
    }
  }
  b->unit = "step";
  size_t i = 0;
  for (size_t st = steps + 1, e = ag__jcs_tok_next(t.j, steps); st < e;
       st = ag__jcs_tok_next(t.j, st), i++) {
    b->unit_no = i + 1;
    if (!t_is(&t, st, AG__JT_OBJ))
      goto out;
    if ((rc = t_step(b, &t, st, i)) != AG_OK)
      goto out;
  }
  b->f->pub.format = AG_TRAJ_NEUTRAL;
  rc = AG_OK;
out:
  ag__jcs_free(t.j);
  return rc;
}
