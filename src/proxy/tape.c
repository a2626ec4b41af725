/*
 * src/proxy/tape.c - the decision read from the JCS tokenizer's tape
 * (internal.h: ag__px_tape_decide), and the request's attribution read the
 * same way (attr.h).
 *
 * jansson builds a tree at about 60 MB/s here: 1.2 ms for a 500-message
 * (76 KB) request, more than the whole decision may take. The tokenizer
 * (src/core/jcs.c) validates the same text and writes a flat tape several
 * times faster, so the decision reads the request from the tape: the
 * shape's tape_turn (wire.h) tells the turn to a sink here, which builds
 * the fast_traj the tree path would build, with the strings decoded into
 * one buffer. Anything the reader does not take goes to the jansson path,
 * whose decisions and messages are the reference (the parity tests in
 * tests/runtime/test_proxy.c replay both).
 */
#define _GNU_SOURCE /* memmem */
#include "internal.h"

/* The turn as ag__px_fast_turn builds it from the tree: the sink a shape's
 * tape_turn tells the turn to (wire.h). The checks every shape shares are
 * here: a call answered once, by its own reply's results; ids unique in a
 * reply; every call of a reply answered before the next reply. */
typedef struct turn_build {
  fast_traj f;
  bool alloc;    /* f's arrays are made */
  size_t si, ci; /* steps and calls so far */
  size_t step0;  /* the current step's first call */
  bool in_step;
} turn_build;

static bool all_answered(const turn_build *b) {
  for (size_t k = b->step0; b->in_step && k < b->ci; k++)
    if (!b->f.answered[k])
      return false;
  return true;
}

static int tb_begin(void *user, size_t n_steps, size_t n_calls) {
  turn_build *b = user;
  if (ag__px_t_alloc(&b->f, n_steps, n_calls) < 0)
    return -1;
  b->alloc = true;
  return 0;
}

static bool tb_step(void *user, const char *text, size_t len) {
  turn_build *b = user;
  if (!all_answered(b))
    return false;
  ag_traj_step *st = &b->f.steps[b->si++];
  b->in_step = true;
  b->step0 = b->ci;
  st->text = text;
  st->text_len = len;
  ag__px_t_step(st, &b->f, b->ci);
  return true;
}

static bool tb_call(void *user, const char *id, const char *name,
                    const char *args, size_t args_len) {
  turn_build *b = user;
  for (size_t q = b->step0; q < b->ci; q++)
    if (strcmp(b->f.ids[q], id) == 0)
      return false; /* a repeated id */
  size_t ci = b->ci++;
  b->f.ids[ci] = id;
  b->f.calls[ci].name = name;
  b->f.calls[ci].args = args;
  b->f.calls[ci].args_len = args_len;
  b->f.results[ci].text = "";
  ag_traj_step *st = &b->f.steps[b->si - 1];
  st->n_calls = st->n_results = b->ci - b->step0;
  return true;
}

static bool tb_result(void *user, const char *id, const char *text, size_t len,
                      bool is_error) {
  turn_build *b = user;
  if (!b->in_step)
    return false;
  ag_traj_result *res = ag__px_t_answer(&b->f, b->step0, b->ci, id);
  if (res == NULL)
    return false;
  res->outcome = is_error ? AG_OUTCOME_ERROR : AG_OUTCOME_OK;
  res->category = AG_CAT_AUTO;
  res->text = text;
  res->text_len = len;
  return true;
}

/* The turn of the request on tape t, read by shape w into *f: 1 (f
 * filled, perhaps with no step), 0 (the tree reads it), -1 (out of
 * memory). */
static int tape_turn(const ag__wire *w, ag__wtape *t, size_t conv,
                     fast_traj *f) {
  turn_build b;
  memset(&b, 0, sizeof b);
  const ag__turn_sink sink = {tb_begin, tb_step, tb_call, tb_result, &b};
  int fr = w->tape_turn(t, conv, &sink);
  if (fr > 0 && !all_answered(&b))
    fr = 0;
  if (fr <= 0) {
    if (b.alloc)
      ag__px_fast_free(&b.f);
    return fr;
  }
  *f = b.f;
  ag__px_t_done(f, b.si, b.ci); /* f->t points into f: made in place */
  return 1;
}

/* Whether a body of len bytes is read with a reader of p's pool: those
 * are made for any body p takes (up to its max_body). */
static bool pooled(const ag_proxy *p, size_t len) {
  return p != NULL && len <= p->max_body && p->max_body <= UINT32_MAX - 2;
}

/* A reader's scratch for a body of len bytes: one kept by p, else a new
 * one. */
static ag_err_t reader_get(ag_proxy *p, size_t len, ag__jcs **j,
                           ag_error_t *err) {
  if (!pooled(p, len))
    return ag__jcs_tape_new(j, len, TAPE_DEPTH, err);
  if ((*j = ag__px_pool_take(&p->readers)) != NULL)
    return AG_OK;
  return ag__jcs_tape_new(j, p->max_body, TAPE_DEPTH, err);
}

/* Gives back the reader reader_get(p, len) gave: kept for the next
 * request, unless it is not the pool's, a large body grew it past
 * READER_RETAIN, or p has enough (then it is freed). */
static void reader_put(ag_proxy *p, size_t len, ag__jcs *j) {
  if (j != NULL && (!pooled(p, len) || ag__jcs_held(j) > READER_RETAIN ||
                    !ag__px_pool_give(&p->readers, j)))
    ag__jcs_free(j);
}

ag_err_t ag__px_body_tape(ag_proxy *p, req_ctx *q) {
  if (q->tape_read)
    return q->tape_rc;
  ag_error_t err;
  q->tape_read = true;
  q->tape_rc = AG_EJSON;
  if (q->body == NULL || q->len == 0)
    return q->tape_rc;
  q->tape_rc = reader_get(p, q->len, &q->tape, &err);
  if (q->tape_rc == AG_OK)
    q->tape_rc = ag__jcs_tape(q->tape, q->body, q->len, &q->tape_n, &err);
  return q->tape_rc;
}

void ag__px_body_tape_free(ag_proxy *p, req_ctx *q) {
  reader_put(p, q->len, q->tape);
  q->tape = NULL;
  q->tape_read = false;
}

ag_err_t ag__px_tape_decide(ag_proxy *p, req_ctx *q, const ag_config *cfg,
                            const char *body, size_t len, const ag__wire *w,
                            ag_guard **g, ag_verdict *v, bool *stream,
                            ag_action *act) {
  *g = NULL;
  ag__wtape t = {NULL, body, len, 0, NULL, 0, 0};
  ag_err_t out = AG_ENOTFOUND;
  ag_error_t err;
  if (body == NULL || len == 0 || w->tape_turn == NULL)
    return AG_ENOTFOUND;
  ag_err_t rc;
  if (q != NULL) { /* q's body, read once (its attribution may have) */
    rc = ag__px_body_tape(p, q);
    t.j = q->tape;
    t.n = q->tape_n;
  } else {
    rc = reader_get(p, len, &t.j, &err);
    if (rc == AG_OK)
      rc = ag__jcs_tape(t.j, body, len, &t.n, &err);
  }
  if (rc == AG_ENOMEM) {
    out = AG_ENOMEM;
    goto out;
  }
  /* the root is token 0 (which ag__wt_is refuses: it is nobody's member) */
  if (rc != AG_OK || !ag__jcs_jansson_safe(t.j, t.n) ||
      ag__jcs_tok_type(t.j, 0) != AG__JT_OBJ)
    goto out;
  *stream = ag__wt_is(&t, ag__wt_get(&t, 0, "stream"), AG__JT_TRUE);
  t.cap = 2 * len + 16; /* decoded strings fit in 2x their source */
  t.buf = malloc(t.cap);
  if (t.buf == NULL) {
    out = AG_ENOMEM;
    goto out;
  }
  fast_traj f;
  int fr = tape_turn(w, &t, ag__wt_get(&t, 0, w->conv_key), &f);
  if (fr <= 0) {
    out = fr < 0 ? AG_ENOMEM : AG_ENOTFOUND;
    goto out;
  }
  if (ag__px_guard_get(p, cfg, g, &err) != AG_OK) {
    ag__px_fast_free(&f);
    out = err.code == AG_ENOMEM ? AG_ENOMEM : AG_ENOTFOUND;
    goto out;
  }
  memset(v, 0, sizeof(*v));
  v->call_index = -1;
  ag_guard_begin_turn(*g, 0);
  *act = AG_ALLOW;
  if (f.t.n_steps > 0)
    out = ag__px_replay_fast(*g, &f, v, act);
  else
    ag__px_fast_free(&f), out = AG_OK;
  if (out == AG_OK && !ag__stops(*act))
    *act = ag_guard_begin_iteration(*g, 0, v);
out:
  if (out != AG_OK) {
    ag__px_guard_put(p, *g);
    *g = NULL;
  }
  free(t.buf);
  if (q == NULL)
    reader_put(p, len, t.j);
  return out;
}

/* ------------------------------------------------------------------------ */
/* Attribution: the model and the conversation id (attr.h)                  */
/* ------------------------------------------------------------------------ */

/* Hashes the raw text of every string that is the value of a "text" or
 * "content" member inside token i (or i itself, a string). */
static void t_hash_texts(const ag__wtape *t, size_t i, ag__sha256 *h,
                         bool *any) {
  if (i == 0)
    return;
  const char *raw;
  if (ag__wt_is(t, i, AG__JT_STR)) {
    size_t n = ag__jcs_str_raw(t->j, i, &raw);
    ag__sha256_update(h, raw, n);
    ag__sha256_update(h, "", 1);
    *any = true;
    return;
  }
  size_t end = ag__jcs_tok_next(t->j, i);
  for (size_t k = i + 1; k + 1 < end; k++) {
    if (ag__jcs_tok_type(t->j, k) != AG__JT_KEY ||
        !(ag__jcs_key_is(t->j, k, "text", 4) ||
          ag__jcs_key_is(t->j, k, "content", 7)) ||
        !ag__wt_is(t, k + 1, AG__JT_STR))
      continue;
    size_t n = ag__jcs_str_raw(t->j, k + 1, &raw);
    ag__sha256_update(h, raw, n);
    ag__sha256_update(h, "", 1);
    *any = true;
  }
}

void ag__px_attr_body(ag_proxy *p, req_ctx *q, const char *path,
                      const char *conv_key) {
  ag__px_attr *a = &q->attr;
  ag__wtape t = {NULL, q->body, q->len, 0, NULL, 0, 0};
  ag__sha256 *h = NULL;
  if (ag__px_body_tape(p, q) != AG_OK)
    goto model_from_path;
  t.j = q->tape;
  t.n = q->tape_n;
  if (ag__jcs_tok_type(t.j, 0) != AG__JT_OBJ)
    goto model_from_path;
  size_t m = ag__wt_get(&t, 0, "model");
  if (ag__wt_is(&t, m, AG__JT_STR) && !ag__jcs_str_escaped(t.j, m)) {
    const char *raw;
    size_t n = ag__jcs_str_raw(t.j, m, &raw);
    if (n < sizeof a->model) {
      for (size_t k = 0; k < n; k++) /* one word in a log line */
        a->model[k] = (raw[k] > 0x20 && raw[k] < 0x7f) ? raw[k] : '_';
      a->model[n] = '\0';
    }
  }
  if (a->conv[0] == '\0' && conv_key != NULL && ag__sha256_new(&h) == AG_OK) {
    bool any = false;
    ag__sha256_init(h);
    static const char *const sys[] = {"system", "instructions",
                                      "systemInstruction"};
    for (size_t k = 0; k < sizeof sys / sizeof sys[0]; k++)
      t_hash_texts(&t, ag__wt_get(&t, 0, sys[k]), h, &any);
    size_t conv = ag__wt_get(&t, 0, conv_key);
    if (ag__wt_is(&t, conv, AG__JT_STR)) {
      t_hash_texts(&t, conv, h, &any); /* Responses: input as one string */
    } else {
      AG__WT_EACH(&t, conv, e) {
        t_hash_texts(&t, e, h, &any);
        if (ag__wt_eq(&t, ag__wt_get(&t, e, "role"), "user"))
          break; /* up to the first user message: the conversation's start */
      }
    }
    uint8_t sig[AG_SIG_LEN];
    if (any && ag__sha256_final(h, sig))
      for (size_t k = 0; k < 8; k++)
        snprintf(a->conv + 2 * k, 3, "%02x", sig[k]);
  }
model_from_path:
  if (a->model[0] == '\0' && path != NULL) {
    /* Gemini's and Vertex AI's paths: .../models/{model}:{method} */
    const char *at = NULL;
    const char *method = ag__wire_model_method(path, &at);
    if (method != NULL) {
      size_t n = (size_t)(method - 1 - at);
      if (n < sizeof a->model) {
        for (size_t k = 0; k < n; k++)
          a->model[k] = (at[k] > 0x20 && at[k] < 0x7f) ? at[k] : '_';
        a->model[n] = '\0';
      }
    }
  }
  ag__sha256_free(h);
}
