/*
 * src/agent/loop.c - the agentic loop: a session (ag_agent) holds a history
 * in the OpenAI chat shape and runs turns; a turn runs iterations (one model
 * request and the tool calls it returned) until a final answer, a loop
 * breaking tool, a guard stop or escalation, the deadline, a cancel or a
 * model error. docs/agent.md describes every step for users.
 *
 * One iteration:
 *   1. ag_guard_begin_iteration (iteration cap, deadline); at the cap, one
 *      wrap-up request without tools (loop.final_request_without_tools);
 *   2. the model request: history + the ephemeral error context (an extra
 *      user message for this request only, never stored), retried per
 *      network.* with exponential backoff, full jitter and Retry-After, the
 *      waits on the turn token;
 *   3. the assistant message joins the history;
 *   4. the batch through ag_guard_run_batch, the driver shared with
 *      `agentguard audit`: the guard checks every call, run_cb executes the
 *      allowed ones through the scheduler (approvals, retries, the pool),
 *      the guard records the results; one tool message per call joins the
 *      history whatever happened to it (run, denied, held back, blocked);
 *   5. the verdict: go on, stop, nudge, or escalate to the human.
 *
 * Data structures. The session: the config, the guard, the scheduler, the
 * history (compact JSON text in one capped buffer, laid out as a ready
 * array, with a record per message: "History" below) with the index where
 * each stored turn starts (for the history cap), the event sink, and one
 * 64 KiB buffer for the error context. A turn: a turn_ctx on the stack (its
 * cancel token, the tools array offered to the model, the pending error context
 * flag, the partial answer). A batch: per-call arrays allocated for the batch
 * and freed after it (calls, guard checks and results, exec calls and results,
 * call ids). Memory grows only with the stored history, which is capped after
 * each turn by dropping the oldest complete turns.
 *
 * Threading. A turn runs on the caller's thread, and so do the provider,
 * the approval and the human callbacks. The scheduler runs tools on its pool
 * threads; their tool_attempt events go through the event sink's mutex
 * (events.c) and read the batch's call ids, which the loop thread writes
 * before ag_scheduler_run posts the batch (the scheduler's mutex orders the
 * two). Cancellation: the turn token links the caller's token and the turn
 * deadline; the provider, the scheduler (running tools and retry waits) and
 * the network retry waits all watch it, and the loop checks it between
 * steps, so a cancel ends the turn promptly and says which cause fired.
 *
 * Rejected:
 *   - Keeping the history as a jansson tree: about 8 bytes of heap per byte
 *     of JSON for short messages (hashtables, one allocation per string;
 *     bench_memory), and every request dumped it again. The text is
 *     spliced into an OpenAI body as it is; a provider that wants a tree
 *     gets one parsed per request (providers.h, AG_PROVIDER_MESSAGES_TEXT).
 *   - Copying the history into a request buffer to add the error context:
 *     a copy of up to the whole cap per request. The context message is
 *     appended to the stored text for the request (its retries included)
 *     and cut off as soon as complete() ends it, before anything else is
 *     appended, in the same function, so a stop or an out-of-memory cannot
 *     leave it there.
 *   - Counting retried model requests as iterations (DESIGN.md: they do not
 *     count again) or emitting model_request per retry: a reader counting
 *     model_request events gets the iterations; provider_retry tells the
 *     retries.
 *   - Capping the history by messages instead of whole turns: cutting inside
 *     a turn can separate an assistant tool call from its tool messages,
 *     which the chat API rejects.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define DEFAULT_HISTORY_BYTES ((size_t)8 << 20)
#define ECTX_CAP ((size_t)64 << 10)
/* The most the buffer ever holds beyond max_history_bytes: the current
 * iteration is never cut (docs/agent.md "History cap"), so the cap leaves
 * it room; past it an append fails like out of memory. */
#define HISTORY_OVER_CAP ((size_t)1 << 30)
#define HINT_CAP 4096
#define MAX_WAIT_MS ((int64_t)5 * 60 * 1000) /* bound of any retry wait */

typedef struct turn_span {
  size_t start;
  size_t bytes;
} turn_span;

/* One stored message: its compact JSON is text.p[off .. off + len). */
typedef struct hist_msg {
  size_t off;
  size_t len;
  bool tool; /* role "tool": answers the assistant message before it */
} hist_msg;

struct ag_agent {
  ag_config cfg;
  ag_provider *provider;  /* borrowed */
  const ag_registry *reg; /* borrowed, or own_reg */
  ag_registry *own_reg;   /* an empty registry when opts.tools is NULL */
  ag_human_fn human;
  void *human_user;
  ag_delta_fn on_delta; /* streaming text of model replies, or NULL */
  void *delta_user;
  size_t max_history_bytes;
  bool events_full; /* model_request events carry the messages */
  uint64_t rng;     /* xorshift64* state for network retry jitter */

  ag_guard *guard;
  ag_scheduler *sched;
  ag__events ev;

  /* The history as text ("History" below): the messages' compact JSON,
   * a ready array, and where each message is in it. */
  ag__buf text;
  size_t base; /* where the array starts in text.p (after a front drop) */
  hist_msg *msgs_mem; /* cap_msgs records allocated */
  hist_msg *msgs;     /* msgs_mem + a gap of records dropped at the front */
  size_t n_msgs, cap_msgs;
  /* Each stored turn: the history index of its user message and its size
   * as compact JSON (messages and their commas), measured once when it
   * ended, so capping the history never re-serializes it. */
  turn_span *turns;
  size_t n_turns, cap_turns;
  size_t stored_bytes; /* the history's compact JSON size */
  int turn;
  /* The turn in progress, bounded too (docs/agent.md "History cap"): its
   * messages' size as they are appended, where its current iteration
   * starts, and the first of its messages not yet compacted. */
  bool in_turn;
  size_t turn_bytes;
  size_t iter_start;
  size_t compact_from;

  char *ectx; /* ECTX_CAP bytes: the pending error context */

  /* The batch being executed: call ids by index, for on_attempt. */
  const char *const *batch_ids;
  size_t batch_n;
};

/* ------------------------------------------------------------------------ */
/* Small helpers                                                            */
/* ------------------------------------------------------------------------ */

AG_EXTERN void ag_turn_outcome_clear(ag_turn_outcome *o) {
  if (o == NULL)
    return;
  free(o->final_text);
  memset(o, 0, sizeof(*o));
}

static void set_outcome(ag_turn_outcome *o, ag_turn_status st,
                        const char *reason, const char *fmt, ...)
    AG__PRINTF(4, 5);
static void set_outcome(ag_turn_outcome *o, ag_turn_status st,
                        const char *reason, const char *fmt, ...) {
  o->status = st;
  ag__scopy(o->reason, sizeof(o->reason), reason);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(o->message, sizeof(o->message), fmt, ap);
  va_end(ap);
}

/* "350ms", "1.2s", "2m5s": elapsed times in messages for people. */
static void fmt_elapsed(int64_t ms, char *buf, size_t cap) {
  if (ms < 1000)
    snprintf(buf, cap, "%lldms", (long long)ms);
  else if (ms < 60000)
    snprintf(buf, cap, "%.1fs", (double)ms / 1000.0);
  else
    snprintf(buf, cap, "%lldm%llds", (long long)(ms / 60000),
             (long long)(ms % 60000 / 1000));
}

static ag_err_t nomem(ag_error_t *err) {
  return ag__set_error(err, AG_ENOMEM, -1, "agent: out of memory");
}

/* ------------------------------------------------------------------------ */
/* Session                                                                  */
/* ------------------------------------------------------------------------ */

AG_EXTERN void ag_agent_opts_init(ag_agent_opts *o) {
  if (o == NULL)
    return;
  memset(o, 0, sizeof(*o));
  o->size = sizeof(*o);
  ag_config_init(&o->config);
  o->max_history_bytes = DEFAULT_HISTORY_BYTES;
}

static void on_attempt(void *user, const ag_attempt *at) {
  ag_agent *a = user;
  const char *id = "";
  if (a->batch_ids != NULL && at->call_index >= 0 &&
      (size_t)at->call_index < a->batch_n)
    id = a->batch_ids[at->call_index];
  ag__ev_tool_attempt(&a->ev, id, at);
}

static json_t *message(const char *role, const char *content) {
  json_t *m = json_object();
  if (m == NULL)
    return NULL;
  if (json_object_set_new(m, "role", json_string(role)) != 0 ||
      json_object_set_new(
          m, "content",
          ag__json_text(content, content != NULL ? strlen(content) : 0)) != 0) {
    json_decref(m);
    return NULL;
  }
  return m;
}

static bool hist_push(ag_agent *a, const json_t *m, bool tool);

AG_EXTERN ag_err_t ag_agent_new(ag_agent **out, const ag_agent_opts *opts,
                                ag_error_t *err) {
  if (out != NULL)
    *out = NULL;
  if (out == NULL || opts == NULL || opts->provider == NULL)
    return ag__set_error(err, AG_EINVAL, -1,
                         "ag_agent_new: out, opts and opts->provider are "
                         "required");
  ag_agent_opts vopts;
  ag_agent_opts_init(&vopts);
  /* this layout is the first versioned one: its size is the minimum */
  if (ag__opts_read(&vopts, sizeof(vopts), opts, sizeof(vopts),
                    "ag_agent_new: opts", err) != AG_OK)
    return AG_EINVAL;
  opts = &vopts;
  ag_agent *a = calloc(1, sizeof(*a));
  if (a == NULL)
    return nomem(err);
  a->cfg = opts->config;
  a->provider = opts->provider;
  a->human = opts->human;
  a->human_user = opts->human_user;
  a->on_delta = opts->on_delta;
  a->delta_user = opts->delta_user;
  a->max_history_bytes = opts->max_history_bytes > 0 ? opts->max_history_bytes
                                                     : DEFAULT_HISTORY_BYTES;
  a->events_full = opts->events_full;
  a->rng = opts->seed != 0 ? opts->seed
                           : (uint64_t)ag_now_ms() * 0x9E3779B97F4A7C15ull;
  if (a->rng == 0)
    a->rng = 0x2545F4914F6CDD1Dull;

  ag_err_t rc = ag__ev_init(&a->ev, opts->on_event, opts->event_user);
  if (rc != AG_OK) {
    free(a);
    return nomem(err);
  }
  rc = ag_guard_new(&a->guard, &a->cfg, NULL, err);
  if (rc != AG_OK)
    goto fail;

  a->reg = opts->tools;
  if (a->reg == NULL) {
    rc = ag_registry_new(&a->own_reg, err);
    if (rc != AG_OK)
      goto fail;
    a->reg = a->own_reg;
  }
  ag_scheduler_opts so;
  ag_scheduler_opts_init(&so);
  so.approve = opts->approve;
  so.approve_user = opts->approve_user;
  so.on_attempt = on_attempt;
  so.attempt_user = a;
  so.jitter_seed = opts->seed;
  rc = ag_scheduler_new(&a->sched, a->reg, &a->cfg, &so, err);
  if (rc != AG_OK)
    goto fail;

  rc = AG_ENOMEM;
  ag__buf_init(&a->text, a->max_history_bytes < SIZE_MAX - HISTORY_OVER_CAP
                             ? a->max_history_bytes + HISTORY_OVER_CAP
                             : SIZE_MAX);
  a->ectx = malloc(ECTX_CAP);
  if (ag__buf_add(&a->text, "[]", 2) != AG_OK || a->ectx == NULL)
    goto fail_nomem;
  if (opts->system_prompt != NULL) {
    /* the history's system message is the only copy of the prompt */
    json_t *m = message("system", opts->system_prompt);
    bool ok = m != NULL && hist_push(a, m, false);
    json_decref(m);
    if (!ok)
      goto fail_nomem;
  }
  a->stored_bytes = a->text.len; /* brackets and system message */
  *out = a;
  return AG_OK;

fail_nomem:
  nomem(err);
fail:
  ag_agent_free(a);
  return rc;
}

AG_EXTERN void ag_agent_free(ag_agent *a) {
  if (a == NULL)
    return;
  ag_scheduler_free(a->sched);
  ag_registry_free(a->own_reg);
  ag_guard_free(a->guard);
  ag__buf_free(&a->text);
  free(a->msgs_mem);
  free(a->turns);
  free(a->ectx);
  ag__ev_destroy(&a->ev);
  free(a);
}

AG_EXTERN json_t *ag_agent_history(const ag_agent *a) {
  if (a == NULL)
    return NULL;
  return json_loadb(a->text.p + a->base, a->text.len - a->base, JSON_ALLOW_NUL,
                    NULL);
}

AG_EXTERN const char *ag_agent_history_json(const ag_agent *a, size_t *len) {
  if (len != NULL)
    *len = a != NULL ? a->text.len - a->base : 0;
  return a != NULL ? a->text.p + a->base : NULL;
}

AG_EXTERN const ag_guard *ag_agent_guard(const ag_agent *a) {
  return a != NULL ? a->guard : NULL;
}

/* ------------------------------------------------------------------------ */
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
static bool hist_push(ag_agent *a, const json_t *m, bool tool) {
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
static void hist_cut(ag_agent *a, size_t from, size_t to) {
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
static void hist_shrink(ag_agent *a) {
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
static void measure_last_turn(ag_agent *a) {
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
static void cap_history(ag_agent *a, size_t extra) {
  size_t drop = 0;
  size_t size = a->stored_bytes;
  while (size + extra > a->max_history_bytes && a->n_turns - drop > 1)
    size -= a->turns[drop++].bytes;
  if (drop == 0)
    return;
  size_t from = a->turns[0].start, to = a->turns[drop].start;
  hist_cut(a, from, to);
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
  cap_history(a, a->turn_bytes);
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
    hist_cut(a, first, end);
    a->iter_start -= end - first;
    a->compact_from =
        a->compact_from > end ? a->compact_from - (end - first) : first;
  }
}

static bool note_turn_start(ag_agent *a, size_t index) {
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
static bool hist_append(ag_agent *a, json_t *m) {
  if (m == NULL)
    return false;
  bool ok = hist_push(a, m, is_tool_message(m));
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
static void hist_truncate(ag_agent *a, size_t len) {
  if (len >= a->n_msgs)
    return;
  if (a->in_turn) {
    for (size_t i = len; i < a->n_msgs; i++) {
      size_t size = a->msgs[i].len + 1;
      a->turn_bytes -= size < a->turn_bytes ? size : a->turn_bytes;
    }
  }
  hist_cut(a, len, a->n_msgs);
}

/* The call ids of a reply: the model's, or generated "call_<t>_<i>_<k>". */
typedef struct call_ids {
  const char **ids;
  char (*gen)[48];
} call_ids;

static bool ids_make(call_ids *c, const ag_reply *r, int turn, int iter) {
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

static void ids_free(call_ids *c) {
  free(c->ids);
  free(c->gen);
  c->ids = NULL;
  c->gen = NULL;
}

static const char *call_name(const ag_tool_call *c) {
  return c->name != NULL ? c->name : "";
}

static const char *call_args(const ag_tool_call *c, size_t *len) {
  *len = c->arguments != NULL ? c->arguments_len : 0;
  return c->arguments != NULL ? c->arguments : "";
}

static json_t *assistant_message(const ag_reply *r, const call_ids *ids) {
  json_t *m = message("assistant", r->text);
  if (m == NULL || r->n_calls == 0)
    return m;
  json_t *calls = json_array();
  if (calls == NULL || json_object_set_new(m, "tool_calls", calls) != 0) {
    json_decref(m);
    return NULL;
  }
  for (size_t i = 0; i < r->n_calls; i++) {
    size_t alen;
    const char *args = call_args(&r->calls[i], &alen);
    const char *name = call_name(&r->calls[i]);
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

static json_t *tool_message(const char *call_id, const char *text, size_t len) {
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

/* ------------------------------------------------------------------------ */
/* A turn                                                                   */
/* ------------------------------------------------------------------------ */

typedef struct turn_ctx {
  ag_agent *a;
  ag_cancel *tt; /* the turn token */
  ag_turn_outcome *out;
  json_t *tools_json; /* offered to the model, or NULL */
  const char **tool_names;
  size_t n_tools;
  int iterations; /* model requests made, the wrap-up included */
  bool has_ectx;  /* a->ectx goes into the next request */
  char *partial;  /* the turn's last assistant text, for stops */
  bool oom;
  /* the current reply's streamed text, checked for a content loop (14) */
  bool streamed;        /* a delta arrived */
  bool content_stop;    /* the check stopped the stream */
  ag_verdict content_v; /* its verdict */
  char *stream;         /* the reply's text so far, STREAM_CAP at most */
  size_t stream_len;
} turn_ctx;

/* The streamed text kept for a reply cut by the content-loop check: it goes
 * into the history and the model_response event. */
#define STREAM_CAP (256 * 1024)

static void remember_text(turn_ctx *t, const char *text) {
  if (text == NULL || text[0] == '\0')
    return;
  char *d = ag__strdup(text);
  if (d == NULL)
    return;
  free(t->partial);
  t->partial = d;
}

/* Ends the turn for a fired turn token. */
static void end_cancelled(turn_ctx *t, ag_cancel_reason why) {
  if (why == AG_CANCEL_USER || why == AG_CANCEL_NONE) {
    set_outcome(t->out, AG_TURN_CANCELLED, "cancelled",
                "The turn was cancelled by the caller.");
    return;
  }
  int64_t d = t->a->cfg.loop.max_turn_duration_ms;
  if (d > 0 && ag_now_ms() >= ag_guard_deadline(t->a->guard)) {
    char s[32];
    ag_format_duration(d, s, sizeof(s));
    set_outcome(t->out, AG_TURN_TIMED_OUT, "turn_timeout",
                "Turn exceeded the maximum duration of %s", s);
  } else {
    set_outcome(t->out, AG_TURN_TIMED_OUT, "turn_timeout",
                "The caller's deadline for the turn passed.");
  }
}

static ag_cancel_reason fired(turn_ctx *t) {
  return ag_cancel_check(t->tt, ag_now_ms());
}

/* A STOP verdict: the warning first, then the outcome. */
static void end_stopped(turn_ctx *t, const ag_verdict *v) {
  if (v->warning[0] != '\0')
    ag__ev_warning(&t->a->ev, v->warning);
  set_outcome(t->out,
              v->reason == AG_REASON_TURN_TIMEOUT ? AG_TURN_TIMED_OUT
                                                  : AG_TURN_STOPPED,
              ag_reason_name(v->reason), "%s", v->message);
}

/*
 * An ESCALATE verdict: the record goes to the human. Returns true when the
 * human said continue (the hint joined the history and the tripped
 * mechanism was reset), false when the turn ends escalated.
 */
static bool escalate(turn_ctx *t, const ag_verdict *v) {
  ag_agent *a = t->a;
  char *rec = NULL;
  if (ag_guard_escalation_record(a->guard, v, &rec, NULL) != AG_OK)
    rec = NULL;
  ag__ev_escalation(&a->ev, rec);
  bool go_on = false;
  if (a->human != NULL) {
    char hint[HINT_CAP];
    hint[0] = '\0';
    ag_human_action act =
        a->human(a->human_user, rec != NULL ? rec : "{}", hint, sizeof(hint));
    hint[sizeof(hint) - 1] = '\0';
    go_on = act == AG_HUMAN_CONTINUE;
    ag__ev_human(&a->ev, go_on ? "continue" : "stop", hint);
    if (go_on) {
      if (hint[0] != '\0' && !hist_append(a, message("user", hint)))
        t->oom = true;
      ag_guard_resume(a->guard, v->reason);
    }
  }
  ag_free(rec);
  if (!go_on)
    set_outcome(t->out, AG_TURN_ESCALATED, ag_reason_name(v->reason), "%s",
                v->message);
  return go_on;
}

/* ---- model requests -------------------------------------------------- */

typedef enum { REQ_OK = 0, REQ_CANCELLED, REQ_FAILED, REQ_NOMEM } req_status;

/* The message of a failed model request, for people. */
static void provider_failure(turn_ctx *t, const ag_provider_error *pe,
                             int tries, int64_t elapsed, bool gave_up) {
  ag_agent *a = t->a;
  const char *service =
      pe->service[0] != '\0' ? pe->service : ag_provider_kind(a->provider);
  if (service == NULL || service[0] == '\0')
    service = "model";
  char msg[sizeof(t->out->message)];
  ag__buf m;
  ag__buf_init_fixed(&m, msg, sizeof(msg));
  if (!a->cfg.errors.normalize_provider_errors) {
    ag__buf_addstr_cut(&m, service);
    ag__buf_addstr_cut(&m, ": ");
    ag__buf_addstr_cut(&m, pe->message[0] ? pe->message : "request failed");
  } else {
    char span[32];
    ag__buf_addstr_cut(&m, "The model service ");
    ag__buf_addstr_cut(&m, service);
    if (pe->http_status > 0)
      ag__buf_printf_cut(&m, " answered HTTP %d (%s)", pe->http_status,
                         ag__http_reason(pe->http_status));
    else
      ag__buf_addstr_cut(&m, " could not be reached");
    if (tries > 1) {
      fmt_elapsed(elapsed, span, sizeof(span));
      ag__buf_printf_cut(&m, " %d times over %s", tries, span);
    }
    ag__buf_addstr_cut(&m, gave_up ? "; giving up."
                                   : "; this error is not retried.");
    /* the provider's own words, unless they only repeat the status */
    if (pe->message[0] != '\0' && !pe->message_is_default) {
      ag__buf_addstr_cut(&m, " The last answer: ");
      ag__buf_addstr_cut(&m, pe->message);
    }
  }
  if (a->cfg.errors.include_provider_details && pe->details[0] != '\0') {
    ag__buf_addstr_cut(&m, " Details: ");
    ag__buf_addstr_cut(&m, pe->details);
  }
  set_outcome(t->out, AG_TURN_FAILED, "model_error", "%s", msg);
}

/* The wait before retry number `retry` + 1 (0-based): exponential from
 * network.delay, capped at network.max_delay (0: no cap) and MAX_WAIT_MS,
 * full jitter, and never shorter than the server's Retry-After. */
static int64_t retry_wait(ag_agent *a, int retry, int64_t retry_after) {
  int64_t cap = a->cfg.network.max_delay_ms > 0 ? a->cfg.network.max_delay_ms
                                                : MAX_WAIT_MS;
  if (cap > MAX_WAIT_MS)
    cap = MAX_WAIT_MS;
  int64_t d =
      ag__backoff(a->cfg.network.delay_ms, retry, AG__BACKOFF_EXPONENTIAL, cap,
                  AG__JITTER_FULL, &a->rng);
  if (retry_after >= 0) {
    int64_t ra = retry_after < MAX_WAIT_MS ? retry_after : MAX_WAIT_MS;
    if (ra > d)
      d = ra;
  }
  return d;
}

/*
 * Each streamed delta of a reply: checked for a content loop (mechanism 14),
 * then passed to the caller's on_delta. A loop stops the stream (the turn
 * then ends stopped / content_loop).
 */
static int on_delta(void *user, const char *text, size_t len) {
  turn_ctx *t = user;
  ag_agent *a = t->a;
  t->streamed = true;
  if (t->stream == NULL)
    t->stream = malloc(STREAM_CAP + 1);
  if (t->stream != NULL && t->stream_len < STREAM_CAP) {
    size_t n =
        len < STREAM_CAP - t->stream_len ? len : STREAM_CAP - t->stream_len;
    memcpy(t->stream + t->stream_len, text, n);
    t->stream_len += n;
    t->stream[t->stream_len] = '\0';
  }
  if (ag_guard_check_text(a->guard, text, len, true, &t->content_v) !=
      AG_ALLOW) {
    t->content_stop = true;
    return 1;
  }
  return a->on_delta != NULL ? a->on_delta(a->delta_user, text, len) : 0;
}

/*
 * One model request with DESIGN.md's network retries. On REQ_OK `reply` is
 * filled. Otherwise the outcome is set (cancelled / timed_out / failed)
 * except for REQ_NOMEM.
 */
static req_status request_model(turn_ctx *t, const json_t *tools,
                                bool with_ectx, ag_reply *reply) {
  ag_agent *a = t->a;
  /* The error context joins the text for this request only and is cut off
   * again before anything else is appended (ectx_cut). */
  size_t n_stored = a->n_msgs;
  if (with_ectx) {
    json_t *m = message("user", a->ectx);
    bool ok = m != NULL && hist_push(a, m, false);
    json_decref(m);
    if (!ok)
      return REQ_NOMEM;
  }
  ag_request req;
  memset(&req, 0, sizeof(req));
  req.tools = tools;
  req.turn = a->turn;
  req.iteration = t->iterations;
  req.messages_json = a->text.p + a->base;
  req.messages_json_len = a->text.len - a->base;
  t->streamed = t->content_stop = false;
  ag__ev_model_request(&a->ev, req.messages_json, req.messages_json_len,
                       a->n_msgs, tools != NULL ? t->tool_names : NULL,
                       tools != NULL ? t->n_tools : 0, with_ectx,
                       a->stored_bytes + a->turn_bytes, a->events_full);
  t->stream_len = 0;

  int64_t first = ag_now_ms();
  int retries = 0;
  req_status st;
  for (;;) {
    ag_cancel_reason why = fired(t);
    if (why != AG_CANCEL_NONE) {
      end_cancelled(t, why);
      st = REQ_CANCELLED;
      break;
    }
    ag_provider_error pe;
    memset(&pe, 0, sizeof(pe));
    pe.retry_after_ms = -1;
    memset(reply, 0, sizeof(*reply));
    ag_err_t rc =
        ag_provider_complete(a->provider, &req, t->tt, on_delta, t, reply, &pe);
    if (rc != AG_EPROVIDER)
      hist_cut(a, n_stored, a->n_msgs); /* no retry: the context goes */
    if (rc == AG_OK) {
      st = REQ_OK;
      break;
    }
    ag_reply_clear(reply);
    if (rc == AG_ECANCELLED && t->content_stop) {
      /* the content-loop check ended the stream: what came is the reply */
      ag_reply part;
      memset(&part, 0, sizeof(part));
      part.text = t->stream != NULL ? t->stream : (char *)"";
      ag__ev_model_response(&a->ev, &part);
      remember_text(t, part.text);
      if (!hist_append(a, message("assistant", part.text)))
        t->oom = true;
      end_stopped(t, &t->content_v);
      st = REQ_CANCELLED;
      break;
    }
    if (rc == AG_ECANCELLED) {
      end_cancelled(t, fired(t));
      st = REQ_CANCELLED;
      break;
    }
    if (rc == AG_ENOMEM) {
      st = REQ_NOMEM;
      break;
    }
    if (rc != AG_EPROVIDER) {
      memset(&pe, 0, sizeof(pe));
      snprintf(pe.message, sizeof(pe.message), "%s", ag_strerror(rc));
    }
    pe.service[sizeof(pe.service) - 1] = '\0';
    pe.message[sizeof(pe.message) - 1] = '\0';
    pe.details[sizeof(pe.details) - 1] = '\0';
    if (pe.exhausted) {
      set_outcome(t->out, AG_TURN_FAILED, "script_exhausted",
                  "The model script ran out of replies: %s.",
                  pe.message[0] != '\0' ? pe.message
                                        : "no reply left for this request");
      st = REQ_FAILED;
      break;
    }
    if (!pe.transient || retries >= a->cfg.network.max_retries) {
      provider_failure(t, &pe, retries + 1, ag_now_ms() - first, pe.transient);
      st = REQ_FAILED;
      break;
    }
    int64_t wait = retry_wait(a, retries, pe.retry_after_ms);
    ag__ev_provider_retry(&a->ev, retries + 1, pe.http_status, pe.message,
                          wait);
    why = ag_cancel_wait(t->tt, wait);
    if (why != AG_CANCEL_NONE) {
      end_cancelled(t, why);
      st = REQ_CANCELLED;
      break;
    }
    retries++;
  }
  hist_cut(a, n_stored, a->n_msgs);
  return st;
}

/* ---- the batch --------------------------------------------------------- */

/* snprintf's return value as the length written into `cap` bytes. */
static size_t fit(int n, size_t cap) {
  return n < 0 ? 0 : (size_t)n < cap ? (size_t)n : cap - 1;
}

/* "Not run: <why>", the tool message of a call that was never executed,
 * into buf; its length. */
static size_t not_run_text(char *buf, size_t cap, const char *why) {
  return fit(snprintf(buf, cap, "Not run: %s", why), cap);
}

/* A run's output text ("" when there is none) and its length. */
static const char *exec_text(const ag_exec_result *er, size_t *len) {
  *len = er->text != NULL ? er->text_len : 0;
  return er->text != NULL ? er->text : "";
}

typedef struct batch_ctx {
  turn_ctx *t;
  const call_ids *ids;
  ag_exec_call *ecalls;
  ag_exec_result *ers;
  bool sched_failed;
} batch_ctx;

static bool requires_approval(const ag_registry *r, const char *name) {
  const ag_tool_def *d = ag_registry_get(r, name);
  return d != NULL && d->requires_approval;
}

/* Executes the calls the guard allowed (ag_run_fn for ag_guard_run_batch). */
static int64_t run_cb(void *user, const ag_call *calls,
                      const ag_call_check *checks, size_t n,
                      ag_result *results) {
  batch_ctx *b = user;
  turn_ctx *t = b->t;
  ag_agent *a = t->a;

  for (size_t i = 0; i < n; i++) {
    ag__ev_tool_call(&a->ev, b->ids->ids[i], calls[i].name, calls[i].args,
                     calls[i].args_len, checks[i].valid ? checks[i].sig : NULL);
    if (checks[i].action == AG_NUDGE)
      ag__ev_nudge(&a->ev, ag_reason_name(checks[i].reason), checks[i].message);
  }
  for (size_t i = 0; i < n; i++) {
    b->ecalls[i].name = calls[i].name;
    b->ecalls[i].args = calls[i].args;
    b->ecalls[i].args_len = calls[i].args_len;
    b->ecalls[i].skip = !(checks[i].action == AG_ALLOW && checks[i].valid);
    /* the guard's signature: the scheduler groups approval questions by
     * it without signing the call a second time */
    b->ecalls[i].signature = checks[i].valid ? checks[i].sig : NULL;
  }
  a->batch_ids = b->ids->ids;
  a->batch_n = n;
  if (ag_scheduler_run(a->sched, b->ecalls, n, t->tt, b->ers, NULL) != AG_OK)
    b->sched_failed = true;
  a->batch_ids = NULL;
  a->batch_n = 0;

  for (size_t i = 0; i < n; i++) {
    const char *id = b->ids->ids[i];
    const char *name = calls[i].name;
    if (checks[i].action == AG_NUDGE)
      continue; /* held back: answered by its nudge */
    if (!checks[i].valid) {
      ag__ev_tool_result(&a->ev, id, name, false, 0,
                         ag_category_name(AG_CAT_VALIDATION), results[i].text,
                         results[i].text_len);
      continue;
    }
    ag_exec_result *er = &b->ers[i];
    size_t len;
    const char *text = exec_text(er, &len);
    if (requires_approval(a->reg, name) && er->status != AG_EXEC_NOT_FOUND &&
        er->status != AG_EXEC_INVALID && er->status != AG_EXEC_SKIPPED &&
        !(er->status == AG_EXEC_CANCELLED && er->attempts == 0))
      ag__ev_approval(&a->ev, id, name, er->status != AG_EXEC_DENIED);
    if (er->attempts > 0)
      t->out->tool_calls++;

    ag_result *r = &results[i];
    r->text = text;
    r->text_len = len;
    bool ok;
    const char *cat;
    switch (er->status) {
    case AG_EXEC_OK:
      r->outcome = AG_OUTCOME_OK;
      r->category = AG_CAT_AUTO; /* the guard checks the prefixes */
      ok = !ag_guard_is_error_text(a->guard, text, len);
      cat = ok ? NULL : ag_category_name(ag_classify(text, len));
      break;
    case AG_EXEC_DENIED:
      r->outcome = AG_OUTCOME_DENIED; /* not an error; mechanism 13 */
      r->category = er->category;
      ok = false;
      cat = ag_category_name(er->category);
      break;
    default:
      r->outcome = AG_OUTCOME_ERROR;
      r->category = er->category;
      ok = false;
      cat = ag_category_name(er->category);
      break;
    }
    ag__ev_tool_result(&a->ev, id, name, ok, er->attempts, cat, text, len);
  }
  return ag_now_ms();
}

/* A failed call's tool message per errors.feedback (malloc'd). */
static char *error_feedback(const ag_agent *a, const char *name,
                            ag_category cat, const char *text, size_t len,
                            size_t *out_len) {
  if (a->cfg.errors.feedback == AG_FEEDBACK_FULL) {
    *out_len = len;
    return ag__strndup(text, len);
  }
  if (a->cfg.errors.feedback == AG_FEEDBACK_GENERIC) {
    static const char generic[] = "Error: Function failed.";
    *out_len = sizeof(generic) - 1;
    return ag__strndup(generic, *out_len);
  }
  char one[1];
  size_t max = (size_t)a->cfg.errors.max_error_chars;
  size_t need =
      ag_format_compact_error(one, sizeof(one), name, cat, text, len, max);
  char *buf = malloc(need + 1);
  if (buf == NULL)
    return NULL;
  ag_format_compact_error(buf, need + 1, name, cat, text, len, max);
  *out_len = need;
  return buf;
}

static bool is_loop_breaking(const ag_config *cfg, const char *name) {
  const ag_str_list *l = &cfg->loop.loop_breaking_tools;
  for (int i = 0; i < l->count && i < AG_LIST_MAX; i++)
    if (strcmp(l->items[i], name) == 0)
      return true;
  return false;
}

/* Appends one tool message per call. `texts[i]` (lens[i]) is its content. */
static bool append_tool_messages(ag_agent *a, const call_ids *ids, size_t n,
                                 char **texts, const size_t *lens) {
  size_t before = a->n_msgs;
  for (size_t i = 0; i < n; i++) {
    const char *s = texts[i] != NULL ? texts[i] : "";
    size_t l = texts[i] != NULL ? lens[i] : 0;
    if (!hist_append(a, tool_message(ids->ids[i], s, l))) {
      hist_truncate(a, before);
      return false;
    }
  }
  return true;
}

/* "Not run: <why>" for every call of a reply that was never executed. */
static bool answer_not_run(turn_ctx *t, const ag_reply *r, const call_ids *ids,
                           const char *reason_code, const char *why) {
  ag_agent *a = t->a;
  char text[AG_VERDICT_MSG_MAX + 16];
  size_t l = not_run_text(text, sizeof(text), why);
  size_t before = a->n_msgs;
  for (size_t i = 0; i < r->n_calls; i++) {
    size_t alen;
    const char *args = call_args(&r->calls[i], &alen);
    uint8_t sig[AG_SIG_LEN];
    bool valid =
        ag__ev_on(&a->ev) &&
        ag_signature(call_name(&r->calls[i]), args, alen, sig, NULL) == AG_OK;
    ag__ev_tool_call(&a->ev, ids->ids[i], call_name(&r->calls[i]), args, alen,
                     valid ? sig : NULL);
    ag__ev_tool_blocked(&a->ev, ids->ids[i], call_name(&r->calls[i]),
                        reason_code);
    if (!hist_append(a, tool_message(ids->ids[i], text, l))) {
      hist_truncate(a, before);
      return false;
    }
  }
  return true;
}

/* Out of memory after the assistant message joined the history: answer
 * every call with a fixed text (no allocation beyond the messages), or drop
 * the assistant message, so the history stays valid either way. */
static void answer_lost(ag_agent *a, const call_ids *ids, size_t n,
                        size_t base) {
  static const char lost[] = "No result: the agent ran out of memory.";
  for (size_t i = 0; i < n; i++) {
    if (!hist_append(a, tool_message(ids->ids[i], lost, sizeof(lost) - 1))) {
      hist_truncate(a, base);
      return;
    }
  }
}

typedef enum { GO_ON = 0, END_TURN } step;

static step after_errors(turn_ctx *t, ag_recover_kind kind) {
  ag_agent *a = t->a;
  if (!a->cfg.errors.error_context)
    return GO_ON;
  size_t need = ag_guard_error_context(a->guard, kind, t->tool_names,
                                       t->n_tools, a->ectx, ECTX_CAP);
  if (need > 0 && a->ectx[0] != '\0') {
    t->has_ectx = true;
    ag__ev_error_context(&a->ev, a->ectx);
  }
  return GO_ON;
}

/* ---- one batch of tool calls (docs/agent.md steps 6 to 8) --------------- */

/* The per-call arrays of a batch, allocated together, freed together. */
typedef struct batch {
  size_t n;
  ag_call *calls;
  ag_call_check *checks;
  ag_result *results;
  ag_exec_call *ecalls;
  ag_exec_result *ers;
  char **texts; /* each call's tool message content (malloc'd) */
  size_t *lens;
} batch;

static bool batch_new(batch *b, const ag_reply *reply) {
  size_t n = reply->n_calls;
  b->n = n;
  b->calls = calloc(n, sizeof(*b->calls));
  b->checks = calloc(n, sizeof(*b->checks));
  b->results = calloc(n, sizeof(*b->results));
  b->ecalls = calloc(n, sizeof(*b->ecalls));
  b->ers = calloc(n, sizeof(*b->ers));
  b->texts = calloc(n, sizeof(*b->texts));
  b->lens = calloc(n, sizeof(*b->lens));
  if (b->calls == NULL || b->checks == NULL || b->results == NULL ||
      b->ecalls == NULL || b->ers == NULL || b->texts == NULL ||
      b->lens == NULL)
    return false;
  for (size_t i = 0; i < n; i++) {
    b->calls[i].name = call_name(&reply->calls[i]);
    b->calls[i].args = call_args(&reply->calls[i], &b->calls[i].args_len);
  }
  return true;
}

static void batch_free(batch *b) {
  for (size_t i = 0; b->ers != NULL && i < b->n; i++)
    ag_exec_result_clear(&b->ers[i]);
  for (size_t i = 0; b->texts != NULL && i < b->n; i++)
    free(b->texts[i]);
  free(b->calls);
  free(b->checks);
  free(b->results);
  free(b->ecalls);
  free(b->ers);
  free(b->texts);
  free(b->lens);
}

/* What a batch's tool messages tell the next steps. */
typedef struct batch_seen {
  bool any_error, not_found, invalid;
  bool have_breaking;        /* a loop-breaking tool succeeded: */
  const char *breaking_name; /* its name */
  char *breaking;            /* its result (malloc'd), the final text */
} batch_seen;

/* Sets the tool message of call i of a batch that ran (texts[i], lens[i])
 * and notes what it says in `seen`; false when out of memory. */
static bool call_message(ag_agent *a, batch *b, size_t i, batch_seen *seen) {
  const char *name = b->calls[i].name;
  char **out = &b->texts[i];
  size_t *out_len = &b->lens[i];
  if (b->checks[i].action == AG_NUDGE) { /* held back: its nudge */
    *out_len = strlen(b->checks[i].message);
    *out = ag__strndup(b->checks[i].message, *out_len);
    return *out != NULL;
  }
  if (!b->checks[i].valid) {
    seen->any_error = seen->invalid = true;
    *out = error_feedback(a, name, AG_CAT_VALIDATION, b->results[i].text,
                          b->results[i].text_len, out_len);
    return *out != NULL;
  }
  const ag_exec_result *er = &b->ers[i];
  size_t len;
  const char *text = exec_text(er, &len);
  switch (er->status) {
  case AG_EXEC_OK:
  case AG_EXEC_DENIED:
  case AG_EXEC_SKIPPED:
    *out_len = len;
    *out = ag__strndup(text, len);
    if (er->status != AG_EXEC_OK)
      break;
    if (ag_guard_is_error_text(a->guard, text, len)) {
      seen->any_error = true;
    } else if (!seen->have_breaking && a->cfg.loop.require_tool_call &&
               is_loop_breaking(&a->cfg, name)) {
      seen->have_breaking = true;
      seen->breaking_name = name;
      seen->breaking = ag__strndup(text, len);
      if (seen->breaking == NULL)
        return false;
    }
    break;
  case AG_EXEC_NOT_FOUND:
    seen->not_found = seen->any_error = true;
    if (a->cfg.errors.feedback == AG_FEEDBACK_GENERIC) {
      /* M.E.AI's own text for a function it does not have */
      char nf[AG_TOOL_NAME_MAX + 64];
      *out_len = fit(snprintf(nf, sizeof(nf),
                              "Error: Requested function \"%.*s\" not found.",
                              AG_TOOL_NAME_MAX, name),
                     sizeof(nf));
      *out = ag__strndup(nf, *out_len);
    } else {
      *out = error_feedback(a, name, er->category, text, len, out_len);
    }
    break;
  case AG_EXEC_INVALID:
    seen->invalid = true;
    /* fall through */
  default:
    seen->any_error = true;
    *out = error_feedback(a, name, er->category, text, len, out_len);
    break;
  }
  return *out != NULL;
}

/* A nudge after the results (call_and_result scope): the call ran, and
 * its tool message carries the nudge after its result. False on ENOMEM. */
static bool join_nudge(batch *b, const ag_verdict *v) {
  if (v->call_index < 0 || (size_t)v->call_index >= b->n)
    return true;
  size_t k = (size_t)v->call_index;
  size_t ml = strlen(v->message);
  char *joined = malloc(b->lens[k] + 2 + ml + 1);
  if (joined == NULL)
    return false;
  memcpy(joined, b->texts[k], b->lens[k]);
  memcpy(joined + b->lens[k], "\n\n", 2);
  memcpy(joined + b->lens[k] + 2, v->message, ml + 1);
  free(b->texts[k]);
  b->texts[k] = joined;
  b->lens[k] += 2 + ml;
  return true;
}

/* The guard stopped the batch before it ran: every call is answered
 * "Not run: <why>". False on ENOMEM. */
static bool blocked_messages(ag_agent *a, batch *b, const call_ids *ids,
                             const ag_verdict *v) {
  const char *code = ag_reason_name(v->reason);
  for (size_t i = 0; i < b->n; i++) {
    ag__ev_tool_call(&a->ev, ids->ids[i], b->calls[i].name, b->calls[i].args,
                     b->calls[i].args_len,
                     b->checks[i].valid ? b->checks[i].sig : NULL);
    ag__ev_tool_blocked(&a->ev, ids->ids[i], b->calls[i].name, code);
  }
  char text[AG_VERDICT_MSG_MAX + 16];
  size_t len = not_run_text(text, sizeof(text), v->message);
  for (size_t i = 0; i < b->n; i++) {
    b->lens[i] = len;
    b->texts[i] = ag__strndup(text, len);
    if (b->texts[i] == NULL)
      return false;
  }
  return true;
}

/* Step 7 after the tool messages joined the history: the batch's verdict
 * (a stop, an escalation with its human answer, a loop-breaking tool that
 * ends the turn) and, for step 8, the error context of the next request. */
static step batch_verdict(turn_ctx *t, ag_action act, const ag_verdict *v,
                          batch_seen *seen) {
  ag_cancel_reason why = fired(t);
  if (why != AG_CANCEL_NONE) {
    end_cancelled(t, why);
    return END_TURN;
  }
  switch (act) {
  case AG_STOP:
    end_stopped(t, v);
    return END_TURN;
  case AG_ESCALATE:
    if (!escalate(t, v))
      return END_TURN;
    break;
  case AG_ALLOW:
  case AG_NUDGE:
    if (seen->have_breaking) {
      set_outcome(t->out, AG_TURN_COMPLETED, "loop_breaking_tool",
                  "The model called %s, which ends the turn.",
                  seen->breaking_name);
      t->out->final_text = seen->breaking;
      seen->breaking = NULL;
      return END_TURN;
    }
    break;
  }
  if (seen->any_error)
    after_errors(t, seen->not_found ? AG_RECOVER_UNKNOWN_TOOL
                    : seen->invalid ? AG_RECOVER_INVALID_JSON
                                    : AG_RECOVER_EXECUTION);
  return GO_ON;
}

/* A reply with tool calls, docs/agent.md steps 6 to 8: the batch through
 * ag_guard_run_batch, one tool message per call, the verdict. */
static step run_calls(turn_ctx *t, const ag_reply *reply, const call_ids *ids) {
  ag_agent *a = t->a;
  /* the reply's assistant message is the last entry of the history */
  size_t base = a->n_msgs - 1;

  ag_cancel_reason why = fired(t);
  if (why != AG_CANCEL_NONE) {
    end_cancelled(t, why);
    if (!answer_not_run(t, reply, ids, t->out->reason, t->out->message)) {
      t->oom = true;
      hist_truncate(a, base);
    }
    return END_TURN;
  }

  batch b;
  memset(&b, 0, sizeof(b));
  batch_seen seen;
  memset(&seen, 0, sizeof(seen));
  seen.breaking_name = "";
  step s = END_TURN;
  if (!batch_new(&b, reply)) {
    t->oom = true;
    answer_lost(a, ids, reply->n_calls, base);
    goto done;
  }

  batch_ctx bc = {t, ids, b.ecalls, b.ers, false};
  ag_verdict v;
  bool ran = false;
  ag_action act =
      ag_guard_run_batch(a->guard, b.calls, b.n, ag_now_ms(), run_cb, &bc,
                         b.checks, b.results, &v, &ran);

  bool ok = true; /* every tool message was built */
  if (!ran) {
    ok = blocked_messages(a, &b, ids, &v);
  } else {
    for (size_t i = 0; i < b.n && ok; i++)
      ok = call_message(a, &b, i, &seen);
    if (ok && act == AG_NUDGE) {
      ag__ev_nudge(&a->ev, ag_reason_name(v.reason), v.message);
      ok = join_nudge(&b, &v);
    }
  }
  if (!ok || !append_tool_messages(a, ids, b.n, b.texts, b.lens)) {
    t->oom = true;
    answer_lost(a, ids, b.n, base);
    goto done;
  }
  if (bc.sched_failed) {
    t->oom = true; /* the results were written; the turn still fails */
    goto done;
  }
  s = batch_verdict(t, act, &v, &seen);

done:
  batch_free(&b);
  free(seen.breaking);
  return s;
}

/* Step 5 under loop.require_tool_call: a reply without a tool call is a
 * recoverable error. */
static step no_tool_call(turn_ctx *t) {
  ag_agent *a = t->a;
  ag_verdict v;
  ag_action act = ag_guard_record_refused(a->guard, AG__NO_TOOL_CALL_TEXT,
                                          sizeof(AG__NO_TOOL_CALL_TEXT) - 1,
                                          ag_now_ms(), &v);
  ag_cancel_reason why = fired(t);
  if (why != AG_CANCEL_NONE) {
    end_cancelled(t, why);
    return END_TURN;
  }
  if (act == AG_STOP) {
    end_stopped(t, &v);
    return END_TURN;
  }
  if (act == AG_ESCALATE && !escalate(t, &v))
    return END_TURN;
  return after_errors(t, AG_RECOVER_NO_TOOL_CALL);
}

/* A reply with no text and no tool call (mechanism 15): under
 * loop.max_empty_replies the model is asked again with a short note (in the
 * next request only, like the error context), and the Nth empty reply in a
 * row stops the turn. With the mechanism off it is the (empty) final
 * answer. */
static step empty_reply(turn_ctx *t) {
  ag_agent *a = t->a;
  ag_verdict v;
  ag_action act = ag_guard_record_empty(a->guard, ag_now_ms(), &v);
  switch (act) {
  case AG_NUDGE:
    ag__ev_nudge(&a->ev, ag_reason_name(v.reason), v.message);
    ag__scopy(a->ectx, ECTX_CAP, v.message);
    t->has_ectx = true;
    return GO_ON;
  case AG_STOP:
  case AG_ESCALATE:
    end_stopped(t, &v);
    return END_TURN;
  case AG_ALLOW:
  default:
    set_outcome(t->out, AG_TURN_COMPLETED, "final_answer",
                "The model answered.");
    t->out->final_text = ag__strdup("");
    if (t->out->final_text == NULL)
      t->oom = true;
    return END_TURN;
  }
}

/* The reply's token usage joins the turn's count (mechanism 11). */
static void note_usage(turn_ctx *t, const ag_reply *reply) {
  if (!reply->has_usage)
    return;
  ag_guard_record_tokens(t->a->guard, reply->usage.prompt_tokens +
                                          reply->usage.completion_tokens);
  t->out->tokens = ag_guard_tokens(t->a->guard);
}

/* Appends the assistant message of `reply`; false on ENOMEM. */
static bool append_assistant(turn_ctx *t, const ag_reply *reply,
                             const call_ids *ids) {
  t->a->iter_start = t->a->n_msgs; /* kept whole */
  return hist_append(t->a, assistant_message(reply, ids));
}

/*
 * At the iteration cap with loop.final_request_without_tools: one more
 * request with no tools offered, so the user gets an answer. The turn ends
 * stopped / max_iterations with that answer as final_text. Tool calls in
 * the reply (a model may still send some) are answered "Not run".
 */
static void wrap_up(turn_ctx *t, const ag_verdict *v) {
  ag_agent *a = t->a;
  t->iterations++;
  ag__ev_position(&a->ev, a->turn, t->iterations);
  ag_reply reply;
  memset(&reply, 0, sizeof(reply));
  /* No error context: its instructions ask for tool calls, and none are
   * offered here. */
  req_status st = request_model(t, NULL, false, &reply);
  if (st == REQ_CANCELLED)
    return;
  if (st == REQ_NOMEM) {
    t->oom = true;
    end_stopped(t, v);
    return;
  }
  if (st == REQ_FAILED) {
    char why[sizeof(t->out->message)];
    ag__scopy(why, sizeof(why), t->out->message);
    set_outcome(t->out, AG_TURN_STOPPED, ag_reason_name(v->reason),
                "%s. The final request without tools failed: %.700s",
                v->message, why);
    return;
  }
  note_usage(t, &reply);
  ag__ev_model_response(&a->ev, &reply);
  call_ids ids;
  if (!ids_make(&ids, &reply, a->turn, t->iterations) ||
      !append_assistant(t, &reply, &ids)) {
    t->oom = true;
  } else if (reply.n_calls > 0) {
    size_t base = a->n_msgs - 1;
    if (!answer_not_run(t, &reply, &ids, ag_reason_name(v->reason),
                        v->message)) {
      t->oom = true;
      hist_truncate(a, base);
    }
  }
  ids_free(&ids);
  remember_text(t, reply.text);
  end_stopped(t, v);
  if (reply.text != NULL) {
    t->out->final_text = ag__strdup(reply.text);
    if (t->out->final_text == NULL)
      t->oom = true;
  }
  ag_reply_clear(&reply);
}

/* The tools offered to the model and their names, for this turn. */
static bool turn_tools(turn_ctx *t) {
  const ag_registry *reg = t->a->reg;
  size_t n = ag_registry_count(reg);
  if (n == 0)
    return true;
  t->tools_json = ag_registry_tools_json(reg);
  t->tool_names = calloc(n, sizeof(*t->tool_names));
  if (t->tools_json == NULL || t->tool_names == NULL)
    return false;
  for (size_t i = 0; i < n; i++)
    t->tool_names[i] = ag_registry_name(reg, i);
  t->n_tools = n;
  return true;
}

static void iterate(turn_ctx *t) {
  ag_agent *a = t->a;
  for (;;) {
    ag_cancel_reason why = fired(t);
    if (why != AG_CANCEL_NONE) {
      end_cancelled(t, why);
      return;
    }
    ag_verdict v;
    if (ag_guard_begin_iteration(a->guard, ag_now_ms(), &v) == AG_STOP) {
      if (v.reason == AG_REASON_MAX_ITERATIONS &&
          a->cfg.loop.final_request_without_tools)
        wrap_up(t, &v);
      else
        end_stopped(t, &v);
      return;
    }
    t->iterations++;
    ag__ev_position(&a->ev, a->turn, t->iterations);

    ag_reply reply;
    memset(&reply, 0, sizeof(reply));
    bool with_ectx = t->has_ectx;
    t->has_ectx = false; /* the error context goes into this request only */
    req_status st = request_model(t, t->tools_json, with_ectx, &reply);
    if (st != REQ_OK) {
      if (st == REQ_NOMEM)
        t->oom = true;
      return;
    }
    note_usage(t, &reply);
    ag__ev_model_response(&a->ev, &reply);
    remember_text(t, reply.text);
    /* A reply that came whole (no stream): its text checked at once. */
    ag_verdict cv;
    bool looped = !t->streamed && reply.text != NULL &&
                  ag_guard_check_text(a->guard, reply.text, strlen(reply.text),
                                      false, &cv) != AG_ALLOW;

    call_ids ids;
    step s = END_TURN;
    if (!ids_make(&ids, &reply, a->turn, t->iterations) ||
        !append_assistant(t, &reply, &ids)) {
      t->oom = true;
    } else if (looped) {
      size_t base = a->n_msgs - 1;
      if (reply.n_calls > 0 &&
          !answer_not_run(t, &reply, &ids, ag_reason_name(cv.reason),
                          cv.message)) {
        t->oom = true;
        hist_truncate(a, base);
      }
      end_stopped(t, &cv);
    } else if (reply.n_calls == 0 &&
               (reply.text == NULL || reply.text[0] == '\0')) {
      s = empty_reply(t);
    } else if (reply.n_calls == 0) {
      if (!a->cfg.loop.require_tool_call) {
        set_outcome(t->out, AG_TURN_COMPLETED, "final_answer",
                    "The model answered.");
        t->out->final_text = ag__strdup(reply.text != NULL ? reply.text : "");
        if (t->out->final_text == NULL)
          t->oom = true;
      } else {
        s = no_tool_call(t);
      }
    } else {
      s = run_calls(t, &reply, &ids);
    }
    ids_free(&ids);
    ag_reply_clear(&reply);
    if (s == END_TURN || t->oom)
      return;
  }
}

AG_EXTERN ag_err_t ag_agent_run_turn(ag_agent *a, const char *user_message,
                                     ag_cancel *cancel, ag_turn_outcome *out,
                                     ag_error_t *err) {
  if (out != NULL)
    memset(out, 0, sizeof(*out));
  if (a == NULL || user_message == NULL || out == NULL)
    return ag__set_error(err, AG_EINVAL, -1,
                         "ag_agent_run_turn: a, user_message and out are "
                         "required");

  int64_t now = ag_now_ms();
  int64_t d = a->cfg.loop.max_turn_duration_ms;
  ag_cancel *tt = NULL;
  ag_err_t rc = ag_cancel_new(&tt, cancel, d > 0 ? now + d : INT64_MAX,
                              AG_CANCEL_DEADLINE, err);
  if (rc != AG_OK) {
    /* Nothing ran and no event was sent: there is no reason code. */
    set_outcome(out, AG_TURN_FAILED, "", "The turn could not start: %s",
                ag_strerror(rc));
    return rc;
  }
  a->turn++;
  ag_guard_begin_turn(a->guard, now);
  ag__ev_position(&a->ev, a->turn, 0);

  turn_ctx t;
  memset(&t, 0, sizeof(t));
  t.a = a;
  t.tt = tt;
  t.out = out;

  ag__ev_turn_start(&a->ev, user_message);
  size_t start = a->n_msgs;
  bool stored = false; /* the turn's user message is in the history */
  a->in_turn = true;
  a->turn_bytes = 0;
  a->iter_start = a->compact_from = start + 1; /* the user message stays */
  if (!note_turn_start(a, start)) {
    t.oom = true;
  } else if (!hist_append(a, message("user", user_message))) {
    a->n_turns--;
    t.oom = true;
  } else if ((stored = true, !turn_tools(&t))) {
    t.oom = true;
  } else {
    iterate(&t);
  }
  out->iterations = t.iterations;

  if (t.oom) {
    /* Out of memory: the turn fails, the session stays usable. */
    set_outcome(out, AG_TURN_FAILED, "out_of_memory",
                "The turn ran out of memory.");
    rc = nomem(err);
  }
  if (out->status != AG_TURN_COMPLETED && out->final_text == NULL &&
      t.partial != NULL) {
    out->final_text = t.partial; /* the partial answer */
    t.partial = NULL;
  }

  a->in_turn = false;
  /* measured once, whatever the in-turn cap dropped */
  if (stored)
    measure_last_turn(a);
  cap_history(a, 0);
  hist_shrink(a);
  ag__ev_turn_end(&a->ev, out);

  free(t.partial);
  free(t.stream);
  free(t.tool_names);
  json_decref(t.tools_json);
  ag_cancel_free(tt);
  return rc;
}
