/*
 * src/wire/sse.c - the server-sent events parser (WHATWG "server-sent
 * events", the parts model APIs use), for every streamed shape: the
 * providers read their model's stream with it, the proxy the upstream's
 * (wire.h).
 *
 * Lines end with LF, CR or CRLF; "data:" lines are joined with '\n', an
 * "event:" name is kept, comments and other fields are skipped, a blank
 * line dispatches. The line and the event's data are capped
 * (AG__SSE_LINE_MAX, AG__SSE_EVENT_MAX): a longer one is an error, never
 * growth.
 */
#include <stdlib.h>
#include <string.h>

#include "wire.h"

void ag__sse_init(ag__sse *s, ag__sse_fn fn, void *user) {
  memset(s, 0, sizeof(*s));
  ag__buf_init(&s->line, AG__SSE_LINE_MAX);
  ag__buf_init(&s->data, AG__SSE_EVENT_MAX);
  s->fn = fn;
  s->user = user;
}

void ag__sse_free(ag__sse *s) {
  ag__buf_free(&s->line);
  ag__buf_free(&s->data);
  memset(s, 0, sizeof(*s));
}

static int sse_dispatch(ag__sse *s) {
  int rc = 0;
  /* data lines that were all empty dispatch "" */
  if (s->has_data)
    rc = s->fn(s->user, s->event, ag__buf_str(&s->data), s->data.len,
               s->event_pos);
  ag__buf_reset(&s->data);
  s->has_data = false;
  s->event[0] = '\0';
  s->in_event = false;
  return rc != 0 ? 1 : 0;
}

static int sse_line(ag__sse *s, ag_err_t *why) {
  const char *l = ag__buf_str(&s->line);
  size_t n = s->line.len;
  if (n == 0)
    return sse_dispatch(s);
  if (!s->in_event) {
    s->in_event = true;
    s->event_pos = s->line_pos;
  }
  if (l[0] == ':')
    return 0; /* a comment: keep-alive */
  const char *colon = memchr(l, ':', n);
  size_t fl = colon != NULL ? (size_t)(colon - l) : n;
  const char *v = colon != NULL ? colon + 1 : l + n;
  size_t vl = (size_t)(l + n - v);
  if (vl > 0 && v[0] == ' ') {
    v++;
    vl--;
  }
  if (fl == 4 && memcmp(l, "data", 4) == 0) {
    ag_err_t rc = AG_OK;
    if (s->has_data)
      rc = ag__buf_add(&s->data, "\n", 1);
    if (rc == AG_OK)
      rc = ag__buf_add(&s->data, v, vl);
    if (rc != AG_OK) {
      *why = rc;
      return -1;
    }
    s->has_data = true;
  } else if (fl == 5 && memcmp(l, "event", 5) == 0) {
    size_t c = vl < sizeof(s->event) - 1 ? vl : sizeof(s->event) - 1;
    memcpy(s->event, v, c);
    s->event[c] = '\0';
  }
  /* id, retry and unknown fields: nothing an API reply needs. */
  return 0;
}

int ag__sse_feed(ag__sse *s, const char *buf, size_t len, ag_err_t *why) {
  size_t i = 0;
  while (i < len) {
    if (s->skip_lf) {
      s->skip_lf = false;
      if (buf[i] == '\n') {
        i++;
        s->consumed++;
        s->line_pos = s->consumed;
        continue;
      }
    }
    const char *start = buf + i;
    size_t rest = len - i;
    /* the line's end: the first '\n' or '\r' (two vector scans, where a
     * byte loop was a tenth of a relayed stream's own instructions) */
    const char *nl = memchr(start, '\n', rest);
    size_t k = nl != NULL ? (size_t)(nl - start) : rest;
    const char *cr = memchr(start, '\r', k);
    if (cr != NULL)
      k = (size_t)(cr - start);
    if (k > 0) {
      ag_err_t rc = ag__buf_add(&s->line, start, k);
      if (rc != AG_OK) {
        *why = rc;
        return -1;
      }
    }
    i += k;
    s->consumed += k;
    if (k == rest)
      break; /* the line goes on in the next chunk */
    if (start[k] == '\r')
      s->skip_lf = true;
    i++;
    s->consumed++;
    int r = sse_line(s, why);
    ag__buf_reset(&s->line);
    s->line_pos = s->consumed;
    if (r != 0)
      return r;
  }
  return 0;
}

int ag__sse_finish(ag__sse *s, ag_err_t *why) {
  int r = 0;
  if (s->line.len > 0) {
    r = sse_line(s, why);
    ag__buf_reset(&s->line);
  }
  if (r == 0 && s->has_data)
    r = sse_dispatch(s);
  return r;
}

/* ---- SSE written -------------------------------------------------------- */

void ag__sse_add(ag__buf *b, const char *s, size_t n) {
  if (b->cut)
    return;
  if (ag__buf_add(b, s, n) != AG_OK)
    b->cut = true;
}

void ag__sse_data(ag__buf *b, const char *data, size_t n) {
  for (;;) {
    const char *nl = memchr(data, '\n', n);
    size_t k = nl != NULL ? (size_t)(nl - data) : n;
    ag__sse_add(b, "data: ", 6);
    ag__sse_add(b, data, k);
    ag__sse_add(b, "\n", 1);
    if (nl == NULL)
      break;
    data += k + 1;
    n -= k + 1;
  }
  ag__sse_add(b, "\n", 1);
}

void ag__sse_json(ag__buf *b, json_t *o) {
  char *t = o != NULL ? json_dumps(o, JSON_COMPACT) : NULL;
  json_decref(o);
  if (t == NULL) {
    b->cut = true;
    return;
  }
  ag__sse_data(b, t, strlen(t));
  free(t);
}

void ag__sse_named(ag__buf *b, const char *name, json_t *o) {
  ag__sse_add(b, "event: ", 7);
  ag__sse_add(b, name, strlen(name));
  ag__sse_add(b, "\n", 1);
  ag__sse_json(b, o);
}
