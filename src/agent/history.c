/*
 * src/agent/history.c - the session's stored history as text, capped by
 * whole turns, and the messages the loop stores (assistant, tool).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* History                                                                  */
/* ------------------------------------------------------------------------ */

/*
 * The stored history is text: a->text holds the messages' compact JSON back
 * to back as a ready array, "[m0,m1,...,mk]" (NUL-terminated), and
 * a->msgs[i] says where message i starts and how long it is. Appending
 * writes over the closing bracket; dropping messages is one memmove and an
 * offset fix; compacting a message rewrites its text in place. About 1 byte
 * of heap per byte of JSON plus the buffer's doubling slack (jansson trees
 * cost about 10).
 *
 * A drop moves the smaller side: the text after the dropped messages to
 * the left, or the text before them (the system prompt and the user
 * message, when a long turn loses its oldest iterations) to the right,
 * leaving a gap at the front (a->base). The gap is closed (one memmove of
 * everything) once it is larger than a quarter of the text, so it costs at
 * most that much memory and each dropped byte is moved a bounded number of
 * times.
 */

static int buf_sink(const char *s, size_t n, void *data) {
  return ag__buf_add(data, s, n) == AG_OK ? 0 : -1;
}

/* Room for one more record. */
static bool msgs_reserve(ag_agent *a) {
  size_t gap = (size_t)(a->msgs - a->msgs_mem);
  if (gap + a->n_msgs < a->cap_msgs)
    return true;
  if (gap > 0) { /* close the front gap first */
    memmove(a->msgs_mem, a->msgs, a->n_msgs * sizeof(*a->msgs));
    a->msgs = a->msgs_mem;
    if (a->n_msgs < a->cap_msgs)
      return true;
  }
  size_t cap = a->cap_msgs ? a->cap_msgs * 2 : 64;
  hist_msg *p = realloc(a->msgs_mem, cap * sizeof(*p));
  if (p == NULL)
    return false;
  a->msgs_mem = a->msgs = p;
  a->cap_msgs = cap;
  return true;
}

/* Puts the closing bracket back at `len` (the text's new length). */
static void close_at(ag_agent *a, size_t len) {
  a->text.p[len] = ']';
  a->text.p[len + 1] = '\0';
  a->text.len = len + 1;
}

/* Appends message `m` (borrowed) as compact JSON; false on ENOMEM (or the
 * buffer's cap), the history unchanged. No size accounting: see
 * hist_append. */
bool ag__hist_push(ag_agent *a, const json_t *m, bool tool) {
  if (!msgs_reserve(a))
    return false;
  size_t close = a->text.len - 1; /* where the ']' is */
  a->text.len = close;            /* write over it */
  if (a->n_msgs > 0 && ag__buf_add(&a->text, ",", 1) != AG_OK) {
    close_at(a, close);
    return false;
  }
  size_t off = a->text.len;
  if (json_dump_callback(m, buf_sink, &a->text, JSON_COMPACT) != 0 ||
      ag__buf_add(&a->text, "]", 1) != AG_OK) {
    close_at(a, close);
    return false;
  }
  a->msgs[a->n_msgs].off = off;
  a->msgs[a->n_msgs].len = a->text.len - 1 - off;
  a->msgs[a->n_msgs].tool = tool;
  a->n_msgs++;
  return true;
}

/* Closes the gap at the front: the array starts at text.p again. */
static void close_gap(ag_agent *a) {
  size_t k = a->base;
  if (k == 0)
    return;
  memmove(a->text.p, a->text.p + k, a->text.len + 1 - k);
  a->text.len -= k;
  for (size_t i = 0; i < a->n_msgs; i++)
    a->msgs[i].off -= k;
  a->base = 0;
}

/* Removes messages [from, to) (to <= n_msgs). */
void ag__hist_cut(ag_agent *a, size_t from, size_t to) {
  if (from >= to)
    return;
  if (to == a->n_msgs) {
    /* the tail: the text ends after message from - 1, or is "[]" */
    close_at(a, from > 0 ? a->msgs[from - 1].off + a->msgs[from - 1].len
                         : a->base + 1);
    a->n_msgs = from;
    return;
  }
  size_t start = a->msgs[from].off, end = a->msgs[to].off, k = end - start;
  if (start - a->base < a->text.len - end) {
    /* the front is smaller: move it right */
    memmove(a->text.p + a->base + k, a->text.p + a->base, start - a->base);
    a->base += k;
    for (size_t i = 0; i < from; i++)
      a->msgs[i].off += k;
  } else {
    memmove(a->text.p + start, a->text.p + end, a->text.len + 1 - end);
    a->text.len -= k;
    for (size_t i = to; i < a->n_msgs; i++)
      a->msgs[i].off -= k;
  }
  if (from < a->n_msgs - to) { /* the records likewise */
    memmove(a->msgs + (to - from), a->msgs, from * sizeof(*a->msgs));
    a->msgs += to - from;
  } else {
    memmove(a->msgs + from, a->msgs + to, (a->n_msgs - to) * sizeof(*a->msgs));
  }
  a->n_msgs -= to - from;
  if (a->base > (a->text.len - a->base) / 4)
    close_gap(a);
}

/* Replaces message i's text with `s` (n bytes); false on ENOMEM. */
static bool hist_replace(ag_agent *a, size_t i, const char *s, size_t n) {
  hist_msg *m = &a->msgs[i];
  size_t end = m->off + m->len;
  if (n > m->len) {
    size_t grow = n - m->len;
    if (a->text.len > a->text.cap || grow > a->text.cap - a->text.len ||
        ag__buf_reserve(&a->text, a->text.len + grow) != AG_OK)
      return false;
  }
  memmove(a->text.p + m->off + n, a->text.p + end, a->text.len + 1 - end);
  memcpy(a->text.p + m->off, s, n);
  a->text.len = a->text.len - m->len + n;
  for (size_t k = i + 1; k < a->n_msgs; k++)
    a->msgs[k].off = a->msgs[k].off - m->len + n;
  m->len = n;
  return true;
}

/* Gives memory back after a large drop: the text and the records keep at
 * most twice what they hold. */
void ag__hist_shrink(ag_agent *a) {
  close_gap(a);
  size_t need = a->text.len + 1;
  if (a->text.alloc > 4 * need && a->text.alloc > ((size_t)64 << 10)) {
    char *p = realloc(a->text.p, 2 * need);
    if (p != NULL) {
      a->text.p = p;
      a->text.alloc = 2 * need;
    }
  }
  if (a->msgs != a->msgs_mem) {
    memmove(a->msgs_mem, a->msgs, a->n_msgs * sizeof(*a->msgs));
    a->msgs = a->msgs_mem;
  }
  if (a->cap_msgs > 4 * a->n_msgs && a->cap_msgs > 1024) {
    hist_msg *p = realloc(a->msgs_mem, 2 * a->n_msgs * sizeof(*p));
    if (p != NULL) {
      a->msgs_mem = a->msgs = p;
      a->cap_msgs = 2 * a->n_msgs;
    }
  }
}

/* Measures the turn that just ended (the last stored one): the compact JSON
 * size of its messages, each with a separating comma. */
void ag__hist_measure_turn(ag_agent *a) {
  if (a->n_turns == 0)
    return;
  turn_span *t = &a->turns[a->n_turns - 1];
  size_t bytes = 0;
  for (size_t i = t->start; i < a->n_msgs; i++)
    bytes += a->msgs[i].len + 1;
  t->bytes = bytes;
  a->stored_bytes += bytes;
}

/* Drops the oldest complete turns while the history (compact JSON, plus
 * `extra` bytes of the turn in progress) is larger than the cap; never the
 * system message, never the last turn. One memmove of the kept text. */
void ag__hist_cap(ag_agent *a, size_t extra) {
  size_t drop = 0;
  size_t size = a->stored_bytes;
  while (size + extra > a->max_history_bytes && a->n_turns - drop > 1)
    size -= a->turns[drop++].bytes;
  if (drop == 0)
    return;
  size_t from = a->turns[0].start, to = a->turns[drop].start;
  ag__hist_cut(a, from, to);
  a->stored_bytes = size;
  size_t k = to - from;
  memmove(a->turns, a->turns + drop, (a->n_turns - drop) * sizeof(*a->turns));
  a->n_turns -= drop;
  for (size_t t = 0; t < a->n_turns; t++)
    a->turns[t].start -= k;
  if (a->in_turn) {
    a->iter_start -= k;
    a->compact_from -= k;
  }
}

/* What a compacted message keeps instead of its content, and a compacted
 * call instead of its arguments (still a JSON object). */
#define COMPACTED_NOTE                                                         \
  "[%zu bytes dropped from this message to keep the conversation under its "   \
  "size cap]"
#define COMPACTED_ARGS "{\"dropped\":\"%zu bytes of arguments (size cap)\"}"
#define COMPACT_MIN 256 /* shorter texts are kept: the note is not smaller */

static bool is_tool_message(const json_t *m) {
  const char *role = json_string_value(json_object_get(m, "role"));
  return role != NULL && strcmp(role, "tool") == 0;
}

static bool over_cap(const ag_agent *a) {
  return a->stored_bytes + a->turn_bytes > a->max_history_bytes;
}

/* Replaces the long texts of message i (content, call arguments) with
 * notes, rewriting its text; adjusts turn_bytes. Out of memory: the
 * message stays as it was. */
static void compact_message(ag_agent *a, size_t i) {
  json_t *m = json_loadb(a->text.p + a->msgs[i].off, a->msgs[i].len,
                         JSON_ALLOW_NUL, NULL);
  if (m == NULL)
    return;
  char note[160];
  bool changed = false;
  json_t *c = json_object_get(m, "content");
  if (json_is_string(c) && json_string_length(c) > COMPACT_MIN) {
    snprintf(note, sizeof(note), COMPACTED_NOTE, json_string_length(c));
    json_object_set_new(m, "content", json_string(note));
    changed = true;
  }
  size_t k;
  json_t *call;
  json_array_foreach(json_object_get(m, "tool_calls"), k, call) {
    json_t *fn = json_object_get(call, "function");
    json_t *args = json_object_get(fn, "arguments");
    if (json_is_string(args) && json_string_length(args) > COMPACT_MIN) {
      snprintf(note, sizeof(note), COMPACTED_ARGS, json_string_length(args));
      json_object_set_new(fn, "arguments", json_string(note));
      changed = true;
    }
  }
  char *s = changed ? json_dumps(m, JSON_COMPACT) : NULL;
  json_decref(m);
  if (s == NULL)
    return;
  size_t before = a->msgs[i].len, after = strlen(s);
  if (hist_replace(a, i, s, after) && before > after)
    a->turn_bytes -=
        before - after < a->turn_bytes ? before - after : a->turn_bytes;
  free(s);
}

/*
 * The turn in progress made the history larger than the cap. In order, until
 * it fits: drop the oldest complete turns; replace the long texts of this
 * turn's oldest messages (tool results, assistant texts and call arguments)
 * with short notes; drop this turn's oldest iterations whole (an assistant
 * message with the tool messages that answer it). The user message and the
 * current iteration are never touched, and no call is ever left without its
 * tool message, so the history stays valid for the API.
 */
static void bound_turn(ag_agent *a) {
  ag__hist_cap(a, a->turn_bytes);
  size_t i = a->compact_from;
  while (over_cap(a) && i < a->iter_start)
    compact_message(a, i++);
  a->compact_from = i;
  size_t first = a->turns[a->n_turns - 1].start + 1;
  while (over_cap(a) && first < a->iter_start) {
    size_t end = first + 1;
    while (end < a->iter_start && a->msgs[end].tool)
      end++;
    for (size_t k = first; k < end; k++) {
      size_t size = a->msgs[k].len + 1;
      a->turn_bytes -= size < a->turn_bytes ? size : a->turn_bytes;
    }
    ag__hist_cut(a, first, end);
    a->iter_start -= end - first;
    a->compact_from =
        a->compact_from > end ? a->compact_from - (end - first) : first;
  }
}

bool ag__hist_turn_start(ag_agent *a, size_t index) {
  if (a->n_turns == a->cap_turns) {
    size_t cap = a->cap_turns ? a->cap_turns * 2 : 16;
    turn_span *p = realloc(a->turns, cap * sizeof(*p));
    if (p == NULL)
      return false;
    a->turns = p;
    a->cap_turns = cap;
  }
  a->turns[a->n_turns].start = index;
  a->turns[a->n_turns].bytes = 0;
  a->n_turns++;
  return true;
}

/* Appends `m` (steals; NULL is a failure) to the history; during a turn,
 * keeps the history within its cap. */
bool ag__hist_append(ag_agent *a, json_t *m) {
  if (m == NULL)
    return false;
  bool ok = ag__hist_push(a, m, is_tool_message(m));
  json_decref(m);
  if (!ok)
    return false;
  if (a->in_turn) {
    a->turn_bytes += a->msgs[a->n_msgs - 1].len + 1;
    if (over_cap(a))
      bound_turn(a);
  }
  return true;
}

/* Removes history entries past `len` (undoing a partial append). */
void ag__hist_truncate(ag_agent *a, size_t len) {
  if (len >= a->n_msgs)
    return;
  if (a->in_turn) {
    for (size_t i = len; i < a->n_msgs; i++) {
      size_t size = a->msgs[i].len + 1;
      a->turn_bytes -= size < a->turn_bytes ? size : a->turn_bytes;
    }
  }
  ag__hist_cut(a, len, a->n_msgs);
}

/* The call ids of a reply: the model's, or generated "call_<t>_<i>_<k>". */

bool ag__ids_make(call_ids *c, const ag_reply *r, int turn, int iter) {
  c->ids = NULL;
  c->gen = NULL;
  if (r->n_calls == 0)
    return true;
  c->ids = calloc(r->n_calls, sizeof(*c->ids));
  c->gen = calloc(r->n_calls, sizeof(*c->gen));
  if (c->ids == NULL || c->gen == NULL)
    return false;
  for (size_t i = 0; i < r->n_calls; i++) {
    if (r->calls[i].id != NULL && r->calls[i].id[0] != '\0') {
      c->ids[i] = r->calls[i].id;
    } else {
      snprintf(c->gen[i], sizeof(c->gen[i]), "call_%d_%d_%zu", turn, iter, i);
      c->ids[i] = c->gen[i];
    }
  }
  return true;
}

void ag__ids_free(call_ids *c) {
  free(c->ids);
  free(c->gen);
  c->ids = NULL;
  c->gen = NULL;
}

const char *ag__call_name(const ag_tool_call *c) {
  return c->name != NULL ? c->name : "";
}

const char *ag__call_args(const ag_tool_call *c, size_t *len) {
  *len = c->arguments != NULL ? c->arguments_len : 0;
  return c->arguments != NULL ? c->arguments : "";
}

json_t *ag__assistant_message(const ag_reply *r, const call_ids *ids) {
  json_t *m = ag__msg("assistant", r->text);
  if (m == NULL || r->n_calls == 0)
    return m;
  json_t *calls = json_array();
  if (calls == NULL || json_object_set_new(m, "tool_calls", calls) != 0) {
    json_decref(m);
    return NULL;
  }
  for (size_t i = 0; i < r->n_calls; i++) {
    size_t alen;
    const char *args = ag__call_args(&r->calls[i], &alen);
    const char *name = ag__call_name(&r->calls[i]);
    json_t *fn = json_object();
    json_t *c = json_object();
    bool ok =
        fn != NULL && c != NULL &&
        json_object_set_new(fn, "name", ag__json_text(name, strlen(name))) ==
            0 &&
        json_object_set_new(fn, "arguments", ag__json_text(args, alen)) == 0 &&
        json_object_set_new(
            c, "id", ag__json_text(ids->ids[i], strlen(ids->ids[i]))) == 0 &&
        json_object_set_new(c, "type", json_string("function")) == 0 &&
        json_object_set(c, "function", fn) == 0 &&
        json_array_append(calls, c) == 0;
    json_decref(fn);
    json_decref(c);
    if (!ok) {
      json_decref(m);
      return NULL;
    }
  }
  return m;
}

json_t *ag__tool_message(const char *call_id, const char *text, size_t len) {
  json_t *m = json_object();
  if (m == NULL)
    return NULL;
  if (json_object_set_new(m, "role", json_string("tool")) ||
      json_object_set_new(m, "tool_call_id",
                          ag__json_text(call_id, strlen(call_id))) ||
      json_object_set_new(m, "content", ag__json_text(text, len))) {
    json_decref(m);
    return NULL;
  }
  return m;
}
