/*
 * src/proxy/tape.c - the decision read from the JCS tokenizer's tape
 * (internal.h): no jansson tree for the usual request, and a stream's text
 * chunks read the same way.
 */
#define _GNU_SOURCE /* memmem */
#include "internal.h"

/* ------------------------------------------------------------------------ */
/* The decision from the tape: no jansson tree                              */
/* ------------------------------------------------------------------------ */

/*
 * jansson builds a tree at about 60 MB/s here: 1.2 ms for a 500-message
 * (76 KB) request, more than the whole decision may take. The JCS
 * tokenizer (src/core/jcs.c) validates the same text and writes a flat
 * tape several times faster, so the decision reads the request from the
 * tape: the turn is found and turned into the fast_traj that ag__px_fast_turn /
 * ag__px_fast_turn_anth would build from the tree, with the strings decoded
 * into one buffer. The shape those two take is read here, and one more: chat
 * contents given as arrays of parts, read as the audit's parser reads them
 * (ag__px_fast_turn leaves those to it; AG_CAT_AUTO and the parser's unjudged
 * category replay alike). Anything else - a body the tape refuses (a duplicate
 * key, nesting past TAPE_DEPTH, a number outside a double, "\u0000", an integer
 * jansson cannot hold), a shape ag__px_fast_turn leaves to the slow path, a
 * message the tree path answers with 400 - returns TAPE_FALLBACK, and the
 * caller takes the jansson path, whose decisions and messages are the reference
 * (the parity tests in tests/runtime/test_proxy.c replay both).
 */

/* The value of member `key` of object token `obj`, or 0 (the root is
 * nobody's member). */
static size_t t_get(const tape *t, size_t obj, const char *key) {
  return ag__jcs_get(t->j, obj, key);
}

static bool t_is(const tape *t, size_t i, int type) {
  return i != 0 && ag__jcs_tok_type(t->j, i) == type;
}

/* String token i decoded into the buffer (NUL-terminated), or NULL when it
 * is no string or the buffer is full. */
static const char *t_str(tape *t, size_t i, size_t *len) {
  if (!t_is(t, i, AG__JT_STR))
    return NULL;
  const char *raw;
  size_t n = ag__jcs_str_raw(t->j, i, &raw);
  if (t->cap - t->used < n + 1)
    return NULL;
  char *o = t->buf + t->used;
  if (ag__jcs_str_escaped(t->j, i)) {
    n = ag__jcs_str_decode(t->j, i, o);
  } else {
    memcpy(o, raw, n);
    o[n] = '\0';
  }
  t->used += n + 1;
  if (len != NULL)
    *len = n;
  return o;
}

/* Whether token i is a string equal to `lit` (decoded; at most 20 bytes).
 * A decoded byte takes at most 6 bytes of source ("\u0061"), so a string
 * whose source is longer than 6 x 20 cannot be equal to one. */
static bool t_eq(const tape *t, size_t i, const char *lit) {
  if (!t_is(t, i, AG__JT_STR))
    return false;
  const char *raw;
  size_t n = ag__jcs_str_raw(t->j, i, &raw), l = strlen(lit);
  if (!ag__jcs_str_escaped(t->j, i))
    return n == l && memcmp(raw, lit, l) == 0;
  char tmp[6 * 20 + 1];
  return n < sizeof tmp && ag__jcs_str_decode(t->j, i, tmp) == l &&
         memcmp(tmp, lit, l) == 0;
}

/* The elements of array token `arr` (0: not an array). */
static size_t t_count(const tape *t, size_t arr) {
  if (!t_is(t, arr, AG__JT_ARR))
    return 0;
  size_t n = 0, end = ag__jcs_tok_next(t->j, arr);
  for (size_t i = arr + 1; i < end; i = ag__jcs_tok_next(t->j, i))
    n++;
  return n;
}

/* Iterates the elements e of array token a. */
#define T_EACH(t, a, e)                                                        \
  for (size_t e = t_is(t, a, AG__JT_ARR) ? (a) + 1 : 0,                        \
              e##_end = t_is(t, a, AG__JT_ARR) ? ag__jcs_tok_next((t)->j, a)   \
                                               : 0;                            \
       e < e##_end; e = ag__jcs_tok_next((t)->j, e))

/* Whether jansson takes every value of the tape (ag__jcs_jansson_safe). */
static bool t_jansson_safe(const tape *t) {
  return ag__jcs_jansson_safe(t->j, t->n);
}

/* The text ag__blocks_text / ag__px_anth_text make of Anthropic content token
 * c: a string, or the "text" strings of an array's blocks joined by "\n"; ""
 * for anything else. NULL when the buffer is full. */
static const char *t_anth_text(tape *t, size_t c, size_t *len) {
  *len = 0;
  if (t_is(t, c, AG__JT_STR))
    return t_str(t, c, len);
  char *out = t->buf + t->used;
  size_t n = 0;
  T_EACH(t, c, b) {
    size_t tx = t_get(t, b, "text"), l;
    if (!t_is(t, tx, AG__JT_STR))
      continue;
    if (n++ > 0) /* the separator takes the previous string's NUL */
      t->buf[t->used - 1] = '\n';
    if (t_str(t, tx, &l) == NULL)
      return NULL;
  }
  if (n == 0) {
    if (t->used >= t->cap)
      return NULL;
    t->buf[t->used++] = '\0';
  }
  *len = (size_t)(t->buf + t->used - 1 - out);
  return out;
}

/* A tool message's content as ag_trajectory_parse reads it (b_text in
 * src/audit/trajectory.c): a string; null or absent: ""; an array of parts
 * (strings, or objects with a "text" string; others skipped) or a single
 * part object, joined by "\n". NULL for any other value (the audit's
 * parser refuses it) or when the buffer is full. */
static const char *t_chat_text(tape *t, size_t c, size_t *len) {
  *len = 0;
  if (c == 0 || t_is(t, c, AG__JT_NULL))
    return "";
  if (t_is(t, c, AG__JT_STR))
    return t_str(t, c, len);
  if (!t_is(t, c, AG__JT_ARR) && !t_is(t, c, AG__JT_OBJ))
    return NULL;
  char *out = t->buf + t->used;
  size_t n = 0, one_end = ag__jcs_tok_next(t->j, c);
  bool arr = t_is(t, c, AG__JT_ARR);
  for (size_t p = arr ? c + 1 : c; p < (arr ? one_end : c + 1);
       p = ag__jcs_tok_next(t->j, p)) {
    size_t tx = t_is(t, p, AG__JT_STR) ? p : t_get(t, p, "text"), l;
    if (!t_is(t, tx, AG__JT_STR))
      continue; /* images, audio: no text to judge */
    if (n++ > 0)
      t->buf[t->used - 1] = '\n';
    if (t_str(t, tx, &l) == NULL)
      return NULL;
  }
  if (n == 0) {
    if (t->used >= t->cap)
      return NULL;
    t->buf[t->used++] = '\0';
  }
  *len = (size_t)(t->buf + t->used - 1 - out);
  return out;
}

/* ag__px_fast_turn over the tape: the messages' tokens msg[start..n). 1 (f
 * filled), 0 (fall back), -1 (out of memory). */
static int t_turn_chat(tape *t, const size_t *msg, size_t n, size_t start,
                       fast_traj *f) {
  size_t n_calls = 0, n_steps = 0;
  for (size_t i = start; i < n; i++)
    if (t_eq(t, t_get(t, msg[i], "role"), "assistant")) {
      n_steps++;
      n_calls += t_count(t, t_get(t, msg[i], "tool_calls"));
    }
  if (ag__px_t_alloc(f, n_steps, n_calls) < 0)
    return -1;
  size_t si = 0, ci = 0, step0 = 0;
  bool in_step = false;
  for (size_t i = start; i < n; i++) {
    const size_t m = msg[i], role = t_get(t, m, "role");
    if (t_get(t, m, "usage") != 0)
      goto slow;
    if (t_eq(t, role, "assistant")) {
      for (size_t k = step0; in_step && k < ci; k++)
        if (!f->answered[k])
          goto slow;
      size_t content = t_get(t, m, "content"), tcs = t_get(t, m, "tool_calls");
      /* content: a string or null (an array of parts: no text, as the
       * audit's parser reads it) */
      if ((!t_is(t, content, AG__JT_STR) && !t_is(t, content, AG__JT_NULL) &&
           !t_is(t, content, AG__JT_ARR)) ||
          t_get(t, m, "function_call") != 0 ||
          (tcs != 0 && !t_is(t, tcs, AG__JT_NULL) && !t_is(t, tcs, AG__JT_ARR)))
        goto slow;
      ag_traj_step *st = &f->steps[si++];
      in_step = true;
      step0 = ci;
      st->text = t_is(t, content, AG__JT_ARR) ? NULL : "";
      if (t_is(t, content, AG__JT_STR) &&
          (st->text = t_str(t, content, &st->text_len)) == NULL)
        goto slow;
      ag__px_t_step(st, f, ci);
      T_EACH(t, tcs, tc) {
        size_t fn = t_get(t, tc, "function");
        const char *id = t_str(t, t_get(t, tc, "id"), NULL);
        const char *name = t_str(t, t_get(t, fn, "name"), NULL);
        size_t args_len;
        const char *args = t_str(t, t_get(t, fn, "arguments"), &args_len);
        if (id == NULL || name == NULL || args == NULL)
          goto slow;
        for (size_t q = step0; q < ci; q++)
          if (strcmp(f->ids[q], id) == 0)
            goto slow; /* a repeated id */
        f->ids[ci] = id;
        f->calls[ci].name = name;
        f->calls[ci].args = args;
        f->calls[ci].args_len = args_len;
        f->results[ci].text = "";
        ci++;
      }
      st->n_calls = st->n_results = ci - step0;
    } else if (t_eq(t, role, "tool")) {
      size_t ie = t_get(t, m, "is_error"), len;
      if (!in_step ||
          (ie != 0 && !t_is(t, ie, AG__JT_TRUE) && !t_is(t, ie, AG__JT_FALSE)))
        goto slow;
      const char *id = t_str(t, t_get(t, m, "tool_call_id"), NULL);
      const char *content = t_chat_text(t, t_get(t, m, "content"), &len);
      if (id == NULL || content == NULL)
        goto slow;
      ag_traj_result *res = ag__px_t_answer(f, step0, ci, id);
      if (res == NULL)
        goto slow;
      res->outcome =
          t_is(t, ie, AG__JT_TRUE) ? AG_OUTCOME_ERROR : AG_OUTCOME_OK;
      res->category = AG_CAT_AUTO;
      res->text = content;
      res->text_len = len;
    } else if (t_eq(t, role, "user")) {
      if (i != start)
        goto slow;
    } else if (!t_eq(t, role, "system") && !t_eq(t, role, "developer")) {
      goto slow;
    }
  }
  for (size_t k = step0; in_step && k < ci; k++)
    if (!f->answered[k])
      goto slow;
  ag__px_t_done(f, si, ci);
  return 1;
slow:
  ag__px_fast_free(f);
  return 0;
}

/* Whether ag__wire_messages.to_chat passes message token m (its 400s are the
 * jansson path's to give). */
static bool t_anth_ok(const tape *t, size_t m) {
  size_t role = t_get(t, m, "role"), content = t_get(t, m, "content");
  if (!t_eq(t, role, "user") && !t_eq(t, role, "assistant"))
    return false;
  if (!t_is(t, content, AG__JT_STR) && !t_is(t, content, AG__JT_ARR))
    return false;
  T_EACH(t, content, b) {
    size_t bt = t_get(t, b, "type");
    if (!t_is(t, bt, AG__JT_STR))
      return false;
    if (t_eq(t, bt, "tool_use") && (!t_is(t, t_get(t, b, "id"), AG__JT_STR) ||
                                    !t_is(t, t_get(t, b, "name"), AG__JT_STR)))
      return false;
    if (t_eq(t, bt, "tool_result") &&
        !t_is(t, t_get(t, b, "tool_use_id"), AG__JT_STR))
      return false;
  }
  return true;
}

/* ag__px_anth_has_text over the tape. */
static bool t_anth_has_text(const tape *t, size_t m) {
  size_t content = t_get(t, m, "content");
  if (t_is(t, content, AG__JT_STR))
    return true;
  T_EACH(t, content, b) {
    if (t_eq(t, t_get(t, b, "type"), "text"))
      return true;
  }
  return false;
}

/* ag__px_fast_turn_anth over the tape: the turn from msg[from] (a user message
 * with text). Returns as t_turn_chat. */
static int t_turn_anth(tape *t, const size_t *msg, size_t n, size_t from,
                       fast_traj *f) {
  size_t n_calls = 0, n_steps = 0;
  for (size_t i = from + 1; i < n; i++) {
    if (!t_eq(t, t_get(t, msg[i], "role"), "assistant"))
      continue;
    n_steps++;
    T_EACH(t, t_get(t, msg[i], "content"), b) {
      n_calls += t_eq(t, t_get(t, b, "type"), "tool_use");
    }
  }
  if (ag__px_t_alloc(f, n_steps, n_calls) < 0)
    return -1;
  size_t si = 0, ci = 0, step0 = 0;
  bool in_step = false;
  for (size_t i = from + 1; i < n; i++) {
    const size_t m = msg[i], content = t_get(t, m, "content");
    if (t_eq(t, t_get(t, m, "role"), "assistant")) {
      for (size_t q = step0; in_step && q < ci; q++)
        if (!f->answered[q])
          goto slow;
      ag_traj_step *st = &f->steps[si++];
      in_step = true;
      step0 = ci;
      if ((st->text = t_anth_text(t, content, &st->text_len)) == NULL)
        goto slow;
      ag__px_t_step(st, f, ci);
      T_EACH(t, content, b) {
        size_t bt = t_get(t, b, "type");
        if (t_eq(t, bt, "tool_result"))
          goto slow;
        if (!t_eq(t, bt, "tool_use"))
          continue;
        const char *id = t_str(t, t_get(t, b, "id"), NULL);
        const char *name = t_str(t, t_get(t, b, "name"), NULL);
        if (id == NULL || name == NULL)
          goto slow;
        for (size_t q = step0; q < ci; q++)
          if (strcmp(f->ids[q], id) == 0)
            goto slow; /* a repeated id */
        /* The arguments: the input's own text. ag__px_fast_turn_anth gives
         * jansson's compact dump of it; the guard reads arguments only
         * through their JCS form (the call signature), the same for both
         * (duplicate keys and numbers jansson reads differently fall back
         * above). */
        size_t input = t_get(t, b, "input"), at = 0, al = 2;
        const char *args = "{}";
        if (input != 0) {
          al = ag__jcs_member_span(t->j, input - 1, &at);
          args = t->s + at;
        }
        f->ids[ci] = id;
        f->calls[ci].name = name;
        f->calls[ci].args = args;
        f->calls[ci].args_len = al;
        f->results[ci].text = "";
        ci++;
      }
      st->n_calls = st->n_results = ci - step0;
      continue;
    }
    T_EACH(t, content, b) {
      if (!t_eq(t, t_get(t, b, "type"), "tool_result"))
        continue;
      if (!in_step)
        goto slow;
      const char *id = t_str(t, t_get(t, b, "tool_use_id"), NULL);
      if (id == NULL)
        goto slow;
      ag_traj_result *res = ag__px_t_answer(f, step0, ci, id);
      if (res == NULL)
        goto slow;
      res->outcome = t_is(t, t_get(t, b, "is_error"), AG__JT_TRUE)
                         ? AG_OUTCOME_ERROR
                         : AG_OUTCOME_OK;
      res->category = AG_CAT_AUTO;
      res->text = t_anth_text(t, t_get(t, b, "content"), &res->text_len);
      if (res->text == NULL)
        goto slow;
    }
  }
  for (size_t q = step0; in_step && q < ci; q++)
    if (!f->answered[q])
      goto slow;
  ag__px_t_done(f, si, ci);
  return 1;
slow:
  ag__px_fast_free(f);
  return 0;
}

/*
 * The decision before forwarding, from the tape: the turn replayed through
 * a new guard (*g, which the caller frees), then the coming request
 * counted - what the jansson path decides for the same body. Returns the
 * action (v filled; *stream: the body's "stream" is true), -2 when out of
 * memory, or TAPE_FALLBACK (*g NULL): take the jansson path.
 */
int ag__px_tape_decide(const ag_config *cfg, const char *body, size_t len,
                       const ag__wire *w, ag_guard **g, ag_verdict *v,
                       bool *stream) {
  bool anth = w == &ag__wire_messages;
  *g = NULL;
  tape t = {NULL, body, len, 0, NULL, 0, 0};
  size_t *msg = NULL;
  int act = TAPE_FALLBACK;
  ag_error_t err;
  if (body == NULL || len == 0)
    return TAPE_FALLBACK;
  ag_err_t rc = ag__jcs_tape_new(&t.j, len, TAPE_DEPTH, &err);
  if (rc == AG_OK)
    rc = ag__jcs_tape(t.j, body, len, &t.n, &err);
  if (rc == AG_ENOMEM) {
    act = -2;
    goto out;
  }
  /* the root is token 0 (which t_is refuses: it is nobody's member) */
  if (rc != AG_OK || !t_jansson_safe(&t) ||
      ag__jcs_tok_type(t.j, 0) != AG__JT_OBJ)
    goto out;
  size_t msgs = t_get(&t, 0, "messages"), n = t_count(&t, msgs);
  if (n == 0)
    goto out;
  *stream = t_is(&t, t_get(&t, 0, "stream"), AG__JT_TRUE);
  msg = malloc(n * sizeof(*msg));
  t.cap = 2 * len + 16; /* decoded strings fit in 2x their source */
  t.buf = malloc(t.cap);
  if (msg == NULL || t.buf == NULL) {
    act = -2;
    goto out;
  }
  size_t k = 0;
  T_EACH(&t, msgs, e) {
    if (!t_is(&t, t_get(&t, e, "role"), AG__JT_STR) ||
        (anth && !t_anth_ok(&t, e)))
      goto out;
    msg[k++] = e;
  }
  size_t start = SIZE_MAX;
  for (size_t i = n; i-- > 0 && start == SIZE_MAX;)
    if (t_eq(&t, t_get(&t, msg[i], "role"), "user") &&
        (!anth || t_anth_has_text(&t, msg[i])))
      start = i;
  bool has_steps = false;
  if (start == SIZE_MAX) {
    if (anth)
      goto out; /* the jansson path converts every message then */
    start = 0;
  }
  for (size_t i = start; i < n && !has_steps; i++)
    has_steps = t_eq(&t, t_get(&t, msg[i], "role"), "assistant");
  fast_traj f;
  int fr = 0;
  if (has_steps || anth)
    fr = anth ? t_turn_anth(&t, msg, n, start, &f)
              : t_turn_chat(&t, msg, n, start, &f);
  if (fr < 0) {
    act = -2;
    goto out;
  }
  if (fr == 0 && (has_steps || anth))
    goto out;
  if (ag_guard_new(g, cfg, NULL, &err) != AG_OK) {
    if (fr > 0)
      ag__px_fast_free(&f);
    act = err.code == AG_ENOMEM ? -2 : TAPE_FALLBACK;
    goto out;
  }
  memset(v, 0, sizeof(*v));
  v->call_index = -1;
  ag_guard_begin_turn(*g, 0);
  act = fr > 0 ? ag__px_replay_fast(*g, &f, v) : AG_ALLOW;
  if (act >= 0 && !ag__stops((ag_action)act))
    act = ag_guard_begin_iteration(*g, 0, v);
out:
  if (act == TAPE_FALLBACK || act == -2) {
    ag_guard_free(*g);
    *g = NULL;
  }
  free(msg);
  free(t.buf);
  ag__jcs_free(t.j);
  return act;
}

/* ------------------------------------------------------------------------ */
/* Attribution: the model and the conversation id (attr.h)                  */
/* ------------------------------------------------------------------------ */

/* Hashes the raw text of every string that is the value of a "text" or
 * "content" member inside token i (or i itself, a string). */
static void t_hash_texts(const tape *t, size_t i, ag__sha256 *h, bool *any) {
  if (i == 0)
    return;
  const char *raw;
  if (t_is(t, i, AG__JT_STR)) {
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
        !t_is(t, k + 1, AG__JT_STR))
      continue;
    size_t n = ag__jcs_str_raw(t->j, k + 1, &raw);
    ag__sha256_update(h, raw, n);
    ag__sha256_update(h, "", 1);
    *any = true;
  }
}

void ag__px_attr_body(ag__px_attr *a, const char *path, const char *conv_key,
                      const char *body, size_t len) {
  tape t = {NULL, body, len, 0, NULL, 0, 0};
  ag_error_t err;
  ag__sha256 *h = NULL;
  if (body == NULL || len == 0 ||
      ag__jcs_tape_new(&t.j, len, TAPE_DEPTH, &err) != AG_OK ||
      ag__jcs_tape(t.j, body, len, &t.n, &err) != AG_OK ||
      ag__jcs_tok_type(t.j, 0) != AG__JT_OBJ)
    goto model_from_path;
  size_t m = t_get(&t, 0, "model");
  if (t_is(&t, m, AG__JT_STR) && !ag__jcs_str_escaped(t.j, m)) {
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
      t_hash_texts(&t, t_get(&t, 0, sys[k]), h, &any);
    size_t conv = t_get(&t, 0, conv_key);
    if (t_is(&t, conv, AG__JT_STR)) {
      t_hash_texts(&t, conv, h, &any); /* Responses: input as one string */
    } else {
      T_EACH(&t, conv, e) {
        t_hash_texts(&t, e, h, &any);
        if (t_eq(&t, t_get(&t, e, "role"), "user"))
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
    /* Gemini: /v1beta/models/MODEL:generateContent */
    const char *at = strstr(path, "/models/");
    if (at != NULL) {
      at += 8;
      size_t n = strcspn(at, ":/?");
      if (n > 0 && n < sizeof a->model) {
        for (size_t k = 0; k < n; k++)
          a->model[k] = (at[k] > 0x20 && at[k] < 0x7f) ? at[k] : '_';
        a->model[n] = '\0';
      }
    }
  }
  ag__sha256_free(h);
  ag__jcs_free(t.j);
}
