/*
 * src/proxy/stream.c - a transfer the loop runs for a client (internal.h:
 * stream_st): a streamed reply relayed (its events parsed as they come by
 * the shape's relay, text passed on and checked, tool calls held and
 * checked at the end, the end written or a nudge asked), a reply held
 * whole and checked at its end (`whole`), or a body passed through
 * (`raw`).
 *
 * A stream's state is three machines, each on its own fields (under `mu`
 * where two threads meet), because they move independently: the upstream
 * transfer, the request's answer, and the client's reading.
 *
 *   transfer   event                       -> state     fields
 *   running    q over the high mark         -> paused    paused
 *   paused     q drained below half         -> running   unpause_queued,
 *              (ag__px_stream_read)                      then the relay op
 *   running    budget short (whole)         -> paused    u.want; a thread
 *   paused     ... its bytes taken          -> running   waits (whole_*)
 *   any        done callback                -> ended     up
 *
 *   answer     event                       -> state
 *   none       2xx headers (relayed, raw)   -> stream    answer = STREAM:
 *                                                         the response
 *                                                         reads q
 *   none       done, or a non-2xx status     -> reply     answer = REPLY:
 *              (a whole reply: its check)                q->r is sent
 *   none       a whole reply stopped/nudged  -> worker    req_q handed on
 *                                                         (ag__px_requeue)
 *
 *   client     event                       -> state
 *   reading    q empty                      -> waiting   reader_waits; the
 *                                                         connection
 *                                                         suspended
 *   waiting    flush of new bytes or end     -> reading   resumed
 *   reading    end flushed, q read           -> done      finished
 *   any        response freed (left, done)   -> gone      client_gone: a
 *                                                         running transfer
 *                                                         is cancelled
 *
 * The stream is freed when the end's reference (`refs`: the loop's, or a
 * nudge's or budget waiter's thread), the response's, and every queued
 * relay request (`ops`) are let go.
 */
#define _GNU_SOURCE /* memmem */
#include "internal.h"

/* A stream's attribution (attr.h), or NULL. */
#define ST_ATTR(st) ((st)->ab != NULL ? &(st)->ab->a : NULL)

/* ---- A streamed reply, relayed ---------------------------------------- */

CURL *ag__px_easy_get(shard *sh) {
  CURL *h = sh != NULL ? ag__px_pool_take(&sh->easy) : NULL;
  return h != NULL ? h : curl_easy_init();
}

void ag__px_easy_put(shard *sh, CURL *h) {
  if (h == NULL)
    return;
  if (sh != NULL) {
    curl_easy_reset(h); /* every option back to its default */
    if (ag__px_pool_give(&sh->easy, h))
      return;
  }
  curl_easy_cleanup(h);
}

static void stream_destroy(stream_st *st) {
  ag__px_easy_put(st->sh, st->x.h); /* out of the relay's multi by now */
  ag__px_hdrs_free(st->hdrs);
  ag__px_hdrs_free(st->ch);
  free(st->url);
  ag__px_upstream_free(&st->u);
  ag__sse_free(&st->sse);
  ag__asm_free(&st->asmb);
  ag__wire_relay_free(&st->rl);
  ag__buf_free(&st->q);
  ag__px_guard_put(st->p, st->g);
  free(st->body);
  free(st->orig);
  free(st->uri);
  free(st->path);
  ag__px_attr_unshare(st->ab);
  atomic_fetch_sub(&st->p->streams, 1);
  pthread_mutex_destroy(&st->mu);
  free(st);
}

/* The request's attribution, shared with its stream (attr.h). */
static void share_attr(stream_st *st, req_ctx *q) {
  ag__px_attr_unshare(q->st_ab); /* not expected: one stream a request */
  st->ab = q->st_ab = ag__px_attr_share(&q->attr);
}

/* Lets go of one reference (refs) or one finished relay request (ops). */
void ag__px_stream_release(stream_st *st, bool ref) {
  pthread_mutex_lock(&st->mu);
  if (ref)
    st->refs--;
  else
    st->ops--;
  bool last = st->refs == 0 && st->ops == 0;
  pthread_mutex_unlock(&st->mu);
  if (last)
    stream_destroy(st);
}

static void on_cancel_taken(void *user) {
  ag__px_stream_release(user, false);
}

static void on_unpause_taken(void *user) {
  stream_st *st = user;
  pthread_mutex_lock(&st->mu);
  st->unpause_queued = false;
  pthread_mutex_unlock(&st->mu);
  ag__px_stream_release(st, false);
}

/* The response's free callback: the client has it all, or has gone. A
 * transfer still running is ended. */
void ag__px_stream_free(void *cls) {
  stream_st *st = cls;
  if (st == NULL)
    return;
  pthread_mutex_lock(&st->mu);
  st->client_gone = true;
  /* the response exists only once the transfer is on the relay (see
   * ag__px_answer_stream), and it is freed once: one cancel at most */
  bool cancel = !st->up;
  if (cancel)
    st->ops++;
  pthread_mutex_unlock(&st->mu);
  if (cancel)
    ag__relay_cancel(st->sh->relay, &st->x, &st->op_cancel);
  ag__px_stream_release(st, true);
}

/* Resumes a suspended connection: libmicrohttpd (run by the relay's
 * thread, without an inter-thread channel of its own) takes it up at the
 * relay's next round, which this wakes. */
void ag__px_resume(shard *sh, struct MHD_Connection *c) {
  MHD_resume_connection(c);
  ag__relay_wake(sh->relay);
}

/* Moves what `out` holds to the client's queue (`last`: and it is all),
 * and wakes the connection if it waits. */
void ag__px_flush(stream_st *st, bool last) {
  bool wake = false;
  pthread_mutex_lock(&st->mu);
  ag__buf *out = &st->rl.out;
  if (out->len > 0) {
    /* what was read goes: q holds only what waits (its cap is on that) */
    if (st->q_pos > 0) {
      memmove(st->q.p, st->q.p + st->q_pos, st->q.len - st->q_pos);
      st->q.len -= st->q_pos;
      st->q_pos = 0;
    }
    if (!last && st->q.len - st->q_pos + out->len > STREAM_Q_MAX)
      st->q.cut = true; /* the pause did not hold it back */
    if (last)
      st->q.cut = false; /* the end (an error event, if it failed) */
    ag__sse_add(&st->q, out->p, out->len);
    if (st->q.cut)
      out->cut = true;
    out->len = 0;
  }
  if (last)
    st->finished = true;
  if (st->reader_waits && (st->q_pos < st->q.len || st->finished)) {
    st->reader_waits = false;
    wake = true;
  }
  pthread_mutex_unlock(&st->mu);
  /* The connection stays suspended until this call (nobody else resumes
   * it), so it and the stream are still there. */
  if (wake)
    ag__px_resume(st->sh, st->c);
}

/* The stream's request is answered, on its loop (the transfer's callbacks
 * run there), as soon as the upstream's status is known: with the stream
 * (2xx) or with the upstream's error or failure. The connection is
 * resumed; the handler (ag__px_send_answer) queues the response. */
void ag__px_answer_stream(stream_st *st, req_ctx *q) {
  q->st = st;
  atomic_store(&q->answered, true);
  ag__px_resume(st->sh, st->c);
}

void ag__px_answer_reply(stream_st *st, req_ctx *q, long status) {
  if (status == 0 && (st->u.cc != CURLE_OK || st->u.too_big)) {
    ag__px_upstream_failed(st->p, &st->u, &q->r);
  } else {
    st->u.status = status;
    if (!ag__px_upstream_failed(st->p, &st->u, &q->r))
      ag__px_pass_back(&st->u, &q->r);
  }
  atomic_store(&q->answered, true);
  ag__px_resume(st->sh, st->c);
}

/* A relayed stream's bytes from the upstream: parsed (the events write
 * what the client gets into `out`) and moved to the client's queue; false
 * when the stream cannot go on (the transfer is then ended). */
static bool stream_feed(stream_st *st, const char *b, size_t n) {
  if (st->raw) {
    ag__sse_add(&st->rl.out, b, n);
    ag__px_flush(st, false);
    return !st->rl.out.cut;
  }
  ag_err_t why = AG_OK;
  int r = ag__sse_feed(&st->sse, b, n, &why);
  if (r < 0 && st->asmb.failed == AG_OK)
    st->asmb.failed = why;
  ag__px_flush(st, false);
  return r == 0 && !st->rl.out.cut;
}

static size_t on_stream_body(char *ptr, size_t size, size_t nmemb, void *user) {
  stream_st *st = user;
  if (st->whole)
    return ag__px_on_body(ptr, size, nmemb, &st->u);
  long status = 0;
  curl_easy_getinfo(st->x.h, CURLINFO_RESPONSE_CODE, &status);
  if (!st->raw && (status < 200 || status >= 300))
    return ag__px_on_body(ptr, size, nmemb, &st->u);
  pthread_mutex_lock(&st->mu);
  bool full = st->q.len - st->q_pos > (st->raw ? RAW_Q_HIGH : STREAM_Q_HIGH);
  if (full)
    st->paused = true; /* ag__px_stream_read asks for the rest when q drains */
  pthread_mutex_unlock(&st->mu);
  if (full)
    return CURL_WRITEFUNC_PAUSE;
  size_t n = size * nmemb;
  return stream_feed(st, ptr, n) ? n : 0;
}

/* The relay's headers: the status is known once they are in. */
static size_t on_stream_header(char *ptr, size_t size, size_t nmemb,
                               void *user) {
  stream_st *st = user;
  size_t n = ag__px_on_header(ptr, size, nmemb, &st->u);
  if (st->u.hdr_end && !st->whole) { /* a whole reply is answered at its end */
    long status = 0;
    curl_easy_getinfo(st->x.h, CURLINFO_RESPONSE_CODE, &status);
    if (status >= 200) {
      pthread_mutex_lock(&st->mu);
      req_ctx *q = NULL;
      if (st->status == 0) {
        st->status = status;
        if ((status < 300 || st->raw) && st->answer == 0) {
          st->answer = ANSWER_STREAM;
          st->refs++; /* the response's */
          q = st->req_q;
          st->req_q = NULL;
        }
      }
      pthread_mutex_unlock(&st->mu);
      if (q != NULL) {
        /* libmicrohttpd watches the connection from now on: a client
         * that leaves frees the response (ag__px_stream_free) */
        st->u.client_fd = -1;
        ag__px_answer_stream(st, q);
      }
    }
  }
  return n;
}

/* ---- A whole reply, asked on the loop ---------------------------------- */

/* The budget's bytes a whole reply's transfer paused for, waited for on a
 * thread of its own (the loop may not wait), then the transfer resumed. */
static void *whole_budget_main(void *arg) {
  stream_st *st = arg;
  ag_proxy *p = st->p;
  ag__budget_wait(st->u.bud, st->u.want, st->u.held);
  /* the transfer is paused: its callbacks do not touch u until resumed */
  st->u.held += st->u.want;
  st->u.want = 0;
  pthread_mutex_lock(&st->mu);
  bool go = !st->up; /* it may have ended (the client left) */
  if (go)
    st->ops++;
  pthread_mutex_unlock(&st->mu);
  if (go)
    ag__relay_unpause(st->sh->relay, &st->x, &st->op_unpause);
  ag__px_stream_release(st, true); /* whole_budget_short's reference */
  ag__px_job_end(p);
  return NULL;
}

/* upstream.budget_short: the budget is spent; a thread waits for it. */
static bool whole_budget_short(upstream *u) {
  stream_st *st = u->budget_user;
  pthread_mutex_lock(&st->mu);
  st->refs++;
  pthread_mutex_unlock(&st->mu);
  if (ag__px_spawn_job(st->p, whole_budget_main, st))
    return true;
  ag__px_stream_release(st, true);
  return false;
}

/* A request's answer is in q->r: the connection is resumed to send it. */
static void answered(stream_st *st, req_ctx *q) {
  atomic_store(&q->answered, true);
  ag__px_resume(st->sh, st->c);
}

/* A whole reply's end, on the loop: a reply that fails or is not 2xx is
 * answered as the worker's path answers it; a 2xx reply is read and
 * checked when the budget has the parse's bytes now, and passed back when
 * the check lets it through. Anything else goes to a worker with the reply
 * in hand (req_ctx.prefetched): it decides again, checks the same reply
 * and stops or nudges as answer_whole (decide.c) does. */
static void whole_answer(stream_st *st, req_ctx *q) {
  upstream *u = &st->u;
  if (u->cc != CURLE_OK || u->too_big || u->no_budget || u->status < 200 ||
      u->status >= 300) {
    ag__px_attr_upstream(&q->attr, u->total_us);
    if (!ag__px_upstream_failed(st->p, u, &q->r))
      ag__px_pass_back(u, &q->r);
    answered(st, q);
    return;
  }
  size_t parse = 2 * u->len;
  if (ag__budget_try(u->bud, parse, u->held)) {
    u->held += parse;
    u->parse_taken = true;
    ag_reply rep;
    memset(&rep, 0, sizeof rep);
    reply bad;
    memset(&bad, 0, sizeof bad);
    bad.shape = st->w;
    bool read =
        ag__px_read_reply_as(u, st->w, AG__REPLY_WHOLE, st->sh->ct, &rep, &bad);
    ag_call_check checks[AG__CALLS_MAX];
    ag_verdict v;
    ag_action act =
        read ? ag__px_check_reply(st->g, &rep, false, checks, &v) : AG_STOP;
    if (read && act == AG_ALLOW) {
      ag__px_attr_upstream(&q->attr, u->total_us);
      ag__px_attr_usage(&q->attr, &rep);
      ag__px_pass_back(u, &q->r);
    } else if (!read) {
      ag__px_attr_upstream(&q->attr, u->total_us);
      q->r = bad; /* a 502: not a reply of the API */
      bad.body = NULL;
    }
    ag_reply_clear(&rep);
    ag__px_reply_free(&bad);
    if (read && act != AG_ALLOW)
      goto worker;
    answered(st, q);
    return;
  }
worker:
  q->prefetched = malloc(sizeof(*q->prefetched));
  if (q->prefetched == NULL) {
    ag__px_set_error(&q->r, 500, "server_error", "out_of_memory",
                     "out of memory");
    answered(st, q);
    return;
  }
  *q->prefetched = *u; /* the body, its headers and its budget go along */
  memset(u, 0, sizeof(*u));
  if (!ag__px_requeue(q)) {
    ag__px_upstream_free(q->prefetched);
    free(q->prefetched);
    q->prefetched = NULL;
    answered(st, q); /* q->r holds the 503 */
  }
}

/* The end of a whole reply's transfer (ag__px_on_stream_done). */
static void whole_done(stream_st *st) {
  pthread_mutex_lock(&st->mu);
  req_ctx *q = st->req_q;
  st->req_q = NULL;
  st->answer = ANSWER_REPLY;
  st->up = true;
  st->paused = false;
  pthread_mutex_unlock(&st->mu);
  if (q != NULL)
    whole_answer(st, q);
  ag__px_stream_release(st, true);
}

/* The transfer has ended (on the relay's thread): the last events parsed;
 * then the request answered if it was not yet, or the stream's end
 * written (ag__px_stream_end). */
void ag__px_on_stream_done(ag__relay_xfer *x, CURLcode cc) {
  stream_st *st = x->user;
  long status = 0;
  curl_easy_getinfo(st->x.h, CURLINFO_RESPONSE_CODE, &status);
  st->u.cc = cc;
  st->u.status = status;
  curl_off_t us = 0;
  if (curl_easy_getinfo(st->x.h, CURLINFO_TOTAL_TIME_T, &us) == CURLE_OK)
    ag__px_attr_upstream(ST_ATTR(st), (int64_t)us);
  st->u.total_us = (int64_t)us;
  if (st->whole) {
    whole_done(st);
    return;
  }
  if (cc == CURLE_OK && status >= 200 && status < 300 && !st->raw) {
    ag_err_t why = AG_OK;
    if (ag__sse_finish(&st->sse, &why) < 0 && st->asmb.failed == AG_OK)
      st->asmb.failed = why;
    ag__px_flush(st, false);
  }
  pthread_mutex_lock(&st->mu);
  req_ctx *q = NULL;
  if (st->answer == 0) {
    st->answer = ANSWER_REPLY;
    q = st->req_q;
    st->req_q = NULL;
  }
  long seen = st->status;
  pthread_mutex_unlock(&st->mu);
  if (q != NULL)
    ag__px_answer_reply(st, q, seen); /* before `up`: st->u is this thread's */
  pthread_mutex_lock(&st->mu);
  st->up = true;
  st->paused = false; /* nothing to resume: no request to the relay now */
  if (st->status == 0)
    st->status = status;
  bool relayed = st->answer == ANSWER_STREAM && !st->client_gone;
  if (st->raw)
    st->cut = cc != CURLE_OK;
  pthread_mutex_unlock(&st->mu);
  if (relayed && !st->raw) {
    ag__px_stream_end(st);
    return;
  }
  if (relayed)
    ag__px_flush(st,
                 true); /* raw: nothing to check, the end is the upstream's */
  ag__px_stream_release(st, true);
}

/* The end of a relayed stream that was stopped (v says why): the stop's
 * text, then the end, in the stream's shape. */
static void stream_stop(stream_st *st, const ag_verdict *v) {
  char text[AG_VERDICT_MSG_MAX * 2 + 128];
  ag__px_stop_text(v, text, sizeof text);
  st->w->relay_stop(&st->rl, text);
}

/* s as valid UTF-8 in buf[0..cap): a byte that starts no valid sequence
 * becomes '?' (an upstream's error text may hold any bytes, and jansson
 * refuses a string that is not UTF-8: the error event would be lost). */
static const char *as_utf8(const char *s, char *buf, size_t cap) {
  size_t n = strlen(s), o = 0;
  for (size_t i = 0; i < n && o + 4 < cap;) {
    size_t k = ag__utf8_seq((const unsigned char *)s + i, n - i);
    if (k == 0) {
      buf[o++] = '?';
      i++;
      continue;
    }
    memcpy(buf + o, s + i, k);
    o += k;
    i += k;
  }
  buf[o] = '\0';
  return buf;
}

/* The stream ends with an error event in its shape, saying what fmt says
 * (credentials scrubbed). */
static void stream_error(stream_st *st, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static void stream_error(stream_st *st, const char *fmt, ...) {
  char msg[ERR_MSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  char red[ERR_MSG_MAX + ERR_MSG_MAX / 4 + 16], txt[sizeof red];
  st->w->relay_error(&st->rl, as_utf8(ag__px_scrub(st->p, msg, red, sizeof red),
                                      txt, sizeof txt));
}

/* The text check of a relayed stream's text (ag__wire_relay.on_text): the
 * content-loop detector; false when it stops the reply (loop_v says why). */
static bool stream_text(void *user, const char *text, size_t len) {
  stream_st *st = user;
  ag_verdict v;
  if (ag_guard_check_text(st->g, text, len, true, &v) == AG_ALLOW)
    return true;
  st->loop_v = v;
  return false;
}

/* One upstream event, through the shape's relay. */
static int on_stream_event(void *user, const char *event, const char *data,
                           size_t len, size_t pos) {
  stream_st *st = user;
  return st->w->relay_event(&st->rl, event, data, len, pos);
}

/* ---- The end of a relayed stream ------------------------------------- */

/* Takes *rep (it is left empty) and copies the rest; NULL when out of
 * memory. */
static nudge_job *nudge_new(stream_st *st, ag_reply *rep,
                            const ag_call_check *checks, const ag_verdict *v) {
  nudge_job *nj = malloc(sizeof(*nj));
  if (nj == NULL)
    return NULL;
  nj->st = st;
  nj->rep = *rep;
  memset(rep, 0, sizeof *rep);
  nj->v = *v;
  memcpy(nj->checks, checks, sizeof nj->checks);
  return nj;
}

/* A nudge that cannot be asked: the stream ends with an error event that
 * says why; nj is freed. */
void ag__px_nudge_fail(nudge_job *nj, const char *msg) {
  stream_error(nj->st, "%s", msg);
  ag_reply_clear(&nj->rep);
  free(nj);
}

/* The client's request as a tree, for a nudge's request (it is parsed
 * only then: most streams never need it). NULL if it cannot be. */
static json_t *stream_request(const stream_st *st) {
  const char *b = st->orig != NULL ? st->orig : st->body;
  return json_loads(b != NULL ? b : "", 0, NULL);
}

/* Whether the upstream's stream ended as its API ends one: [DONE] or a
 * finish_reason (Chat Completions), message_stop or a stop_reason
 * (Messages) - the rule the providers apply to their own streams. A
 * stream cut off without it (the upstream died, a proxy in between timed
 * out, it sent something else) is relayed as cut, with an error event,
 * never with an end the upstream did not send: the agent must not take a
 * truncated answer as whole. */
static bool stream_complete(const stream_st *st) {
  return st->asmb.done || st->asmb.finish_reason[0] != '\0';
}

/* Why a relayed stream cannot be checked, into msg (cap bytes); false
 * when it can. */
static bool stream_broke(stream_st *st, char *msg, size_t cap) {
  if (st->u.too_big || st->rl.out.cut || st->rl.held.cut) {
    snprintf(msg, cap, "agentguard proxy: the upstream's stream is too large");
  } else if (st->u.cc != CURLE_OK || st->asmb.failed != AG_OK) {
    snprintf(msg, cap, "agentguard proxy: the upstream's stream broke: %s",
             st->u.cc != CURLE_OK
                 ? (st->u.errbuf[0] != '\0' ? st->u.errbuf
                                            : curl_easy_strerror(st->u.cc))
             : st->asmb.failed == AG_EPROVIDER ? st->perr.message
                                               : ag_strerror(st->asmb.failed));
  } else if (!stream_complete(st)) {
    snprintf(msg, cap,
             "agentguard proxy: the upstream's stream ended before the reply "
             "was complete (%s): the reply is cut off",
             st->w->end_missing);
  } else {
    return false;
  }
  return true;
}

/* The end of a relayed stream, on its loop: the calls checked, then
 * released or replaced; a nudge is left in *nj for its own thread
 * (ag__px_nudge_main), which asks again. */
void ag__px_stream_finish(stream_st *st, nudge_job **nj) {
  char msg[ERR_MSG_MAX];
  if (st->rl.looped) {
    ag__px_event(st->p, ST_ATTR(st), "stream_stopped", st->path, &st->loop_v,
                 NULL);
    stream_stop(st, &st->loop_v);
    return;
  }
  if (stream_broke(st, msg, sizeof msg)) {
    stream_error(st, "%s", msg);
    return;
  }
  ag_reply rep;
  memset(&rep, 0, sizeof rep);
  ag_err_t fin = ag__asm_finish(&st->asmb, &rep);
  ag__px_attr_usage(ST_ATTR(st), &rep);
  if (fin != AG_OK) { /* rep may hold the calls before the bad one */
    ag_reply_clear(&rep);
    stream_error(st, "agentguard proxy: the upstream's stream broke: %s",
                 fin == AG_EPROVIDER ? st->perr.message : ag_strerror(fin));
    return;
  }
  ag_call_check checks[AG__CALLS_MAX];
  ag_verdict v;
  ag_action act = ag__px_check_reply(st->g, &rep, true, checks, &v);
  if (act == AG_ALLOW) {
    st->w->relay_release(&st->rl);
  } else if (act != AG_NUDGE) {
    ag__px_event(st->p, ST_ATTR(st), "reply_replaced", st->path, &v, NULL);
    stream_stop(st, &v);
  } else if ((*nj = nudge_new(st, &rep, checks, &v)) == NULL) {
    stream_error(st, "agentguard proxy: out of memory");
  }
  ag_reply_clear(&rep);
}

/* The nudge's request: the client's, not streamed, with the held-back
 * calls answered by their nudges (the shape's messages). NULL when out
 * of memory. */
static char *nudge_body(stream_st *st, nudge_job *nj, size_t *len) {
  json_t *b = stream_request(st);
  json_t *extra = st->w->nudge_messages(&nj->rep, nj->checks);
  char *body = NULL;
  if (b != NULL && extra != NULL) {
    json_object_set_new(b, "stream", json_false());
    json_object_del(b, "stream_options");
    body = ag__px_with_messages(b, extra, len);
  }
  json_decref(b);
  json_decref(extra);
  return body;
}

/* A relayed stream's nudge, on its own thread: the held-back calls
 * answered by the nudge, asked once more (not streamed), and the new
 * reply, checked, written as the stream's end. */
void ag__px_stream_nudge(stream_st *st, nudge_job *nj) {
  ag_reply rep2;
  memset(&rep2, 0, sizeof rep2);
  ag_call_check *checks = nj->checks;
  ag_verdict v = nj->v;
  ag__px_event(st->p, ST_ATTR(st), "nudge", st->path, &v, NULL);
  size_t len = 0;
  char *body = nudge_body(st, nj, &len);
  if (body == NULL) {
    stream_error(st, "agentguard proxy: out of memory");
    return;
  }
  ag_action act = ag__px_record_nudged(st->g, &nj->rep, checks, &v);
  upstream u;
  memset(&u, 0, sizeof u);
  reply r;
  memset(&r, 0, sizeof r);
  r.shape = st->w;
  if (!ag__stops(act))
    ag__px_send_upstream(st->sh->relay, st->p, st->ch, "POST", st->uri, body,
                         len, true, -1, &u);
  free(body);
  if (ag__stops(act)) {
    /* v says why */
  } else if (ag__px_upstream_failed(st->p, &u, &r) || u.status < 200 ||
             u.status >= 300 || !ag__px_read_reply(&u, &rep2, &r)) {
    stream_error(st, "agentguard proxy: asking the upstream again failed: %s",
                 r.body != NULL ? r.body : (u.body != NULL ? u.body : ""));
    ag__px_reply_free(&r);
    ag__px_upstream_free(&u);
    goto out;
  } else {
    act = ag__px_check_reply(st->g, &rep2, false, checks, &v);
  }
  ag__px_upstream_free(&u);
  if (act == AG_ALLOW) {
    st->w->relay_tail(&st->rl, &rep2);
    goto out;
  }
  if (act == AG_NUDGE)
    v.action = AG_STOP; /* one nudge per request */
  ag__px_event(st->p, ST_ATTR(st), "reply_replaced", st->path, &v, NULL);
  stream_stop(st, &v);
out:
  ag_reply_clear(&rep2);
}

/* The response's content reader, on the connection's thread: what the
 * queue holds, or the end, or nothing yet - then the connection waits,
 * suspended, until a flush resumes it. */
ssize_t ag__px_stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
  (void)pos;
  stream_st *st = cls;
  bool unpause = false;
  ssize_t ret;
  pthread_mutex_lock(&st->mu);
  if (st->q_pos < st->q.len) {
    size_t n = st->q.len - st->q_pos;
    if (n > max)
      n = max;
    memcpy(buf, st->q.p + st->q_pos, n);
    st->q_pos += n;
    if (st->paused && !st->up && !st->unpause_queued &&
        st->q.len - st->q_pos < STREAM_Q_HIGH / 2) {
      st->paused = false;
      st->unpause_queued = true;
      st->ops++;
      unpause = true;
    }
    ret = (ssize_t)n;
  } else if (st->finished) {
    /* a passed-through body the upstream did not finish is not made to
     * look whole: the connection is closed without the last chunk */
    ret = st->cut ? MHD_CONTENT_READER_END_WITH_ERROR
                  : MHD_CONTENT_READER_END_OF_STREAM;
    /* nothing is under way on the connection any more: it may give way
     * to a new one from now on (before libmicrohttpd's completion) */
    ag__conns_state(st->conn, AG__CONN_IDLE, ag__px_mono_ms());
  } else {
    st->reader_waits = true;
    MHD_suspend_connection(st->c);
    ret = 0;
  }
  pthread_mutex_unlock(&st->mu);
  if (unpause)
    ag__relay_unpause(st->sh->relay, &st->x, &st->op_unpause);
  return ret;
}

/* A stream's state with its readers set up for the API shape; the end's
 * reference (ag__px_stream_end) is its only one. NULL when out of memory. */
static stream_st *stream_new(ag_proxy *p, const ag__wire *w, const char *path) {
  stream_st *st = calloc(1, sizeof(*st));
  if (st == NULL)
    return NULL;
  pthread_mutex_init(&st->mu, NULL);
  st->refs = 1;
  st->p = p;
  atomic_fetch_add(&p->streams, 1);
  st->w = w;
  ag__sse_init(&st->sse, on_stream_event, st);
  ag__asm_init(&st->asmb, NULL, NULL, &st->perr, "upstream");
  ag__buf_init(&st->q, SSE_OUT_MAX);
  bool rl = ag__wire_relay_init(&st->rl, &st->asmb, SSE_OUT_MAX);
  st->rl.on_text = stream_text;
  st->rl.user = st;
  st->path = ag__px_dupz(path);
  if (st->path == NULL || !rl) {
    stream_destroy(st);
    return NULL;
  }
  return st;
}

/* The stream's transfer, set up (st->x.h), handed to its loop with its
 * callbacks; the loop answers q once the upstream's status is in. */
static void stream_launch(stream_st *st, req_ctx *q) {
  curl_easy_setopt(st->x.h, CURLOPT_WRITEFUNCTION, on_stream_body);
  curl_easy_setopt(st->x.h, CURLOPT_WRITEDATA, st);
  curl_easy_setopt(st->x.h, CURLOPT_HEADERFUNCTION, on_stream_header);
  curl_easy_setopt(st->x.h, CURLOPT_HEADERDATA, st);
  st->u.cc = CURLE_OK;
  st->x.done = ag__px_on_stream_done;
  st->x.user = st;
  st->op_cancel.taken = on_cancel_taken;
  st->op_cancel.user = st;
  st->op_unpause.taken = on_unpause_taken;
  st->op_unpause.user = st;
  st->req_q = q;
  ag__relay_add(st->sh->relay, &st->x);
}

/* Starts relaying: hands the transfer to the connection's loop, which
 * answers the request (q) when the upstream's status is known and sees
 * the stream to its end. `*fwd` (may be NULL) is the body to send instead
 * of the client's (with the error context); it, the guard and the stream
 * are the loop's now, and q is not this thread's any more. Returns false
 * with `r` filled (500) when it could not start. */
static bool start_guarded(ag_proxy *p, struct MHD_Connection *c, req_ctx *q,
                          char **fwd, size_t fwd_len, const ag__wire *w,
                          const char *path, ag_guard **g, reply *r,
                          bool whole) {
  stream_st *st = stream_new(p, w, path);
  if (st == NULL) {
    ag__px_set_error(r, 500, "server_error", "out_of_memory", "out of memory");
    return false;
  }
  st->whole = whole;
  if (!whole)
    share_attr(st, q); /* a whole reply's answer writes q->attr itself */
  st->sh = q->sh;
  st->rl.ct = q->sh->ct;
  st->c = c;
  st->uri = ag__px_dupz(q->uri);
  /* the client's body, kept for a nudge (and sent, unless *fwd is) */
  char *copy = malloc(q->len + 1);
  if (copy != NULL) {
    if (q->len > 0)
      memcpy(copy, q->body, q->len);
    copy[q->len] = '\0';
  }
  size_t len = q->len;
  if (*fwd != NULL) {
    st->body = *fwd;
    st->orig = copy;
    len = fwd_len;
    *fwd = NULL;
  } else {
    st->body = copy;
  }
  st->x.h = ag__px_easy_get(st->sh);
  bool set = st->x.h != NULL && copy != NULL &&
             ag__px_upstream_handle(p, q->client_hdrs, st->x.h, "POST", q->uri,
                                    st->body, len, st->orig != NULL,
                                    q->client_fd, &st->u, &st->hdrs, &st->url);
  /* the headers a relayed stream's nudge asks again with (its own
   * thread's, ag__px_stream_nudge); a whole reply's nudge goes to a
   * worker, which has q's */
  if (set && !whole) {
    bool failed = false;
    st->ch = ag__px_hdrs_copy(q->client_hdrs, NULL, NULL, NULL, &failed);
    set = !failed;
  }
  if (!set || st->uri == NULL) {
    ag__px_stream_release(st, true);
    ag__px_set_error(r, 500, "server_error", "out_of_memory", "out of memory");
    return false;
  }
  if (whole) {
    st->u.budget_short = whole_budget_short;
    st->u.budget_user = st;
  }
  st->g = *g;
  *g = NULL;
  /* from here on q is the loop's: it answers the request (ag__px_answer_stream,
   * ag__px_answer_reply) once the upstream's status is known */
  stream_launch(st, q);
  return true;
}

bool ag__px_stream_start(ag_proxy *p, struct MHD_Connection *c, req_ctx *q,
                         char **fwd, size_t fwd_len, const ag__wire *w,
                         const char *path, ag_guard **g, reply *r) {
  return start_guarded(p, c, q, fwd, fwd_len, w, path, g, r, false);
}

bool ag__px_whole_start(ag_proxy *p, struct MHD_Connection *c, req_ctx *q,
                        char **fwd, size_t fwd_len, const ag__wire *w,
                        const char *path, ag_guard **g, reply *r) {
  return start_guarded(p, c, q, fwd, fwd_len, w, path, g, r, true);
}

/* A request the guard does not decide, passed through on the connection's
 * loop: its transfer started here, and its answer - the upstream's
 * status, headers and body - relayed as it comes (a raw stream: nothing
 * is parsed, nothing is held whole; a client that reads slowly pauses the
 * upstream). The request's body goes with the transfer. Returns false
 * with `r` filled (500) when it could not start; else q is the loop's. */
bool ag__px_relay_start(ag_proxy *p, struct MHD_Connection *c, req_ctx *q,
                        const char *path, reply *r) {
  stream_st *st = stream_new(p, &ag__wire_chat, path); /* not parsed */
  if (st == NULL) {
    ag__px_set_error(r, 500, "server_error", "out_of_memory", "out of memory");
    return false;
  }
  st->raw = true;
  share_attr(st, q);
  st->conn = q->conn;
  st->sh = q->sh;
  st->c = c;
  st->uri = ag__px_dupz(q->uri);
  st->body = q->body; /* the transfer's from here on */
  q->body = NULL;
  st->x.h = ag__px_easy_get(st->sh);
  if (st->x.h == NULL || st->uri == NULL ||
      !ag__px_upstream_handle(p, q->client_hdrs, st->x.h, q->method, q->uri,
                              st->body, q->len, false, q->client_fd, &st->u,
                              &st->hdrs, &st->url)) {
    ag__px_stream_release(st, true);
    ag__px_set_error(r, 500, "server_error", "out_of_memory", "out of memory");
    return false;
  }
  stream_launch(st, q);
  return true;
}

int ag_proxy_relay_replay(const ag_config *cfg, bool anthropic,
                          const char *stream, size_t len, size_t split,
                          unsigned flags, char **out, size_t *out_len) {
  *out = NULL;
  *out_len = 0;
  ag_proxy *p = calloc(1, sizeof(*p)); /* no events file: none written */
  if (p == NULL)
    return -1;
  p->cfg = *cfg;
  const ag__wire *w = anthropic ? &ag__wire_messages : &ag__wire_chat;
  stream_st *st = stream_new(p, w, w->path);
  ag__chunk_tape *ct =
      (flags & AG_PROXY_REPLAY_TREE) ? NULL : ag__chunk_tape_new();
  ag_error_t err;
  if (st == NULL || ag_guard_new(&st->g, cfg, NULL, &err) != AG_OK ||
      (ct == NULL && !(flags & AG_PROXY_REPLAY_TREE))) {
    if (st != NULL)
      stream_destroy(st);
    ag__chunk_tape_free(ct);
    free(p);
    return -1;
  }
  st->rl.ct = ct;
  ag_verdict v0; /* a turn with no history: its first request goes */
  (void)ag_guard_begin_iteration(st->g, 0, &v0);
  st->answer = ANSWER_STREAM;
  st->status = 200;
  st->u.cc = CURLE_OK;
  if (split > len)
    split = len;
  /* the transfer: its writes, then its end (ag__px_on_stream_done) */
  if ((split > 0 && !stream_feed(st, stream, split)) ||
      (len > split && !stream_feed(st, stream + split, len - split))) {
    st->u.cc = CURLE_WRITE_ERROR;
  } else {
    ag_err_t why = AG_OK;
    if (ag__sse_finish(&st->sse, &why) < 0 && st->asmb.failed == AG_OK)
      st->asmb.failed = why;
    ag__px_flush(st, false);
  }
  st->up = true;
  nudge_job *nj = NULL;
  ag__px_stream_finish(st, &nj);
  if (nj != NULL)
    ag__px_nudge_fail(nj, "agentguard proxy: asking the upstream again failed: "
                          "no upstream (ag_proxy_relay_replay)");
  ag__px_flush(st, true);
  int rc = 0;
  size_t n = st->q.len - st->q_pos;
  *out = malloc(n + 1);
  if (*out == NULL) {
    rc = -1;
  } else {
    if (n > 0)
      memcpy(*out, st->q.p + st->q_pos, n);
    (*out)[n] = '\0';
    *out_len = n;
  }
  ag__px_stream_release(st, true);
  ag__chunk_tape_free(ct);
  free(p);
  return rc;
}
