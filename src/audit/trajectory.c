/*
 * src/audit/trajectory.c - recorded agent runs: parsing five input formats
 * from a memory buffer into the neutral ag_trajectory (agentguard/audit.h).
 * This file: the arena, the builder every reader fills (builder.h), format
 * detection and the entry point; one reader per format in traj_*.c.
 *
 *
 * Design. The neutral format ({"steps": ...}, most recordings) is read
 * first from the JCS tokenizer's tape (traj_tape.c: several times faster
 * than a tree, its texts copied once into the arena); whatever that reader
 * is not sure of goes to the path below, which is the reference.
 * Otherwise jansson parses the buffer once; the tree is kept alive inside
 * the trajectory and every text the run needs (tool names, arguments sent
 * as strings, results) is borrowed from it, so nothing large is copied. Only
 * what has no string in the tree is written to a small arena: arguments
 * given as JSON objects (dumped compact; the guard canonicalizes them, so
 * key order and number spelling do not matter), chat contents given as
 * arrays of parts (joined), and synthesised texts.
 *
 * While parsing, calls and results go into growable vectors and steps and
 * turns hold offsets into them, because a chat transcript answers calls
 * later, by id, and vectors move when they grow. Once the run is complete
 * the offsets become the pointers of the public structs. Every vector is
 * capped by ag_traj_opts (steps per run, calls per step) and the input by
 * max_bytes, so a hostile file cannot grow anything without bound.
 *
 * Format detection looks at the shape, not at a file name: a document that
 * starts with '[' is a chat array (or an array of events); one that starts
 * with '{' is tried as one JSON value first (a neutral trajectory, or an
 * object with "messages"), then, when that fails with more data after the
 * first value, as JSON Lines, each line parsed on its own so that errors
 * name the line. A last line without its newline that is only the
 * beginning of a value (a writer killed mid-line: issue 25) is left out and
 * named in cut_line rather than failing the whole run; anywhere else a bad
 * line is an error, since lines after it mean its writer went on.
 *
 * Numbers are read as doubles (JSON_DECODE_INT_AS_REAL): an integer too
 * large for jansson's int then parses, and the guard's signatures treat 5
 * and 5.0 alike anyway. A number beyond a double's range (1e999) cannot be
 * read by jansson, whatever the flags: it is an error that names its line
 * and column. A key given twice in one object is an error too
 * (JSON_REJECT_DUPLICATES), never "the last one wins", which would let
 * `"ok":true,"ok":false` flip a result unnoticed.
 *
 * Pure: no I/O, no clock, no globals. Rejected: a hand-written in-place
 * parser (DESIGN.md: nothing hand-written that the dependencies already do;
 * jansson is nearly all of an audit's time, about 12 ns per byte, and still
 * meets the target of 2,000 runs per second: bench/bench_audit.c), and
 * copying the texts out of the tree (a second pass over every byte for
 * nothing: the tree lives exactly as long as the trajectory).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "builder.h"
#include "internal.h"

/* ------------------------------------------------------------------------ */
/* Names and options                                                        */
/* ------------------------------------------------------------------------ */

AG_EXTERN const char *ag_traj_format_name(ag_traj_format f) {
  switch (f) {
  case AG_TRAJ_AUTO:
    return "auto";
  case AG_TRAJ_NEUTRAL:
    return "trajectory";
  case AG_TRAJ_CHAT:
    return "chat";
  case AG_TRAJ_CHAT_OBJECT:
    return "chat-object";
  case AG_TRAJ_CHAT_JSONL:
    return "chat-jsonl";
  case AG_TRAJ_EVENTS:
    return "events";
  case AG_TRAJ_MESSAGES:
    return "messages";
  }
  return "unknown";
}

AG_EXTERN const char *ag_run_outcome_name(ag_run_outcome o) {
  switch (o) {
  case AG_RUN_RESOLVED:
    return "resolved";
  case AG_RUN_UNRESOLVED:
    return "unresolved";
  case AG_RUN_UNKNOWN:
    break;
  }
  return "unknown";
}

AG_EXTERN void ag_traj_opts_init(ag_traj_opts *opts) {
  memset(opts, 0, sizeof(*opts));
  opts->format = AG_TRAJ_AUTO;
  opts->max_bytes = (size_t)64 << 20;
  opts->max_steps = 1000000;
  opts->max_calls = 4096;
}

/* ------------------------------------------------------------------------ */
/* Memory: an arena for the few texts that are not in the tree              */
/* ------------------------------------------------------------------------ */

static char *arena_alloc(traj_full *f, size_t n) {
  achunk *c = f->chunks;
  if (c == NULL || c->cap - c->used < n) {
    size_t cap = n > 16384 ? n : 16384;
    c = malloc(sizeof(*c) + cap);
    if (c == NULL)
      return NULL;
    c->used = 0;
    c->cap = cap;
    c->next = f->chunks;
    f->chunks = c;
  }
  char *p = c->data + c->used;
  c->used += n;
  return p;
}

char *ag__tb_alloc(builder *b, size_t n) {
  return arena_alloc(b->f, n);
}

static void traj_full_free(traj_full *f) {
  if (f == NULL)
    return;
  json_decref(f->root);
  json_decref(f->chat);
  for (achunk *c = f->chunks; c != NULL;) {
    achunk *next = c->next;
    free(c);
    c = next;
  }
  free(f->turns);
  free(f->steps);
  free(f->calls);
  free(f->results);
  free(f);
}

AG_EXTERN void ag_trajectory_free(ag_trajectory *t) {
  if (t == NULL)
    return;
  traj_full_free((traj_full *)t->priv);
}

/* ------------------------------------------------------------------------ */
/* The builder                                                              */
/* ------------------------------------------------------------------------ */

static int grow(void **p, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap)
    return 0;
  size_t nc = *cap != 0 ? *cap : 16;
  while (nc < need) {
    if (nc > SIZE_MAX / 2)
      return -1;
    nc *= 2;
  }
  if (nc > SIZE_MAX / elem)
    return -1;
  void *q = realloc(*p, nc * elem);
  if (q == NULL)
    return -1;
  *p = q;
  *cap = nc;
  return 0;
}

static void builder_free(builder *b) {
  free(b->calls);
  free(b->ids);
  free(b->results);
  free(b->answered);
  free(b->steps);
  free(b->turns);
}

/* An error at the current place in the input: "message 7: ..." */
ag_err_t ag__tb_fail(builder *b, ag_err_t code, const char *fmt, ...)
    AG__PRINTF(3, 4);
ag_err_t ag__tb_fail(builder *b, ag_err_t code, const char *fmt, ...) {
  char msg[AG_ERROR_MSG_MAX];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  if (b->unit != NULL && b->line > 0)
    ag__set_error(b->err, code, -1, "line %ld (%s %zu): %s", b->line, b->unit,
                  b->unit_no, msg);
  else if (b->line > 0)
    ag__set_error(b->err, code, -1, "line %ld: %s", b->line, msg);
  else if (b->unit != NULL)
    ag__set_error(b->err, code, -1, "%s %zu: %s", b->unit, b->unit_no, msg);
  else
    ag__set_error(b->err, code, -1, "%s", msg);
  if (b->err != NULL && b->line > 0 && b->line <= 0x7fffffffL)
    b->err->line = (int)b->line;
  return code;
}

ag_err_t ag__tb_nomem(builder *b) {
  return ag__set_error(b->err, AG_ENOMEM, -1, "out of memory");
}

/* A user message arrived at `t`: the next step opens a new turn. */
void ag__tb_user(builder *b, int64_t t) {
  if (!b->new_turn)
    b->new_turn_t = t;
  b->new_turn = true;
}

/* Opens a step (and a turn when a user message came first or there is no
 * turn yet). */
ag_err_t ag__tb_step(builder *b, int iteration) {
  if (b->n_steps >= b->o->max_steps)
    return ag__tb_fail(b, AG_ETOOBIG, "more than %zu steps in one run",
                       b->o->max_steps);
  if (b->n_turns == 0 || (b->new_turn && b->turns[b->n_turns - 1].n_steps)) {
    if (grow((void **)&b->turns, &b->cap_turns, b->n_turns + 1,
             sizeof(*b->turns)))
      return ag__tb_nomem(b);
    bturn *t = &b->turns[b->n_turns++];
    t->step0 = b->n_steps;
    t->n_steps = 0;
    t->t_start = b->new_turn ? b->new_turn_t : -1;
  } else if (b->new_turn && b->turns[b->n_turns - 1].t_start < 0) {
    b->turns[b->n_turns - 1].t_start = b->new_turn_t;
  }
  b->new_turn = false;
  if (grow((void **)&b->steps, &b->cap_steps, b->n_steps + 1,
           sizeof(*b->steps)))
    return ag__tb_nomem(b);
  bstep *s = &b->steps[b->n_steps++];
  memset(s, 0, sizeof(*s));
  s->call0 = b->n_calls;
  s->res0 = b->n_results;
  s->iteration = iteration;
  s->origin = b->unit_no;
  s->origin_line = b->line;
  s->t_req = s->t_resp = s->t_done = -1;
  s->tokens = -1;
  b->turns[b->n_turns - 1].n_steps++;
  return AG_OK;
}

bstep *ag__tb_cur_step(builder *b) {
  return b->n_steps > 0 ? &b->steps[b->n_steps - 1] : NULL;
}

/* Appends a result (unanswered, outcome skipped, text "") to the current
 * step. */
ag_err_t ag__tb_result(builder *b) {
  size_t cap = b->cap_results;
  if (grow((void **)&b->results, &b->cap_results, b->n_results + 1,
           sizeof(*b->results)))
    return ag__tb_nomem(b);
  if (b->cap_results != cap) {
    bool *a = realloc(b->answered, b->cap_results * sizeof(*a));
    if (a == NULL)
      return ag__tb_nomem(b);
    b->answered = a;
  }
  ag_traj_result *r = &b->results[b->n_results];
  r->outcome = AG_OUTCOME_SKIPPED;
  r->category = AG_CAT__COUNT;
  r->text = "";
  r->text_len = 0;
  b->answered[b->n_results] = false;
  b->n_results++;
  ag__tb_cur_step(b)->n_results++;
  return AG_OK;
}

/* Appends a call to the current step; with `with_result`, also the result
 * slot that answers it. */
ag_err_t ag__tb_call(builder *b, const char *name, const char *args,
                     size_t args_len, const char *id, bool with_result) {
  bstep *s = ag__tb_cur_step(b);
  if (s->n_calls >= b->o->max_calls)
    return ag__tb_fail(b, AG_ETOOBIG, "more than %zu tool calls in one step",
                       b->o->max_calls);
  size_t cap = b->cap_calls;
  if (grow((void **)&b->calls, &b->cap_calls, b->n_calls + 1,
           sizeof(*b->calls)))
    return ag__tb_nomem(b);
  if (b->cap_calls != cap) {
    const char **ids = realloc(b->ids, b->cap_calls * sizeof(*ids));
    if (ids == NULL)
      return ag__tb_nomem(b);
    b->ids = ids;
  }
  ag_traj_call *c = &b->calls[b->n_calls];
  c->name = name;
  c->args = args;
  c->args_len = args_len;
  b->ids[b->n_calls] = id;
  b->n_calls++;
  s->n_calls++;
  return with_result ? ag__tb_result(b) : AG_OK;
}

/* The arguments of a call: a string is the text as the model sent it; any
 * other value is dumped compact; missing or null is "" (treated as {}). */
ag_err_t ag__tb_args(builder *b, const json_t *v, const char **out,
                     size_t *len) {
  if (v == NULL || json_is_null(v)) {
    *out = "";
    *len = 0;
    return AG_OK;
  }
  if (json_is_string(v)) {
    *out = json_string_value(v);
    *len = json_string_length(v);
    return AG_OK;
  }
  /* Dumped straight into the arena: first into what is left of its chunk,
   * and only when that is too small into a chunk of the size needed. */
  const size_t flags = JSON_COMPACT | JSON_ENCODE_ANY;
  achunk *c = b->f->chunks;
  size_t room = c != NULL ? c->cap - c->used : 0;
  size_t need = json_dumpb(v, room > 0 ? c->data + c->used : NULL, room, flags);
  if (need == 0)
    return ag__tb_nomem(b);
  if (need < room) { /* it fit, with room for the NUL */
    char *p = arena_alloc(b->f, need + 1);
    p[need] = '\0';
    *out = p;
    *len = need;
    return AG_OK;
  }
  char *p = arena_alloc(b->f, need + 1);
  if (p == NULL || json_dumpb(v, p, need, flags) != need)
    return ag__tb_nomem(b);
  p[need] = '\0';
  *out = p;
  *len = need;
  return AG_OK;
}

/* A text that may be a string, null/missing (""), or an array of content
 * parts ({"type":"text","text":…} or plain strings), joined by newlines. */
/* The "usage" of a reply in `obj`, if any: OpenAI's prompt_tokens +
 * completion_tokens, or Anthropic's input_tokens + output_tokens; -1 when
 * absent. */
ag_err_t ag__tb_usage(builder *b, const json_t *obj, int64_t *tokens) {
  const json_t *u = json_object_get(obj, "usage");
  if (u == NULL || json_is_null(u))
    return AG_OK;
  if (!json_is_object(u))
    return ag__tb_fail(b, AG_EINVAL, "\"usage\" must be an object, got %s",
                       ag__json_kind(u));
  static const char *const names[] = {"prompt_tokens", "completion_tokens",
                                      "input_tokens", "output_tokens"};
  int64_t sum = 0;
  bool any = false;
  for (size_t k = 0; k < 4; k++) {
    const json_t *v = json_object_get(u, names[k]);
    if (v == NULL || json_is_null(v))
      continue;
    /* numbers are read as doubles (JFLAGS) */
    double d = json_number_value(v);
    if (!json_is_number(v) || d < 0 || d != (double)(int64_t)d)
      return ag__tb_fail(b, AG_EINVAL, "usage.%s must be a whole number >= 0",
                         names[k]);
    if (d > 1e15)
      return ag__tb_fail(b, AG_EINVAL, "usage.%s is out of range", names[k]);
    sum += (int64_t)d;
    any = true;
  }
  if (any)
    *tokens = sum;
  return AG_OK;
}

ag_err_t ag__tb_text(builder *b, const json_t *v, const char *what,
                     const char **out, size_t *len) {
  *out = "";
  *len = 0;
  if (v == NULL || json_is_null(v))
    return AG_OK;
  if (json_is_string(v)) {
    *out = json_string_value(v);
    *len = json_string_length(v);
    return AG_OK;
  }
  const json_t *one[1];
  const json_t *const *parts;
  size_t n;
  if (json_is_object(v)) {
    one[0] = v;
    parts = one;
    n = 1;
  } else if (json_is_array(v)) {
    parts = NULL;
    n = json_array_size(v);
  } else {
    return ag__tb_fail(b, AG_EINVAL,
                       "\"%s\" must be a string or an array of parts, got %s",
                       what, ag__json_kind(v));
  }
  size_t total = 0;
  for (size_t pass = 0; pass < 2; pass++) {
    char *dst = NULL;
    if (pass == 1) {
      dst = arena_alloc(b->f, total + 1);
      if (dst == NULL)
        return ag__tb_nomem(b);
      *out = dst;
    }
    size_t used = 0, k = 0;
    for (size_t i = 0; i < n; i++) {
      const json_t *p = parts != NULL ? parts[i] : json_array_get(v, i);
      const json_t *t = json_is_string(p) ? p : json_object_get(p, "text");
      if (!json_is_string(t))
        continue; /* images, audio: no text to judge */
      size_t tl = json_string_length(t);
      if (pass == 0) {
        total += tl + (k > 0 ? 1 : 0);
      } else {
        if (k > 0)
          dst[used++] = '\n';
        memcpy(dst + used, json_string_value(t), tl);
        used += tl;
      }
      k++;
    }
    if (pass == 1) {
      dst[used] = '\0';
      *len = used;
    }
  }
  return AG_OK;
}

/* A timestamp field: a number >= 0, or -1 when absent. */
ag_err_t ag__tb_time(builder *b, const json_t *obj, const char *key,
                     int64_t *out) {
  const json_t *v = json_object_get(obj, key);
  *out = -1;
  if (v == NULL || json_is_null(v))
    return AG_OK;
  if (!json_is_number(v))
    return ag__tb_fail(b, AG_EINVAL, "\"%s\" must be a number, got %s", key,
                       ag__json_kind(v));
  double d = json_number_value(v);
  if (!(d >= 0 && d < 9.0e15))
    return ag__tb_fail(b, AG_EINVAL, "\"%s\" is out of range", key);
  *out = (int64_t)d;
  return AG_OK;
}

ag_run_outcome ag__tb_outcome(const json_t *obj) {
  const char *s = json_string_value(json_object_get(obj, "outcome"));
  if (s == NULL)
    return AG_RUN_UNKNOWN;
  if (strcmp(s, "resolved") == 0)
    return AG_RUN_RESOLVED;
  if (strcmp(s, "unresolved") == 0)
    return AG_RUN_UNRESOLVED;
  return AG_RUN_UNKNOWN;
}

const char *ag__tb_source(const json_t *obj) {
  static const char *const keys[] = {"source", "id", "instance_id"};
  for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
    const char *s = json_string_value(json_object_get(obj, keys[i]));
    if (s != NULL)
      return s;
  }
  return NULL;
}

bool ag__tb_truthy(const json_t *v) {
  return v != NULL && !json_is_null(v) && !json_is_false(v) &&
         !(json_is_string(v) && json_string_length(v) == 0);
}

/* ------------------------------------------------------------------------ */
/* Detection and the entry point                                            */
/* ------------------------------------------------------------------------ */

static ag_err_t json_fail(ag_error_t *err, const json_error_t *je,
                          long line_base, long pos_base, const char *what) {
  /* jansson says "real number overflow near '1e999'": say what is wrong
   * with the recording in its terms (docs/audit.md, Inputs). */
  if (AG__JSON_NOMEM(je))
    return ag__set_error(err, AG_ENOMEM, -1, "out of memory");
  char text[JSON_ERROR_TEXT_LENGTH + 64];
  const char *near = strstr(je->text, " near ");
  if (json_error_code(je) == json_error_numeric_overflow)
    snprintf(text, sizeof(text),
             "number out of range (beyond +-1.8e308)%s; a JSON number in a "
             "recording must fit a double",
             near != NULL ? near : "");
  else
    snprintf(text, sizeof(text), "%s", je->text);
  ag__set_error(err, AG_EJSON, pos_base + (long)je->position,
                "invalid JSON%s%s at line %ld, column %d: %s",
                what[0] ? " " : "", what, line_base + (long)je->line,
                je->column, text);
  if (err != NULL) {
    err->line = (int)(line_base + je->line);
    err->column = je->column;
  }
  return AG_EJSON;
}

typedef enum { KIND_OTHER, KIND_MESSAGE, KIND_EVENT } line_kind;

static line_kind kind_of(const json_t *v) {
  if (!json_is_object(v))
    return KIND_OTHER;
  if (json_is_string(json_object_get(v, "event")))
    return KIND_EVENT;
  if (json_is_string(json_object_get(v, "role")))
    return KIND_MESSAGE;
  return KIND_OTHER;
}

/* Whether a line that jansson refused (`je`, over its `n` bytes) reads as
 * the beginning of a value whose writer stopped mid-line: the parser ran out
 * of input (the error is at the line's end), or out of bytes inside a
 * multi-byte character (at most 3 of its bytes there). Not when a whole
 * value came first ("end of file expected"), nor when the bytes go wrong
 * before the end: that line is bad, not short. */
static bool cut_short(const json_error_t *je, size_t n) {
  enum json_error_code code = json_error_code(je);
  size_t at = je->position > 0 ? (size_t)je->position : 0;
  if (code == json_error_end_of_input_expected || AG__JSON_NOMEM(je) || at > n)
    return false;
  if (code == json_error_invalid_utf8)
    return n - at < 4;
  return at == n;
}

/* Parses JSON Lines: every non-blank line one value, collected into an
 * array (new reference in *out); lines[i] is the 1-based line of value i
 * (caller-owns, free). A last line without its newline that was cut short
 * (cut_short), after at least one value, is left out and its number put in
 * *cut (else 0): a writer killed mid-line loses that line, not the run. */
static ag_err_t load_lines(const char *buf, size_t len, json_t **out,
                           long **lines_out, long *cut, ag_error_t *err) {
  json_t *arr = json_array();
  long *lines = NULL;
  size_t cap = 0, n = 0;
  *cut = 0;
  if (arr == NULL)
    return ag__set_error(err, AG_ENOMEM, -1, "out of memory");
  long lineno = 0;
  for (size_t pos = 0; pos < len;) {
    const char *nl = memchr(buf + pos, '\n', len - pos);
    size_t end = nl != NULL ? (size_t)(nl - buf) : len;
    lineno++;
    size_t a = pos, z = end;
    while (a < z && (buf[a] == ' ' || buf[a] == '\t' || buf[a] == '\r'))
      a++;
    if (a < z) {
      json_error_t je;
      json_t *v = json_loadb(buf + pos, end - pos, JFLAGS, &je);
      if (v == NULL && nl == NULL && n > 0 && cut_short(&je, end - pos)) {
        *cut = lineno;
        break;
      }
      if (v == NULL) {
        json_decref(arr);
        free(lines);
        return json_fail(err, &je, lineno - 1, (long)pos, "");
      }
      if (grow((void **)&lines, &cap, n + 1, sizeof(*lines)) != 0) {
        json_decref(v); /* not appended yet: not stolen */
        v = NULL;
      }
      if (v == NULL || json_array_append_new(arr, v) != 0) {
        json_decref(arr);
        free(lines);
        return ag__set_error(err, AG_ENOMEM, -1, "out of memory");
      }
      lines[n++] = lineno;
    }
    pos = end + 1;
  }
  *out = arr;
  *lines_out = lines;
  return AG_OK;
}

static const char shape_help[] =
    "expected a trajectory object with \"steps\", an array of chat (or "
    "Anthropic, or Gemini) messages, an object with \"messages\" (or a "
    "Responses \"input\", or Gemini \"contents\"), or JSON Lines of chat "
    "messages or agentguard events";

/* The shape that claims `msgs` (wire.h: looks_like), or NULL: chat. */
static const ag__wire *shape_of(const json_t *msgs) {
  for (size_t i = 0; ag__wire_all[i] != NULL; i++)
    if (ag__wire_all[i]->looks_like != NULL &&
        ag__wire_all[i]->to_chat != NULL && ag__wire_all[i]->looks_like(msgs))
      return ag__wire_all[i];
  return NULL;
}

/* Messages of another API's shape, read as the proxy reads them: turned
 * into chat messages by the shape's own reader (kept in f->chat, which
 * the trajectory's texts borrow from), then parsed as chat. */
static ag_err_t parse_shape(builder *b, const ag__wire *w, const json_t *msgs) {
  char emsg[256];
  json_t *chat = w->to_chat(msgs, 0, emsg, sizeof emsg);
  if (chat == NULL)
    return emsg[0] != '\0'
               ? ag__set_error(b->err, AG_EINVAL, -1, "%s (%s)", emsg, w->api)
               : ag__set_error(b->err, AG_ENOMEM, -1, "out of memory");
  b->f->chat = chat;
  b->f->pub.format = AG_TRAJ_MESSAGES;
  return ag__tb_parse_chat(b, chat, NULL);
}

/* Checks that every value of `arr` is of `kind`; fills the builder's place
 * for the message. */
static ag_err_t check_lines(builder *b, const json_t *arr, const long *lines,
                            line_kind kind) {
  for (size_t i = 0; i < json_array_size(arr); i++) {
    line_kind k = kind_of(json_array_get(arr, i));
    if (k == kind)
      continue;
    b->line = lines != NULL ? lines[i] : 0;
    b->unit = NULL;
    if (b->line == 0) {
      b->unit = "element";
      b->unit_no = i + 1;
    }
    if (k == KIND_OTHER)
      return ag__tb_fail(b, AG_EINVAL,
                         "neither a chat message (\"role\") nor an "
                         "agentguard event (\"event\")");
    return ag__tb_fail(
        b, AG_EINVAL, "%s among %s",
        k == KIND_EVENT ? "an agentguard event" : "a chat message",
        kind == KIND_EVENT ? "agentguard events" : "chat messages");
  }
  return AG_OK;
}

static ag_err_t detect_and_parse(builder *b, const char *buf, size_t len) {
  traj_full *f = b->f;
  ag_error_t *err = b->err;
  json_error_t je;
  long *lines = NULL;
  ag_err_t rc;
  const ag_traj_format want = b->o->format;

  if (len == 0)
    return ag__set_error(err, AG_EINVAL, -1, "empty input: %s", shape_help);
  /* The neutral format from the tape first (traj_tape.c): most of an
   * audit's time was jansson building a tree of it. What the tape reader
   * leaves alone is read from the tree as before, from a clean builder. */
  if (b->tape && buf[0] == '{' &&
      (want == AG_TRAJ_AUTO || want == AG_TRAJ_NEUTRAL)) {
    rc = ag__tb_parse_neutral_tape(b, buf, len);
    if (rc != AG__TB_FALLBACK && rc != AG_OK && rc != AG_ENOMEM)
      rc = AG__TB_FALLBACK; /* an error: the tree path words it */
    if (rc != AG__TB_FALLBACK)
      return rc;
    builder_free(b);
    builder fresh;
    memset(&fresh, 0, sizeof fresh);
    fresh.o = b->o;
    fresh.err = b->err;
    fresh.f = b->f;
    fresh.new_turn_t = -1;
    fresh.last_t = -1;
    *b = fresh;
    f->pub.outcome = AG_RUN_UNKNOWN;
    f->pub.source = NULL;
    f->pub.format = AG_TRAJ_AUTO;
    ag_error_clear(err);
  }
  const bool want_lines = want == AG_TRAJ_CHAT_JSONL || want == AG_TRAJ_EVENTS;
  bool lines_mode = false;
  f->root = json_loadb(buf, len, JFLAGS | JSON_DECODE_ANY, &je);
  if (f->root == NULL) {
    /* More data after one complete value: JSON Lines. Anything else
     * (truncated, bad syntax) is reported as it is, except that a forced
     * JSON Lines format reports it line by line. */
    bool extra = strstr(je.text, "end of file expected") != NULL;
    if (!want_lines && (!extra || buf[0] != '{' || want != AG_TRAJ_AUTO))
      return json_fail(err, &je, 0, 0, "");
    lines_mode = true;
  } else if (want_lines && !json_is_object(f->root)) {
    /* Not one record: let the line reader say what is wrong where. */
    json_decref(f->root);
    f->root = NULL;
    lines_mode = true;
  }
  if (lines_mode) {
    if ((rc = load_lines(buf, len, &f->root, &lines, &f->pub.cut_line, err)) !=
        AG_OK)
      return rc;
    const json_t *first = json_array_get(f->root, 0);
    line_kind k = kind_of(first);
    if (want == AG_TRAJ_EVENTS)
      k = KIND_EVENT;
    else if (want == AG_TRAJ_CHAT_JSONL)
      k = KIND_MESSAGE;
    if (k == KIND_OTHER) {
      long l0 = lines != NULL ? lines[0] : 1;
      free(lines);
      return ag__set_error(err, AG_EINVAL, -1, "line %ld: unknown shape: %s",
                           l0, shape_help);
    }
    if ((rc = check_lines(b, f->root, lines, k)) != AG_OK) {
      free(lines);
      return rc;
    }
    f->pub.format = k == KIND_EVENT ? AG_TRAJ_EVENTS : AG_TRAJ_CHAT_JSONL;
    rc = k == KIND_EVENT ? ag__tb_parse_events(b, f->root, lines)
                         : ag__tb_parse_chat(b, f->root, lines);
    free(lines);
    return rc;
  }

  json_t *root = f->root;
  const ag__wire *shape = NULL;
  if (json_is_array(root) && want != AG_TRAJ_CHAT &&
      (shape = shape_of(root)) != NULL)
    return parse_shape(b, shape, root);
  if (json_is_array(root)) {
    if (json_array_size(root) == 0)
      return ag__set_error(err, AG_EINVAL, -1,
                           "an empty array: no messages to audit");
    line_kind k = kind_of(json_array_get(root, 0));
    if (k == KIND_OTHER)
      return ag__set_error(err, AG_EINVAL, -1,
                           "unknown shape: an array whose first element is "
                           "not a chat message; %s",
                           shape_help);
    if ((rc = check_lines(b, root, NULL, k)) != AG_OK)
      return rc;
    f->pub.format = k == KIND_EVENT ? AG_TRAJ_EVENTS : AG_TRAJ_CHAT;
    return k == KIND_EVENT ? ag__tb_parse_events(b, root, NULL)
                           : ag__tb_parse_chat(b, root, NULL);
  }
  if (!json_is_object(root))
    return ag__set_error(err, AG_EINVAL, -1,
                         "unknown shape: %s at the top level; %s",
                         ag__json_kind(root), shape_help);
  if (json_object_get(root, "steps") != NULL && !want_lines &&
      want != AG_TRAJ_CHAT && want != AG_TRAJ_CHAT_OBJECT) {
    f->pub.format = AG_TRAJ_NEUTRAL;
    return ag__tb_parse_neutral(b, root);
  }
  const json_t *msgs = json_object_get(root, "messages");
  if (msgs != NULL && !want_lines && want != AG_TRAJ_NEUTRAL) {
    if (!json_is_array(msgs))
      return ag__set_error(err, AG_EINVAL, -1,
                           "\"messages\" must be an array, got %s",
                           ag__json_kind(msgs));
    if (want != AG_TRAJ_CHAT_OBJECT && (shape = shape_of(msgs)) != NULL) {
      f->pub.outcome = ag__tb_outcome(root);
      f->pub.source = ag__tb_source(root);
      return parse_shape(b, shape, msgs);
    }
    f->pub.format = AG_TRAJ_CHAT_OBJECT;
    f->pub.outcome = ag__tb_outcome(root);
    f->pub.source = ag__tb_source(root);
    return ag__tb_parse_chat(b, msgs, NULL);
  }
  /* A request (or transcript) of a shape whose conversation has another
   * key: {"input": [Responses items]}, {"contents": [Gemini contents]} */
  for (size_t i = 0; ag__wire_all[i] != NULL && !want_lines &&
                     (want == AG_TRAJ_AUTO || want == AG_TRAJ_MESSAGES);
       i++) {
    const ag__wire *w = ag__wire_all[i];
    const json_t *conv = w->conv_key != NULL && w->to_chat != NULL
                             ? json_object_get(root, w->conv_key)
                             : NULL;
    if (strcmp(w->conv_key != NULL ? w->conv_key : "messages", "messages") ==
            0 ||
        !json_is_array(conv) || !w->looks_like(conv))
      continue;
    f->pub.outcome = ag__tb_outcome(root);
    f->pub.source = ag__tb_source(root);
    return parse_shape(b, w, conv);
  }
  /* A single line of JSON Lines (or one record written over several
   * lines: the same run, whether detected or forced). */
  line_kind k = want == AG_TRAJ_EVENTS       ? KIND_EVENT
                : want == AG_TRAJ_CHAT_JSONL ? KIND_MESSAGE
                                             : kind_of(root);
  if (k != KIND_OTHER && (want == AG_TRAJ_AUTO || want_lines)) {
    json_t *arr = json_array();
    if (arr == NULL || json_array_append(arr, root) != 0) {
      json_decref(arr);
      return ag__set_error(err, AG_ENOMEM, -1, "out of memory");
    }
    json_decref(f->root);
    f->root = arr;
    long one = 1;
    if ((rc = check_lines(b, arr, &one, k)) != AG_OK)
      return rc;
    f->pub.format = k == KIND_EVENT ? AG_TRAJ_EVENTS : AG_TRAJ_CHAT_JSONL;
    return k == KIND_EVENT ? ag__tb_parse_events(b, arr, &one)
                           : ag__tb_parse_chat(b, arr, &one);
  }
  return ag__set_error(err, AG_EINVAL, -1,
                       "unknown shape: an object without \"steps\" or "
                       "\"messages\"; %s",
                       shape_help);
}

/* Turns the builder's offsets into the public arrays. */
static ag_err_t finish(builder *b) {
  traj_full *f = b->f;
  ag_trajectory *t = &f->pub;
  /* A run with no steps is a run that was not stopped (an agent that
   * answered at once, or a recording cut before its first reply). */
  if (b->n_steps == 0) {
    t->turns = NULL;
    t->n_turns = 0;
    t->n_steps = 0;
    t->timed = false;
    return AG_OK;
  }
  f->calls = b->calls;
  f->results = b->results;
  b->calls = NULL;
  b->results = NULL;
  f->steps = calloc(b->n_steps, sizeof(*f->steps));
  f->turns = calloc(b->n_turns, sizeof(*f->turns));
  if (f->steps == NULL || f->turns == NULL)
    return ag__set_error(b->err, AG_ENOMEM, -1, "out of memory");
  bool timed = true;
  for (size_t i = 0; i < b->n_steps; i++) {
    const bstep *s = &b->steps[i];
    ag_traj_step *o = &f->steps[i];
    o->calls = s->n_calls ? f->calls + s->call0 : NULL;
    o->n_calls = s->n_calls;
    o->results = s->n_results ? f->results + s->res0 : NULL;
    o->n_results = s->n_results;
    o->rejected = s->rejected;
    o->no_reply = s->no_reply;
    o->tokens = s->tokens;
    o->text = s->has_text ? s->text : NULL;
    o->text_len = s->has_text ? s->text_len : 0;
    o->t_request_ms = s->t_req;
    o->t_response_ms = s->t_resp >= 0 ? s->t_resp : s->t_req;
    o->t_done_ms = s->t_done >= 0 ? s->t_done : o->t_response_ms;
    if (s->t_req < 0)
      timed = false;
    t->n_calls += s->n_calls;
  }
  for (size_t i = 0; i < b->n_turns; i++) {
    f->turns[i].steps = f->steps + b->turns[i].step0;
    f->turns[i].n_steps = b->turns[i].n_steps;
    f->turns[i].t_start_ms = b->turns[i].t_start;
    if (f->turns[i].t_start_ms < 0 && timed)
      f->turns[i].t_start_ms = f->turns[i].steps[0].t_request_ms;
  }
  t->turns = f->turns;
  t->n_turns = b->n_turns;
  t->n_steps = b->n_steps;
  t->timed = timed;
  return AG_OK;
}

AG_EXTERN ag_err_t ag_trajectory_parse(ag_trajectory **out, const char *buf,
                                       size_t len, const ag_traj_opts *opts,
                                       ag_error_t *err) {
  return ag__trajectory_parse_with(out, buf, len, opts, err, true);
}

ag_err_t ag__trajectory_parse_with(ag_trajectory **out, const char *buf,
                                   size_t len, const ag_traj_opts *opts,
                                   ag_error_t *err, bool tape) {
  if (out == NULL)
    return ag__set_error(err, AG_EINVAL, -1,
                         "ag_trajectory_parse: out is NULL");
  *out = NULL;
  if (buf == NULL && len > 0)
    return ag__set_error(err, AG_EINVAL, -1,
                         "ag_trajectory_parse: buf is NULL");
  ag_traj_opts o;
  if (opts != NULL)
    o = *opts;
  else
    ag_traj_opts_init(&o);
  if (o.max_steps == 0 || o.max_calls == 0 || o.max_bytes == 0)
    return ag__set_error(err, AG_EINVAL, -1,
                         "ag_trajectory_parse: every limit must be positive");
  if (len > o.max_bytes)
    return ag__set_error(err, AG_ETOOBIG, -1,
                         "input of %zu bytes is larger than the limit of %zu",
                         len, o.max_bytes);
  /* A UTF-8 byte-order mark and leading whitespace are not content. */
  if (len >= 3 && memcmp(buf, "\xEF\xBB\xBF", 3) == 0) {
    buf += 3;
    len -= 3;
  }
  while (len > 0 && (buf[0] == ' ' || buf[0] == '\t' || buf[0] == '\n' ||
                     buf[0] == '\r')) {
    buf++;
    len--;
  }

  traj_full *f = calloc(1, sizeof(*f));
  if (f == NULL)
    return ag__set_error(err, AG_ENOMEM, -1, "out of memory");
  f->pub.priv = f;
  f->pub.outcome = AG_RUN_UNKNOWN;
  builder b;
  memset(&b, 0, sizeof(b));
  b.o = &o;
  b.err = err;
  b.f = f;
  b.new_turn_t = -1;
  b.last_t = -1;
  b.tape = tape;
  ag_err_t rc = detect_and_parse(&b, buf, len);
  if (rc == AG_OK && o.format != AG_TRAJ_AUTO && f->pub.format != o.format)
    rc = ag__set_error(err, AG_EINVAL, -1, "not a %s input: it reads as %s",
                       ag_traj_format_name(o.format),
                       ag_traj_format_name(f->pub.format));
  if (rc == AG_OK)
    rc = finish(&b);
  builder_free(&b);
  if (rc != AG_OK && f->pub.cut_line > 0 && err != NULL) {
    /* What is missing may be in the line left out: say so. */
    size_t used = strlen(err->msg);
    snprintf(err->msg + used, sizeof(err->msg) - used,
             " (line %ld, the last, was cut off mid-line and left out)",
             f->pub.cut_line);
  }
  if (rc != AG_OK) {
    traj_full_free(f);
    return rc;
  }
  *out = &f->pub;
  return AG_OK;
}
