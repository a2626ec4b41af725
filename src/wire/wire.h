/*
 * src/wire/wire.h - the wire layer: every model API's shape, one file each,
 * behind one table (ag__wire), and what they share: the SSE parser and the
 * reply assembler. Not installed, not API (ag__ prefix).
 *
 * Layers (docs/layers.md): wire sits on base, core and the model interface
 * (include/agentguard/providers.h: ag_request, ag_reply); the providers,
 * the proxy and the audit use it, and generic code among them asks the
 * table, never which shape it holds. libcurl is not used here: the wire
 * turns bytes into replies and requests into bytes, the transports are the
 * providers' and the proxy's.
 *
 *   sse.c       the SSE parser (WHATWG server-sent events) and writers
 *   reply.c     the reply assembler (ag__asm), JSON and message helpers,
 *               the relay's state (ag__wire_relay)
 *   tape.c      a request read from the JCS tokenizer's tape (ag__wtape)
 *   chat.c      OpenAI Chat Completions (ag__wire_chat)
 *   messages.c  Anthropic Messages (ag__wire_messages)
 *   responses.c OpenAI Responses (ag__wire_responses)
 *   gemini.c    the Gemini API (ag__wire_gemini)
 *
 * Adding a shape: a file here that fills an ag__wire - for the providers
 * its name, request encoder, whole-reply and stream-event readers; for the
 * audit to_chat; for the proxy its path (serves), conv_key, error_body,
 * reply_form, stop_body and add_user_text, which make it guarded on the
 * request with its reply held whole, and, to relay its streams event by
 * event and read its requests from the tape, the relay_* hooks,
 * nudge_messages, strip_calls, whole_to_sse and tape_turn - and one row
 * in ag__wire_all (chat.c). docs/layers.md ("Adding an API shape") walks
 * through it.
 */
#ifndef AG_WIRE_H
#define AG_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "agentguard/providers.h"

#include "../base/internal.h"
#include "../core/internal.h"

/* Caps: going over is an error, never growth. */
#define AG__HTTP_BODY_MAX (8u << 20)     /* a non-streamed response body */
#define AG__HTTP_ERRBODY_MAX (64u << 10) /* an error body kept */
#define AG__SSE_LINE_MAX (1u << 20)      /* one SSE line */
#define AG__SSE_EVENT_MAX (1u << 20)     /* one SSE event's data */
#define AG__REPLY_TEXT_MAX (4u << 20)    /* assistant text of one reply */
#define AG__CALL_ARGS_MAX (1u << 20)     /* one tool call's arguments */
#define AG__CALLS_MAX 128                /* tool calls in one reply */

/* ---- SSE parser (sse.c) ------------------------------------------------ */

/* One dispatched event: `event` is the event name ("" when none was given),
 * `data` the data lines joined by '\n' (NUL-terminated), `pos` the byte
 * offset of the event's first line in the stream. Returns 0 to go on,
 * non-zero to stop the transfer. */
typedef int (*ag__sse_fn)(void *user, const char *event, const char *data,
                          size_t len, size_t pos);

typedef struct ag__sse {
  ag__buf line; /* the current line, capped at AG__SSE_LINE_MAX */
  ag__buf data; /* the current event's data, capped at AG__SSE_EVENT_MAX */
  bool has_data;
  char event[64];
  bool skip_lf;     /* the previous line ended with '\r' */
  size_t consumed;  /* bytes fed so far: positions in messages */
  size_t line_pos;  /* offset of the current line */
  size_t event_pos; /* offset of the current event's first line */
  bool in_event;
  ag__sse_fn fn;
  void *user;
} ag__sse;

void ag__sse_init(ag__sse *s, ag__sse_fn fn, void *user);
void ag__sse_free(ag__sse *s);
/* Returns 0, 1 when fn asked to stop, -1 when a cap was exceeded (AG_ETOOBIG)
 * or memory ran out (AG_ENOMEM): *why says which. */
int ag__sse_feed(ag__sse *s, const char *buf, size_t len, ag_err_t *why);
/* Dispatches an event left without its blank line at the end of input. */
int ag__sse_finish(ag__sse *s, ag_err_t *why);

/* ---- SSE written (sse.c) ------------------------------------------------ */

/* An event stream being written into an ag__buf: an append that fails (the
 * buffer's cap, or memory) sets `cut`, and from then on nothing is added,
 * so a writer checks `cut` once at the end and ends the stream with an
 * error instead. */
void ag__sse_add(ag__buf *b, const char *s, size_t n);
/* One event of `data`: a "data:" line per line of it (an event read from
 * an upstream may have come in several lines, which its reader joined with
 * '\n'; one line holding a '\n' would end the event early). */
void ag__sse_data(ag__buf *b, const char *data, size_t n);
/* One event of JSON object o (stolen; NULL, as from a failed json_pack,
 * cuts b). */
void ag__sse_json(ag__buf *b, json_t *o);
/* The same with an "event:" line naming it first. */
void ag__sse_named(ag__buf *b, const char *name, json_t *o);

/* ---- the reply being assembled (reply.c) ------------------------------- */

typedef struct ag__part_call {
  char *id, *name;
  ag__buf args; /* capped at AG__CALL_ARGS_MAX */
  bool used;
} ag__part_call;

typedef struct ag__asm {
  ag__buf text;    /* capped at AG__REPLY_TEXT_MAX */
  ag__buf refusal; /* capped at AG__REPLY_TEXT_MAX */
  /* By the wire's index: AG__CALLS_MAX slots, allocated with the first
   * call (most replies have none); the first n_slots are made. */
  ag__part_call *calls;
  int n_slots; /* highest used index + 1 */
  bool has_usage;
  ag_usage usage;
  char finish_reason[32];
  bool done; /* [DONE] / message_stop seen */
  ag_delta_fn on_delta;
  void *delta_user;
  bool delta_stopped; /* on_delta asked to stop */
  /* A failure found while parsing: AG_EPROVIDER with perr filled, or
   * AG_ENOMEM / AG_ETOOBIG. */
  ag_err_t failed;
  ag_provider_error *perr;
  const char *service;
  /* A scratch tape for a whole reply's fast reader (Chat Completions:
   * chat.c), set by the caller after ag__asm_init; NULL: the tree only. */
  struct ag__chunk_tape *ct;
} ag__asm;

void ag__asm_init(ag__asm *a, ag_delta_fn on_delta, void *delta_user,
                  ag_provider_error *perr, const char *service);
void ag__asm_free(ag__asm *a);
/* Appends text (passed on to on_delta); false on a failure (a->failed). */
bool ag__asm_text(ag__asm *a, const char *s, size_t len);
bool ag__asm_refusal(ag__asm *a, const char *s, size_t len);
/* The call slot for a wire index, or NULL (a->failed set) when out of range. */
ag__part_call *ag__asm_call(ag__asm *a, int64_t index);
bool ag__asm_set(ag__asm *a, char **dst, const char *s, size_t len);
bool ag__asm_args(ag__asm *a, ag__part_call *c, const char *s, size_t len);
/* The server's finish reason, cut to its 31 bytes as snprintf cuts. */
void ag__asm_finish_reason(ag__asm *a, const char *s, size_t len);
/* Moves everything into `out`. AG_OK or AG_ENOMEM. */
ag_err_t ag__asm_finish(ag__asm *a, ag_reply *out);
/* Records a body that is not what the API promises: AG_EPROVIDER, not
 * transient, "<what> at byte <pos>". Returns false for chaining. */
bool ag__asm_bad(ag__asm *a, long pos, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* An error event inside a stream, with the API's error object. */
bool ag__asm_stream_error(ag__asm *a, const json_t *error);

/* ---- helpers the shapes share (reply.c) -------------------------------- */

/* perr->message, formatted; cut to fit. */
void ag__perr_set(ag_provider_error *perr, const char *fmt, ...)
    AG__PRINTF(2, 3);
/* Copies text with control characters shown as spaces and whitespace runs
 * collapsed, at most `max` characters, cut on a UTF-8 boundary. */
void ag__readable(char *dst, size_t cap, const char *s, size_t n, size_t max);

/* The string at obj[key], or NULL; *len its length. */
const char *ag__jstr(const json_t *obj, const char *key, size_t *len);
/* Fills perr->message from an API error object ({"message", "type",
 * "code"}) or a string; returns whether anything usable was found. */
bool ag__api_error_message(const json_t *error, char *buf, size_t cap);

/* ---- the shapes (chat.c, messages.c) ----------------------------------- */

typedef struct ag__wire_opts {
  const char *model;
  bool stream;
  double temperature;
  int max_tokens;
  bool parallel_tool_calls;
  const json_t *extra_body; /* object or NULL */
} ag__wire_opts;

/* Builds the request body as JSON text (caller-owns, free). On failure
 * returns NULL with *rc set (AG_ENOMEM or AG_EINVAL with `msg`). */
char *ag__openai_request(const ag__wire_opts *o, const ag_request *req,
                         size_t *len, ag_err_t *rc, char *msg, size_t cap);
char *ag__anthropic_request(const ag__wire_opts *o, const ag_request *req,
                            size_t *len, ag_err_t *rc, char *msg, size_t cap);

/* A whole (non-streamed) response body into the assembler. */
void ag__openai_response(ag__asm *a, const char *body, size_t len);
void ag__anthropic_response(ag__asm *a, const char *body, size_t len);

/* One SSE event into the assembler; `pos` is the byte offset of the event
 * in the stream. Returns 0 to go on, non-zero to stop. */
int ag__openai_event(ag__asm *a, const char *event, const char *data,
                     size_t len, size_t pos);
/* The same for a chunk already parsed (j, not taken); `at` is the byte
 * position of its data, for errors. */
int ag__openai_chunk(ag__asm *a, json_t *j, size_t at);
int ag__anthropic_event(ag__asm *a, const char *event, const char *data,
                        size_t len, size_t pos);
char *ag__responses_request(const ag__wire_opts *o, const ag_request *req,
                            size_t *len, ag_err_t *rc, char *msg, size_t cap);
void ag__responses_response(ag__asm *a, const char *body, size_t len);
int ag__responses_event(ag__asm *a, const char *event, const char *data,
                        size_t len, size_t pos);
/* A reply of one assistant message saying `text`, made by the proxy (a
 * stop): the response object, or with `stream` the events a streamed
 * response sends (an array of objects, each with its "type" and
 * "sequence_number", from response.created to response.completed). `id`
 * is the response's ("resp_..."); NULL when out of memory. */
json_t *ag__responses_stop(const char *id, const char *model, const char *text,
                           long long created, bool stream);

/* ---- a stream relayed event by event (chat.c, messages.c) -------------- */

/* The scratch of Chat Completions' fast paths (the JCS tokenizer's tape:
 * no jansson tree for the text chunks most streams are made of, nor for
 * the plain whole replies most non-streamed requests get; bodies of at
 * most 16 KiB). One per thread that relays; NULL where there is none. */
typedef struct ag__chunk_tape ag__chunk_tape;
ag__chunk_tape *ag__chunk_tape_new(void);
void ag__chunk_tape_free(ag__chunk_tape *ct);

#define AG__RELAY_BLOCKS 256 /* Messages: content blocks one reply may open */

/*
 * A stream relayed to a client while it comes (the proxy's): each event is
 * read into the assembler `a`, its text shown to `on_text` (the
 * content-loop detector) and written on to `out` - unless it carries a tool
 * call or the reply's end, which is held back until the calls are checked.
 * Then the shape releases what it held (relay_release), or writes an end of
 * its own: a stop's text (relay_stop), a reply asked again (relay_tail), an
 * error event (relay_error). The shape keeps its own state here: the
 * client's block numbers for Messages, the chunks held for Chat
 * Completions.
 */
typedef struct ag__wire_relay {
  ag__asm *a;      /* every event assembled: the reply checked */
  ag__buf out;     /* for the client now */
  ag__buf held;    /* Chat Completions: the chunks held back */
  json_t *held_ev; /* Messages: [[event name, event], ...] held back */
  char id[96];     /* the reply's, from its first event */
  char model[96];  /* the same */
  bool any_text;   /* text went to the client */
  bool looped;     /* on_text said stop: the relay ended there */
  int next_index;  /* Messages: the client's next block number */
  int map[AG__RELAY_BLOCKS]; /* Messages: upstream block -> client's (-1
                              * unseen, -2 held) */
  ag__chunk_tape *ct;        /* the fast path's scratch, or NULL */
  /* The text of an event, before it goes on: false stops the relay (the
   * event is not written; `looped` is set). */
  bool (*on_text)(void *user, const char *text, size_t len);
  void *user;
} ag__wire_relay;

/* An empty relay into the assembler a; out and held capped at `cap` bytes
 * each. false when out of memory. */
bool ag__wire_relay_init(ag__wire_relay *r, ag__asm *a, size_t cap);
void ag__wire_relay_free(ag__wire_relay *r);
/* Shows text to on_text: true to go on (any_text set), false when it said
 * stop (looped set). For the shapes' relay_event. */
bool ag__wire_relay_text(ag__wire_relay *r, const char *text, size_t len);

/* ---- a request read from the tape (tape.c) ------------------------------ */

/* The JCS tokenizer's tape of a JSON text (src/core/jcs.c: validated, no
 * tree), with the buffer the strings read from it are decoded into
 * (NUL-terminated, back to back; 2 x the text's length always fits). */
typedef struct ag__wtape {
  ag__jcs *j;
  const char *s; /* the text */
  size_t len, n; /* its length; the tape's tokens */
  char *buf;     /* decoded strings */
  size_t used, cap;
} ag__wtape;

/* A whole reply or a stream's chunk of up to 16 KiB on the chunk scratch
 * ct (a relaying thread's), as a tape in *t (its strings decoded into ct's
 * buffer, which holds them all): true when ct is there and the body is a
 * JSON object jansson would take as well (ag__jcs_jansson_safe). For the
 * shapes' fast readers of whole replies and text chunks. */
bool ag__chunk_tape_whole(ag__chunk_tape *ct, const char *body, size_t len,
                          ag__wtape *t);
/* The value token of member `key` of object token obj, or 0. */
size_t ag__wt_get(const ag__wtape *t, size_t obj, const char *key);
/* Whether token i is a number jansson reads as an integer (no fraction,
 * no exponent; in range on a jansson-safe tape), its value in *v. */
bool ag__wt_int(const ag__wtape *t, size_t i, long long *v);
/* A fast whole-reply reader's end after a step that failed: the assembler
 * says why, or (`s` NULL: a string the scratch could not hold, which its
 * size rules out) out of memory. true: the reply was read. */
bool ag__wt_full(ag__asm *a, const char *s);
/* Whether token i (0: absent) is of AG__JT_* `type`. */
bool ag__wt_is(const ag__wtape *t, size_t i, int type);
/* String token i decoded into the buffer, or NULL (no string, or the
 * buffer is full); *len its length when len is not NULL. */
const char *ag__wt_str(ag__wtape *t, size_t i, size_t *len);
/* Whether token i is a string equal to lit (decoded; lit at most 20
 * bytes). */
bool ag__wt_eq(const ag__wtape *t, size_t i, const char *lit);
/* The elements of array token arr (0: not an array). */
size_t ag__wt_count(const ag__wtape *t, size_t arr);
/* Iterates the elements e of array token a. */
#define AG__WT_EACH(t, a, e)                                                   \
  for (size_t e = ag__wt_is(t, a, AG__JT_ARR) ? (a) + 1 : 0,                   \
              e##_end = ag__wt_is(t, a, AG__JT_ARR)                            \
                            ? ag__jcs_tok_next((t)->j, a)                      \
                            : 0;                                               \
       e < e##_end; e = ag__jcs_tok_next((t)->j, e))
/* The text ag__blocks_text makes of Messages content token c: a string,
 * or the "text" strings of an array's blocks joined by '\n'; "" for
 * anything else. NULL when the buffer is full. */
const char *ag__wt_blocks_text(ag__wtape *t, size_t c, size_t *len);
/* A Chat Completions content as the audit's chat reader takes it: a
 * string; null or absent: ""; an array of parts (strings, or objects with
 * a "text" string; others skipped) or one part object, joined by '\n'.
 * NULL for any other value or when the buffer is full. */
const char *ag__wt_parts_text(ag__wtape *t, size_t c, size_t *len);

/*
 * The turn a request's conversation ends with (from its last user message
 * on: the replies, their calls and the calls' results), told to a sink as
 * a shape's tape_turn reads it: begin once with the counts, then each
 * reply (step) followed by its calls, and the results where they come.
 * The strings live in the tape's buffer or its text. A callback returns
 * false when the turn is not one the sink takes (the caller then reads the
 * request as a tree); begin returns -1 when out of memory.
 */
typedef struct ag__turn_sink {
  int (*begin)(void *user, size_t n_steps, size_t n_calls);
  /* a reply; text NULL: it has content the audit does not read as text */
  bool (*step)(void *user, const char *text, size_t len);
  bool (*call)(void *user, const char *id, const char *name, const char *args,
               size_t args_len);
  bool (*result)(void *user, const char *id, const char *text, size_t len,
                 bool is_error);
  void *user;
} ag__turn_sink;

/* ---- the table ---------------------------------------------------------- */

/* How a client asked for a reply: whole (JSON), as server-sent events,
 * (Gemini's streamGenerateContent without alt=sse) as one JSON array of
 * chunks, or (Ollama's streams) as lines of JSON, one chunk a line. */
typedef enum {
  AG__REPLY_WHOLE = 0,
  AG__REPLY_SSE,
  AG__REPLY_JSON_ARRAY,
  AG__REPLY_NDJSON
} ag__reply_form;

/* One API shape: what the providers and the proxy need to speak it. */
typedef struct ag__wire {
  const char *name;         /* the provider kind: "openai", "anthropic" */
  const char *api;          /* for messages: "Chat Completions", ... */
  const char *path;         /* the path a client posts to ("/v1/...") */
  const char *base_url;     /* the provider's default base URL */
  const char *suffix;       /* appended to a base URL: "/chat/completions" */
  const char *key_env;      /* the provider's default key variable */
  const char *key_header;   /* the key's header, before the key */
  const char *extra_header; /* one more header every request sends, or NULL */
  const char *end_marker;   /* what ends a stream: "[DONE]", "message_stop" */
  /* the request body as JSON text (caller frees), or NULL with *rc
   * (AG_ENOMEM, or AG_EINVAL with msg) */
  char *(*request)(const ag__wire_opts *o, const ag_request *req, size_t *len,
                   ag_err_t *rc, char *msg, size_t cap);
  /* a whole (non-streamed) reply body into the assembler */
  void (*response)(ag__asm *a, const char *body, size_t len);
  /* one SSE event into the assembler; 0 to go on, non-zero to stop */
  int (*event)(ag__asm *a, const char *event, const char *data, size_t len,
               size_t pos);
  /* The path after the base URL when the model is in it (Gemini; NULL:
   * `suffix`): false when the model's name cannot be put there. */
  bool (*url_path)(const char *model, bool stream, char *buf, size_t cap);
  /* A request's (or transcript's) messages as Chat Completions messages,
   * the neutral form the guard's replay and the audit read: every message
   * checked, msgs[from..] converted (from SIZE_MAX: the check alone). NULL
   * with emsg naming the first bad message (a 400), or with emsg "" when
   * out of memory. NULL for Chat Completions itself. */
  json_t *(*to_chat)(const json_t *msgs, size_t from, char *emsg, size_t cap);
  /* Where the last turn of messages checked by to_chat starts (the index
   * of its user message), or SIZE_MAX when there is none: the proxy then
   * converts only msgs[start..]. NULL: convert them all. */
  size_t (*turn_start)(const json_t *msgs);
  /* Whether messages that may be in either shape are in this one (NULL:
   * never claimed; a transcript is read as chat unless a shape claims it). */
  bool (*looks_like)(const json_t *msgs);

  /* ---- for the proxy ---- */
  /* The request's key that holds the conversation: "messages", "input",
   * "contents". */
  const char *conv_key;
  /* Whether a normalised request path is this API's (a trailing '/'
   * allowed). */
  bool (*serves)(const char *path);
  /* An error body in the API's shape (new reference, NULL on ENOMEM):
   * `type` and `code` are OpenAI's fields (a shape without them folds the
   * code into the message). */
  json_t *(*error_body)(unsigned status, const char *type, const char *code,
                        const char *msg);
  /* How the client wants the reply (path, query and the request say), and
   * a reply of one assistant message saying `text` in that form (malloc'd,
   * *len; NULL on ENOMEM): the proxy's stop, in every shape. For the shapes
   * decided on the request alone (no relay_event), also the request (a
   * copy the caller owns) with `text` added as the user's: the error
   * context (the relayed shapes append a user message to "messages"). */
  ag__reply_form (*reply_form)(const char *path, const char *query,
                               const json_t *req);
  char *(*stop_body)(ag__reply_form form, const char *id, const char *model,
                     const char *text, long long created, size_t *len);
  bool (*add_user_text)(json_t *req, const char *text);
  /* Why a request cannot be replayed from itself (its conversation is
   * kept by the upstream: Responses' previous_response_id), or NULL; the
   * hook NULL: never. Such a request is relayed unguarded. */
  const char *(*unguarded)(const json_t *req);
  /* For a request `unguarded` names: where the upstream keeps what it
   * continues, so that the proxy can read it back (the hook NULL, or
   * false: it cannot). Paths relative to the base the request's own path
   * is under (its path without the last segment): `list`, the items
   * ({"data": [...], "has_more", "last_id"}; read newest first with
   * "order=desc", paged with "after"), and `object` ("" when none), whose
   * "output" items follow the list's and whose "previous_response_id"
   * names the one before it in a chain. `id` NULL: what `req` continues;
   * else that earlier response's. */
  bool (*stored)(const json_t *req, const char *id, char *list, char *object,
                 size_t cap);
  /* What the conversation's key must hold, for a 400: "an array". */
  const char *conv_expect;
  /* The paths under this prefix go to the API's own upstream when one is
   * given (the proxy's --anthropic-upstream, --gemini-upstream), guarded
   * or not; NULL: only the paths it serves. */
  const char *route_prefix;
  /* OpenTelemetry's GenAI names: gen_ai.provider.name ("openai",
   * "anthropic", "gcp.gemini") and gen_ai.operation.name ("chat",
   * "generate_content"). */
  const char *otel_provider;
  const char *otel_operation;
  /* The start of the ids of the replies the proxy makes ("chatcmpl-",
   * "msg_", ...). */
  const char *id_prefix;

  /* The turn of conversation token `conv` of a request's tape, told to
   * the sink: 1 read (perhaps no reply at all), 0 not a turn this reader
   * takes - anything the tree reading would answer with a 400 or read
   * another way - and -1 when out of memory. NULL: every request of the
   * shape is read as a tree. */
  int (*tape_turn)(ag__wtape *t, size_t conv, const ag__turn_sink *sink);

  /* ---- for the proxy: shapes relayed event by event (NULL: the shape
   * is decided on the request alone, its reply passed back whole) ---- */
  /* One upstream event through the relay (ag__wire_relay): 0 to go on,
   * non-zero to end the transfer (a bad event: r->a says why; the text
   * check said stop: r->looped). */
  int (*relay_event)(ag__wire_relay *r, const char *event, const char *data,
                     size_t len, size_t pos);
  /* The calls passed: what was held back, to `out`, renumbered where the
   * shape numbers its parts. */
  void (*relay_release)(ag__wire_relay *r);
  /* The stream's end written by the proxy: `text` as the reply's last
   * text (after what was relayed), then the end. */
  void (*relay_stop)(ag__wire_relay *r, const char *text);
  /* The stream's end from a whole reply asked again: its text, its calls,
   * the end. */
  void (*relay_tail)(ag__wire_relay *r, const ag_reply *rep);
  /* An error event saying `msg` (valid UTF-8): the stream ends with it. */
  void (*relay_error)(ag__wire_relay *r, const char *msg);
  /* What the shape's streams end with, for "the reply is cut off". */
  const char *end_missing;
  /* The messages that answer the held-back calls (checks[i].action ==
   * AG_NUDGE) with their nudge text: an array to append to the
   * conversation, or NULL when out of memory. */
  json_t *(*nudge_messages)(const ag_reply *rep, const ag_call_check *checks);
  /* A whole reply of the shape with its tool calls taken out, as the
   * answer to the final request without tools (a server that ignored the
   * missing tools still gets no call through): false with emsg when it is
   * not such a reply. */
  bool (*strip_calls)(json_t *reply, char *emsg, size_t cap);
  /* A whole reply of the shape as the events of a stream, to out (for a
   * client that asked for a stream and gets a reply the proxy holds whole):
   * false with emsg when it is not such a reply. */
  bool (*whole_to_sse)(const json_t *reply, ag__buf *out, char *emsg,
                       size_t cap);
} ag__wire;

extern const ag__wire ag__wire_chat;      /* chat.c */
extern const ag__wire ag__wire_messages;  /* messages.c */
extern const ag__wire ag__wire_responses; /* responses.c */
extern const ag__wire ag__wire_gemini;    /* gemini.c */
extern const ag__wire ag__wire_ollama;    /* ollama.c */

/* Whether the normalised path (no query) `path` is `want`, a trailing
 * "/" on `path` aside ("/v1/messages/" routes as "/v1/messages" on most
 * servers, so it is guarded as that). */
bool ag__wire_path_is(const char *path, const char *want);
/* Whether `path` ends with `tail` ("/chat/completions": a whole last
 * segment or segments, as `tail` starts with '/'), a trailing "/" aside:
 * the same API under another prefix (Azure OpenAI's
 * "/openai/deployments/{name}/chat/completions", Gemini's OpenAI-compatible
 * "/v1beta/openai/chat/completions", a gateway's "/api/v1/..."). */
bool ag__wire_path_ends(const char *path, const char *tail);
/* The method a path names after its model ("generateContent" of
 * ".../models/{model}:generateContent", a trailing '/' aside) when its last
 * segments are /models/{model}:{method}, /tunedModels/{model}:{method} or
 * /endpoints/{id}:{method}, else NULL; *model (may be NULL) is set to
 * where the model's name (or the endpoint's id) starts. The Gemini API's
 * (tuned models too), Vertex AI's (".../publishers/google/models/...",
 * ".../publishers/anthropic/models/...", a tuned model's
 * ".../endpoints/{id}") and a gateway's paths alike. */
const char *ag__wire_model_method(const char *path, const char **model);
/* The shape that serves a request path, or NULL (not guarded). */
const ag__wire *ag__wire_serving(const char *path);
/* An error body in OpenAI's shape: {"error":{"message","type","param",
 * "code"}} (the default of every shape without its own). */
json_t *ag__openai_error_body(unsigned status, const char *type,
                              const char *code, const char *msg);

/* Every shape, NULL-terminated. */
extern const ag__wire *const ag__wire_all[];

/* The text of Messages content: a string as it is, text blocks joined by
 * '\n' (a new reference; NULL when out of memory). */
json_t *ag__blocks_text(const json_t *content);

/* The provider kinds, ", "-separated, into buf (cut to fit). */
void ag__wire_names(char *buf, size_t cap);

/* The shape of provider kind `name`, or NULL. */
const ag__wire *ag__wire_named(const char *name);

#endif /* AG_WIRE_H */
