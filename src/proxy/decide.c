/*
 * src/proxy/decide.c - the decision on a guarded request (internal.h): the
 * turn read from the parsed request and replayed through a fresh guard
 * (the audit layer's replay), the stop reply, the final request without
 * tools, a whole reply checked and nudged.
 */
#define _GNU_SOURCE /* memmem */
#include "internal.h"

/* ------------------------------------------------------------------------ */
/* The replay: the turn through a fresh guard, as ag_auditor_run does it    */
/* ------------------------------------------------------------------------ */

static const char *role_of(const json_t *m) {
  return json_string_value(json_object_get(m, "role"));
}

void ag__px_fast_free(fast_traj *f) {
  free(f->steps);
  free(f->calls);
  free(f->results);
  free(f->ids);
  free(f->answered);
  for (size_t i = 0; i < f->n_owned; i++)
    free(f->owned[i]);
  free(f->owned);
}

/* Zeroes `f` and sizes its arrays for a turn of n_steps replies and n_calls
 * calls: 0, or -1 (out of memory, nothing kept). */
int ag__px_t_alloc(fast_traj *f, size_t n_steps, size_t n_calls) {
  memset(f, 0, sizeof(*f));
  f->steps = calloc(n_steps + 1, sizeof(*f->steps));
  f->calls = calloc(n_calls + 1, sizeof(*f->calls));
  f->results = calloc(n_calls + 1, sizeof(*f->results));
  f->ids = calloc(n_calls + 1, sizeof(*f->ids));
  f->answered = calloc(n_calls + 1, sizeof(*f->answered));
  if (f->steps == NULL || f->calls == NULL || f->results == NULL ||
      f->ids == NULL || f->answered == NULL) {
    ag__px_fast_free(f);
    return -1;
  }
  return 0;
}

/* The result slot of the step's call (calls step0..ci) whose id is `id`,
 * marked answered; NULL when no call of the step has it or it was answered
 * already (the caller then takes the slow path). */
ag_traj_result *ag__px_t_answer(fast_traj *f, size_t step0, size_t ci,
                                const char *id) {
  size_t q = step0;
  while (q < ci && strcmp(f->ids[q], id) != 0)
    q++;
  if (q == ci || f->answered[q])
    return NULL;
  f->answered[q] = true;
  return &f->results[q];
}

/* Makes `f` the one-turn trajectory of its si steps and ci calls. */
void ag__px_t_done(fast_traj *f, size_t si, size_t ci) {
  f->turn.steps = f->steps;
  f->turn.n_steps = si;
  f->turn.t_start_ms = -1;
  f->t.format = AG_TRAJ_CHAT;
  f->t.turns = &f->turn;
  f->t.n_turns = 1;
  f->t.n_steps = si;
  f->t.n_calls = ci;
}

/* A new step whose calls and results start at call ci, untimed. */
void ag__px_t_step(ag_traj_step *st, fast_traj *f, size_t ci) {
  st->tokens = -1;
  st->t_request_ms = st->t_response_ms = st->t_done_ms = -1;
  st->calls = &f->calls[ci];
  st->results = &f->results[ci];
}

int ag__px_fast_turn(const json_t *msgs, size_t start, fast_traj *f) {
  memset(f, 0, sizeof(*f));
  size_t n = json_array_size(msgs), n_calls = 0, n_steps = 0;
  for (size_t i = start; i < n; i++) {
    const json_t *m = json_array_get(msgs, i);
    if (strcmp(role_of(m), "assistant") == 0) {
      n_steps++;
      n_calls += json_array_size(json_object_get(m, "tool_calls"));
    }
  }
  if (ag__px_t_alloc(f, n_steps, n_calls) < 0)
    return -1;
  size_t si = 0, ci = 0, step0 = 0; /* step0: first call of the step */
  bool in_step = false;
  for (size_t i = start; i < n; i++) {
    const json_t *m = json_array_get(msgs, i);
    const char *role = role_of(m);
    if (json_object_get(m, "usage") != NULL)
      goto slow;
    if (strcmp(role, "assistant") == 0) {
      for (size_t k = step0; in_step && k < ci; k++)
        if (!f->answered[k])
          goto slow;
      const json_t *content = json_object_get(m, "content");
      const json_t *tcs = json_object_get(m, "tool_calls");
      if ((!json_is_string(content) && !json_is_null(content)) ||
          json_object_get(m, "function_call") != NULL ||
          (tcs != NULL && !json_is_null(tcs) && !json_is_array(tcs)))
        goto slow;
      ag_traj_step *st = &f->steps[si++];
      in_step = true;
      step0 = ci;
      st->text = json_is_string(content) ? json_string_value(content) : "";
      st->text_len = json_is_string(content) ? json_string_length(content) : 0;
      ag__px_t_step(st, f, ci);
      size_t k;
      const json_t *tc;
      json_array_foreach(tcs, k, tc) {
        const json_t *fn = json_object_get(tc, "function");
        const json_t *id = json_object_get(tc, "id");
        const json_t *name = json_object_get(fn, "name");
        const json_t *args = json_object_get(fn, "arguments");
        if (!json_is_string(id) || !json_is_string(name) ||
            !json_is_string(args))
          goto slow;
        for (size_t q = step0; q < ci; q++)
          if (strcmp(f->ids[q], json_string_value(id)) == 0)
            goto slow; /* a repeated id */
        f->ids[ci] = json_string_value(id);
        f->calls[ci].name = json_string_value(name);
        f->calls[ci].args = json_string_value(args);
        f->calls[ci].args_len = json_string_length(args);
        f->results[ci].text = "";
        ci++;
      }
      st->n_calls = st->n_results = ci - step0;
    } else if (strcmp(role, "tool") == 0) {
      const json_t *id = json_object_get(m, "tool_call_id");
      const json_t *content = json_object_get(m, "content");
      const json_t *ie = json_object_get(m, "is_error");
      if (!in_step || !json_is_string(id) || !json_is_string(content) ||
          (ie != NULL && !json_is_boolean(ie)))
        goto slow;
      ag_traj_result *res =
          ag__px_t_answer(f, step0, ci, json_string_value(id));
      if (res == NULL)
        goto slow;
      res->outcome = json_is_true(ie) ? AG_OUTCOME_ERROR : AG_OUTCOME_OK;
      res->category = AG_CAT_AUTO;
      res->text = json_string_value(content);
      res->text_len = json_string_length(content);
    } else if (strcmp(role, "user") == 0) {
      if (i != start)
        goto slow;
    } else if (strcmp(role, "system") != 0 && strcmp(role, "developer") != 0) {
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

/* The trajectory `f` replayed (then freed): the action, or -2. */
int ag__px_replay_fast(ag_guard *g, fast_traj *f, ag_verdict *v) {
  int act = ag__replay_untimed(g, &f->t, v);
  ag__px_fast_free(f);
  return act < 0 ? -2 : act;
}

static int replay_slow(ag_guard *g, const json_t *msgs, size_t start,
                       size_t shown, ag_verdict *v, char *emsg, size_t cap);

/*
 * Replays the turn of `msgs` (the last user message and what follows)
 * through `g`. Returns the action (v filled), or -1 with a 400 message in
 * `emsg` when the turn cannot be read, or -2 when out of memory. `shown`:
 * the index the turn's first message has in the client's own messages, for
 * that message, or SIZE_MAX: its index in `msgs`.
 */
int ag__px_replay_turn(ag_guard *g, const json_t *msgs, size_t shown,
                       ag_verdict *v, char *emsg, size_t cap) {
  size_t n = json_array_size(msgs), start = 0;
  for (size_t i = n; i-- > 0;)
    if (strcmp(role_of(json_array_get(msgs, i)), "user") == 0) {
      start = i;
      break;
    }
  bool has_steps = false;
  for (size_t i = start; i < n && !has_steps; i++)
    has_steps = strcmp(role_of(json_array_get(msgs, i)), "assistant") == 0;
  memset(v, 0, sizeof(*v));
  v->call_index = -1;
  ag_guard_begin_turn(g, 0);
  if (!has_steps)
    return AG_ALLOW;
  fast_traj f;
  int fr = ag__px_fast_turn(msgs, start, &f);
  if (fr < 0)
    return -2;
  if (fr > 0)
    return ag__px_replay_fast(g, &f, v);
  return replay_slow(g, msgs, start, shown == SIZE_MAX ? start : shown, v, emsg,
                     cap);
}

/* The turn msgs[start..] written out and read by ag_trajectory_parse, the
 * audit's parser (whose error message a broken turn gets), then replayed. */
static int replay_slow(ag_guard *g, const json_t *msgs, size_t start,
                       size_t shown, ag_verdict *v, char *emsg, size_t cap) {
  size_t n = json_array_size(msgs);
  json_t *turn = json_array();
  int rc = -2;
  if (turn == NULL)
    return rc;
  for (size_t i = start; i < n; i++)
    if (json_array_append(turn, json_array_get(msgs, i)) != 0)
      goto out;
  char *text = json_dumps(turn, JSON_COMPACT);
  if (text == NULL)
    goto out;
  ag_traj_opts o;
  ag_traj_opts_init(&o);
  o.format = AG_TRAJ_CHAT;
  ag_trajectory *t = NULL;
  ag_error_t err;
  ag_err_t pr = ag_trajectory_parse(&t, text, strlen(text), &o, &err);
  free(text);
  if (pr == AG_ENOMEM)
    goto out;
  if (pr != AG_OK) {
    snprintf(emsg, cap,
             "messages: the turn (messages[%zu..], numbered from there) is not "
             "a tool conversation agentguard can read: %s",
             shown, err.msg);
    rc = -1;
    goto out;
  }
  rc = ag__replay_untimed(g, t, v);
  if (rc < 0)
    rc = -2;
  ag_trajectory_free(t);
out:
  json_decref(turn);
  return rc;
}

/* ------------------------------------------------------------------------ */
/* Chat Completions                                                         */
/* ------------------------------------------------------------------------ */

void ag__px_stop_text(const ag_verdict *v, char *buf, size_t cap) {
  size_t ml = strlen(v->message);
  const char *dot =
      ml > 0 && strchr(".!?", v->message[ml - 1]) == NULL ? "." : "";
  const char *sp = v->suggestion != NULL ? " " : "";
  const char *sg = v->suggestion != NULL ? v->suggestion : "";
  if (v->action == AG_ESCALATE)
    snprintf(buf, cap,
             "agentguard paused this turn and needs you (%s): %s%s%s%s Reply "
             "to say how to go on.",
             ag_reason_name(v->reason), v->message, dot, sp, sg);
  else
    snprintf(buf, cap, "agentguard stopped this turn (%s): %s%s%s%s",
             ag_reason_name(v->reason), v->message, dot, sp, sg);
}

/* ---- Server-Sent Events for stream: true ------------------------------ */

void ag__px_sb_add(sbuf *b, const char *s, size_t n) {
  if (b->failed)
    return;
  if (b->len + n + 1 > SSE_OUT_MAX) {
    b->failed = true;
    return;
  }
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 1024;
    while (cap < b->len + n + 1)
      cap *= 2;
    char *g = realloc(b->p, cap);
    if (g == NULL) {
      b->failed = true;
      return;
    }
    b->p = g;
    b->cap = cap;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = '\0';
}

/* One SSE event of `data`: a "data:" line per line of it (the upstream's
 * event may have come in several, which its reader joined with "\n"; one
 * line holding a "\n" would end the event early). */
void ag__px_sb_event(sbuf *b, const char *data, size_t n) {
  for (;;) {
    const char *nl = memchr(data, '\n', n);
    size_t k = nl != NULL ? (size_t)(nl - data) : n;
    ag__px_sb_add(b, "data: ", 6);
    ag__px_sb_add(b, data, k);
    ag__px_sb_add(b, "\n", 1);
    if (nl == NULL)
      break;
    data += k + 1;
    n -= k + 1;
  }
  ag__px_sb_add(b, "\n", 1);
}

void ag__px_sb_json(sbuf *b, json_t *o) {
  char *t = o != NULL ? json_dumps(o, JSON_COMPACT) : NULL;
  json_decref(o);
  if (t == NULL) {
    b->failed = true;
    return;
  }
  ag__px_sb_event(b, t, strlen(t));
  free(t);
}

/* One chat.completion.chunk with `delta` (stolen) and a finish reason. */
void ag__px_sb_chunk(sbuf *b, const char *id, const char *model, json_t *delta,
                     const char *finish) {
  ag__px_sb_json(b, json_pack("{s:s, s:s, s:I, s:s, s:[{s:i, s:o, s:s?}]}",
                              "id", id, "object", "chat.completion.chunk",
                              "created", (json_int_t)time(NULL), "model", model,
                              "choices", "index", 0, "delta", delta,
                              "finish_reason", finish));
}

/* A reply as chunks: its text, its calls (whole), its end, [DONE]. */
void ag__px_sb_reply(sbuf *b, const char *id, const char *model,
                     const char *text, const ag_reply *rep,
                     const char *finish) {
  ag__px_sb_chunk(b, id, model,
                  json_pack("{s:s, s:s}", "role", "assistant", "content",
                            text != NULL ? text : ""),
                  NULL);
  if (rep != NULL && rep->n_calls > 0) {
    json_t *tcs = json_array();
    for (size_t i = 0; tcs != NULL && i < rep->n_calls; i++) {
      const ag_tool_call *tc = &rep->calls[i];
      json_t *one =
          json_pack("{s:i, s:s, s:s, s:{s:s, s:s%}}", "index", (int)i, "id",
                    tc->id, "type", "function", "function", "name", tc->name,
                    "arguments", tc->arguments, tc->arguments_len);
      if (one == NULL || json_array_append_new(tcs, one) != 0)
        b->failed = true;
    }
    ag__px_sb_chunk(b, id, model,
                    tcs != NULL ? json_pack("{s:o}", "tool_calls", tcs) : NULL,
                    NULL);
  }
  ag__px_sb_chunk(b, id, model, json_object(), finish);
  ag__px_sb_add(b, "data: [DONE]\n\n", 14);
}

/* `b` as the reply's body (an event stream). */
void ag__px_set_sse(reply *r, sbuf *b) {
  if (b->failed) {
    free(b->p);
    ag__px_set_error(r, 500, "server_error", "out_of_memory", "out of memory");
    return;
  }
  r->status = 200;
  r->ctype = "text/event-stream";
  r->body = b->p;
  r->len = b->len;
}

/* A chat.completion with one assistant message saying why the turn ended. */
static void set_stop_reply(ag_proxy *p, const json_t *req, const ag_verdict *v,
                           reply *r) {
  char text[AG_VERDICT_MSG_MAX * 2 + 128];
  ag__px_stop_text(v, text, sizeof text);
  char id[64];
  snprintf(id, sizeof id, "chatcmpl-agentguard-%lu",
           (unsigned long)atomic_fetch_add(&p->ids, 1));
  const char *model = json_string_value(json_object_get(req, "model"));
  if (r->anthropic) {
    snprintf(id, sizeof id, "msg_agentguard_%lu",
             (unsigned long)atomic_fetch_add(&p->ids, 1));
    ag__px_set_json(r, 200,
                    json_pack("{s:s, s:s, s:s, s:s, s:[{s:s, s:s}], s:s, s:n, "
                              "s:{s:i, s:i}}",
                              "id", id, "type", "message", "role", "assistant",
                              "model", model != NULL ? model : "agentguard",
                              "content", "type", "text", "text", text,
                              "stop_reason", "end_turn", "stop_sequence",
                              "usage", "input_tokens", 0, "output_tokens", 0));
    if (r->status == 200)
      r->stop = ag_reason_name(v->reason);
    return;
  }
  if (json_is_true(json_object_get(req, "stream"))) {
    sbuf b = {NULL, 0, 0, false};
    ag__px_sb_reply(&b, id, model != NULL ? model : "agentguard", text, NULL,
                    "stop");
    ag__px_set_sse(r, &b);
    if (r->status == 200)
      r->stop = ag_reason_name(v->reason);
    return;
  }
  ag__px_set_json(
      r, 200,
      json_pack("{s:s, s:s, s:I, s:s, s:[{s:i, s:{s:s, s:s}, s:s}], "
                "s:{s:i, s:i, s:i}}",
                "id", id, "object", "chat.completion", "created",
                (json_int_t)time(NULL), "model",
                model != NULL ? model : "agentguard", "choices", "index", 0,
                "message", "role", "assistant", "content", text,
                "finish_reason", "stop", "usage", "prompt_tokens", 0,
                "completion_tokens", 0, "total_tokens", 0));
  if (r->status == 200)
    r->stop = ag_reason_name(v->reason);
}

/* A copy of the request (shallow at the top) with tools taken away. */
static json_t *without_tools(const json_t *req) {
  json_t *b = json_copy((json_t *)req);
  if (b == NULL)
    return NULL;
  json_object_del(b, "tools");
  json_object_del(b, "tool_choice");
  json_object_del(b, "parallel_tool_calls");
  json_object_del(b, "functions");
  json_object_del(b, "function_call");
  return b;
}

/* The request with `extra` messages appended (new body, caller frees). */
char *ag__px_with_messages(const json_t *body, const json_t *extra,
                           size_t *len) {
  json_t *b = json_copy((json_t *)body);
  json_t *m = b != NULL ? json_copy(json_object_get(b, "messages")) : NULL;
  char *text = NULL;
  if (m != NULL && json_array_extend(m, (json_t *)extra) == 0 &&
      json_object_set_new(b, "messages", m) == 0) {
    m = NULL;
    text = json_dumps(b, JSON_COMPACT);
  }
  json_decref(m);
  json_decref(b);
  if (text != NULL)
    *len = strlen(text);
  return text;
}

/* One SSE event of a held reply into the assembler, by the shape's reader. */
typedef struct held_sse {
  const ag__wire *w;
  ag__asm *a;
} held_sse;

static int held_event(void *user, const char *event, const char *data,
                      size_t len, size_t pos) {
  held_sse *h = user;
  return h->w->event(h->a, event, data, len, pos);
}

/* A reply held whole, in `form`, into the assembler: a JSON body by the
 * shape's whole-reply reader, SSE by its event reader, a JSON array (a
 * Gemini stream without alt=sse) element by element. */
static void read_held(const ag__wire *w, ag__reply_form form, const char *body,
                      size_t len, ag__asm *a) {
  if (form == AG__REPLY_WHOLE) {
    w->response(a, body, len);
  } else if (form == AG__REPLY_SSE) {
    held_sse h = {w, a};
    ag__sse s;
    ag_err_t why = AG_OK;
    ag__sse_init(&s, held_event, &h);
    if (ag__sse_feed(&s, body, len, &why) == 0)
      ag__sse_finish(&s, &why);
    ag__sse_free(&s);
    if (why != AG_OK && a->failed == AG_OK)
      a->failed = why;
  } else {
    json_error_t je;
    json_t *arr = json_loadb(body, len, 0, &je);
    size_t i;
    json_t *el;
    if (!json_is_array(arr))
      ag__asm_bad(a, arr == NULL ? (long)je.position : 0,
                  "expected a JSON array of chunks");
    json_array_foreach(arr, i, el) {
      char *d = json_dumps(el, JSON_COMPACT);
      if (d == NULL || w->event(a, "", d, strlen(d), 0) != 0) {
        if (d == NULL && a->failed == AG_OK)
          a->failed = AG_ENOMEM;
        free(d);
        break;
      }
      free(d);
    }
    json_decref(arr);
  }
}

bool ag__px_read_reply_as(upstream *u, const ag__wire *w, ag__reply_form form,
                          ag_reply *out, reply *r) {
  ag_provider_error perr;
  memset(&perr, 0, sizeof perr);
  ag__asm a;
  ag__asm_init(&a, NULL, NULL, &perr, "upstream");
  /* the parse holds about twice the body again (jansson's tree, the text
   * copied out of it into `out`): taken from the budget with the body and
   * given back with it (this is a request's thread: it may wait) */
  size_t parse = u->bud != NULL ? 2 * u->len : 0;
  if (parse > 0) {
    ag__budget_wait(u->bud, parse, u->held);
    u->held += parse;
  }
  read_held(w, form, u->body != NULL ? u->body : "", u->len, &a);
  ag_err_t rc = a.failed != AG_OK ? a.failed : ag__asm_finish(&a, out);
  ag__asm_free(&a);
  if (rc == AG_OK)
    return true;
  ag_reply_clear(out);
  ag__px_set_error(
      r, 502, "upstream_error", "upstream_bad_reply",
      "agentguard proxy: the upstream's reply is not a %s response: %s", w->api,
      rc == AG_EPROVIDER ? perr.message : ag_strerror(rc));
  return false;
}

/* The upstream's reply read by the parser of the request's API (Chat
 * Completions or Messages, whole). false with a 502 in `r` when it is not
 * one. */
bool ag__px_read_reply(upstream *u, ag_reply *out, reply *r) {
  return ag__px_read_reply_as(
      u, r->anthropic ? &ag__wire_messages : &ag__wire_chat, AG__REPLY_WHOLE,
      out, r);
}

/* The final request without tools: the reply, tool calls stripped. */
static void final_without_tools(ag_proxy *p, ag__px_attr *a,
                                const struct curl_slist *hdrs, const char *uri,
                                int client_fd, const json_t *req,
                                const ag_verdict *v, reply *r) {
  json_t *b = without_tools(req);
  const bool stream =
      !r->anthropic && json_is_true(json_object_get(req, "stream"));
  if (b != NULL && (stream || r->anthropic)) {
    /* asked whole; the client still gets a stream */
    json_object_set_new(b, "stream", json_false());
    json_object_del(b, "stream_options");
  }
  char note[AG_VERDICT_MSG_MAX + 256];
  snprintf(note, sizeof note, FINAL_INSTRUCTION, ag_reason_name(v->reason),
           v->message);
  json_t *extra = json_pack("[{s:s, s:s}]", "role", "user", "content", note);
  size_t len = 0;
  char *body =
      b != NULL && extra != NULL ? ag__px_with_messages(b, extra, &len) : NULL;
  json_decref(b);
  json_decref(extra);
  if (body == NULL) {
    ag__px_set_error(r, 500, "server_error", "out_of_memory", "out of memory");
    return;
  }
  upstream u;
  ag__px_send_upstream(p, hdrs, "POST", uri, body, len, true, client_fd, &u);
  free(body);
  ag__px_attr_upstream(a, u.total_us);
  if (ag__px_upstream_failed(p, &u, r)) {
    ag__px_upstream_free(&u);
    return;
  }
  if (u.status < 200 || u.status >= 300) {
    ag__px_pass_back(&u, r);
    ag__px_upstream_free(&u);
    return;
  }
  json_t *j = json_loadb(u.body != NULL ? u.body : "", u.len, 0, NULL);
  ag__px_attr_usage_json(a, j);
  if (r->anthropic) {
    json_t *content = json_object_get(j, "content");
    if (!json_is_array(content)) {
      json_decref(j);
      ag__px_set_error(
          r, 502, "upstream_error", "upstream_bad_reply",
          "agentguard proxy: the upstream's reply is not a Messages "
          "response: no content array");
      ag__px_upstream_free(&u);
      return;
    }
    for (size_t k = json_array_size(content); k-- > 0;) {
      const char *bt = json_string_value(
          json_object_get(json_array_get(content, k), "type"));
      if (bt != NULL && strcmp(bt, "tool_use") == 0)
        json_array_remove(content, k);
    }
    json_object_set_new(j, "stop_reason", json_string("end_turn"));
    ag__px_set_json(r, 200, j);
    ag__px_upstream_free(&u);
    if (r->status == 200)
      r->stop = ag_reason_name(v->reason);
    return;
  }
  json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
  json_t *m = json_object_get(ch, "message");
  if (!json_is_object(m)) {
    json_decref(j);
    ag__px_set_error(r, 502, "upstream_error", "upstream_bad_reply",
                     "agentguard proxy: the upstream's reply is not a Chat "
                     "Completions response: choices[0].message is missing");
    ag__px_upstream_free(&u);
    return;
  }
  /* A server that ignores the missing tools still gets no call through. */
  json_object_del(m, "tool_calls");
  json_object_del(m, "function_call");
  json_object_set_new(ch, "finish_reason", json_string("stop"));
  if (stream) {
    sbuf sb = {NULL, 0, 0, false};
    const char *id = json_string_value(json_object_get(j, "id"));
    const char *model = json_string_value(json_object_get(j, "model"));
    ag__px_sb_reply(&sb, id != NULL ? id : "chatcmpl-agentguard",
                    model != NULL ? model : "agentguard",
                    json_string_value(json_object_get(m, "content")), NULL,
                    "stop");
    json_decref(j);
    ag__px_set_sse(r, &sb);
  } else {
    ag__px_set_json(r, 200, j);
  }
  ag__px_upstream_free(&u);
  if (r->status == 200)
    r->stop = ag_reason_name(v->reason);
}

/* Checks a reply: its tokens, text and calls. Returns the action; with
 * AG_NUDGE, checks[i].action says which calls are held back. */
ag_action ag__px_check_reply(ag_guard *g, const ag_reply *rep,
                             bool text_checked, ag_call_check *checks,
                             ag_verdict *v) {
  if (rep->has_usage)
    ag_guard_record_tokens(g, rep->usage.prompt_tokens +
                                  rep->usage.completion_tokens);
  ag_action act = AG_ALLOW;
  if (!text_checked && rep->text != NULL && rep->text[0] != '\0')
    act = ag_guard_check_text(g, rep->text, strlen(rep->text), false, v);
  if (act != AG_ALLOW || rep->n_calls == 0)
    return act;
  ag_call calls[AG__CALLS_MAX];
  for (size_t i = 0; i < rep->n_calls; i++) {
    calls[i].name = rep->calls[i].name != NULL ? rep->calls[i].name : "";
    calls[i].args = rep->calls[i].arguments;
    calls[i].args_len = rep->calls[i].arguments_len;
  }
  act = ag_guard_check_calls(g, calls, rep->n_calls, 0, checks, v);
  if (act != AG_ALLOW)
    return act;
  for (size_t i = 0; i < rep->n_calls; i++)
    if (checks[i].action == AG_NUDGE) {
      v->action = AG_NUDGE;
      v->reason = checks[i].reason;
      v->call_index = (int)i;
      snprintf(v->tool, sizeof v->tool, "%s", calls[i].name);
      snprintf(v->message, sizeof v->message, "%s", checks[i].message);
      return AG_NUDGE;
    }
  return AG_ALLOW;
}

/* The messages that answer the held-back calls with their nudge text. */
json_t *ag__px_nudge_messages_anthropic(const ag_reply *rep,
                                        const ag_call_check *checks) {
  json_t *uses = json_array(), *results = json_array();
  json_t *out = NULL;
  for (size_t i = 0; uses != NULL && results != NULL && i < rep->n_calls; i++) {
    if (checks[i].action != AG_NUDGE)
      continue;
    const ag_tool_call *tc = &rep->calls[i];
    json_t *input = json_loadb(tc->arguments, tc->arguments_len, 0, NULL);
    if (!json_is_object(input)) {
      json_decref(input);
      input = json_object();
    }
    if (json_array_append_new(uses, json_pack("{s:s, s:s, s:s, s:o}", "type",
                                              "tool_use", "id", tc->id, "name",
                                              tc->name, "input", input)) != 0 ||
        json_array_append_new(results,
                              json_pack("{s:s, s:s, s:s}", "type",
                                        "tool_result", "tool_use_id", tc->id,
                                        "content", checks[i].message)) != 0)
      goto done;
  }
  if (uses != NULL && results != NULL)
    out = json_pack("[{s:s, s:O}, {s:s, s:O}]", "role", "assistant", "content",
                    uses, "role", "user", "content", results);
done:
  json_decref(uses);
  json_decref(results);
  return out;
}

json_t *ag__px_nudge_messages(const ag_reply *rep,
                              const ag_call_check *checks) {
  json_t *tcs = json_array(), *out = json_array();
  if (tcs == NULL || out == NULL)
    goto ag__px_fail;
  for (size_t i = 0; i < rep->n_calls; i++) {
    if (checks[i].action != AG_NUDGE)
      continue;
    const ag_tool_call *tc = &rep->calls[i];
    json_t *call = json_pack("{s:s, s:s, s:{s:s, s:s%}}", "id", tc->id, "type",
                             "function", "function", "name", tc->name,
                             "arguments", tc->arguments, tc->arguments_len);
    if (call == NULL || json_array_append_new(tcs, call) != 0)
      goto ag__px_fail;
  }
  json_t *am = json_pack("{s:s, s:O, s:O}", "role", "assistant", "content",
                         json_null(), "tool_calls", tcs);
  if (am == NULL || json_array_append_new(out, am) != 0)
    goto ag__px_fail;
  for (size_t i = 0; i < rep->n_calls; i++) {
    if (checks[i].action != AG_NUDGE)
      continue;
    json_t *tm = json_pack("{s:s, s:s, s:s}", "role", "tool", "tool_call_id",
                           rep->calls[i].id, "content", checks[i].message);
    if (tm == NULL || json_array_append_new(out, tm) != 0)
      goto ag__px_fail;
  }
  json_decref(tcs);
  return out;
ag__px_fail:
  json_decref(tcs);
  json_decref(out);
  return NULL;
}

/* Records the nudged batch (nothing ran: every call skipped) so that the
 * re-asked reply is checked with the nudge already spent. */
ag_action ag__px_record_nudged(ag_guard *g, const ag_reply *rep,
                               const ag_call_check *checks, ag_verdict *v) {
  ag_result res[AG__CALLS_MAX];
  for (size_t i = 0; i < rep->n_calls; i++) {
    res[i].name = rep->calls[i].name != NULL ? rep->calls[i].name : "";
    res[i].sig = checks[i].valid ? checks[i].sig : NULL;
    res[i].outcome = AG_OUTCOME_SKIPPED;
    res[i].text = checks[i].message;
    res[i].text_len = strlen(checks[i].message);
    res[i].category = AG_CAT_UNKNOWN;
  }
  ag_action act = ag_guard_record_results(g, res, rep->n_calls, 0, v);
  if (!ag__stops(act))
    act = ag_guard_begin_iteration(g, 0, v);
  return act;
}

/* ---- Anthropic Messages (/v1/messages) -------------------------------- */

/* The text of a content value: a string, or the text blocks of an array. */
/* Whether an Anthropic message has text (a string, or a text block): a
 * user message with text starts a turn. */
bool ag__px_anth_has_text(const json_t *m) {
  const json_t *content = json_object_get(m, "content");
  if (json_is_string(content))
    return true;
  size_t k;
  const json_t *b;
  json_array_foreach(content, k, b) {
    const char *bt = json_string_value(json_object_get(b, "type"));
    if (bt != NULL && strcmp(bt, "text") == 0)
      return true;
  }
  return false;
}

/* The text ag__blocks_text makes of `content`, without a copy when it is a
 * string or a single text block; a joined one is owned by f. NULL when out
 * of memory. */
const char *ag__px_anth_text(const json_t *content, fast_traj *f, size_t *len) {
  if (json_is_string(content)) {
    *len = json_string_length(content);
    return json_string_value(content);
  }
  const char *one = "";
  size_t n = 0, i;
  const json_t *b;
  *len = 0;
  json_array_foreach(content, i, b) {
    size_t l = 0;
    const char *t = ag__jstr(b, "text", &l);
    if (t == NULL)
      continue;
    if (n++ == 0) {
      one = t;
      *len = l;
    }
  }
  if (n <= 1)
    return one;
  json_t *joined = ag__blocks_text(content);
  char *copy = joined != NULL ? malloc(json_string_length(joined) + 1) : NULL;
  if (copy != NULL) {
    *len = json_string_length(joined);
    memcpy(copy, json_string_value(joined), *len + 1);
    f->owned[f->n_owned++] = copy;
  }
  json_decref(joined);
  return copy;
}

/*
 * ag__px_fast_turn for Anthropic messages (already checked by
 * ag__wire_messages.to_chat): the turn that starts at msgs[from] (a user
 * message with text) read straight from the parsed request into the steps that
 * ag__wire_messages.to_chat then ag__px_fast_turn would give, without building
 * the chat messages. Anything ag__px_fast_turn would leave to the slow path (a
 * result before any call, an unknown or repeated id, an unanswered call, a
 * tool_result in an assistant message) returns 0 here too. 1, 0 or -1 (out of
 * memory) as ag__px_fast_turn.
 */
int ag__px_fast_turn_anth(const json_t *msgs, size_t from, fast_traj *f) {
  memset(f, 0, sizeof(*f));
  size_t n = json_array_size(msgs), n_calls = 0, n_steps = 0, n_blocks = 0;
  for (size_t i = from + 1; i < n; i++) {
    const json_t *m = json_array_get(msgs, i);
    const json_t *content = json_object_get(m, "content");
    n_blocks += json_array_size(content);
    if (strcmp(role_of(m), "assistant") != 0)
      continue;
    n_steps++;
    size_t k;
    const json_t *b;
    json_array_foreach(content, k, b) {
      const char *bt = json_string_value(json_object_get(b, "type"));
      n_calls += bt != NULL && strcmp(bt, "tool_use") == 0;
    }
  }
  if (ag__px_t_alloc(f, n_steps, n_calls) < 0)
    return -1;
  f->owned = calloc(n_steps + n_calls + n_blocks + 1, sizeof(*f->owned));
  if (f->owned == NULL)
    goto oom;
  size_t si = 0, ci = 0, step0 = 0;
  bool in_step = false;
  for (size_t i = from + 1; i < n; i++) {
    const json_t *m = json_array_get(msgs, i);
    const json_t *content = json_object_get(m, "content");
    size_t k;
    const json_t *b;
    if (strcmp(role_of(m), "assistant") == 0) {
      for (size_t q = step0; in_step && q < ci; q++)
        if (!f->answered[q])
          goto slow;
      ag_traj_step *st = &f->steps[si++];
      in_step = true;
      step0 = ci;
      st->text = ag__px_anth_text(content, f, &st->text_len);
      if (st->text == NULL)
        goto oom;
      ag__px_t_step(st, f, ci);
      json_array_foreach(content, k, b) {
        const char *bt = json_string_value(json_object_get(b, "type"));
        if (strcmp(bt, "tool_result") == 0)
          goto slow;
        if (strcmp(bt, "tool_use") != 0)
          continue;
        const char *id = json_string_value(json_object_get(b, "id"));
        for (size_t q = step0; q < ci; q++)
          if (strcmp(f->ids[q], id) == 0)
            goto slow; /* a repeated id */
        const json_t *input = json_object_get(b, "input");
        char *args = input != NULL
                         ? json_dumps(input, JSON_COMPACT | JSON_ENCODE_ANY)
                         : ag__px_dupz("{}");
        if (args == NULL)
          goto oom;
        f->owned[f->n_owned++] = args;
        f->ids[ci] = id;
        f->calls[ci].name = json_string_value(json_object_get(b, "name"));
        f->calls[ci].args = args;
        f->calls[ci].args_len = strlen(args);
        f->results[ci].text = "";
        ci++;
      }
      st->n_calls = st->n_results = ci - step0;
      continue;
    }
    /* a user message after the turn's first: tool results only (one with
     * text would start a later turn) */
    json_array_foreach(content, k, b) {
      const char *bt = json_string_value(json_object_get(b, "type"));
      if (strcmp(bt, "tool_result") != 0)
        continue;
      if (!in_step)
        goto slow;
      const char *id = json_string_value(json_object_get(b, "tool_use_id"));
      ag_traj_result *res = ag__px_t_answer(f, step0, ci, id);
      if (res == NULL)
        goto slow;
      res->outcome = json_is_true(json_object_get(b, "is_error"))
                         ? AG_OUTCOME_ERROR
                         : AG_OUTCOME_OK;
      res->category = AG_CAT_AUTO;
      res->text =
          ag__px_anth_text(json_object_get(b, "content"), f, &res->text_len);
      if (res->text == NULL)
        goto oom;
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
oom:
  ag__px_fast_free(f);
  return -1;
}

/*
 * replay_turn for Anthropic messages: every message checked (a 400 names
 * the first bad one), then the turn (from the last user message with text)
 * read by ag__px_fast_turn_anth, or, when it leaves it to the slow path,
 * converted by ag__wire_messages.to_chat from there and replayed as chat. Only
 * the turn is converted: the history before it costs the check alone. Returns
 * as replay_turn.
 */
static int replay_turn_anth(ag_guard *g, const json_t *msgs, ag_verdict *v,
                            char *emsg, size_t cap) {
  json_t *checked = ag__wire_messages.to_chat(msgs, SIZE_MAX, emsg, cap);
  if (checked == NULL)
    return emsg[0] != '\0' ? -1 : -2;
  json_decref(checked);
  size_t from = SIZE_MAX;
  for (size_t i = json_array_size(msgs); i-- > 0;) {
    const json_t *m = json_array_get(msgs, i);
    if (strcmp(role_of(m), "user") == 0 && ag__px_anth_has_text(m)) {
      from = i;
      break;
    }
  }
  if (from != SIZE_MAX) {
    memset(v, 0, sizeof(*v));
    v->call_index = -1;
    ag_guard_begin_turn(g, 0);
    fast_traj f;
    int fr = ag__px_fast_turn_anth(msgs, from, &f);
    if (fr < 0)
      return -2;
    if (fr > 0)
      return ag__px_replay_fast(g, &f, v);
  }
  json_t *chat =
      ag__wire_messages.to_chat(msgs, from == SIZE_MAX ? 0 : from, emsg, cap);
  if (chat == NULL)
    return emsg[0] != '\0' ? -1 : -2;
  int act = ag__px_replay_turn(g, chat, from, v, emsg, cap);
  json_decref(chat);
  return act;
}

/* An Anthropic message object as the events of a stream. */
static void anthropic_sse(reply *r) {
  json_t *msg = json_loadb(r->body != NULL ? r->body : "", r->len, 0, NULL);
  sbuf b = {NULL, 0, 0, false};
  json_t *content = json_object_get(msg, "content");
  if (!json_is_array(content)) {
    json_decref(msg);
    ag__px_set_error(r, 502, "upstream_error", "upstream_bad_reply",
                     "agentguard proxy: the upstream's reply is not a Messages "
                     "response: no content array");
    return;
  }
  json_t *usage = json_object_get(msg, "usage");
  json_t *start = json_deep_copy(msg);
  json_object_set_new(start, "content", json_array());
  json_object_set_new(start, "stop_reason", json_null());
#define EV(name, obj)                                                          \
  do {                                                                         \
    ag__px_sb_add(&b, "event: " name "\n", sizeof("event: " name "\n") - 1);   \
    ag__px_sb_json(&b, obj);                                                   \
  } while (0)
  EV("message_start",
     json_pack("{s:s, s:o}", "type", "message_start", "message", start));
  size_t i;
  json_t *blk;
  json_array_foreach(content, i, blk) {
    const char *bt = json_string_value(json_object_get(blk, "type"));
    json_t *head = json_deep_copy(blk);
    json_t *delta = NULL;
    if (bt != NULL && strcmp(bt, "text") == 0) {
      json_object_set_new(head, "text", json_string(""));
      delta = json_pack("{s:s, s:O}", "type", "text_delta", "text",
                        json_object_get(blk, "text"));
    } else if (bt != NULL && strcmp(bt, "tool_use") == 0) {
      char *in = json_dumps(json_object_get(blk, "input"),
                            JSON_COMPACT | JSON_ENCODE_ANY);
      json_object_set_new(head, "input", json_object());
      delta = json_pack("{s:s, s:s}", "type", "input_json_delta",
                        "partial_json", in != NULL ? in : "{}");
      free(in);
    }
    EV("content_block_start",
       json_pack("{s:s, s:i, s:o}", "type", "content_block_start", "index",
                 (int)i, "content_block", head));
    if (delta != NULL)
      EV("content_block_delta",
         json_pack("{s:s, s:i, s:o}", "type", "content_block_delta", "index",
                   (int)i, "delta", delta));
    EV("content_block_stop",
       json_pack("{s:s, s:i}", "type", "content_block_stop", "index", (int)i));
  }
  json_t *out_tokens = json_object_get(usage, "output_tokens");
  EV("message_delta",
     json_pack("{s:s, s:{s:O, s:n}, s:{s:I}}", "type", "message_delta", "delta",
               "stop_reason", json_object_get(msg, "stop_reason"),
               "stop_sequence", "usage", "output_tokens",
               (json_int_t)(json_is_integer(out_tokens)
                                ? json_integer_value(out_tokens)
                                : 0)));
  EV("message_stop", json_pack("{s:s}", "type", "message_stop"));
#undef EV
  json_decref(msg);
  free(r->body);
  r->body = NULL;
  curl_slist_free_all(r->headers);
  r->headers = NULL;
  ag__px_set_sse(r, &b);
}

/* The request as a jansson tree (*req), parsed now if the decision came
 * from the tape; false with a 400 in r if jansson refuses it. */
static bool load_req(const req_ctx *q, json_t **req, reply *r) {
  if (*req != NULL)
    return true;
  json_error_t je;
  *req = json_loadb(q->body != NULL ? q->body : "", q->len, 0, &je);
  if (*req == NULL)
    ag__px_set_error(
        r, 400, "invalid_request_error", "invalid_json",
        "agentguard proxy: the request body is not JSON: %s (line %d, "
        "column %d)",
        je.text, je.line, je.column);
  return *req != NULL;
}

/* One guarded request being decided (ag__px_chat and its steps). */
typedef struct decision {
  ag_proxy *p;
  req_ctx *q;
  const char *path;
  reply *r;    /* the answer, once one is set */
  json_t *req; /* the parsed request, once it is needed (load_req) */
  ag_guard *g; /* the turn replayed */
  ag_verdict v;
  bool stream; /* "stream": true */
  char *fwd;   /* what goes upstream instead of the body, or NULL */
  size_t fwd_len;
} decision;

/* The jansson path: the body parsed and its shape checked (a 400 names
 * what is wrong), the turn replayed through a fresh guard, the coming
 * request counted. The action, or -1 when d->r holds the answer. */
static int decide_tree(decision *d) {
  reply *r = d->r;
  json_error_t je;
  d->req = json_loadb(d->q->body != NULL ? d->q->body : "", d->q->len, 0, &je);
  if (d->req == NULL) {
    ag__px_set_error(
        r, 400, "invalid_request_error", "invalid_json",
        "agentguard proxy: the request body is not JSON: %s (line %d, "
        "column %d)",
        je.text, je.line, je.column);
    return -1;
  }
  json_t *msgs = json_object_get(d->req, "messages");
  if (!json_is_object(d->req) || !json_is_array(msgs) ||
      json_array_size(msgs) == 0) {
    ag__px_set_error(r, 400, "invalid_request_error", "invalid_request",
                     "agentguard proxy: %s",
                     !json_is_object(d->req)
                         ? "the request body must be a JSON object"
                         : "messages: expected a non-empty array");
    return -1;
  }
  size_t i;
  json_t *m;
  json_array_foreach(msgs, i, m) {
    if (!json_is_string(json_object_get(m, "role"))) {
      ag__px_set_error(
          r, 400, "invalid_request_error", "invalid_request",
          "agentguard proxy: messages[%zu].role: expected a string", i);
      return -1;
    }
  }
  char emsg[ERR_MSG_MAX];
  d->stream = json_is_true(json_object_get(d->req, "stream"));
  ag_error_t err;
  if (ag_guard_new(&d->g, &d->p->cfg, NULL, &err) != AG_OK) {
    ag__px_set_error(r, 500, "server_error", "guard", "agentguard proxy: %s",
                     err.msg);
    return -1;
  }
  int act =
      r->anthropic
          ? replay_turn_anth(d->g, msgs, &d->v, emsg, sizeof emsg)
          : ag__px_replay_turn(d->g, msgs, SIZE_MAX, &d->v, emsg, sizeof emsg);
  if (act == -1)
    ag__px_set_error(r, 400, "invalid_request_error", "invalid_request",
                     "agentguard proxy: %s", emsg);
  else if (act == -2)
    ag__px_set_error(r, 500, "server_error", "out_of_memory", "out of memory");
  if (act < 0)
    return -1;
  if (!ag__stops((ag_action)act))
    act = ag_guard_begin_iteration(d->g, 0, &d->v);
  return act;
}

/* The error context of the replayed errors, for this request only (the
 * loop's rule: it never enters the conversation the client keeps): d->fwd
 * is the body with it. false when d->r holds the answer. */
static bool add_error_context(decision *d) {
  char ectx[8192];
  size_t need = ag_guard_error_context(d->g, AG_RECOVER_EXECUTION, NULL, 0,
                                       ectx, sizeof ectx);
  if (need == 0 || ectx[0] == '\0')
    return true;
  if (!load_req(d->q, &d->req, d->r))
    return false;
  json_t *extra = json_pack("[{s:s, s:s}]", "role", "user", "content", ectx);
  free(d->fwd);
  d->fwd =
      extra != NULL ? ag__px_with_messages(d->req, extra, &d->fwd_len) : NULL;
  json_decref(extra);
  if (d->fwd == NULL) {
    ag__px_set_error(d->r, 500, "server_error", "out_of_memory",
                     "out of memory");
    return false;
  }
  ag__px_event(d->p, &d->q->attr, "error_context", d->path, NULL, NULL);
  return true;
}

/* A whole reply from the upstream into *rep: true when it is a 2xx reply
 * of the API's shape; else d->r holds the answer (the upstream's own, or a
 * 502). */
static bool ask_upstream(decision *d, const char *body, size_t len, bool ours,
                         upstream *u, ag_reply *rep) {
  ag__px_upstream_free(u);
  ag__px_send_upstream(d->p, d->q->client_hdrs, "POST", d->q->uri, body, len,
                       ours, d->q->client_fd, u);
  ag__px_attr_upstream(&d->q->attr, u->total_us);
  if (ag__px_upstream_failed(d->p, u, d->r))
    return false;
  if (u->status < 200 || u->status >= 300) {
    ag__px_pass_back(u, d->r);
    return false;
  }
  if (!ag__px_read_reply(u, rep, d->r))
    return false;
  ag__px_attr_usage(&d->q->attr, rep);
  return true;
}

/* The stop reply for a reply the check replaced (d->v says why). */
static void replace_reply(decision *d) {
  ag__px_event(d->p, &d->q->attr, "reply_replaced", d->path, &d->v, NULL);
  set_stop_reply(d->p, d->req, &d->v, d->r);
}

/* A request that is not streamed, forwarded: its reply checked and passed
 * back, replaced, or nudged once (the held-back calls answered by the
 * nudge, asked again). */
static void answer_whole(decision *d) {
  upstream u;
  memset(&u, 0, sizeof u);
  ag_reply rep, rep2;
  memset(&rep, 0, sizeof rep);
  memset(&rep2, 0, sizeof rep2);
  ag_call_check checks[AG__CALLS_MAX];
  const char *body = d->fwd != NULL ? d->fwd : d->q->body;
  size_t len = d->fwd != NULL ? d->fwd_len : d->q->len;
  if (!ask_upstream(d, body, len, d->fwd != NULL, &u, &rep))
    goto out;
  ag_action act = ag__px_check_reply(d->g, &rep, false, checks, &d->v);
  if (act == AG_ALLOW) {
    ag__px_pass_back(&u, d->r);
    goto out;
  }
  if (!load_req(d->q, &d->req, d->r))
    goto out;
  if (ag__stops(act)) {
    replace_reply(d);
    goto out;
  }
  ag__px_event(d->p, &d->q->attr, "nudge", d->path, &d->v, NULL);
  json_t *extra = d->r->anthropic
                      ? ag__px_nudge_messages_anthropic(&rep, checks)
                      : ag__px_nudge_messages(&rep, checks);
  size_t nlen = 0;
  char *nbody =
      extra != NULL ? ag__px_with_messages(d->req, extra, &nlen) : NULL;
  json_decref(extra);
  if (nbody == NULL) {
    ag__px_set_error(d->r, 500, "server_error", "out_of_memory",
                     "out of memory");
    goto out;
  }
  act = ag__px_record_nudged(d->g, &rep, checks, &d->v);
  bool asked = !ag__stops(act) && ask_upstream(d, nbody, nlen, true, &u, &rep2);
  free(nbody);
  if (!ag__stops(act) && !asked)
    goto out; /* d->r holds the upstream's answer or a 502 */
  if (asked) {
    act = ag__px_check_reply(d->g, &rep2, false, checks, &d->v);
    if (act == AG_ALLOW) {
      ag__px_pass_back(&u, d->r);
      goto out;
    }
    if (act == AG_NUDGE)
      d->v.action = AG_STOP; /* one nudge per request: a second one stops */
  }
  replace_reply(d);
out:
  ag_reply_clear(&rep);
  ag_reply_clear(&rep2);
  ag__px_upstream_free(&u);
}

/* A 400 the proxy answers itself leaves an event with its message: a
 * client (Claude Code) that gets one otherwise says nothing of it, and
 * only the events say why its agent stopped at once. */
void ag__px_bad_request(ag_proxy *p, ag__px_attr *a, const char *path,
                        const reply *r) {
  json_t *j = json_loadb(r->body != NULL ? r->body : "", r->len, 0, NULL);
  json_t *e = json_object_get(j, "error");
  const char *m = json_string_value(json_object_get(e, "message"));
  ag__px_event(p, a, "bad_request", path, NULL, m != NULL ? m : "");
  json_decref(j);
}

/* Decides a guarded request and acts on it: r is the answer, or
 * *started says a stream was handed to the loop (ag__px_stream_start). With
 * `later` (on the loop's thread, which may not wait), a request whose
 * answer needs a whole upstream reply (not a stream, or the final request
 * without tools) is left untouched for a worker, with *later set. */
void ag__px_chat(ag_proxy *p, struct MHD_Connection *c, req_ctx *q,
                 const char *path, reply *r, bool *started, bool *later) {
  if (r->shape != NULL && r->shape->stop_body != NULL) {
    ag__px_request_only(p, c, q, path, r, started, later);
    return;
  }
  decision d;
  memset(&d, 0, sizeof d);
  d.p = p;
  d.q = q;
  d.path = path;
  d.r = r;
  /* the decision from the tape; the tree is parsed only when needed */
  int act = ag__px_tape_decide(&p->cfg, q->body, q->len, r->anthropic, &d.g,
                               &d.v, &d.stream);
  if (act == -2) {
    ag__px_set_error(r, 500, "server_error", "out_of_memory", "out of memory");
    return;
  }
  if (act == TAPE_FALLBACK)
    act = decide_tree(&d);
  else if (ag__stops((ag_action)act) && !load_req(q, &d.req, r))
    act = -1;
  /* an Anthropic stream is relayed (ag__px_stream_start); a reply the proxy
   * makes itself is told as a stream at the end (anthropic_sse) */
  bool anth_stream = r->anthropic && d.stream;
  bool final = ag__stops((ag_action)act) &&
               p->cfg.loop.final_request_without_tools && d.v.action == AG_STOP;
  if (act < 0) {
    /* r holds the answer */
  } else if (later != NULL && (ag__stops((ag_action)act) ? final : !d.stream)) {
    *later = true; /* nothing said or sent yet: the worker decides again */
  } else if (ag__stops((ag_action)act)) {
    ag__px_event(p, &q->attr,
                 final ? "final_request_without_tools"
                       : "stopped_before_request",
                 path, &d.v, NULL);
    if (final)
      final_without_tools(p, &q->attr, q->client_hdrs, q->uri, q->client_fd,
                          d.req, &d.v, r);
    else
      set_stop_reply(p, d.req, &d.v, r);
  } else if (p->cfg.errors.error_context && !add_error_context(&d)) {
    /* r holds the answer */
  } else if (d.stream) {
    *started = ag__px_stream_start(p, c, q, &d.fwd, d.fwd_len, r->anthropic,
                                   path, &d.g, r);
    if (*started)
      anth_stream = false; /* q and r are the loop's now: not touched */
  } else {
    answer_whole(&d);
  }
  if (!*started && r->status == 400) /* started: r is the loop's */
    ag__px_bad_request(p, &q->attr, path, r);
  if (anth_stream && r->status == 200)
    anthropic_sse(r);
  ag_guard_free(d.g);
  json_decref(d.req);
  free(d.fwd);
}

int ag_proxy_decide(const ag_config *cfg, const char *body, size_t len,
                    bool anthropic, ag_verdict *v, ag_error_t *err) {
  return ag_proxy_decide_read(cfg, body, len, anthropic, AG_PROXY_READ_ANY, v,
                              err);
}

int ag_proxy_decide_read(const ag_config *cfg, const char *body, size_t len,
                         bool anthropic, ag_proxy_read how, ag_verdict *v,
                         ag_error_t *err) {
  if (how != AG_PROXY_READ_TREE) {
    ag_guard *tg = NULL;
    bool stream = false;
    int tact = ag__px_tape_decide(cfg, body, len, anthropic, &tg, v, &stream);
    ag_guard_free(tg);
    if (tact == -2) {
      ag__px_fail(err, AG_ENOMEM, "out of memory");
      return -1;
    }
    if (tact != TAPE_FALLBACK)
      return tact;
    if (how == AG_PROXY_READ_TAPE)
      return -2;
  }
  json_error_t je;
  json_t *req = json_loadb(body, len, 0, &je);
  if (req == NULL) {
    ag__px_fail(err, AG_EJSON,
                "the request body is not JSON: %s (line %d, column %d)",
                je.text, je.line, je.column);
    return -1;
  }
  json_t *msgs = json_object_get(req, "messages");
  ag_guard *g = NULL;
  char emsg[ERR_MSG_MAX];
  int act = -1;
  if (!json_is_array(msgs) || json_array_size(msgs) == 0) {
    ag__px_fail(err, AG_EINVAL, "messages: expected a non-empty array");
    goto out;
  }
  size_t i;
  json_t *m;
  json_array_foreach(msgs, i, m) {
    if (!json_is_string(json_object_get(m, "role"))) {
      ag__px_fail(err, AG_EINVAL, "messages[%zu].role: expected a string", i);
      goto out;
    }
  }
  if (ag_guard_new(&g, cfg, NULL, err) != AG_OK)
    goto out;
  act = anthropic ? replay_turn_anth(g, msgs, v, emsg, sizeof emsg)
                  : ag__px_replay_turn(g, msgs, SIZE_MAX, v, emsg, sizeof emsg);
  if (act == -1)
    ag__px_fail(err, AG_EINVAL, "%s", emsg);
  else if (act == -2)
    ag__px_fail(err, AG_ENOMEM, "out of memory");
  else if (!ag__stops((ag_action)act))
    act = ag_guard_begin_iteration(g, 0, v);
  if (act < 0)
    act = -1;
out:
  ag_guard_free(g);
  json_decref(req);
  return act;
}
