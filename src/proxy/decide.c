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
  free(f->steps); /* the one block of every array (ag__px_t_alloc) */
}

/* The arrays share one block, each starting where the one before ends. */
_Static_assert(sizeof(ag_traj_step) % _Alignof(ag_traj_call) == 0 &&
                   sizeof(ag_traj_call) % _Alignof(ag_traj_result) == 0 &&
                   sizeof(ag_traj_result) % _Alignof(const char *) == 0 &&
                   _Alignof(ag_traj_step) <= _Alignof(max_align_t),
               "fast_traj's arrays are laid out in one block");

/* Zeroes `f` and sizes its arrays for a turn of n_steps replies and n_calls
 * calls, in one zeroed block: 0, or -1 (out of memory, nothing kept). */
int ag__px_t_alloc(fast_traj *f, size_t n_steps, size_t n_calls) {
  memset(f, 0, sizeof(*f));
  const size_t ns = n_steps + 1, nc = n_calls + 1;
  const size_t per_call = sizeof(ag_traj_call) + sizeof(ag_traj_result) +
                          sizeof(const char *) + sizeof(bool);
  if (n_steps >= SIZE_MAX / 2 / sizeof(ag_traj_step) ||
      n_calls >= SIZE_MAX / 2 / per_call)
    return -1;
  size_t at_calls = ns * sizeof(ag_traj_step);
  size_t at_results = at_calls + nc * sizeof(ag_traj_call);
  size_t at_ids = at_results + nc * sizeof(ag_traj_result);
  size_t at_answered = at_ids + nc * sizeof(const char *);
  unsigned char *m = calloc(1, at_answered + nc * sizeof(bool));
  if (m == NULL)
    return -1;
  f->steps = (ag_traj_step *)(void *)m;
  f->calls = (ag_traj_call *)(void *)(m + at_calls);
  f->results = (ag_traj_result *)(void *)(m + at_results);
  f->ids = (const char **)(void *)(m + at_ids);
  f->answered = (bool *)(m + at_answered);
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

ag_err_t ag__px_replay_fast(ag_guard *g, fast_traj *f, ag_verdict *v,
                            ag_action *act) {
  int a = ag__replay_untimed(g, &f->t, v);
  ag__px_fast_free(f);
  if (a < 0)
    return AG_ENOMEM;
  *act = (ag_action)a;
  return AG_OK;
}

static ag_err_t replay_slow(ag_guard *g, const json_t *msgs, size_t start,
                            size_t shown, ag_verdict *v, char *emsg, size_t cap,
                            ag_action *act);

ag_err_t ag__px_replay_turn(ag_guard *g, const json_t *msgs, size_t shown,
                            ag_verdict *v, char *emsg, size_t cap,
                            ag_action *act) {
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
  *act = AG_ALLOW;
  if (!has_steps)
    return AG_OK;
  fast_traj f;
  int fr = ag__px_fast_turn(msgs, start, &f);
  if (fr < 0)
    return AG_ENOMEM;
  if (fr > 0)
    return ag__px_replay_fast(g, &f, v, act);
  return replay_slow(g, msgs, start, shown == SIZE_MAX ? start : shown, v, emsg,
                     cap, act);
}

/* The turn msgs[start..] written out and read by ag_trajectory_parse, the
 * audit's parser (whose error message a broken turn gets), then replayed. */
static ag_err_t replay_slow(ag_guard *g, const json_t *msgs, size_t start,
                            size_t shown, ag_verdict *v, char *emsg, size_t cap,
                            ag_action *act) {
  size_t n = json_array_size(msgs);
  json_t *turn = json_array();
  ag_err_t rc = AG_ENOMEM;
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
    rc = AG_EINVAL;
    goto out;
  }
  int a = ag__replay_untimed(g, t, v);
  if (a >= 0) {
    *act = (ag_action)a;
    rc = AG_OK;
  }
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

/* ---- Replies the proxy makes -------------------------------------------- */

void ag__px_set_sse(reply *r, ag__buf *b) {
  if (b->cut) {
    ag__buf_free(b);
    ag__px_set_error(r, 500, "server_error", "out_of_memory", "out of memory");
    return;
  }
  r->status = 200;
  r->ctype = "text/event-stream";
  r->body = b->p != NULL ? b->p : ag__px_dupz("");
  r->len = b->len;
  b->p = NULL; /* r's now */
  ag__buf_free(b);
}

/* The model a request names: its "model", else the path's
 * (".../models/<model>:<method>"), else "agentguard". */
static const char *model_of(const json_t *req, const char *path, char *buf,
                            size_t cap) {
  const char *named = json_string_value(json_object_get(req, "model"));
  if (named != NULL)
    return named;
  /* Gemini's and Vertex AI's paths name it: .../models/{model}:{method} */
  const char *s = NULL;
  const char *m = path != NULL ? ag__wire_model_method(path, &s) : NULL;
  if (m != NULL) {
    size_t n = (size_t)(m - 1 - s);
    if (n < cap) {
      memcpy(buf, s, n);
      buf[n] = '\0';
      return buf;
    }
  }
  return "agentguard";
}

void ag__px_stop_reply(ag_proxy *p, const req_ctx *q, const json_t *req,
                       const char *path, const ag_verdict *v, reply *r) {
  const ag__wire *w = r->shape;
  char text[AG_VERDICT_MSG_MAX * 2 + 128];
  ag__px_stop_text(v, text, sizeof text);
  char id[64], mbuf[256];
  snprintf(id, sizeof id, "%s%lu", w->id_prefix,
           (unsigned long)atomic_fetch_add(&p->ids, 1));
  const char *query = strchr(q->uri, '?');
  ag__reply_form form =
      w->reply_form(path, query != NULL ? query + 1 : "", req);
  size_t len = 0;
  char *body = w->stop_body(form, id, model_of(req, path, mbuf, sizeof mbuf),
                            text, (long long)time(NULL), &len);
  if (body == NULL) {
    ag__px_set_error(r, 500, "server_error", "out_of_memory", "out of memory");
    return;
  }
  if (form == AG__REPLY_SSE || form == AG__REPLY_NDJSON) {
    r->status = 200;
    r->ctype =
        form == AG__REPLY_SSE ? "text/event-stream" : "application/x-ndjson";
    r->body = body;
    r->len = len;
  } else {
    ag__px_set_json(r, 200, json_loadb(body, len, 0, NULL));
    free(body);
  }
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
 * shape's whole-reply reader, SSE by its event reader, lines of JSON (an
 * Ollama stream) line by line by its event reader, a JSON array (a Gemini
 * stream without alt=sse) element by element. */
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
  } else if (form == AG__REPLY_NDJSON) {
    for (size_t at = 0; at < len;) {
      const char *nl = memchr(body + at, '\n', len - at);
      size_t end = nl != NULL ? (size_t)(nl - body) : len, n = end - at;
      if (n > 0 && body[end - 1] == '\r')
        n--;
      if (n > 0 && w->event(a, "", body + at, n, at) != 0)
        break;
      at = end + 1;
    }
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
                          ag__chunk_tape *ct, ag_reply *out, reply *r) {
  ag_provider_error perr;
  memset(&perr, 0, sizeof perr);
  ag__asm a;
  ag__asm_init(&a, NULL, NULL, &perr, "upstream");
  a.ct = ct;
  /* the parse holds about twice the body again (jansson's tree, the text
   * copied out of it into `out`): taken from the budget with the body and
   * given back with it (this is a request's thread: it may wait) */
  size_t parse = u->bud != NULL && !u->parse_taken ? 2 * u->len : 0;
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

/* The upstream's reply read by the parser of the request's API (r->shape),
 * whole. false with a 502 in `r` when it is not
 * one. */
bool ag__px_read_reply(upstream *u, ag_reply *out, reply *r) {
  return ag__px_read_reply_as(u, r->shape, AG__REPLY_WHOLE, NULL, out, r);
}

int ag_proxy_read_whole(bool anthropic, const char *body, size_t len,
                        unsigned flags, char **out) {
  *out = NULL;
  ag__chunk_tape *ct =
      (flags & AG_PROXY_REPLAY_TREE) ? NULL : ag__chunk_tape_new();
  if (ct == NULL && !(flags & AG_PROXY_REPLAY_TREE))
    return -1;
  upstream u;
  memset(&u, 0, sizeof u);
  u.body = (char *)(uintptr_t)body; /* read, never written or freed */
  u.len = len;
  reply r;
  memset(&r, 0, sizeof r);
  ag_reply rep;
  memset(&rep, 0, sizeof rep);
  json_t *o;
  const ag__wire *w = anthropic ? &ag__wire_messages : &ag__wire_chat;
  if (ag__px_read_reply_as(&u, w, AG__REPLY_WHOLE, ct, &rep, &r)) {
    json_t *calls = json_array();
    for (size_t i = 0; i < rep.n_calls; i++)
      json_array_append_new(calls, json_pack("{s:s?, s:s?, s:s%}", "id",
                                             rep.calls[i].id, "name",
                                             rep.calls[i].name, "arguments",
                                             rep.calls[i].arguments != NULL
                                                 ? rep.calls[i].arguments
                                                 : "",
                                             rep.calls[i].arguments_len));
    o = json_pack("{s:s?, s:s?, s:o, s:s, s:b, s:I, s:I, s:I}", "text",
                  rep.text, "refusal", rep.refusal, "calls", calls, "finish",
                  rep.finish_reason, "has_usage", rep.has_usage, "prompt",
                  (json_int_t)rep.usage.prompt_tokens, "completion",
                  (json_int_t)rep.usage.completion_tokens, "cached",
                  (json_int_t)rep.usage.cached_tokens);
  } else {
    o = json_pack("{s:i, s:s%}", "status", (int)r.status, "body",
                  r.body != NULL ? r.body : "", r.len);
  }
  *out = o != NULL ? json_dumps(o, JSON_COMPACT) : NULL;
  json_decref(o);
  ag_reply_clear(&rep);
  ag__px_reply_free(&r);
  ag__chunk_tape_free(ct);
  return *out != NULL ? 0 : -1;
}

/* The final request's reply (j, taken), its calls taken out, as r: whole,
 * or as the events of a stream when the client asked for one. */
static void final_reply(reply *r, json_t *j, bool stream) {
  const ag__wire *w = r->shape;
  char emsg[256];
  ag__buf sb;
  ag__buf_init(&sb, SSE_OUT_MAX);
  if (!w->strip_calls(j, emsg, sizeof emsg) ||
      (stream && !w->whole_to_sse(j, &sb, emsg, sizeof emsg))) {
    json_decref(j);
    ag__buf_free(&sb);
    ag__px_set_error(r, 502, "upstream_error", "upstream_bad_reply",
                     "agentguard proxy: the upstream's reply is not a %s "
                     "response: %s",
                     w->api, emsg);
    return;
  }
  if (stream) {
    json_decref(j);
    ag__px_set_sse(r, &sb);
  } else {
    ag__buf_free(&sb);
    ag__px_set_json(r, 200, j);
  }
}

/* The final request without tools: the reply, tool calls stripped. */
static void final_without_tools(ag_proxy *p, req_ctx *q, const json_t *req,
                                const ag_verdict *v, reply *r) {
  ag__px_attr *a = &q->attr;
  json_t *b = without_tools(req);
  const bool stream = json_is_true(json_object_get(req, "stream"));
  if (b != NULL && stream) {
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
  ag__px_send_upstream(q->sh->relay, p, q->client_hdrs, "POST", q->uri, body,
                       len, true, q->client_fd, &u);
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
  ag__px_upstream_free(&u);
  final_reply(r, j, stream);
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

/* The turn of a conversation in the request's shape replayed through g, as
 * ag__px_replay_turn returns: a shape with messages of its own is read as
 * the audit reads it (to_chat: every message checked, a 400 naming the
 * first bad one), then replayed as chat. */
static ag_err_t replay_tree(ag_guard *g, const ag__wire *w, const json_t *msgs,
                            ag_verdict *v, char *emsg, size_t cap,
                            ag_action *act) {
  if (w->to_chat == NULL)
    return ag__px_replay_turn(g, msgs, SIZE_MAX, v, emsg, cap, act);
  /* every message checked; only the turn converted, when the shape says
   * where it starts (the history before it costs the check alone) */
  size_t from = 0;
  if (w->turn_start != NULL) {
    json_t *checked = w->to_chat(msgs, SIZE_MAX, emsg, cap);
    if (checked == NULL)
      return emsg[0] != '\0' ? AG_EINVAL : AG_ENOMEM;
    json_decref(checked);
    from = w->turn_start(msgs);
    if (from == SIZE_MAX)
      from = 0;
  }
  json_t *chat = w->to_chat(msgs, from, emsg, cap);
  if (chat == NULL)
    return emsg[0] != '\0' ? AG_EINVAL : AG_ENOMEM;
  ag_err_t rc = ag__px_replay_turn(g, chat, from > 0 ? from : SIZE_MAX, v, emsg,
                                   cap, act);
  json_decref(chat);
  return rc;
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

/* One guarded request being decided (ag__px_guarded and its steps). */
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
 * request counted: *act, or false when d->r holds the answer. */
static bool decide_tree(decision *d, ag_action *act) {
  reply *r = d->r;
  json_error_t je;
  d->req = json_loadb(d->q->body != NULL ? d->q->body : "", d->q->len, 0, &je);
  if (d->req == NULL) {
    ag__px_set_error(
        r, 400, "invalid_request_error", "invalid_json",
        "agentguard proxy: the request body is not JSON: %s (line %d, "
        "column %d)",
        je.text, je.line, je.column);
    return false;
  }
  json_t *msgs = json_object_get(d->req, "messages");
  if (!json_is_object(d->req) || !json_is_array(msgs) ||
      json_array_size(msgs) == 0) {
    ag__px_set_error(r, 400, "invalid_request_error", "invalid_request",
                     "agentguard proxy: %s",
                     !json_is_object(d->req)
                         ? "the request body must be a JSON object"
                         : "messages: expected a non-empty array");
    return false;
  }
  size_t i;
  json_t *m;
  json_array_foreach(msgs, i, m) {
    if (!json_is_string(json_object_get(m, "role"))) {
      ag__px_set_error(
          r, 400, "invalid_request_error", "invalid_request",
          "agentguard proxy: messages[%zu].role: expected a string", i);
      return false;
    }
  }
  char emsg[ERR_MSG_MAX];
  d->stream = json_is_true(json_object_get(d->req, "stream"));
  ag_error_t err;
  if (ag__px_guard_get(d->p, &d->p->cfg, &d->g, &err) != AG_OK) {
    ag__px_set_error(r, 500, "server_error", "guard", "agentguard proxy: %s",
                     err.msg);
    return false;
  }
  ag_err_t rc =
      replay_tree(d->g, r->shape, msgs, &d->v, emsg, sizeof emsg, act);
  if (rc == AG_EINVAL)
    ag__px_set_error(r, 400, "invalid_request_error", "invalid_request",
                     "agentguard proxy: %s", emsg);
  else if (rc != AG_OK)
    ag__px_set_error(r, 500, "server_error", "out_of_memory", "out of memory");
  if (rc != AG_OK)
    return false;
  if (!ag__stops(*act))
    *act = ag_guard_begin_iteration(d->g, 0, &d->v);
  return true;
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
  if (d->q->prefetched != NULL) { /* asked on the loop already */
    *u = *d->q->prefetched;
    free(d->q->prefetched);
    d->q->prefetched = NULL;
  } else {
    ag__px_send_upstream(d->q->sh->relay, d->p, d->q->client_hdrs, "POST",
                         d->q->uri, body, len, ours, d->q->client_fd, u);
  }
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
  ag__px_stop_reply(d->p, d->q, d->req, d->path, &d->v, d->r);
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
  json_t *extra = d->r->shape->nudge_messages(&rep, checks);
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
void ag__px_guarded(ag_proxy *p, struct MHD_Connection *c, req_ctx *q,
                    const char *path, reply *r, bool *started, bool *later) {
  if (r->shape->relay_event == NULL) {
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
  ag_action act = AG_ALLOW;
  ag_err_t rc = ag__px_tape_decide(p, q, &p->cfg, q->body, q->len, r->shape,
                                   &d.g, &d.v, &d.stream, &act);
  if (rc == AG_ENOMEM) {
    ag__px_set_error(r, 500, "server_error", "out_of_memory", "out of memory");
    return;
  }
  bool decided = rc == AG_OK ? !ag__stops(act) || load_req(q, &d.req, r)
                             : decide_tree(&d, &act);
  bool final = decided && ag__stops(act) &&
               p->cfg.loop.final_request_without_tools && d.v.action == AG_STOP;
  if (!decided) {
    /* r holds the answer */
  } else if (later != NULL && final) {
    *later = true; /* nothing said or sent yet: the worker decides again */
  } else if (ag__stops(act)) {
    ag__px_event(p, &q->attr,
                 final ? "final_request_without_tools"
                       : "stopped_before_request",
                 path, &d.v, NULL);
    if (final)
      final_without_tools(p, q, d.req, &d.v, r);
    else
      ag__px_stop_reply(p, q, d.req, path, &d.v, r);
  } else if (p->cfg.errors.error_context && !add_error_context(&d)) {
    /* r holds the answer */
  } else if (d.stream) {
    *started = ag__px_stream_start(p, c, q, &d.fwd, d.fwd_len, r->shape, path,
                                   &d.g, r);
  } else if (later != NULL) { /* on the loop: its reply held on the loop */
    *started =
        ag__px_whole_start(p, c, q, &d.fwd, d.fwd_len, r->shape, path, &d.g, r);
  } else {
    answer_whole(&d);
  }
  if (!*started && r->status == 400) /* started: r is the loop's */
    ag__px_bad_request(p, &q->attr, path, r);
  ag__px_guard_put(p, d.g);
  json_decref(d.req);
  free(d.fwd);
}

ag_err_t ag__px_guard_get(ag_proxy *p, const ag_config *cfg, ag_guard **g,
                          ag_error_t *err) {
  if (p != NULL) /* a kept guard has p's config: so does a new one */
    cfg = &p->cfg;
  ag_guard *k = p != NULL ? ag__px_pool_take(&p->guards) : NULL;
  if (k == NULL)
    return ag_guard_new(g, cfg, NULL, err);
  ag__guard_renew(k);
  *g = k;
  return AG_OK;
}

void ag__px_guard_put(ag_proxy *p, ag_guard *g) {
  if (g != NULL && (p == NULL || !ag__px_pool_give(&p->guards, g)))
    ag_guard_free(g);
}

int ag_proxy_decide(const ag_config *cfg, const char *body, size_t len,
                    bool anthropic, ag_verdict *v, ag_error_t *err) {
  return ag_proxy_decide_read(cfg, body, len, anthropic, AG_PROXY_READ_ANY, v,
                              err);
}

int ag_proxy_decide_read(const ag_config *cfg, const char *body, size_t len,
                         bool anthropic, ag_proxy_read how, ag_verdict *v,
                         ag_error_t *err) {
  const ag__wire *w = anthropic ? &ag__wire_messages : &ag__wire_chat;
  if (how != AG_PROXY_READ_TREE) {
    ag_guard *tg = NULL;
    bool stream = false;
    ag_action tact = AG_ALLOW;
    ag_err_t rc = ag__px_tape_decide(NULL, NULL, cfg, body, len, w, &tg, v,
                                     &stream, &tact);
    ag_guard_free(tg);
    if (rc == AG_ENOMEM) {
      ag__px_fail(err, AG_ENOMEM, "out of memory");
      return -1;
    }
    if (rc == AG_OK)
      return (int)tact;
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
  ag_action a = AG_ALLOW;
  ag_err_t rc = replay_tree(g, w, msgs, v, emsg, sizeof emsg, &a);
  if (rc == AG_EINVAL)
    ag__px_fail(err, AG_EINVAL, "%s", emsg);
  else if (rc != AG_OK)
    ag__px_fail(err, AG_ENOMEM, "out of memory");
  else if (!ag__stops(a))
    a = ag_guard_begin_iteration(g, 0, v);
  if (rc == AG_OK)
    act = (int)a;
out:
  ag_guard_free(g);
  json_decref(req);
  return act;
}
